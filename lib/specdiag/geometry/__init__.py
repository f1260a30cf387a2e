"""Model geometry: the bytes one decode step must read, from a Hugging Face config.json or a preset.

Formulas (bytes are decimal: 1 GB = 1e9 B, not GiB):

- KV values stored per token per layer
  - MLA (DeepSeek-V2/V3, Kimi-K2): one compressed latent, ``kv_lora_rank + qk_rope_head_dim``
    values (512 + 64 = 576), shared by all heads. SGLang's MLA pool keeps one latent "head", so under
    tensor parallelism every rank holds and reads the whole latent (it is replicated, not split).
  - GQA and MHA: ``2 x num_key_value_heads x head_dim`` (a K and a V row per KV head). Under tensor
    parallelism the KV heads are split: each rank holds ``ceil(kv_heads / tp)`` of them, at least one
    (SGLang replicates KV heads when there are fewer than ranks).
- KV bytes one step reads in a layer at context L: ``min(L, window) x values x kv_dtype bytes``;
  ``window`` is the sliding window for ``sliding_attention`` layers and unbounded for
  ``full_attention`` layers. Mixed layer types (``layer_types`` in the config) are summed per layer.
- Weight bytes per decode step: every weight of a dense model; for a mixture of experts, the
  attention, the dense MLP layers, the shared experts, the router and the routed experts the step's
  tokens activate (see :func:`active_experts_per_layer`), plus the LM head (read whole each step) and
  one embedding row per token. Under tensor parallelism each rank reads its shard (SGLang's
  layout: MLA's ``q_a_proj`` and ``kv_a_proj_with_mqa`` and the router are replicated; the other
  projections, the MLPs, each expert's intermediate dimension and the vocabulary are split; read in
  sgl-project/sglang python/sglang/srt/models/deepseek_v2.py, where ``fused_qkv_a_proj_with_mqa``
  is a ``ReplicatedLinear`` and ``q_b_proj`` a ``ColumnParallelLinear``).

Everything here is a pure function of a :class:`ModelGeometry`; nothing reads the network.

Modules (all public names are importable from here, so callers import only :mod:`specdiag.geometry`):

- :mod:`specdiag.geometry.types`: :class:`ModelGeometry`, :class:`MoEShape`, :class:`WeightBytesPerParam`,
  the layer kinds and :data:`DTYPE_BYTES`;
- this module: the math (per-rank sizes under tensor parallelism, KV bytes, weight bytes, :func:`describe`);
- :mod:`specdiag.geometry.config`: config.json parsing, :func:`load_geometry`, :func:`geometry_for_run`;
- :mod:`specdiag.geometry.presets`: the presets and their sources (:data:`PRESETS`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

# Re-exported: the names callers import from specdiag.geometry.
from specdiag.geometry.config import (  # noqa: F401
    from_hf_config,
    geometry_for_run,
    load_geometry,
    recorded_config,
    weight_bytes_from_config,
)
from specdiag.geometry.presets import PRESETS, preset_config  # noqa: F401
from specdiag.geometry.types import (  # noqa: F401
    DTYPE_BYTES,
    LAYER_FULL,
    LAYER_SLIDING,
    AttentionKind,
    ExpertRouting,
    ModelGeometry,
    MoEShape,
    WeightBytesPerParam,
    dtype_bytes,
)


# ---------------------------------------------------------------------------------------------
# Per-rank sizes under tensor parallelism
# ---------------------------------------------------------------------------------------------

def _check_tp(tp_size: int) -> None:
    if not isinstance(tp_size, int) or tp_size < 1:
        raise ValueError(f"tp_size must be a whole number >= 1; got {tp_size!r}")


def local_attention_heads(geom: ModelGeometry, tp_size: int = 1) -> int:
    """Query heads on one rank: ceil(heads / tp) (64 heads under TP 8 -> 8)."""
    _check_tp(tp_size)
    return math.ceil(geom.num_attention_heads / tp_size)


def local_kv_heads(geom: ModelGeometry, tp_size: int = 1) -> int:
    """KV heads one rank holds: MLA 1 (replicated latent); GQA/MHA max(1, ceil(kv_heads / tp))."""
    _check_tp(tp_size)
    if geom.attention == "mla":
        return 1
    return max(1, math.ceil(geom.num_kv_heads / tp_size))


def kv_bytes_per_token_per_layer_per_rank(geom: ModelGeometry, tp_size: int = 1) -> float:
    """Bytes one rank stores per token per layer. MLA: the whole latent; GQA: its share of KV heads."""
    _check_tp(tp_size)
    if geom.attention == "mla":
        return geom.kv_bytes_per_token_per_layer
    return 2 * local_kv_heads(geom, tp_size) * geom.head_dim * dtype_bytes(geom.kv_dtype)


def attention_span_tokens(geom: ModelGeometry, context_tokens: int, layer: int) -> int:
    """Tokens layer ``layer`` attends to at context L: min(L, window) for sliding layers, else L."""
    if context_tokens < 0:
        raise ValueError(f"context_tokens must be >= 0; got {context_tokens}")
    kind = geom.layer_types[layer]
    if kind == LAYER_SLIDING:
        assert geom.sliding_window is not None
        return min(context_tokens, geom.sliding_window)
    return context_tokens


def kv_bytes_per_step(geom: ModelGeometry, context_tokens: int, tp_size: int = 1,
                      span_cap_tokens: int | None = None) -> float:
    """KV bytes one rank reads in one decode step at context L, summed over layers.

    ``span_cap_tokens`` caps every layer's span (a server-side window such as SGLang's
    ``speculative_draft_window_size`` for a drafter); None for no cap.
    """
    per_token = kv_bytes_per_token_per_layer_per_rank(geom, tp_size)
    total = 0.0
    for layer in range(geom.num_layers):
        span = attention_span_tokens(geom, context_tokens, layer)
        if span_cap_tokens is not None:
            span = min(span, span_cap_tokens)
        total += span * per_token
    return total


def kv_bytes_per_layer_breakdown(geom: ModelGeometry, context_tokens: int, tp_size: int = 1,
                                 span_cap_tokens: int | None = None) -> list[dict[str, Any]]:
    """One dict per layer: layer, layer_type, span_tokens, kv_bytes (one rank, one step)."""
    per_token = kv_bytes_per_token_per_layer_per_rank(geom, tp_size)
    out = []
    for layer in range(geom.num_layers):
        span = attention_span_tokens(geom, context_tokens, layer)
        if span_cap_tokens is not None:
            span = min(span, span_cap_tokens)
        out.append({"layer": layer, "layer_type": geom.layer_types[layer], "span_tokens": span,
                    "kv_bytes": span * per_token})
    return out


# ---------------------------------------------------------------------------------------------
# Weights
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class AttentionParams:
    """Attention parameters of one layer: replicated on every rank vs split across ranks."""

    replicated: int  # MLA q_a_proj + kv_a_proj_with_mqa (+ their norms)
    split: int       # the rest (q_b, kv_b, o for MLA; q, k, v, o for GQA/MHA)


def attention_params_per_layer(geom: ModelGeometry, tp_size: int = 1) -> AttentionParams:
    """Parameters of one attention layer that one rank holds, by replicated/split (split not yet divided)."""
    h, heads = geom.hidden_size, geom.num_attention_heads
    if geom.attention == "mla":
        nope = geom.qk_nope_head_dim or 0
        rope = geom.qk_rope_head_dim or 0
        v = geom.v_head_dim or 0
        rank = geom.kv_lora_rank or 0
        if geom.q_lora_rank:
            q_rep = h * geom.q_lora_rank + geom.q_lora_rank
            q_split = geom.q_lora_rank * heads * (nope + rope)
        else:
            q_rep, q_split = 0, h * heads * (nope + rope)
        kv_rep = h * (rank + rope) + rank
        kv_split = rank * heads * (nope + v)
        o_split = heads * v * h
        return AttentionParams(replicated=q_rep + kv_rep, split=q_split + kv_split + o_split)
    hd = geom.head_dim
    q_o = 2 * h * heads * hd
    kv_whole = 2 * h * geom.num_kv_heads * hd
    return AttentionParams(replicated=0, split=q_o + kv_whole)


def active_experts_per_layer(moe: MoEShape, tokens_per_step: int, routing: ExpertRouting = "min") -> float:
    """Distinct routed experts one MoE layer reads when a step processes ``tokens_per_step`` tokens.

    - ``min``: every token picks the same top-k (the floor: k experts);
    - ``uniform``: each token picks k distinct experts uniformly at random, independently:
      E x (1 - (1 - k/E)^T) expected distinct experts;
    - ``max``: no overlap, min(E, k x T).
    """
    if tokens_per_step < 1:
        raise ValueError(f"tokens_per_step must be >= 1; got {tokens_per_step}")
    e, k, t = moe.n_routed_experts, moe.num_experts_per_tok, tokens_per_step
    if routing == "min":
        return float(k)
    if routing == "uniform":
        return e * (1.0 - (1.0 - k / e) ** t)
    if routing == "max":
        return float(min(e, k * t))
    raise ValueError(f"routing must be 'min', 'uniform' or 'max'; got {routing!r}")


@dataclass(frozen=True)
class WeightBytes:
    """Weight bytes one rank reads in one decode step, by part."""

    attention: float
    dense_mlp: float
    shared_experts: float
    routed_experts: float
    router: float
    embedding: float
    lm_head: float
    active_experts_per_moe_layer: float

    @property
    def total(self) -> float:
        return (self.attention + self.dense_mlp + self.shared_experts + self.routed_experts + self.router
                + self.embedding + self.lm_head)


def weight_bytes_per_step(geom: ModelGeometry, tp_size: int = 1, tokens_per_step: int = 1,
                          routing: ExpertRouting = "min") -> WeightBytes:
    """Weight bytes one rank reads per decode step (each weight once per step, whatever the token count)."""
    _check_tp(tp_size)
    wb = geom.weight_bytes
    h = geom.hidden_size
    att = attention_params_per_layer(geom, tp_size)
    if geom.attention == "mla":
        att_rank = att.replicated + att.split / tp_size
    else:
        heads_share = local_attention_heads(geom, tp_size) / geom.num_attention_heads
        kv_share = local_kv_heads(geom, tp_size) / max(geom.num_kv_heads, 1)
        q_o = 2 * h * geom.num_attention_heads * geom.head_dim
        att_rank = q_o * heads_share + (att.split - q_o) * kv_share
    attention = att_rank * geom.num_layers * wb.attention

    moe_layers = set(geom.moe.moe_layers) if geom.moe else set()
    n_dense = geom.num_layers - len(moe_layers)
    dense_mlp = n_dense * 3 * h * geom.intermediate_size / tp_size * wb.dense_mlp

    shared = routed = router = 0.0
    active = 0.0
    if geom.moe:
        m = geom.moe
        active = active_experts_per_layer(m, tokens_per_step, routing)
        n_moe = len(moe_layers)
        shared = n_moe * 3 * h * m.shared_intermediate_size / tp_size * wb.shared_experts
        routed = n_moe * active * 3 * h * m.moe_intermediate_size / tp_size * wb.routed_experts
        router = n_moe * h * m.n_routed_experts * wb.router
    embedding = tokens_per_step * h * wb.embedding
    lm_head = geom.vocab_size * h / tp_size * wb.lm_head
    return WeightBytes(attention=attention, dense_mlp=dense_mlp, shared_experts=shared, routed_experts=routed,
                       router=router, embedding=embedding, lm_head=lm_head, active_experts_per_moe_layer=active)


def total_params(geom: ModelGeometry) -> float:
    """All parameters of the model (embedding and LM head counted once if tied)."""
    h = geom.hidden_size
    att = attention_params_per_layer(geom)
    moe_layers = set(geom.moe.moe_layers) if geom.moe else set()
    total = geom.num_layers * (att.replicated + att.split)
    total += (geom.num_layers - len(moe_layers)) * 3 * h * geom.intermediate_size
    if geom.moe:
        m = geom.moe
        per_layer = 3 * h * (m.n_routed_experts * m.moe_intermediate_size + m.shared_intermediate_size)
        total += len(moe_layers) * (per_layer + h * m.n_routed_experts)
    total += geom.vocab_size * h * (1 if geom.tie_word_embeddings else 2)
    return float(total)


def describe(geom: ModelGeometry, tp_size: int = 1) -> dict[str, Any]:
    """A flat summary for tables and run.json (units in the keys)."""
    return {
        "name": geom.name, "attention": geom.attention, "num_layers": geom.num_layers,
        "num_attention_heads": geom.num_attention_heads, "local_attention_heads": local_attention_heads(geom, tp_size),
        "num_kv_heads": geom.num_kv_heads, "local_kv_heads": local_kv_heads(geom, tp_size),
        "head_dim": geom.head_dim, "kv_lora_rank": geom.kv_lora_rank, "qk_rope_head_dim": geom.qk_rope_head_dim,
        "kv_values_per_token_per_layer": geom.kv_values_per_token_per_layer, "kv_dtype": geom.kv_dtype,
        "kv_bytes_per_token_per_layer": geom.kv_bytes_per_token_per_layer,
        "kv_bytes_per_token_per_layer_per_rank": kv_bytes_per_token_per_layer_per_rank(geom, tp_size),
        "n_sliding_layers": sum(t == LAYER_SLIDING for t in geom.layer_types),
        "n_full_layers": sum(t == LAYER_FULL for t in geom.layer_types),
        "sliding_window_tokens": geom.sliding_window, "tp_size": tp_size,
        "moe_routed_experts": geom.moe.n_routed_experts if geom.moe else None,
        "moe_experts_per_token": geom.moe.num_experts_per_tok if geom.moe else None,
        "moe_layers": len(geom.moe.moe_layers) if geom.moe else 0,
        "total_params": total_params(geom), "weight_bytes_note": geom.weight_bytes.note,
        "max_position_embeddings": geom.max_position_embeddings, "source": geom.source,
    }

