"""Where the warp-specialized kernel's time goes per KV tile: each partition's loop phases in SM cycles (issue 13).

    python -m specdiag.kernels.ws_phases --out DIR --cases 131072:16:64,131072:8:8 [--variant split_gwp_p1]

For each case (context:heads:draft_tokens, page_size 1 on a token-shuffled cache, chain drafts) the variant's partial
kernel (lib/specdiag/kernels/gluon_ws.py) runs with ``TIMED``: every thread of both warpgroups reads ``%clock64``
around each phase of its loop and sums the cycles (``gluon_ws.PHASES``):

- warpgroup 0 (``softmax_wg``): waiting for the tile's copy, the scores (issue and wait), the mask and softmax,
  waiting for the worker to have read the last P, publishing P and the factors, its half of P V;
- warpgroup 1 (``copy_pv_wg``): waiting for P, its half of P V, freeing P, waiting for warpgroup 0 to free the buffer,
  issuing the refill's copy;
- for an fp8 arm (gluon_ws_fp8, on the fp8 copy of the case's inputs): warpgroup 0 as above, its copy wait the wait
  for a converted tile, and the converting warpgroup (``convert_wg``, ``gluon_ws_fp8.FP8_PHASES``) in place of
  warpgroup 1.

Rows (table ``kernel_ws_phases``, one per case and partition): cycles per tile of each phase and of the whole loop
(medians over programs of each program's median thread), the tiles per program, and the call's time untimed and timed
(CUDA events, medians of ``--n-runs``; the clock reads cost a little: the two show how much) and, from the torch
profiler, the untimed call's partial kernel, the gap and the merge kernel on the GPU (``prof_*_us``, medians of 10
calls): what a call pays beside its loop. The timed kernel spills a
few bytes (the untimed one does not); its phases are a reading of the design, not of the untimed kernel's exact time.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import os
import sys
import time
from typing import Any, Optional, Sequence

import numpy as np
import torch

from specdiag.kernels.mla import VerifyShape, make_inputs

TABLE = "kernel_ws_phases"


def phase_cycles(times: np.ndarray, phases: dict[str, tuple[str, ...]]) -> list[dict[str, Any]]:
    """Per partition: cycles per tile of each phase and of the loop, from a timed call's buffer.

    ``times``: [programs, 2, 8, threads] int64 (slots 0-5 the phases summed over the loop, 6 the loop, 7 the tiles).
    Each program's value is its median thread; the row holds the median (and p10/p90) over programs with tiles.
    """
    arr = np.asarray(times, dtype=np.int64)
    if arr.ndim != 4 or arr.shape[1] != 2 or arr.shape[2] < 8:
        raise ValueError(f"phase_cycles needs [programs, 2, 8 or more slots, threads]; got shape {arr.shape}")
    arr = arr[:, :, :8]
    rows = []
    for part, (name, names) in enumerate(phases.items()):
        per_prog = np.median(arr[:, part], axis=-1)  # [programs, 8]
        tiles = per_prog[:, 7]
        ok = tiles > 0
        if not ok.any():
            raise ValueError("no program of the timed call ran a tile")
        per_tile = per_prog[ok, :7] / tiles[ok, None]
        row: dict[str, Any] = {"partition": name, "programs": int(ok.sum()), "tiles_per_program": float(np.median(tiles[ok]))}
        for k, phase in enumerate(names):
            row[f"{phase}_cycles"] = float(np.median(per_tile[:, k]))
        row["loop_cycles"] = float(np.median(per_tile[:, 6]))
        row["loop_cycles_p10"] = float(np.quantile(per_tile[:, 6], 0.1))
        row["loop_cycles_p90"] = float(np.quantile(per_tile[:, 6], 0.9))
        row["phases_sum_cycles"] = float(sum(row[f"{p}_cycles"] for p in names))
        rows.append(row)
    return rows


def timeline_from_phases(times: Any, slots: dict[str, int]) -> dict[str, Any]:
    """Warpgroup 0's timeline in a timed call (``gluon_ws.TIMELINE_SLOTS`` of partition 0; each program's median
    thread), as ``anatomy.timeline_stats`` (entry to done: span, ramp, tail) plus, medians over programs in us:
    ``tl_q_p50_us`` entry to warpgroup 0's start (Q's load and the barriers), ``tl_first_p50_us`` entry to the first
    tile landed, ``tl_stream_p50_us`` first tile to the loop's end, ``tl_epilogue_p50_us`` the loop's end to the partial
    stored. Programs without tiles are left out."""
    from specdiag.kernels.anatomy import timeline_stats  # noqa: PLC0415
    from specdiag.stats import quantile  # noqa: PLC0415

    arr = np.asarray(times, dtype=np.int64)
    if arr.ndim != 4 or arr.shape[2] <= max(slots.values()):
        raise ValueError(f"timeline_from_phases needs [programs, 2, slots, threads] with slots {sorted(slots.values())}; "
                         f"got shape {arr.shape}")
    prog = np.median(arr[:, 0], axis=-1).astype(np.int64)  # [programs, slots]
    ok = prog[:, 7] > 0
    if not ok.any():
        raise ValueError("no program of the timed call ran a tile")
    col = {k: prog[ok, v].tolist() for k, v in slots.items()}
    out = timeline_stats(col["entry_ns"], col["loop_end_ns"], col["done_ns"], col["sm"])

    def p50(a: str, b: str) -> float:
        return quantile(sorted((y - x) / 1e3 for x, y in zip(col[a], col[b])), 0.5)

    out.update(tl_q_p50_us=p50("entry_ns", "start_ns"), tl_first_p50_us=p50("entry_ns", "first_tile_ns"),
               tl_stream_p50_us=p50("first_tile_ns", "loop_end_ns"), tl_epilogue_p50_us=p50("loop_end_ns", "done_ns"))
    return out


def parse_cases(text: str) -> list[VerifyShape]:
    out = []
    for item in filter(None, (c.strip() for c in text.split(","))):
        parts = item.split(":")
        if len(parts) != 3 or not all(p.isdigit() and int(p) > 0 for p in parts):
            raise ValueError(f"case {item!r}: write context:heads:draft_tokens, e.g. 131072:8:8")
        out.append(VerifyShape(int(parts[0]), int(parts[1]), int(parts[2]), "shuffled_p1"))
    if not out:
        raise ValueError("--cases is empty: give context:heads:draft_tokens, comma-separated")
    return out


def measure_case(shape: VerifyShape, variant_name: str, device: torch.device, n_runs: int) -> list[dict[str, Any]]:
    """The variant untimed and timed on one case (event times), and the timed call's phases per partition."""
    from specdiag.kernels.dispatch import (gluon_swap_call, gluon_ws_kwargs, resolve_config,  # noqa: PLC0415
                                           runs_gluon_swap, variant)
    from specdiag.kernels.gluon_ws import PHASES, TIMELINE_SLOTS, phase_buffer, split_kv_gluon_ws  # noqa: PLC0415
    from specdiag.kernels.timing import summarize_ms, time_calls  # noqa: PLC0415

    v = variant(variant_name)
    if v.impl != "gluon_ws" or v.gluon_overlap:
        raise ValueError(f"{variant_name} is not a warp-specialized arm without the overlap; use split_gwp_p1 or "
                         "split_gws_p1")
    rows = shape.heads * shape.draft_tokens
    cfg = resolve_config(variant_name, rows)
    x = make_inputs(shape, device=device, seed=shape.context_tokens)
    out = x.out_like()
    # the arm's own call, its merge included (the profile's merge and gap are the arm's): the fp8 rows-as-N kernel
    # for an fp8 arm (gluon_ws_fp8, on the fp8 copy of the inputs), the rows-as-N kernel where the arm runs it at these
    # rows (gluon_ws_swap, timed the same way), else gluon_ws's
    phases = PHASES
    if v.kv_fp8:
        from specdiag.kernels.dispatch import gluon_fp8_kwargs, unsupported_shape  # noqa: PLC0415
        from specdiag.kernels.gluon_ws_fp8 import FP8_PHASES, split_kv_gluon_fp8  # noqa: PLC0415
        from specdiag.kernels.mla import with_fp8_cache  # noqa: PLC0415

        reason = unsupported_shape(variant_name, rows)
        if reason:
            raise ValueError(reason)
        x = with_fp8_cache(x)
        kernel, kw, phases, form = split_kv_gluon_fp8, gluon_fp8_kwargs(v, cfg, rows), FP8_PHASES, "rows_as_n_fp8"
    elif runs_gluon_swap(v, rows):
        (kernel, kw), form = gluon_swap_call(v, cfg), "rows_as_n"
    else:
        kernel, kw, form = split_kv_gluon_ws, gluon_ws_kwargs(v, cfg, rows), "row_major"
    times = phase_buffer(x, cfg.block_n, cfg.num_stages, split_round_tokens=cfg.split_round_tokens)
    untimed = summarize_ms(time_calls([lambda: kernel(x, out, **kw)], n_runs=n_runs, device=device))
    timed = summarize_ms(time_calls([lambda: kernel(x, out, times=times, **kw)], n_runs=n_runs, device=device))
    torch.cuda.synchronize(device)
    from specdiag.kernels.anatomy import profiled_kernel_us  # noqa: PLC0415

    prof = profiled_kernel_us([lambda: kernel(x, out, **kw)], 10, device)
    base = {"context_tokens": shape.context_tokens, "heads": shape.heads, "draft_tokens": shape.draft_tokens,
            "layout": shape.layout, "kernel": variant_name, "kernel_form": form, "untimed_us": untimed["ms_median"] * 1e3,
            "timed_us": timed["ms_median"] * 1e3, "ts_unix_s": time.time(), "error": None, **prof}
    arr = times.cpu().numpy()
    tl = timeline_from_phases(arr, TIMELINE_SLOTS)  # warpgroup 0's, on its row
    return [{**base, **r, **(tl if r["partition"] == "softmax_wg" else {})} for r in phase_cycles(arr, phases)]


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m specdiag.kernels.ws_phases", description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="run folder (created if absent; rows appended to kernel_ws_phases)")
    ap.add_argument("--cases", required=True, help="context:heads:draft_tokens, comma-separated")
    ap.add_argument("--variant", default="split_gwp_p1", help="a warp-specialized arm without the overlap")
    ap.add_argument("--n-runs", type=int, default=20)
    args = ap.parse_args(argv)
    shapes = parse_cases(args.cases)  # bad input fails before the GPU is touched
    if not torch.cuda.is_available():
        print("ws_phases times a CUDA kernel: no CUDA device here", file=sys.stderr)
        return 2
    from tqdm import tqdm  # noqa: PLC0415

    from specdiag.kernels.harness import device_provenance  # noqa: PLC0415
    from specdiag.kernels.ws_phases_analysis import PHASES as ALL_PARTITION_PHASES  # noqa: PLC0415
    from specdiag.runs import Run  # noqa: PLC0415

    device = torch.device("cuda")
    run = Run.create(args.out, label="kernel-ws-phases")
    command = " ".join([os.path.basename(sys.executable), "-m", "specdiag.kernels.ws_phases", *(argv or sys.argv[1:])])
    if not run.meta.get("device"):
        run.update(kind="kernel_ws_phases", device=device_provenance(device))
    run.update(ws_phases_command=command)
    for shape in tqdm(shapes, desc="ws phases", file=sys.stdout):
        try:
            rows = measure_case(shape, args.variant, device, args.n_runs)
        except Exception as exc:  # noqa: BLE001 - a failed case is a row; the others still run
            rows = [{"context_tokens": shape.context_tokens, "heads": shape.heads, "draft_tokens": shape.draft_tokens,
                     "kernel": args.variant, "error": repr(exc)[:500], "ts_unix_s": time.time()}]
        for row in rows:
            run.append_row(TABLE, row)
            if row.get("error"):
                print(f"P={shape.context_tokens} H={shape.heads} T={shape.draft_tokens}: error {row['error']}")
                continue
            names = ALL_PARTITION_PHASES[row["partition"]]
            print(f"P={shape.context_tokens:>6} H={shape.heads:>3} T={shape.draft_tokens:>2} {row['partition']:<10} "
                  f"untimed {row['untimed_us']:.1f} us timed {row['timed_us']:.1f} us (GPU: partial "
                  f"{row['prof_partial_us']:.1f} gap {row['prof_gap_us']:.1f} merge {row['prof_merge_us']:.1f}), "
                  f"{row['tiles_per_program']:.0f} "
                  f"tiles/program; per tile: loop {row['loop_cycles']:.0f} cycles = "
                  + " + ".join(f"{p} {row[p + '_cycles']:.0f}" for p in names)
                  + (f"\n    timeline (timed call, us from the first entry): span {row['tl_span_us']:.1f}, entry to "
                     f"start (Q) {row['tl_q_p50_us']:.1f}, to first tile {row['tl_first_p50_us']:.1f}, stream "
                     f"{row['tl_stream_p50_us']:.1f}, epilogue {row['tl_epilogue_p50_us']:.1f}, done p50 "
                     f"{row['tl_done_p50_us']:.1f}, tail {row['tl_tail_us']:.1f}, ramp {row['tl_ramp_us']:.2f}"
                     if "tl_span_us" in row else ""), flush=True)
        torch.cuda.empty_cache()
    run.update(ws_phases_finished_utc=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
