"""Split-KV MLA verify attention in Gluon with two warp-specialized warpgroups (FlashMLA's division of work).

The pick (specdiag.kernels.pick) runs this kernel above 16 packed rows (heads x draft tokens); its partitions, barriers
and copy helpers are also the building blocks of the rows-as-N kernel (gluon_ws_swap), the fp8 kernel (gluon_ws_fp8)
and the SGLang plugin's kernels (gluon_ws_ragged).

Why two roles rather than two equal halves: when both warpgroups split each tile's scores by keys (m64n32 wgmmas, both
re-reading Q from shared memory), reduce the row max and sum across each other through shared memory and meet at a CTA
barrier every tile, the tensor cores idle through every softmax and every barrier. On the H200 that lockstep form took
3.2 us per 64-token tile at 1,024 rows, where the tile's 8.9 MFLOP take 1.5 us at the measured matmul rate. Here the
two warpgroups do different work and meet only at mbarriers:

- **warpgroup 0** (the default partition, ``_softmax_partition``): the whole tile's scores S = Q K^T (m64n64k16, Q and
  K from shared memory), the mask and the online softmax inside the warpgroup (no cross-warpgroup reduction), P
  (bf16) and the rescale factor to shared memory, then O[:, :256] += P V[:, :256] with P from registers;
- **warpgroup 1** (the worker, ``_pv_loader_partition``): the token-table gather of every KV tile with ``cp.async``
  into a ring of STAGES buffers (each copy arrives on the buffer's mbarrier when it lands), and
  O[:, 256:] += P V[:, 256:] with P from shared memory.

So warpgroup 1's P V of tile i runs on the tensor cores while warpgroup 0 computes the scores and the softmax of
tile i + 1, and each KV copy is in flight for a whole tile. V is the first 512 columns of the same latent tile, so
there is no second load. Barriers (all in shared memory): ``kv_ready[s]`` (the copy into buffer s landed; 128
arrivals, one per worker thread), ``kv_free[s]`` (warpgroup 0 is done with buffer s), ``p_ready`` / ``p_free`` (P and
the rescale factors written / read), ``l_ready`` (the row sums for the worker's normalization). Each split writes its
normalized partial output (fp32, [splits, rows, 512]) and its base-2 LSE per row; the merge is triton_splitkv's
(``merge_partials``). Registers: the worker keeps ``WS_WORKER_REGS`` (232) per thread, 128 of them its 64 x 256 fp32
accumulator; warpgroup 0 gets the rest. Shared memory at 64-token tiles and two stages, as compiled: 229,900 B of
sm_90's 232,448.

Options (constexprs); the pick turns on PREFETCH, DRAFT_BRANCH and FOLD, and EARLY_Q up to 64 rows, with 64 value dims
per merge program, the merge in one pass where splitkv_plan.one_pass_merge_fields says so, launched as a programmatic
dependent launch:

- PREFETCH: the worker loads the token-table rows of the next refill a tile ahead, off the copy's critical path;
- DRAFT_BRANCH: the tree mask is loaded only on tiles that reach the draft tokens;
- FOLD: tiles wholly inside the split and the prefix are not masked at all and the scale is folded into the exponent;
- EARLY_Q: warpgroup 0 loads Q into shared memory itself while warpgroup 1 already issues the first tiles' copies
  (with Q loaded before the partitions, the first copies waited 1.0-2.1 us for it on the H200).

On the H200 this kernel was faster than the Triton split kernel (triton_splitkv) at every row count, 8-32 rows
included; up to 16 rows the rows-as-N form (gluon_ws_swap) is faster still, which is why the pick switches there.

Off in everything that ships, and kept so that the shipped kernels' compiled code stays byte-identical: OVERLAP (tile
i + 1's scores issued before tile i's P V, FA3's intra-warpgroup overlap; slower with two ring buffers), TIMED
(per-phase SM-cycle counters, ``phase_buffer``), GRID_MERGE (the merge inside a cooperative grid, ``_grid_merge``:
correct, but 0.99-1.07x the time of the merge kernel), and the launcher's ``bf16_partials`` and ``join_tail_tokens``.

Chain or tree drafts, page_size 1 (token table), bf16 or fp16. CUDA sm_90 only: the CPU tests compile it for sm_90.
"""

from __future__ import annotations

from dataclasses import replace

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, warpgroup_mma,
                                                              warpgroup_mma_wait)

from specdiag.kernels.mla import BLOCK_TOKENS, D_NOPE, D_PE, D_QK, D_V, VerifyInputs
from specdiag.kernels.splitkv_plan import GLUON_BLOCK_M, gluon_config, plan_splits, plan_splits_coresident

LOG2E = 1.4426950408889634
#: polls of the grid merge's arrival counter before a program gives up waiting (each an L2 round trip, ~0.5-1 us);
#: GRID_MERGE is off in everything that ships
GRID_MERGE_MAX_POLLS: gl.constexpr = gl.constexpr(1 << 22)
#: warps of each partition (one warpgroup each) and the worker's register budget per thread (its 64 x 256 fp32
#: accumulator is 128 of them); the default partition gets the rest of the kernel's
WS_PARTITION_WARPS = 4
WS_WORKER_REGS = 232
D_HALF = 256  # value dims per warpgroup



@gluon.jit
def load_q_cols(Q, pid_m, n_rows, COL0: gl.constexpr, BLOCK_M: gl.constexpr, WIDTH: gl.constexpr,
                ROW_LEN: gl.constexpr, L: gl.constexpr):
    """Columns COL0 .. COL0 + WIDTH - 1 of the query rows pid_m * BLOCK_M .. (Q is [rows, ROW_LEN]) in layout L; rows
    past ``n_rows`` are 0. The Gluon kernels put Q in shared memory with it."""
    rows = pid_m * BLOCK_M + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, L))
    return gl.load(Q + rows[:, None].to(gl.int64) * ROW_LEN + COL0
                   + gl.arange(0, WIDTH, layout=gl.SliceLayout(0, L))[None, :],
                   mask=(rows < n_rows)[:, None], other=0.0)


@gluon.jit
def store_q(Q, q_smem, qpe_smem, pid_m, n_rows, BLOCK_M: gl.constexpr, D_NOPE: gl.constexpr, D_PE: gl.constexpr,
            WARPS: gl.constexpr):
    """The row tile's Q into ``q_smem`` / ``qpe_smem`` (allocated with LOAD_Q False) by the calling warps, 128 columns
    at a time (a quarter of the registers of one load), converted to the buffers' dtype (the same as Q's in the bf16
    kernels: no conversion; fp16 in gluon_ws_fp8), then fenced for the tensor cores and barrier'd among them."""
    LD: gl.constexpr = gl.BlockedLayout([1, 8], [1, 32], [WARPS, 1], [1, 0])
    LD_PE: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [WARPS, 1], [1, 0])
    for c in gl.static_range(D_NOPE // 128):
        q_smem.slice(c * 128, 128, dim=1).store(
            load_q_cols(Q, pid_m, n_rows, c * 128, BLOCK_M, 128, D_NOPE + D_PE, LD).to(q_smem.dtype))
    qpe_smem.store(load_q_cols(Q, pid_m, n_rows, D_NOPE, BLOCK_M, D_PE, D_NOPE + D_PE, LD_PE).to(qpe_smem.dtype))
    fence_async_shared()
    gl.thread_barrier()


@gluon.jit
def q_and_ring_smem(Q, pid_m, n_rows, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
                    D_NOPE: gl.constexpr, D_PE: gl.constexpr, LD: gl.constexpr, LD_PE: gl.constexpr,
                    LOAD_Q: gl.constexpr = True):
    """The row-major kernels' shared memory (``ws_shared_state``): the row tile's Q (no-PE and PE parts, loaded; with
    LOAD_Q False left for the caller to fill, ``store_q``), the ring of STAGES KV tiles (no-PE and PE parts) and one P
    tile, each in the wgmma's default swizzled layout."""
    dtype: gl.constexpr = Q.dtype.element_ty
    q_sl: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_M, D_NOPE], dtype)
    qpe_sl: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_M, D_PE], dtype)
    kv_sl: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_N, D_NOPE], dtype)
    pe_sl: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_N, D_PE], dtype)
    p_sl: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_M, BLOCK_N], dtype)
    if LOAD_Q:
        q_smem = gl.allocate_shared_memory(dtype, [BLOCK_M, D_NOPE], q_sl,
                                           load_q_cols(Q, pid_m, n_rows, 0, BLOCK_M, D_NOPE, D_NOPE + D_PE, LD))
        qpe_smem = gl.allocate_shared_memory(dtype, [BLOCK_M, D_PE], qpe_sl,
                                             load_q_cols(Q, pid_m, n_rows, D_NOPE, BLOCK_M, D_PE, D_NOPE + D_PE, LD_PE))
    else:
        q_smem = gl.allocate_shared_memory(dtype, [BLOCK_M, D_NOPE], q_sl)
        qpe_smem = gl.allocate_shared_memory(dtype, [BLOCK_M, D_PE], qpe_sl)
    kv_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, D_NOPE], kv_sl)
    pe_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, D_PE], pe_sl)
    p_smem = gl.allocate_shared_memory(dtype, [BLOCK_M, BLOCK_N], p_sl)
    return q_smem, qpe_smem, kv_smem, pe_smem, p_smem


@gluon.jit
def _tile_slots(TOKEN_TABLE, DRAFT_TABLE, n_prefix, pos0, end, BLOCK_N: gl.constexpr, LD: gl.constexpr,
                LD_PE: gl.constexpr, RAGGED: gl.constexpr):
    """The cache rows of tokens pos0 .. pos0 + BLOCK_N - 1 through the token table, in the two copy layouts (0 past
    ``end``). With RAGGED (SGLang's layout, gluon_ws_ragged) the prefix's rows come from TOKEN_TABLE (the request's
    kv_indices) and the draft tokens' from DRAFT_TABLE (their slots): a tile inside the prefix (all but the last one
    or two of a request) reads only TOKEN_TABLE, so with PREFETCH its loads stay in flight until the copy a tile
    later needs them, as in the dense kernel; a tile that reaches the draft tokens reads both and picks. Picking on
    every tile would wait for both loads each tile: on the H200 that took 1.13-1.54x the dense kernel's time."""
    pos = pos0 + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, LD))
    pos_pe = pos0 + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, LD_PE))
    if RAGGED:
        if pos0 + BLOCK_N <= n_prefix:
            rows = gl.load(TOKEN_TABLE + pos, mask=pos < end, other=0).to(gl.int64)
            rows_pe = gl.load(TOKEN_TABLE + pos_pe, mask=pos_pe < end, other=0).to(gl.int64)
        else:
            rows = gl.where(pos < n_prefix,
                            gl.load(TOKEN_TABLE + pos, mask=pos < gl.minimum(end, n_prefix), other=0).to(gl.int64),
                            gl.load(DRAFT_TABLE + (pos - n_prefix), mask=(pos >= n_prefix) & (pos < end),
                                    other=0).to(gl.int64))
            rows_pe = gl.where(pos_pe < n_prefix,
                               gl.load(TOKEN_TABLE + pos_pe, mask=pos_pe < gl.minimum(end, n_prefix),
                                       other=0).to(gl.int64),
                               gl.load(DRAFT_TABLE + (pos_pe - n_prefix), mask=(pos_pe >= n_prefix) & (pos_pe < end),
                                       other=0).to(gl.int64))
        return rows, rows_pe
    return (gl.load(TOKEN_TABLE + pos, mask=pos < end, other=0).to(gl.int64),
            gl.load(TOKEN_TABLE + pos_pe, mask=pos_pe < end, other=0).to(gl.int64))


@gluon.jit
def _issue_tile(KV, kv_buf, pe_buf, slot, slot_pe, pos0, end, stride_kv,
                BLOCK_N: gl.constexpr, D_NOPE: gl.constexpr, D_PE: gl.constexpr, LD: gl.constexpr,
                LD_PE: gl.constexpr):
    """cp.async of the cache rows ``slot`` / ``slot_pe`` of tokens pos0 .. pos0 + BLOCK_N - 1 (none past ``end``)."""
    pos = pos0 + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, LD))
    offs_d = gl.arange(0, D_NOPE, layout=gl.SliceLayout(0, LD))
    async_copy.async_copy_global_to_shared(kv_buf, KV + slot[:, None] * stride_kv + offs_d[None, :],
                                           mask=(pos < end)[:, None])
    pos_pe = pos0 + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, LD_PE))
    offs_pe = D_NOPE + gl.arange(0, D_PE, layout=gl.SliceLayout(0, LD_PE))
    async_copy.async_copy_global_to_shared(pe_buf, KV + slot_pe[:, None] * stride_kv + offs_pe[None, :],
                                           mask=(pos_pe < end)[:, None])


@gluon.jit
def _issue_first_tiles(KV, kv_smem, pe_smem, kv_ready, TOKEN_TABLE, DRAFT_TABLE, n_prefix, start, end, stride_kv,
                       BLOCK_N: gl.constexpr, STAGES: gl.constexpr, D_NOPE: gl.constexpr, D_PE: gl.constexpr,
                       LD: gl.constexpr, LD_PE: gl.constexpr, RAGGED: gl.constexpr):
    """The copy warpgroup's start: the ring's first STAGES tiles issued (nothing past the split's end), each on its
    buffer's ready barrier; returns the token-table rows of the first refill."""
    for k in gl.static_range(STAGES):
        slot, slot_pe = _tile_slots(TOKEN_TABLE, DRAFT_TABLE, n_prefix, start + k * BLOCK_N, end, BLOCK_N, LD, LD_PE,
                                    RAGGED)
        _issue_tile(KV, kv_smem.index(k), pe_smem.index(k), slot, slot_pe, start + k * BLOCK_N, end, stride_kv,
                    BLOCK_N, D_NOPE, D_PE, LD, LD_PE)
        async_copy.mbarrier_arrive(kv_ready.index(k), increment_count=False)
    return _tile_slots(TOKEN_TABLE, DRAFT_TABLE, n_prefix, start + STAGES * BLOCK_N, end, BLOCK_N, LD, LD_PE, RAGGED)


@gluon.jit
def _refill(KV, kv_smem, pe_smem, kv_ready, buf, slot, slot_pe, TOKEN_TABLE, DRAFT_TABLE, n_prefix, pos0, end,
            stride_kv, BLOCK_N: gl.constexpr, D_NOPE: gl.constexpr, D_PE: gl.constexpr, LD: gl.constexpr,
            LD_PE: gl.constexpr, PREFETCH: gl.constexpr, RAGGED: gl.constexpr):
    """Buffer ``buf`` refilled with the tile at ``pos0`` (its rows ``slot`` / ``slot_pe``; the buffer freed by the
    caller); returns the rows of the next refill when PREFETCH loads them a tile ahead, else these."""
    _issue_tile(KV, kv_smem.index(buf), pe_smem.index(buf), slot, slot_pe, pos0, end, stride_kv,
                BLOCK_N, D_NOPE, D_PE, LD, LD_PE)
    async_copy.mbarrier_arrive(kv_ready.index(buf), increment_count=False)
    if PREFETCH:
        slot, slot_pe = _tile_slots(TOKEN_TABLE, DRAFT_TABLE, n_prefix, pos0 + BLOCK_N, end, BLOCK_N, LD, LD_PE,
                                    RAGGED)
    return slot, slot_pe


@gluon.jit
def split_bounds(pid_s, tokens_per_split, n_kv, n_splits, BLOCK_N: gl.constexpr):
    """Split ``pid_s``'s tokens [start, end) and its tile count; the last split ends at n_kv (with join_tail_tokens,
    past its share). Every dense Gluon kernel (this one, gluon_ws_swap, gluon_ws_fp8) cuts its splits through this."""
    start = pid_s * tokens_per_split
    end = gl.minimum(start + tokens_per_split, n_kv)
    if pid_s == n_splits - 1:
        end = n_kv
    return start, end, gl.cdiv(gl.maximum(end - start, 0), BLOCK_N)


# ---- TIMED: per-phase SM-cycle counters and a per-program timeline. Off in everything that ships (TIMED False
# compiles none of it); kept so that the shipped kernels' compiled code stays byte-identical. ----


@gluon.jit
def _clock(tick):
    """This thread's SM cycle counter (%clock64), one per element of ``tick`` (one element per thread)."""
    return gl.inline_asm_elementwise("mov.u64 $0, %clock64;", "=l,r", [tick], dtype=gl.int64, is_pure=False, pack=1)


@gluon.jit
def _phase_counters(WARPS: gl.constexpr):
    """A TIMED partition's start: each thread's index (the clock reads' dependency), a zero int64 per thread for its
    phase sums, and the loop's start clock."""
    tick = gl.arange(0, 32 * WARPS, layout=gl.BlockedLayout([1], [32], [WARPS], [0]))
    zero = gl.zeros([32 * WARPS], gl.int64, layout=gl.BlockedLayout([1], [32], [WARPS], [0]))
    return tick, zero, _clock(tick)


#: Slots per partition and thread of a timed call's buffer (``phase_buffer``): 0-5 the phases, 6 the loop's cycles,
#: 7 the tiles; warpgroup 0 also writes its program's timeline into 8-13 (``TIMELINE_SLOTS``).
PHASE_SLOTS = 16
_PHASE_SLOTS = gl.constexpr(PHASE_SLOTS)
#: Warpgroup 0's timeline in a timed call (%globaltimer ns, then %smid), slots 8-13 of partition 0: the program's
#: entry, warpgroup 0's start (Q and the barriers ready), its first tile landed, its loop's end, its partial stored.
TIMELINE_SLOTS: dict[str, int] = {"entry_ns": 8, "start_ns": 9, "first_tile_ns": 10, "loop_end_ns": 11,
                                  "done_ns": 12, "sm": 13}


@gluon.jit
def _globaltimer(tick):
    """The GPU's global nanosecond timer (%globaltimer, one clock for every SM), one per element of ``tick``."""
    return gl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l,r", [tick], dtype=gl.int64, is_pure=False,
                                     pack=1)


@gluon.jit
def _stamp(TIMES, prog, slot: gl.constexpr, tick, value, WARPS: gl.constexpr):
    """``value`` (one per thread) into slot ``slot`` of partition 0 of ``TIMES[prog]``."""
    gl.store(TIMES + prog.to(gl.int64) * (2 * _PHASE_SLOTS * 32 * WARPS) + slot * 32 * WARPS + tick, value)


@gluon.jit
def _stamp_timeline(TIMES, prog, tick, g_start, g_first, g_loop, g_done, WARPS: gl.constexpr):
    """Warpgroup 0's timeline into slots 9-13 of ``TIMES[prog]`` (``TIMELINE_SLOTS``): its start, its first tile, its
    loop's end, ``g_done`` (read by the caller once its partial is stored) and its SM."""
    _stamp(TIMES, prog, 9, tick, g_start, WARPS)
    _stamp(TIMES, prog, 10, tick, g_first, WARPS)
    _stamp(TIMES, prog, 11, tick, g_loop, WARPS)
    _stamp(TIMES, prog, 12, tick, g_done, WARPS)
    _stamp(TIMES, prog, 13, tick, gl.inline_asm_elementwise("mov.u32 $0, %smid;", "=r,r", [tick], dtype=gl.int32,
                                                            is_pure=False, pack=1).to(gl.int64), WARPS)


@gluon.jit
def _store_phases(TIMES, prog, part: gl.constexpr, tick, phases, t_loop, n_iter, WARPS: gl.constexpr):
    """A timed partition's sums into ``TIMES[prog, part]``: slots 0.. the phases, 6 the loop's cycles, 7 the tiles
    (``phase_buffer``'s layout; one value per thread)."""
    base = TIMES + (prog.to(gl.int64) * 2 + part) * (_PHASE_SLOTS * 32 * WARPS) + tick
    for k in gl.static_range(len(phases)):
        gl.store(base + k * 32 * WARPS, phases[k])
    gl.store(base + 6 * 32 * WARPS, _clock(tick) - t_loop)
    gl.store(base + 7 * 32 * WARPS, gl.full([32 * WARPS], 0, gl.int64, layout=tick.type.layout) + n_iter)


@gluon.jit
def _wait_tile(kv_ready, it, STAGES: gl.constexpr):
    """Until tile ``it``'s copy has landed in its ring buffer."""
    mbarrier.wait(kv_ready.index(it % STAGES), (it // STAGES) & 1)
    fence_async_shared()  # the cp.async writes, visible to the tensor cores


@gluon.jit
def _issue_scores(q_smem, qpe_smem, kv_smem, pe_smem, it, STAGES: gl.constexpr, BLOCK_M: gl.constexpr,
                  BLOCK_N: gl.constexpr, S_L: gl.constexpr):
    """Tile ``it``'s scores S = Q K^T issued (two commit groups); its copy must have landed (``_wait_tile``)."""
    buf = it % STAGES
    s = warpgroup_mma(q_smem, kv_smem.index(buf).permute((1, 0)), gl.zeros([BLOCK_M, BLOCK_N], gl.float32, layout=S_L),
                      use_acc=False, is_async=True)
    return warpgroup_mma(qpe_smem, pe_smem.index(buf).permute((1, 0)), s, is_async=True)


@gluon.jit
def _tree_masked(s, rows_s, kpos, j, MASK, qk_scale, n_prefix, mask_stride, n_heads, n_rows, end):
    """The scaled scores with -inf where a key is past the split's end or a draft key (``j`` = kpos - n_prefix) the
    row's tree hides: draft token t's row of the mask starts at MASK + t * ``mask_stride`` (the [T, T] tree: T;
    SGLang's [T, P + T] custom mask, offset by P: P + T)."""
    tree = gl.load(MASK + (rows_s // n_heads)[:, None] * mask_stride + j[None, :],
                   mask=(rows_s < n_rows)[:, None] & (kpos < end)[None, :] & (j >= 0)[None, :], other=0)
    visible = (kpos < end)[None, :] & ((kpos < n_prefix)[None, :] | (tree != 0))
    return gl.where(visible, s * qk_scale, float("-inf"))


@gluon.jit
def _online_softmax(s, m_i, l_i, it, MASK, qk_scale, n_prefix, mask_stride, n_heads, n_rows, start, end, pid_m,
                    BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, S_L: gl.constexpr, A_L: gl.constexpr,
                    dtype: gl.constexpr, DRAFT_BRANCH: gl.constexpr, FOLD: gl.constexpr):
    """Tile ``it``'s mask (prefix, split end, tree) and online softmax step: P (``dtype``, as P V's A operand), the
    rescale factor of the rows' earlier sum, the new running max and sum. With DRAFT_BRANCH the tree mask is loaded
    only on tiles that reach the draft tokens (one scalar branch; a prefix tile's mask is its key range). With FOLD
    (and DRAFT_BRANCH) a tile wholly inside the split and the prefix is not masked at all, its scale is folded into
    the exponent (one FMA per score) and the row sum is taken before P is rounded to ``dtype``."""
    rows_s = pid_m * BLOCK_M + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, S_L))
    kpos = start + it * BLOCK_N + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, S_L))
    j = kpos - n_prefix
    tile0 = start + it * BLOCK_N
    if FOLD:
        if tile0 + BLOCK_N <= gl.minimum(end, n_prefix):  # every key of the tile visible to every row
            m_new = gl.maximum(m_i, gl.max(s, 1) * qk_scale)
            m_use = gl.where(m_new == float("-inf"), 0.0, m_new)
            p32 = gl.exp2(s * qk_scale - m_use[:, None])
        else:
            sm = _tree_masked(s, rows_s, kpos, j, MASK, qk_scale, n_prefix, mask_stride, n_heads, n_rows, end)
            m_new = gl.maximum(m_i, gl.max(sm, 1))
            m_use = gl.where(m_new == float("-inf"), 0.0, m_new)
            p32 = gl.exp2(sm - m_use[:, None])
        alpha = gl.exp2(m_i - m_use)
        l_new = l_i * alpha + gl.sum(p32, 1)
        return gl.convert_layout(p32.to(dtype), A_L), alpha, m_new, l_new
    if DRAFT_BRANCH:
        if tile0 + BLOCK_N > n_prefix:
            s = _tree_masked(s, rows_s, kpos, j, MASK, qk_scale, n_prefix, mask_stride, n_heads, n_rows, end)
        else:
            s = gl.where((kpos < end)[None, :], s * qk_scale, float("-inf"))
    else:
        s = _tree_masked(s, rows_s, kpos, j, MASK, qk_scale, n_prefix, mask_stride, n_heads, n_rows, end)
    m_new = gl.maximum(m_i, gl.max(s, 1))
    m_use = gl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = gl.exp2(m_i - m_use)
    p = gl.exp2(s - m_use[:, None]).to(dtype)
    l_new = l_i * alpha + gl.sum(p.to(gl.float32), 1)
    return gl.convert_layout(p, A_L), alpha, m_new, l_new


@gluon.jit
def _publish(p, alpha, p_smem, row_smem, p_ready):
    """P and the rescale factors of a tile to the worker (which has read the last ones: wait for ``p_free`` first)."""
    p_smem.store(p)
    row_smem.store(alpha)
    fence_async_shared()  # P visible to the worker's tensor cores
    gl.thread_barrier()  # ... every thread's part of it, before the one arrival
    mbarrier.arrive(p_ready, count=1)


@gluon.jit
def _softmax_partition(q_smem, qpe_smem, kv_smem, pe_smem, p_smem, row_smem, kv_ready, kv_free, p_ready, p_free,
                       l_ready, MASK, O_PART, LSE_PART, TIMES, qk_scale, n_prefix, mask_stride, n_heads, n_rows,
                       part_stride, start, end, n_iter, pid_m, pid_s, prog,
                       BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr, D_NOPE: gl.constexpr,
                       D_HALF: gl.constexpr, WARPS: gl.constexpr, OVERLAP: gl.constexpr, DRAFT_BRANCH: gl.constexpr,
                       TIMED: gl.constexpr, FOLD: gl.constexpr, Q=None, EARLY_Q: gl.constexpr = False):
    """Warpgroup 0: scores, softmax, P and the rescale factors to the worker, the first half of O (module doc).
    With EARLY_Q this warpgroup first puts the row tile's Q into shared memory (``store_q``) while the worker's first
    copies fly.

    OVERLAP and TIMED are off in everything that ships (kept so the shipped kernels' compiled code stays
    byte-identical). With OVERLAP tile i's P V runs on the tensor cores under tile i + 1's softmax (FA3's
    intra-warpgroup overlap): tile i + 1's scores are issued first, then tile i's P V, and the wait for the scores
    leaves the P V in flight; both are waited for inside the iteration (no accumulator crosses the loop's back edge).
    With two ring buffers it was slower than the plain loop. With TIMED (not with OVERLAP) each thread sums the SM
    cycles of its loop's phases into TIMES (``PHASES``)."""
    dtype: gl.constexpr = p_smem.dtype
    if EARLY_Q:
        store_q(Q, q_smem, qpe_smem, pid_m, n_rows, BLOCK_M, D_NOPE, qpe_smem.shape[1], WARPS)
    S_L: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[WARPS, 1],
                                                  instr_shape=[16, BLOCK_N, 16])
    O_L: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[WARPS, 1],
                                                  instr_shape=[16, D_HALF, 16])
    A_L: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=O_L, k_width=2)
    ROW_S: gl.constexpr = gl.SliceLayout(1, S_L)
    ROW_O: gl.constexpr = gl.SliceLayout(1, O_L)

    rows_s = pid_m * BLOCK_M + gl.arange(0, BLOCK_M, layout=ROW_S)
    m_i = gl.full([BLOCK_M], float("-inf"), gl.float32, layout=ROW_S)
    l_i = gl.zeros([BLOCK_M], gl.float32, layout=ROW_S)
    acc = gl.zeros([BLOCK_M, D_HALF], gl.float32, layout=O_L)
    if OVERLAP:
        # tile 0 (also when the split is empty: its copies are all predicated off, so every key is masked)
        _wait_tile(kv_ready, 0, STAGES)
        s = warpgroup_mma_wait(num_outstanding=0, deps=(_issue_scores(q_smem, qpe_smem, kv_smem, pe_smem, 0, STAGES,
                                                                      BLOCK_M, BLOCK_N, S_L),))
        p, alpha, m_i, l_i = _online_softmax(s, m_i, l_i, 0, MASK, qk_scale, n_prefix, mask_stride, n_heads, n_rows,
                                             start, end, pid_m, BLOCK_M, BLOCK_N, S_L, A_L, dtype, DRAFT_BRANCH, FOLD)
        mbarrier.wait(p_free, 1)
        _publish(p, alpha, p_smem, row_smem, p_ready)
        for it in range(0, n_iter - 1):
            _wait_tile(kv_ready, it + 1, STAGES)
            s = _issue_scores(q_smem, qpe_smem, kv_smem, pe_smem, it + 1, STAGES, BLOCK_M, BLOCK_N, S_L)
            acc = acc * gl.convert_layout(alpha, ROW_O)[:, None]
            acc = warpgroup_mma(p, kv_smem.index(it % STAGES).slice(0, D_HALF, dim=1), acc, is_async=True)
            s = warpgroup_mma_wait(num_outstanding=1, deps=(s,))  # tile it + 1's scores; tile it's P V may run on
            p, alpha, m_i, l_i = _online_softmax(s, m_i, l_i, it + 1, MASK, qk_scale, n_prefix, mask_stride, n_heads,
                                                 n_rows, start, end, pid_m, BLOCK_M, BLOCK_N, S_L, A_L, dtype,
                                                 DRAFT_BRANCH, FOLD)
            mbarrier.wait(p_free, ((it + 1) & 1) ^ 1)
            _publish(p, alpha, p_smem, row_smem, p_ready)
            acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
            mbarrier.arrive(kv_free.index(it % STAGES), count=1)  # this warpgroup is done with the buffer
        if n_iter > 0:  # the last tile's P V
            acc = acc * gl.convert_layout(alpha, ROW_O)[:, None]
            acc = warpgroup_mma(p, kv_smem.index((n_iter - 1) % STAGES).slice(0, D_HALF, dim=1), acc, is_async=True)
            acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
            mbarrier.arrive(kv_free.index((n_iter - 1) % STAGES), count=1)
    else:
        if TIMED:  # phases: copy wait, scores, softmax, wait for the worker to free P, publish, P V
            tick, ph0, t_loop = _phase_counters(WARPS)
            g_start = _globaltimer(tick)
            g_first = g_start
            ph1 = ph0
            ph2 = ph0
            ph3 = ph0
            ph4 = ph0
            ph5 = ph0
        for it in range(0, n_iter):
            if TIMED:
                t0 = _clock(tick)
            _wait_tile(kv_ready, it, STAGES)
            if TIMED:
                t1 = _clock(tick)
                ph0 += t1 - t0
                if it == 0:
                    g_first = _globaltimer(tick)
            s = warpgroup_mma_wait(num_outstanding=0, deps=(_issue_scores(q_smem, qpe_smem, kv_smem, pe_smem, it,
                                                                          STAGES, BLOCK_M, BLOCK_N, S_L),))
            if TIMED:
                t2 = _clock(tick)
                ph1 += t2 - t1
            p, alpha, m_i, l_i = _online_softmax(s, m_i, l_i, it, MASK, qk_scale, n_prefix, mask_stride, n_heads,
                                                 n_rows, start, end, pid_m, BLOCK_M, BLOCK_N, S_L, A_L, dtype,
                                                 DRAFT_BRANCH, FOLD)
            if TIMED:
                t3 = _clock(tick)
                ph2 += t3 - t2
            mbarrier.wait(p_free, (it & 1) ^ 1)  # the worker has read P and the factors of tile it - 1
            if TIMED:
                t4 = _clock(tick)
                ph3 += t4 - t3
            _publish(p, alpha, p_smem, row_smem, p_ready)
            if TIMED:
                t5 = _clock(tick)
                ph4 += t5 - t4
            acc = acc * gl.convert_layout(alpha, ROW_O)[:, None]
            acc = warpgroup_mma(p, kv_smem.index(it % STAGES).slice(0, D_HALF, dim=1), acc, is_async=True)
            acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
            mbarrier.arrive(kv_free.index(it % STAGES), count=1)  # this warpgroup is done with the buffer
            if TIMED:
                ph5 += _clock(tick) - t5
        if TIMED:
            g_loop = _globaltimer(tick)
            _store_phases(TIMES, prog, 0, tick, (ph0, ph1, ph2, ph3, ph4, ph5), t_loop, n_iter, WARPS)

    mbarrier.wait(p_free, (n_iter & 1) ^ 1)  # the worker has read the last factors: the row sums go where they were
    row_smem.store(l_i)
    gl.thread_barrier()
    mbarrier.arrive(l_ready, count=1)
    l_o = gl.convert_layout(l_i, ROW_O)
    o = acc / gl.where(l_o > 0, l_o, 1.0)[:, None]
    rows_o = pid_m * BLOCK_M + gl.arange(0, BLOCK_M, layout=ROW_O)
    offs_v = gl.arange(0, D_HALF, layout=gl.SliceLayout(0, O_L))
    part_row = pid_s.to(gl.int64) * part_stride + rows_o
    gl.store(O_PART + part_row[:, None] * (2 * D_HALF) + offs_v[None, :], o.to(O_PART.dtype.element_ty),
             mask=(rows_o < n_rows)[:, None])
    lse = gl.where(l_i > 0, m_i + gl.log2(gl.where(l_i > 0, l_i, 1.0)), float("-inf"))
    gl.store(LSE_PART + pid_s.to(gl.int64) * part_stride + rows_s, lse, mask=rows_s < n_rows)
    if TIMED:
        if not OVERLAP:
            _stamp_timeline(TIMES, prog, tick, g_start, g_first, g_loop, _globaltimer(tick), WARPS)


@gluon.jit
def _pv_loader_partition(kv_smem, pe_smem, p_smem, row_smem, kv_ready, kv_free, p_ready, p_free, l_ready, KV,
                         TOKEN_TABLE, DRAFT_TABLE, n_prefix, O_PART, TIMES, n_rows, part_stride, start, end, n_iter,
                         pid_m, pid_s, prog, stride_kv,
                         BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr, D_NOPE: gl.constexpr,
                         D_PE: gl.constexpr, D_HALF: gl.constexpr, WARPS: gl.constexpr, PREFETCH: gl.constexpr,
                         TIMED: gl.constexpr, RAGGED: gl.constexpr = False):
    """Warpgroup 1: every KV tile's copy into the ring, and the second half of O (module doc). With RAGGED the
    prefix's rows come from TOKEN_TABLE and the draft tokens' from DRAFT_TABLE (gluon_ws_ragged, ``_tile_slots``).
    TIMED (off in everything that ships) sums each thread's SM cycles per loop phase into TIMES (``PHASES``)."""
    LD: gl.constexpr = gl.BlockedLayout([1, 8], [1, 32], [WARPS, 1], [1, 0])
    LD_PE: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [WARPS, 1], [1, 0])
    O_L: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[WARPS, 1],
                                                  instr_shape=[16, D_HALF, 16])
    ROW_O: gl.constexpr = gl.SliceLayout(1, O_L)

    # the first STAGES tiles; with PREFETCH the token-table rows of the next refill are loaded a tile ahead, off the
    # copy's critical path
    nx_slot, nx_slot_pe = _issue_first_tiles(KV, kv_smem, pe_smem, kv_ready, TOKEN_TABLE, DRAFT_TABLE, n_prefix, start,
                                             end, stride_kv, BLOCK_N, STAGES, D_NOPE, D_PE, LD, LD_PE, RAGGED)
    acc = gl.zeros([BLOCK_M, D_HALF], gl.float32, layout=O_L)
    if TIMED:  # phases: wait for P, P V, free P, wait for the buffer, the refill's copy
        tick, q0, t_loop = _phase_counters(WARPS)
        q1 = q0
        q2 = q0
        q3 = q0
        q4 = q0
    for it in range(0, n_iter):
        buf = it % STAGES
        if TIMED:
            u0 = _clock(tick)
        mbarrier.wait(p_ready, it & 1)
        if TIMED:
            u1 = _clock(tick)
            q0 += u1 - u0
        alpha = row_smem.load(ROW_O)
        acc = acc * alpha[:, None]
        acc = warpgroup_mma(p_smem, kv_smem.index(buf).slice(D_HALF, D_HALF, dim=1), acc, is_async=True)
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
        if TIMED:
            u2 = _clock(tick)
            q1 += u2 - u1
        gl.thread_barrier()  # every thread's reads of P and the factors done
        mbarrier.arrive(p_free, count=1)
        if TIMED:
            u3 = _clock(tick)
            q2 += u3 - u2
        if it + STAGES < n_iter:  # refill the buffer once warpgroup 0 is done with it too
            pos0 = start + (it + STAGES) * BLOCK_N
            if not PREFETCH:
                nx_slot, nx_slot_pe = _tile_slots(TOKEN_TABLE, DRAFT_TABLE, n_prefix, pos0, end, BLOCK_N, LD, LD_PE,
                                                  RAGGED)
            mbarrier.wait(kv_free.index(buf), (it // STAGES) & 1)
            if TIMED:
                u4 = _clock(tick)
                q3 += u4 - u3
            nx_slot, nx_slot_pe = _refill(KV, kv_smem, pe_smem, kv_ready, buf, nx_slot, nx_slot_pe, TOKEN_TABLE,
                                          DRAFT_TABLE, n_prefix, pos0, end, stride_kv, BLOCK_N, D_NOPE, D_PE, LD, LD_PE,
                                          PREFETCH, RAGGED)
            if TIMED:
                q4 += _clock(tick) - u4
    if TIMED:
        _store_phases(TIMES, prog, 1, tick, (q0, q1, q2, q3, q4), t_loop, n_iter, WARPS)

    mbarrier.wait(l_ready, 0)
    l_o = row_smem.load(ROW_O)
    o = acc / gl.where(l_o > 0, l_o, 1.0)[:, None]
    rows_o = pid_m * BLOCK_M + gl.arange(0, BLOCK_M, layout=ROW_O)
    offs_v = D_HALF + gl.arange(0, D_HALF, layout=gl.SliceLayout(0, O_L))
    part_row = pid_s.to(gl.int64) * part_stride + rows_o
    gl.store(O_PART + part_row[:, None] * (2 * D_HALF) + offs_v[None, :], o.to(O_PART.dtype.element_ty),
             mask=(rows_o < n_rows)[:, None])


@gluon.jit
def ws_shared_state(Q, pid_m, n_rows, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
                    D_NOPE: gl.constexpr, D_PE: gl.constexpr, num_warps: gl.constexpr, LOAD_Q: gl.constexpr = True):
    """Both entries' shared memory before the partitions (this module's and gluon_ws_ragged's): the row tile's Q
    (rows past ``n_rows`` 0; with LOAD_Q False left to warpgroup 0, EARLY_Q), the KV ring, P, the row factors, and the
    barriers, initialized and visible to all."""
    LD: gl.constexpr = gl.BlockedLayout([1, 8], [1, 32], [num_warps, 1], [1, 0])
    LD_PE: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [num_warps, 1], [1, 0])
    row_sl: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, order=[0])
    q_smem, qpe_smem, kv_smem, pe_smem, p_smem = q_and_ring_smem(Q, pid_m, n_rows, BLOCK_M, BLOCK_N, STAGES, D_NOPE,
                                                                 D_PE, LD, LD_PE, LOAD_Q)
    row_smem = gl.allocate_shared_memory(gl.float32, [BLOCK_M], row_sl)
    kv_ready, kv_free, p_ready, p_free, l_ready = ws_barriers(STAGES, num_warps)
    fence_async_shared()  # Q visible to the tensor cores
    gl.thread_barrier()
    return q_smem, qpe_smem, kv_smem, pe_smem, p_smem, row_smem, kv_ready, kv_free, p_ready, p_free, l_ready


@gluon.jit
def ws_barriers(STAGES: gl.constexpr, num_warps: gl.constexpr, FREE_COUNT: gl.constexpr = 1):
    """The two partitions' mbarriers (module doc), allocated and initialized: kv_ready[s] (one cp.async arrival per
    worker thread), kv_free[s] (FREE_COUNT arrivals: the partitions that release a buffer besides the copying one),
    p_ready, p_free, l_ready. The caller fences and barriers before the partitions."""
    kv_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    kv_free = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    p_ready = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    p_free = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    l_ready = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    for k in gl.static_range(STAGES):
        mbarrier.init(kv_ready.index(k), count=32 * num_warps)  # one cp.async arrival per worker thread
        mbarrier.init(kv_free.index(k), count=FREE_COUNT)
    mbarrier.init(p_ready, count=1)
    mbarrier.init(p_free, count=1)
    mbarrier.init(l_ready, count=1)
    return kv_ready, kv_free, p_ready, p_free, l_ready


@gluon.jit
def _ws_partial_kernel(Q, KV, TOKEN_TABLE, MASK, O_PART, LSE_PART, TIMES, OUT, SYNC,
                       qk_scale, n_prefix, n_kv, n_draft, n_heads, n_rows, tokens_per_split, stride_kv, n_splits,
                       BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
                       D_NOPE: gl.constexpr, D_PE: gl.constexpr, D_HALF: gl.constexpr, num_warps: gl.constexpr,
                       WORKER_REGS: gl.constexpr, PREFETCH: gl.constexpr, OVERLAP: gl.constexpr,
                       DRAFT_BRANCH: gl.constexpr, TIMED: gl.constexpr, FOLD: gl.constexpr,
                       GRID_MERGE: gl.constexpr = False, MERGE_S: gl.constexpr = 2, MERGE_F: gl.constexpr = 64,
                       MERGE_TPW_F: gl.constexpr = 16, EARLY_Q: gl.constexpr = False):
    """One program per (64-row tile, split): Q to shared memory, then the two partitions (module doc). With
    EARLY_Q warpgroup 0 loads Q itself while warpgroup 1 already issues the first tiles' copies (loaded up front, Q
    held the first copies back by 1.0-2.1 us on the H200). TIMED and GRID_MERGE are off in everything that ships and
    kept so the shipped kernels' compiled code stays byte-identical: with GRID_MERGE every program then merges its
    slice of the output (``_grid_merge``; OUT and SYNC are unused without it)."""
    pid_m = gl.program_id(0)
    pid_s = gl.program_id(1)
    if TIMED:  # the program's entry, before Q's load (TIMELINE_SLOTS)
        tick0 = gl.arange(0, 32 * num_warps, layout=gl.BlockedLayout([1], [32], [num_warps], [0]))
        _stamp(TIMES, pid_s * gl.num_programs(0) + pid_m, 8, tick0, _globaltimer(tick0), num_warps)
    (q_smem, qpe_smem, kv_smem, pe_smem, p_smem, row_smem, kv_ready, kv_free, p_ready, p_free,
     l_ready) = ws_shared_state(Q, pid_m, n_rows, BLOCK_M, BLOCK_N, STAGES, D_NOPE, D_PE, num_warps, not EARLY_Q)

    start, end, n_iter = split_bounds(pid_s, tokens_per_split, n_kv, n_splits, BLOCK_N)
    prog = pid_s * gl.num_programs(0) + pid_m
    gl.warp_specialize([
        (_softmax_partition, (q_smem, qpe_smem, kv_smem, pe_smem, p_smem, row_smem, kv_ready, kv_free, p_ready,
                              p_free, l_ready, MASK, O_PART, LSE_PART, TIMES, qk_scale, n_prefix, n_draft, n_heads,
                              n_rows, n_rows, start, end, n_iter, pid_m, pid_s, prog, BLOCK_M, BLOCK_N, STAGES, D_NOPE,
                              D_HALF, num_warps, OVERLAP, DRAFT_BRANCH, TIMED, FOLD, Q, EARLY_Q)),
        (_pv_loader_partition, (kv_smem, pe_smem, p_smem, row_smem, kv_ready, kv_free, p_ready, p_free, l_ready, KV,
                                TOKEN_TABLE, TOKEN_TABLE, n_prefix, O_PART, TIMES, n_rows, n_rows, start, end, n_iter,
                                pid_m, pid_s, prog, stride_kv, BLOCK_M, BLOCK_N, STAGES, D_NOPE, D_PE, D_HALF,
                                num_warps, PREFETCH, TIMED)),
    ], [num_warps], [WORKER_REGS])
    if GRID_MERGE:
        _grid_merge(O_PART, LSE_PART, OUT, SYNC, n_splits, n_rows, prog, 2 * D_HALF, MERGE_S, MERGE_F, MERGE_TPW_F,
                    num_warps)


@gluon.jit
def _grid_merge(O_PART, LSE_PART, OUT, SYNC, n_splits, n_rows, prog, D_V: gl.constexpr, MERGE_S: gl.constexpr,
                MERGE_F: gl.constexpr, TPW_F: gl.constexpr, WARPS: gl.constexpr):
    """The merge inside the partial grid, so a call is one launch (GRID_MERGE; off in everything that ships: on the
    H200 it was correct but 0.99-1.07x the time of the merge kernel). Every program of the (co-resident, cooperatively
    launched) grid arrives on SYNC[0] once its partial is stored, waits until all have, then merges one contiguous
    slice of the flattened output [rows x 512]: all splits of MERGE_F outputs at once ([MERGE_S, MERGE_F] loads,
    MERGE_S >= n_splits), weighted by exp2(lse - max lse). SYNC[1] counts the programs done waiting; the last one
    puts both counters back to 0 for the next call (calls on one stream are ordered). The wait gives up after
    GRID_MERGE_MAX_POLLS polls (seconds; the whole grid arrives within microseconds when it is co-resident): its slice
    is then left unwritten, a wrong result that a correctness check reports, instead of a hung GPU."""
    n_prog = gl.num_programs(0) * gl.num_programs(1)
    gl.thread_barrier()  # both partitions' partial stores issued by every thread of this program
    gl.atomic_add(SYNC, 1, sem="release", scope="gpu")
    arrived = gl.atomic_add(SYNC, 0, sem="acquire", scope="gpu")
    polls = 0
    while (arrived < n_prog) & (polls < GRID_MERGE_MAX_POLLS):
        arrived = gl.atomic_add(SYNC, 0, sem="acquire", scope="gpu")
        polls += 1
    L: gl.constexpr = gl.BlockedLayout([1, 4], [32 // TPW_F, TPW_F], [WARPS, 1], [1, 0])
    offs_s = gl.arange(0, MERGE_S, layout=gl.SliceLayout(1, L))
    offs_f = gl.arange(0, MERGE_F, layout=gl.SliceLayout(0, L))
    split_ok = offs_s < n_splits
    total = n_rows * D_V
    per = gl.cdiv(gl.cdiv(total, n_prog), MERGE_F) * MERGE_F
    lo = gl.where(arrived < n_prog, total, prog * per)  # nothing to merge after a wait that gave up
    for f0 in range(lo, gl.minimum(lo + per, total), MERGE_F):  # MERGE_F divides D_V: a block lies in one row
        f = f0 + offs_f
        ok = split_ok[:, None] & (f < total)[None, :]
        lse = gl.load(LSE_PART + offs_s.to(gl.int64) * n_rows + f0 // D_V, mask=split_ok, other=float("-inf"),
                      cache_modifier=".cg")  # one weight per split of the row, not one per output
        w = gl.exp2(lse - gl.max(lse, 0))
        o = gl.load(O_PART + offs_s.to(gl.int64)[:, None] * total + f[None, :], mask=ok, other=0.0,
                    cache_modifier=".cg")
        merged = gl.sum(w[:, None] * o.to(gl.float32), 0) / gl.sum(w, 0)
        gl.store(OUT + f, merged.to(OUT.dtype.element_ty), mask=f < total)
    left = gl.atomic_add(SYNC + 1, 1, sem="relaxed", scope="gpu")
    if left == n_prog - 1:  # every program is past its wait: reset for the next call
        gl.atomic_xchg(SYNC, 0, sem="relaxed", scope="gpu")
        gl.atomic_xchg(SYNC + 1, 0, sem="relaxed", scope="gpu")


def check_gluon_inputs(inputs: VerifyInputs, who: str) -> None:
    """The dense Gluon launchers' common input check, before any launch: CUDA (sm_90), contiguous q [T, H, 576] and
    cache rows [pool, 576], q and the cache in one dtype; ``who`` names the launcher in the message."""
    q, cache = inputs.q, inputs.cache
    if not q.is_cuda:
        raise ValueError(f"{who} runs on CUDA (sm_90) only; on the CPU use split_kv_torch")
    if not (q.is_contiguous() and q.shape[-1] == D_QK and cache.shape[-1] == D_QK and cache.stride(1) == 1):
        raise ValueError(f"{who} needs contiguous q [T, H, 576] and cache rows [pool, 576]")
    if q.dtype != cache.dtype:
        raise ValueError(f"{who} needs q and the cache in one dtype; got {q.dtype} and {cache.dtype}")


def phase_buffer(inputs: VerifyInputs, block_n: int = 64, stages: int = 2, num_sms: int | None = None,
                 split_round_tokens: int = BLOCK_TOKENS) -> torch.Tensor:
    """The int64 buffer a timed call (TIMED, off in everything that ships) writes its phase cycles into:
    [programs, 2 partitions, PHASE_SLOTS, 128 threads] (slots 0-5 the phases of ``PHASES``, 6 the whole loop, 7 the
    tiles; partition 0's slots 8-13 its program's timeline, ``TIMELINE_SLOTS``); programs in the order
    pid_s * tiles + pid_m."""
    from specdiag.kernels.triton_splitkv import sm_count  # noqa: PLC0415

    plan = plan_splits(inputs.heads * inputs.draft_tokens, inputs.n_kv,
                       replace(gluon_config(block_n, stages), split_round_tokens=split_round_tokens),
                       num_sms or sm_count(inputs.q.device.index or 0))
    return torch.zeros(plan.n_tiles * plan.n_splits, 2, PHASE_SLOTS, 32 * WS_PARTITION_WARPS, dtype=torch.int64,
                       device=inputs.q.device)


#: what the timed kernel's slots 0-5 hold, per partition (SM cycles summed over the loop's iterations; TIMED only)
PHASES: dict[str, tuple[str, ...]] = {
    "softmax_wg": ("copy_wait", "scores", "softmax", "p_free_wait", "publish", "pv"),
    "copy_pv_wg": ("p_ready_wait", "pv", "p_free", "buffer_wait", "refill_issue"),
}


def split_kv_gluon_ws(inputs: VerifyInputs, out: torch.Tensor, block_n: int = 64, stages: int = 2,
                      num_sms: int | None = None, prefetch: bool = False, overlap: bool = False,
                      draft_branch: bool = False, fold: bool = False, bf16_partials: bool = False,
                      pdl_merge: bool = False, merge_block_dv: int = 16, grid_merge: bool = False,
                      merge_one_pass: bool = False, merge_one_pass_max_splits: int = 512,
                      join_tail_tokens: int = 0, times: torch.Tensor | None = None,
                      early_q: bool = False, split_round_tokens: int = BLOCK_TOKENS) -> torch.Tensor:
    """Split-KV verify attention with the warp-specialized partial kernel and triton_splitkv's merge; writes ``out``.
    The pick's arguments come from ``pick.pick_launch``.

    ``prefetch``, ``draft_branch``, ``fold``, ``early_q``: the kernel's PREFETCH, DRAFT_BRANCH, FOLD and EARLY_Q (module
    doc; ``early_q`` not with ``overlap``). ``pdl_merge`` launches the merge as a programmatic dependent launch;
    ``merge_block_dv`` value dims per merge program (16: one row's 512 dims in 32 programs); ``merge_one_pass`` runs
    the merge kernel with every split of its outputs at once, up to ``merge_one_pass_max_splits`` splits
    (``split_merge.merge_block``); ``split_round_tokens``: each split's tokens a multiple of this
    (``SplitKVConfig.split_round_tokens``; 1: equal shares).

    Off in everything that ships (kept so the shipped kernels' compiled code stays byte-identical): ``overlap``
    (OVERLAP); ``bf16_partials`` (each split's normalized output in bf16: half the partial bytes written and merged);
    ``times`` (from ``phase_buffer``: the kernel with its phases timed, not with ``overlap``); ``grid_merge`` (the
    merge inside the partial kernel's grid: one cooperative launch of at most one program per SM, ``_grid_merge``, no
    merge kernel); ``join_tail_tokens`` (a last split of that many tokens or fewer joins the one before it,
    ``splitkv_plan.split_count``)."""
    from specdiag.kernels.triton_splitkv import merge_partials, sm_count  # noqa: PLC0415

    check_gluon_inputs(inputs, "split_kv_gluon_ws")
    q, cache = inputs.q, inputs.cache
    if times is not None and overlap:
        raise ValueError("split_kv_gluon_ws times the loop without the overlap only: pass overlap=False with times")
    if early_q and overlap:
        raise ValueError("early_q loads Q in warpgroup 0 before its loop, which the overlap form does not have: pass "
                         "overlap=False with early_q")
    T, H = inputs.draft_tokens, inputs.heads
    rows, n_kv = T * H, inputs.n_kv
    if D_V % merge_block_dv:
        raise ValueError(f"merge_block_dv must divide the {D_V} value dims; got {merge_block_dv}")
    if grid_merge and (bf16_partials or pdl_merge or times is not None):
        raise ValueError("grid_merge merges fp32 partials inside the partial grid: not with bf16_partials, pdl_merge "
                         "or times")
    cfg = replace(gluon_config(block_n, stages), merge_block_dv=merge_block_dv, merge_one_pass=merge_one_pass,
                  merge_one_pass_max_splits=merge_one_pass_max_splits, join_tail_tokens=join_tail_tokens,
                  split_round_tokens=split_round_tokens)
    n_sms = num_sms or sm_count(q.device.index or 0)
    plan = (plan_splits_coresident if grid_merge else plan_splits)(rows, n_kv, cfg, n_sms)
    o_part = torch.empty(plan.n_splits, rows, D_V, device=q.device,
                         dtype=torch.bfloat16 if bf16_partials else torch.float32)
    lse_part = torch.empty(plan.n_splits, rows, device=q.device, dtype=torch.float32)
    if times is not None and times.shape != (plan.n_tiles * plan.n_splits, 2, PHASE_SLOTS, 32 * WS_PARTITION_WARPS):
        raise ValueError(f"times has shape {tuple(times.shape)}; make it with "
                         f"phase_buffer(inputs, {block_n}, {stages})")
    # the grid merge's constexprs and cooperative launch only where it runs: the two-launch form leaves them at their
    # defaults, so it compiles one kernel per option set, not one per split count
    extra = {"GRID_MERGE": True, "launch_cooperative_grid": True,
             **dict(zip(("MERGE_S", "MERGE_F", "MERGE_TPW_F"), grid_merge_block(plan.n_splits)))} if grid_merge else {}
    _ws_partial_kernel[(plan.n_tiles, plan.n_splits)](
        q, cache, inputs.token_table, inputs.mask_u8, o_part, lse_part, lse_part if times is None else times,
        out, inputs.grid_sync,
        inputs.sm_scale * LOG2E, inputs.n_prefix, n_kv, T, H, rows, plan.tokens_per_split, cache.stride(0),
        plan.n_splits,
        BLOCK_M=GLUON_BLOCK_M, BLOCK_N=block_n, STAGES=stages, D_NOPE=D_NOPE, D_PE=D_PE, D_HALF=D_HALF,
        num_warps=WS_PARTITION_WARPS, WORKER_REGS=WS_WORKER_REGS, PREFETCH=prefetch, OVERLAP=overlap,
        DRAFT_BRANCH=draft_branch, TIMED=times is not None, FOLD=fold, EARLY_Q=early_q,
        **extra,
    )
    if not grid_merge:
        merge_partials(o_part, lse_part, out.view(rows, D_V), cfg, pdl=pdl_merge)
    return out


#: fp32 values a program of the grid merge (off in everything that ships) loads at once ([splits, outputs]; 64 per
#: thread of its warpgroup)
GRID_MERGE_ELEMS = 8192


def grid_merge_block(n_splits: int) -> tuple[int, int, int]:
    """The grid merge's block for ``n_splits`` splits: (splits padded to a power of two, outputs per block, threads of
    a warp along the outputs); every split of an output is loaded at once, 4 outputs (16 B) per thread."""
    merge_s = max(2, triton.next_power_of_2(n_splits))
    if merge_s > GRID_MERGE_ELEMS // 16:
        raise ValueError(f"the grid merge takes at most {GRID_MERGE_ELEMS // 16} splits; the plan has {n_splits}")
    merge_f = min(D_V, GRID_MERGE_ELEMS // merge_s)  # within one row of outputs: one weight per split
    return merge_s, merge_f, min(32, merge_f // 4)


def compile_sm90(block_n: int = 64, stages: int = 2, dtype: str = "bf16", worker_regs: int = WS_WORKER_REGS,
                 prefetch: bool = False, overlap: bool = False, draft_branch: bool = False,
                 timed: bool = False, fold: bool = False, partial: str = "fp32",
                 grid_merge_splits: int = 0, early_q: bool = False) -> "triton.compiler.CompiledKernel":
    """The partial kernel compiled ahead of time for sm_90 (no GPU needed): for the CPU tests and
    scripts/kernel_ptx_hashes.py. ``grid_merge_splits`` > 0: the form that merges inside its grid, with the merge block
    of that many splits."""
    from triton.backends.compiler import GPUTarget  # noqa: PLC0415
    from triton.experimental.gluon._runtime import GluonASTSource  # noqa: PLC0415

    sig = {"Q": f"*{dtype}", "KV": f"*{dtype}", "TOKEN_TABLE": "*i64", "MASK": "*u8", "O_PART": f"*{partial}",
           "LSE_PART": "*fp32", "TIMES": "*i64" if timed else "*fp32", "OUT": f"*{dtype}", "SYNC": "*i32",
           "qk_scale": "fp32", "n_prefix": "i32", "n_kv": "i32", "n_draft": "i32",
           "n_heads": "i32", "n_rows": "i32", "tokens_per_split": "i32", "stride_kv": "i32", "n_splits": "i32"}
    const = {"BLOCK_M": GLUON_BLOCK_M, "BLOCK_N": block_n, "STAGES": stages, "D_NOPE": D_NOPE, "D_PE": D_PE,
             "D_HALF": D_HALF, "num_warps": WS_PARTITION_WARPS, "WORKER_REGS": worker_regs, "PREFETCH": prefetch,
             "OVERLAP": overlap, "DRAFT_BRANCH": draft_branch, "TIMED": timed, "FOLD": fold}
    if early_q:
        const["EARLY_Q"] = True
    if grid_merge_splits:
        merge_s, merge_f, merge_tpw_f = grid_merge_block(grid_merge_splits)
        const.update({"GRID_MERGE": True, "MERGE_S": merge_s, "MERGE_F": merge_f, "MERGE_TPW_F": merge_tpw_f})
    sig.update({k: "constexpr" for k in const})
    attrs = {(i,): [["tt.divisibility", 16]] for i, k in enumerate(sig) if k in ("Q", "KV", "TOKEN_TABLE", "O_PART",
                                                                                 "LSE_PART", "TIMES", "OUT", "SYNC",
                                                                                 "stride_kv")}
    return triton.compile(GluonASTSource(_ws_partial_kernel, sig, const, attrs), target=GPUTarget("cuda", 90, 32),
                          options={"num_warps": WS_PARTITION_WARPS, "launch_cooperative_grid": grid_merge_splits > 0})
