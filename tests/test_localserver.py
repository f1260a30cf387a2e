"""The embedded server's HTTP API (FastAPI TestClient, tiny random models): SGLang's field names,
the 400s, the SSE stream (one chunk per verify step, cumulative or incremental), /metrics."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterator

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("fastapi")

from fastapi.testclient import TestClient  # noqa: E402

from specdiag.localserver.app import build_app  # noqa: E402
from specdiag.localserver.config import parse_args  # noqa: E402
from specdiag.localserver.protocol import SGLANG_SAMPLING_KEYS  # noqa: E402
from specdiag.localserver.runtime import Runtime  # noqa: E402
from specdiag.localserver.tiny import cached_tiny_models  # noqa: E402

CONTEXT = 256


def make_client(*extra: str, algorithm: str = "STANDALONE") -> TestClient:
    paths = cached_tiny_models()
    args = ["--model-path", str(paths.clone_target), "--speculative-algorithm", algorithm,
            "--speculative-num-draft-tokens", "4", "--device", "cpu", "--context-length", str(CONTEXT), *extra]
    if algorithm == "STANDALONE":
        args += ["--speculative-draft-model-path", str(paths.clone_drafter)]
    return TestClient(build_app(Runtime(parse_args(args))))


@pytest.fixture(scope="module", autouse=True)
def restore_torch_threads() -> Iterator[None]:
    """The server sets torch to one CPU thread (--cpu-threads 1); give later tests the old setting back."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def client() -> Iterator[TestClient]:
    with make_client() as c:
        yield c


def sse_items(client: TestClient, body: dict[str, Any]) -> tuple[list[Any], str]:
    """The decoded ``data:`` items of a streamed /generate and the raw text."""
    with client.stream("POST", "/generate", json=body) as resp:
        assert resp.status_code == 200
        assert resp.headers["content-type"].startswith("text/event-stream")
        raw = "".join(resp.iter_text())
    blocks = raw.split("\n\n")
    assert blocks[-1] == "" and all(b.startswith("data: ") for b in blocks[:-1]), raw[:300]
    items = [b[len("data: "):] for b in blocks[:-1]]
    assert items[-1] == "[DONE]"
    return [json.loads(x) for x in items[:-1]], raw


PROMPT = "The cat sat on the mat. The cat sat on the mat."


def test_server_info_has_sglang_flat_keys(client):
    info = client.get("/server_info").json()
    for key in ("attention_backend", "page_size", "speculative_algorithm", "speculative_num_draft_tokens",
                "speculative_num_steps", "speculative_eagle_topk", "speculative_draft_model_path",
                "context_length", "tp_size", "kv_cache_dtype", "model_path", "stream_interval",
                "incremental_streaming_output", "device", "launch_command", "version", "internal_states"):
        assert key in info, key
    assert info["attention_backend"] == "torch_sdpa" and info["page_size"] == 1
    assert info["speculative_algorithm"] == "STANDALONE" and info["speculative_num_draft_tokens"] == 4
    assert info["speculative_num_steps"] == 3 and info["speculative_eagle_topk"] == 1
    assert info["context_length"] == CONTEXT and info["device"] == "cpu"
    assert info["speculative_draft_model_config"]["sliding_window"] == 24
    assert info["kv_alloc"] == "sglang" and info["internal_states"][0]["kv_pool"]["allocator"] == "sglang"
    state = info["internal_states"][0]
    assert "avg_spec_accept_length" in state and "last_gen_throughput" in state
    assert client.get("/get_server_info").json()["model_path"] == info["model_path"]


def test_model_info_health_tokenize_models(client):
    mi = client.get("/model_info").json()
    for key in ("model_path", "served_model_name", "tokenizer_path", "is_generation", "architectures", "model_type"):
        assert key in mi
    assert mi["architectures"] == ["Qwen3ForCausalLM"] and mi["is_generation"] is True
    assert client.get("/get_model_info").json() == mi
    assert client.get("/health").status_code == 200 and client.get("/health_generate").status_code == 200
    tok = client.post("/tokenize", json={"text": PROMPT}).json()
    assert tok["count"] == len(tok["tokens"]) > 5 and tok["max_model_len"] == CONTEXT
    assert client.post("/tokenize", json={"prompt": PROMPT}).json()["tokens"] == tok["tokens"]
    assert client.post("/detokenize", json={"tokens": tok["tokens"]}).json()["text"] == PROMPT
    card = client.get("/v1/models").json()["data"][0]
    assert card["id"] == mi["served_model_name"] and card["max_model_len"] == CONTEXT


def test_non_stream_generate_has_sglang_meta_info(client):
    body = {"text": PROMPT, "sampling_params": {"max_new_tokens": 17, "temperature": 0}}
    out = client.post("/generate", json=body).json()
    meta = out["meta_info"]
    assert len(out["output_ids"]) == meta["completion_tokens"] == 17
    assert isinstance(out["text"], str)
    assert meta["finish_reason"] == {"type": "length", "length": 17}
    assert meta["prompt_tokens"] == client.post("/tokenize", json={"text": PROMPT}).json()["count"]
    assert meta["cached_tokens"] == 0 and meta["e2e_latency"] > 0 and meta["id"]
    ct = meta["spec_verify_ct"]
    assert ct == len(meta["spec_step_commit_lengths"]) == len(meta["spec_step_draft_ms"]) == len(meta["spec_step_verify_ms"])
    assert sum(meta["spec_step_commit_lengths"]) == 16
    assert meta["spec_accept_length"] == pytest.approx(17 / ct)
    assert meta["spec_num_proposed_drafts"] == ct * 3
    assert sum(meta["spec_correct_drafts_histogram"]) == ct and len(meta["spec_correct_drafts_histogram"]) == 4
    assert meta["spec_accept_rate"] == pytest.approx(meta["spec_num_correct_drafts"] / (ct * 3))
    # the same ids whether the prompt came as text or input_ids, and with PUT
    ids = client.post("/tokenize", json={"text": PROMPT}).json()["tokens"]
    again = client.put("/generate", json={"input_ids": ids, "sampling_params": {"max_new_tokens": 17}}).json()
    assert again["output_ids"] == out["output_ids"]


def test_stream_is_cumulative_with_one_chunk_per_verify_step(client):
    body = {"text": PROMPT, "stream": True, "sampling_params": {"max_new_tokens": 20, "temperature": 0}}
    items, _ = sse_items(client, body)
    final = items[-1]["meta_info"]
    assert all(i["meta_info"]["finish_reason"] is None for i in items[:-1])
    assert final["finish_reason"] == {"type": "length", "length": 20}
    assert len(items) == 1 + final["spec_verify_ct"]  # the prefill's first token, then one per step
    completions = [i["meta_info"]["completion_tokens"] for i in items]
    assert completions[0] == 1
    assert [b - a for a, b in zip(completions, completions[1:])] == final["spec_step_commit_lengths"]
    for item in items:  # cumulative: output_ids and text grow from the start
        assert len(item["output_ids"]) == item["meta_info"]["completion_tokens"]
    assert items[-1]["output_ids"][: len(items[1]["output_ids"])] == items[1]["output_ids"]
    assert "e2e_latency" in final and "e2e_latency" not in items[0]["meta_info"]


def test_incremental_streaming_sends_deltas():
    with make_client("--incremental-streaming-output") as c:
        assert c.get("/server_info").json()["incremental_streaming_output"] is True
        body = {"text": PROMPT, "stream": True, "sampling_params": {"max_new_tokens": 12}}
        items, _ = sse_items(c, body)
        full = c.post("/generate", json={**body, "stream": False}).json()
    assert [t for i in items for t in i["output_ids"]] == full["output_ids"]
    assert "".join(i["text"] for i in items) == full["text"]
    assert all(len(i["output_ids"]) >= 1 for i in items)


def test_stream_interval_groups_tokens(client):
    body = {"text": PROMPT, "stream": True, "sampling_params": {"max_new_tokens": 20, "stream_interval": 8}}
    items, _ = sse_items(client, body)
    counts = [i["meta_info"]["completion_tokens"] for i in items]
    assert all(b - a >= 8 for a, b in zip([0, *counts[:-2]], counts[:-1])) and counts[-1] == 20


def error_of(resp) -> str:
    assert resp.status_code == 400, resp.text
    err = resp.json()["error"]
    assert err["type"] == "invalid_request_error" and err["code"] == 400
    return err["message"]


def test_unknown_sampling_param_is_a_400_naming_it(client):
    msg = error_of(client.post("/generate", json={"text": "x", "sampling_params": {"max_new_tokenz": 3}}))
    assert "max_new_tokenz" in msg and "unknown field" in msg
    # top-level unknown keys are ignored, as SGLang does
    ok = client.post("/generate", json={"text": "x", "whatever": 1, "sampling_params": {"max_new_tokens": 2}})
    assert ok.status_code == 200


def test_unsupported_sampling_is_refused_clearly(client):
    assert "greedily" in error_of(client.post("/generate", json={"text": "x", "sampling_params": {"temperature": 0.7}}))
    assert "top_p" in error_of(client.post("/generate", json={"text": "x", "sampling_params": {"top_p": 0.9}}))
    assert "stop" in error_of(client.post("/generate", json={"text": "x", "sampling_params": {"stop": ["."]}}))
    assert "max_new_tokens" in error_of(client.post("/generate", json={"text": "x", "sampling_params": {"max_new_tokens": -1}}))
    assert "exactly one" in error_of(client.post("/generate", json={"sampling_params": {}}))
    assert "batch" in error_of(client.post("/generate", json={"text": ["a", "b"]}))
    # SGLang's neutral defaults are accepted
    neutral = {"temperature": 0, "top_p": 1.0, "top_k": -1, "min_p": 0.0, "repetition_penalty": 1.0, "n": 1,
               "max_new_tokens": 2, "ignore_eos": True, "skip_special_tokens": True}
    assert set(neutral) <= SGLANG_SAMPLING_KEYS
    assert client.post("/generate", json={"text": "x", "sampling_params": neutral}).status_code == 200


def test_prompts_beyond_the_context_are_a_400(client):
    too_long = list(range(1, CONTEXT + 1))
    assert "context length" in error_of(client.post("/generate", json={"input_ids": too_long}))
    fits = list(range(1, CONTEXT - 10))
    msg = error_of(client.post("/generate", json={"input_ids": fits, "sampling_params": {"max_new_tokens": 20}}))
    assert "max_new_tokens" in msg and str(CONTEXT) in msg
    assert error_of(client.post("/generate", json={"input_ids": [10**6]})).startswith("input_ids contains ids")


def test_flush_cache_and_metrics(client):
    client.post("/generate", json={"text": PROMPT, "sampling_params": {"max_new_tokens": 9}})
    state = client.get("/server_info").json()["internal_states"][0]
    assert state["avg_spec_accept_length"] > 0 and state["last_gen_throughput"] > 0
    text = client.get("/metrics").text
    for name in ("sglang:prompt_tokens_total", "sglang:generation_tokens_total", "sglang:spec_verify_calls_total",
                 "sglang:num_requests_total", "sglang:context_len", "sglang:page_size",
                 "sglang:time_to_first_token_seconds_bucket", "sglang:e2e_request_latency_seconds_count"):
        assert name in text, name
    before = _value(text, "sglang:generation_tokens_total")
    client.post("/generate", json={"text": PROMPT, "sampling_params": {"max_new_tokens": 9}})
    assert _value(client.get("/metrics").text, "sglang:generation_tokens_total") == before + 9
    resp = client.post("/flush_cache")
    assert resp.status_code == 200 and resp.text.startswith("Cache flushed")
    assert client.get("/server_info").json()["internal_states"][0]["avg_spec_accept_length"] == 0.0


def _value(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} not in /metrics")


def test_none_algorithm_sends_no_spec_fields():
    with make_client(algorithm="NONE") as c:
        info = c.get("/server_info").json()
        assert info["speculative_algorithm"] is None and "avg_spec_accept_length" not in info["internal_states"][0]
        meta = c.post("/generate", json={"text": PROMPT, "sampling_params": {"max_new_tokens": 5}}).json()["meta_info"]
    assert meta["completion_tokens"] == 5 and not any(k.startswith("spec_") for k in meta)


def test_prefix_cache_is_off_by_default_and_reports_what_it_reused():
    """Without --enable-prefix-cache nothing is reused (disable_radix_cache, 10's filler needs it); with it the same
    prompt again is served from the cache (meta_info.cached_tokens, the metric), and /flush_cache empties it."""
    with make_client(algorithm="NGRAM") as c:
        assert c.get("/server_info").json()["disable_radix_cache"] is True
        body = {"text": PROMPT * 4, "sampling_params": {"max_new_tokens": 6}}
        c.post("/generate", json=body)
        assert c.post("/generate", json=body).json()["meta_info"]["cached_tokens"] == 0
    with make_client("--enable-prefix-cache", algorithm="NGRAM") as c:
        info = c.get("/server_info").json()
        assert info["disable_radix_cache"] is False and info["prefix_cache"]
        first = c.post("/generate", json=body).json()
        again = c.post("/generate", json=body).json()
        n = first["meta_info"]["prompt_tokens"]
        assert first["meta_info"]["cached_tokens"] == 0 and again["meta_info"]["cached_tokens"] == n - 1
        assert again["output_ids"] == first["output_ids"]
        assert _value(c.get("/metrics").text, "sglang:cached_tokens_total") == n - 1
        assert c.post("/flush_cache").status_code == 200
        assert c.post("/generate", json=body).json()["meta_info"]["cached_tokens"] == 0


def test_ngram_server_reports_its_algorithm_and_kv_allocator():
    with make_client("--kv-alloc", "contiguous", algorithm="NGRAM") as c:
        info = c.get("/server_info").json()
        assert info["speculative_algorithm"] == "NGRAM" and info["speculative_draft_model_path"] is None
        assert info["kv_alloc"] == "contiguous" and info["internal_states"][0]["kv_pool"]["allocator"] == "contiguous"
        ids = c.post("/tokenize", json={"text": PROMPT * 4}).json()["tokens"]
        meta = c.post("/generate", json={"input_ids": ids, "sampling_params": {"max_new_tokens": 12}}).json()["meta_info"]
    assert meta["spec_verify_ct"] >= 1 and sum(meta["spec_step_commit_lengths"]) == 11


def test_cli_errors_when_the_model_is_missing(tmp_path: Path):
    import subprocess
    import sys

    missing = tmp_path / "no-such-model"
    proc = subprocess.run([sys.executable, "-m", "specdiag.localserver", "--model-path", str(missing), "--port", "0"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert f"no model at {missing}" in proc.stderr and "--model-path" in proc.stderr


def test_stream_never_splits_a_utf8_character(monkeypatch):
    """A character whose bytes come in two steps is held back until complete (no U+FFFD in chunks)."""
    from specdiag.localserver.engine import Chunk, StepStats

    with make_client("--incremental-streaming-output") as c:
        runtime = c.app.state.runtime
        tok = runtime.tokenizer
        first, second = tok.convert_tokens_to_ids(["Ã", "©"])  # byte-level BPE: "é" is C3 A9
        assert tok.decode([first, second]) == "é"
        step = StepStats(committed=1, correct_drafts=0, proposed_drafts=3, draft_ms=1.0, verify_ms=1.0, drafter_tokens=0)

        def fake_generate(req, should_abort=lambda: False):
            yield Chunk([first], prefill_ms=1.0)
            yield Chunk([second], step=step)
            yield Chunk([first], step=step)
            yield Chunk([second], step=step, finish={"type": "length", "length": 4})

        monkeypatch.setattr(runtime.engine, "generate", fake_generate)
        items, _ = sse_items(c, {"input_ids": [5, 6], "stream": True, "sampling_params": {"max_new_tokens": 4}})
    texts = [i["text"] for i in items]
    assert "".join(texts) == "éé" and not any("\ufffd" in t for t in texts)
    assert [i["output_ids"] for i in items] == [[first], [second], [first], [second]]
