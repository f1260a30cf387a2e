"""One kernel A/B case: the grid's shapes, inputs rotated past the L2, the correctness check, the timing, the row fields.

Shared by the grid (:mod:`specdiag.kernels.harness`) and the tuning (:mod:`specdiag.kernels.tuning`), so
neither imports the other's internals: harness -> tuning -> cases, harness -> cases.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Sequence

import torch

from specdiag.kernels.dispatch import (KERNEL_VARIANTS, fp8_wide_ring, prepared_call, resolve_config, run_variant,
                                      runs_gluon_ws, variant)
from specdiag.kernels.mla import (VerifyInputs, VerifyShape, arithmetic_intensity_flop_per_byte, kv_bytes,
                                  verify_flops, with_fresh_data)
from specdiag.kernels.timing import summarize_ms, time_calls

TABLE = "kernel_ab"
TUNING_TABLE = "kernel_ab_tuning"  #: written by specdiag.kernels.tuning
#: which kernel variants run on each layout: every registered variant (dispatch.KERNEL_VARIANTS, registry order),
#: except that a block table exists only for 64-token layouts, so page-size-64 variants skip shuffled_p1. Derived,
#: not listed: run 25's hand-kept list lacked its three new arms and the harness dropped them without a word.
LAYOUTS: tuple[str, ...] = ("contiguous", "shuffled_p1", "shuffled_b64")
VARIANTS_BY_LAYOUT: dict[str, tuple[str, ...]] = {
    layout: tuple(name for name, v in KERNEL_VARIANTS.items() if v.page_size == 1 or layout != "shuffled_p1")
    for layout in LAYOUTS
}


def kernels_not_run(kernels: Sequence[str], layouts: Sequence[str]) -> list[str]:
    """The names in ``kernels`` that no layout in ``layouts`` runs (unknown names, or 64-token kernels on shuffled_p1
    alone): the harness refuses them before any work, so a requested arm never goes missing from the rows."""
    runnable = set().union(*(VARIANTS_BY_LAYOUT.get(x, ()) for x in layouts)) if layouts else set()
    return [k for k in kernels if k not in runnable]


FP8_TOL = 0.1  #: largest accepted relative error of an fp8-KV kernel vs the fp32 reference of the bf16 cache


def fp8_case(sets: Sequence[VerifyInputs]) -> tuple[list[VerifyInputs], torch.Tensor]:
    """fp8 copies of the rotation sets and the fp32 reference of the first one's dequantized cache.

    An fp8 kernel is checked twice: against this reference (the kernel's own error, ``tol`` as for bf16)
    and against the bf16 cache's reference (kernel plus quantization error, ``FP8_TOL``; rel_err_vs_bf16_ref).
    """
    from specdiag.kernels.mla import dequantized, with_fp8_cache  # noqa: PLC0415
    from specdiag.kernels.reference import reference_verify  # noqa: PLC0415

    fp8 = [with_fp8_cache(s) for s in sets]
    return fp8, reference_verify(dequantized(fp8[0]))


@dataclass
class GridSpec:
    """What to measure.

    contexts:          prefix lengths P (tokens)
    heads:             local query heads H
    draft_tokens:      draft tokens T per verify step
    layouts:           KV layouts (mla.LAYOUTS)
    kernels:           kernel variants to run where the layout allows (dispatch.KERNEL_VARIANTS)
    n_runs, n_warmup:  timed runs (the median is reported) and untimed warm-up runs per case
    rotate_bytes:      least total size of the rotated input sets (B); 3 x a 60 MB L2 by default
    tol:               largest accepted relative error vs the fp32 reference
    baseline_max_ms:   skip a baseline case whose predicted time per run exceeds this (ms); the
                       prediction scales the same (H, T, layout)'s time at the previous context
    required:          (context, heads, draft_tokens) cases that always run every kernel
    chain, anchors:    chain-shaped drafts; anchor kernels (sglang_splitkv, flashinfer_mla) run on each case
    """

    contexts: list[int]
    heads: list[int]
    draft_tokens: list[int]
    layouts: list[str]
    kernels: list[str] = field(default_factory=lambda: ["baseline_p1", "split_p1", "split_b64"])
    n_runs: int = 20
    n_warmup: int = 3
    rotate_bytes: int = 180 * 10**6
    tol: float = 1e-2
    baseline_max_ms: float = 40.0
    required: list[tuple[int, int, int]] = field(default_factory=lambda: [(131072, 8, 8)])
    chain: bool = False  #: draft trees are chains (causal masks): the anchors (anchors.py) can run them
    anchors: list[str] = field(default_factory=list)  #: anchor kernels to run beside ours (anchors.ANCHORS)
    anchors_off: dict[str, str] = field(default_factory=dict)  #: anchors not run this time -> why (a skipped row each case)
    cases: Optional[list[tuple[int, int, int]]] = None  #: explicit (context, heads, draft_tokens), in this order, per layout

    def shapes(self) -> list[VerifyShape]:
        """Cases in measuring order: per (H, T, layout), contexts ascending (for the baseline cap); or ``cases`` as given."""
        if self.cases is not None:
            return [VerifyShape(c, h, t, lay) for c, h, t in self.cases for lay in self.layouts]
        return [VerifyShape(c, h, t, lay) for h in self.heads for t in self.draft_tokens for lay in self.layouts
                for c in sorted(self.contexts)]


def full_grid() -> GridSpec:
    """The issue's grid: context 8k-256k; 8, 16, 128 heads; 1, 8, 16, 64 draft tokens; 3 layouts."""
    return GridSpec(contexts=[8192, 32768, 65536, 131072, 262144], heads=[8, 16, 128], draft_tokens=[1, 8, 16, 64],
                    layouts=["contiguous", "shuffled_p1", "shuffled_b64"])


def smoke_grid() -> GridSpec:
    """A tiny grid for the CPU (tests, CI, the notebook without a GPU)."""
    return GridSpec(contexts=[128, 512], heads=[2], draft_tokens=[1, 4], layouts=["contiguous", "shuffled_p1",
                                                                                      "shuffled_b64"],
                    n_runs=3, n_warmup=1, rotate_bytes=0, required=[], baseline_max_ms=1e9)


def relative_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    """||out - ref|| / ||ref|| in fp32; inf when out holds a NaN or inf."""
    out32 = out.float()
    if not torch.isfinite(out32).all():
        return math.inf
    return float((out32 - ref).norm() / ref.norm())


def derived_metrics(n_kv: int, heads: int, draft_tokens: int, ms: float, copy_gbps: float,
                    matmul_tflops: float) -> dict[str, float]:
    """GB/s (KV bytes read once), TFLOPS and the % of each measured peak, from a time in ms."""
    b = kv_bytes(n_kv)
    f = verify_flops(heads, draft_tokens, n_kv)
    gbps = b / (ms * 1e-3) / 1e9
    tflops = f / (ms * 1e-3) / 1e12
    floor_ms = max(b / (copy_gbps * 1e9), f / (matmul_tflops * 1e12)) * 1e3
    return {"kv_bytes": b, "flops": f, "gbps": gbps, "tflops": tflops,
            "pct_copy_bw": 100 * gbps / copy_gbps, "pct_matmul": 100 * tflops / matmul_tflops,
            "floor_ms": floor_ms, "pct_of_floor": 100 * floor_ms / ms}


def rotation_sets(inputs: VerifyInputs, rotate_bytes: int, seed: int, max_sets: int = 32) -> list[VerifyInputs]:
    """``inputs`` plus fresh-data copies until their caches total at least ``rotate_bytes``."""
    pool_bytes = inputs.cache.numel() * inputs.cache.element_size()
    n = min(max_sets, max(2 if rotate_bytes > 0 else 1, math.ceil(rotate_bytes / max(1, pool_bytes))))
    return [inputs] + [with_fresh_data(inputs, seed + 1000 + k) for k in range(n - 1)]


def check_once(name: str, inputs: VerifyInputs, ref: torch.Tensor, config: Any, tol: float) -> dict[str, Any]:
    """One run into a NaN-poisoned output, compared with the reference."""
    out = inputs.out_like()
    run_variant(name, inputs, out, config)
    if out.is_cuda:
        torch.cuda.synchronize(out.device)
    err = relative_error(out, ref)
    unwritten = int(torch.isnan(out).sum())
    return {"rel_err": err, "unwritten": unwritten, "correct": bool(err <= tol and unwritten == 0)}


def config_dict(config: Any) -> Optional[dict]:
    return config.as_dict() if hasattr(config, "as_dict") else None


def measure_variant(name: str, sets: Sequence[VerifyInputs], ref: torch.Tensor, config: Any, spec: GridSpec,
                    peaks: dict[str, float]) -> dict[str, Any]:
    """Check then time one kernel variant on one case; returns the row's measured fields."""
    first = sets[0]
    row: dict[str, Any] = check_once(name, first, ref, config, spec.tol)
    outs = [s.out_like() for s in sets]
    calls: list[Callable[[], object]] = [prepared_call(name, s, o, config) for s, o in zip(sets, outs)]
    samples = time_calls(calls, n_runs=spec.n_runs, n_warmup=spec.n_warmup, device=first.q.device)
    row.update(summarize_ms(samples))
    row["ms_samples"] = [round(x, 5) for x in samples]
    row.update(derived_metrics(first.n_kv, first.heads, first.draft_tokens, row["ms_median"],
                               peaks["copy_gbps"], peaks["matmul_tflops"]))
    return row


def shape_fields(shape: VerifyShape) -> dict[str, Any]:
    return {"context_tokens": shape.context_tokens, "heads": shape.heads, "draft_tokens": shape.draft_tokens,
            "layout": shape.layout, "rows": shape.rows, "n_kv": shape.n_kv,
            "intensity_flop_per_byte": arithmetic_intensity_flop_per_byte(shape.heads, shape.draft_tokens)}


def plan_fields(name: str, shape: VerifyShape, config: Any, device: torch.device) -> dict[str, Any]:
    v = variant(name)
    if device.type != "cuda":
        return {}
    if v.design == "baseline":
        from specdiag.kernels.triton_baseline import grid_programs  # noqa: PLC0415

        return {"programs": grid_programs(shape.heads, shape.draft_tokens)}
    if v.design == "ragged_split_kv":
        from specdiag.kernels.triton_splitkv import sm_count  # noqa: PLC0415
        from specdiag.kernels.triton_splitkv_ragged import describe_ragged_plan  # noqa: PLC0415

        tile_rows = None
        if v.kv_fp8:  # the fp8 kernel's row tiles (32 rows, or 64 in an FP8_N64_RINGS ring), as _ragged_call runs it
            from specdiag.kernels.gluon_ws_ragged import fp8_call_tiles  # noqa: PLC0415

            tile_rows = fp8_call_tiles(shape.heads, shape.rows, fp8_wide_ring(v, shape.rows))[0]
        return describe_ragged_plan(shape.rows, shape.n_kv, resolve_config(name, shape.rows, config),
                                    sm_count(device.index or 0), tile_rows=tile_rows)
    if v.design not in ("split_kv", "fused_split_kv"):
        return {}
    from specdiag.kernels.splitkv_plan import SELF_MERGE_MAX_BLOCK_M, default_fused_config  # noqa: PLC0415
    from specdiag.kernels.triton_splitkv import default_config, describe_plan, sm_count  # noqa: PLC0415

    if v.design == "split_kv":
        grid_merge = v.gluon_grid_merge and runs_gluon_ws(v, shape.rows)
        plan = describe_plan(shape.rows, shape.n_kv, config or default_config(shape.rows),
                             sm_count(device.index or 0), coresident=grid_merge)
        return {**plan, "merge": "grid"} if grid_merge else plan

    cfg = config or default_fused_config(shape.rows, kv_fp8=v.kv_fp8)
    self_merge = v.merge == "self" or cfg.block_m < SELF_MERGE_MAX_BLOCK_M
    return {**describe_plan(shape.rows, shape.n_kv, cfg, sm_count(device.index or 0)),
            "merge": "self" if self_merge else "kernel"}


def progress_line(row: dict) -> str:
    if row.get("error"):
        return f"{row['kernel']:<12} P={row['context_tokens']:>6} H={row['heads']:>3} T={row['draft_tokens']:>2} " \
               f"{row['layout']:<12} ERROR {row['error'][:120]}"
    return (f"{row['kernel']:<12} P={row['context_tokens']:>6} H={row['heads']:>3} T={row['draft_tokens']:>2} "
            f"{row['layout']:<12} {row['ms_median']:9.4f} ms {row['gbps']:8.1f} GB/s {row['tflops']:7.1f} TF "
            f"{row['pct_copy_bw']:5.1f}%bw {row['pct_matmul']:5.1f}%mm err {row['rel_err']:.1e}")
