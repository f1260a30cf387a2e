"""Errors of a request to an inference server, and the message inside an error body (pure; imports
nothing of the library but the redaction).

Every message names the URL and the cause; URLs are scrubbed of secrets. Both engines answer errors
as JSON: SGLang and vLLM ``{"error": {"message": ...}}``, older vLLM ``{"object": "error", "message": ...}``,
FastAPI ``{"detail": ...}``; anything else is shown as text.
"""

from __future__ import annotations

import json

from specdiag.serving.redaction import redact_text

__all__ = [
    "ServerError",
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


class StreamError(ServerError):
    """The stream broke: an error chunk from the server, a dropped connection, malformed data."""

    def _message(self) -> str:
        return f"stream from {self.url} failed: {self.cause}"


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
