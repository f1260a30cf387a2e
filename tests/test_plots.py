import matplotlib

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
