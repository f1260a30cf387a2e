"""Plots of the commit probe (notebook 04): commit length vs context (on a given Axes), per-step commit
histograms (a grid of panels, returned as a Figure)."""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import matplotlib.pyplot as plt

from specdiag import plots

KIND_STYLE = {"predictable": dict(marker="o", color="#1f77b4"), "novel": dict(marker="s", color="#d62728")}


def commit_vs_context(ax: Any, summary: Sequence[Mapping[str, Any]], rows: Sequence[Mapping[str, Any]],
                      max_commit_length: int | None, source: str) -> None:
    """Pooled commit length per context for each kind (lines), every request (dots), the maximum (dashed)."""
    contexts = sorted({int(s["context_tokens"]) for s in summary})
    for kind in ("predictable", "novel"):
        pts = sorted((s["context_tokens"], s["commit_length"]) for s in summary if s["kind"] == kind)
        if not pts:
            continue
        style = KIND_STYLE[kind]
        ax.plot([c for c, _ in pts], [v for _, v in pts], "-", marker=style["marker"], color=style["color"],
                label=f"{kind} (pooled per context)")
        dots = [(r["context_tokens"], r["commit_length"]) for r in rows
                if (r.get("kind") or "predictable") == kind and not r.get("error") and r.get("commit_length")]
        ax.scatter([c for c, _ in dots], [v for _, v in dots], s=14, alpha=0.5, color=style["color"])
    if max_commit_length:
        ax.axhline(max_commit_length, ls="--", color="#555",
                   label=f"maximum: {max_commit_length} (speculative_num_draft_tokens)")
    plots.context_axis(ax, contexts)
    ax.set_ylabel("commit length (tokens per verify step)")
    ax.set_ylim(0, (max_commit_length or max((s["commit_length"] for s in summary), default=1)) + 1)
    ax.set_title("Commit length vs context: predictable vs novel text")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="center right")
    plots.source_note(ax, f"{source}; commit = (new tokens − 1) / verify steps")


def step_histograms(hists: Mapping[tuple[str, int], Sequence[int]], max_commit_length: int | None,
                    source: str) -> Any:
    """Share of verify steps per commit length, one panel per (kind, context)."""
    keys = sorted(hists, key=lambda k: (k[0] != "predictable", k[1]))
    kinds = [k for k in ("predictable", "novel") if any(key[0] == k for key in keys)]
    contexts = sorted({c for _, c in keys})
    fig, axes = plt.subplots(len(kinds), len(contexts), figsize=(2.6 * len(contexts) + 1, 2.4 * len(kinds)),
                             squeeze=False, sharey=True)
    top = max_commit_length or max((len(h) - 1 for h in hists.values()), default=1)
    for i, kind in enumerate(kinds):
        for j, ctx_tokens in enumerate(contexts):
            ax = axes[i][j]
            hist = list(hists.get((kind, ctx_tokens), []))
            total = sum(hist)
            if total:
                xs = list(range(1, len(hist)))
                ax.bar(xs, [hist[x] / total for x in xs], color=KIND_STYLE[kind]["color"])
                ax.set_title(f"{kind}, {plots.format_tokens(ctx_tokens)}: {total} steps", fontsize=9)
            else:
                ax.set_title(f"{kind}, {plots.format_tokens(ctx_tokens)}: no steps", fontsize=9)
            ax.set_xlim(0.4, top + 0.6)
            ax.set_xticks(range(1, top + 1))
            if i == len(kinds) - 1:
                ax.set_xlabel("commit length (tokens)")
            if j == 0:
                ax.set_ylabel("share of verify steps")
            ax.grid(alpha=0.3, axis="y")
    fig.suptitle(f"Per-step commit lengths ({source})", fontsize=10)
    fig.tight_layout()
    return fig
