"""Shared test fixtures: GPU skipping, Jupyter state out of HOME, one embedded server per session,
and a papermill runner for notebook tests."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest

from specdiag.paths import NOTEBOOKS_DIR, PROJECT_ROOT


def _cuda_available() -> bool:
    try:
        import torch

        return bool(torch.cuda.is_available())
    except Exception:  # noqa: BLE001
        return False


def pytest_configure(config: pytest.Config) -> None:
    # Keep Jupyter/IPython/matplotlib state inside the project for every kernel the tests start.
    from specdiag.report import apply_local_jupyter_env

    apply_local_jupyter_env()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # Tests against a real engine (a vLLM server this session starts) run only when asked for by marker
    # (`make test-engines`: -m engines); plain `make test` deselects them.
    if "engines" not in (config.getoption("-m") or ""):
        engines = [item for item in items if "engines" in item.keywords]
        if engines:
            config.hook.pytest_deselected(items=engines)
            items[:] = [item for item in items if "engines" not in item.keywords]
    if os.environ.get("PYTEST_XDIST_WORKER"):
        # In pytest-xdist workers (make test): the modules with notebook or embedded-server tests first, whole modules
        # in their order, so their long tests start early and the many short ones fill the end instead of one worker
        # finishing a notebook test alone. Module fixtures are still set up once; a plain run keeps the file order.
        heavy = {item.module.__name__ for item in items if isinstance(item, pytest.Function)
                 and (item.get_closest_marker("notebook") or "embedded_server" in item.fixturenames)}
        items.sort(key=lambda item: getattr(item, "module", None) is None or item.module.__name__ not in heavy)
    if _cuda_available():
        return
    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU (run `make test-gpu` on a GPU host)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)


@pytest.fixture(scope="session")
def embedded_server() -> Iterator[Any]:
    """One embedded server (STANDALONE drafter, 8 draft tokens, CPU) shared by the session's tests."""
    from specdiag.localserver import EmbeddedServer

    models = PROJECT_ROOT / "data" / "models" / "target"
    if not models.exists():
        pytest.fail(f"no embedded model at {models}: the trained models ship in data/models/")
    with EmbeddedServer(algorithm="STANDALONE", num_draft_tokens=8, device="cpu") as server:
        yield server


@pytest.fixture(scope="session")
def embedded_dflash_server() -> Iterator[Any]:
    """One embedded DFLASH server (the default DFlash drafter for the shipped target, no draft window, CPU)."""
    from specdiag.localserver import EmbeddedServer

    with EmbeddedServer(algorithm="DFLASH", num_draft_tokens=None, device="cpu") as server:
        yield server


@pytest.fixture
def run_notebook(tmp_path: Path) -> Callable[..., Path]:
    """Execute ``notebooks/<name>.ipynb`` with papermill and the given parameters; returns the
    executed notebook's path. ``run_dir`` defaults to a fresh folder under tmp_path."""
    import papermill

    from specdiag.report.execute import KERNEL_START_TIMEOUT_S

    def _run(name: str, **parameters: Any) -> Path:
        parameters.setdefault("run_dir", str(tmp_path / "run"))
        out = tmp_path / f"{name}.out.ipynb"
        papermill.execute_notebook(str(NOTEBOOKS_DIR / f"{name}.ipynb"), str(out), parameters=parameters,
                                   kernel_name="python3", cwd=str(NOTEBOOKS_DIR), progress_bar=False,
                                   start_timeout=KERNEL_START_TIMEOUT_S)
        leaked = [o["data"]["text/plain"] for cell in json.loads(out.read_text())["cells"]
                  for o in cell.get("outputs", []) if o.get("output_type") == "execute_result"
                  and re.match(r"(ShownPath|PosixPath|Run|Context)\(", str(o.get("data", {}).get("text/plain", "")))]
        assert not leaked, f"{name}: a cell's last line shows a return value in the report: {leaked}"
        return out

    return _run


@pytest.fixture
def small_cpu_measurements(monkeypatch: pytest.MonkeyPatch) -> None:
    """specdiag.hardware's real CPU measurements, on small sizes: a 16 MiB copy instead of 256 MiB and 128 x 128
    matmuls instead of 1,024 x 1,024. What is measured and how the peak is resolved from it stay the library's;
    in-process callers only (a notebook kernel or a subprocess measures at full size)."""
    from specdiag import hardware

    copy, matmul = hardware.measure_copy_bandwidth, hardware.measure_matmul_rate

    def small_copy(device: str = "cpu", n_bytes: int = 256 * 2**20, repeats: int = 5, warmup: int = 2) -> list[float]:
        return copy(device, n_bytes=min(n_bytes, 16 * 2**20), repeats=repeats, warmup=warmup)

    def small_matmul(device: str = "cpu", n: int = 2048, repeats: int = 5, warmup: int = 2,
                     dtype: str = "bfloat16") -> list[float]:
        return matmul(device, n=min(n, 128), repeats=repeats, warmup=warmup, dtype=dtype)

    monkeypatch.setattr(hardware, "measure_copy_bandwidth", small_copy)
    monkeypatch.setattr(hardware, "measure_matmul_rate", small_matmul)
