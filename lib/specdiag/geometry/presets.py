"""Model presets: config dicts with the source of each figure (DeepSeek-V3, Kimi-K2, Kimi-K2.6, the
investigation's drafter, the embedded models).

Each preset is a Hugging Face style config dict that :func:`specdiag.geometry.load_geometry` reads
like a config.json; :data:`PRESETS` pairs it with the sentence naming its source.
"""

from __future__ import annotations

import json
from typing import Any, Callable

from specdiag.geometry.types import LAYER_FULL, LAYER_SLIDING
from specdiag.paths import MODELS_DIR


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
    # The investigation's DFlash drafter (tests/data/investigation_tables.md, "The deployment"): a 6-layer
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
                              "the investigation's DFlash drafter (its deployment, data/reference/ct200-kimi-k26)"),
    "embedded-target": (_embedded("target"), "data/models/target/config.json"),
    "embedded-drafter": (_embedded("drafter"), "data/models/drafter/config.json"),
}


def preset_config(name: str) -> dict[str, Any]:
    """The config dict of a preset (see :data:`PRESETS`)."""
    if name not in PRESETS:
        raise ValueError(f"unknown model preset {name!r}: use one of {sorted(PRESETS)} or a config.json path")
    return PRESETS[name][0]()
