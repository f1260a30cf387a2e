"""Other traffic on the server while the suite measures, and a server restarted under it (pure but for the
watch's own state, which lives in each client).

A production server serves other users while the suite measures. Every generate request of a client is
bracketed by two /metrics scrapes (``before`` just before it is sent, ``after`` just after its stream ended);
:class:`TrafficWatch` reads them, with what the request itself brought, as evidence of other requests:

- running requests: ``sglang:num_running_reqs + sglang:num_queue_reqs`` or ``vllm:num_requests_running +
  vllm:num_requests_waiting`` above one at either scrape (SGLang updates these gauges only at its log
  intervals, so one may be ours, or a stale one of ours; above one is someone else's);
- counters moving: generated tokens counted beyond the suite's own (``sglang:generation_tokens_total``,
  ``vllm:generation_tokens_total``), during the request (between its two scrapes) or between the suite's requests;
  the suite's own tokens are all its requests' completion tokens since the watch's first scrape, so a counter that
  counts a request late (SGLang counts finished requests) is no false alarm;
- the stream's timing: the server's own ``queue_time`` (SGLang with ``--enable-metrics``, the embedded server),
  seconds the request waited behind others before it ran, above :data:`QUEUE_S`;
- a restart: a counter that went back (or the process start time that moved) means a new server process.

A request is disturbed (``other_traffic`` True) when running requests, tokens during it, or its queue time say so;
tokens between requests do not touch its own numbers but are kept, for the run's share of disturbed time. Without
/metrics (SGLang without ``--enable-metrics``) and without queue times, ``other_traffic`` is None: unknown.
Commit lengths taken from counter differences (vLLM without per-request metrics) are unreliable on a disturbed
request: :func:`traffic_columns` says so in its row.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

from specdiag.speculation.scrapes import Samples, metric_total

__all__ = ["QUEUE_S", "TrafficReading", "TrafficWatch", "traffic_columns", "COUNTER_SPEC_SOURCE"]

#: Requests the server said were running or waiting, per engine: gauge names summed.
RUNNING = {"sglang": ("sglang:num_running_reqs", "sglang:num_queue_reqs"),
           "vllm": ("vllm:num_requests_running", "vllm:num_requests_waiting")}
#: Tokens the server generated (all requests), per engine.
GENERATED = {"sglang": "sglang:generation_tokens_total", "vllm": "vllm:generation_tokens_total"}
#: Requests the server finished, per engine (a restart check beside the tokens).
FINISHED = {"sglang": "sglang:num_requests_total", "vllm": "vllm:request_success_total"}
START_TIME = "process_start_time_seconds"
#: A server-reported queue time above this many seconds means the request waited behind others.
QUEUE_S = 0.1
#: ``spec_source`` of speculative numbers taken from /metrics counter differences (vLLM without per-request metrics).
COUNTER_SPEC_SOURCE = "/metrics difference around the request"


def _running(samples: Samples | None, engine: str) -> float | None:
    if not samples:
        return None
    values = [metric_total(samples, name) for name in RUNNING.get(engine, ())]
    values = [v for v in values if v is not None]
    return sum(values) if values else None


@dataclass
class TrafficReading:
    """What one request saw of other traffic (see the module doc); every field None when unknown."""

    running_before: float | None = None  # requests running or waiting just before ours was sent
    running_after: float | None = None  # just after its stream ended
    foreign_tokens_during: float | None = None  # generated between its scrapes beyond its own tokens
    foreign_tokens_between: float | None = None  # generated since the suite's previous request, beyond its own
    queue_s: float | None = None  # server-reported queue time of this request
    restarted: bool = False  # a counter went back, or the process start time moved: a new server process
    metrics: bool = False  # /metrics answered both scrapes
    evidence: list[str] = field(default_factory=list)

    @property
    def other_traffic(self) -> bool | None:
        """True: other requests ran beside this one; False: /metrics (or the queue time) says none did; None: unknown."""
        if ((self.running_before or 0) > 1 or (self.running_after or 0) > 1 or (self.foreign_tokens_during or 0) > 0
                or (self.queue_s or 0) > QUEUE_S):
            return True
        return False if (self.metrics or self.queue_s is not None) else None

    def as_dict(self) -> dict[str, Any]:
        return {"other_traffic": self.other_traffic, "running_before": self.running_before,
                "running_after": self.running_after, "foreign_tokens_during": self.foreign_tokens_during,
                "foreign_tokens_between": self.foreign_tokens_between, "queue_s": self.queue_s,
                "restarted": self.restarted, "metrics": self.metrics, "evidence": list(self.evidence)}


class TrafficWatch:
    """The suite's own requests against the server's counters, for one client (one server).

    ``before(samples)`` right before a request is sent, ``after(samples, completion_tokens, queue_s)`` right after
    its stream ended; ``after`` returns the request's :class:`TrafficReading`.
    """

    def __init__(self, engine: str) -> None:
        self.engine = "vllm" if engine == "vllm" else "sglang"
        self.base: float | None = None  # generated tokens at the first scrape
        self.own: float = 0.0  # the suite's completion tokens since then
        self.foreign_seen: float = 0.0  # foreign tokens already accounted at the last after-scrape
        self.last: Samples | None = None  # the last scrape
        self.start_time: float | None = None
        self._before: Samples | None = None
        self._between: float | None = None
        self._restarted = False
        self.requests = 0
        self.disturbed = 0

    def _generated(self, samples: Samples) -> float | None:
        return metric_total(samples, GENERATED[self.engine])

    def _check_restart(self, samples: Samples) -> bool:
        restarted = False
        start = metric_total(samples, START_TIME)
        if start is not None:
            restarted = self.start_time is not None and abs(start - self.start_time) > 1e-3
            self.start_time = start
        if self.last is not None:
            for name in (GENERATED[self.engine], FINISHED[self.engine]):
                was, now = metric_total(self.last, name), metric_total(samples, name)
                if was is not None and now is not None and now < was:
                    restarted = True
        if restarted:  # counting starts again from this scrape
            self.base, self.own, self.foreign_seen = self._generated(samples), 0.0, 0.0
        return restarted

    def before(self, samples: Samples | None) -> None:
        self._before, self._between, self._restarted = samples, None, False
        if not samples:
            return
        self._restarted = self._check_restart(samples)
        gen = self._generated(samples)
        if gen is None:
            return
        if self.base is None:
            self.base = gen
        foreign = gen - self.base - self.own
        if not self._restarted and self.last is not None:
            self._between = max(0.0, foreign - self.foreign_seen)
        self.foreign_seen = max(self.foreign_seen, foreign)
        self.last = samples

    def after(self, samples: Samples | None, completion_tokens: int, queue_s: float | None = None) -> TrafficReading:
        reading = TrafficReading(queue_s=queue_s, restarted=self._restarted)
        before = self._before
        self.requests += 1
        if before is not None and samples:
            reading.metrics = True
            restarted_now = self._check_restart(samples)  # between this request's two scrapes
            reading.restarted = reading.restarted or restarted_now
            reading.running_before = _running(before, self.engine)
            reading.running_after = _running(samples, self.engine)
            gen_before, gen_after = self._generated(before), self._generated(samples)
            if gen_before is not None and gen_after is not None and not restarted_now:
                reading.foreign_tokens_during = max(0.0, (gen_after - gen_before) - completion_tokens)
            reading.foreign_tokens_between = self._between
            self.last = samples
        self.own += max(0, int(completion_tokens or 0))
        if self.base is not None and samples:
            gen = self._generated(samples)
            if gen is not None:
                self.foreign_seen = max(self.foreign_seen, gen - self.base - self.own)
        reading.evidence = evidence_lines(reading)
        self.disturbed += int(bool(reading.other_traffic))
        self._before = None
        return reading


def _n(x: float | None) -> str:
    return f"{x:,.0f}" if x is not None else "?"


def evidence_lines(r: TrafficReading) -> list[str]:
    """The reading's evidence in words (one line per signal that fired)."""
    out: list[str] = []
    if (r.running_before or 0) > 1 or (r.running_after or 0) > 1:
        out.append(f"/metrics: {_n(r.running_before)} requests running or waiting before it was sent, "
                   f"{_n(r.running_after)} after it ended (one is this request)")
    if (r.foreign_tokens_during or 0) > 0:
        out.append(f"/metrics: {_n(r.foreign_tokens_during)} tokens generated for other requests while it ran")
    if (r.queue_s or 0) > QUEUE_S:
        out.append(f"server-reported queue time {r.queue_s:.3g} s: it waited behind other requests")
    if (r.foreign_tokens_between or 0) > 0:
        out.append(f"/metrics: {_n(r.foreign_tokens_between)} tokens generated for other requests since the suite's "
                   "previous request")
    if r.restarted:
        out.append("/metrics: a counter went back or the process start time moved: the server restarted")
    return out


def traffic_columns(reading: Mapping[str, Any] | None, spec_source: str | None,
                    commit_length: float | None) -> dict[str, Any]:
    """The row columns of a request's traffic reading: ``other_traffic`` (True/False/None), ``traffic_evidence``
    (lines, or None), ``commit_length_reliable`` (False when the commit length came from counter differences on a
    disturbed request; None without a commit length), ``foreign_tokens_between`` (tokens generated for others since
    the suite's previous request) and ``server_restarted``."""
    other = reading.get("other_traffic") if reading else None
    evidence = list(reading.get("evidence") or []) if reading else []
    reliable: bool | None = None
    if commit_length is not None:
        reliable = not (spec_source == COUNTER_SPEC_SOURCE and other is not False)
    return {"other_traffic": other, "traffic_evidence": evidence or None, "commit_length_reliable": reliable,
            "foreign_tokens_between": reading.get("foreign_tokens_between") if reading else None,
            "server_restarted": bool(reading.get("restarted")) if reading else None}
