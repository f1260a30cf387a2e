"""NGRAM prompt lookup (specdiag.localserver.ngram.propose_ngram) on hand-made sequences."""

from __future__ import annotations

import numpy as np

from specdiag.localserver.ngram import propose_ngram


def a(*tokens: int) -> np.ndarray:
    return np.asarray(tokens, dtype=np.int64)


def test_repeated_phrase_proposes_its_continuation():
    phrase = [10, 11, 12, 13, 14, 15, 16]
    seq = a(*(phrase * 4), 10, 11)
    assert propose_ngram(seq, 5) == [12, 13, 14, 15, 16]
    assert propose_ngram(seq, 9) == [12, 13, 14, 15, 16, 10, 11, 12, 13]


def test_longest_match_wins_over_a_more_recent_shorter_one():
    # tail "1 2 3": the long match (…1 2 3 -> 40) is older than a short one (…3 -> 50)
    seq = a(1, 2, 3, 40, 41, 42, 9, 3, 50, 51, 52, 7, 1, 2, 3)
    assert propose_ngram(seq, 3) == [40, 41, 42]


def test_most_recent_of_equal_matches_with_a_full_continuation():
    seq = a(5, 6, 20, 21, 8, 5, 6, 30, 31, 9, 5, 6)  # two 2-token matches of "5 6"
    assert propose_ngram(seq, 2) == [30, 31]
    # the recent match has only 2 tokens after it: the older one with 3 is preferred
    assert propose_ngram(a(5, 6, 20, 21, 22, 7, 5, 6, 5, 6), 3) == [20, 21, 22]


def test_min_and_max_match_window():
    seq = a(1, 2, 3, 4, 8, 9, 4)  # only a 1-token match of the tail
    assert propose_ngram(seq, 2, min_match_window_size=1) == [8, 9]
    assert propose_ngram(seq, 2, min_match_window_size=2) == []
    # with max window 1, the most recent 1-token match is used even if a longer one exists
    seq = a(2, 8, 1, 7, 8, 3, 5, 2, 8)
    assert propose_ngram(seq, 1, max_match_window_size=2) == [1]
    assert propose_ngram(seq, 1, max_match_window_size=1) == [3]


def test_nothing_to_propose():
    assert propose_ngram(a(1, 2, 3, 4), 4) == []
    assert propose_ngram(a(1), 4) == []
    assert propose_ngram(a(1, 1), 0) == []
    assert propose_ngram(a(1, 1), 3) == [1]
