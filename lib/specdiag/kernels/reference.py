"""Torch implementations: the fp32 reference and the CPU fallbacks of the two kernel designs.

- :func:`reference_verify`: the definition. fp32 on upcast bf16 inputs, scores materialized
  (in chunks of query rows so memory stays bounded), softmax, PV. TF32 is switched off.
- :func:`baseline_torch`: the baseline's structure in torch (one pass per head and 32-token query
  block, streaming the prefix tile by tile through the token index with an online softmax, then the
  draft block under the tree mask). Used on the CPU, where Triton does not run.
- :func:`split_kv_torch`: the split-KV design in torch (heads x draft tokens packed into rows, the
  KV cut into splits, a partial output and log-sum-exp per split, merged by LSE weights).

The fallbacks compute the same function as the reference; tests check all three agree.
"""

from __future__ import annotations

import math

import torch

from specdiag.kernels.mla import D_V, VerifyInputs


def _visible(inputs: VerifyInputs, kv_pos: torch.Tensor, draft_rows: torch.Tensor) -> torch.Tensor:
    """[len(draft_rows), len(kv_pos)] bool: may draft token ``draft_rows[i]`` see kv position ``kv_pos[j]``."""
    in_prefix = kv_pos < inputs.n_prefix
    j = (kv_pos - inputs.n_prefix).clamp(min=0, max=inputs.draft_tokens - 1)
    tree = inputs.mask[draft_rows][:, j]
    return in_prefix[None, :] | tree


def reference_verify(inputs: VerifyInputs, out: torch.Tensor | None = None,
                     max_score_elems: int = 1 << 28) -> torch.Tensor:
    """Exact MLA verify attention in fp32: returns [T, H, 512] fp32 (and fills ``out`` if given)."""
    q = inputs.q.float()  # [T, H, 576]
    T, H, _ = q.shape
    kv = inputs.cache[inputs.token_table].float()  # [n_kv, 576]
    v = kv[:, :D_V]
    n_kv = kv.shape[0]
    rows = q.reshape(T * H, -1)
    draft_of_row = torch.arange(T * H, device=q.device) // H
    vis_all = _visible(inputs, torch.arange(n_kv, device=q.device), torch.arange(T, device=q.device))
    result = torch.empty(T * H, D_V, dtype=torch.float32, device=q.device)
    chunk = max(1, max_score_elems // max(n_kv, 1))
    prev = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        for r0 in range(0, T * H, chunk):
            r1 = min(T * H, r0 + chunk)
            s = (rows[r0:r1] @ kv.T) * inputs.sm_scale
            s = s.masked_fill(~vis_all[draft_of_row[r0:r1]], float("-inf"))
            result[r0:r1] = torch.softmax(s, dim=-1) @ v
    finally:
        torch.backends.cuda.matmul.allow_tf32 = prev
    result = result.reshape(T, H, D_V)
    if out is not None:
        out.copy_(result.to(out.dtype))
    return result


def _online_update(m: torch.Tensor, l: torch.Tensor, acc: torch.Tensor, s: torch.Tensor, v: torch.Tensor):
    """One online-softmax step (natural log base) over a score tile ``s`` [rows, n] and values ``v`` [n, 512]."""
    m_new = torch.maximum(m, s.max(dim=1).values)
    m_safe = torch.where(torch.isinf(m_new), torch.zeros_like(m_new), m_new)
    alpha = torch.exp(m - m_safe)
    p = torch.exp(s - m_safe[:, None])
    l = l * alpha + p.sum(dim=1)
    acc = acc * alpha[:, None] + p @ v
    return m_new, l, acc


def baseline_torch(inputs: VerifyInputs, out: torch.Tensor, block_m: int = 32, block_n: int = 64) -> torch.Tensor:
    """The baseline's structure: per (head, 32-token block) stream all KV tiles; fills ``out`` [T, H, 512]."""
    T, H = inputs.draft_tokens, inputs.heads
    n_kv = inputs.n_kv
    for h in range(H):
        for m0 in range(0, T, block_m):
            draft_rows = torch.arange(m0, min(T, m0 + block_m), device=inputs.q.device)
            q = inputs.q[draft_rows, h].float()
            m = torch.full((len(draft_rows),), float("-inf"), device=q.device)
            l = torch.zeros(len(draft_rows), device=q.device)
            acc = torch.zeros(len(draft_rows), D_V, device=q.device)
            for n0 in range(0, n_kv, block_n):  # stage 1 (prefix) and stage 2 (draft block) in one walk
                pos = torch.arange(n0, min(n_kv, n0 + block_n), device=q.device)
                kv = inputs.cache[inputs.token_table[pos]].float()
                s = (q @ kv.T) * inputs.sm_scale
                s = s.masked_fill(~_visible(inputs, pos, draft_rows), float("-inf"))
                m, l, acc = _online_update(m, l, acc, s, kv[:, :D_V])
            out[draft_rows, h] = (acc / l[:, None]).to(out.dtype)
    return out


def split_kv_torch(inputs: VerifyInputs, out: torch.Tensor, n_splits: int = 4) -> torch.Tensor:
    """The split-KV design: rows = heads x draft tokens, one partial per KV split, LSE merge; fills ``out``."""
    T, H = inputs.draft_tokens, inputs.heads
    n_kv = inputs.n_kv
    rows = inputs.q.reshape(T * H, -1).float()
    draft_of_row = torch.arange(T * H, device=rows.device) // H
    per_split = -(-n_kv // max(1, n_splits))
    partials, lses = [], []
    for s0 in range(0, n_kv, per_split):
        pos = torch.arange(s0, min(n_kv, s0 + per_split), device=rows.device)
        kv = inputs.cache[inputs.token_table[pos]].float()
        s = (rows @ kv.T) * inputs.sm_scale
        vis = _visible(inputs, pos, torch.arange(T, device=rows.device))[draft_of_row]
        s = s.masked_fill(~vis, float("-inf"))
        m = s.max(dim=1).values
        m_safe = torch.where(torch.isinf(m), torch.zeros_like(m), m)
        p = torch.exp(s - m_safe[:, None])
        l = p.sum(dim=1)
        o = (p @ kv[:, :D_V]) / l.clamp(min=torch.finfo(torch.float32).tiny)[:, None]
        partials.append(o)
        lses.append(torch.where(l > 0, m_safe + torch.log(l), torch.full_like(l, -math.inf)))
    lse = torch.stack(lses)  # [S, rows]
    w = torch.softmax(lse, dim=0)  # LSE merge weights
    merged = (w[:, :, None] * torch.stack(partials)).sum(dim=0)
    out.copy_(merged.reshape(T, H, D_V).to(out.dtype))
    return out


def relative_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    """||out - ref|| / ||ref|| in fp32; inf when ``out`` holds a NaN or an inf."""
    out32 = out.float()
    if not torch.isfinite(out32).all():
        return float("inf")
    return float((out32 - ref.float()).norm() / ref.float().norm())
