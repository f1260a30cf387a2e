"""06's figures, one function a plot drawing on the Axes it is given; units on every axis, contexts as 16k/128k."""

from __future__ import annotations

from typing import Any

import pandas as pd

from specdiag.plots import context_axis, roof, source_note
from specdiag.steps.kernel_ab.analysis import case_label
from specdiag.steps.kernel_ab.arms import ARMS

ARM_STYLE: dict[str, dict[str, Any]] = {
    "baseline": dict(color="#c62828", marker="v"),
    "split_triton": dict(color="#90caf9", marker="o"),
    "split_triton_b64": dict(color="#90caf9", marker="s", linestyle="--"),
    "pick": dict(color="#0d47a1", marker="D"),
    "pick_fp8": dict(color="#0d47a1", marker="x", linestyle=":"),
    "plugin": dict(color="#2e7d32", marker="P"),
    "plugin_fp8": dict(color="#2e7d32", marker="X", linestyle=":"),
    "plugin_triton": dict(color="#81c784", marker="p"),
    "flashinfer_mla": dict(color="#00838f", marker="<"),
    "sglang_splitkv": dict(color="#6d4c41", marker="^"),
}


def _label(arm: str) -> str:
    return f"{arm}: {ARMS[arm].what}" if arm in ARMS else arm


def gbps_vs_context(ax: Any, df: pd.DataFrame, copy_gbps: float, heads: int, draft_tokens: int,
                    source: str = "measured") -> None:
    """Effective KV bandwidth (bytes the arm reads / time) of each arm against context at one shape, under the
    run's 2 GiB copy."""
    sel = df[(df["heads"] == heads) & (df["draft_tokens"] == draft_tokens)]
    for arm, g in sel.groupby("arm", sort=False):
        g = g.sort_values("context_tokens")
        style = dict(ARM_STYLE.get(arm, {}))
        ax.plot(g["context_tokens"], g["gbps"], label=_label(arm), **style)
    if copy_gbps:
        ax.axhline(copy_gbps, color="k", linestyle=":", label=f"2 GiB device copy, {copy_gbps:,.0f} GB/s")
    ax.set_yscale("log")
    ax.set_ylabel("effective KV bandwidth (GB/s, log)")
    context_axis(ax, sorted(sel["context_tokens"].unique()))
    ax.set_title(f"{heads} heads x {draft_tokens} draft token{'s' if draft_tokens > 1 else ''}")
    ax.grid(True, which="both", alpha=0.3)
    source_note(ax, source)


def over_copy_bars(ax: Any, df: pd.DataFrame, context_tokens: int, heads: int, draft_tokens: int,
                   limit: float | None = None, source: str = "measured") -> None:
    """Each arm's time at one case over the same-bytes copy's (1.0 = as fast as copying what it reads), bars."""
    sel = df[(df["context_tokens"] == context_tokens) & (df["heads"] == heads) & (df["draft_tokens"] == draft_tokens)]
    sel = sel.dropna(subset=["over_copy"]).sort_values("over_copy", ascending=False)
    ax.barh([_label(a) for a in sel["arm"]], sel["over_copy"],
            color=[ARM_STYLE.get(a, {}).get("color", "grey") for a in sel["arm"]])
    for y, (v, us) in enumerate(zip(sel["over_copy"], sel["us"])):
        ax.text(v, y, f" {v:.2f}x ({us:,.0f} µs)", va="center", fontsize=8)
    ax.axvline(1.0, color="k", linewidth=0.8)
    if limit:
        ax.axvline(limit, color="#ef6c00", linestyle="--", label=f"target: {limit:g}x copy")
        ax.legend(fontsize=8, loc="lower right")
    ax.set_xscale("log")
    ax.set_xlabel("time / same-bytes device copy's time (ratio, log)")
    ax.set_title(case_label(context_tokens, heads, draft_tokens))
    ax.grid(True, axis="x", which="both", alpha=0.3)
    source_note(ax, source)


def roofline(ax: Any, df: pd.DataFrame, copy_gbps: float, matmul_tflops: float, source: str = "measured") -> None:
    """Every measured case on the roofline: achieved TFLOP/s against FLOP per KV byte, under
    min(matmul rate, intensity x copy bandwidth)."""
    x = df["flops"] / df["kv_bytes"]
    ridge = matmul_tflops * 1e3 / copy_gbps
    roof(ax, (max(0.05, min(float(x.min()), ridge) / 4), max(float(x.max()), ridge) * 4), copy_gbps, matmul_tflops)
    for arm, g in df.assign(intensity=x).groupby("arm", sort=False):
        st = ARM_STYLE.get(arm, {})
        ax.scatter(g["intensity"], g["tflops"], s=24, color=st.get("color"), marker=st.get("marker", "o"),
                   label=arm, zorder=3)
    ax.legend(fontsize=7, ncol=2)
    source_note(ax, source)
