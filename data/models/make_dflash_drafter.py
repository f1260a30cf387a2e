"""Write a random-weight DFlash drafter folder for a target model folder, in the layout SGLang and vLLM load.

DFlash (a block drafter) has no embeddings and no LM head of its own: it drafts a block of ``block_size`` tokens
(the anchor token, then mask tokens) from the target's hidden states of a few chosen target layers, projected by
``fc`` into its own hidden size (which must equal the target's), and reads the block's logits through the target's
LM head. The checkpoint (engines seen serving it: SGLang 0.5.17 ``--speculative-algorithm DFLASH``, srt/models/
dflash.py; vLLM 0.32 ``speculative_config={"method": "dflash"}``):

- ``config.json``: ``architectures: ["DFlashDraftModel"]``, ``model_type: "qwen3"``, the Qwen3 widths
  (``hidden_size`` = the target's, layers, heads, KV heads, ``head_dim``, ``intermediate_size``), ``block_size``,
  ``num_target_layers`` and ``dflash_config: {"target_layer_ids": [...], "mask_token_id": N}``; optionally
  ``layer_types`` (``full_attention``: bidirectional inside the block; ``sliding_attention`` with
  ``sliding_window``: causal over a window of the drafter's cache);
- ``model.safetensors`` (bf16): ``fc.weight`` [hidden, len(target_layer_ids) x hidden], ``hidden_norm.weight``,
  ``norm.weight``, and per layer ``input_layernorm``, ``self_attn.{q,k,v,o}_proj``, ``self_attn.{q,k}_norm``,
  ``post_attention_layernorm``, ``mlp.{gate,up,down}_proj``.

Target layer ids must be at most L - 2 for a target of L layers (SGLang captures the input of layer id + 1; L - 1
failed CUDA-graph capture on the H200). They are spread evenly over 1 .. L - 3, one per drafter layer, as the
published DFlash drafters pick them.

Shapes (``--shape``):

- ``tiny`` (default): 1 layer, 4 heads of 64, 2 KV heads, full attention, block 8: the cheapest that serves;
- ``kimi-k2.6``: the investigation's drafter (reference figures: a 6-layer Qwen3, 64 heads, 8 KV heads, head_dim
  128, block_size 8; 5 sliding-window layers of 2,048, 1 full-attention layer), at the target's hidden size;
- ``kimi-k2.6-tp8``: the same with one TP8 rank's heads (8 heads, 1 KV head), beside the per-rank MLA twin
  (make_mla_model.py --layers 61).

    python data/models/make_dflash_drafter.py --target /tmp/mla61 --out /tmp/dflash61 --shape kimi-k2.6-tp8
    python data/models/make_dflash_drafter.py --target data/models/target --out /tmp/dflash-tiny --block-size 8

Random weights draft noise: a target commits about 1 token per verify step on them (set SGLang's
``SGLANG_SIMULATE_ACC_LEN`` to time longer commits). Needs torch only; seconds on a CPU. Never committed.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from make_mla_model import write_safetensors  # noqa: E402

FULL, SLIDING = "full_attention", "sliding_attention"

#: shape name -> drafter widths and attention layout; ``None`` sizes follow the target
SHAPES: dict[str, dict] = {
    "tiny": {"layers": 1, "heads": 4, "kv_heads": 2, "head_dim": 64, "intermediate": None, "block_size": 8,
             "sliding_window": None, "sliding_layers": 0},
    "kimi-k2.6": {"layers": 6, "heads": 64, "kv_heads": 8, "head_dim": 128, "intermediate": None, "block_size": 8,
                  "sliding_window": 2048, "sliding_layers": 5},
    "kimi-k2.6-tp8": {"layers": 6, "heads": 8, "kv_heads": 1, "head_dim": 128, "intermediate": None,
                      "block_size": 8, "sliding_window": 2048, "sliding_layers": 5},
}


def target_layer_ids(target_layers: int, count: int) -> list[int]:
    """``count`` distinct target layer ids spread evenly over 1 .. L - 3 (all <= L - 2, SGLang's limit), ascending;
    a target too shallow for ``count`` distinct ids there gives the first ``count`` of 0 .. L - 2 (fewer where it has
    fewer: each layer is captured once, so a repeated id leaves the drafter's input short)."""
    if target_layers < 2:
        raise ValueError(f"a DFlash drafter needs a target of at least 2 layers, got {target_layers}")
    if count < 1:
        raise ValueError(f"at least one target layer, got {count}")
    lo, hi = 1, target_layers - 3
    if hi - lo + 1 < count:
        return list(range(min(count, target_layers - 1)))
    if count == 1:
        return [(lo + hi) // 2]
    return [round(lo + i * (hi - lo) / (count - 1)) for i in range(count)]


def layer_types(layers: int, sliding_layers: int) -> list[str]:
    """The first ``sliding_layers`` layers sliding-window, the rest full attention (the investigation's drafter: 5
    of 6 sliding; which layer is the full one was not published, so the full one is put last)."""
    if not 0 <= sliding_layers <= layers:
        raise ValueError(f"sliding layers must be 0..{layers}, got {sliding_layers}")
    return [SLIDING] * sliding_layers + [FULL] * (layers - sliding_layers)


def make_config(target: dict, layers: int, heads: int, kv_heads: int, head_dim: int, intermediate: int,
                block_size: int, ids: list[int], mask_token_id: int, sliding_window: int | None,
                sliding_layers: int) -> dict:
    """config.json of the drafter, its widths and context from the target's config."""
    vocab = int(target["vocab_size"])
    if not 0 <= mask_token_id < vocab:
        raise ValueError(f"mask_token_id {mask_token_id} is outside the target's vocabulary (0..{vocab - 1})")
    if block_size < 2:
        raise ValueError(f"block_size must be at least 2 (the anchor and one drafted token), got {block_size}")
    if sliding_layers and not sliding_window:
        raise ValueError("sliding layers need a sliding window (--sliding-window)")
    rope_theta = float(target.get("rope_theta") or (target.get("rope_parameters") or {}).get("rope_theta") or 1e6)
    cfg = {
        "architectures": ["DFlashDraftModel"],
        "model_type": "qwen3",
        "hidden_size": int(target["hidden_size"]),
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "head_dim": head_dim,
        "intermediate_size": intermediate,
        "hidden_act": "silu",
        "rms_norm_eps": 1e-6,
        "vocab_size": vocab,
        "max_position_embeddings": int(target.get("max_position_embeddings") or 32768),
        "rope_theta": rope_theta,
        "rope_parameters": {"rope_theta": rope_theta, "rope_type": "default"},
        "attention_bias": False,
        "tie_word_embeddings": False,
        "block_size": block_size,
        "num_target_layers": int(target["num_hidden_layers"]),
        "dflash_config": {"target_layer_ids": ids, "mask_token_id": mask_token_id},
        "layer_types": layer_types(layers, sliding_layers),
        "torch_dtype": "bfloat16",
        "dtype": "bfloat16",
    }
    if sliding_layers:  # transformers' Qwen3Config drops sliding_window unless use_sliding_window is true
        cfg.update(sliding_window=sliding_window, use_sliding_window=True)
    return cfg


def tensor_shapes(cfg: dict) -> dict[str, tuple[int, ...]]:
    """Tensor name -> shape, in the DFlash checkpoint naming both engines load."""
    h, n, kv, d = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    inter = cfg["intermediate_size"]
    shapes: dict[str, tuple[int, ...]] = {
        "fc.weight": (h, len(cfg["dflash_config"]["target_layer_ids"]) * h),
        "hidden_norm.weight": (h,),
        "norm.weight": (h,),
    }
    for i in range(cfg["num_hidden_layers"]):
        p = f"layers.{i}."
        shapes.update({
            p + "input_layernorm.weight": (h,),
            p + "self_attn.q_proj.weight": (n * d, h),
            p + "self_attn.k_proj.weight": (kv * d, h),
            p + "self_attn.v_proj.weight": (kv * d, h),
            p + "self_attn.o_proj.weight": (h, n * d),
            p + "self_attn.q_norm.weight": (d,),
            p + "self_attn.k_norm.weight": (d,),
            p + "post_attention_layernorm.weight": (h,),
            p + "mlp.gate_proj.weight": (inter, h),
            p + "mlp.up_proj.weight": (inter, h),
            p + "mlp.down_proj.weight": (h, inter),
        })
    return shapes


def make_weights(cfg: dict, seed: int) -> dict:
    """Seeded bf16 tensors: norms 1, matrices N(0, 1/fan_in)."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    out = {}
    for name, shape in tensor_shapes(cfg).items():
        t = torch.ones(shape) if len(shape) == 1 else torch.randn(shape, generator=gen) / (shape[1] ** 0.5)
        out[name] = t.to(torch.bfloat16).contiguous()
    return out


def build(target_dir: Path, out: Path, shape: str = "tiny", block_size: int | None = None,
          mask_token_id: int | None = None, sliding_window: int | None = None, target_layers: list[int] | None = None,
          seed: int = 0) -> dict:
    """Write the drafter folder for the target at ``target_dir``; return its config."""
    if shape not in SHAPES:
        raise ValueError(f"unknown shape {shape!r}: choose one of {', '.join(SHAPES)}")
    target_cfg_path = Path(target_dir) / "config.json"
    if not target_cfg_path.exists():
        raise FileNotFoundError(f"no config.json in the target folder {target_dir}: pass the target model's folder")
    target = json.loads(target_cfg_path.read_text())
    s = dict(SHAPES[shape])
    n_target = int(target["num_hidden_layers"])
    ids = list(target_layers) if target_layers else target_layer_ids(n_target, s["layers"])
    bad = [i for i in ids if not 0 <= i <= n_target - 2]
    if bad:
        raise ValueError(f"target layer ids {bad} out of range: each must be 0..{n_target - 2} for a {n_target}-layer "
                         "target (SGLang captures the input of layer id + 1)")
    if len(set(ids)) != len(ids):
        raise ValueError(f"target layer ids {ids} repeat a layer: each layer's hidden state is captured once, so give "
                         "distinct ids")
    window = sliding_window if sliding_window is not None else s["sliding_window"]
    sliding_layers = s["sliding_layers"] if window else 0
    cfg = make_config(target, s["layers"], s["heads"], s["kv_heads"], s["head_dim"],
                      s["intermediate"] or int(target.get("intermediate_size") or 4 * target["hidden_size"]),
                      block_size or s["block_size"], ids,
                      int(target["vocab_size"]) - 1 if mask_token_id is None else mask_token_id, window,
                      sliding_layers)
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    write_safetensors(make_weights(cfg, seed), out / "model.safetensors")
    (out / "MADE_BY.txt").write_text(
        f"data/models/make_dflash_drafter.py --target {target_dir} --shape {shape} --block-size {cfg['block_size']} "
        f"--mask-token-id {cfg['dflash_config']['mask_token_id']} --sliding-window {window or 0} "
        f"--target-layers {' '.join(map(str, ids))} --seed {seed}\n"
        "random weights: drafts are noise (about 1 token committed per verify step); for timing only\n")
    return cfg


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--target", required=True, help="the target model's folder (its config.json is read)")
    p.add_argument("--out", required=True, help="drafter folder to write (created; files in it are replaced)")
    p.add_argument("--shape", default="tiny", choices=sorted(SHAPES), help="drafter widths and attention layout")
    p.add_argument("--block-size", type=int, default=None, help="tokens per drafted block, anchor included")
    p.add_argument("--mask-token-id", type=int, default=None, help="the mask token (default: the target's last id)")
    p.add_argument("--sliding-window", type=int, default=None,
                   help="sliding window of the shape's sliding layers (0: every layer full attention)")
    p.add_argument("--target-layers", type=int, nargs="+", default=None,
                   help="target layer ids whose hidden states the drafter reads (default: spread evenly)")
    p.add_argument("--seed", type=int, default=0, help="seed of the weights")
    a = p.parse_args(argv)
    cfg = build(Path(a.target), Path(a.out), a.shape, a.block_size, a.mask_token_id, a.sliding_window,
                a.target_layers, a.seed)
    size = (Path(a.out) / "model.safetensors").stat().st_size
    print(f"wrote {a.out}: DFlashDraftModel ({a.shape}), {cfg['num_hidden_layers']} layers "
          f"({', '.join(cfg['layer_types'])}), hidden {cfg['hidden_size']}, {cfg['num_attention_heads']} heads / "
          f"{cfg['num_key_value_heads']} KV of {cfg['head_dim']}, block {cfg['block_size']}, target layers "
          f"{cfg['dflash_config']['target_layer_ids']}, mask token {cfg['dflash_config']['mask_token_id']}, "
          f"{size / 1e6:.1f} MB, seed {a.seed}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
