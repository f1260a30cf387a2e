"""Unit tests for specdiag.speculation: commit-length math, log-line and Prometheus parsing."""

from __future__ import annotations

import math

import pytest

from specdiag.speculation import commit, logs, scrapes

# A final meta_info as SGLang 0.5.23 sends it (values made up but self-consistent):
# 41 tokens, first from prefill, 40 from 16 verify steps -> commit length 2.5 per step.
META_NEW = {
    "completion_tokens": 41,
    "prompt_tokens": 1000,
    "spec_verify_ct": 16,
    "spec_accept_length": 41 / 16,
    "spec_accept_rate": 24 / (16 * 7),
    "spec_num_correct_drafts": 24,
    "spec_num_proposed_drafts": 16 * 7,
    # steps with 0..4 correct drafts: 0*3 + 1*6 + 2*4 + 3*2 + 4*1 = 24 drafts over 16 steps
    "spec_correct_drafts_histogram": [3, 6, 4, 2, 1],
}


def test_histogram_is_consistent_with_counts() -> None:
    hist = META_NEW["spec_correct_drafts_histogram"]
    assert sum(hist) == 16
    assert sum(i * n for i, n in enumerate(hist)) == 24


def test_commit_length_from_counts_and_histogram_agree() -> None:
    assert commit.commit_length_from_counts(41, 16) == pytest.approx(2.5)
    assert commit.commit_length_from_histogram(META_NEW["spec_correct_drafts_histogram"]) == pytest.approx(2.5)
    assert commit.commit_length_from_meta(META_NEW) == pytest.approx(2.5)


def test_commit_length_none_without_verify_steps() -> None:
    assert commit.commit_length_from_counts(10, 0) is None
    assert commit.commit_length_from_histogram([]) is None
    assert commit.commit_length_from_histogram([0, 0]) is None
    assert commit.commit_length_from_meta({"completion_tokens": 10}) is None


def test_commit_length_from_meta_falls_back_to_histogram_then_steps() -> None:
    assert commit.commit_length_from_meta({"spec_accept_histogram": [1, 1]}) == pytest.approx(1.5)
    assert commit.commit_length_from_meta({"spec_step_commit_lengths": [1, 2, 3, 6]}) == pytest.approx(3.0)


def test_spec_fields_current_names() -> None:
    f = commit.spec_fields_from_meta(META_NEW)
    assert f is not None
    assert f.verify_ct == 16
    assert f.accept_length == pytest.approx(41 / 16)
    assert f.num_correct_drafts == 24
    assert f.num_proposed_drafts == 112
    assert f.correct_drafts_histogram == [3, 6, 4, 2, 1]
    assert f.step_commit_lengths is None
    assert commit.SpecFields.from_meta(META_NEW) == f


@pytest.mark.parametrize(
    ("correct_key", "proposed_key", "hist_key"),
    [
        ("spec_accepted_drafts", "spec_proposed_drafts", "spec_accept_histogram"),
        ("spec_accept_token_num", "spec_draft_token_num", "spec_accept_histogram"),
    ],
)
def test_spec_fields_older_names(correct_key: str, proposed_key: str, hist_key: str) -> None:
    meta = {"completion_tokens": 9, "spec_verify_ct": 4, correct_key: 4, proposed_key: 12, hist_key: [1, 2, 1]}
    f = commit.spec_fields_from_meta(meta)
    assert f is not None
    assert (f.num_correct_drafts, f.num_proposed_drafts, f.correct_drafts_histogram) == (4, 12, [1, 2, 1])
    assert commit.commit_length_from_meta(meta) == pytest.approx(2.0)


def test_spec_fields_embedded_extras_and_absence() -> None:
    meta = {
        "spec_verify_ct": 3,
        "spec_step_commit_lengths": [1, 4, 2],
        "spec_step_draft_ms": [1.5, 1.25, 1.0],
        "spec_step_verify_ms": [10, 11, 12],
    }
    f = commit.spec_fields_from_meta(meta)
    assert f is not None and f.step_commit_lengths == [1, 4, 2]
    assert f.step_draft_ms == [1.5, 1.25, 1.0] and f.step_verify_ms == [10.0, 11.0, 12.0]
    assert commit.spec_fields_from_meta({"completion_tokens": 5, "prompt_tokens": 3}) is None
    assert commit.spec_fields_from_meta(None) is None


def test_pooled_commit_length_weights_steps() -> None:
    # request A: 11 tokens over 2 steps (5.0 each), request B: 3 tokens over 2 steps (1.0 each)
    # mean of means = 3.0, step-weighted = (10 + 2) / 4 = 3.0; make it unequal:
    assert commit.pooled_commit_length([(11, 2), (5, 4), (7, 0)]) == pytest.approx((10 + 4) / 6)
    assert commit.pooled_commit_length([]) is None


def test_step_commit_stats_and_histogram() -> None:
    steps = [1, 2, 2, 3, 8]
    s = commit.step_commit_stats(steps)
    assert s.n_steps == 5
    assert s.mean == pytest.approx(3.2)
    assert s.median == 2.0
    assert s.min == 1 and s.max == 8
    assert s.mean_accepted_drafts == pytest.approx(2.2)
    assert s.p10 == pytest.approx(1.4)  # numpy.percentile(steps, 10)
    assert s.p90 == pytest.approx(6.0)  # numpy.percentile(steps, 90)
    assert s.std == pytest.approx(math.sqrt(sum((x - 3.2) ** 2 for x in steps) / 5))
    assert commit.commit_histogram(steps) == [0, 1, 2, 1, 0, 0, 0, 0, 1]
    assert commit.commit_histogram([1, 2], max_len=4) == [0, 1, 1, 0, 0]
    assert commit.accepted_drafts(steps) == [0, 1, 1, 2, 7]
    assert commit.commit_histogram_from_correct_drafts([3, 6, 4]) == [0, 3, 6, 4]


def test_step_commit_stats_rejects_bad_input() -> None:
    with pytest.raises(ValueError, match="empty"):
        commit.step_commit_stats([])
    with pytest.raises(ValueError, match=">= 1"):
        commit.step_commit_stats([0, 2])
    with pytest.raises(ValueError, match="max_len"):
        commit.commit_histogram([1, 9], max_len=8)


# --- log lines ---------------------------------------------------------------------------------

NEW_LINE = (
    "[2026-11-29 12:00:00 TP0] Decode batch, #running-req: 1, #cached-token: 0, #token: 131584, "
    "token usage: 0.13, accept len: 2.31, accept rate: 0.19, cuda graph: True, "
    "gen throughput (token/s): 41.27, #queue-req: 0"
)
OLD_LINE = (
    "[2025-03-01 08:15:02] Decode batch. #running-req: 2, #token: 4096, token usage: 0.02, "
    "accept len: 3.10, gen throughput (token/s): 120.50, #queue-req: 1"
)


def test_parse_decode_line_current_format() -> None:
    d = logs.parse_decode_log_line(NEW_LINE)
    assert d is not None
    assert d.ts == "2026-11-29 12:00:00" and d.rank == "TP0" and d.iteration is None
    assert (d.running_req, d.num_token, d.queue_req) == (1, 131584, 0)
    assert d.token_usage == pytest.approx(0.13)
    assert d.accept_len == pytest.approx(2.31) and d.accept_rate == pytest.approx(0.19)
    assert d.cuda_graph is True
    assert d.gen_throughput_tok_s == pytest.approx(41.27)


def test_parse_decode_line_old_format_without_accept_rate() -> None:
    d = logs.parse_decode_log_line(OLD_LINE)
    assert d is not None
    assert d.rank is None and d.ts == "2025-03-01 08:15:02"
    assert d.accept_len == pytest.approx(3.10) and d.accept_rate is None
    assert d.cuda_graph is None
    assert d.gen_throughput_tok_s == pytest.approx(120.5)


def test_parse_decode_line_variants() -> None:
    # no prefix, no speculative part, forward-iteration counter, cpu graph, DP+TP prefix
    d = logs.parse_decode_log_line(
        "Decode batch [4242], #running-req: 3, #token: 10, token usage: 0.00, cpu graph: False, "
        "gen throughput (token/s): 9.00, #queue-req: 0"
    )
    assert d is not None and d.iteration == 4242 and d.accept_len is None and d.cuda_graph is False
    d = logs.parse_decode_log_line(
        "[2026-11-29 12:00:00.123 DP1 TP3] Decode batch, #running-req: 1, #full token: 5, "
        "full token usage: 0.01, swa token: 3, swa token usage: 0.01, accept len: 1.50, accept rate: 0.07, "
        "cap len: 1.40, block accept len: 1.30, cuda graph: True, gen throughput (token/s): 1.00, "
        "#queue-req: 0, fwd occupancy: 93.20%"
    )
    assert d is not None and d.rank == "DP1 TP3" and d.num_token is None
    assert d.accept_len == pytest.approx(1.5)
    assert d.fields["cap len"] == "1.40" and d.fields["fwd occupancy"] == "93.20%"


def test_parse_decode_line_ignores_other_lines() -> None:
    assert logs.parse_decode_log_line("[2026-11-29 12:00:00 TP0] Prefill batch, #new-seq: 1") is None
    assert logs.parse_decode_log_line("INFO: 127.0.0.1 - POST /generate 200") is None
    assert logs.parse_decode_log([NEW_LINE, "noise", OLD_LINE]) == [
        logs.parse_decode_log_line(NEW_LINE),
        logs.parse_decode_log_line(OLD_LINE),
    ]


def test_parse_prefill_line() -> None:
    p = logs.parse_prefill_log_line(
        "[2026-11-29 12:00:00 TP0] Prefill batch, #new-seq: 1, #new-token: 8192, #cached-token: 0, "
        "token usage: 0.01, #running-req: 0, #queue-req: 0, #pending-token: 0, cuda graph: False, "
        "input throughput (token/s): 15321.40"
    )
    assert p is not None and (p.new_seq, p.new_token, p.cached_token) == (1, 8192, 0)
    assert p.input_throughput_tok_s == pytest.approx(15321.4)


def test_parse_commit_stats_line() -> None:
    line = "step 120: avg_commit_len = 2.31, avg_accepted_depth = 1.31, avg_accepted_drafts = 1.31"
    assert logs.parse_commit_stats_line(line) == {
        "avg_commit_len": pytest.approx(2.31),
        "avg_accepted_depth": pytest.approx(1.31),
        "avg_accepted_drafts": pytest.approx(1.31),
    }
    assert logs.parse_commit_stats_line("avg_commit_len: 7") == {"avg_commit_len": 7.0}
    assert logs.parse_commit_stats_line("Decode batch, accept len: 2.0") is None


# --- Prometheus ---------------------------------------------------------------------------------

SCRAPE_1 = """\
# HELP sglang:generation_tokens_total Number of generation tokens processed.
# TYPE sglang:generation_tokens_total counter
sglang:generation_tokens_total{engine_type="unified",is_streaming="true",model_name="m"} 1000.0
sglang:generation_tokens_total{engine_type="unified",is_streaming="false",model_name="m"} 25.0
sglang:spec_verify_calls_total{engine_type="unified",model_name="m"} 400.0
sglang:spec_accept_length{model_name="m",tp_rank="0"} 2.5
sglang:time_to_first_token_seconds_bucket{le="+Inf",model_name="m"} 7.0 1700000000000
weird_label{path="a \\"quoted\\" \\\\ x"} NaN
"""
SCRAPE_2 = SCRAPE_1.replace("} 1000.0", "} 1361.0").replace("} 400.0", "} 520.0")


def test_parse_prometheus() -> None:
    s = scrapes.parse_prometheus(SCRAPE_1)
    gen = s["sglang:generation_tokens_total"]
    assert len(gen) == 2 and gen[0][0]["is_streaming"] == "true" and gen[0][1] == 1000.0
    assert s["sglang:time_to_first_token_seconds_bucket"][0][0]["le"] == "+Inf"
    assert s["sglang:time_to_first_token_seconds_bucket"][0][1] == 7.0
    (labels, value), = s["weird_label"]
    assert labels["path"] == 'a "quoted" \\ x' and math.isnan(value)
    assert scrapes.metric_total(s, "sglang:generation_tokens_total") == 1025.0
    assert scrapes.metric_total(s, "sglang:generation_tokens_total", is_streaming="false") == 25.0
    assert scrapes.metric_total(s, "absent") is None


def test_parse_prometheus_rejects_malformed_line() -> None:
    with pytest.raises(ValueError, match="line 2"):
        scrapes.parse_prometheus("ok 1\nbroken{x=1} 2\n")
    with pytest.raises(ValueError, match="line 1: .*'lonely_metric'"):
        scrapes.parse_prometheus("lonely_metric\n")


def test_parse_prometheus_names_counters_with_total() -> None:
    """prometheus_client's convention: a counter typed without ``_total`` has its sample named with it."""
    s = scrapes.parse_prometheus("# TYPE energy_joules counter\nenergy_joules 5\n# TYPE up gauge\nup 1\n")
    assert s == {"energy_joules_total": [({}, 5.0)], "up": [({}, 1.0)]}
    assert isinstance(s["up"][0][1], float)


def test_commit_length_from_scrapes() -> None:
    before, after = scrapes.parse_prometheus(SCRAPE_1), scrapes.parse_prometheus(SCRAPE_2)
    assert scrapes.sglang_commit_length_from_scrapes(before, after) == pytest.approx(361 / 120)
    assert scrapes.sglang_commit_length_from_scrapes(before, before) is None  # no verify call between
    assert scrapes.sglang_commit_length_from_scrapes({}, {}) is None


def test_vllm_mean_acceptance_length() -> None:
    before = scrapes.parse_prometheus(
        'vllm:spec_decode_num_drafts_total{model_name="m"} 100\n'
        'vllm:spec_decode_num_accepted_tokens_total{model_name="m"} 150\n'
    )
    after = scrapes.parse_prometheus(
        'vllm:spec_decode_num_drafts_total{model_name="m"} 300\n'
        'vllm:spec_decode_num_accepted_tokens_total{model_name="m"} 450\n'
    )
    assert scrapes.vllm_mean_acceptance_length(before, after) == pytest.approx(1 + 300 / 200)
    assert scrapes.vllm_mean_acceptance_length(after, after) is None
