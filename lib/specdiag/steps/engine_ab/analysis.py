"""09's numbers from an engine A/B run's ``engine_ab`` rows (:mod:`.measure`): pure functions, no I/O.

Per arm and context:

- **decode** (``phase`` "decode", the prompt served from the prefix cache): the median ms per verify step (measured:
  the decode window over the verify steps in it) and its samples, decode tokens/s (computed), the commit length of
  the first request and of the later ones. Repeats on the same prompt let NGRAM draft from the arm's own earlier
  output of that prompt (commit 7.5 where the first request commits 1.0-1.5): their tokens/s is not the arm's on
  fresh text, so **ms per step is the comparable number** (every arm verifies the same tokens per step).
- **prefill** (``phase`` "prefill", a prompt no cache held): TTFT (measured) and prompt tokens/s (computed). A TTFT
  is the arm's **own** only when it ran alone on a warm server: a row with ``concurrent`` > 1 (other arms prefilling
  on the same GPU), one another arm's request overlapped, one that reused cached tokens, or the run's first request
  to the server (``first_on_server``: FlashInfer compiles kernels at its first prefill, 10 s at 1k on the H200) is
  flagged and used only where the arm has no own one, and then said so.
- **overlap**: a row measured while a request of another arm was in flight (from the rows' send times and their
  durations; a failed row without a duration counts as in flight until the rows written after it ended, since a
  row is written when its request ends). A decode row that overlapped is not a clean decode.

Across arms: the rank test per context (:func:`specdiag.stats.median_diff_test` on the step-time samples of the
fastest arm against each other arm), the verdict per context band (the fastest arm, by how much, what it costs in
prefill and memory), and the three targets of :data:`TARGETS`, each judged once, on the scorecard's intervals.

**The server as a unit**: every comparison of two cells goes through :func:`compare_cells`
(:func:`specdiag.spread.compare_across`): requests of one machine are compared as they are; requests from several
(the calls of a merged run) must also clear the spread between servers (:func:`step_spreads`, :func:`ttft_spreads`:
the run's own, per context), and the comparison says which rule it used (``rule``).
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Sequence

import pandas as pd

from specdiag.plots import format_tokens
from specdiag.spread import (
    Sample, Spread, compare_across, inside_spread, machine_of, server_of, server_spreads, widened)
from specdiag.stats import NOT_ENOUGH, RequestComparison, median_diff_test
from specdiag.steps.engine_ab.arms import checks_verify, step_sizes, verify_arms, verify_path

CTX_1K, CTX_64K, CTX_128K = 1024, 65536, 131072


def _f(v: Any) -> float | None:
    try:
        x = float(v)
    except (TypeError, ValueError):
        return None
    return x if math.isfinite(x) else None


def tok(n: Any) -> str:
    """A context as pages write it: 1k, 64k, 128k."""
    return format_tokens(float(n))


# ---------------------------------------------------------------------------------------------------------------------
# Rows
# ---------------------------------------------------------------------------------------------------------------------

def overlaps(rows: Sequence[Mapping[str, Any]]) -> list[list[str]]:
    """For each row (file order), the other arms that had a request in flight during it (module doc)."""
    spans: list[tuple[float, float] | None] = []
    ended = -math.inf  # the latest known end of the rows written so far
    for r in rows:
        t0, d = _f(r.get("ts_unix_s")), _f(r.get("e2e_s"))
        if t0 is None:
            spans.append(None)
            continue
        t1 = t0 + d if d is not None else max(t0, ended)  # unknown: at least until the rows before it ended
        spans.append((t0, t1))
        ended = max(ended, t1)
    out: list[list[str]] = []
    for i, r in enumerate(rows):
        hits: list[str] = []
        if spans[i] is not None:
            a0, a1 = spans[i]  # type: ignore[misc]
            for j, o in enumerate(rows):
                if j == i or spans[j] is None or o.get("arm") == r.get("arm"):
                    continue
                b0, b1 = spans[j]  # type: ignore[misc]
                if a0 < b1 and b0 < a1 and str(o.get("arm")) not in hits:
                    hits.append(str(o.get("arm")))
        out.append(hits)
    return out


def frame(rows: Sequence[Mapping[str, Any]]) -> pd.DataFrame:
    """The rows as a frame in file order, with ``overlapped_by`` (other arms in flight, :func:`overlaps`) and
    ``first_on_server`` (the first request a server answered: its arm's first row of the part)."""
    rows = list(rows)
    df = pd.DataFrame(rows)
    if df.empty:
        return pd.DataFrame(columns=["arm", "phase", "context_tokens", "overlapped_by", "error"])
    df["overlapped_by"] = overlaps(rows)
    # one server per arm and part: an arm's first row of a part is the first request its server answered
    df["first_on_server"] = ~df.duplicated(["part", "arm"] if "part" in df else ["arm"])
    for col in ("concurrent", "cached_tokens", "step_ms", "ttft_s", "error", "commit_length", "decode_tok_s"):
        if col not in df:
            df[col] = None
    return df


def arm_order(df: pd.DataFrame, arms_meta: Mapping[str, Any] | None = None) -> list[str]:
    """Arms in run.json order, then any other arm the rows name."""
    named = list(arms_meta or {})
    return named + [a for a in dict.fromkeys(df.get("arm", pd.Series(dtype=str)).dropna().astype(str)) if a not in named]


def _ok(df: pd.DataFrame, phase: str) -> pd.DataFrame:
    if df.empty:
        return df
    sel = df[(df["phase"] == phase) & df["error"].isna()]
    return sel[sel["step_ms" if phase == "decode" else "ttft_s"].notna()]


def decode_table(df: pd.DataFrame) -> pd.DataFrame:
    """One row per arm and context of the decode rows (module doc): ``step_ms`` (median, ms per verify step),
    ``step_ms_samples``, ``server_step_ms`` (the median of each server's requests, by part, where a merged run's
    requests came from two or more), ``n``, ``decode_tok_s`` (median), ``decode_tok_s_first`` (the first request),
    ``commit_first`` and ``commit_later`` (median of the later ones), ``cached_tokens`` (median), ``overlapped`` (rows another arm's
    request overlapped), ``clean`` (none did); ``step_units`` and ``tok_s_units``: each request's ms per step and
    decode tokens/s with the server and machine it came from (:class:`specdiag.spread.Sample`)."""
    cols = ["arm", "context_tokens", "n", "step_ms", "step_ms_samples", "server_step_ms", "decode_tok_s",
            "decode_tok_s_first", "commit_first", "commit_later", "cached_tokens", "overlapped", "overlapped_by",
            "clean", "step_units", "tok_s_units"]
    d = _ok(df, "decode")
    out = []
    for (arm, ctx), g in d.groupby(["arm", "context_tokens"], sort=False):
        g = g.sort_values("repeat") if "repeat" in g else g
        steps = [float(x) for x in g["step_ms"]]
        later = [float(x) for x in g["commit_length"].iloc[1:] if _f(x) is not None]
        by = sorted({a for hits in g["overlapped_by"] for a in hits})
        n_over = int(sum(1 for hits in g["overlapped_by"] if hits))
        servers = ({str(c): statistics.median(float(x) for x in h["step_ms"]) for c, h in g.groupby("part")}
                   if "part" in g and g["part"].nunique() > 1 else {})
        out.append({"arm": arm, "context_tokens": int(ctx), "n": len(g), "step_ms": statistics.median(steps),
                    "step_ms_samples": steps, "server_step_ms": servers,
                    "decode_tok_s": statistics.median([float(x) for x in g["decode_tok_s"] if _f(x) is not None]
                                                      or [math.nan]),
                    "decode_tok_s_first": _f(g["decode_tok_s"].iloc[0]), "commit_first": _f(g["commit_length"].iloc[0]),
                    "commit_later": statistics.median(later) if later else None,
                    "cached_tokens": statistics.median([float(x) for x in g["cached_tokens"] if _f(x) is not None]
                                                       or [math.nan]),
                    "overlapped": n_over, "overlapped_by": by, "clean": n_over == 0,
                    "step_units": [Sample(float(r["step_ms"]), server_of(r), machine_of(r))
                                   for r in g.to_dict("records")],
                    "tok_s_units": [Sample(float(r["decode_tok_s"]), server_of(r), machine_of(r))
                                    for r in g.to_dict("records") if _f(r.get("decode_tok_s")) is not None]})
    return pd.DataFrame(out, columns=cols)


def _not_own(r: Mapping[str, Any]) -> str:
    """Why a prefill row's TTFT is not the arm's own ('' when it is)."""
    why = []
    if (_f(r.get("concurrent")) or 1) > 1:
        why.append(f"{int(r['concurrent'])} arms prefilling at once (concurrent {int(r['concurrent'])})")
    if r.get("overlapped_by") and not (_f(r.get("concurrent")) or 1) > 1:
        why.append(f"overlapped by {', '.join(r['overlapped_by'])}")
    if (_f(r.get("cached_tokens")) or 0) > 0:
        why.append(f"{int(r['cached_tokens']):,} prompt tokens served from the cache")
    if r.get("first_on_server"):
        why.append("the run's first request to this server (it may carry one-time kernel compilation)")
    return "; ".join(why)


def prefill_table(df: pd.DataFrame) -> pd.DataFrame:
    """One row per arm and context of the prefill rows: ``ttft_s`` (median of the arm's own rows, else of the
    flagged ones), ``ttft_s_samples`` (the rows used), ``prefill_tok_s``, ``own`` (True: measured alone),
    ``why_not_own``, ``concurrent`` (the most arms prefilling at once among the rows used), ``n``, ``ttft_units``
    (each TTFT used with its server and machine)."""
    cols = ["arm", "context_tokens", "n", "ttft_s", "ttft_s_samples", "prefill_tok_s", "own", "why_not_own",
            "concurrent", "ttft_units"]
    p = _ok(df, "prefill")
    out = []
    for (arm, ctx), g in p.groupby(["arm", "context_tokens"], sort=False):
        recs = g.to_dict("records")
        own = [r for r in recs if not _not_own(r)]
        use = own or recs
        ttft = statistics.median(float(r["ttft_s"]) for r in use)
        out.append({"arm": arm, "context_tokens": int(ctx), "n": len(use), "ttft_s": ttft,
                    "ttft_s_samples": [float(r["ttft_s"]) for r in use], "prefill_tok_s": int(ctx) / ttft if ttft > 0 else None, "own": bool(own),
                    "why_not_own": "" if own else "; ".join(dict.fromkeys(_not_own(r) for r in recs)),
                    "concurrent": int(max((_f(r.get("concurrent")) or 1) for r in use)),
                    "ttft_units": [Sample(float(r["ttft_s"]), server_of(r), machine_of(r)) for r in use]})
    return pd.DataFrame(out, columns=cols)


def _cell(table: pd.DataFrame, arm: str, ctx: int) -> dict[str, Any] | None:
    if table.empty:
        return None
    sel = table[(table["arm"] == arm) & (table["context_tokens"] == ctx)]
    return sel.iloc[0].to_dict() if not sel.empty else None


def units(table: pd.DataFrame, arm: str, ctx: int, col: str = "step_units") -> list[Sample]:
    """One cell's requests with their servers and machines (``step_units``, ``tok_s_units`` of :func:`decode_table`,
    ``ttft_units`` of :func:`prefill_table`); [] where the cell is missing."""
    c = _cell(table, arm, ctx)
    return list((c or {}).get(col) or []) if c and isinstance(c.get(col), list) else []


def _spreads(table: pd.DataFrame, col: str, unit: str) -> dict[int, Spread]:
    if table.empty or col not in table:
        return {}
    cells = {(str(r["arm"]), int(r["context_tokens"])): list(r[col] or []) for r in table.to_dict("records")}
    return server_spreads(cells, unit, tok)  # type: ignore[return-value]


def step_spreads(dec: pd.DataFrame) -> dict[int, Spread]:
    """The spread between servers per context, from every arm's ms per verify step (:mod:`specdiag.spread`)."""
    return _spreads(dec, "step_units", "ms")


def ttft_spreads(pre: pd.DataFrame) -> dict[int, Spread]:
    """The spread between servers per context, from every arm's TTFTs."""
    return _spreads(pre, "ttft_units", "s")


def compare_cells(table: pd.DataFrame, a: str, b: str, ctx: int, spreads: Mapping[int, Spread] | None = None,
                  col: str = "step_units") -> RequestComparison:
    """Arm ``b`` against arm ``a`` at ``ctx`` over requests with the server as a unit
    (:func:`specdiag.spread.compare_across`); ``spreads`` from the whole run (:func:`step_spreads`), else from
    ``table``."""
    if spreads is None:
        spreads = _spreads(table, col, "")
    return compare_across(units(table, a, ctx, col), units(table, b, ctx, col), spreads.get(int(ctx)))


def lacks(df: pd.DataFrame, arms: Sequence[str]) -> list[str]:
    """What the run does not hold, from its rows: arms without decode or without any own TTFT, decode rows another
    arm overlapped, failed rows (one sentence each)."""
    out = []
    dec, pre = decode_table(df), prefill_table(df)
    for a in arms:
        if dec.empty or a not in set(dec["arm"]):
            out.append(f"{a}: no decode row (ms per step, decode tokens/s) at any context")
        flagged = pre[(pre["arm"] == a) & ~pre["own"]] if not pre.empty else pre
        if not flagged.empty:
            out.append(f"{a}: TTFT not its own at {', '.join(tok(c) for c in flagged['context_tokens'])} "
                       f"({'; '.join(dict.fromkeys(flagged['why_not_own']))})")
    for r in dec[~dec["clean"]].itertuples() if not dec.empty else ():
        out.append(f"{r.arm} at {tok(r.context_tokens)}: {r.overlapped} of {r.n} decode rows measured while "
                   f"{', '.join(r.overlapped_by)} had a request in flight (not a clean decode)")
    if not df.empty:
        for r in df[df["error"].notna()].itertuples():
            out.append(f"{r.arm} {r.phase} at {tok(r.context_tokens)}: failed ({str(r.error)[:120]})")
    return out


def step_grid(dec: pd.DataFrame, arms: Sequence[str]) -> pd.DataFrame:
    """Median ms per verify step, contexts down (``context``, as 1k, 128k...), arms across in ``arms`` order."""
    step = dec.pivot_table(index="context_tokens", columns="arm", values="step_ms", aggfunc="first")
    step = step.reindex(columns=[a for a in arms if a in step.columns])
    step.index = [tok(c) for c in step.index]
    return step.rename_axis("context").reset_index()


def _times_text(x: float) -> str:
    return f"{x:,.0f}" if x >= 100 else f"{x:.3g}"


def ttft_grid(floors: pd.DataFrame, arms: Sequence[str]) -> pd.DataFrame:
    """Each arm's TTFT and how many times its floor (``"1.2 s, 35x floor"``, `` *`` when not the arm's own), contexts
    down, arms across, the floor (s, the least over arms) first; from :func:`verdicts.prefill_floors`' table."""
    cells = floors.assign(cell=[f"{t:,.3g} s, {_times_text(x)}x floor" + ("" if o else " *")
                                for t, x, o in zip(floors["ttft_s"], floors["ttft_over_floor_x"], floors["own"])])
    grid = cells.pivot_table(index="context_tokens", columns="arm", values="cell", aggfunc="first")
    grid = grid.reindex(columns=[a for a in arms if a in grid.columns])
    grid.insert(0, "floor (s, computed)", floors.groupby("context_tokens")["floor_s"].min())
    grid.index = [tok(c) for c in grid.index]
    return grid.rename_axis("context")


def floor_verdicts(floors: pd.DataFrame) -> pd.DataFrame:
    """The floors' table with ``verdict``: "N x its floor", prefixed "not its own: " for a TTFT that is not the arm's."""
    return floors.assign(verdict=[("" if o else "not its own: ") + (f"{x:,.3g} x its floor" if x == x else "-")
                                  for o, x in zip(floors["own"], floors["ttft_over_floor_x"])])


# ---------------------------------------------------------------------------------------------------------------------
# Across arms
# ---------------------------------------------------------------------------------------------------------------------

def rank_tests(dec: pd.DataFrame, alpha: float = 0.05) -> pd.DataFrame:
    """Per context, the fastest arm (lowest median ms per step) against each other arm: the difference of medians
    (ms, other - fastest), the exact one-sided p that the other is slower, and the verdict ("slower",
    "indistinguishable", or "not testable" with fewer than two requests in either arm)."""
    cols = ["context_tokens", "fastest", "other", "fastest_ms", "other_ms", "diff_ms", "ratio_x", "p_slower", "verdict"]
    out = []
    for ctx, g in dec.groupby("context_tokens") if not dec.empty else ():
        if len(g) < 2:
            continue
        best = g.loc[g["step_ms"].idxmin()]
        for r in g.itertuples():
            if r.arm == best["arm"]:
                continue
            a, b = list(best["step_ms_samples"]), list(r.step_ms_samples)
            row = {"context_tokens": int(ctx), "fastest": best["arm"], "other": r.arm, "fastest_ms": best["step_ms"],
                   "other_ms": r.step_ms, "diff_ms": r.step_ms - best["step_ms"], "ratio_x": r.step_ms / best["step_ms"]}
            if len(a) < 2 or len(b) < 2 or len(a) > 60 or len(b) > 60:
                row.update(p_slower=None, verdict=f"not testable ({len(a)} and {len(b)} requests; needs 2-60 each)")
            else:
                t = median_diff_test(a, b, alpha)
                row.update(p_slower=t.p_higher, verdict="slower" if t.verdict == "higher" else
                           "faster" if t.verdict == "lower" else "indistinguishable")
            out.append(row)
    return pd.DataFrame(out, columns=cols)


def band_of(ctx: int, edges: Sequence[int]) -> int:
    """Index of the band a context falls in: band i holds contexts in (edges[i-1], edges[i]]."""
    return sum(1 for e in sorted(edges) if ctx > e)


def band_label(i: int, edges: Sequence[int]) -> str:
    e = sorted(edges)
    if not e:
        return "all contexts"
    if i == 0:
        return f"up to {tok(e[0])}"
    if i == len(e):
        return f"above {tok(e[-1])}"
    return f"{tok(e[i - 1])} to {tok(e[i])}"


def _geomean(xs: Iterable[float]) -> float:
    xs = list(xs)
    return math.exp(sum(math.log(x) for x in xs) / len(xs))


def _against_runner_up(sel: pd.DataFrame, best: str, second: str, ctxs: Sequence[int],
                       spreads: Mapping[int, Spread] | None = None) -> str:
    """The band's pick over requests: at each context, the runner-up's ms per step against the fastest arm's
    (:func:`compare_cells`: requests of one machine compared, requests from several also set against the spread
    between servers). Starts "faster" where each context's verdict is "higher", "tie" where one is a tie (or lower),
    "not enough requests" where a cell has fewer than 3; then each context's ratio, interval, requests and rule."""
    parts, verdicts = [], []
    for c in ctxs:
        k = compare_cells(sel, best, second, c, spreads)
        verdicts.append("servers" if inside_spread(k) else k.verdict)
        parts.append(f"{tok(c)} {k.ratio:.3g}x" + (f", {k.named_interval()}" if k.enough else "")
                     + f", {k.counts_text()}; {k.rule}" if k.ratio else f"{tok(c)} -")
    detail = "; ".join(parts)
    if NOT_ENOUGH in verdicts:
        return f"not enough requests to judge it (3 a cell): {detail}"
    if all(v == "higher" for v in verdicts):
        return f"faster at every context: {detail}"
    if "lower" in verdicts:
        return f"tie, neither faster at every context: {detail}"
    if "tie" not in verdicts:
        return f"tie inside the spread between servers: {detail}"
    return f"tie inside the requests' noise: {detail}"


def band_verdicts(dec: pd.DataFrame, pre: pd.DataFrame, arms_meta: Mapping[str, Any], edges: Sequence[int]
                  ) -> pd.DataFrame:
    """Per context band: the fastest arm (the lowest geometric mean of its median ms per step over the band's
    contexts that two or more arms decoded, among the arms that decoded every one of them), the runner-up and by how
    much (x, the same mean), the fastest arm's TTFT at the band's longest context against the shortest TTFT there
    (x; own or flagged), its KV pool (tokens, server-reported) and memory fraction, and the verdict in words."""
    cols = ["band", "contexts", "arms", "fastest", "fastest_ms", "runner_up", "by_x", "against_runner_up", "ttft_s",
            "ttft_own", "ttft_vs_best_x", "kv_pool_tokens", "mem_fraction_static", "verdict"]
    out = []
    spreads = step_spreads(dec)  # the whole run's servers, before the arms are narrowed
    if not dec.empty:  # step against step: only verify steps (speculation-off arms are compared in tokens/s)

        keep = verify_arms(arms_meta, list(dict.fromkeys(dec["arm"])))
        dec, pre = dec[dec["arm"].isin(keep)], pre[pre["arm"].isin(keep)] if not pre.empty else pre
    if dec.empty:
        return pd.DataFrame(out, columns=cols)
    bands = sorted({band_of(int(c), edges) for c in dec["context_tokens"]})
    for b in bands:
        sel = dec[[band_of(int(c), edges) == b for c in dec["context_tokens"]]]
        counts = sel.groupby("context_tokens")["arm"].nunique()
        ctxs = sorted(int(c) for c, n in counts.items() if n >= 2)
        row: dict[str, Any] = {"band": band_label(b, edges), "contexts": [tok(c) for c in ctxs]}
        full = [a for a in dict.fromkeys(sel["arm"]) if all(_cell(sel, a, c) for c in ctxs)] if ctxs else []

        sizes = step_sizes(arms_meta, full)
        if len(full) >= 2 and len({k for k in sizes.values() if k is not None}) > 1:
            row.update(arms=full, verdict="not comparable per step: " + ", ".join(f"{a} verifies {k}" for a, k in
                                                                                    sizes.items())
                       + " tokens a step (the break-even's draft lengths compare them in tokens/s)")
            out.append(row)
            continue
        if len(full) < 2:
            only = sorted(set(sel["arm"]))
            row.update(arms=only, verdict=f"not comparable: {'only ' + ', '.join(only) if only else 'no arm'} "
                       f"decoded here ({', '.join(tok(c) for c in sorted(set(sel['context_tokens'])))})")
            out.append(row)
            continue
        mean = {a: _geomean(float(_cell(sel, a, c)["step_ms"]) for c in ctxs) for a in full}  # type: ignore[index]
        ranked = sorted(full, key=lambda a: mean[a])
        best, second = ranked[0], ranked[1]
        by = mean[second] / mean[best]
        longest = ctxs[-1]
        p_best = _cell(pre, best, longest)
        others = pre[pre["context_tokens"] == longest] if not pre.empty else pre
        srv = dict((arms_meta.get(best) or {}).get("server") or {})
        row.update(arms=full, fastest=best, fastest_ms=mean[best], runner_up=second, by_x=by,
                   ttft_s=p_best["ttft_s"] if p_best else None, ttft_own=p_best["own"] if p_best else None,
                   ttft_vs_best_x=(p_best["ttft_s"] / float(others["ttft_s"].min())) if p_best and not others.empty
                   else None, kv_pool_tokens=srv.get("max_total_num_tokens"),
                   mem_fraction_static=srv.get("mem_fraction_static"))
        cost = ("no TTFT of it at " + tok(longest) if not p_best else
                f"its TTFT at {tok(longest)} is {p_best['ttft_s']:,.3g} s"
                + (f", {row['ttft_vs_best_x']:.3g}x the shortest there" if row["ttft_vs_best_x"] and
                   row["ttft_vs_best_x"] > 1.005 else ", the shortest there")
                + ("" if p_best["own"] else " (not its own: " + p_best["why_not_own"] + ")"))
        judged = _against_runner_up(sel, best, second, ctxs, spreads)
        row["against_runner_up"] = judged
        over = ", ".join(tok(c) for c in ctxs)
        if judged.startswith("tie"):
            row["verdict"] = (f"{best} and {second} {judged} ({second} over {best}; {best}'s geometric mean over {over} "
                              f"is {by:.3g}x lower); {cost}")
        else:
            row["verdict"] = (f"{best} is fastest, {by:.3g}x faster per verify step than {second} (geometric mean over "
                              f"{over}); {judged}; {cost}")
        out.append(row)
    return pd.DataFrame(out, columns=cols)


# ---------------------------------------------------------------------------------------------------------------------
# Targets
# ---------------------------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Target:
    id: str          #: machine name (metrics keys)
    name: str        #: as the page says it
    limit: float     #: the value must be at least this
    unit: str


TARGETS: tuple[Target, ...] = (
    Target("plugin_vs_triton_128k", "Triton + plugin at least 100x faster than Triton per verify step at 128k, "
           "61 layers", 100.0, "x (Triton's ms per step / the plugin arm's)"),
    Target("best_decode_128k_vs_1k", "the best arm's decode at 128k at least 60% of its own at 1k", 0.60,
           "(ms per step at 1k / at 128k)"),
    Target("best_ttft_64k_vs_triton", "the best arm's TTFT at 64k at least 10x better than Triton's", 10.0,
           "x (Triton's TTFT / the best arm's)"),
)
TARGET_LAYERS = 61  #: the depth the targets are set at (the investigation's model)


def _status(value: float | None, t: Target, why: str = "", note: str = "") -> dict[str, Any]:
    if value is None or why:
        return {"target_id": t.id, "target": t.name, "status": "not measurable", "value": value, "limit": t.limit,
                "unit": t.unit, "why": why}
    met = value >= t.limit
    return {"target_id": t.id, "target": t.name, "status": "met" if met else "missed", "value": value,
            "limit": t.limit, "unit": t.unit, "why": note}


def unranked_at(arms_meta: Mapping[str, Any], missing: Sequence[str], present: Sequence[str]) -> dict[str, str]:
    """Of the arms ``missing`` at a context, those that cannot be the best arm there, and why: an arm that checks
    every verify call against SGLang's kernel (its time is the check's), or one whose verify step is decided as a
    ``present`` arm's is (same decode backend, plugin, algorithm and tokens per step; only its drafter's settings
    differ, as a draft window's)."""
    paths = {a: verify_path(dict(arms_meta.get(a) or {})) for a in present}
    out: dict[str, str] = {}
    for a in missing:
        rec = dict(arms_meta.get(a) or {})
        twin = next((p for p, v in paths.items() if v is not None and v == verify_path(rec)), None)
        if checks_verify(rec):
            out[a] = "a check arm (each verify call also runs SGLang's kernel)"
        elif twin:
            out[a] = f"verifies as {twin} does (its drafter's settings differ)"
    return out


def _stock_and_best(dec: pd.DataFrame, pre: pd.DataFrame, arms: Sequence[str], layers: int | None, stock_arm: str,
                    plugin_arm: str, arms_meta: Mapping[str, Any] | None) -> list[dict[str, Any]]:
    """Which arm each target judges (the plugin arm; the fastest arm at 128k; the arm with the shortest own TTFT at 64k)
    and why a target cannot be judged here (an arm or context missing, a model of other depth, an overlapped decode,
    a TTFT that is not the arm's own); the note of arms left out of the naming."""
    t1, t2, t3 = TARGETS
    out = []
    s, p = _cell(dec, stock_arm, CTX_128K), _cell(dec, plugin_arm, CTX_128K)
    missing = [a for a, c in ((stock_arm, s), (plugin_arm, p)) if c is None]
    why = ""
    if missing:
        why = f"no decode rows of {', '.join(missing)} at 128k" + (
            "" if all(a in arms for a in missing) else f" (arms of this run: {', '.join(arms)})")
    elif layers != TARGET_LAYERS:
        why = f"the model has {layers} layers; the target is set at the investigation's {TARGET_LAYERS}"
    elif not (s["clean"] and p["clean"]):  # type: ignore[index]
        why = "a decode at 128k was measured while another arm had a request in flight"
    out.append({"target": t1, "arm": plugin_arm, "why": why, "note": ""})
    at = dec[dec["context_tokens"] == CTX_128K] if not dec.empty else dec
    without = [a for a in arms if at.empty or a not in set(at["arm"])]
    left_out = unranked_at(arms_meta or {}, without, [] if at.empty else list(dict.fromkeys(at["arm"])))
    without = [a for a in without if a not in left_out]
    note = ("left out, not decoded at 128k: " + "; ".join(f"{a}, {w}" for a, w in left_out.items())
            if left_out else "")
    best = at.loc[at["step_ms"].idxmin()] if not at.empty else None
    one = _cell(dec, str(best["arm"]), CTX_1K) if best is not None else None
    if best is not None and len(at) > 1:  # the lowest median: is it apart from the next over requests?
        second = at[at["arm"] != best["arm"]].sort_values("step_ms").iloc[0]
        k = compare_cells(dec, str(best["arm"]), str(second["arm"]), CTX_128K, step_spreads(dec))
        if k.verdict != "higher":
            note = "; ".join(x for x in (note, (
                f"{best['arm']} has the lowest median at 128k, {k.verdict if k.enough else 'not enough requests'} "
                f"with {second['arm']} over requests ({k.ratio:.3g}x" + (f", {k.named_interval()}" if k.enough else "")
                + "): judged as the best arm, not shown to be it")) if x)
    why = ""
    if without:
        why = (f"the best arm at 128k cannot be named: no decode at 128k for {', '.join(without)}"
               + (f" (only {', '.join(at['arm'])} decoded there)" if not at.empty else ""))
    elif best is None:
        why = "no arm decoded at 128k"
    elif one is None:
        why = f"{best['arm']}, the fastest at 128k, has no decode at 1k"
    elif not (best["clean"] and one["clean"]):
        why = f"{best['arm']}'s decode at 1k or 128k was measured while another arm had a request in flight"
    out.append({"target": t2, "arm": None if best is None or without else str(best["arm"]), "why": why, "note": note})
    tr = _cell(pre, stock_arm, CTX_64K)
    own = pre[(pre["context_tokens"] == CTX_64K) & pre["own"] & (pre["arm"] != stock_arm)] if not pre.empty else pre
    fastest = own.loc[own["ttft_s"].idxmin()] if not own.empty else None
    why = ""
    if tr is None:
        why = f"no TTFT of {stock_arm} at 64k"
    elif not tr["own"]:
        why = f"{stock_arm}'s TTFT at 64k is not its own ({tr['why_not_own']})"
    elif fastest is None:
        flagged = pre[(pre["context_tokens"] == CTX_64K) & (pre["arm"] != stock_arm)] if not pre.empty else pre
        why = ("no other arm has a TTFT at 64k" if flagged.empty else
               "no other arm's TTFT at 64k is its own ("
               + "; ".join(f"{r.arm}: {r.why_not_own}" for r in flagged.itertuples()) + ")")
    out.append({"target": t3, "arm": None if fastest is None else str(fastest["arm"]), "why": why, "note": ""})
    return out


#: the scorecard's columns of each target: (value, interval's lower end, upper end, status, rule)
CARD_COLUMNS = {"plugin_vs_triton_128k": ("speedup_128k_x", "speedup_lo", "speedup_hi", "speedup_status",
                                          "speedup_rule"),
                "best_decode_128k_vs_1k": ("keep_128k", "keep_lo", "keep_hi", "keep_status", "keep_rule"),
                "best_ttft_64k_vs_triton": ("ttft_64k_x", "ttft_lo", "ttft_hi", "ttft_status", "ttft_rule")}
#: statuses a target can have; only "met" counts as met
STATUSES = ("met", "missed", "inside the noise", "no interval", "not measurable")


def targets(dec: pd.DataFrame, pre: pd.DataFrame, arms: Sequence[str], layers: int | None,
            stock_arm: str = "triton", plugin_arm: str = "triton_plugin",
            arms_meta: Mapping[str, Any] | None = None, card: pd.DataFrame | None = None) -> pd.DataFrame:
    """The three targets (:data:`TARGETS`), each judged once: the arm it names (:func:`_stock_and_best`) read on the
    scorecard (:func:`scorecard`, its interval over requests and the spread between servers), so the page, the
    findings, 07 and the index say one thing. ``status``: "met" (the interval clears the limit), "missed" (it falls
    short), "inside the noise" (it holds the limit), "no interval" (too few requests a side: the value shown, not
    judged), "not measurable" (with why). An arm missing at 128k that cannot be the best there
    (:func:`unranked_at`) is left out of the best arm's naming, and the row says so."""
    if card is None:
        card = scorecard(dec, pre, [a for a in dict.fromkeys([*arms, plugin_arm]) if a != stock_arm], stock_arm)
    rows = []
    for named in _stock_and_best(dec, pre, arms, layers, stock_arm, plugin_arm, arms_meta):
        t: Target = named["target"]
        value_col, lo_col, hi_col, status_col, rule_col = CARD_COLUMNS[t.id]
        mine = card[card["arm"] == named["arm"]] if named["arm"] and not card.empty else pd.DataFrame()
        r = mine.iloc[0].to_dict() if not mine.empty else {}
        value = _f(r.get(value_col))
        status = str(r.get(status_col) or "not measured")
        why, note = named["why"], named["note"]
        if why or value is None:
            status, why = "not measurable", why or f"{named['arm'] or 'no arm'}: not measured"
        elif status.startswith("no interval"):
            why = status[len("no interval"):].strip(" ()") or why
            status = "no interval"
        elif status not in STATUSES:
            status, why = "not measurable", status
        rows.append({"target_id": t.id, "target": t.name, "status": status, "value": value,
                     "lo": _f(r.get(lo_col)), "hi": _f(r.get(hi_col)), "limit": t.limit, "unit": t.unit,
                     "arm": named["arm"], "rule": r.get(rule_col) or "", "why": "; ".join(x for x in (why, note) if x)})
    return pd.DataFrame(rows)


def _samples(dec: pd.DataFrame, arm: str, ctx: int) -> list[float]:
    c = _cell(dec, arm, ctx)
    return [float(x) for x in (c or {}).get("step_ms_samples") or [] if _f(x) is not None]


def _judge(c: RequestComparison | None, limit: float, few: str) -> str:
    """A target read against an interval (the spread between servers counted where the requests came from several
    machines: the interval widened by it on both sides): met (its lower end at or above the limit), missed (its upper
    end below), inside the noise (it holds the limit); without an interval, "no interval" and why."""
    if c is None or c.ratio is None:
        return "not measured"
    if c.lo is None or c.hi is None:
        return f"no interval ({few})"

    lo, hi = widened(c)
    return "met" if lo >= limit else "missed" if hi < limit else "inside the noise"


def scorecard(dec: pd.DataFrame, pre: pd.DataFrame, arms: Sequence[str], stock_arm: str = "triton") -> pd.DataFrame:
    """Each verify arm against every target (:data:`TARGETS`, read per arm): its speed-up over ``stock_arm``'s verify
    step at 128k, its own step at 1k over its step at 128k, and ``stock_arm``'s own TTFT at 64k over its own, each a
    ratio of medians over requests (:func:`compare_cells`: its interval, the spread between servers where the requests
    came from several machines, and the rule used, ``*_rule``). A target is met only where the interval's lower end
    clears it, missed where its upper end falls short, "inside the noise" where the interval holds it, and "no
    interval" under 3 requests (or prefills) a side (:func:`_judge`); ``all_met`` only where all three are met. Pure."""
    t1, t2, t3 = TARGETS
    out = []
    steps, ttfts = step_spreads(dec), ttft_spreads(pre)
    st = _cell(pre, stock_arm, CTX_64K) if not pre.empty else None
    for arm in arms:
        row: dict[str, Any] = {"arm": arm}
        mine, stock = units(dec, arm, CTX_128K), units(dec, stock_arm, CTX_128K)
        c = compare_across(mine, stock, steps.get(CTX_128K)) if mine and stock else None
        row.update(speedup_128k_x=c.ratio if c else None, speedup_lo=c.lo if c else None, speedup_hi=c.hi if c else None,
                   speedup_status=_judge(c, t1.limit, f"{c.n_a} / {c.n_b} requests" if c else ""),
                   speedup_rule=c.rule if c else "")
        one = units(dec, arm, CTX_1K)
        wide = max((x for x in (steps.get(CTX_1K), steps.get(CTX_128K)) if x is not None), key=lambda x: x.x,
                   default=None)
        k = compare_across(mine, one, wide) if mine and one else None
        row.update(keep_128k=k.ratio if k else None, keep_lo=k.lo if k else None, keep_hi=k.hi if k else None,
                   keep_status=_judge(k, t2.limit, f"{k.n_a} / {k.n_b} requests" if k else ""),
                   keep_rule=k.rule if k else "")
        me = _cell(pre, arm, CTX_64K) if not pre.empty else None
        own = bool(st and me and st.get("own") and me.get("own"))
        t = compare_across(units(pre, arm, CTX_64K, "ttft_units"), units(pre, stock_arm, CTX_64K, "ttft_units"),
                           ttfts.get(CTX_64K)) if own else None
        row.update(ttft_64k_x=t.ratio if t else None, ttft_lo=t.lo if t else None, ttft_hi=t.hi if t else None,
                   ttft_status=_judge(t, t3.limit, f"{t.n_b} / {t.n_a} prefills: not enough prefills" if t else "")
                   if t else "not measured", ttft_rule=t.rule if t else "")
        row["all_met"] = all(row[k] == "met" for k in ("speedup_status", "keep_status", "ttft_status"))
        out.append(row)
    return pd.DataFrame(out)


# ---------------------------------------------------------------------------------------------------------------------
# Targets against the anchor (FlashInfer's own server): fast at both the first token and the verify step
# ---------------------------------------------------------------------------------------------------------------------

ANCHOR = "flashinfer"  #: the arm a configuration is held against where the run has it (prefill, decode and verify)
#: at most these ratios to the anchor's (value = the arm's / the anchor's): the first token as fast as FlashInfer's
#: (within 10%), the verify step clearly faster (15% or more) at the investigation's longest decoded context
ANCHOR_TARGETS: tuple[Target, ...] = (
    Target("ttft_vs_anchor_64k", "TTFT at 64k at most 1.1x FlashInfer's", 1.1, "x (the arm's TTFT / FlashInfer's)"),
    Target("ttft_vs_anchor_128k", "TTFT at 128k at most 1.1x FlashInfer's", 1.1, "x (the arm's TTFT / FlashInfer's)"),
    Target("verify_vs_anchor_128k", "verify step at 128k at most 0.85x FlashInfer's", 0.85,
           "x (the arm's ms per verify step / FlashInfer's)"),
)


def _judge_at_most(c: RequestComparison | None, limit: float, few: str) -> str:
    """An "at most" target read against an interval (widened by the spread between servers where the requests came
    from several machines): met (its upper end at or below the limit), missed (its lower end above), inside the noise
    (it holds the limit); without an interval, "no interval" and why."""
    if c is None or c.ratio is None:
        return "not measured"
    if c.lo is None or c.hi is None:
        return f"no interval ({few})"
    lo, hi = widened(c)
    return "met" if hi <= limit else "missed" if lo > limit else "inside the noise"


def anchor_card(dec: pd.DataFrame, pre: pd.DataFrame, arms: Sequence[str], anchor: str = ANCHOR) -> pd.DataFrame:
    """Each arm but the anchor against :data:`ANCHOR_TARGETS`: its TTFT at 64k and 128k and its verify step at 128k,
    each over the anchor's as a ratio of medians over requests (prefills for the TTFT) with its interval and rule
    (:func:`specdiag.spread.compare_across`), judged by :func:`_judge_at_most`; ``all_met`` only where all three are
    met. Empty where the run has no anchor arm. A TTFT that is not the arm's own (measured while another arm had a
    request in flight) is not judged. Pure."""
    if pre.empty and dec.empty or anchor not in set(pre.get("arm", [])) | set(dec.get("arm", [])):
        return pd.DataFrame()
    steps, ttfts = step_spreads(dec), ttft_spreads(pre)
    rows = []
    for arm in (a for a in arms if a != anchor):
        row: dict[str, Any] = {"arm": arm}
        for t, ctx, table, col, spreads in ((ANCHOR_TARGETS[0], CTX_64K, pre, "ttft_units", ttfts),
                                            (ANCHOR_TARGETS[1], CTX_128K, pre, "ttft_units", ttfts),
                                            (ANCHOR_TARGETS[2], CTX_128K, dec, "step_units", steps)):
            mine, theirs = units(table, arm, ctx, col), units(table, anchor, ctx, col)
            own = col != "ttft_units" or all(bool((_cell(pre, a, ctx) or {}).get("own")) for a in (arm, anchor))
            c = compare_across(theirs, mine, spreads.get(ctx)) if mine and theirs and own else None
            what = "prefills" if col == "ttft_units" else "requests"
            row.update({f"{t.id}": c.ratio if c else None, f"{t.id}_lo": c.lo if c else None,
                        f"{t.id}_hi": c.hi if c else None, f"{t.id}_rule": c.rule if c else "",
                        f"{t.id}_status": _judge_at_most(c, t.limit, f"{c.n_b} / {c.n_a} {what}" if c else "")
                        if c else ("not its own TTFT" if mine and theirs else "not measured")})
        row["all_met"] = all(row[f"{t.id}_status"] == "met" for t in ANCHOR_TARGETS)
        rows.append(row)
    return pd.DataFrame(rows)
