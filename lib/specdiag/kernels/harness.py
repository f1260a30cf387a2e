"""The kernel A/B harness: a grid of verify shapes, each checked against the reference and timed.

Per case (one :class:`VerifyShape`): fresh random inputs, the fp32 reference, then for each kernel
variant: one run into a NaN-poisoned output checked against the reference (relative error
||out - ref|| / ||ref|| at most ``tol`` and every element written), then ``n_runs`` timed runs after
warm-up, rotating among input sets whose total size is at least ``rotate_bytes`` (several times the
L2 cache), so no run finds its KV in L2. Rows go to the run folder's ``kernel_ab`` table one by one.

The copy bandwidth and the bf16 matmul rate are measured first in the same process and stored in
run.json (``peaks``); every row carries the derived GB/s, TFLOPS and % of each.

Command line (what produced data/reference/kernel-ab-h200)::

    python -m specdiag.kernels.harness --out DIR [--grid full|smoke] [--tune] [--max-minutes M]
"""

from __future__ import annotations

import argparse
import datetime as _dt
import os
import platform
import subprocess
import sys
import time
from typing import Any, Callable, Optional, Sequence

import torch

# The case (shapes, inputs, check, timing, row fields) lives in cases.py, shared with tuning.py; its public
# names stay importable from here (the notebook and the recorded command use specdiag.kernels.harness).
from specdiag.kernels.cases import (FP8_TOL, TABLE, TUNING_TABLE, VARIANTS_BY_LAYOUT, GridSpec, check_once,  # noqa: F401
                                    config_dict, derived_metrics, fp8_case, full_grid, kernels_not_run, measure_variant,
                                    plan_fields, progress_line, relative_error, rotation_sets, shape_fields, smoke_grid)
from specdiag.kernels.dispatch import implementation, resolve_config, supports, unsupported_shape, variant
from specdiag.kernels.mla import VerifyInputs, VerifyShape, kv_bytes, make_inputs
from specdiag.kernels.reference import reference_verify
from specdiag.kernels.timing import copy_bandwidth_gbps, matmul_tflops, summarize_ms, time_calls  # noqa: F401
from specdiag.kernels.tuning import config_picker, tune
from specdiag.runs import Run


def run_grid(spec: GridSpec, run: Run, peaks: dict[str, float], device: torch.device | str = "cuda",
             configs: Optional[Callable[[int], Any]] = None, seed: int = 0,
             deadline_s: Optional[float] = None, progress: Optional[Callable[[str], None]] = None) -> int:
    """Measure every case of ``spec`` into ``run``'s kernel_ab table; returns the number of rows written.

    ``configs(rows)`` gives the split-KV config for a packed row count (None: the default).
    ``deadline_s`` (time.monotonic) stops before starting a case past it; a row says so.
    """
    device = torch.device(device)
    baseline_last: dict[tuple, tuple[int, float]] = {}
    n_rows = 0
    for i, shape in enumerate(spec.shapes()):
        base = {"ts_unix_s": time.time(), "error": None, **shape_fields(shape), "mask": "chain" if spec.chain else "tree"}
        if deadline_s is not None and time.monotonic() > deadline_s:
            run.append_row(TABLE, {**base, "kernel": None, "skipped": "time budget of the run used up; "
                                   "cases from here on were not measured"})
            return n_rows + 1
        try:
            inputs = make_inputs(shape, device=device, seed=seed + 7919 * i, chain=spec.chain)
            ref = reference_verify(inputs)
            sets: Optional[list[VerifyInputs]] = None
            fp8: Optional[tuple[list[VerifyInputs], torch.Tensor]] = None
        except Exception as exc:  # noqa: BLE001 - record the failure, keep going
            run.append_row(TABLE, {**base, "kernel": None, "error": f"inputs/reference: {exc!r}"})
            n_rows += 1
            continue
        for name in VARIANTS_BY_LAYOUT[shape.layout]:
            if name not in spec.kernels or not supports(name, inputs):
                continue
            v = variant(name)
            reason = unsupported_shape(name, shape.rows)
            if reason:  # a kernel that cannot hold the case: a row that says so, no work
                run.append_row(TABLE, {**base, "ts_unix_s": time.time(), "kernel": name, "design": v.design,
                                       "page_size": v.page_size, "impl": implementation(inputs),
                                       "kv_dtype": "fp8_e4m3" if v.kv_fp8 else "bf16", "skipped": reason})
                n_rows += 1
                continue
            config = configs(shape.rows) if (configs and v.design == "split_kv") else None
            if configs and v.design == "fused_split_kv":  # the tuned tile, with bf16 partials
                from dataclasses import replace  # noqa: PLC0415

                config = replace(configs(shape.rows), partial_bf16=True)
            config = resolve_config(name, shape.rows, config)  # run 6's arms carry their own 64-row tile
            row = {**base, "ts_unix_s": time.time(), "kernel": name, "design": v.design, "page_size": v.page_size,
                   "impl": implementation(inputs), "config": config_dict(config), "skipped": None}
            key = (shape.heads, shape.draft_tokens, shape.layout)
            if v.design == "baseline" and key in baseline_last:
                last_kv, last_ms = baseline_last[key]
                predicted = last_ms * shape.n_kv / last_kv
                required = (shape.context_tokens, shape.heads, shape.draft_tokens) in spec.required
                if predicted > spec.baseline_max_ms and not required:
                    row["skipped"] = (f"baseline predicted {predicted:.0f} ms per run > cap {spec.baseline_max_ms:.0f} ms "
                                      f"(scaled from {last_ms:.2f} ms at {last_kv} KV rows)")
                    run.append_row(TABLE, row)
                    n_rows += 1
                    continue
            try:
                if sets is None:
                    sets = rotation_sets(inputs, spec.rotate_bytes, seed + 7919 * i)
                row.update(plan_fields(name, shape, config, device))
                if v.kv_fp8:
                    if fp8 is None:
                        fp8 = fp8_case(sets)
                    row.update(measure_variant(name, fp8[0], fp8[1], config, spec, peaks))
                    vs_bf16 = check_once(name, fp8[0][0], ref, config, FP8_TOL)
                    row.update(kv_dtype="fp8_e4m3", kv_scale=fp8[0][0].kv_scale, rel_err_vs_bf16_ref=vs_bf16["rel_err"],
                               actual_kv_bytes=row["kv_bytes"] // 2, actual_gbps=row["gbps"] / 2)
                    row["correct"] = bool(row["correct"] and vs_bf16["correct"])
                else:
                    row.update(measure_variant(name, sets, ref, config, spec, peaks))
                    row["kv_dtype"] = "bf16"
                row["n_rotation_sets"] = len(sets)
                if v.design == "baseline":
                    baseline_last[key] = (shape.n_kv, row["ms_median"])
                if not row["correct"]:
                    row["error"] = f"wrong result: rel_err {row['rel_err']:.3g} > {spec.tol} or {row['unwritten']} unwritten"
            except Exception as exc:  # noqa: BLE001
                row["error"] = repr(exc)[:500]
            row["ts_unix_s"] = time.time()
            run.append_row(TABLE, row)
            n_rows += 1
            if progress:
                progress(progress_line(row))
        for row in anchor_rows(spec, shape, inputs, ref, sets, base, peaks, device, seed + 7919 * i):
            run.append_row(TABLE, row)
            n_rows += 1
            if progress:
                progress(progress_line(row) if not row.get("skipped") else
                         f"{row['kernel']:<18} P={shape.context_tokens:>6} H={shape.heads:>3} T={shape.draft_tokens:>2} "
                         f"{shape.layout:<12} skipped: {row['skipped'][:100]}")
        del sets, inputs, ref, fp8
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return n_rows


def anchor_rows(spec: GridSpec, shape: VerifyShape, inputs: VerifyInputs, ref: torch.Tensor,
                sets: Optional[list[VerifyInputs]], base: dict, peaks: dict[str, float], device: torch.device,
                seed: int) -> list[dict[str, Any]]:
    """Rows of the anchor kernels on this case: measured and checked like ours, or skipped with the reason.

    sglang_splitkv runs as page_size 1 (token table) on every layout; flashinfer_mla as page_size 1 and, where
    the layout has a block table, page_size 64. An anchor that fails (import, JIT, launch) is a row with its error.
    """
    from specdiag.kernels.anchors import (FlashInferMLA, cannot, load_sglang_verify,  # noqa: PLC0415
                                          run_sglang_verify, sglang_verify_args)

    rows: list[dict[str, Any]] = []
    for anchor in [*spec.anchors, *[a for a in spec.anchors_off if a not in spec.anchors]]:
        pages = [1] if anchor == "sglang_splitkv" else [1] + ([64] if shape.layout != "shuffled_p1" else [])
        for page in pages:
            name = f"{anchor}_{'p1' if page == 1 else 'b64'}"
            row = {**base, "ts_unix_s": time.time(), "kernel": name, "design": "anchor", "page_size": page,
                   "impl": "cuda" if device.type == "cuda" else None, "config": None, "skipped": None, "kv_dtype": "bf16"}
            reason = spec.anchors_off.get(anchor) if anchor not in spec.anchors else cannot(anchor, inputs, page)
            if reason is None and device.type != "cuda":
                reason = "anchor kernels run on CUDA only (SGLang's Triton kernel, FlashInfer's CUDA kernels)"
            if reason is not None:
                row["skipped"] = reason
                rows.append(row)
                continue
            try:
                if sets is None:
                    sets = rotation_sets(inputs, spec.rotate_bytes, seed)
                outs = [s.out_like() for s in sets]
                if anchor == "sglang_splitkv":
                    mod = load_sglang_verify()
                    prepared = [sglang_verify_args(s, o) for s, o in zip(sets, outs)]
                    calls = [(lambda a=a, k=k: run_sglang_verify(mod, a, k)) for a, k in prepared]
                    row["anchor_source"] = str(mod.__file__)
                else:
                    wrappers = [FlashInferMLA(s, page) for s in sets]
                    calls = [(lambda w=w, o=o: w(o)) for w, o in zip(wrappers, outs)]
                row.update(measure_calls(calls, outs, ref, spec, peaks, shape))
                row["n_rotation_sets"] = len(sets)
                if not row["correct"]:
                    row["error"] = f"wrong result: rel_err {row['rel_err']:.3g} > {spec.tol} or {row['unwritten']} unwritten"
            except Exception as exc:  # noqa: BLE001 - an anchor that cannot start is a row, not a crash
                row["error"] = repr(exc)[:500]
            row["ts_unix_s"] = time.time()
            rows.append(row)
    return rows


def measure_calls(calls: list[Callable[[], object]], outs: list[torch.Tensor], ref: torch.Tensor, spec: GridSpec,
                  peaks: dict[str, float], shape: VerifyShape) -> dict[str, Any]:
    """Check the first call's output (NaN-poisoned before it runs) against the reference, then time the calls."""
    outs[0].fill_(float("nan"))
    calls[0]()
    torch.cuda.synchronize(outs[0].device)
    err = relative_error(outs[0], ref)
    unwritten = int(torch.isnan(outs[0]).sum())
    row: dict[str, Any] = {"rel_err": err, "unwritten": unwritten, "correct": bool(err <= spec.tol and unwritten == 0)}
    samples = time_calls(calls, n_runs=spec.n_runs, n_warmup=spec.n_warmup, device=outs[0].device)
    row.update(summarize_ms(samples))
    row["ms_samples"] = [round(x, 5) for x in samples]
    row.update(derived_metrics(shape.n_kv, shape.heads, shape.draft_tokens, row["ms_median"], peaks["copy_gbps"],
                               peaks["matmul_tflops"]))
    return row


# --- provenance and the command line --------------------------------------------------------------

def device_provenance(device: torch.device) -> dict[str, Any]:
    """GPU, driver, CUDA, torch and Triton versions (what a reader needs to reproduce the numbers)."""
    info: dict[str, Any] = {"torch": torch.__version__, "python": platform.python_version(),
                            "date_utc": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")}
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        info.update(gpu=props.name, sm_count=props.multi_processor_count, capability=f"{props.major}.{props.minor}",
                    gpu_memory_bytes=props.total_memory, cuda=torch.version.cuda,
                    l2_cache_bytes=getattr(props, "L2_cache_size", None))
        try:
            import triton  # noqa: PLC0415

            info["triton"] = triton.__version__
        except ImportError:
            info["triton"] = None
        try:
            q = subprocess.run(["nvidia-smi", "--query-gpu=driver_version,clocks.max.sm,clocks.max.mem,power.limit",
                                "--format=csv,noheader"], capture_output=True, text=True, timeout=20)
            info["nvidia_smi"] = q.stdout.strip()
            info["driver"] = q.stdout.split(",")[0].strip() if q.stdout else None
        except (OSError, subprocess.SubprocessError) as exc:
            info["driver"] = f"unknown ({exc!r})"
    else:
        info.update(gpu=None, cpu=platform.processor() or platform.machine())
    return info


COPY_TABLE = "kernel_ab_copy"
FLASHINFER_OFF = ("not run in this call: FlashInfer JIT-compiles its MLA kernels with nvcc on first use (minutes on a "
                  "bare machine, over a 240 s device call); run the harness with --flashinfer where it can")


def measure_copy_by_size(run: Run, contexts: Sequence[int], device: torch.device, n_runs: int = 20) -> None:
    """A device copy moving as many bytes (read + write) as each context's KV read, into ``kernel_ab_copy``.

    The big-copy bandwidth is a ceiling for long streams; at 8k-64k contexts a verify call moves only
    9-75 MB, where launch and ramp-up cost a visible share even for a plain copy. These rows show
    what a single, simple memory-bound kernel reaches at the same traffic.
    """
    for ctx in sorted(contexts):
        traffic = kv_bytes(ctx)
        n = max(1, traffic // 4)  # bf16 elements copied: n*2 B read + n*2 B written = traffic
        src = torch.randn(n, device=device).to(torch.bfloat16)
        sets = [(src, torch.empty_like(src))] + [(torch.randn(n, device=device).to(torch.bfloat16),
                                                   torch.empty_like(src)) for _ in range(max(1, 180_000_000 // traffic))]
        ms = time_calls([(lambda a=a, b=b: b.copy_(a)) for a, b in sets], n_runs=n_runs, n_warmup=3, device=device)
        stats = summarize_ms(ms)
        run.append_row(COPY_TABLE, {"ts_unix_s": time.time(), "error": None, "context_tokens": ctx,
                                    "traffic_bytes": 4 * n, **stats,
                                    "gbps": 4 * n / (stats["ms_median"] * 1e-3) / 1e9})
        del sets, src


def measure_peaks(device: torch.device) -> dict[str, Any]:
    """The two ceilings, measured now (CUDA), or None-valued on the CPU."""
    if device.type != "cuda":
        return {"copy_gbps": float("nan"), "matmul_tflops": float("nan"), "source": "not measured (CPU)"}
    out = {**copy_bandwidth_gbps(device), **matmul_tflops(device), "source": "measured in this run"}
    return out


def measure(run: Run, spec: GridSpec, device: torch.device | str = "cuda", tune_first: bool = True,
            deadline_s: Optional[float] = None, progress: Optional[Callable[[str], None]] = None,
            copy_sizes: bool = True) -> int:
    """Everything one device run records into ``run``: peaks, copies of each context's size, tuning, the grid.

    Returns the number of kernel_ab rows written. On the CPU only the grid runs (torch implementations).
    """
    device = torch.device(device)
    say = progress or (lambda s: None)
    run.update(kind="kernel_ab", device=device_provenance(device),
               grid={k: getattr(spec, k) for k in ("contexts", "heads", "draft_tokens", "layouts", "kernels", "n_runs",
                                                   "n_warmup", "rotate_bytes", "tol", "baseline_max_ms", "required", "chain",
                                                   "anchors")})
    peaks = measure_peaks(device)
    if device.type == "cuda":
        peaks["sm_count"] = torch.cuda.get_device_properties(device).multi_processor_count
    run.update(peaks=dict(peaks))
    say(f"peaks: copy {peaks['copy_gbps']:.0f} GB/s, bf16 matmul {peaks['matmul_tflops']:.0f} TFLOPS")
    configs: Optional[Callable[[int], Any]] = None
    if device.type == "cuda":

        if copy_sizes:
            measure_copy_by_size(run, spec.contexts, device)
        if tune_first:
            tune_shapes = [VerifyShape(131072, 8, 1, "shuffled_p1"), VerifyShape(131072, 16, 1, "shuffled_p1"),
                           VerifyShape(131072, 8, 8, "shuffled_p1"), VerifyShape(131072, 16, 64, "shuffled_p1")]
            tuned = tune(tune_shapes, run, peaks, device, progress=progress)
            run.update(tuned_configs={str(r): c.as_dict() for r, c in tuned.items()})
            configs = config_picker(tuned)
    return run_grid(spec, run, peaks, device, configs=configs, deadline_s=deadline_s, progress=progress)


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m specdiag.kernels.harness", description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="run folder to write (created; rows appended)")
    ap.add_argument("--grid", choices=["full", "smoke"], default="full")
    ap.add_argument("--tune", action="store_true", help="tune split-KV launch parameters first (CUDA only)")
    ap.add_argument("--max-minutes", type=float, default=None, help="stop starting new cases after this long")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--contexts", type=str, default="", help="override the grid's contexts, e.g. 8192,131072")
    ap.add_argument("--heads", type=str, default="", help="override the grid's heads, e.g. 8,16")
    ap.add_argument("--draft-tokens", type=str, default="", help="override the grid's draft tokens, e.g. 1,8")
    ap.add_argument("--kernels", type=str, default="", help="override the kernel variants, e.g. split_p1,fused_p1")
    ap.add_argument("--chain", action="store_true", help="chain-shaped drafts (causal masks): anchors can run them")
    ap.add_argument("--sglang-anchor", action="store_true", help="run SGLang's upstream split-KV verify (anchors.py)")
    ap.add_argument("--flashinfer", action="store_true",
                    help="run FlashInfer's MLA paged attention (JIT-compiles with nvcc on first use: minutes)")
    ap.add_argument("--flashinfer-off", type=str, default="",
                    help="why FlashInfer is not run in this call (its rows carry this reason; default: not asked)")
    ap.add_argument("--cases", type=str, default="",
                    help="explicit cases context:heads:draft_tokens, comma-separated, measured in this order per layout")
    ap.add_argument("--layouts", type=str, default="", help="override the grid's layouts, e.g. shuffled_p1,shuffled_b64")
    ap.add_argument("--n-runs", type=int, default=None, help="timed runs per case (default: the grid's)")
    ap.add_argument("--no-copy-sizes", action="store_true", help="skip the copies of each context's KV traffic")
    args = ap.parse_args(argv)
    t0 = time.monotonic()
    deadline = t0 + 60 * args.max_minutes if args.max_minutes else None
    device = torch.device(args.device)
    spec = full_grid() if args.grid == "full" else smoke_grid()
    if args.layouts:
        spec.layouts = [x for x in args.layouts.split(",") if x.strip()]
    for attr, text in (("contexts", args.contexts), ("heads", args.heads), ("draft_tokens", args.draft_tokens)):
        if text:
            setattr(spec, attr, [int(x) for x in text.split(",") if x.strip()])
    if args.kernels:
        spec.kernels = [k for k in args.kernels.split(",") if k.strip()]
    spec.chain = spec.chain or args.chain
    spec.anchors = (["sglang_splitkv"] if args.sglang_anchor else []) + (["flashinfer_mla"] if args.flashinfer else [])
    if not args.flashinfer and (args.sglang_anchor or args.flashinfer_off):
        spec.anchors_off = {"flashinfer_mla": args.flashinfer_off or FLASHINFER_OFF}
    if args.cases:
        spec.cases = [tuple(int(v) for v in c.split(":")) for c in args.cases.split(",") if c.strip()]
    if args.n_runs:
        spec.n_runs = args.n_runs
    bad_layouts = [x for x in spec.layouts if x not in VARIANTS_BY_LAYOUT]
    if bad_layouts:
        raise SystemExit(f"unknown layout(s) {bad_layouts}; choose from {sorted(VARIANTS_BY_LAYOUT)} (--layouts)")
    missing = kernels_not_run(spec.kernels, spec.layouts)
    if missing:
        raise SystemExit(f"kernel(s) {missing} would not run on layouts {spec.layouts}: unknown names, or 64-token "
                         f"kernels on shuffled_p1 alone; fix --kernels or --layouts (known kernels: "
                         f"{', '.join(VARIANTS_BY_LAYOUT['shuffled_b64'])})")
    run = Run.create(args.out, label="kernel-ab")
    command = " ".join([os.path.basename(sys.executable), "-m", "specdiag.kernels.harness", *(argv or sys.argv[1:])])
    run.update(command=command)
    n = measure(run, spec, device, tune_first=args.tune, deadline_s=deadline, progress=lambda s: print(s, flush=True),
                copy_sizes=not args.no_copy_sizes)
    run.update(finished_utc=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
               wall_s=round(time.monotonic() - t0, 1))
    print(f"wrote {n} rows to {run.table_path(TABLE)} in {time.monotonic() - t0:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
