"""On the CPU: the split-KV partial kernel written in Gluon (gluon_splitkv). Triton's interpreter does not run
Gluon, so here: the variants resolve to the Gluon tile, the kernel compiles for sm_90 with the shared memory and the
tensor-core instructions its design says (Q K^T split by keys between the two warpgroups: 36 m64nXk16 per warpgroup
per tile, each covering its half of the keys; P V split by value dims: m64n256k16), no spill beyond a word, and the
CPU fallback of the variants computes the right function. Correctness on the GPU: tests/test_kernels_gpu.py (run10).
"""

from __future__ import annotations

import collections
import importlib.util
import re
import subprocess

import pytest

from specdiag.kernels.splitkv_plan import SHARED_LIMIT_SM90

HAS_TRITON = importlib.util.find_spec("triton") is not None


@pytest.mark.slow
@pytest.mark.skipif(not HAS_TRITON, reason="triton is not installed here")
@pytest.mark.parametrize("block_n, stages, prefetch, overlap, fold",
                         [(64, 2, False, False, False), (64, 2, True, False, False), (64, 2, True, True, False),
                          (32, 4, True, False, False), (32, 4, True, True, False), (64, 2, True, False, True)])
def test_warp_specialized_kernel_compiles_for_sm90_as_designed(block_n: int, stages: int, prefetch: bool,
                                                               overlap: bool, fold: bool) -> None:
    """Runs 15-16's kernel (gluon_ws) for sm_90: two partitions of one warpgroup each; warpgroup 0's scores as
    whole-tile m64nBLOCK_Nk16 wgmmas (36 per tile: no score computed twice, no cross-warpgroup reduction), both halves
    of P V as m64n256k16, warpgroup 0's with P from registers; the cp.async copies arrive on the ring's mbarriers
    (.noinc: one arrival per copying thread); no spill, no serialized wgmma (C7514), shared memory under the limit.
    With the overlap the loop is peeled (tile 0's scores and the last tile's P V outside it: twice the score and P V
    instructions in the code) and the scores are waited for with one P V left in flight."""
    import tempfile
    from pathlib import Path

    from triton.backends.nvidia.compiler import get_ptxas

    from specdiag.kernels.gluon_ws import compile_sm90

    k = compile_sm90(block_n, stages, prefetch=prefetch, overlap=overlap, draft_branch=fold, fold=fold,
                     partial="bf16" if fold else "fp32")
    assert 0 < k.metadata.shared <= SHARED_LIMIT_SM90, k.metadata.shared
    assert k.metadata.num_warps == 8
    ptx = k.asm["ptx"]
    shapes = collections.Counter(re.findall(r"wgmma\.mma_async\.sync\.aligned\.(m\d+n\d+k\d+)", ptx))
    copies = 2 if overlap else 1  # the peeled tile 0 / last P V
    # P V: warpgroup 0's (block_n / 16 k-steps, per copy of the code) and the worker's
    assert shapes == {f"m64n{block_n}k16": 36 * copies, "m64n256k16": (block_n // 16) * (copies + 1)}, shapes
    # P from registers: the A operand of warpgroup 0's P V is a register list, not a shared-memory descriptor
    rs = re.findall(r"m64n256k16\.f32\.bf16\.bf16 \{[^}]*\}, \{%r\d+,%r\d+,%r\d+,%r\d+\}", ptx)
    assert len(rs) == (block_n // 16) * copies, len(rs)
    assert shapes["m64n256k16"] == len(rs) + block_n // 16, shapes  # plus the worker's, from shared memory
    assert ("wgmma.wait_group.sync.aligned 1" in ptx) == overlap
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
    """The ragged entry (gluon_ws_ragged: SGLang's ragged layout, lengths read on the device) around gluon_ws's two
    partitions, for sm_90: the same wgmma shapes and counts as the pick's dense kernel (PREFETCH, DRAFT_BRANCH, FOLD),
    its copies arriving on the ring's mbarriers, shared memory within 64 B of the dense kernel's; its copy partition
    reads the prefix's and the draft tokens' cache rows from two tables (more index loads than the dense kernel).
    ptxas spills 32 bytes (Triton 3.6; the dense kernel none): the request's offsets kept live beside 255 registers."""
    import tempfile
    from pathlib import Path

    from triton.backends.nvidia.compiler import get_ptxas

    from specdiag.kernels.gluon_ws import compile_sm90 as dense_sm90
    from specdiag.kernels.gluon_ws_ragged import compile_sm90

    k, dense = compile_sm90(), dense_sm90(64, 2, prefetch=True, draft_branch=True, fold=True)
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
    from specdiag.kernels.gluon_ws_ragged import compile_sm90

    k = compile_sm90(qo_indptr=qo, kv_indptr=kv, mask_indptr=mask)
    assert k.metadata.num_warps == 8 and 0 < k.metadata.shared <= SHARED_LIMIT_SM90


def test_swap_launcher_names_a_bad_ring_depth_before_any_work() -> None:
    """split_kv_gluon_swap's ``fit_stages``: anything but 0, 2 or 3 is refused with the values it takes, before the
    inputs are looked at (a CPU tensor would otherwise fail first, for another reason)."""
    from specdiag.kernels.gluon_ws_swap import split_kv_gluon_swap
    from specdiag.kernels.mla import VerifyShape, make_inputs

    x = make_inputs(VerifyShape(256, 2, 1, "contiguous"), device="cpu", seed=0)
    with pytest.raises(ValueError, match="fit_stages must be 0 .* 2 or 3; got 4"):
        split_kv_gluon_swap(x, x.out_like(), fit_rows=True, fit_stages=4)


