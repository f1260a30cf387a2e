"""The embedded target's KV in a token-slot pool, allocated as SGLang 0.5.17 allocates at page_size 1.

SGLang keeps every request's KV in one pool of token slots per layer and reads it through slot indices
(``req_to_token`` -> ``kv_indices``). Its ``TokenToKVPoolAllocator`` (sglang/srt/mem_cache/allocator/token.py, with
``need_sort`` False outside PD disaggregation) hands out slots from the **head** of its free list and puts freed slots
back at the **tail**, in the order they are freed; ``clear()`` (called by ``/flush_cache`` when idle) resets the list to
one contiguous range ``1..size`` (slot 0 is the padding slot). With the radix cache off a request's slots are freed when
it finishes; during speculative decoding each verify step allocates one slot per scored token and frees the rejected
ones at once. So after traffic has cycled the pool, a new request's KV is scattered; after a flush it is contiguous.

Here the same, for the embedded engine's target model:

- :class:`SlotAllocator`: the free list (head alloc, tail free, ``clear``), with a count of slots handed out since the
  last clear (``cycles`` = that over the pool size);
- :class:`ContiguousSlotAllocator` (``--kv-alloc contiguous``): the same interface over specdiag.kvalloc's contiguous
  allocator (sorted free ranges: grow the last run, best fit, largest first), the Tier 0 fix the SGLang plugin offers
  with ``SPECDIAG_SGLANG_KV_ALLOC=contiguous``;
- :class:`KVPool`: one key and one value tensor per layer, ``[size + 1, kv_heads, head_dim]``, allocated once;
- :class:`PooledKVCache`: one request's cache for transformers: each forward allocates a slot per new token, each layer
  writes its new keys and values at those slots and **gathers** the request's whole KV through its slot indices
  (``index_select``) for the attention, so a scattered layout is read as scattered; rejected drafts are freed
  (rollback) and every slot is freed at the end (``release``). It has RollbackCache's interface
  (``cache``, ``get_seq_length``, ``after_forward``, ``rollback``) plus ``before_forward`` and ``release``.

Models with sliding-window layers keep the plain RollbackCache (the pool is full attention only).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from specdiag.kvalloc import ContiguousAllocator
from specdiag.kvlayout import LayoutStats, layout_stats

#: the slot allocators of the embedded server (``--kv-alloc``): SGLang 0.5.17's free list, or the contiguous one
KV_ALLOCS = ("sglang", "contiguous")


class PoolExhausted(RuntimeError):
    """The pool has fewer free slots than a forward needs (SGLang would retract or refuse the request)."""


class SlotAllocator:
    """SGLang 0.5.17's page_size-1 allocator: slots from the head of the free list, freed slots to its tail."""

    def __init__(self, size: int) -> None:
        if size < 2:
            raise ValueError(f"the KV pool needs at least 2 slots; got {size}")
        self.size = int(size)
        self.clear()

    def clear(self) -> None:
        """One contiguous free range 1..size (slot 0 is the padding slot, never handed out), as after /flush_cache."""
        self._free = np.arange(1, self.size + 1, dtype=np.int64)
        self._head = 0
        self._tail: list[np.ndarray] = []  # freed slots not yet merged into _free, in free order
        self._tail_n = 0
        self.allocated_since_clear = 0
        self.clears = getattr(self, "clears", -1) + 1

    def available(self) -> int:
        return self._free.size - self._head + self._tail_n

    def alloc(self, n: int) -> np.ndarray:
        """The next ``n`` slots from the head of the free list."""
        if n > self._free.size - self._head:
            if n > self.available():
                raise PoolExhausted(f"the KV pool has {self.available()} free slots of {self.size}; {n} are needed")
            self._free = np.concatenate([self._free[self._head:], *self._tail])
            self._head, self._tail, self._tail_n = 0, [], 0
        out = self._free[self._head:self._head + n].copy()
        self._head += n
        self.allocated_since_clear += n
        return out

    def free(self, slots: np.ndarray) -> None:
        """Put ``slots`` back at the tail, in the order given."""
        slots = np.asarray(slots, dtype=np.int64).ravel()
        if slots.size:
            self._tail.append(slots.copy())
            self._tail_n += slots.size

    @property
    def cycles(self) -> float:
        """Slots handed out since the last clear over the pool size (>= 1: every slot of the fresh range was used)."""
        return self.allocated_since_clear / self.size

    def state(self) -> dict[str, Any]:
        return {"allocator": "sglang", "size": self.size, "available": self.available(),
                "allocated_since_clear": self.allocated_since_clear, "cycles": round(self.cycles, 4),
                "clears": self.clears}


class ContiguousSlotAllocator:
    """:class:`SlotAllocator`'s interface over specdiag.kvalloc's contiguous allocator (host indices, numpy)."""

    def __init__(self, size: int) -> None:
        if size < 2:
            raise ValueError(f"the KV pool needs at least 2 slots; got {size}")
        self.size = int(size)
        self._alloc = ContiguousAllocator(self.size, "cpu")
        self.clears = -1
        self.clear()

    def clear(self) -> None:
        """One contiguous free range 1..size, as after /flush_cache."""
        self._alloc.clear()
        self.allocated_since_clear = 0
        self.clears += 1

    def available(self) -> int:
        return self._alloc.available_size()

    def alloc(self, n: int) -> np.ndarray:
        out = self._alloc.alloc(n)
        if out is None:
            raise PoolExhausted(f"the KV pool has {self.available()} free slots of {self.size}; {n} are needed")
        self.allocated_since_clear += int(n)
        return out.numpy()

    def free(self, slots: np.ndarray) -> None:
        self._alloc.free(np.asarray(slots, dtype=np.int64))

    @property
    def cycles(self) -> float:
        return self.allocated_since_clear / self.size

    def state(self) -> dict[str, Any]:
        return {"allocator": "contiguous", "size": self.size, "available": self.available(),
                "allocated_since_clear": self.allocated_since_clear, "cycles": round(self.cycles, 4),
                "clears": self.clears, "free_ranges": self._alloc.num_free_ranges}


def make_allocator(kind: str, size: int) -> SlotAllocator | ContiguousSlotAllocator:
    """The slot allocator ``kind`` (one of KV_ALLOCS) for a pool of ``size`` slots."""
    if kind == "sglang":
        return SlotAllocator(size)
    if kind == "contiguous":
        return ContiguousSlotAllocator(size)
    raise ValueError(f"KV allocator {kind!r} is not one of {', '.join(KV_ALLOCS)}")


class KVPool:
    """Key and value tensors of every layer, one row per slot (row 0 unused: the padding slot)."""

    def __init__(self, num_layers: int, size: int, kv_heads: int, head_dim: int, dtype: torch.dtype,
                 device: torch.device, kv_alloc: str = "sglang") -> None:
        self.allocator = make_allocator(kv_alloc, size)
        shape = (size + 1, kv_heads, head_dim)
        # torch.empty: pages are committed as slots are first written, like a pool that has not been used yet
        self.keys = [torch.empty(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.values = [torch.empty(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.num_layers, self.kv_heads, self.head_dim = num_layers, kv_heads, head_dim

    @classmethod
    def for_model(cls, config: Any, size: int, dtype: torch.dtype, device: torch.device,
                  kv_alloc: str = "sglang") -> "KVPool | None":
        """A pool for ``config``'s layers; None when the model has sliding-window layers (they keep RollbackCache)."""
        types = getattr(config, "layer_types", None) or []
        if any(t != "full_attention" for t in types):
            return None
        heads = int(getattr(config, "num_key_value_heads", None) or config.num_attention_heads)
        head_dim = int(getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads)
        return cls(int(config.num_hidden_layers), size, heads, head_dim, dtype, device, kv_alloc)

    @property
    def bytes_per_token(self) -> int:
        return 2 * self.num_layers * self.kv_heads * self.head_dim * self.keys[0].element_size()


def _pooled_layer_class():
    from transformers.cache_utils import DynamicLayer  # noqa: PLC0415 - transformers loads with the models

    class PooledLayer(DynamicLayer):
        """One layer of a PooledKVCache: writes at the forward's new slots, returns the request's KV gathered by slot."""

        def __init__(self, owner: "PooledKVCache", index: int) -> None:
            super().__init__()
            self.owner, self.index = owner, index

        def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
            self.is_initialized = True

        def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any):
            if not self.is_initialized:
                self.lazy_initialization(key_states, value_states)
            return self.owner._write_and_gather(self.index, key_states, value_states)

        def get_seq_length(self) -> int:
            return self.owner.get_seq_length()

        def crop(self, tokens_to_remove: int) -> None:  # rollback goes through the owner, which frees the slots
            raise NotImplementedError("roll a PooledKVCache back with its rollback(n)")

    return PooledLayer


class PooledKVCache:
    """One request's KV in a :class:`KVPool` (module docstring). Not thread-safe: one request at a time."""

    def __init__(self, pool: KVPool, prefix: torch.Tensor | None = None) -> None:
        from transformers.cache_utils import Cache  # noqa: PLC0415

        self.pool = pool
        layer_cls = _pooled_layer_class()
        self.cache = Cache(layers=[layer_cls(self, i) for i in range(pool.num_layers)])
        # committed slots, in sequence order; ``prefix``: slots whose KV a prefix cache hands this request (already
        # written, its first tokens), which the request then owns like its own
        self._slots = (prefix.clone() if prefix is not None
                       else torch.zeros(0, dtype=torch.long, device=pool.keys[0].device))
        self._pending: torch.Tensor | None = None  # this forward's new slots
        self._index: torch.Tensor | None = None  # committed + pending: what this forward's attention gathers

    def get_seq_length(self) -> int:
        return int(self._slots.numel())

    def before_forward(self, n_tokens: int) -> None:
        """Allocate a slot for each of the forward's ``n_tokens`` new tokens (SGLang: out_cache_loc)."""
        new = torch.from_numpy(self.pool.allocator.alloc(n_tokens)).to(self._slots.device)
        self._pending = new
        self._index = torch.cat([self._slots, new])

    def _write_and_gather(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self._pending is None or self._index is None:
            raise RuntimeError("PooledKVCache: before_forward(n) must allocate the new tokens' slots first")
        if k.shape[0] != 1 or k.shape[-2] != self._pending.numel():
            raise RuntimeError(f"PooledKVCache: got {k.shape[-2]} new tokens (batch {k.shape[0]}), "
                               f"allocated {self._pending.numel()} slots for batch 1")
        kp, vp = self.pool.keys[layer], self.pool.values[layer]
        kp.index_copy_(0, self._pending, k[0].transpose(0, 1).to(kp.dtype))  # [n, heads, dim] into the new slots
        vp.index_copy_(0, self._pending, v[0].transpose(0, 1).to(vp.dtype))
        keys = kp.index_select(0, self._index).transpose(0, 1).unsqueeze(0)  # [1, heads, tokens, dim]
        values = vp.index_select(0, self._index).transpose(0, 1).unsqueeze(0)
        return keys, values

    def after_forward(self) -> None:
        if self._index is not None:
            self._slots = self._index
        self._pending = self._index = None

    def rollback(self, n_tokens: int) -> None:
        """Forget the last ``n_tokens`` tokens and free their slots to the tail (SGLang frees rejected drafts so)."""
        if n_tokens <= 0:
            return
        if n_tokens > self._slots.numel():
            raise ValueError(f"cannot roll back {n_tokens} tokens of {self._slots.numel()}")
        freed = self._slots[-n_tokens:]
        self._slots = self._slots[:-n_tokens]
        self.pool.allocator.free(freed.cpu().numpy())

    def slots(self) -> np.ndarray:
        """The request's slot indices in sequence order (what the attention reads)."""
        return self._slots.cpu().numpy()

    def layout(self) -> LayoutStats:
        return layout_stats(self.slots())

    def release(self, keep: int = 0) -> torch.Tensor:
        """Free the request's slots to the tail, in sequence order (the request finished), all but its first ``keep``
        tokens' (a prefix cache keeps those: the caller owns them from now on, and gets them back)."""
        if self._pending is not None:  # a forward that failed half-way: its slots go back too
            self.pool.allocator.free(self._pending.cpu().numpy())
            self._pending = self._index = None
        kept, rest = self._slots[:keep], self._slots[keep:]
        if rest.numel():
            self.pool.allocator.free(rest.cpu().numpy())
        self._slots = self._slots[:0]
        return kept
