"""What every engine's HTTP client shares: URL and timeout checks, the API key, sending a request with
clear errors (unreachable, timeout, dropped), JSON GETs, /health, /metrics, and reading an SSE stream
with a client-side timestamp per event.

The API keys are passed in or read from the environment (never a notebook parameter, which papermill would
record, and never written anywhere): ``SPECDIAG_API_KEY`` for the server's ``--api-key``, and
``SPECDIAG_ADMIN_API_KEY`` for SGLang's ``--admin-api-key``. Each goes only into the ``Authorization: Bearer``
header of the endpoints that take it and is scrubbed from every message, trace and repr. SGLang 0.5.17's rules
(sglang/srt/utils/auth.py): /health* and /metrics* are always open; with ``--api-key`` alone every other endpoint
wants that key; with ``--admin-api-key`` too, its admin endpoints (``ADMIN_PATHS``: /flush_cache, /start_profile,
/stop_profile, the expert-distribution endpoints, ...) accept only the admin key and the rest only the API key.
So an admin endpoint gets the admin key when one is set, else the API key. A 401 or 403 raises
:class:`~specdiag.serving.errors.ServerAuthError`, naming the endpoint and the variable to set.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable, Iterator
from typing import Any
from urllib.parse import urlsplit

import requests
import urllib3.exceptions

from specdiag.serving.errors import (
    Answer,
    ServerAuthError,
    ServerError,
    ServerHTTPError,
    ServerTimeout,
    ServerUnreachable,
    StreamError,
    error_message_from_body,
)
from specdiag.serving.redaction import REDACTED, redact_text
from specdiag.serving.sse import DONE, SSEDecoder, SSEEvent, SSEFormatError
from specdiag.serving.stages import stage_deltas
from specdiag.serving.trace import RequestTrace, assemble_stream
from specdiag.serving.traffic import TrafficWatch
from specdiag.speculation.scrapes import Samples, parse_prometheus

__all__ = ["ADMIN_API_KEY_ENV", "API_KEY_ENV", "HTTPClient", "SSERead", "auth_hint"]

#: The environment variable that holds the server's API key (``--api-key`` on either engine).
API_KEY_ENV = "SPECDIAG_API_KEY"
#: The environment variable that holds SGLang's admin key (``--admin-api-key``), for its admin endpoints.
ADMIN_API_KEY_ENV = "SPECDIAG_ADMIN_API_KEY"


def auth_hint(status: int, admin: bool, api_key_set: bool, admin_key_set: bool) -> tuple[str, str]:
    """``(variable to set, what to do)`` for an HTTP 401/403 of an endpoint (``admin``: SGLang's admin endpoint)."""
    if admin:
        if status == 403:
            return ADMIN_API_KEY_ENV, ("the server takes this admin endpoint only with an admin key (it was started "
                                       f"without --admin-api-key, or refuses it to every key): set {ADMIN_API_KEY_ENV} "
                                       "to the server's --admin-api-key")
        if admin_key_set:
            return ADMIN_API_KEY_ENV, (f"the server refused the key in {ADMIN_API_KEY_ENV}"
                                       + (f" and the one in {API_KEY_ENV}" if api_key_set else "")
                                       + ": check it against the server's --admin-api-key")
        return ADMIN_API_KEY_ENV, ("an admin endpoint: a server started with --admin-api-key takes only that key here, "
                                   f"not the API key; set {ADMIN_API_KEY_ENV} to it"
                                   + ("" if api_key_set else f" (or {API_KEY_ENV}, if the server has only --api-key)"))
    if api_key_set:
        return API_KEY_ENV, f"the server refused the key in {API_KEY_ENV}: check it against the server's --api-key"
    return API_KEY_ENV, f"the server wants an API key (started with --api-key): set {API_KEY_ENV} to it"


# ---------------------------------------------------------------------------------------------
# HTTP helpers
# ---------------------------------------------------------------------------------------------


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


class SSERead:
    """The timestamped events of one SSE response and what went wrong while reading it."""

    def __init__(self) -> None:
        self.events: list[tuple[float, SSEEvent]] = []  # (seconds after send, event)
        self.errors: list[str] = []
        self.kind: str | None = None  # "stream" or "timeout" when something went wrong
        self.t_last: float | None = None  # arrival of the last bytes, s after send

    def n_chunks(self) -> int:
        return sum(1 for _, ev in self.events if isinstance(ev, dict))


class SentRequest:
    """A request the server accepted (2xx): its open response, URL and the send stamps."""

    def __init__(self, response: requests.Response, url: str, t_send_unix_s: float, t0: float) -> None:
        self.response = response
        self.url = url
        self.t_send_unix_s = t_send_unix_s  # time.time() just before sending
        self.t0 = t0  # time.perf_counter() just before sending: chunk times are seconds after it


FailedTrace = Callable[[str, float, "float | None", str, str], RequestTrace]


class HTTPClient:
    """What every engine's client shares: URL checks, the API key, requests, errors, /health, /metrics.

    ``timeout_s`` is the longest wait for any byte of an answer (a long prefill counts against
    it); connecting has its own limit, ``connect_timeout_s``. The HTTP session is passed in or
    made here; the API key goes only into the ``Authorization: Bearer`` header.
    """

    engine = "?"
    #: Environment variable read for the API key when none is passed (never a notebook parameter).
    API_KEY_ENV = API_KEY_ENV
    #: Paths of the engine's admin endpoints (they get the admin key when one is set); none by default.
    ADMIN_PATHS: frozenset[str] = frozenset()

    def __init__(
        self,
        base_url: str,
        session: requests.Session | None = None,
        api_key: str | None = None,
        timeout_s: float = 600.0,
        connect_timeout_s: float = 10.0,
        admin_api_key: str | None = None,
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
        self.__api_key = api_key or os.environ.get(API_KEY_ENV) or None
        self.__admin_key = admin_api_key or os.environ.get(ADMIN_API_KEY_ENV) or None
        self._admin_takes_api_key = False  # set when the server refused the admin key and took the API key
        self._metrics_off = False  # /metrics answered 404 once: not asked again
        self.traffic = TrafficWatch(self.engine)  # this client's requests against the server's counters

    def __repr__(self) -> str:
        key = f", api_key={REDACTED!r}" if self.__api_key else ""
        key += f", admin_api_key={REDACTED!r}" if self.__admin_key else ""
        return f"{type(self).__name__}({redact_text(self.base_url)!r}{key}, timeout_s={self.timeout_s})"

    @property
    def keys_set(self) -> dict[str, bool]:
        """Which keys this client sends (never the keys): ``{"SPECDIAG_API_KEY": True, ...}``."""
        return {API_KEY_ENV: bool(self.__api_key), ADMIN_API_KEY_ENV: bool(self.__admin_key)}

    # -- plumbing ---------------------------------------------------------------------------

    def url(self, path: str) -> str:
        return f"{self.base_url}/{path.lstrip('/')}"

    def _path_of(self, url: str) -> str:
        """The endpoint path of ``url`` (the base URL's own path prefix removed, no query)."""
        path = urlsplit(url).path
        prefix = urlsplit(self.base_url).path.rstrip("/")
        return ("/" + path[len(prefix):].lstrip("/")) if prefix and path.startswith(prefix) else (path or "/")

    def is_admin_path(self, path: str) -> bool:
        """Whether ``path`` is one of the engine's admin endpoints (:attr:`ADMIN_PATHS`)."""
        return path.split("?")[0].rstrip("/") in self.ADMIN_PATHS

    def _headers(self, admin: bool = False) -> dict[str, str]:
        key = self.__admin_key if admin and self.__admin_key and not self._admin_takes_api_key else self.__api_key
        return {"Authorization": f"Bearer {key}"} if key else {}

    def _scrub(self, text: str) -> str:
        for key in (self.__api_key, self.__admin_key):
            if key:
                text = text.replace(key, REDACTED)
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
        admin = self.is_admin_path(path)
        response = self._send_once(method, path, json_body, timeout_s, stream, admin)
        if (admin and response.status_code == 401 and self.__admin_key and self.__api_key
                and self.__api_key != self.__admin_key and not self._admin_takes_api_key):
            # a server with --api-key alone takes the API key on its admin endpoints: try it once, remember it
            retry = self._send_once(method, path, json_body, timeout_s, stream, admin=False)
            if retry.status_code != 401:
                response.close()
                self._admin_takes_api_key = True
                return retry
            retry.close()
        return response

    def _send_once(self, method: str, path: str, json_body: Any, timeout_s: float | None, stream: bool,
                   admin: bool) -> requests.Response:
        url = self.url(path)
        read_timeout = self.timeout_s if timeout_s is None else timeout_s
        try:
            return self.session.request(
                method,
                url,
                json=json_body,
                headers=self._headers(admin),
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
        """The error of an HTTP error status; a 401 or 403 is a :class:`ServerAuthError` naming the endpoint and
        the environment variable to set."""
        body = self._scrub(response.text[:2000])
        message = error_message_from_body(body)
        if response.status_code in (401, 403):
            path = self._path_of(response.url or "")
            method = getattr(getattr(response, "request", None), "method", None) or "GET"
            admin = self.is_admin_path(path)
            variable, hint = auth_hint(response.status_code, admin, bool(self.__api_key),
                                       bool(self.__admin_key) and not self._admin_takes_api_key)
            return ServerAuthError(response.url or "", response.status_code, body, message, f"{method} {path}",
                                   variable, hint)
        return ServerHTTPError(response.url or "", response.status_code, body, message)

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

    def _answer(self, path: str, timeout_s: float | None = None) -> tuple[Answer, Any]:
        """GET ``path``: what answered (:class:`~specdiag.serving.errors.Answer`) and its JSON (None when the
        answer is not JSON). Raises only when nothing answers (ServerUnreachable, ServerTimeout)."""
        response = self._request("GET", path, timeout_s=timeout_s)
        body = response.content[:4096]
        try:
            data = response.json() if response.ok else None
        except ValueError:
            data = None
        return Answer.of(path, response.status_code, response.headers, self._scrub(body.decode("utf-8", "replace"))), data

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

    def metrics_text(self) -> str | None:
        """GET /metrics (Prometheus text); None when metrics are off (404)."""
        response = self._request("GET", "/metrics", timeout_s=min(self.timeout_s, 30.0))
        if response.status_code == 404:
            return None
        if not response.ok:
            raise self._http_error(response)
        return response.text

    def metrics_samples(self) -> Samples | None:
        """/metrics parsed (``specdiag.speculation.scrapes.parse_prometheus``); None when metrics are off (404, then not asked
        again), unreadable, or the scrape failed."""
        if self._metrics_off:
            return None
        try:
            text = self.metrics_text()
        except ServerError:
            return None
        if text is None:
            self._metrics_off = True
            return None
        try:
            return parse_prometheus(text)
        except ValueError:
            return None

    def _watched(self, send: Callable[[], RequestTrace], before: Samples | None = None,
                 scraped: bool = False) -> tuple[RequestTrace, Samples | None, Samples | None]:
        """Run ``send()`` between two /metrics scrapes and put the request's traffic reading on its trace
        (``trace.traffic``, specdiag.serving.traffic); returns ``(trace, before, after)``."""
        if not scraped:
            before = self.metrics_samples()
        self.traffic.before(before)
        trace = send()
        after = self.metrics_samples() if before is not None else None
        queue = trace.meta_info.get("queue_time") if isinstance(trace.meta_info, dict) else None
        reading = self.traffic.after(after, int(trace.completion_tokens or 0),
                                     float(queue) if isinstance(queue, (int, float)) else None)
        trace.traffic = reading.as_dict()

        trace.server_stages = stage_deltas(before, after)
        return trace, before, after

    def _post_tokenize(self, body: dict[str, Any]) -> list[int]:
        """POST /tokenize with the engine's ``body``; the ``tokens`` list of the answer (both engines' shape)."""
        response = self._request("POST", "/tokenize", json_body=body, timeout_s=min(self.timeout_s, 120.0))
        if not response.ok:
            raise self._http_error(response)
        try:
            tokens = response.json()["tokens"]
        except (ValueError, KeyError, TypeError):
            raise ServerError(response.url, f"no 'tokens' list in the answer: {response.text[:200]!r}") from None
        return [int(t) for t in tokens]

    def _post_for_trace(self, path: str, body: dict[str, Any], stream: bool,
                        failed: FailedTrace) -> SentRequest | RequestTrace:
        """POST ``body`` to ``path``, stamping the send time first.

        Returns the accepted request, or the trace that ``failed(url, t_send_unix_s, e2e_s, error, kind)``
        makes of a timeout, a broken connection (kind "timeout" / "stream") or an HTTP error status (kind
        "http", with the server's message). Raises ServerUnreachable when nothing could be sent.
        """
        url = self.url(path)
        t_send_unix_s = time.time()
        t0 = time.perf_counter()
        try:
            response = self._request("POST", path, json_body=body, stream=stream)
        except ServerUnreachable:
            raise
        except ServerError as exc:
            kind = "timeout" if isinstance(exc, ServerTimeout) else "stream"
            return failed(url, t_send_unix_s, None, str(exc), kind)
        if not response.ok:
            e2e = time.perf_counter() - t0
            err = self._http_error(response)
            response.close()
            return failed(url, t_send_unix_s, e2e, str(err), "http")
        return SentRequest(response, url, t_send_unix_s, t0)

    def _failed_trace(self, url: str, t_send_unix_s: float, e2e_s: float | None, error: str, kind: str) -> RequestTrace:
        trace = assemble_stream([], url, t_send_unix_s, e2e_s)
        trace.error = self._scrub(error)
        trace.error_kind = kind
        return trace

    def health(self, timeout_s: float = 30.0) -> bool:
        """True when GET /health answers 2xx.

        False for any HTTP error status or a timeout; raises ServerUnreachable if nothing listens.
        """
        try:
            return self._request("GET", "/health", timeout_s=timeout_s).ok
        except (ServerTimeout, StreamError):
            return False

    def _read_sse(self, response: requests.Response, url: str, t0: float) -> SSERead:
        """Read an SSE response to its end, stamping each event with its arrival (s after ``t0``)."""
        decoder = SSEDecoder()
        read = SSERead()
        done = False
        try:
            for data in _iter_raw(response):
                t = time.perf_counter() - t0
                read.t_last = t
                for event in decoder.feed(data):
                    read.events.append((t, event))
                    done = done or event == DONE
            leftover, partial = decoder.close()
            read.events.extend((read.t_last or 0.0, ev) for ev in leftover)
            done = done or any(ev == DONE for ev in leftover)
            if not done:
                detail = f" (and {len(partial)} bytes of an unfinished line)" if partial else ""
                read.errors.append(str(StreamError(
                    url, f"connection closed before [DONE] after {read.n_chunks()} chunks{detail}")))
                read.kind = "stream"
        except SSEFormatError as exc:
            read.errors.append(str(StreamError(url, str(exc))))
            read.kind = "stream"
        except (TimeoutError, urllib3.exceptions.ReadTimeoutError, requests.exceptions.Timeout):
            read.errors.append(str(ServerTimeout(
                url, f"no byte within {self.timeout_s:g} s after {read.n_chunks()} chunks (timeout)")))
            read.kind = "timeout"
        except (urllib3.exceptions.HTTPError, requests.exceptions.RequestException, OSError) as exc:
            read.errors.append(str(StreamError(
                url, f"connection dropped after {read.n_chunks()} chunks before [DONE] ({_connect_cause(exc)})")))
            read.kind = "stream"
        finally:
            response.close()
        return read
