"""The prefill floor (specdiag/prefill.py, 05's and 09's), checked by hand arithmetic on a tiny MLA geometry."""

from __future__ import annotations

import pytest

from specdiag import prefill
from specdiag.geometry import ModelGeometry
from specdiag.hardware import HardwarePeaks, Peak

# 2 layers, 4 heads, hidden 8, kv_lora_rank 4 + rope 2, nope 3, v 3, no q LoRA, dense MLP 16, vocabulary 10
GEOM = ModelGeometry(name="tiny-mla", attention="mla", num_layers=2, num_attention_heads=4, num_kv_heads=1, head_dim=5,
                     hidden_size=8, vocab_size=10, intermediate_size=16, layer_types=("full_attention",) * 2,
                     sliding_window=None, kv_lora_rank=4, qk_rope_head_dim=2, qk_nope_head_dim=3, v_head_dim=3)
PEAKS = HardwarePeaks("test device", Peak(1e3, "parameter", "1 kB/s"), Peak(1e4, "parameter", "10 kFLOP/s"))


def test_causal_pairs_full_and_sliding() -> None:
    assert prefill.causal_pairs(10) == 55
    assert prefill.causal_pairs(10, window=4) == 1 + 2 + 3 + 4 * 7 == 34
    assert prefill.causal_pairs(3, window=4) == 6


def test_prefill_flops_by_hand() -> None:
    f = prefill.prefill_flops(GEOM, 10)
    # projections per layer: q 8x4x5 = 160, kv_a 8x6 = 48, kv_b 4x4x6 = 96, o 4x3x8 = 96 -> 400; 2 x 10 x 400 x 2 layers
    assert f.projections == 2 * 10 * 400 * 2 == 16_000
    # attention, MHA form: 2 x 4 heads x 55 pairs x (5 + 3) x 2 layers
    assert f.attention == 2 * 4 * 55 * 8 * 2 == 7_040
    assert f.mlp == 2 * 10 * (3 * 8 * 16) * 2 == 15_360
    assert f.lm_head == 2 * 8 * 10 == 160
    assert f.total == 38_560
    # absorbed: (kv_lora_rank + rope) + kv_lora_rank = 6 + 4 per pair and head; the rest the same
    a = prefill.prefill_flops(GEOM, 10, form="absorbed")
    assert a.attention == 2 * 4 * 55 * 10 * 2 and a.projections == f.projections
    # TP 2: 2 heads per rank; the replicated kv_a stays whole
    t = prefill.prefill_flops(GEOM, 10, tp_size=2)
    assert t.projections == 2 * 10 * (8 * 2 * 5 + 48 + 4 * 2 * 6 + 2 * 3 * 8) * 2 == 8_960
    assert (t.attention, t.mlp, t.lm_head) == (3_520, 7_680, 80)
    with pytest.raises(ValueError, match="form"):
        prefill.prefill_flops(GEOM, 10, form="latent")  # type: ignore[arg-type]


def test_floor_counts_weights_per_chunk_and_judges_the_ttft() -> None:
    f = prefill.prefill_floor(GEOM, 10, PEAKS, chunk_tokens=4, measured_ttft_s=21.312)
    assert f.n_chunks == 3
    # weights per pass (geometry): attention 404 params x 2 layers, MLP 384 x 2, 4 embedding rows of 8, LM head 80;
    # 2 B each, read once per chunk
    assert f.weight_bytes == 3 * 2 * (404 * 2 + 384 * 2 + 4 * 8 + 80) == 10_128
    assert f.kv_write_bytes == 10 * 6 * 2 * 2 == 240  # 10 tokens x 6 latent values x 2 B x 2 layers
    assert f.kv_read_bytes == (0 + 4 + 8) * 12 * 2 == 288  # each chunk reads the chunks before it
    assert f.compute_s == pytest.approx(38_560 / 1e4)
    assert f.memory_s == pytest.approx(10_656 / 1e3)
    assert f.floor_s == pytest.approx(10.656) and f.bound == "memory"
    assert f.ttft_over_floor_x == pytest.approx(2.0)
    row = f.as_row()
    assert row["prefill_tok_s"] == pytest.approx(10 / 21.312) and row["s_per_chunk"] == pytest.approx(21.312 / 3)
    assert prefill.verdict_text(f) == "2 x its floor"
    one = prefill.prefill_floor(GEOM, 10, PEAKS)  # no chunk size: one pass, no prefix re-read
    assert one.n_chunks == 1 and one.kv_read_bytes == 0 and one.ttft_over_floor_x is None


def test_chunk_size_from_the_server() -> None:
    assert prefill.chunk_tokens_of({"chunked_prefill_size": 8192}) == 8192
    assert prefill.chunk_tokens_of({"chunked_prefill_size": -1}) is None
    assert prefill.chunk_tokens_of({}) is None and prefill.chunk_tokens_of(None) is None


def test_the_finding_reads_the_longest_prompt() -> None:
    floors = prefill.floor_table(GEOM, {10: 21.312, 4: None}, PEAKS, chunk_tokens=4)
    assert [f.prompt_tokens for f in floors] == [4, 10]
    f = prefill.prefill_finding(floors, "measured", finding_id="engine_ab.prefill_floor", label="triton",
                                extra={"arm": "triton"})
    assert f is not None and f.severity == "warning" and f.numbers["ttft_over_floor_x"] == pytest.approx(2.0)
    assert f.numbers["arm"] == "triton" and f.numbers["chunk_tokens"] == 4 and f.verdict.startswith("triton: the first")
    slow = prefill.prefill_floor(GEOM, 10, PEAKS, 4, measured_ttft_s=200.0)
    assert prefill.prefill_finding([slow], "measured").severity == "critical"
    assert prefill.prefill_finding(floors[:1], "measured") is None  # nothing measured: no claim
    # a TTFT under its floor cannot be: the finding says a peak is too low, which, and what to pass
    fast = prefill.prefill_floor(GEOM, 10, PEAKS, 4, measured_ttft_s=0.5 * floors[1].floor_s)
    under = prefill.prefill_finding([fast], "measured", peaks=PEAKS)
    assert under.severity == "warning" and "a peak is too low" in under.title
    assert f"pass {'matmul_tflops' if fast.bound == 'compute' else 'memory_bandwidth_gb_s'}" in under.verdict
