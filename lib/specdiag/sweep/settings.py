"""A measurement's settings: the arms file's ``settings:`` with the command line's overrides, into the measurement's
own frozen dataclass (each field a setting, its type and default the measurement's). Pure.

Types understood: ``int``, ``float``, ``str``, ``bool``, ``tuple[int, ...]``, ``tuple[str, ...]`` (a YAML list or a
comma-separated string: ``--contexts 1024,65536``) and ``dict[str, tuple[int, ...]]`` (per-arm lists: YAML
``{triton: [1024, 131072]}`` or ``triton=1024:131072;flashinfer=1024``). A key the dataclass has not, or a value of
the wrong type, is a :class:`SettingsError` that names the measurement, the key and what it takes. A setting named for
contexts (``contexts``, ``arm_contexts``, any ``*context*``) takes token counts as people write them: ``1k``,
``128k`` (specdiag.tokens; k = 1,024 tokens).
"""

from __future__ import annotations

import dataclasses
import difflib
import typing
from typing import Any, Iterable, Mapping, TypeVar

T = TypeVar("T")


class SettingsError(ValueError):
    """A setting the measurement does not take, or a value it cannot read; the message names the fix."""


def _scalar(kind: type, value: Any, where: str, tokens: bool = False) -> Any:
    if kind is int and tokens:
        from specdiag.tokens import token_count  # noqa: PLC0415

        try:
            return token_count(value.strip() if isinstance(value, str) else value, where)
        except ValueError as exc:
            raise SettingsError(str(exc)) from None
    if kind is bool:
        if isinstance(value, bool):
            return value
        if str(value).lower() in ("1", "true", "yes", "on"):
            return True
        if str(value).lower() in ("0", "false", "no", "off"):
            return False
        raise SettingsError(f"{where} must be true or false, not {value!r}")
    if kind in (int, float):
        if isinstance(value, bool):
            raise SettingsError(f"{where} must be a number, not {value!r}")
        try:
            number = float(value) if kind is float else int(str(value).replace("_", ""))
        except ValueError:
            raise SettingsError(f"{where} must be {'a whole number' if kind is int else 'a number'}, "
                                f"not {value!r}") from None
        return number
    if kind is str:
        if isinstance(value, (list, dict)):
            raise SettingsError(f"{where} must be one word, not {value!r}")
        return str(value)
    raise SettingsError(f"{where}: a setting of type {kind.__name__} cannot be read")  # a measurement's mistake


def _items(value: Any) -> list[Any]:
    if isinstance(value, str):
        return [x.strip() for x in value.split(",") if x.strip()]
    if isinstance(value, (list, tuple)):
        return list(value)
    return [value]


def coerce(hint: Any, value: Any, where: str, tokens: bool = False) -> Any:
    """``value`` (from YAML or a command line) as the type ``hint``; ``tokens``: its ints are token counts."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is tuple:
        return tuple(_scalar(args[0], x, f"{where}[{i}]", tokens) for i, x in enumerate(_items(value)))
    if origin is dict:
        if isinstance(value, str):
            pairs = [p.partition("=") for p in value.split(";") if p.strip()]
            if any(not sep for _, sep, _ in pairs):
                raise SettingsError(f"{where} must be NAME=A:B;NAME=C, not {value!r}")
            value = {k.strip(): [x for x in v.split(":") if x.strip()] for k, sep, v in pairs}
        if not isinstance(value, Mapping):
            raise SettingsError(f"{where} must be a mapping NAME: [values], not {value!r}")
        return {str(k): coerce(args[1], v, f"{where}.{k}", tokens) for k, v in value.items()}
    return _scalar(hint, value, where, tokens)


def parse_settings(cls: type[T], raw: Mapping[str, Any], measurement: str) -> T:
    """``raw`` as an instance of the settings dataclass ``cls`` (module doc)."""
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    values = {}
    for key, value in raw.items():
        if key not in fields:
            near = difflib.get_close_matches(str(key), list(fields), n=1)
            raise SettingsError(f"setting {key!r} is not one {measurement} takes"
                                + (f"; did you mean {near[0]!r}?" if near else "")
                                + f" ({measurement} takes: {', '.join(fields)})")
        values[key] = coerce(hints[key], value, f"{measurement} setting {key}", tokens="context" in key)
    return cls(**values)


def per_measurement(raw: Mapping[str, Any], names: list[str], fields: Mapping[str, set[str]],
                    extra: Mapping[str, Any] | None = None, known: Iterable[str] = ()) -> dict[str, dict[str, Any]]:
    """Each measurement's raw settings. ``raw`` (the arms file's ``settings:``) is flat for one measurement, or keyed
    by measurement (``{baseline_sweep: {contexts: [...]}, commit_probe: {...}}``: required with several; ``known``:
    every measurement's name, so a file keyed for several serves a sweep of some of them). ``extra`` (the command
    line's) are put on top: ``name.key`` for one measurement, a plain ``key`` for every measurement that takes it
    (``fields``: each measurement's setting names); a key none takes is a SettingsError."""
    named = set(names) | set(known)
    keyed = bool(raw) and all(k in named and isinstance(v, Mapping) for k, v in raw.items())
    if len(names) > 1 and raw and not keyed:
        flat = sorted(k for k in raw if k not in names)
        raise SettingsError(f"with several measurements ({', '.join(names)}) the arms file's settings are keyed by "
                            f"measurement, e.g. settings: {{{names[0]}: {{contexts: [1024]}}}}; "
                            f"{', '.join(flat) or 'a value'} is not under one")
    out = {n: dict(raw.get(n) or {}) if keyed else dict(raw) for n in names}
    if len(names) == 1:  # every key is the one measurement's (parse_settings names a wrong one, with a suggestion)
        out[names[0]].update({k.partition(".")[2] if k.startswith(names[0] + ".") else k: v
                              for k, v in dict(extra or {}).items()})
        return out
    for key, value in dict(extra or {}).items():
        name, dot, field_name = key.partition(".")
        if dot and name in names:
            out[name][field_name] = value
            continue
        takers = [n for n in names if key in fields[n]]
        if not takers:
            raise SettingsError(f"setting {key!r} is not one {' or '.join(names)} takes (a setting of one measurement: "
                                "NAME.KEY=VALUE)")
        for n in takers:
            out[n][key] = value
    return out


def overrides(pairs: list[str]) -> dict[str, str]:
    """``--set KEY=VALUE`` items into a mapping (the value parsed later, by the measurement's type)."""
    out = {}
    for item in pairs:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise SettingsError(f"--set {item!r}: write KEY=VALUE (e.g. --set slow_step_ms=200)")
        out[key.strip()] = value.strip()
    return out


def as_record(settings: Any) -> dict[str, Any]:
    """The settings as run.json keeps them."""
    return {k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(settings).items()}
