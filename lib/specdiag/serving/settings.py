"""What a server runs with, typed and engine-neutral: ``ServerSettings``, each field with where it came from.

Vocabulary (the same for every engine):

- ``speculative_method``: the engine's own name (SGLang ``STANDALONE``/``NGRAM``/``EAGLE``..., vLLM
  ``draft_model``/``ngram``/``eagle``...); None when speculation is off or unknown.
- ``algorithm``: the suite's name for it, SGLang's spelling (vLLM ``draft_model`` is SGLang's
  ``STANDALONE``: a separate small model drafts; ``ngram`` is ``NGRAM``; see :data:`VLLM_METHODS`).
- ``tokens_per_step``: the most tokens one verify step can add, the bonus token included. SGLang's
  ``speculative_num_draft_tokens`` already counts that way; vLLM's ``num_speculative_tokens`` k counts
  drafts only, so it is k + 1 (vLLM's ``--speculative-config``; recorded in tests/data/vllm/).
- ``draft_steps``: draft tokens proposed per verify step (SGLang ``speculative_num_steps``, vLLM k).
- ``speculating``: whether the server speculates at all: True, False, or None when nothing told (a vLLM without
  dev mode may say that it speculates, through its counters, and not how: then ``speculating`` is True and
  ``speculative_method`` None). :func:`speculation_state` reads it back from a flat server_info (recorded runs).

``sources`` says, per field, where the value came from (an endpoint, a metric, a parameter).
:meth:`ServerSettings.as_server_info` gives the flat mapping that run.json's ``server`` holds (SGLang's
field names, which recorded runs use), so analyses and replays read one vocabulary for both engines.
Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

__all__ = ["ServerSettings", "VLLM_METHODS", "settings_from_sglang", "speculation_state", "target_layer_ids_of"]

#: vLLM ``--speculative-config`` methods and the suite's (SGLang's) algorithm names.
VLLM_METHODS: dict[str, str] = {
    "draft_model": "STANDALONE", "ngram": "NGRAM", "ngram_gpu": "NGRAM", "eagle": "EAGLE", "eagle3": "EAGLE3",
    "medusa": "MEDUSA", "mlp_speculator": "MLP_SPECULATOR", "suffix": "SUFFIX", "mtp": "MTP",
    "deepseek_mtp": "MTP", "dflash": "DFLASH",
}


@dataclass(frozen=True)
class ServerSettings:
    """The settings that decide long-context speculative decoding, for any engine."""

    engine: str  # "sglang" (or the embedded server, which speaks SGLang's API) or "vllm"
    version: str | None = None  # the server's version string
    model: str | None = None  # model path or served name (what requests name)
    context_length: int | None = None  # longest prompt + output, tokens
    speculating: bool | None = None  # speculative decoding on (True), off (False), or not known (None)
    speculative_method: str | None = None  # the engine's own method name; None: off or not reported
    algorithm: str | None = None  # the suite's name (SGLang's spelling): STANDALONE, NGRAM, EAGLE, ... or NONE
    tokens_per_step: int | None = None  # most tokens one verify step adds, bonus included
    draft_steps: int | None = None  # draft tokens proposed per verify step
    draft_model: str | None = None  # the drafter's path, when a model drafts
    draft_window: int | None = None  # tokens of context the drafter sees (SGLang's draft window); None: no cap
    block_size: int | None = None  # DFLASH: tokens per drafted block, the last committed token included
    target_layer_ids: tuple[int, ...] | None = None  # DFLASH: target layers whose hidden states the drafter reads
    draft_attention_backend: str | None = None  # the drafter's attention kernels, when the server names them
    attention_backend: str | None = None
    page_size: int | None = None  # KV page (SGLang) or block (vLLM) size, tokens
    kv_cache_dtype: str | None = None
    dtype: str | None = None  # weights dtype
    tp_size: int | None = None  # tensor-parallel ranks
    device: str | None = None
    cache_reset: bool | None = None  # the server offers a prefix-cache reset (True/False; None: unknown)
    per_request_spec: bool | None = None  # the server reports speculative counts per request
    sources: dict[str, str] = field(default_factory=dict)  # field name -> where its value came from
    raw: dict[str, Any] = field(default_factory=dict)  # the engine's own answers, as they came

    def source(self, name: str) -> str:
        """Where field ``name`` came from ('not reported' when the server said nothing)."""
        return self.sources.get(name, "not reported" if getattr(self, name, None) is None else "server-reported")

    def speculation_line(self) -> str:
        """One line for a page: speculating or not, the method, tokens per verify step, and what was not seen."""
        if self.speculating is False:
            return f"no speculative decoding ({self.source('speculating')})"
        if self.speculating is None:
            return f"speculative decoding not known ({self.source('speculating')})"
        name = self.algorithm or "on"
        if self.engine != "sglang" and self.speculative_method:
            name += f" ({self.speculative_method}, {self.engine}'s name)"
        where = (self.source("tokens_per_step") if self.engine == "sglang"
                 else f"{self.draft_steps} drafts from {self.source('draft_steps')}, + the bonus token")
        steps = (f"at most {self.tokens_per_step} tokens per verify step ({where})"
                 if self.tokens_per_step else f"tokens per verify step not seen: {self.source('tokens_per_step')}")
        method = "" if self.algorithm else f"; method {self.source('speculative_method')}"
        return f"speculative decoding {name}, {steps}{method}"

    def rows(self) -> list[dict[str, Any]]:
        """One ``{setting, value, source}`` row per typed field (for a table)."""
        skip = {"sources", "raw"}
        return [{"setting": f.name, "value": getattr(self, f.name), "source": self.source(f.name)}
                for f in fields(self) if f.name not in skip]

    def as_server_info(self) -> dict[str, Any]:
        """The flat mapping run.json's ``server`` holds: SGLang's /server_info names.

        For SGLang that is its /server_info itself (every key kept); for other engines the typed fields
        under those names, plus ``engine``, ``speculative_method`` and ``settings_sources``.
        """
        if self.engine == "sglang" and self.raw.get("server_info"):
            return {**dict(self.raw["server_info"]), "engine": "sglang", "speculative_decoding": self.speculating}
        return {
            "engine": self.engine, "version": self.version, "model_path": self.model,
            "context_length": self.context_length, "speculative_decoding": self.speculating,
            "speculative_method": self.speculative_method,
            "speculative_algorithm": self.algorithm, "speculative_num_draft_tokens": self.tokens_per_step,
            "speculative_num_steps": self.draft_steps, "speculative_draft_model_path": self.draft_model,
            "speculative_draft_window_size": self.draft_window, "attention_backend": self.attention_backend,
            "speculative_dflash_block_size": self.block_size,
            "dflash_target_layer_ids": list(self.target_layer_ids) if self.target_layer_ids else None,
            "speculative_draft_attention_backend": self.draft_attention_backend,
            "page_size": self.page_size, "kv_cache_dtype": self.kv_cache_dtype, "dtype": self.dtype,
            "tp_size": self.tp_size, "device": self.device, "cache_reset": self.cache_reset,
            "per_request_spec": self.per_request_spec, "settings_sources": dict(self.sources),
        }


def speculation_state(server_info: Mapping[str, Any]) -> bool | None:
    """Whether a server (run.json's flat ``server``) speculates: its ``speculative_decoding`` when recorded, else
    from ``speculative_algorithm`` (set and not NONE: True; SGLang reports None or NONE when off: False; a vLLM
    without dev mode recorded before ``speculative_decoding`` existed: None, not known)."""
    flag = server_info.get("speculative_decoding")
    if isinstance(flag, bool):
        return flag
    algo = server_info.get("speculative_algorithm")
    if algo not in (None, "") and str(algo).upper() != "NONE":
        return True
    return None if server_info.get("engine") == "vllm" and algo is None else False


def _int(value: Any) -> int | None:
    try:
        return None if value is None or isinstance(value, bool) else int(value)
    except (TypeError, ValueError):
        return None


def _state(info: Mapping[str, Any]) -> Mapping[str, Any]:
    states = info.get("internal_states")
    return states[0] if isinstance(states, list) and states and isinstance(states[0], Mapping) else {}


def _target_layer_ids(drafter_config: Any) -> tuple[int, ...] | None:
    dcfg = drafter_config.get("dflash_config") if isinstance(drafter_config, Mapping) else None
    ids = dcfg.get("target_layer_ids") if isinstance(dcfg, Mapping) else None
    return tuple(int(i) for i in ids) if isinstance(ids, (list, tuple)) and ids else None


def target_layer_ids_of(drafter_config: Any) -> tuple[int, ...] | None:
    """``dflash_config.target_layer_ids`` of a drafter config mapping (None when it has none)."""
    return _target_layer_ids(drafter_config)


def _sglang_dflash(get: Any, dflash: bool, n_draft: int | None) -> dict[str, Any]:
    """DFLASH's block, target layers and drafter backend as SGLang's /server_info states them: the block is
    ``speculative_dflash_block_size``, else ``speculative_num_draft_tokens`` (SGLang sets it to the block,
    speculative_hook._handle_dflash); the target layers only where the server carries the drafter's config (the
    embedded server's ``speculative_draft_model_config``; SGLang's /server_info does not)."""
    if not dflash:
        return {"draft_attention_backend": get("speculative_draft_attention_backend")}
    return {"block_size": _int(get("speculative_dflash_block_size")) or n_draft,
            "target_layer_ids": _target_layer_ids(get("speculative_draft_model_config")),
            "draft_attention_backend": get("speculative_draft_attention_backend")}


def _sglang_dflash_sources(values: Mapping[str, Any], get: Any, dflash: bool) -> dict[str, str]:
    out: dict[str, str] = {}
    if not dflash:
        out["block_size"] = out["target_layer_ids"] = "not applicable: the server does not run DFLASH"
    else:
        if get("speculative_dflash_block_size") is None and values.get("block_size") is not None:
            out["block_size"] = ("computed: speculative_num_draft_tokens, which SGLang sets to the DFLASH block "
                                 "(speculative_dflash_block_size is null)")
        if values.get("target_layer_ids") is not None:
            out["target_layer_ids"] = "/server_info speculative_draft_model_config.dflash_config"
        else:
            out["target_layer_ids"] = ("not stated: SGLang's /server_info does not carry the drafter's config.json "
                                       "(its dflash_config.target_layer_ids is in the drafter folder)")
        if values.get("draft_window") is None:
            out["draft_window"] = ("/server_info: speculative_draft_window_size is null (no window: the drafter "
                                   "keeps the whole context)")
    if values.get("draft_attention_backend") is None and values.get("speculating"):
        out["draft_attention_backend"] = ("not stated: /server_info has speculative_draft_attention_backend null "
                                          "(SGLang then picks the drafter's backend from the target's at start-up)")
    return out


def settings_from_sglang(server_info: Mapping[str, Any]) -> ServerSettings:
    """ServerSettings from SGLang's (or the embedded server's) /server_info; every field server-reported."""
    info = dict(server_info)
    state = _state(info)

    def get(key: str) -> Any:
        return info[key] if info.get(key) is not None else state.get(key)

    algo = get("speculative_algorithm")
    on = algo is not None and str(algo).upper() != "NONE"
    n_draft = _int(get("speculative_num_draft_tokens")) if on else None
    steps = _int(get("speculative_num_steps")) if on else None
    reported_steps = steps
    if steps == 0 and n_draft:  # SGLang 0.5.17's NGRAM reports 0 steps, yet proposes num_draft_tokens - 1 per step
        steps = None
    values = dict(
        engine="sglang", version=get("version"), model=get("model_path") or get("served_model_name"),
        context_length=_int(get("context_length")), speculating=on, speculative_method=str(algo) if on else None,
        algorithm=str(algo).upper() if algo is not None else None, tokens_per_step=n_draft,
        draft_steps=steps if steps is not None else (n_draft - 1 if n_draft else None),
        draft_model=get("speculative_draft_model_path") if on else None,
        draft_window=_int(get("speculative_draft_window_size")),
        attention_backend=get("attention_backend") or get("decode_attention_backend"),
        page_size=_int(get("page_size")), kv_cache_dtype=get("kv_cache_dtype"), dtype=get("dtype"),
        tp_size=_int(get("tp_size")), device=get("device"), cache_reset=True, per_request_spec=True,
    )
    values.update(_sglang_dflash(get, on and str(algo).upper() == "DFLASH", n_draft))
    sources = {k: "/server_info" for k, v in values.items() if v is not None and k != "engine"}
    sources.update(_sglang_dflash_sources(values, get, on and str(algo).upper() == "DFLASH"))
    sources["cache_reset"] = "SGLang API (POST /flush_cache)"
    sources["per_request_spec"] = "SGLang API (meta_info spec_verify_ct)"
    if on and steps is None and n_draft:
        sources["draft_steps"] = "computed (speculative_num_draft_tokens - 1)" + (
            f"; the server reports speculative_num_steps {reported_steps}" if reported_steps is not None else "")
    return ServerSettings(**values, sources=sources, raw={"server_info": info})
