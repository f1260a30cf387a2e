"""Phases, per-phase statistics, findings and the timeline, on synthetic rows; one recorded request
against the SGLang replay server with the CPU fallback."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from sglang_replay_server import CHUNK_DELAY_S, CHUNKS, PROMPT_TOKENS, ReplayServer  # noqa: E402

from specdiag.serving import SGLangClient  # noqa: E402
from specdiag.runs import Run  # noqa: E402
from specdiag.telemetry.sampler import empty_row, open_source  # noqa: E402
from specdiag.steps.gpu_utilization.record import record_sampled_request  # noqa: E402
from specdiag.steps.gpu_utilization.analysis import (  # noqa: E402
    label_rows,
    phase_stats,
    phase_windows,
    predicted_bandwidth_utilization,
    quantile,
    stat,
    telemetry_locality,
    utilization_findings,
)

T0 = 1_700_000_000.0
REQUEST = {"t_send_unix_s": T0 + 1.0, "ttft_s": 0.5, "chunk_t_s": [0.5, 1.5, 2.5, 3.5, 10.5], "e2e_s": 10.6,
           "chunk_tokens": [1, 3, 3, 3, 3], "completion_tokens": 13, "error": None}


def gpu_rows(busy: float, sm: float | None, dram: float | None, hz: float = 50.0) -> list[dict[str, Any]]:
    """13 s of samples of GPU '0': idle before and after, 90 % during prefill, the given values during decode."""
    rows = []
    for k in range(int(13 * hz)):
        ts = T0 + k / hz
        row = empty_row(ts, "nvml", "0", "NVIDIA H200")
        phase = "before" if ts < T0 + 1.0 else "prefill" if ts < T0 + 1.5 else "decode" if ts <= T0 + 11.5 else "after"
        row["gpu_util_pct"] = {"before": 0.0, "prefill": 90.0, "decode": busy, "after": 0.0}[phase]
        if k % 5 == 0:  # GPM every 100 ms
            row["sm_active_pct"] = {"decode": sm}.get(phase, 1.0) if sm is not None else None
            row["dram_bw_util_pct"] = {"decode": dram}.get(phase, 0.1) if dram is not None else None
        row["mem_util_pct"] = 3.0
        row["sm_clock_mhz"] = 1980.0
        row["power_w"] = 120.0
        row["mem_used_mib"] = 2048.0
        rows.append(row)
    return rows


def test_phase_windows_and_labels() -> None:
    w = phase_windows(REQUEST)
    assert w.t_first_token_unix_s == T0 + 1.5 and w.t_last_token_unix_s == T0 + 11.5
    assert w.t_end_unix_s == pytest.approx(T0 + 11.6)
    assert [w.phase_of(T0 + x) for x in (0.5, 1.2, 1.5, 11.5, 11.55)] == ["before", "prefill", "decode", "decode", "after"]
    assert w.span("decode") == (T0 + 1.5, T0 + 11.5) and w.span("before") is None
    labelled = label_rows([empty_row(T0 + 2.0, "cpu", "cpu")], w)
    assert labelled[0]["phase"] == "decode" and labelled[0]["t_rel_s"] == pytest.approx(1.0)
    with pytest.raises(ValueError, match="t_send_unix_s"):
        phase_windows({"ttft_s": 1.0})


def test_phase_stats_per_phase_and_trim() -> None:
    rows = gpu_rows(busy=97.0, sm=12.0, dram=0.4)
    stats = phase_stats(rows, phase_windows(REQUEST))
    assert [s["phase"] for s in stats] == ["before", "prefill", "decode", "after"]
    assert stat(stats, "0", "decode", "gpu_util_pct_median") == 97.0
    assert stat(stats, "0", "prefill", "gpu_util_pct_median") == 90.0
    assert stat(stats, "0", "decode", "sm_active_pct_median") == 12.0
    assert stat(stats, "0", "decode", "n_samples") == 501  # 10 s at 50 Hz, both ends included
    assert stat(stats, "0", "decode", "sm_active_pct_n") == 101  # GPM rows only
    assert stat(stats, "0", "before", "cpu_util_pct_median") is None  # not read by NVML
    trimmed = phase_stats(rows, phase_windows(REQUEST), trim_s=1.0)
    assert stat(trimmed, "0", "decode", "n_samples") == 451
    assert stat(trimmed, "0", "prefill", "n_samples") == stat(stats, "0", "prefill", "n_samples")  # too short to trim
    err = empty_row(T0 + 5.0, "nvml", "0")
    err["error"] = "GPU is lost"
    assert stat(phase_stats([*rows, err], phase_windows(REQUEST)), "0", "decode", "n_samples") == 501


def test_quantile_matches_numpy_linear() -> None:
    np = pytest.importorskip("numpy")
    vals = [5.0, 1.0, 9.0, 3.0, 7.5, 2.0]
    for q in (0.0, 0.1, 0.5, 0.9, 1.0):
        assert quantile(vals, q) == pytest.approx(float(np.quantile(vals, q)))


def test_findings_busy_kernels_on_few_sms_and_bandwidth_compared() -> None:
    rows = gpu_rows(busy=97.0, sm=12.0, dram=0.4)
    stats = phase_stats(rows, phase_windows(REQUEST))
    pred = predicted_bandwidth_utilization(bytes_per_step=48e6, step_s=0.025, peak_bytes_per_s=4.8e12)
    assert pred["predicted_bw_util_pct"] == pytest.approx(0.04)
    assert pred["floor_step_s"] == pytest.approx(1e-5)
    findings = {f.id: f for f in utilization_findings(stats, REQUEST, "0", prediction=pred)}
    few = findings["utilization.decode_few_sms"]
    assert few.severity == "warning" and few.numbers["decode_sm_active_pct_median"] == 12.0
    assert any("not SM occupancy" in e for e in few.evidence)
    bw = findings["utilization.decode_bandwidth"]
    assert bw.numbers["measured_over_predicted"] == pytest.approx(10.0)
    assert "moves 10.0x the bytes" in bw.verdict and bw.severity == "warning"


def test_findings_idle_gpu_and_matching_bandwidth() -> None:
    stats = phase_stats(gpu_rows(busy=30.0, sm=5.0, dram=2.0), phase_windows(REQUEST))
    pred = predicted_bandwidth_utilization(2.4e9, 0.025, 4.8e12)  # 2 % of peak
    findings = {f.id: f for f in utilization_findings(stats, REQUEST, "0", prediction=pred)}
    assert "about 70 %" in findings["utilization.decode_gpu_idle"].verdict
    assert "matches the prediction" in findings["utilization.decode_bandwidth"].verdict


def test_findings_without_gpm_do_not_compare_time_fractions() -> None:
    stats = phase_stats(gpu_rows(busy=95.0, sm=None, dram=None), phase_windows(REQUEST))
    pred = predicted_bandwidth_utilization(48e6, 0.025, 4.8e12)
    findings = {f.id: f for f in utilization_findings(stats, REQUEST, "0", prediction=pred)}
    assert "utilization.decode_gpu_busy" in findings
    predicted = findings["utilization.decode_bandwidth_predicted"]
    assert "no DRAM-bandwidth counter" in predicted.verdict
    assert any("time fraction" in e for e in predicted.evidence)


def test_findings_for_a_failed_request_say_so() -> None:
    failed = {**REQUEST, "chunk_t_s": [], "ttft_s": None, "error": "HTTP 500"}
    findings = utilization_findings([], failed, "0")
    assert [f.id for f in findings] == ["utilization.no_decode"]


def test_locality_names_the_mismatch() -> None:
    here = {"kind": "nvml", "host": "laptop"}
    assert telemetry_locality("http://127.0.0.1:30000", here)["same_machine"] is True
    assert telemetry_locality("", here)["same_machine"] is True
    far = telemetry_locality("http://gpu-host:30000", here)
    assert far["same_machine"] is False and "NOT show the server's GPUs" in far["text"]
    assert "http://gpu-host:9400/metrics" in far["text"]
    prom = {"kind": "prometheus", "host": "gpu-host", "url": "http://gpu-host:9400/metrics"}
    assert telemetry_locality("http://gpu-host:30000", prom)["same_machine"] is True
    stats = phase_stats(gpu_rows(90.0, 50.0, 5.0), phase_windows(REQUEST))
    ids = [f.id for f in utilization_findings(stats, REQUEST, "0", locality=far)]
    assert ids[0] == "utilization.telemetry_elsewhere"


def test_timeline_plot_has_units_and_phases() -> None:
    import matplotlib

    matplotlib.use("Agg")
    from specdiag.steps.gpu_utilization.plot import plot_timeline

    fig = plot_timeline(gpu_rows(97.0, 12.0, 0.4), phase_windows(REQUEST), "0", REQUEST["chunk_t_s"],
                        predicted_bw_util_pct=0.04)
    labels = [ax.get_ylabel() for ax in fig.axes]
    assert labels == ["utilization (%)", "DRAM bandwidth (% of peak)", "clock (MHz)", "power (W)", "memory used (GiB)"]
    dram = [t.get_text() for t in fig.axes[1].get_legend().get_texts()]
    assert dram == ["measured (GPM / DCGM)", "predicted by the bandwidth analysis (0.04 %)"]
    assert fig.axes[-1].get_xlabel() == "time after the request was sent (s)"
    legend = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert "prefill" in legend and "decode" in legend and "token chunk arrives" in legend
    with pytest.raises(ValueError, match="no samples"):
        plot_timeline(gpu_rows(97.0, 12.0, 0.4), phase_windows(REQUEST), "7")


def test_record_sampled_request_against_replay_server(tmp_path: Path) -> None:
    run = Run.create(tmp_path / "run")
    with ReplayServer() as server:
        client = SGLangClient(server.url, timeout_s=10.0)
        row = record_sampled_request(run, client, open_source("cpu"), input_ids=list(range(PROMPT_TOKENS)),
                                     max_new_tokens=10, rate_hz=50, idle_before_s=0.2, idle_after_s=0.2)
        sent = [r for r in server.requests if r.path == "/generate"][-1].body
    assert sent["sampling_params"]["ignore_eos"] is True and sent["sampling_params"]["max_new_tokens"] == 10
    assert row["error"] is None and row["completion_tokens"] == sum(len(c) for c in CHUNKS)
    assert len(row["chunk_t_s"]) == len(CHUNKS) and row["chunk_tokens"] == [len(c) for c in CHUNKS]
    assert row["telemetry_source"]["kind"] == "cpu" and row["sampler"]["achieved_rate_hz"] > 20
    telemetry = run.rows("telemetry")
    assert len(telemetry) == row["sampler"]["rows"] >= 15
    (on_disk,) = run.rows("telemetry_request")
    assert on_disk["chunk_t_s"] == row["chunk_t_s"] and on_disk["t_send_unix_s"] == row["t_send_unix_s"]
    w = phase_windows(row)
    phases = {r["phase"] for r in label_rows(telemetry, w)}
    assert {"before", "decode", "after"} <= phases
    # the stream's chunks are CHUNK_DELAY_S apart on the sampler's clock
    assert w.t_last_token_unix_s - w.t_first_token_unix_s == pytest.approx((len(CHUNKS) - 1) * CHUNK_DELAY_S, abs=0.1)


QWEN3_TINY = {"model_type": "qwen3", "architectures": ["Qwen3ForCausalLM"], "num_hidden_layers": 4,
              "hidden_size": 256, "intermediate_size": 768, "num_attention_heads": 4, "num_key_value_heads": 2,
              "head_dim": 64, "vocab_size": 4096, "max_position_embeddings": 16384, "torch_dtype": "float32",
              "tie_word_embeddings": False}


def test_decode_bytes_match_the_roofline_and_add_the_drafter() -> None:
    from specdiag.geometry import load_geometry
    from specdiag.hardware import HardwarePeaks, Peak
    from specdiag.roofline import step_roofline
    from specdiag.steps.gpu_utilization.analysis import decode_bytes_per_step

    server = {"speculative_algorithm": "STANDALONE", "speculative_num_draft_tokens": 8, "speculative_num_steps": 7,
              "dtype": "float32", "kv_cache_dtype": "auto", "tp_size": 1}
    drafter_cfg = {**QWEN3_TINY, "num_hidden_layers": 2, "hidden_size": 128, "num_attention_heads": 2,
                   "num_key_value_heads": 1}
    out = decode_bytes_per_step(server, {"target": QWEN3_TINY, "drafter": drafter_cfg}, 4096.4)
    peaks = HardwarePeaks("test", Peak(1e12, "parameter", "test"), None)
    geom = load_geometry(QWEN3_TINY, kv_dtype="float32", weight_dtype="float32")
    roof = step_roofline(geom, 4096, peaks, draft_tokens=8)
    assert out["parts"]["target_weights"] + out["parts"]["target_kv"] == pytest.approx(roof.total_bytes)
    # target KV: 4 layers x 4096 tokens x (K and V: 2 x 2 heads x 64) x 4 bytes
    assert out["parts"]["target_kv"] == 4 * 4096 * 2 * 2 * 64 * 4
    # drafter: 7 passes x 2 layers x 4096 tokens x (2 x 1 x 64) x 4 bytes of KV
    assert out["parts"]["drafter_kv"] == 7 * 2 * 4096 * 2 * 64 * 4
    assert out["draft_passes"] == 7 and out["context_tokens"] == 4096
    assert out["bytes_per_step"] == pytest.approx(sum(out["parts"].values()))
    ngram = decode_bytes_per_step({**server, "speculative_algorithm": "NGRAM"}, {"target": QWEN3_TINY}, 4096)
    assert set(ngram["parts"]) == {"target_weights", "target_kv"}
    with pytest.raises(ValueError, match="model_config"):
        decode_bytes_per_step(server, {"target": None}, 4096)


def test_measure_checks_the_context_before_sending(tmp_path: Path) -> None:
    from specdiag.steps.gpu_utilization.record import measure_utilization

    run = Run.create(tmp_path / "run")
    with ReplayServer() as server:
        client = SGLangClient(server.url, timeout_s=10.0)
        with pytest.raises(ValueError, match="context_length is 32,768"):
            measure_utilization(run, client, open_source("cpu"), 32_000, 1_000)
        assert not [r for r in server.requests if r.path == "/generate"]
    assert run.rows("telemetry") == []


def test_the_sweep_measurement_writes_a_replayable_run(tmp_path: Path, small_cpu_measurements: None) -> None:
    """``specdiag sweep --measure gpu_utilization`` (the GPU host's way, no papermill): 02's own measurement on each
    arm's server, into the arm's folder that 02 replays, with its parameters recorded."""
    from specdiag.sweep.arms import running
    from specdiag.sweep.driver import SweepOptions, plan, sweep
    from specdiag.sweep.servers import Host

    out = tmp_path / "rec"
    with ReplayServer() as server:
        planned = plan(running({"replay": server.url}), "gpu_utilization", (),
                       {"context_tokens": 64, "max_new_tokens": 10, "telemetry": "cpu", "idle_s": 0.2})
        assert sweep(planned.arms, planned.measures, SweepOptions(out=out), Host(work=out)) == 0
    run = Run.open(out / "replay")
    assert run.meta["params"]["02_gpu_utilization"]["context_tokens"] == 64 and run.meta["server_url"] == server.url
    (request,) = run.rows("telemetry_request")
    assert request["warmup"]["completion_tokens"] > 0 and request["hardware"]["memory_bandwidth_gb_s"] > 0
    assert len(rows_of := run.rows("telemetry")) == request["sampler"]["rows"] and rows_of[0]["source"] == "cpu"
    assert Run.open(out).meta["kind"] == "gpu_utilization" and not run.rows("engine_ab")


def test_decode_prediction_of_the_recorded_h200_request() -> None:
    """02's prediction, in the library: the H200 request's bytes per step (266 MB at 12,988 tokens, computed) over
    its 39.1 ms step against the NVML peak (data/reference/embedded-h200-utilization/README.md), and a note instead of an error when inputs lack."""
    from specdiag.paths import REFERENCE_DIR
    from specdiag.runs import Run
    from specdiag.steps.gpu_utilization.analysis import predict_decode_bandwidth, prediction_lines

    (request,) = Run.open(REFERENCE_DIR / "embedded-h200-utilization").rows("telemetry_request")
    pred = predict_decode_bandwidth(request, request["model_configs"])
    assert pred.note == "" and pred.step_bytes["context_tokens"] == 12988
    assert pred.step_bytes["bytes_per_step"] / 1e6 == pytest.approx(266, abs=1)
    assert pred.prediction["predicted_bw_util_pct"] == pytest.approx(0.1413, abs=1e-4)
    lines = prediction_lines(pred, 0.46)
    assert "computed (NVML clocks x bus width)" in lines[0] and "0.46 %" in lines[1]
    # a user's bandwidth wins and is labelled a parameter
    halved = predict_decode_bandwidth(request, request["model_configs"], memory_bandwidth_gb_s=2407.0)
    assert halved.prediction["predicted_bw_util_pct"] == pytest.approx(2 * 0.1413, rel=2e-3)
    assert "parameter (user-supplied)" in prediction_lines(halved, None)[0]
    missing = predict_decode_bandwidth({**request, "step_ms": None}, request["model_configs"])
    assert missing.prediction is None and "no measured step time" in missing.note
