"""A real vLLM with ngram speculation and WITHOUT dev mode (no /server_info, no /reset_prefix_cache): the
settings come from /metrics or a stated parameter, rows say the cache was not reset, and a unique head keeps
every prompt token out of the prefix cache (checked against the same prompt sent twice without one).

Marked ``engines`` (``make test-engines``); its own module, so its server starts after the draft-model
server of test_engines_vllm.py has stopped.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Iterator

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from test_engines_vllm import vllm_server  # noqa: E402

from specdiag.serving import VLLMClient, make_client  # noqa: E402

pytestmark = [pytest.mark.engines]


@pytest.fixture(scope="module")
def vllm_ngram(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    yield from vllm_server(tmp_path_factory, "vllm-ngram", algorithm="NGRAM", num_draft_tokens=8, dev_mode=False)


def test_ngram_without_dev_mode(vllm_ngram: str) -> None:
    from specdiag.steps.baseline_sweep.sweep import make_plan, measure_request

    client = make_client(vllm_ngram)
    st = client.settings()
    assert st.cache_reset is False and st.speculative_method is None and st.draft_steps == 7
    assert "pass speculative_config" in st.source("speculative_method") and st.tokens_per_step == 8
    stated = VLLMClient(vllm_ngram, speculative_config={"method": "ngram", "num_speculative_tokens": 7}).settings()
    assert (stated.speculative_method, stated.algorithm) == ("ngram", "NGRAM")
    # control: the same prompt twice, no unique head: vLLM serves the second one's prefix from its cache
    ids = client.tokenize("The cat sat on the mat. " * 80)[:512]
    sampling = {"max_new_tokens": 16, "temperature": 0.0, "ignore_eos": True}
    first, second = (client.generate(input_ids=ids, sampling_params=sampling) for _ in range(2))
    assert first.error is None and second.error is None and second.cached_tokens > 0
    # the sweep's requests: no reset offered, so each prompt gets a unique head and nothing is cached
    plan = make_plan([512], 32, 2, "predictable", 0, True)
    rows = [measure_request(client, q, plan) for q in plan.requests()]
    for row in rows:
        assert row["error"] is None and row["cache_flushed"] is False and row["prompt_tokens"] == 512
        assert row["cached_tokens"] == 0
        assert row["verify_steps"] and row["commit_length"] > 1  # ngram drafts from the repeated sentence
