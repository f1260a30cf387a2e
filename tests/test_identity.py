"""specdiag.identity on synthetic rows, and on the identity rows recorded on the H200
(data/reference/sglang-h200-mla2-plugin-traced/device*/identity.jsonl)."""

from __future__ import annotations

import json

import pytest

from specdiag import identity
from specdiag.paths import REFERENCE_DIR


def row(ref, test, top2=None, margin=None):
    r = {"ref_ids": ref, "test_ids": test}
    if top2 is not None:
        r.update(stock_top2_at_diff=top2, stock_margin_at_diff=margin)
    return r


def test_first_diff():
    assert identity.first_diff([1, 2, 3], [1, 2, 4]) == 2
    assert identity.first_diff([1, 2], [1, 2, 3]) == 2
    assert identity.first_diff([5], [5]) is None


def test_bf16_step():
    assert identity.bf16_step(-5.6) == 0.03125
    assert identity.bf16_step(1.0) == 2 ** -7
    with pytest.raises(ValueError, match="non-zero"):
        identity.bf16_step(0.0)


@pytest.mark.parametrize("r,verdict", [
    (row([1, 2, 3], [1, 2, 3]), identity.IDENTICAL),
    (row([1, 2, 3], [1, 2, 9], [[-5.50, 3], [-5.52, 9]], 0.02), identity.TIE),
    (row([1, 2, 3], [1, 2, 9], [[-5.50, 3], [-5.60, 9]], 0.10), identity.DIFFERS),   # margin too large
    (row([1, 2, 3], [1, 2, 7], [[-5.50, 3], [-5.51, 9]], 0.01), identity.DIFFERS),   # test token not among the best
    (row([1, 2, 3], [1, 2, 9]), identity.UNKNOWN),
    (row([1, 2, 3], [1, 2]), identity.UNKNOWN),
])
def test_classify(r, verdict):
    assert identity.classify(r) == verdict


def test_summarize_counts_and_lists_the_non_ties():
    rows = [row([1], [1]), row([1, 2], [1, 9], [[-5, 2], [-5, 9]], 0.0), row([4, 2], [4, 8], [[-5, 2], [-6, 8]], 1.0)]
    s = identity.summarize(rows)
    assert (s["prompts"], s["identical"], s["rounding_ties"], s["differs"]) == (3, 1, 1, 1)
    assert s["not_ties"] == [{"set": None, "context_tokens": None, "first_diff": 1, "verdict": identity.DIFFERS}]


@pytest.mark.parametrize("path,prompts,identical", [
    ("sglang-h200-mla2-plugin-traced/device/identity.jsonl", 23, 16),       # TP 1, measured 2026-11-30
    ("sglang-h200-mla2-plugin-traced/device-tp2/identity.jsonl", 21, 17),   # TP 2
])
def test_recorded_differences_are_all_rounding_ties(path, prompts, identical):
    rows = [json.loads(line) for line in (REFERENCE_DIR / path).read_text().splitlines()]
    s = identity.summarize(rows)
    assert (s["prompts"], s["identical"]) == (prompts, identical)
    assert s["rounding_ties"] == prompts - identical and s["differs"] == 0 and s["unjudged"] == 0, s["not_ties"]
    assert all(r.get("ref_repeat_identical", True) for r in rows)  # stock against itself: always identical



def as_sweep_rows(pairs: list[dict]) -> list[dict]:
    """Recorded pair rows as ``specdiag sweep --measure plugin_identity`` writes its rows: one per arm and prompt, each
    server's top-2 read at the first difference in its ``at_diff``."""
    out = []
    for p in pairs:
        key = {k: p[k] for k in ("set", "context_tokens", "seed")}
        for arm, other, side in (("stock", "plugin", "ref"), ("plugin", "stock", "test")):
            at = ({other: {"first_diff": p["first_diff"], "top2": p[f"{arm}_top2_at_diff"],
                           "margin": p[f"{arm}_margin_at_diff"], "error": p[f"{arm}_top2_error"]}}
                  if p.get(f"{arm}_top2_at_diff") else {})
            out.append({"arm": arm, **key, "repeat": 0, "output_ids": p[f"{side}_ids"], "error": p[f"{side}_error"],
                        "at_diff": at})
    return out


@pytest.mark.parametrize("path,prompts,identical", [
    ("sglang-h200-mla2-plugin-traced/device/identity.jsonl", 23, 16),
    ("sglang-h200-mla2-plugin-traced/device-tp2/identity.jsonl", 21, 17),
])
def test_compare_arms_judges_the_recorded_runs_as_their_pairs_were(path, prompts, identical):
    """The sweep's judge (compare_arms over one row per arm and prompt) on the recorded outputs: the same counts, every
    difference a rounding tie read from stock's server."""
    pairs = [json.loads(line) for line in (REFERENCE_DIR / path).read_text().splitlines()]
    res = identity.compare_arms(as_sweep_rows(pairs), "stock")
    plugin = res["arms"]["plugin"]
    assert (plugin["prompts"], plugin["identical"], plugin["rounding_ties"]) == (prompts, identical, prompts - identical)
    assert plugin["differs"] == plugin["unjudged"] == 0
    assert {d["margin_from"] for d in plugin["differences"]} == {"stock"}
    assert [d["first_diff"] for d in plugin["differences"]] == [p["first_diff"] for p in pairs if not p["identical"]]
