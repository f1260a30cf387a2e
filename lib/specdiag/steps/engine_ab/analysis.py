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
prefill and memory), and the three targets of :data:`TARGETS`, each met, missed or not measurable with why.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Sequence

import pandas as pd

from specdiag.plots import format_tokens
from specdiag.stats import median_diff_test
from specdiag.steps.engine_ab.arms import checks_verify, verify_path

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
    request overlapped), ``clean`` (none did)."""
    cols = ["arm", "context_tokens", "n", "step_ms", "step_ms_samples", "server_step_ms", "decode_tok_s",
            "decode_tok_s_first", "commit_first", "commit_later", "cached_tokens", "overlapped", "overlapped_by",
            "clean"]
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
                    "overlapped": n_over, "overlapped_by": by, "clean": n_over == 0})
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
    ``why_not_own``, ``concurrent`` (the most arms prefilling at once among the rows used), ``n``."""
    cols = ["arm", "context_tokens", "n", "ttft_s", "ttft_s_samples", "prefill_tok_s", "own", "why_not_own",
            "concurrent"]
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
                    "concurrent": int(max((_f(r.get("concurrent")) or 1) for r in use))})
    return pd.DataFrame(out, columns=cols)


def _cell(table: pd.DataFrame, arm: str, ctx: int) -> dict[str, Any] | None:
    if table.empty:
        return None
    sel = table[(table["arm"] == arm) & (table["context_tokens"] == ctx)]
    return sel.iloc[0].to_dict() if not sel.empty else None


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


def _servers_overlap(sel: pd.DataFrame, a: str, b: str, ctx: int) -> str:
    """Where one arm's requests came from several servers (parts of a merged run): whether the other arm's median lies
    inside the range of those servers' medians (or the two ranges overlap), said as the spread between servers, which
    requests pooled over servers do not carry; '' otherwise."""
    ca, cb = _cell(sel, a, ctx), _cell(sel, b, ctx)
    if not ca or not cb:
        return ""
    ra = list((ca.get("server_step_ms") or {}).values()) or [float(ca["step_ms"])]
    rb = list((cb.get("server_step_ms") or {}).values()) or [float(cb["step_ms"])]
    if len(ra) < 2 and len(rb) < 2 or max(ra) < min(rb) or max(rb) < min(ra):
        return ""
    side = lambda name, r: (f"{name}'s {len(r)} servers {min(r):.3g}-{max(r):.3g} ms" if len(r) > 1  # noqa: E731
                            else f"{name} {r[0]:.3g} ms")
    return f"inside the spread between servers ({side(a, ra)}; {side(b, rb)})"


def _against_runner_up(sel: pd.DataFrame, best: str, second: str, ctxs: Sequence[int]) -> str:
    """The band's pick over requests: at each context, the runner-up's ms per step against the fastest arm's (ratio of
    the medians over requests, bootstrap interval, :func:`specdiag.stats.compare_requests`). Starts "faster" where each
    interval lies above 1 and no spread between servers holds the other arm (:func:`_servers_overlap`), "tie" where one
    holds 1 (or lies below) or the servers' spread does, "not enough requests" where a cell has fewer than 3; then
    each context's ratio, interval and requests."""
    from specdiag.stats import NOT_ENOUGH, compare_requests  # noqa: PLC0415

    parts, verdicts = [], []
    for c in ctxs:
        k = compare_requests(_samples(sel, best, c), _samples(sel, second, c))
        spread = _servers_overlap(sel, best, second, c) if k.verdict == "higher" else ""
        verdicts.append("servers" if spread else k.verdict)
        parts.append(f"{tok(c)} {k.ratio:.3g}x" + (f", interval {k.interval_text()}" if k.enough else "")
                     + f", {k.counts_text()}" + (f"; {spread}" if spread else "") if k.ratio else f"{tok(c)} -")
    detail = "; ".join(parts)
    if NOT_ENOUGH in verdicts:
        return f"not enough requests to judge it (3 a cell): {detail}"
    if all(v == "higher" for v in verdicts):
        return f"faster at every context over requests: {detail}"
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
    if not dec.empty:  # step against step: only verify steps (speculation-off arms are compared in tokens/s)
        from specdiag.steps.engine_ab.arms import verify_arms  # noqa: PLC0415

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
        from specdiag.steps.engine_ab.arms import step_sizes  # noqa: PLC0415

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
        judged = _against_runner_up(sel, best, second, ctxs)
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


def targets(dec: pd.DataFrame, pre: pd.DataFrame, arms: Sequence[str], layers: int | None,
            stock_arm: str = "triton", plugin_arm: str = "triton_plugin",
            arms_meta: Mapping[str, Any] | None = None) -> pd.DataFrame:
    """The three targets (:data:`TARGETS`), each "met", "missed" or "not measurable" with why (an arm missing, a
    context not decoded, a TTFT not the arm's own, a decode another arm overlapped, a model of other depth). An arm
    missing at 128k that cannot be the best there (:func:`unranked_at`, from ``arms_meta``) is left out of the best
    arm's naming, and the row says so."""
    t1, t2, t3 = TARGETS
    rows = []
    # 1. plugin vs stock Triton per verify step at 128k, 61 layers
    s, p = _cell(dec, stock_arm, CTX_128K), _cell(dec, plugin_arm, CTX_128K)
    missing = [a for a, c in ((stock_arm, s), (plugin_arm, p)) if c is None]
    value = s["step_ms"] / p["step_ms"] if s and p else None
    why = ""
    if missing:
        why = f"no decode rows of {', '.join(missing)} at 128k" + (
            "" if all(a in arms for a in missing) else f" (arms of this run: {', '.join(arms)})")
    elif layers != TARGET_LAYERS:
        why = f"the model has {layers} layers; the target is set at the investigation's {TARGET_LAYERS}"
    elif not (s["clean"] and p["clean"]):
        why = "a decode at 128k was measured while another arm had a request in flight"
    rows.append(_status(value, t1, why))
    # 2. the best arm's decode at 128k against its own at 1k (per step: the same tokens per verify step)
    at = dec[dec["context_tokens"] == CTX_128K] if not dec.empty else dec
    without = [a for a in arms if at.empty or a not in set(at["arm"])]
    left_out = unranked_at(arms_meta or {}, without, [] if at.empty else list(dict.fromkeys(at["arm"])))
    without = [a for a in without if a not in left_out]
    note = ("left out, not decoded at 128k: " + "; ".join(f"{a}, {why}" for a, why in left_out.items())
            if left_out else "")
    best = at.loc[at["step_ms"].idxmin()] if not at.empty else None
    one = _cell(dec, str(best["arm"]), CTX_1K) if best is not None else None
    value = one["step_ms"] / best["step_ms"] if best is not None and one else None
    why = ""
    if without:
        value = None  # no best arm: no value to show
        why = (f"the best arm at 128k cannot be named: no decode at 128k for {', '.join(without)}"
               + (f" (only {', '.join(at['arm'])} decoded there)" if not at.empty else ""))
    elif one is None:
        why = f"{best['arm']}, the fastest at 128k, has no decode at 1k"
    elif not (best["clean"] and one["clean"]):
        why = f"{best['arm']}'s decode at 1k or 128k was measured while another arm had a request in flight"
    rows.append(_status(value, t2, why, note))
    # 3. the best arm's TTFT at 64k against Triton's (own TTFTs only)
    tr = _cell(pre, stock_arm, CTX_64K)
    own = pre[(pre["context_tokens"] == CTX_64K) & pre["own"] & (pre["arm"] != stock_arm)] if not pre.empty else pre
    fastest = own.loc[own["ttft_s"].idxmin()] if not own.empty else None
    value = tr["ttft_s"] / fastest["ttft_s"] if tr and fastest is not None else None
    why = ""
    if tr is None:
        why = f"no TTFT of {stock_arm} at 64k"
    elif not tr["own"]:
        why = f"{stock_arm}'s TTFT at 64k is not its own ({tr['why_not_own']})"
    elif fastest is None:
        flagged = pre[(pre["context_tokens"] == CTX_64K) & (pre["arm"] != stock_arm)] if not pre.empty else pre
        why = ("no other arm has a TTFT at 64k" if flagged.empty else
               f"no other arm's TTFT at 64k is its own ({'; '.join(f'{r.arm}: {r.why_not_own}' for r in flagged.itertuples())})")
    rows.append({**_status(value, t3, why), "arm": None if fastest is None else fastest["arm"]})
    rows[0]["arm"], rows[1]["arm"] = plugin_arm, (None if best is None or without else best["arm"])
    return pd.DataFrame(rows)


def _samples(dec: pd.DataFrame, arm: str, ctx: int) -> list[float]:
    c = _cell(dec, arm, ctx)
    return [float(x) for x in (c or {}).get("step_ms_samples") or [] if _f(x) is not None]


def _judge(value: float | None, lo: float | None, hi: float | None, limit: float, single: str) -> str:
    """A target read against an interval: met (its lower end at or above the limit), missed (its upper end below),
    inside the noise (the interval holds the limit); without an interval, the value alone, saying why."""
    if value is None:
        return "not measured"
    if lo is None or hi is None:
        return f"{'met' if value >= limit else 'missed'} ({single})"
    return "met" if lo >= limit else "missed" if hi < limit else "inside the noise"


def scorecard(dec: pd.DataFrame, pre: pd.DataFrame, arms: Sequence[str], stock_arm: str = "triton") -> pd.DataFrame:
    """Each verify arm against every target (:data:`TARGETS`, read per arm): its speed-up over ``stock_arm``'s verify
    step at 128k, its own step at 1k over its step at 128k (both ratios of medians over requests with a bootstrap
    interval, :func:`specdiag.stats.compare_requests`), and ``stock_arm``'s own TTFT at 64k over its own (one prefill
    each: no interval, said so). A target is met only where the interval's lower end clears it, missed where its upper
    end falls short, and "inside the noise" where the interval holds it (:func:`_judge`). Pure."""
    from specdiag.stats import compare_requests  # noqa: PLC0415

    t1, t2, t3 = TARGETS
    out = []
    stock_128 = _samples(dec, stock_arm, CTX_128K)
    st = _cell(pre, stock_arm, CTX_64K) if not pre.empty else None
    for arm in arms:
        row: dict[str, Any] = {"arm": arm}
        mine = _samples(dec, arm, CTX_128K)
        c = compare_requests(mine, stock_128) if mine and stock_128 else None
        row.update(speedup_128k_x=c.ratio if c else None, speedup_lo=c.lo if c else None, speedup_hi=c.hi if c else None,
                   speedup_status=_judge(c.ratio if c else None, c.lo if c else None, c.hi if c else None, t1.limit,
                                         f"{c.n_a} / {c.n_b} requests: no interval" if c else ""))
        one = _samples(dec, arm, CTX_1K)
        k = compare_requests(mine, one) if mine and one else None
        row.update(keep_128k=k.ratio if k else None, keep_lo=k.lo if k else None, keep_hi=k.hi if k else None,
                   keep_status=_judge(k.ratio if k else None, k.lo if k else None, k.hi if k else None, t2.limit,
                                      f"{k.n_a} / {k.n_b} requests: no interval" if k else ""))
        me = _cell(pre, arm, CTX_64K) if not pre.empty else None
        own = bool(st and me and st.get("own") and me.get("own"))
        ttft = st["ttft_s"] / me["ttft_s"] if own and me and me.get("ttft_s") else None  # type: ignore[index]
        row.update(ttft_64k_x=ttft, ttft_status=_judge(ttft, None, None, t3.limit, "one prefill each")
                   if own or ttft is not None else "not measured")
        row["all_met"] = all(str(row[k]).startswith("met") for k in ("speedup_status", "keep_status", "ttft_status"))
        out.append(row)
    return pd.DataFrame(out)
