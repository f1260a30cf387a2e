"""The report pipeline: papermill execution into a run folder, offline HTML, the index, failures."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import nbformat
import pytest

from specdiag import report
from specdiag.runs import Run

NB_OK = [
    nbformat.v4.new_markdown_cell("# Tiny\nA test notebook. A plain link: <https://example.org/doc>."),
    nbformat.v4.new_code_cell('server_url: str = ""  # url\nrun_dir: str = ""  # run\nreplay_dir: str = ""  # replay\n'
                              "n: int = 3  # rows", metadata={"tags": ["parameters"]}),
    nbformat.v4.new_code_cell("import matplotlib.pyplot as plt\nfrom specdiag.runs import Run\nrun = Run.create(run_dir)\n"
                              "for i in range(n):\n    run.append_row('t', {'i': i, 'error': None})\n"
                              "fig, ax = plt.subplots(); ax.plot([1, 2], [3, 4]); ax.set_xlabel('context (tokens)')\n"
                              "plt.show()\nprint('SECRET-CODE-NOT-IN-HTML' if False else 'visible output')"),
    nbformat.v4.new_code_cell("from specdiag.findings import Finding\n"
                              "run.write_result('00_tiny', [Finding('t.n', 'rows', f'{n} rows', 'ok', ('counted',), {'n_rows': n})],"
                              " {'n_rows': n})"),
]
NB_FAIL = [
    nbformat.v4.new_markdown_cell("# Failing"),
    nbformat.v4.new_code_cell('server_url: str = ""  # url\nrun_dir: str = ""  # run\nreplay_dir: str = ""  # replay',
                              metadata={"tags": ["parameters"]}),
    nbformat.v4.new_code_cell("raise RuntimeError('the server went away at 32k')"),
]


def _write(folder: Path, name: str, cells: list) -> None:
    nb = nbformat.v4.new_notebook(cells=cells)
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, str(folder / f"{name}.ipynb"))


@pytest.fixture
def notebooks(tmp_path: Path) -> Path:
    folder = tmp_path / "notebooks"
    folder.mkdir()
    _write(folder, "00_tiny", NB_OK)
    _write(folder, "01_failing", NB_FAIL)
    return folder


def test_execute_render_index(notebooks: Path, tmp_path: Path) -> None:
    run = Run.create(tmp_path / "run")
    shared = {"server_url": "", "run_dir": str(run.path), "replay_dir": ""}
    results = report.run_notebooks(["00_tiny", "01_failing"], run, shared, {"00_tiny": {"n": 2}}, notebooks)
    assert [r.status for r in results] == ["ok", "failed"]
    assert "the server went away at 32k" in results[1].error
    index = report.render_run(run, results)
    assert len(run.rows("t")) == 2
    html_ok = (run.path / "html" / "00_tiny.html").read_text()
    html_fail = (run.path / "html" / "01_failing.html").read_text()
    assert "visible output" in html_ok and "data:image/png;base64" in html_ok
    assert "run.append_row" not in html_ok, "code must not reach the HTML"
    assert "the server went away at 32k" in html_fail
    for page in (html_ok, html_fail, index.read_text()):
        assert report.network_references(page) == []
    idx = index.read_text()
    assert "00_tiny" in idx and "failed" in idx and "n_rows" in idx
    assert (run.path / "findings.json").exists()
    assert run.meta["report"]["statuses"] == {"00_tiny": "ok", "01_failing": "failed"}


def test_network_references() -> None:
    page = ('<script src="https://cdn.example/require.js"></script><a href="https://docs.example">doc</a>'
            '<link rel="stylesheet" href="//fonts.example/css"><style>@import url("https://x/y.css");'
            ".a{background:url(data:image/png;base64,AAA)}</style><img src=\"data:image/png;base64,AA\">")
    assert report.network_references(page) == ["https://cdn.example/require.js", "//fonts.example/css", "https://x/y.css"]


def test_params_file_rules(tmp_path: Path) -> None:
    declared = {"server_url": {}, "run_dir": {}, "replay_dir": {}, "context_lengths": {}}
    params = {"context_lengths": [1, 2], "max_new_tokens": 9, "01_x": {"context_lengths": [3]}}
    assert report.parameters_for("00_y", declared, {"run_dir": "r"}, params) == {"run_dir": "r", "context_lengths": [1, 2]}
    assert report.parameters_for("01_x", declared, {}, params)["context_lengths"] == [3]
    with pytest.raises(ValueError, match="does not declare: typo"):
        report.parameters_for("01_x", declared, {}, {"01_x": {"typo": 1}})
    with pytest.raises(ValueError, match="does not exist"):
        report.load_params_file(str(tmp_path / "missing.yaml"))


def test_select_notebooks(notebooks: Path) -> None:
    assert report.select_notebooks(["00"], notebooks) == ["00_tiny"]
    with pytest.raises(ValueError, match="no notebook named"):
        report.select_notebooks(["99"], notebooks)


def test_a_default_report_runs_the_findings_page_last() -> None:
    """07 summarizes every notebook's findings, the later-numbered steps (10, 11) included."""
    chosen = report.select_notebooks(None)
    assert chosen[-1] == "07_findings" and {"10_kv_layout", "06_kernel_ab"} <= set(chosen[:-1])
    assert "08_compare_runs" not in chosen


def test_unreachable_server_fails_fast_naming_the_url(tmp_path: Path) -> None:
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "specdiag.report", "run", "--server", "http://127.0.0.1:9",
                           "--run-dir", str(tmp_path / "run")], capture_output=True, text=True, timeout=60)
    elapsed = time.monotonic() - t0
    assert proc.returncode == 2, proc.stderr
    assert "http://127.0.0.1:9" in proc.stderr
    assert elapsed < 10
    assert not (tmp_path / "run").exists(), "an unreachable server must leave no run folder behind"


@pytest.mark.parametrize("invoked_as, word", [("make", "SERVER"), ("", "--server")])
def test_an_unreachable_server_is_named_as_the_user_set_it(tmp_path: Path, invoked_as: str, word: str) -> None:
    """make report SERVER=...: the line says SERVER; specdiag report --server: it says --server; never server_url."""
    env = {**__import__("os").environ, "SPECDIAG_INVOKED_AS": invoked_as}
    proc = subprocess.run([sys.executable, "-m", "specdiag.report", "run", "--server", "127.0.0.1:9",
                           "--run-dir", str(tmp_path / "run")], capture_output=True, text=True, timeout=60, env=env)
    assert proc.returncode == 2 and f"{word} must start with http:// or https://" in proc.stderr, proc.stderr
    assert "server_url" not in proc.stderr and not (tmp_path / "run").exists()


def test_bad_parameters_stop_the_report_before_any_engine_starts(tmp_path: Path) -> None:
    """A context_lengths the notebooks cannot take, given in PARAMS, is one line naming it and the PARAMS file, exit
    2, in seconds: no engine started, no run folder; 1k and 128k are token counts (k = 1,024)."""
    bad = tmp_path / "bad.yaml"
    bad.write_text("01_baseline_sweep:\n  context_lengths: [1k, lots]\n")
    env = {**__import__("os").environ, "SPECDIAG_INVOKED_AS": "make"}
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "specdiag.report", "run", "--params", str(bad), "--run-dir",
                           str(tmp_path / "run")], capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip() == (
        "[specdiag] error: context_lengths: 'lots' is not a token count; give a whole number of tokens such as 4096, "
        "or 1k / 32k / 128k (k = 1,024 tokens): set it in the PARAMS file (make ... PARAMS=file.yaml) (a "
        "01_baseline_sweep parameter)")
    assert "starting" not in proc.stdout and not (tmp_path / "run").exists()
    assert time.monotonic() - t0 < 60
    good = {"context_lengths": ["1k", "128k"], "01_baseline_sweep": {"context_lengths": "2k,4k"}, "repeats": 2}
    checked = report.checked_params_file(["01_baseline_sweep", "09_engine_ab"], good, "set it")
    assert checked == {"context_lengths": [1024, 131072], "01_baseline_sweep": {"context_lengths": [2048, 4096]},
                       "repeats": 2}
    for params, words in (({"01_baselin": {}}, "names 01_baselin, which is no notebook"),
                          ({"01_baseline_sweep": 3}, "must hold that notebook's parameters as a mapping"),
                          ({"01_baseline_sweep": {"repeats": "two"}}, "repeats must be a whole number; got 'two'"),
                          ({"01_baseline_sweep": {"typo": 1}}, "does not declare: typo")):
        with pytest.raises(ValueError, match=words):
            report.checked_params_file(["01_baseline_sweep"], params, "set it")


def test_params_files_match_the_notebooks() -> None:
    """Every params/*.yaml section names a notebook and only parameters it declares."""
    from specdiag.paths import NOTEBOOKS_DIR, PARAMS_DIR

    files = sorted(PARAMS_DIR.glob("*.yaml"))
    assert files
    for path in files:
        params = report.load_params_file(str(path))
        for key in params:
            if report._is_notebook_key(key):
                declared = report.declared_parameters(NOTEBOOKS_DIR / f"{key}.ipynb")
                report.parameters_for(key, declared, {}, params)  # raises on an undeclared key


def test_a_web_server_that_is_no_llm_server_gets_one_short_error(tmp_path: Path) -> None:
    """SERVER pointing at `python -m http.server`: one short line naming what answered (status, content type, server
    header, first bytes) and what was expected, not the HTML pages it answered; no run folder."""
    site = tmp_path / "site"
    site.mkdir()
    server = subprocess.Popen([sys.executable, "-m", "http.server", "0", "--bind", "127.0.0.1"], cwd=site,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        line = server.stdout.readline()  # "Serving HTTP on 127.0.0.1 port 41234 (http://127.0.0.1:41234/) ..."
        url = f"http://127.0.0.1:{line.split(' port ')[1].split()[0]}"
        proc = subprocess.run([sys.executable, "-m", "specdiag.report", "run", "--server", url,
                               "--run-dir", str(tmp_path / "run")], capture_output=True, text=True, timeout=60)
    finally:
        server.terminate()
        server.wait(timeout=10)
    err = proc.stderr.strip()
    assert proc.returncode == 2, err
    assert len(err.splitlines()) == 1 and len(err) < 600, err
    assert f"{url} is not an SGLang or vLLM server" in err
    assert "GET /v1/models: HTTP 404, text/html, server SimpleHTTP/" in err and 'body "<!DOCTYPE HTML>' in err
    assert "Expected SGLang's /server_info or vLLM's /v1/models" in err
    assert "Error code explanation" not in err  # none of the HTML pages themselves
    assert not (tmp_path / "run").exists()


def test_the_run_index_keeps_a_recorded_runs_findings_apart(tmp_path: Path) -> None:
    """index.html: a notebook that showed a recorded run (06 without a GPU) lists its findings collapsed under the
    recorded run's name, not as the run's; findings.json says where they came from; numbers rounded."""
    from specdiag.findings import Finding
    from specdiag.report.execute import NotebookResult
    from specdiag.report.render import collect_results
    from specdiag.report.index import write_run_index
    from specdiag.runs import Run

    run = Run.create(tmp_path / "run", server_url="http://127.0.0.1:1")
    run.write_result("01_baseline_sweep", [Finding("sweep.decode_collapse", "Decode", "falls", "critical")],
                     metrics={"step_ms": 9.512345678901234})
    run.write_result("06_kernel_ab", [Finding("kernel_ab.baseline_starves", "Baseline", "starves", "critical")],
                     recorded_from="data/reference/kernel-ab-h200")
    results = [NotebookResult("01_baseline_sweep", "ok", 1.0), NotebookResult("06_kernel_ab", "ok", 1.0)]
    collect_results(run, results)
    page = write_run_index(run, results).read_text()
    row_06 = page.split("06_kernel_ab", 1)[1]
    assert "<details><summary><small>1 findings of the recorded run <code>data/reference/kernel-ab-h200</code>" in row_06
    assert "9.51" in page and "9.512345678901234" not in page
    assert json.loads((run.path / "findings.json").read_text())["06_kernel_ab"]["recorded_from"] == \
        "data/reference/kernel-ab-h200"


def test_a_kernel_gets_longer_than_papermills_minute_to_start(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    # Beside a loaded server on 2 cores a kernel took over papermill's default 60 s to answer and the notebook failed
    # before its first cell: the report (and the tests, through conftest) give it KERNEL_START_TIMEOUT_S.
    import papermill

    from specdiag.report import execute

    seen: dict = {}
    monkeypatch.setattr(papermill, "execute_notebook", lambda *args, **kwargs: seen.update(kwargs))
    execute.execute_notebook("00_tiny", Run.create(tmp_path / "run"), {})
    assert seen["start_timeout"] == execute.KERNEL_START_TIMEOUT_S >= 180


def test_the_runs_index_lists_every_run_escaped_and_offline(tmp_path: Path) -> None:
    """data/runs/index.html (Jinja2, templates/index/): newest first, a link only where the run has its index, text
    escaped, nothing loaded from the network."""
    from specdiag.report.index import write_runs_index

    Run.create(tmp_path / "a-run", server_url="http://gpu-host:30000/?a=<b>")
    run = Run.create(tmp_path / "b-run", replay_of="data/reference/x")
    run.update(report={"statuses": {"00_snapshot": "ok", "01_baseline_sweep": "failed"}})
    (run.path / "index.html").write_text("", encoding="utf-8")
    page = write_runs_index(tmp_path).read_text()
    assert page.index("b-run") < page.index("a-run")
    assert '<a href="b-run/index.html">b-run</a>' in page and 'href="a-run/' not in page
    assert "?a=&lt;b&gt;" in page and "00_snapshot: ok, 01_baseline_sweep: failed" in page
    assert "not run through the report" in page and report.network_references(page) == []
