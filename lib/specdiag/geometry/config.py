"""From a Hugging Face config.json (or a preset) to a :class:`ModelGeometry`, and which model a run is about.

- :func:`from_hf_config`: the attention kind (MLA when the config has ``kv_lora_rank``; else GQA, or
  MHA when every query head has its own KV head), the per-layer attention types and sliding window,
  the mixture-of-experts shape and the stored bytes per parameter (dtype and quantization);
- :func:`load_geometry`: a preset name, a config.json path or a config dict;
- :func:`geometry_for_run`: the geometry a notebook analyses, from its parameters, the recorded run
  or the server.

Import these from :mod:`specdiag.geometry`, which re-exports them.
"""

from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path
from typing import Any, Literal, Mapping

from specdiag.geometry.presets import PRESETS
from specdiag.geometry.types import (
    DTYPE_BYTES,
    LAYER_FULL,
    LAYER_SLIDING,
    AttentionKind,
    ModelGeometry,
    MoEShape,
    WeightBytesPerParam,
    dtype_bytes,
)
from specdiag.paths import PROJECT_ROOT

# ---------------------------------------------------------------------------------------------
# From a Hugging Face config.json
# ---------------------------------------------------------------------------------------------

def _text_config(cfg: Mapping[str, Any]) -> Mapping[str, Any]:
    """Multimodal wrappers (Kimi-K2.5/K2.6: model_type kimi_k25) keep the language model in text_config."""
    inner = cfg.get("text_config")
    if isinstance(inner, Mapping) and inner.get("num_hidden_layers"):
        merged = dict(inner)
        if "quantization_config" not in merged and "quantization_config" in cfg:
            merged["quantization_config"] = cfg["quantization_config"]
        return merged
    return cfg


def _require(cfg: Mapping[str, Any], key: str, what: str) -> Any:
    value = cfg.get(key)
    if value is None:
        raise ValueError(f"the model config has no {key!r}, which {what} needs: pass a complete config.json "
                         f"or a preset name ({', '.join(sorted(PRESETS))})")
    return value


def _layer_types(cfg: Mapping[str, Any], n_layers: int) -> tuple[tuple[str, ...], int | None]:
    """Per-layer attention types and the sliding window, from the config's fields.

    Reads ``layer_types`` when present (transformers >= 4.5x writes it for Qwen3, Gemma, Mistral);
    else Qwen2/3's ``use_sliding_window`` + ``max_window_layers`` (layers at or above it slide);
    else a bare ``sliding_window`` (Mistral) means every layer slides.
    """
    window = cfg.get("sliding_window")
    explicit = cfg.get("layer_types")
    if explicit:
        types = tuple(str(t) for t in explicit)
        if len(types) != n_layers:
            raise ValueError(f"layer_types has {len(types)} entries but num_hidden_layers is {n_layers}")
        unknown = sorted(set(types) - {LAYER_FULL, LAYER_SLIDING})
        if unknown:
            raise ValueError(f"layer_types {unknown} are not modelled (only {LAYER_FULL!r} and {LAYER_SLIDING!r})")
        if LAYER_SLIDING in types and not window:
            raise ValueError("layer_types has sliding_attention layers but the config has no sliding_window")
        return types, (int(window) if window and LAYER_SLIDING in types else None)
    if "use_sliding_window" in cfg:
        if not cfg.get("use_sliding_window") or not window:
            return (LAYER_FULL,) * n_layers, None
        first = int(cfg.get("max_window_layers", 0) or 0)
        return tuple(LAYER_SLIDING if i >= first else LAYER_FULL for i in range(n_layers)), int(window)
    if window:
        return (LAYER_SLIDING,) * n_layers, int(window)
    return (LAYER_FULL,) * n_layers, None


def _moe_shape(cfg: Mapping[str, Any], n_layers: int) -> MoEShape | None:
    """DeepSeek/Kimi (n_routed_experts), Qwen-MoE (num_experts) or Mixtral (num_local_experts)."""
    if cfg.get("n_routed_experts"):
        first_dense = int(cfg.get("first_k_dense_replace", 0) or 0)
        freq = cfg.get("moe_layer_freq", 1) or 1
        layers = tuple(i for i in range(n_layers) if i >= first_dense and i % int(freq) == 0)
        inter = int(_require(cfg, "moe_intermediate_size", "an MoE model's expert size"))
        return MoEShape(n_routed_experts=int(cfg["n_routed_experts"]),
                        num_experts_per_tok=int(_require(cfg, "num_experts_per_tok", "MoE routing")),
                        moe_intermediate_size=inter,
                        shared_intermediate_size=int(cfg.get("n_shared_experts", 0) or 0) * inter,
                        moe_layers=layers)
    if cfg.get("num_experts"):
        step = int(cfg.get("decoder_sparse_step", 1) or 1)
        only_mlp = set(cfg.get("mlp_only_layers") or [])
        layers = tuple(i for i in range(n_layers) if i not in only_mlp and (i + 1) % step == 0)
        return MoEShape(n_routed_experts=int(cfg["num_experts"]),
                        num_experts_per_tok=int(_require(cfg, "num_experts_per_tok", "MoE routing")),
                        moe_intermediate_size=int(_require(cfg, "moe_intermediate_size", "MoE expert size")),
                        shared_intermediate_size=int(cfg.get("shared_expert_intermediate_size", 0) or 0),
                        moe_layers=layers)
    if cfg.get("num_local_experts"):
        return MoEShape(n_routed_experts=int(cfg["num_local_experts"]),
                        num_experts_per_tok=int(_require(cfg, "num_experts_per_tok", "MoE routing")),
                        moe_intermediate_size=int(_require(cfg, "intermediate_size", "MoE expert size")),
                        shared_intermediate_size=0, moe_layers=tuple(range(n_layers)))
    return None


# Module names that stand for each part, to test against a quantization config's ``ignore`` list.
_PART_MODULES = {
    "attention": "model.layers.1.self_attn.q_proj",
    "dense_mlp": "model.layers.0.mlp.gate_proj",
    "shared_experts": "model.layers.1.mlp.shared_experts.gate_proj",
    "routed_experts": "model.layers.1.mlp.experts.0.gate_proj",
    "router": "model.layers.1.mlp.gate",
    "lm_head": "lm_head",
}


def _ignored(module: str, ignore: list[str]) -> bool:
    for pattern in ignore:
        if pattern.startswith("re:"):
            if re.fullmatch(pattern[3:], module):
                return True
        elif module == pattern or module.endswith("." + pattern):
            return True
    return False


def weight_bytes_from_config(cfg: Mapping[str, Any], weight_dtype: str | None = None) -> WeightBytesPerParam:
    """Bytes per parameter by part, from ``torch_dtype``/``dtype`` and ``quantization_config``.

    - no quantization: the model dtype (``weight_dtype`` overrides it) for everything;
    - ``quant_method: fp8`` (DeepSeek-V3, Kimi-K2): linear layers 1 B plus one fp32 scale per
      ``weight_block_size`` block (128 x 128: 4/16384 B per parameter); embedding, LM head and
      router stay at the model dtype;
    - ``quant_method: compressed-tensors`` with integer weights (Kimi-K2-Thinking, K2.5, K2.6): the
      linear layers not matched by ``ignore`` take ``num_bits / 8`` B plus one bf16 scale per
      ``group_size`` weights; the ignored ones (attention, shared experts, LM head in Kimi's
      configs) stay at the model dtype; the router and embedding stay at the model dtype.
    """
    base_name = weight_dtype or cfg.get("torch_dtype") or cfg.get("dtype") or "bfloat16"
    base = dtype_bytes(str(base_name))
    q = cfg.get("quantization_config") or {}
    method = str(q.get("quant_method", "")).lower()
    parts = {p: base for p in _PART_MODULES}
    note = f"model dtype {base_name} ({base:g} B/param)"
    if weight_dtype is None and method == "fp8":
        block = q.get("weight_block_size") or [128, 128]
        per = 1.0 + 4.0 / (int(block[0]) * int(block[1]))
        for p in ("attention", "dense_mlp", "shared_experts", "routed_experts"):
            parts[p] = per
        note = (f"fp8 linear layers with fp32 scales per {block[0]}x{block[1]} block ({per:.5f} B/param); "
                f"embedding, router and LM head at {base_name}")
    elif weight_dtype is None and method == "compressed-tensors":
        groups = q.get("config_groups") or {}
        w = next(iter(groups.values()), {}).get("weights", {}) if groups else {}
        bits = int(w.get("num_bits", 8))
        group = w.get("group_size")
        per = bits / 8 + (2.0 / int(group) if group else 0.0)
        ignore = [str(x) for x in (q.get("ignore") or [])]
        quantized = []
        for p, module in _PART_MODULES.items():
            if p == "router" or _ignored(module, ignore):
                continue
            parts[p] = per
            quantized.append(p)
        note = (f"compressed-tensors int{bits}" + (f", bf16 scale per {group} weights" if group else "")
                + f" ({per:g} B/param) for {', '.join(quantized)}; the rest at {base_name}")
    elif method and weight_dtype is None:
        note = f"quantization {method!r} is not modelled: every weight counted at {base_name}"
    return WeightBytesPerParam(embedding=base, note=note, **parts)


def from_hf_config(config: Mapping[str, Any] | str | Path, kv_dtype: str | None = None,
                   weight_dtype: str | None = None, name: str | None = None) -> ModelGeometry:
    """A :class:`ModelGeometry` from a Hugging Face config (a dict, a config.json path or its folder).

    ``kv_dtype``: the KV cache dtype (SGLang's ``--kv-cache-dtype``); None or ``auto``: the model's
    dtype from the config (bf16 when it names none). ``weight_dtype`` overrides the config's dtype
    and quantization.
    """
    source = "config dict"
    if isinstance(config, (str, Path)):
        path = Path(config)
        if path.is_dir():
            path = path / "config.json"
        if not path.exists():
            raise FileNotFoundError(f"no model config at {path}: pass a config.json path, its folder, "
                                    f"or a preset name ({', '.join(sorted(PRESETS))})")
        cfg_all: Mapping[str, Any] = json.loads(path.read_text())
        source = str(path)
    else:
        cfg_all = config
    cfg = _text_config(cfg_all)
    n_layers = int(_require(cfg, "num_hidden_layers", "the layer count"))
    hidden = int(_require(cfg, "hidden_size", "the weight sizes"))
    heads = int(_require(cfg, "num_attention_heads", "the attention shape"))
    types, window = _layer_types(cfg, n_layers)
    model_type = str(cfg_all.get("model_type", cfg.get("model_type", "")))
    if cfg.get("kv_lora_rank"):
        attention: AttentionKind = "mla"
        nope = int(_require(cfg, "qk_nope_head_dim", "MLA"))
        rope = int(_require(cfg, "qk_rope_head_dim", "MLA"))
        kv_heads, head_dim = 1, nope + rope
    else:
        kv_heads = int(cfg.get("num_key_value_heads") or heads)
        attention = "mha" if kv_heads == heads else "gqa"
        head_dim = int(cfg.get("head_dim") or hidden // heads)
        nope = rope = None  # type: ignore[assignment]
    kv = _kv_dtype_name(kv_dtype) if kv_dtype else None
    if kv_dtype and kv is None and kv_dtype != "auto":
        dtype_bytes(kv_dtype)  # raises naming the choices
    kv = kv or _kv_dtype_name(cfg.get("torch_dtype") or cfg.get("dtype") or cfg_all.get("torch_dtype")) or "bf16"
    return ModelGeometry(
        name=name or model_type or source, attention=attention, num_layers=n_layers,
        num_attention_heads=heads, num_kv_heads=kv_heads, head_dim=head_dim, hidden_size=hidden,
        vocab_size=int(_require(cfg, "vocab_size", "the LM head size")),
        intermediate_size=int(cfg.get("intermediate_size") or 0),
        layer_types=types, sliding_window=window, kv_dtype=kv,
        kv_lora_rank=cfg.get("kv_lora_rank"), qk_rope_head_dim=rope if attention == "mla" else None,
        qk_nope_head_dim=nope if attention == "mla" else None,
        v_head_dim=cfg.get("v_head_dim") if attention == "mla" else None,
        q_lora_rank=cfg.get("q_lora_rank") if attention == "mla" else None,
        moe=_moe_shape(cfg, n_layers), weight_bytes=weight_bytes_from_config(cfg, weight_dtype),
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        max_position_embeddings=cfg.get("max_position_embeddings"),
        rope_scaling=cfg.get("rope_scaling") or cfg.get("rope_parameters"),
        model_type=model_type, source=source,
    )


# ---------------------------------------------------------------------------------------------
# A preset, a path or a dict
# ---------------------------------------------------------------------------------------------

def load_geometry(model_config: str | Mapping[str, Any], kv_dtype: str | None = None,
                  weight_dtype: str | None = None) -> ModelGeometry:
    """A preset name, a config.json path (or its folder), or a config dict -> :class:`ModelGeometry`."""
    if isinstance(model_config, Mapping):
        return from_hf_config(model_config, kv_dtype, weight_dtype)
    if model_config in PRESETS:
        factory, source = PRESETS[model_config]
        geom = from_hf_config(factory(), kv_dtype, weight_dtype, name=model_config)
        return replace(geom, source=source)
    path = Path(model_config)
    if not path.exists():
        raise ValueError(f"model_config {model_config!r} is neither a preset ({', '.join(sorted(PRESETS))}) "
                         f"nor an existing config.json path")
    return from_hf_config(path, kv_dtype, weight_dtype)


# ---------------------------------------------------------------------------------------------
# Which model a run is about
# ---------------------------------------------------------------------------------------------

def _kv_dtype_name(value: Any) -> str | None:
    """'bf16', 'fp8_e4m3', 'auto (bf16)' -> a dtype name, or None for auto/unknown."""
    if not value:
        return None
    text = str(value).split("(")[-1].rstrip(")").strip() if "(" in str(value) else str(value)
    text = text.lower().replace("torch.", "")
    return text if text in DTYPE_BYTES and text != "auto" else None


def recorded_config(section: Mapping[str, Any]) -> tuple[dict[str, Any], list[str]] | None:
    """A run.json ``model``/``drafter`` section's config and the keys in it that were assumed, or None.

    A section holds either ``model_config`` (a whole config.json, as recorded from a server) or, for a
    transcribed publication, ``published_config`` overlaid with ``assumed_config`` (values the source did
    not publish, filled in to complete the config; their names come back so a page can say so).
    """
    if section.get("model_config"):
        return dict(section["model_config"]), []
    if section.get("published_config"):
        assumed = dict(section.get("assumed_config") or {})
        return {**dict(section["published_config"]), **assumed}, sorted(assumed)
    return None


def geometry_for_run(model_config: str = "", kv_dtype: str = "", run_meta: Mapping[str, Any] | None = None,
                     server_info: Mapping[str, Any] | None = None, role: Literal["target", "drafter"] = "target",
                     project_root: Path | None = None, param_name: str = "") -> ModelGeometry:
    """The geometry a notebook analyses, and where it came from (in ``.source``).

    Model: the ``model_config`` parameter (a preset or a config.json path) > the recorded run's
    ``model``/``drafter`` section (:func:`recorded_config`, or its ``preset``) > the server's
    ``model_path``/``speculative_draft_model_path`` folder (readable from this machine).
    KV dtype: the ``kv_dtype`` parameter > the recorded section's ``kv_cache_dtype`` > the server's
    ``kv_cache_dtype`` > its ``dtype`` (when not ``auto``) > the config's dtype > bf16. When the server names a concrete
    ``dtype`` and the config has no quantization, the weights are counted at that dtype.
    """
    root = project_root or PROJECT_ROOT
    param_name = param_name or ("model_config" if role == "target" else "drafter_config")
    section = dict((run_meta or {}).get("model" if role == "target" else "drafter") or {})
    info = dict(server_info or {})
    kv = (_kv_dtype_name(kv_dtype) if kv_dtype else None)
    if kv_dtype and kv is None:
        dtype_bytes(kv_dtype)  # raises naming the choices
    kv = kv or _kv_dtype_name(section.get("kv_cache_dtype")) or _kv_dtype_name(info.get("kv_cache_dtype")) \
        or _kv_dtype_name(info.get("dtype"))  # None: the config's dtype (from_hf_config)
    server_dtype = _kv_dtype_name(info.get("dtype"))
    if model_config:
        geom = load_geometry(model_config, kv_dtype=kv)
        return replace(geom, source=f"parameter model_config={model_config!r}: {geom.source}")
    recorded = recorded_config(section)
    if recorded is not None:
        cfg, assumed = recorded
        geom = from_hf_config(cfg, kv_dtype=kv, name=section.get("name"))
        return replace(geom, source=f"the recorded run's {role} config ({section.get('preset') or 'run.json'})"
                       + (f"; assumed, not published: {', '.join(assumed)}" if assumed else ""))
    if section.get("preset"):
        geom = load_geometry(section["preset"], kv_dtype=kv)
        return replace(geom, source=f"the recorded run's preset {section['preset']!r}: {geom.source}")
    key = "model_path" if role == "target" else "speculative_draft_model_path"
    path_value = info.get(key)
    if path_value:
        path = Path(str(path_value))
        if not path.is_absolute():
            path = root / path
        cfg_path = path / "config.json" if path.suffix != ".json" else path
        if cfg_path.exists():
            cfg = json.loads(cfg_path.read_text())
            weight_dtype = server_dtype if (server_dtype and not _text_config(cfg).get("quantization_config")) else None
            geom = from_hf_config(cfg, kv_dtype=kv, weight_dtype=weight_dtype, name=path.name)
            return replace(geom, source=f"the server's {key} {path_value} (config.json read from this machine)")
        raise ValueError(f"the server's {key} is {path_value!r} but {cfg_path} cannot be read from here: pass "
                         f"{param_name} (a preset: {', '.join(sorted(PRESETS))}; or a path to the config.json)")
    raise ValueError(f"no {role} model config: the run records none and the server reports no {key}; pass "
                     f"{param_name} (a preset: {', '.join(sorted(PRESETS))}; or a path to the config.json)")
