"""The ragged split-KV kernel's shared memory and the plugin's configuration ladder (CPU only).

RAGGED_SHARED_SM90 (plan) holds ``metadata.shared`` of triton.ragged._ragged_partial_kernel compiled
offline with Triton 3.6.0 for sm_90 (pointers and the strides SGLang passes marked divisible by 16, as at run time);
the slow test compiles every entry again, so a change to the kernel that moves its shared memory fails here. The form
with a separate value tile (before commit b52100f) needed 295,936 B at (64, 64, 8 warps, 3 stages): the failed H200 launch,
"Required: 295936, Hardware limit: 232448" (the H200's GPU tests, 2026-11-30).
"""

from __future__ import annotations

import importlib.util
from dataclasses import replace

import pytest

from specdiag.kernels.plan import (RAGGED_SHARED_SM90, SHARED_LIMIT_SM90, ConfigLadder,
                                           SplitKVConfig, default_config, fitting_ladder, is_out_of_resources,
                                           one_pass_merge_fields, ragged_config_ladder, ragged_shared_bytes,
                                           ragged_shared_is_compiled)


def cfg(bm, bn, stages, warps=4):
    return SplitKVConfig(block_m=bm, block_n=bn, num_warps=warps, num_stages=stages)


def _compiled_shared(bm: int, bn: int, warps: int, stages: int) -> int:
    """The ragged partial kernel compiled for sm_90 now (needs triton, no GPU): its shared memory in bytes."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from specdiag.kernels.triton.ragged import _ragged_partial_kernel as fn

    ptr = {"Q": "*bf16", "K_EXT": "*bf16", "KV": "*bf16", "QO_INDPTR": "*i32", "KV_INDPTR": "*i32",
           "KV_INDICES": "*i64", "MASK": "*u8", "MASK_INDPTR": "*i64", "O_PART": "*fp32", "LSE_PART": "*fp32"}
    const = {"BLOCK_M": bm, "BLOCK_N": bn, "D_NOPE": 512, "D_PE": 64, "LOGIT_CAP": False, "ROUND": 64}
    names = fn.arg_names
    sig = {n: "constexpr" if n in const else ptr.get(n, "fp32" if n in ("sm_scale", "logit_cap") else "i32")
           for n in names}
    divisible = [*ptr, "stride_q_tok", "stride_kext", "stride_kv", "max_rows", "min_split_tokens"]
    attrs = {(names.index(n),): [["tt.divisibility", 16]] for n in divisible}
    k = triton.compile(ASTSource(fn, sig, const, attrs), target=GPUTarget("cuda", 90, 32),
                       options={"num_warps": warps, "num_stages": stages})
    return int(k.metadata.shared)


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton is not installed here")
def test_the_table_is_what_triton_compiles_now():
    got = {key: _compiled_shared(*key) for key in RAGGED_SHARED_SM90}
    assert got == RAGGED_SHARED_SM90


def test_every_rung_and_default_tile_is_in_the_table():
    for rows in (8, 16, 32, 64, 128, 256, 1024):
        for c in ragged_config_ladder(rows):
            assert ragged_shared_is_compiled(c), c
        d = default_config(rows)
        assert (d.block_m, d.block_n, d.num_warps, d.num_stages) in RAGGED_SHARED_SM90


def test_formula_reproduces_the_pipelined_tiles_and_is_short_by_at_most_20k_elsewhere():
    from specdiag.kernels import plan

    for (bm, bn, warps, stages), compiled in RAGGED_SHARED_SM90.items():
        saved = plan.RAGGED_SHARED_SM90
        try:
            plan.RAGGED_SHARED_SM90 = {}
            est = ragged_shared_bytes(cfg(bm, bn, stages, warps))
        finally:
            plan.RAGGED_SHARED_SM90 = saved
        if bn >= 32 and stages >= 2:
            assert est == compiled, (bm, bn, warps, stages, est, compiled)
        else:
            assert compiled - 20480 <= est <= compiled, (bm, bn, warps, stages, est, compiled)


def test_the_tuned_tiles_now_fit_the_h200():
    # 8 heads x 8 draft tokens (64 rows): the tuned (64, 64, 8 warps, 3 stages) tile, which the form with a separate value tile
    # could not launch (295,936 B), fits in one block's opt-in shared memory
    assert ragged_shared_bytes(default_config(64)) == 230400 <= SHARED_LIMIT_SM90
    first = fitting_ladder(64)[0]
    assert (first.block_m, first.block_n, first.num_warps, first.num_stages) == (64, 64, 8, 3)
    # one draft token (8-16 rows): 96,256 B, two programs per SM as programs_per_sm 2.0 plans (was 227,328: one)
    assert ragged_shared_bytes(default_config(8)) == 96256 and 2 * 96256 <= 233472


def test_estimate_scales_with_element_size():
    assert ragged_shared_bytes(cfg(64, 32, 3, 8), elem_bytes=4) == 2 * ragged_shared_bytes(cfg(64, 32, 3, 8))
    assert ragged_shared_bytes(cfg(64, 48, 3, 8), elem_bytes=4) > ragged_shared_bytes(cfg(64, 48, 3, 8))


def test_ladder_first_fitting_rung_is_the_tuned_tile_at_every_row_count():
    for rows in (8, 16, 32, 64, 128, 512, 1024):
        first = fitting_ladder(rows)[0]
        d = default_config(rows)
        assert (first.block_m, first.block_n, first.num_warps, first.num_stages) == \
            (d.block_m, d.block_n, d.num_warps, d.num_stages)
        for c in fitting_ladder(rows):
            assert ragged_shared_bytes(c) <= SHARED_LIMIT_SM90


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
