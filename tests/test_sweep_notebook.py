"""Execute notebooks/01_baseline_sweep.ipynb with tiny parameters: against the embedded server (rows
recorded, resume), with bad parameters (refused before any request), and replaying a recorded table."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from specdiag.runs import Run

pytestmark = [pytest.mark.notebook, pytest.mark.slow]

CONTEXTS = [64, 256, 1024]  # tokens
MAX_NEW_TOKENS = 12


def _finite_positive(x: object) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x) and x > 0


def test_sweep_records_one_row_per_context_and_resumes(embedded_server, run_notebook, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    params = dict(server_url=embedded_server.url, run_dir=str(run_dir), context_lengths=CONTEXTS,
                  max_new_tokens=MAX_NEW_TOKENS, repeats=1, seed=3)
    run_notebook("01_baseline_sweep", **params)
    rows = Run.open(run_dir).rows("sweep")
    assert [r["context_tokens"] for r in rows] == CONTEXTS
    for r in rows:
        assert r["error"] is None, r["error"]
        assert r["prompt_tokens"] == r["context_tokens"] and r["prompt_tokens_match"] is True
        assert r["completion_tokens"] == MAX_NEW_TOKENS and r["cache_flushed"] is True and r["seed"] == 3
        for field in ("ttft_s", "prefill_tok_s", "decode_tok_s", "step_ms", "e2e_s", "ts_unix_s"):
            assert _finite_positive(r[field]), (field, r[field])
        assert r["ttft_s"] < r["e2e_s"]
        assert isinstance(r["verify_steps"], int) and r["verify_steps"] >= 1
        assert r["commit_length"] >= 1
        assert r["commit_length"] == pytest.approx((r["completion_tokens"] - 1) / r["verify_steps"])
    result = json.loads((run_dir / "findings" / "01_baseline_sweep.json").read_text())
    ids = {f["id"] for f in result["findings"]}
    assert {"sweep.step_time_slope", "sweep.decode_collapse", "sweep.commit_length_long_context"} <= ids
    assert result["metrics"]["context_tokens"] == CONTEXTS and result["metrics"]["failed"] == 0
    assert result["metrics"]["step_ms"] == pytest.approx([r["step_ms"] for r in rows])

    # The same run folder again: every request is already measured, nothing is sent or appended.
    run_notebook("01_baseline_sweep", **params)
    assert len(Run.open(run_dir).rows("sweep")) == len(CONTEXTS)


def test_context_beyond_the_server_is_refused_before_any_request(embedded_server, run_notebook,
                                                                 tmp_path: Path) -> None:
    import papermill

    run_dir = tmp_path / "run"
    with pytest.raises(papermill.PapermillExecutionError, match="context_length"):
        run_notebook("01_baseline_sweep", server_url=embedded_server.url, run_dir=str(run_dir),
                     context_lengths=[128, 50_000_000], max_new_tokens=8)
    assert not (run_dir / "sweep.jsonl").exists()


def test_replay_of_the_published_reference_run(run_notebook, tmp_path: Path) -> None:
    """The committed reference run (data/reference/ct200-kimi-k26: the investigation's step 1 table), replayed
    without a server. The publication gives no commit length per context, so none may appear."""
    from specdiag.paths import REFERENCE_DIR

    src = Run.open(REFERENCE_DIR / "ct200-kimi-k26")
    published = {r["context_tokens"]: r for r in src.rows("sweep")}
    out = tmp_path / "replay"
    run_notebook("01_baseline_sweep", replay_dir=str(src.path), run_dir=str(out))
    result = json.loads((out / "findings" / "01_baseline_sweep.json").read_text())
    found = {f["id"]: f for f in result["findings"]}
    collapse = found["sweep.decode_collapse"]
    assert collapse["numbers"]["decode_collapse_x"] == pytest.approx(118.6 / 0.7)  # the publication's "169x"
    assert collapse["severity"] == "critical" and collapse["source"] == "published"
    slope = found["sweep.step_time_slope"]["numbers"]
    # end points (1430 - 8.4) ms over 183.6k tokens: the publication's "about 7.7 ms per 1,000 tokens"
    assert slope["endpoint_slope_ms_per_1k_tokens"] == pytest.approx((1430 - 8.4) / 183.6)
    assert round(slope["endpoint_slope_ms_per_1k_tokens"], 1) == 7.7
    assert 7.0 < slope["slope_ms_per_1k_tokens"] < 7.7  # least squares over all six contexts (computed: 7.37)
    assert found["sweep.step_time_slope"]["severity"] == "warning"
    # no per-context commit length was published: no commit finding, no commit numbers
    assert "sweep.commit_length_long_context" not in found
    assert result["metrics"]["commit_length"] == [None] * len(published)
    assert result["metrics"]["context_tokens"] == sorted(published)
    assert result["metrics"]["step_ms"] == [published[c]["step_ms"] for c in sorted(published)]
    assert result["metrics"]["source"] == "published" and result["metrics"]["requests"] == 6
    assert not (out / "sweep.jsonl").exists()  # replay measures nothing
    assert Run.open(out).meta["replay_of"] == "data/reference/ct200-kimi-k26"  # project-relative: run.json is shared


def test_failed_requests_keep_their_rows_and_an_all_failed_sweep_raises(run_notebook, tmp_path: Path,
                                                                         monkeypatch) -> None:
    """A server that refuses every /generate (HTTP 400): each request leaves a row with its error, the
    findings are still written, and the notebook ends with an error naming the failure."""
    import sys

    import papermill

    sys.path.insert(0, str(Path(__file__).parent))
    import sglang_replay_server as replay

    def refuse(handler, body):  # noqa: ANN001 - the replay server's handler
        handler._send(400, {"error": {"message": "the input is too long for this pretend server"}})

    monkeypatch.setattr(replay._Handler, "_generate", refuse)
    run_dir = tmp_path / "run"
    with replay.ReplayServer() as server:
        with pytest.raises(papermill.PapermillExecutionError, match="every one of the 2 sweep requests failed"):
            run_notebook("01_baseline_sweep", server_url=server.url, run_dir=str(run_dir), context_lengths=[16, 32],
                         max_new_tokens=4, prompt_kind="predictable")
    rows = Run.open(run_dir).rows("sweep")
    assert [r["context_tokens"] for r in rows] == [16, 32]
    assert all("too long for this pretend server" in r["error"] for r in rows)
    result = json.loads((run_dir / "findings" / "01_baseline_sweep.json").read_text())
    assert {f["id"] for f in result["findings"]} - {"sweep.other_traffic"} == {"sweep.failed_requests"}
    assert result["metrics"]["failed"] == 2
