"""Write a random-weight DeepSeek-V3-architecture MoE model at Kimi K2.6's expert geometry, for 11_moe_batch1.

The geometry: 384 routed experts, top-8, one shared expert, ``noaux_tc`` sigmoid routing with one group (Kimi K2.6's
router), the first layer dense and every other layer MoE; hidden size 7168 and one TP8 rank of Kimi K2.6's MLA per
layer (8 heads, q_lora_rank 1536, kv_lora_rank 512 + rope 64) as in make_mla_model.py. The expert width
(``moe_intermediate_size``) and the layer count are chosen to fit: a routed expert of width 64 in bf16 holds as many
bytes as one TP8 rank's slice of a Kimi K2.6 expert (width 2048 / 8 = 256) in INT4 (0.5 B per weight), and 31 layers
(30 MoE layers, about 33 GB) fit the H200 with room for a long KV cache and the 64 GiB disk of the 1-GPU machine;
``--max-gb`` picks the most layers that fit a budget.

Routing that spreads (measured on the H200 with SGLang 0.5.17, 2026-12-02): ``--load-format dummy``, and transformers'
default init even with a fresh router, sent almost every token to the same few experts, because the residual stream
of a random model is nearly the same vector for every token and the router reads it. Here the residual stays each
token's own: token embeddings of unit scale (N(0, 1)), every output projection into the residual (attention o_proj,
the dense MLP's, the shared and routed experts' down_proj) scaled by ``--residual-scale`` (1e-3: below a bf16 step of
a unit-scale value, so the residual stays the embedding), the router N(0, 1/hidden) (logits of unit scale) and its
``e_score_correction_bias`` zero. Then a token's experts depend on the token and the layer's router and, over
distinct tokens, fall like independent uniform draws (59.5 distinct of 64 for 8 tokens). Tokens that repeat route
alike, as in any model. ``--check`` estimates this from the written router and embeddings (first-order: the residual
taken as the embedding); 11's spread check on the server's recorder counts is the real one, before any conclusion.

    python data/models/make_moe_model.py --out /dev/shm/moe --layers 31 --device cuda --check
    python data/models/make_moe_model.py --out /tmp/moe-tiny --hidden 256 --expert-width 8 --layers 3   # tests

Shards: one safetensors file per layer (plus embeddings and head), written tensor by tensor, with
model.safetensors.index.json. Needs torch only. The weights are never committed; the text it generates is meaningless.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import shutil
import sys
import zlib
from pathlib import Path

HERE = Path(__file__).resolve().parent
TOKENIZER_DIR = HERE / "tokenizer"
N_EXPERTS, TOP_K = 384, 8


def _mla():
    spec = importlib.util.spec_from_file_location("make_mla_model", HERE / "make_mla_model.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def make_config(layers: int, hidden: int, expert_width: int, dense_width: int, heads: int, q_lora_rank: int | None,
                vocab_size: int, max_positions: int) -> dict:
    cfg = _mla().make_config(layers, hidden, heads, q_lora_rank, dense_width, vocab_size, max_positions)
    cfg.update({
        "first_k_dense_replace": 1, "moe_layer_freq": 1, "moe_intermediate_size": expert_width,
        "n_routed_experts": N_EXPERTS, "n_shared_experts": 1, "num_experts_per_tok": TOP_K, "n_group": 1,
        "topk_group": 1, "topk_method": "noaux_tc", "scoring_func": "sigmoid", "norm_topk_prob": True,
        "routed_scaling_factor": 2.827,  # Kimi K2's
    })
    return cfg


def shard_shapes(cfg: dict) -> dict[str, dict[str, tuple[int, ...]]]:
    """Shard file -> tensor name -> shape, HF DeepSeek-V3 names (SGLang's loader reads these)."""
    mla = _mla()
    dense = {**cfg, "num_hidden_layers": cfg["num_hidden_layers"]}
    flat = mla.tensor_shapes(dense)
    h, w, e = cfg["hidden_size"], cfg["moe_intermediate_size"], cfg["n_routed_experts"]
    shards: dict[str, dict[str, tuple[int, ...]]] = {"model-embed.safetensors": {}}
    for name, shape in flat.items():
        if name.startswith("model.layers."):
            i = int(name.split(".")[2])
            if i >= cfg["first_k_dense_replace"] and ".mlp." in name:
                continue  # MoE layers: experts below
            shards.setdefault(f"model-layer{i:02d}.safetensors", {})[name] = shape
        else:
            shards["model-embed.safetensors"][name] = shape
    for i in range(cfg["first_k_dense_replace"], cfg["num_hidden_layers"]):
        s = shards[f"model-layer{i:02d}.safetensors"]
        p = f"model.layers.{i}.mlp."
        s[p + "gate.weight"] = (e, h)
        s[p + "gate.e_score_correction_bias"] = (e,)
        for part, shape in (("gate_proj", (w, h)), ("up_proj", (w, h)), ("down_proj", (h, w))):
            s[p + f"shared_experts.{part}.weight"] = shape
        for j in range(e):
            for part, shape in (("gate_proj", (w, h)), ("up_proj", (w, h)), ("down_proj", (h, w))):
                s[p + f"experts.{j}.{part}.weight"] = shape
    return shards


def init_for(name: str, shape: tuple[int, ...], residual_scale: float) -> tuple[str, float]:
    """How a tensor is drawn: ('ones'|'zeros'|'normal', std)."""
    if name.endswith("e_score_correction_bias"):
        return "zeros", 0.0
    if name.endswith("norm.weight") or "layernorm" in name:
        return "ones", 0.0
    if name == "model.embed_tokens.weight":
        return "normal", 1.0
    std = 1.0 / math.sqrt(shape[1])
    if name.endswith("o_proj.weight") or name.endswith("down_proj.weight"):
        std *= residual_scale
    return "normal", std


def _generator(seed: int, key: str, device: str):
    import torch

    g = torch.Generator(device=device)
    g.manual_seed((seed * 1_000_003 + zlib.crc32(key.encode())) % (2**63))
    return g


def write_shard(path: Path, shapes: dict[str, tuple[int, ...]], seed: int, residual_scale: float,
                device: str = "cpu") -> int:
    """One safetensors file written tensor by tensor (header first: offsets follow from the shapes); bytes written."""
    import torch

    header: dict = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, shape in shapes.items():
        nbytes = math.prod(shape) * (4 if name.endswith("e_score_correction_bias") else 2)
        header[name] = {"dtype": "F32" if name.endswith("e_score_correction_bias") else "BF16",
                        "shape": list(shape), "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    head = json.dumps(header, separators=(",", ":")).encode()
    head += b" " * (-len(head) % 8)
    with open(path, "wb") as f:
        f.write(len(head).to_bytes(8, "little"))
        f.write(head)
        for name, shape in shapes.items():
            kind, std = init_for(name, shape, residual_scale)
            if kind == "zeros":
                t = torch.zeros(shape, dtype=torch.float32)
            elif kind == "ones":
                t = torch.ones(shape, dtype=torch.bfloat16)
            else:
                t = (torch.randn(shape, generator=_generator(seed, name, device), device=device) * std)
                t = t.to(torch.bfloat16).cpu()
            t = t.contiguous()
            f.write(memoryview(t.view(torch.uint8).numpy()) if t.dtype == torch.bfloat16 else t.numpy().tobytes())
    return 8 + len(head) + offset


def layer_bytes(cfg: dict) -> int:
    """Bytes of one MoE layer's shard (bf16)."""
    return sum(math.prod(s) * 2 for s in shard_shapes({**cfg, "num_hidden_layers": 2})["model-layer01.safetensors"].values())


def build(out: Path, layers: int = 31, hidden: int = 7168, expert_width: int = 64, dense_width: int = 2304,
          heads: int = 8, q_lora_rank: int | None = 1536, max_positions: int = 262144, seed: int = 0,
          residual_scale: float = 1e-3, device: str = "cpu", max_gb: float | None = None,
          progress=print) -> dict:
    """Write the folder; return its config. ``max_gb``: the most layers whose shards fit (overrides ``layers``)."""
    mla = _mla()
    vocab = mla.tokenizer_vocab_size(TOKENIZER_DIR)
    if max_gb:
        probe = make_config(2, hidden, expert_width, dense_width, heads, q_lora_rank, vocab, max_positions)
        fixed = sum(math.prod(s) * 2 for s in shard_shapes(probe)["model-embed.safetensors"].values())
        dense = sum(math.prod(s) * 2 for s in shard_shapes(probe)["model-layer00.safetensors"].values())
        layers = max(2, min(61, 1 + int((max_gb * 1e9 - fixed - dense) // layer_bytes(probe))))
    if not 2 <= layers <= 61:
        raise ValueError(f"layers must be 2..61 (one dense, then MoE), got {layers}")
    cfg = make_config(layers, hidden, expert_width, dense_width, heads, q_lora_rank, vocab, max_positions)
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob("model*.safetensors"):
        old.unlink()
    (out / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    (out / "generation_config.json").write_text(json.dumps(
        {"bos_token_id": 0, "eos_token_id": 0, "pad_token_id": 0, "do_sample": False}, indent=2) + "\n")
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copyfile(TOKENIZER_DIR / f, out / f)
    weight_map, total = {}, 0
    for fname, shapes in shard_shapes(cfg).items():
        total += write_shard(out / fname, shapes, seed, residual_scale, device)
        weight_map.update({n: fname for n in shapes})
        progress(f"  {fname}: {total / 1e9:.2f} GB so far")
    (out / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {"total_size": total}, "weight_map": weight_map}, indent=1) + "\n")
    (out / "MADE_BY.txt").write_text(
        f"data/models/make_moe_model.py --layers {layers} --hidden {hidden} --expert-width {expert_width} "
        f"--dense-width {dense_width} --heads {heads} --q-lora-rank {q_lora_rank or 0} --max-positions {max_positions} "
        f"--seed {seed} --residual-scale {residual_scale}\nrandom weights, router included (spread recipe in the "
        f"script's docstring): the output is meaningless; for routing counts and timing only\n")
    return cfg


def check_routing(out: Path, n_tokens: int = 256, tokens_per_pass: int = 8, layers: int = 4, seed: int = 1) -> dict:
    """First-order estimate (the residual taken as each token's embedding, as the recipe intends): route random
    distinct tokens through the first ``layers`` MoE routers; distinct experts per pass of ``tokens_per_pass``
    tokens against the uniform expectation."""
    import torch
    from safetensors import safe_open

    cfg = json.loads((out / "config.json").read_text())
    index = json.loads((out / "model.safetensors.index.json").read_text())["weight_map"]

    def tensor(name):
        with safe_open(str(out / index[name]), framework="pt") as f:
            return f.get_tensor(name).float()

    emb = tensor("model.embed_tokens.weight")
    g = torch.Generator().manual_seed(seed)
    toks = torch.randperm(emb.shape[0], generator=g)[:n_tokens]
    x = emb[toks]
    x = x / x.pow(2).mean(-1, keepdim=True).sqrt()  # RMSNorm with unit weights
    k, e = cfg["num_experts_per_tok"], cfg["n_routed_experts"]
    expected = e * (1 - (1 - k / e) ** tokens_per_pass)
    ratios = []
    for i in range(cfg["first_k_dense_replace"], min(cfg["num_hidden_layers"], cfg["first_k_dense_replace"] + layers)):
        top = (x @ tensor(f"model.layers.{i}.mlp.gate.weight").T).topk(k, dim=-1).indices
        for j in range(0, n_tokens - tokens_per_pass + 1, tokens_per_pass):
            ratios.append(len(torch.unique(top[j:j + tokens_per_pass])) / expected)
    ratios.sort()
    return {"tokens_per_pass": tokens_per_pass, "expected_uniform": expected, "median_ratio": ratios[len(ratios) // 2],
            "min_ratio": ratios[0]}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="model folder to write (created; its model*.safetensors replaced)")
    p.add_argument("--layers", type=int, default=31, help="decoder layers: the first dense, the rest MoE")
    p.add_argument("--max-gb", type=float, default=None, help="instead of --layers: the most layers fitting this many GB")
    p.add_argument("--hidden", type=int, default=7168, help="hidden size (Kimi K2.6: 7168)")
    p.add_argument("--expert-width", type=int, default=64,
                   help="moe_intermediate_size of each routed (and the shared) expert; 64 in bf16 = one TP8 slice of "
                   "a Kimi K2.6 expert in INT4, in bytes")
    p.add_argument("--dense-width", type=int, default=2304, help="the dense first layer's intermediate size "
                   "(Kimi K2.6: 18432 / TP 8)")
    p.add_argument("--heads", type=int, default=8, help="query heads (Kimi K2.6: 64 / TP 8 = 8)")
    p.add_argument("--q-lora-rank", type=int, default=1536, help="query low-rank size (0: a plain q_proj)")
    p.add_argument("--max-positions", type=int, default=262144, help="max_position_embeddings")
    p.add_argument("--seed", type=int, default=0, help="seed of the weights")
    p.add_argument("--residual-scale", type=float, default=1e-3,
                   help="scale of every projection into the residual stream (keeps it each token's own)")
    p.add_argument("--device", default="cpu", help="where to draw the random numbers (cuda: much faster)")
    p.add_argument("--check", action="store_true", help="estimate the routing spread from the written weights")
    a = p.parse_args(argv)
    out = Path(a.out)
    cfg = build(out, a.layers, a.hidden, a.expert_width, a.dense_width, a.heads, a.q_lora_rank or None,
                a.max_positions, a.seed, a.residual_scale, a.device, a.max_gb)
    size = sum(f.stat().st_size for f in out.glob("model*.safetensors"))
    print(f"wrote {out}: deepseek_v3 MoE, {cfg['num_hidden_layers']} layers ({cfg['num_hidden_layers'] - 1} MoE), "
          f"{cfg['n_routed_experts']} experts top-{cfg['num_experts_per_tok']} + 1 shared, width "
          f"{cfg['moe_intermediate_size']}, hidden {cfg['hidden_size']}, {size / 1e9:.2f} GB, seed {a.seed}")
    if a.check:
        c = check_routing(out)
        print(f"routing check (first order): passes of {c['tokens_per_pass']} distinct tokens touch "
              f"{100 * c['median_ratio']:.0f}% (min {100 * c['min_ratio']:.0f}%) of the "
              f"{c['expected_uniform']:.1f} experts independent tokens would")
        if c["median_ratio"] < 0.8:
            print("routing does not spread: do not draw conclusions from this model's counts")
            return 3
    return 0


if __name__ == "__main__":
    sys.exit(main())
