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
