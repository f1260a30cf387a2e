from __future__ import annotations

import json

import pytest

from specdiag.findings import Finding
from specdiag.runs import Run
from specdiag.serving.redaction import REDACTED, redact


def test_redact_keys_flags_and_text() -> None:
    snap = {
        "api_key": "sk-secret-value-1234567890",
        "hf_token": "hf_abcdefghijklmnopqrstuvwxyz",
        "max_new_tokens": 64,
        "prompt_tokens": 10,
        "tokenizer_path": "/models/x",
        "launch_command": "python -m sglang.launch_server --api-key abc123 --model m",
        "nested": [{"Authorization": "Bearer xyz"}, "curl -H 'Authorization: Bearer tok123'"],
        "admin_api_key": None,
        "url": "http://user:pw@host:30000",
    }
    out = redact(snap)
    assert out["api_key"] == REDACTED and out["hf_token"] == REDACTED
    assert out["max_new_tokens"] == 64 and out["prompt_tokens"] == 10 and out["tokenizer_path"] == "/models/x"
    assert "abc123" not in out["launch_command"] and "--api-key REDACTED" in out["launch_command"]
    assert out["nested"][0]["Authorization"] == REDACTED
    assert "tok123" not in out["nested"][1]
    assert out["admin_api_key"] is None
    assert "pw@" not in out["url"]


def test_rows_survive_and_resume(tmp_path) -> None:
    run = Run.create(tmp_path / "r", params={"a": 1})
    run.append_row("sweep", {"context_tokens": 1024, "error": None})
    run.append_row("sweep", {"context_tokens": 2048, "error": "timeout"})
    with open(run.table_path("sweep"), "a") as fh:  # a crash mid-write leaves a torn line
        fh.write('{"context_tokens": 40')
    rows = run.rows("sweep")
    assert [r["context_tokens"] for r in rows] == [1024, 2048]
    assert run.done_keys("sweep", ["context_tokens"]) == {(1024,)}
    again = Run.create(tmp_path / "r", params={"b": 2})
    assert again.meta["params"] == {"a": 1, "b": 2}
    assert again.meta["run_id"] == "r"


def test_secrets_never_reach_disk(tmp_path) -> None:
    run = Run.create(tmp_path / "r", server={"api_key": "supersecret"})
    run.append_row("t", {"token": "supersecret2", "n": 1})
    text = "".join(p.read_text() for p in (tmp_path / "r").iterdir())
    assert "supersecret" not in text


def test_write_result_and_results(tmp_path) -> None:
    run = Run.create(tmp_path / "r")
    f = Finding("x.y", "t", "v", "warning", ("e1",), {"slope_ms_per_1k_tokens": 7.7}, "published")
    run.write_result("01_baseline_sweep", [f], {"n_rows": 2})
    res = run.results()["01_baseline_sweep"]
    assert res["findings"][0]["numbers"]["slope_ms_per_1k_tokens"] == 7.7
    assert res["metrics"] == {"n_rows": 2}


def test_open_missing_run_says_how(tmp_path) -> None:
    with pytest.raises(FileNotFoundError, match="no run.json"):
        Run.open(tmp_path / "nothing")


def test_bad_table_name(tmp_path) -> None:
    with pytest.raises(ValueError, match="table name"):
        Run.create(tmp_path / "r").append_row("../x", {})


def test_paths_are_shown_relative_to_the_project(tmp_path, monkeypatch) -> None:
    """Shared pages hold no absolute path of the machine that made them."""
    import sys

    from specdiag.paths import PROJECT_ROOT, REFERENCE_DIR, ShownPath, relative_to_project, shown

    ref = Run.open(REFERENCE_DIR / "ct200-kimi-k26")
    assert isinstance(ref.path, ShownPath)
    assert f"{ref.path}" == "data/reference/ct200-kimi-k26" and f"{ref.path / 'run.json'}".endswith("26/run.json")
    assert str(ref.path) == str(REFERENCE_DIR / "ct200-kimi-k26")  # file operations keep the absolute path
    assert relative_to_project(PROJECT_ROOT / "data" / "runs" / "x") == "data/runs/x"
    assert relative_to_project(tmp_path) == str(tmp_path)  # outside the project: unchanged
    monkeypatch.setenv("HOME", str(tmp_path))
    assert shown(tmp_path / "a" / "b") == "~/a/b"
    assert not shown(sys.executable).startswith(str(PROJECT_ROOT))


def test_a_relative_run_dir_is_relative_to_the_project(monkeypatch, tmp_path) -> None:
    from specdiag.paths import PROJECT_ROOT

    monkeypatch.chdir(tmp_path)  # papermill runs notebooks in notebooks/: the folder must not follow the cwd
    run = Run.create("data/runs/test-relative-run-dir")
    try:
        assert run.path == PROJECT_ROOT / "data" / "runs" / "test-relative-run-dir"
        assert not (tmp_path / "data").exists()
    finally:
        import shutil

        shutil.rmtree(run.path)
