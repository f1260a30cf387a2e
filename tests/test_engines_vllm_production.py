"""A real vLLM started the production way (docs/production.md): ngram speculation, per-request speculative metrics on, NO dev
mode (no /server_info, no cache reset) and ``--api-key``; notebooks 00, 01, 03 and 04 run against it as a new user
would, with ``SPECDIAG_API_KEY`` in the environment. Then the same port gets a restarted server that reports its
speculative counts on /metrics only: 04 still probes (commit lengths from counter differences), the run says which
notebooks saw which server, and 01 measured beside a bounded load generator flags its rows.

Marked ``engines`` (``make test-engines``); its own module, so its servers start after the other modules' stopped.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, Iterator

import pytest
import requests

sys.path.insert(0, str(Path(__file__).parent))

from load_generator import LoadGenerator  # noqa: E402
from test_engines_vllm import CONTEXT_LENGTH, counters_commit_length, rows_commit_length  # noqa: E402

from specdiag.launchers import engine_server  # noqa: E402
from specdiag.process import free_port  # noqa: E402
from specdiag.runs import Run  # noqa: E402
from specdiag.serving import VLLMClient, make_client  # noqa: E402
from specdiag.serving.http import API_KEY_ENV  # noqa: E402

pytestmark = [pytest.mark.engines]

KEY = "sk-prod-vllm-SECRET-4242424242"
# The command a user would type: vLLM's own flags, nothing of the suite's.
NGRAM = {"method": "ngram", "num_speculative_tokens": 7, "prompt_lookup_max": 4, "prompt_lookup_min": 2}


class OnePort:
    """The module's vLLM servers, one after the other on one port (a restart, as a user's server would have)."""

    def __init__(self, tmp_path_factory: pytest.TempPathFactory) -> None:
        self.factory = tmp_path_factory
        self.port = free_port()
        self.server: Any = None

    def start(self, name: str, spec_metrics: str) -> str:
        self.stop()
        log = self.factory.mktemp(name) / "server.log"
        self.server = engine_server("vllm", algorithm="NGRAM", num_draft_tokens=8, context_length=CONTEXT_LENGTH,
                                    dev_mode=False, api_key=KEY, spec_metrics=spec_metrics, port=self.port,
                                    log_path=log, startup_timeout_s=420.0, progress=False)
        self.server.start()
        return self.server.url

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop()
            self.server = None


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[OnePort]:
    holder = OnePort(tmp_path_factory)
    try:
        yield holder
    finally:
        holder.stop()


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("prod-run") / "run"


@pytest.fixture(scope="module")
def production(servers: OnePort) -> str:
    url = servers.start("vllm-production", "detailed")
    cmd = " ".join(servers.server.command)
    assert "--api-key" in cmd and json.dumps(NGRAM) in cmd and "--per-request-spec-decode-metrics detailed" in cmd
    assert servers.server.env.get("VLLM_SERVER_DEV_MODE") == "0"
    return url


@pytest.fixture(scope="module")
def restarted(production: str, servers: OnePort) -> str:
    """The production server stopped; on its port, a server that reports speculation on /metrics only."""
    url = servers.start("vllm-counters-only", "none")
    assert "--per-request-spec-decode-metrics" not in " ".join(servers.server.command) and url == production
    return url


@pytest.fixture(autouse=True)
def _key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(API_KEY_ENV, KEY)


def test_settings_come_from_what_the_production_server_exposes(production: str) -> None:
    client = make_client(production)
    st = client.settings()
    assert st.cache_reset is False and st.speculating is True and st.speculative_method is None
    assert (st.draft_steps, st.tokens_per_step) == (7, 8)
    assert "vllm:spec_decode_*" in st.source("speculating") and "position labels" in st.source("draft_steps")
    assert "speculative_config" in st.source("speculative_method")  # what it could not see, and what to pass
    assert "method not exposed" in st.speculation_line()
    stated = VLLMClient(production, speculative_config=NGRAM).settings()
    assert (stated.speculative_method, stated.algorithm, stated.tokens_per_step) == ("ngram", "NGRAM", 8)
    # control: the same prompt twice, no unique head: vLLM serves the second one's prefix from its cache
    ids = client.tokenize("The cat sat on the mat. " * 80)[:512]
    sampling = {"max_new_tokens": 16, "temperature": 0.0, "ignore_eos": True}
    first, second = (client.generate(input_ids=ids, sampling_params=sampling) for _ in range(2))
    assert first.error is None and second.error is None and second.cached_tokens > 0
    with pytest.raises(Exception, match=API_KEY_ENV):
        VLLMClient(production, api_key="sk-wrong-key-000000000").models()


def test_notebooks_00_01_03_04_against_the_production_server(production: str, run_notebook: Any, run_dir: Path) -> None:
    run_notebook("00_snapshot", server_url=production, run_dir=str(run_dir))
    run_notebook("01_baseline_sweep", server_url=production, run_dir=str(run_dir), context_lengths=[256, 1024],
                 max_new_tokens=32, prompt_kind="novel")
    run_notebook("03_drafter_inspection", server_url=production, run_dir=str(run_dir), context_lengths=[256, 1024],
                 max_new_tokens=16, repeats=1)  # the configuration and the rows' keys, not verdicts
    before = requests.get(f"{production}/metrics", timeout=30).text
    run_notebook("04_commit_probe", server_url=production, run_dir=str(run_dir), context_lengths=[256, 1024],
                 max_new_tokens=48, kinds=["predictable", "novel"], repeats=1)  # keys and counters, not verdicts
    after = requests.get(f"{production}/metrics", timeout=30).text
    run = Run.open(run_dir)
    assert run.meta["server_engine"] == "vllm" and run.meta["server"]["speculative_decoding"] is True
    snapshot = {f["id"]: f for f in json.loads((run_dir / "findings" / "00_snapshot.json").read_text())["findings"]}
    assert snapshot["snapshot.speculation"]["title"] == "Speculative decoding is on (method not exposed)"
    sweep = run.rows("sweep")
    assert len(sweep) == 2 and all(r["error"] is None and r["prompt_tokens_match"] for r in sweep)
    probe = run.rows("commit_probe")
    assert len(probe) == 4 and all(r["error"] is None and r["max_commit_length"] == 8 for r in probe)
    for r in sweep + probe:  # no reset without dev mode: every prompt got its own head, so nothing came from cache
        assert r["cache_flushed"] is False and "dev mode" in r["cache_note"] and r.get("cached_tokens", 0) == 0
        assert r["spec_source"] == "per-request metrics (metrics.speculative_decoding)" and r["other_traffic"] is False
    # the probe's commit lengths against the server's own counters, over the same requests: within 10%
    ours, server = rows_commit_length(probe), counters_commit_length(before, after)
    assert ours == pytest.approx(server, rel=0.10), (ours, server)
    by_kind = {k: [r["commit_length"] for r in probe if r["kind"] == k] for k in ("predictable", "novel")}
    assert min(by_kind["predictable"]) > max(by_kind["novel"]), by_kind
    assert run.rows("drafter_timing") and all(r["error"] is None for r in run.rows("drafter_timing"))
    on_disk = b"".join(p.read_bytes() for p in run_dir.rglob("*") if p.is_file())
    assert KEY.encode() not in on_disk


def test_counters_only_restart_and_other_traffic(restarted: str, run_notebook: Any, run_dir: Path,
                                                 tmp_path: Path) -> None:
    # 04 again in the same run, on the restarted server, at a context not measured yet: commit lengths from /metrics
    before = requests.get(f"{restarted}/metrics", timeout=30).text
    run_notebook("04_commit_probe", server_url=restarted, run_dir=str(run_dir), context_lengths=[768],
                 max_new_tokens=48, kinds=["predictable", "novel"], repeats=1)
    after = requests.get(f"{restarted}/metrics", timeout=30).text
    run = Run.open(run_dir)
    new = [r for r in run.rows("commit_probe") if r["context_tokens"] == 768]
    assert len(new) == 2 and all(r["error"] is None for r in new)
    assert all(r["spec_source"] == "/metrics difference around the request" and r["commit_length_reliable"] for r in new)
    assert rows_commit_length(new) == pytest.approx(counters_commit_length(before, after), rel=0.10)
    # the run says which notebooks saw which server
    assert any("restarted" in line for line in run.meta["server_changes"]["04_commit_probe"])
    run_notebook("07_findings", run_dir=str(run_dir))
    page = {f["id"]: f for f in json.loads((run_dir / "findings" / "07_findings.json").read_text())["findings"]}
    servers = page["run.servers"]
    assert servers["severity"] == "warning" and servers["title"] == "The server changed during the run"
    assert servers["numbers"]["notebooks_by_server"] == [["00_snapshot", "01_baseline_sweep", "03_drafter_inspection"],
                                                         ["04_commit_probe"]]
    assert "restarted" in servers["verdict"]
    # 01 beside a bounded load on 127.0.0.1: its rows are flagged, their counter commit lengths unreliable
    other = tmp_path / "traffic-run"
    with LoadGenerator(restarted, "vllm", concurrency=2, max_requests=400, max_new_tokens=256, max_seconds=180,
                       api_key=KEY) as load:  # bounded; it stops when the block ends
        load.wait_busy()
        run_notebook("01_baseline_sweep", server_url=restarted, run_dir=str(other), context_lengths=[256, 512],
                     max_new_tokens=32, prompt_kind="predictable")
    assert load.errors == 0
    rows = Run.open(other).rows("sweep")
    assert rows and all(r["error"] is None and r["other_traffic"] is True for r in rows)
    assert all(r["commit_length_reliable"] is False for r in rows if r["spec_source"].startswith("/metrics"))
    sweep = {f["id"]: f for f in json.loads((other / "findings" / "01_baseline_sweep.json").read_text())["findings"]}
    assert sweep["sweep.other_traffic"]["severity"] == "warning"
    assert sweep["sweep.other_traffic"]["numbers"]["disturbed"] == len(rows)
