"""Hashes of the sm_90 code of every kernel configuration the SGLang plugin, the pick and the kernel A/B's Triton
arms launch, compiled here without a GPU (Triton's ahead-of-time compile for sm_90).

    python scripts/kernel_ptx_hashes.py              # print the hashes as JSON
    python scripts/kernel_ptx_hashes.py --check      # compare with tests/data/kernel-ptx-sm90.json (exit 1 if any differ)
    python scripts/kernel_ptx_hashes.py --write      # record them there (after a deliberate kernel change)
    python scripts/kernel_ptx_hashes.py --dump DIR   # also write each configuration's hashed PTX to DIR/<name>.ptx
    python scripts/kernel_ptx_hashes.py --ptxas prefill   # registers, spills, shared memory of the configurations
                                                          # whose name contains "prefill" (Triton's ptxas, sm_90a)

Where a hash changes, ``diff -r`` of two ``--dump`` folders (before and after) shows which instructions did.

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


def digest(normalized: str) -> str:
    return hashlib.sha256(normalized.encode()).hexdigest()[:16]


def ptx_hash(compiled: Any) -> str:
    return digest(normalized_ptx(compiled.asm["ptx"]))


def _triton_sm90(kernel: Any, ptr: dict, const: dict, warps: int, stages: int | None = None,
                 aligned: tuple[str, ...] = ()) -> Any:
    """``aligned``: arguments compiled as multiples of 16, as Triton's JIT specializes a pointer or an integer that is
    one at the launch (SGLang's tensors and their strides are)."""
    import triton  # noqa: PLC0415
    from triton.backends.compiler import GPUTarget  # noqa: PLC0415
    from triton.compiler import ASTSource  # noqa: PLC0415

    sig = {n: "constexpr" if n in const else ptr.get(n, "i32") for n in kernel.arg_names}
    attrs = {(kernel.arg_names.index(n),): [["tt.divisibility", 16]] for n in aligned}
    options = {"num_warps": warps} if stages is None else {"num_warps": warps, "num_stages": stages}
    return triton.compile(ASTSource(kernel, sig, const, attrs), target=GPUTarget("cuda", 90, 32), options=options)


def configurations() -> dict[str, Callable[[], Any]]:
    """Name -> a compile of one configuration: the plugin's Gluon kernels (bf16 rows-as-N at N 8 and 16, row-major;
    fp8 at 8, 16 and 64 rows; int32 and int64 qo_indptr as SGLang passes them eager and under CUDA graphs), its Triton
    fallback at its three row tiles with and without a logit cap, the pick's kernels (rows as N at 8 and 16, row-major
    with and without the early Q; fp8 at 8 and 16 rows in their rings), both merge kernels in both forms, and the
    kernel A/B's Triton arms: the baseline, and the split kernel at each tile of ``default_config`` on a token table
    and on 64-token pages; the MHA prefill kernel at its default configuration and in two TMA ones, the fastest
    measured on an H100 among them (:func:`prefill_sm90`)."""
    from specdiag.kernels.gluon import fp8 as F  # noqa: PLC0415
    from specdiag.kernels.gluon import ragged as R  # noqa: PLC0415
    from specdiag.kernels.gluon import swap as S  # noqa: PLC0415
    from specdiag.kernels.gluon import ws as W  # noqa: PLC0415
    from specdiag.kernels.merge import _merge_kernel, _ragged_merge_kernel  # noqa: PLC0415
    from specdiag.kernels.plan import default_config  # noqa: PLC0415
    from specdiag.kernels.triton import prefill as P  # noqa: PLC0415
    from specdiag.kernels.triton.baseline import _baseline_verify_kernel  # noqa: PLC0415
    from specdiag.kernels.triton.ragged import _ragged_partial_kernel  # noqa: PLC0415
    from specdiag.kernels.triton.splitkv import _split_partial_kernel  # noqa: PLC0415

    c: dict[str, Callable[[], Any]] = {}
    for qo in ("i32", "i64"):
        c[f"plugin_bf16_rowsN8_qo{qo}"] = lambda qo=qo: R.compile_sm90(qo_indptr=qo, swap_rn=8)
        c[f"plugin_bf16_rowsN16_qo{qo}"] = lambda qo=qo: R.compile_sm90(qo_indptr=qo, swap_rn=16)
        c[f"plugin_bf16_rowmajor_qo{qo}"] = lambda qo=qo: R.compile_sm90(qo_indptr=qo)
        for rows in (8, 16, 64):
            c[f"plugin_fp8_rows{rows}_qo{qo}"] = lambda qo=qo, rows=rows: R.compile_sm90(qo_indptr=qo, fp8_rows=rows)
    c["pick_rowsN8"] = lambda: S.compile_sm90(rn=8)
    c["pick_rowsN16"] = lambda: S.compile_sm90(rn=16)
    c["pick_rowmajor_earlyq"] = lambda: W.compile_sm90(early_q=True)
    c["pick_rowmajor"] = lambda: W.compile_sm90()
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
    ptr3 = {"Q": "*bf16", "KV": "*bf16", "TOKEN_TABLE": "*i64", "BLOCK_TABLE": "*i32", "MASK": "*u8",
            "O_PART": "*fp32", "LSE_PART": "*fp32", "OUT": "*bf16", "qk_scale": "fp32", "sm_scale": "fp32"}
    c["ab_baseline"] = lambda: _triton_sm90(_baseline_verify_kernel, ptr3, {"BLOCK_M": 32, "BLOCK_N": 64, "D_NOPE": 512,
                                                                           "D_PE": 64, "D_V": 512}, 8, 1)
    for rows in (8, 32, 64):  # default_config's tiles (its 64 rows at 2 stages compile to the code of 3 stages)
        cfg = default_config(rows)
        for page in (1, 64):
            c[f"ab_split_bm{cfg.block_m}_s{cfg.num_stages}_page{page}"] = lambda cfg=cfg, page=page: _triton_sm90(
                _split_partial_kernel, ptr3, {"PAGE_SIZE": page, "BLOCK_M": cfg.block_m, "BLOCK_N": cfg.block_n,
                                              "D_NOPE": 512, "D_PE": 64, "DIRECT": False}, cfg.num_warps,
                                             cfg.num_stages)
    for spec in (P.DEFAULT_CONFIG.spec, "128:128:8:2:tma", "128:64:8:3:tma"):
        c["prefill_" + spec.replace(":", "_")] = lambda spec=spec: prefill_sm90(spec)
    return c


def prefill_sm90(spec: str, cu_q: str = "*i64", cu_k: str = "*i64") -> Any:
    """The MHA prefill kernel in configuration ``spec`` compiled for sm_90 as SGLang launches it: causal with its lse,
    8 heads, ``cu_q``/``cu_k`` the offsets' types (SGLang's ``qo_indptr`` is int64 for a chunk's own part and a first
    chunk; a prefix chunk's offsets are int32)."""
    from specdiag.kernels.triton import prefill as P  # noqa: PLC0415

    pc = P.parse_config(spec)
    kern = P._prefill_fwd_kernel_tma if pc.tma else P._prefill_fwd_kernel
    # 8 heads: the lse [n, 8] has strides 8 (not aligned) and 1 (which Triton's JIT makes a constant)
    const = {"CAUSAL": True, "RETURN_LSE": True, "D1": 128, "D2": 64, "DV": 128, "BLOCK_M": pc.block_m,
             "BLOCK_N": pc.block_n, "stride_lh": 1}
    io = {"O": "*bf16", "LSE": "*fp32", "CU_Q": cu_q, "CU_K": cu_k, "qk_scale": "fp32"}
    if pc.tma:
        io |= {f"desc_{n}": f"tensordesc<bf16[{rows},{w}]>" for n, rows, w in
               (("q1", pc.block_m, 128), ("q2", pc.block_m, 64), ("k1", pc.block_n, 128), ("k2", pc.block_n, 64),
                ("v", pc.block_n, 128))}
    else:
        io |= {"Q": "*bf16", "K": "*bf16", "V": "*bf16"}
    aligned = tuple(n for n in kern.arg_names if n not in const and n != "stride_lt"
                    and (io.get(n, "").startswith("*") or n.startswith("stride")))
    return _triton_sm90(kern, io, const, pc.num_warps, pc.num_stages, aligned)


def hashes(progress: Callable[[str], None] = lambda s: None, dump: Path | None = None) -> dict[str, str]:
    """Name -> hash of every configuration; with ``dump`` each one's normalized PTX (what is hashed) written there."""
    out = {}
    for name, compile_ in configurations().items():
        ptx = normalized_ptx(compile_().asm["ptx"])
        out[name] = digest(ptx)
        if dump is not None:
            dump.mkdir(parents=True, exist_ok=True)
            (dump / f"{name}.ptx").write_text(ptx + "\n")
        progress(f"{name} {out[name]}")
    return out


def ptxas_usage(compiled: Any) -> dict[str, int]:
    """Registers per thread, spill bytes (stores + loads) and shared memory of one compile, from Triton's bundled
    ptxas run verbose on its PTX for sm_90a (what Triton's own launch would assemble)."""
    import re  # noqa: PLC0415
    import subprocess  # noqa: PLC0415
    import tempfile  # noqa: PLC0415

    import triton  # noqa: PLC0415

    ptxas = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas"
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "k.ptx"
        src.write_text(compiled.asm["ptx"])
        res = subprocess.run([str(ptxas), "-arch=sm_90a", "-v", str(src), "-o", str(Path(tmp) / "k.cubin")],
                             capture_output=True, text=True, check=True)
    text = res.stdout + res.stderr
    regs = re.search(r"Used (\d+) registers", text)
    spills = [int(x) for x in re.findall(r"(\d+) bytes spill (?:stores|loads)", text)]
    return {"registers": int(regs.group(1)) if regs else -1, "spill_bytes": sum(spills),
            "shared_bytes": int(compiled.metadata.shared)}


def recorded() -> dict[str, Any]:
    return json.loads(RECORD.read_text())


def main(argv: list[str] | None = None) -> int:
    import triton  # noqa: PLC0415

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help=f"compare with {RECORD.relative_to(ROOT)}")
    ap.add_argument("--write", action="store_true", help=f"record the hashes in {RECORD.relative_to(ROOT)}")
    ap.add_argument("--dump", type=Path, metavar="DIR", help="write each configuration's hashed PTX to DIR/<name>.ptx")
    ap.add_argument("--ptxas", metavar="PART", help="print registers, spills and shared memory of the configurations "
                    "whose name contains PART (\"\" for all) instead of hashes")
    args = ap.parse_args(argv)
    if args.ptxas is not None:
        for name, compile_ in configurations().items():
            if args.ptxas in name:
                u = ptxas_usage(compile_())
                print(f"{name:34s} {u['registers']:>3} registers  {u['spill_bytes']:>5} B spilled  "
                      f"{u['shared_bytes']:>7,} B shared")
        return 0
    now = hashes(progress=lambda s: print(s, file=sys.stderr, flush=True), dump=args.dump)
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
