"""data/models/make_mla_model.py: the folder SGLang's DeepSeek loader reads (config keys, tensor names and
shapes in the Hugging Face DeepSeek-V3 naming, bf16 safetensors), seeded, with the embedded tokenizer."""

from __future__ import annotations

import importlib.util
import json
import struct
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _module():
    spec = importlib.util.spec_from_file_location("make_mla_model", ROOT / "data/models/make_mla_model.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _header(path: Path) -> dict:
    raw = path.read_bytes()
    n = struct.unpack("<Q", raw[:8])[0]
    head = json.loads(raw[8:8 + n])
    head.pop("__metadata__", None)
    end = max(v["data_offsets"][1] for v in head.values())
    assert len(raw) == 8 + n + end, "the file ends where the last tensor ends"
    return head


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    out = tmp_path_factory.mktemp("mla")
    cfg = _module().build(out, layers=2, hidden=256, intermediate=512, seed=3)
    return out, cfg


def test_config_has_the_investigation_geometry_and_sglang_keys(small):
    out, cfg = small
    on_disk = json.loads((out / "config.json").read_text())
    assert on_disk == cfg
    assert cfg["model_type"] == "deepseek_v3" and cfg["architectures"] == ["DeepseekV3ForCausalLM"]
    assert (cfg["kv_lora_rank"], cfg["qk_rope_head_dim"], cfg["qk_nope_head_dim"], cfg["v_head_dim"]) == (512, 64, 128, 128)
    assert cfg["num_attention_heads"] == 8
    # SGLang's _is_layer_sparse reads these three; every layer must come out dense.
    assert cfg["moe_layer_freq"] == 1 and cfg["n_routed_experts"] and cfg["first_k_dense_replace"] == cfg["num_hidden_layers"]
    assert cfg["max_position_embeddings"] >= 200_000
    assert cfg["rope_parameters"]["rope_theta"] == cfg["rope_theta"]
    tok = json.loads((out / "tokenizer.json").read_text())
    assert cfg["vocab_size"] == max(tok["model"]["vocab"].values()) + 1 == 4096


def test_tensors_are_the_hf_deepseek_v3_names_and_shapes(small):
    out, cfg = small
    head = _header(out / "model.safetensors")
    assert all(v["dtype"] == "BF16" for v in head.values())
    l0 = "model.layers.0.self_attn."
    assert head[l0 + "kv_a_proj_with_mqa.weight"]["shape"] == [512 + 64, 256]
    assert head[l0 + "kv_b_proj.weight"]["shape"] == [8 * (128 + 128), 512]
    assert head[l0 + "q_a_proj.weight"]["shape"] == [512, 256]
    assert head[l0 + "q_b_proj.weight"]["shape"] == [8 * (128 + 64), 512]
    assert head[l0 + "o_proj.weight"]["shape"] == [256, 8 * 128]
    assert head["model.layers.1.mlp.down_proj.weight"]["shape"] == [256, 512]
    assert not any("experts" in k for k in head), "dense layers carry no expert weights"
    assert {"model.embed_tokens.weight", "model.norm.weight", "lm_head.weight"} <= set(head)
    assert len(head) == 3 + 2 * 12


def test_same_seed_same_bytes_other_seed_other_bytes(small, tmp_path):
    out, _ = small
    mod = _module()
    mod.build(tmp_path / "a", layers=2, hidden=256, intermediate=512, seed=3)
    mod.build(tmp_path / "b", layers=2, hidden=256, intermediate=512, seed=4)
    same = (tmp_path / "a/model.safetensors").read_bytes()
    assert same == (out / "model.safetensors").read_bytes()
    assert same != (tmp_path / "b/model.safetensors").read_bytes()


def test_weights_are_finite_and_scaled(small):
    torch = pytest.importorskip("torch")
    out, _ = small
    raw = (out / "model.safetensors").read_bytes()
    head = _header(out / "model.safetensors")
    n = struct.unpack("<Q", raw[:8])[0]
    meta = head["model.layers.0.self_attn.kv_b_proj.weight"]
    a, b = meta["data_offsets"]
    t = torch.frombuffer(bytearray(raw[8 + n + a:8 + n + b]), dtype=torch.bfloat16).float()
    assert torch.isfinite(t).all()
    assert 0.5 / 512 ** 0.5 < t.std().item() < 2 / 512 ** 0.5  # N(0, 1/fan_in)
