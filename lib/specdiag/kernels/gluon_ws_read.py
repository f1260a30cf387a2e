"""The read floor of the pick's launch shape: gluon_ws's grid, split, ring and copies, without the attention.

Session 5's anatomy (``anatomy.read_gather``) measured a read-only kernel of split_p1's grid (two 16-row programs per
SM) at 41.9 us for 128k tokens, the 85 % target's whole allowance. Since run 37 the pick is the warp-specialized Gluon
kernel at every row count (one program per SM, a copy warpgroup, 64-token tiles in a ring of two), which takes
52.3 us there (docs/kernel-notes.md, "Where issue 13 stands after session 10"); what its launch shape costs before
any math was never measured. This is that kernel with the math taken out:

- the same shared-memory setup (``gluon_ws.ws_shared_state``), the same plan (``splitkv_plan.plan_splits`` with
  ``gluon_config``) and split bounds; nothing reads Q or P here, so the compiler drops them: 147,604 B of shared
  memory compiled for sm_90 (the pick: 229,900 B), still over half an SM's, so one program per SM as the pick;
- warpgroup 1 issues every tile's copy as the pick's copy partition does (``_tile_slots`` / ``_issue_tile``, the
  token-table rows a tile ahead with PREFETCH), refilling a buffer once warpgroup 0 frees it;
- warpgroup 0 waits for each tile to land and frees it at once (no scores, no softmax, no P V), then writes the
  number of tiles it saw to ``sink`` [programs, 128] (int32): the test's proof that every program ran its split.

No partials, no merge: the time of a call is what streaming the case's KV through this launch shape costs.
"""

from __future__ import annotations

from dataclasses import replace

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier

from specdiag.kernels.gluon_splitkv import check_gluon_inputs
from specdiag.kernels.gluon_ws import (WS_PARTITION_WARPS, WS_WORKER_REGS, _issue_first_tiles, _refill, _tile_slots,
                                       _wait_tile, split_bounds, ws_shared_state)
from specdiag.kernels.mla import BLOCK_TOKENS, D_NOPE, D_PE, VerifyInputs
from specdiag.kernels.splitkv_plan import GLUON_BLOCK_M, SplitPlan, gluon_config, plan_splits


#: Columns of a timeline row (one per program, int64): %globaltimer ns at warpgroup 0's start, when the first tile
#: has landed, after the last tile, after the sink's store; then the program's %smid.
TIMELINE_COLUMNS: tuple[str, ...] = ("start_ns", "first_tile_ns", "loop_end_ns", "done_ns", "sm")


@gluon.jit
def _globaltimer(tick):
    """The GPU's global nanosecond timer (%globaltimer, one clock for every SM), one per element of ``tick``."""
    return gl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l,r", [tick], dtype=gl.int64, is_pure=False,
                                     pack=1)


@gluon.jit
def _smid(tick):
    """The SM this thread runs on (%smid), one per element of ``tick``."""
    return gl.inline_asm_elementwise("mov.u32 $0, %smid;", "=r,r", [tick], dtype=gl.int32, is_pure=False, pack=1)


@gluon.jit
def _drain_partition(kv_ready, kv_free, SINK, TL, n_iter, prog, STAGES: gl.constexpr, WARPS: gl.constexpr,
                     TIMELINE: gl.constexpr):
    """Warpgroup 0: each tile waited for and freed, then the count of tiles into the sink; with TIMELINE, thread 0
    writes the program's row of ``TL`` (:data:`TIMELINE_COLUMNS`)."""
    tid = gl.arange(0, 32 * WARPS, layout=gl.BlockedLayout([1], [32], [WARPS], [0]))
    if TIMELINE:
        t_start = _globaltimer(tid)
        t_first = t_start
    for it in range(0, n_iter):
        _wait_tile(kv_ready, it, STAGES)
        if TIMELINE:
            if it == 0:
                t_first = _globaltimer(tid)
        mbarrier.arrive(kv_free.index(it % STAGES), count=1)
    if TIMELINE:
        t_loop = _globaltimer(tid)
    gl.store(SINK + prog.to(gl.int64) * (32 * WARPS) + tid,
             gl.full([32 * WARPS], 0, gl.int32, layout=tid.type.layout) + n_iter)
    if TIMELINE:
        t_done = _globaltimer(tid)
        row = TL + prog.to(gl.int64) * 5
        first = tid == 0
        gl.store(row + 0 + tid * 0, t_start, mask=first)
        gl.store(row + 1 + tid * 0, t_first, mask=first)
        gl.store(row + 2 + tid * 0, t_loop, mask=first)
        gl.store(row + 3 + tid * 0, t_done, mask=first)
        gl.store(row + 4 + tid * 0, _smid(tid).to(gl.int64), mask=first)


@gluon.jit
def _copy_partition(kv_smem, pe_smem, kv_ready, kv_free, KV, TOKEN_TABLE, n_prefix, start, end, n_iter, stride_kv,
                    BLOCK_N: gl.constexpr, STAGES: gl.constexpr, D_NOPE: gl.constexpr, D_PE: gl.constexpr,
                    WARPS: gl.constexpr, PREFETCH: gl.constexpr):
    """Warpgroup 1: the pick's copy loop (gluon_ws ``_pv_loader_partition``) without its P V."""
    LD: gl.constexpr = gl.BlockedLayout([1, 8], [1, 32], [WARPS, 1], [1, 0])
    LD_PE: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [WARPS, 1], [1, 0])
    nx_slot, nx_slot_pe = _issue_first_tiles(KV, kv_smem, pe_smem, kv_ready, TOKEN_TABLE, TOKEN_TABLE, n_prefix, start,
                                             end, stride_kv, BLOCK_N, STAGES, D_NOPE, D_PE, LD, LD_PE, False)
    for it in range(0, n_iter):
        buf = it % STAGES
        if it + STAGES < n_iter:
            pos0 = start + (it + STAGES) * BLOCK_N
            if not PREFETCH:
                nx_slot, nx_slot_pe = _tile_slots(TOKEN_TABLE, TOKEN_TABLE, n_prefix, pos0, end, BLOCK_N, LD, LD_PE,
                                                  False)
            mbarrier.wait(kv_free.index(buf), (it // STAGES) & 1)
            nx_slot, nx_slot_pe = _refill(KV, kv_smem, pe_smem, kv_ready, buf, nx_slot, nx_slot_pe, TOKEN_TABLE,
                                          TOKEN_TABLE, n_prefix, pos0, end, stride_kv, BLOCK_N, D_NOPE, D_PE, LD, LD_PE,
                                          PREFETCH, False)


@gluon.jit
def _ws_read_kernel(Q, KV, TOKEN_TABLE, SINK, TL, n_prefix, n_kv, n_rows, tokens_per_split, stride_kv, n_splits,
                    BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr, D_NOPE: gl.constexpr,
                    D_PE: gl.constexpr, num_warps: gl.constexpr, WORKER_REGS: gl.constexpr, PREFETCH: gl.constexpr,
                    TIMELINE: gl.constexpr):
    """One program per (64-row tile, split), as gluon_ws ``_ws_partial_kernel``: its shared memory, its split, its
    copies; no math (module doc)."""
    pid_m = gl.program_id(0)
    pid_s = gl.program_id(1)
    (q_smem, qpe_smem, kv_smem, pe_smem, p_smem, row_smem, kv_ready, kv_free, p_ready, p_free,
     l_ready) = ws_shared_state(Q, pid_m, n_rows, BLOCK_M, BLOCK_N, STAGES, D_NOPE, D_PE, num_warps)
    start, end, n_iter = split_bounds(pid_s, tokens_per_split, n_kv, n_splits, BLOCK_N)
    prog = pid_s * gl.num_programs(0) + pid_m
    gl.warp_specialize([
        (_drain_partition, (kv_ready, kv_free, SINK, TL, n_iter, prog, STAGES, num_warps, TIMELINE)),
        (_copy_partition, (kv_smem, pe_smem, kv_ready, kv_free, KV, TOKEN_TABLE, n_prefix, start, end, n_iter,
                           stride_kv, BLOCK_N, STAGES, D_NOPE, D_PE, num_warps, PREFETCH)),
    ], [num_warps], [WORKER_REGS])


def read_plan(inputs: VerifyInputs, block_n: int = 64, stages: int = 2, num_sms: int | None = None,
              round_tokens: int = BLOCK_TOKENS) -> SplitPlan:
    """The pick's plan on ``inputs`` (gluon_ws's: ``plan_splits`` with ``gluon_config``), its splits a multiple of
    ``round_tokens`` (``SplitKVConfig.split_round_tokens``)."""
    from specdiag.kernels.triton_splitkv import sm_count  # noqa: PLC0415

    return plan_splits(inputs.heads * inputs.draft_tokens, inputs.n_kv,
                       replace(gluon_config(block_n, stages), split_round_tokens=round_tokens),
                       num_sms or sm_count(inputs.q.device.index or 0))


def read_sink(inputs: VerifyInputs, block_n: int = 64, stages: int = 2, num_sms: int | None = None,
              round_tokens: int = BLOCK_TOKENS) -> torch.Tensor:
    """The int32 buffer a read call writes its tile counts into: [programs, 128]."""
    plan = read_plan(inputs, block_n, stages, num_sms, round_tokens)
    return torch.zeros(plan.n_tiles * plan.n_splits, 32 * WS_PARTITION_WARPS, dtype=torch.int32,
                       device=inputs.q.device)


def timeline_buffer(inputs: VerifyInputs, block_n: int = 64, stages: int = 2,
                    num_sms: int | None = None) -> torch.Tensor:
    """The int64 buffer a timed read call writes: one row per program, :data:`TIMELINE_COLUMNS`."""
    plan = read_plan(inputs, block_n, stages, num_sms)
    return torch.zeros(plan.n_tiles * plan.n_splits, len(TIMELINE_COLUMNS), dtype=torch.int64, device=inputs.q.device)


def read_kv_ws(inputs: VerifyInputs, sink: torch.Tensor, block_n: int = 64, stages: int = 2, prefetch: bool = True,
               num_sms: int | None = None, timeline: torch.Tensor | None = None,
               round_tokens: int = BLOCK_TOKENS) -> torch.Tensor:
    """Stream the case's KV through the pick's launch shape with no math (module doc); returns ``sink`` (from
    :func:`read_sink`), each program's row holding the tiles it waited for. ``timeline`` (from
    :func:`timeline_buffer`) also gets each program's times (:data:`TIMELINE_COLUMNS`); ``round_tokens``: the splits'
    round (``SplitKVConfig.split_round_tokens``). CUDA sm_90 only."""
    check_gluon_inputs(inputs, "read_kv_ws")
    q, cache = inputs.q, inputs.cache
    plan = read_plan(inputs, block_n, stages, num_sms, round_tokens)
    if sink.shape != (plan.n_tiles * plan.n_splits, 32 * WS_PARTITION_WARPS) or sink.dtype != torch.int32:
        raise ValueError(f"sink is {tuple(sink.shape)} {sink.dtype}; make it with read_sink(inputs, {block_n}, "
                         f"{stages}, round_tokens={round_tokens})")
    if timeline is not None and (timeline.shape != (plan.n_tiles * plan.n_splits, len(TIMELINE_COLUMNS))
                                 or timeline.dtype != torch.int64):
        raise ValueError(f"timeline is {tuple(timeline.shape)} {timeline.dtype}; make it with timeline_buffer(inputs, "
                         f"{block_n}, {stages})")
    _ws_read_kernel[(plan.n_tiles, plan.n_splits)](
        q, cache, inputs.token_table, sink, sink if timeline is None else timeline, inputs.n_prefix, inputs.n_kv, inputs.heads * inputs.draft_tokens,
        plan.tokens_per_split, cache.stride(0), plan.n_splits,
        BLOCK_M=GLUON_BLOCK_M, BLOCK_N=block_n, STAGES=stages, D_NOPE=D_NOPE, D_PE=D_PE,
        num_warps=WS_PARTITION_WARPS, WORKER_REGS=WS_WORKER_REGS, PREFETCH=prefetch, TIMELINE=timeline is not None,
    )
    return sink


def expected_tiles(inputs: VerifyInputs, block_n: int = 64, stages: int = 2, num_sms: int | None = None,
                   round_tokens: int = BLOCK_TOKENS) -> list[int]:
    """The tiles each program of a read call streams, in the kernel's program order (pid_s * tiles + pid_m)."""
    plan = read_plan(inputs, block_n, stages, num_sms, round_tokens)
    out = []
    for s in range(plan.n_splits):
        start = s * plan.tokens_per_split
        end = inputs.n_kv if s == plan.n_splits - 1 else min(start + plan.tokens_per_split, inputs.n_kv)
        out += [-(-max(end - start, 0) // block_n)] * plan.n_tiles
    return out


def compile_sm90(block_n: int = 64, stages: int = 2, dtype: str = "bf16", prefetch: bool = True,
                 timeline: bool = False) -> "triton.compiler.CompiledKernel":
    """The read kernel compiled ahead of time for sm_90 (no GPU needed), for the CPU tests."""
    from triton.backends.compiler import GPUTarget  # noqa: PLC0415
    from triton.experimental.gluon._runtime import GluonASTSource  # noqa: PLC0415

    sig = {"Q": f"*{dtype}", "KV": f"*{dtype}", "TOKEN_TABLE": "*i64", "SINK": "*i32",
           "TL": "*i64" if timeline else "*i32", "n_prefix": "i32",
           "n_kv": "i32", "n_rows": "i32", "tokens_per_split": "i32", "stride_kv": "i32", "n_splits": "i32"}
    const = {"BLOCK_M": GLUON_BLOCK_M, "BLOCK_N": block_n, "STAGES": stages, "D_NOPE": D_NOPE, "D_PE": D_PE,
             "num_warps": WS_PARTITION_WARPS, "WORKER_REGS": WS_WORKER_REGS, "PREFETCH": prefetch,
             "TIMELINE": timeline}
    sig.update({k: "constexpr" for k in const})
    attrs = {(i,): [["tt.divisibility", 16]] for i, k in enumerate(sig)
             if k in ("Q", "KV", "TOKEN_TABLE", "SINK", "TL", "stride_kv")}
    return triton.compile(GluonASTSource(_ws_read_kernel, sig, const, attrs), target=GPUTarget("cuda", 90, 32),
                          options={"num_warps": WS_PARTITION_WARPS})
