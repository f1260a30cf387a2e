"""RollbackCache: after any mix of forwards and rollbacks, every layer (sliding-window layers
included) holds exactly what a cache fed only the committed tokens holds."""

from __future__ import annotations

import random

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from specdiag.localserver.kvcache import RollbackCache  # noqa: E402


def tiny_sliding_model(window: int):
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    config = Qwen3Config(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=1, head_dim=16, max_position_embeddings=512, use_sliding_window=True,
        sliding_window=window, max_window_layers=0, layer_types=["sliding_attention", "full_attention"],
    )
    return Qwen3ForCausalLM(config).eval()


def cache_kwarg(model) -> str:
    import inspect

    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


@pytest.mark.parametrize("window", [3, 9])
def test_rollback_restores_exactly_the_committed_window(window):
    model = tiny_sliding_model(window)
    kw = cache_kwarg(model)
    rng = random.Random(window)
    rc = RollbackCache(model.config, max_rollback=8)
    committed: list[int] = []
    with torch.inference_mode():
        for _ in range(25):
            new = [rng.randrange(64) for _ in range(rng.randrange(1, 9))]
            logits = model(input_ids=torch.tensor([new]), use_cache=True, **{kw: rc.cache}).logits[0]
            rc.after_forward()
            reject = rng.randrange(0, len(new))  # keep at least one of the new tokens
            rc.rollback(reject)
            committed += new[: len(new) - reject]
            # reference: a fresh cache fed the committed tokens in one forward
            ref = RollbackCache(model.config, max_rollback=8)
            model(input_ids=torch.tensor([committed]), use_cache=True, **{kw: ref.cache})
            ref.after_forward()
            assert rc.get_seq_length() == len(committed)
            for got, want in zip(rc.cache.layers, ref.cache.layers):
                assert got.keys.shape == want.keys.shape
                torch.testing.assert_close(got.keys, want.keys, rtol=1e-5, atol=1e-5)
                torch.testing.assert_close(got.values, want.values, rtol=1e-5, atol=1e-5)
            assert rc.cache.layers[0].keys.shape[-2] == min(len(committed), window - 1)
            # and the next token's logits agree with a no-cache forward over the committed sequence
            probe = [rng.randrange(64)]
            a = model(input_ids=torch.tensor([probe]), use_cache=True, **{kw: rc.cache}).logits[0, -1]
            rc.after_forward()
            rc.rollback(1)
            b = model(input_ids=torch.tensor([committed + probe]), use_cache=False).logits[0, -1]
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)
            del logits


def test_rollback_beyond_the_limit_is_refused():
    model = tiny_sliding_model(4)
    rc = RollbackCache(model.config, max_rollback=2)
    with torch.inference_mode():
        model(input_ids=torch.tensor([[1, 2, 3, 4, 5, 6]]), use_cache=True, **{cache_kwarg(model): rc.cache})
    rc.after_forward()
    with pytest.raises(ValueError, match="at most 2"):
        rc.rollback(3)
