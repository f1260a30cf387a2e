"""10's pure parts on synthetic rows: arms, the filler's bounds and slot count, the plugin's records read back, fresh
against fragmented with the rank test, the kernel A/B's prediction, and the verdicts' wording from the numbers."""

from __future__ import annotations

import json
import random

import pytest

from specdiag.paths import REFERENCE_DIR
from specdiag.runs import Run
from specdiag.steps.kv_layout import analysis as kla
from specdiag.steps.kv_layout import measure as klm
from specdiag.steps.kv_layout.filler import FillerPlan, pool_allocated, require_loopback, slots_of


def test_filler_bounds_and_slots():
    require_loopback("http://127.0.0.1:30000")
    require_loopback("http://localhost:1")
    with pytest.raises(ValueError, match="loopback"):
        require_loopback("http://gpu-host:30000")
    with pytest.raises(ValueError):
        FillerPlan(prompt_tokens=(10, 5))
    # SGLang allocates a slot per scored token each verify step; without speculation one per token
    assert slots_of({"completion_tokens": 20, "spec_verify_ct": 9}, 40, 8) == 40 + 20 + 8
    assert slots_of({"completion_tokens": 20}, 40, None) == 60
    assert pool_allocated({"internal_states": [{"kv_pool": {"allocated_since_clear": 77}}]}) == 77
    assert pool_allocated({"internal_states": [{}]}) is None


def test_plugin_records_in_the_request_window(tmp_path):
    recs = [{"t_unix_s": 100.0 + i, "batch": 1,
             "requests": [{"prefix_tokens": 1000 + i, "runs": 10 + i, "tokens_in_long_runs": 500, "longest_run": 300}]}
            for i in range(5)]
    (tmp_path / "stats-11.json").write_text(json.dumps({"layout": {"records": recs, "long_run": 64}}))
    (tmp_path / "stats-12.json").write_text("not json")
    best, count = klm.read_plugin_records(tmp_path, 101.0, 103.0)
    assert count == 3 and best.tokens == 1003 and best.runs == 13  # the request's last verify step
    assert klm.read_plugin_records(tmp_path, 200.0, 201.0) == (None, 0)


def _row(arm, state, ctx, rep, share, runs_1k, samples, error=None):
    tokens = ctx + 40
    runs = max(1, round(runs_1k * tokens / 1000))
    return {"arm": arm, "pool_state": state, "context_tokens": ctx, "repeat": rep, "error": error,
            "step_ms": sum(samples) / len(samples), "step_ms_samples": samples,
            "layout": {"tokens": tokens, "runs": runs, "tokens_in_long_runs": round(share * tokens),
                       "longest_run": ctx, "share_in_long_runs": share, "runs_per_1k_tokens": runs_1k},
            "filler": {"cycles": 1.2} if state == "fragmented" else None}


def _samples(center, n=30, seed=0):
    rng = random.Random(seed)
    return [center * (1 + 0.01 * rng.uniform(-1, 1)) for _ in range(n)]


def _reps(arm, state, ctx, share, runs_1k, centers, seed=0):
    """One request per centre (its own step samples around it)."""
    return [_row(arm, state, ctx, i, share, runs_1k, _samples(c, seed=seed + i)) for i, c in enumerate(centers)]


def test_costs_and_findings_from_the_numbers():
    rows = [*_reps("plugin", "fresh", 32768, 0.99, 2, [10.0, 10.05, 9.95], seed=1),
            *_reps("plugin", "fragmented", 32768, 0.02, 300, [10.6, 10.65, 10.55], seed=11),
            *_reps("triton", "fresh", 32768, 0.99, 2, [159.0, 160.0, 158.0], seed=21),
            *_reps("triton", "fragmented", 32768, 0.03, 280, [159.5, 158.5, 160.5], seed=31),
            *_reps("flashinfer", "fresh", 32768, 0.99, 2, [8.0, 8.0, 8.0], seed=41),
            *_reps("flashinfer", "fragmented", 32768, 0.8, 20, [9.0, 9.0, 9.0], seed=51),  # not scattered enough
            {"arm": "broken", "pool_state": None, "error": "ValueError: no pool"}]
    cost = kla.costs(rows)
    by = cost.set_index("arm")
    assert by.loc["plugin", "cost_x"] == pytest.approx(1.06, abs=0.01) and by.loc["plugin", "costs_time"]
    assert by.loc["plugin", "verdict"] == "higher" and 1.0 < by.loc["plugin", "cost_lo_x"] <= 1.06
    assert not by.loc["triton", "costs_time"] and by.loc["triton", "cost_x"] == pytest.approx(1.0, abs=0.01)
    assert by.loc["triton", "verdict"] == "tie" and by.loc["triton", "cost_lo_x"] <= 1.0 <= by.loc["triton", "cost_hi_x"]
    assert not by.loc["flashinfer", "layouts_differ"]
    assert kla.arm_failures(rows) == ["broken: ValueError: no pool"]
    pred = kla.kernel_prediction(Run.open(REFERENCE_DIR / "kernel-ab-h200").rows("kernel_ab"))
    assert set(pred["context_tokens"]) >= {32768, 131072}
    p32 = kla.predicted_at(pred, 32768)
    assert p32[1] == 32768 and 1.0 < p32[0] < 1.2
    found = {f.id: f for f in kla.findings(cost, pred, prediction_source="06 reference")}
    plug = found["kv_layout.plugin"]
    assert "costs time" in plug.verdict and "+6" in plug.verdict and "3 / 3 requests" in plug.verdict
    assert plug.numbers["fix_speedup_x"] == pytest.approx(1.06, abs=0.01)  # a measured fix for 07's diagnosis
    tri = found["kv_layout.triton"]
    assert tri.severity == "ok" and "a tie" in tri.verdict and "no cost above +" in tri.verdict
    assert "3 / 3 requests fresh / fragmented" in tri.evidence[0]
    assert "fix" not in tri.numbers
    assert found["kv_layout.flashinfer.not_fragmented"].severity == "warning"
    pr = found["kv_layout.prediction"]
    assert (pr.severity == "ok") == (by.loc["plugin", "cost_hi_x"] <= p32[0] + 0.02)  # the interval's upper end
    assert pr.numbers["measured_cost_hi_x"] == pytest.approx(by.loc["plugin", "cost_hi_x"])
    assert (pr.severity == "ok") == (1.06 <= p32[0] + 0.02)
    m = kla.metrics(cost, kla.summary(rows))
    assert m["arms"]["plugin"]["32768"]["costs_time"] is True and m["requests"] == 18
    assert m["arms"]["triton"]["32768"]["verdict"] == "tie" and m["arms"]["plugin"]["32768"]["requests_fresh"] == 3


def test_a_cost_needs_3_requests_per_state_and_an_interval_over_requests():
    """The request is the unit: steps of one request are not independent (two make report runs on one 2-core host: fresh
    requests 12.0 and 15.6 ms against fragmented 15.4 and 16.2, measured). Two requests per state: not enough requests;
    three that overlap: a tie; three that separate: a cost with its interval."""
    import dataclasses

    from specdiag.steps.findings.diagnosis import diagnose

    def rows(fresh, frag, ctx=2048):
        return ([_row("embedded", "fresh", ctx, i, 0.98, 6, _samples(c, seed=i)) for i, c in enumerate(fresh)]
                + [_row("embedded", "fragmented", ctx, i, 0.0, 215, _samples(c, seed=9 + i)) for i, c in enumerate(frag)])

    def finding(rs):
        return {x.id: x for x in kla.findings(kla.costs(rs), kla.kernel_prediction([]))}["kv_layout.embedded"]

    two = rows([12.6, 12.2], [16.2, 15.4])  # apart, but two requests a state
    cost = kla.costs(two).iloc[0]
    assert cost["verdict"] == "not enough requests" and not cost["costs_time"] and cost["cost_lo_x"] is None
    f = finding(two)
    assert f.severity == "info" and "not enough requests" in f.verdict and "2 fresh, 2 fragmented" in f.verdict
    assert "fix" not in f.numbers and f.numbers["not_enough_requests"] is True
    d = diagnose([{**dataclasses.asdict(f), "notebook": "10_kv_layout"}])
    assert "not judged: not enough requests" in d.after and not d.numbers.get("fix")
    overlap = rows([12.0, 15.6, 13.0], [15.4, 16.2, 12.5])
    tie = kla.costs(overlap).iloc[0]
    assert tie["verdict"] == "tie" and tie["cost_x"] > 1.02 and not tie["costs_time"]
    f = finding(overlap)
    assert f.severity == "ok" and "a tie" in f.verdict and f"no cost above {100 * (tie['cost_hi_x'] - 1):+.1f}%" in f.verdict
    assert "per request: fresh 12, 15.6, 13 ms, fragmented 15.4, 16.2, 12.5 ms" in f.evidence[0]
    apart = rows([12.6, 12.2, 12.4], [16.2, 15.4, 15.8])
    c = kla.costs(apart).iloc[0]
    assert c["verdict"] == "higher" and c["costs_time"] and 1.0 < c["cost_lo_x"] <= c["cost_x"] <= c["cost_hi_x"]
    f = finding(apart)
    assert "costs time" in f.verdict and f"interval {100 * (c['cost_lo_x'] - 1):+.1f}%" in f.verdict
    # one context that costs beside one that ties: the cost is the verdict
    both = apart + rows([38.7, 34.3, 36.0], [34.2, 72.4, 35.0], ctx=8192)
    mixed = finding(both)
    assert "costs time" in mixed.verdict and mixed.numbers["context_tokens"] == 2048


def test_fresh_requests_come_before_and_after_the_fragmented_ones():
    assert klm.schedule(("fresh", "fragmented"), 2) == [("fresh", 0), ("fragmented", 0), ("fragmented", 1), ("fresh", 1)]
    assert klm.schedule(("fresh", "fragmented"), 3) == [("fresh", 0), ("fresh", 1), ("fragmented", 0),
                                                        ("fragmented", 1), ("fragmented", 2), ("fresh", 2)]
    assert klm.schedule(("fresh", "fragmented"), 1) == [("fresh", 0), ("fragmented", 0)]
    # an order asked for (the H200 job measures fragmented first) is kept
    assert klm.schedule(("fragmented", "fresh"), 2) == [("fragmented", 0), ("fragmented", 1), ("fresh", 0), ("fresh", 1)]


def test_nothing_to_compare():
    rows = [_row("embedded", "fresh", 2048, 0, 0.99, 3, _samples(6.0))]
    found = kla.findings(kla.costs(rows), kla.kernel_prediction([]), missing=kla.gaps(rows))
    assert [f.id for f in found] == ["kv_layout.not_measured", "kv_layout.gaps"]
    assert found[1].numbers["missing"] == ["embedded at 2k: no fragmented request"]
    assert kla.gaps(rows) == [{"arm": "embedded", "context_tokens": 2048, "states": ["fragmented"]}]


def test_gaps_and_an_untested_prediction_are_said():
    pred = kla.kernel_prediction(Run.open(REFERENCE_DIR / "kernel-ab-h200").rows("kernel_ab"))
    rows = [_row("triton", "fresh", 32768, 0, 0.99, 2, _samples(30.0, seed=1)),
            _row("triton", "fragmented", 32768, 0, 0.03, 280, _samples(30.0, seed=2)),
            _row("triton", "fresh", 131072, 0, 0.99, 2, _samples(110.0, seed=3)),
            {**_row("triton", "fragmented", 131072, 0, 0.4, 200, _samples(110.0, seed=4)), "error": "timeout"},
            _row("plugin", "fresh", 131072, 0, 0.99, 2, _samples(4.0, seed=5))]
    assert [kla.gap_text(g) for g in kla.gaps(rows)] == [
        "triton at 128k: no fragmented request", "plugin at 32k: no fresh and no fragmented request",
        "plugin at 128k: no fragmented request"]
    found = {f.id: f for f in kla.findings(kla.costs(rows), pred, missing=kla.gaps(rows))}
    untested = found["kv_layout.prediction"]
    assert untested.severity == "info" and "neither confirmed nor refuted" in untested.verdict
    assert untested.evidence[:2] == ["plugin at 32k: no fresh and no fragmented request",
                                     "plugin at 128k: no fragmented request"]
    # the prediction at the largest context the plugin was asked for (128k), not the kernel A/B's largest
    assert untested.numbers["prediction_context_tokens"] == 131072
    assert untested.numbers["predicted_max_x"] == pytest.approx(kla.predicted_at(pred, 131072)[0])
    # a run with no plugin arm says nothing of the prediction
    assert "kv_layout.prediction" not in {f.id for f in kla.findings(kla.costs(rows[:4]), pred, missing=kla.gaps(rows[:4]))}


def test_a_layout_cost_reaches_07s_diagnosis_as_a_measured_fix():
    """Through the existing mechanism only: the finding's numbers carry fix and fix_speedup_x."""
    import dataclasses

    from specdiag.steps.findings.diagnosis import diagnose

    rows = [*_reps("plugin", "fresh", 131072, 0.99, 2, [10.0, 10.02, 9.98], seed=1),
            *_reps("plugin", "fragmented", 131072, 0.02, 300, [11.0, 11.02, 10.98], seed=11)]
    found = kla.findings(kla.costs(rows), kla.kernel_prediction([]))
    d = diagnose([{**dataclasses.asdict(f), "notebook": "10_kv_layout"} for f in found])
    assert "contiguous KV layout (flushed pool) on plugin" in d.fix and "1.1x faster" in d.fix
    assert "10_kv_layout: kv_layout.plugin" in d.based_on
    assert d.after.startswith("A fragmented KV pool costs plugin +10.") and "contiguous pays" in d.after


def test_07_says_when_the_layout_costs_nothing_or_was_not_scattered():
    import dataclasses

    from specdiag.steps.findings.diagnosis import diagnose

    same = [*_reps("triton", "fresh", 131072, 0.99, 2, [100.0, 100.5, 99.5], seed=1),
            *_reps("triton", "fragmented", 131072, 0.44, 212, [100.2, 99.8, 100.4], seed=11)]
    d = diagnose([{**dataclasses.asdict(f), "notebook": "10_kv_layout"}
                  for f in kla.findings(kla.costs(same), kla.kernel_prediction([]))])
    assert "costs no measurable time on triton" in d.after and not d.numbers.get("fix")
    alike = [_row("plugin", "fresh", 32768, 0, 1.0, 0, _samples(3.5, seed=1)),
             _row("plugin", "fragmented", 32768, 0, 1.0, 0, _samples(4.0, seed=2))]
    d = diagnose([{**dataclasses.asdict(f), "notebook": "10_kv_layout"}
                  for f in kla.findings(kla.costs(alike), kla.kernel_prediction([]))])
    assert "was not judged" in d.after and "costs" not in d.after
    both = same + alike + [_row("plugin", "fresh", 131072, 0, 0.99, 2, _samples(4.0, seed=3))]
    found = kla.findings(kla.costs(both), kla.kernel_prediction([]), missing=kla.gaps(both))
    assert "kv_layout.gaps" in {f.id for f in found}
    d = diagnose([{**dataclasses.asdict(f), "notebook": "10_kv_layout"} for f in found])
    assert d.numbers["kv_layout_arm"] == "triton"  # the gaps finding is no verdict
    assert "on triton" in d.after and "(plugin: no request on a scattered pool to judge)" in d.after


def _three_state_rows(contiguous_center, contiguous_share=0.99, ctx=131072, n=3):
    """plugin: fresh 10 ms, scattered 11 ms (``n`` requests each); plugin_contiguous: its fresh, and after the same
    traffic ``contiguous_center`` ms with ``contiguous_share`` of tokens in long runs."""
    spread = [1.0, 1.005, 0.997][:n]
    return [*_reps("plugin", "fresh", ctx, 0.99, 2, [10.0 * x for x in spread], seed=1),
            *_reps("plugin", "fragmented", ctx, 0.02, 300, [11.0 * x for x in spread], seed=11),
            *_reps("plugin_contiguous", "fresh", ctx, 0.99, 2, [10.0 * x for x in spread], seed=21),
            *_reps("plugin_contiguous", "fragmented", ctx, contiguous_share, 3,
                   [contiguous_center * x for x in spread], seed=31)]


def test_three_states_per_arm_say_whether_the_contiguous_allocator_buys_the_cost_back():
    import dataclasses

    from specdiag.steps.findings.diagnosis import diagnose
    from specdiag.steps.kv_layout import tier0

    assert tier0.pairs(["triton", "plugin", "plugin_contiguous", "flashinfer_contiguous"]) == {
        "plugin": "plugin_contiguous"}
    rows = _three_state_rows(10.02)
    states = tier0.three_states(rows)
    r = states.iloc[0]
    assert (r["arm"], r["contiguous_arm"], r["context_tokens"]) == ("plugin", "plugin_contiguous", 131072)
    assert r["scattered_costs"] and not r["contiguous_costs"] and r["buys_back"]
    assert r["scattered_x"] == pytest.approx(1.1, abs=0.01) and r["contiguous_x"] == pytest.approx(1.0, abs=0.01)
    f = {x.id: x for x in tier0.findings(states)}["kv_layout.tier0.plugin"]
    assert f.severity == "ok" and "buys back" in f.verdict and f.numbers["fix_speedup_x"] == pytest.approx(1.1, abs=0.02)
    assert "99% fresh" in f.evidence[0] and "against its own server's fresh requests" in f.evidence[0]
    assert "{" not in f.evidence[0]
    assert tier0.metrics(states)["plugin"]["131072"]["buys_back"] is True
    # the contiguous arm is judged beside its base arm, not as an arm of its own
    base = {x.id for x in kla.findings(kla.costs(rows), kla.kernel_prediction([]))}
    assert "kv_layout.plugin" in base and not any("plugin_contiguous" in i for i in base)
    found = [*kla.findings(kla.costs(rows), kla.kernel_prediction([])), *tier0.findings(states)]
    d = diagnose([{**dataclasses.asdict(x), "notebook": "10_kv_layout"} for x in found])
    assert "the contiguous KV allocator, buys it back there" in d.after

    assert r["contiguous_against"] == "its own server's fresh requests"
    # a slower server: its own fresh requests are the reference, so the spread between servers is no layout cost
    other = [({**x, "step_ms": x["step_ms"] * 1.3, "step_ms_samples": [v * 1.3 for v in x["step_ms_samples"]]}
              if x["arm"] == "plugin_contiguous" else x) for x in rows]
    r2 = tier0.three_states(other).iloc[0]
    assert r2["buys_back"] and r2["contiguous_x"] == pytest.approx(1.0, abs=0.01)
    assert r2["contiguous_fresh_ms"] == pytest.approx(13.0, rel=0.01)  # against the base arm's it would read 1.3x
    no_own = tier0.three_states([x for x in rows if not (x["arm"] == "plugin_contiguous"
                                                         and x["pool_state"] == "fresh")]).iloc[0]
    assert no_own["contiguous_against"] == "plugin's fresh requests" and no_own["buys_back"]

    slow = tier0.three_states(_three_state_rows(11.0))  # contiguous, yet as slow as scattered: not bought back
    f = tier0.findings(slow)[0]
    assert not slow.iloc[0]["buys_back"] and f.severity == "warning" and "does not buy back" in f.verdict
    assert "fix" not in f.numbers
    loose = tier0.findings(tier0.three_states(_three_state_rows(10.0, contiguous_share=0.3)))[0]
    assert "did not keep the request contiguous" in loose.verdict
    few = tier0.three_states(_three_state_rows(10.02, n=2))  # two requests a state: no verdict
    f = tier0.findings(few)[0]
    assert not few.iloc[0]["buys_back"] and f.severity == "info" and "not enough requests" in f.verdict
    # without a contiguous arm, 07 names the allocator as the next fix
    only = [x for x in rows if x["arm"] == "plugin"]
    d = diagnose([{**dataclasses.asdict(x), "notebook": "10_kv_layout"}
                  for x in kla.findings(kla.costs(only), kla.kernel_prediction([]))])
    assert "The next fix: the contiguous KV allocator" in d.after and "plugin_contiguous" in d.after


def test_the_contiguous_allocator_is_judged_alone_when_the_scattered_state_has_too_few_requests() -> None:
    """Two fresh requests on the base server (no verdict on the layout's cost) and three a state on the contiguous
    arm's own server: the allocator's own cost is judged (an upper bound from the interval), the buy-back is not."""
    from specdiag.steps.kv_layout import tier0

    rows = [x for x in _three_state_rows(10.02) if not (x["arm"] == "plugin" and x["pool_state"] == "fresh"
                                                         and x["repeat"] == 2)]
    states = tier0.three_states(rows)
    r = states.iloc[0]
    assert not r["enough_requests"] and r["contiguous_enough"] and not r["buys_back"]
    f = tier0.findings(states)[0]
    assert f.severity == "info" and f.numbers["not_enough_requests"] and "fix" not in f.numbers
    assert "no cost above +" in f.verdict and "against its own server's fresh requests" in f.verdict
    assert "not enough requests (scattered" in f.verdict and f.numbers["contiguous_hi_x"] > 1.0
    # the same with the contiguous arm slower than its own fresh requests beyond the noise: it costs time
    slow = [({**x, "step_ms": x["step_ms"] * 1.2, "step_ms_samples": [v * 1.2 for v in x["step_ms_samples"]]}
             if x["arm"] == "plugin_contiguous" and x["pool_state"] == "fragmented" else x) for x in rows]
    f = tier0.findings(tier0.three_states(slow))[0]
    assert "it costs time" in f.verdict and "no cost above" not in f.verdict


def test_every_state_and_repeat_decodes_its_own_prompt() -> None:
    """A fragmented request re-decoding the fresh one's prompt let NGRAM recall its answer (commit 7.9 against 1.9 on
    the H200): each state and repeat gets its own prompt seed, the same for every arm."""
    from specdiag.steps.kv_layout.measure import STATES, prompt_seed

    seeds = {prompt_seed(0, state, rep) for state in STATES for rep in range(5)}
    assert len(seeds) == len(STATES) * 5
    assert prompt_seed(0, "fresh", 2) == prompt_seed(0, "fresh", 2)


def test_a_merged_runs_parts_are_separate_requests() -> None:
    """Repeat 0 of two parts (two servers) is two requests; a row written twice in one part is one."""
    from specdiag.steps.kv_layout import analysis as kla

    rows = [{"arm": "plugin", "pool_state": "fresh", "context_tokens": 1024, "repeat": 0, "part": c, "step_ms": ms}
            for c, ms in ((1, 3.0), (1, 3.1), (2, 4.0))]
    got = kla.latest(rows)
    assert sorted(got["step_ms"]) == [3.1, 4.0]


def test_embedded_arms_get_the_smallest_pool_one_filler_serves() -> None:
    """kv_layout's sweep_configure: an embedded arm without max_total_tokens gets the smallest pool on which 10's own
    rule runs the filler once for every fragmented request (one 64-slot step less needs a second run), which always
    holds the longest request; a pool the arm names, and any other engine's arm, are kept."""
    from specdiag.sweep.arms import parse_arms

    arms = parse_arms({"defaults": {"engine": "embedded"}, "arms": [
        {"name": "embedded", "speculation": {"algorithm": "NGRAM", "draft_tokens": 8}},
        {"name": "plain_contiguous", "kv_alloc": "contiguous"},
        {"name": "ngram", "speculation": {"algorithm": "NGRAM"}},
        {"name": "sized", "max_total_tokens": 9000},
        {"name": "sglang", "engine": "sglang", "model": "/m"}]}).arms
    settings = klm.SweepSettings(contexts=(1024,), max_new_tokens=48, repeats=3)
    pools = [klm.sweep_configure(a, settings).max_total_tokens for a in arms]
    plan = settings.plan()
    assert pools == [klm.smallest_pool(plan, 8), klm.smallest_pool(plan, None), klm.smallest_pool(plan, 8), 9000, None]
    for contexts, repeats, tpp in (((1024,), 3, 8), ((2048,), 3, None), ((512, 1024), 2, 4), ((512,), 1, 8)):
        plan = klm.LayoutPlan(contexts=contexts, max_new_tokens=48, repeats=repeats)
        pool, need = klm.smallest_pool(plan, tpp), max(contexts) + 48 * (tpp or 1)
        assert pool % 64 == 0 and pool >= need and klm.fillers_needed(plan, pool, tpp) == 1
        assert pool - 64 < need or klm.fillers_needed(plan, pool - 64, tpp) >= 2
    assert klm.smallest_pool(klm.LayoutPlan(contexts=(1024,), max_new_tokens=48, repeats=3), 8) == 5120


def test_one_filler_serves_every_fragmented_request_when_asked() -> None:
    """filler_once: one filler after each flush however small the pool (the later requests land on the slots the
    earlier ones freed); without it, a pool that holds one request's pieces needs a filler per request. A fresh
    request's flush between fragmented ones calls for a filler again."""
    for once, want in ((True, 1), (False, 3)):
        plan = klm.LayoutPlan(contexts=(131072,), max_new_tokens=64, repeats=3, states=("fragmented",),
                              filler_once=once)
        assert klm.fillers_needed(plan, 140_000, 8) == want
    aba = klm.LayoutPlan(contexts=(131072,), max_new_tokens=64, repeats=3, filler_once=True)
    assert [s for s, _ in klm.schedule(aba.states, aba.repeats)] == ["fresh", "fresh", "fragmented", "fragmented",
                                                                     "fragmented", "fresh"]
    assert klm.fillers_needed(aba, 140_000, 8) == 1
    assert klm.filler_due(aba, filled=False, ahead=10**9, need=1) is True
    assert klm.filler_due(aba, filled=True, ahead=0, need=10**6) is False
    settings = klm.SweepSettings(filler_once=True, states=("fragmented",))
    assert settings.plan().filler_once is True
