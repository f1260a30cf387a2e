"""The client registry: ``ServingClient`` (the protocol every engine client meets), ``CLIENTS``,
``detect_engine`` and ``make_client`` (re-exported lazily by :mod:`specdiag.serving`)."""


from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Mapping
from typing import Any, Protocol, runtime_checkable

import requests

from specdiag.serving.errors import (
    Answer,
    NotAnEngine,
    ServerError,
    ServerHTTPError,
    ServerTimeout,
    ServerUnreachable,
    StreamError,
)
from specdiag.serving.http import API_KEY_ENV
from specdiag.serving.settings import ServerSettings
from specdiag.serving.sglang import SGLangClient
from specdiag.serving.trace import RequestTrace
from specdiag.serving.vllm import VLLMClient

__all__ = [
    "API_KEY_ENV",
    "CLIENTS",
    "RequestTrace",
    "SGLangClient",
    "ServerError",
    "ServerHTTPError",
    "ServerSettings",
    "ServerTimeout",
    "ServerUnreachable",
    "ServingClient",
    "StreamError",
    "VLLMClient",
    "detect_engine",
    "make_client",
    "NotAnEngine",
]


@runtime_checkable
class ServingClient(Protocol):
    """What every measuring function needs of a server, whatever the engine."""

    engine: str
    base_url: str

    def check_reachable(self, timeout_s: float = 5.0) -> None:
        """Raise ServerUnreachable (naming the URL and the cause) unless the server answers HTTP."""

    def health(self, timeout_s: float = 30.0) -> bool:
        """True when the server says it is healthy."""

    def settings(self) -> ServerSettings:
        """The server's settings, typed, each with where it came from."""

    def tokenize(self, text: str, add_special_tokens: bool = False) -> list[int]:
        """The server tokenizer's ids for ``text``."""

    def reset_cache(self) -> bool | None:
        """Empty the prefix cache: True done, False refused, None when the server offers no reset."""

    def flush_cache(self) -> bool:
        """True only when the prefix cache was emptied (SGLang's name for reset_cache)."""

    def metrics_text(self) -> str | None:
        """The Prometheus text of /metrics; None when metrics are off."""

    def generate(self, text: str | None = None, input_ids: list[int] | None = None,
                 sampling_params: dict | None = None, stream: bool = True,
                 extra_body: Mapping[str, Any] | None = None) -> RequestTrace:
        """Stream one greedy request (SGLang-style sampling params) and return its trace."""


#: Clients by engine name.
CLIENTS: dict[str, type] = {"sglang": SGLangClient, "vllm": VLLMClient}
#: Names that mean "the SGLang API": the embedded server speaks it.
ALIASES = {"embedded": "sglang"}


def detect_engine(base_url: str, session: requests.Session | None = None, timeout_s: float = 10.0,
                  api_key: str | None = None) -> str:
    """Which engine answers at ``base_url``: ``"vllm"`` or ``"sglang"``, from the server's own answers.

    Asks GET /v1/models (vLLM: ``owned_by: vllm``), /server_info (SGLang; /get_server_info on older ones; vLLM
    in dev mode has ``vllm_config``) and /version. Raises ServerUnreachable when nothing answers, ServerError
    naming the API key variable when the server refuses without one, and :class:`NotAnEngine` (what answered,
    what was expected, in one line) when the answers fit no known engine: another HTTP server, for instance.
    """
    probe = SGLangClient(base_url, session=session, api_key=api_key, timeout_s=timeout_s)
    probe.check_reachable(timeout_s=timeout_s)
    answers: list[Answer] = []

    def ask(*paths: str) -> Any:  # the first path that is not 404 (else the first path's answer is kept)
        first = None
        for path in paths:
            answer, data = probe._answer(path, timeout_s=timeout_s)
            first = first or answer
            if answer.status != 404:
                answers.append(answer)
                return data if isinstance(data, Mapping) else None
        answers.append(first)
        return None

    models = ask("/v1/models")
    if models is not None:
        owners = {str(m.get("owned_by")).lower() for m in models.get("data") or [] if isinstance(m, Mapping)}
        if "vllm" in owners:
            return "vllm"
        if "sglang" in owners:
            return "sglang"
    info = ask("/server_info", "/get_server_info")
    if info is not None:
        return "vllm" if "vllm_config" in info else "sglang"
    version = ask("/version")
    if version is not None and "vllm" in str(version).lower():
        return "vllm"
    if any(a.status in (401, 403) for a in answers):
        raise ServerError(probe.url("/"), "the server refuses requests without an API key ("
                          + "; ".join(f"GET {a.path}: HTTP {a.status}" for a in answers)
                          + f"): put the key in the environment variable {API_KEY_ENV}")
    raise NotAnEngine(probe.base_url, answers)


def make_client(base_url: str, engine: str = "auto", **kwargs: Any) -> Any:
    """The client for the server at ``base_url``: ``engine`` a key of CLIENTS (or ``embedded``), or
    ``"auto"`` to ask the server which engine it is. Keyword arguments go to the client."""
    if not isinstance(engine, str):
        raise ValueError(f"engine must be 'auto' or one of {sorted(CLIENTS)}; got {engine!r}")
    name = ALIASES.get(engine.lower(), engine.lower())
    if name == "auto":
        name = detect_engine(base_url, session=kwargs.get("session"), api_key=kwargs.get("api_key"))
    try:
        cls = CLIENTS[name]
    except KeyError:
        raise ValueError(f"engine {engine!r} is not supported; choose 'auto' or one of {sorted(CLIENTS)}") from None
    if cls is SGLangClient:
        kwargs.pop("speculative_config", None)
    return cls(base_url, **kwargs)


#: Set by a report run while its notebooks execute: ``"<engine> <url>"`` of the server :func:`reach` checked
#: once for the whole run, so each notebook makes its client without checking (or asking the engine) again.
REACHED_ENV = "SPECDIAG_SERVER_REACHED"


def reach(base_url: str, engine: str = "auto", **kwargs: Any) -> Any:
    """The one reachability check: the client for ``base_url``, after the server answered once.

    ``engine="auto"`` asks the server which engine it is (:func:`detect_engine`, whose first request is the
    check); a named engine is checked with ``client.check_reachable()``. Raises ServerUnreachable naming the
    URL and the cause. A report run calls it once per run; :func:`reached_engine` tells its notebooks.
    """
    client = make_client(base_url, engine, **kwargs)
    if ALIASES.get(str(engine).lower(), str(engine).lower()) != "auto":
        client.check_reachable()
    return client


def reached_engine(base_url: str, environ: Mapping[str, str] | None = None) -> str | None:
    """The engine of ``base_url`` when this run already reached it (:data:`REACHED_ENV`), else None."""
    engine, _, url = (os.environ if environ is None else environ).get(REACHED_ENV, "").partition(" ")
    return engine if engine and url and url.rstrip("/") == base_url.rstrip("/") else None


@contextlib.contextmanager
def reached(client: Any) -> Iterator[Any]:
    """While the block runs, processes started from here (the report's notebook kernels) know the client's
    server was reached (:data:`REACHED_ENV`); the previous value comes back afterwards."""
    previous = os.environ.get(REACHED_ENV)
    os.environ[REACHED_ENV] = f"{client.engine} {client.base_url}"
    try:
        yield client
    finally:
        if previous is None:
            os.environ.pop(REACHED_ENV, None)
        else:
            os.environ[REACHED_ENV] = previous
