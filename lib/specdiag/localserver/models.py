"""Loading the embedded engine's models from local Hugging Face folders (never from a hub).

The target and the drafter are plain ``AutoModelForCausalLM`` folders (config.json,
model.safetensors, tokenizer.json, tokenizer_config.json). Everything is loaded with
``local_files_only=True``, so a missing folder is an error here, not a download.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

#: dtype names accepted on the command line -> torch dtypes. "auto" means float32: the tiny
#: embedded models are small, and float32 keeps verify (k+1 tokens per forward) and plain
#: decoding (1 token per forward) numerically close enough for greedy to agree token for token.
#: Measured on an H200 (tiny test models, 24 prompts, 40 tokens, 8 draft tokens): float32 gave
#: identical outputs 24/24 for NGRAM and STANDALONE; bfloat16 23/24 (one near-tie flipped).
DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
    "float64": torch.float64,
}

#: transformers' attention implementation name -> the name reported as ``attention_backend``.
ATTENTION_BACKEND_NAMES: dict[str, str] = {"sdpa": "torch_sdpa", "eager": "torch_eager"}


class ModelLoadError(RuntimeError):
    """A model folder is missing or unusable; the message names the path and the fix."""


@dataclass
class LoadedModel:
    """One causal LM ready for inference, with the facts the server reports about it."""

    path: Path
    model: Any  # transformers PreTrainedModel
    config: Any  # its PretrainedConfig
    cache_kwarg: str  # "cache" (transformers >= 5.2x) or "past_key_values"
    attention_backend: str


def resolve_device(device: str) -> torch.device:
    """``auto`` -> cuda when available else cpu; ``cuda`` without a GPU is an error."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        raise ModelLoadError("--device cuda was asked for but torch sees no CUDA GPU: use --device auto or cpu")
    if device not in ("cpu", "cuda"):
        raise ModelLoadError(f"unknown device {device!r}: use auto, cpu or cuda")
    return torch.device(device)


def resolve_dtype(name: str) -> torch.dtype:
    """``auto`` -> float32 (see DTYPES); otherwise one of DTYPES' names."""
    if name == "auto":
        return torch.float32
    if name not in DTYPES:
        raise ModelLoadError(f"unknown dtype {name!r}: use auto or one of {', '.join(DTYPES)}")
    return DTYPES[name]


def check_model_folder(path: Path, role: str, hint: str) -> None:
    """Raise ModelLoadError unless ``path`` looks like a Hugging Face model folder."""
    if not path.is_dir():
        raise ModelLoadError(f"no model at {path}: {hint}")
    if not (path / "config.json").is_file():
        raise ModelLoadError(f"{role} folder {path} has no config.json: {hint}")
    if not any(path.glob("*.safetensors")) and not any(path.glob("*.bin")):
        raise ModelLoadError(f"{role} folder {path} has no weights (*.safetensors): {hint}")


def _cache_kwarg(model: Any) -> str:
    params = inspect.signature(model.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


def _check_sliding_config(config: Any, path: Path) -> None:
    layer_types = getattr(config, "layer_types", None) or []
    if "sliding_attention" in layer_types and getattr(config, "sliding_window", None) is None:
        raise ModelLoadError(
            f"{path}/config.json declares sliding_attention layers but sliding_window is null "
            "(for Qwen3 set use_sliding_window: true and sliding_window: N)"
        )


def load_model(path: Path, role: str, device: torch.device, dtype: torch.dtype, hint: str) -> LoadedModel:
    """Load one causal LM from a local folder onto ``device`` in ``dtype``, in eval mode."""
    from transformers import AutoModelForCausalLM

    check_model_folder(path, role, hint)
    try:
        model = AutoModelForCausalLM.from_pretrained(
            str(path), local_files_only=True, dtype=dtype, attn_implementation="sdpa"
        )
    except Exception as exc:  # noqa: BLE001 - re-raised with the path and the cause
        raise ModelLoadError(f"could not load the {role} model from {path}: {exc}") from exc
    model.to(device)
    model.eval()
    _check_sliding_config(model.config, path)
    impl = getattr(model.config, "_attn_implementation", None) or "sdpa"
    return LoadedModel(
        path=path,
        model=model,
        config=model.config,
        cache_kwarg=_cache_kwarg(model),
        attention_backend=ATTENTION_BACKEND_NAMES.get(impl, impl),
    )


def load_tokenizer(path: Path) -> Any:
    """The tokenizer saved beside the target model (``AutoTokenizer``, local files only)."""
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    except Exception as exc:  # noqa: BLE001
        raise ModelLoadError(
            f"could not load the tokenizer from {path} (tokenizer.json + tokenizer_config.json expected): {exc}"
        ) from exc


def context_length_of(config: Any) -> int:
    """The model's own context length: ``max_position_embeddings`` of its config."""
    value = getattr(config, "max_position_embeddings", None)
    if not isinstance(value, int) or value <= 0:
        raise ModelLoadError("the target config has no max_position_embeddings: pass --context-length")
    return value


def eos_token_ids(model_config: Any, tokenizer: Any) -> list[int]:
    """End-of-sequence ids from the model config, else the tokenizer."""
    eos = getattr(model_config, "eos_token_id", None)
    if eos is None and tokenizer is not None:
        eos = getattr(tokenizer, "eos_token_id", None)
    if eos is None:
        return []
    return [int(e) for e in (eos if isinstance(eos, (list, tuple)) else [eos])]
