"""The SGLang plugin's translation, fallback decisions and mode switch, on the CPU (no sglang import).

Batches are built the way SGLang 0.5.17's Triton backend lays out a target-verify call (see
plugins/sglang/specdiag_sglang_plugin/translate.py): a shuffled page_size-1 latent pool, ragged
kv_indptr/kv_indices, qo_indptr with T draft tokens per request, and the flattened custom mask whose
request block holds T rows of P + T entries. The reference below computes attention the way SGLang
defines it (prefix fully visible, draft block by the mask), directly from those flat tensors.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from specdiag.kernels.mla import D_QK, D_V, tree_mask as random_tree
from specdiag_sglang_plugin import hook, logs
from specdiag_sglang_plugin.causal import CausalMask, capacity, causal_positions
from specdiag_sglang_plugin.translate import (CallFacts, VerifyBatch, decide, fp8_reference, max_draft_tokens,
                                              request_inputs, run_torch, tree_mask)

ROOT = Path(__file__).resolve().parents[1]


def make_batch(prefix_lens: list[int], draft: int, heads: int, chain: bool, seed: int = 0,
               dtype=torch.bfloat16, logit_cap: float = 0.0, prefix_fill: bool = True) -> tuple[VerifyBatch, list]:
    """A verify call in SGLang's layout; also returns each request's [T, T] mask for the checks."""
    gen = torch.Generator().manual_seed(seed)
    bs = len(prefix_lens)
    pool_slots = sum(prefix_lens) + 64
    kv = torch.randn(pool_slots, 1, D_QK, generator=gen).to(dtype)
    perm = torch.randperm(pool_slots - 1, generator=gen) + 1  # slot 0 is SGLang's padding slot
    kv_indptr = torch.zeros(bs + 1, dtype=torch.int32)
    kv_indptr[1:] = torch.cumsum(torch.tensor(prefix_lens), 0)
    kv_indices = torch.cat([perm[: sum(prefix_lens)], torch.zeros(5, dtype=torch.int64)])  # over-allocated
    qo_indptr = torch.arange(0, (bs + 1) * draft, draft, dtype=torch.int32)
    q = torch.randn(bs * draft, heads, D_QK, generator=gen).to(dtype)
    k_ext = torch.randn(bs * draft, 1, D_QK, generator=gen).to(dtype)
    v_ext = k_ext[..., :D_V].clone()
    masks, flat = [], []
    noise = torch.Generator().manual_seed(seed + 99)  # apart, so the fill does not change the other tensors
    for p in prefix_lens:
        m = random_tree(draft, gen, chain=chain)
        masks.append(m)
        # prefix columns: True when SGLang fills them, random otherwise (they must not be read)
        pre = torch.ones(draft, p, dtype=torch.bool) if prefix_fill else torch.rand(draft, p, generator=noise) < 0.5
        flat.append(torch.cat([pre, m], dim=1).reshape(-1))
    custom_mask = torch.cat(flat)
    mask_indptr = torch.zeros(bs + 1, dtype=torch.int64)
    mask_indptr[1:] = torch.cumsum(torch.tensor([draft * (p + draft) for p in prefix_lens]), 0)
    batch = VerifyBatch(q=q, k_ext=k_ext, v_ext=v_ext, kv_buffer=kv, qo_indptr=qo_indptr, kv_indptr=kv_indptr,
                        kv_indices=kv_indices, custom_mask=custom_mask, mask_indptr=mask_indptr,
                        sm_scale=1.0 / math.sqrt(192.0), logit_cap=logit_cap)
    return batch, masks


def sglang_reference(batch: VerifyBatch) -> torch.Tensor:
    """[tokens, H, 512] fp32: SGLang's verify attention, read straight from the flat tensors."""
    tokens, heads, _ = batch.q.shape
    out = torch.zeros(tokens, heads, D_V)
    kv = batch.kv_buffer[:, 0].float()
    for b in range(batch.batch_size):
        q0, q1 = int(batch.qo_indptr[b]), int(batch.qo_indptr[b + 1])
        k0, k1 = int(batch.kv_indptr[b]), int(batch.kv_indptr[b + 1])
        t, p = q1 - q0, k1 - k0
        keys = torch.cat([kv[batch.kv_indices[k0:k1]], batch.k_ext[q0:q1, 0].float()])
        vals = torch.cat([kv[batch.kv_indices[k0:k1], :D_V], batch.v_ext[q0:q1, 0].float()])
        m0 = int(batch.mask_indptr[b])
        for i in range(t):
            row = batch.custom_mask[m0 + i * (p + t): m0 + (i + 1) * (p + t)].to(torch.bool).clone()
            row[:p] = True  # skip_prefix_custom_mask: the prefix is fully visible
            s = (batch.q[q0 + i].float() @ keys.T) * batch.sm_scale  # [H, n_kv]
            if batch.logit_cap > 0:
                s = batch.logit_cap * torch.tanh(s / batch.logit_cap)
            s = s.masked_fill(~row[None, :], float("-inf"))
            out[q0 + i] = torch.softmax(s, dim=-1) @ vals
    return out


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm())


CASES = [
    pytest.param([37], 8, 8, True, id="bs1-chain-P37"),
    pytest.param([1000], 8, 8, False, id="bs1-tree-P1000"),
    pytest.param([5, 300, 64, 129], 8, 4, False, id="bs4-tree-mixed"),
    pytest.param([200, 3], 6, 16, True, id="bs2-chain-T6-h16"),
    pytest.param([513, 77, 1], 4, 2, False, id="bs3-tree-T4"),
]


@pytest.mark.parametrize("prefix_lens, draft, heads, chain", CASES)
def test_translation_and_torch_fallback_match_sglang_definition(prefix_lens, draft, heads, chain):
    batch, masks = make_batch(prefix_lens, draft, heads, chain, seed=len(prefix_lens) * 7 + draft)
    for b, m in enumerate(masks):
        assert torch.equal(tree_mask(batch, b), m)
        inputs = request_inputs(batch, b)
        assert inputs.n_prefix == prefix_lens[b] and inputs.n_kv == prefix_lens[b] + draft
    ref = sglang_reference(batch)
    out = torch.full((batch.q.shape[0], heads, D_V), float("nan"), dtype=torch.bfloat16)
    run_torch(batch, out, n_splits=3)
    assert not torch.isnan(out).any()
    assert rel_err(out, ref) < 1e-2


def test_prefix_columns_of_the_mask_are_not_read():
    """SGLang's kernel skips the prefix part of the mask; so must the translation."""
    filled, _ = make_batch([50, 20], 8, 4, chain=False, seed=3, prefix_fill=True)
    noisy, _ = make_batch([50, 20], 8, 4, chain=False, seed=3, prefix_fill=False)
    a = torch.empty(16, 4, D_V, dtype=torch.bfloat16)
    b = torch.empty_like(a)
    run_torch(filled, a)
    run_torch(noisy, b)
    assert torch.equal(a, b)


def test_mask_changes_the_result_where_the_tree_differs():
    """A chain and a tree over the same tensors differ (the mask is really applied)."""
    chain, _ = make_batch([100], 8, 4, chain=True, seed=11)
    tree, masks = make_batch([100], 8, 4, chain=False, seed=11)
    assert not torch.equal(masks[0], torch.tril(torch.ones(8, 8, dtype=torch.bool)))
    tree = dataclasses.replace(tree, q=chain.q, k_ext=chain.k_ext, v_ext=chain.v_ext, kv_buffer=chain.kv_buffer)
    a, b = sglang_reference(chain), sglang_reference(tree)
    out = torch.empty(8, 4, D_V, dtype=torch.bfloat16)
    run_torch(tree, out)
    assert rel_err(out, b) < 1e-2 and rel_err(a, b) > 0.05


def test_request_inputs_refuses_non_latent_values():
    batch, _ = make_batch([10], 4, 2, chain=True)
    batch.v_ext[0, 0, 0] += 1
    with pytest.raises(ValueError, match="first 512 dims"):
        request_inputs(batch, 0)


def causal_batch(prefix_lens: list[int], draft: int, heads: int, seed: int = 0) -> VerifyBatch:
    """A DFLASH verify call: no custom mask, SGLang's mask_indptr, and the plugin's causal block written into a
    buffer of random bytes (so an entry the writer missed, or one read that it did not write, shows)."""
    batch, _ = make_batch(prefix_lens, draft, heads, chain=True, seed=seed)
    noise = torch.Generator().manual_seed(seed + 5)
    buf = (torch.rand(capacity(sum(prefix_lens) + 64, len(prefix_lens), draft), generator=noise) < 0.5).to(torch.uint8)
    idx, vals = causal_positions(batch.qo_indptr, batch.kv_indptr, batch.mask_indptr, draft)
    buf[idx] = vals
    return dataclasses.replace(batch, custom_mask=buf)


@pytest.mark.parametrize("prefix_lens, draft, heads", [([37], 8, 8), ([5, 300, 64], 16, 4), ([1, 2000], 8, 2)])
def test_causal_block_is_the_lower_triangle_in_sglangs_layout(prefix_lens, draft, heads):
    """DFLASH's verify passes no custom mask; the plugin's causal block, read the way the kernels read a tree mask,
    is the lower triangle for every request, and attention over it is SGLang's causal verify."""
    batch = causal_batch(prefix_lens, draft, heads, seed=len(prefix_lens) + draft)
    tril = torch.tril(torch.ones(draft, draft, dtype=torch.bool))
    for b in range(len(prefix_lens)):
        assert torch.equal(tree_mask(batch, b), tril)
    out = torch.full((batch.q.shape[0], heads, D_V), float("nan"), dtype=torch.bfloat16)
    run_torch(batch, out, n_splits=3)
    explicit = dataclasses.replace(batch, custom_mask=torch.cat([
        torch.cat([torch.ones(draft, p, dtype=torch.bool), tril], dim=1).reshape(-1) for p in prefix_lens]))
    assert rel_err(out, sglang_reference(explicit)) < 1e-2


def test_causal_mask_is_written_once_per_forward_and_again_for_a_new_one():
    """Written on a batch's first layer only (the entries are the same in every layer), rewritten for the next
    forward batch even when it reuses the old one's address (held by a weak reference, not by id)."""
    from types import SimpleNamespace as NS

    class Batch:  # ForwardBatch stand-in: weak-referenceable, like SGLang's dataclass
        pass

    batch = causal_batch([40, 9], 4, 2)
    meta = NS(qo_indptr=batch.qo_indptr, kv_indptr=batch.kv_indptr, mask_indptr=batch.mask_indptr)
    cm = CausalMask()
    fb = Batch()
    buf = cm.for_call(fb, meta, 4, slots=200, max_requests=2)
    first = buf.clone()
    buf.zero_()
    assert cm.for_call(fb, meta, 4, slots=200, max_requests=2).sum() == 0, "rewritten for the same forward"
    del fb
    again = cm.for_call(Batch(), meta, 4, slots=200, max_requests=2)
    assert torch.equal(again, first)


def test_a_dflash_block_is_served_causal_even_with_sglangs_unwritten_mask_buffer():
    """SGLang 0.5.17 captures DFLASH's verify on a HybridAttnBackend (FlashInfer prefill, Triton verify) with the
    Triton backend's verify-mask buffer, which nothing writes for DFLASH (zeros: every draft entry masked). The plugin
    serves a DFlashVerifyInput's call as the causal block over that buffer; a tree's mask (NGRAM) stays its own."""
    from types import SimpleNamespace as NS

    class DFlashVerifyInput:  # the class SGLang names it by (no sglang import here)
        pass

    class NgramVerifyInput:
        pass

    class Batch:  # ForwardBatch stand-in (weak-referenceable)
        def __init__(self, spec_info):
            self.spec_info = spec_info

    prefix_lens, draft = [37, 300], 8
    batch = causal_batch(prefix_lens, draft, 2)
    zeros = torch.zeros_like(batch.custom_mask)  # what the graph reads: SGLang's never-written buffer
    meta = NS(qo_indptr=batch.qo_indptr, kv_indptr=batch.kv_indptr, mask_indptr=batch.mask_indptr, custom_mask=zeros)
    backend = NS(forward_metadata=meta, req_to_token_pool=NS(size=2),
                 token_to_kv_pool=NS(get_key_buffer=lambda layer_id: torch.empty(sum(prefix_lens) + 64, 1, 1)))
    layer = NS(layer_id=0)
    hook._CAUSAL.clear()
    dflash = Batch(DFlashVerifyInput())
    assert hook.linear_block(dflash) and hook.causal_call(backend, dflash)
    mask = hook.verify_mask(backend, layer, dflash, draft)
    served = dataclasses.replace(batch, custom_mask=mask)
    tril = torch.tril(torch.ones(draft, draft, dtype=torch.bool))
    assert all(torch.equal(tree_mask(served, b), tril) for b in range(len(prefix_lens)))
    tree = Batch(NgramVerifyInput())
    assert not hook.linear_block(tree) and not hook.causal_call(backend, tree)
    assert hook.verify_mask(backend, layer, tree, draft) is zeros
    meta.custom_mask = None  # eager DFLASH and a pure Triton server: no mask at all, causal as before
    assert hook.causal_call(backend, tree)


def test_decide_serves_a_verify_block_without_a_mask_as_causal():
    serve, reason = decide(servable(has_custom_mask=False))
    assert serve and "causal draft block" in reason and "DFLASH" in reason
    serve, reason = decide(servable(has_custom_mask=False, kv_dtype=torch.float8_e4m3fn))
    assert serve and "causal" in reason and "fp8" in reason


def test_torch_fallback_refuses_logit_cap():
    batch, _ = make_batch([10], 4, 2, chain=True, logit_cap=30.0)
    with pytest.raises(ValueError, match="logit cap"):
        run_torch(batch, torch.empty(4, 2, D_V, dtype=torch.bfloat16))


def servable(**over) -> CallFacts:
    base = dict(forward_mode_verify=True, page_size=1, use_mla=True, qk_head_dim=576, v_head_dim=512,
                has_kv_tensors=True, kv_scaled=False, sliding_window=False, sinks=False, score_mod=False,
                xai_temperature=False, dcp_size=1, deterministic=False, causal=True, has_custom_mask=True,
                q_dtype=torch.bfloat16, kv_dtype=torch.bfloat16, value_is_latent_view=True, is_cuda=True)
    base.update(over)
    return CallFacts(**base)


def test_decide_serves_the_mla_verify_call():
    assert decide(servable()) == (True, "split-KV verify (MLA latent, page_size 1, custom mask)")


def test_decide_serves_an_fp8_cache_with_one_scale():
    """SGLang's fp8_e4m3 pool (float8_e4m3fn, bf16 q): served at every row count (the fp8 kernel's row tiles), with
    or without the layer's k_scale as long as v_scale is the same number (the latent cache holds one scale)."""
    fp8 = dict(kv_dtype=torch.float8_e4m3fn)
    reason = "split-KV verify (MLA latent, page_size 1, custom mask, fp8 e4m3 cache)"
    for rows in (1, 8, 16, 64, 1024):
        assert decide(servable(rows=rows, **fp8)) == (True, reason)
    assert decide(servable(rows=16, kv_scaled=True, kv_scales_equal=True, **fp8)) == (True, reason)


def fp8_batch(prefix_lens: list[int], draft: int, heads: int, chain: bool, scale: float, seed: int = 0):
    """A verify call on an fp8 pool as SGLang 0.5.17 makes it: the pool quantized (``(x / scale).to(e4m3)``), the
    draft rows stored the same way at new slots (out_cache_loc). Returns the fp8 batch, those slots, and the same call
    dequantized (pool and draft rows = e4m3 x scale) for the definition's reference."""
    batch, _ = make_batch(prefix_lens, draft, heads, chain, seed=seed)
    drafts = batch.k_ext.float()
    pool = torch.cat([batch.kv_buffer.float(), drafts], dim=0)
    pool8 = (pool / scale).to(torch.float8_e4m3fn)
    loc = torch.arange(batch.kv_buffer.shape[0], pool.shape[0], dtype=torch.int64)
    deq = pool8.float() * scale
    b8 = dataclasses.replace(batch, kv_buffer=pool8)
    deq_batch = dataclasses.replace(batch, kv_buffer=deq[: batch.kv_buffer.shape[0]], k_ext=deq[loc],
                                    v_ext=deq[loc][..., :D_V].clone())
    return b8, loc, deq_batch


@pytest.mark.parametrize("prefix_lens, draft, heads, chain, scale", [
    ([37], 1, 8, True, 1.0), ([300, 5], 2, 8, False, 0.05), ([1000, 64, 129], 3, 5, False, 2.5),
])
def test_fp8_reference_is_the_definition_on_the_dequantized_cache(prefix_lens, draft, heads, chain, scale):
    """What the plugin's fp8 kernel computes (translate.fp8_reference: every row from the fp8 pool, draft rows at
    their slots, times the scale) is SGLang's definition on the dequantized call; and it differs from the bf16 call
    by the quantization's error, so the reference does read the fp8 bytes."""
    b8, loc, deq = fp8_batch(prefix_lens, draft, heads, chain, scale, seed=len(prefix_lens))
    ref = fp8_reference(b8, loc, scale)
    assert rel_err(ref, sglang_reference(deq)) < 1e-5
    bf16, _ = make_batch(prefix_lens, draft, heads, chain, seed=len(prefix_lens))
    assert 1e-3 < rel_err(ref, sglang_reference(bf16)) < 0.1
    with pytest.raises(ValueError, match="float8_e4m3fn"):
        fp8_reference(bf16, loc, scale)


@pytest.mark.parametrize("over, words", [
    (dict(forward_mode_verify=False), "not a target-verify"),
    (dict(page_size=64), "page_size 64"),
    (dict(use_mla=False, qk_head_dim=128, v_head_dim=128), "not an MLA layer"),
    (dict(qk_head_dim=192, v_head_dim=128), "head dims 192/128"),
    (dict(kv_scaled=True, kv_dtype=torch.float8_e4m3fn, kv_scales_equal=False), "k_scale != v_scale"),
    (dict(kv_dtype=torch.float8_e4m3fn, q_dtype=torch.float16), "fp8 KV cache with q torch.float16"),
    (dict(kv_dtype=torch.float8_e5m2), "dtypes"),
    (dict(kv_scaled=True), "k_scale/v_scale on a torch.bfloat16 KV cache"),
    (dict(sliding_window=True), "sliding-window"),
    (dict(sinks=True), "sinks"),
    (dict(score_mod=True), "score_mod"),
    (dict(xai_temperature=True), "xai"),
    (dict(dcp_size=2), "dcp_size 2"),
    (dict(deterministic=True), "deterministic"),
    (dict(causal=False), "non-causal"),
    (dict(has_custom_mask=False, has_mask_indptr=False), "no custom mask"),
    (dict(kv_dtype=torch.float16), "dtypes"),
    (dict(q_dtype=torch.float32, kv_dtype=torch.float32), "dtypes"),
    (dict(value_is_latent_view=False), "value buffer"),
    (dict(is_cuda=False), "CUDA"),
    (dict(has_kv_tensors=False), "k/v not passed"),
])
def test_decide_falls_back_with_a_reason(over, words):
    serve, reason = decide(servable(**over))
    assert not serve and words in reason


def test_max_draft_tokens():
    assert max_draft_tokens(8, 16, 2) == 8
    assert max_draft_tokens(None, 17, 2) == 9


def test_mode_switch_from_env():
    assert hook.mode_from_env({}) == "splitkv"
    assert hook.mode_from_env({hook.MODE_ENV: "OFF"}) == "off"
    assert hook.mode_from_env({hook.MODE_ENV: "upstream"}) == "upstream"
    with pytest.raises(ValueError, match="choose one of"):
        hook.mode_from_env({hook.MODE_ENV: "fast"})


def test_activation_only_when_asked():
    assert hook.activation_from_env({}) == (False, "SGLANG_PLUGINS is unset and SPECDIAG_SGLANG_VERIFY is unset")
    assert hook.activation_from_env({hook.PLUGINS_ENV: "other"})[0] is False
    assert hook.activation_from_env({hook.PLUGINS_ENV: "other, specdiag_splitkv"}) == (
        True, "SGLANG_PLUGINS names specdiag_splitkv")
    assert hook.activation_from_env({hook.MODE_ENV: "upstream"}) == (True, "SPECDIAG_SGLANG_VERIFY=upstream")
    assert hook.activation_from_env({hook.MODE_ENV: " "})[0] is False  # set but empty: not a request


class _FakeRegistry:
    calls: list = []

    @classmethod
    def register(cls, target, fn, kind):
        cls.calls.append((target, kind))


def _fake_sglang(monkeypatch):
    """sys.modules entries that make ``from sglang.srt.plugins.hook_registry import HookRegistry, HookType`` work."""
    import types

    _FakeRegistry.calls = []
    mod = types.ModuleType("sglang.srt.plugins.hook_registry")
    mod.HookRegistry = _FakeRegistry
    mod.HookType = type("HookType", (), {"AROUND": "around", "AFTER": "after", "BEFORE": "before"})
    for name in ("sglang", "sglang.srt", "sglang.srt.plugins"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    monkeypatch.setitem(sys.modules, "sglang.srt.plugins.hook_registry", mod)


def test_register_does_nothing_unless_asked_and_logs_it_once(monkeypatch, caplog):
    """SGLang 0.5.17 calls register() of every installed plugin when SGLANG_PLUGINS is unset: nothing happens then."""
    _fake_sglang(monkeypatch)
    monkeypatch.delenv(hook.PLUGINS_ENV, raising=False)
    monkeypatch.delenv(hook.MODE_ENV, raising=False)
    monkeypatch.setattr(logs, "_logged", set())
    with caplog.at_level("WARNING", logger="specdiag_sglang_plugin"):
        hook.register()
        hook.register()
    assert _FakeRegistry.calls == [] and hook.STATS["mode"] == "off"
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and "installed and off" in lines[0] and "SPECDIAG_SGLANG_VERIFY=splitkv" in lines[0]
    monkeypatch.setenv(hook.PLUGINS_ENV, "specdiag_splitkv")  # named: the default mode, splitkv
    hook.register()
    assert hook.STATS["mode"] == "splitkv" and (hook.FORWARD_EXTEND, "around") in _FakeRegistry.calls


def test_register_off_and_without_sglang_registers_nothing(monkeypatch):
    monkeypatch.setenv(hook.MODE_ENV, "off")
    hook.register()
    assert hook.STATS["mode"] == "off"
    if importlib.util.find_spec("sglang") is None:  # no SGLang here: the registry import fails softly
        monkeypatch.setenv(hook.MODE_ENV, "splitkv")
        hook.register()
        assert "import" in logs._logged


class _Mode:
    def __init__(self, verify: bool):
        self.verify = verify

    def is_target_verify(self):
        return self.verify


def test_hook_falls_back_to_sglang_and_counts(monkeypatch, tmp_path):
    """A prefill call goes to SGLang's method untouched, counted, and stats reach the stats folder."""
    monkeypatch.setitem(hook.STATS, "mode", "splitkv")  # the hook decides only in mode splitkv
    monkeypatch.setenv(hook.STATS_ENV, str(tmp_path))
    hook._last_write[0] = 0.0
    before = hook.STATS["fallback"]["not a target-verify step"]
    calls = []

    def original(backend, q, k, v, layer, fb, save_kv_cache=True, sinks=None, score_mod=None, aux_tensors=None):
        calls.append((q, save_kv_cache))
        return "sglang-out"

    fb = type("FB", (), {"forward_mode": _Mode(False)})()
    q = torch.zeros(2, 1, 576)
    out = hook.forward_extend_hook(original, object(), q, q, q, object(), fb, False)
    assert out == "sglang-out" and calls == [(q, False)]
    assert hook.STATS["fallback"]["not a target-verify step"] == before + 1
    files = list(tmp_path.glob("stats-*.json"))
    assert files and '"fallback"' in files[0].read_text()


def test_plugin_pyproject_declares_the_entry_point():
    text = (ROOT / "plugins/sglang/pyproject.toml").read_text()
    assert '[project.entry-points."sglang.srt.plugins"]' in text
    assert 'specdiag_splitkv = "specdiag_sglang_plugin:register"' in text


@pytest.mark.skipif(importlib.util.find_spec("sglang") is None, reason="sglang is not installed here")
def test_entry_point_registers_with_sglang():
    from importlib.metadata import entry_points

    eps = {ep.name: ep for ep in entry_points(group="sglang.srt.plugins")}
    assert "specdiag_splitkv" in eps
    from sglang.srt.plugins.hook_registry import HookRegistry

    os.environ[hook.MODE_ENV] = "splitkv"
    eps["specdiag_splitkv"].load()()
    assert HookRegistry._hooks[hook.FORWARD_EXTEND], "no hook registered on TritonAttnBackend.forward_extend"


INTERPRET_SCRIPT = r"""
import sys, torch
sys.path[:0] = [{tests!r}, {plugin!r}]
from test_sglang_plugin import make_batch, sglang_reference, rel_err
from specdiag.kernels.triton.ragged import ragged_split_kv_triton
from specdiag.kernels.plan import SplitKVConfig
cfg = SplitKVConfig(block_m=16, block_n=16, num_warps=4, num_stages=1, programs_per_sm=1.0, min_split_tokens=64,
                    merge_block_dv=128)
for lens, draft, heads, chain, cap in [([150], 8, 2, True, 0.0), ([70, 3, 200], 4, 4, False, 0.0),
                                       ([90], 4, 2, False, 5.0)]:
    batch, _ = make_batch(lens, draft, heads, chain, seed=5, dtype=torch.float16, logit_cap=cap)
    out = torch.full((batch.q.shape[0], heads, 512), float("nan"), dtype=torch.float16)
    ragged_split_kv_triton(batch.q, batch.k_ext, batch.kv_buffer, out, batch.qo_indptr,
                           batch.kv_indptr, batch.kv_indices, batch.custom_mask, batch.mask_indptr,
                           max_draft=draft, sm_scale=batch.sm_scale, logit_cap=cap, cfg=cfg, num_sms=16)
    err = rel_err(out, sglang_reference(batch))
    print(lens, draft, heads, chain, cap, err)
    assert err < 1e-2, err
# a DFLASH call: no custom mask, the plugin's causal block in its place
from test_sglang_plugin import causal_batch
batch = causal_batch([120, 33], 8, 2, seed=9)
batch = type(batch)(**{{**batch.__dict__, "q": batch.q.half(), "k_ext": batch.k_ext.half(),
                        "v_ext": batch.v_ext.half(), "kv_buffer": batch.kv_buffer.half()}})
out = torch.full((batch.q.shape[0], 2, 512), float("nan"), dtype=torch.float16)
ragged_split_kv_triton(batch.q, batch.k_ext, batch.kv_buffer, out, batch.qo_indptr, batch.kv_indptr,
                       batch.kv_indices, batch.custom_mask, batch.mask_indptr, max_draft=8,
                       sm_scale=batch.sm_scale, cfg=cfg, num_sms=16)
err = rel_err(out, sglang_reference(batch))
print("causal", err)
assert err < 1e-2, err
# splits of any number of tokens (split_round_tokens), their bounds inside tiles and across the draft rows
from dataclasses import replace
for rnd in (1, 7):
    eq = replace(cfg, min_split_tokens=1, split_round_tokens=rnd)
    batch, _ = make_batch([150, 37], 4, 2, False, seed=6, dtype=torch.float16)
    out = torch.full((batch.q.shape[0], 2, 512), float("nan"), dtype=torch.float16)
    ragged_split_kv_triton(batch.q, batch.k_ext, batch.kv_buffer, out, batch.qo_indptr, batch.kv_indptr,
                           batch.kv_indices, batch.custom_mask, batch.mask_indptr, max_draft=4,
                           sm_scale=batch.sm_scale, cfg=eq, num_sms=32)
    err = rel_err(out, sglang_reference(batch))
    print("round", rnd, err)
    assert err < 1e-2, err
print("ok")
"""


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton is not installed here")
def test_ragged_triton_kernel_in_the_interpreter():
    """The CUDA kernel's own code, run by Triton's interpreter on the CPU (TRITON_INTERPRET=1)."""
    env = dict(os.environ, TRITON_INTERPRET="1")
    res = subprocess.run([sys.executable, "-c", INTERPRET_SCRIPT.format(tests=str(ROOT / "tests"), plugin=str(ROOT / "plugins/sglang"))], env=env,
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 0 and "ok" in res.stdout, res.stdout + res.stderr


def _fake_sglang_call(verify: bool = True, page_size: int = 1, swa: int = -1, kv_dtype=torch.bfloat16,
                      scales: tuple = (None, None)):
    """Objects with the attribute names SGLang 0.5.17's backend, layer and batch carry (triton_backend.py): one
    request of 8 draft tokens x 8 heads; ``kv_dtype`` float8_e4m3fn: the fp8 pool as get_key_buffer returns it (a view
    of its uint8 storage); ``scales``: the layer's (k_scale_float, v_scale_float), None: no scale."""
    from types import SimpleNamespace as NS

    kv = torch.zeros(100, 1, D_QK, dtype=torch.uint8 if kv_dtype == torch.float8_e4m3fn else kv_dtype)
    kv = kv.view(kv_dtype)
    pool = NS(get_key_buffer=lambda i: kv, get_value_buffer=lambda i: kv[..., :D_V])
    backend = NS(token_to_kv_pool=pool, page_size=page_size, use_mla=True, dcp_size=1, enable_deterministic=False,
                 forward_metadata=NS(custom_mask=torch.ones(8, dtype=torch.bool), max_extend_len=8,
                                     qo_indptr=torch.tensor([0, 8], dtype=torch.int32)))
    k_scale = None if scales[0] is None else torch.tensor(scales[0])
    v_scale = None if scales[1] is None else torch.tensor(scales[1])
    layer = NS(layer_id=0, qk_head_dim=576, v_head_dim=512, k_scale=k_scale, v_scale=v_scale,
               k_scale_float=scales[0], v_scale_float=scales[1], sliding_window_size=swa, tp_q_head_num=8,
               is_cross_attention=False, attn_type=NS(name="DECODER"), xai_temperature_len=-1)
    fb = NS(forward_mode=_Mode(verify))
    q = torch.zeros(8, 8, D_QK, dtype=torch.bfloat16)
    return backend, q, torch.zeros(8, 1, D_QK, dtype=torch.bfloat16), torch.zeros(8, 1, D_V, dtype=torch.bfloat16), \
        layer, fb


def test_facts_read_from_sglang_objects():
    backend, q, k, v, layer, fb = _fake_sglang_call()
    facts = hook._facts(backend, q, k, v, layer, fb, None, None)
    assert facts.value_is_latent_view and facts.use_mla and facts.has_custom_mask and not facts.sliding_window
    assert decide(facts) == (False, "not on a CUDA device")  # these tensors live on the CPU
    assert decide(dataclasses.replace(facts, is_cuda=True))[0]
    for kw, words in ((dict(page_size=64), "page_size 64"), (dict(swa=4096), "sliding-window")):
        backend, q, k, v, layer, fb = _fake_sglang_call(**kw)
        facts = dataclasses.replace(hook._facts(backend, q, k, v, layer, fb, None, None), is_cuda=True)
        assert words in decide(facts)[1]
    backend, q, k, v, layer, fb = _fake_sglang_call()
    backend.token_to_kv_pool.get_value_buffer = lambda i: torch.zeros(100, 1, D_V, dtype=torch.bfloat16)
    facts = dataclasses.replace(hook._facts(backend, q, k, v, layer, fb, None, None), is_cuda=True)
    assert "value buffer" in decide(facts)[1]


def test_hook_sends_an_unservable_verify_call_to_sglang(monkeypatch):
    monkeypatch.setitem(hook.STATS, "mode", "splitkv")  # the hook decides only in mode splitkv
    backend, q, k, v, layer, fb = _fake_sglang_call()
    before = hook.STATS["fallback"]["not on a CUDA device"]
    out = hook.forward_extend_hook(lambda *a, **kw: "sglang-out", backend, q, k, v, layer, fb)
    assert out == "sglang-out" and hook.STATS["fallback"]["not on a CUDA device"] == before + 1
    assert "fallback:not on a CUDA device" in logs._logged  # logged once


def test_gluon_switch_from_env():
    assert hook.gluon_from_env({}) and hook.gluon_from_env({hook.GLUON_ENV: "1"})
    assert not hook.gluon_from_env({hook.GLUON_ENV: "0"})
    with pytest.raises(ValueError, match=hook.GLUON_ENV):
        hook.gluon_from_env({hook.GLUON_ENV: "yes"})


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton is not installed here")
def test_gluon_kernel_serves_at_every_row_count_where_it_can_run(monkeypatch):
    """The hook's choice of kernel: with SPECDIAG_SGLANG_GLUON=0 the Triton ragged kernel without asking; else the
    Gluon kernel at every row count (8 rows and one draft token too) where it can run, and where it
    cannot the reason is kept per shape (here: CPU tensors), logged once and reported in the stats."""
    pytest.importorskip("triton.experimental.gluon")
    assert hook.GLUON_MIN_ROWS == 1
    backend, q, k, v, layer, fb = _fake_sglang_call()
    fb.out_cache_loc = torch.arange(q.shape[0])
    monkeypatch.setattr(hook, "_GLUON", {})
    monkeypatch.setenv(hook.GLUON_ENV, "0")
    assert not hook._gluon_serves((64, torch.bfloat16, False, None), q, backend, layer, fb, 0.0)
    assert not hook._gluon_serves((8, torch.bfloat16, False, None), q, backend, layer, fb, 0.0)
    assert hook._GLUON == {}
    monkeypatch.setenv(hook.GLUON_ENV, "1")
    key, key8 = (64, torch.bfloat16, False, None), (8, torch.bfloat16, False, None)
    assert not hook._gluon_serves(key, q, backend, layer, fb, 0.0)
    assert not hook._gluon_serves(key8, q, backend, layer, fb, 0.0)  # one draft token x 8 heads is asked too
    assert hook._GLUON == {key: "not a CUDA device", key8: "not a CUDA device"}
    assert "gluon:" + repr(key) in logs._logged
    assert hook.stats_snapshot()["gluon"] == {repr(key): "not a CUDA device", repr(key8): "not a CUDA device"}


def test_facts_of_an_fp8_call_carry_its_rows_and_scales():
    """The fp8 pool's dtype, the call's rows (8 heads x max_extend_len 8 = 64, without it tokens / requests), and
    whether k_scale and v_scale are one number."""
    fp8 = torch.float8_e4m3fn
    backend, q, k, v, layer, fb = _fake_sglang_call(kv_dtype=fp8)
    facts = dataclasses.replace(hook._facts(backend, q, k, v, layer, fb, None, None), is_cuda=True)
    assert facts.kv_dtype == fp8 and facts.rows == 64 and not facts.kv_scaled and facts.kv_scales_equal
    assert decide(facts)[0]
    backend.forward_metadata.max_extend_len = None
    assert hook._facts(backend, q[:2], k, v, layer, fb, None, None).rows == 16  # 2 tokens of one request x 8 heads
    for scales, equal in (((0.5, 0.5), True), ((0.5, 0.25), False)):
        backend, q, k, v, layer, fb = _fake_sglang_call(kv_dtype=fp8, scales=scales)
        backend.forward_metadata.max_extend_len = 1
        facts = dataclasses.replace(hook._facts(backend, q, k, v, layer, fb, None, None), is_cuda=True)
        assert facts.kv_scaled and facts.kv_scales_equal == equal and decide(facts)[0] == equal
        assert hook.kv_scale_of(layer) == scales[0]
    assert hook.kv_scale_of(_fake_sglang_call()[4]) == 1.0


def test_an_fp8_call_no_kernel_here_can_run_goes_to_sglang_with_its_reason(monkeypatch):
    """decide() serves it but the fp8 kernel cannot run (here: SPECDIAG_SGLANG_GLUON=0, then CPU tensors): _serve
    raises Unservable before anything is stored, the hook counts the reason and returns SGLang's own output."""
    monkeypatch.setitem(hook.STATS, "mode", "splitkv")  # the hook decides only in mode splitkv
    pytest.importorskip("triton.experimental.gluon")
    fp8 = torch.float8_e4m3fn
    backend, q, k, v, layer, fb = _fake_sglang_call(kv_dtype=fp8)
    fb.out_cache_loc = torch.arange(q.shape[0])
    kv = backend.token_to_kv_pool.get_key_buffer(0)
    monkeypatch.setattr(hook, "_GLUON", {})
    key = (16, torch.bfloat16, fp8, False, None)
    monkeypatch.setenv(hook.GLUON_ENV, "0")
    assert not hook._gluon_fp8_serves(key, q, kv, 1.0, fb, 0.0)
    assert hook._GLUON[key] == f"{hook.GLUON_ENV}=0 (the fp8 kernel is the Gluon one)"
    monkeypatch.setenv(hook.GLUON_ENV, "1")
    key8 = (8, torch.bfloat16, fp8, False, None)
    assert not hook._gluon_fp8_serves(key8, q, kv, 1.0, fb, 0.0) and hook._GLUON[key8] == "not a CUDA device"

    served = dataclasses.replace(hook._facts(backend, q, k, v, layer, fb, None, None), is_cuda=True, rows=16)
    monkeypatch.setattr(hook, "_facts", lambda *a: served)
    stored = []
    monkeypatch.setattr(hook, "_store_draft_kv", lambda *a: stored.append(a))

    def no_kernel(*a, **kw):
        raise hook.Unservable("fp8 KV cache: not a CUDA device")

    monkeypatch.setattr(hook, "_serve", no_kernel)
    before = hook.STATS["fallback"]["fp8 KV cache: not a CUDA device"]
    out = hook.forward_extend_hook(lambda *a, **kw: "sglang-out", backend, q, k, v, layer, fb)
    assert out == "sglang-out" and stored == []
    assert hook.STATS["fallback"]["fp8 KV cache: not a CUDA device"] == before + 1
    assert not any(r.startswith("kernel error") for r in logs._logged)
