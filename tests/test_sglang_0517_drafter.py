"""03 on the real SGLang 0.5.17 run (data/reference/sglang-h200-tiny-standalone): the engine's behaviour decides.

The drafter window check recorded on the H200 (the shipped drafter and its all-full-attention copy drafted alike
at every context) must turn the configuration's 2 sliding + 1 full layers into 3 full layers as the engine ran
them, and the drafter_cost rows (STANDALONE against NGRAM ms per verify step) stand in for the per-step draft time
real SGLang does not report: over requests, and with one request per server and context here, 'not enough requests'.
"""

from __future__ import annotations

import json
from pathlib import Path

from specdiag import geometry
from specdiag.steps.drafter_inspection import analysis as drafter
from specdiag.runs import Run

ROOT = Path(__file__).resolve().parents[1]
RUN = ROOT / "data/reference/sglang-h200-tiny-standalone"


def _run() -> Run:
    return Run.open(RUN)


def test_window_check_says_ignored_and_cites_the_settings() -> None:
    run = _run()
    server = json.loads((RUN / "run.json").read_text())["server"]
    f = drafter.window_check_finding(run.rows(drafter.WINDOW_CHECK_TABLE), source="measured", server=server)
    assert f is not None and f.severity == "warning" and "ignores" in f.title
    assert f.numbers["rows_beyond_window"] == 6 and f.numbers["rows_differing_beyond_window"] == 0
    assert f.numbers["contexts_tokens"] == [384, 1024, 4096, 16000]
    assert any("speculative_draft_window_size = None" in e for e in f.evidence)


def test_geometry_as_the_engine_ran_it_is_all_full() -> None:
    run = _run()
    meta = json.loads((RUN / "run.json").read_text())
    geom = geometry.geometry_for_run("", "", meta, {}, role="drafter")
    assert geom.layer_types.count(geometry.LAYER_SLIDING) == 2  # as configured
    f = drafter.window_check_finding(run.rows(drafter.WINDOW_CHECK_TABLE))
    ran = drafter.as_engine_ran(geom, f)
    assert ran.layer_types == (geometry.LAYER_FULL,) * 3 and "as the engine ran it" in ran.source
    spans = drafter.span_rows(ran, [1024, 16000])
    found = {x.id: x for x in drafter.drafter_findings(ran, spans, None, cost_rows=run.rows(drafter.COST_TABLE))}
    bounded = found["drafter.attention_bounded"]
    assert bounded.numbers["n_full_layers"] == 3 and abs(bounded.numbers["growth_x"] - 16000 / 1024) < 1e-9
    # A window the engine honoured leaves the configuration alone.
    honoured = drafter.window_check_finding([{**r, "same_drafting": False} for r in run.rows(drafter.WINDOW_CHECK_TABLE)])
    assert drafter.as_engine_ran(geom, honoured) is geom


def test_cost_difference_from_the_recorded_rows() -> None:
    rows = _run().rows(drafter.COST_TABLE)
    f = drafter.cost_difference_finding(rows)
    by = {int(r["context_tokens"]): r for r in rows}
    assert f is not None and f.numbers["context_tokens_first"] == 1024 and f.numbers["context_tokens_last"] == 16000
    assert f.numbers["drafter_ms_last"] == by[16000]["standalone_step_ms"] - by[16000]["ngram_step_ms"]
    # one request per server and context: the differences are shown (2,048 and 4,096 came out negative), no verdict
    assert f.numbers["reading"] == "not enough requests" and not f.numbers["grows"] and f.severity == "info"
    assert any("2,048 tokens" in e and "difference -0.593 ms" in e for e in f.evidence)
    assert not any("least squares" in e for e in f.evidence)  # no line through single requests
    cost = {x.id: x for x in drafter.drafter_findings(None, [], None, cost_rows=rows)}["drafter.cost_bounded"]
    assert cost.numbers["measured_flat"] is None and "gives no verdict" in cost.verdict
