"""The NVML source on a real GPU (skipped without CUDA): readings move when the GPU works."""

from __future__ import annotations

import time

import pytest

from specdiag.telemetry.sampler import Sampler, open_source


@pytest.mark.gpu
def test_nvml_sees_a_busy_gpu() -> None:
    torch = pytest.importorskip("torch")
    source = open_source("nvml", gpu_indices=[0])
    info = source.describe()
    assert info["devices"][0]["name"] and info["driver_version"]
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    with Sampler(source, rate_hz=50) as sampler:
        time.sleep(0.5)  # idle
        t_end = time.perf_counter() + 2.0
        while time.perf_counter() < t_end:
            for _ in range(20):
                a = (a @ a).clamp_(-1, 1)
            torch.cuda.synchronize()
        time.sleep(0.2)
    rows = [r for r in sampler.rows if not r["error"]]
    assert len(rows) >= 80, sampler.stats()
    assert max(r["gpu_util_pct"] for r in rows) >= 50
    assert all(r["mem_used_mib"] > 0 and r["power_w"] > 0 and r["sm_clock_mhz"] > 0 for r in rows)
    busy = [r for r in rows if r["ts_unix_s"] > rows[0]["ts_unix_s"] + 1.0]
    if info["devices"][0]["gpm_supported"]:
        gpm = [r["sm_active_pct"] for r in busy if r["sm_active_pct"] is not None]
        assert gpm and max(gpm) > 50, gpm
    print(sampler.stats(), info)
