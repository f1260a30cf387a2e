"""The merge of split-KV partials: its Triton functions and both merge launches, shared by every split kernel (the
Triton ones and the Gluon ones).

Each split s of a query row left a normalized partial output O_s [512] and its log-sum-exp L_s (base 2); the row's
output is sum_s 2^(L_s - M) O_s / sum_s 2^(L_s - M) with M = max_s L_s. :func:`merge_two_pass` reads the L_s in a
pass of its own, then the weighted partials BLOCK_S splits at a time; :func:`merge_one_pass` (BLOCK_S >= the split
count) reads both in one round trip, where plan.one_pass_merge_fields says it pays. :func:`merge_block` picks
the form and the block of a merge launch from the split count and the configuration's merge fields.

The launches: :func:`merge_partials` (a dense call's partials [splits, rows, 512]: triton.splitkv and the dense Gluon
kernels) and :func:`ragged_merge` (a ragged batch's [batch, splits, max rows, 512], the splits that hold tokens
counted on the device: triton.ragged and gluon.ragged). Either can be launched as a programmatic dependent launch
(sm_90): its programs are scheduled while the partial grid drains and wait on ``griddepcontrol.wait``.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_wait

from specdiag.kernels.mla import D_V
from specdiag.kernels.plan import SplitKVConfig


@triton.jit
def merge_two_pass(O_PART, LSE_PART, base, n_splits, stride_split, row, dv, BLOCK_S: tl.constexpr,
                   BLOCK_DV: tl.constexpr, D_V: tl.constexpr):
    """The merged values ``dv`` of ``row`` (fp32 [BLOCK_DV]). Split s's partial is row (base + s) * stride_split + row
    of LSE_PART (flat) and O_PART ([*, D_V]), indexed in int64; splits past ``n_splits`` weigh nothing."""
    offs_s = tl.arange(0, BLOCK_S)
    m_vec = tl.full([BLOCK_S], float("-inf"), tl.float32)
    for s0 in range(0, n_splits, BLOCK_S):
        split = s0 + offs_s
        lse = tl.load(LSE_PART + (base + split.to(tl.int64)) * stride_split + row, mask=split < n_splits,
                      other=float("-inf"))
        m_vec = tl.maximum(m_vec, lse)
    m = tl.max(m_vec, 0)
    acc = tl.zeros([BLOCK_DV], tl.float32)
    w_sum = tl.zeros([BLOCK_S], tl.float32)
    for s0 in range(0, n_splits, BLOCK_S):
        split = s0 + offs_s
        split_ok = split < n_splits
        part_row = (base + split.to(tl.int64)) * stride_split + row
        lse = tl.load(LSE_PART + part_row, mask=split_ok, other=float("-inf"))
        w = tl.where(split_ok, tl.exp2(lse - m), 0.0)
        o = tl.load(O_PART + part_row[:, None] * D_V + dv[None, :], mask=split_ok[:, None], other=0.0)
        acc += tl.sum(w[:, None] * o.to(tl.float32), 0)
        w_sum += w
    return acc / tl.sum(w_sum, 0)


@triton.jit
def merge_one_pass(O_PART, LSE_PART, base, n_splits, stride_split, row, dv, BLOCK_S: tl.constexpr,
                   D_V: tl.constexpr):
    """As :func:`merge_two_pass` for BLOCK_S >= n_splits: the row's lse and the partials loaded in one round trip."""
    offs_s = tl.arange(0, BLOCK_S)
    split_ok = offs_s < n_splits
    part_row = (base + offs_s.to(tl.int64)) * stride_split + row
    lse = tl.load(LSE_PART + part_row, mask=split_ok, other=float("-inf"))
    o = tl.load(O_PART + part_row[:, None] * D_V + dv[None, :], mask=split_ok[:, None], other=0.0)
    w = tl.exp2(lse - tl.max(lse, 0))
    return tl.sum(w[:, None] * o.to(tl.float32), 0) / tl.sum(w, 0)


#: fp32 partial values a one-pass merge program loads at once (32 per thread of its 8 warps)
MERGE_ONE_PASS_ELEMS = 8192


def merge_block(n_splits: int, cfg: SplitKVConfig) -> tuple[int, int, bool]:
    """The merge kernel's (splits, value dims, one pass) per program for ``n_splits`` splits.

    The default: ``cfg.merge_block_dv`` dims, up to 4,096 / that splits at a time, the lse read in a pass of its own.
    ``cfg.merge_one_pass``: every split at once (padded to a power of two) and 8,192 / that dims, between 16 and 512,
    in one round trip; past 512 splits or ``cfg.merge_one_pass_max_splits`` the default.
    """
    splits = max(2, triton.next_power_of_2(n_splits))
    if cfg.merge_one_pass and splits <= min(cfg.merge_one_pass_max_splits, MERGE_ONE_PASS_ELEMS // 16):
        return splits, min(D_V, MERGE_ONE_PASS_ELEMS // splits), True
    return max(2, min(splits, 4096 // cfg.merge_block_dv)), cfg.merge_block_dv, False


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


@triton.jit
def _merge_kernel(O_PART, LSE_PART, OUT, n_splits, n_rows,
                  BLOCK_S: tl.constexpr, BLOCK_DV: tl.constexpr, D_V: tl.constexpr, PDL: tl.constexpr = False,
                  ONE_PASS: tl.constexpr = False):
    row = tl.program_id(0)
    if PDL:  # launched early (programmatic dependent launch): wait for the partial grid's completion and stores
        gdc_wait()
    dv = tl.program_id(1) * BLOCK_DV + tl.arange(0, BLOCK_DV)
    if ONE_PASS:  # BLOCK_S >= n_splits: the row's lse and this block's partials in one round trip
        merged = merge_one_pass(O_PART, LSE_PART, 0, n_splits, n_rows, row, dv, BLOCK_S, D_V)
    else:
        merged = merge_two_pass(O_PART, LSE_PART, 0, n_splits, n_rows, row, dv, BLOCK_S, BLOCK_DV, D_V)
    tl.store(OUT + row.to(tl.int64) * D_V + dv, merged.to(OUT.dtype.element_ty))


def merge_partials(o_part: torch.Tensor, lse_part: torch.Tensor, out: torch.Tensor, cfg: SplitKVConfig,
                   pdl: bool = False) -> torch.Tensor:
    """The second launch alone: weight ``o_part`` [splits, rows, 512] by ``lse_part`` [splits, rows] into ``out``.

    ``pdl``: launch it as a programmatic dependent launch (sm_90): its programs may be scheduled while the partial
    grid drains and wait on ``griddepcontrol.wait`` for that grid's completion, so the launch latency overlaps it.
    """
    pdl = pdl and not _interpreting()
    n_splits, rows = lse_part.shape
    block_s, block_dv, one_pass = merge_block(n_splits, cfg)
    extra = {"launch_pdl": True} if pdl else {}
    _merge_kernel[(rows, D_V // block_dv)](
        o_part, lse_part, out, n_splits, rows,
        BLOCK_S=block_s, BLOCK_DV=block_dv, D_V=D_V, PDL=pdl, ONE_PASS=one_pass, num_warps=8 if one_pass else 4,
        **extra,
    )
    return out


@triton.jit
def _ragged_merge_kernel(
    O_PART, LSE_PART, OUT, QO_INDPTR, KV_INDPTR, n_heads, n_splits, max_rows, min_split_tokens,
    stride_o_tok, stride_o_head,
    BLOCK_S: tl.constexpr, BLOCK_DV: tl.constexpr, D_V: tl.constexpr, ROUND: tl.constexpr,
    ONE_PASS: tl.constexpr = False, PDL: tl.constexpr = False,
):
    row = tl.program_id(0)
    b = tl.program_id(2)
    if PDL:  # launched early (programmatic dependent launch): wait for the partial grid's completion and stores
        gdc_wait()
    q_start = tl.load(QO_INDPTR + b)
    n_draft = tl.load(QO_INDPTR + b + 1) - q_start
    if row >= n_draft * n_heads:
        return
    n_prefix = (tl.load(KV_INDPTR + b + 1) - tl.load(KV_INDPTR + b)).to(tl.int32)
    n_kv = n_prefix + n_draft
    per_split = tl.maximum(tl.cdiv(n_kv, n_splits), min_split_tokens)
    per_split = tl.cdiv(per_split, ROUND) * ROUND
    n_active = tl.cdiv(n_kv, per_split)
    dv = tl.program_id(1) * BLOCK_DV + tl.arange(0, BLOCK_DV)
    base = (b * n_splits).to(tl.int64)
    if ONE_PASS:  # BLOCK_S >= n_splits >= n_active: the lse and the partials in one round trip
        merged = merge_one_pass(O_PART, LSE_PART, base, n_active, max_rows, row, dv, BLOCK_S, D_V)
    else:
        merged = merge_two_pass(O_PART, LSE_PART, base, n_active, max_rows, row, dv, BLOCK_S, BLOCK_DV, D_V)
    t = row // n_heads
    h = row % n_heads
    dst = OUT + (q_start + t).to(tl.int64) * stride_o_tok + h * stride_o_head + dv
    tl.store(dst, merged.to(OUT.dtype.element_ty))


def ragged_merge(o_part: torch.Tensor, lse_part: torch.Tensor, o: torch.Tensor, qo_indptr: torch.Tensor,
                 kv_indptr: torch.Tensor, cfg: SplitKVConfig) -> torch.Tensor:
    """The second launch of a ragged call: each request's ``o_part`` [batch, splits, max_rows, 512] weighted by
    ``lse_part`` [batch, splits, max_rows] into its rows of ``o`` [tokens, H, 512]; the splits that hold tokens are
    counted on the device from the request's length and ``cfg.min_split_tokens``, as the partial kernel cut them."""
    batch, n_splits, max_rows = lse_part.shape
    block_s, block_dv, one_pass = merge_block(n_splits, cfg)  # the grid's splits: every request's n_active or fewer
    pdl = cfg.pdl and not _interpreting()  # cfg.pdl: the merge as a programmatic dependent launch (sm_90)
    _ragged_merge_kernel[(max_rows, D_V // block_dv, batch)](
        o_part, lse_part, o, qo_indptr, kv_indptr, o.shape[1], n_splits, max_rows, cfg.min_split_tokens,
        o.stride(0), o.stride(1),
        BLOCK_S=block_s, BLOCK_DV=block_dv, D_V=D_V, ROUND=cfg.split_round_tokens, ONE_PASS=one_pass, PDL=pdl,
        num_warps=8 if one_pass else 4, **({"launch_pdl": True} if pdl else {}),
    )
    return o
