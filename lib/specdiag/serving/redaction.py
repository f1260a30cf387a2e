"""Secrets out of everything written: dict values under secret-looking keys, ``--api-key X`` flags,
bearer tokens and URL passwords in free text (pure; imports nothing of the library).

Every run.json, JSONL row, error message, trace and repr goes through :func:`redact` or
:func:`redact_text` before it is shown or saved.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import asdict, is_dataclass
from typing import Any

__all__ = ["REDACTED", "SECRET_FLAG_PATTERN", "SECRET_KEY_PATTERN", "SECRET_TEXT_PATTERN", "redact", "redact_text"]

#: Keys whose values are secrets wherever they appear (compared case-insensitively, after
#: removing '-' and '_'). Their values become REDACTED in everything written to disk.
SECRET_KEY_PATTERN = re.compile(
    r"(apikey|api_key|token|secret|password|passwd|authorization|auth|credential|privatekey|cookie)",
    re.IGNORECASE,
)
#: Command-line flags whose following argument is a secret, e.g. ``--api-key XYZ``.
SECRET_FLAG_PATTERN = re.compile(
    r"(--(?:api[-_]?key|[a-z0-9_-]*token|[a-z0-9_-]*secret|[a-z0-9_-]*password)(?:=|\s+))(\S+)",
    re.IGNORECASE,
)
#: Bearer tokens and Hugging Face style tokens inside free text.
SECRET_TEXT_PATTERN = re.compile(r"(Bearer\s+)\S+|\bhf_[A-Za-z0-9]{16,}\b|\bsk-[A-Za-z0-9_-]{16,}\b")
REDACTED = "REDACTED"

# Keys that contain a secret-looking word but are not secrets (counts of tokens and the like).
_NOT_SECRET = re.compile(
    r"(tokens?_?(num|count|len|ids?|total|usage|per|capacity)|num_?tokens?|max_?tokens?|^tokens$|"
    r"tokenizer|_tokens$|token_ids|tokens_|cached_tokens|prompt_tokens|completion_tokens|"
    r"reasoning_tokens|draft_tokens|new_tokens|skip_tokenizer_init|spec_.*|"
    r"token_budget|token_distribution)",  # SGLang 0.5.17: capture_token_budget, tbo_token_distribution_threshold
    re.IGNORECASE,
)


def _is_secret_key(key: str) -> bool:
    flat = key.replace("-", "_")
    if _NOT_SECRET.search(flat):
        return False
    return bool(SECRET_KEY_PATTERN.search(flat.replace("_", ""))) or bool(SECRET_KEY_PATTERN.search(flat))


def redact_text(text: str) -> str:
    """Remove secrets from free text (command lines, URLs, log lines)."""
    text = SECRET_FLAG_PATTERN.sub(lambda m: m.group(1) + REDACTED, text)
    text = SECRET_TEXT_PATTERN.sub(lambda m: (m.group(1) or "") + REDACTED, text)
    # user:password@host in URLs
    text = re.sub(r"(://[^/\s:@]+:)[^@\s/]+@", r"\1" + REDACTED + "@", text)
    return text


def redact(obj: Any) -> Any:
    """Return a copy of ``obj`` with secret values replaced by ``REDACTED``.

    Dict values under secret-looking keys are replaced (unless empty or None, which are kept so
    a reader can see the setting was unset); strings are scrubbed of ``--api-key X`` flags,
    bearer tokens and URL passwords; lists and tuples are walked.
    """
    if is_dataclass(obj) and not isinstance(obj, type):
        obj = asdict(obj)
    if isinstance(obj, Mapping):
        out: dict[str, Any] = {}
        for key, value in obj.items():
            if isinstance(key, str) and _is_secret_key(key) and value not in (None, "", False):
                out[key] = REDACTED
            else:
                out[key] = redact(value)
        return out
    if isinstance(obj, (list, tuple)):
        return [redact(v) for v in obj]
    if isinstance(obj, str):
        return redact_text(obj)
    return obj
