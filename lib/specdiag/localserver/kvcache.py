"""A transformers ``DynamicCache`` that can take back the last tokens, sliding-window layers included.

Speculative decoding writes drafts into the caches and must remove the rejected ones. For
full-attention layers that is a crop. A sliding-window layer (``DynamicSlidingWindowLayer``)
keeps only its last ``sliding_window - 1`` tokens, so after a crop it would be missing the
tokens that slid out while the (now rejected) drafts were being written.

This wrapper keeps, per sliding layer, the last few evicted key/value entries (a stash of at
most ``max_rollback`` tokens) and restores them on rollback, so each sliding layer always holds
exactly the last ``min(length, sliding_window - 1)`` tokens of the committed sequence. It trims
sliding layers itself after every forward, which is what both transformers 5.17 (whose
past-recording layers return every stored entry, so they must hold no more than the window
before a forward) and later releases expect.
"""

from __future__ import annotations

from typing import Any

import torch


class RollbackCache:
    """Owns a ``DynamicCache`` for one model; call ``after_forward()`` after each forward."""

    def __init__(self, config: Any, max_rollback: int) -> None:
        from transformers import DynamicCache

        self.cache = DynamicCache(config=config)
        for layer in self.cache.layers:
            if getattr(layer, "is_sliding", False) and hasattr(layer, "activate_past_recording"):
                layer.activate_past_recording()  # evictions happen in after_forward, where we can stash them
        self.max_rollback = max_rollback
        self._stash: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    def _sliding(self) -> list[tuple[int, Any]]:
        return [(i, layer) for i, layer in enumerate(self.cache.layers)
                if getattr(layer, "is_sliding", False) and getattr(layer, "is_initialized", False)]

    def get_seq_length(self) -> int:
        return int(self.cache.get_seq_length())

    def before_forward(self, n_tokens: int) -> None:
        """Nothing to allocate (the slot pool's hook, kvpool.PooledKVCache)."""

    def release(self) -> None:
        """Nothing to free (the slot pool's hook)."""

    def after_forward(self) -> None:
        """Trim sliding layers to their last ``sliding_window - 1`` entries, stashing what falls out."""
        for i, layer in self._sliding():
            keep = layer.sliding_window - 1
            stored = layer.keys.shape[-2]
            if stored <= keep:
                continue
            old_k, old_v = layer.keys[:, :, : stored - keep, :], layer.values[:, :, : stored - keep, :]
            if i in self._stash:
                sk, sv = self._stash[i]
                old_k, old_v = torch.cat([sk, old_k], dim=-2), torch.cat([sv, old_v], dim=-2)
            self._stash[i] = (old_k[:, :, -self.max_rollback :, :], old_v[:, :, -self.max_rollback :, :])
            layer.keys, layer.values = layer.keys[:, :, -keep:, :], layer.values[:, :, -keep:, :]

    def rollback(self, n_tokens: int) -> None:
        """Forget the last ``n_tokens`` tokens in every layer (0 is a no-op)."""
        if n_tokens <= 0:
            return
        if n_tokens > self.max_rollback:
            raise ValueError(f"cannot roll back {n_tokens} tokens; at most {self.max_rollback}")
        sliding = dict(self._sliding())
        for i, layer in enumerate(self.cache.layers):
            if i not in sliding:
                layer.crop(-n_tokens)
                continue
            total = layer.cumulative_length - n_tokens
            keys, values = layer.keys, layer.values
            if i in self._stash:  # the stash holds the entries just before the layer's, contiguous with them
                sk, sv = self._stash[i]
                keys, values = torch.cat([sk, keys], dim=-2), torch.cat([sv, values], dim=-2)
            keys, values = keys[:, :, : keys.shape[-2] - n_tokens, :], values[:, :, : values.shape[-2] - n_tokens, :]
            split = keys.shape[-2] - min(total, layer.sliding_window - 1)
            if split < 0:
                raise RuntimeError(f"layer {i}: sliding-window stash too short to roll back {n_tokens} tokens")
            self._stash[i] = (keys[:, :, :split, :], values[:, :, :split, :])
            layer.keys, layer.values = keys[:, :, split:, :], values[:, :, split:, :]
            layer.cumulative_length = total
