"""CPU tests of issue 13's single-launch split-KV kernel, its fp8-KV form and their harness rows.

The Triton kernel itself runs under Triton's interpreter (TRITON_INTERPRET=1, in a subprocess so the
setting does not leak) on tiny shapes in fp16 (the interpreter has no bf16); the harness runs the torch
fallbacks of the same variants.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from specdiag.kernels.cases import FP8_TOL, GridSpec, relative_error
from specdiag.kernels.dispatch import KERNEL_VARIANTS, run_variant
from specdiag.kernels.harness import run_grid
from specdiag.kernels.mla import VerifyShape, dequantized, make_inputs, with_fp8_cache, with_fresh_data
from specdiag.kernels.reference import reference_verify
from specdiag.runs import Run

ROOT = Path(__file__).resolve().parents[1]

INTERPRET_SCRIPT = r"""
import torch
from specdiag.kernels.mla import VerifyInputs, VerifyShape, make_inputs, with_fp8_cache, dequantized, tree_mask
from specdiag.kernels.reference import reference_verify
from specdiag.kernels.cases import relative_error
from specdiag.kernels.triton_fused import fused_split_kv_triton, _COUNTERS
from specdiag.kernels.splitkv_plan import SplitKVConfig

def fp16(x):
    return VerifyInputs(q=x.q.half(), cache=x.cache.half(), token_table=x.token_table, block_table=x.block_table,
                        mask=x.mask, n_prefix=x.n_prefix, sm_scale=x.sm_scale, cache_fp8=x.cache_fp8, kv_scale=x.kv_scale)

cases = [(VerifyShape(150, 2, 4, "shuffled_b64"), 1, False, False), (VerifyShape(150, 2, 4, "shuffled_b64"), 64, False, False),
         (VerifyShape(100, 3, 8, "shuffled_p1"), 1, True, False), (VerifyShape(130, 2, 5, "shuffled_b64"), 64, True, False),
         (VerifyShape(40, 2, 1, "contiguous"), 1, False, False), (VerifyShape(200, 2, 6, "contiguous"), 1, False, True),
         (VerifyShape(700, 2, 3, "shuffled_b64"), 64, False, False), (VerifyShape(700, 2, 3, "shuffled_p1"), 1, True, False)]
# (bf16 partials, merge group, row tile, merge): the self-merge at one and two levels, run 2's merge kernel as the
# second launch (merge "kernel", and "auto" at 64-row tiles), the fp8 K-Q^T form (row tiles under 64) and the other
runs = [(True, 2, 16, "auto"), (False, 16, 16, "self"), (True, 3, 16, "auto"), (True, 2, 16, "kernel"),
        (True, 2, 64, "self"), (True, 16, 64, "auto")]
for partial_half, group, block_m, merge in runs:
    cfg = SplitKVConfig(block_m=block_m, block_n=16, num_warps=4, num_stages=1, programs_per_sm=1.0, min_split_tokens=64,
                        partial_bf16=partial_half)
    for shape, page, fp8, chain in (cases if block_m == 16 else cases[2:4] + cases[6:]):
        x = make_inputs(shape, seed=shape.context_tokens)
        if chain:
            x.mask = tree_mask(shape.draft_tokens, torch.Generator(), chain=True); x.__post_init__()
        if fp8:
            x = with_fp8_cache(x)
        ref = reference_verify(dequantized(x) if fp8 else x)
        y = fp16(x)
        out = torch.full((y.draft_tokens, y.heads, 512), float("nan"), dtype=torch.float16)
        fused_split_kv_triton(y, out, page_size=page, cfg=cfg, num_sms=16, kv_fp8=fp8, merge_group=group, merge=merge)
        err = relative_error(out, ref)
        print(shape, page, fp8, chain, partial_half, group, block_m, merge, err)
        assert not torch.isnan(out).any(), "unwritten rows"
        assert err < 5e-3, err
        assert all(int(c.abs().sum()) == 0 for c in _COUNTERS.values()), "counters not reset"
# the default configurations (fp8: 32-token tiles, 3 stages under 64 rows; 5 stages at 64 rows), 128 SMs' worth of
# splits: 16 rows get 24 splits, a two-level self-merge in 2 groups; 64 rows the two-launch merge
for shape in (VerifyShape(3000, 8, 2, "shuffled_b64"), VerifyShape(1500, 8, 8, "shuffled_b64")):
    x = with_fp8_cache(make_inputs(shape, seed=3))
    for fp8, page in ((False, 1), (True, 1), (True, 64)):
        ref = reference_verify(dequantized(x) if fp8 else x)
        out = torch.full((x.draft_tokens, x.heads, 512), float("nan"), dtype=torch.float16)
        fused_split_kv_triton(fp16(x), out, page_size=page, num_sms=132, kv_fp8=fp8)
        err = relative_error(out, ref)
        print(shape, page, fp8, "default config", err)
        assert not torch.isnan(out).any() and err < 5e-3, err
        assert all(int(c.abs().sum()) == 0 for c in _COUNTERS.values()), "counters not reset"
print("ok")
"""


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton is not installed here")
def test_fused_triton_kernel_in_the_interpreter():
    """The CUDA kernel's own code (one launch, last-arriving program merges), run by Triton's CPU interpreter."""
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=str(ROOT / "lib"))
    res = subprocess.run([sys.executable, "-c", INTERPRET_SCRIPT], env=env, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0 and res.stdout.strip().endswith("ok"), res.stdout[-3000:] + res.stderr[-3000:]


def test_fp8_cache_quantization_and_accuracy():
    x = make_inputs(VerifyShape(300, 2, 4, "shuffled_p1"), seed=2)
    q8 = with_fp8_cache(x)
    assert q8.cache_fp8.dtype == torch.float8_e4m3fn and q8.cache_fp8.shape == x.cache.shape
    assert q8.kv_scale == pytest.approx(float(x.cache.float().abs().max()) / 448.0)
    deq = dequantized(q8).cache
    rel = float((deq - x.cache.float()).norm() / x.cache.float().norm())
    assert 1e-3 < rel < 0.1  # e4m3: 3 mantissa bits, per-tensor scale
    ref = reference_verify(x)
    out = x.out_like()
    run_variant("fused_fp8_p1", q8, out)  # CPU: the torch split-KV design on the dequantized cache
    assert relative_error(out, reference_verify(dequantized(q8))) < 1e-2
    assert 1e-3 < relative_error(out, ref) < FP8_TOL
    fresh = with_fresh_data(q8, seed=5)
    assert fresh.cache_fp8 is not None and not torch.equal(fresh.cache_fp8.float(), q8.cache_fp8.float())
    with pytest.raises(ValueError, match="with_fp8_cache"):
        run_variant("fused_fp8_p1", x, x.out_like())


def test_new_variants_keep_the_old_ones():
    for name in ("baseline_p1", "split_p1", "split_b64"):
        assert KERNEL_VARIANTS[name].design in ("baseline", "split_kv") and not KERNEL_VARIANTS[name].kv_fp8
    assert KERNEL_VARIANTS["fused_fp8_b64"].page_size == 64 and KERNEL_VARIANTS["fused_fp8_b64"].kv_fp8


def test_harness_rows_for_fused_and_fp8(tmp_path):
    spec = GridSpec(contexts=[128], heads=[2], draft_tokens=[4], layouts=["shuffled_p1", "shuffled_b64"],
                    kernels=["split_p1", "fused_p1", "fused_b64", "fused_fp8_p1", "fused_fp8_b64"], n_runs=2, n_warmup=1,
                    rotate_bytes=0, required=[])
    run = Run.create(tmp_path / "r", label="t")
    peaks = {"copy_gbps": 1.0, "matmul_tflops": 1.0}
    n = run_grid(spec, run, peaks, device="cpu")
    rows = run.rows("kernel_ab")
    assert n == len(rows) == 1 + 1 + 2 + 2 + 2  # p1: split_p1, fused_p1, fused_fp8_p1; b64: all five
    for r in rows:
        assert r["error"] is None and r["correct"], r
        if r["kernel"].startswith("fused_fp8"):
            assert r["kv_dtype"] == "fp8_e4m3" and r["rel_err"] < 1e-2 and 1e-3 < r["rel_err_vs_bf16_ref"] < FP8_TOL
            assert r["actual_kv_bytes"] * 2 == r["kv_bytes"]
        else:
            assert r["kv_dtype"] == "bf16"


# (block_m, block_n, num_warps, num_stages, page_size, fp8) -> metadata.shared of triton_fused._fused_kernel compiled
# offline with Triton 3.6.0 for sm_90 (GPUTarget("cuda", 90, 32); pointers, tokens_per_split and stride_kv marked
# divisible by 16; bf16 partials), 2026-11-30, by compile_shared() below.
COMPILED_FUSED = {
    (16, 64, 4, 2, 1, False): 94208, (16, 64, 4, 2, 1, True): 108544, (16, 64, 4, 2, 64, True): 108544,
    (32, 64, 4, 2, 1, False): 114688, (32, 64, 4, 2, 1, True): 147456, (64, 64, 8, 3, 1, True): 185344,
    (64, 64, 8, 3, 64, False): 229888, (64, 64, 8, 2, 1, False): 229376, (64, 64, 8, 2, 1, True): 184320,
    (64, 64, 8, 3, 1, False): 230400, (64, 64, 8, 1, 1, False): 147456, (64, 32, 8, 3, 1, False): 156160,
    (64, 32, 8, 3, 1, True): 133632, (64, 32, 8, 2, 1, False): 155648, (16, 32, 4, 3, 1, False): 65792,
    (32, 32, 4, 3, 1, False): 78336, (64, 64, 8, 4, 1, False): 230400, (16, 16, 4, 1, 1, False): 65792,
    # run 5's fp8 defaults (default_fused_config(rows, kv_fp8=True))
    (16, 32, 4, 3, 1, True): 73216, (16, 32, 4, 3, 64, True): 72708, (32, 32, 4, 3, 1, True): 111104,
    (64, 64, 8, 5, 1, True): 223232, (64, 64, 8, 5, 64, True): 222720,
}


def compile_shared(bm, bn, warps, stages, page=1, fp8=False):
    """metadata.shared of the fused kernel compiled ahead of time for sm_90 (needs triton, no GPU)."""
    import triton  # noqa: PLC0415
    from triton.backends.compiler import GPUTarget  # noqa: PLC0415
    from triton.compiler import ASTSource  # noqa: PLC0415

    from specdiag.kernels.triton_fused import _fused_kernel  # noqa: PLC0415

    names = _fused_kernel.arg_names
    ptr = {"Q": "*bf16", "KV": "*fp8e4nv" if fp8 else "*bf16", "TOKEN_TABLE": "*i64", "BLOCK_TABLE": "*i32",
           "MASK": "*u8", "O_PART": "*bf16", "LSE_PART": "*fp32", "G_PART": "*fp32", "G_LSE": "*fp32",
           "COUNTER": "*i32", "OUT": "*bf16"}
    from specdiag.kernels.triton_fused import merge_stages  # noqa: PLC0415

    const = {"PAGE_SIZE": page, "BLOCK_M": bm, "BLOCK_N": bn, "D_NOPE": 512, "D_PE": 64, "KV_FP8": fp8,
             "FP8_KQ": fp8 and bm < 64, "DIRECT": False, "GROUP": 16, "MERGE_STAGES": merge_stages(bm), "SELF_MERGE": True}
    sig = {n: "constexpr" if n in const else ptr.get(n, "fp32" if n in ("qk_scale", "v_scale") else "i32") for n in names}
    attrs = {(names.index(n),): [["tt.divisibility", 16]] for n in [*ptr, "tokens_per_split", "stride_kv"]}
    k = triton.compile(ASTSource(_fused_kernel, sig, const, attrs), target=GPUTarget("cuda", 90, 32),
                       options={"num_warps": warps, "num_stages": stages})
    return k.metadata.shared


@pytest.mark.parametrize("key", sorted(COMPILED_FUSED))
def test_fused_shared_estimate_vs_compiled(key):
    from specdiag.kernels.splitkv_plan import SplitKVConfig, fused_shared_bytes  # noqa: PLC0415

    bm, bn, warps, stages, _page, fp8 = key
    est = fused_shared_bytes(SplitKVConfig(block_m=bm, block_n=bn, num_warps=warps, num_stages=stages), 1 if fp8 else 2)
    compiled = COMPILED_FUSED[key]
    assert compiled <= est <= compiled + 2048
    if bm == 64 and stages <= 3:
        assert est == compiled or (_page == 64 and 0 <= est - compiled <= 1024)


def test_fused_defaults_fit_the_h200():
    from specdiag.kernels.splitkv_plan import SHARED_LIMIT_SM90, default_fused_config, fused_shared_bytes  # noqa: PLC0415

    for rows in (8, 16, 32, 64, 128, 512, 8192):
        for kv_fp8 in (False, True):
            assert fused_shared_bytes(default_fused_config(rows, kv_fp8), 1 if kv_fp8 else 2) <= SHARED_LIMIT_SM90


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton is not installed here")
@pytest.mark.parametrize("key", [(64, 64, 8, 3, 1, False), (16, 32, 4, 3, 1, True), (64, 64, 8, 5, 1, True)])
def test_compiled_table_is_current(key):
    """The kernel as committed still compiles for sm_90 to the recorded shared memory (a changed kernel fails here)."""
    assert compile_shared(*key) == COMPILED_FUSED[key]


# ---- anchors (anchors.py): what each cannot do, the input conversion, SGLang's kernel in the interpreter ----

def test_anchor_reasons():
    from specdiag.kernels.anchors import cannot, is_chain  # noqa: PLC0415

    tree = make_inputs(VerifyShape(100, 2, 6, "shuffled_p1"), seed=3)
    chain = make_inputs(VerifyShape(100, 2, 6, "shuffled_p1"), seed=3, chain=True)
    assert not is_chain(tree.mask) and is_chain(chain.mask)
    assert "tree mask" in cannot("sglang_splitkv", tree) and "tree mask" in cannot("flashinfer_mla", tree)
    assert cannot("sglang_splitkv", chain) is None and cannot("flashinfer_mla", chain) is None
    assert "block table" in cannot("flashinfer_mla", chain, page_size=64)
    assert "token index table" in cannot("sglang_splitkv", chain, page_size=64)
    with pytest.raises(ValueError, match="unknown anchor"):
        cannot("flashmla", chain)


def test_flashinfer_tables():
    from specdiag.kernels.anchors import flashinfer_tables  # noqa: PLC0415

    x = make_inputs(VerifyShape(130, 2, 4, "shuffled_b64"), seed=1, chain=True)
    t1 = flashinfer_tables(x, 1)
    assert t1["kv_indices"].dtype == torch.int32 and torch.equal(t1["kv_indices"].long(), x.token_table)
    assert t1["qo_indptr"].tolist() == [0, 4] and t1["kv_indptr"].tolist() == [0, 134] and t1["kv_len"].tolist() == [134]
    t64 = flashinfer_tables(x, 64)
    assert t64["kv_indptr"].tolist() == [0, 3] and torch.equal(t64["kv_indices"], x.block_table)
    # the page tables address the same rows as the token table
    pages = t64["kv_indices"].long()
    assert torch.equal((pages[:, None] * 64 + torch.arange(64)).reshape(-1)[:134], x.token_table)


def test_sglang_args_describe_the_same_problem():
    from specdiag.kernels.anchors import sglang_verify_args  # noqa: PLC0415

    x = make_inputs(VerifyShape(100, 3, 5, "shuffled_p1"), seed=2, chain=True)
    out = x.out_like()
    args, kw = sglang_verify_args(x, out)
    q, k_ext, v_ext, o, k_buf, v_buf, qo, kv_ptr, kv_idx, mask, causal, mask_ptr, max_ext, ks, vs = args
    assert q is x.q and o.data_ptr() == out.data_ptr() and causal is True and mask is None and max_ext == 5
    assert k_buf.shape == (x.cache.shape[0], 1, 576) and v_buf.shape == (x.cache.shape[0], 1, 512)
    assert torch.equal(k_ext[:, 0], x.cache[x.token_table[100:]]) and torch.equal(v_ext[:, 0], x.cache[x.token_table[100:], :512])
    assert qo.tolist() == [0, 5] and kv_ptr.tolist() == [0, 100] and torch.equal(kv_idx, x.token_table[:100])
    assert kw == {"sm_scale": x.sm_scale, "max_bs": 1} and (ks, vs) == (1.0, 1.0)


SGLANG_SCRIPT = r"""
import torch
import specdiag.kernels.triton_fused  # the interpreter's numpy-2 fix
from specdiag.kernels.anchors import load_sglang_verify, run_sglang_verify, sglang_verify_args
from specdiag.kernels.cases import relative_error
from specdiag.kernels.mla import VerifyInputs, VerifyShape, make_inputs
from specdiag.kernels.reference import reference_verify
mod = load_sglang_verify()
# Prefixes where every one of SGLang's splits runs: its stage 2 reads the partial output of every split, also of a
# split that did not run (never written; torch.empty), weighted by 0, so an empty split gives garbage x 0, NaN when
# the garbage is inf or NaN (a 70-token prefix: 4 splits of 32 tokens, the fourth empty; prefixes of 1-96, 129-192
# and 257-288 tokens have one). 100 and 230 tokens: 4 splits of 32 and of 64, all non-empty.
for shape in (VerifyShape(100, 2, 4, "shuffled_p1"), VerifyShape(230, 3, 3, "shuffled_b64")):
    x = make_inputs(shape, seed=1, chain=True)
    ref = reference_verify(x)
    y = VerifyInputs(q=x.q.half(), cache=x.cache.half(), token_table=x.token_table, block_table=None, mask=x.mask,
                     n_prefix=x.n_prefix, sm_scale=x.sm_scale)
    out = torch.full((shape.draft_tokens, shape.heads, 512), float("nan"), dtype=torch.float16)
    run_sglang_verify(mod, *sglang_verify_args(y, out))
    err = relative_error(out, ref)
    print(shape, err)
    assert err < 5e-3, err
print("ok")
"""


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton is not installed here")
def test_sglang_anchor_adapter_in_the_interpreter():
    """SGLang 0.5.17's own verify_splitkv kernel, fed by our adapter, matches our fp32 reference (Triton interpreter)."""
    from specdiag.kernels.anchors import SGLANG_VERIFY_RELPATH, find_sglang_verify  # noqa: PLC0415

    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=str(ROOT / "lib"))
    env.setdefault("SGLANG_SITE", "/work/sglpack/site")  # where this project's machines unpack SGLang 0.5.17
    if find_sglang_verify() is None and not (Path(env["SGLANG_SITE"]) / SGLANG_VERIFY_RELPATH).is_file():
        pytest.skip("SGLang 0.5.17's verify_splitkv.py is not on this machine (SGLANG_SITE, /tmp/site, .anchors/)")
    res = subprocess.run([sys.executable, "-c", SGLANG_SCRIPT], env=env, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0 and res.stdout.strip().endswith("ok"), res.stdout[-3000:] + res.stderr[-3000:]


def test_harness_states_why_anchors_did_not_run(tmp_path):
    spec = GridSpec(contexts=[128], heads=[2], draft_tokens=[4], layouts=["shuffled_b64"], kernels=["fused_p1"],
                    n_runs=2, n_warmup=1, rotate_bytes=0, required=[], anchors=["sglang_splitkv", "flashinfer_mla"])
    run = Run.create(tmp_path / "tree", label="t")
    run_grid(spec, run, {"copy_gbps": 1.0, "matmul_tflops": 1.0}, device="cpu")
    rows = {r["kernel"]: r for r in run.rows("kernel_ab")}
    assert set(rows) == {"fused_p1", "sglang_splitkv_p1", "flashinfer_mla_p1", "flashinfer_mla_b64"}
    assert all("tree mask" in rows[k]["skipped"] for k in rows if k != "fused_p1")
    spec.chain = True
    run = Run.create(tmp_path / "chain", label="t")
    run_grid(spec, run, {"copy_gbps": 1.0, "matmul_tflops": 1.0}, device="cpu")
    rows = {r["kernel"]: r for r in run.rows("kernel_ab")}
    assert rows["fused_p1"]["mask"] == "chain" and rows["fused_p1"]["correct"]
    assert all("CUDA only" in rows[k]["skipped"] for k in rows if k != "fused_p1")


def _row(kernel, design, ctx, h, t, ms, layout="shuffled_p1", kv="bf16", **kw):
    from specdiag.kernels.cases import derived_metrics  # noqa: PLC0415

    n_kv = ctx + t
    return {"kernel": kernel, "design": design, "context_tokens": ctx, "heads": h, "draft_tokens": t, "layout": layout,
            "rows": h * t, "n_kv": n_kv, "ms_median": ms, "rel_err": 2e-3, "kv_dtype": kv, "error": None, "skipped": None,
            "correct": True, "mask": "chain", **derived_metrics(n_kv, h, t, ms, 4000.0, 800.0), **kw}


def test_issue13_analysis_on_synthetic_rows():
    from specdiag.kernels import analysis  # noqa: PLC0415

    ctx = 131072
    floor_ms = (ctx + 1) * 1152 / 4000e9 * 1e3  # the copy-bandwidth floor of h8 T1 at 128k
    rows = [_row("fused_p1", "fused_split_kv", ctx, 8, 1, floor_ms / 0.9),  # 90 % of copy: met
            _row("split_p1", "split_kv", ctx, 8, 1, floor_ms / 0.6),  # 60 %: missed
            _row("sglang_splitkv_p1", "anchor", ctx, 8, 1, floor_ms / 0.3),
            _row("flashinfer_mla_p1", "anchor", ctx, 8, 1, floor_ms / 0.95),
            _row("fused_fp8_p1", "fused_split_kv", ctx, 8, 1, floor_ms / 0.9 * 0.6, kv="fp8_e4m3",
                 rel_err_vs_bf16_ref=0.04, actual_gbps=1.0),
            {"kernel": "flashinfer_mla_b64", "design": "anchor", "context_tokens": ctx, "heads": 8, "draft_tokens": 1,
             "layout": "shuffled_p1", "skipped": "page_size 64 needs a block table", "error": None}]
    df = analysis.measured(rows)
    t = analysis.issue13_targets(df)
    mem = t[t["target"].str.startswith("memory") & (t["kernel"] == "fused_p1")]
    assert len(mem) == 1 and mem["met"].iloc[0] and mem["value"].iloc[0] == pytest.approx(90.0, rel=1e-6)
    assert not t[(t["kernel"] == "split_p1")]["met"].iloc[0]
    assert "fused_fp8_p1" not in set(t["kernel"])  # fp8 reads half the bytes: not judged against bf16 copy
    cmp_ = analysis.anchor_comparison(df).set_index("anchor")
    assert cmp_.loc["sglang_splitkv_p1", "ours_kernel"] == "fused_p1"
    assert cmp_.loc["sglang_splitkv_p1", "ours_over_anchor"] == pytest.approx(0.3 / 0.9)
    assert cmp_.loc["flashinfer_mla_p1", "faster"] == "anchor"
    st = analysis.anchor_status(rows)
    assert list(st["kernel"]) == ["flashinfer_mla_b64"] and "block table" in st["why"].iloc[0]
    f8 = analysis.fp8_table(df)
    assert f8["fp8_over_bf16_time"].iloc[0] == pytest.approx(0.6) and f8["rel_err_vs_bf16_ref"].iloc[0] == 0.04
    fv = analysis.fused_vs_two_launch(df)
    assert fv["fused_over_split"].iloc[0] == pytest.approx(0.6 / 0.9)
    # the issue-5 rows (no kv_dtype, no anchors) still analyse
    old = analysis.measured([{k: v for k, v in r.items() if k not in ("kv_dtype", "mask")} for r in rows[:2]])
    assert analysis.anchor_comparison(old).empty and analysis.fp8_table(old).empty and not analysis.issue13_targets(old).empty


def test_fixed_cost_by_kernel_separates_fixed_cost_from_rate():
    """Synthetic rows with known fixed costs and rates: the per-kernel fit gives them back (fp8: half the bytes read)."""
    from specdiag.kernels import analysis  # noqa: PLC0415
    from specdiag.kernels.mla import kv_bytes  # noqa: PLC0415

    def ms(ctx, fixed_us, gbps):
        return (fixed_us * 1e-6 + kv_bytes(ctx + 1) / (gbps * 1e9)) * 1e3

    rows = []
    for ctx in (65536, 131072, 262144):
        rows += [_row("split_p1", "split_kv", ctx, 8, 1, ms(ctx, 20.0, 3900.0)),
                 _row("fused_p1", "fused_split_kv", ctx, 8, 1, ms(ctx, 44.0, 3800.0)),
                 _row("fused_fp8_p1", "fused_split_kv", ctx, 8, 1, ms(ctx, 40.0, 1750.0), kv="fp8_e4m3")]
    rows.append(_row("fused_p1", "fused_split_kv", 131072, 16, 1, 0.08))  # one context only: no fit for h16
    fit = analysis.fixed_cost_by_kernel(analysis.measured(rows)).set_index("kernel")
    assert list(fit.index) == ["split_p1", "fused_p1", "fused_fp8_p1"]
    assert fit.loc["split_p1", "fixed_us"] == pytest.approx(20.0, rel=1e-6)
    assert fit.loc["fused_p1", "fixed_us"] == pytest.approx(44.0, rel=1e-6)
    assert fit.loc["fused_p1", "marginal_gbps"] == pytest.approx(3800.0, rel=1e-6)
    assert fit.loc["fused_fp8_p1", "marginal_gbps"] == pytest.approx(1750.0, rel=1e-6)
    assert fit.loc["fused_fp8_p1", "marginal_actual_gbps"] == pytest.approx(875.0, rel=1e-6)
    assert fit.loc["split_p1", "marginal_actual_gbps"] == fit.loc["split_p1", "marginal_gbps"]
    assert analysis.fixed_cost_by_kernel(analysis.measured(rows), kernels=("nope",)).empty


def test_time_ratios_to_a_kernel_of_this_run_or_another():
    """Each kernel's time over the base kernel's on the same case; the base from this run or another call's rows."""
    from specdiag.kernels import analysis  # noqa: PLC0415

    rows = [_row("split_p1", "split_kv", 131072, 8, 8, 0.100), _row("split_n32s5_p1", "split_kv", 131072, 8, 8, 0.113),
            _row("split_qk1_p1", "split_kv", 131072, 8, 8, 0.115), _row("split_p1", "split_kv", 65536, 8, 8, 0.064),
            _row("split_n32s5_p1", "split_kv", 65536, 8, 8, 0.069),
            _row("split_qk1_p1", "split_kv", 262144, 8, 8, 0.207)]  # no split_p1 at 256k: left out
    df = analysis.measured(rows)
    r = analysis.time_ratios(df).set_index(["kernel", "context_tokens"])
    assert sorted(r.index) == [("split_n32s5_p1", 65536), ("split_n32s5_p1", 131072), ("split_qk1_p1", 131072)]
    assert r.loc[("split_n32s5_p1", 131072), "over_base"] == pytest.approx(1.13)
    assert r.loc[("split_qk1_p1", 131072), "base_ms"] == 0.100 and set(r["base_from"]) == {"same run"}
    q = analysis.time_ratios(df, base="split_n32s5_p1")
    assert list(q["kernel"]) == ["split_p1", "split_qk1_p1", "split_p1"]
    assert q["over_base"].iloc[1] == pytest.approx(0.115 / 0.113)
    # the base from another call's rows (FlashInfer measured in a different run): every kernel of this run is kept
    other = analysis.measured([_row("flashinfer_mla_p1", "anchor", 131072, 8, 8, 0.0835)])
    x = analysis.time_ratios(df, base="flashinfer_mla_p1", base_df=other)
    assert sorted(x["kernel"]) == ["split_n32s5_p1", "split_p1", "split_qk1_p1"] and set(x["base_from"]) == {"other run"}
    assert x.set_index("kernel").loc["split_p1", "over_base"] == pytest.approx(0.100 / 0.0835)
    assert analysis.time_ratios(df, base="flashinfer_mla_p1").empty  # not in this run
    assert analysis.time_ratios(df.iloc[0:0]).empty


def test_warm_flashinfer_reports_why_it_cannot_run_here(capsys):
    """The device job's FlashInfer build step: on a machine without FlashInfer (or a GPU) every case is a row
    with the error, and the CLI says what is missing instead of crashing."""
    from specdiag.kernels.anchors import main, warm_flashinfer  # noqa: PLC0415

    try:
        import flashinfer  # noqa: F401, PLC0415
        pytest.skip("flashinfer is importable here: the error path is not reachable")
    except ImportError:
        pass
    rows = warm_flashinfer("cpu", context_tokens=64, heads=2, draft_tokens_list=(1, 3))
    assert [r["draft_tokens"] for r in rows] == [1, 3]
    assert all("flashinfer" in r["error"] and "rel_err" not in r for r in rows)
    if not torch.cuda.is_available():
        assert main(["--warm-flashinfer"]) == 2
        assert "need a CUDA GPU" in capsys.readouterr().err


def test_target_needs_and_the_copy_of_the_same_bytes():
    """Synthetic rows of known fixed cost and rate: each target as a time, beside a copy of the same bytes and the fit."""
    from specdiag.kernels import analysis  # noqa: PLC0415
    from specdiag.kernels.mla import kv_bytes  # noqa: PLC0415

    def ms(ctx, fixed_us, gbps, t=1):
        return (fixed_us * 1e-6 + kv_bytes(ctx + t) / (gbps * 1e9)) * 1e3

    rows, copies = [], []
    for ctx in (65536, 131072, 262144):
        rows += [_row("split_p1", "split_kv", ctx, 8, 1, ms(ctx, 20.0, 3900.0)),
                 _row("fused_p1", "fused_split_kv", ctx, 8, 1, ms(ctx, 40.0, 3900.0)),
                 _row("flashinfer_mla_p1", "anchor", ctx, 8, 1, ms(ctx, 42.0, 4000.0))]
        copies.append({"context_tokens": ctx, "traffic_bytes": ctx * 1152, "ms_median": ms(ctx, 3.0, 4200.0, t=0),
                       "gbps": 1.0, "error": None})
    df = analysis.measured(rows)
    same = analysis.same_bytes_copy(df, copies)
    assert len(same) == 9
    r = same[(same["kernel"] == "split_p1") & (same["context_tokens"] == 131072)].iloc[0]
    assert r["over_copy"] == pytest.approx(ms(131072, 20.0, 3900.0) / ms(131072, 3.0, 4200.0, t=0))
    needs = analysis.target_needs(df, 4000.0, copies).set_index("context_tokens")
    assert set(needs.index) == {65536, 131072, 262144}  # h8T1 only: the memory targets; no h8T8 row, no compute
    n = needs.loc[131072]
    target_ms = kv_bytes(131073) / (0.85 * 4000e9) * 1e3
    assert n["target_ms"] == pytest.approx(target_ms)
    assert n["target_over_copy"] == pytest.approx(target_ms / ms(131072, 3.0, 4200.0, t=0))
    assert n["ours_kernel"] == "split_p1" and n["ours_ms"] == pytest.approx(ms(131072, 20.0, 3900.0))
    assert n["ours_cut_pct"] == pytest.approx(100 * (1 - target_ms / ms(131072, 20.0, 3900.0)))
    assert n["ours_fixed_us"] == pytest.approx(20.0, rel=1e-6)
    assert n["fixed_budget_us"] == pytest.approx(1e3 * target_ms - kv_bytes(131073) / 3900e9 * 1e6, rel=1e-6)
    assert n["flashinfer_mla_p1_ms"] == pytest.approx(ms(131072, 42.0, 4000.0))
    assert needs.loc[65536, "target_ms"] == pytest.approx(kv_bytes(65537) / (0.75 * 4000e9) * 1e3)  # 75 % at 64k
    assert analysis.same_bytes_copy(df, []).empty and analysis.target_needs(df.iloc[0:0], 4000.0, copies).empty


def test_tree_mask_reason_is_what_cannot_says_for_a_tree():
    from specdiag.kernels.anchors import ANCHORS, cannot, tree_mask_reason  # noqa: PLC0415

    tree = make_inputs(VerifyShape(100, 2, 6, "shuffled_p1"), seed=3)
    for name in ANCHORS:
        assert tree_mask_reason(name) == cannot(name, tree) and tree_mask_reason(name).startswith("tree mask")
    with pytest.raises(ValueError, match="unknown anchor"):
        tree_mask_reason("flashmla")
    with pytest.raises(ValueError, match="is a chain"):
        tree_mask_reason("flashinfer_mla", draft_tokens=1)  # one token: every tree is a chain
