"""Notebook 06 on the CPU: the torch implementations on a tiny grid, then the recorded H200 run replayed."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable

import pytest
import torch

from specdiag.paths import PROJECT_ROOT, REFERENCE_DIR

H200 = REFERENCE_DIR / "kernel-ab-h200"


@pytest.mark.notebook
@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU host the notebook measures; this test is the CPU replay")
def test_06_replays_the_h200_run_on_cpu(run_notebook: Callable[..., Path], tmp_path: Path) -> None:
    out = run_notebook("06_kernel_ab")
    run_dir = tmp_path / "run"
    res = json.loads((run_dir / "findings" / "06_kernel_ab.json").read_text())
    m = res["metrics"]
    assert m["source_dir"] == "data/reference/kernel-ab-h200"  # project-relative: shared pages
    assert m["gpu"].startswith("NVIDIA H200") and m["cases"] > 300
    assert m["speedup_128k_h8_t8_min"] >= 20
    assert set(m["targets"]) == {"memory: >= 85% of copy bandwidth (H*T <= 64)",
                                 "compute: >= 50% of bf16 matmul (H*T >= 256)",
                                 "page_size 1 within 10% of 64-token blocks",
                                 "split-KV >= 20x baseline (128k, h8, T8)"}
    ids = {f["id"] for f in res["findings"]}
    assert "kernel_ab.baseline_starves" in ids
    # the CPU smoke grid ran the torch implementations into this run's own table, all correct
    cpu_rows = [json.loads(line) for line in (run_dir / "kernel_ab.jsonl").read_text().splitlines()]
    assert cpu_rows and all(r["impl"] == "torch" and r["correct"] for r in cpu_rows)
    assert "% of copy" in out.read_text()


@pytest.mark.notebook
def test_06_names_a_bad_parameter(run_notebook: Callable[..., Path]) -> None:
    import papermill

    with pytest.raises(papermill.PapermillExecutionError, match="grid must be"):
        run_notebook("06_kernel_ab", replay_dir=str(H200), grid="huge")


@pytest.mark.gpu
@pytest.mark.notebook
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (run `make test-gpu` on a GPU host)")
def test_06_measures_on_cuda(run_notebook: Callable[..., Path], tmp_path: Path) -> None:
    """Notebook 06's measuring path: peaks, the Triton kernels on the smoke grid, the analysis of its own rows."""
    from specdiag.runs import Run

    run_dir = tmp_path / "run"
    run_notebook("06_kernel_ab", run_dir=str(run_dir), grid="smoke", tune=False)
    res = json.loads((run_dir / "findings" / "06_kernel_ab.json").read_text())
    m = res["metrics"]
    assert (PROJECT_ROOT / m["source_dir"]).resolve() == run_dir.resolve()  # analysed what it measured, not the reference
    assert m["gpu"] == torch.cuda.get_device_name()
    assert m["copy_gbps"] > 0 and m["matmul_tflops"] > 0
    rows = Run.open(run_dir).rows("kernel_ab")
    timed = [r for r in rows if r.get("kernel") and not r.get("skipped")]
    assert timed and all(r["impl"] == "triton" and r["correct"] and r["error"] is None for r in timed)
    assert m["cases"] == len(timed)
    assert {r["kernel"] for r in timed} == {"baseline_p1", "split_p1", "split_b64"}
    found = {f["id"]: f for f in res["findings"]}
    base = found["kernel_ab.baseline_starves"]
    assert base["numbers"]["copy_gbps"] == pytest.approx(m["copy_gbps"])
    from specdiag.kernels.analysis import BASELINE_CRITICAL_PCT, BASELINE_WARNING_PCT

    pct = base["numbers"]["baseline_pct_copy_max"]
    assert base["severity"] == ("critical" if pct < BASELINE_CRITICAL_PCT else
                                "warning" if pct < BASELINE_WARNING_PCT else "ok")


RUN4 = REFERENCE_DIR / "kernel-ab-h200-run4"


def _run4_rows() -> list[dict]:
    return [json.loads(line) for line in (RUN4 / "kernel_ab.jsonl").read_text().splitlines()]


def _ms(rows: list[dict], kernel: str, ctx: int, h: int, t: int, layout: str) -> float:
    (r,) = [r for r in rows if (r["kernel"], r["context_tokens"], r["heads"], r["draft_tokens"], r["layout"])
            == (kernel, ctx, h, t, layout) and not r.get("skipped")]
    return r["ms_median"]


@pytest.mark.notebook
def test_06_replays_run4_with_the_anchor_single_launch_and_fp8(run_notebook: Callable[..., Path], tmp_path: Path) -> None:
    """06 on run 4 (issue 13, data/reference/kernel-ab-h200-run4): section 8's numbers equal what the raw rows say."""
    out = run_notebook("06_kernel_ab", replay_dir=str(RUN4), cpu_smoke=False)
    res = json.loads((tmp_path / "run" / "findings" / "06_kernel_ab.json").read_text())
    m = res["metrics"]
    rows = _run4_rows()
    measured = [r for r in rows if not r.get("skipped") and r.get("error") is None and r.get("correct")]
    assert m["source_dir"] == "data/reference/kernel-ab-h200-run4"
    assert m["gpu"] == "NVIDIA H200" and m["cases"] == len(measured) == 102
    assert m["speedup_128k_h8_t8_min"] is None and m["baseline_max_pct_copy"] is None  # no baseline rows in run 4
    text = out.read_text()
    assert "nan-nanx" not in text and "has no baseline_p1 rows" in text

    # the anchor: SGLang's upstream split-KV verify on all 18 chain cases, ours faster on each; FlashInfer not run
    pairs = {}
    for r in measured:
        if r["kernel"] == "sglang_splitkv_p1":
            key = (r["context_tokens"], r["heads"], r["draft_tokens"], r["layout"])
            ours = min(o["ms_median"] for o in measured if o["design"] in ("split_kv", "fused_split_kv")
                       and o["kv_dtype"] == "bf16" and (o["context_tokens"], o["heads"], o["draft_tokens"], o["layout"]) == key)
            pairs[key] = ours / r["ms_median"]
    assert len(pairs) == 18
    assert m["ours_over_anchor"]["sglang_splitkv_p1"] == pytest.approx(min(pairs.values()))
    assert m["ours_over_anchor_max"]["sglang_splitkv_p1"] == pytest.approx(max(pairs.values()))
    assert max(pairs.values()) < 0.1  # measured: ours 13-30x faster (0.034-0.078)
    assert m["anchors_not_run"] == ["flashinfer_mla_b64", "flashinfer_mla_p1"]
    assert "FlashInfer JIT-compiles" in text

    # single launch over two launches, same page size and layout: slower in every one of the 28 pairs (19 p1, 9 b64)
    ratios = [_ms(rows, f, c, h, t, lay) / _ms(rows, s, c, h, t, lay)
              for f, s in (("fused_p1", "split_p1"), ("fused_b64", "split_b64"))
              for (c, h, t, lay) in {(r["context_tokens"], r["heads"], r["draft_tokens"], r["layout"]) for r in measured
                                     if r["kernel"] == f}
              if any(r["kernel"] == s and (r["context_tokens"], r["heads"], r["draft_tokens"], r["layout"]) == (c, h, t, lay)
                     for r in measured)]
    assert m["fused_over_split"]["cases"] == len(ratios) == 28
    assert m["fused_over_split"]["min"] == pytest.approx(min(ratios)) and m["fused_over_split"]["max"] == pytest.approx(max(ratios))
    assert min(ratios) > 1.0
    h8t1 = m["fixed_cost_fit"]
    assert h8t1["fused_p1 h8 t1"]["fixed_us"] > h8t1["split_p1 h8 t1"]["fixed_us"] + 10  # the single launch adds a fixed cost

    # fp8 KV: each row beside the same kernel's bf16 row; within the harness's tolerances against both references
    f8 = [r for r in measured if r["kv_dtype"] == "fp8_e4m3"]
    fp8_ratios = [r["ms_median"] / _ms(rows, r["kernel"].replace("fused_fp8_", "fused_"), r["context_tokens"], r["heads"],
                                       r["draft_tokens"], r["layout"]) for r in f8]
    assert m["fp8"]["cases"] == len(f8) == 28
    assert m["fp8"]["over_bf16_time_min"] == pytest.approx(min(fp8_ratios))
    assert m["fp8"]["over_bf16_time_max"] == pytest.approx(max(fp8_ratios))
    assert min(fp8_ratios) > 1.0  # fp8 slower than bf16 in every case of this run
    errs = [r["rel_err_vs_bf16_ref"] for r in f8]
    assert m["fp8"]["rel_err_vs_bf16_ref_min"] == pytest.approx(min(errs))
    assert m["fp8"]["rel_err_vs_bf16_ref_max"] == pytest.approx(max(errs))
    from specdiag.kernels.cases import FP8_TOL

    assert max(errs) < FP8_TOL and m["fp8"]["rel_err_vs_dequantized_ref_max"] <= 1e-2

    # issue 13's targets: each one missed, the best value equal to the best row's
    t13 = m["issue13_targets"]
    assert {k: v["met"] for k, v in t13.items()} == {k: 0 for k in t13} and len(t13) == 5
    best_128k = max(r["pct_copy_bw"] for r in measured if r["context_tokens"] == 131072 and r["heads"] in (8, 16)
                    and r["draft_tokens"] == 1 and r["kv_dtype"] == "bf16")
    assert t13["memory: >= 85% of copy at 128k (H in 8,16; H*T <= 16)"]["best"] == pytest.approx(best_128k)
