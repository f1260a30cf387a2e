"""The warp-specialized kernel's phase timing (ws_phases) on the CPU: the per-tile summary of a timed call's buffer
on synthetic cycles, the case parser, and the timed kernel's sm_90 compile (the clock reads in both partitions). The
timed kernel itself runs on the GPU: tests/test_kernels_gpu.py (run18)."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest

from specdiag.kernels.ws_phases import parse_cases, phase_cycles, timeline_from_phases

HAS_TRITON = importlib.util.find_spec("triton") is not None
PHASES = {"softmax_wg": ("a", "b", "c", "d", "e", "f"), "copy_pv_wg": ("p", "q", "r", "s", "t")}


def _buffer(programs: int, threads: int, tiles: list[int], per_tile: list[list[int]]) -> np.ndarray:
    t = np.zeros((programs, 2, 8, threads), dtype=np.int64)
    for prog in range(programs):
        for part in range(2):
            for k, c in enumerate(per_tile[part]):
                t[prog, part, k, :] = c * tiles[prog]
            t[prog, part, 6, :] = (sum(per_tile[part]) + 100) * tiles[prog]
            t[prog, part, 7, :] = tiles[prog]
    return t


def test_phase_cycles_are_per_tile_medians_over_programs() -> None:
    t = _buffer(3, 4, [16, 15, 16], [[300, 1200, 400, 10, 150, 900], [200, 1000, 50, 700, 400, 0]])
    t[1, 0, 1, :] = 9999 * 15  # one slow program: the median over programs ignores it
    t[0, 0, 0, 0] = 10**9  # one odd thread: each program's median thread ignores it
    soft, copy = phase_cycles(t, PHASES)
    assert soft["partition"] == "softmax_wg" and copy["partition"] == "copy_pv_wg"
    assert soft["programs"] == 3 and soft["tiles_per_program"] == 16
    assert soft["a_cycles"] == 300 and soft["b_cycles"] == 1200 and soft["f_cycles"] == 900
    assert soft["loop_cycles"] == pytest.approx(3060) and soft["phases_sum_cycles"] == pytest.approx(2960)
    assert copy["s_cycles"] == 700 and copy["loop_cycles"] == pytest.approx(2450)


def test_phase_cycles_skip_programs_without_tiles_and_refuse_bad_shapes() -> None:
    t = _buffer(2, 2, [8, 0], [[1, 2, 3, 4, 5, 6], [1, 2, 3, 4, 5, 0]])
    assert [r["programs"] for r in phase_cycles(t, PHASES)] == [1, 1]
    with pytest.raises(ValueError, match="programs, 2, 8 or more slots, threads"):
        phase_cycles(np.zeros((2, 8, 4)), PHASES)
    with pytest.raises(ValueError, match="no program"):
        phase_cycles(_buffer(2, 2, [0, 0], [[1] * 6, [1] * 6]), PHASES)


SLOTS = {"entry_ns": 8, "start_ns": 9, "first_tile_ns": 10, "loop_end_ns": 11, "done_ns": 12, "sm": 13}


def test_timeline_from_phases_reads_warpgroup_0s_stamps() -> None:
    """Slots 8-13 of partition 0 (entry, start, first tile, loop end, done ns; SM), each program's median thread:
    the span from the first entry to the last done, Q's load, the first tile's latency, the stream, the epilogue, and
    programs without tiles left out."""
    t = np.zeros((4, 2, 16, 4), dtype=np.int64)
    stamps = [(1_000, 2_000, 4_000, 40_000, 41_000, 0), (1_100, 2_000, 4_500, 41_000, 41_500, 1),
              (1_050, 2_100, 4_100, 44_000, 45_050, 2), (9_999, 0, 0, 0, 0, 3)]
    for prog, st in enumerate(stamps):
        for k, v in zip(range(8, 14), st):
            t[prog, 0, k, :] = v
        t[prog, 0, 7, :] = 0 if prog == 3 else 16  # program 3 ran no tile
    t[0, 0, 11, 0] = 10**12  # one odd thread: the median thread ignores it
    tl = timeline_from_phases(t, SLOTS)
    assert tl["tl_programs"] == 3 and tl["tl_sms"] == 3
    assert tl["tl_span_us"] == pytest.approx(44.05) and tl["tl_ramp_us"] == pytest.approx(0.1)
    assert tl["tl_q_p50_us"] == pytest.approx(1.0) and tl["tl_first_p50_us"] == pytest.approx(3.05)
    assert tl["tl_stream_p50_us"] == pytest.approx(36.5) and tl["tl_epilogue_p50_us"] == pytest.approx(1.0)
    with pytest.raises(ValueError, match="slots"):
        timeline_from_phases(np.zeros((2, 2, 8, 4)), SLOTS)
    with pytest.raises(ValueError, match="no program"):
        timeline_from_phases(np.zeros((2, 2, 16, 4)), SLOTS)


def test_cases_parse_or_say_how_to_write_them() -> None:
    shapes = parse_cases("131072:8:8, 65536:16:64")
    assert [(s.context_tokens, s.heads, s.draft_tokens, s.layout) for s in shapes] == [
        (131072, 8, 8, "shuffled_p1"), (65536, 16, 64, "shuffled_p1")]
    for bad in ("131072:8", "a:b:c", "0:8:8", ""):
        with pytest.raises(ValueError, match="context:heads:draft_tokens"):
            parse_cases(bad)


@pytest.mark.skipif(not HAS_TRITON, reason="triton is not installed here")
@pytest.mark.parametrize("draft_branch", [False, True])
def test_timed_kernel_compiles_with_clock_reads_in_both_partitions(draft_branch: bool) -> None:
    """The timed form for sm_90: the untimed kernel's tensor-core instructions, plus one %clock64 per phase boundary
    (warpgroup 0: before the loop, 6 boundaries and the last phase's end, at the end; the worker: before, 4 + 1 in the
    loop, at the end); the untimed kernel has none."""
    import collections
    import re

    from specdiag.kernels.gluon_ws import compile_sm90

    timed = compile_sm90(prefetch=True, draft_branch=draft_branch, timed=True).asm["ptx"]
    plain = compile_sm90(prefetch=True, draft_branch=draft_branch).asm["ptx"]
    shapes = collections.Counter(re.findall(r"wgmma\.mma_async\.sync\.aligned\.(m\d+n\d+k\d+)", timed))
    assert shapes == {"m64n64k16": 36, "m64n256k16": 8}
    assert timed.count("%clock64") == 17 and "%clock64" not in plain
    # warpgroup 0's timeline (TIMELINE_SLOTS): the entry, its start, the first tile, the loop's end, done; and %smid
    assert timed.count("%globaltimer") == 5 and timed.count("%smid") == 1
    assert "%globaltimer" not in plain and "%smid" not in plain
