"""GPU tests of the MHA-form prefill kernel (specdiag.kernels.prefill; run on the device machine: ``make test-gpu``):
bf16 as served, ragged batches, SGLang's strided v, the parts SGLang merges, against the fp32 reference."""

from __future__ import annotations

import math

import pytest
import torch

from specdiag.kernels.prefill import choose, merge, prefill, reference

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def _rel(a, b):
    fin = torch.isfinite(b)
    return float((a.float()[fin] - b[fin]).norm() / b[fin].norm())


def _ragged(lens, dtype=torch.int32):
    return torch.tensor([0] + torch.tensor(lens).cumsum(0).tolist(), dtype=dtype, device="cuda")


@pytest.mark.parametrize("spec", ["", "128:128:8:2:tma", "128:64:8:2:tma", "128:64:8:3:tma"])
@pytest.mark.parametrize("causal,q_lens,k_lens", [
    (True, [8192], [8192]),  # a chunk's own causal part
    (False, [8192], [20000]),  # a prefix chunk, keys off the tile grid
    (True, [1000, 3001, 77], [1000, 3001, 77]),  # a ragged batch
    (False, [300, 5], [4097, 0]),  # a request with no keys: lse -inf, output 0
    (True, [513], [9000]),  # bottom-right causal over a longer key side
])
def test_the_kernel_matches_the_reference(causal, q_lens, k_lens, spec):
    """The default configuration and three with TMA loads (06's candidates), on SGLang's offset types: its int64
    qo_indptr for the queries (and the keys of a causal call), int32 for a prefix chunk's keys."""
    from specdiag.kernels.triton.prefill import parse_config

    cfg = parse_config(spec) if spec else None
    torch.manual_seed(sum(q_lens) + sum(k_lens))
    heads = 8
    q = torch.randn(sum(q_lens), heads, 192, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(sum(k_lens), heads, 192, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(sum(k_lens), heads, 256, device="cuda", dtype=torch.bfloat16)[..., 128:]
    assert choose(q, k, v)[0] == "triton"
    cu_q, cu_k = _ragged(q_lens, torch.int64), _ragged(k_lens, torch.int64 if causal else torch.int32)
    o, lse = prefill(q, k, v, cu_q, cu_k, max(q_lens), causal, 1 / math.sqrt(192), return_lse=True, cfg=cfg)
    rows = torch.unique(torch.randint(0, q.shape[0], (512,), device="cuda"))
    ro, rl = reference(q, k, v, _ragged(q_lens), _ragged(k_lens), causal, 1 / math.sqrt(192), rows=rows)
    assert _rel(o[rows], ro) < 1e-2
    assert torch.equal(torch.isinf(lse[rows]), torch.isinf(rl))
    fin = torch.isfinite(rl)
    assert float((lse[rows][fin] - rl[fin]).abs().max()) < 1e-2
    assert not torch.isnan(o).any()


def test_sglangs_merge_of_the_parts_is_the_whole_attention():
    """The prefix chunk (no mask) and the chunk (causal) merged by their lse: what SGLang's merge_state_v2 computes,
    here in torch (the in-server check covers SGLang's own merge)."""
    torch.manual_seed(0)
    q = torch.randn(4096, 8, 192, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(4096 + 10000, 8, 192, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(4096 + 10000, 8, 128, device="cuda", dtype=torch.bfloat16)
    cq = _ragged([4096])
    o1, l1 = prefill(q, k[:10000], v[:10000], cq, _ragged([10000]), 4096, False, 0.07, return_lse=True)
    o2, l2 = prefill(q, k[10000:], v[10000:], cq, cq, 4096, True, 0.07, return_lse=True)
    om, _ = merge(o1, l1, o2, l2)
    rows = torch.arange(0, 4096, 17, device="cuda")
    ro, _ = reference(q, k, v, cq, _ragged([14096]), True, 0.07, rows=rows)
    assert _rel(om[rows], ro) < 1e-2


@pytest.mark.parametrize("spec", ["", "128:64:8:3:tma"])
def test_the_plugins_probe_passes_on_this_gpu(spec):
    """The SGLang plugin's probe (run before its first prefill chunk) finds the kernel usable here."""
    prefill_plugin = pytest.importorskip("specdiag_sglang_plugin.prefill")
    from specdiag.kernels.triton.prefill import DEFAULT_CONFIG, parse_config

    cfg = parse_config(spec) if spec else DEFAULT_CONFIG
    assert prefill_plugin.probe("cuda", torch.bfloat16, cfg=cfg) == ""
