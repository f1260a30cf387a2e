"""Training batches for the embedded models: real text with a copy curriculum.

Each sequence is a random window of the tokenized corpus. A share of the sequences (``copy_share``)
gets copy material written over parts of it, so that in-context copying pays off at every distance up to
the sequence length:
- repeated phrases: a span of 4-64 tokens taken from earlier in the same sequence is written again later
  (near or far), as real documents repeat names and phrases;
- periodic stretches: a sentence of 6-24 tokens taken from the corpus is repeated back to back for
  64-2048 tokens, the shape of the probe's "The cat sat on the mat. " prompt.
Everything else is plain corpus text, so the model still has to learn the language, and the corpus is
sampled at random offsets (no fixed epoch order) to keep memorization down.

Pure numpy; the generator is passed in (seeded by the caller).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class CopyCurriculum:
    copy_share: float = 0.5  # share of sequences that get copy material, 0..1
    phrases_per_1k_tokens: float = 1.5  # repeated phrases written per 1,000 tokens of a copy sequence
    periodic_per_16k_tokens: float = 3.0  # periodic stretches per 16,384 tokens of a copy sequence
    phrase_tokens: tuple[int, int] = (4, 64)  # length range of a repeated phrase, tokens
    period_tokens: tuple[int, int] = (6, 24)  # length range of a periodic stretch's sentence, tokens
    periodic_span_tokens: tuple[int, int] = (64, 2048)  # length range of a periodic stretch, tokens


def add_copies(seq: np.ndarray, corpus: np.ndarray, cfg: CopyCurriculum, rng: np.random.Generator) -> None:
    """Write repeated phrases and periodic stretches into `seq` in place."""
    n = len(seq)
    n_periodic = rng.poisson(cfg.periodic_per_16k_tokens * n / 16384)
    for _ in range(n_periodic):
        period = int(rng.integers(cfg.period_tokens[0], cfg.period_tokens[1] + 1))
        span = int(rng.integers(cfg.periodic_span_tokens[0], cfg.periodic_span_tokens[1] + 1))
        span = min(span, n // 2)
        if span <= 2 * period:
            continue
        src = int(rng.integers(0, len(corpus) - period))
        unit = corpus[src : src + period]
        start = int(rng.integers(0, n - span))
        reps = -(-span // period)
        seq[start : start + span] = np.tile(unit, reps)[:span]
    n_phrases = rng.poisson(cfg.phrases_per_1k_tokens * n / 1000)
    for _ in range(n_phrases):
        length = int(rng.integers(cfg.phrase_tokens[0], cfg.phrase_tokens[1] + 1))
        if n < 4 * length:
            continue
        src = int(rng.integers(0, n - 2 * length))
        # the copy lands after the source: half near (within 512 tokens), half anywhere later
        lo = src + length
        hi = min(n - length, lo + 512) if rng.random() < 0.5 else n - length
        if hi <= lo:
            continue
        dst = int(rng.integers(lo, hi + 1))
        seq[dst : dst + length] = seq[src : src + length].copy()


def sample_batch(
    corpus: np.ndarray, batch: int, seq_len: int, cfg: CopyCurriculum, rng: np.random.Generator
) -> np.ndarray:
    """A (batch, seq_len) int64 array of training sequences."""
    if len(corpus) <= seq_len + 1:
        raise ValueError(f"corpus has {len(corpus)} tokens, fewer than seq_len {seq_len} + 1")
    starts = rng.integers(0, len(corpus) - seq_len, size=batch)
    out = np.stack([corpus[s : s + seq_len] for s in starts]).astype(np.int64)
    for row in out:
        if rng.random() < cfg.copy_share:
            add_copies(row, corpus, cfg, rng)
    return out
