"""Record one long request while the device is sampled: the live half of notebook 02.

:func:`measure_utilization` is what the notebook (and ``specdiag sweep --measure gpu_utilization`` on a machine
without papermill) runs when measuring: it builds the prompt, reads the server and the device's peak
bandwidth, warms the server up, then :func:`record_sampled_request` sends the request inside a
:class:`specdiag.telemetry.sampler.Sampler` window. Everything the analysis needs on replay (timing, sampler
statistics, the telemetry source, the server's settings, the models' config.json, the peak bandwidth)
is written into the request's ``telemetry_request`` row.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, Mapping, Sequence

from specdiag.geometry import PRESETS, preset_config
from specdiag.hardware import run_peaks
from specdiag.measure.fresh_prompt import freshen, reset_note
from specdiag.measure.metrics import sweep_row
from specdiag.measure.request import ADD_SPECIAL_TOKENS, exact_prompt, greedy, send
from specdiag.paths import PROJECT_ROOT
from specdiag.telemetry.sampler import Sampler, TelemetrySource


#: server_info keys kept with the request row (what the prediction and the page need on replay).
SERVER_KEYS: tuple[str, ...] = (
    "model_path", "speculative_decoding", "speculative_algorithm", "speculative_num_draft_tokens", "speculative_num_steps",
    "speculative_draft_model_path", "dtype", "kv_cache_dtype", "attention_backend", "page_size", "device",
    "context_length", "tp_size", "version",
)


def local_model_configs(server_info: Mapping[str, Any]) -> dict[str, dict[str, Any] | None]:
    """The target's and drafter's config.json when their paths (server-reported) exist on this machine.

    Relative paths are taken from the project root (the embedded server's ``data/models/...``).
    A remote server's models are not readable here: their entries are None.
    """
    out: dict[str, dict[str, Any] | None] = {}
    for role, key in (("target", "model_path"), ("drafter", "speculative_draft_model_path")):
        raw = server_info.get(key)
        cfg = None
        if raw:
            path = Path(str(raw))
            path = path if path.is_absolute() else PROJECT_ROOT / path
            if path.is_dir():
                path = path / "config.json"
            if path.is_file():
                cfg = json.loads(path.read_text())
        out[role] = cfg
    return out


def model_config_from_parameter(model_config: str) -> dict[str, Any]:
    """The notebook parameter ``model_config`` (a geometry preset name or a config.json path) as a config dict."""
    if model_config in PRESETS:
        return preset_config(model_config)
    path = Path(model_config)
    path = path / "config.json" if path.is_dir() else path
    if not path.is_file():
        raise ValueError(f"model_config {model_config!r} is neither a preset ({', '.join(sorted(PRESETS))}) "
                         f"nor a config.json path on this machine")
    return json.loads(path.read_text())


def peak_bandwidth(run: Any, source_info: Mapping[str, Any], device_name: str | None,
                   memory_bandwidth_gb_s: float = 0.0, server_info: Mapping[str, Any] | None = None,
                   server_url: str = "") -> dict[str, Any]:
    """The run's peak memory bandwidth (``hardware.run_peaks``: the figure every notebook of the run uses, resolved
    once and kept in run.json), as ``HardwarePeaks.as_dict()``; ``{"error": ...}`` when there is none.

    A parameter wins; then the run's recorded peak (00's); then the server's machine when it is this one; a
    remote GPU sampled through Prometheus is looked up by its device name.
    """
    remote_gpu = (device_name or "") if source_info.get("kind") == "prometheus" else ""
    try:
        return run_peaks(run, memory_bandwidth_gb_s, server_info=dict(server_info or {}), server_url=server_url,
                         device_name=remote_gpu).as_dict()
    except ValueError as exc:  # recorded; the page then says why there is no prediction
        return {"error": str(exc)}


def request_row(trace: Any, context_tokens: int, max_new_tokens: int, **extra: Any) -> dict[str, Any]:
    """The ``telemetry_request`` row: the sweep metrics of the trace plus its raw stream timing."""
    row = sweep_row(trace, context_tokens)
    row.update(
        max_new_tokens=int(max_new_tokens),
        t_send_unix_s=trace.t_send_unix_s,
        chunk_t_s=list(trace.chunk_t_s or []),
        chunk_tokens=list(trace.chunk_tokens or []),
        **extra,
    )
    return row


def record_sampled_request(run: Any, client: Any, source: TelemetrySource, input_ids: Sequence[int],
                           max_new_tokens: int, rate_hz: float = 50.0, idle_before_s: float = 1.0,
                           idle_after_s: float = 1.0, context_tokens: int | None = None,
                           sampling_params: Mapping[str, Any] | None = None, **labels: Any) -> dict[str, Any]:
    """Send one streaming request while ``source`` is sampled; append rows to ``run`` as they come.

    Sampling starts ``idle_before_s`` before the request and ends ``idle_after_s`` after its last byte.
    Every telemetry row goes to the run's ``telemetry`` table as it is read; the request's summary
    (timing, sampler statistics, the source's description, ``labels``) to ``telemetry_request``.
    The request is greedy with ``ignore_eos`` so it decodes exactly ``max_new_tokens`` tokens.
    Returns the request row. A failed request is recorded with its ``error`` and returned.
    """
    context = int(context_tokens if context_tokens is not None else len(input_ids))
    described = source.describe()
    with Sampler(source, rate_hz=rate_hz, sink=lambda r: run.append_row("telemetry", r)) as sampler:
        time.sleep(max(0.0, idle_before_s))
        # the one measured-request send: stamped before, greedy, ignore_eos, a server error kept as the row's
        done = send(client, input_ids, max_new_tokens, sampling_params=sampling_params)
        time.sleep(max(0.0, idle_after_s))
    extra = dict(labels, telemetry_source=described, sampler=sampler.stats(),
                 server_url=getattr(client, "base_url", None))
    if done.trace is not None:
        row = request_row(done.trace, context, max_new_tokens, **extra)
    else:  # nothing could be sent: keep the telemetry, record why and when it was tried
        row = {"ts_unix_s": done.t_send_unix_s, "context_tokens": context, "max_new_tokens": int(max_new_tokens),
               "t_send_unix_s": None, "chunk_t_s": [], "chunk_tokens": [], "error": done.error, **extra}
    run.append_row("telemetry_request", row)
    return row


def measure_utilization(run: Any, client: Any, source: TelemetrySource, context_tokens: int, max_new_tokens: int,
                        sample_hz: float = 50.0, idle_s: float = 1.0, seed: int = 0, model_config: str = "",
                        memory_bandwidth_gb_s: float = 0.0, gpu_index: int = 0,
                        warmup_tokens: int = 4) -> dict[str, Any]:
    """Notebook 02's measurement: one novel-prose request of ``context_tokens`` tokens, sampled.

    Checks the length against the server's context_length before anything is sent; flushes the
    prefix cache; runs a short warm-up request (``warmup_tokens`` new tokens on the prompt's first
    64 tokens) so start-up work stays out of the window; flushes again; records. Returns the
    ``telemetry_request`` row (also appended to ``run``).
    """
    server_info = client.settings().as_server_info()
    limit = server_info.get("context_length")
    if limit is not None and context_tokens + max_new_tokens > int(limit):
        raise ValueError(f"context_tokens + max_new_tokens = {context_tokens + max_new_tokens:,} tokens but the "
                         f"server's context_length is {int(limit):,}: lower one of them")
    prompt = exact_prompt(client, context_tokens, "novel", seed)
    configs = local_model_configs(server_info)
    if model_config:
        configs = {"target": model_config_from_parameter(model_config), "drafter": None}
    described = source.describe()
    first_name = next((d.get("name") for d in described.get("devices", [])), None)
    hardware = peak_bandwidth(run, described, first_name, memory_bandwidth_gb_s, server_info,
                              getattr(client, "base_url", ""))
    warm = None
    if warmup_tokens > 0:
        client.reset_cache()
        warm = client.generate(input_ids=prompt.input_ids[:64], stream=True, sampling_params=greedy(warmup_tokens))
    # the measured request's prompt made fresh after the warm-up: cache reset, or a head the warm-up never saw
    prompt, flushed = freshen(client, prompt, add_special_tokens=ADD_SPECIAL_TOKENS)
    note = reset_note(client, flushed)
    return record_sampled_request(
        run, client, source, prompt.input_ids, max_new_tokens, rate_hz=sample_hz, idle_before_s=idle_s,
        idle_after_s=idle_s, context_tokens=context_tokens, prompt_kind="novel", seed=seed, cache_flushed=flushed,
        server={k: server_info.get(k) for k in SERVER_KEYS}, model_configs=configs, hardware=hardware,
        warmup={"completion_tokens": warm.completion_tokens, "e2e_s": warm.e2e_s, "error": warm.error} if warm else None,
        **({"cache_note": note} if note else {}))
