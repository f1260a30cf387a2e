"""The baseline: SGLang's CUDA verify-attention structure for MLA, in Triton (the kernel A/B's ``baseline`` arm).

Structure (from SGLang's ``extend_attention_fwd``):
one program per (head, block of 32 draft tokens), grid ``(H, cdiv(T, 32))``; each program walks the
whole prefix serially in 64-token tiles through a page_size 1 token index table (stage 1: no mask),
then the draft block under the tree mask (stage 2). For Lq = 576 SGLang splits the query into 512
"nope" + 64 rope dims (BLOCK_DMODEL 512, BLOCK_DPE 64), loads K transposed, loads V separately from
the same buffer, and launches with BLOCK_M 32, BLOCK_N 64, num_warps 8, num_stages 1 on Hopper.

Nothing here is slowed on purpose: the loop body is the usual flash-attention step. The pathology
is the grid: at batch 1 it has H (or 2H) programs for 132 SMs, every program re-reads the same
shared latent rows, and each one has only its own serial chain of dependent loads in flight.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from specdiag.kernels.mla import D_NOPE, D_PE, D_QK, D_V, VerifyInputs

#: SGLang's launch parameters for Lq = 576 on compute capability 9.x (see module docstring)
BLOCK_M = 32
BLOCK_N = 64
NUM_WARPS = 8
NUM_STAGES = 1


@triton.jit
def _baseline_verify_kernel(
    Q, KV, TOKEN_TABLE, MASK, OUT,
    sm_scale, n_prefix, n_draft,
    stride_qt, stride_qh, stride_kv, stride_ot, stride_oh,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    D_NOPE: tl.constexpr, D_PE: tl.constexpr, D_V: tl.constexpr,
):
    head = tl.program_id(0)
    block_m = tl.program_id(1)
    offs_m = block_m * BLOCK_M + tl.arange(0, BLOCK_M)  # draft token of each query row
    mask_m = offs_m < n_draft
    offs_d = tl.arange(0, D_NOPE)
    offs_dpe = D_NOPE + tl.arange(0, D_PE)
    offs_dv = tl.arange(0, D_V)
    offs_n = tl.arange(0, BLOCK_N)

    q_base = Q + offs_m[:, None] * stride_qt + head * stride_qh
    q = tl.load(q_base + offs_d[None, :], mask=mask_m[:, None], other=0.0)
    qpe = tl.load(q_base + offs_dpe[None, :], mask=mask_m[:, None], other=0.0)

    acc = tl.zeros([BLOCK_M, D_V], dtype=tl.float32)
    deno = tl.zeros([BLOCK_M], dtype=tl.float32)
    e_max = tl.zeros([BLOCK_M], dtype=tl.float32) - float("inf")

    # stage 1: the whole prefix, one 64-token tile after another, through the token index table
    for start_n in range(0, n_prefix, BLOCK_N):
        start_n = tl.multiple_of(start_n, BLOCK_N)
        mask_n = (start_n + offs_n) < n_prefix
        slot = tl.load(TOKEN_TABLE + start_n + offs_n, mask=mask_n, other=0)
        k = tl.load(KV + slot[None, :] * stride_kv + offs_d[:, None], mask=mask_n[None, :], other=0.0)
        qk = tl.dot(q, k)
        kpe = tl.load(KV + slot[None, :] * stride_kv + offs_dpe[:, None], mask=mask_n[None, :], other=0.0)
        qk += tl.dot(qpe, kpe)
        qk *= sm_scale
        qk = tl.where(mask_m[:, None] & mask_n[None, :], qk, float("-inf"))
        n_e_max = tl.maximum(tl.max(qk, 1), e_max)
        re_scale = tl.exp(e_max - n_e_max)
        p = tl.exp(qk - n_e_max[:, None])
        deno = deno * re_scale + tl.sum(p, 1)
        v = tl.load(KV + slot[:, None] * stride_kv + offs_dv[None, :], mask=mask_n[:, None], other=0.0)
        acc = acc * re_scale[:, None] + tl.dot(p.to(v.dtype), v)
        e_max = n_e_max

    # stage 2: the draft block, under the tree mask
    for start_n in range(0, n_draft, BLOCK_N):
        offs_j = start_n + offs_n  # draft token index of each key
        mask_n = offs_j < n_draft
        slot = tl.load(TOKEN_TABLE + n_prefix + offs_j, mask=mask_n, other=0)
        k = tl.load(KV + slot[None, :] * stride_kv + offs_d[:, None], mask=mask_n[None, :], other=0.0)
        qk = tl.dot(q, k)
        kpe = tl.load(KV + slot[None, :] * stride_kv + offs_dpe[:, None], mask=mask_n[None, :], other=0.0)
        qk += tl.dot(qpe, kpe)
        qk *= sm_scale
        tree = tl.load(MASK + offs_m[:, None] * n_draft + offs_j[None, :],
                       mask=mask_m[:, None] & mask_n[None, :], other=0)
        qk = tl.where(tree != 0, qk, float("-inf"))
        n_e_max = tl.maximum(tl.max(qk, 1), e_max)
        re_scale = tl.exp(e_max - n_e_max)
        p = tl.exp(qk - n_e_max[:, None])
        deno = deno * re_scale + tl.sum(p, 1)
        v = tl.load(KV + slot[:, None] * stride_kv + offs_dv[None, :], mask=mask_n[:, None], other=0.0)
        acc = acc * re_scale[:, None] + tl.dot(p.to(v.dtype), v)
        e_max = n_e_max

    o_ptrs = OUT + offs_m[:, None] * stride_ot + head * stride_oh + offs_dv[None, :]
    tl.store(o_ptrs, (acc / deno[:, None]).to(OUT.dtype.element_ty), mask=mask_m[:, None])


def baseline_triton(inputs: VerifyInputs, out: torch.Tensor) -> torch.Tensor:
    """Run the baseline on CUDA; writes ``out`` [T, H, 512] bf16 and returns it."""
    q, cache = inputs.q, inputs.cache
    if q.shape[-1] != D_QK or cache.shape[-1] != D_QK:
        raise ValueError(f"baseline expects 576-wide MLA rows; got q {tuple(q.shape)}, cache {tuple(cache.shape)}")
    T, H = inputs.draft_tokens, inputs.heads
    grid = (H, triton.cdiv(T, BLOCK_M))
    _baseline_verify_kernel[grid](
        q, cache, inputs.token_table, inputs.mask_u8, out,
        inputs.sm_scale, inputs.n_prefix, T,
        q.stride(0), q.stride(1), cache.stride(0), out.stride(0), out.stride(1),
        BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, D_NOPE=D_NOPE, D_PE=D_PE, D_V=D_V,
        num_warps=NUM_WARPS, num_stages=NUM_STAGES,
    )
    return out
