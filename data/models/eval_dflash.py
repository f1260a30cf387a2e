"""Commit lengths of a DFlash drafter on the embedded engine (the served path: localserver's SpecEngine, float32,
greedy), on predictable text (the cat sentence repeated) and novel prose, and its output checked against the target's
own greedy decoding.

    python data/models/eval_dflash.py --drafter data/models/dflash --contexts 1024 4096 --new-tokens 64
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1] / "lib"))

from specdiag.localserver.dflash import load_dflash  # noqa: E402
from specdiag.localserver.engine import DecodeRequest, SpecEngine, SpecSettings  # noqa: E402
from specdiag.localserver.models import load_model, load_tokenizer  # noqa: E402
from specdiag.prompts import build_prompt  # noqa: E402


def evaluate(drafter: Path, target: Path, contexts: list[int], new_tokens: int, window: int | None) -> list[dict]:
    """One row per (kind, context): mean commit per verify step (bonus included), the steps' commits, draft and
    verify ms medians, and whether the output equals the target's greedy output."""
    cpu = torch.device("cpu")
    lm = load_model(target, "target", cpu, torch.float32, "the target folder")
    tok = load_tokenizer(target)
    cfg = json.loads((drafter / "config.json").read_text())
    block = int(cfg["block_size"])
    model = load_dflash(drafter, lm.config.to_dict(), cpu, torch.float32, block)
    spec = SpecEngine(lm, None, SpecSettings(algorithm="DFLASH", num_draft_tokens=block, draft_window_size=window),
                      dflash=model)
    plain = SpecEngine(lm, None, SpecSettings(algorithm="NONE"))
    rows = []
    for ctx in contexts:
        for kind in ("predictable", "novel"):
            ids = build_prompt(lambda t: tok(t, add_special_tokens=False)["input_ids"], ctx, kind, seed=0).input_ids
            req = DecodeRequest(input_ids=list(ids), max_new_tokens=new_tokens)
            t0 = time.perf_counter()
            chunks = list(spec.generate(req))
            wall = time.perf_counter() - t0
            out = [t for c in chunks for t in c.new_ids]
            steps = [c.step for c in chunks if c.step is not None]
            ref = [t for c in plain.generate(req) for t in c.new_ids]
            rows.append({"kind": kind, "context": ctx, "commit_per_step": round((len(out) - 1) / len(steps), 3),
                         "step_commits": [s.committed for s in steps], "lossless": out == ref,
                         "draft_ms_median": round(statistics.median(s.draft_ms for s in steps), 2),
                         "verify_ms_median": round(statistics.median(s.verify_ms for s in steps), 2),
                         "wall_s": round(wall, 1)})
            print(json.dumps(rows[-1]), flush=True)
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--drafter", type=Path, default=HERE / "dflash")
    ap.add_argument("--target", type=Path, default=HERE / "target")
    ap.add_argument("--contexts", type=int, nargs="+", default=[1024])
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--window", type=int, default=None, help="draft window, tokens (default: none)")
    a = ap.parse_args(argv)
    torch.set_num_threads(1)
    evaluate(a.drafter, a.target, a.contexts, a.new_tokens, a.window)
    return 0


if __name__ == "__main__":
    sys.exit(main())
