"""Last plugin call: TP 2 greedy identity (stock vs plugin) and, for every differing prompt, why (logprobs).

Two servers (``stock`` and ``plugin`` with SGLANG_PLUGINS=specdiag_splitkv), started in parallel at
``--tp-size`` (2 on nvidia-h200-x2), reusing scripts/sglang_plugin_check.py's server set-up. If they are not
ready within ``--startup-s`` and ``--fallback-tp1`` is set, both are restarted at TP 1, stock on GPU 0 and the
plugin on GPU 1. Steps, each guarded, under a wall-clock budget:

(a) identity: greedy outputs over the TP 1 identity prompts (20 short, 64..2,000 tokens, seeds 0..19) and
    the long ones (default 1,024 and 32,768 tokens);
(b) for every prompt that differs: the same request with ``return_logprob`` and ``top_logprobs_num=2``
    (``logprob_start_len=-1``: output tokens only) on BOTH servers; at the first position where those two
    outputs differ, each server's top-2 logprobs and their margin. A margin <= ``--tie-margin`` (default
    1e-2, about bf16 resolution) on the stock side is a rounding tie; a larger one points at a bug;
(c) plugin stats per rank (stats-<arm>/stats-<pid>.json) and, if time allows, specdiag.steps.baseline_sweep.sweep's step ms at
    ``--contexts`` per arm.

Dry run (embedded server, no logprobs there: the rows say so)::

    python scripts/sglang_plugin_last.py --engine embedded --device cpu --out /tmp/last-dry --tp-size 1 \\
        --identity-short 3 --identity-long 512 --contexts 256 --max-new-tokens 8 --budget-s 200
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import sglang_plugin_check as chk  # noqa: E402

from specdiag.prompts import build_prompt  # noqa: E402
from specdiag.runs import Run  # noqa: E402
from specdiag.serving import SGLangClient  # noqa: E402

log = chk.log


def first_diff(a: list[int], b: list[int]) -> int | None:
    j = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)
    if j is None and len(a) != len(b):
        j = min(len(a), len(b))
    return j


def _entries(pos: Any) -> list[tuple[float, int]]:
    """One position of output_top_logprobs: [[logprob, token_id, text?], ...] -> [(logprob, id)], best first."""
    out = []
    for e in pos or []:
        if isinstance(e, (list, tuple)) and len(e) >= 2 and e[0] is not None:
            out.append((float(e[0]), int(e[1])))
    return sorted(out, key=lambda t: -t[0])


def logprob_request(client: SGLangClient, ids: list[int], max_new_tokens: int) -> dict[str, Any]:
    """Greedy request with return_logprob and top_logprobs_num=2 (non-streaming JSON, raw /generate)."""
    client.flush_cache()
    body = {"input_ids": ids, "stream": False, "return_logprob": True, "top_logprobs_num": 2,
            "logprob_start_len": -1,
            "sampling_params": {"max_new_tokens": max_new_tokens, "temperature": 0.0, "ignore_eos": True}}
    resp = client._request("POST", "/generate", json_body=body)  # noqa: SLF001 - the client's own session
    if not resp.ok:
        return {"error": f"HTTP {resp.status_code}: {resp.text[:300]}"}
    data = resp.json()
    data = data[0] if isinstance(data, list) else data
    meta = data.get("meta_info", {}) or {}
    tok = meta.get("output_token_logprobs")
    top = meta.get("output_top_logprobs")
    out_ids = data.get("output_ids") or ([int(t[1]) for t in tok] if tok else [])
    if tok is None or top is None:
        return {"error": f"no logprob fields in the answer (meta_info keys: {sorted(meta)[:20]})", "output_ids": out_ids}
    return {"error": None, "output_ids": out_ids, "token_logprobs": [[t[0], t[1]] for t in tok],
            "top2": [[list(e) for e in _entries(p)[:2]] for p in top]}


def explain(clients: dict[str, SGLangClient], ids: list[int], greedy_stock: list[int], greedy_plugin: list[int],
            args: argparse.Namespace) -> dict[str, Any]:
    s = logprob_request(clients["stock"], ids, args.max_new_tokens)
    p = logprob_request(clients["plugin"], ids, args.max_new_tokens)
    row: dict[str, Any] = {"stock_logprob_error": s.get("error"), "plugin_logprob_error": p.get("error"),
                           "stock_lp_matches_greedy": s.get("output_ids") == greedy_stock,
                           "plugin_lp_matches_greedy": p.get("output_ids") == greedy_plugin}
    if s.get("error") or p.get("error"):
        return row
    j = first_diff(s["output_ids"], p["output_ids"])
    row["lp_first_diff"] = j
    if j is None:
        row["verdict"] = "logprob runs identical (the greedy difference did not repeat)"
        return row
    for arm, r in (("stock", s), ("plugin", p)):
        top = r["top2"][j] if j < len(r["top2"]) else []
        row[f"{arm}_top2"] = top
        row[f"{arm}_token"] = r["output_ids"][j] if j < len(r["output_ids"]) else None
        row[f"{arm}_margin"] = (top[0][0] - top[1][0]) if len(top) >= 2 else None
    m = row.get("stock_margin")
    # the plugin's top-2 should be the same two tokens, swapped, if this is a tie
    same_pair = ({t[1] for t in row.get("stock_top2", [])} == {t[1] for t in row.get("plugin_top2", [])})
    row["same_top2_tokens"] = same_pair
    if m is None:
        row["verdict"] = "no top-2 at the first difference"
    elif m <= args.tie_margin and same_pair:
        row["verdict"] = f"rounding tie (stock margin {m:.3g} <= {args.tie_margin})"
    else:
        row["verdict"] = f"NOT a tie: stock margin {m:.3g} > {args.tie_margin} or different top-2 (a bug to chase)"
    return row


def identity(clients: dict[str, SGLangClient], args: argparse.Namespace, work: Path, budget: chk.Budget,
             tp: int) -> list[dict[str, Any]]:
    n = args.identity_short
    sets = [("short", 64 + (1936 * i) // max(1, n - 1), i) for i in range(n)]
    sets += [("long", c, i) for i, c in enumerate(args.identity_long)]
    rows = []
    tok = chk.tokenizer_of(clients["stock"])
    for tag, ctx, seed in sets:
        if budget.left() < 15 + ctx / 4000:
            log(f"identity: skipping {ctx:,} tokens ({budget.left():.0f} s left)")
            continue
        row: dict[str, Any] = {"tp": tp, "set": tag, "context_tokens": ctx, "seed": seed}
        try:
            ids = build_prompt(tok, ctx, "novel", seed=seed).input_ids
            ref = chk.greedy(clients["stock"], ids, args.max_new_tokens)
            res = chk.greedy(clients["plugin"], ids, args.max_new_tokens)
            row.update(stock_error=ref["error"], plugin_error=res["error"], stock_ids=ref["output_ids"],
                       plugin_ids=res["output_ids"])
            row["identical"] = ref["output_ids"] == res["output_ids"] and not ref["error"] and not res["error"]
            row["first_diff"] = first_diff(ref["output_ids"], res["output_ids"])
            if not row["identical"] and budget.left() > 15 + ctx / 2000:
                row.update(explain(clients, ids, ref["output_ids"], res["output_ids"], args))
        except Exception as exc:  # noqa: BLE001 - the row is kept with its error
            row["exception"] = f"{type(exc).__name__}: {exc}"
        rows.append(row)
        with open(work / "identity.jsonl", "a") as fh:
            fh.write(json.dumps(row) + "\n")
        log(f"identity {tag} {ctx:,}: identical {row.get('identical')}, first diff {row.get('first_diff')}"
            + (f", {row.get('verdict')}; stock top2 {row.get('stock_top2')} plugin top2 {row.get('plugin_top2')}"
               if "verdict" in row or row.get("stock_logprob_error") else "")
            + (f", logprob errors {row.get('stock_logprob_error')} / {row.get('plugin_logprob_error')}"
               if row.get("stock_logprob_error") or row.get("plugin_logprob_error") else "")
            + (f", {row['exception']}" if "exception" in row else ""))
    return rows


def start_pair(args: argparse.Namespace, work: Path, failures: list, budget: chk.Budget) -> dict[str, Any]:
    servers = {arm: chk.make_server(arm, args, work) for arm in ("stock", "plugin")}
    for arm, s in servers.items():
        chk.step(f"start {arm} tp{args.tp_size}", failures, s.launch)
    for arm, s in servers.items():
        ok = chk.step(f"ready {arm} tp{args.tp_size}", failures,
                      lambda s=s: s.wait_ready(timeout_s=max(10.0, min(args.startup_s, budget.left() - 30))))
        log(f"{arm} tp{args.tp_size}: {'ready at ' + s.url if ok else 'NOT READY'}")
    return servers


def stop_all(servers: dict[str, Any], failures: list) -> None:
    for arm, s in servers.items():
        chk.step(f"stop {arm}", failures, s.stop)


def summarize(work: Path, rows: list, runs: dict, failures: list, tp: int) -> str:
    from specdiag.steps.baseline_sweep.sweep import latest_rows  # noqa: PLC0415

    lines = [f"=== summary (measured on this call; TP {tp})"]
    ok = sum(bool(r.get("identical")) for r in rows)
    lines.append(f"identity plugin vs stock at TP {tp}: {ok}/{len(rows)} prompts identical")
    for r in rows:
        if not r.get("identical"):
            lines.append(f"  {r['set']} {r['context_tokens']:,} seed {r['seed']}: first diff {r.get('first_diff')}; "
                         f"{r.get('verdict') or r.get('stock_logprob_error') or r.get('exception')}; stock top2 "
                         f"{r.get('stock_top2')} margin {r.get('stock_margin')}; plugin top2 {r.get('plugin_top2')} "
                         f"margin {r.get('plugin_margin')}")
    for arm in ("stock", "plugin"):
        for s in chk.read_stats(work, arm):
            lines.append(f"plugin stats {arm} pid {s.get('pid')}: mode {s.get('mode')}, served {s.get('served')} "
                         f"(in capture {s.get('served_in_capture')}), fallback {s.get('fallback')}")
    for arm, run in runs.items():
        for r in latest_rows(run.rows("sweep")):
            lines.append(f"sweep {arm} {int(r['context_tokens']):,}: step {r.get('step_ms')} ms, "
                         f"error {r.get('error')}")
    lines.append(f"failures: {failures or 'none'}")
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ints = lambda s: [int(x) for x in s.split(",") if x]  # noqa: E731
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True)
    p.add_argument("--model-path", default="/tmp/mla-model")
    p.add_argument("--engine", choices=("sglang", "embedded"), default="sglang")
    p.add_argument("--device", default="cuda")
    p.add_argument("--site", default="/tmp/site")
    p.add_argument("--plugin-path", default="/tmp/plugin")
    p.add_argument("--budget-s", type=float, default=360)
    p.add_argument("--startup-s", type=float, default=240)
    p.add_argument("--fallback-tp1", action="store_true", help="restart at TP 1 (one GPU each) if TP 2 is not ready")
    p.add_argument("--context-length", type=int, default=140000)
    p.add_argument("--mem-fraction", type=float, default=0.35)
    p.add_argument("--max-total-tokens", type=int, default=400000)
    p.add_argument("--draft-tokens", type=int, default=8)
    p.add_argument("--tp-size", type=int, default=2)
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.add_argument("--contexts", type=ints, default=[1024, 131072])
    p.add_argument("--identity-short", type=int, default=20)
    p.add_argument("--identity-long", type=ints, default=[1024, 32768])
    p.add_argument("--tie-margin", type=float, default=1e-2)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    signal.signal(signal.SIGTERM, chk._terminated)  # noqa: SLF001
    args = parse_args(argv)
    work = Path(args.out)
    work.mkdir(parents=True, exist_ok=True)
    budget = chk.Budget(args.budget_s - 25)
    failures: list = []
    rows: list = []
    runs: dict[str, Run] = {}
    servers: dict[str, Any] = {}
    try:
        servers = start_pair(args, work, failures, budget)
        if not all(s.running() for s in servers.values()) and args.fallback_tp1 and args.tp_size > 1 \
                and budget.left() > 90:
            log(f"TP {args.tp_size} not ready: falling back to TP 1, stock on GPU 0, plugin on GPU 1")
            stop_all(servers, failures)
            args.tp_size = 1
            orig = chk.arm_env
            chk.arm_env = lambda arm, a, w: {**orig(arm, a, w), "CUDA_VISIBLE_DEVICES": "0" if arm == "stock" else "1"}
            servers = start_pair(args, work, failures, budget)
        clients = {arm: SGLangClient(s.url, timeout_s=240) for arm, s in servers.items() if s.running()}
        if set(clients) == {"stock", "plugin"}:
            rows = chk.step("(a,b) identity + logprobs", failures,
                            lambda: identity(clients, args, work, budget, args.tp_size)) or []
            for arm in clients:
                runs[arm] = Run.create(work / f"run-{arm}-tp{args.tp_size}", label=f"{arm}-tp{args.tp_size}")
                chk.step(f"snapshot {arm}", failures,
                         lambda a=arm: chk.snapshot(runs[a], clients[a], a, args, work))
            time.sleep(1.2)  # the plugin writes its stats at most once a second, on a call
            chk.step("stats request", failures, lambda: chk.greedy(
                clients["plugin"], build_prompt(chk.tokenizer_of(clients["plugin"]), 64, "novel", seed=99).input_ids, 4))
            chk.step("(c) sweep", failures, lambda: chk.sweep_step(clients, runs, args, budget))
        else:
            failures.append({"step": "servers", "error": f"not both ready: running {sorted(clients)}"})
    finally:
        stop_all(servers, failures)
        text = summarize(work, rows, runs, failures, args.tp_size)
        (work / "summary.txt").write_text(text + "\n")
        (work / "failures.json").write_text(json.dumps(failures, indent=1))
        print(text, flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
