"""The pick's rows-as-N kernel on an fp8 e4m3 latent cache: half the bytes read, the math in fp16.

Why: SGLang serves MLA with an ``fp8_e4m3`` KV cache (``--kv-cache-dtype fp8_e4m3``: one per-tensor scale), where a
verify step reads half the bytes of a bf16 cache. A Triton split-KV kernel that loads each fp8 tile and upcasts it
inside its loop for the tensor-core dots took 3-3.5x the bf16 pick's time on the H200. This is gluon.swap's kernel
(the rows as the wgmma's N, up to 16 rows) with a partition that brings fp8 tiles in and converts them for the tensor
cores:

- **the conversion**: e4m3 -> fp16 is exact, so each tile is converted once into the pick's swizzled operand layout
  in fp16 and multiplied by the cache's scale in one fp16 rounding; the math (Q, converted once in ``store_q``, P and
  both wgmmas) runs in fp16, whose 11-bit significand holds every bf16 query exactly. Through int32 words of four
  e4m3 (``_e4m3x4_to_f16``: ``cvt.rn.f16x2.e4m3x2``).
- **the staged form** (a ring ``s8 > 0``; ``_fp8_copy_convert_partition``, warpgroup 2): the token-table gather of
  each tile with ``cp.async`` (576 B a token: 36 16-byte copies where bf16 takes 72) into ``s8`` staging tiles, each
  converted into one of ``sb`` fp16 tiles once warpgroups 0 and 1 have freed it. The default up to 8 rows (s22).
- **the direct form** (``s8 == 0``; ``_fp8_loader_partition``, warpgroups 2 and 3): each loads every other tile into
  registers two tiles ahead and converts it there; no staging buffer. The default from 9 to 16 rows (d2).
- **warpgroups 0 and 1**: the pick's rows-as-N softmax partition and the P V partition of warpgroup 1
  (gluon.swap ``_swap_pv_partition``), reading the fp16 tiles as the bf16 kernel reads its own.

Rings (``FP8_RINGS``; shared memory compiled for sm_90 here, 232,448 B the limit): s22 (two fp16 tiles, two staging
tiles: 231,808 B at 8 rows) and d2 (two fp16 tiles, 168,344 B at 16 rows). The fp8 pick runs s22 up to 8 rows and d2
above (``DEFAULT_RINGS``), the fastest of the rings measured on the H200 at each.

Measured on the H200: correct on every shape and ring tested (1.65-1.74e-3 against the fp32 reference of the
dequantized cache: the bf16 output's rounding; 0.67-1.28e-2 against the bf16 cache's: the quantization); 0.84-0.89 of
the bf16 pick's time at 8 rows (s22), 0.95-1.01 at 16 (d2). Not the half that the bytes would allow: per-phase cycle
counts show the conversion (1,600-2,200 cycles of a warpgroup per 64-token tile) and warpgroup 0's chain (whose
softmax slows from 722 to 1,200-1,800 cycles beside a converting warpgroup) in series, the bottleneck moving between
them across the forms while the tile's cost stays at 3,800-4,400 cycles. Neither the random placement of the cache
rows nor the conversion's instructions (integer instructions instead of the cvt pipe were no faster) is
what sets it.

Chain or tree drafts, page_size 1 (token table), bf16 queries, CUDA sm_90 only (the CPU tests compile it for sm_90).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier

from specdiag.kernels.gluon.ws import WS_PARTITION_WARPS, _issue_first_tiles, _refill, _tile_slots, split_bounds
from specdiag.kernels.gluon.swap import D_HALF, FIT_ROWS, SWAP_MAX_ROWS, _swap_pv_partition, _swap_softmax_partition
from specdiag.kernels.merge import merge_partials
from specdiag.kernels.mla import BLOCK_TOKENS, D_NOPE, D_PE, D_QK, D_V, FP16_MAX, LOG2E, MAX_KV_SCALE, VerifyInputs
from specdiag.kernels.plan import SplitKVConfig, SplitPlan, gluon_config, plan_splits, sm_count

#: registers per thread of warpgroup 1 (its half of O^T: 16-32 at N 8-16, P^T's reads) and of the staged form's
#: converting warpgroup (the token-table rows a tile ahead, the copies' addresses, a chunk of words being converted)
PV_REGS = 96
CONVERT_REGS = 168
#: the direct form's: warpgroup 1 and each of the two loading warpgroups (512 threads share the 64K registers)
DIRECT_PV_REGS = 88
LOADER_REGS = 128


@dataclass(frozen=True)
class Fp8Ring:
    """How the fp8 tiles reach the tensor cores (module doc)."""

    sb: int  #: fp16 tiles the tensor cores read (the ring warpgroups 0 and 1 free)
    s8: int  #: the staged form's fp8 staging tiles (cp.async, one converting warpgroup); 0: the direct form
    max_rows: int  #: the largest N (packed rows) whose Q and P^T fit sm_90's shared memory beside the rings


#: the rings that fit sm_90's shared memory, by name (the launchers' ``rings``)
FP8_RINGS: dict[str, Fp8Ring] = {
    "s22": Fp8Ring(2, 2, FIT_ROWS),  # staged: two of each, at an N of 8 (the default up to 8 rows)
    "d2": Fp8Ring(2, 0, SWAP_MAX_ROWS),  # direct: two fp16 tiles, two loading warpgroups (the default at 9-16 rows)
}
#: columns of the tile converted at once (a register chunk of the converting warpgroup)
CONVERT_COLS: gl.constexpr = gl.constexpr(128)


@gluon.jit
def _convert_tile(st_nope, st_pe, kv_buf, pe_buf, scale2, scale2_pe, BLOCK_N: gl.constexpr, D_NOPE: gl.constexpr,
                  D_PE: gl.constexpr, WARPS: gl.constexpr):
    """One fp8 staging tile [BLOCK_N, 576] -> the fp16 tile the tensor cores read (``_store_words``), read as int32
    words (the staging and fp16 buffers viewed as int32 with the same 128-byte swizzle), ``CONVERT_COLS`` columns at
    a time: 16 B of fp8 per thread and row, 32 B of fp16."""
    W: gl.constexpr = gl.BlockedLayout([1, 4], [4, 8], [WARPS, 1], [1, 0])  # [rows, 32] words: 128 fp8 a row
    W_PE: gl.constexpr = gl.BlockedLayout([1, 4], [8, 4], [WARPS, 1], [1, 0])  # [rows, 16] words: the 64 PE fp8
    I32: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=32, rank=2)
    CW: gl.constexpr = CONVERT_COLS // 4
    src = st_nope._reinterpret(gl.int32, [BLOCK_N, D_NOPE // 4], I32)
    dst = kv_buf._reinterpret(gl.int32, [BLOCK_N, D_NOPE // 2], I32)
    for c in gl.static_range(D_NOPE // CONVERT_COLS):
        _store_words(src.slice(c * CW, CW, dim=1).load(W), scale2, dst.slice(2 * c * CW, 2 * CW, dim=1))
    I32_64: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=64, element_bitwidth=32, rank=2)  # 64-B fp8 rows
    _store_words(st_pe._reinterpret(gl.int32, [BLOCK_N, D_PE // 4], I32_64).load(W_PE), scale2_pe,
                 pe_buf._reinterpret(gl.int32, [BLOCK_N, D_PE // 2], I32))


@gluon.jit
def _fp8_copy_convert_partition(st_nope, st_pe, st_ready, kv_smem, pe_smem, kv_ready, kv_free, KV8, TOKEN_TABLE,
                                DRAFT_TABLE, kv_scale2, n_prefix, start, end, n_iter, stride_kv,
                                BLOCK_N: gl.constexpr, SB: gl.constexpr, S8: gl.constexpr, D_NOPE: gl.constexpr,
                                D_PE: gl.constexpr, WARPS: gl.constexpr, RAGGED: gl.constexpr):
    """Warpgroup 2 of the staged form: the fp8 tiles' copies into the staging ring and their conversion into the
    fp16 ring (module doc). The copies are the pick's (gluon.ws ``_issue_first_tiles`` / ``_refill``: token-table
    rows a tile ahead), in layouts of 16 fp8 (16 B) per thread."""
    LD: gl.constexpr = gl.BlockedLayout([1, 16], [1, 32], [WARPS, 1], [1, 0])  # a warp: one row's 512 fp8
    LD_PE: gl.constexpr = gl.BlockedLayout([1, 16], [8, 4], [WARPS, 1], [1, 0])  # a warp: 8 rows' 64 fp8
    W: gl.constexpr = gl.BlockedLayout([1, 4], [4, 8], [WARPS, 1], [1, 0])
    W_PE: gl.constexpr = gl.BlockedLayout([1, 4], [8, 4], [WARPS, 1], [1, 0])
    scale2 = gl.full([BLOCK_N, CONVERT_COLS // 4], 0, gl.int32, layout=W) + kv_scale2
    scale2_pe = gl.full([BLOCK_N, D_PE // 4], 0, gl.int32, layout=W_PE) + kv_scale2
    nx_slot, nx_slot_pe = _issue_first_tiles(KV8, st_nope, st_pe, st_ready, TOKEN_TABLE, DRAFT_TABLE, n_prefix, start,
                                             end, stride_kv, BLOCK_N, S8, D_NOPE, D_PE, LD, LD_PE, RAGGED)
    for it in range(0, n_iter):
        s = it % S8
        b = it % SB
        mbarrier.wait(st_ready.index(s), (it // S8) & 1)  # every thread's copies of tile it have landed
        mbarrier.wait(kv_free.index(b), ((it // SB) & 1) ^ 1)  # warpgroups 0 and 1 are done with tile it - SB
        _convert_tile(st_nope.index(s), st_pe.index(s), kv_smem.index(b), pe_smem.index(b), scale2, scale2_pe,
                      BLOCK_N, D_NOPE, D_PE, WARPS)
        _publish_tile(kv_ready, b)  # its barrier also orders every thread's reads of staging buffer s before the refill
        if it + S8 < n_iter:
            nx_slot, nx_slot_pe = _refill(KV8, st_nope, st_pe, st_ready, s, nx_slot, nx_slot_pe, TOKEN_TABLE,
                                          DRAFT_TABLE, n_prefix, start + (it + S8) * BLOCK_N, end, stride_kv, BLOCK_N,
                                          D_NOPE, D_PE, LD, LD_PE, RAGGED)


@gluon.jit
def _e4m3x4_to_f16(x, scale2):
    """Four e4m3 values packed in each int32 of ``x`` -> two int32 of two fp16 each (values 0-1, then 2-3, in memory
    order), times the cache's scale in one rounding: ``cvt.rn.f16x2.e4m3x2`` (exact) then ``scale2`` (the fp16 scale
    in both halves)."""
    return gl.inline_asm_elementwise(
        "{ .reg .b16 l, h; mov.b32 {l, h}, $2; cvt.rn.f16x2.e4m3x2 $0, l; cvt.rn.f16x2.e4m3x2 $1, h; "
        "mul.rn.f16x2 $0, $0, $3; mul.rn.f16x2 $1, $1, $3; }",
        "=r,=r,r,r", [x, scale2], dtype=(gl.int32, gl.int32), is_pure=True, pack=1)


@gluon.jit
def _store_words(x, scale2, dst):
    """``x`` [rows, n] int32 (4 e4m3 each) converted (``_e4m3x4_to_f16``) into ``dst``, the fp16 tile's columns viewed
    as [rows, 2 n] int32 (2 fp16 each)."""
    lo, hi = _e4m3x4_to_f16(x, scale2)
    w = gl.join(lo, hi)  # [rows, n, 2]: a word's two halves side by side
    dst.store(w.reshape([w.shape[0], 2 * w.shape[1]]))


@gluon.jit
def _fp8_loader_partition(kv_smem, pe_smem, kv_ready, kv_free, KV8, TOKEN_TABLE, DRAFT_TABLE, kv_scale2, n_prefix,
                          start, end, n_iter, stride_kv, PARITY: gl.constexpr, BLOCK_N: gl.constexpr,
                          SB: gl.constexpr, D_NOPE: gl.constexpr, D_PE: gl.constexpr, WARPS: gl.constexpr,
                          RAGGED: gl.constexpr):
    """Warpgroup 2 + PARITY of the direct form: the split's tiles PARITY, PARITY + 2, ... Each is loaded into
    registers as int32 words (four e4m3 a word: 16 B a thread and load; fp8 values carried across the loop would
    take a register each) while this warpgroup's previous tile converts, chunk by chunk: a chunk is converted into
    the fp16 buffer, then its registers take the same chunk of the tile two ahead, so one tile per warpgroup is in
    flight through the other warpgroup's turn and the math. The token-table rows are loaded before the wait for the
    buffer, so the chunks' loads never wait for them. The fp8 bytes never pass through shared memory."""
    W: gl.constexpr = gl.BlockedLayout([1, 4], [4, 8], [WARPS, 1], [1, 0])  # [rows, 32] words: 128 fp8 a row
    W_PE: gl.constexpr = gl.BlockedLayout([1, 4], [8, 4], [WARPS, 1], [1, 0])  # [rows, 16] words: the 64 PE fp8
    I32: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=32, rank=2)
    CW: gl.constexpr = CONVERT_COLS // 4  # words of fp8 a chunk
    words = KV8.to(gl.pointer_type(gl.int32), bitcast=True)
    stride_w = stride_kv // 4
    cols = gl.arange(0, CW, layout=gl.SliceLayout(0, W))
    cols_pe = D_NOPE // 4 + gl.arange(0, D_PE // 4, layout=gl.SliceLayout(0, W_PE))
    slot, slot_pe = _tile_slots(TOKEN_TABLE, DRAFT_TABLE, n_prefix, start + PARITY * BLOCK_N, end, BLOCK_N, W, W_PE,
                                RAGGED)
    ok = ((start + PARITY * BLOCK_N + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, W))) < end)[:, None]
    ok_pe = ((start + PARITY * BLOCK_N + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, W_PE))) < end)[:, None]
    x0 = gl.load(words + (slot * stride_w)[:, None] + cols[None, :], mask=ok, other=0)
    x1 = gl.load(words + (slot * stride_w + CW)[:, None] + cols[None, :], mask=ok, other=0)
    x2 = gl.load(words + (slot * stride_w + 2 * CW)[:, None] + cols[None, :], mask=ok, other=0)
    x3 = gl.load(words + (slot * stride_w + 3 * CW)[:, None] + cols[None, :], mask=ok, other=0)
    xp = gl.load(words + (slot_pe * stride_w)[:, None] + cols_pe[None, :], mask=ok_pe, other=0)
    scale2 = gl.full([BLOCK_N, CW], 0, gl.int32, layout=W) + kv_scale2
    scale2_pe = gl.full([BLOCK_N, D_PE // 4], 0, gl.int32, layout=W_PE) + kv_scale2
    for it in range(PARITY, n_iter, 2):
        b = it % SB
        pos = start + (it + 2) * BLOCK_N  # the tile two ahead: this warpgroup's next
        slot, slot_pe = _tile_slots(TOKEN_TABLE, DRAFT_TABLE, n_prefix, pos, end, BLOCK_N, W, W_PE, RAGGED)
        ok = ((pos + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, W))) < end)[:, None]
        ok_pe = ((pos + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, W_PE))) < end)[:, None]
        mbarrier.wait(kv_free.index(b), ((it // SB) & 1) ^ 1)  # warpgroups 0 and 1 are done with tile it - SB
        dst = kv_smem.index(b)._reinterpret(gl.int32, [BLOCK_N, D_NOPE // 2], I32)
        base = slot * stride_w  # the rows' offsets: each chunk's addresses made at its load, none kept live
        _store_words(x0, scale2, dst.slice(0, 2 * CW, dim=1))
        x0 = gl.load(words + base[:, None] + cols[None, :], mask=ok, other=0)
        _store_words(x1, scale2, dst.slice(2 * CW, 2 * CW, dim=1))
        x1 = gl.load(words + (base + CW)[:, None] + cols[None, :], mask=ok, other=0)
        _store_words(x2, scale2, dst.slice(4 * CW, 2 * CW, dim=1))
        x2 = gl.load(words + (base + 2 * CW)[:, None] + cols[None, :], mask=ok, other=0)
        _store_words(x3, scale2, dst.slice(6 * CW, 2 * CW, dim=1))
        x3 = gl.load(words + (base + 3 * CW)[:, None] + cols[None, :], mask=ok, other=0)
        _store_words(xp, scale2_pe, pe_smem.index(b)._reinterpret(gl.int32, [BLOCK_N, D_PE // 2], I32))
        xp = gl.load(words + (slot_pe * stride_w)[:, None] + cols_pe[None, :], mask=ok_pe, other=0)
        _publish_tile(kv_ready, b)


@gluon.jit
def _publish_tile(kv_ready, b):
    """The converted tile in buffer ``b`` to warpgroups 0 and 1: fenced for the tensor cores, every thread's part
    written, one arrival."""
    fence_async_shared()
    gl.thread_barrier()
    mbarrier.arrive(kv_ready.index(b), count=1)


@gluon.jit
def _fp8_core_state(dtype: gl.constexpr, BLOCK_N: gl.constexpr, SB: gl.constexpr, RN: gl.constexpr,
                    D_NOPE: gl.constexpr, D_PE: gl.constexpr):
    """What both forms share, allocated and initialized: Q (filled by warpgroup 0, ``dtype``), the ``dtype`` ring of
    SB tiles the tensor cores read, P^T and the rows' factors; kv_ready[b] (one arrival: the converted tile),
    kv_free[b] (two: warpgroups 0 and 1), p_ready, p_free, l_ready. The caller fences and barriers."""
    q_smem = gl.allocate_shared_memory(dtype, [RN, D_NOPE], gl.NVMMASharedLayout.get_default_for([RN, D_NOPE], dtype))
    qpe_smem = gl.allocate_shared_memory(dtype, [RN, D_PE], gl.NVMMASharedLayout.get_default_for([RN, D_PE], dtype))
    kv_smem = gl.allocate_shared_memory(dtype, [SB, BLOCK_N, D_NOPE],
                                        gl.NVMMASharedLayout.get_default_for([BLOCK_N, D_NOPE], dtype))
    pe_smem = gl.allocate_shared_memory(dtype, [SB, BLOCK_N, D_PE],
                                        gl.NVMMASharedLayout.get_default_for([BLOCK_N, D_PE], dtype))
    pt_smem = gl.allocate_shared_memory(dtype, [BLOCK_N, RN], gl.NVMMASharedLayout.get_default_for([BLOCK_N, RN], dtype))
    row_smem = gl.allocate_shared_memory(gl.float32, [RN], gl.SwizzledSharedLayout(1, 1, 1, order=[0]))
    kv_ready = gl.allocate_shared_memory(gl.int64, [SB, 1], mbarrier.MBarrierLayout())
    kv_free = gl.allocate_shared_memory(gl.int64, [SB, 1], mbarrier.MBarrierLayout())
    p_ready = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    p_free = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    l_ready = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    for k in gl.static_range(SB):
        mbarrier.init(kv_ready.index(k), count=1)
        mbarrier.init(kv_free.index(k), count=2)
    mbarrier.init(p_ready, count=1)
    mbarrier.init(p_free, count=1)
    mbarrier.init(l_ready, count=1)
    return q_smem, qpe_smem, kv_smem, pe_smem, pt_smem, row_smem, kv_ready, kv_free, p_ready, p_free, l_ready


@gluon.jit
def _fp8_staging_state(BLOCK_N: gl.constexpr, S8: gl.constexpr, D_NOPE: gl.constexpr, D_PE: gl.constexpr,
                       WARPS: gl.constexpr):
    """The staged form's ring: S8 fp8 staging tiles (latent and rope parts) and st_ready[s], which expects one
    cp.async arrival per thread of the copying warpgroup. The caller fences and barriers."""
    fp8: gl.constexpr = gl.float8e4nv
    st_nope = gl.allocate_shared_memory(fp8, [S8, BLOCK_N, D_NOPE],
                                        gl.NVMMASharedLayout.get_default_for([BLOCK_N, D_NOPE], fp8))
    st_pe = gl.allocate_shared_memory(fp8, [S8, BLOCK_N, D_PE], gl.NVMMASharedLayout.get_default_for([BLOCK_N, D_PE], fp8))
    st_ready = gl.allocate_shared_memory(gl.int64, [S8, 1], mbarrier.MBarrierLayout())
    for k in gl.static_range(S8):
        mbarrier.init(st_ready.index(k), count=32 * WARPS)
    return st_nope, st_pe, st_ready


@gluon.jit
def _fp8_partial_kernel(Q, KV8, TOKEN_TABLE, MASK, O_PART, LSE_PART,
                        qk_scale, kv_scale2, n_prefix, n_kv, n_draft, n_heads, n_rows, tokens_per_split, stride_kv,
                        BLOCK_N: gl.constexpr, SB: gl.constexpr, S8: gl.constexpr, RN: gl.constexpr,
                        D_NOPE: gl.constexpr, D_PE: gl.constexpr, D_HALF: gl.constexpr, num_warps: gl.constexpr,
                        PV_REGS: gl.constexpr, CONVERT_REGS: gl.constexpr):
    """One program per split (every row in one tile of RN): the shared memory and barriers, then the partitions
    (module doc): with S8 > 0 the staged form (a ring of S8 fp8 staging tiles filled by cp.async, one converting
    warpgroup), with S8 = 0 the direct form (two warpgroups each loading its tiles into registers and converting them;
    CONVERT_REGS is then each one's)."""
    pid_s = gl.program_id(0)
    dtype: gl.constexpr = gl.float16
    (q_smem, qpe_smem, kv_smem, pe_smem, pt_smem, row_smem, kv_ready, kv_free, p_ready, p_free,
     l_ready) = _fp8_core_state(dtype, BLOCK_N, SB, RN, D_NOPE, D_PE)
    if S8 > 0:
        st_nope, st_pe, st_ready = _fp8_staging_state(BLOCK_N, S8, D_NOPE, D_PE, num_warps)
    fence_async_shared()
    gl.thread_barrier()
    start, end, n_iter = split_bounds(pid_s, tokens_per_split, n_kv, BLOCK_N)
    # one warp_specialize per form: a partition list cannot be built from variables
    if S8 > 0:
        gl.warp_specialize([
            (_swap_softmax_partition, (Q, q_smem, qpe_smem, kv_smem, pe_smem, pt_smem, row_smem, kv_ready, kv_free,
                                       p_ready, p_free, l_ready, MASK, O_PART, LSE_PART, qk_scale, n_prefix, n_draft,
                                       n_heads, n_rows, n_rows, start, end, n_iter, pid_s, BLOCK_N, SB, RN, D_NOPE,
                                       D_PE, D_HALF, num_warps)),
            (_swap_pv_partition, (kv_smem, pt_smem, row_smem, kv_free, p_ready, p_free, l_ready, O_PART, n_rows,
                                  n_rows, n_iter, pid_s, SB, RN, D_HALF, num_warps)),
            (_fp8_copy_convert_partition, (st_nope, st_pe, st_ready, kv_smem, pe_smem, kv_ready, kv_free, KV8,
                                           TOKEN_TABLE, TOKEN_TABLE, kv_scale2, n_prefix, start, end, n_iter,
                                           stride_kv, BLOCK_N, SB, S8, D_NOPE, D_PE, num_warps, False)),
        ], [num_warps, num_warps], [PV_REGS, CONVERT_REGS])
    else:
        gl.warp_specialize([
            (_swap_softmax_partition, (Q, q_smem, qpe_smem, kv_smem, pe_smem, pt_smem, row_smem, kv_ready, kv_free,
                                       p_ready, p_free, l_ready, MASK, O_PART, LSE_PART, qk_scale, n_prefix, n_draft,
                                       n_heads, n_rows, n_rows, start, end, n_iter, pid_s, BLOCK_N, SB, RN, D_NOPE,
                                       D_PE, D_HALF, num_warps)),
            (_swap_pv_partition, (kv_smem, pt_smem, row_smem, kv_free, p_ready, p_free, l_ready, O_PART, n_rows,
                                  n_rows, n_iter, pid_s, SB, RN, D_HALF, num_warps)),
            (_fp8_loader_partition, (kv_smem, pe_smem, kv_ready, kv_free, KV8, TOKEN_TABLE, TOKEN_TABLE, kv_scale2,
                                     n_prefix, start, end, n_iter, stride_kv, 0, BLOCK_N, SB, D_NOPE, D_PE, num_warps,
                                     False)),
            (_fp8_loader_partition, (kv_smem, pe_smem, kv_ready, kv_free, KV8, TOKEN_TABLE, TOKEN_TABLE, kv_scale2,
                                     n_prefix, start, end, n_iter, stride_kv, 1, BLOCK_N, SB, D_NOPE, D_PE, num_warps,
                                     False)),
        ], [num_warps, num_warps, num_warps], [PV_REGS, CONVERT_REGS, CONVERT_REGS])


#: the ring a call runs when it names none, by its N (the rows' tile: 8 up to 8 rows, else 16): the fastest measured
#: on the H200 at each (s22 0.84-0.89 of the bf16 pick's time at 8 rows; d2 0.95-1.01 at 16, where a staged ring of
#: one fp16 tile and three staging tiles took 1.03-1.10)
DEFAULT_RINGS: dict[int, str] = {FIT_ROWS: "s22", SWAP_MAX_ROWS: "d2"}


def ring_for(rows: int, rings: str | None) -> tuple[int, Fp8Ring]:
    """The N and ring of a call of ``rows`` packed rows: the ring named ``rings``, else ``DEFAULT_RINGS``' for the N
    (8 up to 8 rows, else 16). Refuses, before any launch, rows past 16 and a ring whose shared memory does not fit
    beside the rows' N."""
    if not 1 <= rows <= SWAP_MAX_ROWS:
        raise ValueError(f"the fp8 rows-as-N kernel holds 1 to {SWAP_MAX_ROWS} packed rows (heads x draft tokens) in "
                         f"one tile; this call has {rows}")
    rn = FIT_ROWS if rows <= FIT_ROWS else SWAP_MAX_ROWS
    name = rings if rings is not None else DEFAULT_RINGS[rn]
    if name not in FP8_RINGS:
        raise ValueError(f"rings must be one of {sorted(FP8_RINGS)}; got {name!r}")
    ring = FP8_RINGS[name]
    if rn > ring.max_rows:
        fits = sorted(k for k, r in FP8_RINGS.items() if r.max_rows >= rn)
        raise ValueError(f"the ring {name!r} fits sm_90's shared memory only at an N of {ring.max_rows} (at most "
                         f"{ring.max_rows} rows); this call has {rows} rows: use one of {fits}")
    return rn, ring


def check_fp8_inputs(inputs: VerifyInputs, who: str) -> None:
    """Before any launch: CUDA, the fp8 cache present (mla.with_fp8_cache), contiguous q [T, H, 576] in bf16, fp8
    cache rows [pool, 576] as float8_e4m3fn, and a cache scale whose e4m3 range fits fp16's (``MAX_KV_SCALE``)."""
    q, cache8 = inputs.q, inputs.cache_fp8
    if not q.is_cuda:
        raise ValueError(f"{who} runs on CUDA (sm_90) only; on the CPU use split_kv_torch on mla.dequantized(inputs)")
    if cache8 is None:
        raise ValueError(f"{who} reads the fp8 cache: make the inputs with mla.with_fp8_cache(inputs)")
    if cache8.dtype != torch.float8_e4m3fn:
        raise ValueError(f"{who} reads a float8_e4m3fn cache; got {cache8.dtype}")
    if not (q.is_contiguous() and q.shape[-1] == D_QK and cache8.shape[-1] == D_QK and cache8.stride(1) == 1):
        raise ValueError(f"{who} needs contiguous q [T, H, 576] and fp8 cache rows [pool, 576]")
    if q.dtype != torch.bfloat16:
        raise ValueError(f"{who} takes bfloat16 queries; got {q.dtype}")
    if not 0 < inputs.kv_scale <= MAX_KV_SCALE:
        raise ValueError(f"{who} converts the cache to fp16: its scale must be in (0, {MAX_KV_SCALE:.1f}] (448 x scale "
                         f"within fp16's {FP16_MAX:g}); got {inputs.kv_scale}")


def split_kv_gluon_fp8(inputs: VerifyInputs, out: torch.Tensor, block_n: int = 64, num_sms: int | None = None,
                       pdl_merge: bool = True, merge_block_dv: int = 64, merge_one_pass: bool = True,
                       merge_one_pass_max_splits: int = 512, rings: str | None = None,
                       split_round_tokens: int = BLOCK_TOKENS) -> torch.Tensor:
    """Split-KV verify attention on the fp8 cache (module doc) for up to ``SWAP_MAX_ROWS`` packed rows, then
    merge.merge_partials (one pass, under PDL: the pick's); writes ``out`` [T, H, 512] in q's dtype. ``rings``: a
    name of ``FP8_RINGS`` (None: ``DEFAULT_RINGS``' for the rows); ``split_round_tokens``: each split's tokens a
    multiple of this (``SplitKVConfig``'s field). The pick's arguments come from ``gluon.pick.pick_fp8_launch``."""
    check_fp8_inputs(inputs, "split_kv_gluon_fp8")
    q, cache8 = inputs.q, inputs.cache_fp8
    T, H = inputs.draft_tokens, inputs.heads
    rows, n_kv = T * H, inputs.n_kv
    rn, ring = ring_for(rows, rings)
    pv_regs, convert_regs = partition_regs(ring)
    cfg: SplitKVConfig = replace(gluon_config(block_n, 2), merge_block_dv=merge_block_dv,
                                 merge_one_pass=merge_one_pass, merge_one_pass_max_splits=merge_one_pass_max_splits,
                                 split_round_tokens=split_round_tokens)
    plan: SplitPlan = plan_splits(rows, n_kv, cfg, num_sms or sm_count(q.device.index or 0))
    o_part = torch.empty(plan.n_splits, rows, D_V, device=q.device, dtype=torch.float32)
    lse_part = torch.empty(plan.n_splits, rows, device=q.device, dtype=torch.float32)
    _fp8_partial_kernel[(plan.n_splits,)](
        q, cache8, inputs.token_table, inputs.mask_u8, o_part, lse_part,
        inputs.sm_scale * LOG2E, fp16_pair_bits(float(inputs.kv_scale)), inputs.n_prefix, n_kv, T, H, rows,
        plan.tokens_per_split, cache8.stride(0),
        BLOCK_N=block_n, SB=ring.sb, S8=ring.s8, RN=rn, D_NOPE=D_NOPE, D_PE=D_PE, D_HALF=D_HALF,
        num_warps=WS_PARTITION_WARPS, PV_REGS=pv_regs, CONVERT_REGS=convert_regs,
    )
    merge_partials(o_part, lse_part, out.view(rows, D_V), cfg, pdl=pdl_merge)
    return out


def fp16_pair_bits(scale: float) -> int:
    """``scale`` rounded to fp16, in both halves of an int32 (the f16x2 multiplier; a positive fp16 keeps the word's
    sign bit clear, so it passes as an i32 argument as it is)."""
    if not 0 < scale <= FP16_MAX:
        raise ValueError(f"the fp16 multiplier must be in (0, {FP16_MAX:g}]; got {scale}")
    half = int(torch.tensor(float(scale), dtype=torch.float16).view(torch.int16).item())
    return half | (half << 16)


def partition_regs(ring: Fp8Ring) -> tuple[int, int]:
    """Registers per thread of warpgroup 1 and of each converting warpgroup (warpgroup 0 gets the rest of the 64K:
    504 a thread's worth over three warpgroups, 512 over four), chosen by compiling for sm_90: the staged form
    (96, 168) and the direct form (88, 128), no spill."""
    return (PV_REGS, CONVERT_REGS) if ring.s8 else (DIRECT_PV_REGS, LOADER_REGS)


def compile_sm90(rn: int = SWAP_MAX_ROWS, rings: str = "d2", block_n: int = 64) -> "triton.compiler.CompiledKernel":
    """The partial kernel compiled ahead of time for sm_90 (no GPU needed), for the CPU tests and
    scripts/kernel_ptx_hashes.py."""
    from triton.backends.compiler import GPUTarget  # noqa: PLC0415
    from triton.experimental.gluon._runtime import GluonASTSource  # noqa: PLC0415

    ring = FP8_RINGS[rings]
    sig = {"Q": "*bf16", "KV8": "*fp8e4nv", "TOKEN_TABLE": "*i64", "MASK": "*u8", "O_PART": "*fp32",
           "LSE_PART": "*fp32", "qk_scale": "fp32", "kv_scale2": "i32", "n_prefix": "i32", "n_kv": "i32",
           "n_draft": "i32", "n_heads": "i32", "n_rows": "i32", "tokens_per_split": "i32", "stride_kv": "i32"}
    pv_regs, convert_regs = partition_regs(ring)
    const = {"BLOCK_N": block_n, "SB": ring.sb, "S8": ring.s8, "RN": rn, "D_NOPE": D_NOPE, "D_PE": D_PE,
             "D_HALF": D_HALF, "num_warps": WS_PARTITION_WARPS, "PV_REGS": pv_regs, "CONVERT_REGS": convert_regs}
    sig.update({k: "constexpr" for k in const})
    attrs = {(i,): [["tt.divisibility", 16]] for i, k in enumerate(sig)
             if k in ("Q", "KV8", "TOKEN_TABLE", "O_PART", "LSE_PART", "stride_kv")}
    return triton.compile(GluonASTSource(_fp8_partial_kernel, sig, const, attrs), target=GPUTarget("cuda", 90, 32),
                          options={"num_warps": WS_PARTITION_WARPS})
