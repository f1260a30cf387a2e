"""00-04's measurements as ``specdiag sweep`` runs them (a GPU host without Jupyter): each arm's server measured by
the notebooks' own functions into the arm's own folder, which the notebooks replay; 03's two comparisons between arms;
the settings of several measurements in one arms file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from specdiag import cli
from specdiag.runs import Run
from specdiag.steps.drafter_inspection.measure import cost_rows, window_check_rows
from specdiag.sweep.settings import SettingsError, per_measurement

STEPS = "snapshot,commit_probe,baseline_sweep,drafter_timing"


def test_a_running_server_gets_00s_and_01s_tables_into_its_own_folder(embedded_server, tmp_path: Path) -> None:
    """Two measurements on one server, each arm's rows in its own folder (the sweep's own holds none)."""
    arms = tmp_path / "arms.yaml"
    arms.write_text(f"arms:\n  - {{name: live, url: '{embedded_server.url}'}}\n")
    out = tmp_path / "sweep"
    assert cli.main(["sweep", "--arms", str(arms), "--measure", "snapshot,baseline_sweep", "--out", str(out),
                     "--contexts", "128", "--max-new-tokens", "8"]) == 0
    own = Run.open(out / "live")
    assert own.meta["server"]["speculative_algorithm"] == "STANDALONE" and own.meta["model"]["model_config"]
    assert [(r["context_tokens"], r["error"]) for r in own.rows("sweep")] == [(128, None)]
    assert Run.open(out).meta["kind"] == "snapshot,baseline_sweep" and not Run.open(out).rows("sweep")


@pytest.mark.notebook
def test_a_running_server_gets_00_to_04_into_its_own_folder_which_the_notebooks_replay(
        embedded_server, run_notebook, tmp_path: Path) -> None:
    arms = tmp_path / "arms.yaml"
    arms.write_text(f"arms:\n  - {{name: live, url: '{embedded_server.url}'}}\n")
    out = tmp_path / "sweep"
    assert cli.main(["sweep", "--arms", str(arms), "--measure", STEPS, "--out", str(out), "--contexts", "128",
                     "--max-new-tokens", "8", "--set", "drafter_timing.repeats=1", "--set", "commit_probe.kinds=novel",
                     "--set", "drafter_timing.window_contexts=128"]) == 0
    top, own = Run.open(out), Run.open(out / "live")
    assert top.meta["kind"] == STEPS and top.meta["measurement"]["settings"]["baseline_sweep"]["contexts"] == [128]
    assert not top.rows("sweep")  # 00-04's rows are the arm's own, not the sweep's
    meta = own.meta
    assert meta["server"]["speculative_algorithm"] == "STANDALONE" and meta["model"]["model_config"]["num_hidden_layers"]
    assert meta["drafter"]["model_config"]["sliding_window"] == 512 and meta["hardware"]["memory_bandwidth_gb_s"] > 0
    assert set(meta["params"]) == {"01_baseline_sweep", "03_drafter_inspection", "04_commit_probe"}
    assert [(r["context_tokens"], r["error"]) for r in own.rows("sweep")] == [(128, None)]
    assert [(r["kind"], r["error"]) for r in own.rows("commit_probe")] == [("novel", None)]
    assert own.rows("commit_probe_steps") and own.rows("drafter_window")
    timing = own.rows("drafter_timing")
    assert [r.get("warmup") for r in timing] == [True, False] and all(r["error"] is None for r in timing)
    run_notebook("01_baseline_sweep", replay_dir=str(out / "live"), run_dir=str(tmp_path / "replay"))
    result = json.loads((tmp_path / "replay" / "findings" / "01_baseline_sweep.json").read_text())
    assert result["metrics"] and result["findings"]


def _window(verify_ct: int, hist: list[int], ids: list[int], ctx: int = 1024, kind: str = "novel") -> dict:
    return {"context_tokens": ctx, "kind": kind, "error": None, "output_ids": ids, "verify_ct": verify_ct,
            "correct_drafts": sum(i * n for i, n in enumerate(hist)), "histogram": hist, "completion_tokens": 9}


def test_the_window_check_sets_the_two_drafters_drafting_side_by_side() -> None:
    shipped = [_window(4, [1, 1, 2], [1, 2, 3]), _window(6, [3, 3, 0], [1, 2, 3], ctx=256)]
    full = [_window(4, [1, 1, 2], [1, 2, 3]), _window(5, [2, 3, 0], [1, 2, 4], ctx=256)]
    rows = {r["context_tokens"]: r for r in window_check_rows(shipped, full, 512)}
    assert rows[1024]["same_drafting"] and rows[1024]["beyond_window"] and rows[1024]["same_output_ids"]
    assert not rows[256]["same_drafting"] and not rows[256]["beyond_window"] and not rows[256]["same_output_ids"]
    assert (rows[256]["verify_ct_as_shipped"], rows[256]["verify_ct_all_full"]) == (6, 5)
    assert window_check_rows(shipped, [], 512) == []  # a prompt one server did not draft is no row


def test_the_drafters_cost_is_one_arms_step_less_the_others_per_context() -> None:
    def sweep_row(ctx: int, step: float, repeat: int = 0) -> dict:
        return {"context_tokens": ctx, "repeat": repeat, "prompt_kind": "novel", "seed": repeat, "max_new_tokens": 8,
                "step_ms": step, "commit_length": 2.0, "error": None}

    rows = cost_rows([sweep_row(1024, 10.0), sweep_row(1024, 12.0, 1), sweep_row(4096, 14.0)],
                     [sweep_row(1024, 4.0), sweep_row(1024, 6.0, 1)], 7)
    (row,) = rows  # 4096: no NGRAM row there
    assert row["drafter_ms_per_verify_step"] == pytest.approx(11.0 - 5.0)
    assert row["drafter_ms_per_draft_step"] == pytest.approx(6.0 / 7) and row["standalone_request_ms"] == [10.0, 12.0]


def test_several_measurements_take_their_settings_by_name() -> None:
    fields = {"baseline_sweep": {"contexts", "repeats"}, "commit_probe": {"contexts", "kinds"}}
    names = list(fields)
    got = per_measurement({"baseline_sweep": {"repeats": 2}, "commit_probe": {"kinds": ["novel"]}}, names, fields,
                          {"contexts": "1024", "commit_probe.kinds": "predictable"})
    assert got == {"baseline_sweep": {"repeats": 2, "contexts": "1024"},
                   "commit_probe": {"kinds": "predictable", "contexts": "1024"}}
    with pytest.raises(SettingsError, match="keyed by measurement"):
        per_measurement({"contexts": [1024]}, names, fields)
    with pytest.raises(SettingsError, match="'seed' is not one baseline_sweep or commit_probe takes"):
        per_measurement({}, names, fields, {"seed": "1"})
    # a file keyed for several measurements serves a sweep of one of them
    assert per_measurement({"baseline_sweep": {"repeats": 2}, "commit_probe": {}}, ["baseline_sweep"], fields,
                           known=names) == {"baseline_sweep": {"repeats": 2}}
