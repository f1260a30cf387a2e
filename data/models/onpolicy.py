"""On-policy distillation of the drafter: learn what the target actually generates.

The target's greedy continuations of prompts from the training text (plain windows, and windows ending
in a periodic stretch, the shape of a repetitive prompt) are generated once with the target's KV cache;
the drafter is then trained to match the target's next-token distribution (KL) on those sequences, so it
agrees with the target where speculative decoding needs it: on the target's own output.

    python data/models/onpolicy.py --device cpu          # refines data/models/drafter in place
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]


def make_prompts(corpus: np.ndarray, n: int, prompt_len: int, rng: np.random.Generator,
                 periodic_share: float = 0.5) -> np.ndarray:
    """`n` prompts of `prompt_len` tokens; a share `periodic_share` end in a periodic stretch of a 6-24-token
    span of the corpus."""
    out = np.empty((n, prompt_len), dtype=np.int64)
    for i in range(n):
        s = int(rng.integers(0, len(corpus) - prompt_len))
        row = corpus[s : s + prompt_len].astype(np.int64)
        if rng.random() < periodic_share:
            period = int(rng.integers(6, 25))
            span = int(rng.integers(prompt_len // 4, prompt_len))
            src = int(rng.integers(0, len(corpus) - period))
            unit = corpus[src : src + period]
            row[prompt_len - span :] = np.tile(unit, -(-span // period))[:span]
        out[i] = row
    return out


@torch.no_grad()
def generate(target, prompts: np.ndarray, new_tokens: int, batch: int, device: str) -> np.ndarray:
    seqs = []
    for i in range(0, len(prompts), batch):
        x = torch.from_numpy(prompts[i : i + batch]).to(device)
        y = target.generate(input_ids=x, attention_mask=torch.ones_like(x), max_new_tokens=new_tokens,
                            min_new_tokens=new_tokens, do_sample=False, pad_token_id=0)
        seqs.append(y.cpu().numpy())
    return np.concatenate(seqs)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--models", type=Path, default=HERE, help="folder with target/ and drafter/")
    ap.add_argument("--out", type=Path, default=None, help="where to save the drafter (default: in place)")
    ap.add_argument("--prompts", type=int, default=96)
    ap.add_argument("--prompt-len", type=int, default=640)
    ap.add_argument("--new-tokens", type=int, default=96)
    ap.add_argument("--gen-batch", type=int, default=16)
    ap.add_argument("--periodic-share", type=float, default=0.5, help="share of prompts ending periodically")
    ap.add_argument("--steps", type=int, default=120)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--lr", type=float, default=2e-4)
    args = ap.parse_args(argv)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(args.seed)
    rng = np.random.default_rng(args.seed + 7)
    tok = AutoTokenizer.from_pretrained(str(args.models / "target"))
    corpus = np.asarray(tok((REPO / "data/corpus/train.txt").read_text(encoding="utf-8"),
                            add_special_tokens=False)["input_ids"], dtype=np.int32)
    target = AutoModelForCausalLM.from_pretrained(str(args.models / "target"), dtype=torch.float32).to(args.device).eval()
    drafter = AutoModelForCausalLM.from_pretrained(str(args.models / "drafter"), dtype=torch.float32).to(args.device)
    t0 = time.perf_counter()
    seqs = generate(target, make_prompts(corpus, args.prompts, args.prompt_len, rng, args.periodic_share), args.new_tokens,
                    args.gen_batch, args.device)
    print(f"generated {seqs.shape} in {time.perf_counter() - t0:.0f}s", flush=True)
    opt = torch.optim.AdamW(drafter.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.0)
    drafter.train()
    t0 = time.perf_counter()
    for step in range(args.steps):
        idx = rng.integers(0, len(seqs), size=args.batch)
        x = torch.from_numpy(seqs[idx]).to(args.device)
        with torch.no_grad():
            t_logp = F.log_softmax(target(input_ids=x).logits.float(), -1)
        s_logp = F.log_softmax(drafter(input_ids=x).logits.float(), -1)
        kl_tok = (t_logp.exp() * (t_logp - s_logp)).sum(-1)  # (batch, len)
        # weight the generated part (what decoding sees) 3x over the prompt
        w = torch.ones_like(kl_tok)
        w[:, args.prompt_len - 1 :] = 3.0
        loss = (kl_tok * w).sum() / w.sum()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(drafter.parameters(), 1.0)
        for g in opt.param_groups:
            g["lr"] = args.lr * (1 - step / args.steps)
        opt.step()
        if step % 10 == 0 or step == args.steps - 1:
            gen_kl = float(kl_tok[:, args.prompt_len - 1 :].mean().detach())
            print(f"[onpolicy] step {step}/{args.steps} kl {float(loss):.3f} kl(generated) {gen_kl:.3f} "
                  f"{time.perf_counter() - t0:.0f}s", flush=True)
    out = args.out or (args.models / "drafter")
    drafter.eval().to("cpu", dtype=torch.bfloat16).save_pretrained(str(out))
    tok.save_pretrained(str(out))
    print(f"saved {out}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
