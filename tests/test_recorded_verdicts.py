"""The verdicts 09 and 10 give on two recorded H200 runs, computed from their rows with the notebooks' calls
(tests/recorded_verdicts.py, no papermill), and the notebooks themselves saying the same (slow)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from recorded_verdicts import judge_09, judge_10

K1, K16, K64, K128 = 1024, 16384, 65536, 131072
DFLASH, TIER0 = "sglang-h200-mla61-dflash", "sglang-h200-kv-tier0"


@pytest.fixture(scope="module")
def dflash():
    return judge_09(DFLASH)


@pytest.fixture(scope="module")
def tier0():
    return judge_10(TIER0)


def test_dflash_the_plugin_clears_stock_by_its_interval_and_the_spread_between_servers(dflash) -> None:
    """165x at 128k: stock (part 2) and the plugin (part 3) ran on different lent machines, so the interval must also
    clear the spread between servers (none measured at 128k: the run's largest, the plugin's four servers at 1k)."""
    from specdiag.steps.engine_ab import analysis

    spreads = analysis.step_spreads(dflash.dec)
    assert spreads[K1].x == pytest.approx(6.289 / 4.397, rel=1e-3) and spreads[K128].x == spreads[K1].x
    at128 = analysis.compare_cells(dflash.dec, "triton_plugin", "triton", K128, spreads)
    assert at128.verdict == "higher" and at128.lo / spreads[K128].x > 100 and at128.rule.startswith("several machines")
    at64 = analysis.compare_cells(dflash.dec, "triton_plugin", "triton", K64, spreads)  # both on part 2's machine
    assert at64.rule.startswith("one machine (part 2) measured both") and at64.level == pytest.approx(0.9)
    t = dflash.targets.set_index("target_id")
    assert t.loc["plugin_vs_triton_128k", "status"] == "met"
    assert t.loc["best_decode_128k_vs_1k", ["status", "arm"]].tolist() == ["met", "triton_plugin"]
    assert t.loc["best_ttft_64k_vs_triton", "status"] == "no interval"  # one prefill a server and context
    assert not dflash.card["all_met"].any()
    assert dflash.found["engine_ab.targets"].title == ("Targets: 2 met, 1 no interval; no single arm meets all three "
                                                       "on intervals")


def test_dflash_the_band_window_and_break_even_verdicts(dflash) -> None:
    """The plugin against FlashInfer: faster at 16k and 64k (spread 1.02x there), a tie at 128k inside the spread
    between servers; the window table and the band pick say one thing at 1k (a tie); stock Triton stops paying between
    1k and 16k, the plugin and FlashInfer always pay."""
    bands = dflash.bands.set_index("band")
    assert bands.loc["8k to 64k", "against_runner_up"].startswith("faster at every context")
    assert bands.loc["above 64k", "against_runner_up"].startswith("tie inside the spread between servers")
    assert bands.loc["up to 8k", "against_runner_up"].startswith("tie")
    win = dflash.window.set_index("context_tokens")["verdict"].to_dict()
    assert win == {K1: "tie", K16: "higher", K64: "higher"}
    evens = {b.arm: b for b in dflash.brk.evens if b.kind == "novel"}
    assert evens["triton"].outcome == "crosses" and (evens["triton"].lo_tokens, evens["triton"].hi_tokens) == (K1, K16)
    assert 1700 < evens["triton"].context_tokens < 1800  # interpolated, said as about, no interval
    assert {evens[a].outcome for a in ("triton_plugin", "flashinfer", "triton_plugin_nowindow")} == {"always pays"}
    assert all(c.level in (pytest.approx(0.9), pytest.approx(20 / 21)) for c in dflash.brk.cells)


def test_dflash_one_answer_weighing_the_first_token_against_decode(dflash) -> None:
    """At 128k FlashInfer's first token is 31.6x sooner and its decode ties with the plugin's inside the spread
    between servers: run FlashInfer; at 64k the plugin decodes faster (clearing the spread there): FlashInfer below
    about 71,863 tokens, the plugin above. Acceptance forced, said beside it. 07 says what 09 says."""
    from dataclasses import asdict

    from specdiag.steps.findings.diagnosis import diagnose

    by = {a.context_tokens: a for a in dflash.answers}
    assert (by[K128].kind, by[K128].first, by[K128].rate_verdict) == ("one", "flashinfer", "tie")
    assert (by[K64].kind, by[K64].first, by[K64].decode) == ("split", "flashinfer", "triton_plugin")
    assert by[K64].tokens == pytest.approx(71863, rel=1e-3) and by[K64].tokens_range is None  # one prefill each
    f = dflash.found["engine_ab.answer"]
    assert f.title == "Run flashinfer at 128k (acceptance forced)"
    d = diagnose([{**asdict(x), "notebook": "09_engine_ab"} for x in dflash.found.values()])
    assert f"What to run (computed, 09_engine_ab): {f.title}." in d.recommend


def test_tier0_verdicts(tier0) -> None:
    """Tier 0: 4 layers, plugin's fresh requests on three servers (1.76x apart) against one scattered request: not
    enough requests; at 61 layers 2 fresh against 3 scattered on one server: not enough requests; the contiguous
    allocator against its own server's fresh requests: a tie on one machine, no cost above +4.6%."""
    cost = tier0.cost.set_index("arm")
    assert cost.loc["plugin", "verdict"] == "not enough requests" and cost.loc["plugin", "rule"].startswith("several")
    assert cost.loc["plugin61", ["verdict", "rule"]].tolist() == ["not enough requests", "one machine"]
    three = tier0.three.set_index("arm")
    p61 = three.loc["plugin61"]
    assert p61["contiguous_verdict"] == "tie" and p61["contiguous_against"] == "its own server's fresh requests"
    assert p61["contiguous_hi_x"] == pytest.approx(1.046, abs=5e-4) and not p61["buys_back"]
    assert "90% interval -5.7% to +4.6%, 3 / 3 requests fresh / fragmented; one machine" in p61["contiguous_interval"]
    p4 = three.loc["plugin"]
    assert p4["contiguous_verdict"] == "tie" and "several machines" in p4["contiguous_interval"]
    assert tier0.found["kv_layout.plugin61"].numbers["not_enough_requests"]
    assert "no cost above +4.6%" in tier0.found["kv_layout.tier0.plugin61"].verdict


def _titles(path: Path) -> dict[str, str]:
    return {f["id"]: f["title"] for f in json.loads(path.read_text())["findings"]}


@pytest.mark.slow
@pytest.mark.notebook
def test_the_notebooks_give_the_same_verdicts_on_the_recorded_runs(run_notebook, tmp_path, dflash, tier0) -> None:
    """09 replaying the DFLASH run and 10 the Tier 0 run say what the rows give above (every finding both compute)."""
    from specdiag.paths import REFERENCE_DIR

    run_notebook("09_engine_ab", replay_dir=str(REFERENCE_DIR / DFLASH))
    run_notebook("10_kv_layout", replay_dir=str(REFERENCE_DIR / TIER0))
    nine = _titles(tmp_path / "run" / "findings" / "09_engine_ab.json")
    ten = _titles(tmp_path / "run" / "findings" / "10_kv_layout.json")
    for fid, f in dflash.found.items():
        if fid not in ("engine_ab.prefill_floor", "engine_ab.lacks"):  # the floor needs 09's peaks
            assert nine[fid] == f.title, fid
    for fid, f in tier0.found.items():
        if not fid.startswith("kv_layout.prediction"):  # the prediction needs the kernel A/B run
            assert ten[fid] == f.title, fid
