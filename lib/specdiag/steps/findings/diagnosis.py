"""07's opening paragraph: what is slow, how far from its floor, the most likely cause, the prefill (the second
collapse at long context), and the measured fix of each, from this run's findings (pure).

Every clause is built from a finding's ``numbers`` (the notebook that measured them is named); a step that did not
run, or found nothing, gives a sentence saying so, never a claim. Findings taken from a recorded run (a result's
``recorded_from``) are not this run's and must not be passed in (``overview.split_recorded``).

The parts, and the findings they read:

- slow: 01's ``sweep.decode_collapse`` (decode tok/s at the shortest and longest context) and
  ``sweep.step_time_slope`` (ms per verify step there); without 01, 05's ``bandwidth.far_from_floor`` step; without
  either, 09's ``engine_ab.stock_decode`` (the stock arm's step at its shortest and longest context).
- floor: 05's ``bandwidth.far_from_floor`` (measured step over its memory floor, % of the peak).
- cause: the most severe of the candidates below (ties: in this order), each with the numbers of its finding:
  a drafter that commits nothing on predictable and novel text alike (04's ``probe.drafter_does_not_commit``), the
  attention over the KV (05's ``bandwidth.slope``: the step grows far faster than its bytes), an idle GPU
  (02's ``utilization.decode_gpu_idle``), a per-step cost that does not grow with context (05: far from the floor
  while the slope follows the bytes), the drafter's cost (03's ``drafter.measured_cost``), a drafter that fails with
  context (04's ``probe.predictable_falls``), and the text itself (04's ``probe.novel_is_text_difficulty`` beside
  01's low commit length).
- prefill: the prefill floor finding furthest from its floor (05's ``bandwidth.prefill_floor``, 09's
  ``engine_ab.prefill_floor``: the TTFT of the longest prompt over the prefill's floor, the chunk size); without
  one, a sentence saying no TTFT was set against the floor.
- after the attention, the investigation's last two steps, each a sentence when its notebook ran: the KV layout
  (10's ``kv_layout.<arm>``: a fragmented pool's cost per verify step on the arm where it is largest, or that no
  arm's layout differed enough to judge; where it costs time, the next fix named: the contiguous KV allocator, with
  10's ``kv_layout.tier0.<arm>`` result when an ``<arm>_contiguous`` arm was measured) and MoE experts at batch 1 (11's ``moe.expert_share``: a verify step of T
  tokens against a one-token step at the shortest context, over requests with its interval, or 'not enough requests'
  under 3 a cell; the experts' share of its bytes, its distance from the floor; ``moe.verify_drafts`` when the served drafts repeated a token).
- fix, one per collapse: a finding whose ``numbers`` hold ``fix`` (what was changed, in words) and ``fix_speedup_x``
  (time before / after, > 1 is faster; optional ``fix_context_tokens``) is a fix measured in this run, of decode
  unless ``numbers['fix_phase']`` says "prefill" (09's ``engine_ab.decode_fix``: the plugin against stock Triton per
  verify step; ``engine_ab.prefill_fix``: the arm with the shortest TTFT against stock Triton's). Without one, the
  paragraph says no fix was measured here and names where one would be (from the cause, or 09 for prefill), as a
  pointer, not a result.
- recommendation, last: first 09's ``engine_ab.answer`` (``numbers['answer']``: which arm to run, the first token
  weighed against decode by output length; 07 says it as 09 does), then 09's ``engine_ab.break_even``
  (``numbers['lines']``: each speculating arm against its
  speculation-off twin): speculation on below the break-even context and off above it, or that it always / never
  pays on this server, per arm measured (novel prose), per text kind where the run measured other kinds' prompts
  too (09's ``kinds``), and per text kind where 04's commits made a computed line; and,
  where a fix of this run (``numbers['stock_arm']`` / ``['fixed_arm']`` of a fix finding) has a line on both sides,
  how it moves the line, before against after. Without a line: a sentence saying the run has no speculation-off arm.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from specdiag.findings import SEVERITY_ORDER, Finding
from specdiag.roofline import BELOW_FLOOR_X

#: Keys of a finding's numbers that mark a fix measured in the run (see the module docstring).
FIX_KEYS = ("fix", "fix_speedup_x")


@dataclass(frozen=True)
class Diagnosis:
    """The four parts of 07's opening paragraph, each a sentence, and the numbers and findings they came from."""

    slow: str
    floor: str
    cause: str
    fix: str
    severity: str = "info"                       # the most severe finding the paragraph rests on
    numbers: dict[str, Any] = field(default_factory=dict)
    based_on: tuple[str, ...] = ()               # "notebook: finding id" of every finding used
    prefill: str = ""                            # the prefill against its floor (the second collapse), or why not
    after: str = ""                              # the KV layout (10) and MoE at batch 1 (11), when they ran
    recommend: str = ""                          # speculation on below the break-even context, off above (09)
    cause_clause: str = ""                       # the most likely cause alone, in a clause (07's lead)

    @property
    def paragraph(self) -> str:
        return " ".join(s for s in (self.slow, self.floor, self.cause, self.prefill, self.fix, self.after,
                                    self.recommend) if s)

    def as_finding(self) -> Finding:
        return Finding("findings.diagnosis", "Diagnosis", self.paragraph, self.severity,  # type: ignore[arg-type]
                       tuple(f"from {b}" for b in self.based_on) or ("no finding of this run to rest on",),
                       dict(self.numbers), "computed")


def _tok(n: Any) -> str:
    from specdiag.plots import format_tokens  # noqa: PLC0415 - matplotlib's ticker, only when a paragraph is made

    return f"{format_tokens(float(n))} tokens"


def _tokens_long(n: Any) -> str:
    """'128k-token' (an adjective: a 128k-token prompt)."""
    from specdiag.plots import format_tokens  # noqa: PLC0415 - loads matplotlib (costly: ARCHITECTURE.md, Imports)

    return f"{format_tokens(float(n))}-token"


def _num(x: float) -> str:
    """Three significant digits, thousands separated: 0.0123, 4.56, 78.9, 1,234."""
    x = float(x)
    return f"{x:,.0f}" if abs(x) >= 100 else f"{x:.3g}"


#: The numbers each finding must hold to be read (a finding without them, from an older run, is passed over).
NEEDS: dict[str, tuple[str, ...]] = {
    "sweep.decode_collapse": ("decode_collapse_x", "decode_tok_s_first", "decode_tok_s_last", "context_tokens_first",
                              "context_tokens_last"),
    "sweep.step_time_slope": ("step_ms_first", "step_ms_last", "context_tokens_first"),
    "bandwidth.far_from_floor": ("context_tokens", "measured_ms", "floor_ms", "measured_over_floor_x"),
    "bandwidth.slope": ("measured_slope_ms_per_1k_tokens", "slope_ratio_x"),
    "drafter.measured_cost": ("growth_x", "draft_ms_first", "draft_ms_last", "context_tokens_first",
                              "context_tokens_last"),
    "probe.predictable_falls": ("drop_first_to_last",),
    "sweep.commit_length_long_context": ("commit_length_last", "context_tokens_last"),
    "bandwidth.prefill_floor": ("context_tokens", "ttft_s", "floor_s", "ttft_over_floor_x"),
    "engine_ab.prefill_floor": ("context_tokens", "ttft_s", "floor_s", "ttft_over_floor_x", "arm"),
    "engine_ab.stock_decode": ("arm", "step_ms_first", "step_ms_last", "context_tokens_first", "context_tokens_last",
                               "step_growth_x"),
}
#: The findings that set a TTFT against the prefill's floor (05 on the sweep, 09 per arm).
PREFILL_FLOORS = ("bandwidth.prefill_floor", "engine_ab.prefill_floor")


def _find(findings: Sequence[Mapping[str, Any]], fid: str) -> Mapping[str, Any] | None:
    """The finding ``fid`` when its numbers hold what :data:`NEEDS` lists, else None."""
    for f in findings:
        if f.get("id") == fid and all((f.get("numbers") or {}).get(k) is not None for k in NEEDS.get(fid, ())):
            return f
    return None


def _rank(f: Mapping[str, Any] | None) -> int:
    return SEVERITY_ORDER.get(str((f or {}).get("severity")), 9)


def _by(f: Mapping[str, Any]) -> str:
    return f"{f.get('notebook', '?')}: {f.get('id')}"


def _slow(findings: Sequence[Mapping[str, Any]], used: list[Mapping[str, Any]], numbers: dict[str, Any]) -> str:
    dec, step = _find(findings, "sweep.decode_collapse"), _find(findings, "sweep.step_time_slope")
    far = _find(findings, "bandwidth.far_from_floor")
    if dec:
        n = dec.get("numbers") or {}
        used.append(dec)
        numbers.update(decode_tok_s_first=n.get("decode_tok_s_first"), decode_tok_s_last=n.get("decode_tok_s_last"),
                       context_tokens_first=n.get("context_tokens_first"), context_tokens_last=n.get("context_tokens_last"),
                       decode_collapse_x=n.get("decode_collapse_x"))
        ratio = float(n["decode_collapse_x"])
        text = (f"Decode falls {_num(ratio)}x with context, from {_num(n['decode_tok_s_first'])} tokens/s at "
                f"{_tok(n['context_tokens_first'])} to {_num(n['decode_tok_s_last'])} at {_tok(n['context_tokens_last'])}"
                if ratio >= 1.05 else
                f"Decode holds up with context: {_num(n['decode_tok_s_first'])} tokens/s at "
                f"{_tok(n['context_tokens_first'])}, {_num(n['decode_tok_s_last'])} at {_tok(n['context_tokens_last'])}")
        if step:
            s = step.get("numbers") or {}
            used.append(step)
            numbers.update(step_ms_first=s.get("step_ms_first"), step_ms_last=s.get("step_ms_last"))
            text += (f"; a verify step takes {_num(s['step_ms_last'])} ms there against {_num(s['step_ms_first'])} ms "
                     f"at {_tok(s['context_tokens_first'])}")
        return text + f" ({dec.get('source', 'measured')}, {dec.get('notebook', '01_baseline_sweep')})."
    if far:
        n = far.get("numbers") or {}
        used.append(far)
        numbers.update(step_ms_last=n.get("measured_ms"), context_tokens_last=n.get("context_tokens"))
        return (f"A verify step at {_tok(n['context_tokens'])} takes {_num(n['measured_ms'])} ms "
                f"({far.get('source', 'measured')}, {far.get('notebook')}); the baseline sweep's decode speeds are not "
                f"in this run.")
    stock = _find(findings, "engine_ab.stock_decode")
    if stock:
        n = stock.get("numbers") or {}
        used.append(stock)
        numbers.update(step_ms_first=n.get("step_ms_first"), step_ms_last=n.get("step_ms_last"),
                       context_tokens_first=n.get("context_tokens_first"), context_tokens_last=n.get("context_tokens_last"))
        return (f"A verify step of {n['arm']} takes {_num(n['step_ms_last'])} ms at {_tok(n['context_tokens_last'])} "
                f"against {_num(n['step_ms_first'])} ms at {_tok(n['context_tokens_first'])}, "
                f"{_num(n['step_growth_x'])}x ({stock.get('source', 'measured')}, {stock.get('notebook')}); the baseline "
                "sweep's decode speeds are not in this run.")
    return ("This run measured no decode speed (01_baseline_sweep wrote no decode finding: it did not run, or every "
            "request failed), so nothing here is judged slow.")


def _floor(findings: Sequence[Mapping[str, Any]], used: list[Mapping[str, Any]], numbers: dict[str, Any]) -> str:
    far = _find(findings, "bandwidth.far_from_floor")
    if not far:
        return "No memory floor was computed for this run (05_bandwidth_analysis wrote no finding)."
    n = far.get("numbers") or {}
    if far not in used:
        used.append(far)
    numbers.update(measured_over_floor_x=n.get("measured_over_floor_x"), floor_ms=n.get("floor_ms"),
                   pct_of_peak_total=n.get("pct_of_peak_total"), peak_gb_s=n.get("peak_gb_s"))
    ratio = float(n["measured_over_floor_x"])
    pct = n.get("pct_of_peak_total")
    if ratio < BELOW_FLOOR_X:
        return (f"At {_tok(n['context_tokens'])} the step took {_num(n['measured_ms'])} ms, under the floor of "
                f"{_num(n['floor_ms'])} ms computed from this run's peaks: a peak figure is too low, so no floor "
                f"verdict is drawn ({far.get('notebook', '05_bandwidth_analysis')} names the peak to pass).")
    bound = "compute" if (n.get("compute_floor_ms") or 0) > (n.get("memory_floor_ms") or 0) else "memory"
    return (f"At {_tok(n['context_tokens'])} the step is {_num(ratio)}x its {bound} floor of {_num(n['floor_ms'])} ms"
            + (f", moving its bytes at {_num(pct)}% of the {_num(n['peak_gb_s'])} GB/s peak" if pct is not None else "")
            + f" (computed, {far.get('notebook', '05_bandwidth_analysis')}).")


def _cause_candidates(findings: Sequence[Mapping[str, Any]]) -> list[tuple[Mapping[str, Any], str, dict[str, Any]]]:
    """(finding, clause, numbers) of each cause the findings support, in tie-break order."""
    out: list[tuple[Mapping[str, Any], str, dict[str, Any]]] = []
    silent = _find(findings, "probe.drafter_does_not_commit")
    if silent:
        n = silent.get("numbers") or {}
        out.append((silent, f"a drafter that commits nothing: about {_num(n.get('commit_length_max', 1))} token per "
                            f"verify step of at most {_num(n.get('max_commit_length', 0))} on predictable and novel text "
                            "alike at every context, so each step verifies its drafts to keep one token (a drafter "
                            "untrained for this target, or mismatched to it)",
                    {"commit_length_max": n.get("commit_length_max")}))
    slope, far = _find(findings, "bandwidth.slope"), _find(findings, "bandwidth.far_from_floor")
    if slope and _rank(slope) <= SEVERITY_ORDER["warning"]:
        n = slope.get("numbers") or {}
        out.append((slope, f"the work that grows with context, the attention over the KV cache: each 1,000 tokens add "
                           f"{_num(n['measured_slope_ms_per_1k_tokens'])} ms to a step, {_num(n['slope_ratio_x'])}x what "
                           f"the extra bytes cost at the peak",
                    {"measured_slope_ms_per_1k_tokens": n.get("measured_slope_ms_per_1k_tokens"),
                     "slope_ratio_x": n.get("slope_ratio_x")}))
    idle = _find(findings, "utilization.decode_gpu_idle")
    if idle:
        n = idle.get("numbers") or {}
        busy = n.get("decode_gpu_util_pct_median")
        out.append((idle, f"the host side: no GPU kernel runs for about {_num(100 - float(busy))}% of decode"
                    if busy is not None else "the host side: the GPU idles through much of decode",
                    {"decode_gpu_util_pct_median": busy}))
    if far and _rank(far) <= SEVERITY_ORDER["warning"] and slope and _rank(slope) > SEVERITY_ORDER["warning"]:
        n, s = far.get("numbers") or {}, slope.get("numbers") or {}
        out.append((far, f"a per-step cost that does not grow with context (framework, launches, host work): the step is "
                         f"{_num(n['measured_over_floor_x'])}x its floor while its growth is only "
                         f"{_num(s['slope_ratio_x'])}x what its bytes explain",
                    {"measured_over_floor_x": n.get("measured_over_floor_x"), "slope_ratio_x": s.get("slope_ratio_x")}))
    draft = _find(findings, "drafter.measured_cost")
    if draft and _rank(draft) <= SEVERITY_ORDER["warning"]:
        n = draft.get("numbers") or {}
        out.append((draft, f"the drafter: a draft step grows {_num(n['growth_x'])}x, from {_num(n['draft_ms_first'])} to "
                           f"{_num(n['draft_ms_last'])} ms between {_tok(n['context_tokens_first'])} and "
                           f"{_tok(n['context_tokens_last'])}",
                    {"draft_growth_x": n.get("growth_x")}))
    falls = _find(findings, "probe.predictable_falls")
    if falls:
        n = falls.get("numbers") or {}
        out.append((falls, f"the drafter at long context: on predictable text its commit length drops "
                           f"{_num(100 * float(n['drop_first_to_last']))}% from the shortest to the longest context",
                    {"predictable_drop_first_to_last": n.get("drop_first_to_last")}))
    text, low = _find(findings, "probe.novel_is_text_difficulty"), _find(findings, "sweep.commit_length_long_context")
    if text and low and _rank(low) <= SEVERITY_ORDER["warning"]:
        n, c = text.get("numbers") or {}, low.get("numbers") or {}
        out.append((low, f"the text, not a fault: novel prose commits {_num(c['commit_length_last'])} tokens per step at "
                         f"{_tok(c['context_tokens_last'])}, and predictable text at the same contexts commits far more "
                         f"(04), so the drafter works and the prose is hard to guess",
                    {"commit_length_last": c.get("commit_length_last"), "text_share": n.get("text_share")}))
    return out


def _cause(findings: Sequence[Mapping[str, Any]], used: list[Mapping[str, Any]],
           numbers: dict[str, Any]) -> tuple[str, str | None, str]:
    candidates = _cause_candidates(findings)
    if not candidates:
        ran = sorted({str(f.get("notebook")) for f in findings if f.get("notebook")})
        return ("No finding of this run points at a cause"
                + (f" (the notebooks that ran: {', '.join(ran)})" if ran else "")
                + ": the floor and slope (05), GPU idle time (02), drafter cost (03) and the commit probe (04) say "
                  "where to look when they run.", None, "")
    ordered = sorted(enumerate(candidates), key=lambda ic: (_rank(ic[1][0]), ic[0]))
    (_, (finding, clause, nums)), rest = ordered[0], [c for _, c in ordered[1:]]
    used.append(finding)
    numbers.update(nums, cause=finding.get("id"))
    also = [f"{c} ({f.get('notebook')})" for f, c, _ in rest if _rank(f) <= SEVERITY_ORDER["warning"]][:2]
    return (f"The most likely cause is {clause} ({finding.get('notebook')})"
            + (f"; also {'; '.join(also)}" if also else "") + ".", str(finding.get("id")),
            f"{clause} ({finding.get('notebook')})")


#: Where a fix for each cause would be measured: a pointer the paragraph gives when the run measured no fix.
FIX_POINTERS = {
    "bandwidth.slope": "a verify-attention kernel that splits the KV across the GPU (06_kernel_ab on a GPU, or the "
                       "SGLang plugin with PLUGIN=splitkv and 08 against this run) is where one would be measured",
    "bandwidth.far_from_floor": "a profile of the step (02's torch-profiler timeline) shows where the fixed cost sits",
    "utilization.decode_gpu_idle": "02's torch-profiler timeline shows which host work leaves the GPU idle",
    "drafter.measured_cost": "03 shows whether a sliding window or a draft window would bound the drafter",
    "probe.predictable_falls": "03 shows whether the drafter's attention is bounded at long context",
    "probe.drafter_does_not_commit": "a drafter trained for this target is the fix; until then 09 with a "
                                     "speculation-off arm measures what turning speculation off buys",
    "sweep.commit_length_long_context": "no fix is needed for the text itself",
}


def _prefill(findings: Sequence[Mapping[str, Any]], used: list[Mapping[str, Any]], numbers: dict[str, Any]
             ) -> tuple[str, bool]:
    """The prefill clause, and whether prefill collapsed (at or above 2x its floor)."""
    found = [f for fid in PREFILL_FLOORS if (f := _find(findings, fid))]
    if not found:
        return ("", False)
    f = max(found, key=lambda x: float(x["numbers"]["ttft_over_floor_x"]))
    n = f["numbers"]
    used.append(f)
    x = float(n["ttft_over_floor_x"])
    numbers.update(prefill_context_tokens=n["context_tokens"], prefill_ttft_s=n["ttft_s"], prefill_floor_s=n["floor_s"],
                   prefill_ttft_over_floor_x=x, prefill_chunk_tokens=n.get("chunk_tokens"))
    who = f" on {n['arm']}" if n.get("arm") else ""
    chunks = (f", prefilled in chunks of {int(n['chunk_tokens']):,} tokens at {_num(n['prefill_tok_s'])} prompt "
              "tokens/s" if n.get("chunk_tokens") and n.get("prefill_tok_s") else "")
    where = f"({f.get('source', 'computed')}, {f.get('notebook')})"
    if x < BELOW_FLOOR_X:
        return (f"The first token of a {_tokens_long(n['context_tokens'])} prompt came after {_num(n['ttft_s'])} s{who}, "
                f"under its floor of {_num(n['floor_s'])} s: a peak figure is too low, so no prefill verdict is drawn "
                f"{where}.", False)
    if x >= 2:
        return (f"Prefill is a second collapse: the first token of a {_tokens_long(n['context_tokens'])} prompt comes "
                f"after {_num(n['ttft_s'])} s{who}, {_num(x)}x its floor of {_num(n['floor_s'])} s{chunks} {where}.", True)
    return (f"Prefill is near its floor: the first token of a {_tokens_long(n['context_tokens'])} prompt comes "
            f"after {_num(n['ttft_s'])} s{who}, {_num(x)}x its floor {where}.", False)


def _fix(findings: Sequence[Mapping[str, Any]], cause: str | None, used: list[Mapping[str, Any]],
         numbers: dict[str, Any], prefill_collapsed: bool = False) -> str:
    fixes = [f for f in findings if all(k in (f.get("numbers") or {}) for k in FIX_KEYS)]
    decode = [f for f in fixes if (f["numbers"].get("fix_phase") or "decode") == "decode"]
    prefill = [f for f in fixes if f["numbers"].get("fix_phase") == "prefill"]
    if decode:
        best = max(decode, key=lambda f: float(f["numbers"]["fix_speedup_x"]))
        n = best["numbers"]
        used.append(best)
        numbers.update(fix=n["fix"], fix_speedup_x=n["fix_speedup_x"], fix_context_tokens=n.get("fix_context_tokens"))
        where = f" at {_tok(n['fix_context_tokens'])}" if n.get("fix_context_tokens") else ""
        text = (f"The fix measured in this run, {n['fix']}, makes it {_num(n['fix_speedup_x'])}x faster{where} "
                f"({best.get('source', 'measured')}, {best.get('notebook')}).")
    else:
        pointer = FIX_POINTERS.get(cause or "")
        text = ("No fix was measured in this run" if not (prefill or prefill_collapsed) else
                "No decode fix was measured in this run") + (f"; {pointer}." if pointer else ".")
    if prefill:
        best = max(prefill, key=lambda f: float(f["numbers"]["fix_speedup_x"]))
        n = best["numbers"]
        used.append(best)
        numbers.update(prefill_fix=n["fix"], prefill_fix_speedup_x=n["fix_speedup_x"],
                       prefill_fix_context_tokens=n.get("fix_context_tokens"))
        where = f" at {_tok(n['fix_context_tokens'])}" if n.get("fix_context_tokens") else ""
        text += (f" For prefill, {n['fix']} brings the first token {_num(n['fix_speedup_x'])}x sooner{where} "
                 f"({best.get('source', 'measured')}, {best.get('notebook')}).")
    elif prefill_collapsed:
        text += (" No prefill fix was measured here: an arm with FlashInfer's prefill beside the stock one "
                 "(09_engine_ab) is where one would be.")
    return text


def _kv_layout(findings: Sequence[Mapping[str, Any]], used: list[Mapping[str, Any]], numbers: dict[str, Any]) -> str:
    judged = [f for f in findings if str(f.get("id", "")).startswith("kv_layout.") and f["id"].count(".") == 1
              and f["id"] not in ("kv_layout.prediction", "kv_layout.not_measured", "kv_layout.gaps")
              and f.get("numbers")]
    few = [f for f in judged if f["numbers"].get("not_enough_requests")]
    judged = [f for f in judged if f not in few]
    unjudged = [f for f in findings if str(f.get("id", "")).startswith("kv_layout.")
                and str(f.get("id", "")).endswith(".not_fragmented")]
    if not judged:
        if few:
            used.extend(few)
            return ("The KV layout (10_kv_layout) was not judged: not enough requests per pool state on "
                    f"{', '.join(str(f['numbers'].get('arm')) for f in few)}.")
        if unjudged:
            used.extend(unjudged)
            return ("The KV layout (10_kv_layout) was not judged: its fragmented requests were laid out like the "
                    "fresh ones.")
        return ""
    worst = max(judged, key=lambda f: float(f["numbers"].get("cost_x") or 0))
    n = worst["numbers"]
    used.append(worst)
    numbers.update(kv_layout_arm=n.get("arm"), kv_layout_cost_x=n.get("cost_x"),
                   kv_layout_context_tokens=n.get("context_tokens"))
    arms = ", ".join(str(f["numbers"].get("arm")) for f in judged)
    if n.get("requests_overlap"):
        return (f"Whether a fragmented KV pool costs {n['arm']} time is not established: its steps were "
                f"{100 * (float(n['cost_x']) - 1):+.1f}% at {_tok(n['context_tokens'])}, within the spread between "
                f"requests ({worst.get('source', 'measured')}, 10_kv_layout).")
    if "fix_speedup_x" in n or worst.get("severity") in ("warning", "critical"):
        return (f"A fragmented KV pool costs {n['arm']} {100 * (float(n['cost_x']) - 1):+.1f}% per verify step at "
                f"{_tok(n['context_tokens'])} ({worst.get('source', 'measured')}, 10_kv_layout): keeping each "
                "request's KV contiguous pays there. " + _tier0(findings, str(n.get("arm")), used))
    judged_arms = {str(f["numbers"].get("arm")) for f in judged}
    not_judged = sorted({str(f["numbers"].get("arm")) for f in unjudged if f.get("numbers")} - judged_arms)
    hi = n.get("cost_bound_x") if n.get("cost_bound_x") is not None else n.get("cost_hi_x")
    bound = (f"no cost above {100 * (float(hi) - 1):+.1f}%" if hi is not None else
             f"at most {100 * (float(n['cost_x']) - 1):+.1f}%")
    return (f"A fragmented KV pool costs no measurable time on {arms} ({bound} "
            f"at {_tok(n['context_tokens'])}; {worst.get('source', 'measured')}, 10_kv_layout): defragmenting is "
            "not where the time goes"
            + (f" there ({', '.join(not_judged)}: no request on a scattered pool to judge)." if not_judged else "."))


def _tier0(findings: Sequence[Mapping[str, Any]], arm: str, used: list[Mapping[str, Any]]) -> str:
    """The next fix where the layout costs time: the contiguous KV allocator, with 10's result for ``arm`` if measured
    (its ``kv_layout.tier0.<arm>`` finding)."""
    f = _find(findings, f"kv_layout.tier0.{arm}")
    if f is None or not f.get("numbers"):
        return ("The next fix: the contiguous KV allocator (the SGLang plugin's SPECDIAG_SGLANG_KV_ALLOC=contiguous, "
                "the embedded server's --kv-alloc contiguous); 10 measures what it buys back with an arm "
                f"{arm}_contiguous.")
    used.append(f)
    t = f["numbers"]
    result = (f"{float(t['contiguous_ms']):.3g} against {float(t['scattered_ms']):.3g} ms per step scattered and "
              f"{float(t['fresh_ms']):.3g} fresh at {_tok(t['context_tokens'])}")
    if t.get("buys_back"):
        return f"The next fix, the contiguous KV allocator, buys it back there: {result} (10_kv_layout)."
    return f"The contiguous KV allocator, the next fix, did not buy it back there: {result} (10_kv_layout)."


def _moe(findings: Sequence[Mapping[str, Any]], used: list[Mapping[str, Any]], numbers: dict[str, Any]) -> str:
    share = _find(findings, "moe.expert_share")
    if share is None or not share.get("numbers"):
        return ""
    n = share["numbers"]
    by_t = {int(k): float(v) for k, v in (n.get("step_ms_by_tokens") or {}).items()}
    if len(by_t) < 2:
        return ""
    used.append(share)
    lo, hi = min(by_t), max(by_t)
    numbers.update(moe_context_tokens=n.get("context_tokens"), moe_step_ms_by_tokens=n.get("step_ms_by_tokens"))
    cmp = (n.get("ladder") or {}).get(str(hi)) or {}
    head = (f"On an MoE model at batch 1 (11_moe_batch1, {share.get('source', 'measured')}), a verify step of {hi} "
            f"tokens against a step of {lo} at {_tok(n.get('context_tokens'))}: ")
    if cmp.get("lo") is not None and cmp.get("hi") is not None:
        level = (f"{int(float(cmp['level']) * 100 + 1e-9)}% " if cmp.get("level") is not None else "")
        text = head + (f"{_num(cmp['over_base_x'])}x ({level}interval {_num(cmp['lo'])}-{_num(cmp['hi'])}x over "
                       "requests" + (", a tie" if cmp.get("verdict") == "tie" else "")
                       + (f"; {cmp['rule']}" if cmp.get("rule") else "") + ")")
    else:  # fewer than 3 requests a cell (or a result written before the ladder was over requests)
        text = head + (f"{_num(by_t[hi] / by_t[lo])}x on {cmp.get('requests', 'too few')} requests a cell, not enough "
                       "requests for a comparison")
    if n.get("expert_share") is not None:
        text += (f"; the {n.get('share_tokens')}-token verify passes it measured read routed experts that are "
                 f"{100 * float(n['expert_share']):.0f}% of the bytes ({_num(n.get('experts_over_t1_x'))}x a "
                 "one-token step's)")
    over = n.get("step_over_floor_range") or {}
    if over:
        text += (f", yet the steps run {_num(min(v[0] for v in over.values()))}-{_num(max(v[1] for v in over.values()))}x "
                 "above their bytes floor: at batch 1 that step is not bound by expert bytes")
    drafts = _find(findings, "moe.verify_drafts")
    if drafts is not None and drafts.get("numbers"):
        d = drafts["numbers"]
        used.append(drafts)
        text += (f" (the served verify passes of {d.get('tokens')} tokens routed like {_num(d.get('effective_tokens'))}:"
                 " their drafts repeated a token)")
    return text + "."


#: the kind of 09's break-even line at NGRAM's first-request commit (09's ``breakeven.FIRST_REQUEST``; steps do not
#: import each other, tests/test_engine_ab_breakeven.py holds the two equal)
FIRST_REQUEST = "first request"

#: What 07 says when no line of 09 sets speculation against its speculation-off twin.
NO_OFF_ARM = ("Where speculation stops paying is not measured in this run: it has no speculation-off arm beside a "
              "speculating one (09_engine_ab with an arm of speculation {algorithm: NONE} in its arms file, as "
              "params/arms/embedded-ladder.yaml's off, or the triton_nospec and flashinfer_nospec arms of "
              "params/arms/engine-ab-*.yaml on a GPU).")


def _line_short(line: Mapping[str, Any]) -> str:
    """A break-even line in a few words, as 09 wrote it ('stops paying between 1k and 16k', 'always pays
    (1k-128k)'); the bare outcome where a line has none."""
    return str(line.get("short") or line.get("outcome"))


def _answer(findings: Sequence[Mapping[str, Any]], used: list[Mapping[str, Any]], numbers: dict[str, Any]) -> str:
    """09's one answer, as 09 says it (``engine_ab.answer``), or ''."""
    f = _find(findings, "engine_ab.answer")
    said = str(((f or {}).get("numbers") or {}).get("answer") or "")
    if f is None or not said:
        return ""
    used.append(f)
    numbers.update(answer=said)
    return f"What to run ({f.get('source', 'computed')}, {f.get('notebook', '09_engine_ab')}): {said}."


def _recommend(findings: Sequence[Mapping[str, Any]], used: list[Mapping[str, Any]], numbers: dict[str, Any]) -> str:
    answer = _answer(findings, used, numbers)
    return " ".join(x for x in (answer, _speculation(findings, used, numbers, bool(answer))) if x)


def _speculation(findings: Sequence[Mapping[str, Any]], used: list[Mapping[str, Any]], numbers: dict[str, Any],
                 answered: bool = False) -> str:
    brk = _find(findings, "engine_ab.break_even")
    lines = [dict(x) for x in ((brk or {}).get("numbers") or {}).get("lines") or []]
    if brk is None or not lines:
        return "" if answered else NO_OFF_ARM
    used.append(brk)
    where = f"({brk.get('source', 'computed')}, {brk.get('notebook', '09_engine_ab')})"
    measured = [x for x in lines if x.get("source") == "measured" and (x.get("kind") or "novel") == "novel"]
    by_kind = [x for x in lines if x.get("source") == "measured" and (x.get("kind") or "novel") != "novel"]
    first = [x for x in lines if x.get("source") == "computed" and x.get("kind") == FIRST_REQUEST]
    computed = [x for x in lines if x.get("source") == "computed" and x.get("kind") != FIRST_REQUEST]
    numbers.update(break_even={f"{x['arm']}:{x['kind']}:{x['source']}": x.get("context_tokens") for x in lines})

    def forced(x: Mapping[str, Any]) -> str:
        return (f" (acceptance forced to {float(x['forced_acceptance']):g} by SGLANG_SIMULATE_ACC_LEN)"
                if x.get("forced_acceptance") else "")

    def recalled(x: Mapping[str, Any]) -> str:
        return (" (optimistic: NGRAM's later requests recalled the first's answer)" if x.get("recalled") else "")

    parts = [f"on {x['arm']} (against {x['off_arm']}), {x['recommendation']}{forced(x)}{recalled(x)}" for x in measured]
    text = ("Speculation on or off, from this run's requests on novel prose " + where + ": " + "; ".join(parts) + "."
            if parts else "")
    if first:
        text += (" At the commit of each prompt's first request (computed: the later requests recalled its answer): "
                 + "; ".join(f"on {x['arm']}, {x['recommendation']}" for x in first) + ".")
    if by_kind:
        text += (" By text kind, measured on this run's requests on that kind's prompts: "
                 + "; ".join(f"{x['kind']} text on {x['arm']} (against {x['off_arm']}), {x['recommendation']}{forced(x)}"
                             for x in by_kind) + ".")
    if computed:
        text += (" By text kind, computed from 04's commit per verify step and 09's measured steps: "
                 + "; ".join(f"{x['kind']} text on {x['arm']}, {x['recommendation']}" for x in computed) + ".")
    by_arm = {x["arm"]: x for x in measured}
    by_arm.update({x["arm"]: x for x in first})  # a recalled arm's line is its first request's
    moves = []
    for f in findings:
        n = f.get("numbers") or {}
        a, b = n.get("stock_arm"), n.get("fixed_arm")
        if all(k in n for k in FIX_KEYS) and a in by_arm and b in by_arm and a != b:
            moves.append(f"{n['fix']}: before, {a} {_line_short(by_arm[a])}; after, {b} {_line_short(by_arm[b])}")
            if f not in used:
                used.append(f)
    if moves:
        text += " How this run's fix moves the line: " + "; ".join(dict.fromkeys(moves)) + "."
    return text.strip() or ("" if answered else NO_OFF_ARM)


def diagnose(findings: Sequence[Mapping[str, Any]]) -> Diagnosis:
    """The diagnosis from this run's findings (``overview.collect_findings`` of this run's own results, each
    with its ``notebook``). Pure; see the module docstring for the findings each part reads."""
    used: list[Mapping[str, Any]] = []
    numbers: dict[str, Any] = {}
    slow = _slow(findings, used, numbers)
    floor = _floor(findings, used, numbers)
    cause, cause_id, cause_clause = _cause(findings, used, numbers)
    prefill, collapsed = _prefill(findings, used, numbers)
    fix = _fix(findings, cause_id, used, numbers, collapsed)
    after = " ".join(x for x in (_kv_layout(findings, used, numbers), _moe(findings, used, numbers)) if x)
    recommend = _recommend(findings, used, numbers)
    worst = min((f.get("severity", "info") for f in used), key=lambda s: SEVERITY_ORDER.get(s, 9), default="info")
    seen: list[str] = []
    for f in used:
        if _by(f) not in seen:
            seen.append(_by(f))
    return Diagnosis(slow, floor, cause, fix, worst, {k: v for k, v in numbers.items() if v is not None}, tuple(seen),
                     prefill, after, recommend, cause_clause)
