"""02's trace timeline (specdiag.steps.gpu_utilization.timeline) and the pure pieces it adds to the trace analysis:
a synthetic trace with known intervals -> lanes, CPU phases and step boundaries; then the committed H200 traces."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
from test_torch_trace import NGRAM, gpu, launch, marker, py

from specdiag.paths import REFERENCE_DIR
from specdiag.runs import Run
from specdiag.steps.gpu_utilization import timeline as T
from specdiag.telemetry import torch_trace as tt
from specdiag.telemetry.intervals import innermost_segments, union_us

PLUGIN_TRACED = REFERENCE_DIR / "sglang-h200-mla2-plugin-traced"
STOCK_TRACED = REFERENCE_DIR / "sglang-h200-mla2-stock-traced"


def same(got: Any, want: Any) -> bool:
    """Sequences of tuples equal, numbers to 1e-9 (pytest.approx takes no nested tuples)."""
    return len(got) == len(want) and all(
        len(g) == len(w) and all(a == pytest.approx(b, abs=1e-9) if isinstance(b, float) else a == b
                                 for a, b in zip(g, w)) for g, w in zip(got, want))


# --- pure pieces ------------------------------------------------------------------------------------------
def test_innermost_segments_flattens_nesting() -> None:
    # outer 0-100 holds 10-40 (which holds 20-30) and 60-70; another interval 200-210 after a gap
    got = innermost_segments([(0, 100, "outer"), (10, 40, "mid"), (20, 30, "inner"), (60, 70, "mid"),
                              (200, 210, "late")])
    assert got == [(0, 10, "outer"), (10, 20, "mid"), (20, 30, "inner"), (30, 40, "mid"), (40, 60, "outer"),
                   (60, 70, "mid"), (70, 100, "outer"), (200, 210, "late")]
    # the same start: the shorter (inner) one wins; empty and reversed intervals count for nothing
    assert innermost_segments([(0, 50, "a"), (0, 20, "b"), (5, 5, "z"), (9, 3, "y")]) == [(0, 20, "b"), (20, 50, "a")]
    # a call of the same phase nested in another: one piece, not three
    assert innermost_segments([(0, 10, "p"), (2, 4, "p")]) == [(0, 10, "p")]
    assert innermost_segments([]) == []


def test_innermost_segments_cover_the_union() -> None:
    spans = [(0, 7, "a"), (1, 3, "b"), (2, 9, "c"), (12, 15, "a")]
    got = innermost_segments(spans)
    assert sum(e - s for s, e, _ in got) == pytest.approx(union_us((s, e) for s, e, _ in spans))
    assert all(b[0] >= a[1] for a, b in zip(got, got[1:]))


def test_pick_steps() -> None:
    def rows(*spec: str) -> list[dict[str, Any]]:  # c: complete verify, p: partial, n: complete, not a verify step
        return [{"step": i, "partial": s == "p", "verify_step": s != "n"} for i, s in enumerate(spec)]

    assert T.pick_steps(rows("p", "c", "c", "c", "c", "p"), 3) == [1, 2, 3]
    assert T.pick_steps(rows("c", "n", "c", "c", "p", "c", "c", "c"), 3) == [5, 6, 7]
    assert T.pick_steps(rows("c", "n", "c", "c", "p"), 3) == [2, 3]  # the longest run when none is long enough
    assert T.pick_steps(rows("p", "n", "p"), 3) == []


def test_clip_ms_cuts_merges_and_shifts() -> None:
    got = T.clip_ms([(50, 150), (140, 180), (300, 400), (900, 1200), (-50, -10)], 100, 1000, 100)
    assert same(got, [(0.0, 0.08), (0.2, 0.3), (0.8, 0.9)])


def test_unprofiled_step_from_the_sweep() -> None:
    sweep = [{"context_tokens": 1024, "step_ms": 2.0}, {"context_tokens": 1024, "step_ms": 4.0},
             {"context_tokens": 1024, "step_ms": 100.0, "error": "timeout"}, {"context_tokens": 2048, "step_ms": 9.0}]
    assert T.unprofiled_step_ms(sweep, 1024) == pytest.approx(3.0)
    assert T.unprofiled_step_ms(sweep, 4096) is None and T.unprofiled_step_ms(sweep, None) is None
    got = T.with_unprofiled({"gpu_busy_ms": 0.6, "arm": "a"}, 2.4)
    assert got["arm"] == "a" and got["gpu_busy_pct_of_unprofiled_step"] == pytest.approx(25.0)
    assert T.with_unprofiled({"gpu_busy_ms": 0.6}, None)["gpu_busy_pct_of_unprofiled_step"] is None


def test_phase_calls_keys_every_phase() -> None:
    calls = tt.python_calls([py(f"{NGRAM}(237): _prepare_draft_tokens", 0, 5), py("x.py(1): other", 6, 1)])
    got = tt.phase_calls(calls)
    assert set(got) == {name for name, _ in tt.tt.CPU_PHASES}
    assert [c.name for c in got["ngram_draft"]] == [f"{NGRAM}(237): _prepare_draft_tokens"] and got["sample"] == []


# --- a synthetic trace with known intervals ------------------------------------------------------------------
def four_steps() -> list[dict[str, Any]]:
    """Markers at 0, 1000, 2000, 3000 µs; every step prepares drafts (a verify step); the last one is partial.
    step 0: attention 200-500, GEMM 400-700, nested CPU phases; step 1: attention 1300-1400, a kernel launched at
    1900 that runs 1950-2300 (into step 2); step 2: GEMM 2100-2200."""
    ev = [py("torch/profiler/profiler.py(1128): start", -100, 50)]
    for i in range(4):
        ev += [marker(1000 * i, 800), py(f"{NGRAM}(237): _prepare_draft_tokens", 1000 * i + 20, 180)]
    ev += [py(f"{NGRAM}(295): _prepare_for_speculative_decoding", 10, 290),
           py(f"{NGRAM}(377): _update_ngram_corpus", 600, 50)]
    ev += [launch(100, 1), gpu("_ragged_partial_kernel", 200, 300, 1),
           launch(150, 2), gpu("nvjet_tst_128x256_64x4_1x2_h_bz_coopB_TNT", 400, 300, 2, stream=8),
           launch(1250, 3), gpu("_ragged_merge_kernel", 1300, 100, 3),
           launch(1900, 4), gpu("_fwd_kernel", 1950, 350, 4),
           launch(2050, 5), gpu("nvjet_tst_64x8", 2100, 100, 5)]
    return ev


def test_timeline_of_a_known_trace(tmp_path: Path) -> None:
    ref = T.TraceRef(tmp_path / "arm-131072-TP-0.trace.json.gz", "arm", 131072)
    tl = T.build_timeline(four_steps(), ref, n_steps=2)
    assert tl.steps == (0, 1) and tl.origin_us == 0.0
    assert tl.boundaries_ms == pytest.approx((0.0, 1.0, 2.0))
    assert same(tl.gpu_lanes[T.ALL_GPU], [(0.2, 0.7), (1.3, 1.4), (1.95, 2.0)])  # cut at the last end
    assert same(tl.gpu_lanes["attn_specdiag_splitkv"], [(0.2, 0.5), (1.3, 1.4)])
    assert same(tl.gpu_lanes["gemm"], [(0.4, 0.7)])  # step 2's GEMM (2.1-2.2 ms) is not drawn
    assert same(tl.gpu_lanes["attn_sglang_triton"], [(1.95, 2.0)])
    assert list(tl.gpu_lanes)[0] == T.ALL_GPU and "norm" not in tl.gpu_lanes
    # CPU lane: draft prep (20-200) inside the speculative prep (10-300); the corpus update alone
    assert same(tl.cpu_segments[:4], [(0.01, 0.02, "ngram_prepare"), (0.02, 0.2, "ngram_draft"),
                                                 (0.2, 0.3, "ngram_prepare"), (0.6, 0.65, "ngram_corpus_update")])
    assert same(tl.cpu_segments[4:5], [(1.02, 1.2, "ngram_draft")])
    s = tl.summary
    # complete steps 0, 1, 2: busy 0.5 of 1.0 ms, 0.45 (100 + 350 µs launched in it) of 1.0, 0.1 of 1.0
    assert (s["steps_found"], s["steps_counted"], s["steps_drawn"]) == (4, 3, [0, 1])
    assert s["gpu_busy_pct"] == pytest.approx(45.0)
    assert s["gpu_busy_ms"] == pytest.approx(0.45) and s["wall_ms"] == pytest.approx(1.0)
    # median per step by class: splitkv (0.25, 0.1, 0) -> 0.1; gemm (0.25, 0, 0.1) -> 0.1; triton (0, 0.35, 0) -> 0
    assert s["largest_class"] in ("attn_specdiag_splitkv", "gemm") and s["largest_class_ms"] == pytest.approx(0.1)
    assert s["drawn_ms"] == pytest.approx(2.0) and s["drawn_gpu_busy_ms"] == pytest.approx(0.5 + 0.1 + 0.05)
    line = T.summary_line(s)
    assert line.startswith("arm, 128k context: GPU busy 45.0 %") and "3 complete steps" in line
    (f,) = T.trace_findings([s])
    assert f.id == "utilization.trace_gpu_idle.arm-131072" and f.severity == "warning"
    (g,) = T.trace_findings([s], idle_below_pct=40.0)
    assert g.id == "utilization.trace_gpu_busy.arm-131072" and g.severity == "info"


def test_timeline_figure_draws_every_lane(tmp_path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    tl = T.build_timeline(four_steps(), T.TraceRef(tmp_path / "t.json", "stock", 1024), n_steps=3)
    fig = T.plot_trace_timeline(tl)
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_yticklabels()] == [T.CPU_LANE, *tl.gpu_lanes]
    assert "stock, 1k context: 3 consecutive decode steps" in ax.get_title()
    assert len([ln for ln in ax.get_lines() if ln.get_linestyle() == "--"]) == 4  # 3 steps: 4 boundaries
    assert ax.get_xlim() == pytest.approx((0.0, 3.0))


def test_a_trace_without_complete_steps_is_summarized_not_drawn(tmp_path: Path) -> None:
    ev = [py("torch/profiler/profiler.py(1128): start", -100, 50), marker(0, 800)]  # one step, the last: partial
    tl = T.build_timeline(ev, T.TraceRef(tmp_path / "t.json", "a", None), n_steps=3)
    assert tl.steps == () and tl.summary["gpu_busy_pct"] is None
    assert "no complete step" in T.summary_line(tl.summary) and T.trace_findings([tl.summary]) == []


def test_find_traces(tmp_path: Path) -> None:
    run = Run.create(tmp_path / "run", arm={"name": "plugin"})
    (run.path / "profiles").mkdir()
    for name in ("named.trace.json.gz", "unnamed.trace.json"):
        (run.path / "profiles" / name).write_text("{}")
    run.append_row("step_profile", {"arm": "stock", "context_tokens": 4096, "trace_file": "named.trace.json.gz",
                                    "marker": "m$", "step": 0})
    run.append_row("step_profile", {"arm": "stock", "context_tokens": 4096, "trace_file": "named.trace.json.gz",
                                    "marker": "m$", "step": 1})
    run.append_row("step_profile", {"arm": "stock", "context_tokens": 8192, "trace_file": "gone.trace.json.gz"})
    refs, missing = T.find_traces(run)
    assert missing == ["gone.trace.json.gz"]
    assert [(r.path.name, r.arm, r.context_tokens, r.marker) for r in refs] == [
        ("unnamed.trace.json", "plugin", None, None), ("named.trace.json.gz", "stock", 4096, "m$")]
    timelines, notes = T.run_timelines(run)
    assert timelines == [] and len(notes) == 3  # the missing one, then two files that are no chrome trace
    assert "gone.trace.json.gz" in notes[0] and all("not drawn" in n for n in notes[1:])
    assert T.find_traces(Run.create(tmp_path / "empty")) == ([], [])


# --- the committed H200 traces (data/reference/sglang-h200-mla2-*-traced) ------------------------------------------
def test_committed_traces_parse_fast_and_match_their_step_rows() -> None:
    t0 = time.perf_counter()
    timelines, notes = T.run_timelines(Run.open(PLUGIN_TRACED), 4)
    assert time.perf_counter() - t0 < 5.0, "two 0.9 MB traces should parse in well under 5 s"
    assert notes == [] and [(t.ref.arm, t.ref.context_tokens) for t in timelines] == [("plugin", 1024),
                                                                                      ("plugin", 131072)]
    long = timelines[1]
    assert long.steps == (0, 1, 2, 3) and len(long.boundaries_ms) == 5
    # the boundaries are the step rows' start_ms (step_profile.jsonl, computed by torch_trace from the same trace)
    recorded = [json.loads(line) for line in (PLUGIN_TRACED / "step_profile.jsonl").read_text().splitlines()]
    starts = [r["start_ms"] for r in recorded if r["context_tokens"] == 131072][:5]
    assert long.boundaries_ms == pytest.approx(starts, abs=1e-6)
    assert {"attn_specdiag_splitkv", "kv_indices", "gemm"} <= set(long.gpu_lanes)
    phases = {p for _, _, p in long.cpu_segments}
    assert {"ngram_draft", "ngram_corpus_update", "target_forward", "sample", "process_result", "schedule"} <= phases


def test_plugin_idles_and_stock_is_busy_at_131072() -> None:
    """Computed from the committed traces: the plugin's 5.14 ms traced step has 0.607 ms of GPU work (11.8 %, most
    of it the split-KV kernel, 0.262 ms); stock's 58.0 ms step has 50.6 ms (87.2 %, SGLang's Triton kernel 50.3)."""
    (plugin,) = [t for t in T.run_timelines(Run.open(PLUGIN_TRACED))[0] if t.ref.context_tokens == 131072]
    (stock,) = T.run_timelines(Run.open(STOCK_TRACED))[0]
    p, s = plugin.summary, stock.summary
    assert p["gpu_busy_pct"] == pytest.approx(11.82, abs=0.1) and p["steps_counted"] == 11
    assert (p["largest_class"], round(p["largest_class_ms"], 3)) == ("attn_specdiag_splitkv", 0.262)
    assert s["gpu_busy_pct"] == pytest.approx(87.2, abs=0.2) and s["steps_counted"] == 11
    assert s["largest_class"] == "attn_sglang_triton" and s["largest_class_ms"] == pytest.approx(50.29, abs=0.05)
    # the run's own sweep (measured, no profiler): 2.38 and 55.82 ms per verify step at 131,072 tokens
    assert p["unprofiled_step_ms"] == pytest.approx(2.38, abs=0.01)
    assert p["gpu_busy_pct_of_unprofiled_step"] == pytest.approx(25.5, abs=0.3)
    assert s["unprofiled_step_ms"] == pytest.approx(55.82, abs=0.01)
    assert s["gpu_busy_pct_of_unprofiled_step"] == pytest.approx(90.7, abs=0.3)
