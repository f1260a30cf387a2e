"""CPU tests of the kernels' math: the reference, the torch designs, the inputs, the plans and what the pick
launches (the Triton and Gluon kernels themselves: tests/test_kernels_interpreter.py, tests/test_kernels_sm90.py and
the GPU tests)."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch

from specdiag.kernels.mla import (KV_ROW_BYTES, VerifyShape, arithmetic_intensity_flop_per_byte, kv_bytes,
                                  make_inputs, make_tables, ridge_rows, tree_mask, verify_flops, with_fp8_cache)
from specdiag.kernels.gluon.pick import PICK, PICK_FP8, PickConfig, pick_fp8_launch, pick_launch, split_kv_pick_fp8
from specdiag.kernels.reference import baseline_torch, reference_verify, split_kv_torch
from specdiag.kernels.plan import SplitKVConfig, describe_plan, plan_splits
from specdiag.kernels.reference import relative_error


def naive_verify(inputs) -> torch.Tensor:
    """Per query row, float64, no chunking, no tricks: the definition spelled out."""
    T, H = inputs.draft_tokens, inputs.heads
    kv = inputs.cache[inputs.token_table].double()
    out = torch.empty(T, H, 512, dtype=torch.float64)
    for t in range(T):
        visible = torch.ones(inputs.n_kv, dtype=torch.bool)
        visible[inputs.n_prefix:] = inputs.mask[t]
        for h in range(H):
            s = (kv @ inputs.q[t, h].double()) * inputs.sm_scale
            s[~visible] = -math.inf
            out[t, h] = torch.softmax(s, 0) @ kv[:, :512]
    return out


@pytest.mark.parametrize("layout", ["contiguous", "shuffled_p1", "shuffled_b64"])
def test_reference_matches_naive_definition(layout: str) -> None:
    x = make_inputs(VerifyShape(100, 3, 5, layout), seed=5)
    ref = reference_verify(x, max_score_elems=300)  # forces several row chunks
    assert torch.allclose(ref.double(), naive_verify(x), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("shape", [VerifyShape(130, 2, 7, "shuffled_b64"), VerifyShape(64, 1, 1, "contiguous"),
                                   VerifyShape(200, 3, 40, "shuffled_p1")])
def test_torch_designs_match_reference(shape: VerifyShape) -> None:
    x = make_inputs(shape, seed=shape.context_tokens)
    ref = reference_verify(x)
    for fn in (baseline_torch, lambda i, o: split_kv_torch(i, o, n_splits=3), lambda i, o: split_kv_torch(i, o, 50)):
        out = x.out_like()
        fn(x, out)
        assert not torch.isnan(out).any()
        assert relative_error(out, ref) < 1e-2


def test_the_draft_block_is_masked() -> None:
    """Changing a draft token's KV must not move the output of a draft token that cannot see it."""
    x = make_inputs(VerifyShape(50, 2, 6, "contiguous"), seed=9)
    a = reference_verify(x)
    hidden = [(i, j) for i in range(6) for j in range(6) if not x.mask[i, j]]
    assert hidden, "the random tree should hide something"
    i, j = hidden[0]
    x.cache[x.token_table[50 + j]] += 3.0
    b = reference_verify(x)
    assert torch.allclose(a[i], b[i])
    assert not torch.allclose(a[j], b[j])


def test_tree_mask_is_ancestor_closed() -> None:
    m = tree_mask(16, torch.Generator().manual_seed(1))
    assert m.diagonal().all() and not m.triu(1).any()
    for i in range(16):
        for j in range(16):
            if m[i, j]:
                assert (m[i] | ~m[j]).all(), "an ancestor's ancestors are ancestors"
    chain = tree_mask(5, torch.Generator(), chain=True)
    assert torch.equal(chain, torch.ones(5, 5, dtype=torch.bool).tril())


def test_layout_tables() -> None:
    gen = torch.Generator().manual_seed(0)
    tok, blk, pool = make_tables(200, "contiguous", gen)
    assert pool == 256 and torch.equal(tok, torch.arange(200)) and torch.equal(blk, torch.arange(4, dtype=torch.int32))
    tok, blk, pool = make_tables(200, "shuffled_b64", gen)
    assert torch.equal(tok, (blk.long()[:, None] * 64 + torch.arange(64)).reshape(-1)[:200])
    assert sorted(blk.tolist()) == list(range(4))
    tok, blk, pool = make_tables(200, "shuffled_p1", gen)
    assert blk is None and len(set(tok.tolist())) == 200 and int(tok.max()) < pool
    assert not torch.equal(tok, torch.arange(200))
    with pytest.raises(ValueError, match="layout"):
        make_tables(10, "paged", gen)


def test_counts_and_units() -> None:
    assert KV_ROW_BYTES == 1152
    assert kv_bytes(185_000) * 61 == 13_000_320_000  # 13.0 GB per step at 185k, 61 layers (the investigation's key number)
    assert verify_flops(8, 8, 1000) == 2 * 64 * 1000 * 1088
    assert arithmetic_intensity_flop_per_byte(16, 64) == pytest.approx(1.889 * 1024, rel=1e-3)
    assert ridge_rows(790, 4230) == pytest.approx(98.9, rel=1e-2)


def test_bad_shapes_are_refused_with_the_field_named() -> None:
    with pytest.raises(ValueError, match="heads"):
        VerifyShape(100, 0, 8)
    with pytest.raises(ValueError, match="layout"):
        VerifyShape(100, 8, 8, "random")


@pytest.mark.parametrize("rows,n_kv", [(8, 131_080), (64, 65_544), (8192, 262_208), (16, 8_193)])
def test_split_plan_covers_the_cache(rows: int, n_kv: int) -> None:
    for cfg in (SplitKVConfig(), SplitKVConfig(block_m=16, programs_per_sm=2.0), SplitKVConfig(split_round_tokens=1),
                SplitKVConfig(block_m=16, split_round_tokens=16)):
        plan = plan_splits(rows, n_kv, cfg, num_sms=132)
        assert plan.tokens_per_split % cfg.split_round_tokens == 0 and plan.tokens_per_split >= cfg.min_split_tokens
        assert (plan.n_splits - 1) * plan.tokens_per_split < n_kv <= plan.n_splits * plan.tokens_per_split
        d = describe_plan(rows, n_kv, cfg, 132)
        assert d["programs"] == plan.n_tiles * plan.n_splits
        assert d["partial_bytes"] == (0 if plan.n_splits == 1 else plan.n_splits * rows * (512 * 4 + 4))


def test_equal_token_splits_fill_every_sm_where_64_token_splits_leave_some_idle() -> None:
    """A 64-token round cuts 128k + 1 draft token into 129 splits of 1,024 (3 of 132 SMs idle, the rest
    3 % over an equal share), 256k into 129 of 2,048; a round of 1 gives 132 splits of 993 and 1,986, the last the
    shortest; the plan's splits still cover every token once, and the ragged plan cuts the same."""
    from specdiag.kernels.plan import gluon_config, split_tokens
    from specdiag.kernels.plan import describe_ragged_plan

    tile, equal = gluon_config(64, 2), replace(gluon_config(64, 2), split_round_tokens=1)
    for n_kv, (n64, t64), (n1, t1) in [(131_073, (129, 1024), (132, 993)), (262_145, (129, 2048), (132, 1986)),
                                       (65_537, (129, 512), (132, 497)), (131_080, (129, 1024), (132, 994))]:
        assert (plan_splits(8, n_kv, tile, 132).n_splits, plan_splits(8, n_kv, tile, 132).tokens_per_split) == (n64, t64)
        plan = plan_splits(8, n_kv, equal, 132)
        assert (plan.n_splits, plan.tokens_per_split) == (n1, t1)
        assert 0 < n_kv - (plan.n_splits - 1) * plan.tokens_per_split <= plan.tokens_per_split
        rag = describe_ragged_plan(8, n_kv, replace(equal, pdl=True), 132)
        assert (rag["n_splits"], rag["tokens_per_split"]) == (n1, t1)
    assert split_tokens(1_000, 132, equal) == equal.min_split_tokens  # short contexts keep the split's minimum
    with pytest.raises(ValueError, match="split_round_tokens must be a positive"):
        SplitKVConfig(split_round_tokens=0)


def test_block_table_kernels_refuse_splits_inside_a_page() -> None:
    """The page-table path reads a tile's slots as one page's: a split round that is not a multiple of 64 would
    start splits inside a page, so the kernel refuses it before any launch, naming the fix."""
    from specdiag.kernels.triton.splitkv import split_kv_triton

    x = make_inputs(VerifyShape(300, 2, 2, "shuffled_b64"))
    cfg = replace(SplitKVConfig(block_n=64), split_round_tokens=16)
    with pytest.raises(ValueError, match="multiple of 64"):
        split_kv_triton(x, x.out_like(), page_size=64, cfg=cfg)


@pytest.mark.parametrize("rows, form, n, early_q, one_pass", [
    (1, "swap", 8, None, True), (8, "swap", 8, None, True), (9, "swap", 16, None, True), (16, "swap", 16, None, True),
    (17, "ws", None, True, True), (32, "ws", None, True, True), (64, "ws", None, True, True),
    (65, "ws", None, False, True), (1024, "ws", None, False, True)])
def test_the_pick_launches_its_form_by_the_rows(rows: int, form: str, n: int, early_q: bool, one_pass: bool) -> None:
    """Up to 16 packed rows the rows-as-N kernel (an N of 8 up to 8 rows), above them the row-major kernel, Q loaded
    early up to 64 rows; the merge in one pass (every split count up to 32 rows, up to 16 splits
    above), 64 value dims per merge program, under PDL."""
    got_form, kw = pick_launch(PICK, rows)
    assert got_form == form
    assert (kw["merge_block_dv"], kw["pdl_merge"], kw["block_n"], kw["stages"]) == (64, True, 64, 2)
    assert kw["merge_one_pass"] is one_pass
    assert kw["merge_one_pass_max_splits"] == (512 if rows <= 32 else 16)
    if form == "swap":
        assert kw["fit_rows"] is True and (8 if rows <= 8 else 16) == n
    else:
        assert kw["early_q"] is early_q
    assert pick_launch(replace(PICK, swap_max_rows=0), 8)[0] == "ws"


def test_the_fp8_pick_names_its_ring_by_the_rows_and_refuses_what_it_cannot_hold() -> None:
    assert pick_fp8_launch(PICK_FP8, 8)["rings"] == "s22" and pick_fp8_launch(PICK_FP8, 9)["rings"] == "d2"
    x = make_inputs(VerifyShape(64, 8, 4, "shuffled_p1"))
    with pytest.raises(ValueError, match="up to 16 packed rows"):
        split_kv_pick_fp8(x, x.out_like())
    y = make_inputs(VerifyShape(64, 2, 2, "shuffled_p1"))
    with pytest.raises(ValueError, match="with_fp8_cache"):
        split_kv_pick_fp8(y, y.out_like())
    with pytest.raises(ValueError, match="CUDA"):
        split_kv_pick_fp8(with_fp8_cache(y), y.out_like())


def test_a_pick_config_is_frozen_and_passed_through() -> None:
    with pytest.raises(Exception):
        PICK.block_n = 32  # type: ignore[misc]
    assert pick_launch(PickConfig(block_n=32, stages=4), 8)[1]["block_n"] == 32


def test_the_entry_point_chooses_by_device_and_cache_dtype_and_refuses_what_cannot_run() -> None:
    """On the CPU (no sm_90): a bf16 or fp16 cache gets the Triton kernel, an fp8 cache none, each with the reason;
    with the Gluon kernels off the same. ``verify`` refuses, before any launch, an unknown kernel, a Gluon call without
    the draft rows' slots or with a logit cap, a Triton call without the draft rows, and a call nothing here serves."""
    from specdiag.kernels.mla import ragged_args
    from specdiag.kernels.verify import GLUON, TRITON, choose, verify

    q = torch.zeros(2, 8, 576, dtype=torch.bfloat16)
    fp8 = torch.zeros(64, 576, dtype=torch.uint8).view(torch.float8_e4m3fn)
    assert choose(q, torch.zeros(64, 576, dtype=torch.bfloat16)) == (TRITON, "not a CUDA device")
    half = torch.zeros(64, 576, dtype=torch.float16)
    assert choose(q.half(), half, gluon=False) == (TRITON, "the Gluon kernels are off")
    assert choose(q, fp8) == (None, "not a CUDA device")
    assert choose(q, fp8, gluon=False)[0] is None
    x = make_inputs(VerifyShape(100, 8, 2, "shuffled_p1"))
    args = ragged_args(x, x.out_like())
    for kw, match in ((dict(kernel="flash"), "kernel must be one of"), (dict(kernel=GLUON, draft_loc=None), "draft_loc"),
                      (dict(kernel=GLUON, logit_cap=30.0), "no logit cap"), (dict(kernel=TRITON, k_ext=None), "k_ext"),
                      (dict(kv=fp8, kernel=None), "no verify kernel here serves this call: not a CUDA device")):
        with pytest.raises(ValueError, match=match):
            verify(**{**args, **kw})
