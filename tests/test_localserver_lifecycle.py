"""EmbeddedServer / ensure_running / stop_recorded with a real uvicorn process on tiny models:
free port, readiness, reuse, and the whole process group ended afterwards."""

from __future__ import annotations

import json
import os
import urllib.request
from pathlib import Path

import pytest

from specdiag.localserver import EmbeddedServer, EmbeddedServerError, ensure_running, stop_recorded
from specdiag.localserver.lifecycle import answers

pytest.importorskip("torch")


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.fixture(scope="module")
def tiny():
    from specdiag.localserver.tiny import cached_tiny_models

    return cached_tiny_models()


def get_json(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=30) as resp:
        return json.loads(resp.read())


@pytest.mark.slow
def test_embedded_server_starts_answers_and_ends_its_process_group(tiny, tmp_path: Path):
    log = tmp_path / "server.log"
    server = EmbeddedServer("NGRAM", 4, device="cpu", log_path=log, model_path=tiny.clone_target)
    with server:
        assert server.url.startswith("http://127.0.0.1:")
        info = get_json(server.url + "/server_info")
        assert info["speculative_algorithm"] == "NGRAM" and info["speculative_num_draft_tokens"] == 4
        body = json.dumps({"text": "The cat sat on the mat.", "sampling_params": {"max_new_tokens": 5}}).encode()
        req = urllib.request.Request(server.url + "/generate", data=body, method="POST")
        with urllib.request.urlopen(req, timeout=60) as resp:
            assert json.loads(resp.read())["meta_info"]["completion_tokens"] == 5
        pid = server.process.pid
        assert group_alive(pid)
    assert not group_alive(pid)
    assert not answers(server.url, timeout_s=0.5)
    assert "listening on" in log.read_text()


def test_missing_model_fails_before_starting(tmp_path: Path):
    with pytest.raises(EmbeddedServerError, match="no model at"):
        EmbeddedServer("NONE", model_path=tmp_path / "nothing").start()


def test_a_server_that_exits_early_is_reported_with_its_log(tiny, tmp_path: Path):
    log = tmp_path / "server.log"
    # the drafter folder exists but is not a model: the server exits with a message
    bad = EmbeddedServer("STANDALONE", 4, device="cpu", log_path=log, model_path=tiny.clone_target,
                         draft_model_path=tmp_path)
    with pytest.raises(EmbeddedServerError, match="exited with code 2"):
        bad.start(timeout_s=120)
    assert "config.json" in log.read_text()


@pytest.mark.slow
def test_ensure_running_reuses_then_stop_recorded_ends_it(tiny, tmp_path: Path):
    record = tmp_path / "embedded.json"
    kw = dict(device="cpu", record_path=record, log_path=tmp_path / "server.log", model_path=tiny.clone_target)
    try:
        url = ensure_running("NGRAM", 4, **kw)
        pid = json.loads(record.read_text())["pid"]
        assert answers(url) and group_alive(pid)
        assert ensure_running("NGRAM", 4, **kw) == url  # reused, not restarted
        assert json.loads(record.read_text())["pid"] == pid
    finally:
        stopped = stop_recorded(record)
    assert stopped and not record.exists()
    assert not group_alive(pid) and not answers(url, timeout_s=0.5)
    assert stop_recorded(record) is False
