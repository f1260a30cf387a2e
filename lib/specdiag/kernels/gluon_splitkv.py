"""Split-KV MLA verify attention written in Gluon (Triton's explicit-layout dialect) for Hopper: the scores once.

Why (docs/kernel-notes.md, "Runs 7-9 outcome"): in Triton's tile language a 64-row, 8-warp tile gets its scores
laid out for both warpgroups (a dot whose result feeds another dot gets numWarps x 1 warps), so each warpgroup
computes all of Q K^T; every Triton arm that tried to avoid that (runs 6-8) was slower. Gluon lets the kernel say
where each value lives:

- Q (64 rows x 576) sits in shared memory for the whole program; each KV tile (BLOCK_N tokens x 576) is gathered
  through the token table with ``cp.async`` into a ring of STAGES shared buffers, the next tile's copy in flight
  while the current one is used.
- S = Q K^T is one ``warpgroup_mma`` with warps [4, 2]: warpgroup 0 computes the scores of the first BLOCK_N/2 keys,
  warpgroup 1 of the others (no score computed twice). The row max and sum cross the two warpgroups (the compiler's
  reduction through shared memory).
- P (64 x BLOCK_N, bf16) goes to shared memory once; O += P V is a second ``warpgroup_mma`` with warps [4, 2]: each
  warpgroup accumulates 256 of the 512 value dims (64 x 256 fp32: 128 registers per thread). V is the K tile's first
  512 columns, already in shared memory.
- Masks as the Triton kernel: keys past the split's end are masked (their copies predicated off), the draft block
  under the tree mask. Partials (normalized, fp32) and base-2 LSE per split; the merge is triton_splitkv's merge.

Chain or tree drafts, page_size 1 (token table), bf16 or fp16 (the same dtype for Q and the cache). CUDA sm_90 only:
Triton's interpreter does not run Gluon; the CPU test compiles it for sm_90 and checks the shared memory it needs.
"""

from __future__ import annotations

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, warpgroup_mma, warpgroup_mma_init,
                                                              warpgroup_mma_wait)

from specdiag.kernels.mla import D_NOPE, D_PE, D_QK, D_V, VerifyInputs
from specdiag.kernels.splitkv_plan import GLUON_BLOCK_M, GLUON_NUM_WARPS, gluon_config, plan_splits

LOG2E = 1.4426950408889634


@gluon.jit
def _issue_slots(KV, kv_buf, pe_buf, slot, slot_pe, ok, ok_pe, stride_kv,
                 D_NOPE: gl.constexpr, D_PE: gl.constexpr, LD: gl.constexpr, LD_PE: gl.constexpr):
    """cp.async of the rows at ``slot`` / ``slot_pe`` (token indices already in registers) into kv_buf / pe_buf."""
    offs_d = gl.arange(0, D_NOPE, layout=gl.SliceLayout(0, LD))
    async_copy.async_copy_global_to_shared(kv_buf, KV + slot[:, None] * stride_kv + offs_d[None, :], mask=ok[:, None])
    offs_pe = D_NOPE + gl.arange(0, D_PE, layout=gl.SliceLayout(0, LD_PE))
    async_copy.async_copy_global_to_shared(pe_buf, KV + slot_pe[:, None] * stride_kv + offs_pe[None, :],
                                           mask=ok_pe[:, None])


@gluon.jit
def load_q_cols(Q, pid_m, n_rows, COL0: gl.constexpr, BLOCK_M: gl.constexpr, WIDTH: gl.constexpr,
                ROW_LEN: gl.constexpr, L: gl.constexpr):
    """Columns COL0 .. COL0 + WIDTH - 1 of the query rows pid_m * BLOCK_M .. (Q is [rows, ROW_LEN]) in layout L; rows
    past ``n_rows`` are 0. Both Gluon kernels put Q in shared memory with it."""
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
    """The shared memory both Gluon kernels share: the row tile's Q (no-PE and PE parts, loaded; with LOAD_Q False
    left for the caller to fill, ``store_q``), the ring of STAGES KV tiles (no-PE and PE parts) and one P tile, each in
    the wgmma's default swizzled layout."""
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
def _gl_partial_kernel(Q, KV, TOKEN_TABLE, MASK, O_PART, LSE_PART,
                          qk_scale, n_prefix, n_kv, n_draft, n_heads, n_rows, tokens_per_split, stride_kv,
                          BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
                          D_NOPE: gl.constexpr, D_PE: gl.constexpr, num_warps: gl.constexpr,
                          PV_ACROSS: gl.constexpr = False, EARLY_COPY: gl.constexpr = False):
    """The partial kernel (module doc). Both wgmmas asynchronous; with ``PV_ACROSS`` (run 11) tile i's P V is still
    running while tile i + 1's scores are issued, but ptxas reports C7514 for it and serializes the wgmmas; with
    PV_ACROSS False (run 12, the default) each P V is waited for in its own iteration, which ptxas keeps asynchronous.
    The token indices of the next copy are loaded an iteration ahead; the ring's next copy is issued once both
    warpgroups are done with the buffer it overwrites. (Run 10's synchronous kernel, slower than split_p1, is at commit
    991aa20.) ``EARLY_COPY`` (only with PV_ACROSS False, run 14): that copy is issued right after the barrier that
    opens the iteration (every warpgroup has waited for the last P V by then), one CTA barrier per tile fewer."""
    pid_m = gl.program_id(0)
    pid_s = gl.program_id(1)
    dtype: gl.constexpr = Q.dtype.element_ty
    LD: gl.constexpr = gl.BlockedLayout([1, 8], [1, 32], [num_warps, 1], [1, 0])
    LD_PE: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [num_warps, 1], [1, 0])
    S_L: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 2], instr_shape=[16, BLOCK_N // 2, 16])
    O_L: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 2], instr_shape=[16, 256, 16])
    ROW_S: gl.constexpr = gl.SliceLayout(1, S_L)
    COL_S: gl.constexpr = gl.SliceLayout(0, S_L)
    ROW_O: gl.constexpr = gl.SliceLayout(1, O_L)
    POS_LD: gl.constexpr = gl.SliceLayout(1, LD)
    POS_PE: gl.constexpr = gl.SliceLayout(1, LD_PE)

    q_smem, qpe_smem, kv_smem, pe_smem, p_smem = q_and_ring_smem(Q, pid_m, n_rows, BLOCK_M, BLOCK_N, STAGES, D_NOPE,
                                                                 D_PE, LD, LD_PE)

    start = pid_s * tokens_per_split
    end = gl.minimum(start + tokens_per_split, n_kv)
    n_iter = gl.cdiv(gl.maximum(end - start, 0), BLOCK_N)
    rows_s = pid_m * BLOCK_M + gl.arange(0, BLOCK_M, layout=ROW_S)
    draft_row = rows_s // n_heads
    m_i = gl.full([BLOCK_M], float("-inf"), gl.float32, layout=ROW_S)
    l_i = gl.zeros([BLOCK_M], gl.float32, layout=ROW_S)
    acc = warpgroup_mma_init(gl.zeros([BLOCK_M, D_NOPE], gl.float32, layout=O_L))  # carried as an async accumulator

    # prologue: tiles 0 .. STAGES - 2 in flight (one commit group each, empty past the split), the next tile's indices
    for k in gl.static_range(STAGES - 1):
        p0 = start + k * BLOCK_N + gl.arange(0, BLOCK_N, layout=POS_LD)
        p0_pe = start + k * BLOCK_N + gl.arange(0, BLOCK_N, layout=POS_PE)
        s0 = gl.load(TOKEN_TABLE + p0, mask=p0 < end, other=0).to(gl.int64)
        s0_pe = gl.load(TOKEN_TABLE + p0_pe, mask=p0_pe < end, other=0).to(gl.int64)
        _issue_slots(KV, kv_smem.index(k), pe_smem.index(k), s0, s0_pe, p0 < end, p0_pe < end, stride_kv,
                     D_NOPE, D_PE, LD, LD_PE)
        async_copy.commit_group()
    nx_pos = start + (STAGES - 1) * BLOCK_N + gl.arange(0, BLOCK_N, layout=POS_LD)
    nx_pos_pe = start + (STAGES - 1) * BLOCK_N + gl.arange(0, BLOCK_N, layout=POS_PE)
    nx_slot = gl.load(TOKEN_TABLE + nx_pos, mask=nx_pos < end, other=0).to(gl.int64)
    nx_slot_pe = gl.load(TOKEN_TABLE + nx_pos_pe, mask=nx_pos_pe < end, other=0).to(gl.int64)

    for it in range(0, n_iter):
        async_copy.wait_group(STAGES - 2)  # tile `it` has landed (this thread's copies)
        gl.thread_barrier()  # ... every thread's
        fence_async_shared()  # ... visible to the tensor cores
        if EARLY_COPY:  # both warpgroups waited for tile it - 1's P V in that iteration, before the barrier above
            _issue_slots(KV, kv_smem.index((it + STAGES - 1) % STAGES), pe_smem.index((it + STAGES - 1) % STAGES),
                         nx_slot, nx_slot_pe, nx_pos < end, nx_pos_pe < end, stride_kv, D_NOPE, D_PE, LD, LD_PE)
            async_copy.commit_group()
            nx_pos = nx_pos + BLOCK_N
            nx_pos_pe = nx_pos_pe + BLOCK_N
            nx_slot = gl.load(TOKEN_TABLE + nx_pos, mask=nx_pos < end, other=0).to(gl.int64)
            nx_slot_pe = gl.load(TOKEN_TABLE + nx_pos_pe, mask=nx_pos_pe < end, other=0).to(gl.int64)
        buf = it % STAGES
        k_tile = kv_smem.index(buf)
        s_tok = warpgroup_mma(q_smem, k_tile.permute((1, 0)), gl.zeros([BLOCK_M, BLOCK_N], gl.float32, layout=S_L),
                              use_acc=False, is_async=True)
        s_tok = warpgroup_mma(qpe_smem, pe_smem.index(buf).permute((1, 0)), s_tok, is_async=True)
        acc = warpgroup_mma_wait(num_outstanding=2, deps=(acc,))  # this warpgroup's P V of tile it - 1 is done
        if not EARLY_COPY:
            gl.thread_barrier()  # both warpgroups': P and the buffer of tile it - 1 are free
            _issue_slots(KV, kv_smem.index((it + STAGES - 1) % STAGES), pe_smem.index((it + STAGES - 1) % STAGES),
                         nx_slot, nx_slot_pe, nx_pos < end, nx_pos_pe < end, stride_kv, D_NOPE, D_PE, LD, LD_PE)
            async_copy.commit_group()  # empty past the split's end: the wait above counts one group per tile
            nx_pos = nx_pos + BLOCK_N
            nx_pos_pe = nx_pos_pe + BLOCK_N
            nx_slot = gl.load(TOKEN_TABLE + nx_pos, mask=nx_pos < end, other=0).to(gl.int64)
            nx_slot_pe = gl.load(TOKEN_TABLE + nx_pos_pe, mask=nx_pos_pe < end, other=0).to(gl.int64)
        s = warpgroup_mma_wait(num_outstanding=0, deps=(s_tok,))
        kpos = start + it * BLOCK_N + gl.arange(0, BLOCK_N, layout=COL_S)
        j = kpos - n_prefix
        tree = gl.load(MASK + draft_row[:, None] * n_draft + j[None, :],
                       mask=(rows_s < n_rows)[:, None] & (kpos < end)[None, :] & (j >= 0)[None, :], other=0)
        visible = (kpos < end)[None, :] & ((kpos < n_prefix)[None, :] | (tree != 0))
        s = gl.where(visible, s * qk_scale, float("-inf"))
        m_new = gl.maximum(m_i, gl.max(s, 1))
        m_use = gl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = gl.exp2(m_i - m_use)
        p = gl.exp2(s - m_use[:, None])
        l_i = l_i * alpha + gl.sum(p, 1)
        m_i = m_new
        p_smem.store(p.to(dtype))
        fence_async_shared()
        gl.thread_barrier()  # P complete (both warpgroups' halves) before either reads it
        acc = acc * gl.convert_layout(alpha, ROW_O)[:, None]
        acc = warpgroup_mma(p_smem, k_tile.slice(0, D_NOPE, dim=1), acc, is_async=True)
        if not PV_ACROSS:
            acc = warpgroup_mma_init(warpgroup_mma_wait(num_outstanding=0, deps=(acc,)))
    acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
    async_copy.wait_group(0)

    l_o = gl.convert_layout(l_i, ROW_O)
    o = acc / gl.where(l_o > 0, l_o, 1.0)[:, None]
    rows_o = pid_m * BLOCK_M + gl.arange(0, BLOCK_M, layout=ROW_O)
    offs_v = gl.arange(0, D_NOPE, layout=gl.SliceLayout(0, O_L))
    part_row = pid_s.to(gl.int64) * n_rows + rows_o
    gl.store(O_PART + part_row[:, None] * D_NOPE + offs_v[None, :], o, mask=(rows_o < n_rows)[:, None])
    lse = gl.where(l_i > 0, m_i + gl.log2(gl.where(l_i > 0, l_i, 1.0)), float("-inf"))
    gl.store(LSE_PART + pid_s.to(gl.int64) * n_rows + rows_s, lse, mask=rows_s < n_rows)


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


def split_kv_gluon(inputs: VerifyInputs, out: torch.Tensor, block_n: int = 64, stages: int = 2,
                   num_sms: int | None = None, pv_across: bool = False, early_copy: bool = False) -> torch.Tensor:
    """Split-KV verify attention with the Gluon partial kernel and triton_splitkv's merge; writes ``out`` [T, H, 512]."""
    from specdiag.kernels.triton_splitkv import merge_partials, sm_count  # noqa: PLC0415

    check_gluon_inputs(inputs, "split_kv_gluon")
    if early_copy and pv_across:
        raise ValueError("early_copy needs pv_across=False (each P V waited for in its own iteration)")
    q, cache = inputs.q, inputs.cache
    T, H = inputs.draft_tokens, inputs.heads
    rows, n_kv = T * H, inputs.n_kv
    cfg = gluon_config(block_n, stages)
    plan = plan_splits(rows, n_kv, cfg, num_sms or sm_count(q.device.index or 0))
    o_part = torch.empty(plan.n_splits, rows, D_V, device=q.device, dtype=torch.float32)
    lse_part = torch.empty(plan.n_splits, rows, device=q.device, dtype=torch.float32)
    _gl_partial_kernel[(plan.n_tiles, plan.n_splits)](
        q, cache, inputs.token_table, inputs.mask_u8, o_part, lse_part,
        inputs.sm_scale * LOG2E, inputs.n_prefix, n_kv, T, H, rows, plan.tokens_per_split, cache.stride(0),
        BLOCK_M=GLUON_BLOCK_M, BLOCK_N=block_n, STAGES=stages, D_NOPE=D_NOPE, D_PE=D_PE,
        num_warps=GLUON_NUM_WARPS, PV_ACROSS=pv_across, EARLY_COPY=early_copy,
    )
    merge_partials(o_part, lse_part, out.view(rows, D_V), cfg)
    return out


def compile_sm90(block_n: int = 64, stages: int = 2, dtype: str = "bf16", pv_across: bool = False,
                 early_copy: bool = False) -> "triton.compiler.CompiledKernel":
    """The partial kernel compiled ahead of time for sm_90 (no GPU needed): for tests and the compile report."""
    from triton.backends.compiler import GPUTarget  # noqa: PLC0415
    from triton.experimental.gluon._runtime import GluonASTSource  # noqa: PLC0415

    sig = {"Q": f"*{dtype}", "KV": f"*{dtype}", "TOKEN_TABLE": "*i64", "MASK": "*u8", "O_PART": "*fp32",
           "LSE_PART": "*fp32", "qk_scale": "fp32", "n_prefix": "i32", "n_kv": "i32", "n_draft": "i32",
           "n_heads": "i32", "n_rows": "i32", "tokens_per_split": "i32", "stride_kv": "i32"}
    const = {"BLOCK_M": GLUON_BLOCK_M, "BLOCK_N": block_n, "STAGES": stages, "D_NOPE": D_NOPE, "D_PE": D_PE,
             "num_warps": GLUON_NUM_WARPS, "PV_ACROSS": pv_across, "EARLY_COPY": early_copy}
    sig.update({k: "constexpr" for k in const})
    attrs = {(i,): [["tt.divisibility", 16]] for i, k in enumerate(sig) if k in ("Q", "KV", "TOKEN_TABLE", "O_PART",
                                                                                 "LSE_PART", "stride_kv")}
    return triton.compile(GluonASTSource(_gl_partial_kernel, sig, const, attrs), target=GPUTarget("cuda", 90, 32),
                          options={"num_warps": GLUON_NUM_WARPS})
