"""The Prometheus / DCGM exporter reader, against a fake HTTP session."""

from __future__ import annotations

from typing import Any

import pytest

from specdiag.telemetry.sampler import Sampler, TELEMETRY_FIELDS
from specdiag.telemetry.prometheus import PrometheusSource, parse_query_json, rows_from_samples

DCGM_TEXT = """\
# HELP DCGM_FI_DEV_GPU_UTIL GPU utilization (in %).
# TYPE DCGM_FI_DEV_GPU_UTIL gauge
DCGM_FI_DEV_GPU_UTIL{gpu="0",UUID="GPU-a",device="nvidia0",modelName="NVIDIA H200",Hostname="gpu-host"} 37
DCGM_FI_DEV_GPU_UTIL{gpu="1",UUID="GPU-b",device="nvidia1",modelName="NVIDIA H200",Hostname="gpu-host"} 0
DCGM_FI_DEV_SM_CLOCK{gpu="0",UUID="GPU-a",modelName="NVIDIA H200",Hostname="gpu-host"} 1980
DCGM_FI_DEV_POWER_USAGE{gpu="0",UUID="GPU-a",modelName="NVIDIA H200",Hostname="gpu-host"} 312.5
DCGM_FI_DEV_FB_USED{gpu="0",UUID="GPU-a",modelName="NVIDIA H200",Hostname="gpu-host"} 70123
DCGM_FI_PROF_SM_ACTIVE{gpu="0",UUID="GPU-a",modelName="NVIDIA H200",Hostname="gpu-host"} 0.061
DCGM_FI_PROF_DRAM_ACTIVE{gpu="0",UUID="GPU-a",modelName="NVIDIA H200",Hostname="gpu-host"} 0.0042
DCGM_FI_PROF_SM_OCCUPANCY{gpu="0",UUID="GPU-a",modelName="NVIDIA H200",Hostname="gpu-host"} 0.03
process_cpu_seconds_total 12.5
"""


class FakeResponse:
    def __init__(self, text: str = "", payload: Any = None, status: int = 200) -> None:
        self.text, self._payload, self.status_code = text, payload, status

    def raise_for_status(self) -> None:
        if self.status_code >= 400:
            raise RuntimeError(f"HTTP {self.status_code}")

    def json(self) -> Any:
        return self._payload


class FakeSession:
    def __init__(self, response: FakeResponse) -> None:
        self.response = response
        self.calls: list[tuple[str, Any]] = []

    def get(self, url: str, params: Any = None, timeout: float | None = None) -> FakeResponse:
        self.calls.append((url, params))
        return self.response


def test_dcgm_exporter_text_becomes_one_row_per_gpu() -> None:
    session = FakeSession(FakeResponse(DCGM_TEXT))
    source = PrometheusSource("http://gpu-host:9400/metrics", session=session)
    source.open()
    rows = source.sample()
    assert [r["device"] for r in rows] == ["gpu-host:0", "gpu-host:1"]
    gpu0 = rows[0]
    assert tuple(gpu0) == TELEMETRY_FIELDS
    assert gpu0["source"] == "prometheus" and gpu0["device_name"] == "NVIDIA H200"
    assert gpu0["gpu_util_pct"] == 37.0 and gpu0["sm_clock_mhz"] == 1980.0 and gpu0["power_w"] == 312.5
    assert gpu0["mem_used_mib"] == 70123.0
    # PROF fields are ratios 0..1; the table holds percent.
    assert gpu0["sm_active_pct"] == pytest.approx(6.1)
    assert gpu0["dram_bw_util_pct"] == pytest.approx(0.42)
    assert gpu0["sm_occupancy_pct"] == pytest.approx(3.0)
    assert rows[1]["sm_active_pct"] is None and rows[1]["gpu_util_pct"] == 0.0
    info = source.describe()
    assert "another host (gpu-host)" in info["location"]
    assert session.calls[0] == ("http://gpu-host:9400/metrics", None)


def test_gpu_indices_filter_and_rate_is_capped() -> None:
    source = PrometheusSource("http://gpu-host:9400/metrics", gpu_indices=[1],
                              session=FakeSession(FakeResponse(DCGM_TEXT)))
    source.open()
    assert [r["device"] for r in source.sample()] == ["gpu-host:1"]
    sampler = Sampler(source, rate_hz=50)
    assert sampler.rate_hz == 10.0


def test_prometheus_query_api_json() -> None:
    payload = {"status": "success", "data": {"resultType": "vector", "result": [
        {"metric": {"__name__": "DCGM_FI_PROF_DRAM_ACTIVE", "gpu": "3", "Hostname": "node7"}, "value": [1.7e9, "0.5"]},
        {"metric": {"__name__": "DCGM_FI_DEV_GPU_UTIL", "gpu": "3", "Hostname": "node7"}, "value": [1.7e9, "99"]},
    ]}}
    session = FakeSession(FakeResponse(payload=payload))
    source = PrometheusSource("http://prom:9090/api/v1/query", session=session)
    source.open()
    (row,) = source.sample()
    assert row["device"] == "node7:3" and row["dram_bw_util_pct"] == 50.0 and row["gpu_util_pct"] == 99.0
    assert "DCGM_FI_PROF_SM_ACTIVE" in session.calls[0][1]["query"]
    with pytest.raises(ValueError, match="bad_data"):
        parse_query_json({"status": "error", "error": "bad_data"})


def test_unreachable_or_unrelated_url_is_explained() -> None:
    with pytest.raises(RuntimeError, match="none of the DCGM fields"):
        PrometheusSource("http://host:9100/metrics", session=FakeSession(FakeResponse("node_load1 0.5\n"))).open()
    with pytest.raises(RuntimeError, match=r"could not read telemetry from http://host:9400/metrics.*HTTP 503"):
        PrometheusSource("http://host:9400/metrics", session=FakeSession(FakeResponse(status=503))).open()
    with pytest.raises(ValueError, match="http://gpu-host:9400/metrics"):
        PrometheusSource("gpu-host:9400")


def test_rows_from_samples_ignores_other_metrics() -> None:
    rows = rows_from_samples([("up", {}, 1.0), ("DCGM_FI_DEV_GPU_UTIL", {"gpu": "0"}, 5.0)], 1.0, "h")
    assert len(rows) == 1 and rows[0]["device"] == "h:0" and rows[0]["gpu_util_pct"] == 5.0
