"""Notebook 02 end to end: live against the embedded server with the CPU fallback, and replaying the
recorded H200 run (its numbers pinned to what the run recorded)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable

import pytest

from specdiag.paths import REFERENCE_DIR
from specdiag.runs import Run

H200_RUN = REFERENCE_DIR / "h200-embedded-utilization"


def result(run_dir: Path) -> dict[str, Any]:
    return json.loads((run_dir / "findings" / "02_gpu_utilization.json").read_text())


@pytest.mark.notebook
def test_live_on_the_embedded_server_with_cpu_telemetry(run_notebook: Callable[..., Path], embedded_server: Any,
                                                        tmp_path: Path) -> None:
    run_dir = tmp_path / "live"
    run_notebook("02_gpu_utilization", server_url=embedded_server.url, run_dir=str(run_dir), context_tokens=256,
                 max_new_tokens=24, idle_s=0.3, telemetry="cpu", sample_hz=50.0)
    out = result(run_dir)
    m = out["metrics"]
    assert m["request_error"] is None and m["completion_tokens"] == 24 and m["context_tokens"] == 256
    assert m["telemetry_source"] == "cpu" and m["device"] == "cpu"
    assert m["telemetry_same_machine_as_server"] is True
    assert m["decode_cpu_util_pct_median"] is not None and m["decode_gpu_util_pct_median"] is None
    assert m["sample_rate_hz_achieved"] > 25
    assert m["predicted_bw_util_pct"] is not None and m["predicted_bw_util_pct"] > 0
    run = Run.open(run_dir)
    (request,) = run.rows("telemetry_request")
    assert request["prompt_tokens"] == 256 and request["sampler"]["rows"] == len(run.rows("telemetry"))
    ids = {f["id"] for f in out["findings"]}
    assert "utilization.decode_cpu" in ids and "utilization.decode_bandwidth_predicted" in ids


@pytest.mark.notebook
def test_replays_the_recorded_h200_run(run_notebook: Callable[..., Path], tmp_path: Path) -> None:
    """The numbers are pinned: they are what the H200 run recorded (docs/device-notes.md, telemetry call 2:
    decode 10.7 s at 39.1 ms per step, utilization.gpu 34 %, GPM SM activity 2.9 %, DRAM 0.46 % of peak against a
    predicted 0.14 %), so a change in how the library cuts phases or takes medians fails here."""
    assert (H200_RUN / "run.json").exists(), f"the recorded H200 run is missing at {H200_RUN}"
    run_dir = tmp_path / "replay"
    run_notebook("02_gpu_utilization", replay_dir=str(H200_RUN), run_dir=str(run_dir))
    out = result(run_dir)
    m = out["metrics"]
    assert m["telemetry_source"] == "nvml" and m["device_name"] == "NVIDIA H200"
    assert m["replay_of"] == "data/reference/h200-embedded-utilization"  # project-relative: shared pages
    assert (m["context_tokens"], m["completion_tokens"], m["request_error"]) == (12288, 1400, None)
    assert m["decode_s"] == pytest.approx(10.7047, abs=1e-3)
    assert m["step_ms"] == pytest.approx(39.068, abs=1e-2)
    assert m["sample_rate_hz_achieved"] == pytest.approx(50.06, abs=0.01)
    assert m["decode_gpu_util_pct_median"] == 34.0
    assert m["decode_mem_util_pct_median"] == 1.0
    assert m["decode_sm_active_pct_median"] == pytest.approx(2.861, abs=1e-3)
    assert m["decode_dram_bw_util_pct_median"] == pytest.approx(0.4644, abs=1e-4)
    assert m["predicted_bw_util_pct"] == pytest.approx(0.1413, abs=1e-4)
    assert m["decode_cpu_util_pct_median"] is None
    severities = {f["id"]: f["severity"] for f in out["findings"]}
    assert severities == {"utilization.decode_gpu_idle": "warning", "utilization.decode_bandwidth": "warning"}
