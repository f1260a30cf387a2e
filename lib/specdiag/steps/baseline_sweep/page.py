"""Notebook 01's sections, one call each (:class:`specdiag.section.Section`: tables, figures, text): the notebook keeps
its parameters, these calls and its prose.

:func:`start` checks the sweep plan and opens the run (live: the plan checked again against the server's
context_length before any request); then :func:`measure_or_replay`, :func:`every_request`, :func:`per_context`,
:func:`decode_speed`, :func:`step_time`, :func:`findings`, and :func:`write_result` (which raises when every request
failed, after writing the findings).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

from specdiag import nb
from specdiag.measure.sweep_plan import SweepPlan, make_plan
from specdiag.section import Section

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


@dataclass
class Page:
    """What 01's sections share: the notebook context, the sweep plan and what each section found."""

    ctx: Any
    plan: SweepPlan
    opening: Section
    source: str = "measured"
    rows: list[dict[str, Any]] = field(default_factory=list)
    summary: list[dict[str, Any]] = field(default_factory=list)
    step_fit: Any = None
    found: list[Any] = field(default_factory=list)

    @property
    def ok_rows(self) -> list[dict[str, Any]]:
        return [r for r in self.rows if not r.get("error")]


def start(server_url: str = "", run_dir: str = "", replay_dir: str = "", speculative_config: dict | None = None,
          context_lengths: Sequence[int] = (512, 1024, 2048, 4096, 8192, 16000), max_new_tokens: int = 64,
          repeats: int = 1, prompt_kind: str = "novel", seed: int = 0, flush_cache: bool = True,
          instruction: str = "") -> Page:
    """Check the sweep plan (before anything starts), open the run (``nb.start``), and live check the plan again
    against the server's context_length."""
    plan_args = (context_lengths, max_new_tokens, repeats, prompt_kind, seed, flush_cache, instruction)
    plan = make_plan(*plan_args)
    ctx = nb.start(NOTEBOOK, server_url=server_url, speculative_config=speculative_config or {},
                   run_dir=run_dir, replay_dir=replay_dir,
                   params=dict(context_lengths=context_lengths, max_new_tokens=max_new_tokens, repeats=repeats,
                               prompt_kind=prompt_kind, seed=seed, flush_cache=flush_cache, instruction=instruction))
    opening = Section()
    if not ctx.replaying:
        server_info = ctx.server_info
        plan = make_plan(*plan_args, server_context_length=server_info.get("context_length"))
        opening.text(f"server {ctx.server_url}: context_length {server_info.get('context_length')} tokens, "
                     f"{ctx.settings.speculation_line()}")
    opening.text(f"run folder: {ctx.run.path}")
    return Page(ctx, plan, opening)


def measure_or_replay(pg: Page) -> Section:
    """Section 1: live, the requests still missing from the run (each row written as measured; a re-run resumes);
    replaying, the recorded rows. Then how many succeeded and the prefix-cache line."""
    from specdiag.measure.fresh_prompt import cache_line  # noqa: PLC0415
    from specdiag.measure.loop import measure_missing  # noqa: PLC0415
    from specdiag.measure.sweep_plan import measure_request  # noqa: PLC0415
    from specdiag.measure.sweep_table import SWEEP_KEY, latest_rows  # noqa: PLC0415
    from specdiag.runs import rows_source  # noqa: PLC0415

    ctx, s = pg.ctx, Section()
    if ctx.replaying:
        pg.source = rows_source(ctx.source.meta)
        pg.rows = latest_rows(ctx.source.rows("sweep"))
        nb.check(len(pg.rows) > 0,
                 f"{ctx.source.path} has no sweep rows (sweep.jsonl) to replay: pick a run that has them")
        s.text(f"replaying {len(pg.rows)} sweep rows of {ctx.source.path} ({pg.source}); no request is sent")
    else:
        pg.source = "measured"
        measure_missing(ctx.run, pg.plan, "sweep", SWEEP_KEY, lambda q: measure_request(ctx.client, q, pg.plan),
                        desc="sweep")
        pg.rows = latest_rows(ctx.run.rows("sweep"), pg.plan.requests())
    s.text(f"{len(pg.ok_rows)} of {len(pg.rows)} requests succeeded")
    if cache_line(pg.rows):
        s.text(cache_line(pg.rows))
    return s


def every_request(pg: Page) -> Section:
    """Section 2: one line per request."""
    return Section().table(pg.rows, COLUMNS)


def per_context(pg: Page) -> Section:
    """Section 3: the median over the repeats that succeeded, per context (``data["summary"]``)."""
    from specdiag.measure.sweep_table import summarize_sweep  # noqa: PLC0415

    pg.summary = summarize_sweep(pg.rows)
    return Section(data={"summary": pg.summary}).table(pg.summary, SUMMARY_COLUMNS)


def decode_speed(pg: Page) -> Section:
    """Section 4: decode speed against context (the figure), or why there is none."""
    from specdiag.steps.baseline_sweep import plots as bsp  # noqa: PLC0415

    fig = bsp.decode_figure(pg.ok_rows, pg.summary, pg.source)
    if fig is None:
        return Section().text("no request gave a decode rate (every request failed or produced a single chunk)")
    return Section().figure(fig)


def step_time(pg: Page) -> Section:
    """Section 5: ms per verify step against context with the least-squares line through the per-context medians
    (``data["step_fit"]``), or why there is none."""
    from specdiag.stats import fit_line  # noqa: PLC0415
    from specdiag.steps.baseline_sweep import plots as bsp  # noqa: PLC0415

    steps = [(s["context_tokens"], s["step_ms"]) for s in pg.summary if s.get("step_ms")]
    pg.step_fit = fit_line([c for c, _ in steps], [m for _, m in steps]) if len({c for c, _ in steps}) >= 2 else None
    s = Section(data={"step_fit": pg.step_fit})
    fig = bsp.step_figure(pg.ok_rows, steps, pg.step_fit, pg.source)
    return s.text("no request gave a step time") if fig is None else s.figure(fig)


def findings(pg: Page) -> Section:
    """Section 6: the verdicts (``data["found"]``)."""
    from specdiag import findings as fnd  # noqa: PLC0415
    from specdiag.steps.baseline_sweep.summary import sweep_findings  # noqa: PLC0415

    pg.found = fnd.sort_findings(sweep_findings(pg.summary, source=pg.source, rows=pg.rows))
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
