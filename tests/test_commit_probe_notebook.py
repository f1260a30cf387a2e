"""Notebook 04 executed with papermill: against the embedded server (a tiny ladder) and in replay of the
investigation's published probe rows."""

from __future__ import annotations

import json

import nbformat
import pytest

from specdiag.paths import REFERENCE_DIR
from specdiag.runs import Run


def _findings(run_dir) -> dict:
    return json.loads((run_dir / "findings" / "04_commit_probe.json").read_text())


@pytest.mark.notebook
def test_commit_probe_replays_published_rows(run_notebook, tmp_path) -> None:
    run_dir = tmp_path / "replay"
    out = run_notebook("04_commit_probe", replay_dir=str(REFERENCE_DIR / "ct200-kimi-k26"), run_dir=str(run_dir))
    result = _findings(run_dir)
    assert result["metrics"]["source"] == "published"
    assert result["metrics"]["max_commit_length"] == 8
    assert result["metrics"]["commit_length"]["predictable"] == {"1000": 7.88, "16000": 7.0, "64000": 7.0,
                                                               "128000": 7.88}
    ids = {f["id"]: f for f in result["findings"]}
    # one published request per context: the flat line is tabled, but no verdict is drawn from single requests
    assert ids["probe.predictable_not_enough"]["severity"] == "info" and "probe.predictable_flat" not in ids
    assert "1 / 1 requests" in ids["probe.predictable_not_enough"]["evidence"][1]
    assert "probe.prefill_dominates" in ids
    assert not (run_dir / "commit_probe.jsonl").exists()  # replay sends nothing and records no rows
    assert nbformat.read(str(out), as_version=4).cells  # executed copy written


@pytest.mark.slow
@pytest.mark.notebook
def test_commit_probe_against_embedded_server(run_notebook, embedded_server, tmp_path) -> None:
    run_dir = tmp_path / "live"
    run_notebook("04_commit_probe", server_url=embedded_server.url, run_dir=str(run_dir),
                 context_lengths=[1024, 2048], max_new_tokens=64, repeats=3)
    rows = Run.open(run_dir).rows("commit_probe")
    assert [(r["context_tokens"], r["kind"], r["seed"]) for r in rows] == [
        (c, k, i) for c in (1024, 2048) for i in range(3) for k in ("predictable", "novel")]
    for r in rows:
        assert r["error"] is None, r["error"]
        assert r["prompt_tokens"] == r["context_tokens"]
        assert r["completion_tokens"] == 64
        assert r["max_commit_length"] == 8
        assert 1.0 <= r["commit_length"] <= 8.0
        assert r["wall_s"] > r["prefill_s"] > 0
        assert 0 < r["prefill_share"] < 1
    steps = Run.open(run_dir).rows("commit_probe_steps")
    for r in rows:
        mine = [s["commit_length"] for s in steps
                if (s["context_tokens"], s["kind"], s["seed"]) == (r["context_tokens"], r["kind"], r["seed"])]
        assert len(mine) == r["verify_steps"]
        assert sum(mine) == r["completion_tokens"] - 1
    result = _findings(run_dir)
    assert result["metrics"]["source"] == "measured"
    commit = result["metrics"]["commit_length"]
    assert set(commit["predictable"]) == set(commit["novel"]) == {"1024", "2048"}
    # The shipped drafter copies the repeated sentence (6.30 of 8 at 1k on this CPU, data/models/README.md) and
    # guesses new prose poorly (1.62 at 1k): the probe must show that contrast at every context ...
    for ctx in ("1024", "2048"):
        assert commit["predictable"][ctx] >= 0.5 * 8, (ctx, commit)
        assert commit["novel"][ctx] <= 0.5 * commit["predictable"][ctx], (ctx, commit)
    # ... and read it as the investigation did: sound at long context, the gap is the text.
    found = {f["id"]: f for f in result["findings"]}
    assert found["probe.predictable_flat"]["severity"] == "ok"
    assert "sound at long context" in found["probe.predictable_flat"]["verdict"]
    # the gap is the text where every interval of novel / predictable lies at or below one half; three novel
    # paragraphs can spread wider than that on this CPU (measured: undecided at 2k), and then the page says so
    text = found.get("probe.novel_is_text_difficulty") or found["probe.novel_undecided"]
    assert text["numbers"]["requests_by_context"]["1024"] == [3, 3]
    his = [hi for _, hi in text["numbers"]["interval_by_context"].values()]
    assert (text["id"] == "probe.novel_is_text_difficulty") == all(hi <= 0.5 for hi in his)
    assert not {"probe.predictable_falls", "probe.novel_close_to_predictable"} & set(found)
    assert "3 / 3 requests" in found["probe.predictable_flat"]["evidence"][1]


@pytest.mark.notebook
def test_commit_probe_on_embedded_dflash(run_notebook, embedded_dflash_server, tmp_path) -> None:
    """DFLASH with the random tiny drafter commits about 1 token per step on both texts: 04 says that, and only that."""
    run_dir = tmp_path / "dflash"
    run_notebook("04_commit_probe", server_url=embedded_dflash_server.url, run_dir=str(run_dir),
                 context_lengths=[512, 1024], max_new_tokens=16, repeats=1)
    rows = Run.open(run_dir).rows("commit_probe")
    assert len(rows) == 4 and all(r["error"] is None for r in rows)
    for r in rows:
        assert r["target_forwards"] == r["verify_steps"] and r["steps_without_draft"] == 0
        assert r["tokens_per_target_forward"] == pytest.approx(r["commit_length"])
    result = _findings(run_dir)
    assert result["metrics"]["algorithm"] == "DFLASH"
    assert set(result["metrics"]["tokens_per_target_forward"]["novel"]) == {"512", "1024"}
    found = {f["id"]: f for f in result["findings"]}
    if max(r["commit_length"] for r in rows) <= 1.1:  # the random drafter (a trained one would commit on the cat text)
        assert "probe.drafter_does_not_commit" in found
        assert not {"probe.predictable_flat", "probe.predictable_falls", "probe.novel_is_text_difficulty",
                    "probe.novel_close_to_predictable"} & set(found)
