"""What a run is about: the server's settings, the model and the machine, as rows for tables.

``server_settings(server_info)`` picks the fields that decide long-context speculative decoding
(SGLang's flat ``/server_info`` names, as recorded from SGLang 0.5.17 in tests/data/sglang-0.5.17/); ``local_machine()``
describes the host this code runs on, which is the server's hardware only when the server runs here
(:func:`specdiag.serving.locality.is_local_url`). Secrets are redacted by :func:`specdiag.serving.redaction.redact` before anything is kept.
"""

from __future__ import annotations

import os
import platform
import socket
from typing import Any, Mapping

from specdiag.serving.redaction import redact

#: (server_info key, what it is), in the order the table shows them.
SERVER_FIELDS: tuple[tuple[str, str], ...] = (
    ("model_path", "target model"),
    ("served_model_name", "served model name"),
    ("speculative_decoding", "speculative decoding on"),
    ("speculative_algorithm", "speculative algorithm"),
    ("speculative_draft_model_path", "draft model"),
    ("speculative_num_draft_tokens", "draft tokens per verify step"),
    ("speculative_num_steps", "draft steps"),
    ("speculative_eagle_topk", "draft tree top-k"),
    ("speculative_draft_window_size", "draft window, tokens"),
    ("speculative_dflash_block_size", "DFLASH block size, tokens"),
    ("attention_backend", "attention backend"),
    ("decode_attention_backend", "decode attention backend"),
    ("prefill_attention_backend", "prefill attention backend"),
    ("speculative_draft_attention_backend", "drafter attention backend"),
    ("page_size", "KV page size, tokens"),
    ("tp_size", "tensor parallel size"),
    ("dp_size", "data parallel size"),
    ("context_length", "context length, tokens"),
    ("max_total_num_tokens", "KV pool capacity, tokens"),
    ("kv_cache_dtype", "KV cache dtype"),
    ("dtype", "weights dtype"),
    ("triton_attention_num_kv_splits", "Triton decode KV splits"),
    ("stream_interval", "stream interval, tokens"),
    ("disable_overlap_schedule", "overlap schedule disabled"),
    ("enable_metrics", "Prometheus metrics on"),
    ("device", "device"),
    ("version", "server version"),
    ("engine", "engine"),
    ("speculative_method", "speculative method (engine's name)"),
    ("cache_reset", "prefix cache can be reset"),
)

#: model_info keys worth a line.
MODEL_FIELDS: tuple[str, ...] = ("model_path", "served_model_name", "tokenizer_path", "model_type", "architectures",
                                 "is_generation", "weight_version")


def _first_state(server_info: Mapping[str, Any]) -> Mapping[str, Any]:
    states = server_info.get("internal_states")
    return states[0] if isinstance(states, list) and states and isinstance(states[0], Mapping) else {}


def server_settings(server_info: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Rows ``{setting, key, value, source}`` for the fields of :data:`SERVER_FIELDS` the server reports
    (top level first, then its first ``internal_states`` entry). Values are redacted."""
    info = redact(dict(server_info))
    state = _first_state(info)
    rows = []
    for key, label in SERVER_FIELDS:
        if key in info and info[key] is not None:
            value = info[key]
        elif key in state and state[key] is not None:
            value = state[key]
        else:
            continue
        rows.append({"setting": label, "key": key, "value": value, "source": _source_of(info, key)})
    return rows


#: run.json server key -> ServerSettings field (for the per-field sources an engine-neutral snapshot carries).
_SETTINGS_FIELD = {"model_path": "model", "speculative_algorithm": "algorithm", "speculative_method": "speculative_method",
                   "speculative_decoding": "speculating",
                   "speculative_num_draft_tokens": "tokens_per_step", "speculative_num_steps": "draft_steps",
                   "speculative_draft_model_path": "draft_model", "speculative_draft_window_size": "draft_window",
                   "speculative_dflash_block_size": "block_size", "dflash_target_layer_ids": "target_layer_ids",
                   "speculative_draft_attention_backend": "draft_attention_backend"}


def _source_of(info: Mapping[str, Any], key: str) -> str:
    """``server-reported`` (and from where, when the snapshot says), or ``configured`` / ``computed``."""
    sources = info.get("settings_sources")
    if not isinstance(sources, Mapping):
        return "server-reported"
    where = sources.get(_SETTINGS_FIELD.get(key, key))
    if not where:
        return "server-reported"
    where = str(where)
    if where.startswith("parameter"):
        return f"configured: {where}"
    if where.startswith("computed"):
        return where
    return f"server-reported: {where}"


def not_reported(settings: Any) -> list[str]:
    """The typed settings (``ServerSettings``) the server did not report: shown as such, never guessed (settings
    that do not apply to the server's algorithm, such as a DFLASH block on an NGRAM server, are left out)."""
    if settings is None:
        return []
    return [f"{r['setting']} ({r['source']})" for r in settings.rows()
            if r["value"] is None and not str(r["source"]).startswith("not applicable")]


#: DFLASH's settings 00 shows: (label, ServerSettings field, run.json server key)
DFLASH_FIELDS: tuple[tuple[str, str, str], ...] = (
    ("block size, tokens (the last committed token + drafts)", "block_size", "speculative_dflash_block_size"),
    ("draft window, tokens", "draft_window", "speculative_draft_window_size"),
    ("target layer ids (the drafter's context)", "target_layer_ids", "dflash_target_layer_ids"),
    ("drafter attention backend", "draft_attention_backend", "speculative_draft_attention_backend"),
)


def dflash_rows(settings: Any, server_info: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Rows ``{setting, value, source}`` of DFLASH's block size, draft window, target layer ids and drafter
    attention backend as the server states them, a value it does not state shown empty with why ([] unless the
    server runs DFLASH). ``settings``: the live ServerSettings; None when replaying: run.json's flat ``server``
    then gives the values and its ``settings_sources`` the sources."""
    if str(server_info.get("speculative_algorithm") or "").upper() != "DFLASH":
        return []
    if settings is not None:
        return [{"setting": label, "value": _shown(getattr(settings, name)), "source": settings.source(name)}
                for label, name, _ in DFLASH_FIELDS]
    rows = []
    state = _first_state(server_info)
    for label, _, key in DFLASH_FIELDS:
        value = server_info.get(key, state.get(key))
        if key == "dflash_target_layer_ids" and value is None:
            drafter = server_info.get("speculative_draft_model_config") or {}
            value = (drafter.get("dflash_config") or {}).get("target_layer_ids") if isinstance(drafter, Mapping) \
                else None
        rows.append({"setting": label, "value": _shown(value),
                     "source": _source_of(server_info, key) if value is not None else "not stated in the record"})
    return rows


def _shown(value: Any) -> Any:
    return ", ".join(map(str, value)) if isinstance(value, (list, tuple)) else value


def model_settings(model_info: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Rows ``{setting, value, source}`` of the model_info keys in :data:`MODEL_FIELDS` (redacted)."""
    info = redact(dict(model_info))
    return [{"setting": k, "value": info[k], "source": "server-reported"} for k in MODEL_FIELDS
            if info.get(k) is not None]


def _cpu_model() -> str | None:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None


def local_machine() -> dict[str, Any]:
    """This host: CPU model and cores, memory, and each CUDA GPU's name and memory (measured here)."""
    out: dict[str, Any] = {"host": socket.gethostname(), "platform": platform.platform(), "cpu": _cpu_model(),
                           "cpu_cores": os.cpu_count()}
    try:
        import psutil  # noqa: PLC0415 - optional: the except says what happens without it

        out["memory_gib"] = round(psutil.virtual_memory().total / 2**30, 1)
    except ImportError:
        out["memory_gib"] = None
    gpus: list[dict[str, Any]] = []
    try:
        import torch  # noqa: PLC0415 - optional: the except says what happens without it

        if torch.cuda.is_available():
            for i in range(torch.cuda.device_count()):
                p = torch.cuda.get_device_properties(i)
                gpus.append({"index": i, "name": p.name, "memory_gib": round(p.total_memory / 2**30, 1),
                             "sm_count": p.multi_processor_count, "compute_capability": f"{p.major}.{p.minor}"})
    except ImportError:
        pass
    out["gpus"] = gpus
    return out


def machine_rows(machine: Mapping[str, Any]) -> list[dict[str, Any]]:
    """``local_machine()`` as ``{item, value}`` rows, one per GPU."""
    rows = [{"item": k.replace("_", " "), "value": machine[k]} for k in
            ("host", "platform", "cpu", "cpu_cores", "memory_gib") if machine.get(k) is not None]
    for g in machine.get("gpus") or []:
        rows.append({"item": f"GPU {g['index']}", "value": f"{g['name']}, {g['memory_gib']} GiB, "
                                                            f"{g['sm_count']} SMs, sm_{g['compute_capability']}"})
    if not machine.get("gpus"):
        rows.append({"item": "GPUs", "value": "none (CUDA not available here)"})
    return rows


def count_redacted(original: Any, redacted: Any) -> int:
    """How many values :func:`specdiag.serving.redaction.redact` replaced between ``original`` and ``redacted``."""
    if isinstance(original, Mapping) and isinstance(redacted, Mapping):
        return sum(count_redacted(original[k], redacted.get(k)) for k in original)
    if isinstance(original, (list, tuple)) and isinstance(redacted, (list, tuple)):
        return sum(count_redacted(a, b) for a, b in zip(original, redacted))
    return int(original != redacted)


def _scalar(value: Any) -> bool:
    return isinstance(value, (str, int, float, bool)) or (
        isinstance(value, list) and all(isinstance(v, (str, int, float, bool)) for v in value))


def record_rows(record: Mapping[str, Any], source: str) -> list[dict[str, Any]]:
    """A recorded section of run.json (``model``, ``drafter``...) as ``{setting, value, source}`` rows:
    its scalar values and lists of scalars; nested sections are left to their own tables, except a
    transcription's ``published_config`` (rows labelled ``source``) and ``assumed_config`` (labelled
    ``assumed (not published)``)."""
    rows = []
    rec = redact(dict(record))
    for key, value in rec.items():
        if _scalar(value):
            rows.append({"setting": key, "value": value, "source": source})
    for section, label in (("published_config", source), ("assumed_config", "assumed (not published)")):
        for key, value in dict(rec.get(section) or {}).items():
            if _scalar(value):
                rows.append({"setting": key, "value": value, "source": label})
    return rows
