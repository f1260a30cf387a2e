"""The repository stands alone: no pointer to the ``shared`` folder beside the checkout, which a user's clone does
not have, and no session, run or issue numbers (say the fact and where it was measured: a reference run, a date, a
commit). Commit messages keep the history; a reference run's README and run.json keep their provenance as recorded."""

from __future__ import annotations

import re
import subprocess
from fnmatch import fnmatch

import pytest

from specdiag.paths import PROJECT_ROOT

#: The folder beside the checkout, by a relative or absolute path, ``shared/`` followed by one of its parts, or one of
#: its documents by name (``reference/kernels.md``).
OUTSIDE = re.compile(r"\.\./shared\b|/work/shared\b|\bshared/(?:reference|engines|hooks|DESIGN|STYLE)\b"
                     r"|\b(?:investigation|kernels|sglang-protocol|vllm-protocol|embedded-models|DESIGN)\.md\b")
#: "session 15", "issue 31", "run 41" (not "run 7-10x", "run 2to3": prose that runs).
DIARY = re.compile(r"\b(?:session|issue|run) [0-9]+\b(?![-x0-9a-z])", re.IGNORECASE)

#: Paths exempt from both checks, with why.
EXEMPT = {
    "data/reference/*/README.md": "a recorded run's provenance: the calls and issues it was made under",
    "data/reference/*/run.json": "recorded data, as the run wrote it",
    "data/reference/*/*.jsonl": "recorded rows",
    "data/reference/*/device/*": "a recorded run's job logs",
    "data/corpus/*": "training text of the embedded model",
    "data/prompts/*": "prompt prose",
    "tests/test_repository.py": "this test names what it looks for",
}
#: Files still to be rewritten on branches that are editing them now, with what each still says. Remove an entry
#: when its file is clean (the last test fails while a listed file no longer needs its entry).
PENDING: dict[str, str] = {}  # files still carrying such a mention, each with why (empty: none)


def _tracked() -> list[str]:
    try:
        out = subprocess.run(["git", "ls-files", "-z"], cwd=PROJECT_ROOT, capture_output=True, check=True)
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout")
    return [p for p in out.stdout.decode().split("\0") if p]


def _exempt(path: str) -> bool:
    return any(fnmatch(path, pattern) for pattern in EXEMPT)


def _hits(path: str) -> list[str]:
    try:
        text = (PROJECT_ROOT / path).read_text(encoding="utf-8")
    except (UnicodeDecodeError, FileNotFoundError, IsADirectoryError):
        return []
    return [f"{path}:{n}: {m.group(0)!r}" for n, line in enumerate(text.splitlines(), 1)
            for pattern in (OUTSIDE, DIARY) for m in pattern.finditer(line)]


@pytest.fixture(scope="module")
def hits() -> dict[str, list[str]]:
    return {p: h for p in _tracked() if not _exempt(p) for h in [_hits(p)] if h}


def test_the_patterns_find_what_they_are_for() -> None:
    found = [line for line in ("see .." + "/shared/x.md", "(shared/engines/README.md)", "Session 10: it broke", "issue 29",
                               "run 32's kernel", "(kernels.md §7)") if OUTSIDE.search(line) or DIARY.search(line)]
    assert len(found) == 6
    assert not [line for line in ("the steps run 7-10x above", "commands that run 2to3", "shared/attention/head",
                                  "a run folder", "shared memory") if OUTSIDE.search(line) or DIARY.search(line)]


def test_no_pointer_outside_and_no_diary_numbers(hits: dict[str, list[str]]) -> None:
    left = [h for path, found in hits.items() if path not in PENDING for h in found]
    assert left == [], "say the fact and where it was measured instead:\n" + "\n".join(left)


def test_pending_files_still_need_their_entry(hits: dict[str, list[str]]) -> None:
    assert sorted(set(PENDING) - set(hits)) == [], "clean now: remove from PENDING"
