"""What Triton makes of the split-KV kernels for sm_90, without a GPU: shared memory, registers, spills, and how
the KV tile reaches the tensor cores (issue 13's reading of run 4, docs/kernel-notes.md "Run 4 outcome").

Compiles ``triton_fused._fused_kernel`` (bf16 or fp8 KV, bf16 partials) and ``triton_splitkv._split_partial_kernel``
(fp32 partials, as the harness runs it) ahead of time for sm_90 with the installed Triton (run 4: 3.6.0), pointers,
``tokens_per_split`` and ``stride_kv`` marked divisible by 16 as at run time, then counts in the TTGIR of the main
(full-tile) loop the KV loads that are async copies (prefetched by the pipeliner) vs plain loads, the ``fp_to_fp``
conversions, and the buffers allocated for them; ``ptxas -v`` gives registers and spill bytes.

    python scripts/kernel_compile_report.py            # the default configurations of 16-row and 64-row tiles

Under 64 rows the fp8 kernel is compiled in its scores-as-K-Q^T form (FP8_KQ, run 5); the merge loops with the
pipeline depth the kernel uses (splitkv_plan.merge_stages) unless ``merge_stages_n`` is given.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "lib"))


@dataclass(frozen=True)
class CompiledReport:
    kernel: str  #: "fused" or "split"
    kv: str  #: "bf16" or "fp8"
    block_m: int
    block_n: int
    num_warps: int
    num_stages: int
    shared_bytes: int
    registers: int
    spill_store_bytes: int
    spill_load_bytes: int
    loop_async_copies: int  #: async copies (cp.async) in the full-tile loop: prefetched loads
    loop_plain_kv_loads: int  #: plain tt.load of KV tiles (not index loads) in the full-tile loop
    loop_fp_to_fp: int  #: fp8 -> 16-bit conversions in the full-tile loop
    kv_buffers: int  #: leading dim of the latent-tile shared buffer allocated before the loop (0: none)
    merge_cg_loads: int  #: plain .cg loads from the first one on (the fused kernel's merge loops; 0 for split)
    merge_async_copies: int  #: async copies from there on (0: the merge loads are not prefetched)
    qk_warps: str  #: warpsPerCTA of the Q K^T dot's wgmma layout, "8x1": with 64 rows and 8 warps both warpgroups
    #: compute the whole score tile (Triton lays a dot whose result feeds another dot out as numWarps x 1); "" for mma.sync
    qk_instr_n: int  #: N of the Q K^T wgmma instruction (m64nNk16; 0 for mma.sync): smaller N re-reads the Q tile more
    pv_warps: str  #: warpsPerCTA of the P V dot's wgmma layout ("4x2": each warpgroup 256 of the 512 value dims)
    loop_async_wait: int  #: outstanding copy groups the full-tile loop's async_wait allows (0: it waits for every copy)
    qk_once: bool = False  #: split kernel with P and alpha through the scratch (triton_splitkv qk_once, run 6)


def _first_loop(ttgir: str) -> str:
    """The text of the first scf.for (the full-tile loop) up to its scf.yield."""
    start = ttgir.index("scf.for")
    end = ttgir.index("scf.yield", start)
    return ttgir[start:end]


def compile_report(kernel: str, kv: str, block_m: int, block_n: int, num_warps: int, num_stages: int,
                   merge_stages_n: int | None = None, qk_once: bool = False) -> CompiledReport:
    import triton  # noqa: PLC0415
    from triton.backends.compiler import GPUTarget  # noqa: PLC0415
    from triton.backends.nvidia.compiler import get_ptxas  # noqa: PLC0415
    from triton.compiler import ASTSource  # noqa: PLC0415

    if kernel not in ("fused", "split") or kv not in ("bf16", "fp8") or (kernel == "split" and kv == "fp8"):
        raise ValueError(f"kernel must be fused (bf16 or fp8 KV) or split (bf16 KV); got {kernel!r}, {kv!r}")
    if qk_once and kernel != "split":
        raise ValueError("qk_once is a form of the split kernel")
    if kernel == "fused":
        from specdiag.kernels.triton_fused import _fused_kernel as fn  # noqa: PLC0415
        from specdiag.kernels.triton_fused import merge_stages  # noqa: PLC0415

        ptr = {"Q": "*bf16", "KV": "*fp8e4nv" if kv == "fp8" else "*bf16", "TOKEN_TABLE": "*i64", "BLOCK_TABLE": "*i32",
               "MASK": "*u8", "O_PART": "*bf16", "LSE_PART": "*fp32", "G_PART": "*fp32", "G_LSE": "*fp32",
               "COUNTER": "*i32", "OUT": "*bf16"}
        const = {"PAGE_SIZE": 1, "BLOCK_M": block_m, "BLOCK_N": block_n, "D_NOPE": 512, "D_PE": 64,
                 "KV_FP8": kv == "fp8", "FP8_KQ": kv == "fp8" and block_m < 64, "DIRECT": False, "GROUP": 16,
                 "MERGE_STAGES": merge_stages(block_m) if merge_stages_n is None else merge_stages_n, "SELF_MERGE": True}
    else:
        from specdiag.kernels.triton_splitkv import _split_partial_kernel as fn  # noqa: PLC0415

        ptr = {"Q": "*bf16", "KV": "*bf16", "TOKEN_TABLE": "*i64", "BLOCK_TABLE": "*i32", "MASK": "*u8",
               "O_PART": "*fp32", "LSE_PART": "*fp32", "P_SCR": "*fp32"}
        const = {"PAGE_SIZE": 1, "BLOCK_M": block_m, "BLOCK_N": block_n, "D_NOPE": 512, "D_PE": 64, "EVICT": "",
                 "DIRECT": False, "DV_SPLIT": 1, "QK_ONCE": qk_once, "ASM": qk_once, "PDL": False, "TIMELINE": False}
    names = fn.arg_names
    sig = {n: "constexpr" if n in const else ptr.get(n, "fp32" if n in ("qk_scale", "v_scale") else "i32") for n in names}
    attrs = {(names.index(n),): [["tt.divisibility", 16]] for n in [*ptr, "tokens_per_split", "stride_kv"]}
    k = triton.compile(ASTSource(fn, sig, const, attrs), target=GPUTarget("cuda", 90, 32),
                       options={"num_warps": num_warps, "num_stages": num_stages})
    ttgir, ptx = k.asm["ttgir"], k.asm["ptx"]
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "k.ptx"
        src.write_text(ptx)
        res = subprocess.run([get_ptxas(90).path, "-v", "-arch=sm_90a", str(src), "-o", str(Path(tmp) / "k.cubin")],
                             capture_output=True, text=True, check=True)
    info = res.stdout + res.stderr
    regs = int(re.search(r"Used (\d+) registers", info).group(1))
    spills = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", info)
    loop = _first_loop(ttgir)
    kv_loads = [line for line in loop.splitlines() if "tt.load" in line and "x512x!tt.ptr" in line]
    prologue = ttgir[:ttgir.index("scf.for")]
    bufs = re.findall(r"local_alloc : \(\) -> !ttg.memdesc<(\d+)x\d+x512x", prologue)
    # the merge loops (fused only) follow the first load with the .cg cache modifier: their loads and async copies
    merge = ttgir[ttgir.index("cacheModifier = cg"):] if "cacheModifier = cg" in ttgir else ""
    # the dots of the full-tile loop: the first (Q K^T) and the last (P V), by the layout name of their results
    wgmma = r"^#(mma\d*) = #ttg.nvidia_mma<\{versionMajor = 3, versionMinor = \d+, warpsPerCTA = \[(\d+), (\d+)\], " \
            r"instrShape = \[16, (\d+), 16\]"
    layouts = {name: (f"{wm}x{wn}", int(n)) for name, wm, wn, n in re.findall(wgmma, ttgir, re.M)}
    dots = re.findall(r"warp_group_dot %[^\n]*-> tensor<\d+x\d+xf32, #(mma\d*)>", loop)
    qk = layouts.get(dots[0], ("", 0)) if dots else ("", 0)
    pv = layouts.get(dots[-1], ("", 0)) if dots else ("", 0)
    waits = [int(n) for n in re.findall(r"async_wait [^\n]*\{num = (\d+)", loop)]
    return CompiledReport(
        kernel=kernel, kv=kv, block_m=block_m, block_n=block_n, num_warps=num_warps, num_stages=num_stages,
        shared_bytes=int(k.metadata.shared), registers=regs,
        spill_store_bytes=int(spills.group(1)) if spills else 0, spill_load_bytes=int(spills.group(2)) if spills else 0,
        loop_async_copies=loop.count("async_copy_global_to_local"), loop_plain_kv_loads=len(kv_loads),
        loop_fp_to_fp=loop.count("tt.fp_to_fp"), kv_buffers=int(bufs[0]) if bufs else 0,
        merge_cg_loads=merge.count("cacheModifier = cg"), merge_async_copies=merge.count("async_copy_global_to_local"),
        qk_warps=qk[0], qk_instr_n=qk[1], pv_warps=pv[0], loop_async_wait=max(waits) if waits else 0, qk_once=qk_once)


#: (block_m, block_n, num_warps, num_stages): splitkv_plan.default_config for <= 16 rows and for 33-128 rows.
DEFAULT_TILES = ((16, 64, 4, 2), (64, 64, 8, 3))
#: the fp8 tiles default_fused_config(rows, kv_fp8=True) picks for the same rows (run 5; run 4 ran the tiles above)
FP8_TILES = ((16, 32, 4, 3), (64, 64, 8, 5))
#: run 6's 64-row tiles of the split kernel (block_m, block_n, warps, stages, qk_once; dispatch: split_n32s5_p1,
#: split_qk1_p1) and the ones these facts rule out (docs/kernel-notes.md "Run 6 (planned)")
RUN6_TILES = ((64, 32, 8, 5, False), (64, 32, 8, 5, True), (64, 64, 8, 3, True), (64, 32, 8, 3, False),
              (64, 32, 8, 7, False), (64, 64, 4, 3, False), (64, 64, 16, 2, False), (64, 128, 8, 2, False))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.parse_args(argv)
    cols = list(CompiledReport.__dataclass_fields__)
    print("\t".join(cols))
    for tile, fp8_tile in zip(DEFAULT_TILES, FP8_TILES):
        for kernel, kv, t in (("split", "bf16", tile), ("fused", "bf16", tile), ("fused", "fp8", tile),
                              ("fused", "fp8", fp8_tile)):
            r = compile_report(kernel, kv, *t)
            print("\t".join(str(v) for v in asdict(r).values()), flush=True)
    for *t, qk_once in RUN6_TILES:
        r = compile_report("split", "bf16", *t, qk_once=qk_once)
        print("\t".join(str(v) for v in asdict(r).values()), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
