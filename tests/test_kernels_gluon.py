"""On the CPU: the warp-specialized Gluon kernels (gluon.ws, and the plugin's gluon.ragged around its partitions).
Triton's interpreter does not run Gluon, so here each compiles for sm_90 with the shared memory, tensor-core
instructions, copies and registers its design says, with every index dtype SGLang passes. Correctness on the GPU:
tests/test_kernels_gpu.py and tests/test_sglang_plugin_gpu.py.
"""

from __future__ import annotations

import collections
import importlib.util
import re
import subprocess

import pytest

from specdiag.kernels.plan import SHARED_LIMIT_SM90

HAS_TRITON = importlib.util.find_spec("triton") is not None


@pytest.mark.slow
@pytest.mark.skipif(not HAS_TRITON, reason="triton is not installed here")
@pytest.mark.parametrize("early_q", [False, True], ids=["q-first", "early-q"])
def test_warp_specialized_kernel_compiles_for_sm90_as_designed(early_q: bool) -> None:
    """The pick's row-major kernel (gluon.ws) for sm_90, Q loaded before the partitions or by warpgroup 0 (EARLY_Q):
    two partitions of one warpgroup each; warpgroup 0's scores as whole-tile m64n64k16 wgmmas (36 per tile: no score
    computed twice, no cross-warpgroup reduction), both halves of P V as m64n256k16, warpgroup 0's with P from
    registers; the cp.async copies arrive on the ring's mbarriers (.noinc: one arrival per copying thread); no spill,
    no serialized wgmma (C7514), shared memory under the limit."""
    import tempfile
    from pathlib import Path

    from triton.backends.nvidia.compiler import get_ptxas

    from specdiag.kernels.gluon.ws import compile_sm90

    k = compile_sm90(early_q=early_q)
    assert 0 < k.metadata.shared <= SHARED_LIMIT_SM90, k.metadata.shared
    assert k.metadata.num_warps == 8
    ptx = k.asm["ptx"]
    shapes = collections.Counter(re.findall(r"wgmma\.mma_async\.sync\.aligned\.(m\d+n\d+k\d+)", ptx))
    assert shapes == {"m64n64k16": 36, "m64n256k16": 8}, shapes  # P V: 4 k-steps in each warpgroup
    # P from registers: the A operand of warpgroup 0's P V is a register list, not a shared-memory descriptor
    rs = re.findall(r"m64n256k16\.f32\.bf16\.bf16 \{[^}]*\}, \{%r\d+,%r\d+,%r\d+,%r\d+\}", ptx)
    assert len(rs) == 4, len(rs)
    assert "wgmma.wait_group.sync.aligned 1" not in ptx
    assert ptx.count("cp.async.mbarrier.arrive.noinc") >= 2 and "setmaxnreg" in ptx
    assert "bar.sync \t0, 128" in ptx and "bar.sync \t2, 128" in ptx  # each partition's own named barrier
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "k.ptx").write_text(ptx)
        res = subprocess.run([get_ptxas(90).path, "-v", "-arch=sm_90a", str(Path(tmp) / "k.ptx"), "-o",
                              str(Path(tmp) / "k.cubin")], capture_output=True, text=True)
    spills = [int(m) for m in re.findall(r"(\d+) bytes spill stores", res.stderr + res.stdout)]
    assert res.returncode == 0 and spills == [0] and "C7514" not in res.stderr + res.stdout, res.stderr[-2000:]


@pytest.mark.slow
@pytest.mark.skipif(not HAS_TRITON, reason="triton is not installed here")
def test_ragged_warp_specialized_kernel_compiles_for_sm90_as_the_picks() -> None:
    """The ragged entry (gluon.ragged: SGLang's ragged layout, lengths read on the device) around gluon.ws's two
    partitions, for sm_90: the same wgmma shapes and counts as the pick's dense kernel, its copies arriving on the ring's mbarriers, shared memory within 64 B of the dense kernel's; its copy partition
    reads the prefix's and the draft tokens' cache rows from two tables (more index loads than the dense kernel).
    ptxas spills 32 bytes (Triton 3.6; the dense kernel none): the request's offsets kept live beside 255 registers."""
    import tempfile
    from pathlib import Path

    from triton.backends.nvidia.compiler import get_ptxas

    from specdiag.kernels.gluon.ws import compile_sm90 as dense_sm90
    from specdiag.kernels.gluon.ragged import compile_sm90

    k, dense = compile_sm90(), dense_sm90()
    assert k.metadata.num_warps == 8 and 0 < k.metadata.shared <= SHARED_LIMIT_SM90
    assert abs(k.metadata.shared - dense.metadata.shared) <= 64, (k.metadata.shared, dense.metadata.shared)
    ptx, dptx = k.asm["ptx"], dense.asm["ptx"]
    shapes = collections.Counter(re.findall(r"wgmma\.mma_async\.sync\.aligned\.(m\d+n\d+k\d+)", ptx))
    assert shapes == collections.Counter(re.findall(r"wgmma\.mma_async\.sync\.aligned\.(m\d+n\d+k\d+)", dptx))
    assert shapes == {"m64n64k16": 36, "m64n256k16": 8}, shapes
    assert ptx.count("cp.async.mbarrier.arrive.noinc") >= 2 and "setmaxnreg" in ptx
    index_loads = len(re.findall(r"ld\.global(?:\.[a-z0-9]+)*\.b64", ptx))
    assert len(re.findall(r"ld\.global(?:\.[a-z0-9]+)*\.b64", dptx)) < index_loads
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "k.ptx").write_text(ptx)
        res = subprocess.run([get_ptxas(90).path, "-v", "-arch=sm_90a", str(Path(tmp) / "k.ptx"), "-o",
                              str(Path(tmp) / "k.cubin")], capture_output=True, text=True)
    spills = [int(m) for m in re.findall(r"(\d+) bytes spill stores", res.stderr + res.stdout)]
    assert res.returncode == 0 and len(spills) == 1 and spills[0] <= 32 and "C7514" not in res.stderr + res.stdout


@pytest.mark.slow
@pytest.mark.skipif(not HAS_TRITON, reason="triton is not installed here")
@pytest.mark.parametrize("qo, kv, mask", [("i64", "i32", "i64"), ("i64", "i64", "i32"), ("i32", "i64", "i64")])
def test_ragged_kernel_compiles_with_every_index_dtype_sglang_passes(qo: str, kv: str, mask: str) -> None:
    """SGLang's CUDA-graph buffers hold qo_indptr and mask_indptr as int64 (eager calls: int32 qo_indptr): the first
    form of the entry failed to compile with an int64 qo_indptr inside a real SGLang 0.5.17 on the H200 (2026-12-01, commit a1c03c5)."""
    from specdiag.kernels.gluon.ragged import compile_sm90

    k = compile_sm90(qo_indptr=qo, kv_indptr=kv, mask_indptr=mask)
    assert k.metadata.num_warps == 8 and 0 < k.metadata.shared <= SHARED_LIMIT_SM90
