"""Tuning the split-KV launch parameters on the device: candidates by row count, timing, the pick.

``tune`` times every candidate of :func:`candidate_configs` (checked against the reference like any
grid case) on a few 128k shapes and writes one row per candidate to the ``kernel_ab_tuning`` table;
for each shape's winner it also times the split kernel without its merge. ``config_picker`` maps any
row count to the winner tuned at the nearest row count of the same regime.
"""

from __future__ import annotations

import math
import time
from typing import Any, Callable, Iterable, Optional, Sequence

import torch

from specdiag.kernels.dispatch import variant
from specdiag.kernels.cases import (TUNING_TABLE, GridSpec, measure_variant, plan_fields, progress_line,
                                    rotation_sets, shape_fields)
from specdiag.kernels.mla import VerifyInputs, VerifyShape, make_inputs
from specdiag.kernels.reference import reference_verify
from specdiag.kernels.timing import summarize_ms, time_calls
from specdiag.runs import Run


def candidate_configs(rows: int) -> list[Any]:
    """Split-KV launch parameters tried for a packed row count (see docs/kernel-notes.md, run 2).

    Few rows (memory-bound): 16/32-row tiles, one or two programs per SM, narrow or wide merge programs.
    Many rows: 64-row tiles with 8 warps (run 1's winner), deeper or shallower pipelines, 16 warps,
    and value dims split across two programs (4 warps, a 64 x 256 accumulator each).
    """
    from specdiag.kernels.splitkv_plan import SplitKVConfig  # noqa: PLC0415

    out = []
    if rows <= 32:
        bm = 16 if rows <= 16 else 32
        for bn, stages in ((64, 2), (32, 3)):
            for pps in (1.0, 2.0):
                for mdv in (16, 64):
                    out.append(SplitKVConfig(block_m=bm, block_n=bn, num_warps=4, num_stages=stages,
                                             programs_per_sm=pps, merge_block_dv=mdv))
        return out
    big = dict(block_m=64, block_n=64, num_warps=8)
    out += [SplitKVConfig(**big, num_stages=3, programs_per_sm=1.0, merge_block_dv=64),
            SplitKVConfig(**big, num_stages=3, programs_per_sm=1.0, merge_block_dv=16),
            SplitKVConfig(**big, num_stages=2, programs_per_sm=1.0, merge_block_dv=16),
            SplitKVConfig(block_m=64, block_n=64, num_warps=16, num_stages=2, programs_per_sm=1.0, merge_block_dv=16),
            SplitKVConfig(block_m=64, block_n=32, num_warps=4, num_stages=3, programs_per_sm=1.0, dv_split=2,
                          merge_block_dv=16),
            SplitKVConfig(block_m=64, block_n=32, num_warps=4, num_stages=2, programs_per_sm=2.0, dv_split=2,
                          merge_block_dv=16),
            SplitKVConfig(block_m=64, block_n=64, num_warps=4, num_stages=2, programs_per_sm=1.0, dv_split=2,
                          merge_block_dv=16)]
    if rows >= 128:
        out.append(SplitKVConfig(block_m=128, block_n=32, num_warps=8, num_stages=2, programs_per_sm=1.0, dv_split=2,
                                 merge_block_dv=16))
    return out


def time_partial_only(name: str, sets: Sequence[VerifyInputs], config: Any, n_runs: int) -> dict[str, float]:
    """Median ms of the split kernel without its merge (CUDA only): the merge's share is the difference."""
    from specdiag.kernels.triton_splitkv import split_kv_triton  # noqa: PLC0415

    page_size = variant(name).page_size
    outs = [s.out_like() for s in sets]
    calls: list[Callable[[], object]] = [
        (lambda s=s, o=o: split_kv_triton(s, o, page_size=page_size, cfg=config, partial_only=True))
        for s, o in zip(sets, outs)
    ]
    return summarize_ms(time_calls(calls, n_runs=n_runs, n_warmup=2, device=sets[0].q.device))


def tune(shapes: Iterable[VerifyShape], run: Run, peaks: dict[str, float], device: torch.device | str = "cuda",
         n_runs: int = 10, seed: int = 123, progress: Optional[Callable[[str], None]] = None) -> dict[int, Any]:
    """Time every candidate config of split_p1 on each shape; return the fastest correct one by rows."""
    device = torch.device(device)
    spec = GridSpec(contexts=[], heads=[], draft_tokens=[], layouts=[], n_runs=n_runs, n_warmup=2)
    best: dict[int, tuple[float, Any]] = {}
    for i, shape in enumerate(shapes):
        inputs = make_inputs(shape, device=device, seed=seed + i)
        ref = reference_verify(inputs)
        sets = rotation_sets(inputs, spec.rotate_bytes, seed + i)
        for cfg in candidate_configs(shape.rows):
            row = {"ts_unix_s": time.time(), "error": None, **shape_fields(shape), "kernel": "split_p1",
                   "config": cfg.as_dict()}
            try:
                row.update(plan_fields("split_p1", shape, cfg, device))
                row.update(measure_variant("split_p1", sets, ref, cfg, spec, peaks))
                if row["correct"] and row["ms_median"] < best.get(shape.rows, (math.inf, None))[0]:
                    best[shape.rows] = (row["ms_median"], cfg)
            except Exception as exc:  # noqa: BLE001 - a config that does not compile is a row, not a crash
                row["error"] = repr(exc)[:300]
            run.append_row(TUNING_TABLE, row)
            if progress:
                progress("tune " + (progress_line(row) if not row.get("error") else f"{cfg} ERROR {row['error'][:100]}"))
        if shape.rows in best:  # the winner's first kernel alone, to attribute time to the merge
            ms_best, cfg = best[shape.rows]
            row = {"ts_unix_s": time.time(), "error": None, **shape_fields(shape), "kernel": "split_p1_partial_only",
                   "config": cfg.as_dict(), **plan_fields("split_p1", shape, cfg, device)}
            try:
                row.update(time_partial_only("split_p1", sets, cfg, n_runs))
                row["merge_ms_by_difference"] = ms_best - row["ms_median"]
            except Exception as exc:  # noqa: BLE001
                row["error"] = repr(exc)[:300]
            run.append_row(TUNING_TABLE, row)
            if progress and not row["error"]:
                progress(f"tune partial-only rows={shape.rows}: {row['ms_median'] * 1e3:.1f} us of {ms_best * 1e3:.1f} us")
        del sets, inputs, ref
        torch.cuda.empty_cache()
    return {rows: cfg for rows, (_, cfg) in best.items()}


def config_picker(tuned: dict[int, Any]) -> Callable[[int], Any]:
    """configs(rows): the config tuned at the nearest row count (log scale) in the same regime.

    Regimes: rows <= 32 (small row tiles, several programs per SM) and rows > 32 (64-row tiles).
    Without a tuned config in the regime, the default (triton_splitkv.default_config).
    """
    from specdiag.kernels.splitkv_plan import default_config  # noqa: PLC0415

    def pick(rows: int) -> Any:
        same = [r for r in tuned if (r <= 32) == (rows <= 32)]
        if not same:
            return default_config(rows)
        return tuned[min(same, key=lambda r: abs(math.log2(r) - math.log2(rows)))]

    return pick
