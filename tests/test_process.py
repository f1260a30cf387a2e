"""ManagedServer against a fake engine (tests/fake_engine_server.py): readiness after a delay, a
server that dies at start, a timeout, a server that ignores SIGTERM; the log's tail in the error,
and no process of the tree left afterwards."""

from __future__ import annotations

import os
import re
import sys
import time
from pathlib import Path

import pytest

from specdiag.process import (
    LOG_TAIL_LINES,
    EngineStartError,
    ManagedServer,
    end_process_group,
    free_port,
    group_alive,
    log_tail,
    redacted_command,
    url_answers,
)

FAKE = Path(__file__).parent / "fake_engine_server.py"


def fake(*flags: str):
    return lambda port: [sys.executable, str(FAKE), "--port", str(port), *flags]


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie (exited, not yet reaped by its new parent) counts as gone
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    except OSError:
        return True


def child_pid(log: Path) -> int:
    match = re.search(r"child pid (\d+)", log.read_text())
    assert match, log.read_text()
    return int(match.group(1))


def test_waits_for_readiness_then_ends_the_whole_tree(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    log = tmp_path / "server.log"
    server = ManagedServer(fake("--delay", "1.5", "--child"), name="fake engine", log_path=log,
                           env={"FAKE_ENGINE_MARK": "xyz"}, startup_timeout_s=60, poll_interval_s=0.1)
    with server:
        assert server.port > 0 and server.url == f"http://127.0.0.1:{server.port}"
        assert url_answers(server.ready_url)
        assert server.ready_after_s is not None and server.ready_after_s >= 1.4  # it waited for the delay
        pgid, child = server.pid, child_pid(log)
        assert group_alive(pgid) and pid_alive(child)
    assert not group_alive(pgid) and not pid_alive(child)
    assert not url_answers(server.ready_url, timeout_s=0.5)
    text = log.read_text()
    assert text.startswith("[specdiag] starting fake engine: ") and "FAKE_ENGINE_MARK=xyz" in text
    err = capsys.readouterr().err  # the progress line: elapsed time and the log's last line
    assert "waiting for fake engine at http://127.0.0.1:" in err and "[specdiag] starting fake engine" in err


def test_a_server_that_dies_at_start_fails_fast_with_its_log(tmp_path: Path):
    log = tmp_path / "server.log"
    server = ManagedServer(fake("--die-at-start", "--child"), name="fake engine", log_path=log,
                           startup_timeout_s=60, progress=False)
    t0 = time.monotonic()
    with pytest.raises(EngineStartError, match="fake engine exited with code 3") as info:
        server.start()
    assert time.monotonic() - t0 < 30
    assert "CUDA out of memory" in str(info.value) and "CUDA out of memory" in info.value.log_tail
    assert info.value.returncode == 3 and info.value.log_path == log
    # the leader died first; the child it left behind was ended with the group
    assert not group_alive(server.pid) and not pid_alive(child_pid(log))


def test_timeout_stops_the_server_and_shows_the_log(tmp_path: Path):
    log = tmp_path / "server.log"
    server = ManagedServer(fake("--delay", "600", "--child"), name="fake engine", log_path=log,
                           startup_timeout_s=1.5, progress=False, poll_interval_s=0.1)
    with pytest.raises(EngineStartError, match="did not answer .*/health_generate within 2 s") as info:
        server.start()
    assert info.value.returncode is None and "ready in 600.0 s" in info.value.log_tail
    assert not group_alive(server.pid) and not pid_alive(child_pid(log))


def test_a_server_ignoring_sigterm_is_killed_after_the_grace_period(tmp_path: Path):
    server = ManagedServer(fake("--ignore-sigterm"), ready_path="health", log_path=tmp_path / "s.log",
                           stop_grace_s=0.5, progress=False, startup_timeout_s=60)
    server.start()
    pgid = server.pid
    t0 = time.monotonic()
    server.stop()
    assert not group_alive(pgid) and time.monotonic() - t0 < 5
    server.stop()  # idempotent


def test_without_a_log_path_a_temporary_log_is_used_and_removed(tmp_path: Path):
    server = ManagedServer(fake(), port=free_port(), progress=False, startup_timeout_s=60)
    with server:
        assert server.log_path is not None and server.log_path.is_file()
    assert not server.log_path.exists()
    failing = ManagedServer(fake("--die-at-start"), progress=False)
    with pytest.raises(EngineStartError) as info:
        failing.start()
    assert info.value.log_path is not None and info.value.log_path.is_file()  # kept: the error names it
    info.value.log_path.unlink()


def test_a_command_that_cannot_start_is_an_engine_start_error(tmp_path: Path):
    with pytest.raises(EngineStartError, match="cannot start"):
        ManagedServer([str(tmp_path / "no-such-program")], log_path=tmp_path / "s.log", progress=False).start()


def test_log_tail_keeps_the_last_lines(tmp_path: Path):
    log = tmp_path / "x.log"
    log.write_text("".join(f"line {i}\n" for i in range(100)))
    tail = log_tail(log).splitlines()
    assert len(tail) == LOG_TAIL_LINES == 40 and tail[0] == "line 60" and tail[-1] == "line 99"
    assert log_tail(tmp_path / "missing.log") == ""


def test_redacted_command_hides_secret_values():
    cmd = ["python", "-m", "x", "--api-key", "s3cret", "--hf-token=abc", "--port", "1", "--model-path", "m",
           "--speculative-num-draft-tokens", "8"]
    assert redacted_command(cmd) == ["python", "-m", "x", "--api-key", "<redacted>", "--hf-token=<redacted>",
                                     "--port", "1", "--model-path", "m", "--speculative-num-draft-tokens", "8"]


def test_progress_without_tqdm_prints_plain_lines(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                  capsys: pytest.CaptureFixture[str]):
    monkeypatch.setitem(sys.modules, "tqdm", None)  # a bare GPU host's Python may lack tqdm
    with ManagedServer(fake("--delay", "0.5"), name="fake engine", log_path=tmp_path / "s.log",
                       startup_timeout_s=60) as server:
        assert url_answers(server.ready_url)
    assert re.search(r"waiting for fake engine at \S+: \d+ s, \[specdiag\] starting fake engine", capsys.readouterr().err)


def test_the_engine_is_ended_when_its_parent_is_killed(tmp_path: Path):
    """A parent killed with SIGKILL runs no cleanup: the engine still gets SIGTERM (PR_SET_PDEATHSIG)."""
    if not sys.platform.startswith("linux"):
        pytest.skip("PR_SET_PDEATHSIG is Linux only")
    import signal
    import subprocess

    log, port = tmp_path / "s.log", free_port()
    parent = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; from specdiag.process import ManagedServer; "
         f"s = ManagedServer([sys.executable, {str(FAKE)!r}, '--port', '{port}'], port={port}, ready_path='/health', "
         f"log_path={str(log)!r}, progress=False, startup_timeout_s=30).start(); print(s.pid, flush=True); "
         "time.sleep(120)"],
        stdout=subprocess.PIPE, text=True)
    pid = None
    try:
        line = parent.stdout.readline()
        assert line.strip().isdigit(), (line, log.read_text() if log.exists() else "")
        pid = int(line)
        assert group_alive(pid)
        parent.send_signal(signal.SIGKILL)
        parent.wait(timeout=10)
        deadline = time.monotonic() + 10
        while pid_alive(pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not pid_alive(pid)
    finally:
        parent.kill()
        if pid is not None:
            end_process_group(pid, 1.0)  # when the assertion failed: leave nothing behind
