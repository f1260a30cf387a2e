import matplotlib
import pytest

matplotlib.use("agg")
import matplotlib.pyplot as plt  # noqa: E402

from specdiag.plots import context_axis, context_tick_rows, format_tokens, pick_context_ticks, source_note  # noqa: E402


def test_format_tokens() -> None:
    assert format_tokens(1024) == "1k"
    assert format_tokens(32768) == "32k"
    assert format_tokens(131072) == "128k"
    assert format_tokens(1400) == "1.4k"
    assert format_tokens(185000) == "185k"
    assert format_tokens(512) == "512"


def test_context_axis_labels() -> None:
    fig, ax = plt.subplots()
    ax.plot([1024, 32768, 131072], [1, 2, 3])
    context_axis(ax, [1024, 32768, 131072])
    fig.canvas.draw()
    labels = [t.get_text() for t in ax.get_xticklabels()]
    assert labels == ["1k", "32k", "128k"]
    assert "tokens" in ax.get_xlabel()
    plt.close(fig)


#: Ladders a real server's params use (params/full.yaml), the embedded server's, and a sparse one.
LADDERS = {
    "full": [1400, 11000, 32768, 65536, 131072, 185000],
    "powers": [1024, 11264, 32768, 65536, 131072, 185000],
    "embedded": [512, 1024, 2048, 4096, 8192, 16000],
    "gap": [1000, 2000, 3000, 4000, 128000, 185000],
    "two_long": [131072, 185000],
}


def test_pick_context_ticks_keeps_the_ends_and_never_lets_labels_overlap() -> None:
    def width(v: float) -> float:
        return 8.0 * len(format_tokens(v))

    def overlaps(kept: list[float], place) -> bool:
        spans = sorted((place(v) - width(v) / 2, place(v) + width(v) / 2) for v in kept)
        return any(a[1] + 4 > b[0] for a, b in zip(spans, spans[1:]))

    import math

    for name, ladder in LADDERS.items():
        for log in (True, False):
            lo, hi = (ladder[0] / 1.3, ladder[-1] * 1.3) if log else (0.0, ladder[-1] * 1.05)
            for px in (150, 300, 450, 900):
                kept = pick_context_ticks(ladder, lo, hi, px, log=log, label_px=width, gap_px=4)
                place = ((lambda v: px * (math.log(v) - math.log(lo)) / (math.log(hi) - math.log(lo))) if log
                         else (lambda v: px * (v - lo) / (hi - lo)))
                assert kept[-1] == ladder[-1], (name, log, px, kept)  # the longest context always has its label
                assert not overlaps(kept, place), (name, log, px, kept)
                if len(ladder) > 1 and place(ladder[-1]) - place(ladder[0]) > width(ladder[0]) + width(ladder[-1]):
                    assert kept[0] == ladder[0], (name, log, px, kept)  # and the shortest, when both fit
    # 128k and 185k together: on a short log axis they collide, so one row keeps 185k and the next row 128k
    rows = context_tick_rows(LADDERS["full"], 1000, 240000, 300, log=True, label_px=width, gap_px=4)
    assert 185000 in rows[0] and 131072 not in rows[0] and 131072 in rows[1]
    assert sorted(v for row in rows for v in row) == LADDERS["full"]
    # on a wide linear axis everything fits in one row
    assert pick_context_ticks(LADDERS["full"], 0, 190000, 2000, log=False, label_px=width) == LADDERS["full"]
    # contexts outside the axis are left out; nothing to place on an empty axis
    assert pick_context_ticks([1024, 4096, 1 << 20], 1000, 5000, 400, log=True) == [1024, 4096]
    assert pick_context_ticks([1024], 10, 10, 400) == []


@pytest.mark.parametrize("log", [True, False])
@pytest.mark.parametrize("ladder", list(LADDERS.values()), ids=list(LADDERS))
@pytest.mark.parametrize("width_in", [4.0, 7.0, 12.0])
def test_drawn_context_tick_labels_never_overlap(ladder: list[int], log: bool, width_in: float) -> None:
    """The labels as matplotlib draws them (both rows), at the notebooks' figure sizes: no two overlap, none
    touches the axis label, and 128k and 185k are both labelled when both are measured."""
    fig, ax = plt.subplots(figsize=(width_in, 4))
    ax.plot(ladder, range(len(ladder)), "o-")
    context_axis(ax, ladder, log=log)
    if not log:
        ax.set_xlim(left=0)  # as 01 and 03 do after context_axis: the ticks follow the final limits
    source_note(ax, "measured; step = decode window / verify steps in it")
    fig.tight_layout()
    fig.canvas.draw()
    labels = [(t.get_text(), t.get_window_extent()) for t in ax.get_xticklabels() + ax.get_xticklabels(minor=True)
              if t.get_text() and t.get_visible()]
    clash = [(a, b) for i, (a, ba) in enumerate(labels) for b, bb in labels[i + 1:] if ba.overlaps(bb)]
    assert not clash, f"overlapping tick labels {clash} for {ladder} ({'log' if log else 'linear'}, {width_in} in)"
    axis_label = ax.xaxis.label.get_window_extent()
    assert not [t for t, b in labels if b.overlaps(axis_label)]
    note = ax.texts[0].get_window_extent()  # the source note sits below the axis label, clear of every tick label
    assert not note.overlaps(axis_label) and not [t for t, b in labels if b.overlaps(note)]
    shown = {t for t, _ in labels}
    assert format_tokens(ladder[-1]) in shown
    if 131072 in ladder and 185000 in ladder:
        assert {"128k", "185k"} <= shown
    plt.close(fig)


def test_bandwidth_figure_is_three_panels_drawn_by_the_library() -> None:
    """05's figure: step vs floors, effective bandwidth, the verify attention under specdiag.plots.roof."""
    import matplotlib.pyplot as plt

    from specdiag import geometry, hardware, roofline
    from specdiag.paths import REFERENCE_DIR
    from specdiag.runs import Run
    from specdiag.steps.bandwidth_analysis import plots as roofline_plots

    meta = Run.open(REFERENCE_DIR / "ct200-kimi-k26").meta
    geom = geometry.geometry_for_run(run_meta=meta)
    peaks = hardware.peaks_for_run(recorded=meta["hardware"])
    steps = [roofline.step_roofline(geom, c, peaks, tp_size=8, draft_tokens=8, measured_step_ms=ms)
             for c, ms in ((1400, 8.4), (185000, 1430.0))]
    fig = roofline_plots.figure(steps, peaks, "published")
    left, middle, right = fig.axes
    assert left.get_ylabel() == "time per step (ms)" and middle.get_ylabel() == "bandwidth (GB/s)"
    pts = roofline_plots.verify_points(steps)
    assert list(pts["tflops"]) == pytest.approx([s.verify_flops / s.measured_step_s / 1e12 for s in steps])
    (scatter,) = right.collections
    assert scatter.get_offsets()[:, 1].tolist() == pytest.approx(list(pts["tflops"]))
    assert "roof: min(" in right.get_legend().get_texts()[0].get_text()
    plt.close(fig)


def test_commit_vs_context_draws_on_the_given_axes() -> None:
    import matplotlib.pyplot as plt

    from specdiag.steps.commit_probe.plots import commit_vs_context

    fig, ax = plt.subplots()
    summary = [{"kind": "predictable", "context_tokens": 1000, "commit_length": 7.0},
               {"kind": "novel", "context_tokens": 1000, "commit_length": 1.5}]
    assert commit_vs_context(ax, summary, [], 8, "measured") is None
    assert len(ax.lines) == 3 and ax.get_ylabel() == "commit length (tokens per verify step)"
    plt.close(fig)
