"""09_engine_ab executed: replaying the H200 61-layer run (what the page shows, what it says the run lacks), and
live against two embedded arms started one after another (a tiny ladder)."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

from specdiag.paths import REFERENCE_DIR
from specdiag.runs import Run

REF = "data/reference/sglang-h200-mla61-engine-ab"


def _result(tmp_path: Path) -> dict:
    return json.loads((tmp_path / "run" / "findings" / "09_engine_ab.json").read_text())


@pytest.mark.notebook
def test_09_replays_the_61_layer_run_and_says_what_it_lacks(run_notebook, tmp_path) -> None:
    out = run_notebook("09_engine_ab")
    res = _result(tmp_path)
    assert res["recorded_from"] == REF  # no parameter: the reference run, kept apart by 07
    m = res["metrics"]
    rows = Run.open(REFERENCE_DIR / "sglang-h200-mla61-engine-ab").rows("engine_ab")
    for ctx in (1024, 16384, 65536, 131072):  # FlashInfer's medians, from the rows
        samples = [r["step_ms"] for r in rows if r["arm"] == "flashinfer" and r["phase"] == "decode"
                   and r["context_tokens"] == ctx]
        assert m["step_ms"]["flashinfer"][str(ctx)] == pytest.approx(statistics.median(samples))
    assert set(m["step_ms"]) == {"flashinfer"}  # the other arms have no decode rows
    assert m["ttft_own"]["triton"] == {"1024": False, "16384": False, "65536": False}
    assert {t["status"] for t in m["targets"].values()} == {"not measurable"}
    assert "not its own" in m["targets"]["best_ttft_64k_vs_triton"]["why"]
    assert "no decode rows of triton, triton_plugin at 128k" in m["targets"]["plugin_vs_triton_128k"]["why"]
    ids = {f["id"] for f in res["findings"]}
    assert "engine_ab.decode_fix" not in ids and "engine_ab.prefill_fix" not in ids  # nothing measured side by side
    page = out.read_text()
    assert "triton: no decode row" in page and "concurrent 2" in page and "not a clean decode" in page
    assert "not measurable" in page and "x its floor" in page and "NVIDIA H200" in page
    assert "recorded run" in page and ">nan<" not in page.lower()


@pytest.mark.notebook
def test_09_measures_two_embedded_arms_one_after_another(run_notebook, tmp_path) -> None:
    out = run_notebook("09_engine_ab", engine_configs="ngram=embedded:NGRAM:4,plain=embedded:NONE",
                       context_lengths=[128, 256], repeats=2, max_new_tokens=8, memory_bandwidth_gb_s=20.0,
                       matmul_tflops=1.0)
    res = _result(tmp_path)
    assert "recorded_from" not in res
    m = res["metrics"]
    assert m["arms"] == ["ngram", "plain"]
    assert m["decode_requests"] == {"ngram": {"128": 2, "256": 2}, "plain": {"128": 2, "256": 2}}
    assert all(own for arm in m["ttft_own"].values() for own in arm.values())  # one arm at a time: every TTFT its own
    assert all(x > 0 for arm in m["ttft_over_floor_x"].values() for x in arm.values())
    meta = Run.open(tmp_path / "run").meta
    assert meta["arms"]["ngram"]["command"][-4:] == ["--speculative-num-draft-tokens", "4", "--device", "auto"]
    assert meta["arms"]["plain"]["server"]["speculative_algorithm"] in (None, "NONE")
    assert meta["hardware"]["memory_bandwidth_source"] == "parameter"
    page = out.read_text()
    assert "2 arms measured: ngram, plain" in page
    assert "indistinguishable" in page  # 2 requests against 2: the rank test cannot tell them apart, and says so


@pytest.mark.notebook
def test_09_measures_live_servers_named_by_url(run_notebook, tmp_path, embedded_server) -> None:
    """servers: running servers, measured one after another; no command recorded (started elsewhere), their server
    info is (the same server twice here: two names, one URL, is a valid if dull A/B)."""
    url = embedded_server.url
    run_notebook("09_engine_ab", servers=f"first={url},second={url}", context_lengths=[128], repeats=2,
                 max_new_tokens=4, memory_bandwidth_gb_s=20.0, matmul_tflops=1.0)
    res = _result(tmp_path)
    assert res["metrics"]["arms"] == ["first", "second"] and "recorded_from" not in res
    meta = Run.open(tmp_path / "run").meta
    assert meta["arms"]["first"]["command"] is None and meta["arms"]["first"]["url"] == url
    assert meta["arms"]["second"]["server"]["speculative_algorithm"] == "STANDALONE"
