"""Unit tests of specdiag.measure.metrics on synthetic traces (no server)."""

from __future__ import annotations

import math

import pytest

from specdiag.serving import RequestTrace
from specdiag.measure.metrics import SWEEP_COLUMNS, error_row, sweep_row, verify_steps_in_window
from specdiag.stats import fit_line
from specdiag.measure.sweep_table import summarize_sweep
from specdiag.steps.baseline_sweep.summary import sweep_findings
from specdiag.speculation.commit import spec_fields_from_meta


def make_trace(chunk_t_s: list[float], chunk_tokens: list[int], prompt_tokens: int = 1000,
               extra_meta: dict | None = None, error: str | None = None, e2e_s: float | None = None) -> RequestTrace:
    completion = sum(chunk_tokens)
    meta = {"prompt_tokens": prompt_tokens, "completion_tokens": completion, "e2e_latency": 0.9,
            "finish_reason": {"type": "length", "length": completion}, **(extra_meta or {})}
    return RequestTrace(
        url="http://127.0.0.1:1/generate", t_send_unix_s=1.7e9, ttft_s=chunk_t_s[0] if chunk_t_s else None,
        chunk_t_s=chunk_t_s, chunk_tokens=chunk_tokens, prompt_tokens=prompt_tokens, completion_tokens=completion,
        e2e_s=e2e_s if e2e_s is not None else (chunk_t_s[-1] + 0.01 if chunk_t_s else None), text="",
        output_ids=list(range(completion)), meta_info=meta, finish_reason=meta["finish_reason"],
        spec=spec_fields_from_meta(meta), error=error)


def test_speculative_row_with_prefill_token_alone_in_first_chunk() -> None:
    # TTFT 0.5 s; then 4 verify steps 20 ms apart committing 3, 2, 4, 1 tokens.
    t = make_trace([0.5, 0.52, 0.54, 0.56, 0.58], [1, 3, 2, 4, 1], prompt_tokens=1000,
                   extra_meta={"spec_verify_ct": 4, "spec_accept_length": 11 / 4})
    row = sweep_row(t, 1000, repeat=0, prompt_kind="novel", seed=0)
    assert set(SWEEP_COLUMNS) <= set(row)
    assert row["ttft_s"] == pytest.approx(0.5)
    assert row["prefill_tok_s"] == pytest.approx(2000.0)
    assert row["decode_tok_s"] == pytest.approx(10 / 0.08)
    assert row["step_ms"] == pytest.approx(20.0) and row["step_ms_method"] == "verify_steps"
    assert row["verify_steps"] == 4
    assert row["commit_length"] == pytest.approx(10 / 4)
    assert row["accept_length"] == pytest.approx(2.75)
    assert row["prompt_tokens_match"] is True and row["error"] is None
    assert row["finish_reason"] == "length" and row["server_e2e_s"] == pytest.approx(0.9)
    assert row["repeat"] == 0 and row["prompt_kind"] == "novel" and row["n_chunks"] == 5
    assert row["ts_unix_s"] == 1.7e9  # when the request was sent


def test_step_ms_uses_exact_per_step_commits_when_first_chunk_holds_a_step() -> None:
    # The first chunk holds the prefill token and the first step's 3 tokens; 3 steps remain in the window.
    meta = {"spec_verify_ct": 4, "spec_step_commit_lengths": [3, 2, 4, 1]}
    t = make_trace([0.5, 0.53, 0.56, 0.59], [4, 2, 4, 1], extra_meta=meta)
    row = sweep_row(t, 1000)
    assert row["step_ms_method"] == "step_commits"
    assert row["step_ms"] == pytest.approx(30.0)
    # Without the per-step list the estimate scales verify_ct by the tokens in the window: 4 * 7/10 steps.
    assert verify_steps_in_window(4, 11, 4) == (pytest.approx(2.8), "verify_steps")


def test_non_speculative_row_counts_one_token_per_step() -> None:
    t = make_trace([0.2, 0.25, 0.30, 0.35], [1, 1, 1, 1], prompt_tokens=512)
    row = sweep_row(t, 512)
    assert row["verify_steps"] is None and row["commit_length"] is None
    assert row["step_ms"] == pytest.approx(50.0) and row["step_ms_method"] == "tokens"
    assert row["decode_tok_s"] == pytest.approx(20.0)


def test_failed_and_short_requests_keep_what_is_known() -> None:
    t = make_trace([0.4], [1], prompt_tokens=999, error="stream from x failed: dropped")
    row = sweep_row(t, 1000)
    assert row["error"].startswith("stream") and row["prompt_tokens_match"] is False
    assert row["ttft_s"] == pytest.approx(0.4) and row["decode_tok_s"] is None and row["step_ms"] is None
    empty = make_trace([], [], prompt_tokens=None, error="HTTP 400: too long")  # type: ignore[arg-type]
    row = sweep_row(empty, 1000)
    assert row["ttft_s"] is None and row["prefill_tok_s"] is None and row["prompt_tokens_match"] is None
    e = error_row(2048, "prompt: too short", 1.7e9, repeat=1)
    assert e["context_tokens"] == 2048 and e["error"] == "prompt: too short" and set(SWEEP_COLUMNS) <= set(e)


def test_fit_line_exact_and_noisy() -> None:
    fit = fit_line([1000, 11000, 32000], [8.0 + 0.0077 * x for x in (1000, 11000, 32000)])
    assert fit.slope_per_1k == pytest.approx(7.7) and fit.intercept == pytest.approx(8.0)
    assert fit.r2 == pytest.approx(1.0) and fit.n == 3 and fit.predict(0) == pytest.approx(8.0)
    noisy = fit_line([0, 1, 2, 3], [0.0, 1.5, 1.5, 3.0])
    assert noisy.slope == pytest.approx(0.9) and 0.8 < noisy.r2 < 1.0
    for bad in (([1], [1]), ([1, 1], [1, 2]), ([1, 2], [1]), ([1, 2], [1, math.nan])):
        with pytest.raises(ValueError):
            fit_line(*bad)


def published_rows() -> list[dict]:
    # The investigation's published sweep (tests/data/investigation_tables.md, step 1): context, decode tok/s, ms/step.
    table = [(1400, 118.6, 8.4), (11000, 19.9, 50), (32000, 6.3, 159), (64000, 2.8, 357), (128000, 1.4, 714),
             (185000, 0.7, 1430)]
    return [{"context_tokens": c, "decode_tok_s": d, "step_ms": s, "commit_length": 1.0 if c >= 64000 else None,
             "error": None} for c, d, s in table]


def test_findings_on_the_published_sweep() -> None:
    summary = summarize_sweep(published_rows())
    found = {f.id: f for f in sweep_findings(summary, source="published", rows=published_rows())}
    slope = found["sweep.step_time_slope"]
    np = pytest.importorskip("numpy")
    rows = published_rows()
    ls_slope, _ = np.polyfit([r["context_tokens"] for r in rows], [r["step_ms"] for r in rows], 1)
    assert slope.numbers["slope_ms_per_1k_tokens"] == pytest.approx(1000 * ls_slope)
    # The investigation's "about 7.7 ms per 1k tokens" is the slope between the end points.
    assert slope.numbers["endpoint_slope_ms_per_1k_tokens"] == pytest.approx(1000 * (1430 - 8.4) / (185000 - 1400))
    assert slope.severity == "warning" and slope.source == "published"
    collapse = found["sweep.decode_collapse"]
    assert collapse.numbers["decode_collapse_x"] == pytest.approx(118.6 / 0.7)  # 169x
    assert collapse.severity == "critical"
    commit = found["sweep.commit_length_long_context"]
    assert commit.numbers["commit_length_last"] == 1.0 and commit.severity == "warning"
    assert "sweep.failed_requests" not in found and "sweep.prompt_length_mismatch" not in found


def test_summary_medians_pooled_commit_and_failure_findings() -> None:
    rows = [
        {"context_tokens": 512, "repeat": 0, "ttft_s": 0.1, "decode_tok_s": 100.0, "step_ms": 20.0,
         "completion_tokens": 33, "verify_steps": 8, "error": None, "prompt_tokens_match": True},
        {"context_tokens": 512, "repeat": 1, "ttft_s": 0.3, "decode_tok_s": 80.0, "step_ms": 22.0,
         "completion_tokens": 17, "verify_steps": 8, "error": None, "prompt_tokens_match": True},
        {"context_tokens": 512, "repeat": 2, "ttft_s": None, "decode_tok_s": None, "step_ms": None,
         "completion_tokens": 0, "verify_steps": None, "error": "timeout", "prompt_tokens_match": None},
        {"context_tokens": 4096, "repeat": 0, "ttft_s": 1.0, "decode_tok_s": 90.0, "step_ms": 24.0,
         "completion_tokens": 33, "verify_steps": 16, "error": None, "prompt_tokens_match": False,
         "prompt_tokens": 4097},
    ]
    summary = summarize_sweep(rows)
    assert [s["context_tokens"] for s in summary] == [512, 4096]
    s0 = summary[0]
    assert s0["requests"] == 3 and s0["failed"] == 1
    assert s0["ttft_s"] == pytest.approx(0.2) and s0["step_ms"] == pytest.approx(21.0)
    assert s0["commit_length"] == pytest.approx((32 + 16) / 16)  # step-weighted, not a mean of means
    found = {f.id: f for f in sweep_findings(summary, rows=rows)}
    assert found["sweep.failed_requests"].numbers == {"failed": 1, "requests": 4}
    assert found["sweep.prompt_length_mismatch"].numbers == {"mismatched": 1}
    assert found["sweep.decode_collapse"].severity == "ok"  # 100 -> 90 tok/s is no collapse
    assert found["sweep.step_time_slope"].severity == "info"
