"""GPU tests of the Triton verify kernels (run on the device machine: pytest -m gpu)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from specdiag.kernels.harness import GridSpec, check_once, measure_peaks, run_grid
from specdiag.kernels.mla import VerifyShape, make_inputs
from specdiag.kernels.reference import reference_verify
from specdiag.runs import Run

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

SHAPES = [
    VerifyShape(4096, 8, 8, "shuffled_p1"),
    VerifyShape(3000, 16, 1, "contiguous"),       # context not a multiple of 64
    VerifyShape(5000, 3, 64, "shuffled_b64"),    # two baseline query blocks, rows not a tile multiple
    VerifyShape(20000, 128, 8, "shuffled_b64"),   # many row tiles
    VerifyShape(777, 8, 16, "contiguous"),
]


def _check_arms_twice(shape: VerifyShape, names: tuple[str, ...]) -> None:
    """Each kernel variant of ``names`` on ``shape``: correct (rel. error <= 1e-2 vs fp32) and every row written, on
    two calls in a row (state left by the first call, e.g. counters or a scratch, would show on the second)."""
    inputs = make_inputs(shape, device="cuda", seed=shape.context_tokens)
    ref = reference_verify(inputs)
    for name in names:
        for attempt in range(2):
            res = check_once(name, inputs, ref, None, tol=1e-2)
            assert res["unwritten"] == 0 and res["rel_err"] <= 1e-2, f"{name} call {attempt}: {res}"


def _check_timed_calls_twice(shape: VerifyShape, names: tuple[str, ...], seed: int) -> None:
    """Each variant of ``names`` by the call the harness times (dispatch.prepared_call: what can be made once is made
    there, e.g. the ragged arms' SGLang layout), on fresh inputs: correct and every row written, twice in a row."""
    from specdiag.kernels.dispatch import prepared_call

    inputs = make_inputs(shape, device="cuda", seed=seed)
    ref = reference_verify(inputs)
    for name in names:
        out = inputs.out_like()
        call = prepared_call(name, inputs, out)
        for _ in range(2):
            out.fill_(float("nan"))
            call()
            torch.cuda.synchronize()
            assert not out.isnan().any() and (out.float() - ref).norm() / ref.norm() <= 1e-2, name


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"P{s.context_tokens}-H{s.heads}-T{s.draft_tokens}-{s.layout}")
def test_triton_kernels_match_reference(shape: VerifyShape) -> None:
    inputs = make_inputs(shape, device="cuda", seed=shape.context_tokens)
    ref = reference_verify(inputs)
    names = ["baseline_p1", "split_p1"] + (["split_b64"] if inputs.block_table is not None else [])
    for name in names:
        res = check_once(name, inputs, ref, None, tol=1e-2)
        assert res["unwritten"] == 0, f"{name}: {res['unwritten']} outputs never written"
        assert res["rel_err"] <= 1e-2, f"{name}: relative error {res['rel_err']:.3g}"


@pytest.mark.slow
def test_every_tuning_candidate_is_correct_or_refuses() -> None:
    """Each launch configuration the tuner may pick computes the same function (or fails to compile)."""
    from specdiag.kernels.tuning import candidate_configs

    for shape in (VerifyShape(9000, 8, 1, "shuffled_b64"), VerifyShape(9000, 8, 8, "shuffled_b64"),
                  VerifyShape(9000, 16, 64, "shuffled_b64")):
        inputs = make_inputs(shape, device="cuda", seed=11)
        ref = reference_verify(inputs)
        for cfg in candidate_configs(shape.rows):
            for name in ("split_p1", "split_b64"):
                try:
                    res = check_once(name, inputs, ref, cfg, tol=1e-2)
                except Exception as exc:  # noqa: BLE001 - out-of-resources configs are allowed to refuse
                    assert "resource" in repr(exc).lower() or "shared memory" in repr(exc).lower(), repr(exc)
                    continue
                assert res["correct"], f"{name} {cfg}: {res}"


def test_harness_grid_on_cuda(tmp_path) -> None:
    run = Run.create(tmp_path / "run")
    peaks = measure_peaks(torch.device("cuda"))
    assert peaks["copy_gbps"] > 100 and peaks["matmul_tflops"] > 10
    spec = GridSpec(contexts=[2048, 8192], heads=[8], draft_tokens=[8], layouts=["shuffled_b64"], n_runs=20,
                    rotate_bytes=50 * 10**6, required=[])
    n = run_grid(spec, run, peaks, "cuda")
    rows = run.rows("kernel_ab")
    assert n == len(rows) == 6
    for row in rows:
        assert row["error"] is None and row["correct"] and row["impl"] == "triton", row
        assert row["n_runs"] == 20 and row["ms_median"] > 0 and row["n_rotation_sets"] >= 2


@pytest.mark.parametrize("shape", SHAPES + [VerifyShape(131072, 8, 1, "shuffled_b64")],
                         ids=lambda s: f"P{s.context_tokens}-H{s.heads}-T{s.draft_tokens}-{s.layout}")
def test_fused_kernels_match_reference_and_repeat(shape: VerifyShape) -> None:
    """Issue 13's single-launch kernel (bf16 and fp8 KV): correct, every row written, and again on a second call
    (the arrival counters were reset by the merging programs); 128k h8 T1 exercises the two-level merge."""
    from specdiag.kernels.mla import dequantized, with_fp8_cache  # noqa: PLC0415

    inputs = make_inputs(shape, device="cuda", seed=shape.context_tokens)
    ref = reference_verify(inputs)
    q8 = with_fp8_cache(inputs)
    ref8 = reference_verify(dequantized(q8))
    pages = ["p1"] + (["b64"] if inputs.block_table is not None else [])
    for page in pages:
        arms = [(f"fused_{page}", inputs, ref), (f"fused_fp8_{page}", q8, ref8)]
        if page == "p1":  # run 5: the self-merge at every tile size (64-row tiles: "auto" merges in a second launch)
            arms.append(("fused_self_p1", inputs, ref))
        for name, x, r in arms:
            for attempt in range(2):
                res = check_once(name, x, r, None, tol=1e-2)
                assert res["unwritten"] == 0 and res["rel_err"] <= 1e-2, f"{name} call {attempt}: {res}"


@pytest.mark.parametrize("shape", [VerifyShape(4096, 8, 8, "shuffled_p1"), VerifyShape(3001, 5, 8, "contiguous"),
                                   VerifyShape(20000, 16, 8, "shuffled_b64"), VerifyShape(131072, 8, 8, "shuffled_p1")],
                         ids=lambda s: f"tile64-P{s.context_tokens}-H{s.heads}-T{s.draft_tokens}-{s.layout}")
def test_run6_tile64_arms_match_reference(shape: VerifyShape) -> None:
    """Run 6's arms (split_p1 with 32-token tiles and 5 stages at 64-row tiles, and the same with the scores once per
    tile): correct and every row written, twice. What the interpreter cannot check: the three buffers and async_wait 4,
    and qk_once's inline bar.sync / ld.relaxed.cta ordering of the scratch (a race would show as a wrong result)."""
    _check_arms_twice(shape, ("split_n32s5_p1", "split_qk1_p1"))


@pytest.mark.parametrize("shape", [VerifyShape(4096, 8, 8, "shuffled_p1"), VerifyShape(3001, 5, 8, "contiguous"),
                                   VerifyShape(20000, 16, 1, "shuffled_b64"), VerifyShape(131072, 8, 1, "shuffled_p1")],
                         ids=lambda s: f"run7-P{s.context_tokens}-H{s.heads}-T{s.draft_tokens}-{s.layout}")
def test_run7_arms_match_reference(shape: VerifyShape) -> None:
    """Run 7's arms: the merge as a programmatic dependent launch (its griddepcontrol.wait must see every partial: a
    merge that ran early would read stale partials, a wrong result), and h8T8-like rows in 32- and 16-row tiles;
    correct and every row written, twice."""
    _check_arms_twice(shape, ("split_pdl_p1", "split_m32_p1", "split_m16_p1"))


def test_run7_anatomy_measures_every_part() -> None:
    """The fixed-cost anatomy on one small case: every part timed, the full calls correct, the profiler's kernels."""
    from specdiag.kernels.anatomy import PARTS, measure_case

    rows = measure_case(VerifyShape(20000, 8, 1, "shuffled_p1"), torch.device("cuda"), n_runs=5,
                        rotate_bytes=256 << 20, profile_runs=5)
    assert [r["part"] for r in rows] == list(PARTS)
    for r in rows[:-1]:
        assert r["error"] is None and r["us_median"] > 0, r
    tl = rows[-1]
    assert tl["error"] is None and tl["tl_programs"] == tl["grid"][0] * tl["grid"][1], tl
    assert 0 < tl["tl_dur_p50_us"] <= tl["tl_dur_max_us"] <= tl["tl_span_us"] < 1e4
    full = next(r for r in rows if r["part"] == "full")
    assert full["correct"] and "prof_error" not in full, full
    assert full["prof_calls"] == 5 and full["prof_partial_us"] > 0 and full["prof_merge_us"] > 0


@pytest.mark.parametrize("shape", [VerifyShape(20000, 16, 16, "shuffled_p1"), VerifyShape(5000, 128, 8, "shuffled_b64"),
                                   VerifyShape(3001, 16, 64, "contiguous")],
                         ids=lambda s: f"run8-P{s.context_tokens}-H{s.heads}-T{s.draft_tokens}-{s.layout}")
def test_run8_compute_arms_match_reference(shape: VerifyShape) -> None:
    """Run 8's arms on compute-bound shapes (several 64-row tiles): 32-token tiles with 5 stages, and the same with the
    scores once per tile (qk_once's inline bar.sync ordering, now with several row tiles per split); twice each."""
    _check_arms_twice(shape, ("split_n32c_p1", "split_qk1c_p1"))


def test_profile_kernels_sees_both_launches_of_a_split_call() -> None:
    """The anatomy's kernel-by-kernel profile (used on anchors) on our own two-launch call: two kernels per call."""
    from specdiag.kernels.anatomy import profile_kernels
    from specdiag.kernels.dispatch import run_variant

    x = make_inputs(VerifyShape(20000, 8, 1, "shuffled_p1"), device="cuda", seed=1)
    out = x.out_like()
    prof = profile_kernels([lambda: run_variant("split_p1", x, out)], 5, torch.device("cuda"))
    assert prof["prof_kernels_per_call"] == 2, prof
    assert {k["per_call"] for k in prof["prof_kernels"]} == {1}
    assert 0 < prof["prof_busy_us"] <= prof["prof_span_us"] < 1e4


GLUON_SHAPES = [VerifyShape(4096, 8, 8, "shuffled_p1"), VerifyShape(3001, 5, 8, "contiguous"),
                VerifyShape(777, 8, 16, "contiguous"), VerifyShape(20000, 16, 16, "shuffled_p1"),
                VerifyShape(5000, 128, 8, "shuffled_b64"), VerifyShape(20000, 8, 1, "shuffled_p1"),
                VerifyShape(131072, 8, 8, "shuffled_p1")]


@pytest.mark.parametrize("shape", GLUON_SHAPES,
                         ids=lambda s: f"run10-P{s.context_tokens}-H{s.heads}-T{s.draft_tokens}-{s.layout}")
def test_run10_gluon_kernel_matches_reference(shape: VerifyShape) -> None:
    """The Gluon partial kernel (both tiles, both waits for P V, the early copy): tree masks, partial row tiles,
    several row tiles, a prefix that is not a multiple of the KV tile, one draft token; correct and every row written,
    twice (a missing barrier between the cp.async ring, the two warpgroups' halves of P and the tensor cores' reads
    would show as a wrong result)."""
    _check_arms_twice(shape, ("split_glo_p1", "split_glo32_p1", "split_glw_p1", "split_glw32_p1", "split_auto_p1",
                              "split_glx_p1"))


@pytest.mark.parametrize("shape", GLUON_SHAPES + [VerifyShape(100, 8, 8, "contiguous")],
                         ids=lambda s: f"run15-P{s.context_tokens}-H{s.heads}-T{s.draft_tokens}-{s.layout}")
def test_run15_warp_specialized_kernel_matches_reference(shape: VerifyShape) -> None:
    """The warp-specialized Gluon kernel (runs 15-16: prefetched token-table rows, the intra-warpgroup overlap,
    32-token tiles) on the run-10 shapes, and one whose split holds two tiles (100 tokens: the
    copy partition's refill branch never taken): a wrong mbarrier phase shows as a hang (the gate's timeout) or a wrong
    result, a missing fence as a wrong result; correct and every row written, twice."""
    _check_arms_twice(shape, ("split_gws_p1", "split_gwp_p1", "split_gwo_p1", "split_gwp32_p1", "split_gwo32_p1",
                              "split_auto_ws_p1", "split_gwm_p1", "split_gwf_p1", "split_auto_gwf_p1",
                              "split_gwb_p1", "split_gwbp_p1", "split_gwf64_p1", "split_gwf128_p1",
                              "split_gwg_p1", "split_auto_gwf64_p1", "split_auto_gwg_p1", "split_gwf1_p1",
                              "split_auto_gwf1_p1"))


@pytest.mark.parametrize("shape", [VerifyShape(131072, 8, 1, "shuffled_p1"), VerifyShape(131072, 8, 8, "shuffled_p1"),
                                   VerifyShape(20000, 16, 64, "shuffled_p1"), VerifyShape(3001, 5, 8, "contiguous"),
                                   VerifyShape(200000, 2, 3, "shuffled_p1")],
                         ids=lambda s: f"run28-P{s.context_tokens}-H{s.heads}-T{s.draft_tokens}-{s.layout}")
def test_run28_one_pass_merge_matches_reference(shape: VerifyShape) -> None:
    """The merge kernel in one pass (every split of its outputs at once) after split_p1's partials and the Gluon
    kernel's, at split counts from a few to ~130 (one row tile over 132 SMs), partial row tiles, a tree mask."""
    _check_arms_twice(shape, ("split_m1_p1", "split_gwf1_p1", "split_auto_gwf1_p1", "split_auto_gwfm_p1"))


@pytest.mark.parametrize("shape", [VerifyShape(131072, 8, 8, "shuffled_p1"), VerifyShape(3001, 5, 8, "contiguous"),
                                   VerifyShape(20000, 16, 64, "shuffled_p1"), VerifyShape(65536, 8, 1, "shuffled_p1"),
                                   VerifyShape(200, 16, 16, "shuffled_p1")],
                         ids=lambda s: f"run32-P{s.context_tokens}-H{s.heads}-T{s.draft_tokens}-{s.layout}")
def test_run32_plugins_gluon_arm_matches_reference(shape: VerifyShape) -> None:
    """ragged_gw_p1 (the plugin's serving since run 32: the Gluon kernel on the ragged layout from 33 rows, the Triton
    ragged kernel below), by run_variant and by the call the harness times, twice each; 40 rows (a partial row tile)
    and a context shorter than two splits' minimum."""
    _check_arms_twice(shape, ("ragged_gw_p1",))
    _check_timed_calls_twice(shape, ("ragged_gw_p1",), seed=shape.context_tokens + 2)


@pytest.mark.parametrize("shape", [VerifyShape(131072, 8, 1, "shuffled_p1"), VerifyShape(131072, 8, 8, "shuffled_p1"),
                                   VerifyShape(65536, 16, 1, "shuffled_p1"), VerifyShape(20000, 16, 64, "shuffled_p1"),
                                   VerifyShape(3001, 5, 8, "contiguous"), VerifyShape(200000, 2, 3, "shuffled_p1")],
                         ids=lambda s: f"run30-P{s.context_tokens}-H{s.heads}-T{s.draft_tokens}-{s.layout}")
def test_run30_joined_tail_and_ragged_arms_match_reference(shape: VerifyShape) -> None:
    """The arms that join a tail split to the one before it (both kernels: 257 -> 256 splits at 128k h8T1, 129 -> 128
    at h8T8) and the plugin's ragged kernel in both merge forms, each by run_variant (the check) and by the call the
    harness times (dispatch.prepared_call: the ragged layout made once), twice."""
    names = ("split_auto_gwfmj_p1", "split_auto_gwfmj1_p1", "ragged_p1", "ragged2_p1")
    _check_arms_twice(shape, names)
    _check_timed_calls_twice(shape, names, seed=shape.context_tokens + 1)


@pytest.mark.parametrize("shape", [VerifyShape(131072, 8, 4, "shuffled_p1"), VerifyShape(20000, 4, 8, "shuffled_p1"),
                                   VerifyShape(3001, 8, 3, "contiguous"), VerifyShape(65536, 16, 2, "shuffled_p1"),
                                   VerifyShape(200, 8, 1, "shuffled_p1")],
                         ids=lambda s: f"run33-P{s.context_tokens}-H{s.heads}-T{s.draft_tokens}-{s.layout}")
def test_run33_gluon_kernels_below_33_rows_match_reference(shape: VerifyShape) -> None:  # + split_gwrpq_p1
    """The Gluon kernels at 8-32 rows, where the pick and the plugin served Triton until runs 33-35 measured them:
    most of the 64-row tile empty, a tree mask, a context shorter than one split's minimum; by run_variant and by the
    call the harness times, twice each."""
    names = ("split_gwfm_p1", "ragged_gwa_p1", "split_gwr_p1", "split_gwrp_p1", "split_gwrb_p1", "split_gwr32_p1",
             "ragged_gwap_p1", "split_gwrpq_p1", "split_gwrpqr_p1")
    _check_arms_twice(shape, names)
    _check_timed_calls_twice(shape, names, seed=shape.context_tokens + 3)


@pytest.mark.parametrize("shape", [VerifyShape(131072, 8, 8, "shuffled_p1"), VerifyShape(9000, 3, 100, "contiguous"),
                                   VerifyShape(20000, 16, 64, "shuffled_p1"), VerifyShape(100, 8, 8, "shuffled_p1")],
                         ids=lambda s: f"earlyq-P{s.context_tokens}-H{s.heads}-T{s.draft_tokens}-{s.layout}")
def test_early_q_matches_reference_from_64_rows_and_times_its_phases(shape: VerifyShape) -> None:
    """split_gwrpq_p1 where every row of the Q tile is real and where there are several row tiles (300, 1,024 rows):
    by run_variant and by the timed call, twice each; and its timed form (ws_phases) correct with warpgroup 0's
    stamps in order (Q's load now inside warpgroup 0: its start comes before Q is in shared memory)."""
    from specdiag.kernels.gluon_ws import phase_buffer, split_kv_gluon_ws

    _check_arms_twice(shape, ("split_gwrpq_p1", "split_gwrpqr_p1"))
    _check_timed_calls_twice(shape, ("split_gwrpq_p1", "split_gwrpqr_p1"), seed=shape.context_tokens + 5)
    x = make_inputs(shape, device="cuda", seed=5)
    out, times = x.out_like(), phase_buffer(x)
    split_kv_gluon_ws(x, out, prefetch=True, draft_branch=True, fold=True, early_q=True, times=times)
    ref = reference_verify(x)
    assert (out.float() - ref).norm() / ref.norm() <= 1e-2
    stamps = np.median(times.cpu().numpy()[:, 0, 8:13], axis=-1)
    assert (np.diff(stamps, axis=1) >= 0).all()


@pytest.mark.parametrize("shape", [VerifyShape(131072, 8, 1, "shuffled_p1"), VerifyShape(65536, 16, 1, "shuffled_p1"),
                                   VerifyShape(20000, 4, 4, "shuffled_p1"), VerifyShape(3001, 8, 2, "contiguous"),
                                   VerifyShape(200, 8, 1, "shuffled_p1"), VerifyShape(100, 5, 3, "shuffled_p1"),
                                   VerifyShape(5000, 5, 1, "contiguous"), VerifyShape(4096, 8, 8, "shuffled_p1")],
                         ids=lambda s: f"swap-P{s.context_tokens}-H{s.heads}-T{s.draft_tokens}-{s.layout}")
def test_swap_kernel_matches_reference(shape: VerifyShape) -> None:
    """split_gwsw_p1 and split_gwsw8_p1 (gluon_ws_swap up to 16 rows, the second with an N of 8 up to 8 rows): 8 and 16
    rows at long contexts, a tree mask on 2-4 draft tokens,
    a context shorter than a split's minimum, 15 rows (a padded column), and 64 rows (the pick's call instead); by
    run_variant and by the timed call, twice each."""
    _check_arms_twice(shape, ("split_gwsw_p1", "split_gwsw8_p1"))
    _check_timed_calls_twice(shape, ("split_gwsw_p1", "split_gwsw8_p1"), seed=shape.context_tokens + 7)


@pytest.mark.parametrize("shape", [VerifyShape(131072, 8, 1, "shuffled_p1"), VerifyShape(65536, 16, 1, "shuffled_p1"),
                                   VerifyShape(20000, 4, 2, "shuffled_p1"), VerifyShape(200, 8, 1, "shuffled_p1"),
                                   VerifyShape(100, 5, 3, "shuffled_p1"), VerifyShape(5000, 7, 1, "contiguous")],
                         ids=lambda s: f"s12-P{s.context_tokens}-H{s.heads}-T{s.draft_tokens}-{s.layout}")
def test_session12_swap_arms_match_reference_and_time_their_phases(shape: VerifyShape) -> None:
    """Session 12's rows-as-N arms: three ring buffers beside an 8-row Q (split_gwsw8s3_p1; 16 rows keep two), the
    rows' sums reduced once after the loop (split_gwsw8l_p1), both, and each warp's keys a softmax of their own
    (split_gwsw8w_p1); 8 and 16 rows at long contexts, a tree mask on
    two draft tokens, a context shorter than a split's minimum, 15 rows and 7 rows (padded columns); by run_variant and
    by the timed call, twice each. Then the timed rows-as-N kernel (ws_phases): the same output, every program's
    phases within its loop, warpgroup 0's stamps in order."""
    from functools import partial

    from specdiag.kernels.gluon_ws import PHASES, phase_buffer
    from specdiag.kernels.gluon_ws_swap import split_kv_gluon_swap
    from specdiag.kernels.gluon_ws_swap_alt import split_kv_gluon_swap_alt
    from specdiag.kernels.ws_phases import phase_cycles

    arms = ("split_gwsw8s3_p1", "split_gwsw8l_p1", "split_gwsw8s3l_p1", "split_gwsw8w_p1")
    _check_arms_twice(shape, arms)
    _check_timed_calls_twice(shape, arms, seed=shape.context_tokens + 11)
    x = make_inputs(shape, device="cuda", seed=11)
    ref = reference_verify(x)
    warp = partial(split_kv_gluon_swap_alt, form="warp_softmax")
    for launcher, kw in ((split_kv_gluon_swap, dict(fit_rows=True, fit_stages=3)),
                         (split_kv_gluon_swap, dict(fit_rows=False, late_sum=True)),
                         (warp, dict(fit_rows=True)), (warp, dict(fit_rows=False))):
        out, times = x.out_like(), phase_buffer(x)
        launcher(x, out, times=times, **kw)
        assert (out.float() - ref).norm() / ref.norm() <= 1e-2, kw
        t = times.cpu().numpy()
        ran = np.median(t[:, 0, 7], axis=-1) > 0  # programs with tiles (a short context leaves some without)
        assert ran.any() and (t[ran][:, :, 6] > 0).all()
        for row in phase_cycles(t, PHASES):
            assert 0 < row["phases_sum_cycles"] <= row["loop_cycles"] * 1.001, (kw, row)
        stamps = np.median(t[ran, 0, 8:13], axis=-1)
        assert (np.diff(stamps, axis=1) >= 0).all() and (stamps[:, 0] > 0).all(), kw


#: session 12's later arms' shapes: 8 and 16 rows at long contexts, a tree mask on two draft tokens, a context shorter
#: than a split's minimum (programs without a tile), 15 rows (a padded column)
SESSION12_SHAPES = [VerifyShape(131072, 8, 1, "shuffled_p1"), VerifyShape(65536, 16, 1, "shuffled_p1"),
                    VerifyShape(20000, 4, 2, "shuffled_p1"), VerifyShape(200, 8, 1, "shuffled_p1"),
                    VerifyShape(100, 5, 3, "shuffled_p1")]


@pytest.mark.parametrize("shape", SESSION12_SHAPES,
                         ids=lambda s: f"s12p-P{s.context_tokens}-H{s.heads}-T{s.draft_tokens}-{s.layout}")
def test_session12_producer_arms_match_reference(shape: VerifyShape) -> None:
    """The rows-as-N kernel with its copies in a third partition (split_gwsw8p_p1; split_gwsw8ps3_p1 with three ring
    buffers at up to 8 rows): 8 and 16 rows at long contexts, a tree mask on two draft tokens, a context shorter than a
    split's minimum (programs without a tile: the copying partition's loop does not run), 15 rows; by run_variant and
    by the timed call, twice each (a buffer released twice or never would hang or show on the second call)."""
    arms = ("split_gwsw8p_p1", "split_gwsw8ps3_p1")
    _check_arms_twice(shape, arms)
    _check_timed_calls_twice(shape, arms, seed=shape.context_tokens + 13)


@pytest.mark.parametrize("shape", SESSION12_SHAPES,
                         ids=lambda s: f"s12l1-P{s.context_tokens}-H{s.heads}-T{s.draft_tokens}-{s.layout}")
def test_session12_l1_share_arms_match_reference(shape: VerifyShape) -> None:
    """Run 46's arm with 32 KB of unused shared memory kept live (split_gwsw8pad_p1); 8 and 16 rows, a tree mask, a
    short context, 15 rows; by run_variant and by the timed call, twice each."""
    arms = ("split_gwsw8pad_p1",)
    _check_arms_twice(shape, arms)
    _check_timed_calls_twice(shape, arms, seed=shape.context_tokens + 17)


def test_session12_ws_phases_times_the_rows_as_n_kernel() -> None:
    """ws_phases on a rows-as-N arm at 8 and 16 rows: the rows say which kernel ran (``kernel_form``), carry both
    warpgroups' phases within their loops and the profiler's partial and merge kernels; at 64 rows the same arm runs
    the row-major kernel and says so."""
    from specdiag.kernels.ws_phases import measure_case

    for shape, form in ((VerifyShape(65536, 8, 1, "shuffled_p1"), "rows_as_n"),
                        (VerifyShape(65536, 16, 1, "shuffled_p1"), "rows_as_n"),
                        (VerifyShape(4096, 8, 8, "shuffled_p1"), "row_major")):
        rows = measure_case(shape, "split_gwsw8s3_p1", torch.device("cuda"), n_runs=3)
        assert [r["partition"] for r in rows] == ["softmax_wg", "copy_pv_wg"]
        for r in rows:
            assert r["error"] is None and r["kernel_form"] == form
            assert 0 < r["phases_sum_cycles"] <= r["loop_cycles"] * 1.001
            assert 0 < r["prof_merge_us"] < r["prof_partial_us"]
        assert 0 < rows[0]["tl_first_p50_us"] < rows[0]["tl_span_us"]


@pytest.mark.parametrize("shape", [VerifyShape(4096, 8, 8, "shuffled_p1"), VerifyShape(131072, 8, 8, "shuffled_p1"),
                                   VerifyShape(20000, 7, 64, "shuffled_p1"), VerifyShape(9000, 3, 100, "contiguous"),
                                   VerifyShape(131072, 16, 64, "shuffled_p1")],
                         ids=lambda s: f"run25-P{s.context_tokens}-H{s.heads}-T{s.draft_tokens}-{s.layout}")
def test_run25_grid_merge_is_correct_and_leaves_its_counters_at_zero(shape: VerifyShape) -> None:
    """The merge inside the grid (split_gwg_p1): the co-resident plan (7 row tiles: 18 splits, 126 programs, where
    plan_splits would launch 133 and the cooperative launch would refuse), a row count that leaves the last slice
    short (300 rows), many splits (131,072 tokens: 128) and many row tiles; correct on five calls in a row, every row
    written, and both counters back at 0 after each call (a program that missed the reset would hang the next call:
    the gate's timeout)."""
    from specdiag.kernels.gluon_ws import split_kv_gluon_ws
    from specdiag.kernels.splitkv_plan import gluon_config, plan_splits_coresident
    from specdiag.kernels.triton_splitkv import sm_count

    x = make_inputs(shape, device="cuda", seed=shape.context_tokens)
    ref = reference_verify(x)
    plan = plan_splits_coresident(shape.rows, shape.n_kv, gluon_config(64, 2), sm_count(0))
    assert plan.programs <= sm_count(0)
    for _ in range(5):
        out = torch.full_like(x.out_like(), float("nan"))
        split_kv_gluon_ws(x, out, prefetch=True, draft_branch=True, fold=True, grid_merge=True)
        torch.cuda.synchronize()
        assert not out.isnan().any()
        assert (out.float() - ref).norm() / ref.norm() <= 1e-2
        assert x.grid_sync.tolist() == [0, 0]


def test_run25_grid_merge_gives_up_a_wait_that_cannot_end() -> None:
    """The grid merge's safety net: with the arrival counter started below zero no wait can end, so each program gives
    up after GRID_MERGE_MAX_POLLS polls (seconds, not a hung GPU) and leaves its slice unwritten; the departures still
    put both counters back to 0, and the next call is correct."""
    from specdiag.kernels.gluon_ws import split_kv_gluon_ws

    x = make_inputs(VerifyShape(4096, 8, 8, "shuffled_p1"), device="cuda", seed=5)
    ref = reference_verify(x)
    x.grid_sync[0] = -1_000_000
    out = torch.full_like(x.out_like(), float("nan"))
    split_kv_gluon_ws(x, out, prefetch=True, draft_branch=True, fold=True, grid_merge=True)
    torch.cuda.synchronize()
    assert out.isnan().all() and x.grid_sync.tolist() == [0, 0]
    split_kv_gluon_ws(x, out, prefetch=True, draft_branch=True, fold=True, grid_merge=True)
    assert (out.float() - ref).norm() / ref.norm() <= 1e-2


@pytest.mark.parametrize("shape", [VerifyShape(4096, 8, 8, "shuffled_p1"), VerifyShape(20000, 16, 16, "shuffled_p1")],
                         ids=lambda s: f"run18-P{s.context_tokens}-H{s.heads}-T{s.draft_tokens}")
def test_run18_timed_kernel_writes_its_phases_and_stays_correct(shape: VerifyShape) -> None:
    """The timed warp-specialized kernel (ws_phases): the same output as untimed, every program's slots written, and
    each partition's phases summing to no more than its loop (the clock reads bracket disjoint spans)."""
    from specdiag.kernels.gluon_ws import PHASES, phase_buffer, split_kv_gluon_ws
    from specdiag.kernels.ws_phases import phase_cycles

    x = make_inputs(shape, device="cuda", seed=3)
    ref = reference_verify(x)
    out = x.out_like()
    times = phase_buffer(x)
    split_kv_gluon_ws(x, out, prefetch=True, times=times)
    assert (out.float() - ref).norm() / ref.norm() <= 1e-2
    t = times.cpu().numpy()
    assert (t[:, :, 7] > 0).all() and (t[:, :, 6] > 0).all()  # tiles and loop cycles in every program, both partitions
    for row in phase_cycles(t, PHASES):
        assert 0 < row["phases_sum_cycles"] <= row["loop_cycles"] * 1.001, row
    # warpgroup 0's timeline (TIMELINE_SLOTS): in order in every program, on the SMs of the grid
    stamps = np.median(t[:, 0, 8:13], axis=-1)
    assert (np.diff(stamps, axis=1) >= 0).all() and (stamps[:, 0] > 0).all()
    assert (stamps[:, -1] - stamps[:, 0]).max() < 1e7  # each program done within 10 ms of its entry


def test_run18_ws_phases_rows_carry_phases_and_the_calls_kernels() -> None:
    """ws_phases' rows for one case: both warpgroups, the phases summing within the loop, and the profiler's partial
    kernel, gap and merge kernel of the untimed call (the partial kernel the longest part of it)."""
    from specdiag.kernels.ws_phases import measure_case

    rows = measure_case(VerifyShape(20000, 16, 16, "shuffled_p1"), "split_gwf_p1", torch.device("cuda"), n_runs=3)
    assert [r["partition"] for r in rows] == ["softmax_wg", "copy_pv_wg"]
    for r in rows:
        assert 0 < r["phases_sum_cycles"] <= r["loop_cycles"] * 1.001 and r["error"] is None
        assert 0 < r["prof_merge_us"] < r["prof_partial_us"] < r["untimed_us"] * 1.5 and r["prof_calls"] == 10
    tl = rows[0]  # warpgroup 0's timeline of the timed call, on its row only
    assert "tl_span_us" not in rows[1]
    assert 0 < tl["tl_q_p50_us"] < tl["tl_first_p50_us"] < tl["tl_span_us"] <= tl["timed_us"] * 1.2
    assert tl["tl_stream_p50_us"] > 0 and tl["tl_epilogue_p50_us"] > 0 and tl["tl_programs"] > 0
    # the pick (split_gwrp_p1): its own merge in the profile (by rows, under PDL: the gap may be negative)
    pick = measure_case(VerifyShape(65536, 8, 1, "shuffled_p1"), "split_gwrp_p1", torch.device("cuda"), n_runs=3)
    assert pick[0]["error"] is None and 0 < pick[0]["prof_merge_us"] < pick[0]["prof_partial_us"]


@pytest.mark.parametrize("shape", [VerifyShape(131072, 8, 1, "shuffled_p1"), VerifyShape(3001, 16, 8, "contiguous"),
                                   VerifyShape(20000, 16, 64, "shuffled_p1"), VerifyShape(100, 8, 8, "shuffled_p1")],
                         ids=lambda s: f"ws-read-P{s.context_tokens}-H{s.heads}-T{s.draft_tokens}-{s.layout}")
def test_ws_read_kernel_streams_every_tile_of_the_picks_plan(shape: VerifyShape) -> None:
    """gluon_ws_read on the H200: every program of the pick's grid waits for exactly the tiles its split holds
    (several row tiles, a split shorter than the ring, one row tile), twice in a row (the ring's barrier phases)."""
    from specdiag.kernels.gluon_ws_read import expected_tiles, read_kv_ws, read_sink

    x = make_inputs(shape, device="cuda", seed=3)
    for _ in range(2):
        sink = read_sink(x)
        read_kv_ws(x, sink)
        torch.cuda.synchronize()
        assert sink[:, 0].tolist() == expected_tiles(x) and bool((sink == sink[:, :1]).all())


def test_anatomy_ws_parts_time_the_pick_and_its_read_floor() -> None:
    """anatomy.measure_ws on a small case: both parts measured, the read kernel's tiles as planned, the pick correct."""
    from specdiag.kernels.anatomy import WS_PARTS, measure_ws

    rows = measure_ws(VerifyShape(65536, 8, 1, "shuffled_p1"), torch.device("cuda"), n_runs=3,
                      rotate_bytes=1 << 28)
    assert [r["part"] for r in rows] == [*WS_PARTS, "timeline_ws"]
    for r in rows[:-1]:
        assert r["error"] is None and r["correct"] and r["us_median"] > 0, r
    tl = rows[-1]
    assert tl["error"] is None and tl["tl_programs"] == rows[0]["n_splits"] and tl["tl_sms"] >= tl["tl_programs"] - 4
    raw = tl["tl_raw"]
    assert all(a <= f <= e <= d for a, f, e, d in zip(raw["start_us"], raw["first_tile_us"], raw["loop_end_us"],
                                                       raw["done_us"])), raw
    assert 0 < tl["tl_first_p50_us"] < tl["tl_span_us"] and tl["tl_span_us"] < rows[0]["us_median"] + 5


def test_anatomy_ws_read_rings_stream_every_tile_of_their_plans() -> None:
    """The read-only kernel with other rings (--ws-read-shapes): each ring's row after the pick's two, every program's
    tile count as its own plan says (a 32-token ring plans other splits than the pick's 64-token one)."""
    from specdiag.kernels.anatomy import measure_ws

    rows = measure_ws(VerifyShape(65536, 8, 8, "shuffled_p1"), torch.device("cuda"), n_runs=3, rotate_bytes=1 << 28,
                      read_rings=[(64, 3), (32, 6), (16, 12), (64, 2)])
    assert [r["part"] for r in rows] == ["read_ws", "pick_ws", "read_ws_64x3", "read_ws_32x6", "read_ws_16x12",
                                         "timeline_ws"]
    rows = rows[:-1]
    for r in rows:
        assert r["error"] is None and r["correct"] and r["us_median"] > 0, r
    assert [(r["block_n"], r["stages"]) for r in rows if r["part"] != "pick_ws"] == [(64, 2), (64, 3), (32, 6), (16, 12)]


#: session 13's fp8 rows-as-N shapes: 8 and 16 rows at long contexts, a tree mask on two draft tokens, a context
#: shorter than a split's minimum (programs without a tile), 15 rows and 7 rows (padded columns)
FP8_SHAPES = [VerifyShape(131072, 8, 1, "shuffled_p1"), VerifyShape(65536, 16, 1, "shuffled_p1"),
              VerifyShape(20000, 4, 2, "shuffled_p1"), VerifyShape(200, 8, 1, "shuffled_p1"),
              VerifyShape(100, 5, 3, "shuffled_p1"), VerifyShape(5000, 7, 1, "contiguous")]


@pytest.mark.parametrize("shape", FP8_SHAPES, ids=lambda s: f"fp8-P{s.context_tokens}-H{s.heads}-T{s.draft_tokens}-{s.layout}")
def test_fp8_rows_as_n_kernel_matches_reference(shape: VerifyShape) -> None:
    """gluon_ws_fp8 (the pick's rows-as-N kernel on the fp8 cache): against the fp32 reference of the dequantized
    cache within the bf16 kernels' 1e-2 and against the bf16 cache's within FP8_TOL, every row written, by run_variant
    and by the timed call, twice each; every ring that fits the rows by the launcher itself, on fresh inputs."""
    from specdiag.kernels.cases import FP8_TOL
    from specdiag.kernels.dispatch import prepared_call
    from specdiag.kernels.gluon_ws_fp8 import CONVERSIONS, FP8_RINGS, split_kv_gluon_fp8
    from specdiag.kernels.mla import dequantized, with_fp8_cache

    x = make_inputs(shape, device="cuda", seed=shape.context_tokens + 19)
    ref16 = reference_verify(x)
    x8 = with_fp8_cache(x)
    ref8 = reference_verify(dequantized(x8))
    for name in ("split_gwsw8_fp8_p1", "split_gwsw8_fp8r13_p1", "split_gwsw8_fp8d_p1", "split_gwsw8_fp8d2_p1",
                 "split_gwsw8_fp8i_p1", "split_gwsw8_fp8di_p1", "split_gwsw8_fp8w_p1", "split_gwsw8_fp8dw_p1",
                 "split_gwsw8_fp8p_p1"):
        for attempt in range(2):
            res = check_once(name, x8, ref8, None, tol=1e-2)
            assert res["unwritten"] == 0 and res["rel_err"] <= 1e-2, f"{name} call {attempt}: {res}"
            vs16 = check_once(name, x8, ref16, None, tol=FP8_TOL)
            assert vs16["correct"], f"{name} vs the bf16 cache's reference: {vs16}"
        out = x.out_like()
        call = prepared_call(name, x8, out)
        for _ in range(2):
            out.fill_(float("nan"))
            call()
            torch.cuda.synchronize()
            assert not out.isnan().any() and (out.float() - ref8).norm() / ref8.norm() <= 1e-2, name
    rows = shape.heads * shape.draft_tokens
    for ring, spec in FP8_RINGS.items():
        if rows > spec.max_rows:  # its shared memory fits only a smaller N
            with pytest.raises(ValueError, match="fits sm_90's shared memory only"):
                split_kv_gluon_fp8(x8, x.out_like(), rings=ring)
            continue
        y8 = with_fp8_cache(make_inputs(shape, device="cuda", seed=shape.context_tokens + 23))
        r = reference_verify(dequantized(y8))
        outs = {}
        for conversion in CONVERSIONS:
            out = y8.out_like().fill_(float("nan"))
            split_kv_gluon_fp8(y8, out, rings=ring, conversion=conversion)
            assert not out.isnan().any() and (out.float() - r).norm() / r.norm() <= 1e-2, (ring, conversion)
            outs[conversion] = out
        assert torch.equal(outs["cvt"], outs["int"]), ring  # the two conversions give the same fp16 values
        if spec.max_rows < 16:  # the warp softmax's 12 KB do not fit beside these rings
            with pytest.raises(ValueError, match="warp softmax"):
                split_kv_gluon_fp8(y8, y8.out_like(), rings=ring, softmax="warp")
        elif spec.s8 == 0 and rows > 8:  # nor its accumulators in the direct form's registers at 16 rows
            with pytest.raises(ValueError, match="at most 8 rows"):
                split_kv_gluon_fp8(y8, y8.out_like(), rings=ring, softmax="warp")


def test_fp8_rows_as_n_kernel_refuses_more_rows_and_the_harness_says_so(tmp_path) -> None:
    """Past 16 rows the fp8 rows-as-N arm refuses before any launch, and the harness records a skipped row with the
    reason where the bf16 pick measures the case."""
    from specdiag.kernels.dispatch import run_variant
    from specdiag.kernels.mla import with_fp8_cache

    x8 = with_fp8_cache(make_inputs(VerifyShape(4096, 8, 8, "shuffled_p1"), device="cuda", seed=3))
    with pytest.raises(ValueError, match="holds up to 16 packed rows"):
        run_variant("split_gwsw8_fp8_p1", x8, x8.out_like())
    run = Run.create(tmp_path / "run", label="fp8 skip")
    spec = GridSpec(contexts=[4096], heads=[8], draft_tokens=[8], layouts=["shuffled_p1"], n_runs=3,
                    kernels=["split_gwsw8_p1", "split_gwsw8_fp8_p1"], chain=True)
    run_grid(spec, run, {"copy_gbps": 4000.0, "matmul_tflops": 700.0}, device="cuda")
    rows = {r["kernel"]: r for r in run.rows("kernel_ab")}
    assert rows["split_gwsw8_p1"]["correct"] and "holds up to 16" in rows["split_gwsw8_fp8_p1"]["skipped"]
    assert rows["split_gwsw8_fp8_p1"]["kv_dtype"] == "fp8_e4m3"


def test_fp8_ws_phases_time_both_forms() -> None:
    """ws_phases on the fp8 arms (staged and direct): both partitions' phases within their loops, the call timed."""
    from specdiag.kernels.ws_phases import measure_case

    for name in ("split_gwsw8_fp8_p1", "split_gwsw8_fp8di_p1", "split_gwsw8_fp8w_p1"):
        rows = measure_case(VerifyShape(65536, 16, 1, "shuffled_p1"), name, torch.device("cuda"), 3)
        assert [r["partition"] for r in rows] == ["softmax_wg", "convert_wg"], name
        for r in rows:
            assert r["kernel_form"] == "rows_as_n_fp8" and 0 < r["phases_sum_cycles"] <= r["loop_cycles"] * 1.001, r


#: session 15's equal-token splits (split_round_tokens 1): one and eight draft tokens at long contexts (132 splits
#: where a 64-token round gives 129), a tree mask, contexts shorter than a split's minimum, rows of odd counts
EQUAL_SPLIT_SHAPES = [VerifyShape(131072, 8, 1, "shuffled_p1"), VerifyShape(262144, 16, 1, "shuffled_p1"),
                      VerifyShape(131072, 8, 8, "shuffled_p1"), VerifyShape(20000, 4, 2, "shuffled_p1"),
                      VerifyShape(200, 8, 1, "shuffled_p1"), VerifyShape(3001, 5, 8, "contiguous"),
                      VerifyShape(9001, 16, 8, "shuffled_p1")]


@pytest.mark.parametrize("shape", EQUAL_SPLIT_SHAPES,
                         ids=lambda s: f"equal-P{s.context_tokens}-H{s.heads}-T{s.draft_tokens}-{s.layout}")
def test_equal_token_split_arms_match_reference(shape: VerifyShape) -> None:
    """The pick and the plugin's kernels with the KV cut into equal shares of tokens (splits that start and end inside
    a 64-token tile): bf16 arms against fp32 by run_variant and by the harness's call, twice each; the fp8 arm against
    the dequantized cache's fp32 reference."""
    from specdiag.kernels.dispatch import prepared_call
    from specdiag.kernels.mla import dequantized, with_fp8_cache

    names = ("split_gwsw8t_p1", "ragged_gwsw_t_p1")
    _check_arms_twice(shape, names)
    _check_timed_calls_twice(shape, names, seed=shape.context_tokens + 5)
    x = with_fp8_cache(make_inputs(shape, device="cuda", seed=shape.context_tokens + 6))
    ref = reference_verify(dequantized(x))
    out = x.out_like()
    call = prepared_call("ragged_gwsw_fp8t_p1", x, out)
    for _ in range(2):
        out.fill_(float("nan"))
        call()
        torch.cuda.synchronize()
        assert not out.isnan().any() and (out.float() - ref).norm() / ref.norm() < 4e-3, shape


def test_equal_token_splits_in_a_ragged_batch() -> None:
    """A batch of requests of other lengths (the splits cut per request on the device, ROUND 1): the bf16 and fp8
    Gluon ragged kernels against SGLang's definition / the exact fp8 reference, at 8, 16 and 64 rows."""
    from dataclasses import replace

    from test_sglang_plugin import fp8_batch, make_batch, rel_err, sglang_reference
    from test_sglang_plugin_gpu import to_cuda, with_draft_in_cache

    from specdiag.kernels.gluon_ws_ragged import (ragged_gluon_config, ragged_split_kv_gluon_fp8,
                                                  ragged_split_kv_gluon_ws)
    from specdiag_sglang_plugin.translate import fp8_reference

    for lens, draft, heads in [([5, 40000, 64, 129], 1, 8), ([3000, 50000, 700], 2, 8), ([60000, 333], 8, 8)]:
        cfg = replace(ragged_gluon_config(draft * heads), pdl=True, split_round_tokens=1)
        batch, _ = make_batch(lens, draft, heads, False, seed=sum(lens) % 71)
        g, loc = with_draft_in_cache(to_cuda(batch))
        out = torch.full((g.q.shape[0], heads, 512), float("nan"), dtype=g.q.dtype, device="cuda")
        ragged_split_kv_gluon_ws(g.q, g.kv_buffer, out, g.qo_indptr, g.kv_indptr, g.kv_indices, loc, g.custom_mask,
                                 g.mask_indptr, max_draft=draft, sm_scale=g.sm_scale, cfg=cfg)
        assert not out.isnan().any() and rel_err(out.cpu(), sglang_reference(batch)) < 1e-2, (lens, draft)
        b8, loc8, _ = fp8_batch(lens, draft, heads, False, 0.5, seed=sum(lens) % 73)
        g8, loc8 = to_cuda(b8), loc8.cuda()
        out8 = torch.full((g8.q.shape[0], heads, 512), float("nan"), dtype=torch.bfloat16, device="cuda")
        ragged_split_kv_gluon_fp8(g8.q, g8.kv_buffer, out8, g8.qo_indptr, g8.kv_indptr, g8.kv_indices, loc8,
                                  g8.custom_mask, g8.mask_indptr, max_draft=draft, sm_scale=g8.sm_scale, kv_scale=0.5,
                                  cfg=cfg)
        assert not out8.isnan().any() and rel_err(out8, fp8_reference(g8, loc8, 0.5)) < 4e-3, (lens, draft)


def test_read_floor_with_equal_token_splits_streams_every_tile_of_its_plan() -> None:
    """anatomy --ws-read-shapes 64x2t1: the read-only kernel with the pick's ring, its splits equal shares of tokens
    (132 programs at 128k, against 129 with 64-token splits), every program's tile count as its own plan says."""
    from specdiag.kernels.anatomy import measure_ws

    rows = measure_ws(VerifyShape(131072, 8, 1, "shuffled_p1"), torch.device("cuda"), n_runs=3, rotate_bytes=1 << 28,
                      read_rings=[(64, 2, 1)])
    assert [r["part"] for r in rows] == ["read_ws", "pick_ws", "read_ws_64x2t1", "timeline_ws"]
    for r in rows[:-1]:
        assert r["error"] is None and r["correct"] and r["us_median"] > 0, r
    assert rows[0]["n_splits"] < rows[2]["n_splits"] and rows[2]["round_tokens"] == 1
