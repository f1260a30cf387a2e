"""Which server a notebook saw: its start and its settings, so a run can tell when the server was restarted or
reconfigured between notebooks (pure).

- ``started``: when the server process started, where it says: vLLM's ``process_start_time_seconds`` on /metrics
  (Unix time), the embedded server's ``startup_time`` (Unix time); SGLang 0.5.17 reports its start-up durations
  (``startup_time``: seconds per phase) and the ``random_seed`` it drew at start, which change on every start:
  ``start_marker`` is a short hash of them (and of the process start time, where there is one).
- ``settings``: the typed settings that decide the measurements (model, context length, speculation, tokens per
  step, drafter, attention backend, page size, dtypes, tensor parallelism, version); ``settings_hash`` hashes them.

Two notebooks saw the same server when URL, ``start_marker`` and ``settings_hash`` agree. :func:`changes` says
what differs, in words.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

__all__ = ["IDENTITY_SETTINGS", "changes", "same_server", "server_identity"]

#: ServerSettings fields that decide the measurements (a change between notebooks is a reconfigured server).
IDENTITY_SETTINGS: tuple[str, ...] = (
    "engine", "version", "model", "context_length", "speculating", "speculative_method", "algorithm",
    "tokens_per_step", "draft_steps", "draft_model", "draft_window", "attention_backend", "page_size",
    "kv_cache_dtype", "dtype", "tp_size", "device",
)


def _hash(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:12]


def server_identity(url: str, settings: Any, metrics: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The identity of the server at ``url``: ``started`` (Unix time, or None), ``start_marker``, ``settings``,
    ``settings_hash``. ``settings``: a :class:`~specdiag.serving.settings.ServerSettings`; ``metrics``: its /metrics
    parsed (:func:`specdiag.speculation.scrapes.parse_prometheus`), or None."""
    values = {name: getattr(settings, name, None) for name in IDENTITY_SETTINGS}
    info = (getattr(settings, "raw", None) or {}).get("server_info") or {}
    started: float | None = None
    marks: dict[str, Any] = {}
    for labels, value in (metrics or {}).get("process_start_time_seconds", []):
        started = float(value)
        marks["process_start_time_seconds"] = started
    if isinstance(info, Mapping):
        startup = info.get("startup_time")
        if isinstance(startup, (int, float)) and startup > 1e9:  # a Unix time (the embedded server)
            started = started or float(startup)
        if startup is not None:
            marks["startup_time"] = startup
        if info.get("random_seed") is not None:
            marks["random_seed"] = info.get("random_seed")
    return {"url": url.rstrip("/"), "started": started, "start_marker": _hash(marks) if marks else None,
            "settings": values, "settings_hash": _hash(values)}


def same_server(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    """Whether two identities are one server as it ran (same URL, start and settings)."""
    return (a.get("url") == b.get("url") and a.get("start_marker") == b.get("start_marker")
            and a.get("settings_hash") == b.get("settings_hash"))


def changes(a: Mapping[str, Any], b: Mapping[str, Any]) -> list[str]:
    """What differs from identity ``a`` to ``b``, in words ([] when the same server)."""
    out: list[str] = []
    if a.get("url") != b.get("url"):
        out.append(f"another URL ({a.get('url')} -> {b.get('url')})")
    elif a.get("start_marker") != b.get("start_marker"):
        when = (f" (started {a.get('started'):.0f} -> {b.get('started'):.0f}, Unix time)"
                if a.get("started") and b.get("started") else "")
        out.append("restarted" + when)
    sa, sb = a.get("settings") or {}, b.get("settings") or {}
    diff = [f"{k} {sa.get(k)!r} -> {sb.get(k)!r}" for k in IDENTITY_SETTINGS if sa.get(k) != sb.get(k)]
    if diff:
        out.append("other settings: " + ", ".join(diff))
    return out
