"""09_engine_ab executed: replaying the H200 61-layer run (what the page shows, what it says the run lacks), and
live against two embedded arms started one after another (a tiny ladder)."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

from specdiag.paths import REFERENCE_DIR
from specdiag.runs import Run

REF = "data/reference/sglang-h200-mla61-engine-ab"


def _result(tmp_path: Path) -> dict:
    return json.loads((tmp_path / "run" / "findings" / "09_engine_ab.json").read_text())


@pytest.mark.notebook
def test_09_replays_the_61_layer_run(run_notebook, tmp_path) -> None:
    """No parameter: the H200 61-layer reference run, its numbers the rows' medians, its targets judged, the trade
    between the fastest decode and the fastest prefill weighed, the one-time first requests flagged."""
    out = run_notebook("09_engine_ab")
    res = _result(tmp_path)
    assert res["recorded_from"] == REF  # no parameter: the reference run, kept apart by 07
    m = res["metrics"]
    rows = Run.open(REFERENCE_DIR / "sglang-h200-mla61-engine-ab").rows("engine_ab")

    def med(arm: str, ctx: int) -> float:
        return statistics.median(r["step_ms"] for r in rows if r["arm"] == arm and r["phase"] == "decode"
                                 and r["context_tokens"] == ctx)

    for arm in ("triton", "triton_plugin", "flashinfer", "fi_prefill_plugin"):
        for ctx in (1024, 65536, 131072):
            assert m["step_ms"][arm][str(ctx)] == pytest.approx(med(arm, ctx))
    assert "185000" not in m["step_ms"]["triton"]  # its prefill there was predicted past the call's budget
    assert m["ttft_own"]["flashinfer"]["1024"] is False and m["ttft_own"]["flashinfer"]["65536"] is True
    t1 = m["targets"]["plugin_vs_triton_128k"]
    assert t1["value"] == pytest.approx(med("triton", 131072) / med("triton_plugin", 131072))
    # stock Triton decoded 128k once (a 1.6 s step): one request, no interval, not counted as met
    assert t1["status"] == "no interval" and "5 / 1 requests" in t1["why"]  # the plugin's / stock's
    assert [r["arm"] for r in m["scorecard"] if r["all_met"]] == []
    ids = {f["id"]: f for f in res["findings"]}
    assert {"engine_ab.decode_fix", "engine_ab.prefill_fix", "engine_ab.prefill_floor", "engine_ab.answer"} <= set(ids)
    assert ids["engine_ab.prefill_floor"]["numbers"]["arm"] == "triton"
    assert m["answer"] == ids["engine_ab.answer"]["title"] and list(m)[0] == "answer"  # the index shows it first
    page = out.read_text()
    assert "start to ready (s)" in page and "one-time kernel compilation" in page and m["answer"] in page
    assert "x its floor" in page and "NVIDIA H200" in page and "recorded run" in page and ">nan<" not in page.lower()
    # the speculation-off twins (merged from the DFLASH parts): NGRAM's later requests recalled the first's answer,
    # so beside each measured line a line at the first request's commit, and the title reads those
    lines = {(x["arm"], x["kind"], x["source"]): x for x in m["break_even"]["lines"]}
    assert {x["recalled"] for k, x in lines.items() if k[2] == "measured"} == {True}
    first = {a: x for (a, kind, src), x in lines.items() if kind == "first request" and src == "computed"}
    assert set(first) == {"triton", "triton_plugin", "flashinfer", "fi_prefill_plugin"}
    assert first["triton"]["outcome"] == "never pays" and first["triton_plugin"]["outcome"] == "starts"
    assert "triton never pays" in ids["engine_ab.break_even"]["title"]
    assert "recalled the first's answer" in ids["engine_ab.break_even"]["verdict"]


@pytest.mark.notebook
def test_09_and_07_replay_the_vllm_cpu_break_even(run_notebook, tmp_path) -> None:
    """The vLLM-CPU run (data/reference/vllm-cpu-breakeven): its servers' records pair both speculating arms with the
    speculation-off arm; 09 states a measured line per arm and text kind, each the one the rows give, and plots them;
    07's diagnosis ends with every line's recommendation."""
    from specdiag.steps.engine_ab import breakeven
    from specdiag.steps.engine_ab.verdicts import recommendation

    name = "vllm-cpu-breakeven"
    out = run_notebook("09_engine_ab", replay_dir=str(REFERENCE_DIR / name))
    run = Run.open(REFERENCE_DIR / name)
    arms = run.meta["arms"]
    expect = breakeven.analyse(run.rows("engine_ab"), arms, list(arms))
    assert [(p.arm, p.off_arm, p.algorithm, p.draft_tokens) for p in expect.pairs] == [
        ("ngram", "nospec", "NGRAM", 8), ("standalone", "nospec", "STANDALONE", 8)]
    lines = {(x["arm"], x["kind"]): x for x in _result(tmp_path)["metrics"]["break_even"]["lines"]}
    assert set(lines) == {(a, k) for a in ("ngram", "standalone") for k in ("novel", "predictable")}
    for b in expect.evens:
        line = lines[(b.arm, b.kind)]
        assert line["source"] == "measured" and line["outcome"] == b.outcome and line["text"] == b.text
        assert line["contexts"] == [256, 1024, 2048, 3584]
        for key in ("context_tokens", "lo_tokens", "hi_tokens"):
            assert line[key] == (pytest.approx(getattr(b, key)) if getattr(b, key) is not None else None)
    page = out.read_text()
    assert "Where speculation stops paying" in page and "image/png" in page and ">nan<" not in page.lower()
    run_notebook("07_findings")
    res = json.loads((tmp_path / "run" / "findings" / "07_findings.json").read_text())
    diagnosis = next(f for f in res["findings"] if f["id"] == "findings.diagnosis")["verdict"]
    for b in expect.evens:
        assert recommendation(b) in diagnosis, (b.arm, b.kind)
    assert "predictable text on standalone (against nospec)" in diagnosis


def _arms_file(folder: Path, arms: str) -> str:
    """An arms file of embedded arms (YAML lines under ``arms:``) in ``folder``."""
    path = folder / "arms.yaml"
    path.write_text("defaults: {engine: embedded}\narms:\n" + arms)
    return str(path)


TWO_ARMS = ("  - {name: ngram, speculation: {algorithm: NGRAM, draft_tokens: 4}}\n"
            "  - {name: plain, speculation: {algorithm: NONE}}\n")


def test_09s_arms_are_started_measured_and_stopped_one_after_another(tmp_path, monkeypatch, embedded_server) -> None:
    """09's arms path: the arms file planned as 09 plans it (its parameters over the file's settings) and run by the
    sweep's driver into 09's run: each arm's server started with its speculation and the prefix cache on, measured,
    recorded with its command, and stopped before the next one starts. Only the process start is replaced:
    ManagedServer.start adopts the session's embedded server (its port) instead of starting one. Two real arm servers
    and 09's page on them: test_09_measures_two_embedded_arms_one_after_another (slow)."""
    from specdiag.process import ManagedServer
    from specdiag.sweep.driver import plan, sweep_into

    port = int(embedded_server.url.rsplit(":", 1)[1])
    run = Run.create(tmp_path / "run")
    events: list[tuple] = []

    def adopt(self, timeout_s=None):
        self.port = port
        self.command = self._resolve_command()
        events.append(("start", self.command, len(run.rows("engine_ab"))))
        return self

    def release(self, timeout_s=10.0):
        events.append(("stop", len(run.rows("engine_ab"))))

    monkeypatch.setattr(ManagedServer, "start", adopt)
    monkeypatch.setattr(ManagedServer, "stop", release)
    planned = plan(_arms_file(tmp_path, TWO_ARMS), "engine_ab", (),
                   {"contexts": [128], "repeats": 2, "max_new_tokens": 4,
                    "slow_step_ms": 1e9})  # a loaded CPU's slow steps must not change the request count
    assert sweep_into(run, planned) == 0
    assert [e[0] for e in events] == ["start", "stop", "start", "stop"]  # one at a time
    (_, c1, r0), (_, r1), (_, c2, r2), (_, r3) = events
    assert r0 == 0 < r1 == r2 < r3  # each arm measured while it was up
    assert c1[c1.index("--speculative-num-draft-tokens") + 1] == "4" and "NONE" in c2
    assert all("--enable-prefix-cache" in c for c in (c1, c2))  # engine_ab's: decode on the cached prompt
    rows = run.rows("engine_ab")
    assert {r["arm"] for r in rows[:r1]} == {"ngram"} and {r["arm"] for r in rows[r1:]} == {"plain"}
    for arm in ("ngram", "plain"):
        assert sum(r["phase"] == "decode" and r["error"] is None for r in rows if r["arm"] == arm) == 2
    meta = Run.open(run.path).meta
    assert meta["arms"]["ngram"]["command"] == c1 and meta["arms"]["plain"]["configured"]["speculation"]["algorithm"] \
        == "NONE"
    assert "kind" not in meta and meta["params"]["09_engine_ab"]["contexts"] == [128]  # the notebook's run stays its own


@pytest.mark.notebook
@pytest.mark.slow  # cheaper siblings in make test: the test above, test_09_measures_live_servers_named_by_url
def test_09_measures_two_embedded_arms_one_after_another(run_notebook, tmp_path) -> None:
    out = run_notebook("09_engine_ab", arms=_arms_file(tmp_path, TWO_ARMS), context_lengths=[128, 256], repeats=2,
                       max_new_tokens=8, memory_bandwidth_gb_s=20.0, matmul_tflops=1.0)
    res = _result(tmp_path)
    assert "recorded_from" not in res
    m = res["metrics"]
    assert m["arms"] == ["ngram", "plain"]
    assert m["decode_requests"] == {"ngram": {"128": 2, "256": 2}, "plain": {"128": 2, "256": 2}}
    # one arm at a time: every TTFT its own but each fresh server's first request (one-time compilation)
    assert m["ttft_own"] == {"ngram": {"128": False, "256": True}, "plain": {"128": False, "256": True}}
    assert all(x > 0 for arm in m["ttft_over_floor_x"].values() for x in arm.values())
    meta = Run.open(tmp_path / "run").meta
    cmd = meta["arms"]["ngram"]["command"]
    assert cmd[cmd.index("--speculative-num-draft-tokens") + 1] == "4" and cmd[cmd.index("--device") + 1] == "auto"
    assert "--enable-prefix-cache" in cmd  # the decode requests reuse the prefilled prompt (cached_tokens says so)
    assert meta["arms"]["plain"]["server"]["speculative_algorithm"] in (None, "NONE")
    assert meta["hardware"]["memory_bandwidth_source"] == "parameter"
    page = out.read_text()
    assert "2 arms measured: ngram, plain" in page
    assert "not enough requests" in page  # 2 requests against 2: no verdict between the arms, said as such
    (line,) = m["break_even"]["lines"]  # plain is ngram's speculation-off twin; 2 requests a side are not enough
    assert (line["arm"], line["off_arm"], line["outcome"]) == ("ngram", "plain", "not enough requests")


@pytest.mark.notebook
@pytest.mark.slow  # two embedded servers started and measured at 3 requests a context (about 40 s on 2 cores)
def test_09_states_the_break_even_on_embedded_arms_and_07_recommends(run_notebook, tmp_path) -> None:
    """A speculating arm and its speculation-off twin on the embedded engine: per context the ratio of tokens/s with
    its interval, a break-even line (whichever outcome these requests give, its numbers consistent), the plot, and
    07's diagnosis ending with the recommendation from it."""
    arms = ("  - {name: ngram, speculation: {algorithm: NGRAM, draft_tokens: 4}}\n"
            "  - {name: \"off\", speculation: {algorithm: NONE}}\n")
    out = run_notebook("09_engine_ab", arms=_arms_file(tmp_path, arms), context_lengths=[128, 1024], repeats=3,
                       max_new_tokens=8, memory_bandwidth_gb_s=20.0, matmul_tflops=1.0)
    (line,) = _result(tmp_path)["metrics"]["break_even"]["lines"]
    assert (line["arm"], line["off_arm"], line["source"]) == ("ngram", "off", "measured")
    assert line["contexts"] == [128, 1024] and line["outcome"] in ("crosses", "starts", "always pays", "never pays",
                                                                    "tie")
    if line["outcome"] in ("crosses", "starts"):  # a context where the medians' ratio crosses 1, or a bracket only
        assert (line["lo_tokens"], line["hi_tokens"]) == (128, 1024)
        assert line["context_tokens"] is None or 128 <= line["context_tokens"] <= 1024
    else:
        assert line["context_tokens"] is None
    page = out.read_text()
    assert "Where speculation stops paying" in page and "interval (x, over requests)" in page
    assert "image/png" in page and ">nan<" not in page.lower()
    run_notebook("07_findings")
    res = json.loads((tmp_path / "run" / "findings" / "07_findings.json").read_text())
    diagnosis = next(f for f in res["findings"] if f["id"] == "findings.diagnosis")
    assert diagnosis["verdict"].rstrip().endswith(line["recommendation"] + ".")
    assert "on ngram (against off)" in diagnosis["verdict"]


@pytest.mark.notebook
def test_09_measures_live_servers_named_by_url(run_notebook, tmp_path, embedded_server) -> None:
    """Running servers are arms with a url: measured one after another, neither started nor stopped; no command
    recorded (started elsewhere), their server info is (the same server twice here: two names, one URL, is a valid if
    dull A/B); only picks the arms of the file."""
    url = embedded_server.url
    path = tmp_path / "arms.yaml"
    path.write_text(f"arms:\n  - {{name: first, url: '{url}'}}\n  - {{name: second, url: '{url}'}}\n"
                    f"  - {{name: third, url: 'http://127.0.0.1:9'}}\n")
    run_notebook("09_engine_ab", arms=str(path), only=["first", "second"], context_lengths=[128], repeats=2,
                 max_new_tokens=4, memory_bandwidth_gb_s=20.0, matmul_tflops=1.0)
    res = _result(tmp_path)
    assert res["metrics"]["arms"] == ["first", "second"] and "recorded_from" not in res
    meta = Run.open(tmp_path / "run").meta
    assert meta["arms"]["first"]["command"] is None and meta["arms"]["first"]["url"] == url
    assert meta["arms"]["second"]["server"]["speculative_algorithm"] == "STANDALONE"


@pytest.mark.notebook
def test_06_then_09_in_one_run_folder_lists_only_engine_arms(run_notebook, tmp_path, embedded_server) -> None:
    """make report runs 06 (here: its recorded H200 data replayed, its torch forms checked on the CPU) and 09 into one
    run folder: 06's kernel arms (baseline, split_triton) are no engine arms, and 09 neither lists nor ranks them."""
    from specdiag.steps.kernel_ab.arms import ARMS

    run_notebook("06_kernel_ab")
    url = embedded_server.url
    path = tmp_path / "arms.yaml"
    path.write_text(f"arms:\n  - {{name: first, url: '{url}'}}\n  - {{name: second, url: '{url}'}}\n")
    out = run_notebook("09_engine_ab", arms=str(path), context_lengths=[128], repeats=2, max_new_tokens=4,
                       memory_bandwidth_gb_s=20.0, matmul_tflops=1.0)
    meta = Run.open(tmp_path / "run").meta
    assert set(meta["arms"]) == {"first", "second"}
    assert set(meta["kernel_ab_arms"]) == {"baseline", "split_triton"} <= set(ARMS)  # 06's, under its own key
    res = _result(tmp_path)
    assert res["metrics"]["arms"] == ["first", "second"]
    page = out.read_text()
    assert "split_triton" not in page and "None, None tokens per step" not in page
