"""A short text table of issue 13's targets and the anchors, from a kernel A/B run folder (printed by the device job).

    python -m specdiag.kernels.summary RUN_DIR
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional, Sequence

import pandas as pd

from specdiag.kernels import analysis
from specdiag.runs import Run


def summary_text(run_dir: str | Path) -> str:
    run = Run.open(run_dir)
    rows = run.rows("kernel_ab")
    peaks = run.meta.get("peaks", {})
    df = analysis.measured(rows)
    lines = [f"peaks: copy {peaks.get('copy_gbps', float('nan')):.0f} GB/s, matmul "
             f"{peaks.get('matmul_tflops', float('nan')):.0f} TFLOP/s; {len(rows)} rows, {len(df)} measured and correct"]
    bad = [r for r in rows if r.get("error")]
    if bad:
        lines.append(f"{len(bad)} rows with errors, e.g. {bad[0].get('kernel')}: {str(bad[0]['error'])[:160]}")
    t = analysis.target_verdicts(df)
    if not t.empty:  # ours and the best anchor side by side: an anchor meeting a target does not meet it for us
        cols = ["target", "context_tokens", "heads", "draft_tokens", "threshold", "ours_kernel", "ours_value", "ours_met",
                "anchor_kernel", "anchor_value", "anchor_met"]
        with pd.option_context("display.width", 250, "display.max_rows", 200, "display.max_colwidth", 60):
            lines.append(t[cols].round(2).to_string(index=False))
    cmp_ = analysis.anchor_comparison(df)
    if not cmp_.empty:
        with pd.option_context("display.width", 200, "display.max_rows", 200):
            lines.append(cmp_[["context_tokens", "heads", "draft_tokens", "layout", "anchor", "anchor_ms", "ours_kernel",
                               "ours_ms", "ours_over_anchor"]].round(4).to_string(index=False))
    st = analysis.anchor_status(rows)
    for r in st.itertuples():
        lines.append(f"{r.kernel}: {r.why[:150]}")
    f8 = analysis.fp8_table(df)
    if not f8.empty:
        lines.append("fp8/bf16 time " + f"{f8['fp8_over_bf16_time'].min():.2f}-{f8['fp8_over_bf16_time'].max():.2f}; "
                     f"rel err vs fp32 {f8['rel_err_vs_bf16_ref'].min():.2e}-{f8['rel_err_vs_bf16_ref'].max():.2e}")
    return "\n".join(lines)


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = list(argv if argv is not None else sys.argv[1:])
    if len(args) != 1:
        print("usage: python -m specdiag.kernels.summary RUN_DIR", file=sys.stderr)
        return 2
    print(summary_text(args[0]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
