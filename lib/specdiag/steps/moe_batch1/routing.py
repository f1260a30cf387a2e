"""Which experts a pass touches (pure): distinct experts per pass and layer from the recorder's counts, per window of
consecutive tokens from a request's routed experts, against the uniform expectation, and whether routing spreads.

- A pass's **tokens**: a MoE layer's counts sum to tokens x top_k; the median over MoE layers / top_k (dense layers
  count 0 and are left out). **Kind**: ``verify`` when the pass has the server's tokens per verify step (speculation
  on), ``decode`` for 1 token, else ``extend`` (prefill chunks).
- **Distinct experts** of a layer in a pass: experts with a count > 0. **Effective tokens**: how many independent
  tokens would touch that many (:func:`effective_tokens`); **max count**: the most tokens one expert got in a layer
  (median over layers). A verify pass of T tokens whose drafts are one repeated token routes like 2 tokens, max count
  T - 1 (SGLang's NGRAM pads a draft it cannot match with token 0: seen on the H200).
- **Uniform expectation** (specdiag.geometry.active_experts_per_layer, ``uniform``): each token picks top_k distinct
  experts of E uniformly and independently: E x (1 - (1 - k/E)^T). For independent tokens no routing distribution
  touches more experts on average, so a trained model's tokens, which share experts, touch fewer.
- **Spread**: the median over a group's passes and layers of distinct / expected. Random weights can route every token
  alike (on the H200 with SGLang 0.5.17, 2026-12-02: ``--load-format dummy`` sent every token to the same 8 experts); conclusions
  about expert bytes are drawn only when the verify passes' ratio is at least :data:`SPREAD_MIN` (the check).
- A request's **routed experts** (SGLang 0.5.17 ``--enable-return-routed-experts``: ``meta_info.routed_experts``,
  base64 of raw int32 ``[tokens, layers, top_k]`` covering positions ``[start, seqlen - 1)``; vLLM 0.32
  ``--enable-return-routed-experts``: ``choices[].routed_experts``, base64 of a ``.npy`` file (np.save) of
  ``[tokens - 1, layers, top_k]`` in uint8/uint16/int32, vllm/utils/serial_utils.py numpy2base64; older vLLM: nested
  lists): per window of T consecutive tokens, the distinct experts per layer, for any T from one request (what a
  verify pass of those T tokens would read, its rejected drafts aside).
"""

from __future__ import annotations

import base64
import io
import math
import statistics
from typing import Any, Iterable, Sequence

import numpy as np
import pandas as pd

from specdiag.geometry import active_experts_per_layer
from specdiag.geometry.types import MoEShape
from specdiag.steps.moe_batch1.recorder import Dump

SPREAD_MIN = 0.8  # distinct / expected at or above this: the routing spreads like independent tokens
TOKENS_PER_STEP = (1, 2, 4, 8, 16)  # the ladder 11 shows


def expected_distinct(num_experts: int, top_k: int, tokens: int) -> float:
    """Expected distinct experts when ``tokens`` independent tokens each pick ``top_k`` of ``num_experts`` uniformly."""
    return active_experts_per_layer(MoEShape(num_experts, top_k, 1, 0, ()), tokens, "uniform")


def effective_tokens(distinct: float, num_experts: int, top_k: int) -> float:
    """How many independent tokens touch ``distinct`` experts on average (:func:`expected_distinct` inverted): a pass
    whose tokens repeat routes like fewer tokens than it scores (SGLang's NGRAM fills a draft it cannot match with
    token 0, sglang/kernels/jit/csrc/ngram_corpus/result.cpp "zero padding to length", and the copies route alike)."""
    if distinct <= 0:
        return 0.0
    if distinct >= num_experts:
        return float("inf")
    return math.log(1 - distinct / num_experts) / math.log(1 - top_k / num_experts)


def moe_layers(dump: Dump) -> list[int]:
    """Layers whose counts are not all zero in some pass (the MoE layers; dense layers count nothing)."""
    if not dump.passes:
        return []
    total = sum(p.counts for p in dump.passes)
    return [int(i) for i in np.flatnonzero(total.sum(axis=1) > 0)]


def pass_table(dump: Dump, top_k: int, verify_tokens: int | None = None) -> pd.DataFrame:
    """One row per pass: id, tokens, kind, distinct experts over its MoE layers (median, min, max), the uniform
    expectation for its tokens, and their ratio."""
    layers = moe_layers(dump)
    rows = []
    for p in dump.passes:
        sub = p.counts[layers]
        if sub.size == 0:
            continue
        per_layer_tokens = sub.sum(axis=1) / top_k
        tokens = float(np.median(per_layer_tokens))
        if tokens <= 0:
            continue
        distinct = (sub > 0).sum(axis=1)
        t = int(round(tokens))
        kind = "verify" if verify_tokens and verify_tokens > 1 and t == verify_tokens else \
            "decode" if t == 1 else "extend"
        exp = expected_distinct(dump.num_experts, top_k, t)
        rows.append({"forward_pass_id": p.forward_pass_id, "tokens": t, "kind": kind,
                     "distinct_median": float(np.median(distinct)), "distinct_min": int(distinct.min()),
                     "effective_tokens": effective_tokens(float(np.median(distinct)), dump.num_experts, top_k),
                     "max_count": int(np.median(sub.max(axis=1))),
                     "distinct_max": int(distinct.max()), "expected_uniform": exp,
                     "spread_ratio": float(np.median(distinct)) / exp, "moe_layers": len(layers),
                     "tokens_consistent": bool(np.all(np.isclose(per_layer_tokens, tokens)))})
    return pd.DataFrame(rows)


def by_tokens(passes: pd.DataFrame, num_experts: int, top_k: int) -> pd.DataFrame:
    """Per tokens per pass: passes, distinct experts per layer (median of the passes' medians), the expectation,
    the ratio, and the multiplier over one token's top_k (the expert bytes a step reads against a 1-token step)."""
    if passes.empty:
        return pd.DataFrame()
    out = []
    for (t, kind), g in passes.groupby(["tokens", "kind"]):
        d = float(g["distinct_median"].median())
        exp = expected_distinct(num_experts, top_k, int(t))
        out.append({"tokens": int(t), "kind": kind, "passes": len(g), "distinct": d, "expected_uniform": exp,
                    "spread_ratio": d / exp, "effective_tokens": effective_tokens(d, num_experts, top_k),
                    "over_t1_x": d / top_k})
    return pd.DataFrame(out).sort_values(["kind", "tokens"]).reset_index(drop=True)


def spread_check(table: pd.DataFrame, kind: str = "verify") -> tuple[bool | None, float | None, str]:
    """Whether ``kind`` passes spread like independent tokens (median ratio >= SPREAD_MIN); None when there are none.
    Also used on :func:`window_table` (kind ``window``)."""
    sel = table[table["kind"] == kind] if "kind" in table else table
    if sel.empty:
        return None, None, f"no {kind} passes recorded"
    ratio = float(statistics.median(sel["spread_ratio"]))
    ok = ratio >= SPREAD_MIN
    return ok, ratio, (f"{kind} passes touch {100 * ratio:.0f}% of the experts independent tokens would (median "
                       f"over {len(sel)} {'groups' if 'passes' in sel else 'passes'}; spread when >= "
                       f"{100 * SPREAD_MIN:.0f}%)")


# ---- a request's routed experts -------------------------------------------------------------------------------

def decode_sglang(b64: str, num_layers: int, top_k: int) -> np.ndarray:
    """SGLang's ``meta_info.routed_experts`` (base64 of int32, row-major ``[tokens, layers, top_k]``) as an array."""
    flat = np.frombuffer(base64.b64decode(b64), dtype=np.int32)
    per = num_layers * top_k
    if flat.size % per:
        raise ValueError(f"routed_experts holds {flat.size} ids, not a multiple of layers x top_k = {per}")
    return flat.reshape(-1, num_layers, top_k)


def decode_vllm(b64: str) -> np.ndarray:
    """vLLM 0.32's ``routed_experts`` (base64 of ``.npy`` bytes, no pickle) as an int64 ``[tokens, layers, top_k]``."""
    arr = np.load(io.BytesIO(base64.b64decode(b64)), allow_pickle=False)
    if arr.ndim != 3:
        raise ValueError(f"vLLM routed_experts must be [tokens, layers, top_k]; got shape {arr.shape}")
    return arr.astype(np.int64)


def from_lists(values: Sequence[Sequence[Sequence[int]]]) -> np.ndarray:
    """vLLM's ``routed_experts`` / ``prompt_routed_experts`` (nested lists ``[tokens, moe_layers, top_k]``)."""
    arr = np.asarray(values, dtype=np.int64)
    if arr.ndim != 3:
        raise ValueError(f"routed experts must be [tokens, layers, top_k]; got shape {arr.shape}")
    return arr


def routed_layers(routed: np.ndarray) -> list[int]:
    """Layers with routing (a dense layer's ids are all equal, usually 0, in SGLang's capture)."""
    return [i for i in range(routed.shape[1]) if len(np.unique(routed[:, i, :])) > 1]


def captured_rows(routed: np.ndarray) -> int:
    """Token rows that hold routing: some layer's top_k ids are not all one id (a routed token's top_k experts are
    distinct). SGLang 0.5.17 beside NGRAM speculation answered with the right number of rows, every one zeros
    (measured on the H200): rows are not routing unless this counts them."""
    if routed.size == 0:
        return 0
    return int((routed.max(axis=2) != routed.min(axis=2)).any(axis=1).sum())


def window_table(routed: np.ndarray, num_experts: int, tokens_per_step: Iterable[int] = TOKENS_PER_STEP,
                 first: int = 0) -> pd.DataFrame:
    """Per T: non-overlapping windows of T consecutive tokens from ``first`` on; distinct experts per MoE layer per
    window (median over windows and layers), the expectation and the ratio (kind ``window``)."""
    layers = routed_layers(routed)
    k = routed.shape[2]
    rows = []
    for t in tokens_per_step:
        n = (routed.shape[0] - first) // t
        if n < 1 or not layers:
            continue
        w = routed[first:first + n * t, layers, :].reshape(n, t, len(layers), k)
        distinct = [len(np.unique(w[i, :, j, :])) for i in range(n) for j in range(len(layers))]
        d = float(np.median(distinct))
        exp = expected_distinct(num_experts, k, t)
        rows.append({"tokens": t, "kind": "window", "windows": n, "distinct": d, "expected_uniform": exp,
                     "spread_ratio": d / exp, "over_t1_x": d / k})
    return pd.DataFrame(rows)


def summary_numbers(table: pd.DataFrame) -> dict[str, Any]:
    """tokens -> distinct (the medians), for the metrics."""
    return {str(int(r.tokens)): round(float(r.distinct), 3) for r in table.itertuples()}
