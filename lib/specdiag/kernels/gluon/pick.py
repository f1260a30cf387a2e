"""The pick: the suite's fastest dense split-KV verify kernel on sm_90 (Hopper), and its form on an fp8 cache.

One call each, with one frozen config object passed through unchanged:

- :func:`split_kv_pick` (:class:`PickConfig`): up to ``swap_max_rows`` packed rows (heads x draft tokens) the
  warp-specialized kernel with the rows as the wgmma's N (gluon.swap; an N of 8 where the rows fit it), above
  them the row-major warp-specialized kernel (gluon.ws, warpgroup 0 loading Q under the first tiles' copies up to
  ``early_q_max_rows``). Both merge the splits' partials in one pass where that pays (up to
  32 rows at every split count, up to 16 splits above: :func:`plan.one_pass_merge_fields`) with 64 value dims
  per merge program, the merge launched as a programmatic dependent launch.
- :func:`split_kv_pick_fp8` (:class:`PickFp8Config`): the rows-as-N kernel on the fp8 e4m3 cache (gluon.fp8), up
  to 16 rows; ``rings`` names its ring up to 8 rows and above.

These are the calls the kernel A/B's ``pick`` and ``pick_fp8`` arms make. The SGLang plugin serves the same
partitions on SGLang's ragged layout (gluon.ragged). CUDA sm_90 only; the CPU tests compile them for sm_90.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from specdiag.kernels.mla import BLOCK_TOKENS, VerifyInputs
from specdiag.kernels.plan import one_pass_merge_fields


@dataclass(frozen=True)
class PickConfig:
    block_n: int = 64  #: tokens per KV tile
    stages: int = 2  #: KV tiles in the ring
    merge_block_dv: int = 64  #: value dims per merge program
    pdl_merge: bool = True  #: the merge launched under the partial grid's drain (programmatic dependent launch)
    swap_max_rows: int = 16  #: up to this many packed rows, the rows as the wgmma's N (at most gluon.swap's 16)
    fit_rows: bool = True  #: with the rows as N: an N of 8 where the rows fit it, else 16
    early_q_max_rows: int = 64  #: the row-major kernel's warpgroup 0 loads Q under the first copies up to this
    split_round_tokens: int = BLOCK_TOKENS  #: each split's tokens a multiple of this


@dataclass(frozen=True)
class PickFp8Config:
    block_n: int = 64  #: tokens per KV tile
    rings: tuple[str, str] = ("s22", "d2")  #: gluon.fp8.FP8_RINGS names up to 8 rows and above
    merge_block_dv: int = 64  #: value dims per merge program
    pdl_merge: bool = True  #: the merge as a programmatic dependent launch
    split_round_tokens: int = BLOCK_TOKENS  #: each split's tokens a multiple of this


PICK = PickConfig()
PICK_FP8 = PickFp8Config()


def pick_launch(cfg: PickConfig, rows: int) -> tuple[str, dict[str, Any]]:
    """Which kernel the pick runs for a call of ``rows`` packed rows ("swap": gluon.swap, "ws": gluon.ws) and its
    launcher's keyword arguments: pure, so the CPU tests can check what a GPU call would launch."""
    merge = {"merge_block_dv": cfg.merge_block_dv, "merge_one_pass": False, "merge_one_pass_max_splits": 512,
             **one_pass_merge_fields(rows)}
    common = dict(block_n=cfg.block_n, stages=cfg.stages, pdl_merge=cfg.pdl_merge,
                  split_round_tokens=cfg.split_round_tokens, **merge)
    if 0 < rows <= cfg.swap_max_rows:
        return "swap", dict(common, fit_rows=cfg.fit_rows)
    return "ws", dict(common, early_q=rows <= cfg.early_q_max_rows)


def pick_fp8_launch(cfg: PickFp8Config, rows: int) -> dict[str, Any]:
    """The fp8 launcher's keyword arguments for a call of ``rows`` packed rows (pure)."""
    merge = {"merge_one_pass": False, "merge_one_pass_max_splits": 512, **one_pass_merge_fields(rows)}
    return dict(block_n=cfg.block_n, pdl_merge=cfg.pdl_merge, merge_block_dv=cfg.merge_block_dv, **merge,
                rings=cfg.rings[0 if rows <= 8 else 1], split_round_tokens=cfg.split_round_tokens)


def split_kv_pick(inputs: VerifyInputs, out: torch.Tensor, cfg: PickConfig = PICK) -> torch.Tensor:
    """The pick on ``inputs`` (bf16 or fp16 cache, page_size 1 token table) into ``out`` [T, H, 512]."""
    form, kw = pick_launch(cfg, inputs.heads * inputs.draft_tokens)
    if form == "swap":
        from specdiag.kernels.gluon.swap import split_kv_gluon_swap  # noqa: PLC0415

        return split_kv_gluon_swap(inputs, out, **kw)
    from specdiag.kernels.gluon.ws import split_kv_gluon_ws  # noqa: PLC0415

    return split_kv_gluon_ws(inputs, out, **kw)


def split_kv_pick_fp8(inputs: VerifyInputs, out: torch.Tensor, cfg: PickFp8Config = PICK_FP8) -> torch.Tensor:
    """The pick on the fp8 cache of ``inputs`` (``mla.with_fp8_cache``) into ``out``; at most 16 packed rows."""
    from specdiag.kernels.gluon.fp8 import split_kv_gluon_fp8  # noqa: PLC0415
    from specdiag.kernels.gluon.swap import SWAP_MAX_ROWS  # noqa: PLC0415

    rows = inputs.heads * inputs.draft_tokens
    if rows > SWAP_MAX_ROWS:
        raise ValueError(f"the fp8 pick holds up to {SWAP_MAX_ROWS} packed rows (heads x draft tokens); this call has "
                         f"{rows}: the plugin's fp8 kernel (gluon.ragged) tiles more rows")
    if inputs.cache_fp8 is None:
        raise ValueError("split_kv_pick_fp8 reads the fp8 cache: make the inputs with mla.with_fp8_cache(inputs)")
    return split_kv_gluon_fp8(inputs, out, **pick_fp8_launch(cfg, rows))

