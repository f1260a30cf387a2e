"""The pick's warp-specialized kernel with the query rows as the wgmma's N operand, for up to 16 packed rows.

Why: the wgmma's M is 64 whatever the rows, so with the rows as M (gluon.ws) the scores of 8-16 query rows cost what
64 rows cost (m64n64k16 x 36 per tile) and the P V too (m64n256k16 x 4 per warpgroup), and each ring buffer is held
through that math. At one draft token gluon.ws streams its KV at only 0.78-0.89 of the read floor of its own launch
shape on the H200, about 2,900 of warpgroup 0's 4,650 cycles per tile going to that math at 128k tokens, 8 heads x 1
draft token. Here the keys are the M side and the rows the N side:

- scores transposed, S^T [64 keys, 16 rows] = K Q^T: A = the KV tile from shared memory, B = Q [16, 576] permuted
  (m64n16k16 x 36: a quarter of the N of gluon.ws's);
- the online softmax runs down the keys (axis 0: a reduction across the warpgroup's four warps);
- P^T [64 keys, 16 rows] to shared memory, the B operand of both warpgroups' O^T [256 dims, 16 rows] += V^T P^T, with
  V^T the permuted half of the same KV tile as the A operand (m64n16k16 x 16 per warpgroup);
- Q is 16 x 576 (18 KB, not gluon.ws's 74 KB), loaded by warpgroup 0 while warpgroup 1 issues the first tiles.

On the H200 this form was faster than the row-major kernel at 8-16 rows (0.94-0.96 of its time on SGLang's layout),
so the pick and the plugin run it up to 16 rows. With ``fit_rows`` (the pick's) calls of up to 8 rows run an N of 8:
half the math of an N of 16.

The ring, its barriers, the copies (gluon.ws ``_issue_first_tiles`` / ``_refill``, token-table rows prefetched a tile
ahead), the split and the partials' layout are gluon.ws's, so the merge is merge.merge_partials. Rows are packed as there
(row = draft token x heads + head; tree mask by the row's draft token). ``_swap_pv_partition`` is the P V warpgroup of
the three- and four-partition fp8 kernels (gluon.fp8), where a separate warpgroup brings the tiles in. Chain or tree
drafts, page_size 1, bf16 or fp16, CUDA sm_90 only (the CPU tests compile it for sm_90).
"""

from __future__ import annotations

from dataclasses import replace

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, warpgroup_mma,
                                                              warpgroup_mma_wait)

from specdiag.kernels.gluon.ws import (WS_PARTITION_WARPS, WS_WORKER_REGS, _issue_first_tiles, _refill,
                                       _wait_tile, check_gluon_inputs, split_bounds, store_q, ws_barriers)
from specdiag.kernels.merge import merge_partials
from specdiag.kernels.mla import BLOCK_TOKENS, D_NOPE, D_PE, D_V, LOG2E, VerifyInputs
from specdiag.kernels.plan import gluon_config, plan_splits, sm_count

#: query rows per program (the wgmma's N): every call of up to this many packed rows runs one row tile
SWAP_MAX_ROWS = 16
#: the N of ``fit_rows`` (calls of up to this many rows)
FIT_ROWS = 8
D_HALF = D_V // 2  # value dims per warpgroup (the M of its O^T)


@gluon.jit
def _softmax_t(s, m_i, l_i, it, MASK, qk_scale, n_prefix, mask_stride, n_heads, n_rows, start, end,
               BLOCK_N: gl.constexpr, RN: gl.constexpr, S_L: gl.constexpr, dtype: gl.constexpr):
    """Tile ``it``'s mask and online softmax down the keys of S^T [keys, rows]: P^T (``dtype``), the rows' rescale
    factor, running max and sum. A tile wholly inside the split and the prefix is not masked (the scale folded into
    the exponent); any other gets the split's end, the prefix and the tree mask of the row's draft token."""
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
    l_new = l_i * alpha + gl.sum(p32, 0)
    return p32.to(dtype), alpha, m_new, l_new


@gluon.jit
def _swap_softmax_partition(Q, q_smem, qpe_smem, kv_smem, pe_smem, pt_smem, row_smem, kv_ready, kv_free, p_ready,
                            p_free, l_ready, MASK, O_PART, LSE_PART, qk_scale, n_prefix, mask_stride, n_heads, n_rows,
                            part_stride, start, end, n_iter, pid_s,
                            BLOCK_N: gl.constexpr, STAGES: gl.constexpr, RN: gl.constexpr, D_NOPE: gl.constexpr,
                            D_PE: gl.constexpr, D_HALF: gl.constexpr, WARPS: gl.constexpr):
    """Warpgroup 0: Q to shared memory, then per tile the scores S^T, the softmax down the keys, P^T and the factors
    to the worker, and O^T's first half; the partial's first half and the rows' LSE at the end (module doc). Split
    ``pid_s``'s partial rows start at ``pid_s * part_stride`` (the dense call: its rows; the ragged one: the batch's
    most rows, in the request's block)."""
    dtype: gl.constexpr = pt_smem.dtype
    store_q(Q, q_smem, qpe_smem, 0, n_rows, RN, D_NOPE, D_PE, WARPS)

    S_L: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[WARPS, 1], instr_shape=[16, RN, 16])
    COL: gl.constexpr = gl.SliceLayout(0, S_L)  # one per row; O^T's accumulator has S^T's layout too (N = RN)
    m_i = gl.full([RN], float("-inf"), gl.float32, layout=COL)
    l_i = gl.zeros([RN], gl.float32, layout=COL)
    acc = gl.zeros([D_HALF, RN], gl.float32, layout=S_L)
    for it in range(0, n_iter):
        buf = it % STAGES
        _wait_tile(kv_ready, it, STAGES)
        s = warpgroup_mma(kv_smem.index(buf), q_smem.permute((1, 0)), gl.zeros([BLOCK_N, RN], gl.float32, layout=S_L),
                          use_acc=False, is_async=True)
        s = warpgroup_mma(pe_smem.index(buf), qpe_smem.permute((1, 0)), s, is_async=True)
        s = warpgroup_mma_wait(num_outstanding=0, deps=(s,))
        p, alpha, m_i, l_i = _softmax_t(s, m_i, l_i, it, MASK, qk_scale, n_prefix, mask_stride, n_heads, n_rows,
                                        start, end, BLOCK_N, RN, S_L, dtype)
        mbarrier.wait(p_free, (it & 1) ^ 1)  # the worker has read P^T and the factors of tile it - 1
        pt_smem.store(p)
        row_smem.store(alpha)
        fence_async_shared()  # P^T visible to both warpgroups' tensor cores
        gl.thread_barrier()
        mbarrier.arrive(p_ready, count=1)
        acc = acc * alpha[None, :]
        acc = warpgroup_mma(kv_smem.index(buf).slice(0, D_HALF, dim=1).permute((1, 0)), pt_smem, acc, is_async=True)
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
        mbarrier.arrive(kv_free.index(buf), count=1)  # this warpgroup is done with the buffer

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


@gluon.jit
def _swap_pv_loader_partition(kv_smem, pe_smem, pt_smem, row_smem, kv_ready, kv_free, p_ready, p_free, l_ready, KV,
                              TOKEN_TABLE, DRAFT_TABLE, O_PART, n_prefix, n_rows, part_stride, start, end, n_iter,
                              pid_s, stride_kv,
                              BLOCK_N: gl.constexpr, STAGES: gl.constexpr, RN: gl.constexpr, D_NOPE: gl.constexpr,
                              D_PE: gl.constexpr, D_HALF: gl.constexpr, WARPS: gl.constexpr, RAGGED: gl.constexpr):
    """Warpgroup 1: every KV tile's copy into the ring (gluon.ws's, token-table rows prefetched a tile ahead; with
    RAGGED the prefix's rows from TOKEN_TABLE and the draft tokens' from DRAFT_TABLE, as gluon.ragged) and O^T's
    second half; its half of the partial at the end."""
    LD: gl.constexpr = gl.BlockedLayout([1, 8], [1, 32], [WARPS, 1], [1, 0])
    LD_PE: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [WARPS, 1], [1, 0])
    S_L: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[WARPS, 1], instr_shape=[16, RN, 16])
    COL_O: gl.constexpr = gl.SliceLayout(0, S_L)

    nx_slot, nx_slot_pe = _issue_first_tiles(KV, kv_smem, pe_smem, kv_ready, TOKEN_TABLE, DRAFT_TABLE, n_prefix, start,
                                             end, stride_kv, BLOCK_N, STAGES, D_NOPE, D_PE, LD, LD_PE, RAGGED)
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
        if it + STAGES < n_iter:  # refill the buffer once warpgroup 0 is done with it too
            pos0 = start + (it + STAGES) * BLOCK_N
            mbarrier.wait(kv_free.index(buf), (it // STAGES) & 1)
            nx_slot, nx_slot_pe = _refill(KV, kv_smem, pe_smem, kv_ready, buf, nx_slot, nx_slot_pe, TOKEN_TABLE,
                                          DRAFT_TABLE, n_prefix, pos0, end, stride_kv, BLOCK_N, D_NOPE, D_PE, LD, LD_PE,
                                          RAGGED)
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
    """Both entries' shared memory and barriers (this module's and gluon.ragged's), initialized and visible to
    all: Q (filled by warpgroup 0), the KV ring, P^T, the rows' factors, and gluon.ws's barriers (``ws_barriers``;
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
def _swap_partial_kernel(Q, KV, TOKEN_TABLE, MASK, O_PART, LSE_PART,
                         qk_scale, n_prefix, n_kv, n_draft, n_heads, n_rows, tokens_per_split, stride_kv,
                         BLOCK_N: gl.constexpr, STAGES: gl.constexpr, RN: gl.constexpr, D_NOPE: gl.constexpr,
                         D_PE: gl.constexpr, D_HALF: gl.constexpr, num_warps: gl.constexpr,
                         WORKER_REGS: gl.constexpr):
    """One program per split (every row in one tile of RN): the shared memory and barriers, then the partitions."""
    pid_s = gl.program_id(0)
    (q_smem, qpe_smem, kv_smem, pe_smem, pt_smem, row_smem, kv_ready, kv_free, p_ready, p_free,
     l_ready) = _swap_shared_state(Q.dtype.element_ty, BLOCK_N, STAGES, RN, D_NOPE, D_PE, num_warps)
    start, end, n_iter = split_bounds(pid_s, tokens_per_split, n_kv, BLOCK_N)
    gl.warp_specialize([
        (_swap_softmax_partition, (Q, q_smem, qpe_smem, kv_smem, pe_smem, pt_smem, row_smem, kv_ready, kv_free,
                                   p_ready, p_free, l_ready, MASK, O_PART, LSE_PART, qk_scale, n_prefix, n_draft,
                                   n_heads, n_rows, n_rows, start, end, n_iter, pid_s, BLOCK_N, STAGES, RN, D_NOPE,
                                   D_PE, D_HALF, num_warps)),
        (_swap_pv_loader_partition, (kv_smem, pe_smem, pt_smem, row_smem, kv_ready, kv_free, p_ready, p_free, l_ready,
                                     KV, TOKEN_TABLE, TOKEN_TABLE, O_PART, n_prefix, n_rows, n_rows, start, end,
                                     n_iter, pid_s, stride_kv, BLOCK_N, STAGES, RN, D_NOPE, D_PE, D_HALF, num_warps,
                                     False)),
    ], [num_warps], [WORKER_REGS])


@gluon.jit
def _swap_pv_partition(kv_smem, pt_smem, row_smem, kv_free, p_ready, p_free, l_ready, O_PART, n_rows, part_stride,
                       n_iter, pid_s, STAGES: gl.constexpr, RN: gl.constexpr, D_HALF: gl.constexpr,
                       WARPS: gl.constexpr):
    """Warpgroup 1 when another warpgroup brings the tiles in (the fp8 kernels, gluon.fp8 and gluon.ragged):
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


def split_kv_gluon_swap(inputs: VerifyInputs, out: torch.Tensor, block_n: int = 64, stages: int = 2,
                        num_sms: int | None = None, pdl_merge: bool = True, merge_block_dv: int = 64,
                        merge_one_pass: bool = True, merge_one_pass_max_splits: int = 512, fit_rows: bool = False,
                        split_round_tokens: int = BLOCK_TOKENS) -> torch.Tensor:
    """Split-KV verify attention with the rows as the wgmma's N (module doc) for up to ``SWAP_MAX_ROWS`` packed rows,
    then merge.merge_partials (one pass, as a programmatic dependent launch by default: the pick's); writes ``out``.
    ``fit_rows``: an N of 8 where the rows fit it (half the math of 16 at 1-8 rows), else 16; ``split_round_tokens``:
    each split's tokens a multiple of this (``SplitKVConfig``'s field). The pick's arguments come from
    ``gluon.pick.pick_launch``."""
    check_gluon_inputs(inputs, "split_kv_gluon_swap")
    q, cache = inputs.q, inputs.cache
    T, H = inputs.draft_tokens, inputs.heads
    rows, n_kv = T * H, inputs.n_kv
    if rows > SWAP_MAX_ROWS:
        raise ValueError(f"split_kv_gluon_swap holds every row in one tile of {SWAP_MAX_ROWS}; this call has {rows} "
                         "(heads x draft tokens): use gluon.ws.split_kv_gluon_ws")
    cfg = replace(gluon_config(block_n, stages), merge_block_dv=merge_block_dv, merge_one_pass=merge_one_pass,
                  merge_one_pass_max_splits=merge_one_pass_max_splits, split_round_tokens=split_round_tokens)
    plan = plan_splits(rows, n_kv, cfg, num_sms or sm_count(q.device.index or 0))
    o_part = torch.empty(plan.n_splits, rows, D_V, device=q.device, dtype=torch.float32)
    lse_part = torch.empty(plan.n_splits, rows, device=q.device, dtype=torch.float32)
    _swap_partial_kernel[(plan.n_splits,)](
        q, cache, inputs.token_table, inputs.mask_u8, o_part, lse_part,
        inputs.sm_scale * LOG2E, inputs.n_prefix, n_kv, T, H, rows, plan.tokens_per_split, cache.stride(0),
        BLOCK_N=block_n, STAGES=stages, RN=FIT_ROWS if fit_rows and rows <= FIT_ROWS else SWAP_MAX_ROWS, D_NOPE=D_NOPE,
        D_PE=D_PE, D_HALF=D_HALF, num_warps=WS_PARTITION_WARPS, WORKER_REGS=WS_WORKER_REGS,
    )
    merge_partials(o_part, lse_part, out.view(rows, D_V), cfg, pdl=pdl_merge)
    return out


def compile_sm90(block_n: int = 64, stages: int = 2, dtype: str = "bf16",
                 rn: int = SWAP_MAX_ROWS) -> "triton.compiler.CompiledKernel":
    """The partial kernel compiled ahead of time for sm_90 (no GPU needed), for the CPU tests and
    scripts/kernel_ptx_hashes.py."""
    from triton.backends.compiler import GPUTarget  # noqa: PLC0415
    from triton.experimental.gluon._runtime import GluonASTSource  # noqa: PLC0415

    sig = {"Q": f"*{dtype}", "KV": f"*{dtype}", "TOKEN_TABLE": "*i64", "MASK": "*u8", "O_PART": "*fp32",
           "LSE_PART": "*fp32", "qk_scale": "fp32", "n_prefix": "i32", "n_kv": "i32", "n_draft": "i32",
           "n_heads": "i32", "n_rows": "i32", "tokens_per_split": "i32", "stride_kv": "i32"}
    const = {"BLOCK_N": block_n, "STAGES": stages, "RN": rn, "D_NOPE": D_NOPE, "D_PE": D_PE, "D_HALF": D_HALF,
             "num_warps": WS_PARTITION_WARPS, "WORKER_REGS": WS_WORKER_REGS}
    sig.update({k: "constexpr" for k in const})
    attrs = {(i,): [["tt.divisibility", 16]] for i, k in enumerate(sig)
             if k in ("Q", "KV", "TOKEN_TABLE", "O_PART", "LSE_PART", "stride_kv")}
    return triton.compile(GluonASTSource(_swap_partial_kernel, sig, const, attrs), target=GPUTarget("cuda", 90, 32),
                          options={"num_warps": WS_PARTITION_WARPS})
