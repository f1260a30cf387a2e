"""The SGLang plugin's contiguous KV allocator (specdiag_sglang_plugin.contiguous) against a fake of SGLang's
TokenToKVPoolAllocator transcribed below (no sglang import): registered only with SPECDIAG_SGLANG_KV_ALLOC=contiguous,
said once in the log; installed through the hook registry on the model runner's page_size-1 allocator only; then
SGLang's interface (alloc, free, free groups, clear, available_size, merge_and_sort_free) is served by
the contiguous allocator, a request's KV stays in one run, and mixed traffic loses no slot and doubles none."""

from __future__ import annotations

import functools
import sys
import types

import numpy as np
import pytest
import torch

from specdiag.kvlayout import layout_stats
from specdiag_sglang_plugin import contiguous, hook, logs


# -- a transcription of SGLang's allocator: sglang/srt/mem_cache/allocator/base.py and token.py (page_size 1) --------
class BaseTokenToKVPoolAllocator:
    def __init__(self, size, page_size, dtype, device, kvcache, need_sort):
        self.size, self.page_size, self.dtype, self.device = size, page_size, dtype, device
        self._kvcache, self.need_sort = kvcache, need_sort
        self.free_pages = self.release_pages = None
        self.is_not_in_free_group = True
        self.free_group = []

    def available_size(self):
        return (len(self.free_pages) + len(self.release_pages)) * self.page_size

    def free_group_begin(self):
        self.is_not_in_free_group = False
        self.free_group = []

    def free_group_end(self):
        self.is_not_in_free_group = True
        if self.free_group:
            self.free(torch.cat(self.free_group))

    def merge_and_sort_free(self):
        if len(self.release_pages) > 0:
            self.free_pages = torch.cat((self.free_pages, self.release_pages))
            self.free_pages, _ = torch.sort(self.free_pages)
            self.release_pages = torch.empty((0,), dtype=self.release_pages.dtype, device=self.device)


class TokenToKVPoolAllocator(BaseTokenToKVPoolAllocator):
    def __init__(self, size, dtype, device, kvcache, need_sort):
        super().__init__(size, 1, dtype, device, kvcache, need_sort)
        self.clear()

    def clear(self):
        self.free_pages = torch.arange(1, self.size + 1, dtype=torch.int64, device=self.device)
        self.is_not_in_free_group = True
        self.free_group = []
        self.release_pages = torch.empty((0,), dtype=torch.int64, device=self.device)

    def available_size(self):
        return len(self.free_pages) + len(self.release_pages)

    def alloc(self, need_size):
        if self.need_sort and need_size > len(self.free_pages):
            self.merge_and_sort_free()
        if need_size > len(self.free_pages):
            return None
        select_index = self.free_pages[:need_size]
        self.free_pages = self.free_pages[need_size:]
        return select_index

    def free(self, free_index):
        if free_index.numel() == 0:
            return
        if self.is_not_in_free_group:
            if self.need_sort:
                self.release_pages = torch.cat((self.release_pages, free_index))
            else:
                self.free_pages = torch.cat((self.free_pages, free_index))
        else:
            self.free_group.append(free_index)


class PagedTokenToKVPoolAllocator(TokenToKVPoolAllocator):  # stands for any other allocator (here page_size 64)
    def __init__(self, size, dtype, device, kvcache, need_sort):
        super().__init__(size, dtype, device, kvcache, need_sort)
        self.page_size = 64


class ModelRunner:
    def __init__(self, allocator):
        self.allocator = allocator

    def alloc_memory_pool(self, memory_pool_config=None):
        self.token_to_kv_pool_allocator = self.allocator


CLASSES = {"TokenToKVPoolAllocator": TokenToKVPoolAllocator, "ModelRunner": ModelRunner}


class _Registry:
    """SGLang's HookRegistry in small: hooks kept per dotted target, applied as its _wrap_fn wraps them."""

    hooks: list = []

    @classmethod
    def register(cls, target, fn, kind):
        cls.hooks.append((target, fn, kind))

    @classmethod
    def apply(cls):
        for target, fn, kind in cls.hooks:
            owner, attr = target.rsplit(".", 2)[-2:]
            obj = CLASSES[owner]
            original = getattr(obj, attr)
            if kind == "around":
                wrapper = functools.wraps(original)(lambda *a, _o=original, _f=fn, **k: _f(_o, *a, **k))
            else:
                def wrapper(*a, _o=original, _f=fn, **k):
                    result = _o(*a, **k)
                    modified = _f(result, *a, **k)
                    return modified if modified is not None else result
            setattr(obj, attr, wrapper)


HOOK_TYPE = types.SimpleNamespace(AROUND="around", AFTER="after", BEFORE="before")


@pytest.fixture
def hooked(monkeypatch):
    """The hooks of SPECDIAG_SGLANG_KV_ALLOC=contiguous applied to the fake classes (undone after the test)."""
    monkeypatch.setattr(logs, "_logged", set())
    _Registry.hooks = []
    for name in contiguous.METHODS:
        for cls in (TokenToKVPoolAllocator, BaseTokenToKVPoolAllocator):
            if name in cls.__dict__:
                monkeypatch.setattr(cls, name, cls.__dict__[name])
    monkeypatch.setattr(ModelRunner, "alloc_memory_pool", ModelRunner.__dict__["alloc_memory_pool"])
    for name in contiguous.METHODS:  # inherited methods get their own attribute on the class, as setattr gives them
        if name not in TokenToKVPoolAllocator.__dict__:
            monkeypatch.setattr(TokenToKVPoolAllocator, name, getattr(TokenToKVPoolAllocator, name), raising=False)
    assert contiguous.register_kv_alloc(_Registry, HOOK_TYPE, {contiguous.ALLOC_ENV: "contiguous"}) == "contiguous"
    _Registry.apply()
    return _Registry


def _runner(size=1000, cls=TokenToKVPoolAllocator, need_sort=False):
    runner = ModelRunner(cls(size, torch.bfloat16, "cpu", None, need_sort))
    runner.alloc_memory_pool()
    return runner.token_to_kv_pool_allocator


def test_switch_is_off_by_default_and_checked(monkeypatch, caplog):
    monkeypatch.setattr(logs, "_logged", set())
    _Registry.hooks = []
    with caplog.at_level("WARNING", logger="specdiag_sglang_plugin"):
        assert contiguous.register_kv_alloc(_Registry, HOOK_TYPE, {}) == "sglang"
        assert contiguous.register_kv_alloc(_Registry, HOOK_TYPE, {contiguous.ALLOC_ENV: "sglang"}) == "sglang"
        assert contiguous.register_kv_alloc(_Registry, HOOK_TYPE, {contiguous.ALLOC_ENV: "fast"}) == "sglang"
    assert _Registry.hooks == []
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and "'fast'" in lines[0] and "SGLang's KV allocator kept" in lines[0]
    with pytest.raises(ValueError, match="sglang, contiguous"):
        contiguous.alloc_mode_from_env({contiguous.ALLOC_ENV: "fast"})


def test_register_through_the_plugin_entry_point(monkeypatch):
    """hook.register() registers the allocator's hooks with the env switch alone (no verify mode, no SGLANG_PLUGINS)."""
    calls = []
    mod = types.ModuleType("sglang.srt.plugins.hook_registry")
    mod.HookRegistry = types.SimpleNamespace(register=lambda target, fn, kind: calls.append((target, kind)))
    mod.HookType = HOOK_TYPE
    for name in ("sglang", "sglang.srt", "sglang.srt.plugins"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    monkeypatch.setitem(sys.modules, "sglang.srt.plugins.hook_registry", mod)
    monkeypatch.setattr(logs, "_logged", set())
    monkeypatch.delenv(hook.PLUGINS_ENV, raising=False)
    monkeypatch.delenv(hook.MODE_ENV, raising=False)
    monkeypatch.setenv(contiguous.ALLOC_ENV, "contiguous")
    hook.register()
    assert (contiguous.ALLOC_MEMORY_POOL, "after") in calls and hook.STATS["mode"] == "off"
    assert {t for t, k in calls if k == "around"} == {f"{contiguous.TOKEN_ALLOCATOR}.{m}" for m in contiguous.METHODS}


def test_installed_on_the_runners_page_size_1_allocator_only(hooked, caplog):
    with caplog.at_level("WARNING", logger="specdiag_sglang_plugin"):
        a = _runner()
        paged = _runner(cls=PagedTokenToKVPoolAllocator)
    assert contiguous.contiguous_of(a) is not None and contiguous.contiguous_of(paged) is None
    assert len(a.free_pages) == 0  # SGLang's own list is emptied: nothing else can hand out its slots
    lines = " ".join(r.getMessage() for r in caplog.records)
    assert "serves TokenToKVPoolAllocator (1000 slots" in lines
    assert "PagedTokenToKVPoolAllocator at page_size 64" in lines and "SGLang's allocator kept" in lines
    assert paged.alloc(3).tolist() == [1, 2, 3]  # SGLang's methods serve the other allocator
    inner = TokenToKVPoolAllocator(50, torch.bfloat16, "cpu", None, False)  # e.g. an SWA allocator's inner one
    assert contiguous.contiguous_of(inner) is None and inner.alloc(2).tolist() == [1, 2]


def test_sglangs_interface_served_contiguously(hooked):
    a = _runner(1000)
    assert a.available_size() == 1000
    prompt = a.alloc(100)
    assert prompt.dtype == torch.int64 and prompt.tolist() == list(range(1, 101))
    kept = prompt.tolist()
    for k in (2, 8, 5):  # verify steps: 8 slots, the rejected ones freed at once
        step = a.alloc(8)
        a.free(step[k:])
        kept += step[:k].tolist()
    assert layout_stats(kept).runs == 1
    a.free_group_begin()  # the output processor frees finished requests in a group
    assert a.is_not_in_free_group is False
    a.free(torch.tensor(kept[:50]))
    assert a.available_size() == 1000 - len(kept)
    a.free_group_end()
    assert a.is_not_in_free_group is True and a.available_size() == 1000 - len(kept) + 50
    a.merge_and_sort_free()
    assert a.alloc(2000) is None
    a.clear()  # /flush_cache
    assert a.available_size() == 1000 and contiguous.contiguous_of(a).free_ranges() == [(1, 1001)]
    a.size = 500  # resize(): clear() builds a pool of the new size
    a.clear()
    assert a.available_size() == 500


def test_mixed_traffic_loses_no_slot_and_doubles_none(hooked):
    """Seeded traffic through the hooked allocator as the scheduler drives it: new requests (chunked prefill in
    pieces), verify steps, finished requests freed in groups, PD's need_sort merges."""
    rng = np.random.default_rng(7)
    size = 4000
    a = _runner(size, need_sort=True)
    owner = np.zeros(size + 1, dtype=np.int64)
    live: dict[int, list[int]] = {}
    for step in range(3000):
        op = rng.random()
        if op < 0.12 or not live:
            rid = step + 1
            live[rid] = []
            for _ in range(int(rng.integers(1, 4))):  # chunked prefill: one alloc per chunk
                out = a.alloc(int(rng.integers(1, 150)))
                if out is None:
                    break
                s = out.tolist()
                assert 0 not in s and (owner[s] == 0).all()
                owner[s] = rid
                live[rid] += s
        elif op < 0.8:
            rid = int(rng.choice(list(live)))
            out = a.alloc(8)
            if out is not None:
                k = int(rng.integers(1, 9))
                s = out[:k].tolist()
                assert 0 not in s and (owner[s] == 0).all()
                owner[s] = rid
                live[rid] += s
                a.free(out[k:])
        else:
            a.free_group_begin()
            for rid in rng.choice(list(live), size=min(len(live), 2), replace=False).tolist():
                s = live.pop(rid)
                owner[s] = 0
                a.free(torch.tensor(s, dtype=torch.int64))
            a.free_group_end()
        assert a.available_size() + int((owner != 0).sum()) == size
    for rid in list(live):
        s = live.pop(rid)
        owner[s] = 0
        a.free(torch.tensor(s, dtype=torch.int64))
    a.merge_and_sort_free()
    assert a.available_size() == size and contiguous.contiguous_of(a).free_ranges() == [(1, size + 1)]
