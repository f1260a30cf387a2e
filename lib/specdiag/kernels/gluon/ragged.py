"""The SGLang plugin's verify kernels on sm_90: the pick's warp-specialized Gluon kernels on SGLang's ragged layout.

On the H200 the plugin's Triton kernel (triton.ragged) took 1.4-2.2x the time of the warp-specialized kernel
from 33 packed rows (heads x draft tokens) and 1.1-1.6x below. These are the same kernels, their partitions unchanged
(gluon.ws ``_softmax_partition`` and ``_pv_loader_partition``; gluon.swap's; gluon.fp8's), behind entries that
read every length on the device, as triton.ragged does, so one launch serves any context length and a CUDA
graph captured at one length replays at another:

- the grid is (64-row tiles of ``max_draft`` x H, splits, requests) for the row-major kernel, (splits, requests) for
  the rows-as-N one; request b's queries are rows ``qo_indptr[b] ..`` of ``q`` [tokens, H, 576] (contiguous: the
  request's rows are one block of Q);
- its prefix is ``kv_indices[kv_indptr[b] ..]`` and its draft tokens are cache slots ``draft_loc[qo_indptr[b] ..]``
  (SGLang's ``out_cache_loc``: the plugin stores the draft rows there before the kernel, as SGLang's backend does),
  both page_size 1 slots of the latent cache ``kv`` [slots, 576]; the copy partition gathers from either table
  (gluon.ws ``_tile_slots`` with RAGGED);
- the tree mask is SGLang's flattened custom mask: row t of request b at ``mask_indptr[b] + t * (P + T) + P``;
- the split of a program: ``per_split = roundup64(max(ceil(n_kv / splits), min_split_tokens))`` tokens, as
  triton.ragged cuts them, so the merge is the same (merge.ragged_merge): partials [requests, splits,
  max rows, 512] fp32, the merge in one pass where plan.one_pass_merge_fields says so, 64 value dims per
  program otherwise (the pick's), launched as a programmatic dependent launch.

On a bf16 or fp16 cache (``ragged_split_kv_gluon_ws``): up to 16 rows the rows-as-N kernel (gluon.swap's
partitions; an N of 8 up to 8 rows), above it the row-major kernel (Q is loaded before the partitions: the pick's
EARLY_Q is not used here).

On an fp8 e4m3 cache (SGLang's ``--kv-cache-dtype fp8_e4m3``; ``ragged_split_kv_gluon_fp8``): the fp8 pick's kernel
(gluon.fp8: the staged s22 ring up to 8 rows, the direct d2 ring up to 16, the math in fp16) behind the same
entry (``_fp8_ragged_partial_kernel``), the draft rows read from the fp8 cache where the hook stored them, the cache's
one scale applied to each converted tile; above 16 rows an N of 32 (``FP8_N32_RING``) and, above 32, row tiles of
whole draft tokens (``fp8_tile_rows``; 8 heads x 8 draft tokens: two tiles of 32), each reading the split's KV. (Row
tiles of 64 rows, which convert each KV tile once, took 1.18-1.38x the time of the 32-row tiles on the H200: their
conversion and math in series.)

No logit cap (the Triton ragged kernel has one). CUDA sm_90 only (wgmma); the CPU tests compile it for sm_90.
"""

from __future__ import annotations

from dataclasses import replace

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared

from specdiag.kernels.gluon.fp8 import (FP8_RINGS, Fp8Ring, _fp8_copy_convert_partition, _fp8_core_state,
                                        _fp8_loader_partition, _fp8_staging_state, fp16_pair_bits, partition_regs,
                                        ring_for)
from specdiag.kernels.gluon.swap import (SWAP_MAX_ROWS, _swap_pv_loader_partition, _swap_pv_partition,
                                         _swap_shared_state, _swap_softmax_partition)
from specdiag.kernels.gluon.ws import (D_HALF, WS_PARTITION_WARPS, WS_WORKER_REGS, _pv_loader_partition,
                                       _softmax_partition, ws_shared_state)
from specdiag.kernels.merge import ragged_merge
from specdiag.kernels.mla import BLOCK_TOKENS, D_NOPE, D_PE, D_QK, D_V, LOG2E, MAX_KV_SCALE
from specdiag.kernels.plan import GLUON_BLOCK_M, SplitKVConfig, gluon_config, n_splits_for, one_pass_merge_fields

#: value dims per merge program where the merge does not run in one pass (the pick's)
MERGE_BLOCK_DV = 64


@gluon.jit
def _request_bounds(QO_INDPTR, KV_INDPTR, b, pid_s, n_heads, n_splits, min_split_tokens, ROUND: gl.constexpr):
    """Request ``b``'s lengths in a ragged batch, read on the device (both entries): where its query rows and tokens
    start, its prefix and token counts, its packed rows, and split ``pid_s``'s tokens [start, end)."""
    # lengths as int32 whatever the indptr dtypes (SGLang's qo_indptr is int32 in eager calls, int64 in the CUDA-graph
    # buffers): the partitions' loop bounds must have one type (with int64 lengths the kernel fails to compile)
    q_start = gl.load(QO_INDPTR + b).to(gl.int32)
    n_draft = gl.load(QO_INDPTR + b + 1).to(gl.int32) - q_start
    kv_start = gl.load(KV_INDPTR + b).to(gl.int64)
    n_prefix = (gl.load(KV_INDPTR + b + 1) - kv_start).to(gl.int32)
    n_kv = n_prefix + n_draft
    per_split = gl.maximum(gl.cdiv(n_kv, n_splits), min_split_tokens)
    per_split = gl.cdiv(per_split, ROUND) * ROUND
    start = pid_s * per_split
    return q_start, kv_start, n_prefix, n_kv, n_draft * n_heads, start, gl.minimum(start + per_split, n_kv)


@gluon.jit
def _request_blocks(MASK, O_PART, LSE_PART, MASK_INDPTR, b, n_splits, max_rows, n_prefix, D_HALF: gl.constexpr):
    """Request ``b``'s block of the custom mask (row t of its draft block at + t * n_kv) and of the partials
    ([splits, max_rows] rows of 2 x D_HALF, and their LSE)."""
    mask_b = MASK + gl.load(MASK_INDPTR + b).to(gl.int64) + n_prefix
    part = (b * n_splits).to(gl.int64) * max_rows
    return mask_b, O_PART + part * (2 * D_HALF), LSE_PART + part


@gluon.jit
def _ws_ragged_partial_kernel(Q, KV, KV_INDICES, DRAFT_LOC, MASK, QO_INDPTR, KV_INDPTR, MASK_INDPTR, O_PART,
                              LSE_PART, qk_scale, n_heads, n_splits, max_rows, min_split_tokens, stride_kv,
                              BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
                              D_NOPE: gl.constexpr, D_PE: gl.constexpr, D_HALF: gl.constexpr,
                              num_warps: gl.constexpr, WORKER_REGS: gl.constexpr, ROUND: gl.constexpr):
    """One program per (64-row tile, split, request): the request's lengths from the device, then gluon.ws's two
    partitions on its rows, its tables and its slice of the partials (module doc)."""
    pid_m = gl.program_id(0)
    pid_s = gl.program_id(1)
    b = gl.program_id(2)
    q_start, kv_start, n_prefix, n_kv, n_rows, start, end = _request_bounds(QO_INDPTR, KV_INDPTR, b, pid_s, n_heads,
                                                                            n_splits, min_split_tokens, ROUND)
    # a split past the request's end, or a row tile past its rows, runs no tile (its partial is never merged)
    n_iter = gl.where(pid_m * BLOCK_M < n_rows, gl.cdiv(gl.maximum(end - start, 0), BLOCK_N), 0)

    q_b = Q + q_start.to(gl.int64) * n_heads * (D_NOPE + D_PE)  # the request's rows: one block of a contiguous q
    (q_smem, qpe_smem, kv_smem, pe_smem, p_smem, row_smem, kv_ready, kv_free, p_ready, p_free,
     l_ready) = ws_shared_state(q_b, pid_m, n_rows, BLOCK_M, BLOCK_N, STAGES, D_NOPE, D_PE, num_warps)
    mask_b, o_part_b, lse_part_b = _request_blocks(MASK, O_PART, LSE_PART, MASK_INDPTR, b, n_splits, max_rows, n_prefix,
                                                   D_HALF)
    gl.warp_specialize([
        (_softmax_partition, (q_smem, qpe_smem, kv_smem, pe_smem, p_smem, row_smem, kv_ready, kv_free, p_ready,
                              p_free, l_ready, mask_b, o_part_b, lse_part_b, qk_scale, n_prefix, n_kv, n_heads,
                              n_rows, max_rows, start, end, n_iter, pid_m, pid_s, BLOCK_M, BLOCK_N, STAGES, D_NOPE,
                              D_HALF, num_warps)),
        (_pv_loader_partition, (kv_smem, pe_smem, p_smem, row_smem, kv_ready, kv_free, p_ready, p_free, l_ready, KV,
                                KV_INDICES + kv_start, DRAFT_LOC + q_start, n_prefix, o_part_b, n_rows, max_rows,
                                start, end, n_iter, pid_m, pid_s, stride_kv, BLOCK_M, BLOCK_N, STAGES, D_NOPE, D_PE,
                                D_HALF, num_warps, True)),
    ], [num_warps], [WORKER_REGS])


@gluon.jit
def _swap_ragged_partial_kernel(Q, KV, KV_INDICES, DRAFT_LOC, MASK, QO_INDPTR, KV_INDPTR, MASK_INDPTR, O_PART,
                                LSE_PART, qk_scale, n_heads, n_splits, max_rows, min_split_tokens, stride_kv,
                                BLOCK_N: gl.constexpr, STAGES: gl.constexpr, RN: gl.constexpr, D_NOPE: gl.constexpr,
                                D_PE: gl.constexpr, D_HALF: gl.constexpr, num_warps: gl.constexpr,
                                WORKER_REGS: gl.constexpr, ROUND: gl.constexpr):
    """One program per (split, request) of a batch whose requests have at most RN rows each: the request's lengths
    from the device as ``_ws_ragged_partial_kernel``'s, then gluon.swap's partitions (the rows as the wgmma's N)
    on its rows, its tables and its slice of the partials."""
    pid_s = gl.program_id(0)
    b = gl.program_id(1)
    q_start, kv_start, n_prefix, n_kv, n_rows, start, end = _request_bounds(QO_INDPTR, KV_INDPTR, b, pid_s, n_heads,
                                                                            n_splits, min_split_tokens, ROUND)
    n_iter = gl.cdiv(gl.maximum(end - start, 0), BLOCK_N)  # a split past the request's end runs no tile

    q_b = Q + q_start.to(gl.int64) * n_heads * (D_NOPE + D_PE)
    (q_smem, qpe_smem, kv_smem, pe_smem, pt_smem, row_smem, kv_ready, kv_free, p_ready, p_free,
     l_ready) = _swap_shared_state(Q.dtype.element_ty, BLOCK_N, STAGES, RN, D_NOPE, D_PE, num_warps)
    mask_b, o_part_b, lse_part_b = _request_blocks(MASK, O_PART, LSE_PART, MASK_INDPTR, b, n_splits, max_rows, n_prefix,
                                                   D_HALF)
    gl.warp_specialize([
        (_swap_softmax_partition, (q_b, q_smem, qpe_smem, kv_smem, pe_smem, pt_smem, row_smem, kv_ready, kv_free,
                                   p_ready, p_free, l_ready, mask_b, o_part_b, lse_part_b, qk_scale, n_prefix, n_kv,
                                   n_heads, n_rows, max_rows, start, end, n_iter, pid_s, BLOCK_N, STAGES, RN, D_NOPE,
                                   D_PE, D_HALF, num_warps)),
        (_swap_pv_loader_partition, (kv_smem, pe_smem, pt_smem, row_smem, kv_ready, kv_free, p_ready, p_free, l_ready,
                                     KV, KV_INDICES + kv_start, DRAFT_LOC + q_start, o_part_b, n_prefix, n_rows,
                                     max_rows, start, end, n_iter, pid_s, stride_kv, BLOCK_N, STAGES, RN, D_NOPE, D_PE,
                                     D_HALF, num_warps, True)),
    ], [num_warps], [WORKER_REGS])


@gluon.jit
def _fp8_ragged_partial_kernel(Q, KV8, KV_INDICES, DRAFT_LOC, MASK, QO_INDPTR, KV_INDPTR, MASK_INDPTR, O_PART,
                               LSE_PART, qk_scale, kv_scale2, n_heads, n_splits, max_rows, min_split_tokens, stride_kv,
                               tile_rows, BLOCK_N: gl.constexpr, SB: gl.constexpr, S8: gl.constexpr, RN: gl.constexpr,
                               D_NOPE: gl.constexpr, D_PE: gl.constexpr, D_HALF: gl.constexpr, num_warps: gl.constexpr,
                               PV_REGS: gl.constexpr, CONVERT_REGS: gl.constexpr, ROUND: gl.constexpr):
    """One program per (split, request, row tile) on the fp8 cache: the request's lengths from the device as
    ``_swap_ragged_partial_kernel``'s, then gluon.fp8's partitions (the fp8 pick's: the rows-as-N softmax, the
    three-partition P V, and with S8 > 0 the staged copy-and-convert warpgroup, else the direct form's two loading
    warpgroups) on rows ``pid_m * tile_rows ..`` (at most ``tile_rows`` <= RN of them), its tables and its slice of the
    partials. A row tile starts at a draft token's first row or holds rows of one draft token only (``fp8_tile_rows``),
    so the partitions' tree mask, read by the tile's own rows // heads, is offset by whole mask rows. The partitions
    read the prefix's rows through ``KV_INDICES`` and the draft rows through ``DRAFT_LOC`` (RAGGED)."""
    pid_s = gl.program_id(0)
    b = gl.program_id(1)
    pid_m = gl.program_id(2)
    q_start, kv_start, n_prefix, n_kv, req_rows, start, end = _request_bounds(QO_INDPTR, KV_INDPTR, b, pid_s, n_heads,
                                                                              n_splits, min_split_tokens, ROUND)
    row0 = pid_m * tile_rows
    n_rows = gl.maximum(gl.minimum(req_rows - row0, tile_rows), 0)
    # a split past the request's end, or a row tile past its rows, runs no tile (its partial is never merged)
    n_iter = gl.where(n_rows > 0, gl.cdiv(gl.maximum(end - start, 0), BLOCK_N), 0)

    q_b = Q + (q_start.to(gl.int64) * n_heads + row0) * (D_NOPE + D_PE)
    (q_smem, qpe_smem, kv_smem, pe_smem, pt_smem, row_smem, kv_ready, kv_free, p_ready, p_free,
     l_ready) = _fp8_core_state(gl.float16, BLOCK_N, SB, RN, D_NOPE, D_PE)
    if S8 > 0:
        st_nope, st_pe, st_ready = _fp8_staging_state(BLOCK_N, S8, D_NOPE, D_PE, num_warps)
    fence_async_shared()
    gl.thread_barrier()
    mask_b, o_part_b, lse_part_b = _request_blocks(MASK, O_PART, LSE_PART, MASK_INDPTR, b, n_splits, max_rows, n_prefix,
                                                   D_HALF)
    mask_b += (row0 // n_heads).to(gl.int64) * n_kv  # the tile's first draft token's mask row (n_kv entries a row)
    o_part_b += row0.to(gl.int64) * (2 * D_HALF)
    lse_part_b += row0
    table_b = KV_INDICES + kv_start
    draft_b = DRAFT_LOC + q_start
    # one warp_specialize per form: a partition list cannot be built from variables
    if S8 > 0:
        gl.warp_specialize([
            (_swap_softmax_partition, (q_b, q_smem, qpe_smem, kv_smem, pe_smem, pt_smem, row_smem, kv_ready, kv_free,
                                       p_ready, p_free, l_ready, mask_b, o_part_b, lse_part_b, qk_scale, n_prefix, n_kv,
                                       n_heads, n_rows, max_rows, start, end, n_iter, pid_s, BLOCK_N, SB, RN, D_NOPE,
                                       D_PE, D_HALF, num_warps)),
            (_swap_pv_partition, (kv_smem, pt_smem, row_smem, kv_free, p_ready, p_free, l_ready, o_part_b, n_rows,
                                  max_rows, n_iter, pid_s, SB, RN, D_HALF, num_warps)),
            (_fp8_copy_convert_partition, (st_nope, st_pe, st_ready, kv_smem, pe_smem, kv_ready, kv_free, KV8, table_b,
                                           draft_b, kv_scale2, n_prefix, start, end, n_iter, stride_kv, BLOCK_N, SB,
                                           S8, D_NOPE, D_PE, num_warps, True)),
        ], [num_warps, num_warps], [PV_REGS, CONVERT_REGS])
    else:
        gl.warp_specialize([
            (_swap_softmax_partition, (q_b, q_smem, qpe_smem, kv_smem, pe_smem, pt_smem, row_smem, kv_ready, kv_free,
                                       p_ready, p_free, l_ready, mask_b, o_part_b, lse_part_b, qk_scale, n_prefix, n_kv,
                                       n_heads, n_rows, max_rows, start, end, n_iter, pid_s, BLOCK_N, SB, RN, D_NOPE,
                                       D_PE, D_HALF, num_warps)),
            (_swap_pv_partition, (kv_smem, pt_smem, row_smem, kv_free, p_ready, p_free, l_ready, o_part_b, n_rows,
                                  max_rows, n_iter, pid_s, SB, RN, D_HALF, num_warps)),
            (_fp8_loader_partition, (kv_smem, pe_smem, kv_ready, kv_free, KV8, table_b, draft_b, kv_scale2, n_prefix,
                                     start, end, n_iter, stride_kv, 0, BLOCK_N, SB, D_NOPE, D_PE, num_warps, True)),
            (_fp8_loader_partition, (kv_smem, pe_smem, kv_ready, kv_free, KV8, table_b, draft_b, kv_scale2, n_prefix,
                                     start, end, n_iter, stride_kv, 1, BLOCK_N, SB, D_NOPE, D_PE, num_warps, True)),
        ], [num_warps, num_warps, num_warps], [PV_REGS, CONVERT_REGS, CONVERT_REGS])


def ragged_gluon_config(rows: int) -> SplitKVConfig:
    """The plan and merge fields of the ragged Gluon call at ``rows`` packed rows: gluon_config's 64 x 64 tile and two
    stages, one program per SM, 64 value dims per merge program, the merge in one pass where
    ``one_pass_merge_fields`` says so, launched as a programmatic dependent launch (on the H200 the call took
    0.955-0.998 of its time without it)."""
    return replace(gluon_config(64, 2), merge_block_dv=MERGE_BLOCK_DV, pdl=True, **one_pass_merge_fields(rows))


def ragged_split_kv_gluon_ws(q: torch.Tensor, kv: torch.Tensor, o: torch.Tensor, qo_indptr: torch.Tensor,
                             kv_indptr: torch.Tensor, kv_indices: torch.Tensor, draft_loc: torch.Tensor,
                             mask: torch.Tensor, mask_indptr: torch.Tensor, max_draft: int, sm_scale: float,
                             cfg: SplitKVConfig | None = None, num_sms: int | None = None) -> torch.Tensor:
    """Verify attention for a batch in SGLang's layout with the warp-specialized kernel; writes ``o`` [tokens, H, 512]
    and returns it: where every request's rows fit one tile of ``SWAP_MAX_ROWS`` (heads x ``max_draft``) the rows as
    the wgmma's N (gluon.swap; an N of 8 up to 8 rows; on the H200 0.94-0.96 of the row-major kernel's time at 8-16
    rows), else the row-major kernel. ``q`` [tokens, H, 576] contiguous; ``kv`` [slots, (1,) 576] the layer's
    latent cache, holding the draft rows at ``draft_loc`` [tokens] (SGLang's out_cache_loc); ``mask`` the flattened
    custom mask (bool or uint8); ``max_draft`` the most draft tokens of any request (SGLang's ``max_extend_len``). No
    host synchronisation: safe under CUDA-graph capture."""
    if q.dim() != 3 or q.shape[-1] != D_QK or not q.is_contiguous():
        raise ValueError(f"q must be a contiguous [tokens, heads, {D_QK}]; got {tuple(q.shape)}")
    kv2 = kv.reshape(kv.shape[0], -1)
    if kv2.shape[1] != D_QK or kv2.stride(1) != 1:
        raise ValueError("kv rows must hold 576 values (512 latent + 64 rope) with unit inner stride")
    if kv2.dtype != q.dtype or q.dtype not in (torch.bfloat16, torch.float16):
        raise ValueError(f"q and kv must both be bf16 or both fp16; got {q.dtype} and {kv2.dtype}")
    if o.dim() != 3 or o.shape[-1] != D_V or o.stride(-1) != 1:
        raise ValueError(f"o must be [tokens, heads, {D_V}] with unit inner stride; got {tuple(o.shape)}")
    if draft_loc.shape[0] < q.shape[0]:
        raise ValueError(f"draft_loc needs a cache slot per query token ({q.shape[0]}); got {draft_loc.shape[0]}")
    heads = q.shape[1]
    batch = qo_indptr.shape[0] - 1
    max_rows = max_draft * heads
    cfg = cfg or ragged_gluon_config(max_rows)
    if num_sms is None:
        num_sms = torch.cuda.get_device_properties(q.device).multi_processor_count
    n_splits = n_splits_for(max_rows, batch, num_sms, cfg)
    n_tiles = -(-max_rows // GLUON_BLOCK_M)
    mask_u8 = mask.view(torch.uint8) if mask.dtype == torch.bool else mask
    o_part = torch.empty(batch, n_splits, max_rows, D_V, device=q.device, dtype=torch.float32)
    lse_part = torch.empty(batch, n_splits, max_rows, device=q.device, dtype=torch.float32)
    if max_rows <= SWAP_MAX_ROWS:
        _swap_ragged_partial_kernel[(n_splits, batch)](
            q, kv2, kv_indices, draft_loc, mask_u8, qo_indptr, kv_indptr, mask_indptr, o_part, lse_part,
            float(sm_scale) * LOG2E, heads, n_splits, max_rows, cfg.min_split_tokens, kv2.stride(0),
            BLOCK_N=cfg.block_n, STAGES=cfg.num_stages, RN=8 if max_rows <= 8 else SWAP_MAX_ROWS, D_NOPE=D_NOPE,
            D_PE=D_PE, D_HALF=D_HALF, num_warps=WS_PARTITION_WARPS, WORKER_REGS=WS_WORKER_REGS,
            ROUND=cfg.split_round_tokens,
        )
        return ragged_merge(o_part, lse_part, o, qo_indptr, kv_indptr, cfg)
    _ws_ragged_partial_kernel[(n_tiles, n_splits, batch)](
        q, kv2, kv_indices, draft_loc, mask_u8, qo_indptr, kv_indptr, mask_indptr, o_part, lse_part,
        float(sm_scale) * LOG2E, heads, n_splits, max_rows, cfg.min_split_tokens, kv2.stride(0),
        BLOCK_M=GLUON_BLOCK_M, BLOCK_N=cfg.block_n, STAGES=cfg.num_stages, D_NOPE=D_NOPE, D_PE=D_PE, D_HALF=D_HALF,
        num_warps=WS_PARTITION_WARPS, WORKER_REGS=WS_WORKER_REGS, ROUND=cfg.split_round_tokens,
    )
    return ragged_merge(o_part, lse_part, o, qo_indptr, kv_indptr, cfg)


#: the fp8 ragged kernel's widest row tile (the wgmma's N): calls of more rows run several row tiles, each reading the
#: split's KV (32 rows: twice the fp8 bytes of a 64-row call, the bf16 cache's)
FP8_TILE_MAX_ROWS = 32
#: the ring of a 32-row tile (gluon.fp8.FP8_RINGS' d2: two fp16 tiles, two loading warpgroups, 189,144 B of shared
#: memory) and its registers per thread of warpgroup 1 and of each loading warpgroup, chosen by compiling for sm_90
#: here: (104, 120), which spills 76 B at its best split
FP8_N32_RING = "d2"
FP8_N32_REGS = (104, 120)


def fp8_tile_rows(heads: int, rows: int) -> int:
    """Rows per program of the fp8 ragged kernel for ``rows`` packed rows (heads x the most draft tokens): all of them
    up to ``FP8_TILE_MAX_ROWS``; above, the most whole draft tokens' rows that fit (heads x floor(32 / heads)), or
    with more heads than that the largest divisor of the heads that fits, so that every tile starts at a draft token's
    first row or lies inside one draft token (the tree mask is read by the tile's own rows)."""
    if heads < 1 or rows < 1:
        raise ValueError(f"heads and rows must be positive; got {heads} and {rows}")
    if rows <= FP8_TILE_MAX_ROWS:
        return rows
    if heads <= FP8_TILE_MAX_ROWS:
        return (FP8_TILE_MAX_ROWS // heads) * heads
    return max(d for d in range(1, FP8_TILE_MAX_ROWS + 1) if heads % d == 0)


def fp8_ragged_launch(tile_rows: int) -> tuple[int, Fp8Ring, int, int]:
    """(N, ring, warpgroup 1's registers, each converting warpgroup's) of a row tile of ``tile_rows``: up to 16 rows
    the fp8 pick's (gluon.fp8.ring_for: s22 at N 8, d2 at N 16), up to 32 an N of 32 in ``FP8_N32_RING``."""
    if tile_rows <= SWAP_MAX_ROWS:
        rn, ring = ring_for(tile_rows, None)
        return (rn, ring, *partition_regs(ring))
    if tile_rows > FP8_TILE_MAX_ROWS:
        raise ValueError(f"a row tile holds at most {FP8_TILE_MAX_ROWS} rows; got {tile_rows}")
    return (FP8_TILE_MAX_ROWS, FP8_RINGS[FP8_N32_RING], *FP8_N32_REGS)


def ragged_split_kv_gluon_fp8(q: torch.Tensor, kv: torch.Tensor, o: torch.Tensor, qo_indptr: torch.Tensor,
                              kv_indptr: torch.Tensor, kv_indices: torch.Tensor, draft_loc: torch.Tensor,
                              mask: torch.Tensor, mask_indptr: torch.Tensor, max_draft: int, sm_scale: float,
                              kv_scale: float = 1.0, cfg: SplitKVConfig | None = None,
                              num_sms: int | None = None) -> torch.Tensor:
    """Verify attention for a batch in SGLang's layout on an fp8 e4m3 cache (the module doc's fp8 paragraph); writes
    ``o`` [tokens, H, 512] (bf16) and returns it. ``kv`` [slots, (1,) 576] float8_e4m3fn holds the prefix rows and
    the draft rows at ``draft_loc`` (SGLang's out_cache_loc), each value ``kv_scale`` x its e4m3 (SGLang: the layer's
    k_scale, 1.0 without one); any row count (heads x ``max_draft``): up to 32 rows one row tile, more in tiles of
    ``fp8_tile_rows``, the splits shared out over the tiles so that the grid stays one program per SM; each row tile's
    ring as ``fp8_ragged_launch`` says. Every other argument as ``ragged_split_kv_gluon_ws``'s; no host
    synchronisation: safe under CUDA-graph capture."""
    if q.dim() != 3 or q.shape[-1] != D_QK or not q.is_contiguous() or q.dtype != torch.bfloat16:
        raise ValueError(f"q must be a contiguous bf16 [tokens, heads, {D_QK}]; got {q.dtype} {tuple(q.shape)}")
    kv2 = kv.reshape(kv.shape[0], -1)
    if kv2.dtype != torch.float8_e4m3fn:
        raise ValueError(f"kv must be the float8_e4m3fn cache (SGLang's fp8_e4m3 pool, viewed as its dtype); got "
                         f"{kv2.dtype}: for a bf16 cache use ragged_split_kv_gluon_ws")
    if kv2.shape[1] != D_QK or kv2.stride(1) != 1 or kv2.stride(0) % 16:
        raise ValueError("kv rows must hold 576 fp8 values (512 latent + 64 rope), unit inner stride, rows 16-byte "
                         "aligned")
    if o.dim() != 3 or o.shape[-1] != D_V or o.stride(-1) != 1 or o.dtype != q.dtype:
        raise ValueError(f"o must be bf16 [tokens, heads, {D_V}] with unit inner stride; got {o.dtype} "
                         f"{tuple(o.shape)}")
    if draft_loc.shape[0] < q.shape[0]:
        raise ValueError(f"draft_loc needs a cache slot per query token ({q.shape[0]}); got {draft_loc.shape[0]}")
    if not 0 < kv_scale <= MAX_KV_SCALE:
        raise ValueError(f"kv_scale must be in (0, {MAX_KV_SCALE:.1f}] (448 x scale within fp16's range, the tile's "
                         f"dtype); got {kv_scale}")
    heads = q.shape[1]
    batch = qo_indptr.shape[0] - 1
    max_rows = max_draft * heads
    tile_rows = fp8_tile_rows(heads, max_rows)
    n_row_tiles = -(-max_rows // tile_rows)
    rn, ring, pv_regs, convert_regs = fp8_ragged_launch(tile_rows)
    cfg = cfg or ragged_gluon_config(max_rows)
    if num_sms is None:
        num_sms = torch.cuda.get_device_properties(q.device).multi_processor_count
    n_splits = n_splits_for(max_rows, batch, num_sms, cfg, tile_rows=tile_rows)  # shared out over the row tiles
    mask_u8 = mask.view(torch.uint8) if mask.dtype == torch.bool else mask
    o_part = torch.empty(batch, n_splits, max_rows, D_V, device=q.device, dtype=torch.float32)
    lse_part = torch.empty(batch, n_splits, max_rows, device=q.device, dtype=torch.float32)
    _fp8_ragged_partial_kernel[(n_splits, batch, n_row_tiles)](
        q, kv2, kv_indices, draft_loc, mask_u8, qo_indptr, kv_indptr, mask_indptr, o_part, lse_part,
        float(sm_scale) * LOG2E, fp16_pair_bits(float(kv_scale)), heads, n_splits, max_rows, cfg.min_split_tokens,
        kv2.stride(0), tile_rows, BLOCK_N=cfg.block_n, SB=ring.sb, S8=ring.s8, RN=rn, D_NOPE=D_NOPE, D_PE=D_PE, D_HALF=D_HALF,
        num_warps=WS_PARTITION_WARPS, PV_REGS=pv_regs, CONVERT_REGS=convert_regs, ROUND=cfg.split_round_tokens,
    )
    return ragged_merge(o_part, lse_part, o, qo_indptr, kv_indptr, cfg)


def compile_sm90(dtype: str = "bf16", qo_indptr: str = "i32", kv_indptr: str = "i32",
                 mask_indptr: str = "i64", swap_rn: int = 0, fp8_rows: int = 0,
                 round_tokens: int = BLOCK_TOKENS) -> "triton.compiler.CompiledKernel":
    """The ragged partial kernel compiled ahead of time for sm_90 (no GPU needed), as the plugin launches it, with the
    index dtypes SGLang passes (int32 qo_indptr in eager calls, int64 in its CUDA-graph buffers); ``swap_rn`` 8 or 16:
    the rows-as-N kernel with that N instead; ``fp8_rows``: the fp8 kernel as a call of that many rows launches it
    (its row tile's N and ring; bf16 q); ``round_tokens``:
    the splits' round (``SplitKVConfig.split_round_tokens``)."""
    if fp8_rows:
        return _compile_fp8_sm90(fp8_rows, qo_indptr, kv_indptr, mask_indptr, round_tokens)
    from triton.backends.compiler import GPUTarget  # noqa: PLC0415
    from triton.experimental.gluon._runtime import GluonASTSource  # noqa: PLC0415

    sig = {"Q": f"*{dtype}", "KV": f"*{dtype}", "KV_INDICES": "*i64", "DRAFT_LOC": "*i64", "MASK": "*u8",
           "QO_INDPTR": f"*{qo_indptr}", "KV_INDPTR": f"*{kv_indptr}", "MASK_INDPTR": f"*{mask_indptr}",
           "O_PART": "*fp32", "LSE_PART": "*fp32",
           "qk_scale": "fp32", "n_heads": "i32", "n_splits": "i32", "max_rows": "i32", "min_split_tokens": "i32",
           "stride_kv": "i32"}
    if swap_rn:
        const = {"BLOCK_N": 64, "STAGES": 2, "RN": swap_rn, "D_NOPE": D_NOPE, "D_PE": D_PE, "D_HALF": D_HALF,
                 "num_warps": WS_PARTITION_WARPS, "WORKER_REGS": WS_WORKER_REGS, "ROUND": round_tokens}
    else:
        const = {"BLOCK_M": GLUON_BLOCK_M, "BLOCK_N": 64, "STAGES": 2, "D_NOPE": D_NOPE, "D_PE": D_PE,
                 "D_HALF": D_HALF, "num_warps": WS_PARTITION_WARPS, "WORKER_REGS": WS_WORKER_REGS,
                 "ROUND": round_tokens}
    sig.update({k: "constexpr" for k in const})
    attrs = {(i,): [["tt.divisibility", 16]] for i, k in enumerate(sig)
             if k in ("Q", "KV", "KV_INDICES", "DRAFT_LOC", "O_PART", "LSE_PART", "stride_kv", "min_split_tokens")}
    kernel = _swap_ragged_partial_kernel if swap_rn else _ws_ragged_partial_kernel
    return triton.compile(GluonASTSource(kernel, sig, const, attrs), target=GPUTarget("cuda", 90, 32),
                          options={"num_warps": WS_PARTITION_WARPS})


def _compile_fp8_sm90(rows: int, qo_indptr: str, kv_indptr: str, mask_indptr: str,
                      round_tokens: int = BLOCK_TOKENS) -> "triton.compiler.CompiledKernel":
    from triton.backends.compiler import GPUTarget  # noqa: PLC0415
    from triton.experimental.gluon._runtime import GluonASTSource  # noqa: PLC0415

    rn, ring, pv_regs, convert_regs = fp8_ragged_launch(min(rows, FP8_TILE_MAX_ROWS))
    sig = {"Q": "*bf16", "KV8": "*fp8e4nv", "KV_INDICES": "*i64", "DRAFT_LOC": "*i64", "MASK": "*u8",
           "QO_INDPTR": f"*{qo_indptr}", "KV_INDPTR": f"*{kv_indptr}", "MASK_INDPTR": f"*{mask_indptr}",
           "O_PART": "*fp32", "LSE_PART": "*fp32", "qk_scale": "fp32", "kv_scale2": "i32", "n_heads": "i32",
           "n_splits": "i32", "max_rows": "i32", "min_split_tokens": "i32", "stride_kv": "i32", "tile_rows": "i32"}
    const = {"BLOCK_N": 64, "SB": ring.sb, "S8": ring.s8, "RN": rn, "D_NOPE": D_NOPE, "D_PE": D_PE, "D_HALF": D_HALF,
             "num_warps": WS_PARTITION_WARPS, "PV_REGS": pv_regs, "CONVERT_REGS": convert_regs,
             "ROUND": round_tokens}
    sig.update({k: "constexpr" for k in const})
    attrs = {(i,): [["tt.divisibility", 16]] for i, k in enumerate(sig)
             if k in ("Q", "KV8", "KV_INDICES", "DRAFT_LOC", "O_PART", "LSE_PART", "stride_kv", "min_split_tokens")}
    return triton.compile(GluonASTSource(_fp8_ragged_partial_kernel, sig, const, attrs),
                          target=GPUTarget("cuda", 90, 32), options={"num_warps": WS_PARTITION_WARPS})
