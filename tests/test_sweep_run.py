"""``specdiag sweep`` on the embedded engine (two arms, NGRAM and no speculation, one server at a time), its budget,
and ``specdiag merge`` of parts (rows with their part, arms joined only when configured alike)."""

from __future__ import annotations

import gzip

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from specdiag import cli
from specdiag.paths import PROJECT_ROOT
from specdiag.runs import Run
from specdiag.sweep.merge import MergeError, merge_parts

EMBEDDED = str(PROJECT_ROOT / "params" / "arms" / "embedded.yaml")
JOB = PROJECT_ROOT / "scripts" / "device" / "sweep_job.sh"


def test_an_embedded_sweep_measures_each_arm_in_turn_and_records_it(tmp_path: Path, capsys) -> None:
    out = tmp_path / "run"
    rc = cli.main(["sweep", "--arms", EMBEDDED, "--measure", "engine_ab", "--out", str(out), "--contexts", "128",
                   "--repeats", "2", "--max-new-tokens", "4", "--device", "cpu", "--budget-s", "150"])
    assert rc == 0, capsys.readouterr().out[-2000:]
    run = Run.open(out)
    rows = run.rows("engine_ab")
    assert [(r["arm"], r["phase"]) for r in rows] == [("ngram", "prefill"), ("ngram", "decode"), ("ngram", "decode"),
                                                      ("nospec", "prefill"), ("nospec", "decode"), ("nospec", "decode")]
    assert all(r.get("error") is None for r in rows)
    meta = run.meta
    for name, algo in (("ngram", "NGRAM"), ("nospec", "NONE")):
        rec = meta["arms"][name]
        assert {"what", "configured", "env", "started_after_s", "ready_after_s", "server", "command",
                "measured_s"} <= set(rec), rec.keys()
        assert rec["command"][rec["command"].index("--speculative-algorithm") + 1] == algo
        assert "failed" not in rec
    # one server at a time: the second starts after the first was measured and stopped
    assert meta["arms"]["nospec"]["started_after_s"] >= meta["arms"]["ngram"]["started_after_s"] + \
        meta["arms"]["ngram"]["measured_s"] - 0.5
    assert meta["kind"] == "engine_ab" and meta["params"]["09_engine_ab"]["contexts"] == [128]
    assert "gpu" in meta["device"] and "created_utc" in meta["provenance"] and "sweep" in meta["command"]
    assert meta["not_run"] == [] and meta["finished_after_s"] > 0
    assert (out / "server-ngram.log").is_file() and (out / "server-nospec.log").is_file()
    from specdiag.steps.engine_ab import analysis

    dec = analysis.decode_table(analysis.frame(rows))
    assert set(dec["arm"]) == {"ngram", "nospec"}


def test_a_running_server_is_measured_as_it_runs(tmp_path: Path, embedded_server, capsys) -> None:
    """An arm with url: measured by the same loop, never started or stopped by it (no command, no server log), the
    server as it reported itself; --check names it without a command."""
    arms = tmp_path / "arms.yaml"
    arms.write_text(f"arms:\n  - {{name: live, url: '{embedded_server.url}', what: the session's server}}\n")
    assert cli.main(["sweep", "--arms", str(arms), "--measure", "engine_ab", "--out", str(tmp_path / "c"),
                     "--check"]) == 0
    assert f"live: the running server at {embedded_server.url} (not started)" in capsys.readouterr().out
    out = tmp_path / "run"
    assert cli.main(["sweep", "--arms", str(arms), "--measure", "engine_ab", "--out", str(out), "--contexts", "128",
                     "--repeats", "1", "--max-new-tokens", "4",
                     "--set", "slow_step_ms=1e9"]) == 0  # a loaded CPU's slow steps keep 1 request
    run = Run.open(out)
    assert [(r["arm"], r["phase"], r["error"]) for r in run.rows("engine_ab")] == [("live", "prefill", None),
                                                                                   ("live", "decode", None)]
    rec = run.meta["arms"]["live"]
    assert rec["command"] is None and rec["url"] == embedded_server.url and rec["env"] == {}
    assert rec["configured"] == {"url": embedded_server.url, "engine": None}
    assert rec["server"]["speculative_algorithm"] == "STANDALONE" and not list(out.glob("server-*.log"))
    from specdiag.localserver.lifecycle import answers

    assert answers(embedded_server.url)  # still up


def test_a_budget_too_short_starts_no_arm_and_says_so(tmp_path: Path) -> None:
    out = tmp_path / "run"
    assert cli.main(["sweep", "--arms", EMBEDDED, "--measure", "engine_ab", "--out", str(out), "--budget-s", "30",
                     "--min-arm-s", "60"]) == 0
    meta = Run.open(out).meta
    assert len(meta["not_run"]) == 2 and all("not started" in x and "budget" in x for x in meta["not_run"])
    assert "started_after_s" not in meta["arms"]["ngram"] and not (out / "engine_ab.jsonl").exists()


def test_mistakes_fail_before_any_server_starts(tmp_path: Path, capsys) -> None:
    bad = tmp_path / "arms.yaml"
    bad.write_text("arms:\n  - {name: a, engine: embedded, speculation: {algorithm: NGRAM, draft_tokens: 1}}\n")
    assert cli.main(["sweep", "--arms", str(bad), "--measure", "engine_ab", "--out", str(tmp_path / "r")]) == 2
    assert "draft_tokens must be a whole number >= 2" in capsys.readouterr().err
    assert cli.main(["sweep", "--arms", EMBEDDED, "--measure", "engine_ab", "--out", str(tmp_path / "r"),
                     "--set", "repeat=3"]) == 2
    assert "did you mean 'repeats'" in capsys.readouterr().err
    assert not (tmp_path / "r").exists()
    assert cli.main(["sweep", "--arms", EMBEDDED, "--measure", "kv_layout", "--out", str(tmp_path / "r"),
                     "--check"]) == 0
    assert "ngram: " in capsys.readouterr().out and not (tmp_path / "r").exists()


def test_sweep_help_is_its_own() -> None:
    parser = cli.verb_parser("sweep")
    assert {"--arms", "--measure", "--out", "--budget-s", "--only", "--contexts"} <= {
        o for a in parser._actions for o in a.option_strings}


def part(folder: Path, arms: dict, rows: list[dict], finished: bool = True, kind: str = "engine_ab") -> Path:
    run = Run.create(folder)
    run.update(kind=kind, command=f"specdiag sweep --out {folder}", device={"gpu": "H200"}, arms=arms,
               not_run=["x at 185,000 tokens: budget"], plugin_stats={a: [{"served": 3}] for a in arms},
               model={"model_config": {"layers": 61}}, kv_layout_arms=[{"arm": a} for a in arms],
               **({"finished_after_s": 10.0} if finished else {}))
    for r in rows:
        run.append_row("engine_ab", r)
    (folder / "files").mkdir()
    (folder / "files" / "dump.pt").write_bytes(b"x" * 100)
    (folder / f"server-{next(iter(arms))}.log").write_text("log\n")
    return folder


def rec(**configured) -> dict:
    return {"what": "w", "configured": {"engine": "sglang", "plugin": "off", "flags": [], **configured},
            "started_after_s": 1.0, "ready_after_s": 2.0}


def test_merge_joins_parts_rows_arms_and_provenance(tmp_path: Path) -> None:
    a = part(tmp_path / "a", {"triton": {**rec(), "measured_s": 5.0}, "flashinfer": {**rec(), "measured_s": 4.0}},
             [{"arm": "triton", "context_tokens": 1024}, {"arm": "flashinfer", "context_tokens": 1024}])
    b = part(tmp_path / "b", {"triton": rec(), "fi_prefill_plugin": rec(plugin="splitkv")},
             [{"arm": "triton", "context_tokens": 131072}], finished=False)
    out = merge_parts(tmp_path / "m", [a, b])
    rows = out.rows("engine_ab")
    assert [(r["arm"], r["part"]) for r in rows] == [("triton", 1), ("flashinfer", 1), ("triton", 2)]
    meta = out.meta
    assert meta["arms"]["triton"]["parts"] == [1, 2] and meta["arms"]["fi_prefill_plugin"]["parts"] == [2]
    assert meta["arms"]["triton"]["per_part"]["2"]["measured_s"] is None
    assert [(c["part"], c["cut"], c["device"]["gpu"]) for c in meta["parts"]] == [(1, False, "H200"), (2, True, "H200")]
    assert "x at 185,000 tokens: budget (part 2)" in meta["not_run"]
    assert any(x.startswith("triton (part 2): the part was cut") for x in meta["not_run"])
    assert set(meta["plugin_stats"]) == {"triton (part 1)", "flashinfer (part 1)", "triton (part 2)",
                                         "fi_prefill_plugin (part 2)"}
    assert [(x["arm"], x["part"]) for x in meta["kv_layout_arms"]][-1] == ("fi_prefill_plugin", 2)
    assert meta["model"] == {"model_config": {"layers": 61}} and meta["kind"] == "engine_ab"
    assert (tmp_path / "m" / "files" / "dump.pt.gz").is_file()
    assert gzip.open(tmp_path / "m" / "servers" / "part2-server-triton.log.gz", "rt").read() == "log\n"
    # a later part extends the merge: its rows count on
    merge_parts(tmp_path / "m", [a])
    assert sorted({r["part"] for r in Run.open(tmp_path / "m").rows("engine_ab")}) == [1, 2, 3]


def test_merge_refuses_an_arm_configured_otherwise_and_other_measurements(tmp_path: Path) -> None:
    a = part(tmp_path / "a", {"triton": rec()}, [{"arm": "triton"}])
    b = part(tmp_path / "b", {"triton": rec(flags=["--disable-cuda-graph"])}, [{"arm": "triton"}])
    with pytest.raises(MergeError, match=r"arm 'triton' of .* is not configured as in part 1: flags: "
                                         r"\['--disable-cuda-graph'\] against \[\]"):
        merge_parts(tmp_path / "m", [a, b])
    assert not (tmp_path / "m").exists()
    c = part(tmp_path / "c", {"x": rec()}, [], kind="kv_layout")
    with pytest.raises(MergeError, match="different measurements"):
        merge_parts(tmp_path / "m2", [a, c])


def test_merge_takes_only_the_arms_asked_and_joins_a_run_recorded_before_the_sweep(tmp_path: Path, capsys) -> None:
    a = part(tmp_path / "a", {"triton": rec(), "triton_nospec": rec(speculation={"algorithm": "NONE"})},
             [{"arm": "triton", "context_tokens": 1024}, {"arm": "triton_nospec", "context_tokens": 1024}])
    # a run recorded before the sweep: its arm states its server, not a configuration
    old = Run.create(tmp_path / "old", label="old")
    old.update(kind="engine_ab", arms={"triton_nospec": {"what": "w", "server": {
        "model_path": "/m", "attention_backend": "triton", "speculative_algorithm": None}}},
        parts=[{"part": 1, "source": "x"}])
    old.append_row("engine_ab", {"arm": "triton_nospec", "context_tokens": 512, "part": 1})
    with pytest.raises(MergeError, match="no part measured"):
        merge_parts(tmp_path / "old", [a], ["flashinfer_nospec"])
    # the recorded arm's server stated another model: refused
    with pytest.raises(MergeError, match=r"not the recorded run's 'triton_nospec'.*model"):
        merge_parts(tmp_path / "old", [a], ["triton_nospec"])
    cfg = Run.open(a).meta["arms"]["triton_nospec"]["configured"]
    cfg["model"] = "/m"
    cfg["attention_backend"] = "triton"
    Run.open(a).update(arms={**Run.open(a).meta["arms"], "triton_nospec": {**rec(), "configured": cfg}})
    assert cli.main(["merge", "--out", str(tmp_path / "old"), "--arms", "triton_nospec", str(a)]) == 0
    m = Run.open(tmp_path / "old")
    assert [(r["arm"], r["part"]) for r in m.rows("engine_ab")] == [("triton_nospec", 1), ("triton_nospec", 2)]
    assert set(m.meta["arms"]) == {"triton_nospec"}
    assert m.meta["arms"]["triton_nospec"]["configured_from_part"] == 2
    assert m.meta["parts"][-1]["arms_taken"] == ["triton_nospec"]
    assert "--arms triton_nospec" in m.meta["command"]
    assert not (tmp_path / "old" / "servers" / "part2-server-triton.log.gz").exists()


def test_merge_verb(tmp_path: Path, capsys) -> None:
    a = part(tmp_path / "a", {"triton": rec()}, [{"arm": "triton"}])
    assert cli.main(["merge", "--out", str(tmp_path / "m"), str(a)]) == 0
    assert "1 engine_ab rows" in capsys.readouterr().out
    assert cli.main(["merge", "--out", str(tmp_path / "m2"), str(tmp_path / "none")]) == 2


def test_the_job_script_parses_and_stages_sglang() -> None:
    r = subprocess.run(["bash", "-n", str(JOB)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    text = JOB.read_text()
    assert ". scripts/device/sglang_site.sh" in text and "stage_sglang_site" in text and "install_plugin" in text
    assert "-m specdiag.sweep models" in text and "-m specdiag.sweep sweep" in text


@pytest.mark.slow
def test_the_job_runs_the_embedded_arms_end_to_end(tmp_path: Path) -> None:
    env = {**os.environ, "OUT": str(tmp_path / "out"), "ARMS": EMBEDDED, "MEASURE": "engine_ab", "ENGINE": "embedded",
           "PYTHON": sys.executable, "BUDGET": "200", "SWEEP_ARGS": "--contexts 128 --max-new-tokens 4 --device cpu",
           "PYTHONPATH": str(PROJECT_ROOT / "lib")}
    r = subprocess.run(["bash", str(JOB)], cwd=PROJECT_ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    run = Run.open(tmp_path / "out" / "sweep")
    assert {x["arm"] for x in run.rows("engine_ab")} == {"ngram", "nospec"}
    assert json.loads((tmp_path / "out" / "sweep" / "run.json").read_text())["finished_after_s"] > 0


def test_check_summary_judges_fp8_calls_against_the_exact_reference() -> None:
    """A check arm's calls in run.json plugin_check: on a bf16 cache judged against SGLang's output; on an fp8 cache
    against the exact fp32 reference of the fp8 cache (SGLang's kernel casts q and P to fp8: its own error is reported
    beside); passed only with calls, all finite, each within 1e-2."""
    from specdiag.sweep.driver import check_summary

    base = {"layer": 0, "prefix_tokens": [1000], "draft_tokens": 2, "heads": 8, "finite": True}
    bf16 = check_summary([{"check": [{**base, "rel_err": 1.6e-3}, {**base, "rel_err": 1.8e-3}]}])
    assert bf16["passed"] and bf16["judged_by"] == "SGLang's output" and bf16["max_judged_err"] == 1.8e-3
    assert bf16["fp8_calls"] == 0 and bf16["max_sglang_rel_err_ref"] is None and bf16["calls"] == 2
    fp8 = [{**base, "rel_err": 3e-2, "rel_err_ref": 1.7e-3, "sglang_rel_err_ref": 3e-2},
           {**base, "rel_err": 2.5e-2, "rel_err_ref": 1.6e-3, "sglang_rel_err_ref": 2.4e-2}]
    got = check_summary([{"check": fp8[:1]}, {"check": fp8[1:]}])  # two server processes' stats
    assert got["passed"] and got["judged_by"] == "the fp32 reference of the fp8 cache"
    assert got["max_judged_err"] == 1.7e-3 and got["max_rel_err"] == 3e-2 and got["max_sglang_rel_err_ref"] == 3e-2
    assert not check_summary([{"check": [{**fp8[0], "rel_err_ref": 2e-2}]}])["passed"]
    assert not check_summary([{"check": [{**base, "rel_err": 1e-3, "finite": False}]}])["passed"]
    assert not check_summary([])["passed"]
