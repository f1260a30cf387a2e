"""Rendered pages show a progress bar as one plain line, not a red stderr block; real stderr stays."""

from __future__ import annotations

import nbformat

from specdiag.report.outputs import plain_progress, split_progress


def _stream(name: str, text: str):
    return nbformat.v4.new_output("stream", name=name, text=text)


def test_tqdm_redraws_become_one_plain_line_and_warnings_stay() -> None:
    nb = nbformat.v4.new_notebook()
    cell = nbformat.v4.new_code_cell("")
    cell.outputs = [_stream("stderr", "\rsweep:   0%|          | 0/3 [00:00<?, ?request/s]"),
                    _stream("stderr", "\rsweep:  33%|###3      | 1/3 [00:01<00:02, 1.0s/request]"),
                    _stream("stderr", "\rsweep: 100%|##########| 3/3 [00:03<00:00, 1.0s/request]\n"),
                    _stream("stdout", "done\n"),
                    _stream("stderr", "UserWarning: a real warning\n")]
    nb.cells = [cell]
    out = plain_progress(nb).cells[0].outputs
    assert [(o.name, o.text) for o in out] == [
        ("stdout", "sweep: 100%|##########| 3/3 [00:03<00:00, 1.0s/request]\n"),
        ("stdout", "done\n"),
        ("stderr", "UserWarning: a real warning\n")]


def test_mixed_text_keeps_the_non_progress_lines_as_stderr() -> None:
    progress, other = split_progress("Loading weights\n\rdraft timing:  50%|#####     | 1/2\rdraft timing: 100%|##########| 2/2\n")
    assert progress == ["draft timing: 100%|##########| 2/2"] and other == ["Loading weights"]
    assert split_progress("Traceback: 100% wrong | not a bar\n") == ([], ["Traceback: 100% wrong | not a bar"])


def test_a_bar_whose_closing_newline_follows_a_print_leaves_no_empty_stderr_block() -> None:
    # tqdm's bar, the loop's own print to stdout, then tqdm's closing newline on stderr (seen in 03's page)
    nb = nbformat.v4.new_notebook()
    cell = nbformat.v4.new_code_cell("")
    cell.outputs = [_stream("stderr", "\rdraft timing: 100%|##########| 4/4 [00:02<00:00]"),
                    _stream("stdout", "no per-step draft times\n"),
                    _stream("stderr", "\n")]
    nb.cells = [cell]
    out = plain_progress(nb).cells[0].outputs
    assert [(o.name, o.text) for o in out] == [
        ("stdout", "draft timing: 100%|##########| 4/4 [00:02<00:00]\n"),
        ("stdout", "no per-step draft times\n")]
