"""Greedy-output identity between two servers, and whether a difference is a rounding tie (pure functions).

A kernel swap that changes the order of a floating-point sum changes logits by a few bf16 steps. Where the model's
two best next tokens are closer than that, greedy decoding may pick the other one, and the outputs part from there
on. So a difference is judged at its first position only (the rest follows from it), the way vLLM's
``check_logprobs_close`` does: it is a *rounding tie* when the reference's top-2 logprob margin there is at most
``tie_margin_nats`` and the tested server's token is one of those two (the reference's own logits rank it within
rounding of the best); otherwise it *differs* and points at a bug. The reference's top-2 come from a separate
1-token request (its prefill path), so the reference's own greedy token may fall outside them when three tokens
tie: that is the reference's rounding, not the tested kernel's. bf16 holds 8 significant bits: at logprobs of magnitude 4 to 8 one step is 0.03125 nats
(:func:`bf16_step`), the default margin.

:func:`classify` and :func:`summarize` read one row per prompt and pair of servers: ``ref_ids``, ``test_ids``, and at
a difference ``<ref_arm>_top2_at_diff`` = [[logprob, token], [logprob, token]] and ``<ref_arm>_margin_at_diff`` (the
recorded plugin runs' ``device*/identity.jsonl`` are such rows). :func:`compare_arms` reads the sweep's rows instead,
one per arm and prompt as ``specdiag sweep --measure plugin_identity`` writes them (table ``plugin_identity``):
``arm``, ``set``, ``context_tokens``, ``seed``, ``repeat``, ``output_ids``, ``error``, and ``at_diff``: per arm
measured before it whose output differed, the top-2 this server read at the first difference (``first_diff``,
``top2``, ``margin``, ``error``). It pairs every arm's first request per prompt with the reference's and judges each
pair with :func:`classify`; a server's later requests of a prompt (``repeat`` 1, 2, ...) are its own control.
"""

from __future__ import annotations

import math
from collections import Counter
from typing import Any, Iterable, Mapping, Optional, Sequence

IDENTICAL = "identical"
TIE = "rounding tie"
DIFFERS = "differs"
UNKNOWN = "differs, no logprobs to judge"


def first_diff(a: Sequence[int], b: Sequence[int]) -> Optional[int]:
    """First index where ``a`` and ``b`` differ (a length difference counts at the shorter length), or None."""
    j = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)
    if j is None and len(a) != len(b):
        j = min(len(a), len(b))
    return j


def bf16_step(value: float) -> float:
    """The spacing of bf16 numbers at ``value`` (8 significant bits): 2**(floor(log2|value|) - 7)."""
    if value == 0 or not math.isfinite(value):
        raise ValueError(f"bf16_step needs a finite non-zero value, got {value!r}")
    return 2.0 ** (math.floor(math.log2(abs(value))) - 7)


def classify(row: dict[str, Any], ref_arm: str = "stock", tie_margin_nats: float = 0.03125) -> str:
    """IDENTICAL, TIE, DIFFERS or UNKNOWN for one prompt's row (see the module docstring)."""
    ref, test = list(row.get("ref_ids") or []), list(row.get("test_ids") or [])
    j = first_diff(ref, test)
    if j is None and not row.get("ref_error") and not row.get("test_error"):
        return IDENTICAL
    top2 = row.get(f"{ref_arm}_top2_at_diff")
    margin = row.get(f"{ref_arm}_margin_at_diff")
    if j is None or not top2 or margin is None:
        return UNKNOWN
    best = {int(t[1]) for t in top2}
    if margin <= tie_margin_nats and j < len(test) and test[j] in best:
        return TIE
    return DIFFERS


def summarize(rows: Iterable[dict[str, Any]], ref_arm: str = "stock", tie_margin_nats: float = 0.03125) -> dict:
    """Counts per verdict, and the prompts that differ beyond a tie (set, context, first difference)."""
    rows = list(rows)
    verdicts = [classify(r, ref_arm, tie_margin_nats) for r in rows]
    counts = Counter(verdicts)
    return {"prompts": len(rows), "identical": counts[IDENTICAL], "rounding_ties": counts[TIE],
            "differs": counts[DIFFERS], "unjudged": counts[UNKNOWN], "tie_margin_nats": tie_margin_nats,
            "not_ties": [{"set": r.get("set"), "context_tokens": r.get("context_tokens"),
                          "first_diff": first_diff(r.get("ref_ids") or [], r.get("test_ids") or []), "verdict": v}
                         for r, v in zip(rows, verdicts) if v in (DIFFERS, UNKNOWN)]}


#: what makes a sweep row's prompt: the same prompt ids for every arm
PROMPT_KEY = ("set", "context_tokens", "seed")


def _prompt(row: Mapping[str, Any]) -> tuple:
    return tuple(row.get(k) for k in PROMPT_KEY)


def latest_by_arm(rows: Iterable[Mapping[str, Any]], repeat: int = 0) -> dict[str, dict[tuple, Mapping[str, Any]]]:
    """Per arm (in the order the rows first name it), its last row per prompt of this ``repeat`` (a merged run's later
    call wins)."""
    out: dict[str, dict[tuple, Mapping[str, Any]]] = {}
    for r in rows:
        if int(r.get("repeat") or 0) == repeat:
            out.setdefault(str(r.get("arm")), {})[_prompt(r)] = r
    return out


def repeat_identity(rows: Iterable[Mapping[str, Any]]) -> dict[str, dict[str, int]]:
    """Per arm with repeated prompts: how many prompts it answered more than once (``prompts``) and in how many every
    later answer equals the first, errors none (``identical``)."""
    rows = list(rows)
    first = latest_by_arm(rows)
    later: dict[str, dict[tuple, list]] = {}
    for r in rows:
        if int(r.get("repeat") or 0) > 0:
            later.setdefault(str(r.get("arm")), {}).setdefault(_prompt(r), []).append(r)
    out = {}
    for arm, prompts in later.items():
        pairs = [(first.get(arm, {}).get(p), again) for p, again in prompts.items()]
        out[arm] = {"prompts": len(pairs), "identical": sum(
            1 for a, again in pairs if a is not None and not a.get("error") and all(
                not b.get("error") and list(b.get("output_ids") or []) == list(a.get("output_ids") or [])
                for b in again))}
    return out


def _top2_read(by_arm: Mapping[str, Mapping[tuple, Mapping[str, Any]]], prompt: tuple, ref_ids: Sequence[int], j: int,
               sources: Sequence[str]) -> Optional[tuple[list, float, str]]:
    """The top-2 some server read after the prompt and the reference's first ``j`` output tokens: the first of
    ``sources`` whose own output starts with those tokens and that read its top-2 at position ``j`` (against any arm)."""
    for arm in sources:
        row = by_arm.get(arm, {}).get(prompt)
        if row is None or list(row.get("output_ids") or [])[:j] != list(ref_ids)[:j]:
            continue
        for entry in (row.get("at_diff") or {}).values():
            if entry.get("first_diff") == j and entry.get("top2") and entry.get("margin") is not None:
                return [list(t) for t in entry["top2"]], float(entry["margin"]), arm
    return None


def pair_rows(rows: Iterable[Mapping[str, Any]], reference: str, test: str,
              controls: Sequence[str] = ()) -> list[dict[str, Any]]:
    """The prompts both arms answered, each as a row :func:`classify` reads (``ref_ids``, ``test_ids``, their errors,
    and at a difference ``<reference>_top2_at_diff`` / ``_margin_at_diff`` with ``margin_from``, the arm whose server
    read them). The top-2 are taken from the reference's server where it read them, else from a control's (a server
    configured as the reference), else from any other arm's, the tested arm's last."""
    by_arm = latest_by_arm(rows)
    ref, tst = by_arm.get(reference, {}), by_arm.get(test, {})
    others = [a for a in by_arm if a not in (reference, test, *controls)]
    sources = [reference, *[c for c in controls if c != test], *others, test]
    out = []
    for prompt, a in ref.items():
        b = tst.get(prompt)
        if b is None:
            continue
        row: dict[str, Any] = {**dict(zip(PROMPT_KEY, prompt)), "ref_arm": reference, "test_arm": test,
                               "ref_ids": list(a.get("output_ids") or []), "test_ids": list(b.get("output_ids") or []),
                               "ref_error": a.get("error"), "test_error": b.get("error")}
        j = first_diff(row["ref_ids"], row["test_ids"])
        row["first_diff"] = j
        if j is not None:
            read = _top2_read(by_arm, prompt, row["ref_ids"], j, sources)
            if read is not None:
                row[f"{reference}_top2_at_diff"], row[f"{reference}_margin_at_diff"], row["margin_from"] = read
        out.append(row)
    return out


def compare_arms(rows: Iterable[Mapping[str, Any]], reference: str = "", controls: Sequence[str] = (),
                 tie_margin_nats: float = 0.03125) -> dict[str, Any]:
    """Every arm's greedy outputs against the reference's (``""``: the first arm the rows name), prompt by prompt.

    Per arm: :func:`summarize`'s counts over the prompts both answered, ``control`` (the arm is one of ``controls``:
    configured as the reference, so it must be identical), ``not_measured`` (prompts the reference answered and it did
    not) and ``differences``: each prompt that is not identical, with its first differing position, the margin there
    and the arm whose server read it, and the verdict. ``repeats``: :func:`repeat_identity`, per arm."""
    rows = list(rows)
    by_arm = latest_by_arm(rows)
    reference = reference or next(iter(by_arm), "")
    out: dict[str, Any] = {"reference": reference, "controls": list(controls), "tie_margin_nats": tie_margin_nats,
                           "arms": {}, "repeats": repeat_identity(rows)}
    if reference not in by_arm:
        out["error"] = f"no rows of the reference arm {reference!r} (arms with rows: {', '.join(by_arm) or 'none'})"
        return out
    for arm in by_arm:
        if arm == reference:
            continue
        pairs = pair_rows(rows, reference, arm, controls)
        s = summarize(pairs, reference, tie_margin_nats)
        del s["tie_margin_nats"]
        s["differences"] = [{**{k: p[k] for k in PROMPT_KEY}, "first_diff": p["first_diff"],
                             "margin": p.get(f"{reference}_margin_at_diff"), "margin_from": p.get("margin_from"),
                             "verdict": v}
                            for p in pairs for v in [classify(p, reference, tie_margin_nats)] if v != IDENTICAL]
        out["arms"][arm] = {"control": arm in controls, **s,
                            "not_measured": len(set(by_arm[reference]) - set(by_arm[arm]))}
    return out


def describe(result: Mapping[str, Any]) -> list[str]:
    """:func:`compare_arms`'s result in a line per arm (a control not identical everywhere is said to be so)."""
    if result.get("error"):
        return [f"identity: {result['error']}"]
    lines = []
    for arm, s in result["arms"].items():
        diffs = ", ".join(f"{d['context_tokens']:,} at {d['first_diff']}" for d in s["differences"])
        lines.append(f"identity {arm} vs {result['reference']}: {s['identical']}/{s['prompts']} prompts identical, "
                     f"{s['rounding_ties']} rounding ties, {s['differs']} differ, {s['unjudged']} unjudged"
                     + (f", {s['not_measured']} not measured" if s["not_measured"] else "")
                     + (f" (first differences: {diffs})" if diffs else "")
                     + ("; a CONTROL: it must be identical everywhere" if s["control"]
                        and s["identical"] != s["prompts"] else ""))
    for arm, r in (result.get("repeats") or {}).items():
        lines.append(f"identity {arm} against itself (the same server again): {r['identical']}/{r['prompts']} "
                     "prompts identical" + ("" if r["identical"] == r["prompts"] else "; it must be identical"))
    return lines
