"""Notebook parameters checked from the parameters cell's own annotations (specdiag.nb.check_parameters), and a
parameter error shown on the page as its one line (nb.brief_parameter_errors, through papermill)."""

from __future__ import annotations

import json
import subprocess
import sys

import nbformat
import pytest

from specdiag import nb


def test_each_annotation_is_checked_and_the_message_names_the_fix() -> None:
    ns = {"__annotations__": {"repeats": int, "rate_gb_s": float, "gpus": list[int], "url": str, "on": bool},
          "repeats": 3, "rate_gb_s": 2, "gpus": [0, 1], "url": "", "on": False}
    assert nb.check_parameters(ns) == {k: ns[k] for k in ns["__annotations__"]}  # an int is a float's number
    for name, bad, words in (("repeats", 2.5, "a whole number"), ("repeats", True, "a whole number"),
                             ("rate_gb_s", "fast", "a number"), ("gpus", [0, "1k"], "a list of whole numbers"),
                             ("gpus", 1, "a list of whole numbers"), ("url", None, "a string"),
                             ("on", 1, "True or False")):
        with pytest.raises(nb.ParameterError, match=rf"^{name} must be {words}; got .*papermill -p {name} VALUE"):
            nb.check_parameters({**ns, name: bad})


def test_contexts_take_1k_and_128k_and_the_notebook_sees_token_counts() -> None:
    """A context parameter (named for contexts, or 09's band_edges) takes token counts as people write them; the
    notebook's variables hold the counts after the check (k = 1,024 tokens)."""
    ns = {"__annotations__": {"context_lengths": list[int], "focus_context": int, "band_edges": list[int],
                              "max_new_tokens": int},
          "context_lengths": ["1k", 4096, "128k"], "focus_context": "128k", "band_edges": "8k,64k", "max_new_tokens": 8}
    assert nb.check_parameters(ns) == {"context_lengths": [1024, 4096, 131072], "focus_context": 131072,
                                       "band_edges": [8192, 65536], "max_new_tokens": 8}
    assert ns["context_lengths"] == [1024, 4096, 131072] and ns["focus_context"] == 131072
    with pytest.raises(nb.ParameterError, match=r"^context_lengths: '1.4k' is 1433.6 tokens, not a whole number"):
        nb.check_parameters({**ns, "context_lengths": ["1.4k"]})
    with pytest.raises(nb.ParameterError, match=r"^max_new_tokens must be a whole number; got '1k'"):
        nb.check_parameters({**ns, "max_new_tokens": "1k"})  # not a context: a number as the cell says


def test_token_counts_as_people_write_them() -> None:
    from specdiag.tokens import token_count, token_counts

    assert [token_count(v) for v in (4096, "4096", "1k", "32K", "128k", " 185000 ", "1.5k", "1M", 2048.0)] == [
        4096, 4096, 1024, 32768, 131072, 185000, 1536, 1048576, 2048]
    assert token_counts("1k, 128k") == [1024, 131072] and token_counts(["2k", 512]) == [2048, 512]
    for bad in ("1.4k", "k", "12kb", "-1k", True, None, "1e3"):
        with pytest.raises(ValueError, match="^n: "):
            token_count(bad, "n")


def test_a_parameter_error_is_one_line_on_the_page(tmp_path) -> None:
    book = nbformat.v4.new_notebook()
    book.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    book.cells = [nbformat.v4.new_code_cell("from specdiag import nb\nnb.print_versions()"),
                  nbformat.v4.new_code_cell("repeats: int = 3", metadata={"tags": ["parameters"]}),
                  nbformat.v4.new_code_cell("nb.check_parameters(globals())")]
    src, out = tmp_path / "in.ipynb", tmp_path / "out.ipynb"
    nbformat.write(book, src)
    done = subprocess.run([sys.executable, "-m", "papermill", "-k", "python3", str(src), str(out), "-p", "repeats",
                           "2.5"], capture_output=True, text=True, timeout=120)
    assert done.returncode != 0
    errors = [o for c in json.loads(out.read_text())["cells"] for o in c.get("outputs", [])
              if o["output_type"] == "error"]
    assert [e["traceback"] for e in errors] == [["ParameterError: repeats must be a whole number; got 2.5 (float): "
                                                  "set it in the parameters cell, or with papermill -p repeats VALUE "
                                                  "(make: PARAMS=file.yaml)"]]


def test_live_or_replay_is_decided_once_by_start(tmp_path) -> None:
    """ctx.live: measuring into the run (needs_server=False too), else replaying; a reference is replayed only when no
    replay_dir is given, and only then named as ctx.recorded_from (a run nobody asked for)."""
    from specdiag.paths import relative_to_project
    from specdiag.runs import Run

    ref, asked = Run.create(tmp_path / "reference"), Run.create(tmp_path / "asked")
    ctx = nb.start("09_engine_ab", run_dir=str(tmp_path / "a"), needs_server=False)
    assert ctx.live and not ctx.replaying and ctx.source is ctx.run and ctx.recorded_from is None
    ctx = nb.start("09_engine_ab", run_dir=str(tmp_path / "b"), reference=ref.path, needs_server=False)
    assert not ctx.live and ctx.source.path == ref.path and ctx.recorded_from == relative_to_project(ref.path)
    ctx = nb.start("09_engine_ab", run_dir=str(tmp_path / "c"), replay_dir=str(asked.path), reference=ref.path)
    assert ctx.replaying and ctx.source.path == asked.path and ctx.recorded_from is None


@pytest.mark.notebook
@pytest.mark.parametrize("bad, message", [
    ("lots", "context_lengths: 'lots' is not a token count; give a whole number of tokens such as 4096, or 1k / 32k / "
             "128k (k = 1,024 tokens): set it in the parameters cell, or with papermill -p context_lengths VALUE "
             "(make: PARAMS=file.yaml)"),
    ([0], "context_lengths must hold positive whole token counts; 0 is not one"),
], ids=["not-a-list", "zero"])
def test_a_bad_context_lengths_fails_before_any_server_starts(run_notebook, tmp_path, bad, message) -> None:
    """01 with no server_url would start the embedded engine: a bad context_lengths stops the notebook at the cell
    after the parameters cell, in one line, before the run folder is opened or any server is started."""
    import papermill

    run_dir = tmp_path / "run"
    with pytest.raises(papermill.PapermillExecutionError):
        run_notebook("01_baseline_sweep", server_url="", run_dir=str(run_dir), context_lengths=bad)
    cells = [c for c in json.loads((tmp_path / "01_baseline_sweep.out.ipynb").read_text())["cells"]
             if "papermill-error-cell-tag" not in c["metadata"].get("tags", [])]  # papermill's notes on the error
    errors = [(i, o) for i, c in enumerate(cells) for o in c.get("outputs", []) if o["output_type"] == "error"]
    assert [o["traceback"] for _, o in errors] == [[f"ParameterError: {message}"]]
    (failed, _), = errors
    assert "nb.check_parameters(globals())" in "".join(cells[failed]["source"])
    injected = next(i for i, c in enumerate(cells) if "injected-parameters" in c["metadata"].get("tags", []))
    assert failed == injected + 1  # right after the parameters
    assert not any(c.get("execution_count") for c in cells[failed + 1:])
    assert not run_dir.exists()  # nb.start opens the run folder before it reaches or starts a server
