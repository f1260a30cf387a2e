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
