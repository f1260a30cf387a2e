"""09's findings and key numbers from :mod:`.analysis`'s tables (pure): each arm's prefill against its floor, the
measured fix of each collapse (decode: the plugin against stock Triton; prefill: the arm with the shortest TTFT
against stock Triton) in the shape 07's diagnosis reads (``numbers['fix']``, ``['fix_speedup_x']``,
``['fix_phase']``), the fastest verify step per band, the targets (judged once, on the scorecard), what the run lacks,
and the one answer (:mod:`.answer`: which arm to run, the first token weighed against decode by output length)."""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import pandas as pd

from specdiag import hardware, prefill
from specdiag.findings import Finding
from specdiag.stats import NOT_ENOUGH
from specdiag.steps.engine_ab import window
from specdiag.steps.engine_ab import breakeven as be
from specdiag.steps.engine_ab.analysis import ANCHOR, ANCHOR_TARGETS, STATUSES, tok
from specdiag.steps.engine_ab.arms import step_sizes, verify_arms


def arm_what(arms_meta: Mapping[str, Any], arm: str) -> str:
    return str((arms_meta.get(arm) or {}).get("what") or arm)


def run_peaks(run: Any, meta: Mapping[str, Any], measuring: bool, server_info: Mapping[str, Any], server_url: str,
              gpu_name: str = "", memory_bandwidth_gb_s: float = 0.0, matmul_tflops: float = 0.0) -> Any:
    """The peaks the prefill floor is computed at (:func:`specdiag.hardware.run_peaks`, the run's one set). Measuring:
    the servers' machine (this one for local servers). Replaying: the recorded run's ``hardware``, else its
    ``device`` GPU (or ``gpu_name``) in the table of known GPUs; never this machine's, which did not serve the run.
    Raises ValueError naming the parameters to pass when nothing gives them."""
    if measuring:
        return hardware.run_peaks(run, memory_bandwidth_gb_s, matmul_tflops, gpu_name, None, dict(server_info),
                                  server_url)
    recorded = meta.get("hardware") or None
    device = str((meta.get("device") or {}).get("gpu") or "")
    if not (recorded or gpu_name or device or memory_bandwidth_gb_s):
        raise ValueError("the recorded run names no GPU and records no peaks: pass gpu_name (e.g. 'NVIDIA H200'), or "
                         "memory_bandwidth_gb_s and matmul_tflops")
    return hardware.run_peaks(run, memory_bandwidth_gb_s, matmul_tflops, gpu_name or ("" if recorded else device),
                              recorded, {}, "(the recorded run's server)")


def prefill_floors(pre: pd.DataFrame, geom: Any, peaks: Any, arms_meta: Mapping[str, Any], tp_size: int = 1
                   ) -> tuple[pd.DataFrame, dict[str, list[prefill.PrefillFloor]]]:
    """Each arm's TTFT per context against the prefill floor (:mod:`specdiag.prefill`) with
    the arm's own chunk size (server-reported ``chunked_prefill_size``): a table (one row per arm and context,
    ``own`` kept) and, per arm, the floors of its own TTFTs (what a finding may rest on)."""
    rows, own_floors = [], {}
    for r in pre.itertuples() if not pre.empty else ():
        chunk = prefill.chunk_tokens_of((arms_meta.get(r.arm) or {}).get("server"))
        f = prefill.prefill_floor(geom, int(r.context_tokens), peaks, chunk, tp_size, r.ttft_s)
        rows.append({"arm": r.arm, **f.as_row(), "own": r.own, "why_not_own": r.why_not_own})
        if r.own:
            own_floors.setdefault(r.arm, []).append(f)
    return pd.DataFrame(rows), own_floors


def _longest_common(a: pd.DataFrame, b: pd.DataFrame) -> int | None:
    common = set(a["context_tokens"]) & set(b["context_tokens"])
    return max(int(c) for c in common) if common else None


def decode_fix(dec: pd.DataFrame, arms_meta: Mapping[str, Any], stock_arm: str, plugin_arm: str) -> Finding | None:
    """The plugin arm against stock Triton per verify step at the longest context both decoded cleanly (else any
    both decoded, said so)."""
    if dec.empty:
        return None
    s, p = dec[dec["arm"] == stock_arm], dec[dec["arm"] == plugin_arm]
    clean = _longest_common(s[s["clean"]], p[p["clean"]])
    ctx = clean or _longest_common(s, p)
    if ctx is None:
        return None
    sm = float(s[s["context_tokens"] == ctx]["step_ms"].iloc[0])
    pm = float(p[p["context_tokens"] == ctx]["step_ms"].iloc[0])
    x = sm / pm
    return Finding(
        "engine_ab.decode_fix", f"The plugin makes a verify step {x:,.3g}x faster at {tok(ctx)} tokens",
        f"{plugin_arm} ({arm_what(arms_meta, plugin_arm)}) takes {pm:,.3g} ms per verify step at {ctx:,} tokens "
        f"against {sm:,.4g} ms for {stock_arm} ({arm_what(arms_meta, stock_arm)}).", "ok" if x > 1.05 else "info",
        ("medians of the decode requests on the cached prompt, ms per verify step (measured)",
         "measured alone" if clean else "a decode there overlapped another arm's request: not a clean comparison"),
        {"fix": f"the specdiag plugin's verify kernel ({plugin_arm} against {stock_arm})", "fix_speedup_x": x,
         "fix_context_tokens": ctx, "fix_phase": "decode", "stock_step_ms": sm, "fixed_step_ms": pm,
         "stock_arm": stock_arm, "fixed_arm": plugin_arm, "clean": bool(clean)}, "computed")


#: two TTFTs of one request each within this ratio are a tie: no interval can be drawn from one request, and repeated
#: prefills of one prompt on one H200 server spread by up to 1.6% (37.3 against 36.7 s at 64k, 61 layers, Triton)
TTFT_TIE_X = 1.05


def ttft_tie(a_s: float, b_s: float) -> bool:
    """Whether two single-request TTFTs are inside the noise (:data:`TTFT_TIE_X`)."""
    return max(a_s, b_s) <= TTFT_TIE_X * min(a_s, b_s)


def prefill_fix(pre: pd.DataFrame, arms_meta: Mapping[str, Any], stock_arm: str) -> Finding | None:
    """The arm with the shortest own TTFT against stock Triton's own TTFT, at the longest context both have one; a
    difference inside :data:`TTFT_TIE_X` is said as a tie and claims no fix. Where the stock arm speculates, the
    fix is looked for among the speculating arms (a speculation-off twin is another configuration, not a fix)."""
    if pre.empty:
        return None
    own = pre[pre["own"]]
    s = own[own["arm"] == stock_arm]
    others = own[own["arm"] != stock_arm]
    if be.algorithm_of(arms_meta.get(stock_arm) or {}):
        others = others[[bool(be.algorithm_of(arms_meta.get(a) or {})) for a in others["arm"]]]
    ctx = _longest_common(s, others)
    if ctx is None:
        return None
    at = others[others["context_tokens"] == ctx]
    best = at.loc[at["ttft_s"].idxmin()]
    st = float(s[s["context_tokens"] == ctx]["ttft_s"].iloc[0])
    x = st / float(best["ttft_s"])
    if ttft_tie(st, float(best["ttft_s"])):
        return Finding(
            "engine_ab.prefill_fix", f"No arm prefills sooner than {stock_arm} at {tok(ctx)} tokens: a tie",
            f"The shortest first token at {ctx:,} tokens, {best['arm']}'s {float(best['ttft_s']):,.3g} s, is within "
            f"{TTFT_TIE_X - 1:.0%} of {stock_arm}'s {st:,.3g} s: one request each, a tie.", "info",
            ("TTFT of a prompt no cache held, each arm alone on the GPU (measured)",
             f"single-request TTFTs within {TTFT_TIE_X:g}x of each other are a tie"),
            {"context_tokens": ctx, "stock_ttft_s": st, "best_ttft_s": float(best["ttft_s"]), "tie": True,
             "stock_arm": stock_arm, "best_arm": str(best["arm"])}, "computed")
    return Finding(
        "engine_ab.prefill_fix", f"{best['arm']}'s prefill: the first token {x:,.3g}x sooner at {tok(ctx)} tokens",
        f"{best['arm']} ({arm_what(arms_meta, str(best['arm']))}) answers a {ctx:,}-token prompt's first token after "
        f"{float(best['ttft_s']):,.3g} s against {st:,.3g} s for {stock_arm}.", "ok" if x > 1.05 else "info",
        ("TTFT of a prompt no cache held, each arm alone on the GPU (measured)",),
        {"fix": f"{best['arm']}'s prefill ({arm_what(arms_meta, str(best['arm']))})", "fix_speedup_x": x,
         "fix_context_tokens": ctx, "fix_phase": "prefill", "stock_ttft_s": st, "fixed_ttft_s": float(best["ttft_s"]),
         "stock_arm": stock_arm, "fixed_arm": str(best["arm"])}, "computed")


def stock_decode(dec: pd.DataFrame, stock_arm: str) -> Finding | None:
    """How stock Triton's verify step grows from its shortest to its longest decoded context."""
    s = dec[dec["arm"] == stock_arm].sort_values("context_tokens") if not dec.empty else dec
    if len(s) < 2:
        return None
    a, b = s.iloc[0], s.iloc[-1]
    x = float(b["step_ms"]) / float(a["step_ms"])
    sev = "critical" if x >= 10 else "warning" if x >= 2 else "ok"
    return Finding(
        "engine_ab.stock_decode", f"{stock_arm}: a verify step grows {x:,.3g}x with context",
        f"{stock_arm} takes {float(b['step_ms']):,.4g} ms per verify step at {int(b['context_tokens']):,} tokens against "
        f"{float(a['step_ms']):,.3g} ms at {int(a['context_tokens']):,}.", sev,  # type: ignore[arg-type]
        ("medians of the decode requests (measured)", "critical at or above 10x, a warning at or above 2x"),
        {"arm": stock_arm, "context_tokens_first": int(a["context_tokens"]), "context_tokens_last": int(b["context_tokens"]),
         "step_ms_first": float(a["step_ms"]), "step_ms_last": float(b["step_ms"]), "step_growth_x": x}, "measured")


def prefill_floor_finding(own_floors: Mapping[str, Sequence[prefill.PrefillFloor]], threshold_x: float = 10.0
                          ) -> Finding | None:
    """The arm furthest from its prefill floor at its longest own TTFT (the prefill collapse, when there is one)."""
    found = [f for arm, floors in own_floors.items()
             if (f := prefill.prefill_finding(floors, "measured", finding_id="engine_ab.prefill_floor", label=arm,
                                              threshold_x=threshold_x, extra={"arm": arm})) is not None]
    return max(found, key=lambda f: float(f.numbers["ttft_over_floor_x"])) if found else None


def verdict_finding(verdicts: pd.DataFrame) -> Finding | None:
    if verdicts.empty:
        return None
    judged = verdicts[verdicts["fastest"].notna()]
    lines = tuple(f"{r.band}: {r.verdict}" for r in verdicts.itertuples())
    if judged.empty:
        sizes = [r.verdict for r in verdicts.itertuples() if str(r.verdict).startswith("not comparable per step")]
        if sizes:
            return Finding("engine_ab.verdict", "No band compares arms step against step",
                           f"{sizes[0][0].upper()}{sizes[0][1:]}: which arm to run is the break-even's draft length "
                           "that pays best.", "info", lines, {}, "computed")
        return Finding("engine_ab.verdict", "No band had two arms to compare", "No context band holds decode rows of "
                       "two or more arms: which arm to run is not measured here.", "info", lines, {}, "computed")
    last = judged.iloc[-1]
    against = str(last.get("against_runner_up") or "")
    title = (f"At the longest band, {last['fastest']} and {last['runner_up']} verify alike (a tie)"
             if against.startswith("tie") else
             f"At the longest band, {last['fastest']} and {last['runner_up']}: not enough requests to pick"
             if against.startswith("not enough") else f"At the longest band, {last['fastest']} verifies fastest")
    return Finding(
        "engine_ab.verdict", title, f"{last['band']}: {last['verdict']}.", "info", lines,
        {"bands": {r.band: {"fastest": r.fastest, "by_x": r.by_x, "against_runner_up": getattr(r, "against_runner_up",
                                                                                              None)}
                   for r in judged.itertuples()}}, "computed")


def targets_finding(tt: pd.DataFrame, card: pd.DataFrame | None = None) -> Finding:
    """The targets as :func:`.analysis.targets` judged them (the scorecard's intervals: one judge), and whether one arm
    meets all three on intervals."""
    counts = {s: int((tt["status"] == s).sum()) for s in STATUSES}
    sev = "warning" if counts["missed"] else "ok" if counts["met"] == len(tt) else "info"

    def line(r: Any) -> str:
        shown = (f", {r.value:,.3g} {r.unit} against {r.limit:g}" if r.value is not None and r.value == r.value else "")
        interval = (f" (interval {r.lo:,.3g}-{r.hi:,.3g}; {r.rule})" if r.lo is not None and r.lo == r.lo else "")
        return f"{r.target}: {r.status}{' by ' + str(r.arm) if r.arm else ''}{shown}{interval}" + (
            f" ({r.why})" if r.why else "")

    winners = list(card.loc[card["all_met"], "arm"]) if card is not None and not card.empty else []
    one = (f"{', '.join(winners)} meets all three on intervals" if winners else
           "no single arm meets all three on intervals") if card is not None and not card.empty else ""
    title = "Targets: " + ", ".join(f"{n} {s}" for s, n in counts.items() if n) + (f"; {one}" if one else "")
    return Finding("engine_ab.targets", title,
                   "; ".join(f"{r.target_id} {r.status}" for r in tt.itertuples()) + (f". {one[0].upper()}{one[1:]}."
                                                                                     if one else "."),
                   sev, tuple(line(r) for r in tt.itertuples())  # type: ignore[arg-type]
                   + ("met only where the interval over requests (widened by the spread between servers where the "
                      "requests came from several machines) clears the limit; no interval under 3 requests a side",),
                   {**{f"{r.target_id}": r.status for r in tt.itertuples()}, "all_met_arms": winners}, "computed")


def anchor_finding(card: pd.DataFrame) -> Finding | None:
    """The arms held against FlashInfer's own server (:func:`.analysis.anchor_card`): which one, if any, is as fast to
    the first token (at most 1.1x at 64k and 128k) and faster per verify step (at most 0.85x at 128k), on intervals."""
    if card is None or card.empty:
        return None
    winners = list(card.loc[card["all_met"], "arm"])

    def line(r: Mapping[str, Any]) -> str:
        parts = []
        for t in ANCHOR_TARGETS:
            v, lo, hi = r.get(t.id), r.get(f"{t.id}_lo"), r.get(f"{t.id}_hi")
            shown = f" {v:.3g}x" if v is not None and v == v else ""
            interval = f" (interval {lo:.3g}-{hi:.3g}; {r.get(f'{t.id}_rule')})" if lo is not None and lo == lo else ""
            parts.append(f"{t.name}: {r[f'{t.id}_status']}{shown}{interval}")
        return f"{r['arm']}: " + "; ".join(parts)

    title = (f"{', '.join(winners)} is as fast as {ANCHOR} to the first token and faster per verify step"
             if winners else f"No arm is as fast as {ANCHOR} to the first token and faster per verify step")
    return Finding("engine_ab.anchor_targets", title,
                   (f"{', '.join(winners)} meets all three targets against {ANCHOR} on intervals." if winners else
                    f"No arm meets all three targets against {ANCHOR} on intervals."),
                   "ok" if winners else "info", tuple(line(r) for r in card.to_dict("records")),
                   {"all_met_arms": winners, **{f"{r['arm']}/{t.id}": r[f"{t.id}_status"]
                                                for r in card.to_dict("records") for t in ANCHOR_TARGETS}},
                   "computed")


def lacks_finding(lacking: Sequence[str]) -> Finding | None:
    if not lacking:
        return None
    return Finding("engine_ab.lacks", "What this run does not hold",
                   f"{len(lacking)} gaps in the rows: the comparisons and targets that need them say so.", "info",
                   tuple(lacking), {"gaps": len(lacking)}, "measured")


def recommendation(b: be.BreakEven) -> str:
    """What to run, from one break-even line: speculation on below the bracket, off above it (or always / never)."""
    span = f"{tok(b.contexts[0])}-{tok(b.contexts[-1])}" if b.contexts else ""
    if b.outcome in ("crosses", "starts"):
        lo, hi = tok(b.lo_tokens), tok(b.hi_tokens)
        below, above, turn = ("on", "off", "pays") if b.outcome == "crosses" else ("off", "on", "costs")
        about = f", about {tok(b.context_tokens)} interpolated" if b.context_tokens is not None else ""
        again = (f"; but it {turn} again at {', '.join(tok(c) for c in b.pays_again)}, so one line does not hold "
                 "over the measured range" if b.pays_again else "")
        return (f"speculation {below} up to {lo} and {above} from {hi} (it {'stops' if below == 'on' else 'starts'} "
                f"paying between the two measured contexts{about}){again}")
    if b.outcome == "always pays":
        return f"speculation on: it always pays on this server ({span} measured)"
    if b.outcome == "never pays":
        return f"speculation off: it never pays on this server ({span} measured)"
    if b.outcome == "tie":
        return f"either: speculation ties with no speculation at every context measured ({span})"
    return "not enough requests to say"


def in_a_few_words(b: be.BreakEven) -> str:
    """A break-even line for a title: 'stops paying between 1k and 16k', 'always pays (1k-128k)', ..."""
    span = f" ({tok(b.contexts[0])}-{tok(b.contexts[-1])})" if b.contexts else ""
    if b.outcome in ("crosses", "starts"):
        return (f"{'stops' if b.outcome == 'crosses' else 'starts'} paying between {tok(b.lo_tokens)} and "
                f"{tok(b.hi_tokens)}")
    if b.outcome == "tie":
        return f"ties with speculation off{span}"
    return f"{b.outcome}{span}"


def recall_text(recall: Mapping[int, tuple[float, float]]) -> str:
    """'optimistic: later requests on a prompt recalled the first's answer (commit 7.5 against 1.17 at 1k, ...)'."""
    at = ", ".join(f"{later:.3g} against {first:.3g} at {tok(c)}" for c, (first, later) in sorted(recall.items())[:3])
    more = f" and {len(recall) - 3} more contexts" if len(recall) > 3 else ""
    return (f"optimistic: NGRAM's later requests on a prompt recalled the first's answer (commit {at}{more}); the line "
            "at the first request's commit is computed beside it")


def break_even_finding(pairs: Sequence[be.Pair], off_arms: Sequence[str], evens: Sequence[be.BreakEven],
                       best_drafts: Sequence[Mapping[str, Any]], computed_note: str = "",
                       recall: Mapping[str, Mapping[int, tuple[float, float]]] | None = None) -> Finding:
    """Where speculation stops paying (:mod:`.breakeven`): one line per speculating arm with a speculation-off twin
    (measured, novel prose) and per text kind of 04 (computed), the draft length that pays best where the run has
    several; without an off arm, a finding that says so. ``numbers['lines']`` is what 07's recommendation reads."""
    if not off_arms or not pairs:
        why = ("the run has no speculation-off arm" if not off_arms else
               f"no speculating arm shares a decode backend with the speculation-off arm(s) {', '.join(off_arms)}")
        return Finding("engine_ab.break_even", "Where speculation stops paying: not measured here",
                       f"{why[0].upper()}{why[1:]}, so the context where speculation stops paying is not measured "
                       "(an off arm: speculation {algorithm: NONE} in the arms file, as params/arms/embedded-ladder.yaml's "
                       "off, or the triton_nospec / flashinfer_nospec arms of params/arms/engine-ab-*.yaml).", "info",
                       (why,),
                       {"lines": [], "off_arms": list(off_arms)}, "computed")
    forced = {p.arm: p.forced_acceptance for p in pairs if p.forced_acceptance}
    recall = dict(recall or {})

    def recalled(b: be.BreakEven) -> bool:
        return b.arm in recall and b.source == "measured"

    lines = []
    for b in evens:
        note = (f" (acceptance forced to {forced[b.arm]:g} by SGLANG_SIMULATE_ACC_LEN: not the drafter's own)"
                if b.arm in forced else f" ({recall_text(recall[b.arm])})" if recalled(b) else "")
        lines.append(f"{b.text}{note}")
    for d in best_drafts:
        all_ = "; ".join(f"{k}: {v:,.3g}" for k, v in d["candidates"].items())
        if d.get("verdict") == "tie":
            head = (f"{d['best_draft_tokens']} tokens per verify step ({d['best_arm']}) ties with "
                    f"{', '.join(d['ties'])} inside the requests' noise")
        elif d.get("verdict") == NOT_ENOUGH:
            head = (f"{d['best_draft_tokens']} tokens per verify step has the highest median ({d['best_arm']}), "
                    "not enough requests to call it")
        else:
            head = f"{d['best_draft_tokens']} tokens per verify step pays best ({d['best_arm']})"
        lines.append(f"{d['algorithm']} at {tok(d['context_tokens'])}: {head} (tokens/s, median: {all_}; measured)")
    if computed_note:
        lines.append(computed_note)
    measured = [b for b in evens if b.source == "measured"]
    first = {b.arm: b for b in evens if b.kind == be.FIRST_REQUEST}
    novel = ([first.get(b.arm, b) if recalled(b) else b for b in measured if b.kind == "novel"]
             or measured or list(evens))
    title = ("Where speculation stops paying: " + ("; ".join(f"{b.arm} {in_a_few_words(b)}" for b in novel)
                                                   if novel else "no line"))
    sev = "warning" if any(b.outcome == "never pays" for b in measured) else "info"  # a crossing is a setting, not a fault
    return Finding(
        "engine_ab.break_even", title,
        " ".join(f"{b.text}" + (f" ({recall_text(recall[b.arm])}): {first[b.arm].text}" if recalled(b)
                                 and b.arm in first else "") + "." for b in measured)
        or "No measured line.", sev,  # type: ignore[arg-type]
        tuple(lines) + ("tokens/s per request: speculating, the decode tokens over the decode window (commit per verify "
                        "step x 1000 / ms per verify step where a row lacks it); off, "
                        "1000 / ms per token (measured); ratio of the medians, its distribution-free interval over "
                        "requests at the level it has, the spread between servers counted where the requests came "
                        "from several machines; a line stops or starts paying only between a context where it pays "
                        "and one where it does not (computed)",),
        {"lines": [{**b.as_dict(), "recommendation": recommendation(b), "short": in_a_few_words(b),
                    "forced_acceptance": forced.get(b.arm), "recalled": recalled(b)} for b in evens],
         "pairs": {p.arm: p.off_arm for p in pairs}, "off_arms": list(off_arms),
         "best_draft_tokens": [dict(d) for d in best_drafts]}, "computed")


def findings(dec: pd.DataFrame, pre: pd.DataFrame, own_floors: Mapping[str, Sequence[prefill.PrefillFloor]],
             verdicts: pd.DataFrame, tt: pd.DataFrame, lacking: Sequence[str], arms_meta: Mapping[str, Any],
             stock_arm: str = "triton", plugin_arm: str = "triton_plugin", floor_ratio_threshold: float = 10.0,
             answer: Finding | None = None, card: pd.DataFrame | None = None) -> list[Finding]:
    """09's findings, those that the rows support (each builder returns None when they do not): ``answer`` (which arm
    to run, :func:`.answer.answer_finding`) first where given, then the fixes, floors, the fastest verify step per
    band, the targets (with the scorecard ``card``), the draft window and what the run lacks.
    ``floor_ratio_threshold``: a TTFT at or above this many times its floor is critical."""
    out = [answer, stock_decode(dec, stock_arm), decode_fix(dec, arms_meta, stock_arm, plugin_arm),
           prefill_floor_finding(own_floors, floor_ratio_threshold), prefill_fix(pre, arms_meta, stock_arm),
           verdict_finding(verdicts), targets_finding(tt, card), lacks_finding(lacking)]
    if not dec.empty:
        out.append(window.window_finding(window.window_table(dec, window.window_pairs(arms_meta,
                                                                                        list(dict.fromkeys(dec["arm"]))))))
    return [f for f in out if f is not None]


def metrics(dec: pd.DataFrame, pre: pd.DataFrame, floors: pd.DataFrame, verdicts: pd.DataFrame, tt: pd.DataFrame,
            lacking: Sequence[str], arms: Sequence[str], break_even: Mapping[str, Any] | None = None,
            answer: Finding | None = None, card: pd.DataFrame | None = None) -> dict[str, Any]:
    """09's key numbers (tests and the index read them; ``answer`` first, the one thing 09 says to run): per arm and
    context, units in the names; ``targets`` as judged once (:func:`.analysis.targets`), ``scorecard`` per arm;
    ``break_even``: the break-even finding's numbers (:func:`break_even_finding`)."""
    def by_arm(df: pd.DataFrame, col: str) -> dict[str, dict[str, Any]]:
        out: dict[str, dict[str, Any]] = {}
        for r in df.itertuples() if not df.empty else ():
            out.setdefault(r.arm, {})[str(int(r.context_tokens))] = getattr(r, col)
        return out

    return _plain({
        "answer": (answer.numbers.get("answer") if answer is not None else "") or "not answered",
        "arms": list(arms),
        "step_ms": by_arm(dec, "step_ms"), "decode_requests": by_arm(dec, "n"), "decode_tok_s": by_arm(dec, "decode_tok_s"),
        "decode_clean": by_arm(dec, "clean"),
        "ttft_s": by_arm(pre, "ttft_s"), "ttft_own": by_arm(pre, "own"),
        "ttft_over_floor_x": by_arm(floors, "ttft_over_floor_x"), "prefill_floor_s": by_arm(floors, "floor_s"),
        "targets": {r.target_id: {"status": r.status, "value": r.value, "lo": r.lo, "hi": r.hi, "limit": r.limit,
                                  "arm": r.arm, "rule": r.rule, "why": r.why} for r in tt.itertuples()},
        "scorecard": ([{k: v for k, v in r.items()} for r in card.to_dict("records")]
                      if card is not None and not card.empty else []),
        "answer_by_context": (answer.numbers.get("by_context") if answer is not None else []) or [],
        "bands": [{"band": r.band, "fastest": r.fastest, "by_x": r.by_x, "verdict": r.verdict}
                  for r in verdicts.itertuples()] if not verdicts.empty else [],
        "lacks": list(lacking),
        "break_even": dict(break_even or {}),
    })


def _plain(v: Any) -> Any:
    """JSON-fit: NaN and pandas' missing values as None, numpy numbers as Python's, recursively."""
    if isinstance(v, dict):
        return {k: _plain(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_plain(x) for x in v]
    if v is None or isinstance(v, str):
        return v
    try:
        if pd.isna(v):
            return None
    except (TypeError, ValueError):
        return v
    return v.item() if hasattr(v, "item") else v
