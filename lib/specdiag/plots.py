"""The shared look of every plot: context axes with 1k/32k/128k ticks that never overlap, units on every axis.

Convention: a plot function draws on the matplotlib Axes it is given (``ax`` first) and returns None; a
figure of several panels is made by a function that lays the panels out and returns the Figure; a notebook
shows every figure the same way, with :func:`show` (displayed once, then closed).
"""

from __future__ import annotations

import math
from typing import Any, Callable, Sequence

import matplotlib as mpl
import matplotlib.ticker as mticker
import numpy as np
from matplotlib.font_manager import FontProperties

SOURCE_NOTE = {"measured": "measured", "server-reported": "server-reported", "computed": "computed",
               "published": "published"}

#: Colours of the torch-trace kernel classes (:data:`specdiag.telemetry.trace_tables.KERNEL_CLASSES`), the same in 02's
#: timeline and 08's step profile: attention warm, matrix units blue, the rest muted.
KERNEL_CLASS_COLORS = {"attn_specdiag_splitkv": "#d62728", "attn_sglang_verify_splitkv": "#ff7f0e",
                       "attn_sglang_triton": "#e377c2", "attn_other": "#f7b6d2", "kv_indices": "#8c564b",
                       "moe": "#17becf", "gemm": "#1f77b4", "comm": "#9467bd", "norm": "#2ca02c",
                       "elementwise": "#98df8a", "memcpy": "#c49c94", "memset": "#dbdb8d", "other": "#7f7f7f"}
#: The colour of a kernel class :data:`KERNEL_CLASS_COLORS` does not list.
UNLISTED_KERNEL_CLASS_COLOR = "#bcbd22"


def kernel_class_color(kernel_class: str) -> str:
    """A kernel class's colour in every figure that shows one (:data:`KERNEL_CLASS_COLORS`)."""
    return KERNEL_CLASS_COLORS.get(kernel_class, UNLISTED_KERNEL_CLASS_COLOR)


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


#: Width of one tick-label character, in ems (DejaVu Sans, matplotlib's default font: digits 0.64, 'k' 0.58,
#: '.' 0.32; a little over the widest so an estimate never undercuts the drawn label).
CHAR_EM = 0.66
#: Clear space kept between two tick labels, in ems.
GAP_EM = 0.6


def pick_context_ticks(contexts: Sequence[float], vmin: float, vmax: float, axis_px: float, log: bool = True,
                       label_px: Callable[[float], float] | None = None, gap_px: float = 6.0) -> list[float]:
    """The contexts to put ticks at so that no two labels overlap (pure).

    Each context sits at its place along an axis ``axis_px`` pixels long from ``vmin`` to ``vmax`` (log scale or
    linear) and its label is ``label_px(value)`` pixels wide (default: 7 px per character of
    :func:`format_tokens`), centred on it. Kept first: the longest context, then the shortest, then the others from
    long to short, each only where its label clears every kept label by ``gap_px``. Contexts outside the axis
    are left out. Returns the kept contexts, sorted.
    """
    width = label_px or (lambda v: 7.0 * len(format_tokens(v)))
    if not (vmax > vmin) or axis_px <= 0:
        return []
    if log:
        if vmin <= 0:
            raise ValueError(f"a log axis needs vmin > 0; got {vmin!r}")
        lo, span = math.log(vmin), math.log(vmax) - math.log(vmin)
        place = lambda v: axis_px * (math.log(v) - lo) / span  # noqa: E731
    else:
        place = lambda v: axis_px * (v - vmin) / (vmax - vmin)  # noqa: E731
    inside = sorted({float(c) for c in contexts if c and c > 0 and vmin <= c <= vmax})
    if not inside:
        return []
    order = [inside[-1]] + ([inside[0]] if len(inside) > 1 else []) + inside[-2:0:-1]
    kept: list[tuple[float, float, float]] = []  # (value, left px, right px)
    for v in order:
        x, half = place(v), width(v) / 2.0
        left, right = x - half, x + half
        if all(right + gap_px <= k_left or left >= k_right + gap_px for _, k_left, k_right in kept):
            kept.append((v, left, right))
    return sorted(v for v, _, _ in kept)


def context_tick_rows(contexts: Sequence[float], vmin: float, vmax: float, axis_px: float, log: bool = True,
                      label_px: Callable[[float], float] | None = None, gap_px: float = 6.0,
                      rows: int = 2) -> list[list[float]]:
    """Up to ``rows`` rows of context ticks (pure): the first row as :func:`pick_context_ticks` picks it, each next
    row from the contexts the rows above left out, picked the same way. A context no row has room for is left
    unlabelled (its point is still drawn)."""
    out: list[list[float]] = []
    left = [float(c) for c in contexts]
    for _ in range(rows):
        row = pick_context_ticks(left, vmin, vmax, axis_px, log, label_px, gap_px)
        if not row:
            break
        out.append(row)
        left = [c for c in left if c not in row]
    return out


#: Rows of context tick labels: the second, one text line lower, holds what the first has no room for (128k beside
#: 185k on a narrow log axis).
TICK_ROWS = 2


class ContextLocator(mticker.Locator):
    """Ticks at the measured contexts that fit: row ``row`` of :func:`context_tick_rows` at draw time, with the
    axis's length in pixels, its view limits and its tick labels' font size then (so limits set after
    :func:`context_axis` count). :func:`context_axis` puts row 0 on the major ticks and row 1 on the minor ones,
    whose labels sit one line lower."""

    def __init__(self, contexts: Sequence[float], log: bool = True, row: int = 0) -> None:
        self.contexts = sorted({float(c) for c in contexts if c and c > 0})
        self.log = log
        self.row = row

    def __call__(self) -> list[float]:
        vmin, vmax = self.axis.get_view_interval()
        return self.tick_values(vmin, vmax)

    def tick_values(self, vmin: float, vmax: float) -> list[float]:
        vmin, vmax = sorted((vmin, vmax))
        axis = self.axis
        if axis is None or axis.axes is None:
            return [c for c in self.contexts if vmin <= c <= vmax]
        horizontal = axis.axis_name == "x"
        box = axis.axes.get_window_extent()
        font_px = self._font_pt(axis) * axis.axes.figure.dpi / 72.0
        if horizontal:
            label_px = lambda v: CHAR_EM * font_px * len(format_tokens(v))  # noqa: E731
        else:
            label_px = lambda v: 1.2 * font_px  # noqa: E731 - stacked labels: their height
        rows = context_tick_rows(self.contexts, vmin, vmax, box.width if horizontal else box.height, log=self.log,
                                 label_px=label_px, gap_px=GAP_EM * font_px, rows=TICK_ROWS if horizontal else 1)
        return rows[self.row] if self.row < len(rows) else []

    @staticmethod
    def _font_pt(axis: Any) -> float:
        """The tick labels' font size (a tick made with the axis's tick parameters; asking for the labels would
        call this locator again)."""
        try:
            return float(axis.majorTicks[0].label1.get_fontsize())
        except (AttributeError, IndexError):
            pass

        return float(FontProperties(size=mpl.rcParams[f"{axis.axis_name}tick.labelsize"]).get_size_in_points())


def context_axis(ax: Any, contexts: Sequence[float] | None = None, log: bool = True,
                 label: str = "context (tokens)", axis: str = "x") -> None:
    """Format ``ax``'s context axis: log scale (base 2), ticks at the measured contexts, '32k' labels, none
    overlapping: :class:`ContextLocator` keeps the longest and the shortest first, and on an x axis puts what the
    first row has no room for on a second row one line lower (the minor ticks)."""
    target = ax.xaxis if axis == "x" else ax.yaxis
    if log:
        (ax.set_xscale if axis == "x" else ax.set_yscale)("log", base=2)
    target.set_major_formatter(mticker.FuncFormatter(format_tokens))
    target.set_minor_formatter(mticker.NullFormatter())
    if contexts:
        target.set_major_locator(ContextLocator(contexts, log=log))
        if axis == "x":  # a second row, one line lower, for the labels the first has no room for
            target.set_minor_locator(ContextLocator(contexts, log=log, row=1))
            target.set_minor_formatter(mticker.FuncFormatter(format_tokens))
            size = ContextLocator._font_pt(target)
            major = target.majorTicks[0]
            ax.tick_params(axis="x", which="minor", length=major.tick1line.get_markersize(),
                           pad=major.get_pad() + 1.25 * size, labelsize=size)
        else:
            target.set_minor_locator(mticker.NullLocator())
    (ax.set_xlabel if axis == "x" else ax.set_ylabel)(label)


def source_note(ax: Any, text: str) -> None:
    """A small grey note in the plot's corner saying where the numbers came from."""
    # below the x label wherever the label ends up (a second row of context ticks moves it down), right-aligned
    ax.annotate(text, xy=(1.0, 0.0), xycoords=("axes fraction", ax.xaxis.label), xytext=(0, -3),
                textcoords="offset points", ha="right", va="top", fontsize=8, color="#666")


def roof(ax: Any, intensity_range: tuple[float, float], bandwidth_gbps: float, matmul_tflops: float | None) -> None:
    """The roof over ``intensity_range`` (FLOP per byte): min(matmul peak, intensity x bandwidth); only the memory
    slope when no matmul peak is known. Log axes, units on both."""
    lo, hi = intensity_range
    xs = np.logspace(np.log10(lo), np.log10(hi), 200)
    ys = xs * bandwidth_gbps / 1e3 if matmul_tflops is None else np.minimum(matmul_tflops, xs * bandwidth_gbps / 1e3)
    ax.plot(xs, ys, color="k", label=(f"roof: I x {bandwidth_gbps:,.0f} GB/s" if matmul_tflops is None else
                                      f"roof: min({matmul_tflops:,.0f} TFLOP/s, I x {bandwidth_gbps:,.0f} GB/s)"))
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("arithmetic intensity (FLOP per KV byte, log)")
    ax.set_ylabel("achieved (TFLOP/s, log)")
    ax.grid(True, which="both", alpha=0.3)


def show(fig: Any) -> None:
    """Show ``fig`` once in the notebook's output and close it (no second copy from the inline backend)."""
    import matplotlib.pyplot as plt  # noqa: PLC0415 - loads matplotlib.pyplot (costly: ARCHITECTURE.md, Imports)
    from IPython.display import display  # noqa: PLC0415 - loads IPython (costly: ARCHITECTURE.md, Imports)

    display(fig)
    plt.close(fig)
