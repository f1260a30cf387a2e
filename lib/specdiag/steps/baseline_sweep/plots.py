"""01's figures: decode speed and time per verify step against context, one point per request and the line through
the per-context medians (the step-time fit drawn when there is one)."""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import matplotlib.pyplot as plt

from specdiag import plots


def decode_figure(ok_rows: Sequence[Mapping[str, Any]], summary: Sequence[Mapping[str, Any]], source: str) -> Any:
    """Decode tokens per second per request and the per-context medians; None when no request gave a rate."""
    dec = [(r["context_tokens"], r["decode_tok_s"]) for r in ok_rows if r.get("decode_tok_s")]
    med = [(s["context_tokens"], s["decode_tok_s"]) for s in summary if s.get("decode_tok_s")]
    if not dec:
        return None
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.scatter([c for c, _ in dec], [d for _, d in dec], s=18, alpha=0.6, label=f"one request ({source})")
    ax.plot([c for c, _ in med], [d for _, d in med], "o-", label="median per context")
    plots.context_axis(ax, [c for c, _ in med])
    ax.set_ylabel("decode speed (tokens/s)")
    ax.set_ylim(bottom=0)
    ax.set_title("Decode speed vs context")
    ax.grid(alpha=0.3)
    ax.legend()
    plots.source_note(ax, f"{source}; decode = tokens after the first / (last chunk − first chunk time)")
    return fig


def step_figure(ok_rows: Sequence[Mapping[str, Any]], steps: Sequence[tuple[int, float]], step_fit: Any,
                source: str) -> Any:
    """ms per verify step per request, the per-context medians (``steps``) and the least-squares line through them
    (``step_fit``, :func:`specdiag.stats.fit_line`, or None); None when no context gave a step time."""
    if not steps:
        return None
    fig, ax = plt.subplots(figsize=(7, 4))
    per_req = [(r["context_tokens"], r["step_ms"]) for r in ok_rows if r.get("step_ms")]
    ax.scatter([c for c, _ in per_req], [m for _, m in per_req], s=18, alpha=0.6, label=f"one request ({source})")
    ax.plot([c for c, _ in steps], [m for _, m in steps], "o", label="median per context")
    if step_fit is not None:
        xs = [0, max(c for c, _ in steps)]
        ax.plot(xs, [step_fit.predict(x) for x in xs], "--",
                label=f"least squares: {step_fit.slope_per_1k:.3g} ms per 1k tokens (r² {step_fit.r2:.3f})")
    plots.context_axis(ax, [c for c, _ in steps], log=False)
    ax.set_ylabel("time per verify step (ms)")
    ax.set_xlim(left=0)
    ax.set_ylim(bottom=0)
    ax.set_title("Verify step time vs context")
    ax.grid(alpha=0.3)
    ax.legend()
    plots.source_note(ax, f"{source}; step = decode window / verify steps in it")
    return fig
