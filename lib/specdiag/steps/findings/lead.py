"""07's answer before its evidence (pure): a few short lines built from the diagnosis and the findings it rests on:
the symptom, the most likely cause, what to run, what it buys, and how sure. The index shows the same lines (07 writes
them into its result, ``metrics['lead']``).

Each line reads what a notebook already said (the diagnosis' numbers and chosen cause, 09's and 10's own answers as
they wrote them into their results, the fixes measured), never a number of its own.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from specdiag.plots import format_tokens
from specdiag.steps.findings.diagnosis import FIX_KEYS, FIX_POINTERS, Diagnosis

#: The titles of 07's lead and of its box.
TITLE = "The answer"


def _tok(n: Any) -> str:
    return f"{format_tokens(float(n))} tokens"


def _num(x: Any) -> str:
    x = float(x)
    return f"{x:,.0f}" if abs(x) >= 100 else f"{x:.3g}"


def symptom(d: Diagnosis) -> str:
    """What is slow: decode against context (its collapse, the step against its floor), and the prefill against its
    floor where it collapsed too."""
    n = d.numbers
    if n.get("decode_collapse_x") is not None:
        text = (f"decode falls {_num(n['decode_collapse_x'])}x from {_tok(n['context_tokens_first'])} to "
                f"{_tok(n['context_tokens_last'])} ({_num(n['decode_tok_s_first'])} to {_num(n['decode_tok_s_last'])} "
                "tokens/s)")
    elif n.get("step_ms_last") is not None and n.get("context_tokens_last") is not None:
        text = f"a verify step takes {_num(n['step_ms_last'])} ms at {_tok(n['context_tokens_last'])}" + (
            f" against {_num(n['step_ms_first'])} ms at {_tok(n['context_tokens_first'])}"
            if n.get("step_ms_first") is not None and n.get("context_tokens_first") is not None else "")
    else:
        text = "no decode speed was measured in this run"
    if n.get("measured_over_floor_x") is not None:
        text += f"; the step is {_num(n['measured_over_floor_x'])}x its floor there"
    if float(n.get("prefill_ttft_over_floor_x") or 0) >= 2:
        text += (f"; the first token of a {format_tokens(float(n['prefill_context_tokens']))}-token prompt takes "
                 f"{_num(n['prefill_ttft_s'])} s, {_num(n['prefill_ttft_over_floor_x'])}x its floor")
    return text


def _lead_of(results: Mapping[str, Mapping[str, Any]], notebook: str) -> dict[str, str]:
    """A notebook's own answer, as it wrote it into its result (``metrics['lead']``: [label, text] lines)."""
    return {str(k): str(v) for k, v in ((results.get(notebook) or {}).get("metrics") or {}).get("lead") or []}


def run_line(d: Diagnosis, results: Mapping[str, Mapping[str, Any]]) -> str:
    """What to run: 09's answer where it ran (which configuration, whether speculation pays), 10's on the contiguous
    allocator, else the fix measured, else where one would be measured."""
    engine, layout = _lead_of(results, "09_engine_ab"), _lead_of(results, "10_kv_layout")
    said = []
    if engine.get("Run"):
        said.append(f"{engine['Run']} (09)")
    if engine.get("Speculation"):
        said.append(f"speculation: {engine['Speculation']} (09)")
    if layout.get("Answer"):
        said.append(f"the contiguous KV allocator: {layout['Answer'][0].lower()}{layout['Answer'][1:]} (10)")
    if said:
        return "; ".join(said)
    if d.numbers.get("fix"):
        return f"{d.numbers['fix']} (the fix measured in this run)"
    pointer = FIX_POINTERS.get(str(d.numbers.get("cause") or ""))
    return f"nothing measured to recommend yet: {pointer}" if pointer else "nothing measured to recommend yet"


def buys_line(findings: Sequence[Mapping[str, Any]]) -> str:
    """What the fixes measured in this run buy, decode and prefill (each finding's own title)."""
    fixes = [f for f in findings if all(k in (f.get("numbers") or {}) for k in FIX_KEYS)]
    if not fixes:
        return "not measured: no other configuration ran beside this server in this run"
    best = {}
    for f in fixes:
        phase = (f.get("numbers") or {}).get("fix_phase") or "decode"
        if phase not in best or float(f["numbers"]["fix_speedup_x"]) > float(best[phase]["numbers"]["fix_speedup_x"]):
            best[phase] = f
    return "; ".join(f"{f.get('title')} ({f.get('notebook')})" for _, f in sorted(best.items()))


def how_sure(d: Diagnosis, findings: Sequence[Mapping[str, Any]], results: Mapping[str, Mapping[str, Any]]) -> str:
    """What the answer rests on: how many findings of which notebooks, the requests per context of the sweep, whether
    the cause was tested by a fix, and forced acceptance."""
    notebooks = sorted({b.split(":")[0] for b in d.based_on})
    parts = [f"{len(d.based_on)} findings of {', '.join(notebooks)}" if d.based_on else "no finding of this run"]
    sweep = (results.get("01_baseline_sweep") or {}).get("metrics") or {}
    contexts = sweep.get("context_tokens") or []
    if sweep.get("requests") and contexts:
        per = float(sweep["requests"]) / len(contexts)
        parts.append("one request per context in the sweep (no interval; repeats > 1 gives one)" if per <= 1 else
                     f"{per:.3g} requests per context in the sweep")
    tested = any(all(k in (f.get("numbers") or {}) for k in FIX_KEYS) for f in findings)
    if d.numbers.get("cause"):
        parts.append("the cause tested by a measured fix" if tested else
                     "the cause read from the numbers, not yet tested by a fix")
    forced = ((results.get("09_engine_ab") or {}).get("metrics") or {}).get("forced_acceptance") or {}
    if forced:
        values = ", ".join(f"{v:g}" for v in sorted({float(x) for x in forced.values()}))
        parts.append(f"acceptance forced to {values} by SGLANG_SIMULATE_ACC_LEN on 09's arms: their tokens/s and "
                     "token counts are the simulation's")
    return "; ".join(parts)


def lead_lines(d: Diagnosis, findings: Sequence[Mapping[str, Any]],
               results: Mapping[str, Mapping[str, Any]] | None = None) -> list[tuple[str, str]]:
    """07's answer: symptom, cause, what to run (and whether speculation pays, when 09 measured it), what it buys, how
    sure."""
    results = results or {}
    engine = _lead_of(results, "09_engine_ab")
    said, buys = symptom(d), buys_line(findings)
    if said.startswith("no decode speed") and engine.get("Symptom"):  # a run of 09's arms alone: 09's own symptom
        said = f"{engine['Symptom']} (09)"
    if buys.startswith("not measured") and engine.get("Buys"):  # what 09 measured its answer to buy
        buys = f"{engine['Buys']} (09)"
    return [("Symptom", said),
            ("Cause", d.cause_clause or "no finding of this run points at one (the findings below say what ran)"),
            ("Run", run_line(d, results)), ("Buys", buys),
            ("How sure", how_sure(d, findings, results))]
