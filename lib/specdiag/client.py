"""Typed client for SGLang's native HTTP API: one RequestTrace per /generate request.

Streaming ``POST /generate`` is read as Server-Sent Events (``data: {...}`` + blank line, ended by
``data: [DONE]``); every chunk gets a client-side timestamp (``time.perf_counter`` seconds after
the request was sent, taken when its bytes arrived). Tokens per chunk always come from
``meta_info.completion_tokens`` deltas (cumulative in both of SGLang's stream modes); the full text
and output_ids are rebuilt whether the server streams cumulative chunks (the default) or deltas
(``--incremental-streaming-output``). Protocol facts: reference/sglang-protocol.md.

Layout: SSE parsing lives in specdiag.sse, RequestTrace and its assembly from chunks in
specdiag.trace; this module holds the HTTP client, its errors and CLIENTS / make_client, and
re-exports the names of the other two so ``from specdiag.client import ...`` keeps working.

Failures: ``generate`` returns a trace with ``.error`` set (and whatever arrived) for anything that
goes wrong after the request was sent; it raises only ServerUnreachable. Other methods raise
ServerError subclasses. Every message names the URL and the cause; the API key never appears in a
message, a trace or a repr.
"""

from __future__ import annotations

import json
import socket
import time
from typing import Any
from collections.abc import Callable, Iterator, Mapping

import requests
import urllib3.exceptions

from specdiag.runs import REDACTED, redact_text
from specdiag.sse import DONE, SSEDecoder, SSEEvent, SSEFormatError, parse_sse_lines
from specdiag.trace import (
    RequestTrace,
    SpecFields,
    _finish_reason_error,
    assemble_stream,
    detect_stream_mode,
)

__all__ = [
    "CLIENTS",
    "DONE",
    "RequestTrace",
    "SGLangClient",
    "SSEDecoder",
    "SSEFormatError",
    "ServerError",
    "ServerHTTPError",
    "ServerTimeout",
    "ServerUnreachable",
    "SpecFields",
    "StreamError",
    "assemble_stream",
    "detect_stream_mode",
    "make_client",
    "parse_sse_lines",
]


# ---------------------------------------------------------------------------------------------
# Errors
# ---------------------------------------------------------------------------------------------


class ServerError(Exception):
    """A request to the server failed. ``.url`` is the URL asked for, ``.cause`` what went wrong."""

    def __init__(self, url: str, cause: str) -> None:
        self.url = redact_text(url)
        self.cause = cause
        super().__init__(self._message())

    def _message(self) -> str:
        return f"request to {self.url} failed: {self.cause}"


class ServerUnreachable(ServerError):
    """Nothing could be sent: connection refused, unknown host, connect timeout."""

    def _message(self) -> str:
        return (
            f"cannot reach {self.url}: {self.cause}. "
            "Check that the server is running and that server_url (host and port) is right."
        )


class ServerTimeout(ServerError):
    """The server accepted the connection but did not answer in time."""

    def _message(self) -> str:
        return f"no answer from {self.url}: {self.cause}"


class ServerHTTPError(ServerError):
    """The server answered with an HTTP error status. ``.status``, ``.body`` (text, truncated)."""

    def __init__(self, url: str, status: int, body: str, message: str) -> None:
        self.status = status
        self.body = body
        super().__init__(url, f"HTTP {status}: {message}")

    def _message(self) -> str:
        return f"{self.url} answered {self.cause}"


class StreamError(ServerError):
    """The stream broke: an error chunk from the server, a dropped connection, malformed data."""

    def _message(self) -> str:
        return f"stream from {self.url} failed: {self.cause}"


# ---------------------------------------------------------------------------------------------
# HTTP helpers
# ---------------------------------------------------------------------------------------------


def _error_message_from_body(body: str) -> str:
    """SGLang answers ``{"error": {"message": ...}}``, FastAPI ``{"detail": ...}``, else text."""
    try:
        data = json.loads(body)
    except (json.JSONDecodeError, ValueError):
        return body.strip()[:500] or "(empty body)"
    if isinstance(data, dict):
        err = data.get("error")
        if isinstance(err, dict) and err.get("message"):
            return str(err["message"])
        if isinstance(err, str) and err:
            return err
        detail = data.get("detail")
        if isinstance(detail, str):
            return detail
        if isinstance(detail, list):  # FastAPI validation errors
            return "; ".join(
                f"{'.'.join(str(p) for p in d.get('loc', []))}: {d.get('msg')}" if isinstance(d, dict) else str(d)
                for d in detail
            )
        if data.get("message"):
            return str(data["message"])
    return body.strip()[:500]


def _exception_chain(exc: BaseException) -> list[BaseException]:
    """``exc`` and everything it wraps (causes, contexts, urllib3 reasons, exception args)."""
    seen: list[BaseException] = []
    todo = [exc]
    while todo and len(seen) < 32:
        e = todo.pop(0)
        if any(e is s for s in seen):
            continue
        seen.append(e)
        todo.extend(x for x in (e.__cause__, e.__context__, getattr(e, "reason", None)) if isinstance(x, BaseException))
        todo.extend(a for a in getattr(e, "args", ()) if isinstance(a, BaseException))
    return seen


def _connect_cause(exc: BaseException) -> str:
    """A short, readable cause for a failed connection or read."""
    chain = _exception_chain(exc)
    names = {type(err).__name__ for err in chain}
    wrappers = (urllib3.exceptions.HTTPError, requests.exceptions.RequestException)
    # Most specific first. (urllib3's NewConnectionError subclasses ConnectTimeoutError, so the
    # OS error underneath decides between "refused" and "timed out".)
    if any(isinstance(err, ConnectionRefusedError) for err in chain):
        return "connection refused (nothing listens on that port)"
    if any(isinstance(err, (urllib3.exceptions.NameResolutionError, socket.gaierror)) for err in chain):
        return "unknown host (name resolution failed)"
    if "RemoteDisconnected" in names:
        return "the server closed the connection without answering"
    if "IncompleteRead" in names or "InvalidChunkLength" in names:
        return "the server closed the connection in the middle of the response (incomplete read)"
    if any(isinstance(err, ConnectionResetError) for err in chain):
        return "connection reset by the server"
    if any(
        isinstance(err, (TimeoutError, requests.exceptions.ConnectTimeout))
        or type(err) is urllib3.exceptions.ConnectTimeoutError
        for err in chain
    ):
        return "connection timed out"
    for err in chain:
        if isinstance(err, OSError) and not isinstance(err, wrappers):
            return f"{type(err).__name__}: {err}"[:300]
    for err in chain:
        if isinstance(err, urllib3.exceptions.ProtocolError):
            return str(err)[:300] or type(err).__name__
    return str(exc)[:300] or type(exc).__name__


def _is_unreachable(exc: requests.exceptions.ConnectionError) -> bool:
    """True when no byte of the request could be sent (connect failed)."""
    if isinstance(exc, requests.exceptions.ConnectTimeout):
        return True
    return any(
        isinstance(e, (urllib3.exceptions.NewConnectionError, urllib3.exceptions.ConnectTimeoutError))
        for e in _exception_chain(exc)
    )


def _iter_raw(response: requests.Response) -> Iterator[bytes]:
    """Yield response bytes as soon as they arrive (chunked or not)."""
    raw = response.raw
    read1: Callable[..., bytes] | None = getattr(raw, "read1", None)
    if read1 is not None:
        while True:
            data = read1(65536, decode_content=True)
            if not data:
                return
            yield data
    else:  # urllib3 < 2
        yield from response.iter_content(chunk_size=None)


# ---------------------------------------------------------------------------------------------
# The client
# ---------------------------------------------------------------------------------------------


class SGLangClient:
    """Client for one SGLang (or specdiag embedded) server.

    ``timeout_s`` is the longest wait for any byte of an answer (a long prefill counts against
    it); connecting has its own limit, ``connect_timeout_s``. The HTTP session is passed in or
    made here; the API key goes only into the ``Authorization: Bearer`` header.
    """

    engine = "sglang"

    def __init__(
        self,
        base_url: str,
        session: requests.Session | None = None,
        api_key: str | None = None,
        timeout_s: float = 600.0,
        connect_timeout_s: float = 10.0,
    ) -> None:
        if not isinstance(base_url, str) or not base_url.startswith(("http://", "https://")):
            raise ValueError(
                f"server_url must start with http:// or https://, got {redact_text(str(base_url))!r}; "
                "e.g. http://127.0.0.1:30000"
            )
        if timeout_s <= 0 or connect_timeout_s <= 0:
            raise ValueError(
                f"timeouts must be > 0 s, got timeout_s={timeout_s}, connect_timeout_s={connect_timeout_s}"
            )
        self.base_url = base_url.rstrip("/")
        self.session = session if session is not None else requests.Session()
        self.timeout_s = float(timeout_s)
        self.connect_timeout_s = float(connect_timeout_s)
        self.__api_key = api_key or None

    def __repr__(self) -> str:
        key = f", api_key={REDACTED!r}" if self.__api_key else ""
        return f"SGLangClient({redact_text(self.base_url)!r}{key}, timeout_s={self.timeout_s})"

    # -- plumbing ---------------------------------------------------------------------------

    def url(self, path: str) -> str:
        return f"{self.base_url}/{path.lstrip('/')}"

    def _headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.__api_key}"} if self.__api_key else {}

    def _scrub(self, text: str) -> str:
        if self.__api_key:
            text = text.replace(self.__api_key, REDACTED)
        return redact_text(text)

    def _request(
        self,
        method: str,
        path: str,
        *,
        json_body: Any = None,
        timeout_s: float | None = None,
        stream: bool = False,
    ) -> requests.Response:
        """Send one request; raise ServerUnreachable / ServerTimeout / StreamError; never checks status."""
        url = self.url(path)
        read_timeout = self.timeout_s if timeout_s is None else timeout_s
        try:
            return self.session.request(
                method,
                url,
                json=json_body,
                headers=self._headers(),
                timeout=(min(self.connect_timeout_s, read_timeout), read_timeout),
                stream=stream,
            )
        except requests.exceptions.ConnectionError as exc:
            if _is_unreachable(exc):
                raise ServerUnreachable(url, self._scrub(_connect_cause(exc))) from None
            raise StreamError(url, self._scrub(f"connection closed before an answer ({_connect_cause(exc)})")) from None
        except requests.exceptions.Timeout:
            raise ServerTimeout(url, f"no answer within {read_timeout:g} s (timeout)") from None
        except requests.exceptions.RequestException as exc:
            raise ServerError(url, self._scrub(str(exc))) from None

    def _http_error(self, response: requests.Response) -> ServerHTTPError:
        body = self._scrub(response.text[:2000])
        return ServerHTTPError(response.url or "", response.status_code, body, _error_message_from_body(body))

    def _get_json(self, paths: tuple[str, ...], timeout_s: float | None = None) -> dict:
        """GET the first path that is not 404 and return its JSON object."""
        response: requests.Response | None = None
        for path in paths:
            response = self._request("GET", path, timeout_s=timeout_s)
            if response.status_code != 404:
                break
        assert response is not None
        if not response.ok:
            raise self._http_error(response)
        try:
            data = response.json()
        except ValueError:
            raise ServerError(response.url, f"answer is not JSON: {response.text[:200]!r}") from None
        if not isinstance(data, dict):
            raise ServerError(response.url, f"expected a JSON object, got {type(data).__name__}")
        return data

    # -- info and control -------------------------------------------------------------------

    def check_reachable(self, timeout_s: float = 5.0) -> None:
        """Raise ServerUnreachable (naming the URL and cause) unless the server answers HTTP.

        Any HTTP answer of GET /health counts, even 503 (busy) or 404. Connection refused fails at
        once; a server that accepts the connection but stays silent fails after ``timeout_s``.
        """
        url = self.url("/health")
        try:
            self.session.get(url, headers=self._headers(), timeout=(timeout_s, timeout_s))
        except requests.exceptions.ConnectionError as exc:
            if _is_unreachable(exc):
                raise ServerUnreachable(url, self._scrub(_connect_cause(exc))) from None
            cause = f"connection closed without an answer ({_connect_cause(exc)})"
            raise ServerUnreachable(url, self._scrub(cause)) from None
        except requests.exceptions.Timeout:
            raise ServerUnreachable(url, f"connected, but no HTTP answer within {timeout_s:g} s") from None
        except requests.exceptions.RequestException as exc:
            raise ServerUnreachable(url, self._scrub(str(exc))) from None

    def server_info(self) -> dict:
        """GET /server_info (SGLang >= 0.5), falling back to /get_server_info on 404."""
        return self._get_json(("/server_info", "/get_server_info"))

    def model_info(self) -> dict:
        """GET /model_info, falling back to /get_model_info on 404."""
        return self._get_json(("/model_info", "/get_model_info"))

    def health(self, timeout_s: float = 30.0) -> bool:
        """True when GET /health answers 2xx (SGLang generates one token for it).

        False for any HTTP error status or a timeout; raises ServerUnreachable if nothing listens.
        """
        try:
            return self._request("GET", "/health", timeout_s=timeout_s).ok
        except (ServerTimeout, StreamError):
            return False

    def flush_cache(self) -> bool:
        """POST /flush_cache (GET if POST is not allowed). True when the server flushed.

        SGLang answers 400 while requests are running; that gives False.
        """
        response = self._request("POST", "/flush_cache", timeout_s=min(self.timeout_s, 60.0))
        if response.status_code in (404, 405):
            response = self._request("GET", "/flush_cache", timeout_s=min(self.timeout_s, 60.0))
        if response.status_code in (404, 405):
            raise self._http_error(response)
        return response.ok

    def tokenize(self, text: str, add_special_tokens: bool = False) -> list[int]:
        """POST /tokenize; the token ids of ``text`` (no BOS/EOS unless ``add_special_tokens``).

        SGLang reads ``prompt``; the embedded server ``text``: both are sent.
        """
        body = {"prompt": text, "text": text, "add_special_tokens": add_special_tokens}
        response = self._request("POST", "/tokenize", json_body=body, timeout_s=min(self.timeout_s, 120.0))
        if not response.ok:
            raise self._http_error(response)
        try:
            tokens = response.json()["tokens"]
        except (ValueError, KeyError, TypeError):
            raise ServerError(response.url, f"no 'tokens' list in the answer: {response.text[:200]!r}") from None
        return [int(t) for t in tokens]

    def metrics_text(self) -> str | None:
        """GET /metrics (Prometheus text); None when metrics are off (404)."""
        response = self._request("GET", "/metrics", timeout_s=min(self.timeout_s, 30.0))
        if response.status_code == 404:
            return None
        if not response.ok:
            raise self._http_error(response)
        return response.text

    # -- generation -------------------------------------------------------------------------

    def generate(
        self,
        text: str | None = None,
        input_ids: list[int] | None = None,
        sampling_params: dict | None = None,
        stream: bool = True,
        extra_body: Mapping[str, Any] | None = None,
    ) -> RequestTrace:
        """POST /generate for one prompt and return its trace.

        Exactly one of ``text`` / ``input_ids``. ``extra_body`` adds top-level request keys
        (``rid``, ``return_logprob``, ...). Never raises for a failure of the request itself
        (HTTP error, timeout, error chunk, dropped stream): the trace carries ``.error`` and
        whatever arrived. Raises ServerUnreachable when nothing could be sent.
        """
        if (text is None) == (input_ids is None):
            raise ValueError("generate needs exactly one of text= or input_ids=")
        body: dict[str, Any] = {"text": text} if text is not None else {"input_ids": [int(i) for i in input_ids or []]}
        if sampling_params:
            body["sampling_params"] = dict(sampling_params)
        body["stream"] = bool(stream)
        if extra_body:
            body.update(extra_body)
        url = self.url("/generate")
        t_send_unix_s = time.time()
        t0 = time.perf_counter()
        try:
            response = self._request("POST", "/generate", json_body=body, stream=stream)
        except ServerUnreachable:
            raise
        except ServerError as exc:
            kind = "timeout" if isinstance(exc, ServerTimeout) else "stream"
            return self._failed_trace(url, t_send_unix_s, None, str(exc), kind)
        if not response.ok:
            e2e = time.perf_counter() - t0
            err = self._http_error(response)
            response.close()
            return self._failed_trace(url, t_send_unix_s, e2e, str(err), "http")
        content_type = response.headers.get("Content-Type", "")
        if stream and not content_type.startswith("application/json"):
            return self._read_stream(response, url, t_send_unix_s, t0)
        # Non-stream request, or a server that answered a stream request with one JSON body.
        return self._read_whole(response, url, t_send_unix_s, t0)

    def _failed_trace(self, url: str, t_send_unix_s: float, e2e_s: float | None, error: str, kind: str) -> RequestTrace:
        trace = assemble_stream([], url, t_send_unix_s, e2e_s)
        trace.error = self._scrub(error)
        trace.error_kind = kind
        return trace

    def _read_whole(self, response: requests.Response, url: str, t_send_unix_s: float, t0: float) -> RequestTrace:
        try:
            data = response.json()
        except ValueError:
            return self._failed_trace(
                url, t_send_unix_s, time.perf_counter() - t0,
                str(ServerError(url, f"answer is not JSON: {response.text[:200]!r}")), "stream",
            )
        except requests.exceptions.RequestException as exc:
            return self._failed_trace(
                url, t_send_unix_s, time.perf_counter() - t0, str(StreamError(url, _connect_cause(exc))), "stream"
            )
        e2e = time.perf_counter() - t0
        if isinstance(data, list):  # batch answer: we send one prompt
            data = data[0] if data else {}
        trace = assemble_stream([(e2e, data)], url, t_send_unix_s, e2e)
        # A single non-stream answer has no per-chunk timing: do not pretend it does.
        trace.ttft_s = None
        trace.chunk_t_s, trace.chunk_tokens = [], []
        trace.stream_mode = None
        if isinstance(data, dict) and "error" in data:
            trace.error = self._scrub(str(ServerError(url, _error_message_from_body(json.dumps(data)))))
            trace.error_kind = "http"
        self._check_abort(trace)
        return trace

    def _check_abort(self, trace: RequestTrace) -> None:
        if trace.error is None:
            abort = _finish_reason_error(trace.finish_reason)
            if abort:
                trace.error = self._scrub(f"request to {trace.url}: {abort}")
                trace.error_kind = "aborted"

    def _read_stream(self, response: requests.Response, url: str, t_send_unix_s: float, t0: float) -> RequestTrace:
        decoder = SSEDecoder()
        events: list[tuple[float, SSEEvent]] = []
        errors: list[str] = []
        kind: str | None = None
        done = False
        t_last: float | None = None
        try:
            for data in _iter_raw(response):
                t = time.perf_counter() - t0
                t_last = t
                for event in decoder.feed(data):
                    events.append((t, event))
                    done = done or event == DONE
            leftover, partial = decoder.close()
            events.extend((t_last or 0.0, ev) for ev in leftover)
            done = done or any(ev == DONE for ev in leftover)
            if not done:
                n = sum(1 for _, ev in events if isinstance(ev, dict))
                detail = f" (and {len(partial)} bytes of an unfinished line)" if partial else ""
                errors.append(str(StreamError(url, f"connection closed before [DONE] after {n} chunks{detail}")))
                kind = "stream"
        except SSEFormatError as exc:
            errors.append(str(StreamError(url, str(exc))))
            kind = "stream"
        except (TimeoutError, urllib3.exceptions.ReadTimeoutError, requests.exceptions.Timeout):
            n = sum(1 for _, ev in events if isinstance(ev, dict))
            errors.append(str(ServerTimeout(url, f"no byte within {self.timeout_s:g} s after {n} chunks (timeout)")))
            kind = "timeout"
        except (urllib3.exceptions.HTTPError, requests.exceptions.RequestException, OSError) as exc:
            n = sum(1 for _, ev in events if isinstance(ev, dict))
            errors.append(
                str(StreamError(url, f"connection dropped after {n} chunks before [DONE] ({_connect_cause(exc)})"))
            )
            kind = "stream"
        finally:
            response.close()
        trace = assemble_stream(events, url, t_send_unix_s, t_last)
        error_chunks = [ev["error"] for _, ev in events if isinstance(ev, dict) and "error" in ev]
        if error_chunks:
            messages = [
                str(e.get("message") or e) if isinstance(e, Mapping) else str(e) for e in error_chunks
            ]
            errors.insert(0, str(StreamError(url, f"server sent an error chunk: {'; '.join(messages)}")))
            kind = "stream"
        if errors:
            trace.error = self._scrub(" | ".join(errors))
            trace.error_kind = kind
        self._check_abort(trace)
        return trace


#: Clients by engine name, so a vLLM client (OpenAI API) can be added beside SGLang's.
CLIENTS: dict[str, type[SGLangClient]] = {"sglang": SGLangClient}


def make_client(engine: str, base_url: str, **kwargs: Any) -> SGLangClient:
    """The client for ``engine`` (a key of CLIENTS); a clear error for an engine not supported."""
    try:
        cls = CLIENTS[engine.lower()]
    except KeyError:
        raise ValueError(f"engine {engine!r} is not supported; choose one of {sorted(CLIENTS)}") from None
    return cls(base_url, **kwargs)
