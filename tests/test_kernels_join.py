"""A last split of at most ``join_tail_tokens`` tokens joins the split before it (splitkv_plan.split_count); the
kernels on such plans run in tests/test_kernels_interpreter.py."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from specdiag.kernels.splitkv_plan import SplitKVConfig, default_config, plan_splits, split_count

ROOT = Path(__file__).resolve().parents[1]
needs_triton = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton is not installed here")


def test_split_count_joins_only_a_tail_within_the_limit() -> None:
    assert split_count(131073, 512) == 257  # 128k h8T1: the draft token alone in split 257
    assert split_count(131073, 512, 64) == 256
    assert split_count(131080, 1024, 64) == 128  # 128k h8T8: the 8 draft tokens join split 128
    assert split_count(131072 + 64, 1024, 64) == 128  # a tail of exactly the limit joins
    assert split_count(131072 + 65, 1024, 64) == 129  # one token more does not
    assert split_count(500, 512, 64) == 1 and split_count(512, 512, 64) == 1  # one split: nothing to join
    assert split_count(1024, 512, 64) == 2  # no tail


@pytest.mark.parametrize("rows, n_kv", [(8, 131073), (16, 65537), (8, 262145), (64, 131080), (64, 65544),
                                        (256, 131088), (1024, 131136), (8, 1000), (64, 300)])
def test_a_joined_plan_covers_every_token_once_and_its_last_split_is_at_most_one_tile_longer(rows, n_kv) -> None:
    for join in (0, 64):
        cfg = SplitKVConfig(**{**default_config(rows).as_dict(), "join_tail_tokens": join})
        plan = plan_splits(rows, n_kv, cfg, 132)
        ends = [min((s + 1) * plan.tokens_per_split, n_kv) for s in range(plan.n_splits)]
        ends[-1] = n_kv  # the kernels' rule: the last split ends at n_kv
        starts = [s * plan.tokens_per_split for s in range(plan.n_splits)]
        assert starts[0] == 0 and all(e == s2 for e, s2 in zip(ends, starts[1:]))  # contiguous, no gap, no overlap
        assert all(e > s for s, e in zip(starts, ends))  # no empty split
        assert ends[-1] - starts[-1] <= plan.tokens_per_split + join
    joined = plan_splits(8, 131073, SplitKVConfig(**{**default_config(8).as_dict(), "join_tail_tokens": 64}), 132)
    assert (joined.n_splits, plan_splits(8, 131073, default_config(8), 132).n_splits) == (256, 257)


