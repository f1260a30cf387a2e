"""The shared look of every plot: context axes with 1k/32k/128k ticks, units on every axis.

Convention: a plot function draws on the matplotlib Axes it is given (``ax`` first) and returns None; a
figure of several panels is made by a function that lays the panels out and returns the Figure; a notebook
shows every figure the same way, with :func:`show` (displayed once, then closed).
"""

from __future__ import annotations

from typing import Any, Sequence

import matplotlib.ticker as mticker

SOURCE_NOTE = {"measured": "measured", "server-reported": "server-reported", "computed": "computed",
               "published": "published"}


def format_tokens(n: float, _pos: Any = None) -> str:
    """1400 -> '1.4k', 32768 -> '32k', 131072 -> '128k', 128000 -> '128k', 1_000_000 -> '1M'."""
    n = float(n)
    if n <= 0:
        return "0"
    if n >= 1_000_000:
        return f"{n / 1_000_000:.3g}M"
    if n >= 1000:
        for base in (1000, 1024):  # 128000 -> 128k (not 125k); 131072 -> 128k
            if abs(n / base - round(n / base)) < 1e-9:
                return f"{int(round(n / base))}k"
        return f"{n / 1000:.3g}k"
    return f"{int(n)}"


def context_axis(ax: Any, contexts: Sequence[float] | None = None, log: bool = True,
                 label: str = "context (tokens)", axis: str = "x") -> None:
    """Format ``ax``'s context axis: log scale (base 2), ticks at the measured contexts, '32k' labels."""
    target = ax.xaxis if axis == "x" else ax.yaxis
    if log:
        (ax.set_xscale if axis == "x" else ax.set_yscale)("log", base=2)
    if contexts:
        ticks = sorted({float(c) for c in contexts if c and c > 0})
        target.set_major_locator(mticker.FixedLocator(ticks))
    target.set_major_formatter(mticker.FuncFormatter(format_tokens))
    target.set_minor_formatter(mticker.NullFormatter())
    (ax.set_xlabel if axis == "x" else ax.set_ylabel)(label)


def source_note(ax: Any, text: str) -> None:
    """A small grey note in the plot's corner saying where the numbers came from."""
    ax.annotate(text, xy=(1.0, -0.16), xycoords="axes fraction", ha="right", va="top", fontsize=8, color="#666")


def show(fig: Any) -> None:
    """Show ``fig`` once in the notebook's output and close it (no second copy from the inline backend)."""
    import matplotlib.pyplot as plt  # noqa: PLC0415
    from IPython.display import display  # noqa: PLC0415

    display(fig)
    plt.close(fig)
