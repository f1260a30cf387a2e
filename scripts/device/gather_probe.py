"""Is a token-table gather of 576-byte rows (an fp8 MLA cache) slower per byte than of 1,152-byte rows (bf16)?

Session 13's fp8 kernels spent about as long per 64-token tile as the bf16 pick although they read half the bytes
(docs/kernel-notes.md, runs 47-50). This times torch's ``index_select`` of whole cache rows (rows x 576 elements,
bf16 or one byte each) through a random permutation (the harness's shuffled_p1 layout) and in slot order, rotating
over several caches so that no call finds its rows in L2, and prints and writes one JSON row per case: the bytes read
and written over the median time (GB/s, 1e9 B/s). A CUDA machine only.

    python scripts/device/gather_probe.py OUT.jsonl [--tokens 131072,262144]
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import torch

from specdiag.kernels.timing import summarize_ms, time_calls


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", help="JSON lines file to append rows to")
    ap.add_argument("--tokens", default="131072,262144", help="rows gathered per call, comma-separated")
    ap.add_argument("--sets", type=int, default=4, help="caches rotated through (each at least the L2's size)")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("gather_probe needs a CUDA device", file=sys.stderr)
        return 2
    dev = torch.device("cuda")
    with open(args.out, "a") as f:
        for n in (int(t) for t in args.tokens.split(",")):
            for name, dtype in (("bf16", torch.bfloat16), ("fp8_bytes", torch.uint8)):
                caches = [torch.randint(0, 100, (n, 576), device=dev).to(dtype) for _ in range(args.sets)]
                outs = [torch.empty_like(c) for c in caches]
                for order in ("random", "slot_order"):
                    idx = torch.randperm(n, device=dev) if order == "random" else torch.arange(n, device=dev)
                    calls = [lambda c=c, o=o: torch.index_select(c, 0, idx, out=o) for c, o in zip(caches, outs)]
                    s = summarize_ms(time_calls(calls, n_runs=20, device=dev))
                    nbytes = 2 * caches[0].numel() * caches[0].element_size()
                    row = {"tokens": n, "dtype": name, "row_bytes": 576 * caches[0].element_size(), "order": order,
                           "ms_median": s["ms_median"], "gbps_read_plus_write": nbytes / (s["ms_median"] * 1e-3) / 1e9,
                           "ts_unix_s": time.time()}
                    f.write(json.dumps(row) + "\n")
                    print(json.dumps(row), flush=True)
                del caches, outs
                torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
