"""The ragged split-KV kernel's shared-memory estimate and the plugin's configuration ladder (CPU only).

COMPILED: ``metadata.shared`` of triton_splitkv_ragged._ragged_partial_kernel compiled offline with Triton
3.6.0 for sm_90 (GPUTarget("cuda", 90, 32); pointers and the strides/max_rows/min_split_tokens SGLang
passes marked divisible by 16), 2026-11-30. (64, 64, 8 warps, 3 stages) is the failed H200 launch:
"Required: 295936, Hardware limit: 232448" (/work/devres/plugin1/gpu-tests.log).
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from specdiag.kernels.splitkv_plan import (SHARED_LIMIT_SM90, SHARED_MARGIN, ConfigLadder, SplitKVConfig,
                                           default_config, fitting_ladder, is_out_of_resources,
                                           one_pass_merge_fields, ragged_config_ladder, ragged_shared_bytes)

# (block_m, block_n, num_stages) -> bytes, compiled (see the module docstring)
COMPILED = {
    (64, 64, 3): 295936, (64, 64, 2): 294912, (64, 64, 1): 212992,
    (64, 32, 3): 188928, (64, 32, 2): 188416, (64, 32, 1): 143360, (64, 32, 4): 188928,
    (64, 16, 2): 131072, (64, 16, 3): 131328,
    (32, 64, 2): 245760, (32, 64, 3): 246784, (32, 32, 2): 143360, (32, 32, 3): 143872,
    (16, 64, 2): 225280, (16, 32, 2): 122880, (16, 32, 3): 123392, (16, 16, 2): 70656, (16, 16, 1): 51200,
}


def cfg(bm, bn, stages, warps=4):
    return SplitKVConfig(block_m=bm, block_n=bn, num_warps=warps, num_stages=stages)


def test_estimate_reproduces_the_failed_h200_launch():
    failed = default_config(64)  # 8 heads x 8 draft tokens: the config the hook used on the H200
    assert (failed.block_m, failed.block_n, failed.num_warps, failed.num_stages) == (64, 64, 8, 3)
    assert ragged_shared_bytes(failed) == 295936
    assert ragged_shared_bytes(failed) > SHARED_LIMIT_SM90


@pytest.mark.parametrize("shape, compiled", sorted(COMPILED.items()))
def test_estimate_is_exact_or_a_small_upper_bound(shape, compiled):
    bm, bn, stages = shape
    est = ragged_shared_bytes(cfg(bm, bn, stages))
    assert compiled <= est <= compiled + 8192
    if bm == 64 and bn in (32, 64) and stages <= 3:
        assert est == compiled


def test_estimate_scales_with_element_size():
    assert ragged_shared_bytes(cfg(64, 32, 3), elem_bytes=4) > ragged_shared_bytes(cfg(64, 32, 3))


def test_ladder_first_fitting_rung_for_the_h200_shapes():
    # TP 1: 8 heads x 8 draft tokens = 64 rows; TP 2: 4 local heads x 8 = 32 rows
    first64 = fitting_ladder(64)[0]
    assert (first64.block_m, first64.block_n, first64.num_warps, first64.num_stages) == (64, 32, 8, 3)
    assert COMPILED[(64, 32, 3)] <= SHARED_LIMIT_SM90 - SHARED_MARGIN
    first32 = fitting_ladder(32)[0]
    assert ragged_shared_bytes(first32) <= SHARED_LIMIT_SM90 - SHARED_MARGIN
    # the tuned (32, 64, 2 stages) for 32 rows compiles to 245,760 B: over the H200's limit, not chosen
    assert (first32.block_m, first32.block_n) != (32, 64)
    for rows in (8, 16, 32, 64, 128, 512, 1024):
        for c in fitting_ladder(rows):
            assert ragged_shared_bytes(c) <= SHARED_LIMIT_SM90 - SHARED_MARGIN


def test_ladder_rungs_shrink_and_keep_the_split_settings():
    for rows in (16, 32, 64, 1024):
        ladder = ragged_config_ladder(rows)
        assert ladder[0] == replace(default_config(rows), **one_pass_merge_fields(rows))  # runs 28-29's merge
        assert all(c.merge_one_pass_max_splits == ladder[0].merge_one_pass_max_splits for c in ladder)
        assert len(set(ladder)) == len(ladder)
        needs = [ragged_shared_bytes(c) for c in ladder[1:]]
        assert needs == sorted(needs, reverse=True)
        assert all(c.programs_per_sm == ladder[0].programs_per_sm for c in ladder)
        assert all(c.block_m <= ladder[0].block_m for c in ladder)


def test_fitting_ladder_never_empty():
    assert fitting_ladder(64, shared_limit=1000) == ragged_config_ladder(64)[-1:]


class OutOfResources(Exception):  # the name Triton's error has (triton.runtime.errors.OutOfResources)
    pass


def fake_launch(limit, calls):
    def launch(c):
        calls.append(c)
        need = ragged_shared_bytes(c)
        if need > limit:
            raise OutOfResources(f"out of resource: shared memory, Required: {need}, Hardware limit: {limit}")
        return ("ran", c)
    return launch


def test_ladder_steps_down_on_out_of_resources_and_caches():
    chosen = []
    ladder = ConfigLadder(margin=0, on_choice=lambda key, c, b, failed: chosen.append((key, c, b, len(failed))))
    calls = []
    # a device whose real limit is below the estimate's: the first fitting rungs fail at launch
    out = ladder.run("k", 64, fake_launch(150000, calls))
    assert out[0] == "ran" and ragged_shared_bytes(out[1]) <= 150000
    assert len(calls) >= 2 and all(ragged_shared_bytes(c) > 150000 for c in calls[:-1])
    assert chosen == [("k", out[1], ragged_shared_bytes(out[1]), len(calls) - 1)]
    again = []
    assert ladder.run("k", 64, fake_launch(150000, again)) == out
    assert again == [out[1]]  # cached: one launch, no search, no second report
    assert len(chosen) == 1


def test_ladder_other_errors_propagate_without_stepping():
    ladder = ConfigLadder()
    calls = []

    def launch(c):
        calls.append(c)
        raise ValueError("bad shape")

    with pytest.raises(ValueError):
        ladder.run("k", 64, launch)
    assert len(calls) == 1 and "k" not in ladder.chosen


def test_ladder_exhausted_raises_then_fails_fast():
    ladder = ConfigLadder()
    calls = []
    with pytest.raises(OutOfResources):
        ladder.run("k", 64, fake_launch(10, calls))
    assert len(calls) == len(fitting_ladder(64))
    more = []
    with pytest.raises(RuntimeError, match="no split-KV configuration fits"):
        ladder.run("k", 64, fake_launch(10, more))
    assert more == []


def test_is_out_of_resources():
    assert is_out_of_resources(OutOfResources("x"))
    assert is_out_of_resources(RuntimeError("out of resource: shared memory"))
    assert not is_out_of_resources(ValueError("bad"))
