"""Notebook 04's sections, one call each (:class:`specdiag.section.Section`: tables, figures, text): the notebook keeps
its parameters, these calls and its prose.

:func:`start` checks the parameters (before any server is reached), opens the run and checks the server speculates;
then :func:`measure_or_replay`, :func:`requests` (every request), :func:`commit_vs_context` (the summary and its
figure), :func:`step_commits` (per-step histograms), :func:`findings`, :func:`metrics` and :func:`check_not_all_failed`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

from specdiag import nb
from specdiag.section import Section
from specdiag.steps.commit_probe import probe as cp

NOTEBOOK = "04_commit_probe"


@dataclass
class Page:
    """What 04's sections share: the notebook context, the plan and what each section found."""

    ctx: Any
    plan: cp.ProbePlan
    num_draft_tokens: int | None
    opening: Section
    rows: list[dict[str, Any]] = field(default_factory=list)
    steps: list[dict[str, Any]] = field(default_factory=list)
    source: str = "measured"
    max_commit: int | None = None
    summary: list[dict[str, Any]] = field(default_factory=list)

    @property
    def ok_rows(self) -> list[dict[str, Any]]:
        return [r for r in self.rows if not r.get("error")]


def start(server_url: str = "", run_dir: str = "", replay_dir: str = "", speculative_config: dict | None = None,
          context_lengths: Sequence[int] = (1024, 4096, 16000), max_new_tokens: int = 64,
          kinds: Sequence[str] = ("predictable", "novel"), seed: int = 0, repeats: int = 3,
          flush_cache: bool = True) -> Page:
    """Check the parameters (``make_plan``), open the run (``nb.start``); live, plan against the server's
    context_length and check it runs a drafter."""
    plan = cp.make_plan(context_lengths, kinds, max_new_tokens, seed, flush_cache, repeats=repeats)
    ctx = nb.start(NOTEBOOK, server_url=server_url, speculative_config=speculative_config or {},
                   run_dir=run_dir, replay_dir=replay_dir,
                   params=dict(context_lengths=context_lengths, max_new_tokens=max_new_tokens, kinds=kinds, seed=seed,
                               flush_cache=flush_cache, repeats=repeats))
    opening = Section()
    num_draft_tokens = None
    if not ctx.replaying:
        server_info = ctx.server_info
        num_draft_tokens = server_info.get("speculative_num_draft_tokens")
        plan = cp.make_plan(context_lengths, kinds, max_new_tokens, seed, flush_cache,
                            server_context_length=server_info.get("context_length"), repeats=repeats)
        opening.text(f"server {ctx.server_url}: {ctx.settings.speculation_line()}; context_length "
                     f"{server_info.get('context_length')} tokens")
        nb.check(ctx.settings.speculating is not False,
                 f"the server at {ctx.server_url} runs no speculative decoding ({ctx.settings.source('speculating')}): "
                 f"the commit probe needs a drafter; start it with one")
        if not num_draft_tokens:
            opening.text("the most tokens a step can commit is not known, so the plots draw no maximum: pass "
                         "speculative_config={'num_speculative_tokens': k} to state it")
    opening.text(f"run folder: {ctx.run.path}")
    return Page(ctx, plan, num_draft_tokens, opening)


def measure_or_replay(pg: Page) -> Section:
    """Section 1: live, every missing request measured (rows appended as taken, a re-run resumes); replaying, the
    recorded rows. Then how many succeeded and the prefix-cache line."""
    from specdiag.measure.fresh_prompt import cache_line  # noqa: PLC0415
    from specdiag.measure.loop import measure_missing  # noqa: PLC0415
    from specdiag.runs import rows_source  # noqa: PLC0415

    ctx, s = pg.ctx, Section()
    if ctx.replaying:
        pg.source = rows_source(ctx.source.meta)
        pg.rows = cp.latest_rows(ctx.source.rows(cp.PROBE_TABLE))
        pg.steps = ctx.source.rows(cp.STEPS_TABLE)
        nb.check(len(pg.rows) > 0, f"{ctx.source.path} has no {cp.PROBE_TABLE} rows ({cp.PROBE_TABLE}.jsonl) to "
                                   f"replay: pick a run that has them")
        pg.max_commit = cp.max_commit_from(pg.rows, ctx.source.meta)
        s.text(f"replaying {len(pg.rows)} {cp.PROBE_TABLE} rows of {ctx.source.path} ({pg.source}); no request is sent")
    else:
        pg.source = "measured"
        pg.max_commit = pg.num_draft_tokens

        def probe(request):  # the probe row, and its verify steps for the steps table
            row, step_rows = cp.measure(ctx.client, request, pg.plan, pg.num_draft_tokens)
            return row, {cp.STEPS_TABLE: step_rows}

        measure_missing(ctx.run, pg.plan, cp.PROBE_TABLE, cp.PROBE_KEY, probe, desc="probe")
        wanted = {tuple(q[k] for k in cp.PROBE_KEY) for q in pg.plan.requests()}
        pg.rows = [r for r in cp.latest_rows(ctx.run.rows(cp.PROBE_TABLE))
                   if tuple(r.get(k) for k in cp.PROBE_KEY) in wanted]
        pg.steps = ctx.run.rows(cp.STEPS_TABLE)
    s.text(f"{len(pg.ok_rows)} of {len(pg.rows)} requests succeeded")
    if cache_line(pg.rows):
        s.text(cache_line(pg.rows))
    return s


COLUMNS = {
    "context_tokens": "context (tokens)", "kind": "kind", "commit_length": "commit length (tok/step)",
    "accepted_drafts": "accepted drafts (per step)", "accepted_depth": "accepted depth (per step)",
    "verify_steps": "verify steps (server)", "target_forwards": "target forwards (computed)",
    "steps_without_draft": "steps without a draft", "tokens_per_target_forward": "tokens per target forward",
    "completion_tokens": "new tokens (server)", "wall_s": "wall time (s)",
    "prefill_s": "prefill (s)", "prefill_share": "prefill share of wall", "decode_tok_s": "decode (tok/s)",
    "prompt_tokens": "prompt tokens (server)", "other_traffic": "other traffic (/metrics)", "error": "error",
}

SUMMARY_COLUMNS = {"kind": "kind", "context_tokens": "context (tokens)", "requests": "requests",
                   "commit_length": "commit length (tok/step)", "accepted_drafts": "accepted drafts (per step)",
                   "tokens_per_target_forward": "tokens per target forward",
                   "wall_s": "wall time (s)", "prefill_share": "prefill share of wall"}


def requests(pg: Page) -> Section:
    """Section 2: every request, one row each."""
    return Section().table(pg.rows, COLUMNS, formats={"prefill_share": "{:.0%}"})


def commit_vs_context(pg: Page) -> Section:
    """Section 3: the pooled commit length per kind and context, and its figure against the maximum."""
    import matplotlib.pyplot as plt  # noqa: PLC0415

    from specdiag.steps.commit_probe import plots as cpp  # noqa: PLC0415

    pg.summary = cp.summarize(pg.rows)
    s = Section().table(pg.summary, SUMMARY_COLUMNS, formats={"prefill_share": "{:.0%}"})
    if not pg.summary:
        return s.text("no request gave a commit length (every request failed, or the server reports no verify steps)")
    fig, ax = plt.subplots(figsize=(7, 4))
    cpp.commit_vs_context(ax, pg.summary, pg.rows, pg.max_commit, pg.source)
    return s.figure(fig)


def step_commits(pg: Page) -> Section:
    """Section 4: the share of verify steps per committed length, per kind and context."""
    from specdiag.steps.commit_probe import plots as cpp  # noqa: PLC0415

    hists = cp.step_histograms(pg.rows, pg.steps, pg.max_commit)
    if not hists:
        return Section().text("no per-step commits in these rows (the server reports neither per-step commits nor a "
                              "histogram)")
    return Section().figure(cpp.step_histograms(hists, pg.max_commit,
                                                "server-reported" if pg.source == "measured" else pg.source))


def findings(pg: Page) -> Section:
    """Section 5: the verdicts (``data["found"]``)."""
    from specdiag import findings as fnd  # noqa: PLC0415

    found = fnd.sort_findings(cp.probe_findings(pg.summary, pg.max_commit, source=pg.source, rows=pg.rows))
    return Section(data={"found": found}).html(fnd.to_html(found))


def metrics(pg: Page) -> dict[str, Any]:
    summary = pg.summary
    return {
        "requests": len(pg.rows), "failed": len(pg.rows) - len(pg.ok_rows), "source": pg.source,
        "max_commit_length": pg.max_commit,
        "context_tokens": sorted({s["context_tokens"] for s in summary}),
        "commit_length": {k: {s["context_tokens"]: s["commit_length"] for s in summary if s["kind"] == k}
                          for k in cp.KINDS},
        "tokens_per_target_forward": {k: {s["context_tokens"]: s.get("tokens_per_target_forward") for s in summary
                                          if s["kind"] == k} for k in cp.KINDS},
        "algorithm": (pg.ctx.server_info or {}).get("speculative_algorithm") if not pg.ctx.replaying else None,
    }


def check_not_all_failed(pg: Page) -> None:
    """Raise when every probe request failed (after the result is written), naming the first error."""
    if pg.rows and not pg.ok_rows:
        raise RuntimeError(f"every one of the {len(pg.rows)} probe requests failed; first error: "
                           f"{pg.rows[0]['error']}. The rows with their errors are in "
                           f"{pg.ctx.run.path / (cp.PROBE_TABLE + '.jsonl')}")
