"""Contract tests against real SGLang 0.5.17 bytes, recorded on the H200 (tests/data/sglang-0.5.17/).

scripts/record_sglang_exchange.py keeps the raw exchanges of three real servers (2026-11-30; their runs are
data/reference/sglang-h200-tiny-* and sglang-h200-mla2-stock-185k): the tiny trained target with its STANDALONE
drafter, the same with NGRAM, and an MLA model with NGRAM. Each test feeds those bytes through the client's parsing
(SSE decoder, trace assembly, spec fields, settings and snapshot rows, metrics parser, error messages), directly and
over HTTP from tests/sglang_replay_server.py (which answers with the recorded bytes, streams in the chunks they
arrived in), and asserts the values the real server sent.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from specdiag.steps.snapshot import settings as snapshot
from specdiag.serving import SGLangClient
from specdiag.serving.errors import error_message_from_body
from specdiag.serving.settings import settings_from_sglang
from specdiag.serving.sse import DONE, SSEDecoder
from specdiag.serving.trace import assemble_stream
from specdiag.speculation.commit import commit_length_from_counts, commit_length_from_histogram, commit_length_from_meta
from specdiag.speculation.logs import parse_decode_log
from specdiag.speculation.scrapes import metric_total, parse_prometheus, sglang_commit_length_from_scrapes

sys.path.insert(0, str(Path(__file__).parent))
from sglang_replay_server import ReplayServer  # noqa: E402

DATA = Path(__file__).parent / "data" / "sglang-0.5.17"
ROOT = Path(__file__).resolve().parents[1]

# What the real server sent in each recorded stream (1,024-token prompt, 32 new tokens, greedy, ignore_eos):
# (folder, kind) -> (spec_verify_ct, completion_tokens, data chunks, spec_correct_drafts_histogram)
STREAMS = {
    ("raw-tiny-standalone", "novel"): (21, 32, 22, [14, 5, 1, 1]),
    ("raw-tiny-standalone", "predictable"): (7, 32, 8, [3, 0, 0, 0, 0, 0, 0, 4]),
    ("raw-tiny-ngram", "novel"): (28, 32, 29, [26, 1, 1]),
    ("raw-tiny-ngram", "predictable"): (7, 32, 8, [2, 1, 0, 0, 0, 1, 0, 3]),
    ("raw-mla-ngram", "novel"): (19, 32, 20, [16, 0, 1, 0, 0, 0, 0, 2]),
    ("raw-mla-ngram", "predictable"): (31, 32, 32, [31]),
}


def _meta(folder: str, name: str) -> dict:
    return json.loads((DATA / folder / f"{name}.meta.json").read_text())


def _decode_recorded(folder: str, name: str) -> list:
    """The stream's bytes through SSEDecoder, fed in the pieces the recorder's reads returned."""
    raw = (DATA / folder / f"{name}.sse").read_bytes()
    dec, events, pos = SSEDecoder(), [], 0
    for size in _meta(folder, name)["read_sizes"]:
        events += dec.feed(raw[pos:pos + size])
        pos += size
    tail, rest = dec.close()
    assert pos == len(raw) and rest == b""
    return events + tail


@pytest.mark.parametrize(("folder", "kind"), sorted(STREAMS))
def test_recorded_stream_decodes_to_the_values_the_server_sent(folder: str, kind: str) -> None:
    verify_ct, completion, n_chunks, hist = STREAMS[folder, kind]
    events = _decode_recorded(folder, f"generate_stream_{kind}_1024")
    assert events[-1] == DONE and events.count(DONE) == 1
    trace = assemble_stream([(0.01 * i, ev) for i, ev in enumerate(events)], "http://h200", 0.0, 1.0)
    assert trace.stream_mode == "cumulative" and trace.n_chunks == n_chunks == verify_ct + 1  # prefill + verify steps
    assert trace.completion_tokens == completion == len(trace.output_ids) and sum(trace.chunk_tokens) == completion
    assert trace.chunk_tokens[0] == 1  # the first token comes from prefill
    assert trace.prompt_tokens == 1024 and trace.finish_reason == {"type": "length", "length": completion}
    assert trace.finish_type == "length" and trace.cached_tokens == 0
    meta = trace.meta_info
    # 0.5.17 sends every count under the current and the older name, with equal values.
    assert meta["spec_verify_ct"] == verify_ct
    assert meta["spec_num_correct_drafts"] == meta["spec_accepted_drafts"] == sum(i * n for i, n in enumerate(hist))
    assert meta["spec_num_proposed_drafts"] == meta["spec_proposed_drafts"] == 7 * verify_ct
    assert meta["spec_correct_drafts_histogram"] == meta["spec_accept_histogram"] == hist
    spec = trace.spec
    assert spec.verify_ct == verify_ct and spec.correct_drafts_histogram == hist
    assert spec.num_proposed_drafts == 7 * verify_ct and spec.step_commit_lengths is None and spec.step_draft_ms is None
    # Commit length: (completion - 1) / verify steps = 1 + mean correct drafts from the histogram; SGLang's own
    # spec_accept_length is completion / verify steps (the prefill token counted too).
    commit = commit_length_from_counts(trace.completion_tokens, spec.verify_ct)
    assert commit == pytest.approx((completion - 1) / verify_ct)
    assert spec.accept_length == pytest.approx(completion / verify_ct)
    # The histogram and spec_num_correct_drafts also count drafts the last verify step accepted past
    # max_new_tokens (the output is cut there): at most one step's 7 drafts more than the tokens committed.
    overshoot = spec.num_correct_drafts - (completion - 1 - verify_ct)
    assert 0 <= overshoot <= 7
    assert commit_length_from_histogram(hist) == pytest.approx(commit + overshoot / verify_ct)
    assert commit_length_from_meta(meta) == pytest.approx(commit)  # counts first, never the histogram
    # What the recorder's own client run parsed on the H200 agrees.
    parsed = json.loads((DATA / folder / f"client_parse_{kind}_1024.json").read_text())
    assert parsed["error"] is None and parsed["n_chunks"] == n_chunks and parsed["completion_tokens"] == completion
    assert parsed["spec"]["verify_ct"] == verify_ct


@pytest.fixture(params=["raw-tiny-standalone", "raw-tiny-ngram", "raw-mla-ngram"])
def replay(request: pytest.FixtureRequest):
    with ReplayServer(recorded=DATA / request.param) as srv:
        yield request.param, srv


def test_stream_over_http_from_the_recorded_bytes(replay) -> None:
    folder, srv = replay
    client = SGLangClient(srv.url, timeout_s=10)
    for kind in ("novel", "predictable"):
        verify_ct, completion, n_chunks, hist = STREAMS[folder, kind]
        trace = client.generate(input_ids=[1] * 1024, sampling_params={"max_new_tokens": 32}, stream=True,
                                extra_body={"rid": f"generate_stream_{kind}_1024"})
        assert trace.error is None and trace.error_kind is None
        assert trace.n_chunks == n_chunks and trace.completion_tokens == completion
        assert len(trace.chunk_t_s) == n_chunks and trace.ttft_s is not None
        assert trace.spec.verify_ct == verify_ct and trace.spec.correct_drafts_histogram == hist
        assert trace.finish_type == "length" and trace.stream_mode == "cumulative"


def test_non_stream_answer(replay) -> None:
    folder, srv = replay
    trace = SGLangClient(srv.url, timeout_s=10).generate(input_ids=[1] * 256, stream=False)
    sent = json.loads((DATA / folder / "generate_nonstream.json").read_text())["meta_info"]
    assert trace.error is None and trace.completion_tokens == sent["completion_tokens"] == 16
    assert trace.spec.verify_ct == sent["spec_verify_ct"] and trace.spec.num_proposed_drafts == 7 * sent["spec_verify_ct"]
    assert trace.finish_reason == {"type": "length", "length": 16} and trace.n_chunks == 1 and trace.ttft_s is None
    if folder == "raw-tiny-standalone":
        assert (sent["spec_verify_ct"], sent["spec_correct_drafts_histogram"]) == (9, [4, 4, 1])


def test_over_long_prompt_errors(replay) -> None:
    """Non-stream: HTTP 400 with {"error": {"message"}}; stream: HTTP 200, an error chunk, then [DONE]."""
    folder, srv = replay
    limit = json.loads((DATA / folder / "server_info.json").read_text())["context_length"]
    want = f"The input ({limit + 16} tokens) is longer than the model's context length ({limit} tokens)."
    assert error_message_from_body((DATA / folder / "generate_error_overlong.json").read_text()) == want
    client = SGLangClient(srv.url, timeout_s=10)
    trace = client.generate(input_ids=[1] * (limit + 16), stream=False)
    assert trace.error_kind == "http" and "HTTP 400" in trace.error and want in trace.error
    trace = client.generate(input_ids=[1] * (limit + 16), stream=True)
    assert _meta(folder, "generate_error_overlong_stream")["status"] == 200
    assert trace.error_kind == "stream" and "error chunk" in trace.error and want in trace.error
    assert trace.completion_tokens == 0 and trace.n_chunks == 0


def test_endpoints_settings_and_snapshot_rows(replay) -> None:
    folder, srv = replay
    client = SGLangClient(srv.url, timeout_s=10)
    assert client.health() is True
    assert client.flush_cache() is True  # 200 with a text body: "Cache flushed.\nPlease check backend logs ..."
    assert (DATA / folder / "flush_cache.txt").read_text().startswith("Cache flushed.")
    assert client.tokenize("The cat sat on the mat.", add_special_tokens=True) == [418, 265, 270, 271, 270, 363, 266, 1007, 14]
    info = client.server_info()
    s = client.settings()
    mla = folder == "raw-mla-ngram"
    assert (s.version, s.attention_backend, s.page_size, s.tokens_per_step, s.tp_size) == ("0.5.17", "triton", 1, 8, 1)
    assert s.context_length == (200000 if mla else 16384) and s.draft_window is None
    assert client.model_info()["architectures"] == (["DeepseekV3ForCausalLM"] if mla else ["Qwen3ForCausalLM"])
    if folder == "raw-tiny-standalone":
        assert (s.algorithm, s.draft_steps, s.source("draft_steps")) == ("STANDALONE", 7, "/server_info")
        assert info["speculative_eagle_topk"] == 1
    else:
        # NGRAM: 0.5.17 reports speculative_num_steps 0 (and eagle_topk 10) yet proposes 7 drafts per verify step.
        assert (info["speculative_num_steps"], info["speculative_eagle_topk"]) == (0, 10)
        sent = json.loads((DATA / folder / "generate_nonstream.json").read_text())["meta_info"]
        assert s.algorithm == "NGRAM" and s.draft_steps == sent["spec_num_proposed_drafts"] // sent["spec_verify_ct"] == 7
        assert s.source("draft_steps").startswith("computed") and "speculative_num_steps 0" in s.source("draft_steps")
    rows = {r["key"]: r for r in snapshot.server_settings(info)}
    for key in ("speculative_algorithm", "speculative_num_draft_tokens", "attention_backend", "page_size", "tp_size",
                "context_length", "kv_cache_dtype", "version", "max_total_num_tokens", "triton_attention_num_kv_splits"):
        assert key in rows, key
    assert rows["max_total_num_tokens"]["value"] == (32317966 if mla else 65536)  # from internal_states[0]
    assert rows["triton_attention_num_kv_splits"]["value"] == 8
    assert "speculative_draft_window_size" not in rows  # reported as null: no row, never a guessed value


def test_metrics_scrapes(replay) -> None:
    """Two /metrics scrapes around the recorded requests: names and the commit length between them."""
    folder, srv = replay
    client = SGLangClient(srv.url, timeout_s=10)
    before, after = parse_prometheus(client.metrics_text()), parse_prometheus(client.metrics_text())
    for name in ("sglang:generation_tokens_total", "sglang:spec_verify_calls_total", "sglang:num_requests_total",
                 "sglang:time_to_first_token_seconds_bucket", "sglang:spec_accept_length", "sglang:num_running_reqs"):
        assert name in after, name
    tokens = metric_total(after, "sglang:generation_tokens_total") - metric_total(before, "sglang:generation_tokens_total")
    calls = metric_total(after, "sglang:spec_verify_calls_total") - (metric_total(before, "sglang:spec_verify_calls_total") or 0)
    # Between the scrapes the recorder sent each recorded stream twice (raw, then through the client), the 16-token
    # non-stream request and two over-long ones (refused, not counted): the counters add up to the meta_info counts.
    nonstream = json.loads((DATA / folder / "generate_nonstream.json").read_text())["meta_info"]
    assert tokens == 4 * 32 + 16 == 144
    assert calls == 2 * (STREAMS[folder, "novel"][0] + STREAMS[folder, "predictable"][0]) + nonstream["spec_verify_ct"]
    assert calls == {"raw-tiny-standalone": 65, "raw-tiny-ngram": 85, "raw-mla-ngram": 115}[folder]
    assert metric_total(after, "sglang:num_requests_total") - metric_total(before, "sglang:num_requests_total") == 5
    assert sglang_commit_length_from_scrapes(before, after) == pytest.approx(tokens / calls)


def test_decode_log_lines_of_the_real_server() -> None:
    lines = (ROOT / "data/reference/sglang-h200-tiny-standalone/server.log").read_text().splitlines()
    decoded = parse_decode_log(lines)
    assert len(decoded) == sum("Decode batch" in line for line in lines) == 6
    assert (decoded[0].running_req, decoded[0].accept_len, decoded[0].accept_rate, decoded[0].gen_throughput_tok_s) == (
        1, 1.57, 0.08, 7.11)


def test_settings_from_the_recorded_server_info_directly() -> None:
    info = json.loads((DATA / "raw-tiny-standalone" / "server_info.json").read_text())
    s = settings_from_sglang(info)
    assert s.draft_model.endswith("data/models/drafter") and s.kv_cache_dtype == "auto" and s.dtype == "auto"
    assert info["speculative_draft_window_size"] is None and info["speculative_attention_mode"] == "prefill"


def test_probe_row_from_a_recorded_stream_keeps_the_counts() -> None:
    """04's row from the real MLA novel stream: 19 verify steps, 32 tokens, yet 16 correct drafts (2 steps took all
    7, one took 2): the last step's drafts past max_new_tokens are counted by the server, not by the output."""
    from specdiag.steps.commit_probe import probe as cp

    events = _decode_recorded("raw-mla-ngram", "generate_stream_novel_1024")
    trace = assemble_stream([(0.01 * i, ev) for i, ev in enumerate(events)], "http://h200", 0.0, 1.0)
    request = {"context_tokens": 1024, "kind": "novel", "seed": 0, "max_new_tokens": 32}
    row = cp.probe_row(trace, request, 8)
    assert trace.spec.num_correct_drafts == 16 and row["verify_steps"] == 19 and row["completion_tokens"] == 32
    assert row["commit_length"] == pytest.approx(31 / 19)
    assert row["accepted_drafts"] == pytest.approx(31 / 19 - 1)  # not 16 / 19
    assert row["proposed_drafts"] == 7


def test_probe_summary_of_the_recorded_h200_rows_is_consistent() -> None:
    """The commit_probe rows recorded on the H200 hold accepted_drafts = num_correct_drafts / steps (56 / 11 = 5.09
    for predictable 1,024 tokens); 04's summary reports commit - 1 = 63 / 11 - 1 instead, consistent with the
    commit length it shows."""
    from specdiag.steps.commit_probe import probe as cp
    from specdiag.runs import Run

    rows = Run.open(ROOT / "data/reference/sglang-h200-tiny-standalone").rows(cp.PROBE_TABLE)
    raw = next(r for r in rows if r["kind"] == "predictable" and r["context_tokens"] == 1024)
    assert raw["accepted_drafts"] == pytest.approx(56 / 11) and raw["commit_length"] == pytest.approx(63 / 11)
    summary = {(s["kind"], s["context_tokens"]): s for s in cp.summarize(rows)}
    s = summary["predictable", 1024]
    assert s["commit_length"] == pytest.approx(63 / 11) and s["accepted_drafts"] == pytest.approx(63 / 11 - 1)


def test_redaction_keeps_sglang_0517_numbers_and_still_hides_keys() -> None:
    """The recorder's redaction hid two numbers of 0.5.17's answers (their key holds 'token'): the recorded
    files show REDACTED; the same keys now pass, while api_key-like keys are still hidden."""
    from specdiag.serving.redaction import REDACTED, redact

    info = json.loads((DATA / "raw-tiny-standalone" / "server_info.json").read_text())
    model = json.loads((DATA / "raw-tiny-standalone" / "model_info.json").read_text())
    assert info["tbo_token_distribution_threshold"] == REDACTED  # as recorded, before the fix
    assert model["embedding"]["bcg"]["capture_token_budget"] == REDACTED
    # The real values, from the server log's ServerArgs line: tbo_token_distribution_threshold=0.48.
    log = (ROOT / "data/reference/sglang-h200-tiny-standalone/server.log").read_text()
    assert "tbo_token_distribution_threshold=0.48" in log
    out = redact({"tbo_token_distribution_threshold": 0.48, "bcg": {"capture_token_budget": 8192},
                  "api_key": "abc", "admin_api_key": "def", "ssl_keyfile_password": "ghi", "hf_token": "jkl"})
    assert out["tbo_token_distribution_threshold"] == 0.48 and out["bcg"]["capture_token_budget"] == 8192
    assert out["api_key"] == out["admin_api_key"] == out["ssl_keyfile_password"] == out["hf_token"] == REDACTED
