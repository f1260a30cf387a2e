"""One reachability check per report run (specdiag.serving.reach): the report checks the server once and
tells its notebooks (SPECDIAG_SERVER_REACHED), and nb.start then makes its client without checking again;
outside a report run nb.start checks itself."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import specdiag.serving as serving
from specdiag import nb, report
from specdiag.serving.clients import REACHED_ENV, reached, reached_engine


class FakeClient:
    def __init__(self, url: str, engine: str) -> None:
        self.base_url, self.engine = url, engine

    def settings(self):
        from specdiag.serving.settings import settings_from_sglang

        return settings_from_sglang({"context_length": 4096})


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> list[tuple]:
    seen: list[tuple] = []

    def reach(url: str, engine: str = "auto", **kw):
        seen.append(("reach", url, engine))
        return FakeClient(url, "sglang" if engine in ("auto", "embedded") else engine)

    def make_client(url: str, engine: str = "auto", **kw):
        seen.append(("make_client", url, engine))
        return FakeClient(url, engine)

    monkeypatch.setattr(serving, "reach", reach)
    monkeypatch.setattr(serving, "make_client", make_client)
    monkeypatch.delenv(REACHED_ENV, raising=False)
    return seen


def test_reached_is_told_for_the_same_url_only_and_undone_afterwards(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(REACHED_ENV, raising=False)
    with reached(FakeClient("http://h:1/", "vllm")):
        assert os.environ[REACHED_ENV] == "vllm http://h:1/"
        assert reached_engine("http://h:1") == "vllm" and reached_engine("http://h:2") is None
    assert REACHED_ENV not in os.environ and reached_engine("http://h:1") is None


def test_a_report_run_checks_once_and_its_notebooks_do_not_repeat_it(tmp_path: Path, calls: list[tuple],
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    def run_notebooks(notebooks, run, shared, params_file):  # each notebook starts as nb.start does
        for name in notebooks:
            ctx = nb.start(name, shared["server_url"], shared["run_dir"])
            assert ctx.client.engine == "sglang"
        return []

    monkeypatch.setattr(report.commands, "run_notebooks", run_notebooks)  # where cmd_run looks them up
    monkeypatch.setattr(report.commands, "finish", lambda run, results: 0)
    code = report.main(["run", "--server", "http://h:1", "--run-dir", str(tmp_path / "run"),
                        "--notebooks", "01_baseline_sweep", "04_commit_probe"])
    assert code == 0
    assert calls == [("reach", "http://h:1", "auto"), ("make_client", "http://h:1", "sglang"),
                     ("make_client", "http://h:1", "sglang")]
    assert REACHED_ENV not in os.environ


def test_a_notebook_outside_a_report_run_checks_itself(tmp_path: Path, calls: list[tuple]) -> None:
    ctx = nb.start("01_baseline_sweep", "http://h:1", str(tmp_path / "run"))
    assert calls == [("reach", "http://h:1", "auto")] and ctx.client.base_url == "http://h:1"
