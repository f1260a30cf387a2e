"""The arms file: a YAML list of servers to measure one after another, parsed into typed dataclasses.

    description: what these arms compare                    # optional, kept in run.json
    models:                                                 # optional: how to make a model folder that is missing
      - path: /tmp/mla61
        make: [data/models/make_mla_model.py, --layers, "61", --heads, "8", --seed, "0"]   # --out PATH is added
    defaults:                                               # optional: under every arm (an arm's own keys win)
      engine: sglang
      model: /tmp/mla61
      speculation: {algorithm: NGRAM, draft_tokens: 8}
    settings: {repeats: 5}                                  # optional: the measurement's settings (its own keys)
    arms:
      - name: triton_plugin
        what: Triton backend with the plugin's split-KV verify kernel
        attention_backend: triton
        plugin: splitkv

A running server is an arm too: ``url`` (``http://host:port``) and, beside ``name`` and ``what``, only ``engine``
(what it is, when known; the server says so when reached) and ``stats_dir`` (the folder its SGLang plugin writes its
stats and layout records to, ``SPECDIAG_SGLANG_STATS``). The sweep measures it as it runs: it neither starts nor stops
it, so no key of ``defaults`` applies to it and a server setting under it is an error.

A started arm's keys (:data:`ARM_KEYS`): ``name`` (a word), ``what``, ``engine`` (sglang, vllm, embedded), ``model`` (a
folder; the embedded engine's default is the shipped tiny target), ``attention_backend``, ``plugin`` (splitkv,
upstream, off: the SGLang plugin's verify mode), ``plugin_on_path`` (the plugin kept importable with its kernel off,
to record layouts), ``kv_alloc`` (sglang, contiguous), ``speculation`` (``algorithm`` NONE, NGRAM, DFLASH, STANDALONE;
``draft_tokens``; DFLASH's ``drafter``, ``block_size``, ``window``; ``simulate_acc_len``: SGLang's forced mean
acceptance), ``flags`` (server flags appended verbatim), ``env`` (the server's environment), ``tp``, ``ep``, ``eplb``,
``context_length``, ``max_total_tokens``, ``mem_fraction``. From ``defaults``, ``env`` is merged key by key and
``flags`` are put before the arm's own; ``speculation`` is replaced whole (an arm without speculation says
``speculation: {algorithm: NONE}``).

:func:`load_arms` reads a file, :func:`parse_arms` a mapping; both raise :class:`ArmsError` naming the arm, the key
and the fix. Pure: nothing here starts, imports or checks a server.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from specdiag.paths import PROJECT_ROOT

ENGINES = ("sglang", "vllm", "embedded")
PLUGIN_MODES = ("splitkv", "upstream", "off")  #: specdiag.launchers.sglang.PLUGIN_MODES
KV_ALLOCS = ("sglang", "contiguous")  #: specdiag.launchers.sglang.KV_ALLOCS
ALGORITHMS = ("NONE", "NGRAM", "DFLASH", "STANDALONE")
NAME = re.compile(r"^[A-Za-z0-9_.-]+$")
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
TOP_KEYS = ("description", "models", "defaults", "settings", "arms")
ARM_KEYS = ("name", "what", "engine", "model", "attention_backend", "plugin", "plugin_on_path", "kv_alloc",
            "speculation", "flags", "env", "tp", "ep", "eplb", "context_length", "max_total_tokens", "mem_fraction")
URL_ARM_KEYS = ("name", "what", "url", "engine", "stats_dir")  #: a running server's keys (module doc)
URL = re.compile(r"^https?://[^\s/]+")
SPEC_KEYS = ("algorithm", "draft_tokens", "drafter", "block_size", "window", "simulate_acc_len")
MODEL_KEYS = ("path", "make")


class ArmsError(ValueError):
    """An arms file that cannot be run; the message names the arm, the key and the fix."""


@dataclass(frozen=True)
class Speculation:
    """How an arm's server speculates."""

    algorithm: str = "NONE"  # NONE | NGRAM | DFLASH | STANDALONE
    draft_tokens: int | None = None  # tokens per verify step, the bonus token included (SGLang's meaning)
    drafter: str | None = None  # DFLASH / STANDALONE: the drafter folder
    block_size: int | None = None  # DFLASH: tokens per drafted block (= draft_tokens when both are given)
    window: int | None = None  # DFLASH: target tokens the drafter keeps (None: all)
    simulate_acc_len: float | None = None  # SGLANG_SIMULATE_ACC_LEN: a forced mean acceptance length (SGLang)

    @property
    def speculates(self) -> bool:
        return self.algorithm != "NONE"

    @property
    def tokens_per_step(self) -> int | None:
        """Tokens per verify step: the block for DFLASH, else the draft tokens (None: the engine's default)."""
        return self.block_size or self.draft_tokens if self.algorithm == "DFLASH" else self.draft_tokens


@dataclass(frozen=True)
class Arm:
    """One server of a sweep, as the arms file configures it (started by the sweep), or a running server (``url``)."""

    name: str  # a word; the rows' ``arm``
    engine: str  # sglang | vllm | embedded; "" for a running server that did not say
    what: str = ""  # one line a reader sees (default: the name)
    model: str | None = None  # model folder (embedded: None is the shipped tiny target)
    attention_backend: str | None = None  # --attention-backend (SGLang; None: the launcher's default, triton)
    plugin: str = "off"  # the SGLang plugin's verify mode: splitkv | upstream | off
    plugin_on_path: bool | None = None  # the plugin importable with its kernel off (layout records); None: if used
    kv_alloc: str = "sglang"  # KV slot allocator: sglang | contiguous (the plugin's; the embedded engine's own)
    speculation: Speculation = field(default_factory=Speculation)
    flags: tuple[str, ...] = ()  # server flags, appended verbatim
    env: Mapping[str, str] = field(default_factory=dict)  # the server's environment (added to this process's)
    tp: int = 1  # tensor-parallel GPUs
    ep: int = 1  # expert-parallel ranks (at most tp)
    eplb: bool = False  # SGLang's expert-parallel load balancer
    context_length: int | None = None  # tokens (--context-length)
    max_total_tokens: int | None = None  # KV pool slots (--max-total-tokens)
    mem_fraction: float | None = None  # --mem-fraction-static (SGLang)
    url: str | None = None  # a running server: measured as it runs, never started or stopped by the sweep
    stats_dir: str | None = None  # a running server's plugin stats folder (SPECDIAG_SGLANG_STATS), where known

    def __post_init__(self) -> None:
        object.__setattr__(self, "flags", tuple(self.flags))
        object.__setattr__(self, "env", dict(self.env))

    @property
    def label(self) -> str:
        return self.what or (f"the server at {self.url}" if self.url else self.name)

    @property
    def running(self) -> bool:
        """A server already running (``url``): the sweep neither starts nor stops it."""
        return self.url is not None

    def configured(self) -> dict[str, Any]:
        """What makes two servers the same arm (``specdiag merge`` joins an arm's parts only when these agree)."""
        if self.running:
            return {"url": self.url, "engine": self.engine or None}
        return {"engine": self.engine, "model": self.model, "attention_backend": self.attention_backend,
                "plugin": self.plugin, "kv_alloc": self.kv_alloc, "speculation": vars(self.speculation),
                "flags": list(self.flags), "env": dict(sorted(self.env.items())), "tp": self.tp, "ep": self.ep,
                "eplb": self.eplb, "context_length": self.context_length, "max_total_tokens": self.max_total_tokens}


@dataclass(frozen=True)
class ModelRecipe:
    """How to make a model folder an arm names when it is missing: ``python MAKE... --out PATH``."""

    path: str
    make: tuple[str, ...]  # a script of data/models/ and its arguments (no --out)

    def command(self, python: str) -> list[str]:
        return [python, *self.make, "--out", self.path]


@dataclass(frozen=True)
class ArmsFile:
    """A parsed arms file."""

    arms: tuple[Arm, ...]
    settings: Mapping[str, Any] = field(default_factory=dict)  # the measurement's settings, unchecked here
    models: tuple[ModelRecipe, ...] = ()
    description: str = ""
    source: str = ""  # the file it came from

    def select(self, names: list[str]) -> "ArmsFile":
        """Only the arms named, in the file's order; ArmsError for a name the file has not."""
        have = [a.name for a in self.arms]
        unknown = [n for n in names if n not in have]
        if unknown:
            raise ArmsError(f"--only {','.join(unknown)}: {self.source or 'the arms file'} has no such arm; "
                            f"its arms: {', '.join(have)}")
        return ArmsFile(tuple(a for a in self.arms if a.name in names), self.settings, self.models, self.description,
                        self.source)


def _where(index: int | None, name: str | None) -> str:
    if index is None:
        return "defaults"
    return f"arm {name!r} (arms[{index}])" if name else f"arms[{index}]"


def _unknown(keys: Mapping[str, Any], allowed: tuple[str, ...], where: str) -> None:
    for key in keys:
        if key not in allowed:
            near = difflib.get_close_matches(str(key), allowed, n=1) or [
                a for a in allowed if str(key) in a or a in str(key)][:1]
            hint = f"; did you mean {near[0]!r}?" if near else ""
            raise ArmsError(f"{where}: unknown key {key!r}{hint} (keys: {', '.join(allowed)})")


def _int(value: Any, key: str, where: str, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ArmsError(f"{where}: {key} must be a whole number >= {minimum}, not {value!r}")
    return value


def _tokens(value: Any, key: str, where: str) -> int:
    """A token count, written as 131072 or 128k (specdiag.tokens)."""
    from specdiag.tokens import token_count  # noqa: PLC0415

    try:
        return _int(token_count(value, key), key, where)
    except ValueError as exc:
        raise ArmsError(f"{where}: {exc}") from None


def _choice(value: Any, key: str, where: str, choices: tuple[str, ...]) -> str:
    text = str(value) if not isinstance(value, bool) else ("off" if value is False else "on")
    if text not in choices:
        raise ArmsError(f"{where}: {key} {value!r} is not one of {', '.join(choices)}")
    return text


def _speculation(raw: Any, where: str, engine: str) -> Speculation:
    if raw is None:
        return Speculation()
    if not isinstance(raw, Mapping):
        raise ArmsError(f"{where}: speculation must be a mapping such as {{algorithm: NGRAM, draft_tokens: 8}}, "
                        f"not {raw!r}")
    where = f"{where}: speculation"
    _unknown(raw, SPEC_KEYS, where)
    algo = _choice(str(raw.get("algorithm", "NONE")).upper(), "algorithm", where, ALGORITHMS)
    draft = _int(raw["draft_tokens"], "draft_tokens", where, 2) if raw.get("draft_tokens") is not None else None
    block = _int(raw["block_size"], "block_size", where, 2) if raw.get("block_size") is not None else None
    window = _tokens(raw["window"], "window", where) if raw.get("window") is not None else None
    drafter = str(raw["drafter"]) if raw.get("drafter") else None
    acc = raw.get("simulate_acc_len")
    if acc is not None and (isinstance(acc, bool) or not isinstance(acc, (int, float)) or acc < 1):
        raise ArmsError(f"{where}: simulate_acc_len must be a number >= 1 (mean tokens committed per step), "
                        f"not {acc!r}")
    if algo == "NONE" and any(v is not None for v in (draft, block, window, drafter, acc)):
        raise ArmsError(f"{where}: algorithm NONE takes no draft_tokens, drafter, block_size, window or "
                        "simulate_acc_len: drop them, or name an algorithm")
    if algo != "DFLASH" and (block is not None or window is not None):
        raise ArmsError(f"{where}: block_size and window are DFLASH's: drop them, or set algorithm: DFLASH")
    if algo == "NGRAM" and drafter:
        raise ArmsError(f"{where}: NGRAM drafts from the prompt and takes no drafter: drop drafter")
    if algo == "DFLASH":
        if not drafter and engine != "embedded":
            raise ArmsError(f"{where}: DFLASH needs drafter: a DFlash drafter folder "
                            "(python data/models/make_dflash_drafter.py --target TARGET --out DIR writes one)")
        if block is not None and draft is not None and block != draft:
            raise ArmsError(f"{where}: block_size {block} and draft_tokens {draft} must be equal (SGLang verifies "
                            "one block per step): give one of them")
        if window is not None and block is not None and window < block:
            raise ArmsError(f"{where}: window {window} is smaller than block_size {block}: the drafter must keep "
                            "at least one block")
    if acc is not None and engine != "sglang":
        raise ArmsError(f"{where}: simulate_acc_len is SGLang's (SGLANG_SIMULATE_ACC_LEN); the {engine} engine has "
                        "none: drop it")
    return Speculation(algo, draft, drafter, block, window, float(acc) if acc is not None else None)


def _strings(raw: Any, key: str, where: str) -> tuple[str, ...]:
    if raw is None:
        return ()
    if isinstance(raw, str) or not isinstance(raw, list) or any(isinstance(x, (list, dict)) for x in raw):
        raise ArmsError(f"{where}: {key} must be a list of words, e.g. [--disable-radix-cache, --log-level, info], "
                        f"not {raw!r}")
    return tuple(str(x) for x in raw)


def _env(raw: Any, where: str) -> dict[str, str]:
    if raw is None:
        return {}
    if not isinstance(raw, Mapping):
        raise ArmsError(f"{where}: env must be a mapping NAME: value, not {raw!r}")
    out = {}
    for k, v in raw.items():
        if not ENV_NAME.match(str(k)):
            raise ArmsError(f"{where}: env name {k!r} is not a variable name")
        if isinstance(v, (list, dict)) or v is None:
            raise ArmsError(f"{where}: env {k} must be one value (quote it: \"1\"), not {v!r}")
        out[str(k)] = ("1" if v else "0") if isinstance(v, bool) else str(v)
    _check_prefill_config(out, where)
    return out


#: the SGLang plugin's prefill-kernel tiles (plugins/sglang prefill.py CONFIG_ENV): a bad value would let the server
#: fall back to SGLang's prefill under the arm's name, so it is checked here, before anything starts
PREFILL_CONFIG_ENV = "SPECDIAG_SGLANG_PREFILL_CONFIG"


def _check_prefill_config(env: Mapping[str, str], where: str) -> None:
    text = env.get(PREFILL_CONFIG_ENV, "").strip()
    if not text:
        return
    try:
        from specdiag.kernels.triton.prefill import parse_config  # noqa: PLC0415 - loads triton (costly: ARCHITECTURE.md, Imports)
    except ImportError:  # no triton here: the server's plugin checks it and says so in its log
        return
    try:
        parse_config(text)
    except ValueError as exc:
        raise ArmsError(f"{where}: env {PREFILL_CONFIG_ENV}: {exc}") from None


def running_arm(raw: Mapping[str, Any], where: str) -> Arm:
    """A running server's arm (``url``; module doc): its own keys only, checked."""
    setting = [k for k in raw if k not in URL_ARM_KEYS]
    if setting:
        raise ArmsError(f"{where}: url names a running server, which keeps its own settings: drop "
                        f"{', '.join(map(str, setting))} (or drop url to have the sweep start the server)")
    url = str(raw["url"]).rstrip("/")
    if not URL.match(url):
        raise ArmsError(f"{where}: url {raw['url']!r} is not http(s)://host:port")
    engine = _choice(raw["engine"], "engine", where, ENGINES) if raw.get("engine") else ""
    return Arm(name=str(raw["name"]), engine=engine, what=str(raw.get("what") or ""), url=url,
               stats_dir=str(raw["stats_dir"]) if raw.get("stats_dir") else None)


def parse_arm(raw: Mapping[str, Any], defaults: Mapping[str, Any], index: int) -> Arm:
    """One arm: its keys over ``defaults`` (module doc), checked; a running server's (``url``) without them."""
    if not isinstance(raw, Mapping):
        raise ArmsError(f"arms[{index}] must be a mapping with at least name and engine (or url), not {raw!r}")
    name = raw.get("name")
    where = _where(index, str(name) if name else None)
    _unknown(raw, ARM_KEYS + ("url", "stats_dir"), where)
    if isinstance(name, bool):
        raise ArmsError(f"{where}: name {name!r} is how YAML reads a bare on, off, yes or no: quote it (name: \"off\")")
    if not name or not NAME.match(str(name)):
        raise ArmsError(f"{where}: name must be a word (letters, digits, _ . -), not {name!r}")
    if raw.get("url"):
        return running_arm(raw, where)
    if raw.get("stats_dir"):
        raise ArmsError(f"{where}: stats_dir is a running server's (with url); a server the sweep starts writes its "
                        "stats to the sweep's own folder")
    merged = {**defaults, **raw,
              "env": {**dict(defaults.get("env") or {}), **dict(raw.get("env") or {})}
              if isinstance(defaults.get("env", {}), Mapping) and isinstance(raw.get("env", {}), Mapping)
              else raw.get("env"),
              "flags": [*(defaults.get("flags") or []), *(raw.get("flags") or [])]
              if isinstance(defaults.get("flags", []), list) and isinstance(raw.get("flags", []), list)
              else raw.get("flags")}
    if "engine" not in merged:
        raise ArmsError(f"{where}: engine is missing: sglang, vllm or embedded (here or in defaults), or url for a "
                        "running server")
    engine = _choice(merged["engine"], "engine", where, ENGINES)
    plugin = _choice(merged.get("plugin", "off"), "plugin", where, PLUGIN_MODES)
    kv_alloc = _choice(merged.get("kv_alloc", "sglang"), "kv_alloc", where, KV_ALLOCS)
    on_path = merged.get("plugin_on_path")
    if on_path is not None and not isinstance(on_path, bool):
        raise ArmsError(f"{where}: plugin_on_path must be true or false, not {on_path!r}")
    if engine != "sglang" and (plugin != "off" or on_path):
        raise ArmsError(f"{where}: the plugin is SGLang's; the {engine} engine takes plugin: off (or drop it)")
    if engine == "vllm" and kv_alloc != "sglang":
        raise ArmsError(f"{where}: kv_alloc contiguous is the SGLang plugin's or the embedded engine's; vLLM has none")
    model = merged.get("model")
    if engine != "embedded" and not model:
        raise ArmsError(f"{where}: model is missing: the {engine} engine needs a model folder "
                        "(data/models/make_mla_model.py --out DIR writes a random-weight one)")
    backend = merged.get("attention_backend")
    if backend is not None and engine != "sglang":
        raise ArmsError(f"{where}: attention_backend is an SGLang flag; the {engine} engine does not take it")
    tp = _int(merged.get("tp", 1), "tp", where)
    ep = _int(merged.get("ep", 1), "ep", where)
    if ep > tp:
        raise ArmsError(f"{where}: ep {ep} exceeds tp {tp}: SGLang 0.5.17 places experts over the TP ranks")
    if engine != "sglang" and (tp > 1 or ep > 1):
        raise ArmsError(f"{where}: tp and ep above 1 are SGLang's here; the {engine} engine runs on one device")
    eplb = merged.get("eplb", False)
    if not isinstance(eplb, bool) or (eplb and ep == 1):
        raise ArmsError(f"{where}: eplb must be true or false, and true only with ep above 1")
    mem = merged.get("mem_fraction")
    if mem is not None and (isinstance(mem, bool) or not isinstance(mem, (int, float)) or not 0 < mem < 1):
        raise ArmsError(f"{where}: mem_fraction must be a fraction between 0 and 1, not {mem!r}")
    if mem is not None and engine != "sglang":
        raise ArmsError(f"{where}: mem_fraction is SGLang's --mem-fraction-static; drop it for {engine}")
    length = _tokens(merged["context_length"], "context_length", where) if merged.get("context_length") else None
    pool = _tokens(merged["max_total_tokens"], "max_total_tokens", where) if merged.get("max_total_tokens") else None
    what = merged.get("what") or ""
    return Arm(name=str(name), engine=engine, what=str(what), model=str(model) if model else None,
               attention_backend=str(backend) if backend else None, plugin=plugin, plugin_on_path=on_path,
               kv_alloc=kv_alloc, speculation=_speculation(merged.get("speculation"), where, engine),
               flags=_strings(merged.get("flags"), "flags", where), env=_env(merged.get("env"), where), tp=tp, ep=ep,
               eplb=eplb, context_length=length, max_total_tokens=pool,
               mem_fraction=float(mem) if mem is not None else None)


def _models(raw: Any) -> tuple[ModelRecipe, ...]:
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise ArmsError("models must be a list of {path: DIR, make: [data/models/make_X.py, ARG, ...]}")
    out = []
    for i, item in enumerate(raw):
        where = f"models[{i}]"
        if not isinstance(item, Mapping):
            raise ArmsError(f"{where} must be a mapping with path and make, not {item!r}")
        _unknown(item, MODEL_KEYS, where)
        if not item.get("path"):
            raise ArmsError(f"{where}: path is missing (the model folder to make)")
        make = _strings(item.get("make"), "make", where)
        if not make or not make[0].endswith(".py"):
            raise ArmsError(f"{where}: make must start with the script that writes the model "
                            "(e.g. [data/models/make_mla_model.py, --layers, \"61\"]); --out PATH is added")
        if "--out" in make:
            raise ArmsError(f"{where}: make must not give --out: the folder is path ({item['path']})")
        out.append(ModelRecipe(str(item["path"]), make))
    return tuple(out)


def parse_arms(data: Any, source: str = "") -> ArmsFile:
    """An arms file's mapping (module doc) into an :class:`ArmsFile`; ArmsError naming the key and the fix."""
    if not isinstance(data, Mapping):
        raise ArmsError(f"{source or 'the arms file'} must be a mapping with an arms: list")
    _unknown(data, TOP_KEYS, source or "the arms file")
    defaults = data.get("defaults") or {}
    if not isinstance(defaults, Mapping):
        raise ArmsError("defaults must be a mapping of arm keys")
    _unknown({k: v for k, v in defaults.items()}, tuple(k for k in ARM_KEYS if k != "name"), "defaults")
    raw_arms = data.get("arms")
    if not isinstance(raw_arms, list) or not raw_arms:
        raise ArmsError(f"{source or 'the arms file'}: arms must be a non-empty list of arms (each a mapping with "
                        "name and engine)")
    arms = tuple(parse_arm(raw, defaults, i) for i, raw in enumerate(raw_arms))
    seen: set[str] = set()
    for arm in arms:
        if arm.name in seen:
            raise ArmsError(f"arm {arm.name!r} appears twice: each name once (rows are told apart by it)")
        seen.add(arm.name)
    settings = data.get("settings") or {}
    if not isinstance(settings, Mapping):
        raise ArmsError("settings must be a mapping of the measurement's settings (e.g. {repeats: 5})")
    return ArmsFile(arms, dict(settings), _models(data.get("models")), str(data.get("description") or ""), source)


def running(urls: Mapping[str, str], what: str = "") -> ArmsFile:
    """Running servers as an arms file: ``{name: url}``, in order (a notebook's one server is an arm too)."""
    return parse_arms({"arms": [{"name": n, "url": u, **({"what": what} if what else {})} for n, u in urls.items()]},
                      "running servers")


def load_arms(path: str | Path) -> ArmsFile:
    """Read and check an arms file (YAML); a relative path that is not found here is read from the project's root
    (a notebook runs in notebooks/)."""
    import yaml  # noqa: PLC0415

    p = Path(path)
    if not p.is_absolute() and not p.is_file():
        p = PROJECT_ROOT / p
    if not p.is_file():
        raise ArmsError(f"no arms file at {path}: give a YAML file of arms (params/arms/ has examples)")
    try:
        data = yaml.safe_load(p.read_text())
    except yaml.YAMLError as exc:
        raise ArmsError(f"{path} is not valid YAML: {exc}") from None
    return parse_arms(data, str(path))
