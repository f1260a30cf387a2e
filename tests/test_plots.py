import matplotlib
import pytest

matplotlib.use("agg")
import matplotlib.pyplot as plt  # noqa: E402

from specdiag.plots import context_axis, format_tokens  # noqa: E402


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


def test_bandwidth_figure_is_three_panels_drawn_by_the_library() -> None:
    """05's figure: step vs floors, effective bandwidth, the verify attention on kernels/plots' roofline."""
    import matplotlib.pyplot as plt

    from specdiag import geometry, hardware
    from specdiag.steps.bandwidth_analysis import roofline
    from specdiag.steps.bandwidth_analysis import plots as roofline_plots
    from specdiag.paths import REFERENCE_DIR
    from specdiag.runs import Run

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
