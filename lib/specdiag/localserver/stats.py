"""Server-lifetime counters of the embedded server and their Prometheus text (SGLang's sglang: names).

Only what the embedded server measures itself is exposed. Counters count finished requests, as
SGLang's do; ``avg_spec_accept_length`` is lifetime-cumulative and reset by /flush_cache, as in
SGLang's internal_states.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

#: histogram bucket upper bounds, seconds (a subset of SGLang's TTFT / e2e buckets)
LATENCY_BUCKETS_S: tuple[float, ...] = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)


@dataclass
class _Histogram:
    counts: list[int] = field(default_factory=lambda: [0] * len(LATENCY_BUCKETS_S))
    total: int = 0
    sum_s: float = 0.0

    def observe(self, value_s: float) -> None:
        for i, bound in enumerate(LATENCY_BUCKETS_S):
            if value_s <= bound:
                self.counts[i] += 1
        self.total += 1
        self.sum_s += value_s


@dataclass
class ServerStats:
    """Counters since start (``*_total``) and the spec average since the last flush."""

    prompt_tokens_total: int = 0
    cached_tokens_total: int = 0  # prompt tokens served from the prefix cache
    generation_tokens_total: int = 0
    spec_verify_calls_total: int = 0
    num_requests_total: int = 0
    num_aborted_requests_total: int = 0
    num_running_reqs: int = 0
    num_queue_reqs: int = 0
    last_gen_throughput: float = 0.0  # tokens/s of the last request's decode phase
    # for avg_spec_accept_length (reset by /flush_cache)
    spec_tokens_since_flush: int = 0
    spec_verify_since_flush: int = 0
    ttft: _Histogram = field(default_factory=_Histogram)
    e2e: _Histogram = field(default_factory=_Histogram)
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def record_finished(self, prompt_tokens: int, completion_tokens: int, verify_ct: int, ttft_s: float | None,
                        e2e_s: float, decode_s: float | None, aborted: bool, cached_tokens: int = 0) -> None:
        with self.lock:
            self.prompt_tokens_total += prompt_tokens
            self.cached_tokens_total += cached_tokens
            self.generation_tokens_total += completion_tokens
            self.spec_verify_calls_total += verify_ct
            self.num_requests_total += 1
            self.num_aborted_requests_total += int(aborted)
            if verify_ct > 0:
                self.spec_tokens_since_flush += completion_tokens
                self.spec_verify_since_flush += verify_ct
            if ttft_s is not None:
                self.ttft.observe(ttft_s)
            self.e2e.observe(e2e_s)
            if decode_s and decode_s > 0 and completion_tokens > 1:
                self.last_gen_throughput = (completion_tokens - 1) / decode_s

    def reset_spec(self) -> None:
        with self.lock:
            self.spec_tokens_since_flush = 0
            self.spec_verify_since_flush = 0

    @property
    def avg_spec_accept_length(self) -> float | None:
        """Σ completion tokens / Σ verify steps of speculative requests since the last flush."""
        if self.spec_verify_since_flush == 0:
            return None
        return self.spec_tokens_since_flush / self.spec_verify_since_flush


def prometheus_text(stats: ServerStats, model_name: str, context_len: int, page_size: int,
                    num_draft_tokens: int | None, speculative: bool) -> str:
    """Render ``stats`` in the Prometheus text format with SGLang's metric names."""
    labels = f'model_name="{model_name}",engine_type="unified"'
    lines: list[str] = []

    def metric(name: str, kind: str, help_text: str, value: float, extra: str = "") -> None:
        lines.append(f"# HELP sglang:{name} {help_text}")
        lines.append(f"# TYPE sglang:{name} {kind}")
        lab = labels + ("," + extra if extra else "")
        lines.append(f"sglang:{name}{{{lab}}} {float(value)}")

    def histogram(name: str, help_text: str, h: _Histogram) -> None:
        lines.append(f"# HELP sglang:{name} {help_text}")
        lines.append(f"# TYPE sglang:{name} histogram")
        for bound, count in zip(LATENCY_BUCKETS_S, h.counts):
            lines.append(f'sglang:{name}_bucket{{{labels},le="{bound}"}} {float(count)}')
        lines.append(f'sglang:{name}_bucket{{{labels},le="+Inf"}} {float(h.total)}')
        lines.append(f"sglang:{name}_sum{{{labels}}} {h.sum_s}")
        lines.append(f"sglang:{name}_count{{{labels}}} {float(h.total)}")

    with stats.lock:
        metric("prompt_tokens_total", "counter", "Prompt tokens of finished requests.", stats.prompt_tokens_total)
        metric("generation_tokens_total", "counter", "Generated tokens of finished requests.",
               stats.generation_tokens_total)
        metric("num_requests_total", "counter", "Finished requests.", stats.num_requests_total)
        metric("num_aborted_requests_total", "counter", "Requests aborted (client went away).",
               stats.num_aborted_requests_total)
        metric("cached_tokens_total", "counter",
               "Prompt tokens served from the prefix cache (--enable-prefix-cache; 0 without it).",
               stats.cached_tokens_total)
        if speculative:
            metric("spec_verify_calls_total", "counter", "Verify steps of finished requests.",
                   stats.spec_verify_calls_total)
            avg = stats.avg_spec_accept_length
            metric("spec_accept_length", "gauge",
                   "Committed tokens per verify step (bonus included), since the last flush_cache.",
                   avg if avg is not None else 0.0)
            metric("spec_num_draft_tokens", "gauge", "speculative_num_draft_tokens.", num_draft_tokens or 0)
        metric("gen_throughput", "gauge", "Decode tokens/s of the last finished request.", stats.last_gen_throughput)
        metric("num_running_reqs", "gauge", "Requests being generated (0 or 1).", stats.num_running_reqs)
        metric("num_queue_reqs", "gauge", "Requests waiting for the engine.", stats.num_queue_reqs)
        metric("context_len", "gauge", "Context length, tokens.", context_len)
        metric("page_size", "gauge", "KV cache page size, tokens.", page_size)
        metric("max_total_num_tokens", "gauge", "KV capacity, tokens (one request of context_len).", context_len)
        histogram("time_to_first_token_seconds", "Server-side time to first token, seconds.", stats.ttft)
        histogram("e2e_request_latency_seconds", "Server-side request latency, seconds.", stats.e2e)
    return "\n".join(lines) + "\n"
