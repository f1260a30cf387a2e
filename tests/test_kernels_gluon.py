"""Run 10 on the CPU: the split-KV partial kernel written in Gluon (gluon_splitkv). Triton's interpreter does not run
Gluon, so here: the variants resolve to the Gluon tile, the kernel compiles for sm_90 with the shared memory and the
tensor-core instructions its design says (Q K^T split by keys between the two warpgroups: 36 m64nXk16 per warpgroup
per tile, each covering its half of the keys; P V split by value dims: m64n256k16), no spill beyond a word, and the
CPU fallback of the variants computes the right function. Correctness on the GPU: tests/test_kernels_gpu.py (run10).
"""

from __future__ import annotations

import collections
from dataclasses import replace
import importlib.util
import re
import subprocess

import pytest
import torch

from specdiag.kernels.cases import relative_error
from specdiag.kernels.dispatch import KERNEL_VARIANTS, resolve_config, run_variant
from specdiag.kernels.mla import VerifyShape, make_inputs
from specdiag.kernels.reference import reference_verify
from specdiag.kernels.splitkv_plan import SHARED_LIMIT_SM90, gluon_config

HAS_TRITON = importlib.util.find_spec("triton") is not None


def test_gluon_variants_resolve_to_their_tile_at_every_row_count() -> None:
    for rows in (8, 16, 64, 1024):
        assert resolve_config("split_glw_p1", rows) == gluon_config(64, 2)
        assert resolve_config("split_glo32_p1", rows) == gluon_config(32, 4)
        assert resolve_config("split_glo32_p1", rows) == gluon_config(32, 4)
    cfg = gluon_config(64, 2)
    assert (cfg.block_m, cfg.num_warps, cfg.programs_per_sm) == (64, 8, 1.0)
    assert KERNEL_VARIANTS["split_glw_p1"].impl == "gluon" and KERNEL_VARIANTS["split_p1"].impl == "triton"
    assert KERNEL_VARIANTS["split_glo_p1"].gluon_pv_across and not KERNEL_VARIANTS["split_glw_p1"].gluon_pv_across


def test_auto_variant_picks_triton_up_to_32_rows_and_gluon_above() -> None:
    from specdiag.kernels.dispatch import AUTO_GLUON_MIN_ROWS

    assert AUTO_GLUON_MIN_ROWS == 33
    for name in ("split_auto_p1", "split_auto_ws_p1", "split_auto_gwf_p1", "split_auto_gwf64_p1", "split_auto_gwg_p1"):
        for rows in (8, 16, 32):
            assert resolve_config(name, rows) is None  # split_p1's own default, chosen in the launcher
        for rows in (33, 64, 1024):
            assert resolve_config(name, rows) == replace(
                gluon_config(64, 2), merge_block_dv=KERNEL_VARIANTS[name].gluon_merge_block_dv)
    assert KERNEL_VARIANTS["split_auto_ws_p1"].gluon_prefetch and not KERNEL_VARIANTS["split_auto_ws_p1"].gluon_fold
    assert KERNEL_VARIANTS["split_auto_gwf_p1"].gluon_fold and KERNEL_VARIANTS["split_auto_gwf_p1"].impl == "auto_ws"


def test_gluon_variants_fall_back_to_the_torch_design_on_the_cpu() -> None:
    x = make_inputs(VerifyShape(300, 4, 4, "shuffled_p1"), seed=2)
    ref = reference_verify(x)
    for name in ("split_glo_p1", "split_glo32_p1", "split_glw_p1", "split_glw32_p1", "split_auto_p1", "split_glx_p1",
                 "split_auto_ws_p1", "split_auto_gwf_p1", "split_auto_gwf64_p1", "split_auto_gwg_p1"):
        out = x.out_like()
        run_variant(name, x, out)
        assert relative_error(out, ref) < 1e-2


@pytest.mark.skipif(not HAS_TRITON, reason="triton is not installed here")
@pytest.mark.parametrize("block_n, stages, pv_across", [(64, 2, False), (32, 4, False), (64, 2, True), (32, 4, True)])
def test_gluon_kernel_compiles_for_sm90_as_designed(block_n: int, stages: int, pv_across: bool) -> None:
    from triton.backends.nvidia.compiler import get_ptxas

    from specdiag.kernels.gluon_splitkv import compile_sm90

    k = compile_sm90(block_n, stages, pv_across=pv_across)
    assert 0 < k.metadata.shared <= SHARED_LIMIT_SM90, k.metadata.shared
    ptx = k.asm["ptx"]
    shapes = collections.Counter(re.findall(r"wgmma\.mma_async\.sync\.aligned\.(m\d+n\d+k\d+)", ptx))
    # Q K^T: 576 / 16 = 36 k-steps, N = each warpgroup's half of the keys; P V: N = 256 value dims per warpgroup
    assert shapes[f"m64n{block_n // 2}k16"] == 36, shapes
    assert shapes["m64n256k16"] == block_n // 16, shapes
    assert ptx.count("cp.async") > 0 and "st.local" not in ptx
    # the wait for the previous tile's P V leaves the two score groups in flight (trivially so when it was waited for)
    assert "wgmma.wait_group.sync.aligned 2" in ptx
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "k.ptx"
        src.write_text(ptx)
        res = subprocess.run([get_ptxas(90).path, "-v", "-arch=sm_90a", str(src), "-o", str(Path(tmp) / "k.cubin")],
                             capture_output=True, text=True)
    spills = [int(m) for m in re.findall(r"(\d+) bytes spill stores", res.stderr + res.stdout)]
    assert res.returncode == 0 and spills and max(spills) <= 8, res.stderr[-2000:]


def test_gluon_kernel_refuses_the_cpu_with_a_clear_message() -> None:
    pytest.importorskip("triton.experimental.gluon")
    from specdiag.kernels.gluon_splitkv import split_kv_gluon

    x = make_inputs(VerifyShape(100, 2, 1, "contiguous"))
    with pytest.raises(ValueError, match="CUDA"):
        split_kv_gluon(x, x.out_like())
    assert torch.isfinite(x.q).all()


@pytest.mark.skipif(not HAS_TRITON, reason="triton is not installed here")
def test_ptxas_serializes_the_wgmmas_only_when_p_v_crosses_iterations() -> None:
    """ptxas (C7514) serializes the wgmmas of the overlapped kernel when a tile's P V is waited for in the next
    iteration (its accumulator crosses the loop's back edge), and not when it is waited for in its own iteration."""
    import tempfile
    from pathlib import Path

    from triton.backends.nvidia.compiler import get_ptxas

    from specdiag.kernels.gluon_splitkv import compile_sm90

    seen = {}
    for across in (True, False):
        ptx = compile_sm90(64, 2, pv_across=across).asm["ptx"]
        with tempfile.TemporaryDirectory() as tmp:
            (Path(tmp) / "k.ptx").write_text(ptx)
            res = subprocess.run([get_ptxas(90).path, "-v", "-arch=sm_90a", str(Path(tmp) / "k.ptx"), "-o",
                                  str(Path(tmp) / "k.cubin")], capture_output=True, text=True)
        assert res.returncode == 0, res.stderr[-2000:]
        seen[across] = "C7514" in res.stderr + res.stdout
    assert seen == {True: True, False: False}


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


def test_warp_specialized_variants_resolve_and_fall_back_on_the_cpu() -> None:
    tiles = {"split_gws_p1": (64, 2), "split_gwp_p1": (64, 2), "split_gwo_p1": (64, 2), "split_gwp32_p1": (32, 4),
             "split_gwo32_p1": (32, 4), "split_gwm_p1": (64, 2), "split_gwf_p1": (64, 2), "split_gwb_p1": (64, 2),
             "split_gwbp_p1": (64, 2), "split_gwf64_p1": (64, 2), "split_gwf128_p1": (64, 2), "split_gwg_p1": (64, 2)}
    x = make_inputs(VerifyShape(300, 4, 4, "shuffled_p1"), seed=3)
    ref = reference_verify(x)
    for name, tile in tiles.items():
        assert KERNEL_VARIANTS[name].impl == "gluon_ws"
        for rows in (8, 64, 1024):
            assert resolve_config(name, rows) == replace(gluon_config(*tile),
                                                         merge_block_dv=KERNEL_VARIANTS[name].gluon_merge_block_dv)
        out = x.out_like()
        run_variant(name, x, out)
        assert relative_error(out, ref) < 1e-2
    assert KERNEL_VARIANTS["split_gwo_p1"].gluon_overlap and not KERNEL_VARIANTS["split_gwp_p1"].gluon_overlap
    assert KERNEL_VARIANTS["split_gwf_p1"].gluon_fold and KERNEL_VARIANTS["split_gwf_p1"].gluon_draft_branch
    assert KERNEL_VARIANTS["split_gwb_p1"].gluon_bf16_partials and not KERNEL_VARIANTS["split_gwb_p1"].gluon_pdl_merge
    assert KERNEL_VARIANTS["split_gwbp_p1"].gluon_pdl_merge
    assert KERNEL_VARIANTS["split_gwg_p1"].gluon_grid_merge and KERNEL_VARIANTS["split_auto_gwg_p1"].gluon_grid_merge
    assert not KERNEL_VARIANTS["split_gwf_p1"].gluon_grid_merge
    assert resolve_config("split_gwf128_p1", 64).merge_block_dv == 128
    assert resolve_config("split_gwf_p1", 64).merge_block_dv == 16
    pytest.importorskip("triton.experimental.gluon")
    from specdiag.kernels.gluon_ws import split_kv_gluon_ws

    with pytest.raises(ValueError, match="CUDA"):
        split_kv_gluon_ws(x, x.out_like())


@pytest.mark.skipif(not HAS_TRITON, reason="triton is not installed here")
@pytest.mark.parametrize("n_splits", [128, 8])
def test_grid_merge_form_compiles_with_its_wait_and_reset(n_splits: int) -> None:
    """Run 25's form of gluon_ws that merges inside its grid, for sm_90: after both partitions join (a whole-CTA
    barrier), one thread releases its arrival (atom.release.add at gpu scope) and the warpgroup spins on an acquire
    load of the counter, broadcast through shared memory; the merge reads partials with .cg loads (L2, not a stale
    L1); the departure count and the reset are relaxed atomics. Same shared memory as the two-launch form, no
    spill. Correctness and the counters' reset between calls: tests/test_kernels_gpu.py (run15, run25)."""
    import tempfile
    from pathlib import Path

    from triton.backends.nvidia.compiler import get_ptxas

    from specdiag.kernels.gluon_ws import compile_sm90, grid_merge_block

    k = compile_sm90(prefetch=True, draft_branch=True, fold=True, grid_merge_splits=n_splits)
    two_launch = compile_sm90(prefetch=True, draft_branch=True, fold=True)
    assert k.metadata.shared == two_launch.metadata.shared <= SHARED_LIMIT_SM90
    assert k.metadata.launch_cooperative_grid and not two_launch.metadata.launch_cooperative_grid
    ptx = k.asm["ptx"]
    assert len(re.findall(r"atom\.global\.gpu\.release\.add\.u32", ptx)) == 1
    assert len(re.findall(r"ld\.global\.gpu\.acquire\.b32", ptx)) == 2  # before the loop and in it
    assert len(re.findall(r"atom\.global\.gpu\.relaxed\.(add|exch)", ptx)) == 3
    assert "atom." not in two_launch.asm["ptx"]
    assert re.search(r"ld\.global\.cg\.v4", ptx)  # the merge's 16-byte partial loads bypass L1
    merge_s, merge_f, tpw_f = grid_merge_block(n_splits)
    assert merge_s >= n_splits and merge_s * merge_f <= 8192 and merge_f % (4 * tpw_f) == 0 and 512 % merge_f == 0
    ex2 = len(re.findall(r"ex2\.approx", ptx)) - len(re.findall(r"ex2\.approx", two_launch.asm["ptx"]))
    # one weight per split of a row, spread over the warpgroup: not one exp2 per output (64 per thread; run 25)
    assert ex2 == max(1, merge_s // ((32 // tpw_f) * 4))
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "k.ptx").write_text(ptx)
        res = subprocess.run([get_ptxas(90).path, "-v", "-arch=sm_90a", str(Path(tmp) / "k.ptx"), "-o",
                              str(Path(tmp) / "k.cubin")], capture_output=True, text=True)
    spills = [int(m) for m in re.findall(r"(\d+) bytes spill stores", res.stderr + res.stdout)]
    assert res.returncode == 0 and spills == [0], res.stderr[-2000:]


def test_grid_merge_block_loads_every_split_at_once() -> None:
    pytest.importorskip("triton.experimental.gluon")
    from specdiag.kernels.gluon_ws import grid_merge_block

    assert grid_merge_block(128) == (128, 64, 16)
    assert grid_merge_block(8) == (8, 512, 32)  # a block never spans two rows: one weight per split
    assert grid_merge_block(1) == (2, 512, 32)
    for n in range(1, 513):
        assert 512 % grid_merge_block(n)[1] == 0
    with pytest.raises(ValueError, match="at most 512 splits"):
        grid_merge_block(600)


@pytest.mark.skipif(not HAS_TRITON, reason="triton is not installed here")
def test_ragged_warp_specialized_kernel_compiles_for_sm90_as_the_picks() -> None:
    """Run 32's entry (gluon_ws_ragged: SGLang's ragged layout, lengths read on the device) around gluon_ws's two
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


@pytest.mark.skipif(not HAS_TRITON, reason="triton is not installed here")
@pytest.mark.parametrize("qo, kv, mask", [("i64", "i32", "i64"), ("i64", "i64", "i32"), ("i32", "i64", "i64")])
def test_ragged_kernel_compiles_with_every_index_dtype_sglang_passes(qo: str, kv: str, mask: str) -> None:
    """SGLang's CUDA-graph buffers hold qo_indptr and mask_indptr as int64 (eager calls: int32 qo_indptr): the first
    form of the entry failed to compile with an int64 qo_indptr inside a real SGLang (session 9's plugin call)."""
    from specdiag.kernels.gluon_ws_ragged import compile_sm90

    k = compile_sm90(qo_indptr=qo, kv_indptr=kv, mask_indptr=mask)
    assert k.metadata.num_warps == 8 and 0 < k.metadata.shared <= SHARED_LIMIT_SM90


def test_the_plugins_arm_runs_gluon_from_33_rows_and_the_triton_ragged_kernel_below() -> None:
    from specdiag.kernels.splitkv_plan import fitting_ladder

    pytest.importorskip("triton.experimental.gluon")
    from specdiag.kernels.gluon_ws_ragged import gluon_ragged_supported, ragged_gluon_config

    assert resolve_config("ragged_gw_p1", 8) == fitting_ladder(8)[0]
    assert resolve_config("ragged_gw_p1", 32) == fitting_ladder(32)[0]
    for rows in (33, 64, 256, 1024):
        cfg = resolve_config("ragged_gw_p1", rows)
        assert cfg == replace(ragged_gluon_config(rows), pdl=False)  # the merge ragged_gw_p1 was measured with (run 32)
        assert resolve_config("ragged_gwap_p1", rows) == ragged_gluon_config(rows)  # the plugin's since run 37
        assert (cfg.block_m, cfg.block_n, cfg.num_stages, cfg.merge_block_dv) == (64, 64, 2, 64)
        assert cfg.merge_one_pass and cfg.merge_one_pass_max_splits == 16
    x = make_inputs(VerifyShape(300, 8, 8, "shuffled_p1"), seed=5)
    out = x.out_like()
    run_variant("ragged_gw_p1", x, out)  # the CPU: the torch fallback, as every arm
    assert relative_error(out, reference_verify(x)) < 1e-2
    assert gluon_ragged_supported(x.q, x.cache) == (False, "not a CUDA device")


@pytest.mark.skipif(not HAS_TRITON, reason="triton is not installed here")
def test_read_only_kernel_of_the_picks_launch_shape_compiles_without_math() -> None:
    """Session 10's read floor of the pick's launch shape (gluon_ws_read) for sm_90: the pick's copy code (as many
    cp.async and ring arrivals as the pick's kernel), no wgmma at all, two partitions, and shared memory over half an
    SM's, so one program per SM as the pick."""
    from specdiag.kernels.gluon_ws import compile_sm90 as compile_pick
    from specdiag.kernels.gluon_ws_read import compile_sm90

    k, pick = compile_sm90(), compile_pick(prefetch=True, draft_branch=True, fold=True)
    ptx, pick_ptx = k.asm["ptx"], pick.asm["ptx"]
    assert "wgmma" not in ptx
    assert ptx.count("cp.async.ca") + ptx.count("cp.async.cg") == \
        pick_ptx.count("cp.async.ca") + pick_ptx.count("cp.async.cg") > 0
    assert ptx.count("cp.async.mbarrier.arrive.noinc") == pick_ptx.count("cp.async.mbarrier.arrive.noinc")
    assert "setmaxnreg" in ptx and k.metadata.num_warps == 8
    assert SHARED_LIMIT_SM90 // 2 < k.metadata.shared <= SHARED_LIMIT_SM90, k.metadata.shared
    assert "globaltimer" not in ptx and "%smid" not in ptx  # the timeline is compiled in only when asked for
    timed = compile_sm90(timeline=True)
    tptx = timed.asm["ptx"]
    assert tptx.count("%globaltimer") == 4 and tptx.count("%smid") == 1 and "wgmma" not in tptx
    assert tptx.count("cp.async.mbarrier.arrive.noinc") == ptx.count("cp.async.mbarrier.arrive.noinc")
    assert timed.metadata.shared == k.metadata.shared


@pytest.mark.skipif(not HAS_TRITON, reason="triton is not installed here")
def test_early_q_kernel_loads_q_in_warpgroup_0_and_leaves_the_pick_alone() -> None:
    """split_gwrpq_p1 (session 11): the pick's kernel with EARLY_Q compiles for sm_90 with the pick's tensor-core
    instructions and shared memory, and loads Q with more, narrower loads inside warpgroup 0 (four 128-column pieces
    and the PE part); the arm is the pick's with early_q, and its call's keyword arguments say so."""
    import collections
    import re

    from specdiag.kernels.dispatch import gluon_ws_kwargs, resolve_config
    from specdiag.kernels.gluon_ws import compile_sm90

    pick = compile_sm90(prefetch=True, draft_branch=True, fold=True)
    early = compile_sm90(prefetch=True, draft_branch=True, fold=True, early_q=True)

    def wgmma(k) -> collections.Counter:
        return collections.Counter(re.findall(r"wgmma\.mma_async\.sync\.aligned\.(m\d+n\d+k\d+)", k.asm["ptx"]))

    assert wgmma(early) == wgmma(pick) == {"m64n64k16": 36, "m64n256k16": 8}
    assert early.metadata.shared == pick.metadata.shared
    assert early.asm["ptx"].count("ld.global") > pick.asm["ptx"].count("ld.global")
    a, b = KERNEL_VARIANTS["split_gwrp_p1"], KERNEL_VARIANTS["split_gwrpq_p1"]
    assert b.gluon_early_q and not a.gluon_early_q
    assert {f: getattr(b, f) for f in b.__dataclass_fields__ if f not in ("name", "gluon_early_q")} == \
        {f: getattr(a, f) for f in a.__dataclass_fields__ if f not in ("name", "gluon_early_q")}
    for rows in (8, 64, 1024):
        kw_a = gluon_ws_kwargs(a, resolve_config("split_gwrp_p1", rows), rows)
        kw_b = gluon_ws_kwargs(b, resolve_config("split_gwrpq_p1", rows), rows)
        kw_r = gluon_ws_kwargs(KERNEL_VARIANTS["split_gwrpqr_p1"], resolve_config("split_gwrpqr_p1", rows), rows)
        assert kw_b == {**kw_a, "early_q": True} and kw_a["early_q"] is False
        assert kw_r == (kw_b if rows <= 64 else kw_a)  # run 39's arm: early Q up to 64 rows (one row tile), the pick's above


@pytest.mark.skipif(not HAS_TRITON, reason="triton is not installed here")
def test_swap_kernel_puts_the_rows_on_the_wgmmas_n() -> None:
    """gluon_ws_swap for sm_90: every wgmma m64n16k16 (scores 576 / 16 = 36, each warpgroup's O^T half 256 / 64 x
    64 / 16 = 16), Q of 16 rows so the shared memory is the ring's two tiles plus 20 KB (one program per SM still);
    split_gwsw_p1 runs it up to 16 rows and the pick's call above."""
    import collections
    import re

    from specdiag.kernels.dispatch import runs_gluon_swap, runs_gluon_ws
    from specdiag.kernels.gluon_ws_swap import SWAP_MAX_ROWS, compile_sm90

    k = compile_sm90()
    shapes = collections.Counter(re.findall(r"wgmma\.mma_async\.sync\.aligned\.(m\d+n\d+k\d+)", k.asm["ptx"]))
    assert shapes == {"m64n16k16": 36 + 2 * 16}
    ring = 2 * 64 * 576 * 2
    assert ring < k.metadata.shared <= ring + 16 * 576 * 2 + 64 * 16 * 2 + 4096, k.metadata.shared
    assert k.metadata.shared > SHARED_LIMIT_SM90 // 2
    v = KERNEL_VARIANTS["split_gwsw_p1"]
    assert [runs_gluon_swap(v, r) for r in (1, 8, 16, 17, 64)] == [True, True, True, False, False] and SWAP_MAX_ROWS == 16
    assert runs_gluon_ws(v, 17) and not any(runs_gluon_swap(KERNEL_VARIANTS["split_gwrpqr_p1"], r) for r in (8, 16))
    # run 41's N of 8 for up to 8 rows: the same count of m64n8k16, 8 rows of Q and P^T fewer
    k8 = compile_sm90(rn=8)
    assert collections.Counter(re.findall(r"wgmma\.mma_async\.sync\.aligned\.(m\d+n\d+k\d+)", k8.asm["ptx"])) == \
        {"m64n8k16": 68}
    assert k8.metadata.shared < k.metadata.shared and KERNEL_VARIANTS["split_gwsw8_p1"].gluon_swap_fit_rows


@pytest.mark.skipif(not HAS_TRITON, reason="triton is not installed here")
def test_session12_swap_forms_compile_within_the_shared_memory() -> None:
    """Session 12's rows-as-N forms for sm_90: three ring buffers fit beside an 8-row Q (under the H200's 232,448 B)
    and not beside a 16-row one, which is why ``fit_stages`` applies to the N of 8 only; the late row sums take one
    warpgroup barrier (the cross-warp reduction of the sums) out of the loop; the timed form keeps the 68 wgmmas and
    spills nothing to local memory; the arms ask for what they are named for."""
    import collections
    import re

    from specdiag.kernels.dispatch import gluon_swap_kwargs, resolve_config
    from specdiag.kernels.gluon_ws_swap import FIT_STAGES_MAX, compile_sm90

    def wgmmas(k):
        return collections.Counter(re.findall(r"wgmma\.mma_async\.sync\.aligned\.(m\d+n\d+k\d+)", k.asm["ptx"]))

    k3 = compile_sm90(rn=8, stages=FIT_STAGES_MAX)
    assert 3 * 64 * 576 * 2 < k3.metadata.shared <= SHARED_LIMIT_SM90 and wgmmas(k3) == {"m64n8k16": 68}
    assert compile_sm90(rn=16, stages=FIT_STAGES_MAX).metadata.shared > SHARED_LIMIT_SM90
    base, late = compile_sm90(rn=16), compile_sm90(rn=16, late_sum=True)
    assert late.asm["ptx"].count("bar.sync") == base.asm["ptx"].count("bar.sync") - 1
    for rn in (8, 16):
        timed = compile_sm90(rn=rn, timed=True)
        assert sum(wgmmas(timed).values()) == 68 and ".local" not in timed.asm["ptx"]
        assert "%globaltimer" in timed.asm["ptx"] and "%globaltimer" not in compile_sm90(rn=rn).asm["ptx"]
    kw = {name: gluon_swap_kwargs(KERNEL_VARIANTS[name], resolve_config(name, 8))
          for name in ("split_gwsw8_p1", "split_gwsw8s3_p1", "split_gwsw8l_p1", "split_gwsw8s3l_p1")}
    assert kw["split_gwsw8s3_p1"] == {**kw["split_gwsw8_p1"], "fit_stages": 3}
    assert kw["split_gwsw8l_p1"] == {**kw["split_gwsw8_p1"], "late_sum": True}
    assert kw["split_gwsw8s3l_p1"] == {**kw["split_gwsw8_p1"], "fit_stages": 3, "late_sum": True}


def test_warp_softmax_form_reduces_inside_each_warp() -> None:
    """gluon_ws_swap_alt's form with each warp's keys on their own, for sm_90: the same 68 wgmmas, the warp's max by
    butterfly shuffles over lanes 4, 8, 16 (the wgmma accumulator's key rows; 6 per asm, two asms per softmax path
    and one for the sums), fewer warpgroup barriers than the late-sum form and no local memory; the arm asks for that
    form through gluon_swap_call and for nothing else."""
    from specdiag.kernels.dispatch import gluon_swap_call
    from specdiag.kernels.gluon_ws_swap import compile_sm90
    from specdiag.kernels.gluon_ws_swap_alt import compile_sm90 as compile_alt
    from specdiag.kernels.gluon_ws_swap_alt import split_kv_gluon_swap_alt

    for rn in (8, 16):
        ptx = compile_alt("warp_softmax", rn=rn).asm["ptx"]
        assert sum(collections.Counter(re.findall(r"wgmma\.mma_async\.sync\.aligned\.(m\d+n\d+k\d+)", ptx)).values()) == 68
        assert ptx.count("shfl.sync.bfly.b32") >= 6 * 3 * (rn // 8) and ".local" not in ptx
        assert ptx.count("bar.sync") < compile_sm90(rn=rn, late_sum=True).asm["ptx"].count("bar.sync")
    (pick_fn, pick), (warp_fn, warp) = (gluon_swap_call(KERNEL_VARIANTS[n], resolve_config(n, 8))
                                        for n in ("split_gwsw8_p1", "split_gwsw8w_p1"))
    assert warp_fn is split_kv_gluon_swap_alt and pick_fn is not warp_fn
    assert warp == {k: v for k, v in {**pick, "form": "warp_softmax"}.items() if k not in ("late_sum", "smem_pad")}


def test_producer_form_gives_the_copies_a_partition_of_their_own() -> None:
    """gluon_ws_swap_alt's three-partition form for sm_90: 12 warps (softmax, P V, copies), the same 68 wgmmas,
    registers redistributed by setmaxnreg to the copying warpgroup's PRODUCER_REGS and warpgroup 1's PV_REGS within
    the register file (65,536 per SM: 128 threads each), shared memory as the two-partition form at two and three
    buffers; the arms ask for it and nothing else; its launcher refuses what it does not have, before any work."""
    from specdiag.kernels.dispatch import gluon_swap_kwargs
    from specdiag.kernels.gluon_ws_swap import compile_sm90
    from specdiag.kernels.gluon_ws_swap_alt import PRODUCER_REGS, PV_REGS, split_kv_gluon_swap_alt
    from specdiag.kernels.gluon_ws_swap_alt import compile_sm90 as compile_alt
    from specdiag.kernels.mla import VerifyShape, make_inputs

    for rn, stages in ((8, 2), (8, 3), (16, 2)):
        k = compile_alt("producer", rn=rn, stages=stages)
        ptx = k.asm["ptx"]
        assert k.metadata.num_warps == 12
        assert sum(collections.Counter(re.findall(r"wgmma\.mma_async\.sync\.aligned\.(m\d+n\d+k\d+)", ptx)).values()) == 68
        dec = {int(n) for n in re.findall(r"setmaxnreg\.dec\.sync\.aligned\.u32\s+(\d+)", ptx)}
        inc = {int(n) for n in re.findall(r"setmaxnreg\.inc\.sync\.aligned\.u32\s+(\d+)", ptx)}
        assert PRODUCER_REGS in dec and PV_REGS in dec | inc, (dec, inc)
        assert abs(k.metadata.shared - compile_sm90(rn=rn, stages=stages).metadata.shared) <= 64
    assert 128 * (PRODUCER_REGS + PV_REGS) + 128 * 224 <= 65536
    pick, prod, prod3 = (gluon_swap_kwargs(KERNEL_VARIANTS[n], resolve_config(n, 8))
                         for n in ("split_gwsw8_p1", "split_gwsw8p_p1", "split_gwsw8ps3_p1"))
    base = {k: v for k, v in pick.items() if k not in ("late_sum", "smem_pad")}
    assert prod == {**base, "form": "producer"} and prod3 == {**base, "form": "producer", "fit_stages": 3}
    x = make_inputs(VerifyShape(256, 2, 1, "contiguous"), device="cpu", seed=0)
    with pytest.raises(ValueError, match="the producer form has no timed variant"):
        split_kv_gluon_swap_alt(x, x.out_like(), "producer", times=torch.zeros(1))
    with pytest.raises(ValueError, match="form must be one of"):
        split_kv_gluon_swap_alt(x, x.out_like(), "fast")


def test_l1_share_knob_moves_the_shared_memory_across_the_carveout_steps() -> None:
    """Run 46's knob for sm_90: 32 KB of padding adds at least 32 KB of shared memory to both the 8-row kernel (over
    the 164 KB carveout step) and the 16-row one (over 196 KB), where the allocator would reuse a buffer dead after its
    one store (so the kernel reads it again after the partitions); the arm asks for the knob and nothing else; bad
    padding is refused before any work."""
    from specdiag.kernels.dispatch import gluon_swap_kwargs
    from specdiag.kernels.gluon_ws_swap import compile_sm90, split_kv_gluon_swap
    from specdiag.kernels.mla import VerifyShape, make_inputs

    kib = 1024
    base = {rn: compile_sm90(rn=rn).metadata.shared for rn in (8, 16)}
    pad = {rn: compile_sm90(rn=rn, smem_pad=32768).metadata.shared for rn in (8, 16)}
    assert base[8] <= 164 * kib < pad[8] and pad[8] - base[8] >= 32768 and pad[16] > 196 * kib
    pick, padk = (gluon_swap_kwargs(KERNEL_VARIANTS[n], resolve_config(n, 8))
                  for n in ("split_gwsw8_p1", "split_gwsw8pad_p1"))
    assert padk == {**pick, "smem_pad": 32768}
    x = make_inputs(VerifyShape(256, 2, 1, "contiguous"), device="cpu", seed=0)
    with pytest.raises(ValueError, match="smem_pad must be 0 or a power of two"):
        split_kv_gluon_swap(x, x.out_like(), smem_pad=1000)


def test_swap_launcher_names_a_bad_ring_depth_before_any_work() -> None:
    """split_kv_gluon_swap's ``fit_stages``: anything but 0, 2 or 3 is refused with the values it takes, before the
    inputs are looked at (a CPU tensor would otherwise fail first, for another reason)."""
    from specdiag.kernels.gluon_ws_swap import split_kv_gluon_swap
    from specdiag.kernels.mla import VerifyShape, make_inputs

    x = make_inputs(VerifyShape(256, 2, 1, "contiguous"), device="cpu", seed=0)
    with pytest.raises(ValueError, match="fit_stages must be 0 .* 2 or 3; got 4"):
        split_kv_gluon_swap(x, x.out_like(), fit_rows=True, fit_stages=4)


@pytest.mark.skipif(not HAS_TRITON, reason="triton is not installed here")
def test_ragged_swap_kernel_compiles_with_sglangs_index_dtypes() -> None:
    """The plugin's rows-as-N form on SGLang's ragged layout (gluon_ws_ragged with swap) for sm_90: 68 wgmmas of N 16
    or 8 per tile with int32 and int64 qo_indptr, the dense form's shared memory; only run 42's ragged arm runs it
    (ragged_gwap_p1 keeps the row-major form its rows were measured with)."""
    import collections
    import re

    from specdiag.kernels.dispatch import runs_gluon_swap
    from specdiag.kernels.gluon_ws_ragged import compile_sm90 as compile_ragged
    from specdiag.kernels.gluon_ws_swap import compile_sm90 as compile_dense

    for rn, qo in ((16, "i32"), (16, "i64"), (8, "i32")):
        k = compile_ragged(qo_indptr=qo, kv_indptr=qo, swap_rn=rn)
        got = collections.Counter(re.findall(r"wgmma\.mma_async\.sync\.aligned\.(m\d+n\d+k\d+)", k.asm["ptx"]))
        assert got == {f"m64n{rn}k16": 68}, got
        assert abs(k.metadata.shared - compile_dense(rn=rn).metadata.shared) <= 64
    assert [runs_gluon_swap(KERNEL_VARIANTS["ragged_gwsw_p1"], r) for r in (8, 16, 17)] == [True, True, False]
    assert not runs_gluon_swap(KERNEL_VARIANTS["ragged_gwap_p1"], 8)


def test_read_only_kernel_plans_the_picks_splits() -> None:
    """expected_tiles: the pick's plan (one row tile per 64 rows, the splits of plan_splits), every token of the case
    in exactly one program's tiles, the last split running to the end."""
    from specdiag.kernels.gluon_ws_read import expected_tiles, read_plan
    from specdiag.kernels.mla import BLOCK_TOKENS, VerifyShape, make_inputs

    for shape in (VerifyShape(3001, 8, 1, "shuffled_p1"), VerifyShape(20000, 16, 8, "shuffled_p1"),
                  VerifyShape(100, 8, 8, "contiguous")):
        x = make_inputs(shape, seed=1)
        plan = read_plan(x, num_sms=132)
        tiles = expected_tiles(x, num_sms=132)
        assert len(tiles) == plan.n_tiles * plan.n_splits and plan.n_tiles == -(-shape.rows // 64)
        per_split = [tiles[s * plan.n_tiles] for s in range(plan.n_splits)]
        assert all(tiles[s * plan.n_tiles + m] == per_split[s] for s in range(plan.n_splits)
                   for m in range(plan.n_tiles))
        # every token in some tile, and at most one partly filled tile per split
        assert BLOCK_TOKENS * sum(per_split) >= x.n_kv
        assert sum(per_split) <= x.n_kv // BLOCK_TOKENS + plan.n_splits


def test_read_only_kernel_checks_its_inputs_before_any_launch() -> None:
    """read_kv_ws refuses CPU inputs with the dense Gluon launchers' message (gluon_splitkv.check_gluon_inputs): the
    check is reached on the CPU, so a name the module fails to import shows here, not on the device (session 15's
    call 1 met a NameError there, left since session 11's review moved the check)."""
    from specdiag.kernels.gluon_ws_read import read_kv_ws, read_plan
    from specdiag.kernels.mla import VerifyShape, make_inputs

    x = make_inputs(VerifyShape(3001, 8, 1, "shuffled_p1"), seed=1)
    sink = torch.zeros(read_plan(x, num_sms=132).programs, 128, dtype=torch.int32)
    with pytest.raises(ValueError, match="read_kv_ws runs on CUDA"):
        read_kv_ws(x, sink, num_sms=132)
    with pytest.raises(ValueError, match="read_kv_ws runs on CUDA"):
        read_kv_ws(x, sink, num_sms=132, round_tokens=1)
