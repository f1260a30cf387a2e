"""Every flag and variable an arm configures reaches its server's command or environment (SGLang: DFLASH's
drafter, block and window, forced acceptance, the check arm, speculation off, TP/EP; the plugin's modes, allocator,
stats and path; the embedded engine's flags), and a launcher's settings error stops the sweep before any start."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from specdiag.paths import PROJECT_ROOT
from specdiag.sweep.arms import ArmsError, load_arms, parse_arms
from specdiag.sweep.driver import preflight
from specdiag.sweep.servers import (
    PARALLEL_FLAGS,
    Host,
    arm_env,
    recorded_env,
    server_command,
)

ARMS_DIR = PROJECT_ROOT / "params" / "arms"
HOST = Host(work=Path("/w"), site="/tmp/site", plugin_path="/tmp/plugin")


def flag(cmd: list[str], name: str) -> str | None:
    return cmd[cmd.index(name) + 1] if name in cmd else None


def arm(name: str, path: str = "engine-ab-ngram.yaml"):
    return next(a for a in load_arms(ARMS_DIR / path).arms if a.name == name)


def test_dflash_arms_pass_the_drafter_block_window_and_forced_acceptance() -> None:
    a = arm("triton_plugin", "engine-ab-dflash.yaml")
    cmd = server_command(a, HOST)
    assert flag(cmd, "--speculative-algorithm") == "DFLASH"
    assert flag(cmd, "--speculative-draft-model-path") == "/tmp/dflash61-kimi-k2.6-tp8"
    assert flag(cmd, "--speculative-num-draft-tokens") == "8" and flag(cmd, "--speculative-dflash-block-size") == "8"
    assert flag(cmd, "--speculative-draft-window-size") == "2048"
    env = arm_env(a, HOST)
    assert env["SGLANG_SIMULATE_ACC_LEN"] == "4" and env["SPECDIAG_SGLANG_VERIFY"] == "splitkv"
    assert env["SGLANG_PLUGINS"] == "specdiag_splitkv" and env["SPECDIAG_SGLANG_STATS"] == "/w/stats-triton_plugin"


def test_the_check_arm_and_the_hybrids_and_speculation_off() -> None:
    check = arm("triton_plugin_check")
    assert "--disable-cuda-graph" in server_command(check, HOST)
    assert arm_env(check, HOST)["SPECDIAG_SGLANG_CHECK"] == "1"
    hybrid = server_command(arm("fi_prefill_plugin"), HOST)
    assert flag(hybrid, "--prefill-attention-backend") == "flashinfer"
    assert flag(hybrid, "--speculative-attention-mode") == "decode" and flag(hybrid, "--attention-backend") == "triton"
    assert arm_env(arm("triton_upstream"), HOST)["SPECDIAG_SGLANG_VERIFY"] == "upstream"
    off = server_command(arm("flashinfer_nospec"), HOST)
    assert "--speculative-algorithm" not in off and flag(off, "--attention-backend") == "flashinfer"
    stock = arm_env(arm("triton"), HOST)
    assert stock["SPECDIAG_SGLANG_VERIFY"] == "off" and "SGLANG_PLUGINS" not in stock
    assert "/tmp/plugin" not in stock["PYTHONPATH"].split(os.pathsep) and "SGLANG_SIMULATE_ACC_LEN" not in stock
    assert stock["FLASHINFER_WORKSPACE_BASE"] == "/tmp/fi-ws"
    ngram = server_command(arm("triton"), HOST)
    assert flag(ngram, "--speculative-num-draft-tokens") == "8" and flag(ngram, "--max-total-tokens") == "260000"
    assert flag(ngram, "--mem-fraction-static") == "0.2" and flag(ngram, "--context-length") == "200000"


def test_a_server_over_several_gpus_gets_tp_ep_and_nccls_all_reduce() -> None:
    a = parse_arms({"arms": [{"name": "x", "engine": "sglang", "model": "/m", "tp": 8, "ep": 8, "eplb": True},
                             {"name": "y", "engine": "sglang", "model": "/m"}]}).arms
    cmd = server_command(a[0], HOST)
    assert flag(cmd, "--tp-size") == "8" and flag(cmd, "--ep-size") == "8" and "--enable-eplb" in cmd
    assert set(PARALLEL_FLAGS) <= set(cmd)
    one = server_command(a[1], HOST)
    assert flag(one, "--tp-size") == "1" and not set(PARALLEL_FLAGS) & set(one) and "--ep-size" not in one


def test_every_kv_layout_arm_records_its_layout_with_its_allocator() -> None:
    for a in load_arms(ARMS_DIR / "kv-layout.yaml").arms:
        env = arm_env(a, HOST)
        assert env["SPECDIAG_SGLANG_LAYOUT"] == "1" and env["SPECDIAG_SGLANG_STATS"] == f"/w/stats-{a.name}"
        assert env["SPECDIAG_SGLANG_VERIFY"] == ("splitkv" if a.name.startswith("plugin") else "off")
        assert env["SPECDIAG_SGLANG_KV_ALLOC"] == ("contiguous" if a.name.endswith("_contiguous") else "sglang")
        assert env["PYTHONPATH"].split(os.pathsep)[:2] == ["/tmp/site", "/tmp/plugin"]
        assert "--disable-radix-cache" in server_command(a, HOST)


def test_moe_servers_carry_the_recorder_flags_and_their_t() -> None:

    for a in load_arms(ARMS_DIR / "moe-batch1.yaml").arms:
        cmd = server_command(a, HOST)
        assert flag(cmd, "--expert-distribution-recorder-mode") == "per_pass"
        assert flag(cmd, "--expert-distribution-recorder-buffer-size") == "-1"
        assert "--enable-return-routed-experts" in cmd
        t = int(a.name[1:])
        assert flag(cmd, "--speculative-num-draft-tokens") == (str(t) if t > 1 else None)


def test_the_recorder_folder_reaches_the_server(tmp_path: Path) -> None:
    from dataclasses import replace

    from specdiag.steps.moe_batch1.measure import sweep_env

    a = arm("t8", "moe-batch1.yaml")
    env = arm_env(a, replace(HOST, extra_env=sweep_env(a, tmp_path)))
    assert env["SGLANG_EXPERT_DISTRIBUTION_RECORDER_DIR"] == str(tmp_path / "edr-t8")


def test_embedded_arms_get_their_flags() -> None:
    a = parse_arms({"arms": [{"name": "e", "engine": "embedded", "kv_alloc": "contiguous", "max_total_tokens": 4096,
                              "speculation": {"algorithm": "DFLASH", "block_size": 4, "window": 64},
                              "flags": ["--chunked-prefill-size", "512"], "env": {"X": "1"}}]}).arms[0]
    cmd = server_command(a, HOST, port=5)
    assert flag(cmd, "--speculative-algorithm") == "DFLASH" and flag(cmd, "--speculative-dflash-block-size") == "4"
    assert flag(cmd, "--speculative-draft-window-size") == "64" and flag(cmd, "--kv-alloc") == "contiguous"
    assert flag(cmd, "--max-total-tokens") == "4096" and flag(cmd, "--port") == "5"
    assert cmd[-2:] == ["--chunked-prefill-size", "512"] and arm_env(a, HOST) == {"X": "1"}


def test_the_recorded_env_keeps_no_host_path_and_no_secret() -> None:
    env = recorded_env({"PYTHONPATH": "/tmp/site", "SPECDIAG_API_KEY": "s3cret", "SPECDIAG_SGLANG_VERIFY": "off"})
    assert "PYTHONPATH" not in env and env["SPECDIAG_SGLANG_VERIFY"] == "off" and "s3cret" not in str(env)


def test_a_launcher_settings_error_stops_the_sweep_before_any_start() -> None:
    bad = parse_arms({"arms": [{"name": "ok", "engine": "embedded"},
                               {"name": "std", "engine": "sglang", "model": "/m",
                                "speculation": {"algorithm": "STANDALONE", "draft_tokens": 4}}]})
    with pytest.raises(ArmsError, match="arm 'std': STANDALONE needs a drafter"):
        preflight(bad, HOST)


class _FakeServer:
    url = "http://127.0.0.1:1"
    command = ["fake"]
    ready_after_s = 0.1

    def __init__(self, fail_start: bool = False) -> None:
        self.fail_start, self.events = fail_start, []

    def start(self, timeout_s: float | None = None) -> "_FakeServer":
        self.events.append(("start", timeout_s))
        if self.fail_start:
            raise RuntimeError("not ready")
        return self

    def stop(self) -> None:
        self.events.append(("stop",))


@pytest.mark.parametrize("inside,fail_start", [(None, False), (RuntimeError("measured badly"), False),
                                               (KeyboardInterrupt(), False), (None, True)])
def test_a_started_server_is_stopped_however_its_block_ends(monkeypatch, inside, fail_start) -> None:
    """serving: the one path that stops an arm's server, after the block, an error in it, Ctrl-C, or a failed start;
    a running server (url) is neither started nor stopped."""
    from specdiag.sweep import servers

    fake = _FakeServer(fail_start)
    monkeypatch.setattr(servers, "make_server", lambda arm, host, startup_timeout_s: fake)
    arm = parse_arms({"arms": [{"name": "a", "engine": "embedded"}]}).arms[0]
    raised = RuntimeError if fail_start else type(inside) if inside else None
    try:
        with servers.serving(arm, servers.Host(work=Path("/tmp")), 30.0, 12.0) as server:
            assert server is fake
            if inside is not None:
                raise inside
    except BaseException as exc:  # noqa: BLE001
        assert raised is not None and isinstance(exc, raised)
    else:
        assert raised is None
    assert fake.events == [("start", 12.0), ("stop",)]
    live = parse_arms({"arms": [{"name": "b", "url": "http://gpu:30000"}]}).arms[0]
    with servers.serving(live, servers.Host(work=Path("/tmp")), 30.0) as server:
        assert (server.url, server.command, server.ready_after_s) == ("http://gpu:30000", None, None)
    assert fake.events == [("start", 12.0), ("stop",)]
