"""The split-KV verify kernel on SGLang's ragged batch layout, safe inside a captured CUDA graph.

The SGLang plugin's fallback: it serves where the Gluon kernels (gluon.ragged) cannot run (another GPU than sm_90,
a logit cap, a non-contiguous q) or failed once, with a configuration from plan's ladder that fits the GPU's
shared memory. The kernel A/B's ``plugin_triton`` arm times it.

Same design as triton.splitkv (rows = draft tokens x heads packed into tiles, the KV cut into
splits, a partial output and base-2 log-sum-exp per split, an LSE merge), but every length is read
on the device, so one launch serves any context length and a CUDA graph captured at one length
replays correctly at another:

- Request b's draft queries are rows ``qo_indptr[b] .. qo_indptr[b+1]`` of ``q`` [tokens, H, 576];
  its prefix is ``kv_indices[kv_indptr[b] .. kv_indptr[b+1]]``, page_size 1 slots of the latent
  cache ``kv`` [slots, 1, 576] (values: its first 512 dims); its draft keys are rows ``qo_indptr[b] ..``
  of ``k_ext`` [tokens, 1, 576] (SGLang passes the draft block's K as a tensor, not through the index),
  and their values are those rows' first 512 dims too: what SGLang's MLA pool keeps of them
  (``MLATokenToKVPool.set_kv_buffer`` stores ``cache_k`` only; DeepSeek passes ``v = k_nope``, the
  first 512 dims of ``k``). One tile serves as keys and values, as in triton.splitkv: a form that
  loaded a separate value tile from ``v_ext`` took 1.5-1.7x the split kernel's time at one draft token
  on the H200 (its shared memory, 122,880 B at 16 x 32 tiles, left one program per SM).
- The verify tree's mask is SGLang's flattened custom mask: request b's row t starts at
  ``mask_indptr[b] + t * (P + T)``; its column ``P + j`` says whether draft token t sees draft token j.
  The prefix columns are not read (SGLang's ``skip_prefix_custom_mask``: the prefix is fully visible).
- The grid is fixed by the launch (row tiles x ``n_splits`` x batch); each program derives its token
  range from the request's length: ``per_split = roundup64(max(ceil(n_kv / n_splits), min_split))``,
  so short contexts use fewer splits and programs past the end return at once. The merge reads the
  same count (merge.ragged_merge); in one pass (the lse and the partials in one round trip) where the
  configuration says so, as the plugin's ladder does (plan.one_pass_merge_fields).
- mla.ragged_args lays one specdiag VerifyInputs out this way, so the kernel A/B (specdiag.steps.kernel_ab) times the
  plugin's kernels (the ``plugin``, ``plugin_fp8`` and ``plugin_triton`` arms) on the same cases as the others.
- Scores: ``s = (q . k) * sm_scale``, then ``cap * tanh(s / cap)`` when a logit cap is set (SGLang's
  definition, natural-log units), then the softmax in base 2.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from specdiag.kernels.merge import ragged_merge
from specdiag.kernels.mla import D_NOPE, D_PE, D_QK, D_V
from specdiag.kernels.plan import SHARED_LIMIT_SM90, SplitKVConfig, fitting_ladder, n_splits_for


@triton.jit
def _tanh(x):
    return 2 * tl.sigmoid(2 * x) - 1


@triton.jit
def _scores(q_nope, q_pe, k_nope, k_pe, sm_scale, logit_cap, LOGIT_CAP: tl.constexpr):
    s = tl.dot(q_nope, tl.trans(k_nope))
    s = tl.dot(q_pe, tl.trans(k_pe), s)
    if LOGIT_CAP:
        s = s * sm_scale
        s = logit_cap * _tanh(s / logit_cap)
        s = s * 1.4426950408889634
    else:
        s = s * (sm_scale * 1.4426950408889634)
    return s


@triton.jit
def _ragged_partial_kernel(
    Q, K_EXT, KV, QO_INDPTR, KV_INDPTR, KV_INDICES, MASK, MASK_INDPTR, O_PART, LSE_PART,
    sm_scale, logit_cap, n_heads, n_splits, max_rows, min_split_tokens,
    stride_q_tok, stride_q_head, stride_kext, stride_kv,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, D_NOPE: tl.constexpr, D_PE: tl.constexpr,
    LOGIT_CAP: tl.constexpr, ROUND: tl.constexpr,
):
    pid_m = tl.program_id(0)
    pid_s = tl.program_id(1)
    b = tl.program_id(2)
    q_start = tl.load(QO_INDPTR + b)
    n_draft = tl.load(QO_INDPTR + b + 1) - q_start
    kv_start = tl.load(KV_INDPTR + b).to(tl.int64)
    n_prefix = (tl.load(KV_INDPTR + b + 1) - kv_start).to(tl.int32)
    n_kv = n_prefix + n_draft
    per_split = tl.maximum(tl.cdiv(n_kv, n_splits), min_split_tokens)
    per_split = tl.cdiv(per_split, ROUND) * ROUND
    start = pid_s * per_split
    if start >= n_kv:
        return
    end = tl.minimum(start + per_split, n_kv)
    n_rows = n_draft * n_heads

    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = rows < n_rows
    t = rows // n_heads
    h = rows % n_heads
    offs_d = tl.arange(0, D_NOPE)
    offs_pe = D_NOPE + tl.arange(0, D_PE)
    offs_n = tl.arange(0, BLOCK_N)
    q_row = Q + (q_start + t)[:, None].to(tl.int64) * stride_q_tok + h[:, None] * stride_q_head
    q_nope = tl.load(q_row + offs_d[None, :], mask=row_ok[:, None], other=0.0)
    q_pe = tl.load(q_row + offs_pe[None, :], mask=row_ok[:, None], other=0.0)

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, D_NOPE], tl.float32)

    # full prefix tiles: every key visible, no bounds checks
    n_full = tl.maximum(tl.minimum(end, n_prefix) - start, 0) // BLOCK_N
    for it in range(0, n_full):
        tile = start + it * BLOCK_N
        slot = tl.load(KV_INDICES + kv_start + tile + offs_n)
        kv_row = KV + slot[:, None].to(tl.int64) * stride_kv
        k_nope = tl.load(kv_row + offs_d[None, :])
        k_pe = tl.load(kv_row + offs_pe[None, :])
        s = _scores(q_nope, q_pe, k_nope, k_pe, sm_scale, logit_cap, LOGIT_CAP)
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None]
        acc = tl.dot(p.to(k_nope.dtype), k_nope, acc)
        m_i = m_new

    # the rest: a partial prefix tile and the draft block (K/V from the extend tensors), tree-masked
    mask_row = MASK + tl.load(MASK_INDPTR + b).to(tl.int64) + t.to(tl.int64) * n_kv + n_prefix
    for tile in range(start + n_full * BLOCK_N, end, BLOCK_N):
        pos = tile + offs_n
        ok = pos < end
        in_prefix = ok & (pos < n_prefix)
        j = pos - n_prefix
        in_draft = ok & (j >= 0)
        slot = tl.load(KV_INDICES + kv_start + pos, mask=in_prefix, other=0)
        ext = (q_start + tl.maximum(j, 0)).to(tl.int64)
        # a prefix row from the cache, a draft row from the extend tensor: one load through selected pointers
        row = tl.where(in_prefix, KV + slot.to(tl.int64) * stride_kv, K_EXT + ext * stride_kext)
        k_nope = tl.load(row[:, None] + offs_d[None, :], mask=ok[:, None], other=0.0)
        k_pe = tl.load(row[:, None] + offs_pe[None, :], mask=ok[:, None], other=0.0)
        s = _scores(q_nope, q_pe, k_nope, k_pe, sm_scale, logit_cap, LOGIT_CAP)
        tree = tl.load(mask_row[:, None] + j[None, :], mask=row_ok[:, None] & in_draft[None, :], other=0)
        visible = in_prefix[None, :] | (in_draft[None, :] & (tree != 0))
        s = tl.where(visible, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp2(m_i - m_use)
        p = tl.exp2(s - m_use[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None]
        acc = tl.dot(p.to(k_nope.dtype), k_nope, acc)  # values: the first 512 latent dims, prefix and draft alike
        m_i = m_new

    l_safe = tl.where(l_i > 0, l_i, 1.0)
    part_row = (b * n_splits + pid_s).to(tl.int64) * max_rows + rows
    tl.store(O_PART + part_row[:, None] * D_NOPE + offs_d[None, :], acc / l_safe[:, None], mask=row_ok[:, None])
    lse = tl.where(l_i > 0, m_i + tl.log2(l_safe), float("-inf"))
    tl.store(LSE_PART + part_row, lse, mask=row_ok)


def shared_limit(device: torch.device) -> int:
    """Shared memory per block (opt-in) of ``device`` in bytes, as torch reports it (else the H200's)."""
    props = torch.cuda.get_device_properties(device)
    return int(getattr(props, "shared_memory_per_block_optin", 0) or SHARED_LIMIT_SM90)


def ragged_default_config(rows: int, device: torch.device, elem_bytes: int = 2) -> SplitKVConfig:
    """The fastest rung of the ladder whose estimated shared memory fits ``device`` (plan)."""
    return fitting_ladder(rows, shared_limit(device), elem_bytes)[0]


def ragged_split_kv_triton(q: torch.Tensor, k_ext: torch.Tensor, kv: torch.Tensor, o: torch.Tensor, qo_indptr: torch.Tensor, kv_indptr: torch.Tensor,
                           kv_indices: torch.Tensor, mask: torch.Tensor, mask_indptr: torch.Tensor,
                           max_draft: int, sm_scale: float, logit_cap: float = 0.0,
                           cfg: SplitKVConfig | None = None, num_sms: int | None = None) -> torch.Tensor:
    """Verify attention for a batch in SGLang's layout; writes ``o`` [tokens, H, 512] and returns it.

    ``q`` [tokens, H, 576]; ``k_ext`` [tokens, 576] or [tokens, 1, 576], the draft tokens' latent rows (their
    values: the first 512 dims, as the MLA pool stores them; module doc); ``kv`` [slots, (1,) 576] the latent
    cache of this layer; ``mask`` the flattened custom mask (bool or
    uint8); ``max_draft`` the most draft tokens of any request (sets the row tiles; SGLang's
    ``max_extend_len``). No host synchronisation: safe under CUDA-graph capture.
    """
    if q.dim() != 3 or q.shape[-1] != D_QK or q.stride(-1) != 1:
        raise ValueError(f"q must be [tokens, heads, {D_QK}] with unit inner stride; got {tuple(q.shape)}")
    k2 = k_ext.reshape(k_ext.shape[0], -1)
    kv2 = kv.reshape(kv.shape[0], -1)
    if k2.shape[1] != D_QK or kv2.shape[1] != D_QK:
        raise ValueError("k_ext and kv rows must hold 576 values (one MLA latent head: 512 latent + 64 rope)")
    if k2.stride(1) != 1 or kv2.stride(1) != 1:
        raise ValueError("k_ext and kv need unit inner stride")
    if o.dim() != 3 or o.shape[-1] != D_V or o.stride(-1) != 1:
        raise ValueError(f"o must be [tokens, heads, {D_V}] with unit inner stride; got {tuple(o.shape)}")
    heads = q.shape[1]
    batch = qo_indptr.shape[0] - 1
    max_rows = max_draft * heads
    cfg = cfg or ragged_default_config(max_rows, q.device, q.element_size())
    if num_sms is None:
        num_sms = torch.cuda.get_device_properties(q.device).multi_processor_count
    n_splits = n_splits_for(max_rows, batch, num_sms, cfg)
    n_tiles = -(-max_rows // cfg.block_m)
    mask_u8 = mask.view(torch.uint8) if mask.dtype == torch.bool else mask
    o_part = torch.empty(batch, n_splits, max_rows, D_V, device=q.device, dtype=torch.float32)
    lse_part = torch.empty(batch, n_splits, max_rows, device=q.device, dtype=torch.float32)
    _ragged_partial_kernel[(n_tiles, n_splits, batch)](
        q, k2, kv2, qo_indptr, kv_indptr, kv_indices, mask_u8, mask_indptr, o_part, lse_part,
        float(sm_scale), float(logit_cap) if logit_cap else 1.0, heads, n_splits, max_rows, cfg.min_split_tokens,
        q.stride(0), q.stride(1), k2.stride(0), kv2.stride(0),
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, D_NOPE=D_NOPE, D_PE=D_PE,
        LOGIT_CAP=bool(logit_cap and logit_cap > 0), ROUND=cfg.split_round_tokens,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )
    return ragged_merge(o_part, lse_part, o, qo_indptr, kv_indptr, cfg)
