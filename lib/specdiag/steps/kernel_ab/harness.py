"""The kernel A/B's measurement: every arm on every case, checked against the fp32 reference, then timed.

    python -m specdiag.steps.kernel_ab --out RUN_DIR [--cases 131072:8:1,...] [--arms pick,plugin,...]
                                       [--max-minutes 6] [--n-runs 20] [--flashinfer-off REASON]

One run folder (specdiag.runs): ``run.json`` (the device's provenance, the two ceilings measured first: a 2 GiB
device copy and an 8192^3 bf16 matrix product), ``kernel_ab.jsonl`` (one row per case and arm: the error against
the reference, the raw timing samples, the derived rates, or the reason it was skipped) and ``kernel_ab_copy.jsonl``
(per context and cache dtype, a device copy moving the bytes the case reads, timed the same way).

Per case the inputs are made once per layout (chain-shaped drafts, so the anchors can run them), the fp32 reference
once, and each arm is checked into a NaN-poisoned output before it is timed (:mod:`.timing`: CUDA-graph replays,
the L2 flushed before each). A failure or a skip is a row that says why; rows are appended as they are measured, so
a run stopped half-way keeps them; a run folder given again resumes where it stopped. Cases start in the order given
until ``--max-minutes`` is used up.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import os
import platform
import subprocess
import sys
import time
from dataclasses import asdict, is_dataclass
from typing import Any, Callable, Optional, Sequence

import torch

from specdiag import hardware
from specdiag.kernels.mla import (VerifyInputs, VerifyShape, kv_bytes, make_inputs, verify_flops,
                                  with_fp8_cache)
from specdiag.kernels.reference import reference_verify, relative_error
from specdiag.runs import Run
from specdiag.stats import quantile
from specdiag.steps.kernel_ab.arms import ARMS, FP8_TOL, TOL, Arm, cannot_run, prepare, reference_inputs
from specdiag.steps.kernel_ab.timing import COPY_FORMS, L2Flush, Timing, time_copy, time_replays
from specdiag.tokens import token_count

TABLE = "kernel_ab"
COPY_TABLE = "kernel_ab_copy"
RESUME_KEY = ("context_tokens", "heads", "draft_tokens", "arm")

#: the canonical cases, in measuring order: the investigation's shapes (8 or 16 heads per GPU at TP8, one or eight
#: draft tokens) at 128k and 256k first, 64k, the compute-bound shapes, then the short end of the context sweep
CANONICAL_CASES: tuple[tuple[int, int, int], ...] = (
    (131072, 8, 1), (131072, 16, 1), (131072, 8, 8),
    (262144, 8, 1), (262144, 16, 1), (262144, 8, 8),
    (65536, 8, 1), (65536, 16, 1), (65536, 8, 8),
    (131072, 16, 64), (131072, 128, 8),
    (32768, 8, 1), (32768, 8, 8), (16384, 8, 1), (16384, 8, 8),
)
#: SGLang's own kernel pads the 576 dims to 1024 with one program per head and split: above this many packed rows an
#: earlier H200 run saw it take minutes per case, so it is not started there (the row says so)
SGLANG_ANCHOR_MAX_ROWS = 64
BUDGET_SKIP = "the run's time budget was used up before this case (a later run into the same folder measures it)"


def parse_cases(text: str) -> list[tuple[int, int, int]]:
    """``"131072:8:1,64k:16:8"`` -> [(131072, 8, 1), (65536, 16, 8)] (the context may be written 128k: specdiag.tokens),
    with a clear error on bad input."""
    out = []
    for part in (p.strip() for p in text.split(",") if p.strip()):
        bits = part.split(":")
        try:
            context = token_count(bits[0], "context") if len(bits) == 3 else 0
        except ValueError:
            context = 0
        if len(bits) != 3 or context <= 0 or not all(b.isdigit() and int(b) > 0 for b in bits[1:]):
            raise ValueError(f"bad case {part!r}: write context:heads:draft_tokens with positive integers (the context "
                             "may be written 128k), e.g. 131072:8:1 or 128k:8:1")
        out.append((context, int(bits[1]), int(bits[2])))
    return out


def parse_arms(text: str) -> list[str]:
    names = [a.strip() for a in text.split(",") if a.strip()]
    unknown = [a for a in names if a not in ARMS]
    if unknown:
        raise ValueError(f"unknown arm(s) {unknown}; choose from {', '.join(ARMS)}")
    return names


def device_provenance(device: torch.device) -> dict[str, Any]:
    """GPU, driver, CUDA, torch and Triton versions and the date: what a reader needs to reproduce the numbers."""
    info: dict[str, Any] = {"torch": torch.__version__, "python": platform.python_version(),
                            "date_utc": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")}
    if device.type != "cuda":
        return {**info, "gpu": None, "cpu": platform.processor() or platform.machine()}
    props = torch.cuda.get_device_properties(device)
    info.update(gpu=props.name, sm_count=props.multi_processor_count, capability=f"{props.major}.{props.minor}",
                gpu_memory_bytes=props.total_memory, cuda=torch.version.cuda,
                l2_cache_bytes=getattr(props, "L2_cache_size", None))
    try:
        import triton  # noqa: PLC0415 - optional: the except says what happens without it

        info["triton"] = triton.__version__
    except ImportError:
        info["triton"] = None
    try:
        import flashinfer  # noqa: PLC0415 - loads flashinfer (costly: ARCHITECTURE.md, Imports)

        info["flashinfer"] = flashinfer.__version__
    except Exception:  # noqa: BLE001 - not installed here
        info["flashinfer"] = None
    try:
        q = subprocess.run(["nvidia-smi", "--query-gpu=driver_version,clocks.max.sm,clocks.max.mem,power.limit",
                            "--format=csv,noheader"], capture_output=True, text=True, timeout=20)
        info["nvidia_smi"] = q.stdout.strip()
        info["driver"] = q.stdout.split(",")[0].strip() if q.stdout else None
    except (OSError, subprocess.SubprocessError) as exc:
        info["driver"] = f"unknown ({exc!r})"
    return info


def measure_peaks(device: torch.device) -> dict[str, Any]:
    """The two ceilings of the run: a 2 GiB device copy (GB/s, read + write) and an 8192^3 bf16 matrix product."""
    if device.type != "cuda":
        return {"copy_gbps": None, "matmul_tflops": None, "source": "not measured (CPU)"}

    copy = hardware.measure_copy_bandwidth(str(device), n_bytes=2 << 30, repeats=20, warmup=3)
    matmul = hardware.measure_matmul_rate(str(device), n=8192, repeats=20, warmup=3)
    return {"copy_gbps": quantile(copy, 0.5) / 1e9, "matmul_tflops": quantile(matmul, 0.5) / 1e12,
            "copy_bytes": 2 << 30, "matmul_n": 8192, "source": "measured in this run (medians of 20)"}


def _config_dict(config: Any) -> Optional[dict]:
    return asdict(config) if is_dataclass(config) else None


def case_bytes(context_tokens: int, draft_tokens: int, kv: str) -> int:
    """Bytes of KV a verify call reads: every row of prefix and draft once (1,152 B bf16, half that in fp8)."""
    b = kv_bytes(context_tokens + draft_tokens)
    return b // 2 if kv == "fp8" else b


def derived(ms: float, n_bytes: int, flops: int, peaks: dict[str, Any], copy_ms: Optional[float]) -> dict[str, Any]:
    """Rates from a median time: GB/s of the bytes read, TFLOP/s, each as % of the run's ceiling, and the time over
    the same-bytes copy's (1.0: as fast as a plain copy of what the call reads)."""
    s = ms * 1e-3
    out: dict[str, Any] = {"us": ms * 1e3, "gbps": n_bytes / s / 1e9, "tflops": flops / s / 1e12,
                           "copy_ms": copy_ms, "over_copy": (ms / copy_ms) if copy_ms else None}
    if peaks.get("copy_gbps"):
        out["pct_copy_bw"] = 100 * out["gbps"] / peaks["copy_gbps"]
    if peaks.get("matmul_tflops"):
        out["pct_matmul"] = 100 * out["tflops"] / peaks["matmul_tflops"]
    return out


def measure_copies(run: Run, ctx: int, draft: int, kv: str, n_bytes: int, flush: L2Flush, n_runs: int
                   ) -> dict[str, float]:
    """The same-bytes floors of one case into ``kernel_ab_copy`` (every form of ``timing.COPY_FORMS``); returns the
    copies' medians by form (ms), the read-only pass left out: a case's ``copy_ms`` is the faster copy."""
    out: dict[str, float] = {}
    for form in COPY_FORMS:
        c = time_copy(n_bytes, flush, n_runs=n_runs, form=form)
        run.append_row(COPY_TABLE, {"ts_unix_s": time.time(), "context_tokens": ctx, "draft_tokens": draft, "kv": kv,
                                    "form": form, "bytes": n_bytes, **c.summary, "method": c.method,
                                    "gbps": n_bytes / (c.summary["ms_median"] * 1e-3) / 1e9, "error": None})
        if form != "read":
            out[form] = c.summary["ms_median"]
    return out


def measure_arm(a: Arm, inputs: VerifyInputs, refs: dict[str, torch.Tensor], flush: L2Flush, n_runs: int
                ) -> dict[str, Any]:
    """Check arm ``a`` into a NaN-poisoned output against the reference of the cache it reads, then time it."""
    out = inputs.out_like()
    call = prepare(a, inputs, out)
    call()
    if out.is_cuda:
        torch.cuda.synchronize()
    ref = refs[a.kv]
    err = relative_error(out, ref)
    unwritten = int(torch.isnan(out).sum())
    row: dict[str, Any] = {"rel_err": err, "unwritten": unwritten, "tol": TOL,
                           "correct": bool(err <= TOL and unwritten == 0)}
    if a.kv == "fp8":
        row["rel_err_vs_bf16_ref"] = relative_error(out, refs["bf16"])
        row["correct"] = row["correct"] and row["rel_err_vs_bf16_ref"] <= FP8_TOL
    if not row["correct"]:
        row["error"] = f"wrong result: rel. error {err:.3g} (tol {TOL}), {unwritten} outputs unwritten"
        return row
    t: Timing = time_replays(call, flush, n_runs=n_runs)
    row.update(t.summary, method=t.method, method_note=t.method_note or None,
               samples_ms=[round(x, 6) for x in t.samples_ms])
    return row


def measure(run: Run, cases: Sequence[tuple[int, int, int]], arms: Sequence[str], device: torch.device | str,
            n_runs: int = 20, deadline_s: Optional[float] = None, anchors_off: Optional[dict[str, str]] = None,
            progress: Callable[[str], None] = lambda s: None, seed: int = 0) -> int:
    """Everything one run records (module doc); returns the number of kernel_ab rows written now."""
    device = torch.device(device)
    if not run.meta.get("peaks"):
        # kernel_ab_arms, not arms: in a report's run folder "arms" holds 09's and 10's engine arms (docs/run-folder.md)
        run.update(kind="kernel_ab", device=device_provenance(device), peaks=measure_peaks(device),
                   kernel_ab_arms={n: {"what": ARMS[n].what, "family": ARMS[n].family, "layout": ARMS[n].layout,
                                       "kv": ARMS[n].kv, "config": _config_dict(ARMS[n].config)} for n in arms})
    peaks = run.meta["peaks"]
    if peaks.get("copy_gbps"):
        progress(f"peaks: copy {peaks['copy_gbps']:,.0f} GB/s, bf16 matmul {peaks['matmul_tflops']:,.0f} TFLOP/s")
    done = {tuple(r.get(f) for f in RESUME_KEY) for r in run.rows(TABLE)
            if not r.get("error") and r.get("skipped") != BUDGET_SKIP}
    copies: dict[tuple, dict[str, float]] = {}
    for r in run.rows(COPY_TABLE):
        if not r.get("error") and r.get("form", "memcpy") != "read":
            copies.setdefault((r["context_tokens"], r["draft_tokens"], r["kv"]), {})[r.get("form", "memcpy")] = \
                r["ms_median"]
    flush = L2Flush(device)
    written = 0
    for i, (ctx, heads, t) in enumerate(cases):
        todo = [a for a in arms if (ctx, heads, t, a) not in done]
        if not todo:
            continue
        base = {"context_tokens": ctx, "heads": heads, "draft_tokens": t, "rows": heads * t,
                "flops": verify_flops(heads, t, ctx + t), "error": None, "skipped": None}
        if deadline_s is not None and time.monotonic() > deadline_s:
            for name in todo:
                run.append_row(TABLE, {**base, "ts_unix_s": time.time(), "arm": name,
                                       "skipped": BUDGET_SKIP})
                written += 1
            continue
        layouts: dict[str, tuple[VerifyInputs, dict[str, torch.Tensor]]] = {}
        for name in todo:
            a = ARMS[name]
            row = {**base, "ts_unix_s": time.time(), "arm": name, "family": a.family, "layout": a.layout, "kv": a.kv,
                   "kv_bytes": case_bytes(ctx, t, a.kv), "config": _config_dict(a.config)}
            try:
                if a.layout not in layouts:
                    inputs = make_inputs(VerifyShape(ctx, heads, t, a.layout), device=device, seed=seed + 7919 * i,
                                         chain=True)
                    inputs = with_fp8_cache(inputs)
                    refs = {"bf16": reference_verify(inputs), "fp8": reference_verify(reference_inputs(ARMS["pick_fp8"],
                                                                                                      inputs))}
                    layouts[a.layout] = (inputs, refs)
                inputs, refs = layouts[a.layout]
                off = dict(anchors_off or {})
                if name == "sglang_splitkv" and heads * t > SGLANG_ANCHOR_MAX_ROWS:
                    off[name] = (f"not started above {SGLANG_ANCHOR_MAX_ROWS} packed rows: SGLang's kernel pads 576 "
                                 "dims to 1024 with a program per head and split, and took minutes per case there")
                why = cannot_run(a, inputs, off)
                if why:
                    row["skipped"] = why
                else:
                    key = (ctx, t, a.kv)
                    if key not in copies and device.type == "cuda":
                        copies[key] = measure_copies(run, ctx, t, a.kv, row["kv_bytes"], flush, n_runs)
                    row.update(measure_arm(a, inputs, refs, flush, n_runs))
                    if row.get("ms_median") is not None:
                        copy_ms = min(copies[key].values()) if copies.get(key) else None
                        row.update(derived(row["ms_median"], row["kv_bytes"], row["flops"], peaks, copy_ms))
            except Exception as exc:  # noqa: BLE001 - the row says what failed; the next arm runs
                row["error"] = f"{type(exc).__name__}: {' '.join(str(exc).split())[:400]}"
            row["ts_unix_s"] = time.time()
            run.append_row(TABLE, row)
            written += 1
            progress(progress_line(row))
        del layouts
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return written


def progress_line(row: dict[str, Any]) -> str:
    head = f"{row['arm']:<16} {row['context_tokens']:>7} H{row['heads']:<3} T{row['draft_tokens']:<3}"
    if row.get("skipped"):
        return f"{head} skipped: {row['skipped'][:100]}"
    if row.get("error"):
        return f"{head} ERROR {row['error'][:120]}"
    over = f"{row['over_copy']:.2f}x copy" if row.get("over_copy") else ""
    return f"{head} {row['us']:10.1f} us {row['gbps']:8.1f} GB/s {over:>11} err {row['rel_err']:.1e} ({row['method']})"


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m specdiag.steps.kernel_ab",
                                 description="Kernel A/B of MLA verify attention: every arm on every case, checked "
                                             "then timed as CUDA-graph replays with the L2 flushed (06's rows).")
    ap.add_argument("--out", required=True, help="run folder to write (created, or resumed when it exists)")
    ap.add_argument("--cases", default="", help="context:heads:draft_tokens,... (default: the canonical cases)")
    ap.add_argument("--arms", default="", help=f"comma-separated arms (default: all: {','.join(ARMS)})")
    ap.add_argument("--n-runs", type=int, default=20, help="timed replays per case and arm (default 20)")
    ap.add_argument("--max-minutes", type=float, default=None, help="start no case after this long")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--flashinfer-off", default="", help="do not run FlashInfer; its rows carry this reason")
    args = ap.parse_args(argv)
    try:
        cases = parse_cases(args.cases) if args.cases else list(CANONICAL_CASES)
        arms = parse_arms(args.arms) if args.arms else list(ARMS)
    except ValueError as exc:
        ap.error(str(exc))
    t0 = time.monotonic()
    run = Run.open(args.out) if os.path.exists(os.path.join(args.out, "run.json")) else Run.create(
        args.out, label="kernel-ab")
    run.update(command=" ".join(["python", "-m", "specdiag.steps.kernel_ab", *(argv if argv is not None
                                                                                else sys.argv[1:])]))
    off = {"flashinfer_mla": args.flashinfer_off} if args.flashinfer_off else None
    n = measure(run, cases, arms, args.device, n_runs=args.n_runs,
                deadline_s=t0 + 60 * args.max_minutes if args.max_minutes else None, anchors_off=off,
                progress=lambda s: print(s, flush=True))
    run.update(finished_utc=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
               wall_s=round(time.monotonic() - t0, 1))
    print(f"wrote {n} rows to {run.path} in {time.monotonic() - t0:.0f} s", flush=True)
    return 0
