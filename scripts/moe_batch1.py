"""11's reference run: one SGLang 0.5.17 server per tokens-per-verify-step T, one after another, each with the expert
distribution recorder and routed experts on, measured into one run folder 11 replays
(specdiag.steps.moe_batch1.measure: an untimed recorder pass, timed requests, one routed-experts request).

Each server (docs/moe-batch1.md has the flags and why):

    python -m sglang.launch_server --model-path MODEL --attention-backend triton --page-size 1 \\
      [--speculative-algorithm NGRAM --speculative-num-draft-tokens T]   # T >= 2; T = 1: no speculation
      --expert-distribution-recorder-mode per_pass --expert-distribution-recorder-buffer-size -1 \\
      --enable-return-routed-experts --max-total-tokens 100000 --context-length 32768 ...
    # environment: SGLANG_EXPERT_DISTRIBUTION_RECORDER_DIR=<work>/edr-T

A server that does not start with ``--enable-return-routed-experts`` is started again without it (said in run.json).

    python scripts/moe_batch1.py --out /tmp/moe-run --model-path /dev/shm/moe31 --site /tmp/site --tokens 1,2,4,8,16
    # a dry run of the flow on a CPU: embedded servers (dense: no recorder, no routed experts; the rows say so)
    python scripts/moe_batch1.py --engine embedded --out /tmp/moe-dry --tokens 1,4 --contexts 512 --recorder-contexts 256
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "lib"))

from specdiag.runs import Run, merge_command, merge_runs  # noqa: E402

T0 = time.monotonic()


def log(msg: str) -> None:
    print(f"[moe-batch1 {time.monotonic() - T0:6.1f}s] {msg}", flush=True)


def server_flags(t: int, args: argparse.Namespace, routed: bool) -> list[str]:
    """The SGLang flags beyond the launcher's defaults for one T (documented in docs/moe-batch1.md)."""
    flags = ["--log-level", "info", "--max-total-tokens", str(args.max_total_tokens),
             "--expert-distribution-recorder-mode", "per_pass", "--expert-distribution-recorder-buffer-size", "-1"]
    return flags + (["--enable-return-routed-experts"] if routed else [])


def make_server(t: int, args: argparse.Namespace, work: Path, routed: bool):
    from specdiag.launchers import ManagedServer  # noqa: PLC0415

    log_path = work / f"server-t{t}{'' if routed else '-norouted'}.log"
    edr = work / f"edr-t{t}"
    edr.mkdir(parents=True, exist_ok=True)
    if args.engine == "embedded":
        def command(port: int) -> list[str]:
            spec = ["--speculative-algorithm", "NGRAM", "--speculative-num-draft-tokens", str(t)] if t > 1 else []
            return [sys.executable, "-m", "specdiag.localserver", "--host", "127.0.0.1", "--port", str(port),
                    "--device", "cpu", *spec]
        return ManagedServer(command, name=f"embedded (T={t})", ready_path="/health", log_path=log_path,
                             startup_timeout_s=args.startup_s, stop_grace_s=8, progress=False), edr
    from specdiag.launchers.sglang import SGLangLaunch, plugin_env, sglang_server  # noqa: PLC0415

    launch = SGLangLaunch(model_path=args.model_path, algorithm="NGRAM" if t > 1 else "NONE",
                          num_draft_tokens=t if t > 1 else None, attention_backend="triton",
                          context_length=args.context_length, mem_fraction_static=args.mem_fraction,
                          extra_args=tuple(server_flags(t, args, routed)),
                          env={**plugin_env("off", site=args.site), "SGLANG_EXPERT_DISTRIBUTION_RECORDER_DIR": str(edr)},
                          python=sys.executable)
    return sglang_server(launch, log_path=log_path, startup_timeout_s=args.startup_s, stop_grace_s=8, progress=False,
                         check=False), edr


TABLES = ("moe_steps", "moe_dumps", "moe_routing")


def merge(dest: str, sources: list[str]) -> int:
    """Join the calls' run folders into ``dest`` (rows carry ``call``; their recorded files gzipped: 11 reads ``.gz``)."""
    out, _ = merge_runs(dest, sources, TABLES, label="moe-batch1", list_keys=("moe_servers",),
                        first_keys=("data_source", "moe_model_config", "moe_model_made_by", "device"), gzip_files=True)
    print(f"merged {len(sources)} run folders into {dest}: " + ", ".join(f"{len(out.rows(t))} {t} rows" for t in TABLES))
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["merge"]:
        return merge(*merge_command("moe_batch1.py", argv[1:]))
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="the run folder (created; rows appended, dumps under files/)")
    ap.add_argument("--work", default="", help="servers' logs and the recorder's folders (default: --out)")
    ap.add_argument("--engine", choices=["sglang", "embedded"], default="sglang")
    ap.add_argument("--model-path", default="")
    ap.add_argument("--tokens", default="1,2,4,8,16", help="tokens per verify step, one server each")
    ap.add_argument("--contexts", default="1024,16384", help="timed requests' prompt lengths")
    ap.add_argument("--recorder-contexts", default="1024", help="the untimed recorder pass's prompt lengths")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--max-total-tokens", type=int, default=100_000)
    ap.add_argument("--context-length", type=int, default=32768)
    ap.add_argument("--mem-fraction", type=float, default=0.85)
    ap.add_argument("--site", default="")
    ap.add_argument("--startup-s", type=float, default=400.0)
    ap.add_argument("--budget-s", type=float, default=480.0, help="start no server after this many seconds")
    ap.add_argument("--min-server-s", type=float, default=120.0)
    ap.add_argument("--no-routed", action="store_true", help="never ask for --enable-return-routed-experts")
    args = ap.parse_args(argv)
    if args.engine == "sglang" and not args.model_path:
        ap.error("--model-path is needed for SGLang")

    from specdiag.serving import reach  # noqa: PLC0415
    from specdiag.steps.moe_batch1 import measure as mm  # noqa: PLC0415

    run = Run.create(Path(args.out), label="moe-batch1")
    work = Path(args.work or args.out)
    work.mkdir(parents=True, exist_ok=True)
    config = None
    if args.model_path:
        cfg_path = Path(args.model_path) / "config.json"
        config = json.loads(cfg_path.read_text()) if cfg_path.exists() else None
        made = Path(args.model_path) / "MADE_BY.txt"
        run.update(moe_model_made_by=made.read_text() if made.exists() else None)
    from specdiag.hardware import nvidia_smi_gpu  # noqa: PLC0415

    run.update(data_source="measured", command=" ".join(sys.argv), moe_model_config=config,
               device=nvidia_smi_gpu() if args.engine == "sglang" else {"gpu": None, "source": "embedded (CPU)"})
    contexts = [int(c) for c in args.contexts.split(",")]
    rec_contexts = [int(c) for c in args.recorder_contexts.split(",")]
    servers: list[dict[str, Any]] = list(run.meta.get("moe_servers") or [])
    for t in [int(x) for x in args.tokens.split(",")]:
        left = args.budget_s - (time.monotonic() - T0)
        if left < args.min_server_s:
            servers.append({"tokens_per_step": t, "started": False, "why": f"budget: {left:.0f} s left"})
            log(f"T={t}: not started ({left:.0f} s of the budget left)")
            continue
        routed = not args.no_routed and args.engine == "sglang"
        server, edr = make_server(t, args, work, routed)
        info: dict[str, Any] = {"tokens_per_step": t, "routed_experts_flag": routed}
        try:
            t_start = time.monotonic()
            try:
                server.start()
            except Exception as exc:  # noqa: BLE001 - once more without the routed-experts flag
                if not routed:
                    raise
                log(f"T={t}: did not start with --enable-return-routed-experts ({type(exc).__name__}: "
                    f"{str(exc)[:300]}); again without it")
                info.update(routed_experts_flag=False, routed_experts_start_error=str(exc)[-2000:])
                server, edr = make_server(t, args, work, False)
                server.start()
            info.update(started=True, ready_after_s=round(time.monotonic() - t_start, 1), url=server.url)
            log(f"T={t}: ready after {info['ready_after_s']} s")
            client = reach(server.url)
            if args.engine == "sglang":
                info["flags"] = server_flags(t, args, bool(info["routed_experts_flag"]))
                mm.recorder_pass(client, run, str(edr), rec_contexts, args.max_new_tokens, progress=log)
            mm.timed_requests(client, run, contexts, args.max_new_tokens, args.repeats, progress=log)
            row = mm.routed_request(client, run, rec_contexts[0], args.max_new_tokens, config)
            log(f"T={t}: routed experts: " + (row.get("error") or f"{row.get('rows')} rows, match {row.get('rows_match')}"))
        except Exception as exc:  # noqa: BLE001 - recorded; the next T still runs
            info.update(started=info.get("started", False), error=f"{type(exc).__name__}: {str(exc)[-1500:]}")
            log(f"T={t}: FAILED: {info['error'][:400]}")
        finally:
            server.stop()
        servers.append(info)
        run.update(moe_servers=servers)
    run.update(moe_servers=servers)
    log(f"done: {len(run.rows(mm.STEPS_TABLE))} timed requests, {len(run.rows(mm.DUMPS_TABLE))} recorder passes in {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
