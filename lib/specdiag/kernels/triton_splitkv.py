"""Split-KV MLA verify attention in Triton: the whole GPU on one request.

The kernel A/B's ``split_triton`` (token table) and ``split_triton_b64`` (64-token pages) arms run it with
``default_config``; its merge launch (:func:`merge_partials`) is also the dense Gluon kernels' (gluon_ws, gluon_ws_swap,
gluon_ws_fp8). The plugin's Triton fallback is the same design on SGLang's layout (triton_splitkv_ragged).

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
- Scores once (``qk_once``; off in everything that ships): with 64-row tiles and 8 warps Triton
  3.6 lays Q K^T out for both warpgroups (a dot whose result feeds another dot gets numWarps x 1 warps, 128 rows
  of warps over 64 rows of scores), so each warpgroup computes the whole score tile. With ``qk_once`` the full-tile
  loop hands P and the rescale factor to the P V dot through a per-program scratch in global memory (L1) after a
  CTA barrier: no SSA path from the scores to a dot, so Q K^T is laid out 4 x 2 (each warpgroup half the keys).
  The barrier and the loads are inline PTX (``bar.sync 0``; ``ld.relaxed.cta``): a ``gpu.barrier`` in the loop
  keeps Triton from pipelining it, and a ``tt.load`` of the scratch would be prefetched by the pipeliner before
  the iteration that writes it. Under Triton's interpreter (no inline PTX) tl.debug_barrier and tl.load stand in.
- Merge: each split writes its normalized partial output (fp32, or bf16 when ``partial_bf16``)
  and its base-2 log-sum-exp; a second kernel with one program per (row, 64 value dims) weights the
  partials by exp2(lse - max lse). With a single split the first kernel writes the output directly.

Off in everything that ships, and kept so that the kernels compile as they ship: ``qk_once``, ``dv_split`` > 1,
``evict_first``, ``partial_bf16`` (SplitKVConfig fields), and the launcher's ``timeline``, ``partial_only`` and
caller-owned partial buffers, which time the partial kernel and the merge apart.
"""

from __future__ import annotations

import functools
import os

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from specdiag.kernels.mla import BLOCK_TOKENS, D_NOPE, D_PE, D_QK, D_V, VerifyInputs
from specdiag.kernels.split_merge import MERGE_ONE_PASS_ELEMS, merge_block, merge_one_pass, merge_two_pass  # noqa: F401
from specdiag.kernels.splitkv_plan import SplitKVConfig, default_config, describe_plan, plan_splits  # noqa: F401

LOG2E = 1.4426950408889634


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


@functools.lru_cache(maxsize=8)
def sm_count(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


@triton.jit
def _cta_sync(x):
    """``x`` returned through ``bar.sync 0`` (every thread of the CTA): loads addressed by the result come after
    the barrier, which orders the CTA's earlier global stores before them (PTX barrier memory ordering)."""
    return tl.inline_asm_elementwise("bar.sync 0;\n\tmov.b32 $0, $1;", "=r,r", [x], dtype=tl.int32, is_pure=False,
                                     pack=1)


@triton.jit
def _globaltimer():
    """The GPU's global nanosecond timer (``%globaltimer``, one clock for every SM)."""
    return tl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l", [], dtype=tl.int64, is_pure=False, pack=1)


@triton.jit
def _smid():
    """The SM this program runs on (``%smid``)."""
    return tl.inline_asm_elementwise("mov.u32 $0, %smid;", "=r", [], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def _ld_cta_f32(ptrs):
    """fp32 loads as inline PTX (``ld.relaxed.cta.global``): not a tt.load, so the pipeliner never prefetches them."""
    return tl.inline_asm_elementwise("ld.relaxed.cta.global.f32 $0, [$1];", "=f,l", [ptrs], dtype=tl.float32,
                                     is_pure=False, pack=1)


@triton.jit
def _split_partial_kernel(
    Q, KV, TOKEN_TABLE, BLOCK_TABLE, MASK, O_PART, LSE_PART, P_SCR,
    qk_scale, n_prefix, n_kv, n_draft, n_heads, n_rows, tokens_per_split, stride_kv,
    PAGE_SIZE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    D_NOPE: tl.constexpr, D_PE: tl.constexpr, EVICT: tl.constexpr, DIRECT: tl.constexpr,
    DV_SPLIT: tl.constexpr, QK_ONCE: tl.constexpr, ASM: tl.constexpr, PDL: tl.constexpr = False,
    TIMELINE: tl.constexpr = False, TL=None,
):
    pid_m = tl.program_id(0)  # row tile x DV_SPLIT + value part
    pid_s = tl.program_id(1)
    if TIMELINE:  # per-program timeline, off in everything that ships: entry, full-tile loop's end, stores; SM
        tl_row = TL + (pid_s * tl.num_programs(0) + pid_m).to(tl.int64) * 4
        tl.store(tl_row, _globaltimer())
        tl.store(tl_row + 3, _smid().to(tl.int64))
    D_VP: tl.constexpr = D_NOPE // DV_SPLIT  # value dims this program accumulates
    dv_part = pid_m % DV_SPLIT
    rows = (pid_m // DV_SPLIT) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_v = dv_part * D_VP + tl.arange(0, D_VP)
    row_ok = rows < n_rows
    offs_d = tl.arange(0, D_NOPE)
    offs_pe = D_NOPE + tl.arange(0, D_PE)
    offs_n = tl.arange(0, BLOCK_N)
    q_row = Q + rows[:, None].to(tl.int64) * (D_NOPE + D_PE)
    q_nope = tl.load(q_row + offs_d[None, :], mask=row_ok[:, None], other=0.0)
    q_pe = tl.load(q_row + offs_pe[None, :], mask=row_ok[:, None], other=0.0)

    start = pid_s * tokens_per_split
    end = tl.minimum(start + tokens_per_split, n_kv)
    if pid_s == tl.num_programs(1) - 1:  # the last split ends at n_kv: with join_tail_tokens, past its share
        end = n_kv
    n_full = tl.maximum(tl.minimum(end, n_prefix) - start, 0) // BLOCK_N

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, D_VP], tl.float32)
    if QK_ONCE:  # this program's scratch: two slots (by iteration parity) of P [BLOCK_M, BLOCK_N] and alpha [BLOCK_M]
        offs_m = tl.arange(0, BLOCK_M)
        scr = (pid_s * tl.num_programs(0) + pid_m).to(tl.int64) * (2 * BLOCK_M * (BLOCK_N + 1))
        p_scr = P_SCR + scr + offs_m[:, None] * BLOCK_N + offs_n[None, :]
        a_scr = P_SCR + scr + BLOCK_M * BLOCK_N + offs_m

    # full prefix tiles: every key visible, no bounds checks
    for it in range(0, n_full):
        tile = start + it * BLOCK_N
        if PAGE_SIZE == 1:
            slot = tl.load(TOKEN_TABLE + tile + offs_n)
        else:
            blk = tl.load(BLOCK_TABLE + tile // PAGE_SIZE)
            slot = blk.to(tl.int64) * PAGE_SIZE + (tile % PAGE_SIZE) + offs_n
        kv_row = KV + slot[:, None].to(tl.int64) * stride_kv
        k_nope = tl.load(kv_row + offs_d[None, :], eviction_policy=EVICT)
        k_pe = tl.load(kv_row + offs_pe[None, :], eviction_policy=EVICT)
        if QK_ONCE:  # two dots summed: a dot that feeds the next one as its accumulator is itself "chained"
            s = tl.dot(q_nope, tl.trans(k_nope)) * qk_scale + tl.dot(q_pe, tl.trans(k_pe)) * qk_scale
        else:
            s = tl.dot(q_nope, tl.trans(k_nope))
            s = tl.dot(q_pe, tl.trans(k_pe), s)
            s = s * qk_scale
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        if QK_ONCE:  # P and alpha to the P V dot through the scratch (see the module doc)
            par = (it % 2) * (BLOCK_M * (BLOCK_N + 1))
            tl.store(p_scr + par, p)
            tl.store(a_scr + par, alpha)
            if ASM:
                par = _cta_sync(par)
                p = _ld_cta_f32(p_scr + par)
                alpha = _ld_cta_f32(a_scr + par)
            else:
                tl.debug_barrier()
                p = tl.load(p_scr + par)
                alpha = tl.load(a_scr + par)
        acc = acc * alpha[:, None]
        if DV_SPLIT == 1:
            acc = tl.dot(p.to(k_nope.dtype), k_nope, acc)
        else:  # this program's share of the value dims (the rows are in L2: a sibling program loads them too)
            v = tl.load(kv_row + offs_v[None, :], eviction_policy=EVICT)
            acc = tl.dot(p.to(v.dtype), v, acc)
        m_i = m_new

    if TIMELINE:
        tl.store(tl_row + 1, _globaltimer())
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
        if DV_SPLIT == 1:
            acc = tl.dot(p.to(k_nope.dtype), k_nope, acc)
        else:
            v = tl.load(kv_row + offs_v[None, :], mask=ok[:, None], other=0.0)
            acc = tl.dot(p.to(v.dtype), v, acc)
        m_i = m_new

    if PDL:  # the merge grid may be scheduled now; its griddepcontrol.wait still waits for this grid's stores
        gdc_launch_dependents()
    l_safe = tl.where(l_i > 0, l_i, 1.0)
    o = acc / l_safe[:, None]
    part_row = pid_s.to(tl.int64) * n_rows + rows
    tl.store(O_PART + part_row[:, None] * D_NOPE + offs_v[None, :], o.to(O_PART.dtype.element_ty),
             mask=row_ok[:, None])
    if not DIRECT:
        lse = tl.where(l_i > 0, m_i + tl.log2(l_safe), float("-inf"))
        tl.store(LSE_PART + part_row, lse, mask=row_ok & (dv_part == 0))
    if TIMELINE:
        tl.debug_barrier()  # every thread's stores issued
        tl.store(tl_row + 2, _globaltimer())


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


def split_kv_triton(inputs: VerifyInputs, out: torch.Tensor, page_size: int = 1,
                    cfg: SplitKVConfig | None = None, num_sms: int | None = None,
                    partial_only: bool = False, timeline: torch.Tensor | None = None,
                    o_part: torch.Tensor | None = None, lse_part: torch.Tensor | None = None) -> torch.Tensor:
    """Run split-KV verify attention on CUDA; writes ``out`` [T, H, 512] bf16 and returns it.

    page_size 1 reads ``inputs.token_table``; page_size 64 reads ``inputs.block_table``.
    The last four arguments are off in everything that ships and serve to time the two launches apart:
    ``partial_only`` skips the merge (``out`` is then not written), for timing the first kernel alone.
    ``timeline`` (int64, 4 per program, CUDA only): each partial program writes its %globaltimer at entry, at the end
    of its full-tile loop and after its stores (ns), and its %smid.
    ``o_part`` / ``lse_part``: the caller's partial buffers ([splits, rows, 512], [splits, rows]; fp32 or bf16 as
    ``cfg.partial_bf16`` says) instead of new ones, so a caller can time the merge alone on them.
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
    if cfg.qk_once and cfg.dv_split != 1:
        raise ValueError("qk_once keeps all 512 value dims per program: use dv_split 1")
    plan = plan_splits(rows, n_kv, cfg, num_sms or sm_count(q.device.index or 0))
    direct = plan.n_splits == 1
    pdl = cfg.pdl and not _interpreting()  # griddepcontrol is PTX: the interpreter runs the plain two launches
    if direct:
        o_part, lse_part = out, out  # lse_part unused when DIRECT
    elif o_part is None or lse_part is None:
        o_part = torch.empty(plan.n_splits, rows, D_V, device=q.device,
                             dtype=torch.bfloat16 if cfg.partial_bf16 else torch.float32)
        lse_part = torch.empty(plan.n_splits, rows, device=q.device, dtype=torch.float32)
    elif tuple(o_part.shape) != (plan.n_splits, rows, D_V) or tuple(lse_part.shape) != (plan.n_splits, rows):
        raise ValueError(f"o_part / lse_part must be [{plan.n_splits}, {rows}, {D_V}] / [{plan.n_splits}, {rows}] "
                         f"(this plan's splits and rows); got {tuple(o_part.shape)} / {tuple(lse_part.shape)}")
    n_programs = plan.n_tiles * cfg.dv_split * plan.n_splits
    p_scr = (torch.empty(n_programs * 2 * cfg.block_m * (cfg.block_n + 1), device=q.device, dtype=torch.float32)
             if cfg.qk_once else lse_part)  # lse_part: unused by the kernel without qk_once
    _split_partial_kernel[(plan.n_tiles * cfg.dv_split, plan.n_splits)](
        q, cache, inputs.token_table, block_table, inputs.mask_u8, o_part, lse_part, p_scr,
        inputs.sm_scale * LOG2E, inputs.n_prefix, n_kv, T, H, rows, plan.tokens_per_split, cache.stride(0),
        PAGE_SIZE=page_size, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, D_NOPE=D_NOPE, D_PE=D_PE,
        EVICT="evict_first" if cfg.evict_first else "", DIRECT=direct, DV_SPLIT=cfg.dv_split,
        QK_ONCE=cfg.qk_once, ASM=cfg.qk_once and not _interpreting(), PDL=pdl and not direct,
        TIMELINE=timeline is not None, TL=timeline,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )
    if not direct and not partial_only:
        merge_partials(o_part, lse_part, out, cfg, pdl=pdl)
    return out


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
