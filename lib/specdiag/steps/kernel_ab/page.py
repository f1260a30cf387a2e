"""Notebook 06's sections, one call each (:class:`specdiag.section.Section`: tables, figures, text): the notebook keeps
its parameters, these calls and its prose.

:func:`start` checks the parameters and opens the run (on CUDA a new one to measure into; without CUDA the recorded
H200 run, ``data/reference/kernel-ab-h200``, unless ``replay_dir`` names another); the :class:`Page`'s data are read
when a section first asks. Sections: :func:`measure` (CUDA: every
case and arm; without CUDA: the torch forms on a tiny grid), :func:`the_run` (its GPU, ceilings and rows),
:func:`targets`, :func:`case_times`, :func:`bandwidth`, :func:`page_size_fp8_fixed`, :func:`roofline`,
:func:`findings` and :func:`metrics`.
"""

from __future__ import annotations

import time
from functools import cached_property
from typing import Any, Mapping

import matplotlib.pyplot as plt
import pandas as pd
import torch

from specdiag import kernel_ab_table, nb, tables
from specdiag import findings as sfind
from specdiag.paths import REFERENCE_DIR, relative_to_project
from specdiag.runs import Run
from specdiag.section import Section
from specdiag.steps.kernel_ab import analysis, harness
from specdiag.steps.kernel_ab import plots as kplots
from specdiag.steps.kernel_ab.arms import ARMS

NOTEBOOK = "06_kernel_ab"
REFERENCE = "kernel-ab-h200"
DASH_MEANS = "the arm did not run that case (section 8 says why)"


class Page(nb.Page):
    """What 06's sections share: the cases and arms, the run analysed (measured here on CUDA, else the recorded H200
    run) and its rows, peaks and target table, each read when a section first asks."""

    notebook = NOTEBOOK

    def __init__(self, params: Mapping[str, Any]) -> None:
        """Check the parameters and parse cases and arms (before anything runs), then open the run: on CUDA a new one
        to measure into, without CUDA the recorded H200 run unless ``replay_dir`` names another."""
        super().__init__(params)
        p = self.params
        for name in ("n_runs", "focus_context", "focus_heads", "focus_draft_tokens"):
            nb.check(p[name] > 0, f"{name} must be a positive int; got {p[name]!r}")
        nb.check(p["max_minutes"] >= 0, f"max_minutes must be >= 0; got {p['max_minutes']!r}")
        try:
            self.case_list: list[tuple[int, int, int]] = (harness.parse_cases(p["cases"]) if p["cases"]
                                                          else list(harness.CANONICAL_CASES))
            self.arm_list: list[str] = harness.parse_arms(p["arms"]) if p["arms"] else list(ARMS)
        except ValueError as exc:
            raise nb.ParameterError(str(exc)) from None
        self.cuda = torch.cuda.is_available()
        self.ctx = ctx = nb.start(NOTEBOOK, server_url=p["server_url"], run_dir=p["run_dir"],
                                  replay_dir=p["replay_dir"], params=nb.run_params(p), needs_server=False,
                                  reference=None if self.cuda else REFERENCE_DIR / REFERENCE)  # no CUDA: the H200 run
        #: the recorded run shown (asked for with replay_dir, or the reference without CUDA): 06's result says it
        self.shown_from: str | None = None if ctx.live else relative_to_project(ctx.source.path)
        self.focus: tuple[int, int, int] = (p["focus_context"], p["focus_heads"], p["focus_draft_tokens"])
        self.intro.text(f"{'cuda':>13}: {self.cuda}")
        self.intro.text(f"measuring on {torch.cuda.get_device_name()}" if ctx.live else
                          f"replaying {self.shown_from}")

    @cached_property
    def rows(self) -> list[dict[str, Any]]:
        """The run's kernel_ab rows (measured here, or recorded)."""
        return self.ctx.source.rows(harness.TABLE)

    @cached_property
    def df(self) -> pd.DataFrame:
        """The measured cases x arms."""
        df = kernel_ab_table.measured(self.rows)
        nb.check(not df.empty, f"{self.ctx.source.path} has no measured kernel_ab rows: nothing to analyse (replay_dir "
                 "must be a kernel A/B run folder, e.g. data/reference/kernel-ab-h200)")
        return df

    @property
    def peaks(self) -> dict[str, Any]:
        return dict(self.ctx.source.meta.get("peaks") or {})

    @property
    def dev(self) -> dict[str, Any]:
        return dict(self.ctx.source.meta.get("device") or {})

    @property
    def src_note(self) -> str:
        return (f"measured on {self.dev.get('gpu')}, {str(self.dev.get('date_utc', ''))[:10]}"
                + (" (recorded run)" if self.shown_from else ""))

    @cached_property
    def tt(self) -> pd.DataFrame:
        """Per target, case and arm: the value against its limit."""
        return analysis.target_table(self.df)

    @cached_property
    def found(self) -> list[sfind.Finding]:
        return analysis.findings(self.df, self.peaks, self.dev)


def start(params: Mapping[str, Any]) -> Page:
    """Check the parameters and open the run (:class:`Page`)."""
    return Page(params)


def measure(pg: Page) -> Section:
    """Section 1. On CUDA: every case and arm into the run (progress printed as it goes; ``max_minutes`` starts no
    case after that long). Without CUDA (``cpu_smoke``): the torch forms of baseline and split_triton on a tiny grid,
    each checked against the fp32 reference."""
    ctx, s = pg.ctx, Section()
    if ctx.live:
        minutes = pg.params["max_minutes"]
        n = harness.measure(ctx.run, pg.case_list, pg.arm_list, "cuda", n_runs=pg.params["n_runs"],
                            deadline_s=(time.monotonic() + 60 * minutes) if minutes else None,
                            progress=print)
        s.text(f"{n} rows measured into {ctx.run.path}")
    elif pg.params["cpu_smoke"] and not pg.cuda:
        harness.measure(ctx.run, [(256, 2, 1), (300, 2, 3)], ["baseline", "split_triton"], "cpu", n_runs=2)
        smoke = kernel_ab_table.measured(ctx.run.rows(harness.TABLE))
        s.table(smoke, {"arm": "arm", "context_tokens": "context (tokens)", "heads": "heads",
                        "draft_tokens": "draft tokens", "rel_err": "rel. error vs fp32 (ratio)"})
        nb.check(len(smoke) == 4 and bool(smoke["correct"].all()), "a torch form disagrees with the fp32 reference")
    return s


def the_run(pg: Page) -> Section:
    """The run analysed (measured here, or recorded): its GPU, versions, ceilings and how much it measured."""
    meta, df = pg.ctx.source.meta, pg.df
    dev, copy_gbps, matmul_tflops = pg.dev, pg.peaks.get("copy_gbps"), pg.peaks.get("matmul_tflops")
    facts = {"GPU": dev.get("gpu"), "driver": dev.get("driver"), "CUDA": dev.get("cuda"), "torch": dev.get("torch"),
             "Triton": dev.get("triton"), "FlashInfer": dev.get("flashinfer") or "-", "date (UTC)": dev.get("date_utc"),
             "command": meta.get("command"), "device copy (2 GiB)": f"{copy_gbps:,.0f} GB/s (read + write, measured)",
             "bf16 matmul (8192³)": f"{matmul_tflops:,.0f} TFLOP/s (measured)",
             "cases x arms measured": f"{len(df)} ({df[kernel_ab_table.CASE].drop_duplicates().shape[0]} cases)",
             "not measured": f"{len(kernel_ab_table.not_measured(pg.rows))} (listed in section 8)"}
    return Section().table(pd.DataFrame({"": list(facts), "value": [str(v) for v in facts.values()]}))


def targets(pg: Page) -> Section:
    """Section 2: per target and arm the cases met and the worst value; then every check, case by case, folded."""
    tt = pg.tt
    s = Section().table(analysis.target_summary(tt).sort_values(["target", "arm"]),
                        {"target": "target", "arm": "arm", "met": "cases met", "cases": "cases judged",
                         "worst": "worst", "limit": "limit", "unit": "unit"},
                        formats={"worst": "{:.3f}", "limit": "{:g}"})
    detail = (tt.sort_values(["target", "heads", "draft_tokens", "context_tokens", "arm"])
              [["target", "case", "arm", "value", "limit", "unit", "met", "gap"]]
              .assign(met=lambda d: d["met"].map({True: "yes", False: "no"}),
                      gap=lambda d: d["gap"].map(
                          lambda g: "-" if g == 0 else f"{100 * g:.{1 if g < 0.01 else 0}f}% short")))
    return s.html(f"<details><summary>every target check, case by case ({len(detail)}; "
                  f"{int((detail['met'] == 'no').sum())} missed)</summary>"
                  + tables.table(detail, formats={"value": "{:.3f}", "limit": "{:g}"}).to_html() + "</details>")


def _case_table(s: Section, t: pd.DataFrame, fmt: str) -> None:
    s.table(t.reset_index(), formats={c: fmt for c in t.columns}, dash_means=DASH_MEANS)


def case_times(pg: Page) -> Section:
    """Section 3: µs per call (cases down, arms across), over the same-bytes copy, and the speedup over the
    baseline."""
    s = Section()
    _case_table(s, analysis.case_table(pg.df, "us"), "{:,.1f}")
    s.markdown("Time over the same-bytes copy (1.00 = as fast as copying what the call reads):")
    _case_table(s, analysis.case_table(pg.df, "over_copy"), "{:.2f}")
    su = analysis.speedups(pg.df)
    if not su.empty:
        s.markdown("Speedup over the baseline (x):")
        _case_table(s, su, "{:,.0f}")
    return s


def bandwidth(pg: Page) -> Section:
    """Section 4: effective GB/s against context per shape (8 x 1, 8 x 8 where measured), then every arm at the
    focus case over the same-bytes copy, with its target's limit."""
    df, copy_gbps, s = pg.df, pg.peaks.get("copy_gbps"), Section()
    shapes = [(h, t) for h, t in ((8, 1), (8, 8)) if not df[(df["heads"] == h) & (df["draft_tokens"] == t)].empty]
    fig, axes = plt.subplots(1, len(shapes), figsize=(6.5 * len(shapes), 4.6), sharey=True, squeeze=False)
    for ax, (h, t) in zip(axes[0], shapes):
        kplots.gbps_vs_context(ax, df, copy_gbps, h, t, source=pg.src_note)
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, fontsize=8, loc="upper center", bbox_to_anchor=(0.5, 0.0), ncol=2, frameon=False)
    fig.tight_layout()
    s.figure(fig)
    limit = next((x.limit for x in analysis.TARGETS if x.metric == "over_copy" and x.applies(*pg.focus)), None)
    fig, ax = plt.subplots(figsize=(9, 4.2))
    kplots.over_copy_bars(ax, df, *pg.focus, limit=limit, source=pg.src_note)
    fig.tight_layout()
    return s.figure(fig)


def page_size_fp8_fixed(pg: Page) -> Section:
    """Section 5: the page-size effect, the fp8-cache forms over their bf16 twins, and the fixed-cost fit."""
    s = Section()
    pse, f8, fit = analysis.page_size_effect(pg.df), analysis.fp8_table(pg.df), analysis.fixed_cost_fit(pg.df)
    if not pse.empty:
        _case_table(s, pse, "{:.2f}")
    if not f8.empty:
        s.table(f8, {"case": "case", "arm": "arm", "us": "fp8 (µs)", "bf16_us": "bf16 (µs)",
                     "fp8_over_bf16": "fp8 / bf16 (time)",
                     "rel_err_vs_bf16_ref": "rel. error vs the bf16 cache's reference"},
                formats={"rel_err_vs_bf16_ref": "{:.1e}"})
    if not fit.empty:
        s.table(fit, {"arm": "arm", "heads": "heads", "draft_tokens": "draft tokens", "contexts": "contexts",
                      "fixed_us": "fixed (µs)", "marginal_gbps": "marginal (GB/s)", "r2": "r²"})
    return s


def roofline(pg: Page) -> Section:
    """Section 6: every case on the roofline of the run's measured copy and matmul ceilings."""
    fig, ax = plt.subplots(figsize=(8, 5))
    kplots.roofline(ax, pg.df, pg.peaks.get("copy_gbps"), pg.peaks.get("matmul_tflops"), source=pg.src_note)
    return Section().figure(fig)


def findings(pg: Page) -> Section:
    """Section 8: the verdicts (``data["found"]``, as analysis.findings gives them) and the pairs not measured."""
    found = pg.found
    s = Section(data={"found": found})
    if pg.shown_from:
        s.markdown(f"These findings come from the recorded run `{pg.shown_from}`, not from a measurement of this "
                   "run.")
    s.html(sfind.to_html(sfind.sort_findings(found)))
    nm = kernel_ab_table.not_measured(pg.rows)
    if not nm.empty:
        s.html("<details><summary>" + f"{len(nm)} case x arm pairs not measured, and why" + "</summary>"
               + nm.rename(columns={"context_tokens": "context (tokens)", "draft_tokens": "draft tokens"})
               .to_html(index=False) + "</details>")
    return s


def metrics(pg: Page) -> dict[str, Any]:
    return analysis.metrics(pg.df, pg.tt, pg.peaks)


#: the recorded run whose prefill cases 06 shows when the run it reads has none (06's verify cases come from an H200 run
#: that predates them)
PREFILL_REFERENCE = "sglang-h100-mla61-prefill"


def prefill_cases(pg: Page) -> Section:
    """Section 7: one long prompt's chunk in the MHA form (specdiag.steps.kernel_ab.prefill), each arm's TFLOP/s and
    share of its run's measured matmul rate: the run's own rows, or where it has none and this page replays,
    ``PREFILL_REFERENCE``'s (the page says which run and GPU)."""
    source = pg.ctx.source
    rows = source.rows(analysis.PREFILL_TABLE)
    s = Section()
    if not rows and not pg.ctx.live and (REFERENCE_DIR / PREFILL_REFERENCE / "run.json").exists():
        source = Run.open(REFERENCE_DIR / PREFILL_REFERENCE)
        rows = source.rows(analysis.PREFILL_TABLE)
        gpu = (source.meta.get("prefill_cases") or {}).get("anchors", {}).get("device", {}).get("gpu", "a GPU")
        s.markdown(f"Replayed from the recorded run `data/reference/{PREFILL_REFERENCE}` (measured on {gpu}; the "
                   "verify cases above come from another run and GPU).")
    pt = analysis.prefill_table(rows)
    s.data["prefill"] = pt
    if pt.empty:
        return s.markdown("This run has no prefill cases (`python -m specdiag.steps.kernel_ab.prefill --out RUN` "
                          "measures them on a CUDA GPU).")
    verdict = analysis.prefill_verdict(pt)
    if verdict:
        s.markdown(verdict)
    peaks = source.meta.get("prefill_peaks") or {}
    s.table(pt, {"prefix_tokens": "prefix (tokens)", "chunk_tokens": "chunk (tokens)", "heads": "heads", "arm": "arm",
                 "ms_median": "ms (median)", "tflops": "TFLOP/s (measured)",
                 "pct_matmul": f"% of bf16 matmul ({peaks.get('matmul_tflops', float('nan')):,.0f} TFLOP/s, measured)",
                 "rel_err": "rel. error vs fp32", "lse_abs_err": "lse abs. error", "n_runs": "replays"},
            formats={"ms_median": "{:.3f}", "tflops": "{:,.0f}", "pct_matmul": "{:.0f}", "rel_err": "{:.1e}",
                     "lse_abs_err": "{:.1e}"})
    return s
