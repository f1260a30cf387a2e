"""10's numbers from its rows: fresh against fragmented per arm and context, the kernel A/B's prediction, the
verdicts (pure functions, no I/O).

The time of a step: per request, the median of its own step samples (the gaps between stream chunks, client side; on
the embedded server its own verify times, which leave out HTTP and streaming); a request is the unit, its steps are
never pooled as independent samples (on a shared 2-core host one fragmented request took 72.4 ms per step where its
twin took 34.2, measured). An arm's number at a context and pool state is the median over its requests. Fragmented
over fresh is the layout's cost, with its interval over requests at the level it has, the server as a unit
(:func:`specdiag.spread.compare_across`: the requests of one machine compared; requests from several parts must also
clear the spread between servers, :func:`spreads`, and the row says which rule it used, ``rule``); a cell with fewer
than :data:`specdiag.stats.MIN_REQUESTS` requests says "not enough requests" instead of a verdict.
"Costs time" is said only where the interval lies above 1 and the ratio is at least :data:`MIN_COST_X`; an interval
that holds 1 is a tie, said as one, and "no cost" is an upper bound from the interval ("no cost above +X%"). A
comparison counts only when the fresh requests were contiguous (at least :data:`FRESH_MIN_SHARE` of tokens in runs of
64 or more) and the fragmented ones were not (at most :data:`FRAG_MAX_SHARE`); otherwise the finding says the layouts
did not differ enough to judge.

The prediction: the kernel A/B (06) timed the same split-KV kernel family on a page_size-1 token table shuffled token
by token against 64-token pages (``analysis.page_size_effect``); the largest of those ratios at a context, over the
8-head shapes, is what scattering should cost the plugin's kernel at most.
"""

from __future__ import annotations

import math
import statistics
from typing import Any, Iterable, Mapping

import pandas as pd

from specdiag import kernel_ab_table
from specdiag.findings import Finding
from specdiag.plots import format_tokens
from specdiag.spread import Sample, Spread, compare_across, machine_of, server_of, server_spreads
from specdiag.stats import MIN_REQUESTS, NOT_ENOUGH, level_text

MIN_COST_X = 1.02  # a fragmented/fresh ratio below this is called no cost, whatever the interval says
FRESH_MIN_SHARE = 0.9  # a fresh request counts as contiguous at this share of tokens in runs >= 64
FRAG_MAX_SHARE = 0.5  # a fragmented request counts as scattered at or below this share
KEY = ["arm", "pool_state", "context_tokens", "repeat"]
STATES = ("fresh", "fragmented")
#: an arm named ``<arm>`` + this is ``<arm>``'s server with the contiguous allocator (tier0.py pairs them)
CONTIGUOUS_SUFFIX = "_contiguous"


def latest(rows: Iterable[Mapping[str, Any]]) -> pd.DataFrame:
    """One row per (arm, state, context, repeat) of each part, the last written (a merged run's parts are separate
    servers, so their requests are separate requests); arm-level failures kept apart (no state)."""
    df = pd.DataFrame([dict(r) for r in rows])
    if df.empty or "pool_state" not in df:
        return pd.DataFrame(columns=[*KEY, "error"])
    df = df[df["pool_state"].notna()]
    key = list(KEY)
    if "part" in df:
        df = df.assign(part=df["part"].fillna(0))
        key.append("part")
    return df.drop_duplicates(subset=key, keep="last").reset_index(drop=True)


def arm_failures(rows: Iterable[Mapping[str, Any]]) -> list[str]:
    """'arm: error' of every arm that failed before measuring (a row without a pool state)."""
    return [f"{r.get('arm')}: {r.get('error')}" for r in rows if r.get("pool_state") is None and r.get("error")]


def gaps(rows: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """What the run left unmeasured: for each arm and each context any arm measured, the pool states with no request
    measured without error (``{"arm", "context_tokens", "states"}``), in the rows' order."""
    df = latest(rows)
    if df.empty:
        return []
    ok = df[df["error"].isna()] if "error" in df else df
    done = {(r.arm, int(r.context_tokens), r.pool_state) for r in ok.itertuples()}
    contexts = sorted({int(c) for c in df["context_tokens"].dropna()})
    out = []
    for arm in dict.fromkeys(df["arm"]):
        for ctx in contexts:
            missing = [s for s in STATES if (arm, ctx, s) not in done]
            if missing:
                out.append({"arm": str(arm), "context_tokens": ctx, "states": missing})
    return out


def gap_text(gap: Mapping[str, Any]) -> str:
    """'plugin at 128k: no fragmented request'."""
    return f"{gap['arm']} at {format_tokens(gap['context_tokens'])}: no {' and no '.join(gap['states'])} request"


def _samples(group: pd.DataFrame) -> tuple[list[float], str]:
    """The step samples of a group of requests, and what they are."""
    server = [x for v in group.get("server_verify_ms", pd.Series(dtype=object)) if isinstance(v, list) for x in v]
    if server:
        return [float(x) for x in server], "server-reported verify ms per step"
    client = [x for v in group.get("step_ms_samples", pd.Series(dtype=object)) if isinstance(v, list) for x in v]
    return [float(x) for x in client], "measured ms between stream chunks (one per verify step)"


def _share(group: pd.DataFrame, key: str) -> float | None:
    vals = [float(v[key]) for v in group.get("layout", pd.Series(dtype=object)) if isinstance(v, Mapping)]
    return statistics.median(vals) if vals else None


def summary(rows: Iterable[Mapping[str, Any]]) -> pd.DataFrame:
    """Per arm, state and context: requests, ms per verify step (median of the pooled step samples), the client's
    ``step_ms`` median, and the layout (median share in runs >= 64, runs per 1k tokens)."""
    df = latest(rows)
    out = []
    if df.empty:
        return pd.DataFrame(out)
    ok = df[df["error"].isna()] if "error" in df else df
    for (arm, state, ctx), g in ok.groupby(["arm", "pool_state", "context_tokens"], sort=False):
        samples, what = _samples(g)
        out.append({"arm": arm, "pool_state": state, "context_tokens": int(ctx), "requests": len(g),
                    "steps": len(samples), "step_ms": statistics.median(samples) if samples else None,
                    "step_source": what, "client_step_ms": statistics.median(g["step_ms"].dropna())
                    if "step_ms" in g and g["step_ms"].notna().any() else None,
                    "share_in_long_runs": _share(g, "share_in_long_runs"),
                    "runs_per_1k_tokens": _share(g, "runs_per_1k_tokens"),
                    "filler_cycles": _filler_cycles(g)})
    return pd.DataFrame(out)


def _request_medians(group: pd.DataFrame) -> list[float]:
    """Each request's median step (its own samples), in the rows' order."""
    return [s.value for s in _request_units(group)]


def _request_units(group: pd.DataFrame) -> list[Sample]:
    """Each request's median step with the server and machine it came from, in the rows' order."""
    out = []
    for i in range(len(group)):
        m = _samples(group.iloc[[i]])[0]
        if m:
            row = group.iloc[i].to_dict()
            out.append(Sample(statistics.median(m), server_of(row), machine_of(row)))
    return out


def spreads(rows: Iterable[Mapping[str, Any]]) -> dict[int, Spread]:
    """The spread between servers per context: the largest ratio of two servers' medians of one arm and pool state
    (:func:`specdiag.spread.server_spreads`)."""
    df = latest(rows)
    if df.empty:
        return {}
    ok = df[df["error"].isna()] if "error" in df else df
    cells = {(f"{arm} {state}", int(ctx)): _request_units(g)
             for (arm, state, ctx), g in ok.groupby(["arm", "pool_state", "context_tokens"], sort=False)}
    return server_spreads(cells, "ms", format_tokens)  # type: ignore[return-value]


def _filler_cycles(g: pd.DataFrame) -> float | None:
    vals = [float(v["cycles"]) for v in g.get("filler", pd.Series(dtype=object)) if isinstance(v, Mapping)]
    return max(vals) if vals else None


def costs(rows: Iterable[Mapping[str, Any]], spread_by_ctx: Mapping[int, Spread] | None = None) -> pd.DataFrame:
    """Per arm and context with both states: fresh and fragmented ms per step (medians over requests), their ratio with
    its interval over requests and verdict (:func:`specdiag.spread.compare_across`, with ``spread_by_ctx``, else the
    spreads of these rows), the requests per state, both layouts, the rule used, and whether the comparison counts
    (module docstring)."""
    rows = list(rows)
    spread_by_ctx = spreads(rows) if spread_by_ctx is None else spread_by_ctx
    df = latest(rows)
    if df.empty:
        return pd.DataFrame()
    ok = df[df["error"].isna()] if "error" in df else df
    out = []
    for (arm, ctx), g in ok.groupby(["arm", "context_tokens"], sort=False):
        fresh, frag = g[g["pool_state"] == "fresh"], g[g["pool_state"] == "fragmented"]
        if fresh.empty or frag.empty:
            continue
        fresh_units, frag_units = _request_units(fresh), _request_units(frag)
        fresh_req, frag_req = [u.value for u in fresh_units], [u.value for u in frag_units]
        if not fresh_req or not frag_req:
            continue
        c = compare_across(fresh_units, frag_units, spread_by_ctx.get(int(ctx)))
        sf, sg = _share(fresh, "share_in_long_runs"), _share(frag, "share_in_long_runs")
        counts = sf is not None and sg is not None and sf >= FRESH_MIN_SHARE and sg <= FRAG_MAX_SHARE
        out.append({"arm": arm, "context_tokens": int(ctx), "fresh_ms": c.median_a, "fragmented_ms": c.median_b,
                    "cost_x": c.ratio, "cost_lo_x": c.lo, "cost_hi_x": c.hi, "verdict": c.verdict,
                    "level": c.level, "rule": c.rule, "request_verdict": c.request_verdict,
                    "spread_x": c.spread_x,
                    # the most the layout can cost: the interval's upper end, times the spread between servers where
                    # the requests came from several machines
                    "cost_bound_x": c.hi * (c.spread_x or 1.0) if c.hi is not None else None,
                    "requests_fresh": c.n_a, "requests_fragmented": c.n_b,
                    "fresh_request_ms": fresh_req, "fragmented_request_ms": frag_req,
                    "costs_time": bool(counts and c.verdict == "higher" and c.ratio >= MIN_COST_X),
                    "fresh_share": sf, "fragmented_share": sg,
                    "fresh_runs_per_1k": _share(fresh, "runs_per_1k_tokens"),
                    "fragmented_runs_per_1k": _share(frag, "runs_per_1k_tokens"),
                    "layouts_differ": counts, "step_source": _samples(fresh)[1]})
    return pd.DataFrame(out)


def kernel_prediction(kernel_ab_rows: Iterable[Mapping[str, Any]]) -> pd.DataFrame:
    """From a kernel A/B run's rows: per context, the largest p1-shuffled over 64-token-page time of the split-KV
    Triton kernel over the 8-head shapes, and the shapes it covers."""
    df = kernel_ab_table.measured(kernel_ab_rows)
    both = df[df["arm"].isin(["split_triton", "split_triton_b64"])]
    if both.empty:
        return pd.DataFrame()
    t = both.pivot_table(index=kernel_ab_table.CASE, columns="arm", values="us", aggfunc="first").dropna()
    if not {"split_triton", "split_triton_b64"} <= set(t.columns):
        return pd.DataFrame()
    t = (t["split_triton"] / t["split_triton_b64"]).rename("p1_over_b64").reset_index()
    t = t[t["heads"] == 8]
    out = []
    for ctx, g in t.groupby("context_tokens"):
        out.append({"context_tokens": int(ctx), "predicted_max_x": float(g["p1_over_b64"].max()),
                    "shapes": ", ".join(f"8 x {int(d)}: {x:.3f}" for d, x in zip(g["draft_tokens"], g["p1_over_b64"]))})
    return pd.DataFrame(out)


def predicted_at(pred: pd.DataFrame, ctx: int) -> tuple[float, int] | None:
    """The prediction at the kernel A/B context nearest ``ctx`` (in log distance): (ratio, that context)."""
    if pred.empty:
        return None

    best = min(pred.itertuples(), key=lambda r: abs(math.log(r.context_tokens / ctx)))
    return float(best.predicted_max_x), int(best.context_tokens)


def _pct(x: float) -> str:
    return f"{100 * (x - 1):+.1f}%"


def findings(cost: pd.DataFrame, pred: pd.DataFrame, source: str = "measured",
             prediction_source: str = "", missing: Iterable[Mapping[str, Any]] = ()) -> list[Finding]:
    """One finding per arm (its contexts' comparisons), the plugin's against the kernel A/B's prediction, and what the
    run left unmeasured (``missing``, from :func:`gaps`)."""
    missing = list(missing)
    said = [gap_text(g) for g in missing]
    gap = ([Finding("kv_layout.gaps", "KV layout: not measured in this run",
                    "These arm, context and pool-state pairs have no request measured without error, so this "
                    "notebook's verdicts do not cover them: " + "; ".join(said) + ".", "info", said,
                    {"missing": said}, source)] if missing else [])
    out: list[Finding] = []
    if cost.empty:
        return [Finding("kv_layout.not_measured", "KV layout: nothing to compare",
                        "No arm has both a fresh and a fragmented request without error, so the layout's cost is not "
                        "judged.", "info", ("every arm lacks one of the two states (see the rows)",), {}, source), *gap]
    for arm, g in cost.groupby("arm", sort=False):
        if str(arm).endswith(CONTIGUOUS_SUFFIX) and str(arm)[: -len(CONTIGUOUS_SUFFIX)] in set(cost["arm"]):
            continue  # a contiguous allocator's arm: judged beside its base arm (tier0.findings)
        out.append(_arm_finding(str(arm), g.sort_values("context_tokens"), source))
    out.extend(_prediction_findings(cost, pred, source, prediction_source, missing))
    return out + gap


def cost_text(r: Any) -> str:
    """'+6.0% (90% interval +4.1% to +8.2%, 3 / 3 requests fresh / fragmented; one machine)' of a :func:`costs` row
    (a dict or a named tuple)."""
    get = r.get if isinstance(r, Mapping) else lambda k: getattr(r, k, None)
    n = f"{get('requests_fresh')} / {get('requests_fragmented')} requests fresh / fragmented"
    rule = get("rule")
    rule = f"; {rule}" if rule and rule == rule else ""
    if get("cost_lo_x") is None or get("cost_lo_x") != get("cost_lo_x"):
        return f"{_pct(get('cost_x'))}, {n}{rule}"
    level = get("level")
    named = f"{level_text(level)} interval" if level is not None and level == level else "interval"
    return f"{_pct(get('cost_x'))} ({named} {_pct(get('cost_lo_x'))} to {_pct(get('cost_hi_x'))}, {n}{rule})"


def _evidence(r: Any) -> str:
    return (f"{format_tokens(r.context_tokens)}: {r.fresh_ms:.3g} ms per step fresh, {r.fragmented_ms:.3g} ms "
            f"fragmented (medians over requests; {cost_text(r)}: {_verdict_word(r.verdict)}; "
            f"{_share_text(r.fresh_share)} then {_share_text(r.fragmented_share)} of tokens in runs >= 64, "
            f"{_num(r.fresh_runs_per_1k)} then {_num(r.fragmented_runs_per_1k)} runs per 1k tokens; per request: fresh "
            f"{_ms_list(r.fresh_request_ms)}, fragmented {_ms_list(r.fragmented_request_ms)})")


def _verdict_word(verdict: str) -> str:
    return {"higher": "fragmented slower", "lower": "fragmented faster", "tie": "a tie"}.get(verdict, verdict)


def _arm_finding(arm: str, g: pd.DataFrame, source: str) -> Finding:
    """``kv_layout.<arm>``: the layout's cost on one arm over its contexts (module docstring)."""
    ev = [_evidence(r) for r in g.itertuples()]
    ev.append(f"step times: {g['step_source'].iloc[0]}, each request's median over its own steps ({source}); "
              f"at least {MIN_REQUESTS} requests per state for a verdict")
    judged = g[g["layouts_differ"]]
    last = g.iloc[-1]

    def nums(r: Any) -> dict[str, Any]:
        return {"arm": arm, "context_tokens": int(r["context_tokens"]), "fresh_ms": float(r["fresh_ms"]),
                "fragmented_ms": float(r["fragmented_ms"]), "cost_x": float(r["cost_x"]), "cost_lo_x": r["cost_lo_x"],
                "cost_hi_x": r["cost_hi_x"], "cost_bound_x": r["cost_bound_x"], "rule": r["rule"],
                "verdict": r["verdict"], "requests_fresh": int(r["requests_fresh"]),
                "requests_fragmented": int(r["requests_fragmented"]),
                "fresh_share_in_long_runs": r["fresh_share"], "fragmented_share_in_long_runs": r["fragmented_share"]}

    if judged.empty:
        return Finding(f"kv_layout.{arm}.not_fragmented", f"KV layout on {arm}: the layouts did not differ",
                       f"On {arm} the fresh and fragmented requests were laid out too much alike to judge the layout's "
                       f"cost (fresh needs >= {FRESH_MIN_SHARE:.0%} of tokens in runs >= 64, fragmented <= "
                       f"{FRAG_MAX_SHARE:.0%}): cycle the pool more (filler cycles) or check that the radix cache is "
                       "off.", "warning", ev, nums(last), source)
    enough = judged[judged["verdict"] != NOT_ENOUGH]
    if enough.empty:
        few = "; ".join(f"{format_tokens(r.context_tokens)}: {r.requests_fresh} fresh, {r.requests_fragmented} "
                        f"fragmented (fragmented/fresh {_pct(r.cost_x)})" for r in judged.itertuples())
        return Finding(f"kv_layout.{arm}", f"KV layout on {arm}",
                       f"On {arm}: not enough requests to judge the layout's cost ({few}; a verdict takes at least "
                       f"{MIN_REQUESTS} requests per state).", "info", ev,
                       {**nums(judged.iloc[-1]), "not_enough_requests": True}, source)
    costing = enough[enough["costs_time"]]
    if not costing.empty:
        worst = costing.loc[costing["cost_x"].idxmax()]
        numbers = nums(worst)
        verdict = (f"On {arm} a fragmented pool costs time: {cost_text(worst)} per verify step at "
                   f"{format_tokens(worst['context_tokens'])} ({worst['fragmented_ms']:.3g} against "
                   f"{worst['fresh_ms']:.3g} ms), so keeping each request's KV contiguous pays there.")
        severity = "warning" if worst["cost_x"] >= 1.10 else "info"
        if worst["cost_x"] >= 1.05:
            numbers.update(fix=f"a contiguous KV layout (flushed pool) on {arm}",
                           fix_speedup_x=float(worst["cost_x"]), fix_context_tokens=int(worst["context_tokens"]))
        return Finding(f"kv_layout.{arm}", f"KV layout on {arm}", verdict, severity, ev, numbers, source)
    top = enough.loc[enough["cost_bound_x"].idxmax()]  # the widest upper bound: the bound holds at every context
    numbers = nums(top)
    ties = enough[enough["verdict"] == "tie"]
    bound = f"no cost above {_pct(top['cost_bound_x'])}" + (
        " (the interval's upper end times the spread between servers)" if top["spread_x"] else "")
    if not ties.empty:
        t = ties.loc[ties["cost_x"].idxmax()]
        why = ("inside the spread between servers" if t["request_verdict"] in ("higher", "lower") else
               "the interval holding no change")
        verdict = (f"On {arm} fragmented against fresh is a tie: {cost_text(t)} at "
                   f"{format_tokens(t['context_tokens'])}, {why}; {bound} per verify step "
                   f"at {format_tokens(top['context_tokens'])}, so defragmenting would not measurably speed this arm up.")
    else:
        verdict = (f"On {arm} the layout costs no measurable time: {bound} per verify step at "
                   f"{format_tokens(top['context_tokens'])} ({cost_text(top)}), so defragmenting would not speed this "
                   "arm up.")
    return Finding(f"kv_layout.{arm}", f"KV layout on {arm}", verdict, "ok", ev, numbers, source)


def _prediction_findings(cost: pd.DataFrame, pred: pd.DataFrame, source: str, pred_source: str,
                         missing: list[Mapping[str, Any]]) -> list[Finding]:
    plug = cost[(cost["arm"] == "plugin") & cost["layouts_differ"]]
    if pred.empty:
        return []
    if plug.empty:
        alike = cost[cost["arm"] == "plugin"]
        unmeasured = [g for g in missing if g["arm"] == "plugin"]
        why = ([f"{format_tokens(r.context_tokens)}: the fresh and fragmented requests were laid out alike"
                for r in alike.itertuples()] + [gap_text(g) for g in unmeasured])
        contexts = [int(c) for c in alike["context_tokens"]] + [int(g["context_tokens"]) for g in unmeasured]
        at = predicted_at(pred, max(contexts)) if contexts else None
        if at is None:
            return []  # no plugin arm in this run
        return [Finding("kv_layout.prediction", "KV layout: the kernel A/B's prediction, not tested",
                        f"No plugin request was measured on a scattered pool, so the kernel A/B's prediction (the "
                        f"plugin's kernel pays at most {at[0]:.3f}x at {format_tokens(at[1])}) is neither confirmed "
                        "nor refuted by this run.", "info",
                        why + ([f"prediction: {pred_source}"] if pred_source else []),
                        {"predicted_max_x": at[0], "prediction_context_tokens": at[1]}, source)]
    ev, worst_gap, few = [], None, []
    numbers: dict[str, Any] = {}
    for r in plug.sort_values("context_tokens").itertuples():
        at = predicted_at(pred, r.context_tokens)
        if at is None:
            continue
        limit, pctx = at
        if r.verdict == NOT_ENOUGH:  # one request against another is no test of a prediction
            few.append(f"{format_tokens(r.context_tokens)}: {r.requests_fresh} / {r.requests_fragmented} requests "
                       f"fresh / fragmented (measured {r.cost_x:.3f}x; at least {MIN_REQUESTS} a state to test the "
                       f"prediction of at most {limit:.3f}x)")
            continue
        ev.append(f"{format_tokens(r.context_tokens)}: measured {r.cost_x:.3f}x (interval {r.cost_lo_x:.3f}-"
                  f"{r.cost_hi_x:.3f}x over requests; {r.rule}), predicted at most {limit:.3f}x (06 at "
                  f"{format_tokens(pctx)})")
        gap = r.cost_bound_x - limit  # the prediction holds when the most it can cost does not pass it
        if worst_gap is None or gap > worst_gap:
            worst_gap = gap
            numbers = {"context_tokens": int(r.context_tokens), "measured_cost_x": float(r.cost_x),
                       "measured_cost_hi_x": float(r.cost_bound_x), "predicted_max_x": limit,
                       "prediction_context_tokens": pctx}
    if worst_gap is None:
        if not few:
            return []
        return [Finding("kv_layout.prediction", "KV layout: the kernel A/B's prediction, not tested",
                        "Not enough requests on a scattered pool to test the kernel A/B's prediction for the plugin's "
                        "kernel.", "info", few + ([f"prediction: {pred_source}"] if pred_source else []),
                        {"verdict": NOT_ENOUGH}, source)]
    ev += few
    if pred_source:
        ev.append(f"prediction: {pred_source}")
    held = worst_gap <= 0.02
    verdict = (f"The plugin's kernel pays for scattering what the kernel A/B predicted or less: at most "
               f"{numbers['measured_cost_hi_x']:.3f}x (the interval's upper end) against a predicted "
               f"{numbers['predicted_max_x']:.3f}x."
               if held else
               f"The plugin's kernel pays more for scattering than the kernel A/B predicted: "
               f"{numbers['measured_cost_x']:.3f}x at {format_tokens(numbers['context_tokens'])} against at most "
               f"{numbers['predicted_max_x']:.3f}x: more than the kernel's gather is involved (the request's other "
               "work, or the layout of the draft slots).")
    return [Finding("kv_layout.prediction", "KV layout: the kernel A/B's prediction", verdict,
                    "ok" if held else "warning", ev, numbers, source)]


def _round(x: Any) -> float | None:
    return None if x is None or x != x else round(float(x), 4)


def _ms_list(values: Iterable[float]) -> str:
    """'12.6, 12.2 ms'."""
    return ", ".join(f"{v:.3g}" for v in values) + " ms"


def _share_text(x: Any) -> str:
    return "-" if x is None or x != x else f"{100 * float(x):.0f}%"


def _num(x: Any) -> str:
    return "-" if x is None or x != x else f"{float(x):.3g}"


def metrics(cost: pd.DataFrame, summ: pd.DataFrame) -> dict[str, Any]:
    """The key numbers for the index and tests: per arm and context, both states' ms and layouts and the ratio."""
    out: dict[str, Any] = {}
    for r in cost.itertuples():
        out.setdefault(r.arm, {})[str(r.context_tokens)] = {
            "fresh_ms": round(r.fresh_ms, 4), "fragmented_ms": round(r.fragmented_ms, 4), "cost_x": round(r.cost_x, 4),
            "cost_lo_x": _round(r.cost_lo_x), "cost_hi_x": _round(r.cost_hi_x), "verdict": r.verdict,
            "level": _round(r.level), "rule": r.rule, "cost_bound_x": _round(r.cost_bound_x),
            "requests_fresh": int(r.requests_fresh), "requests_fragmented": int(r.requests_fragmented),
            "costs_time": bool(r.costs_time),
            "fresh_share_in_long_runs": r.fresh_share, "fragmented_share_in_long_runs": r.fragmented_share,
            "fresh_runs_per_1k": r.fresh_runs_per_1k, "fragmented_runs_per_1k": r.fragmented_runs_per_1k}
    return {"arms": out, "requests": int(summ["requests"].sum()) if not summ.empty else 0}
