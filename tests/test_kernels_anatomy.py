"""Run 7 on the CPU: the fixed-cost anatomy of a split call (specdiag.kernels.anatomy) and the run's new arms
(split_pdl_p1: the merge as a programmatic dependent launch; split_m32_p1 / split_m16_p1: h8T8 in 32- or 16-row
tiles). The GPU facts (timings, the profiler, griddepcontrol on hardware) come from the device run only; here: the
fits on synthetic rows, the anatomy's own kernels under Triton's interpreter, the arms' configurations and the
sm_90 compile of the PDL launch.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

from specdiag.kernels.anatomy import PARTS, anatomy_fits, fixed_cost_shares, parse_cases
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
print("ok")
"""


@pytest.mark.skipif(not HAS_TRITON, reason="triton is not installed here")
def test_anatomy_parts_run_in_the_interpreter() -> None:
    """Every part of the anatomy, the anatomy's read-only kernel checked against torch, the PDL arm's result."""
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



def test_issue13_bandwidth_target_names_each_case() -> None:
    from specdiag.kernels.analysis import issue13_bandwidth_target

    assert issue13_bandwidth_target(131072, 8, 1) == ("memory: >= 85% of copy at 128k (H in 8,16; H*T <= 16)", 85.0)
    assert issue13_bandwidth_target(262144, 16, 1)[1] == 85.0
    assert issue13_bandwidth_target(65536, 8, 2) == ("memory: >= 75% of copy at 64k (H in 8,16; H*T <= 16)", 75.0)
    assert issue13_bandwidth_target(131072, 8, 8) == ("h8t8: >= 70% of copy at 128k", 70.0)
    for case in ((32768, 8, 1), (65536, 8, 8), (131072, 4, 1), (131072, 16, 2)):
        assert issue13_bandwidth_target(*case) is None, case


def test_fits_call_a_noisy_flat_part_flat() -> None:
    from specdiag.kernels.anatomy import FLAT_R2

    rows = []
    for ctx, us in ((65536, 6.4), (131072, 6.3), (262144, 6.45)):  # r² well under FLAT_R2, slope > 0
        rows.append({"context_tokens": ctx, "heads": 8, "draft_tokens": 8, "kv_bytes": kv_bytes(ctx), "part": "empty_2",
                     "us_median": us, "error": None})
    (r,) = anatomy_fits(rows).itertuples()
    assert r.r2 < FLAT_R2 and r.marginal_gbps == float("inf") and r.fixed_us == pytest.approx((6.4 + 6.3 + 6.45) / 3)
