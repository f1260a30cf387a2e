"""Outputs of an executed notebook made fit to share, before it becomes HTML.

Progress bars (tqdm, in the notebooks' measuring loops and in libraries) write to stderr, redrawing
themselves with carriage returns. In a rendered page that is a red error-styled block holding every
redraw. :func:`plain_progress` keeps each bar's final state as one plain stdout line and leaves real
stderr text (warnings, errors) where it was.

A measuring log (each arm's requests as they were sent) is evidence, not the answer: :func:`fold_long_logs` folds a
printed output longer than :data:`LOG_LINES_SHOWN` lines under a one-line summary the reader can open.
"""

from __future__ import annotations

import html
import re
from typing import Any

#: Lines of printed output a page shows open; a longer one is folded (its first line, and how many).
LOG_LINES_SHOWN = 12

#: A tqdm line: "desc: 100%|#####| 6/6 [00:12<00:00, 2.00s/request]" (any bar characters, optional desc).
PROGRESS_LINE = re.compile(r"^\s*(?:[^|\r\n]*:\s*)?\d{1,3}%\|[^|]*\|\s*\d+(?:\.\d+)?[kMG]?/\d+(?:\.\d+)?[kMG]?\b")


def _final_state(line: str) -> str:
    """What a terminal would show of a line redrawn with carriage returns: the text after the last one."""
    parts = [p for p in line.split("\r") if p.strip()]
    return parts[-1].rstrip() if parts else ""


def split_progress(text: str) -> tuple[list[str], list[str]]:
    """(progress lines in their final state, the other lines) of one stderr text."""
    progress, other = [], []
    for raw in text.split("\n"):
        line = _final_state(raw)
        if not line:
            continue
        (progress if PROGRESS_LINE.match(line) else other).append(line)
    return progress, other


def plain_progress(nb: Any) -> Any:
    """In place on an nbformat notebook: each stderr stream output that holds progress bars becomes a stdout
    output with their final lines, followed by a stderr output with the remaining text (if any); a stderr output
    of whitespace alone is dropped."""
    for cell in nb.get("cells", []):
        outputs = cell.get("outputs")
        if not outputs:
            continue
        merged: list[Any] = []  # consecutive stderr chunks as one text, as a terminal shows them
        for out in outputs:
            prev = merged[-1] if merged else None
            if (prev is not None and out.get("output_type") == "stream" and out.get("name") == "stderr"
                    and prev.get("output_type") == "stream" and prev.get("name") == "stderr"):
                merged[-1] = type(out)(output_type="stream", name="stderr", text=prev.get("text", "") + out.get("text", ""))
            else:
                merged.append(out)
        new: list[Any] = []
        for out in merged:
            if out.get("output_type") != "stream" or out.get("name") != "stderr":
                new.append(out)
                continue
            if not out.get("text", "").strip():
                continue  # a bar's closing newline, split from it by a print: an empty red block on the page
            progress, other = split_progress(out.get("text", ""))
            if not progress:
                new.append(out)
                continue
            new.append(type(out)(output_type="stream", name="stdout", text="\n".join(progress) + "\n"))
            if other:
                new.append(type(out)(output_type="stream", name="stderr", text="\n".join(other) + "\n"))
        cell["outputs"] = new
    return nb


def fold_long_logs(nb: Any, max_lines: int = LOG_LINES_SHOWN) -> Any:
    """In place on an nbformat notebook: consecutive stdout outputs joined (a log printed line by line), then each
    longer than ``max_lines`` lines becomes a collapsed ``<details>`` whose summary is its first line and its length;
    shorter ones stay as they are."""
    from nbformat.v4 import new_output  # noqa: PLC0415 - nbformat only where a page is rendered

    def printed(out: Any) -> bool:
        return out.get("output_type") == "stream" and out.get("name") == "stdout"

    for cell in nb.get("cells", []):
        outputs = cell.get("outputs")
        if not outputs:
            continue
        merged: list[Any] = []  # consecutive prints as one text (a log printed line by line is one log)
        for out in outputs:
            if merged and printed(out) and printed(merged[-1]):
                merged[-1] = type(out)(output_type="stream", name="stdout",
                                       text=merged[-1].get("text", "") + out.get("text", ""))
            else:
                merged.append(out)
        new: list[Any] = []
        for out in merged:
            text = out.get("text", "") if printed(out) else ""
            lines = text.rstrip("\n").split("\n") if text else []
            if len(lines) <= max_lines:
                new.append(out)
                continue
            body = (f'<details class="specdiag-log"><summary style="cursor:pointer;color:#555"><code>'
                    f'{html.escape(lines[0][:160])}</code> ... ({len(lines)} lines of log)</summary>'
                    f'<pre style="font-size:85%">{html.escape(text)}</pre></details>')
            new.append(new_output("display_data", data={"text/html": body, "text/plain": text}))
        cell["outputs"] = new
    return nb
