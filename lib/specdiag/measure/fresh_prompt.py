"""A prompt that no prefix cache can serve: reset the server's cache, build the prompt, and where the
server offers no reset (vLLM without dev mode) make the prompt's head unique instead.

One recipe for every measuring step (sweep, commit probe, drafter timing, utilization), through
:mod:`specdiag.measure.request`.
"""

from __future__ import annotations

import itertools
import os
import time
from typing import Any

from specdiag.prompts import Prompt, build_prompt, unique_head

_COUNTER = itertools.count()


def freshen(client: Any, prompt: Prompt, reset: bool = True, add_special_tokens: bool = False
            ) -> tuple[Prompt, bool | None]:
    """``(prompt, cache_flushed)`` for an already built prompt: reset the prefix cache, and where the server
    offers no reset (``client.reset_cache()`` is None) give the prompt a per-request head
    (:func:`specdiag.prompts.unique_head`), tokenized with the same ``add_special_tokens`` as the prompt.

    ``cache_flushed``: True when the server emptied its prefix cache, False when it refused or offers no
    reset, None when no reset was asked (``reset=False``).
    """
    if not reset:
        return prompt, None
    result = client.reset_cache() if hasattr(client, "reset_cache") else client.flush_cache()
    if result is None:
        tag = f"[request {os.getpid():x}-{time.time_ns():x}-{next(_COUNTER)}] "
        prompt = unique_head(lambda text: client.tokenize(text, add_special_tokens=add_special_tokens), prompt, tag)
    return prompt, bool(result)


def fresh_prompt(client: Any, n_tokens: int, kind: str, seed: int, instruction: str = "", reset: bool = True,
                 add_special_tokens: bool = False) -> tuple[Prompt, bool | None]:
    """``(prompt, cache_flushed)`` for one request of exactly ``n_tokens`` ids: built with the server's
    tokenizer, then :func:`freshen`."""
    prompt = build_prompt(lambda text: client.tokenize(text, add_special_tokens=add_special_tokens), n_tokens,
                          kind, seed=seed, instruction=instruction)  # type: ignore[arg-type]
    return freshen(client, prompt, reset=reset, add_special_tokens=add_special_tokens)
