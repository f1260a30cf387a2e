"""Engine arms on one GPU, in one call: SGLang servers started one after another, then measured one arm at a time
(specdiag.steps.engine_ab.measure), into one run folder that 09 replays; ``merge`` joins the folders of several calls
into one run.

Arms (each a server with its own flags and environment; ``--arms`` picks, in the order they are measured):

- ``triton``: SGLang's Triton backend as shipped (the plugin off);
- ``triton_plugin``: the Triton backend with the specdiag plugin's verify kernel (``SGLANG_PLUGINS=specdiag_splitkv``);
- ``flashinfer``: the FlashInfer backend for everything;
- ``fi_prefill_plugin``: FlashInfer's prefill, the Triton backend for decode and verify with the plugin
  (``--prefill-attention-backend flashinfer --speculative-attention-mode decode``);
- ``triton_upstream``: the Triton backend with SGLang's own split-KV verify forced on (the plugin in mode upstream);
- ``fi_prefill_upstream``: FlashInfer's prefill, the Triton backend for decode and verify with SGLang's own split-KV
  verify forced on (the hybrid of ``fi_prefill_plugin`` with upstream's kernel in the plugin's place);
- ``triton_plugin_check``: ``triton_plugin`` with ``SPECDIAG_SGLANG_CHECK=1`` and CUDA graphs off: every verify call
  runs SGLang's own kernel and the plugin's on the same inputs; their relative errors are summarized in run.json
  (``plugin_check``);
- ``triton_nospec`` / ``flashinfer_nospec``: the same backends with speculation off (``--speculative-algorithm``
  unset): plain decode, one token per target forward, the speculation-off twin of the arms above.

The drafter (``--algorithm``): NGRAM (default, ``--draft-tokens`` per verify step) or DFLASH (``--draft-model-path``, a
DFlash drafter folder, e.g. data/models/make_dflash_drafter.py; ``--block-size`` tokens per verify block,
``--draft-window`` the drafter's window of target tokens, 0 = none). ``--simulate-acc-len`` sets SGLang's
``SGLANG_SIMULATE_ACC_LEN`` (a forced mean acceptance length) on the speculating arms: random weights commit about
1 token per step, so a timing run at a realistic commit sets it, and run.json says so.

    python scripts/engine_ab.py --out /tmp/engine-ab --model-path /tmp/mla61 --site /tmp/site --plugin-path /tmp/plugin \\
        --arms flashinfer,triton --contexts 1024,4096,16384,32768,65536,131072,185000 --budget-s 480
    python scripts/engine_ab.py merge --out data/reference/RUN /tmp/call2/engine-ab /tmp/call3/engine-ab
    # a dry run of the flow on a CPU: two embedded servers as arms
    python scripts/engine_ab.py --engine embedded --out /tmp/eab --contexts 256,1024 --arms a,b --budget-s 120

Every server is started (each once the one before it has sized its KV pool: SGLang sizes a pool from the memory free
when it starts) and ready before anything is measured; then each arm alone, context by context: the prefix cache
emptied, the prompt prefilled (its TTFT, ``concurrent`` 1), then decode requests on the cached prompt
(specdiag.steps.engine_ab.measure.measure_arm: a slow arm gets fewer, shorter requests at depth, and a context whose
prefill is predicted to outlast the budget is not started; the run says so in ``not_run``). No request of one arm
shares the GPU with another's. Rows are appended as they are measured:
a cut call keeps what it measured.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "lib"))

from specdiag.runs import Run  # noqa: E402
from specdiag.serving.redaction import redact  # noqa: E402

T0 = time.monotonic()
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
    "fi_prefill_upstream": {"what": "FlashInfer prefill; Triton decode and verify with SGLang's own split-KV verify "
                                    "forced on", "backend": "triton",
                            "extra": ["--prefill-attention-backend", "flashinfer", "--speculative-attention-mode",
                                      "decode"], "plugin": "upstream"},
    "triton_plugin_check": {"what": "Triton backend + the plugin, each verify call checked against SGLang's kernel "
                                    "(CUDA graphs off)", "backend": "triton", "extra": ["--disable-cuda-graph"],
                            "plugin": "splitkv", "env": {"SPECDIAG_SGLANG_CHECK": "1"}},
    "triton_nospec": {"what": "SGLang's Triton backend, speculation off", "backend": "triton", "extra": [],
                      "plugin": None, "spec": False},
    "flashinfer_nospec": {"what": "FlashInfer backend, speculation off", "backend": "flashinfer", "extra": [],
                          "plugin": None, "spec": False},
}


def update_arm(run: Run, arm: str, **fields: Any) -> None:
    """Add ``fields`` to run.json ``arms[arm]``, keeping what it holds (``run.update`` merges one level deep: passing
    ``arms={arm: {...}}`` would replace the arm's record)."""
    arms = dict(run.meta.get("arms") or {})
    run.update(arms={**arms, arm: {**dict(arms.get(arm) or {}), **fields}})


def record_device(run: Run, server_url: str) -> None:
    """run.json ``device`` (the GPU as nvidia-smi names it) and ``hardware`` (the run's peaks, specdiag.hardware:
    09's prefill floor reads them)."""
    from specdiag import hardware  # noqa: PLC0415

    run.update(device=hardware.nvidia_smi_gpu())
    try:
        hardware.run_peaks(run, server_url=server_url)
    except Exception as exc:  # noqa: BLE001
        log(f"no peaks recorded: {exc}")


def log(msg: str) -> None:
    print(f"[engine-ab {time.monotonic() - T0:6.1f}s] {msg}", flush=True)


def arm_env(arm: str, args: argparse.Namespace, work: Path) -> dict[str, str]:
    from specdiag.launchers.sglang import plugin_env  # noqa: PLC0415

    spec = ARMS.get(arm, {"plugin": None})
    mode = spec["plugin"]
    env = {**plugin_env(mode or "off", site=args.site, plugin_path=args.plugin_path,
                        stats_dir=work / f"stats-{arm}" if mode else None),
           "FLASHINFER_WORKSPACE_BASE": args.flashinfer_ws, **dict(spec.get("env") or {})}
    if getattr(args, "simulate_acc_len", None) and spec.get("spec", True):
        env["SGLANG_SIMULATE_ACC_LEN"] = str(args.simulate_acc_len)
    return env


def spec_args(arm: str, args: argparse.Namespace) -> tuple[str, int | None, str | None, tuple[str, ...]]:
    """(algorithm, draft tokens, drafter path, extra flags) of an arm's server: speculation off for the ``_nospec``
    arms; DFLASH: the drafter, its block (SGLang wants num_draft_tokens = block size) and its draft window."""
    if not ARMS.get(arm, {}).get("spec", True):
        return "NONE", None, None, ()
    if args.algorithm == "DFLASH":
        if not args.draft_model_path:
            raise SystemExit("--algorithm DFLASH needs --draft-model-path (a DFlash drafter folder: "
                             "data/models/make_dflash_drafter.py writes one)")
        extra = ("--speculative-dflash-block-size", str(args.block_size))
        if args.draft_window:
            extra += ("--speculative-draft-window-size", str(args.draft_window))
        return "DFLASH", args.block_size, args.draft_model_path, extra
    return args.algorithm, args.draft_tokens, None, ()


#: NVLink multicast stays off on shared multi-GPU hosts (NCCL_NVLS_ENABLE=0 and friends): SGLang 0.5.17 then hangs at
#: TP > 1 in FlashInfer's all-reduce fusion and its custom all-reduce (both set up symmetric memory), seen on two H200s
PARALLEL_FLAGS = ("--disable-custom-all-reduce", "--enforce-disable-flashinfer-allreduce-fusion")


def parallel_args(args: argparse.Namespace) -> tuple[str, ...]:
    """The flags of a server over several GPUs: expert parallelism (``--ep-size``, EPLB) and, at TP or EP above 1,
    NCCL's all-reduce in place of the two that need NVLink multicast."""
    tp, ep = int(getattr(args, "tp_size", 1) or 1), int(getattr(args, "ep_size", 1) or 1)
    if ep > tp:
        raise SystemExit(f"--ep-size {ep} exceeds --tp-size {tp}: SGLang 0.5.17 places experts over the TP ranks")
    flags: tuple[str, ...] = ()
    if ep > 1:
        flags += ("--ep-size", str(ep))
        if getattr(args, "enable_eplb", False):
            flags += ("--enable-eplb",)
    if tp > 1 or ep > 1:
        flags += PARALLEL_FLAGS
    return flags


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
    algorithm, draft_tokens, drafter, spec_extra = spec_args(arm, args)
    launch = SGLangLaunch(model_path=args.model_path, algorithm=algorithm, num_draft_tokens=draft_tokens,
                          draft_model_path=drafter,
                          attention_backend=spec["backend"], context_length=args.context_length,
                          mem_fraction_static=mem_fraction or args.mem_fraction,
                          tp_size=int(getattr(args, "tp_size", 1) or 1),
                          extra_args=("--log-level", "info", "--max-total-tokens", str(args.max_total_tokens),
                                      *spec_extra, *parallel_args(args), *spec["extra"]),
                          env=arm_env(arm, args, work), python=sys.executable)
    return sglang_server(launch, log_path=log_path, startup_timeout_s=args.startup_s, stop_grace_s=8, progress=False,
                         check=False)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["merge"]:
        mp = argparse.ArgumentParser(prog="engine_ab.py merge", description=merge.__doc__)
        mp.add_argument("--out", required=True)
        mp.add_argument("sources", nargs="+")
        m = mp.parse_args(argv[1:])
        return merge(Path(m.out), [Path(x) for x in m.sources])
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--engine", choices=["sglang", "embedded"], default="sglang")
    ap.add_argument("--model-path", default="")
    ap.add_argument("--arms", default="flashinfer,fi_prefill_plugin,triton_plugin,triton")
    ap.add_argument("--contexts", default="1024,4096,16384,32768,65536,131072,185000")
    ap.add_argument("--arm-contexts", default="",
                    help="contexts of one arm instead of --contexts: ARM=N:N:N;ARM=N:N (e.g. triton=1024:131072)")
    ap.add_argument("--repeats", type=int, default=5, help="decode requests per context on the cached prompt")
    ap.add_argument("--slow-repeats", type=int, default=3,
                    help="decode requests at a context where the arm takes over --slow-step-ms per step (measured or "
                         "predicted); those ask for half of --max-new-tokens")
    ap.add_argument("--slow-step-ms", type=float, default=200.0)
    ap.add_argument("--max-new-tokens", type=int, default=16)
    ap.add_argument("--draft-tokens", type=int, default=8, help="NGRAM: tokens per verify step")
    ap.add_argument("--algorithm", choices=["NGRAM", "DFLASH"], default="NGRAM")
    ap.add_argument("--draft-model-path", default="", help="DFLASH: the drafter folder")
    ap.add_argument("--block-size", type=int, default=8, help="DFLASH: tokens per verify block")
    ap.add_argument("--draft-window", type=int, default=0, help="DFLASH: the drafter's window of target tokens "
                                                                "(--speculative-draft-window-size; 0: none)")
    ap.add_argument("--simulate-acc-len", type=float, default=0.0,
                    help="SGLANG_SIMULATE_ACC_LEN on the speculating arms (0: unset, the drafter's own acceptance)")
    ap.add_argument("--tp-size", type=int, default=1, help="tensor-parallel GPUs per server (the investigation: 8)")
    ap.add_argument("--ep-size", type=int, default=1, help="expert-parallel ranks of an MoE model (at most --tp-size)")
    ap.add_argument("--enable-eplb", action="store_true", help="SGLang's expert-parallel load balancer (with --ep-size)")
    ap.add_argument("--context-length", type=int, default=200000)
    ap.add_argument("--max-total-tokens", type=int, default=260000)
    ap.add_argument("--mem-fraction", type=float, default=0.16)
    ap.add_argument("--mem-fractions", default="0.2,0.25,0.33,0.5",
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
    per_arm: dict[str, list[int]] = {}
    for item in (x.strip() for x in args.arm_contexts.split(";") if x.strip()):
        name, _, ctxs = item.partition("=")
        if name not in arms or not ctxs:
            ap.error(f"--arm-contexts: {item!r} must be ARM=N:N with ARM one of --arms ({', '.join(arms)})")
        per_arm[name] = [int(c) for c in ctxs.split(":") if c.strip()]
    work = Path(args.out)
    work.mkdir(parents=True, exist_ok=True)
    run = Run.create(work, label="engine-ab")
    cfg_path = Path(args.model_path) / "config.json" if args.model_path else None
    drafter_cfg = Path(args.draft_model_path) / "config.json" if args.draft_model_path else None
    run.update(kind="engine_ab", command=" ".join(["python", "scripts/engine_ab.py", *argv]),
               model={"path": args.model_path, "model_config": json.loads(cfg_path.read_text())
                      if cfg_path and cfg_path.exists() else None},
               params={"09_engine_ab": {"contexts": contexts, "arm_contexts": per_arm, "repeats": args.repeats,
                                        "slow_repeats": args.slow_repeats, "slow_step_ms": args.slow_step_ms,
                                        "max_new_tokens": args.max_new_tokens,
                                        "draft_tokens": args.block_size if args.algorithm == "DFLASH"
                                        else args.draft_tokens,
                                        "order": "serial: one arm at a time, every server started first"}},
               speculation={"algorithm": args.algorithm,
                            "block_size": args.block_size if args.algorithm == "DFLASH" else None,
                            "draft_window": args.draft_window or None,
                            "drafter_config": json.loads(drafter_cfg.read_text())
                            if drafter_cfg and drafter_cfg.exists() else None,
                            "simulated_acceptance_length": args.simulate_acc_len or None,
                            "note": (f"SGLANG_SIMULATE_ACC_LEN={args.simulate_acc_len} on the speculating arms: "
                                     "acceptance is forced, not the drafter's own") if args.simulate_acc_len
                            else "the drafter's own acceptance"},
               arms={a: {"what": ARMS.get(a, {}).get("what", a), "plugin": ARMS.get(a, {}).get("plugin"),
                         "env": {k: v for k, v in arm_env(a, args, work).items() if k not in ("PYTHONPATH",)}}
                     for a in arms})
    record_device(run, "http://127.0.0.1")  # the servers run here; measured before any server takes the GPU
    from specdiag.launchers.process import redacted_command  # noqa: PLC0415
    from specdiag.serving import make_client  # noqa: PLC0415
    from specdiag.steps.engine_ab.measure import measure_arm  # noqa: PLC0415

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
    for a in arms:  # every server ready before anything is measured: no start-up shares the GPU with a measurement
        try:
            servers[a].wait_ready()
            clients[a] = make_client(servers[a].url)
            info = redact(clients[a].server_info()) if hasattr(clients[a], "server_info") else {}
            update_arm(run, a, ready_after_s=servers[a].ready_after_s, ready_at_s=round(time.monotonic() - T0, 1),
                       server=info, command=redacted_command(servers[a].command))
            log(f"{a}: ready")
        except Exception as exc:  # noqa: BLE001 - this arm fails, the others go on
            log(f"{a}: FAILED {type(exc).__name__}: {exc}")
            update_arm(run, a, failed=f"{type(exc).__name__}: {exc}"[:500])
    not_run: list[str] = []
    for a in arms:
        if a not in clients:
            not_run.append(f"{a}: its server did not start (run.json arms.{a}.failed)")
            continue
        t_arm = time.monotonic()
        try:
            not_run += measure_arm(run, clients[a], a, per_arm.get(a, contexts), args.repeats, args.max_new_tokens,
                                   deadline_s=end - 30, progress=log, slow_step_ms=args.slow_step_ms,
                                   slow_repeats=args.slow_repeats)
        except Exception as exc:  # noqa: BLE001 - the rows so far stay; the next arm goes on
            log(f"{a}: FAILED {type(exc).__name__}: {exc}")
            update_arm(run, a, failed=f"{type(exc).__name__}: {exc}"[:500])
        update_arm(run, a, measured_s=round(time.monotonic() - t_arm, 1))
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
               plugin_check={a: check_summary(v) for a, v in stats.items() if any(s.get("check") for s in v)},
               not_run=not_run, finished_after_s=round(time.monotonic() - T0, 1))
    rows = run.rows("engine_ab")
    log(f"done: {len(rows)} rows, {sum(1 for r in rows if r.get('error'))} with an error")
    return 0


def check_summary(stats: list[dict[str, Any]]) -> dict[str, Any]:
    """The check arm's per-call comparisons in a few numbers: calls checked (those on a causal block, DFLASH's, apart),
    the largest relative error of the plugin's output against SGLang's kernel, and whether every output was finite."""
    rows = [r for s in stats for r in s.get("check") or []]
    errs = [float(r["rel_err"]) for r in rows]
    return {"calls": len(rows), "causal_block_calls": sum(1 for r in rows if r.get("causal_block")),
            "max_rel_err": max(errs) if errs else None, "median_rel_err": statistics.median(errs) if errs else None,
            "all_finite": all(r.get("finite", False) for r in rows),
            "prefix_tokens_max": max((max(r.get("prefix_tokens") or [0]) for r in rows), default=None)}


SAME_ARM_KEYS = ("what", "plugin")  #: an arm measured in two calls must agree on these and on its server's flags
SERVER_FLAGS = ("attention_backend", "prefill_attention_backend", "decode_attention_backend",
                "speculative_attention_mode", "speculative_algorithm", "speculative_num_draft_tokens", "page_size",
                "chunked_prefill_size", "max_total_tokens", "context_length")


def arm_config(rec: dict[str, Any]) -> dict[str, Any]:
    """What makes two servers the same arm: its kind and plugin mode, its environment's switches, its server flags."""
    env = {k: v for k, v in dict(rec.get("env") or {}).items() if k in ("SGLANG_PLUGINS", "SPECDIAG_SGLANG_VERIFY")}
    srv = dict(rec.get("server") or {})
    return {**{k: rec.get(k) for k in SAME_ARM_KEYS}, "env": env, **{k: srv.get(k) for k in SERVER_FLAGS}}


def merge(dest: Path, sources: list[Path]) -> int:
    """Join the run folders of several calls (one model) into one run: rows in order, each with its ``call`` (1, 2,
    ...; 09 reads an arm's first row of a call as its server's first request); each arm's record with the calls it was measured in (an arm in two calls must be the same
    configuration: kind, plugin mode, server flags); each call's command, device and provenance in ``calls``; what a
    call cut at its time limit left unmeasured in ``not_run``; the servers' logs under ``servers/``."""
    import shutil  # noqa: PLC0415

    runs = [Run.open(s) for s in sources]
    configs = {json.dumps((r.meta.get("model") or {}).get("model_config"), sort_keys=True) for r in runs}
    if len(configs) != 1:
        raise SystemExit("merge: the runs served different models (run.json model.model_config differs): "
                         "merge only calls of one model")
    out = Run.create(dest, label="engine-ab")
    first = runs[0].meta
    arms: dict[str, Any] = {}
    calls, stats, not_run, params, checks = [], {}, [], {}, {}
    speculation: Any = None
    for i, (src, r) in enumerate(zip(sources, runs), start=1):
        counts: dict[str, int] = {}
        for row in r.rows("engine_ab"):
            out.append_row("engine_ab", {**row, "call": i})
            counts[str(row.get("arm"))] = counts.get(str(row.get("arm")), 0) + 1
        for a, rec in (r.meta.get("arms") or {}).items():
            if a in arms and arm_config(arms[a]) != arm_config(rec):
                raise SystemExit(f"merge: arm {a} of call {i} ({src}) is not configured as in call "
                                 f"{arms[a]['calls'][0]}: {arm_config(rec)} against {arm_config(arms[a])}")
            kept = arms.get(a) or {**rec, "calls": []}
            kept["calls"] = [*kept["calls"], i]
            kept.setdefault("per_call", {})[str(i)] = {k: rec.get(k) for k in ("started_after_s", "ready_after_s",
                                                                                "measured_s", "failed")}
            arms[a] = kept
        cut = r.meta.get("finished_after_s") is None
        calls.append({"call": i, "source": str(src), "command": r.meta.get("command"),
                      "provenance": r.meta.get("provenance"), "device": r.meta.get("device"),
                      "hardware": r.meta.get("hardware"), "finished_after_s": r.meta.get("finished_after_s"),
                      "cut": cut})
        for a, v in (r.meta.get("plugin_stats") or {}).items():
            stats[f"{a} (call {i})"] = v
        for a, v in (r.meta.get("plugin_check") or {}).items():
            checks[f"{a} (call {i})"] = v
        spec = r.meta.get("speculation")
        if i > 1 and spec != speculation:
            raise SystemExit(f"merge: call {i} ({src}) speculated otherwise than call 1: {spec} against {speculation}")
        speculation = spec
        not_run += [f"{x} (call {i})" for x in r.meta.get("not_run") or []]
        if cut:
            for a in r.meta.get("arms") or {}:
                if (r.meta["arms"][a] or {}).get("measured_s") is None:
                    not_run.append(f"{a} (call {i}): the call reached its time limit before this arm finished "
                                   f"({counts.get(a, 0)} rows kept)")
        p = dict((r.meta.get("params") or {}).get("09_engine_ab") or {})
        params = {**p, **params, "contexts": sorted(set(params.get("contexts", [])) | set(p.get("contexts", []))),
                  "arm_contexts": {**dict(p.get("arm_contexts") or {}), **dict(params.get("arm_contexts") or {})}}
        for log_file in sorted(Path(src).glob("server-*.log")):
            (dest / "servers").mkdir(exist_ok=True)
            shutil.copyfile(log_file, dest / "servers" / f"call{i}-{log_file.name}")
    out.update(kind="engine_ab", model=first.get("model"), device=first.get("device"), hardware=first.get("hardware"),
               params={"09_engine_ab": params}, arms=arms, calls=calls, plugin_stats=stats, not_run=not_run,
               speculation=speculation, plugin_check=checks,
               command=f"python scripts/engine_ab.py merge --out {dest} " + " ".join(str(s) for s in sources))
    print(f"merged {len(sources)} calls into {dest}: {len(out.rows('engine_ab'))} rows, arms {', '.join(arms)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
