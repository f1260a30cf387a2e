"""Run 6's arms on the 64-row tile's inner loop (h8T8): split_p1 with 32-token KV tiles and 5 pipeline stages
(split_n32s5_p1), and the same with the scores computed once per tile (split_qk1_p1, triton_splitkv qk_once).

What is checked on the CPU: the variants resolve to the configuration they name only where the row tile is 64 rows
(elsewhere they are split_p1), the harness records that configuration, the split kernel's own code computes the
right function with those tiles under Triton's interpreter (fp16, tiny shapes; the interpreter has no bf16, runs no
pipelining and no inline PTX: qk_once's scratch, slots and offsets run with tl.debug_barrier and tl.load in place of
its bar.sync and ld.relaxed.cta, which only the GPU test checks), and that the old kernels refuse or ignore nothing
new (docs/kernel-notes.md "Run 6 (planned)").
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

from specdiag.kernels.cases import GridSpec
from specdiag.kernels.dispatch import KERNEL_VARIANTS, resolve_config
from specdiag.kernels.harness import run_grid
from specdiag.kernels.splitkv_plan import SplitKVConfig, default_config, tile64_config
from specdiag.runs import Run

ROOT = Path(__file__).resolve().parents[1]
RUN6 = {"split_n32s5_p1": (32, 5, False), "split_qk1_p1": (32, 5, True)}


@pytest.mark.parametrize("name", sorted(RUN6))
def test_run6_variants_change_only_the_64_row_tile(name: str) -> None:
    v = KERNEL_VARIANTS[name]
    assert (v.design, v.page_size, v.kv_fp8, v.tile64) == ("split_kv", 1, False, RUN6[name])
    block_n, stages, qk_once = RUN6[name]
    for rows in (33, 64, 128):  # 64-row tiles: the default's tile but the KV tile, the depth and the score layout
        cfg = resolve_config(name, rows)
        assert cfg == SplitKVConfig(**{**default_config(rows).as_dict(), "block_n": block_n, "num_stages": stages,
                                       "qk_once": qk_once})
        assert (cfg.block_m, cfg.num_warps) == (64, 8)
    for rows in (8, 16, 32, 256, 1024):  # other tiles: exactly split_p1's default
        assert resolve_config(name, rows) == default_config(rows) == tile64_config(rows, block_n, stages, qk_once)
        assert not default_config(rows).qk_once
    tuned = SplitKVConfig(block_m=64, block_n=64, num_warps=8, num_stages=2)
    assert resolve_config(name, 64, tuned) is tuned  # an explicit (tuned) configuration wins
    assert resolve_config("split_p1", 64) is None  # the old variants are untouched: the kernel's default


def test_harness_rows_record_the_run6_tile(tmp_path) -> None:
    spec = GridSpec(contexts=[256], heads=[8, 2], draft_tokens=[8], layouts=["shuffled_p1"],
                    kernels=["split_p1", *sorted(RUN6)], n_runs=2, n_warmup=1, rotate_bytes=0, required=[])
    run = Run.create(tmp_path / "r", label="t")
    n = run_grid(spec, run, {"copy_gbps": 1.0, "matmul_tflops": 1.0}, device="cpu")
    rows = run.rows("kernel_ab")
    assert n == len(rows) == 2 * 3
    for r in rows:
        assert r["error"] is None and r["correct"] and r["impl"] == "torch", r
        if r["kernel"] == "split_p1":
            assert r["config"] is None  # the default, chosen inside the launcher
        elif r["rows"] != 64:
            assert SplitKVConfig(**r["config"]) == default_config(r["rows"])  # h2 T8: 16-row tiles, split_p1's own
        else:
            assert (r["config"]["block_m"], r["config"]["block_n"], r["config"]["num_stages"], r["config"]["qk_once"]) \
                == (64, *RUN6[r["kernel"]])


INTERPRET_SCRIPT = r"""
import torch
from specdiag.kernels.mla import VerifyInputs, VerifyShape, make_inputs, tree_mask
from specdiag.kernels.reference import reference_verify
from specdiag.kernels.cases import relative_error
from specdiag.kernels.splitkv_plan import SplitKVConfig, tile64_config
from specdiag.kernels.triton_splitkv import split_kv_triton

def fp16(x):
    return VerifyInputs(q=x.q.half(), cache=x.cache.half(), token_table=x.token_table, block_table=x.block_table,
                        mask=x.mask, n_prefix=x.n_prefix, sm_scale=x.sm_scale)

# 64-row tiles: one full tile (h8 T8), a partial one (h5 T8: 40 rows) and two (h16 T8); prefixes that end inside a
# 32-token tile and inside a 64-token tile; page_size 1 and 64; tree and chain masks; several splits (partials and
# the merge kernel) and one (the direct write)
cases = [(VerifyShape(200, 8, 8, "shuffled_p1"), 1, False, 8), (VerifyShape(330, 5, 8, "shuffled_b64"), 64, True, 8),
         (VerifyShape(150, 16, 8, "shuffled_b64"), 1, False, 2), (VerifyShape(100, 8, 8, "contiguous"), 1, True, 1)]
for block_n, stages, qk_once in ((32, 5, False), (32, 5, True), (64, 3, True), (64, 3, False)):
    for shape, page, chain, sms in cases:
        cfg = tile64_config(shape.rows, block_n, stages, qk_once)
        cfg = SplitKVConfig(**{**cfg.as_dict(), "min_split_tokens": 64})
        assert cfg.block_m == 64 and cfg.block_n == block_n and cfg.qk_once == qk_once, cfg
        x = make_inputs(shape, seed=shape.context_tokens)
        if chain:
            x.mask = tree_mask(shape.draft_tokens, torch.Generator(), chain=True); x.__post_init__()
        ref = reference_verify(x)
        y = fp16(x)
        out = torch.full((y.draft_tokens, y.heads, 512), float("nan"), dtype=torch.float16)
        split_kv_triton(y, out, page_size=page, cfg=cfg, num_sms=sms)
        err = relative_error(out, ref)
        print(shape, page, chain, block_n, stages, qk_once, sms, err)
        assert not torch.isnan(out).any(), "unwritten rows"
        assert err < 5e-3, err
print("ok")
"""


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton is not installed here")
def test_split_kernel_with_run6_tiles_in_the_interpreter() -> None:
    """The CUDA kernel's own code with run 6's tiles (and the default's, with and without qk_once), run by Triton's
    CPU interpreter."""
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=str(ROOT / "lib"))
    res = subprocess.run([sys.executable, "-c", INTERPRET_SCRIPT], env=env, capture_output=True, text=True, timeout=900)
    assert res.returncode == 0 and res.stdout.strip().endswith("ok"), res.stdout[-3000:] + res.stderr[-3000:]


def test_qk_once_is_refused_where_it_does_not_apply() -> None:
    import torch  # noqa: PLC0415

    from specdiag.kernels.mla import VerifyShape, make_inputs  # noqa: PLC0415

    x = make_inputs(VerifyShape(128, 8, 8, "shuffled_p1"), seed=1)
    cfg = SplitKVConfig(block_m=64, block_n=32, num_warps=4, num_stages=2, dv_split=2, qk_once=True)
    pytest.importorskip("triton")
    from specdiag.kernels.triton_fused import fused_split_kv_triton  # noqa: PLC0415
    from specdiag.kernels.triton_splitkv import split_kv_triton  # noqa: PLC0415

    with pytest.raises(ValueError, match="dv_split 1"):
        split_kv_triton(x, x.out_like(), cfg=cfg, num_sms=4)
    with pytest.raises(ValueError, match="split kernel"):
        fused_split_kv_triton(x, x.out_like(), cfg=SplitKVConfig(qk_once=True), num_sms=4)
    assert torch.isfinite(x.q).all()
