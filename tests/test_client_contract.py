"""Contract tests: SGLangClient against a local server that answers in SGLang's format.

The replay server (tests/sglang_replay_server.py) streams a canned answer of 10 tokens in chunks of
1 (prefill), 3, 2 and 4 tokens, CHUNK_DELAY_S apart, with SGLang's meta_info; scenarios are
picked by the prompt text.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from collections.abc import Iterator

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from sglang_replay_server import CHUNK_DELAY_S, PROMPT_TOKENS, ReplayServer, tokenize  # noqa: E402

from specdiag.speculation import commit, scrapes  # noqa: E402
from specdiag.serving import (  # noqa: E402
    CLIENTS,
    RequestTrace,
    ServerHTTPError,
    ServerUnreachable,
    SGLangClient,
    make_client,
)

API_KEY = "sk-specdiag-test-SECRET-0123456789"
FULL_IDS = list(range(101, 111))
FULL_TEXT = "".join(f"w{i} " for i in FULL_IDS)



def last_generate(server):
    """The last /generate request the replay server got (the client scrapes /metrics around each)."""
    return [r for r in server.requests if r.path == "/generate"][-1]

@pytest.fixture(scope="module")
def server() -> Iterator[ReplayServer]:
    with ReplayServer() as srv:
        yield srv


@pytest.fixture()
def client(server: ReplayServer) -> SGLangClient:
    return SGLangClient(server.url, api_key=API_KEY, timeout_s=5.0)


def assert_no_secret(*things: object) -> None:
    for thing in things:
        assert API_KEY not in repr(thing) and API_KEY not in str(thing)


def assert_full_answer(trace: RequestTrace) -> None:
    assert trace.error is None, trace.error
    assert trace.output_ids == FULL_IDS
    assert trace.text == FULL_TEXT
    assert trace.chunk_tokens == [1, 3, 2, 4]
    assert trace.completion_tokens == 10 and trace.prompt_tokens == PROMPT_TOKENS
    assert trace.finish_reason == {"type": "length", "length": 10}
    assert trace.spec is not None
    assert (trace.spec.verify_ct, trace.spec.num_correct_drafts, trace.spec.num_proposed_drafts) == (3, 6, 21)
    assert commit.commit_length_from_meta(trace.meta_info) == pytest.approx(3.0)  # (10 - 1) / 3


def test_registry_names_the_sglang_client() -> None:
    assert CLIENTS["sglang"] is SGLangClient
    assert isinstance(make_client("http://127.0.0.1:9", "SGLang"), SGLangClient)
    assert isinstance(make_client("http://127.0.0.1:9", "embedded"), SGLangClient)
    with pytest.raises(ValueError, match="'tgi' is not supported; choose 'auto' or one of \\['sglang', 'vllm'\\]"):
        make_client("http://127.0.0.1:9", "tgi")


def assert_timestamped_as_sent(trace: RequestTrace) -> None:
    """The server sends the 4 chunks CHUNK_DELAY_S apart: a client that buffered the body would
    stamp them all at once. (A span check, not a per-gap one, so a busy CI machine that reads two
    chunks in one go does not fail it.)"""
    assert len(trace.chunk_t_s) == 4
    assert trace.chunk_t_s == sorted(trace.chunk_t_s)
    span = trace.chunk_t_s[-1] - trace.chunk_t_s[0]
    assert span >= 0.6 * 3 * CHUNK_DELAY_S, trace.chunk_t_s


@pytest.mark.parametrize("scenario", ["cumulative", "incremental"])
def test_stream_trace(client: SGLangClient, server: ReplayServer, scenario: str) -> None:
    before = time.time()
    trace = client.generate(text=scenario, sampling_params={"max_new_tokens": 10, "temperature": 0})
    assert_full_answer(trace)
    assert trace.stream_mode == scenario
    assert trace.url == f"{server.url}/generate"
    assert before <= trace.t_send_unix_s <= time.time()
    # one client timestamp per chunk, taken as it arrived (not when the body ended)
    assert_timestamped_as_sent(trace)
    assert trace.ttft_s == trace.chunk_t_s[0]
    assert trace.e2e_s is not None and trace.e2e_s >= trace.chunk_t_s[-1]
    assert trace.spec.correct_drafts_histogram == [0, 1, 1, 1, 0, 0, 0, 0]
    sent = last_generate(server)
    assert sent.path == "/generate"
    assert sent.body == {"text": scenario, "sampling_params": {"max_new_tokens": 10, "temperature": 0}, "stream": True}
    assert sent.headers["Authorization"] == f"Bearer {API_KEY}"
    assert_no_secret(trace, client)


def test_stream_input_ids_and_extra_body(client: SGLangClient, server: ReplayServer) -> None:
    trace = client.generate(input_ids=[1, 2, 3], extra_body={"rid": "abc"})
    assert_full_answer(trace)
    assert last_generate(server).body == {"input_ids": [1, 2, 3], "stream": True, "rid": "abc"}


def test_close_delimited_stream_is_timestamped_per_chunk(client: SGLangClient) -> None:
    # An HTTP/1.0-style body (no chunked encoding) must not be buffered until the socket closes.
    trace = client.generate(text="close_delimited")
    assert_full_answer(trace)
    assert_timestamped_as_sent(trace)


@pytest.mark.parametrize("scenario", ["old_names", "oldest_names"])
def test_older_spec_field_names(client: SGLangClient, scenario: str) -> None:
    trace = client.generate(text=scenario)
    assert_full_answer(trace)
    hist = trace.spec.correct_drafts_histogram
    assert hist == ([0, 1, 1, 1, 0, 0, 0, 0] if scenario == "old_names" else None)


def test_embedded_server_step_extras(client: SGLangClient) -> None:
    trace = client.generate(text="embedded")
    assert_full_answer(trace)
    assert trace.spec.step_commit_lengths == [3, 2, 4]
    assert trace.spec.step_draft_ms == [1.5, 1.5, 1.5]
    assert trace.spec.step_verify_ms == [4.25, 4.25, 4.25]
    assert commit.step_commit_stats(trace.spec.step_commit_lengths).mean == pytest.approx(3.0)


def test_non_stream(client: SGLangClient, server: ReplayServer) -> None:
    trace = client.generate(text="cumulative", stream=False)
    assert trace.error is None and trace.output_ids == FULL_IDS and trace.text == FULL_TEXT
    assert trace.completion_tokens == 10 and trace.spec is not None and trace.spec.verify_ct == 3
    assert trace.ttft_s is None and trace.chunk_t_s == [] and trace.e2e_s is not None
    assert last_generate(server).body["stream"] is False


def test_stream_request_answered_with_one_json_body(client: SGLangClient) -> None:
    trace = client.generate(text="json_body", stream=True)
    assert trace.error is None and trace.output_ids == FULL_IDS and trace.completion_tokens == 10
    assert trace.ttft_s is None and trace.chunk_t_s == []  # no per-chunk timing to report


def test_error_chunk_keeps_chunks_and_names_url(client: SGLangClient, server: ReplayServer) -> None:
    trace = client.generate(text="error_chunk")
    assert trace.error_kind == "stream"
    assert f"{server.url}/generate" in trace.error
    assert "the scheduler raised during decode" in trace.error
    assert trace.chunk_tokens == [1, 3] and trace.output_ids == FULL_IDS[:4]
    assert_no_secret(trace)


@pytest.mark.parametrize("scenario", ["drop", "no_done"])
def test_dropped_stream_keeps_chunks_and_names_url(client: SGLangClient, server: ReplayServer, scenario: str) -> None:
    trace = client.generate(text=scenario)
    assert trace.error_kind == "stream"
    assert f"{server.url}/generate" in trace.error
    assert "before [DONE]" in trace.error and "after 2 chunks" in trace.error
    assert trace.chunk_tokens == [1, 3] and trace.completion_tokens == 4
    assert trace.e2e_s is not None
    assert_no_secret(trace)


def test_hangup_without_answer_names_url(client: SGLangClient, server: ReplayServer) -> None:
    trace = client.generate(text="hangup")
    assert trace.error_kind == "stream"
    assert trace.error == (
        f"stream from {server.url}/generate failed: connection closed before an answer "
        "(the server closed the connection without answering)"
    )


def test_http_400_with_sglang_error_body(client: SGLangClient, server: ReplayServer) -> None:
    trace = client.generate(text="http400", sampling_params={"max_tokens": 3})
    assert trace.error_kind == "http"
    assert trace.error == (
        f"{server.url}/generate answered HTTP 400: Unknown sampling_params key(s): ['max_tokens']. Use max_new_tokens."
    )
    assert trace.chunk_t_s == [] and trace.output_ids == []
    assert_no_secret(trace)


def test_http_422_with_fastapi_detail(client: SGLangClient, server: ReplayServer) -> None:
    trace = client.generate(text="http422")
    assert trace.error == f"{server.url}/generate answered HTTP 422: body.input_ids: value is not a valid list"


def test_abort_finish_reason_is_an_error(client: SGLangClient) -> None:
    trace = client.generate(text="abort")
    assert trace.error_kind == "aborted"
    assert "KV cache pool is full" in trace.error and "/generate" in trace.error
    assert trace.output_ids == FULL_IDS  # what arrived is kept


def test_timeout_before_any_answer(server: ReplayServer) -> None:
    client = SGLangClient(server.url, timeout_s=0.5)
    t0 = time.perf_counter()
    trace = client.generate(text="slow")
    assert time.perf_counter() - t0 < 2.0
    assert trace.error_kind == "timeout"
    assert f"{server.url}/generate" in trace.error and "0.5 s" in trace.error


def test_timeout_mid_stream_keeps_first_chunk(server: ReplayServer) -> None:
    client = SGLangClient(server.url, timeout_s=0.5)
    trace = client.generate(text="stall")
    assert trace.error_kind == "timeout"
    assert f"{server.url}/generate" in trace.error and "after 1 chunks" in trace.error
    assert trace.chunk_tokens == [1] and trace.output_ids == [101]


def test_server_info_falls_back_to_get_server_info(client: SGLangClient, server: ReplayServer) -> None:
    n = len(server.requests)
    info = client.server_info()
    assert info["speculative_algorithm"] == "STANDALONE" and info["speculative_num_draft_tokens"] == 8
    assert [r.path for r in server.requests[n:]] == ["/server_info", "/get_server_info"]


def test_info_and_control_endpoints(client: SGLangClient, server: ReplayServer) -> None:
    assert client.model_info()["architectures"] == ["ReplayForCausalLM"]
    assert client.health() is True
    n = len(server.requests)
    assert client.flush_cache() is True
    assert [(r.method, r.path) for r in server.requests[n:]] == [("POST", "/flush_cache"), ("GET", "/flush_cache")]
    assert client.tokenize("The cat sat") == tokenize("The cat sat")
    assert server.requests[-1].body["prompt"] == "The cat sat"
    assert server.requests[-1].body["add_special_tokens"] is False
    text = client.metrics_text()
    assert text is not None
    scrape = scrapes.parse_prometheus(text)
    assert scrapes.sglang_commit_length_from_scrapes({}, scrape) == pytest.approx(10 / 3)
    client.check_reachable()  # answers: no exception


def test_missing_endpoints(server: ReplayServer) -> None:
    client = SGLangClient(server.url + "/prefix")
    with pytest.raises(ServerHTTPError) as info:
        client.server_info()
    assert info.value.status == 404
    assert info.value.url == f"{server.url}/prefix/get_server_info"
    assert str(info.value) == f"{server.url}/prefix/get_server_info answered HTTP 404: Not Found"
    assert client.metrics_text() is None
    assert client.health() is False
    client.check_reachable()  # an HTTP answer, even 404, means the server is there


def test_connection_refused_fails_fast_and_names_url() -> None:
    client = SGLangClient("http://127.0.0.1:9", api_key=API_KEY)
    for call, path in [
        (client.check_reachable, "/health"),
        (lambda: client.generate(text="hi"), "/generate"),
        (client.server_info, "/server_info"),
    ]:
        t0 = time.perf_counter()
        with pytest.raises(ServerUnreachable) as info:
            call()
        assert time.perf_counter() - t0 < 2.0
        assert info.value.url == f"http://127.0.0.1:9{path}"
        assert f"http://127.0.0.1:9{path}" in str(info.value)
        assert "connection refused" in str(info.value)
        assert_no_secret(info.value, client)


def test_bad_input_is_refused_before_sending() -> None:
    with pytest.raises(ValueError, match="http://"):
        SGLangClient("127.0.0.1:30000")
    client = SGLangClient("http://127.0.0.1:9")
    with pytest.raises(ValueError, match="exactly one"):
        client.generate()
    with pytest.raises(ValueError, match="exactly one"):
        client.generate(text="a", input_ids=[1])


def test_api_key_not_in_repr() -> None:
    client = SGLangClient("http://127.0.0.1:9", api_key=API_KEY)
    assert "REDACTED" in repr(client)
    assert_no_secret(client)


# --- against the real embedded server ----------------------------------------------------------


@pytest.fixture(scope="module")
def live_server_url(request: pytest.FixtureRequest) -> Iterator[str]:
    """The session's embedded server when the trained models are there, else one on tiny models."""
    from specdiag.paths import PROJECT_ROOT

    if (PROJECT_ROOT / "data" / "models" / "target").exists():
        yield request.getfixturevalue("embedded_server").url
        return
    from specdiag.localserver import EmbeddedServer
    from specdiag.localserver.tiny import cached_tiny_models

    tiny = cached_tiny_models()
    with EmbeddedServer("STANDALONE", 8, device="cpu", model_path=tiny.clone_target,
                        draft_model_path=tiny.clone_drafter) as srv:
        yield srv.url


@pytest.mark.slow
def test_embedded_server_traces_are_self_consistent(live_server_url: str) -> None:
    """Client and embedded server agree: tokens per chunk, per-step commits and the formulas."""
    client = SGLangClient(live_server_url, timeout_s=120)
    client.check_reachable()
    info = client.server_info()
    assert info["speculative_algorithm"] == "STANDALONE"
    ids = client.tokenize("The cat sat on the mat. " * 8)
    sampling = {"max_new_tokens": 24, "temperature": 0, "ignore_eos": True}
    trace = client.generate(input_ids=ids, sampling_params=sampling)
    assert trace.error is None, trace.error
    assert trace.prompt_tokens == len(ids)
    assert trace.completion_tokens == 24 == len(trace.output_ids) == sum(trace.chunk_tokens)
    assert trace.stream_mode == ("incremental" if info.get("incremental_streaming_output") else "cumulative")
    assert trace.chunk_t_s == sorted(trace.chunk_t_s) and trace.ttft_s == trace.chunk_t_s[0]
    steps = trace.spec.step_commit_lengths if trace.spec else None
    assert steps and trace.spec is not None
    assert trace.spec.verify_ct == len(steps) and sum(steps) == trace.completion_tokens - 1
    assert commit.commit_length_from_meta(trace.meta_info) == pytest.approx(sum(steps) / len(steps))
    hist = trace.spec.correct_drafts_histogram
    assert hist is not None and commit.commit_length_from_histogram(hist) == pytest.approx(sum(steps) / len(steps))
    whole = client.generate(input_ids=ids, sampling_params=sampling, stream=False)
    assert whole.error is None and whole.output_ids == trace.output_ids and whole.text == trace.text
    bad = client.generate(input_ids=ids, sampling_params={"max_tokens": 3})
    assert bad.error_kind == "http" and f"{live_server_url}/generate answered HTTP 400" in (bad.error or "")
