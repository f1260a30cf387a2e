"""09's and 10's verdicts computed from a recorded run's rows with the calls the notebooks make (no papermill): what
tests/test_recorded_verdicts.py asserts and tests/test_quoted_figures.py checks the docs' figures against."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

import pandas as pd

from specdiag.paths import REFERENCE_DIR
from specdiag.runs import Run


@dataclass
class Judged09:
    """What 09 judges of one run (the page's calls, in its order)."""

    rows: list[dict[str, Any]]
    meta: dict[str, Any]
    df: pd.DataFrame
    dec: pd.DataFrame
    pre: pd.DataFrame
    bands: pd.DataFrame
    card: pd.DataFrame
    targets: pd.DataFrame
    brk: Any
    window: pd.DataFrame
    answers: list[Any]
    found: dict[str, Any] = field(default_factory=dict)


@lru_cache(maxsize=8)  # one computation per test process and run (the judged tables are only read)
def judge_09(name: str, stock_arm: str = "triton", plugin_arm: str = "triton_plugin",
             band_edges: tuple[int, ...] = (8192, 65536), layers: int = 61) -> Judged09:
    from specdiag.steps.engine_ab import analysis, answer, breakeven, measure, verdicts, window
    from specdiag.steps.engine_ab.arms import checks_verify, verify_arms

    run = Run.open(REFERENCE_DIR / name)
    rows, meta = run.rows("engine_ab"), dict(run.meta.get("arms") or {})
    df = analysis.frame(measure.main_rows(rows))
    arms = analysis.arm_order(df, meta)
    dec, pre = analysis.decode_table(df), analysis.prefill_table(df)
    bands = analysis.band_verdicts(dec, pre, meta, band_edges)
    spec = verify_arms(meta, arms)
    card = analysis.scorecard(dec, pre, [a for a in spec if not checks_verify(meta.get(a) or {})], stock_arm)
    keep = (lambda d: d[d["arm"].isin(spec)] if not d.empty else d)
    tt = analysis.targets(keep(dec), keep(pre), spec, layers, stock_arm, plugin_arm, meta, card)
    brk = breakeven.analyse(rows, meta, arms, run.rows("commit_probe"), dict(run.meta.get("server") or {}))
    win = window.window_table(dec, window.window_pairs(meta, list(dict.fromkeys(dec["arm"]))))
    found_answers = answer.answers(df, dec, pre, meta, brk.recall)
    found = verdicts.findings(dec, pre, {}, bands, tt, analysis.lacks(df, arms), meta, stock_arm, plugin_arm,
                              answer=answer.answer_finding(found_answers), card=card)
    found.append(verdicts.break_even_finding(brk.pairs, brk.off_arms, brk.evens, brk.best_drafts, brk.computed_note,
                                             brk.recall))
    return Judged09(rows, meta, df, dec, pre, bands, card, tt, brk, win, found_answers, {f.id: f for f in found})


@dataclass
class Judged10:
    rows: list[dict[str, Any]]
    cost: pd.DataFrame
    three: pd.DataFrame
    found: dict[str, Any]


@lru_cache(maxsize=8)
def judge_10(name: str) -> Judged10:
    from specdiag.steps.kv_layout import analysis as kla
    from specdiag.steps.kv_layout import tier0

    rows = Run.open(REFERENCE_DIR / name).rows("kv_layout")
    cost, three = kla.costs(rows), tier0.three_states(rows)
    found = kla.findings(cost, kla.kernel_prediction([]), missing=kla.gaps(rows)) + tier0.findings(three)
    return Judged10(rows, cost, three, {f.id: f for f in found})
