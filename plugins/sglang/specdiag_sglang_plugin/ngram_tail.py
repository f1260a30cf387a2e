"""NGRAM drafting without a per-step copy of the whole prompt (SGLang 0.5.17's NGRAMWorker).

Every verify step, ``NGRAMWorker._prepare_draft_tokens`` and ``_update_ngram_corpus`` each call
``list(req.origin_input_ids)`` and keep only its last ``max_trie_depth`` tokens
(``_efficient_concat_last_n``). ``origin_input_ids`` is an ``array("q")``: the ``list`` call makes one
Python int per prompt token, twice per step, on the scheduler's thread, and NGRAM runs synchronously
(its draft preparation copies the last step's accepted tokens to the host first). At 131,072 prompt tokens
this is O(prompt) CPU work in every decode step, which a fast verify kernel can no longer hide.

This module computes the same token lists from the prompt's tail only (``tail_tokens``), and holds
replacements of the two methods that differ from 0.5.17's only there. The replacements are registered
(hook.py, ``SPECDIAG_SGLANG_NGRAM_TAIL``, default on) only when SGLang's methods still contain the
copied pattern (``source_matches``); otherwise SGLang's own methods stay and the plugin says why.
"""

from __future__ import annotations

import inspect
from typing import Any, Sequence

NGRAM_WORKER = "sglang.srt.speculative.ngram_worker.NGRAMWorker"
PREPARE = NGRAM_WORKER + "._prepare_draft_tokens"
UPDATE = NGRAM_WORKER + "._update_ngram_corpus"
#: what 0.5.17's two methods must contain for the replacements to be exact copies but for the tail
EXPECTED = ("list(req.origin_input_ids)", "list(req.output_ids[-self.max_trie_depth :]) + prev_tokens",
            "self._efficient_concat_last_n(")


def concat_last_n(seq1: Sequence[int], seq2: list[int], n: int) -> list[int]:
    """SGLang's ``_efficient_concat_last_n``: the last ``n`` tokens of ``seq1 + seq2``."""
    if len(seq2) >= n:
        return seq2[-n:]
    need = n - len(seq2)
    return list(seq1[-need:]) + seq2


def tail_tokens(origin_input_ids: Sequence[int], output_ids: Sequence[int], prev_tokens: list[int],
                depth: int) -> list[int]:
    """The last ``depth`` tokens of prompt + output + prev_tokens, reading only the prompt's tail.

    Equal to 0.5.17's ``_efficient_concat_last_n(list(origin), list(output[-depth:]) + prev, depth)``
    (tests/test_sglang_plugin_ngram.py checks it against that expression).
    """
    if depth <= 0:
        raise ValueError(f"max_trie_depth must be positive, got {depth}")
    return concat_last_n(origin_input_ids[-depth:], list(output_ids[-depth:]) + list(prev_tokens), depth)


def source_matches(method: Any) -> tuple[bool, str]:
    """Whether SGLang's ``method`` still holds the code its replacement copies; (ok, why)."""
    name = getattr(method, "__name__", repr(method))
    try:
        src = inspect.getsource(method)
    except (OSError, TypeError) as exc:
        return False, f"{name}: source not readable ({type(exc).__name__}), SGLang's method kept"
    missing = [p for p in EXPECTED if p not in src]
    if missing:
        return False, f"{name} no longer contains {missing[0]!r} (another SGLang version), SGLang's method kept"
    return True, f"{name} is SGLang 0.5.17's code, replaced by the prompt-tail version"


def _prev_tokens(worker: Any, batch: Any, i: int, stride: int) -> list[int]:
    use_prev = worker.enable_overlap and not batch.grammar_needs_sync()
    if not use_prev:
        return []
    return worker.prev_token_ids[i * stride: i * stride + worker.prev_accept_lens[i]]


def prepare_draft_tokens(self: Any, batch: Any):
    """0.5.17's ``NGRAMWorker._prepare_draft_tokens``, reading only each prompt's tail."""
    bs = len(batch.reqs)
    stride = self.draft_token_num
    prev_token_ids, prev_accept_lens = batch.spec_info.accept_tokens, batch.spec_info.accept_lens
    if not prev_token_ids.is_cpu:
        prev_token_ids = prev_token_ids.cpu()
        prev_accept_lens = prev_accept_lens.cpu()
    self.prev_token_ids = prev_token_ids.tolist()
    self.prev_accept_lens = prev_accept_lens.tolist()

    self.ngram_corpus.synchronize()
    req_ids, batch_tokens, total_lens = [], [], []
    assert len(batch.reqs) == len(self.prev_accept_lens)
    for i, req in enumerate(batch.reqs):
        prev = _prev_tokens(self, batch, i, stride)
        req_ids.append(req.rid)
        batch_tokens.append(tail_tokens(req.origin_input_ids, req.output_ids, prev, self.max_trie_depth))
        total_lens.append(len(req.origin_input_ids) + len(req.output_ids) + len(prev))
    req_drafts, mask = self.ngram_corpus.batch_get(req_ids, batch_tokens, total_lens)
    assert len(req_drafts) == bs * self.draft_token_num, (
        f"{len(req_drafts)=}, {bs=}, {self.draft_token_num=}")
    return req_drafts, mask


def update_ngram_corpus(self: Any, batch: Any) -> None:
    """0.5.17's ``NGRAMWorker._update_ngram_corpus``, reading only each prompt's tail."""
    stride = self.draft_token_num
    batch_tokens = [tail_tokens(req.origin_input_ids, req.output_ids, _prev_tokens(self, batch, i, stride),
                                self.max_trie_depth) for i, req in enumerate(batch.reqs)]
    self.ngram_corpus.batch_put(batch_tokens)
