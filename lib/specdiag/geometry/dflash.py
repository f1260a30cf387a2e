"""A DFlash drafter's config.json, read and checked against its target's before any engine starts (pure).

DFlash (z-lab, arXiv 2602.06036) drafts a block of ``block_size`` tokens, the last committed token then mask
tokens, in one forward, from the target's hidden states of a few target layers. What a drafter folder must say, and
what the engines require of it (read in sgl-project/sglang ``python/sglang/srt/models/dflash.py``,
``srt/speculative/dflash_utils.py`` and ``srt/arg_groups/speculative_hook.py`` ``_handle_dflash``; limits
measured on the H200 with SGLang 0.5.17, 2026-12-03):

- ``architectures`` holds ``DFlashDraftModel``; ``hidden_size`` equals the target's (``fc`` projects the target's
  features straight into the drafter's residual stream, and the target's embedding and LM head are reused);
- ``dflash_config.target_layer_ids``: 0-based target layers whose outputs are the context features. SGLang
  captures the input of layer ``id + 1``, so every id must be at most ``L - 2`` for a target of ``L`` layers
  (``L - 1`` failed CUDA-graph capture on the H200 with "captured 1 of 2 aux hidden states"). Without the list
  SGLang spreads ``num_hidden_layers`` ids over ``1 .. L - 3`` (``build_target_layer_ids``);
- ``dflash_config.mask_token_id`` (newer checkpoints), else ``dflash_config.mask_token`` (a token string, default
  ``<|MASK|>``) that the target's tokenizer must know; the id must be inside the target's vocabulary;
- ``block_size`` (SGLang's default for ``--speculative-num-draft-tokens`` when neither that nor
  ``--speculative-dflash-block-size`` is given; else 16). With both flags given they must be equal; a draft
  window (``--speculative-draft-window-size``) must be at least the block size;
- ``layer_types``: ``full_attention`` layers attend bidirectionally inside the block (SGLang's ENCODER_ONLY),
  ``sliding_attention`` layers causally over ``sliding_window`` tokens (DECODER).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ARCHITECTURE = "DFlashDraftModel"
DEFAULT_MASK_TOKEN = "<|MASK|>"  # SGLang's DEFAULT_DFLASH_MASK_TOKEN
DEFAULT_BLOCK_SIZE = 16  # SGLang's fallback when neither the flags nor the config give one


class DFlashConfigError(ValueError):
    """A DFlash drafter, or its settings, cannot serve this target; the message names the problem and the fix."""


@dataclass(frozen=True)
class DFlashDrafter:
    """What a DFlash drafter's config.json says (``None``: not stated there)."""

    hidden_size: int
    num_hidden_layers: int
    target_layer_ids: tuple[int, ...] | None  # None: the engine derives them (default_target_layer_ids)
    mask_token_id: int | None
    mask_token: str | None  # the mask token's text, when the config names it instead of an id
    block_size: int | None
    num_target_layers: int | None
    layer_types: tuple[str, ...]  # one per drafter layer; full_attention when unstated
    sliding_window: int | None

    def resolved_target_layer_ids(self, target_layers: int) -> tuple[int, ...]:
        """The ids as SGLang resolves them for a target of ``target_layers`` layers."""
        if self.target_layer_ids is not None:
            return self.target_layer_ids
        return tuple(default_target_layer_ids(target_layers, self.num_hidden_layers))


def default_target_layer_ids(target_layers: int, draft_layers: int) -> list[int]:
    """SGLang's ``build_target_layer_ids``: the middle layer for one drafter layer, else ``draft_layers`` ids spread
    evenly over ``1 .. L - 3``."""
    if target_layers <= 0 or draft_layers <= 0:
        raise DFlashConfigError(f"need positive layer counts, got target {target_layers}, drafter {draft_layers}")
    if draft_layers == 1:
        return [target_layers // 2]
    start, end = 1, target_layers - 3
    if end < start:
        raise DFlashConfigError(f"a {target_layers}-layer target is too shallow for SGLang's default target layers "
                                "(it needs 4): give dflash_config.target_layer_ids in the drafter's config.json")
    return [int(round(start + i * (end - start) / (draft_layers - 1))) for i in range(draft_layers)]


def is_dflash_config(cfg: dict[str, Any]) -> bool:
    return ARCHITECTURE in (cfg.get("architectures") or []) or isinstance(cfg.get("dflash_config"), dict)


def parse_dflash_config(cfg: dict[str, Any], where: str = "the drafter's config.json") -> DFlashDrafter:
    """The drafter facts of a config dict; DFlashConfigError when it is not a DFlash drafter's."""
    if not is_dflash_config(cfg):
        raise DFlashConfigError(f"{where} is not a DFlash drafter's (architectures {cfg.get('architectures')}, no "
                                "dflash_config): give a DFlashDraftModel folder (data/models/make_dflash_drafter.py "
                                "writes one), or use ALGORITHM=STANDALONE for an ordinary draft model")
    dcfg = cfg.get("dflash_config") or {}
    try:
        hidden, layers = int(cfg["hidden_size"]), int(cfg["num_hidden_layers"])
    except (KeyError, TypeError, ValueError):
        raise DFlashConfigError(f"{where} lacks hidden_size or num_hidden_layers") from None
    ids = dcfg.get("target_layer_ids")
    if ids is not None:
        if not isinstance(ids, (list, tuple)) or not ids:
            raise DFlashConfigError(f"{where}: dflash_config.target_layer_ids must be a non-empty list of ints")
        ids = tuple(int(i) for i in ids)
    mask_id = dcfg.get("mask_token_id")
    types = tuple(cfg.get("layer_types") or ["full_attention"] * layers)
    if len(types) != layers:
        raise DFlashConfigError(f"{where}: layer_types has {len(types)} entries for {layers} layers (one per layer)")
    unknown = sorted(set(types) - {"full_attention", "sliding_attention"})
    if unknown:
        raise DFlashConfigError(f"{where}: layer types {unknown} are not full_attention or sliding_attention")
    window = cfg.get("sliding_window")
    if "sliding_attention" in types and not window:
        raise DFlashConfigError(f"{where} has sliding_attention layers but no sliding_window: set one")
    block = cfg.get("block_size")
    return DFlashDrafter(hidden_size=hidden, num_hidden_layers=layers, target_layer_ids=ids,
                         mask_token_id=None if mask_id is None else int(mask_id),
                         mask_token=dcfg.get("mask_token") if mask_id is None else None,
                         block_size=None if block is None else int(block),
                         num_target_layers=None if cfg.get("num_target_layers") is None
                         else int(cfg["num_target_layers"]),
                         layer_types=types, sliding_window=None if not window else int(window))


def read_dflash_drafter(folder: Path | str) -> DFlashDrafter:
    """parse_dflash_config of ``folder/config.json``; DFlashConfigError naming the folder when it is missing."""
    path = Path(folder) / "config.json"
    try:
        cfg = json.loads(path.read_text())
    except FileNotFoundError:
        raise DFlashConfigError(f"no config.json in the DFlash drafter folder {folder}: give a drafter folder "
                                "(python data/models/make_dflash_drafter.py --target TARGET --out DIR writes one)"
                                ) from None
    except ValueError as exc:
        raise DFlashConfigError(f"{path} is not valid JSON: {exc}") from None
    return parse_dflash_config(cfg, where=str(path))


def resolve_block_size(drafter: DFlashDrafter | None, block_size: int | None, num_draft_tokens: int | None) -> int:
    """The verify block as SGLang's ``_handle_dflash`` resolves it: the block-size flag, else the draft-tokens flag,
    else the drafter's ``block_size``, else 16. Both flags given must agree (SGLang refuses otherwise)."""
    if block_size is not None and block_size < 2:
        raise DFlashConfigError(f"block size {block_size}: a block holds the last committed token and at least one "
                                "drafted token, so it must be at least 2")
    if block_size is not None and num_draft_tokens is not None and block_size != num_draft_tokens:
        raise DFlashConfigError(f"block size {block_size} disagrees with DRAFT_TOKENS {num_draft_tokens}: for DFLASH "
                                "the verify window is the block, so they must be equal (give one of them, or the "
                                "same number to both)")
    for value in (block_size, num_draft_tokens, drafter.block_size if drafter else None):
        if value is not None:
            if value < 2:
                raise DFlashConfigError(f"block size {value} must be at least 2")
            return int(value)
    return DEFAULT_BLOCK_SIZE


def check_draft_window(window_tokens: int | None, block_size: int) -> None:
    """SGLang: ``--speculative-draft-window-size`` must be positive and at least the block size."""
    if window_tokens is None:
        return
    if window_tokens < block_size:
        raise DFlashConfigError(f"draft window {window_tokens} is smaller than the block ({block_size} tokens): "
                                "SGLang requires window >= block size; raise DRAFT_WINDOW or leave it unset")


def check_against_target(drafter: DFlashDrafter, target_cfg: dict[str, Any], where: str = "the drafter") -> \
        tuple[int, ...]:
    """Raise DFlashConfigError unless the drafter fits the target; return the resolved target layer ids."""
    text = target_cfg.get("text_config") if isinstance(target_cfg.get("text_config"), dict) else target_cfg
    t_hidden, t_layers = int(text["hidden_size"]), int(text["num_hidden_layers"])
    vocab = int(text.get("vocab_size") or 0)
    if drafter.hidden_size != t_hidden:
        raise DFlashConfigError(f"{where}'s hidden_size {drafter.hidden_size} differs from the target's {t_hidden}: a "
                                "DFlash drafter reads the target's hidden states and embeddings, so it must be made "
                                "for this target (make_dflash_drafter.py --target TARGET)")
    ids = drafter.resolved_target_layer_ids(t_layers)
    bad = [i for i in ids if not 0 <= i <= t_layers - 2]
    if bad:
        raise DFlashConfigError(f"{where}'s target_layer_ids {list(ids)} include {bad}: each must be 0..{t_layers - 2} "
                                f"for a {t_layers}-layer target (SGLang captures the input of layer id + 1; the last "
                                "layer fails its CUDA-graph capture); remake the drafter with lower ids")
    if len(set(ids)) != len(ids):
        raise DFlashConfigError(f"{where}'s target_layer_ids {list(ids)} repeat a layer: the engine captures each "
                                "layer's hidden state once, so the drafter's input comes up short (SGLang 0.5.17 fails "
                                "its CUDA-graph capture: 'captured 1 of 6 aux hidden states'); remake the drafter with "
                                "distinct ids")
    if drafter.mask_token_id is not None and vocab and not 0 <= drafter.mask_token_id < vocab:
        raise DFlashConfigError(f"{where}'s mask_token_id {drafter.mask_token_id} is outside the target's vocabulary "
                                f"(0..{vocab - 1}); set dflash_config.mask_token_id to an id below {vocab}")
    return ids


def check_dflash_launch(draft_model_path: Path | str | None, target_path: Path | str | None,
                        block_size: int | None, num_draft_tokens: int | None,
                        draft_window: int | None) -> tuple[DFlashDrafter | None, int]:
    """Everything a DFLASH launch can check on this machine before it starts: a drafter given, its config a DFlash
    one that fits the target's (when both folders are here), the block size and the draft window. Returns the
    drafter (None when its folder is not on this machine) and the block size."""
    if not draft_model_path:
        raise DFlashConfigError("DFLASH needs a DFlash drafter: set DRAFT_MODEL=<folder> (--draft-model); "
                                "python data/models/make_dflash_drafter.py --target TARGET --out DIR writes one")
    drafter = None
    if Path(draft_model_path).is_dir():
        drafter = read_dflash_drafter(draft_model_path)
        target_cfg = Path(target_path) / "config.json" if target_path else None
        if target_cfg is not None and target_cfg.is_file():
            check_against_target(drafter, json.loads(target_cfg.read_text()), where=f"the drafter {draft_model_path}")
    block = resolve_block_size(drafter, block_size, num_draft_tokens)
    if draft_window is not None and draft_window <= 0:
        raise DFlashConfigError(f"draft window {draft_window} must be a positive number of tokens")
    check_draft_window(draft_window, block)
    return drafter, block


__all__ = ["ARCHITECTURE", "DEFAULT_BLOCK_SIZE", "DEFAULT_MASK_TOKEN", "DFlashConfigError", "DFlashDrafter",
           "check_against_target", "check_dflash_launch", "check_draft_window", "default_target_layer_ids",
           "is_dflash_config", "parse_dflash_config", "read_dflash_drafter", "resolve_block_size"]
