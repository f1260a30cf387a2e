"""Split-KV MLA verify attention in Triton: the whole GPU on one request.

The kernel A/B's ``split_triton`` (token table) and ``split_triton_b64`` (64-token pages) arms run it with
``default_config``; its merge launch (merge.merge_partials) is the dense Gluon kernels' too. The plugin's Triton
fallback is the same design on SGLang's layout (triton.ragged).

Design (FlashMLA and FlashInfer split the same way):

- Rows: the H x T query rows of the request are packed into tiles of ``block_m`` rows (row
  r = t*H + h), so every KV tile loaded is used by all the heads and draft tokens of the tile at once:
  a KV byte is read from DRAM once per row tile, not once per head.
- Splits: the n_kv = P + T cache rows are cut into ``n_splits`` contiguous chunks of
  ``tokens_per_split`` tokens (a multiple of 64), chosen so that tiles x splits is about
  ``programs_per_sm`` x the SM count. Grid ``(n_tiles, n_splits)``, tiles fastest, so programs
  that run together read the same KV chunk (L2 reuse when there are several row tiles).
- Loop: per 64- or 32-token KV tile, S = Q_nope K_nope^T + Q_pe K_pe^T (tensor cores, fp32 acc),
  online softmax in base 2, acc += P V with V the K_nope tile already loaded (the 512 value dims
  are the first 512 latent dims: no second load). Full prefix tiles run unmasked; the last partial
  tile and the draft block run in a second, masked loop (tree mask on draft x draft).
- Indexing: page_size 1 reads a token index table (one int64 per row, prefetched by the pipeline
  like the rows); page_size 64 reads one int32 block id per tile and the rows are contiguous.
- Merge: each split writes its normalized partial output (fp32) and its base-2 log-sum-exp; a second kernel with one
  program per (row, 64 value dims) weights the partials by exp2(lse - max lse). With a single split the first kernel
  writes the output directly.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from specdiag.kernels.merge import merge_partials
from specdiag.kernels.mla import BLOCK_TOKENS, D_NOPE, D_PE, D_QK, D_V, LOG2E, VerifyInputs
from specdiag.kernels.plan import SplitKVConfig, default_config, plan_splits, sm_count


@triton.jit
def _split_partial_kernel(
    Q, KV, TOKEN_TABLE, BLOCK_TABLE, MASK, O_PART, LSE_PART,
    qk_scale, n_prefix, n_kv, n_draft, n_heads, n_rows, tokens_per_split, stride_kv,
    PAGE_SIZE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    D_NOPE: tl.constexpr, D_PE: tl.constexpr, DIRECT: tl.constexpr,
):
    pid_m = tl.program_id(0)  # row tile
    pid_s = tl.program_id(1)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = rows < n_rows
    offs_d = tl.arange(0, D_NOPE)
    offs_pe = D_NOPE + tl.arange(0, D_PE)
    offs_n = tl.arange(0, BLOCK_N)
    q_row = Q + rows[:, None].to(tl.int64) * (D_NOPE + D_PE)
    q_nope = tl.load(q_row + offs_d[None, :], mask=row_ok[:, None], other=0.0)
    q_pe = tl.load(q_row + offs_pe[None, :], mask=row_ok[:, None], other=0.0)

    start = pid_s * tokens_per_split
    end = tl.minimum(start + tokens_per_split, n_kv)
    n_full = tl.maximum(tl.minimum(end, n_prefix) - start, 0) // BLOCK_N

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, D_NOPE], tl.float32)

    # full prefix tiles: every key visible, no bounds checks
    for it in range(0, n_full):
        tile = start + it * BLOCK_N
        if PAGE_SIZE == 1:
            slot = tl.load(TOKEN_TABLE + tile + offs_n)
        else:
            blk = tl.load(BLOCK_TABLE + tile // PAGE_SIZE)
            slot = blk.to(tl.int64) * PAGE_SIZE + (tile % PAGE_SIZE) + offs_n
        kv_row = KV + slot[:, None].to(tl.int64) * stride_kv
        k_nope = tl.load(kv_row + offs_d[None, :])
        k_pe = tl.load(kv_row + offs_pe[None, :])
        s = tl.dot(q_nope, tl.trans(k_nope))
        s = tl.dot(q_pe, tl.trans(k_pe), s)
        s = s * qk_scale
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None]
        acc = tl.dot(p.to(k_nope.dtype), k_nope, acc)
        m_i = m_new

    # the rest: a partial prefix tile and the draft block, bounds-checked and tree-masked
    draft_row = rows // n_heads
    for tile in range(start + n_full * BLOCK_N, end, BLOCK_N):
        pos = tile + offs_n
        ok = pos < end
        if PAGE_SIZE == 1:
            slot = tl.load(TOKEN_TABLE + pos, mask=ok, other=0)
        else:
            blk = tl.load(BLOCK_TABLE + pos // PAGE_SIZE, mask=ok, other=0)
            slot = blk.to(tl.int64) * PAGE_SIZE + pos % PAGE_SIZE
        kv_row = KV + slot[:, None].to(tl.int64) * stride_kv
        k_nope = tl.load(kv_row + offs_d[None, :], mask=ok[:, None], other=0.0)
        k_pe = tl.load(kv_row + offs_pe[None, :], mask=ok[:, None], other=0.0)
        s = tl.dot(q_nope, tl.trans(k_nope))
        s = tl.dot(q_pe, tl.trans(k_pe), s)
        j = pos - n_prefix
        tree = tl.load(MASK + draft_row[:, None] * n_draft + j[None, :],
                       mask=row_ok[:, None] & ok[None, :] & (j[None, :] >= 0), other=0)
        visible = ok[None, :] & ((pos[None, :] < n_prefix) | (tree != 0))
        s = tl.where(visible, s * qk_scale, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp2(m_i - m_use)
        p = tl.exp2(s - m_use[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None]
        acc = tl.dot(p.to(k_nope.dtype), k_nope, acc)
        m_i = m_new

    l_safe = tl.where(l_i > 0, l_i, 1.0)
    o = acc / l_safe[:, None]
    part_row = pid_s.to(tl.int64) * n_rows + rows
    tl.store(O_PART + part_row[:, None] * D_NOPE + offs_d[None, :], o.to(O_PART.dtype.element_ty),
             mask=row_ok[:, None])
    if not DIRECT:
        lse = tl.where(l_i > 0, m_i + tl.log2(l_safe), float("-inf"))
        tl.store(LSE_PART + part_row, lse, mask=row_ok)


def split_kv_triton(inputs: VerifyInputs, out: torch.Tensor, page_size: int = 1,
                    cfg: SplitKVConfig | None = None, num_sms: int | None = None) -> torch.Tensor:
    """Run split-KV verify attention on CUDA; writes ``out`` [T, H, 512] bf16 and returns it.

    page_size 1 reads ``inputs.token_table``; page_size 64 reads ``inputs.block_table``; ``cfg.pdl`` launches the
    merge as a programmatic dependent launch.
    """
    q, cache = inputs.q, inputs.cache
    if not (q.is_contiguous() and q.shape[-1] == D_QK and cache.shape[-1] == D_QK and cache.stride(1) == 1):
        raise ValueError("split_kv_triton needs contiguous q [T, H, 576] and cache rows [pool, 576]")
    if not out.is_contiguous():
        raise ValueError("split_kv_triton needs a contiguous out [T, H, 512]")
    T, H = inputs.draft_tokens, inputs.heads
    rows, n_kv = T * H, inputs.n_kv
    cfg = cfg or default_config(rows)
    if page_size == BLOCK_TOKENS:
        if inputs.block_table is None:
            raise ValueError("page_size 64 needs a block table: this layout (shuffled_p1) has none; use page_size 1")
        if BLOCK_TOKENS % cfg.block_n:
            raise ValueError(f"block_n {cfg.block_n} must divide the 64-token page")
        if cfg.split_round_tokens % BLOCK_TOKENS:
            raise ValueError(f"split_round_tokens {cfg.split_round_tokens} would start a split inside a 64-token page; "
                             "the block table needs splits of whole pages: use a multiple of 64")
        block_table = inputs.block_table
    elif page_size == 1:
        block_table = inputs.token_table  # unused by the kernel
    else:
        raise ValueError(f"page_size must be 1 or {BLOCK_TOKENS}; got {page_size}")
    plan = plan_splits(rows, n_kv, cfg, num_sms or sm_count(q.device.index or 0))
    direct = plan.n_splits == 1
    if direct:
        o_part, lse_part = out, out  # lse_part unused when DIRECT
    else:
        o_part = torch.empty(plan.n_splits, rows, D_V, device=q.device, dtype=torch.float32)
        lse_part = torch.empty(plan.n_splits, rows, device=q.device, dtype=torch.float32)
    _split_partial_kernel[(plan.n_tiles, plan.n_splits)](
        q, cache, inputs.token_table, block_table, inputs.mask_u8, o_part, lse_part,
        inputs.sm_scale * LOG2E, inputs.n_prefix, n_kv, T, H, rows, plan.tokens_per_split, cache.stride(0),
        PAGE_SIZE=page_size, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, D_NOPE=D_NOPE, D_PE=D_PE, DIRECT=direct,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )
    if not direct:
        merge_partials(o_part, lse_part, out, cfg, pdl=cfg.pdl)
    return out
