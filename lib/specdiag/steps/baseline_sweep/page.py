"""Notebook 01's sections, one call each (:class:`specdiag.section.Section`: tables, figures, text): the notebook keeps
its parameters, these calls and its prose.

:func:`start` checks the sweep plan and opens the run (live: the plan checked again against the server's
context_length before any request); the :class:`Page`'s rows, summary, fit and findings are computed when a section
first asks. Sections: :func:`measure_or_replay`, :func:`every_request`, :func:`per_context`,
:func:`decode_speed`, :func:`step_time`, :func:`findings`, and :func:`write_result` (which raises when every request
failed, after writing the findings).
"""

from __future__ import annotations

from functools import cached_property
from typing import Any, Mapping

from specdiag import findings as fnd
from specdiag import nb
from specdiag.measure.fresh_prompt import cache_line
from specdiag.measure.loop import measure_missing
from specdiag.measure.sweep_plan import SweepPlan, make_plan, measure_request
from specdiag.measure.sweep_table import SWEEP_KEY, latest_rows, summarize_sweep
from specdiag.runs import rows_source
from specdiag.section import Section
from specdiag.stats import fit_line
from specdiag.steps.baseline_sweep import plots as bsp
from specdiag.steps.baseline_sweep.summary import sweep_findings

NOTEBOOK = "01_baseline_sweep"

COLUMNS = {
    "context_tokens": "context (tokens)", "repeat": "repeat", "prompt_tokens": "prompt tokens (server)",
    "cached_tokens": "cached tokens (server)", "ttft_s": "TTFT (s)", "prefill_tok_s": "prefill (tok/s)",
    "decode_tok_s": "decode (tok/s)", "step_ms": "ms per step", "verify_steps": "verify steps (server)",
    "commit_length": "commit length (tok/step)", "completion_tokens": "new tokens (server)",
    "e2e_s": "end-to-end (s)", "other_traffic": "other traffic (/metrics)", "error": "error",
}
SUMMARY_COLUMNS = {
    "context_tokens": "context (tokens)", "requests": "requests", "failed": "failed", "ttft_s": "TTFT (s)",
    "prefill_tok_s": "prefill (tok/s)", "decode_tok_s": "decode (tok/s)", "step_ms": "ms per step",
    "commit_length": "commit length (tok/step)", "e2e_s": "end-to-end (s)",
}


class Page(nb.Page):
    """What 01's sections share: the sweep plan, the rows (measured when first asked, or the recorded run's), their
    summary, the step-time fit and the findings."""

    notebook = NOTEBOOK

    def __init__(self, params: Mapping[str, Any]) -> None:
        """Check the sweep plan (before anything starts), open the run (``nb.start``), and live check the plan
        again against the server's context_length."""
        super().__init__(params)
        p = self.params
        self.plan: SweepPlan = make_plan(*self._plan_args())
        self.ctx = nb.start(NOTEBOOK, server_url=p["server_url"], speculative_config=p["speculative_config"],
                            run_dir=p["run_dir"], replay_dir=p["replay_dir"], params=nb.run_params(p))
        if self.live:
            server_info = self.ctx.server_info
            self.plan = make_plan(*self._plan_args(), server_context_length=server_info.get("context_length"))
            self.intro.text(f"server {self.ctx.server_url}: context_length {server_info.get('context_length')} "
                              f"tokens, {self.ctx.settings.speculation_line()}")
        self.intro.text(f"run folder: {self.ctx.run.path}")

    def _plan_args(self) -> tuple[Any, ...]:
        p = self.params
        return (p["context_lengths"], p["max_new_tokens"], p["repeats"], p["prompt_kind"], p["seed"], p["flush_cache"],
                p["instruction"])

    @cached_property
    def source(self) -> str:
        return rows_source(self.ctx.source.meta) if self.replaying else "measured"

    @cached_property
    def rows(self) -> list[dict[str, Any]]:
        """Live, the requests still missing from the run measured first (each row written as measured; a re-run
        resumes); replaying, the recorded rows."""
        ctx = self.ctx
        if self.replaying:
            rows = latest_rows(ctx.source.rows("sweep"))
            nb.check(len(rows) > 0,
                     f"{ctx.source.path} has no sweep rows (sweep.jsonl) to replay: pick a run that has them")
            return rows
        measure_missing(ctx.run, self.plan, "sweep", SWEEP_KEY, lambda q: measure_request(ctx.client, q, self.plan),
                        desc="sweep")
        return latest_rows(ctx.run.rows("sweep"), self.plan.requests())

    @property
    def ok_rows(self) -> list[dict[str, Any]]:
        return [r for r in self.rows if not r.get("error")]

    @cached_property
    def summary(self) -> list[dict[str, Any]]:
        """The median over the repeats that succeeded, per context."""
        return summarize_sweep(self.rows)

    @cached_property
    def steps(self) -> list[tuple[int, float]]:
        """(context, median ms per step) where a step time was measured."""
        return [(s["context_tokens"], s["step_ms"]) for s in self.summary if s.get("step_ms")]

    @cached_property
    def step_fit(self) -> Any:
        """The least-squares line through the per-context medians (None under two contexts)."""
        steps = self.steps
        return fit_line([c for c, _ in steps], [m for _, m in steps]) if len({c for c, _ in steps}) >= 2 else None

    @cached_property
    def found(self) -> list[fnd.Finding]:
        return fnd.sort_findings(sweep_findings(self.summary, source=self.source, rows=self.rows))


def start(params: Mapping[str, Any]) -> Page:
    """Check the sweep plan and open the run (:class:`Page`)."""
    return Page(params)


def measure_or_replay(pg: Page) -> Section:
    """Section 1: the rows (live: measured now), how many succeeded and the prefix-cache line."""
    s = Section()
    rows = pg.rows
    if pg.replaying:
        s.text(f"replaying {len(rows)} sweep rows of {pg.ctx.source.path} ({pg.source}); no request is sent")
    s.text(f"{len(pg.ok_rows)} of {len(rows)} requests succeeded")
    if cache_line(rows):
        s.text(cache_line(rows))
    return s


def every_request(pg: Page) -> Section:
    """Section 2: one line per request."""
    return Section().table(pg.rows, COLUMNS)


def per_context(pg: Page) -> Section:
    """Section 3: the median over the repeats that succeeded, per context (``data["summary"]``)."""
    return Section(data={"summary": pg.summary}).table(pg.summary, SUMMARY_COLUMNS)


def decode_speed(pg: Page) -> Section:
    """Section 4: decode speed against context (the figure), or why there is none."""
    fig = bsp.decode_figure(pg.ok_rows, pg.summary, pg.source)
    if fig is None:
        return Section().text("no request gave a decode rate (every request failed or produced a single chunk)")
    return Section().figure(fig)


def step_time(pg: Page) -> Section:
    """Section 5: ms per verify step against context with the least-squares line through the per-context medians
    (``data["step_fit"]``), or why there is none."""
    s = Section(data={"step_fit": pg.step_fit})
    fig = bsp.step_figure(pg.ok_rows, pg.steps, pg.step_fit, pg.source)
    return s.text("no request gave a step time") if fig is None else s.figure(fig)


def findings(pg: Page) -> Section:
    """Section 6: the verdicts (``data["found"]``)."""
    return Section(data={"found": pg.found}).html(fnd.to_html(pg.found))


def metrics(pg: Page) -> dict[str, Any]:
    summary, fit = pg.summary, pg.step_fit
    return {
        "requests": len(pg.rows), "failed": len(pg.rows) - len(pg.ok_rows), "source": pg.source,
        "context_tokens": [s["context_tokens"] for s in summary],
        "decode_tok_s": [s["decode_tok_s"] for s in summary], "step_ms": [s["step_ms"] for s in summary],
        "commit_length": [s["commit_length"] for s in summary], "ttft_s": [s["ttft_s"] for s in summary],
        "step_slope_ms_per_1k_tokens": fit.slope_per_1k if fit else None,
        "step_fit_r2": fit.r2 if fit else None,
    }


def write_result(pg: Page) -> None:
    """Write the findings and metrics; then, when every request failed, stop the notebook naming the first error."""
    pg.ctx.run.write_result(NOTEBOOK, findings=pg.found, metrics=metrics(pg))
    if pg.rows and not pg.ok_rows:
        raise RuntimeError(f"every one of the {len(pg.rows)} sweep requests failed; first error: "
                           f"{pg.rows[0]['error']}. The rows with their errors are in "
                           f"{pg.ctx.run.path / 'sweep.jsonl'}")
