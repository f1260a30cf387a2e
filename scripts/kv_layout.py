"""10's reference run: per arm, one SGLang server after another (each sizes its own pool), a long request on a
flushed pool and on a pool the filler fragmented (specdiag.steps.kv_layout.measure), into one run folder 10 replays.

Arms (``--arms`` picks; every server runs with ``--page-size 1 --disable-radix-cache``, NGRAM with
``--draft-tokens`` tokens per verify step, ``--max-total-tokens`` slots, and the plugin on its path with
``SPECDIAG_SGLANG_LAYOUT=1``, so every arm reports its requests' layout to ``stats-<arm>/``):

- ``triton``: SGLang's Triton backend (the plugin's verify kernel off: ``SPECDIAG_SGLANG_VERIFY=off``);
- ``plugin``: the Triton backend with the plugin's split-KV verify kernel (``SPECDIAG_SGLANG_VERIFY=splitkv``);
- ``flashinfer``: the FlashInfer backend;
- ``<arm>_contiguous`` (``triton_contiguous``, ``plugin_contiguous``, ``flashinfer_contiguous``): the same server with
  the plugin's contiguous KV allocator (``SPECDIAG_SGLANG_KV_ALLOC=contiguous``); 10 pairs it with ``<arm>``: fresh,
  scattered by the filler with SGLang's allocator, and the same traffic with the contiguous one.

    python scripts/kv_layout.py --out /tmp/kvl --model-path /tmp/mla4 --site /tmp/site --plugin-path /tmp/plugin \\
        --arms triton,plugin --contexts 32768,131072 --max-total-tokens 200000 --budget-s 540
    python scripts/kv_layout.py --out /tmp/kvl --model-path /tmp/mla4 --site /tmp/site --plugin-path /tmp/plugin \
        --arms plugin,plugin_contiguous --contexts 131072 --repeats 3 --max-total-tokens 200000 --budget-s 540
    # a dry run of the flow on a CPU: embedded servers as arms (their own slot pools; no plugin); an arm whose name
    # ends in _contiguous runs with --kv-alloc contiguous
    python scripts/kv_layout.py --engine embedded --out /tmp/kvl --arms embedded,embedded_contiguous \
        --contexts 1024 --max-total-tokens 4096
    # two calls' run folders into one (the rows appended, the arms' facts joined)
    python scripts/kv_layout.py merge --out /tmp/kvl-all /tmp/call1/kv-layout /tmp/call2/kv-layout

A cut budget keeps every row measured; an arm not reached is named in run.json (``kv_layout_not_run``).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "lib"))

from specdiag.runs import Run, merge_command, merge_runs  # noqa: E402

T0 = time.monotonic()
BASE_ARMS: dict[str, dict[str, Any]] = {
    "triton": {"backend": "triton", "verify": "off", "extra": []},
    "plugin": {"backend": "triton", "verify": "splitkv", "extra": []},
    "flashinfer": {"backend": "flashinfer", "verify": "off", "extra": []},
}
CONTIGUOUS = "_contiguous"  # specdiag.steps.kv_layout.analysis.CONTIGUOUS_SUFFIX: 10 pairs <arm> with <arm>_contiguous
ARMS: dict[str, dict[str, Any]] = {
    **{name: {**spec, "kv_alloc": "sglang"} for name, spec in BASE_ARMS.items()},
    **{name + CONTIGUOUS: {**spec, "kv_alloc": "contiguous"} for name, spec in BASE_ARMS.items()},
}


def kv_alloc_of(arm: str) -> str:
    """The KV slot allocator of an arm: ``contiguous`` for a name ending in _contiguous (either engine)."""
    return "contiguous" if arm.endswith(CONTIGUOUS) else "sglang"


def log(msg: str) -> None:
    print(f"[kv-layout {time.monotonic() - T0:6.1f}s] {msg}", flush=True)


def work_dir(args: argparse.Namespace) -> Path:
    """Where the servers' logs and the plugin's stats files go (``--work``, default the run folder)."""
    w = Path(args.work or args.out)
    w.mkdir(parents=True, exist_ok=True)
    return w


def arm_env(arm: str, args: argparse.Namespace, work: Path) -> dict[str, str]:
    """The plugin stays on the path in every arm: its kernel off, it still records the layout each verify reads."""
    from specdiag.launchers.sglang import plugin_env  # noqa: PLC0415

    return {**plugin_env(ARMS.get(arm, {"verify": "off"})["verify"], site=args.site, plugin_path=args.plugin_path,
                         stats_dir=work / f"stats-{arm}", plugin_on_path=True, kv_alloc=kv_alloc_of(arm)),
            "SPECDIAG_SGLANG_LAYOUT": "1", "FLASHINFER_WORKSPACE_BASE": args.flashinfer_ws}


def make_server(arm: str, args: argparse.Namespace, work: Path):
    from specdiag.launchers import ManagedServer  # noqa: PLC0415

    log_path = work / f"server-{arm}.log"
    if args.engine == "embedded":
        def command(port: int) -> list[str]:
            return [sys.executable, "-m", "specdiag.localserver", "--host", "127.0.0.1", "--port", str(port),
                    "--speculative-algorithm", "STANDALONE", "--speculative-num-draft-tokens", str(args.draft_tokens),
                    "--max-total-tokens", str(args.max_total_tokens), "--device", "cpu",
                    "--kv-alloc", kv_alloc_of(arm)]
        return ManagedServer(command, name=f"embedded ({arm})", ready_path="/health", log_path=log_path,
                             startup_timeout_s=args.startup_s, stop_grace_s=8, progress=False)
    from specdiag.launchers.sglang import SGLangLaunch, sglang_server  # noqa: PLC0415

    spec = ARMS[arm]
    launch = SGLangLaunch(model_path=args.model_path, algorithm="NGRAM", num_draft_tokens=args.draft_tokens,
                          attention_backend=spec["backend"], context_length=args.context_length,
                          mem_fraction_static=args.mem_fraction,
                          extra_args=("--log-level", "info", "--max-total-tokens", str(args.max_total_tokens),
                                      "--disable-radix-cache", *spec["extra"]),
                          env=arm_env(arm, args, work), python=sys.executable)
    return sglang_server(launch, log_path=log_path, startup_timeout_s=args.startup_s, stop_grace_s=8, progress=False,
                         check=False)


def run_arms(args: argparse.Namespace) -> int:
    from specdiag.steps.kv_layout.filler import FillerPlan  # noqa: PLC0415
    from specdiag.steps.kv_layout.measure import ARM_TEXT, Arm, LayoutPlan, measure_arm, server_pool  # noqa: PLC0415
    from specdiag.serving import reach  # noqa: PLC0415

    work = work_dir(args)
    run = Run.create(Path(args.out), label="kv-layout")
    run.update(data_source="measured", command=" ".join(sys.argv),
               kv_layout_plan={"contexts": args.contexts, "max_new_tokens": args.max_new_tokens,
                               "repeats": args.repeats, "max_total_tokens": args.max_total_tokens,
                               "filler_concurrency": args.filler_concurrency, "filler_cycles": args.filler_cycles,
                               "states": args.states, "draft_tokens": args.draft_tokens})
    states = tuple(x.strip() for x in args.states.split(",") if x.strip())
    if not states or set(states) - {"fresh", "fragmented"}:
        raise SystemExit(f"--states takes fresh and/or fragmented, in the order to measure; got {args.states!r}")
    plan = LayoutPlan(contexts=tuple(int(c) for c in args.contexts.split(",")), max_new_tokens=args.max_new_tokens,
                      repeats=args.repeats, states=states, filler=FillerPlan(cycles=args.filler_cycles,
                                                              concurrency=args.filler_concurrency,
                                                              max_seconds=args.filler_max_s))
    arms = [a.strip() for a in args.arms.split(",") if a.strip()]
    facts = list(run.meta.get("kv_layout_arms") or [])
    not_run = []
    for arm in arms:
        left = args.budget_s - (time.monotonic() - T0)
        if left < args.min_arm_s:
            not_run.append({"arm": arm, "why": f"budget: {left:.0f} s left"})
            log(f"{arm}: not started ({left:.0f} s of the budget left)")
            continue
        server = make_server(arm, args, work)
        try:
            t = time.monotonic()
            server.start()
            log(f"{arm}: ready after {time.monotonic() - t:.0f} s at {server.url}")
            client = reach(server.url)
            facts.append({"arm": arm, "url": server.url, "what": ARM_TEXT.get(arm, ""), **server_pool(client),
                          "kv_alloc": kv_alloc_of(arm),
                          "layout_source": f"plugin records (stats-{arm}/)" if args.engine == "sglang"
                          else "server-reported (meta_info.kv_layout)", "ready_after_s": round(time.monotonic() - t, 1)})
            run.update(kv_layout_arms=facts)
            layout_dir = str(work / f"stats-{arm}") if args.engine == "sglang" else ""
            measure_arm(run, Arm(arm, server.url, layout_dir), plan, progress=log)
        except Exception as exc:  # noqa: BLE001 - recorded; the next arm still runs
            log(f"{arm}: FAILED: {type(exc).__name__}: {exc}")
            run.append_row("kv_layout", {"arm": arm, "pool_state": None, "error": f"{type(exc).__name__}: {exc}",
                                         "ts_unix_s": time.time()})
        finally:
            server.stop()
    run.update(kv_layout_not_run=not_run)
    log(f"done: {len(run.rows('kv_layout'))} rows in {args.out}")
    return 0


def merge(dest: str, sources: list[str]) -> int:
    """Join the calls' run folders into ``dest``: kv_layout rows and arm facts carry ``call``; each call's plan is kept."""
    out, calls = merge_runs(dest, sources, ("kv_layout",), label="kv-layout", list_keys=("kv_layout_arms",),
                            first_keys=("data_source", "kv_layout_plan", "device"))
    plans = list(out.meta.get("kv_layout_plans") or [])
    plans += [{"call": call, **dict(run.meta.get("kv_layout_plan") or {}), "command": run.meta.get("command")}
              for call, run in calls]
    out.update(kv_layout_plans=plans)
    print(f"merged {len(sources)} run folders into {dest}: {len(out.rows('kv_layout'))} rows")
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["merge"]:
        return merge(*merge_command("kv_layout.py", argv[1:]))
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="the run folder (created; rows appended)")
    ap.add_argument("--work", default="", help="servers' logs and the plugin's stats files (default: --out)")
    ap.add_argument("--engine", choices=["sglang", "embedded"], default="sglang")
    ap.add_argument("--model-path", default="")
    ap.add_argument("--arms", default="triton,plugin,flashinfer")
    ap.add_argument("--contexts", default="32768,131072")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--draft-tokens", type=int, default=8)
    ap.add_argument("--max-total-tokens", type=int, default=200_000, help="KV pool slots of each server")
    ap.add_argument("--context-length", type=int, default=140_000)
    ap.add_argument("--mem-fraction", type=float, default=0.6)
    ap.add_argument("--states", default="fresh,fragmented", help="pool states to measure, in this order")
    ap.add_argument("--filler-cycles", type=float, default=1.1)
    ap.add_argument("--filler-concurrency", type=int, default=8)
    ap.add_argument("--filler-max-s", type=float, default=240.0)
    ap.add_argument("--site", default="", help="SGLang's site folder (put first on the servers' PYTHONPATH)")
    ap.add_argument("--plugin-path", default="", help="the installed plugin (the layout recorder is in it)")
    ap.add_argument("--flashinfer-ws", default="/tmp/flashinfer-ws")
    ap.add_argument("--startup-s", type=float, default=400.0)
    ap.add_argument("--budget-s", type=float, default=540.0, help="start no arm after this many seconds")
    ap.add_argument("--min-arm-s", type=float, default=150.0, help="start an arm only with this much budget left")
    args = ap.parse_args(argv)
    if args.engine == "sglang" and not args.model_path:
        ap.error("--model-path is needed for SGLang")
    unknown = [a for a in args.arms.split(",") if a and args.engine == "sglang" and a not in ARMS]
    if unknown:
        ap.error(f"unknown arms {unknown}: choose from {', '.join(ARMS)}")
    return run_arms(args)


if __name__ == "__main__":
    sys.exit(main())
