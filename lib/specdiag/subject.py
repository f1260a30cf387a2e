"""What a run's numbers describe, said at the top of every page: a demo on the embedded server's tiny model (or another
server on a CPU), a recorded run replayed, or a live server (no banner).

Pure, from run.json (``Run.meta``): a page's banner (:func:`banner`, HTML by :func:`banner_html`) and where a run's
numbers were measured (:func:`measured_on`), which the index shows beside each notebook's key numbers. A recorded run
names its hardware in run.json (``hardware.device_name``, ``device.gpu``, ``recorded_with.gpu``); a reference run that
does not is named by its line in ``data/reference/README.md`` (the hardware column).
"""

from __future__ import annotations

import html
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any, Literal, Mapping

from specdiag.paths import PROJECT_ROOT, REFERENCE_DIR

Kind = Literal["demo", "recorded"]

#: The commands the demo banner points at: your own server, and a recorded GPU run to replay.
YOUR_SERVER = "make report SERVER=http://your-gpu-host:30000"
RECORDED_GPU_RUN = "make replay RUN=data/reference/sglang-h200-mla61-dflash"


@dataclass(frozen=True)
class Banner:
    """A page's first lines: what its numbers and verdicts describe."""

    kind: Kind
    title: str
    text: str


def _server(meta: Mapping[str, Any]) -> Mapping[str, Any]:
    return meta.get("server") or {}


def is_embedded(meta: Mapping[str, Any]) -> bool:
    """The run measured the embedded server (the tiny trained model), started by the report or reached by URL."""
    return ((meta.get("engine") or {}).get("engine") == "embedded"
            or str(_server(meta).get("version", "")).startswith("specdiag-localserver"))


def on_cpu(meta: Mapping[str, Any]) -> bool:
    """The run's server computed on a CPU (the embedded server, vLLM built for CPUs)."""
    device = str(_server(meta).get("device") or "").lower()
    name = str((meta.get("hardware") or {}).get("device_name") or "")
    return device == "cpu" or name.startswith("host CPU")


@cache
def _reference_hardware() -> dict[str, str]:
    """{run name: its hardware} from the table of ``data/reference/README.md``."""
    path = REFERENCE_DIR / "README.md"
    if not path.exists():
        return {}
    out: dict[str, str] = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 3 and cells[0].startswith("`") and cells[0].endswith("`"):
            out[cells[0].strip("`")] = cells[2]
    return out


def hardware_of(meta: Mapping[str, Any], path: str | Path | None = None) -> str | None:
    """The hardware a run's numbers were measured (or published) on: run.json's, else the reference index's line for
    a reference run (``path``), else None."""
    hw = meta.get("hardware") or {}
    named = (hw.get("device_name") or (meta.get("device") or {}).get("gpu")
             or (meta.get("recorded_with") or {}).get("gpu"))
    if named:
        return str(named) + (" (published)" if meta.get("data_source") == "published" else "")
    if path is not None:
        return _reference_hardware().get(Path(path).name)
    return None


def _name(path: str | Path) -> str:
    p = Path(path)
    try:
        return str(p.resolve().relative_to(PROJECT_ROOT.resolve()))
    except ValueError:
        return str(p)


def recorded_banner(source_meta: Mapping[str, Any], source_path: str | Path, apart: bool = False) -> Banner:
    """A page showing a recorded run: nothing on it was measured here. ``apart``: the run is not the one the page's
    run measured (07 lists its findings apart)."""
    name = _name(source_path)
    hw = hardware_of(source_meta, source_path)
    published = source_meta.get("data_source") == "published"
    where = f" on {hw}" if hw else ""
    what = "published numbers" if published else "recorded numbers"
    return Banner("recorded", f"Replayed: {what} of {name}{where}",
                  f"Nothing on this page was measured here: every number and verdict is {name}'s, "
                  f"{'published' if published else 'recorded'}{where}, analysed again by this suite."
                  + (" Its findings are kept apart from this run's (07 does not count them)." if apart else ""))


def demo_banner(meta: Mapping[str, Any]) -> Banner:
    """A live run on the embedded server's tiny model, or on another server computing on a CPU."""
    hw = (meta.get("hardware") or {}).get("device_name") or "this machine's CPU"
    who = ("the embedded server: a tiny trained model with real speculative decoding" if is_embedded(meta)
           else f"a server on a CPU ({_server(meta).get('engine') or 'engine not reported'})")
    return Banner("demo", "Demo run: a tiny model on a CPU",
                  f"Measured on {who}, on {hw}. The verdicts describe that toy, not a GPU server: a CRITICAL here is "
                  f"how the tiny model behaves on a CPU. For your server: {YOUR_SERVER}; for a recorded H200 run: "
                  f"{RECORDED_GPU_RUN}.")


def banner(meta: Mapping[str, Any], source_meta: Mapping[str, Any] | None = None,
           source_path: str | Path | None = None) -> Banner | None:
    """What a page's numbers describe. ``meta``: the page's own run; ``source_meta``/``source_path``: the run it
    analyses when that is a recorded one (a replay, or a notebook showing a reference run). None for a live run on a
    GPU server."""
    if source_path is not None and source_meta is not None:
        whole = bool(meta.get("replay_of"))
        return recorded_banner(source_meta, source_path, apart=not whole)
    if meta.get("replay_of"):
        return recorded_banner({}, str(meta["replay_of"]))
    if is_embedded(meta) or on_cpu(meta):
        return demo_banner(meta)
    return None


def run_banner(meta: Mapping[str, Any], source_meta: Mapping[str, Any] | None = None) -> Banner | None:
    """The index's banner: a replay of a recorded run (``replay_of``, its run.json as ``source_meta``), a demo, or
    None."""
    if meta.get("replay_of"):
        return recorded_banner(source_meta or {}, str(meta["replay_of"]))
    if is_embedded(meta) or on_cpu(meta):
        return demo_banner(meta)
    return None


def measured_on(meta: Mapping[str, Any], recorded_from: str = "", recorded_meta: Mapping[str, Any] | None = None
                ) -> str:
    """Where a notebook's numbers come from, in a few words for the index: 'recorded on NVIDIA H200 (data/reference/
    kernel-ab-h200)' for a notebook that showed a recorded run, else the run's own hardware ('measured on host CPU
    (x86_64)', 'recorded on ...' in a replay)."""
    if recorded_from:
        hw = hardware_of(recorded_meta or {}, recorded_from)
        return f"recorded{f' on {hw}' if hw else ''} ({recorded_from}), not on this run's machine"
    if meta.get("replay_of"):
        hw = hardware_of(recorded_meta or {}, str(meta["replay_of"]))
        return f"recorded{f' on {hw}' if hw else ''} ({meta['replay_of']})"
    hw = hardware_of(meta)
    return f"measured on {hw}" if hw else "measured"


_STYLE = {"demo": ("#fff8e1", "#f9a825"), "recorded": ("#e8f1fb", "#1565c0")}


def banner_html(b: Banner | None) -> str:
    """The banner as a self-contained box ('' for None)."""
    if b is None:
        return ""
    bg, edge = _STYLE[b.kind]
    return (f'<div class="specdiag-banner banner-{b.kind}" style="background:{bg};border-left:6px solid {edge};'
            f'padding:8px 14px;margin:6px 0 12px 0"><b>{html.escape(b.title)}.</b> {html.escape(b.text)}</div>')
