"""Run 7 on the CPU: the fixed-cost anatomy of a split call (specdiag.kernels.anatomy) and the run's new arms
(split_pdl_p1: the merge as a programmatic dependent launch; split_m32_p1 / split_m16_p1: h8T8 in 32- or 16-row
tiles). The GPU facts (timings, the profiler, griddepcontrol on hardware) come from the device run only; here: the
fits on synthetic rows, the anatomy's own kernels under Triton's interpreter, the arms' configurations and the
sm_90 compile of the PDL launch.
"""

from __future__ import annotations

import importlib.util
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from specdiag.kernels.anatomy import (PARTS, anatomy_fits, fixed_cost_shares, parse_cases, parse_ring_shapes,
                                      ws_read_part)
from specdiag.kernels.anatomy import main as anatomy_main
from specdiag.kernels.dispatch import resolve_config
from specdiag.kernels.mla import kv_bytes
from specdiag.kernels.splitkv_plan import default_config

ROOT = Path(__file__).resolve().parents[1]
HAS_TRITON = importlib.util.find_spec("triton") is not None


def _rows(fixed_us: dict[str, float], gbps: dict[str, float]) -> list[dict]:
    rows = []
    for ctx in (16384, 65536, 131072, 262144):
        b = kv_bytes(ctx + 1)
        for part in PARTS:
            rate = gbps.get(part)
            us = fixed_us[part] + (b / (rate * 1e3) if rate else 0.0)  # GB/s = 1e3 B/us
            rows.append({"context_tokens": ctx, "heads": 8, "draft_tokens": 1, "kv_bytes": b, "part": part,
                         "us_median": us, "error": None})
    return rows


def test_fits_recover_each_part_fixed_cost_and_rate() -> None:
    fixed = {"timeline": 0.0, "read_torch": 4.0, "empty_1": 2.0, "empty_2": 4.5, "read_gather": 6.0, "read_contig": 5.0, "partial": 15.0, "merge": 5.5,
             "full": 21.0, "full_pdl": 19.0}
    gbps = {"read_gather": 4100.0, "read_contig": 4300.0, "partial": 3950.0, "full": 3950.0, "full_pdl": 3950.0}
    fits = anatomy_fits(_rows(fixed, gbps))
    assert set(fits["part"]) == set(PARTS)
    for r in fits.itertuples():
        assert r.fixed_us == pytest.approx(fixed[r.part], rel=1e-6)
        if r.part in gbps:
            assert r.marginal_gbps == pytest.approx(gbps[r.part], rel=1e-6)
        else:
            assert r.marginal_gbps == float("inf")
    shares = fixed_cost_shares(fits).iloc[0]
    assert shares["partial_over_read_us"] == pytest.approx(9.0)
    assert shares["pdl_saves_us"] == pytest.approx(2.0)


def test_timeline_stats_read_ramp_durations_and_tail() -> None:
    from specdiag.kernels.anatomy import timeline_stats

    start = [1000, 1500, 3000, 2000]  # ns
    loop = [9000, 9500, 11000, 10000]
    done = [10000, 10500, 30000, 11000]
    st = timeline_stats(start, loop, done, [0, 1, 1, 2])
    assert st["tl_span_us"] == pytest.approx(29.0) and st["tl_ramp_us"] == pytest.approx(2.0)
    assert st["tl_dur_max_us"] == pytest.approx(27.0) and st["tl_sms"] == 3
    assert st["tl_loop_p50_us"] == pytest.approx(8.0)
    assert st["tl_tail_us"] == pytest.approx(29.0 - st["tl_done_p50_us"])
    with pytest.raises(ValueError, match="equal, non-empty"):
        timeline_stats([], [], [], [])


def test_fits_leave_out_failed_rows_and_single_contexts() -> None:
    rows = _rows({p: 1.0 for p in PARTS}, {})
    rows.append({"context_tokens": 32768, "heads": 8, "draft_tokens": 8, "kv_bytes": 1, "part": "full",
                 "us_median": 50.0, "error": None})  # one context only: no fit for h8T8
    rows.append({"context_tokens": 65536, "heads": 8, "draft_tokens": 1, "kv_bytes": 1, "part": "full",
                 "us_median": None, "error": "RuntimeError('x')"})
    fits = anatomy_fits(rows)
    assert set(fits["draft_tokens"]) == {1}
    assert anatomy_fits([]).empty


def test_cases_are_checked_before_any_work() -> None:
    assert [(s.context_tokens, s.heads, s.draft_tokens) for s in parse_cases("16384:8:1, 131072:16:1", "shuffled_p1")] \
        == [(16384, 8, 1), (131072, 16, 1)]
    with pytest.raises(ValueError, match="context:heads:draft_tokens"):
        parse_cases("131072:8", "shuffled_p1")
    with pytest.raises(ValueError, match="no cases"):
        parse_cases(" , ", "shuffled_p1")


def test_ws_timeline_stats_read_start_latency_stream_and_tail() -> None:
    """gluon_ws_read's timeline rows (start, first tile, loop end, done ns; SM) summed up: the first tile's latency,
    the stream from it to the loop's end, and timeline_stats' span, ramp and tail."""
    from specdiag.kernels.anatomy import ws_timeline_stats

    table = [[1_000, 3_000, 40_000, 40_500, 0], [1_200, 2_800, 41_000, 41_200, 1], [1_100, 4_100, 45_000, 45_900, 2]]
    st = ws_timeline_stats(table)
    assert st["tl_programs"] == 3 and st["tl_sms"] == 3
    assert st["tl_span_us"] == pytest.approx(44.9) and st["tl_ramp_us"] == pytest.approx(0.2)
    assert st["tl_first_p50_us"] == pytest.approx(2.0) and st["tl_first_max_us"] == pytest.approx(3.0)
    assert st["tl_stream_p50_us"] == pytest.approx(38.2)  # 37.0, 38.2, 40.9
    assert st["tl_tail_us"] == pytest.approx(44.9 - 40.2)
    with pytest.raises(ValueError, match="one row per program"):
        ws_timeline_stats([])


def test_timeline_runs_summary_takes_medians_and_the_median_span_launch() -> None:
    """Three timed launches of two programs: each stat's median over launches, and the raw rows of the launch whose
    span is the median one, in us from its first stamp, one list per stamp, then the SMs."""
    from specdiag.kernels.anatomy import timeline_runs_summary

    launches = [[[1_000, 5_000, 9_000, 0], [1_500, 6_000, 11_000, 3]],
                [[2_000, 4_000, 6_000, 1], [2_000, 3_000, 7_000, 2]],
                [[0, 10_000, 20_000, 5], [500, 9_000, 30_000, 4]]]
    runs = [({"tl_span_us": (max(r[2] for r in a) - min(r[0] for r in a)) / 1e3, "tl_x": float(i)}, a)
            for i, a in enumerate(launches)]
    out = timeline_runs_summary(runs, ("start", "mid", "done"))
    assert out["tl_span_us"] == 10.0 and out["tl_x"] == 1.0 and out["tl_runs"] == 3
    assert out["tl_raw"] == {"start_us": [0.0, 0.5], "mid_us": [4.0, 5.0], "done_us": [8.0, 10.0], "sm": [0, 3]}


def test_ring_shapes_are_checked_before_any_work() -> None:
    """--ws-read-shapes: BLOCK_NxSTAGES[tROUND] items, each ring of two tiles or more within 221 KB (192 rows of
    1,152 B), the splits a multiple of 64 tokens unless a round follows (session 15: 64x2t1, equal shares)."""
    assert parse_ring_shapes("64x3, 32x6,16x12") == [(64, 3, 64), (32, 6, 64), (16, 12, 64)]
    assert parse_ring_shapes("64x2t1,32x4T16") == [(64, 2, 1), (32, 4, 16)]
    assert parse_ring_shapes("") == []
    assert [ws_read_part(*r) for r in [(64, 2), (64, 3), (32, 4), (64, 2, 64), (64, 2, 1)]] == [
        "read_ws", "read_ws_64x3", "read_ws_32x4", "read_ws", "read_ws_64x2t1"]
    for bad, why in [("64", "BLOCK_NxSTAGES"), ("64x", "BLOCK_NxSTAGES"), ("64x4", "at most 192"),
                     ("128x2", "16, 32 or 64"), ("32x1", "at least 2"), ("48x2", "16, 32 or 64"),
                     ("64x2t", "BLOCK_NxSTAGES"), ("64x2t0", "at least 1 token")]:
        with pytest.raises(ValueError, match=why):
            parse_ring_shapes(bad)


def test_anatomy_cli_refuses_read_shapes_without_ws(capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit):
        anatomy_main(["--out", "/nonexistent/x", "--cases", "65536:8:1", "--ws-read-shapes", "64x3"])
    assert "add --ws" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        anatomy_main(["--out", "/nonexistent/x", "--cases", "65536:8:1", "--ws", "--ws-read-shapes", "64x4"])
    assert "at most 192" in capsys.readouterr().err


def test_run7_arms_resolve_to_their_configuration() -> None:
    for rows in (8, 16, 64, 1024):
        assert resolve_config("split_pdl_p1", rows) == default_config(rows).__class__(
            **{**default_config(rows).as_dict(), "pdl": True})
    for rows in (8, 16, 256):  # outside 33-128 rows the row-tile arms are split_p1
        assert resolve_config("split_m32_p1", rows) == default_config(rows)
        assert resolve_config("split_m16_p1", rows) == default_config(rows)
    m32, m16 = resolve_config("split_m32_p1", 64), resolve_config("split_m16_p1", 64)
    assert (m32.block_m, m32.num_warps, m32.num_stages, m32.programs_per_sm) == (32, 4, 2, 2.0)
    assert (m16.block_m, m16.num_warps, m16.num_stages, m16.programs_per_sm) == (16, 4, 2, 2.0)
    assert resolve_config("split_p1", 64) is None  # the default stays the launcher's own choice
    for rows in (8, 64, 128):  # run 8's compute-bound arms are split_p1 up to 128 rows
        assert resolve_config("split_n32c_p1", rows) == default_config(rows)
        assert resolve_config("split_qk1c_p1", rows) == default_config(rows)
    n32, qk1 = resolve_config("split_n32c_p1", 1024), resolve_config("split_qk1c_p1", 1024)
    assert (n32.block_m, n32.block_n, n32.num_stages, n32.qk_once) == (64, 32, 5, False)
    assert (qk1.block_m, qk1.block_n, qk1.num_stages, qk1.qk_once) == (64, 32, 5, True)


INTERPRET_SCRIPT = r"""
import torch
from specdiag.kernels.anatomy import PARTS, measure_case, read_kv, _kernels
from specdiag.kernels.mla import VerifyShape, make_inputs
from specdiag.kernels.splitkv_plan import SplitKVConfig, plan_splits
from specdiag.kernels.triton_splitkv import split_kv_triton

# the anatomy's parts on a tiny case (4 "SMs": 8 splits of 128 tokens), fp16
rows = measure_case(VerifyShape(900, 2, 1, "shuffled_p1"), torch.device("cpu"), n_runs=1, rotate_bytes=0,
                    profile_runs=0, num_sms=4, dtype=torch.float16)
assert [r["part"] for r in rows] == list(PARTS), [r["part"] for r in rows]
assert rows[-1]["skipped"].startswith("the timeline reads %globaltimer")
for r in rows[:-1]:
    assert r["error"] is None, (r["part"], r["error"])
    assert r["us_median"] > 0
for r in rows:
    if r["part"] in ("full", "full_pdl"):
        assert r["correct"] and r["rel_err"] < 5e-3, r
assert rows[0]["n_splits"] > 1
# the read-only kernel sums exactly the rows of each split's full tiles
x = make_inputs(VerifyShape(700, 2, 1, "shuffled_p1"), seed=3)
cache = x.cache.half()
cfg = SplitKVConfig(block_m=16, block_n=64, num_warps=4, num_stages=2, min_split_tokens=128)
plan = plan_splits(2, x.n_kv, cfg, 3)
grid = (plan.n_tiles, plan.n_splits)
from specdiag.kernels.mla import VerifyInputs
y = VerifyInputs(q=x.q.half(), cache=cache, token_table=x.token_table, block_table=None, mask=x.mask,
                 n_prefix=x.n_prefix, sm_scale=x.sm_scale)
for contig in (False, True):
    sink = torch.zeros(grid[0] * grid[1])
    read_kv(y, sink, grid, plan.tokens_per_split, cfg, contig)
    for s in range(plan.n_splits):
        lo = s * plan.tokens_per_split
        n = (min(lo + plan.tokens_per_split, x.n_kv) - lo) // 64 * 64
        slots = torch.arange(lo, lo + n) if contig else x.token_table[lo:lo + n]
        want = cache[slots].float().sum()
        assert torch.allclose(sink[s], want, rtol=1e-4, atol=1e-2), (contig, s, float(sink[s]), float(want))
# run 8's compute-bound arms over 128 rows (four 64-row tiles, several splits): the kernel's own code with their tiles
from dataclasses import replace
from specdiag.kernels.cases import relative_error
from specdiag.kernels.dispatch import resolve_config
from specdiag.kernels.reference import reference_verify
for name in ("split_n32c_p1", "split_qk1c_p1"):
    x = make_inputs(VerifyShape(150, 16, 16, "shuffled_p1"), seed=5)
    y = VerifyInputs(q=x.q.half(), cache=x.cache.half(), token_table=x.token_table, block_table=None, mask=x.mask,
                     n_prefix=x.n_prefix, sm_scale=x.sm_scale)
    cfg = replace(resolve_config(name, 256), min_split_tokens=64)
    out = torch.full((16, 16, 512), float("nan"), dtype=torch.float16)
    split_kv_triton(y, out, page_size=1, cfg=cfg, num_sms=4)
    err = relative_error(out, reference_verify(x))
    assert not torch.isnan(out).any() and err < 5e-3, (name, err)
print("ok")
"""


@pytest.mark.skipif(not HAS_TRITON, reason="triton is not installed here")
def test_anatomy_parts_run_in_the_interpreter() -> None:
    """Every part of the anatomy, the anatomy's read-only kernel checked against torch, the PDL arm's result, and
    run 8's compute-bound arms (32-token tiles, 5 stages, with and without qk_once) over 128 rows."""
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=str(ROOT / "lib"))
    res = subprocess.run([sys.executable, "-c", INTERPRET_SCRIPT], env=env, capture_output=True, text=True, timeout=900)
    assert res.returncode == 0 and res.stdout.strip().endswith("ok"), res.stdout[-2000:] + res.stderr[-4000:]


COMPILE_SCRIPT = r"""
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from specdiag.kernels import triton_splitkv as m

target = GPUTarget("cuda", 90, 32)
merge = triton.compile(ASTSource(m._merge_kernel, {"O_PART": "*fp32", "LSE_PART": "*fp32", "OUT": "*bf16",
                       "n_splits": "i32", "n_rows": "i32", "BLOCK_S": "constexpr", "BLOCK_DV": "constexpr",
                       "D_V": "constexpr", "PDL": "constexpr"}, {"BLOCK_S": 256, "BLOCK_DV": 16, "D_V": 512, "PDL": True}),
                       target=target, options={"num_warps": 4, "launch_pdl": True})
sig = {"Q": "*bf16", "KV": "*bf16", "TOKEN_TABLE": "*i64", "BLOCK_TABLE": "*i64", "MASK": "*u8", "O_PART": "*fp32",
       "LSE_PART": "*fp32", "P_SCR": "*fp32", "qk_scale": "fp32", "n_prefix": "i32", "n_kv": "i32", "n_draft": "i32",
       "n_heads": "i32", "n_rows": "i32", "tokens_per_split": "i32", "stride_kv": "i32"}
const = dict(PAGE_SIZE=1, BLOCK_M=16, BLOCK_N=64, D_NOPE=512, D_PE=64, EVICT="", DIRECT=False, DV_SPLIT=1,
             QK_ONCE=False, ASM=False, PDL=True)
sig.update({k: "constexpr" for k in const})
part = triton.compile(ASTSource(m._split_partial_kernel, sig, const), target=target,
                      options={"num_warps": 4, "num_stages": 2})
plain = triton.compile(ASTSource(m._split_partial_kernel, sig, {**const, "PDL": False}), target=target,
                       options={"num_warps": 4, "num_stages": 2})
wait = [l for l in merge.asm["ptx"].splitlines() if "griddepcontrol.wait" in l]
launch = [l for l in part.asm["ptx"].splitlines() if "griddepcontrol.launch_dependents" in l]
print(len(wait), len(launch), merge.metadata.launch_pdl, part.metadata.shared, plain.metadata.shared)
"""


@pytest.mark.skipif(not HAS_TRITON, reason="triton is not installed here")
def test_pdl_compiles_for_sm90_with_wait_and_trigger() -> None:
    """The merge compiled with launch_pdl waits on griddepcontrol.wait; the partial kernel triggers its dependents
    once; the trigger leaves the partial kernel's shared memory as it was (16-row tiles, 2 stages)."""
    env = dict(os.environ, PYTHONPATH=str(ROOT / "lib"))
    res = subprocess.run([sys.executable, "-c", COMPILE_SCRIPT], env=env, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-4000:]
    n_wait, n_launch, pdl, shared, shared_plain = res.stdout.split()[-5:]
    assert (int(n_wait), int(n_launch), pdl) == (1, 1, "True")
    assert int(shared) == int(shared_plain) > 0


def test_target_verdicts_keep_ours_and_the_anchor_apart() -> None:
    """An anchor meeting a target is reported beside ours, not as ours (run 8: FlashInfer met the compute target)."""
    import pandas as pd

    from specdiag.kernels.analysis import target_verdicts

    base = {"context_tokens": 131072, "heads": 16, "draft_tokens": 64, "layout": "shuffled_p1", "kv_dtype": "bf16",
            "ms_median": 1.0, "pct_copy_bw": 3.0}
    df = pd.DataFrame([{**base, "kernel": "split_p1", "design": "split_kv", "pct_matmul": 32.5},
                       {**base, "kernel": "fused_p1", "design": "fused_split_kv", "pct_matmul": 32.0},
                       {**base, "kernel": "flashinfer_mla_p1", "design": "anchor", "pct_matmul": 70.9}])
    v = target_verdicts(df).iloc[0]
    assert (v["ours_kernel"], v["ours_met"], v["anchor_kernel"], v["anchor_met"]) == \
        ("split_p1", False, "flashinfer_mla_p1", True)
    assert v["ours_value"] == 32.5 and v["threshold"] == 50.0
    alone = target_verdicts(df[df["design"] != "anchor"]).iloc[0]
    assert alone["anchor_kernel"] is None and alone["anchor_met"] is None


def test_the_queued_sleep_is_not_a_kernel_of_the_call() -> None:
    """Run 9 counted torch.cuda._sleep's kernel (ATen's spin_kernel) as one of FlashInfer's: 11 kernels for 10 calls."""
    from specdiag.kernels.anatomy import _is_sleep

    assert _is_sleep("void at::cuda::(anonymous namespace)::spin_kernel(long)")
    assert not _is_sleep("_split_partial_kernel") and not _is_sleep("BatchMLAPagedAttentionKernel")


# --- the anatomy's analysis (specdiag.kernels.anatomy_analysis): synthetic rows with known parts -----------------

COPY_GBPS = 4000.0


def _case_rows(ctx: int, h: int = 8, t: int = 1, partial_us: float = 50.0, gap_us: float = 1.5, merge_us: float = 4.0,
               rest_us: float = 3.0, loop_us: float = 40.0, done_p50_us: float = 44.0, span_us: float = 47.0,
               read_us: float = 42.0, read_p10_us: float = 41.0, read_p90_us: float = 43.0,
               timeline: bool = True) -> list[dict]:
    """One case's anatomy rows: the full call's profiled parts, the timeline's summary and the read-only kernel."""
    b = kv_bytes(ctx + t)
    base = {"context_tokens": ctx, "heads": h, "draft_tokens": t, "kv_bytes": b, "error": None}
    rows = [{**base, "part": "full", "us_median": partial_us + gap_us + merge_us + rest_us,
             "prof_partial_us": partial_us, "prof_gap_us": gap_us, "prof_merge_us": merge_us},
            {**base, "part": "read_gather", "us_median": read_us, "us_p10": read_p10_us, "us_p90": read_p90_us},
            {**base, "part": "empty_2", "us_median": 5.0}]
    if timeline:
        rows.append({**base, "part": "timeline", "tl_span_us": span_us, "tl_loop_p50_us": loop_us,
                     "tl_done_p50_us": done_p50_us,
                     "tl_raw": {"start_us": [0.0, 0.1, 0.05], "loop_end_us": [30.0, 20.0, 25.0],
                                "done_us": [33.0, 40.0, 26.0], "sm": [0, 1, 0]}})
    else:
        rows.append({**base, "part": "timeline", "skipped": "the timeline reads %globaltimer (inline PTX): CUDA only"})
    return rows


def _copy_rows(contexts) -> list[dict]:
    return [{"context_tokens": c, "error": None, "ms_median": 1e-3 * (4.0 + kv_bytes(c) / 4e3 * 1e-3)} for c in contexts]


def test_issue13_bandwidth_target_names_each_case() -> None:
    from specdiag.kernels.analysis import issue13_bandwidth_target

    assert issue13_bandwidth_target(131072, 8, 1) == ("memory: >= 85% of copy at 128k (H in 8,16; H*T <= 16)", 85.0)
    assert issue13_bandwidth_target(262144, 16, 1)[1] == 85.0
    assert issue13_bandwidth_target(65536, 8, 2) == ("memory: >= 75% of copy at 64k (H in 8,16; H*T <= 16)", 75.0)
    assert issue13_bandwidth_target(131072, 8, 8) == ("h8t8: >= 70% of copy at 128k", 70.0)
    for case in ((32768, 8, 1), (65536, 8, 8), (131072, 4, 1), (131072, 16, 2)):
        assert issue13_bandwidth_target(*case) is None, case


def test_decomposition_splits_the_full_call_and_the_timeline() -> None:
    from specdiag.kernels.anatomy_analysis import decomposition

    rows = (_case_rows(32768) + _case_rows(131072, partial_us=60.0, rest_us=2.5)
            + _case_rows(131072, h=8, t=8, timeline=False)
            + [{"context_tokens": 131072, "heads": 8, "draft_tokens": 1, "kv_bytes": 1, "part": "full",
                "us_median": None, "error": "RuntimeError('a failed repeat')"}])
    d = decomposition(rows, _copy_rows([32768, 131072]), COPY_GBPS).set_index(["context_tokens", "heads", "draft_tokens"])
    r = d.loc[(131072, 8, 1)]
    assert r["full_us"] == pytest.approx(60.0 + 1.5 + 4.0 + 2.5)  # the failed row is left out, not read as a time
    assert r["rest_us"] == pytest.approx(2.5)
    assert (r["loop_us"], r["epilogue_us"], r["tail_us"]) == pytest.approx((40.0, 4.0, 3.0))
    assert r["loop_us"] + r["epilogue_us"] + r["tail_us"] == pytest.approx(r["span_us"])
    assert r["read_gather_us"] == 42.0 and (r["read_gather_p10_us"], r["read_gather_p90_us"]) == (41.0, 43.0)
    assert r["copy_us"] == pytest.approx(4.0 + kv_bytes(131072) / 4e3 * 1e-3)
    assert r["target_pct"] == 85.0
    assert r["target_us"] == pytest.approx(kv_bytes(131073) / (0.85 * COPY_GBPS * 1e9) * 1e6)
    assert r["full_over_target"] == pytest.approx(r["full_us"] / r["target_us"])
    assert math.isnan(d.loc[(32768, 8, 1)]["target_us"])  # issue 13 sets no target at 32k
    h8t8 = d.loc[(131072, 8, 8)]
    assert h8t8["target_pct"] == 70.0 and math.isnan(h8t8["span_us"]) and math.isnan(h8t8["epilogue_us"])
    nan_copy = decomposition(rows, [], float("nan")).set_index(["context_tokens", "heads", "draft_tokens"])
    assert math.isnan(nan_copy.loc[(131072, 8, 1)]["copy_us"]) and math.isnan(nan_copy.loc[(131072, 8, 1)]["target_us"])
    assert decomposition([], [], COPY_GBPS).empty


def test_fixed_cost_parts_add_up_to_the_full_calls_intercept() -> None:
    from specdiag.kernels.anatomy_analysis import FULL_PARTS, TIMELINE_PARTS, decomposition, fixed_cost_parts

    rows = []
    for ctx in (65536, 131072, 262144):  # partial and loop grow with the bytes; the rest is noisy around constants
        mb = kv_bytes(ctx + 1) / 1e6
        rows += _case_rows(ctx, partial_us=10.0 + 0.25 * mb, gap_us=1.2 + 0.01 * (ctx % 3), merge_us=3.5 - 1e-6 * ctx,
                           rest_us=3.0 + 0.1 * (ctx == 131072), loop_us=5.0 + 0.25 * mb, done_p50_us=8.0 + 0.25 * mb,
                           span_us=10.0 + 0.26 * mb)
    parts = fixed_cost_parts(decomposition(rows, _copy_rows([65536, 131072, 262144]), COPY_GBPS))
    fx = {(r.stack, r.column): r.fixed_us for r in parts.itertuples()}
    assert sum(fx[("full_us", c)] for c in FULL_PARTS) == pytest.approx(fx[("full_us", "full_us")])
    assert sum(fx[("span_us", c)] for c in TIMELINE_PARTS) == pytest.approx(fx[("span_us", "span_us")])
    assert fx[("full_us", "prof_partial_us")] == pytest.approx(10.0)
    assert fx[("span_us", "loop_us")] == pytest.approx(5.0) and fx[("span_us", "epilogue_us")] == pytest.approx(3.0)
    slope = {(r.stack, r.column): r.us_per_mb for r in parts.itertuples()}
    assert slope[("full_us", "prof_partial_us")] == pytest.approx(0.25)
    # the synthetic copy: 4 us + its bytes at 4 GB/ms (its bytes are the context's; the fit's x one draft row more)
    assert fx[("copy_us", "copy_us")] == pytest.approx(4.0, abs=1e-3)
    assert set(parts["contexts"]) == {3}
    one = fixed_cost_parts(decomposition(_case_rows(131072), [], COPY_GBPS))
    assert one.empty  # one context: no line


def test_timeline_programs_sorted_by_done_time() -> None:
    from specdiag.kernels.anatomy_analysis import timeline_programs

    progs = timeline_programs(_case_rows(131072), 131072, 8, 1)
    assert list(progs["program"]) == [2, 0, 1] and list(progs["rank"]) == [0, 1, 2]
    assert list(progs["done_us"]) == [26.0, 33.0, 40.0]
    assert list(progs["loop_us"]) == pytest.approx([24.95, 30.0, 19.9])
    assert list(progs["after_loop_us"]) == pytest.approx([1.0, 3.0, 20.0])
    assert timeline_programs(_case_rows(131072, timeline=False), 131072, 8, 1).empty
    assert timeline_programs(_case_rows(131072), 65536, 8, 1).empty


@pytest.mark.parametrize("read, p10, p90, says", [(42.0, 41.0, 43.0, "holds the target"),
                                                   (46.0, 45.0, 47.0, "miss the target"),
                                                   (30.0, 29.0, 31.0, "fit the target")])
def test_read_floor_finding_reads_the_read_only_kernel_against_the_target(read, p10, p90, says) -> None:
    from specdiag.kernels.anatomy_analysis import decomposition, read_floor_finding

    copy_gbps = kv_bytes(131073) / (0.85 * 42e-6) / 1e9  # the 85 % target allows exactly 42 us
    d = decomposition(_case_rows(131072, read_us=read, read_p10_us=p10, read_p90_us=p90), _copy_rows([131072]),
                      copy_gbps)
    f = read_floor_finding(d, 131072, 8, 1)
    assert f.numbers["target_us"] == pytest.approx(42.0) and f.numbers["read_gather_us"] == read
    assert says in f.verdict and f"{read:.1f} us" in f.verdict and "allows 42.0 us" in f.verdict
    assert f.severity == "warning" and "58.5 us, 16.5 us over" in f.verdict  # full 50 + 1.5 + 4 + 3
    fast = decomposition(_case_rows(131072, partial_us=20.0, read_us=read, read_p10_us=p10, read_p90_us=p90), [], copy_gbps)
    ok = read_floor_finding(fast, 131072, 8, 1)
    assert ok.severity == "ok" and "meets it" in ok.verdict
    assert read_floor_finding(d, 32768, 8, 1) is None  # no such case
    assert read_floor_finding(decomposition(_case_rows(32768), [], copy_gbps), 32768, 8, 1) is None  # no target


def _ws_rows(ctx: int, read: dict[str, tuple[float, float, float]], pick_us: float) -> list[dict]:
    """anatomy --ws rows at one case: the read-only kernel per ring ((median, p10, p90) by part) and the pick."""
    base = {"context_tokens": ctx, "heads": 8, "draft_tokens": 1, "kv_bytes": kv_bytes(ctx + 1), "error": None}
    rows = [{**base, "part": "pick_ws", "kernel": "split_gwrp_p1", "us_median": pick_us, "us_p10": pick_us - 1,
             "us_p90": pick_us + 1}]
    for part, (med, lo, hi) in read.items():
        ring = (64, 2) if part == "read_ws" else tuple(int(v) for v in part.split("_")[-1].split("x"))
        rows.append({**base, "part": part, "kernel": "gluon_ws_read", "us_median": med, "us_p10": lo, "us_p90": hi,
                     "block_n": ring[0], "stages": ring[1]})
    return rows


@pytest.mark.parametrize("read, says, severity", [((43.4, 42.3, 44.6), "no kernel of this launch shape can meet", "warning"),
                                                   ((42.0, 41.0, 43.0), "holds the target", "warning"),
                                                   ((30.0, 29.0, 31.0), "leaving 12.0 us for the attention", "ok")])
def test_pick_read_floor_finding_puts_the_picks_read_floor_against_the_target(read, says, severity) -> None:
    """anatomy --ws rows at 128k 8 x 1: the pick's read floor against the target (42 us here), the pick over its
    floor, and the other rings: faster or not."""
    from specdiag.kernels.anatomy_analysis import decomposition, pick_read_floor_finding, ws_read_rings

    copy_gbps = kv_bytes(131073) / (0.85 * 42e-6) / 1e9  # the 85 % target allows exactly 42 us
    pick = 52.4 if severity == "warning" else 41.0
    rows = _case_rows(131072) + _ws_rows(131072, {"read_ws": read, "read_ws_64x3": (45.2, 44.4, 46.3),
                                                  "read_ws_16x8": (59.5, 58.9, 60.2)}, pick)
    d = decomposition(rows, _copy_rows([131072]), copy_gbps)
    f = pick_read_floor_finding(rows, d, 131072, 8, 1)
    assert f.id == "kernel_ab.anatomy.pick_read_floor" and f.severity == severity and says in f.verdict, f.verdict
    assert f.numbers["target_us"] == pytest.approx(42.0) and f.numbers["read_ws_us"] == read[0]
    assert f.numbers["pick_over_read_ws_us"] == pytest.approx(pick - read[0])
    assert f.numbers["rings_us"] == {"64x2": read[0], "64x3": 45.2, "16x8": 59.5}
    assert f"split_gwrp_p1 takes {pick:.1f} us, {pick - read[0]:.1f} us over its own read floor" in f.verdict
    assert "None of the 2 other rings timed reads faster (the nearest, 64 x 3, 45.2 us)" in f.verdict
    assert len([e for e in f.evidence if e.startswith("Read-only kernel, ring of")]) == 3
    # a faster ring is named with its distance to the target
    fast = read[0] - 2.0
    faster = rows + _ws_rows(131072, {"read_ws_32x4": (fast, fast - 0.5, fast + 0.5)}, pick)[1:]
    g = pick_read_floor_finding(faster, d, 131072, 8, 1)
    assert f"The fastest ring timed, 32 x 4, reads it in {fast:.1f} us ({fast - 42.0:+.1f} us against the target)" \
        in g.verdict
    assert list(ws_read_rings(faster, 131072, 8, 1)["part"])[0] == "read_ws_32x4"
    # no finding without the pick's ring, without the pick, or at a case with no target
    assert pick_read_floor_finding(_case_rows(131072), d, 131072, 8, 1) is None
    assert pick_read_floor_finding([r for r in rows if r["part"] != "pick_ws"], d, 131072, 8, 1) is None
    assert pick_read_floor_finding(rows, d, 65536, 8, 1) is None


def test_fixed_cost_finding_names_each_part_and_the_sum() -> None:
    from specdiag.kernels.anatomy_analysis import decomposition, fixed_cost_finding, fixed_cost_parts

    rows = []
    for ctx in (65536, 131072, 262144):
        mb = kv_bytes(ctx + 1) / 1e6
        rows += _case_rows(ctx, partial_us=11.0 + 0.25 * mb, gap_us=1.25, merge_us=3.5, rest_us=2.75,
                           loop_us=5.0 + 0.25 * mb, done_p50_us=8.0 + 0.25 * mb, span_us=9.0 + 0.25 * mb)
    d = decomposition(rows, [], COPY_GBPS)
    parts = fixed_cost_parts(d)
    fits = anatomy_fits(rows)
    f = fixed_cost_finding(parts, fits, 8, 1)
    assert f.numbers["full_fixed_us"] == pytest.approx(11.0 + 1.25 + 3.5 + 2.75)
    assert f.numbers["prof_partial_fixed_us"] == pytest.approx(11.0) and f.numbers["rest_fixed_us"] == pytest.approx(2.75)
    assert (f.numbers["loop_fixed_us"], f.numbers["epilogue_fixed_us"], f.numbers["tail_fixed_us"]) == pytest.approx(
        (5.0, 3.0, 1.0))
    assert f.verdict.startswith("Of split_p1's 18.5 us fixed cost per call at H=8 T=1 (intercept over 3 contexts), "
                                "the partial kernel's GPU time holds 11.0 us, the merge kernel's GPU time holds 3.5 us")
    assert "11.00 + 1.25 + 3.50 + 2.75 = 18.50 us" in f.evidence[0]
    assert fixed_cost_finding(parts, fits, 16, 1) is None


def test_fits_call_a_noisy_flat_part_flat() -> None:
    from specdiag.kernels.anatomy import FLAT_R2

    rows = []
    for ctx, us in ((65536, 6.4), (131072, 6.3), (262144, 6.45)):  # r² well under FLAT_R2, slope > 0
        rows.append({"context_tokens": ctx, "heads": 8, "draft_tokens": 8, "kv_bytes": kv_bytes(ctx), "part": "empty_2",
                     "us_median": us, "error": None})
    (r,) = anatomy_fits(rows).itertuples()
    assert r.r2 < FLAT_R2 and r.marginal_gbps == float("inf") and r.fixed_us == pytest.approx((6.4 + 6.3 + 6.45) / 3)


def test_fit_table_and_metrics_are_strict_json() -> None:
    import json

    from specdiag.kernels.anatomy_analysis import anatomy_metrics, decomposition, fit_table, fixed_cost_parts

    rows = _rows({"timeline": 0.0, "read_torch": 4.0, "empty_1": 2.0, "empty_2": 4.5, "read_gather": 6.0,
                  "read_contig": 5.0, "partial": 15.0, "merge": 5.5, "full": 21.0, "full_pdl": 19.0},
                 {"read_gather": 4100.0, "partial": 3950.0, "full": 3950.0})
    rows = [r for r in rows if r["part"] != "timeline"]  # a timeline row has no us_median
    ft = fit_table(rows, COPY_GBPS)
    assert list(ft["part"]) == [p for p in PARTS if p != "timeline"]  # measuring order
    g = ft.set_index("part")
    assert g.loc["read_gather", "marginal_pct_copy"] == pytest.approx(100 * 4100 / COPY_GBPS)
    assert g.loc["merge", "marginal_pct_copy"] == float("inf")
    d = decomposition(rows, [], COPY_GBPS)
    m = anatomy_metrics(ft, d, fixed_cost_parts(d))
    json.dumps(m, allow_nan=False)  # NaN and inf written as null
    assert m["fits"]["merge h8 t1"]["marginal_gbps"] is None and m["cases"] == 4


def test_anatomy_plots_draw_with_context_ticks() -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from specdiag.kernels.anatomy_analysis import decomposition, timeline_programs
    from specdiag.kernels.plots import anatomy_bars, timeline_plot

    rows = _case_rows(65536) + _case_rows(131072) + _case_rows(262144)
    fig, (a, b) = plt.subplots(1, 2)
    anatomy_bars(a, decomposition(rows, _copy_rows([65536, 131072, 262144]), COPY_GBPS), 8, 1)
    assert [t.get_text() for t in a.get_xticklabels()] == ["64k", "128k", "256k"]
    assert len(a.patches) == 3 * (4 + 3 + 1 + 1) and "(us)" in a.get_ylabel()
    timeline_plot(b, timeline_programs(rows, 131072, 8, 1), title="t")
    assert "(us" in b.get_xlabel()
    plt.close(fig)


def test_unmeasured_parts_say_why() -> None:
    from specdiag.kernels.anatomy_analysis import unmeasured_parts

    rows = _case_rows(131072, timeline=False) + [{"context_tokens": 65536, "heads": 8, "draft_tokens": 1, "part": "merge",
                                                  "error": "RuntimeError('out of memory')"}]
    bad = unmeasured_parts(rows)
    assert list(bad["part"]) == ["timeline", "merge"]
    assert bad["why"].iloc[0].startswith("the timeline reads %globaltimer") and "out of memory" in bad["why"].iloc[1]
    assert unmeasured_parts(_case_rows(131072)).empty and unmeasured_parts([]).empty


def test_profile_statistics_from_kernel_spans() -> None:
    """The profile's arithmetic on synthetic spans: the split call's kernels and gap, and any call's kernel list."""
    from specdiag.kernels.anatomy import call_kernel_stats, split_call_stats

    spans = []
    for i, (p, g, m) in enumerate(((50.0, 1.0, 4.0), (52.0, 1.4, 4.2), (51.0, 1.2, 3.8))):
        t0 = 1000.0 * i
        spans += [("_split_partial_kernel", t0, t0 + p), ("_merge_kernel", t0 + p + g, t0 + p + g + m)]
    st = split_call_stats(spans)
    assert (st["prof_partial_us"], st["prof_gap_us"], st["prof_merge_us"], st["prof_calls"]) == \
        pytest.approx((51.0, 1.2, 4.0, 3))
    ck = call_kernel_stats(spans, 3)
    assert ck["prof_kernels_per_call"] == 2 and {k["name"]: k["per_call"] for k in ck["prof_kernels"]} == \
        {"_split_partial_kernel": 1, "_merge_kernel": 1}
    assert ck["prof_span_us"] == pytest.approx(56.0) and ck["prof_busy_us"] == pytest.approx(54.8)  # medians of 3 calls
    with pytest.raises(RuntimeError, match="whole number per call"):
        call_kernel_stats(spans[:-1], 3)
    with pytest.raises(RuntimeError, match="2 partial and 0 merge"):
        split_call_stats([spans[0], spans[2]])
