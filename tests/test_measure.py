"""The one measured-request recipe (specdiag.measure.request) and the one measure-what-is-missing loop
(specdiag.measure.loop), with fake clients and a fake run: every step tokenizes its prompt the same way, a
row's time is stamped before the request, and the loop measures only what is missing, row by row."""

from __future__ import annotations

import time

from test_sweep import FakeClient, plan_args

from specdiag.measure.loop import measure_missing, plan_rows
from specdiag.measure.request import ADD_SPECIAL_TOKENS, measured_request, send
from specdiag.serving import ServerUnreachable
from specdiag.measure.sweep_table import SWEEP_KEY
from specdiag.measure.sweep_plan import make_plan, measure_request
from specdiag.steps.commit_probe import probe as cp
from specdiag.steps.drafter_inspection import analysis as drafter


class RecordingClient(FakeClient):
    """Records every tokenize's add_special_tokens and when the reset and the request happened."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.special: set[bool] = set()
        self.t_reset = self.t_generate = None

    def tokenize(self, text: str, add_special_tokens: bool = False) -> list[int]:
        self.special.add(add_special_tokens)
        return super().tokenize(text, add_special_tokens)

    def reset_cache(self) -> bool:
        self.t_reset = time.time()
        return self.flush_cache()

    def generate(self, *args, **kwargs):
        self.t_generate = time.time()
        return super().generate(*args, **kwargs)


def measure_each_step(client: RecordingClient) -> list[dict]:
    sweep_plan = make_plan(**plan_args(prompt_kind="predictable"))
    probe_plan = cp.make_plan([128], ["predictable"], 8, 0)
    return [measure_request(client, sweep_plan.requests()[0], sweep_plan),
            cp.measure(client, probe_plan.requests()[0], probe_plan, 8)[0],
            drafter.measure_draft_timing(client, 128, 8, "predictable")]


def test_every_step_builds_its_prompt_with_the_same_special_tokens() -> None:
    client = RecordingClient()
    rows = measure_each_step(client)
    assert client.special == {ADD_SPECIAL_TOKENS}  # 04 used to tokenize without them
    assert [r["error"] for r in rows] == [None, None, None]
    assert all(r["prompt_tokens"] == 128 for r in rows)


def test_a_failed_request_is_stamped_before_it_was_sent() -> None:
    client = RecordingClient(generate_error=ServerUnreachable("http://h:1/generate", "connection refused"))
    rows = measure_each_step(client)
    for row in rows:
        assert "connection refused" in row["error"]
        assert row["ts_unix_s"] <= client.t_reset <= client.t_generate  # stamped before the reset and the send


def test_a_measured_trace_keeps_the_clients_send_stamp() -> None:
    client = RecordingClient()
    done = measured_request(client, 64, "predictable", 0, 4)
    assert done.error is None and done.cache_flushed is True and done.t_send_unix_s == done.trace.t_send_unix_s
    assert len(done.prompt.input_ids) == 64 and done.prompt.input_ids[0] == 1  # the BOS of add_special_tokens
    sent = send(client, [1, 2, 3], 5, sampling_params={"temperature": 0.5})
    assert client.calls[-1] == ("generate", 3, {"max_new_tokens": 5, "temperature": 0.5, "ignore_eos": True})
    assert sent.error is None and sent.cache_flushed is None


class FakeRun:
    def __init__(self, rows: dict[str, list[dict]] | None = None) -> None:
        self.tables = {k: list(v) for k, v in (rows or {}).items()}

    def rows(self, table: str) -> list[dict]:
        return list(self.tables.get(table, []))

    def append_row(self, table: str, row: dict) -> None:
        self.tables.setdefault(table, []).append(dict(row))

    def done_keys(self, table: str, key) -> set[tuple]:
        return {tuple(r.get(k) for k in key) for r in self.rows(table) if not r.get("error")}


def test_the_loop_measures_what_is_missing_and_appends_each_row_at_once() -> None:
    plan = make_plan(**plan_args(prompt_kind="predictable"))
    reqs = plan.requests()
    done_row = {**reqs[0], "error": None, "n": "old"}
    failed_row = {**reqs[1], "error": "timeout", "n": "old"}
    run = FakeRun({"sweep": [done_row, failed_row]})
    seen_before: list[int] = []
    lines: list[str] = []

    def measure(q: dict) -> tuple[dict, dict]:
        seen_before.append(len(run.rows("sweep")))  # rows already written when this request starts
        row = {**q, "error": "refused" if q["context_tokens"] == 256 and q["repeat"] == 1 else None, "n": "new"}
        return row, {"extra": [{"of": q["repeat"]}]}

    measured = measure_missing(run, plan, "sweep", SWEEP_KEY, measure, desc="t", report=lines.append)
    assert [(r["context_tokens"], r["repeat"]) for r in measured] == [(128, 1), (256, 0), (256, 1)]  # failed again
    assert seen_before == [2, 3, 4]
    assert len(run.rows("extra")) == 3
    assert lines[0] == "1 of 4 requests already measured in this run folder; measuring 3"
    assert "context_tokens 256, repeat 1" in lines[1] and "FAILED: refused" in lines[1]
    latest = plan_rows(run, plan, "sweep", SWEEP_KEY)
    assert [(r["n"], r["error"]) for r in latest] == [("old", None), ("new", None), ("new", None), ("new", "refused")]
    assert measure_missing(run, plan, "sweep", SWEEP_KEY, measure, desc="t", report=lines.append) == [
        {**reqs[3], "error": "refused", "n": "new"}]  # only the failed one again


def test_the_drafter_timing_plan_resumes_by_its_key() -> None:
    plan = drafter.TimingPlan((512, 1024), 32, "novel")  # a warm-up, then 3 requests a context
    done = {tuple(q[k] for k in drafter.TIMING_KEY) for q in plan.requests()[:2]}
    assert plan.pending(done) == plan.requests()[2:] and len(plan.requests()) == 7
