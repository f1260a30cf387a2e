"""data/models/make_dflash_drafter.py: the DFlash checkpoint layout SGLang 0.5.17 and vLLM 0.32 load (config keys,
tensor names and shapes), target layer ids inside SGLang's limit, and refusals of what no engine would load."""

from __future__ import annotations

import importlib.util
import json
import struct
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _module(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / f"data/models/{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _header(path: Path) -> dict:
    raw = path.read_bytes()
    n = struct.unpack("<Q", raw[:8])[0]
    head = json.loads(raw[8:8 + n])
    head.pop("__metadata__", None)
    return head


def test_tiny_drafter_for_the_embedded_target(tmp_path):
    mod = _module("make_dflash_drafter")
    target = json.loads((ROOT / "data/models/target/config.json").read_text())
    cfg = mod.build(ROOT / "data/models/target", tmp_path, "tiny", seed=1)
    assert json.loads((tmp_path / "config.json").read_text()) == cfg
    assert cfg["architectures"] == ["DFlashDraftModel"] and cfg["model_type"] == "qwen3"
    assert cfg["hidden_size"] == target["hidden_size"] and cfg["vocab_size"] == target["vocab_size"]
    ids = cfg["dflash_config"]["target_layer_ids"]
    assert all(0 <= i <= target["num_hidden_layers"] - 2 for i in ids)
    assert 0 <= cfg["dflash_config"]["mask_token_id"] < target["vocab_size"]
    head = _header(tmp_path / "model.safetensors")
    h = cfg["hidden_size"]
    assert head["fc.weight"]["shape"] == [h, len(ids) * h]
    assert head["layers.0.self_attn.q_proj.weight"]["shape"] == [cfg["num_attention_heads"] * cfg["head_dim"], h]
    assert head["layers.0.self_attn.k_norm.weight"]["shape"] == [cfg["head_dim"]]
    assert not any("embed" in k or "lm_head" in k for k in head), "DFlash uses the target's embeddings and LM head"
    assert {v["dtype"] for v in head.values()} == {"BF16"}


def test_kimi_shaped_drafter_for_the_61_layer_twin(tmp_path):
    mla = _module("make_mla_model")
    mla_dir = tmp_path / "mla"
    mla.build(mla_dir, layers=61, hidden=128, heads=2, intermediate=128, seed=0)
    cfg = _module("make_dflash_drafter").build(mla_dir, tmp_path / "d", "kimi-k2.6-tp8")
    assert cfg["num_hidden_layers"] == 6 and cfg["block_size"] == 8
    assert (cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]) == (8, 1, 128)
    assert cfg["layer_types"] == ["sliding_attention"] * 5 + ["full_attention"] and cfg["sliding_window"] == 2048
    ids = cfg["dflash_config"]["target_layer_ids"]
    assert ids == sorted(set(ids)) and ids[0] == 1 and ids[-1] == 58 and len(ids) == 6
    assert cfg["num_target_layers"] == 61


def test_a_shallow_target_gets_distinct_layers(tmp_path):
    """Each target layer is captured once (SGLang asserts 'captured 1 of 6 aux hidden states' on a repeat): a 2-layer
    target gives its one capturable layer, the fc reading one hidden state; a deep one keeps its six spread ids."""
    mod = _module("make_dflash_drafter")
    assert mod.target_layer_ids(2, 6) == [0] and mod.target_layer_ids(4, 6) == [0, 1, 2]
    assert mod.target_layer_ids(61, 6) == [1, 12, 24, 35, 47, 58] and mod.target_layer_ids(4, 1) == [1]
    mla = _module("make_mla_model")
    mla.build(tmp_path / "mla", layers=2, hidden=128, heads=2, intermediate=128, seed=0)
    cfg = _module("make_dflash_drafter").build(tmp_path / "mla", tmp_path / "d", "kimi-k2.6-tp8")
    assert cfg["dflash_config"]["target_layer_ids"] == [0]
    assert _header(tmp_path / "d" / "model.safetensors")["fc.weight"]["shape"] == [128, 128]


def test_window_off_makes_every_layer_full(tmp_path):
    cfg = _module("make_dflash_drafter").build(ROOT / "data/models/target", tmp_path, "kimi-k2.6", sliding_window=0)
    assert set(cfg["layer_types"]) == {"full_attention"} and "sliding_window" not in cfg


@pytest.mark.parametrize("kw, words", [
    (dict(target_layers=[3]), "out of range"),
    (dict(mask_token_id=10**6), "outside the target's vocabulary"),
    (dict(target_layers=[1, 1]), "repeat a layer"),
    (dict(block_size=1), "block_size"),
    (dict(shape="huge"), "unknown shape"),
])
def test_refusals_name_the_problem(tmp_path, kw, words):
    mod = _module("make_dflash_drafter")
    with pytest.raises(ValueError, match=words):
        mod.build(ROOT / "data/models/target", tmp_path, **kw)
