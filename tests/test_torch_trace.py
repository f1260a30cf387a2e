"""specdiag.telemetry.torch_trace: step windows and per-step breakdowns of torch profiler traces.

Synthetic traces (hand-built events with known answers) and one real trace recorded here with
torch.profiler on the CPU (with_stack=True, functions named like SGLang's in files named like SGLang's).
"""

from __future__ import annotations

import gzip
import importlib.util
import json
import time
from pathlib import Path
from typing import Any

import pytest

from specdiag.telemetry import torch_trace as T
from specdiag.telemetry.intervals import shared_by_label_us, union_us

NGRAM = "sglang/srt/speculative/ngram_worker.py"
_ids = iter(range(1, 10**6))


def py(name: str, ts: float, dur: float, parent: int | None = None, pyid: int | None = None, tid: int = 1) -> dict[str, Any]:
    return {"ph": "X", "cat": "python_function", "name": name, "pid": 1, "tid": tid, "ts": ts, "dur": dur,
            "args": {"Python parent id": parent, "Python id": next(_ids) if pyid is None else pyid}}


def launch(ts: float, corr: int, name: str = "cudaLaunchKernel", cat: str = "cuda_runtime") -> dict[str, Any]:
    return {"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": 1, "ts": ts, "dur": 5.0, "args": {"correlation": corr}}


def gpu(name: str, ts: float, dur: float, corr: int | None, cat: str = "kernel", stream: int = 7) -> dict[str, Any]:
    args = {} if corr is None else {"correlation": corr}
    return {"ph": "X", "cat": cat, "name": name, "pid": 0, "tid": stream, "ts": ts, "dur": dur, "args": args}


def marker(ts: float, dur: float, **kw: Any) -> dict[str, Any]:
    return py(f"{NGRAM}(403): forward_batch_generation", ts, dur, **kw)


def three_steps() -> list[dict[str, Any]]:
    """Markers at 0, 1000, 2000 µs (800 µs each). Known answers in test_known_breakdown."""
    ev = [py("torch/profiler/profiler.py(1128): start", -100, 50), marker(0, 800), marker(1000, 800), marker(2000, 800)]
    # step 0: two overlapping kernels on two streams, 200-500 (attention) and 400-700 (GEMM)
    ev += [launch(100, 1), gpu("_ragged_partial_kernel", 200, 300, 1, stream=7),
           launch(150, 2), gpu("nvjet_tst_128x256_64x4_1x2_h_bz_coopB_TNT", 400, 300, 2, stream=8)]
    # step 0: a CUDA graph replay whose two kernels share the graph launch's correlation id (within 700-760)
    ev += [launch(690, 3, name="cudaGraphLaunch"), gpu("rmsnorm_kernel", 700, 20, 3), gpu("_fwd_kernel", 720, 40, 3)]
    # step 1: a kernel launched at 1900 that runs 1950-2300, into step 2's window
    ev += [launch(1900, 4, name="cuLaunchKernelEx", cat="cuda_driver"), gpu("_fwd_kernel", 1950, 350, 4)]
    # step 2 (last): a memcpy 2300-2400 and a kernel found through flow events only (no correlation arg)
    ev += [launch(2100, 5, name="cudaMemcpyAsync"), gpu("Memcpy HtoD (Pinned -> Device)", 2300, 100, 5, cat="gpu_memcpy")]
    ev += [{"ph": "s", "id": 6, "pid": 1, "tid": 1, "ts": 2200.0, "cat": "ac2g", "name": "ac2g"},
           {"ph": "f", "id": 6, "pid": 0, "tid": 7, "ts": 2850.0, "cat": "ac2g", "name": "ac2g", "bp": "e"},
           gpu("some_unknown_kernel", 2850, 50, None)]
    # nested CPU phases in step 0: draft prep inside spec prep, a recursive draft prep inside it
    ev += [py(f"{NGRAM}(295): _prepare_for_speculative_decoding", 10, 290),
           py(f"{NGRAM}(237): _prepare_draft_tokens", 20, 180), py(f"{NGRAM}(237): _prepare_draft_tokens", 50, 50),
           py(f"{NGRAM}(377): _update_ngram_corpus", 600, 50), py(f"{NGRAM}(377): _update_ngram_corpus", 700, 20),
           py("sglang/srt/managers/scheduler_components/batch_result_processor.py(802): process_batch_result_decode",
              850, 100)]
    return ev


def test_known_breakdown() -> None:
    rows = T.step_breakdown(three_steps())
    assert [r["step"] for r in rows] == [0, 1, 2]
    r0, r1, r2 = rows
    assert r0["marker_name"].endswith("forward_batch_generation") and "ngram_worker" in r0["marker"]
    assert (r0["partial"], r1["partial"], r2["partial"]) == (False, False, True)
    assert "last step" in r2["note"]
    # step 0: busy = union 200-700 and 700-760 = 560 µs; overlap 400-500 shared equally
    assert r0["wall_ms"] == pytest.approx(1.0)
    assert r0["gpu_busy_ms"] == pytest.approx(0.56)
    assert r0["gpu_idle_ms"] == pytest.approx(0.44)
    assert r0["gpu_attn_specdiag_splitkv_ms"] == pytest.approx(0.25)
    assert r0["gpu_gemm_ms"] == pytest.approx(0.25)
    assert r0["gpu_norm_ms"] == pytest.approx(0.02)
    assert r0["gpu_attn_sglang_triton_ms"] == pytest.approx(0.04)
    assert r0["graph_launches"] == 1 and r0["gpu_ops"] == 4
    assert sum(v for k, v in r0.items() if k.startswith("gpu_") and k.endswith("_ms")
               and k not in ("gpu_busy_ms", "gpu_idle_ms", "gpu_idle_in_window_ms")) == pytest.approx(r0["gpu_busy_ms"])
    # nested phases: outermost only (180 µs, not 230); two separate calls add up (70 µs)
    assert r0["cpu_ngram_prepare_ms"] == pytest.approx(0.29)
    assert r0["cpu_ngram_draft_ms"] == pytest.approx(0.18)
    assert r0["cpu_ngram_corpus_update_ms"] == pytest.approx(0.07)
    assert r0["cpu_process_result_ms"] == pytest.approx(0.10)
    assert r0["verify_step"] and not r1["verify_step"]
    # step 1: its kernel is launched in it (driver launch) and runs 350 µs, 50 of them inside step 1's window
    assert r1["gpu_busy_ms"] == pytest.approx(0.35)
    assert r1["gpu_idle_ms"] == pytest.approx(0.65)
    assert r1["gpu_idle_in_window_ms"] == pytest.approx(0.95)
    assert r1["gpu_attn_sglang_triton_ms"] == pytest.approx(0.35)
    # step 2: ends at the end of its last GPU op (2900), not at its marker's end (2800)
    assert r2["wall_ms"] == pytest.approx(0.9)
    assert r2["gpu_memcpy_ms"] == pytest.approx(0.1)
    assert r2["gpu_other_ms"] == pytest.approx(0.05)  # found through the flow events, launched at 2200
    assert r2["gpu_idle_in_window_ms"] == pytest.approx(0.9 - 0.3 - 0.1 - 0.05)  # step 1's kernel ran 2000-2300


def test_summarize_leaves_partial_steps_out() -> None:
    rows = T.step_breakdown(three_steps())
    s = T.summarize(rows)
    assert s["steps"] == 2 and len(s["steps_excluded"]) == 1 and "step 2" in s["steps_excluded"][0]
    assert s["median"]["wall_ms"] == pytest.approx(1.0)
    assert s["median"]["gpu_busy_ms"] == pytest.approx((0.56 + 0.35) / 2)
    assert "cpu_ngram_draft_ms" in s["cpu_phases_seen"] and "cpu_sample_ms" not in s["cpu_phases_seen"]
    assert T.summarize(rows, include_partial=True)["steps"] == 3
    only = T.summarize(rows, verify_only=True)  # step 1 ran no draft preparation
    assert only["steps"] == 1 and only["steps_found"] == 3 and "step 1: not a verify step" in only["steps_excluded"]
    assert only["median"]["wall_ms"] == pytest.approx(1.0) and only["median"]["gpu_busy_ms"] == pytest.approx(0.56)
    text = T.format_summary(s, T.top_kernels(three_steps()))
    assert "attn_specdiag_splitkv" in text and "not in trace" in text and "_fwd_kernel" in text


def test_first_step_partial_when_marker_was_on_the_stack() -> None:
    ev = [py("sglang/srt/managers/scheduler.py(1716): event_loop_overlap", 0, 5000, pyid=1),
          marker(1, 900, parent=1, pyid=2),
          py("sglang/srt/managers/scheduler_components/profiler_manager.py(155): _start_profile", 2, 100, parent=2, pyid=3),
          py("torch/profiler/profiler.py(1128): start", 3, 90, parent=3, pyid=4),
          marker(1000, 900, parent=1, pyid=5), marker(2000, 900, parent=1, pyid=6), marker(3000, 900, parent=1, pyid=7)]
    rows = T.step_breakdown(ev)
    assert [r["partial"] for r in rows] == [True, False, False, True]
    assert "already running when the profiler started" in rows[0]["note"]
    # a marker that starts after profiler.start returned is complete, even right at the trace start
    ev2 = [py("torch/profiler/profiler.py(1128): start", 0, 1, pyid=100), marker(2, 500, pyid=101), marker(600, 500, pyid=102)]
    assert [r["partial"] for r in T.step_breakdown(ev2)] == [False, True]
    # no profiler.start call in the trace: a first marker within ON_STACK_TOLERANCE_US of the first event
    ev3 = [py("x.py(1): loop", 0, 3000), marker(10, 500), marker(1000, 500), marker(2000, 500)]
    assert [r["partial"] for r in T.step_breakdown(ev3)] == [True, False, True]
    ev3[1]["ts"] = 10 + T.ON_STACK_TOLERANCE_US
    assert [r["partial"] for r in T.step_breakdown(ev3)] == [False, False, True]


def test_fallback_marker_and_explicit_marker() -> None:
    ev = [py("sglang/srt/managers/scheduler.py(3528): run_batch", t, 400) for t in (100, 600, 1100)]
    rows = T.step_breakdown(ev)
    assert rows[0]["marker"] == T.tt.DEFAULT_MARKERS[1] and len(rows) == 3
    assert [r["wall_ms"] for r in rows[:2]] == pytest.approx([0.5, 0.5])
    rows = T.step_breakdown(three_steps() + ev, marker=r"run_batch$")
    assert len(rows) == 3 and rows[0]["marker"] == "run_batch$"


def test_plugin_ngram_tail_counts_as_the_ngram_phases() -> None:
    """specdiag's plugin runs its own prepare_draft_tokens / update_ngram_corpus in place of NGRAM's methods."""
    tail = "specdiag_sglang_plugin/ngram_tail.py"
    ev = [marker(0, 900), marker(1000, 900), marker(2000, 900),
          py("sglang/srt/plugins/hook_registry.py(300): wrapper", 10, 100), py(f"{tail}(69): prepare_draft_tokens", 20, 60),
          py(f"{tail}(94): update_ngram_corpus", 500, 40)]
    r0, r1, _ = T.step_breakdown(ev)
    assert r0["verify_step"] and not r1["verify_step"]
    assert r0["cpu_ngram_draft_ms"] == pytest.approx(0.06) and r0["cpu_ngram_corpus_update_ms"] == pytest.approx(0.04)


def test_nested_markers_count_once() -> None:
    ev = [marker(0, 900), marker(10, 100), marker(1000, 900), marker(2000, 900)]
    assert len(T.step_breakdown(ev)) == 3


def test_missing_marker_is_a_clear_error() -> None:
    ev = [py("sglang/srt/managers/scheduler.py(3814): process_batch_result", 0, 10)]
    with pytest.raises(T.TraceError, match="--marker"):
        T.step_breakdown(ev)
    with pytest.raises(T.TraceError, match="with_stack=True"):
        T.step_breakdown([gpu("k", 0, 1, None), {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 0, "dur": 1}])


def test_union_and_split() -> None:
    assert union_us([(0, 10), (5, 20), (30, 40), (40, 41), (3, 3)]) == pytest.approx(31)
    split = shared_by_label_us([(0, 10, "x"), (0, 10, "y"), (5, 20, "x"), (30, 30, "z")])
    assert sum(split.values()) == pytest.approx(20)
    assert split["y"] == pytest.approx(5 / 2 + 5 / 3) and "z" not in split
    assert T.classify("void at::native::vectorized_elementwise_kernel<4>", "kernel") == "elementwise"
    assert T.classify("create_flashinfer_kv_indices_triton", "kernel") == "kv_indices"
    assert T.classify("_verify_prefix_stage1", "kernel") == "attn_sglang_verify_splitkv"
    assert T.classify("_ragged_merge_kernel", "kernel") == "attn_specdiag_splitkv"
    assert T.classify("merge_state_kernel", "kernel") == "attn_sglang_triton"
    assert T.classify("Memset (Device)", "gpu_memset") == "memset"
    assert T.classify("triton_red_fused_add_rms_norm_0", "kernel") == "norm"
    assert T.classify("triton_poi_fused_mul_0", "kernel") == "elementwise"
    assert T.classify("ncclDevKernel_AllReduce_Sum_bf16_RING_LL", "kernel") == "comm"
    assert T.classify("something_new", "kernel") == "other"


def test_load_trace_formats_and_errors(tmp_path: Path) -> None:
    doc = {"schemaVersion": 1, "traceEvents": three_steps()}
    (tmp_path / "a.trace.json").write_text(json.dumps(doc))
    (tmp_path / "a.trace.json.gz").write_bytes(gzip.compress(json.dumps(doc).encode()))
    assert T.load_trace(tmp_path / "a.trace.json") == T.load_trace(tmp_path / "a.trace.json.gz") == doc["traceEvents"]
    (tmp_path / "bad.json").write_text("not json")
    with pytest.raises(T.TraceError, match="not a JSON"):
        T.load_trace(tmp_path / "bad.json")
    (tmp_path / "obj.json").write_text(json.dumps({"rows": []}))
    with pytest.raises(T.TraceError, match="traceEvents"):
        T.load_trace(tmp_path / "obj.json")
    (tmp_path / "other.json").write_text(json.dumps({"traceEvents": [{"ph": "X", "cat": "v8", "name": "x", "ts": 1}]}))
    with pytest.raises(T.TraceError, match="no torch profiler events"):
        T.load_trace(tmp_path / "other.json")


def test_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "t.trace.json.gz"
    path.write_bytes(gzip.compress(json.dumps({"traceEvents": three_steps()}).encode()))
    assert T.main([str(path), "--json", str(tmp_path / "out.json")]) == 0
    out = capsys.readouterr().out
    assert "steps found: 3; counted: 2" in out and "attn_specdiag_splitkv" in out
    saved = json.loads((tmp_path / "out.json").read_text())
    assert saved["summary"]["steps"] == 2 and len(saved["rows"]) == 3
    assert T.main([str(path), "--marker", "no_such_function$"]) == 2
    assert "no Python call in the trace matches" in capsys.readouterr().err


# --- a real trace, recorded here ----------------------------------------------------------------------
FAKE_SGLANG = {
    "sglang/srt/speculative/ngram_worker.py": '''
import time
from sglang_fake_tp_worker import forward_batch_generation as target_forward

class NGRAMWorker:
    def _prepare_draft_tokens(self):
        time.sleep(0.003)

    def _prepare_for_speculative_decoding(self):
        self._prepare_draft_tokens()

    def _update_ngram_corpus(self):
        time.sleep(0.001)

    def forward_batch_generation(self):
        self._prepare_for_speculative_decoding()
        target_forward()
        self._update_ngram_corpus()
''',
    "sglang/srt/managers/tp_worker.py": '''
import time
def forward_batch_generation():
    time.sleep(0.002)
''',
    "sglang/srt/managers/scheduler.py": '''
import time
def process_batch_result():
    time.sleep(0.001)

def run_batch(worker, profiler=None):
    if profiler is not None:
        profiler.start()  # as SGLang's _profile_batch_predicate does, inside run_batch
    worker.forward_batch_generation()

def event_loop(worker, profiler, steps):
    for i in range(steps):
        run_batch(worker, profiler if i == 0 else None)
        process_batch_result()
''',
}


def _load(path: Path, name: str) -> Any:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    import sys

    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def test_real_cpu_trace(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    for rel, code in FAKE_SGLANG.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(code)
    _load(tmp_path / "sglang/srt/managers/tp_worker.py", "sglang_fake_tp_worker")
    ngram = _load(tmp_path / "sglang/srt/speculative/ngram_worker.py", "sglang_fake_ngram_worker")
    sched = _load(tmp_path / "sglang/srt/managers/scheduler.py", "sglang_fake_scheduler")
    prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], with_stack=True)
    steps = 6
    t0 = time.perf_counter()
    sched.event_loop(ngram.NGRAMWorker(), prof, steps)
    loop_s = time.perf_counter() - t0
    prof.stop()
    path = tmp_path / "1700000000-TP-0.trace.json.gz"
    prof.export_chrome_trace(str(path))

    events = T.load_trace(path)
    rows = T.step_breakdown(events)
    assert len(rows) == steps, [r["marker_name"] for r in rows]
    assert "ngram_worker.py" in rows[0]["marker_name"]
    assert [r["partial"] for r in rows] == [False] * (steps - 1) + [True]
    assert all(r["verify_step"] for r in rows)
    s = T.summarize(rows)
    assert s["steps"] == steps - 1
    med = s["median"]
    # the sleeps are lower bounds; a step is draft 3 + target 2 + corpus 1 + result 1 ms = 7 ms at least
    assert 3.0 <= med["cpu_ngram_draft_ms"] <= med["cpu_ngram_prepare_ms"] < med["marker_ms"]
    assert 2.0 <= med["cpu_target_forward_ms"] < med["marker_ms"]
    assert 1.0 <= med["cpu_ngram_corpus_update_ms"] and 1.0 <= med["cpu_process_result_ms"]
    assert 7.0 <= med["wall_ms"] <= loop_s * 1e3
    assert med["gpu_busy_ms"] == 0 and med["gpu_idle_ms"] == pytest.approx(med["wall_ms"])
    # with the scheduler's run_batch as marker, the first call was running when the profiler started
    rb = T.step_breakdown(events, marker=r"scheduler\.py\(\d+\): run_batch$")
    assert len(rb) == steps and rb[0]["partial"] and "already running" in rb[0]["note"]
    assert not any(r["partial"] for r in rb[1:-1])
