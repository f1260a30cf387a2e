"""scripts/engine_ab.py's dry run on this CPU: two embedded servers as arms, each arm's record in run.json kept whole
(what, environment, server, command, times), the device and the peaks recorded, rows that 09's analysis reads."""

from __future__ import annotations

import importlib.util
import sys

import pytest

from specdiag.paths import PROJECT_ROOT
from specdiag.runs import Run


@pytest.mark.slow
def test_the_dry_run_keeps_each_arms_record_whole(tmp_path) -> None:
    spec = importlib.util.spec_from_file_location("engine_ab_script", PROJECT_ROOT / "scripts" / "engine_ab.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["engine_ab_script"] = mod
    spec.loader.exec_module(mod)  # type: ignore[union-attr]
    out = tmp_path / "eab"
    assert mod.main(["--engine", "embedded", "--out", str(out), "--arms", "a,b", "--contexts", "128", "--repeats", "2",
                     "--max-new-tokens", "4", "--stagger-pattern", "", "--budget-s", "150"]) == 0
    run = Run.open(out)
    for arm in ("a", "b"):
        rec = run.meta["arms"][arm]
        assert {"what", "env", "started_after_s", "ready_after_s", "server", "command"} <= set(rec), rec.keys()
        assert rec["env"]["SPECDIAG_SGLANG_VERIFY"] == "off" and rec["server"]["chunked_prefill_size"]
    assert "gpu" in run.meta["device"] and run.meta["hardware"]["memory_bandwidth_gb_s"] > 0
    from specdiag.steps.engine_ab import analysis

    dec = analysis.decode_table(analysis.frame(run.rows("engine_ab")))
    assert set(dec["arm"]) == {"a", "b"} and set(dec["n"]) == {2}


def _script():
    spec = importlib.util.spec_from_file_location("engine_ab_script_fast", PROJECT_ROOT / "scripts" / "engine_ab.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)  # type: ignore[union-attr]
    return mod


def test_dflash_arms_pass_the_drafter_its_block_and_window_and_nospec_arms_none() -> None:
    """An SGLang DFLASH server gets the drafter, num_draft_tokens = its block (SGLang refuses them unequal) and the
    draft window; a ``_nospec`` arm gets no speculation at all and no forced acceptance."""
    import argparse

    mod = _script()
    args = argparse.Namespace(algorithm="DFLASH", draft_model_path="/d", block_size=16, draft_window=2048,
                              draft_tokens=8, simulate_acc_len=4.0, site="", plugin_path="", flashinfer_ws="/tmp/w")
    assert mod.spec_args("triton_plugin", args) == (
        "DFLASH", 16, "/d", ("--speculative-dflash-block-size", "16", "--speculative-draft-window-size", "2048"))
    assert mod.spec_args("triton_nospec", args) == ("NONE", None, None, ())
    assert mod.arm_env("triton_plugin", args, PROJECT_ROOT)["SGLANG_SIMULATE_ACC_LEN"] == "4.0"
    assert "SGLANG_SIMULATE_ACC_LEN" not in mod.arm_env("flashinfer_nospec", args, PROJECT_ROOT)
    assert mod.arm_env("triton_plugin_check", args, PROJECT_ROOT)["SPECDIAG_SGLANG_CHECK"] == "1"
    with pytest.raises(SystemExit, match="draft-model-path"):
        mod.spec_args("triton", argparse.Namespace(**{**vars(args), "draft_model_path": ""}))
    ngram = argparse.Namespace(**{**vars(args), "algorithm": "NGRAM"})
    assert mod.spec_args("triton", ngram) == ("NGRAM", 8, None, ())


def test_check_summary_counts_causal_block_calls_and_the_largest_error() -> None:
    mod = _script()
    stats = [{"check": [{"rel_err": 1e-3, "finite": True, "causal_block": True, "prefix_tokens": [900]},
                        {"rel_err": 4e-3, "finite": True, "causal_block": False, "prefix_tokens": [20000]}]},
             {"check": [{"rel_err": 2e-3, "finite": False, "causal_block": True, "prefix_tokens": [5]}]}]
    got = mod.check_summary(stats)
    assert got["calls"] == 3 and got["causal_block_calls"] == 2 and got["max_rel_err"] == 4e-3
    assert got["median_rel_err"] == 2e-3 and got["all_finite"] is False and got["prefix_tokens_max"] == 20000


def test_a_server_over_several_gpus_gets_tp_ep_and_nccls_all_reduce() -> None:
    """TP 8 (the investigation's shape) and EP 8 reach SGLang's flags, with the two all-reduces that need NVLink
    multicast turned off; one GPU gets none of them; EP above TP is refused before anything starts."""
    import argparse

    mod = _script()
    one = argparse.Namespace(tp_size=1, ep_size=1, enable_eplb=False)
    assert mod.parallel_args(one) == ()
    tp8 = argparse.Namespace(tp_size=8, ep_size=8, enable_eplb=True)
    flags = mod.parallel_args(tp8)
    assert flags[:3] == ("--ep-size", "8", "--enable-eplb") and set(mod.PARALLEL_FLAGS) <= set(flags)
    with pytest.raises(SystemExit, match="exceeds --tp-size"):
        mod.parallel_args(argparse.Namespace(tp_size=2, ep_size=8, enable_eplb=False))
