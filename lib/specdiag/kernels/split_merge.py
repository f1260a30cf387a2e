"""The merge of split-KV partials, shared by the split kernels' merge launches (triton_splitkv, triton_splitkv_ragged).

Each split s of a query row left a normalized partial output O_s [512] and its log-sum-exp L_s (base 2); the row's
output is sum_s 2^(L_s - M) O_s / sum_s 2^(L_s - M) with M = max_s L_s. :func:`merge_two_pass` reads the L_s in a
pass of its own, then the weighted partials BLOCK_S splits at a time; :func:`merge_one_pass` (BLOCK_S >= the split
count) reads both in one round trip, where splitkv_plan.one_pass_merge_fields says it pays. :func:`merge_block` picks
the form and the block of a merge launch from the split count and the configuration's merge fields.
"""

from __future__ import annotations

import triton
import triton.language as tl

from specdiag.kernels.mla import D_V
from specdiag.kernels.splitkv_plan import SplitKVConfig


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
