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


def test_16_row_tiles_fp8_loses_the_prefetch_of_the_latent_tile(report):
    split = report("split", "bf16", 16, 64, 4, 2)
    fused = report("fused", "bf16", 16, 64, 4, 2)
    fp8 = report("fused", "fp8", 16, 64, 4, 2)
    # one launch changes neither the tile's shared memory nor how the KV tile is loaded (prefetched, one buffer)
    assert fused.shared_bytes == split.shared_bytes == 94208
    for r in (split, fused):
        assert (r.loop_async_copies, r.loop_plain_kv_loads, r.kv_buffers, r.loop_fp_to_fp) == (2, 0, 1, 0)
    # fp8: the 64 x 512 latent tile is a plain load (only the rope part is async-copied), converted twice
    assert (fp8.loop_async_copies, fp8.loop_plain_kv_loads, fp8.kv_buffers) == (1, 1, 0)
    assert fp8.loop_fp_to_fp == 3
    assert fp8.spill_store_bytes > 2 * fused.spill_store_bytes
    # the fused kernel's merge loops: plain .cg loads, nothing prefetched; the split kernel has no merge in it
    assert fused.merge_cg_loads > 0 and fused.merge_async_copies == 0 and split.merge_cg_loads == 0


def test_64_row_tiles_fp8_has_one_buffer_and_converts_in_the_loop(report):
    fused = report("fused", "bf16", 64, 64, 8, 3)
    fp8 = report("fused", "fp8", 64, 64, 8, 3)
    assert fused.shared_bytes == 230400 and fp8.shared_bytes == 185344
    assert (fused.kv_buffers, fp8.kv_buffers) == (2, 1)
    assert fused.loop_fp_to_fp == 0 and fp8.loop_fp_to_fp == 2
    assert fused.registers == fp8.registers == 255
