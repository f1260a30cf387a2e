"""09's analysis on synthetic engine_ab rows: own and flagged TTFTs, overlaps, the rank test, the band verdict, the
targets (met, missed, not measurable) and the findings in 07's shape; the arm lists 09 measures."""

from __future__ import annotations

import json
import statistics

import pandas as pd
import pytest

from specdiag.geometry import from_hf_config
from specdiag.hardware import HardwarePeaks, Peak
from specdiag.steps.engine_ab import analysis, verdicts

K1, K64, K128 = 1024, 65536, 131072


def row(arm: str, phase: str, ctx: int, ts: float, e2e: float | None = 1.0, *, repeat: int = 0, step_ms: float | None = None,
        ttft_s: float | None = None, concurrent: int = 1, cached: int = 0, commit: float = 1.0,
        error: str | None = None) -> dict:
    return {"arm": arm, "phase": phase, "context_tokens": ctx, "repeat": repeat, "ts_unix_s": ts, "e2e_s": e2e,
            "step_ms": step_ms, "ttft_s": ttft_s if ttft_s is not None else (None if error else 0.1),
            "concurrent": concurrent, "cached_tokens": cached, "commit_length": commit,
            "decode_tok_s": 1000.0 * commit / step_ms if step_ms else None, "error": error,
            "prefill_tok_s": ctx / ttft_s if ttft_s else None}


def decode_rows(arm: str, ms: dict[int, list[float]], t0: float) -> list[dict]:
    """Decode rows one after another from t0, 1 s apart; the first request commits 1.0, the later 7.5."""
    out, t = [], t0
    for ctx, samples in ms.items():
        for i, v in enumerate(samples):
            out.append(row(arm, "decode", ctx, t, 0.5, repeat=i, step_ms=v, commit=1.0 if i == 0 else 7.5,
                           cached=ctx - 1))
            t += 1.0
    return out


def h200_61_layer_run() -> list[dict]:
    """The issue's H200 numbers at 61 layers, measured one arm at a time: Triton, Triton + plugin, FlashInfer."""
    rows = [row("triton", "prefill", K1, 0, 1.0, ttft_s=0.9), row("triton", "prefill", K64, 2, 37.0, ttft_s=36.7),
            row("triton", "prefill", K128, 40, 151.0, ttft_s=150.8)]
    rows += decode_rows("triton", {K1: [19.7, 19.5, 20.1], K64: [841, 838, 850], K128: [1657, 1650, 1662, 1657]}, 200)
    rows += [row("triton_plugin", "prefill", K1, 300, 1.0, ttft_s=0.9), row("triton_plugin", "prefill", K64, 302, 37.0,
                                                                               ttft_s=36.5)]
    rows += decode_rows("triton_plugin", {K1: [6.75, 6.8, 6.7], K64: [8.52, 8.6, 8.5], K128: [9.72, 9.8, 9.7, 9.72]}, 400)
    rows += [row("flashinfer", "prefill", K1, 500, 0.2, ttft_s=0.15), row("flashinfer", "prefill", K64, 502, 2.0,
                                                                          ttft_s=1.84)]
    rows += decode_rows("flashinfer", {K1: [6.58, 6.6, 6.5], K64: [11.4, 11.5, 11.3]}, 600)
    return rows


ARMS_META = {"triton": {"what": "Triton as shipped", "server": {"chunked_prefill_size": 8192,
                                                                "max_total_num_tokens": 1_250_000,
                                                                "mem_fraction_static": 0.6}},
             "triton_plugin": {"what": "Triton + the plugin", "plugin": "splitkv",
                               "server": {"chunked_prefill_size": 8192, "max_total_num_tokens": 1_250_000}},
             "flashinfer": {"what": "FlashInfer", "server": {"chunked_prefill_size": 8192}}}


def tables(rows: list[dict]):
    df = analysis.frame(rows)
    return df, analysis.decode_table(df), analysis.prefill_table(df)


def test_overlaps_from_send_times_and_durations() -> None:
    rows = [row("a", "prefill", K1, 0.0, 10.0), row("b", "prefill", K1, 5.0, 1.0), row("b", "prefill", K64, 20.0, 1.0),
            row("a", "prefill", K64, 30.0, None, error="dropped"),  # no duration: in flight until the rows after it
            row("b", "decode", K1, 40.0, 1.0, step_ms=5.0)]
    assert analysis.overlaps(rows) == [["b"], ["a"], [], [], []]
    late = rows[:4] + [row("b", "decode", K1, 40.0, 1.0, step_ms=5.0), row("a", "prefill", K128, 35.0, None,
                                                                          error="dropped")]
    # the second failed row is written after b's decode ended: it was in flight through it
    assert analysis.overlaps(late)[4] == ["a"]


def test_decode_medians_commit_lengths_and_cleanliness() -> None:
    df, dec, _ = tables(h200_61_layer_run())
    t = dec[(dec["arm"] == "triton") & (dec["context_tokens"] == K128)].iloc[0]
    assert t["step_ms"] == 1657 and t["n"] == 4 and t["step_ms_samples"] == [1657, 1650, 1662, 1657]
    assert t["commit_first"] == 1.0 and t["commit_later"] == 7.5 and bool(t["clean"])
    assert t["decode_tok_s_first"] == pytest.approx(1000 / 1657)
    assert set(dec["arm"]) == {"triton", "triton_plugin", "flashinfer"} and bool(dec["clean"].all())


def test_ttfts_measured_beside_other_arms_are_flagged_not_own() -> None:
    rows = [row("triton", "prefill", K64, 0, 100.0, ttft_s=101.8, concurrent=2),
            row("fi", "prefill", K64, 1, 5.0, ttft_s=5.09, concurrent=2),
            row("fi", "prefill", K64, 200, 2.0, ttft_s=1.84),  # a clean prefill alone, later: the one used
            row("fi", "prefill", K1, 300, 0.1, ttft_s=0.05, cached=1000)]  # served from the cache: no whole prefill
    df, _, pre = tables(rows)
    tr = pre[pre["arm"] == "triton"].iloc[0]
    assert not tr["own"] and "concurrent 2" in tr["why_not_own"] and tr["ttft_s"] == 101.8
    fi = pre[(pre["arm"] == "fi") & (pre["context_tokens"] == K64)].iloc[0]
    assert fi["own"] and fi["ttft_s"] == 1.84 and fi["n"] == 1
    cached = pre[(pre["arm"] == "fi") & (pre["context_tokens"] == K1)].iloc[0]
    assert not cached["own"] and "from the cache" in cached["why_not_own"]
    gaps = analysis.lacks(df, ["triton", "fi"])
    assert any(g.startswith("triton: no decode row") for g in gaps)
    assert any(g.startswith("triton: TTFT not its own at 64k") for g in gaps)


def test_rank_test_per_context() -> None:
    _, dec, _ = tables(h200_61_layer_run())
    rt = analysis.rank_tests(dec)
    at128 = rt[rt["context_tokens"] == K128]
    assert list(at128["fastest"]) == ["triton_plugin"] and list(at128["other"]) == ["triton"]
    r = at128.iloc[0]
    assert r["verdict"] == "slower" and r["p_slower"] == pytest.approx(1 / 70)  # 4 against 4, all apart: 1 / C(8, 4)
    assert r["ratio_x"] == pytest.approx(1657 / 9.72)
    at1k = rt[rt["context_tokens"] == K1].set_index("other")
    assert at1k.index.tolist() == ["triton", "triton_plugin"] and set(at1k["fastest"]) == {"flashinfer"}
    # 3 against 3 can never pass alpha 0.05 (the smallest p is 1 / C(6, 3) = 0.05): said, not claimed
    assert at1k.loc["triton_plugin", "verdict"] == "indistinguishable"
    one = analysis.rank_tests(analysis.decode_table(analysis.frame(
        decode_rows("a", {K1: [5.0]}, 0) + decode_rows("b", {K1: [6.0, 6.1]}, 10))))
    assert one.iloc[0]["verdict"].startswith("not testable")


def test_the_fastest_arm_per_band_and_its_cost() -> None:
    _, dec, pre = tables(h200_61_layer_run())
    bands = analysis.band_verdicts(dec, pre, ARMS_META, [8192, 65536]).set_index("band")
    short = bands.loc["up to 8k"]
    assert short["fastest"] == "flashinfer" and short["runner_up"] == "triton_plugin"
    assert short["by_x"] == pytest.approx(6.75 / 6.58)
    mid = bands.loc["8k to 64k"]
    assert mid["fastest"] == "triton_plugin" and mid["by_x"] == pytest.approx(11.4 / 8.52)
    # its cost: its TTFT at 64k (36.5 s) against the shortest there (FlashInfer's 1.84 s)
    assert mid["ttft_s"] == 36.5 and mid["ttft_vs_best_x"] == pytest.approx(36.5 / 1.84) and bool(mid["ttft_own"])
    assert mid["kv_pool_tokens"] == 1_250_000 and "36.5 s" in mid["verdict"]
    long = bands.loc["above 64k"]
    assert long["fastest"] == "triton_plugin" and long["by_x"] == pytest.approx(1657 / 9.72)
    only = analysis.band_verdicts(dec[dec["arm"] == "flashinfer"], pre, ARMS_META, [8192])
    assert only["fastest"].isna().all() and only.iloc[0]["verdict"].startswith("not comparable: only flashinfer")


def test_targets_met_missed_and_not_measurable() -> None:
    rows = h200_61_layer_run()
    _, dec, pre = tables(rows)
    arms = ["triton", "triton_plugin", "flashinfer"]
    # FlashInfer did not decode at 128k here: the best arm there cannot be named
    tt = analysis.targets(dec, pre, arms, 61).set_index("target_id")
    assert tt.loc["plugin_vs_triton_128k", "status"] == "met"
    assert tt.loc["plugin_vs_triton_128k", "value"] == pytest.approx(1657 / 9.72)
    assert tt.loc["best_decode_128k_vs_1k", "status"] == "not measurable"
    assert "no decode at 128k for flashinfer" in tt.loc["best_decode_128k_vs_1k", "why"]
    # one prefill a side: the value, no interval, not counted as met
    assert tt.loc["best_ttft_64k_vs_triton", "status"] == "no interval"
    assert tt.loc["best_ttft_64k_vs_triton", "arm"] == "flashinfer"
    assert tt.loc["best_ttft_64k_vs_triton", "value"] == pytest.approx(36.7 / 1.84)
    assert "not enough prefills" in tt.loc["best_ttft_64k_vs_triton", "why"]
    # three prefills a side (repeats 0, 1, 2 of fresh prompts): judged on its interval
    more = rows + [row(a, "prefill", K64, 700 + 10 * i + (5 if a == "triton" else 0), 1.0, repeat=i, ttft_s=t)
                   for i in (1, 2) for a, t in (("triton", 36.6 + 0.1 * i), ("flashinfer", 1.8 + 0.02 * i))]
    _, dec_m, pre_m = tables(more)
    t3 = analysis.targets(dec_m, pre_m, arms, 61).set_index("target_id").loc["best_ttft_64k_vs_triton"]
    assert t3["status"] == "met" and t3["lo"] >= 10 and t3["rule"] == "one machine"
    # two arms only: the best at 128k is the plugin, 6.75 / 9.72 = 0.69 of its 1k decode: met
    two = analysis.targets(dec[dec["arm"] != "flashinfer"], pre, ["triton", "triton_plugin"], 61).set_index("target_id")
    assert two.loc["best_decode_128k_vs_1k", "status"] == "met"
    assert two.loc["best_decode_128k_vs_1k", "value"] == pytest.approx(6.75 / 9.72)
    # a slower plugin misses the 100x; a 2-layer model cannot judge the 61-layer target
    slow = [dict(r, step_ms=20.0) if r["arm"] == "triton_plugin" and r["context_tokens"] == K128 and r["phase"] == "decode"
            else r for r in rows]
    _, dec_s, pre_s = tables(slow)
    miss = analysis.targets(dec_s, pre_s, arms, 61).set_index("target_id").loc["plugin_vs_triton_128k"]
    assert miss["status"] == "missed" and miss["value"] == pytest.approx(1657 / 20)
    shallow = analysis.targets(dec, pre, arms, 2).set_index("target_id").loc["plugin_vs_triton_128k"]
    assert shallow["status"] == "not measurable" and "2 layers" in shallow["why"]
    # Triton's 64k TTFT measured beside another arm's prefill is not its own: not measurable
    side = [dict(r, concurrent=2) if r["arm"] == "triton" and r["phase"] == "prefill" else r for r in rows]
    _, dec_c, pre_c = tables(side)
    t3 = analysis.targets(dec_c, pre_c, arms, 61).set_index("target_id").loc["best_ttft_64k_vs_triton"]
    assert t3["status"] == "not measurable" and "not its own" in t3["why"] and "concurrent 2" in t3["why"]


def test_findings_carry_each_collapse_and_its_measured_fix() -> None:
    from specdiag.paths import PROJECT_ROOT

    df, dec, pre = tables(h200_61_layer_run())
    cfg = json.loads((PROJECT_ROOT / "data/reference/sglang-h200-mla61-engine-ab/config.json").read_text())
    peaks = HardwarePeaks("NVIDIA H200", Peak(4.8e12, "table", ""), Peak(989.4e12, "table", ""))
    floors, own = verdicts.prefill_floors(pre, from_hf_config(cfg), peaks, ARMS_META)
    assert set(own) == {"triton", "triton_plugin", "flashinfer"}
    bands = analysis.band_verdicts(dec, pre, ARMS_META, [8192, 65536])
    tt = analysis.targets(dec, pre, list(ARMS_META), 61)
    found = {f.id: f for f in verdicts.findings(dec, pre, own, bands, tt, analysis.lacks(df, list(ARMS_META)),
                                                ARMS_META)}
    fix = found["engine_ab.decode_fix"].numbers
    assert fix["fix_phase"] == "decode" and fix["fix_context_tokens"] == K128
    assert fix["fix_speedup_x"] == pytest.approx(1657 / 9.72) and "plugin" in fix["fix"]
    pf = found["engine_ab.prefill_fix"].numbers
    assert pf["fix_phase"] == "prefill" and pf["fixed_arm"] == "flashinfer" and pf["fix_context_tokens"] == K64
    assert pf["fix_speedup_x"] == pytest.approx(36.7 / 1.84)
    floor = found["engine_ab.prefill_floor"]
    assert floor.numbers["arm"] == "triton" and floor.numbers["context_tokens"] == K128 and floor.severity == "critical"
    assert floor.numbers["ttft_over_floor_x"] == pytest.approx(150.8 / floor.numbers["floor_s"])
    assert found["engine_ab.stock_decode"].numbers["step_growth_x"] == pytest.approx(1657 / 19.7)
    # the shape 07 reads: both collapses and both fixes reach the diagnosis
    from dataclasses import asdict

    from specdiag.steps.findings.diagnosis import diagnose

    d = diagnose([{**asdict(f), "notebook": "09_engine_ab"} for f in found.values()])
    assert d.slow.startswith("A verify step of triton takes 1,657 ms at 128k tokens")
    assert d.prefill.startswith("Prefill is a second collapse") and "on triton" in d.prefill
    assert "makes it 170x faster at 128k tokens" in d.fix and "For prefill, flashinfer's prefill" in d.fix
    m = verdicts.metrics(dec, pre, floors, bands, tt, [], list(ARMS_META))
    json.dumps(m, allow_nan=False)  # a JSON file, no NaN
    assert m["step_ms"]["triton"][str(K128)] == 1657 and m["targets"]["plugin_vs_triton_128k"]["status"] == "met"
    assert m["ttft_own"]["triton"][str(K64)] is True


def test_the_answer_weighs_the_first_token_against_decode_by_output_length() -> None:
    """One arm prefills sooner, the other decodes faster: run the first below the output length where the two finish
    together, the second above; with 3 prefills a side that length has a range over the requests, with one 'not
    enough prefills'; one arm ahead in both phases is 'run X'; 07's diagnosis says what 09 says."""
    from dataclasses import asdict

    from specdiag.steps.engine_ab import answer
    from specdiag.steps.findings.diagnosis import diagnose

    rows = [row("fi", "prefill", K1, 0, 0.1, ttft_s=0.1), row("hybrid", "prefill", K1, 100, 0.1, ttft_s=0.1)]
    rows += [row("fi", "prefill", K128, 10 + i, 0.5, repeat=i, ttft_s=5.0 + 0.1 * i) for i in range(3)]
    rows += [row("hybrid", "prefill", K128, 110 + 20 * i, 16.0, repeat=i, ttft_s=16.0 + 0.1 * i) for i in range(3)]
    rows += [dict(r, commit_length=3.0, decode_tok_s=3000.0 / r["step_ms"]) for r in
             decode_rows("fi", {K1: [6.0, 6.1, 6.2], K128: [13.5, 13.4, 13.6]}, 50)
             + decode_rows("hybrid", {K1: [6.8, 6.7, 6.9], K128: [8.9, 9.0, 8.8]}, 200)]
    df, dec, pre = tables(rows)
    (a,) = answer.answers(df, dec, pre, {})  # 1k: each arm's first request is its server's first: not its own TTFT
    assert (a.kind, a.first, a.decode, a.context_tokens) == ("split", "fi", "hybrid", K128)
    r_fi, r_hy = 3000 / 13.5, 3000 / 8.9
    assert a.tokens == pytest.approx((16.1 - 5.1) / (1 / r_fi - 1 / r_hy))
    lo, hi = a.tokens_range
    assert lo < a.tokens < hi and a.ttft_verdict == "higher" and a.rate_verdict == "higher"
    f = answer.answer_finding([a])
    assert f.title == (f"At 128k, run fi for outputs under about {a.tokens:,.0f} tokens (range {lo:,.0f}-{hi:,.0f} over "
                       "the requests), hybrid above")
    d = diagnose([{**asdict(f), "notebook": "09_engine_ab"}])
    assert f.title in d.recommend and "What to run" in d.recommend
    # one prefill a side: the length has no range, and the page says why
    one = [r for r in rows if not (r["phase"] == "prefill" and r["repeat"] > 0)]
    (b,) = answer.answers(*tables(one), {})
    assert b.tokens_range is None and "not enough prefills (1 / 1" in b.text
    # one arm first in both phases: run it
    same = [dict(r, ttft_s=1.0) if r["arm"] == "hybrid" and r["phase"] == "prefill" and r["context_tokens"] == K128
            else r for r in rows]
    (c,) = answer.answers(*tables(same), {})
    assert (c.kind, c.first) == ("one", "hybrid") and answer.headline([c]) == "Run hybrid at 128k"
    # acceptance forced: said beside every number computed from it
    forced = answer.answers(df, dec, pre, {"hybrid": {"env": {"SGLANG_SIMULATE_ACC_LEN": "4"}}})
    assert "acceptance forced" in forced[0].text and answer.headline(forced).endswith("(acceptance forced)")


def test_ngram_arms_decode_at_their_pooled_commit_and_a_tie_in_both_phases_is_a_tie() -> None:
    """NGRAM commits are the text's: two NGRAM arms whose 3 requests commit 2.5, 7.5 and 5 tokens a step are weighed at
    their pooled commit over their own step times, so the arm 1.6x faster per step decodes faster (measured tokens/s
    would call it a tie); arms that tie in both phases are a tie, not a split where each is picked by the other's
    tie-break (what the measured rates gave on the H200's NGRAM run at 185k)."""
    from specdiag.steps.engine_ab import answer
    from specdiag.spread import Sample

    commits = [2.5, 7.5, 5.0]
    rows = [row(a, "prefill", K128, base + i, 9.7, repeat=i, ttft_s=9.7 + 0.05 * i)
            for a, base in (("fi", 10), ("hybrid", 110)) for i in range(3)]
    dec = [dict(r, commit_length=c, decode_tok_s=c * 1000.0 / r["step_ms"]) for a, steps, base in
           (("fi", [16.9, 26.0, 17.3], 50), ("hybrid", [10.9, 11.0, 10.7], 200))
           for r, c in zip(decode_rows(a, {K128: steps}, base), commits)]
    ngram = {"configured": {"speculation": {"algorithm": "NGRAM"}}}
    meta = {"fi": ngram, "hybrid": ngram}
    (a,) = answer.answers(*tables(rows + dec), meta)
    assert (a.kind, a.first) == ("one", "hybrid") and "pooled median commit, 5 tokens a step" in a.text
    # without the algorithm the measured rates stand: 96 to 577 tokens/s a side
    (m,) = answer.answers(*tables(rows + dec), {})
    assert m.rate_source["hybrid"] == "measured" and m.rate_verdict in ("tie", "not enough")
    # each side ties: a tie in both phases whichever arm each tie-break picks
    fi = answer.Phases("fi", [Sample(9.66), Sample(9.60), Sample(10.05)], [Sample(x) for x in (288.0, 147.0, 288.0)],
                       "measured")
    hy = answer.Phases("hybrid", [Sample(9.78), Sample(9.81), Sample(9.72)], [Sample(x) for x in (229.0, 683.0, 469.0)],
                       "measured")
    t = answer.answer_at(185000, [fi, hy])
    assert t is not None and t.kind == "tie" and t.tokens is None
    assert answer.headline([t]) == "At 185k, hybrid and fi tie in both phases: either"


def test_the_61_layer_reference_run_is_read_as_measured() -> None:
    """data/reference/sglang-h200-mla61-engine-ab (three parts joined by specdiag merge): the tables are the
    rows' medians, the first request of each server is flagged and no other, every decode ran alone, and the targets
    are the ratios of those medians."""
    from specdiag.paths import REFERENCE_DIR
    from specdiag.runs import Run

    run = Run.open(REFERENCE_DIR / "sglang-h200-mla61-engine-ab")
    rows = run.rows("engine_ab")
    df, dec, pre = tables(rows)

    def med(arm: str, ctx: int) -> float:
        return statistics.median(r["step_ms"] for r in rows if r["arm"] == arm and r["phase"] == "decode"
                                 and r["context_tokens"] == ctx)

    cell = dec.set_index(["arm", "context_tokens"])
    for arm in ("triton", "triton_plugin", "flashinfer", "fi_prefill_plugin"):
        assert cell.loc[(arm, K128), "step_ms"] == med(arm, K128)
    assert dec["clean"].all()  # one arm at a time: no decode shared the GPU
    servers = {(r["part"], r["arm"]) for r in rows}
    firsts = [(r.part, r.arm) for r in df[df["first_on_server"]].itertuples()]
    assert sorted(firsts) == sorted(servers)  # exactly one per server (an arm in two parts had two)
    flagged = pre[~pre["own"]]
    assert set(flagged["why_not_own"]) == {"the run's first request to this server (it may carry one-time kernel "
                                           "compilation)"}
    assert {a: run.meta["arms"][a]["parts"] for a in ("triton", "triton_plugin")} == {"triton": [1, 3],
                                                                                     "triton_plugin": [2, 3]}
    spec = [a for a in analysis.arm_order(df, run.meta["arms"]) if not a.endswith("_nospec")]  # the verify arms
    dec, pre = dec[dec["arm"].isin(spec)], pre[pre["arm"].isin(spec)]
    tt = analysis.targets(dec, pre, spec, 61).set_index("target_id")
    assert tt.loc["plugin_vs_triton_128k", "value"] == pytest.approx(med("triton", K128) / med("triton_plugin", K128))
    best = min(("triton", "triton_plugin", "flashinfer", "fi_prefill_plugin"), key=lambda a: med(a, K128))
    assert tt.loc["best_decode_128k_vs_1k", "arm"] == best
    assert tt.loc["best_decode_128k_vs_1k", "value"] == pytest.approx(med(best, K1) / med(best, K128))
    ttft = {r["arm"]: r["ttft_s"] for r in rows if r["phase"] == "prefill" and r["context_tokens"] == K64
            and r["arm"] in spec}
    assert tt.loc["best_ttft_64k_vs_triton", "value"] == pytest.approx(ttft["triton"] / min(
        v for a, v in ttft.items() if a != "triton"))
    assert "triton (part 3): the call reached its time limit" in " ".join(run.meta["not_run"])


def test_a_prefill_is_predicted_only_from_a_context_near_enough() -> None:
    """A 1k TTFT scaled quadratically to 64k predicted 706 s for a 37 s prefill on the H200 and kept the context from
    running, and a server's first 1k request (8.2 s with its warm-up) predicted 2,105 s at 16k: at 16x its known
    context or more nothing is predicted (the context is started); within it, the quadratic scaling of the longest
    shorter context."""
    from specdiag.steps.engine_ab.measure import predicted

    rows = [{"context_tokens": 1024, "ttft_s": 0.172}, {"context_tokens": 16384, "ttft_s": 1.67}]
    assert predicted(rows[:1], "ttft_s", 65536, 2.0) is None
    assert predicted([{"context_tokens": 1024, "ttft_s": 8.22}], "ttft_s", 16384, 2.0) is None
    assert predicted(rows[:1], "ttft_s", 8192, 2.0) == pytest.approx(0.172 * 64)
    assert predicted(rows, "ttft_s", 131072, 2.0) == pytest.approx(1.67 * 64)
    assert predicted(rows, "ttft_s", 1024, 2.0) is None


def test_an_arm_with_forced_acceptance_says_its_commits_are_the_simulations() -> None:
    from specdiag.steps.engine_ab.arms import acceptance_text, forced_acceptance

    forced = {"env": {"SGLANG_SIMULATE_ACC_LEN": "4.0", "SPECDIAG_SGLANG_VERIFY": "off"}}
    assert forced_acceptance(forced) == 4.0 and "forced to 4" in acceptance_text(forced)
    assert forced_acceptance({"env": {}}) is None and acceptance_text({}) == "the drafter's own"
    assert forced_acceptance({"env": {"SGLANG_SIMULATE_ACC_LEN": "-1"}}) is None  # SGLang's default: off


def test_single_request_ttfts_inside_the_noise_are_a_tie_not_a_fix() -> None:
    """The DFLASH run's 64k TTFTs (36.76 s plugin, 36.74 s stock, one request each) were read as a prefill 'fix' of
    0.999x: within 5% of each other they are a tie, and the answer breaks it by decode."""
    import pandas as pd

    from specdiag.spread import Sample
    from specdiag.steps.engine_ab import answer

    pre = pd.DataFrame([{"arm": "triton", "context_tokens": 65536, "ttft_s": 36.74, "own": True},
                        {"arm": "triton_plugin", "context_tokens": 65536, "ttft_s": 36.76, "own": True}])
    fix = verdicts.prefill_fix(pre, {}, "triton")
    assert fix.numbers["tie"] and "fix" not in fix.numbers and "a tie" in fix.title
    stock = answer.Phases("triton", [Sample(36.74)], [Sample(x) for x in (5.5, 5.6, 5.4)], "measured")
    plug = answer.Phases("triton_plugin", [Sample(36.76)], [Sample(x) for x in (530.0, 540.0, 520.0)], "measured")
    a = answer.answer_at(65536, [stock, plug])
    assert (a.kind, a.first) == ("one", "triton_plugin") and "not enough prefills" in a.ttft_text


def test_the_answers_output_length_has_the_range_of_its_requests() -> None:
    """Extra TTFT over the time saved per token, at the requests' extremes; a pair that saves nothing: never."""
    from specdiag.spread import Sample
    from specdiag.steps.engine_ab import answer

    first = answer.Phases("fi", [Sample(x) for x in (10.0, 11.0)], [Sample(x) for x in (100.0, 125.0)], "measured")
    fast = answer.Phases("hy", [Sample(x) for x in (20.0, 21.0)], [Sample(x) for x in (200.0, 250.0)], "measured")
    lo, hi = answer.tokens_range(first, fast)
    assert lo == pytest.approx(9.0 / (1 / 100 - 1 / 250)) and hi == pytest.approx(11.0 / (1 / 125 - 1 / 200))
    slow = answer.Phases("hy", fast.ttft, [Sample(x) for x in (110.0, 250.0)], "measured")
    assert answer.tokens_range(first, slow)[1] == float("inf")


def test_the_scorecard_judges_every_arm_on_every_target_by_its_interval() -> None:
    """The DFLASH run at 61 layers: the plugin clears 100x over stock at 128k by its interval's lower end even with
    the spread between the two servers' machines counted; FlashInfer misses 0.60 on 1k/128k; one prefill a side is no
    interval, so no arm meets all three; a value whose interval holds the target is inside the noise. The targets read
    the same card (one judge)."""
    from specdiag.paths import REFERENCE_DIR
    from specdiag.runs import Run
    from specdiag.stats import compare_requests

    run = Run.open(REFERENCE_DIR / "sglang-h200-mla61-dflash")
    df = analysis.frame(run.rows("engine_ab"))
    dec, pre = analysis.decode_table(df), analysis.prefill_table(df)
    card = analysis.scorecard(dec, pre, ["triton_plugin", "triton", "flashinfer"]).set_index("arm")
    plug = card.loc["triton_plugin"]
    spread = analysis.step_spreads(dec)[K128].x
    assert plug["speedup_status"] == "met" and plug["speedup_lo"] / spread >= 100
    assert plug["speedup_rule"].startswith("several machines")
    assert card.loc["flashinfer", "keep_status"] == "missed" and card.loc["flashinfer", "keep_hi"] < 0.60
    assert card.loc["flashinfer", "keep_rule"] == "one machine"  # its 1k and 128k both on part 4's machine
    assert card.loc["triton", "ttft_status"].startswith("no interval (1 / 1 prefills: not enough prefills)")
    assert not card["all_met"].any()
    tt = analysis.targets(dec, pre, ["triton", "triton_plugin", "flashinfer"], 61, card=card.reset_index())
    assert set(tt["status"]) <= set(analysis.STATUSES)
    assert tt.set_index("target_id").loc["plugin_vs_triton_128k", "status"] == plug["speedup_status"]
    noisy = compare_requests([10.0, 11.0, 12.0], [6.5, 7.0, 7.5])  # 0.58-0.75: holds 0.60
    assert analysis._judge(noisy, 0.60, "") == "inside the noise"
    few = compare_requests([10.0], [6.2])
    assert analysis._judge(few, 0.60, "1 / 1 requests") == "no interval (1 / 1 requests)"
    assert analysis._judge(None, 0.60, "") == "not measured"


def test_the_best_arm_at_128k_leaves_out_check_arms_and_drafter_variants() -> None:
    """An arm missing at 128k keeps the best arm from being named unless it cannot be the best: a check arm (each
    verify call also runs SGLang's kernel) or one that verifies as an arm decoded there (the same decode backend,
    plugin, algorithm and tokens per step: only its drafter's window differs). The row says what it left out."""
    rows = h200_61_layer_run()
    _, dec, pre = tables(rows)
    arms = ["triton", "triton_plugin"]
    srv = {"attention_backend": "triton", "speculative_algorithm": "DFLASH", "speculative_dflash_block_size": 8}
    meta = {"triton": {"server": srv}, "triton_plugin": {"server": srv, "plugin": "splitkv"},
            "check": {"server": srv, "plugin": "splitkv", "env": {"SPECDIAG_SGLANG_CHECK": "1"}},
            "nowindow": {"server": {**srv, "speculative_draft_window_size": None}, "plugin": "splitkv"},
            "fi": {"server": {**srv, "attention_backend": "flashinfer"}}}
    one_k = dec[(dec["arm"] == "triton_plugin") & (dec["context_tokens"] == K1)]
    extra = pd.concat([one_k.assign(arm=a) for a in ("check", "nowindow", "fi")])
    dec2 = pd.concat([dec[dec["arm"].isin(arms)], extra])
    tt = analysis.targets(dec2, pre, [*arms, "check", "nowindow"], 61, arms_meta=meta).set_index("target_id")
    row = tt.loc["best_decode_128k_vs_1k"]
    assert row["status"] == "met" and row["arm"] == "triton_plugin"
    assert "check, a check arm" in row["why"] and "nowindow, verifies as triton_plugin does" in row["why"]
    # another backend missing at 128k could be the best there: not named
    tt = analysis.targets(dec2, pre, [*arms, "check", "nowindow", "fi"], 61, arms_meta=meta).set_index("target_id")
    assert tt.loc["best_decode_128k_vs_1k", "status"] == "not measurable"
    assert "no decode at 128k for fi" in tt.loc["best_decode_128k_vs_1k", "why"]
    # without the arms' records nothing is left out
    tt = analysis.targets(dec2, pre, [*arms, "nowindow"], 61).set_index("target_id")
    assert tt.loc["best_decode_128k_vs_1k", "status"] == "not measurable"


def test_the_band_pick_consults_the_requests() -> None:
    """Each band's fastest arm is set against its runner-up over requests at every context of the band: clearly apart,
    "faster at every context"; overlapping, a tie said as one (and the finding's title says tie); two requests, not
    enough to pick."""
    rows = h200_61_layer_run()
    _, dec, pre = tables(rows)
    bands = analysis.band_verdicts(dec, pre, ARMS_META, [8192, 65536]).set_index("band")
    assert bands.loc["8k to 64k", "against_runner_up"].startswith("faster at every context: 64k 1.34x")
    assert "90% interval 1.31-1.35x, 3 / 3 requests; one machine" in bands.loc["8k to 64k", "verdict"]
    near = [dict(r, step_ms=v) if r["arm"] == "triton_plugin" and r["context_tokens"] == K1
            and r["phase"] == "decode" else r for r, v in zip(rows, [6.4, 6.9, 6.6] * len(rows))]
    near = [r if r["arm"] != "triton_plugin" or r["context_tokens"] != K1 or r["phase"] != "decode" else
            dict(r, step_ms={0: 6.4, 1: 6.9, 2: 6.6}[r["repeat"]]) for r in rows]
    _, dec_n, pre_n = tables(near)
    short = analysis.band_verdicts(dec_n, pre_n, ARMS_META, [8192, 65536]).iloc[0]
    assert short["against_runner_up"].startswith("tie inside the requests' noise")
    assert short["verdict"].startswith("flashinfer and triton_plugin tie")
    f = verdicts.verdict_finding(analysis.band_verdicts(dec_n, pre_n, ARMS_META, [8192]))
    assert f is not None and f.title == "At the longest band, triton_plugin verifies fastest"
    one_k = dec_n[dec_n["context_tokens"] == K1]
    f = verdicts.verdict_finding(analysis.band_verdicts(one_k, pre_n, ARMS_META, [8192]))
    assert f is not None and f.title == "At the longest band, flashinfer and triton_plugin verify alike (a tie)"
    few = [r for r in rows if not (r["arm"] == "flashinfer" and r["context_tokens"] == K64 and r["repeat"] == 2)]
    mid = analysis.band_verdicts(*tables(few)[1:], ARMS_META, [8192, 65536]).set_index("band").loc["8k to 64k"]
    assert mid["against_runner_up"].startswith("not enough requests")


def _decode(arm: str, part: int, ms: list[float], ctx: int = K1) -> list[dict]:
    return [{"arm": arm, "phase": "decode", "context_tokens": ctx, "repeat": i, "part": part, "step_ms": v,
             "decode_tok_s": 700.0, "commit_length": 3.5, "cached_tokens": 1000} for i, v in enumerate(ms)]


def test_requests_of_several_servers_keep_their_spread() -> None:
    """A merged run: arm a on four servers (parts 1-4, 5.0-6.2 ms), arm b on a fifth. Their requests' interval clears
    1, but not the spread between a's servers: a tie inside that spread. Where both arms have 3 requests on one
    machine, those are compared and the spread is not needed. Apart by more than the spread: faster."""
    rows = []
    for part, ms in ((1, [5.0, 5.05, 4.95]), (2, [6.0, 6.1, 5.9]), (3, [6.2, 6.1, 6.3]), (4, [5.9, 6.0, 6.05])):
        rows += _decode("a", part, ms)
    rows += _decode("b", 5, [4.6, 4.62, 4.58])

    def dec_of(rs: list[dict]) -> pd.DataFrame:
        return analysis.decode_table(pd.DataFrame(rs).assign(error=None, overlapped_by=[[]] * len(rs)))

    dec = dec_of(rows)
    assert dec.set_index("arm").loc["a", "server_step_ms"] == {"1": 5.0, "2": 6.0, "3": 6.2, "4": 6.0}
    spread = analysis.step_spreads(dec)[K1]
    assert spread.x == pytest.approx(6.2 / 5.0) and "a at 1k: 4 servers 5-6.2 ms" in spread.where
    band = analysis.band_verdicts(dec, pd.DataFrame(), {}, [8192]).iloc[0]
    assert band["fastest"] == "b" and band["against_runner_up"].startswith("tie inside the spread between servers")
    k = analysis.compare_cells(dec, "b", "a", K1)
    assert k.request_verdict == "higher" and k.verdict == "tie" and k.spread_x == pytest.approx(spread.x)
    assert "several machines: a difference must clear the spread between servers, 1.24x" in band["verdict"]
    # b also measured on part 2's machine: those requests compared, no spread needed
    shared = dec_of(rows + [dict(r, part=2, repeat=r["repeat"] + 3) for r in _decode("b", 2, [4.6, 4.62, 4.58])])
    k = analysis.compare_cells(shared, "b", "a", K1)
    assert k.verdict == "higher" and k.rule.startswith("one machine (part 2) measured both: its 3 / 3 requests")
    apart = dec_of([{**r, "step_ms": r["step_ms"] * (0.5 if r["arm"] == "b" else 1)} for r in rows])
    assert analysis.band_verdicts(apart, pd.DataFrame(), {}, [8192]).iloc[0]["against_runner_up"].startswith("faster")
    # a run of one part is one machine: its requests are compared as they are
    one = dec_of([dict(r, part=None) for r in rows if r["part"] in (1, 5)])
    assert analysis.compare_cells(one, "b", "a", K1).rule == "one machine"


def test_the_settings_table_says_off_for_an_arm_without_speculation() -> None:
    """09's settings row "speculation": the server's algorithm and tokens per step, "off" for an arm that runs without
    (its server reports no algorithm), nothing for a server that said nothing; never "None, None tokens per step"."""
    from specdiag.steps.engine_ab.arms import settings_rows

    meta = {"ngram": {"server": {"speculative_algorithm": "NGRAM", "speculative_num_draft_tokens": 8}},
            "off": {"server": {"speculative_algorithm": None, "speculative_num_draft_tokens": None}},
            "quiet": {"server": {}}}
    row = next(r for r in settings_rows(meta, list(meta)) if r["setting"] == "speculation")
    assert (row["ngram"], row["off"], row["quiet"]) == ("NGRAM, 8 tokens per step", "off", None)


def test_a_configuration_is_held_against_flashinfer_at_both_the_first_token_and_the_verify_step() -> None:
    """sglang-h100-mla61-prefill (one machine, 3 prefills and 3 requests a cell): the hybrid meets all three targets
    against FlashInfer on their intervals (TTFT at most 1.1x at 64k and 128k, a verify step at most 0.85x at 128k);
    pure Triton with the plugin's MHA prefill misses both TTFT targets (its interval's lower end above 1.1x); an arm
    with one prefill has no interval; an "at most" target whose interval holds its limit is inside the noise."""
    from specdiag.paths import REFERENCE_DIR
    from specdiag.runs import Run
    from specdiag.stats import compare_requests
    from specdiag.steps.engine_ab import verdicts

    run = Run.open(REFERENCE_DIR / "sglang-h100-mla61-prefill")
    df = analysis.frame(run.rows("engine_ab"))
    dec, pre = analysis.decode_table(df), analysis.prefill_table(df)
    card = analysis.anchor_card(dec, pre, ["fi_hybrid_plugin", "triton_plugin_prefill", "triton_plugin_prefill_check",
                                           "flashinfer"]).set_index("arm")
    assert "flashinfer" not in card.index
    hy, tp = card.loc["fi_hybrid_plugin"], card.loc["triton_plugin_prefill"]
    assert hy["all_met"] and hy["ttft_vs_anchor_128k_hi"] <= 1.1 and hy["verify_vs_anchor_128k_hi"] <= 0.85
    assert hy["ttft_vs_anchor_128k_rule"] == "one machine"
    assert tp["ttft_vs_anchor_64k_status"] == tp["ttft_vs_anchor_128k_status"] == "missed"
    assert tp["ttft_vs_anchor_128k_lo"] > 1.1 and tp["verify_vs_anchor_128k_status"] == "met" and not tp["all_met"]
    assert card.loc["triton_plugin_prefill_check", "ttft_vs_anchor_64k_status"].startswith("no interval (1 / 3 prefills")
    assert analysis._judge_at_most(compare_requests([10.0, 11.0, 12.0], [10.5, 11.0, 12.5]), 1.1, "") == \
        "inside the noise"
    f = verdicts.anchor_finding(card.reset_index())
    assert f.numbers["all_met_arms"] == ["fi_hybrid_plugin"] and f.title.startswith("fi_hybrid_plugin is as fast")
    assert analysis.anchor_card(dec[dec["arm"] != "flashinfer"], pre[pre["arm"] != "flashinfer"], ["x"]).empty
