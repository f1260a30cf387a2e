"""A stand-in engine for the launcher tests: a stdlib HTTP server that answers ``/health_generate``
(and ``/health``) with 200 only ``--delay`` seconds after start, 503 before.

    python tests/fake_engine_server.py --port P [--delay S] [--die-at-start] [--child] [--ignore-sigterm]

--die-at-start prints an error line and exits 3 before listening; --child starts a grandchild that
only sleeps (a process tree to end); --ignore-sigterm makes the server ignore SIGTERM (only SIGKILL
ends it). Each line it prints goes to the launcher's log.
"""

from __future__ import annotations

import argparse
import http.server
import os
import signal
import subprocess
import sys
import time


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--delay", type=float, default=0.0)
    p.add_argument("--die-at-start", action="store_true")
    p.add_argument("--child", action="store_true")
    p.add_argument("--ignore-sigterm", action="store_true")
    a = p.parse_args()
    print(f"fake engine: pid {os.getpid()}, env FAKE_ENGINE_MARK={os.environ.get('FAKE_ENGINE_MARK', '')}",
          flush=True)
    if a.child:  # before dying too: a leader that dies leaves its child running
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])  # noqa: S603
        print(f"fake engine: child pid {child.pid}", flush=True)
    if a.die_at_start:
        print("fake engine: RuntimeError: CUDA out of memory while loading the weights", flush=True)
        return 3
    if a.ignore_sigterm:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    ready_at = time.monotonic() + a.delay

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            if self.path in ("/health_generate", "/health") and time.monotonic() >= ready_at:
                self.send_response(200)
                self.end_headers()
                self.wfile.write(b"ok")
            else:
                self.send_response(503)
                self.end_headers()

        def log_message(self, fmt: str, *args: object) -> None:
            pass

    server = http.server.HTTPServer(("127.0.0.1", a.port), Handler)
    print(f"fake engine: listening on {a.port}, ready in {a.delay} s", flush=True)
    server.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
