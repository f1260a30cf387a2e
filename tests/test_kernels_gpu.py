"""GPU tests of every kernel A/B arm and the timing method (run on the device machine: ``make test-gpu``)."""

from __future__ import annotations

import pytest
import torch

from specdiag.kernels.mla import VerifyShape, dequantized, make_inputs, with_fp8_cache
from specdiag.kernels.reference import reference_verify, relative_error
from specdiag.steps.kernel_ab.arms import ARMS, cannot_run, prepare
from specdiag.steps.kernel_ab.timing import FLUSH_L2_MULTIPLE, L2Flush, time_copy, time_replays

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

#: odd shapes: contexts off the 64-token grid, rows that are not a tile multiple, trees and chains, several row tiles
SHAPES = [
    VerifyShape(4096, 8, 8, "shuffled_p1"),
    VerifyShape(3001, 16, 1, "shuffled_p1"),
    VerifyShape(5000, 3, 5, "shuffled_p1"),
    VerifyShape(20000, 128, 8, "shuffled_p1"),
    VerifyShape(777, 8, 2, "shuffled_p1"),
    VerifyShape(5000, 8, 8, "shuffled_b64"),
]
OURS = tuple(n for n, a in ARMS.items() if a.family != "anchor")


def _inputs(shape: VerifyShape, chain: bool = False):
    x = with_fp8_cache(make_inputs(shape, device="cuda", seed=shape.context_tokens, chain=chain))
    return x, {"bf16": reference_verify(x), "fp8": reference_verify(dequantized(x))}


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"P{s.context_tokens}-H{s.heads}-T{s.draft_tokens}-{s.layout}")
def test_every_arm_matches_the_reference_twice_in_a_row(shape: VerifyShape) -> None:
    """Each arm that can run the case (its layout, its rows): within 1e-2 of the fp32 reference of the cache it reads
    and every output written, on two calls of the same prepared call (state left by the first would show)."""
    x, refs = _inputs(shape)
    ran = []
    for name in OURS:
        a = ARMS[name]
        if a.layout != shape.layout or cannot_run(a, x):
            continue
        out = x.out_like()
        call = prepare(a, x, out)
        for attempt in range(2):
            out.fill_(float("nan"))
            call()
            torch.cuda.synchronize()
            err = relative_error(out, refs[a.kv])
            assert not out.isnan().any() and err <= 1e-2, (name, attempt, err)
        ran.append(name)
    assert ran, "no arm ran this case"


def test_the_anchors_run_chain_cases_where_installed() -> None:
    x, refs = _inputs(VerifyShape(4096, 8, 4, "shuffled_p1"), chain=True)
    for name in ("flashinfer_mla", "sglang_splitkv"):
        a = ARMS[name]
        try:
            out = x.out_like()
            prepare(a, x, out)()
        except (ImportError, FileNotFoundError) as exc:
            pytest.skip(f"{name} is not installed here: {exc}")
        torch.cuda.synchronize()
        assert relative_error(out, refs["bf16"]) <= 1e-2, name


@pytest.mark.parametrize("name", ["pick", "plugin", "plugin_fp8", "plugin_triton", "split_triton"])
def test_a_captured_graph_replays_what_the_eager_call_computes(name: str) -> None:
    """The timing method replays a CUDA graph of the call: the graph must hold the kernels (not a stale result), so a
    replay after the inputs change computes the new answer."""
    x, refs = _inputs(VerifyShape(9000, 8, 8, "shuffled_p1"))
    a = ARMS[name]
    out = x.out_like()
    call = prepare(a, x, out)
    call()
    g = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        call()
    torch.cuda.current_stream().wait_stream(s)
    with torch.cuda.graph(g):
        call()
    x.q.mul_(-1.0)  # new queries in place: the graph reads them
    ref = reference_verify(dequantized(x) if a.kv == "fp8" else x)
    out.fill_(float("nan"))
    g.replay()
    torch.cuda.synchronize()
    assert relative_error(out, ref) <= 1e-2


def test_timing_replays_graphs_behind_a_read_only_l2_flush() -> None:
    flush = L2Flush(torch.device("cuda"))
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    assert flush.bytes_read >= FLUSH_L2_MULTIPLE * l2
    x, _ = _inputs(VerifyShape(65536, 8, 1, "shuffled_p1"))
    t = time_replays(prepare(ARMS["pick"], x, x.out_like()), flush, n_runs=10)
    assert t.method == "graph" and len(t.samples_ms) == 10 and all(s > 0 for s in t.samples_ms)
    c = time_copy(65537 * 1152, flush, n_runs=10)
    assert c.method == "graph" and 0 < c.summary["ms_median"] < t.summary["ms_median"] * 10


def test_the_harness_measures_a_small_case_into_rows(tmp_path) -> None:
    from specdiag.runs import Run
    from specdiag.steps.kernel_ab.harness import COPY_TABLE, TABLE, measure

    run = Run.create(tmp_path / "ab", label="t")
    n = measure(run, [(8192, 8, 1)], ["baseline", "pick", "plugin", "pick_fp8"], "cuda", n_runs=5)
    rows = {r["arm"]: r for r in run.rows(TABLE)}
    assert n == 4 and set(rows) == {"baseline", "pick", "plugin", "pick_fp8"}
    for r in rows.values():
        assert r["correct"] and r["method"] == "graph" and r["over_copy"] > 0, r
    assert {r["kv"] for r in run.rows(COPY_TABLE)} == {"bf16", "fp8"}
    assert run.meta["peaks"]["copy_gbps"] > 100 and run.meta["device"]["gpu"]
