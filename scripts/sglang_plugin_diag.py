"""Plugin call of 2026-11-30: where the plugin's step time goes, the NGRAM prompt-tail fix, identity.

TP 1 (``--phase tp1``, nvidia-h200-x2: two servers per GPU, started together):

- ``stock``          GPU 0: SGLang as shipped.
- ``plugin-attn``    GPU 0: the plugin's split-KV verify only (SPECDIAG_SGLANG_NGRAM_TAIL=0): the arm of the call before it.
- ``plugin``         GPU 1: the plugin as shipped: split-KV verify + NGRAM prompt-tail drafting.
- ``upstream-tail``  GPU 1: SGLang's upstream split-KV verify forced on + NGRAM prompt-tail drafting.

Steps, each guarded (a failed step is logged, the rest goes on), under a wall-clock budget:
(a) identity, stock vs plugin: greedy ids over 20 short prompts (64..2,000 tokens) and ``--identity-long``,
    a stock-vs-stock repeat as control; for every differing prompt, the top-2 logprobs at the first differing
    position, read from a 1-token request whose prompt is the prompt plus the common output prefix (prefill
    logits: the model's margin there), on stock and on the plugin server, and the upstream arm's greedy ids;
(b) sweep: specdiag.steps.baseline_sweep's request per context, the four arms interleaved, one run folder each;
(c) profiles: SGLang's torch profiler (/start_profile, CPU + GPU, Python stacks) over ``--profile-steps`` decode
    steps of one long request per (arm, context) in ``--profiles``; traces kept as written by SGLang.

TP 2 (``--phase tp2``): ``stock``, ``plugin`` and ``check`` (the plugin with SPECDIAG_SGLANG_CHECK=1, decode CUDA
graphs off: SGLang's kernel and the plugin's on every verify call) at --tp-size 2 with
--disable-custom-all-reduce (the TP 2 servers of the last call hung in the custom all-reduce's set-up);
identity stock vs plugin as in (a) and the per-call check.

    python scripts/sglang_plugin_diag.py --phase tp1 --out /tmp/diag --model-path /tmp/mla-model --budget-s 480
    python scripts/sglang_plugin_diag.py --phase tp2 --out /tmp/diag-tp2 --model-path /tmp/mla-model --budget-s 420
"""

from __future__ import annotations

import argparse
import json
import signal
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import sglang_plugin_check as chk  # noqa: E402

from specdiag.identity import first_diff  # noqa: E402
from specdiag.prompts import build_prompt  # noqa: E402
from specdiag.runs import Run  # noqa: E402
from specdiag.serving import SGLangClient  # noqa: E402

log = chk.log
ARMS_TP1 = {  # arm: (description, GPU, environment beyond chk.arm_env's)
    "stock": ("SGLang as shipped", "0", {}),
    "plugin-attn": ("the plugin's split-KV verify only (NGRAM prompt-tail off)", "0",
                    {"SGLANG_PLUGINS": "specdiag_splitkv", "SPECDIAG_SGLANG_VERIFY": "splitkv",
                     "SPECDIAG_SGLANG_NGRAM_TAIL": "0"}),
    "plugin": ("the plugin as shipped: split-KV verify + NGRAM prompt-tail drafting", "1",
               {"SGLANG_PLUGINS": "specdiag_splitkv", "SPECDIAG_SGLANG_VERIFY": "splitkv",
                "SPECDIAG_SGLANG_NGRAM_TAIL": "1"}),
    "upstream-tail": ("SGLang's upstream split-KV verify forced on + NGRAM prompt-tail drafting", "1",
                      {"SGLANG_PLUGINS": "specdiag_splitkv", "SPECDIAG_SGLANG_VERIFY": "upstream",
                       "SPECDIAG_SGLANG_NGRAM_TAIL": "1"}),
}
ARMS_TP2 = {
    "stock": ("SGLang as shipped, TP 2", "0,1", {}),
    "plugin": ("the plugin as shipped, TP 2", "0,1",
               {"SGLANG_PLUGINS": "specdiag_splitkv", "SPECDIAG_SGLANG_VERIFY": "splitkv"}),
    "check": ("the plugin with SPECDIAG_SGLANG_CHECK=1, decode CUDA graphs off, TP 2", "0,1",
              {"SGLANG_PLUGINS": "specdiag_splitkv", "SPECDIAG_SGLANG_VERIFY": "splitkv",
               "SPECDIAG_SGLANG_CHECK": "1"}),
}


def gpu_count() -> int:
    """GPUs this machine shows (``nvidia-smi -L``); 0 when there is no nvidia-smi."""
    import shutil  # noqa: PLC0415
    import subprocess  # noqa: PLC0415

    if not shutil.which("nvidia-smi"):
        return 0
    out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30, check=False).stdout
    return sum(1 for line in out.splitlines() if line.startswith("GPU "))


def place_arms(arms: dict, n_gpus: int, tp_size: int) -> dict:
    """The arms with their GPU lists fitted to this machine: a TP 1 arm planned for GPU k runs on GPU k mod n
    (a one-GPU machine runs every arm on GPU 0, as SGLang's --mem-fraction-static 0.3 leaves room for); a TP > 1
    phase needs tp_size GPUs and says so before any server starts."""
    if n_gpus < 1:
        raise SystemExit("no GPU visible (nvidia-smi -L lists none): the SGLang servers need one")
    if tp_size > n_gpus:
        raise SystemExit(f"phase needs {tp_size} GPUs (TP {tp_size}) and this machine shows {n_gpus}: "
                         f"use the device kind nvidia-h200-x{tp_size}")
    placed = {}
    for arm, (desc, gpus, env) in arms.items():
        if tp_size == 1:
            gpus = ",".join(str(int(g) % n_gpus) for g in gpus.split(","))
        placed[arm] = (desc, gpus, env)
    return placed


def configure_arms(arms: dict, args: argparse.Namespace) -> None:
    """Point sglang_plugin_check's server set-up at this call's arms (environment, GPU, flags)."""
    def arm_env(arm: str, a: argparse.Namespace, work: Path) -> dict[str, str]:
        paths = [p for p in (a.site, None if arm == "stock" else a.plugin_path, str(chk.ROOT / "lib")) if p]
        env = {"PYTHONPATH": ":".join(paths), "SPECDIAG_SGLANG_STATS": str(work / f"stats-{arm}"),
               "CUDA_VISIBLE_DEVICES": arms[arm][1],
               "NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
        env.update(arms[arm][2])
        return env

    chk.arm_env = arm_env
    chk.ARMS.update({arm: desc for arm, (desc, _, _) in arms.items()})


def top2_at(client: SGLangClient, ids: list[int]) -> dict[str, Any]:
    """Top-2 logprobs of the next token after ``ids`` (a 1-token greedy request: the prefill's logits)."""
    client.flush_cache()
    body = {"input_ids": ids, "stream": False, "return_logprob": True, "top_logprobs_num": 2,
            "logprob_start_len": -1,
            "sampling_params": {"max_new_tokens": 1, "temperature": 0.0, "ignore_eos": True}}
    resp = client._request("POST", "/generate", json_body=body)  # noqa: SLF001
    if not resp.ok:
        return {"error": f"HTTP {resp.status_code}: {resp.text[:200]}"}
    data = resp.json()
    data = data[0] if isinstance(data, list) else data
    top = (data.get("meta_info") or {}).get("output_top_logprobs") or []
    entries = sorted(((float(e[0]), int(e[1])) for e in (top[0] if top else []) if e and e[0] is not None),
                     key=lambda t: -t[0])
    if len(entries) < 2:
        return {"error": f"no top-2 logprobs in the answer: {str(top)[:200]}"}
    return {"error": None, "top2": [list(e) for e in entries[:2]], "margin": entries[0][0] - entries[1][0]}


def identity(clients: dict[str, SGLangClient], args: argparse.Namespace, work: Path, budget: chk.Budget,
             ref: str = "stock", test: str = "plugin") -> list[dict[str, Any]]:
    n = args.identity_short
    sets = [("short", 64 + (1936 * i) // max(1, n - 1), i) for i in range(n)]
    sets += [("long", c, i) for i, c in enumerate(args.identity_long)]
    tok = chk.tokenizer_of(clients[ref])
    rows = []
    for tag, ctx, seed in sets:
        need_s = 20 + ctx / 3000
        if budget.left() < need_s:
            why = f"budget: {budget.left():.0f} s left, about {need_s:.0f} s needed"
            log(f"identity: skipping {ctx:,} tokens ({why})")
            rows.append({"tp": args.tp_size, "set": tag, "context_tokens": ctx, "seed": seed, "skipped": why})
            continue
        row: dict[str, Any] = {"tp": args.tp_size, "set": tag, "context_tokens": ctx, "seed": seed,
                               "ref_arm": ref, "test_arm": test}
        try:
            ids = build_prompt(tok, ctx, "novel", seed=seed).input_ids
            a = chk.greedy(clients[ref], ids, args.max_new_tokens)
            b = chk.greedy(clients[test], ids, args.max_new_tokens)
            row.update(ref_ids=a["output_ids"], test_ids=b["output_ids"], ref_error=a["error"], test_error=b["error"])
            row["identical"] = a["output_ids"] == b["output_ids"] and not a["error"] and not b["error"]
            row["first_diff"] = first_diff(a["output_ids"], b["output_ids"])
            if tag == "short":
                again = chk.greedy(clients[ref], ids, args.max_new_tokens)
                row["ref_repeat_identical"] = again["output_ids"] == a["output_ids"]
            j = row["first_diff"]
            if j is not None and not a["error"] and not b["error"]:
                common = ids + a["output_ids"][:j]
                for arm in (ref, test):
                    r = top2_at(clients[arm], common)
                    row[f"{arm}_top2_at_diff"] = r.get("top2")
                    row[f"{arm}_margin_at_diff"] = r.get("margin")
                    row[f"{arm}_top2_error"] = r.get("error")
                pair = {t[1] for t in row.get(f"{ref}_top2_at_diff") or []}
                row["diff_tokens_are_top2"] = (len(pair) == 2 and a["output_ids"][j] in pair
                                               and j < len(b["output_ids"]) and b["output_ids"][j] in pair)
                for arm in [x for x in clients if x not in (ref, test) and x.startswith("upstream")]:
                    u = chk.greedy(clients[arm], ids, args.max_new_tokens)
                    row[f"{arm}_first_diff_vs_ref"] = first_diff(a["output_ids"], u["output_ids"])
        except Exception as exc:  # noqa: BLE001 - the row is kept with its error
            row["exception"] = f"{type(exc).__name__}: {exc}"
        rows.append(row)
        with open(work / "identity.jsonl", "a") as fh:
            fh.write(json.dumps(row) + "\n")
        log(f"identity {tag} {ctx:,}: identical {row.get('identical')}, first diff {row.get('first_diff')}"
            + (f", margin at diff {row.get(ref + '_margin_at_diff')}, top2 {row.get(ref + '_top2_at_diff')}, "
               f"both tokens in top-2 {row.get('diff_tokens_are_top2')}" if row.get("first_diff") is not None else "")
            + (f", {row['exception']}" if "exception" in row else ""))
    return rows


def round_robin(requests: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The sweep's requests repeat-major: every context once, then every context again, so a budget that runs out
    cuts repeats, not contexts (the 22:52 call of 2026-11-30 measured 16,384 tokens five times and nothing else)."""
    return sorted(requests, key=lambda q: (int(q["repeat"]), requests.index(q)))


def sweep(clients: dict[str, SGLangClient], runs: dict[str, Run], args: argparse.Namespace,
          budget: chk.Budget) -> None:
    from specdiag.steps.baseline_sweep.sweep import make_plan, measure_request  # noqa: PLC0415

    arms = list(runs)
    info = clients[arms[0]].server_info()
    plan = make_plan(args.contexts, args.sweep_new_tokens, args.repeats, "novel", 0, True,
                     server_context_length=info.get("context_length"))
    took_s: dict[int, float] = {}  # context -> the longest request measured at it (s), for the budget
    for request in round_robin(plan.requests()):
        c = int(request["context_tokens"])
        need = len(arms) * took_s.get(c, 4 + c / 10000)
        if budget.left() < need + args.reserve_profiles_s:
            log(f"sweep: skipping {c:,} tokens, repeat {request['repeat']}: {budget.left():.0f} s left, "
                f"about {need:.0f} s needed + {args.reserve_profiles_s:.0f} s kept for the profiles")
            continue
        for arm in arms:
            t0 = time.monotonic()
            row = measure_request(clients[arm], request, plan)
            took_s[c] = max(took_s.get(c, 0.0), time.monotonic() - t0)
            runs[arm].append_row("sweep", row)
            log(f"sweep {arm:>13} {c:>7,}: step {row.get('step_ms')} ms, commit {row.get('commit_length')}, "
                f"ttft {row.get('ttft_s')} s, error {row.get('error')}")


def profile_one(url: str, arm: str, ctx: int, args: argparse.Namespace, work: Path, run: Run | None) -> dict:
    """One long greedy request; /start_profile once its prefill is over; the trace file SGLang wrote."""
    from specdiag.measure.sweep_table import latest_rows  # noqa: PLC0415

    gen, ctl = SGLangClient(url, timeout_s=240), SGLangClient(url, timeout_s=60)
    swept = {int(r["context_tokens"]): r for r in latest_rows(run.rows("sweep"))} if run else {}
    ttft_s = float((swept.get(ctx) or {}).get("ttft_s") or max(0.5, ctx / 40000))
    step_ms = float((swept.get(ctx) or {}).get("step_ms") or 10.0)
    wait_s = ttft_s + 0.4
    # up to 8 tokens commit per step (NGRAM accepted 5.95 per step on this prompt at 65,536 tokens on 2026-11-30, and
    # a 491-token request ended before /start_profile): enough tokens for the wait and the profiled steps at 8 each
    new_tokens = int(min(4000, 8 * (wait_s * 1000 / step_ms + args.profile_steps + 30)))
    ids = build_prompt(chk.tokenizer_of(gen), ctx, "novel", seed=500).input_ids
    out_dir = work / f"profile-{arm}-{ctx}"
    out_dir.mkdir(parents=True, exist_ok=True)
    result: dict[str, Any] = {}
    gen.flush_cache()
    th = threading.Thread(target=lambda: result.update(chk.greedy(gen, ids, new_tokens)), daemon=True)
    t0 = time.monotonic()
    th.start()
    time.sleep(wait_s)
    body = {"output_dir": str(out_dir), "num_steps": args.profile_steps, "activities": ["CPU", "GPU"],
            "with_stack": True, "record_shapes": False, "profile_id": f"{arm}-{ctx}"}
    resp = ctl._request("POST", "/start_profile", json_body=body)  # noqa: SLF001
    started = time.monotonic() - t0
    th.join(timeout=180)
    for _ in range(40):  # the scheduler writes the trace when the last profiled step ends
        files = sorted(out_dir.glob("*.trace.json*"))
        if files:
            break
        time.sleep(0.5)
    row = {"arm": arm, "context_tokens": ctx, "profile_steps": args.profile_steps, "new_tokens": new_tokens,
           "start_profile_status": resp.status_code, "start_profile_after_s": round(started, 3),
           "request_error": result.get("error"), "completion_tokens": result.get("completion_tokens"),
           "files": [f.name for f in files], "bytes": [f.stat().st_size for f in files]}
    with open(work / "profiles.jsonl", "a") as fh:
        fh.write(json.dumps(row) + "\n")
    log(f"profile {arm} {ctx:,}: {row}")
    return row


def summarize(work: Path, rows: list, runs: dict, failures: list, args: argparse.Namespace) -> str:
    from specdiag.measure.sweep_table import latest_rows  # noqa: PLC0415

    lines = [f"=== summary (measured on this call; phase {args.phase}, TP {args.tp_size})"]
    skipped = [r for r in rows if r.get("skipped")]
    rows = [r for r in rows if not r.get("skipped")]
    ok = sum(bool(r.get("identical")) for r in rows)
    ctrl = [r["ref_repeat_identical"] for r in rows if "ref_repeat_identical" in r]
    not_run = ", ".join(f"{r['context_tokens']:,}" for r in skipped)
    lines.append(f"identity plugin vs stock: {ok}/{len(rows)} identical; stock repeat {sum(ctrl)}/{len(ctrl)}"
                 + (f"; NOT RUN: {len(skipped)} prompts ({not_run} tokens; {skipped[0]['skipped']})" if skipped else ""))
    for r in rows:
        if not r.get("identical"):
            lines.append(f"  {r['set']} {r['context_tokens']:,} seed {r['seed']}: first diff {r.get('first_diff')}; "
                         f"stock margin {r.get('stock_margin_at_diff')} top2 {r.get('stock_top2_at_diff')}; "
                         f"both in top-2 {r.get('diff_tokens_are_top2')}; upstream first diff "
                         f"{r.get('upstream-tail_first_diff_vs_ref')}; {r.get('exception') or ''}")
    steps: dict[str, dict[int, list[float]]] = {}
    for arm, run in runs.items():
        steps[arm] = {}
        for r in latest_rows(run.rows("sweep")):
            if not r.get("error") and r.get("step_ms"):
                steps[arm].setdefault(int(r["context_tokens"]), []).append(float(r["step_ms"]))
    for c in sorted({c for s in steps.values() for c in s}):
        lines.append(f"sweep {c:>7,}: " + ", ".join(
            f"{a} median {statistics.median(steps[a][c]):.2f} (n {len(steps[a][c])}, "
            f"{min(steps[a][c]):.2f}-{max(steps[a][c]):.2f})" if steps[a].get(c) else f"{a} -" for a in steps)
            + " ms/step")
    for arm in runs:
        for s in chk.read_stats(work, arm):
            lines.append(f"plugin stats {arm} pid {s.get('pid')}: mode {s.get('mode')}, served {s.get('served')} "
                         f"(capture {s.get('served_in_capture')}), ngram_tail {s.get('ngram_tail')}, "
                         f"fallback {s.get('fallback')}, upstream {s.get('upstream_served')}")
    check = work / "check.json"
    if check.exists():
        c = json.loads(check.read_text())
        lines.append(f"check: {c.get('calls_compared')} calls, max rel err {c.get('max_rel_err')}, "
                     f"passed {c.get('passed')}")
    prof = work / "profiles.jsonl"
    if prof.exists():
        for line in prof.read_text().splitlines():
            p = json.loads(line)
            lines.append(f"profile {p['arm']} {p['context_tokens']:,}: files {p['files']} bytes {p['bytes']}")
    lines.append(f"failures: {failures or 'none'}")
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ints = lambda s: [int(x) for x in s.split(",") if x]  # noqa: E731
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--phase", choices=("tp1", "tp2"), default="tp1")
    p.add_argument("--out", required=True)
    p.add_argument("--model-path", default="/tmp/mla-model")
    p.add_argument("--engine", default="sglang")
    p.add_argument("--site", default="/tmp/site")
    p.add_argument("--plugin-path", default="/tmp/plugin")
    p.add_argument("--budget-s", type=float, default=480)
    p.add_argument("--startup-s", type=float, default=240)
    p.add_argument("--context-length", type=int, default=140000)
    p.add_argument("--mem-fraction", type=float, default=0.3)
    p.add_argument("--max-total-tokens", type=int, default=400000)
    p.add_argument("--draft-tokens", type=int, default=8)
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.add_argument("--sweep-new-tokens", type=int, default=64)
    p.add_argument("--contexts", type=ints, default=[1024, 4096, 16384, 32768, 65536, 131072])
    p.add_argument("--identity-short", type=int, default=20)
    p.add_argument("--identity-long", type=ints, default=[16384, 65536, 120000])
    p.add_argument("--check-contexts", type=ints, default=[1000, 20000, 100000])
    p.add_argument("--profiles", default="plugin-attn:131072,plugin:131072,plugin:1024,stock:131072")
    p.add_argument("--profile-steps", type=int, default=12)
    p.add_argument("--arms", default="", help="a subset of the phase's arms, comma-separated (default: all)")
    p.add_argument("--repeats", type=int, default=1, help="sweep requests per context and arm")
    p.add_argument("--skip-identity", action="store_true")
    p.add_argument("--reserve-profiles-s", type=float, default=60)
    a = p.parse_args(argv)
    a.tp_size = 2 if a.phase == "tp2" else 1
    return a


def main(argv: list[str] | None = None) -> int:
    signal.signal(signal.SIGTERM, chk._terminated)  # noqa: SLF001
    args = parse_args(argv)
    work = Path(args.out)
    work.mkdir(parents=True, exist_ok=True)
    budget = chk.Budget(args.budget_s - 30)
    arms = ARMS_TP1 if args.phase == "tp1" else ARMS_TP2
    if args.arms:
        arms = {a: arms[a] for a in args.arms.split(",") if a}
    arms = place_arms(arms, gpu_count(), args.tp_size)
    log(f"GPUs: {', '.join(f'{a} on {g}' for a, (_, g, _) in arms.items())}")
    configure_arms(arms, args)
    failures: list = []
    rows: list = []
    runs: dict[str, Run] = {}
    servers = {arm: chk.make_server(arm, args, work) for arm in arms}
    try:
        for arm, s in servers.items():
            chk.step(f"start {arm}", failures, s.launch)
        for arm, s in servers.items():
            # start-up gets what is left but 20 s (to stop): the servers take 100-130 s on x2 and a start cut
            # short measures nothing (two calls of 2026-11-30 gave them 53 s and 44 s and got no rows)
            ok = chk.step(f"ready {arm}", failures,
                          lambda s=s: s.wait_ready(timeout_s=max(10.0, min(args.startup_s, budget.left() - 20))))
            log(f"{arm}: {'ready at ' + s.url if ok else 'NOT READY'}")
        clients = {arm: SGLangClient(s.url, timeout_s=240) for arm, s in servers.items() if s.running()}
        for arm in [a for a in arms if a != "check" and a in clients]:
            runs[arm] = Run.create(work / f"run-{arm}-tp{args.tp_size}", label=f"{arm}-tp{args.tp_size}")
            chk.step(f"snapshot {arm}", failures, lambda a=arm: chk.snapshot(runs[a], clients[a], a, args, work))
        if "stock" in clients and "plugin" in clients and not args.skip_identity:
            rows = chk.step("(a) identity", failures, lambda: identity(clients, args, work, budget)) or []
        if "check" in clients:
            chk.step("(a') check inside SGLang", failures, lambda: chk.check_step(clients, args, work))
        if args.phase == "tp1":
            chk.step("(b) sweep", failures, lambda: sweep(clients, runs, args, budget))
            for spec in [s for s in args.profiles.split(",") if s]:
                arm, ctx = spec.split(":")
                if arm not in clients or budget.left() < 25 + int(ctx) / 10000:
                    log(f"profile {spec}: skipped ({'no server' if arm not in clients else 'budget'})")
                    continue
                chk.step(f"(c) profile {spec}", failures,
                         lambda a=arm, c=int(ctx): profile_one(servers[a].url, a, c, args, work, runs.get(a)))
        time.sleep(1.2)  # stats are written at most once a second, on a call: one short request per plugin arm
        for arm in [a for a in clients if a != "stock"]:
            chk.step(f"stats {arm}", failures, lambda a=arm: chk.greedy(
                clients[a], build_prompt(chk.tokenizer_of(clients[a]), 64, "novel", seed=99).input_ids, 4))
    finally:
        for arm, s in servers.items():
            chk.step(f"stop {arm}", failures, s.stop)
        for arm, run in runs.items():
            run.update(plugin_stats=chk.read_stats(work, arm))
        text = summarize(work, rows, runs, failures, args)
        (work / "summary.txt").write_text(text + "\n")
        (work / "failures.json").write_text(json.dumps(failures, indent=1))
        print(text, flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
