"""What an arm of 09's run states, from its run.json record (``arms[name]``: what it is, its plugin, environment,
server info and command, written by the sweep's driver, :mod:`specdiag.sweep.driver`): whether it speculates, its
algorithm, tokens per verify step, decode backend and verify path, and 09's settings rows. What the server reported
wins; where it reported nothing, the arm's configuration (``configured``, the arms file's) says it.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence


def _configured_spec(record: Mapping[str, Any]) -> Mapping[str, Any]:
    """The speculation the arms file configured the arm with ({} for an arm recorded without it)."""
    return dict((record.get("configured") or {}).get("speculation") or {})


#: what a server reports as its speculative algorithm when speculation is off
OFF_ALGORITHMS = ("", "NONE", "NULL")


def is_off(record: Mapping[str, Any]) -> bool:
    """Whether an arm is known to run without speculation: its server reports an off algorithm, or its configuration
    says NONE. An arm that reports nothing is not taken for off."""
    srv = dict(record.get("server") or {})
    if "speculative_algorithm" in srv:
        return str(srv.get("speculative_algorithm") or "").upper() in OFF_ALGORITHMS
    algo = _configured_spec(record).get("algorithm")
    return algo is not None and str(algo).upper() in OFF_ALGORITHMS


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


#: What a forced acceptance means, said once under the settings table (its cells say "forced to 4").
FORCED_MEANS = (f"forced: {SIMULATED_ACCEPTANCE_ENV} set on the arm's server, so its commit lengths (and the tokens/s "
                "and token counts built on them) are the simulation's, its step times the engine's")


def acceptance_text(record: Mapping[str, Any]) -> str:
    """How an arm's commit lengths came about, for its settings row: forced by SGLang's simulation (what that means:
    :data:`FORCED_MEANS`), or the drafter's."""
    forced = forced_acceptance(record)
    return "the drafter's own" if forced is None else f"forced to {forced:g}"


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


def speculation_text(record: Mapping[str, Any]) -> str | None:
    """An arm's speculation as its server reported it: "NGRAM, 8 tokens per step", "off" for an arm known to run
    without (:func:`is_off`), None when the server said nothing (the table's "-")."""
    if is_off(record):
        return "off"
    algorithm, tokens = (_server_value(record, "speculative_algorithm"),
                         _server_value(record, "speculative_num_draft_tokens"))
    if algorithm is None:
        return None
    return f"{algorithm}, {tokens} tokens per step" if tokens is not None else str(algorithm)


#: 09's settings rows: (what, source, value of an arm's run.json record)
SETTINGS: tuple[tuple[str, str, Any], ...] = (
    ("what", "configured", lambda r, a: r.get("what") or a),
    ("attention backend", "server-reported", lambda r, a: _server_value(r, "attention_backend")),
    ("prefill attention backend", "server-reported",
     lambda r, a: _server_value(r, "prefill_attention_backend") or _server_value(r, "attention_backend")),
    ("speculative attention mode", "server-reported", lambda r, a: _server_value(r, "speculative_attention_mode")),
    ("specdiag plugin", "configured", lambda r, a: plugin_of(r)),
    ("speculation", "server-reported", lambda r, a: speculation_text(r)),
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
    else its configuration's (DFLASH's block, else ``draft_tokens``); None when neither says."""
    srv = dict(record.get("server") or {})
    spec = _configured_spec(record)
    for value in (srv.get("speculative_dflash_block_size"), srv.get("speculative_num_draft_tokens"),
                  spec.get("block_size"), spec.get("draft_tokens")):
        try:
            return int(float(value))
        except (TypeError, ValueError):
            continue
    return None


def step_sizes(arms_meta: Mapping[str, Any], arm_names: Sequence[str]) -> dict[str, int | None]:
    """Tokens per verify step of each arm (:func:`draft_tokens_of`): arms whose steps differ in size are compared
    in tokens/s (09's draft length that pays best), not step against step."""
    return {a: draft_tokens_of(dict(arms_meta.get(a) or {})) for a in arm_names}


def algorithm_of(record: Mapping[str, Any]) -> str:
    """An arm's speculative algorithm, upper case ("" when off): server-reported, else its configuration."""
    srv = dict(record.get("server") or {})
    algo = srv.get("speculative_algorithm")
    if algo in (None, ""):
        algo = _configured_spec(record).get("algorithm")
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
