"""The Triton kernels' own code run by Triton's CPU interpreter (TRITON_INTERPRET=1, in a subprocess so the
compiled path of the other tests is untouched) against the fp32 reference: the split-KV kernel (token table and
64-token pages, both merge forms), the plugin's Triton fallback on SGLang's ragged layout, the baseline,
and both merge forms against the merge written in torch. Slow (a minute or more on 2 cores): ``make test-all``."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton is not installed here")]

KERNELS_SCRIPT = r"""
import torch
from specdiag.kernels.reference import relative_error
from specdiag.kernels.mla import VerifyInputs, VerifyShape, make_inputs, tree_mask
from specdiag.kernels.reference import reference_verify
from specdiag.kernels.plan import SplitKVConfig, plan_splits
from specdiag.kernels.mla import ragged_args
from specdiag.kernels.triton.splitkv import split_kv_triton
from specdiag.kernels.verify import TRITON, choose, verify

def fp16(x):
    return VerifyInputs(q=x.q.half(), cache=x.cache.half(), token_table=x.token_table, block_table=x.block_table,
                        mask=x.mask, n_prefix=x.n_prefix, sm_scale=x.sm_scale)

# the split kernel: prefixes that fill whole 64-token splits so the draft tokens make a short last split, page_size 1
# and 64, 16-row tiles; then a last split of 48 tokens
cfg0 = SplitKVConfig(block_m=16, block_n=16, num_warps=4, num_stages=1, programs_per_sm=1.0, min_split_tokens=64,
                     merge_block_dv=128)
for shape, page, sms, splits in ((VerifyShape(256, 2, 4, "shuffled_p1"), 1, 5, 5),
                                 (VerifyShape(384, 4, 3, "shuffled_b64"), 64, 7, 7),
                                 (VerifyShape(300, 2, 4, "shuffled_p1"), 1, 5, 5)):
    for one_pass in (False, True):
        cfg = SplitKVConfig(**{**cfg0.as_dict(), "merge_one_pass": one_pass})
        x = make_inputs(shape, seed=shape.context_tokens)
        assert plan_splits(shape.rows, x.n_kv, cfg, sms).n_splits == splits, plan_splits(shape.rows, x.n_kv, cfg, sms)
        ref = reference_verify(x)
        y = fp16(x)
        out = torch.full((y.draft_tokens, y.heads, 512), float("nan"), dtype=torch.float16)
        split_kv_triton(y, out, page_size=page, cfg=cfg, num_sms=sms)
        err = relative_error(out, ref)
        print("split", shape, page, one_pass, splits, err)
        assert err < 1e-2 and not torch.isnan(out).any(), err

# the ragged kernel on VerifyInputs laid out by ragged_args (the harness's ragged arms), both merge forms, through the
# kernels' entry point as the plugin calls it (on the CPU it chooses the Triton kernel)
for shape, chain in ((VerifyShape(200, 2, 4, "shuffled_p1"), False), (VerifyShape(130, 4, 1, "contiguous"), True)):
    x = make_inputs(shape, seed=11)
    if chain:
        x.mask = tree_mask(shape.draft_tokens, torch.Generator(), chain=True); x.__post_init__()
    ref = reference_verify(x)
    y = fp16(x)
    for one_pass in (False, True):
        cfg = SplitKVConfig(**{**cfg0.as_dict(), "merge_one_pass": one_pass})
        out = torch.full((y.draft_tokens, y.heads, 512), float("nan"), dtype=torch.float16)
        args = ragged_args(y, out)
        assert torch.equal(y.cache[args["draft_loc"]], args["k_ext"])  # the draft rows' slots, for Gluon
        assert choose(args["q"], args["kv"])[0] == TRITON
        verify(**args, cfg=cfg, num_sms=8)
        err = relative_error(out, ref)
        print("ragged", shape, chain, one_pass, err)
        assert err < 1e-2 and not torch.isnan(out).any(), err
# the baseline (SGLang's verify structure) on the same inputs
from specdiag.kernels.triton.baseline import baseline_triton
for shape in (VerifyShape(130, 2, 5, "shuffled_p1"), VerifyShape(64, 1, 33, "contiguous")):
    x = make_inputs(shape, seed=5)
    ref = reference_verify(x)
    out = torch.full((x.draft_tokens, x.heads, 512), float("nan"), dtype=torch.float16)
    baseline_triton(fp16(x), out)  # the interpreter computes through numpy, which has no bf16
    err = relative_error(out, ref)
    print("baseline", shape, err)
    assert err < 1e-2 and not torch.isnan(out).any(), err
print("ok")"""

MERGE_SCRIPT = r"""
import torch
from specdiag.kernels.plan import SplitKVConfig
from specdiag.kernels.merge import merge_partials

g = torch.Generator().manual_seed(7)
for n_splits, rows in ((1, 3), (3, 5), (129, 2), (300, 1)):
    o = torch.randn(n_splits, rows, 512, generator=g)
    lse = torch.randn(n_splits, rows, generator=g) * 4
    if n_splits > 2:
        lse[1] = float("-inf")  # an empty split weighs nothing
    w = torch.softmax(lse * torch.log(torch.tensor(2.0)), 0)  # lse is base 2
    ref = (w[..., None] * o).sum(0)
    for one_pass in (False, True):
        out = torch.full((rows, 512), float("nan"), dtype=torch.float16)
        merge_partials(o, lse, out, SplitKVConfig(merge_block_dv=64, merge_one_pass=one_pass))
        err = float((out.float() - ref).norm() / ref.norm())
        print(n_splits, rows, one_pass, err)
        assert err < 2e-3, (n_splits, rows, one_pass, err)
print("ok")"""


def _interpret(script: str) -> str:
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=str(ROOT / "lib"))
    res = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=900)
    assert res.returncode == 0 and res.stdout.strip().endswith("ok"), res.stdout[-3000:] + res.stderr[-3000:]
    return res.stdout


def test_split_kernel_ragged_fallback_and_baseline_match_the_reference() -> None:
    out = _interpret(KERNELS_SCRIPT)
    assert out.count("split VerifyShape") == 6 and out.count("ragged VerifyShape") == 4
    assert out.count("baseline VerifyShape") == 2


def test_both_merge_forms_match_the_torch_merge() -> None:
    assert _interpret(MERGE_SCRIPT).count("True") == 4  # the one-pass form ran on every case
