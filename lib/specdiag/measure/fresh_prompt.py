"""A prompt that no prefix cache can serve: reset the server's cache, build the prompt, and where the
cache was not emptied (vLLM without dev mode offers no reset; SGLang refuses a flush without its admin key, or
while other requests run) make the prompt's head unique instead.

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
    """``(prompt, cache_flushed)`` for an already built prompt: reset the prefix cache, and where it was not
    emptied (``client.reset_cache()`` is None: no reset offered, or False: refused) give the prompt a per-request
    head (:func:`specdiag.prompts.unique_head`), tokenized with the same ``add_special_tokens`` as the prompt.
    The client's ``reset_note`` says why there was no reset (:func:`reset_note`).

    ``cache_flushed``: True when the server emptied its prefix cache, False when it refused or offers no
    reset, None when no reset was asked (``reset=False``).
    """
    if not reset:
        return prompt, None
    result = client.reset_cache() if hasattr(client, "reset_cache") else client.flush_cache()
    if result is not True:
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


def reset_note(client: Any, cache_flushed: bool | None) -> str | None:
    """Why the prefix cache was not reset before a request (the client's ``reset_note``), for the request's row;
    None when it was reset or no reset was asked."""
    if cache_flushed is not False:
        return None
    note = getattr(client, "reset_note", None)
    return str(note) if note else "no reset: the server refused it; the prompt got a unique head instead"


def cache_line(rows: Any) -> str | None:
    """One line for a page when some rows' prefix cache was not reset: why (their ``cache_note``s) and how many;
    None when every row's was (or none was asked)."""
    notes: dict[str, int] = {}
    for row in rows:
        if row.get("cache_note"):
            notes[row["cache_note"]] = notes.get(row["cache_note"], 0) + 1
    if not notes:
        return None
    return "prefix cache not reset for " + "; ".join(f"{n} request(s): {note}" for note, n in notes.items())
