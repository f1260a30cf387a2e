"""Analysis of kernel A/B rows: speedups, the page-size effect, the issue's targets, findings.

Pure functions from the ``kernel_ab`` rows (and the run's measured peaks) to tables and
:class:`~specdiag.findings.Finding` objects. Nothing here measures.

Targets (issue 5, H200, batch 1), each checked on the shuffled layouts at contexts >= 64k:

- ``memory``: split-KV >= 85 % of the measured copy bandwidth where heads x draft tokens <= 64.
- ``compute``: split-KV >= 50 % of the measured bf16 matmul rate where heads x draft tokens >= 256.
- ``page_size``: split-KV page_size 1 (shuffled_p1) within 10 % of 64-token blocks (shuffled_b64).
- ``speedup``: split-KV >= 20x the baseline at 128k context, 8 heads, 8 draft tokens.
"""

from __future__ import annotations

import re

from typing import Any, Iterable, Mapping, Optional

import pandas as pd

from specdiag.findings import Finding
from specdiag.stats import fit_line

MEMORY_TARGET_PCT = 85.0
COMPUTE_TARGET_PCT = 50.0
PAGE_SIZE_TOLERANCE = 0.10
SPEEDUP_TARGET = 20.0
MIN_TARGET_CONTEXT = 65536


def measured(rows: Iterable[Mapping[str, Any]]) -> pd.DataFrame:
    """Rows that were measured and correct (no error, not skipped), as a DataFrame."""
    df = pd.DataFrame(list(rows))
    if df.empty:
        return df
    for col in ("error", "skipped", "kernel", "correct"):
        if col not in df:
            df[col] = None
    ok = df["error"].isna() & df["skipped"].isna() & df["kernel"].notna() & (df["correct"] == True)  # noqa: E712
    return df[ok].reset_index(drop=True)


def skipped(rows: Iterable[Mapping[str, Any]]) -> pd.DataFrame:
    """Rows the harness did not measure, with the reason it gave."""
    df = pd.DataFrame(list(rows))
    if df.empty or "skipped" not in df:
        return pd.DataFrame()
    return df[df["skipped"].notna()][["kernel", "context_tokens", "heads", "draft_tokens", "layout", "skipped"]]


NOISY_SPREAD = 1.5
#: A marginal (inner-loop) rate at or above this share of copy bandwidth is "close to copy" (%).
CLOSE_TO_COPY_PCT = 80.0


def noisy(df: pd.DataFrame, spread: float = NOISY_SPREAD) -> pd.DataFrame:
    """Cases whose timing samples spread more than ``spread`` x from p10 to p90 (interference during the run)."""
    if df.empty:
        return df
    sel = df[df["ms_p90"] > spread * df["ms_p10"]]
    return sel[["kernel", "context_tokens", "heads", "draft_tokens", "layout", "ms_p10", "ms_median", "ms_p90"]]


def speedups(df: pd.DataFrame) -> pd.DataFrame:
    """Per case (context, heads, draft tokens, layout): baseline ms, split p1/b64 ms, speedups, p1/b64 ratio."""
    keys = ["context_tokens", "heads", "draft_tokens", "layout"]
    wide = df.pivot_table(index=keys, columns="kernel", values="ms_median", aggfunc="min")
    out = pd.DataFrame(index=wide.index)
    for k in ("baseline_p1", "split_p1", "split_b64"):
        out[f"{k}_ms"] = wide[k] if k in wide else float("nan")
    out["speedup_p1_vs_baseline"] = out["baseline_p1_ms"] / out["split_p1_ms"]
    out["speedup_b64_vs_baseline"] = out["baseline_p1_ms"] / out["split_b64_ms"]
    out["p1_over_b64"] = out["split_p1_ms"] / out["split_b64_ms"]
    return out.reset_index()


def page_size_effect(df: pd.DataFrame) -> pd.DataFrame:
    """Split-KV with page_size 1 on shuffled_p1 vs 64-token blocks on shuffled_b64, per shape and context.

    ``p1_over_b64`` > 1 means page_size 1 is slower. ``same_data_p1_over_b64`` compares the two index
    forms on the very same shuffled_b64 cache (only the kernel's indexing differs).
    """
    keys = ["context_tokens", "heads", "draft_tokens"]
    sp = df[df["design"] == "split_kv"]
    p1 = sp[(sp["kernel"] == "split_p1") & (sp["layout"] == "shuffled_p1")].set_index(keys)["ms_median"]
    b64 = sp[(sp["kernel"] == "split_b64") & (sp["layout"] == "shuffled_b64")].set_index(keys)["ms_median"]
    p1_same = sp[(sp["kernel"] == "split_p1") & (sp["layout"] == "shuffled_b64")].set_index(keys)["ms_median"]
    out = pd.DataFrame({"p1_ms": p1, "b64_ms": b64, "p1_on_b64_data_ms": p1_same}).dropna(subset=["p1_ms", "b64_ms"])
    out["p1_over_b64"] = out["p1_ms"] / out["b64_ms"]
    out["same_data_p1_over_b64"] = out["p1_on_b64_data_ms"] / out["b64_ms"]
    return out.reset_index()


def _best_split(df: pd.DataFrame) -> pd.DataFrame:
    return df[(df["design"] == "split_kv") & df["layout"].isin(["shuffled_p1", "shuffled_b64"])]


#: target_table's columns
TARGET_TABLE_COLUMNS = ["target", "context_tokens", "heads", "draft_tokens", "kernel", "layout", "ms", "value", "unit",
                        "threshold", "met"]


def target_table(df: pd.DataFrame) -> pd.DataFrame:
    """One row per (target, shape, context, kernel, layout) with the value, the threshold and met/missed."""
    out: list[dict[str, Any]] = []
    sp = _best_split(df)
    long = sp[sp["context_tokens"] >= MIN_TARGET_CONTEXT]
    for _, r in long[long["rows"] <= 64].iterrows():
        out.append({"target": "memory: >= 85% of copy bandwidth (H*T <= 64)", "context_tokens": r.context_tokens,
                    "heads": r.heads, "draft_tokens": r.draft_tokens, "kernel": r.kernel, "layout": r.layout,
                    "ms": r.ms_median, "value": r.pct_copy_bw, "unit": "% of copy", "threshold": MEMORY_TARGET_PCT,
                    "met": bool(r.pct_copy_bw >= MEMORY_TARGET_PCT)})
    for _, r in long[long["rows"] >= 256].iterrows():
        out.append({"target": "compute: >= 50% of bf16 matmul (H*T >= 256)", "context_tokens": r.context_tokens,
                    "heads": r.heads, "draft_tokens": r.draft_tokens, "kernel": r.kernel, "layout": r.layout,
                    "ms": r.ms_median, "value": r.pct_matmul, "unit": "% of matmul", "threshold": COMPUTE_TARGET_PCT,
                    "met": bool(r.pct_matmul >= COMPUTE_TARGET_PCT)})
    pse = page_size_effect(df)
    for _, r in pse[pse["context_tokens"] >= MIN_TARGET_CONTEXT].iterrows():
        out.append({"target": "page_size 1 within 10% of 64-token blocks", "context_tokens": r.context_tokens,
                    "heads": r.heads, "draft_tokens": r.draft_tokens, "kernel": "split_p1 / split_b64",
                    "layout": "shuffled_p1 / shuffled_b64", "ms": r.p1_ms, "value": r.p1_over_b64,
                    "unit": "time ratio", "threshold": 1 + PAGE_SIZE_TOLERANCE,
                    "met": bool(r.p1_over_b64 <= 1 + PAGE_SIZE_TOLERANCE)})
    su = speedups(df)
    sel = su[(su["context_tokens"] == 131072) & (su["heads"] == 8) & (su["draft_tokens"] == 8)]
    for _, r in sel.iterrows():
        for kernel, col in (("split_p1", "speedup_p1_vs_baseline"), ("split_b64", "speedup_b64_vs_baseline")):
            if pd.notna(r[col]):
                out.append({"target": "split-KV >= 20x baseline (128k, h8, T8)", "context_tokens": r.context_tokens,
                            "heads": r.heads, "draft_tokens": r.draft_tokens, "kernel": kernel, "layout": r.layout,
                            "ms": r[f"{kernel}_ms"], "value": r[col], "unit": "x", "threshold": SPEEDUP_TARGET,
                            "met": bool(r[col] >= SPEEDUP_TARGET)})
    return pd.DataFrame(out, columns=TARGET_TABLE_COLUMNS)  # the columns even without a row (a run of ragged arms only)


def target_summary(targets: pd.DataFrame) -> pd.DataFrame:
    """Per target: rows (kernel x case) and rows met, worst and best value; ``best_cases`` / ``best_met``: the cases
    (context, heads, draft tokens, layout) and how many of them the best kernel of the case meets (a run with several
    split kernels per case meets a target on a case when any of them does)."""
    if targets.empty:
        return targets
    g = targets.groupby("target")
    case_keys = ["target", "context_tokens", "heads", "draft_tokens", "layout"]
    by_case = targets.groupby(case_keys)["met"].any().groupby("target")
    return pd.DataFrame({"cases": g.size(), "met": g["met"].sum(), "min_value": g["value"].min(),
                         "max_value": g["value"].max(), "threshold": g["threshold"].first(),
                         "unit": g["unit"].first(), "best_cases": by_case.size(),
                         "best_met": by_case.sum()}).reset_index()


def fixed_cost_fit(df: pd.DataFrame, kernel: str = "split_p1", layout: str = "shuffled_p1") -> pd.DataFrame:
    """Least-squares ms = fixed_us + bytes / marginal_rate per (heads, draft tokens) over contexts.

    Separates a per-call fixed cost (launches, ramp-up, merge) from the streaming rate: the marginal
    GB/s says how well the inner loop streams, the fixed microseconds what short contexts pay.
    """
    out = []
    sel = df[(df["kernel"] == kernel) & (df["layout"] == layout)]
    for (h, t), g in sel.groupby(["heads", "draft_tokens"]):
        if g["context_tokens"].nunique() < 2:
            continue
        fit = fit_line(list(g["kv_bytes"].astype(float)), list(g["ms_median"].astype(float) * 1e-3))
        slope, icpt = fit.slope, fit.intercept  # s per byte, s
        out.append({"heads": h, "draft_tokens": t, "rows": h * t, "fixed_us": icpt * 1e6,
                    "marginal_gbps": 1 / slope / 1e9 if slope > 0 else float("inf"),
                    "marginal_tflops": (2 * h * t * 1088 / 1152) / slope / 1e12 if slope > 0 else float("inf")})
    # the columns even when nothing fits (the kernel absent, or one context per shape): callers index them
    return pd.DataFrame(out, columns=["heads", "draft_tokens", "rows", "fixed_us", "marginal_gbps", "marginal_tflops"])


#: Baseline severity thresholds on its best share of the copy bandwidth at contexts >= 64k (%).
BASELINE_CRITICAL_PCT = 10.0
BASELINE_WARNING_PCT = 50.0
#: GB/s (median per context, or per program count) counts as flat when max / min stays under this.
FLAT_RATIO = 1.25
TILE_TOKENS = 64  #: tokens per tile of the baseline's serial walk (triton_baseline.BLOCK_N)


def _spread(values: pd.Series) -> float:
    """max / min of a positive series (1.0 for one value)."""
    return float(values.max() / values.min()) if len(values) and values.min() > 0 else float("nan")


def baseline_finding(base: pd.DataFrame, copy_gbps: float, sm_count: Any = None) -> Finding:
    """The baseline kernel's KV rate, its share of the copy bandwidth and whether it stays flat, from the rows.

    Severity from the best share of copy bandwidth at contexts >= 64k (all contexts when none is that long):
    under :data:`BASELINE_CRITICAL_PCT` critical, under :data:`BASELINE_WARNING_PCT` a warning, else ok.
    "Flat in context" and "the same with few or many programs" are said only when the median GB/s per
    context (per program count) spreads less than :data:`FLAT_RATIO` x; otherwise the spread is stated.
    """
    long = base[base["context_tokens"] >= MIN_TARGET_CONTEXT]
    long = long if not long.empty else base
    pct_max = float(long["pct_copy_bw"].max())
    sev = "critical" if pct_max < BASELINE_CRITICAL_PCT else "warning" if pct_max < BASELINE_WARNING_PCT else "ok"
    by_ctx = base.groupby("context_tokens")["gbps"].median()
    ctx_spread = _spread(by_ctx)
    flat_ctx = bool(ctx_spread < FLAT_RATIO)
    by_prog = long.groupby("programs")["gbps"].median() if "programs" in long else pd.Series(dtype=float)
    prog_spread = _spread(by_prog)
    programs = [int(p) for p in by_prog.index]
    row_bytes = float((base["kv_bytes"] / base["n_kv"]).median())  # bytes per token of KV (one latent row)
    tile_bytes = TILE_TOKENS * row_bytes
    tile_us = tile_bytes / (float(long["gbps"].median()) * 1e9) * 1e6
    lo_ctx, hi_ctx = int(by_ctx.index.min()), int(by_ctx.index.max())
    shape = {"critical": "starves the GPU", "warning": "leaves most of the bandwidth unused",
             "ok": "streams the KV near copy bandwidth"}[sev]
    flat_text = (f"flat in context: median {by_ctx.min():.1f}-{by_ctx.max():.1f} GB/s from {lo_ctx // 1024}k to "
                 f"{hi_ctx // 1024}k, a {ctx_spread:.2f}x spread" if flat_ctx else
                 f"not flat in context: median {by_ctx.loc[lo_ctx]:.1f} GB/s at {lo_ctx // 1024}k, "
                 f"{by_ctx.loc[hi_ctx]:.1f} GB/s at {hi_ctx // 1024}k ({ctx_spread:.2f}x spread)")
    prog_text = ("" if len(by_prog) < 2 else
                 (f"The unique-byte rate is about the same with few or many programs ({prog_spread:.2f}x spread; "
                  if prog_spread < FLAT_RATIO else
                  f"The unique-byte rate changes with the number of programs ({prog_spread:.2f}x spread; ")
                 + "median GB/s by program count: " + ", ".join(f"{int(k)}: {v:.1f}" for k, v in by_prog.items())
                 + ("): every program streams every KV row, so more heads add programs but no unique bandwidth."
                    if prog_spread < FLAT_RATIO else ")."))
    return Finding(
        id="kernel_ab.baseline_starves", title=f"The SGLang-structured verify kernel {shape}",
        verdict=(f"The baseline reads the KV at {long['gbps'].min():.1f}-{long['gbps'].max():.1f} GB/s at contexts "
                 f">= {int(long['context_tokens'].min()) // 1024}k, {long['pct_copy_bw'].min():.2f}-{pct_max:.2f}% of "
                 f"the measured copy bandwidth; {flat_text}. By construction one program per (head, 32 draft tokens) "
                 "walks the whole prefix serially and every program re-reads the same latent rows."),
        severity=sev,
        evidence=[f"Programs launched: {programs} for {sm_count or 'the'} SMs. " + prog_text,
                  f"Each program's walk is serial (SGLang's num_stages 1 on Hopper: load, wait, compute): about "
                  f"{tile_us:.1f} us per {TILE_TOKENS}-token tile of {tile_bytes / 1e3:.1f} kB at the median "
                  f"rate of contexts >= {int(long['context_tokens'].min()) // 1024}k (computed: tile bytes / GB/s).",
                  "Median GB/s per context (measured): " + ", ".join(f"{int(k) // 1024}k: {v:.1f}"
                                                                     for k, v in by_ctx.items())
                  + f"; flat means a max/min spread under {FLAT_RATIO:g}x.",
                  f"Copy bandwidth {copy_gbps:.0f} GB/s measured in the same run.",
                  f"threshold: best share of copy bandwidth under {BASELINE_CRITICAL_PCT:g}% is critical, "
                  f"under {BASELINE_WARNING_PCT:g}% a warning, else ok."],
        numbers={"baseline_gbps_min": float(long["gbps"].min()), "baseline_gbps_max": float(long["gbps"].max()),
                 "baseline_pct_copy_max": pct_max, "copy_gbps": copy_gbps, "us_per_tile": float(tile_us),
                 "gbps_context_spread_x": ctx_spread, "gbps_flat_in_context": flat_ctx,
                 "gbps_program_spread_x": prog_spread},
        source="measured",
    )


def findings(df: pd.DataFrame, peaks: Mapping[str, Any], copy_rows: Iterable[Mapping[str, Any]] = ()) -> list[Finding]:
    """The notebook's verdicts: the baseline's share of bandwidth and why, the split's reach, each target."""
    out: list[Finding] = []
    copy_gbps = float(peaks.get("copy_gbps", float("nan")))
    mm = float(peaks.get("matmul_tflops", float("nan")))
    base = df[df["kernel"] == "baseline_p1"]
    if not base.empty:
        out.append(baseline_finding(base, copy_gbps, peaks.get("sm_count")))
    targets = target_table(df)
    for _, s in target_summary(targets).iterrows():
        met_all = int(s.best_met) == int(s.best_cases)  # judged on each case's best kernel, as the issue-13 verdicts
        rows_note = (f"; {int(s.met)} of {int(s.cases)} kernel rows meet it" if int(s.cases) != int(s.best_cases)
                     else "")
        out.append(Finding(
            id=f"kernel_ab.target.{s.target.split(':')[0].split(' ')[0].replace('-', '_').lower()}",
            title=f"Target {s.target}", severity="ok" if met_all else "warning",
            verdict=(f"{'Met' if met_all else 'Missed'}: {int(s.best_met)} of {int(s.best_cases)} cases meet it"
                     + (" by their best split kernel" if rows_note else "") + rows_note
                     + f" (values {s.min_value:.3g}-{s.max_value:.3g} {s.unit}, threshold {s.threshold:g})."),
            evidence=[f"Split-KV on shuffled layouts at contexts >= 64k; copy {copy_gbps:.0f} GB/s and matmul "
                      f"{mm:.0f} TFLOP/s measured in the same run."],
            numbers={"cases": int(s.cases), "met": int(s.met), "best_cases": int(s.best_cases),
                     "best_met": int(s.best_met), "min_value": float(s.min_value),
                     "max_value": float(s.max_value), "threshold": float(s.threshold)},
        ))
    fit = fixed_cost_fit(df)
    small = fit[fit["rows"] <= 16]
    if not small.empty:
        copy_df = pd.DataFrame(list(copy_rows))
        ev = [f"H={int(r.heads)} T={int(r.draft_tokens)}: {r.fixed_us:.1f} us fixed + KV at {r.marginal_gbps:.0f} GB/s "
              f"marginal ({100 * r.marginal_gbps / copy_gbps:.0f}% of copy)" for r in small.itertuples()]
        if not copy_df.empty:
            ev += [f"A plain copy moving the same bytes as the {int(r.context_tokens) // 1024}k KV read reaches "
                   f"{r.gbps:.0f} GB/s ({100 * r.gbps / copy_gbps:.0f}% of the 2 GB copy)" for r in copy_df.itertuples()]
        best_pct = 100 * float(small["marginal_gbps"].max()) / copy_gbps
        calls = df[(df["kernel"] == "split_p1") & (df["layout"] == "shuffled_p1")
                   & (df["context_tokens"] >= MIN_TARGET_CONTEXT)].merge(small, on=["heads", "draft_tokens"])
        fixed_share = list(100 * calls["fixed_us"] / (1e3 * calls["ms_median"]))
        streams = ("streams the KV close to copy bandwidth" if best_pct >= CLOSE_TO_COPY_PCT else
                   "streams the KV well below copy bandwidth")
        out.append(Finding(
            id="kernel_ab.split_fixed_cost", title="What stops split-KV short of the floor at batch 1",
            verdict=(f"In memory-bound shapes (H*T <= 16) the split kernel's inner loop {streams} (best marginal rate "
                     f"{best_pct:.0f}% of copy), and each call pays a fixed {small['fixed_us'].min():.1f}-"
                     f"{small['fixed_us'].max():.1f} us (two launches, ramp-up, partial write, merge)"
                     + (f", {min(fixed_share):.0f}-{max(fixed_share):.0f}% of the call at contexts >= 64k."
                        if fixed_share else ".")),
            severity="info", evidence=ev,
            numbers={"fixed_us_min": float(small["fixed_us"].min()),
                     "marginal_gbps_max": float(small["marginal_gbps"].max())},
            source="computed",
        ))
    big = fit[fit["rows"] >= 64]
    p1 = df[(df["kernel"] == "split_p1") & (df["layout"] == "shuffled_p1")]
    unfitted = (p1[p1["heads"] * p1["draft_tokens"] >= 64].groupby(["heads", "draft_tokens"])
                .filter(lambda g: g["context_tokens"].nunique() < 2))  # 64+ row shapes at one context: no fit
    if not big.empty:
        out.append(Finding(
            id="kernel_ab.split_inner_loop", title="With 64+ rows split_p1 (Triton) is bound by its tensor-core loop",
            verdict=((f"At the one shape of 64+ rows measured{' at two or more contexts' if len(unfitted) else ''} "
                      f"(H={int(big['heads'].iloc[0])} "
                      f"T={int(big['draft_tokens'].iloc[0])}) the inner loop runs at {big['marginal_tflops'].iloc[0]:.0f} "
                      f"TFLOP/s, {100 * big['marginal_tflops'].iloc[0] / mm:.0f}% " if len(big) == 1 else
                      f"From 64 rows up the inner loop runs at {big['marginal_tflops'].min():.0f}-"
                      f"{big['marginal_tflops'].max():.0f} TFLOP/s"
                      + (" whatever the shape" if _spread(big["marginal_tflops"]) < FLAT_RATIO else
                         f" ({_spread(big['marginal_tflops']):.2f}x apart between shapes)")
                      + f", {100 * big['marginal_tflops'].min() / mm:.0f}-{100 * big['marginal_tflops'].max() / mm:.0f}% ")
                     + "of the measured matmul rate"
                     + (": the Triton loop (QK^T, softmax, PV in one warp group pair) does not overlap its matrix work "
                        "well enough to reach the compute roof." if big["marginal_tflops"].max() < mm * COMPUTE_TARGET_PCT / 100
                        else ".")),
            severity="info",
            evidence=[f"H={int(r.heads)} T={int(r.draft_tokens)}: {r.marginal_tflops:.0f} TFLOP/s marginal, "
                      f"{r.fixed_us:.0f} us fixed (least squares over contexts)" for r in big.itertuples()]
                     + [f"H={int(r.heads)} T={int(r.draft_tokens)}: measured at {int(r.context_tokens) // 1024}k only "
                        f"({r.pct_matmul:.0f}% of matmul), no fit" for r in unfitted.itertuples()]
                     + ["split_p1 on shuffled_p1 only; the other kernels of the run are judged per case in the issue-13 "
                        "verdicts (section 8)."]
                     + [f"matmul {mm:.0f} TFLOP/s measured in the same run; 'whatever the shape' means a max/min spread "
                        f"under {FLAT_RATIO:g}x; the compute target is {COMPUTE_TARGET_PCT:g}% of matmul."],
            numbers={"marginal_tflops_min": float(big["marginal_tflops"].min()),
                     "marginal_tflops_max": float(big["marginal_tflops"].max()), "matmul_tflops": mm},
            source="computed",
        ))
    return out


# ---- issue 13: the single-launch kernel, fp8 KV and the anchors beside ours --------------------------------

#: Issue 13's targets (H200, batch 1, % of the copy bandwidth / matmul rate measured in the same run).
ISSUE13_MEMORY = ((131072, 85.0), (262144, 85.0), (65536, 75.0))  #: (context, % of copy) for H*T <= 16
ISSUE13_H8T8_PCT = 70.0  #: 8 heads x 8 draft tokens at 128k, % of copy
OURS_DESIGNS = ("split_kv", "fused_split_kv", "ragged_split_kv")  #: ragged: the plugin's kernel


def _ours(df: pd.DataFrame, bf16_only: bool = True) -> pd.DataFrame:
    if df.empty or "design" not in df:
        return df.iloc[0:0]
    sel = df[df["design"].isin(OURS_DESIGNS)]
    if bf16_only and "kv_dtype" in sel:
        sel = sel[sel["kv_dtype"].fillna("bf16") == "bf16"]
    return sel


def issue13_bandwidth_target(context_tokens: int, heads: int, draft_tokens: int) -> tuple[str, float] | None:
    """Issue 13's bandwidth target of one case, as (target name, % of copy bandwidth), or None where it sets none.

    memory: 8 or 16 heads with heads x draft tokens <= 16, at 64k (75 %), 128k and 256k (85 %); h8t8: 8 heads x 8
    draft tokens at 128k (70 %). The names are those :func:`issue13_targets` reports.
    """
    for ctx, pct in ISSUE13_MEMORY:
        if context_tokens == ctx and heads in (8, 16) and heads * draft_tokens <= 16:
            return f"memory: >= {pct:g}% of copy at {ctx // 1024}k (H in 8,16; H*T <= 16)", pct
    if (context_tokens, heads, draft_tokens) == (131072, 8, 8):
        return f"h8t8: >= {ISSUE13_H8T8_PCT:g}% of copy at 128k", ISSUE13_H8T8_PCT
    return None


def issue13_targets(df: pd.DataFrame) -> pd.DataFrame:
    """One row per (target, case, kernel) of issue 13's targets, for every kernel of ours (bf16 KV) and anchor.

    memory: 8 or 16 heads, heads x draft tokens <= 16, >= 85 % of copy at 128k and 256k, >= 75 % at 64k;
    h8t8: 8 heads x 8 draft tokens at 128k, >= 70 % of copy; compute: heads x draft tokens >= 256 at >= 64k,
    >= 50 % of the matmul rate. fp8 rows are left out (they read half the bytes: see fp8_table).
    """
    if df.empty:
        return pd.DataFrame()
    cand = df[df["design"].isin(OURS_DESIGNS + ("anchor",))]
    if "kv_dtype" in cand:
        cand = cand[cand["kv_dtype"].fillna("bf16") == "bf16"]
    cand = cand[cand["layout"].isin(["shuffled_p1", "shuffled_b64"])]
    out: list[dict[str, Any]] = []

    def add(target, r, value, unit, threshold):
        out.append({"target": target, "context_tokens": int(r.context_tokens), "heads": int(r.heads),
                    "draft_tokens": int(r.draft_tokens), "kernel": r.kernel, "layout": r.layout,
                    "mask": getattr(r, "mask", None), "ms": r.ms_median, "value": value, "unit": unit,
                    "threshold": threshold, "met": bool(value >= threshold)})

    for r in cand.itertuples():
        ht = r.heads * r.draft_tokens
        bw = issue13_bandwidth_target(int(r.context_tokens), int(r.heads), int(r.draft_tokens))
        if bw is not None:
            add(bw[0], r, r.pct_copy_bw, "% of copy", bw[1])
        if r.context_tokens >= MIN_TARGET_CONTEXT and ht >= 256:
            add(f"compute: >= {COMPUTE_TARGET_PCT:g}% of matmul (H*T >= 256)", r, r.pct_matmul, "% of matmul",
                COMPUTE_TARGET_PCT)
    return pd.DataFrame(out)


def target_verdicts(df: pd.DataFrame) -> pd.DataFrame:
    """Per target and case of :func:`issue13_targets`: our best kernel (bf16) and the best anchor, side by side.

    ``ours_met`` is the issue's verdict on our kernel; ``anchor_met`` says whether a kernel a user could pick meets the
    same target (an anchor meeting it does not meet it for us). Cases without an anchor row have NaN anchor fields.
    """
    t = issue13_targets(df)
    if t.empty:
        return pd.DataFrame()
    anchors = set(df.loc[df["design"] == "anchor", "kernel"]) if "design" in df else set()
    keys = ["target", "context_tokens", "heads", "draft_tokens", "layout"]
    out = []
    for key, g in t.groupby(keys, sort=False):
        row = dict(zip(keys, key))
        row["threshold"] = float(g["threshold"].iloc[0])
        for side, sel in (("ours", g[~g["kernel"].isin(anchors)]), ("anchor", g[g["kernel"].isin(anchors)])):
            best = sel.sort_values("value", ascending=False).head(1)
            if best.empty:
                row.update({f"{side}_kernel": None, f"{side}_value": float("nan"), f"{side}_met": None})
            else:
                b = best.iloc[0]
                row.update({f"{side}_kernel": b["kernel"], f"{side}_value": float(b["value"]), f"{side}_met": bool(b["met"])})
        out.append(row)
    return pd.DataFrame(out)


def verdict_finding(verdicts: pd.DataFrame) -> Optional[Finding]:
    """One finding from :func:`target_verdicts`: how many of issue 13's target cases our best kernel meets, how many
    the best anchor meets, and our worst gap to a threshold. None when no target case was measured."""
    if verdicts.empty:
        return None
    ours_met = int(verdicts["ours_met"].fillna(False).astype(bool).sum())
    with_anchor = verdicts[verdicts["anchor_kernel"].notna()]
    anchor_met = int(with_anchor["anchor_met"].fillna(False).astype(bool).sum())
    n = int(len(verdicts))
    short = verdicts.assign(gap=verdicts["threshold"] - verdicts["ours_value"]).sort_values("gap", ascending=False)
    worst = short.iloc[0]
    family = verdicts["target"].str.split(":").str[0]
    met_by = verdicts["ours_met"].fillna(False).astype(bool).groupby(family, sort=True)
    per_target = ", ".join(f"{name} {int(m.sum())} of {len(m)}" for name, m in met_by)
    ev = [f"{r.target} at {int(r.context_tokens) // 1024}k, {int(r.heads)} x {int(r.draft_tokens)}: ours "
          f"{r.ours_value:.1f} ({r.ours_kernel})" + (f", {r.anchor_kernel} {r.anchor_value:.1f}" if isinstance(r.anchor_kernel, str)
                                                    else "") + f", threshold {r.threshold:g}"
          for r in verdicts.itertuples()]
    return Finding(
        id="kernel_ab.issue13_verdicts", title="Issue 13's targets: our kernel and the anchors, case by case",
        severity="ok" if ours_met == n else "warning",
        verdict=(f"Our fastest kernel per case meets {ours_met} of {n} target cases ({per_target})"
                 + (f"; the best anchor meets {anchor_met} of the {len(with_anchor)} it ran" if len(with_anchor) else
                    "; no anchor ran on them")
                 + (f". Furthest from its threshold: {worst.target.split(':')[0]} at {int(worst.context_tokens) // 1024}k, "
                    f"{int(worst.heads)} x {int(worst.draft_tokens)} ({worst.ours_value:.1f} against {worst.threshold:g})."
                    if ours_met < n else ".")),
        evidence=ev, numbers={"cases": n, "ours_met": ours_met, "anchor_cases": int(len(with_anchor)),
                              "anchor_met": anchor_met},
        source="computed",
    )


def anchor_comparison(df: pd.DataFrame) -> pd.DataFrame:
    """Per case and anchor row: the anchor's time, our fastest bf16 kernel's time on the same case, and the ratio.

    ``ours_over_anchor`` < 1: ours is faster; > 1: the anchor is faster by that factor. Anchors skipped or failed
    appear with their reason (``anchor_status``) and no times.
    """
    if df.empty or "design" not in df:
        return pd.DataFrame()
    keys = ["context_tokens", "heads", "draft_tokens", "layout"]
    anchors = df[df["design"] == "anchor"]
    if anchors.empty:
        return pd.DataFrame()
    ours = _ours(df)
    best = (ours.sort_values("ms_median").groupby(keys, as_index=False).first()[keys + ["kernel", "ms_median"]]
            .rename(columns={"kernel": "ours_kernel", "ms_median": "ours_ms"}))
    out = anchors[keys + ["kernel", "ms_median", "rel_err"]].rename(columns={"kernel": "anchor", "ms_median": "anchor_ms"})
    out = out.merge(best, on=keys, how="left")
    out["ours_over_anchor"] = out["ours_ms"] / out["anchor_ms"]
    out["faster"] = out["ours_over_anchor"].map(lambda x: None if pd.isna(x) else ("ours" if x < 1 else "anchor"))
    return out.reset_index(drop=True)


def anchor_status(rows: Iterable[Mapping[str, Any]]) -> pd.DataFrame:
    """Every anchor row that did not produce a time, with why (a reason the harness states, or the error)."""
    df = pd.DataFrame(list(rows))
    if df.empty or "design" not in df:
        return pd.DataFrame()
    a = df[df["design"] == "anchor"].copy()
    if a.empty:
        return pd.DataFrame()
    for col in ("skipped", "error"):
        if col not in a:
            a[col] = None
    a = a[a["skipped"].notna() | a["error"].notna()]
    a["why"] = a["skipped"].fillna(a["error"])
    return a[["kernel", "context_tokens", "heads", "draft_tokens", "layout", "why"]].drop_duplicates(
        subset=["kernel", "why"]).reset_index(drop=True)


#: session 15's arms whose KV splits are equal shares of tokens (``SplitKVConfig.split_round_tokens`` 1), each beside
#: the arm it changes only that of (64-token splits); tests/test_kernels.py checks the pairs against dispatch's arms
EQUAL_SPLIT_TWINS: dict[str, str] = {"split_gwsw8t_p1": "split_gwsw8_p1", "ragged_gwsw_t_p1": "ragged_gwsw_p1",
                                     "ragged_gwsw_fp8t_p1": "ragged_gwsw_fp8_p1"}
#: fp8 arms whose bf16 twin the name rule below would miss (a letter after ``fp8`` that is not an fp8 change)
BF16_TWIN_OVERRIDES: dict[str, str] = {"ragged_gwsw_fp8t_p1": "ragged_gwsw_t_p1"}


def bf16_twin(kernel: str) -> str:
    """The bf16-KV kernel an fp8-KV kernel is the fp8 form of, by name: ``fused_fp8_p1`` -> ``fused_p1``,
    ``split_gwsw8_fp8p_p1`` -> ``split_gwsw8_p1`` (the fp8 rows-as-N arms of session 13 are the pick's);
    ``BF16_TWIN_OVERRIDES`` first (``ragged_gwsw_fp8t_p1`` -> ``ragged_gwsw_t_p1``: the same equal splits)."""
    return BF16_TWIN_OVERRIDES.get(kernel) or re.sub(r"_fp8[a-z0-9]*(?=_(p1|b64)$)", "", kernel)


def split_round_table(df: pd.DataFrame) -> pd.DataFrame:
    """Per case, each arm of ``EQUAL_SPLIT_TWINS`` beside its twin with 64-token splits (same run, case, layout and
    cache dtype): both times, their ratio, and each one's split count where the rows carry it. Empty without pairs."""
    if df.empty or "kernel" not in df:
        return pd.DataFrame()
    keys = ["context_tokens", "heads", "draft_tokens", "layout"]
    ok = df[df["ms_median"].notna()] if "ms_median" in df else df.iloc[0:0]
    cols = keys + ["kernel", "ms_median"] + (["n_splits"] if "n_splits" in ok else [])
    eq = ok[ok["kernel"].isin(set(EQUAL_SPLIT_TWINS))][cols].copy()
    if eq.empty:
        return pd.DataFrame()
    eq["twin"] = eq["kernel"].map(EQUAL_SPLIT_TWINS)
    tw = ok[ok["kernel"].isin(set(EQUAL_SPLIT_TWINS.values()))][cols].rename(
        columns={"kernel": "twin", "ms_median": "twin_ms", "n_splits": "twin_n_splits"})
    out = eq.merge(tw, on=keys + ["twin"], how="inner")
    if out.empty:
        return pd.DataFrame()
    out["equal_over_64"] = out["ms_median"] / out["twin_ms"]
    return out.rename(columns={"ms_median": "equal_ms"}).sort_values(keys + ["kernel"]).reset_index(drop=True)


def split_round_finding(t: pd.DataFrame) -> Optional[Finding]:
    """One finding from :func:`split_round_table`: what cutting the KV into equal shares of tokens (every SM busy)
    did to each arm's time against 64-token splits (some SMs idle, the rest over an equal share). "ok" when the equal
    shares are faster on every pair, else "info" (the default, 64-token splits, stays). None without pairs."""
    if t.empty:
        return None
    faster = int((t["equal_over_64"] < 1.0).sum())
    splits = ""
    if {"n_splits", "twin_n_splits"} <= set(t.columns):
        def span(col: str) -> str:
            lo, hi = int(t[col].min()), int(t[col].max())
            return f"{lo}" if lo == hi else f"{lo}-{hi}"

        splits = f" ({span('n_splits')} splits against {span('twin_n_splits')})"
    ev = [f"{int(r.context_tokens) // 1024}k, {int(r.heads)} x {int(r.draft_tokens)} ({r.layout}): {r.kernel} "
          f"{1e3 * r.equal_ms:.1f} us, {r.equal_over_64:.3f}x {r.twin}'s {1e3 * r.twin_ms:.1f} us" for r in t.itertuples()]
    return Finding(
        id="kernel_ab.split_round", title="Splits of equal shares of tokens against 64-token splits",
        severity="ok" if faster == len(t) else "info",
        verdict=(f"Cutting the KV into equal shares of tokens{splits} took {t['equal_over_64'].min():.3f}-"
                 f"{t['equal_over_64'].max():.3f}x the time of the same kernel on 64-token splits (faster on {faster} "
                 f"of {len(t)} pairs)" + (": the SMs a 64-token cut leaves idle cost nothing the stream could use."
                                          if faster == 0 else ".")),
        evidence=ev,
        numbers={"pairs": int(len(t)), "faster_pairs": faster, "ratio_min": float(t["equal_over_64"].min()),
                 "ratio_max": float(t["equal_over_64"].max())},
        source="computed",
    )


def fp8_table(df: pd.DataFrame) -> pd.DataFrame:
    """fp8-KV rows beside their bf16 twin's rows (``bf16_twin``) of the same case and run: time ratio and accuracy
    (vs the fp32 reference of the dequantized cache and of the bf16 cache). Skipped fp8 rows are left out."""
    if df.empty or "kv_dtype" not in df:
        return pd.DataFrame()
    f8 = df[(df["kv_dtype"] == "fp8_e4m3") & df["ms_median"].notna()].copy()
    if f8.empty:
        return pd.DataFrame()
    keys = ["context_tokens", "heads", "draft_tokens", "layout"]
    f8["bf16_kernel"] = f8["kernel"].map(bf16_twin)
    bf = df[(df["kv_dtype"].fillna("bf16") == "bf16") & df["kernel"].isin(set(f8["bf16_kernel"]))]
    bf = bf[keys + ["kernel", "ms_median", "rel_err"]].rename(columns={"kernel": "bf16_kernel", "ms_median": "bf16_ms",
                                                                       "rel_err": "bf16_rel_err"})
    out = f8[keys + ["kernel", "bf16_kernel", "ms_median", "rel_err", "rel_err_vs_bf16_ref", "actual_gbps",
                     "pct_copy_bw"]].merge(bf, on=keys + ["bf16_kernel"], how="left")
    out["fp8_over_bf16_time"] = out["ms_median"] / out["bf16_ms"]
    out["actual_pct_copy"] = out["pct_copy_bw"] / 2  # the bytes it actually reads: half the bf16 cache
    return out.rename(columns={"ms_median": "fp8_ms", "rel_err": "rel_err_vs_dequantized_ref"}).reset_index(drop=True)


def fp8_finding(f8: pd.DataFrame) -> Optional[Finding]:
    """One finding from :func:`fp8_table`: per case the fastest fp8-KV kernel's time over its bf16 twin's (the bytes
    alone would allow 0.5), and the fp8 rows' error against the dequantized cache's fp32 reference (the kernel's own)
    and the bf16 cache's (with the quantization). Severity "ok" when the fastest fp8 kernel beats its twin on every
    case, else "warning". None without fp8 rows paired with a bf16 twin."""
    if f8.empty:
        return None
    paired = f8.dropna(subset=["fp8_over_bf16_time"])
    if paired.empty:
        return None
    keys = ["context_tokens", "heads", "draft_tokens", "layout"]
    best = paired.loc[paired.groupby(keys)["fp8_over_bf16_time"].idxmin()].sort_values(keys)
    faster = int((best["fp8_over_bf16_time"] < 1.0).sum())
    ev = [f"{int(r.context_tokens) // 1024}k, {int(r.heads)} x {int(r.draft_tokens)} ({r.layout}): {r.kernel} "
          f"{1e3 * r.fp8_ms:.1f} us, {r.fp8_over_bf16_time:.2f}x {r.bf16_kernel}'s {1e3 * r.bf16_ms:.1f} us"
          for r in best.itertuples()]
    ev.append(f"error of the fp8 rows: {paired['rel_err_vs_dequantized_ref'].min():.2e}-"
              f"{paired['rel_err_vs_dequantized_ref'].max():.2e} against the fp32 reference of the dequantized cache, "
              f"{paired['rel_err_vs_bf16_ref'].min():.2e}-{paired['rel_err_vs_bf16_ref'].max():.2e} against the bf16 "
              "cache's (the quantization's own)")
    return Finding(
        id="kernel_ab.fp8_kv", title="The fp8 KV cache: what half the bytes buy",
        severity="ok" if faster == len(best) else "warning",
        verdict=(f"The fastest fp8-KV kernel takes {best['fp8_over_bf16_time'].min():.2f}-"
                 f"{best['fp8_over_bf16_time'].max():.2f}x its bf16 twin's time (faster on {faster} of {len(best)} "
                 "cases); half the bytes alone would allow 0.5x"
                 + (": the bytes read do not set these fp8 kernels' time (their phases, `ws_phases` rows, say what "
                    "does)." if best["fp8_over_bf16_time"].min() > 0.7 else ".")),
        evidence=ev,
        numbers={"cases": int(len(best)), "faster_cases": faster,
                 "best_ratio_min": float(best["fp8_over_bf16_time"].min()),
                 "best_ratio_max": float(best["fp8_over_bf16_time"].max()),
                 "rel_err_vs_bf16_ref_max": float(paired["rel_err_vs_bf16_ref"].max())},
        source="computed",
    )


def fused_vs_two_launch(df: pd.DataFrame) -> pd.DataFrame:
    """Per case: the single-launch kernel's time over the two-launch split kernel's, for the same page size."""
    if df.empty or "design" not in df:
        return pd.DataFrame()
    keys = ["context_tokens", "heads", "draft_tokens", "layout"]
    out = []
    for fused, split in (("fused_p1", "split_p1"), ("fused_b64", "split_b64")):
        a = df[df["kernel"] == fused].set_index(keys)["ms_median"]
        b = df[df["kernel"] == split].set_index(keys)["ms_median"]
        j = pd.DataFrame({"fused_ms": a, "split_ms": b}).dropna()
        if j.empty:
            continue
        j["fused_over_split"] = j["fused_ms"] / j["split_ms"]
        j["saved_us"] = 1e3 * (j["split_ms"] - j["fused_ms"])
        j["pair"] = f"{fused} / {split}"
        out.append(j.reset_index())
    return pd.concat(out, ignore_index=True) if out else pd.DataFrame()


def time_ratios(df: pd.DataFrame, base: str = "split_p1", base_df: pd.DataFrame | None = None) -> pd.DataFrame:
    """Per case (context, heads, draft tokens, layout) and kernel: its median time over ``base``'s on the same case.

    ``over_base`` < 1: faster than ``base``. ``base_df``: take ``base``'s rows from another run's measured rows
    (default: ``df`` itself); ``base_from`` then says "other run": two device calls, whose machine state and ceilings
    may differ. From the same run, ``base``'s own rows are left out; cases where ``base`` was not measured are left out.
    """
    other = base_df is not None
    src = base_df if other else df
    if df.empty or src is None or src.empty or "kernel" not in src:
        return pd.DataFrame()
    keys = ["context_tokens", "heads", "draft_tokens", "layout"]
    b = src[src["kernel"] == base][keys + ["ms_median"]].rename(columns={"ms_median": "base_ms"})
    if b.empty:
        return pd.DataFrame()
    rows = df if other else df[df["kernel"] != base]
    out = rows[keys + ["kernel", "ms_median"]].rename(columns={"ms_median": "ms"}).merge(b, on=keys, how="inner")
    out.insert(out.columns.get_loc("base_ms"), "base", base)
    out["over_base"] = out["ms"] / out["base_ms"]
    out["base_from"] = "other run" if other else "same run"
    return out.reset_index(drop=True)


def fixed_cost_by_kernel(df: pd.DataFrame, kernels: Iterable[str] | None = None,
                         layout: str = "shuffled_p1") -> pd.DataFrame:
    """:func:`fixed_cost_fit` for each kernel of ``kernels`` (default: every kernel of ``df`` but the baseline, ours and
    the anchors, in row order) on ``layout``: one row per (kernel, heads, draft tokens).

    Says whether a kernel differs from another by a per-call fixed cost (``fixed_us``) or by its streaming rate
    (``marginal_gbps``, counting the bf16 KV bytes n_kv x 1,152 B as every row does). For an fp8-KV kernel, which
    reads half those bytes, ``marginal_actual_gbps`` is the rate of the bytes it reads (half of ``marginal_gbps``).
    Shapes measured at fewer than two contexts are left out.
    """
    if kernels is None:
        sel = df[df["design"] != "baseline"] if "design" in df else df
        kernels = list(pd.unique(sel["kernel"])) if "kernel" in sel else []
    out = []
    for k in kernels:
        fit = fixed_cost_fit(df, kernel=k, layout=layout)
        if fit.empty:
            continue
        fp8 = bool((df[df["kernel"] == k].get("kv_dtype", pd.Series(dtype=object)) == "fp8_e4m3").any())
        fit.insert(0, "kernel", k)
        fit["marginal_actual_gbps"] = fit["marginal_gbps"] / 2 if fp8 else fit["marginal_gbps"]
        out.append(fit)
    return pd.concat(out, ignore_index=True) if out else pd.DataFrame()


def same_bytes_copy(df: pd.DataFrame, copy_rows: Iterable[Mapping[str, Any]]) -> pd.DataFrame:
    """Each measured row beside the plain device copy of its context's KV traffic (``kernel_ab_copy`` rows).

    ``over_copy``: the kernel's time over that copy's time (1.0: as fast as a copy of the same bytes);
    ``copy_pct_of_peak``: the copy's own GB/s as % of the big (2 GiB) copy, what one simple launch reaches at that size.
    Contexts without a copy row are left out.
    """
    cp = pd.DataFrame(list(copy_rows))
    if df.empty or cp.empty:
        return pd.DataFrame()
    cp = cp[cp["error"].isna()] if "error" in cp else cp
    cp = cp[["context_tokens", "traffic_bytes", "ms_median", "gbps"]].rename(
        columns={"traffic_bytes": "copy_bytes", "ms_median": "copy_ms", "gbps": "copy_gbps"})
    out = df[["context_tokens", "heads", "draft_tokens", "layout", "kernel", "kv_bytes", "ms_median", "pct_copy_bw"]].merge(
        cp, on="context_tokens", how="inner")
    out["over_copy"] = out["ms_median"] / out["copy_ms"]
    return out.reset_index(drop=True)


def target_needs(df: pd.DataFrame, copy_gbps: float, copy_rows: Iterable[Mapping[str, Any]]) -> pd.DataFrame:
    """Per case of issue 13's bandwidth targets (memory and h8t8, see :func:`issue13_targets`): the time the target
    allows (``target_ms``: the case's KV bytes at the threshold's share of ``copy_gbps``), against a plain copy of the
    same bytes (``target_over_copy``), our fastest bf16 kernel and each anchor measured on the case.

    ``ours_cut_pct``: how much of our fastest kernel's time the target asks to remove. ``fixed_budget_us``: the fixed
    cost per call the target leaves at that kernel's marginal rate (:func:`fixed_cost_by_kernel`), beside its fitted
    fixed cost (``ours_fixed_us``).
    """
    t = issue13_targets(df)
    if t.empty:
        return pd.DataFrame()
    t = t[~t["target"].str.startswith("compute")]
    keys = ["context_tokens", "heads", "draft_tokens", "layout"]
    out = []
    fits = fixed_cost_by_kernel(df)
    cp = same_bytes_copy(df, copy_rows)
    for (target, ctx, h, tt, lay), g in t.groupby(["target"] + keys):
        case = df[(df["context_tokens"] == ctx) & (df["heads"] == h) & (df["draft_tokens"] == tt) & (df["layout"] == lay)]
        kv_bytes = float(case["kv_bytes"].iloc[0])
        thr = float(g["threshold"].iloc[0])
        target_ms = kv_bytes / (thr / 100 * copy_gbps * 1e9) * 1e3
        ours = _ours(case).sort_values("ms_median")
        row: dict[str, Any] = {"target": target, "context_tokens": ctx, "heads": h, "draft_tokens": tt, "layout": lay,
                               "target_ms": target_ms}
        c = cp[cp["context_tokens"] == ctx]
        row["copy_ms"] = float(c["copy_ms"].iloc[0]) if not c.empty else float("nan")
        row["target_over_copy"] = target_ms / row["copy_ms"]
        if not ours.empty:
            best = ours.iloc[0]
            row.update(ours_kernel=best["kernel"], ours_ms=float(best["ms_median"]),
                       ours_cut_pct=100 * (1 - target_ms / float(best["ms_median"])))
            f = fits[(fits["kernel"] == best["kernel"]) & (fits["heads"] == h) & (fits["draft_tokens"] == tt)] \
                if not fits.empty else fits
            if not f.empty:
                row["ours_fixed_us"] = float(f["fixed_us"].iloc[0])
                row["fixed_budget_us"] = 1e3 * target_ms - kv_bytes / (float(f["marginal_gbps"].iloc[0]) * 1e9) * 1e6
        for a in case[case["design"] == "anchor"].itertuples():
            row[f"{a.kernel}_ms"] = float(a.ms_median)
        out.append(row)
    return pd.DataFrame(out)
