"""FastAPI routes of the embedded server: SGLang's native API subset with SGLang's field names.

Routes: POST/PUT /generate (SSE when ``stream``), GET /server_info (+ deprecated /get_server_info),
GET /model_info (+ /get_model_info), GET /health, /health_generate, /ready, GET|POST /flush_cache,
POST /tokenize (+ /v1/tokenize), POST /detokenize, GET /v1/models, GET /metrics.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from typing import Any, AsyncIterator, Callable, Iterator

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.concurrency import run_in_threadpool

from specdiag.localserver.protocol import RequestError, error_body, parse_generate_body
from specdiag.localserver.runtime import PAGE_SIZE, Runtime
from specdiag.localserver.stats import prometheus_text

log = logging.getLogger("specdiag.localserver")

FLUSH_OK_TEXT = (
    "Cache flushed.\nPlease check backend logs for more details. "
    "(When there are running or waiting requests, the operation will not be performed.)\n"
)


def _error(message: str, status: int = 400) -> JSONResponse:
    return JSONResponse(error_body(message, status), status_code=status)


def _sse(obj: Any) -> bytes:
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


async def _in_thread(make_iter: Callable[[Callable[[], bool]], Iterator[Any]]) -> AsyncIterator[Any]:
    """Iterate a blocking iterator in a worker thread; closing this generator asks it to stop."""
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()
    abort = threading.Event()

    def put(kind: str, value: Any) -> None:
        try:
            loop.call_soon_threadsafe(queue.put_nowait, (kind, value))
        except RuntimeError:  # the event loop is gone (server shutting down)
            abort.set()

    def work() -> None:
        try:
            for item in make_iter(abort.is_set):
                put("item", item)
        except BaseException as exc:  # noqa: BLE001 - forwarded to the response
            log.exception("generation failed")
            put("error", exc)
        finally:
            put("end", None)

    threading.Thread(target=work, name="specdiag-generate", daemon=True).start()
    try:
        while True:
            kind, value = await queue.get()
            if kind == "end":
                return
            if kind == "error":
                raise value
            yield value
    finally:
        abort.set()


def build_app(runtime: Runtime) -> FastAPI:
    """The FastAPI app serving ``runtime``."""
    app = FastAPI(title="specdiag embedded server", docs_url=None, redoc_url=None)
    app.state.runtime = runtime

    @app.api_route("/generate", methods=["POST", "PUT"])
    async def generate(request: Request) -> Response:
        received_s = time.time()
        try:
            body = await request.json()
        except ValueError as exc:
            return _error(f"the body is not valid JSON: {exc}")
        try:
            gi = parse_generate_body(body)
            prompt_ids, req = await run_in_threadpool(runtime.prepare, gi)  # tokenizing may take a while
        except RequestError as exc:
            return _error(str(exc))

        def make_iter(should_abort: Callable[[], bool]) -> Iterator[dict[str, Any]]:
            return runtime.outputs(gi, prompt_ids, req, received_s, should_abort)

        if not gi.stream:
            final: dict[str, Any] | None = None
            try:
                async for item in _in_thread(make_iter):
                    final = item
            except Exception as exc:  # noqa: BLE001
                return _error(f"generation failed: {type(exc).__name__}: {exc}", 500)
            return JSONResponse(final)

        async def events() -> AsyncIterator[bytes]:
            try:
                async for item in _in_thread(make_iter):
                    yield _sse(item)
            except Exception as exc:  # noqa: BLE001 - SGLang sends mid-stream errors as a data chunk
                err = error_body(f"generation failed: {type(exc).__name__}: {exc}", 500)
                err["error"]["retryable"] = False
                yield _sse(err)
            yield b"data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    @app.get("/server_info")
    async def server_info() -> JSONResponse:
        return JSONResponse(runtime.server_info())

    @app.get("/get_server_info")
    async def get_server_info() -> JSONResponse:
        log.warning("Endpoint '/get_server_info' is deprecated and will be removed in a future version. "
                    "Please use '/server_info' instead.")
        return JSONResponse(runtime.server_info())

    @app.get("/model_info")
    @app.get("/get_model_info")
    async def model_info() -> JSONResponse:
        return JSONResponse(runtime.model_info())

    @app.get("/health")
    @app.get("/health_generate")
    @app.get("/ready")
    async def health() -> Response:
        return Response(status_code=200)

    @app.api_route("/flush_cache", methods=["GET", "POST"])
    async def flush_cache() -> PlainTextResponse:
        # There is no prefix cache to drop (each request prefills from scratch); like SGLang, a flush resets the
        # KV pool's free list to one contiguous range and avg_spec_accept_length, and is refused while a request
        # runs or waits.
        if not await run_in_threadpool(runtime.flush_cache):
            return PlainTextResponse(
                "Cache not flushed. Please check backend logs for more details. "
                "(When there are running or waiting requests, the operation will not be performed.)\n",
                status_code=400,
            )
        return PlainTextResponse(FLUSH_OK_TEXT, status_code=200)

    @app.post("/tokenize")
    @app.post("/v1/tokenize")
    async def tokenize(request: Request) -> JSONResponse:
        try:
            body = await request.json()
        except ValueError as exc:
            return _error(f"the body is not valid JSON: {exc}")
        text = body.get("prompt", body.get("text")) if isinstance(body, dict) else None
        if not isinstance(text, str):
            return _error('send {"text": "..."} (or SGLang\'s {"prompt": "..."}) with a string')
        add_special = body.get("add_special_tokens", True)
        # off the event loop: a long text must not delay the chunks of a running generation
        tokens = await run_in_threadpool(runtime.tokenize, text, bool(add_special))
        return JSONResponse({"tokens": tokens, "count": len(tokens), "max_model_len": runtime.context_length})

    @app.post("/detokenize")
    @app.post("/v1/detokenize")
    async def detokenize(request: Request) -> JSONResponse:
        body = await request.json()
        tokens = body.get("tokens") if isinstance(body, dict) else None
        if not isinstance(tokens, list) or not all(isinstance(t, int) for t in tokens):
            return _error('send {"tokens": [ids...]}')
        text = await run_in_threadpool(runtime.detokenize, tokens, bool(body.get("skip_special_tokens", True)))
        return JSONResponse({"text": text})

    @app.get("/v1/models")
    async def models() -> JSONResponse:
        card = {
            "id": runtime.served_model_name,
            "object": "model",
            "created": int(runtime.started_unix_s),
            "owned_by": "sglang",
            "root": str(runtime.cfg.model_path),
            "max_model_len": runtime.context_length,
        }
        return JSONResponse({"object": "list", "data": [card]})

    @app.get("/metrics")
    @app.get("/metrics/")
    async def metrics() -> PlainTextResponse:
        text = prometheus_text(runtime.stats, runtime.served_model_name, runtime.context_length, PAGE_SIZE,
                               runtime.settings.num_draft_tokens if runtime.speculative else None,
                               runtime.speculative)
        return PlainTextResponse(text, media_type="text/plain; version=0.0.4; charset=utf-8")

    return app
