"""The speculative engine on tiny random-weight models: lossless, caches reused and rolled back
correctly (sliding windows included), step accounting consistent with SGLang's meta_info."""

from __future__ import annotations

import random
from typing import Any, Iterator

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from specdiag.localserver.engine import Chunk, DecodeRequest, SpecEngine, SpecSettings  # noqa: E402
from specdiag.localserver.models import LoadedModel, load_model  # noqa: E402
from specdiag.localserver.protocol import spec_meta  # noqa: E402
from specdiag.localserver.tiny import TINY_SLIDING_WINDOW, TINY_VOCAB_SIZE, cached_tiny_models  # noqa: E402

CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def models() -> Iterator[dict[str, LoadedModel]]:
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny models: one thread is ~10x faster than two on a busy 2-core box
    paths = cached_tiny_models()
    yield {
        name: load_model(getattr(paths, name), name, CPU, torch.float32, "made by cached_tiny_models")
        for name in ("target", "drafter", "clone_target", "clone_drafter")
    }
    torch.set_num_threads(threads)


def prompts(n_each: int = 12, seed: int = 0) -> list[list[int]]:
    """``n_each`` predictable prompts (a random phrase repeated) and ``n_each`` novel ones (random tokens)."""
    rng = random.Random(seed)
    out = []
    for i in range(n_each):
        phrase = [rng.randrange(1, TINY_VOCAB_SIZE) for _ in range(rng.randrange(3, 9))]
        out.append((phrase * 12)[: 16 + 3 * i])
    for i in range(n_each):
        out.append([rng.randrange(1, TINY_VOCAB_SIZE) for _ in range(8 + 3 * i)])
    return out


def run(engine: SpecEngine, ids: list[int], max_new: int = 20, **kw: Any) -> tuple[list[int], list[Chunk]]:
    chunks = list(engine.generate(DecodeRequest(input_ids=ids, max_new_tokens=max_new, **kw)))
    return [t for c in chunks for t in c.new_ids], chunks


def reference_greedy(lm: LoadedModel, ids: list[int], max_new: int) -> list[int]:
    """Target-only greedy without any cache: the whole sequence recomputed for every token."""
    seq = list(ids)
    with torch.inference_mode():
        for _ in range(max_new):
            logits = lm.model(input_ids=torch.tensor([seq]), use_cache=False).logits[0, -1]
            seq.append(int(torch.argmax(logits)))
    return seq[len(ids):]


PAIRS = [("target", "drafter"), ("clone_target", "clone_drafter")]


@pytest.mark.parametrize("target,drafter", PAIRS)
@pytest.mark.parametrize("algorithm", ["NGRAM", "STANDALONE"])
def test_speculative_output_equals_target_only_greedy(models, target, drafter, algorithm):
    base = SpecEngine(models[target], None, SpecSettings(algorithm="NONE"))
    engines = {
        n: SpecEngine(models[target], models[drafter], SpecSettings(algorithm=algorithm, num_draft_tokens=n))
        for n in (2, 4, 8)
    }
    accepted = 0
    # The independent drafter's drafts are nearly all rejected: every step commits one token, so each prompt costs
    # 20 steps x 3 engines of drafting and verifying. Half the prompts (12: 6 predictable, 6 novel) still make
    # hundreds of rejections; the other pairs keep all 24.
    n_each = 6 if (algorithm, drafter) == ("STANDALONE", "drafter") else 12
    for ids in prompts(n_each):
        expected, _ = run(base, ids)
        assert len(expected) == 20
        for n, engine in engines.items():
            got, chunks = run(engine, ids)
            assert got == expected, f"{algorithm} n={n} diverged from target-only greedy on prompt {ids}"
            accepted += sum(c.step.correct_drafts for c in chunks if c.step)
    if algorithm == "NGRAM" or target == "clone_target":
        assert accepted > 0, "no draft was ever accepted: the test would not exercise acceptance"


def test_plain_decoding_matches_recomputation(models):
    for name in ("target", "clone_drafter"):  # clone_drafter has sliding-window layers
        engine = SpecEngine(models[name], None, SpecSettings(algorithm="NONE"))
        ids = prompts(3)[-1]
        assert len(ids) + 24 > TINY_SLIDING_WINDOW
        assert run(engine, ids, 24)[0] == reference_greedy(models[name], ids, 24)


@pytest.mark.parametrize("n", [3, 8])
def test_sliding_window_target_rolls_back_rejected_drafts(models, n):
    """A sliding-window target with a drafter that is mostly wrong: every rejection crops the
    target's sliding layers; the output must still be the no-cache greedy beyond the window."""
    target = models["clone_drafter"]
    engine = SpecEngine(target, models["drafter"], SpecSettings(algorithm="STANDALONE", num_draft_tokens=n))
    ngram = SpecEngine(target, None, SpecSettings(algorithm="NGRAM", num_draft_tokens=n))
    for ids in prompts(4)[::2]:
        expected = reference_greedy(target, ids, 40)
        assert run(engine, ids, 40)[0] == expected
        assert run(ngram, ids, 40)[0] == expected


def test_drafter_cache_gives_the_drafts_a_recomputation_gives(models, monkeypatch):
    """The drafter keeps its KV cache (sliding layers included) across steps and rollbacks: its
    drafts equal greedy drafts recomputed from scratch on the whole sequence."""
    drafter = models["clone_drafter"]
    engine = SpecEngine(models["clone_target"], drafter, SpecSettings(algorithm="STANDALONE", num_draft_tokens=5))
    original = engine._draft
    checked = []

    def checked_draft(state, d_cache):
        drafts, processed = original(state, d_cache)
        checked.append((list(state.ids), drafts))
        return drafts, processed

    monkeypatch.setattr(engine, "_draft", checked_draft)
    for ids in prompts(3)[::2]:
        _, chunks = run(engine, ids, 40)
        assert any(c.step and 0 < c.step.correct_drafts < 4 for c in chunks), "need partial acceptances"
    assert len(checked) > 20
    for seq, drafts in checked:
        assert reference_greedy(drafter, seq, len(drafts)) == drafts


def test_drafter_processes_a_bounded_number_of_tokens_per_step(models):
    n = 6
    engine = SpecEngine(models["clone_target"], models["clone_drafter"],
                        SpecSettings(algorithm="STANDALONE", num_draft_tokens=n))
    for length in (20, 400):
        ids = prompts(1)[1][:8] * (length // 8)
        _, chunks = run(engine, ids, 30)
        per_step = [c.step.drafter_tokens for c in chunks if c.step]
        assert per_step and set(per_step) <= {n - 1, n}, per_step  # 1 or 2 new tokens + n-2 own drafts


def test_identical_drafter_commits_the_full_width_every_step(models):
    n = 5
    engine = SpecEngine(models["clone_target"], models["clone_target"],
                        SpecSettings(algorithm="STANDALONE", num_draft_tokens=n))
    for ids in prompts(2):
        _, chunks = run(engine, ids, 1 + 4 * n)
        commits = [c.step.committed for c in chunks if c.step]
        assert commits == [n] * 4


@pytest.mark.parametrize("algorithm", ["NGRAM", "STANDALONE"])
def test_step_accounting_matches_sglang_meta(models, algorithm):
    n = 4
    engine = SpecEngine(models["clone_target"], models["clone_drafter"],
                        SpecSettings(algorithm=algorithm, num_draft_tokens=n))
    for ids in prompts(3):
        out, chunks = run(engine, ids, 23)
        steps = [c.step for c in chunks if c.step]
        assert chunks[0].step is None and chunks[0].prefill_ms is not None and len(chunks[0].new_ids) == 1
        assert sum(s.committed for s in steps) == len(out) - 1
        assert all(s.committed == len(c.new_ids) for s, c in zip(steps, chunks[1:]))
        assert all(0 <= s.correct_drafts == s.committed - 1 <= n - 1 for s in steps)
        assert all(s.draft_ms >= 0 and s.verify_ms > 0 for s in steps)
        meta = spec_meta(len(out), n, [s.committed for s in steps], [s.correct_drafts for s in steps],
                         [s.draft_ms for s in steps], [s.verify_ms for s in steps])
        hist = meta["spec_correct_drafts_histogram"]
        assert meta["spec_verify_ct"] == len(steps) == sum(hist)
        assert len(hist) == n
        assert sum(i * h for i, h in enumerate(hist)) == meta["spec_num_correct_drafts"]
        assert meta["spec_num_proposed_drafts"] == len(steps) * (n - 1)
        assert meta["spec_accept_length"] == pytest.approx(len(out) / len(steps))
        assert meta["spec_accept_rate"] == pytest.approx(meta["spec_num_correct_drafts"] / meta["spec_num_proposed_drafts"])
        assert 1 + sum(i * h for i, h in enumerate(hist)) / sum(hist) == pytest.approx((len(out) - 1) / len(steps))


def test_stop_tokens_and_min_new_tokens_stay_lossless(models):
    base = SpecEngine(models["clone_target"], None, SpecSettings(algorithm="NONE"))
    spec = SpecEngine(models["clone_target"], models["clone_drafter"],
                      SpecSettings(algorithm="STANDALONE", num_draft_tokens=4))
    ids = prompts(2)[0]
    free, _ = run(base, ids, 20)
    stop = free[5]
    first = free.index(stop)
    out, chunks = run(spec, ids, 20, stop_token_ids=frozenset({stop}))
    assert out == free[: first + 1] and chunks[-1].finish == {"type": "stop", "matched": stop}
    # stop tokens are masked until min_new_tokens: both engines agree on the result
    kw = dict(stop_token_ids=frozenset({stop}), min_new_tokens=first + 2)
    expected, _ = run(base, ids, 20, **kw)
    assert stop not in expected[: first + 2]
    assert run(spec, ids, 20, **kw)[0] == expected


def test_max_new_tokens_zero_and_one(models):
    engine = SpecEngine(models["target"], None, SpecSettings(algorithm="NGRAM", num_draft_tokens=4))
    out, chunks = run(engine, [5, 6, 7], 0)
    assert out == [] and chunks[-1].finish == {"type": "length", "length": 0}
    out, chunks = run(engine, [5, 6, 7], 1)
    assert len(out) == 1 and len(chunks) == 1 and chunks[0].finish == {"type": "length", "length": 1}


def test_abort_stops_between_steps(models):
    engine = SpecEngine(models["target"], None, SpecSettings(algorithm="NONE"))
    chunks = list(engine.generate(DecodeRequest(input_ids=[5, 6, 7], max_new_tokens=50), should_abort=lambda: True))
    assert chunks[-1].finish is not None and chunks[-1].finish["type"] == "abort"
    assert sum(len(c.new_ids) for c in chunks) == 1


def test_chunked_prefill_gives_the_same_output(models):
    ids = prompts(4)[-1]
    whole = SpecEngine(models["clone_drafter"], None, SpecSettings(algorithm="NONE", chunked_prefill_size=4096))
    chunked = SpecEngine(models["clone_drafter"], None, SpecSettings(algorithm="NONE", chunked_prefill_size=7))
    assert run(chunked, ids, 16)[0] == run(whole, ids, 16)[0]


def test_settings_are_checked():
    with pytest.raises(ValueError, match="unknown speculative algorithm"):
        SpecSettings(algorithm="EAGLE")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="at least 2"):
        SpecSettings(algorithm="NGRAM", num_draft_tokens=1)


@pytest.mark.gpu
@pytest.mark.parametrize("algorithm", ["NGRAM", "STANDALONE"])
def test_lossless_on_cuda_float32(algorithm):
    cuda = torch.device("cuda")
    paths = cached_tiny_models()
    target = load_model(paths.clone_target, "target", cuda, torch.float32, "tiny")
    drafter = load_model(paths.clone_drafter, "drafter", cuda, torch.float32, "tiny")
    base = SpecEngine(target, None, SpecSettings(algorithm="NONE"))
    spec = SpecEngine(target, drafter, SpecSettings(algorithm=algorithm, num_draft_tokens=6))
    for ids in prompts(6):
        expected, _ = run(base, ids, 30)
        got, chunks = run(spec, ids, 30)
        assert got == expected
        assert all(c.step.verify_ms > 0 for c in chunks if c.step)
