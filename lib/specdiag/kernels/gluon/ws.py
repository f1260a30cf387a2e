"""Split-KV MLA verify attention in Gluon with two warp-specialized warpgroups (FlashMLA's division of work).

The pick (specdiag.kernels.gluon.pick) runs this kernel above 16 packed rows (heads x draft tokens); its partitions, barriers
and copy helpers are also the building blocks of the rows-as-N kernel (gluon.swap), the fp8 kernel (gluon.fp8)
and the SGLang plugin's kernels (gluon.ragged).

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
normalized partial output (fp32, [splits, rows, 512]) and its base-2 LSE per row; the merge is
merge.merge_partials. Registers: the worker keeps ``WS_WORKER_REGS`` (232) per thread, 128 of them its 64 x 256 fp32
accumulator; warpgroup 0 gets the rest. Shared memory at 64-token tiles and two stages, as compiled: 229,900 B of
sm_90's 232,448.

Along the way: the worker loads the token-table rows of the next refill a tile ahead, off the copy's critical path;
the tree mask is loaded only on tiles that reach the draft tokens; tiles wholly inside the split and the prefix are
not masked at all and the scale is folded into the exponent. One option (a constexpr), which the pick turns on up to
64 rows: EARLY_Q, warpgroup 0 loads Q into shared memory itself while warpgroup 1 already issues the first tiles'
copies (with Q loaded before the partitions, the first copies waited 1.0-2.1 us for it on the H200). The pick merges
with 64 value dims per merge program, in one pass where plan.one_pass_merge_fields says so, launched as a
programmatic dependent launch.

On the H200 this kernel was faster than the Triton split kernel (triton.splitkv) at every row count, 8-32 rows
included; up to 16 rows the rows-as-N form (gluon.swap) is faster still, which is why the pick switches there.

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

from specdiag.kernels.merge import merge_partials
from specdiag.kernels.mla import BLOCK_TOKENS, D_NOPE, D_PE, D_QK, D_V, LOG2E, VerifyInputs
from specdiag.kernels.plan import GLUON_BLOCK_M, gluon_config, plan_splits, sm_count
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
    kernels: no conversion; fp16 in gluon.fp8), then fenced for the tensor cores and barrier'd among them."""
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
    ``end``). With RAGGED (SGLang's layout, gluon.ragged) the prefix's rows come from TOKEN_TABLE (the request's
    kv_indices) and the draft tokens' from DRAFT_TABLE (their slots): a tile inside the prefix (all but the last one
    or two of a request) reads only TOKEN_TABLE, so its loads (made a tile ahead) stay in flight until the copy a tile
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
            LD_PE: gl.constexpr, RAGGED: gl.constexpr):
    """Buffer ``buf`` refilled with the tile at ``pos0`` (its rows ``slot`` / ``slot_pe``; the buffer freed by the
    caller); returns the rows of the next refill, loaded a tile ahead."""
    _issue_tile(KV, kv_smem.index(buf), pe_smem.index(buf), slot, slot_pe, pos0, end, stride_kv,
                BLOCK_N, D_NOPE, D_PE, LD, LD_PE)
    async_copy.mbarrier_arrive(kv_ready.index(buf), increment_count=False)
    return _tile_slots(TOKEN_TABLE, DRAFT_TABLE, n_prefix, pos0 + BLOCK_N, end, BLOCK_N, LD, LD_PE, RAGGED)


@gluon.jit
def split_bounds(pid_s, tokens_per_split, n_kv, BLOCK_N: gl.constexpr):
    """Split ``pid_s``'s tokens [start, end) and its tile count. Every dense Gluon kernel (this one, gluon.swap,
    gluon.fp8) cuts its splits through this."""
    start = pid_s * tokens_per_split
    end = gl.minimum(start + tokens_per_split, n_kv)
    return start, end, gl.cdiv(gl.maximum(end - start, 0), BLOCK_N)


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
                    dtype: gl.constexpr):
    """Tile ``it``'s mask (prefix, split end, tree) and online softmax step: P (``dtype``, as P V's A operand), the
    rescale factor of the rows' earlier sum, the new running max and sum. A tile wholly inside the split and the
    prefix is not masked at all (one scalar branch), its scale is folded into the exponent (one FMA per score); any
    other gets the split's end, the prefix and the tree mask. The row sum is taken before P is rounded to ``dtype``."""
    rows_s = pid_m * BLOCK_M + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, S_L))
    kpos = start + it * BLOCK_N + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, S_L))
    j = kpos - n_prefix
    tile0 = start + it * BLOCK_N
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
                       l_ready, MASK, O_PART, LSE_PART, qk_scale, n_prefix, mask_stride, n_heads, n_rows,
                       part_stride, start, end, n_iter, pid_m, pid_s,
                       BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr, D_NOPE: gl.constexpr,
                       D_HALF: gl.constexpr, WARPS: gl.constexpr, Q=None, EARLY_Q: gl.constexpr = False):
    """Warpgroup 0: scores, softmax, P and the rescale factors to the worker, the first half of O (module doc).
    With EARLY_Q this warpgroup first puts the row tile's Q into shared memory (``store_q``) while the worker's first
    copies fly."""
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
    for it in range(0, n_iter):
        _wait_tile(kv_ready, it, STAGES)
        s = warpgroup_mma_wait(num_outstanding=0, deps=(_issue_scores(q_smem, qpe_smem, kv_smem, pe_smem, it,
                                                                      STAGES, BLOCK_M, BLOCK_N, S_L),))
        p, alpha, m_i, l_i = _online_softmax(s, m_i, l_i, it, MASK, qk_scale, n_prefix, mask_stride, n_heads,
                                             n_rows, start, end, pid_m, BLOCK_M, BLOCK_N, S_L, A_L, dtype)
        mbarrier.wait(p_free, (it & 1) ^ 1)  # the worker has read P and the factors of tile it - 1
        _publish(p, alpha, p_smem, row_smem, p_ready)
        acc = acc * gl.convert_layout(alpha, ROW_O)[:, None]
        acc = warpgroup_mma(p, kv_smem.index(it % STAGES).slice(0, D_HALF, dim=1), acc, is_async=True)
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
        mbarrier.arrive(kv_free.index(it % STAGES), count=1)  # this warpgroup is done with the buffer

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


@gluon.jit
def _pv_loader_partition(kv_smem, pe_smem, p_smem, row_smem, kv_ready, kv_free, p_ready, p_free, l_ready, KV,
                         TOKEN_TABLE, DRAFT_TABLE, n_prefix, O_PART, n_rows, part_stride, start, end, n_iter,
                         pid_m, pid_s, stride_kv,
                         BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr, D_NOPE: gl.constexpr,
                         D_PE: gl.constexpr, D_HALF: gl.constexpr, WARPS: gl.constexpr, RAGGED: gl.constexpr = False):
    """Warpgroup 1: every KV tile's copy into the ring, and the second half of O (module doc). With RAGGED the
    prefix's rows come from TOKEN_TABLE and the draft tokens' from DRAFT_TABLE (gluon.ragged, ``_tile_slots``)."""
    LD: gl.constexpr = gl.BlockedLayout([1, 8], [1, 32], [WARPS, 1], [1, 0])
    LD_PE: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [WARPS, 1], [1, 0])
    O_L: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[WARPS, 1],
                                                  instr_shape=[16, D_HALF, 16])
    ROW_O: gl.constexpr = gl.SliceLayout(1, O_L)

    # the first STAGES tiles; the token-table rows of each refill are loaded a tile ahead, off the copy's critical path
    nx_slot, nx_slot_pe = _issue_first_tiles(KV, kv_smem, pe_smem, kv_ready, TOKEN_TABLE, DRAFT_TABLE, n_prefix, start,
                                             end, stride_kv, BLOCK_N, STAGES, D_NOPE, D_PE, LD, LD_PE, RAGGED)
    acc = gl.zeros([BLOCK_M, D_HALF], gl.float32, layout=O_L)
    for it in range(0, n_iter):
        buf = it % STAGES
        mbarrier.wait(p_ready, it & 1)
        alpha = row_smem.load(ROW_O)
        acc = acc * alpha[:, None]
        acc = warpgroup_mma(p_smem, kv_smem.index(buf).slice(D_HALF, D_HALF, dim=1), acc, is_async=True)
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
        gl.thread_barrier()  # every thread's reads of P and the factors done
        mbarrier.arrive(p_free, count=1)
        if it + STAGES < n_iter:  # refill the buffer once warpgroup 0 is done with it too
            pos0 = start + (it + STAGES) * BLOCK_N
            mbarrier.wait(kv_free.index(buf), (it // STAGES) & 1)
            nx_slot, nx_slot_pe = _refill(KV, kv_smem, pe_smem, kv_ready, buf, nx_slot, nx_slot_pe, TOKEN_TABLE,
                                          DRAFT_TABLE, n_prefix, pos0, end, stride_kv, BLOCK_N, D_NOPE, D_PE, LD, LD_PE,
                                          RAGGED)

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
    """Both entries' shared memory before the partitions (this module's and gluon.ragged's): the row tile's Q
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
def _ws_partial_kernel(Q, KV, TOKEN_TABLE, MASK, O_PART, LSE_PART,
                       qk_scale, n_prefix, n_kv, n_draft, n_heads, n_rows, tokens_per_split, stride_kv,
                       BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
                       D_NOPE: gl.constexpr, D_PE: gl.constexpr, D_HALF: gl.constexpr, num_warps: gl.constexpr,
                       WORKER_REGS: gl.constexpr, EARLY_Q: gl.constexpr = False):
    """One program per (64-row tile, split): Q to shared memory, then the two partitions (module doc). With
    EARLY_Q warpgroup 0 loads Q itself while warpgroup 1 already issues the first tiles' copies (loaded up front, Q
    held the first copies back by 1.0-2.1 us on the H200)."""
    pid_m = gl.program_id(0)
    pid_s = gl.program_id(1)
    (q_smem, qpe_smem, kv_smem, pe_smem, p_smem, row_smem, kv_ready, kv_free, p_ready, p_free,
     l_ready) = ws_shared_state(Q, pid_m, n_rows, BLOCK_M, BLOCK_N, STAGES, D_NOPE, D_PE, num_warps, not EARLY_Q)

    start, end, n_iter = split_bounds(pid_s, tokens_per_split, n_kv, BLOCK_N)
    gl.warp_specialize([
        (_softmax_partition, (q_smem, qpe_smem, kv_smem, pe_smem, p_smem, row_smem, kv_ready, kv_free, p_ready,
                              p_free, l_ready, MASK, O_PART, LSE_PART, qk_scale, n_prefix, n_draft, n_heads,
                              n_rows, n_rows, start, end, n_iter, pid_m, pid_s, BLOCK_M, BLOCK_N, STAGES, D_NOPE,
                              D_HALF, num_warps, Q, EARLY_Q)),
        (_pv_loader_partition, (kv_smem, pe_smem, p_smem, row_smem, kv_ready, kv_free, p_ready, p_free, l_ready, KV,
                                TOKEN_TABLE, TOKEN_TABLE, n_prefix, O_PART, n_rows, n_rows, start, end, n_iter,
                                pid_m, pid_s, stride_kv, BLOCK_M, BLOCK_N, STAGES, D_NOPE, D_PE, D_HALF,
                                num_warps)),
    ], [num_warps], [WORKER_REGS])


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


def split_kv_gluon_ws(inputs: VerifyInputs, out: torch.Tensor, block_n: int = 64, stages: int = 2,
                      num_sms: int | None = None, pdl_merge: bool = False, merge_block_dv: int = 16,
                      merge_one_pass: bool = False, merge_one_pass_max_splits: int = 512, early_q: bool = False,
                      split_round_tokens: int = BLOCK_TOKENS) -> torch.Tensor:
    """Split-KV verify attention with the warp-specialized partial kernel and merge.merge_partials; writes ``out``.
    The pick's arguments come from ``gluon.pick.pick_launch``.

    ``early_q``: the kernel's EARLY_Q (module doc). ``pdl_merge`` launches the merge as a programmatic dependent launch;
    ``merge_block_dv`` value dims per merge program (16: one row's 512 dims in 32 programs); ``merge_one_pass`` runs
    the merge kernel with every split of its outputs at once, up to ``merge_one_pass_max_splits`` splits
    (``merge.merge_block``); ``split_round_tokens``: each split's tokens a multiple of this
    (``SplitKVConfig.split_round_tokens``; 1: equal shares)."""
    check_gluon_inputs(inputs, "split_kv_gluon_ws")
    q, cache = inputs.q, inputs.cache
    T, H = inputs.draft_tokens, inputs.heads
    rows, n_kv = T * H, inputs.n_kv
    if D_V % merge_block_dv:
        raise ValueError(f"merge_block_dv must divide the {D_V} value dims; got {merge_block_dv}")
    cfg = replace(gluon_config(block_n, stages), merge_block_dv=merge_block_dv, merge_one_pass=merge_one_pass,
                  merge_one_pass_max_splits=merge_one_pass_max_splits, split_round_tokens=split_round_tokens)
    plan = plan_splits(rows, n_kv, cfg, num_sms or sm_count(q.device.index or 0))
    o_part = torch.empty(plan.n_splits, rows, D_V, device=q.device, dtype=torch.float32)
    lse_part = torch.empty(plan.n_splits, rows, device=q.device, dtype=torch.float32)
    _ws_partial_kernel[(plan.n_tiles, plan.n_splits)](
        q, cache, inputs.token_table, inputs.mask_u8, o_part, lse_part,
        inputs.sm_scale * LOG2E, inputs.n_prefix, n_kv, T, H, rows, plan.tokens_per_split, cache.stride(0),
        BLOCK_M=GLUON_BLOCK_M, BLOCK_N=block_n, STAGES=stages, D_NOPE=D_NOPE, D_PE=D_PE, D_HALF=D_HALF,
        num_warps=WS_PARTITION_WARPS, WORKER_REGS=WS_WORKER_REGS, EARLY_Q=early_q,
    )
    merge_partials(o_part, lse_part, out.view(rows, D_V), cfg, pdl=pdl_merge)
    return out


def compile_sm90(block_n: int = 64, stages: int = 2, dtype: str = "bf16",
                 early_q: bool = False) -> "triton.compiler.CompiledKernel":
    """The partial kernel compiled ahead of time for sm_90 (no GPU needed): for the CPU tests and
    scripts/kernel_ptx_hashes.py."""
    from triton.backends.compiler import GPUTarget  # noqa: PLC0415
    from triton.experimental.gluon._runtime import GluonASTSource  # noqa: PLC0415

    sig = {"Q": f"*{dtype}", "KV": f"*{dtype}", "TOKEN_TABLE": "*i64", "MASK": "*u8", "O_PART": "*fp32",
           "LSE_PART": "*fp32", "qk_scale": "fp32", "n_prefix": "i32", "n_kv": "i32", "n_draft": "i32",
           "n_heads": "i32", "n_rows": "i32", "tokens_per_split": "i32", "stride_kv": "i32"}
    const = {"BLOCK_M": GLUON_BLOCK_M, "BLOCK_N": block_n, "STAGES": stages, "D_NOPE": D_NOPE, "D_PE": D_PE,
             "D_HALF": D_HALF, "num_warps": WS_PARTITION_WARPS, "WORKER_REGS": WS_WORKER_REGS}
    if early_q:
        const["EARLY_Q"] = True
    sig.update({k: "constexpr" for k in const})
    attrs = {(i,): [["tt.divisibility", 16]] for i, k in enumerate(sig) if k in ("Q", "KV", "TOKEN_TABLE", "O_PART",
                                                                                 "LSE_PART", "stride_kv")}
    return triton.compile(GluonASTSource(_ws_partial_kernel, sig, const, attrs), target=GPUTarget("cuda", 90, 32),
                          options={"num_warps": WS_PARTITION_WARPS})
