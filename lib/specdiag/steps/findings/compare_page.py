"""Notebook 08's sections, one call each (:class:`specdiag.section.Section`: tables, figures, text): the notebook keeps
its parameters, these calls and its prose.

:func:`start` checks that both runs are named, opens them and this comparison's run folder; the :class:`Page`'s data
are read when a section first asks. Sections: :func:`about` (each
run's settings side by side), :func:`sweeps` (the baseline sweeps at the contexts both measured, and their figure),
:func:`commit_lengths` (per prompt kind), :func:`step_profiles` (where a decode step's time goes), :func:`verdicts`
(every finding id of either run, and 08's findings) and :func:`metrics`. The comparisons themselves are
:mod:`specdiag.steps.findings.overview`'s and :mod:`specdiag.steps.findings.step_profile_view`'s.
"""

from __future__ import annotations

from functools import cached_property
from typing import Any, Mapping

import matplotlib.pyplot as plt
import pandas as pd

from specdiag import findings as fnd
from specdiag import nb, plots, tables
from specdiag.measure.sweep_table import summarize_sweep
from specdiag.paths import relative_to_project
from specdiag.runs import Run
from specdiag.section import Section
from specdiag.steps.findings import overview, step_profile_view

NOTEBOOK = "08_compare_runs"


class Page(nb.Page):
    """What 08's sections share: the two runs, their sweep rows side by side, their step profiles and their findings
    compared, each read when a section first asks."""

    notebook = NOTEBOOK

    def __init__(self, params: Mapping[str, Any]) -> None:
        """Check that both runs are named, open them and this comparison's run folder (nothing is measured)."""
        super().__init__(params)
        p = self.params
        run_a, run_b = p["run_a"], p["run_b"]
        nb.check(bool(run_a) and bool(run_b), "run_a and run_b must both name run folders (data/runs/<run-id> or "
                                              f"data/reference/<name>); got run_a={run_a!r}, run_b={run_b!r}")
        self.a, self.b = Run.open(run_a), Run.open(run_b)
        names = {"run_a": relative_to_project(self.a.path), "run_b": relative_to_project(self.b.path)}
        self.ctx = nb.start(NOTEBOOK, run_dir=p["run_dir"], params=dict(names), needs_server=False)
        self.ctx.run.update(compare=names)
        self.intro.text(f"A = {names['run_a']}\nB = {names['run_b']}\n"
                          f"comparison written to {relative_to_project(self.ctx.run.path)}")

    @cached_property
    def _sweep_a(self) -> tuple[list[dict[str, Any]], str, str]:
        """A's sweep rows (a replay's from the run it replayed), where they came from and their source."""
        return overview.sweep_rows_of(self.a)

    @cached_property
    def _sweep_b(self) -> tuple[list[dict[str, Any]], str, str]:
        return overview.sweep_rows_of(self.b)

    @property
    def rows_a(self) -> list[dict[str, Any]]:
        return self._sweep_a[0]

    @property
    def rows_b(self) -> list[dict[str, Any]]:
        return self._sweep_b[0]

    @property
    def source_a(self) -> str:
        return self._sweep_a[2]

    @property
    def source_b(self) -> str:
        return self._sweep_b[2]

    @property
    def source(self) -> str:
        return self.source_a if self.source_a == self.source_b else "measured"

    @cached_property
    def sweep_cmp(self) -> list[dict[str, Any]]:
        """B against A per common context."""
        return overview.compare_sweeps(self.rows_a, self.rows_b)

    @cached_property
    def slope_a(self) -> float | None:
        return overview.step_slope(self.rows_a)

    @cached_property
    def slope_b(self) -> float | None:
        return overview.step_slope(self.rows_b)

    @cached_property
    def prof_table(self) -> Any:
        """Where a decode step's time goes, per run, arm and context (the runs' ``step_profile`` tables)."""
        return step_profile_view.profile_table({label: run.rows("step_profile")
                                                for label, run in (("A", self.a), ("B", self.b))})

    @cached_property
    def findings_cmp(self) -> list[dict[str, Any]]:
        """Every finding id of either run, its severity in A and in B."""
        return overview.compare_findings(self.a.results(), self.b.results())

    @cached_property
    def found(self) -> list[fnd.Finding]:
        return overview.comparison_findings(self.sweep_cmp, self.slope_a, self.slope_b, self.findings_cmp,
                                            source=self.source)


def start(params: Mapping[str, Any]) -> Page:
    """Check that both runs are named and open them (:class:`Page`)."""
    return Page(params)


def about_run(run: Run) -> dict[str, Any]:
    """What a run was about, from its ``run.json``: provenance, server, speculative settings, hardware."""
    m = run.meta
    s, h, p = m.get("server") or {}, m.get("hardware") or {}, m.get("provenance") or {}
    return {"created (UTC)": p.get("created_utc"), "git commit": p.get("git_commit"),
            "server": m.get("server_url"), "replay of": m.get("replay_of"), "data source": m.get("data_source", "measured"),
            "model": s.get("model_path"), "speculative algorithm": s.get("speculative_algorithm"),
            "draft model": s.get("speculative_draft_model_path"), "draft tokens": s.get("speculative_num_draft_tokens"),
            "attention backend": s.get("attention_backend"), "page size": s.get("page_size"), "TP": s.get("tp_size"),
            "context length": s.get("context_length"), "KV dtype": s.get("kv_cache_dtype"),
            "device": h.get("device_name"), "peak GB/s": h.get("memory_bandwidth_gb_s")}


def about(pg: Page) -> Section:
    """Section 1: each run's settings side by side, the rows that differ highlighted."""
    side = pd.DataFrame({"A": about_run(pg.a), "B": about_run(pg.b)}).rename_axis("setting")
    side["differs"] = side["A"].astype(str) != side["B"].astype(str)
    s = Section()
    s.parts.append(("table", tables.table(side, dash_means="not recorded in that run")
                    .apply(lambda r: ["background:#fff3e0" if r["differs"] else "" for _ in r], axis=1)))
    return s


SWEEP_COLUMNS = {"context_tokens": "context (tokens)", "decode_tok_s_a": "decode A (tok/s)",
                 "decode_tok_s_b": "decode B (tok/s)", "decode_tok_s_ratio_b_a": "decode B/A", "step_ms_a": "ms/step A",
                 "step_ms_b": "ms/step B", "step_ms_ratio_b_a": "ms/step B/A", "commit_length_a": "commit A (tok/step)",
                 "commit_length_b": "commit B (tok/step)", "ttft_s_a": "TTFT A (s)", "ttft_s_b": "TTFT B (s)",
                 "step_ratio_lo": "ms/step B/A, interval low", "step_ratio_hi": "ms/step B/A, interval high",
                 "step_n_a": "requests A", "step_n_b": "requests B", "step_verdict": "B's step (over requests)"}


def sweeps(pg: Page) -> Section:
    """Section 2: each run's sweep rows (a replay's from the run it replayed), B against A per common context, and the
    decode speed and step time against context of both."""
    where_a, where_b = pg._sweep_a[1], pg._sweep_b[1]
    s = Section().text(f"A: {len(pg.rows_a)} sweep rows from {where_a} ({pg.source_a}); "
                       f"B: {len(pg.rows_b)} from {where_b} ({pg.source_b})")
    if pg.sweep_cmp:
        s.table(pg.sweep_cmp, SWEEP_COLUMNS,
                dash_means="one run has no value there, or fewer than 3 requests a side for an interval")
    else:
        s.text("the runs have no context in common in their sweep tables: nothing to set side by side")
    if pg.rows_a or pg.rows_b:
        s.figure(sweep_figure(pg))
    return s


def sweep_figure(pg: Page) -> Any:
    """Decode speed and ms per verify step against context, run A beside run B (medians over repeats)."""
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4))
    contexts: set[int] = set()
    for label, rows, slope in (("A", pg.rows_a, pg.slope_a), ("B", pg.rows_b, pg.slope_b)):
        summ = list(summarize_sweep(rows))
        dec = [(r["context_tokens"], r["decode_tok_s"]) for r in summ if r.get("decode_tok_s")]
        stp = [(r["context_tokens"], r["step_ms"]) for r in summ if r.get("step_ms")]
        contexts |= {c for c, _ in dec} | {c for c, _ in stp}
        if dec:
            ax1.plot([c for c, _ in dec], [d for _, d in dec], "o-", label=f"run {label}")
        if stp:
            ax2.plot([c for c, _ in stp], [m for _, m in stp], "o-",
                     label=f"run {label}" + (f" ({slope:.3g} ms per 1k tokens)" if slope is not None else ""))
    for ax in (ax1, ax2):
        plots.context_axis(ax, sorted(contexts))
        ax.grid(alpha=0.3)
        ax.legend()
    ax1.set_ylabel("decode speed (tokens/s)")
    ax1.set_title("Decode speed vs context")
    ax2.set_ylabel("time per verify step (ms)")
    ax2.set_title("Verify step time vs context")
    plots.source_note(ax2, f"A: {pg.source_a}, B: {pg.source_b}; medians over repeats")
    return fig


def commit_lengths(pg: Page) -> Section:
    """Section 3: tokens committed per verify step, per table, prompt kind and context, A beside B."""
    commit_rows = []
    for label, run, sweep_rows in (("A", pg.a, pg.rows_a), ("B", pg.b, pg.rows_b)):
        for table, rows in (("sweep", sweep_rows), ("commit_probe", run.rows("commit_probe"))):
            for (kind, c), v in overview.commit_by_kind(rows).items():
                commit_rows.append({"table": table, "prompt kind": kind, "context (tokens)": c, "run": label,
                                    "commit (tok/step)": v})
    if not commit_rows:
        return Section().text("neither run recorded commit lengths")
    ct = pd.DataFrame(commit_rows).pivot_table(index=["table", "prompt kind", "context (tokens)"], columns="run",
                                               values="commit (tok/step)")
    return Section().table(ct, dash_means="that run did not measure this kind at this context")


PROFILE_PROSE = (
    "## 4. Where a decode step's time goes (torch profiler)\n\n"
    "From each run's `step_profile` table: torch profiler traces of the server (SGLang's `/start_profile`, "
    "CPU + GPU with Python stacks), cut into steps at the NGRAM worker's `forward_batch_generation` (the "
    "marker is in each row). Per run, arm and context, the median over the complete steps of: GPU time per "
    "kernel class (ops launched in the step; where ops overlap, the time is shared), GPU idle = wall - busy "
    "(the GPU waiting on the CPU: scheduler, NGRAM drafting), and CPU time of named phases (they nest, so "
    "they do not add up). Medians of the parts need not add up to the median wall time (the black tick).")


def step_profiles(pg: Page) -> Section:
    """Section 4 (only when a run carries a ``step_profile`` table): its heading and prose, the table and the bars."""
    if not pg.prof_table:
        return Section().text("no step profile in either run (no step_profile table; record one with "
                              "python -m specdiag.telemetry.torch_trace TRACE --run RUN --context-tokens N --arm NAME)")
    return (Section().markdown(PROFILE_PROSE)
            .table(pg.prof_table, step_profile_view.table_columns(pg.prof_table))
            .figure(step_profile_view.plot_profile(pg.prof_table)))


def verdicts(pg: Page) -> Section:
    """Section 5: every finding id of either run, its severity in A and in B (changed ones first), then 08's findings
    (``data["found"]``)."""
    s = Section()
    if pg.findings_cmp:
        ft = pd.DataFrame(pg.findings_cmp).sort_values(["changed", "notebook", "id"], ascending=[False, True, True])
        s.table(ft, {"notebook": "notebook", "id": "finding", "severity_a": "severity A", "severity_b": "severity B",
                     "changed": "changed", "verdict_a": "verdict A", "verdict_b": "verdict B"},
                dash_means="the finding is absent from that run")
    else:
        s.text("neither run has findings")
    s.data["found"] = pg.found
    return s.html(fnd.to_html(s.data["found"]))


def metrics(pg: Page) -> dict[str, Any]:
    cmp = pg.sweep_cmp
    return {"run_a": relative_to_project(pg.a.path), "run_b": relative_to_project(pg.b.path),
            "common_contexts": [r["context_tokens"] for r in cmp],
            "decode_ratio_b_a": [r["decode_tok_s_ratio_b_a"] for r in cmp],
            "step_ms_a": [r["step_ms_a"] for r in cmp], "step_ms_b": [r["step_ms_b"] for r in cmp],
            "step_verdict": [r.get("step_verdict") for r in cmp],
            "step_ratio_interval": [[r.get("step_ratio_lo"), r.get("step_ratio_hi")] for r in cmp],
            "slope_a_ms_per_1k_tokens": pg.slope_a, "slope_b_ms_per_1k_tokens": pg.slope_b,
            "findings_changed": sum(1 for f in pg.findings_cmp if f["changed"]),
            "step_profile": step_profile_view.profile_metrics(pg.prof_table)}
