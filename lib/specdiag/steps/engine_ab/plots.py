"""09's figures, one function a plot drawing on the Axes it is given; units on every axis, contexts as 16k/128k.

Hollow markers: a number that is not the arm's own (a TTFT measured while other arms prefilled, a decode another
arm's request overlapped)."""

from __future__ import annotations

import math
from typing import Any, Sequence

import matplotlib.ticker as mticker
import pandas as pd

from specdiag.plots import context_axis, source_note

PALETTE = ("#c62828", "#2e7d32", "#00838f", "#6a1b9a", "#ef6c00", "#0d47a1", "#6d4c41", "#546e7a")
MARKERS = ("v", "P", "<", "D", "^", "o", "s", "X")


def arm_style(arms: Sequence[str]) -> dict[str, dict[str, Any]]:
    """One colour and marker per arm, in the run's arm order (the same on every plot of the page)."""
    return {a: {"color": PALETTE[i % len(PALETTE)], "marker": MARKERS[i % len(MARKERS)]} for i, a in enumerate(arms)}


def _log_y(ax: Any) -> None:
    """A log y axis with plain numbers (20, 0.001), the in-between ticks labelled when it spans few decades."""
    ax.set_yscale("log")

    def minor(v: float, _pos: Any) -> str:
        lo, hi = ax.get_ylim()
        few = lo > 0 and math.log10(hi / lo) < 1.2  # under about a decade: label 2, 3, 4, ... too
        return f"{v:g}" if few and round(v / 10 ** math.floor(math.log10(v)), 6) in (2, 3, 4, 5, 6, 8) else ""

    ax.yaxis.set_major_formatter(mticker.FuncFormatter(lambda v, _pos: f"{v:g}"))
    ax.yaxis.set_minor_formatter(mticker.FuncFormatter(minor))


def _lines(ax: Any, df: pd.DataFrame, value: str, flag: str, styles: dict[str, dict[str, Any]]) -> list[int]:
    contexts: list[int] = []
    for arm, g in df.groupby("arm", sort=False):
        g = g.sort_values("context_tokens")
        st = styles.get(str(arm), {"color": "grey", "marker": "o"})
        ax.plot(g["context_tokens"], g[value], color=st["color"], linewidth=1.2, label=str(arm))
        for own, h in g.groupby(g[flag].astype(bool)):
            ax.scatter(h["context_tokens"], h[value], s=42, marker=st["marker"], zorder=3,
                       facecolors=st["color"] if own else "white", edgecolors=st["color"], linewidths=1.4)
        contexts += [int(c) for c in g["context_tokens"]]
    return sorted(set(contexts))


def _finish(ax: Any, ctx: list[int], ylabel: str, title: str, source: str, legend: bool = True) -> None:
    """The axes every 09 figure shares: log y, context ticks (1k, 32k, 128k), grid, legend, source note."""
    _log_y(ax)
    ax.set_ylabel(ylabel)
    context_axis(ax, ctx)
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    if legend:
        many = len(ax.get_legend_handles_labels()[0]) > 8  # beside the axes, where it hides no line
        if many:
            w, h = ax.figure.get_size_inches()
            ax.figure.set_size_inches(w + 5.5, h)
        ax.legend(fontsize=8, **({"loc": "upper left", "bbox_to_anchor": (1.01, 1.0), "borderaxespad": 0.0}
                                 if many else {}))
    source_note(ax, source)


def step_ms_vs_context(ax: Any, dec: pd.DataFrame, styles: dict[str, dict[str, Any]], source: str = "measured") -> None:
    """Median ms per verify step of each arm against context (log-log)."""
    ctx = _lines(ax, dec, "step_ms", "clean", styles)
    _finish(ax, ctx, "ms per verify step (median, log)", "Decode: time per verify step", source)


def decode_tok_s_vs_context(ax: Any, dec: pd.DataFrame, styles: dict[str, dict[str, Any]],
                            source: str = "computed") -> None:
    """Decode tokens/s of each arm's first request at each context (fresh text for NGRAM: the later requests on
    the same prompt draft from the arm's own earlier output)."""
    d = dec.dropna(subset=["decode_tok_s_first"])
    ctx = _lines(ax, d, "decode_tok_s_first", "clean", styles)
    _finish(ax, ctx, "decode tokens/s, first request (log)", "Decode tokens/s", source, legend=False)


def ttft_vs_context(ax: Any, floors: pd.DataFrame, styles: dict[str, dict[str, Any]], source: str = "measured") -> None:
    """Each arm's TTFT against context, hollow where not its own, over the prefill floor (dashed, computed)."""
    ctx = _lines(ax, floors, "ttft_s", "own", styles)
    fl = floors.drop_duplicates("context_tokens").sort_values("context_tokens")
    if not fl.empty:
        ax.plot(fl["context_tokens"], fl["floor_s"], color="k", linestyle="--", linewidth=1,
                label="prefill floor (computed)")
    _finish(ax, ctx, "time to first token (s, log)", "Prefill: TTFT against its floor", source)


#: (colour, marker) of the speculation-off arms, in the order drawn
OFF_SHADES = (("#333333", "s"), ("#888888", "v"), ("#555555", "X"), ("#aaaaaa", "P"))


def _kind_words(kind: str) -> str:
    """'predictable text'; the first-request line: 'at the first request's commit'."""
    return "at the first request's commit" if kind == "first request" else f"{kind} text"


def tok_s_on_off(ax: Any, cells: Sequence[Any], evens: Sequence[Any], styles: dict[str, dict[str, Any]],
                 source: str = "measured") -> None:
    """Decode tokens/s against context of each speculating arm (solid on novel prose; dash-dot on another text kind
    the run measured; dotted: a text kind computed from 04's commits) and of its speculation-off twin (dashed, grey;
    square markers on novel prose, diamonds on another kind), medians over requests; the bracket of measured contexts
    a measured line stops or starts paying between shaded (:mod:`.breakeven`), a vertical line where the ratio crosses
    1 inside it (interpolated). ``cells``: :class:`.breakeven.Cell`s."""
    contexts: list[int] = []
    offs_drawn: set[tuple[str, str]] = set()
    for (arm, kind, src), group in _groups(cells).items():
        g = sorted(group, key=lambda c: c.context_tokens)
        st = styles.get(arm, {"color": "grey", "marker": "o"})
        xs = [c.context_tokens for c in g]
        computed = src == "computed"
        novel = kind == "novel"
        ax.plot(xs, [c.on_tok_s for c in g], color=st["color"], marker=st["marker"], linewidth=1.2,
                linestyle=":" if computed else "-" if novel else "-.",
                markerfacecolor="white" if computed else st["color"],
                label=(f"{arm}, {_kind_words(kind)} ({src})" if computed else f"{arm} (speculation on)" if novel
                       else f"{arm}, {kind} text (speculation on)"))
        off = g[0].off_arm
        if (off, kind) not in offs_drawn and not computed:
            # each off arm its own grey and marker: two off arms (triton_nospec, flashinfer_nospec) stay apart
            shade = OFF_SHADES[len(offs_drawn) % len(OFF_SHADES)]
            ax.plot(xs, [c.off_tok_s for c in g], color=shade[0], marker=shade[1] if novel else "D", linewidth=1.2,
                    linestyle="--", label=f"{off} (speculation off)" if novel else f"{off}, {kind} text (speculation off)")
            offs_drawn.add((off, kind))
        contexts += xs
    for b in evens:
        if b.outcome not in ("crosses", "starts") or (b.source != "measured" and b.kind != "first request"):
            continue
        color = styles.get(b.arm, {"color": "grey"})["color"]
        novel = b.kind == "novel"
        if b.context_tokens is not None:
            ax.axvline(b.context_tokens, color=color, linewidth=1, linestyle="-." if novel else ":")
        lo = b.lo_tokens if b.lo_tokens is not None else min(b.contexts)
        hi = b.hi_tokens if b.hi_tokens is not None else max(b.contexts)
        ax.axvspan(lo, hi, color=color, alpha=0.08 if novel else 0.04,
                   label=f"{b.arm}{'' if novel else ', ' + _kind_words(b.kind)}: "
                         f"{'stops' if b.outcome == 'crosses' else 'starts'} paying in this bracket (measured ends; "
                         "the line inside it interpolated)")
    dotted = any(src == "computed" for _a, _k, src in _groups(cells))
    _finish(ax, sorted(set(contexts)), "decode tokens/s (median over requests, log)",
            "Decode tokens/s, speculation on and off",
            source + ("; dotted: computed, a commit from elsewhere (04's, or the first request's) x 09's measured steps"
                      if dotted else ""))


def _groups(cells: Sequence[Any]) -> dict[tuple[str, str, str], list[Any]]:
    out: dict[tuple[str, str, str], list[Any]] = {}
    for c in cells:
        if c.on_tok_s is not None and c.off_tok_s is not None:
            out.setdefault((c.arm, c.kind, c.source), []).append(c)
    return out
