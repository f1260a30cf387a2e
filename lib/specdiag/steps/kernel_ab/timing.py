"""Timing a verify call as a served step runs it: a captured CUDA graph replayed, the L2 cleared before each replay.

A server replays CUDA graphs, so neither Python nor the launch path sits between its kernels; and each layer's
attention reads KV that no earlier kernel left in the L2 (the step before read other layers' KV). So
:func:`time_replays`:

1. runs the call a few times eagerly (Triton/Gluon compile on first use; FlashInfer plans outside the graph),
2. captures one call into a CUDA graph (on failure it times eager calls and says why in ``method_note``),
3. queues a long ``torch.cuda._sleep`` so the CPU enqueues every timed replay before the GPU reaches them, then per
   replay: an L2 flush, a start event, the replay, an end event.

The flush (:class:`L2Flush`) READS a buffer of several times the L2's size and writes only one float: the L2 is left
holding clean lines of that buffer, so no dirty line of an earlier call is written back inside the timed replay (a
flush by writing, e.g. ``buffer.zero_()``, would leave dirty lines that drain during the next kernel and bill it).

The same method times a plain device copy of the bytes a case reads (:func:`time_copy`): the floor one simple
memory-bound launch reaches at that size, timed exactly as the kernels are. On the CPU calls are timed with
``time.perf_counter`` (a correctness exercise: those times say nothing about a GPU).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Optional

import torch

from specdiag.stats import quantile

#: the flush reads this many times the device's L2 (H200: 60 MB -> 240 MB of reads, about 60 us a flush)
FLUSH_L2_MULTIPLE = 4
SLEEP_CYCLES_PER_RUN = 400_000  #: ~200 us at 2 GHz per queued replay: the GPU waits while the CPU enqueues


@dataclass
class Timing:
    """Raw samples of one timed call and how they were taken."""

    samples_ms: list[float]
    method: str  #: "graph" (CUDA graph replays, L2 flushed), "eager" (capture failed), "cpu" (perf_counter)
    method_note: str = ""  #: why a CUDA call was not captured (the capture's error), else empty
    summary: dict[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.summary = summarize_ms(self.samples_ms)


def summarize_ms(samples: list[float]) -> dict[str, float]:
    """Median, p10 and p90 (ms) by the project's one quantile, and the count."""
    if not samples:
        raise ValueError("summarize_ms needs at least one sample")
    return {"ms_median": quantile(samples, 0.5), "ms_p10": quantile(samples, 0.1),
            "ms_p90": quantile(samples, 0.9), "n_runs": len(samples)}


class L2Flush:
    """A read-only pass over a buffer of ``FLUSH_L2_MULTIPLE`` x the L2 (module doc); a no-op on the CPU."""

    def __init__(self, device: torch.device):
        self.device = device
        self.buf: Optional[torch.Tensor] = None
        if device.type == "cuda":
            l2 = int(getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 64 << 20) or (64 << 20))
            self.buf = torch.ones(FLUSH_L2_MULTIPLE * l2 // 4, dtype=torch.float32, device=device)
            self.sink = torch.empty((), dtype=torch.float32, device=device)

    @property
    def bytes_read(self) -> int:
        return 0 if self.buf is None else self.buf.numel() * 4

    def __call__(self) -> None:
        if self.buf is not None:
            torch.sum(self.buf, dim=0, out=self.sink)


def _capture(call: Callable[[], object]) -> tuple[Callable[[], object], str, str]:
    """(replay, method, note): the call captured into a CUDA graph, or the call itself when capture fails."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        call()  # a warm call on the capture's side stream (allocator pools, lazy state)
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(graph):
            call()
        torch.cuda.synchronize()
    except Exception as exc:  # noqa: BLE001 - time it eagerly and say why
        torch.cuda.synchronize()
        return call, "eager", f"graph capture failed: {type(exc).__name__}: {' '.join(str(exc).split())[:300]}"
    return graph.replay, "graph", ""


def time_replays(call: Callable[[], object], flush: L2Flush, n_runs: int = 20, n_warmup: int = 3,
                 capture: bool = True) -> Timing:
    """Time ``call`` (module doc); ``n_runs`` samples in ms."""
    if n_runs < 1:
        raise ValueError(f"n_runs must be >= 1; got {n_runs}")
    for _ in range(n_warmup):
        call()
    if flush.device.type != "cuda":
        out = []
        for _ in range(n_runs):
            t0 = time.perf_counter()
            call()
            out.append((time.perf_counter() - t0) * 1e3)
        return Timing(out, "cpu")
    torch.cuda.synchronize()
    replay, method, note = _capture(call) if capture else (call, "eager", "capture not asked for")
    for _ in range(2):
        flush()
        replay()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(n_runs)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(n_runs)]
    torch.cuda.synchronize()
    torch.cuda._sleep(SLEEP_CYCLES_PER_RUN * n_runs)
    for i in range(n_runs):
        flush()
        starts[i].record()
        replay()
        ends[i].record()
    torch.cuda.synchronize()
    return Timing([s.elapsed_time(e) for s, e in zip(starts, ends)], method, note)


def copy_elements(n_bytes: int) -> int:
    """bf16 elements a copy moves so that bytes read + bytes written equal ``n_bytes``."""
    return max(1, n_bytes // 4)


#: the ways a same-bytes floor is timed (module doc): ``memcpy`` torch's copy_ (a cudaMemcpyAsync, a memcpy node in a
#: graph), ``kernel`` an elementwise kernel on the SMs (torch.neg) reading and writing the same bytes, ``read`` a
#: read-only pass over all ``n_bytes`` (a sum): what reading the bytes alone costs, the verify kernels' own traffic
COPY_FORMS: tuple[str, ...] = ("memcpy", "kernel", "read")


def time_copy(n_bytes: int, flush: L2Flush, n_runs: int = 20, form: str = "memcpy") -> Timing:
    """A plain memory-bound launch over ``n_bytes`` (``COPY_FORMS``), timed as :func:`time_replays`."""
    if form not in COPY_FORMS:
        raise ValueError(f"form must be one of {COPY_FORMS}; got {form!r}")
    if form == "read":
        buf = torch.randn(max(1, n_bytes // 2), device=flush.device).to(torch.bfloat16)
        sink = torch.empty((), dtype=torch.float32, device=flush.device)
        return time_replays(lambda: torch.sum(buf, dim=0, dtype=torch.float32, out=sink), flush, n_runs=n_runs)
    n = copy_elements(n_bytes)
    src = torch.randn(n, device=flush.device).to(torch.bfloat16)
    dst = torch.empty_like(src)
    if form == "kernel":
        return time_replays(lambda: torch.neg(src, out=dst), flush, n_runs=n_runs)
    return time_replays(lambda: dst.copy_(src), flush, n_runs=n_runs)
