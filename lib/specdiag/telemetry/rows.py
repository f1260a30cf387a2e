"""The ``telemetry`` row contract: its columns, an empty row, and what a source must provide.

Imported by the sampler (:mod:`specdiag.telemetry.sampler`) and by every source (:mod:`specdiag.telemetry.nvml`,
:mod:`specdiag.telemetry.prometheus`, the CPU fallback), so the sources never import the sampler:
telemetry -> telemetry_nvml / telemetry_prometheus -> telemetry_rows. What each column means:
:mod:`specdiag.telemetry.sampler`'s docstring.
"""

from __future__ import annotations

from typing import Any, Protocol

#: The columns of the ``telemetry`` table, in order. Fields a source cannot read are None.
TELEMETRY_FIELDS: tuple[str, ...] = (
    "ts_unix_s",  # time.time() when the sample was taken (unix seconds)
    "source",  # "nvml" | "cpu" | "prometheus"
    "device",  # "0", "1", ... (NVML index), "cpu", or "<host>:<gpu>" (Prometheus)
    "device_name",  # e.g. "NVIDIA H200"
    "gpu_util_pct",  # time fraction with a kernel running, percent (NVML utilization.gpu)
    "mem_util_pct",  # time fraction with device memory read or written, percent (utilization.memory)
    "sm_clock_mhz",
    "mem_clock_mhz",
    "power_w",
    "mem_used_mib",  # device memory used (GPU) or host memory used (CPU), MiB
    "sm_active_pct",  # GPM SM_UTIL / DCGM_FI_PROF_SM_ACTIVE, percent of SMs busy
    "sm_occupancy_pct",  # GPM SM_OCCUPANCY / DCGM_FI_PROF_SM_OCCUPANCY, percent
    "dram_bw_util_pct",  # GPM DRAM_BW_UTIL / DCGM_FI_PROF_DRAM_ACTIVE, percent of peak DRAM bandwidth
    "gpm_window_s",  # seconds between the two GPM samples the GPM values were computed from
    "cpu_util_pct",  # mean busy percent over all cores (CPU fallback)
    "cpu_core_pct",  # list: busy percent of each core (CPU fallback)
    "read_ms",  # how long reading this device took, milliseconds (the sampler's own cost)
    "error",  # None when fine, else what failed
)

#: Numeric columns a timeline or a phase summary can use.
METRIC_FIELDS: tuple[str, ...] = (
    "gpu_util_pct", "mem_util_pct", "sm_active_pct", "sm_occupancy_pct", "dram_bw_util_pct",
    "sm_clock_mhz", "mem_clock_mhz", "power_w", "mem_used_mib", "cpu_util_pct",
)

MIB = 1024 * 1024


def empty_row(ts_unix_s: float, source: str, device: str | None, device_name: str | None = None) -> dict[str, Any]:
    """A telemetry row with every field present and None where not read."""
    row: dict[str, Any] = dict.fromkeys(TELEMETRY_FIELDS)
    row.update(ts_unix_s=ts_unix_s, source=source, device=device, device_name=device_name)
    return row


class TelemetrySource(Protocol):
    """What the :class:`Sampler` needs from a source of device readings."""

    kind: str  # "nvml" | "cpu" | "prometheus"
    max_rate_hz: float  # the fastest rate worth polling this source at

    def open(self) -> None: ...

    def sample(self) -> list[dict[str, Any]]: ...

    def close(self) -> None: ...

    def describe(self) -> dict[str, Any]: ...
