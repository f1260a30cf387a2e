"""The shipped embedded models (data/models/target, data/models/drafter): shape of their configs, shared
tokenizer, size, and that each copies predictable text on its own and through speculative decoding
(CPU, float32, a 1,024-token prompt; seconds)."""

from __future__ import annotations

import json
import sys

import pytest
import torch

from specdiag.paths import MODELS_DIR

sys.path.insert(0, str(MODELS_DIR))

import speculate  # noqa: E402

TARGET, DRAFTER = MODELS_DIR / "target", MODELS_DIR / "drafter"
LONGEST_EMBEDDED_CONTEXT = 16384


def _cfg(path) -> dict:
    return json.loads((path / "config.json").read_text())


def test_target_config() -> None:
    cfg = _cfg(TARGET)
    assert cfg["architectures"] == ["Qwen3ForCausalLM"]
    assert cfg["max_position_embeddings"] >= LONGEST_EMBEDDED_CONTEXT
    assert set(cfg["layer_types"]) == {"full_attention"}


def test_drafter_config_is_sliding_window_with_one_full_layer_and_yarn() -> None:
    cfg = _cfg(DRAFTER)
    assert cfg["architectures"] == ["Qwen3ForCausalLM"]
    assert cfg["use_sliding_window"] is True
    assert cfg["layer_types"].count("full_attention") == 1
    assert cfg["layer_types"].count("sliding_attention") == cfg["num_hidden_layers"] - 1
    assert cfg["sliding_window"] <= LONGEST_EMBEDDED_CONTEXT // 8
    rope = cfg.get("rope_parameters") or cfg.get("rope_scaling")
    assert rope["rope_type"] == "yarn" and rope["factor"] > 1
    assert cfg["max_position_embeddings"] >= LONGEST_EMBEDDED_CONTEXT
    assert cfg["vocab_size"] == _cfg(TARGET)["vocab_size"]


def test_tokenizer_shared_and_size_budget() -> None:
    shared = (MODELS_DIR / "tokenizer" / "tokenizer.json").read_bytes()
    assert (TARGET / "tokenizer.json").read_bytes() == shared
    assert (DRAFTER / "tokenizer.json").read_bytes() == shared
    weights = sum((p / "model.safetensors").stat().st_size for p in (TARGET, DRAFTER))
    assert weights <= 25 * 1024 * 1024


@pytest.fixture(scope="module")
def loaded():
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from specdiag.prompts import build_prompt

    tok = AutoTokenizer.from_pretrained(str(TARGET))
    target = AutoModelForCausalLM.from_pretrained(str(TARGET), dtype=torch.float32).eval()
    drafter = AutoModelForCausalLM.from_pretrained(str(DRAFTER), dtype=torch.float32).eval()
    ids = build_prompt(lambda t: tok(t, add_special_tokens=False)["input_ids"], 1024, "predictable").input_ids
    return target, drafter, ids


def test_each_model_copies_predictable_text_on_its_own(loaded) -> None:
    target, drafter, ids = loaded
    # teacher-forced: share of next tokens in the prompt's 2nd half that each model predicts
    assert speculate.copy_accuracy(target, ids, "cpu", skip=512) >= 0.85
    assert speculate.copy_accuracy(drafter, ids, "cpu", skip=512) >= 0.85


# model-drafter is slow (13 s: speculate.py's cache-free drafter runs over the whole 1,024-token sequence once per
# draft token); make test keeps what it rests on: test_each_model_copies_predictable_text_on_its_own (the drafter
# alone predicts >= 85% of the next tokens), the ngram case (the target's side of the same loop), and
# test_commit_probe_notebook's live test (the shipped drafter through the embedded engine commits >= 4 of 8).
@pytest.mark.parametrize("use_drafter", [False, pytest.param(True, marks=pytest.mark.slow)],
                         ids=["ngram", "model-drafter"])
def test_speculative_commit_on_predictable_text(loaded, use_drafter) -> None:
    target, drafter, ids = loaded
    # as the embedded server with speculative_num_draft_tokens=8: 7 drafts a step, at most 8 committed;
    # 64 new tokens as notebook 04. The target hesitates between "sat on" and "sat as" in its first
    # periods (a near-tie), which costs a few 1-token steps (data/models/README.md): the mean must reach
    # 70% of the maximum and the typical (median) step must commit the maximum.
    res = speculate.speculative_generate(target, ids, 64, 7, drafter if use_drafter else None, "cpu")
    assert res.mean_commit_length >= 0.70 * 8, res.step_commit_lengths
    assert sorted(res.step_commit_lengths)[len(res.step_commit_lengths) // 2] == 8, res.step_commit_lengths
