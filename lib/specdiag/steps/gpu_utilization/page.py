"""Notebook 02's sections, one call each (:class:`specdiag.section.Section`: tables, figures, text): the notebook keeps
its parameters, these calls and its prose.

:func:`start` checks the parameters (before any server starts), opens the run (or the recorded run) and, live, the
telemetry source; the :class:`Page`'s data are computed when a section first asks. Sections:
:func:`request` (the sampled request: measured now, or the recorded one), :func:`sampled` (which device, and is it
the server's), :func:`timeline` (the bandwidth prediction and the timeline figure), :func:`phases` (statistics per
phase), :func:`against_bandwidth`, :func:`traces` (torch profiler traces, step by step), :func:`findings` and
:func:`metrics`. The phases, statistics, prediction and findings are :mod:`.analysis`'s; the figures :mod:`.plot`'s
and :mod:`.timeline`'s.
"""

from __future__ import annotations

from functools import cached_property
from typing import Any, Mapping

from specdiag import findings as fnd
from specdiag import hardware, nb
from specdiag.paths import relative_to_project
from specdiag.section import Section
from specdiag.steps.gpu_utilization import analysis as utilization
from specdiag.steps.gpu_utilization import timeline as trace_timeline
from specdiag.steps.gpu_utilization.plot import plot_timeline
from specdiag.steps.gpu_utilization.record import measure_utilization, model_config_from_parameter
from specdiag.telemetry.sampler import open_source

NOTEBOOK = "02_gpu_utilization"
NO_TELEMETRY = "skipped: this run has no sampled telemetry (see section 1)"
TELEMETRY_WORDS = ("auto", "nvml", "cpu")
#: The readings the per-phase table shows (median and p10-p90), where the device reports them.
PHASE_READINGS = ("gpu_util_pct", "sm_active_pct", "mem_util_pct", "dram_bw_util_pct", "sm_occupancy_pct",
                  "sm_clock_mhz", "mem_clock_mhz", "power_w", "mem_used_mib", "cpu_util_pct", utilization.CPU_BUSIEST)

class Page(nb.Page):
    """What 02's sections share: the telemetry source (live, opened before any request), the sampled request and
    its rows (measured when first asked, or the recorded run's), the phases, statistics, prediction and traces."""

    notebook = NOTEBOOK

    def __init__(self, params: Mapping[str, Any]) -> None:
        """Check the parameters, then open the run (``nb.start``: the server, or the recorded run); live, open the
        telemetry source before any request, so that a wrong choice fails here, with the reason."""
        super().__init__(params)
        p = self.params
        check(p)
        self.ctx = ctx = nb.start(NOTEBOOK, server_url=p["server_url"], speculative_config=p["speculative_config"],
                                  run_dir=p["run_dir"], replay_dir=p["replay_dir"], params=nb.run_params(p))
        self.source: Any = None  # the telemetry source, opened before any request (live)
        if not ctx.replaying:
            self.source = open_source(p["telemetry"], p["gpu_indices"] or None)
            info, limit = ctx.server_info, ctx.server_info.get("context_length")
            total = p["context_tokens"] + p["max_new_tokens"]
            nb.check(limit is None or total <= limit, f"context_tokens + max_new_tokens = {total:,} tokens but the "
                                                      f"server's context_length is {limit:,}: lower one of them")
            self.intro.text(f"server {ctx.server_url}: {info.get('model_path')}, "
                              f"{ctx.settings.speculation_line()}, device {info.get('device') or 'not reported'}")
            self.intro.text(f"telemetry: {self.source.kind}, {len(self.source.describe().get('devices', []))} "
                              "device(s)")
        self.intro.text(f"run folder: {ctx.run.path}")

    @cached_property
    def _sampled(self) -> tuple[dict[str, Any], list[dict[str, Any]], list[str]]:
        """The sampled request, its telemetry rows and the lines that say where they came from: live, measured now
        (after a warm-up request); replaying, the recorded run's (a run with traces but no sampled request says so)."""
        p, ctx = self.params, self.ctx
        if self.live:
            request = measure_utilization(ctx.run, ctx.client, self.source, p["context_tokens"], p["max_new_tokens"],
                                          sample_hz=p["sample_hz"], idle_s=p["idle_s"], seed=p["seed"],
                                          model_config=p["model_config"],
                                          memory_bandwidth_gb_s=p["memory_bandwidth_gb_s"],
                                          gpu_index=(p["gpu_indices"] or [0])[0])
            warm = request.get("warmup") or {}
            return request, utilization.rows_of_request(ctx.run.rows("telemetry"), request), [
                f"warm-up: {warm.get('completion_tokens')} tokens in {warm.get('e2e_s') or float('nan'):.2f} s "
                "(measured)"]
        source = ctx.source
        requests = source.rows("telemetry_request")
        if not requests:
            trace_refs, _ = trace_timeline.find_traces(source)
            nb.check(len(trace_refs) > 0, f"{source.path} has no telemetry_request rows (02's sampled request) and no "
                     "torch profiler traces (profiles/*.trace.json.gz): nothing to replay; pick a run made by 02 or "
                     "one with profiles")
            return {}, [], [f"{relative_to_project(source.path)} has no sampled telemetry (no telemetry_request rows: "
                            "02's sampler did not run there), so sections 1-5 have nothing to show; it holds "
                            f"{len(trace_refs)} torch profiler trace(s), drawn in section 6"]
        request = requests[-1]
        rows = utilization.rows_of_request(source.rows("telemetry"), request)
        provenance = source.meta.get("recorded_with") or source.meta.get("provenance", {})
        return request, rows, [f"replaying {source.path}: {len(rows)} telemetry rows, recorded "
                               f"{provenance.get('date_utc') or provenance.get('created_utc')} on "
                               f"{provenance.get('gpu') or provenance.get('host', '?')}; no request is sent"]

    @property
    def request(self) -> dict[str, Any]:
        return self._sampled[0]

    @property
    def rows(self) -> list[dict[str, Any]]:
        return self._sampled[1]

    @property
    def has_telemetry(self) -> bool:
        """False for a recorded run with traces but no sampled request."""
        return self.live or bool(self.request)

    @property
    def sampler(self) -> dict[str, Any]:
        return self.request.get("sampler") or {}

    @property
    def source_info(self) -> dict[str, Any]:
        return self.request.get("telemetry_source") or {}

    @cached_property
    def device(self) -> str | None:
        """The first sampled device (plotted and judged)."""
        if not self.has_telemetry:
            return None
        nb.check(len(self.rows) > 0, "no telemetry rows were recorded for the request")
        return sorted({str(row["device"]) for row in self.rows if row.get("device") is not None})[0]

    @cached_property
    def locality(self) -> dict[str, Any] | None:
        """Whether the sampled device is the server's."""
        if not self.has_telemetry:
            return None
        return utilization.telemetry_locality(self.request.get("server_url") or self.ctx.server_url, self.source_info)

    @cached_property
    def windows(self) -> Any:
        """The request's prefill and decode windows (None when it was never sent)."""
        return utilization.phase_windows(self.request) if self.request.get("t_send_unix_s") is not None else None

    @cached_property
    def decode_prediction(self) -> Any:
        """What the bandwidth analysis predicts for the decode, against the run's one peak (``hardware.run_peaks``:
        the figure 00 and 05 of this run use too)."""
        if not self.has_telemetry:
            return None
        p, ctx, r = self.params, self.ctx, self.request
        configs = ({"target": model_config_from_parameter(p["model_config"]), "drafter": None}
                   if p["model_config"] and self.replaying else r.get("model_configs") or {})
        try:
            run_hardware = hardware.run_peaks(
                ctx.run, p["memory_bandwidth_gb_s"], server_info=ctx.server_info,
                recorded=(ctx.source.meta.get("hardware") or r.get("hardware")) if self.replaying else None,
                server_url="recorded run" if self.replaying else ctx.server_url).as_dict()
        except ValueError as exc:
            run_hardware = {"error": str(exc)}
        return utilization.predict_decode_bandwidth(r, configs, context_tokens=p["context_tokens"],
                                                    hardware=run_hardware)

    @property
    def prediction(self) -> dict[str, float] | None:
        return self.decode_prediction.prediction if self.decode_prediction else None

    @cached_property
    def stats(self) -> list[dict[str, Any]]:
        """Per device and phase, the median and p10-p90 of each reading (the first second of a phase trimmed)."""
        return utilization.phase_stats(self.rows, self.windows, trim_s=1.0) if self.windows is not None else []

    @cached_property
    def timelines(self) -> tuple[list[Any], list[str]]:
        """Each torch profiler trace of the run, ``trace_steps`` complete decode steps drawn, and the notes."""
        return trace_timeline.run_timelines(self.ctx.source, self.params["trace_steps"])

    @property
    def trace_summaries(self) -> list[dict[str, Any]]:
        return [tl.summary for tl in self.timelines[0]]

    @cached_property
    def found(self) -> list[fnd.Finding]:
        """The sampled request's findings and the traces', sorted."""
        sampled_found = (utilization.utilization_findings(self.stats, self.request, self.device,
                                                          prediction=self.prediction, locality=self.locality,
                                                          sampler=self.sampler)
                         if self.has_telemetry else [])
        return fnd.sort_findings(sampled_found + trace_timeline.trace_findings(self.trace_summaries))


def check(p: Mapping[str, Any]) -> None:
    """The parameters' ranges and combinations (their types: ``nb.check_parameters``)."""
    nb.check(p["context_tokens"] > 0, f"context_tokens must be a positive whole number of tokens; got {p['context_tokens']!r}")
    nb.check(p["max_new_tokens"] >= 2, f"max_new_tokens must be at least 2 tokens (one prefill token and a decode); got "
                                       f"{p['max_new_tokens']!r}")
    nb.check(p["sample_hz"] > 0, f"sample_hz must be > 0 samples/s; got {p['sample_hz']!r}")
    nb.check(p["idle_s"] >= 0, f"idle_s must be >= 0 s; got {p['idle_s']!r}")
    nb.check(p["trace_steps"] >= 1, f"trace_steps must be a whole number of steps >= 1; got {p['trace_steps']!r}")
    nb.check(all(i >= 0 for i in p["gpu_indices"]),
             f"gpu_indices must be a list of GPU indices such as [0] ([] = all); got {p['gpu_indices']!r}")
    telemetry = p["telemetry"].strip()
    nb.check(telemetry in TELEMETRY_WORDS or telemetry.startswith(("http://", "https://")),
             f"telemetry must be 'auto', 'nvml', 'cpu' or a DCGM exporter / Prometheus URL (http://...); got "
             f"{p['telemetry']!r}")


def start(params: Mapping[str, Any]) -> Page:
    """Check the parameters and open the run (:class:`Page`)."""
    return Page(params)


def request(pg: Page) -> Section:
    """Section 1: the sampled request (measured now, or the recorded run's), its timing and the sampler's statistics."""
    s = Section()
    for line in pg._sampled[2]:
        s.text(line)
    if not pg.has_telemetry:
        return s
    r = pg.request
    _ = pg.device  # no rows: stops here, naming why
    if r.get("error"):
        s.text(f"the request FAILED: {r['error']} (the telemetry up to that point is kept)")
    nan, sm = float("nan"), pg.sampler
    s.text(f"{r.get('prompt_tokens')} prompt tokens (server-reported), {r.get('completion_tokens')} tokens decoded, "
           f"TTFT {r.get('ttft_s') or nan:.3f} s, end-to-end {r.get('e2e_s') or nan:.2f} s (measured)")
    return s.text(f"sampler: {sm.get('source')} at {sm.get('rate_hz_used')} Hz asked, "
                  f"{sm.get('achieved_rate_hz') or nan:.1f} Hz achieved, {sm.get('rows')} rows, {sm.get('late_ticks')} "
                  f"ticks skipped, median read {sm.get('read_ms_median') or nan:.2f} ms (measured)")


def sampled(pg: Page) -> Section:
    """Section 2: which device was sampled and whether it is the server's (the telemetry source's devices)."""
    s = Section()
    if not pg.has_telemetry:
        return s.text(NO_TELEMETRY)
    info = pg.source_info
    s.markdown(f"**{pg.locality['text']}**")
    if info.get("devices"):
        s.table(info["devices"])
    extra = {k: info.get(k) for k in ("driver_version", "nvml_version", "cuda_driver_version", "url") if info.get(k)}
    return s.text(", ".join(f"{k}: {v}" for k, v in extra.items())) if extra else s


def timeline(pg: Page) -> Section:
    """Section 3: the readings over the request, prefill and decode shaded, with the predicted DRAM utilization."""
    s = Section()
    if not pg.has_telemetry:
        return s.text(NO_TELEMETRY)
    if pg.windows is None:
        return s.text("the request was never sent: no phases to draw")
    predicted = pg.prediction["predicted_bw_util_pct"] if pg.prediction else None
    return s.figure(plot_timeline(pg.rows, pg.windows, pg.device, pg.request.get("chunk_t_s") or [],
                                  predicted_bw_util_pct=predicted,
                                  note=f"measured ({pg.source_info.get('kind')}, {pg.sampler.get('rate_hz_used')} Hz); "
                                       f"phases from client stream timestamps"))


def phases(pg: Page) -> Section:
    """Section 4: per device and phase, the median and p10-p90 of each reading (the first second of a phase trimmed)."""
    table = []
    for st in pg.stats:
        line = {"device": st["device"], "phase": st["phase"], "samples": st["n_samples"], "span (s)": st["span_s"]}
        for m in PHASE_READINGS:
            if f"{m}_median" in st:
                line[f"{m} median"] = st[f"{m}_median"]
                line[f"{m} p10-p90"] = f"{st[f'{m}_p10']:.1f}-{st[f'{m}_p90']:.1f}"
        table.append(line)
    if table:
        return Section().table(table)
    return Section().text(NO_TELEMETRY if not pg.has_telemetry else "no samples in any phase")


def _decode(pg: Page, key: str) -> float | None:
    return utilization.stat(pg.stats, pg.device, "decode", key)


def against_bandwidth(pg: Page) -> Section:
    """Section 5: the bytes a decode step reads (computed) and the DRAM utilization they predict, beside the measured."""
    s = Section()
    if not pg.has_telemetry:
        return s.text(NO_TELEMETRY)
    pred = pg.decode_prediction
    if pred.step_bytes is not None:
        s.table([{"component": k, "MB per step": v / 1e6} for k, v in pred.step_bytes["parts"].items()])
    return s.text("\n".join(utilization.prediction_lines(pred, _decode(pg, "dram_bw_util_pct_median"))))


def traces(pg: Page) -> Section:
    """Section 6: each torch profiler trace of the run, ``trace_steps`` complete decode steps drawn, with its line."""
    s = Section()
    timelines, notes = pg.timelines
    for line in notes:
        s.text(line)
    if not timelines:
        s.text(f"no torch profiler traces in {relative_to_project(pg.ctx.source.path)} (no profiles/*.trace.json.gz): "
               "nothing to draw here")
    for tl in timelines:
        s.text(trace_timeline.summary_line(tl.summary))
        if tl.steps:
            s.figure(trace_timeline.plot_trace_timeline(tl))
    return s


def findings(pg: Page) -> Section:
    """Section 7: the sampled request's findings and the traces', sorted (``data["found"]``), shown as HTML."""
    return Section(data={"found": pg.found}).html(fnd.to_html(pg.found))


def metrics(pg: Page) -> dict[str, Any]:
    """The key numbers of 02's result."""
    r, w = pg.request, pg.windows
    decode_span = w.span("decode") if w else None
    return {
        "telemetry_source": pg.source_info.get("kind"),
        "device": pg.device,
        "device_name": next((row.get("device_name") for row in pg.rows if str(row.get("device")) == pg.device), None),
        "telemetry_same_machine_as_server": pg.locality.get("same_machine") if pg.locality else None,
        "replay_of": relative_to_project(pg.ctx.source.path) if pg.replaying else None,
        "context_tokens": r.get("context_tokens"),
        "completion_tokens": r.get("completion_tokens"),
        "ttft_s": r.get("ttft_s"),
        "decode_s": (decode_span[1] - decode_span[0]) if decode_span else None,
        "step_ms": r.get("step_ms"),
        "sample_rate_hz_achieved": pg.sampler.get("achieved_rate_hz"),
        **{f"decode_{k}_median": _decode(pg, f"{k}_median")
           for k in ("gpu_util_pct", "sm_active_pct", "mem_util_pct", "dram_bw_util_pct", "cpu_util_pct")},
        "predicted_bw_util_pct": pg.prediction["predicted_bw_util_pct"] if pg.prediction else None,
        "peak_gb_s": pg.decode_prediction.hardware.get("memory_bandwidth_gb_s") if pg.decode_prediction else None,
        "request_error": r.get("error"),
        "telemetry_recorded": pg.has_telemetry,
        "trace_timelines": pg.trace_summaries,
    }
