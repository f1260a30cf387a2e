"""A contiguous ("Tier 0") token-slot allocator: each request's KV in as few runs of consecutive slots as the pool allows.

SGLang 0.5.17's page_size-1 ``TokenToKVPoolAllocator`` (sglang/srt/mem_cache/allocator/token.py) hands out slots from
the head of its free list and appends freed slots at its tail, so after traffic a new request's KV lies scattered
(specdiag.kvlayout measures it). This allocator keeps the free slots as **sorted, merged ranges** instead and serves
``alloc(n)`` in this order:

1. **grow the last run**: the free range that starts at the previous allocation's end, or that holds it because the
   tail of that allocation was freed since (a verify step's rejected drafts), when it has ``n`` slots: so at batch 1 a
   request's decode and verify allocations extend its own run, and the draft slots a verify step frees are taken again
   by the next step;
2. **best fit**: the smallest free range with at least ``n`` slots (one run);
3. **largest first**: the largest ranges whole until the rest fits one range, then that range by best fit.

Each allocation takes its slots from the low end of a range. ``free(indices)`` merges the freed runs back into the
ranges (a slot freed twice, slot 0 or a slot beyond the pool raises). Slot 0 is SGLang's padding slot (dummy writes of
padded tokens) and is never handed out: the pool is slots ``1..size``, as SGLang's ``clear()`` sets it up.

The rest of SGLang's allocator state has the same meaning here (token.py, allocator/base.py):

- free groups: between ``free_group_begin()`` and ``free_group_end()`` frees are collected and released at the end;
- ``clear()``: one range ``1..size``, no group, no pending frees.

Frees of tensors on an accelerator are kept as device copies (stream-ordered, no host sync) and merged at the next
``alloc`` in one device-to-host copy, where SGLang's own free is a device ``torch.cat``: the scheduler's verify step
has already synchronized by then (it reads the accepted lengths on the host), so that copy waits for no kernel.
The returned indices are int64 tensors on the allocator's device: one run is one ``torch.arange`` on the device (no
host-to-device copy), several runs are assembled on the host and copied once.

Which requests own the slots is not known here (SGLang's allocator is not told): at batch 1 "the previous allocation"
is the request's own, at larger batches the step's allocations of several requests interleave and each request's run
breaks once per step. Pure: torch, numpy and the standard library; no SGLang import (the plugin's adapter,
plugins/sglang/specdiag_sglang_plugin/contiguous.py, puts it behind SGLang's interface; the embedded server uses it
with ``--kv-alloc contiguous``).
"""

from __future__ import annotations

import time
from bisect import bisect_left, bisect_right, insort
from typing import Any, Sequence

import numpy as np
import torch

#: above this many runs an allocation is assembled on the host and copied once, below it one arange per run
DEVICE_ARANGE_MAX_RUNS = 8
#: frees of at most this many slots are split into runs by a Python loop, larger ones by numpy
SMALL_FREE_SLOTS = 64


class SlotError(ValueError):
    """A free of a slot that is not allocated (freed twice, slot 0, or beyond the pool): a caller's bug."""


class ContiguousAllocator:
    """Free slots as sorted merged ranges ``[start, end)`` of ``1..size``; the module docstring gives the policy."""

    def __init__(self, size: int, device: str | torch.device = "cpu") -> None:
        if size < 1:
            raise ValueError(f"the pool needs at least 1 slot besides the padding slot 0; got {size}")
        self.size = int(size)
        self.device = torch.device(device)
        self.allocated_total = 0  # slots handed out since construction (clears do not take them back)
        self.clears = -1
        self.clear()

    # -- state ---------------------------------------------------------------------------------------------------
    def clear(self) -> None:
        """All slots ``1..size`` free in one range (slot 0 is the padding slot), no free group, no pending frees."""
        self._starts: list[int] = [1]
        self._ends: list[int] = [self.size + 1]
        self._by_size: list[tuple[int, int]] = [(self.size, 1)]  # (length, start), sorted: best fit by bisect
        self._free_n = self.size
        self._cursor = 1  # the previous allocation's end (exclusive)
        self._pending: list[torch.Tensor] = []  # device frees not merged yet
        self._pending_n = 0
        self.is_not_in_free_group = True
        self.free_group: list[Any] = []
        self.clears += 1

    def available_size(self) -> int:
        """Free slots, counting frees not merged yet (SGLang: ``len(free_pages) + len(release_pages)``)."""
        return self._free_n + self._pending_n

    @property
    def num_free_ranges(self) -> int:
        return len(self._starts)

    def free_ranges(self) -> list[tuple[int, int]]:
        """The free ranges ``(start, end)`` (end exclusive), pending frees merged first."""
        self.merge_pending()
        return list(zip(self._starts, self._ends))

    # -- free groups (SGLang's BaseTokenToKVPoolAllocator semantics) ----------------------------------------------
    def free_group_begin(self) -> None:
        self.is_not_in_free_group = False
        self.free_group = []

    def free_group_end(self) -> None:
        self.is_not_in_free_group = True
        if self.free_group:
            group, self.free_group = self.free_group, []
            for indices in group:
                self.free(indices)

    # -- alloc ---------------------------------------------------------------------------------------------------
    def alloc(self, n: int) -> torch.Tensor | None:
        """``n`` slots as an int64 tensor on the allocator's device, in as few runs as the pool allows; None when fewer
        than ``n`` are free (SGLang's contract: the caller evicts or reports out of memory)."""
        n = int(n)
        if n <= 0:
            return torch.empty(0, dtype=torch.int64, device=self.device)
        self.merge_pending()
        if n > self._free_n:
            return None
        pieces = self._take(n)
        self.allocated_total += n
        return self._indices(pieces)

    def alloc_runs(self, n: int) -> list[tuple[int, int]] | None:
        """Like :meth:`alloc` but the runs ``(start, length)`` themselves (no tensor): for the timing and tests."""
        n = int(n)
        self.merge_pending()
        if n <= 0 or n > self._free_n:
            return [] if n <= 0 else None
        pieces = self._take(n)
        self.allocated_total += n
        return pieces

    def _take(self, n: int) -> list[tuple[int, int]]:
        i = bisect_right(self._starts, self._cursor) - 1
        if i >= 0 and self._starts[i] <= self._cursor <= self._ends[i] and self._ends[i] - self._starts[i] >= n:
            return [self._cut(i, n)]
        pieces: list[tuple[int, int]] = []
        rest = n
        while rest:
            j = bisect_left(self._by_size, (rest, 0))
            if j < len(self._by_size):  # best fit: the smallest range that holds the rest
                pieces.append(self._cut(self._index_of(self._by_size[j][1]), rest))
                break
            # no range holds it: the largest whole (of equal ones, the lowest)
            length, start = self._by_size[bisect_left(self._by_size, (self._by_size[-1][0], 0))]
            pieces.append(self._cut(self._index_of(start), length))
            rest -= length
        return pieces

    def _index_of(self, start: int) -> int:
        return bisect_left(self._starts, start)

    def _cut(self, i: int, n: int) -> tuple[int, int]:
        """Take ``n`` slots from the low end of free range ``i``; the cursor moves to their end."""
        s, e = self._starts[i], self._ends[i]
        self._drop_size(e - s, s)
        if e - s == n:
            del self._starts[i], self._ends[i]
        else:
            self._starts[i] = s + n
            insort(self._by_size, (e - s - n, s + n))
        self._free_n -= n
        self._cursor = s + n
        return s, n

    def _drop_size(self, length: int, start: int) -> None:
        k = bisect_left(self._by_size, (length, start))
        del self._by_size[k]

    def _indices(self, pieces: list[tuple[int, int]]) -> torch.Tensor:
        if len(pieces) == 1:
            s, n = pieces[0]
            return torch.arange(s, s + n, dtype=torch.int64, device=self.device)
        if len(pieces) <= DEVICE_ARANGE_MAX_RUNS:
            return torch.cat([torch.arange(s, s + n, dtype=torch.int64, device=self.device) for s, n in pieces])
        host = torch.from_numpy(runs_to_slots(pieces))
        if self.device.type == "cpu":
            return host
        return host.pin_memory().to(self.device, non_blocking=True)

    # -- free ----------------------------------------------------------------------------------------------------
    def free(self, indices: torch.Tensor | np.ndarray | Sequence[int]) -> None:
        """Give ``indices`` back (inside a free group: at its end). Device tensors wait as copies until the next
        alloc; host ones merge at once."""
        if isinstance(indices, torch.Tensor):
            if indices.numel() == 0:
                return
            flat = indices.reshape(-1)
            if not self.is_not_in_free_group or flat.device.type != "cpu":
                # kept for later: a copy, since the caller may reuse the tensor (a view of req_to_token, int32 in
                # SGLang) after the call
                own = flat.to(dtype=torch.int64, copy=True)
                if not self.is_not_in_free_group:
                    self.free_group.append(own)
                else:
                    self._pending.append(own)
                    self._pending_n += int(own.numel())
                return
            slots = flat.numpy()  # merged now: no copy needed
        else:
            slots = np.asarray(indices, dtype=np.int64).reshape(-1)
            if slots.size == 0:
                return
            if not self.is_not_in_free_group:
                self.free_group.append(slots.copy())
                return
        self._merge_slots(slots)

    def merge_pending(self) -> None:
        """Merge the device frees waiting since the last alloc (one device-to-host copy)."""
        if not self._pending:
            return
        pending = self._pending[0] if len(self._pending) == 1 else torch.cat(self._pending)
        self._pending, self._pending_n = [], 0
        self._merge_slots(pending.cpu().numpy())

    def _merge_slots(self, slots: np.ndarray) -> None:
        for start, end in slots_to_runs(slots, self.size):
            self._insert(start, end)

    def _insert(self, start: int, end: int) -> None:
        """Merge the free run ``[start, end)`` into the ranges; an overlap with a free range is a double free."""
        i = bisect_right(self._starts, start)  # ranges before i start at or before ``start``
        if i > 0 and self._ends[i - 1] > start:
            raise SlotError(f"slots {start}..{end - 1} overlap the free range {self._starts[i - 1]}.."
                            f"{self._ends[i - 1] - 1}: freed twice")
        if i < len(self._starts) and self._starts[i] < end:
            raise SlotError(f"slots {start}..{end - 1} overlap the free range {self._starts[i]}..{self._ends[i] - 1}:"
                            " freed twice")
        self._free_n += end - start
        merge_left = i > 0 and self._ends[i - 1] == start
        merge_right = i < len(self._starts) and self._starts[i] == end
        if merge_left:
            self._drop_size(self._ends[i - 1] - self._starts[i - 1], self._starts[i - 1])
            start = self._starts[i - 1]
        if merge_right:
            self._drop_size(self._ends[i] - self._starts[i], self._starts[i])
            end = self._ends[i]
        if merge_left and merge_right:
            self._ends[i - 1] = end
            del self._starts[i], self._ends[i]
        elif merge_left:
            self._ends[i - 1] = end
        elif merge_right:
            self._starts[i] = start
        else:
            self._starts.insert(i, start)
            self._ends.insert(i, end)
        insort(self._by_size, (end - start, start))


def slots_to_runs(slots: np.ndarray, size: int) -> list[tuple[int, int]]:
    """The runs ``(start, end)`` (end exclusive) of consecutive slots in ``slots`` after sorting; raises SlotError for
    a slot outside ``1..size`` or one given twice. Vectorized: no per-slot Python loop."""
    flat = np.asarray(slots, dtype=np.int64).reshape(-1)
    if flat.size == 0:
        return []
    if flat.size <= SMALL_FREE_SLOTS:
        return _small_runs(sorted(flat.tolist()), size)
    s = np.sort(flat)
    if s[0] < 1 or s[-1] > size:
        bad = s[0] if s[0] < 1 else s[-1]
        raise SlotError(f"slot {int(bad)} is not in the pool 1..{size} (slot 0 is the padding slot)")
    step = np.diff(s)
    if step.size and not step.all():
        raise SlotError(f"slot {int(s[1:][step == 0][0])} freed twice in one call")
    breaks = np.flatnonzero(step != 1) + 1
    starts = np.concatenate(([0], breaks))
    ends = np.concatenate((breaks, [s.size]))
    return list(zip(s[starts].tolist(), (s[ends - 1] + 1).tolist()))


def _small_runs(s: list[int], size: int) -> list[tuple[int, int]]:
    """:func:`slots_to_runs` for a few sorted slots (a verify step's rejected drafts): a plain loop beats numpy's
    per-call overhead there."""
    if s[0] < 1 or s[-1] > size:
        bad = s[0] if s[0] < 1 else s[-1]
        raise SlotError(f"slot {bad} is not in the pool 1..{size} (slot 0 is the padding slot)")
    runs = []
    start = prev = s[0]
    for x in s[1:]:
        if x == prev:
            raise SlotError(f"slot {x} freed twice in one call")
        if x != prev + 1:
            runs.append((start, prev + 1))
            start = x
        prev = x
    runs.append((start, prev + 1))
    return runs


def runs_to_slots(runs: Sequence[tuple[int, int]]) -> np.ndarray:
    """The slot indices of runs ``(start, length)`` in order, int64 (vectorized)."""
    lengths = np.fromiter((n for _, n in runs), dtype=np.int64, count=len(runs))
    starts = np.fromiter((s for s, _ in runs), dtype=np.int64, count=len(runs))
    total = int(lengths.sum())
    offsets = np.repeat(starts - np.concatenate(([0], np.cumsum(lengths)[:-1])), lengths)
    return offsets + np.arange(total, dtype=np.int64)


# -- the scheduler's cost: a pure timing helper returning raw samples ---------------------------------------------------
def fragmented_allocator(pool_slots: int = 1_250_000, live_share: float = 0.5, mean_request_slots: int = 600,
                         seed: int = 0, device: str | torch.device = "cpu") -> ContiguousAllocator:
    """A pool after traffic: filled with requests of random length (exponential, ``mean_request_slots``), then a
    random ``1 - live_share`` of them freed, so the free list is thousands of ranges of every size (seeded)."""
    rng = np.random.default_rng(seed)
    alloc = ContiguousAllocator(pool_slots, device)
    owned: list[list[tuple[int, int]]] = []
    while alloc.available_size() > 0:
        n = min(alloc.available_size(), max(1, int(rng.exponential(mean_request_slots))))
        owned.append(alloc.alloc_runs(n) or [])
    for k in rng.permutation(len(owned))[: int(len(owned) * (1 - live_share))]:
        alloc.free(runs_to_slots(owned[k]))
    return alloc


def time_verify_steps(alloc: ContiguousAllocator, steps: int = 2000, draft_tokens: int = 8, seed: int = 0,
                      warmup: int = 50) -> list[float]:
    """Seconds per verify step of the allocator alone, one sample a step: ``alloc(draft_tokens)`` then free the
    ``draft_tokens - k`` rejected slots (k accepted, uniform in 1..draft_tokens, seeded) as one tensor on the
    allocator's device, as SGLang's verify frees them. The first ``warmup`` steps are run and not returned; raw
    samples, summaries are the caller's."""
    rng = np.random.default_rng(seed)
    accepted = rng.integers(1, draft_tokens + 1, size=steps + warmup).tolist()
    sync = torch.cuda.synchronize if alloc.device.type == "cuda" else (lambda: None)
    samples: list[float] = []
    for step, k in enumerate(accepted):
        sync()
        t0 = time.perf_counter()
        out = alloc.alloc(draft_tokens)
        if out is None:
            raise RuntimeError("the pool ran out of slots during the timing")
        alloc.free(out[k:])
        alloc.merge_pending()
        t1 = time.perf_counter()
        if step >= warmup:
            samples.append(t1 - t0)
    return samples
