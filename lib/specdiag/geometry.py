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
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Literal, Mapping

from specdiag.paths import MODELS_DIR

AttentionKind = Literal["mla", "gqa", "mha"]
ExpertRouting = Literal["min", "uniform", "max"]
LAYER_FULL = "full_attention"
LAYER_SLIDING = "sliding_attention"

#: Bytes per stored value for the KV-cache dtypes SGLang and transformers name.
DTYPE_BYTES: dict[str, float] = {
    "bf16": 2, "bfloat16": 2, "fp16": 2, "float16": 2, "half": 2, "auto": 2,
    "fp8": 1, "fp8_e4m3": 1, "fp8_e5m2": 1, "float8_e4m3fn": 1, "float8": 1,
    "fp32": 4, "float32": 4, "float": 4,
}


def dtype_bytes(name: str) -> float:
    """Bytes per value for a dtype name ('bf16', 'fp8', 'float32', ...). Raises naming the choices."""
    key = str(name).lower().replace("torch.", "")
    if key not in DTYPE_BYTES:
        raise ValueError(f"unknown dtype {name!r}: use one of {sorted(DTYPE_BYTES)}")
    return DTYPE_BYTES[key]


@dataclass(frozen=True)
class WeightBytesPerParam:
    """Stored bytes per parameter, by part of the model (scales of quantized formats included)."""

    attention: float = 2.0       # q/k/v/o projections (MLA: q_a, q_b, kv_a, kv_b, o)
    dense_mlp: float = 2.0       # MLP of dense layers
    shared_experts: float = 2.0  # always-active experts of an MoE layer
    routed_experts: float = 2.0  # the routed experts
    router: float = 2.0          # the MoE gate
    embedding: float = 2.0       # input embedding (one row per token is read)
    lm_head: float = 2.0         # output projection (read whole every step)
    note: str = ""               # how these were derived (dtype, quantization config)


@dataclass(frozen=True)
class MoEShape:
    """Mixture-of-experts shape. Expert MLPs are gated (gate, up, down: 3 x hidden x intermediate)."""

    n_routed_experts: int           # routed experts per MoE layer
    num_experts_per_tok: int        # routed experts each token activates (top-k)
    moe_intermediate_size: int      # intermediate size of one routed expert
    shared_intermediate_size: int   # total intermediate size of the shared experts (0 = none)
    moe_layers: tuple[int, ...]     # indices of the layers whose MLP is an MoE


@dataclass(frozen=True)
class ModelGeometry:
    """What decides the bytes and FLOPs of a decode step. Build with :func:`from_hf_config`."""

    name: str                         # a label (preset name, config path, model_type)
    attention: AttentionKind          # mla, gqa or mha
    num_layers: int                   # decoder layers
    num_attention_heads: int          # query heads (whole model, before TP)
    num_kv_heads: int                 # KV heads (GQA/MHA); 1 for MLA's shared latent
    head_dim: int                     # per-head q/k dim (GQA/MHA); MLA: qk_nope + qk_rope
    hidden_size: int
    vocab_size: int
    intermediate_size: int            # dense MLP intermediate size
    layer_types: tuple[str, ...]      # per layer: full_attention or sliding_attention
    sliding_window: int | None        # window of sliding layers, tokens
    kv_dtype: str = "bf16"            # KV cache dtype
    kv_lora_rank: int | None = None   # MLA latent rank
    qk_rope_head_dim: int | None = None
    qk_nope_head_dim: int | None = None
    v_head_dim: int | None = None
    q_lora_rank: int | None = None
    moe: MoEShape | None = None
    weight_bytes: WeightBytesPerParam = field(default_factory=WeightBytesPerParam)
    tie_word_embeddings: bool = False
    max_position_embeddings: int | None = None
    rope_scaling: Mapping[str, Any] | None = None
    model_type: str = ""
    source: str = ""                  # where the numbers came from

    @property
    def kv_values_per_token_per_layer(self) -> int:
        """Values stored per token per layer: MLA kv_lora_rank + qk_rope_head_dim; else 2 x kv_heads x head_dim."""
        if self.attention == "mla":
            assert self.kv_lora_rank is not None and self.qk_rope_head_dim is not None
            return self.kv_lora_rank + self.qk_rope_head_dim
        return 2 * self.num_kv_heads * self.head_dim

    @property
    def kv_bytes_per_token_per_layer(self) -> float:
        """Bytes per token per layer (whole model, before TP), at ``kv_dtype``."""
        return self.kv_values_per_token_per_layer * dtype_bytes(self.kv_dtype)

    def with_kv_dtype(self, kv_dtype: str) -> "ModelGeometry":
        dtype_bytes(kv_dtype)
        return replace(self, kv_dtype=kv_dtype)


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


# ---------------------------------------------------------------------------------------------
# From a Hugging Face config.json
# ---------------------------------------------------------------------------------------------

def _text_config(cfg: Mapping[str, Any]) -> Mapping[str, Any]:
    """Multimodal wrappers (Kimi-K2.5/K2.6: model_type kimi_k25) keep the language model in text_config."""
    inner = cfg.get("text_config")
    if isinstance(inner, Mapping) and inner.get("num_hidden_layers"):
        merged = dict(inner)
        if "quantization_config" not in merged and "quantization_config" in cfg:
            merged["quantization_config"] = cfg["quantization_config"]
        return merged
    return cfg


def _require(cfg: Mapping[str, Any], key: str, what: str) -> Any:
    value = cfg.get(key)
    if value is None:
        raise ValueError(f"the model config has no {key!r}, which {what} needs: pass a complete config.json "
                         f"or a preset name ({', '.join(sorted(PRESETS))})")
    return value


def _layer_types(cfg: Mapping[str, Any], n_layers: int) -> tuple[tuple[str, ...], int | None]:
    """Per-layer attention types and the sliding window, from the config's fields.

    Reads ``layer_types`` when present (transformers >= 4.5x writes it for Qwen3, Gemma, Mistral);
    else Qwen2/3's ``use_sliding_window`` + ``max_window_layers`` (layers at or above it slide);
    else a bare ``sliding_window`` (Mistral) means every layer slides.
    """
    window = cfg.get("sliding_window")
    explicit = cfg.get("layer_types")
    if explicit:
        types = tuple(str(t) for t in explicit)
        if len(types) != n_layers:
            raise ValueError(f"layer_types has {len(types)} entries but num_hidden_layers is {n_layers}")
        unknown = sorted(set(types) - {LAYER_FULL, LAYER_SLIDING})
        if unknown:
            raise ValueError(f"layer_types {unknown} are not modelled (only {LAYER_FULL!r} and {LAYER_SLIDING!r})")
        if LAYER_SLIDING in types and not window:
            raise ValueError("layer_types has sliding_attention layers but the config has no sliding_window")
        return types, (int(window) if window and LAYER_SLIDING in types else None)
    if "use_sliding_window" in cfg:
        if not cfg.get("use_sliding_window") or not window:
            return (LAYER_FULL,) * n_layers, None
        first = int(cfg.get("max_window_layers", 0) or 0)
        return tuple(LAYER_SLIDING if i >= first else LAYER_FULL for i in range(n_layers)), int(window)
    if window:
        return (LAYER_SLIDING,) * n_layers, int(window)
    return (LAYER_FULL,) * n_layers, None


def _moe_shape(cfg: Mapping[str, Any], n_layers: int) -> MoEShape | None:
    """DeepSeek/Kimi (n_routed_experts), Qwen-MoE (num_experts) or Mixtral (num_local_experts)."""
    if cfg.get("n_routed_experts"):
        first_dense = int(cfg.get("first_k_dense_replace", 0) or 0)
        freq = cfg.get("moe_layer_freq", 1) or 1
        layers = tuple(i for i in range(n_layers) if i >= first_dense and i % int(freq) == 0)
        inter = int(_require(cfg, "moe_intermediate_size", "an MoE model's expert size"))
        return MoEShape(n_routed_experts=int(cfg["n_routed_experts"]),
                        num_experts_per_tok=int(_require(cfg, "num_experts_per_tok", "MoE routing")),
                        moe_intermediate_size=inter,
                        shared_intermediate_size=int(cfg.get("n_shared_experts", 0) or 0) * inter,
                        moe_layers=layers)
    if cfg.get("num_experts"):
        step = int(cfg.get("decoder_sparse_step", 1) or 1)
        only_mlp = set(cfg.get("mlp_only_layers") or [])
        layers = tuple(i for i in range(n_layers) if i not in only_mlp and (i + 1) % step == 0)
        return MoEShape(n_routed_experts=int(cfg["num_experts"]),
                        num_experts_per_tok=int(_require(cfg, "num_experts_per_tok", "MoE routing")),
                        moe_intermediate_size=int(_require(cfg, "moe_intermediate_size", "MoE expert size")),
                        shared_intermediate_size=int(cfg.get("shared_expert_intermediate_size", 0) or 0),
                        moe_layers=layers)
    if cfg.get("num_local_experts"):
        return MoEShape(n_routed_experts=int(cfg["num_local_experts"]),
                        num_experts_per_tok=int(_require(cfg, "num_experts_per_tok", "MoE routing")),
                        moe_intermediate_size=int(_require(cfg, "intermediate_size", "MoE expert size")),
                        shared_intermediate_size=0, moe_layers=tuple(range(n_layers)))
    return None


# Module names that stand for each part, to test against a quantization config's ``ignore`` list.
_PART_MODULES = {
    "attention": "model.layers.1.self_attn.q_proj",
    "dense_mlp": "model.layers.0.mlp.gate_proj",
    "shared_experts": "model.layers.1.mlp.shared_experts.gate_proj",
    "routed_experts": "model.layers.1.mlp.experts.0.gate_proj",
    "router": "model.layers.1.mlp.gate",
    "lm_head": "lm_head",
}


def _ignored(module: str, ignore: list[str]) -> bool:
    for pattern in ignore:
        if pattern.startswith("re:"):
            if re.fullmatch(pattern[3:], module):
                return True
        elif module == pattern or module.endswith("." + pattern):
            return True
    return False


def weight_bytes_from_config(cfg: Mapping[str, Any], weight_dtype: str | None = None) -> WeightBytesPerParam:
    """Bytes per parameter by part, from ``torch_dtype``/``dtype`` and ``quantization_config``.

    - no quantization: the model dtype (``weight_dtype`` overrides it) for everything;
    - ``quant_method: fp8`` (DeepSeek-V3, Kimi-K2): linear layers 1 B plus one fp32 scale per
      ``weight_block_size`` block (128 x 128: 4/16384 B per parameter); embedding, LM head and
      router stay at the model dtype;
    - ``quant_method: compressed-tensors`` with integer weights (Kimi-K2-Thinking, K2.5, K2.6): the
      linear layers not matched by ``ignore`` take ``num_bits / 8`` B plus one bf16 scale per
      ``group_size`` weights; the ignored ones (attention, shared experts, LM head in Kimi's
      configs) stay at the model dtype; the router and embedding stay at the model dtype.
    """
    base_name = weight_dtype or cfg.get("torch_dtype") or cfg.get("dtype") or "bfloat16"
    base = dtype_bytes(str(base_name))
    q = cfg.get("quantization_config") or {}
    method = str(q.get("quant_method", "")).lower()
    parts = {p: base for p in _PART_MODULES}
    note = f"model dtype {base_name} ({base:g} B/param)"
    if weight_dtype is None and method == "fp8":
        block = q.get("weight_block_size") or [128, 128]
        per = 1.0 + 4.0 / (int(block[0]) * int(block[1]))
        for p in ("attention", "dense_mlp", "shared_experts", "routed_experts"):
            parts[p] = per
        note = (f"fp8 linear layers with fp32 scales per {block[0]}x{block[1]} block ({per:.5f} B/param); "
                f"embedding, router and LM head at {base_name}")
    elif weight_dtype is None and method == "compressed-tensors":
        groups = q.get("config_groups") or {}
        w = next(iter(groups.values()), {}).get("weights", {}) if groups else {}
        bits = int(w.get("num_bits", 8))
        group = w.get("group_size")
        per = bits / 8 + (2.0 / int(group) if group else 0.0)
        ignore = [str(x) for x in (q.get("ignore") or [])]
        quantized = []
        for p, module in _PART_MODULES.items():
            if p == "router" or _ignored(module, ignore):
                continue
            parts[p] = per
            quantized.append(p)
        note = (f"compressed-tensors int{bits}" + (f", bf16 scale per {group} weights" if group else "")
                + f" ({per:g} B/param) for {', '.join(quantized)}; the rest at {base_name}")
    elif method and weight_dtype is None:
        note = f"quantization {method!r} is not modelled: every weight counted at {base_name}"
    return WeightBytesPerParam(embedding=base, note=note, **parts)


def from_hf_config(config: Mapping[str, Any] | str | Path, kv_dtype: str | None = None,
                   weight_dtype: str | None = None, name: str | None = None) -> ModelGeometry:
    """A :class:`ModelGeometry` from a Hugging Face config (a dict, a config.json path or its folder).

    ``kv_dtype``: the KV cache dtype (SGLang's ``--kv-cache-dtype``); None or ``auto``: the model's
    dtype from the config (bf16 when it names none). ``weight_dtype`` overrides the config's dtype
    and quantization.
    """
    source = "config dict"
    if isinstance(config, (str, Path)):
        path = Path(config)
        if path.is_dir():
            path = path / "config.json"
        if not path.exists():
            raise FileNotFoundError(f"no model config at {path}: pass a config.json path, its folder, "
                                    f"or a preset name ({', '.join(sorted(PRESETS))})")
        cfg_all: Mapping[str, Any] = json.loads(path.read_text())
        source = str(path)
    else:
        cfg_all = config
    cfg = _text_config(cfg_all)
    n_layers = int(_require(cfg, "num_hidden_layers", "the layer count"))
    hidden = int(_require(cfg, "hidden_size", "the weight sizes"))
    heads = int(_require(cfg, "num_attention_heads", "the attention shape"))
    types, window = _layer_types(cfg, n_layers)
    model_type = str(cfg_all.get("model_type", cfg.get("model_type", "")))
    if cfg.get("kv_lora_rank"):
        attention: AttentionKind = "mla"
        nope = int(_require(cfg, "qk_nope_head_dim", "MLA"))
        rope = int(_require(cfg, "qk_rope_head_dim", "MLA"))
        kv_heads, head_dim = 1, nope + rope
    else:
        kv_heads = int(cfg.get("num_key_value_heads") or heads)
        attention = "mha" if kv_heads == heads else "gqa"
        head_dim = int(cfg.get("head_dim") or hidden // heads)
        nope = rope = None  # type: ignore[assignment]
    kv = _kv_dtype_name(kv_dtype) if kv_dtype else None
    if kv_dtype and kv is None and kv_dtype != "auto":
        dtype_bytes(kv_dtype)  # raises naming the choices
    kv = kv or _kv_dtype_name(cfg.get("torch_dtype") or cfg.get("dtype") or cfg_all.get("torch_dtype")) or "bf16"
    return ModelGeometry(
        name=name or model_type or source, attention=attention, num_layers=n_layers,
        num_attention_heads=heads, num_kv_heads=kv_heads, head_dim=head_dim, hidden_size=hidden,
        vocab_size=int(_require(cfg, "vocab_size", "the LM head size")),
        intermediate_size=int(cfg.get("intermediate_size") or 0),
        layer_types=types, sliding_window=window, kv_dtype=kv,
        kv_lora_rank=cfg.get("kv_lora_rank"), qk_rope_head_dim=rope if attention == "mla" else None,
        qk_nope_head_dim=nope if attention == "mla" else None,
        v_head_dim=cfg.get("v_head_dim") if attention == "mla" else None,
        q_lora_rank=cfg.get("q_lora_rank") if attention == "mla" else None,
        moe=_moe_shape(cfg, n_layers), weight_bytes=weight_bytes_from_config(cfg, weight_dtype),
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        max_position_embeddings=cfg.get("max_position_embeddings"),
        rope_scaling=cfg.get("rope_scaling") or cfg.get("rope_parameters"),
        model_type=model_type, source=source,
    )


# ---------------------------------------------------------------------------------------------
# Presets: config dicts with the source of each figure
# ---------------------------------------------------------------------------------------------

def _deepseek_v3_config() -> dict[str, Any]:
    # deepseek-ai/DeepSeek-V3 inference/configs/config_671B.json (read from the identical copies in
    # Kwesik/DeepSeek-V3-Local-Setup@ba511b5 and Bobchenyx/DeepSeek-V3-tflsxyy@9845445): dim 7168,
    # inter_dim 18432, moe_inter_dim 2048, n_layers 61, n_dense_layers 3, n_heads 128,
    # 256 routed + 1 shared experts, 8 activated, q_lora_rank 1536, kv_lora_rank 512,
    # qk_nope 128, qk_rope 64, v_head_dim 128, vocab 129280, dtype fp8 (128x128 blocks).
    return {
        "model_type": "deepseek_v3", "num_hidden_layers": 61, "hidden_size": 7168,
        "intermediate_size": 18432, "moe_intermediate_size": 2048, "num_attention_heads": 128,
        "num_key_value_heads": 128, "n_routed_experts": 256, "n_shared_experts": 1,
        "num_experts_per_tok": 8, "first_k_dense_replace": 3, "moe_layer_freq": 1,
        "q_lora_rank": 1536, "kv_lora_rank": 512, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
        "v_head_dim": 128, "vocab_size": 129280, "torch_dtype": "bfloat16",
        "quantization_config": {"quant_method": "fp8", "weight_block_size": [128, 128]},
        "max_position_embeddings": 163840,
    }


def _kimi_k2_config() -> dict[str, Any]:
    # Kimi-K2 (moonshotai/Kimi-K2-Instruct): DeepSeek-V3 shape with 64 heads, 384 routed experts,
    # 1 dense layer, vocab 163840 (NVIDIA Megatron-Bridge KimiK2Provider docs: 61 layers, hidden 7168,
    # ffn 18432, 384 experts, moe ffn 2048, shared 2048, 64 heads, top-8; public config copies for
    # kv_lora_rank 512, q_lora_rank 1536, qk_nope 128, qk_rope 64, v 128). FP8 128x128 block weights.
    cfg = _deepseek_v3_config()
    cfg.update({"model_type": "kimi_k2", "num_attention_heads": 64, "num_key_value_heads": 64,
                "n_routed_experts": 384, "first_k_dense_replace": 1, "vocab_size": 163840,
                "max_position_embeddings": 131072})
    return cfg


def _kimi_k26_config() -> dict[str, Any]:
    # Kimi K2.6 (moonshotai/Kimi-K2.6): Kimi-K2's text shape, max_position_embeddings 262144, routed
    # experts in compressed-tensors INT4 (pack-quantized, symmetric, group_size 32), with attention,
    # shared experts and lm_head left in bf16 (the ignore list of Kimi's INT4 configs). Read from a
    # public adapter that checks the official config at revision 7eb5002 and from a public
    # parameter-count test carrying the K2.5/K2-Thinking configs (both found through the code index).
    cfg = _kimi_k2_config()
    cfg.update({"model_type": "kimi_k2", "max_position_embeddings": 262144,
                "quantization_config": {
                    "quant_method": "compressed-tensors", "format": "pack-quantized",
                    "config_groups": {"group_0": {"weights": {"num_bits": 4, "type": "int", "symmetric": True,
                                                              "group_size": 32}}},
                    "ignore": ["lm_head", "re:.*self_attn.*", "re:.*shared_experts.*"]}})
    return cfg


def _investigation_drafter_config() -> dict[str, Any]:
    # The investigation's DFlash drafter (reference/investigation.md, "The deployment"): a 6-layer
    # Qwen3ForCausalLM, 64 heads, 8 KV heads, head_dim 128, max_position_embeddings 262144; 5 layers
    # sliding-window (2048), 1 full-attention layer with YaRN. Which layer is the full one, the YaRN
    # factor, hidden and intermediate sizes and the vocabulary were not published: the full layer is
    # put last (only the count matters for bytes); the sizes are those of the target's Qwen3 family
    # drafters and only affect weight bytes, which notebook 03 does not use.
    return {
        "model_type": "qwen3", "architectures": ["Qwen3ForCausalLM"], "num_hidden_layers": 6,
        "num_attention_heads": 64, "num_key_value_heads": 8, "head_dim": 128, "hidden_size": 7168,
        "intermediate_size": 18432, "vocab_size": 163840, "max_position_embeddings": 262144,
        "layer_types": [LAYER_SLIDING] * 5 + [LAYER_FULL], "sliding_window": 2048,
        "rope_scaling": {"rope_type": "yarn", "factor": None, "applies_to": "full_attention layer",
                         "note": "YaRN on the full-attention layer; factor not published"},
        "block_size": 8, "torch_dtype": "bfloat16",
    }


def _embedded(kind: str) -> Callable[[], dict[str, Any]]:
    def load() -> dict[str, Any]:
        path = MODELS_DIR / kind / "config.json"
        if not path.exists():
            raise FileNotFoundError(f"the embedded {kind} model's config is missing at {path}: "
                                    f"it is made by the model training script (see data/models/)")
        return json.loads(path.read_text())
    return load


#: Preset name -> (config factory, source sentence).
PRESETS: dict[str, tuple[Callable[[], dict[str, Any]], str]] = {
    "deepseek-v3": (_deepseek_v3_config,
                    "deepseek-ai/DeepSeek-V3 inference/configs/config_671B.json (published config)"),
    "kimi-k2": (_kimi_k2_config,
                "Kimi-K2-Instruct shape: NVIDIA Megatron-Bridge KimiK2Provider docs and public config copies"),
    "kimi-k2.6": (_kimi_k26_config,
                  "Kimi K2.6: Kimi-K2 text shape with INT4 routed experts (compressed-tensors, group 32)"),
    "investigation-drafter": (_investigation_drafter_config,
                              "the investigation's DFlash drafter (reference/investigation.md)"),
    "embedded-target": (_embedded("target"), "data/models/target/config.json"),
    "embedded-drafter": (_embedded("drafter"), "data/models/drafter/config.json"),
}


def preset_config(name: str) -> dict[str, Any]:
    """The config dict of a preset (see :data:`PRESETS`)."""
    if name not in PRESETS:
        raise ValueError(f"unknown model preset {name!r}: use one of {sorted(PRESETS)} or a config.json path")
    return PRESETS[name][0]()


def load_geometry(model_config: str | Mapping[str, Any], kv_dtype: str | None = None,
                  weight_dtype: str | None = None) -> ModelGeometry:
    """A preset name, a config.json path (or its folder), or a config dict -> :class:`ModelGeometry`."""
    if isinstance(model_config, Mapping):
        return from_hf_config(model_config, kv_dtype, weight_dtype)
    if model_config in PRESETS:
        factory, source = PRESETS[model_config]
        geom = from_hf_config(factory(), kv_dtype, weight_dtype, name=model_config)
        return replace(geom, source=source)
    path = Path(model_config)
    if not path.exists():
        raise ValueError(f"model_config {model_config!r} is neither a preset ({', '.join(sorted(PRESETS))}) "
                         f"nor an existing config.json path")
    return from_hf_config(path, kv_dtype, weight_dtype)


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


# ---------------------------------------------------------------------------------------------
# Which model a run is about
# ---------------------------------------------------------------------------------------------

def _kv_dtype_name(value: Any) -> str | None:
    """'bf16', 'fp8_e4m3', 'auto (bf16)' -> a dtype name, or None for auto/unknown."""
    if not value:
        return None
    text = str(value).split("(")[-1].rstrip(")").strip() if "(" in str(value) else str(value)
    text = text.lower().replace("torch.", "")
    return text if text in DTYPE_BYTES and text != "auto" else None


def geometry_for_run(model_config: str = "", kv_dtype: str = "", run_meta: Mapping[str, Any] | None = None,
                     server_info: Mapping[str, Any] | None = None, role: Literal["target", "drafter"] = "target",
                     project_root: Path | None = None, param_name: str = "") -> ModelGeometry:
    """The geometry a notebook analyses, and where it came from (in ``.source``).

    Model: the ``model_config`` parameter (a preset or a config.json path) > the recorded run's
    ``model``/``drafter`` section (``model_config`` dict or ``preset``) > the server's
    ``model_path``/``speculative_draft_model_path`` folder (readable from this machine).
    KV dtype: the ``kv_dtype`` parameter > the recorded section's ``kv_cache_dtype`` > the server's
    ``kv_cache_dtype`` > its ``dtype`` (when not ``auto``) > the config's dtype > bf16. When the server names a concrete
    ``dtype`` and the config has no quantization, the weights are counted at that dtype.
    """
    from specdiag.paths import PROJECT_ROOT  # noqa: PLC0415

    root = project_root or PROJECT_ROOT
    param_name = param_name or ("model_config" if role == "target" else "drafter_config")
    section = dict((run_meta or {}).get("model" if role == "target" else "drafter") or {})
    info = dict(server_info or {})
    kv = (_kv_dtype_name(kv_dtype) if kv_dtype else None)
    if kv_dtype and kv is None:
        dtype_bytes(kv_dtype)  # raises naming the choices
    kv = kv or _kv_dtype_name(section.get("kv_cache_dtype")) or _kv_dtype_name(info.get("kv_cache_dtype")) \
        or _kv_dtype_name(info.get("dtype"))  # None: the config's dtype (from_hf_config)
    server_dtype = _kv_dtype_name(info.get("dtype"))
    if model_config:
        geom = load_geometry(model_config, kv_dtype=kv)
        return replace(geom, source=f"parameter model_config={model_config!r}: {geom.source}")
    if section.get("model_config"):
        geom = from_hf_config(section["model_config"], kv_dtype=kv, name=section.get("name"))
        return replace(geom, source=f"the recorded run's {role} config ({section.get('preset') or 'run.json'})")
    if section.get("preset"):
        geom = load_geometry(section["preset"], kv_dtype=kv)
        return replace(geom, source=f"the recorded run's preset {section['preset']!r}: {geom.source}")
    key = "model_path" if role == "target" else "speculative_draft_model_path"
    path_value = info.get(key)
    if path_value:
        path = Path(str(path_value))
        if not path.is_absolute():
            path = root / path
        cfg_path = path / "config.json" if path.suffix != ".json" else path
        if cfg_path.exists():
            cfg = json.loads(cfg_path.read_text())
            weight_dtype = server_dtype if (server_dtype and not _text_config(cfg).get("quantization_config")) else None
            geom = from_hf_config(cfg, kv_dtype=kv, weight_dtype=weight_dtype, name=path.name)
            return replace(geom, source=f"the server's {key} {path_value} (config.json read from this machine)")
        raise ValueError(f"the server's {key} is {path_value!r} but {cfg_path} cannot be read from here: pass "
                         f"{param_name} (a preset: {', '.join(sorted(PRESETS))}; or a path to the config.json)")
    raise ValueError(f"no {role} model config: the run records none and the server reports no {key}; pass "
                     f"{param_name} (a preset: {', '.join(sorted(PRESETS))}; or a path to the config.json)")
