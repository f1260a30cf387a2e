"""One generate request as the client saw it (RequestTrace, the same for every engine), and its pure
assembly from SGLang's chunks (vLLM's are assembled in specdiag.serving.vllm_stream).

Every chunk carries a client-side timestamp (seconds after the request was sent). Tokens per chunk
always come from ``meta_info.completion_tokens`` deltas (cumulative in both of SGLang's stream
modes); the full text and output_ids are rebuilt whether the server streams cumulative chunks (the
default) or deltas (``--incremental-streaming-output``). Speculative-decoding fields come from the
final ``meta_info`` (specdiag.speculation.commit). No I/O here. Protocol facts: a real SGLang 0.5.17's replies, recorded in tests/data/sglang-0.5.17/.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal
from collections.abc import Mapping, Sequence

from specdiag.serving.redaction import redact_text
from specdiag.serving.sse import SSEEvent
from specdiag.speculation.commit import SpecFields, spec_fields_from_meta

__all__ = [
    "RequestTrace",
    "SpecFields",
    "assemble_stream",
    "detect_stream_mode",
]


# ---------------------------------------------------------------------------------------------
# Traces
# ---------------------------------------------------------------------------------------------


@dataclass
class RequestTrace:
    """One /generate request as the client saw it. Times are client-side, in seconds after send."""

    url: str
    t_send_unix_s: float  # wall clock when the request was sent (time.time())
    ttft_s: float | None  # first chunk that brought tokens; None for non-stream or no tokens
    chunk_t_s: list[float]  # arrival of each chunk that brought new tokens
    chunk_tokens: list[int]  # new tokens in that chunk (meta_info.completion_tokens deltas)
    prompt_tokens: int | None  # server-reported meta_info.prompt_tokens
    completion_tokens: int  # server-reported (final meta_info.completion_tokens)
    e2e_s: float | None  # send to last byte; None if nothing came back
    text: str
    output_ids: list[int]
    meta_info: dict  # the final chunk's meta_info (server-reported)
    finish_reason: dict | None
    spec: SpecFields | None
    error: str | None
    error_kind: str | None = None  # "http", "timeout", "stream", "aborted"; None when fine
    stream_mode: str | None = None  # "cumulative", "incremental"; None for non-stream
    n_chunks: int = 0  # data chunks received (error chunk excluded, [DONE] excluded)
    # Engine-neutral fields that row builders read (each engine's assembly fills them):
    engine: str | None = None  # "sglang", "vllm"
    cached_tokens: int | None = None  # server-reported prompt tokens served from the prefix cache
    server_e2e_s: float | None = None  # server-reported end-to-end latency, s
    finish_type: str | None = None  # "length", "stop", "abort", ...
    spec_source: str | None = None  # where ``spec`` came from (meta_info, per-request metrics, /metrics difference)
    warnings: list[str] = field(default_factory=list)  # what may make this trace's numbers less exact
    traffic: dict | None = None  # other traffic beside this request (specdiag.serving.traffic.TrafficReading.as_dict)
    server_stages: dict | None = None  # SGLang's stage latencies of this request (specdiag.serving.stages.stage_deltas)

    def __post_init__(self) -> None:
        # A trace built from SGLang's meta_info alone (tests, older code) gets the neutral fields from it.
        meta = self.meta_info if isinstance(self.meta_info, Mapping) else {}
        if self.finish_type is None:
            self.finish_type = _finish_type(self.finish_reason if self.finish_reason is not None
                                            else meta.get("finish_reason"))
        if self.engine in (None, "sglang"):
            if self.cached_tokens is None:
                self.cached_tokens = _int_or_none(meta.get("cached_tokens"))
            if self.server_e2e_s is None:
                self.server_e2e_s = _float_or_none(meta.get("e2e_latency"))
            if self.prompt_tokens is None:
                self.prompt_tokens = _int_or_none(meta.get("prompt_tokens"))


def _chunk_ids(chunk: Mapping[str, Any]) -> list[int] | None:
    ids = chunk.get("output_ids")
    return list(ids) if isinstance(ids, list) else None


def _chunk_ct(chunk: Mapping[str, Any]) -> int | None:
    meta = chunk.get("meta_info") or {}
    ct = meta.get("completion_tokens")
    return int(ct) if ct is not None else None


def detect_stream_mode(chunks: Sequence[Mapping[str, Any]]) -> Literal["cumulative", "incremental"]:
    """Tell SGLang's cumulative chunks (default) from deltas (``--incremental-streaming-output``).

    Cumulative: each chunk's output_ids has completion_tokens entries and extends the previous
    one. Incremental: the output_ids lengths add up to completion_tokens. Without output_ids, the
    text decides: cumulative if each text extends the previous one. When both readings fit
    (e.g. a single chunk) the result is the same either way and "cumulative" is returned.
    """
    with_ids = [(c, _chunk_ids(c), _chunk_ct(c)) for c in chunks]
    if any(ids is not None for _, ids, _ in with_ids):
        cumulative = incremental = True
        prev: list[int] = []
        total = 0
        for _, ids, ct in with_ids:
            ids = ids or []
            total += len(ids)
            if ct is not None:
                cumulative &= len(ids) == ct
                incremental &= total == ct
            cumulative &= ids[: len(prev)] == prev
            prev = ids
        if cumulative:
            return "cumulative"
        if incremental:
            return "incremental"
        # Neither fits exactly: prefix growth is the stronger sign of cumulative chunks.
        prefix_ok = all(
            (b or [])[: len(a or [])] == (a or []) for (_, a, _), (_, b, _) in zip(with_ids, with_ids[1:])
        )
        return "cumulative" if prefix_ok else "incremental"
    texts = [str(c.get("text") or "") for c in chunks]
    grows = all(b.startswith(a) for a, b in zip(texts, texts[1:]))
    return "cumulative" if grows else "incremental"


def _finish_reason_error(finish_reason: Any) -> str | None:
    if isinstance(finish_reason, Mapping) and finish_reason.get("type") == "abort":
        message = finish_reason.get("message") or "no message"
        status = finish_reason.get("status_code")
        return f"server aborted the request{f' (status {status})' if status else ''}: {message}"
    return None


def assemble_stream(
    events: list[tuple[float, SSEEvent]],
    url: str,
    t_send_unix_s: float,
    e2e_s: float | None,
) -> RequestTrace:
    """Build a RequestTrace from timestamped SSE events (pure; ``error`` left for the caller).

    ``events`` are ``(seconds after send, event)``; error chunks (``{"error": ...}``) are skipped
    here (the caller reports them) and ``[DONE]`` is ignored.
    """
    timed = [(t, ev) for t, ev in events if isinstance(ev, dict) and "error" not in ev]
    chunks = [ev for _, ev in timed]
    mode = detect_stream_mode(chunks) if chunks else "cumulative"
    chunk_t_s: list[float] = []
    chunk_tokens: list[int] = []
    text_parts: list[str] = []
    output_ids: list[int] = []
    text = ""
    prev_ct = 0
    for t, chunk in timed:
        ids = _chunk_ids(chunk)
        ct = _chunk_ct(chunk)
        if mode == "cumulative":
            if ids is not None:
                output_ids = ids
            if chunk.get("text") is not None:
                text = str(chunk["text"])
        else:
            output_ids.extend(ids or [])
            text_parts.append(str(chunk.get("text") or ""))
        if ct is None:  # no meta_info: count tokens from the ids instead
            ct = len(output_ids)
        new = ct - prev_ct
        if new > 0:
            chunk_t_s.append(t)
            chunk_tokens.append(new)
            prev_ct = ct
    if mode == "incremental":
        text = "".join(text_parts)
    meta: dict = dict(chunks[-1].get("meta_info") or {}) if chunks else {}
    finish_reason = meta.get("finish_reason")
    return RequestTrace(
        url=redact_text(url),
        t_send_unix_s=t_send_unix_s,
        ttft_s=chunk_t_s[0] if chunk_t_s else None,
        chunk_t_s=chunk_t_s,
        chunk_tokens=chunk_tokens,
        prompt_tokens=meta.get("prompt_tokens"),
        completion_tokens=prev_ct,
        e2e_s=e2e_s,
        text=text,
        output_ids=output_ids,
        meta_info=meta,
        finish_reason=finish_reason if isinstance(finish_reason, dict) else None,
        spec=spec_fields_from_meta(meta),
        error=None,
        stream_mode=mode if chunks else None,
        n_chunks=len(chunks),
        engine="sglang",
        cached_tokens=_int_or_none(meta.get("cached_tokens")),
        server_e2e_s=_float_or_none(meta.get("e2e_latency")),
        finish_type=_finish_type(finish_reason),
        spec_source="meta_info" if meta else None,
    )


def _int_or_none(x: Any) -> int | None:
    return int(x) if isinstance(x, (int, float)) and not isinstance(x, bool) else None


def _float_or_none(x: Any) -> float | None:
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) else None


def _finish_type(finish_reason: Any) -> str | None:
    if isinstance(finish_reason, Mapping):
        return str(finish_reason.get("type")) if finish_reason.get("type") is not None else None
    return str(finish_reason) if finish_reason is not None else None
