"""11's tables and verdicts from a run folder's recorder dumps, step times and routed experts (pure but for reading
the run's files in :func:`load_run`).

The verdicts, each with its numbers' sources:

- ``moe.routing_spread`` (the check, first): do distinct tokens touch as many experts as independent tokens would?
  Random weights can route every token alike; below :data:`routing.SPREAD_MIN` the seeds' counts are not used for
  conclusions.
- ``moe.expert_share``: at batch 1 and the shortest context measured, the token ladder over requests (a step of T
  tokens against the one-token step, :func:`cost.ladder`: ratio of request medians with its interval at the level it
  has, the server as a unit (each T its own server: requests from several parts also clear the spread between
  servers), "not enough requests" under 3 a cell; the one-token server does not speculate), the bytes a step reads with the distinct
  experts the **measured verify passes** read (the recorder's counts) and their floor, beside the bytes T distinct
  drafts would read (windows of generated tokens) where both exist, the measured steps over that floor (a range over
  requests), and the stock verify kernel's share of a step where the run holds profiler steps (``step_profile``).
- ``moe.best_draft_tokens``: from the measured step times, the T that commits the most tokens per ms at a few
  per-draft acceptance rates (parameter); said only where every T at that context has 3 requests.
- ``moe.ep_balance``: under expert parallelism at 2, 4, 8 ranks, the busiest rank's **distinct experts** over the mean
  rank's (at batch 1 a rank's bytes are its distinct experts: this is its expert bytes over tensor parallelism's,
  where every rank reads a slice of every expert) beside its tokens over the mean (what FLOPs see), with the range
  over the recorded passes.
- ``moe.kimi_projection``: the same bytes for Kimi K2.6 on the investigation's 8 GPUs (TP8, INT4 experts). A
  random-weight router picks its experts from the token id, so its "measured" distinct experts are the uniform
  expectation's: the projection uses the uniform expectation and says it is an upper bound (a trained router's tokens
  share experts and touch fewer); only a trained router at Kimi's expert count and top_k gives a measured projection.
"""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import pandas as pd

from specdiag.findings import Finding
from specdiag.geometry import load_geometry
from specdiag.geometry.types import ModelGeometry
from specdiag.hardware import lookup_gpu
from specdiag.plots import format_tokens
from specdiag.stats import MIN_REQUESTS, NOT_ENOUGH
from specdiag.steps.moe_batch1 import balance, cost, recorder, routing
from specdiag.steps.moe_batch1.measure import DUMPS_TABLE, ROUTING_TABLE, STEPS_TABLE


@dataclass
class MoERun:
    """What 11 analyses, read from a run folder."""

    dumps: dict[int, recorder.Dump] = field(default_factory=dict)  # tokens per verify step -> its recorder dump
    steps: list[dict[str, Any]] = field(default_factory=list)  # moe_steps rows
    routing: list[dict[str, Any]] = field(default_factory=list)  # moe_routing rows
    dump_rows: list[dict[str, Any]] = field(default_factory=list)  # moe_dumps rows (errors included)
    config: dict[str, Any] | None = None  # the served model's config.json (run.json moe_model_config)
    device: dict[str, Any] = field(default_factory=dict)  # run.json device (gpu, peak_gb_s, its source)
    source: str = "measured"
    random_router: bool = False  # run.json moe_model_made_by says the weights (router included) are random
    profile: list[dict[str, Any]] = field(default_factory=list)  # step_profile rows (profiler steps), when recorded

    @property
    def empty(self) -> bool:
        return not (self.dumps or self.steps or self.routing)


def load_run(run: Any) -> MoERun:
    """The dumps named by the run's moe_dumps rows (the last one per T), its rows, and run.json's model and device."""
    out = MoERun(steps=run.rows(STEPS_TABLE), routing=run.rows(ROUTING_TABLE), dump_rows=run.rows(DUMPS_TABLE),
                 config=run.meta.get("moe_model_config"), device=dict(run.meta.get("device") or {}),
                 source=str(run.meta.get("data_source") or "measured"),
                 random_router="random weights" in str(run.meta.get("moe_model_made_by") or ""),
                 profile=run.rows("step_profile"))
    out.steps = flag_first(out.steps, out.dump_rows + out.routing)
    for row in out.dump_rows:
        if row.get("file") and not row.get("error"):
            path = Path(run.path) / row["file"]
            if recorder.stored(path):
                out.dumps[int(row["tokens_per_step"])] = recorder.load(path)
    layers = int((out.config or {}).get("num_hidden_layers") or 0)
    k = int((out.config or {}).get("num_experts_per_tok") or 0)
    for row in out.routing:  # rows recorded before captured_rows existed get it from their file
        if "captured_rows" not in row and row.get("file") and layers and k and recorder.stored(Path(run.path) / row["file"]):
            doc = json.loads(recorder.read_bytes(Path(run.path) / row["file"]))
            row["captured_rows"] = routing.captured_rows(routing.decode_sglang(doc["routed_experts"], layers, k))
    return out


def flag_first(steps: list[dict[str, Any]], earlier: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The timed rows with ``first_on_server``: True on each server's earliest timed row (a server: one T and part)
    when no recorder pass or routed-experts request of that server was sent before it (then that row is the server's
    first request, left out of the comparisons)."""
    out = [dict(r) for r in steps]
    first: dict[tuple[Any, Any], int] = {}
    for i, r in enumerate(out):
        k = (r.get("tokens_per_step"), r.get("part"))
        if k not in first or (r.get("ts_unix_s") or 0) < (out[first[k]].get("ts_unix_s") or 0):
            first[k] = i
    for i, r in enumerate(out):
        k = (r.get("tokens_per_step"), r.get("part"))
        before = any((e.get("tokens_per_step"), e.get("part")) == k and (e.get("ts_unix_s") or 0) < (r.get("ts_unix_s") or 0)
                     for e in earlier)
        r["first_on_server"] = first.get(k) == i and not before
    return out


def geometry_of(config: Mapping[str, Any] | None) -> ModelGeometry | None:
    return load_geometry(dict(config)) if config else None


def _top_k(mr: MoERun) -> int:
    return int((mr.config or {}).get("num_experts_per_tok") or 8)


def passes(mr: MoERun) -> pd.DataFrame:
    """Every recorded pass of every T's dump (routing.pass_table), with the server's T."""
    frames = []
    for t, dump in sorted(mr.dumps.items()):
        df = routing.pass_table(dump, _top_k(mr), verify_tokens=t)
        if not df.empty:
            frames.append(df.assign(server_tokens_per_step=t))
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def distinct_table(mr: MoERun, pass_df: pd.DataFrame) -> pd.DataFrame:
    """Per tokens per pass: the recorder's verify (and decode) passes; T=1 from decode passes."""
    if pass_df.empty:
        return pd.DataFrame()
    num_experts = next(iter(mr.dumps.values())).num_experts
    t = routing.by_tokens(pass_df[pass_df["kind"].isin(["verify", "decode"])], num_experts, _top_k(mr))
    return t


def window_tables(mr: MoERun) -> pd.DataFrame:
    """The routed-experts answers' windows (generated tokens), one table over the servers."""
    rows = []
    for r in mr.routing:
        for w in r.get("windows") or []:
            rows.append({**w, "server_tokens_per_step": r.get("tokens_per_step"), "part": "generated"})
        for w in r.get("prompt_windows") or []:
            rows.append({**w, "server_tokens_per_step": r.get("tokens_per_step"), "part": "prompt"})
    return pd.DataFrame(rows)


def balance_table(mr: MoERun) -> pd.DataFrame:
    """EP balance of the verify (and decode) passes of every dump, per tokens and rank count."""
    frames = []
    for t, dump in sorted(mr.dumps.items()):
        per = balance.pass_balance(dump, _top_k(mr))
        if not per.empty:
            frames.append(per[per["tokens"] == t])
    return balance.balance_table(pd.concat(frames, ignore_index=True)) if frames else pd.DataFrame()


def generated_windows(windows: pd.DataFrame) -> pd.DataFrame:
    """Per T: the routed-experts answers' windows of generated tokens (median over the answers)."""
    if windows.empty:
        return pd.DataFrame()
    g = windows[windows["part"] == "generated"]
    if g.empty:
        return pd.DataFrame()
    return (g.groupby("tokens", as_index=False)
            .agg(windows=("windows", "sum"), distinct=("distinct", "median"), expected_uniform=("expected_uniform", "first"),
                 spread_ratio=("spread_ratio", "median")).assign(kind="window"))


def spread(pass_df: pd.DataFrame, windows: pd.DataFrame) -> tuple[bool | None, float | None, str]:
    """Do distinct tokens route apart? From windows of generated tokens (a routed-experts answer: consecutive tokens
    of real output) where there are any, else from the verify passes (whose drafts may repeat a token: then they
    understate it)."""
    gw = generated_windows(windows)
    gw = gw[gw["tokens"] > 1] if not gw.empty else gw
    if not gw.empty:
        ok, ratio, _ = routing.spread_check(gw, kind="window")
        return ok, ratio, (f"windows of T generated tokens (routed experts) touch {100 * ratio:.0f}% of the experts "
                           f"independent tokens would (median over T = {', '.join(str(int(t)) for t in gw['tokens'])}; "
                           f"spread when >= {100 * routing.SPREAD_MIN:.0f}%)")
    if pass_df.empty:
        return None, None, "no recorder dump and no routed-experts answer"
    return routing.spread_check(pass_df)


def repeated_drafts(dt: pd.DataFrame) -> pd.DataFrame:
    """The verify rows of :func:`distinct_table` whose passes routed like fewer than half their tokens (drafts that
    repeat a token)."""
    if dt.empty or "effective_tokens" not in dt:
        return pd.DataFrame()
    v = dt[(dt["kind"] == "verify") & (dt["effective_tokens"] < 0.5 * dt["tokens"])]
    return v.reset_index(drop=True)


def passes_distinct(dt: pd.DataFrame) -> dict[int, float]:
    """Per T: the distinct experts per MoE layer the measured verify passes read (the recorder's counts; T=1 its
    decode passes), median over passes and layers: what the measured steps read."""
    if dt.empty:
        return {}
    sel = dt[dt["kind"].isin(["verify", "decode"])]
    return {int(r.tokens): float(r.distinct) for r in sel.itertuples()}


def window_distinct(windows: pd.DataFrame, spread_ok: bool | None) -> dict[int, float]:
    """Per T: the distinct experts windows of T generated tokens touch (what T distinct drafts would read), when the
    routing spreads; {} otherwise."""
    gw = generated_windows(windows)
    if not spread_ok or gw.empty:
        return {}
    return {int(r.tokens): float(r.distinct) for r in gw.itertuples()}


UPPER_BOUND = "uniform upper bound"


def projection_distinct(mr: MoERun, windows: pd.DataFrame, spread_ok: bool | None, kimi: ModelGeometry,
                        tokens: tuple[int, ...] = routing.TOKENS_PER_STEP) -> tuple[dict[int, float], str]:
    """Distinct experts per T for the Kimi K2.6 projection and their source: a trained router's windows of generated
    tokens when the served model has Kimi's expert count and top_k and they spread; otherwise the uniform expectation,
    labelled the upper bound it is (a random-weight router picks experts from the token id: its windows equal it)."""
    assert kimi.moe is not None
    e, k = kimi.moe.n_routed_experts, kimi.moe.num_experts_per_tok
    cfg = mr.config or {}
    same_shape = int(cfg.get("n_routed_experts") or 0) == e and int(cfg.get("num_experts_per_tok") or 0) == k
    got = cost.interpolate(window_distinct(windows, spread_ok), tokens) if same_shape else {}
    if got and not mr.random_router:
        return got, ("measured (routed experts of the generated tokens in windows of T, a trained router at Kimi "
                     "K2.6's expert count and top_k)")
    uniform = {t: routing.expected_distinct(e, k, t) for t in tokens}
    why = ""
    if got and mr.random_router:
        ratio = statistics.median(got[t] / uniform[t] for t in got if t > 1) if any(t > 1 for t in got) else None
        why = ("; the served router has random weights and picks its experts from the token id, so its windows of "
               "distinct tokens routed like independent uniform picks" + (f" ({100 * ratio:.0f}% of the expectation)"
                                                                          if ratio is not None else ""))
    return uniform, (f"{UPPER_BOUND} (computed: {e} x (1 - (1 - {k}/{e})^T), independent tokens{why}; a trained "
                     f"router's tokens share experts and touch fewer)")


def device_peak(mr: MoERun) -> tuple[float | None, str]:
    """The served GPU's published memory bandwidth (GB/s) from run.json ``device``, and its source."""
    spec = lookup_gpu(str(mr.device.get("gpu") or ""))
    return (spec.memory_bandwidth_gb_s, f"published ({spec.name}: {spec.memory_source})") if spec else (None, "")


def expert_share_table(mr: MoERun, distinct: Mapping[int, float], context_tokens: int) -> pd.DataFrame:
    """The served model's bytes per step per T (cost.step_bytes, one GPU, TP 1), and their floor (bytes over the GPU's
    published peak) where the run names its GPU."""
    geom = geometry_of(mr.config)
    if geom is None or geom.moe is None or not distinct:
        return pd.DataFrame()
    df = pd.DataFrame([cost.step_bytes(geom, t, d, context_tokens) for t, d in sorted(distinct.items())])
    peak, _ = device_peak(mr)
    return df.assign(floor_ms=df["total_bytes"] / (peak * 1e6)) if peak else df


def verify_kernel_share(mr: MoERun, context_tokens: int) -> str:
    """The stock verify kernel's share of a step where the run holds profiler steps (``step_profile``: SGLang's Triton
    verify attention ``gpu_attn_sglang_triton_ms`` over the step's ``wall_ms``, median and range over the verify
    steps at ``context_tokens``), else what is missing."""
    rows = [r for r in mr.profile if r.get("verify_step") and not r.get("partial")
            and int(r.get("context_tokens") or 0) == int(context_tokens) and r.get("wall_ms")]
    if not rows:
        return ("this run holds no profiler steps (step_profile) at that context: how much of a step is the stock "
                "verify kernel is not shown here")
    shares = sorted(float(r.get("gpu_attn_sglang_triton_ms") or 0.0) / float(r["wall_ms"]) for r in rows)
    return (f"the stock verify kernel (SGLang's Triton verify attention) took {100 * statistics.median(shares):.0f}% of a "
            f"verify step ({100 * shares[0]:.0f}-{100 * shares[-1]:.0f}% over {len(shares)} profiled steps, measured)")


@dataclass
class Tables:
    """Everything 11 computes from a run (:func:`tables`), for its sections and verdicts."""

    pass_df: pd.DataFrame
    dt: pd.DataFrame  # distinct experts per tokens per pass (the recorder's verify and decode passes)
    windows: pd.DataFrame  # the routed-experts answers' windows
    spread_ok: bool | None
    spread_ratio: float | None
    spread_text: str
    steps: pd.DataFrame  # medians per context and T (cost.measured_steps)
    ladder: pd.DataFrame  # over requests (cost.ladder)
    share_context: int
    share: pd.DataFrame  # bytes with the measured verify passes' distinct experts
    share_windows: pd.DataFrame  # bytes with T distinct drafts' (windows of generated tokens)
    bal: pd.DataFrame
    proj: pd.DataFrame
    proj_source: str
    best: pd.DataFrame  # on the measured step times, per context
    best_floor: pd.DataFrame  # on the projected floor
    kimi_gpu: Any = None  # the projection's GPU (specdiag.hardware spec)


def tables(mr: MoERun, projection_context: int, acceptance: tuple[float, ...] = cost.ACCEPTANCE) -> Tables:
    """11's tables from a run (module docstring)."""
    pass_df = passes(mr)
    dt = distinct_table(mr, pass_df)
    windows = window_tables(mr)
    ok, ratio, text = spread(pass_df, windows)
    steps = cost.measured_steps([r for r in mr.steps if not r.get("first_on_server")])
    lad = cost.ladder(mr.steps)
    ctx = int(steps["context_tokens"].min()) if not steps.empty else projection_context
    share = expert_share_table(mr, passes_distinct(dt), ctx) if ok else pd.DataFrame()
    share_w = expert_share_table(mr, window_distinct(windows, ok), ctx)
    kimi = load_geometry(cost.KIMI_PRESET)
    gpu = lookup_gpu(cost.KIMI_GPU)
    distinct, proj_source = projection_distinct(mr, windows, ok, kimi)
    proj = cost.project(distinct, projection_context, gpu.memory_bandwidth_gb_s, kimi)
    best = (pd.concat([cost.best_draft_tokens(dict(zip(g["tokens_per_step"], g["step_ms"])), acceptance)
                       .assign(context_tokens=int(c)) for c, g in steps.groupby("context_tokens")], ignore_index=True)
            if not steps.empty else cost.best_draft_tokens({}))
    best_floor = cost.best_draft_tokens(dict(zip(proj["tokens"], proj["floor_ms"])), acceptance)
    return Tables(pass_df, dt, windows, ok, ratio, text, steps, lad, ctx, share, share_w, balance_table(mr), proj,
                  proj_source, best, best_floor, gpu)


def enough_at(lad: pd.DataFrame, ctx: int) -> bool:
    at = lad[lad["context_tokens"] == ctx] if not lad.empty else lad
    return not at.empty and bool((at["requests"] >= MIN_REQUESTS).all()) and bool((at["base_requests"] >= MIN_REQUESTS).all())


def _floor_ranges(share: pd.DataFrame, lad: pd.DataFrame, ctx: int) -> dict[int, tuple[float, float, float]]:
    """Per T with a measured step: the step over its bytes floor, median and range over the requests."""
    if share.empty or "floor_ms" not in share or lad.empty:
        return {}
    at = lad[lad["context_tokens"] == ctx].set_index("tokens_per_step")
    out = {}
    for r in share.itertuples():
        t = int(r.tokens)
        if t in at.index and r.floor_ms > 0:
            vals = [v / r.floor_ms for v in at.loc[t, "request_ms"]]
            out[t] = (statistics.median(vals), min(vals), max(vals))
    return out


def _expert_share_finding(mr: MoERun, t: Tables, src: str) -> Finding:
    ctx, lad = t.share_context, t.ladder
    at = lad[lad["context_tokens"] == ctx].sort_values("tokens_per_step")
    base, top = at.iloc[0], at.iloc[-1]
    no_spec = int(base.tokens_per_step) == 1
    ev = [f"T={int(r.tokens_per_step)}: {r.step_ms:.3g} ms per step, median of {int(r.requests)} requests "
          f"({r.step_ms_min:.3g}-{r.step_ms_max:.3g}; {mr.source})"
          + (f"; over T={int(base.tokens_per_step)}: {cost.ladder_text(r)}" if r.tokens_per_step != base.tokens_per_step
             else "") for r in at.itertuples()]
    first_out = sum(1 for r in mr.steps if r.get("first_on_server"))
    ev.append(f"{first_out} timed request(s) left out as a server's first" if first_out else
              "no timed request was a server's first (each server's recorder pass came before)")
    longest = int(lad["context_tokens"].max())
    if longest > ctx:
        lg = lad[lad["context_tokens"] == longest].sort_values("tokens_per_step")
        ev.append(f"at {format_tokens(longest)}: " + "; ".join(
            f"T={int(r.tokens_per_step)} {r.step_ms:.3g} ms" + (f" ({cost.ladder_text(r)})"
                                                               if r.tokens_per_step != r.base_tokens else "")
            for r in lg.itertuples())
            + " (the verify attention grows with context and T; the experts do not: 05 and 09 measure it)")
    ev.append(verify_kernel_share(mr, ctx))
    numbers: dict[str, Any] = {
        "context_tokens": ctx, "step_ms_by_tokens": {str(int(r.tokens_per_step)): round(r.step_ms, 4) for r in at.itertuples()},
        "ladder": {str(int(r.tokens_per_step)): {"over_base_x": r.over_base_x, "lo": r.lo, "hi": r.hi,
                                                 "level": r.level, "rule": r.rule,
                                                 "verdict": r.verdict, "requests": int(r.requests)}
                   for r in at.itertuples() if r.tokens_per_step != base.tokens_per_step},
        "base_tokens": int(base.tokens_per_step), "base_speculates": not no_spec}
    verdict = (f"At batch 1 and {format_tokens(ctx)} tokens of context (the shortest measured, where attention is "
               f"smallest), a verify step of {int(top.tokens_per_step)} tokens against a step of "
               f"{int(base.tokens_per_step)}: {cost.ladder_text(top)}")
    verdict += (" (the one-token server does not speculate: its step is a plain decode of one token, no draft and no "
                "verify)" if no_spec else "")
    if not t.share.empty:
        row = t.share[t.share["tokens"] == top.tokens_per_step]
        row = row.iloc[0] if not row.empty else t.share.iloc[-1]
        verdict += (f". The measured verify passes of {int(row.tokens)} tokens read {row.distinct:.3g} distinct experts "
                    f"per layer ({row.experts_over_t1_x:.1f}x a one-token step's; the recorder's counts), "
                    f"{100 * row.expert_share:.0f}% of the bytes of a step there")
        numbers.update(expert_share=float(row.expert_share), experts_over_t1_x=float(row.experts_over_t1_x),
                       share_tokens=int(row.tokens), distinct_passes=float(row.distinct))
        w = t.share_windows[t.share_windows["tokens"] == row.tokens] if not t.share_windows.empty else t.share_windows
        if not w.empty:
            w = w.iloc[0]
            verdict += (f"; {int(w.tokens)} distinct drafts (windows of generated tokens) would read {w.distinct:.3g} "
                        f"({w.experts_over_t1_x:.1f}x, {100 * w.expert_share:.0f}% of the bytes)")
            numbers.update(distinct_windows=float(w.distinct), expert_share_windows=float(w.expert_share))
        over = _floor_ranges(t.share, lad, ctx)
        if over:
            peak, peak_src = device_peak(mr)
            lo, hi = min(v[1] for v in over.values()), max(v[2] for v in over.values())
            verdict += (f". Over the bytes floor of what those passes read (at the {mr.device.get('gpu')}'s published "
                        f"{peak:,.0f} GB/s), the measured steps take {lo:.3g}-{hi:.3g}x (every request of every T): at "
                        "batch 1 this server's step is not bound by the bytes it reads, experts included")
            numbers.update(step_over_floor_x={str(k): round(v[0], 3) for k, v in over.items()},
                           step_over_floor_range={str(k): [round(v[1], 3), round(v[2], 3)] for k, v in over.items()})
            ev.append("bytes floor with the measured passes' experts (computed; peak " + peak_src + "): " + "; ".join(
                f"T={int(r.tokens)} {r.floor_ms:.3g} ms" for r in t.share.itertuples())
                + (" | with distinct drafts' experts: " + "; ".join(f"T={int(r.tokens)} {r.floor_ms:.3g} ms"
                                                                    for r in t.share_windows.itertuples())
                   if not t.share_windows.empty and "floor_ms" in t.share_windows else ""))
        ev.append("bytes (computed from the served model's config, the measured passes' distinct experts): "
                  + "; ".join(f"T={int(r.tokens)}: experts {r.routed_expert_bytes / 1e9:.3g} GB of "
                              f"{r.total_bytes / 1e9:.3g} GB ({100 * r.expert_share:.0f}%)" for r in t.share.itertuples()))
    return Finding("moe.expert_share", "MoE at batch 1: what verifying T tokens costs", verdict + ".", "info", ev,
                   numbers, src)


def _best_finding(t: Tables, src: str) -> Finding:
    best = t.best
    lo, hi = int(best["context_tokens"].min()), int(best["context_tokens"].max())
    other = []
    if hi > lo:
        other = [f"at {format_tokens(hi)}: " + "; ".join(
            f"acceptance {r.acceptance:g}: T={int(r.best_tokens_per_step)}"
            for r in best[best["context_tokens"] == hi].itertuples())]
    best = best[best["context_tokens"] == lo]
    ev = [f"acceptance {r.acceptance:g}: best T={int(r.best_tokens_per_step)} ({r.best_tokens_per_s:.3g} tokens/s, "
          f"computed from request medians)" for r in best.itertuples()] + other
    ev.append("acceptance per draft token: parameter; step times: measured")
    b0 = best[best["acceptance"] == 0.0]
    numbers = {"best_by_acceptance": {str(r.acceptance): int(r.best_tokens_per_step) for r in best.itertuples()},
               "best_at_zero_acceptance": int(b0.iloc[0].best_tokens_per_step) if not b0.empty else None,
               "enough_requests": enough_at(t.ladder, lo)}
    if not numbers["enough_requests"]:
        at = t.ladder[t.ladder["context_tokens"] == lo]
        verdict = (f"The best number of draft tokens from the step times measured at {format_tokens(lo)} tokens: "
                   f"{NOT_ENOUGH} (fewest {int(min(at['requests'].min(), at['base_requests'].min()))} a cell, "
                   f"{MIN_REQUESTS} needed); the table shows what the medians would give, not a verdict.")
        return Finding("moe.best_draft_tokens", f"MoE at batch 1: the best number of draft tokens: {NOT_ENOUGH}",
                       verdict, "info", ev, {**numbers, "best_by_acceptance": {}, "best_at_zero_acceptance": None}, src)
    verdict = (f"With the step times measured at {format_tokens(lo)} tokens of context, more draft tokens pay only when "
               "drafts are accepted: " + "; ".join(f"at acceptance {r.acceptance:g} the best is "
                                                   f"T={int(r.best_tokens_per_step)}" for r in best.itertuples()) + ".")
    return Finding("moe.best_draft_tokens", "MoE at batch 1: the best number of draft tokens", verdict, "info", ev,
                   numbers, src)


def _balance_finding(t: Tables, ok: bool | None) -> Finding:
    bal = t.bal
    top = bal[bal["ranks"] == bal["ranks"].max()]
    r = top.iloc[(top["tokens"] - 8).abs().argmin()]
    ev = [f"T={int(x.tokens)}, EP{int(x.ranks)}: distinct experts per rank busiest {x.busiest_rank_experts:.3g}, mean "
          f"{x.mean_rank_experts:.3g}, max/mean {x.experts_max_over_mean:.2f} ({x.experts_lo:.2f}-{x.experts_hi:.2f} "
          f"over {int(x.passes)} passes); tokens max/mean {x.tokens_max_over_mean:.2f} ({x.tokens_lo:.2f}-"
          f"{x.tokens_hi:.2f}); TP: 1.00" for x in bal.itertuples()]
    rep = repeated_drafts(t.dt)
    verdict = (f"Under expert parallelism over {int(r.ranks)} ranks, a pass of {int(r.tokens)} tokens makes the busiest "
               f"rank read {r.busiest_rank_experts:.3g} distinct experts per layer where the mean rank reads "
               f"{r.mean_rank_experts:.3g}: {r.experts_max_over_mean:.2f}x ({r.experts_lo:.2f}-{r.experts_hi:.2f} over "
               f"the recorded passes). At batch 1 a rank's bytes are its distinct experts, so that is the busiest "
               f"rank's expert bytes over tensor parallelism's, where every rank reads its slice of every expert the "
               f"pass touches (1.00). By tokens, what FLOPs see, the busiest rank gets {r.tokens_max_over_mean:.2f}x "
               f"the mean (computed from the recorded counts).")
    if not rep.empty and int(r.tokens) in set(rep["tokens"].astype(int)):
        verdict += (" These verify passes' drafts repeat a token (moe.verify_drafts), so they touch few experts: "
                    "distinct drafts would spread over more ranks.")
    if not ok:
        verdict += " The routing did not spread, so this balance is the seeds', not a model's."
    return Finding("moe.ep_balance", "MoE at batch 1: expert parallelism against tensor parallelism", verdict, "info",
                   ev, {"ranks": int(r.ranks), "tokens": int(r.tokens),
                        "experts_max_over_mean": float(r.experts_max_over_mean),
                        "experts_range": [float(r.experts_lo), float(r.experts_hi)],
                        "busiest_rank_experts": float(r.busiest_rank_experts),
                        "mean_rank_experts": float(r.mean_rank_experts),
                        "tokens_max_over_mean": float(r.tokens_max_over_mean)}, "computed")


def _projection_finding(t: Tables, context_tokens: int) -> Finding:
    proj = t.proj
    p1, p8 = proj.iloc[0], proj.iloc[(proj["tokens"] - 8).abs().argmin()]
    bound = t.proj_source.startswith(UPPER_BOUND)
    ev = [f"T={int(r.tokens)}: {r.distinct:.3g} experts per MoE layer, experts {r.routed_expert_bytes / 1e9:.3g} GB "
          f"+ other weights {r.other_weight_bytes / 1e9:.3g} GB + KV {r.kv_bytes / 1e9:.3g} GB per GPU: floor "
          f"{r.floor_ms:.3g} ms, experts {100 * r.expert_share:.0f}%" for r in proj.itertuples()]
    ev.append(f"distinct experts: {t.proj_source}; shape and INT4 quantization: published (Kimi K2.6 preset); peak: "
              f"{float(proj['peak_gb_s'].iloc[0]):,.0f} GB/s per GPU ({projection_gpu_line(t)}); bytes and floors: "
              "computed")
    most = "at most " if bound else ""
    verdict = (f"On Kimi K2.6 under TP8 with INT4 experts at {format_tokens(context_tokens)} tokens, the routed experts "
               f"are {100 * p1.expert_share:.0f}% of a one-token step's bytes and {most}{100 * p8.expert_share:.0f}% of a "
               f"verify step of {int(p8.tokens)} tokens ({most}{p8.experts_over_t1_x:.1f}x the expert bytes); the step's "
               f"bytes floor grows {most}{p8.floor_over_first_x:.2f}x from T=1 to T={int(p8.tokens)}.")
    if bound:
        verdict += (" These are upper bounds: the distinct experts are the uniform expectation of independent tokens "
                    "(the served model's random router picks by token id, so its counts cannot stand for a trained "
                    "router's, whose tokens share experts).")
    return Finding("moe.kimi_projection", "Projected: Kimi K2.6 on 8 GPUs at batch 1"
                   + (" (uniform upper bound)" if bound else ""), verdict, "info", ev,
                   {"context_tokens": context_tokens, "upper_bound": bound,
                    "expert_share_t1": float(p1.expert_share), "expert_share_t8": float(p8.expert_share),
                    "experts_over_t1_x_t8": float(p8.experts_over_t1_x), "floor_ms_t1": float(p1.floor_ms),
                    "floor_ms_t8": float(p8.floor_ms)}, "computed")


def projection_gpu_line(t: Tables) -> str:
    """The projection's GPU and its bandwidth, from the hardware table."""
    g = t.kimi_gpu
    return (f"{g.name}: {g.memory_bandwidth_gb_s:,.0f} GB/s each, {g.memory_source}" if g is not None
            else "no GPU in the hardware table")


def projection_text(t: Tables, context_tokens: int) -> str:
    """What the projection assumes, from the preset and the hardware table (no number typed in the notebook)."""
    kimi = load_geometry(cost.KIMI_PRESET)
    assert kimi.moe is not None
    return (f"Kimi K2.6 ({kimi.num_layers} layers, {len(kimi.moe.moe_layers)} MoE layers of {kimi.moe.n_routed_experts} "
            f"experts, top-{kimi.moe.num_experts_per_tok}; {kimi.weight_bytes.note}: published, preset "
            f"`{cost.KIMI_PRESET}`) under TP{cost.KIMI_TP} on {projection_gpu_line(t)}, at "
            f"{format_tokens(context_tokens)} tokens. Distinct experts: {t.proj_source}.")


def findings(mr: MoERun, t: Tables, context_tokens: int) -> list[Finding]:
    """11's verdicts (module docstring)."""
    src = "measured" if mr.source.startswith("measured") else "published" if mr.source == "published" else "computed"
    out: list[Finding] = []
    if mr.empty:
        out.append(Finding("moe.not_measured", "MoE at batch 1: nothing measured here",
                           "This run holds no recorder dump, step times or routed experts: the expert bytes, the "
                           "balance and the best draft-token count below come from the uniform expectation and Kimi "
                           "K2.6's published shape, not from a measurement.", "info",
                           ("run `specdiag sweep --measure moe_batch1 --arms params/arms/moe-batch1.yaml` on the H200, "
                            "or point 11 at an SGLang MoE server started with the recorder flags (docs/moe-batch1.md)",), {}, "computed"))
    ok = t.spread_ok
    if ok is not None:
        out.append(Finding("moe.routing_spread", "MoE routing: does it spread?",
                           ("Distinct tokens route like independent tokens: the counts can be read as expert "
                            "bytes.") if ok else
                           ("The tokens touch far fewer experts than independent tokens would: these weights "
                            "route tokens alike, so no conclusion about expert bytes is drawn from them (the "
                            "projection uses the uniform expectation instead)."),
                           "ok" if ok else "warning", (t.spread_text, _tokens_line(t.dt)), {"spread_ratio": t.spread_ratio},
                           src))
    drafts = _drafts_finding(mr, t, src)
    if drafts is not None:
        out.append(drafts)
    if not t.ladder.empty:
        out.append(_expert_share_finding(mr, t, src))
    if not t.best.empty and "context_tokens" in t.best:
        out.append(_best_finding(t, src))
    if not t.bal.empty:
        out.append(_balance_finding(t, ok))
    if not t.proj.empty:
        out.append(_projection_finding(t, context_tokens))
    return out


def _drafts_finding(mr: MoERun, t: Tables, src: str) -> Finding | None:
    """``moe.verify_drafts``: verify passes that routed like far fewer tokens than they scored (repeated drafts)."""
    rep = repeated_drafts(t.dt)
    if rep.empty:
        return None
    pass_df = t.pass_df
    r = rep.iloc[(rep["tokens"] - 8).abs().argmin()]
    gw = generated_windows(t.windows)
    at_t = gw[gw["tokens"] == r.tokens] if not gw.empty else gw
    ev = [f"T={int(x.tokens)}: {x.passes} verify passes, {x.distinct:.3g} distinct experts per layer (median) of "
          f"{x.expected_uniform:.3g} for {int(x.tokens)} independent tokens: routed like {x.effective_tokens:.2g} "
          f"tokens" for x in rep.itertuples()]
    mc = pass_df[(pass_df["kind"] == "verify") & (pass_df["tokens"] == r.tokens)]["max_count"] \
        if "max_count" in pass_df else pd.Series(dtype=float)
    if not mc.empty:
        ev.append(f"T={int(r.tokens)}: the busiest expert of a layer got {int(mc.median())} of the pass's "
                  f"{int(r.tokens)} tokens (median): one token repeated")
    verdict = (f"The verify passes scored {int(r.tokens)} tokens but routed like {r.effective_tokens:.2g}: their "
               f"drafts repeat one token, so a step read the experts of {r.distinct:.3g} per layer, "
               f"{r.over_t1_x:.1f}x a one-token step's (measured). SGLang's NGRAM fills a draft it cannot match "
               "with token 0 (ngram_corpus/result.cpp, \"zero padding to length\"), and the copies route alike.")
    if not at_t.empty:
        verdict += (f" {int(r.tokens)} distinct tokens of the generated text touch {at_t['distinct'].iloc[0]:.3g} "
                    f"({at_t['distinct'].iloc[0] / _top_k(mr):.1f}x): what a drafter whose drafts differ reads.")
    return Finding("moe.verify_drafts", "MoE at batch 1: what the served verify passes held", verdict, "info",
                   ev, {"tokens": int(r.tokens), "distinct": float(r.distinct),
                        "effective_tokens": float(r.effective_tokens)}, src)


def _tokens_line(dt: pd.DataFrame) -> str:
    if dt.empty:
        return "no verify or decode passes"
    return "distinct experts per layer (median): " + "; ".join(
        f"{int(r.tokens)} token{'s' if r.tokens > 1 else ''}: {r.distinct:.3g} of {r.expected_uniform:.3g} expected"
        for r in dt.itertuples())


def routed_checks(mr: MoERun) -> list[str]:
    """What the routed-experts answers showed (row counts against the request, ids in range), one line each."""
    lines = []
    for r in mr.routing:
        if r.get("error"):
            lines.append(f"T={r.get('tokens_per_step')}: {r['error']}")
        else:
            line = (f"T={r.get('tokens_per_step')}: {r.get('rows')} rows (expected {r.get('rows_expected')}: "
                    f"{'match' if r.get('rows_match') else 'MISMATCH'}), ids in range: {r.get('ids_in_range')}")
            cap = r.get("captured_rows")
            if cap is not None:
                line += (f", rows holding routing: {cap:,}" if cap else
                         ", but no row holds routing (every id the same): not captured"
                         + (" beside speculation" if (r.get("tokens_per_step") or 1) > 1 else ""))
            lines.append(line)
    return lines


def metrics(t: Tables) -> dict[str, Any]:
    lad = t.ladder
    return {"distinct_by_tokens": routing.summary_numbers(t.dt) if not t.dt.empty else {},
            "spread_ratio": t.spread_ratio, "spread_ok": t.spread_ok,
            "step_ms": {f"{int(r.context_tokens)}:{int(r.tokens_per_step)}": round(r.step_ms, 4)
                        for r in t.steps.itertuples()} if not t.steps.empty else {},
            "ladder": {f"{int(r.context_tokens)}:{int(r.tokens_per_step)}": {
                "over_base_x": r.over_base_x, "lo": r.lo, "hi": r.hi, "level": r.level, "rule": r.rule,
                "verdict": r.verdict, "requests": int(r.requests)}
                for r in lad.itertuples() if r.tokens_per_step != r.base_tokens} if not lad.empty else {},
            "ep_balance": {f"{int(r.tokens)}:{int(r.ranks)}": round(r.tokens_max_over_mean, 4)
                           for r in t.bal.itertuples()} if not t.bal.empty else {},
            "ep_balance_experts": {f"{int(r.tokens)}:{int(r.ranks)}": round(r.experts_max_over_mean, 4)
                                   for r in t.bal.itertuples()} if not t.bal.empty else {},
            "kimi_expert_share": {str(int(r.tokens)): round(r.expert_share, 4) for r in t.proj.itertuples()}
            if not t.proj.empty else {},
            "projection_distinct_source": t.proj_source,
            "floor_distinct_passes": {str(int(r.tokens)): r.distinct for r in t.share.itertuples()}
            if not t.share.empty else {},
            "floor_distinct_windows": {str(int(r.tokens)): r.distinct for r in t.share_windows.itertuples()}
            if not t.share_windows.empty else {}}
