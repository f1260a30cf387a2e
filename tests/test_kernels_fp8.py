"""Session 13 on the CPU: the pick's rows-as-N kernel on the fp8 cache (gluon_ws_fp8). Triton's interpreter does not
run Gluon, so here: each form compiles for sm_90 with the shared memory, tensor-core instructions, conversions and
registers its design says; bad calls are refused before any launch; the integer conversion's algorithm gives torch's
float8_e4m3fn values for every byte; the harness, the A/B tables and the phase tables read fp8 rows. Correctness and
times on the GPU: tests/test_kernels_gpu.py (fp8), docs/kernel-notes.md runs 47-51.
"""

from __future__ import annotations

import collections
import importlib.util
import re
import subprocess
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from specdiag.kernels import analysis
from specdiag.kernels.dispatch import KERNEL_VARIANTS, gluon_fp8_kwargs, resolve_config, unsupported_shape
from specdiag.kernels.splitkv_plan import SHARED_LIMIT_SM90

HAS_TRITON = importlib.util.find_spec("triton") is not None
needs_triton = pytest.mark.skipif(not HAS_TRITON, reason="triton is not installed here")
FP8_ARMS = sorted(k for k, v in KERNEL_VARIANTS.items() if v.kv_fp8 and v.impl == "gluon_ws")


def _ptxas_spill_bytes(ptx: str) -> int:
    from triton.backends.nvidia.compiler import get_ptxas

    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "k.ptx"
        src.write_text(ptx)
        res = subprocess.run([get_ptxas(90).path, "-v", "-arch=sm_90a", str(src), "-o", str(Path(tmp) / "k.cubin")],
                             capture_output=True, text=True)
    assert res.returncode == 0, res.stderr[-2000:]
    spills = [int(m) for m in re.findall(r"(\d+) bytes spill stores", res.stderr + res.stdout)]
    assert spills, res.stderr[-2000:]
    return max(spills)


@needs_triton
@pytest.mark.parametrize("rn, rings, conversion, softmax, max_spill", [
    (8, "s22", "cvt", "rows", 0), (16, "s13", "cvt", "rows", 0), (16, "d2", "cvt", "rows", 0),
    (8, "d2", "int", "rows", 0), (16, "s13", "cvt", "warp", 64), (8, "d2", "cvt", "warp", 0),
])
def test_fp8_kernel_compiles_for_sm90_as_designed(rn: int, rings: str, conversion: str, softmax: str,
                                                  max_spill: int) -> None:
    """Shared memory under sm_90's limit and as ``smem_bytes`` counts it (Triton adds a few hundred bytes); 68 fp16
    wgmmas a tile with the rows as N (scores 36, P V 16 per warpgroup); 144 conversions per thread of each converting
    warpgroup (one in the staged form, two in the direct form), by the conversion's own instruction; no cp.async in
    the direct form; the partitions' register split; no spill (the warp softmax's 16-row staged form: a few words)."""
    from specdiag.kernels.gluon_ws_fp8 import FP8_RINGS, compile_sm90, partition_regs, smem_bytes

    ring = FP8_RINGS[rings]
    k = compile_sm90(rn, rings, conversion=conversion, softmax=softmax)
    shared = k.metadata.shared
    extra = (12 * 1024 if rn == 16 else 6 * 1024) if softmax == "warp" else 0
    assert shared <= SHARED_LIMIT_SM90 and 0 <= shared - smem_bytes(rn, ring) - extra < 1024, shared
    ptx = k.asm["ptx"]
    assert collections.Counter(re.findall(r"wgmma\.mma_async\.sync\.aligned\.(m\d+n\d+k\d+\.f32\.f16\.f16)", ptx)) == {
        f"m64n{rn}k16.f32.f16.f16": 68}
    converting = 1 if ring.s8 else 2
    op = r"cvt\.rn\.f16x2\.e4m3x2" if conversion == "cvt" else r"prmt\.b32"
    assert len(re.findall(op, ptx)) == 144 * converting
    assert (ptx.count("cp.async.cg") > 0) == (ring.s8 > 0)
    pv, conv = partition_regs(ring, softmax, rn)
    regs = [int(n) for n in re.findall(r"setmaxnreg\.\w+\.sync\.aligned\.u32 \t?(\d+)", ptx)]
    assert pv in regs and conv in regs
    assert _ptxas_spill_bytes(ptx) <= max_spill


def test_fp8_row_tiles_start_at_a_draft_token_or_stay_inside_one() -> None:
    """Up to 32 rows one tile; above, whole draft tokens' rows (8 heads: 32, 5 heads: 30), or with more heads than 32
    the largest divisor of the heads (40: 20, 128: 32), so every tile's first row is a draft token's first row or
    every row of the tile belongs to one draft token; bad counts are refused."""
    from specdiag.kernels.gluon_ws_ragged import FP8_TILE_MAX_ROWS, fp8_tile_rows

    assert FP8_TILE_MAX_ROWS == 32
    assert [fp8_tile_rows(h, r) for h, r in ((8, 8), (8, 32), (8, 64), (16, 1024), (5, 40), (40, 40), (128, 256),
                                             (7, 49))] == [8, 32, 32, 32, 30, 20, 32, 28]
    for heads in range(1, 130):
        for draft in (1, 2, 3, 8):
            rows = heads * draft
            tr = fp8_tile_rows(heads, rows)
            assert 1 <= tr <= 32
            for row0 in range(0, rows, tr):
                same_token = row0 // heads == (min(row0 + tr, rows) - 1) // heads
                assert rows <= 32 or row0 % heads == 0 or same_token, (heads, draft, row0)
    with pytest.raises(ValueError, match="positive"):
        fp8_tile_rows(0, 8)


@needs_triton
@pytest.mark.parametrize("rows, ring, max_spill", [(32, "s13", 0), (64, "d2", 80)])
def test_ragged_fp8_kernel_at_an_n_of_32(rows: int, ring: str, max_spill: int) -> None:
    """Above 16 rows the fp8 ragged kernel's tiles are 32 rows (68 m64n32k16 fp16 wgmmas a tile) in either ring of
    ``FP8_N32_RINGS``, within sm_90's shared memory: s13 without spills, d2 with at most 80 B (76 at its best split)."""
    from specdiag.kernels.gluon_ws_ragged import FP8_N32_RINGS, compile_sm90

    assert set(FP8_N32_RINGS) == {"d2", "s13"}
    k = compile_sm90(qo_indptr="i64", kv_indptr="i32", fp8_rows=rows, fp8_rings=ring)
    assert k.metadata.shared <= SHARED_LIMIT_SM90
    ptx = k.asm["ptx"]
    wgmma = r"wgmma\.mma_async\.sync\.aligned\.(m\d+n\d+k\d+\.f32\.f16\.f16)"
    assert collections.Counter(re.findall(wgmma, ptx)) == {"m64n32k16.f32.f16.f16": 68}
    assert (ptx.count("cp.async.cg") > 0) == (ring == "s13")
    regs = [int(n) for n in re.findall(r"setmaxnreg\.\w+\.sync\.aligned\.u32 \t?(\d+)", ptx)]
    assert set(FP8_N32_RINGS[ring]) <= set(regs)
    assert _ptxas_spill_bytes(ptx) <= max_spill


@needs_triton
@pytest.mark.parametrize("rows, qo, max_spill", [(8, "i32", 0), (8, "i64", 0), (16, "i32", 8), (16, "i64", 8), (5, "i64", 0)])
def test_ragged_fp8_kernel_compiles_for_sm90_as_the_dense_fp8_pick(rows: int, qo: str, max_spill: int) -> None:
    """The plugin's fp8 kernel (gluon_ws_ragged ``_fp8_ragged_partial_kernel``: SGLang's ragged layout, lengths read on
    the device) with the index dtypes SGLang passes: the dense fp8 pick's ring for the rows (s22 at N 8, d2 at N 16),
    its 68 fp16 wgmmas, conversions and copies, shared memory within 64 B of the dense kernel's, more 64-bit index
    loads (the prefix's and the draft tokens' tables). ptxas spills 8 B at N 16 (the dense kernel none), as the bf16
    ragged kernel spills 32 B beside its dense one: the request's offsets kept live."""
    from specdiag.kernels.gluon_ws_fp8 import DEFAULT_RINGS, compile_sm90 as dense_sm90
    from specdiag.kernels.gluon_ws_ragged import compile_sm90

    rn = 8 if rows <= 8 else 16
    k, dense = compile_sm90(qo_indptr=qo, kv_indptr=qo, fp8_rows=rows), dense_sm90(rn, DEFAULT_RINGS[rn])
    assert abs(k.metadata.shared - dense.metadata.shared) <= 64 and k.metadata.shared <= SHARED_LIMIT_SM90
    ptx, dptx = k.asm["ptx"], dense.asm["ptx"]
    wgmma = r"wgmma\.mma_async\.sync\.aligned\.(m\d+n\d+k\d+\.f32\.f16\.f16)"
    assert collections.Counter(re.findall(wgmma, ptx)) == {f"m64n{rn}k16.f32.f16.f16": 68}
    for op in (r"cvt\.rn\.f16x2\.e4m3x2", r"cp\.async\.cg", r"setmaxnreg"):
        assert len(re.findall(op, ptx)) == len(re.findall(op, dptx)), op
    b64 = r"ld\.global(?:\.[a-z0-9]+)*\.b64"
    assert len(re.findall(b64, ptx)) > len(re.findall(b64, dptx))
    assert _ptxas_spill_bytes(ptx) <= max_spill


def test_ragged_fp8_launcher_refuses_bad_calls_before_any_launch() -> None:
    """A bf16 cache, fp16 q, a ring that does not hold the call's row tile, a scale past fp16's range, too few draft
    slots: refused with the fix, before any allocation or launch (CPU tensors: a launch would fail otherwise); off
    sm_90 the plugin's check says why the fp8 kernel cannot run."""
    pytest.importorskip("triton.experimental.gluon")
    from specdiag.kernels.gluon_ws_ragged import gluon_fp8_ragged_supported, ragged_split_kv_gluon_fp8

    def call(heads=8, draft=1, qd=torch.bfloat16, kvd=torch.float8_e4m3fn, scale=1.0, loc_n=None, rings=None):
        tokens = draft
        q = torch.zeros(tokens, heads, 576, dtype=qd)
        kv = torch.zeros(100, 1, 576, dtype=torch.uint8).view(kvd) if kvd == torch.float8_e4m3fn else \
            torch.zeros(100, 1, 576, dtype=kvd)
        o = torch.zeros(tokens, heads, 512, dtype=qd)
        i32 = torch.tensor([0, tokens], dtype=torch.int32)
        loc = torch.arange(tokens if loc_n is None else loc_n)
        ragged_split_kv_gluon_fp8(q, kv, o, i32, torch.tensor([0, 50], dtype=torch.int32), torch.arange(50), loc,
                                  torch.ones(tokens * (50 + tokens), dtype=torch.bool), torch.tensor([0, 0]),
                                  max_draft=draft, sm_scale=0.1, kv_scale=scale, num_sms=4, rings=rings)

    for kw, match in ((dict(kvd=torch.bfloat16), "float8_e4m3fn cache"), (dict(qd=torch.float16), "bf16"),
                      (dict(draft=2, rings="s22"), "only at an N of 8"), (dict(scale=200.0), "kv_scale must be in"),
                      (dict(draft=4, rings="d3"), "an N of 32 runs the rings"),
                      (dict(loc_n=0), "a cache slot per query token")):
        with pytest.raises(ValueError, match=match):
            call(**kw)
    ok, why = gluon_fp8_ragged_supported(torch.zeros(1, 8, 576, dtype=torch.bfloat16),
                                         torch.zeros(4, 576, dtype=torch.uint8).view(torch.float8_e4m3fn), 8)
    assert not ok and why == "not a CUDA device"


def test_the_plugins_fp8_arm_is_the_ragged_fp8_kernel_with_the_plugins_merge() -> None:
    """``ragged_gwsw_fp8_p1``: the fp8 cache at every row count, the plugin's ragged Gluon config with the PDL merge;
    ``ragged_gwsw_fp8w13_p1`` the same with the staged s13 ring at its 32-row tiles; their bf16 twin in 06's fp8 table
    is the plugin's bf16 kernel (``ragged_gwsw_p1``)."""
    pytest.importorskip("triton.experimental.gluon")
    from specdiag.kernels.gluon_ws_ragged import ragged_gluon_config

    v = KERNEL_VARIANTS["ragged_gwsw_fp8_p1"]
    assert v.kv_fp8 and v.design == "ragged_split_kv" and "ragged_gwsw_fp8_p1" in FP8_ARMS
    assert resolve_config("ragged_gwsw_fp8_p1", 16) == ragged_gluon_config(16)
    for rows in (17, 64, 1024):  # row tiles of 32 above 32 rows: any count
        assert unsupported_shape("ragged_gwsw_fp8_p1", rows) is None
    assert KERNEL_VARIANTS["ragged_gwsw_fp8w13_p1"].gluon_fp8_wide_ring == "s13"
    for arm in ("ragged_gwsw_fp8_p1", "ragged_gwsw_fp8w13_p1"):
        assert analysis.bf16_twin(arm) == "ragged_gwsw_p1"


def test_rings_and_refusals_are_decided_before_any_launch() -> None:
    """N 8 up to 8 rows, 16 above; the default rings are the fastest measured (s22, d2); rows past 16, an unknown
    ring, a ring that does not fit the rows' N, the warp softmax beside the 8-row rings or in the direct form at 16
    rows are refused with a message that names the fix."""
    from specdiag.kernels.gluon_ws_fp8 import DEFAULT_RINGS, FP8_RINGS, partition_regs, ring_for

    assert DEFAULT_RINGS == {8: "s22", 16: "d2"}
    assert ring_for(8, None) == (8, FP8_RINGS["s22"]) and ring_for(9, None) == (16, FP8_RINGS["d2"])
    assert ring_for(1, "s13") == (8, FP8_RINGS["s13"])
    for rows, rings, match in ((17, None, "1 to 16 packed rows"), (0, None, "1 to 16 packed rows"),
                               (8, "x9", "rings must be one of"), (16, "s22", "only at an N of 8"),
                               (12, "d3", "only at an N of 8")):
        with pytest.raises(ValueError, match=match):
            ring_for(rows, rings)
    with pytest.raises(ValueError, match="at most 8 rows"):
        partition_regs(FP8_RINGS["d2"], "warp", 16)


def test_fp8_launcher_refuses_the_cpu_and_a_missing_fp8_cache() -> None:
    pytest.importorskip("triton.experimental.gluon")
    from specdiag.kernels.gluon_ws_fp8 import split_kv_gluon_fp8
    from specdiag.kernels.mla import VerifyShape, make_inputs, with_fp8_cache

    x = make_inputs(VerifyShape(200, 8, 1, "shuffled_p1"))
    with pytest.raises(ValueError, match="CUDA"):
        split_kv_gluon_fp8(with_fp8_cache(x), x.out_like())


def _model_int_conversion(words: np.ndarray) -> np.ndarray:
    """The integer conversion of ``_e4m3x4_to_f16`` (CVT 1) in numpy, instruction for instruction: two prmt, a shift,
    the sign moved up a bit; returns the four fp16 values of each word times 256."""
    def prmt(x: np.ndarray, sel: int) -> np.ndarray:
        out = np.zeros_like(x)
        for i in range(4):
            s = (sel >> (4 * i)) & 0xF
            out |= (((x >> (8 * s)) & 0xFF) if s < 4 else 0) << (8 * i)
        return out

    halves = []
    for sel in (0x1404, 0x3424):
        a = prmt(words, sel) >> 1
        a = (a + (a & 0x40004000)) & 0xFFFFFFFF
        halves += [a & 0xFFFF, a >> 16]
    h = np.stack(halves, -1).astype(np.uint16).view(np.float16).astype(np.float32)
    return h * 256.0


def test_integer_conversion_gives_torchs_e4m3_values_for_every_byte() -> None:
    """Every e4m3 byte in every position of a word: the model of the asm (its selectors and masks are the ones in the
    kernel's asm string) equals torch's float8_e4m3fn -> float32; NaN bytes become +-480."""
    from specdiag.kernels import gluon_ws_fp8

    src = open(gluon_ws_fp8.__file__).read()
    for token in ("0x1404", "0x3424", "0x40004000", "shr.b32 a, a, 1", "add.u32 a, a, sa"):
        assert token in src, token
    b = np.arange(256, dtype=np.uint32)
    words = b | (b << 8) | ((255 - b) << 16) | (((b * 7) & 255) << 24)
    got = _model_int_conversion(words)
    byts = np.stack([words & 255, (words >> 8) & 255, (words >> 16) & 255, words >> 24], -1).astype(np.uint8)
    ref = torch.from_numpy(byts).view(torch.float8_e4m3fn).float().numpy()
    finite = np.isfinite(ref)
    assert finite.sum() == 4 * 254 and np.array_equal(got[finite], ref[finite])
    assert set(np.abs(got[~finite]).tolist()) == {480.0}


def test_fp16_pair_bits_hold_the_rounded_scale_in_both_halves() -> None:
    from specdiag.kernels.gluon_ws_fp8 import MAX_KV_SCALE, fp16_pair_bits

    assert fp16_pair_bits(1.0) == 0x3C003C00
    assert fp16_pair_bits(2.0) & 0xFFFF == 0x4000 and (fp16_pair_bits(2.0) >> 16) & 0xFFFF == 0x4000
    assert fp16_pair_bits(0.1) & 0xFFFF == int(torch.tensor(0.1, dtype=torch.float16).view(torch.int16))
    assert fp16_pair_bits(40000.0) == 0x78E278E2  # 40,000 rounds to 40,000 in fp16 (0x78E2)
    assert abs(MAX_KV_SCALE * 448.0 - 65504.0) < 1e-6
    for bad in (0.0, -1.0, 70000.0):
        with pytest.raises(ValueError, match="fp16 multiplier"):
            fp16_pair_bits(bad)


def test_fp8_arms_hold_up_to_16_rows_and_say_so_past_it() -> None:
    """The dense fp8 arms (gluon_ws_fp8) hold up to 16 rows; the plugin's (ragged) fp8 arms any count."""
    assert "split_gwsw8_fp8p_p1" in FP8_ARMS and len(FP8_ARMS) >= 8
    for name in FP8_ARMS:
        assert unsupported_shape(name, 16) is None
        if KERNEL_VARIANTS[name].design == "ragged_split_kv":
            assert unsupported_shape(name, 64) is None
        else:
            assert "holds up to 16 packed rows" in unsupported_shape(name, 64)
    assert unsupported_shape("split_gwsw8_p1", 64) is None and unsupported_shape("fused_fp8_p1", 64) is None
    v = KERNEL_VARIANTS["split_gwsw8_fp8p_p1"]
    assert gluon_fp8_kwargs(v, resolve_config("split_gwsw8_fp8p_p1", 8), 8)["rings"] == "s22"
    assert gluon_fp8_kwargs(v, resolve_config("split_gwsw8_fp8p_p1", 16), 16)["rings"] == "d2"


def test_harness_records_a_skipped_row_for_an_fp8_arm_past_16_rows_and_measures_it_below(tmp_path: Path) -> None:
    """On the CPU (the torch fallback of the design): at 8 x 1 the fp8 arm is measured on the fp8 cache and checked
    against both references; at 8 x 8 it gets a row saying why it did not run."""
    from specdiag.kernels.harness import GridSpec, run_grid
    from specdiag.runs import Run

    run = Run.create(tmp_path / "run", label="fp8 cpu")
    spec = GridSpec(contexts=[300], heads=[8], draft_tokens=[1, 8], layouts=["shuffled_p1"], n_runs=2, n_warmup=1,
                    kernels=["split_p1", "split_gwsw8_fp8p_p1"], chain=True, required=[])
    run_grid(spec, run, {"copy_gbps": 100.0, "matmul_tflops": 1.0}, device="cpu")
    rows = {(r["draft_tokens"], r["kernel"]): r for r in run.rows("kernel_ab")}
    fp8 = rows[(1, "split_gwsw8_fp8p_p1")]
    assert fp8["kv_dtype"] == "fp8_e4m3" and fp8["correct"] and fp8["rel_err_vs_bf16_ref"] < 0.1
    skipped = rows[(8, "split_gwsw8_fp8p_p1")]
    assert skipped["kv_dtype"] == "fp8_e4m3" and "holds up to 16 packed rows" in skipped["skipped"]
    assert rows[(8, "split_p1")]["correct"]


def _ab_rows() -> pd.DataFrame:
    base = {"heads": 8, "draft_tokens": 1, "layout": "shuffled_p1", "rel_err": 1.7e-3, "pct_copy_bw": 80.0,
            "actual_gbps": 1700.0}
    rows = []
    for ctx, pick_ms, fp8_ms, fused8_ms, fused_ms in ((131072, 0.048, 0.042, 0.167, 0.060),
                                                      (262144, 0.084, 0.090, 0.295, 0.099)):
        rows += [
            {**base, "context_tokens": ctx, "kernel": "split_gwsw8_p1", "kv_dtype": "bf16", "ms_median": pick_ms},
            {**base, "context_tokens": ctx, "kernel": "split_gwsw8_fp8p_p1", "kv_dtype": "fp8_e4m3",
             "ms_median": fp8_ms, "rel_err_vs_bf16_ref": 0.01},
            {**base, "context_tokens": ctx, "kernel": "fused_p1", "kv_dtype": "bf16", "ms_median": fused_ms},
            {**base, "context_tokens": ctx, "kernel": "fused_fp8_p1", "kv_dtype": "fp8_e4m3", "ms_median": fused8_ms,
             "rel_err_vs_bf16_ref": 0.011},
        ]
    rows.append({**base, "context_tokens": 131072, "heads": 8, "draft_tokens": 8, "kernel": "split_gwsw8_fp8p_p1",
                 "kv_dtype": "fp8_e4m3", "ms_median": float("nan"), "rel_err": float("nan"),
                 "rel_err_vs_bf16_ref": float("nan"), "skipped": "holds up to 16 packed rows"})
    return pd.DataFrame(rows)


def test_fp8_table_pairs_each_fp8_kernel_with_its_bf16_twin_and_the_finding_reads_the_numbers() -> None:
    assert analysis.bf16_twin("fused_fp8_b64") == "fused_b64"
    assert analysis.bf16_twin("split_gwsw8_fp8r13_p1") == "split_gwsw8_p1"
    assert analysis.bf16_twin("split_gwsw8_p1") == "split_gwsw8_p1"
    t = analysis.fp8_table(_ab_rows())
    assert len(t) == 4  # the skipped row left out
    got = {(r.context_tokens, r.kernel): (r.bf16_kernel, round(r.fp8_over_bf16_time, 3)) for r in t.itertuples()}
    assert got[(131072, "split_gwsw8_fp8p_p1")] == ("split_gwsw8_p1", round(0.042 / 0.048, 3))
    assert got[(262144, "fused_fp8_p1")] == ("fused_p1", round(0.295 / 0.099, 3))
    f = analysis.fp8_finding(t)
    assert f.numbers["cases"] == 2 and f.numbers["faster_cases"] == 1 and f.severity == "warning"
    assert abs(f.numbers["best_ratio_min"] - 0.042 / 0.048) < 1e-9
    assert abs(f.numbers["best_ratio_max"] - 0.090 / 0.084) < 1e-9
    assert "the bytes read do not set" in f.verdict and "1 of 2" in f.verdict
    fast = _ab_rows()
    fast.loc[fast["kernel"] == "split_gwsw8_fp8p_p1", "ms_median"] = [0.025, 0.045, float("nan")]
    f2 = analysis.fp8_finding(analysis.fp8_table(fast))
    assert f2.severity == "ok" and "the bytes read do not set" not in f2.verdict
    assert analysis.fp8_finding(pd.DataFrame()) is None


def test_phase_table_reads_the_fp8_kernels_converting_warpgroup() -> None:
    from specdiag.kernels.gluon_ws_fp8 import FP8_PHASES
    from specdiag.kernels.ws_phases_analysis import phase_table

    base = {"context_tokens": 131072, "heads": 8, "draft_tokens": 1, "kernel": "split_gwsw8_fp8_p1", "programs": 132,
            "tiles_per_program": 16.0, "ts_unix_s": 1.0, "untimed_us": 41.5, "timed_us": 43.7, "error": None}
    wg0 = dict(zip(FP8_PHASES["softmax_wg"], (386, 813, 1817, 69, 233, 402)))
    conv = dict(zip(FP8_PHASES["convert_wg"], (98, 151, 2191, 144, 834)))
    rows = [{**base, "partition": "softmax_wg", "loop_cycles": 3857, **{f"{k}_cycles": v for k, v in wg0.items()}},
            {**base, "partition": "convert_wg", "loop_cycles": 3830, **{f"{k}_cycles": v for k, v in conv.items()}}]
    t = phase_table(rows).set_index("partition")
    assert t.loc["convert_wg", "dominant_phase"] == "convert" and t.loc["softmax_wg", "dominant_phase"] == "softmax"
    assert abs(t.loc["convert_wg", "rest_cycles"] - (3830 - sum(conv.values()))) < 1e-9
    assert np.isnan(t.loc["softmax_wg", "convert_cycles"]) and np.isnan(t.loc["convert_wg", "scores_cycles"])


def test_fp8_wide_row_tiles_hold_64_rows_in_the_s12_ring() -> None:
    """Session 15: with the s12 ring (``FP8_N64_RINGS``) a call's row tiles hold up to 64 rows (8 x 8: one tile, so
    each KV tile is converted once), still whole draft tokens or a divisor of the heads; a call of 32 rows or fewer
    keeps its own tile's defaults; a 64-row tile without an N-64 ring, or a tile over 64 rows, is refused."""
    from specdiag.kernels.gluon_ws_ragged import (FP8_N64_RINGS, FP8_WIDE_TILE_MAX_ROWS, fp8_call_tiles,
                                                  fp8_ragged_launch, fp8_tile_rows)

    assert set(FP8_N64_RINGS) == {"s12"} and FP8_WIDE_TILE_MAX_ROWS == 64
    assert [fp8_call_tiles(h, r, "s12") for h, r in ((8, 64), (16, 128), (5, 40), (40, 80), (8, 32), (8, 8))] == [
        (64, "s12"), (64, "s12"), (40, "s12"), (40, "s12"), (32, None), (8, None)]
    assert fp8_call_tiles(8, 64) == (32, None) and fp8_call_tiles(8, 64, "s13") == (32, "s13")
    for heads in range(1, 130):
        for draft in (1, 2, 3, 8, 16):
            rows = heads * draft
            tr = fp8_tile_rows(heads, rows, 64)
            assert 1 <= tr <= 64
            for row0 in range(0, rows, tr):
                same_token = row0 // heads == (min(row0 + tr, rows) - 1) // heads
                assert rows <= 64 or row0 % heads == 0 or same_token, (heads, draft, row0)
    assert fp8_ragged_launch(64, "s12")[0] == 64 and fp8_ragged_launch(40, "s12")[2:] == FP8_N64_RINGS["s12"]
    for tile, rings in ((64, None), (64, "d2"), (65, "s12")):
        with pytest.raises(ValueError, match="a row tile holds at most 32 rows, or 64"):
            fp8_ragged_launch(tile, rings)
    with pytest.raises(ValueError, match="32 or 64 rows"):
        fp8_tile_rows(8, 64, 48)


@needs_triton
def test_ragged_fp8_kernel_at_an_n_of_64() -> None:
    """The 64-row tile: 68 m64n64k16 fp16 wgmmas a tile, the staged copies (cp.async), within sm_90's shared memory
    (230,752 B), warpgroup 1 and the converting warpgroup at FP8_N64_RINGS' registers; ptxas spills at most 768 B
    (752 B with int32 qo_indptr, 760 with int64: three warpgroups' accumulators and a 64-column softmax in 64K
    registers)."""
    from specdiag.kernels.gluon_ws_ragged import FP8_N64_RINGS, compile_sm90

    k = compile_sm90(qo_indptr="i64", kv_indptr="i32", fp8_rows=64, fp8_rings="s12")
    assert k.metadata.shared <= SHARED_LIMIT_SM90
    ptx = k.asm["ptx"]
    wgmma = r"wgmma\.mma_async\.sync\.aligned\.(m\d+n\d+k\d+\.f32\.f16\.f16)"
    assert collections.Counter(re.findall(wgmma, ptx)) == {"m64n64k16.f32.f16.f16": 68}
    assert ptx.count("cp.async.cg") > 0
    regs = [int(n) for n in re.findall(r"setmaxnreg\.\w+\.sync\.aligned\.u32 \t?(\d+)", ptx)]
    assert set(FP8_N64_RINGS["s12"]) <= set(regs)
    assert _ptxas_spill_bytes(ptx) <= 768


def test_the_fp8_rows_plan_fields_follow_their_row_tiles() -> None:
    """The harness's plan fields of the plugin's fp8 arm (cases.plan_fields -> describe_ragged_plan with the fp8
    kernel's tile rows): at 8 x 8 two 32-row tiles share the 132 programs (66 splits of 2,048 tokens at 128k, half
    the partial bytes of one 64-row tile's 129 splits of 1,024); the s12 arm's one 64-row tile plans as the bf16
    kernel. Rows recorded before session 15 (runs 55 and 57) carry the bf16 plan for the fp8 arms above 32 rows."""
    from specdiag.kernels.dispatch import resolve_config
    from specdiag.kernels.gluon_ws_ragged import fp8_call_tiles
    from specdiag.kernels.triton_splitkv_ragged import describe_ragged_plan

    cfg = resolve_config("ragged_gwsw_fp8_p1", 64)
    two = describe_ragged_plan(64, 131_080, cfg, 132, tile_rows=fp8_call_tiles(8, 64)[0])
    one = describe_ragged_plan(64, 131_080, cfg, 132, tile_rows=fp8_call_tiles(8, 64, "s12")[0])
    assert (two["n_tiles"], two["grid_splits"], two["n_splits"], two["tokens_per_split"]) == (2, 66, 65, 2048)
    assert (one["n_tiles"], one["grid_splits"], one["n_splits"], one["tokens_per_split"]) == (1, 132, 129, 1024)
    assert one == describe_ragged_plan(64, 131_080, cfg, 132) and two["programs"] == one["programs"] == 132
    assert two["partial_bytes"] * 2 == pytest.approx(one["partial_bytes"], rel=0.02)


def test_the_fp8_arms_name_their_wide_ring_above_16_rows_only() -> None:
    """dispatch.fp8_wide_ring: the one rule the harness's call and its plan fields share (an arm's wide ring names
    its 32- or 64-row tiles; up to 16 rows the fp8 pick's ring by the rows)."""
    from specdiag.kernels.dispatch import KERNEL_VARIANTS, fp8_wide_ring

    v12, v13, v = (KERNEL_VARIANTS[k] for k in ("ragged_gwsw_fp8w12_p1", "ragged_gwsw_fp8w13_p1", "ragged_gwsw_fp8_p1"))
    assert [fp8_wide_ring(v12, r) for r in (8, 16, 17, 64)] == [None, None, "s12", "s12"]
    assert fp8_wide_ring(v13, 32) == "s13" and fp8_wide_ring(v, 64) is None
