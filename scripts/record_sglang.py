"""Record real SGLang runs (or the embedded server's, for a dry run) as replayable run folders.

No papermill: it calls the library functions the notebooks call in measure mode and writes what
each notebook reads in replay mode (run.json sections ``server``, ``model``, ``drafter``,
``hardware``, ``recorded_with``; tables ``sweep`` (01, 05), ``telemetry``/``telemetry_request`` (02),
``drafter_timing`` (03), ``commit_probe``/``commit_probe_steps`` (04)). Two jobs:

- ``tiny``: the embedded trained target (data/models/target) served three times in parallel: with its
  drafter (STANDALONE, 8 draft tokens = 7 steps, topk 1), with NGRAM (8 draft tokens), and with a copy
  of the drafter whose config declares every layer full attention (same weights); the first two are
  measured in turn: raw exchanges, 00, 04, 01, 03. Then, in the STANDALONE run: ``drafter_cost``
  (per context, STANDALONE ms per verify step minus NGRAM ms per verify step, both measured here = the
  drafter's cost, which grows with context if every drafter layer attends the whole context) and
  ``drafter_window_check`` (the same greedy prompts to the shipped drafter and to its all-full copy:
  identical drafting beyond the 512-token window means the server ignored the window).
- ``mla``: a random-weight DeepSeek-V3-architecture model (data/models/make_mla_model.py) with
  ``--attention-backend triton --page-size 1`` and NGRAM: raw exchanges, 00, 01 at long contexts,
  02 (NVML at 50 Hz) during one long-context decode; run.json holds the model config and peak
  bandwidth that 05 needs to compute the floor on a CPU.

Every step has its own try/except (traceback logged, the rest goes on); rows are appended as they
are measured; a wall-clock budget (``--budget-s``) bounds the whole job, so it ends in time even if a
server is slow::

    # on the GPU machine (see scripts/device/sglang_job.sh)
    python scripts/record_sglang.py --job tiny --out $OUT/tiny --budget-s 520
    # dry run here against the embedded server (python -m specdiag.localserver)
    python scripts/record_sglang.py --job tiny --engine embedded --device cpu --out /tmp/dry \\
        --contexts 256,512 --probe-contexts 256,512 --max-new-tokens 16
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import shlex
import signal
import statistics
import sys
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import requests

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "lib"))

from specdiag import hardware  # noqa: E402
from specdiag.serving import SGLangClient  # noqa: E402
from specdiag.runs import Run  # noqa: E402
from specdiag.serving.redaction import redact, redact_text  # noqa: E402

T0 = time.monotonic()


def log(msg: str) -> None:
    print(f"[record {time.monotonic() - T0:6.1f}s] {msg}", flush=True)


# ---------------------------------------------------------------------------------------------
# Jobs
# ---------------------------------------------------------------------------------------------

@dataclass
class ServerSpec:
    label: str
    algorithm: str  # STANDALONE, NGRAM, NONE
    model_path: str
    draft_model_path: str | None = None
    num_draft_tokens: int = 8
    num_steps: int | None = None  # STANDALONE: draft steps (num_draft_tokens - 1 for a chain)
    topk: int | None = None
    steps: tuple[str, ...] | None = None  # this server's steps (None: the job's)


@dataclass
class Job:
    name: str
    servers: list[ServerSpec]
    context_length: int
    mem_fraction: float
    sweep_contexts: list[int]
    sweep_new_tokens: int
    probe_contexts: list[int] = field(default_factory=list)
    probe_new_tokens: int = 64
    timing_contexts: list[int] = field(default_factory=list)
    timing_new_tokens: int = 64
    util_context: int = 0
    window_contexts: list[int] = field(default_factory=list)
    util_new_tokens: int = 0
    steps: tuple[str, ...] = ("raw", "snapshot", "probe", "sweep", "timing", "utilization")
    extra_server_args: list[str] = field(default_factory=list)


def make_job(args: argparse.Namespace) -> Job:
    ints = lambda s: [int(x) for x in s.split(",") if x.strip()]  # noqa: E731
    if args.job == "tiny":
        target = args.model_path or str(ROOT / "data/models/target")
        drafter = args.draft_model_path or str(ROOT / "data/models/drafter")
        contexts = ints(args.contexts) if args.contexts else [1024, 2048, 4096, 8192, 16000]
        job = Job("tiny", [
            ServerSpec("standalone", "STANDALONE", target, drafter, 8, 7, 1),
            ServerSpec("ngram", "NGRAM", target, None, 8),
            # The same drafter weights with every layer declared full attention: if the server already runs
            # every layer of the original drafter with full attention, both draft exactly alike (window_check).
            ServerSpec("standalone-fullattn", "STANDALONE", target, full_attention_copy(drafter, args.out), 8, 7, 1,
                       steps=("snapshot",)),
        ], context_length=args.context_length or 16384, mem_fraction=args.mem_fraction or 0.25,
            sweep_contexts=contexts, sweep_new_tokens=args.max_new_tokens or 64,
            probe_contexts=ints(args.probe_contexts) if args.probe_contexts else [1024, 4096, 16000],
            probe_new_tokens=args.max_new_tokens or 64, timing_contexts=contexts,
            window_contexts=ints(args.window_contexts) if args.window_contexts else [384, 1024, 4096, 16000],
            timing_new_tokens=args.max_new_tokens or 64,
            steps=("raw", "snapshot", "probe", "sweep", "timing"),
            # A small KV pool per server: two servers start at once on one GPU, and SGLang sizes its pool
            # from the memory free when it looks; a capped pool keeps the second one's share large.
            extra_server_args=["--max-total-tokens", str(4 * (args.context_length or 16384))])
    else:
        model = args.model_path or "/tmp/mla-model"
        contexts = ints(args.contexts) if args.contexts else [1024, 4096, 16384, 32768, 65536, 131072, 185000]
        job = Job("mla", [ServerSpec("ngram", "NGRAM", model, None, 8)],
                  context_length=args.context_length or 200000, mem_fraction=args.mem_fraction or 0.5,
                  sweep_contexts=contexts, sweep_new_tokens=args.max_new_tokens or 32,
                  util_context=args.util_context if args.util_context is not None else 131072,
                  util_new_tokens=args.util_new_tokens or 256,
                  steps=("raw", "snapshot", "sweep", "utilization"),
                  extra_server_args=["--attention-backend", "triton", "--page-size", "1"])
    if args.skip:
        job.steps = tuple(s for s in job.steps if s not in args.skip.split(","))
    return job


def full_attention_copy(drafter: str, out: str) -> str:  # noqa: ARG001
    """A copy of the drafter folder whose config declares every layer full attention (same weights)."""
    import shutil  # noqa: PLC0415

    import tempfile  # noqa: PLC0415

    src, dst = Path(drafter), Path(tempfile.gettempdir()) / "specdiag-drafter-fullattn"  # not in the results
    dst.mkdir(parents=True, exist_ok=True)
    for f in src.iterdir():
        if f.is_file() and f.name != "config.json":
            shutil.copyfile(f, dst / f.name)
    cfg = json.loads((src / "config.json").read_text())
    n = int(cfg.get("num_hidden_layers") or len(cfg.get("layer_types") or []))
    cfg.update(layer_types=["full_attention"] * n, sliding_window=None, use_sliding_window=False, max_window_layers=n)
    (dst / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    return str(dst)


# ---------------------------------------------------------------------------------------------
# Servers: specdiag.launchers (SGLangLaunch / sglang_command), specdiag.process (ManagedServer)
# ---------------------------------------------------------------------------------------------

def server_command(engine: str, spec: ServerSpec, job: Job, port: int, device: str) -> tuple[list[str], dict[str, str]]:
    """The command line and extra environment of one server: real SGLang through
    ``specdiag.launchers.sglang_command``, or the embedded one (dry run)."""
    env = {"PYTHONPATH": os.pathsep.join(p for p in (os.environ.get("PYTHONPATH", ""), str(ROOT / "lib")) if p),
           "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}
    if engine == "embedded":
        cmd = [sys.executable, "-m", "specdiag.localserver", "--host", "127.0.0.1", "--port", str(port),
               "--model-path", spec.model_path, "--context-length", str(job.context_length), "--device", device]
        if spec.algorithm != "NONE":
            cmd += ["--speculative-algorithm", spec.algorithm, "--speculative-num-draft-tokens",
                    str(spec.num_draft_tokens)]
        if spec.draft_model_path:
            cmd += ["--speculative-draft-model-path", spec.draft_model_path]
        return cmd, env
    from specdiag.launchers import SGLangLaunch, sglang_command, sglang_env  # noqa: PLC0415

    extra = list(job.extra_server_args)
    backend, page = "triton", 1
    for flag in ("--attention-backend", "--page-size"):  # given as launch fields, not twice
        if flag in extra:
            i = extra.index(flag)
            value = extra[i + 1]
            del extra[i:i + 2]
            backend, page = (value, page) if flag == "--attention-backend" else (backend, int(value))
    launch = SGLangLaunch(model_path=spec.model_path, draft_model_path=spec.draft_model_path,
                          algorithm=spec.algorithm, num_draft_tokens=spec.num_draft_tokens,
                          num_steps=spec.num_steps, topk=spec.topk, attention_backend=backend, page_size=page,
                          context_length=job.context_length, mem_fraction_static=job.mem_fraction,
                          host="127.0.0.1", port=port, enable_metrics=True,
                          extra_args=(*extra, "--log-level", "info"), python=sys.executable)
    return sglang_command(launch), {**env, **sglang_env(launch)}


class Server:
    """One server process, started and stopped by ``specdiag.process.ManagedServer`` (own session,
    log file, SIGTERM then SIGKILL of the whole group); readiness = /health_generate answers 200."""

    def __init__(self, command: list[str], env: dict[str, str], port: int, log_path: Path, name: str) -> None:
        from specdiag.process import ManagedServer  # noqa: PLC0415

        self.command, self.port, self.log_path = command, port, log_path
        self.url = f"http://127.0.0.1:{port}"
        self.ms = ManagedServer(command, name=name, port=port, env=env, cwd=ROOT, log_path=log_path,
                                ready_path="/health_generate", stop_grace_s=15.0, progress=True)
        self.ready_s: float | None = None
        self.error: str | None = None
        self._t = 0.0

    def start(self) -> None:
        self._t = time.monotonic()
        self.ms.launch()
        log(f"started pid {self.ms.pid}: {shlex.join(self.command)}")

    def wait_ready(self, timeout_s: float) -> None:
        from specdiag.process import EngineStartError  # noqa: PLC0415

        try:
            self.ms.wait_ready(timeout_s=max(1.0, timeout_s))
            self.ready_s = round(time.monotonic() - self._t, 1)
            log(f"{self.url} ready {self.ready_s:.0f} s after its start")
        except EngineStartError as exc:  # the launcher has stopped it and kept its log
            self.error = str(exc)
            log(f"{self.url} FAILED to start: {exc}")

    def tail(self, n: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return "(no log)"

    def stop(self) -> None:
        self.ms.stop()
        log(f"stopped {self.url}")


def wait_all(servers: list[Server], deadline: float) -> None:
    """All servers were launched together; wait for each in turn until the shared deadline."""
    for s in servers:
        if s.ms.process is not None:
            s.wait_ready(deadline - time.monotonic())
        elif s.error is None:
            s.error = f"{s.url} was never launched (see the start step's error above)"


# ---------------------------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------------------------

class Budget:
    def __init__(self, seconds: float) -> None:
        self.deadline = T0 + seconds

    def left(self) -> float:
        return self.deadline - time.monotonic()


def step(name: str, failures: list[dict[str, Any]], fn: Callable[[], Any]) -> Any:
    """Run one step; log and keep its traceback on failure; never raise."""
    t = time.monotonic()
    log(f"--- {name}")
    try:
        out = fn()
        log(f"--- {name}: done in {time.monotonic() - t:.1f} s")
        return out
    except Exception as exc:  # noqa: BLE001 - every step is independent; the traceback is recorded
        tb = traceback.format_exc()
        log(f"--- {name}: FAILED after {time.monotonic() - t:.1f} s: {type(exc).__name__}: {exc}\n{tb}")
        failures.append({"step": name, "error": f"{type(exc).__name__}: {exc}", "traceback": tb})
        return None


class FallbackTokenizeClient(SGLangClient):
    """SGLangClient whose tokenize falls back to the model folder's own tokenizer (tokenizers library)
    when the server's /tokenize fails; every fallback is counted and reported."""

    def __init__(self, url: str, model_path: str, **kw: Any) -> None:
        super().__init__(url, **kw)
        self._model_path = model_path
        self._tok = None
        self.fallbacks = 0
        self.fallback_error: str | None = None

    def tokenize(self, text: str, add_special_tokens: bool = False) -> list[int]:
        if self._tok is None:
            try:
                return super().tokenize(text, add_special_tokens)
            except Exception as exc:  # noqa: BLE001
                self.fallback_error = f"{type(exc).__name__}: {exc}"
                log(f"/tokenize failed ({self.fallback_error}); FALLBACK: tokenizing with {self._model_path}/"
                    f"tokenizer.json (tokenizers library)")
                from tokenizers import Tokenizer  # noqa: PLC0415

                self._tok = Tokenizer.from_file(str(Path(self._model_path) / "tokenizer.json"))
        self.fallbacks += 1
        return list(self._tok.encode(text, add_special_tokens=add_special_tokens).ids)


def write_json(path: Path, obj: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(redact(obj), indent=2, default=str) + "\n")


def save_exchange(raw_dir: Path, name: str, method: str, url: str, body: Any = None, timeout: float = 60,
                  stream: bool = False) -> requests.Response | None:
    """One HTTP exchange: the response body verbatim (stream: every byte, as received) under raw_dir,
    JSON passed through specdiag's redaction, and a .meta.json with status, headers and timing."""
    t0 = time.perf_counter()
    shown = body
    if isinstance(body, dict) and len(body.get("input_ids") or []) > 4096:  # the over-long prompt: not kept whole
        ids = body["input_ids"]
        shown = {**body, "input_ids": f"<{len(ids)} ids, first {ids[:8]}>"}
    meta: dict[str, Any] = {"method": method, "path": url.split("/", 3)[-1], "request_body": shown}
    try:
        r = requests.request(method, url, json=body, timeout=timeout, stream=stream)
    except requests.RequestException as exc:
        meta["error"] = f"{type(exc).__name__}: {exc}"
        write_json(raw_dir / f"{name}.meta.json", meta)
        log(f"raw {name}: {meta['error']}")
        return None
    if stream:
        chunks, times = [], []
        for chunk in r.iter_content(chunk_size=None):
            chunks.append(chunk)
            times.append(round(time.perf_counter() - t0, 6))
        data = b"".join(chunks)
        meta["read_times_s"] = times
        meta["read_sizes"] = [len(c) for c in chunks]
    else:
        data = r.content
    meta.update(status=r.status_code, headers=dict(r.headers), elapsed_s=round(time.perf_counter() - t0, 4),
                bytes=len(data))
    ctype = r.headers.get("content-type", "")
    if "json" in ctype and not stream:
        try:
            write_json(raw_dir / f"{name}.json", json.loads(data))
        except ValueError:
            (raw_dir / f"{name}.txt").write_text(redact_text(data.decode(errors="replace")))
    else:
        text = data.decode(errors="replace")
        red = redact_text(text)
        meta["redacted_changed_bytes"] = red != text
        suffix = ".sse" if stream else ".txt"
        (raw_dir / f"{name}{suffix}").write_bytes(red.encode() if red != text else data)
    write_json(raw_dir / f"{name}.meta.json", meta)
    log(f"raw {name}: HTTP {r.status_code}, {len(data):,} bytes, {meta['elapsed_s']} s")
    return r


def versions() -> dict[str, Any]:
    """Installed versions, read from package metadata (nothing heavy is imported; /tmp/site comes first
    on sys.path, so its transformers 5.12.1 is the one reported, as the server uses it)."""
    import importlib.metadata as md  # noqa: PLC0415

    out: dict[str, Any] = {"python": platform.python_version()}
    for dist in ("torch", "triton", "sglang", "sglang-kernel", "flashinfer-python", "transformers", "tokenizers",
                 "nvidia-ml-py", "requests", "pandas"):
        try:
            out[f"{dist.replace('-', '_')}_version"] = md.version(dist)
        except md.PackageNotFoundError:
            out[f"{dist.replace('-', '_')}_version"] = None
    try:
        import torch  # noqa: PLC0415

        out["torch_cuda"] = torch.version.cuda
    except Exception:  # noqa: BLE001
        pass
    return out


def gpu_facts() -> dict[str, Any]:
    return hardware.nvml_gpu_facts()


def read_config(path: str | None) -> dict[str, Any] | None:
    if not path:
        return None
    p = Path(path) / "config.json"
    return json.loads(p.read_text()) if p.exists() else None


def median(xs: list[float]) -> float | None:
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


# ---------------------------------------------------------------------------------------------
# Steps
# ---------------------------------------------------------------------------------------------

def raw_exchanges(raw_dir: Path, server: Server, client: SGLangClient, spec: ServerSpec, ctx: int) -> None:
    """GET/POST every endpoint the suite uses and keep the bytes, then the stream bytes of /generate."""
    u = server.url
    for name, path in (("server_info", "/server_info"), ("get_server_info", "/get_server_info"),
                       ("model_info", "/model_info"), ("get_model_info", "/get_model_info"),
                       ("health", "/health"), ("health_generate", "/health_generate"), ("metrics_before", "/metrics"),
                       ("v1_models", "/v1/models")):
        save_exchange(raw_dir, name, "GET", u + path)
    save_exchange(raw_dir, "flush_cache", "POST", u + "/flush_cache")
    save_exchange(raw_dir, "tokenize", "POST", u + "/tokenize",
                  {"prompt": "The cat sat on the mat.", "add_special_tokens": True})
    from specdiag.prompts import build_prompt  # noqa: PLC0415

    tok = lambda t: client.tokenize(t, add_special_tokens=True)  # noqa: E731
    sp = {"max_new_tokens": 32, "temperature": 0.0, "ignore_eos": True}
    for kind in ("predictable", "novel"):
        prompt = build_prompt(tok, ctx, kind, seed=0)
        client.flush_cache()
        save_exchange(raw_dir, f"generate_stream_{kind}_{ctx}", "POST", u + "/generate",
                      {"input_ids": prompt.input_ids, "sampling_params": sp, "stream": True}, timeout=300, stream=True)
        # The same request through our client, so a disagreement shows next to the bytes.
        client.flush_cache()
        trace = client.generate(input_ids=prompt.input_ids, sampling_params=sp, stream=True)
        write_json(raw_dir / f"client_parse_{kind}_{ctx}.json", {
            "error": trace.error, "error_kind": trace.error_kind, "stream_mode": trace.stream_mode,
            "n_chunks": trace.n_chunks, "completion_tokens": trace.completion_tokens,
            "prompt_tokens": trace.prompt_tokens, "chunk_tokens": trace.chunk_tokens,
            "spec": trace.spec.__dict__ if trace.spec is not None and hasattr(trace.spec, "__dict__") else str(trace.spec),
            "final_meta_info_keys": sorted(trace.meta_info), "finish_reason": trace.finish_reason})
        if trace.error:
            log(f"CLIENT DISAGREES with the server on a {kind} stream: {trace.error}")
        if trace.spec is None and spec.algorithm != "NONE":
            log(f"CLIENT FOUND NO SPEC FIELDS in the {kind} stream's final meta_info: keys {sorted(trace.meta_info)}")
    prompt = build_prompt(tok, min(ctx, 256), "novel", seed=1)
    save_exchange(raw_dir, "generate_nonstream", "POST", u + "/generate",
                  {"input_ids": prompt.input_ids, "sampling_params": {**sp, "max_new_tokens": 16}, "stream": False},
                  timeout=120)
    save_exchange(raw_dir, "generate_error_overlong", "POST", u + "/generate",
                  {"input_ids": [1] * (spec_context_limit(client) + 16), "sampling_params": sp, "stream": False},
                  timeout=120)
    save_exchange(raw_dir, "generate_error_overlong_stream", "POST", u + "/generate",
                  {"input_ids": [1] * (spec_context_limit(client) + 16), "sampling_params": sp, "stream": True},
                  timeout=120, stream=True)
    save_exchange(raw_dir, "metrics_after", "GET", u + "/metrics")
    save_exchange(raw_dir, "server_info_after", "GET", u + "/server_info")


def spec_context_limit(client: SGLangClient) -> int:
    return int(client.server_info().get("context_length") or 16384)


def snapshot(run: Run, server: Server, client: SGLangClient, spec: ServerSpec, engine: str) -> None:
    """What 00 writes (server, model, hardware) plus the model and drafter configs 03 and 05 read."""
    from specdiag.steps.snapshot import settings as snap

    info, model_info = redact(client.server_info()), redact(client.model_info())
    drafter_view = {k: v for k, v in info.items() if str(k).startswith("speculative_")}
    model_cfg = read_config(spec.model_path)
    model_section = {**model_info, "name": Path(spec.model_path).name, "path": spec.model_path,
                     "kv_cache_dtype": info.get("kv_cache_dtype")}
    if model_cfg:
        model_section["model_config"] = model_cfg
    drafter_section: dict[str, Any] = {}
    if spec.draft_model_path:
        drafter_section = {"name": Path(spec.draft_model_path).name, "path": spec.draft_model_path,
                           "model_config": read_config(spec.draft_model_path),
                           "config_note": "the drafter's own config.json (sliding_window, layer_types); what the "
                                          "server did with it is in server_view and measured in drafter_cost"}
    drafter_section["server_view"] = drafter_view
    machine = snap.local_machine()
    try:
        peaks = hardware.peaks_for_run(None, None, recorded=None, server_info=info, server_url=server.url)
        hw = {**peaks.as_dict()}
    except ValueError as exc:
        hw = {"error": str(exc)}
    hw.update(where="this machine (the server runs here)", machine=machine, tp_size=info.get("tp_size"))
    run.update(server=info, model=model_section, drafter=drafter_section, hardware=hw)
    log(f"snapshot: {info.get('speculative_algorithm')} {info.get('speculative_num_draft_tokens')} draft tokens, "
        f"attention {info.get('attention_backend')}, page {info.get('page_size')}, context {info.get('context_length')}, "
        f"bandwidth {hw.get('memory_bandwidth_gb_s')} GB/s ({hw.get('memory_bandwidth_source')})")


def drafter_log_lines(log_path: Path) -> list[str]:
    """Server log lines about the drafter's attention (window, sliding, draft model)."""
    keys = ("sliding", "window", "swa", "draft model", "draft_model", "standalone", "draft worker")
    out = []
    try:
        for line in log_path.read_text(errors="replace").splitlines():
            if any(k in line.lower() for k in keys):
                out.append(redact_text(line)[:400])
    except OSError:
        pass
    return out[:40]


def sweep(run: Run, client: SGLangClient, job: Job, budget: Budget, est_s: Callable[[int], float],
          which: Callable[[int], bool] = lambda c: True) -> None:
    from specdiag.measure.sweep_plan import make_plan, measure_request  # noqa: PLC0415

    info = client.server_info()
    plan = make_plan(job.sweep_contexts, job.sweep_new_tokens, 1, "novel", 0, True,
                     server_context_length=info.get("context_length"))
    run.update(params={"01_baseline_sweep": {"context_lengths": list(plan.contexts) if hasattr(plan, "contexts")
                                              else job.sweep_contexts, "max_new_tokens": job.sweep_new_tokens,
                                              "repeats": 1, "prompt_kind": "novel", "seed": 0, "flush_cache": True,
                                              "instruction": ""}})
    for request in plan.requests():
        c = int(request["context_tokens"])
        if not which(c):
            continue
        if budget.left() < est_s(c):
            log(f"sweep: skipping {c:,} tokens: {budget.left():.0f} s left, about {est_s(c):.0f} s needed")
            continue
        row = measure_request(client, request, plan)
        run.append_row("sweep", row)
        log(f"sweep {c:>7,}: step {row.get('step_ms')} ms, commit {row.get('commit_length')}, ttft "
            f"{row.get('ttft_s')} s, error {row.get('error')}")


def probe(run: Run, client: SGLangClient, job: Job, budget: Budget, est_s: Callable[[int], float]) -> None:
    from specdiag.steps.commit_probe import probe as cp  # noqa: PLC0415

    info = client.server_info()
    n_draft = info.get("speculative_num_draft_tokens")
    plan = cp.make_plan(job.probe_contexts, ["predictable", "novel"], job.probe_new_tokens, 0, True,
                        server_context_length=info.get("context_length"))
    run.update(params={"04_commit_probe": {"context_lengths": job.probe_contexts, "max_new_tokens": job.probe_new_tokens,
                                           "kinds": ["predictable", "novel"], "seed": 0, "flush_cache": True}})
    for request in plan.requests():
        c = int(request["context_tokens"])
        if budget.left() < est_s(c):
            log(f"probe: skipping {c:,} {request['kind']}: {budget.left():.0f} s left")
            continue
        row, steps = cp.measure(client, request, plan, n_draft)
        run.append_row(cp.PROBE_TABLE, row)
        for s in steps:
            run.append_row(cp.STEPS_TABLE, s)
        log(f"probe {c:>7,} {request['kind']:>11}: commit {row.get('commit_length')}, verify steps "
            f"{row.get('verify_steps')}, error {row.get('error')}")


def timing(run: Run, client: SGLangClient, job: Job, budget: Budget, est_s: Callable[[int], float]) -> None:
    from specdiag.steps.drafter_inspection import analysis as drafter  # noqa: PLC0415

    run.update(params={"03_drafter_inspection": {"context_lengths": job.timing_contexts,
                                                 "max_new_tokens": job.timing_new_tokens, "prompt_kind": "novel"}})
    for c in job.timing_contexts:
        if budget.left() < est_s(c):
            log(f"timing: skipping {c:,}: {budget.left():.0f} s left")
            continue
        row = drafter.measure_draft_timing(client, c, job.timing_new_tokens, "novel")
        run.append_row("drafter_timing", row)
        log(f"timing {c:>7,}: draft {row.get('draft_ms_median')} ms (server-reported; None: not reported), "
            f"verify {row.get('verify_ms_median')} ms, error {row.get('error')}")


def utilization(run: Run, client: SGLangClient, job: Job, budget: Budget, telemetry: str) -> dict[str, Any] | None:
    from specdiag.telemetry.sampler import open_source  # noqa: PLC0415
    from specdiag.steps.gpu_utilization.record import measure_utilization  # noqa: PLC0415

    ctx = job.util_context
    limit = int(client.server_info().get("context_length") or 0)
    if limit and ctx + job.util_new_tokens > limit:
        ctx = limit - job.util_new_tokens - 8
        log(f"utilization: context lowered to {ctx:,} to fit the server's context_length {limit:,}")
    source = open_source(telemetry, [0])
    run.update(params={"02_gpu_utilization": {"context_tokens": ctx, "max_new_tokens": job.util_new_tokens,
                                              "sample_hz": 50.0, "telemetry": telemetry, "gpu_indices": [0],
                                              "idle_s": 1.0, "seed": 0}})
    req = measure_utilization(run, client, source, ctx, job.util_new_tokens, sample_hz=50.0, idle_s=1.0, seed=0,
                              gpu_index=0)
    log(f"utilization {ctx:,}: step {req.get('step_ms')} ms, commit {req.get('commit_length')}, e2e "
        f"{req.get('e2e_s')} s, error {req.get('error')}, sampler {req.get('sampler')}")
    return req


def drafter_cost(runs: dict[str, Run]) -> list[dict[str, Any]]:
    """Per context: STANDALONE ms per verify step minus NGRAM ms per verify step (both measured, 01; medians over the
    requests), and each server's requests' values (``standalone_request_ms``, ``ngram_request_ms``) for 03's
    comparison over requests."""
    from specdiag.measure.sweep_table import latest_rows  # noqa: PLC0415

    by: dict[str, dict[int, list[dict[str, Any]]]] = {}
    for label in ("standalone", "ngram"):
        rows = [r for r in latest_rows(runs[label].rows("sweep")) if not r.get("error") and r.get("step_ms") is not None]
        by[label] = {}
        for r in rows:
            by[label].setdefault(int(r["context_tokens"]), []).append(r)
    out = []
    for c in sorted(set(by["standalone"]) & set(by["ngram"])):
        s_ms = [float(r["step_ms"]) for r in by["standalone"][c]]
        n_ms = [float(r["step_ms"]) for r in by["ngram"][c]]
        ds, dn = median(s_ms), median(n_ms)
        row = {"context_tokens": c, "standalone_step_ms": ds, "ngram_step_ms": dn,
               "standalone_request_ms": s_ms, "ngram_request_ms": n_ms,
               "drafter_ms_per_verify_step": (ds - dn) if ds is not None and dn is not None else None,
               "draft_steps_per_verify_step": 7,
               "standalone_commit_length": median([r["commit_length"] for r in by["standalone"][c]
                                                   if r.get("commit_length") is not None]),
               "ngram_commit_length": median([r["commit_length"] for r in by["ngram"][c]
                                              if r.get("commit_length") is not None]),
               "source": "computed from measured ms per verify step (sweep rows of the STANDALONE and NGRAM "
                         "servers, same target, same prompts)"}
        row["drafter_ms_per_draft_step"] = (row["drafter_ms_per_verify_step"] / 7
                                            if row["drafter_ms_per_verify_step"] is not None else None)
        out.append(row)
    return out


def window_check(run: Run, a: SGLangClient, b: SGLangClient, job: Job, budget: Budget,
                 est_s: Callable[[int], float]) -> None:
    """Same prompt, greedy, to the server with the drafter as shipped (2 of 3 layers sliding, window 512)
    and to the one with its all-full-attention copy: equal draft acceptance (verify steps, histogram) at
    contexts beyond the window means the first server ran every drafter layer with full attention."""
    from specdiag.prompts import build_prompt  # noqa: PLC0415
    from specdiag.spec.commit import SpecFields  # noqa: PLC0415

    sp = {"max_new_tokens": job.probe_new_tokens, "temperature": 0.0, "ignore_eos": True}
    for c in job.window_contexts:
        for kind in ("novel", "predictable"):
            if budget.left() < 2 * est_s(c):
                log(f"window check: skipping {c:,} {kind}: {budget.left():.0f} s left")
                continue
            prompt = build_prompt(lambda t: a.tokenize(t, add_special_tokens=True), c, kind, seed=0)
            got = {}
            for name, cl in (("as_shipped", a), ("all_full", b)):
                cl.flush_cache()
                tr = cl.generate(input_ids=prompt.input_ids, sampling_params=sp, stream=True)
                spec = SpecFields.from_meta(tr.meta_info) if not tr.error else None
                got[name] = {"error": tr.error, "output_ids": tr.output_ids, "verify_ct": spec.verify_ct if spec else None,
                             "hist": spec.correct_drafts_histogram if spec else None,
                             "correct": spec.num_correct_drafts if spec else None, "completion": tr.completion_tokens}
            x, y = got["as_shipped"], got["all_full"]
            row = {"context_tokens": c, "kind": kind, "window_tokens": 512, "beyond_window": c > 512,
                   "verify_ct_as_shipped": x["verify_ct"], "verify_ct_all_full": y["verify_ct"],
                   "correct_drafts_as_shipped": x["correct"], "correct_drafts_all_full": y["correct"],
                   "histogram_as_shipped": x["hist"], "histogram_all_full": y["hist"],
                   "same_output_ids": x["output_ids"] == y["output_ids"],
                   "same_drafting": (x["verify_ct"], x["hist"], x["correct"]) == (y["verify_ct"], y["hist"], y["correct"])
                   if x["verify_ct"] is not None else None,
                   "error": x["error"] or y["error"],
                   "source": "measured: the same prompt (greedy) sent to the server with the drafter as shipped and to "
                             "one with its all-full-attention copy (same weights)"}
            run.append_row("drafter_window_check", row)
            log(f"window check {c:>6,} {kind:>11}: verify steps {x['verify_ct']} vs {y['verify_ct']}, correct drafts "
                f"{x['correct']} vs {y['correct']}, same drafting {row['same_drafting']}, error {row['error']}")


# ---------------------------------------------------------------------------------------------
# Main
# ---------------------------------------------------------------------------------------------

def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--job", required=True, choices=("tiny", "mla"))
    p.add_argument("--out", required=True, help="folder for run-<job>-<label>/ and raw-<job>-<label>/ (created)")
    p.add_argument("--engine", default="sglang", choices=("sglang", "embedded"),
                   help="sglang: python -m sglang.launch_server; embedded: python -m specdiag.localserver (dry run)")
    p.add_argument("--device", default="cpu", help="embedded server's device (dry run)")
    p.add_argument("--budget-s", type=float, default=520.0, help="wall-clock limit of the whole job, s")
    p.add_argument("--server-wait-s", type=float, default=280.0, help="longest wait for the servers to be ready, s")
    p.add_argument("--port-base", type=int, default=30100)
    p.add_argument("--model-path", default="", help="target model folder (tiny: data/models/target; mla: /tmp/mla-model)")
    p.add_argument("--draft-model-path", default="", help="drafter folder (tiny: data/models/drafter)")
    p.add_argument("--context-length", type=int, default=0, help="server context length (tiny 16384, mla 200000)")
    p.add_argument("--mem-fraction", type=float, default=0.0, help="--mem-fraction-static per server")
    p.add_argument("--contexts", default="", help="01 and 03 contexts, comma-separated tokens")
    p.add_argument("--probe-contexts", default="", help="04 contexts, comma-separated tokens")
    p.add_argument("--window-contexts", default="", help="tiny: contexts of the drafter window check, tokens")
    p.add_argument("--max-new-tokens", type=int, default=0, help="new tokens per 01/03/04 request")
    p.add_argument("--util-context", type=int, default=None, help="02 context, tokens (mla: 131072)")
    p.add_argument("--util-new-tokens", type=int, default=0, help="02 new tokens (mla: 256)")
    p.add_argument("--telemetry", default="nvml", help="02 telemetry: nvml, cpu, auto")
    p.add_argument("--raw-context", type=int, default=1024, help="prompt length of the raw stream exchanges")
    p.add_argument("--skip", default="", help="steps to skip, comma-separated (raw,snapshot,probe,sweep,timing,utilization)")
    return p.parse_args(argv)


def _terminated(signum: int, frame: Any) -> None:
    raise SystemExit(f"stopped by signal {signum}")  # runs the finally blocks: servers stopped, rows kept


def main(argv: list[str] | None = None) -> int:
    signal.signal(signal.SIGTERM, _terminated)
    args = parse_args(argv)
    job = make_job(args)
    budget = Budget(args.budget_s)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    failures: list[dict[str, Any]] = []
    base = {"date_utc": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
            "command": shlex.join([sys.executable, *sys.argv]), "host": platform.node(), "engine": args.engine,
            "job": job.name, **versions(), **gpu_facts()}
    servers: list[Server] = []
    for i, spec in enumerate(job.servers):
        port = args.port_base + i
        cmd, env = server_command(args.engine, spec, job, port, args.device)
        servers.append(Server(cmd, env, port, out / f"run-{job.name}-{spec.label}" / "server.log",
                              f"{args.engine} {spec.label}"))
    for s in servers:
        step(f"start {s.url}", failures, s.start)
    runs: dict[str, Run] = {}
    clients: dict[str, SGLangClient] = {}
    summary: list[dict[str, Any]] = []
    try:
        step("wait for servers", failures,
             lambda: wait_all(servers, min(T0 + args.server_wait_s, budget.deadline - 30)))
        # Rough seconds per request at a context: prefill + decode; used to skip what cannot finish in time.
        est = (lambda c: 5 + c / 20000) if job.name == "tiny" else (lambda c: 10 + c / 5000)
        for spec, server in zip(job.servers, servers):
            label = f"{job.name}-{spec.label}"
            run = Run.create(out / f"run-{label}", label=label, data_source="measured",
                             description=f"real {args.engine} run, job {job.name}, server {spec.label}")
            runs[spec.label] = run
            run.update(recorded_with={**base, "server_command": shlex.join(server.command),
                                      "server_flags": server.command[3:], "server_ready_s": server.ready_s,
                                      "server_algorithm": spec.algorithm, "server_url": server.url},
                       server_url=server.url)
            if server.ready_s is None:
                log(f"{server.url} is not ready ({server.error}); skipping its steps")
                failures.append({"step": f"server {label}", "error": server.error})
                run.update(recorded_with={"server_error": server.error})
                continue
            client = FallbackTokenizeClient(server.url, spec.model_path, timeout_s=300.0)
            clients[spec.label] = client
            steps = spec.steps if spec.steps is not None else job.steps
            if "raw" in steps:
                step(f"{label}: raw exchanges", failures,
                     lambda: raw_exchanges(out / f"raw-{label}", server, client, spec,
                                           min(args.raw_context, job.context_length - 64)))
            if "snapshot" in steps:
                step(f"{label}: 00 snapshot", failures, lambda: snapshot(run, server, client, spec, args.engine))
            if "probe" in steps and spec.algorithm != "NONE":
                step(f"{label}: 04 commit probe", failures, lambda: probe(run, client, job, budget, est))
            if "sweep" in steps:  # contexts beyond 02's come after 02 (they are the optional ones)
                step(f"{label}: 01 sweep", failures, lambda: sweep(run, client, job, budget, est,
                                                                   lambda c: not job.util_context or c <= job.util_context))
            if "timing" in steps:
                step(f"{label}: 03 draft timing", failures, lambda: timing(run, client, job, budget, est))
            if "utilization" in steps and job.util_context:
                step(f"{label}: 02 utilization", failures, lambda: utilization(run, client, job, budget, args.telemetry))
            if "sweep" in steps and job.util_context and any(c > job.util_context for c in job.sweep_contexts):
                step(f"{label}: 01 sweep, longest contexts", failures, lambda: sweep(
                    run, client, job, budget, est, lambda c: c > job.util_context))
            step(f"{label}: server log facts", failures, lambda: run.update(
                server_log_drafter_lines=drafter_log_lines(server.log_path),
                tokenize_fallback={"used": client.fallbacks > 0, "calls": client.fallbacks,
                                   "server_error": client.fallback_error}))
            summary.append({"label": label, "ready_s": server.ready_s})
        if job.name == "tiny" and "standalone" in runs and "ngram" in runs:
            def cost() -> None:
                rows = drafter_cost(runs)
                for r in rows:
                    runs["standalone"].append_row("drafter_cost", r)
                runs["standalone"].update(drafter_cost_note=(
                    "drafter_cost.jsonl: per context, the STANDALONE server's ms per verify step minus the NGRAM "
                    "server's (same target and prompts, both measured by 01 here) = the drafter's 7 draft steps plus "
                    "its bookkeeping. Flat: the drafter's attention is bounded (sliding window honoured); growing "
                    "with context: its layers attend the whole context."))
            step("tiny: drafter_cost", failures, cost)
        if job.name == "tiny" and "standalone" in clients and "standalone-fullattn" in clients:
            step("tiny: drafter window check", failures, lambda: window_check(
                runs["standalone"], clients["standalone"], clients["standalone-fullattn"], job, budget, est))
    except SystemExit as exc:  # SIGTERM (the device call's timeout): stop the servers, keep the rows, summarize
        log(f"STOPPED: {exc}")
        failures.append({"step": "recorder", "error": str(exc)})
    finally:
        for s in servers:
            step(f"stop {s.url}", failures, s.stop)
        for label, run in runs.items():
            run.update(recorded_with={"failures": [{k: v for k, v in f.items() if k != "traceback"} for f in failures],
                                      "wall_s": round(time.monotonic() - T0, 1)})
        write_json(out / f"failures-{job.name}.json", failures)
    print_summary(job, runs)
    log(f"{len(failures)} step(s) failed; {budget.left():.0f} s of the budget left")
    return 0 if not failures else 1


def print_summary(job: Job, runs: dict[str, Run]) -> None:
    from specdiag.measure.sweep_table import latest_rows  # noqa: PLC0415

    print(f"\n=== summary: job {job.name}")
    for label, run in runs.items():
        print(f"--- {label}: ready after {run.meta.get('recorded_with', {}).get('server_ready_s')} s")
        print(f"{'context':>8} {'step ms':>8} {'commit':>7} {'ttft s':>7} {'error'}")
        for r in latest_rows(run.rows("sweep")):
            f = lambda v, p=2: "-" if v is None else f"{v:.{p}f}"  # noqa: E731
            print(f"{r['context_tokens']:>8} {f(r.get('step_ms')):>8} {f(r.get('commit_length')):>7} "
                  f"{f(r.get('ttft_s')):>7} {(r.get('error') or '')[:60]}")
        for r in run.rows("commit_probe"):
            print(f"probe {r['context_tokens']:>7} {r['kind']:>11} commit {r.get('commit_length')} "
                  f"{(r.get('error') or '')[:60]}")
        for r in run.rows("drafter_cost"):
            print(f"drafter cost {r['context_tokens']:>7}: {r.get('standalone_step_ms')} - {r.get('ngram_step_ms')} = "
                  f"{r.get('drafter_ms_per_verify_step')} ms per verify step")
        for r in run.rows("drafter_window_check"):
            print(f"window check {r['context_tokens']:>6} {r['kind']:>11}: verify steps {r.get('verify_ct_as_shipped')} "
                  f"(as shipped) vs {r.get('verify_ct_all_full')} (all full), same drafting {r.get('same_drafting')}")
        for r in run.rows("telemetry_request"):
            print(f"utilization {r.get('context_tokens')}: step {r.get('step_ms')} ms, e2e {r.get('e2e_s')} s, "
                  f"error {r.get('error')}")


if __name__ == "__main__":
    sys.exit(main())
