"""The SGLang plugin on a real SGLang: correctness against SGLang's own verify, then decode step times.

Servers (one model, one GPU, started in parallel, measured one after another):

- ``stock``:    SGLang as shipped (the plugin is not on its path).
- ``upstream``: the plugin in mode ``upstream``: SGLang's own split-KV verify forced on (upstream it
  runs only on gfx95 with topk 1; it computes a causal draft block).
- ``plugin``:   the plugin in mode ``splitkv`` (specdiag's kernel), CUDA graphs as stock.
- ``check``:    the plugin with ``SPECDIAG_SGLANG_CHECK=1`` and decode CUDA graphs off: on every verify
  call inside SGLang it runs SGLang's own kernel and the plugin's on the same (real) inputs and records
  the relative error.

Steps, each in its own try/except (a failed step is logged and the rest goes on), under a wall-clock
budget: (a) check: a few requests on ``check``, the recorded errors must be <= 1e-2; (b) identity:
greedy outputs of ``plugin`` (and ``upstream``) against ``stock`` over short and long prompts, with a
stock-vs-stock repeat as the control; (c) sweep: specdiag.steps.baseline_sweep.sweep's measurement (the one notebook 01
runs) per context, the arms interleaved, into one run folder per arm. A table is printed last::

    python scripts/sglang_plugin_check.py --out /tmp/plugin-job --model-path /tmp/mla-model --budget-s 410
    # TP 2 on the two-GPU machine: identity and check only
    python scripts/sglang_plugin_check.py --out /tmp/tp2 --tp-size 2 --arms stock,plugin,check --contexts 1024
    # an fp8 e4m3 KV cache on every arm (the plugin's fp8 kernel up to 16 rows: 8 heads x 2 draft tokens here)
    python scripts/sglang_plugin_check.py --out /tmp/fp8 --kv-cache-dtype fp8_e4m3 --draft-tokens 2
    # dry run of the flow against the embedded server (no plugin there: the check step finds nothing)
    python scripts/sglang_plugin_check.py --engine embedded --device cpu --out /tmp/dry --contexts 256,512 \\
        --identity-short 3 --identity-long 1024 --max-new-tokens 8
"""

from __future__ import annotations

import argparse
import json
import signal
import statistics
import sys
import time
import traceback
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "lib"))

from specdiag.serving import SGLangClient  # noqa: E402
from specdiag.prompts import build_prompt  # noqa: E402
from specdiag.runs import Run  # noqa: E402
from specdiag.serving.redaction import redact  # noqa: E402

T0 = time.monotonic()
ARMS = {
    "stock": "SGLang as shipped (the plugin is not on its path)",
    "upstream": "SGLang's own split-KV verify forced on by the plugin (mode upstream; causal draft block)",
    "plugin": "specdiag's split-KV verify kernel via the plugin (mode splitkv), CUDA graphs as stock",
    "check": "the plugin with SPECDIAG_SGLANG_CHECK=1, decode CUDA graphs off: SGLang's kernel vs the plugin's per call",
}
MAX_REL_ERR = 1e-2


def log(msg: str) -> None:
    print(f"[plugin-job {time.monotonic() - T0:6.1f}s] {msg}", flush=True)


class Budget:
    def __init__(self, seconds: float) -> None:
        self.end = time.monotonic() + seconds

    def left(self) -> float:
        return self.end - time.monotonic()


def step(name: str, failures: list, fn: Callable[[], Any]) -> Any:
    log(f"--- {name}")
    try:
        return fn()
    except Exception as exc:  # noqa: BLE001 - logged, recorded, the job goes on
        log(f"FAILED {name}: {type(exc).__name__}: {exc}\n{traceback.format_exc()}")
        failures.append({"step": name, "error": f"{type(exc).__name__}: {exc}"})
        return None


def arm_env(arm: str, args: argparse.Namespace, work: Path) -> dict[str, str]:
    """Environment of one server: PYTHONPATH (SGLang first; the plugin only for plugin arms) and the mode."""
    from specdiag.launchers.sglang import plugin_env  # noqa: PLC0415

    mode = "off" if arm == "stock" else "upstream" if arm == "upstream" else "splitkv"
    env = plugin_env(mode, site=args.site, plugin_path=args.plugin_path, stats_dir=work / f"stats-{arm}")
    if arm == "check":
        env["SPECDIAG_SGLANG_CHECK"] = "1"
    return env


def make_server(arm: str, args: argparse.Namespace, work: Path):
    """A ManagedServer (not started) for one arm."""
    from specdiag.process import ManagedServer  # noqa: PLC0415

    log_path = work / f"server-{arm}.log"
    if args.engine == "embedded":
        def command(port: int) -> list[str]:
            return [sys.executable, "-m", "specdiag.localserver", "--host", "127.0.0.1", "--port", str(port),
                    "--model-path", args.model_path, "--context-length", str(args.context_length),
                    "--device", args.device, "--speculative-algorithm", "NGRAM",
                    "--speculative-num-draft-tokens", str(args.draft_tokens)]
        return ManagedServer(command, name=f"embedded ({arm})", ready_path="/health", log_path=log_path,
                             env=arm_env(arm, args, work), startup_timeout_s=args.startup_s, stop_grace_s=8, progress=False)
    from specdiag.launchers.sglang import SGLangLaunch, sglang_server  # noqa: PLC0415

    # A capped KV pool: SGLang sizes its pool from the free memory it sees (free now - free at start x
    # (1 - fraction)); servers starting together would race for it, a cap makes each take only this much.
    extra = ["--log-level", "info", "--max-total-tokens", str(args.max_total_tokens)]
    if args.tp_size > 1:
        # 0.5.17 auto-enables FlashInfer's TRT-LLM all-reduce fusion for DeepSeek-V3 at TP > 1 on SM90; its
        # SymmDeviceMemory workspaces hung every TP 2 start on the H200 hosts (NVLink multicast is off there);
        # its own custom all-reduce (v2) sets up symmetric memory too: both off, NCCL all-reduces instead.
        extra += ["--disable-custom-all-reduce", "--enforce-disable-flashinfer-allreduce-fusion"]
    if arm == "check":
        extra += ["--disable-decode-cuda-graph"]
    if args.kv_cache_dtype:  # every arm alike (stock included), so identity compares one cache dtype
        extra += ["--kv-cache-dtype", args.kv_cache_dtype]
    launch = SGLangLaunch(model_path=args.model_path, algorithm="NGRAM", num_draft_tokens=args.draft_tokens,
                          context_length=args.context_length, mem_fraction_static=args.mem_fraction,
                          tp_size=args.tp_size, extra_args=tuple(extra), env=arm_env(arm, args, work),
                          python=sys.executable)
    return sglang_server(launch, log_path=log_path, startup_timeout_s=args.startup_s, stop_grace_s=8, progress=False,
                         check=False)


def read_stats(work: Path, arm: str) -> list[dict[str, Any]]:
    folder = work / f"stats-{arm}"
    return [json.loads(p.read_text()) for p in sorted(folder.glob("stats-*.json"))] if folder.is_dir() else []


def tokenizer_of(client: SGLangClient) -> Callable[[str], list[int]]:
    return lambda text: client.tokenize(text, add_special_tokens=True)


def greedy(client: SGLangClient, ids: list[int], max_new_tokens: int) -> dict[str, Any]:
    client.flush_cache()
    trace = client.generate(input_ids=ids, sampling_params={"max_new_tokens": max_new_tokens, "temperature": 0.0,
                                                            "ignore_eos": True}, stream=False)
    return {"output_ids": list(trace.output_ids or []), "text": trace.text, "error": trace.error,
            "completion_tokens": trace.completion_tokens}


def check_step(clients: dict[str, SGLangClient], args: argparse.Namespace, work: Path) -> dict[str, Any]:
    """(a) requests on the check server; then its recorded per-call errors (SGLang's kernel vs the plugin's)."""
    client = clients["check"]
    for i, ctx in enumerate(args.check_contexts):
        prompt = build_prompt(tokenizer_of(client), ctx, "novel", seed=100 + i)
        res = greedy(client, prompt.input_ids, args.max_new_tokens)
        log(f"check request {ctx:,} tokens: {res['completion_tokens']} tokens, error {res['error']}")
    # the plugin writes its stats at most once a second, on a call: one more short request after a pause
    time.sleep(1.2)
    greedy(client, build_prompt(tokenizer_of(client), 64, "novel", seed=99).input_ids, 4)
    checks = [c for s in read_stats(work, "check") for c in s.get("check", [])]
    out = check_summary(checks)
    (work / "check.json").write_text(json.dumps(out, indent=1))
    log(f"check: {out['calls_compared']} verify calls compared inside SGLang, judged by {out['judged_by']}: max rel. "
        f"error {out['max_judged_err']}; vs SGLang's output max {out['max_rel_err']}, median {out['median_rel_err']}"
        + (f"; SGLang's own vs the exact reference max {out['max_sglang_rel_err_ref']}" if out["fp8_calls"] else "")
        + f"; longest prefix {out['max_prefix_tokens']}: {'PASSED' if out['passed'] else 'FAILED'}")
    return out


def check_summary(checks: list[dict[str, Any]]) -> dict[str, Any]:
    """The check server's recorded calls judged: on a bf16 cache against SGLang's output (``rel_err``); on an fp8 cache
    against the exact fp32 reference of the fp8 cache (``rel_err_ref``: SGLang's own kernel casts q and P to fp8, so it
    is reported beside, as ``sglang_rel_err_ref``, not used as the reference)."""
    fp8 = [c for c in checks if "rel_err_ref" in c]
    judged = [c.get("rel_err_ref", c["rel_err"]) for c in checks]
    errs = [c["rel_err"] for c in checks]
    return {"calls_compared": len(checks), "fp8_calls": len(fp8),
            "judged_by": ("the fp32 reference of the fp8 cache" if fp8 and len(fp8) == len(checks)
                          else "SGLang's output" if not fp8 else "each call's reference (mixed caches)"),
            "max_judged_err": max(judged) if judged else None,
            "max_rel_err": max(errs) if errs else None,
            "median_rel_err": statistics.median(errs) if errs else None,
            "max_sglang_rel_err_ref": max((c["sglang_rel_err_ref"] for c in fp8), default=None),
            "median_sglang_rel_err_ref": statistics.median([c["sglang_rel_err_ref"] for c in fp8]) if fp8 else None,
            "all_finite": all(c["finite"] for c in checks) if checks else None,
            "max_prefix_tokens": max((max(c["prefix_tokens"]) for c in checks), default=None),
            "threshold": MAX_REL_ERR,
            "passed": bool(checks) and max(judged) <= MAX_REL_ERR and all(c["finite"] for c in checks),
            "calls": checks[:400]}


def identity_step(clients: dict[str, SGLangClient], args: argparse.Namespace, work: Path, budget: Budget,
                  contexts: list[int], tag: str) -> list[dict[str, Any]]:
    """(b) greedy output ids of every arm against stock's, one prompt per context (seeded prose)."""
    rows = []
    arms = [a for a in ("plugin", "upstream") if a in clients]
    for i, ctx in enumerate(contexts):
        if budget.left() < 20 + ctx / 4000:
            log(f"identity: skipping {ctx:,} tokens ({budget.left():.0f} s left)")
            continue
        prompt = build_prompt(tokenizer_of(clients["stock"]), ctx, "novel", seed=i)
        ref = greedy(clients["stock"], prompt.input_ids, args.max_new_tokens)
        row: dict[str, Any] = {"set": tag, "context_tokens": ctx, "seed": i, "stock_error": ref["error"],
                               "stock_tokens": len(ref["output_ids"])}
        if tag == "short":  # control: the same server twice
            again = greedy(clients["stock"], prompt.input_ids, args.max_new_tokens)
            row["stock_repeat_identical"] = again["output_ids"] == ref["output_ids"]
        for arm in arms:
            res = greedy(clients[arm], prompt.input_ids, args.max_new_tokens)
            same = res["output_ids"] == ref["output_ids"] and not res["error"] and not ref["error"]
            first_diff = next((j for j, (x, y) in enumerate(zip(res["output_ids"], ref["output_ids"])) if x != y), None)
            row.update({f"{arm}_identical": same, f"{arm}_first_diff": first_diff, f"{arm}_error": res["error"]})
        rows.append(row)
        with open(work / "identity.jsonl", "a") as fh:
            fh.write(json.dumps(row) + "\n")
    ok = {arm: sum(bool(r.get(f"{arm}_identical")) for r in rows) for arm in arms}
    control = [r["stock_repeat_identical"] for r in rows if "stock_repeat_identical" in r]
    log(f"identity ({tag}): {len(rows)} prompts; identical to stock: {ok}"
        + (f"; stock repeat identical: {sum(control)}/{len(control)}" if control else ""))
    return rows


def snapshot(run: Run, client: SGLangClient, arm: str, args: argparse.Namespace, work: Path) -> None:
    info = redact(client.server_info())
    model_cfg_path = Path(args.model_path) / "config.json"
    run.update(server=info, model={"path": args.model_path, "name": Path(args.model_path).name,
                                   "model_config": json.loads(model_cfg_path.read_text())
                                   if model_cfg_path.exists() else None},
               arm={"name": arm, "description": ARMS[arm],
                    "env": {k: v for k, v in arm_env(arm, args, work).items() if k != "PYTHONPATH"}},
               params={"01_baseline_sweep": {"context_lengths": args.contexts, "max_new_tokens": args.max_new_tokens,
                                             "repeats": 1, "prompt_kind": "novel", "seed": 0, "flush_cache": True,
                                             "instruction": ""}})


def sweep_step(clients: dict[str, SGLangClient], runs: dict[str, Run], args: argparse.Namespace,
               budget: Budget) -> None:
    """(c) specdiag.steps.baseline_sweep.sweep's request per context, the arms interleaved (a cut budget leaves every arm's short contexts)."""
    from specdiag.steps.baseline_sweep.sweep import make_plan, measure_request  # noqa: PLC0415

    arms = [a for a in ("stock", "upstream", "plugin") if a in clients]
    info = clients["stock"].server_info()
    plan = make_plan(args.contexts, args.max_new_tokens, 1, "novel", 0, True,
                     server_context_length=info.get("context_length"))
    for request in plan.requests():
        c = int(request["context_tokens"])
        need = len(arms) * (4 + c / 12000)
        if budget.left() < need:
            log(f"sweep: skipping {c:,} tokens: {budget.left():.0f} s left, about {need:.0f} s needed")
            continue
        for arm in arms:
            row = measure_request(clients[arm], request, plan)
            runs[arm].append_row("sweep", row)
            log(f"sweep {arm:>8} {c:>7,}: step {row.get('step_ms')} ms, commit {row.get('commit_length')}, "
                f"ttft {row.get('ttft_s')} s, error {row.get('error')}")


def summary(work: Path, runs: dict[str, Run], results: dict[str, Any], failures: list) -> str:
    from specdiag.measure.sweep_table import latest_rows  # noqa: PLC0415

    lines = ["=== summary (measured on this call)"]
    steps: dict[str, dict[int, float]] = {}
    for arm, run in runs.items():
        steps[arm] = {int(r["context_tokens"]): r.get("step_ms") for r in latest_rows(run.rows("sweep"))
                      if not r.get("error")}
    ctxs = sorted({c for s in steps.values() for c in s})
    head = ["context"] + [f"{a} ms/step" for a in steps] + ["stock/plugin", "upstream/plugin"]
    lines.append(" | ".join(head))
    for c in ctxs:
        vals = [steps[a].get(c) for a in steps]
        st, up, pl = (steps.get(a, {}).get(c) for a in ("stock", "upstream", "plugin"))
        ratio = lambda a, b: f"{a / b:.1f}x" if a and b else "-"  # noqa: E731
        lines.append(" | ".join([f"{c:,}"] + [f"{v:.2f}" if v else "-" for v in vals]
                                + [ratio(st, pl), ratio(up, pl)]))
    pl, st, up = steps.get("plugin", {}), steps.get("stock", {}), steps.get("upstream", {})
    if pl:  # the targets, computed from the rows above
        top, low = max(pl), min(pl)
        if st.get(top):
            lines.append(f"target stock/plugin at {top:,} >= 10x: {st[top] / pl[top]:.1f}x "
                         f"({'met' if st[top] / pl[top] >= 10 else 'missed'})")
        lines.append(f"target plugin {top:,} / plugin {low:,} <= 2: {pl[top] / pl[low]:.2f} "
                     f"({'met' if pl[top] / pl[low] <= 2 else 'missed'})")
        both = [c for c in pl if up.get(c)]
        if both:
            slower = [c for c in both if pl[c] > up[c]]
            lines.append(f"target plugin <= upstream at every context: "
                         f"{'met' if not slower else 'missed at ' + ', '.join(f'{c:,}' for c in slower)}")
    chk = results.get("check") or {}
    lines.append(f"check (SGLang's verify vs the plugin's, inside SGLang): {chk.get('calls_compared')} calls, "
                 f"max rel. error {chk.get('max_rel_err')}, passed {chk.get('passed')} (judged by "
                 f"{chk.get('judged_by')}: max {chk.get('max_judged_err')})"
                 + (f"; fp8 calls {chk['fp8_calls']}, SGLang's own kernel vs the exact reference max "
                    f"{chk.get('max_sglang_rel_err_ref')}" if chk.get("fp8_calls") else ""))
    ident = results.get("identity") or []
    for arm in ("plugin", "upstream"):
        n = sum(1 for r in ident if f"{arm}_identical" in r)
        lines.append(f"identity {arm} vs stock: {sum(bool(r.get(f'{arm}_identical')) for r in ident)}/{n} prompts "
                     f"identical (short and long); stock repeat control: "
                     f"{sum(bool(r.get('stock_repeat_identical')) for r in ident if 'stock_repeat_identical' in r)}"
                     f"/{sum(1 for r in ident if 'stock_repeat_identical' in r)}")
    for arm in ARMS:
        for s in read_stats(work, arm):
            lines.append(f"plugin stats {arm} pid {s['pid']}: mode {s['mode']}, served {s['served']} "
                         f"(in capture {s['served_in_capture']}, by the Gluon kernel {s.get('served_gluon', 0)}; "
                         f"Gluon per shape {s.get('gluon', {})}), upstream served {s['upstream_served']} declined "
                         f"{s['upstream_declined']}, fallback {s['fallback']}")
    lines.append(f"failures: {failures or 'none'}")
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ints = lambda s: [int(x) for x in s.split(",") if x]  # noqa: E731
    p.add_argument("--out", required=True, help="work folder (run folders, logs, stats)")
    p.add_argument("--model-path", default="/tmp/mla-model")
    p.add_argument("--engine", choices=("sglang", "embedded"), default="sglang")
    p.add_argument("--device", default="cuda", help="embedded engine only")
    p.add_argument("--site", default="/tmp/site", help="SGLang's unpacked site folder ('' = none)")
    p.add_argument("--plugin-path", default="/tmp/plugin", help="where the plugin is installed (--target)")
    p.add_argument("--arms", default=",".join(ARMS))
    p.add_argument("--budget-s", type=float, default=470)
    p.add_argument("--startup-s", type=float, default=300)
    p.add_argument("--context-length", type=int, default=140000)
    p.add_argument("--mem-fraction", type=float, default=0.35)
    p.add_argument("--max-total-tokens", type=int, default=400000, help="KV pool cap per server, tokens")
    p.add_argument("--draft-tokens", type=int, default=8)
    p.add_argument("--tp-size", type=int, default=1, help="tensor-parallel GPUs per server (2 on nvidia-h200-x2: "
                   "every rank loads the plugin and sees its local heads)")
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.add_argument("--contexts", type=ints, default=[1024, 4096, 16384, 32768, 65536, 131072])
    p.add_argument("--check-contexts", type=ints, default=[1000, 20000, 100000])
    p.add_argument("--identity-short", type=int, default=20, help="short prompts (64..2,000 tokens)")
    p.add_argument("--identity-long", type=ints, default=[16384, 65536, 120000])
    p.add_argument("--kv-cache-dtype", default="", help="SGLang's --kv-cache-dtype for every arm (e.g. fp8_e4m3: "
                   "the plugin's fp8 kernel up to 16 rows); '' = SGLang's default (the model's dtype)")
    return p.parse_args(argv)


STOP_RESERVE_S = 40.0  # kept from the budget for stopping four servers and writing the summary


def _terminated(signum: int, frame: Any) -> None:
    raise SystemExit(f"stopped by signal {signum}")  # runs the finally block: servers stopped, summary written


def main(argv: list[str] | None = None) -> int:
    signal.signal(signal.SIGTERM, _terminated)
    args = parse_args(argv)
    work = Path(args.out)
    work.mkdir(parents=True, exist_ok=True)
    budget = Budget(args.budget_s - STOP_RESERVE_S)
    failures: list = []
    results: dict[str, Any] = {}
    arms = [a for a in args.arms.split(",") if a]
    servers = {arm: make_server(arm, args, work) for arm in arms}
    runs: dict[str, Run] = {}
    try:
        for arm, server in servers.items():  # all start at once; the GPU is shared
            step(f"start {arm}", failures, server.launch)
        for arm, server in servers.items():
            ok = step(f"ready {arm}", failures,
                      lambda s=server: s.wait_ready(timeout_s=max(10.0, budget.left() - 60)))
            log(f"{arm}: {'ready at ' + server.url if ok else 'NOT READY'}")
        clients = {arm: SGLangClient(s.url, timeout_s=300) for arm, s in servers.items() if s.running()}
        for arm in ("stock", "upstream", "plugin"):
            if arm in clients:
                runs[arm] = Run.create(work / f"run-{arm}", label=arm)
                step(f"snapshot {arm}", failures, lambda a=arm: snapshot(runs[a], clients[a], a, args, work))
        if "check" in clients:
            results["check"] = step("(a) check inside SGLang", failures, lambda: check_step(clients, args, work))
        results["identity"] = []
        if "stock" in clients:
            short = [64 + (1936 * i) // max(1, args.identity_short - 1) for i in range(args.identity_short)]
            results["identity"] += step("(b) identity, short", failures,
                                        lambda: identity_step(clients, args, work, budget, short, "short")) or []
            results["identity"] += step("(b) identity, long", failures,
                                        lambda: identity_step(clients, args, work, budget, args.identity_long,
                                                              "long")) or []
            step("(c) sweep", failures, lambda: sweep_step(clients, runs, args, budget))
    finally:
        for arm, server in servers.items():
            step(f"stop {arm}", failures, server.stop)
        text = summary(work, runs, results, failures)
        for arm, run in runs.items():
            run.update(plugin_stats=read_stats(work, arm), check=results.get("check") if arm == "plugin" else None)
        (work / "summary.txt").write_text(text + "\n")
        (work / "failures.json").write_text(json.dumps(failures, indent=1))
        print(text, flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
