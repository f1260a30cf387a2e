"""Hashes of the sm_90 code of every kernel configuration the SGLang plugin and the pick launch, compiled here
without a GPU (Triton's ahead-of-time compile for sm_90).

    python scripts/kernel_ptx_hashes.py              # print the hashes as JSON
    python scripts/kernel_ptx_hashes.py --check      # compare with tests/data/kernel-ptx-sm90.json (exit 1 if any differ)
    python scripts/kernel_ptx_hashes.py --write      # record them there (after a deliberate kernel change)

The hash is of the PTX with what does not change the code left out: debug sections, ``.loc`` / ``.file`` lines and
comments (file names and line numbers move when code moves between modules). A code move that leaves every hash
equal changed no kernel; tests/test_kernels_sm90.py runs --check (a slow test, ``make test-all``).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "lib"))
RECORD = ROOT / "tests" / "data" / "kernel-ptx-sm90.json"


def normalized_ptx(ptx: str) -> str:
    """The PTX without debug sections, .loc/.file lines, comments and blank lines."""
    out, skip = [], False
    for line in ptx.splitlines():
        s = line.strip()
        if s.startswith(".section") and "debug" in s:
            skip = True
        if skip:
            skip = s != "}"
            continue
        if s and not s.startswith((".loc", ".file", "//")):
            out.append(s)
    return "\n".join(out)


def ptx_hash(compiled: Any) -> str:
    return hashlib.sha256(normalized_ptx(compiled.asm["ptx"]).encode()).hexdigest()[:16]


def _triton_sm90(kernel: Any, ptr: dict, const: dict, warps: int) -> Any:
    import triton  # noqa: PLC0415
    from triton.backends.compiler import GPUTarget  # noqa: PLC0415
    from triton.compiler import ASTSource  # noqa: PLC0415

    sig = {n: "constexpr" if n in const else ptr.get(n, "i32") for n in kernel.arg_names}
    return triton.compile(ASTSource(kernel, sig, const), target=GPUTarget("cuda", 90, 32), options={"num_warps": warps})


def configurations() -> dict[str, Callable[[], Any]]:
    """Name -> a compile of one configuration: the plugin's Gluon kernels (bf16 rows-as-N at N 8 and 16, row-major;
    fp8 at 8, 16 and 64 rows; int32 and int64 qo_indptr as SGLang passes them eager and under CUDA graphs), its Triton
    fallback at its three row tiles with and without a logit cap, the pick's kernels (rows as N at 8 and 16, row-major
    with and without the early Q; fp8 at 8 and 16 rows in their rings) and both merge kernels in both forms."""
    from specdiag.kernels import gluon_ws as W  # noqa: PLC0415
    from specdiag.kernels import gluon_ws_fp8 as F  # noqa: PLC0415
    from specdiag.kernels import gluon_ws_ragged as R  # noqa: PLC0415
    from specdiag.kernels import gluon_ws_swap as S  # noqa: PLC0415
    from specdiag.kernels.triton_splitkv import _merge_kernel  # noqa: PLC0415
    from specdiag.kernels.triton_splitkv_ragged import _ragged_merge_kernel, _ragged_partial_kernel  # noqa: PLC0415

    c: dict[str, Callable[[], Any]] = {}
    for qo in ("i32", "i64"):
        c[f"plugin_bf16_rowsN8_qo{qo}"] = lambda qo=qo: R.compile_sm90(qo_indptr=qo, swap_rn=8)
        c[f"plugin_bf16_rowsN16_qo{qo}"] = lambda qo=qo: R.compile_sm90(qo_indptr=qo, swap_rn=16)
        c[f"plugin_bf16_rowmajor_qo{qo}"] = lambda qo=qo: R.compile_sm90(qo_indptr=qo)
        for rows in (8, 16, 64):
            c[f"plugin_fp8_rows{rows}_qo{qo}"] = lambda qo=qo, rows=rows: R.compile_sm90(qo_indptr=qo, fp8_rows=rows)
    c["pick_rowsN8"] = lambda: S.compile_sm90(rn=8)
    c["pick_rowsN16"] = lambda: S.compile_sm90(rn=16)
    c["pick_rowmajor_earlyq"] = lambda: W.compile_sm90(prefetch=True, draft_branch=True, fold=True, early_q=True)
    c["pick_rowmajor"] = lambda: W.compile_sm90(prefetch=True, draft_branch=True, fold=True)
    c["pick_fp8_rowsN8_s22"] = lambda: F.compile_sm90(rn=8, rings="s22")
    c["pick_fp8_rowsN16_d2"] = lambda: F.compile_sm90(rn=16, rings="d2")
    ptr = {"O_PART": "*fp32", "LSE_PART": "*fp32", "OUT": "*bf16", "QO_INDPTR": "*i32", "KV_INDPTR": "*i64"}
    for one in (False, True):
        for pdl in (False, True):
            c[f"merge_dense_one{int(one)}_pdl{int(pdl)}"] = lambda one=one, pdl=pdl: _triton_sm90(
                _merge_kernel, ptr, {"BLOCK_S": 512 if one else 64, "BLOCK_DV": 16 if one else 64, "D_V": 512,
                                     "PDL": pdl, "ONE_PASS": one}, 8 if one else 4)
            c[f"merge_ragged_one{int(one)}_pdl{int(pdl)}"] = lambda one=one, pdl=pdl: _triton_sm90(
                _ragged_merge_kernel, ptr, {"BLOCK_S": 512 if one else 256, "BLOCK_DV": 16, "D_V": 512, "ROUND": 64,
                                            "ONE_PASS": one, "PDL": pdl}, 8 if one else 4)
    ptr2 = {"Q": "*bf16", "K_EXT": "*bf16", "KV": "*bf16", "QO_INDPTR": "*i32", "KV_INDPTR": "*i32",
            "KV_INDICES": "*i64", "MASK": "*u8", "MASK_INDPTR": "*i64", "O_PART": "*fp32", "LSE_PART": "*fp32",
            "sm_scale": "fp32", "logit_cap": "fp32"}
    for bm in (16, 32, 64):
        for cap in (False, True):
            c[f"plugin_triton_bm{bm}_cap{int(cap)}"] = lambda bm=bm, cap=cap: _triton_sm90(
                _ragged_partial_kernel, ptr2, {"BLOCK_M": bm, "BLOCK_N": 64, "D_NOPE": 512, "D_PE": 64,
                                               "LOGIT_CAP": cap, "ROUND": 64}, 4 if bm < 64 else 8)
    return c


def hashes(progress: Callable[[str], None] = lambda s: None) -> dict[str, str]:
    out = {}
    for name, compile_ in configurations().items():
        out[name] = ptx_hash(compile_())
        progress(f"{name} {out[name]}")
    return out


def recorded() -> dict[str, Any]:
    return json.loads(RECORD.read_text())


def main(argv: list[str] | None = None) -> int:
    import triton  # noqa: PLC0415

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help=f"compare with {RECORD.relative_to(ROOT)}")
    ap.add_argument("--write", action="store_true", help=f"record the hashes in {RECORD.relative_to(ROOT)}")
    args = ap.parse_args(argv)
    now = hashes(progress=lambda s: print(s, file=sys.stderr, flush=True))
    if args.write:
        RECORD.write_text(json.dumps({"triton": triton.__version__, "hashes": now}, indent=1) + "\n")
        print(f"wrote {len(now)} hashes to {RECORD}")
        return 0
    if args.check:
        rec = recorded()
        differ = sorted(k for k in set(now) | set(rec["hashes"]) if now.get(k) != rec["hashes"].get(k))
        print(f"{len(now) - len(differ)} of {len(now)} configurations hash as recorded (Triton {triton.__version__}, "
              f"recorded with {rec['triton']})" + (f"; differ: {', '.join(differ)}" if differ else ""))
        return 1 if differ else 0
    print(json.dumps(now, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
