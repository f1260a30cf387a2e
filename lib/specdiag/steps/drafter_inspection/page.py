"""Notebook 03's sections, one call each (:class:`specdiag.section.Section`: tables, figures, text): the notebook keeps
its parameters, these calls and its prose.

:func:`start` checks the parameters, opens the run (or the recorded run) and reads the server; the
:class:`Inspection`'s data are computed when a section first asks. Sections: :func:`configuration` (the drafter as
configured and as the engine ran it), :func:`dflash_settings`, :func:`spans` (computed span and KV per draft step),
:func:`timing` (measured draft time per context, ``repeats`` requests each after one warm-up request),
:func:`window_arms` (DFLASH with the draft window on and off), :func:`behaviour` (recorded engine behaviour),
:func:`findings` and :func:`metrics`.
"""

from __future__ import annotations

from functools import cached_property
from typing import Any, Mapping

import matplotlib.pyplot as plt

from specdiag import findings as fnd
from specdiag import geometry, nb, plots
from specdiag.measure.loop import measure_missing, plan_rows
from specdiag.runs import rows_source
from specdiag.section import Section
from specdiag.serving.settings import speculation_state
from specdiag.stats import MIN_REQUESTS
from specdiag.steps.drafter_inspection import analysis as drafter
from specdiag.steps.drafter_inspection import dflash as dfl

NOTEBOOK = "03_drafter_inspection"


class Inspection(nb.Page):
    """What 03's sections share: the server (or the recorded run), the drafter's geometry as configured and as the
    engine ran it, the spans, the measured draft times and the window arms, each computed when first asked."""

    notebook = NOTEBOOK

    def __init__(self, params: Mapping[str, Any]) -> None:
        """Check the parameters' ranges (their types: ``nb.check_parameters`` on the parameters cell), open the run
        (``nb.start``), read the server (or the recorded run) and the contexts."""
        super().__init__(params)
        p = self.params
        nb.check(p["prompt_kind"] in ("novel", "predictable"),
                 f"prompt_kind must be 'novel' or 'predictable'; got {p['prompt_kind']!r}")
        nb.check(p["tp_size"] >= 0, f"tp_size must be a whole number >= 0 (0: from the run); got {p['tp_size']!r}")
        nb.check(p["draft_window_tokens"] >= -1,
                 f"draft_window_tokens must be -1 (server's), 0 (none) or a token count; got {p['draft_window_tokens']!r}")
        nb.check(p["max_new_tokens"] >= 2, f"max_new_tokens must be a whole number >= 2; got {p['max_new_tokens']!r}")
        nb.check(p["compare_draft_window_tokens"] >= 0,
                 f"compare_draft_window_tokens must be a whole number of tokens >= 0 (0: no second server); got "
                 f"{p['compare_draft_window_tokens']!r}")
        nb.check(p["repeats"] >= 1,
                 f"repeats must be a whole number >= 1 (a verdict takes {MIN_REQUESTS} per context); got {p['repeats']!r}")
        contexts = nb.check_context_lengths("context_lengths", p["context_lengths"])
        self.ctx = ctx = nb.start(NOTEBOOK, server_url=p["server_url"], speculative_config=p["speculative_config"],
                                  run_dir=p["run_dir"], replay_dir=p["replay_dir"], params=nb.run_params(p))
        self.server: dict[str, Any] = {**(ctx.source.meta.get("server") or {}),
                                       **({} if ctx.replaying else ctx.server_info)}
        if ctx.replaying:
            recorded = sorted({int(r["context_tokens"]) for r in ctx.source.rows("sweep") if r.get("context_tokens")})
            contexts = recorded or contexts
            self.intro.text(f"run folder: {ctx.run.path} (replaying {ctx.source.path})")
        else:
            limit = ctx.server_info.get("context_length")
            nb.check(not limit or max(contexts) + p["max_new_tokens"] <= int(limit),
                     f"context_lengths reach {max(contexts):,} tokens + {p['max_new_tokens']} new, beyond the server's "
                     f"context_length {limit}: lower them")
            self.intro.text(f"run folder: {ctx.run.path}; server {ctx.server_url}")
        self.contexts: list[int] = contexts
        if p["repeats"] < MIN_REQUESTS:
            self.intro.text(f"repeats {p['repeats']}: fewer than {MIN_REQUESTS} requests a context, so the measured "
                              "verdicts say 'not enough requests'")

    @property
    def meta(self) -> dict[str, Any]:
        return self.ctx.source.meta

    @property
    def rows_source(self) -> str:
        return rows_source(self.meta) if self.replaying else "measured"

    def plan(self, window: int | None) -> drafter.TimingPlan:
        p = self.params
        return drafter.TimingPlan(tuple(self.contexts), p["max_new_tokens"], p["prompt_kind"], p["seed"], window,
                                  p["repeats"])

    @cached_property
    def geom(self) -> Any:
        """The drafter's geometry as configured (None: the server drafts without a model, or does not say how)."""
        p, meta, server = self.params, self.meta, self.server
        recorded_drafter = meta.get("drafter") or {}
        has_model = bool(p["drafter_config"] or geometry.recorded_config(recorded_drafter)
                         or recorded_drafter.get("preset") or server.get("speculative_draft_model_path"))
        server_info = {} if self.replaying else self.ctx.server_info
        return geometry.geometry_for_run(p["drafter_config"], p["kv_dtype"], meta, server_info, role="drafter") \
            if has_model else None

    @cached_property
    def tp(self) -> int:
        return self.params["tp_size"] or int(self.server.get("tp_size") or 1)

    @cached_property
    def window(self) -> int | None:
        """The server's draft window (or the parameter's), tokens."""
        return drafter.draft_window(self.server, self.params["draft_window_tokens"])

    @cached_property
    def patch(self) -> dict[str, Any] | None:
        """What a patched drafter (vLLM) changed; live, kept in run.json so a replay can say it too."""
        patch = drafter.engine_patch(self.server, self.meta)
        if patch and not self.replaying:
            self.ctx.run.update(drafter={"engine_patch": patch})
        return patch

    @property
    def config_source(self) -> str:
        return "configured" if not self.replaying else self.rows_source

    @cached_property
    def window_rows(self) -> list[dict[str, Any]]:
        """The recorded check of whether the engine honoured the drafter's window."""
        return (self.ctx.source if self.replaying else self.ctx.run).rows(drafter.WINDOW_CHECK_TABLE)

    @cached_property
    def cost_rows(self) -> list[dict[str, Any]]:
        """The recorded STANDALONE against NGRAM step times."""
        return (self.ctx.source if self.replaying else self.ctx.run).rows(drafter.COST_TABLE)

    @cached_property
    def window_finding(self) -> Any:
        return drafter.window_check_finding(self.window_rows, source=self.rows_source, server=self.server)

    @cached_property
    def run_geom(self) -> Any:
        """The drafter as the engine ran it (every layer full where it ignored the drafter's sliding window)."""
        return drafter.as_engine_ran(self.geom, self.window_finding)

    @property
    def rope(self) -> dict[str, Any]:
        return dict(self.geom.rope_scaling or {}) if self.geom is not None else {}

    @cached_property
    def is_dflash(self) -> bool:
        return dfl.is_dflash(self.server)

    @cached_property
    def own_window(self) -> int | None:
        """A DFLASH server's own draft window."""
        return dfl.server_window(self.server) if self.is_dflash else None

    @cached_property
    def spans(self) -> list[dict[str, Any]]:
        """Per context, each layer type's span and the drafter KV per draft step (computed)."""
        if self.geom is None:
            return []
        return drafter.span_rows(self.run_geom, self.contexts, tp_size=self.tp, window_cap_tokens=self.window)

    @property
    def timing_source(self) -> str:
        return self.rows_source if self.replaying else "server-reported"

    @cached_property
    def all_timing(self) -> list[dict[str, Any]]:
        """The drafter_timing rows: live, measured now (after one warm-up request), on the server given; replaying,
        the recorded ones."""
        if self.replaying:
            return self.ctx.source.rows("drafter_timing")
        p, client, plan = self.params, self.ctx.client, self.plan(self.own_window)
        measure_missing(self.ctx.run, plan, "drafter_timing", drafter.TIMING_KEY, desc="draft timing",
                        measure=lambda q: drafter.measure_draft_timing(client, q["context_tokens"], p["max_new_tokens"],
                                                                       p["prompt_kind"], q["seed"],
                                                                       plan.draft_window_tokens, q.get("warmup", False)))
        return plan_rows(self.ctx.run, plan, "drafter_timing", drafter.TIMING_KEY)

    @cached_property
    def timing(self) -> list[dict[str, Any]]:
        """The server given's own rows (a second DFLASH arm is timed in :attr:`arms`)."""
        return dfl.own_rows(self.all_timing, self.own_window)

    @cached_property
    def timed(self) -> list[dict[str, Any]]:
        """Draft (and verify) ms per step per context over requests, with ranges."""
        return drafter.timing_table(self.timing)

    @cached_property
    def arms(self) -> list[dict[str, Any]]:
        """DFLASH: the draft window on and off (live on the embedded server: started again with the other setting)."""
        start_other, other_win = (dfl.other_window(self.ctx.server_info, self.params["compare_draft_window_tokens"])
                                  if not self.replaying else (False, None))
        if start_other:
            all_timing = self.timing + dfl.time_other_window(self.ctx.run, self.ctx.server_info, other_win,
                                                              self.plan(other_win))
        else:
            all_timing = self.all_timing if self.replaying else self.timing
        return dfl.arm_table(all_timing) if self.is_dflash else []

    @cached_property
    def found(self) -> list[fnd.Finding]:
        """Every verdict, sorted."""
        found = drafter.drafter_findings(self.run_geom, self.spans, self.window, self.timing,
                                         timing_source=self.timing_source,
                                         growth_threshold=self.params["growth_threshold"],
                                         config_source=self.config_source, cost_rows=self.cost_rows,
                                         cost_source=self.rows_source)
        found += [self.window_finding] if self.window_finding else []
        if self.is_dflash:  # window on and off; or why the drafter's own time is not measurable here
            n_full = self.run_geom.layer_types.count(geometry.LAYER_FULL) if self.run_geom else None
            found += (dfl.window_findings(self.arms, n_full, self.timing_source, self.params["growth_threshold"])
                      if self.arms else [dfl.not_measurable_finding(self.server, self.server.get("engine"))])
        if self.patch:
            found.append(drafter.engine_patch_finding(self.patch, self.server.get("engine")))
        return fnd.sort_findings(found)


def start(params: Mapping[str, Any]) -> Inspection:
    """Check the parameters and open the run (:class:`Inspection`)."""
    return Inspection(params)


def _config_table(ins: Inspection) -> list[tuple[str, str, str]]:
    geom, tp, window = ins.geom, ins.tp, ins.window
    layers = ", ".join(f"{i}: {'sliding' if t == geometry.LAYER_SLIDING else 'full'}" for i, t in enumerate(geom.layer_types))
    return [
        ("config", geom.name, geom.source),
        ("layers", f"{geom.num_layers} ({layers})", "config"),
        ("sliding window", f"{geom.sliding_window:,} tokens" if geom.sliding_window else "none", "config"),
        ("attention", f"{geom.attention.upper()}: {geom.num_attention_heads} heads, {geom.num_kv_heads} KV heads, "
                      f"head_dim {geom.head_dim}", "config"),
        ("KV per token per layer", f"{geometry.kv_bytes_per_token_per_layer_per_rank(geom, tp):,.0f} B per GPU "
                                   f"({geom.kv_dtype}, TP {tp})", "computed"),
        ("rope scaling", ", ".join(f"{k}={v}" for k, v in ins.rope.items()) if ins.rope else "none", "config"),
        ("max_position_embeddings", f"{geom.max_position_embeddings:,}" if geom.max_position_embeddings else "not given",
         "config"),
        ("server draft window", f"{window:,} tokens" if window else "none",
         "parameter" if ins.params["draft_window_tokens"] >= 0 else ("recorded" if ins.replaying else "server-reported")),
    ]


def configuration(ins: Inspection) -> Section:
    """Section 1: the drafter's configuration (a table), as the engine ran it where a recorded run shows the engine
    ignored the drafter's window, and what a patched drafter (vLLM) changed."""
    p, meta, server, s = ins.params, ins.meta, ins.server, Section()
    recorded_drafter = meta.get("drafter") or {}
    if ins.run_geom is not ins.geom:
        s.text(f"the engine ignored the drafter's {ins.geom.sliding_window}-token sliding window "
               f"({ins.window_finding.id}, below): spans and verdicts use the drafter as it ran, every layer full attention")
    if ins.geom is None:
        unsaid = server.get("speculative_algorithm") is None and speculation_state(server) is not False
        s.text((f"the server does not say how it drafts ({(server.get('settings_sources') or {}).get('speculative_method')})"
                if unsaid else f"this server drafts without a model (speculative_algorithm "
                               f"{server.get('speculative_algorithm')!r}, no speculative_draft_model_path)")
               + ": there is no drafter configuration to inspect; pass drafter_config (a preset or config.json) to "
                 "analyse one. Draft time is still measured below where the server reports it.")
        return s
    s.table([{"what": w, "value": v, "source": src} for w, v, src in _config_table(ins)])
    if ins.patch:
        original = ins.patch.get("original") or {}
        s.text(f"what the engine ran: a patched copy of the drafter ({ins.patch.get('note')}); trained layer_types "
               f"{original.get('layer_types')}, sliding_window {original.get('sliding_window')} (evidence: "
               f"{drafter.PATCH_FILE})")
    if recorded_drafter.get("not_published") and not p["drafter_config"]:
        s.text(f"not published for this drafter: {recorded_drafter['not_published']}")
    if recorded_drafter.get("assumed_config") and not p["drafter_config"]:
        s.text(f"assumed to complete the config (not published): {', '.join(sorted(recorded_drafter['assumed_config']))}; "
               f"{recorded_drafter.get('assumed_why', '')}")
    return s


def dflash_settings(ins: Inspection) -> Section:
    """The DFLASH block drafter's settings (config and what the server states); a line otherwise."""
    s = Section()
    if not ins.is_dflash:
        return s.text(f"not a DFLASH server (speculative_algorithm {ins.server.get('speculative_algorithm')!r}): no block "
                      "drafter settings")
    cfg, cfg_from = dfl.drafter_config(ins.server, ins.meta)
    s.text(f"drafter config: {cfg_from or 'not readable here'}")
    return s.table(dfl.config_rows(cfg, ins.server, "recorded" if ins.replaying else "server-reported"),
                   {"what": "what", "value": "value", "source": "source"})


def spans(ins: Inspection) -> Section:
    """Section 2: per context, each layer type's span and the drafter KV per draft step (computed), table and figure."""
    s = Section()
    if ins.geom is None:
        return s.text("no draft model: no drafter attention span to tabulate")
    rows = [{**r, "kv_mb": r["kv_bytes_per_draft_step"] / 1e6, "kv_mb_no_window": r["kv_bytes_no_draft_window"] / 1e6,
             "kv_mb_all_full": r["kv_bytes_if_all_full"] / 1e6} for r in ins.spans]
    s.table(rows, {"context_tokens": "context (tokens)", "sliding_span_tokens": "sliding layer span (tokens)",
                   "full_span_tokens": "full layer span (tokens)", "kv_mb": "KV per draft step (MB)",
                   "kv_mb_no_window": "without draft window (MB)", "kv_mb_all_full": "if every layer were full (MB)"},
            dash_means="this drafter has no layer of that kind")
    fig, ax = plt.subplots(figsize=(7.5, 4.2))
    xs = [r["context_tokens"] for r in rows]
    ax.plot(xs, [r["kv_mb_all_full"] for r in rows], ":", color="grey", label="if every layer were full")
    ax.plot(xs, [r["kv_mb_no_window"] for r in rows], "s--", color="C1", label="this config, no draft window")
    ax.plot(xs, [r["kv_mb"] for r in rows], "o-", color="C0",
            label="this config" + (f", draft window {ins.window:,}" if ins.window else ""))
    plots.context_axis(ax, xs)
    ax.set_yscale("log")
    ax.set(ylabel="drafter KV per draft step, one GPU (MB)", title="Drafter KV read per draft step vs context")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    plots.source_note(ax, "computed from the drafter's configuration")
    return s.figure(fig)


def timing(ins: Inspection) -> Section:
    """Section 3: measured draft (and verify) ms per step per context over requests (live: measured now, after one
    warm-up request; replay: the recorded rows), table with ranges, and figure."""
    s = Section()
    if ins.replaying:
        s.text(f"{len(ins.all_timing)} recorded drafter_timing rows" if ins.all_timing else
               "the recorded run has no per-step draft times (drafter_timing): nothing measured to show")
    elif not any(r.get("draft_ms_median") is not None for r in ins.all_timing):
        s.text(f"this server ({ins.server.get('engine') or 'sglang'}) does not report per-step draft times (only the "
               "embedded server's meta_info spec_step_draft_ms does): the verdict below rests on the configuration alone")
    if not ins.timed:
        return s
    s.table(ins.timed, {"context_tokens": "context (tokens)", "requests": "requests",
                        "first_left_out": "server's first request left out here",
                        "draft_ms_range": "draft ms per step (median, range)",
                        "verify_ms_range": "verify ms per step (median, range)",
                        "draft_share_range": "draft share of a step", "commit_length": "commit length (mean)"})
    fig, ax = plt.subplots(figsize=(7.5, 4.2))
    xs = [r["context_tokens"] for r in ins.timed]
    ax.plot(xs, [r["draft_ms"] for r in ins.timed], "o-", label=f"draft step ({ins.timing_source})")
    if any(r.get("verify_ms") for r in ins.timed):
        ax.plot(xs, [r["verify_ms"] for r in ins.timed], "s--", label=f"verify step ({ins.timing_source})")
    plots.context_axis(ax, xs, log=False)
    ax.set_xlim(left=0)
    ax.set_ylim(bottom=0)
    ax.set(ylabel="time per step (ms, median over requests)", title="Draft and verify step time vs context")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    plots.source_note(ax, f"{ins.timing_source}: meta_info spec_step_draft_ms / spec_step_verify_ms")
    return s.figure(fig)


def window_arms(ins: Inspection) -> Section:
    """DFLASH: the draft window on and off (live on the embedded server: started again with the other setting)."""
    s = Section()
    if not ins.arms:
        return s.text("no per-step drafter time for this DFLASH server: not measurable here (see the findings)"
                      if ins.is_dflash else "not a DFLASH server: no second window setting to time")
    s.table(ins.arms, {"draft_window_tokens": "draft window (tokens)", "context_tokens": "context (tokens)",
                       "requests": "requests", "draft_ms": "draft ms per step", "verify_ms": "verify ms per step",
                       "draft_share_range": "draft share of a step (median, range)",
                       "commit_length": "commit length (tok/step)"},
            dash_means="none: the drafter keeps the whole context")
    fig, ax = plt.subplots(figsize=(7.5, 4.2))
    dfl.plot_arms(ax, ins.arms, ins.timing_source)
    return s.figure(fig)


def behaviour(ins: Inspection) -> Section:
    """The recorded engine behaviour: the window check and STANDALONE against NGRAM per context."""
    s = Section()
    if ins.window_rows:
        s.table(ins.window_rows, {"context_tokens": "context (tokens)", "kind": "prompt",
                                  "verify_ct_as_shipped": "verify steps, as shipped",
                                  "verify_ct_all_full": "verify steps, all layers full",
                                  "correct_drafts_as_shipped": "correct drafts, as shipped",
                                  "correct_drafts_all_full": "correct drafts, all full", "same_drafting": "same drafting",
                                  "error": "error"})
    if ins.cost_rows:
        s.table(ins.cost_rows, {"context_tokens": "context (tokens)", "standalone_step_ms": "STANDALONE ms per verify step",
                                "ngram_step_ms": "NGRAM ms per verify step",
                                "drafter_ms_per_verify_step": "drafter ms per verify step",
                                "standalone_commit_length": "commit, STANDALONE", "ngram_commit_length": "commit, NGRAM"})
    if not ins.window_rows and not ins.cost_rows:
        where = ins.ctx.source.path if ins.replaying else ins.ctx.run.path
        s.text(f"{where} holds no record of the engine's drafter behaviour ({drafter.WINDOW_CHECK_TABLE}, "
               f"{drafter.COST_TABLE}: written by specdiag sweep --measure baseline_sweep,drafter_timing with window_pair and "
               "cost_pair, as params/arms/tiny-notebooks.yaml sets them)")
    return s


def findings(ins: Inspection) -> Section:
    """Section 4: every verdict, sorted (``data["found"]``), shown as the findings' HTML."""
    return Section(data={"found": ins.found}).html(fnd.to_html(ins.found))


def metrics(ins: Inspection) -> dict[str, Any]:
    """The key numbers of 03's result."""
    found = ins.found
    geom, run_geom, by = ins.geom, ins.run_geom, {f.id: f for f in found}
    bounded, cost, measured = by.get("drafter.attention_bounded"), by["drafter.cost_bounded"], by.get("drafter.measured_cost")
    wf = ins.window_finding
    verdict = wf.numbers.get("verdict") if wf else None
    return {
        "drafter": geom.name if geom else None, "drafter_source": geom.source if geom else None, "tp_size": ins.tp,
        "draft_window_tokens": ins.window, "n_layers": geom.num_layers if geom else None,
        "n_sliding_layers": geom.layer_types.count(geometry.LAYER_SLIDING) if geom else None,
        "n_full_layers": geom.layer_types.count(geometry.LAYER_FULL) if geom else None,
        "n_full_layers_as_run": run_geom.layer_types.count(geometry.LAYER_FULL) if run_geom else None,
        "sliding_window_tokens": geom.sliding_window if geom else None,
        "max_position_embeddings": geom.max_position_embeddings if geom else None, "rope_scaling": ins.rope or None,
        "context_tokens": [r["context_tokens"] for r in ins.spans] or ins.contexts,
        "kv_bytes_per_draft_step": [r["kv_bytes_per_draft_step"] for r in ins.spans],
        "kv_bytes_no_draft_window": [r["kv_bytes_no_draft_window"] for r in ins.spans],
        "attention_bounded": (bounded.numbers["max_span_tokens"] is not None) if bounded else None,
        "max_span_tokens": bounded.numbers["max_span_tokens"] if bounded else None,
        "cost_bounded_severity": cost.severity, "cost_bounded_verdict": cost.verdict,
        "draft_ms_median": [r["draft_ms"] for r in ins.timed], "requests_per_context": [r["requests"] for r in ins.timed],
        "timing_source": ins.timing_source if ins.timed else None,
        "measured_growth": {k: measured.numbers.get(k) for k in ("growth_x", "growth_lo", "growth_hi", "reading")}
        if measured else None,
        "window_honoured": {"honoured": True, "ignored": False}.get(verdict) if wf else None,
        "window_check": wf.numbers if wf else None,
        "drafter_ms_per_verify_step": {r["context_tokens"]: r.get("drafter_ms_per_verify_step") for r in ins.cost_rows} or None,
        "engine": ins.server.get("engine"), "engine_patched_drafter": bool(ins.patch),
        "dflash": {"draft_window_tokens": ins.own_window, "arms": ins.arms,
                   **{f.id: f.numbers for f in found if f.id in ("drafter.window_applied", "drafter.no_window")},
                   "not_measurable": "drafter.time_not_measurable" in by} if ins.is_dflash else None,
    }
