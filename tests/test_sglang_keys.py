"""SGLang's two keys (docs/production.md): the replay server enforces SGLang 0.5.17's rules exactly as recorded from its
wheel (tests/data/sglang-0.5.17/auth.json), and the client sends each key where it belongs: ``SPECDIAG_API_KEY`` to
/generate, /server_info, /tokenize, ...; ``SPECDIAG_ADMIN_API_KEY`` (else the API key) to the admin endpoints
(/flush_cache, /start_profile, ...). A 401 or 403 names the endpoint and the variable to set; without the admin key a
run still measures: no flush, fresh prompts, rows that say so. The keys never reach disk."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from sglang_replay_server import AUTH, ReplayServer, decide, route_level  # noqa: E402

from specdiag.serving import SGLangClient, ServerError, make_client  # noqa: E402
from specdiag.serving.errors import ServerAuthError  # noqa: E402
from specdiag.serving.http import ADMIN_API_KEY_ENV, API_KEY_ENV, auth_hint  # noqa: E402

RAW = Path(__file__).parent / "data" / "sglang-0.5.17" / "raw-tiny-ngram"
API, ADMIN = "sk-api-SECRET-1111111111", "sk-admin-SECRET-2222222222"
SERVER_KEYS = {"none": (None, None), "api_key": ("KEY-A", None), "admin_api_key": (None, "KEY-B"),
               "both": ("KEY-A", "KEY-B")}
WHEEL = Path(os.environ.get("SPECDIAG_SGLANG_WHEEL", "/tmp/sglwhl/sglang-0.5.17-cp311-cp311-manylinux_2_34_x86_64.whl"))


@pytest.fixture(autouse=True)
def _no_keys_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(API_KEY_ENV, raising=False)
    monkeypatch.delenv(ADMIN_API_KEY_ENV, raising=False)


def test_the_replay_decides_every_recorded_case_as_sglang_0517() -> None:
    assert AUTH["source"]["version"] == "0.5.17"
    for d in AUTH["decisions"]:
        api, admin = SERVER_KEYS[d["server_keys"]]
        allowed, status = decide("POST", AUTH["paths"][d["path"]], AUTH["headers"][d["header"]], api, admin, d["level"])
        assert (allowed, None if allowed else status) == (d["allowed"], d["status"]), d
    assert route_level("POST", "/flush_cache") == route_level("GET", "/start_profile") == "ADMIN_OPTIONAL"
    assert route_level("POST", "/dumper/anything") == "ADMIN_OPTIONAL"  # a path parameter
    assert route_level("POST", "/generate") == route_level("GET", "/server_info") == "NORMAL"
    assert route_level("POST", "/hicache/storage-backend") == "NORMAL"  # no POST route there: no level
    from specdiag.serving.sglang import SGLangClient as C

    recorded = {r["path"] for r in AUTH["levels"] if "{" not in r["path"] and not r["path"].startswith("/hicache")}
    assert recorded <= C.ADMIN_PATHS, recorded - C.ADMIN_PATHS  # the client knows every admin endpoint


@pytest.mark.skipif(not WHEEL.exists(), reason="SGLang 0.5.17's wheel is not here (SPECDIAG_SGLANG_WHEEL)")
def test_the_recorded_rules_are_the_wheels(tmp_path: Path) -> None:
    out = tmp_path / "auth.json"
    subprocess.run([sys.executable, str(Path(__file__).parents[1] / "scripts" / "record_sglang_auth.py"), str(WHEEL),
                    str(out)], check=True, capture_output=True)
    assert json.loads(out.read_text()) == AUTH


def _auth(server: ReplayServer, path: str) -> list[str | None]:
    return [r.headers.get("Authorization") for r in server.requests if r.path.split("?")[0] == path]


def test_both_keys_each_where_it_belongs() -> None:
    with ReplayServer(recorded=RAW, api_key=API, admin_api_key=ADMIN) as srv:
        client = make_client(srv.url, api_key=API, admin_api_key=ADMIN)
        assert client.engine == "sglang" and client.settings().speculating is True
        assert client.flush_cache() is True and client.reset_note is None
        assert client.tokenize("The cat sat on the mat.")
        trace = client.generate(input_ids=[1, 2, 3], sampling_params={"max_new_tokens": 32}, stream=True)
        assert trace.error is None and trace.completion_tokens == 32
        assert set(_auth(srv, "/flush_cache")) == {f"Bearer {ADMIN}"}
        for path in ("/server_info", "/generate", "/tokenize"):
            assert set(_auth(srv, path)) == {f"Bearer {API}"}, path
        assert API not in repr(client) and ADMIN not in repr(client) and client.keys_set == {
            API_KEY_ENV: True, ADMIN_API_KEY_ENV: True}


def test_without_the_admin_key_a_run_still_measures_and_says_why_there_was_no_flush() -> None:
    from specdiag.measure.sweep_plan import make_plan, measure_request

    with ReplayServer(recorded=RAW, api_key=API, admin_api_key=ADMIN) as srv:
        client = SGLangClient(srv.url, api_key=API)
        assert client.flush_cache() is False
        note = client.reset_note
        assert "POST /flush_cache" in note and "HTTP 401" in note and ADMIN_API_KEY_ENV in note
        plan = make_plan([1024], 32, 2, "novel", 0, True)
        rows = [measure_request(client, q, plan) for q in plan.requests()]
        flushes = len(_auth(srv, "/flush_cache"))
        prompts = [r.body["input_ids"] for r in srv.requests if r.path == "/generate"]
    assert flushes == 1  # refused once: not asked again
    for row in rows:
        assert row["error"] is None and row["cache_flushed"] is False and ADMIN_API_KEY_ENV in row["cache_note"]
    assert prompts[0][:8] != prompts[1][:8]  # each prompt got its own head instead of a flush


def test_a_missing_or_refused_key_names_the_endpoint_and_the_variable() -> None:
    with ReplayServer(recorded=RAW, api_key=API, admin_api_key=ADMIN) as srv:
        with pytest.raises(ServerError, match=API_KEY_ENV):
            make_client(srv.url)  # detection: every info endpoint wants the API key
        client = SGLangClient(srv.url)
        trace = client.generate(input_ids=[1, 2], sampling_params={"max_new_tokens": 4})
        assert trace.error_kind == "http" and "POST /generate" in trace.error and API_KEY_ENV in trace.error
        with pytest.raises(ServerAuthError) as info:
            client.server_info()
        assert (info.value.endpoint, info.value.variable, info.value.status) == ("GET /server_info", API_KEY_ENV, 401)
        wrong = SGLangClient(srv.url, api_key=API, admin_api_key="sk-not-the-admin-key-333")
        assert wrong.flush_cache() is False and "refused the key in SPECDIAG_ADMIN_API_KEY" in wrong.reset_note
    assert auth_hint(403, True, True, False)[0] == ADMIN_API_KEY_ENV


def test_a_server_with_only_the_api_key_takes_it_on_its_admin_endpoints() -> None:
    with ReplayServer(recorded=RAW, api_key=API) as srv:
        client = SGLangClient(srv.url, api_key=API, admin_api_key="sk-an-admin-key-it-does-not-have")
        assert client.flush_cache() is True and client.flush_cache() is True
        assert _auth(srv, "/flush_cache")[-1] == f"Bearer {API}"
        assert len(_auth(srv, "/flush_cache")) == 3  # the admin key once, then the API key, remembered


def _report_with_both_keys(tmp_path: Path, notebooks: list[str]) -> None:
    """A report run of ``notebooks`` against the recorded SGLang 0.5.17 with both keys set: every notebook ok, the
    admin key only on /flush_cache, the API key on the rest, neither key anywhere in the run folder."""
    params = tmp_path / "params.yaml"
    params.write_text("context_lengths: [1024]\nmax_new_tokens: 32\ncontext_tokens: 1024\nmodel_config: embedded-target\n"
                      "memory_bandwidth_gb_s: 4800.0\nmatmul_tflops: 989.0\nidle_s: 0.2\n")
    run_dir = tmp_path / "run"
    with ReplayServer(recorded=RAW, metrics_static=True, api_key=API, admin_api_key=ADMIN) as srv:
        env = {**os.environ, API_KEY_ENV: API, ADMIN_API_KEY_ENV: ADMIN}
        out = subprocess.run([sys.executable, "-m", "specdiag.report", "run", "--server", srv.url, "--params",
                              str(params), "--run-dir", str(run_dir), "--notebooks", *notebooks], env=env,
                             capture_output=True, text=True, timeout=600)
        flush, other = _auth(srv, "/flush_cache"), [r for r in srv.requests if r.path != "/flush_cache"]
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert f"{len(notebooks)} of {len(notebooks)} notebooks ok" in out.stdout + out.stderr
    assert flush and set(flush) == {f"Bearer {ADMIN}"}
    assert all(r.headers.get("Authorization") in (f"Bearer {API}", None) for r in other)
    for path in run_dir.rglob("*"):
        if path.is_file():
            data = path.read_bytes()
            assert API.encode() not in data and ADMIN.encode() not in data, path
    sweep = [json.loads(line) for line in (run_dir / "sweep.jsonl").read_text().splitlines()]
    assert sweep and all(r["cache_flushed"] is True and r["other_traffic"] is False for r in sweep)


@pytest.mark.notebook
def test_every_kind_of_request_the_notebooks_send_with_both_keys(tmp_path: Path) -> None:
    """00 and 01 send every kind of request 00-07 send (recorded per notebook against this replay): besides the
    report's /health and /v1/models, 00 sends /server_info, /metrics and /model_info, 01 /server_info, /metrics,
    /tokenize, /flush_cache (the admin key) and /generate (the API key); 02-04 send the same kinds as 01 through the
    same nb.start client, 05 /server_info and /metrics, 06 and 07 nothing more. All eight: the slow test below."""
    _report_with_both_keys(tmp_path, ["00", "01"])


@pytest.mark.notebook
@pytest.mark.slow
def test_every_notebook_against_the_replay_with_both_keys(tmp_path: Path) -> None:
    """00-07 by name: the later steps (10's filler, 11's recorder) need a live engine, not a replay."""
    _report_with_both_keys(tmp_path, [f"{i:02d}" for i in range(8)])
