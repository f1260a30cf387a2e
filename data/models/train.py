"""Train the embedded engine's target and drafter, save them as Hugging Face folders, check them.

    python data/models/train.py --device cuda                 # the shipped models (see README.md)
    python data/models/train.py --device cpu --tiny --out-dir /tmp/m   # a smoke test, seconds

Target: Qwen3ForCausalLM, 4 layers d256, full attention, trained at 16,384 tokens (the longest
embedded context) for part of its steps, with the copy curriculum of curriculum.py.
Drafter: Qwen3ForCausalLM, 3 layers d256, sliding-window attention (512 tokens) on every layer but the
middle one, YaRN rope scaling (factor 4 over 4,096), 16,384 positions. It learns from the data and from
the target's next-token distribution (distillation). Started from random weights (only the embeddings
copied) it did not learn to copy in 819 H200 steps; the shipped one starts from the target's layers
(``--drafter-only --drafter-init-layers 0 2 3``, MLP as wide as the target's) and is then refined on the
target's own outputs by onpolicy.py. README.md has the exact commands.
Evaluation (``--eval``): greedy speculative decoding with speculate.py on the predictable and novel
prompts of specdiag.prompts at each context, n-gram prompt lookup and the model drafter, 8 drafts.
Everything is seeded (``--seed``); GPU kernels are not bitwise deterministic, so a rebuild matches in
losses and commit lengths, not in bytes.
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
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
from speculate import copy_accuracy, speculative_generate, speculative_sample  # noqa: E402

MAX_CONTEXT = 16384


def model_configs(vocab_size: int, eos_id: int, tiny: bool, drafter_mlp_mult: int = 2):
    from transformers import Qwen3Config

    d, heads = (64, 2) if tiny else (256, 4)
    common = dict(
        vocab_size=vocab_size, hidden_size=d, num_attention_heads=heads, num_key_value_heads=2, head_dim=d // heads,
        max_position_embeddings=MAX_CONTEXT, tie_word_embeddings=True, bos_token_id=eos_id, eos_token_id=eos_id,
        pad_token_id=eos_id, rms_norm_eps=1e-6, attention_dropout=0.0,
    )
    target = Qwen3Config(
        intermediate_size=3 * d, num_hidden_layers=4, use_sliding_window=False,
        layer_types=["full_attention"] * 4, rope_parameters={"rope_type": "default", "rope_theta": 1_000_000.0},
        **common,
    )
    drafter = Qwen3Config(
        intermediate_size=drafter_mlp_mult * d, num_hidden_layers=3, use_sliding_window=True, sliding_window=512,
        max_window_layers=0, layer_types=["sliding_attention", "full_attention", "sliding_attention"],
        rope_parameters={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 4096,
                         "rope_theta": 1_000_000.0},
        **common,
    )
    return target, drafter


def init_from_target_layers(drafter, target, layers: list[int]) -> None:
    """Copy the target's embeddings, final norm and the decoder layers `layers` into the drafter.

    The drafter's layer i gets the target's layer layers[i]; shapes must match (same width, heads and MLP).
    """
    if len(layers) != len(drafter.model.layers):
        raise ValueError(f"--drafter-init-layers {layers} names {len(layers)} layers; the drafter has "
                         f"{len(drafter.model.layers)}")
    with torch.no_grad():
        drafter.model.embed_tokens.weight.copy_(target.model.embed_tokens.weight)
        drafter.model.norm.load_state_dict(target.model.norm.state_dict())
        for i, j in enumerate(layers):
            drafter.model.layers[i].load_state_dict(target.model.layers[j].state_dict())


def lr_at(step: int, steps: int, peak: float) -> float:
    """Linear warm-up over 5% of the steps, then cosine down to 10% of the peak."""
    warm = max(1, steps // 20)
    if step < warm:
        return peak * (step + 1) / warm
    frac = (step - warm) / max(1, steps - warm)
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))


def seq_len_at(step: int, steps: int, short_len: int, long_len: int, long_share: float) -> int:
    """Short sequences first, then the last `long_share` of the steps at the full context."""
    return long_len if step >= steps * (1 - long_share) else short_len


def calibrate_steps(model, corpus, args, budget_s: float, teacher=None) -> int:
    """Steps that fit `budget_s` seconds: a throwaway copy of the model times a few steps per length."""
    import copy

    probe = copy.deepcopy(model)
    per_len = {}
    for seq_len in (args.short_len, args.long_len):
        sub = argparse.Namespace(**{**vars(args), "short_len": seq_len, "long_len": seq_len, "log_every": 10**9})
        train_model(probe, corpus, sub, 1, teacher=teacher, label="calibrate", log=lambda s: None)
        per_len[seq_len] = train_model(probe, corpus, sub, 3, teacher=teacher, label="calibrate",
                                       log=lambda s: None)["train_s"] / 3
    del probe
    step_s = (1 - args.long_share) * per_len[args.short_len] + args.long_share * per_len[args.long_len]
    steps = max(10, int(budget_s / step_s))
    print(f"calibration: {per_len} s/step by length -> {steps} steps for {budget_s:.0f}s", flush=True)
    return steps


def train_model(model, corpus, args, steps, teacher=None, label="target", log=print) -> dict:
    """AdamW on next-token loss (+ KL to `teacher`'s distribution when given); returns loss history."""
    dev = args.device
    model.to(dev).train()
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.1,
                            fused=dev == "cuda")
    rng = np.random.default_rng(args.seed + (0 if teacher is None else 1))
    cur = CopyCurriculum(copy_share=args.copy_share)
    autocast = torch.autocast("cuda", dtype=torch.bfloat16) if dev == "cuda" else torch.autocast("cpu", enabled=False)
    hist: list[tuple[int, int, float, float]] = []
    t0 = time.perf_counter()
    for step in range(steps):
        seq_len = seq_len_at(step, steps, args.short_len, args.long_len, args.long_share)
        batch = max(1, args.tokens_per_step // seq_len)
        x = torch.from_numpy(sample_batch(corpus, batch, seq_len, cur, rng)).to(dev, non_blocking=True)
        for g in opt.param_groups:
            g["lr"] = lr_at(step, steps, args.lr)
        with autocast:
            logits = model(input_ids=x).logits[:, :-1]
        ce = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), x[:, 1:].reshape(-1))
        loss = ce
        kl = torch.zeros((), device=dev)
        if teacher is not None:
            with torch.no_grad(), autocast:
                t_logits = teacher(input_ids=x).logits[:, :-1]
            t_logp = F.log_softmax(t_logits.float(), -1)
            s_logp = F.log_softmax(logits.float(), -1)
            kl = (t_logp.exp() * (t_logp - s_logp)).sum(-1).mean()
            loss = (1 - args.distill_weight) * ce + args.distill_weight * kl
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step % args.log_every == 0 or step == steps - 1:
            ce_v, kl_v = ce.item(), kl.item()
            hist.append((step, seq_len, ce_v, kl_v))
            log(f"[{label}] step {step}/{steps} seq {seq_len}x{batch} ce {ce_v:.3f} kl {kl_v:.3f} "
                f"lr {lr_at(step, steps, args.lr):.2e} {time.perf_counter() - t0:.0f}s")
    if dev == "cuda":
        torch.cuda.synchronize()
    return {"steps": steps, "train_s": round(time.perf_counter() - t0, 3), "history": hist,
            "final_ce": hist[-1][2], "final_kl": hist[-1][3]}


@torch.no_grad()
def heldout_ce(model, tokens: np.ndarray, device: str, seq_len: int, n_seq: int) -> float:
    """Mean next-token cross-entropy (nats/token) on `n_seq` windows of held-out tokens."""
    model.eval()
    rng = np.random.default_rng(1234)
    seq_len = min(seq_len, len(tokens) - 1)
    starts = rng.integers(0, len(tokens) - seq_len, size=n_seq)
    x = torch.tensor(np.stack([tokens[s : s + seq_len] for s in starts]).astype(np.int64), device=device)
    logits = model(input_ids=x).logits[:, :-1].float()
    return float(F.cross_entropy(logits.reshape(-1, logits.shape[-1]), x[:, 1:].reshape(-1)))


def save_model(model, tok, out: Path, dtype: torch.dtype) -> None:
    if out.exists():
        shutil.rmtree(out)
    model.to("cpu", dtype=dtype)
    model.save_pretrained(str(out), safe_serialization=True)
    tok.save_pretrained(str(out))


def evaluate(target, drafter, tok, args, log=print) -> list[dict]:
    """Greedy speculative decoding at each context, predictable and novel, n-gram and model drafter."""
    from specdiag.prompts import build_prompt

    def tokenize(text: str) -> list[int]:
        return tok(text, add_special_tokens=False)["input_ids"]

    rows = []
    for n_ctx in args.eval_contexts:
        for kind in ("predictable", "novel"):
            prompt = build_prompt(tokenize, n_ctx, kind, seed=args.eval_prompt_seed)
            ids = prompt.input_ids
            acc_t = copy_accuracy(target, ids, args.device, skip=len(ids) // 2)
            acc_d = copy_accuracy(drafter, ids, args.device, skip=len(ids) // 2)
            for (name, dr), temp in [(d, t) for t in [0.0] + args.eval_temperatures
                                     for d in (("NGRAM", None), ("STANDALONE", drafter))]:
                t0 = time.perf_counter()
                if temp == 0.0:
                    res = speculative_generate(target, ids, args.eval_new_tokens, args.num_draft_tokens, dr, args.device)
                else:
                    gen = torch.Generator().manual_seed(args.seed)
                    res = speculative_sample(target, ids, args.eval_new_tokens, args.num_draft_tokens, dr,
                                             args.device, temp, gen)
                row = {
                    "context_tokens": n_ctx, "kind": kind, "drafter": name, "temperature": temp,
                    "mean_commit_length": round(res.mean_commit_length, 3),
                    "max_commit_length": args.num_draft_tokens + 1, "verify_steps": len(res.step_commit_lengths),
                    "step_commit_lengths": res.step_commit_lengths,
                    "target_next_token_accuracy_2nd_half": round(acc_t, 4),
                    "drafter_next_token_accuracy_2nd_half": round(acc_d, 4),
                    "distinct_4grams_share_of_output": round(distinct_ngram_share(res.output_ids, 4), 3),
                    "output_preview": tok.decode(res.output_ids)[:160], "wall_s": round(time.perf_counter() - t0, 2),
                }
                rows.append(row)
                log(f"[eval] ctx {n_ctx:>6} {kind:<11} {name:<10} T={temp:.1f} commit {row['mean_commit_length']:.2f}/"
                    f"{row['max_commit_length']} steps {row['verify_steps']:>3} acc(t) {acc_t:.3f} acc(d) {acc_d:.3f} "
                    f"distinct4 {row['distinct_4grams_share_of_output']:.2f} | {row['output_preview'][:70]!r}")
    return rows


def distinct_ngram_share(ids: list[int], n: int) -> float:
    """Share of the output's n-grams that are distinct (1.0 = no repetition, low = a loop)."""
    grams = [tuple(ids[i : i + n]) for i in range(len(ids) - n + 1)]
    return len(set(grams)) / len(grams) if grams else float("nan")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--tiny", action="store_true", help="tiny models and few steps: a CPU smoke test")
    ap.add_argument("--out-dir", type=Path, default=HERE, help="folder that receives target/ and drafter/")
    ap.add_argument("--tokenizer", type=Path, default=HERE / "tokenizer")
    ap.add_argument("--corpus", type=Path, default=REPO / "data/corpus/train.txt")
    ap.add_argument("--target-steps", type=int, default=0, help="0 = as many as fit --target-budget-s")
    ap.add_argument("--drafter-steps", type=int, default=0, help="0 = as many as fit --drafter-budget-s")
    ap.add_argument("--target-budget-s", type=float, default=140.0, help="training time when steps are 0, s")
    ap.add_argument("--drafter-budget-s", type=float, default=110.0, help="training time when steps are 0, s")
    ap.add_argument("--tokens-per-step", type=int, default=131072, help="tokens per optimizer step")
    ap.add_argument("--short-len", type=int, default=4096, help="sequence length of the first steps, tokens")
    ap.add_argument("--long-len", type=int, default=MAX_CONTEXT, help="sequence length of the last steps, tokens")
    ap.add_argument("--long-share", type=float, default=0.3, help="share of steps at --long-len")
    ap.add_argument("--copy-share", type=float, default=0.5, help="share of sequences with copy material")
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--distill-weight", type=float, default=0.7, help="weight of the KL to the target, drafter")
    ap.add_argument("--log-every", type=int, default=100)
    ap.add_argument("--save-dtype", default="bfloat16", choices=["bfloat16", "float32"])
    ap.add_argument("--drafter-only", action="store_true",
                    help="load the trained target from --out-dir/target and (re)train only the drafter")
    ap.add_argument("--drafter-init-layers", type=int, nargs="*", default=[],
                    help="start the drafter from these decoder layers of the target (e.g. 0 2 3); none = random")
    ap.add_argument("--eval", action="store_true", help="run the speculative check after training")
    ap.add_argument("--eval-only", action="store_true", help="load the saved models from --out-dir and check them")
    ap.add_argument("--eval-contexts", type=int, nargs="+", default=[1024, 4096, 16384])
    ap.add_argument("--eval-new-tokens", type=int, default=64)
    ap.add_argument("--eval-prompt-seed", type=int, default=0)
    ap.add_argument("--num-draft-tokens", type=int, default=8)
    ap.add_argument("--eval-temperatures", type=float, nargs="*", default=[0.7],
                    help="also check lossless speculative sampling at these temperatures (greedy always runs)")
    ap.add_argument("--report", type=Path, default=None, help="write losses, timings and eval rows as JSON here")
    args = ap.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        ap.error("--device cuda but torch sees no CUDA device; use --device cpu (with --tiny for a smoke test)")
    if args.tiny:
        args.target_steps, args.drafter_steps = args.target_steps or 4, args.drafter_steps or 4
        args.tokens_per_step, args.short_len, args.long_len = 2048, 256, 1024
        args.eval_contexts, args.eval_new_tokens, args.log_every = [256, 1024], 12, 1

    from transformers import AutoModelForCausalLM, AutoTokenizer, Qwen3ForCausalLM

    torch.manual_seed(args.seed)
    np.random.seed(args.seed)
    tok = AutoTokenizer.from_pretrained(str(args.tokenizer))
    report: dict = {"args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
                    "torch": torch.__version__, "device_name": torch.cuda.get_device_name() if args.device == "cuda" else "cpu"}
    dtype = getattr(torch, args.save_dtype)
    if args.eval_only:
        target = AutoModelForCausalLM.from_pretrained(str(args.out_dir / "target"), dtype=torch.float32).to(args.device).eval()
        drafter = AutoModelForCausalLM.from_pretrained(str(args.out_dir / "drafter"), dtype=torch.float32).to(args.device).eval()
    else:
        text = args.corpus.read_text(encoding="utf-8")
        corpus = np.asarray(tok(text, add_special_tokens=False)["input_ids"], dtype=np.int32)
        novel = np.asarray(tok((REPO / "data/prompts/novel_prose.txt").read_text(encoding="utf-8"),
                               add_special_tokens=False)["input_ids"], dtype=np.int32)
        print(f"corpus {len(corpus)} tokens, held-out prose {len(novel)} tokens", flush=True)
        t_cfg, d_cfg = model_configs(len(tok), tok.eos_token_id, args.tiny,
                                     drafter_mlp_mult=3 if args.drafter_init_layers else 2)
        attn = "sdpa"
        if args.drafter_only:
            target = AutoModelForCausalLM.from_pretrained(str(args.out_dir / "target"), dtype=torch.float32,
                                                          attn_implementation=attn)
        else:
            target = Qwen3ForCausalLM._from_config(t_cfg, attn_implementation=attn)
        drafter = Qwen3ForCausalLM._from_config(d_cfg, attn_implementation=attn)
        report["target_params"] = sum(p.numel() for p in target.parameters())
        report["drafter_params"] = sum(p.numel() for p in drafter.parameters())
        print(f"target {report['target_params']} params, drafter {report['drafter_params']} params", flush=True)
        target.to(args.device)
        if not args.drafter_only:
            steps = args.target_steps or calibrate_steps(target, corpus, args, args.target_budget_s)
            report["target_train"] = train_model(target, corpus, args, steps, label="target")
        target.eval().requires_grad_(False)
        if args.drafter_init_layers:
            init_from_target_layers(drafter, target, args.drafter_init_layers)
        else:
            with torch.no_grad():
                drafter.model.embed_tokens.weight.copy_(target.model.embed_tokens.weight)
        drafter.to(args.device)
        steps = args.drafter_steps or calibrate_steps(drafter, corpus, args, args.drafter_budget_s, teacher=target)
        report["drafter_train"] = train_model(drafter, corpus, args, steps, teacher=target, label="drafter")
        drafter.eval().requires_grad_(False)
        for name, m in (("target", target), ("drafter", drafter)):
            with torch.autocast("cuda", dtype=torch.bfloat16, enabled=args.device == "cuda"), torch.no_grad():
                report[f"{name}_heldout_ce_train_text"] = heldout_ce(m, corpus, args.device, args.short_len, 4)
                report[f"{name}_heldout_ce_novel_prose"] = heldout_ce(m, novel, args.device, args.short_len, 4)
            print(f"{name}: ce on training text {report[f'{name}_heldout_ce_train_text']:.3f}, "
                  f"on held-out prose {report[f'{name}_heldout_ce_novel_prose']:.3f} nats/token", flush=True)
        for name, m in (("target", target), ("drafter", drafter)):
            if not (name == "target" and args.drafter_only):
                save_model(m, tok, args.out_dir / name, dtype)
        # evaluate the saved weights (rounded to the saved dtype), in float32
        target = target.to(args.device, dtype=torch.float32)
        drafter = drafter.to(args.device, dtype=torch.float32)
    if args.eval or args.eval_only:
        t0 = time.perf_counter()
        report["eval"] = evaluate(target, drafter, tok, args, log=lambda s: print(s, flush=True))
        report["eval_s"] = round(time.perf_counter() - t0, 1)
    if args.report:
        args.report.parent.mkdir(parents=True, exist_ok=True)
        args.report.write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
