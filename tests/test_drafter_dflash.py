"""03 on DFLASH: specdiag.steps.drafter_inspection.dflash on synthetic rows, and the notebook on the embedded DFLASH
server with the draft window off and on."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable

import pytest

from specdiag.steps.drafter_inspection import dflash as dfl

EMBEDDED = {"speculative_algorithm": "DFLASH", "version": "specdiag-localserver 0.1.0"}


def _rows(window: int | None, draft_ms: dict[int, float], verify_ms: float = 10.0, requests: int = 3,
          spread: float = 0.02) -> list[dict[str, Any]]:
    """One arm's rows in send order: a warm-up request first (the server's first: left out), then ``requests`` per
    context around ``draft_ms`` (+-spread, relative)."""
    first = min(draft_ms)
    rows = [{"ts_unix_s": 0.0, "context_tokens": first, "draft_window_tokens": window, "draft_ms_median": 99.0,
             "verify_ms_median": 99.0, "commit_length_mean": 1.0, "error": None, "warmup": True}]
    for c, ms in draft_ms.items():
        for i in range(requests):
            f = 1.0 + spread * (i - (requests - 1) / 2)
            rows.append({"ts_unix_s": float(len(rows)), "context_tokens": c, "draft_window_tokens": window,
                         "draft_ms_median": ms * f, "verify_ms_median": verify_ms * f, "commit_length_mean": 1.0,
                         "error": None})
    return rows


def test_other_window_starts_the_opposite_setting_on_embedded_dflash_only() -> None:
    assert dfl.other_window(EMBEDDED, 256) == (True, 256)
    assert dfl.other_window({**EMBEDDED, "speculative_draft_window_size": 512}, 256) == (True, None)
    assert dfl.other_window(EMBEDDED, 0) == (False, None)
    assert dfl.other_window({"speculative_algorithm": "DFLASH", "version": "0.5.17"}, 256) == (False, None)
    assert dfl.other_window({**EMBEDDED, "speculative_algorithm": "NGRAM"}, 256) == (False, None)


def test_config_rows_say_what_the_config_and_the_server_state() -> None:
    cfg = {"block_size": 8, "num_hidden_layers": 2, "dflash_config": {"target_layer_ids": [1, 2], "mask_token_id": 9},
           "layer_types": ["sliding_attention", "full_attention"], "sliding_window": 16}
    rows = {r["what"]: r for r in dfl.config_rows(cfg, {"speculative_num_draft_tokens": 8,
                                                        "speculative_draft_window_size": 64})}
    assert rows["target layer ids"]["value"] == [1, 2] and rows["target layer ids"]["source"] == "config"
    assert rows["mask token id"]["value"] == 9 and rows["sliding window"]["value"] == 16
    assert rows["block size (server)"]["value"] == 8 and rows["draft window (server)"]["value"] == 64
    assert rows["drafter attention backend"]["value"] == "not stated"
    assert "keeps the whole context" in {r["what"]: r for r in dfl.config_rows(cfg, {})}["draft window (server)"]["value"]


def test_arm_table_and_the_window_verdicts() -> None:
    rows = _rows(None, {512: 3.0, 4096: 9.0}) + _rows(256, {512: 3.0, 4096: 3.3}) + [
        {"context_tokens": 512, "draft_window_tokens": 256, "error": "boom"}]
    table = dfl.arm_table(rows)
    assert [(r["draft_window_tokens"], r["context_tokens"]) for r in table] == [(None, 512), (None, 4096), (256, 512),
                                                                              (256, 4096)]
    assert [r["requests"] for r in table] == [3, 3, 3, 3]  # each arm's warm-up (99 ms) left out
    assert table[0]["draft_share"] == pytest.approx(3.0 / 13.0) and "3 requests" in table[0]["draft_share_range"]
    found = {f.id: f for f in dfl.window_findings(table, n_full_layers=1)}
    applied, none = found["drafter.window_applied"], found["drafter.no_window"]
    assert applied.severity == "ok" and applied.numbers["growth_x"] == pytest.approx(1.1)
    assert applied.numbers["growth_hi"] <= 1.5 and applied.numbers["reading"] == "flat"
    assert "window is applied and the draft cost is flat" in applied.verdict and "90% interval" in applied.verdict
    assert none.severity == "warning" and none.numbers["growth_x"] == pytest.approx(3.0)
    assert none.numbers["no_window_over_window_x"] == pytest.approx(9.0 / 3.3)
    assert none.numbers["no_window_over_window_verdict"] == "higher"
    assert "attend all 4,096 tokens" in none.verdict and "grows with the context" in none.verdict


def test_window_verdicts_with_two_requests_say_not_enough() -> None:
    table = dfl.arm_table(_rows(None, {512: 3.0, 4096: 9.0}, requests=2) + _rows(256, {512: 3.0, 4096: 3.3}, requests=2))
    found = {f.id: f for f in dfl.window_findings(table, n_full_layers=1)}
    applied, none = found["drafter.window_applied"], found["drafter.no_window"]
    assert applied.severity == "info" and applied.numbers["reading"] == "not enough requests"
    assert "not enough requests" in applied.verdict and applied.numbers["growth_lo"] is None
    assert none.numbers["no_window_over_window_verdict"] == "not enough requests" and none.severity == "info"


def test_a_window_that_does_not_bound_and_one_that_cannot_act() -> None:
    steep = {f.id: f for f in dfl.window_findings(dfl.arm_table(_rows(256, {512: 3.0, 4096: 6.0})), 1)}
    assert steep["drafter.window_applied"].severity == "warning" and "does not bound" in steep["drafter.window_applied"].verdict
    short = {f.id: f for f in dfl.window_findings(dfl.arm_table(_rows(8192, {512: 3.0, 4096: 3.1})), 1)}
    assert short["drafter.window_applied"].severity == "info" and "cannot show" in short["drafter.window_applied"].verdict
    flat_none = {f.id: f for f in dfl.window_findings(dfl.arm_table(_rows(None, {512: 3.0, 4096: 3.2})), 1)}
    assert flat_none["drafter.no_window"].severity == "info" and "small part" in flat_none["drafter.no_window"].verdict
    tie = {f.id: f for f in dfl.window_findings(dfl.arm_table(_rows(None, {512: 3.0, 4096: 3.2}, spread=0.2)
                                                              + _rows(64, {512: 3.0, 4096: 3.2}, spread=0.2)), 1)}
    assert tie["drafter.no_window"].numbers["no_window_over_window_verdict"] == "tie"
    assert "a tie" in tie["drafter.no_window"].verdict
    assert dfl.window_findings(dfl.arm_table(_rows(None, {512: 3.0})), 1) == []  # one context: nothing to compare


def test_own_rows_and_not_measurable() -> None:
    rows = _rows(None, {512: 3.0}) + _rows(256, {512: 2.0})
    assert {r["draft_window_tokens"] for r in dfl.own_rows(rows, 256)} == {256}
    old = [{"context_tokens": 512, "draft_ms_median": 1.0}]
    assert dfl.own_rows(old, 2048) == old  # recorded before the label: all rows are the server's
    f = dfl.not_measurable_finding({"speculative_draft_window_size": 2048}, "sglang")
    assert f.id == "drafter.time_not_measurable" and "SGLang" in f.verdict and "2,048 tokens" in f.verdict


@pytest.mark.notebook
def test_live_embedded_dflash_window_off_and_on(run_notebook: Callable[..., Path], tmp_path: Path,
                                                embedded_dflash_server: Any) -> None:
    """03 on the embedded DFLASH server (no window), which starts it again with a 64-token window."""
    run_notebook("03_drafter_inspection", server_url=embedded_dflash_server.url, context_lengths=[256, 1024],
                 max_new_tokens=8, compare_draft_window_tokens=64, repeats=2)
    res = json.loads((tmp_path / "run" / "findings" / "03_drafter_inspection.json").read_text())
    d = res["metrics"]["dflash"]
    assert d["draft_window_tokens"] is None and d["not_measurable"] is False
    assert sorted({(a["draft_window_tokens"] or 0, a["context_tokens"]) for a in d["arms"]}) == [
        (0, 256), (0, 1024), (64, 256), (64, 1024)]
    assert all(a["draft_ms"] > 0 and a["verify_ms"] > 0 for a in d["arms"])
    ids = {f["id"]: f for f in res["findings"]}
    assert {"drafter.window_applied", "drafter.no_window", "drafter.measured_cost"} <= set(ids)
    assert ids["drafter.window_applied"]["numbers"]["draft_window_tokens"] == 64
    # two requests a cell: every measured comparison says so instead of a verdict
    assert ids["drafter.window_applied"]["numbers"]["reading"] == "not enough requests"
    assert ids["drafter.measured_cost"]["numbers"]["reading"] == "not enough requests"
    assert ids["drafter.no_window"]["numbers"]["no_window_over_window_verdict"] == "not enough requests"
    assert "keeps the whole context" in ids["drafter.no_window"]["verdict"]
    rows = [json.loads(ln) for ln in (tmp_path / "run" / "drafter_timing.jsonl").read_text().splitlines()]
    assert sorted(r["draft_window_tokens"] or 0 for r in rows) == [0] * 5 + [64] * 5  # a warm-up + 2 a context each
    assert sum(1 for r in rows if r.get("warmup")) == 2
