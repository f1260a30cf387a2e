"""specdiag.hardware: the table, NVML arithmetic (fake NVML), precedence, CPU measurement."""

from __future__ import annotations

import sys
import types

import pytest

from specdiag import hardware as hw


@pytest.mark.parametrize("name, expected", [
    ("NVIDIA H100 80GB HBM3", "NVIDIA H100 SXM"),
    ("NVIDIA H100 PCIe", "NVIDIA H100 PCIe"),
    ("NVIDIA H200", "NVIDIA H200"),
    ("NVIDIA B200", "NVIDIA B200"),
    ("NVIDIA A100-SXM4-80GB", "NVIDIA A100 80GB SXM"),
    ("NVIDIA A100 80GB PCIe", "NVIDIA A100 80GB PCIe"),
    ("NVIDIA A100-SXM4-40GB", "NVIDIA A100 40GB"),
    ("NVIDIA L40S", "NVIDIA L40S"),
    ("NVIDIA GeForce RTX 4090", "NVIDIA GeForce RTX 4090"),
    ("NVIDIA RTX PRO 6000 Blackwell Server Edition", "NVIDIA RTX PRO 6000 Blackwell"),
])
def test_lookup_known_gpus(name: str, expected: str) -> None:
    spec = hw.lookup_gpu(name)
    assert spec is not None and spec.name == expected
    assert spec.memory_source and spec.matmul_source


def test_lookup_unknown_and_table_values() -> None:
    assert hw.lookup_gpu("Some Accelerator 9000") is None
    assert hw.lookup_gpu("NVIDIA RTX PRO 6000 Blackwell").memory_bandwidth_gb_s == 512 / 8 * 28  # 1,792 GB/s


def _fake_pynvml(clock_mhz: int, bus_bits: int, name: str) -> types.ModuleType:
    m = types.ModuleType("pynvml")
    m.NVML_CLOCK_MEM = 2
    m.nvmlInit = lambda: None
    m.nvmlShutdown = lambda: None
    m.nvmlDeviceGetHandleByIndex = lambda i: ("h", i)
    m.nvmlDeviceGetName = lambda h: name
    m.nvmlDeviceGetMaxClockInfo = lambda h, kind: clock_mhz if kind == 2 else 0
    m.nvmlDeviceGetMemoryBusWidth = lambda h: bus_bits
    return m


def test_nvml_bandwidth_arithmetic(monkeypatch: pytest.MonkeyPatch) -> None:
    # What the project's H200 reported (2026-11-29): 3201 MHz maximum memory clock, 6016-bit bus.
    monkeypatch.setitem(sys.modules, "pynvml", _fake_pynvml(3201, 6016, "NVIDIA H200"))
    name, value, detail = hw.nvml_memory_bandwidth(0)
    assert name == "NVIDIA H200"
    assert value == 3201e6 * 2 * 6016 / 8  # 4.81 TB/s, the datasheet's 4.8
    assert value / 1e9 == pytest.approx(hw.lookup_gpu(name).memory_bandwidth_gb_s, rel=0.01)
    assert "6016-bit" in detail


def test_nvml_absent_gives_none(monkeypatch: pytest.MonkeyPatch) -> None:
    m = _fake_pynvml(1, 1, "x")

    def fail() -> None:
        raise RuntimeError("NVML Shared Library Not Found")

    m.nvmlInit = fail
    monkeypatch.setitem(sys.modules, "pynvml", m)
    assert hw.nvml_memory_bandwidth(0) is None


def test_precedence_parameter_nvml_table(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(hw, "cuda_available", lambda: True)
    monkeypatch.setattr(hw, "nvml_memory_bandwidth", lambda i=0: ("NVIDIA H200", 4.9e12, "nvml detail"))
    p = hw.resolve_peaks(memory_bandwidth_gb_s=1000, matmul_tflops=100)
    assert p.memory_bandwidth.source == "parameter" and p.memory_bandwidth_gb_s == 1000
    assert p.matmul.source == "parameter" and p.matmul_tflops == 100
    p = hw.resolve_peaks()
    assert p.memory_bandwidth.source == "nvml" and p.memory_bandwidth.value == 4.9e12
    assert p.matmul.source == "table" and p.matmul_tflops == pytest.approx(989.4)
    # A named remote GPU: the table, never this machine's NVML.
    p = hw.resolve_peaks(device_name="NVIDIA RTX PRO 6000 Blackwell")
    assert p.memory_bandwidth.source == "table" and p.memory_bandwidth_gb_s == 1792
    assert p.matmul_tflops == pytest.approx(503.8)


def test_unknown_remote_gpu_needs_a_parameter() -> None:
    with pytest.raises(ValueError, match="memory_bandwidth_gb_s"):
        hw.resolve_peaks(device_name="Mystery GPU", device="cuda", allow_nvml=False)
    with pytest.raises(ValueError, match="positive"):
        hw.resolve_peaks(memory_bandwidth_gb_s=-1)


def test_cpu_measured_copy_and_matmul(small_cpu_measurements: None) -> None:
    rates = hw.measure_copy_bandwidth("cpu", n_bytes=8 * 2**20, repeats=3, warmup=1)
    assert len(rates) == 3 and all(r > 1e8 for r in rates)  # any host copies faster than 0.1 GB/s
    p = hw.resolve_peaks(device="cpu")  # the real copy and matmul, on small sizes (conftest)
    assert p.memory_bandwidth.source == "measured" and "host" in p.memory_bandwidth.detail
    assert p.matmul is None or p.matmul.source == "measured"


def test_a_cpu_compute_peak_is_its_faster_dtype(monkeypatch: pytest.MonkeyPatch) -> None:
    # A CPU without bf16 units: bf16 0.9 GFLOPS against fp32 152 (measured on a 2-core host). The embedded server
    # computes in fp32; a bf16 peak made its compute floor 570 ms against a measured 210 ms step (a step at 0.37x its
    # floor), so the compute floor takes the faster dtype and stays a lower bound.
    asked: list[tuple[str, int]] = []

    def rate(device: str = "cpu", n: int = 0, repeats: int = 5, warmup: int = 2, dtype: str = "bfloat16") -> list[float]:
        asked.append((dtype, n))
        return [{"bfloat16": 0.9e9, "float32": 152e9}[dtype]] * repeats

    monkeypatch.setattr(hw, "measure_matmul_rate", rate)
    monkeypatch.setattr(hw, "measure_copy_bandwidth", lambda *a, **k: [2e10] * 5)
    p = hw.resolve_peaks(device="cpu")
    assert p.matmul_tflops == pytest.approx(0.152) and p.matmul.detail.startswith("float32 1024 x 1024 matmul on cpu")
    assert asked == [("bfloat16", 256), ("float32", 256), ("float32", 1024)]  # small probes, then the faster one
    monkeypatch.setattr(hw, "_cuda_name", lambda index=0: "a GPU not in the table")
    monkeypatch.setattr(hw, "nvml_memory_bandwidth", lambda index=0: None)
    asked.clear()
    hw.resolve_peaks(memory_bandwidth_gb_s=1000, device="cuda")
    assert asked == [("bfloat16", 8192)]  # a GPU's compute peak is bf16's


def test_peaks_from_record() -> None:
    p = hw.peaks_from_record({"gpu": "NVIDIA RTX PRO 6000 Blackwell", "memory_bandwidth_gb_s": 1792,
                              "memory_bandwidth_source": "spec", "matmul_bf16_tflops": 503.8})
    assert p.memory_bandwidth.source == "recorded" and p.memory_bandwidth_gb_s == 1792
    with pytest.raises(ValueError, match="memory_bandwidth_gb_s"):
        hw.peaks_from_record({})


@pytest.mark.gpu
def test_cuda_copy_and_nvml_agree_with_table() -> None:
    nvml = hw.nvml_memory_bandwidth(0)
    assert nvml is not None
    name, value, _ = nvml
    spec = hw.lookup_gpu(name)
    if spec is not None:
        assert value / 1e9 == pytest.approx(spec.memory_bandwidth_gb_s, rel=0.10)
    rates = hw.measure_copy_bandwidth("cuda", n_bytes=1 << 30, repeats=5)
    assert 0.3 * value < max(rates) < 1.05 * value  # a copy reaches a good share of the peak, never above it


def test_peaks_for_run_precedence(monkeypatch: pytest.MonkeyPatch) -> None:
    recorded = {"gpu": "NVIDIA RTX PRO 6000 Blackwell", "memory_bandwidth_gb_s": 1792, "memory_bandwidth_source": "spec",
                "matmul_bf16_tflops": 503.8}
    p = hw.peaks_for_run(recorded=recorded, server_url="http://gpu-host:30000")
    assert p.memory_bandwidth.source == "recorded" and p.memory_bandwidth_gb_s == 1792 and "spec" in p.memory_bandwidth.detail
    p = hw.peaks_for_run(memory_bandwidth_gb_s=1000, recorded=recorded)
    assert p.memory_bandwidth.source == "parameter" and p.matmul.source == "recorded"
    p = hw.peaks_for_run(gpu_name="NVIDIA H200", recorded=recorded)
    assert p.memory_bandwidth.source == "table" and p.memory_bandwidth_gb_s == 4800
    # What 00_snapshot writes (HardwarePeaks.as_dict plus context) reads back.
    snap = {**hw.HardwarePeaks("NVIDIA H200", hw.Peak(4.8e12, "nvml", "NVML detail"), None).as_dict(), "where": "x"}
    p = hw.peaks_for_run(recorded=snap, server_url="http://gpu-host:30000")
    assert p.device_name == "NVIDIA H200" and p.memory_bandwidth_gb_s == 4800 and "NVML detail" in p.memory_bandwidth.detail
    with pytest.raises(ValueError, match="gpu_name"):
        hw.peaks_for_run(server_url="http://gpu-host:30000")
    monkeypatch.setattr(hw, "measure_copy_bandwidth", lambda device="cpu", n_bytes=0, repeats=5, warmup=2: [2e10] * 5)
    monkeypatch.setattr(hw, "measure_matmul_rate", lambda device="cpu", n=0, repeats=5, warmup=2, dtype="bfloat16": [1e11] * 5)
    p = hw.peaks_for_run(server_info={"device": "cpu"}, server_url="http://127.0.0.1:1234")
    assert p.memory_bandwidth.source == "measured" and p.memory_bandwidth_gb_s == 20


def test_one_peak_per_run_whatever_notebook_asks_first(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    """00, 02 and 05 of one CPU run gave 13.1, 17 and 13.1 GB/s: each measured its own copy. The run's peak is now
    resolved once (a copy measured once), kept in run.json, and every later notebook reads the same figure with the
    source it was resolved from."""
    from specdiag.runs import Run
    from specdiag.steps.gpu_utilization.record import peak_bandwidth

    rates = iter([[13.1e9] * 5, [17.0e9] * 5, [15.0e9] * 5])  # each copy measured would give another figure
    monkeypatch.setattr(hw, "cuda_available", lambda: False)
    monkeypatch.setattr(hw, "measure_copy_bandwidth", lambda device="cpu", n_bytes=0, repeats=5, warmup=2: next(rates))
    monkeypatch.setattr(hw, "measure_matmul_rate", lambda device="cpu", n=0, repeats=5, warmup=2, dtype="bfloat16": [1e11] * 5)
    run = Run.create(tmp_path / "run")
    first = hw.run_peaks(run, server_info={"device": "cpu"}, server_url="http://127.0.0.1:30000")  # 00
    seen_02 = peak_bandwidth(run, {"kind": "cpu"}, None, 0.0, {"device": "cpu"}, "http://127.0.0.1:30000")  # 02
    again = hw.run_peaks(Run.open(run.path), server_url="http://127.0.0.1:30000")  # 05, a later kernel
    assert first.memory_bandwidth_gb_s == seen_02["memory_bandwidth_gb_s"] == again.memory_bandwidth_gb_s == 13.1
    assert again.memory_bandwidth.source == "measured" and again.memory_bandwidth.label.startswith("measured")
    assert run.meta["hardware"]["memory_bandwidth_gb_s"] == 13.1
    assert next(rates) == [17.0e9] * 5  # the second copy was never measured
    # a parameter that gives another figure wins, and is the run's figure from then on
    given = hw.run_peaks(run, memory_bandwidth_gb_s=50.0)
    assert given.memory_bandwidth.source == "parameter" and hw.run_peaks(run).memory_bandwidth_gb_s == 50.0
    # a remote GPU seen by 02's Prometheus telemetry is named by its device when the run has no peak yet
    remote = Run.create(tmp_path / "remote")
    hw_02 = peak_bandwidth(remote, {"kind": "prometheus"}, "NVIDIA H200", 0.0, {}, "http://gpu-host:30000")
    assert hw_02["memory_bandwidth_gb_s"] == 4800 and remote.meta["hardware"]["memory_bandwidth_source"] == "table"
    assert "error" in peak_bandwidth(Run.create(tmp_path / "none"), {"kind": "cpu"}, None, 0.0, {}, "http://gpu-host:1")


def test_nvml_gpu_facts_reads_nvml_and_says_why_not(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []
    fake = types.SimpleNamespace(
        nvmlInit=lambda: calls.append("init"), nvmlShutdown=lambda: calls.append("shutdown"),
        nvmlDeviceGetHandleByIndex=lambda i: f"h{i}", nvmlDeviceGetName=lambda h: b"NVIDIA H200",
        nvmlSystemGetDriverVersion=lambda: "580.95.05", nvmlDeviceGetCount=lambda: 1,
        nvmlDeviceGetMemoryInfo=lambda h: types.SimpleNamespace(total=150_754_820_096))
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    assert hw.nvml_gpu_facts() == {"gpu": "NVIDIA H200", "driver_version": "580.95.05", "gpu_count": 1,
                                         "gpu_memory_total_gib": 140.4}
    assert calls == ["init", "shutdown"]

    def broken() -> None:
        raise RuntimeError("NVML Shared Library Not Found")

    monkeypatch.setattr(fake, "nvmlInit", broken)
    assert hw.nvml_gpu_facts() == {"nvml_error": "RuntimeError: NVML Shared Library Not Found"}
