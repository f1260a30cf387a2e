"""09's decode requests each get their own tail (specdiag.steps.engine_ab.measure): the same length and cached prefix
as the prefilled prompt, a different end per request, so no request re-decodes another's answer (SGLang's NGRAM keeps
one n-gram cache across requests)."""

from __future__ import annotations

from typing import Any

import pytest

from specdiag.runs import Run
from specdiag.steps.engine_ab import measure


class WordClient:
    """A tokenizer of one id per word (a BOS of 1 where special tokens are asked for)."""

    def tokenize(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return ([1] if add_special_tokens else []) + [2 + hash(w) % 4000 for w in text.split()]


def _capture(monkeypatch: pytest.MonkeyPatch) -> list[list[int]]:
    sent: list[list[int]] = []

    def fake(client: Any, ids: list[int], arm: str, ctx: int, labels: dict, m: int) -> dict:
        sent.append(list(ids))
        return {"arm": arm, "context_tokens": ctx, **labels, "step_ms": 1.0, "error": None}

    monkeypatch.setattr(measure, "_send_row", fake)
    return sent


def test_each_decode_request_of_novel_prose_has_its_own_tail(tmp_path, monkeypatch) -> None:
    sent = _capture(monkeypatch)
    run = Run.create(tmp_path / "r")
    prompt = list(range(10, 10 + 256))
    rows = measure.decode_all(run, WordClient(), "a", {256: prompt}, repeats=3, tail_tokens=32)
    assert [len(x) for x in sent] == [256, 256, 256]
    assert all(x[:224] == prompt[:224] for x in sent)                    # the cached prefix is shared
    tails = [tuple(x[224:]) for x in sent]
    assert len(set(tails)) == 3 and all(t != tuple(prompt[224:]) for t in tails)  # each its own end
    assert 1 not in {i for t in tails for i in t}                       # no special token inside the prompt
    assert [r["tail_seed"] for r in rows] == [measure.tail_seed(256, 0, r) for r in range(3)]
    # the same request again gets the same tail (seeded), and the rows are in the run as measured
    again = _capture(monkeypatch)
    measure.decode_all(run, WordClient(), "a", {256: prompt}, repeats=1, tail_tokens=32)
    assert again[0] == sent[0] and len(run.rows("engine_ab")) == 4


def test_predictable_text_and_no_tail_send_the_prompt_itself(tmp_path, monkeypatch) -> None:
    sent = _capture(monkeypatch)
    run = Run.create(tmp_path / "r")
    prompt = list(range(10, 10 + 128))
    measure.decode_all(run, WordClient(), "a", {128: prompt}, repeats=2, tail_tokens=32, kind="predictable")
    measure.decode_all(run, WordClient(), "a", {128: prompt}, repeats=2, tail_tokens=0)
    assert sent == [prompt] * 4
    # a tail as long as the prompt is an error row, not a crash
    rows = measure.decode_all(run, WordClient(), "a", {16: prompt[:16]}, repeats=1, tail_tokens=32)
    assert rows[0]["error"].startswith("tail: a decode tail of 32 tokens")


def test_repeated_prefills_each_read_a_fresh_prompt_before_the_decoded_one(tmp_path, monkeypatch) -> None:
    """prefill_repeats: the TTFT of a context over several prompts no cache holds (each its own seed, the cache emptied
    before each), the prompt the decode requests reuse prefilled last."""
    sent = _capture(monkeypatch)
    prompts: list[int] = []

    def exact(client, ctx, kind, seed):
        prompts.append(seed)
        return type("P", (), {"input_ids": [seed % 1000 + 5] * ctx})()

    monkeypatch.setattr("specdiag.steps.engine_ab.measure.exact_prompt", exact)  # where 09's measurement looks it up
    monkeypatch.setattr("specdiag.steps.engine_ab.measure.freshen", lambda client, p, reset, add_special_tokens: (p, True))
    run = Run.create(tmp_path / "r")
    measure.measure_arm(run, WordClient(), "a", [64], repeats=2, prefill_repeats=3)
    pre = [r for r in run.rows("engine_ab") if r["phase"] == "prefill"]
    dec = [r for r in run.rows("engine_ab") if r["phase"] == "decode"]
    assert [r["repeat"] for r in pre] == [1, 2, 0] and len({r["seed"] for r in pre}) == 3
    assert pre[-1]["seed"] == measure.prompt_seed(64, 0)  # the decoded prompt is the run's own
    assert len(dec) == 2 and sent[-1] == sent[2]  # decode reuses the last prefilled prompt
