"""ServerSettings from SGLang's /server_info, run.json's flat view, and the fresh-prompt recipe (pure, fakes)."""

from __future__ import annotations

from specdiag.measure.fresh_prompt import fresh_prompt
from specdiag.serving.settings import settings_from_sglang

SERVER_INFO = {"model_path": "m", "speculative_algorithm": "STANDALONE", "speculative_num_draft_tokens": 8,
               "speculative_draft_model_path": "d", "attention_backend": "triton", "page_size": 1, "tp_size": 2,
               "context_length": 32768, "kv_cache_dtype": "auto", "version": "0.5.17", "extra_key": 1}


def test_sglang_settings_are_typed_with_sources_and_keep_the_raw_answer() -> None:
    st = settings_from_sglang(SERVER_INFO)
    assert (st.engine, st.algorithm, st.tokens_per_step, st.draft_steps) == ("sglang", "STANDALONE", 8, 7)
    assert (st.page_size, st.tp_size, st.context_length, st.draft_model) == (1, 2, 32768, "d")
    assert st.source("page_size") == "/server_info"
    assert st.source("draft_steps") == "computed (speculative_num_draft_tokens - 1)"
    assert st.as_server_info() == {**SERVER_INFO, "engine": "sglang", "speculative_decoding": True}  # every key kept
    off = settings_from_sglang({"speculative_algorithm": None, "context_length": 4096})
    assert off.speculative_method is None and off.tokens_per_step is None


class FakeClient:
    def __init__(self, reset: bool | None) -> None:
        self.reset, self.calls = reset, []

    def reset_cache(self) -> bool | None:
        self.calls.append("reset")
        return self.reset

    def tokenize(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return [1000 + ord(c) for c in text]


def test_fresh_prompt_without_a_reset_makes_every_head_unique() -> None:
    client = FakeClient(reset=None)
    (a, flushed_a), (b, flushed_b) = (fresh_prompt(client, 300, "predictable", 0) for _ in range(2))
    assert flushed_a is False and flushed_b is False and client.calls == ["reset", "reset"]
    assert len(a.input_ids) == len(b.input_ids) == 300 and a.input_ids[:40] != b.input_ids[:40]
    assert a.input_ids[-100:] == b.input_ids[-100:]  # the tail the model continues is the same text
    same = FakeClient(reset=True)
    (c, flushed_c), (d, _) = (fresh_prompt(same, 300, "predictable", 0) for _ in range(2))
    assert flushed_c is True and c.input_ids == d.input_ids  # a real reset: the prompt stays as built


class BosClient(FakeClient):
    """A tokenizer that puts a BOS (id 1) before every text when asked for special tokens."""

    def tokenize(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return ([1] if add_special_tokens else []) + super().tokenize(text)


def test_the_unique_head_keeps_the_bos_of_a_prompt_built_with_special_tokens() -> None:
    from specdiag.measure.request import ADD_SPECIAL_TOKENS

    client = BosClient(reset=None)
    a, _ = fresh_prompt(client, 300, "predictable", 0, add_special_tokens=ADD_SPECIAL_TOKENS)
    b, _ = fresh_prompt(client, 300, "predictable", 0, add_special_tokens=ADD_SPECIAL_TOKENS)
    assert ADD_SPECIAL_TOKENS is True
    assert len(a.input_ids) == 300 and a.input_ids[0] == 1 and b.input_ids[0] == 1  # the BOS stays first
    assert a.input_ids[1:40] != b.input_ids[1:40] and 1 not in a.input_ids[1:]


def test_dflash_settings_as_each_server_states_them_and_what_it_does_not() -> None:
    from specdiag.steps.snapshot.settings import dflash_rows, not_reported

    # SGLang 0.5.17: block and window in /server_info, no drafter config, draft backend null
    sglang = {"speculative_algorithm": "DFLASH", "speculative_num_draft_tokens": 16, "speculative_num_steps": 1,
              "speculative_dflash_block_size": 16, "speculative_draft_window_size": 2048,
              "speculative_draft_attention_backend": None, "attention_backend": "triton"}
    st = settings_from_sglang(sglang)
    assert (st.block_size, st.draft_window, st.target_layer_ids, st.draft_attention_backend) == (16, 2048, None, None)
    assert st.source("target_layer_ids").startswith("not stated: SGLang's /server_info does not carry")
    assert st.source("draft_attention_backend").startswith("not stated")
    rows = {r["setting"].split(" (")[0].split(",")[0]: r for r in dflash_rows(st, sglang)}
    assert rows["block size"]["value"] == 16 and rows["draft window"]["value"] == 2048
    assert rows["target layer ids"]["value"] is None and "not stated" in rows["target layer ids"]["source"]
    assert any(line.startswith("target_layer_ids (not stated") for line in not_reported(st))
    # only num_draft_tokens given: the block is it (SGLang sets it so), said as computed; no window: said
    bare = settings_from_sglang({**sglang, "speculative_dflash_block_size": None,
                                 "speculative_draft_window_size": None})
    assert bare.block_size == 16 and bare.source("block_size").startswith("computed")
    assert "null (no window" in bare.source("draft_window")
    # the embedded server carries the drafter's config: the target layers are stated
    embedded = {**sglang, "speculative_draft_attention_backend": "torch_sdpa",
                "speculative_draft_model_config": {"dflash_config": {"target_layer_ids": [1], "mask_token_id": 4095}}}
    st = settings_from_sglang(embedded)
    assert (st.target_layer_ids, st.draft_attention_backend) == ((1,), "torch_sdpa")
    flat = st.as_server_info()
    assert flat["speculative_dflash_block_size"] == 16
    replayed = {r["setting"]: r["value"] for r in dflash_rows(None, flat)}  # a recorded run: run.json's server
    assert "1" in replayed.values() and 16 in replayed.values() and "torch_sdpa" in replayed.values()
    # another algorithm: no DFLASH table, and the block is not listed as unreported
    ngram = settings_from_sglang({"speculative_algorithm": "NGRAM", "speculative_num_draft_tokens": 8})
    assert dflash_rows(ngram, {"speculative_algorithm": "NGRAM"}) == []
    assert not any(line.startswith(("block_size", "target_layer_ids")) for line in not_reported(ngram))


def test_vllm_dflash_block_is_k_plus_one_and_unexposed_fields_say_so() -> None:
    from specdiag.serving.vllm import VLLMClient

    values = {"speculative_method": "dflash", "tokens_per_step": 8}
    sources: dict[str, str] = {}
    VLLMClient._dflash(values, sources, {"method": "dflash", "num_speculative_tokens": 7, "attention_backend": None})
    assert values["block_size"] == 8 and sources["block_size"].startswith("computed (num_speculative_tokens + 1")
    assert "draft_attention_backend" not in values and sources["draft_attention_backend"].startswith("not exposed")
    assert sources["target_layer_ids"].startswith("not exposed")
    values = {"speculative_method": "ngram", "tokens_per_step": 8}
    VLLMClient._dflash(values, sources, {"method": "ngram"})
    assert "block_size" not in values and sources["block_size"].startswith("not applicable")
