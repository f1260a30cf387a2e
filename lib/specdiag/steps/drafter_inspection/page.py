"""Notebook 03's sections, one call each (:class:`specdiag.section.Section`: tables, figures, text): the notebook keeps
its parameters, these calls and its prose.

:func:`start` checks the parameters, opens the run (or the recorded run) and reads the server; each later call reads
what the earlier ones left on the :class:`Inspection` and adds its own: :func:`configuration` (the drafter as
configured and as the engine ran it), :func:`dflash_settings`, :func:`spans` (computed span and KV per draft step),
:func:`timing` (measured draft time per context, ``repeats`` requests each after one warm-up request),
:func:`window_arms` (DFLASH with the draft window on and off), :func:`behaviour` (recorded engine behaviour),
:func:`findings` and :func:`metrics`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

from specdiag import geometry, nb
from specdiag.section import Section
from specdiag.steps.drafter_inspection import analysis as drafter
from specdiag.steps.drafter_inspection import dflash as dfl
from specdiag.stats import MIN_REQUESTS

NOTEBOOK = "03_drafter_inspection"


@dataclass
class Inspection:
    """What 03's sections share: the notebook context, its parameters and what each section found."""

    ctx: Any
    params: dict[str, Any]
    contexts: list[int]
    server: dict[str, Any]
    opening: Section
    geom: Any = None
    run_geom: Any = None
    tp: int = 1
    window: int | None = None
    patch: dict[str, Any] | None = None
    config_source: str = "configured"
    window_rows: list[dict[str, Any]] = field(default_factory=list)
    cost_rows: list[dict[str, Any]] = field(default_factory=list)
    window_finding: Any = None
    rope: dict[str, Any] = field(default_factory=dict)
    is_dflash: bool = False
    own_window: int | None = None
    spans: list[dict[str, Any]] = field(default_factory=list)
    timing: list[dict[str, Any]] = field(default_factory=list)
    timing_source: str = "server-reported"
    timed: list[dict[str, Any]] = field(default_factory=list)
    arms: list[dict[str, Any]] = field(default_factory=list)

    @property
    def meta(self) -> dict[str, Any]:
        return self.ctx.source.meta

    @property
    def replaying(self) -> bool:
        return self.ctx.replaying

    @property
    def rows_source(self) -> str:
        from specdiag.runs import rows_source  # noqa: PLC0415

        return rows_source(self.meta) if self.replaying else "measured"

    def plan(self, window: int | None) -> drafter.TimingPlan:
        p = self.params
        return drafter.TimingPlan(tuple(self.contexts), p["max_new_tokens"], p["prompt_kind"], p["seed"], window,
                                  p["repeats"])


def start(server_url: str = "", run_dir: str = "", replay_dir: str = "", speculative_config: Mapping[str, Any] | None = None,
          **params: Any) -> Inspection:
    """Check the parameters' ranges (their types: ``nb.check_parameters`` on the parameters cell), open the run
    (``nb.start``), read the server (or the recorded run) and the contexts."""
    p = {"drafter_config": "", "kv_dtype": "", "tp_size": 0, "draft_window_tokens": -1, "context_lengths": [512, 1024],
         "max_new_tokens": 32, "prompt_kind": "novel", "growth_threshold": 1.5, "compare_draft_window_tokens": 256,
         "repeats": MIN_REQUESTS, "seed": 0, **params}
    nb.check(p["prompt_kind"] in ("novel", "predictable"), f"prompt_kind must be 'novel' or 'predictable'; got {p['prompt_kind']!r}")
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
    ctx = nb.start(NOTEBOOK, server_url=server_url, speculative_config=speculative_config or {}, run_dir=run_dir,
                   replay_dir=replay_dir, params=p)
    server = {**(ctx.source.meta.get("server") or {}), **({} if ctx.replaying else ctx.server_info)}
    opening = Section()
    if ctx.replaying:
        recorded = sorted({int(r["context_tokens"]) for r in ctx.source.rows("sweep") if r.get("context_tokens")})
        contexts = recorded or contexts
        opening.text(f"run folder: {ctx.run.path} (replaying {ctx.source.path})")
    else:
        limit = ctx.server_info.get("context_length")
        nb.check(not limit or max(contexts) + p["max_new_tokens"] <= int(limit),
                 f"context_lengths reach {max(contexts):,} tokens + {p['max_new_tokens']} new, beyond the server's "
                 f"context_length {limit}: lower them")
        opening.text(f"run folder: {ctx.run.path}; server {ctx.server_url}")
    if p["repeats"] < MIN_REQUESTS:
        opening.text(f"repeats {p['repeats']}: fewer than {MIN_REQUESTS} requests a context, so the measured verdicts "
                     f"say 'not enough requests'")
    return Inspection(ctx, p, contexts, server, opening)


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
    from specdiag.serving.settings import speculation_state  # noqa: PLC0415 - pure: reads a settings dict

    p, meta, server, s = ins.params, ins.meta, ins.server, Section()
    recorded_drafter = meta.get("drafter") or {}
    has_model = bool(p["drafter_config"] or geometry.recorded_config(recorded_drafter) or recorded_drafter.get("preset")
                     or server.get("speculative_draft_model_path"))
    server_info = {} if ins.replaying else ins.ctx.server_info
    ins.geom = geometry.geometry_for_run(p["drafter_config"], p["kv_dtype"], meta, server_info, role="drafter") if has_model else None
    ins.tp = p["tp_size"] or int(server.get("tp_size") or 1)
    ins.window = drafter.draft_window(server, p["draft_window_tokens"])
    ins.patch = drafter.engine_patch(server, meta)
    if ins.patch and not ins.replaying:
        ins.ctx.run.update(drafter={"engine_patch": ins.patch})  # so a replay of this run can say it too
    ins.config_source = "configured" if not ins.replaying else ins.rows_source
    behaviour_run = ins.ctx.source if ins.replaying else ins.ctx.run
    ins.window_rows = behaviour_run.rows(drafter.WINDOW_CHECK_TABLE)
    ins.cost_rows = behaviour_run.rows(drafter.COST_TABLE)
    ins.window_finding = drafter.window_check_finding(ins.window_rows, source=ins.rows_source, server=server)
    ins.run_geom = drafter.as_engine_ran(ins.geom, ins.window_finding)
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
    ins.rope = dict(ins.geom.rope_scaling or {})
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
    ins.is_dflash = dfl.is_dflash(ins.server)
    ins.own_window = dfl.server_window(ins.server) if ins.is_dflash else None
    if not ins.is_dflash:
        return s.text(f"not a DFLASH server (speculative_algorithm {ins.server.get('speculative_algorithm')!r}): no block "
                      "drafter settings")
    cfg, cfg_from = dfl.drafter_config(ins.server, ins.meta)
    s.text(f"drafter config: {cfg_from or 'not readable here'}")
    return s.table(dfl.config_rows(cfg, ins.server, "recorded" if ins.replaying else "server-reported"),
                   {"what": "what", "value": "value", "source": "source"})


def spans(ins: Inspection) -> Section:
    """Section 2: per context, each layer type's span and the drafter KV per draft step (computed), table and figure."""
    import matplotlib.pyplot as plt  # noqa: PLC0415

    from specdiag import plots  # noqa: PLC0415

    s = Section()
    if ins.geom is None:
        return s.text("no draft model: no drafter attention span to tabulate")
    ins.spans = drafter.span_rows(ins.run_geom, ins.contexts, tp_size=ins.tp, window_cap_tokens=ins.window)
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


def _measure(ins: Inspection, plan: drafter.TimingPlan) -> list[dict[str, Any]]:
    from specdiag.measure.loop import measure_missing, plan_rows  # noqa: PLC0415

    p, client = ins.params, ins.ctx.client
    measure_missing(ins.ctx.run, plan, "drafter_timing", drafter.TIMING_KEY, desc="draft timing",
                    measure=lambda q: drafter.measure_draft_timing(client, q["context_tokens"], p["max_new_tokens"],
                                                                   p["prompt_kind"], q["seed"], plan.draft_window_tokens,
                                                                   q.get("warmup", False)))
    return plan_rows(ins.ctx.run, plan, "drafter_timing", drafter.TIMING_KEY)


def timing(ins: Inspection) -> Section:
    """Section 3: measured draft (and verify) ms per step per context over requests (live: measured now, after one
    warm-up request; replay: the recorded rows), table with ranges, and figure."""
    import matplotlib.pyplot as plt  # noqa: PLC0415

    from specdiag import plots  # noqa: PLC0415

    s = Section()
    if ins.replaying:
        ins.timing, ins.timing_source = ins.ctx.source.rows("drafter_timing"), ins.rows_source
        s.text(f"{len(ins.timing)} recorded drafter_timing rows" if ins.timing else
               "the recorded run has no per-step draft times (drafter_timing): nothing measured to show")
    else:
        ins.timing = _measure(ins, ins.plan(ins.own_window))
        if not any(r.get("draft_ms_median") is not None for r in ins.timing):
            s.text(f"this server ({ins.server.get('engine') or 'sglang'}) does not report per-step draft times (only the "
                   "embedded server's meta_info spec_step_draft_ms does): the verdict below rests on the configuration alone")
    ins.timing = dfl.own_rows(ins.timing, ins.own_window)  # the server given; a second DFLASH arm is timed below
    ins.timed = drafter.timing_table(ins.timing)
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
    import matplotlib.pyplot as plt  # noqa: PLC0415

    s = Section()
    start_other, other_win = (dfl.other_window(ins.ctx.server_info, ins.params["compare_draft_window_tokens"])
                              if not ins.replaying else (False, None))
    if start_other:
        all_timing = ins.timing + dfl.time_other_window(ins.ctx.run, ins.ctx.server_info, other_win, ins.plan(other_win))
    else:
        all_timing = ins.ctx.source.rows("drafter_timing") if ins.replaying else ins.timing
    ins.arms = dfl.arm_table(all_timing) if ins.is_dflash else []
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
    from specdiag import findings as fnd  # noqa: PLC0415

    found = drafter.drafter_findings(ins.run_geom, ins.spans, ins.window, ins.timing, timing_source=ins.timing_source,
                                     growth_threshold=ins.params["growth_threshold"], config_source=ins.config_source,
                                     cost_rows=ins.cost_rows, cost_source=ins.rows_source)
    found += [ins.window_finding] if ins.window_finding else []
    if ins.is_dflash:  # window on and off; or why the drafter's own time is not measurable here
        n_full = ins.run_geom.layer_types.count(geometry.LAYER_FULL) if ins.run_geom else None
        found += dfl.window_findings(ins.arms, n_full, ins.timing_source, ins.params["growth_threshold"]) if ins.arms \
            else [dfl.not_measurable_finding(ins.server, ins.server.get("engine"))]
    if ins.patch:
        found.append(drafter.engine_patch_finding(ins.patch, ins.server.get("engine")))
    found = fnd.sort_findings(found)
    s = Section(data={"found": found})
    return s.html(fnd.to_html(found))


def metrics(ins: Inspection, found: list[Any]) -> dict[str, Any]:
    """The key numbers of 03's result."""
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
