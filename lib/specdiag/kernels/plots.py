"""Plots of the kernel A/B: effective GB/s vs context, the page-size effect, the roofline.

One function a plot, each drawing on a given matplotlib Axes, units on every axis, context axes
through :func:`specdiag.plots.context_axis`.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import pandas as pd

from specdiag.kernels.analysis import page_size_effect
from specdiag.plots import context_axis, source_note

KERNEL_STYLE = {
    "baseline_p1": dict(color="#c62828", marker="v", label="baseline (SGLang structure), page_size 1"),
    "split_p1": dict(color="#1565c0", marker="o", label="split-KV, page_size 1"),
    "split_b64": dict(color="#2e7d32", marker="s", label="split-KV, 64-token blocks"),
    "fused_p1": dict(color="#6a1b9a", marker="D", label="single-launch split-KV, page_size 1"),
    "fused_b64": dict(color="#ad1457", marker="P", label="single-launch split-KV, 64-token blocks"),
    "fused_fp8_p1": dict(color="#ef6c00", marker="x", label="single-launch, fp8 KV, page_size 1"),
    "fused_fp8_b64": dict(color="#f9a825", marker="X", label="single-launch, fp8 KV, 64-token blocks"),
    "fused_self_p1": dict(color="#4527a0", marker="d", label="single launch, merge in the launch at every tile, page_size 1"),
    "split_n32s5_p1": dict(color="#42a5f5", marker="h", label="split-KV, 32-token tiles, 5 stages at 64-row tiles"),
    "split_qk1_p1": dict(color="#0d47a1", marker="H", label="split-KV, 32-token tiles, 5 stages, scores once per tile"),
    "sglang_splitkv_p1": dict(color="#5d4037", marker="^", label="SGLang 0.5.17 upstream split-KV verify"),
    "flashinfer_mla_p1": dict(color="#00838f", marker="<", label="FlashInfer MLA, page_size 1"),
    "flashinfer_mla_b64": dict(color="#00695c", marker=">", label="FlashInfer MLA, 64-token blocks"),
}


def gbps_vs_context(ax: Any, df: pd.DataFrame, copy_gbps: float, heads: int, draft_tokens: int,
                    layouts: Sequence[str] = ("shuffled_p1", "shuffled_b64"), source: str = "measured") -> None:
    """Effective GB/s (KV bytes read once / time) per kernel vs context, with the copy-bandwidth line."""
    sel = df[(df["heads"] == heads) & (df["draft_tokens"] == draft_tokens) & df["layout"].isin(layouts)]
    for (kernel, layout), g in sel.groupby(["kernel", "layout"]):
        g = g.sort_values("context_tokens")
        style = dict(KERNEL_STYLE.get(kernel, {}))
        style["label"] = f"{style.get('label', kernel)} ({layout})"
        ax.plot(g["context_tokens"], g["gbps"], linestyle="-" if layout == "shuffled_p1" else "--", **style)
    ax.axhline(copy_gbps, color="k", linestyle=":", label=f"device copy {copy_gbps:,.0f} GB/s")
    ax.set_yscale("log")
    ax.set_ylabel("effective KV bandwidth (GB/s, log)")
    context_axis(ax, sorted(sel["context_tokens"].unique()))
    ax.set_title(f"H={heads} heads x T={draft_tokens} draft tokens")
    ax.grid(True, which="both", alpha=0.3)
    source_note(ax, source)


def page_size_plot(ax: Any, df: pd.DataFrame, source: str = "measured") -> None:
    """Split-KV time with page_size 1 (shuffled_p1) over 64-token blocks (shuffled_b64), per shape vs context."""
    pse = page_size_effect(df)
    colors = {1: "#1565c0", 8: "#ef6c00", 16: "#2e7d32", 64: "#6a1b9a"}
    dashes = {8: "-", 16: "--", 128: ":"}
    for (h, t), g in pse.groupby(["heads", "draft_tokens"]):
        g = g.sort_values("context_tokens")
        ax.plot(g["context_tokens"], g["p1_over_b64"], marker="o", color=colors.get(int(t)),
                linestyle=dashes.get(int(h), "-."), label=f"H={h} T={t}")
    ax.axhline(1.0, color="k", linewidth=0.8)
    ax.axhspan(0.9, 1.1, color="#2e7d32", alpha=0.08, label="within 10 %")
    ax.set_ylabel("time page_size 1 / time 64-token blocks (ratio)")
    context_axis(ax, sorted(pse["context_tokens"].unique()) if not pse.empty else None)
    ax.legend(fontsize=7, ncol=2)
    ax.grid(True, alpha=0.3)
    source_note(ax, source)


def roof(ax: Any, intensity_range: tuple[float, float], bandwidth_gbps: float, matmul_tflops: float | None,
         bandwidth_label: str = "") -> None:
    """The roof over ``intensity_range`` (FLOP per byte): min(matmul peak, intensity x bandwidth); only the
    memory slope when no matmul peak is known. Log axes, units on both."""
    lo, hi = intensity_range
    xs = np.logspace(np.log10(lo), np.log10(hi), 200)
    ys = xs * bandwidth_gbps / 1e3 if matmul_tflops is None else np.minimum(matmul_tflops, xs * bandwidth_gbps / 1e3)
    bw = bandwidth_label or f"{bandwidth_gbps:,.0f} GB/s"
    ax.plot(xs, ys, color="k", label=(f"roof: I x {bw}" if matmul_tflops is None else
                                      f"roof: min({matmul_tflops:,.0f} TFLOP/s, I x {bw})"))
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("arithmetic intensity (FLOP per KV byte, log)")
    ax.set_ylabel("achieved (TFLOP/s, log)")
    ax.grid(True, which="both", alpha=0.3)


def roofline(ax: Any, df: pd.DataFrame, copy_gbps: float, matmul_tflops: float | None, source: str = "measured",
             group: str = "kernel", styles: dict[str, dict[str, Any]] | None = None,
             bandwidth_label: str = "") -> None:
    """Points on the roofline: achieved TFLOP/s (``tflops``) vs arithmetic intensity (``intensity_flop_per_byte``),
    one series per value of ``group`` (kernels by default, styled by :data:`KERNEL_STYLE`), under :func:`roof`.
    The intensity range spans the points and the ridge (matmul peak / bandwidth) with a margin."""
    styles = KERNEL_STYLE if styles is None else styles
    x = df["intensity_flop_per_byte"]
    ridge = [matmul_tflops * 1e3 / copy_gbps] if matmul_tflops else []
    lo, hi = min([float(x.min())] + ridge), max([float(x.max())] + ridge)
    roof(ax, (max(0.05, lo / 4), hi * 4), copy_gbps, matmul_tflops, bandwidth_label)
    for name, g in df.groupby(group, sort=False):
        style = styles.get(name, {})
        ax.scatter(g["intensity_flop_per_byte"], g["tflops"], s=14 if len(df) > 20 else 30,
                   alpha=0.6 if len(df) > 20 else 1.0, color=style.get("color"), marker=style.get("marker", "o"),
                   label=style.get("label", name), zorder=3)
    ax.legend(fontsize=7)
    source_note(ax, source)


def kernels_at_case(ax: Any, df: pd.DataFrame, copy_gbps: float, context_tokens: int, heads: int, draft_tokens: int,
                    layout: str = "shuffled_b64", source: str = "measured") -> None:
    """Per kernel (ours, fp8, anchors) at one case: % of the copy bandwidth (bf16-equivalent bytes), horizontal bars."""
    sel = df[(df["context_tokens"] == context_tokens) & (df["heads"] == heads) & (df["draft_tokens"] == draft_tokens)
             & (df["layout"] == layout)].sort_values("ms_median", ascending=False)
    labels = [KERNEL_STYLE.get(k, {}).get("label", k) for k in sel["kernel"]]
    colors = [KERNEL_STYLE.get(k, {}).get("color", "grey") for k in sel["kernel"]]
    ax.barh(labels, sel["pct_copy_bw"], color=colors)
    for y, (pct, ms) in enumerate(zip(sel["pct_copy_bw"], sel["ms_median"])):
        ax.text(pct, y, f" {1e3 * ms:.1f} us", va="center", fontsize=8)
    ax.set_xlabel(f"% of copy bandwidth ({copy_gbps:,.0f} GB/s; KV bytes at bf16, fp8 reads half)")
    ax.set_title(f"{context_tokens // 1024}k tokens, H={heads} x T={draft_tokens}, {layout}")
    ax.grid(True, axis="x", alpha=0.3)
    source_note(ax, source)


ANATOMY_COLORS = {"prof_partial_us": "#1565c0", "prof_gap_us": "#ffb300", "prof_merge_us": "#6a1b9a",
                  "rest_us": "#9e9e9e", "loop_us": "#64b5f6", "epilogue_us": "#26a69a", "tail_us": "#ef5350",
                  "read_gather_us": "#2e7d32", "copy_us": "#424242"}


def anatomy_bars(ax: Any, decomp: pd.DataFrame, heads: int, draft_tokens: int, source: str = "measured") -> None:
    """Where split_p1's time goes at each context of one shape (:func:`specdiag.kernels.anatomy_analysis.decomposition`):
    per context, the full call stacked as the profiler splits it, the partial kernel's timeline launch stacked as its
    programs see it, the read-only kernel of the same grid, a copy of the same bytes, and issue 13's target time as
    a black line across the group (where the case has one)."""
    from specdiag.kernels.anatomy_analysis import FULL_PARTS, LABELS, TIMELINE_PARTS  # noqa: PLC0415
    from specdiag.plots import format_tokens  # noqa: PLC0415

    sel = decomp[(decomp["heads"] == heads) & (decomp["draft_tokens"] == draft_tokens)].sort_values("context_tokens")
    width, labelled, top = 0.2, set(), 0.0
    for i, r in enumerate(sel.itertuples()):
        for j, stack in enumerate((FULL_PARTS, TIMELINE_PARTS, ("read_gather_us",), ("copy_us",))):
            x, bottom = i + (j - 1.5) * width, 0.0
            for c in stack:
                v = getattr(r, c)
                if pd.isna(v):
                    continue
                ax.bar(x, v, width * 0.9, bottom=bottom, color=ANATOMY_COLORS[c],
                       label=None if c in labelled else LABELS[c])
                labelled.add(c)
                bottom += v
            top = max(top, bottom)
        if not pd.isna(r.target_us):
            ax.hlines(r.target_us, i - 2 * width, i + 2 * width, color="k", linewidth=2,
                      label=None if "target" in labelled else "issue 13 target time")
            ax.text(i + 2 * width, r.target_us, f" {r.target_pct:g}%", va="center", fontsize=7)
            labelled.add("target")
    ax.set_xticks(range(len(sel)), [format_tokens(c) for c in sel["context_tokens"]])
    ax.set_xlabel("context (tokens); bars: full call (profiler split), partial timeline, read-only kernel, copy")
    ax.set_ylabel("time per call (us)")
    ax.set_ylim(0, 1.6 * top if top > 0 else None)  # room for the legend above the bars
    ax.set_title(f"split_p1, H={heads} x T={draft_tokens}: where the time goes")
    ax.grid(True, axis="y", alpha=0.3)
    ax.legend(fontsize=7, loc="upper left", ncol=2)
    source_note(ax, source)


def timeline_plot(ax: Any, programs: pd.DataFrame, title: str = "", source: str = "measured") -> None:
    """One partial launch per program (:func:`specdiag.kernels.anatomy_analysis.timeline_programs`), sorted by done
    time: entry to loop end, loop end to done (us from the first program's entry); the median done and the last done
    as vertical lines, so the tail shows."""
    from specdiag.kernels.anatomy_analysis import LABELS  # noqa: PLC0415
    from specdiag.stats import quantile  # noqa: PLC0415

    y = programs["rank"]
    ax.hlines(y, programs["start_us"], programs["loop_end_us"], color=ANATOMY_COLORS["loop_us"], linewidth=1.2,
              label="entry to loop end (full-tile loop)")
    ax.hlines(y, programs["loop_end_us"], programs["done_us"], color=ANATOMY_COLORS["epilogue_us"], linewidth=1.2,
              label="loop end to done (last tile, partial write)")
    done_p50 = quantile(list(programs["done_us"]), 0.5)
    ax.axvline(done_p50, color="k", linestyle="--", linewidth=0.8, label=f"done p50 {done_p50:.1f} us")
    ax.axvline(float(programs["done_us"].max()), color=ANATOMY_COLORS["tail_us"], linewidth=1.0,
               label=f"last done {programs['done_us'].max():.1f} us ({LABELS['tail_us']}: "
                     f"{programs['done_us'].max() - done_p50:.1f} us)")
    ax.set_xlabel("time since the first program's entry (us, %globaltimer)")
    ax.set_ylabel("program, sorted by done time")
    ax.set_title(title)
    ax.set_xlim(left=0)
    ax.grid(True, axis="x", alpha=0.3)
    ax.legend(fontsize=7, loc="upper left")
    source_note(ax, source)


#: One colour per phase of the warp-specialized kernel (``pv`` the same in both warpgroups), waits in greys/reds.
WS_PHASE_COLORS = {
    "copy_wait": "#c62828", "scores": "#1565c0", "softmax": "#6a1b9a", "p_free_wait": "#ef9a9a", "publish": "#f9a825",
    "pv": "#2e7d32", "p_ready_wait": "#e57373", "p_free": "#8d6e63", "buffer_wait": "#ffcc80",
    "refill_issue": "#00838f", "rest": "#bdbdbd", "stage_wait": "#d84315", "free_wait": "#ffe0b2",
    "convert": "#4527a0",
}


def ws_phase_bars(ax: Any, table: pd.DataFrame, source: str = "measured") -> None:
    """Where each warpgroup's KV tile goes (:func:`specdiag.kernels.ws_phases_analysis.phase_table`): one horizontal
    bar per case, kernel and warpgroup, its phases stacked in the kernel's order and the rest of the loop last, so each
    bar is the loop's cycles per tile; the first bar at the top."""
    from specdiag.kernels.ws_phases_analysis import PARTITION_LABELS, PHASE_LABELS, PHASES, case_name  # noqa: PLC0415

    labelled: set[str] = set()
    labels = []
    for i, r in enumerate(table.to_dict("records")):
        left = 0.0
        for p in (*PHASES[r["partition"]], "rest"):
            v = max(float(r[f"{p}_cycles"]), 0.0)  # a negative rest (medians need not add up) is not drawn
            ax.barh(i, v, left=left, height=0.75, color=WS_PHASE_COLORS[p], edgecolor="white", linewidth=0.5,
                    label=None if p in labelled else PHASE_LABELS[p])
            labelled.add(p)
            left += v
        ax.text(left, i, f" {r['loop_cycles']:,.0f}", va="center", fontsize=7)
        labels.append(f"{r['kernel']}  {case_name(int(r['context_tokens']), int(r['heads']), int(r['draft_tokens']))}  "
                      f"{PARTITION_LABELS[r['partition']]}")
    ax.set_yticks(range(len(labels)), labels, fontsize=8)
    ax.set_ylim(len(labels) - 0.5, -0.5)
    ax.set_xlabel("SM cycles per KV tile (%clock64; medians over programs); number: the whole loop")
    ax.set_title("Warp-specialized kernel: where each warpgroup's tile goes")
    ax.grid(True, axis="x", alpha=0.3)
    order = [p for p in PHASE_LABELS if p in labelled]
    handles, names = ax.get_legend_handles_labels()
    by_name = dict(zip(names, handles))
    ax.legend([by_name[PHASE_LABELS[p]] for p in order], [PHASE_LABELS[p] for p in order], fontsize=8,
              loc="upper left", bbox_to_anchor=(1.01, 1.0), title="phase")
    source_note(ax, source)
