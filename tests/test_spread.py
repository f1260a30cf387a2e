"""The server as a unit (specdiag.spread): where a row came from, the spread between servers, and the comparison that
counts it; the default spread checked against every recorded run; the merge stamping each row's machine."""

from __future__ import annotations

import json
import statistics

import pytest

from specdiag import spread
from specdiag.paths import REFERENCE_DIR
from specdiag.runs import Run, machine_id, merge_runs
from specdiag.spread import Sample, compare_across, server_spreads


def test_a_rows_server_and_machine() -> None:
    assert spread.server_of({"arm": "fi", "part": 4}) == "fi (part 4)"
    assert spread.server_of({"arm": "fi", "part": 4, "server": "s1"}) == "s1"
    assert spread.server_of({"arm": "fi"}) == "fi"
    assert spread.machine_of({"part": 4}) == "part 4"  # a merged run's parts: lent machines not known to be one
    assert spread.machine_of({"part": 4, "machine": "0abc"}) == "0abc"
    assert spread.machine_of({"arm": "fi"}) == "" and spread.machine_of({"part": float("nan")}) == ""


def _cell(values: list[float], server: str, machine: str) -> list[Sample]:
    return [Sample(v, server, machine) for v in values]


def test_one_machine_compares_requests() -> None:
    a, b = _cell([10.0, 10.1, 10.2], "a", ""), _cell([11.0, 11.1, 11.2], "b", "")
    c = compare_across(a, b)
    assert c.verdict == "higher" and c.rule == "one machine" and c.spread_x is None


def test_several_machines_must_clear_the_spread_between_servers() -> None:
    a, b = _cell([10.0, 10.1, 10.2], "a", "m1"), _cell([11.0, 11.1, 11.2], "b", "m2")
    wide = spread.Spread(1.2, "a at 1k: 2 servers")
    c = compare_across(a, b, wide)
    assert (c.request_verdict, c.verdict, c.spread_x) == ("higher", "tie", 1.2) and spread.inside_spread(c)
    assert c.rule == "several machines: a difference must clear the spread between servers, 1.20x (a at 1k: 2 servers)"
    assert spread.widened(c) == (pytest.approx(c.lo / 1.2), pytest.approx(c.hi * 1.2))
    assert compare_across(a, b, spread.Spread(1.05, "x")).verdict == "higher"
    assert compare_across(a, [Sample(s.value / 2, s.server, s.machine) for s in b], wide).verdict == "lower"
    # no spread measured: the recorded runs' largest
    assert compare_across(a, b).spread_x == spread.DEFAULT_SPREAD_X


def test_a_machine_both_measured_on_is_compared_alone() -> None:
    a = _cell([10.0, 10.1, 10.2], "a (part 2)", "part 2") + _cell([14.0, 14.1], "a (part 1)", "part 1")
    b = _cell([11.0, 11.1, 11.2], "b (part 2)", "part 2") + _cell([9.0], "b (part 3)", "part 3")
    c = compare_across(a, b, spread.Spread(1.5, "x"))
    assert c.verdict == "higher" and (c.n_a, c.n_b) == (3, 3) and c.spread_x is None
    assert c.rule == "one machine (part 2) measured both: its 3 / 3 requests compared, 3 from other machines left out"


def test_the_spread_per_context_falls_back_to_the_runs_then_the_recorded_runs() -> None:
    cells = {("a", 1024): _cell([4.4, 4.5], "a1", "m1") + _cell([6.2, 6.3], "a2", "m2"),
             ("b", 1024): _cell([5.0], "b1", "m3"), ("a", 65536): _cell([9.0, 9.1], "a1", "m1")}
    got = server_spreads(cells, "ms", lambda c: f"{c // 1024}k")
    assert got[1024].x == pytest.approx(6.25 / 4.45) and got[1024].where == "a at 1k: 2 servers 4.45-6.25 ms"
    assert got[65536].x == got[1024].x and got[65536].where.startswith("none at 64k; the run's largest, a at 1k")
    alone = server_spreads({("a", 1024): _cell([4.4], "a1", "m1")})
    assert alone[1024] == spread.DEFAULT_SPREAD


def _recorded_spreads() -> list[tuple[str, float]]:
    """Every spread between servers the recorded runs measure: an arm (and pool state) at a context on two or more
    servers, the ratio of the largest server median to the smallest, per value compared."""
    out = []
    for folder in sorted(REFERENCE_DIR.iterdir()):
        for table, value, key in (("engine_ab", "step_ms", ("arm", "phase")), ("engine_ab", "ttft_s", ("arm", "phase")),
                                  ("kv_layout", "step_ms", ("arm", "pool_state"))):
            path = folder / f"{table}.jsonl"
            if not path.exists():
                continue
            rows = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
            by: dict[tuple, dict[str, list[float]]] = {}
            for r in rows:
                if r.get("error") or r.get(value) is None or r.get("part") is None:
                    continue
                if value == "ttft_s" and r.get("phase") != "prefill" or value == "step_ms" and r.get("phase") == "prefill":
                    continue
                x = (statistics.median(r["step_ms_samples"]) if table == "kv_layout" and r.get("step_ms_samples")
                     else float(r[value]))  # 10's request value: the median of its own steps
                by.setdefault((*(r.get(k) for k in key), r["context_tokens"]), {}).setdefault(
                    spread.server_of(r), []).append(x)
            for cell, servers in by.items():
                if len(servers) > 1 and table == "engine_ab" and value == "ttft_s":
                    continue  # an arm's first prefill on each server may carry compilation: not a server's spread
                if len(servers) > 1:
                    meds = [statistics.median(v) for v in servers.values()]
                    out.append((f"{folder.name} {cell}", max(meds) / min(meds)))
    return out


def test_the_default_spread_is_the_largest_the_recorded_runs_measured() -> None:
    measured = _recorded_spreads()
    assert len(measured) >= 5  # the DFLASH run's, the engine A/B run's, the Tier 0 run's
    where, largest = max(measured, key=lambda x: x[1])
    assert largest <= spread.DEFAULT_SPREAD_X < 1.1 * largest, (where, largest)
    assert "sglang-h200-kv-tier0" in where and f"{largest:.2f}x" in spread.DEFAULT_SPREAD_WHERE


def test_the_merge_stamps_each_row_with_its_parts_machine(tmp_path) -> None:
    assert len(machine_id()) == 12 and machine_id() == machine_id()
    calls = []
    for i, machine in enumerate(("m-one", None)):
        run = Run.create(tmp_path / f"call{i}")
        run._write_run_json({"run_id": f"call{i}", "provenance": {"machine": machine} if machine else {"host": "vm"}})
        run.append_row("engine_ab", {"arm": "a", "step_ms": 1.0})
        run.append_row("engine_ab", {"arm": "b", "step_ms": 1.0, "machine": "kept"})
        calls.append(run.path)
    out, _ = merge_runs(tmp_path / "merged", calls, ["engine_ab"], "merged")
    rows = out.rows("engine_ab")
    assert [(r["part"], r.get("machine")) for r in rows] == [(1, "m-one"), (1, "kept"), (2, None), (2, "kept")]
    assert Run.create(tmp_path / "fresh").meta["provenance"]["machine"] == machine_id()
