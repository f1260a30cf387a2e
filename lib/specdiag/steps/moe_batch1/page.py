"""Notebook 11's sections, one call each (:class:`specdiag.section.Section`: tables, figures, text): the notebook keeps
its parameters, these calls and its prose.

:func:`start` checks the parameters, opens the run, decides whether it can measure the server given and which run it
analyses; the :class:`Page` measures (live) and reads the run into :class:`~.analysis.Tables` when a section first
asks. Sections: :func:`measure_or_replay`, :func:`spread`, :func:`distinct`, :func:`expert_bytes`, :func:`ladder`,
:func:`balance`, :func:`best_and_projection`, :func:`findings` and :func:`metrics`.
"""

from __future__ import annotations

from functools import cached_property
from typing import Any, Mapping

from specdiag import findings as fnd
from specdiag import nb
from specdiag.paths import REFERENCE_DIR, relative_to_project
from specdiag.section import Section
from specdiag.stats import MIN_REQUESTS
from specdiag.steps.moe_batch1 import analysis as ma
from specdiag.steps.moe_batch1 import cost
from specdiag.steps.moe_batch1 import measure as mm
from specdiag.steps.moe_batch1 import plots as mp

NOTEBOOK = "11_moe_batch1"
REFERENCE = "sglang-h200-moe-batch1"


def _why_not(ctx: Any, recorder_dir: str) -> tuple[str, dict[str, Any] | None]:
    """Why the server given cannot be measured ('' when it can), and the served model's config."""
    info = ctx.client.server_info() if ctx.client.engine == "sglang" else {}
    config = mm.model_config(info or {})
    if ctx.client.engine != "sglang":
        return (f"{ctx.server_url} is {ctx.client.engine}: 11 measures SGLang's recorder (section 8 says what vLLM "
                "exposes)"), config
    if str((info or {}).get("version", "")).startswith("specdiag-localserver"):
        return "the embedded server's model is dense: it has no experts to route to", config
    if not config or not config.get("n_routed_experts"):
        return (f"the served model ({(info or {}).get('model_path')}) has no readable config.json with "
                "n_routed_experts on this machine"), config
    if not recorder_dir:
        return "recorder_dir is empty: name the server's SGLANG_EXPERT_DISTRIBUTION_RECORDER_DIR", config
    return "", config


class Page(nb.Page):
    """What 11's sections share: whether the server given is measured, the run read into :class:`~.analysis.Tables`
    (measured when first asked, or recorded), each computed when a section first asks."""

    notebook = NOTEBOOK

    def __init__(self, params: Mapping[str, Any]) -> None:
        """Check the parameters, open the run; live only on an SGLang MoE server with a readable recorder folder, else
        the recorded reference run when nothing was asked for."""
        super().__init__(params)
        p = self.params
        nb.check(p["max_new_tokens"] >= 2, f"max_new_tokens must be >= 2; got {p['max_new_tokens']!r}")
        nb.check(p["repeats"] >= 1,
                 f"repeats must be >= 1 (a comparison takes {MIN_REQUESTS} per cell); got {p['repeats']!r}")
        nb.check(all(0 <= a <= 1 for a in p["acceptance"]), f"acceptance rates lie in [0, 1]; got {p['acceptance']!r}")
        p["context_lengths"] = nb.check_context_lengths("context_lengths", list(p["context_lengths"]))
        p["recorder_contexts"] = nb.check_context_lengths("recorder_contexts", list(p["recorder_contexts"]))
        reference = REFERENCE_DIR / REFERENCE
        live = bool(p["server_url"]) and not p["replay_dir"]
        self.ctx = ctx = nb.start(NOTEBOOK, server_url=p["server_url"] if live else "", run_dir=p["run_dir"],
                                  replay_dir=p["replay_dir"], params=nb.run_params(p), needs_server=live,
                                  reference=None if live or not reference.exists() else reference)
        self.config: dict[str, Any] | None = None
        if live:
            why_not, self.config = _why_not(ctx, p["recorder_dir"])
            if why_not:
                self.intro.text(f"not measuring: {why_not}")
                live = False
            else:
                ctx.run.update(moe_model_config=self.config, device={"gpu": (ctx.server_info or {}).get("device") or ""},
                               data_source="measured")
        self.measuring = live
        # the reference shown when nothing was asked for is not this run's; a replay_dir asked for is (as in 09)
        shown = relative_to_project(ctx.source.path) if ctx.replaying else None
        self.intro.text(f"run folder: {ctx.run.path}"
                          + (f"; replaying {shown}" + (" (the recorded reference: nothing was asked to measure)"
                                                       if ctx.recorded_from else "") if shown else "" if live else
                             "; nothing recorded to analyse: the tables below come from the uniform expectation and "
                             "Kimi K2.6's published shape"))

    @cached_property
    def mr(self) -> ma.MoERun:
        """The run read: live, after the recorder pass, the timed requests and a routed-experts request."""
        p, ctx = self.params, self.ctx
        if self.measuring:
            mm.recorder_pass(ctx.client, ctx.run, p["recorder_dir"], p["recorder_contexts"], p["max_new_tokens"],
                             p["seed"])
            mm.timed_requests(ctx.client, ctx.run, p["context_lengths"], p["max_new_tokens"], p["repeats"], p["seed"])
            mm.routed_request(ctx.client, ctx.run, p["recorder_contexts"][0], p["max_new_tokens"], self.config,
                              p["seed"])
        source_run = ctx.source if ctx.replaying else (ctx.run if self.measuring else None)
        return ma.load_run(source_run) if source_run is not None else ma.MoERun(source="computed")

    @property
    def src(self) -> str:
        if self.mr.empty:
            return "computed"
        return self.mr.source + (" (recorded run)" if self.recorded_from else "")

    @cached_property
    def t(self) -> Any:
        """The run's tables (:class:`~.analysis.Tables`)."""
        p = self.params
        return ma.tables(self.mr, p["projection_context"], tuple(p["acceptance"]))

    @cached_property
    def found(self) -> list[fnd.Finding]:
        return fnd.sort_findings(ma.findings(self.mr, self.t, self.params["projection_context"]))


def start(params: Mapping[str, Any]) -> Page:
    """Check the parameters and open the run (:class:`Page`)."""
    return Page(params)


def measure_or_replay(pg: Page) -> Section:
    """Section 1: live, the recorder pass, the timed requests and a routed-experts request; then the run's tables and
    the served model's facts."""
    s = Section()
    for r in pg.mr.dump_rows:
        if r.get("error"):
            s.text(f"T={r.get('tokens_per_step')}: recorder pass failed: {r['error']}")
    geom = ma.geometry_of(pg.mr.config)
    if geom is None or not geom.moe:
        return s
    facts = {"model": pg.mr.config.get("_name_or_path") or geom.name, "layers": geom.num_layers,
             "MoE layers": len(geom.moe.moe_layers), "routed experts": geom.moe.n_routed_experts,
             "top_k": geom.moe.num_experts_per_tok, "shared experts width": geom.moe.shared_intermediate_size,
             "expert width (moe_intermediate_size)": geom.moe.moe_intermediate_size, "hidden": geom.hidden_size,
             "bytes of one routed expert": f"{cost.expert_bytes(geom) / 1e6:.3g} MB ({geom.weight_bytes.note})",
             "router": "random weights (run.json moe_model_made_by)" if pg.mr.random_router else "as served",
             "recorder dumps (tokens per step)": ", ".join(str(t) for t in sorted(pg.mr.dumps)) or "none"}
    return s.table([{"": k, "value": str(v)} for k, v in facts.items()])


def spread(pg: Page) -> Section:
    """Section 2: the check, does the routing spread; the distinct-experts table and the routed-experts checks."""
    t, s = pg.t, Section()
    s.text(t.spread_text)
    if not t.dt.empty:
        s.table(t.dt, {"tokens": "tokens per pass", "kind": "passes", "passes": "count",
                       "distinct": "distinct experts per layer (median)", "expected_uniform": "independent tokens (expected)",
                       "spread_ratio": "measured / expected", "effective_tokens": "routed like (independent tokens)",
                       "over_t1_x": "expert bytes over one token's (x)"},
                formats={"spread_ratio": "{:.0%}", "effective_tokens": "{:.2g}"})
        ext = t.pass_df[t.pass_df["kind"] == "extend"]
        if not ext.empty:
            s.text(f"prefill (extend) passes: {len(ext)}, {int(ext['tokens'].median())} tokens each (median), "
                   f"{ext['distinct_median'].median():.0f} distinct experts per layer (median)")
    for line in ma.routed_checks(pg.mr):
        s.text(f"routed experts, {line}")
    return s


def distinct(pg: Page) -> Section:
    """Section 3: distinct experts per pass against T, and ms per step against T (figure)."""
    geom = ma.geometry_of(pg.mr.config)
    e = geom.moe.n_routed_experts if geom is not None and geom.moe else 384
    k = geom.moe.num_experts_per_tok if geom is not None and geom.moe else 8
    return Section().figure(mp.figure(pg.t.dt, pg.t.windows, pg.t.steps, e, k, pg.src))


SHARE_COLUMNS = {"tokens": "tokens per step", "distinct": "distinct experts per layer",
                 "routed_expert_bytes": "routed experts (B)", "other_weight_bytes": "other weights (B)",
                 "kv_bytes": "KV (B)", "expert_share": "expert share of bytes", "floor_ms": "bytes floor (ms)",
                 "experts_over_t1_x": "expert bytes over one token's (x)"}
SHARE_FORMATS = {"expert_share": "{:.0%}", "routed_expert_bytes": "{:.3g}", "other_weight_bytes": "{:.3g}",
                 "kv_bytes": "{:.3g}"}


def expert_bytes(pg: Page) -> Section:
    """Section 4: the bytes a step reads with the measured verify passes' distinct experts, beside T distinct drafts'."""
    t, s = pg.t, Section()
    peak, peak_src = ma.device_peak(pg.mr)
    s.text(f"at {t.share_context:,} tokens of context" + (f"; floor at {peak:,.0f} GB/s ({peak_src})" if peak else ""))
    if t.share.empty and t.share_windows.empty:
        return s.text("no served model config, or routing that does not spread, in this run: see section 7 for Kimi K2.6")
    if not t.share.empty:
        s.text("with the distinct experts the measured verify (T=1: decode) passes read (the recorder's counts):")
        s.table(t.share, SHARE_COLUMNS, formats=SHARE_FORMATS)
    if not t.share_windows.empty:
        s.text("with the distinct experts T distinct drafts would read (windows of T generated tokens):")
        s.table(t.share_windows, SHARE_COLUMNS, formats=SHARE_FORMATS)
    return s


def ladder(pg: Page) -> Section:
    """Section 5: ms per step against T over requests, each T against the fewest tokens' step with its interval."""
    t, s = pg.t, Section()
    if t.ladder.empty:
        return s.text("no timed requests in this run")
    if int(t.ladder["base_tokens"].min()) == 1:
        s.text("T = 1 is a server that does not speculate: its step is a plain one-token decode, no draft and no verify")
    rows = [{**r, "against": cost.ladder_text(r_) if r["tokens_per_step"] != r["base_tokens"] else "base"}
            for r, r_ in zip(t.ladder.to_dict("records"), t.ladder.itertuples())]
    s.table(rows, {"context_tokens": "context (tokens)", "tokens_per_step": "tokens per step", "requests": "requests",
                   "step_ms": "ms per step (median)", "step_ms_min": "min", "step_ms_max": "max",
                   "against": "over the fewest tokens' step (interval over requests)"})
    s.text(ma.verify_kernel_share(pg.mr, t.share_context))
    return s


def balance(pg: Page) -> Section:
    """Section 6: expert parallelism's balance, distinct experts per rank beside tokens per rank."""
    if pg.t.bal.empty:
        return Section().text("no recorder counts in this run")
    return Section().table(pg.t.bal, {
        "tokens": "tokens per pass", "ranks": "EP ranks", "passes": "passes",
        "busiest_rank_experts": "busiest rank's distinct experts", "mean_rank_experts": "mean rank's distinct experts",
        "experts_max_over_mean": "distinct experts: max / mean (= bytes over TP's)", "experts_lo": "min over passes",
        "experts_hi": "max over passes", "tokens_max_over_mean": "tokens: max / mean", "tp_max_over_mean": "TP: max / mean"})


def best_and_projection(pg: Page) -> Section:
    """Section 7: the best T on the measured step times, then Kimi K2.6's projected bytes and floor (and its best T)."""
    t, s = pg.t, Section()
    if not t.best.empty and "context_tokens" in t.best:
        s.markdown("With the measured step times (medians over requests), per context:")
        s.table(t.best, cost.best_columns(t.best), formats=cost.best_formats(t.best))
        if not ma.enough_at(t.ladder, int(t.best["context_tokens"].min())):
            s.text(f"fewer than {MIN_REQUESTS} requests a cell: this table is not a verdict (the findings say so)")
    s.markdown(ma.projection_text(t, pg.params["projection_context"]))
    s.table(t.proj, {"tokens": "tokens per step", "distinct": "distinct experts per layer",
                     "routed_expert_bytes": "experts per GPU (B)", "other_weight_bytes": "other weights per GPU (B)",
                     "kv_bytes": "KV per GPU (B)", "floor_ms": "bytes floor (ms)", "expert_share": "expert share",
                     "experts_over_t1_x": "expert bytes over one token's (x)", "floor_over_first_x": "floor over T=1 (x)"},
            formats={"expert_share": "{:.0%}", "routed_expert_bytes": "{:.3g}", "other_weight_bytes": "{:.3g}",
                     "kv_bytes": "{:.3g}"})
    s.markdown("On the projected floor:")
    return s.table(t.best_floor, cost.best_columns(t.best_floor), formats=cost.best_formats(t.best_floor))


def findings(pg: Page) -> Section:
    """Section 9: the verdicts (``data["found"]``)."""
    found = pg.found
    s = Section(data={"found": found})
    if pg.recorded_from:
        s.markdown(f"These findings come from the recorded run `{pg.recorded_from}`, not from a measurement of this run.")
    return s.html(fnd.to_html(found))


def metrics(pg: Page) -> dict[str, Any]:
    return {**ma.metrics(pg.t), "source": pg.src, "projection_context": pg.params["projection_context"]}
