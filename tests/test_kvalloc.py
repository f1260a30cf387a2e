"""The contiguous slot allocator (specdiag.kvalloc): its policy (grow the last run, best fit, largest first), merging
frees, clear, free groups as SGLang uses them, and a seeded soak of mixed traffic that checks no slot
is ever held by two owners, none is lost, and slot 0 is never handed out."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from specdiag.kvalloc import (  # noqa: E402
    ContiguousAllocator, SlotError, fragmented_allocator, runs_to_slots, slots_to_runs, time_verify_steps)
from specdiag.kvlayout import layout_stats  # noqa: E402


def test_fresh_pool_hands_out_one_run_from_slot_1():
    a = ContiguousAllocator(100)
    assert a.alloc(10).tolist() == list(range(1, 11))
    out = a.alloc(5)
    assert out.dtype == torch.int64 and out.device.type == "cpu"
    assert out.tolist() == list(range(11, 16))
    assert a.available_size() == 85 and a.allocated_total == 15
    assert a.alloc(86) is None and a.available_size() == 85  # too many: None, nothing taken (SGLang's contract)


def test_verify_step_takes_its_freed_drafts_again():
    """A verify step allocates 8, keeps k and frees the rest; the next step's 8 start where the kept ones end."""
    a = ContiguousAllocator(1000)
    prompt = a.alloc(100)
    slots = prompt.tolist()
    for k in (3, 8, 1, 5):
        step = a.alloc(8)
        a.free(step[k:])
        slots += step[:k].tolist()
    assert slots == list(range(1, 1 + len(slots)))  # one run: the request grew its own
    assert layout_stats(slots).runs == 1


def test_grow_last_run_then_best_fit_then_largest_first():
    a = ContiguousAllocator(100)
    chunks = [a.alloc(10) for _ in range(10)]  # 1..100 in ten chunks
    for i in (1, 3, 4, 7):  # free 11..20, 31..50 (merged), 71..80
        a.free(chunks[i])
    assert a.free_ranges() == [(11, 21), (31, 51), (71, 81)]
    # the cursor (101) sits in no free range: best fit, the smallest range that holds 6 slots
    assert a.alloc(6).tolist() == list(range(11, 17))
    # the next one grows that run: 17..20 follow the previous allocation's end
    assert a.alloc(4).tolist() == list(range(17, 21))
    # 15 fits only 31..50 (best fit), not split across the 10-slot range
    assert a.alloc(15).tolist() == list(range(31, 46))
    # 12 fits no range (5 and 10 left): the largest whole (71..80), then the rest by best fit (46..47)
    out = a.alloc(12).tolist()
    assert out == list(range(71, 81)) + [46, 47]
    assert a.available_size() == 3 and a.free_ranges() == [(48, 51)]


def test_free_merges_neighbours_and_rejects_double_free_and_slot_0():
    a = ContiguousAllocator(30)
    x = a.alloc(30)
    a.free(x[10:20])
    a.free(x[0:5])
    a.free(x[25:30])
    assert a.free_ranges() == [(1, 6), (11, 21), (26, 31)]
    a.free(x[5:10])  # bridges 1..5 and 11..20
    assert a.free_ranges() == [(1, 21), (26, 31)]
    with pytest.raises(SlotError, match="freed twice"):
        a.free(x[18:22])
    with pytest.raises(SlotError, match="padding slot"):
        a.free(torch.tensor([0]))
    with pytest.raises(SlotError, match="not in the pool"):
        a.free(np.array([31]))
    with pytest.raises(SlotError, match="twice in one call"):
        a.free(np.array([22, 22]))
    a.clear()
    assert a.free_ranges() == [(1, 31)] and a.available_size() == 30 and a.clears == 1


def test_free_group_holds_frees_until_its_end():
    a = ContiguousAllocator(20)
    x = a.alloc(20)
    a.free_group_begin()
    row = x[:5].to(torch.int32)  # SGLang frees views of req_to_token (int32), which it may overwrite later
    a.free(row)
    row.fill_(0)
    a.free(x[10:])
    assert a.available_size() == 0 and len(a.free_group) == 2
    a.free_group_end()
    assert a.available_size() == 15 and a.is_not_in_free_group
    assert a.free_ranges() == [(1, 6), (11, 21)]


def test_runs_helpers_round_trip():
    slots = np.array([9, 3, 4, 5, 20, 21, 8])
    runs = slots_to_runs(slots, 30)
    assert runs == [(3, 6), (8, 10), (20, 22)]
    assert runs_to_slots([(s, e - s) for s, e in runs]).tolist() == [3, 4, 5, 8, 9, 20, 21]
    big = np.random.default_rng(0).permutation(np.arange(1, 501))  # the numpy path (above the small-free size)
    assert slots_to_runs(big, 500) == [(1, 501)]
    with pytest.raises(SlotError):
        slots_to_runs(np.concatenate([big, [7]]), 500)


def test_many_runs_come_back_as_one_tensor_in_run_order():
    a = ContiguousAllocator(200)
    x = a.alloc(200)
    for i in range(0, 200, 20):  # 10 free ranges of 5 slots
        a.free(x[i:i + 5])
    out = a.alloc(50)
    assert out.tolist() == runs_to_slots([(1 + i, 5) for i in range(0, 200, 20)]).tolist()


def test_soak_no_slot_doubled_or_lost_and_slot_0_never_handed_out():
    """A few thousand seeded mixed operations of many simulated requests: prefill, verify steps (alloc 8, free the
    rejected), finishing requests, free groups, occasional clear when idle."""
    rng = np.random.default_rng(1234)
    size = 5000
    a = ContiguousAllocator(size)
    owner = np.zeros(size + 1, dtype=np.int64)  # 0 = free; else the request id holding the slot
    live: dict[int, list[int]] = {}
    next_id = 1

    def take(rid: int, out) -> None:
        s = out.tolist() if isinstance(out, torch.Tensor) else out
        assert 0 not in s, "slot 0 handed out"
        assert (owner[s] == 0).all(), "a slot handed to two live owners"
        owner[s] = rid
        live[rid].extend(s)

    def give_back(rid: int, s: list[int]) -> None:
        assert (owner[s] == rid).all()
        owner[s] = 0
        a.free(torch.tensor(s, dtype=torch.int64))

    for _ in range(4000):
        op = rng.random()
        if op < 0.15 or not live:  # a new request's prefill
            n = int(rng.integers(1, 400))
            if a.available_size() >= n:
                live[next_id] = []
                take(next_id, a.alloc(n))
                next_id += 1
        elif op < 0.75:  # a verify step of one request: 8 drafts, k kept
            rid = int(rng.choice(list(live)))
            out = a.alloc(8)
            if out is not None:
                k = int(rng.integers(1, 9))
                take(rid, out[:k])
                a.free(out[k:])
        else:  # finishing requests, sometimes several in one free group
            group = rng.random() < 0.5
            if group:
                a.free_group_begin()
            for rid in rng.choice(list(live), size=min(len(live), int(rng.integers(1, 4))), replace=False).tolist():
                give_back(rid, live.pop(rid))
            if group:
                a.free_group_end()
        held = int((owner != 0).sum())
        assert a.available_size() + held == size, "a slot lost or made up"
        if not live and rng.random() < 0.3:
            a.clear()
    for rid in list(live):
        give_back(rid, live.pop(rid))
    assert a.available_size() == size and a.free_ranges() == [(1, size + 1)]
    assert a.allocated_total > size  # the pool cycled


def test_timing_returns_raw_samples_on_a_fragmented_pool():
    a = fragmented_allocator(pool_slots=50_000, seed=3)
    assert a.num_free_ranges > 10 and 0 < a.available_size() < 50_000
    before = a.available_size()
    samples = time_verify_steps(a, steps=30, warmup=5)
    assert len(samples) == 30 and all(s > 0 for s in samples)
    assert before - a.available_size() <= 35 * 8  # only accepted slots stay taken
