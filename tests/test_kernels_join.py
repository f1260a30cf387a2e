"""Run 30: a last split of at most ``join_tail_tokens`` tokens joins the split before it (splitkv_plan.split_count),
and the plugin's ragged kernel as a harness arm (triton_splitkv_ragged.ragged_args). Plans on the CPU; the split
kernel and the ragged kernel run by Triton's CPU interpreter against the fp32 reference."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

from specdiag.kernels.splitkv_plan import SplitKVConfig, default_config, plan_splits, split_count

ROOT = Path(__file__).resolve().parents[1]
needs_triton = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton is not installed here")


def test_split_count_joins_only_a_tail_within_the_limit() -> None:
    assert split_count(131073, 512) == 257  # 128k h8T1: the draft token alone in split 257
    assert split_count(131073, 512, 64) == 256
    assert split_count(131080, 1024, 64) == 128  # 128k h8T8: the 8 draft tokens join split 128
    assert split_count(131072 + 64, 1024, 64) == 128  # a tail of exactly the limit joins
    assert split_count(131072 + 65, 1024, 64) == 129  # one token more does not
    assert split_count(500, 512, 64) == 1 and split_count(512, 512, 64) == 1  # one split: nothing to join
    assert split_count(1024, 512, 64) == 2  # no tail


@pytest.mark.parametrize("rows, n_kv", [(8, 131073), (16, 65537), (8, 262145), (64, 131080), (64, 65544),
                                        (256, 131088), (1024, 131136), (8, 1000), (64, 300)])
def test_a_joined_plan_covers_every_token_once_and_its_last_split_is_at_most_one_tile_longer(rows, n_kv) -> None:
    for join in (0, 64):
        cfg = SplitKVConfig(**{**default_config(rows).as_dict(), "join_tail_tokens": join})
        plan = plan_splits(rows, n_kv, cfg, 132)
        ends = [min((s + 1) * plan.tokens_per_split, n_kv) for s in range(plan.n_splits)]
        ends[-1] = n_kv  # the kernels' rule: the last split ends at n_kv
        starts = [s * plan.tokens_per_split for s in range(plan.n_splits)]
        assert starts[0] == 0 and all(e == s2 for e, s2 in zip(ends, starts[1:]))  # contiguous, no gap, no overlap
        assert all(e > s for s, e in zip(starts, ends))  # no empty split
        assert ends[-1] - starts[-1] <= plan.tokens_per_split + join
    joined = plan_splits(8, 131073, SplitKVConfig(**{**default_config(8).as_dict(), "join_tail_tokens": 64}), 132)
    assert (joined.n_splits, plan_splits(8, 131073, default_config(8), 132).n_splits) == (256, 257)


def test_the_run30_arms_join_the_tail_on_both_kernels_and_the_ragged_arms_take_the_plugins_ladder() -> None:
    from specdiag.kernels.dispatch import resolve_config
    from specdiag.kernels.split_merge import merge_block
    from specdiag.kernels.splitkv_plan import fitting_ladder

    t1, h8t8 = resolve_config("split_auto_gwfmj_p1", 8), resolve_config("split_auto_gwfmj_p1", 64)
    assert t1.join_tail_tokens == 64 and t1.block_m == 16 and t1.merge_one_pass
    assert h8t8.join_tail_tokens == 64 and h8t8.block_m == 64 and h8t8.merge_one_pass_max_splits == 16
    assert merge_block(256, t1) == (256, 32, True)  # 128k h8T1 joined: 256 splits, half the padding of 257's 512
    assert merge_block(128, h8t8) == (64, 64, False)  # 128k h8T8 joined: two steps of 64 splits, not three
    assert merge_block(128, resolve_config("split_auto_gwfmj1_p1", 64)) == (128, 64, True)
    assert resolve_config("split_auto_gwfm_p1", 64).join_tail_tokens == 0
    for rows in (8, 16, 64, 1024):
        assert resolve_config("ragged_p1", rows) == fitting_ladder(rows)[0]
        assert resolve_config("ragged_p1", rows).merge_one_pass
        assert not resolve_config("ragged2_p1", rows).merge_one_pass
    assert resolve_config("ragged_p1", 8).merge_one_pass_max_splits == 512
    assert resolve_config("ragged_p1", 64).merge_one_pass_max_splits == 16


def test_the_fused_kernel_refuses_a_joined_plan() -> None:
    import torch

    from specdiag.kernels.mla import VerifyShape, make_inputs
    from specdiag.kernels.triton_fused import fused_split_kv_triton

    x = make_inputs(VerifyShape(200, 2, 4, "shuffled_p1"), seed=1)
    with pytest.raises(ValueError, match="join_tail_tokens"):
        fused_split_kv_triton(x, x.out_like(), cfg=SplitKVConfig(join_tail_tokens=64), num_sms=4)
    assert torch.isnan(x.out_like()).all()


def test_the_ragged_arms_run_the_torch_fallback_on_the_cpu() -> None:
    from specdiag.kernels.cases import relative_error
    from specdiag.kernels.dispatch import prepared_call, run_variant
    from specdiag.kernels.mla import VerifyShape, make_inputs
    from specdiag.kernels.reference import reference_verify

    x = make_inputs(VerifyShape(300, 4, 4, "shuffled_p1"), seed=3)
    ref = reference_verify(x)
    for name in ("ragged_p1", "ragged2_p1", "split_auto_gwfmj_p1"):
        out = x.out_like()
        run_variant(name, x, out)
        assert relative_error(out, ref) < 2e-2
        out2 = x.out_like()
        prepared_call(name, x, out2)()
        assert relative_error(out2, ref) < 2e-2


INTERPRET_SCRIPT = r"""
import torch
from specdiag.kernels.cases import relative_error
from specdiag.kernels.mla import VerifyInputs, VerifyShape, make_inputs, tree_mask
from specdiag.kernels.reference import reference_verify
from specdiag.kernels.splitkv_plan import SplitKVConfig, plan_splits
from specdiag.kernels.triton_splitkv import split_kv_triton
from specdiag.kernels.triton_splitkv_ragged import ragged_args, ragged_split_kv_triton

def fp16(x):
    return VerifyInputs(q=x.q.half(), cache=x.cache.half(), token_table=x.token_table, block_table=x.block_table,
                        mask=x.mask, n_prefix=x.n_prefix, sm_scale=x.sm_scale)

# the split kernel: prefixes that fill whole 64-token splits so the draft tokens make a tail split (joined or not),
# page_size 1 and 64, 16-row tiles; then a tail that is not joined (over the limit)
cfg0 = SplitKVConfig(block_m=16, block_n=16, num_warps=4, num_stages=1, programs_per_sm=1.0, min_split_tokens=64,
                     merge_block_dv=128)
for shape, page, sms, join, splits in ((VerifyShape(256, 2, 4, "shuffled_p1"), 1, 5, 64, 4),
                                      (VerifyShape(256, 2, 4, "shuffled_p1"), 1, 5, 0, 5),
                                      (VerifyShape(384, 4, 3, "shuffled_b64"), 64, 7, 64, 6),
                                      (VerifyShape(300, 2, 4, "shuffled_p1"), 1, 5, 16, 5)):
    for one_pass in (False, True):
        cfg = SplitKVConfig(**{**cfg0.as_dict(), "join_tail_tokens": join, "merge_one_pass": one_pass})
        x = make_inputs(shape, seed=shape.context_tokens)
        assert plan_splits(shape.rows, x.n_kv, cfg, sms).n_splits == splits, plan_splits(shape.rows, x.n_kv, cfg, sms)
        ref = reference_verify(x)
        y = fp16(x)
        out = torch.full((y.draft_tokens, y.heads, 512), float("nan"), dtype=torch.float16)
        split_kv_triton(y, out, page_size=page, cfg=cfg, num_sms=sms)
        err = relative_error(out, ref)
        print("split", shape, page, join, one_pass, splits, err)
        assert err < 1e-2 and not torch.isnan(out).any(), err

# the ragged kernel on VerifyInputs laid out by ragged_args (the harness's ragged arms), both merge forms
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
        assert torch.equal(y.cache[args.pop("draft_loc")], args["k_ext"])  # the draft rows' slots, for Gluon
        ragged_split_kv_triton(**args, cfg=cfg, num_sms=8)
        err = relative_error(out, ref)
        print("ragged", shape, chain, one_pass, err)
        assert err < 1e-2 and not torch.isnan(out).any(), err
print("ok")
"""


@pytest.mark.slow
@needs_triton
def test_joined_splits_and_the_ragged_layout_in_the_interpreter() -> None:
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=str(ROOT / "lib"))
    res = subprocess.run([sys.executable, "-c", INTERPRET_SCRIPT], env=env, capture_output=True, text=True, timeout=900)
    assert res.returncode == 0 and res.stdout.strip().endswith("ok"), res.stdout[-3000:] + res.stderr[-3000:]
    assert res.stdout.count("split VerifyShape") == 8 and res.stdout.count("ragged VerifyShape") == 4
