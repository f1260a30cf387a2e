"""MLA prefill in the MHA form: the entry point, its fp32 reference, its FLOPs and test inputs.

SGLang's chunked-prefix path (``MHA_CHUNKED_KV``) decompresses each chunk's latent KV with ``kv_b_proj`` and runs
plain multi-head attention: q-k width 192 (128 nope + 64 rope), value width 128, per head. A chunk's queries attend
to their own chunk (causal) and to each prefix chunk (no mask); the parts are joined by their log-sum-exps
(:func:`merge`, the same arithmetic as SGLang's ``merge_state_v2``). That form costs 2 x (192 + 128) = 640 FLOP per
query-key pair and head, against 2 x (576 + 512) = 2,176 in the absorbed form (``specdiag.prefill``), which is what
SGLang's Triton backend runs for every chunk after the first.

| device | kernel (:func:`choose`) |
|---|---|
| CUDA (any arch Triton compiles for: sm_80, sm_90, sm_120) | ``"triton"``: triton.prefill ``prefill_triton`` |
| anything else, or a logit cap, or q/k/v dtypes other than one of bf16/fp16 | none: the caller's own path serves |
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import torch

TRITON = "triton"
D_QK_MHA: int = 192  #: q-k width of DeepSeek-V3 / Kimi K2's MHA form (128 nope + 64 rope), elements
D_V_MHA: int = 128  #: value width of the MHA form, elements


def mha_flops(heads: int, pairs: int, d_qk: int = D_QK_MHA, d_v: int = D_V_MHA) -> int:
    """FLOPs of the MHA form over ``pairs`` visible query-key pairs: 2 (d_qk + d_v) per pair and head (QK^T and PV)."""
    return 2 * (d_qk + d_v) * heads * pairs


def visible_pairs(q_len: int, k_len: int, causal: bool) -> int:
    """Query-key pairs one request's attention computes: all of them, or the bottom-right causal ones (query i sees
    keys 0 .. i + k_len - q_len)."""
    if not causal:
        return q_len * k_len
    off = k_len - q_len
    if off >= 0:
        return q_len * (off + 1) + q_len * (q_len - 1) // 2
    return sum(max(0, i + off + 1) for i in range(q_len))


def supported(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, logit_cap: float = 0.0) -> tuple[bool, str]:
    """(runs, why not) for the Triton prefill kernel."""
    if not q.is_cuda or torch.version.hip is not None:
        return False, "not a CUDA device"
    if q.dtype not in (torch.bfloat16, torch.float16) or k.dtype != q.dtype or v.dtype != q.dtype:
        return False, f"dtypes q {q.dtype} / k {k.dtype} / v {v.dtype}: needs all bf16 or all fp16"
    if logit_cap and logit_cap > 0:
        return False, "logit cap (not in the prefill kernel)"
    d_qk = q.shape[-1]
    d1 = 1 << (d_qk.bit_length() - 1)
    if d_qk - d1 == 0 or (d_qk - d1) & (d_qk - d1 - 1) or v.shape[-1] & (v.shape[-1] - 1):
        return False, f"widths q-k {d_qk} / v {v.shape[-1]}: the kernel takes 2^a + 2^b and a power of two"
    return True, "Triton ragged flash-attention forward"


def choose(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, logit_cap: float = 0.0) -> tuple[Optional[str], str]:
    """(the kernel that serves this call, why) by the module doc's table; (None, why) where none here can."""
    ok, why = supported(q, k, v, logit_cap)
    return (TRITON if ok else None), why


def prefill(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_q: torch.Tensor, cu_k: torch.Tensor,
            max_q_len: int, causal: bool, sm_scale: float, out: Optional[torch.Tensor] = None,
            return_lse: bool = False, cfg=None):
    """The MHA-form attention of a ragged batch (triton.prefill ``prefill_triton``'s arguments and returns)."""
    from specdiag.kernels.triton.prefill import DEFAULT_CONFIG, prefill_triton  # noqa: PLC0415  (imports triton)

    return prefill_triton(q, k, v, cu_q, cu_k, max_q_len, causal, sm_scale, out=out, return_lse=return_lse,
                          cfg=cfg or DEFAULT_CONFIG)


def reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_q: torch.Tensor, cu_k: torch.Tensor,
              causal: bool, sm_scale: float, rows: Optional[torch.Tensor] = None,
              max_score_elems: int = 1 << 27) -> tuple[torch.Tensor, torch.Tensor]:
    """The definition in fp32: (out [n, H, DV] fp32, natural lse [n, H] fp32) for the query rows ``rows`` (global
    indices into q; all rows when None). A row that sees no key gets out 0 and lse -inf (the kernel's convention)."""
    n_q, heads, _ = q.shape
    rows = torch.arange(n_q, device=q.device) if rows is None else rows.to(q.device)
    cu_q_l, cu_k_l = [int(x) for x in cu_q.tolist()], [int(x) for x in cu_k.tolist()]
    out = torch.zeros(rows.shape[0], heads, v.shape[-1], dtype=torch.float32, device=q.device)
    lse = torch.full((rows.shape[0], heads), float("-inf"), dtype=torch.float32, device=q.device)
    req_of = torch.bucketize(rows, torch.tensor(cu_q_l[1:], device=q.device), right=True)
    prev = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        for b in range(len(cu_q_l) - 1):
            pick = (req_of == b).nonzero().flatten()
            if pick.numel() == 0 or cu_k_l[b + 1] == cu_k_l[b]:
                continue  # no queries, or no keys: out 0, lse -inf as initialised
            kb = k[cu_k_l[b]:cu_k_l[b + 1]].float()  # [n_k, H, D]
            vb = v[cu_k_l[b]:cu_k_l[b + 1]].float()
            q_len, k_len = cu_q_l[b + 1] - cu_q_l[b], kb.shape[0]
            chunk = max(1, max_score_elems // max(k_len * heads, 1))
            for c0 in range(0, pick.numel(), chunk):
                idx = pick[c0:c0 + chunk]
                local = rows[idx] - cu_q_l[b]
                s = torch.einsum("rhd,khd->hrk", q[rows[idx]].float(), kb) * sm_scale
                if causal:
                    vis = torch.arange(k_len, device=q.device)[None, :] <= (local + k_len - q_len)[:, None]
                    s = s.masked_fill(~vis[None], float("-inf"))
                m = s.amax(dim=-1, keepdim=True)
                seen = torch.isfinite(m)
                m_safe = torch.where(seen, m, torch.zeros_like(m))
                p = torch.exp(s - m_safe)
                den = p.sum(dim=-1, keepdim=True)
                o = torch.einsum("hrk,khd->rhd", p / den.clamp_min(1e-30), vb)
                out[idx] = torch.where(seen.squeeze(-1).T[..., None], o, torch.zeros_like(o))
                lse[idx] = torch.where(seen.squeeze(-1), (m_safe + den.clamp_min(1e-30).log()).squeeze(-1),
                                       torch.full_like(den.squeeze(-1), float("-inf"))).T
    finally:
        torch.backends.cuda.matmul.allow_tf32 = prev
    return out, lse


def merge(o_a: torch.Tensor, lse_a: torch.Tensor, o_b: torch.Tensor, lse_b: torch.Tensor
          ) -> tuple[torch.Tensor, torch.Tensor]:
    """Two attention states over disjoint keys joined (natural log-sum-exps [n, H], outputs [n, H, D]): what SGLang's
    ``merge_state_v2`` computes, in fp32."""
    m = torch.maximum(lse_a, lse_b)
    m = torch.where(torch.isinf(m), torch.zeros_like(m), m)
    wa, wb = torch.exp(lse_a - m), torch.exp(lse_b - m)
    tot = wa + wb
    o = (o_a.float() * (wa / tot.clamp_min(1e-30))[..., None] + o_b.float() * (wb / tot.clamp_min(1e-30))[..., None])
    return o, torch.log(tot) + m


@dataclass(frozen=True)
class PrefillShape:
    """One chunk of a long prompt: ``chunk_tokens`` queries of a request whose ``prefix_tokens`` earlier tokens are
    in the cache, ``heads`` MHA heads (one TP rank's)."""
    prefix_tokens: int
    chunk_tokens: int = 8192
    heads: int = 8

    def flops(self) -> int:
        """MHA-form FLOPs of the chunk: the prefix (all pairs) and the chunk itself (causal)."""
        return mha_flops(self.heads, self.prefix_tokens * self.chunk_tokens
                         + self.chunk_tokens * (self.chunk_tokens + 1) // 2)


def make_inputs(shape: PrefillShape, device: str | torch.device = "cpu", dtype: torch.dtype = torch.bfloat16,
                seed: int = 0) -> dict:
    """Random q (the chunk), k and v (prefix + chunk) laid out as SGLang passes them: v a strided view of a
    [n, H, 256] kv tensor (kv_b_proj's output), k contiguous [n, H, 192]; unit-variance rows, sm_scale 1/sqrt(192)."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    n_k = shape.prefix_tokens + shape.chunk_tokens
    q = torch.randn(shape.chunk_tokens, shape.heads, D_QK_MHA, generator=g).to(device=device, dtype=dtype)
    k = torch.randn(n_k, shape.heads, D_QK_MHA, generator=g).to(device=device, dtype=dtype)
    kv = torch.randn(n_k, shape.heads, 128 + D_V_MHA, generator=g).to(device=device, dtype=dtype)
    return {"q": q, "k": k, "v": kv[..., 128:], "sm_scale": 1.0 / math.sqrt(D_QK_MHA)}
