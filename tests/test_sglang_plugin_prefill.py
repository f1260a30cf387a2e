"""The plugin's prefill path (plugins/sglang prefill.py, backends.py) on fakes of SGLang's objects, and the prefill
kernel's own code in Triton's CPU interpreter against the fp32 reference (the kernel on a GPU: test_kernels_gpu.py)."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import types
from collections import Counter
from pathlib import Path

import pytest

from specdiag_sglang_plugin import backends, hook, logs, prefill

ROOT = Path(__file__).resolve().parents[1]


class _Mode:
    def __init__(self, extend: bool = True):
        self.extend = extend

    def is_extend_without_speculative(self):
        return self.extend


def _attn(backend="triton", disable=False, kv_dtype="auto", logit_cap=0.0):
    return types.SimpleNamespace(current_attention_backend=backend, disable_chunked_prefix_cache=disable,
                                 chunked_prefix_cache_threshold=8192, kv_cache_dtype=kv_dtype,
                                 attn_mha=types.SimpleNamespace(logit_cap=logit_cap))


def _batch(prefix=(16384,), extend=True):
    import torch

    return types.SimpleNamespace(forward_mode=_Mode(extend), extend_prefix_lens_cpu=list(prefix), attn_dcp_metadata=None,
                                 attn_attend_prefix_cache=None, seq_lens=torch.zeros(1, dtype=torch.int64),
                                 token_to_kv_pool=types.SimpleNamespace(dtype=torch.bfloat16))


@pytest.fixture
def fake_sglang(monkeypatch):
    """The two SGLang modules the dispatch hook imports when it acts, as fakes."""
    forward_methods = types.ModuleType("sglang.srt.models.deepseek_common.attention_forward_methods.forward_methods")
    forward_methods.AttnForwardMethod = types.SimpleNamespace(MHA_CHUNKED_KV=types.SimpleNamespace(name="MHA_CHUNKED_KV"))
    graph = types.ModuleType("sglang.srt.model_executor.runner_backend_utils.tc_piecewise_cuda_graph")
    graph.is_in_tc_piecewise_cuda_graph = lambda: False
    for mod in (forward_methods, graph):
        monkeypatch.setitem(sys.modules, mod.__name__, mod)
    monkeypatch.setattr(prefill.torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(logs, "_logged", set())
    monkeypatch.setitem(prefill.STATS, "declined", Counter())
    monkeypatch.setitem(prefill.STATS, "probe", {})
    monkeypatch.setattr(prefill, "probe", lambda device, dtype: "")  # the kernel runs here (its probe: below)
    return graph


MLA = types.SimpleNamespace(name="MLA")


def test_a_long_triton_chunk_takes_the_mha_form(fake_sglang):
    method = prefill.dispatch_hook(lambda attn, fb: MLA, _attn(), _batch((16384,)))
    assert method.name == "MHA_CHUNKED_KV"


@pytest.mark.parametrize("attn,batch,reason", [
    (_attn(backend="flashinfer"), _batch(), None),  # another backend's choice is its own
    (_attn(), _batch((4096,)), None),  # a prefix under SGLang's threshold: the absorbed form is SGLang's pick
    (_attn(), _batch(extend=False), None),  # decode, verify, draft extend
    (_attn(disable=True), _batch(), "chunked prefix cache is off"),
    (_attn(kv_dtype="fp8_e4m3"), _batch(), "KV cache fp8_e4m3"),
    (_attn(logit_cap=30.0), _batch(), "logit cap"),
])
def test_sglangs_choice_stands_where_the_kernel_does_not_serve(fake_sglang, caplog, attn, batch, reason):
    with caplog.at_level("WARNING", logger="specdiag_sglang_plugin"):
        assert prefill.dispatch_hook(lambda a, fb: MLA, attn, batch) is MLA
        prefill.dispatch_hook(lambda a, fb: MLA, attn, batch)
    lines = [r.getMessage() for r in caplog.records]
    if reason is None:
        assert lines == [] and not prefill.STATS["declined"]
    else:  # said once however many calls, and counted per call
        assert len(lines) == 1 and reason in lines[0] and "stays SGLang's" in lines[0]
        assert sum(prefill.STATS["declined"].values()) == 2


def test_a_kernel_that_fails_its_probe_leaves_every_chunk_to_sglang(fake_sglang, monkeypatch, caplog):
    """Probed once per device and dtype before the first chunk it would take (a prefix chunk cannot go back to
    SGLang); where the probe fails the absorbed form stays, with the probe's reason logged once and counted."""
    probes: list = []
    monkeypatch.setattr(prefill, "probe", lambda device, dtype: probes.append((str(device), dtype)) or
                        "its probe raised CompilationError: 32 bit offsets")
    with caplog.at_level("WARNING", logger="specdiag_sglang_plugin"):
        assert prefill.dispatch_hook(lambda a, fb: MLA, _attn(), _batch()) is MLA
        assert prefill.dispatch_hook(lambda a, fb: MLA, _attn(), _batch()) is MLA
    assert len(probes) == 1 and prefill.STATS["declined"] == Counter(
        {"its probe raised CompilationError: 32 bit offsets": 2})
    lines = [r.getMessage() for r in caplog.records]
    assert len([x for x in lines if "prefill kernel unusable on cpu torch.bfloat16" in x]) == 1


def test_a_served_call_that_raises_stops_the_mha_form_for_later_chunks(fake_sglang, monkeypatch):
    """A prefix chunk that raises cannot be served by SGLang's Triton backend: the error stands for that request, and
    every later chunk runs SGLang's absorbed form; a first chunk that raises goes to SGLang and so do later ones."""
    import torch

    assert prefill.dispatch_hook(lambda a, fb: MLA, _attn(), _batch()).name == "MHA_CHUNKED_KV"
    monkeypatch.setitem(hook.STATS, "prefill", "mha")
    monkeypatch.setattr(prefill, "is_mha_call", lambda *a: True)

    def broken(*a, **kw):
        raise RuntimeError("launch failed")

    monkeypatch.setattr(prefill, "mha_call", broken)
    q = torch.zeros(4, 2 * 192, dtype=torch.bfloat16)
    chunk = types.SimpleNamespace(attn_attend_prefix_cache=True)
    with pytest.raises(RuntimeError, match="launch failed"):
        hook.forward_extend_hook(lambda *a, **kw: "sglang-out", object(), q, q, q, object(), chunk)
    assert "RuntimeError" in prefill.STATS["probe"]["cpu torch.bfloat16"]
    assert prefill.dispatch_hook(lambda a, fb: MLA, _attn(), _batch()) is MLA
    first = types.SimpleNamespace(attn_attend_prefix_cache=None)
    assert hook.forward_extend_hook(lambda *a, **kw: "sglang-out", object(), q, q, q, object(), first) == "sglang-out"
    prefill.STATS["probe"].clear()  # a first chunk that raises: SGLang serves it, and the kernel is off after it
    assert hook.forward_extend_hook(lambda *a, **kw: "sglang-out", object(), q, q, q, object(), first) == "sglang-out"
    assert "RuntimeError" in prefill.STATS["probe"]["cpu torch.bfloat16"]
    assert prefill.dispatch_hook(lambda a, fb: MLA, _attn(), _batch()) is MLA


def test_the_probe_names_a_kernel_that_raises_or_is_wrong(monkeypatch):
    """The probe itself (the kernel replaced): a raise, a wrong output and a NaN lse each give a reason; the reference
    given back as the kernel's output passes. It asks with SGLang's index types (int64 qo_indptr, int32 prefix)."""
    import torch

    import specdiag.kernels.prefill as kp

    seen: list = []

    def as_reference(q, k, v, cu_q, cu_k, max_q, causal, scale, return_lse=False, cfg=None, shift=0.0, lse_nan=False):
        seen.append((cu_q.dtype, cu_k.dtype, causal))
        o, lse = kp.reference(q, k, v, cu_q, cu_k, causal, scale)
        return (o + shift).to(q.dtype), lse * (float("nan") if lse_nan else 1.0)

    monkeypatch.setattr(kp, "prefill", as_reference)
    assert prefill.probe("cpu", torch.float32, cfg=object()) == ""
    assert seen == [(torch.int64, torch.int64, True), (torch.int64, torch.int32, False)]
    monkeypatch.setattr(kp, "prefill", lambda *a, **kw: as_reference(*a, **kw, shift=1.0))
    assert "causal call) is off the fp32 reference" in prefill.probe("cpu", torch.float32, cfg=object())
    monkeypatch.setattr(kp, "prefill", lambda *a, **kw: as_reference(*a, **kw, lse_nan=True))
    assert "lse err nan" in prefill.probe("cpu", torch.float32, cfg=object())

    def raises(*a, **kw):
        raise ValueError("TMA cannot read these inputs\nuse a configuration without tma")

    monkeypatch.setattr(kp, "prefill", raises)
    assert prefill.probe("cpu", torch.float32, cfg=object()) == (
        "its probe raised ValueError: use a configuration without tma")


def test_prefill_cuda_graphs_keep_the_absorbed_form(fake_sglang):
    fake_sglang.is_in_tc_piecewise_cuda_graph = lambda: True
    assert prefill.dispatch_hook(lambda a, fb: MLA, _attn(), _batch()) is MLA
    assert "prefill CUDA graphs" in next(iter(prefill.STATS["declined"]))


def test_other_methods_pass_through_untouched(fake_sglang):
    mha = types.SimpleNamespace(name="MHA")
    assert prefill.dispatch_hook(lambda a, fb: mha, _attn(), _batch((0,))) is mha


def test_mha_calls_are_told_from_absorbed_and_verify_calls():
    backend = types.SimpleNamespace(use_mla=True)
    mha_layer = types.SimpleNamespace(qk_head_dim=192, v_head_dim=128, tp_q_head_num=8, tp_k_head_num=8)
    latent_layer = types.SimpleNamespace(qk_head_dim=576, v_head_dim=512, tp_q_head_num=8, tp_k_head_num=1)
    chunked = _batch((16384,))
    chunked.attn_attend_prefix_cache = False
    assert prefill.is_mha_call(backend, object(), mha_layer, chunked, save_kv_cache=False)
    assert prefill.is_mha_call(backend, object(), mha_layer, _batch((0,)), save_kv_cache=False)  # a first chunk
    assert not prefill.is_mha_call(backend, object(), mha_layer, _batch((16384,)), save_kv_cache=False)  # no path
    assert not prefill.is_mha_call(backend, object(), latent_layer, chunked, save_kv_cache=False)
    assert not prefill.is_mha_call(backend, object(), mha_layer, chunked, save_kv_cache=True)
    assert not prefill.is_mha_call(backend, None, mha_layer, chunked, save_kv_cache=False)
    assert not prefill.is_mha_call(backend, object(), mha_layer, _batch(extend=False), save_kv_cache=False)
    assert not prefill.is_mha_call(types.SimpleNamespace(use_mla=False), object(), mha_layer, chunked, False)


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton is not installed here")
def test_an_mha_call_reaches_the_kernel_with_sglangs_parts_and_the_configured_tiles(monkeypatch):
    """mha_call on fakes of SGLang's objects, the kernel replaced by a recorder: a prefix chunk (no mask, its own
    cu_seq_lens, lse returned), the chunk's own causal part (lse when SGLang merges), a first chunk (flat output), each
    with the configuration SPECDIAG_SGLANG_PREFILL_CONFIG names."""
    import torch

    import specdiag.kernels.prefill as kp

    calls: list = []

    def fake_prefill(q, k, v, cu_q, cu_k, max_q, causal, scale, return_lse=False, cfg=None):
        calls.append({"cu_k": cu_k.tolist(), "max_q": max_q, "causal": causal, "lse": return_lse, "cfg": cfg,
                      "shapes": (tuple(q.shape), tuple(k.shape), tuple(v.shape))})
        o = torch.zeros(q.shape[0], q.shape[1], v.shape[-1])
        return (o, torch.zeros(q.shape[0], q.shape[1])) if return_lse else o

    monkeypatch.setattr(kp, "prefill", fake_prefill)
    monkeypatch.setenv(prefill.CONFIG_ENV, "128:64:8:2:tma")
    monkeypatch.delenv("SPECDIAG_SGLANG_CHECK", raising=False)
    monkeypatch.setattr(prefill, "STATS", {"served": Counter(), "declined": Counter(), "check": []})
    heads, n_q = 2, 5
    layer = types.SimpleNamespace(tp_q_head_num=heads, tp_k_head_num=heads, qk_head_dim=192, v_head_dim=128,
                                  scaling=0.1, layer_id=0)
    backend = types.SimpleNamespace(forward_metadata=types.SimpleNamespace(qo_indptr=torch.tensor([0, n_q])))
    q = torch.zeros(n_q, heads * 192)

    def batch(attend, lse=False):
        return types.SimpleNamespace(extend_seq_lens_cpu=[n_q], attn_attend_prefix_cache=attend, prefix_chunk_idx=1,
                                     prefix_chunk_cu_seq_lens=[torch.tensor([0, 7]), torch.tensor([0, 9])],
                                     mha_return_lse=lse)

    o, lse = prefill.mha_call(backend, q, torch.zeros(9, heads * 192), torch.zeros(9, heads, 128), layer, batch(True))
    assert o.shape == (n_q, heads, 128) and lse.shape == (n_q, heads)
    own = prefill.mha_call(backend, q, torch.zeros(n_q, heads * 192), torch.zeros(n_q, heads, 128), layer,
                           batch(False, lse=True))
    first = prefill.mha_call(backend, q, torch.zeros(n_q, heads * 192), torch.zeros(n_q, heads, 128), layer,
                             batch(None))
    assert isinstance(own, tuple) and first.shape == (n_q, heads * 128)
    assert [(c["cu_k"], c["causal"], c["lse"]) for c in calls] == [([0, 9], False, True), ([0, n_q], True, True),
                                                                    ([0, n_q], True, False)]
    assert all(c["cfg"].spec == "128:64:8:2:tma" and c["max_q"] == n_q for c in calls)
    assert calls[0]["shapes"] == ((n_q, heads, 192), (9, heads, 192), (9, heads, 128))
    assert prefill.STATS["served"] == Counter({"prefix_chunk": 1, "own_chunk": 1, "no_prefix": 1})


def test_the_prefill_switch_is_checked():
    assert prefill.prefill_from_env({}) == "off"
    assert prefill.prefill_from_env({prefill.PREFILL_ENV: "MHA"}) == "mha"
    with pytest.raises(ValueError, match="use mha"):
        prefill.prefill_from_env({prefill.PREFILL_ENV: "fast"})


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton is not installed here")
def test_the_kernel_configuration_comes_from_the_environment():
    assert prefill.config_from_env({}) is None
    cfg = prefill.config_from_env({prefill.CONFIG_ENV: "128:128:8:2:tma"})
    assert (cfg.block_m, cfg.block_n, cfg.num_warps, cfg.num_stages, cfg.tma) == (128, 128, 8, 2, True)
    assert cfg.spec == "128:128:8:2:tma" and prefill.config_from_env({prefill.CONFIG_ENV: " 64:64:4:3 "}).spec == "64:64:4:3"
    for bad in ("128:128:8", "128:128:8:2:fast", "0:128:8:2", "128:128:8:2:tma:tma"):
        with pytest.raises(ValueError, match=prefill.CONFIG_ENV + ".*block_m:block_n:warps:stages"):
            prefill.config_from_env({prefill.CONFIG_ENV: bad})


def test_06_names_the_fastest_correct_configuration_at_the_longest_prefix():
    from specdiag.steps.kernel_ab.prefill import best_config

    def row(prefix, arm, ms, correct=True, **cfg):
        return {"prefix_tokens": prefix, "arm": arm, "ms_median": ms, "correct": correct,
                "config": {"block_m": 128, "block_n": 128, "num_warps": 8, "num_stages": 2, **cfg}}

    rows = [row(122880, "triton", 11.0), row(122880, "triton_m128_n128_w8_s2_tma", 9.5, tma=True),
            row(122880, "triton_m128_n64_w4_s3", 9.0, correct=False, block_n=64),
            row(65536, "triton_m64_n64_w4_s3", 2.0, block_m=64),
            {"prefix_tokens": 122880, "arm": "flashinfer_ragged", "ms_median": 7.0, "correct": True, "config": None}]
    assert best_config(rows) == "128:128:8:2:tma"
    assert best_config(rows[2:3]) is None and best_config([]) is None


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton is not installed here")
def test_registration_names_the_tiles_and_a_bad_configuration_leaves_sglangs_prefill(monkeypatch, caplog):
    registered: list = []
    registry = type("R", (), {"register": classmethod(lambda cls, t, fn, kind: registered.append(t))})
    server_args = types.ModuleType("sglang.srt.server_args")
    server_args.add_chunked_prefix_cache_attention_backend = lambda name: None
    for name in ("sglang", "sglang.srt"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    monkeypatch.setitem(sys.modules, server_args.__name__, server_args)
    monkeypatch.setattr(logs, "_logged", set())
    kinds = types.SimpleNamespace(AROUND="around")
    with caplog.at_level("INFO", logger="specdiag_sglang_plugin"):
        monkeypatch.setenv(prefill.CONFIG_ENV, "128:64")
        assert not prefill.register_prefill(registry, kinds) and registered == []
        monkeypatch.delenv(prefill.CONFIG_ENV)
        assert prefill.register_prefill(registry, kinds) and registered == [prefill.DISPATCH]
    text = " ".join(r.getMessage() for r in caplog.records)
    assert f"{prefill.CONFIG_ENV}: bad prefill configuration '128:64'" in text and "prefill stays SGLang's" in text
    from specdiag.kernels.triton.prefill import DEFAULT_CONFIG

    assert f"tiles {DEFAULT_CONFIG.spec})" in text


def test_register_adds_the_prefill_hooks_only_when_asked(monkeypatch):
    registered: list = []
    added: list = []
    registry = type("R", (), {"register": classmethod(lambda cls, t, fn, kind: registered.append((t, kind)))})
    kinds = types.SimpleNamespace(AROUND="around", AFTER="after", BEFORE="before")
    hook_registry = types.ModuleType("sglang.srt.plugins.hook_registry")
    hook_registry.HookRegistry, hook_registry.HookType = registry, kinds
    server_args = types.ModuleType("sglang.srt.server_args")
    server_args.add_chunked_prefix_cache_attention_backend = added.append
    for name in ("sglang", "sglang.srt", "sglang.srt.plugins"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    monkeypatch.setitem(sys.modules, hook_registry.__name__, hook_registry)
    monkeypatch.setitem(sys.modules, server_args.__name__, server_args)
    monkeypatch.setattr(logs, "_logged", set())
    monkeypatch.setenv(hook.MODE_ENV, "splitkv")
    monkeypatch.setenv(hook.NGRAM_TAIL_ENV, "0")
    monkeypatch.delenv(prefill.PREFILL_ENV, raising=False)
    hook.register()
    assert (prefill.DISPATCH, "around") not in registered and added == [] and hook.STATS["prefill"] == "off"
    assert (backends.INIT_BACKENDS, "after") in registered and (hook.FORWARD_EXTEND, "around") in registered
    registered.clear()
    monkeypatch.setenv(prefill.PREFILL_ENV, "mha")
    monkeypatch.setenv(hook.MODE_ENV, "upstream")  # prefill without the split-KV verify: the extend hook still goes in
    hook.register()
    assert (prefill.DISPATCH, "around") in registered and added == ["triton"] and hook.STATS["prefill"] == "mha"
    assert (hook.FORWARD_EXTEND, "around") in registered
    monkeypatch.setitem(hook.STATS, "prefill", "off")


def test_the_log_says_which_paths_run():
    line = backends.describe("flashinfer", "triton", "decode", True, True, False, False)
    assert line == ("target: verify on the triton backend through specdiag's split-KV kernel; "
                    "prefill on flashinfer (chunked-prefix MHA form)")
    idle = backends.describe("flashinfer", "flashinfer", "prefill", True, True, False, False)
    assert "IDLE" in idle and "runs on flashinfer" in idle and "--decode-attention-backend triton" in idle
    assert "absorbed form" in backends.describe("triton", "triton", "prefill", True, True, False, False)
    assert "specdiag's kernel" in backends.describe("triton", "triton", "prefill", True, True, True, False)
    assert backends.describe("triton", "triton", "decode", True, True, True, True) == "drafter: attention on triton"
    assert backends.describe("flashinfer", "triton", "decode", True, True, False, True) == (
        "drafter: attention on flashinfer (prefill) and triton (decode)")
    assert "verify is off" in backends.describe("triton", "triton", "prefill", True, False, False, False)


KERNEL_SCRIPT = r"""
import math, torch
from specdiag.kernels.prefill import reference, merge, PrefillShape, make_inputs
from specdiag.kernels.triton.prefill import prefill_triton, PrefillConfig
torch.manual_seed(0)
import sys
cfg = PrefillConfig(block_m=16, block_n=16, num_warps=4, num_stages=1, tma=sys.argv[1] == "tma")
def rel(a, b):
    fin = torch.isfinite(b)
    return float((a.float()[fin] - b[fin]).norm() / b[fin].norm())
# ragged requests: causal chunks, a prefix chunk with a request that has no keys, a causal call with a longer key side
for causal, ql, kl in ((True, [37, 20], [37, 20]), (False, [37, 5], [50, 0]), (True, [9], [40])):
    cu_q = torch.tensor([0] + torch.tensor(ql).cumsum(0).tolist(), dtype=torch.int32)
    cu_k = torch.tensor([0] + torch.tensor(kl).cumsum(0).tolist(), dtype=torch.int32)
    q, k = torch.randn(sum(ql), 2, 192), torch.randn(sum(kl), 2, 192)
    v = torch.randn(sum(kl), 2, 256)[..., 128:]  # a strided view, as SGLang passes it
    o, lse = prefill_triton(q, k, v, cu_q, cu_k, max(ql), causal, 1 / math.sqrt(192), return_lse=True, cfg=cfg)
    ro, rl = reference(q, k, v, cu_q, cu_k, causal, 1 / math.sqrt(192))
    assert rel(o, ro) < 1e-5 and rel(lse, rl) < 1e-5, (causal, ql, kl, rel(o, ro), rel(lse, rl))
    assert torch.equal(torch.isinf(lse), torch.isinf(rl)) and torch.equal(o[torch.isinf(lse)], torch.zeros_like(o[torch.isinf(lse)]))
# SGLang's chunked path: the prefix part (no mask) and the chunk (causal) merged by their lse = one causal call
x = make_inputs(PrefillShape(prefix_tokens=40, chunk_tokens=24, heads=2), dtype=torch.float32)
cq = torch.tensor([0, 24], dtype=torch.int32)
o1, l1 = prefill_triton(x["q"], x["k"][:40], x["v"][:40], cq, torch.tensor([0, 40], dtype=torch.int32), 24, False,
                        x["sm_scale"], return_lse=True, cfg=cfg)
o2, l2 = prefill_triton(x["q"], x["k"][40:], x["v"][40:], cq, cq, 24, True, x["sm_scale"], return_lse=True, cfg=cfg)
om, lm = merge(o1, l1, o2, l2)
ro, rl = reference(x["q"], x["k"], x["v"], cq, torch.tensor([0, 64], dtype=torch.int32), True, x["sm_scale"])
assert rel(om, ro) < 1e-5 and rel(lm, rl) < 1e-5, (rel(om, ro), rel(lm, rl))
print("prefill kernel ok")
"""


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton is not installed here")
@pytest.mark.parametrize("loads", ["pointers", "tma"])
def test_the_prefill_kernel_matches_the_reference_in_the_interpreter(loads):
    """Both loaders (pointer loads; TMA descriptors) on ragged, strided inputs."""
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(ROOT / "lib")}
    res = subprocess.run([sys.executable, "-c", KERNEL_SCRIPT, loads], env=env, capture_output=True, text=True,
                         timeout=300)
    assert res.returncode == 0 and "prefill kernel ok" in res.stdout, res.stderr[-3000:]


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton is not installed here")
@pytest.mark.parametrize("spec,cu_k", [("128:128:8:2", "*i64"), ("128:64:8:3:tma", "*i64"),
                                       ("128:64:8:3:tma", "*i32")])
def test_the_prefill_kernel_compiles_for_sm90_with_sglangs_offset_types(spec, cu_k):
    """SGLang passes its int64 qo_indptr (a first chunk, a chunk's own part) and int32 prefix-chunk offsets; a TMA
    descriptor takes 32-bit offsets only, which Triton's interpreter does not check: the sm_90 compile (no GPU) does."""
    sys.path.insert(0, str(ROOT / "scripts"))
    import kernel_ptx_hashes

    assert kernel_ptx_hashes.prefill_sm90(spec, cu_q="*i64", cu_k=cu_k).metadata.shared > 0


def test_pair_counts_and_flops():
    from specdiag.kernels.prefill import PrefillShape, mha_flops, visible_pairs

    assert visible_pairs(4, 4, causal=True) == 10 and visible_pairs(2, 5, causal=True) == 4 + 5
    assert visible_pairs(3, 1, causal=True) == 1 and visible_pairs(3, 7, causal=False) == 21
    # an 8k chunk after a 120k prefix, 8 heads: 640 FLOP a pair and head
    shape = PrefillShape(prefix_tokens=122_880, chunk_tokens=8192, heads=8)
    assert shape.flops() == mha_flops(8, 122_880 * 8192 + 8192 * 8193 // 2) == 640 * 8 * (122_880 * 8192 + 33_558_528)


def test_a_check_arms_prefill_calls_are_summarised_for_run_json():
    from specdiag.sweep.driver import kept_stats, prefill_check_summary

    stats = [{"prefill": {"served": {"prefix_chunk": 2}, "check": [
        {"rel_err": 3e-3, "lse_abs_err": 1e-3, "keys": 122880, "prefix_chunk": True},
        {"rel_err": 5e-3, "lse_abs_err": None, "keys": 8192, "prefix_chunk": False}]}}]
    s = prefill_check_summary(stats)
    assert s["calls"] == 2 and s["prefix_chunk_calls"] == 1 and s["max_rel_err"] == 5e-3 and s["passed"]
    assert s["keys_max"] == 122880 and s["max_lse_abs_err"] == 1e-3
    assert not prefill_check_summary([{"prefill": {"check": [{"rel_err": 0.5, "keys": 9}]}}])["passed"]
    assert not prefill_check_summary([{}])["passed"]  # no calls checked: nothing passed
    assert kept_stats(stats[0])["prefill"] == {"served": {"prefix_chunk": 2}, "check_n": 2}
