"""Unit tests of specdiag.prompts on synthetic text and synthetic tokenizers (no server)."""

from __future__ import annotations

from pathlib import Path

import pytest

from specdiag import prompts
from specdiag.prompts import PREDICTABLE_SENTENCE, build_prompt, special_affixes, split_pieces, tokenize_long

BOS, EOS = 1, 2


def make_char_tokenizer(bos: bool = True, eos: bool = False, calls: list[str] | None = None):
    """One id per character (ord + 10), with optional BOS/EOS like many HF tokenizers add."""

    def tokenize(text: str) -> list[int]:
        if calls is not None:
            calls.append(text)
        return ([BOS] if bos else []) + [ord(c) + 10 for c in text] + ([EOS] if eos else [])

    return tokenize


def detok(ids: list[int]) -> str:
    return "".join(chr(i - 10) for i in ids if i >= 10)


def synthetic_prose(paragraphs: int = 400) -> str:
    # Distinct paragraphs, so that where a prompt starts is visible in its text.
    return "\n\n".join(f"Paragraph {i} tells of harbour {i * 7 % 13} and a lantern numbered {i}." for i in
                       range(paragraphs)) + "\n"


@pytest.mark.parametrize("n", [1, 2, 17, 500, 4096])
@pytest.mark.parametrize("kind", ["novel", "predictable"])
def test_exact_length_and_one_bos(n: int, kind: str) -> None:
    tok = make_char_tokenizer(bos=True, eos=True)
    p = build_prompt(tok, n, kind, seed=3, text=synthetic_prose())
    assert len(p.input_ids) == n == p.n_tokens
    assert p.input_ids[0] == BOS
    assert BOS not in p.input_ids[1:] and EOS not in p.input_ids  # specials once at the start, never an EOS
    assert p.kind == kind


def test_predictable_is_the_cat_sentence_repeated() -> None:
    p = build_prompt(make_char_tokenizer(), 300, "predictable")
    text = detok(p.input_ids)
    assert text == (PREDICTABLE_SENTENCE * 20)[:299]
    assert p.preview.startswith("The cat sat on the mat. The cat")


def test_novel_is_seeded_and_starts_at_a_paragraph() -> None:
    prose = synthetic_prose()
    tok = make_char_tokenizer()
    a = build_prompt(tok, 200, "novel", seed=7, text=prose)
    b = build_prompt(tok, 200, "novel", seed=7, text=prose)
    c = build_prompt(tok, 200, "novel", seed=8, text=prose)
    assert a.input_ids == b.input_ids and a.start_char == b.start_char
    assert a.input_ids != c.input_ids
    assert detok(a.input_ids).startswith("Paragraph ")
    assert prose[a.start_char:].startswith(detok(a.input_ids))


def test_novel_wraps_around_once_without_repeating() -> None:
    prose = synthetic_prose(50)
    tok = make_char_tokenizer(bos=False)
    # Nearly the whole file from a late start: the ring goes back to the start, nothing is repeated.
    p = build_prompt(tok, len(prose), "novel", seed=1, text=prose)
    text = detok(p.input_ids)
    for i in range(50):
        assert text.count(f"Paragraph {i} tells") == 1
    with pytest.raises(ValueError, match="yields only .* tokens .* shorter context"):
        build_prompt(tok, 2 * len(prose) + 10, "novel", seed=1, text=prose)


def test_instruction_comes_first_and_counts_toward_length() -> None:
    tok = make_char_tokenizer()
    p = build_prompt(tok, 120, "novel", seed=2, text=synthetic_prose(), instruction=prompts.CONTINUE_INSTRUCTION)
    assert len(p.input_ids) == 120
    assert detok(p.input_ids).startswith(prompts.CONTINUE_INSTRUCTION + "Paragraph ")


def test_pieces_tokenize_the_same_text_in_several_calls() -> None:
    prose = synthetic_prose()
    calls: list[str] = []
    tok = make_char_tokenizer(calls=calls)
    p = build_prompt(tok, 5000, "novel", seed=0, text=prose, piece_chars=1000)
    piece_calls = [c for c in calls if len(c) > 1]
    assert len(piece_calls) >= 5 and max(len(c) for c in piece_calls) <= 1000
    assert detok(p.input_ids) == prose[p.start_char:p.start_char + 4999]  # 4999 chars after the BOS
    assert "".join(split_pieces(prose, 333)) == prose
    assert all(len(x) <= 333 for x in split_pieces(prose, 333))


def test_special_affixes_detects_bos_and_eos() -> None:
    assert special_affixes(make_char_tokenizer(bos=True, eos=True)) == ([BOS], [EOS])
    assert special_affixes(make_char_tokenizer(bos=False, eos=False)) == ([], [])
    assert tokenize_long(make_char_tokenizer(bos=True, eos=True), "ab") == [ord("a") + 10, ord("b") + 10]


def test_special_affixes_when_the_server_rejects_empty_text() -> None:
    inner = make_char_tokenizer(bos=True, eos=True)

    def tokenize(text: str) -> list[int]:
        if not text:
            raise ValueError("HTTP 400: empty prompt")
        return inner(text)

    assert special_affixes(tokenize) == ([BOS], [EOS])
    p = build_prompt(tokenize, 50, "novel", seed=1, text=synthetic_prose())
    assert len(p.input_ids) == 50 and p.input_ids[0] == BOS and EOS not in p.input_ids


def test_bad_arguments_are_named() -> None:
    tok = make_char_tokenizer()
    with pytest.raises(ValueError, match="n_tokens"):
        build_prompt(tok, 0, "novel", text=synthetic_prose())
    with pytest.raises(ValueError, match="kind"):
        build_prompt(tok, 10, "poetry", text=synthetic_prose())  # type: ignore[arg-type]


def test_missing_prose_file_says_where_and_what_to_do(tmp_path: Path) -> None:
    missing = tmp_path / "nope.txt"
    with pytest.raises(prompts.PromptTextMissing, match="nope.txt.*predictable"):
        build_prompt(make_char_tokenizer(), 10, "novel", prose_path=missing)


def test_prose_file_is_read(tmp_path: Path) -> None:
    path = tmp_path / "prose.txt"
    path.write_text(synthetic_prose(), encoding="utf-8")
    p = build_prompt(make_char_tokenizer(), 64, "novel", seed=5, prose_path=path)
    assert len(p.input_ids) == 64 and p.source == str(path)


def test_exact_length_with_a_real_bpe_tokenizer() -> None:
    """A byte-level BPE (trained here on the synthetic prose) merges across words; lengths stay exact."""
    tokenizers = pytest.importorskip("tokenizers")
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tk = Tokenizer(models.BPE())
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    tk.train_from_iterator([synthetic_prose()], trainers.BpeTrainer(
        vocab_size=400, special_tokens=["<s>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    bos = tk.token_to_id("<s>")
    tk.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", bos)])

    def tokenize(text: str) -> list[int]:
        return tk.encode(text).ids

    for kind in ("novel", "predictable"):
        for n in (1, 33, 1000, 3000):
            p = build_prompt(tokenize, n, kind, seed=11, text=synthetic_prose(), piece_chars=2000)
            assert len(p.input_ids) == n and p.input_ids[0] == bos
            assert bos not in p.input_ids[1:]
    text = tk.decode(build_prompt(tokenize, 200, "predictable").input_ids)
    assert text.startswith("The cat sat on the mat. The cat sat on the mat.")
