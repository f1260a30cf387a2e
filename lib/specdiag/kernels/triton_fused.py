"""Single-launch split-KV MLA verify attention (issue 13): the merge done by the last program of each row tile.

The split loop is the run-2 design of :mod:`specdiag.kernels.triton_splitkv` (rows = heads x draft tokens
packed into ``block_m`` tiles, the KV cut into ``n_splits`` chunks of a multiple of 64 tokens, an unmasked
prefix loop then a bounds-checked, tree-masked tail). What changes is the end of each program:

- it writes its normalized partial output (bf16 when ``partial_bf16``, else fp32) and its base-2
  log-sum-exp, waits for all its threads (a CTA barrier), then increments the row tile's arrival counter
  with one acquire-release atomic (gpu scope; the release covers the barrier-ordered partial stores);
- the merge is a two-level tree so no single program reads hundreds of partials serially (at h8 T1 with 264
  splits that would be 2 MB through one SM, ~20-30 us): splits are grouped by ``merge_group`` (16); the last
  program of a group to arrive (its group counter reads group size - 1) merges the group's partials
  (``.cg`` loads: L2, never a stale L1 line) into an fp32 group partial; the last group to finish (a second
  per-tile counter) merges the groups and writes the output. With one group it writes the output directly.
  Every counter is reset to 0 by the program that consumed it, so the buffer serves the next call (CUDA graphs).

So one launch replaces two: no second kernel's launch, prologue and wave of tiny programs; the merge runs
on the last-arriving program while the others have already retired.

Run 5 changes (docs/kernel-notes.md "Run 5 (planned)"; compile facts from scripts/kernel_compile_report.py):

- the self-merge loops are ``tl.range(..., num_stages=merge_stages(block_m))``: the pipeliner async-copies the
  next partials while one is merged (run 4: a plain loop, one dependent L2 round trip per partial, 33 in a row);
- ``merge="auto"`` keeps the self-merge only under 64-row tiles (splitkv_plan.SELF_MERGE_MAX_BLOCK_M); 64-row tiles
  write their partials and run 2's merge kernel (triton_splitkv._merge_kernel, unchanged) runs as a second launch;
  ``merge="self"`` / ``"kernel"`` force one or the other.

FP8 KV (``KV_FP8``): the cache is float8_e4m3fn with one per-tensor scale (SGLang's fp8 latent cache); each tile
is loaded as fp8 (half the bytes) and upcast to the queries' 16-bit type for the tensor-core dots, the scale folded
into the score scale and applied once to the output (or to the partials when the merge kernel merges). Under
64-row tiles (mma.sync, ``FP8_KQ``) the scores are computed as K Q^T (the fp8 tile as the A operand; an fp8
transpose has no shared-memory path in Triton 3.6 and kept the tile out of the pipeliner) and the PV dot reads its
own copy of the tile (a second async copy of the same rows, from L2): every use of each load is then a dot operand
read from shared memory, so both are prefetched. 64-row tiles (wgmma) keep the convert-once form.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from specdiag.kernels.interpreter import interpreter_compat  # noqa: F401 - applied on import of specdiag.kernels
from specdiag.kernels.mla import BLOCK_TOKENS, D_NOPE, D_PE, D_QK, D_V, VerifyInputs
from specdiag.kernels.splitkv_plan import (SELF_MERGE_MAX_BLOCK_M, SplitKVConfig, default_fused_config, merge_stages,
                                          plan_splits)
from specdiag.kernels.triton_splitkv import _merge_kernel

LOG2E = 1.4426950408889634


@functools.lru_cache(maxsize=8)
def sm_count(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


@triton.jit
def _fused_kernel(
    Q, KV, TOKEN_TABLE, BLOCK_TABLE, MASK, O_PART, LSE_PART, G_PART, G_LSE, COUNTER, OUT,
    qk_scale, v_scale, n_prefix, n_kv, n_draft, n_heads, n_rows, n_splits, n_groups, tokens_per_split, stride_kv,
    PAGE_SIZE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    D_NOPE: tl.constexpr, D_PE: tl.constexpr, KV_FP8: tl.constexpr, FP8_KQ: tl.constexpr, DIRECT: tl.constexpr, GROUP: tl.constexpr,
    MERGE_STAGES: tl.constexpr, SELF_MERGE: tl.constexpr,
):
    pid_m = tl.program_id(0)
    pid_s = tl.program_id(1)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = rows < n_rows
    offs_d = tl.arange(0, D_NOPE)
    offs_pe = D_NOPE + tl.arange(0, D_PE)
    offs_n = tl.arange(0, BLOCK_N)
    q_row = Q + rows[:, None].to(tl.int64) * (D_NOPE + D_PE)
    q_nope = tl.load(q_row + offs_d[None, :], mask=row_ok[:, None], other=0.0)
    q_pe = tl.load(q_row + offs_pe[None, :], mask=row_ok[:, None], other=0.0)
    if FP8_KQ:
        q_nope_t = tl.trans(q_nope)
        q_pe_t = tl.trans(q_pe)

    start = pid_s * tokens_per_split
    end = tl.minimum(start + tokens_per_split, n_kv)
    # clamp with tensors only (a literal 0 here gives the interpreter a 1-element array that range() refuses)
    n_full = (tl.maximum(tl.minimum(end, n_prefix), start) - start) // BLOCK_N

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, D_NOPE], tl.float32)

    for it in range(0, n_full):  # full prefix tiles: every key visible, no bounds checks
        tile = start + it * BLOCK_N
        if PAGE_SIZE == 1:
            slot = tl.load(TOKEN_TABLE + tile + offs_n)
        else:
            blk = tl.load(BLOCK_TABLE + tile // PAGE_SIZE)
            slot = blk.to(tl.int64) * PAGE_SIZE + (tile % PAGE_SIZE) + offs_n
        kv_row = KV + slot[:, None].to(tl.int64) * stride_kv
        k_nope = tl.load(kv_row + offs_d[None, :])
        k_pe = tl.load(kv_row + offs_pe[None, :])
        if FP8_KQ:  # scores as K Q^T: the fp8 tile is the A operand, no fp8 transpose (see the module doc)
            v_fp8 = tl.load(kv_row + offs_d[None, :], eviction_policy="evict_first")  # the PV dot's own copy (L2)
            s = tl.dot(k_nope.to(q_nope.dtype), q_nope_t)
            s = tl.trans(tl.dot(k_pe.to(q_nope.dtype), q_pe_t, s))
            k_nope = v_fp8
        else:
            if KV_FP8:
                k_nope = k_nope.to(q_nope.dtype)
                k_pe = k_pe.to(q_nope.dtype)
            s = tl.dot(q_nope, tl.trans(k_nope))
            s = tl.dot(q_pe, tl.trans(k_pe), s)
        s = s * qk_scale
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None]
        acc = tl.dot(p.to(q_nope.dtype), k_nope.to(q_nope.dtype), acc)
        m_i = m_new

    draft_row = rows // n_heads
    for tile in range(start + n_full * BLOCK_N, end, BLOCK_N):  # partial prefix tile and draft block
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
        if KV_FP8:
            k_nope = k_nope.to(q_nope.dtype)
            k_pe = k_pe.to(q_nope.dtype)
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
    if DIRECT:  # one split: this program is the whole row tile
        o = acc * (v_scale / l_safe)[:, None]
        tl.store(OUT + rows[:, None].to(tl.int64) * D_NOPE + offs_d[None, :], o.to(OUT.dtype.element_ty),
                 mask=row_ok[:, None])
    else:
        if SELF_MERGE:
            o = acc / l_safe[:, None]
        else:  # run 2's merge kernel applies no scale: fold the fp8 scale into the partial (the merge is linear)
            o = acc * (v_scale / l_safe)[:, None]
        part_row = pid_s.to(tl.int64) * n_rows + rows
        tl.store(O_PART + part_row[:, None] * D_NOPE + offs_d[None, :], o.to(O_PART.dtype.element_ty),
                 mask=row_ok[:, None])
        lse = tl.where(l_i > 0, m_i + tl.log2(l_safe), float("-inf"))
        tl.store(LSE_PART + part_row, lse, mask=row_ok)
    if not DIRECT and SELF_MERGE:  # else the second launch (triton_splitkv._merge_kernel) merges
        tl.debug_barrier()  # every thread's partial stores happen before the release below
        group = pid_s // GROUP
        g_lo = group * GROUP
        g_hi = tl.minimum(g_lo + GROUP, n_splits)
        arrived = tl.atomic_add(COUNTER + pid_m * (n_groups + 1) + group, 1, sem="acq_rel", scope="gpu")
        if arrived == g_hi - g_lo - 1:  # the last split of its group to finish: merge the group
            tl.debug_barrier()
            o_g, lse_g = _merge_range(O_PART, LSE_PART, g_lo, g_hi, n_rows, rows, row_ok, offs_d, BLOCK_M, D_NOPE, MERGE_STAGES)
            tl.atomic_xchg(COUNTER + pid_m * (n_groups + 1) + group, 0, sem="relaxed", scope="gpu")
            if n_groups == 1:
                tl.store(OUT + rows[:, None].to(tl.int64) * D_NOPE + offs_d[None, :],
                         (o_g * v_scale).to(OUT.dtype.element_ty), mask=row_ok[:, None])
            else:  # second level: the last group to finish merges the groups' results
                grow = group.to(tl.int64) * n_rows + rows
                tl.store(G_PART + grow[:, None] * D_NOPE + offs_d[None, :], o_g, mask=row_ok[:, None])
                tl.store(G_LSE + grow, lse_g, mask=row_ok)
                tl.debug_barrier()
                done = tl.atomic_add(COUNTER + pid_m * (n_groups + 1) + n_groups, 1, sem="acq_rel", scope="gpu")
                if done == n_groups - 1:
                    tl.debug_barrier()
                    o, lse = _merge_range(G_PART, G_LSE, 0, n_groups, n_rows, rows, row_ok, offs_d, BLOCK_M, D_NOPE, MERGE_STAGES)
                    tl.store(OUT + rows[:, None].to(tl.int64) * D_NOPE + offs_d[None, :],
                             (o * v_scale).to(OUT.dtype.element_ty), mask=row_ok[:, None])
                    tl.atomic_xchg(COUNTER + pid_m * (n_groups + 1) + n_groups, 0, sem="relaxed", scope="gpu")


@triton.jit
def _merge_range(O_PART, LSE_PART, lo, hi, n_rows, rows, row_ok, offs_d, BLOCK_M: tl.constexpr, D: tl.constexpr,
                 MERGE_STAGES: tl.constexpr):
    """LSE-merge partials lo..hi-1 of these rows (``.cg`` loads: written by other programs); returns (o, lse)."""
    m_run = tl.full([BLOCK_M], float("-inf"), tl.float32)
    w_sum = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, D], tl.float32)
    # tl.range with num_stages: the pipeliner async-copies the next partials while this one is merged (a plain
    # range() loop has no dot, so Triton 3.6 leaves it unpipelined: one dependent L2 round trip per partial)
    for sp in tl.range(lo, hi, num_stages=MERGE_STAGES):
        prow = sp * n_rows + rows.to(tl.int64)
        lse_s = tl.load(LSE_PART + prow, mask=row_ok, other=float("-inf"), cache_modifier=".cg")
        o_s = tl.load(O_PART + prow[:, None] * D + offs_d[None, :], mask=row_ok[:, None], other=0.0,
                      cache_modifier=".cg")
        m_new = tl.maximum(m_run, lse_s)
        m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp2(m_run - m_use)
        w = tl.exp2(lse_s - m_use)
        acc = acc * alpha[:, None] + w[:, None] * o_s.to(tl.float32)
        w_sum = w_sum * alpha + w
        m_run = m_new
    w_safe = tl.where(w_sum > 0, w_sum, 1.0)
    lse = tl.where(w_sum > 0, m_run + tl.log2(w_safe), float("-inf"))
    return acc / w_safe[:, None], lse


_COUNTERS: dict[tuple[str, int], torch.Tensor] = {}


def _counters(device: str, n: int) -> torch.Tensor:
    """Arrival counters (per row tile: one per split group and one for the groups), zero between calls."""
    key = (device, max(n, 1))
    if key not in _COUNTERS:
        _COUNTERS[key] = torch.zeros(key[1], dtype=torch.int32, device=device)
    return _COUNTERS[key]


def fused_split_kv_triton(inputs: VerifyInputs, out: torch.Tensor, page_size: int = 1,
                          cfg: SplitKVConfig | None = None, num_sms: int | None = None,
                          kv_fp8: bool = False, merge_group: int = 16, merge: str = "auto") -> torch.Tensor:
    """Single-launch split-KV verify; writes ``out`` [T, H, 512] bf16 and returns it.

    ``kv_fp8`` reads ``inputs.cache_fp8`` (float8_e4m3fn, per-tensor ``inputs.kv_scale``) instead of the bf16
    cache: make it with :func:`specdiag.kernels.mla.with_fp8_cache`. Runs on CUDA, or on the CPU under
    Triton's interpreter (TRITON_INTERPRET=1; pass ``num_sms``).
    """
    q = inputs.q
    cache = inputs.cache_fp8 if kv_fp8 else inputs.cache
    if cache is None:
        raise ValueError("kv_fp8 needs inputs.cache_fp8: make the inputs with mla.with_fp8_cache(inputs)")
    if not (q.is_contiguous() and q.shape[-1] == D_QK and cache.shape[-1] == D_QK and cache.stride(1) == 1):
        raise ValueError("fused_split_kv_triton needs contiguous q [T, H, 576] and cache rows [pool, 576]")
    if not out.is_contiguous():
        raise ValueError("fused_split_kv_triton needs a contiguous out [T, H, 512]")
    T, H = inputs.draft_tokens, inputs.heads
    rows, n_kv = T * H, inputs.n_kv
    cfg = cfg or default_fused_config(rows, kv_fp8=kv_fp8)
    if cfg.dv_split != 1:
        raise ValueError("the fused kernel keeps all 512 value dims per program (dv_split 1)")
    if cfg.qk_once:
        raise ValueError("qk_once is a form of the two-launch split kernel (triton_splitkv), not of the fused kernel")
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
    if num_sms is None:
        num_sms = sm_count(q.device.index or 0)
    if merge not in ("auto", "self", "kernel"):
        raise ValueError(f"merge must be 'auto', 'self' or 'kernel'; got {merge!r}")
    if cfg.join_tail_tokens:
        raise ValueError("join_tail_tokens is for split_kv_triton and split_kv_gluon_ws, whose last split ends at "
                         "n_kv; the fused kernel's splits all end at their share: use join_tail_tokens 0")
    self_merge = merge == "self" or (merge == "auto" and cfg.block_m < SELF_MERGE_MAX_BLOCK_M)
    plan = plan_splits(rows, n_kv, cfg, num_sms)
    direct = plan.n_splits == 1
    n_groups = -(-plan.n_splits // merge_group)
    if direct:
        o_part, lse_part, counter, g_part, g_lse = out, out, out, out, out  # unused when DIRECT
    else:
        o_part = torch.empty(plan.n_splits, rows, D_V, device=q.device,
                             dtype=q.dtype if cfg.partial_bf16 else torch.float32)  # q: bf16 (fp16 in interpreter tests)
        lse_part = torch.empty(plan.n_splits, rows, device=q.device, dtype=torch.float32)
        counter = _counters(str(q.device), plan.n_tiles * (n_groups + 1)) if self_merge else lse_part
        g_part = torch.empty(max(n_groups, 1) if n_groups > 1 else 1, rows, D_V, device=q.device, dtype=torch.float32)
        g_lse = torch.empty(max(n_groups, 1) if n_groups > 1 else 1, rows, device=q.device, dtype=torch.float32)
    v_scale = float(inputs.kv_scale) if kv_fp8 else 1.0
    _fused_kernel[(plan.n_tiles, plan.n_splits)](
        q, cache, inputs.token_table, block_table, inputs.mask_u8, o_part, lse_part, g_part, g_lse, counter, out,
        inputs.sm_scale * LOG2E * v_scale, v_scale, inputs.n_prefix, n_kv, T, H, rows, plan.n_splits, n_groups,
        plan.tokens_per_split, cache.stride(0),
        PAGE_SIZE=page_size, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, D_NOPE=D_NOPE, D_PE=D_PE,
        KV_FP8=kv_fp8, FP8_KQ=kv_fp8 and cfg.block_m < 64, DIRECT=direct, GROUP=merge_group,
        MERGE_STAGES=merge_stages(cfg.block_m), SELF_MERGE=self_merge,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )
    if not direct and not self_merge:  # run 2's merge kernel, unchanged, as the second launch
        block_dv = cfg.merge_block_dv
        block_s = max(2, min(triton.next_power_of_2(plan.n_splits), 4096 // block_dv))
        _merge_kernel[(rows, D_V // block_dv)](
            o_part, lse_part, out, plan.n_splits, rows,
            BLOCK_S=block_s, BLOCK_DV=block_dv, D_V=D_V, num_warps=4,
        )
    return out
