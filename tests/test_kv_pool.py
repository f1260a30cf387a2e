"""The KV-layout math (specdiag.kvlayout) and the embedded engine's slot pool (localserver.kvpool): SGLang 0.5.17's
page_size-1 allocation (head of the free list out, freed slots to its tail, clear on flush), attention gathering
through the slot indices, greedy output identical to the plain cache, and the layout a request reports."""

from __future__ import annotations

import random

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from specdiag.kvlayout import LONG_RUN, combine, from_dict, layout_stats, run_lengths  # noqa: E402
from specdiag.localserver.engine import DecodeRequest, SpecEngine, SpecSettings  # noqa: E402
from specdiag.localserver.kvpool import KVPool, PoolExhausted, SlotAllocator  # noqa: E402
from specdiag.localserver.models import load_model  # noqa: E402
from specdiag.localserver.tiny import TINY_VOCAB_SIZE, cached_tiny_models  # noqa: E402

CPU = torch.device("cpu")


@pytest.fixture(autouse=True)
def one_torch_thread():
    """Tiny models run faster on one thread; the old setting comes back after each test, so later modules (e.g.
    test_models' 1,024-token forwards, twice as fast on two threads) do not inherit it."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_runs_of_consecutive_slots():
    assert run_lengths([]).tolist() == []
    assert run_lengths([5]).tolist() == [1]
    assert run_lengths([1, 2, 3, 7, 8, 3, 4, 5, 6, 100]).tolist() == [3, 2, 4, 1]
    assert run_lengths([3, 2, 1]).tolist() == [1, 1, 1]  # descending is not a run: each is a new gather


def test_layout_stats_of_contiguous_and_scattered():
    one = layout_stats(np.arange(10, 10 + 1000))
    assert (one.tokens, one.runs, one.tokens_in_long_runs, one.longest_run) == (1000, 1, 1000, 1000)
    assert one.share_in_long_runs == 1.0 and one.runs_per_1k_tokens == 1.0
    pieces = np.concatenate([np.arange(0, 100), np.arange(200, 263), np.arange(300, 364), np.arange(500, 507)])
    s = layout_stats(pieces)
    assert s.runs == 4 and s.tokens == 234
    assert s.tokens_in_long_runs == 100 + 64  # 63 is one short of a long run, 64 counts
    assert s.longest_run == 100 and s.long_run == LONG_RUN
    assert s.runs_per_1k_tokens == pytest.approx(4000 / 234)
    back = from_dict(s.as_dict())
    assert back == s
    both = combine([one, s])
    assert (both.tokens, both.runs, both.tokens_in_long_runs, both.longest_run) == (1234, 5, 1164, 1000)
    assert combine([]) is None
    shuffled = layout_stats(np.random.default_rng(0).permutation(5000))
    assert shuffled.share_in_long_runs == 0.0 and shuffled.runs > 4900


def test_allocator_is_sglangs_page_size_1_free_list():
    """Head out, freed slots to the tail in free order, merged when the head runs short; clear = 1..size."""
    a = SlotAllocator(10)
    assert a.alloc(3).tolist() == [1, 2, 3]
    assert a.alloc(2).tolist() == [4, 5]
    a.free(np.array([2, 1]))
    a.free(np.array([5]))
    assert a.available() == 8
    assert a.alloc(5).tolist() == [6, 7, 8, 9, 10]  # the untouched range first
    assert a.alloc(2).tolist() == [2, 1]  # then what was freed, in the order it was freed
    assert a.alloc(1).tolist() == [5]
    with pytest.raises(PoolExhausted, match="0 free slots of 10"):
        a.alloc(1)
    assert a.allocated_since_clear == 13 and a.cycles == pytest.approx(1.3)
    a.clear()
    assert a.alloc(4).tolist() == [1, 2, 3, 4] and a.allocated_since_clear == 4 and a.clears == 1


def test_allocator_matches_sglangs_tensor_form():
    """The same random alloc/free sequence through a transcription of TokenToKVPoolAllocator (need_sort False)."""
    class Sglang:  # sglang/srt/mem_cache/allocator/token.py, 0.5.17
        def __init__(self, size):
            self.free_pages = torch.arange(1, size + 1, dtype=torch.int64)

        def alloc(self, n):
            if n > len(self.free_pages):
                return None
            out, self.free_pages = self.free_pages[:n], self.free_pages[n:]
            return out

        def free(self, idx):
            self.free_pages = torch.cat((self.free_pages, idx))

    rng = random.Random(1)
    ours, ref = SlotAllocator(200), Sglang(200)
    held: list[np.ndarray] = []
    for _ in range(400):
        if held and (rng.random() < 0.45 or ours.available() < 20):
            piece = held.pop(rng.randrange(len(held)))
            ours.free(piece)
            ref.free(torch.from_numpy(piece))
        else:
            n = rng.randint(1, 19)
            got = ours.alloc(n)
            assert got.tolist() == ref.alloc(n).tolist()
            held.append(got)


def _engine(pool: KVPool | None, algorithm: str = "STANDALONE", drafter_name: str = "clone_drafter"):
    paths = cached_tiny_models()
    target = load_model(paths.clone_target, "target", CPU, torch.float32, "tiny")
    drafter = load_model(getattr(paths, drafter_name), "drafter", CPU, torch.float32, "tiny")
    return SpecEngine(target, drafter, SpecSettings(algorithm=algorithm, num_draft_tokens=5), pool=pool)


def _generate(engine, ids, n):
    out, layout = [], None
    for ch in engine.generate(DecodeRequest(input_ids=ids, max_new_tokens=n)):
        out.extend(ch.new_ids)
        layout = ch.kv_layout or layout
    return out, layout


def test_pooled_cache_is_lossless_and_frees_every_slot():
    plain = _engine(None)
    cfg = plain.target.config
    pool = KVPool.for_model(cfg, 600, torch.float32, CPU)
    assert pool is not None and pool.bytes_per_token == 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * \
        cfg.head_dim * 4
    pooled = _engine(pool)
    rng = random.Random(0)
    prompts = [[rng.randrange(1, TINY_VOCAB_SIZE) for _ in range(n)] for n in (12, 40, 90)]
    prompts.append(([5, 9, 13, 2] * 30)[:70])  # predictable: drafts accepted and rejected
    for ids in prompts:
        a, _ = _generate(plain, ids, 24)
        b, layout = _generate(pooled, ids, 24)
        assert a == b  # gathering through scattered slots changes nothing but the layout
        # the KV the last step left: the prompt and what was committed (a last step may compute past max_new_tokens)
        assert len(ids) + len(b) - 1 <= layout["tokens"] <= len(ids) + len(b) - 1 + 5
        assert pool.allocator.available() == 600  # the request's slots and every rejected draft's are back
    assert pool.allocator.allocated_since_clear > sum(len(p) for p in prompts)  # drafts took slots and gave them back


def test_a_fragmented_pool_scatters_the_next_request_and_a_clear_makes_it_contiguous():
    probe = _engine(None)
    pool = KVPool.for_model(probe.target.config, 400, torch.float32, CPU)
    engine = _engine(pool, drafter_name="drafter")  # an independent drafter: most drafts rejected, their slots freed
    rng = random.Random(3)
    long_prompt = [rng.randrange(1, TINY_VOCAB_SIZE) for _ in range(150)]
    _, fresh = _generate(engine, long_prompt, 8)
    assert fresh["share_in_long_runs"] > 0.9  # the prompt lands on one run of the fresh range
    while pool.allocator.cycles < 1.5:  # short prompts, long decodes: the free list becomes short pieces
        _generate(engine, [rng.randrange(1, TINY_VOCAB_SIZE) for _ in range(rng.randint(3, 20))], rng.randint(10, 30))
    _, frag = _generate(engine, long_prompt, 8)
    assert frag["share_in_long_runs"] < 0.5 and frag["runs_per_1k_tokens"] > 5 * fresh["runs_per_1k_tokens"]
    pool.allocator.clear()
    _, again = _generate(engine, long_prompt, 8)
    assert again["share_in_long_runs"] == pytest.approx(fresh["share_in_long_runs"], abs=0.05)


def test_contiguous_allocator_is_lossless_and_keeps_a_request_in_one_run_after_traffic():
    """--kv-alloc contiguous: greedy output identical to the plain cache and to SGLang's allocator on the same traffic,
    every slot back after each request, and where SGLang's allocator scatters the long request after a filler of short
    ones, the contiguous allocator keeps it in long runs."""
    plain = _engine(None)
    cfg = plain.target.config
    rng = random.Random(5)
    long_prompt = [rng.randrange(1, TINY_VOCAB_SIZE) for _ in range(150)]
    filler = [([rng.randrange(1, TINY_VOCAB_SIZE) for _ in range(rng.randint(3, 20))], rng.randint(10, 30))
              for _ in range(40)]
    expected, _ = _generate(plain, long_prompt, 12)
    layouts = {}
    for kind in ("sglang", "contiguous"):
        pool = KVPool.for_model(cfg, 400, torch.float32, CPU, kv_alloc=kind)
        assert pool.allocator.state()["allocator"] == kind
        engine = _engine(pool, drafter_name="drafter")  # most drafts rejected: their slots are freed every step
        for ids, n in filler:
            if pool.allocator.cycles >= 1.5:
                break
            out, _ = _generate(engine, ids, n)
            assert out == _generate(plain, ids, n)[0]
            assert pool.allocator.available() == 400
        assert pool.allocator.cycles >= 1.5  # the pool cycled, for both allocators
        got, layouts[kind] = _generate(engine, long_prompt, 12)
        assert got == expected
        assert pool.allocator.available() == 400
    assert layouts["sglang"]["share_in_long_runs"] < 0.5
    assert layouts["contiguous"]["share_in_long_runs"] >= 0.95 and layouts["contiguous"]["runs"] <= 2


def test_prefix_cache_reuses_the_last_prompt_losslessly_and_holds_only_its_slots():
    """--enable-prefix-cache: a request that starts with the last request's prompt prefills only the rest (cached_tokens
    says how many it reused, at most all but the last token), the output is the plain cache's, and between requests the
    pool holds the last prompt's slots and nothing else; dropping the entry gives them back."""
    plain = _engine(None)
    cfg = plain.target.config
    for algorithm in ("NONE", "STANDALONE"):
        pool = KVPool.for_model(cfg, 600, torch.float32, CPU)
        paths = cached_tiny_models()
        engine = SpecEngine(plain.target, load_model(paths.clone_drafter, "drafter", CPU, torch.float32, "tiny"),
                            SpecSettings(algorithm=algorithm, num_draft_tokens=5), pool=pool, prefix_cache=True)
        rng = random.Random(7)
        a = [rng.randrange(1, TINY_VOCAB_SIZE) for _ in range(120)]
        b = a[:80] + [rng.randrange(1, TINY_VOCAB_SIZE) for _ in range(30)]
        for ids, cached in ((a, 0), (a, 119), (b, 80), (b[:50], 49), ([3, 4, 5] * 20, 0)):
            chunks = list(engine.generate(DecodeRequest(input_ids=ids, max_new_tokens=16)))
            assert chunks[0].cached_tokens == cached
            assert [t for ch in chunks for t in ch.new_ids] == _generate(plain, ids, 16)[0]
            assert pool.allocator.available() == 600 - len(ids)  # the prompt stays cached, the rest went back
        engine.drop_prefix()
        assert pool.allocator.available() == 600
    with pytest.raises(ValueError, match="slot pool"):
        SpecEngine(plain.target, None, SpecSettings(algorithm="NONE"), pool=None, prefix_cache=True)


def test_models_with_sliding_layers_keep_the_plain_cache():
    paths = cached_tiny_models()
    drafter = load_model(paths.drafter, "drafter", CPU, torch.float32, "tiny")
    assert KVPool.for_model(drafter.config, 100, torch.float32, CPU) is None
