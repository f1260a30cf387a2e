"""Notebook 03 and specdiag.steps.drafter_inspection.analysis: the drafter's span and KV per draft step, bounded or not."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Callable

import pytest

from specdiag import geometry
from specdiag.steps.drafter_inspection import analysis as drafter
from specdiag.paths import PROJECT_ROOT, REFERENCE_DIR

REFERENCE = REFERENCE_DIR / "ct200-kimi-k26"
PER_TOKEN = 2 * 8 * 128 * 2  # investigation drafter: 8 KV heads x head_dim 128, K and V, bf16 = 4,096 B


def test_span_rows_flat_past_the_window() -> None:
    geom = geometry.load_geometry("investigation-drafter")
    rows = drafter.span_rows(geom, [1000, 185_000], tp_size=1, window_cap_tokens=None)
    assert rows[0]["kv_bytes_per_draft_step"] == 6 * 1000 * PER_TOKEN
    assert rows[1]["sliding_span_tokens"] == 2048 and rows[1]["full_span_tokens"] == 185_000
    assert rows[1]["kv_bytes_per_draft_step"] == (5 * 2048 + 185_000) * PER_TOKEN
    assert rows[1]["kv_bytes_if_all_full"] == 6 * 185_000 * PER_TOKEN
    capped = drafter.span_rows(geom, [185_000], window_cap_tokens=2048)[0]
    assert capped["kv_bytes_per_draft_step"] == 6 * 2048 * PER_TOKEN
    assert capped["kv_bytes_no_draft_window"] == (5 * 2048 + 185_000) * PER_TOKEN
    # TP 8: one of the 8 KV heads per GPU.
    assert drafter.span_rows(geom, [1000], tp_size=8)[0]["kv_bytes_per_draft_step"] == 6 * 1000 * PER_TOKEN / 8


def test_bounded_verdicts() -> None:
    geom = geometry.load_geometry("investigation-drafter")
    ctxs = [1000, 185_000]
    f = {x.id: x for x in drafter.drafter_findings(geom, drafter.span_rows(geom, ctxs, window_cap_tokens=2048), 2048)}
    assert f["drafter.attention_bounded"].severity == "ok" and f["drafter.attention_bounded"].numbers["max_span_tokens"] == 2048
    f = {x.id: x for x in drafter.drafter_findings(geom, drafter.span_rows(geom, ctxs), None)}
    grows = f["drafter.attention_bounded"]
    assert grows.severity == "warning"
    assert grows.numbers["growth_x"] == pytest.approx((5 * 2048 + 185_000) / (6 * 1000))
    assert f["drafter.positions"].severity == "ok"
    f = {x.id: x for x in drafter.drafter_findings(geom, drafter.span_rows(geom, [1000, 300_000]), None)}
    assert f["drafter.positions"].severity == "warning"  # 300k > max_position_embeddings 262144
    all_sliding = geometry.from_hf_config({**geometry.preset_config("investigation-drafter"),
                                           "layer_types": ["sliding_attention"] * 6})
    f = {x.id: x for x in drafter.drafter_findings(all_sliding, drafter.span_rows(all_sliding, ctxs), None)}
    assert f["drafter.attention_bounded"].numbers["max_span_tokens"] == 2048


def _timed(ms_by_ctx: dict[int, list[float]], warmup_ms: float = 500.0) -> list[dict[str, Any]]:
    """drafter_timing rows in send order: a warm-up request first (the server's first: left out), then the requests."""
    rows = [{"ts_unix_s": 0.0, "context_tokens": min(ms_by_ctx), "draft_ms_median": warmup_ms, "warmup": True}]
    for c, values in ms_by_ctx.items():
        rows += [{"ts_unix_s": float(len(rows)), "context_tokens": c, "draft_ms_median": v} for v in values]
    return rows


def test_measured_cost_over_requests() -> None:
    geom = geometry.load_geometry("investigation-drafter")
    spans = drafter.span_rows(geom, [1000, 4000], window_cap_tokens=2048)

    def measured(rows: list) -> Any:
        return {x.id: x for x in drafter.drafter_findings(geom, spans, 2048, rows)}["drafter.measured_cost"]

    two = measured(_timed({1000: [10.0, 10.2], 4000: [11.0, 10.9]}))
    assert two.severity == "info" and "not enough requests" in two.verdict and "not enough requests" in two.title
    assert two.numbers["reading"] == "not enough requests" and two.numbers["growth_lo"] is None
    assert two.numbers["requests_first"] == 2  # the warm-up (500 ms) is left out
    flat = measured(_timed({1000: [10.0, 10.2, 9.9], 4000: [11.0, 10.8, 11.1]}))
    assert flat.severity == "ok" and flat.numbers["reading"] == "flat"
    assert flat.numbers["growth_x"] == pytest.approx(11.0 / 10.0)
    assert flat.numbers["growth_lo"] <= flat.numbers["growth_x"] <= flat.numbers["growth_hi"] <= 1.5
    assert "90% interval" in flat.verdict and "over 3 / 3 requests" in flat.verdict
    steep = measured(_timed({1000: [10.0, 10.2, 9.9], 4000: [40.0, 39.0, 41.0]}))
    assert steep.severity == "warning" and steep.numbers["growth_lo"] > 1.5
    assert steep.numbers["slope_ms_per_1k_tokens"] == pytest.approx(10.0)
    spans_it = measured(_timed({1000: [10.0, 10.0, 10.0], 4000: [12.0, 16.0, 20.0]}))
    assert spans_it.numbers["reading"] == "spans" and spans_it.severity == "info"
    # without a warm-up row, the earliest row of the server is its first request, left out
    no_warmup = [{"ts_unix_s": float(i), "context_tokens": c, "draft_ms_median": 10.0}
                 for i, c in enumerate([1000, 1000, 1000, 4000, 4000, 4000])]
    assert measured(no_warmup).numbers["requests_first"] == 2
    assert drafter.timing_table(no_warmup)[0]["first_left_out"] is True


def test_timing_plan_warms_up_then_repeats() -> None:
    plan = drafter.TimingPlan((1024, 4096), 16, repeats=3, seed=5)
    reqs = plan.requests()
    assert reqs[0]["warmup"] is True and reqs[0]["context_tokens"] == 1024 and reqs[0]["seed"] == 8
    assert [(q["context_tokens"], q["seed"]) for q in reqs[1:]] == [(1024, 5), (1024, 6), (1024, 7), (4096, 5),
                                                                    (4096, 6), (4096, 7)]
    assert len({tuple(q[k] for k in drafter.TIMING_KEY) for q in reqs}) == len(reqs)  # every request its own key


def test_timing_row() -> None:
    spec = SimpleNamespace(step_draft_ms=[2.0, 4.0, 3.0], step_verify_ms=[5.0, 7.0, 6.0], step_commit_lengths=[1, 3, 2],
                           verify_ct=3)
    trace = SimpleNamespace(spec=spec, prompt_tokens=1000, error=None)
    row = drafter.timing_row(trace, 1000, prompt_kind="novel")
    assert set(drafter.DRAFTER_TIMING_COLUMNS) - {"seed", "max_new_tokens", "draft_window_tokens", "warmup"} <= set(row)
    assert row["draft_ms_median"] == 3.0 and row["verify_ms_median"] == 6.0 and row["commit_length_mean"] == 2.0
    no_spec = drafter.timing_row(SimpleNamespace(spec=None, prompt_tokens=5, error="boom"), 5)
    assert no_spec["draft_ms_median"] is None and no_spec["error"] == "boom"


def test_cost_difference_over_requests() -> None:
    one = [{"context_tokens": c, "standalone_step_ms": s, "ngram_step_ms": n}
           for c, s, n in ((1024, 2.9, 2.4), (16000, 9.7, 6.1))]
    f = drafter.cost_difference_finding(one)
    assert f.numbers["reading"] == "not enough requests" and "not enough requests" in f.verdict
    assert f.numbers["drafter_ms_last"] == pytest.approx(3.6)
    three = [{"context_tokens": 1024, "standalone_request_ms": [2.9, 3.0, 2.95], "ngram_request_ms": [2.4, 2.5, 2.45]},
             {"context_tokens": 16000, "standalone_request_ms": [9.7, 9.8, 9.6], "ngram_request_ms": [6.1, 6.0, 6.2]}]
    g = drafter.cost_difference_finding(three)
    assert g.numbers["reading"] == "grows" and g.severity == "warning" and g.numbers["ratio_last_lo"] > 1
    same = [{"context_tokens": 1024, "standalone_request_ms": [3.0, 3.1, 2.9], "ngram_request_ms": [3.0, 2.9, 3.1]},
            {"context_tokens": 16000, "standalone_request_ms": [6.0, 6.2, 5.9], "ngram_request_ms": [6.1, 6.0, 6.2]}]
    h = drafter.cost_difference_finding(same)
    assert h.numbers["reading"] == "no growth shown" and "at most" in h.verdict


def test_draft_window_precedence() -> None:
    assert drafter.draft_window({"speculative_draft_window_size": 2048}) == 2048
    assert drafter.draft_window({"speculative_draft_window_size": 2048}, 0) is None
    assert drafter.draft_window({}, 4096) == 4096
    assert drafter.draft_window({}) is None


@pytest.mark.notebook
def test_replay_investigation_drafter(run_notebook: Callable[..., Path], tmp_path: Path) -> None:
    run_notebook("03_drafter_inspection", replay_dir=str(REFERENCE))
    res: dict[str, Any] = json.loads((tmp_path / "run" / "findings" / "03_drafter_inspection.json").read_text())
    m = res["metrics"]
    assert (m["n_layers"], m["n_sliding_layers"], m["n_full_layers"]) == (6, 5, 1)
    assert m["sliding_window_tokens"] == 2048 and m["draft_window_tokens"] == 2048 and m["tp_size"] == 8
    assert m["max_position_embeddings"] == 262144 and m["rope_scaling"]["rope_type"] == "yarn"
    assert m["context_tokens"] == [1400, 11000, 32000, 64000, 128000, 185000]
    per_gpu = PER_TOKEN / 8  # 1 of 8 KV heads per GPU under TP 8
    assert m["kv_bytes_per_draft_step"][0] == 6 * 1400 * per_gpu
    assert m["kv_bytes_per_draft_step"][-1] == 6 * 2048 * per_gpu  # flat past the window
    assert m["kv_bytes_no_draft_window"][-1] == (5 * 2048 + 185_000) * per_gpu
    assert m["attention_bounded"] is True and m["timing_source"] is None
    ids = {f["id"]: f for f in res["findings"]}
    assert ids["drafter.attention_bounded"]["severity"] == "ok"
    assert "drafter.measured_cost" not in ids  # nothing measured was published
    assert ids["drafter.cost_bounded"]["severity"] == "ok"
    assert ids["drafter.cost_bounded"]["numbers"]["max_span_tokens"] == 2048


@pytest.mark.notebook
@pytest.mark.slow
def test_live_embedded_drafter(run_notebook: Callable[..., Path], tmp_path: Path, embedded_server: Any) -> None:
    """03 on the embedded server: the drafter's config from its folder, measured draft ms per context."""
    from specdiag.serving import SGLangClient

    info = SGLangClient(embedded_server.url).server_info()
    cfg = json.loads((PROJECT_ROOT / info["speculative_draft_model_path"] / "config.json").read_text())
    run_notebook("03_drafter_inspection", server_url=embedded_server.url, context_lengths=[256, 1024],
                 max_new_tokens=16, repeats=3)
    res = json.loads((tmp_path / "run" / "findings" / "03_drafter_inspection.json").read_text())
    m = res["metrics"]
    assert m["n_layers"] == cfg["num_hidden_layers"]
    types = cfg.get("layer_types") or []
    assert m["n_sliding_layers"] == types.count("sliding_attention")
    assert m["context_tokens"] == [256, 1024]
    assert m["timing_source"] == "server-reported"
    assert m["requests_per_context"] == [3, 3]  # the warm-up request left out
    assert all(ms is not None and ms > 0 for ms in m["draft_ms_median"])
    ids = {f["id"]: f for f in res["findings"]}
    assert {"drafter.attention_bounded", "drafter.measured_cost", "drafter.cost_bounded"} <= set(ids)
    g = m["measured_growth"]  # 3 requests a context: an interval, whatever it reads
    assert g["growth_lo"] <= g["growth_x"] <= g["growth_hi"] and g["reading"] in ("flat", "grows", "spans")
    assert "90% interval" in ids["drafter.measured_cost"]["verdict"]
    rows = [json.loads(ln) for ln in (tmp_path / "run" / "drafter_timing.jsonl").read_text().splitlines()]
    assert len(rows) == 7 and all(r["error"] is None for r in rows)
    assert [r["warmup"] for r in rows].count(True) == 1 and rows[0]["warmup"] is True
    assert len({(r["context_tokens"], r["seed"]) for r in rows}) == 7  # distinct prompts


def test_cost_bounded_combines_config_and_measurement() -> None:
    geom = geometry.load_geometry("investigation-drafter")
    spans = drafter.span_rows(geom, [1000, 4000])
    flat = _timed({1000: [10.0, 10.1, 9.9], 4000: [10.5, 10.4, 10.6]})
    steep = _timed({1000: [10.0, 10.1, 9.9], 4000: [40.0, 41.0, 39.0]})
    few = _timed({1000: [10.0], 4000: [40.0]})

    def verdict(window: int | None, timing: list) -> Any:
        return {f.id: f for f in drafter.drafter_findings(geom, spans, window, timing)}["drafter.cost_bounded"]

    assert verdict(2048, []).severity == "ok"
    assert verdict(2048, flat).severity == "ok" and "measured draft time is flat" in verdict(2048, flat).verdict
    assert verdict(2048, steep).severity == "warning" and "yet the measured" in verdict(2048, steep).verdict
    assert verdict(2048, few).severity == "ok" and "not enough requests" in verdict(2048, few).verdict
    assert verdict(None, flat).severity == "info"
    assert verdict(None, steep).severity == "warning"
    assert verdict(None, few).severity == "warning" and "gives no verdict" in verdict(None, few).verdict
    assert verdict(None, []).numbers["measured_flat"] is None


def test_no_draft_model_judges_the_measured_time_only() -> None:
    flat = _timed({1000: [0.26, 0.27, 0.25], 4000: [0.30, 0.29, 0.31]})
    f = {x.id: x for x in drafter.drafter_findings(None, [], None, flat)}
    assert set(f) == {"drafter.no_model", "drafter.measured_cost", "drafter.cost_bounded"}
    assert f["drafter.cost_bounded"].severity == "ok"
    f = {x.id: x for x in drafter.drafter_findings(None, [], None, [])}
    assert f["drafter.cost_bounded"].severity == "info"
