"""Notebook 11 executed with papermill on a CONSTRUCTED run folder (tests/moe_fixture.py: recorder dumps written with
torch.save in SGLang 0.5.17's per_pass structure from seeded uniform routing, step times made up; nothing recorded),
and with nothing recorded at all (it says what it lacks and still projects Kimi K2.6 from the uniform expectation)."""

from __future__ import annotations

import json

import pytest

from moe_fixture import build_run


def _result(run_dir) -> dict:
    return json.loads((run_dir / "findings" / "11_moe_batch1.json").read_text())


@pytest.mark.notebook
def test_moe_notebook_on_a_constructed_run(run_notebook, tmp_path):
    source = build_run(tmp_path / "constructed")
    run_dir = tmp_path / "out"
    run_notebook("11_moe_batch1", replay_dir=str(source.path), run_dir=str(run_dir))
    result = _result(run_dir)
    m = result["metrics"]
    assert m["spread_ok"] is True and 0.9 < m["spread_ratio"] < 1.1
    assert m["distinct_by_tokens"]["1"] == 8 and 50 <= m["distinct_by_tokens"]["8"] <= 68
    assert m["step_ms"]["16384:1"] < m["step_ms"]["16384:16"]
    assert 1.0 < m["ep_balance"]["8:8"] < 3.0
    assert m["kimi_expert_share"]["8"] > m["kimi_expert_share"]["1"]
    assert m["projection_distinct_source"].startswith("measured")
    ids = {f["id"]: f for f in result["findings"]}
    assert ids["moe.routing_spread"]["severity"] == "ok"
    assert {"moe.expert_share", "moe.best_draft_tokens", "moe.ep_balance", "moe.kimi_projection"} <= set(ids)
    assert ids["moe.best_draft_tokens"]["numbers"]["best_at_zero_acceptance"] == 1  # no acceptance: no drafts
    assert result["recorded_from"]


@pytest.mark.notebook
def test_moe_notebook_without_a_recorded_run_says_what_it_lacks(run_notebook, tmp_path):
    run_dir = tmp_path / "nothing"
    run_notebook("11_moe_batch1", run_dir=str(run_dir))
    result = _result(run_dir)
    ids = {f["id"]: f for f in result["findings"]}
    assert "moe.not_measured" in ids and "moe.kimi_projection" in ids
    assert "moe.routing_spread" not in ids and "moe.expert_share" not in ids
    assert result["metrics"]["projection_distinct_source"].startswith("computed")
