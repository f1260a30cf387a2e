"""The H200 jobs of 10 and 11 and their drivers, here: the job scripts parse, every arm's server gets the layout
recorder and the right verify mode, every MoE server the recorder flags, two calls' runs merge into one, and (slow)
the KV-layout job runs end to end on embedded servers."""

from __future__ import annotations

import argparse
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

from specdiag.paths import PROJECT_ROOT
from specdiag.runs import Run

JOBS = [PROJECT_ROOT / "scripts/device/kv_layout_job.sh", PROJECT_ROOT / "scripts/device/moe_batch1_job.sh"]


def _script(name: str):
    spec = importlib.util.spec_from_file_location(name, PROJECT_ROOT / "scripts" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("job", JOBS, ids=lambda p: p.name)
def test_job_scripts_parse(job: Path) -> None:
    r = subprocess.run(["bash", "-n", str(job)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    text = job.read_text()
    assert ". scripts/device/sglang_site.sh" in text and "stage_sglang_site" in text


def test_every_kv_layout_arm_records_its_layout(tmp_path: Path) -> None:
    kvl = _script("kv_layout")
    args = argparse.Namespace(site="/tmp/site", plugin_path="/tmp/plugin", flashinfer_ws="/tmp/fi")
    for arm, verify in (("triton", "off"), ("plugin", "splitkv"), ("flashinfer", "off")):
        env = kvl.arm_env(arm, args, tmp_path)
        assert env["SPECDIAG_SGLANG_LAYOUT"] == "1" and env["SPECDIAG_SGLANG_STATS"] == str(tmp_path / f"stats-{arm}")
        assert env["SPECDIAG_SGLANG_VERIFY"] == verify
        assert ("SGLANG_PLUGINS" in env) == (verify != "off")
        assert env["PYTHONPATH"].split(os.pathsep)[:2] == ["/tmp/site", "/tmp/plugin"]
    assert kvl.ARMS["flashinfer"]["backend"] == "flashinfer"


def test_moe_servers_carry_the_recorder_flags() -> None:
    moe = _script("moe_batch1")
    args = argparse.Namespace(max_total_tokens=100000)
    flags = moe.server_flags(8, args, routed=True)
    for a, b in (("--expert-distribution-recorder-mode", "per_pass"), ("--expert-distribution-recorder-buffer-size", "-1")):
        assert flags[flags.index(a) + 1] == b
    assert "--enable-return-routed-experts" in flags
    assert "--enable-return-routed-experts" not in moe.server_flags(8, args, routed=False)


def test_two_calls_merge_into_one_run(tmp_path: Path) -> None:
    kvl = _script("kv_layout")
    for i, arm in enumerate(("triton", "flashinfer")):
        r = Run.create(tmp_path / f"call{i}")
        r.update(kv_layout_arms=[{"arm": arm}], data_source="measured", kv_layout_plan={"arms": [arm]},
                 command=f"kv_layout.py --arms {arm}")
        for state in ("fresh", "fragmented"):
            r.append_row("kv_layout", {"arm": arm, "pool_state": state, "context_tokens": 1024, "repeat": 0})
    assert kvl.merge(str(tmp_path / "all"), [str(tmp_path / "call0"), str(tmp_path / "call1")]) == 0
    merged = Run.open(tmp_path / "all")
    assert len(merged.rows("kv_layout")) == 4
    assert [a["arm"] for a in merged.meta["kv_layout_arms"]] == ["triton", "flashinfer"]
    assert [(p["call"], p["arms"], p["command"]) for p in merged.meta["kv_layout_plans"]] == [
        (1, ["triton"], "kv_layout.py --arms triton"), (2, ["flashinfer"], "kv_layout.py --arms flashinfer")]
    # a later call extends the merge: its rows continue the call numbers
    assert kvl.merge(str(tmp_path / "all"), [str(tmp_path / "call0")]) == 0
    assert sorted({r["call"] for r in Run.open(tmp_path / "all").rows("kv_layout")}) == [1, 2, 3]


@pytest.mark.slow
def test_kv_layout_job_dry_run_on_embedded_servers(tmp_path: Path) -> None:
    env = {**os.environ, "OUT": str(tmp_path / "out"), "WORK": str(tmp_path / "work"), "ENGINE": "embedded",
           "ARMS": "a", "CONTEXTS": "1024", "POOL": "3072", "PYTHON": sys.executable}
    r = subprocess.run(["bash", str(JOBS[0])], cwd=PROJECT_ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    rows = Run.open(tmp_path / "out/kv-layout").rows("kv_layout")
    assert {x["pool_state"] for x in rows} == {"fresh", "fragmented"} and all(x["error"] is None for x in rows)
    assert (tmp_path / "out/kv-layout-logs.tar.gz").exists()
