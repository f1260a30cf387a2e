"""SGLang's per-request stage latencies around one request: the difference of two /metrics scrapes (pure).

SGLang (0.5.17, ``--enable-metrics``) observes ``sglang:per_stage_req_latency_seconds{stage=...}`` (a histogram) once per
request and stage (``srt/observability/req_time_stats.py``): ``prefill_forward`` from the request's first forward
entry until its prefill finished (every chunk of a chunked prefill, the last included), and ``chunked_prefill`` once
per chunk that is not the last (from the previous chunk's end, or the forward entry, to this chunk's end). Between two
scrapes around a request that ran alone, the differences are that request's: ``prefill_forward`` count 1 and its
seconds; ``chunked_prefill`` count (chunks - 1), their seconds summed and the histogram buckets they fell into.
"""

from __future__ import annotations

from typing import Any, Mapping

STAGE_METRIC = "sglang:per_stage_req_latency_seconds"
STAGES = ("prefill_forward", "chunked_prefill")


def _series(samples: Mapping[str, Any], suffix: str, stage: str) -> dict[str, float]:
    """``{le or '': value}`` of one stage's ``_bucket`` / ``_sum`` / ``_count`` series, tensor-parallel rank 0 only
    (every rank's scheduler observes the same request)."""
    out: dict[str, float] = {}
    for labels, value in samples.get(STAGE_METRIC + suffix) or []:
        if labels.get("stage") != stage or labels.get("tp_rank", "0") != "0":
            continue
        key = str(labels.get("le", ""))
        out[key] = out.get(key, 0.0) + float(value)
    return out


def stage_deltas(before: Mapping[str, Any] | None, after: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """Per stage of :data:`STAGES` observed between two parsed scrapes (``specdiag.speculation.scrapes.parse_prometheus``):
    ``{"count", "sum_s", "buckets": [[lower bound (s), upper bound (s; None for +Inf), observations], ...]}``,
    ascending, the buckets that gained an observation (JSON-fit); None where either scrape is missing or the server
    exports no stage latencies."""
    if not before or not after or not any(name.startswith(STAGE_METRIC) for name in after):
        return None
    out: dict[str, Any] = {}
    for stage in STAGES:
        c0, c1 = _series(before, "_count", stage).get("", 0.0), _series(after, "_count", stage).get("", 0.0)
        if c1 - c0 <= 0:
            continue
        s0, s1 = _series(before, "_sum", stage).get("", 0.0), _series(after, "_sum", stage).get("", 0.0)
        b0, b1 = _series(before, "_bucket", stage), _series(after, "_bucket", stage)
        cum = sorted(((float(le), b1[le] - b0.get(le, 0.0)) for le in b1), key=lambda x: x[0])
        buckets, below, lower = [], 0.0, 0.0
        for le, n in cum:  # cumulative counts -> per bucket
            if n - below > 0:
                buckets.append([lower, le if le != float("inf") else None, int(round(n - below))])
            below, lower = n, le
        out[stage] = {"count": int(round(c1 - c0)), "sum_s": s1 - s0, "buckets": buckets}
    return out or None
