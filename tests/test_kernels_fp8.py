"""On the CPU: the pick's rows-as-N kernel on the fp8 cache (gluon.fp8). Triton's interpreter does not
run Gluon, so here: each form compiles for sm_90 with the shared memory, tensor-core instructions, conversions and
registers its design says; bad calls are refused before any launch; the fp16 scale's bits. Correctness and times on
the GPU: tests/test_kernels_gpu.py (fp8), docs/kernel-notes.md runs 47-51.
"""

from __future__ import annotations

import collections
import importlib.util
import re
import subprocess
import tempfile
from pathlib import Path

import pytest
import torch

from specdiag.kernels.plan import SHARED_LIMIT_SM90

HAS_TRITON = importlib.util.find_spec("triton") is not None
needs_triton = pytest.mark.skipif(not HAS_TRITON, reason="triton is not installed here")


def _ptxas_spill_bytes(ptx: str) -> int:
    from triton.backends.nvidia.compiler import get_ptxas

    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "k.ptx"
        src.write_text(ptx)
        res = subprocess.run([get_ptxas(90).path, "-v", "-arch=sm_90a", str(src), "-o", str(Path(tmp) / "k.cubin")],
                             capture_output=True, text=True)
    assert res.returncode == 0, res.stderr[-2000:]
    spills = [int(m) for m in re.findall(r"(\d+) bytes spill stores", res.stderr + res.stdout)]
    assert spills, res.stderr[-2000:]
    return max(spills)


def test_fp8_row_tiles_start_at_a_draft_token_or_stay_inside_one() -> None:
    """Up to 32 rows one tile; above, whole draft tokens' rows (8 heads: 32, 5 heads: 30), or with more heads than 32
    the largest divisor of the heads (40: 20, 128: 32), so every tile's first row is a draft token's first row or
    every row of the tile belongs to one draft token; bad counts are refused."""
    from specdiag.kernels.gluon.ragged import FP8_TILE_MAX_ROWS, fp8_tile_rows

    assert FP8_TILE_MAX_ROWS == 32
    assert [fp8_tile_rows(h, r) for h, r in ((8, 8), (8, 32), (8, 64), (16, 1024), (5, 40), (40, 40), (128, 256),
                                             (7, 49))] == [8, 32, 32, 32, 30, 20, 32, 28]
    for heads in range(1, 130):
        for draft in (1, 2, 3, 8):
            rows = heads * draft
            tr = fp8_tile_rows(heads, rows)
            assert 1 <= tr <= 32
            for row0 in range(0, rows, tr):
                same_token = row0 // heads == (min(row0 + tr, rows) - 1) // heads
                assert rows <= 32 or row0 % heads == 0 or same_token, (heads, draft, row0)
    with pytest.raises(ValueError, match="positive"):
        fp8_tile_rows(0, 8)


@pytest.mark.slow
@needs_triton
def test_ragged_fp8_kernel_at_an_n_of_32() -> None:
    """Above 16 rows the fp8 ragged kernel's tiles are 32 rows (68 m64n32k16 fp16 wgmmas a tile) in the direct ring
    d2 (``FP8_N32_RING``: two loading warpgroups, no cp.async), within sm_90's shared memory, with the registers of
    ``FP8_N32_REGS`` and a spill of at most 80 B (76 at its best split)."""
    from specdiag.kernels.gluon.ragged import FP8_N32_REGS, FP8_N32_RING, compile_sm90

    assert FP8_N32_RING == "d2"
    k = compile_sm90(qo_indptr="i64", kv_indptr="i32", fp8_rows=64)
    assert k.metadata.shared <= SHARED_LIMIT_SM90
    ptx = k.asm["ptx"]
    wgmma = r"wgmma\.mma_async\.sync\.aligned\.(m\d+n\d+k\d+\.f32\.f16\.f16)"
    assert collections.Counter(re.findall(wgmma, ptx)) == {"m64n32k16.f32.f16.f16": 68}
    assert ptx.count("cp.async.cg") == 0
    regs = [int(n) for n in re.findall(r"setmaxnreg\.\w+\.sync\.aligned\.u32 \t?(\d+)", ptx)]
    assert set(FP8_N32_REGS) <= set(regs)
    assert _ptxas_spill_bytes(ptx) <= 80


@pytest.mark.slow
@needs_triton
@pytest.mark.parametrize("rows, qo, max_spill", [(8, "i32", 0), (8, "i64", 0), (16, "i32", 8), (16, "i64", 8), (5, "i64", 0)])
def test_ragged_fp8_kernel_compiles_for_sm90_as_the_dense_fp8_pick(rows: int, qo: str, max_spill: int) -> None:
    """The plugin's fp8 kernel (gluon.ragged ``_fp8_ragged_partial_kernel``: SGLang's ragged layout, lengths read on
    the device) with the index dtypes SGLang passes: the dense fp8 pick's ring for the rows (s22 at N 8, d2 at N 16),
    its 68 fp16 wgmmas, conversions and copies, shared memory within 64 B of the dense kernel's, more 64-bit index
    loads (the prefix's and the draft tokens' tables). ptxas spills 8 B at N 16 (the dense kernel none), as the bf16
    ragged kernel spills 32 B beside its dense one: the request's offsets kept live."""
    from specdiag.kernels.gluon.fp8 import DEFAULT_RINGS, compile_sm90 as dense_sm90
    from specdiag.kernels.gluon.ragged import compile_sm90

    rn = 8 if rows <= 8 else 16
    k, dense = compile_sm90(qo_indptr=qo, kv_indptr=qo, fp8_rows=rows), dense_sm90(rn, DEFAULT_RINGS[rn])
    assert abs(k.metadata.shared - dense.metadata.shared) <= 64 and k.metadata.shared <= SHARED_LIMIT_SM90
    ptx, dptx = k.asm["ptx"], dense.asm["ptx"]
    wgmma = r"wgmma\.mma_async\.sync\.aligned\.(m\d+n\d+k\d+\.f32\.f16\.f16)"
    assert collections.Counter(re.findall(wgmma, ptx)) == {f"m64n{rn}k16.f32.f16.f16": 68}
    for op in (r"cvt\.rn\.f16x2\.e4m3x2", r"cp\.async\.cg", r"setmaxnreg"):
        assert len(re.findall(op, ptx)) == len(re.findall(op, dptx)), op
    b64 = r"ld\.global(?:\.[a-z0-9]+)*\.b64"
    assert len(re.findall(b64, ptx)) > len(re.findall(b64, dptx))
    assert _ptxas_spill_bytes(ptx) <= max_spill


def test_ragged_fp8_launcher_refuses_bad_calls_before_any_launch() -> None:
    """A bf16 cache, fp16 q, a scale past fp16's range, too few draft slots: refused with the fix, before any allocation or launch (CPU tensors: a launch would fail otherwise); off
    sm_90 the plugin's check says why the fp8 kernel cannot run."""
    pytest.importorskip("triton.experimental.gluon")
    from specdiag.kernels.gluon.ragged import ragged_split_kv_gluon_fp8
    from specdiag.kernels.verify import gluon_fp8_supported

    def call(heads=8, draft=1, qd=torch.bfloat16, kvd=torch.float8_e4m3fn, scale=1.0, loc_n=None):
        tokens = draft
        q = torch.zeros(tokens, heads, 576, dtype=qd)
        kv = torch.zeros(100, 1, 576, dtype=torch.uint8).view(kvd) if kvd == torch.float8_e4m3fn else \
            torch.zeros(100, 1, 576, dtype=kvd)
        o = torch.zeros(tokens, heads, 512, dtype=qd)
        i32 = torch.tensor([0, tokens], dtype=torch.int32)
        loc = torch.arange(tokens if loc_n is None else loc_n)
        ragged_split_kv_gluon_fp8(q, kv, o, i32, torch.tensor([0, 50], dtype=torch.int32), torch.arange(50), loc,
                                  torch.ones(tokens * (50 + tokens), dtype=torch.bool), torch.tensor([0, 0]),
                                  max_draft=draft, sm_scale=0.1, kv_scale=scale, num_sms=4)

    for kw, match in ((dict(kvd=torch.bfloat16), "float8_e4m3fn cache"), (dict(qd=torch.float16), "bf16"),
                      (dict(scale=200.0), "kv_scale must be in"), (dict(loc_n=0), "a cache slot per query token")):
        with pytest.raises(ValueError, match=match):
            call(**kw)
    ok, why = gluon_fp8_supported(torch.zeros(1, 8, 576, dtype=torch.bfloat16),
                                  torch.zeros(4, 576, dtype=torch.uint8).view(torch.float8_e4m3fn))
    assert not ok and why == "not a CUDA device"


def test_fp8_launcher_refuses_the_cpu_and_a_ring_that_does_not_fit() -> None:
    pytest.importorskip("triton.experimental.gluon")
    from specdiag.kernels.gluon.fp8 import ring_for, split_kv_gluon_fp8
    from specdiag.kernels.mla import VerifyShape, make_inputs, with_fp8_cache

    x = make_inputs(VerifyShape(200, 8, 1, "shuffled_p1"))
    with pytest.raises(ValueError, match="CUDA"):
        split_kv_gluon_fp8(with_fp8_cache(x), x.out_like())
    with pytest.raises(ValueError, match="only at an N of 8"):  # the staged ring does not fit beside a 16-row Q
        ring_for(16, "s22")


def test_fp16_pair_bits_hold_the_rounded_scale_in_both_halves() -> None:
    from specdiag.kernels.gluon.fp8 import MAX_KV_SCALE, fp16_pair_bits

    assert fp16_pair_bits(1.0) == 0x3C003C00
    assert fp16_pair_bits(2.0) & 0xFFFF == 0x4000 and (fp16_pair_bits(2.0) >> 16) & 0xFFFF == 0x4000
    assert fp16_pair_bits(0.1) & 0xFFFF == int(torch.tensor(0.1, dtype=torch.float16).view(torch.int16))
    assert fp16_pair_bits(40000.0) == 0x78E278E2  # 40,000 rounds to 40,000 in fp16 (0x78E2)
    assert abs(MAX_KV_SCALE * 448.0 - 65504.0) < 1e-6
    for bad in (0.0, -1.0, 70000.0):
        with pytest.raises(ValueError, match="fp16 multiplier"):
            fp16_pair_bits(bad)
