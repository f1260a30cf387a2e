"""Notebook 11 executed with papermill on a CONSTRUCTED run folder (tests/moe_fixture.py: recorder dumps written with
torch.save in SGLang 0.5.17's per_pass structure from seeded uniform routing, step times made up; nothing recorded),
on the H200 reference run it replays by default, and on an empty run (it says what it lacks and still projects Kimi
K2.6 from the uniform expectation)."""

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
    out = run_notebook("11_moe_batch1", replay_dir=str(source.path), run_dir=str(run_dir))
    printed = "".join("".join(o.get("text", "")) for c in json.loads(out.read_text())["cells"] for o in c.get("outputs", []))
    assert "; replaying " in printed and "nothing recorded to analyse" not in printed
    result = _result(run_dir)
    m = result["metrics"]
    assert m["spread_ok"] is True and 0.9 < m["spread_ratio"] < 1.1
    assert m["distinct_by_tokens"]["1"] == 8 and 50 <= m["distinct_by_tokens"]["8"] <= 68
    assert m["step_ms"]["16384:1"] < m["step_ms"]["16384:16"]
    assert 1.0 < m["ep_balance"]["8:8"] < 3.0
    assert m["kimi_expert_share"]["8"] > m["kimi_expert_share"]["1"]
    # a constructed run names no random router: a trained-like router at Kimi's shape gives a measured projection
    assert m["projection_distinct_source"].startswith("measured")
    # 3 requests a cell: every rung of the ladder has an interval
    assert all(v["lo"] is not None and v["lo"] <= v["over_base_x"] <= v["hi"] for v in m["ladder"].values())
    assert m["ladder"]["16384:16"]["verdict"] == "higher" and m["ladder"]["16384:16"]["requests"] == 3
    ids = {f["id"]: f for f in result["findings"]}
    assert ids["moe.routing_spread"]["severity"] == "ok"
    assert {"moe.expert_share", "moe.best_draft_tokens", "moe.ep_balance", "moe.kimi_projection"} <= set(ids)
    assert ids["moe.best_draft_tokens"]["numbers"]["best_at_zero_acceptance"] == 1  # no acceptance: no drafts
    assert "90% interval" in ids["moe.expert_share"]["verdict"]
    assert not result.get("recorded_from")  # a replay_dir asked for: the run's own result (07 counts it)


@pytest.mark.notebook
def test_moe_notebook_replays_the_h200_reference_by_default(run_notebook, tmp_path):
    """No parameters: 11 replays data/reference/sglang-h200-moe-batch1 (real SGLang 0.5.17, recorded bytes)."""
    run_dir = tmp_path / "default"
    run_notebook("11_moe_batch1", run_dir=str(run_dir))
    result = _result(run_dir)
    assert result["recorded_from"].endswith("sglang-h200-moe-batch1")
    m, ids = result["metrics"], {f["id"]: f for f in result["findings"]}
    # distinct tokens spread (windows of the T=1 answer's generated tokens) ...
    assert m["spread_ok"] is True and ids["moe.routing_spread"]["severity"] == "ok"
    # the random-weight router's windows equal the uniform expectation: the projection is labelled an upper bound
    assert m["projection_distinct_source"].startswith("uniform upper bound")
    assert ids["moe.kimi_projection"]["numbers"]["upper_bound"] is True
    assert m["distinct_by_tokens"]["8"] == 16  # what the served verify passes touched
    # the floor of the measured steps uses those passes' experts; distinct drafts' beside it
    assert m["floor_distinct_passes"] == {"1": 8.0, "2": 16.0, "4": 16.0, "8": 16.0, "16": 16.0} and m["floor_distinct_windows"]["8"] == 60.0
    # two timed requests a cell in this recording: no ladder verdict, and the page says so
    assert {v["verdict"] for v in m["ladder"].values()} == {"not enough requests"}
    assert "not enough requests" in ids["moe.expert_share"]["verdict"]
    assert "does not speculate" in ids["moe.expert_share"]["verdict"]
    assert ids["moe.best_draft_tokens"]["numbers"]["enough_requests"] is False
    assert m["ep_balance_experts"]["8:8"] == 2.0 and "distinct experts" in ids["moe.ep_balance"]["verdict"]
    # ... but the served NGRAM verify passes routed like 2 tokens (zero-padded drafts), and the check says so
    drafts = ids["moe.verify_drafts"]["numbers"]
    assert drafts["tokens"] == 8 and drafts["distinct"] == 16 and 1.5 < drafts["effective_tokens"] < 2.5
    # the cost verdict reads the shortest context (1k), not 16k where the Triton verify attention dominates
    share = ids["moe.expert_share"]["numbers"]
    assert share["context_tokens"] == 1024 and all(lo > 3 for lo, _ in share["step_over_floor_range"].values())
    assert m["step_ms"]["16384:8"] > 5 * m["step_ms"]["1024:8"]


@pytest.mark.notebook
def test_moe_notebook_without_measurements_says_what_it_lacks(run_notebook, tmp_path):
    from specdiag.runs import Run

    empty = Run.create(tmp_path / "empty", label="moe-batch1")
    run_dir = tmp_path / "nothing"
    run_notebook("11_moe_batch1", replay_dir=str(empty.path), run_dir=str(run_dir))
    result = _result(run_dir)
    ids = {f["id"]: f for f in result["findings"]}
    assert "moe.not_measured" in ids and "moe.kimi_projection" in ids
    assert "moe.routing_spread" not in ids and "moe.expert_share" not in ids
    assert result["metrics"]["projection_distinct_source"].startswith("uniform upper bound")
