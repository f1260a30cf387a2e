"""The CPU telemetry fallback (psutil): per-core busy percent, one row per sample."""

from __future__ import annotations

import socket
import time
from typing import Any

from specdiag.telemetry.rows import MIB, empty_row


class CpuSource:
    """The CPU fallback: per-core busy percent through psutil, one row per sample (device ``cpu``).

    ``psutil`` is injectable for tests. ``cpu_percent(percpu=True, interval=None)`` returns the busy
    percent of each core since the previous call, so :meth:`open` primes it once.
    """

    kind = "cpu"
    max_rate_hz = 200.0

    def __init__(self, psutil_module: Any = None) -> None:
        self._ps = psutil_module
        self._name: str | None = None

    def open(self) -> None:
        if self._ps is None:
            try:
                import psutil  # noqa: PLC0415 - optional at import time
            except ImportError as exc:  # pragma: no cover - psutil is a dependency
                raise RuntimeError("the CPU telemetry fallback needs psutil: pip install psutil") from exc
            self._ps = psutil
        self._ps.cpu_percent(percpu=True, interval=None)
        self._name = f"{self._ps.cpu_count(logical=True)} logical cores"

    def sample(self) -> list[dict[str, Any]]:
        t0 = time.perf_counter()
        row = empty_row(time.time(), "cpu", "cpu", self._name)
        cores = [float(c) for c in self._ps.cpu_percent(percpu=True, interval=None)]
        row["cpu_core_pct"] = cores
        row["cpu_util_pct"] = sum(cores) / len(cores) if cores else None
        row["mem_used_mib"] = self._ps.virtual_memory().used / MIB
        row["read_ms"] = (time.perf_counter() - t0) * 1e3
        return [row]

    def close(self) -> None:
        return None

    def describe(self) -> dict[str, Any]:
        return {"kind": self.kind, "host": socket.gethostname(), "location": "this machine",
                "devices": [{"device": "cpu", "name": self._name}]}
