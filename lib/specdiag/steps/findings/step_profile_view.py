"""08_compare_runs' view of the runs' ``step_profile`` tables: where a decode step's time goes, per run,
arm and context (medians over the complete steps of each trace; see :mod:`specdiag.telemetry.torch_trace`)."""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from specdiag import plots
from specdiag.telemetry.torch_trace import class_names, summarize

#: Columns shown besides the kernel classes and CPU phases, in order.
HEAD = ("run", "arm", "context_tokens", "steps", "wall_ms", "gpu_busy_ms", "gpu_idle_ms", "gpu_idle_in_window_ms",
        "graph_launches")


def _groups(rows: Sequence[Mapping[str, Any]]) -> dict[tuple[str, int], list[Mapping[str, Any]]]:
    """Rows by (arm, context_tokens), in order of first appearance."""
    out: dict[tuple[str, int], list[Mapping[str, Any]]] = {}
    for r in rows:
        out.setdefault((str(r.get("arm", "")), int(r.get("context_tokens") or 0)), []).append(r)
    return out


def profile_table(rows_by_run: Mapping[str, Sequence[Mapping[str, Any]]]) -> list[dict[str, Any]]:
    """One row per (run, arm, context): complete steps counted and the median of every numeric column
    (wall, GPU busy/idle, GPU ms per kernel class, CPU ms per phase). [] when no run has step-profile rows."""
    out = []
    for label, rows in rows_by_run.items():
        for (arm, ctx), grp in _groups(rows).items():
            s = summarize(grp)
            out.append({"run": label, "arm": arm, "context_tokens": ctx, "steps": s["steps"],
                        "steps_excluded": len(s["steps_excluded"]), "trace_file": grp[0].get("trace_file"),
                        **s["median"]})
    return sorted(out, key=lambda r: (r["run"], r["arm"], r["context_tokens"]))


def shown_classes(table: Sequence[Mapping[str, Any]]) -> list[str]:
    """The kernel classes with time in any row, in the class table's order."""
    return [c for c in class_names() if any(r.get(f"gpu_{c}_ms") for r in table)]


def table_columns(table: Sequence[Mapping[str, Any]]) -> dict[str, str]:
    """Column key -> label with unit, for :func:`specdiag.tables.styled`."""
    labels = {"run": "run", "arm": "arm", "context_tokens": "context (tokens)", "steps": "steps",
              "wall_ms": "wall (ms)", "gpu_busy_ms": "GPU busy (ms)", "gpu_idle_ms": "GPU idle (ms)",
              "gpu_idle_in_window_ms": "GPU idle in window (ms)", "graph_launches": "graph launches"}
    cols = {k: labels[k] for k in HEAD}
    cols.update({f"gpu_{c}_ms": f"GPU {c} (ms)" for c in shown_classes(table)})
    phases = sorted({k for r in table for k, v in r.items() if k.startswith("cpu_") and v})
    cols.update({k: f"CPU {k[4:-3]} (ms)" for k in phases})
    return cols


def plot_profile(table: Sequence[Mapping[str, Any]], note: str = "measured: torch profiler traces") -> Any:
    """Stacked bars, one panel per run: per (arm, context), the median ms per step of each kernel class and
    of GPU idle (wall - busy, shown from 0 when negative), with the median wall time as a black tick."""
    import matplotlib.pyplot as plt  # noqa: PLC0415 - loads matplotlib.pyplot (costly: ARCHITECTURE.md, Imports)

    runs = sorted({r["run"] for r in table})
    classes = shown_classes(table)
    fig, axes = plt.subplots(1, len(runs), figsize=(max(6.0, 3.5 + 1.3 * len(table)), 4.5), sharey=True,
                             squeeze=False)
    for ax, run in zip(axes[0], runs):
        bars = [r for r in table if r["run"] == run and r["steps"]]  # a trace with no complete step has no medians
        one_arm = len({r["arm"] for r in bars}) == 1
        x = list(range(len(bars)))
        bottom = [0.0] * len(bars)
        for c in classes:
            h = [float(r.get(f"gpu_{c}_ms") or 0.0) for r in bars]
            ax.bar(x, h, bottom=bottom, color=plots.kernel_class_color(c), label=f"GPU {c}")
            bottom = [b + v for b, v in zip(bottom, h)]
        idle = [max(0.0, float(r.get("gpu_idle_ms") or 0.0)) for r in bars]
        ax.bar(x, idle, bottom=bottom, color="white", edgecolor="#555", hatch="//", label="GPU idle (wall - busy)")
        ax.plot(x, [r["wall_ms"] for r in bars], "k_", markersize=28, markeredgewidth=2, label="wall (median)")
        ticks = [plots.format_tokens(r["context_tokens"]) if one_arm
                 else f"{r['arm']}\n{plots.format_tokens(r['context_tokens'])}" for r in bars]
        ax.set_xticks(x)
        ax.set_xticklabels(ticks)
        ax.set_xlabel("context (tokens)" + (f", arm {bars[0]['arm']}" if one_arm else ""))
        ax.set_title(f"run {run}: where a decode step's time goes")
        ax.grid(axis="y", alpha=0.3)
    axes[0][0].set_ylabel("median time per decode step (ms)")
    handles, labels = axes[0][0].get_legend_handles_labels()
    order = [labels.index("wall (median)")] + [i for i in reversed(range(len(labels))) if labels[i] != "wall (median)"]
    fig.legend([handles[i] for i in order], [labels[i] for i in order], loc="center left", bbox_to_anchor=(1.0, 0.5),
               fontsize=8)  # top of the stack first
    steps = sorted({r["steps"] for r in table if r["steps"]})
    fig.tight_layout()
    fig.text(0.99, 0.0, f"{note}; medians over {'/'.join(map(str, steps))} complete steps per bar", ha="right",
             va="top", fontsize=8, color="#666")
    return fig


def profile_metrics(table: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The key numbers of each bar, for the notebook's result JSON."""
    keep = ("run", "arm", "context_tokens", "steps", "wall_ms", "gpu_busy_ms", "gpu_idle_ms")
    return [{k: r.get(k) for k in keep} | {f"gpu_{c}_ms": r.get(f"gpu_{c}_ms") for c in shown_classes(table)}
            for r in table]
