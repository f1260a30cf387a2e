"""The telemetry sampler and the CPU fallback (real psutil), on this machine."""

from __future__ import annotations

import time
from typing import Any

import pytest

from specdiag.runs import Run
from specdiag.telemetry.sampler import TELEMETRY_FIELDS, CpuSource, Sampler, empty_row, open_source


class CountingSource:
    """A source whose n-th read returns n (and fails on the reads listed in ``fail_on``)."""

    kind = "fake"
    max_rate_hz = 1000.0

    def __init__(self, fail_on: tuple[int, ...] = ()) -> None:
        self.reads = 0
        self.fail_on = fail_on
        self.closed = False

    def open(self) -> None:
        return None

    def sample(self) -> list[dict[str, Any]]:
        self.reads += 1
        if self.reads in self.fail_on:
            raise OSError(f"read {self.reads} failed")
        row = empty_row(time.time(), self.kind, "0", "fake gpu")
        row["gpu_util_pct"] = float(self.reads)
        return [row]

    def close(self) -> None:
        self.closed = True

    def describe(self) -> dict[str, Any]:
        return {"kind": self.kind}


def test_cpu_source_rows_have_every_field_and_sane_values() -> None:
    source = open_source("cpu")
    assert isinstance(source, CpuSource)
    time.sleep(0.05)
    (row,) = source.sample()
    assert tuple(row) == TELEMETRY_FIELDS
    assert row["source"] == "cpu" and row["device"] == "cpu" and row["error"] is None
    assert isinstance(row["cpu_core_pct"], list) and len(row["cpu_core_pct"]) >= 1
    assert all(0.0 <= c <= 100.0 for c in row["cpu_core_pct"])
    assert row["cpu_util_pct"] == pytest.approx(sum(row["cpu_core_pct"]) / len(row["cpu_core_pct"]))
    assert row["mem_used_mib"] > 1.0
    assert abs(row["ts_unix_s"] - time.time()) < 5.0
    assert source.describe()["location"] == "this machine"


def test_cpu_source_sees_a_busy_core() -> None:
    source = open_source("cpu")
    t_end = time.perf_counter() + 0.3
    while time.perf_counter() < t_end:  # keep one core busy for 0.3 s
        pass
    (row,) = source.sample()
    assert max(row["cpu_core_pct"]) > 50.0, row["cpu_core_pct"]


def test_auto_falls_back_to_cpu_without_nvidia_driver() -> None:
    pytest.importorskip("pynvml")
    try:
        import pynvml

        pynvml.nvmlInit()
        pynvml.nvmlShutdown()
        pytest.skip("this machine has a working NVIDIA driver")
    except pynvml.NVMLError:
        pass
    assert open_source("auto").kind == "cpu"
    from specdiag.telemetry.nvml import NvmlUnavailable

    with pytest.raises(NvmlUnavailable, match="telemetry='cpu'"):
        open_source("nvml")


@pytest.mark.parametrize("bad", ["", "nvidia", "ftp://x", 3])
def test_open_source_rejects_unknown_choices(bad: Any) -> None:
    with pytest.raises(ValueError, match="telemetry must be"):
        open_source(bad)


def test_open_source_rejects_bad_gpu_indices() -> None:
    with pytest.raises(ValueError, match="gpu_indices"):
        open_source("cpu", gpu_indices=[-1])
    with pytest.raises(ValueError, match="gpu_indices"):
        open_source("cpu", gpu_indices="0")  # type: ignore[arg-type]


def test_sampler_rate_timestamps_and_sink(tmp_path: Any) -> None:
    run = Run.create(tmp_path / "run")
    source = CountingSource()
    t_before = time.time()
    with Sampler(source, rate_hz=100, sink=lambda r: run.append_row("telemetry", r)) as sampler:
        time.sleep(0.5)
    t_after = time.time()
    stats = sampler.stats()
    rows = sampler.rows
    # 100 Hz for 0.5 s is ~50 reads plus the closing one; allow a slow 2-core CI machine its jitter.
    assert 25 <= len(rows) <= 60, stats
    assert stats["ticks"] == len(rows) == source.reads
    assert stats["achieved_rate_hz"] > 50
    ts = [r["ts_unix_s"] for r in rows]
    assert ts == sorted(ts) and t_before <= ts[0] and ts[-1] <= t_after
    assert [r["gpu_util_pct"] for r in rows] == [float(i) for i in range(1, len(rows) + 1)]
    assert source.closed
    on_disk = run.rows("telemetry")
    assert [r["gpu_util_pct"] for r in on_disk] == [r["gpu_util_pct"] for r in rows]


def test_sampler_keeps_going_after_a_failed_read() -> None:
    source = CountingSource(fail_on=(2, 3))
    with Sampler(source, rate_hz=200) as sampler:
        time.sleep(0.1)
    errors = [r for r in sampler.rows if r["error"]]
    assert len(errors) == 2 and "read 2 failed" in errors[0]["error"]
    assert errors[0]["source"] == "fake" and errors[0]["device"] is None
    assert len(sampler.rows) > 4 and sampler.stats()["error_rows"] == 2


def test_sampler_reraises_a_failing_sink() -> None:
    def sink(_row: dict[str, Any]) -> None:
        raise OSError("disk full")

    with pytest.raises(RuntimeError, match="disk full"):
        with Sampler(CountingSource(), rate_hz=100, sink=sink):
            time.sleep(0.05)


def test_sampler_validates_rate_and_clamps_to_source_maximum() -> None:
    with pytest.raises(ValueError, match="rate_hz"):
        Sampler(CountingSource(), rate_hz=0)
    slow = CountingSource()
    slow.max_rate_hz = 10.0
    sampler = Sampler(slow, rate_hz=50)
    assert sampler.rate_hz == 10.0 and sampler.rate_hz_requested == 50.0


def test_sampler_counts_late_ticks_instead_of_bunching() -> None:
    class SlowSource(CountingSource):
        def sample(self) -> list[dict[str, Any]]:
            time.sleep(0.03)  # slower than the 100 Hz period
            return super().sample()

    with Sampler(SlowSource(), rate_hz=100) as sampler:
        time.sleep(0.3)
    stats = sampler.stats()
    assert stats["late_ticks"] > 0
    gaps = [b["ts_unix_s"] - a["ts_unix_s"] for a, b in zip(sampler.rows, sampler.rows[1:])]
    assert min(gaps[:-1]) > 0.02  # no burst of catch-up reads

