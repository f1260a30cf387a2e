"""Write a tiny random-weight DeepSeek-V3-architecture model folder (MLA attention) for serving tests.

The attention geometry is the investigation's: MLA with kv_lora_rank 512 + qk_rope_head_dim 64 (576
KV values per token per layer), qk_nope_head_dim 128, v_head_dim 128, and 8 query heads (Kimi K2.6's 64
heads under TP 8, so one GPU here runs the per-rank attention of one TP8 rank). Every layer is dense
(``first_k_dense_replace`` = the number of layers) but the MoE keys SGLang's DeepSeek loader reads are
present (``moe_layer_freq``, ``n_routed_experts``, ...). The tokenizer is the embedded one
(data/models/tokenizer, 4,096 tokens). Weights are drawn with a fixed seed and scaled by
1/sqrt(fan_in) so activations stay finite in bf16; the text it generates is meaningless::

    python data/models/make_mla_model.py --out /tmp/mla-model            # 2 layers, seed 0, ~60 MB
    python data/models/make_mla_model.py --out /tmp/mla-model --layers 4 --seed 1

Needs torch only (seconds on a CPU). The weights are never committed.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import shutil
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
TOKENIZER_DIR = HERE / "tokenizer"


def make_config(layers: int, hidden: int, heads: int, q_lora_rank: int | None, intermediate: int,
                vocab_size: int, max_positions: int) -> dict:
    """config.json of the model (transformers' DeepseekV3Config keys + the ones SGLang reads)."""
    return {
        "architectures": ["DeepseekV3ForCausalLM"],
        "model_type": "deepseek_v3",
        "vocab_size": vocab_size,
        "hidden_size": hidden,
        "intermediate_size": intermediate,
        "moe_intermediate_size": intermediate // 4,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": heads,
        "q_lora_rank": q_lora_rank,
        "kv_lora_rank": 512,
        "qk_rope_head_dim": 64,
        "qk_nope_head_dim": 128,
        "v_head_dim": 128,
        "head_dim": 64,
        # MoE keys: every layer is dense (first_k_dense_replace = layers), but SGLang reads them all.
        "first_k_dense_replace": layers,
        "moe_layer_freq": 1,
        "n_routed_experts": 8,
        "n_shared_experts": 1,
        "num_experts_per_tok": 2,
        "n_group": 1,
        "topk_group": 1,
        "topk_method": "noaux_tc",
        "scoring_func": "sigmoid",
        "norm_topk_prob": True,
        "routed_scaling_factor": 1.0,
        "num_nextn_predict_layers": 0,
        "hidden_act": "silu",
        "max_position_embeddings": max_positions,
        "rope_theta": 10000.0,
        "rope_scaling": None,
        "rope_parameters": {"rope_theta": 10000.0, "rope_type": "default"},
        "rope_interleave": True,
        "rms_norm_eps": 1e-6,
        "attention_bias": False,
        "attention_dropout": 0.0,
        "initializer_range": 0.02,
        "tie_word_embeddings": False,
        "bos_token_id": 0,
        "eos_token_id": 0,
        "pad_token_id": 0,
        "use_cache": True,
        "dtype": "bfloat16",
        "torch_dtype": "bfloat16",
    }


def tensor_shapes(cfg: dict) -> dict[str, tuple[int, ...]]:
    """Tensor name -> shape, in the names of the Hugging Face DeepSeek-V3 checkpoints (SGLang's loader reads these)."""
    h, n = cfg["hidden_size"], cfg["num_attention_heads"]
    qk_head = cfg["qk_nope_head_dim"] + cfg["qk_rope_head_dim"]
    kv_r, rope = cfg["kv_lora_rank"], cfg["qk_rope_head_dim"]
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (cfg["vocab_size"], h)}
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        if cfg["q_lora_rank"]:
            shapes[p + "self_attn.q_a_proj.weight"] = (cfg["q_lora_rank"], h)
            shapes[p + "self_attn.q_a_layernorm.weight"] = (cfg["q_lora_rank"],)
            shapes[p + "self_attn.q_b_proj.weight"] = (n * qk_head, cfg["q_lora_rank"])
        else:
            shapes[p + "self_attn.q_proj.weight"] = (n * qk_head, h)
        shapes[p + "self_attn.kv_a_proj_with_mqa.weight"] = (kv_r + rope, h)
        shapes[p + "self_attn.kv_a_layernorm.weight"] = (kv_r,)
        shapes[p + "self_attn.kv_b_proj.weight"] = (n * (cfg["qk_nope_head_dim"] + cfg["v_head_dim"]), kv_r)
        shapes[p + "self_attn.o_proj.weight"] = (h, n * cfg["v_head_dim"])
        shapes[p + "mlp.gate_proj.weight"] = (cfg["intermediate_size"], h)
        shapes[p + "mlp.up_proj.weight"] = (cfg["intermediate_size"], h)
        shapes[p + "mlp.down_proj.weight"] = (h, cfg["intermediate_size"])
        shapes[p + "input_layernorm.weight"] = (h,)
        shapes[p + "post_attention_layernorm.weight"] = (h,)
    shapes["model.norm.weight"] = (h,)
    shapes["lm_head.weight"] = (cfg["vocab_size"], h)
    return shapes


def make_weights(cfg: dict, seed: int):
    """Seeded bf16 tensors: norms 1, matrices N(0, 1/fan_in) (N(0, 1) for the embedding)."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    out = {}
    for name, shape in tensor_shapes(cfg).items():
        if name.endswith("norm.weight") or "layernorm" in name:
            t = torch.ones(shape)
        elif name == "model.embed_tokens.weight":
            t = torch.randn(shape, generator=gen)
        else:
            t = torch.randn(shape, generator=gen) / (shape[1] ** 0.5)
        out[name] = t.to(torch.bfloat16).contiguous()
    return out


def write_safetensors(tensors: dict, path: Path) -> None:
    """The safetensors format written directly (8-byte header length, JSON header, raw bytes), so the
    script needs torch only; bf16 tensors only."""
    import torch

    header: dict = {"__metadata__": {"format": "pt"}}
    blobs, offset = [], 0
    for name, t in tensors.items():
        if t.dtype != torch.bfloat16:
            raise ValueError(f"{name}: only bf16 is written, got {t.dtype}")
        t = t.contiguous()
        raw = ctypes.string_at(t.data_ptr(), t.numel() * t.element_size())  # no numpy needed
        header[name] = {"dtype": "BF16", "shape": list(t.shape), "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    head = json.dumps(header, separators=(",", ":")).encode()
    head += b" " * (-len(head) % 8)
    with open(path, "wb") as f:
        f.write(len(head).to_bytes(8, "little"))
        f.write(head)
        for raw in blobs:
            f.write(raw)


def tokenizer_vocab_size(tokenizer_dir: Path) -> int:
    """Highest token id + 1 in tokenizer.json (model vocab and added tokens)."""
    tok = json.loads((tokenizer_dir / "tokenizer.json").read_text())
    ids = list(tok["model"]["vocab"].values()) + [t["id"] for t in tok.get("added_tokens", [])]
    return max(ids) + 1


def build(out: Path, layers: int = 2, hidden: int = 1024, heads: int = 8, q_lora_rank: int | None = 512,
          intermediate: int = 2048, max_positions: int = 262144, seed: int = 0) -> dict:
    """Write the folder; return its config."""
    if not 1 <= layers <= 61:
        raise ValueError(f"layers must be 1..61, got {layers}")
    vocab = tokenizer_vocab_size(TOKENIZER_DIR)
    cfg = make_config(layers, hidden, heads, q_lora_rank, intermediate, vocab, max_positions)
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    (out / "generation_config.json").write_text(json.dumps(
        {"bos_token_id": 0, "eos_token_id": 0, "pad_token_id": 0, "do_sample": False}, indent=2) + "\n")
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copyfile(TOKENIZER_DIR / f, out / f)
    write_safetensors(make_weights(cfg, seed), out / "model.safetensors")
    (out / "MADE_BY.txt").write_text(f"data/models/make_mla_model.py --layers {layers} --hidden {hidden} --heads {heads} "
                                     f"--q-lora-rank {q_lora_rank or 0} --intermediate {intermediate} "
                                     f"--max-positions {max_positions} --seed {seed}\nrandom weights: output is "
                                     f"meaningless; for timing only\n")
    return cfg


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="model folder to write (created; files in it are replaced)")
    p.add_argument("--layers", type=int, default=2, help="decoder layers, all dense")
    p.add_argument("--hidden", type=int, default=1024, help="hidden size")
    p.add_argument("--heads", type=int, default=8, help="query heads (Kimi K2.6: 64 / TP 8 = 8)")
    p.add_argument("--q-lora-rank", type=int, default=512, help="query low-rank size (0: a plain q_proj)")
    p.add_argument("--intermediate", type=int, default=2048, help="dense MLP intermediate size")
    p.add_argument("--max-positions", type=int, default=262144, help="max_position_embeddings")
    p.add_argument("--seed", type=int, default=0, help="seed of the weights")
    a = p.parse_args(argv)
    cfg = build(Path(a.out), a.layers, a.hidden, a.heads, a.q_lora_rank or None, a.intermediate, a.max_positions,
                a.seed)
    size = (Path(a.out) / "model.safetensors").stat().st_size
    print(f"wrote {a.out}: deepseek_v3, {cfg['num_hidden_layers']} layers, hidden {cfg['hidden_size']}, "
          f"{cfg['num_attention_heads']} heads, kv_lora_rank {cfg['kv_lora_rank']} + rope {cfg['qk_rope_head_dim']}, "
          f"vocab {cfg['vocab_size']}, max_position_embeddings {cfg['max_position_embeddings']:,}, "
          f"{size / 1e6:.1f} MB, seed {a.seed}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
