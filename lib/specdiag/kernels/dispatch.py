"""Kernel variants by name, and running one on whatever device its inputs live on.

A variant is a kernel plus the index form it reads: ``baseline_p1`` (token table), ``split_p1``
(token table), ``split_b64`` (64-token block table); issue 13's single-launch ``fused_p1`` / ``fused_b64`` and
their fp8-KV forms ``fused_fp8_p1`` / ``fused_fp8_b64`` (design ``fused_split_kv``); ``fused_self_p1`` keeps the
merge inside the launch at every tile size (run 5's arm against the two-launch fallback at 64-row tiles);
``split_n32s5_p1`` is ``split_p1`` with 32-token KV tiles and 5 pipeline stages at 64-row tiles, ``split_qk1_p1`` the
same with Q K^T computed once per tile instead of in both warpgroups (run 6's arms on the h8T8 inner loop; at other
row tiles both are exactly ``split_p1``). Run 7: ``split_pdl_p1`` launches the merge as a programmatic dependent
launch; ``split_m32_p1`` / ``split_m16_p1`` cut the 33-128 rows of h8T8 into 32- or 16-row tiles. Run 8:
``split_n32c_p1`` / ``split_qk1c_p1`` give the compute-bound shapes (over 128 rows) 32-token tiles with 5 stages, the
second with the scores once per tile. Runs 11-12: the partial kernel written in Gluon (gluon_splitkv), the scores
computed once across the two warpgroups: ``split_glo*`` lets each tile's P V run into the next iteration,
``split_glw*`` waits for it in its own iteration (run 12: the fastest of ours from 33 rows on). ``split_auto_p1``:
split_p1 up to 32 rows, split_glw_p1 above. Run 15: ``split_gws_p1``, the partial kernel with warp-specialized
warpgroups (gluon_ws: one computes the scores, the softmax and half of P V, the other copies the KV and does the other
half; they meet at mbarriers). Run 16: ``split_gwp*`` prefetch the copies' token-table rows a tile ahead,
``split_gwo*`` also overlap tile i's P V with tile i + 1's softmax in warpgroup 0. ``split_auto_ws_p1``: split_p1 up
to 32 rows, split_gwp_p1 above (run 16's fastest of ours from 33 rows on). Run 18: ``split_gwm_p1`` loads the tree
mask only on the tiles that reach the draft tokens; run 19's ``split_gwf_p1`` also leaves interior tiles unmasked and
folds the scale into the exponent; ``split_auto_gwf_p1`` is split_p1 up to 32 rows and split_gwf_p1 above. Run 22:
``split_gwb_p1`` (bf16 partials) and ``split_gwbp_p1`` (and the merge as a programmatic dependent launch). Run 24:
``split_gwf64_p1`` / ``split_gwf128_p1``, wider merge programs. Run 25: ``split_gwg_p1`` merges inside its own grid
(one cooperative launch, no merge kernel); ``split_auto_gwf64_p1`` / ``split_auto_gwg_p1`` are split_p1 up to 32 rows
and split_gwf64_p1 / split_gwg_p1 above. Runs 28-29: ``split_*1*`` and ``split_auto_gwfm_p1`` merge in one pass (the
pick since run 29). Run 30: ``split_auto_gwfmj*_p1`` join a last split of at most 64 tokens to the one before it;
``ragged_p1`` / ``ragged2_p1`` are the SGLang plugin's kernel (triton_splitkv_ragged) with its merge in one pass by
runs 28-29's rule / in two passes, as it served before; run 32's ``ragged_gw_p1`` is what the plugin serves since:
``ragged_p1`` up to 32 rows and the warp-specialized Gluon kernel on the ragged layout above (gluon_ws_ragged). Run
33: ``split_gwfm_p1`` and ``ragged_gwa_p1`` run those Gluon kernels at every row count; run 35's ``split_gwr_p1`` the
Gluon kernel at every row count with the merge's one pass by the row rule. Session 13: ``split_gwsw8_fp8*_p1``, the
pick's rows-as-N kernel on the fp8 cache (gluon_ws_fp8, up to 16 rows), ``split_gwsw8_fp8p_p1`` the fp8 pick. On CUDA
the Triton kernels run; on the CPU the torch fallbacks of the same designs (reference.py) run, so tests and CI
exercise the same code paths around them.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Callable, Optional

import torch

from specdiag.kernels.mla import VerifyInputs, dequantized
from specdiag.kernels.reference import baseline_torch, split_kv_torch
from specdiag.kernels.splitkv_plan import SplitKVConfig


@dataclass(frozen=True)
class KernelVariant:
    name: str  #: result rows' ``kernel`` field
    design: str  #: "baseline", "split_kv", "fused_split_kv" or "ragged_split_kv" (the plugin's kernel)
    page_size: int  #: 1 (token index table) or 64 (block table)
    kv_fp8: bool = False  #: reads the fp8 e4m3 cache (inputs.cache_fp8, per-tensor kv_scale)
    merge: str = "auto"  #: fused_split_kv only: "auto" (self-merge under 64-row tiles, else run 2's merge kernel), "self"
    #: split_kv only: (block_n, num_stages, qk_once) of the 64-row tile (33-128 rows) instead of the default's (run 6)
    tile64: Optional[tuple[int, int, bool]] = None
    #: split_kv only: fields of the launch configuration replaced at every row count (run 7: ("pdl", True)); on a Gluon
    #: kernel too (run 28: ("merge_one_pass", True))
    overrides: tuple[tuple[str, Any], ...] = ()
    #: split_kv only: fields replaced at 33-128 rows only, where the default is the 64-row tile (run 7's h8T8 arms)
    overrides64: tuple[tuple[str, Any], ...] = ()
    #: split_kv only: fields replaced over 128 rows only (compute-bound shapes: several 64-row tiles; run 8's arms)
    overrides_many: tuple[tuple[str, Any], ...] = ()
    #: split_kv only: "triton" (triton_splitkv), "gluon" (gluon_splitkv: the scores once, two warpgroups in lockstep;
    #: run 10), "gluon_ws" (gluon_ws: warpgroup 0 scores, softmax and half of P V, warpgroup 1 the copies and the
    #: other half, meeting at mbarriers; run 15), "auto" / "auto_ws" (triton up to 32 rows, gluon / gluon_ws above)
    impl: str = "triton"
    #: impl "gluon" / "gluon_ws" only: (tokens per KV tile, tiles in the ring)
    gluon_tile: tuple[int, int] = (64, 2)
    #: impl "gluon" only: True lets each tile's P V run into the next iteration (run 11; ptxas C7514 serializes it),
    #: False waits for it in its own iteration (run 12)
    gluon_pv_across: bool = False
    #: impl "gluon", P V waited in its iteration only: the next copy issued at the iteration's first barrier (run 14)
    gluon_early_copy: bool = False
    #: impl "gluon_ws" only: the copy partition loads the next refill's token-table rows a tile ahead (run 16)
    gluon_prefetch: bool = False
    #: impl "gluon_ws" only: tile i's P V under tile i + 1's softmax in warpgroup 0 (FA3's intra-warpgroup overlap)
    gluon_overlap: bool = False
    #: impl "gluon_ws" only: the tree mask loaded only on tiles that reach the draft tokens (run 18)
    gluon_draft_branch: bool = False
    #: impl "gluon_ws" only: interior tiles unmasked, the scale folded into the exponent, the sum before rounding
    gluon_fold: bool = False
    #: impl "gluon_ws" only: bf16 split partials (run 22)
    gluon_bf16_partials: bool = False
    #: impl "gluon_ws" only: the merge as a programmatic dependent launch (run 22)
    gluon_pdl_merge: bool = False
    #: impl "gluon_ws" / "auto_ws" only: value dims per merge program (run 24; 16 is the plan's default)
    gluon_merge_block_dv: int = 16
    #: impl "gluon_ws" / "auto_ws" only: the merge inside the partial grid, one cooperative launch (run 25)
    gluon_grid_merge: bool = False
    #: impl "gluon" / "gluon_ws" / "auto*" from 33 rows: fields of the Gluon kernel's configuration replaced after
    #: ``overrides`` (run 29: the merge's one pass up to 16 splits there, at every split count below 33 rows)
    gluon_overrides: tuple[tuple[str, Any], ...] = ()
    #: impl "gluon_ws" only: the merge's one pass by runs 28-29's rule at the call's row count
    #: (splitkv_plan.one_pass_merge_fields: every split count up to 32 rows, up to 16 splits above), after the above
    gluon_merge_by_rows: bool = False
    #: gluon_ws only: warpgroup 0 loads Q while warpgroup 1 issues the first tiles (session 11: the copies waited for Q)
    gluon_early_q: bool = False
    #: with gluon_early_q: only up to this many packed rows (run 38: faster up to 64 rows, one row tile; slower from
    #: 256); None: at every row count
    gluon_early_q_max_rows: Optional[int] = None
    #: gluon_ws only: up to this many packed rows run gluon_ws_swap's kernel instead (the rows as the wgmma's N, at
    #: most gluon_ws_swap.SWAP_MAX_ROWS), with the arm's merge; 0: never
    gluon_swap_max_rows: int = 0
    #: with gluon_swap_max_rows: an N of 8 where the rows fit it (gluon_ws_swap ``fit_rows``), else 16
    gluon_swap_fit_rows: bool = False
    #: with gluon_swap_fit_rows: the ring's buffers at that N of 8 (gluon_ws_swap ``fit_stages``; 0: the arm's)
    gluon_swap_fit_stages: int = 0
    #: with gluon_swap_max_rows: the rows' sums kept per key lane, reduced once after the loop (``late_sum``)
    gluon_swap_late_sum: bool = False
    #: with gluon_swap_max_rows: each warp's keys a softmax of their own, four accumulators (``warp_softmax``)
    gluon_swap_warp_softmax: bool = False
    #: with gluon_swap_max_rows: the copies in a third partition of their own (``producer``)
    gluon_swap_producer: bool = False
    #: with gluon_swap_max_rows: bytes of shared memory more, unused (``smem_pad``: run 46's knob)
    gluon_swap_smem_pad: int = 0
    #: with kv_fp8 and impl gluon_ws (gluon_ws_fp8, up to 16 rows): the rings (names of gluon_ws_fp8.FP8_RINGS) up to
    #: 8 rows and above; None: the kernel's default by the rows (gluon_ws_fp8.DEFAULT_RINGS)
    gluon_fp8_rings: Optional[tuple[str, str]] = None
    #: with kv_fp8 and impl gluon_ws: the e4m3 -> fp16 conversion's instructions (gluon_ws_fp8.CONVERSIONS)
    gluon_fp8_conversion: str = "cvt"
    #: with kv_fp8 and impl gluon_ws: warpgroups 0 and 1's softmax form (gluon_ws_fp8.SOFTMAXES)
    gluon_fp8_softmax: str = "rows"
    #: the plugin's fp8 arm only (ragged_split_kv, kv_fp8): the ring of its 32-row tiles above 16 rows
    #: (gluon_ws_ragged.FP8_N32_RINGS' names; None: its default), or of 64-row tiles above 32 rows (FP8_N64_RINGS')
    gluon_fp8_wide_ring: Optional[str] = None


#: run 38: warpgroup 0's early load of Q paid on every case of up to 64 packed rows (0.968-0.992 of the pick) and lost
#: from 256 (1.009-1.014), where several row tiles each load their Q
EARLY_Q_MAX_ROWS = 64

#: the suite's pick since run 41 (split_gwsw8_p1): gluon_ws's warp-specialized kernel with its prefetched token-table
#: rows, draft branch, folded scale, 64-dim PDL merge by rows and early Q up to 64 rows, and up to 16 rows the rows as
#: the wgmma's N (gluon_ws_swap), an N of 8 up to 8 rows
_PICK = KernelVariant("split_gwsw8_p1", "split_kv", 1, impl="gluon_ws", gluon_tile=(64, 2), gluon_prefetch=True,
                      gluon_draft_branch=True, gluon_fold=True, gluon_merge_block_dv=64, gluon_merge_by_rows=True,
                      gluon_pdl_merge=True, gluon_early_q=True, gluon_early_q_max_rows=EARLY_Q_MAX_ROWS,
                      gluon_swap_max_rows=16, gluon_swap_fit_rows=True)


def _pick_with(name: str, **fields: Any) -> KernelVariant:
    """The pick (``_PICK``) named ``name`` with ``fields`` changed: session 12's arms, each one change from it."""
    return replace(_PICK, name=name, **fields)


KERNEL_VARIANTS: dict[str, KernelVariant] = {
    "baseline_p1": KernelVariant("baseline_p1", "baseline", 1),
    "split_p1": KernelVariant("split_p1", "split_kv", 1),
    "split_b64": KernelVariant("split_b64", "split_kv", 64),
    # issue 13: one launch, the merge done by the last program of each row tile (triton_fused.py)
    "fused_p1": KernelVariant("fused_p1", "fused_split_kv", 1),
    "fused_b64": KernelVariant("fused_b64", "fused_split_kv", 64),
    "fused_fp8_p1": KernelVariant("fused_fp8_p1", "fused_split_kv", 1, kv_fp8=True),
    "fused_fp8_b64": KernelVariant("fused_fp8_b64", "fused_split_kv", 64, kv_fp8=True),
    # run 5: the self-merge at every tile size (at 64-row tiles "auto" launches run 2's merge kernel instead)
    "fused_self_p1": KernelVariant("fused_self_p1", "fused_split_kv", 1, merge="self"),
    # run 6: the h8T8 inner loop with 32-token KV tiles and 5 stages (three buffers: the copy two tiles ahead in flight
    # through a whole iteration), then the same with the scores computed once (triton_splitkv qk_once). Under 33 rows
    # and over 128: split_p1 itself.
    "split_n32s5_p1": KernelVariant("split_n32s5_p1", "split_kv", 1, tile64=(32, 5, False)),
    "split_qk1_p1": KernelVariant("split_qk1_p1", "split_kv", 1, tile64=(32, 5, True)),
    # run 7: split_p1 with the merge as a programmatic dependent launch (its launch under the partial grid's drain)
    "split_pdl_p1": KernelVariant("split_pdl_p1", "split_kv", 1, overrides=(("pdl", True),)),
    # run 7: the h8T8 rows in 32- or 16-row tiles (mma.sync, 4 warps, two programs per SM: the T1 loop that streams
    # at 95 % of copy) instead of one 64-row wgmma tile; the row tiles of a split read its KV together (L2 reuse)
    "split_m32_p1": KernelVariant("split_m32_p1", "split_kv", 1, overrides64=(
        ("block_m", 32), ("block_n", 64), ("num_warps", 4), ("num_stages", 2), ("programs_per_sm", 2.0))),
    "split_m16_p1": KernelVariant("split_m16_p1", "split_kv", 1, overrides64=(
        ("block_m", 16), ("block_n", 64), ("num_warps", 4), ("num_stages", 2), ("programs_per_sm", 2.0))),
    # run 8: the compute-bound shapes (over 128 rows: several 64-row tiles) with 32-token tiles and 5 stages, and the
    # same with Q K^T once per tile (where the loop is tensor-bound, the duplicated scores are a third of its work)
    "split_n32c_p1": KernelVariant("split_n32c_p1", "split_kv", 1, overrides_many=(
        ("block_n", 32), ("num_stages", 5))),
    "split_qk1c_p1": KernelVariant("split_qk1c_p1", "split_kv", 1, overrides_many=(
        ("block_n", 32), ("num_stages", 5), ("qk_once", True))),
    # run 9: launch parameters the run 2 sweep did not try on the memory-bound shapes (at every row count): bf16
    # partials (half the partial writes and merge reads), the evict-first hint on KV loads, and both. (8 warps at 16-row
    # tiles compile to 116,736 B of shared memory: one program per SM, two waves; not an arm.)
    "split_bf16p_p1": KernelVariant("split_bf16p_p1", "split_kv", 1, overrides=(("partial_bf16", True),)),
    "split_ef_p1": KernelVariant("split_ef_p1", "split_kv", 1, overrides=(("evict_first", True),)),
    "split_bfef_p1": KernelVariant("split_bfef_p1", "split_kv", 1, overrides=(("partial_bf16", True), ("evict_first", True))),
    # runs 11-12: the partial kernel in Gluon (gluon_splitkv): 64-row tiles at every row count, Q K^T split between
    # the two warpgroups by keys, P through shared memory, P V split by value dims, asynchronous wgmmas; glo: tile i's
    # P V left running under tile i + 1's scores (run 11), glw: waited for in its own iteration (run 12). Run 10's
    # synchronous arms (split_gl_p1, split_gl32_p1; slower than split_p1) are at commit 991aa20.
    "split_glo_p1": KernelVariant("split_glo_p1", "split_kv", 1, impl="gluon", gluon_tile=(64, 2), gluon_pv_across=True),
    "split_glo32_p1": KernelVariant("split_glo32_p1", "split_kv", 1, impl="gluon", gluon_tile=(32, 4),
                                    gluon_pv_across=True),
    "split_glw_p1": KernelVariant("split_glw_p1", "split_kv", 1, impl="gluon", gluon_tile=(64, 2)),
    # run 14 (planned, not yet run on a GPU): split_glw_p1 with the next copy issued at the iteration's first barrier
    "split_glx_p1": KernelVariant("split_glx_p1", "split_kv", 1, impl="gluon", gluon_tile=(64, 2), gluon_early_copy=True),
    "split_glw32_p1": KernelVariant("split_glw32_p1", "split_kv", 1, impl="gluon", gluon_tile=(32, 4)),
    # run 13: the fastest of ours per shape as runs 5-12 measured it: split_p1 (Triton, 16/32-row tiles, two
    # programs per SM) up to 32 rows, split_glw_p1 (Gluon, 64-row tiles, the scores once) from 33 rows on
    # run 15: the warp-specialized Gluon kernel (gluon_ws, FlashMLA's division of work between the warpgroups)
    "split_gws_p1": KernelVariant("split_gws_p1", "split_kv", 1, impl="gluon_ws", gluon_tile=(64, 2)),
    # run 16: the token-table rows prefetched (gwp), and with the intra-warpgroup overlap (gwo); 32-token tiles, 4 in
    # the ring (the copy of a tile in flight for three tiles' work instead of one)
    "split_gwp_p1": KernelVariant("split_gwp_p1", "split_kv", 1, impl="gluon_ws", gluon_tile=(64, 2),
                                  gluon_prefetch=True),
    "split_gwo_p1": KernelVariant("split_gwo_p1", "split_kv", 1, impl="gluon_ws", gluon_tile=(64, 2),
                                  gluon_prefetch=True, gluon_overlap=True),
    "split_gwp32_p1": KernelVariant("split_gwp32_p1", "split_kv", 1, impl="gluon_ws", gluon_tile=(32, 4),
                                    gluon_prefetch=True),
    "split_gwo32_p1": KernelVariant("split_gwo32_p1", "split_kv", 1, impl="gluon_ws", gluon_tile=(32, 4),
                                    gluon_prefetch=True, gluon_overlap=True),
    # run 18: split_gwp_p1 with the tree mask loaded only on the tiles that reach the draft tokens
    "split_gwm_p1": KernelVariant("split_gwm_p1", "split_kv", 1, impl="gluon_ws", gluon_tile=(64, 2),
                                  gluon_prefetch=True, gluon_draft_branch=True),
    # run 19: split_gwm_p1 with the softmax of interior tiles unmasked and the scale folded into the exponent
    "split_gwf_p1": KernelVariant("split_gwf_p1", "split_kv", 1, impl="gluon_ws", gluon_tile=(64, 2),
                                  gluon_prefetch=True, gluon_draft_branch=True, gluon_fold=True),
    # run 22: split_gwf_p1 with bf16 partials (gwb), and with the merge as a programmatic dependent launch (gwbp)
    "split_gwb_p1": KernelVariant("split_gwb_p1", "split_kv", 1, impl="gluon_ws", gluon_tile=(64, 2),
                                  gluon_prefetch=True, gluon_draft_branch=True, gluon_fold=True,
                                  gluon_bf16_partials=True),
    "split_gwbp_p1": KernelVariant("split_gwbp_p1", "split_kv", 1, impl="gluon_ws", gluon_tile=(64, 2),
                                   gluon_prefetch=True, gluon_draft_branch=True, gluon_fold=True,
                                   gluon_bf16_partials=True, gluon_pdl_merge=True),
    # run 24: split_gwf_p1 with wider merge programs (64 or 128 of the 512 value dims each, not 16)
    "split_gwf64_p1": KernelVariant("split_gwf64_p1", "split_kv", 1, impl="gluon_ws", gluon_tile=(64, 2),
                                    gluon_prefetch=True, gluon_draft_branch=True, gluon_fold=True,
                                    gluon_merge_block_dv=64),
    "split_gwf128_p1": KernelVariant("split_gwf128_p1", "split_kv", 1, impl="gluon_ws", gluon_tile=(64, 2),
                                     gluon_prefetch=True, gluon_draft_branch=True, gluon_fold=True,
                                     gluon_merge_block_dv=128),
    # run 25: split_gwf_p1 with the merge inside its grid (every program merges a slice once all have stored their
    # partials; one cooperative launch), and split_p1 up to 32 rows with split_gwf64_p1 / split_gwg_p1 above
    "split_gwg_p1": KernelVariant("split_gwg_p1", "split_kv", 1, impl="gluon_ws", gluon_tile=(64, 2),
                                  gluon_prefetch=True, gluon_draft_branch=True, gluon_fold=True, gluon_grid_merge=True),
    "split_auto_gwf64_p1": KernelVariant("split_auto_gwf64_p1", "split_kv", 1, impl="auto_ws", gluon_tile=(64, 2),
                                         gluon_prefetch=True, gluon_draft_branch=True, gluon_fold=True,
                                         gluon_merge_block_dv=64),
    "split_auto_gwg_p1": KernelVariant("split_auto_gwg_p1", "split_kv", 1, impl="auto_ws", gluon_tile=(64, 2),
                                       gluon_prefetch=True, gluon_draft_branch=True, gluon_fold=True,
                                       gluon_grid_merge=True),
    # run 28: the merge kernel in one pass (every split of its outputs at once, lse and partials in one round trip):
    # after split_p1's partials, after split_gwf_p1's, and split_p1 up to 32 rows with split_gwf1_p1 above
    "split_m1_p1": KernelVariant("split_m1_p1", "split_kv", 1, overrides=(("merge_one_pass", True),)),
    "split_gwf1_p1": KernelVariant("split_gwf1_p1", "split_kv", 1, impl="gluon_ws", gluon_tile=(64, 2),
                                   gluon_prefetch=True, gluon_draft_branch=True, gluon_fold=True,
                                   overrides=(("merge_one_pass", True),)),
    "split_auto_gwf1_p1": KernelVariant("split_auto_gwf1_p1", "split_kv", 1, impl="auto_ws", gluon_tile=(64, 2),
                                        gluon_prefetch=True, gluon_draft_branch=True, gluon_fold=True,
                                        overrides=(("merge_one_pass", True),)),
    # run 29: run 28's one-pass merge where it paid: split_m1_p1 up to 32 rows, split_gwf64_p1 above with the merge
    # in one pass up to 16 splits (the compute-bound shapes; h8T8's 129 and h16T16's 33 splits keep the two passes)
    "split_auto_gwfm_p1": KernelVariant("split_auto_gwfm_p1", "split_kv", 1, impl="auto_ws", gluon_tile=(64, 2),
                                        gluon_prefetch=True, gluon_draft_branch=True, gluon_fold=True,
                                        gluon_merge_block_dv=64, overrides=(("merge_one_pass", True),),
                                        gluon_overrides=(("merge_one_pass_max_splits", 16),)),
    # run 30: the pick with a last split of at most one 64-token tile joined to the one before it (the draft tokens
    # past a prefix that fills whole splits: 257 -> 256 splits at 64k-256k T1, 129 -> 128 at h8T8), and the same with
    # the merge in one pass up to 128 splits from 33 rows (h8T8's 128 splits without padding)
    "split_auto_gwfmj_p1": KernelVariant("split_auto_gwfmj_p1", "split_kv", 1, impl="auto_ws", gluon_tile=(64, 2),
                                         gluon_prefetch=True, gluon_draft_branch=True, gluon_fold=True,
                                         gluon_merge_block_dv=64,
                                         overrides=(("merge_one_pass", True), ("join_tail_tokens", 64)),
                                         gluon_overrides=(("merge_one_pass_max_splits", 16),)),
    "split_auto_gwfmj1_p1": KernelVariant("split_auto_gwfmj1_p1", "split_kv", 1, impl="auto_ws", gluon_tile=(64, 2),
                                          gluon_prefetch=True, gluon_draft_branch=True, gluon_fold=True,
                                          gluon_merge_block_dv=64,
                                          overrides=(("merge_one_pass", True), ("join_tail_tokens", 64)),
                                          gluon_overrides=(("merge_one_pass_max_splits", 128),)),
    # the plugin's kernel (triton_splitkv_ragged, SGLang's ragged layout, lengths read on the device) with the
    # configuration its ladder serves: the merge in one pass by runs 28-29's rule; ragged2_p1: the two-pass merge it
    # served before run 30
    "ragged_p1": KernelVariant("ragged_p1", "ragged_split_kv", 1),
    "ragged2_p1": KernelVariant("ragged2_p1", "ragged_split_kv", 1, overrides=(("merge_one_pass", False),)),
    # run 32: what the plugin serves since: ragged_p1 up to 32 rows, the warp-specialized Gluon kernel on the ragged
    # layout above (gluon_ws_ragged: the pick's kernel, split_gwf64_p1's merge width, the one pass by runs 28-29's rule)
    "ragged_gw_p1": KernelVariant("ragged_gw_p1", "ragged_split_kv", 1, impl="auto_ws", overrides=(("pdl", False),)),
    # run 33: the Gluon kernels at every row count (where the Triton kernels serve below 33 rows), to measure where
    # the switch pays: the pick's Gluon kernel with its options (split_gwfm_p1) and the plugin's (ragged_gwa_p1)
    "split_gwfm_p1": KernelVariant("split_gwfm_p1", "split_kv", 1, impl="gluon_ws", gluon_tile=(64, 2),
                                   gluon_prefetch=True, gluon_draft_branch=True, gluon_fold=True,
                                   gluon_merge_block_dv=64, overrides=(("merge_one_pass", True),),
                                   gluon_overrides=(("merge_one_pass_max_splits", 16),)),
    "ragged_gwa_p1": KernelVariant("ragged_gwa_p1", "ragged_split_kv", 1, impl="gluon_ws", overrides=(("pdl", False),)),
    # run 35: the Gluon kernel at every row count with the merge by runs 28-29's row rule (what ragged_gwa_p1 does on
    # the ragged layout: runs 33-34 measured it 0.88-0.96 of split_auto_gwfm_p1 at 8-32 rows)
    "split_gwr_p1": KernelVariant("split_gwr_p1", "split_kv", 1, impl="gluon_ws", gluon_tile=(64, 2),
                                  gluon_prefetch=True, gluon_draft_branch=True, gluon_fold=True,
                                  gluon_merge_block_dv=64, gluon_merge_by_rows=True),
    # run 36: split_gwr_p1 with the merge as a programmatic dependent launch (gwrp), with bf16 partials (gwrb), and
    # with a ring of four 32-token tiles (gwr32): the fixed costs and the copies in flight at one draft token
    "split_gwrp_p1": KernelVariant("split_gwrp_p1", "split_kv", 1, impl="gluon_ws", gluon_tile=(64, 2),
                                   gluon_prefetch=True, gluon_draft_branch=True, gluon_fold=True,
                                   gluon_merge_block_dv=64, gluon_merge_by_rows=True, gluon_pdl_merge=True),
    "split_gwrb_p1": KernelVariant("split_gwrb_p1", "split_kv", 1, impl="gluon_ws", gluon_tile=(64, 2),
                                   gluon_prefetch=True, gluon_draft_branch=True, gluon_fold=True,
                                   gluon_merge_block_dv=64, gluon_merge_by_rows=True, gluon_bf16_partials=True),
    # session 11: the pick with warpgroup 0 loading Q under the first tiles' copies (the timelines of calls 7-8)
    "split_gwrpq_p1": KernelVariant("split_gwrpq_p1", "split_kv", 1, impl="gluon_ws", gluon_tile=(64, 2),
                                    gluon_prefetch=True, gluon_draft_branch=True, gluon_fold=True,
                                    gluon_merge_block_dv=64, gluon_merge_by_rows=True, gluon_pdl_merge=True,
                                    gluon_early_q=True),
    # run 39: split_gwrpq_p1's early Q only where run 38 measured it faster (up to 64 rows: one row tile), the pick's
    # call above
    "split_gwrpqr_p1": KernelVariant("split_gwrpqr_p1", "split_kv", 1, impl="gluon_ws", gluon_tile=(64, 2),
                                     gluon_prefetch=True, gluon_draft_branch=True, gluon_fold=True,
                                     gluon_merge_block_dv=64, gluon_merge_by_rows=True, gluon_pdl_merge=True,
                                     gluon_early_q=True, gluon_early_q_max_rows=EARLY_Q_MAX_ROWS),
    # run 40: up to 16 rows the rows as the wgmma's N (gluon_ws_swap: a quarter of the math per tile, the ring's
    # buffers held shorter), split_gwrpqr_p1 above
    "split_gwsw_p1": KernelVariant("split_gwsw_p1", "split_kv", 1, impl="gluon_ws", gluon_tile=(64, 2),
                                   gluon_prefetch=True, gluon_draft_branch=True, gluon_fold=True,
                                   gluon_merge_block_dv=64, gluon_merge_by_rows=True, gluon_pdl_merge=True,
                                   gluon_early_q=True, gluon_early_q_max_rows=EARLY_Q_MAX_ROWS,
                                   gluon_swap_max_rows=16),
    # run 41: split_gwsw_p1 with an N of 8 up to 8 rows (run 40: the 8-row cases gained more than the 16-row ones)
    "split_gwsw8_p1": _PICK,
    # session 12: the pick with three ring buffers beside the 8-row Q (s3), the rows' sums reduced once after the loop
    # (l), and both (runs 43-44)
    "split_gwsw8s3_p1": _pick_with("split_gwsw8s3_p1", gluon_swap_fit_stages=3),
    "split_gwsw8l_p1": _pick_with("split_gwsw8l_p1", gluon_swap_late_sum=True),
    "split_gwsw8s3l_p1": _pick_with("split_gwsw8s3l_p1", gluon_swap_fit_stages=3, gluon_swap_late_sum=True),
    # session 12 (run 44): each warp's keys a softmax of their own (gluon_ws_swap_alt: no reduction across the
    # warpgroup's warps per tile; four accumulators per warpgroup merged after the loop)
    "split_gwsw8w_p1": _pick_with("split_gwsw8w_p1", gluon_swap_warp_softmax=True),
    # session 12 (run 45): the copies in a third partition of their own (p; gluon_ws_swap_alt), and with three ring
    # buffers beside an 8-row Q as well (ps3)
    "split_gwsw8p_p1": _pick_with("split_gwsw8p_p1", gluon_swap_producer=True),
    "split_gwsw8ps3_p1": _pick_with("split_gwsw8ps3_p1", gluon_swap_producer=True, gluon_swap_fit_stages=3),
    # session 12 (run 46): does the L1 cache's share of the SM matter? 32 KB of unused shared memory (the 8-row kernel
    # over the 164 KB carveout step, the 16-row one over 196 KB); run 46's split_gwsw8pt_p1 (P^T in the tile's rope
    # part) crashed at 16 rows and was removed (docs/kernel-notes.md, "Run 46 outcome")
    "split_gwsw8pad_p1": _pick_with("split_gwsw8pad_p1", gluon_swap_smem_pad=32768),
    # session 13: the pick's rows-as-N kernel on the fp8 e4m3 cache (gluon_ws_fp8, up to 16 rows, the math in fp16):
    # run 47's staged form (a third warpgroup copies fp8 tiles into a staging ring and converts them) with s22 up to
    # 8 rows and s13 above, and with s13 everywhere (r13); run 48's direct form (two warpgroups load fp8 into registers
    # and convert, no staging) with three fp16 tiles up to 8 rows and two above (d), and with two everywhere (d2)
    "split_gwsw8_fp8_p1": _pick_with("split_gwsw8_fp8_p1", kv_fp8=True, gluon_fp8_rings=("s22", "s13")),
    "split_gwsw8_fp8r13_p1": _pick_with("split_gwsw8_fp8r13_p1", kv_fp8=True, gluon_fp8_rings=("s13", "s13")),
    "split_gwsw8_fp8d_p1": _pick_with("split_gwsw8_fp8d_p1", kv_fp8=True, gluon_fp8_rings=("d3", "d2")),
    "split_gwsw8_fp8d2_p1": _pick_with("split_gwsw8_fp8d2_p1", kv_fp8=True, gluon_fp8_rings=("d2", "d2")),
    # session 13 (run 49): the conversion by integer instructions instead of the cvt pipe, in both forms
    "split_gwsw8_fp8i_p1": _pick_with("split_gwsw8_fp8i_p1", kv_fp8=True, gluon_fp8_conversion="int"),
    "split_gwsw8_fp8di_p1": _pick_with("split_gwsw8_fp8di_p1", kv_fp8=True, gluon_fp8_rings=("d3", "d2"),
                                       gluon_fp8_conversion="int"),
    # session 13 (run 50): each warp's keys a softmax of their own (run 49: warpgroup 0's softmax took 1,200-1,800
    # cycles a tile beside a converting warpgroup, 722 in the bf16 pick), staged (s13) and direct up to 8 rows
    "split_gwsw8_fp8w_p1": _pick_with("split_gwsw8_fp8w_p1", kv_fp8=True, gluon_fp8_rings=("s13", "s13"),
                                      gluon_fp8_softmax="warp"),
    "split_gwsw8_fp8dw_p1": _pick_with("split_gwsw8_fp8dw_p1", kv_fp8=True, gluon_fp8_rings=("d2", "s13"),
                                       gluon_fp8_softmax="warp"),
    # the fp8 pick (runs 47-51): the fastest ring measured at each N, s22 up to 8 rows and d2 above, the pick's
    # softmax and the cvt conversion (gluon_ws_fp8.DEFAULT_RINGS)
    "split_gwsw8_fp8p_p1": _pick_with("split_gwsw8_fp8p_p1", kv_fp8=True, gluon_fp8_rings=("s22", "d2")),
    # run 42: the plugin's Gluon kernel with the rows as the wgmma's N up to 16 rows (what the plugin serves since)
    "ragged_gwsw_p1": KernelVariant("ragged_gwsw_p1", "ragged_split_kv", 1, impl="gluon_ws", overrides=(("pdl", True),),
                                    gluon_swap_max_rows=16, gluon_swap_fit_rows=True),
    # session 14: the plugin's fp8 kernel (gluon_ws_ragged.ragged_split_kv_gluon_fp8: the fp8 pick's partitions on
    # SGLang's ragged layout, s22 up to 8 rows, d2 up to 16, 32-row tiles above in d2; what the plugin serves on an
    # fp8_e4m3 cache), and the same with the staged s13 ring at its 32-row tiles
    "ragged_gwsw_fp8_p1": KernelVariant("ragged_gwsw_fp8_p1", "ragged_split_kv", 1, kv_fp8=True, impl="gluon_ws",
                                        overrides=(("pdl", True),), gluon_swap_max_rows=16, gluon_swap_fit_rows=True),
    "ragged_gwsw_fp8w13_p1": KernelVariant("ragged_gwsw_fp8w13_p1", "ragged_split_kv", 1, kv_fp8=True,
                                           impl="gluon_ws", overrides=(("pdl", True),), gluon_swap_max_rows=16,
                                           gluon_swap_fit_rows=True, gluon_fp8_wide_ring="s13"),
    # session 15: the pick and the plugin's kernels with the KV cut into equal shares of tokens (split_round_tokens
    # 1): a 64-token round left 129 splits of 1,024 tokens at 128k (3 of 132 SMs idle, the others 3 % over an equal
    # share of 993) and 129 of 2,048 at 256k
    "split_gwsw8t_p1": _pick_with("split_gwsw8t_p1", overrides=(("split_round_tokens", 1),)),
    "ragged_gwsw_t_p1": KernelVariant("ragged_gwsw_t_p1", "ragged_split_kv", 1, impl="gluon_ws",
                                      overrides=(("pdl", True), ("split_round_tokens", 1)), gluon_swap_max_rows=16,
                                      gluon_swap_fit_rows=True),
    "ragged_gwsw_fp8t_p1": KernelVariant("ragged_gwsw_fp8t_p1", "ragged_split_kv", 1, kv_fp8=True, impl="gluon_ws",
                                         overrides=(("pdl", True), ("split_round_tokens", 1)), gluon_swap_max_rows=16,
                                         gluon_swap_fit_rows=True),
    # session 15: the plugin's fp8 kernel with row tiles of up to 64 rows in the s12 ring above 32 rows (one conversion
    # of each KV tile at 8 heads x 8 draft tokens, where 32-row tiles convert it twice), its defaults up to 32
    "ragged_gwsw_fp8w12_p1": KernelVariant("ragged_gwsw_fp8w12_p1", "ragged_split_kv", 1, kv_fp8=True,
                                           impl="gluon_ws", overrides=(("pdl", True),), gluon_swap_max_rows=16,
                                           gluon_swap_fit_rows=True, gluon_fp8_wide_ring="s12"),
    # run 37: the plugin's Gluon kernel with its merge as a programmatic dependent launch (what the plugin serves
    # since; ragged_gw_p1 and ragged_gwa_p1 keep the merge they were measured with)
    "ragged_gwap_p1": KernelVariant("ragged_gwap_p1", "ragged_split_kv", 1, impl="gluon_ws", overrides=(("pdl", True),)),
    "split_gwr32_p1": KernelVariant("split_gwr32_p1", "split_kv", 1, impl="gluon_ws", gluon_tile=(32, 4),
                                    gluon_prefetch=True, gluon_draft_branch=True, gluon_fold=True,
                                    gluon_merge_block_dv=64, gluon_merge_by_rows=True),
    # run 20: split_p1 up to 32 rows, split_gwf_p1 above (run 19's fastest of ours from 33 rows on)
    "split_auto_gwf_p1": KernelVariant("split_auto_gwf_p1", "split_kv", 1, impl="auto_ws", gluon_tile=(64, 2),
                                       gluon_prefetch=True, gluon_draft_branch=True, gluon_fold=True),
    "split_auto_p1": KernelVariant("split_auto_p1", "split_kv", 1, impl="auto", gluon_tile=(64, 2)),
    # run 17: split_p1 up to 32 rows, the warp-specialized kernel with prefetched token-table rows (split_gwp_p1) above
    "split_auto_ws_p1": KernelVariant("split_auto_ws_p1", "split_kv", 1, impl="auto_ws", gluon_tile=(64, 2),
                                      gluon_prefetch=True),
}

#: split_auto_p1 / split_auto_ws_p1 / split_auto_gwf_p1 run their Gluon kernel from this many packed rows on (below:
#: split_p1's Triton kernel); the arms keep it, so their committed rows keep their meaning
AUTO_GLUON_MIN_ROWS = 33
#: the SGLang plugin serves the warp-specialized Gluon kernel on sm_90 from this many packed rows on: every row count,
#: since runs 33-34 measured it faster than the Triton kernels at 8-32 rows too (0.83-0.90 of the Triton ragged kernel,
#: 0.69-0.72 at 24-32 rows; docs/kernel-notes.md, "Run 34 outcome")
PLUGIN_GLUON_MIN_ROWS = 1


def gluon_ws_kwargs(v: KernelVariant, config: SplitKVConfig, rows: int) -> dict[str, Any]:
    """The keyword arguments of ``gluon_ws.split_kv_gluon_ws`` for a warp-specialized arm at its resolved config (the
    merge as ``resolve_config`` made it) and ``rows`` packed rows: one mapping for the A/B's call and for ws_phases'
    profile of the same arm."""
    early_q = v.gluon_early_q and (v.gluon_early_q_max_rows is None or rows <= v.gluon_early_q_max_rows)
    return dict(block_n=config.block_n, stages=config.num_stages, prefetch=v.gluon_prefetch,
                overlap=v.gluon_overlap, draft_branch=v.gluon_draft_branch, fold=v.gluon_fold,
                bf16_partials=v.gluon_bf16_partials, pdl_merge=v.gluon_pdl_merge, grid_merge=v.gluon_grid_merge,
                merge_block_dv=config.merge_block_dv, merge_one_pass=config.merge_one_pass,
                merge_one_pass_max_splits=config.merge_one_pass_max_splits, join_tail_tokens=config.join_tail_tokens,
                early_q=early_q, split_round_tokens=config.split_round_tokens)


def gluon_swap_kwargs(v: KernelVariant, config: SplitKVConfig) -> dict[str, Any]:
    """The keyword arguments of the rows-as-N launcher an arm runs (``gluon_swap_call``) at its resolved config."""
    kw = dict(block_n=config.block_n, stages=config.num_stages, pdl_merge=v.gluon_pdl_merge,
              merge_block_dv=config.merge_block_dv, merge_one_pass=config.merge_one_pass,
              merge_one_pass_max_splits=config.merge_one_pass_max_splits, fit_rows=v.gluon_swap_fit_rows,
              fit_stages=v.gluon_swap_fit_stages, split_round_tokens=config.split_round_tokens)
    if v.gluon_swap_warp_softmax or v.gluon_swap_producer:
        return {**kw, "form": "warp_softmax" if v.gluon_swap_warp_softmax else "producer"}
    return {**kw, "late_sum": v.gluon_swap_late_sum, "smem_pad": v.gluon_swap_smem_pad}


def gluon_swap_call(v: KernelVariant, config: SplitKVConfig) -> tuple[Callable[..., torch.Tensor], dict[str, Any]]:
    """The rows-as-N launcher an arm runs and its keyword arguments: gluon_ws_swap's (the pick's form and its knobs)
    or gluon_ws_swap_alt's (the other forms, by ``form``): one mapping for the A/B's call and ws_phases' timed one."""
    kw = gluon_swap_kwargs(v, config)
    if "form" in kw:
        from specdiag.kernels.gluon_ws_swap_alt import split_kv_gluon_swap_alt  # noqa: PLC0415

        return split_kv_gluon_swap_alt, kw
    from specdiag.kernels.gluon_ws_swap import split_kv_gluon_swap  # noqa: PLC0415

    return split_kv_gluon_swap, kw


def runs_gluon_swap(v: KernelVariant, rows: int) -> bool:
    """True when variant ``v`` runs gluon_ws_swap's kernel (the rows as the wgmma's N) at ``rows`` packed rows (CUDA)."""
    return runs_gluon_ws(v, rows) and 0 < rows <= v.gluon_swap_max_rows


def runs_gluon_ws(v: KernelVariant, rows: int) -> bool:
    """True when variant ``v`` runs gluon_ws's warp-specialized kernel at ``rows`` packed rows (CUDA)."""
    return v.impl == "gluon_ws" or (v.impl == "auto_ws" and rows >= AUTO_GLUON_MIN_ROWS)


def variant(name: str) -> KernelVariant:
    if name not in KERNEL_VARIANTS:
        raise ValueError(f"unknown kernel {name!r}; choose one of {sorted(KERNEL_VARIANTS)}")
    return KERNEL_VARIANTS[name]


def resolve_config(name: str, rows: int, config: Optional[Any] = None) -> Optional[Any]:
    """The launch configuration variant ``name`` runs with at ``rows`` packed rows: ``config`` when given (tuning),
    else the variant's own 64-row tile (splitkv_plan.tile64_config) where it has one, else None (the default)."""
    v = variant(name)
    if v.design == "ragged_split_kv":
        from dataclasses import replace  # noqa: PLC0415

        from specdiag.kernels.splitkv_plan import fitting_ladder  # noqa: PLC0415

        if config is not None:
            return config
        if runs_gluon_ws(v, rows):
            from specdiag.kernels.gluon_ws_ragged import ragged_gluon_config  # noqa: PLC0415

            return replace(ragged_gluon_config(rows), **dict(v.overrides))
        return replace(fitting_ladder(rows)[0], **dict(v.overrides))
    if v.impl in ("gluon", "gluon_ws") or (v.impl in ("auto", "auto_ws") and rows >= AUTO_GLUON_MIN_ROWS):
        from dataclasses import replace  # noqa: PLC0415

        from specdiag.kernels.splitkv_plan import gluon_config  # noqa: PLC0415

        from specdiag.kernels.splitkv_plan import one_pass_merge_fields  # noqa: PLC0415

        # the variant's merge width, then its overrides (e.g. the merge's one pass, runs 28-29), then the row rule
        return replace(gluon_config(*v.gluon_tile), **{"merge_block_dv": v.gluon_merge_block_dv, **dict(v.overrides),
                                                       **dict(v.gluon_overrides),
                                                       **(one_pass_merge_fields(rows) if v.gluon_merge_by_rows
                                                          else {})})
    if config is not None or (v.tile64 is None and not v.overrides and not v.overrides64 and not v.overrides_many):
        return config
    from dataclasses import replace  # noqa: PLC0415

    from specdiag.kernels.splitkv_plan import default_config, tile64_config  # noqa: PLC0415

    cfg = tile64_config(rows, *v.tile64) if v.tile64 is not None else default_config(rows)
    if v.overrides64 and 33 <= rows <= 128:
        cfg = replace(cfg, **dict(v.overrides64))
    if v.overrides_many and rows > 128:
        cfg = replace(cfg, **dict(v.overrides_many))
    return replace(cfg, **dict(v.overrides)) if v.overrides else cfg


def supports(name: str, inputs: VerifyInputs) -> bool:
    """False when the variant cannot read this layout (a block table on the shuffled_p1 layout)."""
    return not (variant(name).page_size == 64 and inputs.block_table is None)


def unsupported_shape(name: str, rows: int) -> Optional[str]:
    """Why variant ``name`` cannot run a call of ``rows`` packed rows, or None: the dense fp8 rows-as-N kernel holds at
    most gluon_ws_swap.SWAP_MAX_ROWS rows (the harness records the reason in a skipped row); the plugin's fp8 kernel
    runs row tiles above 32 and holds any count."""
    v = variant(name)
    if v.kv_fp8 and v.impl == "gluon_ws" and v.design != "ragged_split_kv" and rows > v.gluon_swap_max_rows:
        return (f"{name} (gluon_ws_fp8, the rows as the wgmma's N) holds up to {v.gluon_swap_max_rows} packed rows "
                f"(heads x draft tokens); this case has {rows}")
    return None


def gluon_fp8_kwargs(v: KernelVariant, config: SplitKVConfig, rows: int) -> dict[str, Any]:
    """The keyword arguments of ``gluon_ws_fp8.split_kv_gluon_fp8`` for an fp8 rows-as-N arm at its resolved config
    and ``rows`` packed rows (its rings by the rows: the first up to 8, the second above)."""
    rings = None if v.gluon_fp8_rings is None else v.gluon_fp8_rings[0 if rows <= 8 else 1]
    return dict(block_n=config.block_n, pdl_merge=v.gluon_pdl_merge, merge_block_dv=config.merge_block_dv,
                merge_one_pass=config.merge_one_pass, merge_one_pass_max_splits=config.merge_one_pass_max_splits,
                rings=rings, conversion=v.gluon_fp8_conversion, softmax=v.gluon_fp8_softmax,
                split_round_tokens=config.split_round_tokens)


def fp8_wide_ring(v: KernelVariant, rows: int) -> Optional[str]:
    """The ring the plugin's fp8 arm ``v`` names for a call of ``rows`` packed rows (gluon_ws_ragged
    ``ragged_split_kv_gluon_fp8``'s ``rings``): its ``gluon_fp8_wide_ring`` above 16 rows (the 32- or 64-row tiles'),
    None up to 16 (the fp8 pick's ring by the rows). One rule for the harness's call and its plan fields."""
    return v.gluon_fp8_wide_ring if rows > 16 else None


def implementation(inputs: VerifyInputs) -> str:
    """'triton' when the inputs are on CUDA, else 'torch'."""
    return "triton" if inputs.q.is_cuda else "torch"


def run_variant(name: str, inputs: VerifyInputs, out: torch.Tensor, config: Optional[Any] = None) -> torch.Tensor:
    """Run kernel variant ``name`` into ``out``; ``config`` is a SplitKVConfig for split variants."""
    v = variant(name)
    config = resolve_config(name, inputs.heads * inputs.draft_tokens, config)
    if not supports(name, inputs):
        raise ValueError(f"{name} reads a 64-token block table, which the shuffled_p1 layout does not have")
    if v.kv_fp8 and inputs.cache_fp8 is None:
        raise ValueError(f"{name} reads the fp8 cache: make the inputs with mla.with_fp8_cache(inputs)")
    if inputs.q.is_cuda:
        if v.design == "ragged_split_kv":
            _ragged_call(v, inputs, out, config)()
            return out
        if v.design == "fused_split_kv":
            from specdiag.kernels.triton_fused import fused_split_kv_triton  # noqa: PLC0415

            return fused_split_kv_triton(inputs, out, page_size=v.page_size, cfg=config, kv_fp8=v.kv_fp8, merge=v.merge)
        if v.design == "baseline":
            from specdiag.kernels.triton_baseline import baseline_triton  # noqa: PLC0415

            return baseline_triton(inputs, out)
        rows = inputs.heads * inputs.draft_tokens
        if v.kv_fp8 and v.impl == "gluon_ws":
            reason = unsupported_shape(name, rows)
            if reason:
                raise ValueError(reason)
            from specdiag.kernels.gluon_ws_fp8 import split_kv_gluon_fp8  # noqa: PLC0415

            return split_kv_gluon_fp8(inputs, out, **gluon_fp8_kwargs(v, config, rows))
        if runs_gluon_swap(v, rows):
            launcher, kw = gluon_swap_call(v, config)
            return launcher(inputs, out, **kw)
        if runs_gluon_ws(v, rows):
            from specdiag.kernels.gluon_ws import split_kv_gluon_ws  # noqa: PLC0415

            return split_kv_gluon_ws(inputs, out, **gluon_ws_kwargs(v, config, rows))
        if v.impl == "gluon" or (v.impl == "auto" and rows >= AUTO_GLUON_MIN_ROWS):
            from specdiag.kernels.gluon_splitkv import split_kv_gluon  # noqa: PLC0415

            return split_kv_gluon(inputs, out, block_n=config.block_n, stages=config.num_stages,
                                  pv_across=v.gluon_pv_across, early_copy=v.gluon_early_copy)
        from specdiag.kernels.triton_splitkv import split_kv_triton  # noqa: PLC0415

        return split_kv_triton(inputs, out, page_size=v.page_size, cfg=config)
    if v.design == "baseline":
        return baseline_torch(inputs, out)
    n_splits = 4 if config is None else int(getattr(config, "n_splits", 4))
    return split_kv_torch(dequantized(inputs) if v.kv_fp8 else inputs, out, n_splits=n_splits)


def prepared_call(name: str, inputs: VerifyInputs, out: torch.Tensor,
                  config: Optional[Any] = None) -> Callable[[], object]:
    """A call that runs variant ``name`` on ``inputs`` into ``out``, for timing: what can be made once is made here
    (the ragged arms' SGLang layout, ``triton_splitkv_ragged.ragged_args``), so the timed call is the kernel's."""
    v = variant(name)
    if v.design == "ragged_split_kv" and inputs.q.is_cuda:
        return _ragged_call(v, inputs, out, resolve_config(name, inputs.heads * inputs.draft_tokens, config))
    return lambda: run_variant(name, inputs, out, config)


def _ragged_call(v: KernelVariant, inputs: VerifyInputs, out: torch.Tensor, cfg: Any) -> Callable[[], object]:
    """The plugin's kernel on ``inputs`` laid out as SGLang passes them (made here, once): the Gluon kernel on the
    ragged layout where variant ``v`` runs it (from 33 rows for impl auto_ws), else the Triton ragged kernel."""
    from specdiag.kernels.triton_splitkv_ragged import ragged_args, ragged_split_kv_triton  # noqa: PLC0415

    args = ragged_args(inputs, out.view(inputs.draft_tokens, inputs.heads, -1))
    draft_loc = args.pop("draft_loc")
    if v.kv_fp8:  # the fp8 cache as SGLang's fp8_e4m3 pool holds it: e4m3 values and one scale, drafts included
        from specdiag.kernels.gluon_ws_ragged import ragged_split_kv_gluon_fp8  # noqa: PLC0415

        fp8_args = {k: args[k] for k in ("q", "o", "qo_indptr", "kv_indptr", "kv_indices", "mask", "mask_indptr",
                                         "max_draft", "sm_scale")}
        rings = fp8_wide_ring(v, inputs.heads * inputs.draft_tokens)
        return lambda: ragged_split_kv_gluon_fp8(**fp8_args, kv=inputs.cache_fp8, draft_loc=draft_loc,
                                                 kv_scale=inputs.kv_scale, cfg=cfg, rings=rings)
    if runs_gluon_ws(v, inputs.heads * inputs.draft_tokens):
        from specdiag.kernels.gluon_ws_ragged import ragged_split_kv_gluon_ws  # noqa: PLC0415

        gl_args = {k: args[k] for k in ("q", "kv", "o", "qo_indptr", "kv_indptr", "kv_indices", "mask", "mask_indptr",
                                       "max_draft", "sm_scale")}
        swap = runs_gluon_swap(v, inputs.heads * inputs.draft_tokens)  # arms before run 42: the row-major kernel
        return lambda: ragged_split_kv_gluon_ws(**gl_args, draft_loc=draft_loc, cfg=cfg, swap=swap)
    return lambda: ragged_split_kv_triton(**args, cfg=cfg)
