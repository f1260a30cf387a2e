"""The pick's warp-specialized kernel with the query rows as the wgmma's N operand, for up to 16 packed rows.

Why: the wgmma's M is 64 whatever the rows, so with the rows as M (gluon_ws) the scores of 8-16 query rows cost what
64 rows cost (m64n64k16 x 36 per tile) and the P V too (m64n256k16 x 4 per warpgroup), and each ring buffer is held
through that math. At one draft token gluon_ws streams its KV at only 0.78-0.89 of the read floor of its own launch
shape on the H200, about 2,900 of warpgroup 0's 4,650 cycles per tile going to that math at 128k tokens, 8 heads x 1
draft token. Here the keys are the M side and the rows the N side:

- scores transposed, S^T [64 keys, 16 rows] = K Q^T: A = the KV tile from shared memory, B = Q [16, 576] permuted
  (m64n16k16 x 36: a quarter of the N of gluon_ws's);
- the online softmax runs down the keys (axis 0: a reduction across the warpgroup's four warps);
- P^T [64 keys, 16 rows] to shared memory, the B operand of both warpgroups' O^T [256 dims, 16 rows] += V^T P^T, with
  V^T the permuted half of the same KV tile as the A operand (m64n16k16 x 16 per warpgroup);
- Q is 16 x 576 (18 KB, not gluon_ws's 74 KB), loaded by warpgroup 0 while warpgroup 1 issues the first tiles.

On the H200 this form was faster than the row-major kernel at 8-16 rows (0.94-0.96 of its time on SGLang's layout),
so the pick and the plugin run it up to 16 rows. With ``fit_rows`` (the pick's) calls of up to 8 rows run an N of 8:
half the math of an N of 16.

The ring, its barriers, the copies (gluon_ws ``_issue_first_tiles`` / ``_refill``, token-table rows prefetched a tile
ahead), the split and the partials' layout are gluon_ws's, so the merge is triton_splitkv's. Rows are packed as there
(row = draft token x heads + head; tree mask by the row's draft token). ``_swap_pv_partition`` is the P V warpgroup of
the three- and four-partition fp8 kernels (gluon_ws_fp8), where a separate warpgroup brings the tiles in. Chain or tree
drafts, page_size 1, bf16 or fp16, CUDA sm_90 only (the CPU tests compile it for sm_90).

Off in everything that ships, and kept so that the shipped kernels' compiled code stays byte-identical: the timed form
(``times`` / TIMED: both partitions' phases and warpgroup 0's timeline, gluon_ws ``PHASES``), three ring buffers
beside an 8-row Q (``fit_stages``), the rows' sums kept per key lane and reduced once after the loop (``late_sum`` /
LATE_SUM) and unused shared memory (``smem_pad`` / SMEM_PAD, which leaves the SM's L1 cache less room).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, warpgroup_mma,
                                                              warpgroup_mma_wait)

from specdiag.kernels.gluon_ws import (LOG2E, PHASE_SLOTS, WS_PARTITION_WARPS, WS_WORKER_REGS, _clock, _globaltimer,
                                       _issue_first_tiles, _phase_counters, _refill, _stamp, _stamp_timeline,
                                       _store_phases, _wait_tile, check_gluon_inputs, split_bounds, store_q,
                                       ws_barriers)
from specdiag.kernels.mla import BLOCK_TOKENS, D_NOPE, D_PE, D_V, VerifyInputs
from specdiag.kernels.splitkv_plan import SplitKVConfig, SplitPlan, gluon_config, plan_splits

#: query rows per program (the wgmma's N): every call of up to this many packed rows runs one row tile
SWAP_MAX_ROWS = 16
#: the N of ``fit_rows`` (calls of up to this many rows), and the most ring buffers whose shared memory fits beside
#: its Q on sm_90 (231,756 B of 232,448 with three 64-token buffers; a 16-row Q with three: 242,092 B)
FIT_ROWS = 8
FIT_STAGES_MAX = 3
D_HALF = D_V // 2  # value dims per warpgroup (the M of its O^T)


@gluon.jit
def _softmax_t(s, m_i, l_i, it, MASK, qk_scale, n_prefix, mask_stride, n_heads, n_rows, start, end,
               BLOCK_N: gl.constexpr, RN: gl.constexpr, S_L: gl.constexpr, dtype: gl.constexpr,
               LATE_SUM: gl.constexpr = False):
    """Tile ``it``'s mask and online softmax down the keys of S^T [keys, rows]: P^T (``dtype``), the rows' rescale
    factor, running max and sum. A tile wholly inside the split and the prefix is not masked (the scale folded into
    the exponent); any other gets the split's end, the prefix and the tree mask of the row's draft token. With
    LATE_SUM (off in everything that ships) the running sum is kept per key lane ([keys, rows], no reduction across
    the warpgroup's warps per tile; ``gl.sum(l, 0)`` once after the loop gives the rows' sums)."""
    rows = gl.arange(0, RN, layout=gl.SliceLayout(0, S_L))
    kpos = start + it * BLOCK_N + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, S_L))
    tile0 = start + it * BLOCK_N
    if tile0 + BLOCK_N <= gl.minimum(end, n_prefix):  # every key of the tile visible to every row
        m_new = gl.maximum(m_i, gl.max(s, 0) * qk_scale)
        m_use = gl.where(m_new == float("-inf"), 0.0, m_new)
        p32 = gl.exp2(s * qk_scale - m_use[None, :])
    else:
        j = kpos - n_prefix
        tree = gl.load(MASK + (rows // n_heads)[None, :] * mask_stride + j[:, None],
                       mask=(rows < n_rows)[None, :] & (kpos < end)[:, None] & (j >= 0)[:, None], other=0)
        visible = (kpos < end)[:, None] & ((kpos < n_prefix)[:, None] | (tree != 0))
        sm = gl.where(visible, s * qk_scale, float("-inf"))
        m_new = gl.maximum(m_i, gl.max(sm, 0))
        m_use = gl.where(m_new == float("-inf"), 0.0, m_new)
        p32 = gl.exp2(sm - m_use[None, :])
    alpha = gl.exp2(m_i - m_use)
    if LATE_SUM:
        l_new = l_i * alpha[None, :] + p32
    else:
        l_new = l_i * alpha + gl.sum(p32, 0)
    return p32.to(dtype), alpha, m_new, l_new


@gluon.jit
def _swap_softmax_partition(Q, q_smem, qpe_smem, kv_smem, pe_smem, pt_smem, row_smem, kv_ready, kv_free, p_ready,
                            p_free, l_ready, MASK, O_PART, LSE_PART, qk_scale, n_prefix, mask_stride, n_heads, n_rows,
                            part_stride, start, end, n_iter, pid_s,
                            BLOCK_N: gl.constexpr, STAGES: gl.constexpr, RN: gl.constexpr, D_NOPE: gl.constexpr,
                            D_PE: gl.constexpr, D_HALF: gl.constexpr, WARPS: gl.constexpr, TIMES=None,
                            TIMED: gl.constexpr = False, LATE_SUM: gl.constexpr = False):
    """Warpgroup 0: Q to shared memory, then per tile the scores S^T, the softmax down the keys, P^T and the factors
    to the worker, and O^T's first half; the partial's first half and the rows' LSE at the end (module doc). Split
    ``pid_s``'s partial rows start at ``pid_s * part_stride`` (the dense call: its rows; the ragged one: the batch's
    most rows, in the request's block). TIMED and LATE_SUM are off in everything that ships (kept so the shipped
    kernels' compiled code stays byte-identical): with TIMED (the dense call) each thread sums its loop's phases in SM
    cycles into ``TIMES[pid_s, 0]`` (gluon_ws.PHASES' names) and stamps the program's timeline
    (gluon_ws.TIMELINE_SLOTS); LATE_SUM: ``_softmax_t``'s per-lane sums."""
    dtype: gl.constexpr = pt_smem.dtype
    store_q(Q, q_smem, qpe_smem, 0, n_rows, RN, D_NOPE, D_PE, WARPS)

    S_L: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[WARPS, 1], instr_shape=[16, RN, 16])
    COL: gl.constexpr = gl.SliceLayout(0, S_L)  # one per row; O^T's accumulator has S^T's layout too (N = RN)
    m_i = gl.full([RN], float("-inf"), gl.float32, layout=COL)
    if LATE_SUM:
        l_i = gl.zeros([BLOCK_N, RN], gl.float32, layout=S_L)
    else:
        l_i = gl.zeros([RN], gl.float32, layout=COL)
    acc = gl.zeros([D_HALF, RN], gl.float32, layout=S_L)
    if TIMED:  # phases: copy wait, scores, softmax, wait for the worker to free P^T, publish, P V
        tick, ph0, t_loop = _phase_counters(WARPS)
        g_start = _globaltimer(tick)
        g_first = g_start
        ph1 = ph0
        ph2 = ph0
        ph3 = ph0
        ph4 = ph0
        ph5 = ph0
    for it in range(0, n_iter):
        buf = it % STAGES
        if TIMED:
            t0 = _clock(tick)
        _wait_tile(kv_ready, it, STAGES)
        if TIMED:
            t1 = _clock(tick)
            ph0 += t1 - t0
            if it == 0:
                g_first = _globaltimer(tick)
        s = warpgroup_mma(kv_smem.index(buf), q_smem.permute((1, 0)), gl.zeros([BLOCK_N, RN], gl.float32, layout=S_L),
                          use_acc=False, is_async=True)
        s = warpgroup_mma(pe_smem.index(buf), qpe_smem.permute((1, 0)), s, is_async=True)
        s = warpgroup_mma_wait(num_outstanding=0, deps=(s,))
        if TIMED:
            t2 = _clock(tick)
            ph1 += t2 - t1
        p, alpha, m_i, l_i = _softmax_t(s, m_i, l_i, it, MASK, qk_scale, n_prefix, mask_stride, n_heads, n_rows,
                                        start, end, BLOCK_N, RN, S_L, dtype, LATE_SUM)
        if TIMED:
            t3 = _clock(tick)
            ph2 += t3 - t2
        mbarrier.wait(p_free, (it & 1) ^ 1)  # the worker has read P^T and the factors of tile it - 1
        if TIMED:
            t4 = _clock(tick)
            ph3 += t4 - t3
        pt_smem.store(p)
        row_smem.store(alpha)
        fence_async_shared()  # P^T visible to both warpgroups' tensor cores
        gl.thread_barrier()
        mbarrier.arrive(p_ready, count=1)
        if TIMED:
            t5 = _clock(tick)
            ph4 += t5 - t4
        acc = acc * alpha[None, :]
        acc = warpgroup_mma(kv_smem.index(buf).slice(0, D_HALF, dim=1).permute((1, 0)), pt_smem, acc, is_async=True)
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
        mbarrier.arrive(kv_free.index(buf), count=1)  # this warpgroup is done with the buffer
        if TIMED:
            ph5 += _clock(tick) - t5
    if TIMED:
        g_loop = _globaltimer(tick)
        _store_phases(TIMES, pid_s, 0, tick, (ph0, ph1, ph2, ph3, ph4, ph5), t_loop, n_iter, WARPS)
    if LATE_SUM:
        l_i = gl.sum(l_i, 0)

    mbarrier.wait(p_free, (n_iter & 1) ^ 1)  # the worker has read the last factors: the row sums go where they were
    row_smem.store(l_i)
    gl.thread_barrier()
    mbarrier.arrive(l_ready, count=1)
    o = acc / gl.where(l_i > 0, l_i, 1.0)[None, :]
    rows_o = gl.arange(0, RN, layout=COL)
    dims = gl.arange(0, D_HALF, layout=gl.SliceLayout(1, S_L))
    gl.store(O_PART + (pid_s.to(gl.int64) * part_stride + rows_o)[None, :] * (2 * D_HALF) + dims[:, None],
             o.to(O_PART.dtype.element_ty), mask=(rows_o < n_rows)[None, :])
    rows = gl.arange(0, RN, layout=COL)
    lse = gl.where(l_i > 0, m_i + gl.log2(gl.where(l_i > 0, l_i, 1.0)), float("-inf"))
    gl.store(LSE_PART + pid_s.to(gl.int64) * part_stride + rows, lse, mask=rows < n_rows)
    if TIMED:
        _stamp_timeline(TIMES, pid_s, tick, g_start, g_first, g_loop, _globaltimer(tick), WARPS)


@gluon.jit
def _swap_pv_loader_partition(kv_smem, pe_smem, pt_smem, row_smem, kv_ready, kv_free, p_ready, p_free, l_ready, KV,
                              TOKEN_TABLE, DRAFT_TABLE, O_PART, n_prefix, n_rows, part_stride, start, end, n_iter,
                              pid_s, stride_kv,
                              BLOCK_N: gl.constexpr, STAGES: gl.constexpr, RN: gl.constexpr, D_NOPE: gl.constexpr,
                              D_PE: gl.constexpr, D_HALF: gl.constexpr, WARPS: gl.constexpr, RAGGED: gl.constexpr,
                              TIMES=None, TIMED: gl.constexpr = False):
    """Warpgroup 1: every KV tile's copy into the ring (gluon_ws's, token-table rows prefetched a tile ahead; with
    RAGGED the prefix's rows from TOKEN_TABLE and the draft tokens' from DRAFT_TABLE, as gluon_ws_ragged) and O^T's
    second half; its half of the partial at the end. TIMED (off in everything that ships) sums each thread's loop
    phases in SM cycles into ``TIMES[pid_s, 1]`` (gluon_ws.PHASES' names)."""
    LD: gl.constexpr = gl.BlockedLayout([1, 8], [1, 32], [WARPS, 1], [1, 0])
    LD_PE: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [WARPS, 1], [1, 0])
    S_L: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[WARPS, 1], instr_shape=[16, RN, 16])
    COL_O: gl.constexpr = gl.SliceLayout(0, S_L)

    nx_slot, nx_slot_pe = _issue_first_tiles(KV, kv_smem, pe_smem, kv_ready, TOKEN_TABLE, DRAFT_TABLE, n_prefix, start,
                                             end, stride_kv, BLOCK_N, STAGES, D_NOPE, D_PE, LD, LD_PE, RAGGED)
    acc = gl.zeros([D_HALF, RN], gl.float32, layout=S_L)
    if TIMED:  # phases: wait for P^T, P V, free P^T, wait for the buffer, the refill's copy
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
        alpha = row_smem.load(COL_O)
        acc = acc * alpha[None, :]
        acc = warpgroup_mma(kv_smem.index(buf).slice(D_HALF, D_HALF, dim=1).permute((1, 0)), pt_smem, acc,
                            is_async=True)
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
        if TIMED:
            u2 = _clock(tick)
            q1 += u2 - u1
        gl.thread_barrier()  # every thread's reads of P^T and the factors done
        mbarrier.arrive(p_free, count=1)
        if TIMED:
            u3 = _clock(tick)
            q2 += u3 - u2
        if it + STAGES < n_iter:  # refill the buffer once warpgroup 0 is done with it too
            pos0 = start + (it + STAGES) * BLOCK_N
            mbarrier.wait(kv_free.index(buf), (it // STAGES) & 1)
            if TIMED:
                u4 = _clock(tick)
                q3 += u4 - u3
            nx_slot, nx_slot_pe = _refill(KV, kv_smem, pe_smem, kv_ready, buf, nx_slot, nx_slot_pe, TOKEN_TABLE,
                                          DRAFT_TABLE, n_prefix, pos0, end, stride_kv, BLOCK_N, D_NOPE, D_PE, LD, LD_PE,
                                          True, RAGGED)
            if TIMED:
                q4 += _clock(tick) - u4
    if TIMED:
        _store_phases(TIMES, pid_s, 1, tick, (q0, q1, q2, q3, q4), t_loop, n_iter, WARPS)
    mbarrier.wait(l_ready, 0)
    l_o = row_smem.load(COL_O)
    o = acc / gl.where(l_o > 0, l_o, 1.0)[None, :]
    rows_o = gl.arange(0, RN, layout=COL_O)
    dims = D_HALF + gl.arange(0, D_HALF, layout=gl.SliceLayout(1, S_L))
    gl.store(O_PART + (pid_s.to(gl.int64) * part_stride + rows_o)[None, :] * (2 * D_HALF) + dims[:, None],
             o.to(O_PART.dtype.element_ty), mask=(rows_o < n_rows)[None, :])


@gluon.jit
def _swap_shared_state(dtype: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr, RN: gl.constexpr,
                       D_NOPE: gl.constexpr, D_PE: gl.constexpr, num_warps: gl.constexpr, FREE_COUNT: gl.constexpr = 1):
    """Both entries' shared memory and barriers (this module's and gluon_ws_ragged's), initialized and visible to
    all: Q (filled by warpgroup 0), the KV ring, P^T, the rows' factors, and gluon_ws's barriers (``ws_barriers``;
    FREE_COUNT is 1 in every kernel that ships)."""
    q_smem = gl.allocate_shared_memory(dtype, [RN, D_NOPE], gl.NVMMASharedLayout.get_default_for([RN, D_NOPE], dtype))
    qpe_smem = gl.allocate_shared_memory(dtype, [RN, D_PE], gl.NVMMASharedLayout.get_default_for([RN, D_PE], dtype))
    kv_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, D_NOPE],
                                        gl.NVMMASharedLayout.get_default_for([BLOCK_N, D_NOPE], dtype))
    pe_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, D_PE],
                                        gl.NVMMASharedLayout.get_default_for([BLOCK_N, D_PE], dtype))
    pt_smem = gl.allocate_shared_memory(dtype, [BLOCK_N, RN], gl.NVMMASharedLayout.get_default_for([BLOCK_N, RN], dtype))
    row_smem = gl.allocate_shared_memory(gl.float32, [RN], gl.SwizzledSharedLayout(1, 1, 1, order=[0]))
    kv_ready, kv_free, p_ready, p_free, l_ready = ws_barriers(STAGES, num_warps, FREE_COUNT)
    fence_async_shared()
    gl.thread_barrier()
    return q_smem, qpe_smem, kv_smem, pe_smem, pt_smem, row_smem, kv_ready, kv_free, p_ready, p_free, l_ready


@gluon.jit
def _swap_partial_kernel(Q, KV, TOKEN_TABLE, MASK, O_PART, LSE_PART, TIMES,
                         qk_scale, n_prefix, n_kv, n_draft, n_heads, n_rows, tokens_per_split, stride_kv, n_splits,
                         BLOCK_N: gl.constexpr, STAGES: gl.constexpr, RN: gl.constexpr, D_NOPE: gl.constexpr,
                         D_PE: gl.constexpr, D_HALF: gl.constexpr, num_warps: gl.constexpr,
                         WORKER_REGS: gl.constexpr, TIMED: gl.constexpr = False, LATE_SUM: gl.constexpr = False,
                         SMEM_PAD: gl.constexpr = 0):
    """One program per split (every row in one tile of RN): the shared memory and barriers, then the partitions
    (TIMES unused unless TIMED). TIMED, LATE_SUM and SMEM_PAD are off in everything that ships (kept so the shipped
    kernels' compiled code stays byte-identical); SMEM_PAD: that many bytes of shared memory more, unused but for one
    store (the SM's L1 cache gets what shared memory leaves)."""
    pid_s = gl.program_id(0)
    if TIMED:  # the program's entry (gluon_ws.TIMELINE_SLOTS)
        tick0 = gl.arange(0, 32 * num_warps, layout=gl.BlockedLayout([1], [32], [num_warps], [0]))
        _stamp(TIMES, pid_s, 8, tick0, _globaltimer(tick0), num_warps)
    PAD_L: gl.constexpr = gl.BlockedLayout([1], [32], [num_warps], [0])
    if SMEM_PAD > 0:  # live to the end (read again after the partitions), so no other buffer reuses its bytes
        pad = gl.allocate_shared_memory(gl.int32, [SMEM_PAD // 4], gl.SwizzledSharedLayout(1, 1, 1, order=[0]))
        pad.slice(0, 32 * num_warps).store(gl.zeros([32 * num_warps], gl.int32, layout=PAD_L))
    (q_smem, qpe_smem, kv_smem, pe_smem, pt_smem, row_smem, kv_ready, kv_free, p_ready, p_free,
     l_ready) = _swap_shared_state(Q.dtype.element_ty, BLOCK_N, STAGES, RN, D_NOPE, D_PE, num_warps)
    start, end, n_iter = split_bounds(pid_s, tokens_per_split, n_kv, n_splits, BLOCK_N)
    gl.warp_specialize([
        (_swap_softmax_partition, (Q, q_smem, qpe_smem, kv_smem, pe_smem, pt_smem, row_smem, kv_ready, kv_free,
                                   p_ready, p_free, l_ready, MASK, O_PART, LSE_PART, qk_scale, n_prefix, n_draft,
                                   n_heads, n_rows, n_rows, start, end, n_iter, pid_s, BLOCK_N, STAGES, RN, D_NOPE,
                                   D_PE, D_HALF, num_warps, TIMES, TIMED, LATE_SUM)),
        (_swap_pv_loader_partition, (kv_smem, pe_smem, pt_smem, row_smem, kv_ready, kv_free, p_ready, p_free, l_ready,
                                     KV, TOKEN_TABLE, TOKEN_TABLE, O_PART, n_prefix, n_rows, n_rows, start, end,
                                     n_iter, pid_s, stride_kv, BLOCK_N, STAGES, RN, D_NOPE, D_PE, D_HALF, num_warps,
                                     False, TIMES, TIMED)),
    ], [num_warps], [WORKER_REGS])
    if SMEM_PAD > 0:
        gl.thread_barrier()
        pad.slice(0, 32 * num_warps).store(pad.slice(0, 32 * num_warps).load(PAD_L) + 1)


@dataclass(frozen=True)
class SwapLaunch:
    """What the rows-as-N launcher sets up before its launch (``swap_launch``): the N, the merge's config, the plan,
    the partial buffers, the partial kernel's leading arguments (Q .. n_splits, TIMES in its slot) and its shared
    constexprs."""

    rn: int
    rows: int
    cfg: SplitKVConfig
    plan: SplitPlan
    o_part: torch.Tensor
    lse_part: torch.Tensor
    args: tuple
    const: dict

    def merge(self, out: torch.Tensor, pdl: bool) -> torch.Tensor:
        """triton_splitkv's merge of the partials into ``out`` (one pass by the config, under PDL when ``pdl``)."""
        from specdiag.kernels.triton_splitkv import merge_partials  # noqa: PLC0415

        merge_partials(self.o_part, self.lse_part, out.view(self.rows, D_V), self.cfg, pdl=pdl)
        return out


@gluon.jit
def _swap_pv_partition(kv_smem, pt_smem, row_smem, kv_free, p_ready, p_free, l_ready, O_PART, n_rows, part_stride,
                       n_iter, pid_s, STAGES: gl.constexpr, RN: gl.constexpr, D_HALF: gl.constexpr,
                       WARPS: gl.constexpr):
    """Warpgroup 1 when another warpgroup brings the tiles in (the fp8 kernels, gluon_ws_fp8 and gluon_ws_ragged):
    O^T's second half per tile, then the buffer released (one of kv_free's two arrivals, warpgroup 0's the other);
    its half of the partial at the end."""
    S_L: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[WARPS, 1], instr_shape=[16, RN, 16])
    COL_O: gl.constexpr = gl.SliceLayout(0, S_L)
    acc = gl.zeros([D_HALF, RN], gl.float32, layout=S_L)
    for it in range(0, n_iter):
        buf = it % STAGES
        mbarrier.wait(p_ready, it & 1)
        alpha = row_smem.load(COL_O)
        acc = acc * alpha[None, :]
        acc = warpgroup_mma(kv_smem.index(buf).slice(D_HALF, D_HALF, dim=1).permute((1, 0)), pt_smem, acc,
                            is_async=True)
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
        gl.thread_barrier()  # every thread's reads of P^T and the factors done
        mbarrier.arrive(p_free, count=1)
        mbarrier.arrive(kv_free.index(buf), count=1)
    mbarrier.wait(l_ready, 0)
    l_o = row_smem.load(COL_O)
    o = acc / gl.where(l_o > 0, l_o, 1.0)[None, :]
    rows_o = gl.arange(0, RN, layout=COL_O)
    dims = D_HALF + gl.arange(0, D_HALF, layout=gl.SliceLayout(1, S_L))
    gl.store(O_PART + (pid_s.to(gl.int64) * part_stride + rows_o)[None, :] * (2 * D_HALF) + dims[:, None],
             o.to(O_PART.dtype.element_ty), mask=(rows_o < n_rows)[None, :])


def swap_launch(inputs: VerifyInputs, caller: str, block_n: int, stages: int, num_sms: int | None,
                merge_block_dv: int, merge_one_pass: bool, merge_one_pass_max_splits: int, fit_rows: bool,
                times: torch.Tensor | None, split_round_tokens: int = BLOCK_TOKENS) -> SwapLaunch:
    """The inputs checked for ``caller`` (every row in one tile of ``SWAP_MAX_ROWS``, ``times`` of this call's shape),
    then the launch's set-up: an N of 8 where ``fit_rows`` and the rows fit it, else 16; the plan (its splits a
    multiple of ``split_round_tokens``); the partials."""
    from specdiag.kernels.triton_splitkv import sm_count  # noqa: PLC0415

    check_gluon_inputs(inputs, caller)
    q, cache = inputs.q, inputs.cache
    T, H = inputs.draft_tokens, inputs.heads
    rows, n_kv = T * H, inputs.n_kv
    if rows > SWAP_MAX_ROWS:
        raise ValueError(f"{caller} holds every row in one tile of {SWAP_MAX_ROWS}; this call has {rows} "
                         "(heads x draft tokens): use gluon_ws.split_kv_gluon_ws")
    cfg = replace(gluon_config(block_n, stages), merge_block_dv=merge_block_dv, merge_one_pass=merge_one_pass,
                  merge_one_pass_max_splits=merge_one_pass_max_splits, split_round_tokens=split_round_tokens)
    plan = plan_splits(rows, n_kv, cfg, num_sms or sm_count(q.device.index or 0))
    if times is not None and tuple(times.shape) != (plan.n_splits, 2, PHASE_SLOTS, 32 * WS_PARTITION_WARPS):
        raise ValueError(f"times has shape {tuple(times.shape)}; make it with gluon_ws.phase_buffer(inputs) "
                         f"([{plan.n_splits}, 2, {PHASE_SLOTS}, {32 * WS_PARTITION_WARPS}] for this call)")
    o_part = torch.empty(plan.n_splits, rows, D_V, device=q.device, dtype=torch.float32)
    lse_part = torch.empty(plan.n_splits, rows, device=q.device, dtype=torch.float32)
    args = (q, cache, inputs.token_table, inputs.mask_u8, o_part, lse_part, lse_part if times is None else times,
            inputs.sm_scale * LOG2E, inputs.n_prefix, n_kv, T, H, rows, plan.tokens_per_split, cache.stride(0),
            plan.n_splits)
    rn = FIT_ROWS if fit_rows and rows <= FIT_ROWS else SWAP_MAX_ROWS
    const = dict(BLOCK_N=block_n, STAGES=stages, RN=rn, D_NOPE=D_NOPE, D_PE=D_PE, D_HALF=D_HALF,
                 num_warps=WS_PARTITION_WARPS)
    return SwapLaunch(rn, rows, cfg, plan, o_part, lse_part, args, const)


def split_kv_gluon_swap(inputs: VerifyInputs, out: torch.Tensor, block_n: int = 64, stages: int = 2,
                        num_sms: int | None = None, pdl_merge: bool = True, merge_block_dv: int = 64,
                        merge_one_pass: bool = True, merge_one_pass_max_splits: int = 512,
                        fit_rows: bool = False, fit_stages: int = 0, late_sum: bool = False, smem_pad: int = 0,
                        times: torch.Tensor | None = None, split_round_tokens: int = BLOCK_TOKENS) -> torch.Tensor:
    """Split-KV verify attention with the rows as the wgmma's N (module doc) for up to ``SWAP_MAX_ROWS`` packed rows,
    then triton_splitkv's merge (one pass, as a programmatic dependent launch by default: the pick's); writes ``out``.
    ``fit_rows``: an N of 8 where the rows fit it (half the math of 16 at 1-8 rows), else 16; ``split_round_tokens``:
    each split's tokens a multiple of this (``SplitKVConfig``'s field). The pick's arguments come from
    ``pick.pick_launch``.

    Off in everything that ships (kept so the shipped kernels' compiled code stays byte-identical): ``fit_stages``, the
    ring's buffers with that N of 8 (0: ``stages``; 3 fits beside an 8-row Q, 692 B under the H200's limit, not beside
    a 16-row one); ``late_sum``, the rows' sums kept per key lane and reduced once after the loop (``_softmax_t``);
    ``smem_pad``, bytes of shared memory more, unused; ``times`` (``gluon_ws.phase_buffer(inputs)``), the timed kernel
    writing each partition's loop phases in SM cycles and warpgroup 0's timeline into it."""
    if fit_stages not in (0, 2, FIT_STAGES_MAX):
        raise ValueError(f"fit_stages must be 0 (the arm's stages), 2 or {FIT_STAGES_MAX}; got {fit_stages}")
    if smem_pad and (smem_pad < 512 or smem_pad & (smem_pad - 1)):
        raise ValueError(f"smem_pad must be 0 or a power of two from 512 bytes; got {smem_pad}")
    launch = swap_launch(inputs, "split_kv_gluon_swap", block_n, stages, num_sms, merge_block_dv, merge_one_pass,
                         merge_one_pass_max_splits, fit_rows, times, split_round_tokens)
    const = {**launch.const, "STAGES": fit_stages if launch.rn == FIT_ROWS and fit_stages else stages}
    _swap_partial_kernel[(launch.plan.n_splits,)](*launch.args, WORKER_REGS=WS_WORKER_REGS, TIMED=times is not None,
                                                  LATE_SUM=late_sum, SMEM_PAD=smem_pad, **const)
    return launch.merge(out, pdl_merge)


def compile_signature(dtype: str, timed: bool, block_n: int, stages: int, rn: int) -> tuple[dict, dict]:
    """The rows-as-N partial kernel's signature (TIMES int64 when ``timed``) and shared constexprs, for compiling it
    ahead of time for sm_90 (``compile_sm90``)."""
    sig = {"Q": f"*{dtype}", "KV": f"*{dtype}", "TOKEN_TABLE": "*i64", "MASK": "*u8", "O_PART": "*fp32",
           "LSE_PART": "*fp32", "TIMES": "*i64" if timed else "*fp32", "qk_scale": "fp32", "n_prefix": "i32",
           "n_kv": "i32", "n_draft": "i32", "n_heads": "i32", "n_rows": "i32", "tokens_per_split": "i32",
           "stride_kv": "i32", "n_splits": "i32"}
    const = {"BLOCK_N": block_n, "STAGES": stages, "RN": rn, "D_NOPE": D_NOPE, "D_PE": D_PE, "D_HALF": D_HALF,
             "num_warps": WS_PARTITION_WARPS}
    return sig, const


def compile_kernel(kernel: Any, sig: dict, const: dict) -> "triton.compiler.CompiledKernel":
    """``kernel`` compiled for sm_90 with ``sig`` (constexprs from ``const``; the pointers and the KV stride marked
    divisible by 16, as at run time)."""
    from triton.backends.compiler import GPUTarget  # noqa: PLC0415
    from triton.experimental.gluon._runtime import GluonASTSource  # noqa: PLC0415

    sig = {**sig, **{k: "constexpr" for k in const}}
    attrs = {(i,): [["tt.divisibility", 16]] for i, k in enumerate(sig)
             if k in ("Q", "KV", "TOKEN_TABLE", "O_PART", "LSE_PART", "TIMES", "stride_kv")}
    return triton.compile(GluonASTSource(kernel, sig, const, attrs), target=GPUTarget("cuda", 90, 32),
                          options={"num_warps": WS_PARTITION_WARPS})


def compile_sm90(block_n: int = 64, stages: int = 2, dtype: str = "bf16", rn: int = SWAP_MAX_ROWS,
                 timed: bool = False, late_sum: bool = False,
                 smem_pad: int = 0) -> "triton.compiler.CompiledKernel":
    """The partial kernel compiled ahead of time for sm_90 (no GPU needed), for the CPU tests and
    scripts/kernel_ptx_hashes.py."""
    sig, const = compile_signature(dtype, timed, block_n, stages, rn)
    const.update(WORKER_REGS=WS_WORKER_REGS, TIMED=timed, LATE_SUM=late_sum, SMEM_PAD=smem_pad)
    return compile_kernel(_swap_partial_kernel, sig, const)
