"""Engine arms side by side on one GPU, in one call: SGLang servers started together, prefilled side by side, then
decoded one arm at a time on their cached prompts (specdiag.steps.engine_ab.measure), into one run folder that 09
replays.

Arms (each a server with its own flags and environment; ``--arms`` picks):

- ``triton``: SGLang's Triton backend as shipped (the plugin off);
- ``triton_plugin``: the Triton backend with the specdiag plugin's verify kernel (``SGLANG_PLUGINS=specdiag_splitkv``);
- ``flashinfer``: the FlashInfer backend for everything;
- ``fi_prefill_plugin``: FlashInfer's prefill, the Triton backend for decode and verify with the plugin
  (``--prefill-attention-backend flashinfer --speculative-attention-mode decode``);
- ``triton_upstream``: the Triton backend with SGLang's own split-KV verify forced on (the plugin in mode upstream).

    python scripts/engine_ab.py --out /tmp/engine-ab --model-path /tmp/mla61 --contexts 1024,16384,65536,131072 \\
        --site /tmp/site --plugin-path /tmp/plugin --budget-s 480
    # a dry run of the flow on a CPU: two embedded servers as arms
    python scripts/engine_ab.py --engine embedded --out /tmp/eab --contexts 256,1024 --arms a,b --budget-s 120

Prefills run side by side (one thread per arm, each as soon as its server answers): their TTFTs carry ``concurrent``
(how many arms were prefilling then), and where that is over one the TTFT is not the arm's own. Then each arm's
decode on its cached prompts, one arm at a time; then, while the budget lasts, clean prefills of the arms alone at
``--clean-contexts`` (``phase`` "prefill", ``concurrent`` 1). Rows are appended as they are measured; a cut budget
leaves what was measured, and the run says what was not.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "lib"))

from specdiag.runs import Run  # noqa: E402
from specdiag.serving.redaction import redact  # noqa: E402

T0 = time.monotonic()
ARM_LOCK = threading.Lock()
ARMS: dict[str, dict[str, Any]] = {
    "triton": {"what": "SGLang's Triton backend as shipped", "backend": "triton", "extra": [], "plugin": None},
    "triton_plugin": {"what": "Triton backend + the specdiag plugin's split-KV verify kernel", "backend": "triton",
                      "extra": [], "plugin": "splitkv"},
    "flashinfer": {"what": "FlashInfer backend (prefill, decode and verify)", "backend": "flashinfer", "extra": [],
                   "plugin": None},
    "fi_prefill_plugin": {"what": "FlashInfer prefill; Triton decode and verify with the plugin", "backend": "triton",
                          "extra": ["--prefill-attention-backend", "flashinfer", "--speculative-attention-mode",
                                    "decode"], "plugin": "splitkv"},
    "triton_upstream": {"what": "Triton backend with SGLang's own split-KV verify forced on", "backend": "triton",
                        "extra": [], "plugin": "upstream"},
}


def update_arm(run: Run, arm: str, **fields: Any) -> None:
    """Add ``fields`` to run.json ``arms[arm]``, keeping what it holds (``run.update`` merges one level deep: passing
    ``arms={arm: {...}}`` would replace the arm's record)."""
    with ARM_LOCK:
        arms = dict(run.meta.get("arms") or {})
        run.update(arms={**arms, arm: {**dict(arms.get(arm) or {}), **fields}})


def record_device(run: Run, server_url: str) -> None:
    """run.json ``device`` (the GPU as nvidia-smi names it) and ``hardware`` (the run's peaks, specdiag.hardware:
    09's prefill floor reads them)."""
    import subprocess  # noqa: PLC0415

    from specdiag import hardware  # noqa: PLC0415

    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30).stdout.splitlines()
        name, driver, mem = [x.strip() for x in out[0].split(",")]
        run.update(device={"gpu": name, "driver": driver, "memory_total": mem, "source": "nvidia-smi"})
    except Exception as exc:  # noqa: BLE001 - no GPU (a dry run on a CPU): say so
        run.update(device={"gpu": None, "source": f"nvidia-smi failed: {exc}"[:200]})
    try:
        hardware.run_peaks(run, server_url=server_url)
    except Exception as exc:  # noqa: BLE001
        log(f"no peaks recorded: {exc}")


def log(msg: str) -> None:
    print(f"[engine-ab {time.monotonic() - T0:6.1f}s] {msg}", flush=True)


def arm_env(arm: str, args: argparse.Namespace, work: Path) -> dict[str, str]:
    spec = ARMS.get(arm, {"plugin": None})
    paths = [p for p in (args.site, args.plugin_path if spec["plugin"] else None, str(ROOT / "lib")) if p]
    env = {"PYTHONPATH": os.pathsep.join(paths), "FLASHINFER_WORKSPACE_BASE": args.flashinfer_ws}
    if spec["plugin"]:
        env.update(SGLANG_PLUGINS="specdiag_splitkv", SPECDIAG_SGLANG_VERIFY=spec["plugin"],
                   SPECDIAG_SGLANG_STATS=str(work / f"stats-{arm}"))
    else:
        env["SPECDIAG_SGLANG_VERIFY"] = "off"  # installed plugins load by default in SGLang 0.5.17: off, said so
    return env


def make_server(arm: str, args: argparse.Namespace, work: Path, mem_fraction: float | None = None):
    from specdiag.launchers import ManagedServer  # noqa: PLC0415

    log_path = work / f"server-{arm}.log"
    if args.engine == "embedded":
        def command(port: int) -> list[str]:
            return [sys.executable, "-m", "specdiag.localserver", "--host", "127.0.0.1", "--port", str(port),
                    "--speculative-algorithm", "NGRAM", "--speculative-num-draft-tokens", str(args.draft_tokens)]
        return ManagedServer(command, name=f"embedded ({arm})", ready_path="/health", log_path=log_path,
                             env=arm_env(arm, args, work), startup_timeout_s=args.startup_s, stop_grace_s=8,
                             progress=False)
    from specdiag.launchers.sglang import SGLangLaunch, sglang_server  # noqa: PLC0415

    spec = ARMS[arm]
    launch = SGLangLaunch(model_path=args.model_path, algorithm="NGRAM", num_draft_tokens=args.draft_tokens,
                          attention_backend=spec["backend"], context_length=args.context_length,
                          mem_fraction_static=mem_fraction or args.mem_fraction,
                          extra_args=("--log-level", "info", "--max-total-tokens", str(args.max_total_tokens),
                                      *spec["extra"]),
                          env=arm_env(arm, args, work), python=sys.executable)
    return sglang_server(launch, log_path=log_path, startup_timeout_s=args.startup_s, stop_grace_s=8, progress=False,
                         check=False)


class Prefills:
    """How many arms are prefilling now (a counter the prefill threads share)."""

    def __init__(self) -> None:
        self.lock, self.n = threading.Lock(), 0

    def __enter__(self) -> int:
        with self.lock:
            self.n += 1
            return self.n

    def __exit__(self, *exc: Any) -> None:
        with self.lock:
            self.n -= 1


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--engine", choices=["sglang", "embedded"], default="sglang")
    ap.add_argument("--model-path", default="")
    ap.add_argument("--arms", default="triton,triton_plugin,flashinfer,fi_prefill_plugin,triton_upstream")
    ap.add_argument("--contexts", default="1024,16384,65536,131072")
    ap.add_argument("--clean-contexts", default="", help="contexts prefilled again, each arm alone (clean TTFT)")
    ap.add_argument("--repeats", type=int, default=5, help="decode requests per context on the cached prompt")
    ap.add_argument("--slow-repeats", type=int, default=3,
                    help="decode requests at a context where the arm's first took over --slow-step-ms per step "
                         "(those ask for half of --max-new-tokens)")
    ap.add_argument("--slow-step-ms", type=float, default=200.0)
    ap.add_argument("--max-new-tokens", type=int, default=16)
    ap.add_argument("--draft-tokens", type=int, default=8)
    ap.add_argument("--context-length", type=int, default=140000)
    ap.add_argument("--max-total-tokens", type=int, default=300000)
    ap.add_argument("--mem-fraction", type=float, default=0.16)
    ap.add_argument("--mem-fractions", default="",
                    help="per arm in start order (SGLang sizes a pool from the memory free when it starts: servers "
                         "started one after another each get a share of what the earlier ones left)")
    ap.add_argument("--stagger-pattern", default="KV Cache is allocated",
                    help="start the next server once the last one's log shows this (its pool is sized); '' starts "
                         "them all at once")
    ap.add_argument("--stagger-max-s", type=float, default=120.0)
    ap.add_argument("--site", default="")
    ap.add_argument("--plugin-path", default="")
    ap.add_argument("--flashinfer-ws", default="/tmp/fi-ws")
    ap.add_argument("--startup-s", type=float, default=300.0)
    ap.add_argument("--budget-s", type=float, default=480.0)
    args = ap.parse_args(argv)
    end = T0 + args.budget_s
    arms = [a.strip() for a in args.arms.split(",") if a.strip()]
    bad = [a for a in arms if args.engine == "sglang" and a not in ARMS]
    if bad:
        ap.error(f"unknown arm(s) {bad}; choose from {', '.join(ARMS)}")
    contexts = [int(c) for c in args.contexts.split(",") if c.strip()]
    clean = [int(c) for c in args.clean_contexts.split(",") if c.strip()]
    work = Path(args.out)
    work.mkdir(parents=True, exist_ok=True)
    run = Run.create(work, label="engine-ab")
    cfg_path = Path(args.model_path) / "config.json" if args.model_path else None
    run.update(kind="engine_ab", command=" ".join(["python", "scripts/engine_ab.py", *(argv or sys.argv[1:])]),
               model={"path": args.model_path, "model_config": json.loads(cfg_path.read_text())
                      if cfg_path and cfg_path.exists() else None},
               params={"09_engine_ab": {"contexts": contexts, "clean_contexts": clean, "repeats": args.repeats,
                                        "max_new_tokens": args.max_new_tokens, "draft_tokens": args.draft_tokens}},
               arms={a: {"what": ARMS.get(a, {}).get("what", a), "plugin": ARMS.get(a, {}).get("plugin"),
                         "env": {k: v for k, v in arm_env(a, args, work).items() if k not in ("PYTHONPATH",)}}
                     for a in arms})
    record_device(run, "http://127.0.0.1")  # the servers run here
    from specdiag.launchers.process import redacted_command  # noqa: PLC0415
    from specdiag.serving import make_client  # noqa: PLC0415
    from specdiag.steps.engine_ab.measure import decode_all, prefill_all  # noqa: PLC0415

    fractions = [float(f) for f in args.mem_fractions.split(",") if f.strip()]
    servers = {a: make_server(a, args, work, fractions[i] if i < len(fractions) else None)
               for i, a in enumerate(arms)}
    for a, srv in servers.items():
        srv.launch()
        log(f"{a}: starting")
        t_start = time.monotonic()
        while args.stagger_pattern and a != arms[-1] and time.monotonic() - t_start < args.stagger_max_s:
            text = (work / f"server-{a}.log").read_text(errors="replace") if (work / f"server-{a}.log").exists() else ""
            if args.stagger_pattern in text or not srv.running:
                break
            time.sleep(1.0)
        update_arm(run, a, started_after_s=round(t_start - T0, 1))
    clients: dict[str, Any] = {}
    prompts: dict[str, dict[int, list[int]]] = {}
    busy = Prefills()

    def prefill(arm: str) -> None:
        try:
            servers[arm].wait_ready()
            clients[arm] = make_client(servers[arm].url)
            info = redact(clients[arm].server_info()) if hasattr(clients[arm], "server_info") else {}
            update_arm(run, arm, ready_after_s=servers[arm].ready_after_s, server=info,
                       command=redacted_command(servers[arm].command))
            log(f"{arm}: ready after {servers[arm].ready_after_s:.0f} s")
            out: dict[int, list[int]] = {}
            for ctx in contexts:
                with busy as n:
                    out.update(prefill_all(run, clients[arm], arm, [ctx], concurrent=n, deadline_s=end - 60,
                                           progress=log))
            prompts[arm] = out
        except Exception as exc:  # noqa: BLE001 - this arm fails, the others go on
            log(f"{arm}: FAILED {type(exc).__name__}: {exc}")
            update_arm(run, arm, failed=f"{type(exc).__name__}: {exc}"[:500])

    threads = [threading.Thread(target=prefill, args=(a,), daemon=True) for a in arms]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=max(1.0, end - 30 - time.monotonic()))
    for arm in arms:  # decode one arm at a time; an arm slower than --slow-step-ms at a context gets fewer, shorter
        for ctx, ids in sorted(prompts.get(arm, {}).items()):  # requests there
            first = decode_all(run, clients[arm], arm, {ctx: ids}, 1, args.max_new_tokens, deadline_s=end - 20,
                               progress=log)
            slow = bool(first and (first[0].get("step_ms") or 0) > args.slow_step_ms)
            decode_all(run, clients[arm], arm, {ctx: ids}, (args.slow_repeats if slow else args.repeats) - 1,
                       args.max_new_tokens // 2 if slow else args.max_new_tokens, deadline_s=end - 20,
                       progress=log, first_repeat=1)
    for ctx in clean:
        for arm in arms:
            if arm in clients and time.monotonic() < end - 60:
                prefill_all(run, clients[arm], arm, [ctx], seed=1, concurrent=1, deadline_s=end - 60, progress=log)
    for arm, s in servers.items():
        try:
            s.stop()
        except Exception as exc:  # noqa: BLE001
            log(f"{arm}: stop failed: {exc}")
    stats = {}
    for arm in arms:
        folder = work / f"stats-{arm}"
        if folder.is_dir():
            stats[arm] = [json.loads(p.read_text()) for p in sorted(folder.glob("stats-*.json"))]
    run.update(plugin_stats={a: [{k: v for k, v in s.items() if k not in ("check",)} for s in v]
                             for a, v in stats.items()},
               finished_after_s=round(time.monotonic() - T0, 1))
    rows = run.rows("engine_ab")
    log(f"done: {len(rows)} rows, {sum(1 for r in rows if r.get('error'))} with an error")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
