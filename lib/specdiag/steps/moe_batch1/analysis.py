"""11's tables and verdicts from a run folder's recorder dumps, step times and routed experts (pure but for reading
the run's files in :func:`load_run`).

The verdicts, each with its numbers' sources:

- ``moe.routing_spread`` (the check, first): do the verify passes touch as many experts as independent tokens would?
  Random weights can route every token alike; below :data:`routing.SPREAD_MIN` the seeds' counts are not used for
  conclusions and the projection falls back to the uniform expectation (computed), saying so.
- ``moe.expert_share``: at batch 1, the share of a verify step's bytes that are routed-expert weights (the served
  model's geometry, the distinct experts measured, the KV at the measured context), how verifying T tokens
  multiplies the expert bytes against a one-token step, and the measured ms per verify step against T.
- ``moe.best_draft_tokens``: from the measured step times, the T that commits the most tokens per ms at a few
  per-draft acceptance rates (parameter), the investigation's long-context prose (acceptance 0) included.
- ``moe.ep_balance``: max over mean tokens (and distinct experts) per rank under expert parallelism at 2, 4, 8 ranks
  for the verify passes, beside tensor parallelism's 1.0.
- ``moe.kimi_projection``: the same bytes for Kimi K2.6 on the investigation's 8 GPUs (TP8, INT4 experts), with the
  seeds' distinct experts per T: the expert share of the step's bytes floor and its growth with T.
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
from specdiag.plots import format_tokens
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

    @property
    def empty(self) -> bool:
        return not (self.dumps or self.steps or self.routing)


def load_run(run: Any) -> MoERun:
    """The dumps named by the run's moe_dumps rows (the last one per T), its rows, and run.json's model and device."""
    out = MoERun(steps=run.rows(STEPS_TABLE), routing=run.rows(ROUTING_TABLE), dump_rows=run.rows(DUMPS_TABLE),
                 config=run.meta.get("moe_model_config"), device=dict(run.meta.get("device") or {}),
                 source=str(run.meta.get("data_source") or "measured"))
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


def distinct_by_tokens(dt: pd.DataFrame, spread_ok: bool | None, num_experts: int = 384, top_k: int = 8,
                       tokens: tuple[int, ...] = routing.TOKENS_PER_STEP,
                       windows: pd.DataFrame | None = None) -> tuple[dict[int, float], str]:
    """Distinct experts per T for the byte tables and the projection, when the routing spreads: windows of T
    generated tokens (what a verify pass of T distinct drafts reads), else the recorder's verify passes (T between
    measured ones interpolated in log T); otherwise the uniform expectation (computed)."""
    gw = generated_windows(windows) if windows is not None else pd.DataFrame()
    if spread_ok and not gw.empty:
        got = cost.interpolate({int(r.tokens): float(r.distinct) for r in gw.itertuples()}, tokens)
        if got:
            return got, ("measured (routed experts of the generated tokens in windows of T: what a verify step of T "
                         "distinct tokens reads)")
    if spread_ok and not dt.empty:
        measured = {int(r.tokens): float(r.distinct) for r in dt.itertuples()}
        got = cost.interpolate(measured, tokens)
        if got:
            return got, "measured (the seeds' recorder counts" + (", interpolated between measured T)"
                                                                  if set(got) - set(measured) else ")")
    return ({t: routing.expected_distinct(num_experts, top_k, t) for t in tokens},
            "computed (uniform expectation: the seeds' counts are " + ("not spread)" if spread_ok is False
                                                                       else "missing)"))


def device_peak(mr: MoERun) -> tuple[float | None, str]:
    """The served GPU's published memory bandwidth (GB/s) from run.json ``device``, and its source."""
    from specdiag.hardware import lookup_gpu  # noqa: PLC0415

    spec = lookup_gpu(str(mr.device.get("gpu") or ""))
    return (spec.memory_bandwidth_gb_s, f"published ({spec.name}: {spec.memory_source})") if spec else (None, "")


def expert_share_table(mr: MoERun, distinct: Mapping[int, float], context_tokens: int) -> pd.DataFrame:
    """The served model's bytes per step per T (cost.step_bytes, one GPU, TP 1), and their floor (bytes over the GPU's
    published peak) where the run names its GPU."""
    geom = geometry_of(mr.config)
    if geom is None or geom.moe is None:
        return pd.DataFrame()
    df = pd.DataFrame([cost.step_bytes(geom, t, d, context_tokens) for t, d in sorted(distinct.items())])
    peak, _ = device_peak(mr)
    return df.assign(floor_ms=df["total_bytes"] / (peak * 1e6)) if peak else df


def findings(mr: MoERun, pass_df: pd.DataFrame, dt: pd.DataFrame, steps: pd.DataFrame, bal: pd.DataFrame,
             proj: pd.DataFrame, proj_source: str, share: pd.DataFrame, best: pd.DataFrame,
             context_tokens: int, windows: pd.DataFrame | None = None) -> list[Finding]:
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
    windows = windows if windows is not None else pd.DataFrame()
    ok, ratio, text = spread(pass_df, windows)
    if ok is not None:
        out.append(Finding("moe.routing_spread", "MoE routing: does it spread?",
                           ("Distinct tokens route like independent tokens: the counts can be read as expert "
                            "bytes.") if ok else
                           ("The tokens touch far fewer experts than independent tokens would: these weights "
                            "route tokens alike, so no conclusion about expert bytes is drawn from them (the "
                            "projection uses the uniform expectation instead)."),
                           "ok" if ok else "warning", (text, _tokens_line(dt)), {"spread_ratio": ratio}, src))
    rep = repeated_drafts(dt)
    if not rep.empty:
        r = rep.iloc[(rep["tokens"] - 8).abs().argmin()]
        gw = generated_windows(windows)
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
        out.append(Finding("moe.verify_drafts", "MoE at batch 1: what the served verify passes held", verdict, "info",
                           ev, {"tokens": int(r.tokens), "distinct": float(r.distinct),
                                "effective_tokens": float(r.effective_tokens)}, src))
    if not steps.empty:
        ctx = int(steps["context_tokens"].min())
        at = steps[steps["context_tokens"] == ctx].sort_values("tokens_per_step")
        ev = [f"T={int(r.tokens_per_step)}: {r.step_ms:.3g} ms per verify step ({r.over_fewest_x:.2f}x T="
              f"{int(at.iloc[0].tokens_per_step)}; {mr.source})" for r in at.itertuples()]
        longest = int(steps["context_tokens"].max())
        if longest > ctx:
            lg = steps[steps["context_tokens"] == longest].sort_values("tokens_per_step")
            ev.append(f"at {format_tokens(longest)}: " + "; ".join(
                f"T={int(r.tokens_per_step)} {r.step_ms:.3g} ms ({r.over_fewest_x:.2f}x)" for r in lg.itertuples())
                + " (the verify attention grows with context and T; the experts do not: 05 and 09 measure it)")
        numbers: dict[str, Any] = {"context_tokens": ctx,
                                   "step_ms_by_tokens": {str(int(r.tokens_per_step)): round(r.step_ms, 4)
                                                         for r in at.itertuples()}}
        verdict = (f"At batch 1 a verify step scoring {int(at.iloc[-1].tokens_per_step)} tokens takes "
                   f"{at.iloc[-1].over_fewest_x:.2f}x the time of a step of {int(at.iloc[0].tokens_per_step)} at "
                   f"{format_tokens(ctx)} tokens of context, the shortest measured, where attention is smallest "
                   "(measured on the seeds")
        verdict += ")" if mr.source.startswith("measured") else f"; data: {mr.source})"
        if not share.empty and ok:
            row8 = share.iloc[(share["tokens"] - 8).abs().argmin()]
            verdict += (f"; with {int(row8.tokens)} distinct tokens the routed experts are "
                        f"{100 * row8.expert_share:.0f}% of the bytes of a step there, {row8.experts_over_t1_x:.1f}x "
                        "the expert bytes of a one-token step")
            numbers.update(expert_share=float(row8.expert_share), experts_over_t1_x=float(
                row8.experts_over_t1_x), share_tokens=int(row8.tokens))
            if "floor_ms" in share:
                meas = dict(zip(at["tokens_per_step"].astype(int), at["step_ms"]))
                over = {int(r.tokens): meas[int(r.tokens)] / r.floor_ms for r in share.itertuples()
                        if int(r.tokens) in meas and r.floor_ms > 0}
                if over:
                    verdict += (f". The measured steps take {min(over.values()):.3g}-{max(over.values()):.3g}x their "
                                f"bytes floor ({device_peak(mr)[1].split(':')[0].replace('published (', '')} peak): "
                                "at batch 1 this server's step is not bound by the bytes it reads, experts included")
                    numbers.update(step_over_floor_x={str(t): round(v, 3) for t, v in over.items()})
                    ev.append("bytes floor (computed; peak " + device_peak(mr)[1] + "): " + "; ".join(
                        f"T={int(r.tokens)} {r.floor_ms:.3g} ms" for r in share.itertuples()))
            ev.append("bytes (computed from the served model's config, distinct experts measured): "
                      + "; ".join(f"T={int(r.tokens)}: experts {r.routed_expert_bytes / 1e9:.3g} GB of "
                                  f"{r.total_bytes / 1e9:.3g} GB ({100 * r.expert_share:.0f}%)" for r in share.itertuples()))
        out.append(Finding("moe.expert_share", "MoE at batch 1: what verifying T tokens costs", verdict + ".",
                           "info", ev, numbers, src))
    if not best.empty:
        where, other = "", []
        if "context_tokens" in best:
            lo, hi = int(best["context_tokens"].min()), int(best["context_tokens"].max())
            where = f" at {format_tokens(lo)} tokens of context"
            if hi > lo:
                other = [f"at {format_tokens(hi)}: " + "; ".join(
                    f"acceptance {r.acceptance:g}: T={int(r.best_tokens_per_step)}"
                    for r in best[best["context_tokens"] == hi].itertuples())]
            best = best[best["context_tokens"] == lo]
        b0 = best[best["acceptance"] == 0.0]
        ev = [f"acceptance {r.acceptance:g}: best T={int(r.best_tokens_per_step)} ({r.best_tokens_per_s:.3g} tokens/s)"
              for r in best.itertuples()] + other
        verdict = (f"With the step times measured{where}, more draft tokens pay only when drafts are accepted: "
                   + "; ".join(f"at acceptance {r.acceptance:g} the best is T={int(r.best_tokens_per_step)}"
                               for r in best.itertuples()) + ".")
        out.append(Finding("moe.best_draft_tokens", "MoE at batch 1: the best number of draft tokens", verdict, "info",
                           ev + ["acceptance per draft token: parameter; step times: measured"],
                           {"best_by_acceptance": {str(r.acceptance): int(r.best_tokens_per_step)
                                                   for r in best.itertuples()},
                            "best_at_zero_acceptance": int(b0.iloc[0].best_tokens_per_step) if not b0.empty else None},
                           src))
    if not bal.empty:
        top = bal[bal["ranks"] == bal["ranks"].max()]
        r = top.iloc[(top["tokens"] - 8).abs().argmin()]
        ev = [f"T={int(x.tokens)}, EP{int(x.ranks)}: tokens max/mean {x.tokens_max_over_mean:.2f}, experts max/mean "
              f"{x.experts_max_over_mean:.2f} (busiest rank {x.busiest_rank_experts:.3g} experts, mean "
              f"{x.mean_rank_experts:.3g}); TP: 1.00" for x in bal.itertuples()]
        out.append(Finding("moe.ep_balance", "MoE at batch 1: expert parallelism against tensor parallelism",
                           f"Under expert parallelism over {int(r.ranks)} ranks a verify pass of {int(r.tokens)} tokens "
                           f"loads the busiest rank with {r.tokens_max_over_mean:.2f}x the mean rank's tokens and "
                           f"{r.experts_max_over_mean:.2f}x its experts (computed from the recorded counts); tensor "
                           "parallelism is even (1.00) but every rank reads its slice of every expert the pass "
                           "touches." + ("" if ok else " The routing did not spread, so this balance is the "
                                         "seeds', not a model's."),
                           "info", ev, {"ranks": int(r.ranks), "tokens": int(r.tokens),
                                        "tokens_max_over_mean": float(r.tokens_max_over_mean),
                                        "experts_max_over_mean": float(r.experts_max_over_mean)}, "computed"))
    if not proj.empty:
        p1, p8 = proj.iloc[0], proj.iloc[(proj["tokens"] - 8).abs().argmin()]
        ev = [f"T={int(r.tokens)}: {r.distinct:.3g} experts per MoE layer, experts {r.routed_expert_bytes / 1e9:.3g} GB "
              f"+ other weights {r.other_weight_bytes / 1e9:.3g} GB + KV {r.kv_bytes / 1e9:.3g} GB per GPU: floor "
              f"{r.floor_ms:.3g} ms, experts {100 * r.expert_share:.0f}%" for r in proj.itertuples()]
        ev.append(f"distinct experts: {proj_source}; shape and INT4 quantization: published (Kimi K2.6 preset); "
                  f"peak: {float(proj['peak_gb_s'].iloc[0]):,.0f} GB/s per GPU, the projection's (published for the "
                  "investigation's GPU); bytes and floors: computed")
        out.append(Finding("moe.kimi_projection", "Projected: Kimi K2.6 on 8 GPUs at batch 1",
                           f"On Kimi K2.6 under TP8 with INT4 experts at {format_tokens(context_tokens)} tokens, the "
                           f"routed experts are {100 * p1.expert_share:.0f}% of a one-token step's bytes and "
                           f"{100 * p8.expert_share:.0f}% of a verify step of {int(p8.tokens)} tokens "
                           f"({p8.experts_over_t1_x:.1f}x the expert bytes); the step's bytes floor grows "
                           f"{p8.floor_over_first_x:.2f}x from T=1 to T={int(p8.tokens)}.",
                           "info", ev, {"context_tokens": context_tokens,
                                        "expert_share_t1": float(p1.expert_share),
                                        "expert_share_t8": float(p8.expert_share),
                                        "experts_over_t1_x_t8": float(p8.experts_over_t1_x),
                                        "floor_ms_t1": float(p1.floor_ms), "floor_ms_t8": float(p8.floor_ms)},
                           "computed"))
    return out


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


def metrics(dt: pd.DataFrame, steps: pd.DataFrame, bal: pd.DataFrame, proj: pd.DataFrame, spread: float | None,
            proj_source: str) -> dict[str, Any]:
    return {"distinct_by_tokens": routing.summary_numbers(dt) if not dt.empty else {},
            "spread_ratio": spread,
            "step_ms": {f"{int(r.context_tokens)}:{int(r.tokens_per_step)}": round(r.step_ms, 4)
                        for r in steps.itertuples()} if not steps.empty else {},
            "ep_balance": {f"{int(r.tokens)}:{int(r.ranks)}": round(r.tokens_max_over_mean, 4)
                           for r in bal.itertuples()} if not bal.empty else {},
            "kimi_expert_share": {str(int(r.tokens)): round(r.expert_share, 4) for r in proj.itertuples()}
            if not proj.empty else {},
            "projection_distinct_source": proj_source}


def median_or_none(values: list[float]) -> float | None:
    return statistics.median(values) if values else None
