"""Unit tests of the embedded models' training pieces (data/models/): the copy curriculum, the exact
speculative check loop, and the corpus split. Synthetic data and fake models; seconds."""

from __future__ import annotations

import sys
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from specdiag.paths import DATA_DIR, MODELS_DIR

sys.path.insert(0, str(MODELS_DIR))

import curriculum  # noqa: E402
import speculate  # noqa: E402


def test_sample_batch_shape_and_seed() -> None:
    corpus = np.arange(10_000, dtype=np.int32) % 997
    cfg = curriculum.CopyCurriculum(copy_share=1.0)
    a = curriculum.sample_batch(corpus, 4, 512, cfg, np.random.default_rng(3))
    b = curriculum.sample_batch(corpus, 4, 512, cfg, np.random.default_rng(3))
    assert a.shape == (4, 512) and a.dtype == np.int64
    assert np.array_equal(a, b)


def test_add_copies_writes_a_periodic_stretch() -> None:
    corpus = np.arange(50_000, dtype=np.int64)  # no token repeats in plain corpus text
    cfg = curriculum.CopyCurriculum(copy_share=1.0, periodic_per_16k_tokens=16.0 * 8, phrases_per_1k_tokens=0.0,
                                    periodic_span_tokens=(200, 200))
    seq = corpus[1000:3048].copy()
    curriculum.add_copies(seq, corpus, cfg, np.random.default_rng(0))
    # some token now recurs at a fixed period
    periodic = [p for p in range(6, 25) if np.mean(seq[p:] == seq[:-p]) > 0.05]
    assert periodic, "no periodic stretch was written"


def test_add_copies_repeats_phrases_later() -> None:
    corpus = np.arange(50_000, dtype=np.int64)
    cfg = curriculum.CopyCurriculum(copy_share=1.0, periodic_per_16k_tokens=0.0, phrases_per_1k_tokens=5.0)
    seq = corpus[:4096].copy()
    curriculum.add_copies(seq, corpus, cfg, np.random.default_rng(1))
    _, counts = np.unique(seq, return_counts=True)
    assert (counts > 1).sum() >= 4 * 5  # at least some repeated phrases of >= 4 tokens


def test_sample_batch_rejects_short_corpus() -> None:
    with pytest.raises(ValueError, match="fewer than seq_len"):
        curriculum.sample_batch(np.arange(100, dtype=np.int32), 1, 512, curriculum.CopyCurriculum(),
                                np.random.default_rng(0))


def test_ngram_draft_takes_latest_match() -> None:
    ids = [1, 2, 3, 9, 9, 1, 2, 3, 7, 8, 5, 1, 2, 3]
    assert speculate.ngram_draft(ids, 3) == [7, 8, 5]
    assert speculate.ngram_draft([4, 5, 6], 3) == []


class _CycleModel(torch.nn.Module):
    """A fake causal LM whose greedy next token after t is cycle[(index of t) + 1]; `wrong_every`
    makes it predict a wrong token when the next position is a multiple of that."""

    def __init__(self, cycle: list[int], vocab: int = 32, wrong_every: int = 0) -> None:
        super().__init__()
        self.nxt = {a: b for a, b in zip(cycle, cycle[1:] + cycle[:1])}
        self.vocab, self.wrong_every = vocab, wrong_every

    def forward(self, input_ids: torch.Tensor) -> SimpleNamespace:
        ids = input_ids[0].tolist()
        logits = torch.full((1, len(ids), self.vocab), -10.0)
        for i, t in enumerate(ids):
            tok = self.nxt.get(t, 0)
            if self.wrong_every and (i + 1) % self.wrong_every == 0:
                tok = (tok + 1) % self.vocab
            logits[0, i, tok] = 10.0
        return SimpleNamespace(logits=logits)


def test_greedy_commit_lengths_are_exact() -> None:
    cycle = [3, 4, 5, 6, 7]
    target = _CycleModel(cycle)
    prompt = cycle * 6
    res = speculate.speculative_generate(target, prompt, 27, 8, drafter=target, device="cpu")
    assert res.step_commit_lengths == [9, 9, 9]  # every draft accepted, +1 bonus each step
    ref = speculate.speculative_generate(target, prompt, 27, 8, drafter=None, device="cpu")
    assert ref.output_ids == res.output_ids == (cycle * 8)[:27]
    # a drafter that is wrong at some positions: output unchanged (lossless), shorter commits
    bad = speculate.speculative_generate(target, prompt, 27, 8, drafter=_CycleModel(cycle, wrong_every=4),
                                         device="cpu")
    assert bad.output_ids == ref.output_ids
    assert bad.mean_commit_length < 9


def test_sampling_with_drafter_equal_to_target_accepts_all() -> None:
    cycle = [3, 4, 5, 6, 7]
    target = _CycleModel(cycle)
    gen = torch.Generator().manual_seed(0)
    res = speculate.speculative_sample(target, cycle * 4, 18, 8, target, "cpu", temperature=1.0, generator=gen)
    assert res.step_commit_lengths == [9, 9]


def test_novel_prose_is_held_out_of_training_text() -> None:
    train = (DATA_DIR / "corpus" / "train.txt").read_text(encoding="utf-8")
    novel = (DATA_DIR / "prompts" / "novel_prose.txt").read_text(encoding="utf-8")
    train_paras = {" ".join(p.split()) for p in train.split("\n\n")}
    novel_paras = [" ".join(p.split()) for p in novel.split("\n\n") if p.strip()]
    assert len(novel) > 900_000
    assert len(novel_paras) > 4000
    assert not [p for p in novel_paras if p in train_paras]


def test_onpolicy_prompts_end_periodically() -> None:
    import onpolicy  # noqa: PLC0415

    corpus = np.arange(20_000, dtype=np.int32)
    prompts = onpolicy.make_prompts(corpus, 6, 256, np.random.default_rng(0), periodic_share=1.0)
    assert prompts.shape == (6, 256)
    for row in prompts:
        tail = row[-64:]
        assert any(np.array_equal(tail[p:], tail[:-p]) for p in range(6, 25)), "tail is not periodic"
    plain = onpolicy.make_prompts(corpus, 2, 256, np.random.default_rng(0), periodic_share=0.0)
    assert all(np.array_equal(np.diff(r), np.ones(255)) for r in plain)  # untouched corpus windows
