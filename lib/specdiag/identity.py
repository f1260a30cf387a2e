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

Rows are dicts as ``scripts/sglang_plugin_diag.py`` writes them (identity.jsonl): ``ref_ids``, ``test_ids``, and at
a difference ``<ref_arm>_top2_at_diff`` = [[logprob, token], [logprob, token]] and ``<ref_arm>_margin_at_diff``.
"""

from __future__ import annotations

import math
from collections import Counter
from typing import Any, Iterable, Optional, Sequence

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
