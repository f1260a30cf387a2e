"""Server-Sent Events parsing (pure): SSE lines or raw network bytes to JSON events and ``[DONE]``.

Streaming ``POST /generate`` is read as Server-Sent Events (``data: {...}`` + blank line, ended by
``data: [DONE]``). ``parse_sse_lines`` reads a stream's lines; ``SSEDecoder`` decodes raw bytes
incrementally as they arrive from the network. No I/O here: the HTTP client (specdiag.serving.http) feeds
the bytes and timestamps the events. Protocol facts: a real SGLang 0.5.17's replies, recorded in tests/data/sglang-0.5.17/.
"""

from __future__ import annotations

import json
from typing import Literal
from collections.abc import Iterable, Iterator

__all__ = [
    "DONE",
    "SSEDecoder",
    "SSEEvent",
    "SSEFormatError",
    "parse_sse_lines",
]

DONE: Literal["[DONE]"] = "[DONE]"
SSEEvent = dict | Literal["[DONE]"]


class SSEFormatError(ValueError):
    """An SSE ``data:`` payload that is neither JSON nor ``[DONE]``."""


# ---------------------------------------------------------------------------------------------
# SSE parsing (pure)
# ---------------------------------------------------------------------------------------------


def _decode_payload(data_lines: list[str]) -> list[SSEEvent]:
    payload = "\n".join(data_lines)
    if payload.strip() == DONE:
        return [DONE]
    try:
        return [json.loads(payload)]
    except json.JSONDecodeError:
        pass
    if len(data_lines) > 1:  # tolerate servers that omit the blank line between events
        return [ev for line in data_lines for ev in _decode_payload([line])]
    raise SSEFormatError(f"malformed SSE data (not JSON): {payload[:200]!r}")


class _EventBuilder:
    """Collects ``data:`` fields until a blank line ends the event (the SSE rules)."""

    def __init__(self) -> None:
        self.data: list[str] = []

    def line(self, line: str) -> list[SSEEvent]:
        line = line.rstrip("\r\n")
        if line == "":
            return self.flush()
        if line.startswith(":"):  # comment / keep-alive
            return []
        name, _, value = line.partition(":")
        if name == "data":
            self.data.append(value[1:] if value.startswith(" ") else value)
        # "event:", "id:", "retry:" and unknown fields carry nothing SGLang uses.
        return []

    def flush(self) -> list[SSEEvent]:
        if not self.data:
            return []
        data, self.data = self.data, []
        return _decode_payload(data)


def parse_sse_lines(lines: Iterable[bytes | str]) -> Iterator[SSEEvent]:
    """Yield the events of an SSE stream: a dict per JSON ``data:`` payload, or ``"[DONE]"``.

    ``lines`` are the stream's lines, with or without their line ending; an event ends at a blank
    line (a last event without one is still yielded). Comment lines and non-data fields are
    skipped. A payload that is not JSON raises SSEFormatError.
    """
    builder = _EventBuilder()
    for raw in lines:
        text = raw.decode("utf-8") if isinstance(raw, bytes) else raw
        # one item may hold several lines (e.g. a whole chunk)
        if text.endswith("\n"):
            text = text[:-1]
        # split on "\n" only: JSON text may hold U+2028 and friends, which splitlines() would cut
        for line in text.split("\n"):
            yield from builder.line(line)
    yield from builder.flush()


class SSEDecoder:
    """Incremental SSE decoder over raw bytes as they arrive from the network.

    ``feed(data)`` returns the events completed by ``data``; ``close()`` returns what is left
    (an unterminated last event, if it decodes) and tells whether the stream ended mid-line.
    """

    def __init__(self) -> None:
        self._buffer = b""
        self._builder = _EventBuilder()

    def feed(self, data: bytes) -> list[SSEEvent]:
        self._buffer += data
        events: list[SSEEvent] = []
        while True:
            cut = self._buffer.find(b"\n")
            if cut < 0:
                break
            line, self._buffer = self._buffer[:cut], self._buffer[cut + 1:]
            events.extend(self._builder.line(line.decode("utf-8", "replace")))
        return events

    def close(self) -> tuple[list[SSEEvent], bytes]:
        """Flush: (events from a last unterminated event, bytes of an unfinished last line)."""
        tail, self._buffer = self._buffer, b""
        events: list[SSEEvent] = []
        try:
            if tail.strip():
                events.extend(self._builder.line(tail.decode("utf-8", "replace")))
            events.extend(self._builder.flush())
        except SSEFormatError:
            return [], tail
        return events, b""
