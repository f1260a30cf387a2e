"""Tier 0 in SGLang: each request's KV in as few runs of consecutive slots as the pool allows (opt-in).

``SPECDIAG_SGLANG_KV_ALLOC`` (``sglang`` by default, or ``contiguous``) is read once at plugin registration, on its own
like the layout recorder (it needs neither ``SGLANG_PLUGINS`` naming the plugin nor a verify mode). With
``contiguous`` the allocator SGLang's model runner builds for the target's KV is served by specdiag.kvalloc's
:class:`ContiguousAllocator` (grow the last run, best fit, largest first; its module doc) instead of SGLang 0.5.17's
free list, whose head-out/tail-in order scatters a request's KV after traffic.

How it is installed, through SGLang's hook registry (``sglang.srt.plugins.hook_registry``), no class replaced:

- AFTER ``ModelRunner.alloc_memory_pool`` (SGLang 0.5.17: it builds the pools through the KV cache configurator):
  the runner's ``token_to_kv_pool_allocator`` gets a ContiguousAllocator of its size on its device when it is exactly
  SGLang's ``TokenToKVPoolAllocator`` (page_size 1 by construction: sglang/srt/mem_cache/allocator/token.py passes 1
  to the base). Any other allocator (paged, SWA, hybrid, NPU) is left to SGLang, and the log says which and why. The
  draft worker's runner shares the target's allocator: the second call finds it installed. SGLang's own
  ``free_pages``/``release_pages`` are emptied, so no path left unhooked can hand out a slot the contiguous allocator
  owns.
- AROUND ``TokenToKVPoolAllocator.{alloc, free, clear, available_size, free_group_begin, free_group_end,
  merge_and_sort_free}``: an instance with a ContiguousAllocator is served by it, every other instance (the SWA
  allocator's inner ones) by SGLang's method. In 0.5.17 these are all the page_size-1 allocator calls of the
  scheduler (``alloc_token_slots``: ``available_size``, ``alloc``; the verify step's free of rejected drafts; the
  result processor's ``free_group_begin/end``), of the radix and chunk caches (``free``, ``free_segment`` and
  ``free_segments``, which end in ``free``; ``available_size`` beside their own ``evictable_size``), of chunked
  prefill (``alloc`` per chunk, ``free`` of the unfinished chunk's slots), of ``/flush_cache`` and ``resize`` (both
  ``clear``); PD disaggregation's ``need_sort`` path (``merge_and_sort_free``) merges the pending frees, since the
  free ranges are always sorted. The recorded list of 0.5.17's names (sglang-0.5.17-hook-targets.json beside this
  module) is checked against every target the plugin registers.

CUDA graphs: every one of these calls runs on the scheduler's CPU path, before a forward is launched or after its
result is read, never inside a captured graph; a graph replay reads the step's ``out_cache_loc`` after the graph runner
copied it into its static buffer, so the allocator's tensors are ordinary inputs, as SGLang's own slices of its free
list are. An allocation of one run is one ``torch.arange`` on the device (no host-to-device copy); frees of device
tensors are kept as device copies and merged at the next alloc in one device-to-host copy (kvalloc's module doc).
"""

from __future__ import annotations

import os
from typing import Any, Callable

ALLOC_ENV = "SPECDIAG_SGLANG_KV_ALLOC"
ALLOC_MODES = ("sglang", "contiguous")
#: SGLang 0.5.17's page_size-1 allocator and where the model runner builds its pools
TOKEN_ALLOCATOR = "sglang.srt.mem_cache.allocator.token.TokenToKVPoolAllocator"
ALLOC_MEMORY_POOL = "sglang.srt.model_executor.model_runner.ModelRunner.alloc_memory_pool"
#: the methods served by the contiguous allocator on an instance that has one
METHODS = ("alloc", "free", "clear", "available_size", "free_group_begin", "free_group_end", "merge_and_sort_free")
STATE_ATTR = "_specdiag_contiguous"


def alloc_mode_from_env(environ=os.environ) -> str:
    mode = environ.get(ALLOC_ENV, "sglang").strip().lower() or "sglang"
    if mode not in ALLOC_MODES:
        raise ValueError(f"{ALLOC_ENV}={mode!r}: choose one of {', '.join(ALLOC_MODES)}")
    return mode


def contiguous_of(allocator: Any):
    """The ContiguousAllocator serving ``allocator``, or None (SGLang's own methods serve it)."""
    return allocator.__dict__.get(STATE_ATTR) if hasattr(allocator, "__dict__") else None


def install(allocator: Any) -> tuple[bool, str]:
    """Give ``allocator`` a ContiguousAllocator when it is SGLang's page_size-1 TokenToKVPoolAllocator; (done, why)."""
    import torch  # noqa: PLC0415

    from specdiag.kvalloc import ContiguousAllocator  # noqa: PLC0415

    name = type(allocator).__name__
    page_size = getattr(allocator, "page_size", None)
    if contiguous_of(allocator) is not None:
        return True, f"{name} already served by the contiguous allocator"
    if name != "TokenToKVPoolAllocator" or page_size != 1:
        return False, (f"the KV allocator is {name} at page_size {page_size}: the contiguous allocator serves only "
                       "TokenToKVPoolAllocator (page_size 1), SGLang's allocator kept")
    contiguous = ContiguousAllocator(int(allocator.size), allocator.device)
    allocator.__dict__[STATE_ATTR] = contiguous
    empty = torch.empty((0,), dtype=torch.int64, device=allocator.device)
    allocator.free_pages, allocator.release_pages = empty, empty
    allocator.is_not_in_free_group, allocator.free_group = True, []
    return True, (f"the contiguous allocator serves TokenToKVPoolAllocator ({allocator.size} slots on "
                  f"{allocator.device}): each request's KV in as few runs of consecutive slots as the pool allows")


def _around(method: str) -> Callable:
    """AROUND hook of ``TokenToKVPoolAllocator.<method>``: the contiguous allocator where installed, else SGLang's."""

    def hook(original, allocator, *args, **kwargs):
        contiguous = contiguous_of(allocator)
        if contiguous is None:
            return original(allocator, *args, **kwargs)
        if method == "clear" and contiguous.size != int(allocator.size):  # resize() changed the pool: a new one
            from specdiag.kvalloc import ContiguousAllocator  # noqa: PLC0415

            contiguous = ContiguousAllocator(int(allocator.size), allocator.device)
            allocator.__dict__[STATE_ATTR] = contiguous
        if method == "merge_and_sort_free":
            out = contiguous.merge_pending()
        else:
            out = getattr(contiguous, method)(*args, **kwargs)
        if method in ("clear", "free_group_begin", "free_group_end"):
            allocator.is_not_in_free_group = contiguous.is_not_in_free_group
        return out

    hook.__name__ = f"specdiag_contiguous_{method}"
    return hook


def after_alloc_memory_pool(result, runner, *args, **kwargs):
    """AFTER hook of ModelRunner.alloc_memory_pool: install on the runner's token-to-KV allocator, logged once."""
    from specdiag_sglang_plugin.logs import log_once  # noqa: PLC0415

    allocator = getattr(runner, "token_to_kv_pool_allocator", None)
    if allocator is None:
        log_once("kv-alloc-none", "%s=contiguous: the model runner has no token_to_kv_pool_allocator; SGLang's kept",
                 ALLOC_ENV)
        return None
    done, why = install(allocator)
    log_once("kv-alloc:" + why, "%s=contiguous: %s", ALLOC_ENV, why)
    return None


def register_kv_alloc(registry=None, hook_type=None, environ=os.environ) -> str:
    """Register the hooks when ``SPECDIAG_SGLANG_KV_ALLOC=contiguous`` and say so once in the server log (a value
    that is neither mode is said too, and leaves SGLang's allocator); returns the mode in effect."""
    from specdiag_sglang_plugin.logs import log_once  # noqa: PLC0415

    try:
        mode = alloc_mode_from_env(environ)
    except ValueError as exc:
        log_once("kv-alloc-bad", "%s; SGLang's KV allocator kept", exc)
        return "sglang"
    if mode == "sglang":  # the default: nothing registered and nothing to say (the plugin's own line says it is off)
        return mode
    if registry is None:
        try:
            from sglang.srt.plugins.hook_registry import HookRegistry, HookType  # noqa: PLC0415
        except ImportError as exc:
            log_once("kv-alloc-import", "%s=contiguous but SGLang's hook registry is not importable (%s): SGLang's KV "
                     "allocator kept", ALLOC_ENV, exc)
            return "sglang"
        registry, hook_type = HookRegistry, HookType
    for method in METHODS:
        registry.register(f"{TOKEN_ALLOCATOR}.{method}", _around(method), hook_type.AROUND)
    registry.register(ALLOC_MEMORY_POOL, after_alloc_memory_pool, hook_type.AFTER)
    log_once("kv-alloc-on", "%s=contiguous: the target's page_size-1 KV slots come from specdiag's contiguous "
             "allocator (hooks registered; the model runner's allocator is checked when its pool is built)", ALLOC_ENV)
    return mode
