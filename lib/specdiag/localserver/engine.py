"""Greedy draft-then-verify speculative decoding on transformers, one request at a time.

Algorithms, under SGLang's names:

- ``NONE``: target only, one token per forward.
- ``NGRAM``: prompt lookup (see ngram.py) proposes up to ``num_draft_tokens - 1`` tokens.
- ``STANDALONE``: a small draft model proposes ``num_draft_tokens - 1`` tokens greedily.
- ``DFLASH``: a DFlash block drafter (dflash.py) proposes ``num_draft_tokens - 1`` tokens (its block is
  ``num_draft_tokens`` long: the last committed token, then mask tokens) in one forward, from the target's
  hidden states of its target layers, which the target's prefill and verify forwards hand it.

``num_draft_tokens`` follows SGLang's ``speculative_num_draft_tokens``: the tokens one verify
forward scores, the last committed token included, so a step drafts ``num_draft_tokens - 1``
tokens and commits at most ``num_draft_tokens`` (the accepted drafts plus the target's bonus).

Lossless: the target scores ``[last committed token, d1 .. dk]`` in one forward; drafts are
accepted while they equal the target's argmax, then the target's own argmax at the first
mismatch (or after the last draft) is committed. The output is token for token what target-only
greedy decoding gives (up to floating-point differences between a k+1-token and a 1-token
forward, which is why the engine runs float32 by default).

Caches: with a slot pool (kvpool.KVPool, the server's default for a full-attention target) the target's KV lives
in pool slots allocated as SGLang allocates at page_size 1: each forward takes a slot per new token from the head of
the free list, each layer gathers the request's KV through its slot indices, rejected drafts' slots go back to the
tail at once and the request's slots when it finishes (kvpool.PooledKVCache); the final chunk carries the request's
layout (runs of consecutive slots, specdiag.kvlayout). With ``prefix_cache`` (the server's --enable-prefix-cache, a
slot pool and no DFLASH) the pool keeps one entry: the last request's prompt stays in its slots, and the next request
takes over the longest prefix it shares with it (all of its prompt but the last token at most: the first output token
needs a forward) and prefills only the rest; the entry's other slots go back to the free list's tail before the request
starts. The drafter always prefills the whole prompt. Otherwise, and always for the drafter, a transformers
``DynamicCache`` (kvcache.RollbackCache), from which rejected tokens are removed: cropped from full-attention
layers, and from sliding-window layers with the entries that slid out restored, so each sliding
layer holds exactly its window of the committed sequence. The drafter only processes the tokens
it has not seen (1 or 2 per step plus its own drafts), never the prefix again.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Literal

import numpy as np
import torch

from specdiag.localserver.config import ALGORITHMS
from specdiag.localserver.dflash import DFlashModel, DraftCache, TargetTap
from specdiag.localserver.kvcache import RollbackCache
from specdiag.localserver.kvpool import KVPool, PooledKVCache
from specdiag.localserver.models import LoadedModel
from specdiag.localserver.ngram import propose_ngram

Algorithm = Literal["NONE", "NGRAM", "STANDALONE", "DFLASH"]


@dataclass(frozen=True)
class SpecSettings:
    """How the engine decodes; field names follow SGLang's server arguments."""

    algorithm: Algorithm = "NONE"
    #: tokens per verify forward, last committed token included; drafts per step = this - 1
    num_draft_tokens: int = 8
    #: NGRAM: shortest and longest tail (in tokens) matched against earlier positions
    ngram_min_match_window_size: int = 1
    ngram_max_match_window_size: int = 12
    #: prefill (target and drafter) runs in chunks of at most this many tokens
    chunked_prefill_size: int = 2048
    #: DFLASH: context tokens the drafter keeps (SGLang's speculative_draft_window_size); None: all
    draft_window_size: int | None = None

    def __post_init__(self) -> None:
        if self.algorithm not in ALGORITHMS:
            raise ValueError(f"unknown speculative algorithm {self.algorithm!r}: use one of {', '.join(ALGORITHMS)}")
        if self.algorithm != "NONE" and self.num_draft_tokens < 2:
            raise ValueError(
                f"speculative_num_draft_tokens={self.num_draft_tokens}: it counts the last committed token, "
                "so it must be at least 2 to draft anything"
            )
        if not 1 <= self.ngram_min_match_window_size <= self.ngram_max_match_window_size:
            raise ValueError("need 1 <= ngram_min_match_window_size <= ngram_max_match_window_size")
        if self.chunked_prefill_size < 1:
            raise ValueError("chunked_prefill_size must be at least 1")
        if self.draft_window_size is not None and self.draft_window_size < self.num_draft_tokens:
            raise ValueError(f"speculative_draft_window_size {self.draft_window_size} is smaller than the block "
                             f"({self.num_draft_tokens} tokens): SGLang requires window >= block size")

    @property
    def drafts_per_step(self) -> int:
        return 0 if self.algorithm == "NONE" else self.num_draft_tokens - 1


@dataclass(frozen=True)
class DecodeRequest:
    """One greedy generation."""

    input_ids: list[int]
    max_new_tokens: int
    #: tokens that end generation (EOS unless ignore_eos, plus the request's stop_token_ids)
    stop_token_ids: frozenset[int] = frozenset()
    #: stop tokens are masked out of the target's logits until this many tokens were generated
    min_new_tokens: int = 0


@dataclass(frozen=True)
class StepStats:
    """One verify step of a speculative request."""

    committed: int  # tokens this step appended to the output (accepted drafts + bonus, cut at the end)
    correct_drafts: int  # drafts the target accepted (counted within ``committed``)
    proposed_drafts: int  # drafts actually sent to the verify forward this step
    draft_ms: float  # drafting wall time (CUDA synchronized)
    verify_ms: float  # target verify forward + acceptance wall time (CUDA synchronized)
    drafter_tokens: int  # tokens the drafter's forwards processed this step (0 for NGRAM)


@dataclass
class Chunk:
    """What one prefill or one step produced; the last chunk carries ``finish``."""

    new_ids: list[int]
    step: StepStats | None = None  # None for the prefill chunk and for NONE decoding
    prefill_ms: float | None = None  # on the prefill chunk: target (+ drafter) prefill wall time
    decode_ms: float | None = None  # NONE decoding: the one-token forward's wall time
    finish: dict[str, Any] | None = None  # SGLang finish_reason on the last chunk
    kv_layout: dict[str, Any] | None = None  # on the last chunk, with a slot pool: the request's layout (kvlayout)
    cached_tokens: int = 0  # on the prefill chunk: prompt tokens the prefix cache held (not prefilled)


@dataclass
class _State:
    ids: list[int]
    out: list[int] = field(default_factory=list)
    drafter_len: int = 0  # tokens of ``ids`` held in the drafter's cache
    dflash: DraftCache | None = None  # DFLASH: the drafter's context for this request
    dflash_pending: torch.Tensor | None = None  # DFLASH: target features of committed tokens not yet in it


class SpecEngine:
    """Greedy speculative decoding of one request at a time (callers serialize requests)."""

    def __init__(self, target: LoadedModel, drafter: LoadedModel | None, settings: SpecSettings,
                 pool: KVPool | None = None, dflash: DFlashModel | None = None, prefix_cache: bool = False) -> None:
        if settings.algorithm == "STANDALONE" and drafter is None:
            raise ValueError("STANDALONE needs a draft model: pass --speculative-draft-model-path")
        if settings.algorithm == "DFLASH" and dflash is None:
            raise ValueError("DFLASH needs a DFlash drafter: pass --speculative-draft-model-path")
        if dflash is not None and dflash.block_size != settings.num_draft_tokens:
            raise ValueError(f"the DFlash drafter drafts blocks of {dflash.block_size} tokens but "
                             f"speculative_num_draft_tokens is {settings.num_draft_tokens}: make them equal")
        self.target = target
        self.drafter = drafter if settings.algorithm == "STANDALONE" else None
        self.dflash = dflash if settings.algorithm == "DFLASH" else None
        self.tap = TargetTap(target.model, self.dflash.target_layer_ids) if self.dflash is not None else None
        self.settings = settings
        self.device = next(target.model.parameters()).device
        self.pool = pool  # the target's slot pool; None: a RollbackCache per request
        if prefix_cache and (pool is None or settings.algorithm == "DFLASH"):
            raise ValueError("the prefix cache keeps the target's KV in its slot pool (a full-attention target) and "
                             "works with NONE, NGRAM and STANDALONE (DFLASH's drafter needs the whole prompt's "
                             "target features)")
        self.prefix_cache = prefix_cache
        self._prefix_ids: list[int] = []  # the cached prompt (the last request's), and its slots in the pool
        self._prefix_slots = torch.zeros(0, dtype=torch.long)

    def warm_up(self, n_tokens: int = 16) -> None:
        """One short generation so first-request timings do not include one-off setup costs."""
        vocab = int(self.target.config.vocab_size)
        ids = [(7 * i + 3) % vocab for i in range(n_tokens)]
        for _ in self.generate(DecodeRequest(input_ids=ids, max_new_tokens=2 * self.settings.num_draft_tokens)):
            pass

    # ---- model plumbing -------------------------------------------------------------------
    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def _new_cache(self, lm: LoadedModel) -> RollbackCache | PooledKVCache:
        if lm is self.target and self.pool is not None:
            return PooledKVCache(self.pool)
        return RollbackCache(lm.config, max_rollback=self.settings.num_draft_tokens + 2)

    def _forward(self, lm: LoadedModel, ids: list[int], cache: RollbackCache | PooledKVCache,
                 keep: int) -> torch.Tensor:
        """Run ``ids`` through ``lm`` on top of ``cache``; logits of the last ``keep`` positions (0 = all)."""
        cache.before_forward(len(ids))
        x = torch.tensor([ids], dtype=torch.long, device=self.device)
        out = lm.model(input_ids=x, use_cache=True, logits_to_keep=keep, **{lm.cache_kwarg: cache.cache})
        cache.after_forward()
        return out.logits[0].float()

    def _prefill(self, lm: LoadedModel, ids: list[int], cache: Any) -> torch.Tensor:
        size = self.settings.chunked_prefill_size
        logits = torch.empty(0)
        for start in range(0, len(ids), size):
            logits = self._forward(lm, ids[start : start + size], cache, keep=1)
        return logits[-1]

    def _prefill_tapped(self, ids: list[int], cache: Any) -> tuple[torch.Tensor, torch.Tensor]:
        """DFLASH's prefill: the target's chunks as ``_prefill``, and the prompt's features from the tap."""
        assert self.tap is not None
        size = self.settings.chunked_prefill_size
        logits, feats = torch.empty(0), []
        for start in range(0, len(ids), size):
            logits = self._forward(self.target, ids[start : start + size], cache, keep=1)
            feats.append(self.tap.take())
        return logits[-1], torch.cat(feats)

    @staticmethod
    def _mask_stops(logits: torch.Tensor, first_index: int, req: DecodeRequest) -> torch.Tensor:
        """Forbid stop tokens at output positions before ``min_new_tokens`` (row j = output index first_index + j)."""
        if req.min_new_tokens <= first_index or not req.stop_token_ids:
            return logits
        rows = min(req.min_new_tokens - first_index, logits.shape[0])
        logits = logits.clone()
        stop = torch.tensor(sorted(req.stop_token_ids), device=logits.device)
        logits[:rows, stop] = float("-inf")
        return logits

    # ---- generation -------------------------------------------------------------------
    def generate(self, req: DecodeRequest, should_abort: Callable[[], bool] = lambda: False) -> Iterator[Chunk]:
        """Yield the prefill chunk (first token), then one chunk per verify (or decode) step."""
        if not req.input_ids:
            raise ValueError("empty prompt: send at least one token")
        with torch.inference_mode():
            yield from self._generate(req, should_abort)

    # ---- the prefix cache (one entry) ------------------------------------------------------------
    def cached_prefix(self, ids: list[int]) -> int:
        """Tokens of ``ids`` the prefix cache holds: the common prefix with the cached prompt, at most all but the
        last token (0 without the cache)."""
        if not self.prefix_cache:
            return 0
        n = min(len(self._prefix_ids), len(ids) - 1)
        i = 0
        while i < n and self._prefix_ids[i] == ids[i]:
            i += 1
        return i

    def drop_prefix(self, free: bool = True) -> None:
        """Forget the cached prompt; ``free``: its slots back to the free list's tail (False: the caller clears the
        whole pool)."""
        if free and self._prefix_slots.numel() and self.pool is not None:
            self.pool.allocator.free(self._prefix_slots.cpu().numpy())
        self._prefix_ids, self._prefix_slots = [], self._prefix_slots[:0]

    def _take_prefix(self, n: int) -> torch.Tensor | None:
        """The cached prompt's first ``n`` slots for a request (its other slots freed); the entry is emptied."""
        slots = self._prefix_slots
        self.drop_prefix(free=False)
        if slots[n:].numel() and self.pool is not None:
            self.pool.allocator.free(slots[n:].cpu().numpy())
        return slots[:n] if n else None

    def _generate(self, req: DecodeRequest, should_abort: Callable[[], bool]) -> Iterator[Chunk]:
        if self.prefix_cache:
            cached = self.cached_prefix(req.input_ids)
            t_cache = PooledKVCache(self.pool, self._take_prefix(cached))  # type: ignore[arg-type]
        else:
            cached, t_cache = 0, self._new_cache(self.target)
        try:
            yield from self._generate_on(req, should_abort, t_cache, cached)
        finally:
            if self.prefix_cache:  # the prompt's slots (as far as they were written) become the cached entry
                keep = min(len(req.input_ids), t_cache.get_seq_length())
                self._prefix_slots = t_cache.release(keep)
                self._prefix_ids = list(req.input_ids[:keep])
            else:
                t_cache.release()  # a pooled request's slots back to the free list's tail, in sequence order

    def _generate_on(self, req: DecodeRequest, should_abort: Callable[[], bool],
                     t_cache: RollbackCache | PooledKVCache, cached: int = 0) -> Iterator[Chunk]:
        """``cached``: prompt tokens whose KV ``t_cache`` already holds (the prefix cache's); the target prefills
        the rest."""
        state = _State(ids=list(req.input_ids))
        d_cache = self._new_cache(self.drafter) if self.drafter is not None else None
        layout = (lambda: t_cache.layout().as_dict()) if isinstance(t_cache, PooledKVCache) else (lambda: None)

        self._sync()
        t0 = time.perf_counter()
        if self.dflash is not None:
            state.dflash = DraftCache(self.dflash.info.num_hidden_layers, self.settings.draft_window_size)
            last_logits, state.dflash_pending = self._prefill_tapped(state.ids, t_cache)
        else:
            last_logits = self._prefill(self.target, state.ids[cached:], t_cache)
        if d_cache is not None:
            self._prefill(self.drafter, state.ids, d_cache)  # type: ignore[arg-type]
            state.drafter_len = len(state.ids)
        first = int(torch.argmax(self._mask_stops(last_logits[None], 0, req)[0]).item())
        self._sync()
        prefill_ms = (time.perf_counter() - t0) * 1e3

        if req.max_new_tokens <= 0:
            yield Chunk([], prefill_ms=prefill_ms, finish={"type": "length", "length": 0}, kv_layout=layout(),
                        cached_tokens=cached)
            return
        new, finish = self._commit(state, [first], req)
        yield Chunk(new, prefill_ms=prefill_ms, finish=finish, kv_layout=layout() if finish else None,
                    cached_tokens=cached)
        while finish is None:
            if should_abort():
                yield Chunk([], finish={"type": "abort", "message": "the client went away; generation stopped"},
                            kv_layout=layout())
                return
            if self.settings.algorithm == "NONE":
                chunk = self._decode_step(state, t_cache, req)
            else:
                chunk = self._spec_step(state, t_cache, d_cache, req)
            finish = chunk.finish
            if finish is not None:
                chunk.kv_layout = layout()
            yield chunk

    def _commit(self, state: _State, tokens: list[int], req: DecodeRequest) -> tuple[list[int], dict[str, Any] | None]:
        """Append ``tokens`` to the output until a stop token or max_new_tokens; return them and the finish."""
        taken: list[int] = []
        for tok in tokens:
            taken.append(tok)
            state.out.append(tok)
            state.ids.append(tok)
            if tok in req.stop_token_ids and len(state.out) > req.min_new_tokens:
                return taken, {"type": "stop", "matched": tok}
            if len(state.out) >= req.max_new_tokens:
                return taken, {"type": "length", "length": req.max_new_tokens}
        return taken, None

    def _decode_step(self, state: _State, t_cache: Any, req: DecodeRequest) -> Chunk:
        self._sync()
        t0 = time.perf_counter()
        logits = self._forward(self.target, [state.ids[-1]], t_cache, keep=1)
        tok = int(torch.argmax(self._mask_stops(logits, len(state.out), req)[-1]).item())
        self._sync()
        decode_ms = (time.perf_counter() - t0) * 1e3
        new, finish = self._commit(state, [tok], req)
        return Chunk(new, decode_ms=decode_ms, finish=finish)

    def _draft(self, state: _State, d_cache: Any | None) -> tuple[list[int], int]:
        """Draft tokens for the next verify; also the number of tokens the drafter processed."""
        k = self.settings.drafts_per_step
        if self.settings.algorithm == "DFLASH":
            return self._draft_dflash(state)
        if self.settings.algorithm == "NGRAM":
            drafts = propose_ngram(
                np.asarray(state.ids, dtype=np.int64),
                k,
                self.settings.ngram_min_match_window_size,
                self.settings.ngram_max_match_window_size,
            )
            return drafts, 0
        assert self.drafter is not None and d_cache is not None
        feed = state.ids[state.drafter_len :]  # committed tokens the drafter has not seen (1 or 2)
        drafts: list[int] = []
        processed = 0
        for _ in range(k):
            logits = self._forward(self.drafter, feed, d_cache, keep=1)
            processed += len(feed)
            drafts.append(int(torch.argmax(logits[-1]).item()))
            feed = [drafts[-1]]
        # the cache now holds ids + drafts[:-1]; the last draft was never fed
        state.drafter_len = len(state.ids) + k - 1
        return drafts, processed

    def _draft_dflash(self, state: _State) -> tuple[list[int], int]:
        """The committed tokens' features into the drafter's context, then one block: B - 1 drafts."""
        assert self.dflash is not None and state.dflash is not None and state.dflash_pending is not None
        added = int(state.dflash_pending.shape[0])
        self.dflash.add_context(state.dflash, state.dflash_pending)
        state.dflash_pending = None
        lm = self.target.model
        drafts = self.dflash.propose(state.dflash, state.ids[-1], len(state.ids) - 1, lm.get_input_embeddings(),
                                     lm.get_output_embeddings(), self.device)
        return drafts, added + self.dflash.block_size

    def _spec_step(self, state: _State, t_cache: Any, d_cache: Any | None, req: DecodeRequest) -> Chunk:
        self._sync()
        t0 = time.perf_counter()
        base_len = len(state.ids)
        drafts, drafter_tokens = self._draft(state, d_cache)
        self._sync()
        t1 = time.perf_counter()

        logits = self._forward(self.target, [state.ids[-1], *drafts], t_cache, keep=0)
        preds = torch.argmax(self._mask_stops(logits, len(state.out), req), dim=-1).tolist()
        accepted = 0
        while accepted < len(drafts) and drafts[accepted] == preds[accepted]:
            accepted += 1
        t_cache.rollback(len(drafts) - accepted)  # remove the rejected drafts
        if self.tap is not None:  # DFLASH: the last committed token and the accepted drafts become context
            state.dflash_pending = self.tap.take()[: accepted + 1]
        if d_cache is not None:
            keep = base_len + min(accepted, len(drafts) - 1)  # drafter cache: ids + accepted drafts it was fed
            d_cache.rollback(state.drafter_len - keep)
            state.drafter_len = keep
        self._sync()
        t2 = time.perf_counter()

        new, finish = self._commit(state, [*drafts[:accepted], preds[accepted]], req)
        step = StepStats(
            committed=len(new),
            correct_drafts=min(accepted, len(new) - 1),
            proposed_drafts=len(drafts),
            draft_ms=(t1 - t0) * 1e3,
            verify_ms=(t2 - t1) * 1e3,
            drafter_tokens=drafter_tokens,
        )
        return Chunk(new, step=step, finish=finish)
