"""Unit tests of specdiag.steps.commit_probe.probe on synthetic traces and rows (no server)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from specdiag.steps.commit_probe import probe as cp
from specdiag.nb import ParameterError
from specdiag.speculation.commit import SpecFields


def _trace(commits: list[int], ttft_s: float = 0.5, e2e_s: float = 2.0, prompt_tokens: int = 1024,
           error: str | None = None) -> SimpleNamespace:
    completion = 1 + sum(commits)
    spec = SpecFields(verify_ct=len(commits), accept_length=None, num_correct_drafts=sum(c - 1 for c in commits),
                      num_proposed_drafts=7 * len(commits), correct_drafts_histogram=None,
                      step_commit_lengths=commits, step_draft_ms=[1.0] * len(commits),
                      step_verify_ms=[2.0] * len(commits))
    # first chunk: the prefill token; then one chunk per step, 0.1 s apart
    chunk_t = [ttft_s] + [ttft_s + 0.1 * (i + 1) for i in range(len(commits))]
    return SimpleNamespace(url="http://x", t_send_unix_s=1000.0, ttft_s=ttft_s, chunk_t_s=chunk_t,
                           chunk_tokens=[1, *commits], prompt_tokens=prompt_tokens, completion_tokens=completion,
                           e2e_s=e2e_s, text="", output_ids=[], meta_info={"prompt_tokens": prompt_tokens},
                           finish_reason={"type": "length"}, spec=spec, error=error)


REQ = {"context_tokens": 1024, "kind": "predictable", "seed": 0, "max_new_tokens": 33}


def test_probe_row_numbers() -> None:
    row = cp.probe_row(_trace([8, 8, 8, 8]), REQ, num_draft_tokens=8, cache_flushed=True)
    assert set(row) == set(cp.PROBE_COLUMNS)
    assert row["commit_length"] == pytest.approx(32 / 4)
    assert row["accepted_drafts"] == pytest.approx(7.0)
    assert row["proposed_drafts"] == pytest.approx(7.0)
    assert row["max_commit_length"] == 8
    assert row["commit_histogram"] == [0, 0, 0, 0, 0, 0, 0, 0, 4]
    assert row["prefill_share"] == pytest.approx(0.25)
    assert row["decode_tok_s"] == pytest.approx(32 / 0.4)
    assert row["prompt_tokens_match"] is True and row["error"] is None


def test_step_rows() -> None:
    rows = cp.step_rows(_trace([3, 1, 8]), REQ)
    assert [r["commit_length"] for r in rows] == [3, 1, 8]
    assert [r["accepted_drafts"] for r in rows] == [2, 0, 7]
    assert [r["step"] for r in rows] == [0, 1, 2]
    assert all(set(r) == set(cp.STEP_COLUMNS) for r in rows)


def test_error_row_keeps_request() -> None:
    row = cp.error_row(REQ, "prompt: boom", 8)
    assert row["error"] == "prompt: boom" and row["context_tokens"] == 1024 and row["commit_length"] is None


def test_make_plan_checks() -> None:
    plan = cp.make_plan([1024, 4096], ["predictable", "novel"], 64, 0)
    assert len(plan.requests()) == 4
    with pytest.raises(ParameterError, match="kinds"):
        cp.make_plan([1024], ["cats"], 64, 0)
    with pytest.raises(ParameterError, match="context_length"):
        cp.make_plan([4096], ["predictable"], 64, 0, server_context_length=4096)
    with pytest.raises(ParameterError, match="max_new_tokens"):
        cp.make_plan([1024], ["predictable"], 1, 0)
    done = {(1024, "predictable", 0, 64)}
    assert len(plan.pending(done)) == 3


def _row(ctx: int, kind: str, commit: float, wall: float = 1.0, pre: float = 0.2, seed: int = 0) -> dict:
    return {"context_tokens": ctx, "kind": kind, "seed": seed, "max_new_tokens": 64, "commit_length": commit,
            "accepted_drafts": commit - 1, "wall_s": wall, "prefill_s": pre, "max_commit_length": 8,
            "error": None}


def _cell(ctx: int, kind: str, commits: list[float]) -> list[dict]:
    """One request per commit length (seeds 0, 1, ...)."""
    return [_row(ctx, kind, c, seed=i) for i, c in enumerate(commits)]


def test_plan_repeats_take_seeds() -> None:
    plan = cp.make_plan([1024], ["predictable", "novel"], 64, 5, repeats=3)
    assert [(q["kind"], q["seed"]) for q in plan.requests()] == [
        ("predictable", 5), ("novel", 5), ("predictable", 6), ("novel", 6), ("predictable", 7), ("novel", 7)]
    with pytest.raises(ParameterError, match="repeats"):
        cp.make_plan([1024], ["novel"], 64, 0, repeats=0)


def test_findings_flat_and_text_difficulty() -> None:
    rows = [r for c in (1024, 4096, 16384) for r in _cell(c, "predictable", [7.5, 7.4, 7.6])] + \
           [r for c in (1024, 4096, 16384) for r in _cell(c, "novel", [1.6, 1.5, 1.7])]
    found = {f.id: f for f in cp.probe_findings(cp.summarize(rows), 8)}
    assert found["probe.predictable_flat"].severity == "ok" and "a tie" in found["probe.predictable_flat"].verdict
    assert "3 / 3 requests" in found["probe.predictable_flat"].evidence[1]
    text = found["probe.novel_is_text_difficulty"]
    assert text.numbers["requests_by_context"][1024] == [3, 3]
    lo, hi = text.numbers["interval_by_context"][1024]
    assert lo <= 1.6 / 7.5 <= hi <= 0.5
    assert "probe.predictable_falls" not in found


def test_findings_falling_is_a_bug() -> None:
    rows = _cell(1024, "predictable", [7.8, 7.7, 7.9]) + _cell(4096, "predictable", [5.0, 5.1, 4.9]) + \
        _cell(16384, "predictable", [1.2, 1.3, 1.1])
    found = {f.id: f for f in cp.probe_findings(cp.summarize(rows), 8)}
    falls = found["probe.predictable_falls"]
    assert falls.severity == "critical" and "sliding window" in falls.verdict
    assert falls.numbers["ratio_hi"] < 1.0 and "3 / 3 requests" in falls.verdict


def test_two_requests_a_cell_are_not_enough_for_a_verdict() -> None:
    rows = _cell(1024, "predictable", [7.8, 7.7]) + _cell(16384, "predictable", [1.2, 1.3]) + \
        _cell(1024, "novel", [1.5, 1.6]) + _cell(16384, "novel", [1.1, 1.0])
    found = {f.id: f for f in cp.probe_findings(cp.summarize(rows), 8)}
    assert set(found) == {"probe.predictable_not_enough", "probe.novel_not_enough"}
    assert all(f.severity == "info" and "Not enough requests" in f.verdict for f in found.values())
    assert "2 / 2 requests: not enough requests" in found["probe.predictable_not_enough"].evidence[1]


def test_overlapping_requests_are_a_tie_and_separated_ones_a_difference() -> None:
    overlap = _cell(1024, "predictable", [6.0, 7.5, 7.0]) + _cell(16384, "predictable", [5.5, 7.2, 6.6])
    flat = {f.id: f for f in cp.probe_findings(cp.summarize(overlap), 8)}["probe.predictable_flat"]
    assert "a tie" in flat.verdict and flat.numbers["ratio_lo"] <= 1.0 <= flat.numbers["ratio_hi"]
    # a drop above the band whose interval holds no change is no bug: uneven, said as a tie
    wide = _cell(1024, "predictable", [7.5, 3.0, 7.0]) + _cell(16384, "predictable", [7.4, 2.5, 2.6])
    found = {f.id: f for f in cp.probe_findings(cp.summarize(wide), 8)}
    assert "probe.predictable_falls" not in found and "a tie" in found["probe.predictable_uneven"].verdict
    straddle = _cell(1024, "predictable", [4.0, 4.2, 4.1]) + _cell(1024, "novel", [1.0, 3.0, 2.0])
    assert "probe.novel_undecided" in {f.id for f in cp.probe_findings(cp.summarize(straddle), 8)}


def test_findings_flat_but_low_and_novel_close() -> None:
    rows = [r for c in (1024, 4096) for r in _cell(c, "predictable", [1.5, 1.52, 1.48])] + \
        [r for c in (1024, 4096) for r in _cell(c, "novel", [1.4, 1.42, 1.38])]
    found = {f.id: f for f in cp.probe_findings(cp.summarize(rows), 8)}
    assert found["probe.predictable_flat"].severity == "warning"
    assert "probe.novel_close_to_predictable" in found


def test_findings_prefill_share() -> None:
    rows = [_row(1024, "predictable", 7.5, 1.0, 0.1), _row(16384, "predictable", 7.4, 10.0, 9.0)]
    found = {f.id: f for f in cp.probe_findings(cp.summarize(rows), 8)}
    assert found["probe.prefill_dominates"].numbers["prefill_share"] == pytest.approx(0.9)


def test_summarize_pools_steps_and_skips_errors() -> None:
    rows = [{**_row(1024, "predictable", 8.0), "completion_tokens": 33, "verify_steps": 4},
            {**_row(1024, "predictable", 2.0), "completion_tokens": 9, "verify_steps": 4, "seed": 1},
            {**_row(1024, "novel", 0.0), "commit_length": None, "error": "boom"}]
    summary = cp.summarize(rows)
    assert len(summary) == 1
    assert summary[0]["commit_length"] == pytest.approx((32 + 8) / 8)


def test_latest_rows_prefers_success() -> None:
    bad = {**_row(1024, "predictable", 0.0), "error": "x"}
    good = _row(1024, "predictable", 7.0)
    assert cp.latest_rows([good, bad]) == [good]


def test_target_forwards_where_steps_pass_without_a_draft() -> None:
    from specdiag.steps.commit_probe.probe import target_forwards

    assert target_forwards(33, 10, 40, steps_are_verifies=True) == 10  # SGLang: every decode step verifies
    assert target_forwards(33, 10, 12, steps_are_verifies=False) == 20  # vLLM: 32 = 10 drafted steps + 12 + 10 plain
    assert target_forwards(33, None, None, steps_are_verifies=False) is None
    assert target_forwards(1, 0, 0, steps_are_verifies=True) is None


def test_no_commit_on_either_text_is_the_only_verdict() -> None:
    from specdiag.steps.commit_probe.probe import probe_findings

    summary = [{"kind": k, "context_tokens": c, "commit_length": 1.0, "prefill_share": 0.2, "prefill_s": 1, "wall_s": 5}
               for k in ("predictable", "novel") for c in (1024, 4096)]
    found = {f.id: f for f in probe_findings(summary, 8)}
    assert set(found) == {"probe.drafter_does_not_commit"}
    assert "neither a long-context bug nor the text's difficulty" in found["probe.drafter_does_not_commit"].verdict
    summary[0]["commit_length"] = 6.0  # the cat text commits: the ordinary verdicts again
    assert "probe.drafter_does_not_commit" not in {f.id for f in probe_findings(summary, 8)}
