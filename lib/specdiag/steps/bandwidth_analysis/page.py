"""Notebook 05's sections, one call each (:class:`specdiag.section.Section`: tables, figures, text): the notebook keeps
its parameters, these calls and its prose.

:func:`start` checks the parameters (before any server starts), opens the run (or the recorded run) and reads the
server; the :class:`Page`'s data are computed when a section first asks. Sections: :func:`setup` (the
model, the server and the hardware), :func:`measured` (the run's sweep, or a small one measured live),
:func:`floors` (bytes, floors and the measured step per context), :func:`headline`, :func:`roofline`,
:func:`slope`, :func:`attention_only` (a quoted attention-only bandwidth), :func:`per_layer` (a stock pair projected
to more layers, and the stock arm to the investigation's depth), :func:`prefill_floor`, :func:`findings` and
:func:`metrics`. The bytes and floors are :mod:`specdiag.geometry`'s, :mod:`specdiag.roofline`'s and
:mod:`specdiag.prefill`'s; the projections :mod:`.verify_projection`'s.
"""

from __future__ import annotations

from functools import cached_property
from typing import Any, Mapping

import pandas as pd

from specdiag import findings as fnd
from specdiag import geometry, hardware, nb, prefill, roofline
from specdiag.measure.loop import measure_missing
from specdiag.measure.sweep_plan import make_plan, measure_request
from specdiag.measure.sweep_table import SWEEP_KEY, latest_rows, summarize_sweep
from specdiag.paths import REFERENCE_DIR
from specdiag.runs import Run, rows_source
from specdiag.section import Section
from specdiag.serving.settings import speculation_state
from specdiag.steps.bandwidth_analysis import plots as roofline_plots
from specdiag.steps.bandwidth_analysis import verdicts
from specdiag.steps.bandwidth_analysis import verify_projection as vp

NOTEBOOK = "05_bandwidth_analysis"
ROUTINGS = ("min", "uniform", "max")
#: The investigation's recorded run: its step at ``project_context`` is what the depth projection is set against.
INVESTIGATION = "ct200-kimi-k26"


class Page(nb.Page):
    """What 05's sections share: the model's geometry and the run's peaks, the measured steps (the run's sweep, or a
    small one measured live), their floors and roofline, the slope, the projections and the prefill floor, each
    computed when a section first asks."""

    notebook = NOTEBOOK

    def __init__(self, params: Mapping[str, Any]) -> None:
        """Check the parameters, then open the run (``nb.start``: the server, or the recorded run)."""
        super().__init__(params)
        p = self.params
        p["context_lengths"] = check(p)
        self.ctx = ctx = nb.start(NOTEBOOK, server_url=p["server_url"], speculative_config=p["speculative_config"],
                                  run_dir=p["run_dir"], replay_dir=p["replay_dir"], params=nb.run_params(p))
        self.server: dict[str, Any] = {**(ctx.source.meta.get("server") or {}), **ctx.server_info}  # {} replaying
        self.intro.text(f"run folder: {ctx.run.path}" + (f" (replaying {ctx.source.path})" if ctx.replaying
                                                            else f"; server {ctx.server_url}"))

    @property
    def meta(self) -> dict[str, Any]:
        return self.ctx.source.meta

    @cached_property
    def geom(self) -> Any:
        p = self.params
        return geometry.geometry_for_run(p["model_config"], p["kv_dtype"], self.meta, self.ctx.server_info,
                                         role="target")

    @cached_property
    def tp(self) -> int:
        return self.params["tp_size"] or int(self.server.get("tp_size") or 1)

    @cached_property
    def tokens_per_step(self) -> int:
        spec_tokens = self.server.get("speculative_num_draft_tokens") if speculation_state(self.server) else None
        return self.params["draft_tokens"] or int(spec_tokens or 1)

    @cached_property
    def peaks(self) -> Any:
        """The run's one peak (hardware.run_peaks): the figure 00 resolved and recorded, or resolved here once."""
        p = self.params
        return hardware.run_peaks(self.ctx.run, p["memory_bandwidth_gb_s"], p["matmul_tflops"], p["gpu_name"],
                                  self.meta.get("hardware") if self.replaying else None, self.ctx.server_info,
                                  # a replay never reads this machine: the recorded server's URL may say 127.0.0.1
                                  "recorded run" if self.replaying else self.ctx.server_url)

    @cached_property
    def weights(self) -> Any:
        return geometry.weight_bytes_per_step(self.geom, tp_size=self.tp, tokens_per_step=self.tokens_per_step,
                                              routing=self.params["expert_routing"])

    @cached_property
    def step_source(self) -> str:
        return rows_source(self.meta) if self.replaying else "measured"

    @cached_property
    def _sweep(self) -> tuple[list[dict[str, Any]], str]:
        """The run's sweep rows (the recorded run's when replaying; live, measured here when 01 left none: one novel
        request per context, the way 01 measures) and the line that says where they came from."""
        p, ctx = self.params, self.ctx
        if self.replaying:
            rows = latest_rows(ctx.source.rows("sweep"))
            nb.check(len(rows) > 0, f"{ctx.source.path} has no sweep rows (sweep.jsonl) to analyse: pick a run that "
                                    "has them")
            return rows, f"{len(rows)} sweep rows of {ctx.source.path} ({self.step_source})"
        rows = latest_rows(ctx.run.rows("sweep"))
        if [r for r in rows if r.get("step_ms")]:
            return rows, f"{len(rows)} sweep rows already in {ctx.run.path} (notebook 01)"
        plan = make_plan(p["context_lengths"], p["max_new_tokens"], 1, "novel", 0, True,
                         server_context_length=ctx.server_info.get("context_length"))
        print(f"the run has no sweep rows (notebook 01): a small sweep here, novel prose, {p['max_new_tokens']} new "
              "tokens")
        measure_missing(ctx.run, plan, "sweep", SWEEP_KEY, lambda q: measure_request(ctx.client, q, plan), desc="sweep")
        return latest_rows(ctx.run.rows("sweep")), ""

    @cached_property
    def summary(self) -> list[dict[str, Any]]:
        return summarize_sweep(self._sweep[0])

    @cached_property
    def measured_ms(self) -> dict[int, float]:
        """The measured step time per context (ms)."""
        measured = verdicts.measured_step_ms_by_context(self.summary)
        nb.check(len(measured) > 0, "no sweep row has a step time (every request failed?): see the run's sweep.jsonl")
        headline = self.params["headline_context"]
        nb.check(not headline or headline in measured,
                 f"headline_context={headline} has no measured step; measured contexts: {sorted(measured)}")
        return measured

    @cached_property
    def steps(self) -> list[Any]:
        """Per context, the bytes one GPU reads per step, its floors and the measured step against them."""
        return [roofline.step_roofline(self.geom, c, self.peaks, tp_size=self.tp, draft_tokens=self.tokens_per_step,
                                       measured_step_ms=ms, routing=self.params["expert_routing"])
                for c, ms in sorted(self.measured_ms.items())]

    @cached_property
    def table_rows(self) -> list[dict[str, Any]]:
        return verdicts.rows_for_table(self.steps)

    @cached_property
    def scale_unit(self) -> tuple[float, str]:
        """Bytes in GB (1e9 B); a small model's in MB so the table stays readable. Metrics stay in GB."""
        return (1.0, "GB") if max(r["total_gb_per_step"] for r in self.table_rows) >= 0.1 else (1e3, "MB")

    @cached_property
    def head(self) -> Any:
        """The step at ``headline_context`` (the longest measured)."""
        return next(st for st in self.steps
                    if st.context_tokens == (self.params["headline_context"] or max(self.measured_ms)))

    @cached_property
    def cmp(self) -> Any:
        """The measured step's slope over context against the memory floor's (least squares; None under two)."""
        return roofline.slope_comparison(self.steps) if len(self.steps) >= 2 else None

    @cached_property
    def endpoint_slopes(self) -> tuple[float, float]:
        """The measured and the floor's slope between the end points, ms per 1k tokens."""
        return roofline.endpoint_slopes_ms_per_1k(self.steps)

    @property
    def end_measured(self) -> float | None:
        return self.endpoint_slopes[0] if self.cmp else None

    @cached_property
    def quote(self) -> tuple[float, str]:
        """A quoted attention-only bandwidth (GB/s: the parameter, else the recorded run's published quote; 0: none)
        and its source."""
        given = self.params["quoted_attention_gb_s"]
        published = float((self.meta.get("published") or {}).get("attention_only_gb_s_quoted") or 0)
        return ((given or published) if self.replaying else given), ("parameter" if given else "published (run.json)")

    @cached_property
    def stock(self) -> tuple[Run, dict[int, float]] | None:
        """``stock_dir``'s run and its step per context."""
        if not self.params["stock_dir"]:
            return None
        stock_run = Run.open(self.params["stock_dir"])
        return stock_run, vp.step_ms_by_context(latest_rows(stock_run.rows("sweep")))

    @cached_property
    def projection(self) -> Any:
        """Against the stock arm, the verify time per layer projected to ``project_layers`` layers (step-based)."""
        if self.stock is None:
            return None
        p = self.params
        return vp.project_layers(self.stock[1], self.measured_ms, layers_measured=self.geom.num_layers,
                                 layers_target=p["project_layers"], target_context=p["project_context"])

    @cached_property
    def _traced(self) -> tuple[Any, list[Any], str]:
        """The traced projection of the stock pair (both runs' step_profile rows), its difference from the
        step-based one, or why there is none."""
        if self.stock is None:
            return None, [], ""
        stock_run, source = self.stock[0], self.ctx.source
        stock_prof, this_prof = stock_run.rows("step_profile"), source.rows("step_profile")
        if not (stock_prof and this_prof):
            return None, [], (f"no traces: {'this run' if stock_prof else stock_run.path.name} has no step_profile "
                              "rows, so no traced projection (python -m specdiag.telemetry.torch_trace TRACE --run RUN "
                              "... records them)")
        layers_traced = vp.layers_of(source.meta, f"{source.path.name}/run.json")
        nb.check(vp.layers_of(stock_run.meta, f"{stock_run.path.name}/run.json") == layers_traced,
                 f"{stock_run.path.name} and {source.path.name} differ in num_hidden_layers: a pair must be one model")
        tr = vp.project_traced(stock_prof, this_prof, layers_measured=layers_traced,
                               layers_target=self.params["project_layers"],
                               target_context=self.params["project_context"], stock_run=stock_run.path.name,
                               fixed_run=source.path.name)
        return tr, vp.compare_methods(self.projection, tr), ""

    @property
    def traced(self) -> Any:
        return self._traced[0]

    @property
    def differences(self) -> list[Any]:
        return self._traced[1]

    @property
    def traced_note(self) -> str:
        return self._traced[2]

    @cached_property
    def depth_source(self) -> tuple[tuple[Any, Any, str] | None, str]:
        """The run whose stock steps go to the investigation's depth: ``depth_dir``'s arm when it has two contexts
        or more, else the stock pair's; and why ``depth_dir`` was not used ('' when it was, or not given)."""
        p, note = self.params, ""
        if p["depth_dir"]:
            depth_run = Run.open(p["depth_dir"])
            depth_ms = vp.arm_steps(depth_run.meta, depth_run.rows("engine_ab"), latest_rows(depth_run.rows("sweep")),
                                    p["depth_arm"])
            if len(depth_ms) >= 2:
                return (depth_run, depth_ms, p["depth_arm"] if depth_run.rows("engine_ab") else "sweep"), ""
            note = (f"{depth_run.path.name} has {len(depth_ms)} context(s) with a decode step of {p['depth_arm']} (its "
                    "engine_ab decode rows or sweep): not enough for a line")
        return ((self.stock[0], self.stock[1], "stock") if self.stock else None), note

    @cached_property
    def investigation(self) -> Any:
        """The investigation's recorded run (its published step and GPU)."""
        return Run.open(REFERENCE_DIR / INVESTIGATION)

    @cached_property
    def depth(self) -> Any:
        """The stock arm's whole step at ``project_layers`` layers and ``project_context`` tokens, on the run's GPU
        and the investigation's, against the step the investigation published there (None: no run to project)."""
        source = self.depth_source[0]
        if source is None:
            return None
        d_run, d_ms, d_arm = source
        p = self.params
        d_peak = vp.recorded_peak_gb_s(d_run.meta, p["gpu_name"])
        return vp.project_to_investigation(
            d_ms, layers_measured=vp.layers_of(d_run.meta, f"{d_run.path.name}/run.json"),
            layers_target=p["project_layers"], target_context=p["project_context"],
            published_ms=vp.step_ms_by_context(self.investigation.rows("sweep")).get(p["project_context"]),
            measured_peak_gb_s=d_peak[0] if d_peak else None,
            investigation_peak_gb_s=(self.investigation.meta.get("hardware") or {}).get("memory_bandwidth_gb_s"),
            run=d_run.path.name, arm=d_arm)

    @cached_property
    def chunk_tokens(self) -> int | None:
        """The server's chunked_prefill_size (server-reported)."""
        return prefill.chunk_tokens_of(self.server)

    @cached_property
    def prefill_floors(self) -> list[Any]:
        """Per context, the measured TTFT against the prefill's floor (computed)."""
        ttft_by_context = {int(r["context_tokens"]): r.get("ttft_s") for r in self.summary}
        return prefill.floor_table(self.geom, ttft_by_context, self.peaks, self.chunk_tokens, self.tp)

    @property
    def prefill_rows(self) -> list[dict[str, Any]]:
        return [f.as_row() for f in self.prefill_floors]

    @cached_property
    def prefill_found(self) -> Any:
        return prefill.prefill_finding(self.prefill_floors, self.step_source,
                                       threshold_x=self.params["floor_ratio_threshold"], peaks=self.peaks)

    @cached_property
    def found(self) -> list[fnd.Finding]:
        """The verdicts on the step, its slope, a quoted attention-only bandwidth and the prefill, sorted."""
        p, (quote, quote_source) = self.params, self.quote
        return fnd.sort_findings(verdicts.bandwidth_findings(self.steps, self.peaks, source=self.step_source,
                                                             floor_ratio_threshold=p["floor_ratio_threshold"],
                                                             slope_ratio_threshold=p["slope_ratio_threshold"],
                                                             quoted_attention_gb_s=quote or None,
                                                             quoted_source=quote_source)
                                 + ([self.prefill_found] if self.prefill_found else []))


def check(p: Mapping[str, Any]) -> list[int]:
    """The parameters' ranges and combinations (their types: ``nb.check_parameters``); the context lengths."""
    nb.check(p["expert_routing"] in ROUTINGS, f"expert_routing must be 'min', 'uniform' or 'max'; got {p['expert_routing']!r}")
    nb.check(p["tp_size"] >= 0, f"tp_size must be a whole number >= 0 (0: from the run); got {p['tp_size']!r}")
    nb.check(p["draft_tokens"] >= 0, f"draft_tokens must be a whole number >= 0; got {p['draft_tokens']!r}")
    for name in ("memory_bandwidth_gb_s", "matmul_tflops", "quoted_attention_gb_s"):
        nb.check(p[name] >= 0, f"{name} must be a number >= 0 (0: not given); got {p[name]!r}")
    for name in ("floor_ratio_threshold", "slope_ratio_threshold"):
        nb.check(p[name] > 0, f"{name} must be a ratio > 0; got {p[name]!r}")
    nb.check(p["max_new_tokens"] >= 2, f"max_new_tokens must be a whole number >= 2 (a decode rate needs two chunks); "
                                       f"got {p['max_new_tokens']!r}")
    nb.check(p["headline_context"] >= 0, f"headline_context must be >= 0 tokens (0: the longest measured); got "
                                         f"{p['headline_context']!r}")
    nb.check(p["project_layers"] >= 1 and p["project_context"] >= 1,
             f"project_layers and project_context must be >= 1; got {p['project_layers']!r}, {p['project_context']!r}")
    return nb.check_context_lengths("context_lengths", p["context_lengths"])


def start(params: Mapping[str, Any]) -> Page:
    """Check the parameters and open the run (:class:`Page`)."""
    return Page(params)


def _origin(pg: Page, given: Any) -> str:
    return "parameter" if given else ("recorded" if pg.replaying else "server-reported")


def setup(pg: Page) -> Section:
    """Section 1: the model's geometry, tensor parallelism, tokens per step and the run's peaks, as a table."""
    p, server, s = pg.params, pg.server, Section()
    geom, tp, peaks, w = pg.geom, pg.tp, pg.peaks, pg.weights
    desc = geometry.describe(geom, tp)
    rows = [
        ("model", geom.name, geom.source),
        ("attention", f"{geom.attention.upper()}, {geom.num_layers} layers, {geom.num_attention_heads} query heads "
                      f"({desc['local_attention_heads']} per GPU)", "config"),
        ("KV values per token per layer", f"{desc['kv_values_per_token_per_layer']:,}" + (
            f" (kv_lora_rank {geom.kv_lora_rank} + qk_rope_head_dim {geom.qk_rope_head_dim})" if geom.attention == "mla"
            else f" (2 x {geom.num_kv_heads} KV heads x head_dim {geom.head_dim})"), "config"),
        ("KV dtype", f"{geom.kv_dtype}: {desc['kv_bytes_per_token_per_layer_per_rank']:,.0f} B per token per layer "
                     "per GPU", "config / server"),
        ("layers", f"{desc['n_full_layers']} full attention, {desc['n_sliding_layers']} sliding"
                   + (f" (window {geom.sliding_window:,} tokens)" if geom.sliding_window else ""), "config"),
        ("MoE", (f"{geom.moe.n_routed_experts} routed experts, top-{geom.moe.num_experts_per_tok}, "
                 f"{len(geom.moe.moe_layers)} MoE layers; {w.active_experts_per_moe_layer:.3g} experts read per layer "
                 f"per step ('{p['expert_routing']}' routing)") if geom.moe else "dense: every weight is read each step",
         "config / parameter"),
        ("weights", geom.weight_bytes.note, "config"),
        ("tensor parallelism", f"TP {tp}", _origin(pg, p["tp_size"])),
        ("tokens verified per step", f"{pg.tokens_per_step}", _origin(pg, p["draft_tokens"])),
        ("device", peaks.device_name, peaks.memory_bandwidth.label),
        ("peak memory bandwidth", f"{hardware.gb_s(peaks.memory_bandwidth_gb_s)} per device",
         f"{peaks.memory_bandwidth.label}: {peaks.memory_bandwidth.detail}"),
        ("peak matmul (bf16; a CPU: its faster dtype)",
         f"{peaks.matmul_tflops:,.4g} TFLOPS" if peaks.matmul else "unknown: no compute floor",
         f"{peaks.matmul.label}: {peaks.matmul.detail}" if peaks.matmul else "pass matmul_tflops"),
    ]
    s.table([{"what": what, "value": value, "source": source} for what, value, source in rows])
    if peaks.device_name.startswith("host CPU") or str(server.get("device", "")) == "cpu":
        s.markdown("**This server runs on a CPU.** The memory floor of a CPU is the host DRAM bandwidth, so the peak "
                   "above is the host's (a parameter, or a numpy copy of host memory measured here, which is a lower "
                   "bound on the peak). The analysis runs the same way; only the floor's meaning changes.")
    return s


def measured(pg: Page) -> Section:
    """Section 2: the run's sweep rows (the recorded run's when replaying; live, measured here when 01 left none),
    their step time per context."""
    s, line = Section(), pg._sweep[1]
    if line:
        s.text(line)
    _ = pg.measured_ms  # no step time, or no headline step: stops here, naming why
    return s


def floors(pg: Page) -> Section:
    """Section 3: per context, the bytes one GPU reads per step, its floors and the measured step against them."""
    w, s = pg.weights, Section()
    scale, unit = pg.scale_unit
    shown = [{**r, "kv_gb_per_step": scale * r["kv_gb_per_step"], "weight_gb_per_step": scale * r["weight_gb_per_step"]}
             for r in pg.table_rows]
    s.table(shown, {
        "context_tokens": "context (tokens)", "kv_gb_per_step": f"KV {unit}/step", "weight_gb_per_step": f"weight {unit}/step",
        "kv_floor_ms": "KV floor (ms)", "memory_floor_ms": "memory floor (ms)", "compute_floor_ms": "compute floor (ms)",
        "measured_ms": f"measured (ms, {pg.step_source})", "measured_over_floor_x": "× floor",
        "effective_gb_s_kv": "effective GB/s (KV)", "effective_gb_s_total": "effective GB/s (all)",
        "pct_of_peak_kv": "% of peak (KV)", "pct_of_peak_total": "% of peak (all)",
    }, drop_empty=False, dash_means="not known: the compute floor needs a matmul peak (matmul_tflops)")
    b = scale / 1e9
    return s.text(f"weights per GPU per step (computed): attention {w.attention * b:.3g} {unit}, dense MLP "
                  f"{w.dense_mlp * b:.3g} {unit}, shared experts {w.shared_experts * b:.3g} {unit}, routed experts "
                  f"{w.routed_experts * b:.3g} {unit}, router {w.router * b:.3g} {unit}, LM head {w.lm_head * b:.3g} {unit}")


def headline(pg: Page) -> Section:
    """Section 4: the numbers at ``headline_context`` (the longest measured), in prose computed from the table's row."""
    h, (scale, unit), geom = pg.head.as_row(), pg.scale_unit, pg.geom
    return Section().markdown(
        f"At **{h['context_tokens']:,} tokens** each GPU reads **{scale * h['kv_gb_per_step']:#.3g} {unit} of KV** per step "
        f"({geom.num_layers} layers, {geometry.kv_bytes_per_token_per_layer_per_rank(geom, pg.tp):,.0f} B per token per layer, "
        f"sliding windows applied) and **{scale * h['total_gb_per_step']:#.3g} {unit}** with its weights. At "
        f"{hardware.gb_s(pg.peaks.memory_bandwidth_gb_s)} the **memory floor is {h['kv_floor_ms']:#.3g} ms** for the KV "
        f"alone and **{h['memory_floor_ms']:#.3g} ms** with the weights"
        + (f"; the verify attention's compute floor is {h['compute_floor_ms']:#.3g} ms" if h['compute_floor_ms'] is not None else "")
        + f". The measured step took **{h['measured_ms']:,.4g} ms** ({pg.step_source}), **{h['measured_over_floor_x']:,.3g}× "
        f"the floor**: an **effective {h['effective_gb_s_kv']:#.3g} GB/s** over the KV ({h['effective_gb_s_total']:#.3g} "
        f"GB/s over all bytes), **{h['pct_of_peak_kv']:#.3g}% of peak** ({h['pct_of_peak_total']:#.3g}% over all bytes).")


def roofline_figure(pg: Page) -> Section:
    """Section 5: the step against its floors, the effective bandwidth, the verify attention's roofline."""
    return Section().figure(roofline_plots.figure(pg.steps, pg.peaks, pg.step_source))


def slope(pg: Page) -> Section:
    """Section 6: the measured step's slope over context against the memory floor's (least squares and end points)."""
    s, cmp = Section(), pg.cmp
    if not cmp:
        return s.text("one measured context only: no slope")
    end_measured, end_floor = pg.endpoint_slopes
    s.table([
        {"line": "measured step", "fit": cmp.measured.slope_per_1k, "r2": cmp.measured.r2, "ends": end_measured,
         "source": pg.step_source},
        {"line": "memory floor", "fit": cmp.floor.slope_per_1k, "r2": cmp.floor.r2, "ends": end_floor, "source": "computed"},
    ], {"line": "line", "fit": "least squares (ms per 1k tokens)", "r2": "r²", "ends": "end points (ms per 1k tokens)",
        "source": "source"}, formats={"r2": "{:.3f}"})
    return s.text(f"measured slope / floor slope = {cmp.ratio:,.3g}x (least squares over {cmp.measured.n} contexts)")


def attention_only(pg: Page) -> Section:
    """Section 7: what a quoted attention-only bandwidth (the parameter, else the recorded run's published quote)
    implies for the attention's share of the measured step."""
    quote, quote_source = pg.quote
    if not quote:
        return Section().text("no attention-only bandwidth was quoted for this run (parameter quoted_attention_gb_s)")
    head = pg.head
    t_att = roofline.implied_time_s(head.kv_bytes, quote * 1e9)
    return Section().markdown(
        f"At {head.context_tokens:,} tokens: {head.kv_bytes / 1e9:#.3g} GB of KV at the quoted {quote:g} GB/s "
        f"({quote_source}) takes **{t_att:.3g} s**, {100 * t_att / head.measured_step_s:.3g}% of the measured "
        f"{head.measured_step_s:.4g} s step; over the whole step the same bytes move at "
        f"{head.as_row()['effective_gb_s_kv']:#.3g} GB/s. If the quote is right, the attention took about "
        f"{100 * t_att / head.measured_step_s:.2g}% of the step and everything else the remaining "
        f"{head.measured_step_s - t_att:.3g} s; if the attention was nearly the whole step, the quote counted different bytes.")


def _step_based(pg: Page, stock_run: Any, s: Section) -> None:
    """The step-based projection of the stock pair: its table and its sentence."""
    layers, pr = pg.params["project_layers"], pg.projection
    s.table(pd.DataFrame([vars(r) for r in pr.rows]).rename(columns={
        "context_tokens": "context (tokens)", "stock_step_ms": f"stock step (ms, {stock_run.path.name})",
        "fixed_step_ms": f"this run's step (ms, {pg.step_source})", "saved_per_layer_ms": "saved per layer (ms)",
        "stock_growth_per_layer_ms": "stock growth per layer (ms)",
        "fixed_growth_per_layer_ms": "this run's growth per layer (ms)",
        "projected_saved_ms": f"saved x {layers} layers (ms)", "projected_stock_growth_ms": f"stock growth x {layers} (ms)",
        "projected_fixed_growth_ms": f"this run's growth x {layers} (ms)"}))
    s.markdown(
        f"**Step-based**, computed from {pg.geom.num_layers} measured layers: at **{pr.target_context:,} tokens x "
        f"{layers} layers** ({'extrapolated' if pr.extrapolated else 'interpolated'} from growth lines of "
        f"{pr.stock_slope_ms_per_1k_per_layer:.4f} (stock) and {pr.fixed_slope_ms_per_1k_per_layer:.4f}"
        f" (this run) ms per 1k tokens per layer, counted from {pr.base_context:,} tokens) the stock verify's growth"
        f" is **{pr.target_stock_growth_ms:,.0f} ms** per step and this run's **{pr.target_fixed_growth_ms:,.0f} ms**"
        f" (saved: {pr.target_saved_ms:,.0f} ms).")


def _traced_section(pg: Page, s: Section) -> None:
    """The traced projection of the stock pair: its table and its sentence, or why there is none."""
    tr, layers = pg.traced, pg.params["project_layers"]
    if tr is None:
        s.text(pg.traced_note)
        return
    s.table(pd.DataFrame(vp.traced_table_rows(tr)).rename(columns={
        "context_tokens": "context (tokens)", "attention_ms_per_step": "verify attention (ms per step)",
        "attention_ms_per_layer": "per layer (ms)", "per_step_ms": "KV-index kernel, once per step (ms)"}))
    ts, tf = tr.stock, tr.fixed
    d_stock, d_this = pg.differences
    s.markdown(
        f"**Traced** (the verify-attention kernels' GPU time in the profiled steps, per layer, {ts.method} for stock and "
        f"{tf.method} for this run): at **{tr.target_context:,} tokens x {layers} layers** the stock verify "
        f"attention takes **{ts.target_attention_ms:,.0f} ms** per step ({ts.target_source}) and this run's "
        f"**{tf.target_attention_ms:,.1f} ms** ({tf.target_source}): saved **{tr.target_saved_ms:,.0f} ms**; SGLang's "
        f"KV-index kernel adds {ts.target_per_step_ms:.2f} and {tf.target_per_step_ms:.2f} ms once per step. "
        f"The step-based growth of an arm includes whatever else grows per step (drafting on the CPU, the KV-index kernel, "
        f"the scheduler), multiplied by the layers as if it were attention: from {d_stock.from_context:,} tokens the stock's is "
        f"{d_stock.step_growth_ms:,.0f} ms against {d_stock.traced_growth_ms:,.0f} ms traced ({d_stock.other_growth_ms:,.0f} ms more: "
        f"{d_stock.other_growth_per_step_ms:.2f} ms per step of the {tr.layers_measured}-layer model grew outside the attention), "
        f"this run's {d_this.step_growth_ms:,.1f} ms against {d_this.traced_growth_ms:,.1f} ms traced ({d_this.other_growth_ms:,.1f} ms "
        f"more: {d_this.other_growth_per_step_ms:.2f} ms per step).")


def _to_investigation(pg: Page, d_run: Any, d_arm: str, s: Section) -> None:
    """The stock arm's whole step at ``project_layers`` layers and ``project_context`` tokens, on the run's GPU and
    the investigation's, against the step the investigation published there."""
    p, depth = pg.params, pg.depth
    layers, context = p["project_layers"], p["project_context"]
    investigation_gb_s = (pg.investigation.meta.get("hardware") or {}).get("memory_bandwidth_gb_s")
    d_peak = vp.recorded_peak_gb_s(d_run.meta, p["gpu_name"])
    how = ("measured at this depth: its steps as they are" if depth.method == "measured at depth" else
           f"**{depth.method}**: a {depth.layers_measured}-layer run's whole step multiplied as if all of it ran per "
           f"layer (its scheduler too), since no run at {layers} layers with per-step times was given (`depth_dir`)")
    on_gpu = (f" On the investigation's GPU ({investigation_gb_s:,.0f} GB/s, published, against {d_peak[0]:,.0f} GB/s "
              f"{d_peak[1]}) the same kernel would take **{depth.range_ms[0]:,.0f} to {depth.range_ms[1]:,.0f} ms** "
              "(latency-bound to bandwidth-bound)." if depth.range_ms and d_peak else
              " The run names no GPU, so there is no range for the investigation's GPU (pass gpu_name).")
    if depth.published_ms and depth.published_over_projected:
        low_end, high_end = depth.range_ms or (depth.projected_ms, depth.projected_ms)
        where = ("inside that range" if depth.within else
                 f"below it, {depth.published_ms / low_end:.2g}x its lower end" if depth.published_ms < low_end else
                 f"above it, {depth.published_ms / high_end:.2g}x its upper end" if depth.published_ms > high_end else
                 f"{depth.published_ms / depth.projected_ms:.2g}x the projection")
        verdict = f"The investigation measured **{depth.published_ms:,.0f} ms** per step at {context:,} tokens (published): {where}."
    else:
        verdict = f"The investigation published no step at {context:,} tokens to compare with."
    s.table([{"context_tokens": c, "step_ms": ms} for c, ms in zip(depth.contexts, depth.step_ms)],
            {"context_tokens": "context (tokens)", "step_ms": f"{d_arm} step (ms, measured, {d_run.path.name})"})
    s.markdown(
        f"**{d_arm} ({d_run.path.name}, {depth.layers_measured} layers) at {context:,} tokens x {layers} layers**: "
        f"{depth.projected_ms:,.0f} ms per verify step on the run's GPU (computed: {depth.target_source} along the "
        f"least-squares line {depth.fit.fixed_ms:.3g} ms + {depth.fit.ms_per_1k_tokens:.3g} ms per 1k tokens, {how})."
        f"{on_gpu} {verdict} The investigation's step also held its own drafter and tree verify and its MoE, which the "
        "twin does not.")


def per_layer(pg: Page) -> Section:
    """Section 8: against ``stock_dir``'s stock arm, the verify time per layer projected to ``project_layers`` layers
    (step-based, and traced where both runs have step_profile rows); then the stock arm at the investigation's depth,
    context and GPU (``depth_dir``'s steps, else the stock pair's scaled by the layers)."""
    s = Section()
    if pg.stock is not None:
        _step_based(pg, pg.stock[0], s)
        _traced_section(pg, s)
    else:
        s.text("no stock_dir: no per-layer section (e.g. make replay RUN=data/reference/sglang-h200-mla2-plugin-traced "
               "PARAMS=params/plugin-projection.yaml)")
    source, depth_note = pg.depth_source
    if source is not None:
        _to_investigation(pg, source[0], source[2], s)
    elif depth_note:
        s.text(f"no projection to the investigation: {depth_note}, and no stock_dir to scale")
    return s


def prefill_floor(pg: Page) -> Section:
    """Section 9: per context, the measured TTFT against the prefill's floor (computed), and the longest's verdict."""
    s, prefill_floors = Section(), pg.prefill_floors
    s.table(pg.prefill_rows, {
        "context_tokens": "context (tokens)", "ttft_s": f"TTFT (s, {pg.step_source})", "prefill_tok_s": "prompt tok/s (computed)",
        "n_chunks": "chunks", "s_per_chunk": "s per chunk (computed)", "tflop": "TFLOP (computed)",
        "attention_share": "attention share of the FLOPs", "compute_floor_s": "compute floor (s)",
        "memory_floor_s": "memory floor (s)", "floor_s": "floor (s, computed)", "ttft_over_floor_x": "TTFT / floor (x)"},
        formats={"attention_share": "{:.0%}"}, dash_means="not measured: the run's sweep rows hold no TTFT there")
    longest = next((f for f in reversed(prefill_floors) if f.ttft_over_floor_x is not None), None)
    chunk_text = (f"Chunk size: **{pg.chunk_tokens:,} tokens** (the server's chunked_prefill_size, server-reported)."
                  if pg.chunk_tokens else
                  "The server reported no chunk size (chunked_prefill_size): the floor counts one pass over the prompt.")
    verdict_text = (f" At **{longest.prompt_tokens:,} tokens** the first token came after **{longest.measured_ttft_s:,.3g} s** "
                    f"({pg.step_source}), **{prefill.verdict_text(longest)}** of {longest.floor_s:.3g} s ({longest.bound}-bound): "
                    f"{longest.prompt_tokens / longest.measured_ttft_s:,.0f} prompt tokens/s, "
                    f"{longest.measured_ttft_s / longest.n_chunks:.3g} s per chunk." if longest else
                    " The run's sweep rows hold no TTFT: nothing to set against the floor.")
    return s.markdown(chunk_text + verdict_text)


def findings(pg: Page) -> Section:
    """Section 10: the verdicts on the step, its slope, a quoted attention-only bandwidth and the prefill, sorted
    (``data["found"]``), shown as the findings' HTML."""
    return Section(data={"found": pg.found}).html(fnd.to_html(pg.found))


def metrics(pg: Page) -> dict[str, Any]:
    """The key numbers of 05's result."""
    p, cmp, geom, peaks = pg.params, pg.cmp, pg.geom, pg.peaks
    return {
        "source": pg.step_source, "model": geom.name, "model_source": geom.source, "tp_size": pg.tp,
        "draft_tokens": pg.tokens_per_step, "expert_routing": p["expert_routing"], "kv_dtype": geom.kv_dtype,
        "peak_gb_s": peaks.memory_bandwidth_gb_s, "peak_source": peaks.memory_bandwidth.source,
        "matmul_tflops": peaks.matmul_tflops, "device_name": peaks.device_name,
        "context_tokens": [st.context_tokens for st in pg.steps], "per_context": pg.table_rows,
        "headline_context_tokens": pg.head.context_tokens, "headline": pg.head.as_row(),
        "measured_slope_ms_per_1k_tokens": cmp.measured.slope_per_1k if cmp else None,
        "floor_slope_ms_per_1k_tokens": cmp.floor.slope_per_1k if cmp else None,
        "slope_ratio_x": cmp.ratio if cmp else None,
        "measured_endpoint_slope_ms_per_1k_tokens": pg.end_measured if cmp else None,
        "quoted_attention_gb_s": pg.quote[0] or None,
        "stock_pair": {"stock_dir": p["stock_dir"], **pg.projection.as_dict()} if pg.projection else None,
        "traced_projection": pg.traced.as_dict() if pg.traced else None,
        "traced_vs_step_growth": [vars(d) for d in pg.differences],
        "traced_projection_missing": pg.traced_note or None,
        "investigation_projection": pg.depth.as_dict() if pg.depth else None,
        "prefill_chunk_tokens": pg.chunk_tokens, "prefill": pg.prefill_rows,
    }
