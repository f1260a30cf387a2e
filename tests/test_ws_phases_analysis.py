"""Section 10 of notebook 06 on synthetic kernel_ws_phases rows: the newest call per case and kernel, cycles and shares
per phase, the profiler split (absent in rows before run 23), the finding and the metrics, the stacked bars."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from specdiag.kernels import ws_phases_analysis as wa
from specdiag.kernels.gluon_ws import PHASES
from specdiag.kernels.ws_phases import phase_cycles

# cycles per tile of each phase, in gluon_ws.PHASES order
WG0_COMPUTE = [100, 1500, 750, 50, 190, 1050]  # 3,640: scores lead, copy wait small
WG1_COMPUTE = [630, 1150, 20, 110, 1740]
WG0_H8T8 = [1900, 1460, 650, 60, 180, 740]  # 4,990: the copy wait leads
WG1_H8T8 = [1200, 1060, 50, 100, 1900]


def _rows(ctx: int, h: int, t: int, kernel: str, ts: float, wg0: list[int], wg1: list[int], rest: int = 100,
          prof: tuple[float, float, float] | None = None, untimed_us: float = 60.0) -> list[dict[str, Any]]:
    """What ws_phases.measure_case writes: phase_cycles of a synthetic timed buffer (3 programs of 16 tiles)."""
    buf = np.zeros((3, 2, 8, 4), dtype=np.int64)
    for part, cyc in enumerate((wg0, wg1)):
        for k, c in enumerate(cyc):
            buf[:, part, k, :] = c * 16
        buf[:, part, 6, :] = (sum(cyc) + rest) * 16
        buf[:, part, 7, :] = 16
    base: dict[str, Any] = {"context_tokens": ctx, "heads": h, "draft_tokens": t, "layout": "shuffled_p1",
                            "kernel": kernel, "untimed_us": untimed_us, "timed_us": untimed_us * 1.03,
                            "ts_unix_s": ts, "error": None}
    if prof is not None:
        base.update(prof_partial_us=prof[0], prof_gap_us=prof[1], prof_merge_us=prof[2], prof_calls=10)
    return [{**base, **r} for r in phase_cycles(buf, PHASES)]


def _old_rows() -> list[dict[str, Any]]:
    """Rows as runs 18-21 wrote them: no prof_* columns."""
    return (_rows(131072, 16, 64, "split_gwp_p1", 100.0, WG0_COMPUTE, WG1_COMPUTE)
            + _rows(131072, 8, 8, "split_gwp_p1", 101.0, WG0_H8T8, WG1_H8T8)
            + _rows(65536, 8, 8, "split_gwp_p1", 102.0, [2800, 1400, 620, 60, 180, 750], WG1_H8T8))


def test_phase_table_reads_the_rows_per_warpgroup() -> None:
    tab = wa.phase_table(_old_rows())
    assert len(tab) == 6 and list(tab["partition"][:2]) == ["softmax_wg", "copy_pv_wg"]
    w0 = tab[(tab["partition"] == "softmax_wg") & (tab["heads"] == 16)].iloc[0]
    assert w0["loop_cycles"] == sum(WG0_COMPUTE) + 100 and w0["rest_cycles"] == pytest.approx(100)
    assert w0["scores_cycles"] == 1500 and np.isnan(w0["refill_issue_cycles"])  # the other warpgroup's phase
    assert w0["clock_cost_pct"] == pytest.approx(3.0)  # timed 1.03x untimed
    assert w0["scores_pct"] == pytest.approx(100 * 1500 / (sum(WG0_COMPUTE) + 100))
    assert (w0["dominant_phase"], w0["dominant_pct"]) == ("scores", pytest.approx(w0["scores_pct"]))
    w1 = tab[(tab["partition"] == "copy_pv_wg") & (tab["heads"] == 16)].iloc[0]
    assert w1["dominant_phase"] == "refill_issue" and w1["pv_cycles"] == 1150 and np.isnan(w1["copy_wait_cycles"])
    h8 = tab[(tab["partition"] == "softmax_wg") & (tab["context_tokens"] == 131072) & (tab["heads"] == 8)].iloc[0]
    assert h8["dominant_phase"] == "copy_wait" and h8["copy_wait_pct"] == pytest.approx(100 * 1900 / (sum(WG0_H8T8) + 100))
    # sorted by kernel, then rows (H x T), then context: 64 rows (64k, 128k) before 1,024
    assert list(tab["rows"][::2]) == [64, 64, 1024] and list(tab["context_tokens"][::2]) == [65536, 131072, 131072]


def test_newest_call_replaces_older_rows_and_errors_are_left_out() -> None:
    old = _rows(131072, 8, 8, "split_gwf_p1", 10.0, [3000, 1460, 650, 60, 180, 740], WG1_H8T8)
    new = _rows(131072, 8, 8, "split_gwf_p1", 20.0, WG0_H8T8, WG1_H8T8, prof=(54.6, 1.3, 8.3), untimed_us=66.4)
    err = [{"context_tokens": 131072, "heads": 8, "draft_tokens": 8, "kernel": "split_gwf_p1", "error": "boom",
            "ts_unix_s": 30.0}]  # a failed case: newer, but measured nothing
    tab = wa.phase_table(old + new + err)
    assert len(tab) == 2 and set(tab["ts_unix_s"]) == {20.0}
    assert tab[tab["partition"] == "softmax_wg"]["copy_wait_cycles"].iloc[0] == 1900
    other = _rows(131072, 8, 8, "split_gwp_p1", 5.0, WG0_H8T8, WG1_H8T8)  # another kernel keeps its own newest rows
    assert len(wa.phase_table(old + new + other)) == 4
    assert wa.last_kernel(wa.phase_table(old + new + other)) == "split_gwf_p1"


def test_profiler_split_is_the_merge_and_gap_share_of_the_call() -> None:
    rows = _old_rows() + _rows(131072, 8, 8, "split_gwf_p1", 200.0, WG0_H8T8, WG1_H8T8, prof=(54.6, 1.3, 8.3),
                               untimed_us=66.4)
    prof = wa.profiler_split(rows)
    assert len(prof) == 1  # one row per case and kernel, only where the profiler ran
    r = prof.iloc[0]
    assert (r["kernel"], r["call_us"], r["partial_us"], r["gap_us"], r["merge_us"]) == ("split_gwf_p1", 66.4, 54.6, 1.3, 8.3)
    assert r["merge_gap_pct"] == pytest.approx(100 * (1.3 + 8.3) / 66.4)


def test_a_folder_of_old_rows_without_the_profiler() -> None:
    rows = _old_rows()
    tab, prof = wa.phase_table(rows), wa.profiler_split(rows)
    assert prof.empty
    f = wa.ws_phases_finding(tab, prof, "split_gwp_p1")
    assert f is not None and "merge" not in f.verdict and not any("profiler" in e for e in f.evidence)
    m = wa.ws_phases_metrics(tab, prof)
    assert m["profiler"] == {} and m["cases"] == 3 and m["kernels"] == ["split_gwp_p1"]


def test_the_finding_names_what_leads_each_case() -> None:
    rows = (_old_rows()
            + _rows(131072, 16, 64, "split_gwf_p1", 300.0, WG0_COMPUTE, WG1_COMPUTE, prof=(532.5, 1.2, 24.7), untimed_us=560.0)
            + _rows(131072, 8, 8, "split_gwf_p1", 301.0, WG0_H8T8, WG1_H8T8, prof=(54.6, 1.3, 8.3), untimed_us=66.4))
    tab, prof = wa.phase_table(rows), wa.profiler_split(rows)
    f = wa.ws_phases_finding(tab, prof, "split_gwf_p1")
    loop = sum(WG0_COMPUTE) + 100
    h8_loop = sum(WG0_H8T8) + 100
    assert f.id == "kernel_ab.ws_phases" and f.numbers["compute_case"] == "128k H=16 x T=64"
    assert f.numbers["compute_dominant_phase"] == "scores" and f.numbers["compute_loop_cycles"] == loop
    assert f.numbers["compute_copy_wait_pct"] == pytest.approx(100 * 100 / loop)
    assert f.numbers["h8t8_P131072_copy_wait_pct"] == pytest.approx(100 * 1900 / h8_loop)
    assert f.numbers["h8t8_P131072_dominant_phase"] == "copy_wait"
    assert f"led by scores ({100 * 1500 / loop:.0f} %)" in f.verdict and f"{loop:,.0f} cycles" in f.verdict
    assert f"waits for its copy {100 * 1900 / h8_loop:.0f} % of a tile at 128k" in f.verdict
    assert "compute-bound case with the most rows (128k H=16 x T=64" in f.verdict
    only_h8t8 = wa.phase_table(_rows(131072, 8, 8, "split_gwf_p1", 1.0, WG0_H8T8, WG1_H8T8))
    alone = wa.ws_phases_finding(only_h8t8, wa.profiler_split([]), "split_gwf_p1")
    assert "compute-bound" not in alone.verdict and "At H=8 x T=8" not in alone.verdict  # 64 rows: said once
    assert f"{100 * 9.6 / 66.4:.0f} % at 128k H=8 x T=8" in f.verdict and "P65536" not in str(f.numbers)  # gwf: 128k only
    assert f.numbers["P131072 h16 t64 merge_gap_pct"] == pytest.approx(100 * 25.9 / 560.0)
    assert wa.ws_phases_finding(tab, prof, "split_gwx_p1") is None
    # the metrics: per kernel and case, each warpgroup's loop, largest phase and phases
    m = wa.ws_phases_metrics(tab, prof)
    assert m["cases"] == 5 and m["kernels"] == ["split_gwf_p1", "split_gwp_p1"]
    assert m["clock_cost_pct_min"] == pytest.approx(3.0) and f.numbers["clock_cost_pct_max"] == pytest.approx(3.0)
    t = m["tiles"]["split_gwf_p1 P131072 h16 t64"]
    assert t["softmax_wg"]["loop_cycles"] == loop and t["softmax_wg"]["dominant_phase"] == "scores"
    assert t["copy_pv_wg"]["phases_cycles"] == dict(zip(PHASES["copy_pv_wg"], map(float, WG1_COMPUTE)))
    assert m["profiler"]["split_gwf_p1 P131072 h8 t8"]["merge_gap_pct"] == pytest.approx(100 * 9.6 / 66.4)


def test_timeline_table_reads_warpgroup_0s_timeline_of_the_newest_call() -> None:
    """Rows since session 11 carry warpgroup 0's timeline on its row: one table row per case and kernel of the newest
    call, in the metrics too; rows without it (before session 11) give none."""
    tl = {"tl_span_us": 46.6, "tl_q_p50_us": 1.54, "tl_first_p50_us": 4.61, "tl_stream_p50_us": 38.4,
          "tl_epilogue_p50_us": 1.02, "tl_tail_us": 2.56, "tl_ramp_us": 0.26}
    new = _rows(131072, 8, 1, "split_gwrp_p1", 200.0, WG0_H8T8, WG1_H8T8, prof=(47.4, -0.1, 2.3), untimed_us=51.9)
    new[0].update(tl)  # ws_phases writes it on the softmax_wg row only
    older = _rows(131072, 8, 1, "split_gwrp_p1", 150.0, WG0_H8T8, WG1_H8T8)
    older[0].update({k: 99.0 for k in tl})
    tab = wa.timeline_table(older + new + _old_rows())
    assert len(tab) == 1 and tab.iloc[0]["kernel"] == "split_gwrp_p1" and tab.iloc[0]["tl_span_us"] == 46.6
    assert tab.iloc[0]["timed_us"] == pytest.approx(51.9 * 1.03)
    m = wa.ws_phases_metrics(wa.phase_table(new), wa.profiler_split(new), tab)["timeline"]
    assert m == {"split_gwrp_p1 P131072 h8 t1": {"timed_us": pytest.approx(51.9 * 1.03), **tl}}
    assert wa.timeline_table(_old_rows()).empty


def test_rows_of_an_unknown_warpgroup_are_refused() -> None:
    rows = _old_rows()
    rows[0] = {**rows[0], "partition": "producer_wg"}
    with pytest.raises(ValueError, match="gluon_ws.PHASES"):
        wa.phase_table(rows)


def test_no_rows_give_empty_tables() -> None:
    assert wa.phase_table([]).empty and wa.profiler_split([]).empty and wa.last_kernel(wa.phase_table([])) is None
    assert wa.ws_phases_metrics(wa.phase_table([]), wa.profiler_split([])) == {
        "cases": 0, "clock_cost_pct_min": None, "clock_cost_pct_max": None, "kernels": [], "tiles": {}, "profiler": {},
        "timeline": {}}
    assert wa.timeline_table([]).empty


def test_stacked_bars_one_per_case_kernel_and_warpgroup() -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from specdiag.kernels.plots import ws_phase_bars

    tab = wa.phase_table(_old_rows())
    fig, ax = plt.subplots()
    ws_phase_bars(ax, tab)
    labels = [t.get_text() for t in ax.get_yticklabels()]
    assert len(labels) == 6 and labels[0] == "split_gwp_p1  64k H=8 x T=8  warpgroup 0 (softmax)"
    assert "cycles per KV tile" in ax.get_xlabel()
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    drawn = {p for names in PHASES.values() for p in names}  # the bf16 kernel's phases (no fp8 converting warpgroup)
    assert legend[0] == wa.PHASE_LABELS["copy_wait"] and len(legend) == len(drawn) + 1  # and the rest
    assert set(legend) == {wa.PHASE_LABELS[p] for p in (*drawn, "rest")}
    ends = sorted(p.get_x() + p.get_width() for p in ax.patches)[-1]
    assert ends == pytest.approx(tab["loop_cycles"].max())  # each bar is the whole loop
    plt.close(fig)
