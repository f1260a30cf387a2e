"""Train the embedded models' shared byte-level BPE tokenizer on data/corpus/train.txt.

Byte-level, so any UTF-8 text encodes; no token is added around the text (no BOS), and
``<|endoftext|>`` is the end-of-sequence and padding token. The novel prose in data/prompts/ is never
seen here. Output: a Hugging Face tokenizer folder (tokenizer.json, tokenizer_config.json,
special_tokens_map.json) loadable with ``AutoTokenizer.from_pretrained(folder)``.

    python data/models/build_tokenizer.py            # writes data/models/tokenizer/
"""

from __future__ import annotations

import argparse
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
EOS = "<|endoftext|>"


def train_tokenizer(corpus: Path, vocab_size: int):
    """A PreTrainedTokenizerFast trained on `corpus` (BPE training in `tokenizers` is deterministic)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=[EOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train([str(corpus)], trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token=EOS, bos_token=EOS, pad_token=EOS, unk_token=None,
        model_max_length=1 << 30, clean_up_tokenization_spaces=False,
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--corpus", type=Path, default=REPO / "data/corpus/train.txt")
    ap.add_argument("--vocab-size", type=int, default=4096)
    ap.add_argument("--out", type=Path, default=REPO / "data/models/tokenizer")
    args = ap.parse_args(argv)
    if not args.corpus.is_file():
        ap.error(f"--corpus {args.corpus} not found: run data/corpus/build_corpus.py first")
    tok = train_tokenizer(args.corpus, args.vocab_size)
    tok.save_pretrained(str(args.out))
    print(f"vocab {len(tok)} -> {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
