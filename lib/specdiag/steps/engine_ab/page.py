"""Notebook 09's sections, one call each (:class:`specdiag.section.Section`: tables, figures, text): the notebook keeps
its parameters, these calls and its prose.

:func:`start` checks the parameters and the arms file (before any server starts) and opens the run: measuring the
arms file's arms, else replaying ``replay_dir``, else the H200 reference run; the :class:`Page`'s data are computed when a
section first asks. Sections: :func:`measure_or_replay` (the rows and
their per-arm tables), :func:`arms` (each arm's settings and what the run lacks), :func:`decode`, :func:`prefill`
(TTFT against its floor), :func:`rank_tests`, :func:`bands`, :func:`targets`, :func:`break_even`, :func:`findings` and
:func:`metrics`.
"""

from __future__ import annotations

from functools import cached_property
from typing import Any, Mapping

import matplotlib.pyplot as plt
import pandas as pd

from specdiag import geometry, hardware, nb, tables
from specdiag import findings as sfind
from specdiag.paths import REFERENCE_DIR, relative_to_project
from specdiag.section import Section
from specdiag.steps.engine_ab import analysis, answer, breakeven, chunks, measure, verdicts
from specdiag.steps.engine_ab import arms as eab_arms
from specdiag.steps.engine_ab import plots as eplots
from specdiag.sweep.arms import ArmsError
from specdiag.sweep.driver import plan, sweep_into
from specdiag.sweep.settings import SettingsError

NOTEBOOK = "09_engine_ab"
REFERENCE = "sglang-h200-mla61-engine-ab"


class Page(nb.Page):
    """What 09's sections share: the arms (measured when first asked, or the recorded run's), their decode and prefill
    tables, the floors, bands, targets and break-even, and the findings, each computed when a section first asks."""

    notebook = NOTEBOOK

    def __init__(self, params: Mapping[str, Any]) -> None:
        """Check the parameters and the arms file (its arms, ``only``, the engine_ab settings with ``context_lengths``,
        ``repeats`` and ``max_new_tokens`` on top, every server's command), then open the run (``nb.start``): measure
        the arms, else replay ``replay_dir``, else the reference run (``ctx.recorded_from``). ``server_url`` is not
        used: an A/B needs two or more arms (a running server is an arm with a ``url`` in the arms file)."""
        super().__init__(params)
        p = self.params
        for name in ("repeats", "max_new_tokens"):
            nb.check(p[name] > 0, f"{name} must be a positive int; got {p[name]!r}")
        nb.check(all(e > 0 for e in p["band_edges"]),
                 f"band_edges must be a list of positive token counts, e.g. [8192, 65536]; got {p['band_edges']!r}")
        for name in ("memory_bandwidth_gb_s", "matmul_tflops", "floor_ratio_threshold"):
            nb.check(p[name] >= 0, f"{name} must be a number >= 0; got {p[name]!r}")
        arms, only = p["arms"], p["only"]
        nb.check(not (p["replay_dir"] and arms), "replay_dir analyses a recorded run, arms measures: pass one of them")
        nb.check(not only or bool(arms), "only picks arms of an arms file: pass arms too")
        self.planned: Any = None  # the sweep to run (specdiag.sweep.driver.Plan), None when replaying
        if arms:
            contexts = nb.check_context_lengths("context_lengths", p["context_lengths"])
            try:
                self.planned = plan(arms, "engine_ab", only, {"contexts": contexts, "repeats": p["repeats"],
                                                              "max_new_tokens": p["max_new_tokens"]})
            except (ArmsError, SettingsError, ValueError) as exc:
                raise nb.ParameterError(str(exc)) from None
        self.ctx = ctx = nb.start(NOTEBOOK, server_url="", run_dir=p["run_dir"], replay_dir=p["replay_dir"],
                                  params=nb.run_params(p), needs_server=False,
                                  reference=None if self.planned else REFERENCE_DIR / REFERENCE)
        self.intro.text(
            f"measuring {len(self.planned.arms.arms)} arms of {arms} into {ctx.run.path}" if ctx.live else
            f"replaying {relative_to_project(ctx.source.path)}"
            + (" (no arms given: the H200 reference run)" if ctx.recorded_from else ""))

    @cached_property
    def measured_arms(self) -> str:
        """Live, the sweep's driver in this process (each arm's server started, measured and stopped before the next;
        a running server measured as it runs) into the run, and the line saying which arms were measured and which
        failed; '' replaying."""
        if not self.live:
            return ""
        ctx = self.ctx
        sweep_into(ctx.run, self.planned)
        records = ctx.run.meta.get("arms") or {}
        names = [a.name for a in self.planned.arms.arms]
        done = [n for n in names if not (records.get(n) or {}).get("failed")]
        return (f"{len(done)} arms measured: {', '.join(done)}"
                + "".join(f"; {n} FAILED: {records[n]['failed']}" for n in names if n not in done))

    @cached_property
    def rows(self) -> list[dict[str, Any]]:
        """The run's ``engine_ab`` rows (live: after the arms are measured)."""
        _ = self.measured_arms
        rows = self.ctx.source.rows(measure.TABLE)
        nb.check(bool(rows), f"{self.ctx.source.path} has no engine_ab rows (engine_ab.jsonl): replay_dir must be an "
                 "engine A/B run folder, e.g. data/reference/sglang-h200-mla61-engine-ab")
        return rows

    @cached_property
    def arms_meta(self) -> dict[str, Any]:
        """Each arm's record (settings, command, server info), from run.json."""
        _ = self.measured_arms
        return dict(self.ctx.source.meta.get("arms") or {})

    @cached_property
    def df(self) -> pd.DataFrame:
        """The rows on novel prose, one per request (other text kinds feed the break-even only)."""
        return analysis.frame(measure.main_rows(self.rows))

    @cached_property
    def arm_names(self) -> list[str]:
        return analysis.arm_order(self.df, self.arms_meta)

    @cached_property
    def dec(self) -> pd.DataFrame:
        """Per arm and context: the decode requests' medians."""
        return analysis.decode_table(self.df)

    @cached_property
    def pre(self) -> pd.DataFrame:
        """Per arm and context: the prefill requests' TTFTs."""
        return analysis.prefill_table(self.df)

    @cached_property
    def styles(self) -> dict[str, Any]:
        return eplots.arm_style(self.arm_names)

    @property
    def src_note(self) -> str:
        return "measured here" if self.live else f"recorded run {relative_to_project(self.ctx.source.path)}"

    @cached_property
    def gaps(self) -> list[str]:
        """What the run does not hold (from its rows)."""
        return analysis.lacks(self.df, self.arm_names)

    @cached_property
    def _floors(self) -> tuple[Any, Any, str]:
        """The model's geometry, the run's peaks and why there is no floor ('' when there is one)."""
        p = self.params
        first_server = self.first_server
        first_url = next((a.url for a in self.planned.arms.arms if a.running), "") if self.planned else ""
        try:
            geom = geometry.geometry_for_run("", "", self.ctx.source.meta, first_server)
            peaks = verdicts.run_peaks(self.ctx.run, self.ctx.source.meta, self.live, first_server,
                                       first_url or "http://127.0.0.1", p["gpu_name"], p["memory_bandwidth_gb_s"],
                                       p["matmul_tflops"])
        except ValueError as exc:
            return None, None, f"no prefill floor: {exc}"
        return geom, peaks, ""

    @property
    def first_server(self) -> dict[str, Any]:
        return next((dict(a["server"]) for a in self.arms_meta.values() if a.get("server")), {})

    @property
    def geom(self) -> Any:
        return self._floors[0]

    @property
    def peaks(self) -> Any:
        return self._floors[1]

    @property
    def tp(self) -> int:
        return int(self.first_server.get("tp_size") or 1)

    @cached_property
    def _prefill_floors(self) -> tuple[pd.DataFrame, dict[str, Any]]:
        """Each TTFT against its prefill floor at the run's peaks, and each arm's own floors."""
        if self.pre.empty or self.peaks is None:
            return pd.DataFrame(), {}
        return verdicts.prefill_floors(self.pre, self.geom, self.peaks, self.arms_meta, self.tp)

    @property
    def floors(self) -> pd.DataFrame:
        return self._prefill_floors[0]

    @property
    def own_floors(self) -> dict[str, Any]:
        """Each serving arm's prefill floors (a check arm's TTFT is its check's, CUDA graphs off: not the collapse)."""
        return {a: f for a, f in self._prefill_floors[1].items()
                if not eab_arms.checks_verify(self.arms_meta.get(a) or {})}

    @cached_property
    def rank_tests(self) -> pd.DataFrame:
        """Per context, the fastest verify arm's step times against each other verify arm's."""
        dec = self.dec
        return analysis.rank_tests(dec[dec["arm"].isin(eab_arms.verify_arms(self.arms_meta, self.arm_names))]
                                   if not dec.empty else dec)

    @cached_property
    def bands(self) -> pd.DataFrame:
        """The fastest arm per band of contexts, the runner-up and what the fastest costs."""
        return analysis.band_verdicts(self.dec, self.pre, self.arms_meta, self.params["band_edges"])

    @cached_property
    def spec_arms(self) -> list[str]:
        """The speculating arms (a speculation-off arm has no verify step to judge)."""
        return eab_arms.verify_arms(self.arms_meta, self.arm_names)

    @cached_property
    def scorecard(self) -> pd.DataFrame:
        """Each serving arm (check arms time their check) against every target."""
        serving = [a for a in self.spec_arms if not eab_arms.checks_verify(self.arms_meta.get(a) or {})]
        return analysis.scorecard(self.dec, self.pre, serving, self.params["stock_arm"])

    @cached_property
    def anchor_card(self) -> pd.DataFrame:
        """Each serving arm against FlashInfer's own server: first token and verify step (empty without one)."""
        serving = [a for a in self.spec_arms if not eab_arms.checks_verify(self.arms_meta.get(a) or {})]
        return analysis.anchor_card(self.dec, self.pre, serving)

    @cached_property
    def tt(self) -> pd.DataFrame:
        """The targets, each met, missed or not measurable with why, judged once (on the scorecard)."""
        p, spec = self.params, self.spec_arms

        def keep(df: pd.DataFrame) -> pd.DataFrame:
            return df[df["arm"].isin(spec)] if not df.empty else df

        return analysis.targets(keep(self.dec), keep(self.pre), spec, self.geom.num_layers if self.geom else None,
                                p["stock_arm"], p["plugin_arm"], self.arms_meta, self.scorecard)

    @cached_property
    def brk(self) -> Any:
        """Each speculating arm against its speculation-off twin, in tokens/s per context."""
        meta = self.ctx.source.meta
        return breakeven.analyse(self.rows, self.arms_meta, self.arm_names, self.ctx.source.rows("commit_probe"),
                                 dict(meta.get("server") or {}))

    @cached_property
    def brk_finding(self) -> sfind.Finding:
        brk = self.brk
        return verdicts.break_even_finding(brk.pairs, brk.off_arms, brk.evens, brk.best_drafts, brk.computed_note,
                                           brk.recall)

    @cached_property
    def answer(self) -> sfind.Finding | None:
        """09's one answer: which arm to run, the first token weighed against decode by output length
        (:mod:`.answer`)."""
        return answer.answer_finding(answer.answers(self.df, self.dec, self.pre, self.arms_meta, self.brk.recall))

    @cached_property
    def forced(self) -> dict[str, float]:
        """{arm: the acceptance length SGLANG_SIMULATE_ACC_LEN forced on its server}: its commits, tokens/s and token
        counts are the simulation's, its step times the engine's."""
        return {a: x for a in self.arm_names if (x := eab_arms.forced_acceptance(self.arms_meta.get(a) or {}))}

    @property
    def forced_note(self) -> str:
        """'acceptance forced to 4 (SGLANG_SIMULATE_ACC_LEN) on a, b' ('' when no arm's was)."""
        if not self.forced:
            return ""
        by_value: dict[float, list[str]] = {}
        for arm, x in self.forced.items():
            by_value.setdefault(x, []).append(arm)
        return "; ".join(f"acceptance forced to {x:g} ({eab_arms.SIMULATED_ACCEPTANCE_ENV}) on {', '.join(arms)}"
                         for x, arms in by_value.items())

    @property
    def forced_short(self) -> str:
        """'acceptance forced to 4 (SGLANG_SIMULATE_ACC_LEN)' for a figure's title ('' when no arm's was)."""
        values = ", ".join(f"{x:g}" for x in sorted(set(self.forced.values())))
        return f"acceptance forced to {values} ({eab_arms.SIMULATED_ACCEPTANCE_ENV})" if values else ""

    @cached_property
    def found(self) -> list[sfind.Finding]:
        """The verdicts, most severe first."""
        p = self.params
        return sfind.sort_findings(verdicts.findings(self.dec, self.pre, self.own_floors, self.bands, self.tt,
                                                     self.gaps, self.arms_meta, p["stock_arm"], p["plugin_arm"],
                                                     p["floor_ratio_threshold"], self.answer, self.scorecard)
                                   + [self.brk_finding]
                                   + [f for f in (verdicts.anchor_finding(self.anchor_card),) if f is not None])


def start(params: Mapping[str, Any]) -> Page:
    """Check the parameters, parse the arms and open the run (:class:`Page`)."""
    return Page(params)


def _by_id(pg: Page) -> dict[str, sfind.Finding]:
    return {f.id: f for f in pg.found}


def lead_lines(pg: Page) -> list[tuple[str, str]]:
    """The page's answer in a few lines, from its findings: the symptom, what to run (the one answer, :mod:`.answer`,
    as it says it), what it buys, whether speculation pays, and how sure."""
    by = _by_id(pg)
    lines: list[tuple[str, str]] = []
    said = str((pg.answer.numbers or {}).get("answer") or "") if pg.answer is not None else ""
    if said:
        lines.append(("Run", said))
    elif (verdict := by.get("engine_ab.verdict")) is not None:
        lines.append(("Run", f"not answered (no context has two arms with both an own first token and decode); "
                             f"{verdict.title}"))
    fixes = [f for i in ("engine_ab.decode_fix", "engine_ab.prefill_fix") if (f := by.get(i)) is not None]
    anchor = by.get("engine_ab.anchor_targets")
    if anchor is not None and (anchor.numbers or {}).get("all_met_arms"):
        fixes.append(anchor)  # held against FlashInfer at both phases, on intervals
    if fixes:
        lines.append(("Buys", "; ".join(f.title for f in fixes)))
    symptoms = [f for i in ("engine_ab.stock_decode", "engine_ab.prefill_floor") if (f := by.get(i)) is not None]
    if symptoms:
        lines.insert(0, ("Symptom", "; ".join(
            f"{f.title} ({f.numbers['arm']})" if (f.numbers or {}).get("arm") else f.title for f in symptoms)))
    brk = pg.brk_finding
    if brk is not None and (brk.numbers or {}).get("lines"):
        lines.append(("Speculation", brk.title.removeprefix("Where speculation stops paying: ")))
    if not lines:
        lines.append(("Run", "not measured: the run holds no two arms to compare (section 2 says what it lacks)"))
    lines.append(("How sure", how_sure(pg)))
    return lines


def how_sure(pg: Page) -> str:
    """What the answer rests on: requests per cell, where the first tokens are single requests, forced acceptance."""
    parts = []
    if not pg.dec.empty:
        lo, hi = int(pg.dec["n"].min()), int(pg.dec["n"].max())
        parts.append(f"decode over {lo}-{hi} requests a cell" if lo != hi else f"decode over {lo} requests a cell")
    own = pg.pre[pg.pre["own"]] if not pg.pre.empty and "own" in pg.pre else pg.pre
    if not own.empty:
        lo, hi = int(own["n"].min()), int(own["n"].max())
        parts.append(f"each first token (TTFT) from {lo} request{'s' if lo > 1 else ''}" if lo == hi else
                     f"first tokens (TTFT) from {lo}-{hi} requests")
    parts.append("ties and intervals in sections 5-8")
    if pg.forced_note:
        parts.append(pg.forced_note + ": tokens/s and token counts are the simulation's, step times the engine's")
    if pg.ctx.recorded_from:
        parts.append("the recorded reference run, not a measurement of this run")
    return "; ".join(parts)


def lead(pg: Page) -> Section:
    """The answer first: which arm to run and why (:func:`lead_lines`)."""
    return Section().lead(lead_lines(pg), title="Which configuration to run")


def measure_or_replay(pg: Page) -> Section:
    """Section 1: live, the sweep's driver in this process (each arm's server started, measured and stopped before
    the next; a running server measured as it runs); then what the run holds."""
    s = Section()
    if pg.live:
        s.text(pg.measured_arms)
    _ = pg.rows  # a run without engine_ab rows stops here, naming why
    return s


def arms(pg: Page) -> Section:
    """Section 2: each arm's settings and command, the rows per arm and phase, and what the run does not hold."""
    df, s = pg.df, Section()
    s.table(pd.DataFrame(eab_arms.settings_rows(pg.arms_meta, pg.arm_names)).astype(object),
            dash_means="not reported by the server or not recorded",
            note=eab_arms.FORCED_MEANS + "." if pg.forced else "")
    unknown = ["(started elsewhere: see its server info in run.json)"]
    commands = "".join(f"<li><b>{a}</b>: <code>{' '.join((pg.arms_meta.get(a) or {}).get('command') or unknown)}"
                       "</code></li>" for a in pg.arm_names)
    s.html(f"<details><summary>each arm's command (server flags, recorded)</summary><ul>{commands}</ul></details>")
    counts = (df.assign(failed=df["error"].notna()).groupby(["arm", "phase"], sort=False)
              .agg(rows=("phase", "size"), failed=("failed", "sum")).reset_index())
    s.table(counts, {"arm": "arm", "phase": "phase", "rows": "requests (measured)", "failed": "failed (measured)"})
    return s.markdown("**What this run does not hold** (from its rows):\n\n" + "\n".join(f"- {g}" for g in pg.gaps)
                      if pg.gaps else "Every arm has decode rows and its own TTFTs; no request failed.")


def decode(pg: Page) -> Section:
    """Section 3: ms per verify step per arm and context (table, per-request details) and the two decode plots."""
    dec, s = pg.dec, Section()
    if dec.empty:
        return s.markdown("**No decode rows in this run**: no ms per step, no decode tokens/s (section 2 says why).")
    s.markdown("Ms per verify step, median (measured), contexts down, arms across:")
    s.table(analysis.step_grid(dec, pg.arm_names), dash_means="the arm did not decode at that context")
    unclean = dec[~dec["clean"]]
    if not unclean.empty:
        s.markdown("Not a clean decode (another arm's request in flight): " + "; ".join(
            f"{a} at {', '.join(analysis.tok(c) for c in g['context_tokens'])}"
            for a, g in unclean.groupby("arm", sort=False)) + ".")
    s.html("<details><summary>per arm and context: requests, tokens/s, commit lengths, cached tokens</summary>"
           + tables.table(dec, {"arm": "arm", "context_tokens": "context (tokens)", "n": "requests",
                                "step_ms": "ms per step (median, measured)",
                                "decode_tok_s": "decode tok/s (median, computed"
                                                + (", acceptance forced)" if pg.forced else ")"),
                                "decode_tok_s_first": "decode tok/s, first request (computed)",
                                "commit_first": "commit, first request (tokens/step, computed)",
                                "commit_later": "commit, later requests (median, computed)",
                                "cached_tokens": "cached tokens (median, server-reported)",
                                "clean": "alone on the GPU (computed)"}).to_html() + "</details>")
    fig, axes = plt.subplots(1, 2, figsize=(12.5, 4.4))
    eplots.step_ms_vs_context(axes[0], dec, pg.styles,
                              source=f"measured (hollow: overlapped by another arm), {pg.src_note}")
    eplots.decode_tok_s_vs_context(axes[1], dec, pg.styles, source=f"computed, {pg.src_note}")
    if pg.forced:
        axes[1].set_title(f"{axes[1].get_title()}\n({pg.forced_short})", fontsize=10)
    fig.tight_layout()
    return s.figure(fig)


def prefill(pg: Page) -> Section:
    """Section 4: each TTFT against its prefill floor at the run's peaks (grid, per-request details, plot)."""
    s, peaks = Section(), pg.peaks
    if pg.pre.empty:
        return s.markdown("**No prefill rows in this run.**")
    if peaks is None:
        return s.markdown(f"**{pg._floors[2]}**")
    tp = pg.tp
    s.text(f"model: {pg.geom.name} ({pg.geom.source}); {pg.geom.num_layers} layers, TP {tp}; peaks: "
           f"{peaks.device_name}, {peaks.matmul_tflops or 0:,.4g} TFLOPS bf16 "
           f"({peaks.matmul.label if peaks.matmul else 'none'}), {hardware.gb_s(peaks.memory_bandwidth_gb_s)} "
           f"({peaks.memory_bandwidth.label})")
    s.markdown("TTFT (measured) and how many times its floor (computed), contexts down, arms across:")
    s.table(analysis.ttft_grid(pg.floors, pg.arm_names), formats={"floor (s, computed)": "{:.3g}"},
            dash_means="no TTFT of the arm at that context",
            note="*: not the arm's own TTFT (measured beside other arms: see the list in section 2), shown, not judged.")
    s.html("<details><summary>per arm and context: chunks, s per chunk, the floor's bound, why not own</summary>"
           + tables.table(analysis.floor_verdicts(pg.floors), {
               "arm": "arm", "context_tokens": "context (tokens)", "ttft_s": "TTFT (s, measured)",
               "prefill_tok_s": "prompt tok/s (computed)", "chunk_tokens": "chunk (tokens, server-reported)",
               "n_chunks": "chunks", "s_per_chunk": "s per chunk (computed)", "floor_s": "floor (s, computed)",
               "bound": "floor bound", "verdict": "TTFT / floor (computed)", "why_not_own": "not its own because"},
               dash_means="not applicable").to_html() + "</details>")

    s.html("<details><summary>per arm and context: the floor of the attention form that ran (each chunk's floor in "
           "the form SGLang ran it in, summed; computed), the MHA form's beside it, and the TTFT over it</summary>"
           + tables.table(chunks.form_floors(pg.pre, pg.arms_meta, pg.geom, peaks, tp), {
               "arm": "arm", "context_tokens": "context (tokens)", "form": "chunks with a prefix", "why": "why",
               "floor_form_s": "floor, that form (s)", "floor_mha_s": "floor, MHA form (s)",
               "ttft_s": "TTFT (s, measured)", "ttft_over_form_floor_x": "TTFT / that floor (x)"},
               formats={"floor_form_s": "{:.3g}", "floor_mha_s": "{:.3g}", "ttft_over_form_floor_x": "{:,.3g}"}
               ).to_html() + "</details>")
    per_chunk = chunks.chunk_table(pg.rows, pg.arms_meta, pg.geom, peaks, tp)
    s.text("Each chunk's time against its floor: " + chunks.chunk_note(pg.rows))
    if not per_chunk.empty:
        s.table(per_chunk, {"arm": "arm", "context_tokens": "context (tokens)", "repeat": "prefill", "chunk": "chunk",
                            "prefix_tokens": "prefix (tokens)", "form": "form", "floor_s": "floor (s, computed)",
                            "other_form_floor_s": "the other form's floor (s)", "time_lo_s": "time from (s, server)",
                            "time_hi_s": "to (s)", "over_floor_lo_x": "time / floor from (x)",
                            "over_floor_hi_x": "to (x)"}, dash_means="no upper bound (the last bucket)")
    fig, ax = plt.subplots(figsize=(9, 4.6))
    eplots.ttft_vs_context(ax, pg.floors, pg.styles,
                           source=f"measured TTFT (hollow: not the arm's own), computed floor; {pg.src_note}")
    fig.tight_layout()
    return s.figure(fig)


def rank_tests(pg: Page) -> Section:
    """Section 5: per context, the fastest arm's step times against each other verify arm's."""
    rt = pg.rank_tests
    if rt.empty:
        return Section().markdown("No context has decode rows of two arms: nothing to rank.")
    return Section().table(rt, {"context_tokens": "context (tokens)", "fastest": "fastest arm", "other": "other arm",
                                "fastest_ms": "fastest (ms/step, measured)", "other_ms": "other (ms/step, measured)",
                                "ratio_x": "other / fastest (x, computed)", "p_slower": "p (other slower, computed)",
                                "verdict": "verdict"}, formats={"p_slower": "{:.3g}"})


def bands(pg: Page) -> Section:
    """Section 6: the fastest arm per band of contexts, the runner-up and what the fastest costs."""
    return Section().table(pg.bands, {
        "band": "band", "contexts": "contexts compared", "fastest": "fastest arm",
        "fastest_ms": "its ms/step (geometric mean, computed)", "runner_up": "runner-up",
        "by_x": "runner-up / fastest (x, computed)", "ttft_s": "its TTFT (s, measured)",
        "ttft_vs_best_x": "its TTFT / the shortest (x, computed)",
        "kv_pool_tokens": "its KV pool (tokens, server-reported)",
        "mem_fraction_static": "its memory fraction (server-reported)", "verdict": "verdict"},
        dash_means="not comparable in this band")


def targets(pg: Page) -> Section:
    """Section 7: the issue's targets, each met, missed or not measurable with why."""
    p = pg.params
    s = Section().table(pg.tt, {"target": "target", "status": "status", "arm": "arm judged",
                                "value": "value (computed)", "lo": "interval from", "hi": "to",
                                "limit": "limit (the target)", "unit": "unit", "rule": "servers",
                                "why": "why not measurable, or what it leaves out"},
                        formats={"value": "{:,.3g}", "lo": "{:,.3g}", "hi": "{:,.3g}", "limit": "{:g}"},
                        dash_means="not measured")
    card = pg.scorecard
    if card.empty:
        return s

    def span(lo: Any, hi: Any) -> str | None:
        return f"{lo:,.3g}-{hi:,.3g}" if pd.notna(lo) and pd.notna(hi) else None

    shown = pd.DataFrame({
        "arm": card["arm"],
        "speedup": card["speedup_128k_x"], "speedup_ci": [span(a, b) for a, b in zip(card["speedup_lo"], card["speedup_hi"])],
        "speedup_status": card["speedup_status"],
        "keep": card["keep_128k"], "keep_ci": [span(a, b) for a, b in zip(card["keep_lo"], card["keep_hi"])],
        "keep_status": card["keep_status"], "ttft": card["ttft_64k_x"],
        "ttft_ci": [span(a, b) for a, b in zip(card["ttft_lo"], card["ttft_hi"])], "ttft_status": card["ttft_status"]})
    winners = list(card.loc[card["all_met"], "arm"])
    s.text("Each arm against every target (ratios of medians over requests, each with its distribution-free interval "
           "at the level the requests allow, widened by the spread between servers where they came from several "
           "machines; met only where that clears the target, and only a target met on an interval counts): "
           + (f"{', '.join(winners)} meets all three." if winners else "no single arm meets all three targets."))
    s.table(shown, {"arm": "arm", "speedup": f"x {p['stock_arm']}'s step at 128k", "speedup_ci": "its interval",
                    "speedup_status": "100x?", "keep": "1k step / 128k step", "keep_ci": "interval (1k / 128k)",
                    "keep_status": "0.60?", "ttft": f"{p['stock_arm']}'s TTFT / its own at 64k",
                    "ttft_ci": "interval (TTFT)", "ttft_status": "10x?"},
            formats={"speedup": "{:,.3g}", "keep": "{:.3g}", "ttft": "{:,.3g}"}, dash_means="not measured")
    return _anchor_table(s, pg.anchor_card)


def _anchor_table(s: Section, card: pd.DataFrame) -> Section:
    """Against FlashInfer (where the run has it): fast at both the first token and the verify step."""
    if card.empty:
        return s
    t1, t2, t3 = analysis.ANCHOR_TARGETS

    def span(lo: Any, hi: Any) -> str | None:
        return f"{lo:,.3g}-{hi:,.3g}" if pd.notna(lo) and pd.notna(hi) else None

    shown = pd.DataFrame({"arm": card["arm"], **{k: v for t in (t1, t2, t3) for k, v in (
        (t.id, card[t.id]), (f"{t.id}_ci", [span(a, b) for a, b in zip(card[f"{t.id}_lo"], card[f"{t.id}_hi"])]),
        (f"{t.id}_status", card[f"{t.id}_status"]))}})
    winners = list(card.loc[card["all_met"], "arm"])
    s.text(f"Against {analysis.ANCHOR}'s own server (ratios to its medians over prefills and requests, judged as above; "
           "at most the limit): " + (f"{', '.join(winners)} meets all three." if winners else
                                     "no arm meets all three."))
    return s.table(shown, {"arm": "arm", t1.id: "TTFT 64k / FlashInfer's (x)", f"{t1.id}_ci": "interval (64k)",
                           f"{t1.id}_status": "at most 1.1x at 64k?", t2.id: "TTFT 128k / FlashInfer's (x)",
                           f"{t2.id}_ci": "interval (128k)", f"{t2.id}_status": "at most 1.1x at 128k?",
                           t3.id: "step 128k / FlashInfer's (x)", f"{t3.id}_ci": "interval (step)",
                           f"{t3.id}_status": "at most 0.85x?"},
                   formats={t.id: "{:.3g}" for t in (t1, t2, t3)}, dash_means="not measured")


def break_even(pg: Page) -> Section:
    """Section 8: each speculating arm against its speculation-off twin, in tokens/s per context (table, plot) and
    where the two cross (the break-even finding)."""
    brk, s = pg.brk, Section()
    if brk.cells:
        s.table(pd.DataFrame(brk.table()), {
            "arm": "speculating arm", "off_arm": "off arm", "kind": "text", "source": "source",
            "context_tokens": "context (tokens)", "requests": "requests (on / off)",
            "on_tok_s": "on (tokens/s, median" + (", acceptance forced)" if pg.forced else ")"),
            "off_tok_s": "off (tokens/s, median, measured)",
            "ratio_x": "on / off (x, computed)", "interval_x": "interval (x, over requests)",
            "level": "its level", "verdict": "verdict", "rule": "servers"},
            dash_means="not enough requests for an interval")
        fig, ax = plt.subplots(figsize=(9, 4.6))
        eplots.tok_s_on_off(ax, brk.cells, brk.evens, pg.styles, source=f"measured, {pg.src_note}")
        if pg.forced:
            ax.set_title(f"{ax.get_title()}\n({pg.forced_short})", fontsize=10)
        fig.tight_layout()
        s.figure(fig)
    return s.html(sfind.to_html([pg.brk_finding], collapse_over=8))


def findings(pg: Page) -> Section:
    """Section 9: the verdicts (``data["found"]``), said to come from the reference run when nothing was asked for."""
    s = Section(data={"found": pg.found})
    if pg.ctx.recorded_from:
        s.markdown(f"These findings come from the recorded run `{pg.ctx.recorded_from}`, not from a measurement of "
                   "this run.")
    return s.html(sfind.to_html(pg.found))


def metrics(pg: Page) -> dict[str, Any]:
    """09's key numbers (its one answer first), the lines the page opens with (``lead``: 07 and the index read them)
    and the acceptance each arm was forced to (``forced_acceptance``, {} when the drafters' own)."""
    return {**verdicts.metrics(pg.dec, pg.pre, pg.floors, pg.bands, pg.tt, pg.gaps, pg.arm_names,
                               pg.brk_finding.numbers, pg.answer, pg.scorecard),
            "lead": [list(x) for x in lead_lines(pg)], "forced_acceptance": dict(pg.forced)}
