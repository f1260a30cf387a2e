"""Which notebooks saw which server: a restart or other settings between notebooks is detected,
recorded in run.json and said by 07."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from specdiag import nb
from specdiag.runs import Run
from specdiag.serving.identity import changes, same_server, server_identity
from specdiag.serving.settings import ServerSettings
from specdiag.speculation.scrapes import parse_prometheus
from specdiag.steps.findings.run_checks import run_findings, servers_finding, traffic_overall

SETTINGS = ServerSettings(engine="vllm", version="0.32.0", model="m", context_length=2048, speculating=True,
                          draft_steps=7, tokens_per_step=8, page_size=128)


def metrics(start: float) -> dict:
    return parse_prometheus(f"process_start_time_seconds {start}\n")


class FakeClient:
    def __init__(self, url: str, start: float) -> None:
        self.base_url, self.start = url, start

    def metrics_samples(self) -> dict:
        return metrics(self.start)


def test_restart_and_reconfiguration_are_told_apart() -> None:
    a = server_identity("http://h:8000", SETTINGS, metrics(1000.0))
    assert same_server(a, server_identity("http://h:8000/", SETTINGS, metrics(1000.0)))
    restarted = server_identity("http://h:8000", SETTINGS, metrics(2000.0))
    assert changes(a, restarted) == ["restarted (started 1000 -> 2000, Unix time)"]
    other = server_identity("http://h:8000", replace(SETTINGS, tokens_per_step=4, draft_steps=3), metrics(2000.0))
    assert changes(a, other)[1] == "other settings: tokens_per_step 8 -> 4, draft_steps 7 -> 3"
    sglang = ServerSettings(engine="sglang", raw={"server_info": {"startup_time": {"scheduler_e2e": 66.7},
                                                                  "random_seed": 118658895}})
    again = ServerSettings(engine="sglang", raw={"server_info": {"startup_time": {"scheduler_e2e": 70.1},
                                                                 "random_seed": 5}})
    assert changes(server_identity("http://g:30000", sglang), server_identity("http://g:30000", again)) == ["restarted"]


def test_the_run_records_which_notebook_saw_which_server(tmp_path: Path, capsys) -> None:
    run = Run.create(tmp_path / "run")
    assert nb.note_server(run, "00_snapshot", FakeClient("http://h:8000", 1000.0), SETTINGS) == []
    assert nb.note_server(run, "01_baseline_sweep", FakeClient("http://h:8000", 1000.0), SETTINGS) == []
    lines = nb.note_server(Run.open(run.path), "04_commit_probe", FakeClient("http://h:8000", 2000.0), SETTINGS)
    assert lines == ["04_commit_probe sees another server than 00_snapshot, 01_baseline_sweep saw: restarted "
                     "(started 1000 -> 2000, Unix time)"]
    assert "note: 04_commit_probe sees another server" in capsys.readouterr().out
    meta = Run.open(run.path).meta
    assert meta["server_changes"] == {"04_commit_probe": lines} and set(meta["servers_seen"]) == {
        "00_snapshot", "01_baseline_sweep", "04_commit_probe"}
    f = servers_finding(meta["servers_seen"])
    assert f.severity == "warning" and f.numbers["notebooks_by_server"] == [["00_snapshot", "01_baseline_sweep"],
                                                                           ["04_commit_probe"]]
    assert "restarted" in f.verdict and "started 1970-01-01 00:16:40 UTC" in f.evidence[0]
    assert [d["id"] for d in run_findings(meta, [])] == ["run.servers"]


def test_one_server_throughout_is_ok() -> None:
    ident = server_identity("http://h:8000", SETTINGS, metrics(1000.0))
    f = servers_finding({"00_snapshot": ident, "01_baseline_sweep": ident})
    assert f.severity == "ok" and f.numbers["servers"] == 1
    assert servers_finding({}) is None


def test_the_run_says_how_much_of_it_was_disturbed() -> None:
    found = [{"id": "sweep.other_traffic", "notebook": "01_baseline_sweep", "verdict": "v1",
              "numbers": {"requests": 4, "disturbed": 1, "clean": 3, "unknown": 0, "unreliable_commit": 1,
                          "foreign_tokens_between": 100.0}},
             {"id": "probe.other_traffic", "notebook": "04_commit_probe", "verdict": "v2",
              "numbers": {"requests": 4, "disturbed": 0, "clean": 4, "unknown": 0, "unreliable_commit": 0}}]
    f = traffic_overall(found)
    assert f.severity == "warning" and f.numbers["disturbed"] == 1 and f.numbers["checked"] == 8
    assert "1 of 8 checked requests (12%)" in f.verdict and "100 tokens for others" in f.verdict
    assert traffic_overall([]) is None
