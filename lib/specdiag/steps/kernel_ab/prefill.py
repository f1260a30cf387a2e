"""06's prefill cases: one 8k-token chunk of a long prompt in the MHA form, against prefixes of 16k-128k tokens.

    python -m specdiag.steps.kernel_ab.prefill --out RUN_DIR [--prefixes 16384,65536,122880] [--chunk 8192]
        [--heads 8] [--arms triton,flashinfer_ragged,sglang_extend] [--configs 128:64:8:3,128:128:8:2] [--n-runs 10]

Every arm computes the same thing, the attention of the chunk's queries over prefix + chunk with the chunk causal
(bottom-right aligned), q-k width 192, value width 128, one TP rank's heads (``specdiag.kernels.prefill``):

- ``triton``: specdiag's ragged flash-attention kernel (what the plugin serves with ``SPECDIAG_SGLANG_PREFILL=mha``),
  one arm per ``--configs`` entry (block_m:block_n:warps:stages) beside the default configuration;
- ``flashinfer_ragged``: FlashInfer's ``BatchPrefillWithRaggedKVCacheWrapper`` (what SGLang's FlashInfer backend runs
  in the MHA form), planned outside the timed call;
- ``sglang_extend``: SGLang's Triton ``extend_attention_fwd`` in the MHA form (the prefix read through a token table
  from a pool, the chunk from its own tensors).

Each is checked against the fp32 reference on ``CHECK_ROWS`` query rows (output and natural log-sum-exp where the arm
returns one), then timed as the verify cases are (``timing.time_replays``: CUDA-graph replays, L2 flushed). Rows go to
``kernel_ab_prefill`` with the FLOPs (640 per visible query-key pair and head) and TFLOP/s against the run's measured
bf16 matmul rate.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any, Callable, Mapping, Optional, Sequence

import torch

from specdiag.kernels.prefill import PrefillShape, make_inputs, reference
from specdiag.kernels.reference import relative_error
from specdiag.runs import Run
from specdiag.steps.kernel_ab.harness import device_provenance, measure_peaks
from specdiag.steps.kernel_ab.timing import L2Flush, time_replays

TABLE = "kernel_ab_prefill"
ARMS = ("triton", "flashinfer_ragged", "sglang_extend")
PREFIXES = (16384, 32768, 65536, 122880)  #: the chunk's prefix, tokens: the 3rd, 5th, 9th and 16th chunk of 128k
CHECK_ROWS = 256  #: query rows checked against the fp32 reference (a spread and the last)
TOL = 2e-2  #: relative error of the output allowed against the fp32 reference (bf16 inputs and output)


def parse_configs(text: str) -> list[Any]:
    """``"128:64:8:3,128:128:8:2:tma"`` -> PrefillConfigs (``parse_config``'s errors on bad input)."""
    from specdiag.kernels.triton.prefill import parse_config  # noqa: PLC0415 - loads triton (costly: ARCHITECTURE.md, Imports)

    return [parse_config(p) for p in text.split(",") if p.strip()]


def best_config(rows: Sequence[Mapping[str, Any]]) -> Optional[str]:
    """The fastest correct Triton configuration at the longest prefix measured (``block_m:...`` as the plugin's
    ``SPECDIAG_SGLANG_PREFILL_CONFIG`` takes it), or None where no Triton row there is correct and timed."""
    timed = [r for r in rows if str(r.get("arm", "")).startswith("triton") and r.get("correct") and r.get("ms_median")
             and r.get("config")]
    if not timed:
        return None
    longest = max(r["prefix_tokens"] for r in timed)
    best = min((r for r in timed if r["prefix_tokens"] == longest), key=lambda r: r["ms_median"])
    from specdiag.kernels.triton.prefill import PrefillConfig  # noqa: PLC0415 - loads triton (costly: ARCHITECTURE.md, Imports)

    return PrefillConfig(**best["config"]).spec


def config_arm(cfg: Any) -> str:
    return f"triton_m{cfg.block_m}_n{cfg.block_n}_w{cfg.num_warps}_s{cfg.num_stages}" + ("_tma" if cfg.tma else "")


def _triton_call(x: dict, cu_q, cu_k, out, cfg) -> Callable[[], object]:
    from specdiag.kernels.triton.prefill import prefill_triton  # noqa: PLC0415 - loads triton (costly: ARCHITECTURE.md, Imports)

    lse = torch.empty(out.shape[:2], dtype=torch.float32, device=out.device)
    x["lse_out"] = lse
    return lambda: prefill_triton(x["q"], x["k"], x["v"], cu_q, cu_k, x["q"].shape[0], True, x["sm_scale"], out=out,
                                  lse=lse, return_lse=True, cfg=cfg)


def _flashinfer_call(x: dict, cu_q, cu_k, out) -> Callable[[], object]:
    import flashinfer  # noqa: PLC0415 - loads flashinfer (costly: ARCHITECTURE.md, Imports)

    ws = torch.empty(256 << 20, dtype=torch.uint8, device=out.device)
    w = flashinfer.BatchPrefillWithRaggedKVCacheWrapper(ws, "NHD")
    heads = x["q"].shape[1]
    w.plan(cu_q, cu_k, heads, heads, x["q"].shape[-1], head_dim_vo=x["v"].shape[-1], causal=True,
           sm_scale=x["sm_scale"], q_data_type=x["q"].dtype)
    lse = torch.empty(out.shape[:2], dtype=torch.float32, device=out.device)
    x["lse_out"] = lse
    v = x["v"].contiguous()  # FlashInfer takes a dense v (SGLang passes kv_b_proj's view; .to(dtype) keeps strides)
    return lambda: w.run(x["q"], x["k"], v, out=out, lse=lse, return_lse=True)


def _sglang_extend_call(x: dict, shape: PrefillShape, out) -> Callable[[], object]:
    from sglang.kernels.ops.attention.extend_attention import extend_attention_fwd  # noqa: PLC0415 - live only: replay loads no server code

    dev = out.device
    p, c = shape.prefix_tokens, shape.chunk_tokens
    k_pool, v_pool = x["k"].contiguous(), x["v"].contiguous()  # the pool: prefix then chunk rows
    k_ext, v_ext = k_pool[p:], v_pool[p:]
    qo = torch.tensor([0, c], dtype=torch.int32, device=dev)
    kv_indptr = torch.tensor([0, p], dtype=torch.int32, device=dev)
    kv_indices = torch.arange(p, dtype=torch.int64, device=dev)
    lse = torch.empty(out.shape[:2], dtype=torch.float32, device=dev)
    x["lse_out"] = lse
    return lambda: extend_attention_fwd(x["q"], k_ext, v_ext, out, k_pool, v_pool, qo, kv_indptr, kv_indices, None,
                                        True, None, c, 1.0, 1.0, sm_scale=x["sm_scale"], lse_extend=lse)


def prepare(arm: str, x: dict, shape: PrefillShape, out: torch.Tensor, cfg: Any = None) -> Callable[[], object]:
    n_k = shape.prefix_tokens + shape.chunk_tokens
    cu_q = torch.tensor([0, shape.chunk_tokens], dtype=torch.int32, device=out.device)
    cu_k = torch.tensor([0, n_k], dtype=torch.int32, device=out.device)
    if arm.startswith("triton"):
        return _triton_call(x, cu_q, cu_k, out, cfg)
    if arm == "flashinfer_ragged":
        return _flashinfer_call(x, cu_q, cu_k, out)
    if arm == "sglang_extend":
        return _sglang_extend_call(x, shape, out)
    raise ValueError(f"unknown prefill arm {arm!r}; choose from {', '.join(ARMS)}")


def check_rows(n: int, device) -> torch.Tensor:
    return torch.unique(torch.cat([torch.linspace(0, n - 1, CHECK_ROWS - 1, device=device).long(),
                                   torch.tensor([n - 1], device=device)]))


def measure(run: Run, shapes: Sequence[PrefillShape], arms: Sequence[str], configs: Sequence[Any], device,
            n_runs: int = 10, peaks: Optional[dict] = None, progress: Callable[[str], None] = print,
            dtype: torch.dtype = torch.bfloat16) -> int:
    """Every arm on every shape into ``kernel_ab_prefill`` (module doc); returns the rows written. ``dtype`` bf16 as
    served (Triton's CPU interpreter computes bf16 wrongly: a CPU exercise passes fp16)."""
    from specdiag.kernels.triton.prefill import DEFAULT_CONFIG  # noqa: PLC0415 - loads triton (costly: ARCHITECTURE.md, Imports)

    device = torch.device(device)
    flush = L2Flush(device)
    peak = (peaks or {}).get("matmul_tflops")
    written = 0
    plan = [(a, None) for a in arms if a != "triton"]
    if "triton" in arms:
        plan = [("triton", DEFAULT_CONFIG)] + [(config_arm(c), c) for c in configs if c != DEFAULT_CONFIG] + plan
    for shape in shapes:
        x = make_inputs(shape, device=device, dtype=dtype)
        n_k = shape.prefix_tokens + shape.chunk_tokens
        rows = check_rows(shape.chunk_tokens, device)
        cu_q = torch.tensor([0, shape.chunk_tokens], dtype=torch.int32, device=device)
        cu_k = torch.tensor([0, n_k], dtype=torch.int32, device=device)
        ref_o, ref_lse = reference(x["q"], x["k"], x["v"], cu_q, cu_k, True, x["sm_scale"], rows=rows)
        flops = shape.flops()
        for arm, cfg in plan:
            row: dict[str, Any] = {"ts_unix_s": time.time(), "prefix_tokens": shape.prefix_tokens,
                                   "chunk_tokens": shape.chunk_tokens, "heads": shape.heads, "arm": arm,
                                   "config": cfg.as_dict() if cfg is not None else None, "flops": flops,
                                   "error": None}
            try:
                out = torch.full((shape.chunk_tokens, shape.heads, x["v"].shape[-1]), float("nan"),
                                 dtype=x["q"].dtype, device=device)
                call = prepare(arm, x, shape, out, cfg)
                call()
                torch.cuda.synchronize(device) if device.type == "cuda" else None
                err = relative_error(out[rows], ref_o)
                lse = x.pop("lse_out", None)
                fin = torch.isfinite(ref_lse)
                lse_err = float((lse[rows][fin] - ref_lse[fin]).abs().max()) if lse is not None else None
                row.update(rel_err=err, lse_abs_err=lse_err, unwritten=int(torch.isnan(out).sum()), tol=TOL,
                           correct=bool(err <= TOL and not torch.isnan(out).any()))
                if row["correct"]:
                    t = time_replays(call, flush, n_runs=n_runs)
                    tflops = flops / (t.summary["ms_median"] * 1e-3) / 1e12
                    row.update(t.summary, method=t.method, method_note=t.method_note or None,
                               samples_ms=[round(s, 5) for s in t.samples_ms], tflops=tflops,
                               pct_matmul=(100 * tflops / peak) if peak else None)
                else:
                    row["error"] = f"wrong result: rel. error {err:.3g} (tol {TOL})"
            except Exception as exc:  # noqa: BLE001 - the row says why
                row["error"] = f"{type(exc).__name__}: {' '.join(str(exc).split())[:400]}"
            run.append_row(TABLE, row)
            written += 1
            progress(f"prefill {shape.prefix_tokens:>7,} + {shape.chunk_tokens:,} {arm:>26}: "
                     + (f"{row['ms_median']:.3f} ms, {row['tflops']:.0f} TFLOP/s, err {row['rel_err']:.2e}"
                        if row.get("tflops") else f"ERROR {row['error']}"))
            del out
        del x
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return written


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m specdiag.steps.kernel_ab.prefill", description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True, help="the run folder (created, or appended to)")
    ap.add_argument("--prefixes", default=",".join(str(p) for p in PREFIXES), help="prefix tokens, comma-separated")
    ap.add_argument("--chunk", type=int, default=8192, help="the chunk's tokens (SGLang's chunked prefill size)")
    ap.add_argument("--heads", type=int, default=8, help="MHA heads on one GPU (Kimi K2.6 at TP8: 8)")
    ap.add_argument("--arms", default=",".join(ARMS))
    ap.add_argument("--configs", default="",
                    help="extra Triton configurations block_m:block_n:warps:stages[:tma]")
    ap.add_argument("--n-runs", type=int, default=10)
    ap.add_argument("--best", action="store_true",
                    help="measure nothing: print the fastest correct Triton configuration of the run at --out")
    a = ap.parse_args(argv)
    if a.best:
        best = best_config(Run.open(a.out).rows(TABLE)) if Path(a.out, "run.json").exists() else None
        if best is None:
            print(f"error: no correct, timed Triton prefill row in {a.out}", file=sys.stderr)
            return 1
        print(best)
        return 0
    try:
        prefixes = [int(p) for p in a.prefixes.split(",") if p.strip()]
        arms = [x.strip() for x in a.arms.split(",") if x.strip()]
        bad = [x for x in arms if x not in ARMS]
        if bad or not prefixes or min(prefixes) < 0:
            raise ValueError(f"unknown arm(s) {bad}; choose from {', '.join(ARMS)}" if bad else "give prefixes >= 0")
        configs = parse_configs(a.configs)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    run = Run.create(a.out)  # a kernel A/B run folder gains the prefill table beside its verify rows

    peaks = run.meta.get("peaks") or measure_peaks(device)
    run.update(prefill_command=" ".join(["python", "-m", "specdiag.steps.kernel_ab.prefill",
                                         *(argv if argv is not None else sys.argv[1:])]),
               prefill_peaks=peaks, prefill_device=device_provenance(device))
    shapes = [PrefillShape(prefix_tokens=p, chunk_tokens=a.chunk, heads=a.heads) for p in prefixes]
    n = measure(run, shapes, arms, configs, device, n_runs=a.n_runs, peaks=peaks)
    print(f"done: {n} {TABLE} rows in {run.path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
