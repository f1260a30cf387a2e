"""10's third pool state: the same traffic with the contiguous ("Tier 0") allocator, and whether it buys back the
layout's cost (pure functions, no I/O).

The allocator is a server setting, so it is a property of the arm: an arm named ``<arm>_contiguous`` is the server of
``<arm>`` started with the contiguous allocator (SGLang: the plugin's ``SPECDIAG_SGLANG_KV_ALLOC=contiguous``; the
embedded server: ``--kv-alloc contiguous``) and measured the same way (a fresh pool, then the filler's traffic). Paired
with its base arm it gives three states per arm and context:

- **fresh**: the base arm's requests on a flushed pool;
- **scattered**: the base arm's requests after the filler (SGLang's allocator);
- **contiguous**: the contiguous arm's requests after the same filler.

Where the contiguous arm measured enough fresh requests of its own at a context (states fresh and fragmented on its
server), the contiguous state is set against those: the same server, so the spread between servers (on the H200, fresh requests
of four 4-layer servers took 3.05-5.93 ms a step) leaves the comparison; else against the base arm's fresh requests.
Scattered and contiguous are each set against fresh with 10's own rule (analysis.costs: per-request medians, the ratio
of the medians over requests with its interval, at least :data:`specdiag.stats.MIN_REQUESTS` requests per state, the
interval above 1 and the ratio at least :data:`analysis.MIN_COST_X`; the server as a unit: requests from several parts
must also clear the spread between servers of the whole run, :func:`analysis.spreads`). The contiguous requests are meant to
lie like fresh ones, so their comparison drops analysis.costs' layout condition and keeps the rest. The contiguous
allocator **buys back** the layout's cost on an arm where the scattered requests cost time and the contiguous ones,
after the same traffic, lie in long runs (at least :data:`analysis.FRESH_MIN_SHARE` of tokens in runs of 64 or more)
and do not cost time (their interval holds 1 or lies below it). With fewer requests in any of the three states the
finding says "not enough requests".
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping

import pandas as pd

from specdiag.findings import Finding
from specdiag.plots import format_tokens
from specdiag.spread import server_of
from specdiag.stats import MIN_REQUESTS, NOT_ENOUGH
from specdiag.steps.kv_layout import analysis as kla

SUFFIX = kla.CONTIGUOUS_SUFFIX
FIX_TEXT = ("the contiguous KV allocator (SGLang plugin: SPECDIAG_SGLANG_KV_ALLOC=contiguous; embedded server: "
            "--kv-alloc contiguous)")


def pairs(arms: Iterable[str]) -> dict[str, str]:
    """``{base arm: its contiguous arm}`` for every ``<arm>_contiguous`` whose base arm is there too."""
    names = list(dict.fromkeys(str(a) for a in arms))
    return {n[: -len(SUFFIX)]: n for n in names if n.endswith(SUFFIX) and n[: -len(SUFFIX)] in names}


def _state_rows(rows: list[Mapping[str, Any]], arm: str, state: str, as_state: str, as_arm: str) -> list[dict]:
    """``arm``'s rows of ``state`` as ``as_arm``'s of ``as_state``, each keeping the server it came from."""
    return [{**r, "server": server_of(r), "arm": as_arm, "pool_state": as_state} for r in rows if r.get("arm") == arm
            and r.get("pool_state") == state]


def three_states(rows: Iterable[Mapping[str, Any]]) -> pd.DataFrame:
    """Per paired arm and context: fresh, scattered and contiguous ms per step, both ratios to fresh, whether each
    costs time (10's rule), both layouts, and whether the contiguous allocator buys the cost back."""
    rows = [dict(r) for r in rows]
    out = []
    spread_by_ctx = kla.spreads(rows)
    for base, contig in pairs(r.get("arm") for r in rows if r.get("pool_state")).items():
        scattered = kla.costs(_state_rows(rows, base, "fresh", "fresh", base)
                              + _state_rows(rows, base, "fragmented", "fragmented", base), spread_by_ctx)
        frag = _state_rows(rows, contig, "fragmented", "fragmented", base)
        on_base = kla.costs(_state_rows(rows, base, "fresh", "fresh", base) + frag, spread_by_ctx)
        on_own = kla.costs(_state_rows(rows, contig, "fresh", "fresh", base) + frag, spread_by_ctx)
        own_ok = set() if on_own.empty else set(on_own.loc[on_own["verdict"] != NOT_ENOUGH, "context_tokens"])
        frames = ([on_own[on_own["context_tokens"].isin(own_ok)]] if not on_own.empty else []) + (
            [on_base[~on_base["context_tokens"].isin(own_ok)]] if not on_base.empty else [])
        tier0 = pd.concat(frames) if frames else pd.DataFrame()
        if scattered.empty or tier0.empty:
            continue
        both = scattered.merge(tier0, on=["arm", "context_tokens"], suffixes=("_s", "_c"))
        for r in both.to_dict("records"):
            long_runs = r["fragmented_share_c"] is not None and r["fragmented_share_c"] >= kla.FRESH_MIN_SHARE
            # 10's rule without its layout condition (contiguous requests are meant to be laid out like fresh ones)
            contiguous_costs = bool(r["verdict_c"] == "higher" and r["cost_x_c"] >= kla.MIN_COST_X)
            enough = r["verdict_s"] != NOT_ENOUGH and r["verdict_c"] != NOT_ENOUGH
            out.append({"arm": base, "contiguous_arm": contig, "context_tokens": int(r["context_tokens"]),
                        "fresh_ms": r["fresh_ms_s"], "scattered_ms": r["fragmented_ms_s"],
                        "contiguous_ms": r["fragmented_ms_c"], "scattered_x": r["cost_x_s"],
                        "contiguous_x": r["cost_x_c"], "scattered_interval": kla.cost_text(_side(r, "_s")),
                        "contiguous_interval": kla.cost_text(_side(r, "_c")), "enough_requests": enough,
                        "scattered_verdict": r["verdict_s"], "contiguous_verdict": r["verdict_c"],
                        "scattered_costs": bool(r["costs_time_s"]),
                        "contiguous_costs": contiguous_costs,
                        "contiguous_enough": r["verdict_c"] != NOT_ENOUGH, "contiguous_hi_x": r["cost_bound_x_c"],
                        "layouts_differ": bool(r["layouts_differ_s"]), "fresh_share": r["fresh_share_s"],
                        "scattered_share": r["fragmented_share_s"], "contiguous_share": r["fragmented_share_c"],
                        "contiguous_long_runs": long_runs,
                        "fresh_request_ms": r["fresh_request_ms_s"], "scattered_request_ms": r["fragmented_request_ms_s"],
                        "contiguous_request_ms": r["fragmented_request_ms_c"],
                        "buys_back": enough and bool(r["costs_time_s"]) and long_runs and not contiguous_costs,
                        "step_source": r["step_source_s"], "contiguous_fresh_ms": r["fresh_ms_c"],
                        "contiguous_against": "its own server's fresh requests" if r["context_tokens"] in own_ok
                        else f"{base}'s fresh requests"})
    return pd.DataFrame(out)


def _side(r: Mapping[str, Any], suffix: str) -> dict[str, Any]:
    """One side's columns of a merged scattered/contiguous row, without the suffix."""
    return {k[: -len(suffix)]: v for k, v in r.items() if k.endswith(suffix)}


def _pct(x: float) -> str:
    return f"{100 * (x - 1):+.1f}%"


def _share(x: Any) -> str:
    return "-" if x is None or x != x else f"{100 * float(x):.0f}%"


def findings(states: pd.DataFrame, source: str = "measured") -> list[Finding]:
    """One finding per paired arm, ``kv_layout.tier0.<arm>``: whether the contiguous allocator buys back the layout's
    cost there; with ``numbers['fix']`` where it does (07 names it as the measured fix)."""
    out: list[Finding] = []
    if states.empty:
        return out
    for arm, g in states.groupby("arm", sort=False):
        g = g.sort_values("context_tokens")
        ev = [f"{format_tokens(r.context_tokens)}: fresh {r.fresh_ms:.3g}, scattered {r.scattered_ms:.3g} "
              f"({r.scattered_interval}), contiguous allocator {r.contiguous_ms:.3g} ms per step "
              f"({r.contiguous_interval}, against {r.contiguous_against}, {r.contiguous_fresh_ms:.3g} ms), medians "
              f"over requests; tokens in runs >= 64: {_share(r.fresh_share)} fresh, "
              f"{_share(r.scattered_share)} scattered, {_share(r.contiguous_share)} contiguous" for r in g.itertuples()]
        ev.append(f"step times: {g['step_source'].iloc[0]} ({source}); contiguous arm: {g['contiguous_arm'].iloc[0]}")
        costing, enough = g[g["scattered_costs"] & g["enough_requests"]], g[g["enough_requests"]]
        pick = (costing if not costing.empty else enough if not enough.empty else g).sort_values("scattered_x").iloc[-1]
        numbers: dict[str, Any] = {
            "arm": arm, "context_tokens": int(pick["context_tokens"]), "fresh_ms": float(pick["fresh_ms"]),
            "scattered_ms": float(pick["scattered_ms"]), "contiguous_ms": float(pick["contiguous_ms"]),
            "scattered_x": float(pick["scattered_x"]), "contiguous_x": float(pick["contiguous_x"]),
            "contiguous_share_in_long_runs": pick["contiguous_share"], "buys_back": bool(pick["buys_back"])}
        at = format_tokens(int(pick["context_tokens"]))
        alone = g[g["contiguous_enough"] & g["contiguous_long_runs"]]
        if not g["enough_requests"].any() and not alone.empty:
            r = alone.sort_values("context_tokens").iloc[-1]
            at = format_tokens(int(r["context_tokens"]))
            hi = r["contiguous_hi_x"]
            bound = (f"no cost above {_pct(hi)}" if not bool(r["contiguous_costs"]) and hi == hi and hi is not None
                     else "it costs time")
            verdict = (f"On {arm} the contiguous allocator, after the traffic, kept {_share(r['contiguous_share'])} "
                       f"of the request's tokens in runs >= 64 and took {r['contiguous_ms']:.3g} ms per verify step at "
                       f"{at} against {r['contiguous_fresh_ms']:.3g} fresh ({r['contiguous_interval']}, against "
                       f"{r['contiguous_against']}): {bound}. Whether the scattered pool costs time, and so whether "
                       f"there is a cost to buy back: not enough requests (scattered {r['scattered_interval']}; a "
                       f"verdict takes at least {MIN_REQUESTS} requests per state).")
            severity = "info"
            numbers.update(not_enough_requests=True, context_tokens=int(r["context_tokens"]),
                           contiguous_ms=float(r["contiguous_ms"]), contiguous_x=float(r["contiguous_x"]),
                           contiguous_hi_x=None if hi != hi else float(hi))
        elif not g["enough_requests"].any():
            verdict = (f"On {arm}: not enough requests to say whether the contiguous allocator buys back the layout's "
                       f"cost (at {at}: scattered {pick['scattered_interval']}, contiguous {pick['contiguous_interval']}; "
                       f"a verdict takes at least {MIN_REQUESTS} requests per state).")
            severity = "info"
            numbers["not_enough_requests"] = True
        elif not pick["contiguous_long_runs"]:
            verdict = (f"On {arm} the contiguous allocator did not keep the request contiguous after the traffic: "
                       f"{_share(pick['contiguous_share'])} of its tokens in runs >= 64 at {at} (needs "
                       f"{kla.FRESH_MIN_SHARE:.0%}); check that {pick['contiguous_arm']} ran with it (its server log).")
            severity = "warning"
        elif bool(pick["scattered_costs"]) and bool(pick["buys_back"]):
            verdict = (f"On {arm} the contiguous allocator buys back the layout's cost: after the same traffic its "
                       f"request took {pick['contiguous_ms']:.3g} ms per verify step at {at} against "
                       f"{pick['scattered_ms']:.3g} scattered and {pick['fresh_ms']:.3g} fresh "
                       f"({pick['contiguous_interval']} against fresh, within 10's rule).")
            severity = "ok"
            numbers.update(fix=f"{FIX_TEXT} on {arm}", fix_speedup_x=float(pick["scattered_ms"] / pick["contiguous_ms"]),
                           fix_context_tokens=int(pick["context_tokens"]))
        elif bool(pick["scattered_costs"]):
            verdict = (f"On {arm} the contiguous allocator does not buy back the layout's cost: its request kept "
                       f"{_share(pick['contiguous_share'])} of tokens in runs >= 64 yet took {pick['contiguous_ms']:.3g} "
                       f"ms per verify step at {at} against {pick['fresh_ms']:.3g} fresh ({_pct(pick['contiguous_x'])}"
                       f"; scattered {pick['scattered_ms']:.3g}): more than the layout differs between the states.")
            severity = "warning"
        elif not bool(pick["layouts_differ"]):
            verdict = (f"On {arm} the base arm's scattered requests were laid out like the fresh ones, so there is no "
                       f"layout cost to buy back; the contiguous allocator's request took {pick['contiguous_ms']:.3g} "
                       f"ms per step at {at} ({_pct(pick['contiguous_x'])} against fresh).")
            severity = "info"
        else:
            verdict = (f"On {arm} a scattered pool costs no measurable time (scattered against fresh "
                       f"{pick['scattered_interval']}), so the contiguous allocator has nothing to buy back: "
                       f"{pick['contiguous_ms']:.3g} ms per step at {at} against {pick['fresh_ms']:.3g} fresh "
                       f"({pick['contiguous_interval']}), with {_share(pick['contiguous_share'])} of tokens in "
                       "runs >= 64.")
            severity = "ok" if not bool(pick["contiguous_costs"]) else "info"
        out.append(Finding(f"kv_layout.tier0.{arm}", f"KV layout on {arm}: the contiguous allocator", verdict,
                           severity, ev, numbers, source))
    return out


def metrics(states: pd.DataFrame) -> dict[str, Any]:
    """Per paired arm and context: the three states' ms, both ratios, the contiguous layout and the verdict."""
    out: dict[str, Any] = {}
    for r in states.itertuples():
        out.setdefault(r.arm, {})[str(r.context_tokens)] = {
            "fresh_ms": round(r.fresh_ms, 4), "scattered_ms": round(r.scattered_ms, 4),
            "contiguous_ms": round(r.contiguous_ms, 4), "scattered_x": round(r.scattered_x, 4),
            "contiguous_x": round(r.contiguous_x, 4), "contiguous_share_in_long_runs": r.contiguous_share,
            "buys_back": bool(r.buys_back)}
    return out
