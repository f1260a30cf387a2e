"""Prompts of an exact token length, predictable or novel, reproducible from a seed.

Two kinds (the investigation's steps 1 and 4: tests/data/investigation_tables.md):

- ``novel``: held-out prose from ``data/prompts/novel_prose.txt``. A seed picks the start (the
  beginning of a paragraph); the text is read as a ring from there (to the end, then from the file's
  start up to the seed's offset), so any seed yields the whole file once and nothing repeats. Hard for
  a drafter to guess: this is what the baseline sweep measures.
- ``predictable``: ``"The cat sat on the mat. "`` repeated. A healthy drafter commits nearly a whole
  draft block per step on it, at any context.

Text is tokenized by the server's own tokenizer (the ``tokenize`` callable, normally
``SGLangClient.tokenize``, i.e. POST /tokenize), in pieces of at most ``piece_chars`` characters cut at
paragraph breaks, and the ids are cut to exactly ``n_tokens``. Special tokens the tokenizer adds
(a BOS at the start, an EOS at the end) are detected once per call: the prompt keeps the leading ones
once, at its start, and never ends with a trailing one. Requests then send ``input_ids``, so the
length the server sees is exact. Nothing is cached between calls.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable, Literal

from specdiag.paths import DATA_DIR

PromptKind = Literal["novel", "predictable"]
Tokenize = Callable[[str], list[int]]

#: The held-out prose the novel prompts are drawn from (made by the training engineer's script).
NOVEL_PROSE_PATH: Path = DATA_DIR / "prompts" / "novel_prose.txt"
#: The predictable sentence of the investigation's commit probe (step 4), with its separating space.
PREDICTABLE_SENTENCE = "The cat sat on the mat. "
#: A "continue this discussion" style instruction, as the investigation's sweep used (step 1).
CONTINUE_INSTRUCTION = "Continue this discussion in the same style.\n\n"
#: Longest piece of text sent to /tokenize in one request, in characters.
DEFAULT_PIECE_CHARS = 200_000
#: Characters shown in ``Prompt.preview``.
PREVIEW_CHARS = 160


@dataclass(frozen=True)
class Prompt:
    """A prompt of exactly ``n_tokens`` token ids.

    input_ids:   the ids to send (``len(input_ids) == n_tokens``)
    n_tokens:    requested length, tokens
    kind:        ``novel`` or ``predictable``
    seed:        the seed that chose the start of the prose (unused for predictable)
    preview:     the first characters of the text the ids were made from
    start_char:  character offset in the prose where the prompt starts (0 for predictable)
    source:      the file the text came from, or ``builtin`` for the predictable sentence
    instruction: the instruction text put before the prose ('' if none)
    """

    input_ids: list[int]
    n_tokens: int
    kind: str
    seed: int
    preview: str
    start_char: int = 0
    source: str = "builtin"
    instruction: str = ""


class PromptTextMissing(FileNotFoundError):
    """The novel prose file is not there."""


def _common_prefix_len(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def special_affixes(tokenize: Tokenize) -> tuple[list[int], list[int]]:
    """The special ids the tokenizer adds before and after any text: ``(prefix, suffix)``.

    Found by tokenizing '' and 'x': what '' yields is split into the part that also starts 'x''s ids
    (a BOS) and the part that also ends them (an EOS). A server that refuses to tokenize '' is probed
    with 'x' and 'y' instead: what both start with and both end with.
    """
    try:
        empty = list(tokenize(""))
    except Exception:  # noqa: BLE001 - some servers reject an empty prompt; probe with two letters
        x, y = list(tokenize("x")), list(tokenize("y"))
        k = _common_prefix_len(x, y)
        j = _common_prefix_len(x[k:][::-1], y[k:][::-1])
        return x[:k], (x[len(x) - j:] if j else [])
    if not empty:
        return [], []
    probe = list(tokenize("x"))
    k = _common_prefix_len(empty, probe)
    prefix, rest = empty[:k], empty[k:]
    if rest and probe[-len(rest):] != rest:
        raise ValueError(f"tokenize('') returned {empty!r}, which is neither a prefix nor a suffix of "
                         f"tokenize('x') = {probe!r}; cannot tell which special tokens the tokenizer adds")
    return prefix, rest


def _strip(ids: list[int], prefix: list[int], suffix: list[int]) -> list[int]:
    if prefix and ids[:len(prefix)] == prefix:
        ids = ids[len(prefix):]
    if suffix and len(ids) >= len(suffix) and ids[-len(suffix):] == suffix:
        ids = ids[:-len(suffix)]
    return ids


def _piece_end(text: str, i: int, piece_chars: int) -> int:
    """End of the piece of ``text`` that starts at ``i``: at most ``piece_chars`` characters, cut after a
    paragraph break (else a line break, else a space) found in the second half of the piece."""
    end = min(i + piece_chars, len(text))
    if end < len(text):
        for sep in ("\n\n", "\n", " "):
            cut = text.rfind(sep, i + piece_chars // 2, end)
            if cut > i:
                return cut + len(sep)
    return end


def split_pieces(text: str, piece_chars: int = DEFAULT_PIECE_CHARS) -> list[str]:
    """``text`` in consecutive pieces of at most ``piece_chars`` characters (see :func:`_piece_end`)."""
    if piece_chars < 1:
        raise ValueError(f"piece_chars must be at least 1; got {piece_chars}")
    pieces: list[str] = []
    i = 0
    while i < len(text):
        end = _piece_end(text, i, piece_chars)
        pieces.append(text[i:end])
        i = end
    return pieces


def tokenize_long(tokenize: Tokenize, text: str, piece_chars: int = DEFAULT_PIECE_CHARS) -> list[int]:
    """Token ids of ``text`` without the tokenizer's special tokens, tokenized piece by piece."""
    prefix, suffix = special_affixes(tokenize)
    out: list[int] = []
    for piece in split_pieces(text, piece_chars):
        out.extend(_strip(list(tokenize(piece)), prefix, suffix))
    return out


def read_novel_prose(path: Path | str | None = None) -> str:
    """The novel prose text, or a clear error saying where it should be and who makes it."""
    path = Path(path) if path else NOVEL_PROSE_PATH
    if not path.exists():
        raise PromptTextMissing(
            f"novel prose file {path} is missing. It is made with the embedded models (data/models/, see "
            f"their README) and committed; restore it with git, or pass prose_path=<a UTF-8 prose file>, "
            f"or use prompt_kind='predictable'.")
    text = path.read_text(encoding="utf-8")
    if len(text.strip()) < 1000:
        raise ValueError(f"novel prose file {path} holds only {len(text.strip())} characters; "
                         f"it needs enough prose for the longest prompt (hundreds of thousands of characters)")
    return text


def seeded_start(text: str, seed: int) -> int:
    """A character offset picked by ``seed``: the start of a paragraph (else of a line) of ``text``."""
    starts = [0] + [m.end() for m in re.finditer(r"\n\s*\n(?=\S)", text)]
    if len(starts) < 8:
        starts = [0] + [m.end() for m in re.finditer(r"\n(?=\S)", text)]
    return random.Random(seed).choice(starts)


def _fill_to(tokenize: Tokenize, text: str, n_tokens: int, lead: list[int], piece_chars: int,
             what: str) -> list[int]:
    """``lead`` + ids of ``text`` cut to ``n_tokens`` in all; tokenizes only as much text as needed."""
    prefix, suffix = special_affixes(tokenize)
    ids = list(prefix) + list(lead)
    i = 0
    while len(ids) < n_tokens and i < len(text):
        end = _piece_end(text, i, piece_chars)
        ids.extend(_strip(list(tokenize(text[i:end])), prefix, suffix))
        i = end
    if len(ids) < n_tokens:
        raise ValueError(f"{what} yields only {len(ids)} tokens with this tokenizer but {n_tokens} were asked "
                         f"for: use a longer text (prose_path) or a shorter context")
    return ids[:n_tokens]


def build_prompt(tokenize: Tokenize, n_tokens: int, kind: PromptKind = "novel", seed: int = 0,
                 instruction: str = "", prose_path: Path | str | None = None, text: str | None = None,
                 piece_chars: int = DEFAULT_PIECE_CHARS) -> Prompt:
    """A prompt of exactly ``n_tokens`` ids of the server's tokenizer.

    tokenize:    text -> ids (the server's /tokenize; special tokens it adds are handled)
    n_tokens:    prompt length, tokens (at least 1)
    kind:        ``novel`` (seeded held-out prose) or ``predictable`` (the cat sentence repeated)
    seed:        picks the paragraph the novel prose starts at
    instruction: text put before the prose, e.g. :data:`CONTINUE_INSTRUCTION` ('' = none)
    prose_path:  another prose file for ``novel`` (default data/prompts/novel_prose.txt)
    text:        the prose itself, instead of reading a file (tests, notebooks with their own text)
    piece_chars: longest text sent to ``tokenize`` at once, characters
    """
    if isinstance(n_tokens, bool) or not isinstance(n_tokens, int) or n_tokens < 1:
        raise ValueError(f"n_tokens must be a positive whole number of tokens; got {n_tokens!r}")
    if kind not in ("novel", "predictable"):
        raise ValueError(f"kind must be 'novel' or 'predictable'; got {kind!r}")
    lead = tokenize_long(tokenize, instruction, piece_chars) if instruction else []
    if kind == "predictable":
        per_sentence = max(1, len(tokenize_long(tokenize, PREDICTABLE_SENTENCE * 16)) // 16)
        body = PREDICTABLE_SENTENCE * (n_tokens // per_sentence + 4)
        ids = _fill_to(tokenize, body, n_tokens, lead, max(piece_chars, len(body)), "the predictable text")
        return Prompt(ids, n_tokens, kind, seed, (instruction + body)[:PREVIEW_CHARS], 0, "builtin", instruction)
    source = str(prose_path or NOVEL_PROSE_PATH) if text is None else "text"
    prose = read_novel_prose(prose_path) if text is None else text
    start = seeded_start(prose, seed)
    ring = prose[start:] + ("\n\n" + prose[:start] if start else "")
    ids = _fill_to(tokenize, ring, n_tokens, lead, piece_chars, f"the novel prose ({source})")
    return Prompt(ids, n_tokens, kind, seed, (instruction + ring)[:PREVIEW_CHARS], start, source, instruction)


def unique_head(tokenize: Tokenize, prompt: Prompt, tag: str) -> Prompt:
    """``prompt`` with its first tokens replaced by the ids of ``tag`` (e.g. ``"[req 3f2a] "``), same length.

    For a server whose prefix cache cannot be reset (vLLM without dev mode): a prompt whose first
    tokens no earlier prompt had shares no cached block with them (a prefix cache matches from the
    first token on), so every prompt token is computed. The tail, which the model continues, is kept, and
    so are the leading special tokens ``tokenize`` adds (a BOS), when the prompt starts with them.
    """
    tag_ids = tokenize_long(tokenize, tag)
    if not tag_ids:
        raise ValueError(f"the tag {tag!r} tokenizes to nothing")
    # A prompt built with the tokenizer's special tokens keeps its leading ones (a BOS): the tag follows them.
    prefix, _ = special_affixes(tokenize)
    keep = len(prefix) if prefix and list(prompt.input_ids[:len(prefix)]) == prefix else 0
    n = min(len(tag_ids), len(prompt.input_ids) - keep)
    ids = list(prompt.input_ids[:keep]) + tag_ids[:n] + list(prompt.input_ids[keep + n:])
    return replace(prompt, input_ids=ids, preview=(tag + prompt.preview)[:PREVIEW_CHARS])
