"""Tiny random-weight models for tests and demos of the embedded server (seconds to make, on CPU).

``make_tiny_models(folder)`` writes three Hugging Face folders that load like the trained ones:

- ``target``: a Llama causal LM (full attention);
- ``drafter``: a Qwen3 causal LM with sliding-window layers and one full-attention layer, YaRN rope
  scaling, independent random weights (it rarely agrees with the target);
- ``clone_target`` and ``clone_drafter``: a Qwen3 target without sliding window and a drafter with
  the SAME weights but a sliding window, so drafts are right while the context fits the window and
  partly wrong beyond it (every acceptance path gets exercised).

The tokenizer is a small byte-level BPE trained with the ``tokenizers`` library on Python's own
bundled documentation (``pydoc_data``, licence-clean and offline).
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch

#: BPE vocabulary of the tiny tokenizer (tokens)
TINY_VOCAB_SIZE = 384
#: sliding window of the tiny drafters (tokens), small so that tests cross it quickly
TINY_SLIDING_WINDOW = 24
#: bump when the tiny models change, so cached folders are rebuilt
TINY_FORMAT = 1


@dataclass(frozen=True)
class TinyModels:
    target: Path
    drafter: Path
    clone_target: Path
    clone_drafter: Path


def _corpus_lines(max_chars: int = 200_000) -> list[str]:
    from pydoc_data import topics

    text = "\n".join(topics.topics.values())[:max_chars]
    return [line for line in text.splitlines() if line.strip()]


def make_tokenizer(folder: Path) -> None:
    """Train a byte-level BPE and save it as tokenizer.json + tokenizer_config.json."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=TINY_VOCAB_SIZE,
        special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus_lines(), trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>")
    fast.save_pretrained(str(folder))


def _save(model: torch.nn.Module, folder: Path, tokenizer_src: Path) -> None:
    model.save_pretrained(str(folder))
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        src = tokenizer_src / name
        if src.is_file():
            (folder / name).write_bytes(src.read_bytes())


def make_tiny_models(root: Path, seed: int = 0) -> TinyModels:
    """Write the tiny model folders under ``root`` (see the module docstring) and return their paths."""
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen3Config, Qwen3ForCausalLM

    root.mkdir(parents=True, exist_ok=True)
    tok_dir = root / "tokenizer"
    tok_dir.mkdir(exist_ok=True)
    make_tokenizer(tok_dir)
    vocab = TINY_VOCAB_SIZE
    eos = 0  # <|endoftext|> is the first special token
    paths = TinyModels(root / "target", root / "drafter", root / "clone_target", root / "clone_drafter")

    torch.manual_seed(seed)
    target = LlamaForCausalLM(
        LlamaConfig(
            vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096,
            eos_token_id=eos, bos_token_id=eos, tie_word_embeddings=False,
        )
    )
    _save(target, paths.target, tok_dir)

    drafter_kwargs = dict(
        vocab_size=vocab, hidden_size=48, intermediate_size=96, num_hidden_layers=3,
        num_attention_heads=4, num_key_value_heads=2, head_dim=12, max_position_embeddings=4096,
        use_sliding_window=True, sliding_window=TINY_SLIDING_WINDOW, max_window_layers=0,
        layer_types=["sliding_attention", "full_attention", "sliding_attention"],
        rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                         "original_max_position_embeddings": 1024},
        eos_token_id=eos, bos_token_id=eos, tie_word_embeddings=True,
    )
    torch.manual_seed(seed + 1)
    _save(Qwen3ForCausalLM(Qwen3Config(**drafter_kwargs)), paths.drafter, tok_dir)

    clone_kwargs = dict(
        vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=4096,
        eos_token_id=eos, bos_token_id=eos, tie_word_embeddings=False,
    )
    torch.manual_seed(seed + 2)
    clone_target = Qwen3ForCausalLM(Qwen3Config(**clone_kwargs))
    _save(clone_target, paths.clone_target, tok_dir)
    clone_drafter = Qwen3ForCausalLM(
        Qwen3Config(
            **clone_kwargs, use_sliding_window=True, sliding_window=TINY_SLIDING_WINDOW, max_window_layers=0,
            layer_types=["sliding_attention", "full_attention"],
        )
    )
    clone_drafter.load_state_dict(clone_target.state_dict())
    _save(clone_drafter, paths.clone_drafter, tok_dir)
    return paths


def cached_tiny_models(seed: int = 0) -> TinyModels:
    """``make_tiny_models`` into a per-user temp folder, reused across test processes."""
    root = Path(tempfile.gettempdir()) / f"specdiag-tiny-models-v{TINY_FORMAT}-seed{seed}-uid{os.getuid()}"
    done = root / "COMPLETE"
    if not done.is_file():
        tmp = Path(tempfile.mkdtemp(prefix=root.name + ".", dir=root.parent))
        make_tiny_models(tmp, seed)
        (tmp / "COMPLETE").write_text("ok\n")
        try:
            tmp.rename(root)
        except OSError:  # another process finished first: use theirs
            import shutil

            shutil.rmtree(tmp, ignore_errors=True)
    return TinyModels(root / "target", root / "drafter", root / "clone_target", root / "clone_drafter")
