"""Token counts as people write them: ``4096``, ``"4096"``, ``"1k"`` (1,024 tokens), ``"128k"`` (131,072), ``"1M"``.

``k`` is 1,024 tokens and ``M`` 1,048,576, as context windows are named (a "128k" model holds 131,072 tokens); a count
that must be decimal is written out (``128000``). A fraction must land on a whole token (``"1.5k"`` is 1,536;
``"1.4k"`` is refused). Pure: notebook parameters, the report's checks, arms files and the command line all read
contexts through :func:`token_count` and :func:`token_counts`.
"""

from __future__ import annotations

import re
from typing import Any

#: the multiplier of each suffix (case-insensitive)
SUFFIXES = {"": 1, "k": 1024, "m": 1024 * 1024}
_FORM = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kKmM]?)\s*$")
EXAMPLE = "a whole number of tokens such as 4096, or 1k / 32k / 128k (k = 1,024 tokens)"


def token_count(value: Any, name: str = "value") -> int:
    """``value`` (an int, or a string such as ``"128k"``) as a whole number of tokens; ValueError naming ``name``."""
    if isinstance(value, bool):
        raise ValueError(f"{name}: {value!r} is not a token count; give {EXAMPLE}")
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    match = _FORM.match(value) if isinstance(value, str) else None
    if not match:
        raise ValueError(f"{name}: {value!r} is not a token count; give {EXAMPLE}")
    number, suffix = match.groups()
    scale = SUFFIXES[suffix.lower()]
    whole, _, frac = number.partition(".")
    numerator = int(whole + frac) * scale  # exact: no float rounding
    denominator = 10 ** len(frac)
    if numerator % denominator:
        raise ValueError(f"{name}: {value!r} is {numerator / denominator:g} tokens, not a whole number; write the "
                         f"count out (e.g. {round(numerator / denominator)})")
    return numerator // denominator


def token_counts(value: Any, name: str = "value") -> list[int]:
    """A list of token counts from a list (or tuple) of counts, or from one string of them separated by commas
    (``"1k,32k,128k"``); ValueError naming ``name`` and the entry at fault."""
    items = [v for v in value.split(",") if v.strip()] if isinstance(value, str) else value
    if not isinstance(items, (list, tuple)):
        raise ValueError(f"{name}: {value!r} is not a list of token counts; give e.g. [1024, 32k, 128k]")
    return [token_count(v, name) for v in items]
