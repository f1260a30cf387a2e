"""Notebook 04's sections, one call each (:class:`specdiag.section.Section`: tables, figures, text): the notebook keeps
its parameters, these calls and its prose.

:func:`start` checks the parameters (before any server is reached), opens the run and checks the server speculates;
the :class:`Page`'s data are computed when a section first asks. Sections: :func:`measure_or_replay`, :func:`requests` (every request), :func:`commit_vs_context` (the summary and its
figure), :func:`step_commits` (per-step histograms), :func:`findings`, :func:`metrics` and :func:`check_not_all_failed`.
"""

from __future__ import annotations

from functools import cached_property
from typing import Any, Mapping

import matplotlib.pyplot as plt

from specdiag import findings as fnd
from specdiag import nb
from specdiag.measure.fresh_prompt import cache_line
from specdiag.measure.loop import measure_missing
from specdiag.runs import rows_source
from specdiag.section import Section
from specdiag.steps.commit_probe import plots as cpp
from specdiag.steps.commit_probe import probe as cp

NOTEBOOK = "04_commit_probe"


class Page(nb.Page):
    """What 04's sections share: the plan, the rows and per-step commits (measured when first asked, or the recorded
    run's), the summary and the findings."""

    notebook = NOTEBOOK

    def __init__(self, params: Mapping[str, Any]) -> None:
        """Check the parameters (``make_plan``), open the run (``nb.start``); live, plan against the server's
        context_length and check it runs a drafter."""
        super().__init__(params)
        p = self.params
        self.plan: cp.ProbePlan = cp.make_plan(*self._plan_args(), repeats=p["repeats"])
        self.ctx = ctx = nb.start(NOTEBOOK, server_url=p["server_url"], speculative_config=p["speculative_config"],
                                  run_dir=p["run_dir"], replay_dir=p["replay_dir"], params=nb.run_params(p))
        self.num_draft_tokens: int | None = None
        if not ctx.replaying:
            server_info = ctx.server_info
            self.num_draft_tokens = server_info.get("speculative_num_draft_tokens")
            self.plan = cp.make_plan(*self._plan_args(), server_context_length=server_info.get("context_length"),
                                     repeats=p["repeats"])
            self.intro.text(f"server {ctx.server_url}: {ctx.settings.speculation_line()}; context_length "
                              f"{server_info.get('context_length')} tokens")
            nb.check(ctx.settings.speculating is not False,
                     f"the server at {ctx.server_url} runs no speculative decoding "
                     f"({ctx.settings.source('speculating')}): the commit probe needs a drafter; start it with one")
            if not self.num_draft_tokens:
                self.intro.text("the most tokens a step can commit is not known, so the plots draw no maximum: pass "
                                  "speculative_config={'num_speculative_tokens': k} to state it")
        self.intro.text(f"run folder: {ctx.run.path}")

    def _plan_args(self) -> tuple[Any, ...]:
        p = self.params
        return p["context_lengths"], p["kinds"], p["max_new_tokens"], p["seed"], p["flush_cache"]

    @cached_property
    def source(self) -> str:
        return rows_source(self.ctx.source.meta) if self.replaying else "measured"

    @cached_property
    def _measured(self) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """The probe rows and their verify steps: live, every missing request measured first (rows appended as
        taken, a re-run resumes); replaying, the recorded rows."""
        ctx = self.ctx
        if self.replaying:
            rows = cp.latest_rows(ctx.source.rows(cp.PROBE_TABLE))
            nb.check(len(rows) > 0, f"{ctx.source.path} has no {cp.PROBE_TABLE} rows ({cp.PROBE_TABLE}.jsonl) to "
                                    f"replay: pick a run that has them")
            return rows, ctx.source.rows(cp.STEPS_TABLE)

        def probe(request: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:  # its row and verify steps
            row, step_rows = cp.measure(ctx.client, request, self.plan, self.num_draft_tokens)
            return row, {cp.STEPS_TABLE: step_rows}

        measure_missing(ctx.run, self.plan, cp.PROBE_TABLE, cp.PROBE_KEY, probe, desc="probe")
        wanted = {tuple(q[k] for k in cp.PROBE_KEY) for q in self.plan.requests()}
        rows = [r for r in cp.latest_rows(ctx.run.rows(cp.PROBE_TABLE))
                if tuple(r.get(k) for k in cp.PROBE_KEY) in wanted]
        return rows, ctx.run.rows(cp.STEPS_TABLE)

    @property
    def rows(self) -> list[dict[str, Any]]:
        return self._measured[0]

    @property
    def steps(self) -> list[dict[str, Any]]:
        return self._measured[1]

    @property
    def ok_rows(self) -> list[dict[str, Any]]:
        return [r for r in self.rows if not r.get("error")]

    @cached_property
    def max_commit(self) -> int | None:
        """The most tokens a step can commit (the draft tokens; replaying, from the rows or the recorded run)."""
        return cp.max_commit_from(self.rows, self.ctx.source.meta) if self.replaying else self.num_draft_tokens

    @cached_property
    def summary(self) -> list[dict[str, Any]]:
        """The pooled commit length per kind and context."""
        return cp.summarize(self.rows)

    @cached_property
    def found(self) -> list[fnd.Finding]:
        return fnd.sort_findings(cp.probe_findings(self.summary, self.max_commit, source=self.source, rows=self.rows))


def start(params: Mapping[str, Any]) -> Page:
    """Check the parameters and open the run (:class:`Page`)."""
    return Page(params)


def measure_or_replay(pg: Page) -> Section:
    """Section 1: the rows (live: measured now), how many succeeded and the prefix-cache line."""
    s, rows = Section(), pg.rows
    if pg.replaying:
        s.text(f"replaying {len(rows)} {cp.PROBE_TABLE} rows of {pg.ctx.source.path} ({pg.source}); no request is sent")
    s.text(f"{len(pg.ok_rows)} of {len(rows)} requests succeeded")
    if cache_line(rows):
        s.text(cache_line(rows))
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
    s = Section().table(pg.summary, SUMMARY_COLUMNS, formats={"prefill_share": "{:.0%}"})
    if not pg.summary:
        return s.text("no request gave a commit length (every request failed, or the server reports no verify steps)")
    fig, ax = plt.subplots(figsize=(7, 4))
    cpp.commit_vs_context(ax, pg.summary, pg.rows, pg.max_commit, pg.source)
    return s.figure(fig)


def step_commits(pg: Page) -> Section:
    """Section 4: the share of verify steps per committed length, per kind and context."""
    hists = cp.step_histograms(pg.rows, pg.steps, pg.max_commit)
    if not hists:
        return Section().text("no per-step commits in these rows (the server reports neither per-step commits nor a "
                              "histogram)")
    return Section().figure(cpp.step_histograms(hists, pg.max_commit,
                                                "server-reported" if pg.source == "measured" else pg.source))


def findings(pg: Page) -> Section:
    """Section 5: the verdicts (``data["found"]``)."""
    return Section(data={"found": pg.found}).html(fnd.to_html(pg.found))


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
