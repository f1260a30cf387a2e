"""Unit tests of specdiag.measure.sweep_plan (plan checks, resume, one request per row, with a fake client), of
the sweep table read back (specdiag.measure.sweep_table, specdiag.runs.rows_source) and of params/full.yaml against
the notebooks' declared parameters."""

from __future__ import annotations

from pathlib import Path

import pytest

from specdiag.serving import RequestTrace, ServerHTTPError, ServerUnreachable
from specdiag.nb import ParameterError
from specdiag.paths import NOTEBOOKS_DIR, PARAMS_DIR
from specdiag.speculation.commit import spec_fields_from_meta
from specdiag.measure.sweep_table import SWEEP_KEY, latest_rows
from specdiag.runs import rows_source
from specdiag.measure.sweep_plan import SweepPlan, make_plan, measure_request


def plan_args(**kw):
    args = dict(context_lengths=[128, 256], max_new_tokens=8, repeats=2, prompt_kind="novel", seed=5,
                flush_cache=True)
    args.update(kw)
    return args


@pytest.mark.parametrize("bad, match", [
    (dict(context_lengths=[]), "context_lengths"),
    (dict(context_lengths=[128, -1]), "context_lengths"),
    (dict(context_lengths="1024"), "context_lengths"),
    (dict(max_new_tokens=1), "max_new_tokens"),
    (dict(repeats=0), "repeats"),
    (dict(prompt_kind="poetry"), "prompt_kind"),
    (dict(flush_cache="yes"), "flush_cache"),
    (dict(seed=1.5), "seed"),
])
def test_bad_parameters_are_named(bad: dict, match: str) -> None:
    with pytest.raises(ParameterError, match=match):
        make_plan(**plan_args(**bad))


def test_server_context_length_bounds_prompt_plus_new_tokens() -> None:
    make_plan(**plan_args(context_lengths=[4088]), server_context_length=4096)
    with pytest.raises(ParameterError, match="4089 tokens.*context_length of 4096 allows prompts up to 4088"):
        make_plan(**plan_args(context_lengths=[128, 4089]), server_context_length=4096)
    with pytest.raises(ParameterError, match="leaves no room"):
        make_plan(**plan_args(max_new_tokens=4096), server_context_length=4096)


def test_plan_requests_and_resume() -> None:
    plan = make_plan(**plan_args())
    reqs = plan.requests()
    assert [(q["context_tokens"], q["repeat"], q["seed"]) for q in reqs] == [(128, 0, 5), (128, 1, 6), (256, 0, 5),
                                                                            (256, 1, 6)]
    done = {tuple(reqs[0][k] for k in SWEEP_KEY), tuple(reqs[3][k] for k in SWEEP_KEY)}
    assert plan.pending(done) == [reqs[1], reqs[2]]
    other = make_plan(**plan_args(max_new_tokens=16))  # another max_new_tokens is another measurement
    assert len(other.pending(done)) == 4


def test_latest_rows_prefers_the_last_good_row() -> None:
    base = {"prompt_kind": "novel", "seed": 0, "max_new_tokens": 8}
    rows = [{**base, "context_tokens": 256, "repeat": 0, "error": "timeout", "n": 1},
            {**base, "context_tokens": 128, "repeat": 0, "error": None, "n": 2},
            {**base, "context_tokens": 256, "repeat": 0, "error": None, "n": 3},
            {**base, "context_tokens": 256, "repeat": 0, "error": "later failure", "n": 4},
            {**base, "context_tokens": 512, "repeat": 0, "error": "x", "n": 5}]
    assert [r["n"] for r in latest_rows(rows)] == [2, 3, 5]
    plan = SweepPlan((128, 256), max_new_tokens=8, seed=0)
    assert [r["n"] for r in latest_rows(rows, plan.requests())] == [2, 3]


def test_rows_source() -> None:
    assert rows_source({"data_source": "published"}) == "published"
    assert rows_source({}) == "measured" and rows_source({"data_source": "guessed"}) == "measured"


class FakeClient:
    """Tokenizes one id per character (with a BOS) and answers generate with a canned speculative trace."""

    def __init__(self, generate_error: Exception | None = None, flush_ok: bool = True) -> None:
        self.generate_error = generate_error
        self.flush_ok = flush_ok
        self.calls: list[tuple] = []

    def flush_cache(self) -> bool:
        self.calls.append(("flush",))
        return self.flush_ok

    def tokenize(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return ([1] if add_special_tokens else []) + [ord(c) + 10 for c in text]

    def generate(self, input_ids=None, sampling_params=None, stream=True, text=None) -> RequestTrace:
        self.calls.append(("generate", len(input_ids), dict(sampling_params)))
        if self.generate_error is not None:
            raise self.generate_error
        meta = {"prompt_tokens": len(input_ids), "completion_tokens": 7, "spec_verify_ct": 3, "cached_tokens": 0,
                "finish_reason": {"type": "length", "length": 7}}
        return RequestTrace("u", 0.0, 0.2, [0.2, 0.25, 0.30, 0.35], [1, 2, 3, 1], len(input_ids), 7, 0.36, "",
                            list(range(7)), meta, meta["finish_reason"], spec_fields_from_meta(meta), None)


def test_measure_request_flushes_builds_exact_prompt_and_records_the_row() -> None:
    plan = make_plan(**plan_args(prompt_kind="predictable"))
    client = FakeClient()
    row = measure_request(client, plan.requests()[1], plan)
    assert client.calls[0] == ("flush",)
    assert client.calls[1] == ("generate", 128, {"max_new_tokens": 8, "temperature": 0.0, "ignore_eos": True})
    assert row["context_tokens"] == 128 and row["prompt_tokens"] == 128 and row["prompt_tokens_match"] is True
    assert row["repeat"] == 1 and row["seed"] == 6 and row["cache_flushed"] is True and row["max_new_tokens"] == 8
    assert row["commit_length"] == pytest.approx(2.0) and row["step_ms"] == pytest.approx(50.0)
    assert row["error"] is None


def test_measure_request_turns_failures_into_rows() -> None:
    plan = make_plan(**plan_args(prompt_kind="predictable", flush_cache=False))
    row = measure_request(FakeClient(ServerUnreachable("http://h:1/generate", "connection refused")),
                          plan.requests()[0], plan)
    assert "connection refused" in row["error"] and row["context_tokens"] == 128 and row["cache_flushed"] is None

    class BadTokenizer(FakeClient):
        def tokenize(self, text: str, add_special_tokens: bool = False) -> list[int]:
            raise ServerHTTPError("http://h:1/tokenize", 404, "", "Not Found")

    row = measure_request(BadTokenizer(), plan.requests()[0], plan)
    assert row["error"].startswith("prompt:") and "404" in row["error"]


def test_full_params_match_the_notebooks_declared_parameters() -> None:
    from specdiag import report

    params = report.load_params_file(str(PARAMS_DIR / "full.yaml"))
    assert params["01_baseline_sweep"]["context_lengths"][-1] >= 128_000
    for name in [k for k in params if report._is_notebook_key(k)]:
        path: Path = NOTEBOOKS_DIR / f"{name}.ipynb"
        declared = report.declared_parameters(path)
        report.parameters_for(name, declared, {"server_url": "http://h:1", "run_dir": "r", "replay_dir": ""}, params)
    full = params["01_baseline_sweep"]
    make_plan(full["context_lengths"], full["max_new_tokens"], full["repeats"], full["prompt_kind"], full["seed"],
              full["flush_cache"], full["instruction"])
