"""The geometry types: :class:`ModelGeometry` and its parts, the layer kinds, and bytes per dtype.

The base of the geometry modules (imports none of them): :mod:`specdiag.geometry` holds the math on
these types, :mod:`specdiag.geometry.config` builds them from a config.json, and
:mod:`specdiag.geometry.presets` holds the preset configs. Import them all from :mod:`specdiag.geometry`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, Mapping

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
