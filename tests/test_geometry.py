"""specdiag.geometry against hand-computed values (each expected number is written out as arithmetic)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from specdiag import geometry as g

# A Llama-3-8B-shaped GQA config (published shape: 32 layers, 32 heads, 8 KV heads, hidden 4096,
# intermediate 14336, vocab 128256), written out so the test needs no download.
LLAMA_8B = {
    "model_type": "llama", "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
    "hidden_size": 4096, "intermediate_size": 14336, "vocab_size": 128256, "torch_dtype": "bfloat16",
    "tie_word_embeddings": False,
}

# The investigation's drafter shape with explicit layer_types (Qwen3 config, transformers 5 style).
QWEN3_SWA = {
    "model_type": "qwen3", "num_hidden_layers": 6, "num_attention_heads": 64, "num_key_value_heads": 8,
    "head_dim": 128, "hidden_size": 1024, "intermediate_size": 3072, "vocab_size": 4096,
    "layer_types": ["sliding_attention"] * 5 + ["full_attention"], "sliding_window": 2048,
    "rope_scaling": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 65536},
    "max_position_embeddings": 262144, "torch_dtype": "bfloat16",
}


def test_mla_kimi_k2_kv_bytes_at_185k() -> None:
    geom = g.load_geometry("kimi-k2")
    assert geom.attention == "mla"
    assert geom.kv_values_per_token_per_layer == 512 + 64
    assert geom.kv_bytes_per_token_per_layer == 576 * 2
    # The investigation's key number: 185,000 x 61 x 576 x 2 B = 13.0 GB per step.
    expected = 185_000 * 61 * 576 * 2
    assert g.kv_bytes_per_step(geom, 185_000) == expected
    assert expected == 13_000_320_000
    # The MLA latent is replicated: every TP rank reads all of it; only the heads split.
    assert g.kv_bytes_per_step(geom, 185_000, tp_size=8) == expected
    assert g.local_attention_heads(geom, 8) == 64 // 8
    assert g.local_kv_heads(geom, 8) == 1


def test_mla_fp8_kv_halves_the_bytes() -> None:
    geom = g.load_geometry("deepseek-v3", kv_dtype="fp8")
    assert geom.kv_bytes_per_token_per_layer == 576 * 1
    assert g.kv_bytes_per_step(geom, 1000) == 1000 * 61 * 576


def test_gqa_llama_kv_bytes_and_tp_split() -> None:
    geom = g.from_hf_config(LLAMA_8B)
    assert geom.attention == "gqa" and geom.head_dim == 4096 // 32
    assert geom.kv_bytes_per_token_per_layer == 2 * 8 * 128 * 2  # 4096 B
    assert g.kv_bytes_per_step(geom, 8192) == 32 * 8192 * 4096  # 1 GiB
    # TP 4: 2 of the 8 KV heads per rank; TP 16: fewer KV heads than ranks, one replicated per rank.
    assert g.kv_bytes_per_step(geom, 8192, tp_size=4) == 32 * 8192 * (2 * 2 * 128 * 2)
    assert g.kv_bytes_per_step(geom, 8192, tp_size=16) == 32 * 8192 * (2 * 1 * 128 * 2)


def test_mha_when_kv_heads_equal_heads() -> None:
    cfg = {**LLAMA_8B, "num_key_value_heads": 32}
    geom = g.from_hf_config(cfg)
    assert geom.attention == "mha"
    assert geom.kv_bytes_per_token_per_layer == 2 * 32 * 128 * 2


def test_llama_weight_bytes_dense_all_weights() -> None:
    geom = g.from_hf_config(LLAMA_8B)
    per_layer = 2 * 4096 * 4096 + 2 * 4096 * 1024 + 3 * 4096 * 14336  # q,o + k,v + gated MLP
    assert g.total_params(geom) == 32 * per_layer + 2 * 128256 * 4096  # 8.03e9, Llama-3-8B's count
    wb = g.weight_bytes_per_step(geom)
    expected = (32 * per_layer + 128256 * 4096 + 4096) * 2  # layers + LM head + one embedding row, bf16
    assert wb.total == pytest.approx(expected)
    # Under TP 2 every split weight halves; the embedding row is read whole.
    wb2 = g.weight_bytes_per_step(geom, tp_size=2)
    assert wb2.total == pytest.approx((32 * per_layer / 2 + 128256 * 4096 / 2 + 4096) * 2)


def test_sliding_window_layers_capped_and_mixed_types() -> None:
    geom = g.from_hf_config(QWEN3_SWA)
    assert geom.sliding_window == 2048
    assert geom.layer_types.count("sliding_attention") == 5
    per_token = 2 * 8 * 128 * 2  # 4096 B per token per layer
    # Below the window every layer reads the whole context.
    assert g.kv_bytes_per_step(geom, 1000) == 6 * 1000 * per_token
    # Past it the 5 sliding layers stay at 2048 tokens; the full layer grows.
    assert g.kv_bytes_per_step(geom, 185_000) == 5 * 2048 * per_token + 185_000 * per_token
    # A server-side draft window caps the full layer too.
    assert g.kv_bytes_per_step(geom, 185_000, span_cap_tokens=2048) == 6 * 2048 * per_token
    spans = [r["span_tokens"] for r in g.kv_bytes_per_layer_breakdown(geom, 185_000)]
    assert spans == [2048] * 5 + [185_000]


def test_qwen2_style_max_window_layers() -> None:
    cfg = {**LLAMA_8B, "num_hidden_layers": 4, "use_sliding_window": True, "sliding_window": 4096,
           "max_window_layers": 2}
    geom = g.from_hf_config(cfg)
    assert geom.layer_types == ("full_attention",) * 2 + ("sliding_attention",) * 2
    assert g.from_hf_config({**cfg, "use_sliding_window": False}).sliding_window is None


def test_moe_active_weights_synthetic() -> None:
    cfg = {"model_type": "deepseek_v3", "num_hidden_layers": 4, "hidden_size": 64, "intermediate_size": 256,
           "num_attention_heads": 4, "kv_lora_rank": 16, "qk_rope_head_dim": 8, "qk_nope_head_dim": 16,
           "v_head_dim": 16, "q_lora_rank": None, "vocab_size": 100, "n_routed_experts": 4, "n_shared_experts": 1,
           "num_experts_per_tok": 2, "moe_intermediate_size": 32, "first_k_dense_replace": 1, "torch_dtype": "float32"}
    geom = g.from_hf_config(cfg)
    assert geom.moe is not None and geom.moe.moe_layers == (1, 2, 3)
    attn = (64 * 4 * 24) + (64 * (16 + 8) + 16) + (16 * 4 * (16 + 16)) + (4 * 16 * 64)  # q, kv_a(+norm), kv_b, o
    expert = 3 * 64 * 32
    wb = g.weight_bytes_per_step(geom)
    assert wb.attention == 4 * attn * 4
    assert wb.dense_mlp == 1 * 3 * 64 * 256 * 4
    assert wb.shared_experts == 3 * expert * 4
    assert wb.routed_experts == 3 * 2 * expert * 4  # 3 MoE layers x top-2
    assert wb.router == 3 * 64 * 4 * 4
    assert wb.lm_head == 100 * 64 * 4
    # 2 tokens, uniform routing: 4 x (1 - (1 - 2/4)^2) = 3 distinct experts per layer.
    assert g.active_experts_per_layer(geom.moe, 2, "uniform") == pytest.approx(3.0)
    assert g.active_experts_per_layer(geom.moe, 2, "max") == 4
    assert g.weight_bytes_per_step(geom, tokens_per_step=2, routing="uniform").routed_experts == pytest.approx(
        3 * 3 * expert * 4)


def test_deepseek_v3_total_and_active_params_match_published() -> None:
    geom = g.load_geometry("deepseek-v3", weight_dtype="fp8")  # 1 B/param: bytes = parameters
    assert g.total_params(geom) / 1e9 == pytest.approx(671, rel=0.01)  # "671B total"
    active = g.weight_bytes_per_step(geom).total
    assert active / 1e9 == pytest.approx(37, rel=0.03)  # "37B activated for each token"


def test_kimi_k2_total_params_and_int4_experts() -> None:
    geom = g.load_geometry("kimi-k2.6")
    assert g.total_params(geom) / 1e12 == pytest.approx(1.03, rel=0.01)  # "1T total"
    wb = geom.weight_bytes
    assert wb.routed_experts == pytest.approx(0.5 + 2 / 32)  # int4 + one bf16 scale per 32 weights
    assert wb.attention == 2 and wb.shared_experts == 2 and wb.lm_head == 2  # in the ignore list


def test_multimodal_text_config_and_config_path(tmp_path: Path) -> None:
    wrapped = {"model_type": "kimi_k25", "text_config": g.preset_config("kimi-k2")}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(wrapped))
    geom = g.load_geometry(str(tmp_path))
    assert geom.attention == "mla" and geom.num_layers == 61 and geom.model_type == "kimi_k25"


def test_bad_input_names_the_problem(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="neither a preset"):
        g.load_geometry("no-such-model")
    with pytest.raises(ValueError, match="num_hidden_layers"):
        g.from_hf_config({"hidden_size": 8})
    with pytest.raises(ValueError, match="unknown dtype"):
        g.load_geometry("kimi-k2", kv_dtype="int3")
    with pytest.raises(ValueError, match="sliding_window"):
        g.from_hf_config({**QWEN3_SWA, "sliding_window": None})
    with pytest.raises(ValueError, match="tp_size"):
        g.kv_bytes_per_step(g.load_geometry("kimi-k2"), 10, tp_size=0)


def test_investigation_drafter_preset() -> None:
    geom = g.load_geometry("investigation-drafter")
    assert geom.num_layers == 6 and geom.num_kv_heads == 8 and geom.head_dim == 128
    assert geom.layer_types.count("sliding_attention") == 5 and geom.sliding_window == 2048
    assert geom.max_position_embeddings == 262144
    assert (geom.rope_scaling or {}).get("rope_type") == "yarn"


def test_kv_dtype_defaults_to_the_model_dtype() -> None:
    assert g.from_hf_config({**LLAMA_8B, "torch_dtype": "float32"}).kv_dtype == "float32"
    assert g.from_hf_config({**LLAMA_8B, "torch_dtype": "float32"}, kv_dtype="auto").kv_dtype == "float32"
    assert g.from_hf_config({k: v for k, v in LLAMA_8B.items() if k != "torch_dtype"}).kv_dtype == "bf16"
    assert g.from_hf_config(LLAMA_8B, kv_dtype="fp8_e4m3").kv_bytes_per_token_per_layer == 2 * 8 * 128
    # A run's precedence: parameter > recorded > server kv_cache_dtype > server dtype > config.
    meta = {"model": {"model_config": {**LLAMA_8B, "torch_dtype": "float32"}}}
    assert g.geometry_for_run(run_meta=meta).kv_dtype == "float32"
    assert g.geometry_for_run(run_meta=meta, server_info={"kv_cache_dtype": "auto", "dtype": "float16"}).kv_dtype == "float16"
    assert g.geometry_for_run("", "fp8", run_meta=meta).kv_dtype == "fp8"


def test_geometry_for_run_errors_name_the_parameter(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="drafter_config"):
        g.geometry_for_run(server_info={"speculative_draft_model_path": "/remote/only/drafter"}, role="drafter")
    with pytest.raises(ValueError, match="model_config"):
        g.geometry_for_run(server_info={})
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text(json.dumps(QWEN3_SWA))
    geom = g.geometry_for_run(server_info={"model_path": str(tmp_path / "m"), "dtype": "float32"})
    assert geom.sliding_window == 2048 and geom.kv_dtype == "float32" and geom.weight_bytes.attention == 4
    assert g.geometry_for_run("kimi-k2", server_info={"model_path": str(tmp_path / "m")}).attention == "mla"
