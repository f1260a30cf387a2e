"""10's numbers from its rows: fresh against fragmented per arm and context, the kernel A/B's prediction, the
verdicts (pure functions, no I/O).

The time of a step: per request, the steps' samples (the gaps between stream chunks, client side; on the embedded
server its own verify times, which leave out HTTP and streaming) pooled over the repeats; the arm's number at a context
and pool state is their median. Fragmented over fresh is the layout's cost; "costs time" is said only where the
fragmented samples rank above the fresh ones (stats.median_diff_test, one-sided, p < 0.05), the ratio is at least
:data:`MIN_COST_X`, and, with two or more requests in each state, every fragmented request's median step is above every
fresh one's. The steps of one request are not independent of each other, and on a shared 2-core host one fragmented
request took 72.4 ms per step where its twin took 34.2 (measured), so the requests must separate too. A comparison
counts only when the fresh requests were contiguous (at least :data:`FRESH_MIN_SHARE` of tokens in runs of 64 or more) and the fragmented ones were not (at most
:data:`FRAG_MAX_SHARE`); otherwise the finding says the layouts did not differ enough to judge.

The prediction: the kernel A/B (06) timed the same split-KV kernel family on a page_size-1 token table shuffled token
by token against 64-token pages (``analysis.page_size_effect``); the largest of those ratios at a context, over the
8-head shapes, is what scattering should cost the plugin's kernel at most.
"""

from __future__ import annotations

import statistics
from typing import Any, Iterable, Mapping

import pandas as pd

from specdiag.findings import Finding
from specdiag.plots import format_tokens
from specdiag.stats import median_diff_test

MIN_COST_X = 1.02  # a fragmented/fresh ratio below this is called no cost, whatever the test says
FRESH_MIN_SHARE = 0.9  # a fresh request counts as contiguous at this share of tokens in runs >= 64
FRAG_MAX_SHARE = 0.5  # a fragmented request counts as scattered at or below this share
MAX_SAMPLES = 60  # steps per side the exact test takes (evenly spaced when there are more)
KEY = ["arm", "pool_state", "context_tokens", "repeat"]
STATES = ("fresh", "fragmented")
#: an arm named ``<arm>`` + this is ``<arm>``'s server with the contiguous allocator (tier0.py pairs them)
CONTIGUOUS_SUFFIX = "_contiguous"


def latest(rows: Iterable[Mapping[str, Any]]) -> pd.DataFrame:
    """One row per (arm, state, context, repeat), the last written; arm-level failures kept apart (no state)."""
    df = pd.DataFrame([dict(r) for r in rows])
    if df.empty or "pool_state" not in df:
        return pd.DataFrame(columns=[*KEY, "error"])
    df = df[df["pool_state"].notna()]
    return df.drop_duplicates(subset=KEY, keep="last").reset_index(drop=True)


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
    medians = [_samples(group.iloc[[i]])[0] for i in range(len(group))]
    return [statistics.median(m) for m in medians if m]


def separated(fresh: list[float], fragmented: list[float]) -> bool | None:
    """Whether every fragmented request is slower than every fresh one; None with one request in either state."""
    if len(fresh) < 2 or len(fragmented) < 2:
        return None
    return min(fragmented) > max(fresh)


def _filler_cycles(g: pd.DataFrame) -> float | None:
    vals = [float(v["cycles"]) for v in g.get("filler", pd.Series(dtype=object)) if isinstance(v, Mapping)]
    return max(vals) if vals else None


def _spaced(values: list[float], n: int = MAX_SAMPLES) -> list[float]:
    if len(values) <= n:
        return values
    return [values[round(i * (len(values) - 1) / (n - 1))] for i in range(n)]


def costs(rows: Iterable[Mapping[str, Any]]) -> pd.DataFrame:
    """Per arm and context with both states: fresh and fragmented ms per step, their ratio, the test's p-value that
    fragmented is slower, both layouts, and whether the comparison counts (module docstring)."""
    df = latest(rows)
    if df.empty:
        return pd.DataFrame()
    ok = df[df["error"].isna()] if "error" in df else df
    out = []
    for (arm, ctx), g in ok.groupby(["arm", "context_tokens"], sort=False):
        fresh, frag = g[g["pool_state"] == "fresh"], g[g["pool_state"] == "fragmented"]
        if fresh.empty or frag.empty:
            continue
        a, what = _samples(fresh)
        b, _ = _samples(frag)
        if not a or not b:
            continue
        ratio = statistics.median(b) / statistics.median(a)
        p = median_diff_test(_spaced(a), _spaced(b)).p_higher if len(a) >= 2 and len(b) >= 2 else None
        sf, sg = _share(fresh, "share_in_long_runs"), _share(frag, "share_in_long_runs")
        counts = sf is not None and sg is not None and sf >= FRESH_MIN_SHARE and sg <= FRAG_MAX_SHARE
        fresh_req, frag_req = _request_medians(fresh), _request_medians(frag)
        apart = separated(fresh_req, frag_req)
        out.append({"arm": arm, "context_tokens": int(ctx), "fresh_ms": statistics.median(a),
                    "fragmented_ms": statistics.median(b), "cost_x": ratio, "p_slower": p,
                    "fresh_request_ms": fresh_req, "fragmented_request_ms": frag_req, "requests_separate": apart,
                    "costs_time": bool(counts and p is not None and p < 0.05 and ratio >= MIN_COST_X
                                       and apart is not False),
                    "fresh_share": sf, "fragmented_share": sg,
                    "fresh_runs_per_1k": _share(fresh, "runs_per_1k_tokens"),
                    "fragmented_runs_per_1k": _share(frag, "runs_per_1k_tokens"),
                    "layouts_differ": counts, "steps_fresh": len(a), "steps_fragmented": len(b), "step_source": what})
    return pd.DataFrame(out)


def kernel_prediction(kernel_ab_rows: Iterable[Mapping[str, Any]]) -> pd.DataFrame:
    """From a kernel A/B run's rows: per context, the largest p1-shuffled over 64-token-page time of the split-KV
    Triton kernel over the 8-head shapes, and the shapes it covers."""
    from specdiag.steps.kernel_ab import analysis as kab  # noqa: PLC0415 - 06's analysis (pure)

    df = kab.measured(kernel_ab_rows)
    both = df[df["arm"].isin(["split_triton", "split_triton_b64"])]
    if both.empty:
        return pd.DataFrame()
    t = both.pivot_table(index=kab.CASE, columns="arm", values="us", aggfunc="first").dropna()
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
    import math  # noqa: PLC0415

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
        g = g.sort_values("context_tokens")
        ev = [f"{format_tokens(r.context_tokens)}: {r.fresh_ms:.3g} ms per step fresh, {r.fragmented_ms:.3g} ms "
              f"fragmented ({_pct(r.cost_x)}, p = {r.p_slower:.2g} that fragmented is slower; "
              f"{_share_text(r.fresh_share)} then {_share_text(r.fragmented_share)} of tokens in runs >= 64, "
              f"{_num(r.fresh_runs_per_1k)} then {_num(r.fragmented_runs_per_1k)} runs per 1k tokens"
              + (f"; per request: fresh {_ms_list(r.fresh_request_ms)}, fragmented {_ms_list(r.fragmented_request_ms)}"
                 if len(r.fresh_request_ms) + len(r.fragmented_request_ms) > 2 else "") + ")"
              for r in g.itertuples()]
        ev.append(f"step times: {g['step_source'].iloc[0]} ({source})")
        judged = g[g["layouts_differ"]]
        last = g.iloc[-1]
        numbers: dict[str, Any] = {"arm": arm, "context_tokens": int(last["context_tokens"]),
                                   "fresh_ms": float(last["fresh_ms"]), "fragmented_ms": float(last["fragmented_ms"]),
                                   "cost_x": float(last["cost_x"]), "p_slower": last["p_slower"],
                                   "fresh_share_in_long_runs": last["fresh_share"],
                                   "fragmented_share_in_long_runs": last["fragmented_share"]}
        if judged.empty:
            out.append(Finding(f"kv_layout.{arm}.not_fragmented", f"KV layout on {arm}: the layouts did not differ",
                               f"On {arm} the fresh and fragmented requests were laid out too much alike to judge the "
                               f"layout's cost (fresh needs >= {FRESH_MIN_SHARE:.0%} of tokens in runs >= 64, "
                               f"fragmented <= {FRAG_MAX_SHARE:.0%}): cycle the pool more (filler cycles) or check "
                               "that the radix cache is off.", "warning", ev, numbers, source))
            continue
        costing = judged[judged["costs_time"]]
        pool = costing if not costing.empty else judged  # a context that costs is the verdict, else the largest ratio
        worst = pool.loc[pool["cost_x"].idxmax()]
        numbers.update(context_tokens=int(worst["context_tokens"]), fresh_ms=float(worst["fresh_ms"]),
                       fragmented_ms=float(worst["fragmented_ms"]), cost_x=float(worst["cost_x"]),
                       p_slower=worst["p_slower"])
        overlap = judged[(judged["requests_separate"] == False) & (judged["cost_x"] >= MIN_COST_X)  # noqa: E712
                         & (judged["p_slower"].fillna(1.0) < 0.05)]
        if bool(worst["costs_time"]):
            single = worst["requests_separate"] is None
            verdict = (f"On {arm} a fragmented pool costs time: {_pct(worst['cost_x'])} per verify step at "
                       f"{format_tokens(worst['context_tokens'])} ({worst['fragmented_ms']:.3g} against "
                       f"{worst['fresh_ms']:.3g} ms), so keeping each request's KV contiguous pays there"
                       + (" (one request per state: the test ranks one request's steps against another's, so a "
                          "repeat would confirm it)." if single else "."))
            severity = "warning" if worst["cost_x"] >= 1.10 else "info"
            if worst["cost_x"] >= 1.05:
                numbers.update(fix=f"a contiguous KV layout (flushed pool) on {arm}",
                               fix_speedup_x=float(worst["cost_x"]), fix_context_tokens=int(worst["context_tokens"]))
        elif not overlap.empty:
            o = overlap.loc[overlap["cost_x"].idxmax()]
            verdict = (f"On {arm} the layout's cost is not established: fragmented steps were {_pct(o['cost_x'])} at "
                       f"{format_tokens(o['context_tokens'])}, but the requests overlap (fresh "
                       f"{_ms_list(o['fresh_request_ms'])}, fragmented {_ms_list(o['fragmented_request_ms'])}): the "
                       "spread between requests covers the difference. More repeats would settle it.")
            severity = "info"
            numbers.update(context_tokens=int(o["context_tokens"]), cost_x=float(o["cost_x"]),
                           fresh_ms=float(o["fresh_ms"]), fragmented_ms=float(o["fragmented_ms"]),
                           p_slower=o["p_slower"], requests_overlap=True)
        else:
            verdict = (f"On {arm} the layout costs no measurable time: fragmented over fresh is at most "
                       f"{worst['cost_x']:.3f}x ({_pct(worst['cost_x'])}) at {format_tokens(worst['context_tokens'])} "
                       "and the step samples do not rank it slower, so defragmenting would not speed this arm up.")
            severity = "ok"
        out.append(Finding(f"kv_layout.{arm}", f"KV layout on {arm}", verdict, severity, ev, numbers, source))
    out.extend(_prediction_findings(cost, pred, source, prediction_source, missing))
    return out + gap


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
    ev, worst_gap = [], None
    numbers: dict[str, Any] = {}
    for r in plug.sort_values("context_tokens").itertuples():
        at = predicted_at(pred, r.context_tokens)
        if at is None:
            continue
        limit, pctx = at
        ev.append(f"{format_tokens(r.context_tokens)}: measured {r.cost_x:.3f}x, predicted at most {limit:.3f}x "
                  f"(06 at {format_tokens(pctx)})")
        gap = r.cost_x - limit
        if worst_gap is None or gap > worst_gap:
            worst_gap = gap
            numbers = {"context_tokens": int(r.context_tokens), "measured_cost_x": float(r.cost_x),
                       "predicted_max_x": limit, "prediction_context_tokens": pctx}
    if worst_gap is None:
        return []
    if pred_source:
        ev.append(f"prediction: {pred_source}")
    held = worst_gap <= 0.02
    verdict = (f"The plugin's kernel pays for scattering what the kernel A/B predicted or less: at most "
               f"{numbers['measured_cost_x']:.3f}x against a predicted {numbers['predicted_max_x']:.3f}x."
               if held else
               f"The plugin's kernel pays more for scattering than the kernel A/B predicted: "
               f"{numbers['measured_cost_x']:.3f}x at {format_tokens(numbers['context_tokens'])} against at most "
               f"{numbers['predicted_max_x']:.3f}x: more than the kernel's gather is involved (the request's other "
               "work, or the layout of the draft slots).")
    return [Finding("kv_layout.prediction", "KV layout: the kernel A/B's prediction", verdict,
                    "ok" if held else "warning", ev, numbers, source)]


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
            "p_slower": None if r.p_slower is None else float(f"{float(r.p_slower):.3g}"), "costs_time": bool(r.costs_time),
            "fresh_share_in_long_runs": r.fresh_share, "fragmented_share_in_long_runs": r.fragmented_share,
            "fresh_runs_per_1k": r.fresh_runs_per_1k, "fragmented_runs_per_1k": r.fragmented_runs_per_1k}
    return {"arms": out, "requests": int(summ["requests"].sum()) if not summ.empty else 0}
