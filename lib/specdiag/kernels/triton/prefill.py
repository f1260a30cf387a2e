"""Ragged flash-attention forward in Triton: the MHA form of an MLA prefill (SGLang's chunked-prefix path).

What SGLang's DeepSeek attention asks a backend for when it runs a long prompt in the MHA form
(``forward_normal_chunked_kv``; ``models/deepseek_common/attention_forward_methods/forward_mha.py``): per request,
``q`` [n_q, H, 192] (128 nope + 64 rope dims) against ``k`` [n_k, H, 192] and ``v`` [n_k, H, 128], ragged over the
batch by ``cu_q`` / ``cu_k``, causal inside the chunk (bottom-right aligned: key j is visible to query i when
j <= i + n_k - n_q) or no mask (a prefix chunk), and the log-sum-exp returned so SGLang's own ``merge_state_v2``
joins the parts: natural log, [n_q, H] float32, -inf for a query that sees no key (its output rows are 0).

Design (FlashAttention-2's forward, which FlashInfer's and FA3's ragged prefill also follow):

- Grid ``(query tiles, heads, requests)``: one program owns ``block_m`` query rows of one head; K and V stream
  through in ``block_n``-key tiles with an online softmax in base 2 (scores scaled by sm_scale x log2 e).
- The 192 q-k dims are two dot products, 128 + 64 (powers of two, no padding to 256); the 128 value dims one.
- Tiles wholly visible run unmasked; only the last partial tile and, when causal, the diagonal tiles are masked.
- Strided inputs are read in place: SGLang's ``v`` is a view into ``kv_b_proj``'s output (row stride H x 256).
- Two loaders (:class:`PrefillConfig` ``tma``): pointer loads that Triton pipelines as ``cp.async`` copies, or q, k
  and v tiles through TMA descriptors over the 2-D views [tokens, heads x width] (sm_90+; rows past a request's keys
  are masked as in the pointer form). Both share the tile's online softmax, the key bounds and the epilogue.
  ``scripts/kernel_ptx_hashes.py --ptxas prefill`` prints each one's registers, spills and shared memory on sm_90.
  06's prefill cases time each loader; the default stays the one they measured fastest.

:func:`prefill_triton` launches it with a :class:`PrefillConfig`; ``specdiag.kernels.prefill`` is the entry point
that the plugin and the kernel A/B call.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Optional

import torch
import triton
import triton.language as tl

LN2: float = 0.6931471805599453  #: ln 2: the kernel's base-2 log-sum-exp times this is the natural one
LOG2E: float = 1.4426950408889634  #: log2 e: scores are scaled by sm_scale x this so the softmax runs in base 2


@dataclass(frozen=True)
class PrefillConfig:
    block_m: int = 128  #: query rows per program
    block_n: int = 64  #: keys per tile
    num_warps: int = 8
    num_stages: int = 3
    tma: bool = False  #: q, k and v tiles loaded by TMA (host tensor descriptors; sm_90+), else by pointers

    def as_dict(self) -> dict:
        return asdict(self)

    @property
    def spec(self) -> str:
        """The configuration as ``parse_config`` reads it: ``block_m:block_n:warps:stages[:tma]``."""
        return ":".join([str(self.block_m), str(self.block_n), str(self.num_warps), str(self.num_stages)]
                        + ["tma"] * self.tma)


def parse_config(text: str) -> PrefillConfig:
    """``"128:128:8:2"`` or ``"128:128:8:2:tma"`` -> a PrefillConfig, with a clear error on bad input."""
    bits = [b.strip() for b in text.strip().split(":")]
    nums, flags = bits[:4], bits[4:]
    if len(nums) != 4 or not all(b.isdigit() and int(b) > 0 for b in nums) or flags not in ([], ["tma"]):
        raise ValueError(f"bad prefill configuration {text!r}: write block_m:block_n:warps:stages[:tma], e.g. "
                         "128:64:8:3 or 128:128:8:2:tma")
    block_m, block_n, warps, stages = (int(b) for b in nums)
    return PrefillConfig(block_m, block_n, warps, stages, tma=bool(flags))


#: the configuration the plugin runs on sm_90 (H100/H200) and elsewhere, chosen by 06's prefill cases
DEFAULT_CONFIG = PrefillConfig(block_m=128, block_n=128, num_warps=8, num_stages=2)


@triton.jit
def _softmax_tile(acc, m_i, l_i, s, v, keys, k_len, offs_m_k, qk_scale, MASK_KEYS: tl.constexpr,
                  CAUSAL_TILE: tl.constexpr):
    """One key tile's scores ``s`` into the online softmax: scaled to base 2, masked where asked, ``v`` accumulated."""
    s = s * qk_scale
    if MASK_KEYS:
        visible = (keys < k_len)[None, :]
        if CAUSAL_TILE:
            visible = visible & (keys[None, :] <= offs_m_k[:, None])
        s = tl.where(visible, s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.exp2(m_i - m_safe)
    p = tl.exp2(s - m_safe[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None]
    acc = tl.dot(p.to(v.dtype), v, acc)
    return acc, m_new, l_i


@triton.jit
def _key_bounds(pid_m, q_len, k_len, CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """(hi, full): this query tile reads keys [0, hi); tiles below ``full`` are wholly visible (bottom-right causal:
    query i sees keys j <= i + k_len - q_len)."""
    if CAUSAL:
        hi = tl.minimum(k_len, (pid_m + 1) * BLOCK_M + k_len - q_len)
        full = tl.maximum(tl.minimum(hi, pid_m * BLOCK_M + k_len - q_len + 1), 0) // BLOCK_N * BLOCK_N
    else:
        hi = k_len
        full = k_len // BLOCK_N * BLOCK_N
    return tl.maximum(hi, 0), full


@triton.jit
def _store_rows(acc, m_i, l_i, O, LSE, q_start, offs_m, offs_dv, row_ok, head, stride_ot, stride_oh, stride_lt,
                stride_lh, RETURN_LSE: tl.constexpr):
    """The normalized output rows and, where asked, their natural log-sum-exp (-inf and zeros for a row with no key)."""
    seen = l_i > 0.0
    l_safe = tl.where(seen, l_i, 1.0)
    out = acc / l_safe[:, None]
    o_rows = O + (q_start + offs_m)[:, None].to(tl.int64) * stride_ot + head * stride_oh
    tl.store(o_rows + offs_dv[None, :], out.to(O.dtype.element_ty), mask=row_ok[:, None])
    if RETURN_LSE:
        lse = tl.where(seen, (m_i + tl.log2(l_safe)) * 0.6931471805599453, float("-inf"))
        tl.store(LSE + (q_start + offs_m).to(tl.int64) * stride_lt + head * stride_lh, lse, mask=row_ok)


@triton.jit
def _tile(acc, m_i, l_i, q1, q2, K, V, start_n, k_len, offs_m_k, offs_n, offs_d1, offs_d2, offs_dv,
          stride_kt, stride_vt, qk_scale, MASK_KEYS: tl.constexpr, CAUSAL_TILE: tl.constexpr, D1: tl.constexpr):
    keys = start_n + offs_n
    if MASK_KEYS:
        key_ok = keys < k_len
        k1 = tl.load(K + keys[None, :].to(tl.int64) * stride_kt + offs_d1[:, None], mask=key_ok[None, :], other=0.0)
        k2 = tl.load(K + keys[None, :].to(tl.int64) * stride_kt + (D1 + offs_d2)[:, None], mask=key_ok[None, :],
                     other=0.0)
        v = tl.load(V + keys[:, None].to(tl.int64) * stride_vt + offs_dv[None, :], mask=key_ok[:, None], other=0.0)
    else:
        k1 = tl.load(K + keys[None, :].to(tl.int64) * stride_kt + offs_d1[:, None])
        k2 = tl.load(K + keys[None, :].to(tl.int64) * stride_kt + (D1 + offs_d2)[:, None])
        v = tl.load(V + keys[:, None].to(tl.int64) * stride_vt + offs_dv[None, :])
    s = tl.dot(q1, k1)
    s = tl.dot(q2, k2, s)
    return _softmax_tile(acc, m_i, l_i, s, v, keys, k_len, offs_m_k, qk_scale, MASK_KEYS, CAUSAL_TILE)


@triton.jit
def _prefill_fwd_kernel(
    Q, K, V, O, LSE, CU_Q, CU_K, qk_scale,
    stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh, stride_ot, stride_oh, stride_lt, stride_lh,
    CAUSAL: tl.constexpr, RETURN_LSE: tl.constexpr, D1: tl.constexpr, D2: tl.constexpr, DV: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):
    pid_m = tl.program_id(0)
    head = tl.program_id(1)
    req = tl.program_id(2)
    q_start = tl.load(CU_Q + req)
    q_len = tl.load(CU_Q + req + 1) - q_start
    if pid_m * BLOCK_M >= q_len:
        return
    k_start = tl.load(CU_K + req)
    k_len = tl.load(CU_K + req + 1) - k_start

    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d1 = tl.arange(0, D1)
    offs_d2 = tl.arange(0, D2)
    offs_dv = tl.arange(0, DV)
    row_ok = offs_m < q_len
    q_rows = Q + (q_start + offs_m)[:, None].to(tl.int64) * stride_qt + head * stride_qh
    q1 = tl.load(q_rows + offs_d1[None, :], mask=row_ok[:, None], other=0.0)
    q2 = tl.load(q_rows + (D1 + offs_d2)[None, :], mask=row_ok[:, None], other=0.0)
    K += k_start.to(tl.int64) * stride_kt + head * stride_kh
    V += k_start.to(tl.int64) * stride_vt + head * stride_vh

    offs_m_k = offs_m + (k_len - q_len)  # bottom-right causal: query i sees keys j <= i + k_len - q_len
    hi, full = _key_bounds(pid_m, q_len, k_len, CAUSAL, BLOCK_M, BLOCK_N)

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, DV], tl.float32)
    for start_n in range(0, full, BLOCK_N):
        acc, m_i, l_i = _tile(acc, m_i, l_i, q1, q2, K, V, start_n, k_len, offs_m_k, offs_n, offs_d1, offs_d2,
                              offs_dv, stride_kt, stride_vt, qk_scale, False, False, D1)
    for start_n in range(full, hi, BLOCK_N):
        acc, m_i, l_i = _tile(acc, m_i, l_i, q1, q2, K, V, start_n, k_len, offs_m_k, offs_n, offs_d1, offs_d2,
                              offs_dv, stride_kt, stride_vt, qk_scale, True, CAUSAL, D1)

    _store_rows(acc, m_i, l_i, O, LSE, q_start, offs_m, offs_dv, row_ok, head, stride_ot, stride_oh, stride_lt,
                stride_lh, RETURN_LSE)


@triton.jit
def _tile_tma(acc, m_i, l_i, q1, q2, desc_k1, desc_k2, desc_v, k_row, k_col, v_col, start_n, k_len, offs_m_k,
              offs_n, qk_scale, MASK_KEYS: tl.constexpr, CAUSAL_TILE: tl.constexpr, D1: tl.constexpr):
    # rows past this request's keys load the next request's (or TMA's zeros past the tensor): masked out below
    row = (k_row + start_n).to(tl.int32)  # a descriptor takes 32-bit offsets; SGLang's lengths are int64
    k1 = desc_k1.load([row, k_col])
    k2 = desc_k2.load([row, k_col + D1])
    v = desc_v.load([row, v_col])
    s = tl.dot(q1, k1.T)
    s = tl.dot(q2, k2.T, s)
    return _softmax_tile(acc, m_i, l_i, s, v, start_n + offs_n, k_len, offs_m_k, qk_scale, MASK_KEYS, CAUSAL_TILE)


@triton.jit
def _prefill_fwd_kernel_tma(
    desc_q1, desc_q2, desc_k1, desc_k2, desc_v, O, LSE, CU_Q, CU_K, qk_scale,
    stride_qh, stride_kh, stride_vh, stride_ot, stride_oh, stride_lt, stride_lh,
    CAUSAL: tl.constexpr, RETURN_LSE: tl.constexpr, D1: tl.constexpr, D2: tl.constexpr, DV: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):
    """The same attention as ``_prefill_fwd_kernel`` with q, k and v tiles loaded through TMA descriptors over the
    2-D views [tokens, heads x width] (a head's columns start at head x its stride)."""
    pid_m = tl.program_id(0)
    head = tl.program_id(1)
    req = tl.program_id(2)
    q_start = tl.load(CU_Q + req)
    q_len = tl.load(CU_Q + req + 1) - q_start
    if pid_m * BLOCK_M >= q_len:
        return
    k_start = tl.load(CU_K + req)
    k_len = tl.load(CU_K + req + 1) - k_start

    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_dv = tl.arange(0, DV)
    row_ok = offs_m < q_len
    # SGLang's cumulative lengths are int64; a descriptor takes 32-bit offsets (rows fit: a chunk's tokens)
    q_row = (q_start + pid_m * BLOCK_M).to(tl.int32)
    q1 = desc_q1.load([q_row, head * stride_qh])
    q2 = desc_q2.load([q_row, head * stride_qh + D1])
    k_col = head * stride_kh
    v_col = head * stride_vh

    offs_m_k = offs_m + (k_len - q_len)  # bottom-right causal: query i sees keys j <= i + k_len - q_len
    hi, full = _key_bounds(pid_m, q_len, k_len, CAUSAL, BLOCK_M, BLOCK_N)

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, DV], tl.float32)
    for start_n in range(0, full, BLOCK_N):
        acc, m_i, l_i = _tile_tma(acc, m_i, l_i, q1, q2, desc_k1, desc_k2, desc_v, k_start.to(tl.int32), k_col,
                                  v_col, start_n, k_len, offs_m_k, offs_n, qk_scale, False, False, D1)
    for start_n in range(full, hi, BLOCK_N):
        acc, m_i, l_i = _tile_tma(acc, m_i, l_i, q1, q2, desc_k1, desc_k2, desc_v, k_start.to(tl.int32), k_col,
                                  v_col, start_n, k_len, offs_m_k, offs_n, qk_scale, True, CAUSAL, D1)

    _store_rows(acc, m_i, l_i, O, LSE, q_start, offs_m, offs_dv, row_ok, head, stride_ot, stride_oh, stride_lt,
                stride_lh, RETURN_LSE)


def _descriptor(t: torch.Tensor, width: int, block_rows: int, block_cols: int):
    """A TMA descriptor over ``t`` [tokens, heads, >= width] seen as [tokens, columns up to the last head's
    ``width``], row stride ``t.stride(0)``; None where TMA cannot read it (alignment, or a head stride that is not the
    column step)."""
    from triton.tools.tensor_descriptor import TensorDescriptor  # noqa: PLC0415 - Triton 3.3+ only

    tokens, heads = t.shape[0], t.shape[1]
    elem = t.element_size()
    if tokens == 0 or t.data_ptr() % 16 or (t.stride(0) * elem) % 16 or (t.stride(1) * elem) % 16:
        return None
    cols = (heads - 1) * t.stride(1) + width
    if cols > t.stride(0) and tokens > 1:
        return None
    return TensorDescriptor(t, [tokens, cols], [t.stride(0), 1], [block_rows, block_cols])


def prefill_triton(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_q: torch.Tensor, cu_k: torch.Tensor,
                   max_q_len: int, causal: bool, sm_scale: float, out: Optional[torch.Tensor] = None,
                   lse: Optional[torch.Tensor] = None, return_lse: bool = False,
                   cfg: PrefillConfig = DEFAULT_CONFIG) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Attention of ``q`` [n_q, H, D1 + D2] over ``k`` [n_k, H, D1 + D2] and ``v`` [n_k, H, DV] (module doc).

    ``cu_q``/``cu_k`` [B + 1] int32 or int64 (SGLang's ``qo_indptr`` is int64) are the requests' offsets, ``max_q_len`` the longest request's queries (a host
    int: the grid). Returns ``out`` [n_q, H, DV] in q's dtype, and with ``return_lse`` the natural log-sum-exp
    [n_q, H] float32 too. The last dim of each input must be contiguous; other strides are read as given."""
    n_q, heads, d_qk = q.shape
    d_v = v.shape[-1]
    d1 = 1 << (d_qk.bit_length() - 1)  # 192 -> 128 + 64
    d2 = d_qk - d1
    if d2 == 0 or d2 & (d2 - 1):
        raise ValueError(f"q-k width {d_qk}: the kernel takes a power of two plus a smaller power of two (192)")
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.stride(-1) != 1:
            raise ValueError(f"{name}'s last dim is not contiguous (stride {t.stride(-1)})")
    if out is None:
        out = q.new_empty((n_q, heads, d_v))
    if return_lse and lse is None:
        lse = torch.empty((n_q, heads), dtype=torch.float32, device=q.device)
    batch = cu_q.shape[0] - 1
    grid = (triton.cdiv(max(int(max_q_len), 1), cfg.block_m), heads, batch)
    lse_arg = lse if return_lse else out
    if cfg.tma and k.shape[0] > 0:
        descs = (_descriptor(q, d_qk, cfg.block_m, d1), _descriptor(q, d_qk, cfg.block_m, d2),
                 _descriptor(k, d_qk, cfg.block_n, d1), _descriptor(k, d_qk, cfg.block_n, d2),
                 _descriptor(v, d_v, cfg.block_n, d_v))
        if any(d is None for d in descs):
            raise ValueError("TMA cannot read these inputs (16-byte alignment of the base and strides); "
                             "use a configuration without tma")
        _prefill_fwd_kernel_tma[grid](
            *descs, out, lse_arg, cu_q, cu_k, sm_scale * LOG2E,
            q.stride(1), k.stride(1), v.stride(1), out.stride(0), out.stride(1),
            lse_arg.stride(0) if return_lse else 0, lse_arg.stride(1) if return_lse else 0,
            CAUSAL=bool(causal), RETURN_LSE=bool(return_lse), D1=d1, D2=d2, DV=d_v,
            BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, num_warps=cfg.num_warps, num_stages=cfg.num_stages,
        )
        return (out, lse) if return_lse else out
    _prefill_fwd_kernel[grid](
        q, k, v, out, lse_arg, cu_q, cu_k, sm_scale * LOG2E,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1), out.stride(0), out.stride(1),
        lse_arg.stride(0) if return_lse else 0, lse_arg.stride(1) if return_lse else 0,
        CAUSAL=bool(causal), RETURN_LSE=bool(return_lse), D1=d1, D2=d2, DV=d_v,
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )
    return (out, lse) if return_lse else out
