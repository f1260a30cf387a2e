"""A prefill chunk by chunk: SGLang's stage latencies around a request (recorded /metrics text and synthetic), each
chunk's floor in the attention form that ran it, and 09's tables of both."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from specdiag import prefill
from specdiag.geometry import from_hf_config
from specdiag.hardware import HardwarePeaks, Peak
from specdiag.serving.stages import stage_deltas
from specdiag.speculation.scrapes import parse_prometheus
from specdiag.steps.engine_ab import chunks

RAW = Path(__file__).parent / "data" / "sglang-0.5.17" / "raw-mla-ngram"
CONFIG = Path(__file__).resolve().parents[1] / "data" / "reference" / "sglang-h200-mla61-dflash" / "config.json"
PEAKS = HardwarePeaks("NVIDIA H200", Peak(4.8e12, "table", ""), Peak(989.4e12, "table", ""))


def _stage_text(pf: tuple[float, float], cp: tuple[float, float], cp_buckets: dict[float, int]) -> str:
    """/metrics text with SGLang's stage histogram (its label set) for prefill_forward and chunked_prefill."""
    labels = 'engine_type="unified",model_name="m",moe_ep_rank="0",pp_rank="0",tp_rank="0"'
    lines = ["# TYPE sglang:per_stage_req_latency_seconds histogram"]
    for stage, (count, total), buckets in (("prefill_forward", pf, {}), ("chunked_prefill", cp, cp_buckets)):
        cum = 0
        for le in (0.1, 0.5, 1.0, 5.0, 10.0):
            cum += buckets.get(le, 0)
            lines.append(f'sglang:per_stage_req_latency_seconds_bucket{{{labels},le="{le}",stage="{stage}"}} {cum}')
        lines.append(f'sglang:per_stage_req_latency_seconds_bucket{{{labels},le="+Inf",stage="{stage}"}} {count}')
        lines.append(f'sglang:per_stage_req_latency_seconds_sum{{{labels},stage="{stage}"}} {total}')
        lines.append(f'sglang:per_stage_req_latency_seconds_count{{{labels},stage="{stage}"}} {count}')
    return "\n".join(lines) + "\n"


def test_stage_deltas_of_real_sglang_metrics() -> None:
    """Real SGLang 0.5.17 /metrics before and after five short requests (one chunk each): five prefill_forward
    observations, their seconds and buckets; no chunked_prefill (no prompt was longer than a chunk)."""
    before = parse_prometheus((RAW / "metrics_before.txt").read_text())
    after = parse_prometheus((RAW / "metrics_after.txt").read_text())
    d = stage_deltas(before, after)
    assert set(d) == {"prefill_forward"} and d["prefill_forward"]["count"] == 5
    assert d["prefill_forward"]["sum_s"] == pytest.approx(9.7163512300001 - 2.256752648000031)
    assert sum(n for _, _, n in d["prefill_forward"]["buckets"]) == 5
    assert stage_deltas(before, None) is None and stage_deltas({}, after) is None
    json.dumps(d, allow_nan=False)  # a row's column


def test_a_chunked_prefills_times_by_chunk() -> None:
    """Three chunks: two chunked_prefill observations (buckets 0.1-0.5 and 0.5-1.0 s) and the last chunk exact."""
    before = parse_prometheus(_stage_text((0, 0.0), (0, 0.0), {}))
    after = parse_prometheus(_stage_text((1, 2.0), (2, 0.9), {0.5: 1, 1.0: 1}))
    d = stage_deltas(before, after)
    assert d["chunked_prefill"]["buckets"] == [[0.1, 0.5, 1], [0.5, 1.0, 1]] and d["chunked_prefill"]["count"] == 2
    assert chunks.chunk_times(d, 3) == [(0.1, 0.5), (0.5, 1.0), (pytest.approx(1.1), pytest.approx(1.1))]
    assert chunks.chunk_times(d, 4) is None  # the stages hold another prefill than this one
    one = {"prefill_forward": {"count": 1, "sum_s": 0.3, "buckets": [[0.1, 0.5, 1]]}}
    assert chunks.chunk_times(one, 1) == [(0.3, 0.3)]


def test_each_chunks_floor_in_the_form_that_ran() -> None:
    """At 61 layers of Kimi K2.6's per-rank attention: the absorbed form's chunks cost 3.4x the MHA form's attention
    per pair (2,176 against 640 FLOP per pair and head); the MHA chunks with a prefix also decompress it through kv_b;
    summed, MHA chunks are within a few % of the whole prompt's floor."""
    geom = from_hf_config(json.loads(CONFIG.read_text()))
    d_qk, d_v = prefill.attention_dims(geom, "absorbed")
    assert 2 * (d_qk + d_v) == 2176 and 2 * sum(prefill.attention_dims(geom, "mha")) == 640
    mha = prefill.chunk_floor(geom, 1, 8192, 8192, PEAKS, form="mha")
    absorbed = prefill.chunk_floor(geom, 1, 8192, 8192, PEAKS, form="absorbed")
    assert absorbed.flops_attention > 3 * (mha.flops_attention - 2.0 * 8192 * 512 * 8 * 256 * 61)
    whole = prefill.prefill_floor(geom, 131072, PEAKS, 8192)
    parts = prefill.chunk_floors(geom, 131072, 8192, PEAKS, ["mha"])
    assert len(parts) == 16 and [p.prefix_tokens for p in parts[:3]] == [0, 8192, 16384]
    assert whole.floor_s < sum(p.floor_s for p in parts) < 1.1 * whole.floor_s
    first = prefill.chunk_floors(geom, 131072, 8192, PEAKS, ["mha", "absorbed"])
    assert first[0].form == "mha" and {p.form for p in first[1:]} == {"absorbed"}


def test_which_form_a_servers_later_chunks_run() -> None:
    """SGLang's chunked-prefix MHA path only where --attention-backend reads it (a Triton server with FlashInfer's
    prefill backend does not), or the plugin's MHA prefill on Triton; else the absorbed form."""
    fi = {"server": {"attention_backend": "flashinfer", "disable_chunked_prefix_cache": False}}
    hybrid = {"server": {"attention_backend": "triton", "prefill_attention_backend": "flashinfer"}}
    plug = {"server": {"attention_backend": "triton"}, "env": {"SPECDIAG_SGLANG_PREFILL": "mha"}}
    assert chunks.later_chunk_form(fi)[0] == "mha" and chunks.later_chunk_form(plug)[0] == "mha"
    assert chunks.later_chunk_form(hybrid)[0] == "absorbed" and "--attention-backend triton" in \
        chunks.later_chunk_form(hybrid)[1]
    off = {"server": {"attention_backend": "flashinfer", "disable_chunked_prefix_cache": True}}
    assert chunks.later_chunk_form(off)[0] == "absorbed"


def test_09s_chunk_table_from_a_row_with_stages_and_the_recorded_runs_without() -> None:
    """A 24k prefill row with its stages: three chunks against their floors; the recorded runs' rows hold none, and
    the note says so (their floors of the form that ran are still computed: stock Triton at 128k, 16x)."""
    geom = from_hf_config(json.loads(CONFIG.read_text()))
    meta = {"t": {"server": {"attention_backend": "triton", "chunked_prefill_size": 8192}}}
    stages = stage_deltas(parse_prometheus(_stage_text((0, 0.0), (0, 0.0), {})),
                          parse_prometheus(_stage_text((1, 2.0), (2, 0.9), {0.5: 1, 1.0: 1})))
    row = {"arm": "t", "phase": "prefill", "context_tokens": 24576, "repeat": 0, "ttft_s": 2.1, "server_stages": stages}
    table = chunks.chunk_table([row], meta, geom, PEAKS)
    assert list(table["chunk"]) == [0, 1, 2] and list(table["form"]) == ["mha", "absorbed", "absorbed"]
    assert float(table["time_hi_s"].iloc[-1]) == pytest.approx(1.1) and table["over_floor_lo_x"].gt(1).all()
    assert "1 of 1 prefill rows" in chunks.chunk_note([row])
    import sys

    sys.path.insert(0, str(Path(__file__).parent))
    from recorded_verdicts import judge_09

    j = judge_09("sglang-h200-mla61-dflash")
    assert chunks.chunk_table(j.rows, j.meta, geom, PEAKS).empty
    assert chunks.chunk_note(j.rows).startswith("no prefill row of this run holds SGLang's stage latencies")
    ff = chunks.form_floors(j.pre, j.meta, geom, PEAKS).set_index(["arm", "context_tokens"])
    assert ff.loc[("triton", 131072), "form"] == "absorbed" and ff.loc[("flashinfer", 131072), "form"] == "mha"
    assert 15 < ff.loc[("triton", 131072), "ttft_over_form_floor_x"] < 17
    assert ff.loc[("triton", 131072), "floor_form_s"] > 3 * ff.loc[("triton", 131072), "floor_mha_s"]
    assert math.isfinite(ff.loc[("flashinfer", 131072), "ttft_over_form_floor_x"])


def test_a_watched_request_carries_its_stage_latencies_into_its_row() -> None:
    """The SGLang client scrapes /metrics around each request (its traffic check); the stage latencies between the two
    scrapes go on the trace and into the measured row (``server_stages``)."""
    from specdiag.measure.metrics import sweep_row
    from specdiag.serving.sglang import SGLangClient
    from specdiag.serving.trace import RequestTrace

    before = (RAW / "metrics_before.txt").read_text()
    after = (RAW / "metrics_after.txt").read_text()
    client = SGLangClient("http://127.0.0.1:1")
    scrapes = iter([before, after])
    client.metrics_text = lambda: next(scrapes)  # type: ignore[method-assign]
    trace = RequestTrace("http://127.0.0.1:1/generate", 0.0, 0.5, [0.5, 0.6], [1, 1], 1024, 2, 0.6, "", [], {}, None,
                         None, None)
    client._send = lambda body, stream: trace  # type: ignore[method-assign]
    got = client.generate(input_ids=[1, 2, 3])
    assert got.server_stages["prefill_forward"]["count"] == 5
    assert sweep_row(got, 1024)["server_stages"] == got.server_stages
