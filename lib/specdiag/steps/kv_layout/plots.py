"""10's figure: ms per verify step fresh against fragmented, per arm and context, with each request's layout."""

from __future__ import annotations

from typing import Any

import matplotlib.pyplot as plt
import pandas as pd

from specdiag.plots import format_tokens, source_note

STATE_STYLE = {"fresh": dict(color="#1565c0"), "fragmented": dict(color="#ef6c00", hatch="//")}


def step_bars(ax: Any, summ: pd.DataFrame, source: str = "measured") -> None:
    """Bars: ms per verify step (median of the step samples) for each arm x context, fresh beside fragmented; the
    label above each bar is the share of its tokens in runs of at least 64 slots."""
    if summ.empty:
        ax.set_axis_off()
        return
    groups = list(summ[["arm", "context_tokens"]].drop_duplicates().itertuples(index=False, name=None))
    width = 0.38
    for i, state in enumerate(("fresh", "fragmented")):
        sel = summ[summ["pool_state"] == state].set_index(["arm", "context_tokens"])
        xs, ys, shares = [], [], []
        for j, key in enumerate(groups):
            if key in sel.index and pd.notna(sel.loc[key, "step_ms"]):
                xs.append(j + (i - 0.5) * width)
                ys.append(float(sel.loc[key, "step_ms"]))
                shares.append(sel.loc[key, "share_in_long_runs"])
        ax.bar(xs, ys, width, label=f"{state} pool", edgecolor="k", linewidth=0.5, **STATE_STYLE[state])
        for x, y, s in zip(xs, ys, shares):
            ax.text(x, y, "" if s is None or s != s else f"{100 * s:.0f}%", ha="center", va="bottom", fontsize=7)
    ax.set_xticks(range(len(groups)))
    ax.set_xticklabels([f"{a}\n{format_tokens(c)}" for a, c in groups], fontsize=8)
    ax.set_ylabel("ms per verify step (median of steps)")
    ax.set_title("Verify step on a fresh and a fragmented pool (label: tokens in runs >= 64 slots)")
    ax.legend(fontsize=8)
    ax.grid(True, axis="y", alpha=0.3)
    source_note(ax, source)


def figure(summ: pd.DataFrame, source: str = "measured") -> Any:
    n = max(1, len(summ[["arm", "context_tokens"]].drop_duplicates())) if not summ.empty else 1
    fig, ax = plt.subplots(figsize=(max(6.0, 1.6 * n + 2), 4.2))
    step_bars(ax, summ, source)
    fig.tight_layout()
    return fig
