"""Execute notebooks/00_snapshot.ipynb: against the embedded server (settings, model and this
machine saved in run.json) and against a pretend SGLang server whose info holds secrets (redacted)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from specdiag.runs import Run

pytestmark = [pytest.mark.notebook, pytest.mark.slow]


def test_snapshot_of_the_embedded_server(embedded_server, run_notebook, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    run_notebook("00_snapshot", server_url=embedded_server.url, run_dir=str(run_dir))
    meta = Run.open(run_dir).meta
    assert meta["server"]["speculative_algorithm"] == "STANDALONE"
    assert meta["server"]["speculative_num_draft_tokens"] == 8
    assert isinstance(meta["server"]["context_length"], int) and meta["server"]["context_length"] > 0
    assert meta["model"]["model_path"]
    # the configs this host reads are kept, so 03 and 05 replay the run without the model folders
    assert meta["model"]["model_config"]["num_hidden_layers"] >= 1
    assert meta["drafter"]["model_config"] and meta["drafter"]["server_view"]["speculative_algorithm"] == "STANDALONE"
    hw = meta["hardware"]
    assert hw["where"].startswith("this machine") and hw["machine"]["cpu_cores"] >= 1
    assert hw["memory_bandwidth_gb_s"] > 0 and hw["memory_bandwidth_source"] in ("nvml", "table", "measured")
    result = json.loads((run_dir / "findings" / "00_snapshot.json").read_text())
    ids = {f["id"] for f in result["findings"]}
    assert {"snapshot.speculation", "snapshot.attention", "snapshot.peak_bandwidth"} <= ids
    assert result["metrics"]["speculative_algorithm"] == "STANDALONE"


def test_secrets_in_server_info_never_reach_disk(run_notebook, tmp_path: Path, monkeypatch) -> None:
    sys.path.insert(0, str(Path(__file__).parent))
    import sglang_replay_server as replay

    secret = "sk-specdiagTESTsecret0123456789"
    monkeypatch.setitem(replay.SERVER_INFO, "api_key", secret)
    monkeypatch.setitem(replay.SERVER_INFO, "launch_command", f"python -m sglang.launch_server --api-key {secret}")
    run_dir = tmp_path / "run"
    with replay.ReplayServer() as server:
        out = run_notebook("00_snapshot", server_url=server.url, run_dir=str(run_dir))
    meta = Run.open(run_dir).meta
    assert meta["server"]["api_key"] == "REDACTED"
    assert meta["server"]["speculative_algorithm"] == replay.SERVER_INFO["speculative_algorithm"]
    for path in [out, *run_dir.rglob("*")]:
        if path.is_file():
            assert secret not in path.read_text(errors="replace"), f"secret in {path}"


def test_snapshot_replays_a_recorded_run(run_notebook, tmp_path: Path) -> None:
    """The investigation's published deployment (data/reference/ct200-kimi-k26), shown without a server."""
    from specdiag.paths import REFERENCE_DIR

    ref = Run.open(REFERENCE_DIR / "ct200-kimi-k26")
    run_dir = tmp_path / "run"
    run_notebook("00_snapshot", replay_dir=str(ref.path), run_dir=str(run_dir))
    meta = Run.open(run_dir).meta
    assert meta["server"]["speculative_algorithm"] == ref.meta["server"]["speculative_algorithm"]
    assert meta["hardware"]["memory_bandwidth_gb_s"] == ref.meta["hardware"]["memory_bandwidth_gb_s"]
    assert meta["hardware"]["where"] == "recorded run"
    result = json.loads((run_dir / "findings" / "00_snapshot.json").read_text())
    found = {f["id"]: f for f in result["findings"]}
    assert found["snapshot.speculation"]["source"] == "published"
    assert found["snapshot.peak_bandwidth"]["numbers"]["memory_bandwidth_gb_s"] == pytest.approx(
        ref.meta["hardware"]["memory_bandwidth_gb_s"])
