"""A small threaded HTTP server on 127.0.0.1 that answers like SGLang, for client contract tests.

It replays SGLang-format answers (field names as in SGLang 0.5.23's http_server.py and
tokenizer_manager.py; recorded replies in tests/data/sglang-0.5.17/), no model behind it. ``POST /generate``
picks a scenario by the request's ``text`` (``input_ids`` requests get "cumulative"):

    cumulative    default stream: cumulative text/output_ids, spec fields (current names) at the end
    incremental   --incremental-streaming-output: deltas
    old_names     cumulative, spec fields under spec_accepted_drafts / spec_proposed_drafts /
                  spec_accept_histogram
    oldest_names  cumulative, spec_accept_token_num / spec_draft_token_num (~v0.5.0-0.5.4)
    embedded      cumulative plus specdiag's per-step extras (spec_step_commit_lengths, ...)
    error_chunk   two chunks, then data: {"error": {...}}, then [DONE]
    drop          two chunks, then the connection is cut (no terminating chunk, no [DONE])
    no_done       two chunks, then a clean end of the body without [DONE]
    http400       HTTP 400 with SGLang's {"error": {"message": ...}} body
    http422       HTTP 422 with FastAPI's {"detail": [...]} body
    slow          waits SLOW_S seconds before answering (for timeout tests)
    stall         one chunk, then waits SLOW_S seconds (read timeout mid-stream)
    abort         ends with finish_reason {"type": "abort", ...}
    close_delimited  HTTP/1.0-style stream: no chunked encoding, body ends when the socket closes
    hangup        closes the connection without any answer
    json_body     answers a stream request with one JSON body (a server without streaming)

``/server_info`` answers 404 (an older SGLang), so clients must fall back to ``/get_server_info``.
Every request is recorded in ``server.requests`` (method, path, headers, JSON body).

``ReplayServer(api_key=..., admin_api_key=...)`` enforces SGLang 0.5.17's key rules exactly (:func:`decide`, rule for
rule sglang/srt/utils/auth.py's ``decide_request_auth``; each route's level from its http_server.py, both recorded in
tests/data/sglang-0.5.17/auth.json by scripts/record_sglang_auth.py): /health* and /metrics* always open; with
``--api-key`` alone every other route wants it; with ``--admin-api-key`` too, the ADMIN_OPTIONAL routes
(/flush_cache, /start_profile, ...) take only the admin key and the others only the API key. A refusal answers
401 ``{"error": "Unauthorized"}`` (or 403 ``Forbidden``), as SGLang's middleware does.

``ReplayServer(recorded=folder)`` answers instead with what a real SGLang sent, byte for byte, from a folder of
raw exchanges (tests/data/sglang-0.5.17/raw-*/, written by scripts/record_sglang_exchange.py): each ``NAME.json`` /
``.txt`` / ``.sse`` body with the status and content type of its ``NAME.meta.json``; streams are written in the
chunks the recorder read them in. ``POST /generate`` picks the exchange by the request's ``rid`` (a recorded
name, e.g. ``generate_stream_novel_1024``), else: over-long ``input_ids`` (beyond the recorded context_length)
-> ``generate_error_overlong[_stream]``, a stream -> ``generate_stream_novel_1024``, else ``generate_nonstream``.
GET ``/metrics`` answers ``metrics_before`` the first time and ``metrics_after`` from then on (``metrics_static``:
``metrics_after`` always, counters that do not move, for whole notebooks); ``/server_info`` and
``/get_server_info`` both answer ``server_info.json`` (the recorder found them byte-identical). ``POST /tokenize`` of
the recorded text answers the recorded bytes; another text gets the same shape with one id per word (so prompts of
an exact length can be built, as notebooks do).
"""

from __future__ import annotations

import hmac
import json
import re
import socket
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

AUTH = json.loads((Path(__file__).parent / "data" / "sglang-0.5.17" / "auth.json").read_text())
CHUNK_DELAY_S = 0.05  # pause between stream chunks, so client timestamps can be checked
SLOW_S = 3.0  # how long "slow" and "stall" keep the client waiting
PROMPT_TOKENS = 12
# Tokens of the canned answer, grouped as SGLang streams them with speculative decoding: the
# first token from prefill, then one chunk per verify step carrying that step's commit.
CHUNKS = [[101], [102, 103, 104], [105, 106], [107, 108, 109, 110]]
NUM_DRAFT_TOKENS = 8  # speculative_num_draft_tokens of the pretend server
SERVER_INFO = {
    "model_path": "replay/model",
    "attention_backend": "triton",
    "page_size": 1,
    "speculative_algorithm": "STANDALONE",
    "speculative_num_draft_tokens": NUM_DRAFT_TOKENS,
    "speculative_draft_model_path": "replay/drafter",
    "context_length": 32768,
    "internal_states": [{"avg_spec_accept_length": 3.0, "last_gen_throughput": 12.5}],
    "version": "0.5.23-replay",
}
MODEL_INFO = {"model_path": "replay/model", "is_generation": True, "architectures": ["ReplayForCausalLM"]}
METRICS = """\
# HELP sglang:generation_tokens_total Number of generation tokens processed.
# TYPE sglang:generation_tokens_total counter
sglang:generation_tokens_total{engine_type="unified",is_streaming="true",model_name="replay"} 10.0
# TYPE sglang:spec_verify_calls_total counter
sglang:spec_verify_calls_total{engine_type="unified",model_name="replay"} 3.0
"""


def route_level(method: str, path: str) -> str:
    """The auth level of the route ``method path`` matches in SGLang 0.5.17 (NORMAL when none does: Starlette's
    route match needs path and method)."""
    for route in AUTH["levels"]:
        pattern = "^" + re.sub(r"\{[^}]+\}", "[^/]+", route["path"]) + "$"
        if method in route["methods"] and re.match(pattern, path):
            return route["level"]
    return "NORMAL"


def decide(method: str, path: str, authorization: str | None, api_key: str | None, admin_api_key: str | None,
           level: str) -> tuple[bool, int]:
    """``(allowed, status when refused)``: SGLang 0.5.17's ``decide_request_auth``, rule for rule."""
    if method == "OPTIONS":
        return True, 200
    if path.startswith("/health") or path.startswith("/metrics"):
        return True, 200

    def bearer(expected: str) -> bool:
        if not authorization:
            return False
        parts = authorization.split(" ", 1)
        return len(parts) == 2 and parts[0].lower() == "bearer" and hmac.compare_digest(parts[1], expected)

    if level == "ADMIN_FORCE":
        if not admin_api_key:
            return False, 403
        return (True, 200) if bearer(admin_api_key) else (False, 401)
    if level == "ADMIN_OPTIONAL":
        if admin_api_key:
            return (True, 200) if bearer(admin_api_key) else (False, 401)
        if api_key:
            return (True, 200) if bearer(api_key) else (False, 401)
        return True, 200
    if api_key:
        return (True, 200) if bearer(api_key) else (False, 401)
    return True, 200


def word(token_id: int) -> str:
    return f"w{token_id} "


def tokenize(text: str) -> list[int]:
    """One token per whitespace-separated word (id = 1000 + sum of its bytes mod 1000)."""
    return [1000 + sum(w.encode()) % 1000 for w in text.split()]


def spec_meta(scenario: str) -> dict[str, Any]:
    """Final spec fields for CHUNKS: 3 verify steps committing 3, 2, 4 tokens (2, 1, 3 correct drafts)."""
    steps = [len(c) for c in CHUNKS[1:]]
    correct = sum(s - 1 for s in steps)
    proposed = len(steps) * (NUM_DRAFT_TOKENS - 1)
    hist = [0] * NUM_DRAFT_TOKENS
    for s in steps:
        hist[s - 1] += 1
    completion = sum(len(c) for c in CHUNKS)
    meta: dict[str, Any] = {
        "spec_verify_ct": len(steps),
        "spec_accept_length": completion / len(steps),
        "spec_accept_rate": correct / proposed,
    }
    if scenario == "old_names":
        meta.update(spec_accepted_drafts=correct, spec_proposed_drafts=proposed, spec_accept_histogram=hist)
    elif scenario == "oldest_names":
        meta.update(spec_accept_token_num=correct, spec_draft_token_num=proposed)
    else:
        meta.update(
            spec_num_correct_drafts=correct, spec_num_proposed_drafts=proposed, spec_correct_drafts_histogram=hist
        )
    if scenario == "embedded":
        meta.update(
            spec_step_commit_lengths=steps,
            spec_step_draft_ms=[1.5 for _ in steps],
            spec_step_verify_ms=[4.25 for _ in steps],
        )
    return meta


def chunk_outputs(scenario: str, incremental: bool) -> list[dict[str, Any]]:
    """The /generate outputs of a stream, as SGLang's tokenizer manager builds them."""
    outs = []
    ids: list[int] = []
    for i, chunk in enumerate(CHUNKS):
        ids = ids + chunk
        last = i == len(CHUNKS) - 1
        meta: dict[str, Any] = {
            "id": "replay-req-1",
            "finish_reason": None,
            "prompt_tokens": PROMPT_TOKENS,
            "weight_version": "default",
            "num_retractions": 0,
            "reasoning_tokens": 0,
            "completion_tokens": len(ids),
            "cached_tokens": 0,
        }
        if last:
            meta["finish_reason"] = {"type": "length", "length": len(ids)}
            if scenario == "abort":
                meta["finish_reason"] = {
                    "type": "abort",
                    "message": "replay abort: KV cache pool is full",
                    "status_code": 503,
                    "err_type": "ServiceUnavailable",
                }
            meta["e2e_latency"] = 0.2
            meta.update(spec_meta(scenario))
        new = chunk if incremental else ids
        outs.append({"text": "".join(word(t) for t in new), "output_ids": list(new), "meta_info": meta})
    return outs


@dataclass
class Recorded:
    method: str
    path: str
    headers: dict[str, str]
    body: Any


@dataclass
class ReplayServer:
    """Context manager: ``with ReplayServer() as srv: srv.url``."""

    host: str = "127.0.0.1"
    requests: list[Recorded] = field(default_factory=list)
    recorded: Any = None  # a folder of a real server's raw exchanges: answer with those bytes instead
    metrics_static: bool = False  # recorded mode: /metrics always answers metrics_after
    api_key: str | None = None  # --api-key: enforced as SGLang 0.5.17 does (module doc)
    admin_api_key: str | None = None  # --admin-api-key
    metrics_scrapes: int = 0
    _httpd: ThreadingHTTPServer | None = None
    _thread: threading.Thread | None = None
    _stop: threading.Event = field(default_factory=threading.Event)

    @property
    def url(self) -> str:
        assert self._httpd is not None, "server not started"
        return f"http://{self.host}:{self._httpd.server_address[1]}"

    def start(self) -> ReplayServer:
        handler = type("Handler", (_Handler,), {"replay": self})
        self._httpd = _QuietServer((self.host, 0), handler)  # port 0: a free port
        self._httpd.daemon_threads = True
        self._httpd.block_on_close = False
        self._thread = threading.Thread(target=self._httpd.serve_forever, name="sglang-replay", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def wait(self, seconds: float) -> None:
        self._stop.wait(seconds)

    def __enter__(self) -> ReplayServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class _QuietServer(ThreadingHTTPServer):
    def handle_error(self, request: Any, client_address: Any) -> None:
        # A client that gave up (timeout tests) leaves a broken pipe behind: expected, not news.
        import sys

        if not isinstance(sys.exc_info()[1], (BrokenPipeError, ConnectionResetError)):
            super().handle_error(request, client_address)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    replay: ReplayServer  # set on the subclass made by ReplayServer.start

    def setup(self) -> None:
        super().setup()
        # Send each chunk at once (no Nagle delay), as uvicorn does, so client timestamps are honest.
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def log_message(self, format: str, *args: Any) -> None:  # keep test output quiet
        pass

    # -- helpers ---------------------------------------------------------------------------

    def _body(self) -> Any:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        try:
            return json.loads(raw) if raw else None
        except json.JSONDecodeError:
            return raw.decode("utf-8", "replace")

    def _record(self, body: Any) -> None:
        self.replay.requests.append(Recorded(self.command, self.path, dict(self.headers), body))

    def _send(self, status: int, payload: Any, content_type: str = "application/json") -> None:
        data = payload if isinstance(payload, bytes) else (
            json.dumps(payload).encode() if content_type == "application/json" else str(payload).encode()
        )
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _chunk(self, data: bytes) -> None:
        self.wfile.write(f"{len(data):X}\r\n".encode() + data + b"\r\n")
        self.wfile.flush()

    # -- routes ----------------------------------------------------------------------------

    def _recorded_exchange(self, name: str) -> None:
        """Answer with the recorded exchange ``name``: its body bytes, status and content type."""
        from pathlib import Path

        folder = Path(self.replay.recorded)
        meta = json.loads((folder / f"{name}.meta.json").read_text())
        headers = {k.lower(): v for k, v in (meta.get("headers") or {}).items()}
        ctype = headers.get("content-type", "text/plain")
        body = next((folder / f"{name}{ext}" for ext in (".sse", ".json", ".txt") if (folder / f"{name}{ext}").exists()))
        data = body.read_bytes()
        status = int(meta["status"])
        if not meta.get("read_sizes"):
            self._send(status, data, ctype)
            return
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        pos = 0
        for size in meta["read_sizes"]:  # the pieces the recorder's reads returned, in order
            self._chunk(data[pos:pos + size])
            pos += size
        if pos < len(data):
            self._chunk(data[pos:])
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()

    def _recorded_get(self, path: str) -> None:
        names = {"/server_info": "server_info", "/get_server_info": "server_info", "/model_info": "model_info",
                 "/get_model_info": "model_info", "/health": "health", "/health_generate": "health_generate",
                 "/v1/models": "v1_models"}
        if path == "/metrics":
            self.replay.metrics_scrapes += 1
            first = self.replay.metrics_scrapes == 1 and not self.replay.metrics_static
            self._recorded_exchange("metrics_before" if first else "metrics_after")
        elif path in names:
            self._recorded_exchange(names[path])
        else:
            self._send(404, {"detail": "Not Found"})

    def _recorded_post(self, path: str, body: Any) -> None:
        from pathlib import Path

        body = body if isinstance(body, dict) else {}
        if path == "/flush_cache":
            self._recorded_exchange("flush_cache")
        elif path == "/tokenize":
            asked = json.loads((Path(self.replay.recorded) / "tokenize.meta.json").read_text())["request_body"]
            if body.get("prompt") == asked.get("prompt") or not isinstance(body.get("prompt"), str):
                self._recorded_exchange("tokenize")
            else:
                tokens = tokenize(body["prompt"])
                self._send(200, {"tokens": tokens, "count": len(tokens), "max_model_len": 16384})
        elif path == "/generate":
            info = json.loads((Path(self.replay.recorded) / "server_info.json").read_text())
            stream = bool(body.get("stream"))
            if isinstance(body.get("rid"), str):
                name = body["rid"]
            elif len(body.get("input_ids") or []) > int(info["context_length"]):
                name = "generate_error_overlong_stream" if stream else "generate_error_overlong"
            else:
                name = "generate_stream_novel_1024" if stream else "generate_nonstream"
            self._recorded_exchange(name)
        else:
            self._send(404, {"detail": "Not Found"})

    def _refused(self) -> bool:
        """SGLang's key middleware (installed when the server has a key): answer 401/403 and True when refused."""
        srv = self.replay
        if not (srv.api_key or srv.admin_api_key):
            return False
        path = self.path.split("?")[0]
        allowed, status = decide(self.command, path, self.headers.get("Authorization"), srv.api_key,
                                 srv.admin_api_key, route_level(self.command, path))
        if allowed:
            return False
        self._send(status, {"error": "Unauthorized" if status == 401 else "Forbidden"})
        return True

    def do_GET(self) -> None:
        self._record(None)
        if self._refused():
            return
        path = self.path.split("?")[0]
        if self.replay.recorded is not None:
            self._recorded_get(path)
            return
        if path == "/health":
            self._send(200, b"", "text/plain")
        elif path == "/get_server_info":
            self._send(200, SERVER_INFO)
        elif path == "/model_info":
            self._send(200, MODEL_INFO)
        elif path == "/metrics":
            self._send(200, METRICS, "text/plain; version=0.0.4")
        elif path == "/flush_cache":
            self._send(200, "Cache flushed.\nPlease check backend logs for more details.", "text/plain")
        else:  # /server_info included: this pretends to be an older SGLang
            self._send(404, {"detail": "Not Found"})

    def do_POST(self) -> None:
        body = self._body()
        self._record(body)
        if self._refused():
            return
        path = self.path.split("?")[0]
        if self.replay.recorded is not None:
            self._recorded_post(path, body)
            return
        if path == "/generate":
            self._generate(body if isinstance(body, dict) else {})
        elif path == "/tokenize":
            text = body.get("prompt") if isinstance(body, dict) else None
            if not isinstance(text, str):
                self._send(400, {"error": {"message": "Exactly one of 'prompt' or 'messages' must be provided."}})
                return
            tokens = tokenize(text)
            self._send(200, {"tokens": tokens, "count": len(tokens), "max_model_len": 32768})
        elif path == "/flush_cache":
            self._send(405, {"detail": "Method Not Allowed"})  # makes the client fall back to GET
        else:
            self._send(404, {"detail": "Not Found"})

    def _generate(self, body: dict) -> None:
        scenario = body.get("text") if isinstance(body.get("text"), str) else "cumulative"
        stream = bool(body.get("stream"))
        if scenario == "http400":
            message = "Unknown sampling_params key(s): ['max_tokens']. Use max_new_tokens."
            self._send(400, {"error": {"message": message}})
            return
        if scenario == "http422":
            detail = [{"loc": ["body", "input_ids"], "msg": "value is not a valid list", "type": "type_error"}]
            self._send(422, {"detail": detail})
            return
        if scenario == "hangup":
            self.connection.shutdown(socket.SHUT_RDWR)  # close without a status line
            self.close_connection = True
            return
        if scenario == "slow":
            self.replay.wait(SLOW_S)
            self._send(503, {"error": {"message": "too late"}})
            return
        outs = chunk_outputs(scenario, incremental=scenario == "incremental")
        if not stream or scenario == "json_body":
            self._send(200, outs[-1])
            return
        if scenario == "close_delimited":
            self._stream_close_delimited(outs)
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        for i, out in enumerate(outs):
            if i > 0:
                time.sleep(CHUNK_DELAY_S)
            self._chunk(b"data: " + json.dumps(out).encode() + b"\n\n")
            if scenario == "stall":
                self.replay.wait(SLOW_S)
                self.close_connection = True
                return
            if i == 1 and scenario in ("error_chunk", "drop", "no_done"):
                break
        if scenario == "error_chunk":
            error = {"error": {"message": "replay: the scheduler raised during decode", "type": "invalid_request_error",
                               "code": 500, "retryable": False}}
            self._chunk(b"data: " + json.dumps(error).encode() + b"\n\n")
        if scenario == "drop":
            self.wfile.write(b"40\r\ndata: {\"text\": \"cut")  # half a chunk, then the socket goes away
            self.wfile.flush()
            self.connection.shutdown(socket.SHUT_RDWR)
            self.close_connection = True
            return
        if scenario != "no_done":
            self._chunk(b"data: [DONE]\n\n")
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()

    def _stream_close_delimited(self, outs: list[dict[str, Any]]) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.flush()
        for i, out in enumerate(outs):
            if i > 0:
                time.sleep(CHUNK_DELAY_S)
            self.wfile.write(b"data: " + json.dumps(out).encode() + b"\n\n")
            self.wfile.flush()
        self.wfile.write(b"data: [DONE]\n\n")
        self.wfile.flush()
        self.close_connection = True
