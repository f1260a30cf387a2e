"""11's figures: distinct experts per pass against tokens per pass (with the uniform expectation), and ms per verify
step against tokens per step."""

from __future__ import annotations

from typing import Any

import matplotlib.pyplot as plt
import pandas as pd

from specdiag.plots import format_tokens, source_note
from specdiag.steps.moe_batch1.routing import expected_distinct


def distinct_vs_tokens(ax: Any, dt: pd.DataFrame, windows: pd.DataFrame, num_experts: int, top_k: int,
                       source: str = "measured") -> None:
    """Distinct experts per MoE layer per pass (median) against tokens per pass: the recorder's passes, the routed
    experts' windows, the uniform expectation (independent tokens: the most a pass touches on average) and top_k
    (every token alike: the least)."""
    ts = sorted({int(t) for t in pd.concat([dt.get("tokens", pd.Series(dtype=int)),
                                            windows.get("tokens", pd.Series(dtype=int))])} | {1, 16})
    grid = [t for t in range(1, max(ts) + 1)]
    ax.plot(grid, [expected_distinct(num_experts, top_k, t) for t in grid], color="k", linestyle="--",
            label="independent tokens (uniform expectation, computed)")
    ax.plot(grid, [top_k] * len(grid), color="grey", linestyle=":", label=f"every token alike (top_k = {top_k})")
    if not dt.empty:
        ax.plot(dt["tokens"], dt["distinct"], "o-", color="#1565c0", label=f"recorder: verify/decode passes ({source})")
    if not windows.empty:
        for part, g in windows.groupby("part"):
            g = g.groupby("tokens")["distinct"].median().reset_index()
            ax.plot(g["tokens"], g["distinct"], "s", color="#ef6c00" if part == "generated" else "#6a1b9a",
                    label=f"routed experts, {part} tokens in windows ({source})")
    ax.set_xscale("log", base=2)
    ax.set_xticks(ts)
    ax.set_xticklabels([str(t) for t in ts])
    ax.set_xlabel("tokens per pass (a verify step's scored tokens)")
    ax.set_ylabel("distinct experts per MoE layer")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7)
    source_note(ax, source)


def step_ms_vs_tokens(ax: Any, steps: pd.DataFrame, source: str = "measured") -> None:
    """ms per verify step against tokens per step, one line per context."""
    for ctx, g in steps.groupby("context_tokens"):
        g = g.sort_values("tokens_per_step")
        ax.plot(g["tokens_per_step"], g["step_ms"], "o-", label=f"{format_tokens(ctx)} tokens of context")
    ax.set_xscale("log", base=2)
    ts = sorted(steps["tokens_per_step"].unique())
    ax.set_xticks(ts)
    ax.set_xticklabels([str(int(t)) for t in ts])
    ax.set_xlabel("tokens per verify step")
    ax.set_ylabel("ms per verify step (median)")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    source_note(ax, source)


def figure(dt: pd.DataFrame, windows: pd.DataFrame, steps: pd.DataFrame, num_experts: int, top_k: int,
           source: str = "measured") -> Any:
    n = 2 if not steps.empty else 1
    fig, axes = plt.subplots(1, n, figsize=(6.2 * n, 4.3), squeeze=False)
    distinct_vs_tokens(axes[0][0], dt, windows, num_experts, top_k, source)
    if n == 2:
        step_ms_vs_tokens(axes[0][1], steps, source)
    fig.tight_layout()
    return fig
