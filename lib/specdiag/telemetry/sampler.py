"""Device telemetry: a background sampler over NVML, the CPU (psutil) or a Prometheus/DCGM URL.

One row per sample per device, every row stamped with ``time.time()`` (unix seconds), the same
clock as the client's ``RequestTrace.t_send_unix_s``, so a request's chunk times
(``t_send_unix_s + chunk_t_s[i]``) and the samples line up on one axis::

    source = telemetry.open_source("auto", gpu_indices=[0])
    with telemetry.Sampler(source, rate_hz=50, sink=lambda r: run.append_row("telemetry", r)) as s:
        trace = client.generate(input_ids=ids, sampling_params=...)
    s.rows, s.stats()

What each number means (read this before reading a timeline):

- ``gpu_util_pct`` (NVML ``utilization.gpu``, DCGM_FI_DEV_GPU_UTIL): percent of the driver's last
  sample period (1/6 s to 1 s depending on the product) during which *at least one kernel was
  running*. It is a time fraction, not SM occupancy: one tiny kernel on one SM reads 100 %.
- ``mem_util_pct`` (NVML ``utilization.memory``, DCGM_FI_DEV_MEM_COPY_UTIL): percent of the same
  period during which device memory was being read or written; also a time fraction, not bandwidth.
- ``sm_active_pct`` (NVML GPM SM_UTIL, DCGM_FI_PROF_SM_ACTIVE x 100): percent of SMs busy, averaged
  over the GPM window; Hopper and newer only.
- ``sm_occupancy_pct`` (GPM SM_OCCUPANCY, DCGM_FI_PROF_SM_OCCUPANCY x 100): resident warps against
  the maximum.
- ``dram_bw_util_pct`` (GPM DRAM_BW_UTIL, DCGM_FI_PROF_DRAM_ACTIVE x 100): DRAM bandwidth used
  against the theoretical maximum: the number to set beside a bandwidth analysis.
- ``cpu_util_pct`` / ``cpu_core_pct`` (psutil, CPU fallback): busy percent of all cores / each core
  since the previous sample. Linux counts CPU time in 10 ms ticks, so at 50 Hz one core's value moves
  in steps of about 50 %; medians over a phase are meaningful, single samples are not.

The sources live in :mod:`specdiag.telemetry.nvml`, :mod:`specdiag.telemetry.prometheus` and
:mod:`specdiag.telemetry.cpu` (the CPU fallback); the row contract (columns, ``empty_row``, the source protocol) in
:mod:`specdiag.telemetry.rows`, which the sources import instead of this module (no import loop).
"""

from __future__ import annotations

import queue
import threading
import time
from typing import Any, Callable

from specdiag.telemetry.cpu import CpuSource  # noqa: F401 - re-exported: open_source("cpu") and callers
from specdiag.telemetry.nvml import NvmlSource, NvmlUnavailable
from specdiag.telemetry.prometheus import PrometheusSource
from specdiag.telemetry.rows import (  # noqa: F401
    METRIC_FIELDS,
    MIB,
    TELEMETRY_FIELDS,
    TelemetrySource,
    empty_row,
)


def open_source(telemetry: str = "auto", gpu_indices: list[int] | None = None, nvml: Any = None,
                psutil_module: Any = None) -> TelemetrySource:
    """The source named by the notebook parameter ``telemetry``, opened and ready to sample.

    - ``"auto"``: NVML when pynvml loads and sees at least one GPU, else the CPU fallback.
    - ``"nvml"``: NVML, or a clear error saying why not.
    - ``"cpu"``: the CPU fallback (psutil).
    - ``"http://host:9400/metrics"`` (a DCGM exporter or any Prometheus text endpoint) or
      ``"http://prom:9090/api/v1/query"`` (a Prometheus server): GPUs on another host.

    ``nvml`` and ``psutil_module`` replace the real modules (tests pass fakes).
    """
    if not isinstance(telemetry, str) or not telemetry:
        raise ValueError(f"telemetry must be 'auto', 'nvml', 'cpu' or a Prometheus URL; got {telemetry!r}")
    if gpu_indices is not None and (not isinstance(gpu_indices, (list, tuple))
                                    or not all(isinstance(i, int) and i >= 0 for i in gpu_indices)):
        raise ValueError(f"gpu_indices must be a list of GPU indices like [0] or None for all; got {gpu_indices!r}")
    choice = telemetry.strip()
    source: TelemetrySource
    if choice.startswith(("http://", "https://")):
        source = PrometheusSource(choice, gpu_indices=gpu_indices)
    elif choice == "nvml":
        source = NvmlSource(gpu_indices=gpu_indices, nvml=nvml)
    elif choice == "cpu":
        source = CpuSource(psutil_module)
    elif choice == "auto":
        candidate = NvmlSource(gpu_indices=gpu_indices, nvml=nvml)
        try:
            candidate.open()
            return candidate
        except NvmlUnavailable:
            source = CpuSource(psutil_module)
    else:
        raise ValueError(f"telemetry must be 'auto', 'nvml', 'cpu' or a Prometheus URL (http://...); got {telemetry!r}")
    source.open()
    return source


class Sampler:
    """Sample ``source`` on a background thread at ``rate_hz`` while the ``with`` block runs.

    Ticks are scheduled on a fixed grid (``t0 + k / rate_hz``); a tick that falls behind is
    skipped and counted in ``stats()["late_ticks"]`` rather than bunched. A sample is also taken
    at entry and at exit, so the window covers the whole block. Rows go to ``self.rows`` and, through
    a second thread so disk latency never delays sampling, to ``sink(row)`` (for instance
    ``lambda r: run.append_row("telemetry", r)``). A failing read becomes a row with ``error`` set;
    sampling goes on. An exception raised by ``sink`` is re-raised when the block exits.

    ``rate_hz`` above the source's ``max_rate_hz`` is lowered to it (a Prometheus exporter only
    refreshes every second or so); ``stats()`` says which rate was used.
    """

    def __init__(self, source: TelemetrySource, rate_hz: float = 50.0,
                 sink: Callable[[dict[str, Any]], None] | None = None) -> None:
        if not isinstance(rate_hz, (int, float)) or not rate_hz > 0:
            raise ValueError(f"rate_hz must be a positive number of samples per second, e.g. 50; got {rate_hz!r}")
        self.source = source
        self.rate_hz_requested = float(rate_hz)
        self.rate_hz = min(float(rate_hz), float(getattr(source, "max_rate_hz", rate_hz)))
        self.sink = sink
        self.rows: list[dict[str, Any]] = []
        self._stop = threading.Event()
        self._queue: queue.Queue[dict[str, Any] | None] = queue.Queue()
        self._thread: threading.Thread | None = None
        self._writer: threading.Thread | None = None
        self._sink_error: BaseException | None = None
        self._ticks = 0
        self._late_ticks = 0
        self._t_start_unix_s: float | None = None
        self._t_stop_unix_s: float | None = None

    # --- lifecycle ----------------------------------------------------------------------------
    def __enter__(self) -> "Sampler":
        self.start()
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        self.stop()
        if self._sink_error is not None and exc_type is None:
            raise RuntimeError(f"writing telemetry rows failed: {self._sink_error}") from self._sink_error

    def start(self) -> None:
        if self._thread is not None:
            raise RuntimeError("this Sampler was already started; make a new one for another window")
        self._t_start_unix_s = time.time()
        self._writer = threading.Thread(target=self._write_loop, name="telemetry-writer", daemon=True)
        self._writer.start()
        self._thread = threading.Thread(target=self._sample_loop, name="telemetry-sampler", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        if self._thread is None or self._stop.is_set():
            return
        self._stop.set()
        self._thread.join()
        self._tick()  # the closing sample
        self._t_stop_unix_s = time.time()
        self._queue.put(None)
        if self._writer is not None:
            self._writer.join()
        try:
            self.source.close()
        except Exception:  # noqa: BLE001 - closing must not hide the measurement
            pass

    # --- threads ------------------------------------------------------------------------------
    def _tick(self) -> None:
        try:
            rows = self.source.sample()
        except Exception as exc:  # noqa: BLE001 - a failed read is a row, sampling goes on
            row = empty_row(time.time(), self.source.kind, None)
            row["error"] = f"{type(exc).__name__}: {exc}"
            rows = [row]
        self._ticks += 1
        for row in rows:
            self.rows.append(row)
            if self.sink is not None:
                self._queue.put(row)

    def _sample_loop(self) -> None:
        period_s = 1.0 / self.rate_hz
        t0 = time.perf_counter()
        k = 0
        while not self._stop.is_set():
            self._tick()
            k += 1
            next_t = t0 + k * period_s
            now = time.perf_counter()
            if now > next_t:  # fell behind: skip the ticks already past, count them
                missed = int((now - next_t) // period_s) + 1
                self._late_ticks += missed
                k += missed
                next_t = t0 + k * period_s
            self._stop.wait(max(0.0, next_t - time.perf_counter()))

    def _write_loop(self) -> None:
        while True:
            row = self._queue.get()
            if row is None:
                return
            if self._sink_error is not None or self.sink is None:
                continue
            try:
                self.sink(row)
            except Exception as exc:  # noqa: BLE001 - re-raised in __exit__
                self._sink_error = exc

    # --- results ------------------------------------------------------------------------------
    def stats(self) -> dict[str, Any]:
        """How the sampling went: requested and used rate, achieved rate, ticks late, errors."""
        start = self._t_start_unix_s
        end = self._t_stop_unix_s or time.time()
        duration_s = (end - start) if start else 0.0
        reads = [r["read_ms"] for r in self.rows if r.get("read_ms") is not None]
        return {
            "source": self.source.kind,
            "rate_hz_requested": self.rate_hz_requested,
            "rate_hz_used": self.rate_hz,
            "ticks": self._ticks,
            "rows": len(self.rows),
            "duration_s": duration_s,
            "achieved_rate_hz": (self._ticks - 1) / duration_s if duration_s > 0 and self._ticks > 1 else None,
            "late_ticks": self._late_ticks,
            "error_rows": sum(1 for r in self.rows if r.get("error")),
            "read_ms_median": sorted(reads)[len(reads) // 2] if reads else None,
            "t_start_unix_s": start,
            "t_stop_unix_s": self._t_stop_unix_s,
        }
