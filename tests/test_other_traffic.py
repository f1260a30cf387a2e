"""Other traffic beside the suite's requests (docs/production.md): the watch on synthetic /metrics scrapes, the row
columns and the step findings, and the embedded server measured beside a bounded load generator on 127.0.0.1."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from specdiag.measure.disturbance import disturbance, traffic_finding
from specdiag.serving.traffic import COUNTER_SPEC_SOURCE, TrafficWatch, traffic_columns
from specdiag.speculation.scrapes import parse_prometheus

sys.path.insert(0, str(Path(__file__).parent))

from load_generator import LoadGenerator  # noqa: E402


def scrape(engine: str, generated: float, running: float = 0, waiting: float = 0, requests: float = 0,
           start: float | None = None) -> dict:
    if engine == "vllm":
        text = (f"vllm:generation_tokens_total{{engine=\"0\"}} {generated}\nvllm:num_requests_running{{engine=\"0\"}} "
                f"{running}\nvllm:num_requests_waiting{{engine=\"0\"}} {waiting}\n"
                f"vllm:request_success_total{{engine=\"0\",finished_reason=\"length\"}} {requests}\n")
    else:
        text = (f"sglang:generation_tokens_total{{is_streaming=\"true\"}} {generated}\nsglang:num_running_reqs {running}\n"
                f"sglang:num_queue_reqs {waiting}\nsglang:num_requests_total {requests}\n")
    if start is not None:
        text += f"process_start_time_seconds {start}\n"
    return parse_prometheus(text)


def test_a_quiet_server_shows_no_traffic_even_when_it_counts_a_request_late() -> None:
    w = TrafficWatch("sglang")
    w.before(scrape("sglang", 100))
    r = w.after(scrape("sglang", 100, running=1), 32)  # SGLang counts a finished request: not yet in this scrape
    assert r.other_traffic is False and r.evidence == []
    w.before(scrape("sglang", 132))  # ... but by the next request it is: ours, not someone else's
    r = w.after(scrape("sglang", 164), 32)
    assert r.other_traffic is False and r.foreign_tokens_between == 0 and r.foreign_tokens_during == 0


def test_running_requests_and_counters_beyond_our_own_are_other_traffic() -> None:
    w = TrafficWatch("vllm")
    w.before(scrape("vllm", 0))
    assert w.after(scrape("vllm", 40), 40).other_traffic is False
    w.before(scrape("vllm", 90, running=1))  # 50 tokens for someone else since our last request
    r = w.after(scrape("vllm", 200, running=2), 40)  # 70 more beside ours; two running as ours ended
    assert r.other_traffic is True and r.foreign_tokens_between == 50 and r.foreign_tokens_during == 70
    assert any("running or waiting" in line for line in r.evidence)
    assert any("since the suite's previous request" in line for line in r.evidence)
    assert w.disturbed == 1 and w.requests == 2


def test_a_long_queue_time_is_other_traffic_without_metrics() -> None:
    w = TrafficWatch("sglang")
    w.before(None)  # no /metrics (SGLang without --enable-metrics)
    assert w.after(None, 10, queue_s=None).other_traffic is None  # nothing told: unknown
    w.before(None)
    r = w.after(None, 10, queue_s=2.5)
    assert r.other_traffic is True and "queue time 2.5 s" in r.evidence[0]


def test_a_counter_that_went_back_is_a_restart() -> None:
    w = TrafficWatch("vllm")
    w.before(scrape("vllm", 500, requests=10, start=1000.0))
    w.after(scrape("vllm", 540, requests=11, start=1000.0), 40)
    w.before(scrape("vllm", 3, requests=1, start=2000.0))
    r = w.after(scrape("vllm", 43, requests=2, start=2000.0), 40)
    assert r.restarted and any("restarted" in line for line in r.evidence) and r.foreign_tokens_during == 0


def test_counter_commit_lengths_beside_other_traffic_are_unreliable() -> None:
    disturbed = {"other_traffic": True, "evidence": ["x"], "foreign_tokens_between": 5.0, "restarted": False}
    quiet = {"other_traffic": False, "evidence": [], "foreign_tokens_between": 0.0, "restarted": False}
    assert traffic_columns(disturbed, COUNTER_SPEC_SOURCE, 3.0)["commit_length_reliable"] is False
    assert traffic_columns(quiet, COUNTER_SPEC_SOURCE, 3.0)["commit_length_reliable"] is True
    per_request = "per-request metrics (metrics.speculative_decoding)"
    assert traffic_columns(disturbed, per_request, 3.0)["commit_length_reliable"] is True  # the request's own count
    assert traffic_columns(disturbed, per_request, None)["commit_length_reliable"] is None


def test_the_finding_says_how_much_of_the_run_was_disturbed() -> None:
    rows: list[dict[str, Any]] = [
        {"context_tokens": 512, "other_traffic": True, "traffic_evidence": ["/metrics: 3 running"],
         "commit_length_reliable": False, "foreign_tokens_between": 40.0},
        {"context_tokens": 1024, "other_traffic": False, "commit_length_reliable": True, "foreign_tokens_between": 0},
        {"context_tokens": 2048, "other_traffic": None},
    ]
    d = disturbance(rows)
    assert (d["disturbed"], d["clean"], d["unknown"], d["unreliable_commit"]) == (1, 1, 1, 1)
    f = traffic_finding(rows, "sweep")
    assert f.id == "sweep.other_traffic" and f.severity == "warning"
    assert "1 of 2 requests (50%)" in f.verdict and "marked unreliable" in f.verdict
    assert traffic_finding([{"context_tokens": 1}], "sweep") is None  # rows recorded before the traffic columns


def test_sweep_summary_leaves_unreliable_commit_lengths_out() -> None:
    from specdiag.measure.sweep_table import summarize_sweep

    base = {"context_tokens": 512, "error": None, "completion_tokens": 33, "verify_steps": 8}
    rows = [{**base, "commit_length": 5.0}, {**base, "commit_length": 1.0, "commit_length_reliable": False}]
    assert summarize_sweep(rows)[0]["commit_length"] == 5.0


def test_embedded_server_beside_a_load_generator(embedded_server: Any) -> None:
    """Requests measured while a bounded load runs on 127.0.0.1 are flagged, with evidence; once it stops they are
    clean. The embedded server runs one request at a time, so ours waits behind the load's (its queue time) and the
    server counts two requests running or waiting."""
    from specdiag.serving import make_client
    from specdiag.steps.baseline_sweep.summary import sweep_findings
    from specdiag.measure.sweep_plan import make_plan, measure_request

    client = make_client(embedded_server.url)
    plan = make_plan([256, 512], 16, 1, "novel", 0, True)
    # the load's requests as long as ours (16 new tokens): one of its two is always running or waiting while ours are
    with LoadGenerator(embedded_server.url, "sglang", concurrency=2, max_requests=30, max_new_tokens=16) as load:
        load.wait_busy()
        busy = [measure_request(client, q, plan) for q in plan.requests()]
    quiet = [measure_request(client, q, plan) for q in plan.requests()]
    assert load.errors == 0 and load.finished >= 2
    for row in busy:
        assert row["error"] is None and row["other_traffic"] is True, row
        assert row["cache_flushed"] is False and "running or waiting" in row["cache_note"]  # refused while busy
        assert any("queue time" in line or "running or waiting" in line for line in row["traffic_evidence"])
    for row in quiet:
        assert row["error"] is None and row["other_traffic"] is False and row["cache_flushed"] is True
    found = {f.id: f for f in sweep_findings([], rows=busy + quiet)}
    assert found["sweep.other_traffic"].numbers["disturbed"] == 2 and "2 of 4 requests" in found[
        "sweep.other_traffic"].verdict
