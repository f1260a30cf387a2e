"""data/models/make_moe_model.py: Kimi K2.6's expert geometry in SGLang's DeepSeek-V3 names (384 experts, top-8, one
shared, noaux_tc sigmoid routing, the first layer dense), sharded safetensors transformers loads without a missing key,
and routing that spreads through a real forward (distinct experts per 8 distinct tokens against the uniform
expectation), on a tiny hidden size."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

ROOT = Path(__file__).resolve().parents[1]


def _module():
    spec = importlib.util.spec_from_file_location("make_moe_model", ROOT / "data/models/make_moe_model.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    out = tmp_path_factory.mktemp("moe")
    cfg = _module().build(out, layers=3, hidden=128, expert_width=8, dense_width=32, q_lora_rank=32, seed=2,
                          progress=lambda _: None)
    return out, cfg


def test_geometry_and_names(tiny):
    out, cfg = tiny
    assert json.loads((out / "config.json").read_text()) == cfg
    assert (cfg["n_routed_experts"], cfg["num_experts_per_tok"], cfg["n_shared_experts"]) == (384, 8, 1)
    assert (cfg["topk_method"], cfg["scoring_func"], cfg["n_group"], cfg["topk_group"]) == ("noaux_tc", "sigmoid", 1, 1)
    assert cfg["first_k_dense_replace"] == 1 and cfg["moe_layer_freq"] == 1  # SGLang reads moe_layer_freq
    index = json.loads((out / "model.safetensors.index.json").read_text())["weight_map"]
    assert index["model.layers.2.mlp.experts.383.down_proj.weight"] == "model-layer02.safetensors"
    assert "model.layers.1.mlp.gate.e_score_correction_bias" in index and "model.layers.0.mlp.gate_proj.weight" in index
    assert "model.layers.1.mlp.gate_proj.weight" not in index  # MoE layers have experts, not a dense MLP


def test_transformers_loads_it_and_routing_spreads(tiny):
    from transformers import AutoModelForCausalLM

    out, cfg = tiny
    model, info = AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.bfloat16, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"]
    picks: list = []
    for mod in model.modules():
        if type(mod).__name__.endswith("TopkRouter"):
            mod.register_forward_hook(lambda m, i, o: picks.append(o[2]))
    ids = torch.randperm(4000, generator=torch.Generator().manual_seed(0))[:128][None] + 5
    with torch.no_grad():
        model(input_ids=ids)
    assert len(picks) == 2
    expected = 384 * (1 - (1 - 8 / 384) ** 8)
    for top in picks:  # each MoE layer: windows of 8 distinct tokens touch what independent tokens would
        ratios = sorted(len(torch.unique(top[j:j + 8])) / expected for j in range(0, 128, 8))
        assert ratios[len(ratios) // 2] >= 0.9, ratios
    first_order = _module().check_routing(out, n_tokens=128, layers=2)
    assert first_order["median_ratio"] >= 0.9


def test_max_gb_picks_the_layers():
    mod = _module()
    probe = mod.make_config(2, 7168, 64, 2304, 8, 1536, 4096, 262144)
    per_layer = mod.layer_bytes(probe)
    assert per_layer == pytest.approx(384 * 3 * 7168 * 64 * 2 + 3 * 7168 * 64 * 2 + 384 * 7168 * 2 + 384 * 4
                                      + 2 * 7168 + 2 * 1536 + 2 * 512
                                      + 2 * (1536 * 7168 + 8 * 192 * 1536 + 576 * 7168 + 8 * 256 * 512 + 7168 * 1024),
                                      rel=0.01)
    assert 1.0e9 < per_layer < 1.2e9  # about 1.06 GB of experts per layer: 31 layers fit ~35 GB
