"""A bounded workload that scatters a page_size-1 KV pool, for a server on this machine only.

Why it fragments (SGLang 0.5.17's allocator, specdiag.localserver.kvpool's docstring): slots come from the head of
the free list and go back to its tail in the order freed. Each filler request has a short prompt (below a 64-token
run) and decodes for a while; its slots are taken as it decodes, interleaved with the other filler requests', and
the request frees them when it ends. Prompt and new-token lengths are drawn afresh for each request
(interleaved lengths), so the freed pieces are short and of every size. Once the slots handed out since the pool was
last contiguous exceed its size (one *cycle*), the head of the free list is those pieces, and the next long request
is laid over them. With several requests at once (``concurrency``: SGLang batches them) their decode slots also
interleave.

Bounded: it stops at ``cycles`` pool sizes of slots, or ``max_requests``, or ``max_seconds``, whichever comes first,
and refuses any server that is not on this machine's loopback (never fragment someone's production server from afar).
The radix cache must be off (``--disable-radix-cache``): with it, finished requests' slots stay in the tree.

Slots per request: the embedded server reports its pool's count (``internal_states[0].kv_pool``); otherwise
estimated (:func:`slots_of`) as prompt + completion tokens, plus one verify step's drafts under speculation (SGLang
0.5.17 reuses a request's draft slots: measured on the H200). The long request's own measured layout, not this
estimate, says whether the pool was scattered.
"""

from __future__ import annotations

import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Mapping

from specdiag.serving.locality import url_host

LOOPBACK = ("127.0.0.1", "localhost", "::1")


@dataclass(frozen=True)
class FillerPlan:
    """How much filler traffic, and of what shape."""

    cycles: float = 1.1  # slots to push through the allocator, in pool sizes (>= 1: the fresh range is used up)
    prompt_tokens: tuple[int, int] = (8, 56)  # each filler prompt's length is drawn from this range, tokens
    new_tokens: tuple[int, int] = (24, 160)  # tokens each filler request generates, drawn from this range
    concurrency: int = 1  # filler requests in flight (the embedded server serves one at a time)
    seed: int = 0  # seeds the lengths and the prompts' offsets
    max_requests: int = 20_000  # stop after this many requests whatever the slots
    max_seconds: float = 900.0  # stop after this long whatever the slots, s

    def __post_init__(self) -> None:
        if self.cycles <= 0:
            raise ValueError(f"cycles must be > 0; got {self.cycles}")
        for name, (lo, hi) in (("prompt_tokens", self.prompt_tokens), ("new_tokens", self.new_tokens)):
            if not 1 <= lo <= hi:
                raise ValueError(f"{name} must be a range (low, high) with 1 <= low <= high; got {(lo, hi)}")
        if self.concurrency < 1 or self.max_requests < 1 or self.max_seconds <= 0:
            raise ValueError("concurrency and max_requests must be >= 1, max_seconds > 0")


@dataclass
class FillerResult:
    """What the filler did (a row's ``filler`` column)."""

    requests: int = 0
    failed: int = 0
    slots: int = 0  # slots handed out by the filler's requests (server-reported or estimated)
    slots_source: str = "estimated"  # "server-reported (kv_pool)" or "estimated (prompt + completion + one step's drafts)"
    pool_tokens: int = 0
    seconds: float = 0.0
    stopped: str = ""  # "cycled", "max_requests", "max_seconds", "errors"
    errors: list[str] = field(default_factory=list)

    @property
    def cycles(self) -> float:
        return self.slots / self.pool_tokens if self.pool_tokens else 0.0

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "cycles": round(self.cycles, 4), "errors": self.errors[:5]}


def require_loopback(url: str) -> None:
    """Raise ValueError unless ``url``'s host is this machine's loopback."""
    host = url_host(url)
    if host not in LOOPBACK:
        raise ValueError(f"the KV-layout filler only runs against a server on this machine's loopback (127.0.0.1); "
                         f"{url} is on {host!r}: run the notebook on the server's machine, or measure the fresh arm only")


def slots_of(meta: Mapping[str, Any], prompt_tokens: int, tokens_per_step: int | None) -> int:
    """Slots one finished request took from the head of the pool (module docstring), from its final meta_info: its
    prompt and completion, plus one verify step's drafts under speculation. Not a verify step's drafts per step: on
    the H200, after filler requests estimated that way at 1.12 pool cycles, a 32k request still lay on the pool's
    first, never-used range, about 46k slots past where the filler began (431 requests: ~107 each, about their
    prompt + completion), so SGLang 0.5.17 reuses a request's draft slots from step to step."""
    completion = int(meta.get("completion_tokens") or 0)
    return int(prompt_tokens) + completion + (int(tokens_per_step) if tokens_per_step else 0)


def pool_allocated(server_info: Mapping[str, Any]) -> int | None:
    """The embedded server's count of slots handed out since its last flush (None from another server)."""
    states = server_info.get("internal_states") or [{}]
    pool = (states[0] or {}).get("kv_pool") if isinstance(states[0], Mapping) else None
    return int(pool["allocated_since_clear"]) if isinstance(pool, Mapping) and "allocated_since_clear" in pool else None


def fill(url: str, engine: str, base_ids: list[int], plan: FillerPlan, pool_tokens: int,
         tokens_per_step: int | None, progress: Callable[[str], None] | None = None) -> FillerResult:
    """Send filler requests to ``url`` until ``plan.cycles`` pool sizes of slots went through its allocator (or a
    bound hit). ``base_ids``: token ids the prompts are cut from (windows at seeded offsets)."""
    from specdiag.serving import make_client  # noqa: PLC0415 - replay imports no client

    require_loopback(url)
    if pool_tokens <= 0:
        raise ValueError(f"pool_tokens must be the server's pool size in tokens; got {pool_tokens}")
    if len(base_ids) < plan.prompt_tokens[1] + 1:
        raise ValueError(f"base_ids holds {len(base_ids)} tokens; the longest filler prompt needs "
                         f"{plan.prompt_tokens[1] + 1}")
    rng = random.Random(plan.seed)
    target = plan.cycles * pool_tokens
    result = FillerResult(pool_tokens=pool_tokens)
    lock = threading.Lock()
    probe = make_client(url, engine)
    before = pool_allocated(probe.server_info()) if hasattr(probe, "server_info") else None
    t0 = time.monotonic()

    def draw() -> tuple[list[int], int]:
        with lock:
            n = rng.randint(*plan.prompt_tokens)
            start = rng.randrange(0, len(base_ids) - n)
            return base_ids[start:start + n], rng.randint(*plan.new_tokens)

    def stop_reason() -> str | None:
        if result.slots >= target:
            return "cycled"
        if result.requests >= plan.max_requests:
            return "max_requests"
        if time.monotonic() - t0 >= plan.max_seconds:
            return "max_seconds"
        if result.failed >= 20 and result.failed > result.requests // 2:
            return "errors"
        return None

    def worker() -> None:
        client = make_client(url, engine)
        while True:
            with lock:
                if stop_reason():
                    return
            ids, new = draw()
            trace = client.generate(input_ids=ids, stream=False,
                                    sampling_params={"max_new_tokens": new, "temperature": 0.0, "ignore_eos": True})
            with lock:
                result.requests += 1
                if trace.error:
                    result.failed += 1
                    result.errors.append(str(trace.error)[:200])
                    continue
                result.slots += slots_of(trace.meta_info or {}, trace.prompt_tokens or len(ids), tokens_per_step)
                if before is not None:  # the embedded server counts exactly (a local call per request)
                    now = pool_allocated(client.server_info())
                    if now is not None and now >= before:
                        result.slots = now - before
                if progress and result.requests % 50 == 0:
                    progress(f"filler: {result.requests} requests, {result.slots:,} slots "
                             f"({result.slots / pool_tokens:.2f} pool cycles)")

    with ThreadPoolExecutor(max_workers=plan.concurrency) as pool:
        for f in [pool.submit(worker) for _ in range(plan.concurrency)]:
            f.result()
    result.seconds = round(time.monotonic() - t0, 3)
    result.stopped = stop_reason() or "cycled"
    after = pool_allocated(probe.server_info()) if before is not None else None
    if before is not None and after is not None and after >= before:
        result.slots, result.slots_source = after - before, "server-reported (kv_pool)"
    else:
        result.slots_source = "estimated (prompt + completion + one step's drafts)"
    return result
