"""One run's findings on one page (07_findings) and two runs side by side (08_compare_runs).

Pure functions over what :meth:`specdiag.runs.Run.results` and :meth:`Run.rows` return; the
notebooks do the reading and the showing.
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping, Sequence

from specdiag.findings import SEVERITY_ORDER, Finding
from specdiag.measure.sweep_table import latest_rows, samples_by_context, summarize_sweep
from specdiag.paths import relative_to_project
from specdiag.runs import Run, recorded_source, rows_source
from specdiag.stats import MIN_REQUESTS, NOT_ENOUGH, compare_requests, fit_line

#: The question each notebook answers, in run order.
QUESTIONS: dict[str, str] = {
    "00_snapshot": "What server, model, drafter, attention backend, page size and hardware is this run about?",
    "01_baseline_sweep": "How do TTFT, prefill, decode, ms per step and commit length scale with context?",
    "02_gpu_utilization": "Is the GPU busy during long-context decode, or idle?",
    "03_drafter_inspection": "Is the drafter's attention bounded and its cost flat in context?",
    "04_commit_probe": "Predictable vs novel text at each context: a drafter bug or text difficulty?",
    "05_bandwidth_analysis": "Bytes each step must read vs measured step time: how far from the floor?",
    "06_kernel_ab": "Attention kernels A/B: baseline vs split-KV, page size 1 vs 64, vs the floors",
    "09_engine_ab": "Engine arms side by side: decode, ms per step and TTFT per context, and which arm to run",
    "10_kv_layout": "Does the request's KV layout in the pool (fragmented vs contiguous) cost verify time?",
    "11_moe_batch1": "At batch 1, which experts does a verify pass touch, and what share of the step are they?",
}
#: Notebooks that summarize other notebooks; their own results are not part of a summary.
SUMMARY_NOTEBOOKS = ("07_findings", "08_compare_runs")


def split_recorded(results: Mapping[str, Mapping[str, Any]], run_meta: Mapping[str, Any] | None = None
                   ) -> tuple[dict[str, Mapping[str, Any]], dict[str, str]]:
    """``(this run's results, {notebook: recorded run} of the results taken from a recorded run)``: the second are
    shown apart, labelled with their run, and counted neither in the run's severities nor in its diagnosis."""
    own: dict[str, Mapping[str, Any]] = {}
    recorded: dict[str, str] = {}
    for name, res in results.items():
        source = recorded_source(name, res, run_meta)
        if source and name not in SUMMARY_NOTEBOOKS:
            recorded[name] = source
        else:
            own[name] = res
    return own, recorded


def collect_findings(results: Mapping[str, Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Every finding of every notebook (summary notebooks excluded), each with its ``notebook``,
    most severe first, then in notebook order."""
    out = []
    for nb_name in sorted(results):
        if nb_name in SUMMARY_NOTEBOOKS:
            continue
        for f in results[nb_name].get("findings") or []:
            out.append({**f, "notebook": nb_name})
    return sort_collected(out)


def sort_collected(findings: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Collected findings (each with its ``notebook``) most severe first, then in notebook order."""
    return sorted((dict(f) for f in findings),
                  key=lambda f: (SEVERITY_ORDER.get(f.get("severity", "info"), 9), str(f.get("notebook"))))


def notebook_overview(results: Mapping[str, Mapping[str, Any]], statuses: Mapping[str, Any] | None = None,
                      recorded: Mapping[str, str] | None = None) -> list[dict[str, Any]]:
    """One row per notebook (known ones first): its question, whether it wrote a result, its status in
    the report (when the report recorded one), finding counts by severity, and its most severe verdict.

    ``recorded``: notebooks whose result came from a recorded run (:func:`split_recorded`); their row says which run
    (``result`` "recorded run <path>"), and leaves the counts and the verdict empty: they are not this run's."""
    recorded = recorded or {}
    names = [n for n in QUESTIONS] + sorted(n for n in results if n not in QUESTIONS and n not in SUMMARY_NOTEBOOKS)
    rows = []
    for name in names:
        res = results.get(name)
        found = sorted(res.get("findings") or [], key=lambda f: SEVERITY_ORDER.get(f.get("severity"), 9)) if res else []
        row: dict[str, Any] = {"notebook": name, "question": QUESTIONS.get(name, ""),
                               "result": (f"recorded run {recorded[name]}" if name in recorded else
                                          "written" if res else "none"),
                               "status": (statuses or {}).get(name)}
        for sev in ("critical", "warning", "info", "ok"):
            row[sev] = None if name in recorded else sum(1 for f in found if f.get("severity") == sev)
        row["most severe"] = ("" if name in recorded else
                              f"[{found[0].get('severity')}] {found[0].get('verdict')}" if found else "")
        rows.append(row)
    return rows


def overall_finding(findings: Sequence[Mapping[str, Any]], overview: Sequence[Mapping[str, Any]]) -> Finding:
    """The summary verdict of a run: how many critical and warning findings, and the most severe one. ``findings``:
    this run's own (:func:`split_recorded`); ``overview``: :func:`notebook_overview`'s rows, whose recorded notebooks
    are listed apart (``numbers["recorded"]``)."""
    counts = {s: sum(1 for f in findings if f.get("severity") == s) for s in ("critical", "warning", "info", "ok")}
    written = [o["notebook"] for o in overview if o["result"] == "written"]
    from_records = {o["notebook"]: o["result"].removeprefix("recorded run ") for o in overview
                    if str(o["result"]).startswith("recorded run ")}
    missing = [o["notebook"] for o in overview if o["result"] == "none"]
    if not findings:
        return Finding("findings.overall", "No findings in this run",
                       "No notebook of this run wrote findings: run the notebooks first (make report).", "warning",
                       (f"notebooks with a result: {', '.join(written) or 'none'}",), {"notebooks": written},
                       "computed")
    top = findings[0]
    severity = "critical" if counts["critical"] else "warning" if counts["warning"] else "ok"
    return Finding(
        "findings.overall", "Summary of this run",
        f"{counts['critical']} critical and {counts['warning']} warning findings in {len(written)} notebooks; "
        f"the most severe: {top.get('title')} ({top.get('notebook')}): {top.get('verdict')}",
        severity,
        (f"notebooks with a result: {', '.join(written)}",
         f"notebooks without one: {', '.join(missing) or 'none'}",
         *(f"{nb} showed the recorded run {src}: its findings are not counted here" for nb, src in from_records.items()),
         *(f"[{f.get('severity')}] {f.get('notebook')}: {f.get('title')}" for f in findings[:5])),
        {**{f"{k}_findings": v for k, v in counts.items()}, "notebooks": written, "missing": missing,
         "recorded": from_records},
        "computed")


# ---------------------------------------------------------------------------------------------
# Two runs
# ---------------------------------------------------------------------------------------------


def sweep_rows_of(run: Run) -> tuple[list[dict[str, Any]], str, str]:
    """A run's sweep rows, following ``replay_of`` when the run replayed another one's rows.

    Returns ``(rows, where they were read (project-relative when inside the project), their source)``."""
    rows = run.rows("sweep")
    if rows:
        return latest_rows(rows), relative_to_project(run.path), rows_source(run.meta)
    replay_of = run.meta.get("replay_of")
    if replay_of:
        src = Run.open(replay_of)
        return latest_rows(src.rows("sweep")), relative_to_project(src.path), rows_source(src.meta)
    return [], relative_to_project(run.path), rows_source(run.meta)


def compare_sweeps(rows_a: Iterable[Mapping[str, Any]], rows_b: Iterable[Mapping[str, Any]],
                   seed: int = 0) -> list[dict[str, Any]]:
    """Per context present in both runs: decode tok/s, ms per step, commit length and TTFT of each, and B/A ratios
    (medians over each run's successful requests); and, over requests (one value each: a request is the unit), B
    against A for the step and for decode tok/s (:func:`specdiag.stats.compare_requests`): the interval of the
    ratio (``step_ratio_lo``/``_hi``, ``decode_ratio_lo``/``_hi``), the requests each side had (``step_n_a``,
    ``step_n_b``) and the verdict (``step_verdict``: slower / faster / tie; ``decode_verdict``: faster / slower /
    tie; "not enough requests" under 3 a side)."""
    rows_a, rows_b = list(rows_a), list(rows_b)
    sa = {s["context_tokens"]: s for s in summarize_sweep(rows_a)}
    sb = {s["context_tokens"]: s for s in summarize_sweep(rows_b)}
    xa, xb = samples_by_context(rows_a, "step_ms"), samples_by_context(rows_b, "step_ms")
    da, db = samples_by_context(rows_a, "decode_tok_s"), samples_by_context(rows_b, "decode_tok_s")
    out = []
    for ctx in sorted(set(sa) & set(sb)):
        row: dict[str, Any] = {"context_tokens": ctx}
        for f in ("decode_tok_s", "step_ms", "commit_length", "ttft_s"):
            a, b = sa[ctx].get(f), sb[ctx].get(f)
            row[f"{f}_a"], row[f"{f}_b"] = a, b
            row[f"{f}_ratio_b_a"] = b / a if a and b else None
        step = compare_requests(xa.get(ctx, []), xb.get(ctx, []), seed)
        dec = compare_requests(da.get(ctx, []), db.get(ctx, []), seed)
        row.update({"step_n_a": step.n_a, "step_n_b": step.n_b, "step_ratio_lo": step.lo, "step_ratio_hi": step.hi,
                    "step_verdict": {"higher": "slower", "lower": "faster"}.get(step.verdict, step.verdict),
                    "decode_n_a": dec.n_a, "decode_n_b": dec.n_b, "decode_ratio_lo": dec.lo, "decode_ratio_hi": dec.hi,
                    "decode_verdict": {"higher": "faster", "lower": "slower"}.get(dec.verdict, dec.verdict)})
        out.append(row)
    return out


def step_slope(rows: Iterable[Mapping[str, Any]]) -> float | None:
    """Least-squares slope of per-context median ms per step vs context, ms per 1k tokens (None if < 2)."""
    pts = [(s["context_tokens"], s["step_ms"]) for s in summarize_sweep(rows) if s.get("step_ms")]
    if len({c for c, _ in pts}) < 2:
        return None
    return fit_line([c for c, _ in pts], [m for _, m in pts]).slope_per_1k


def compare_findings(results_a: Mapping[str, Mapping[str, Any]],
                     results_b: Mapping[str, Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Every finding id of either run with its severity and verdict in A and in B, and whether it changed."""
    def by_id(results: Mapping[str, Mapping[str, Any]]) -> dict[str, Mapping[str, Any]]:
        return {f["id"]: f for f in collect_findings(results)}

    fa, fb = by_id(results_a), by_id(results_b)
    out = []
    for fid in sorted(set(fa) | set(fb), key=lambda i: ((fa.get(i) or fb.get(i) or {}).get("notebook", ""), i)):
        a, b = fa.get(fid), fb.get(fid)
        out.append({"id": fid, "notebook": (a or b or {}).get("notebook"),
                    "severity_a": a.get("severity") if a else None, "severity_b": b.get("severity") if b else None,
                    "verdict_a": a.get("verdict") if a else None, "verdict_b": b.get("verdict") if b else None,
                    "changed": (a or {}).get("severity") != (b or {}).get("severity")})
    return out


def commit_by_kind(rows: Iterable[Mapping[str, Any]]) -> dict[tuple[str, int], float]:
    """Step-weighted commit length per (prompt kind, context) from rows that carry ``prompt_kind`` (or ``kind``),
    ``context_tokens`` and ``completion_tokens`` + ``verify_steps`` (or ``commit_length``); failed rows skipped."""
    groups: dict[tuple[str, int], list[Mapping[str, Any]]] = {}
    for r in rows:
        if r.get("error") or r.get("context_tokens") is None:
            continue
        kind = r.get("prompt_kind") or r.get("kind") or "?"  # commit_probe rows name it ``kind``
        groups.setdefault((str(kind), int(r["context_tokens"])), []).append(r)
    out = {}
    for key, group in groups.items():
        line = summarize_sweep(group)[0]
        if line.get("commit_length") is not None:
            out[key] = line["commit_length"]
    return dict(sorted(out.items()))


def comparison_findings(sweep_cmp: Sequence[Mapping[str, Any]], slope_a: float | None, slope_b: float | None,
                        findings_cmp: Sequence[Mapping[str, Any]], source: str = "measured") -> list[Finding]:
    """Verdicts of a comparison: decode speed B vs A at the common contexts, the step-time slopes, and
    which findings changed severity."""
    out: list[Finding] = []
    dec = [r for r in sweep_cmp if r.get("decode_tok_s_ratio_b_a")]
    if dec:
        last = dec[-1]
        ctx_last, ratio_last = last["context_tokens"], last["decode_tok_s_ratio_b_a"]
        geo = 1.0
        for r in dec:
            geo *= r["decode_tok_s_ratio_b_a"]
        geo **= 1.0 / len(dec)
        verdict = last.get("decode_verdict") or NOT_ENOUGH
        said = {"faster": " (faster", "slower": " (slower", "tie": " (a tie"}.get(verdict)
        interval = (f": {last['decode_ratio_lo']:.3g}-{last['decode_ratio_hi']:.3g}x over requests)"
                    if said else "")
        out.append(Finding(
            "compare.decode_speed", "Decode speed, run B vs run A",
            f"At {ctx_last:,} tokens run B decodes {ratio_last:.3g}x as fast as run A"
            + (f"{said}{interval}." if said else
               f" (not enough requests for a verdict: {last.get('decode_n_a', 0)} in A, {last.get('decode_n_b', 0)} "
               f"in B; a verdict takes {MIN_REQUESTS} a side)."),
            "warning" if verdict == "slower" else "ok" if verdict == "faster" else "info",
            tuple(f"{r['context_tokens']:,} tokens: B/A decode tok/s = {r['decode_tok_s_ratio_b_a']:.3g}"
                  + (f", interval {r['decode_ratio_lo']:.3g}-{r['decode_ratio_hi']:.3g} over "
                     f"{r['decode_n_a']} / {r['decode_n_b']} requests" if r.get("decode_ratio_lo") is not None else
                     f" ({r.get('decode_n_a', 0)} / {r.get('decode_n_b', 0)} requests: no interval)") for r in dec)
            + (f"geometric mean over {len(dec)} common contexts: {geo:.3g}x (computed)",),
            {"decode_ratio_b_a_last": ratio_last, "decode_ratio_b_a_geomean": geo, "context_tokens_last": ctx_last,
             "decode_verdict_last": verdict},
            source))  # type: ignore[arg-type]
    if slope_a is not None and slope_b is not None:
        out.append(Finding(
            "compare.step_slope", "Step-time slope, run B vs run A",
            f"Each 1,000 tokens of context add {slope_b:.3g} ms per verify step in run B against {slope_a:.3g} ms "
            f"in run A ({slope_b / slope_a:.3g}x)." if slope_a else
            f"Step-time slopes: A {slope_a:.3g}, B {slope_b:.3g} ms per 1k tokens.",
            "info",
            (f"least-squares slope of the per-context median ms per step: A {slope_a:.4g}, B {slope_b:.4g} "
             f"ms per 1k tokens (computed)",),
            {"slope_a_ms_per_1k_tokens": slope_a, "slope_b_ms_per_1k_tokens": slope_b}, "computed"))
    tested = [r for r in sweep_cmp if r.get("step_verdict") and r["step_verdict"] != NOT_ENOUGH]
    if tested:
        by = {v: [r["context_tokens"] for r in tested if r["step_verdict"] == v] for v in ("slower", "faster", "tie")}
        short = [r["context_tokens"] for r in sweep_cmp if r.get("step_verdict") == NOT_ENOUGH]
        ctxs = lambda cs: ", ".join(f"{c:,}" for c in cs) or "none"  # noqa: E731
        out.append(Finding(
            "compare.step_time_test", "Is run B's verify step slower than run A's?",
            (f"Run B's step is slower than A's at {ctxs(by['slower'])} tokens" if by["slower"] else
             "Run B's step is slower than A's at no context")
            + f"; faster at {ctxs(by['faster'])}; a tie at {ctxs(by['tie'])} (the ratio of the requests' medians "
            "with its interval at the level it has; an interval that holds 1 is a tie)"
            + (f"; not enough requests at {ctxs(short)}." if short else "."),
            "warning" if by["slower"] else "ok" if by["faster"] else "info",
            tuple(f"{r['context_tokens']:,} tokens: B/A ms per step {r['step_ms_ratio_b_a']:.3g}, interval "
                  f"{r['step_ratio_lo']:.3g}-{r['step_ratio_hi']:.3g} over {r['step_n_a']} / {r['step_n_b']} requests"
                  for r in tested),
            {"slower_at": by["slower"], "faster_at": by["faster"], "tie_at": by["tie"], "not_enough_at": short},
            "computed"))
    changed = [f for f in findings_cmp if f["changed"]]
    out.append(Finding(
        "compare.verdicts", "Verdicts that changed",
        f"{len(changed)} of {len(findings_cmp)} findings differ in severity between the runs (or exist in one only).",
        "info",
        tuple(f"{f['id']}: {f['severity_a'] or 'absent'} -> {f['severity_b'] or 'absent'}" for f in changed[:10]),
        {"changed": len(changed), "findings": len(findings_cmp)}, "computed"))
    return out
