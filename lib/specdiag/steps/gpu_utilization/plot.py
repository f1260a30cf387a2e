"""The utilization timeline: one device's samples against one request's phases."""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import matplotlib.pyplot as plt

from specdiag.steps.gpu_utilization.analysis import CPU_BUSIEST, PhaseWindows, label_rows

PHASE_COLORS = {"prefill": "#ffcc80", "decode": "#bbdefb"}

#: (column, label) per panel; a panel is drawn only when its device has values for it.
GPU_PERCENT = (("gpu_util_pct", "utilization.gpu (time a kernel ran)"),
               ("sm_active_pct", "SM activity (GPM)"),
               ("mem_util_pct", "utilization.memory (time memory was accessed)"),
               ("sm_occupancy_pct", "SM occupancy (GPM)"))
DRAM_PANEL = "DRAM bandwidth (% of peak)"
CPU_PERCENT = (("cpu_util_pct", "CPU, mean of all cores"), (CPU_BUSIEST, "busiest core"))


def _series(rows: Sequence[Mapping[str, Any]], column: str) -> tuple[list[float], list[float]]:
    xs, ys = [], []
    for r in rows:
        if column == CPU_BUSIEST:
            v = max(r["cpu_core_pct"]) if r.get("cpu_core_pct") else None
        else:
            v = r.get(column)
        if v is not None:
            xs.append(r["t_rel_s"])
            ys.append(float(v))
    return xs, ys


def plot_timeline(rows: Sequence[Mapping[str, Any]], windows: PhaseWindows, device: str,
                  chunk_t_s: Sequence[float] = (), predicted_bw_util_pct: float | None = None,
                  title: str = "", note: str = "measured") -> Any:
    """A figure of stacked panels sharing the time axis (seconds after the request was sent):
    utilization in percent, DRAM bandwidth in percent of peak (on its own scale, with the predicted
    value as a dashed line when given), clocks in MHz, power in W and memory used in GiB, each drawn
    when the device reports it; prefill and decode shaded; chunk arrivals as ticks on the top panel."""
    dev_rows = [r for r in label_rows(rows, windows) if str(r.get("device")) == device and not r.get("error")]
    is_cpu = any(r.get("source") == "cpu" for r in dev_rows)
    panels: list[tuple[str, list[tuple[str, str]]]] = [("utilization (%)", list(CPU_PERCENT if is_cpu else GPU_PERCENT))]
    if not is_cpu:
        panels.append((DRAM_PANEL, [("dram_bw_util_pct", "measured (GPM / DCGM)")]))
        panels.append(("clock (MHz)", [("sm_clock_mhz", "SM clock"), ("mem_clock_mhz", "memory clock")]))
        panels.append(("power (W)", [("power_w", "board power")]))
    panels.append(("memory used (GiB)", [("mem_used_gib", "host memory used" if is_cpu else "device memory used")]))
    for r in dev_rows:
        r["mem_used_gib"] = r["mem_used_mib"] / 1024 if r.get("mem_used_mib") is not None else None
    panels = [(label, [c for c in cols if _series(dev_rows, c[0])[0]]) for label, cols in panels]
    panels = [p for p in panels if p[1]]
    if not panels:
        raise ValueError(f"device {device!r} has no samples to plot")

    fig, axes = plt.subplots(len(panels), 1, sharex=True, figsize=(11, 1.2 + 2.0 * len(panels)), squeeze=False)
    axes = axes[:, 0]
    for ax, (label, cols) in zip(axes, panels):
        for phase, color in PHASE_COLORS.items():
            span = windows.span(phase)
            if span:
                ax.axvspan(span[0] - windows.t_send_unix_s, span[1] - windows.t_send_unix_s, color=color,
                           alpha=0.6, lw=0, label=phase if ax is axes[0] else None)
        for column, name in cols:
            xs, ys = _series(dev_rows, column)
            ax.plot(xs, ys, lw=1.0, label=name, drawstyle="steps-post" if column.endswith("pct") else "default")
        ax.set_ylabel(label)
        ax.ticklabel_format(axis="y", useOffset=False, style="plain")
        ax.grid(alpha=0.3)
    top = axes[0]
    top.set_ylim(-2, 108)
    if chunk_t_s:
        top.plot(list(chunk_t_s), [104.0] * len(chunk_t_s), "|", color="#333", ms=6, label="token chunk arrives")
    dram_axes = [ax for ax, (label, _c) in zip(axes, panels) if label == DRAM_PANEL]
    if predicted_bw_util_pct is not None and dram_axes:
        dram_axes[0].axhline(predicted_bw_util_pct, color="#c62828", ls="--", lw=1,
                             label=f"predicted by the bandwidth analysis ({predicted_bw_util_pct:.2g} %)")
        dram_axes[0].set_ylim(bottom=0)
    top.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)
    for ax in axes[1:]:
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)
    axes[-1].set_xlabel("time after the request was sent (s)")
    name = dev_rows[0].get("device_name") if dev_rows else None
    top.set_title(title or f"device {device}" + (f" ({name})" if name else ""), loc="left")
    top.annotate(note, xy=(1.0, 1.02), xycoords="axes fraction", ha="right", va="bottom", fontsize=8, color="#666")
    fig.tight_layout()
    return fig
