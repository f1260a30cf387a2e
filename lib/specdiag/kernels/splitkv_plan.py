"""Split-KV launch parameters and the split plan (no Triton needed: the CPU code reads these too).

The plan: row tiles = ceil(rows / block_m); KV splits so that tiles x splits is about
``programs_per_sm`` x SM count, each split a multiple of 64 tokens and at least ``min_split_tokens``.
Partial bytes written and read back by the merge = splits x rows x (512 x 4 + 4) B with fp32
partials: at batch 1 with 64 rows and 132 splits that is 17 MB, which sets a floor on what a
split kernel can reach at short contexts (see docs/kernel-notes.md).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from specdiag.kernels.mla import BLOCK_TOKENS, D_V


@dataclass(frozen=True)
class SplitKVConfig:
    """Launch parameters of the split-KV kernel.

    block_m:          query rows (heads x draft tokens) per program (16, 32 or 64)
    block_n:          KV tokens per loop step (16, 32 or 64; at most 64 for page_size 64)
    num_warps:        warps per program
    num_stages:       software-pipelining depth of the KV loads
    programs_per_sm:  target programs (tiles x splits) per SM; sets the number of KV splits
    min_split_tokens: fewest tokens per split (a split's fixed costs: Q load, partial write)
    partial_bf16:     store split partials in bf16 instead of fp32 (half the partial bytes)
    evict_first:      load KV with the evict_first cache hint (streamed once)
    dv_split:         programs sharing one (row tile, split), each accumulating 512/dv_split value dims
                      (smaller accumulators; each recomputes the scores)
    merge_block_dv:   value dims per merge program (smaller: more merge programs in flight)
    """

    block_m: int = 64
    block_n: int = 32
    num_warps: int = 8
    num_stages: int = 3
    programs_per_sm: float = 1.0
    min_split_tokens: int = 128
    partial_bf16: bool = False
    evict_first: bool = False
    dv_split: int = 1
    merge_block_dv: int = 64

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class SplitPlan:
    n_tiles: int
    n_splits: int
    tokens_per_split: int

    @property
    def programs(self) -> int:
        return self.n_tiles * self.n_splits


def default_config(rows: int) -> SplitKVConfig:
    """The launch parameters used when none are given, by packed rows (heads x draft tokens).

    The fastest correct configurations of the tuning sweep on the H200 (data/reference/kernel-ab-h200,
    table kernel_ab_tuning; docs/kernel-notes.md has the measurements behind each choice).
    """
    if rows <= 32:  # run 2: 59.7 us at h8 T1 128k (one program per SM: 70.5 us; 32-token tiles: 65.1 us)
        return SplitKVConfig(block_m=16 if rows <= 16 else 32, block_n=64, num_warps=4, num_stages=2,
                             programs_per_sm=2.0, merge_block_dv=16)
    if rows <= 128:  # run 2: 98.0 us at h8 T8 128k (16 warps: 181.7 us; value dims split: 162.1 us)
        return SplitKVConfig(block_m=64, block_n=64, num_warps=8, num_stages=3, programs_per_sm=1.0,
                             merge_block_dv=16)
    # run 2: 1.149 ms at h16 T64 128k (3 stages: 1.196 ms; 16 warps: 2.419 ms)
    return SplitKVConfig(block_m=64, block_n=64, num_warps=8, num_stages=2, programs_per_sm=1.0, merge_block_dv=16)


def plan_splits(rows: int, n_kv: int, cfg: SplitKVConfig, num_sms: int) -> SplitPlan:
    """How many row tiles and KV splits, and how many tokens per split (a multiple of 64)."""
    n_tiles = -(-rows // cfg.block_m)
    want = max(1, round(cfg.programs_per_sm * num_sms / (n_tiles * cfg.dv_split)))
    per_split = -(-n_kv // want)
    per_split = max(per_split, cfg.min_split_tokens)
    per_split = -(-per_split // BLOCK_TOKENS) * BLOCK_TOKENS
    return SplitPlan(n_tiles=n_tiles, n_splits=-(-n_kv // per_split), tokens_per_split=per_split)


def describe_plan(rows: int, n_kv: int, cfg: SplitKVConfig, num_sms: int) -> dict:
    """The plan as a dict for result rows (tiles, splits, tokens per split, partial bytes)."""
    plan = plan_splits(rows, n_kv, cfg, num_sms)
    partial_elem_bytes = 2 if cfg.partial_bf16 else 4
    partial_bytes = 0 if plan.n_splits == 1 else plan.n_splits * rows * (D_V * partial_elem_bytes + 4)
    programs = plan.programs * cfg.dv_split
    return {"n_tiles": plan.n_tiles, "n_splits": plan.n_splits, "tokens_per_split": plan.tokens_per_split,
            "programs": programs, "partial_bytes": partial_bytes, "waves": programs / max(1, num_sms)}
