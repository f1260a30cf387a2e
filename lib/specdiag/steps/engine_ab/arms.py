"""09's arms when it measures: live servers named by URL, or engine configurations the launcher starts one after
another; and each arm's record in run.json ``arms`` (what it is, plugin, environment, server info, command).

- ``servers``: ``"name=url,name=url"``: servers already running (any engine specdiag reaches), measured one after
  another with :func:`specdiag.steps.engine_ab.measure.measure_arm`.
- ``engine_configs``: ``"name=embedded:ALGORITHM[:DRAFT_TOKENS],..."``: embedded servers (the tiny trained target on
  this machine), each started, measured and stopped before the next (``ALGORITHM`` NGRAM, STANDALONE or NONE;
  ``DRAFT_TOKENS`` SGLang's ``speculative_num_draft_tokens``, default 8), with its prefix cache on
  (``--enable-prefix-cache``): 09's decode requests repeat the prefilled prompt, and are served from the cache as on
  SGLang instead of prefilling it again. This is the CPU's A/B: the GPU arms (SGLang
  backends, the plugin, hybrids) are started by ``specdiag sweep --measure engine_ab`` on the GPU host, whose run folder 09 replays.

Arm names are words (letters, digits, ``_ . -``), each used once.
"""

from __future__ import annotations

import contextlib
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence

NAME = re.compile(r"^[A-Za-z0-9_.-]+$")
ALGORITHMS = ("NGRAM", "STANDALONE", "NONE")
ENGINES = ("embedded",)


class ArmError(ValueError):
    """An arm list that cannot be measured; the message names the item and the form expected."""


def _items(text: str, what: str, form: str) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    for item in (x.strip() for x in str(text).split(",")):
        if not item:
            continue
        name, sep, value = item.partition("=")
        name, value = name.strip(), value.strip()
        if not sep or not name or not value:
            raise ArmError(f"{what}: {item!r} is not name=value; write {form}")
        if not NAME.match(name):
            raise ArmError(f"{what}: arm name {name!r} must be a word (letters, digits, _ . -)")
        if name in dict(out):
            raise ArmError(f"{what}: arm {name!r} is named twice")
        out.append((name, value))
    if not out:
        raise ArmError(f"{what} names no arm; write {form}")
    return out


def parse_servers(text: str) -> dict[str, str]:
    """``"name=url,name=url"`` -> {name: url}, in order."""
    form = "name=http://host:port,name=http://host:port"
    out = {}
    for name, url in _items(text, "servers", form):
        if not re.match(r"^https?://[^\s/]+", url):
            raise ArmError(f"servers: {name}'s URL {url!r} is not http(s)://host:port")
        out[name] = url.rstrip("/")
    return out


@dataclass(frozen=True)
class EngineConfig:
    """One arm the launcher starts: an engine, its speculative algorithm and tokens per verify step."""

    name: str
    engine: str              # "embedded"
    algorithm: str           # NGRAM, STANDALONE or NONE
    num_draft_tokens: int    # SGLang's speculative_num_draft_tokens (counts the last committed token)

    @property
    def what(self) -> str:
        spec = "no speculation" if self.algorithm == "NONE" else f"{self.algorithm}, {self.num_draft_tokens} tokens per verify step"
        return f"the embedded server (tiny trained target, CPU), {spec}, prefix cache on"

    def options(self) -> dict[str, Any]:
        """The launcher's options (``specdiag.launchers.start_engine(engine, **options)``): the prefix cache on, so a
        decode request on the prompt just prefilled reuses its KV (09's phase 2, as SGLang's radix cache serves it)."""
        return {"algorithm": self.algorithm, "num_draft_tokens": self.num_draft_tokens,
                "extra_args": ("--enable-prefix-cache",)}


def parse_engine_configs(text: str) -> list[EngineConfig]:
    """``"name=embedded:NGRAM:8,name=embedded:NONE"`` -> configs, in order (module doc)."""
    form = "name=embedded:NGRAM:8,name=embedded:NONE (ALGORITHM one of " + ", ".join(ALGORITHMS) + ")"
    out = []
    for name, value in _items(text, "engine_configs", form):
        parts = [p.strip() for p in value.split(":")]
        engine, algorithm = parts[0].lower(), (parts[1].upper() if len(parts) > 1 else "NGRAM")
        if engine not in ENGINES:
            raise ArmError(f"engine_configs: {name}'s engine {parts[0]!r} is not one 09 starts ({', '.join(ENGINES)}); "
                           "SGLang arms run on the GPU host with specdiag sweep --measure engine_ab, and 09 replays that run")
        if algorithm not in ALGORITHMS or len(parts) > 3:
            raise ArmError(f"engine_configs: {value!r} is not engine:ALGORITHM[:DRAFT_TOKENS]; write {form}")
        try:
            tokens = int(parts[2]) if len(parts) == 3 else 8
        except ValueError:
            raise ArmError(f"engine_configs: {name}'s draft tokens {parts[2]!r} is not a whole number") from None
        if algorithm != "NONE" and tokens < 2:
            raise ArmError(f"engine_configs: {name} needs 2 or more draft tokens per verify step; got {tokens}")
        out.append(EngineConfig(name, engine, algorithm, tokens))
    return out


@contextlib.contextmanager
def started(config: EngineConfig, log_dir: Path | None = None) -> Iterator[tuple[str, dict[str, Any]]]:
    """Start one configured arm, yield (its URL, what run.json records of its start), stop it after."""
    from specdiag.launchers import engine_server  # noqa: PLC0415 - replay imports no launcher
    from specdiag.paths import shown  # noqa: PLC0415

    log = (Path(log_dir) / f"server-{config.name}.log") if log_dir else None
    server = engine_server(config.engine, log_path=log, progress=False, **config.options())
    server.start()
    try:
        command = server.command() if callable(getattr(server, "command", None)) else None
        yield server.url, {"ready_after_s": getattr(server, "ready_after_s", None),  # paths as a shared page shows them
                           "command": [shown(c) if str(c).startswith("/") else str(c) for c in command or ()] or None}
    finally:
        server.stop()


def arm_record(what: str, server_info: Mapping[str, Any], command: Any = None, env: Mapping[str, str] | None = None,
               plugin: str | None = None, **extra: Any) -> dict[str, Any]:
    """run.json ``arms[name]``: what the arm is, its plugin, environment, server info (redacted) and command (the
    server's flags; None for a server started elsewhere, whose server info then records them)."""
    from specdiag.serving.redaction import redact  # noqa: PLC0415

    return {"what": what, "plugin": plugin, "env": dict(env or {}), "server": redact(dict(server_info)),
            "command": [str(c) for c in command] if command else None, **extra}


def measure_arms(run: Any, servers: Mapping[str, str], configs: list[EngineConfig], contexts: list[int],
                 repeats: int, max_new_tokens: int, log_dir: Path | None = None,
                 progress: Any = lambda s: None, tail_tokens: int | None = None) -> list[str]:
    """Measure every arm in turn (the live servers, or each configured one started, measured and stopped) into
    ``run``'s ``engine_ab`` table (:func:`specdiag.steps.engine_ab.measure.measure_arm`), recording each arm in
    run.json ``arms`` first; ``tail_tokens`` as the sweep's setting (default its default). Returns the arms
    measured."""
    from specdiag.serving import reach  # noqa: PLC0415 - replay imports no client
    from specdiag.steps.engine_ab.measure import SweepSettings, measure_arm  # noqa: PLC0415

    tail = SweepSettings.tail_tokens if tail_tokens is None else int(tail_tokens)

    def one(name: str, url: str, what: str, extra: Mapping[str, Any]) -> None:
        client = reach(url)
        info = client.settings().as_server_info()
        run.update(arms={name: arm_record(what, info, **extra)})
        if not (run.meta.get("model") or {}).get("model_config"):
            run.update(model=_model_section(info))
        progress(f"{name}: measuring {url} at {', '.join(str(c) for c in contexts)} tokens")
        measure_arm(run, client, name, contexts, repeats, max_new_tokens, progress=progress, tail_tokens=tail)

    done = []
    for name, url in servers.items():
        one(name, url, f"the server at {url}", {"command": None, "url": url})
        done.append(name)
    for cfg in configs:
        with started(cfg, log_dir) as (url, rec):
            one(cfg.name, url, cfg.what, {"command": rec["command"], "ready_after_s": rec["ready_after_s"],
                                          "engine_config": f"{cfg.engine}:{cfg.algorithm}:{cfg.num_draft_tokens}"})
        done.append(cfg.name)
    return done


def _model_section(server_info: Mapping[str, Any]) -> dict[str, Any]:
    """run.json ``model``: the server's model path and, when this machine can read it, its config.json."""
    import json  # noqa: PLC0415

    from specdiag.paths import PROJECT_ROOT  # noqa: PLC0415

    path = str(server_info.get("model_path") or "")
    cfg = Path(path) if Path(path).is_absolute() else PROJECT_ROOT / path
    cfg = cfg / "config.json" if cfg.suffix != ".json" else cfg
    return {"path": path, "model_config": json.loads(cfg.read_text()) if path and cfg.is_file() else None}


#: what a server reports as its speculative algorithm when speculation is off
OFF_ALGORITHMS = ("", "NONE", "NULL")


def is_off(record: Mapping[str, Any]) -> bool:
    """Whether an arm is known to run without speculation: its server reports an off algorithm, or its
    ``engine_config`` says NONE. An arm that reports nothing is not taken for off."""
    srv = dict(record.get("server") or {})
    if "speculative_algorithm" in srv:
        return str(srv.get("speculative_algorithm") or "").upper() in OFF_ALGORITHMS
    parts = str(record.get("engine_config") or "").split(":")
    return len(parts) > 1 and parts[1].upper() in OFF_ALGORITHMS


def verify_arms(arms_meta: Mapping[str, Any], arm_names: Sequence[str]) -> list[str]:
    """The arms whose ms per step is a verify step's: every arm but those known to run without speculation (their ms
    per step is one token's, compared with the others in tokens/s by breakeven.analyse, never step against step)."""
    return [a for a in arm_names if not is_off(dict(arms_meta.get(a) or {}))]


SIMULATED_ACCEPTANCE_ENV = "SGLANG_SIMULATE_ACC_LEN"  #: SGLang forces a mean acceptance length when it is set


def forced_acceptance(record: Mapping[str, Any]) -> float | None:
    """The acceptance length an arm's server was told to simulate (``SGLANG_SIMULATE_ACC_LEN`` in its recorded
    environment), None when its commits are the drafter's own."""
    value = dict(record.get("env") or {}).get(SIMULATED_ACCEPTANCE_ENV)
    try:
        return float(value) if value not in (None, "") and float(value) > 0 else None
    except (TypeError, ValueError):
        return None


def acceptance_text(record: Mapping[str, Any]) -> str:
    """How an arm's commit lengths came about, for its settings row: forced by SGLang's simulation, or the drafter's."""
    forced = forced_acceptance(record)
    if forced is None:
        return "the drafter's own"
    return f"forced to {forced:g} ({SIMULATED_ACCEPTANCE_ENV}): commit lengths are the simulation's, step times the engine's"


def startup_s(record: Mapping[str, Any]) -> float | None:
    """Seconds from an arm's server start to its readiness (measured): ``ready_at_s - started_after_s`` where the run
    kept both (servers started one after another, waited on in turn), else the launcher's ``ready_after_s``."""
    ready, started = record.get("ready_at_s"), record.get("started_after_s")
    if isinstance(ready, (int, float)) and isinstance(started, (int, float)):
        return round(float(ready) - float(started), 1)
    value = record.get("ready_after_s")
    return float(value) if isinstance(value, (int, float)) else None


def _server_value(record: Mapping[str, Any], *keys: str) -> Any:
    srv = dict(record.get("server") or {})
    return next((srv.get(k) for k in keys if srv.get(k) not in (None, "")), None)


def plugin_of(record: Mapping[str, Any]) -> Any:
    return record.get("plugin") or (record.get("env") or {}).get("SPECDIAG_SGLANG_VERIFY")


#: 09's settings rows: (what, source, value of an arm's run.json record)
SETTINGS: tuple[tuple[str, str, Any], ...] = (
    ("what", "configured", lambda r, a: r.get("what") or a),
    ("attention backend", "server-reported", lambda r, a: _server_value(r, "attention_backend")),
    ("prefill attention backend", "server-reported",
     lambda r, a: _server_value(r, "prefill_attention_backend") or _server_value(r, "attention_backend")),
    ("speculative attention mode", "server-reported", lambda r, a: _server_value(r, "speculative_attention_mode")),
    ("specdiag plugin", "configured", lambda r, a: plugin_of(r)),
    ("speculation", "server-reported", lambda r, a: (f"{_server_value(r, 'speculative_algorithm')}, "
                                                     f"{_server_value(r, 'speculative_num_draft_tokens')} tokens per step")),
    ("draft window (tokens)", "server-reported", lambda r, a: _server_value(r, "speculative_draft_window_size")),
    ("acceptance", "configured", lambda r, a: acceptance_text(r)),
    ("page size (tokens)", "server-reported", lambda r, a: _server_value(r, "page_size")),
    ("chunked prefill (tokens)", "server-reported", lambda r, a: _server_value(r, "chunked_prefill_size")),
    ("KV pool (tokens)", "server-reported", lambda r, a: _server_value(r, "max_total_num_tokens")),
    ("memory fraction (static)", "server-reported", lambda r, a: _server_value(r, "mem_fraction_static")),
    ("tensor parallelism", "server-reported", lambda r, a: _server_value(r, "tp_size")),
    ("engine version", "server-reported", lambda r, a: _server_value(r, "version")),
    ("start to ready (s)", "measured", lambda r, a: startup_s(r)),
)


def settings_rows(arms_meta: Mapping[str, Any], arm_names: Sequence[str]) -> list[dict[str, Any]]:
    """One row per setting of :data:`SETTINGS` (``setting``, ``source``), one column per arm: what each arm's server
    reported, how it was configured, and its start-up time."""
    return [{"setting": name, "source": src, **{a: get(dict(arms_meta.get(a) or {}), a) for a in arm_names}}
            for name, src, get in SETTINGS]


def draft_tokens_of(record: Mapping[str, Any]) -> int | None:
    """Tokens per verify step the arm's server reports (DFLASH's block size, else ``speculative_num_draft_tokens``),
    else its ``engine_config``'s (embedded arms); None when neither says."""
    srv = dict(record.get("server") or {})
    for key in ("speculative_dflash_block_size", "speculative_num_draft_tokens"):
        try:
            return int(float(srv[key]))
        except (KeyError, TypeError, ValueError):
            continue
    if record.get("engine_config"):
        parts = str(record["engine_config"]).split(":")
        if len(parts) > 2 and parts[2].isdigit():
            return int(parts[2])
    return None


def step_sizes(arms_meta: Mapping[str, Any], arm_names: Sequence[str]) -> dict[str, int | None]:
    """Tokens per verify step of each arm (:func:`draft_tokens_of`): arms whose steps differ in size are compared
    in tokens/s (09's draft length that pays best), not step against step."""
    return {a: draft_tokens_of(dict(arms_meta.get(a) or {})) for a in arm_names}


def algorithm_of(record: Mapping[str, Any]) -> str:
    """An arm's speculative algorithm, upper case ("" when off): server-reported, else its ``engine_config``."""
    srv = dict(record.get("server") or {})
    algo = srv.get("speculative_algorithm")
    if algo in (None, "") and record.get("engine_config"):
        parts = str(record["engine_config"]).split(":")
        algo = parts[1] if len(parts) > 1 else None
    algo = str(algo or "").upper()
    return "" if algo in OFF_ALGORITHMS else algo


def backend_of(record: Mapping[str, Any]) -> str | None:
    """The decode attention backend the arm's server reports (``decode_attention_backend``, else
    ``attention_backend``); None when it reports neither."""
    srv = dict(record.get("server") or {})
    value = srv.get("decode_attention_backend") or srv.get("attention_backend")
    return str(value) if value not in (None, "") else None


def checks_verify(record: Mapping[str, Any]) -> bool:
    """Whether the arm checks every verify call against SGLang's own kernel (its timing is the check's)."""
    return str((record.get("env") or {}).get("SPECDIAG_SGLANG_CHECK") or "").strip() not in ("", "0")


def verify_path(record: Mapping[str, Any]) -> tuple[Any, ...] | None:
    """What decides an arm's verify step (decode backend, plugin, algorithm, tokens per step); None when its server
    reports no backend."""
    backend = backend_of(record)
    return None if backend is None else (backend, plugin_of(record), algorithm_of(record), draft_tokens_of(record))
