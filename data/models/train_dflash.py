"""Train a tiny DFlash drafter for the embedded target on a CPU by the DFlash objective (into data/models/dflash/).

The objective (DFlash, z-lab, arXiv 2602.06036; the forward as SGLang's srt/models/dflash.py and the embedded engine's
lib/specdiag/localserver/dflash.py run it):

- a training sequence (the project's corpus with the copy curriculum of curriculum.py, denser than the target's: the
  target memorized its corpus, so its continuations of plain corpus text are recall a small drafter cannot learn in
  minutes, while copies from the context are learnable) goes once through the frozen
  target; its outputs of the drafter's ``target_layer_ids`` layers are the context features of every position, and
  its greedy next-token predictions the labels;
- ``blocks_per_seq`` anchors ``p`` per sequence: a block of ``block_size`` tokens, the sequence's token at ``p`` then
  the mask token, at positions ``p .. p + B - 1``; the block sees the context of positions ``< p`` (projected by ``fc``
  and ``hidden_norm`` into each layer's K/V) and itself in both directions (full-attention layers), all blocks of a
  sequence in one forward under one mask;
- loss: cross-entropy of block position ``i`` (1 .. B - 1) against the target's greedy token at ``p + i`` given the
  true prefix, read through the target's frozen embedding and LM head, position ``i`` weighted ``decay^(i - 1)``
  (a draft is useful only when all before it were accepted).

The drafter's layers start as the target's last layers (widths equal) and ``fc`` as the identity on the last tapped
layer, so training starts from "predict the next token from the target's deepest capturable features". Seeded; the
budget bounds wall time (``nice -n 10`` on a shared machine).

    nice -n 10 python data/models/train_dflash.py --budget-s 900 --out data/models/dflash
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(REPO / "lib"))

from curriculum import CopyCurriculum, sample_batch  # noqa: E402
from make_dflash_drafter import make_config, make_weights, tensor_shapes, write_safetensors  # noqa: E402

from specdiag.localserver.dflash import TargetTap, apply_rope, rms_norm, rope_cos_sin  # noqa: E402


def init_weights(cfg: dict, target: torch.nn.Module, init_layers: list[int], seed: int,
                 hidden_norm_from: int | None = None) -> dict[str, torch.Tensor]:
    """float32 trainable tensors: drafter layer i from target layer ``init_layers[i]``, norms from the target's final
    norm, ``fc`` the identity on the last tapped layer's features (the rest small noise)."""
    gen = torch.Generator().manual_seed(seed)
    sd = target.state_dict()
    h = cfg["hidden_size"]
    k = len(cfg["dflash_config"]["target_layer_ids"])
    w: dict[str, torch.Tensor] = {}
    for name, shape in tensor_shapes(cfg).items():
        if name.startswith("layers."):
            i, rest = name.split(".", 2)[1:]
            src = sd[f"model.layers.{init_layers[int(i)]}.{rest}"].float()
            assert tuple(src.shape) == shape, (name, src.shape, shape)
            w[name] = src.clone()
        elif name == "fc.weight":
            fc = torch.randn(shape, generator=gen) * 0.02 / math.sqrt(k)
            fc[:, (k - 1) * h:] += torch.eye(h)
            w[name] = fc
        elif name == "hidden_norm.weight" and hidden_norm_from is not None:
            # the context as target layer hidden_norm_from reads its input (its input_layernorm)
            w[name] = sd[f"model.layers.{hidden_norm_from}.input_layernorm.weight"].float().clone()
        else:
            w[name] = sd["model.norm.weight"].float().clone()
    for t in w.values():
        t.requires_grad_(True)
    return w


def block_mask(anchors: torch.Tensor, seq_len: int, block: int) -> torch.Tensor:
    """[n x B, seq_len + n x B] True where a block query may attend: its anchor's context (positions < p) and every
    token of its own block."""
    n = anchors.numel()
    q_block = torch.arange(n).repeat_interleave(block)
    ctx = torch.arange(seq_len)[None, :] < anchors[q_block][:, None]
    own = q_block[:, None] == q_block[None, :]
    return torch.cat([ctx, own], dim=1)


def blocks_hidden(w: dict[str, torch.Tensor], cfg: dict, feats: torch.Tensor, tokens: torch.Tensor,
                  anchors: torch.Tensor, embed: torch.Tensor) -> torch.Tensor:
    """The final hidden states [n, B, hidden] of one sequence's blocks, all in one forward: block j is the token at
    ``anchors[j]`` then mask tokens, seeing the context of positions < anchors[j] and its own block (full-attention
    layers; the embedded engine's localserver/dflash.py runs the same forward one block at a time, with a cache)."""
    bsz, t_len = cfg["block_size"], feats.shape[0]
    nh, nkv, hd, eps = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"], cfg["rms_norm_eps"]
    theta = cfg["rope_theta"]
    n = anchors.numel()
    q_pos = (anchors[:, None] + torch.arange(bsz)[None, :]).reshape(-1)
    ids = torch.full((n, bsz), cfg["dflash_config"]["mask_token_id"], dtype=torch.long)
    ids[:, 0] = tokens[anchors]
    h = F.embedding(ids.reshape(-1), embed)
    ctx = rms_norm(F.linear(feats, w["fc.weight"]), w["hidden_norm.weight"], eps)
    cc, cs = rope_cos_sin(torch.arange(t_len), hd, theta, torch.float32)
    qc, qs = rope_cos_sin(q_pos, hd, theta, torch.float32)
    mask = block_mask(anchors, t_len, bsz)[None]
    for i in range(cfg["num_hidden_layers"]):
        p, a = f"layers.{i}.", f"layers.{i}.self_attn."
        x = rms_norm(h, w[p + "input_layernorm.weight"], eps)

        def heads(t: torch.Tensor, count: int) -> torch.Tensor:
            return t.view(t.shape[0], count, hd).transpose(0, 1)

        q = apply_rope(rms_norm(heads(F.linear(x, w[a + "q_proj.weight"]), nh), w[a + "q_norm.weight"], eps), qc, qs)
        k_ctx = apply_rope(rms_norm(heads(F.linear(ctx, w[a + "k_proj.weight"]), nkv), w[a + "k_norm.weight"], eps),
                           cc, cs)
        k_blk = apply_rope(rms_norm(heads(F.linear(x, w[a + "k_proj.weight"]), nkv), w[a + "k_norm.weight"], eps),
                           qc, qs)
        k = torch.cat([k_ctx, k_blk], 1).repeat_interleave(nh // nkv, 0)
        v = torch.cat([heads(F.linear(ctx, w[a + "v_proj.weight"]), nkv),
                       heads(F.linear(x, w[a + "v_proj.weight"]), nkv)], 1).repeat_interleave(nh // nkv, 0)
        out = F.scaled_dot_product_attention(q[None], k[None], v[None], attn_mask=mask[None])[0]
        h = h + F.linear(out.transpose(0, 1).reshape(n * bsz, nh * hd), w[a + "o_proj.weight"])
        x = rms_norm(h, w[p + "post_attention_layernorm.weight"], eps)
        h = h + F.linear(F.silu(F.linear(x, w[p + "mlp.gate_proj.weight"])) * F.linear(x, w[p + "mlp.up_proj.weight"]),
                         w[p + "mlp.down_proj.weight"])
    return rms_norm(h, w["norm.weight"], eps).view(n, bsz, -1)


def drafter_loss(w: dict[str, torch.Tensor], cfg: dict, feats: torch.Tensor, tokens: torch.Tensor,
                 labels: torch.Tensor, anchors: torch.Tensor, embed: torch.Tensor,
                 decay: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Loss and per-position accuracy [B - 1] of one sequence's blocks. ``feats`` [T, K x H], ``tokens`` and
    ``labels`` [T] (labels[t]: the target's greedy token after position t), ``anchors`` [n]."""
    bsz = cfg["block_size"]
    h = blocks_hidden(w, cfg, feats, tokens, anchors, embed)[:, 1:]
    logits = F.linear(h, embed)  # the target's tied LM head
    target = labels[(anchors[:, None] + torch.arange(bsz - 1)[None, :])]  # position i predicts the token after p+i-1
    ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1), reduction="none").view(-1, bsz - 1)
    weights = decay ** torch.arange(bsz - 1, dtype=torch.float32)
    loss = (ce * weights).sum(1).mean() / weights.sum()
    acc = (logits.argmax(-1) == target).float().mean(0)
    return loss, acc


def save(w: dict[str, torch.Tensor], cfg: dict, out: Path, record: dict) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    write_safetensors({k: v.detach().to(torch.bfloat16).contiguous() for k, v in w.items()}, out / "model.safetensors")
    (out / "training.json").write_text(json.dumps(record, indent=2) + "\n")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", type=Path, default=HERE / "target")
    ap.add_argument("--out", type=Path, default=HERE / "dflash")
    ap.add_argument("--corpus", type=Path, default=REPO / "data/corpus/train.txt")
    ap.add_argument("--layers", type=int, default=2, help="drafter layers")
    ap.add_argument("--init-layers", type=int, nargs="*", default=[2, 3],
                    help="target layers the drafter starts as (an empty list: make_dflash_drafter.py's random init)")
    ap.add_argument("--hidden-norm-from", type=int, default=None,
                    help="start hidden_norm as this target layer's input_layernorm (default: the final norm)")
    ap.add_argument("--target-layers", type=int, nargs="+", default=[1, 2], help="target layer ids (<= L - 2)")
    ap.add_argument("--block-size", type=int, default=8)
    ap.add_argument("--seq-len", type=int, default=512)
    ap.add_argument("--batch", type=int, default=4, help="sequences per step")
    ap.add_argument("--blocks-per-seq", type=int, default=24)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--decay", type=float, default=0.8, help="weight of block position i is decay^(i - 1)")
    ap.add_argument("--periodic-per-16k", type=float, default=64.0,
                    help="periodic stretches per 16,384 tokens (curriculum.py; the target's memorized corpus text "
                    "teaches a drafter little, copies are what it can learn in minutes)")
    ap.add_argument("--phrases-per-1k", type=float, default=8.0, help="repeated phrases per 1,000 tokens")
    ap.add_argument("--periodic-share", type=float, default=0.0,
                    help="share of sequences that are one periodic stretch from a random start (a unit of "
                    "--period tokens of the corpus tiled, the shape of the predictable prompt) after plain text")
    ap.add_argument("--period", type=int, nargs=2, default=[4, 40], help="period range of those sequences, tokens")
    ap.add_argument("--steps", type=int, default=100000, help="at most this many steps")
    ap.add_argument("--budget-s", type=float, default=900.0, help="stop after this many seconds of training")
    ap.add_argument("--save-every-s", type=float, default=0.0,
                    help="also write the drafter to OUT every this many seconds of training (0: only at the end)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    if args.init_layers and len(args.init_layers) != args.layers:
        ap.error("give one --init-layers entry per drafter layer, or none for a random init")
    torch.manual_seed(args.seed)
    torch.set_num_threads(args.threads)
    rng = np.random.default_rng(args.seed)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(args.target), local_files_only=True)
    target = AutoModelForCausalLM.from_pretrained(str(args.target), local_files_only=True, dtype=torch.float32).eval()
    tcfg = json.loads((args.target / "config.json").read_text())
    corpus = np.asarray(tok(args.corpus.read_text(encoding="utf-8"), add_special_tokens=False)["input_ids"], np.int32)
    cfg = make_config(tcfg, args.layers, tcfg["num_attention_heads"], tcfg["num_key_value_heads"], tcfg["head_dim"],
                      tcfg["intermediate_size"], args.block_size, list(args.target_layers), tcfg["vocab_size"] - 1,
                      None, 0)
    if args.init_layers:
        w = init_weights(cfg, target, args.init_layers, args.seed, args.hidden_norm_from)
    else:
        w = {k: v.float().requires_grad_(True) for k, v in make_weights(cfg, args.seed).items()}
    embed = target.get_input_embeddings().weight.detach()
    tap = TargetTap(target, tuple(args.target_layers))
    opt = torch.optim.AdamW(list(w.values()), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.0)
    curriculum = CopyCurriculum(copy_share=1.0, phrases_per_1k_tokens=args.phrases_per_1k,
                                periodic_per_16k_tokens=args.periodic_per_16k, periodic_span_tokens=(32, 256))
    t0, step, log = time.perf_counter(), 0, []
    next_save = args.save_every_s or math.inf
    while step < args.steps and time.perf_counter() - t0 < args.budget_s:
        frac = min(1.0, (time.perf_counter() - t0) / args.budget_s)
        for g in opt.param_groups:  # 3% warm-up, then cosine to 10% over the time budget
            g["lr"] = args.lr * (min(1.0, (step + 1) / 30) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac))))
        batch = sample_batch(corpus, args.batch, args.seq_len, curriculum, rng)
        for row in batch:
            if rng.random() < args.periodic_share:
                period = int(rng.integers(args.period[0], args.period[1] + 1))
                src = int(rng.integers(0, len(corpus) - period))
                start = int(rng.integers(0, args.seq_len // 4))
                span = args.seq_len - start
                row[start:] = np.tile(corpus[src:src + period], -(-span // period))[:span]
        batch = torch.from_numpy(batch)
        with torch.no_grad():
            labels = target(input_ids=batch).logits.argmax(-1)
            feats = tap.take_batch()
        losses, accs = [], []
        for row in range(args.batch):
            anchors = torch.from_numpy(np.sort(rng.choice(np.arange(1, args.seq_len - args.block_size),
                                                          args.blocks_per_seq, replace=False)))
            loss, acc = drafter_loss(w, cfg, feats[row], batch[row], labels[row], anchors, embed, args.decay)
            losses.append(loss)
            accs.append(acc)
        loss = torch.stack(losses).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(list(w.values()), 1.0)
        opt.step()
        if step % 25 == 0:
            acc = torch.stack(accs).mean(0)
            entry = {"step": step, "s": round(time.perf_counter() - t0, 1), "loss": round(float(loss.detach()), 4),
                     "acc_by_position": [round(float(a), 3) for a in acc]}
            log.append(entry)
            print(json.dumps(entry), flush=True)
        step += 1
        if time.perf_counter() - t0 >= next_save:
            next_save += args.save_every_s
            save(w, cfg, args.out, {"partial": True, "steps": step, "train_s": round(time.perf_counter() - t0, 1),
                                    "log": log})
    tap.remove()
    record = {"command": "python data/models/train_dflash.py " + " ".join(sys.argv[1:] if argv is None else argv),
              "steps": step, "train_s": round(time.perf_counter() - t0, 1), "seed": args.seed,
              "torch": torch.__version__, "log": log}
    save(w, cfg, args.out, record)
    print(f"wrote {args.out}: {step} steps in {record['train_s']} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
