"""One engine process owned by the caller: free port, own process session, log file, readiness, stop.

The pattern of sglang/utils.py (launch_server_cmd / wait_for_server / terminate_process), for any
engine command (the engine launchers of :mod:`specdiag.launchers` and the embedded server of
:mod:`specdiag.localserver` both start theirs here)::

    with ManagedServer(lambda port: ["python", "-m", "x", "--port", str(port)],
                       ready_path="/health_generate", log_path="server.log") as server:
        use(server.url)

- The command starts in its own session (``start_new_session``), so its whole process tree is one
  process group: stopping sends SIGTERM to the group, then SIGKILL after ``stop_grace_s``, and waits
  until the group is gone, also when the leader died first and left children behind.
- Readiness: ``GET url + ready_path`` answering 200. While waiting, a tqdm line on stderr shows the
  elapsed seconds and the server's last log line (where stderr is no terminal: a whole line every 15 s).
- Failure to start (the process exits, or ``startup_timeout_s`` passes) stops the group and raises
  ``EngineStartError`` carrying the last lines of the server's log. Ctrl-C while starting also stops it.
- ``start()`` is ``launch()`` then ``wait_ready()``: to start several servers at once, launch() each,
  then wait_ready() each (and stop() each in a ``finally``).
"""

from __future__ import annotations

import http.client
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections import deque
from pathlib import Path
from typing import IO, Any, Callable, Mapping, Sequence

DEFAULT_HOST = "127.0.0.1"
#: Lines of the server's log an EngineStartError carries.
LOG_TAIL_LINES = 40

CommandSpec = Sequence[str] | Callable[[int], Sequence[str]]


class EngineStartError(RuntimeError):
    """An engine did not become ready. ``log_tail`` holds the last lines of its log, ``log_path`` the
    whole log, ``returncode`` the exit status when the process died (None on a timeout)."""

    def __init__(self, message: str, log_tail: str = "", log_path: Path | None = None,
                 returncode: int | None = None) -> None:
        super().__init__(message)
        self.log_tail = log_tail
        self.log_path = log_path
        self.returncode = returncode


def free_port(host: str = DEFAULT_HOST) -> int:
    """A TCP port that was free a moment ago (bind to port 0 and release it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def url_answers(url: str, timeout_s: float = 2.0, headers: Mapping[str, str] | None = None) -> bool:
    """True when GET ``url`` (with ``headers``, e.g. the API key of a guarded endpoint) returns 200 within
    ``timeout_s``."""
    try:
        request = urllib.request.Request(url, headers=dict(headers or {}))
        with urllib.request.urlopen(request, timeout=timeout_s) as resp:  # noqa: S310 - local URL
            return resp.status == 200
    except (urllib.error.URLError, OSError, ValueError, http.client.HTTPException):
        # HTTPException: a half-started server (or another process on a recycled port) that sends a
        # malformed status line is 'not ready yet', not a crash of the wait loop.
        return False


def log_tail(path: Path | str | None, n_lines: int = LOG_TAIL_LINES) -> str:
    """The last ``n_lines`` lines of a log file ('' when there is none)."""
    if path is None or not Path(path).is_file():
        return ""
    with open(path, errors="replace") as f:
        return "".join(deque(f, maxlen=n_lines)).rstrip("\n")


def last_log_line(path: Path | str | None, max_chars: int = 90) -> str:
    """The last non-empty line of a log (progress bars' carriage returns split lines too), shortened."""
    if path is None:
        return ""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 4096))
            chunk = f.read().decode(errors="replace")
    except OSError:
        return ""
    lines = [ln.strip() for ln in chunk.replace("\r", "\n").split("\n") if ln.strip()]
    line = lines[-1] if lines else ""
    return line if len(line) <= max_chars else line[: max_chars - 3] + "..."


_SECRET_FLAG = re.compile(r"(?:^|[-_])(?:key|token|secret|password)(?:$|[-_])", re.IGNORECASE)


def redacted_command(command: Sequence[str]) -> list[str]:
    """``command`` with the values of secret-looking flags (``--api-key X``, ``--hf-token=X``) replaced
    by ``<redacted>``, for logs and run folders."""
    out: list[str] = []
    hide_next = False
    for arg in map(str, command):
        if hide_next:
            out.append("<redacted>")
            hide_next = False
            continue
        name, eq, _ = arg.partition("=")
        secret = name.startswith("-") and bool(_SECRET_FLAG.search(name.lstrip("-")))
        if secret and eq:
            out.append(f"{name}=<redacted>")
        else:
            out.append(arg)
            hide_next = secret
    return out


def group_alive(pgid: int) -> bool:
    """True while any process of the process group ``pgid`` exists."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def end_process_group(pgid: int, grace_s: float = 10.0) -> None:
    """SIGTERM the process group ``pgid`` (a leader started with start_new_session), wait up to
    ``grace_s`` for it to go, then SIGKILL and wait again. Returns once the group is gone (or after
    the second wait)."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline:
            try:  # reap the leader if it is our child, or a zombie leader keeps the group "alive"
                os.waitpid(pgid, os.WNOHANG)
            except ChildProcessError:
                pass
            if not group_alive(pgid):
                return
            time.sleep(0.05)


def _pdeathsig_setter() -> Callable[[], None] | None:
    """A preexec_fn that asks Linux (prctl PR_SET_PDEATHSIG) to SIGTERM the child when the thread that
    started it dies, so a parent killed with SIGKILL does not leave the engine running (the engine then
    ends its own children, as SGLang does; stop() ends the whole group in every other case). The
    function is looked up here, in the parent, so the forked child only makes the call. None off Linux."""
    if sys.platform != "linux":
        return None
    import ctypes  # noqa: PLC0415

    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    sigterm = int(signal.SIGTERM)
    return lambda: prctl(1, sigterm, 0, 0, 0)  # 1 = PR_SET_PDEATHSIG


class _LineProgress:
    """The part of tqdm's interface wait_ready uses, printing whole lines (no tqdm installed)."""

    def __init__(self, desc: str) -> None:
        self.desc, self.t0, self.fp = desc, time.monotonic(), sys.stderr

    def set_postfix_str(self, text: str) -> None:
        print(f"{self.desc}: {time.monotonic() - self.t0:.0f} s, {text}", file=self.fp, flush=True)

    def close(self) -> None:
        pass


class ManagedServer:
    """An engine process started by this object and always ended by it (see the module docstring).

    ``command`` is the argument list, or a function of the port that returns it (for port=0, which
    picks a free port first). ``env`` is added to this process's environment. ``die_with_parent``
    (Linux): the engine gets SIGTERM if the thread that started it dies, even by SIGKILL; start it
    from a thread that lives as long as it should (the main thread), or pass False for a server meant
    to outlive this process. Without ``log_path`` the log goes to a temporary file, removed by stop()
    unless a failed start named it. After start(): ``url``, ``pid`` (= its process group),
    ``command``, ``ready_after_s`` (measured start-up time) and ``info`` (what the launcher knows).
    """

    def __init__(
        self,
        command: CommandSpec,
        *,
        name: str = "the server",
        host: str = DEFAULT_HOST,
        port: int = 0,
        ready_path: str = "/health_generate",
        env: Mapping[str, str] | None = None,
        cwd: Path | str | None = None,
        log_path: Path | str | None = None,
        startup_timeout_s: float = 600.0,
        stop_grace_s: float = 10.0,
        probe_timeout_s: float = 10.0,
        poll_interval_s: float = 0.5,
        progress: bool = True,
        die_with_parent: bool = True,
        info: Mapping[str, object] | None = None,
        ready_headers: Mapping[str, str] | None = None,
    ) -> None:
        self._command_spec = command
        self._ready_headers = dict(ready_headers or {})  # kept in memory only (an API key, for a guarded ready_path)
        self.name = name
        self.host = host
        self.port = port
        self.ready_path = ready_path if ready_path.startswith("/") else "/" + ready_path
        self.env = dict(env or {})
        self.cwd = Path(cwd) if cwd is not None else None
        self.log_path = Path(log_path) if log_path is not None else None
        self.startup_timeout_s = startup_timeout_s
        self.stop_grace_s = stop_grace_s
        self.probe_timeout_s = probe_timeout_s
        self.poll_interval_s = poll_interval_s
        self.progress = progress
        self.die_with_parent = die_with_parent
        self.info = dict(info or {})  # what the launcher knows about the engine (version, ...), for provenance
        self.command: list[str] = []
        self.process: subprocess.Popen[bytes] | None = None
        self.ready_after_s: float | None = None
        self._log_file: IO[bytes] | None = None
        self._stopped = False
        self._temp_log = False
        self._keep_log = False

    # --- addresses --------------------------------------------------------------------------
    @property
    def url(self) -> str:
        """``http://host:port`` (the port is known once start() has begun)."""
        if not self.port:
            raise EngineStartError(f"{self.name} has no port yet: call start() first")
        return f"http://{self.host}:{self.port}"

    @property
    def ready_url(self) -> str:
        return self.url + self.ready_path

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process is not None else None

    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    # --- start ------------------------------------------------------------------------------
    def _resolve_command(self) -> list[str]:
        spec = self._command_spec
        cmd = spec(self.port) if callable(spec) else spec
        return [str(a) for a in cmd]

    def launch(self) -> "ManagedServer":
        """Start the process (no waiting): pick the port, open the log, Popen in a new session."""
        if self.process is not None:
            raise EngineStartError(f"{self.name} was already started (pid {self.process.pid})")
        if not self.port:
            self.port = free_port(self.host)
        self.command = self._resolve_command()
        if self.log_path is None:
            fd, name = tempfile.mkstemp(prefix="specdiag-engine-", suffix=".log")
            os.close(fd)
            self.log_path = Path(name)
            self._temp_log = True  # removed by stop() unless a failed start names it
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log_file = open(self.log_path, "ab")  # noqa: SIM115 - closed in stop()/detach()
        self._log_file.write(f"[specdiag] starting {self.name}: {shlex.join(redacted_command(self.command))}\n"
                             .encode())
        self._log_file.flush()
        try:
            self.process = subprocess.Popen(  # noqa: S603 - the caller's engine command
                self.command, stdout=self._log_file, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                env={**os.environ, **self.env}, cwd=str(self.cwd) if self.cwd else None, start_new_session=True,
                preexec_fn=_pdeathsig_setter() if self.die_with_parent else None,
            )
        except OSError as exc:
            self._close_log()
            raise EngineStartError(f"cannot start {self.name} ({self.command[0]}): {exc}",
                                   log_path=self.log_path) from exc
        return self

    def wait_ready(self, timeout_s: float | None = None) -> "ManagedServer":
        """Poll the readiness URL until it answers 200; stop everything and raise on death or timeout."""
        assert self.process is not None, "launch() first"
        timeout_s = self.startup_timeout_s if timeout_s is None else timeout_s
        t0 = time.monotonic()
        bar = self._progress_bar()
        # a terminal redraws one line every second; a log file (no tty) gets a line every 15 s
        bar_every_s = 1.0 if bar is not None and getattr(bar.fp, "isatty", lambda: False)() else 15.0
        last_shown = -bar_every_s
        try:
            while True:
                elapsed = time.monotonic() - t0
                code = self.process.poll()
                if code is not None:
                    self._fail(f"{self.name} exited with code {code} before {self.ready_url} answered "
                               f"({elapsed:.0f} s after start)", returncode=code)
                if url_answers(self.ready_url, timeout_s=self.probe_timeout_s, headers=self._ready_headers):
                    self.ready_after_s = round(time.monotonic() - t0, 2)
                    return self
                if elapsed > timeout_s:
                    self._fail(f"{self.name} did not answer {self.ready_url} within {timeout_s:.0f} s; "
                               f"raise the start-up timeout if the engine is only slow")
                if bar is not None and time.monotonic() - last_shown >= bar_every_s:
                    bar.set_postfix_str(last_log_line(self.log_path))  # redraws: elapsed time and the line
                    last_shown = time.monotonic()
                time.sleep(self.poll_interval_s)
        finally:
            if bar is not None:
                bar.close()

    def start(self, timeout_s: float | None = None) -> "ManagedServer":
        """launch() then wait_ready(); on any failure, Ctrl-C included, the process tree is ended."""
        self.launch()
        try:
            return self.wait_ready(timeout_s)
        except BaseException:
            self.stop()
            raise

    def _progress_bar(self) -> Any:
        """A tqdm line on stderr (elapsed time, the log's last line), or plain lines without tqdm."""
        if not self.progress:
            return None
        desc = f"waiting for {self.name} at {self.ready_url}"
        if not getattr(sys.stderr, "isatty", lambda: False)():  # a log file: whole lines, not a redrawn one
            return _LineProgress(desc)
        try:
            from tqdm import tqdm  # noqa: PLC0415
        except ImportError:  # a bare GPU host's Python: print a line each time instead
            return _LineProgress(desc)
        return tqdm(total=None, desc=desc, bar_format="{desc}: {elapsed}{postfix}", leave=False)

    def _fail(self, message: str, returncode: int | None = None) -> None:
        self._keep_log = True
        self.stop()
        tail = log_tail(self.log_path)
        raise EngineStartError(
            f"{message}. Last lines of its log {self.log_path}:\n{tail or '(the log is empty)'}",
            log_tail=tail, log_path=self.log_path, returncode=returncode,
        )

    # --- run and stop -----------------------------------------------------------------------
    def wait(self) -> int:
        """Block until the server process exits by itself; its exit code."""
        assert self.process is not None, "start() first"
        return self.process.wait()

    def stop(self, grace_s: float | None = None) -> None:
        """End the whole process group (idempotent): SIGTERM, then SIGKILL after ``grace_s``."""
        grace_s = self.stop_grace_s if grace_s is None else grace_s
        if self.process is not None and not self._stopped:
            end_process_group(self.process.pid, grace_s)  # also when the leader died and left children
            try:
                self.process.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                pass
            self._stopped = not group_alive(self.process.pid)  # never signal a reused pid later
        self._close_log()
        if self._temp_log and not self._keep_log and self.log_path is not None:
            self.log_path.unlink(missing_ok=True)

    def detach(self) -> int:
        """Leave the process running for someone else to stop; its pid (= process group id)."""
        assert self.process is not None, "start() first"
        self._close_log()
        return self.process.pid

    def _close_log(self) -> None:
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None

    def __enter__(self) -> "ManagedServer":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
