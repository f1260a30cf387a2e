"""Timing on the device: kernel times with CUDA events, and the two ceilings measured in the same run.

- :func:`time_calls`: warm up, then time each call between two CUDA events, rotating through
  several input sets (so the L2 cache does not hold the next run's KV), and return the raw samples
  in ms. A ``torch.cuda._sleep`` queued first keeps the GPU busy while the CPU enqueues every run,
  so the events measure GPU execution, not Python launch overhead (a server replays CUDA graphs,
  which hide that overhead too). On the CPU it falls back to ``time.perf_counter``.
- :func:`copy_bandwidth_gbps`: device-to-device copy of a large buffer, bytes read + bytes written
  over the median time (GB/s, 1e9 B/s), the way kernels.md's 4.23 TB/s was measured; measured by
  :func:`specdiag.hardware.measure_copy_bandwidth`, the same code that resolves a peak elsewhere.
- :func:`matmul_tflops`: an n x n x n bf16 matrix product on random data (2 n^3 FLOP per product),
  median over runs (TFLOP/s, 1e12 FLOP/s); measured by :func:`specdiag.hardware.measure_matmul_rate`.
"""

from __future__ import annotations

import statistics
import time
from typing import Callable, Sequence

import torch

from specdiag.hardware import measure_copy_bandwidth, measure_matmul_rate
from specdiag.stats import quantile


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_calls(calls: Sequence[Callable[[], object]], n_runs: int = 20, n_warmup: int = 3,
               device: torch.device | str = "cuda") -> list[float]:
    """Run ``calls[i % len(calls)]`` ``n_warmup`` + ``n_runs`` times; return the timed runs in ms."""
    if not calls:
        raise ValueError("time_calls needs at least one call")
    if n_runs < 1:
        raise ValueError(f"n_runs must be >= 1; got {n_runs}")
    device = torch.device(device)
    for i in range(n_warmup):
        calls[i % len(calls)]()
    _sync(device)
    if device.type != "cuda":
        out = []
        for i in range(n_runs):
            t0 = time.perf_counter()
            calls[i % len(calls)]()
            out.append((time.perf_counter() - t0) * 1e3)
        return out
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(n_runs)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(n_runs)]
    # keep the GPU busy (about 150 us per run at 2 GHz) while Python enqueues the runs
    torch.cuda._sleep(300_000 * n_runs)
    for i in range(n_runs):
        starts[i].record()
        calls[(n_warmup + i) % len(calls)]()
        ends[i].record()
    torch.cuda.synchronize(device)
    return [s.elapsed_time(e) for s, e in zip(starts, ends)]


def summarize_ms(samples: Sequence[float]) -> dict[str, float]:
    """Median, p10 and p90 of timing samples (ms), by the project's one quantile (:func:`specdiag.stats.quantile`,
    linear interpolation). Rows recorded before 2026-11-30 (the H200 reference) took p10/p90 by nearest rank."""
    if not samples:
        raise ValueError("summarize_ms needs at least one sample")
    return {
        "ms_median": quantile(samples, 0.5),
        "ms_p10": quantile(samples, 0.1),
        "ms_p90": quantile(samples, 0.9),
        "n_runs": len(samples),
    }


def copy_bandwidth_gbps(device: torch.device | str = "cuda", n_bytes: int = 2 << 30, n_runs: int = 20) -> dict:
    """Device-to-device copy rate, counting bytes read plus bytes written (GB/s), as the run records it.

    The measurement is :func:`specdiag.hardware.measure_copy_bandwidth` (the project's one copy
    measurement); this adds the per-run times in ms and the median-time rate.
    """
    rates = measure_copy_bandwidth(str(torch.device(device)), n_bytes=n_bytes, repeats=n_runs, warmup=3)
    ms = [2 * n_bytes / r * 1e3 for r in rates]
    med = statistics.median(ms)
    return {"copy_gbps": 2 * n_bytes / (med * 1e-3) / 1e9, "copy_bytes": n_bytes, "copy_ms_median": med,
            "copy_ms_samples": ms}


def matmul_tflops(device: torch.device | str = "cuda", n: int = 8192, n_runs: int = 20) -> dict:
    """bf16 n x n x n matrix product on random data (TFLOP/s, median of ``n_runs``), as the run records it.

    The measurement is :func:`specdiag.hardware.measure_matmul_rate`; this adds the times in ms.
    """
    rates = measure_matmul_rate(str(torch.device(device)), n=n, repeats=n_runs, warmup=3)
    ms = [2 * n**3 / r * 1e3 for r in rates]
    med = statistics.median(ms)
    return {"matmul_tflops": 2 * n**3 / (med * 1e-3) / 1e12, "matmul_n": n, "matmul_ms_median": med,
            "matmul_ms_samples": ms}
