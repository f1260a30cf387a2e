"""The split-KV merge kernels (merge._merge_kernel, merge._ragged_merge_kernel): the block per split count, and both forms run by
Triton's CPU interpreter against the merge written in torch."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton is not installed here")


def test_merge_block_takes_every_split_at_once_only_in_one_pass() -> None:
    from specdiag.kernels.plan import SplitKVConfig
    from specdiag.kernels.merge import MERGE_ONE_PASS_ELEMS, merge_block

    two, one = SplitKVConfig(merge_block_dv=64), SplitKVConfig(merge_block_dv=64, merge_one_pass=True)
    assert merge_block(129, two) == (64, 64, False)  # 3 steps of 64 splits, after a pass over the lse
    assert merge_block(129, one) == (256, 32, True)  # 128k h8T8: 129 splits in one round trip
    assert merge_block(8, one) == (8, 512, True)  # a whole row of values per program
    assert merge_block(1, one) == (2, 512, True)
    assert merge_block(600, one) == (64, 64, False)  # past 512 splits: the default
    for n in range(1, 513):
        s, dv, single = merge_block(n, one)
        assert single and s >= n and s * dv <= MERGE_ONE_PASS_ELEMS and 512 % dv == 0 and dv >= 16


def _compile_sm90(kernel, ptr: dict, const: dict, warps: int):
    """``kernel`` compiled ahead of time for sm_90 (needs triton, no GPU): its PTX, assembled by ptxas."""
    import re
    import subprocess
    import tempfile

    import triton
    from triton.backends.compiler import GPUTarget
    from triton.backends.nvidia.compiler import get_ptxas
    from triton.compiler import ASTSource

    names = kernel.arg_names
    sig = {n: "constexpr" if n in const else ptr.get(n, "i32") for n in names}
    k = triton.compile(ASTSource(kernel, sig, const), target=GPUTarget("cuda", 90, 32), options={"num_warps": warps})
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "k.ptx").write_text(k.asm["ptx"])
        res = subprocess.run([get_ptxas(90).path, "-v", "-arch=sm_90a", str(Path(tmp) / "k.ptx"), "-o",
                              str(Path(tmp) / "k.cubin")], capture_output=True, text=True)
    spills = [int(m) for m in re.findall(r"(\d+) bytes spill stores", res.stderr + res.stdout)]
    return res.returncode, spills, k.asm["ptx"]


@pytest.mark.slow
@pytest.mark.parametrize("one_pass", [False, True], ids=["two_pass", "one_pass"])
def test_both_merge_kernels_compile_for_sm90_through_the_shared_merge(one_pass: bool) -> None:
    """The split kernel's merge and the plugin's ragged merge (both forms each, the blocks merge_block picks) call
    merge's functions: each compiles for sm_90 with no spill at the blocks picked for 129 and 264 splits."""
    from specdiag.kernels.plan import SplitKVConfig
    from specdiag.kernels.merge import merge_block
    from specdiag.kernels.merge import _merge_kernel, _ragged_merge_kernel

    block_s, block_dv, single = merge_block(129, SplitKVConfig(merge_block_dv=64, merge_one_pass=one_pass))
    assert single == one_pass
    ptr = {"O_PART": "*fp32", "LSE_PART": "*fp32", "OUT": "*bf16"}
    rc, spills, ptx = _compile_sm90(_merge_kernel, ptr, {"BLOCK_S": block_s, "BLOCK_DV": block_dv, "D_V": 512,
                                                          "PDL": False, "ONE_PASS": one_pass}, 8 if one_pass else 4)
    assert rc == 0 and spills == [0]
    assert ("ld.global" in ptx) and (ptx.count("ex2.approx") >= 1)
    # the plugin's merge at 128k h8T1 (264 splits in the grid): two passes of 256 x 16, or one of 512 x 16 (the one-pass merge, commit b35fdaf)
    block_s, block_dv, single = merge_block(264, SplitKVConfig(merge_block_dv=16, merge_one_pass=one_pass))
    assert (block_s, block_dv, single) == ((512, 16, True) if one_pass else (256, 16, False))
    rc, spills, ptx = _compile_sm90(_ragged_merge_kernel, {**ptr, "QO_INDPTR": "*i32", "KV_INDPTR": "*i64"},
                                    {"BLOCK_S": block_s, "BLOCK_DV": block_dv, "D_V": 512, "ROUND": 64,
                                     "ONE_PASS": one_pass}, 8 if one_pass else 4)
    # no spill at these blocks (a 64 x 64 two-pass block spills 8 bytes, as it did before merge)
    assert rc == 0 and spills == [0] and ptx.count("ex2.approx") >= 1
