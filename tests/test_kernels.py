"""CPU tests of the kernel A/B: the math, the torch implementations, the harness and the replay."""

from __future__ import annotations

from dataclasses import replace

import math
import statistics

import pytest
import torch

from specdiag.kernels import analysis
from specdiag.kernels.dispatch import run_variant, supports
from specdiag.kernels.harness import (GridSpec, derived_metrics, relative_error, rotation_sets, run_grid,
                                      smoke_grid)
from specdiag.kernels.mla import (KV_ROW_BYTES, VerifyShape, arithmetic_intensity_flop_per_byte, kv_bytes,
                                  make_inputs, make_tables, ridge_rows, tree_mask, verify_flops)
from specdiag.kernels.reference import baseline_torch, reference_verify, split_kv_torch
from specdiag.kernels.splitkv_plan import SplitKVConfig, describe_plan, plan_splits
from specdiag.kernels.timing import summarize_ms, time_calls
from specdiag.paths import REFERENCE_DIR
from specdiag.runs import Run

H200_DIR = REFERENCE_DIR / "kernel-ab-h200"


def naive_verify(inputs) -> torch.Tensor:
    """Per query row, float64, no chunking, no tricks: the definition spelled out."""
    T, H = inputs.draft_tokens, inputs.heads
    kv = inputs.cache[inputs.token_table].double()
    out = torch.empty(T, H, 512, dtype=torch.float64)
    for t in range(T):
        visible = torch.ones(inputs.n_kv, dtype=torch.bool)
        visible[inputs.n_prefix:] = inputs.mask[t]
        for h in range(H):
            s = (kv @ inputs.q[t, h].double()) * inputs.sm_scale
            s[~visible] = -math.inf
            out[t, h] = torch.softmax(s, 0) @ kv[:, :512]
    return out


@pytest.mark.parametrize("layout", ["contiguous", "shuffled_p1", "shuffled_b64"])
def test_reference_matches_naive_definition(layout: str) -> None:
    x = make_inputs(VerifyShape(100, 3, 5, layout), seed=5)
    ref = reference_verify(x, max_score_elems=300)  # forces several row chunks
    assert torch.allclose(ref.double(), naive_verify(x), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("shape", [VerifyShape(130, 2, 7, "shuffled_b64"), VerifyShape(64, 1, 1, "contiguous"),
                                   VerifyShape(200, 3, 40, "shuffled_p1")])
def test_torch_designs_match_reference(shape: VerifyShape) -> None:
    x = make_inputs(shape, seed=shape.context_tokens)
    ref = reference_verify(x)
    for fn in (baseline_torch, lambda i, o: split_kv_torch(i, o, n_splits=3), lambda i, o: split_kv_torch(i, o, 50)):
        out = x.out_like()
        fn(x, out)
        assert not torch.isnan(out).any()
        assert relative_error(out, ref) < 1e-2


def test_the_draft_block_is_masked() -> None:
    """Changing a draft token's KV must not move the output of a draft token that cannot see it."""
    x = make_inputs(VerifyShape(50, 2, 6, "contiguous"), seed=9)
    a = reference_verify(x)
    hidden = [(i, j) for i in range(6) for j in range(6) if not x.mask[i, j]]
    assert hidden, "the random tree should hide something"
    i, j = hidden[0]
    x.cache[x.token_table[50 + j]] += 3.0
    b = reference_verify(x)
    assert torch.allclose(a[i], b[i])
    assert not torch.allclose(a[j], b[j])


def test_tree_mask_is_ancestor_closed() -> None:
    m = tree_mask(16, torch.Generator().manual_seed(1))
    assert m.diagonal().all() and not m.triu(1).any()
    for i in range(16):
        for j in range(16):
            if m[i, j]:
                assert (m[i] | ~m[j]).all(), "an ancestor's ancestors are ancestors"
    chain = tree_mask(5, torch.Generator(), chain=True)
    assert torch.equal(chain, torch.ones(5, 5, dtype=torch.bool).tril())


def test_layout_tables() -> None:
    gen = torch.Generator().manual_seed(0)
    tok, blk, pool = make_tables(200, "contiguous", gen)
    assert pool == 256 and torch.equal(tok, torch.arange(200)) and torch.equal(blk, torch.arange(4, dtype=torch.int32))
    tok, blk, pool = make_tables(200, "shuffled_b64", gen)
    assert torch.equal(tok, (blk.long()[:, None] * 64 + torch.arange(64)).reshape(-1)[:200])
    assert sorted(blk.tolist()) == list(range(4))
    tok, blk, pool = make_tables(200, "shuffled_p1", gen)
    assert blk is None and len(set(tok.tolist())) == 200 and int(tok.max()) < pool
    assert not torch.equal(tok, torch.arange(200))
    with pytest.raises(ValueError, match="layout"):
        make_tables(10, "paged", gen)


def test_counts_and_units() -> None:
    assert KV_ROW_BYTES == 1152
    assert kv_bytes(185_000) * 61 == 13_000_320_000  # kernels.md section 7: 13.0 GB per step
    assert verify_flops(8, 8, 1000) == 2 * 64 * 1000 * 1088
    assert arithmetic_intensity_flop_per_byte(16, 64) == pytest.approx(1.889 * 1024, rel=1e-3)
    assert ridge_rows(790, 4230) == pytest.approx(98.9, rel=1e-2)
    m = derived_metrics(131_080, 8, 8, ms=0.1, copy_gbps=4000, matmul_tflops=800)
    assert m["gbps"] == pytest.approx(131_080 * 1152 / 1e-4 / 1e9)
    assert m["pct_copy_bw"] == pytest.approx(100 * m["gbps"] / 4000)
    assert m["pct_of_floor"] <= 100 + 1e-9 or m["floor_ms"] > 0.1


def test_bad_shapes_are_refused_with_the_field_named() -> None:
    with pytest.raises(ValueError, match="heads"):
        VerifyShape(100, 0, 8)
    with pytest.raises(ValueError, match="layout"):
        VerifyShape(100, 8, 8, "random")
    x = make_inputs(VerifyShape(64, 1, 1, "shuffled_p1"))
    assert not supports("split_b64", x)
    with pytest.raises(ValueError, match="block table"):
        run_variant("split_b64", x, x.out_like())
    with pytest.raises(ValueError, match="unknown kernel"):
        run_variant("flash", x, x.out_like())


@pytest.mark.parametrize("rows,n_kv", [(8, 131_080), (64, 65_544), (8192, 262_208), (16, 8_193)])
def test_split_plan_covers_the_cache(rows: int, n_kv: int) -> None:
    for cfg in (SplitKVConfig(), SplitKVConfig(block_m=16, programs_per_sm=2.0), SplitKVConfig(dv_split=2),
                SplitKVConfig(split_round_tokens=1), SplitKVConfig(block_m=16, split_round_tokens=16)):
        plan = plan_splits(rows, n_kv, cfg, num_sms=132)
        assert plan.tokens_per_split % cfg.split_round_tokens == 0 and plan.tokens_per_split >= cfg.min_split_tokens
        assert (plan.n_splits - 1) * plan.tokens_per_split < n_kv <= plan.n_splits * plan.tokens_per_split
        d = describe_plan(rows, n_kv, cfg, 132)
        assert d["programs"] == plan.n_tiles * plan.n_splits * cfg.dv_split
        assert d["partial_bytes"] == (0 if plan.n_splits == 1 else plan.n_splits * rows * (512 * 4 + 4))


def test_equal_token_splits_fill_every_sm_where_64_token_splits_leave_some_idle() -> None:
    """Session 15: a 64-token round cuts 128k + 1 draft token into 129 splits of 1,024 (3 of 132 SMs idle, the rest
    3 % over an equal share), 256k into 129 of 2,048; a round of 1 gives 132 splits of 993 and 1,986, the last the
    shortest; the plan's splits still cover every token once, and the ragged plan cuts the same."""
    from specdiag.kernels.splitkv_plan import gluon_config, split_tokens
    from specdiag.kernels.triton_splitkv_ragged import describe_ragged_plan

    tile, equal = gluon_config(64, 2), replace(gluon_config(64, 2), split_round_tokens=1)
    for n_kv, (n64, t64), (n1, t1) in [(131_073, (129, 1024), (132, 993)), (262_145, (129, 2048), (132, 1986)),
                                       (65_537, (129, 512), (132, 497)), (131_080, (129, 1024), (132, 994))]:
        assert (plan_splits(8, n_kv, tile, 132).n_splits, plan_splits(8, n_kv, tile, 132).tokens_per_split) == (n64, t64)
        plan = plan_splits(8, n_kv, equal, 132)
        assert (plan.n_splits, plan.tokens_per_split) == (n1, t1)
        assert 0 < n_kv - (plan.n_splits - 1) * plan.tokens_per_split <= plan.tokens_per_split
        rag = describe_ragged_plan(8, n_kv, replace(equal, pdl=True), 132)
        assert (rag["n_splits"], rag["tokens_per_split"]) == (n1, t1)
    assert split_tokens(1_000, 132, equal) == equal.min_split_tokens  # short contexts keep the split's minimum
    with pytest.raises(ValueError, match="split_round_tokens must be a positive"):
        SplitKVConfig(split_round_tokens=0)


def test_block_table_kernels_refuse_splits_inside_a_page() -> None:
    """The page-table path reads a tile's slots as one page's (triton_splitkv, triton_fused): a split round that is
    not a multiple of 64 would start splits inside a page, so both refuse it before any launch, naming the fix."""
    from specdiag.kernels.triton_fused import fused_split_kv_triton
    from specdiag.kernels.triton_splitkv import split_kv_triton

    x = make_inputs(VerifyShape(300, 2, 2, "shuffled_b64"))
    cfg = replace(SplitKVConfig(block_n=64), split_round_tokens=16)
    for call in (split_kv_triton, fused_split_kv_triton):
        with pytest.raises(ValueError, match="multiple of 64"):
            call(x, x.out_like(), page_size=64, cfg=cfg)


def test_coresident_plan_holds_one_program_per_sm_and_covers_the_cache() -> None:
    """gluon_ws's grid merge waits for every program of its grid, so its plan must fit the SMs: plan_splits rounds
    the splits per row tile to the nearest integer (7 row tiles on 132 SMs: 19 splits, 133 programs)."""
    from specdiag.kernels.splitkv_plan import gluon_config, plan_splits_coresident

    cfg = gluon_config(64, 2)
    assert plan_splits(7 * 64, 131_072, cfg, 132).programs == 133  # the case the co-resident plan exists for
    for tiles in range(1, 20):
        for n_kv in (1_000, 65_544, 131_072, 262_208):
            plan = plan_splits_coresident(tiles * 64, n_kv, cfg, 132)
            assert plan.programs <= 132 and plan.tokens_per_split % 64 == 0
            assert (plan.n_splits - 1) * plan.tokens_per_split < n_kv <= plan.n_splits * plan.tokens_per_split
            if plan_splits(tiles * 64, n_kv, cfg, 132).programs <= 132:  # unchanged where it fits
                assert plan == plan_splits(tiles * 64, n_kv, cfg, 132)
    assert describe_plan(7 * 64, 131_072, cfg, 132, coresident=True)["programs"] == 126
    with pytest.raises(ValueError, match="two-launch merge"):
        plan_splits_coresident(200 * 64, 131_072, cfg, 132)


def test_timing_on_cpu_returns_samples() -> None:
    ms = time_calls([lambda: sum(range(1000))], n_runs=5, n_warmup=1, device="cpu")
    assert len(ms) == 5 and all(m > 0 for m in ms)
    s = summarize_ms([3.0, 1.0, 2.0])
    assert s["ms_median"] == 2.0 and s["n_runs"] == 3
    with pytest.raises(ValueError):
        time_calls([], device="cpu")


def test_rotation_sets_hold_fresh_data() -> None:
    x = make_inputs(VerifyShape(64, 1, 2, "shuffled_b64"))
    sets = rotation_sets(x, rotate_bytes=3 * x.cache.numel() * 2, seed=1)
    assert len(sets) == 3
    assert not torch.equal(sets[0].cache, sets[1].cache) and torch.equal(sets[0].token_table, sets[1].token_table)


def test_relative_error_flags_nan() -> None:
    ref = torch.ones(2, 2, 512)
    out = ref.clone().to(torch.bfloat16)
    out[0, 0, 0] = float("nan")
    assert relative_error(out, ref) == math.inf


def test_harness_grid_on_cpu(tmp_path) -> None:
    run = Run.create(tmp_path / "run")
    spec = GridSpec(contexts=[64, 256], heads=[2], draft_tokens=[3], layouts=["shuffled_b64", "shuffled_p1"],
                    n_runs=2, n_warmup=1, rotate_bytes=0, required=[], baseline_max_ms=1e9)
    peaks = {"copy_gbps": 100.0, "matmul_tflops": 1.0}
    n = run_grid(spec, run, peaks, "cpu")
    rows = run.rows("kernel_ab")
    assert n == len(rows) == 2 * 3 + 2 * 2
    for r in rows:
        assert r["error"] is None and r["correct"] and r["impl"] == "torch" and r["unwritten"] == 0
        assert r["n_runs"] == 2 and r["ms_median"] > 0 and r["gbps"] > 0
    df = analysis.measured(rows)
    assert set(df["kernel"]) == {"baseline_p1", "split_p1", "split_b64"}


def test_baseline_cap_skips_with_a_reason_but_keeps_required_cases(tmp_path) -> None:
    run = Run.create(tmp_path / "run")
    spec = GridSpec(contexts=[64, 128, 256], heads=[1], draft_tokens=[1], layouts=["shuffled_p1"],
                    kernels=["baseline_p1"], n_runs=1, n_warmup=0, rotate_bytes=0, baseline_max_ms=0.0,
                    required=[(256, 1, 1)])
    run_grid(spec, run, {"copy_gbps": 1.0, "matmul_tflops": 1.0}, "cpu")
    rows = {r["context_tokens"]: r for r in run.rows("kernel_ab")}
    assert rows[64]["skipped"] is None
    assert "cap" in rows[128]["skipped"] and "ms_median" not in rows[128]
    assert rows[256]["skipped"] is None and rows[256]["correct"]


def test_smoke_grid_is_small() -> None:
    assert len(smoke_grid().shapes()) <= 12


# --- the recorded H200 run --------------------------------------------------------------------

@pytest.fixture(scope="module")
def h200() -> Run:
    return Run.open(H200_DIR)


def test_h200_reference_has_provenance(h200: Run) -> None:
    meta = h200.meta
    dev = meta["device"]
    assert dev["gpu"].startswith("NVIDIA H200") and dev["driver"] and dev["cuda"] and dev["triton"] and dev["torch"]
    assert "specdiag.kernels.harness" in meta["command"] and dev["date_utc"]
    assert 3000 < meta["peaks"]["copy_gbps"] < 5500 and 500 < meta["peaks"]["matmul_tflops"] < 1000


def test_h200_reference_rows_are_checked_and_cover_the_grid(h200: Run) -> None:
    rows = h200.rows("kernel_ab")
    timed = [r for r in rows if r.get("kernel") and not r.get("skipped")]
    assert timed and all(r["error"] is None and r["correct"] and r["rel_err"] <= 1e-2 for r in timed)
    assert all(r["n_runs"] >= 20 and r["impl"] == "triton" for r in timed)
    df = analysis.measured(rows)
    assert set(df["heads"]) == {8, 16, 128} and set(df["draft_tokens"]) == {1, 8, 16, 64}
    assert {8192, 262144} <= set(df["context_tokens"])
    assert set(df["layout"]) == {"contiguous", "shuffled_p1", "shuffled_b64"}


def test_h200_targets_table_replays(h200: Run) -> None:
    df = analysis.measured(h200.rows("kernel_ab"))
    targets = analysis.target_table(df)
    summary = analysis.target_summary(targets).set_index("target")
    assert len(summary) == 4
    speed = targets[targets["target"].str.startswith("split-KV >= 20x")]
    assert len(speed) >= 3 and (speed["value"] >= 20).all()  # measured: about 200x
    fit = analysis.fixed_cost_fit(df)
    assert (fit["fixed_us"] > 0).all()
    found = analysis.findings(df, h200.meta["peaks"], h200.rows("kernel_ab_copy"))
    assert {f.id for f in found} >= {"kernel_ab.baseline_starves", "kernel_ab.split_fixed_cost"}
    base = next(f for f in found if f.id == "kernel_ab.baseline_starves")
    # measured on the H200: 4.5-9.3 GB/s at >= 64k, 0.22% of copy at best; medians 9.0-9.8 GB/s from 8k to 256k
    assert base.severity == "critical" and base.numbers["baseline_pct_copy_max"] < analysis.BASELINE_CRITICAL_PCT
    assert base.numbers["gbps_flat_in_context"] and base.numbers["gbps_context_spread_x"] < 1.25
    assert "flat in context" in base.verdict and "not flat" not in base.verdict
    # 256 programs (H128 T64) read at about half the rate of 8-128 programs: the text must not say "about the same"
    assert base.numbers["gbps_program_spread_x"] > 1.25 and "about the same" not in base.evidence[0]


def _baseline_rows(gbps_by_ctx: dict[int, float], copy_gbps: float = 1000.0) -> "pd.DataFrame":
    import pandas as pd

    return pd.DataFrame([{"kernel": "baseline_p1", "context_tokens": c, "programs": 8, "gbps": g,
                          "pct_copy_bw": 100 * g / copy_gbps, "kv_bytes": (c + 1) * KV_ROW_BYTES, "n_kv": c + 1}
                         for c, g in gbps_by_ctx.items()])


@pytest.mark.parametrize(("gbps", "severity", "flat"), [
    ({8192: 9.0, 65536: 9.5, 131072: 9.2}, "critical", True),      # under 10% of copy: starves
    ({8192: 100.0, 65536: 300.0, 131072: 450.0}, "warning", False),  # 45% of copy at best, grows 4.5x
    ({8192: 800.0, 65536: 850.0, 131072: 860.0}, "ok", True),      # 86% of copy: not a starving kernel
])
def test_baseline_finding_follows_the_numbers(gbps: dict[int, float], severity: str, flat: bool) -> None:
    f = analysis.baseline_finding(_baseline_rows(gbps), copy_gbps=1000.0)
    assert f.severity == severity
    assert f.numbers["gbps_flat_in_context"] is flat
    assert ("not flat in context" in f.verdict) is (not flat)
    assert ("starves" in f.title) is (severity == "critical")
    long_gbps = [g for c, g in gbps.items() if c >= analysis.MIN_TARGET_CONTEXT]
    assert f.numbers["baseline_gbps_max"] == max(long_gbps)
    # the tile time is computed from the rows: 64 rows of 1,152 B at the median rate of the long contexts
    median = statistics.median(long_gbps)
    assert f.numbers["us_per_tile"] == pytest.approx(64 * KV_ROW_BYTES / (median * 1e9) * 1e6)


def test_tuning_runs_every_candidate_and_picks_a_correct_one(tmp_path) -> None:
    """On the CPU the candidates all run the torch design; the code path (rows, pick) is the device's."""
    from specdiag.kernels.tuning import candidate_configs, config_picker, tune

    run = Run.create(tmp_path / "run")
    shape = VerifyShape(128, 2, 4, "shuffled_p1")
    tuned = tune([shape], run, {"copy_gbps": 1.0, "matmul_tflops": 1.0}, "cpu", n_runs=1)
    rows = run.rows("kernel_ab_tuning")
    timed = [r for r in rows if r["kernel"] == "split_p1"]
    assert len(timed) == len(candidate_configs(shape.rows)) and all(r["correct"] for r in timed)
    assert tuned[shape.rows] in candidate_configs(shape.rows)
    assert config_picker(tuned)(16) == tuned[shape.rows]
    assert config_picker(tuned)(1024).block_m == 64  # no tuned config in that regime: the default


def test_every_registered_kernel_runs_on_some_layout_and_the_harness_refuses_one_that_would_not(tmp_path) -> None:
    """Run 25's first call asked for split_gwg_p1, which a hand-kept layout list lacked: the harness wrote 6 rows of
    12 without a word. The lists are now derived from the registry, and a request no layout runs stops the harness
    before any work, naming the kernel."""
    from specdiag.kernels.cases import VARIANTS_BY_LAYOUT, kernels_not_run
    from specdiag.kernels.dispatch import KERNEL_VARIANTS
    from specdiag.kernels.harness import main

    for name, v in KERNEL_VARIANTS.items():
        assert name in VARIANTS_BY_LAYOUT["shuffled_b64"] and name in VARIANTS_BY_LAYOUT["contiguous"]
        assert (name in VARIANTS_BY_LAYOUT["shuffled_p1"]) == (v.page_size == 1), name
    assert kernels_not_run(["split_gwg_p1", "split_auto_gwg_p1"], ["shuffled_p1"]) == []
    assert kernels_not_run(["split_p1", "split_b64", "nope"], ["shuffled_p1"]) == ["split_b64", "nope"]
    assert kernels_not_run(["split_b64"], ["shuffled_p1", "shuffled_b64"]) == []
    for argv, named in ((["--kernels", "split_p1,nope_p1"], "nope_p1"),
                        (["--kernels", "split_b64", "--layouts", "shuffled_p1"], "split_b64"),
                        (["--layouts", "shuffled_p2"], "shuffled_p2")):
        with pytest.raises(SystemExit, match=named):
            main(["--out", str(tmp_path / "run"), *argv])
    assert not (tmp_path / "run").exists()


def test_equal_split_twins_change_only_the_split_round() -> None:
    """analysis.EQUAL_SPLIT_TWINS (06's pairs, pure data) against dispatch: each arm is its twin with the KV cut into
    equal shares of tokens and nothing else (the same variant fields, the same config at 8, 16 and 64 rows but the
    round), and the fp8 arm's bf16 twin is the bf16 arm with the same splits."""
    from dataclasses import asdict

    from specdiag.kernels.dispatch import KERNEL_VARIANTS, resolve_config

    for arm, twin in analysis.EQUAL_SPLIT_TWINS.items():
        a, b = asdict(KERNEL_VARIANTS[arm]), asdict(KERNEL_VARIANTS[twin])
        assert {k for k in a if a[k] != b[k]} == {"name", "overrides"}, arm
        for rows in (8, 16, 64):
            ca, cb = resolve_config(arm, rows), resolve_config(twin, rows)
            assert ca.split_round_tokens == 1 and cb.split_round_tokens == 64
            assert replace(ca, split_round_tokens=64) == cb, (arm, rows)
    assert analysis.bf16_twin("ragged_gwsw_fp8t_p1") == "ragged_gwsw_t_p1"
    assert analysis.bf16_twin("ragged_gwsw_fp8_p1") == "ragged_gwsw_p1"


def test_split_round_table_pairs_each_arm_with_its_twin_and_the_finding_reads_the_numbers() -> None:
    import pandas as pd

    def row(kernel: str, ctx: int, ms: float, splits: int) -> dict:
        return {"kernel": kernel, "context_tokens": ctx, "heads": 8, "draft_tokens": 1, "layout": "shuffled_p1",
                "ms_median": ms, "n_splits": splits}

    df = pd.DataFrame([row("split_gwsw8_p1", 131072, 0.0479, 129), row("split_gwsw8t_p1", 131072, 0.0489, 132),
                       row("split_gwsw8_p1", 262144, 0.0832, 129), row("split_gwsw8t_p1", 262144, 0.0849, 132),
                       row("ragged_gwsw_t_p1", 65536, 0.0302, 132)])  # no twin row: left out
    t = analysis.split_round_table(df)
    assert list(t["context_tokens"]) == [131072, 262144] and set(t["twin"]) == {"split_gwsw8_p1"}
    assert t["equal_over_64"].tolist() == pytest.approx([0.0489 / 0.0479, 0.0849 / 0.0832])
    f = analysis.split_round_finding(t)
    assert f.severity == "info" and f.numbers["faster_pairs"] == 0 and f.numbers["pairs"] == 2
    assert "(132 splits against 129)" in f.verdict and "cost nothing the stream could use" in f.verdict
    assert f.numbers["ratio_max"] == pytest.approx(max(0.0489 / 0.0479, 0.0849 / 0.0832)) and len(f.evidence) == 2
    faster = df.assign(ms_median=[0.05, 0.049, 0.09, 0.085, 0.03])
    assert analysis.split_round_finding(analysis.split_round_table(faster)).severity == "ok"
    assert analysis.split_round_table(df[df["kernel"] != "split_gwsw8_p1"]).empty
    assert analysis.split_round_finding(pd.DataFrame()) is None
