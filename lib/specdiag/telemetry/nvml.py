"""NVML telemetry source (pynvml from the ``nvidia-ml-py`` package): GPUs of this machine.

Per GPU and sample: utilization.gpu and utilization.memory (time fractions, see
:mod:`specdiag.telemetry.sampler`), SM and memory clocks, power, memory used; and on GPUs that support
GPM (Hopper and newer) SM activity, SM occupancy and DRAM bandwidth utilization.

GPM metrics are computed from two GPM samples; NVML's documentation asks for at least 100 ms
between them (its counters refresh at that rate), so GPM values are read at most every
``gpm_window_s`` (default 0.1 s) and appear on those rows only (None on the rows between).
"""

from __future__ import annotations

import socket
import time
from typing import Any

from specdiag.telemetry.rows import MIB, empty_row

#: GPM metric ids (nvml.h NVML_GPM_METRIC_*) and the telemetry column each fills.
GPM_METRICS: dict[str, int] = {"sm_active_pct": 2, "sm_occupancy_pct": 3, "dram_bw_util_pct": 10}


class NvmlUnavailable(RuntimeError):
    """NVML cannot be used here (no pynvml, no driver, no GPU); the message says which and the fix."""


def _decode(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class NvmlSource:
    """Sample GPUs ``gpu_indices`` (None: all) through NVML. ``nvml`` replaces the pynvml module."""

    kind = "nvml"
    max_rate_hz = 1000.0

    def __init__(self, gpu_indices: list[int] | None = None, nvml: Any = None, gpm: bool = True,
                 gpm_window_s: float = 0.1) -> None:
        self._nv = nvml
        self.gpu_indices = list(gpu_indices) if gpu_indices is not None else None
        self.use_gpm = gpm
        self.gpm_window_s = gpm_window_s
        self._handles: list[tuple[int, Any, str]] = []
        self._gpm: dict[int, dict[str, Any]] = {}  # index -> {"prev": sample, "cur": sample, "t": s}
        self._info: dict[str, Any] = {}
        self._opened = False

    # --- open / close ----------------------------------------------------------------------------
    def open(self) -> None:
        if self._nv is None:
            try:
                import pynvml  # noqa: PLC0415 - optional: absent on machines without NVIDIA tools
            except ImportError as exc:
                raise NvmlUnavailable("pynvml is not installed: pip install nvidia-ml-py "
                                      "(or use telemetry='cpu')") from exc
            self._nv = pynvml
        nv = self._nv
        try:
            nv.nvmlInit()
        except Exception as exc:  # NVMLError_LibraryNotFound, DriverNotLoaded, ...
            raise NvmlUnavailable(f"NVML could not start ({type(exc).__name__}: {exc}): no NVIDIA driver "
                                  f"on this machine? Use telemetry='cpu', or a DCGM exporter URL for "
                                  f"GPUs on another host") from exc
        self._opened = True
        count = int(nv.nvmlDeviceGetCount())
        if count == 0:
            self.close()
            raise NvmlUnavailable("NVML sees no GPU on this machine; use telemetry='cpu'")
        indices = self.gpu_indices if self.gpu_indices is not None else list(range(count))
        bad = [i for i in indices if not 0 <= i < count]
        if bad or not indices:
            self.close()
            raise ValueError(f"gpu_indices {indices} not on this machine: NVML sees {count} GPU(s), "
                             f"indices 0..{count - 1}")
        devices = []
        for i in indices:
            handle = nv.nvmlDeviceGetHandleByIndex(i)
            name = _decode(nv.nvmlDeviceGetName(handle))
            self._handles.append((i, handle, name))
            gpm_ok, gpm_why = self._open_gpm(i, handle)
            devices.append({
                "index": i,
                "name": name,
                "uuid": self._try(nv.nvmlDeviceGetUUID, handle, conv=_decode),
                "memory_total_mib": self._try(lambda h: nv.nvmlDeviceGetMemoryInfo(h).total / MIB, handle),
                "max_sm_clock_mhz": self._try(nv.nvmlDeviceGetMaxClockInfo, handle, nv.NVML_CLOCK_SM),
                "max_mem_clock_mhz": self._try(nv.nvmlDeviceGetMaxClockInfo, handle, nv.NVML_CLOCK_MEM),
                "memory_bus_width_bits": self._try(getattr(nv, "nvmlDeviceGetMemoryBusWidth", None), handle),
                "gpm_supported": gpm_ok,
                "gpm_note": gpm_why,
            })
        self._info = {
            "kind": self.kind,
            "host": socket.gethostname(),
            "location": "this machine",
            "driver_version": self._try(nv.nvmlSystemGetDriverVersion, conv=_decode),
            "nvml_version": self._try(getattr(nv, "nvmlSystemGetNVMLVersion", None), conv=_decode),
            "cuda_driver_version": self._try(getattr(nv, "nvmlSystemGetCudaDriverVersion", None)),
            "gpm_window_s": self.gpm_window_s,
            "devices": devices,
        }

    def _open_gpm(self, index: int, handle: Any) -> tuple[bool, str]:
        """Allocate two GPM sample buffers when the GPU supports GPM; (supported, why not)."""
        nv = self._nv
        if not self.use_gpm:
            return False, "GPM not asked for"
        if not hasattr(nv, "nvmlGpmQueryDeviceSupport"):
            return False, "this pynvml has no GPM functions (nvidia-ml-py >= 12 has them)"
        try:
            support = nv.nvmlGpmQueryDeviceSupport(handle)
            if not getattr(support, "isSupportedDevice", 0):
                return False, "the GPU does not support GPM (Hopper or newer does)"
            first, second = nv.nvmlGpmSampleAlloc(), nv.nvmlGpmSampleAlloc()
            nv.nvmlGpmSampleGet(handle, first)
        except Exception as exc:  # noqa: BLE001 - not supported is an answer, not an error
            return False, f"GPM unavailable: {type(exc).__name__}: {exc}"
        self._gpm[index] = {"prev": first, "spare": second, "t": time.perf_counter()}
        return True, ""

    def close(self) -> None:
        if not self._opened:
            return
        for state in self._gpm.values():
            for key in ("prev", "spare"):
                try:
                    self._nv.nvmlGpmSampleFree(state[key])
                except Exception:  # noqa: BLE001
                    pass
        self._gpm.clear()
        self._handles.clear()
        try:
            self._nv.nvmlShutdown()
        finally:
            self._opened = False

    def describe(self) -> dict[str, Any]:
        return dict(self._info)

    # --- sampling --------------------------------------------------------------------------------
    @staticmethod
    def _try(fn: Any, *args: Any, conv: Any = None) -> Any:
        if fn is None:
            return None
        try:
            value = fn(*args)
        except Exception:  # noqa: BLE001 - a field the GPU does not report stays None
            return None
        return conv(value) if conv is not None else value

    def sample(self) -> list[dict[str, Any]]:
        nv = self._nv
        rows = []
        for index, handle, name in self._handles:
            t0 = time.perf_counter()
            row = empty_row(time.time(), self.kind, str(index), name)
            failed: list[str] = []
            try:
                util = nv.nvmlDeviceGetUtilizationRates(handle)
                row["gpu_util_pct"], row["mem_util_pct"] = float(util.gpu), float(util.memory)
            except Exception as exc:  # noqa: BLE001
                failed.append(f"utilization: {exc}")
            for field, call in (
                ("sm_clock_mhz", lambda: nv.nvmlDeviceGetClockInfo(handle, nv.NVML_CLOCK_SM)),
                ("mem_clock_mhz", lambda: nv.nvmlDeviceGetClockInfo(handle, nv.NVML_CLOCK_MEM)),
                ("power_w", lambda: nv.nvmlDeviceGetPowerUsage(handle) / 1000.0),  # NVML gives mW
                ("mem_used_mib", lambda: nv.nvmlDeviceGetMemoryInfo(handle).used / MIB),
            ):
                try:
                    row[field] = float(call())
                except Exception as exc:  # noqa: BLE001
                    failed.append(f"{field}: {exc}")
            if index in self._gpm:
                err = self._sample_gpm(index, handle, row)
                if err:
                    failed.append(err)
            row["read_ms"] = (time.perf_counter() - t0) * 1e3
            # A field the GPU never reports is no error; every read failing is.
            if len(failed) >= 5:
                row["error"] = "; ".join(failed)
            rows.append(row)
        return rows

    def _restart_gpm_window(self, handle: Any, state: dict[str, Any], now: float) -> None:
        try:
            self._nv.nvmlGpmSampleGet(handle, state["prev"])
        except Exception:  # noqa: BLE001 - the next read reports it
            pass
        state["t"] = now

    def _sample_gpm(self, index: int, handle: Any, row: dict[str, Any]) -> str | None:
        """Fill the GPM columns when ``gpm_window_s`` has passed since the last GPM sample."""
        nv = self._nv
        state = self._gpm[index]
        now = time.perf_counter()
        if now - state["t"] < self.gpm_window_s:
            return None
        try:
            nv.nvmlGpmSampleGet(handle, state["spare"])
            request = nv.c_nvmlGpmMetricsGet_t()
            request.version = nv.NVML_GPM_METRICS_GET_VERSION
            request.numMetrics = len(GPM_METRICS)
            request.sample1, request.sample2 = state["prev"], state["spare"]
            for i, metric_id in enumerate(GPM_METRICS.values()):
                request.metrics[i].metricId = metric_id
            nv.nvmlGpmMetricsGet(request)
        except Exception as exc:  # noqa: BLE001 - start a fresh window next time
            self._restart_gpm_window(handle, state, now)
            return f"gpm: {type(exc).__name__}: {exc}"
        state["prev"], state["spare"] = state["spare"], state["prev"]
        row["gpm_window_s"] = now - state["t"]
        state["t"] = now
        for i, field in enumerate(GPM_METRICS):
            metric = request.metrics[i]
            if getattr(metric, "nvmlReturn", 0) == 0:
                row[field] = float(metric.value)
        return None
