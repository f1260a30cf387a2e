"""Where a split_p1 call's time goes, from a run's ``kernel_anatomy`` rows (notebook 06, section 9; issue 13).

Pure functions from the rows :mod:`specdiag.kernels.anatomy` writes (with the run's ``kernel_ab_copy`` rows and
its measured copy bandwidth) to tables and findings. Nothing here measures. Times in us, rates in GB/s (1e9 B/s),
KV bytes as the kernel rows count them (n_kv x 1,152 B, bf16, each row once).

- :func:`fit_table`: each part's fixed cost and marginal rate (:func:`~specdiag.kernels.anatomy.anatomy_fits`), the
  rate also as % of the copy bandwidth.
- :func:`decomposition`: per case, the event-timed full call split by the torch profiler into the partial kernel's
  GPU time, the gap between the kernels and the merge kernel's GPU time, and the rest (``rest_us``: launch and timing
  overhead outside both kernels, full - (partial + gap + merge)); the partial kernel as its own programs see it in
  the timeline launch: median loop time (``loop_us``: tl_loop_p50), ``epilogue_us`` (done p50 - loop p50: the last
  partial tile, the partial write and the entry offset) and ``tail_us`` (span - done p50: what the slowest programs
  add), which add up to ``span_us``; beside them the read-only kernel of the same grid (``read_gather_us``), a
  plain copy of the same bytes (``copy_us``) and the time issue 13's bandwidth target allows (``target_us``: the
  case's KV bytes at the target's share of the copy bandwidth, :func:`~specdiag.kernels.analysis.issue13_bandwidth_target`).
  The profiler, the timeline and the event timings are separate launches of the same case: each stack adds up to
  its own total, not to the others'.
- :func:`fixed_cost_parts`: each column of the decomposition fitted over contexts (least squares on KV bytes). A
  least-squares intercept is linear in the data, so the parts' intercepts add up to the full call's (and the
  timeline's to its span's) when fitted on the same contexts: which parts make up the fixed cost.
- :func:`timeline_programs`: one timeline launch, per program, sorted by when it finished.
- :func:`anatomy_findings`: the verdicts, every number from the rows.
"""

from __future__ import annotations

import math
from typing import Any, Iterable, Mapping, Optional

import pandas as pd

from specdiag.findings import Finding
from specdiag.kernels.analysis import issue13_bandwidth_target
from specdiag.kernels.anatomy import PARTS, WS_PICK_RING, anatomy_fits
from specdiag.kernels.mla import BLOCK_TOKENS
from specdiag.plots import format_tokens
from specdiag.stats import fit_line

CASE = ["context_tokens", "heads", "draft_tokens"]
#: The event-timed full call, split by the profiler: these add up to ``full_us`` case by case.
FULL_PARTS: tuple[str, ...] = ("prof_partial_us", "prof_gap_us", "prof_merge_us", "rest_us")
#: The partial kernel's timeline launch: these add up to ``span_us`` case by case.
TIMELINE_PARTS: tuple[str, ...] = ("loop_us", "epilogue_us", "tail_us")
#: What the columns of :func:`decomposition` are, for tables and legends.
LABELS: dict[str, str] = {
    "full_us": "full call (events)", "prof_partial_us": "partial kernel (profiler)", "prof_gap_us": "gap between kernels",
    "prof_merge_us": "merge kernel (profiler)", "rest_us": "launch/timing overhead (rest)",
    "span_us": "partial span (timeline)", "loop_us": "loop p50 (timeline)", "epilogue_us": "epilogue (done p50 - loop p50)",
    "tail_us": "tail (span - done p50)", "read_gather_us": "read-only kernel, same grid", "copy_us": "copy of the same bytes",
    "target_us": "issue 13 target",
}


def measured_parts(rows: Iterable[Mapping[str, Any]]) -> pd.DataFrame:
    """The anatomy rows that measured a part (no error, not skipped, a part named), as a DataFrame."""
    df = pd.DataFrame(list(rows))
    if df.empty or "part" not in df:
        return pd.DataFrame()
    for col in ("error", "skipped"):
        if col not in df:
            df[col] = None
    return df[df["part"].notna() & df["error"].isna() & df["skipped"].isna()].reset_index(drop=True)


def unmeasured_parts(rows: Iterable[Mapping[str, Any]]) -> pd.DataFrame:
    """The anatomy rows that measured nothing, with why (the reason the tool gave, or the error)."""
    df = pd.DataFrame(list(rows))
    if df.empty:
        return df
    for col in ("error", "skipped", "part"):
        if col not in df:
            df[col] = None
    bad = df[df["error"].notna() | df["skipped"].notna()].copy()
    bad["why"] = bad["skipped"].fillna(bad["error"])
    return bad.reindex(columns=["part", *CASE, "why"]).reset_index(drop=True)


def fit_table(rows: Iterable[Mapping[str, Any]], copy_gbps: float) -> pd.DataFrame:
    """:func:`~specdiag.kernels.anatomy.anatomy_fits` with ``marginal_pct_copy`` (the rate as % of ``copy_gbps``;
    inf for parts whose time does not grow with the bytes, NaN without a copy bandwidth), parts in measuring order."""
    fits = anatomy_fits(rows)
    if fits.empty:
        return fits
    fits["marginal_pct_copy"] = 100 * fits["marginal_gbps"] / copy_gbps
    order = {p: i for i, p in enumerate(PARTS)}
    return fits.sort_values(["heads", "draft_tokens", "part"], key=lambda s: s.map(order) if s.name == "part" else s,
                            kind="stable").reset_index(drop=True)


def target_us(kv_bytes: float, target_pct: float, copy_gbps: float) -> float:
    """The time (us) in which ``kv_bytes`` stream at ``target_pct`` % of ``copy_gbps``."""
    return kv_bytes / (target_pct / 100 * copy_gbps * 1e9) * 1e6


def decomposition(rows: Iterable[Mapping[str, Any]], copy_rows: Iterable[Mapping[str, Any]],
                  copy_gbps: float) -> pd.DataFrame:
    """One row per case: where the full call's time goes (module doc), beside the read-only kernel, a copy of the same
    bytes and issue 13's target. Absent measurements (a part that failed, a profile or timeline not taken, no copy
    row, no target for the case, no copy bandwidth) are NaN."""
    df = measured_parts(rows)
    if df.empty:
        return pd.DataFrame()
    nan = float("nan")

    def part(name: str) -> pd.DataFrame:
        return df[df["part"] == name].drop_duplicates(CASE, keep="last").set_index(CASE)

    def col(frame: pd.DataFrame, key: tuple, field: str) -> float:
        if key not in frame.index or field not in frame.columns:
            return nan
        v = frame.at[key, field]
        return float(v) if v is not None and not pd.isna(v) else nan

    full, tl, rg = part("full"), part("timeline"), part("read_gather")
    cp = pd.DataFrame(list(copy_rows))
    if not cp.empty:
        cp = cp[cp["error"].isna()] if "error" in cp else cp
    copy_ms = dict(zip(cp["context_tokens"], cp["ms_median"])) if not cp.empty else {}
    out = []
    for key, g in df.groupby(CASE, sort=True):
        ctx, h, t = (int(k) for k in key)
        r: dict[str, Any] = {"context_tokens": ctx, "heads": h, "draft_tokens": t, "kv_bytes": float(g["kv_bytes"].iloc[0])}
        r["full_us"] = col(full, key, "us_median")
        for f in ("prof_partial_us", "prof_gap_us", "prof_merge_us"):
            r[f] = col(full, key, f)
        r["rest_us"] = r["full_us"] - (r["prof_partial_us"] + r["prof_gap_us"] + r["prof_merge_us"])
        r["span_us"] = col(tl, key, "tl_span_us")
        r["loop_us"] = col(tl, key, "tl_loop_p50_us")
        r["epilogue_us"] = col(tl, key, "tl_done_p50_us") - r["loop_us"]
        r["tail_us"] = r["span_us"] - col(tl, key, "tl_done_p50_us")
        r["read_gather_us"] = col(rg, key, "us_median")
        r["read_gather_p10_us"] = col(rg, key, "us_p10")
        r["read_gather_p90_us"] = col(rg, key, "us_p90")
        r["copy_us"] = 1e3 * float(copy_ms[ctx]) if ctx in copy_ms else nan
        tgt = issue13_bandwidth_target(ctx, h, t)
        r["target"] = tgt[0] if tgt else None
        r["target_pct"] = tgt[1] if tgt else nan
        r["target_us"] = target_us(r["kv_bytes"], tgt[1], copy_gbps) if tgt else nan
        r["full_over_target"] = r["full_us"] / r["target_us"]
        r["read_gather_over_target"] = r["read_gather_us"] / r["target_us"]
        out.append(r)
    return pd.DataFrame(out)


def fixed_cost_parts(decomp: pd.DataFrame) -> pd.DataFrame:
    """Per shape (heads, draft tokens) and column of the decomposition: least squares of the column on KV bytes over
    the contexts where the column's whole stack was measured (``full_us`` with :data:`FULL_PARTS`, ``span_us`` with
    :data:`TIMELINE_PARTS`; ``read_gather_us`` and ``copy_us`` alone). ``fixed_us``: the intercept; ``us_per_mb``:
    the slope (us per 1e6 KV bytes). Within a stack the parts' intercepts add up to the total's."""
    if decomp.empty:
        return pd.DataFrame()
    stacks = {"full_us": FULL_PARTS, "span_us": TIMELINE_PARTS, "read_gather_us": (), "copy_us": ()}
    out = []
    for (h, t), g in decomp.groupby(["heads", "draft_tokens"], sort=False):
        for total, parts in stacks.items():
            cols = [total, *parts]
            sel = g.dropna(subset=cols)
            if sel["context_tokens"].nunique() < 2:
                continue
            for c in cols:
                fit = fit_line(list(sel["kv_bytes"]), list(sel[c]))
                out.append({"heads": int(h), "draft_tokens": int(t), "stack": total, "column": c,
                            "contexts": int(sel["context_tokens"].nunique()), "fixed_us": fit.intercept,
                            "us_per_mb": 1e6 * fit.slope})
    return pd.DataFrame(out)


def timeline_programs(rows: Iterable[Mapping[str, Any]], context_tokens: int, heads: int,
                      draft_tokens: int) -> pd.DataFrame:
    """The per-program times of the case's timeline launch (``tl_raw``: the launch with the median span), one row
    per program sorted by done time (``rank`` 0 first): entry, loop end, done (us from the first entry), its SM,
    ``loop_us`` (entry to loop end) and ``after_loop_us`` (loop end to done). Empty when the case has no timeline."""
    df = measured_parts(rows)
    if df.empty or "tl_raw" not in df:
        return pd.DataFrame()
    sel = df[(df["part"] == "timeline") & (df["context_tokens"] == context_tokens) & (df["heads"] == heads)
             & (df["draft_tokens"] == draft_tokens) & df["tl_raw"].notna()]
    if sel.empty:
        return pd.DataFrame()
    raw = sel["tl_raw"].iloc[-1]
    out = pd.DataFrame({"program": range(len(raw["start_us"])), "start_us": raw["start_us"],
                        "loop_end_us": raw["loop_end_us"], "done_us": raw["done_us"], "sm": raw["sm"]})
    out["loop_us"] = out["loop_end_us"] - out["start_us"]
    out["after_loop_us"] = out["done_us"] - out["loop_end_us"]
    out = out.sort_values(["done_us", "program"], kind="stable").reset_index(drop=True)
    out["rank"] = range(len(out))
    return out


def _case_name(ctx: int, h: int, t: int) -> str:
    return f"{format_tokens(ctx)} H={h} T={t}"


def read_floor_finding(decomp: pd.DataFrame, context_tokens: int, heads: int, draft_tokens: int) -> Optional[Finding]:
    """The read-only kernel of split_p1's grid against issue 13's target time at one case; None when the case has no
    decomposition row, no read-only time or no target."""
    sel = decomp[(decomp["context_tokens"] == context_tokens) & (decomp["heads"] == heads)
                 & (decomp["draft_tokens"] == draft_tokens)] if not decomp.empty else decomp
    if sel.empty:
        return None
    r = sel.iloc[0]
    if not (math.isfinite(r["target_us"]) and math.isfinite(r["read_gather_us"]) and math.isfinite(r["full_us"])):
        return None
    case = _case_name(context_tokens, heads, draft_tokens)
    tgt, read, full = float(r["target_us"]), float(r["read_gather_us"]), float(r["full_us"])
    lo, hi = float(r["read_gather_p10_us"]), float(r["read_gather_p90_us"])
    if lo <= tgt <= hi:
        read_says = (f"its p10-p90 ({lo:.1f}-{hi:.1f} us) holds the target: the grid's loads alone, with no attention "
                     f"math, use the whole budget")
    elif read > tgt:
        read_says = (f"{read - tgt:.1f} us over it even at p10 ({lo:.1f} us): the grid's loads alone, with no attention "
                     f"math, miss the target")
    else:
        read_says = (f"{tgt - read:.1f} us under it even at p90 ({hi:.1f} us): the grid's loads alone fit the target, "
                     f"with {tgt - read:.1f} us to spare")
    met = full <= tgt
    verdict = (f"At {case}, issue 13's target ({r['target_pct']:g}% of copy) allows {tgt:.1f} us per call; the read-only "
               f"kernel of split_p1's own grid takes {read:.1f} us ({100 * (read / tgt - 1):+.1f}%), {read_says}. "
               + (f"The full call takes {full:.1f} us and meets it." if met else
                  f"The full call takes {full:.1f} us, {full - tgt:.1f} us over; it adds {full - read:.1f} us to the "
                  f"read-only kernel (the attention math and partial write, the gap, the merge, launch overhead)."))
    ev = [f"Target: {r['target']}; the case's {r['kv_bytes'] / 1e6:.1f} MB of KV at {r['target_pct']:g}% of the run's "
          f"copy bandwidth (computed).",
          f"Read-only kernel of the same grid, split and tile through the token table (read_gather): median {read:.2f} us, "
          f"p10 {lo:.2f}, p90 {hi:.2f} (measured, CUDA events, cold KV)."]
    if math.isfinite(r["copy_us"]):
        ev.append(f"A plain device copy moving the same bytes: {r['copy_us']:.2f} us (measured, kernel_ab_copy); the "
                  f"target is {tgt / r['copy_us']:.2f}x its time.")
    ev.append(f"Full call (split_p1, event-timed): {full:.2f} us = partial kernel {r['prof_partial_us']:.2f} + gap "
              f"{r['prof_gap_us']:.2f} + merge {r['prof_merge_us']:.2f} us (profiler GPU times) + {r['rest_us']:.2f} us "
              f"launch/timing overhead.")
    return Finding(
        id="kernel_ab.anatomy.read_floor",
        title=f"split_p1's grid without the math, against issue 13's target at {case}",
        verdict=verdict, severity="ok" if met else "warning", evidence=ev,
        numbers={"context_tokens": context_tokens, "heads": heads, "draft_tokens": draft_tokens, "target_us": tgt,
                 "target_pct": float(r["target_pct"]), "read_gather_us": read, "read_gather_p10_us": lo,
                 "read_gather_p90_us": hi, "copy_us": float(r["copy_us"]), "full_us": full},
        source="computed",
    )


def fixed_cost_finding(parts: pd.DataFrame, fits: pd.DataFrame, heads: int, draft_tokens: int) -> Optional[Finding]:
    """Which parts make up split_p1's fixed cost per call at one shape (intercepts over contexts, module doc); None
    without the full call's profiled stack over two or more contexts."""
    if parts.empty:
        return None
    p = parts[(parts["heads"] == heads) & (parts["draft_tokens"] == draft_tokens)]
    fx = {(s, c): float(v) for s, c, v in zip(p["stack"], p["column"], p["fixed_us"])}
    if ("full_us", "full_us") not in fx:
        return None
    n = int(p[p["stack"] == "full_us"]["contexts"].iloc[0])
    full = fx[("full_us", "full_us")]
    share = {c: fx[("full_us", c)] for c in FULL_PARTS}
    named = {"prof_partial_us": "the partial kernel's GPU time", "prof_gap_us": "the gap between the two kernels",
             "prof_merge_us": "the merge kernel's GPU time", "rest_us": "launch and timing overhead outside both kernels"}
    order = sorted(FULL_PARTS, key=lambda c: -share[c])
    verdict = (f"Of split_p1's {full:.1f} us fixed cost per call at H={heads} T={draft_tokens} (intercept over {n} "
               f"contexts), " + ", ".join(f"{named[c]} holds {share[c]:.1f} us" for c in order) + ".")
    ev = [f"Each part of the profiled full call fitted on KV bytes over the same contexts; least-squares intercepts add "
          f"up: {' + '.join(f'{share[c]:.2f}' for c in FULL_PARTS)} = {sum(share.values()):.2f} us."]
    numbers: dict[str, Any] = {"heads": heads, "draft_tokens": draft_tokens, "contexts": n, "full_fixed_us": full,
                               **{f"{c[:-3]}_fixed_us": share[c] for c in FULL_PARTS}}
    if ("span_us", "span_us") in fx:
        tl = {c: fx[("span_us", c)] for c in TIMELINE_PARTS}
        ev.append(f"The partial kernel as its programs see it (timeline launch): span fixed {fx[('span_us', 'span_us')]:.2f} "
                  f"us = loop p50 {tl['loop_us']:.2f} + epilogue {tl['epilogue_us']:.2f} + tail {tl['tail_us']:.2f} us.")
        numbers.update(span_fixed_us=fx[("span_us", "span_us")], **{f"{c[:-3]}_fixed_us": tl[c] for c in TIMELINE_PARTS})
    f = fits[(fits["heads"] == heads) & (fits["draft_tokens"] == draft_tokens)] if not fits.empty else fits
    ff = dict(zip(f["part"], f["fixed_us"])) if not f.empty else {}
    if all(k in ff for k in ("empty_1", "empty_2", "read_gather", "partial", "merge")):
        ev.append(f"Each part timed alone (fits of anatomy_fits): one empty launch of the partial's grid "
                  f"{ff['empty_1']:.2f} us, the two empty launches {ff['empty_2']:.2f} us; the read-only kernel of the "
                  f"same grid {ff['read_gather']:.2f} us fixed, the partial kernel {ff['partial']:.2f} us "
                  f"({ff['partial'] - ff['read_gather']:+.2f} us for the math and the partial write), the merge alone "
                  f"{ff['merge']:.2f} us.")
        numbers.update({f"{k}_alone_fixed_us": float(ff[k]) for k in ("empty_1", "empty_2", "read_gather", "partial", "merge")})
    return Finding(id="kernel_ab.anatomy.fixed_cost", title=f"What split_p1's fixed cost is made of (H={heads} T={draft_tokens})",
                   verdict=verdict, severity="info", evidence=ev, numbers=numbers, source="computed")


def ws_read_rings(rows: Iterable[Mapping[str, Any]], context_tokens: int, heads: int,
                  draft_tokens: int) -> pd.DataFrame:
    """The read-only kernel of the pick's launch shape at one case, one row per ring it was timed with (parts
    ``read_ws`` and ``read_ws_<block_n>x<stages>[t<round>]``, :func:`specdiag.kernels.anatomy.ws_read_part`): part,
    block_n, stages (64 x 2 where a row predates them: the pick's ring), round_tokens (the splits' round, 64 where a
    row predates it), median, p10 and p90 in us, fastest first."""
    df = measured_parts(rows)
    if df.empty:
        return pd.DataFrame()
    sel = df[df["part"].astype(str).str.startswith("read_ws") & (df["context_tokens"] == context_tokens)
             & (df["heads"] == heads) & (df["draft_tokens"] == draft_tokens)].drop_duplicates("part", keep="last")
    if sel.empty:
        return pd.DataFrame()
    out = pd.DataFrame({"part": sel["part"].astype(str),
                        "block_n": [int(b) if b is not None and not pd.isna(b) else WS_PICK_RING[0]
                                    for b in sel.get("block_n", pd.Series([None] * len(sel)))],
                        "stages": [int(x) if x is not None and not pd.isna(x) else WS_PICK_RING[1]
                                   for x in sel.get("stages", pd.Series([None] * len(sel)))],
                        "round_tokens": [int(x) if x is not None and not pd.isna(x) else BLOCK_TOKENS
                                         for x in sel.get("round_tokens", pd.Series([None] * len(sel)))],
                        "us_median": sel["us_median"].astype(float), "us_p10": sel["us_p10"].astype(float),
                        "us_p90": sel["us_p90"].astype(float)})
    return out.sort_values("us_median", kind="stable").reset_index(drop=True)


def ring_label(block_n: int, stages: int, round_tokens: int = BLOCK_TOKENS) -> str:
    """A ring of :func:`ws_read_rings` in words: ``64 x 2``, or ``64 x 2, splits rounded to 1 token`` where its
    splits are cut at another round than the tile's 64 tokens."""
    return f"{block_n} x {stages}" + _round_words(round_tokens)


def _round_words(round_tokens: int) -> str:
    """``, splits rounded to 1 token`` (16 tokens, ...); nothing for the tile's own 64."""
    if round_tokens == BLOCK_TOKENS:
        return ""
    return f", splits rounded to {round_tokens} token{'s' if round_tokens != 1 else ''}"


def ring_key(block_n: int, stages: int, round_tokens: int = BLOCK_TOKENS) -> str:
    """A ring's key in the finding's numbers: ``64x2``, ``64x2t1``."""
    return f"{block_n}x{stages}" + ("" if round_tokens == BLOCK_TOKENS else f"t{round_tokens}")


def pick_read_floor_finding(rows: Iterable[Mapping[str, Any]], decomp: pd.DataFrame, context_tokens: int, heads: int,
                            draft_tokens: int) -> Optional[Finding]:
    """The read-only kernel of the pick's launch shape (``read_ws``, and other rings where timed) against issue 13's
    target and the pick's own call (``pick_ws``) at one case; None without a ``read_ws`` row, a ``pick_ws`` row or a
    target at the case."""
    rows = list(rows)
    rings = ws_read_rings(rows, context_tokens, heads, draft_tokens)
    if rings.empty or "read_ws" not in set(rings["part"]) or decomp.empty:
        return None
    d = decomp[(decomp["context_tokens"] == context_tokens) & (decomp["heads"] == heads)
               & (decomp["draft_tokens"] == draft_tokens)]
    df = measured_parts(rows)
    pk = df[(df["part"] == "pick_ws") & (df["context_tokens"] == context_tokens) & (df["heads"] == heads)
            & (df["draft_tokens"] == draft_tokens)]
    if d.empty or pk.empty or not math.isfinite(float(d["target_us"].iloc[0])):
        return None
    r, p = d.iloc[0], pk.iloc[-1]
    tgt, pick, kernel = float(r["target_us"]), float(p["us_median"]), str(p.get("kernel") or "the pick")
    own = rings[rings["part"] == "read_ws"].iloc[0]
    best = rings.iloc[0]
    case = _case_name(context_tokens, heads, draft_tokens)
    read, lo, hi = float(own["us_median"]), float(own["us_p10"]), float(own["us_p90"])
    if lo > tgt:
        read_says = f"over it even at p10 ({lo:.1f} us): no kernel of this launch shape can meet the target"
    elif hi < tgt:
        read_says = f"under it even at p90 ({hi:.1f} us), leaving {tgt - read:.1f} us for the attention and the merge"
    else:
        read_says = f"its p10-p90 ({lo:.1f}-{hi:.1f} us) holds the target: the loads alone use the whole budget"
    verdict = (f"At {case}, issue 13's target ({r['target_pct']:g}% of copy) allows {tgt:.1f} us per call; the "
               f"read-only kernel of the pick's launch shape (one program per SM, a ring of two 64-token tiles, no math) "
               f"takes {read:.1f} us ({100 * (read / tgt - 1):+.1f}%), {read_says}. {kernel} takes {pick:.1f} us, "
               f"{pick - read:.1f} us over its own read floor" + (" and meets the target." if pick <= tgt else "."))
    others = rings[rings["part"] != "read_ws"]
    if not others.empty:
        if best["part"] == "read_ws":
            o = others.iloc[0]
            verdict += (f" None of the {len(others)} other rings timed reads faster (the nearest, "
                        f"{ring_label(int(o['block_n']), int(o['stages']), int(o['round_tokens']))}, "
                        f"{float(o['us_median']):.1f} us): neither more bytes in flight per SM nor another cut of the "
                        "splits lowers the floor.")
        else:
            verdict += (f" The fastest ring timed, "
                        f"{ring_label(int(best['block_n']), int(best['stages']), int(best['round_tokens']))}, reads it "
                        f"in {float(best['us_median']):.1f} us ({float(best['us_median']) - tgt:+.1f} us against the "
                        "target).")
    ev = [f"Target: {r['target']}; the case's {r['kv_bytes'] / 1e6:.1f} MB of KV at {r['target_pct']:g}% of the run's "
          f"copy bandwidth (computed)."]
    ev += [f"Read-only kernel, ring of {int(g.stages)} x {int(g.block_n)}-token tiles{_round_words(int(g.round_tokens))} "
           f"({g.part}): median "
           f"{g.us_median:.2f} us, p10 {g.us_p10:.2f}, p90 {g.us_p90:.2f} (measured, CUDA events, cold KV)."
           for g in rings.itertuples()]
    ev.append(f"{kernel} (pick_ws): median {pick:.2f} us, p10 {float(p['us_p10']):.2f}, p90 {float(p['us_p90']):.2f} "
              f"(measured, the same inputs).")
    if math.isfinite(float(r["copy_us"])):
        ev.append(f"A plain device copy moving the same bytes: {float(r['copy_us']):.2f} us (measured, kernel_ab_copy).")
    tl = df[(df["part"] == "timeline_ws") & (df["context_tokens"] == context_tokens) & (df["heads"] == heads)
            & (df["draft_tokens"] == draft_tokens)] if "tl_first_p50_us" in df else df.iloc[0:0]
    if not tl.empty:
        t = tl.iloc[-1]
        ev.append(f"Inside the read floor (timeline_ws, %globaltimer, medians of {int(t['tl_runs'])} launches): it spans "
                  f"{float(t['tl_span_us']):.1f} us on the GPU; each program's first tile lands "
                  f"{float(t['tl_first_p50_us']):.2f} us after it starts, the stream to its last tile takes "
                  f"{float(t['tl_stream_p50_us']):.2f} us and the last program ends {float(t['tl_tail_us']):.2f} us "
                  f"after the median one (measured).")
    return Finding(
        id="kernel_ab.anatomy.pick_read_floor",
        title=f"The pick's launch shape without the math, against issue 13's target at {case}",
        verdict=verdict, severity="ok" if pick <= tgt else "warning", evidence=ev,
        numbers={"context_tokens": context_tokens, "heads": heads, "draft_tokens": draft_tokens, "target_us": tgt,
                 "read_ws_us": read, "read_ws_p10_us": lo, "read_ws_p90_us": hi, "pick_us": pick,
                 "pick_over_read_ws_us": pick - read,
                 "fastest_ring": ring_key(int(best["block_n"]), int(best["stages"]), int(best["round_tokens"])),
                 "fastest_ring_us": float(best["us_median"]),
                 "rings_us": {ring_key(int(g.block_n), int(g.stages), int(g.round_tokens)): float(g.us_median)
                              for g in rings.itertuples()}},
        source="computed",
    )


def anatomy_findings(decomp: pd.DataFrame, parts: pd.DataFrame, fits: pd.DataFrame, context_tokens: int, heads: int,
                     draft_tokens: int, rows: Iterable[Mapping[str, Any]] = ()) -> list[Finding]:
    """The section's findings at the chosen case and its shape (those the rows can support); ``rows`` (the anatomy
    rows) add the pick's read floor where the run timed it (``anatomy --ws``)."""
    out = [read_floor_finding(decomp, context_tokens, heads, draft_tokens),
           pick_read_floor_finding(rows, decomp, context_tokens, heads, draft_tokens),
           fixed_cost_finding(parts, fits, heads, draft_tokens)]
    return [f for f in out if f is not None]


def finite_or_none(x: Any) -> Any:
    """A float for JSON: NaN and inf as None (strict JSON has neither)."""
    return float(x) if isinstance(x, (int, float)) and math.isfinite(float(x)) else None


def anatomy_metrics(fits: pd.DataFrame, decomp: pd.DataFrame, parts: pd.DataFrame) -> dict[str, Any]:
    """The section's key numbers, machine-readable, keyed ``P<context> h<heads> t<draft>`` / ``<part> h.. t..``."""
    num = [c for c in decomp.columns if c.endswith(("_us", "_pct", "_over_target"))] if not decomp.empty else []
    return {
        "cases": int(len(decomp)),
        "fits": {f"{r.part} h{r.heads} t{r.draft_tokens}": {"fixed_us": finite_or_none(r.fixed_us),
                                                           "marginal_gbps": finite_or_none(r.marginal_gbps),
                                                           "marginal_pct_copy": finite_or_none(r.marginal_pct_copy),
                                                           "r2": finite_or_none(r.r2)}
                 for r in fits.itertuples()} if not fits.empty else {},
        "decomposition": {f"P{int(r['context_tokens'])} h{int(r['heads'])} t{int(r['draft_tokens'])}":
                          {c: finite_or_none(r[c]) for c in num} for _, r in decomp.iterrows()},
        "fixed_cost_parts": {f"{r.column} h{r.heads} t{r.draft_tokens}": finite_or_none(r.fixed_us)
                             for r in parts.itertuples()} if not parts.empty else {},
    }
