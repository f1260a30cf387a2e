"""Notebook 10's sections, one call each (:class:`specdiag.section.Section`: tables, figures, text): the notebook keeps
its parameters, these calls and its prose.

:func:`start` checks the parameters (before any server is reached) and opens the run; then :func:`arms` (each arm's
server and pool), :func:`measure_or_replay`, :func:`layouts` (where each long request lay), :func:`step_times`
(fresh against fragmented), :func:`contiguous` (an arm beside its ``_contiguous`` arm), :func:`prediction` (the kernel
A/B's), :func:`findings` and :func:`metrics`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

import pandas as pd

from specdiag import nb
from specdiag.section import Section
from specdiag.steps.kv_layout import analysis as kla
from specdiag.steps.kv_layout import measure as klm
from specdiag.steps.kv_layout import tier0
from specdiag.steps.kv_layout.filler import FillerPlan

NOTEBOOK = "10_kv_layout"
KERNEL_AB_REFERENCE = "kernel-ab-h200"


@dataclass
class Page:
    """What 10's sections share: the notebook context, its parameters and what each section found."""

    ctx: Any
    plan: klm.LayoutPlan
    arm_list: list[klm.Arm] | None
    started: list[Any]  # embedded arms 10 starts itself (engine_configs), one after another in section 2
    pool_tokens: int
    kernel_ab_dir: str
    on_vllm: bool
    replayed_from: str | None
    opening: Section
    rows: list[dict[str, Any]] = field(default_factory=list)
    source: str = "measured"
    summ: pd.DataFrame = field(default_factory=pd.DataFrame)
    cost: pd.DataFrame = field(default_factory=pd.DataFrame)
    three: pd.DataFrame = field(default_factory=pd.DataFrame)
    pred: pd.DataFrame = field(default_factory=pd.DataFrame)
    pred_source: str = ""


def start(server_url: str = "", run_dir: str = "", replay_dir: str = "", engine_configs: str = "", pool_tokens: int = 0,
          arms: str = "", layout_dirs: str = "",
          context_lengths: Sequence[int] = (2048, 8192), max_new_tokens: int = 48, repeats: int = 3,
          filler_cycles: float = 1.1, filler_concurrency: int = 1, filler_max_minutes: float = 5.0, seed: int = 0,
          kernel_ab_dir: str = "") -> Page:
    """Check the parameters and parse the arms, then open the run (``nb.start``: reach the first arm's server, or open
    the recorded run); on vLLM nothing is measured (section 6 says why)."""
    from specdiag.paths import relative_to_project  # noqa: PLC0415

    nb.check(repeats >= 1, f"repeats must be a whole number >= 1; got {repeats!r}")
    nb.check(max_new_tokens >= 2, f"max_new_tokens must be >= 2; got {max_new_tokens!r}")
    nb.check(filler_cycles > 0, f"filler_cycles must be > 0; got {filler_cycles!r}")
    nb.check(pool_tokens >= 0, f"pool_tokens must be a whole number >= 0; got {pool_tokens!r}")
    nb.check(not (engine_configs and (arms or replay_dir)),
             "engine_configs starts arms here; arms names running servers and replay_dir a recorded run: pass one of them")
    contexts = nb.check_context_lengths("context_lengths", context_lengths)
    try:
        filler_plan = FillerPlan(cycles=float(filler_cycles), concurrency=int(filler_concurrency), seed=int(seed),
                                 max_seconds=60.0 * float(filler_max_minutes))
        arm_list = klm.parse_arms(arms, server_url, layout_dirs) if (arms or replay_dir) else None
        started = klm.parse_engine_configs(engine_configs) if engine_configs else []
    except ValueError as exc:
        raise nb.ParameterError(str(exc)) from None
    plan = klm.LayoutPlan(contexts=tuple(contexts), max_new_tokens=max_new_tokens, repeats=repeats, seed=int(seed),
                          filler=filler_plan)
    first_url = arm_list[0].url if arm_list else server_url
    ctx = nb.start(NOTEBOOK, server_url="" if started else first_url, run_dir=run_dir, replay_dir=replay_dir,
                   params=dict(arms=arms, engine_configs=engine_configs, pool_tokens=pool_tokens,
                               layout_dirs=layout_dirs, context_lengths=contexts, max_new_tokens=max_new_tokens,
                               repeats=repeats, filler_cycles=filler_cycles, filler_concurrency=filler_concurrency,
                               seed=seed, kernel_ab_dir=kernel_ab_dir), needs_server=not started)
    opening = Section()
    on_vllm = ctx.live and not started and ctx.client.engine == "vllm"
    if on_vllm:
        opening.text(f"{ctx.server_url} is vLLM: its KV lives in blocks of block_size tokens (contiguous inside a "
                     "block) and it shows no request's block table over HTTP, so 10 measures nothing there (section "
                     "6); run it against SGLang or the embedded server")
        arm_list = []
    elif ctx.live and not started and arm_list is None:
        embedded = str((ctx.client.server_info() or {}).get("version", "")).startswith("specdiag-localserver")
        arm_list = klm.parse_arms("", ctx.server_url, layout_dirs, default_name="embedded" if embedded else "server")
    replayed_from = relative_to_project(ctx.source.path) if ctx.replaying else None
    opening.text(f"run folder: {ctx.run.path}" + (f"; replaying {replayed_from}" if replayed_from else ""))
    return Page(ctx, plan, arm_list, started, pool_tokens, kernel_ab_dir, on_vllm, replayed_from, opening)


ARM_COLUMNS = {"arm": "arm", "what": "what", "attention_backend": "attention backend", "pool_tokens": "pool (token slots)",
               "page_size": "page size", "disable_radix_cache": "radix cache off", "speculative_algorithm": "speculation",
               "tokens_per_step": "tokens per verify step", "kv_alloc": "KV allocator", "layout_source": "layout from"}


def arms(pg: Page) -> Section:
    """Section 1: each arm's server, backend, pool, page size, radix cache and layout source (recorded when
    replaying; live, asked of each server and kept in run.json)."""
    ctx, s = pg.ctx, Section()
    if pg.started:
        return s.text(f"{len(pg.started)} arms started in section 2, one after another: "
                      + ", ".join(f"{a.name} ({a.config}, {a.kv_alloc} allocator)" for a in pg.started))
    if ctx.replaying:
        arm_rows = [dict(r) for r in (ctx.source.meta.get("kv_layout_arms") or [])]
    else:
        from specdiag.serving import reach  # noqa: PLC0415

        arm_rows = []
        for arm in pg.arm_list or []:
            c = ctx.client if arm.url == ctx.server_url else reach(arm.url)
            facts = klm.server_pool(c)
            arm_rows.append({"arm": arm.name, "url": c.base_url, "what": klm.ARM_TEXT.get(arm.name, ""), **facts,
                             "layout_source": ("server-reported (meta_info.kv_layout)" if facts["reports_layout"]
                                               else f"plugin records in {arm.layout_dir}" if arm.layout_dir else "none")})
            if facts.get("disable_radix_cache") is False:
                s.text(f"note: {arm.name} runs with the radix cache on: finished requests keep their slots in the "
                       "tree, so the filler fragments less; start it with --disable-radix-cache")
        ctx.run.update(kv_layout_arms=arm_rows)
    return s.table(arm_rows, ARM_COLUMNS)


def measure_or_replay(pg: Page) -> Section:
    """Section 2: live, every arm fresh then fragmented (rows appended as taken, a re-run resumes); replaying, the
    recorded rows. Then the arms that failed."""
    ctx, s = pg.ctx, Section()
    if ctx.replaying:
        pg.rows = ctx.source.rows(klm.TABLE)
        nb.check(any(r.get("pool_state") for r in pg.rows), f"{ctx.source.path} has no {klm.TABLE} rows to replay")
        pg.source = "measured (recorded run)"
        s.text(f"replaying {len(pg.rows)} rows of {pg.replayed_from}; nothing is sent")
    else:
        if pg.started:  # started, measured and stopped one after another, then tabled as they reported themselves
            s.table(klm.measure_started(ctx.run, pg.started, pg.plan, pg.pool_tokens,
                                        log_dir=ctx.run.path / "servers"), ARM_COLUMNS)
        else:
            klm.measure(ctx.run, pg.arm_list or [], pg.plan)
        pg.rows = ctx.run.rows(klm.TABLE)
        pg.source = "not measured (vLLM)" if pg.on_vllm else "measured"
    for line in kla.arm_failures(pg.rows):
        s.text(f"arm failed: {line}")
    return s


def layouts(pg: Page) -> Section:
    """Section 3: each request's layout at its last verify step (server-reported)."""
    lay = []
    for r in kla.latest(pg.rows).to_dict("records"):
        L = r.get("layout") or {}
        lay.append({"arm": r["arm"], "pool_state": r["pool_state"], "context_tokens": r["context_tokens"],
                    "repeat": r["repeat"], "tokens": L.get("tokens"), "runs": L.get("runs"),
                    "share": L.get("share_in_long_runs"), "runs_per_1k": L.get("runs_per_1k_tokens"),
                    "longest": L.get("longest_run"),
                    "cycles": (r.get("filler") or {}).get("cycles") if isinstance(r.get("filler"), dict) else None,
                    "error": r.get("error")})
    return Section().table(lay, {"arm": "arm", "pool_state": "pool", "context_tokens": "context (tokens)",
                                 "repeat": "repeat", "tokens": "prefix (tokens)", "runs": "runs",
                                 "share": "tokens in runs >= 64", "runs_per_1k": "runs per 1k tokens",
                                 "longest": "longest run (slots)", "cycles": "filler (pool cycles)", "error": "error"},
                           formats={"share": "{:.0%}"},
                           dash_means="not reported (no layout source), or no filler before it")


def step_times(pg: Page) -> Section:
    """Section 4: ms per verify step per arm, state and context; fragmented over fresh with its interval over requests
    (and the figure); what was not measured."""
    from specdiag.steps.kv_layout import plots as klp  # noqa: PLC0415

    s = Section()
    pg.summ, pg.cost = kla.summary(pg.rows), kla.costs(pg.rows)
    s.table(pg.summ, {"arm": "arm", "pool_state": "pool", "context_tokens": "context (tokens)", "requests": "requests",
                      "steps": "steps", "step_ms": "ms per verify step (median)",
                      "client_step_ms": "client step_ms (median)", "share_in_long_runs": "tokens in runs >= 64",
                      "runs_per_1k_tokens": "runs per 1k tokens"}, formats={"share_in_long_runs": "{:.0%}"})
    if not pg.cost.empty:
        s.table(pg.cost, {"arm": "arm", "context_tokens": "context (tokens)", "fresh_ms": "fresh (ms/step)",
                          "fragmented_ms": "fragmented (ms/step)", "cost_x": "fragmented / fresh",
                          "cost_lo_x": "interval from", "cost_hi_x": "to", "verdict": "verdict",
                          "requests_fresh": "requests fresh", "requests_fragmented": "requests fragmented",
                          "fresh_share": "fresh: runs >= 64", "fragmented_share": "fragmented: runs >= 64",
                          "layouts_differ": "layouts differ enough"},
                formats={"cost_x": "{:.3f}", "cost_lo_x": "{:.3f}", "cost_hi_x": "{:.3f}", "fresh_share": "{:.0%}",
                         "fragmented_share": "{:.0%}"})
        s.figure(klp.figure(pg.summ, pg.source))
    else:
        s.text("no arm has both a fresh and a fragmented request without error: nothing to compare")
    for gap in kla.gaps(pg.rows):
        s.text(f"not measured: {kla.gap_text(gap)}")
    return s


def contiguous(pg: Page) -> Section:
    """Section 4b: fresh, scattered and contiguous-allocator states of each arm beside its ``_contiguous`` arm."""
    pg.three = tier0.three_states(pg.rows)
    if pg.three.empty:
        return Section().text("no arm was measured beside its _contiguous arm: the contiguous allocator is not "
                              "compared in this run")
    return Section().table(pg.three, {
        "arm": "arm", "context_tokens": "context (tokens)", "fresh_ms": "fresh (ms/step)",
        "scattered_ms": "scattered (ms/step)", "contiguous_ms": "contiguous allocator (ms/step)",
        "scattered_interval": "scattered / fresh (interval, requests)",
        "contiguous_interval": "contiguous / fresh (interval, requests)", "fresh_share": "fresh: runs >= 64",
        "scattered_share": "scattered: runs >= 64", "contiguous_share": "contiguous: runs >= 64",
        "buys_back": "buys the cost back"},
        formats={"fresh_share": "{:.0%}", "scattered_share": "{:.0%}", "contiguous_share": "{:.0%}"})


def prediction(pg: Page) -> Section:
    """Section 5: the kernel A/B's predicted cost per context (``kernel_ab_dir``, else the H200 reference run)."""
    from specdiag.paths import REFERENCE_DIR, relative_to_project  # noqa: PLC0415
    from specdiag.runs import Run  # noqa: PLC0415

    s = Section()
    try:
        kab = Run.open(pg.kernel_ab_dir or str(REFERENCE_DIR / KERNEL_AB_REFERENCE))
        pg.pred = kla.kernel_prediction(kab.rows("kernel_ab"))
        pg.pred_source = (f"computed from {relative_to_project(kab.path)} (06: split_triton on a shuffled page_size-1 "
                          f"table over split_triton_b64 on 64-token pages, "
                          f"{kab.meta.get('device', {}).get('gpu', 'GPU')})")
    except (FileNotFoundError, ValueError) as exc:
        pg.pred, pg.pred_source = kla.kernel_prediction([]), ""
        s.text(f"no kernel A/B run to predict from ({exc})")
    if not pg.pred.empty:
        s.table(pg.pred, {"context_tokens": "context (tokens)", "predicted_max_x": "predicted at most (ratio)",
                          "shapes": "per shape (8 heads x draft tokens: ratio)"}, formats={"predicted_max_x": "{:.3f}"})
        s.text(pg.pred_source)
    return s


def findings(pg: Page) -> Section:
    """Section 7: the verdicts (``data["found"]``); on vLLM the one that says 10 cannot measure there."""
    from specdiag import findings as fnd  # noqa: PLC0415

    source = "configured" if pg.on_vllm else "measured"
    found = fnd.sort_findings(kla.findings(pg.cost, pg.pred, source=source, prediction_source=pg.pred_source,
                                           missing=kla.gaps(pg.rows)) + tier0.findings(pg.three, source=source))
    if pg.on_vllm:
        found = [fnd.Finding("kv_layout.vllm", "KV layout: not measurable on vLLM",
                             "vLLM keeps a request's KV in blocks of block_size tokens and shows no block table over "
                             "HTTP: the page_size-1 scattering 10 measures cannot happen there (section 6).", "info",
                             (f"server: {pg.ctx.server_url} (vLLM)",), {}, "configured")]
    s = Section(data={"found": found})
    if pg.replayed_from:
        s.markdown(f"These findings come from the recorded run `{pg.replayed_from}`, not from a measurement of this run.")
    return s.html(fnd.to_html(found))


def metrics(pg: Page) -> dict[str, Any]:
    return {**kla.metrics(pg.cost, pg.summ), "tier0": tier0.metrics(pg.three), "source": pg.source,
            "prediction": {str(r.context_tokens): round(r.predicted_max_x, 4) for r in pg.pred.itertuples()}
            if not pg.pred.empty else {}}
