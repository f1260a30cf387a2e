"""09 on DFLASH arms that differ only in the drafter's window: what the drafter costs without one (pure).

SGLang's DFLASH drafter attends its own cache of context features through the target's attention backend; with
``--speculative-draft-window-size`` it keeps only the last that many tokens, without it the drafter reads the whole
context each step. SGLang reports no drafter time of its own (03 says so), so where a run holds two arms that verify
alike (the same decode backend, plugin, algorithm and tokens per step) and differ in the draft window, the difference
of their verify steps is the drafter's cost beyond the window: per context, the unwindowed arm's ms per step over the
windowed arm's, a ratio of medians over requests with its interval (:func:`.analysis.compare_cells`: where the two
arms' requests came from several machines, a difference must also clear the spread between servers, and the row says
which rule it used), and the difference of the medians in ms (computed). Inside the window (a context shorter than
it) the two arms run the same work, so a difference there is the spread between their servers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import pandas as pd

from specdiag.findings import Finding
from specdiag.stats import NOT_ENOUGH
from specdiag.steps.engine_ab.analysis import compare_cells, step_spreads, tok
from specdiag.steps.engine_ab.arms import checks_verify, verify_path


@dataclass(frozen=True)
class WindowPair:
    windowed: str     #: the arm whose server states a draft window
    unwindowed: str   #: the arm that verifies alike with none
    window_tokens: int


def draft_window(record: Mapping[str, Any]) -> int | None:
    """The draft window an arm's server states (``speculative_draft_window_size``), None for none."""
    value = (record.get("server") or {}).get("speculative_draft_window_size")
    try:
        return int(value) if value not in (None, "", 0) else None
    except (TypeError, ValueError):
        return None


def window_pairs(arms_meta: Mapping[str, Any], arm_names: Sequence[str]) -> list[WindowPair]:
    """Each DFLASH arm without a draft window paired with the first arm that verifies alike with one."""
    recs = {a: dict(arms_meta.get(a) or {}) for a in arm_names if arms_meta.get(a)}
    dflash = {a: r for a, r in recs.items() if str((r.get("server") or {}).get("speculative_algorithm") or "").upper()
              == "DFLASH" and verify_path(r) is not None and not checks_verify(r)}
    out = []
    for a, r in dflash.items():
        if draft_window(r) is not None:
            continue
        twin = next((w for w, rw in dflash.items() if draft_window(rw) is not None and verify_path(rw) == verify_path(r)),
                    None)
        if twin:
            out.append(WindowPair(twin, a, int(draft_window(dflash[twin]) or 0)))
    return out


def window_table(dec: pd.DataFrame, pairs: Sequence[WindowPair]) -> pd.DataFrame:
    """Per pair and context both arms decoded: both medians (ms per step, measured), the unwindowed over the windowed
    (x, its interval and verdict over requests), the difference (ms, computed) and whether the context lies inside the
    window."""
    rows = []
    spreads = step_spreads(dec)
    for p in pairs:
        ctxs = sorted(set(dec.loc[dec["arm"] == p.windowed, "context_tokens"]) &
                      set(dec.loc[dec["arm"] == p.unwindowed, "context_tokens"])) if not dec.empty else []
        for c in ctxs:
            k = compare_cells(dec, p.windowed, p.unwindowed, c, spreads)
            rows.append({"windowed": p.windowed, "unwindowed": p.unwindowed, "window_tokens": p.window_tokens,
                         "context_tokens": int(c), "windowed_ms": k.median_a, "unwindowed_ms": k.median_b,
                         "ratio_x": k.ratio, "lo_x": k.lo, "hi_x": k.hi, "verdict": k.verdict,
                         "level": k.level, "interval": k.named_interval(), "rule": k.rule,
                         "requests": k.counts_text(), "extra_ms": (k.median_b or 0.0) - (k.median_a or 0.0),
                         "inside_window": int(c) <= p.window_tokens})
    return pd.DataFrame(rows)


def _cell_text(r: Any) -> str:
    interval = f", {r.interval}" if r.verdict != NOT_ENOUGH else ""
    said = {"higher": "slower without the window", "lower": "faster without the window", "tie": "a tie"}.get(
        r.verdict, r.verdict)
    return (f"{tok(r.context_tokens)}: {r.unwindowed_ms:.3g} against {r.windowed_ms:.3g} ms per step "
            f"({r.ratio_x:.3g}x{interval}, {r.requests}; {r.extra_ms:+.3g} ms): {said}; {r.rule}")


def window_finding(table: pd.DataFrame) -> Finding | None:
    """What the drafter costs without its window, at the longest context both arms decoded beyond the window."""
    if table.empty:
        return None
    first = table.iloc[0]
    g = table[(table["windowed"] == first["windowed"]) & (table["unwindowed"] == first["unwindowed"])]
    beyond = g[~g["inside_window"]]
    ev = [_cell_text(r) for r in g.itertuples()]
    ev.append("ms per verify step: measured, the median over each arm's requests; the ratio's interval: distribution-free "
              "over requests, at the level named (computed); inside the window the two arms run the same work")
    who = f"{first['unwindowed']} (no draft window) against {first['windowed']} ({first['window_tokens']:,} tokens)"
    if beyond.empty:
        return Finding("engine_ab.draft_window", "The draft window: no context beyond it measured",
                       f"{who}: every context both decoded lies inside the window, so the drafter reads the same "
                       "there.", "info", ev, {}, "computed")
    r = beyond.iloc[-1]
    numbers = {"windowed": r["windowed"], "unwindowed": r["unwindowed"], "window_tokens": int(r["window_tokens"]),
               "context_tokens": int(r["context_tokens"]), "ratio_x": float(r["ratio_x"]),
               "lo_x": None if r["lo_x"] is None else float(r["lo_x"]),
               "hi_x": None if r["hi_x"] is None else float(r["hi_x"]), "extra_ms": float(r["extra_ms"]),
               "level": r["level"], "rule": r["rule"], "verdict": r["verdict"],
               "by_context": {str(int(x.context_tokens)): {"ratio_x": x.ratio_x, "lo_x": x.lo_x, "hi_x": x.hi_x,
                                                           "extra_ms": x.extra_ms, "verdict": x.verdict,
                                                           "rule": x.rule} for x in g.itertuples()}}
    at = tok(int(r["context_tokens"]))
    if r["verdict"] == NOT_ENOUGH:
        verdict = (f"{who}: {r['ratio_x']:.3g}x the windowed step at {at}; not enough requests to judge it (3 a cell).")
    elif r["verdict"] == "higher":
        verdict = (f"Without the draft window the drafter reads the whole context: {who}, a verify step takes "
                   f"{r['unwindowed_ms']:.3g} ms at {at} against {r['windowed_ms']:.3g} ({r['ratio_x']:.3g}x, "
                   f"{r['interval']} over requests; {r['rule']}; {r['extra_ms']:+.3g} ms a step, the drafter's "
                   f"reading beyond the window). Keep the window on.")
    else:
        noise = ("the spread between servers" if r["rule"].startswith("several") and r["lo_x"] is not None
                 and not r["lo_x"] <= 1.0 <= r["hi_x"] else "the requests' noise")
        verdict = (f"{who}: at {at} the two steps tie inside {noise} ({r['ratio_x']:.3g}x, {r['interval']}; "
                   f"{r['rule']}): the window buys nothing measurable there.")
    return Finding("engine_ab.draft_window", f"The draft window at {at}: {r['ratio_x']:.3g}x without it", verdict,
                   "warning" if r["verdict"] == "higher" and r["ratio_x"] >= 1.2 else "info", ev, numbers,
                   "computed")
