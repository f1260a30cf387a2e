"""The NVML source against a fake pynvml module put in sys.modules (the boundary), GPM on and off."""

from __future__ import annotations

import sys
import time
import types
from typing import Any

import pytest

from specdiag.telemetry.sampler import TELEMETRY_FIELDS, Sampler, open_source
from specdiag.telemetry.nvml import GPM_METRICS, NvmlSource, NvmlUnavailable


class NVMLError(Exception):
    pass


class _Metric:
    def __init__(self) -> None:
        self.metricId = 0
        self.nvmlReturn = 0
        self.value = 0.0


class _MetricsGet:
    def __init__(self) -> None:
        self.version = 0
        self.numMetrics = 0
        self.sample1: Any = None
        self.sample2: Any = None
        self.metrics = [_Metric() for _ in range(16)]


def make_fake_nvml(n_gpus: int = 2, gpm: str = "supported", init_error: bool = False) -> types.ModuleType:
    """A pynvml stand-in. gpm: 'supported', 'unsupported' (isSupportedDevice=0), 'raises'
    (nvmlGpmQueryDeviceSupport raises, as on pre-Hopper GPUs), 'absent' (an old pynvml)."""
    nv = types.ModuleType("pynvml")
    nv.NVMLError = NVMLError
    nv.NVML_CLOCK_SM, nv.NVML_CLOCK_MEM = 1, 2
    nv.NVML_GPM_METRICS_GET_VERSION = 1
    nv.calls = {"init": 0, "shutdown": 0, "gpm_get": 0, "freed": 0, "metrics_get": []}
    util = {i: 10.0 * (i + 1) for i in range(n_gpus)}
    nv.util = util

    def nvmlInit() -> None:
        if init_error:
            raise NVMLError("Driver Not Loaded")
        nv.calls["init"] += 1

    nv.nvmlInit = nvmlInit
    nv.nvmlShutdown = lambda: nv.calls.__setitem__("shutdown", nv.calls["shutdown"] + 1)
    nv.nvmlDeviceGetCount = lambda: n_gpus
    nv.nvmlDeviceGetHandleByIndex = lambda i: ("handle", i)
    nv.nvmlDeviceGetName = lambda h: b"NVIDIA H200"
    nv.nvmlDeviceGetUUID = lambda h: f"GPU-fake-{h[1]}"
    nv.nvmlSystemGetDriverVersion = lambda: "580.159.04"
    nv.nvmlDeviceGetMemoryInfo = lambda h: types.SimpleNamespace(total=143771 * 2**20, used=(1000 + h[1]) * 2**20)
    nv.nvmlDeviceGetMaxClockInfo = lambda h, kind: {1: 1980, 2: 3201}[kind]
    nv.nvmlDeviceGetClockInfo = lambda h, kind: {1: 1755, 2: 3201}[kind]
    nv.nvmlDeviceGetPowerUsage = lambda h: 123_456  # mW

    def nvmlDeviceGetMemoryBusWidth(h: Any) -> int:
        raise NVMLError("Not Supported")

    nv.nvmlDeviceGetMemoryBusWidth = nvmlDeviceGetMemoryBusWidth
    nv.nvmlDeviceGetUtilizationRates = lambda h: types.SimpleNamespace(gpu=util[h[1]], memory=util[h[1]] / 2)
    if gpm == "absent":
        return nv

    def nvmlGpmQueryDeviceSupport(h: Any) -> Any:
        if gpm == "raises":
            raise NVMLError("Not Supported")
        return types.SimpleNamespace(version=1, isSupportedDevice=1 if gpm == "supported" else 0)

    def nvmlGpmSampleAlloc() -> dict[str, Any]:
        return {"t": None, "dev": None}

    def nvmlGpmSampleGet(h: Any, sample: dict[str, Any]) -> dict[str, Any]:
        nv.calls["gpm_get"] += 1
        sample["t"], sample["dev"] = time.perf_counter(), h[1]
        return sample

    def nvmlGpmMetricsGet(req: _MetricsGet) -> _MetricsGet:
        assert req.version == 1 and req.sample1 is not req.sample2
        assert req.sample2["t"] > req.sample1["t"] and req.sample1["dev"] == req.sample2["dev"]
        ids = [req.metrics[i].metricId for i in range(req.numMetrics)]
        nv.calls["metrics_get"].append(ids)
        dev = req.sample2["dev"]
        values = {2: 40.0 + dev, 3: 12.5, 10: 7.25 + dev}
        for i in range(req.numMetrics):
            m = req.metrics[i]
            m.value = values[m.metricId]
        return req

    nv.nvmlGpmQueryDeviceSupport = nvmlGpmQueryDeviceSupport
    nv.nvmlGpmSampleAlloc = nvmlGpmSampleAlloc
    nv.nvmlGpmSampleGet = nvmlGpmSampleGet
    nv.nvmlGpmSampleFree = lambda s: nv.calls.__setitem__("freed", nv.calls["freed"] + 1)
    nv.nvmlGpmMetricsGet = nvmlGpmMetricsGet
    nv.c_nvmlGpmMetricsGet_t = _MetricsGet
    return nv


@pytest.fixture
def fake_pynvml(monkeypatch: pytest.MonkeyPatch) -> types.ModuleType:
    nv = make_fake_nvml()
    monkeypatch.setitem(sys.modules, "pynvml", nv)
    return nv


def test_auto_picks_nvml_through_the_imported_module(fake_pynvml: types.ModuleType) -> None:
    source = open_source("auto")
    assert source.kind == "nvml"
    info = source.describe()
    assert info["driver_version"] == "580.159.04" and info["location"] == "this machine"
    assert [d["index"] for d in info["devices"]] == [0, 1]
    dev = info["devices"][0]
    assert dev["name"] == "NVIDIA H200" and dev["uuid"] == "GPU-fake-0"
    assert dev["memory_total_mib"] == pytest.approx(143771)
    assert dev["max_mem_clock_mhz"] == 3201 and dev["memory_bus_width_bits"] is None
    assert dev["gpm_supported"] is True
    source.close()
    assert fake_pynvml.calls["shutdown"] == 1 and fake_pynvml.calls["freed"] == 4


def test_rows_carry_units_and_gpm_after_its_window(fake_pynvml: types.ModuleType) -> None:
    source = open_source("nvml", gpu_indices=[1])
    first = source.sample()
    assert len(first) == 1
    row = first[0]
    assert tuple(row) == TELEMETRY_FIELDS
    assert row["device"] == "1" and row["source"] == "nvml" and row["error"] is None
    assert row["gpu_util_pct"] == 20.0 and row["mem_util_pct"] == 10.0
    assert row["sm_clock_mhz"] == 1755.0 and row["mem_clock_mhz"] == 3201.0
    assert row["power_w"] == pytest.approx(123.456)  # NVML reports milliwatts
    assert row["mem_used_mib"] == pytest.approx(1001.0)
    # GPM needs >= 100 ms between its two samples: not yet on the first read.
    assert row["sm_active_pct"] is None and row["gpm_window_s"] is None
    time.sleep(0.11)
    (later,) = source.sample()
    assert later["sm_active_pct"] == 41.0 and later["sm_occupancy_pct"] == 12.5
    assert later["dram_bw_util_pct"] == 8.25 and later["gpm_window_s"] >= 0.1
    assert fake_pynvml.calls["metrics_get"] == [list(GPM_METRICS.values())]
    (soon,) = source.sample()
    assert soon["sm_active_pct"] is None  # the next window is still open
    source.close()


@pytest.mark.parametrize("mode", ["unsupported", "raises", "absent"])
def test_gpm_unsupported_leaves_gpm_columns_empty(monkeypatch: pytest.MonkeyPatch, mode: str) -> None:
    nv = make_fake_nvml(n_gpus=1, gpm=mode)
    monkeypatch.setitem(sys.modules, "pynvml", nv)
    source = open_source("nvml")
    dev = source.describe()["devices"][0]
    assert dev["gpm_supported"] is False and dev["gpm_note"]
    rows = source.sample()
    time.sleep(0.11)
    rows += source.sample()
    assert all(r["sm_active_pct"] is None and r["dram_bw_util_pct"] is None for r in rows)
    assert all(r["gpu_util_pct"] == 10.0 and r["error"] is None for r in rows)
    source.close()


def test_no_driver_auto_falls_back_and_nvml_explains(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", make_fake_nvml(init_error=True))
    assert open_source("auto").kind == "cpu"
    with pytest.raises(NvmlUnavailable, match="Driver Not Loaded.*telemetry='cpu'"):
        open_source("nvml")


def test_no_gpu_and_bad_index_are_explained(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", make_fake_nvml(n_gpus=0))
    assert open_source("auto").kind == "cpu"
    nv = make_fake_nvml(n_gpus=2)
    monkeypatch.setitem(sys.modules, "pynvml", nv)
    with pytest.raises(ValueError, match=r"gpu_indices \[3\].*2 GPU\(s\), indices 0..1"):
        open_source("nvml", gpu_indices=[3])
    assert nv.calls["shutdown"] == 1


def test_a_failing_device_read_is_a_row_error_not_a_crash() -> None:
    nv = make_fake_nvml(n_gpus=1, gpm="unsupported")

    def broken(*_a: Any) -> Any:
        raise NVMLError("GPU is lost")

    source = NvmlSource(nvml=nv)
    source.open()
    for name in ("nvmlDeviceGetUtilizationRates", "nvmlDeviceGetClockInfo", "nvmlDeviceGetPowerUsage",
                 "nvmlDeviceGetMemoryInfo"):
        setattr(nv, name, broken)
    (row,) = source.sample()
    assert "GPU is lost" in row["error"] and row["gpu_util_pct"] is None


def test_sampler_over_fake_nvml_two_gpus(fake_pynvml: types.ModuleType) -> None:
    with Sampler(open_source("nvml"), rate_hz=50) as sampler:
        time.sleep(0.35)
    rows = sampler.rows
    assert {r["device"] for r in rows} == {"0", "1"}
    per_gpu = [r for r in rows if r["device"] == "0"]
    assert len(per_gpu) >= 8
    gpm_rows = [r for r in per_gpu if r["sm_active_pct"] is not None]
    # 0.35 s at one GPM window per 0.1 s: 2 or 3 windows, never one per 20 ms sample.
    assert 1 <= len(gpm_rows) <= 4 and all(r["sm_active_pct"] == 40.0 for r in gpm_rows)
    assert fake_pynvml.calls["shutdown"] == 1
