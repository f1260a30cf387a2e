"""Split-KV launch parameters and the split plan (no Triton needed: the CPU code reads these too).

The plan: row tiles = ceil(rows / block_m); KV splits so that tiles x splits is about
``programs_per_sm`` x SM count, each split a multiple of ``split_round_tokens`` (64 by default) and at least
``min_split_tokens``.
Partial bytes written and read back by the merge = splits x rows x (512 x 4 + 4) B with fp32
partials: at batch 1 with 64 rows and 132 splits that is 17 MB, which sets a floor on what a
split kernel can reach at short contexts.
"""

from __future__ import annotations

import functools
from dataclasses import asdict, dataclass, replace

import torch

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
    merge_block_dv:   value dims per merge program (smaller: more merge programs in flight)
    pdl:              launch the merge as a programmatic dependent launch (sm_90), its launch overlapping the partial
                      grid's drain (the plugin's Gluon calls set it)
    merge_one_pass:   the merge loads every split of its outputs at once, lse and partials together, in one round
                      trip (8,192 fp32 per program, 8 warps; merge_block_dv then follows from the split count), where
                      the default reads the lse in one pass and the partials in another, 64 splits at a time
    merge_one_pass_max_splits: the one pass only up to this many splits (padded to a power of two; on the H200 calls
                      with it took 1.00-1.04x those with two passes at 33-129 splits from 64 rows, 0.96-0.98x at 8
                      splits and at 8-16 rows: ``one_pass_merge_fields``)
    split_round_tokens: each split's tokens a multiple of this (64: a tile's, and a page's of the block layout, which
                      the block-table kernels need). 1 cuts the KV into equal shares of tokens: at 128k and one
                      draft token a 64-token round gives 129 splits of 1,024 tokens (3 of 132 SMs idle, the rest
                      3 % over an equal share of 993), a round of 1 gives 132 of 993 (the last split's last tile
                      partly filled). Token-table kernels only (page_size 1). Everything that ships keeps 64: on the
                      H200 equal shares took 1.003-1.040x the time on a bf16 cache and 0.987-1.007x on fp8.
    """

    block_m: int = 64
    block_n: int = 32
    num_warps: int = 8
    num_stages: int = 3
    programs_per_sm: float = 1.0
    min_split_tokens: int = 128
    merge_block_dv: int = 64
    pdl: bool = False
    merge_one_pass: bool = False
    merge_one_pass_max_splits: int = 512
    split_round_tokens: int = BLOCK_TOKENS

    def __post_init__(self) -> None:
        if self.split_round_tokens < 1:
            raise ValueError(f"split_round_tokens must be a positive number of tokens; got {self.split_round_tokens}")

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

    The fastest correct configurations of a tuning sweep of triton.splitkv on the H200 (tiles, warps, stages,
    programs per SM, merge width, value-dim split); each branch notes its time at 128k tokens and the nearest rivals'.
    """
    if rows <= 32:  # 59.7 us at 8 heads x 1 draft token (one program per SM: 70.5 us; 32-token tiles: 65.1 us)
        return SplitKVConfig(block_m=16 if rows <= 16 else 32, block_n=64, num_warps=4, num_stages=2,
                             programs_per_sm=2.0, merge_block_dv=16)
    if rows <= 128:  # 98.0 us at 8 heads x 8 draft tokens (16 warps: 181.7 us; value dims split: 162.1 us)
        return SplitKVConfig(block_m=64, block_n=64, num_warps=8, num_stages=3, programs_per_sm=1.0,
                             merge_block_dv=16)
    # 1.149 ms at 16 heads x 64 draft tokens (3 stages: 1.196 ms; 16 warps: 2.419 ms)
    return SplitKVConfig(block_m=64, block_n=64, num_warps=8, num_stages=2, programs_per_sm=1.0, merge_block_dv=16)


#: The Gluon kernels' tile: 64 rows, 8 warps (two warpgroups)
GLUON_BLOCK_M = 64
GLUON_NUM_WARPS = 8


def gluon_config(block_n: int = 64, stages: int = 2) -> SplitKVConfig:
    """The split plan's parameters of the Gluon kernels at every row count: 64-row tiles, one program per SM
    (gluon.ws's shared memory compiled with Triton 3.6 for sm_90: 229,900 B at (64, 2), 188,972 B at (32, 3)),
    ``block_n`` tokens per KV tile, ``stages`` tiles in the ring."""
    return SplitKVConfig(block_m=GLUON_BLOCK_M, block_n=block_n, num_warps=GLUON_NUM_WARPS, num_stages=stages,
                         programs_per_sm=1.0, merge_block_dv=16)


def plan_splits(rows: int, n_kv: int, cfg: SplitKVConfig, num_sms: int) -> SplitPlan:
    """How many row tiles and KV splits, and how many tokens per split (a multiple of ``cfg.split_round_tokens``)."""
    n_tiles = -(-rows // cfg.block_m)
    want = max(1, round(cfg.programs_per_sm * num_sms / n_tiles))
    per_split = split_tokens(n_kv, want, cfg)
    return SplitPlan(n_tiles=n_tiles, n_splits=-(-n_kv // per_split), tokens_per_split=per_split)


def split_tokens(n_kv: int, want_splits: int, cfg: SplitKVConfig) -> int:
    """Tokens per split for about ``want_splits`` splits of ``n_kv`` tokens: an equal share, at least
    ``cfg.min_split_tokens``, rounded up to a multiple of ``cfg.split_round_tokens`` (the ragged kernels compute the
    same on the device, from their ROUND)."""
    per_split = max(-(-n_kv // want_splits), cfg.min_split_tokens)
    return -(-per_split // cfg.split_round_tokens) * cfg.split_round_tokens


#: On the H200 the merge kernel in one pass paid below 33 rows (8-16 rows, 132-257 splits: 0.96-0.97 of the two-pass
#: call's time at 64k-128k tokens) and at 8 splits from 64 rows (0.98); from 33 rows at 33-129 splits it did not
#: (1.00-1.04). The rule the pick and the plugin's kernels follow (``one_pass_merge_fields``).
ONE_PASS_MAX_SPLITS_FROM_33_ROWS = 16


def one_pass_merge_fields(rows: int) -> dict:
    """The merge fields of the one-pass rule at ``rows`` packed rows: one pass at every split count up to 32 rows,
    up to ``ONE_PASS_MAX_SPLITS_FROM_33_ROWS`` splits above."""
    return {"merge_one_pass": True,
            "merge_one_pass_max_splits": 512 if rows <= 32 else ONE_PASS_MAX_SPLITS_FROM_33_ROWS}


def describe_plan(rows: int, n_kv: int, cfg: SplitKVConfig, num_sms: int) -> dict:
    """The plan as a dict for result rows (tiles, splits, tokens per split, fp32 partial bytes)."""
    plan = plan_splits(rows, n_kv, cfg, num_sms)
    partial_bytes = 0 if plan.n_splits == 1 else plan.n_splits * rows * (D_V * 4 + 4)
    return {"n_tiles": plan.n_tiles, "n_splits": plan.n_splits, "tokens_per_split": plan.tokens_per_split,
            "programs": plan.programs, "partial_bytes": partial_bytes, "waves": plan.programs / max(1, num_sms)}


@functools.lru_cache(maxsize=8)
def sm_count(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def n_splits_for(rows_per_request: int, batch: int, num_sms: int, cfg: SplitKVConfig,
                 tile_rows: int | None = None) -> int:
    """KV splits per request of the fixed grid: about ``programs_per_sm`` x SMs programs in all, over the request's
    row tiles of ``tile_rows`` (None: ``cfg.block_m``)."""
    n_tiles = -(-rows_per_request // (tile_rows or cfg.block_m))
    return max(1, round(cfg.programs_per_sm * num_sms / (n_tiles * max(1, batch))))


def describe_ragged_plan(rows: int, n_kv: int, cfg: SplitKVConfig, num_sms: int, batch: int = 1,
                         tile_rows: int | None = None) -> dict:
    """The plan the ragged kernel makes on the device for a request of ``n_kv`` tokens (prefix + draft) in a batch of
    ``batch`` such requests, as plan.describe_plan's fields: the grid's splits (``grid_splits``), those that
    hold tokens (``n_splits``: the merge's), tokens per split, programs of the grid, fp32 partial bytes, waves.
    ``tile_rows``: rows per row tile where the kernel's are not ``cfg.block_m`` (the fp8 kernel's, gluon.ragged
    ``fp8_tile_rows``: the splits are shared out over them)."""
    n_tiles = -(-rows // (tile_rows or cfg.block_m))
    grid_splits = n_splits_for(rows, batch, num_sms, cfg, tile_rows=tile_rows)
    per_split = split_tokens(n_kv, grid_splits, cfg)
    n_active = -(-n_kv // per_split)
    programs = n_tiles * grid_splits * batch
    return {"n_tiles": n_tiles, "n_splits": n_active, "grid_splits": grid_splits, "tokens_per_split": per_split,
            "programs": programs, "partial_bytes": n_active * rows * (D_V * 4 + 4) * batch,
            "waves": programs / max(1, num_sms)}


# ---- shared memory of the ragged kernel (triton.ragged._ragged_partial_kernel) and the ladder ----

#: The H200's (sm_90) shared memory per block with opt-in, as Triton reports it when a launch asks for more
#: (OutOfResources "Hardware limit: 232448").
SHARED_LIMIT_SM90 = 232448
#: Room kept below the limit when a configuration is chosen by the formula (tiles not in RAGGED_SHARED_SM90).
SHARED_MARGIN = 16384

#: Shared memory of the ragged partial kernel (one tile serves as keys and values), compiled with Triton 3.6.0 for
#: sm_90, bf16, by (block_m, block_n, num_warps, num_stages): every rung of ragged_config_ladder and default_config's
#: tiles (pointers and the strides SGLang passes marked divisible by 16, as at run time; tests/test_splitkv_shared.py
#: compiles them again). A form that loads a separate value tile needs 295,936 B at (64, 64, 8, 3), more than sm_90
#: has, and 227,328 B at (16, 64, 4, 2).
RAGGED_SHARED_SM90: dict[tuple[int, int, int, int], int] = {
    (64, 64, 8, 3): 230400, (64, 64, 8, 2): 229376, (64, 64, 8, 1): 147456,
    (64, 32, 8, 3): 156160, (64, 32, 8, 2): 155648, (64, 32, 4, 2): 155648, (64, 32, 8, 1): 131072,
    (64, 16, 8, 2): 131072,
    (32, 64, 4, 2): 118784, (32, 64, 4, 3): 119808, (32, 32, 4, 2): 77824,
    (16, 64, 4, 2): 96256, (16, 64, 4, 3): 97280, (16, 32, 4, 2): 57344, (16, 16, 4, 2): 37888, (16, 16, 4, 1): 51200,
}


def ragged_shared_bytes(cfg: SplitKVConfig, elem_bytes: int = 2) -> int:
    """Shared memory the ragged partial kernel needs with ``cfg`` (bytes; bf16/fp16 when elem_bytes is 2).

    The compiled number where the tile is in ``RAGGED_SHARED_SM90`` (scaled by ``elem_bytes`` / 2); otherwise a
    formula from the kernel's tiles (D_QK = 576 latent+rope dims) that reproduces the compiled numbers of the
    pipelined 32- and 64-token tiles:
      64-row tiles (wgmma): the q tile ``block_m x 576`` + one KV tile ``block_n x 576``, and with ``num_stages``
        >= 2 a second KV tile (the async copy's buffer) and the q rope part ``block_m x 64``;
      smaller row tiles (mma.sync): the q tile + one KV tile + the scores in fp32 ``block_m x block_n x 4``;
      + 16 bytes per key per stage beyond the second (the slot indices' buffers).
    The formula is short of the compiler by up to 20,480 B for 16-token tiles and one stage (in the table), so
    fitting_ladder keeps SHARED_MARGIN below the limit for a tile the table lacks.
    """
    known = RAGGED_SHARED_SM90.get((cfg.block_m, cfg.block_n, cfg.num_warps, cfg.num_stages))
    if known is not None:
        return known * elem_bytes // 2
    d_qk, d_pe = D_V + 64, 64
    need = cfg.block_m * d_qk * elem_bytes + cfg.block_n * d_qk * elem_bytes
    if cfg.block_m >= 64:
        if cfg.num_stages >= 2:
            need += cfg.block_n * d_qk * elem_bytes + cfg.block_m * d_pe * elem_bytes
    else:
        need += cfg.block_m * cfg.block_n * 4
    return need + max(0, cfg.num_stages - 2) * cfg.block_n * 16


def ragged_shared_is_compiled(cfg: SplitKVConfig) -> bool:
    """Whether ``ragged_shared_bytes(cfg)`` is a compiled number (RAGGED_SHARED_SM90) rather than the formula."""
    return (cfg.block_m, cfg.block_n, cfg.num_warps, cfg.num_stages) in RAGGED_SHARED_SM90


def ragged_config_ladder(rows: int) -> list[SplitKVConfig]:
    """Configurations to try for the ragged kernel, fastest first, each needing less shared memory.

    The first is the tuned default of the non-ragged kernel (default_config) with the one-pass merge rule
    (``one_pass_merge_fields``); the rungs below halve the KV tile, then the row tile, ending at 16 x 16
    tiles (37,888 B compiled; without pipelining that tile needs more, 51,200 B, so no rung drops it).
    """
    first = replace(default_config(rows), **one_pass_merge_fields(rows))
    rungs = [first]
    for bm, bn, warps, stages in ((64, 64, 8, 2), (64, 32, 8, 3), (64, 32, 4, 2), (32, 32, 4, 2),
                                  (16, 32, 4, 2), (16, 16, 4, 2)):
        if bm > first.block_m:
            continue
        cfg = SplitKVConfig(block_m=bm, block_n=bn, num_warps=warps, num_stages=stages,
                            programs_per_sm=first.programs_per_sm, min_split_tokens=first.min_split_tokens,
                            merge_block_dv=first.merge_block_dv, merge_one_pass=first.merge_one_pass,
                            merge_one_pass_max_splits=first.merge_one_pass_max_splits)
        if cfg not in rungs:
            rungs.append(cfg)
    return rungs


def fitting_ladder(rows: int, shared_limit: int = SHARED_LIMIT_SM90, elem_bytes: int = 2,
                   margin: int = SHARED_MARGIN) -> list[SplitKVConfig]:
    """The ladder without the rungs that cannot fit: ``need > limit`` for a compiled number, ``need > limit -
    margin`` for the formula's (ragged_shared_bytes).

    Never empty: if no rung fits by the estimate, the smallest one is kept (the launch decides).
    """
    ladder = ragged_config_ladder(rows)
    fit = [c for c in ladder
           if ragged_shared_bytes(c, elem_bytes) <= shared_limit - (0 if ragged_shared_is_compiled(c) else margin)]
    return fit or ladder[-1:]


def is_out_of_resources(exc: BaseException) -> bool:
    """Triton's OutOfResources (raised when the compiled kernel is loaded, before anything runs)."""
    return type(exc).__name__ == "OutOfResources" or "out of resource" in str(exc)


class ConfigLadder:
    """The first configuration that launches, per shape key; a smaller one after each OutOfResources.

    ``run(key, rows, launch)`` calls ``launch(cfg)`` with the cached configuration of ``key`` or, the first
    time, with each rung of :func:`fitting_ladder` in turn until one does not raise OutOfResources; that
    one is cached (and reported once through ``on_choice``). Other errors propagate at once; when every
    rung runs out of resources the last OutOfResources propagates (the caller falls back) and the key is
    remembered as exhausted, so later calls fail fast without compiling again.
    """

    def __init__(self, shared_limit: int = SHARED_LIMIT_SM90, elem_bytes: int = 2, margin: int = SHARED_MARGIN,
                 on_choice=None):
        self.shared_limit = shared_limit
        self.elem_bytes = elem_bytes
        self.margin = margin
        self.on_choice = on_choice
        self.chosen: dict = {}
        self.failed: dict = {}  # key -> list of (config, error text) that ran out of resources
        self.exhausted: dict = {}

    def run(self, key, rows: int, launch):
        if key in self.chosen:
            return launch(self.chosen[key])
        if key in self.exhausted:
            raise RuntimeError(f"no split-KV configuration fits for {key}: {self.exhausted[key]}")
        last = None
        for cfg in fitting_ladder(rows, self.shared_limit, self.elem_bytes, self.margin):
            try:
                out = launch(cfg)
            except Exception as exc:  # noqa: BLE001  only resource errors step down
                if not is_out_of_resources(exc):
                    raise
                self.failed.setdefault(key, []).append((cfg, f"{type(exc).__name__}: {exc}"))
                last = exc
                continue
            self.chosen[key] = cfg
            if self.on_choice is not None:
                self.on_choice(key, cfg, ragged_shared_bytes(cfg, self.elem_bytes), self.failed.get(key, []))
            return out
        self.exhausted[key] = f"every rung ran out of resources (last: {last})"
        raise last
