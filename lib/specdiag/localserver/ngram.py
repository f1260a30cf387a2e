"""NGRAM drafting (prompt lookup): propose the continuation of an earlier copy of the sequence's tail.

SGLang's NGRAM keeps a trie over prompts and outputs and searches it breadth-first; this is the
single-request core of the same idea, as in vLLM's ngram proposer and transformers' prompt lookup:
match the last n tokens (n from ``max_match_window_size`` down to ``min_match_window_size``)
against earlier positions of the same sequence and propose the tokens that followed.
"""

from __future__ import annotations

import numpy as np


def propose_ngram(
    tokens: np.ndarray,
    num_drafts: int,
    min_match_window_size: int = 1,
    max_match_window_size: int = 12,
) -> list[int]:
    """Draft up to ``num_drafts`` tokens by prompt lookup; [] when nothing matches.

    ``tokens`` is the whole sequence so far (prompt + output), 1-D integers. Among earlier
    positions whose preceding tokens equal the sequence's last n tokens, the longest match n
    wins (capped at ``max_match_window_size``, at least ``min_match_window_size``); among
    equally long matches, the most recent one that still has ``num_drafts`` tokens after it,
    else the one with the longest continuation. Cost: O(len(tokens) * max_match_window_size).
    """
    length = int(tokens.shape[0])
    if num_drafts <= 0 or length < 2 or min_match_window_size < 1:
        return []
    last = tokens[-1]
    # candidate end positions e (the match covers tokens[e-n+1 .. e]); e < length - 1
    ends = np.flatnonzero(tokens[: length - 1] == last)
    if ends.size == 0:
        return []
    match_len = np.ones(ends.shape, dtype=np.int64)
    alive = np.ones(ends.shape, dtype=bool)
    for back in range(1, max_match_window_size):
        pos = ends - back
        ok = alive & (pos >= 0)
        ok[ok] = tokens[pos[ok]] == tokens[length - 1 - back]
        if not ok.any():
            break
        match_len[ok] += 1
        alive = ok
    best = int(match_len.max())
    if best < min_match_window_size:
        return []
    candidates = ends[match_len == best]
    available = np.minimum(length - 1 - candidates, num_drafts)  # tokens after each match
    full = candidates[available == num_drafts]
    start = int(full.max()) + 1 if full.size else int(candidates[int(np.argmax(available))]) + 1
    return [int(t) for t in tokens[start : start + num_drafts]]
