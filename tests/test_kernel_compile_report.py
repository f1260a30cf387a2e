"""scripts/kernel_compile_report.py: the compiled-code facts docs/kernel-notes.md ("Run 4 outcome") reads run 4 by.

Compiled ahead of time for sm_90 on the CPU with Triton 3.6.0, the version run 4 ran on the H200: a changed kernel
or compiler that alters how the KV tile reaches the tensor cores fails here, and the reading must be redone.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

triton = pytest.importorskip("triton")
pytestmark = pytest.mark.skipif(triton.__version__ != "3.6.0",
                                reason=f"the facts are Triton 3.6.0's code generation (run 4's); this is {triton.__version__}")

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "kernel_compile_report.py"


@pytest.fixture(scope="module")
def report():
    spec = importlib.util.spec_from_file_location("kernel_compile_report", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # its dataclass looks its module up there
    spec.loader.exec_module(mod)
    return mod.compile_report


def test_16_row_tiles_fp8_tile_is_prefetched_like_bf16(report):
    split = report("split", "bf16", 16, 64, 4, 2)
    fused = report("fused", "bf16", 16, 64, 4, 2)
    fp8 = report("fused", "fp8", 16, 32, 4, 3)  # default_fused_config(16, kv_fp8=True)
    # one launch changes neither the tile's shared memory nor how the KV tile is loaded (prefetched, one buffer)
    assert fused.shared_bytes == split.shared_bytes == 94208
    for r in (split, fused):
        assert (r.loop_async_copies, r.loop_plain_kv_loads, r.kv_buffers, r.loop_fp_to_fp) == (2, 0, 1, 0)
    # fp8 (scores as K Q^T, the PV dot's own copy of the tile): no plain KV load left (run 4's form had the 64 x 512
    # latent tile as a synchronous load), one buffer as bf16, one conversion per dot operand (K, rope, V)
    assert (fp8.loop_plain_kv_loads, fp8.kv_buffers, fp8.loop_fp_to_fp) == (0, 1, 3)
    assert fp8.loop_async_copies >= 3
    assert fp8.spill_store_bytes <= fused.spill_store_bytes  # run 4's fp8 form: 752 B vs 176 B
    # 64-token fp8 tiles in this form spill heavily: why the fp8 default is 32-token tiles
    assert report("fused", "fp8", 16, 64, 4, 2).spill_store_bytes > 10 * fp8.spill_store_bytes
    # the self-merge loops are pipelined (run 4: plain .cg loads, nothing prefetched); the split kernel has none
    assert fused.merge_async_copies > 0 and fp8.merge_async_copies > 0 and split.merge_cg_loads == 0


def test_64_row_tiles_fp8_gets_two_buffers_at_five_stages(report):
    fused = report("fused", "bf16", 64, 64, 8, 3)
    fp8_3 = report("fused", "fp8", 64, 64, 8, 3)  # run 4's fp8 tile
    fp8 = report("fused", "fp8", 64, 64, 8, 5)  # default_fused_config(64, kv_fp8=True)
    assert fused.shared_bytes == 230400 and fp8_3.shared_bytes == 185344 and fp8.shared_bytes == 223232
    assert (fused.kv_buffers, fp8_3.kv_buffers, fp8.kv_buffers) == (2, 1, 2)
    # the upcast: once per tile (latent and rope) into a bf16 shared tile that both wgmmas read
    assert fused.loop_fp_to_fp == 0 and fp8.loop_fp_to_fp == 2 and fp8.loop_plain_kv_loads == 0
    assert fused.registers == fp8.registers == 255
    assert fused.merge_async_copies > 0  # the self-merge (merge="self" only at 64-row tiles) is pipelined too


def test_64_row_tile_computes_the_scores_in_both_warpgroups(report):
    """Run 6's reading of the h8T8 loop (docs/kernel-notes.md "Run 6 (planned)"): with 64 rows and 8 warps Triton lays
    Q K^T out as 8 x 1 warps over a 64-row tile (a dot feeding a dot is laid out numWarps x 1), so both warpgroups
    compute the whole score tile, with m64n32k16 wgmmas (N = 64 keys / 2 warp columns); P V is 4 x 2 (each warpgroup
    256 value dims); the next tile's copy is waited for at the top of the next iteration (async_wait 0)."""
    split = report("split", "bf16", 64, 64, 8, 3)  # split_p1 at 33-128 rows
    assert (split.qk_warps, split.qk_instr_n, split.pv_warps, split.loop_async_wait) == ("8x1", 32, "4x2", 0)
    assert (split.shared_bytes, split.kv_buffers, split.registers) == (230400, 2, 255)
    fused = report("fused", "bf16", 64, 64, 8, 3)
    assert (fused.qk_warps, fused.qk_instr_n, fused.pv_warps) == ("8x1", 32, "4x2")


def test_run6_tiles_three_buffers_at_five_stages_and_scores_once(report):
    s5 = report("split", "bf16", 64, 32, 8, 5)  # split_n32s5_p1
    qk1 = report("split", "bf16", 64, 32, 8, 5, qk_once=True)  # split_qk1_p1
    assert (s5.shared_bytes, s5.kv_buffers, s5.loop_async_wait) == (193536, 3, 4)
    assert (qk1.shared_bytes, qk1.kv_buffers, qk1.loop_async_wait) == (193536, 3, 4)
    assert (s5.qk_warps, s5.qk_instr_n, s5.pv_warps) == ("8x1", 16, "4x2")  # both warpgroups: all 32 keys
    assert (qk1.qk_warps, qk1.qk_instr_n, qk1.pv_warps) == ("4x2", 16, "4x2")  # each warpgroup 16 of the keys
    for r in (s5, qk1):  # prefetched, few spills
        assert r.loop_plain_kv_loads == 0 and r.loop_async_copies == 4 and r.spill_store_bytes <= 240
    # the 64-token tile with the scores once does not fit: P's staging for the P V dot adds 8 KB
    assert report("split", "bf16", 64, 64, 8, 3, qk_once=True).shared_bytes > 232448
    # ruled out: one warpgroup holds the 64 x 512 fp32 accumulator alone (scores not replicated, n64, but ~4 KB of
    # spills); 16 warps replicate the scores four times (run 2: 1.9x slower); 128-token tiles do not fit
    w4 = report("split", "bf16", 64, 64, 4, 3)
    assert (w4.qk_warps, w4.qk_instr_n) == ("4x1", 64) and w4.spill_store_bytes > 3000
    assert report("split", "bf16", 64, 64, 16, 2).qk_warps == "16x1"
    assert report("split", "bf16", 64, 128, 8, 2).shared_bytes > 232448
