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
