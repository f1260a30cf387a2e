"""The plugin's ragged split-KV kernel on CUDA: against SGLang's definition, SGLang's own kernel, and a graph.

Run on the device machine: ``pytest -m gpu tests/test_sglang_plugin_gpu.py`` (SGLang's kernel is
compared only where sglang is importable, e.g. with its unpacked site folder first on PYTHONPATH).
"""

from __future__ import annotations

import importlib.util
import math

import pytest
import torch

pytestmark = pytest.mark.gpu

if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

from test_sglang_plugin import make_batch, rel_err, sglang_reference  # noqa: E402

from specdiag.kernels.triton.ragged import ragged_split_kv_triton  # noqa: E402
from specdiag_sglang_plugin.translate import VerifyBatch  # noqa: E402


def to_cuda(batch: VerifyBatch) -> VerifyBatch:
    moved = {k: (v.cuda() if isinstance(v, torch.Tensor) else v) for k, v in batch.__dict__.items()}
    return VerifyBatch(**moved)


def with_draft_in_cache(batch: VerifyBatch) -> tuple[VerifyBatch, torch.Tensor]:
    """``batch`` with its draft rows (k_ext) appended to the cache, as SGLang's set_kv_buffer stores them, and their
    slots (SGLang's out_cache_loc): the Gluon kernel (gluon.ragged) reads the draft rows there."""
    pool = batch.kv_buffer.shape[0]
    kv = torch.cat([batch.kv_buffer, batch.k_ext.reshape(-1, 1, batch.k_ext.shape[-1])], dim=0)
    loc = torch.arange(pool, pool + batch.k_ext.shape[0], dtype=torch.int64, device=kv.device)
    return VerifyBatch(**{**batch.__dict__, "kv_buffer": kv}), loc


def ragged_call(kind: str, batch: VerifyBatch, draft: int, out: torch.Tensor, qo_int64: bool = False):
    """A call of the plugin's kernel ``kind`` on ``batch`` into ``out``: "triton" (triton.ragged, draft rows
    from k_ext) or "gluon" (gluon.ragged, what the plugin serves on sm_90: draft rows from the cache at their
    slots; the rows as the wgmma's N up to 16 rows). ``qo_int64``: qo_indptr as int64, as in SGLang's CUDA-graph
    buffers (eager calls: int32)."""
    if qo_int64:
        batch = VerifyBatch(**{**batch.__dict__, "qo_indptr": batch.qo_indptr.to(torch.int64)})
    if kind == "triton":
        return lambda: ragged_split_kv_triton(batch.q, batch.k_ext, batch.kv_buffer, out, batch.qo_indptr,
                                              batch.kv_indptr, batch.kv_indices, batch.custom_mask,
                                              batch.mask_indptr, max_draft=draft, sm_scale=batch.sm_scale,
                                              logit_cap=batch.logit_cap)
    from specdiag.kernels.gluon.ragged import ragged_split_kv_gluon_ws

    g, loc = with_draft_in_cache(batch)
    return lambda: ragged_split_kv_gluon_ws(g.q, g.kv_buffer, out, g.qo_indptr, g.kv_indptr, g.kv_indices, loc,
                                            g.custom_mask, g.mask_indptr, max_draft=draft, sm_scale=g.sm_scale)


def run_kernel(batch: VerifyBatch, draft: int, kind: str = "triton", qo_int64: bool = False) -> torch.Tensor:
    out = torch.full((batch.q.shape[0], batch.q.shape[1], 512), float("nan"), dtype=batch.q.dtype,
                     device=batch.q.device)
    ragged_call(kind, batch, draft, out, qo_int64)()
    return out


@pytest.mark.parametrize("heads", [8, 4, 16])  # TP 1, TP 2's local heads, and 128 rows
def test_ragged_kernel_launches_with_the_ladder_config(heads):
    """The ragged kernel's default config fits this GPU and is correct (8 heads: TP 1; 4: TP 2's local heads; 16:
    128 rows). Run it before a sweep of plugin arms: `pytest -m gpu tests/test_sglang_plugin_gpu.py -k ladder`."""
    from specdiag.kernels.plan import ragged_shared_bytes
    from specdiag.kernels.triton.ragged import ragged_default_config, shared_limit

    draft = 8
    cfg = ragged_default_config(heads * draft, torch.device("cuda"))
    print(f"heads {heads} x draft {draft}: {cfg.as_dict()}, estimated shared memory {ragged_shared_bytes(cfg)} B "
          f"of {shared_limit(torch.device('cuda'))} B")
    batch, _ = make_batch([3000, 70], draft, heads, chain=False, seed=heads)
    out = run_kernel(to_cuda(batch), draft)
    assert rel_err(out.cpu(), sglang_reference(batch)) < 1e-2


@pytest.mark.parametrize("heads, draft", [(8, 1), (4, 8), (8, 8), (16, 64)])
def test_ladder_launches_its_first_rung_the_tuned_tile(heads, draft):
    """With one tile as keys and values the tuned tile of every row count fits the H200: the ladder's first
    rung launches without an OutOfResources (the form before needed 295,936 B at 64 rows and stepped down to 64 x 32)
    and gives the right output. The stepping itself is tested on the CPU (tests/test_splitkv_shared.py)."""
    from specdiag.kernels.plan import ConfigLadder, fitting_ladder
    from specdiag.kernels.triton.ragged import shared_limit

    batch, _ = make_batch([5000], draft, heads, chain=False, seed=11)
    g = to_cuda(batch)
    chosen = []
    ladder = ConfigLadder(shared_limit=shared_limit(torch.device("cuda")),
                          on_choice=lambda key, c, b, failed: chosen.append((c, failed)))

    def launch(cfg):
        out = torch.full((draft, heads, 512), float("nan"), dtype=g.q.dtype, device="cuda")
        return ragged_split_kv_triton(g.q, g.k_ext, g.kv_buffer, out, g.qo_indptr, g.kv_indptr,
                                      g.kv_indices, g.custom_mask, g.mask_indptr, max_draft=draft,
                                      sm_scale=g.sm_scale, cfg=cfg)

    out = ladder.run("k", heads * draft, launch)
    cfg, failed = chosen[0]
    print(f"chosen {cfg.as_dict()}")
    assert failed == [] and cfg == fitting_ladder(heads * draft)[0]
    assert rel_err(out.cpu(), sglang_reference(batch)) < 1e-2


@pytest.mark.parametrize("prefix_lens, draft, heads, chain, cap", [
    ([1000], 8, 8, True, 0.0),
    ([131072], 8, 8, False, 0.0),
    ([5, 40000, 64, 129], 8, 8, False, 0.0),
    ([3000, 17], 8, 16, True, 30.0),
])
def test_ragged_kernel_matches_sglang_definition(prefix_lens, draft, heads, chain, cap):
    batch, _ = make_batch(prefix_lens, draft, heads, chain, seed=sum(prefix_lens) % 97, logit_cap=cap)
    out = run_kernel(to_cuda(batch), draft)
    assert torch.isfinite(out).all()
    assert rel_err(out.cpu(), sglang_reference(batch)) < 1e-2


@pytest.mark.skipif(importlib.util.find_spec("sglang") is None, reason="sglang is not importable")
@pytest.mark.parametrize("kind", ["triton", "gluon"])
@pytest.mark.parametrize("prefix_lens, chain", [([2000], True), ([70000], False), ([300, 5000, 11], False)])
def test_ragged_kernel_matches_sglang_extend_attention(prefix_lens, chain, kind):
    from sglang.kernels.ops.attention.extend_attention import extend_attention_fwd

    draft, heads = 8, 8
    batch, _ = make_batch(prefix_lens, draft, heads, chain, seed=7 if kind == "triton" else 9)
    g = to_cuda(batch)
    ours = run_kernel(g, draft, kind)
    theirs = torch.empty_like(ours)
    kv = g.kv_buffer
    extend_attention_fwd(g.q, g.k_ext, g.v_ext, theirs, kv, kv[..., :512], g.qo_indptr, g.kv_indptr, g.kv_indices,
                         g.custom_mask, True, g.mask_indptr, draft, 1.0, 1.0, g.sm_scale, logit_cap=0.0)
    assert rel_err(ours, theirs) < 1e-2


@pytest.mark.parametrize("kind, qo_int64, draft", [("triton", False, 8), ("gluon", True, 8), ("gluon", True, 2),
                                                   ("gluon", False, 1)])
def test_ragged_kernel_replays_in_a_cuda_graph_at_other_lengths(kind, qo_int64, draft):
    """Captured at one prefix length, replayed after the indptr buffers change: lengths are read on the device. The
    Gluon kernel with qo_indptr int64, as SGLang's CUDA-graph buffer holds it; at 16 and 8 rows its rows-as-N form
    (commit c6e7e3c), with an N of 16 and of 8."""
    heads = 8
    long_batch, _ = make_batch([20000], draft, heads, chain=False, seed=3)
    g = to_cuda(long_batch)
    kv_indptr = g.kv_indptr.clone()
    mask_indptr = g.mask_indptr.clone()
    short_p = 700
    mask_short = g.custom_mask.clone()
    out = torch.empty(draft, heads, 512, dtype=g.q.dtype, device="cuda")
    call = ragged_call(kind, VerifyBatch(**{**g.__dict__, "kv_indptr": kv_indptr, "custom_mask": mask_short,
                                            "mask_indptr": mask_indptr}), draft, out, qo_int64)
    call()  # compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        call()
    for p in (20000, short_p, 12345, 40):
        kv_indptr[1] = p
        # the request's mask block: T rows of P + T entries, draft part at columns P..P+T-1
        tree = g.custom_mask.view(draft, 20000 + draft)[:, 20000:]
        block = torch.ones(draft, p + draft, dtype=torch.bool, device="cuda")
        block[:, p:] = tree
        mask_short[: block.numel()] = block.reshape(-1)
        graph.replay()
        torch.cuda.synchronize()
        trimmed = VerifyBatch(q=g.q.cpu(), k_ext=g.k_ext.cpu(), v_ext=g.v_ext.cpu(), kv_buffer=g.kv_buffer.cpu(),
                              qo_indptr=g.qo_indptr.cpu(), kv_indptr=kv_indptr.cpu(), kv_indices=g.kv_indices.cpu(),
                              custom_mask=mask_short.cpu(), mask_indptr=mask_indptr.cpu(), sm_scale=g.sm_scale)
        assert rel_err(out.cpu(), sglang_reference(trimmed)) < 1e-2, p
    assert math.isfinite(float(out.float().abs().max()))


# ---- the warp-specialized Gluon kernel on the ragged layout (gluon.ragged), what the plugin serves on
# sm_90 (at every row count since commit 4056b13, where it beat the Triton kernels at 8-32 rows); it reads the draft rows from the cache at their slots (out_cache_loc), where the hook stores them

@pytest.mark.parametrize("prefix_lens, draft, heads, chain, dtype", [
    ([1000], 8, 8, True, torch.bfloat16),
    ([131072], 8, 8, False, torch.bfloat16),
    ([5, 40000, 64, 129], 8, 8, False, torch.bfloat16),  # prefixes shorter than a tile: splits past their end
    ([3000, 17], 8, 16, False, torch.bfloat16),  # 128 rows: two row tiles
    ([20000], 64, 16, False, torch.bfloat16),  # 1,024 rows: 16 row tiles, few splits
    ([7000, 300], 8, 8, False, torch.float16),
    ([2500] * 8, 4, 16, True, torch.bfloat16),  # a batch of 8: fewer splits per request
    ([131072], 1, 8, True, torch.bfloat16),  # 8 rows, one draft token: served by the Gluon kernel
    ([3000, 50000], 2, 8, False, torch.bfloat16),  # 16 rows
    ([60000], 8, 4, False, torch.bfloat16),  # 32 rows: the investigation's shape at tensor parallel 2
], ids=lambda v: "x".join(map(str, v[:3])) + f"-{len(v)}" if isinstance(v, list) else str(v))
@pytest.mark.parametrize("qo_int64", [False, True], ids=["qo-int32", "qo-int64"])
def test_gluon_ragged_kernel_matches_sglang_definition(prefix_lens, draft, heads, chain, dtype, qo_int64):
    batch, _ = make_batch(prefix_lens, draft, heads, chain, seed=sum(prefix_lens) % 89, dtype=dtype)
    out = run_kernel(to_cuda(batch), draft, "gluon", qo_int64)
    assert not out.isnan().any()
    assert rel_err(out.cpu(), sglang_reference(batch)) < 1e-2


@pytest.mark.parametrize("prefix_lens, draft, heads, chain", [
    ([131072], 1, 8, True),  # 8 rows: an N of 8
    ([3000, 50000], 2, 8, False),  # 16 rows: an N of 16
    ([5, 40000, 64, 129], 1, 16, False),  # 16 rows, prefixes shorter than a tile
    ([2500] * 8, 3, 5, False),  # 15 rows, a batch of 8, a tree mask
    ([7000], 1, 5, True),  # 5 rows
], ids=lambda v: "x".join(map(str, v[:3])) + f"-{len(v)}" if isinstance(v, list) else str(v))
def test_gluon_ragged_kernel_up_to_16_rows(prefix_lens, draft, heads, chain):
    """Up to 16 rows the plugin serves the rows-as-N form (gluon.swap's partitions on the ragged layout); int64
    qo_indptr."""
    batch, _ = make_batch(prefix_lens, draft, heads, chain, seed=sum(prefix_lens) % 83)
    out = run_kernel(to_cuda(batch), draft, "gluon", qo_int64=True)
    assert not out.isnan().any()
    assert rel_err(out.cpu(), sglang_reference(batch)) < 1e-2


# ---- the fp8 kernel on the ragged layout (gluon.ragged.ragged_split_kv_gluon_fp8), what the plugin
# serves on an fp8_e4m3 cache up to 16 rows: every row read from the fp8 pool, draft rows at their slots

FP8_CASES = [
    ([131072], 1, 8, True, 1.0),  # 8 rows: the staged s22 ring
    ([3000, 50000], 2, 8, False, 0.05),  # 16 rows: the direct d2 ring, a scale
    ([5, 40000, 64, 129], 1, 16, False, 1.0),  # 16 rows, prefixes shorter than a tile
    ([2500] * 8, 3, 5, False, 2.0),  # 15 rows, a batch of 8, a tree mask
    ([7000], 1, 5, True, 1.0),  # 5 rows
    ([100000], 2, 4, False, 0.5),  # 8 rows of two draft tokens
    ([131072], 8, 8, False, 1.0),  # 64 rows: two row tiles of 32 (the investigation's shape)
    ([5000, 300], 4, 8, False, 0.25),  # 32 rows: one tile at an N of 32
    ([3000, 60000], 8, 16, True, 1.0),  # 128 rows: four tiles
    ([2500] * 4, 8, 5, False, 1.0),  # 40 rows of 5 heads: tiles of 30 (6 whole draft tokens)
    ([20000], 2, 40, False, 1.0),  # 80 rows of 40 heads: tiles of 20 inside a draft token
    ([20000], 64, 16, False, 1.0),  # 1,024 rows: 32 tiles
]


def fp8_on_cuda(prefix_lens, draft, heads, chain, scale, seed):
    from test_sglang_plugin import fp8_batch

    b8, loc, deq = fp8_batch(prefix_lens, draft, heads, chain, scale, seed=seed)
    return to_cuda(b8), loc.cuda(), to_cuda(deq)


def fp8_call(g8: VerifyBatch, loc: torch.Tensor, draft: int, scale: float, out: torch.Tensor, qo_int64: bool = False):
    from specdiag.kernels.gluon.ragged import ragged_split_kv_gluon_fp8

    qo = g8.qo_indptr.to(torch.int64) if qo_int64 else g8.qo_indptr
    return lambda: ragged_split_kv_gluon_fp8(g8.q, g8.kv_buffer, out, qo, g8.kv_indptr, g8.kv_indices, loc,
                                             g8.custom_mask, g8.mask_indptr, max_draft=draft, sm_scale=g8.sm_scale,
                                             kv_scale=scale)


@pytest.mark.parametrize("prefix_lens, draft, heads, chain, scale", FP8_CASES,
                         ids=lambda v: "x".join(map(str, v[:3])) + f"-{len(v)}" if isinstance(v, list) else str(v))
@pytest.mark.parametrize("qo_int64", [False, True], ids=["qo-int32", "qo-int64"])
def test_fp8_ragged_kernel_matches_the_exact_reference(prefix_lens, draft, heads, chain, scale, qo_int64):
    """Against translate.fp8_reference (fp32 on the dequantized pool, drafts from their slots): the bf16 output's
    rounding only (the dense fp8 pick measured 1.65-1.75e-3 on the H200, commit 4f0a82c), in the 32-row tiles above 16
    rows too."""
    from specdiag_sglang_plugin.translate import fp8_reference

    g8, loc, _ = fp8_on_cuda(prefix_lens, draft, heads, chain, scale, seed=sum(prefix_lens) % 79)
    out = torch.full((g8.q.shape[0], heads, 512), float("nan"), dtype=torch.bfloat16, device="cuda")
    fp8_call(g8, loc, draft, scale, out, qo_int64)()
    err = rel_err(out, fp8_reference(g8, loc, scale))
    print(f"fp8 ragged {prefix_lens[:3]} x{len(prefix_lens)} T{draft} H{heads} scale {scale}: rel. error {err:.3e}")
    assert not out.isnan().any() and err < 4e-3


@pytest.mark.skipif(importlib.util.find_spec("sglang") is None, reason="sglang is not importable")
@pytest.mark.parametrize("prefix_lens, draft, heads, scale", [([20000], 1, 8, 1.0), ([3000, 60000], 2, 8, 0.05),
                                                               ([60000], 8, 8, 1.0)])
def test_fp8_ragged_kernel_beside_sglangs_fp8_extend_attention(prefix_lens, draft, heads, scale):
    """SGLang 0.5.17's own kernel on the same fp8 pool (its k_descale = v_descale = the scale; its draft block from the
    bf16 k/v): both against the exact reference of the fp8 cache. SGLang's casts q and P to fp8 for the prefix's dots,
    so its error is the larger; the two outputs agree within both errors."""
    from sglang.kernels.ops.attention.extend_attention import extend_attention_fwd

    from specdiag_sglang_plugin.translate import fp8_reference

    g8, loc, _ = fp8_on_cuda(prefix_lens, draft, heads, False, scale, seed=5)
    exact = fp8_reference(g8, loc, scale)
    ours = torch.empty(g8.q.shape[0], heads, 512, dtype=torch.bfloat16, device="cuda")
    fp8_call(g8, loc, draft, scale, ours)()
    theirs = torch.empty_like(ours)
    kv = g8.kv_buffer
    extend_attention_fwd(g8.q, g8.k_ext, g8.v_ext, theirs, kv, kv[..., :512], g8.qo_indptr, g8.kv_indptr,
                         g8.kv_indices, g8.custom_mask, True, g8.mask_indptr, draft, scale, scale, g8.sm_scale,
                         logit_cap=0.0)
    ours_err, theirs_err, between = rel_err(ours, exact), rel_err(theirs, exact), rel_err(ours, theirs)
    print(f"fp8 {prefix_lens} T{draft}: ours vs exact {ours_err:.3e}, SGLang's vs exact {theirs_err:.3e}, "
          f"ours vs SGLang's {between:.3e}")
    assert ours_err < 4e-3 and ours_err < theirs_err and between <= ours_err + theirs_err + 1e-6


@pytest.mark.parametrize("draft, qo_int64", [(1, True), (2, True), (2, False), (8, True)])
def test_fp8_ragged_kernel_replays_in_a_cuda_graph_at_other_lengths(draft, qo_int64):
    """Captured at one prefix length, replayed after the indptr buffers change (SGLang's CUDA graphs): at 8, 16 and
    64 rows (N 8 with the staged ring, N 16 with the direct one, two row tiles of 32)."""
    from specdiag_sglang_plugin.translate import fp8_reference

    heads, scale = 8, 0.25
    g8, loc, _ = fp8_on_cuda([20000], draft, heads, False, scale, seed=4)
    kv_indptr, mask_indptr, mask = g8.kv_indptr.clone(), g8.mask_indptr.clone(), g8.custom_mask.clone()
    live = VerifyBatch(**{**g8.__dict__, "kv_indptr": kv_indptr, "custom_mask": mask, "mask_indptr": mask_indptr})
    out = torch.empty(draft, heads, 512, dtype=torch.bfloat16, device="cuda")
    call = fp8_call(live, loc, draft, scale, out, qo_int64)
    call()  # compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        call()
    tree = g8.custom_mask.view(draft, 20000 + draft)[:, 20000:]
    for p in (20000, 700, 12345, 40):
        kv_indptr[1] = p
        block = torch.ones(draft, p + draft, dtype=torch.bool, device="cuda")
        block[:, p:] = tree
        mask[: block.numel()] = block.reshape(-1)
        graph.replay()
        torch.cuda.synchronize()
        assert rel_err(out, fp8_reference(live, loc, scale)) < 4e-3, p
