"""scripts/device/sglang_site.sh, the staging and plugin install every SGLang device job sources, run here in bash."""

from __future__ import annotations

import hashlib
import io
import subprocess
import sys
import tarfile
from pathlib import Path

import lzma
import pytest

from specdiag.paths import PROJECT_ROOT

SITE_SH = PROJECT_ROOT / "scripts/device/sglang_site.sh"


def sh(cmd: str, cwd: Path, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "-c", f". {SITE_SH}; {cmd}"], cwd=cwd, capture_output=True, text=True,
                          env={"PATH": "/usr/bin:/bin", **env})


def fake_parts(tmp: Path, sums_ok: bool = True, staged: int = 1) -> tuple[Path, Path]:
    """A site tarball (sglang/version.py) in pieces: ``staged`` of them in stage/ (part.00 ..) and the last in
    work/.rs2/ (with SHA256SUMS)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        data = b"__version__ = '0.5.17'\n"
        info = tarfile.TarInfo("sglang/version.py")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    blob = lzma.compress(buf.getvalue())
    stage, work = tmp / "stage", tmp / "work"
    (work / ".rs2").mkdir(parents=True)
    stage.mkdir()
    cuts = [len(blob) * i // (staged + 1) for i in range(staged + 2)]
    for i in range(staged):
        (stage / f"part.{i:02d}").write_bytes(blob[cuts[i]:cuts[i + 1]])
    (work / ".rs2" / f"part.{staged:02d}").write_bytes(blob[cuts[staged]:])
    digest = hashlib.sha256(blob if sums_ok else b"other").hexdigest()
    (work / ".rs2" / "SHA256SUMS").write_text(f"{digest}  sglang-0.5.17-site.tar.xz\n")
    return stage, work


@pytest.mark.parametrize("staged", [1, 3])
def test_stage_joins_checks_and_extracts(tmp_path: Path, staged: int) -> None:
    """Two pieces (.rs1 then .rs2) or four (.rsA-.rsC staged, then .rs2: a checkout of 41 MB leaves a call ~20 MB)."""
    stage, work = fake_parts(tmp_path, staged=staged)
    r = sh(f"stage_sglang_site {tmp_path}/site {tmp_path}/log t", work, STAGE_DIR=str(stage))
    assert r.returncode == 0, r.stdout + r.stderr
    assert (tmp_path / "site/sglang/version.py").read_text().startswith("__version__")
    assert "extracted SGLang" in (tmp_path / "log").read_text()
    # a second call finds the site and does nothing
    for part in stage.glob("part.*"):
        part.unlink()
    assert sh(f"stage_sglang_site {tmp_path}/site {tmp_path}/log t", work, STAGE_DIR=str(stage)).returncode == 0


@pytest.mark.parametrize("case,rc", [("bad sha256", 3), ("no parts", 2)])
def test_stage_refuses_with_a_reason(tmp_path: Path, case: str, rc: int) -> None:
    stage, work = fake_parts(tmp_path, sums_ok=case != "bad sha256")
    if case == "no parts":
        (stage / "part.00").unlink()
    r = sh(f"stage_sglang_site {tmp_path}/site {tmp_path}/log t", work, STAGE_DIR=str(stage))
    assert r.returncode == rc
    assert "FAILED" in (tmp_path / "log").read_text() and not (tmp_path / "site/sglang").exists()


def test_install_plugin_declares_the_entry_point(tmp_path: Path) -> None:
    python_dir = Path(sys.executable).parent  # the job's python3: the project's here, the image's on the device
    r = sh(f"install_plugin {tmp_path}/plugin {tmp_path}/log t", PROJECT_ROOT, PATH=f"{python_dir}:/usr/bin:/bin")
    assert r.returncode == 0, r.stdout + r.stderr
    assert (tmp_path / "plugin/specdiag_sglang_plugin/hook.py").is_file()
    eps = list((tmp_path / "plugin").glob("*.dist-info/entry_points.txt"))
    assert eps and "specdiag_splitkv = specdiag_sglang_plugin:register" in eps[0].read_text()



def _plugin_diag():
    """scripts/sglang_plugin_diag.py as a module (it imports its sibling sglang_plugin_check)."""
    import importlib  # noqa: PLC0415

    sys.path.insert(0, str(PROJECT_ROOT / "scripts"))
    try:
        return importlib.import_module("sglang_plugin_diag")
    finally:
        sys.path.remove(str(PROJECT_ROOT / "scripts"))

def test_plugin_diag_places_tp1_arms_on_the_gpus_there_are():
    """The TP 1 arms were planned for two GPUs (stock on 0, the rest on 1); on a one-GPU machine they all run on
    GPU 0 (a call on nvidia-h200 of 2026-11-30 started them on an invisible GPU 1: "No CUDA runtime is found").
    A TP 2 phase on one GPU stops before any server starts, naming the device kind."""
    diag = _plugin_diag()
    one = diag.place_arms(diag.ARMS_TP1, 1, 1)
    assert {arm: g for arm, (_, g, _) in one.items()} == {arm: "0" for arm in diag.ARMS_TP1}
    two = diag.place_arms(diag.ARMS_TP1, 2, 1)
    assert {arm: g for arm, (_, g, _) in two.items()} == {arm: g for arm, (_, g, _) in diag.ARMS_TP1.items()}
    assert diag.place_arms(diag.ARMS_TP2, 2, 2) == diag.ARMS_TP2
    with pytest.raises(SystemExit, match="nvidia-h200-x2"):
        diag.place_arms(diag.ARMS_TP2, 1, 2)
    with pytest.raises(SystemExit, match="no GPU"):
        diag.place_arms(diag.ARMS_TP1, 0, 1)


def test_plugin_diag_sweep_order_is_repeat_major():
    diag = _plugin_diag()
    reqs = [{"context_tokens": c, "repeat": r} for c in (16384, 65536, 131072) for r in range(3)]
    order = [(q["repeat"], q["context_tokens"]) for q in diag.round_robin(reqs)]
    assert order == [(r, c) for r in range(3) for c in (16384, 65536, 131072)]


@pytest.mark.parametrize(("env", "needle"), [({"GPU_TESTS_S": "20"}, "GPU_TESTS_S >= 35"),
                                             ({"GPU_TESTS_S": "x"}, "GPU_TESTS_S >= 35"),
                                             ({"TOTAL": "350"}, "TOTAL >= 400")])
def test_plugin_job_refuses_budgets_too_small_to_start_a_server(tmp_path: Path, env: dict, needle: str) -> None:
    """On the H200 (2026-12-01, commit ef95753): GPU_TESTS_S=20 left the launch gate 5 s and the job stopped with no server; TOTAL=350 left four
    servers no time to capture and start. The job refuses both before any work, naming the setting and the fix."""
    import os

    job = PROJECT_ROOT / "scripts" / "device" / "sglang_plugin_job.sh"
    res = subprocess.run(["bash", str(job)], cwd=tmp_path, capture_output=True, text=True,
                         env={**os.environ, "OUT": str(tmp_path / "out"), **env})
    assert res.returncode == 2 and needle in res.stderr and "set " in res.stderr
    assert not (tmp_path / "out").exists()  # nothing written: refused before the work starts


def test_check_summary_judges_fp8_calls_against_the_exact_reference():
    """On a bf16 cache the check server's calls are judged against SGLang's output; on an fp8 cache against the exact
    fp32 reference of the fp8 cache (SGLang's kernel casts q and P to fp8: its own error is reported beside)."""
    import importlib  # noqa: PLC0415

    sys.path.insert(0, str(PROJECT_ROOT / "scripts"))
    try:
        check = importlib.import_module("sglang_plugin_check")
    finally:
        sys.path.remove(str(PROJECT_ROOT / "scripts"))
    base = {"layer": 0, "prefix_tokens": [1000], "draft_tokens": 2, "heads": 8, "finite": True}
    bf16 = check.check_summary([{**base, "rel_err": 1.6e-3}, {**base, "rel_err": 1.8e-3}])
    assert bf16["passed"] and bf16["judged_by"] == "SGLang's output" and bf16["max_judged_err"] == 1.8e-3
    assert bf16["fp8_calls"] == 0 and bf16["max_sglang_rel_err_ref"] is None
    fp8 = [{**base, "rel_err": 3e-2, "rel_err_ref": 1.7e-3, "sglang_rel_err_ref": 3e-2},
           {**base, "rel_err": 2.5e-2, "rel_err_ref": 1.6e-3, "sglang_rel_err_ref": 2.4e-2}]
    got = check.check_summary(fp8)
    assert got["passed"] and got["judged_by"] == "the fp32 reference of the fp8 cache"
    assert got["max_judged_err"] == 1.7e-3 and got["max_rel_err"] == 3e-2 and got["max_sglang_rel_err_ref"] == 3e-2
    assert not check.check_summary([{**fp8[0], "rel_err_ref": 2e-2}])["passed"]
    assert not check.check_summary([])["passed"]
