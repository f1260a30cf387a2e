"""Starting and stopping the embedded server as a child process (the pattern of sglang/utils.py:
reserve a free port, wait for readiness, always end the process tree).

- ``EmbeddedServer``: a context manager for one server owned by the caller.
- ``ensure_running()``: reuse the server recorded in ``data/runs/.embedded-server.json`` while it
  answers with the wanted settings, else start a detached one and record it; returns its URL.
- ``stop_recorded()``: stop the recorded server (only if its pid still runs specdiag.localserver).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import IO, Any, Sequence

from specdiag.localserver.config import DEFAULT_DRAFTER, DEFAULT_TARGET, MODEL_HINT
from specdiag.paths import PROJECT_ROOT, RUNS_DIR

RECORD_PATH = RUNS_DIR / ".embedded-server.json"
RECORD_LOG_PATH = RUNS_DIR / ".embedded-server.log"
HOST = "127.0.0.1"


class EmbeddedServerError(RuntimeError):
    """The embedded server could not start; the message says why and where its log is."""


def free_port(host: str = HOST) -> int:
    """A TCP port that was free a moment ago (bind to port 0 and release it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def _get_json(url: str, timeout_s: float) -> Any:
    with urllib.request.urlopen(url, timeout=timeout_s) as resp:  # noqa: S310 - local URL
        return json.loads(resp.read().decode())


def answers(url: str, timeout_s: float = 2.0) -> bool:
    """True when ``url``/health returns 200."""
    try:
        with urllib.request.urlopen(url + "/health", timeout=timeout_s) as resp:  # noqa: S310
            return resp.status == 200
    except (urllib.error.URLError, OSError, ValueError):
        return False


def _tail(path: Path | None, n_chars: int = 3000) -> str:
    if path is None or not path.is_file():
        return ""
    return path.read_text(errors="replace")[-n_chars:]


def _is_our_server(pid: int) -> bool:
    """True when ``pid`` is alive and runs ``specdiag.localserver`` (never signal anything else)."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        try:
            os.kill(pid, 0)
        except OSError:
            return False
        return False  # alive but unverifiable (no /proc): leave it alone
    return "specdiag.localserver" in cmdline


def _end_group(pid: int, timeout_s: float) -> None:
    """SIGTERM the process group led by ``pid`` (started with start_new_session), then SIGKILL."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(pid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                os.killpg(pid, 0)
            except ProcessLookupError:
                return
            try:  # reap it if it is our child, or a zombie leader keeps the group "alive"
                os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                pass
            time.sleep(0.05)


class EmbeddedServer:
    """One embedded server process: ``with EmbeddedServer("NGRAM", 8) as s: use(s.url)``."""

    def __init__(
        self,
        algorithm: str = "STANDALONE",
        num_draft_tokens: int = 8,
        port: int | None = None,
        device: str = "auto",
        log_path: Path | str | None = None,
        extra_args: Sequence[str] = (),
        model_path: Path | str | None = None,
        draft_model_path: Path | str | None = None,
    ) -> None:
        self.algorithm = algorithm.upper()
        self.num_draft_tokens = num_draft_tokens
        self.port = port
        self.device = device
        self.log_path = Path(log_path) if log_path is not None else None
        self.extra_args = tuple(extra_args)
        self.model_path = Path(model_path) if model_path is not None else DEFAULT_TARGET
        self.draft_model_path = Path(draft_model_path) if draft_model_path is not None else DEFAULT_DRAFTER
        self.process: subprocess.Popen[bytes] | None = None
        self._log_file: IO[bytes] | None = None

    @property
    def url(self) -> str:
        if self.port is None:
            raise EmbeddedServerError("the server has no port yet: call start() first")
        return f"http://{HOST}:{self.port}"

    def command(self) -> list[str]:
        cmd = [
            sys.executable, "-m", "specdiag.localserver",
            "--host", HOST, "--port", str(self.port),
            "--model-path", str(self.model_path),
            "--speculative-algorithm", self.algorithm,
            "--speculative-num-draft-tokens", str(self.num_draft_tokens),
            "--device", self.device,
        ]
        if self.algorithm == "STANDALONE":
            cmd += ["--speculative-draft-model-path", str(self.draft_model_path)]
        return cmd + list(self.extra_args)

    def start(self, timeout_s: float = 300.0) -> "EmbeddedServer":
        """Start the process and wait until /health answers; on failure the process is ended."""
        if not self.model_path.is_dir():
            raise EmbeddedServerError(f"no model at {self.model_path}: {MODEL_HINT}")
        if self.algorithm == "STANDALONE" and not self.draft_model_path.is_dir():
            raise EmbeddedServerError(f"no drafter at {self.draft_model_path}: {MODEL_HINT}")
        if self.port is None:
            self.port = free_port()
        env = dict(os.environ)
        lib = str(PROJECT_ROOT / "lib")
        env["PYTHONPATH"] = lib + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        env.setdefault("HF_HUB_OFFLINE", "1")
        if self.log_path is not None:
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
            self._log_file = open(self.log_path, "ab")  # noqa: SIM115 - closed in stop()
            out: Any = self._log_file
        else:
            out = subprocess.DEVNULL
        self.process = subprocess.Popen(  # noqa: S603 - our own module, fixed arguments
            self.command(), stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
            cwd=str(PROJECT_ROOT), start_new_session=True,
        )
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            code = self.process.poll()
            if code is not None:
                self.stop()
                raise EmbeddedServerError(
                    f"the embedded server exited with code {code} before answering"
                    + (f"; log {self.log_path}:\n{_tail(self.log_path)}" if self.log_path else
                       " (pass log_path to see why)")
                )
            if answers(self.url, timeout_s=1.0):
                return self
            time.sleep(0.2)
        self.stop()
        raise EmbeddedServerError(f"the embedded server did not answer {self.url}/health within {timeout_s:.0f} s"
                                  + (f"; log {self.log_path}" if self.log_path else ""))

    def stop(self, timeout_s: float = 10.0) -> None:
        """End the server's whole process group (idempotent)."""
        if self.process is not None:
            if self.process.poll() is None:
                _end_group(self.process.pid, timeout_s)
            try:
                self.process.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                pass
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None

    def __enter__(self) -> "EmbeddedServer":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _read_record(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _matches(url: str, algorithm: str, num_draft_tokens: int) -> bool:
    try:
        info = _get_json(url + "/server_info", timeout_s=5.0)
    except (urllib.error.URLError, OSError, ValueError):
        return False
    running = info.get("speculative_algorithm") or "NONE"
    if running != algorithm:
        return False
    return algorithm == "NONE" or info.get("speculative_num_draft_tokens") == num_draft_tokens


def ensure_running(
    algorithm: str = "STANDALONE",
    num_draft_tokens: int = 8,
    device: str = "auto",
    timeout_s: float = 300.0,
    record_path: Path = RECORD_PATH,
    log_path: Path = RECORD_LOG_PATH,
    extra_args: Sequence[str] = (),
    model_path: Path | str | None = None,
    draft_model_path: Path | str | None = None,
) -> str:
    """URL of a running embedded server with these settings, started (detached) if needed.

    A recorded server that answers but runs another algorithm or draft-token count is stopped
    and replaced. The new server's log goes to ``log_path``.
    """
    algorithm = algorithm.upper()
    record = _read_record(record_path)
    if record:
        url = str(record.get("url", ""))
        if url and answers(url) and _matches(url, algorithm, num_draft_tokens):
            return url
        stop_recorded(record_path)
    server = EmbeddedServer(algorithm, num_draft_tokens, device=device, log_path=log_path, extra_args=extra_args,
                            model_path=model_path, draft_model_path=draft_model_path)
    server.start(timeout_s)
    # detached: the caller does not stop it; stop_recorded() (or `make clean`) does
    if server._log_file is not None:
        server._log_file.close()
        server._log_file = None
    assert server.process is not None
    record_path.parent.mkdir(parents=True, exist_ok=True)
    record_path.write_text(json.dumps({
        "url": server.url,
        "pid": server.process.pid,
        "algorithm": algorithm,
        "num_draft_tokens": num_draft_tokens,
        "device": device,
        "log_path": str(log_path),
        "command": server.command(),
        "started_unix_s": time.time(),
    }, indent=2))
    return server.url


def stop_recorded(record_path: Path = RECORD_PATH, timeout_s: float = 10.0) -> bool:
    """Stop the server recorded by ensure_running (if it still runs) and forget it; True if one was stopped."""
    record = _read_record(record_path)
    stopped = False
    if record and isinstance(record.get("pid"), int) and _is_our_server(record["pid"]):
        _end_group(record["pid"], timeout_s)
        stopped = True
    try:
        record_path.unlink()
    except FileNotFoundError:
        pass
    return stopped

