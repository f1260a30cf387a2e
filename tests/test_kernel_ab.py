"""The kernel A/B step (06) on the CPU: the harness's rows and refusals, and the analysis on synthetic rows."""

from __future__ import annotations

import pandas as pd
import pytest

from specdiag import kernel_ab_table
from specdiag.runs import Run
from specdiag.steps.kernel_ab import analysis
from specdiag.steps.kernel_ab.arms import ARMS, OURS, arm
from specdiag.steps.kernel_ab.harness import (BUDGET_SKIP, COPY_TABLE, TABLE, derived, main, measure, parse_arms,
                                              parse_cases)


def test_ten_arms_named_for_what_they_are_each_with_its_config_object() -> None:
    assert len(ARMS) <= 10 and set(OURS) <= set(ARMS)
    assert all(a.name.replace("_", "").isalnum() and a.what for a in ARMS.values())
    assert ARMS["pick"].config is not None and ARMS["pick_fp8"].kv == "fp8"
    assert ARMS["split_triton_b64"].layout == "shuffled_b64"
    with pytest.raises(ValueError, match="unknown arm 'split_gwsw8_p1'"):
        arm("split_gwsw8_p1")


def test_bad_cases_and_arms_are_refused_before_any_work(tmp_path, capsys) -> None:
    assert parse_cases("131072:8:1, 64k:16:8") == [(131072, 8, 1), (65536, 16, 8)]  # k = 1,024 tokens
    for bad in ("131072:8", "1.4k:8:1", "131072:0:1", "128k:8k:1"):
        with pytest.raises(ValueError, match="context:heads:draft_tokens"):
            parse_cases(bad)
    with pytest.raises(ValueError, match="unknown arm"):
        parse_arms("pick,fused_p1")
    with pytest.raises(SystemExit):
        main(["--out", str(tmp_path / "x"), "--cases", "128k:8"])
    assert "context:heads:draft_tokens" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()


def test_the_cpu_runs_the_torch_forms_and_says_why_the_rest_cannot(tmp_path) -> None:
    run = Run.create(tmp_path / "ab", label="t")
    n = measure(run, [(256, 2, 1), (300, 2, 3)], list(ARMS), "cpu", n_runs=2)
    rows = run.rows(TABLE)
    assert n == len(rows) == 2 * len(ARMS)
    done = {(r["context_tokens"], r["arm"]) for r in rows if r.get("ms_median")}
    assert done == {(c, a) for c in (256, 300) for a in ("baseline", "split_triton")}
    assert all(r["correct"] and r["rel_err"] < 1e-2 and r["method"] == "cpu" for r in rows if r.get("ms_median"))
    skipped = [r for r in rows if r.get("skipped")]
    assert len(skipped) == 2 * (len(ARMS) - 2) and all("CUDA only" in r["skipped"] for r in skipped)
    assert run.rows(COPY_TABLE) == []  # no copy timed on the CPU
    assert run.meta["peaks"]["copy_gbps"] is None and run.meta["kernel_ab_arms"]["pick"]["config"]["block_n"] == 64


def test_a_run_stopped_by_its_budget_resumes_the_cases_it_did_not_start(tmp_path) -> None:
    run = Run.create(tmp_path / "ab", label="t")
    measure(run, [(128, 1, 1), (192, 1, 1)], ["baseline"], "cpu", n_runs=1, deadline_s=0.0)
    assert [r["skipped"] for r in run.rows(TABLE)] == [BUDGET_SKIP, BUDGET_SKIP]
    assert measure(run, [(128, 1, 1), (192, 1, 1)], ["baseline"], "cpu", n_runs=1) == 2
    latest = kernel_ab_table.latest(run.rows(TABLE))
    assert len(latest) == 2 and latest["ms_median"].notna().all()
    assert measure(run, [(128, 1, 1)], ["baseline"], "cpu", n_runs=1) == 0  # nothing left to do


def _rows(us: dict[tuple[int, int, int, str], float], copy_us: dict[tuple[int, int], float]) -> list[dict]:
    """Synthetic measured rows: a time per (context, heads, draft tokens, arm), copies per (context, draft tokens)."""
    peaks = {"copy_gbps": 4000.0, "matmul_tflops": 800.0}
    out = []
    for (c, h, t, a), v in us.items():
        n_bytes = (c + t) * 1152 // (2 if ARMS[a].kv == "fp8" else 1)
        flops = 2 * h * t * (c + t) * 1088
        row = {"context_tokens": c, "heads": h, "draft_tokens": t, "arm": a, "kv": ARMS[a].kv, "kv_bytes": n_bytes,
               "flops": flops, "ms_median": v / 1e3, "correct": True, "rel_err": 2e-3, "error": None, "skipped": None,
               "rel_err_vs_bf16_ref": 1e-2 if ARMS[a].kv == "fp8" else None}
        row.update(derived(v / 1e3, n_bytes, flops, peaks, copy_us.get((c, t), 0) / 1e3 or None))
        out.append(row)
    return out


def test_targets_are_judged_per_case_with_the_gap_from_the_numbers() -> None:
    rows = _rows({(131072, 8, 1, "pick"): 44.0, (131072, 8, 1, "plugin"): 50.0, (131072, 8, 1, "flashinfer_mla"): 48.0,
                  (131072, 8, 8, "pick"): 60.0, (131072, 8, 8, "plugin"): 70.0,
                  (131072, 16, 64, "pick"): 1000.0, (65536, 8, 1, "pick"): 30.0},
                 {(131072, 1): 40.0, (131072, 8): 50.0, (65536, 1): 20.0})
    tt = analysis.target_table(kernel_ab_table.measured(rows)).set_index(["target", "case", "arm"])
    one = tt.loc[("one draft token, 128k-256k", "128k, 8 x 1", "pick")]
    assert one["value"] == pytest.approx(1.1) and bool(one["met"])
    miss = tt.loc[("one draft token, 128k-256k", "128k, 8 x 1", "plugin")]
    assert miss["value"] == pytest.approx(1.25) and not miss["met"] and miss["gap"] == pytest.approx(1 - 1.15 / 1.25)
    assert bool(tt.loc[("8 heads x 8 draft tokens, 128k", "128k, 8 x 8", "pick")]["met"])  # 1.2 <= 1.35
    assert not tt.loc[("8 heads x 8 draft tokens, 128k", "128k, 8 x 8", "plugin")]["met"]  # 1.4
    fi = tt.loc[("faster than FlashInfer", "128k, 8 x 1")]
    assert bool(fi.loc["pick", "met"]) and not fi.loc["plugin", "met"]
    cb = tt.loc[("compute-bound (>= 256 rows)", "128k, 16 x 64", "pick")]
    assert cb["value"] == pytest.approx(100 * 2 * 1024 * 131136 * 1088 / 1e-3 / 1e12 / 800) and not cb["met"]
    assert ("one draft token, 128k-256k", "64k, 8 x 1", "pick") not in tt.index  # 64k is not a target case
    found = {f.id: f for f in analysis.findings(kernel_ab_table.measured(rows), {"copy_gbps": 4000.0}, {"gpu": "GPU"})}
    assert found["kernel_ab.targets"].severity == "warning" and "short" in found["kernel_ab.targets"].verdict
    assert found["kernel_ab.flashinfer"].numbers["plugin_over_flashinfer_max"] == pytest.approx(50 / 48)


def test_the_baseline_finding_and_speedups_follow_the_numbers() -> None:
    rows = _rows({(131072, 8, 8, "baseline"): 10000.0, (131072, 8, 8, "pick"): 100.0, (131072, 8, 8, "plugin"): 125.0},
                 {})
    df = kernel_ab_table.measured(rows)
    su = analysis.speedups(df)
    assert su.loc["128k, 8 x 8", "pick"] == pytest.approx(100.0) and su.loc["128k, 8 x 8", "plugin"] == 80.0
    f = {x.id: x for x in analysis.findings(df, {"copy_gbps": 4000.0}, {"gpu": "H200"})}
    assert f["kernel_ab.baseline"].severity == "critical"  # 15 GB/s of 4,000
    assert f["kernel_ab.split_kv"].numbers["speedup_max"] == pytest.approx(100.0)
    fast = _rows({(131072, 8, 8, "baseline"): 60.0}, {})
    assert {x.id: x for x in analysis.findings(kernel_ab_table.measured(fast), {"copy_gbps": 4000.0}, {})}[
        "kernel_ab.baseline"].severity == "ok"


def test_tables_pair_each_arm_with_its_twin() -> None:
    rows = _rows({(65536, 8, 1, "split_triton"): 60.0, (65536, 8, 1, "split_triton_b64"): 50.0,
                  (65536, 8, 1, "pick"): 30.0, (65536, 8, 1, "pick_fp8"): 27.0}, {})
    df = kernel_ab_table.measured(rows)
    assert analysis.page_size_effect(df).iloc[0, 0] == pytest.approx(1.2)
    f8 = analysis.fp8_table(df)
    assert list(f8["arm"]) == ["pick_fp8"] and f8["fp8_over_bf16"].iloc[0] == pytest.approx(0.9)
    t = analysis.case_table(df)
    assert list(t.index) == ["64k, 8 x 1"] and list(t.columns) == ["split_triton", "split_triton_b64", "pick",
                                                                     "pick_fp8"]
    bad = rows + [{"context_tokens": 65536, "heads": 8, "draft_tokens": 1, "arm": "plugin", "ms_median": None,
                   "correct": None, "error": None, "skipped": "plugin is an sm_90 (Hopper) kernel"}]
    nm = kernel_ab_table.not_measured(bad)
    assert list(nm["arm"]) == ["plugin"] and "sm_90" in nm["why"].iloc[0]
    assert isinstance(analysis.fixed_cost_fit(df), pd.DataFrame)


@pytest.mark.notebook
def test_06_replays_the_canonical_run_and_shows_its_targets(run_notebook, tmp_path) -> None:
    """Without CUDA, 06 replays data/reference/kernel-ab-h200: the page states the run's GPU and ceilings, a target
    table from the rows, the tables without NaN, the findings marked as the recorded run's, and its key numbers."""
    import json

    from specdiag.paths import REFERENCE_DIR

    ref = Run.open(REFERENCE_DIR / "kernel-ab-h200")
    out = run_notebook("06_kernel_ab")
    res = json.loads((tmp_path / "run" / "findings" / "06_kernel_ab.json").read_text())
    assert res["recorded_from"] == "data/reference/kernel-ab-h200"
    m = res["metrics"]
    df = kernel_ab_table.measured(ref.rows(TABLE))
    assert m["rows_measured"] == len(df) and m["cases"] == 15 and m["copy_gbps"] == ref.meta["peaks"]["copy_gbps"]
    pick = df[(df["arm"] == "pick") & (df["context_tokens"] == 131072) & (df["heads"] == 8) & (df["draft_tokens"] == 8)]
    assert m["us"]["pick 128k, 8 x 8"] == pytest.approx(float(pick["us"].iloc[0]))
    tt = analysis.target_table(df)
    for (target, arm_name), g in tt.groupby(["target_id", "arm"]):
        assert m["targets"][f"{target}/{arm_name}"]["met"] == int(g["met"].sum())
    ids = {f["id"] for f in res["findings"]}
    assert {"kernel_ab.baseline", "kernel_ab.split_kv", "kernel_ab.targets", "kernel_ab.flashinfer"} <= ids
    page = out.read_text()
    assert "NVIDIA H200" in page and "4,248 GB/s" in page and "recorded run" in page
    assert "128k, 8 x 8" in page and "% short" in page and ">nan<" not in page.lower()
    # the prefill cases: the H200 run has none, so the recorded H100 run's, said as such, with its verdict
    pre = Run.open(REFERENCE_DIR / "sglang-h100-mla61-prefill").rows(analysis.PREFILL_TABLE)
    ours = next(r for r in pre if r["arm"] == "triton" and r["prefix_tokens"] == 122880)
    assert "data/reference/sglang-h100-mla61-prefill" in page and "NVIDIA H100" in page
    assert f"specdiag's prefill kernel reaches {ours['tflops']:,.0f} TFLOP/s" in page


def test_the_page_refuses_bad_parameters_before_a_run_opens_then_replays_the_reference(tmp_path) -> None:
    """06's page (CPU): a bad cases string or a zero n_runs stops start before the run folder opens; with good ones
    the sections replay the H200 reference, and their findings and key numbers are the analysis' of its rows."""
    from specdiag import nb
    from specdiag.paths import REFERENCE_DIR
    from specdiag.steps.kernel_ab import page

    for bad in ({"cases": "128k:8"}, {"n_runs": 0}, {"arms": "pick,fused_p1"}):
        with pytest.raises(nb.ParameterError):
            page.start({"run_dir": str(tmp_path / "bad"), **bad})
    assert not (tmp_path / "bad").exists()
    pg = page.start({"run_dir": str(tmp_path / "run"), "cpu_smoke": False})
    assert pg.recorded_from == "data/reference/kernel-ab-h200" and pg.opening.lines[-1].startswith("replaying")
    assert page.measure(pg).parts == []
    page.the_run(pg)
    targets = page.targets(pg)
    assert "% short" in targets.parts[-1][1]
    assert page.case_times(pg).lines == ["Time over the same-bytes copy (1.00 = as fast as copying what the call "
                                         "reads):", "Speedup over the baseline (x):"]
    assert [k for k, _ in page.bandwidth(pg).parts] == ["figure", "figure"]
    found = page.findings(pg)["found"]
    df = kernel_ab_table.measured(Run.open(REFERENCE_DIR / "kernel-ab-h200").rows(TABLE))
    assert [f.id for f in found] == [f.id for f in analysis.findings(df, pg.peaks, pg.dev)]
    assert page.metrics(pg) == analysis.metrics(df, analysis.target_table(df), pg.peaks)
