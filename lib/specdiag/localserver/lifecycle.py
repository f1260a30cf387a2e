"""Starting and stopping the embedded server as a child process (the pattern of sglang/utils.py:
reserve a free port, wait for readiness, always end the process tree; the process handling itself is
:mod:`specdiag.process`, shared with the real engines' launchers).

- ``EmbeddedServer``: a context manager for one server owned by the caller.
- ``ensure_running()``: reuse the server recorded in ``data/runs/.embedded-server.json`` while it
  answers with the wanted settings, else start a detached one and record it; returns its URL.
- ``stop_recorded()``: stop the recorded server (only if its pid still runs specdiag.localserver).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, Sequence

from specdiag.localserver.config import DEFAULT_DRAFTER, DEFAULT_TARGET, MODEL_HINT
from specdiag.paths import PROJECT_ROOT, RUNS_DIR
from specdiag.process import DEFAULT_HOST, EngineStartError, ManagedServer, end_process_group, url_answers

RECORD_PATH = RUNS_DIR / ".embedded-server.json"
RECORD_LOG_PATH = RUNS_DIR / ".embedded-server.log"
HOST = DEFAULT_HOST

__all__ = ["EmbeddedServer", "EmbeddedServerError", "answers", "ensure_running", "stop_recorded"]


class EmbeddedServerError(EngineStartError):
    """The embedded server could not start; the message says why and ends with its log's last lines."""


def answers(url: str, timeout_s: float = 2.0) -> bool:
    """True when ``url``/health returns 200."""
    return url_answers(url + "/health", timeout_s)


def _get_json(url: str, timeout_s: float) -> Any:
    with urllib.request.urlopen(url, timeout=timeout_s) as resp:  # noqa: S310 - local URL
        return json.loads(resp.read().decode())


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


class EmbeddedServer:
    """One embedded server process: ``with EmbeddedServer("NGRAM", 8) as s: use(s.url)``.

    The process handling (own session, log, readiness on /health, ending the group) is
    ``specdiag.process.ManagedServer``'s; this class adds the model checks and the command."""

    def __init__(
        self,
        algorithm: str = "STANDALONE",
        num_draft_tokens: int | None = 8,
        port: int | None = None,
        device: str = "auto",
        log_path: Path | str | None = None,
        extra_args: Sequence[str] = (),
        model_path: Path | str | None = None,
        draft_model_path: Path | str | None = None,
        progress: bool = False,
        startup_timeout_s: float = 300.0,
        die_with_parent: bool = True,
        dflash_block_size: int | None = None,
        draft_window_size: int | None = None,
    ) -> None:
        self.algorithm = algorithm.upper()
        # DFLASH: None leaves the block to --speculative-dflash-block-size or the drafter's block_size
        self.num_draft_tokens = 8 if num_draft_tokens is None and self.algorithm != "DFLASH" else num_draft_tokens
        self.dflash_block_size = dflash_block_size
        self.draft_window_size = draft_window_size
        self.port = port or None
        self.device = device
        self.log_path = Path(log_path) if log_path is not None else None
        self.extra_args = tuple(extra_args)
        self.model_path = Path(model_path) if model_path is not None else DEFAULT_TARGET
        self.draft_model_path = (Path(draft_model_path) if draft_model_path is not None
                                 else None if self.algorithm == "DFLASH" else DEFAULT_DRAFTER)
        self.progress = progress
        self.startup_timeout_s = startup_timeout_s
        self.die_with_parent = die_with_parent
        self.managed: ManagedServer | None = None

    @property
    def url(self) -> str:
        if self.port is None:
            raise EmbeddedServerError("the server has no port yet: call start() first")
        return f"http://{HOST}:{self.port}"

    @property
    def process(self) -> subprocess.Popen[bytes] | None:
        return self.managed.process if self.managed is not None else None

    @property
    def ready_after_s(self) -> float | None:
        """Seconds from start until /health answered (measured)."""
        return self.managed.ready_after_s if self.managed is not None else None

    def command(self, port: int | None = None) -> list[str]:
        cmd = [
            sys.executable, "-m", "specdiag.localserver",
            "--host", HOST, "--port", str(self.port if port is None else port),
            "--model-path", str(self.model_path),
            "--speculative-algorithm", self.algorithm,
            "--device", self.device,
        ]
        if self.num_draft_tokens is not None:
            cmd += ["--speculative-num-draft-tokens", str(self.num_draft_tokens)]
        if self.algorithm in ("STANDALONE", "DFLASH") and self.draft_model_path is not None:
            cmd += ["--speculative-draft-model-path", str(self.draft_model_path)]
        for flag, value in (("--speculative-dflash-block-size", self.dflash_block_size),
                            ("--speculative-draft-window-size", self.draft_window_size)):
            if value is not None:
                cmd += [flag, str(value)]
        return cmd + list(self.extra_args)

    def _check_dflash(self) -> None:
        """Before the process starts: the drafter (the default one made now when none was given) fits the target,
        and the block size and window agree (specdiag.geometry.dflash); EmbeddedServerError naming the fix."""
        from specdiag.geometry.dflash import DFlashConfigError, check_dflash_launch  # noqa: PLC0415
        from specdiag.localserver.dflash_drafter import default_dflash_drafter  # noqa: PLC0415

        if self.draft_model_path is None:
            self.draft_model_path = default_dflash_drafter(self.model_path)
        if not self.draft_model_path.is_dir():
            raise EmbeddedServerError(f"no DFlash drafter at {self.draft_model_path}: give a DFlashDraftModel folder "
                                      "(python data/models/make_dflash_drafter.py --target TARGET --out DIR)")
        try:
            check_dflash_launch(self.draft_model_path, self.model_path, self.dflash_block_size,
                                self.num_draft_tokens, self.draft_window_size)
        except DFlashConfigError as exc:
            raise EmbeddedServerError(str(exc)) from None

    def start(self, timeout_s: float | None = None) -> "EmbeddedServer":
        """Start the process and wait until /health answers (within ``timeout_s``, default
        ``startup_timeout_s``); on failure the process is ended."""
        timeout_s = self.startup_timeout_s if timeout_s is None else timeout_s
        if not self.model_path.is_dir():
            raise EmbeddedServerError(f"no model at {self.model_path}: {MODEL_HINT}")
        if self.algorithm == "STANDALONE" and not (self.draft_model_path and self.draft_model_path.is_dir()):
            raise EmbeddedServerError(f"no drafter at {self.draft_model_path}: {MODEL_HINT}")
        if self.algorithm == "DFLASH":
            self._check_dflash()
        lib = str(PROJECT_ROOT / "lib")
        pythonpath = lib + (os.pathsep + os.environ["PYTHONPATH"] if os.environ.get("PYTHONPATH") else "")
        self.managed = ManagedServer(
            self.command, name="the embedded server", host=HOST, port=self.port or 0, ready_path="/health",
            env={"PYTHONPATH": pythonpath, "HF_HUB_OFFLINE": os.environ.get("HF_HUB_OFFLINE", "1")},
            cwd=PROJECT_ROOT, log_path=self.log_path, startup_timeout_s=timeout_s, probe_timeout_s=1.0,
            poll_interval_s=0.2, progress=self.progress, die_with_parent=self.die_with_parent,
        )
        self.managed.launch()
        self.port = self.managed.port
        self.log_path = self.managed.log_path
        try:
            self.managed.wait_ready(timeout_s)
        except EngineStartError as exc:
            self.managed.stop()
            raise EmbeddedServerError(str(exc), exc.log_tail, exc.log_path, exc.returncode) from exc
        except BaseException:
            self.managed.stop()
            raise
        return self

    def wait(self) -> int:
        """Block until the server exits by itself; its exit code."""
        if self.managed is None:
            raise EmbeddedServerError("the server was not started: call start() first")
        return self.managed.wait()

    def stop(self, timeout_s: float = 10.0) -> None:
        """End the server's whole process group (idempotent)."""
        if self.managed is not None:
            self.managed.stop(timeout_s)

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
                            model_path=model_path, draft_model_path=draft_model_path, die_with_parent=False)
    server.start(timeout_s)
    # detached: the caller does not stop it; stop_recorded() (or `make clean`) does
    assert server.managed is not None and server.process is not None
    server.managed.detach()
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
        end_process_group(record["pid"], timeout_s)
        stopped = True
    try:
        record_path.unlink()
    except FileNotFoundError:
        pass
    return stopped

