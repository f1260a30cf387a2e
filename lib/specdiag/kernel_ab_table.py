"""06's ``kernel_ab`` table read back (one row per case and arm, written by :mod:`specdiag.steps.kernel_ab.harness`):
the last row of each case and arm (:func:`latest`), the timed and correct ones (:func:`measured`, ``us`` the median
replay in µs) and the others with why (:func:`not_measured`). 06 analyses them, 10 predicts its KV-layout cost from
them. Pure functions, no I/O; apart from :mod:`specdiag.kernels` so that reading the rows imports no torch."""

from __future__ import annotations

from typing import Any, Iterable, Mapping

import pandas as pd

#: The columns that name a case: context, query heads, draft tokens.
CASE = ["context_tokens", "heads", "draft_tokens"]


def latest(rows: Iterable[Mapping[str, Any]]) -> pd.DataFrame:
    """One row per (case, arm): the last one written (a resumed run may hold an earlier skip of the same key)."""
    df = pd.DataFrame(list(rows))
    if df.empty:
        return df
    return df.drop_duplicates(subset=[*CASE, "arm"], keep="last").reset_index(drop=True)


def measured(rows: Iterable[Mapping[str, Any]]) -> pd.DataFrame:
    """The rows with a time and a correct result."""
    df = latest(rows)
    if df.empty or "ms_median" not in df:
        return pd.DataFrame(columns=[*CASE, "arm", "us"])
    ok = df["ms_median"].notna() & df.get("correct", pd.Series(True, index=df.index)).fillna(False).astype(bool)
    return df[ok].reset_index(drop=True)


def not_measured(rows: Iterable[Mapping[str, Any]]) -> pd.DataFrame:
    """Case, arm and why, for every row skipped or failed."""
    df = latest(rows)
    if df.empty:
        return pd.DataFrame(columns=[*CASE, "arm", "why"])
    bad = df[df.get("ms_median", pd.Series(index=df.index, dtype=float)).isna()
             | ~df.get("correct", pd.Series(True, index=df.index)).fillna(False).astype(bool)].copy()
    bad["why"] = bad["skipped"].fillna(bad["error"]) if "error" in bad else bad["skipped"]
    return bad[[*CASE, "arm", "why"]].reset_index(drop=True)
