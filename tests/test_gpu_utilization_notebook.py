"""Notebook 02 end to end: live against the embedded server with the CPU fallback, and replaying the
recorded H200 run (its numbers pinned to what the run recorded)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable

import pytest

from specdiag.paths import REFERENCE_DIR
from specdiag.runs import Run

H200_RUN = REFERENCE_DIR / "embedded-h200-utilization"


def result(run_dir: Path) -> dict[str, Any]:
    return json.loads((run_dir / "findings" / "02_gpu_utilization.json").read_text())


@pytest.mark.notebook
def test_live_on_the_embedded_server_with_cpu_telemetry(run_notebook: Callable[..., Path], embedded_server: Any,
                                                        tmp_path: Path) -> None:
    from specdiag import hardware

    run_dir = tmp_path / "live"
    # the run's peaks as 00 of the same run resolves and keeps them (here from parameters): 02 reads them from
    # run.json instead of timing a copy and matmuls on this CPU (that path: test_hardware, and the slow
    # test_one_run_has_one_peak_bandwidth_in_every_notebook)
    hardware.run_peaks(Run.create(run_dir), 20.0, 1.0, server_url=embedded_server.url, server_info={"device": "cpu"})
    run_notebook("02_gpu_utilization", server_url=embedded_server.url, run_dir=str(run_dir), context_tokens=256,
                 max_new_tokens=24, idle_s=0.3, telemetry="cpu", sample_hz=50.0)
    out = result(run_dir)
    m = out["metrics"]
    assert m["peak_gb_s"] == 20.0  # the run's recorded peak, not one of 02's own
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
    """The numbers are pinned: they are what the H200 run recorded (data/reference/embedded-h200-utilization/README.md:
    decode 10.7 s at 39.1 ms per step, utilization.gpu 34 %, GPM SM activity 2.9 %, DRAM 0.46 % of peak against a
    predicted 0.14 %), so a change in how the library cuts phases or takes medians fails here."""
    assert (H200_RUN / "run.json").exists(), f"the recorded H200 run is missing at {H200_RUN}"
    run_dir = tmp_path / "replay"
    executed = run_notebook("02_gpu_utilization", replay_dir=str(H200_RUN), run_dir=str(run_dir))
    assert "no torch profiler traces in data/reference/embedded-h200-utilization" in executed.read_text()
    out = result(run_dir)
    m = out["metrics"]
    assert m["telemetry_source"] == "nvml" and m["device_name"] == "NVIDIA H200"
    assert m["replay_of"] == "data/reference/embedded-h200-utilization"  # project-relative: shared pages
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
    assert m["telemetry_recorded"] is True and m["trace_timelines"] == []  # no profiles/: one line says so
    severities = {f["id"]: f["severity"] for f in out["findings"]}
    assert severities == {"utilization.decode_gpu_idle": "warning", "utilization.decode_bandwidth": "warning"}


PLUGIN_TRACED = REFERENCE_DIR / "sglang-h200-mla2-plugin-traced"


@pytest.mark.notebook
def test_replays_a_run_with_traces_and_no_telemetry(run_notebook: Callable[..., Path], tmp_path: Path) -> None:
    """The traced plugin run has no NVML telemetry, only torch profiler traces: 02 says what is missing and draws the
    traces. Pinned to what the committed traces give (computed by torch_trace): at 131,072 tokens the plugin's
    traced step is 5.14 ms with 0.607 ms of GPU work, 11.8 % busy (median of 11 complete steps)."""
    run_dir = tmp_path / "traced"
    out_nb = run_notebook("02_gpu_utilization", replay_dir=str(PLUGIN_TRACED), run_dir=str(run_dir), trace_steps=4)
    out = result(run_dir)
    m = out["metrics"]
    assert m["telemetry_recorded"] is False and m["telemetry_source"] is None and m["decode_gpu_util_pct_median"] is None
    traces = {t["context_tokens"]: t for t in m["trace_timelines"]}
    assert sorted(traces) == [1024, 131072] and {t["arm"] for t in traces.values()} == {"plugin"}
    long = traces[131072]
    assert long["gpu_busy_pct"] < 20 and long["gpu_busy_pct"] == pytest.approx(11.82, abs=0.1)
    assert long["wall_ms"] == pytest.approx(5.142, abs=0.005) and long["gpu_busy_ms"] == pytest.approx(0.607, abs=0.002)
    assert long["largest_class"] == "attn_specdiag_splitkv" and long["steps_drawn"] == [0, 1, 2, 3]
    assert traces[1024]["gpu_busy_pct"] == pytest.approx(5.21, abs=0.1)
    assert long["unprofiled_step_ms"] == pytest.approx(2.38, abs=0.01)  # the run's sweep, measured without profiler
    severities = {f["id"]: f["severity"] for f in out["findings"]}
    assert severities == {"utilization.trace_gpu_idle.plugin-1024": "warning",
                          "utilization.trace_gpu_idle.plugin-131072": "warning"}
    text = out_nb.read_text()
    assert "has no sampled telemetry" in text and text.count("image/png") >= 2  # the two timelines were drawn


@pytest.mark.notebook
def test_stock_trace_is_busy_and_the_page_is_offline(tmp_path: Path) -> None:
    """`make replay` on the stock arm: 02 is not skipped for lack of telemetry, its page renders with no network
    reference, and stock's traced 131,072-token step is GPU-bound: 87.2 % busy, 50.3 ms of SGLang's Triton kernel."""
    from specdiag import report

    out = tmp_path / "stock"
    assert report.main(["replay", "--run", str(REFERENCE_DIR / "sglang-h200-mla2-stock-traced"), "--run-dir", str(out),
                        "--notebooks", "02_gpu_utilization"]) == 0
    m = result(out)["metrics"]
    (stock,) = m["trace_timelines"]
    assert (stock["arm"], stock["context_tokens"]) == ("stock", 131072)
    assert stock["gpu_busy_pct"] > 80 and stock["gpu_busy_pct"] == pytest.approx(87.2, abs=0.2)
    assert stock["largest_class"] == "attn_sglang_triton" and stock["largest_class_ms"] == pytest.approx(50.29, abs=0.05)
    page = out / "html" / "02_gpu_utilization.html"
    assert report.network_references(page.read_text(encoding="utf-8")) == []
    assert report.main(["check-offline", str(page)]) == 0


def test_replay_skips_02_only_without_telemetry_and_traces(tmp_path: Path) -> None:
    from specdiag.report import REPLAY_NEEDS, replay_need_met

    (need,) = REPLAY_NEEDS["02_gpu_utilization"]
    assert replay_need_met(Run.open(PLUGIN_TRACED), need) and replay_need_met(Run.open(H200_RUN), need)
    bare = Run.create(tmp_path / "bare")
    assert not replay_need_met(bare, need)
    (bare.path / "profiles").mkdir()
    assert not replay_need_met(bare, need)  # an empty folder is no trace
    (bare.path / "profiles" / "x.trace.json.gz").write_bytes(b"")
    assert replay_need_met(bare, need)


@pytest.mark.notebook
def test_a_bad_parameter_stops_02_in_one_line_before_any_server_starts(tmp_path: Path) -> None:
    """No server_url and no replay_dir: 02 would start the embedded server. A telemetry it cannot read fails on the page
    in its one line before nb.start: no run folder, no server, no telemetry opened."""
    import papermill

    from specdiag.paths import NOTEBOOKS_DIR
    from specdiag.report.execute import KERNEL_START_TIMEOUT_S

    run_dir, out = tmp_path / "run", tmp_path / "02.out.ipynb"
    with pytest.raises(papermill.PapermillExecutionError, match="ParameterError"):
        papermill.execute_notebook(str(NOTEBOOKS_DIR / "02_gpu_utilization.ipynb"), str(out),
                                   parameters={"run_dir": str(run_dir), "telemetry": "gpu0"}, kernel_name="python3",
                                   cwd=str(NOTEBOOKS_DIR), progress_bar=False, start_timeout=KERNEL_START_TIMEOUT_S)
    errors = [o["traceback"] for cell in json.loads(out.read_text())["cells"] for o in cell.get("outputs", [])
              if o["output_type"] == "error"]
    assert errors == [["ParameterError: telemetry must be 'auto', 'nvml', 'cpu' or a DCGM exporter / Prometheus URL "
                       "(http://...); got 'gpu0'"]]
    assert not run_dir.exists(), "nb.start ran (it opens the run folder before it starts or reaches a server)"
