"""A page computes its data when a section asks (specdiag.nb.Page): each notebook's sections, called in the reverse of
the notebook's order on a recorded run, show what they show in order, and the key numbers are the same. The sections
and their order are read from the notebook itself (its ``page.<section>(pg)`` calls), so a new section is covered."""

from __future__ import annotations

import json
import re
from pathlib import Path

import matplotlib
import matplotlib.pyplot as plt
import pytest

from specdiag import nb
from specdiag.paths import NOTEBOOKS_DIR, REFERENCE_DIR

matplotlib.use("Agg")

#: notebook -> the recorded run it replays here (and the page module's import path).
REPLAYS = {
    "00_snapshot": "ct200-kimi-k26",
    "01_baseline_sweep": "sglang-h200-mla2-stock-traced",
    "02_gpu_utilization": "embedded-h200-utilization",
    "03_drafter_inspection": "sglang-h200-tiny-standalone",
    "04_commit_probe": "sglang-h200-tiny-standalone",
    "05_bandwidth_analysis": "sglang-h200-tiny-standalone",  # its peak is recorded (not measured here)
    "06_kernel_ab": "kernel-ab-h200",
    "09_engine_ab": "sglang-h200-mla61-dflash",
    "10_kv_layout": "sglang-h200-kv-tier0",
    "11_moe_batch1": "sglang-h200-moe-batch1",
}
#: Parameters beside the replay: 06's CPU smoke test measures (tests/test_kernel_ab.py runs it).
EXTRA = {"06_kernel_ab": {"cpu_smoke": False}}
#: Calls of a notebook that are not sections (they write, or check what was written).
NOT_SECTIONS = {"start", "metrics", "write_result", "check_not_all_failed"}


def page_module(notebook: str) -> object:
    source = "".join("".join(c["source"]) for c in json.loads((NOTEBOOKS_DIR / f"{notebook}.ipynb").read_text())["cells"]
                     if c["cell_type"] == "code")
    module = re.search(r"from (specdiag\.steps\.[\w.]+) import (\w+)(?: as page)?", source)
    assert module, f"{notebook} imports no page"
    return __import__(f"{module.group(1)}.{module.group(2)}", fromlist=[module.group(2)])


def sections(notebook: str) -> list[str]:
    """The page's section calls in the notebook's order."""
    cells = json.loads((NOTEBOOKS_DIR / f"{notebook}.ipynb").read_text())["cells"]
    calls = re.findall(r"\bpage\.(\w+)\(\w+\)", "\n".join("".join(c["source"]) for c in cells
                                                         if c["cell_type"] == "code"))
    return [c for c in dict.fromkeys(calls) if c not in NOT_SECTIONS]


def shown(section: object) -> list[tuple[str, str]]:
    """What a section shows, comparably: its text, markdown and HTML as they are (a table's random id left out); a
    table or a figure by kind."""
    out = [(kind, re.sub(r"T_[0-9a-f]{5}", "T_", part) if kind in ("text", "markdown", "html") else kind)
           for kind, part in section.parts]  # type: ignore[attr-defined]
    plt.close("all")
    return out


def _without_paths(value: object, tmp: Path) -> str:
    return re.sub(r"(order|forward)[/\w-]*", "RUN", json.dumps(value, default=str, sort_keys=True)
                  .replace(str(tmp), "TMP"))


@pytest.mark.parametrize("notebook", sorted(REPLAYS))
def test_sections_in_any_order_show_the_same(notebook: str, tmp_path: Path) -> None:
    page = page_module(notebook)
    names = sections(notebook)
    assert len(names) >= 3, names
    replay = str(REFERENCE_DIR / REPLAYS[notebook])
    extra = EXTRA.get(notebook, {})
    forward = page.start({"replay_dir": replay, "run_dir": str(tmp_path / "forward"), **extra})  # type: ignore[attr-defined]
    in_order = {name: shown(getattr(page, name)(forward)) for name in names}
    backward = page.start({"replay_dir": replay, "run_dir": str(tmp_path / "order"), **extra})  # type: ignore[attr-defined]
    reversed_ = {name: shown(getattr(page, name)(backward)) for name in reversed(names)}
    for name in names:
        assert _without_paths(reversed_[name], tmp_path) == _without_paths(in_order[name], tmp_path), name
    assert _without_paths(page.metrics(backward), tmp_path) == _without_paths(page.metrics(forward), tmp_path)


def test_a_page_takes_its_defaults_from_the_parameters_cell_and_refuses_a_stranger(tmp_path: Path) -> None:
    from specdiag.steps.kernel_ab import page

    pg = page.start({"run_dir": str(tmp_path / "run"), "cpu_smoke": False})
    assert pg.params == {**nb.defaults("06_kernel_ab"), "run_dir": str(tmp_path / "run"), "cpu_smoke": False}
    with pytest.raises(nb.ParameterError, match="06_kernel_ab takes no parameter n_run: its parameters cell"):
        page.start({"run_dir": str(tmp_path / "bad"), "n_run": 3})
    assert not (tmp_path / "bad").exists()


def test_every_notebook_opens_its_page_one_way() -> None:
    """One start form for every page: ``pg = page.start(nb.check_parameters(globals()))``; no default is written
    twice (the page takes the notebook's parameters cell as it is)."""
    for path in sorted(NOTEBOOKS_DIR.glob("[0-9][0-9]_*.ipynb")):
        code = "\n".join("".join(c["source"]) for c in json.loads(path.read_text())["cells"] if c["cell_type"] == "code")
        assert re.search(r"^\w+ = page\.start\(nb\.check_parameters\(globals\(\)\)\)$", code, re.M), path.name
