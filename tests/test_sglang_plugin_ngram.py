"""The plugin's NGRAM prompt-tail drafting (ngram_tail.py) against SGLang 0.5.17's own code, on the CPU.

SGLang is not installed here: its two methods are copied below verbatim from 0.5.17
(sglang/srt/speculative/ngram_worker.py, NGRAMWorker._prepare_draft_tokens / _update_ngram_corpus /
_efficient_concat_last_n) and run on fake workers and batches next to the replacements.
"""

from __future__ import annotations

import random
import time
from array import array
from types import SimpleNamespace as NS

import pytest
import torch

from specdiag_sglang_plugin import hook, ngram_tail


class Sglang0517:
    """The 0.5.17 methods, verbatim but for the class they sit in."""

    def _efficient_concat_last_n(self, seq1, seq2, n):
        seq2_len = len(seq2)
        if seq2_len >= n:
            return seq2[-n:]

        need_from_seq1 = n - seq2_len
        return seq1[-need_from_seq1:] + seq2

    def _prepare_draft_tokens(self, batch):
        bs = len(batch.reqs)
        stride = self.draft_token_num

        prev_token_ids, prev_accept_lens = (
            batch.spec_info.accept_tokens,
            batch.spec_info.accept_lens,
        )
        if not prev_token_ids.is_cpu:
            prev_token_ids = prev_token_ids.cpu()
            prev_accept_lens = prev_accept_lens.cpu()
        self.prev_token_ids = prev_token_ids.tolist()
        self.prev_accept_lens = prev_accept_lens.tolist()

        self.ngram_corpus.synchronize()
        req_ids = []
        batch_tokens = []
        total_lens = []
        assert len(batch.reqs) == len(self.prev_accept_lens)
        use_prev_tokens = self.enable_overlap and not batch.grammar_needs_sync()
        i = 0
        for req in batch.reqs:
            prev_tokens = (
                self.prev_token_ids[i * stride : i * stride + self.prev_accept_lens[i]]
                if use_prev_tokens
                else []
            )
            check_token = self._efficient_concat_last_n(
                list(req.origin_input_ids),
                list(req.output_ids[-self.max_trie_depth :]) + prev_tokens,
                self.max_trie_depth,
            )
            req_ids.append(req.rid)
            batch_tokens.append(check_token)
            i += 1
            total_lens.append(
                len(req.origin_input_ids) + len(req.output_ids) + len(prev_tokens)
            )
        req_drafts, mask = self.ngram_corpus.batch_get(
            req_ids, batch_tokens, total_lens
        )
        total_draft_token_num = len(req_drafts)
        assert (
            total_draft_token_num == bs * self.draft_token_num
        ), f"{total_draft_token_num=}, {bs=}, {self.draft_token_num=}"
        return req_drafts, mask

    def _update_ngram_corpus(self, batch):
        batch_tokens = []
        i, stride = 0, self.draft_token_num
        use_prev_tokens = self.enable_overlap and not batch.grammar_needs_sync()
        for req in batch.reqs:
            prev_tokens = (
                self.prev_token_ids[i * stride : i * stride + self.prev_accept_lens[i]]
                if use_prev_tokens
                else []
            )
            put_ids = self._efficient_concat_last_n(
                list(req.origin_input_ids),
                list(req.output_ids[-self.max_trie_depth :]) + prev_tokens,
                self.max_trie_depth,
            )
            batch_tokens.append(put_ids)
            i += 1
        self.ngram_corpus.batch_put(batch_tokens)


class Corpus:
    """Records what the worker hands to the C++ corpus; answers batch_get with draft_token_num zeros per request."""

    def __init__(self, draft: int) -> None:
        self.draft, self.calls = draft, []

    def synchronize(self) -> None:
        self.calls.append(("sync",))

    def batch_get(self, req_ids, batch_tokens, total_lens):
        self.calls.append(("get", list(req_ids), [list(t) for t in batch_tokens], list(total_lens)))
        return [0] * (self.draft * len(req_ids)), [1] * (self.draft * self.draft * len(req_ids))

    def batch_put(self, batch_tokens):
        self.calls.append(("put", [list(t) for t in batch_tokens]))


def make_worker(cls, draft: int, depth: int, overlap: bool):
    w = cls.__new__(cls) if cls is not NS else NS()
    w.draft_token_num, w.max_trie_depth, w.enable_overlap = draft, depth, overlap
    w.ngram_corpus = Corpus(draft)
    return w


def make_batch(rng: random.Random, draft: int, prompt_lens: list[int], out_lens: list[int], grammar: bool):
    reqs = [NS(rid=f"r{i}", origin_input_ids=array("q", [rng.randrange(4096) for _ in range(p)]),
               output_ids=array("q", [rng.randrange(4096) for _ in range(o)]))
            for i, (p, o) in enumerate(zip(prompt_lens, out_lens))]
    accept = torch.tensor([rng.randrange(4096) for _ in range(draft * len(reqs))])
    lens = torch.tensor([rng.randrange(1, draft + 1) for _ in reqs])
    return NS(reqs=reqs, spec_info=NS(accept_tokens=accept, accept_lens=lens), grammar_needs_sync=lambda: grammar)


CASES = [  # draft, depth, prompt lengths, output lengths, overlap, grammar
    (8, 18, [5], [0], True, False),            # prompt shorter than the trie depth
    (8, 18, [131072], [0], True, False),      # the long prompt of the step-time problem
    (8, 18, [40, 3000], [2, 30], True, False),  # output longer than the depth
    (4, 7, [10, 11, 12], [3, 0, 9], False, False),  # sync mode: no prev tokens
    (8, 18, [100], [17], True, True),          # grammar forces sync splicing off
    (8, 1, [50], [0], True, False),            # depth 1
]


@pytest.mark.parametrize("draft,depth,prompts,outs,overlap,grammar", CASES)
def test_replacements_hand_the_corpus_what_sglang_does(draft, depth, prompts, outs, overlap, grammar):
    rng = random.Random(hash((draft, depth, tuple(prompts))) & 0xFFFF)
    batch = make_batch(rng, draft, prompts, outs, grammar)
    ref, ours = make_worker(Sglang0517, draft, depth, overlap), make_worker(NS, draft, depth, overlap)
    assert ngram_tail.prepare_draft_tokens(ours, batch) == Sglang0517._prepare_draft_tokens(ref, batch)
    ngram_tail.update_ngram_corpus(ours, batch)
    Sglang0517._update_ngram_corpus(ref, batch)
    assert ours.ngram_corpus.calls == ref.ngram_corpus.calls
    assert ours.prev_token_ids == ref.prev_token_ids and ours.prev_accept_lens == ref.prev_accept_lens
    got = ours.ngram_corpus.calls[1][2]  # what batch_get received: at most depth tokens per request
    assert all(0 < len(t) <= depth for t in got)


def test_tail_tokens_matches_sglangs_expression_on_random_lengths():
    rng = random.Random(7)
    for _ in range(300):
        depth = rng.randrange(1, 40)
        origin = array("q", [rng.randrange(100) for _ in range(rng.randrange(0, 80))])
        output = array("q", [rng.randrange(100) for _ in range(rng.randrange(0, 80))])
        prev = [rng.randrange(100) for _ in range(rng.randrange(0, 9))]
        want = Sglang0517()._efficient_concat_last_n(list(origin), list(output[-depth:]) + prev, depth)
        assert ngram_tail.tail_tokens(origin, output, prev, depth) == want


def test_tail_tokens_refuses_a_bad_depth():
    with pytest.raises(ValueError, match="max_trie_depth"):
        ngram_tail.tail_tokens(array("q", [1]), array("q"), [], 0)


def test_tail_tokens_does_not_scale_with_the_prompt():
    """The tail of a 131,072-token prompt costs about what a 1,024-token prompt's does (the best of several timings
    each, so a busy host moves both alike), where copying the whole prompt grows 128x."""
    def best_s(fn, repeats: int = 7) -> float:
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            for _ in range(20):
                fn()
            times.append(time.perf_counter() - t0)
        return min(times)

    small, large = array("q", range(1024)), array("q", range(131072))
    tail_small = best_s(lambda: ngram_tail.tail_tokens(small, array("q", [1, 2]), [3], 18))
    tail_large = best_s(lambda: ngram_tail.tail_tokens(large, array("q", [1, 2]), [3], 18))
    copy_large = best_s(lambda: list(large), repeats=3)
    assert tail_large < 4 * tail_small, (tail_small, tail_large)
    assert tail_large * 5 < copy_large, (tail_large, copy_large)


def test_source_check_accepts_0517_and_refuses_other_code():
    ok, why = ngram_tail.source_matches(Sglang0517._prepare_draft_tokens)
    assert ok, why
    assert ngram_tail.source_matches(Sglang0517._update_ngram_corpus)[0]

    def other(self, batch):
        return [req.origin_input_ids[-4:] for req in batch.reqs]

    ok, why = ngram_tail.source_matches(other)
    assert not ok and "list(req.origin_input_ids)" in why and "kept" in why


def test_around_hook_uses_the_replacement_only_for_0517_code(monkeypatch):
    monkeypatch.setattr(hook, "_NGRAM_OK", {})
    monkeypatch.setitem(hook.STATS, "ngram_tail", __import__("collections").Counter())
    rng = random.Random(3)
    batch = make_batch(rng, 8, [1000], [5], False)
    around = hook._ngram_around(ngram_tail.prepare_draft_tokens, "prepare")
    worker = make_worker(NS, 8, 18, True)
    around(Sglang0517._prepare_draft_tokens, worker, batch)
    assert hook.STATS["ngram_tail"]["prepare"] == 1

    calls = []

    def foreign(self, b):
        calls.append(b)
        return "sglang's"

    monkeypatch.setattr(hook, "_NGRAM_OK", {})
    assert around(foreign, worker, batch) == "sglang's" and calls == [batch]
    assert hook.STATS["ngram_tail"]["sglang_prepare"] == 1


@pytest.mark.parametrize("value,on", [("1", True), ("", True), ("on", True), ("0", False), ("off", False)])
def test_ngram_tail_switch(value, on):
    assert hook.ngram_tail_from_env({hook.NGRAM_TAIL_ENV: value}) is on
    assert hook.ngram_tail_from_env({}) is True


def test_ngram_tail_switch_refuses_nonsense():
    with pytest.raises(ValueError, match="SPECDIAG_SGLANG_NGRAM_TAIL"):
        hook.ngram_tail_from_env({hook.NGRAM_TAIL_ENV: "maybe"})


def test_around_hook_falls_back_for_good_when_the_replacement_raises(monkeypatch):
    monkeypatch.setattr(hook, "_NGRAM_OK", {})
    monkeypatch.setitem(hook.STATS, "ngram_tail", __import__("collections").Counter())

    def broken(worker, batch):
        raise RuntimeError("boom")

    around = hook._ngram_around(broken, "update")
    hook._NGRAM_OK["update"] = (True, "as if SGLang's method were 0.5.17's")
    seen = []
    worker, batch = NS(), NS()
    assert around(lambda w, b: seen.append(b) or "sglang's", worker, batch) == "sglang's"
    assert seen == [batch] and hook._NGRAM_OK["update"][0] is False and "boom" in hook._NGRAM_OK["update"][1]
    around(lambda w, b: seen.append(b), worker, batch)  # no second try of the replacement
    assert len(seen) == 2 and hook.STATS["ngram_tail"]["sglang_update"] == 2
