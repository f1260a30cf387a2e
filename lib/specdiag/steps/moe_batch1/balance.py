"""How evenly a pass's expert work would fall on the GPUs under expert parallelism, and under tensor parallelism
(pure, from the recorder's counts).

- **Expert parallelism over n ranks** (SGLang's default placement with no redundant experts: physical expert e lives on
  rank e // (E / n), so each rank holds a contiguous block of E / n whole experts). A pass's layer gives each rank the
  tokens routed to its experts and the distinct experts of its block it must read. The step waits for the busiest
  rank: **max over mean distinct experts** per rank (1.0 is even), which sets the weight bytes each rank reads at
  batch 1, where bytes, not FLOPs, decide (it is also the busiest rank's expert bytes over tensor parallelism's, whose
  ranks each read 1/n of every distinct expert), and beside it max over mean tokens per rank (what FLOPs see).
- **Tensor parallelism over n ranks**: every rank holds 1/n of every expert and processes every token, so both ratios
  are 1.0 by construction; the cost is that every rank reads its slice of every distinct expert.

Per pass the ratio is the median over its MoE layers; per tokens-per-pass group the median over passes.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from specdiag.steps.moe_batch1.recorder import Dump
from specdiag.steps.moe_batch1.routing import moe_layers

RANKS = (2, 4, 8)


def rank_loads(counts: np.ndarray, ranks: int) -> tuple[np.ndarray, np.ndarray]:
    """Per layer and rank: tokens routed to the rank's experts, and distinct experts of the rank that were used.
    ``counts`` [layers, E]; E must divide by ``ranks``."""
    layers, experts = counts.shape
    if experts % ranks:
        raise ValueError(f"{experts} experts do not split evenly over {ranks} ranks")
    blocks = counts.reshape(layers, ranks, experts // ranks)
    return blocks.sum(axis=2), (blocks > 0).sum(axis=2)


def _max_over_mean(x: np.ndarray) -> np.ndarray:
    mean = x.mean(axis=1)
    return np.where(mean > 0, x.max(axis=1) / np.where(mean > 0, mean, 1), np.nan)


def pass_balance(dump: Dump, top_k: int, ranks: tuple[int, ...] = RANKS) -> pd.DataFrame:
    """One row per pass and rank count: tokens, the median over MoE layers of max/mean tokens per rank and of
    max/mean distinct experts per rank, and the busiest rank's distinct experts (median over layers)."""
    layers = moe_layers(dump)
    rows = []
    for p in dump.passes:
        sub = p.counts[layers]
        if sub.size == 0 or sub.sum() == 0:
            continue
        tokens = int(round(float(np.median(sub.sum(axis=1))) / top_k))
        for n in ranks:
            tok, dist = rank_loads(sub, n)
            rows.append({"forward_pass_id": p.forward_pass_id, "tokens": tokens, "ranks": n,
                         "tokens_max_over_mean": float(np.nanmedian(_max_over_mean(tok))),
                         "experts_max_over_mean": float(np.nanmedian(_max_over_mean(dist))),
                         "busiest_rank_experts": float(np.median(dist.max(axis=1))),
                         "mean_rank_experts": float(np.median(dist.mean(axis=1)))})
    return pd.DataFrame(rows)


def balance_table(per_pass: pd.DataFrame) -> pd.DataFrame:
    """Per tokens per pass and rank count: EP's medians over the passes, with the range over the passes of each ratio
    (``experts_lo``/``experts_hi``, ``tokens_lo``/``tokens_hi``), beside TP's 1.0."""
    if per_pass.empty:
        return pd.DataFrame()
    g = per_pass.groupby(["tokens", "ranks"])
    out = g[["tokens_max_over_mean", "experts_max_over_mean", "busiest_rank_experts", "mean_rank_experts"]].median()
    out["experts_lo"], out["experts_hi"] = g["experts_max_over_mean"].min(), g["experts_max_over_mean"].max()
    out["tokens_lo"], out["tokens_hi"] = g["tokens_max_over_mean"].min(), g["tokens_max_over_mean"].max()
    out["passes"] = g.size()
    out["tp_max_over_mean"] = 1.0
    return out.reset_index()
