"""Prometheus / DCGM exporter telemetry source: GPUs on another host.

Two kinds of URL:

- a text endpoint, e.g. a DCGM exporter ``http://gpu-host:9400/metrics`` (Prometheus text format);
- a Prometheus server's instant-query API, ``http://prom:9090/api/v1/query`` (JSON); without a
  ``query=`` the source asks for every DCGM field it knows.

DCGM fields read (dcgm-exporter names; PROF fields are ratios 0..1 and become percent):
DCGM_FI_DEV_GPU_UTIL (%), DCGM_FI_DEV_MEM_COPY_UTIL (%), DCGM_FI_DEV_SM_CLOCK (MHz),
DCGM_FI_DEV_MEM_CLOCK (MHz), DCGM_FI_DEV_POWER_USAGE (W), DCGM_FI_DEV_FB_USED (MiB),
DCGM_FI_PROF_SM_ACTIVE, DCGM_FI_PROF_SM_OCCUPANCY, DCGM_FI_PROF_DRAM_ACTIVE (ratios).

The exporter refreshes its values at its own collection interval (dcgm-exporter's ``-c``, often
1-30 s), so rows between refreshes repeat the same values: look at the exporter's interval before
reading fine structure into a remote timeline. ``max_rate_hz`` is 10.
"""

from __future__ import annotations

import time
from typing import Any
from urllib.parse import parse_qs, urlparse

from specdiag.speculation.scrapes import parse_prometheus
from specdiag.telemetry.rows import empty_row

#: dcgm-exporter metric name -> (telemetry column, factor to the column's unit)
DCGM_FIELDS: dict[str, tuple[str, float]] = {
    "DCGM_FI_DEV_GPU_UTIL": ("gpu_util_pct", 1.0),
    "DCGM_FI_DEV_MEM_COPY_UTIL": ("mem_util_pct", 1.0),
    "DCGM_FI_DEV_SM_CLOCK": ("sm_clock_mhz", 1.0),
    "DCGM_FI_DEV_MEM_CLOCK": ("mem_clock_mhz", 1.0),
    "DCGM_FI_DEV_POWER_USAGE": ("power_w", 1.0),
    "DCGM_FI_DEV_FB_USED": ("mem_used_mib", 1.0),
    "DCGM_FI_PROF_SM_ACTIVE": ("sm_active_pct", 100.0),
    "DCGM_FI_PROF_SM_OCCUPANCY": ("sm_occupancy_pct", 100.0),
    "DCGM_FI_PROF_DRAM_ACTIVE": ("dram_bw_util_pct", 100.0),
}

def parse_text(text: str) -> list[tuple[str, dict[str, str], float]]:
    """Prometheus text exposition -> [(metric name, labels, value)] (through ``spec.parse_prometheus``)."""
    return [(name, labels, value) for name, series in parse_prometheus(text).items() for labels, value in series]


def parse_query_json(payload: dict[str, Any]) -> list[tuple[str, dict[str, str], float]]:
    """A Prometheus ``/api/v1/query`` vector result -> [(metric name, labels, value)]."""
    if payload.get("status") != "success":
        raise ValueError(f"Prometheus answered {payload.get('status')!r}: {payload.get('error', '')}")
    out = []
    for item in payload.get("data", {}).get("result", []):
        labels = dict(item.get("metric", {}))
        name = labels.pop("__name__", "")
        try:
            value = float(item["value"][1])
        except (KeyError, IndexError, TypeError, ValueError):
            continue
        out.append((name, labels, value))
    return out


def _gpu_key(labels: dict[str, str], default_host: str) -> tuple[str, str, str | None]:
    host = labels.get("Hostname") or labels.get("hostname") or labels.get("instance") or default_host
    gpu = labels.get("gpu") or labels.get("GPU_I_ID") or labels.get("UUID") or "?"
    return host, gpu, labels.get("modelName")


def rows_from_samples(samples: list[tuple[str, dict[str, str], float]], ts_unix_s: float, default_host: str,
                      gpu_indices: list[int] | None = None) -> list[dict[str, Any]]:
    """Group DCGM samples into one telemetry row per (host, gpu); other metrics are ignored."""
    rows: dict[tuple[str, str], dict[str, Any]] = {}
    for name, labels, value in samples:
        if name not in DCGM_FIELDS:
            continue
        host, gpu, model = _gpu_key(labels, default_host)
        if gpu_indices is not None and gpu.isdigit() and int(gpu) not in gpu_indices:
            continue
        row = rows.setdefault((host, gpu), empty_row(ts_unix_s, "prometheus", f"{host}:{gpu}", model))
        column, factor = DCGM_FIELDS[name]
        row[column] = value * factor
    return [rows[k] for k in sorted(rows)]


class PrometheusSource:
    """Poll ``url`` (DCGM exporter text or Prometheus query API) for GPU telemetry of another host."""

    kind = "prometheus"
    max_rate_hz = 10.0

    def __init__(self, url: str, gpu_indices: list[int] | None = None, session: Any = None,
                 timeout_s: float = 2.0) -> None:
        parsed = urlparse(url)
        if parsed.scheme not in ("http", "https") or not parsed.netloc:
            raise ValueError(f"telemetry URL must look like http://gpu-host:9400/metrics; got {url!r}")
        self.url = url
        self.host = parsed.hostname or parsed.netloc
        self.query_api = "/api/v1/query" in parsed.path
        self.params: dict[str, str] = {}
        if self.query_api and "query" not in parse_qs(parsed.query):
            self.params["query"] = '{__name__=~"' + "|".join(DCGM_FIELDS) + '"}'
        self.gpu_indices = gpu_indices
        self.timeout_s = timeout_s
        self._session = session
        self._devices: list[dict[str, Any]] = []

    def _fetch(self) -> list[tuple[str, dict[str, str], float]]:
        resp = self._session.get(self.url, params=self.params or None, timeout=self.timeout_s)
        resp.raise_for_status()
        if self.query_api:
            return parse_query_json(resp.json())
        return parse_text(resp.text)

    def open(self) -> None:
        if self._session is None:
            import requests  # noqa: PLC0415 - live only: replay loads no server code

            self._session = requests.Session()
        try:
            samples = self._fetch()
        except Exception as exc:  # noqa: BLE001 - reported with the URL and the fix
            raise RuntimeError(f"could not read telemetry from {self.url}: {type(exc).__name__}: {exc}. "
                               f"Check the exporter runs there (dcgm-exporter listens on :9400/metrics) "
                               f"or use telemetry='auto'") from exc
        rows = rows_from_samples(samples, time.time(), self.host, self.gpu_indices)
        if not rows:
            names = sorted({s[0] for s in samples})[:8]
            raise RuntimeError(f"{self.url} answered but has none of the DCGM fields "
                               f"{', '.join(DCGM_FIELDS)} (it has {names or 'no samples'}); "
                               f"point telemetry at a DCGM exporter's /metrics")
        self._devices = [{"device": r["device"], "name": r["device_name"]} for r in rows]

    def sample(self) -> list[dict[str, Any]]:
        t0 = time.perf_counter()
        ts = time.time()
        rows = rows_from_samples(self._fetch(), ts, self.host, self.gpu_indices)
        read_ms = (time.perf_counter() - t0) * 1e3
        for row in rows:
            row["read_ms"] = read_ms
        return rows

    def close(self) -> None:
        return None

    def describe(self) -> dict[str, Any]:
        return {"kind": self.kind, "url": self.url, "host": self.host,
                "location": f"another host ({self.host}), read through Prometheus", "devices": self._devices}
