"""What the experts cost a batch-1 verify step, and what that means for the number of draft tokens (pure).

- :func:`step_bytes`: the weight and KV bytes one rank reads in one verify step of T tokens (specdiag.geometry's
  weight_bytes_per_step and kv_bytes_per_step), with the routed experts counted from the **distinct experts a pass
  touches** (measured, or the uniform expectation) instead of a routing assumption; the expert share of the step's
  bytes, and the expert bytes over those of a one-token step (top_k experts).
- :func:`measured_steps`: ms per verify step against tokens per step from 11's ``moe_steps`` rows (medians), and
  the multiplier over the fewest tokens measured.
- :func:`ladder`: the token ladder over requests: at each context, a step of T tokens against the fewest tokens' step
  (T = 1: a server that does not speculate, a plain one-token decode step) as the ratio of the request medians with
  its interval over requests at the level it has, the server as a unit (:func:`specdiag.spread.compare_across`: each T
  is its own server; requests of one machine compared, requests from several parts must also clear the spread
  between servers, and the row says which rule it used), "not enough requests" under 3 a cell; requests flagged
  ``first_on_server`` are left out.
- :func:`project`: the same bytes for Kimi K2.6 (preset ``kimi-k2.6``: 61 layers, 60 MoE layers of 384 experts,
  top-8, one shared expert, INT4 routed experts in groups of 32 with bf16 scales) under tensor parallelism over the
  investigation's 8 GPUs (:data:`KIMI_GPU`, its published bandwidth from :mod:`specdiag.hardware`), at a context, with
  distinct experts per MoE layer (the uniform expectation, an upper bound, unless a trained router's were measured):
  a bytes floor (bytes / peak), not a time measurement.
- :func:`best_draft_tokens`: with per-draft acceptance a (a chain: a step scoring T tokens commits
  (1 - a^T) / (1 - a) tokens on average, the bonus included), tokens per ms = that / time(T); the best T per a.

Every number carries its source in the tables: ``measured`` (the recorder, the seeds' step times), ``published``
(Kimi K2.6's shape and quantization, the GPU's peak), ``computed`` (bytes and floors), ``parameter`` (acceptance).
"""

from __future__ import annotations

import math
import statistics
from typing import Any, Iterable, Mapping, Sequence

import pandas as pd

from specdiag.geometry import kv_bytes_per_step, weight_bytes_per_step
from specdiag.geometry.types import ModelGeometry
from specdiag.spread import Sample, compare_across, machine_of, server_spreads
from specdiag.stats import level_text

KIMI_PRESET = "kimi-k2.6"
KIMI_GPU = "NVIDIA RTX PRO 6000 Blackwell"  # the investigation's GPUs (data/reference/ct200-kimi-k26)
KIMI_TP = 8
ACCEPTANCE = (0.0, 0.5, 0.8, 0.95)  # per-draft acceptance rates shown (0.0: the investigation's long-context prose)


def expert_bytes(geom: ModelGeometry, tp_size: int = 1) -> float:
    """Bytes one rank holds of one routed expert (gate, up, down), at the model's routed-expert bytes per param."""
    assert geom.moe is not None
    return 3 * geom.hidden_size * geom.moe.moe_intermediate_size / tp_size * geom.weight_bytes.routed_experts


def step_bytes(geom: ModelGeometry, tokens: int, distinct: float, context_tokens: int,
               tp_size: int = 1) -> dict[str, float]:
    """Bytes one rank reads in a step of ``tokens`` tokens whose MoE layers each touch ``distinct`` experts."""
    if geom.moe is None:
        raise ValueError(f"{geom.name} has no routed experts")
    wb = weight_bytes_per_step(geom, tp_size=tp_size, tokens_per_step=tokens, routing="min")
    n_moe = len(geom.moe.moe_layers)
    routed = n_moe * distinct * expert_bytes(geom, tp_size)
    one = n_moe * geom.moe.num_experts_per_tok * expert_bytes(geom, tp_size)
    other = wb.total - wb.routed_experts
    kv = kv_bytes_per_step(geom, context_tokens, tp_size=tp_size)
    total = routed + other + kv
    return {"tokens": tokens, "distinct": distinct, "routed_expert_bytes": routed, "other_weight_bytes": other,
            "kv_bytes": kv, "total_bytes": total, "expert_share": routed / total,
            "experts_over_t1_x": routed / one}


def measured_steps(rows: Iterable[Mapping[str, Any]]) -> pd.DataFrame:
    """Per tokens per verify step (and context): requests, ms per step (median of ``step_ms``), commit length, and the
    time over the fewest tokens' at that context."""
    df = pd.DataFrame([dict(r) for r in rows])
    if df.empty or "step_ms" not in df:
        return pd.DataFrame()
    df = df[df["step_ms"].notna() & df.get("error", pd.Series(None, index=df.index)).isna()]
    if df.empty:
        return pd.DataFrame()
    out = []
    for (ctx, t), g in df.groupby(["context_tokens", "tokens_per_step"]):
        out.append({"context_tokens": int(ctx), "tokens_per_step": int(t), "requests": len(g),
                    "step_ms": float(statistics.median(g["step_ms"])),
                    "commit_length": float(statistics.median(g["commit_length"].dropna()))
                    if "commit_length" in g and g["commit_length"].notna().any() else None})
    res = pd.DataFrame(out).sort_values(["context_tokens", "tokens_per_step"]).reset_index(drop=True)
    base = res.groupby("context_tokens")["step_ms"].transform("first")
    res["over_fewest_x"] = res["step_ms"] / base
    return res


def _ok_steps(rows: Iterable[Mapping[str, Any]]) -> pd.DataFrame:
    df = pd.DataFrame([dict(r) for r in rows])
    if df.empty or "step_ms" not in df:
        return pd.DataFrame()
    keep = df["step_ms"].notna()
    if "error" in df:
        keep &= df["error"].isna()
    if "first_on_server" in df:
        keep &= ~df["first_on_server"].fillna(False).astype(bool)
    return df[keep]


def _server(row: Mapping[str, Any], tokens: int) -> str:
    part = row.get("part")
    return str(row.get("server") or f"T={tokens}" + (f" (part {int(part)})" if part is not None and part == part else ""))


def ladder(rows: Iterable[Mapping[str, Any]], seed: int = 0) -> pd.DataFrame:
    """Per context and T (module doc): requests, ms per step (median over requests and its range), and against the
    fewest tokens' step at that context the ratio with its interval (``lo``, ``hi``, its ``level``), verdict
    ("higher", "lower", "tie", "not enough requests") and ``rule``; the values of each request kept in
    ``request_ms``."""
    del seed
    df = _ok_steps(rows)
    if df.empty:
        return pd.DataFrame()
    cells: dict[tuple[str, int], list[Sample]] = {}
    for r in df.to_dict("records"):
        t = int(r["tokens_per_step"])
        cells.setdefault((f"T={t}", int(r["context_tokens"])), []).append(
            Sample(float(r["step_ms"]), _server(r, t), machine_of(r)))
    spreads = server_spreads(cells, "ms")
    out = []
    for ctx in sorted({c for _, c in cells}):
        by_t = {int(k[2:]): v for (k, c), v in cells.items() if c == ctx}
        base = min(by_t)
        for t, vals in sorted(by_t.items()):
            c = compare_across(by_t[base], vals, spreads.get(ctx))
            values = [s.value for s in vals]
            out.append({"context_tokens": int(ctx), "tokens_per_step": t, "base_tokens": base,
                        "base_requests": len(by_t[base]), "requests": len(vals),
                        "step_ms": statistics.median(values), "step_ms_min": min(values), "step_ms_max": max(values),
                        "over_base_x": c.ratio, "lo": c.lo if t != base else None, "hi": c.hi if t != base else None,
                        "level": c.level if t != base else None, "rule": c.rule if t != base else "",
                        "verdict": c.verdict if t != base else "", "request_ms": values})
    df = pd.DataFrame(out)
    for col in ("lo", "hi", "level"):  # None where there is no interval (not NaN: the result is JSON)
        df[col] = pd.Series([None if v is None or v != v else float(v) for v in df[col]], dtype=object)
    return df


def ladder_text(r: Any) -> str:
    """One ladder row against its base: '3.45x (90% interval 3.4-3.5x over 3 / 3 requests; one machine): slower',
    or '3.45x on 2 / 2 requests: not enough requests'."""
    counts = f"{int(r.base_requests)} / {int(r.requests)} requests"
    if r.lo is None or (isinstance(r.lo, float) and math.isnan(r.lo)):
        return f"{r.over_base_x:.3g}x on {counts}: not enough requests"
    said = {"higher": "slower", "lower": "faster", "tie": "a tie: the interval holds 1"}.get(r.verdict, r.verdict)
    if r.verdict == "tie" and not r.lo <= 1.0 <= r.hi:
        said = "a tie inside the spread between servers"
    level = getattr(r, "level", None)
    named = f"{level_text(level)} interval" if level is not None and level == level else "interval"
    rule = getattr(r, "rule", "")
    return f"{r.over_base_x:.3g}x ({named} {r.lo:.3g}-{r.hi:.3g}x over {counts}{'; ' + rule if rule else ''}): {said}"


def project(distinct_by_tokens: Mapping[int, float], context_tokens: int, peak_gb_s: float,
            geom: ModelGeometry, tp_size: int = KIMI_TP) -> pd.DataFrame:
    """Per T: the bytes one of ``tp_size`` ranks reads per verify step of Kimi K2.6 (``geom``) with ``distinct``
    experts per MoE layer, its floor at ``peak_gb_s`` (ms), the expert share, and the floor over T=1's."""
    rows = [step_bytes(geom, t, d, context_tokens, tp_size) for t, d in sorted(distinct_by_tokens.items())]
    df = pd.DataFrame(rows)
    if df.empty:
        return df
    df["peak_gb_s"] = float(peak_gb_s)
    df["floor_ms"] = df["total_bytes"] / (peak_gb_s * 1e9) * 1e3
    df["expert_floor_ms"] = df["routed_expert_bytes"] / (peak_gb_s * 1e9) * 1e3
    df["floor_over_first_x"] = df["floor_ms"] / df["floor_ms"].iloc[0]
    return df


def expected_commit(tokens: int, acceptance: float) -> float:
    """Tokens a chain step that scores ``tokens`` tokens commits on average (bonus included), each draft accepted with
    probability ``acceptance`` given the ones before it."""
    if tokens < 1 or not 0.0 <= acceptance <= 1.0:
        raise ValueError("tokens >= 1 and 0 <= acceptance <= 1")
    return float(tokens) if acceptance == 1.0 else (1 - acceptance ** tokens) / (1 - acceptance)


def best_draft_tokens(time_ms_by_tokens: Mapping[int, float],
                      acceptance: Sequence[float] = ACCEPTANCE) -> pd.DataFrame:
    """Per acceptance rate: tokens per ms at each T (expected commit / step time) and the best T."""
    out = []
    for a in acceptance:
        rates = {t: expected_commit(t, a) / ms for t, ms in sorted(time_ms_by_tokens.items()) if ms and ms > 0}
        if not rates:
            continue
        best = max(rates, key=lambda t: rates[t])
        out.append({"acceptance": a, "best_tokens_per_step": best,
                    "best_tokens_per_s": 1000.0 * rates[best],
                    **{f"tok_s_at_{t}": 1000.0 * r for t, r in rates.items()}})
    return pd.DataFrame(out)


def best_columns(best: pd.DataFrame) -> dict[str, str]:
    """Readable headers, with units, for a :func:`best_draft_tokens` table (``context_tokens`` first when present)."""
    names = {"context_tokens": "context (tokens)", "acceptance": "acceptance per draft",
             "best_tokens_per_step": "best T (tokens per step)", "best_tokens_per_s": "tokens/s at the best T"}
    cols = ["context_tokens"] * ("context_tokens" in best) + [c for c in best.columns if c != "context_tokens"]
    return {c: names.get(c, f"tokens/s at T={c.removeprefix('tok_s_at_')}") for c in cols}


def best_formats(best: pd.DataFrame) -> dict[str, str]:
    """Whole tokens per second for the rates, the acceptance as given."""
    rates = [c for c in best.columns if c.startswith(("tok_s_at_", "best_tokens_per_s"))]
    return {"acceptance": "{:g}", **{c: "{:,.0f}" for c in rates}}


def interpolate(points: Mapping[int, float], at: Iterable[int]) -> dict[int, float]:
    """Linear interpolation in log2(T) of measured points (distinct experts, step times) at the T in ``at`` that lie
    within the measured range; T outside it are left out."""
    xs = sorted(points)
    out: dict[int, float] = {}
    for t in at:
        if t in points:
            out[t] = float(points[t])
            continue
        lo = max((x for x in xs if x < t), default=None)
        hi = min((x for x in xs if x > t), default=None)
        if lo is None or hi is None:
            continue
        f = (math.log2(t) - math.log2(lo)) / (math.log2(hi) - math.log2(lo))
        out[t] = float(points[lo] + f * (points[hi] - points[lo]))
    return out
