"""A constructed 11_moe_batch1 run folder for the tests: expert-distribution dumps written with ``torch.save`` in the
exact structure SGLang 0.5.17's per_pass recorder writes (specdiag.steps.moe_batch1.recorder), a routed-experts answer
encoded as SGLang encodes it (base64 of int32 [tokens, layers, top_k]), and step-time rows (``repeats`` a cell,
sent after each server's recorder dump). Everything here is
BUILT from seeded random routing (each token picks top_k distinct experts uniformly): none of it is recorded."""

from __future__ import annotations

import base64
from pathlib import Path

import numpy as np
import torch

from specdiag.runs import Run
from specdiag.steps.moe_batch1 import recorder
from specdiag.steps.moe_batch1.measure import DUMPS_TABLE, FILES_DIR, ROUTING_TABLE, STEPS_TABLE

E, K, LAYERS = 384, 8, 4  # layer 0 dense, 1-3 MoE


def config() -> dict:
    return {"architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3", "num_hidden_layers": LAYERS,
            "hidden_size": 1024, "intermediate_size": 2048, "moe_intermediate_size": 64, "n_routed_experts": E,
            "n_shared_experts": 1, "num_experts_per_tok": K, "first_k_dense_replace": 1, "moe_layer_freq": 1,
            "num_attention_heads": 8, "num_key_value_heads": 8, "q_lora_rank": 512, "kv_lora_rank": 512,
            "qk_rope_head_dim": 64, "qk_nope_head_dim": 128, "v_head_dim": 128, "vocab_size": 4096,
            "torch_dtype": "bfloat16", "max_position_embeddings": 262144}


def routing(rng: np.random.Generator, tokens: int, alike: bool = False) -> np.ndarray:
    """[tokens, layers, K] expert ids: dense layer 0 all zero; MoE layers uniform (or every token alike)."""
    out = np.zeros((tokens, LAYERS, K), dtype=np.int32)
    for layer in range(1, LAYERS):
        fixed = rng.choice(E, K, replace=False)
        for t in range(tokens):
            out[t, layer] = fixed if alike else rng.choice(E, K, replace=False)
    return out


def counts_of(ids: np.ndarray) -> torch.Tensor:
    c = np.zeros((LAYERS, E), dtype=np.int32)
    for layer in range(1, LAYERS):
        np.add.at(c[layer], ids[:, layer, :].ravel(), 1)
    return torch.from_numpy(c)


def build_run(folder: Path, seed: int = 0, alike: bool = False, tokens_per_step=(1, 2, 4, 8, 16),
              repeats: int = 3) -> Run:
    rng = np.random.default_rng(seed)
    run = Run.create(folder)
    run.update(moe_model_config=config(), data_source="constructed (tests/moe_fixture.py: not recorded)")
    (Path(run.path) / FILES_DIR).mkdir(exist_ok=True)
    for t in tokens_per_step:
        passes = [(0, counts_of(routing(rng, 512, alike)))]  # a prefill chunk
        passes += [(i, counts_of(routing(rng, t, alike))) for i in range(1, 13)]  # verify (decode for T=1) passes
        obj = recorder.dump_object(passes, torch.arange(E).repeat(LAYERS, 1))
        name = f"expert_distribution_t{t}.pt"
        torch.save(obj, Path(run.path) / FILES_DIR / name)
        run.append_row(DUMPS_TABLE, {"ts_unix_s": 1000.0 * t, "tokens_per_step": t, "file": f"{FILES_DIR}/{name}",
                                     "passes": len(passes), "error": None})
        for ctx in (1024, 16384):
            distinct = E * (1 - (1 - K / E) ** t)
            step = 2.0 + 0.004 * ctx / 1024 + 0.05 * distinct
            for rep in range(repeats):  # requests a cell, +-1% around the made-up step, sent after the dump
                run.append_row(STEPS_TABLE, {"ts_unix_s": 1000.0 * t + ctx / 1024 + rep, "context_tokens": ctx,
                                             "tokens_per_step": t, "repeat": rep,
                                             "step_ms": step * (1 + 0.01 * (rep - (repeats - 1) / 2)),
                                             "commit_length": 1.0 + 0.5 * (t - 1), "error": None})
    answer = routing(rng, 200, alike)
    b64 = base64.b64encode(answer.tobytes()).decode()
    (Path(run.path) / FILES_DIR / "routed_experts_t8.json").write_text('{"routed_experts": "%s"}' % b64)
    from specdiag.steps.moe_batch1.routing import decode_sglang, window_table
    routed = decode_sglang(b64, LAYERS, K)
    run.append_row(ROUTING_TABLE, {"tokens_per_step": 8, "context_tokens": 100, "prompt_tokens": 100,
                                   "completion_tokens": 101, "rows": 200, "rows_expected": 200, "rows_match": True,
                                   "ids_in_range": True, "file": f"{FILES_DIR}/routed_experts_t8.json", "error": None,
                                   "windows": window_table(routed, E, first=100).to_dict("records"),
                                   "prompt_windows": window_table(routed[:100], E).to_dict("records")})
    return run
