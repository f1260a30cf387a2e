"""GPU (or CPU) utilization during one request: split the samples into phases, summarize, judge.

The phases come from the client's stream timestamps (all unix seconds, the sampler's clock):

- ``before``: sampling started, request not yet sent (the idle baseline);
- ``prefill``: ``t_send`` to the first token (TTFT: prefill plus the first decode step);
- ``decode``: first token to last token (every later verify step);
- ``after``: last token to the end of sampling.

NVML's ``utilization.gpu`` is averaged by the driver over its own sample period (1/6 s to 1 s), so
it lags phase edges by up to that period: :func:`phase_stats` can trim the first ``trim_s`` seconds
of each phase that is long enough to spare them. Everything here is a pure function of rows (the
recording is :mod:`specdiag.steps.gpu_utilization.record`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Sequence

from specdiag.findings import Finding
from specdiag.geometry import kv_bytes_per_step, load_geometry, weight_bytes_per_step
from specdiag.hardware import gb_s, source_label
from specdiag.measure.disturbance import traffic_finding
from specdiag.roofline import effective_bandwidth, memory_floor_s
from specdiag.serving.locality import LOOPBACK_HOSTS, is_local_url, url_host
from specdiag.serving.settings import speculation_state
from specdiag.stats import quantile  # noqa: F401 - re-exported (utilization.quantile)
from specdiag.telemetry.sampler import METRIC_FIELDS

PHASES: tuple[str, ...] = ("before", "prefill", "decode", "after")
#: A derived column: the busiest core's percent in each CPU row (single-thread-bound servers show here).
CPU_BUSIEST = "cpu_busiest_core_pct"
SUMMARY_METRICS: tuple[str, ...] = (*METRIC_FIELDS, CPU_BUSIEST)


@dataclass(frozen=True)
class PhaseWindows:
    """Edges of one request's phases, unix seconds (``None`` when the request produced no token)."""

    t_send_unix_s: float
    t_first_token_unix_s: float | None
    t_last_token_unix_s: float | None
    t_end_unix_s: float | None  # last byte received (send + e2e)

    def phase_of(self, ts_unix_s: float) -> str:
        """Which phase a sample taken at ``ts_unix_s`` belongs to."""
        if ts_unix_s < self.t_send_unix_s:
            return "before"
        if self.t_first_token_unix_s is None:
            end = self.t_end_unix_s
            return "prefill" if end is None or ts_unix_s <= end else "after"
        if ts_unix_s < self.t_first_token_unix_s:
            return "prefill"
        last = self.t_last_token_unix_s if self.t_last_token_unix_s is not None else self.t_first_token_unix_s
        return "decode" if ts_unix_s <= last else "after"

    def span(self, phase: str) -> tuple[float, float] | None:
        """(start, end) of a request phase in unix seconds; None for before/after or unknown."""
        if phase == "prefill":
            end = self.t_first_token_unix_s or self.t_end_unix_s
            return (self.t_send_unix_s, end) if end is not None else None
        if phase == "decode" and self.t_first_token_unix_s is not None and self.t_last_token_unix_s is not None:
            return (self.t_first_token_unix_s, self.t_last_token_unix_s)
        return None


def phase_windows(request: Mapping[str, Any]) -> PhaseWindows:
    """Phase edges from a ``telemetry_request`` row (or any mapping with the trace's timing fields)."""
    t_send = request.get("t_send_unix_s")
    if not isinstance(t_send, (int, float)):
        raise ValueError("the request row has no t_send_unix_s: it was not recorded by record_sampled_request")
    chunks = [float(t) for t in (request.get("chunk_t_s") or [])]
    ttft = request.get("ttft_s")
    first = t_send + float(ttft) if ttft is not None else (t_send + chunks[0] if chunks else None)
    last = t_send + chunks[-1] if chunks else first
    e2e = request.get("e2e_s")
    end = t_send + float(e2e) if e2e is not None else last
    return PhaseWindows(float(t_send), first, last, end)


# ---------------------------------------------------------------------------------------------
# Summaries (pure)
# ---------------------------------------------------------------------------------------------

def _value(row: Mapping[str, Any], metric: str) -> float | None:
    if metric == CPU_BUSIEST:
        cores = row.get("cpu_core_pct")
        return float(max(cores)) if cores else None
    v = row.get(metric)
    if v is None or isinstance(v, bool):
        return None
    v = float(v)
    return v if math.isfinite(v) else None


def label_rows(rows: Iterable[Mapping[str, Any]], windows: PhaseWindows) -> list[dict[str, Any]]:
    """Copies of the rows with ``phase`` and ``t_rel_s`` (seconds after the request was sent)."""
    out = []
    for r in rows:
        ts = r.get("ts_unix_s")
        if not isinstance(ts, (int, float)):
            continue
        out.append({**r, "phase": windows.phase_of(ts), "t_rel_s": ts - windows.t_send_unix_s})
    return out


def phase_stats(rows: Iterable[Mapping[str, Any]], windows: PhaseWindows, trim_s: float = 0.0,
                metrics: Sequence[str] = SUMMARY_METRICS) -> list[dict[str, Any]]:
    """Per device and phase: samples, seconds covered, and median / p10 / p90 of each metric.

    Rows with ``error`` are left out. ``trim_s``: samples in the first ``trim_s`` seconds of a phase
    are dropped when the phase lasts at least ``3 * trim_s`` (the driver's averaging lag). Metrics a
    source does not read are left out of that device's rows.
    """
    labelled = [r for r in label_rows(rows, windows) if not r.get("error") and r.get("device") is not None]
    starts: dict[str, float] = {}
    for phase in PHASES:
        ts = [r["ts_unix_s"] for r in labelled if r["phase"] == phase]
        if ts and trim_s > 0 and (max(ts) - min(ts)) >= 3 * trim_s:
            starts[phase] = min(ts) + trim_s
    out = []
    for device in sorted({str(r["device"]) for r in labelled}):
        for phase in PHASES:
            sel = [r for r in labelled if str(r["device"]) == device and r["phase"] == phase
                   and r["ts_unix_s"] >= starts.get(phase, -math.inf)]
            if not sel:
                continue
            ts = [r["ts_unix_s"] for r in sel]
            entry: dict[str, Any] = {"device": device, "device_name": sel[0].get("device_name"), "phase": phase,
                                     "n_samples": len(sel), "span_s": max(ts) - min(ts)}
            for m in metrics:
                vals = [v for v in (_value(r, m) for r in sel) if v is not None]
                if vals:
                    entry[f"{m}_median"] = quantile(vals, 0.5)
                    entry[f"{m}_p10"] = quantile(vals, 0.1)
                    entry[f"{m}_p90"] = quantile(vals, 0.9)
                    entry[f"{m}_n"] = len(vals)
            out.append(entry)
    return out


def stat(stats: Sequence[Mapping[str, Any]], device: str, phase: str, key: str) -> float | None:
    """One number out of :func:`phase_stats`' rows (None when absent)."""
    for s in stats:
        if s["device"] == device and s["phase"] == phase:
            v = s.get(key)
            return float(v) if v is not None else None
    return None


# ---------------------------------------------------------------------------------------------
# Where the telemetry comes from, against where the server is
# ---------------------------------------------------------------------------------------------

def telemetry_locality(server_url: str | None, source_info: Mapping[str, Any]) -> dict[str, Any]:
    """Is the sampled device the server's? ``same_machine`` True / False / None (cannot tell), and a sentence."""
    server_host = url_host(server_url)
    kind = source_info.get("kind")
    t_host = str(source_info.get("host") or "")
    if kind == "prometheus":
        same = server_host == t_host.lower() or (server_host in LOOPBACK_HOSTS and t_host.lower() in LOOPBACK_HOSTS)
        text = (f"The telemetry is read from {source_info.get('url')} (host {t_host}); the server is at "
                f"{server_url or 'an embedded server on this machine'}. ")
        text += ("They are the same host." if same else
                 "They are different hosts: make sure the exporter runs on the server's GPUs.")
        return {"same_machine": same, "telemetry_host": t_host, "server_host": server_host, "text": text}
    local = is_local_url(server_url, also=[t_host])
    what = "this machine's GPUs (NVML)" if kind == "nvml" else "this machine's CPU cores (psutil)"
    if local:
        text = (f"The telemetry is of {what} on host {t_host}, the machine the server "
                f"({server_url or 'embedded'}) runs on.")
    else:
        text = (f"The telemetry is of {what} on host {t_host}, while the server runs elsewhere "
                f"({server_url}): this timeline does NOT show the server's GPUs. To see them, pass "
                f"telemetry='http://{server_host}:9400/metrics' (a DCGM exporter on the server).")
    return {"same_machine": bool(local), "telemetry_host": t_host, "server_host": server_host, "text": text}


# ---------------------------------------------------------------------------------------------
# Prediction and findings
# ---------------------------------------------------------------------------------------------

def rows_of_request(rows: Iterable[Mapping[str, Any]], request: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The telemetry rows sampled for ``request`` (inside its sampler's window), when a run holds several."""
    s = request.get("sampler") or {}
    t0, t1 = s.get("t_start_unix_s"), s.get("t_stop_unix_s")
    return [dict(r) for r in rows if isinstance(r.get("ts_unix_s"), (int, float))
            and (t0 is None or r["ts_unix_s"] >= t0 - 1e-3) and (t1 is None or r["ts_unix_s"] <= t1 + 1e-3)]


def decode_bytes_per_step(server: Mapping[str, Any], configs: Mapping[str, Mapping[str, Any] | None],
                          context_tokens: float) -> dict[str, Any]:
    """Bytes one decode (verify) step must read, by component, from the bandwidth analysis' geometry.

    - target: every weight once (``geometry.weight_bytes_per_step``, ``num_draft_tokens`` tokens per
      verify step) plus its KV cache at ``context_tokens`` (``geometry.kv_bytes_per_step``): the same
      bytes as ``roofline.step_roofline(...).total_bytes``, the figure notebook 05 uses;
    - drafter (STANDALONE): ``speculative_num_steps`` draft passes per step (``num_draft_tokens - 1``
      when not reported), each reading the drafter's weights and its KV at the same context.
    ``server`` is server_info (dtype, speculative settings, tp_size); ``configs`` the models' config.json.
    Raises ValueError when the target's config is not available.
    """
    target_cfg = configs.get("target")
    if not target_cfg:
        raise ValueError("the target model's config.json is not available here (a remote server's model): pass "
                         "model_config (a preset name or a config.json path) for the bandwidth prediction")
    dtype = server.get("dtype") if server.get("dtype") not in (None, "auto") else None
    kv_dtype = server.get("kv_cache_dtype") if server.get("kv_cache_dtype") not in (None, "auto") else dtype
    tp = int(server.get("tp_size") or 1)
    algo = str(server.get("speculative_algorithm") or "NONE").upper()
    n_draft = int(server.get("speculative_num_draft_tokens") or 1) if speculation_state(server) else 1
    target = load_geometry(dict(target_cfg), kv_dtype=kv_dtype, weight_dtype=dtype)
    ctx = int(round(context_tokens))
    parts = {"target_weights": weight_bytes_per_step(target, tp, tokens_per_step=n_draft).total,
             "target_kv": kv_bytes_per_step(target, ctx, tp)}
    passes = 0
    drafter_cfg = configs.get("drafter")
    if algo in ("STANDALONE", "EAGLE", "EAGLE3") and drafter_cfg:
        drafter = load_geometry(dict(drafter_cfg), kv_dtype=kv_dtype, weight_dtype=dtype)
        passes = int(server.get("speculative_num_steps") or max(n_draft - 1, 1))
        parts["drafter_weights"] = passes * weight_bytes_per_step(drafter, 1, tokens_per_step=1).total
        parts["drafter_kv"] = passes * kv_bytes_per_step(drafter, ctx, 1)
    return {"bytes_per_step": sum(parts.values()), "parts": parts, "context_tokens": ctx,
            "tokens_per_verify_step": n_draft, "draft_passes": passes, "dtype": dtype or "model default",
            "source": "computed (specdiag.geometry)"}


def predicted_bandwidth_utilization(bytes_per_step: float, step_s: float, peak_bytes_per_s: float) -> dict[str, float]:
    """What the bandwidth analysis predicts the memory system does during decode.

    ``effective_bytes_per_s = bytes_per_step / step_s`` (the bytes the analysis says one step must
    read, over the measured step time) and ``predicted_bw_util_pct = 100 * effective / peak``.
    """
    if not (bytes_per_step > 0 and step_s > 0 and peak_bytes_per_s > 0):
        raise ValueError(f"bytes_per_step, step_s and peak_bytes_per_s must be > 0; got "
                         f"{bytes_per_step!r}, {step_s!r}, {peak_bytes_per_s!r}")
    effective = effective_bandwidth(bytes_per_step, step_s)
    return {"bytes_per_step": bytes_per_step, "step_s": step_s, "peak_bytes_per_s": peak_bytes_per_s,
            "effective_bytes_per_s": effective, "predicted_bw_util_pct": 100.0 * effective / peak_bytes_per_s,
            "floor_step_s": memory_floor_s(bytes_per_step, peak_bytes_per_s)}


@dataclass(frozen=True)
class DecodePrediction:
    """02's bandwidth prediction for one recorded request, or why there is none (``note``)."""

    prediction: dict[str, float] | None  # predicted_bandwidth_utilization's dict
    step_bytes: dict[str, Any] | None    # decode_bytes_per_step's dict
    hardware: dict[str, Any]             # the peak used: the request's record, or the parameter
    note: str = ""                       # why there is no prediction (empty when there is one)


def predict_decode_bandwidth(request: Mapping[str, Any], configs: Mapping[str, Mapping[str, Any] | None],
                             memory_bandwidth_gb_s: float = 0.0, context_tokens: int = 0,
                             hardware: Mapping[str, Any] | None = None) -> DecodePrediction:
    """What the bandwidth analysis predicts for a recorded request's decode: the bytes per step at the
    mid-decode context (prompt + half the new tokens), over its measured step time, against the peak.

    The peak is ``hardware`` (the run's one peak, ``specdiag.hardware.run_peaks``, as the notebook passes it), else
    the request's recorded ``hardware``; ``memory_bandwidth_gb_s`` (a parameter) wins over both.
    ``context_tokens`` stands in for a prompt length the request did not record. Never raises for a
    missing input: the returned ``note`` says what is missing and which parameter supplies it.
    """
    hardware = dict(hardware if hardware is not None else request.get("hardware") or {})
    if memory_bandwidth_gb_s and memory_bandwidth_gb_s > 0:
        hardware = {**hardware, "memory_bandwidth_gb_s": memory_bandwidth_gb_s, "memory_bandwidth_source": "parameter",
                    "memory_bandwidth_detail": f"given as a parameter: {memory_bandwidth_gb_s:g} GB/s", "error": None}
    step_ms = request.get("step_ms")
    if step_ms is None:
        return DecodePrediction(None, None, hardware, "No bandwidth prediction: the request has no measured step "
                                                      "time (no decode window)")
    if hardware.get("error") or not hardware.get("memory_bandwidth_gb_s"):
        return DecodePrediction(None, None, hardware, "No bandwidth prediction: no peak memory bandwidth for the "
                                f"sampled device ({hardware.get('error')}); pass memory_bandwidth_gb_s")
    mid_context = (request.get("prompt_tokens") or context_tokens) + (request.get("completion_tokens") or 0) / 2
    try:
        step_bytes = decode_bytes_per_step(request.get("server") or {}, configs, mid_context)
        prediction = predicted_bandwidth_utilization(step_bytes["bytes_per_step"], float(step_ms) / 1e3,
                                                     float(hardware["memory_bandwidth_gb_s"]) * 1e9)
    except (ValueError, KeyError, FileNotFoundError) as exc:
        return DecodePrediction(None, None, hardware, f"No bandwidth prediction: {exc}")
    return DecodePrediction(prediction, step_bytes, hardware)


def prediction_lines(pred: DecodePrediction, measured_dram_pct: float | None) -> list[str]:
    """The prediction as sentences with their sources (computed, measured, the peak's label)."""
    if pred.prediction is None or pred.step_bytes is None:
        return [pred.note]
    p, b, hw = pred.prediction, pred.step_bytes, pred.hardware
    step_ms = 1e3 * p["step_s"]
    return [
        f"bytes per step: {b['bytes_per_step'] / 1e6:,.2f} MB at {b['context_tokens']:,} tokens of context (computed); "
        f"step time {step_ms:.2f} ms (measured); effective {p['effective_bytes_per_s'] / 1e9:,.2f} GB/s against a peak "
        f"of {gb_s(float(hw['memory_bandwidth_gb_s']))} ({source_label(hw.get('memory_bandwidth_source'))}: "
        f"{hw.get('memory_bandwidth_detail', '')})",
        f"predicted DRAM bandwidth utilization during decode: {p['predicted_bw_util_pct']:.3g} % (computed); measured "
        f"median: {'n/a (no DRAM-bandwidth counter here)' if measured_dram_pct is None else f'{measured_dram_pct:.3g} %'}",
        f"memory floor for the step: {p['floor_step_s'] * 1e3:.3g} ms, so the step takes "
        f"{p['step_s'] / p['floor_step_s']:,.0f}x the floor (computed)",
    ]


def _pct(x: float | None) -> str:
    return "n/a" if x is None else (f"{x:.2g} %" if x < 1 else f"{x:.0f} %")


def utilization_findings(stats: Sequence[Mapping[str, Any]], request: Mapping[str, Any], device: str,
                         prediction: Mapping[str, float] | None = None,
                         locality: Mapping[str, Any] | None = None,
                         sampler: Mapping[str, Any] | None = None) -> list[Finding]:
    """Findings about one device during one request's decode (see the notebook for the reading); whether other
    requests ran beside it (``utilization.other_traffic``: then the device's activity is not this request's alone)."""
    out: list[Finding] = []
    traffic = traffic_finding([request], "utilization", "sampled requests")
    if traffic is not None:
        out.append(traffic)
    decode_s = None
    w = phase_windows(request) if request.get("t_send_unix_s") is not None else None
    if w is not None and w.span("decode"):
        a, b = w.span("decode")  # type: ignore[misc]
        decode_s = b - a
    g = lambda key: stat(stats, device, "decode", key)  # noqa: E731
    before = lambda key: stat(stats, device, "before", key)  # noqa: E731

    if locality is not None and locality.get("same_machine") is False:
        out.append(Finding(
            "utilization.telemetry_elsewhere", "Telemetry is not of the server's machine",
            str(locality.get("text")), "warning", (str(locality.get("text")),),
            {"telemetry_host": locality.get("telemetry_host"), "server_host": locality.get("server_host")}, "measured"))

    if request.get("error") or decode_s is None or g("n_samples") is None:
        out.append(Finding(
            "utilization.no_decode", "No decode phase to judge",
            "The request produced no decode window with samples in it, so nothing is judged.", "warning",
            (f"request error: {request.get('error')}", f"decode window: {decode_s} s",
             f"decode samples: {g('n_samples')}"), {"decode_s": decode_s}, "measured"))
        return out

    if sampler and sampler.get("achieved_rate_hz") and sampler.get("rate_hz_used"):
        ratio = sampler["achieved_rate_hz"] / sampler["rate_hz_used"]
        if ratio < 0.8:
            out.append(Finding(
                "utilization.sampling_slow", "The sampler fell behind its rate",
                "Samples came slower than asked; phase statistics rest on fewer samples.", "info",
                (f"asked {sampler['rate_hz_used']:.0f} Hz, achieved {sampler['achieved_rate_hz']:.1f} Hz "
                 f"(measured), {sampler.get('late_ticks')} ticks skipped",),
                {"achieved_rate_hz": sampler["achieved_rate_hz"], "rate_hz_used": sampler["rate_hz_used"]}, "measured"))

    busy = g("gpu_util_pct_median")
    sm = g("sm_active_pct_median")
    dram = g("dram_bw_util_pct_median")
    n = int(g("n_samples") or 0)
    window = f"over {decode_s:.1f} s of decode, {n} samples"
    if busy is not None:
        ev = [f"median utilization.gpu during decode: {_pct(busy)} (measured, NVML: fraction of time a kernel "
              f"was running, not SM occupancy), {window}"]
        if before("gpu_util_pct_median") is not None:
            ev.append(f"idle baseline before the request: {_pct(before('gpu_util_pct_median'))}")
        if sm is not None:
            ev.append(f"median SM activity (GPM): {_pct(sm)} of SMs busy")
        numbers = {"decode_gpu_util_pct_median": busy, "decode_sm_active_pct_median": sm, "decode_s": decode_s}
        if busy < 50:
            out.append(Finding(
                "utilization.decode_gpu_idle", "The GPU sits idle for much of decode",
                f"No kernel ran for about {100 - busy:.0f} % of the decode time: the gaps are host-side "
                f"(Python, scheduling, CPU work such as draft-tree building, synchronization), so decode "
                f"speed is a software problem before it is a GPU problem.", "warning", tuple(ev), numbers, "measured"))
        elif sm is not None and sm < 25:
            out.append(Finding(
                "utilization.decode_few_sms", "Kernels run, but on few SMs",
                f"A kernel was running {_pct(busy)} of the time, yet only {_pct(sm)} of SMs were busy: the "
                f"kernels expose too little parallelism (for instance an attention grid of a few blocks at "
                f"batch 1). A 'busy' utilization.gpu hides this.", "warning", tuple(ev), numbers, "measured"))
        else:
            out.append(Finding(
                "utilization.decode_gpu_busy", "The GPU runs kernels through decode",
                f"A kernel was running {_pct(busy)} of the decode time"
                + (f" with {_pct(sm)} of SMs busy." if sm is not None else
                   "; without GPM (SM activity) this does not say how much of the GPU those kernels used."),
                "info", tuple(ev), numbers, "measured"))

    if prediction is not None:
        pred = float(prediction["predicted_bw_util_pct"])
        ev = [f"the bandwidth analysis counts {prediction['bytes_per_step'] / 1e6:,.2f} MB per decode step "
              f"(computed); at the measured {prediction['step_s'] * 1e3:.2f} ms per step that is "
              f"{prediction['effective_bytes_per_s'] / 1e9:,.2f} GB/s, {_pct(pred)} of the "
              f"{gb_s(prediction['peak_bytes_per_s'] / 1e9)} peak (computed)",
              f"the memory floor for that step is {prediction['floor_step_s'] * 1e3:.3g} ms (computed)"]
        numbers = {"predicted_bw_util_pct": pred, "measured_dram_bw_util_pct_median": dram}
        if dram is None:
            mem_time = g("mem_util_pct_median")
            if mem_time is not None:
                ev.append(f"NVML utilization.memory during decode: {_pct(mem_time)} (measured; a time fraction, "
                          f"not a bandwidth fraction, so it is not compared)")
            out.append(Finding(
                "utilization.decode_bandwidth_predicted", "Predicted memory-bandwidth use during decode",
                f"The analysis predicts decode uses {_pct(pred)} of peak memory bandwidth; this telemetry has no "
                f"DRAM-bandwidth counter (GPM or DCGM_FI_PROF_DRAM_ACTIVE) to check it against.",
                "info", tuple(ev), numbers, "computed"))
        else:
            ratio = dram / pred if pred > 0 else math.inf
            numbers["measured_over_predicted"] = ratio
            ev.append(f"median DRAM bandwidth utilization during decode: {_pct(dram)} (measured, GPM/DCGM)")
            if 0.5 <= ratio <= 2.0:
                verdict = (f"Measured DRAM bandwidth ({_pct(dram)} of peak) matches the prediction ({_pct(pred)}): "
                           f"the step moves about the bytes the analysis counts, so its time beyond the floor is "
                           f"spent elsewhere (launch gaps, low parallelism, compute), not on moving more data.")
            elif ratio > 2.0:
                verdict = (f"The GPU moves {ratio:.1f}x the bytes the analysis counts ({_pct(dram)} measured against "
                           f"{_pct(pred)} predicted): something moves more than the weights and KV the analysis "
                           f"counts (re-reads, copies of a growing KV cache, activations, other processes on "
                           f"the GPU).")
            else:
                verdict = (f"The GPU moves less DRAM traffic than the analysis counts ({_pct(dram)} measured against "
                           f"{_pct(pred)} predicted): part of the data is served from L2 (small models fit in it) "
                           f"or the analysis over-counts.")
            sev = "warning" if pred < 10 else "info"
            out.append(Finding("utilization.decode_bandwidth", "Decode memory bandwidth: measured against predicted",
                               verdict + (" Either way decode uses under 10 % of peak bandwidth: it is far from "
                                          "memory-bound." if pred < 10 and dram < 10 else ""),
                               sev, tuple(ev), numbers, "measured"))

    cpu = g("cpu_util_pct_median")
    top = g(f"{CPU_BUSIEST}_median")
    if cpu is not None and top is not None:
        ev = [f"median CPU busy during decode: {_pct(cpu)} of all cores, busiest core {_pct(top)} (measured, psutil), "
              f"{window}",
              "psutil counts every process on the machine, not only the server's: other work inflates these numbers"]
        single = top >= 80 and cpu < 60
        out.append(Finding(
            "utilization.decode_cpu", "CPU during decode",
            ("One core is saturated while the others are not: decode is bound by a single thread."
             if single else f"The CPU cores were {_pct(cpu)} busy on average during decode."),
            "info", tuple(ev), {"decode_cpu_util_pct_median": cpu, "decode_busiest_core_pct_median": top}, "measured"))
    return out
