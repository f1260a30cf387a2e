"""The SGLang plugin's KV-layout recorder on the CPU, with fake SGLang objects (no sglang import): its on-device
counts equal specdiag.kvlayout's, it records target-verify forwards only, reads the prefix slots from req_to_token
with the batch's CPU lengths (no host sync), skips what it cannot read, and reaches the stats file; registered only
when SPECDIAG_SGLANG_LAYOUT=1, on its own without turning the verify kernel on."""

from __future__ import annotations

import json
import sys
import types

import numpy as np
import pytest
import torch

from specdiag.kvlayout import layout_stats
from specdiag_sglang_plugin import hook, layout


@pytest.fixture(autouse=True)
def _clean():
    layout.RECORDS.clear()
    layout.COUNTS.clear()
    layout._PENDING.clear()
    layout._STATE.update(forward=0, on_new=None, dirty=False)
    yield
    layout.RECORDS.clear()
    layout.COUNTS.clear()


@pytest.mark.parametrize("seed", range(6))
def test_counts_on_device_equal_the_reference(seed):
    rng = np.random.default_rng(seed)
    pieces = [np.arange(s, s + n) for s, n in zip(rng.integers(0, 10_000, 40), rng.integers(1, 150, 40))]
    slots = np.concatenate(pieces)
    ref = layout_stats(slots)
    got = layout.layout_counts(torch.from_numpy(slots).to(torch.int32)).tolist()
    assert got == [ref.runs, ref.tokens_in_long_runs, ref.longest_run]
    assert layout.layout_counts(torch.zeros(0, dtype=torch.int64)).tolist() == [0, 0, 0]


class _Mode:
    def __init__(self, verify: bool):
        self.verify = verify

    def is_target_verify(self):
        return self.verify


def _batch(table: torch.Tensor, reqs: list[int], lens: list[int], verify: bool = True, cpu_lens: bool = True):
    return types.SimpleNamespace(forward_mode=_Mode(verify), req_pool_indices=torch.tensor(reqs),
                                 seq_lens_cpu=torch.tensor(lens) if cpu_lens else None,
                                 seq_lens=torch.tensor(lens))


def _runner(table: torch.Tensor, draft: bool = False):
    return types.SimpleNamespace(is_draft_worker=draft, req_to_token_pool=types.SimpleNamespace(req_to_token=table))


def test_records_each_verify_forwards_requests():
    table = torch.zeros(4, 300, dtype=torch.int32)
    table[1, :200] = torch.arange(1000, 1200)  # contiguous
    table[3, :90] = torch.from_numpy(np.random.default_rng(0).permutation(90) + 5)  # scattered
    runner = _runner(table)
    assert hook.forward_extend_hook is not None  # the plugin module imports beside it
    layout.before_forward_hook(runner, _batch(table, [1, 3], [200, 90]))
    layout.before_forward_hook(runner, _batch(table, [1], [150], verify=False))  # prefill/decode: nothing
    layout.before_forward_hook(_runner(table, draft=True), _batch(table, [1], [150]))  # the drafter: nothing
    layout.before_forward_hook(runner, _batch(table, [1], [150], cpu_lens=False))  # no CPU lengths: skipped, no sync
    assert len(layout.RECORDS) == 1 and layout.COUNTS["observed"] == 1
    assert layout.COUNTS["skipped_no_seq_lens_cpu"] == 1
    rec = layout.RECORDS[0]
    assert rec["batch"] == 2 and rec["forward"] == 1
    a, b = rec["requests"]
    assert a == {"prefix_tokens": 200, "runs": 1, "tokens_in_long_runs": 200, "longest_run": 200}
    ref = layout_stats(table[3, :90].numpy())
    assert (b["runs"], b["tokens_in_long_runs"], b["longest_run"]) == (ref.runs, 0, ref.longest_run)


def test_a_failing_observation_never_fails_the_forward():
    bad = types.SimpleNamespace(forward_mode=_Mode(True), req_pool_indices=None, seq_lens_cpu=torch.tensor([3]))
    assert layout.before_forward_hook(_runner(torch.zeros(1, 4, dtype=torch.int32)), bad) is None
    assert any(k.startswith("error:") for k in layout.COUNTS)


def test_records_reach_the_stats_file(monkeypatch, tmp_path):
    monkeypatch.setenv(hook.STATS_ENV, str(tmp_path))
    layout._STATE["on_new"] = lambda: hook._maybe_write_stats(force=True)
    table = torch.arange(1, 65, dtype=torch.int32).reshape(1, 64)
    layout.before_forward_hook(_runner(table), _batch(table, [0], [64]))
    layout.flush_new()
    data = json.loads(next(tmp_path.glob("stats-*.json")).read_text())
    rec = data["layout"]["records"][0]
    assert rec["requests"][0] == {"prefix_tokens": 64, "runs": 1, "tokens_in_long_runs": 64, "longest_run": 64}
    assert data["layout"]["long_run"] == 64 and data["layout"]["counts"]["observed"] == 1


def test_env_switch():
    assert layout.layout_from_env({}) is False
    assert layout.layout_from_env({layout.LAYOUT_ENV: "1"}) is True
    with pytest.raises(ValueError, match="SPECDIAG_SGLANG_LAYOUT"):
        layout.layout_from_env({layout.LAYOUT_ENV: "yes please"})


class _Registry:
    calls: list = []

    @classmethod
    def register(cls, target, fn, kind):
        cls.calls.append((target, kind))


def _fake_sglang(monkeypatch):
    _Registry.calls = []
    mod = types.ModuleType("sglang.srt.plugins.hook_registry")
    mod.HookRegistry = _Registry
    mod.HookType = type("HookType", (), {"AROUND": "around", "AFTER": "after", "BEFORE": "before"})
    for name in ("sglang", "sglang.srt", "sglang.srt.plugins"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    monkeypatch.setitem(sys.modules, "sglang.srt.plugins.hook_registry", mod)


def test_layout_alone_registers_only_the_recorder(monkeypatch):
    """A stock-Triton or FlashInfer arm: the layout is recorded, SGLang's attention runs unchanged."""
    _fake_sglang(monkeypatch)
    monkeypatch.delenv(hook.PLUGINS_ENV, raising=False)
    monkeypatch.delenv(hook.MODE_ENV, raising=False)
    monkeypatch.setenv(layout.LAYOUT_ENV, "1")
    hook.register()
    assert _Registry.calls == [(layout.MODEL_RUNNER_FORWARD, "before")] and hook.STATS["mode"] == "off"
    monkeypatch.setenv(hook.MODE_ENV, "off")
    _Registry.calls = []
    hook.register()
    assert _Registry.calls == [(layout.MODEL_RUNNER_FORWARD, "before")]
    monkeypatch.setenv(hook.MODE_ENV, "splitkv")  # beside the kernel
    _Registry.calls = []
    hook.register()
    assert (layout.MODEL_RUNNER_FORWARD, "before") in _Registry.calls and (hook.FORWARD_EXTEND, "around") in \
        _Registry.calls
    monkeypatch.setenv(layout.LAYOUT_ENV, "0")
    _Registry.calls = []
    hook.register()
    assert (layout.MODEL_RUNNER_FORWARD, "before") not in _Registry.calls
