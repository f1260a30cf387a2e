"""A prompt that no prefix cache can serve: reset the server's cache, build the prompt, and where the
server offers no reset (vLLM without dev mode) make the prompt's head unique instead.

One recipe for every measuring notebook (sweep, commit probe, drafter timing, utilization).
"""

from __future__ import annotations

import itertools
import os
import time
from typing import Any

from specdiag.prompts import Prompt, build_prompt, unique_head

_COUNTER = itertools.count()


def fresh_prompt(client: Any, n_tokens: int, kind: str, seed: int, instruction: str = "", reset: bool = True,
                 add_special_tokens: bool = False) -> tuple[Prompt, bool | None]:
    """``(prompt, cache_flushed)`` for one request.

    ``cache_flushed``: True when the server emptied its prefix cache, False when it refused or offers no
    reset, None when no reset was asked (``reset=False``). When the server offers none
    (``client.reset_cache()`` is None), the prompt's first tokens become a per-request tag
    (:func:`specdiag.prompts.unique_head`), so no earlier prompt's prefix is reused.
    """
    flushed: bool | None = None
    offered = True
    if reset:
        result = client.reset_cache() if hasattr(client, "reset_cache") else client.flush_cache()
        offered = result is not None
        flushed = bool(result)
    prompt = build_prompt(lambda text: client.tokenize(text, add_special_tokens=add_special_tokens), n_tokens,
                          kind, seed=seed, instruction=instruction)  # type: ignore[arg-type]
    if reset and not offered:
        tag = f"[request {os.getpid():x}-{time.time_ns():x}-{next(_COUNTER)}] "
        prompt = unique_head(lambda text: client.tokenize(text), prompt, tag)
    return prompt, flushed
