"""Build the embedded models' training text and the held-out novel prose, reproducibly.

Sources (all licence-clean, available offline):
- Python's standard library docstrings (modules, classes, functions), read with ``ast`` from the
  running interpreter's ``Lib/`` folder (tests excluded). Licence: PSF License Agreement (Python 3.11).
- Python's bundled documentation topics, ``pydoc_data.topics`` (the text ``help()`` shows).
  Licence: PSF License Agreement.
- The SQLite documentation as shipped by Debian's ``sqlite3-doc`` package (HTML, text of
  paragraphs and list items extracted). Licence: public domain (debian/copyright: "License:
  public-domain", D. Richard Hipp).

Split: whole documents (a stdlib module file, an SQLite page) are assigned to the held-out set by a
seeded hash of their name, so no page or module contributes to both sets; then every held-out
paragraph that also occurs in the training text is dropped. The held-out set keeps only plain prose
paragraphs (no code, no doctest, mostly letters). ``pydoc_data`` topics all go to training.

Usage (Debian's package unpacked with ``apt-get download sqlite3-doc && dpkg-deb -x *.deb DIR``)::

    python data/corpus/build_corpus.py --sqlite-doc-dir DIR/usr/share/doc/sqlite3
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import html.parser
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SKIP_PARTS = ("test", "tests", "idle_test", "site-packages", "dist-packages", "__phello__")
SKIP_HTML_NAMES = ("requirements.html",)  # requirement lists repeat sentences of other pages


def held_out(name: str, seed: int, percent: int) -> bool:
    """True when document `name` goes to the held-out set (seeded, stable across machines)."""
    digest = hashlib.sha256(f"{seed}:{name}".encode()).digest()
    return int.from_bytes(digest[:4], "big") % 100 < percent


def is_plain_prose(paragraph: str) -> bool:
    """A paragraph of ordinary sentences: no code lines, at least 12 words, >= 90% letters/spaces."""
    lines = paragraph.splitlines()
    if any(line.startswith((" ", "\t", ">>>", "...")) for line in lines):
        return False
    if len(paragraph.split()) < 12 or "(source:" in paragraph:
        return False
    alpha = sum(c.isalpha() or c.isspace() for c in paragraph) / len(paragraph)
    return alpha >= 0.9


def stdlib_documents(lib_dir: Path) -> list[tuple[str, str]]:
    """(name, text) per stdlib module file: its docstrings joined by blank lines."""
    docs = []
    for path in sorted(lib_dir.rglob("*.py")):
        rel = path.relative_to(lib_dir)
        if any(part in SKIP_PARTS for part in rel.parts):
            continue
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError):
            continue
        texts = []
        for node in ast.walk(tree):
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                doc = ast.get_docstring(node)
                if doc and len(doc.split()) >= 4:
                    texts.append(doc.strip())
        if texts:
            docs.append((f"python:{rel.as_posix()}", "\n\n".join(texts)))
    return docs


class _Paragraphs(html.parser.HTMLParser):
    """Text of <p>, <li>, <dd>, <blockquote> elements (whitespace collapsed), <pre> blocks kept."""

    BLOCKS = ("p", "li", "dd", "blockquote", "pre", "h1", "h2", "h3")

    def __init__(self) -> None:
        super().__init__()
        self.paragraphs: list[str] = []
        self._buf: list[str] | None = None
        self._skip = 0
        self._pre = False

    def handle_starttag(self, tag: str, attrs: list) -> None:
        if tag in ("script", "style"):
            self._skip += 1
        if tag in self.BLOCKS:
            self._flush()
            self._buf = []
            self._pre = tag == "pre"

    def handle_endtag(self, tag: str) -> None:
        if tag in ("script", "style") and self._skip:
            self._skip -= 1
        if tag in self.BLOCKS:
            self._flush()

    def handle_data(self, data: str) -> None:
        if self._buf is not None and not self._skip:
            self._buf.append(data)

    def _flush(self) -> None:
        if self._buf:
            raw = "".join(self._buf)
            text = raw.strip("\n") if self._pre else " ".join(raw.split())
            if text.strip():
                self.paragraphs.append(text)
        self._buf = None
        self._pre = False


def sqlite_documents(doc_dir: Path) -> list[tuple[str, str]]:
    docs = []
    for path in sorted(doc_dir.rglob("*.html")):
        rel = path.relative_to(doc_dir).as_posix()
        if any(word in rel for word in SKIP_HTML_NAMES):
            continue
        parser = _Paragraphs()
        parser.feed(path.read_text(encoding="utf-8", errors="replace"))
        parser._flush()
        paras = [p for p in parser.paragraphs if len(p.split()) >= 3 and "(source:" not in p]
        if paras:
            docs.append((f"sqlite:{rel}", "\n\n".join(paras)))
    return docs


def pydoc_topics() -> list[tuple[str, str]]:
    import pydoc_data.topics as topics

    return [(f"pydoc:{k}", v.strip()) for k, v in sorted(topics.topics.items())]


def split_paragraphs(text: str) -> list[str]:
    return [p.strip("\n") for p in re.split(r"\n\s*\n", text) if p.strip()]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sqlite-doc-dir", type=Path, required=True, help="unpacked sqlite3-doc: DIR/usr/share/doc/sqlite3")
    ap.add_argument("--python-lib-dir", type=Path, default=Path(ast.__file__).parent, help="the stdlib folder")
    ap.add_argument("--seed", type=int, default=0, help="seed of the held-out split")
    ap.add_argument("--held-out-percent", type=int, default=30, help="share of documents held out, percent")
    ap.add_argument("--train-out", type=Path, default=REPO / "data/corpus/train.txt")
    ap.add_argument("--novel-out", type=Path, default=REPO / "data/prompts/novel_prose.txt")
    args = ap.parse_args(argv)
    if not args.sqlite_doc_dir.is_dir():
        ap.error(f"--sqlite-doc-dir {args.sqlite_doc_dir} is not a folder: unpack Debian's sqlite3-doc first")
    if sys.version_info[:2] != (3, 11):
        print(f"warning: Python {sys.version.split()[0]}, the committed text was built with 3.11.7", file=sys.stderr)

    train_docs: list[str] = [text for _, text in pydoc_topics()]
    held_docs: list[str] = []
    for name, text in stdlib_documents(args.python_lib_dir) + sqlite_documents(args.sqlite_doc_dir):
        (held_docs if held_out(name, args.seed, args.held_out_percent) else train_docs).append(text)

    seen: set[str] = set()
    train_paras: list[str] = []
    for doc in train_docs:
        for para in split_paragraphs(doc):
            key = " ".join(para.split())
            if key not in seen:
                seen.add(key)
                train_paras.append(para)
    novel_paras: list[str] = []
    for doc in held_docs:
        for para in split_paragraphs(doc):
            key = " ".join(para.split())
            if key not in seen and is_plain_prose(para):
                seen.add(key)
                novel_paras.append(key)

    args.train_out.parent.mkdir(parents=True, exist_ok=True)
    args.novel_out.parent.mkdir(parents=True, exist_ok=True)
    args.train_out.write_text("\n\n".join(train_paras) + "\n", encoding="utf-8")
    args.novel_out.write_text("\n\n".join(novel_paras) + "\n", encoding="utf-8")
    print(f"train: {len(train_paras)} paragraphs, {args.train_out.stat().st_size} bytes -> {args.train_out}")
    print(f"novel: {len(novel_paras)} paragraphs, {args.novel_out.stat().st_size} bytes -> {args.novel_out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
