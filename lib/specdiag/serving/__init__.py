"""One serving interface for every engine: ``ServingClient``, ``ServerSettings``, ``make_client``.

Every notebook and measuring function talks to a server through a :class:`ServingClient`; each engine has
one implementation (SGLang's native API in :mod:`.sglang`, used for the embedded server too; vLLM's
OpenAI API in :mod:`.vllm`), and ``make_client(url)`` recognises which one a server is by asking it:

- vLLM: ``GET /v1/models`` lists models ``owned_by: "vllm"`` (and ``GET /version`` answers);
- SGLang: ``GET /server_info`` (or ``/get_server_info`` on older releases) answers its flat settings.

Layout: errors.py (server errors and error bodies), redaction.py (secrets out), sse.py (SSE parsing),
trace.py (RequestTrace and SGLang's chunk assembly), http.py (the shared HTTP client), settings.py
(ServerSettings), sglang.py, vllm.py and vllm_stream.py (vLLM's pure parsing). errors, redaction and sse
import nothing else of the library.

The names below are loaded on first use (PEP 562), so importing ``specdiag.serving.redaction`` or
``specdiag.serving.errors`` (as run folders and replay code do) imports no HTTP client; clients.py holds
the registry, ``detect_engine`` and ``make_client``.
"""
from __future__ import annotations

import importlib
from typing import Any

#: name -> the module that defines it.
_LAZY = {
    "API_KEY_ENV": "http", "CLIENTS": "clients", "RequestTrace": "trace", "SGLangClient": "sglang",
    "NotAnEngine": "errors", "ServerError": "errors", "ServerHTTPError": "errors", "ServerSettings": "settings", "ServerTimeout": "errors",
    "ServerUnreachable": "errors", "ServingClient": "clients", "StreamError": "errors", "VLLMClient": "vllm",
    "detect_engine": "clients", "make_client": "clients", "reach": "clients", "reached": "clients",
    "reached_engine": "clients", "REACHED_ENV": "clients",
}
__all__ = sorted(_LAZY)


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module 'specdiag.serving' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"specdiag.serving.{_LAZY[name]}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
