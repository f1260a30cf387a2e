"""Two alternative forms of the rows-as-N kernel (gluon_ws_swap), measured in session 12 and not the pick's (issue 13).

- **Each warp's keys a softmax of their own** (``split_kv_gluon_swap_alt(form="warp_softmax")``, arm ``split_gwsw8w_p1``, run
  44): no reduction across the warpgroup's warps per tile, four accumulators per warpgroup merged after the loop. Its
  softmax took 252 cycles a tile against the pick's 722, and the call was 0.99-1.02 of the pick's time.
- **A partition that only copies** (``form="producer"``, arms ``split_gwsw8p_p1`` / ``split_gwsw8ps3_p1``, run 45): three
  warpgroups, the third issuing every refill, warpgroup 1 only its half of P V. 1.01-1.03 of the pick's time (three
  buffers at 8 rows: 1.04-1.10).

Both reuse gluon_ws_swap's Q load, shared state and warpgroup 0; docs/kernel-notes.md, "Run 44 outcome" and "Run 45
outcome", say what their phases showed.
"""

from __future__ import annotations

from typing import Literal

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, warpgroup_mma,
                                                              warpgroup_mma_wait)

from specdiag.kernels.gluon_splitkv import store_q
from specdiag.kernels.gluon_ws import (WS_WORKER_REGS, _clock, _globaltimer, _issue_first_tiles, _phase_counters,
                                       _refill, _stamp, _stamp_timeline, _store_phases, _wait_tile, split_bounds)
from specdiag.kernels.gluon_ws_swap import (_swap_shared_state, _swap_softmax_partition, compile_kernel,
                                            compile_signature, swap_launch)
from specdiag.kernels.mla import BLOCK_TOKENS, VerifyInputs

#: the forms this module launches
Form = Literal["warp_softmax", "producer"]
FORMS: tuple[str, ...] = ("warp_softmax", "producer")


# ---- session 12: each warp's keys a softmax of their own (no reduction across the warpgroup's warps per tile) ----
# S^T's wgmma accumulator gives warp w the keys 16w..16w+15 of a tile, and P V's four k-steps of 16 keys are those
# same four groups. So each warp can keep its own running max and sum per row over its keys (a "sub-split" of the
# split: keys 16w..16w+15 of every tile) with shuffles inside the warp only, if P V accumulates each k-step into an
# accumulator of its own (four per warpgroup: the same 16 wgmmas, 4x the accumulator registers); the four are merged
# once after the loop as a merge kernel merges splits. The register order the asm below relies on is the wgmma
# accumulator's (Triton's MMAv3 layout): per thread and 8 columns, (r, 2c), (r, 2c + 1), (r + 8, 2c), (r + 8, 2c + 1),
# r = lane / 4, c = lane % 4.

_WARP_MAX_ASM_TEXT = """{
.reg .f32 a, b, t;
max.f32 a, $4, $6;
max.f32 b, $5, $7;
shfl.sync.bfly.b32 t, a, 4, 0x1f, 0xffffffff;
max.f32 a, a, t;
shfl.sync.bfly.b32 t, b, 4, 0x1f, 0xffffffff;
max.f32 b, b, t;
shfl.sync.bfly.b32 t, a, 8, 0x1f, 0xffffffff;
max.f32 a, a, t;
shfl.sync.bfly.b32 t, b, 8, 0x1f, 0xffffffff;
max.f32 b, b, t;
shfl.sync.bfly.b32 t, a, 16, 0x1f, 0xffffffff;
max.f32 a, a, t;
shfl.sync.bfly.b32 t, b, 16, 0x1f, 0xffffffff;
max.f32 b, b, t;
mov.b32 $0, a;
mov.b32 $1, b;
mov.b32 $2, a;
mov.b32 $3, b;
}"""
_WARP_MAX_ASM = gl.constexpr(_WARP_MAX_ASM_TEXT)
_WARP_SUM_ASM = gl.constexpr(_WARP_MAX_ASM_TEXT.replace("max.f32", "add.f32"))
#: keys per warp in a tile of S^T (the wgmma's 16 rows per warp) and per P V k-step
WARP_KEYS = gl.constexpr(16)


@gluon.jit
def _warp_keys_max(x):
    """The max over each warp's 16 keys of x [keys, rows] (S^T's layout), per row, back in every key of the warp."""
    return gl.inline_asm_elementwise(_WARP_MAX_ASM, "=f,=f,=f,=f,f,f,f,f", [x], dtype=gl.float32, is_pure=False,
                                     pack=4)


@gluon.jit
def _warp_keys_sum(x):
    """As ``_warp_keys_max``, the sum."""
    return gl.inline_asm_elementwise(_WARP_SUM_ASM, "=f,=f,=f,=f,f,f,f,f", [x], dtype=gl.float32, is_pure=False,
                                     pack=4)


@gluon.jit
def _rows_view(buf):
    """A plain row-major [..., keys, rows] fp32 buffer seen as its rows, ``.index(k)`` giving row k as [rows]."""
    n: gl.constexpr = buf.numel // buf.shape[buf.rank - 1]
    return buf._reinterpret(gl.float32, [n, buf.shape[buf.rank - 1]], gl.SwizzledSharedLayout(1, 1, 1, order=[0]))


@gluon.jit
def _softmax_w(s, m_i, l_i, it, MASK, qk_scale, n_prefix, mask_stride, n_heads, n_rows, start, end,
               BLOCK_N: gl.constexpr, RN: gl.constexpr, S_L: gl.constexpr, dtype: gl.constexpr):
    """``_softmax_t`` with each warp's keys on their own: the running max ``m_i`` [keys, rows] is per warp (the same in
    all 16 keys of a warp), the sum per key lane (late); returns P^T, the factors [keys, rows], max and sum."""
    rows = gl.arange(0, RN, layout=gl.SliceLayout(0, S_L))
    kpos = start + it * BLOCK_N + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, S_L))
    tile0 = start + it * BLOCK_N
    if tile0 + BLOCK_N <= gl.minimum(end, n_prefix):  # every key of the tile visible to every row
        m_new = gl.maximum(m_i, _warp_keys_max(s) * qk_scale)
        m_use = gl.where(m_new == float("-inf"), 0.0, m_new)
        p32 = gl.exp2(s * qk_scale - m_use)
    else:
        j = kpos - n_prefix
        tree = gl.load(MASK + (rows // n_heads)[None, :] * mask_stride + j[:, None],
                       mask=(rows < n_rows)[None, :] & (kpos < end)[:, None] & (j >= 0)[:, None], other=0)
        visible = (kpos < end)[:, None] & ((kpos < n_prefix)[:, None] | (tree != 0))
        sm = gl.where(visible, s * qk_scale, float("-inf"))
        m_new = gl.maximum(m_i, _warp_keys_max(sm))
        m_use = gl.where(m_new == float("-inf"), 0.0, m_new)
        p32 = gl.exp2(sm - m_use)
    alpha = gl.exp2(m_i - m_use)
    return p32.to(dtype), alpha, m_new, l_i * alpha + p32


@gluon.jit
def _pv_four(kv_smem, pt_smem, alpha_smem, buf, acc0, acc1, acc2, acc3, D0: gl.constexpr, D_HALF: gl.constexpr,
             COL: gl.constexpr):
    """One warpgroup's P V of a tile into the four warps' accumulators (value dims D0..D0 + D_HALF): each rescaled by
    its warp's factors (``alpha_smem`` row 16w), then the k-step of that warp's 16 keys; waits for all four. The four
    rescales come before the first wgmma is issued (a rescale between two would make ptxas wait for the first)."""
    kv = kv_smem.index(buf).slice(D0, D_HALF, dim=1)
    alpha_smem = _rows_view(alpha_smem)
    acc0 = acc0 * alpha_smem.index(0).load(COL)[None, :]
    acc1 = acc1 * alpha_smem.index(WARP_KEYS).load(COL)[None, :]
    acc2 = acc2 * alpha_smem.index(2 * WARP_KEYS).load(COL)[None, :]
    acc3 = acc3 * alpha_smem.index(3 * WARP_KEYS).load(COL)[None, :]
    acc0 = warpgroup_mma(kv.slice(0, WARP_KEYS, dim=0).permute((1, 0)), pt_smem.slice(0, WARP_KEYS, dim=0), acc0,
                         is_async=True)
    acc1 = warpgroup_mma(kv.slice(WARP_KEYS, WARP_KEYS, dim=0).permute((1, 0)),
                         pt_smem.slice(WARP_KEYS, WARP_KEYS, dim=0), acc1, is_async=True)
    acc2 = warpgroup_mma(kv.slice(2 * WARP_KEYS, WARP_KEYS, dim=0).permute((1, 0)),
                         pt_smem.slice(2 * WARP_KEYS, WARP_KEYS, dim=0), acc2, is_async=True)
    acc3 = warpgroup_mma(kv.slice(3 * WARP_KEYS, WARP_KEYS, dim=0).permute((1, 0)),
                         pt_smem.slice(3 * WARP_KEYS, WARP_KEYS, dim=0), acc3, is_async=True)
    return warpgroup_mma_wait(num_outstanding=0, deps=(acc0, acc1, acc2, acc3))


@gluon.jit
def _merge_four(acc0, acc1, acc2, acc3, ml_smem, COL: gl.constexpr):
    """The four warps' accumulators merged with their maxima and sums (``ml_smem`` [2, keys, rows], rows 16w): the
    normalized O^T half and the rows' LSE (log2 units; -inf for a row that saw no key)."""
    NK: gl.constexpr = ml_smem.shape[1]
    ml_smem = _rows_view(ml_smem)  # row k: the maxima at k, the sums at NK + k
    m0 = ml_smem.index(0).load(COL)
    m1 = ml_smem.index(WARP_KEYS).load(COL)
    m2 = ml_smem.index(2 * WARP_KEYS).load(COL)
    m3 = ml_smem.index(3 * WARP_KEYS).load(COL)
    m = gl.maximum(gl.maximum(m0, m1), gl.maximum(m2, m3))
    m_use = gl.where(m == float("-inf"), 0.0, m)
    f0 = gl.exp2(m0 - m_use)
    f1 = gl.exp2(m1 - m_use)
    f2 = gl.exp2(m2 - m_use)
    f3 = gl.exp2(m3 - m_use)
    l_tot = (f0 * ml_smem.index(NK).load(COL) + f1 * ml_smem.index(NK + WARP_KEYS).load(COL)
             + f2 * ml_smem.index(NK + 2 * WARP_KEYS).load(COL)
             + f3 * ml_smem.index(NK + 3 * WARP_KEYS).load(COL))
    l_safe = gl.where(l_tot > 0, l_tot, 1.0)
    o = (acc0 * f0[None, :] + acc1 * f1[None, :] + acc2 * f2[None, :] + acc3 * f3[None, :]) / l_safe[None, :]
    lse = gl.where(l_tot > 0, m + gl.log2(l_safe), float("-inf"))
    return o, lse


@gluon.jit
def _swapw_softmax_partition(Q, q_smem, qpe_smem, kv_smem, pe_smem, pt_smem, alpha_smem, ml_smem, kv_ready, kv_free,
                             p_ready, p_free, l_ready, MASK, O_PART, LSE_PART, qk_scale, n_prefix, mask_stride,
                             n_heads, n_rows, part_stride, start, end, n_iter, pid_s,
                             BLOCK_N: gl.constexpr, STAGES: gl.constexpr, RN: gl.constexpr, D_NOPE: gl.constexpr,
                             D_PE: gl.constexpr, D_HALF: gl.constexpr, WARPS: gl.constexpr, TIMES=None,
                             TIMED: gl.constexpr = False):
    """``_swap_softmax_partition`` with each warp's keys on their own (the section's note): per tile the scores, the
    warp's softmax, P^T and the [keys, rows] factors to the worker, O^T's first half into four accumulators; after
    the loop the warps' maxima and sums to shared memory for both warpgroups' merge of their four."""
    dtype: gl.constexpr = pt_smem.dtype
    store_q(Q, q_smem, qpe_smem, 0, n_rows, RN, D_NOPE, D_PE, WARPS)

    S_L: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[WARPS, 1], instr_shape=[16, RN, 16])
    COL: gl.constexpr = gl.SliceLayout(0, S_L)
    m_i = gl.full([BLOCK_N, RN], float("-inf"), gl.float32, layout=S_L)
    l_i = gl.zeros([BLOCK_N, RN], gl.float32, layout=S_L)
    acc0 = gl.zeros([D_HALF, RN], gl.float32, layout=S_L)
    acc1 = acc0
    acc2 = acc0
    acc3 = acc0
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
        p, alpha, m_i, l_i = _softmax_w(s, m_i, l_i, it, MASK, qk_scale, n_prefix, mask_stride, n_heads, n_rows,
                                        start, end, BLOCK_N, RN, S_L, dtype)
        if TIMED:
            t3 = _clock(tick)
            ph2 += t3 - t2
        mbarrier.wait(p_free, (it & 1) ^ 1)  # the worker has read P^T and the factors of tile it - 1
        if TIMED:
            t4 = _clock(tick)
            ph3 += t4 - t3
        pt_smem.store(p)
        alpha_smem.store(alpha)
        fence_async_shared()  # P^T visible to both warpgroups' tensor cores
        gl.thread_barrier()  # and every warp's factors to this warpgroup's threads
        mbarrier.arrive(p_ready, count=1)
        if TIMED:
            t5 = _clock(tick)
            ph4 += t5 - t4
        acc0, acc1, acc2, acc3 = _pv_four(kv_smem, pt_smem, alpha_smem, buf, acc0, acc1, acc2, acc3, 0, D_HALF, COL)
        mbarrier.arrive(kv_free.index(buf), count=1)  # this warpgroup is done with the buffer
        if TIMED:
            ph5 += _clock(tick) - t5
    if TIMED:
        g_loop = _globaltimer(tick)
        _store_phases(TIMES, pid_s, 0, tick, (ph0, ph1, ph2, ph3, ph4, ph5), t_loop, n_iter, WARPS)

    l_w = _warp_keys_sum(l_i)
    mbarrier.wait(p_free, (n_iter & 1) ^ 1)  # the worker has read the last factors
    ml_smem.index(0).store(m_i)
    ml_smem.index(1).store(l_w)
    gl.thread_barrier()
    mbarrier.arrive(l_ready, count=1)
    o, lse = _merge_four(acc0, acc1, acc2, acc3, ml_smem, COL)
    rows_o = gl.arange(0, RN, layout=COL)
    dims = gl.arange(0, D_HALF, layout=gl.SliceLayout(1, S_L))
    gl.store(O_PART + (pid_s.to(gl.int64) * part_stride + rows_o)[None, :] * (2 * D_HALF) + dims[:, None],
             o.to(O_PART.dtype.element_ty), mask=(rows_o < n_rows)[None, :])
    gl.store(LSE_PART + pid_s.to(gl.int64) * part_stride + rows_o, lse, mask=rows_o < n_rows)
    if TIMED:
        _stamp_timeline(TIMES, pid_s, tick, g_start, g_first, g_loop, _globaltimer(tick), WARPS)


@gluon.jit
def _swapw_store_second_half(acc0, acc1, acc2, acc3, ml_smem, l_ready, O_PART, n_rows, part_stride, pid_s,
                             RN: gl.constexpr, D_HALF: gl.constexpr, WARPS: gl.constexpr):
    """Warpgroup 1's end in the warp-softmax forms: once warpgroup 0's maxima and sums are in ``ml_smem``, its four
    accumulators merged (``_merge_four``) and its half of the split's partial stored."""
    S_L: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[WARPS, 1], instr_shape=[16, RN, 16])
    COL_O: gl.constexpr = gl.SliceLayout(0, S_L)
    mbarrier.wait(l_ready, 0)
    o, lse = _merge_four(acc0, acc1, acc2, acc3, ml_smem, COL_O)
    rows_o = gl.arange(0, RN, layout=COL_O)
    dims = D_HALF + gl.arange(0, D_HALF, layout=gl.SliceLayout(1, S_L))
    gl.store(O_PART + (pid_s.to(gl.int64) * part_stride + rows_o)[None, :] * (2 * D_HALF) + dims[:, None],
             o.to(O_PART.dtype.element_ty), mask=(rows_o < n_rows)[None, :])


@gluon.jit
def _swapw_pv_loader_partition(kv_smem, pe_smem, pt_smem, alpha_smem, ml_smem, kv_ready, kv_free, p_ready, p_free,
                               l_ready, KV, TOKEN_TABLE, DRAFT_TABLE, O_PART, n_prefix, n_rows, part_stride, start,
                               end, n_iter, pid_s, stride_kv,
                               BLOCK_N: gl.constexpr, STAGES: gl.constexpr, RN: gl.constexpr, D_NOPE: gl.constexpr,
                               D_PE: gl.constexpr, D_HALF: gl.constexpr, WARPS: gl.constexpr, RAGGED: gl.constexpr,
                               TIMES=None, TIMED: gl.constexpr = False):
    """``_swap_pv_loader_partition`` with four accumulators (the warps' keys on their own): the copies as before, O^T's
    second half per warp's k-step, merged after the loop with warpgroup 0's maxima and sums."""
    LD: gl.constexpr = gl.BlockedLayout([1, 8], [1, 32], [WARPS, 1], [1, 0])
    LD_PE: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [WARPS, 1], [1, 0])
    S_L: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[WARPS, 1], instr_shape=[16, RN, 16])
    COL_O: gl.constexpr = gl.SliceLayout(0, S_L)

    nx_slot, nx_slot_pe = _issue_first_tiles(KV, kv_smem, pe_smem, kv_ready, TOKEN_TABLE, DRAFT_TABLE, n_prefix, start,
                                             end, stride_kv, BLOCK_N, STAGES, D_NOPE, D_PE, LD, LD_PE, RAGGED)
    acc0 = gl.zeros([D_HALF, RN], gl.float32, layout=S_L)
    acc1 = acc0
    acc2 = acc0
    acc3 = acc0
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
        acc0, acc1, acc2, acc3 = _pv_four(kv_smem, pt_smem, alpha_smem, buf, acc0, acc1, acc2, acc3, D_HALF, D_HALF,
                                          COL_O)
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
    _swapw_store_second_half(acc0, acc1, acc2, acc3, ml_smem, l_ready, O_PART, n_rows, part_stride, pid_s, RN, D_HALF,
                             WARPS)


@gluon.jit
def _swapw_pv_partition(kv_smem, pt_smem, alpha_smem, ml_smem, kv_free, p_ready, p_free, l_ready, O_PART, n_rows,
                        part_stride, n_iter, pid_s, STAGES: gl.constexpr, RN: gl.constexpr, D_HALF: gl.constexpr,
                        WARPS: gl.constexpr):
    """``_swapw_pv_loader_partition`` without the copies (another partition fills the ring, as gluon_ws_fp8's
    converting warpgroups): O^T's second half per warp's k-step, then the buffer released (one of kv_free's two
    arrivals); merged after the loop with warpgroup 0's maxima and sums."""
    S_L: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[WARPS, 1], instr_shape=[16, RN, 16])
    COL_O: gl.constexpr = gl.SliceLayout(0, S_L)
    acc0 = gl.zeros([D_HALF, RN], gl.float32, layout=S_L)
    acc1 = acc0
    acc2 = acc0
    acc3 = acc0
    for it in range(0, n_iter):
        buf = it % STAGES
        mbarrier.wait(p_ready, it & 1)
        acc0, acc1, acc2, acc3 = _pv_four(kv_smem, pt_smem, alpha_smem, buf, acc0, acc1, acc2, acc3, D_HALF, D_HALF,
                                          COL_O)
        gl.thread_barrier()  # every thread's reads of P^T and the factors done
        mbarrier.arrive(p_free, count=1)
        mbarrier.arrive(kv_free.index(buf), count=1)
    _swapw_store_second_half(acc0, acc1, acc2, acc3, ml_smem, l_ready, O_PART, n_rows, part_stride, pid_s, RN, D_HALF,
                             WARPS)


@gluon.jit
def _swapw_partial_kernel(Q, KV, TOKEN_TABLE, MASK, O_PART, LSE_PART, TIMES,
                          qk_scale, n_prefix, n_kv, n_draft, n_heads, n_rows, tokens_per_split, stride_kv, n_splits,
                          BLOCK_N: gl.constexpr, STAGES: gl.constexpr, RN: gl.constexpr, D_NOPE: gl.constexpr,
                          D_PE: gl.constexpr, D_HALF: gl.constexpr, num_warps: gl.constexpr,
                          WORKER_REGS: gl.constexpr, TIMED: gl.constexpr = False):
    """``_swap_partial_kernel`` with each warp's keys on their own (the section's note); TIMES unused unless TIMED."""
    pid_s = gl.program_id(0)
    if TIMED:  # the program's entry (gluon_ws.TIMELINE_SLOTS)
        tick0 = gl.arange(0, 32 * num_warps, layout=gl.BlockedLayout([1], [32], [num_warps], [0]))
        _stamp(TIMES, pid_s, 8, tick0, _globaltimer(tick0), num_warps)
    (q_smem, qpe_smem, kv_smem, pe_smem, pt_smem, row_smem, kv_ready, kv_free, p_ready, p_free,
     l_ready) = _swap_shared_state(Q.dtype.element_ty, BLOCK_N, STAGES, RN, D_NOPE, D_PE, num_warps)
    PLAIN: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, order=[1, 0])
    alpha_smem = gl.allocate_shared_memory(gl.float32, [BLOCK_N, RN], PLAIN)  # the factors of the last tile
    ml_smem = gl.allocate_shared_memory(gl.float32, [2, BLOCK_N, RN], PLAIN)  # the warps' maxima and sums, at the end
    start, end, n_iter = split_bounds(pid_s, tokens_per_split, n_kv, n_splits, BLOCK_N)
    gl.warp_specialize([
        (_swapw_softmax_partition, (Q, q_smem, qpe_smem, kv_smem, pe_smem, pt_smem, alpha_smem, ml_smem, kv_ready,
                                    kv_free, p_ready, p_free, l_ready, MASK, O_PART, LSE_PART, qk_scale, n_prefix,
                                    n_draft, n_heads, n_rows, n_rows, start, end, n_iter, pid_s, BLOCK_N, STAGES, RN,
                                    D_NOPE, D_PE, D_HALF, num_warps, TIMES, TIMED)),
        (_swapw_pv_loader_partition, (kv_smem, pe_smem, pt_smem, alpha_smem, ml_smem, kv_ready, kv_free, p_ready,
                                      p_free, l_ready, KV, TOKEN_TABLE, TOKEN_TABLE, O_PART, n_prefix, n_rows, n_rows,
                                      start, end, n_iter, pid_s, stride_kv, BLOCK_N, STAGES, RN, D_NOPE, D_PE, D_HALF,
                                      num_warps, False, TIMES, TIMED)),
    ], [num_warps], [WORKER_REGS])


# ---- session 12: a third partition that only copies (the producer), so P V never waits behind a refill's issue ----
# Runs 43-44's phases: warpgroup 1 spends 1,400-2,100 cycles a tile issuing the refill's cp.async (longer with a
# third buffer, when the copies queue at the memory system), and its next tile's P V, so warpgroup 0's next publish,
# waits behind it. Here warpgroup 1 only does its half of P V, and warpgroup 2 (PRODUCER_REGS registers) only issues
# copies, each as soon as both others have freed the buffer (kv_free counts two arrivals).
PRODUCER_REGS = 88  # the copying warpgroup's registers (token-table rows a tile ahead and the copies' addresses)
PV_REGS = 192  # warpgroup 1's: its half of O^T (16-32 registers at N 8-16) and P^T's reads


@gluon.jit
def _swap_pv_partition(kv_smem, pt_smem, row_smem, kv_free, p_ready, p_free, l_ready, O_PART, n_rows, part_stride,
                       n_iter, pid_s, STAGES: gl.constexpr, RN: gl.constexpr, D_HALF: gl.constexpr,
                       WARPS: gl.constexpr):
    """Warpgroup 1 of the three-partition form: O^T's second half per tile, then the buffer released (one of
    kv_free's two arrivals); its half of the partial at the end."""
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


@gluon.jit
def _swap_copy_partition(kv_smem, pe_smem, kv_ready, kv_free, KV, TOKEN_TABLE, DRAFT_TABLE, n_prefix, start, end,
                         n_iter, stride_kv, BLOCK_N: gl.constexpr, STAGES: gl.constexpr, D_NOPE: gl.constexpr,
                         D_PE: gl.constexpr, WARPS: gl.constexpr, RAGGED: gl.constexpr):
    """Warpgroup 2 of the three-partition form: the ring's first tiles, then each refill as soon as warpgroups 0 and
    1 have both released the buffer (the pick's copies: token-table rows prefetched a tile ahead)."""
    LD: gl.constexpr = gl.BlockedLayout([1, 8], [1, 32], [WARPS, 1], [1, 0])
    LD_PE: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [WARPS, 1], [1, 0])
    nx_slot, nx_slot_pe = _issue_first_tiles(KV, kv_smem, pe_smem, kv_ready, TOKEN_TABLE, DRAFT_TABLE, n_prefix, start,
                                             end, stride_kv, BLOCK_N, STAGES, D_NOPE, D_PE, LD, LD_PE, RAGGED)
    for it in range(0, n_iter - STAGES):
        buf = it % STAGES
        mbarrier.wait(kv_free.index(buf), (it // STAGES) & 1)
        nx_slot, nx_slot_pe = _refill(KV, kv_smem, pe_smem, kv_ready, buf, nx_slot, nx_slot_pe, TOKEN_TABLE,
                                      DRAFT_TABLE, n_prefix, start + (it + STAGES) * BLOCK_N, end, stride_kv, BLOCK_N,
                                      D_NOPE, D_PE, LD, LD_PE, True, RAGGED)


@gluon.jit
def _swap3_partial_kernel(Q, KV, TOKEN_TABLE, MASK, O_PART, LSE_PART,
                          qk_scale, n_prefix, n_kv, n_draft, n_heads, n_rows, tokens_per_split, stride_kv, n_splits,
                          BLOCK_N: gl.constexpr, STAGES: gl.constexpr, RN: gl.constexpr, D_NOPE: gl.constexpr,
                          D_PE: gl.constexpr, D_HALF: gl.constexpr, num_warps: gl.constexpr,
                          PV_REGS: gl.constexpr, PRODUCER_REGS: gl.constexpr):
    """``_swap_partial_kernel`` with the copies in a partition of their own (the section's note)."""
    pid_s = gl.program_id(0)
    (q_smem, qpe_smem, kv_smem, pe_smem, pt_smem, row_smem, kv_ready, kv_free, p_ready, p_free,
     l_ready) = _swap_shared_state(Q.dtype.element_ty, BLOCK_N, STAGES, RN, D_NOPE, D_PE, num_warps, 2)
    start, end, n_iter = split_bounds(pid_s, tokens_per_split, n_kv, n_splits, BLOCK_N)
    gl.warp_specialize([
        (_swap_softmax_partition, (Q, q_smem, qpe_smem, kv_smem, pe_smem, pt_smem, row_smem, kv_ready, kv_free,
                                   p_ready, p_free, l_ready, MASK, O_PART, LSE_PART, qk_scale, n_prefix, n_draft,
                                   n_heads, n_rows, n_rows, start, end, n_iter, pid_s, BLOCK_N, STAGES, RN, D_NOPE,
                                   D_PE, D_HALF, num_warps)),
        (_swap_pv_partition, (kv_smem, pt_smem, row_smem, kv_free, p_ready, p_free, l_ready, O_PART, n_rows, n_rows,
                              n_iter, pid_s, STAGES, RN, D_HALF, num_warps)),
        (_swap_copy_partition, (kv_smem, pe_smem, kv_ready, kv_free, KV, TOKEN_TABLE, TOKEN_TABLE, n_prefix, start,
                                end, n_iter, stride_kv, BLOCK_N, STAGES, D_NOPE, D_PE, num_warps, False)),
    ], [num_warps, num_warps], [PV_REGS, PRODUCER_REGS])


def split_kv_gluon_swap_alt(inputs: VerifyInputs, out: torch.Tensor, form: Form, block_n: int = 64, stages: int = 2,
                            num_sms: int | None = None, pdl_merge: bool = True, merge_block_dv: int = 64,
                            merge_one_pass: bool = True, merge_one_pass_max_splits: int = 512,
                            fit_rows: bool = False, fit_stages: int = 0,
                            times: torch.Tensor | None = None, split_round_tokens: int = BLOCK_TOKENS) -> torch.Tensor:
    """gluon_ws_swap.split_kv_gluon_swap in one of this module's forms (module doc): ``warp_softmax`` (timed too, with
    ``times``) or ``producer`` (``fit_stages`` its ring's buffers at an N of 8, as the pick's knob; no timed form);
    the same set-up (``swap_launch``) and merge; writes ``out``."""
    if form not in FORMS:
        raise ValueError(f"form must be one of {FORMS}; got {form!r}")
    if form == "producer" and times is not None:
        raise ValueError("the producer form has no timed variant: pass times=None, or form='warp_softmax'")
    if form == "warp_softmax" and fit_stages:
        raise ValueError("the warp_softmax form keeps the arm's stages: pass fit_stages=0")
    if fit_stages not in (0, 2, 3):
        raise ValueError(f"fit_stages must be 0 (the arm's stages), 2 or 3; got {fit_stages}")
    launch = swap_launch(inputs, "split_kv_gluon_swap_alt", block_n, stages, num_sms, merge_block_dv,
                         merge_one_pass, merge_one_pass_max_splits, fit_rows, times, split_round_tokens)
    grid = (launch.plan.n_splits,)
    if form == "producer":
        const = {**launch.const, "STAGES": fit_stages if launch.rn == 8 and fit_stages else stages}
        _swap3_partial_kernel[grid](*launch.args[:6], *launch.args[7:], PV_REGS=PV_REGS, PRODUCER_REGS=PRODUCER_REGS,
                                    **const)
    else:
        _swapw_partial_kernel[grid](*launch.args, WORKER_REGS=WS_WORKER_REGS, TIMED=times is not None, **launch.const)
    return launch.merge(out, pdl_merge)


def compile_sm90(form: Form, block_n: int = 64, stages: int = 2, dtype: str = "bf16", rn: int = 16,
                 timed: bool = False) -> "triton.compiler.CompiledKernel":
    """The form's partial kernel compiled ahead of time for sm_90 (no GPU needed), for the CPU tests."""
    if form not in FORMS:
        raise ValueError(f"form must be one of {FORMS}; got {form!r}")
    sig, const = compile_signature(dtype, timed, block_n, stages, rn)
    if form == "producer":  # no TIMES parameter, no timed form; the two workers' registers
        if timed:
            raise ValueError("the producer form has no timed variant")
        del sig["TIMES"]
        const.update(PV_REGS=PV_REGS, PRODUCER_REGS=PRODUCER_REGS)
        return compile_kernel(_swap3_partial_kernel, sig, const)
    const.update(WORKER_REGS=WS_WORKER_REGS, TIMED=timed)
    return compile_kernel(_swapw_partial_kernel, sig, const)
