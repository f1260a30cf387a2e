"""Errors of a request to an inference server, and the message inside an error body (pure; imports
nothing of the library but the redaction).

Every message names the URL and the cause; URLs are scrubbed of secrets. Both engines answer errors
as JSON: SGLang and vLLM ``{"error": {"message": ...}}``, older vLLM ``{"object": "error", "message": ...}``,
FastAPI ``{"detail": ...}``; anything else is shown as text.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from specdiag.serving.redaction import redact_text

__all__ = [
    "Answer",
    "NotAnEngine",
    "ServerError",
    "ServerAuthError",
    "ServerHTTPError",
    "ServerTimeout",
    "ServerUnreachable",
    "StreamError",
    "error_message_from_body",
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


class ServerAuthError(ServerHTTPError):
    """The server refused the request's key (HTTP 401 or 403). ``.endpoint`` ("POST /flush_cache") and
    ``.variable`` (the environment variable to set) name the fix; the message says both."""

    def __init__(self, url: str, status: int, body: str, message: str, endpoint: str, variable: str,
                 hint: str) -> None:
        self.endpoint = endpoint
        self.variable = variable
        self.hint = hint
        super().__init__(url, status, body, message)

    def _message(self) -> str:
        return f"{self.endpoint} ({self.url}) answered {self.cause}: {self.hint}"


class StreamError(ServerError):
    """The stream broke: an error chunk from the server, a dropped connection, malformed data."""

    def _message(self) -> str:
        return f"stream from {self.url} failed: {self.cause}"


@dataclass(frozen=True)
class Answer:
    """What one GET answered, in brief: enough to tell what kind of server it is."""

    path: str           # the path asked for, e.g. /v1/models
    status: int         # HTTP status
    content_type: str   # the Content-Type header ("" when none)
    server: str         # the Server header ("" when none)
    head: str           # the body's first characters, whitespace collapsed

    @classmethod
    def of(cls, path: str, status: int, headers: dict[str, str] | object, body: bytes | str,
           n_chars: int = 60) -> "Answer":
        get = getattr(headers, "get", lambda key, default="": default)
        text = body.decode("utf-8", "replace") if isinstance(body, bytes) else str(body)
        head = re.sub(r"\s+", " ", text[: 4 * n_chars]).strip()
        return cls(path, int(status), str(get("Content-Type", "") or "").split(";")[0].strip(),
                   str(get("Server", "") or ""), redact_text(head[:n_chars] + ("..." if len(head) > n_chars else "")))

    def describe(self) -> str:
        """'GET /v1/models: HTTP 404, text/html, server SimpleHTTP/0.6 Python/3.11, body "<!DOCTYPE HTML> ..."'."""
        parts = [f"HTTP {self.status}", self.content_type or "no content type"]
        if self.server:
            parts.append(f"server {self.server}")
        if self.head:
            parts.append(f'body "{self.head}"')
        return f"GET {self.path}: " + ", ".join(parts)


class NotAnEngine(ServerError):
    """Something answers HTTP at the URL, but not as SGLang or vLLM do. ``.answers``: what each probe got.

    One short message: what answered (the first probe's status, content type, server header and first bytes;
    the others' statuses) and what was expected."""

    EXPECTED = "SGLang's /server_info or vLLM's /v1/models (owned_by vllm), as JSON"

    def __init__(self, base_url: str, answers: list[Answer]) -> None:
        self.answers = list(answers)
        first, rest = self.answers[0], self.answers[1:]
        what = first.describe() + "".join(f"; GET {a.path}: HTTP {a.status}" + (f" {a.content_type}" if a.content_type
                                                                             and a.content_type != first.content_type
                                                                             else "") for a in rest)
        super().__init__(base_url, what)

    def _message(self) -> str:
        return (f"{self.url} is not an SGLang or vLLM server: {self.cause}. Expected {self.EXPECTED}. "
                "Check SERVER (server_url): the host and port of the inference server.")


def error_message_from_body(body: str) -> str:
    """The message of an error body: ``{"error": {"message"}}``, ``{"message"}``, FastAPI ``{"detail"}``, else text."""
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
