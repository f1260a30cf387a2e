"""00_snapshot's verdicts: speculation on or off, the attention backend and KV layout, the peak bandwidth.

Pure: from the (redacted) server settings, the settings rows of :func:`specdiag.steps.snapshot.settings.server_settings`
and the resolved :class:`~specdiag.hardware.HardwarePeaks`, to :class:`~specdiag.findings.Finding` objects.
Each finding's ``source`` is where its numbers came from: the server (``server-reported``), a recorded
run (the run's ``data_source``, ``published`` for a transcription), and for the peak the peak's own
source (a user's ``parameter``, NVML clocks x bus width ``computed``, the GPU table ``published``, a copy
timed here ``measured``).
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from specdiag.findings import Finding
from specdiag.hardware import HardwarePeaks, gb_s
from specdiag.serving.settings import speculation_state

#: server_info keys whose rows the attention finding cites as evidence.
ATTENTION_KEYS = ("attention_backend", "decode_attention_backend", "page_size", "kv_cache_dtype", "tp_size",
                  "context_length", "max_total_num_tokens")


def speculation_finding(server_info: Mapping[str, Any], source: str) -> Finding:
    """Speculative decoding on (algorithm, draft tokens, draft model), on with its method not exposed (vLLM
    without dev mode: what could not be seen and what to pass), off (a warning: no commit lengths), or unknown."""
    algo = server_info.get("speculative_algorithm")
    n_draft = server_info.get("speculative_num_draft_tokens")
    draft_model = server_info.get("speculative_draft_model_path")
    state = speculation_state(server_info)
    sources = server_info.get("settings_sources") if isinstance(server_info.get("settings_sources"), Mapping) else {}
    if state is not False and not (algo and str(algo).upper() != "NONE"):
        why = sources.get("speculating") or "not reported"
        if state is None:
            return Finding(
                "snapshot.speculation", "Speculative decoding: not known",
                "The server did not say whether it speculates (" + str(why) + ").", "warning",
                (f"speculative_decoding = None ({why})",), {"speculative_decoding": None}, source)  # type: ignore[arg-type]
        steps = (f"at most {n_draft} tokens per verify step ({server_info.get('speculative_num_steps')} drafts + the "
                 f"bonus token; {sources.get('speculative_num_steps') or sources.get('draft_steps') or 'server-reported'})"
                 if n_draft else f"its tokens per verify step not seen ({sources.get('tokens_per_step')})")
        return Finding(
            "snapshot.speculation", "Speculative decoding is on (method not exposed)",
            f"The server speculates ({why}), {steps}; its method is not exposed: "
            f"{sources.get('speculative_method') or 'not reported'}.", "info",
            (f"speculative_decoding = True ({why})", f"speculative_num_draft_tokens = {n_draft} ({source})"),
            {"speculative_decoding": True, "speculative_algorithm": None, "speculative_num_draft_tokens": n_draft},
            source)  # type: ignore[arg-type]
    if algo and str(algo).upper() != "NONE":
        # Another engine's method in its own words (vLLM: draft_model with k drafts = SGLang's STANDALONE, k + 1)
        engine, method = server_info.get("engine"), server_info.get("speculative_method")
        words = (f"{method} ({ {'vllm': 'vLLM'}.get(str(engine), engine)}'s name; SGLang's {algo}), at most {n_draft} tokens per verify step "
                 f"({server_info.get('speculative_num_steps')} drafts + the bonus token)"
                 if engine not in (None, "sglang") and method else f"{algo} with {n_draft} draft tokens per verify step")
        return Finding(
            "snapshot.speculation", "Speculative decoding is on",
            words
            + (f"; draft model {draft_model}." if draft_model else
               "; no draft model (NGRAM drafts from the prompt itself)." if str(algo).upper() == "NGRAM" else
               "; the draft model path was not reported."),
            "info", (f"speculative_algorithm = {algo}, speculative_num_draft_tokens = {n_draft} ({source})",),
            {"speculative_algorithm": algo, "speculative_num_draft_tokens": n_draft}, source)  # type: ignore[arg-type]
    return Finding(
        "snapshot.speculation", "Speculative decoding is off",
        "The server runs without speculative decoding: commit lengths and verify steps cannot be measured; "
        "step times are per decoded token.", "warning",
        (f"speculative_algorithm = {algo!r} ({source})",), {"speculative_algorithm": algo}, source)  # type: ignore[arg-type]


def attention_finding(server_info: Mapping[str, Any], settings: Sequence[Mapping[str, Any]], source: str) -> Finding:
    """The attention backend, KV page size and dtype, tensor parallelism and context length, as reported."""
    parts = [f"{label} {server_info[key]}{unit}" for key, label, unit in (
        ("attention_backend", "Attention backend", ""), ("page_size", "KV page size", " tokens"),
        ("kv_cache_dtype", "KV cache dtype", ""), ("tp_size", "tensor parallel size", ""),
        ("context_length", "context length", " tokens")) if server_info.get(key) is not None]
    return Finding(
        "snapshot.attention", "Attention backend and KV layout",
        ("; ".join(parts) + ".") if parts else "The server reported none of its attention settings.", "info",
        tuple(f"{r['key']} = {r['value']} ({source})" for r in settings if r["key"] in ATTENTION_KEYS),
        {k: server_info.get(k) for k in ("attention_backend", "page_size", "kv_cache_dtype", "tp_size",
                                         "context_length")},
        source)  # type: ignore[arg-type]


def peak_finding(peaks: HardwarePeaks | None, error: str | None, where: str, recorded_as: str) -> Finding:
    """The peak memory bandwidth with the label of its source, or a warning naming the parameters to pass.

    ``recorded_as``: the finding source of a figure read from a recorded run (the run's data source).
    """
    if peaks is None:
        return Finding(
            "snapshot.peak_bandwidth", "Peak memory bandwidth unknown",
            "Notebook 05 needs the server GPU's peak bandwidth: pass gpu_name or memory_bandwidth_gb_s.", "warning",
            (error or "",), {}, "configured")
    bw = peaks.memory_bandwidth
    return Finding(
        "snapshot.peak_bandwidth", "Peak memory bandwidth",
        f"{peaks.device_name}: {gb_s(peaks.memory_bandwidth_gb_s)} per device ({bw.label}).",
        "info", (bw.detail, f"hardware of: {where}"),
        {"memory_bandwidth_gb_s": peaks.memory_bandwidth_gb_s, "matmul_bf16_tflops": peaks.matmul_tflops,
         "memory_bandwidth_source": bw.source},
        bw.finding_source(recorded_as))  # type: ignore[arg-type]


def snapshot_findings(server_info: Mapping[str, Any], settings: Sequence[Mapping[str, Any]],
                      peaks: HardwarePeaks | None, peaks_error: str | None, where: str,
                      source: str) -> list[Finding]:
    """All of 00's findings. ``source``: ``server-reported`` live, the recorded run's data source on replay."""
    return [speculation_finding(server_info, source), attention_finding(server_info, settings, source),
            peak_finding(peaks, peaks_error, where, recorded_as=source)]


def peak_rows(peaks: HardwarePeaks) -> list[dict[str, Any]]:
    """The peaks as table rows ``{peak, value, device, source, detail}`` with labelled sources."""
    return [
        {"peak": "memory bandwidth", "value": gb_s(peaks.memory_bandwidth_gb_s), "device": peaks.device_name,
         "source": peaks.memory_bandwidth.label, "detail": peaks.memory_bandwidth.detail},
        {"peak": "matmul (bf16; a CPU's faster dtype)",
         "value": f"{peaks.matmul_tflops:,.3g} TFLOPS" if peaks.matmul else "unknown",
         "device": peaks.device_name, "source": peaks.matmul.label if peaks.matmul else "-",
         "detail": peaks.matmul.detail if peaks.matmul else "-"},
    ]
