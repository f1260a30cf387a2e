"""Execute the notebooks into a run folder, render offline HTML and write the index.

This is what ``make report``, ``make notebook`` and ``make replay`` run::

    python -m specdiag.report run [--server URL] [--params params/full.yaml] [--notebooks 01_baseline_sweep]
    python -m specdiag.report replay --run data/reference/ct200-kimi-k26
    python -m specdiag.report render --run-dir data/runs/<id>      # HTML + index of an executed run again
    python -m specdiag.report check-offline FILE.html ...         # list network references in HTML files

With no ``--server`` an engine is started (``--engine embedded``, the default, or ``--engine sglang
--model M ...``: see ``specdiag.launchers``) and always stopped, also on failure.
A notebook that fails is still rendered, with its error, and marked failed in the index;
the command then exits 1. A server that cannot be reached, or bad parameters, exit 2 before
any notebook runs.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as _dt
import html
import json
import os
import re
import signal
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence

from specdiag.paths import NOTEBOOKS_DIR, PROJECT_ROOT, RUNS_DIR, relative_to_project
from specdiag.report.outputs import plain_progress
from specdiag.runs import Run, dumps, new_run_id

TEMPLATES_DIR = Path(__file__).parent / "templates" / "nbconvert"
TEMPLATE_NAME = "specdiag_offline"
LOCAL_STATE_DIR = PROJECT_ROOT / ".jupyter-local"

#: Tables a recorded run must hold for a notebook to replay it; None: the notebook never replays.
#: Notebooks not listed replay whenever they are asked to. "a|b" is met by either; a name ending in "/" is a
#: folder of the run that must hold a file (02 draws the torch profiler traces in profiles/ without telemetry);
#: "run.json:key" is a key of the run's run.json that must hold a value (00 and 03 show the server a run recorded:
#: a kernel run, or telemetry of the embedded server, recorded none, and a snapshot of nothing would read as a server
#: without speculative decoding).
REPLAY_NEEDS: dict[str, tuple[str, ...] | None] = {
    "00_snapshot": ("run.json:server",),
    "01_baseline_sweep": ("sweep",),
    "02_gpu_utilization": ("telemetry|step_profile|profiles/",),
    "03_drafter_inspection": ("run.json:server",),
    "04_commit_probe": ("commit_probe",),
    "05_bandwidth_analysis": ("sweep",),
    "06_kernel_ab": ("kernel_ab|kernel_anatomy|kernel_ws_phases",),
    "07_findings": (),
    "08_compare_runs": None,
}
#: Notebooks `make report` leaves out by default (08 compares two finished runs: run it by name).
NOT_IN_REPORT = {"08_compare_runs"}


@dataclass
class NotebookResult:
    """How one notebook's execution went."""

    notebook: str
    status: str  # "ok" | "failed" | "skipped"
    duration_s: float
    ipynb: str = ""
    html: str = ""
    error: str = ""
    metrics: dict[str, Any] = field(default_factory=dict)
    findings: list[dict[str, Any]] = field(default_factory=list)


# --------------------------------------------------------------------------------------------
# Environment: Jupyter, IPython and matplotlib state stays out of HOME.
# --------------------------------------------------------------------------------------------
def local_jupyter_env(base: Path = LOCAL_STATE_DIR) -> dict[str, str]:
    """IPYTHONDIR, JUPYTER_* and MPLCONFIGDIR under ``base`` (created), unless already set."""
    wanted = {
        "IPYTHONDIR": base / "ipython",
        "JUPYTER_CONFIG_DIR": base / "config",
        "JUPYTER_DATA_DIR": base / "data",
        "JUPYTER_RUNTIME_DIR": base / "runtime",
        "MPLCONFIGDIR": base / "matplotlib",
    }
    env = {}
    for key, path in wanted.items():
        value = os.environ.get(key) or str(path)
        Path(value).mkdir(parents=True, exist_ok=True)
        env[key] = value
    env.setdefault("PYDEVD_DISABLE_FILE_VALIDATION", "1")
    return env


def apply_local_jupyter_env() -> None:
    os.environ.update(local_jupyter_env())
    # No MPLBACKEND here: kernels must keep their inline backend, or figures never reach the notebook.


# --------------------------------------------------------------------------------------------
# Notebooks and their parameters
# --------------------------------------------------------------------------------------------
def available_notebooks(notebooks_dir: Path = NOTEBOOKS_DIR) -> list[str]:
    return sorted(p.stem for p in notebooks_dir.glob("[0-9][0-9]_*.ipynb"))


def select_notebooks(names: Sequence[str] | None, notebooks_dir: Path = NOTEBOOKS_DIR) -> list[str]:
    """Resolve ``names`` ('04', '04_commit_probe' or '04_commit_probe.ipynb') against the folder."""
    have = available_notebooks(notebooks_dir)
    if not names:
        return [n for n in have if n not in NOT_IN_REPORT]
    out = []
    for raw in names:
        name = Path(raw).stem
        match = [n for n in have if n == name or n.split("_", 1)[0] == name]
        if len(match) != 1:
            raise ValueError(f"no notebook named {raw!r} in {notebooks_dir}; have: {', '.join(have)}")
        out.append(match[0])
    return out


def declared_parameters(notebook_path: Path) -> dict[str, dict[str, Any]]:
    """The names, types and defaults of a notebook's ``parameters`` cell (papermill's reading)."""
    import papermill  # noqa: PLC0415 - heavy import, only when executing

    return dict(papermill.inspect_notebook(str(notebook_path)))


def load_params_file(path: str | None) -> dict[str, Any]:
    """Read a PARAMS YAML file. Top-level keys go to every notebook that declares them; a key that
    names a notebook (``01_baseline_sweep: {...}``) holds parameters for that notebook alone."""
    if not path:
        return {}
    import yaml  # noqa: PLC0415

    p = Path(path)
    if not p.exists() and (PROJECT_ROOT / p).exists():
        p = PROJECT_ROOT / p
    if not p.exists():
        raise ValueError(f"PARAMS file {path} does not exist; see params/ for examples")
    data = yaml.safe_load(p.read_text()) or {}
    if not isinstance(data, dict):
        raise ValueError(f"PARAMS file {path} must hold a mapping of parameter names to values")
    return data


def parameters_for(notebook: str, declared: Mapping[str, Any], shared: Mapping[str, Any],
                   params_file: Mapping[str, Any]) -> dict[str, Any]:
    """Shared parameters plus the PARAMS file's, restricted to what ``notebook`` declares.

    Raises ValueError for a notebook-specific key the notebook does not declare (a typo would
    otherwise be ignored silently)."""
    out: dict[str, Any] = {}
    for key, value in {**shared, **{k: v for k, v in params_file.items() if not _is_notebook_key(k)}}.items():
        if key in declared:
            out[key] = value
    specific = params_file.get(notebook) or {}
    unknown = sorted(set(specific) - set(declared))
    if unknown:
        raise ValueError(f"PARAMS gives {notebook} parameters it does not declare: {', '.join(unknown)}; "
                         f"it declares: {', '.join(sorted(declared))}")
    out.update(specific)
    return out


def _is_notebook_key(key: str) -> bool:
    return bool(re.fullmatch(r"\d\d_[A-Za-z0-9_]+", key))


# --------------------------------------------------------------------------------------------
# Execution and rendering
# --------------------------------------------------------------------------------------------
def execute_notebook(notebook: str, run: Run, parameters: Mapping[str, Any],
                     notebooks_dir: Path = NOTEBOOKS_DIR, log_output: bool = True) -> NotebookResult:
    """Execute one notebook with papermill into ``run/notebooks/``; never raises for a cell error."""
    import papermill  # noqa: PLC0415

    out_dir = run.path / "notebooks"
    out_dir.mkdir(exist_ok=True)
    out_path = out_dir / f"{notebook}.ipynb"
    t0 = time.perf_counter()
    status, error = "ok", ""
    try:
        papermill.execute_notebook(
            str(notebooks_dir / f"{notebook}.ipynb"), str(out_path), parameters=dict(parameters),
            kernel_name="python3", cwd=str(notebooks_dir), progress_bar=False, log_output=log_output,
            request_save_on_cell_execute=True,
        )
    except papermill.PapermillExecutionError as exc:
        status, error = "failed", f"{exc.ename}: {exc.evalue}"
    except Exception as exc:  # noqa: BLE001 - a kernel crash or timeout is a failed notebook, not a crash
        status, error = "failed", f"{type(exc).__name__}: {exc}"
    return NotebookResult(notebook, status, round(time.perf_counter() - t0, 2),
                          ipynb=str(out_path.relative_to(run.path)) if out_path.exists() else "", error=error)


def render_html(ipynb_path: Path, html_path: Path) -> None:
    """Code-free HTML that opens offline (our template drops the CDN scripts), progress bars as plain lines."""
    import nbformat  # noqa: PLC0415
    from nbconvert import HTMLExporter  # noqa: PLC0415
    from nbconvert.preprocessors import TagRemovePreprocessor  # noqa: PLC0415

    exporter = HTMLExporter(template_name=TEMPLATE_NAME, extra_template_basedirs=[str(TEMPLATES_DIR)])
    exporter.exclude_input = True
    exporter.exclude_input_prompt = True
    exporter.exclude_output_prompt = True
    exporter.register_preprocessor(
        TagRemovePreprocessor(remove_cell_tags={"remove-cell"}, remove_input_tags={"remove-input"},
                              remove_all_outputs_tags={"remove-output"}, enabled=True), enabled=True)
    nb = nbformat.read(str(ipynb_path), as_version=4)
    nb.metadata.pop("widgets", None)
    plain_progress(nb)  # progress bars: one plain line each, not red stderr blocks
    body, _ = exporter.from_notebook_node(nb, resources={"metadata": {"name": ipynb_path.stem}})
    html_path.parent.mkdir(parents=True, exist_ok=True)
    html_path.write_text(body, encoding="utf-8")


_NET_ATTR = re.compile(r"""<(?P<tag>[a-zA-Z]+)\b[^>]*?\b(?P<attr>src|href|data)\s*=\s*["']?(?P<url>(?:https?:)?//[^"'\s>]+)""",
                       re.IGNORECASE)
_NET_CSS = re.compile(r"""(?:@import\s+(?:url\()?|url\()\s*["']?(?P<url>(?:https?:)?//[^"')\s]+)""", re.IGNORECASE)


def network_references(html_text: str) -> list[str]:
    """Every network URL an HTML page would load: src/href/data attributes and CSS url()/@import.

    Plain text links (``<a href="https://...">``) are not loads and are allowed."""
    refs = [m.group("url") for m in _NET_ATTR.finditer(html_text) if m.group("tag").lower() != "a"]
    refs += [m.group("url") for m in _NET_CSS.finditer(html_text)]
    return refs


# --------------------------------------------------------------------------------------------
# Index pages
# --------------------------------------------------------------------------------------------
_CSS = """body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:24px;max-width:1200px;color:#222}
table{border-collapse:collapse;width:100%}th,td{border-bottom:1px solid #ddd;padding:6px 8px;text-align:left;vertical-align:top}
th{background:#f3f3f3}.ok{color:#2e7d32;font-weight:600}.failed{color:#c62828;font-weight:600}.skipped{color:#777}
code{background:#f5f5f5;padding:0 3px}.sev-critical{color:#c62828}.sev-warning{color:#ef6c00}.sev-ok{color:#2e7d32}
.sev-info{color:#1565c0}small{color:#666}"""


def _fmt(value: Any) -> str:
    """Numbers to 4 significant digits, also inside lists and dicts."""
    if isinstance(value, bool) or value is None:
        return str(value)
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_fmt(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {_fmt(v)}" for k, v in value.items()) + "}"
    return str(value)


def write_run_index(run: Run, results: Sequence[NotebookResult]) -> Path:
    """index.html of one run: each notebook with its status, duration, key numbers and findings."""
    meta = run.meta
    rows = []
    for r in results:
        metrics = "<br>".join(f"<code>{html.escape(k)}</code> = {html.escape(_fmt(v))}"
                              for k, v in list(r.metrics.items())[:8]) or "<small>none recorded</small>"
        fnd = "".join(f'<li class="sev-{html.escape(f.get("severity", "info"))}">[{html.escape(f.get("severity", "").upper())}] '
                      f'{html.escape(f.get("title", ""))}: {html.escape(f.get("verdict", ""))}</li>' for f in r.findings)
        link = f'<a href="{html.escape(r.html)}">{html.escape(r.notebook)}</a>' if r.html else html.escape(r.notebook)
        err = f"<br><small>{html.escape(r.error[:300])}</small>" if r.error else ""
        rows.append(f'<tr><td>{link}</td><td class="{r.status}">{r.status}{err}</td><td>{r.duration_s:.1f}</td>'
                    f"<td>{metrics}</td><td><ul>{fnd}</ul></td></tr>")
    server = f"replay of {meta['replay_of']}" if meta.get("replay_of") else meta.get("server_url", "")
    page = f"""<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>specdiag run {html.escape(run.path.name)}</title>
<style>{_CSS}</style></head><body>
<h1>specdiag run <code>{html.escape(run.path.name)}</code></h1>
<p>Server: <code>{html.escape(str(server or ''))}</code> &middot; created {html.escape(str(meta.get('provenance', {}).get('created_utc', '')))}
&middot; specdiag {html.escape(str(meta.get('provenance', {}).get('specdiag_version', '')))}
(git {html.escape(str(meta.get('provenance', {}).get('git_commit', '')))})</p>
<p>Numbers below are the notebooks' key metrics; each notebook's page says which are measured,
server-reported, computed or published. Raw rows: the <code>*.jsonl</code> files of this folder.</p>
<table><tr><th>notebook</th><th>status</th><th>time (s)</th><th>key numbers</th><th>findings</th></tr>
{''.join(rows)}</table>
<p><small>Files: <a href="run.json">run.json</a> &middot; <a href="findings.json">findings.json</a>
&middot; <a href="../index.html">all runs</a></small></p>
</body></html>"""
    path = run.path / "index.html"
    path.write_text(page, encoding="utf-8")
    return path


def write_runs_index(runs_dir: Path = RUNS_DIR) -> Path:
    """data/runs/index.html: every run folder with its time, server and notebook statuses."""
    runs_dir.mkdir(parents=True, exist_ok=True)
    rows = []
    for path in sorted((p for p in runs_dir.iterdir() if (p / "run.json").exists()), reverse=True):
        meta = json.loads((path / "run.json").read_text())
        report = meta.get("report", {})
        statuses = report.get("statuses", {})
        summary = ", ".join(f"{k}: {v}" for k, v in statuses.items()) or "not run through the report"
        target = meta.get("server_url") or meta.get("replay_of") or ""
        link = f'<a href="{html.escape(path.name)}/index.html">{html.escape(path.name)}</a>' \
            if (path / "index.html").exists() else html.escape(path.name)
        rows.append(f"<tr><td>{link}</td><td>{html.escape(str(target))}</td><td>{html.escape(summary)}</td></tr>")
    page = f"""<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>specdiag runs</title>
<style>{_CSS}</style></head><body><h1>specdiag runs</h1>
<table><tr><th>run</th><th>server or recorded run</th><th>notebooks</th></tr>{''.join(rows)}</table></body></html>"""
    out = runs_dir / "index.html"
    out.write_text(page, encoding="utf-8")
    return out


def collect_results(run: Run, results: list[NotebookResult]) -> None:
    """Attach each notebook's recorded metrics and findings, write findings.json and the run's statuses."""
    written = run.results()
    for r in results:
        rec = written.get(r.notebook, {})
        r.metrics = dict(rec.get("metrics", {}))
        r.findings = list(rec.get("findings", []))
    (run.path / "findings.json").write_text(dumps({r.notebook: {"status": r.status, "findings": r.findings,
                                                                 "metrics": r.metrics} for r in results},
                                                  indent=2) + "\n")
    run.update(report={"statuses": {r.notebook: r.status for r in results},
                       "results": [asdict(r) | {"findings": len(r.findings)} for r in results]})


def render_run(run: Run, results: list[NotebookResult]) -> Path:
    """HTML for every executed notebook, then the run's index and the runs index."""
    for r in results:
        if not r.ipynb:
            continue
        html_rel = f"html/{r.notebook}.html"
        try:
            render_html(run.path / r.ipynb, run.path / html_rel)
            r.html = html_rel
        except Exception as exc:  # noqa: BLE001 - a render failure marks the notebook, the rest go on
            r.status = "failed"
            r.error = (r.error + "; " if r.error else "") + f"HTML rendering failed: {exc}"
    collect_results(run, results)
    index = write_run_index(run, results)
    write_runs_index(run.path.parent if run.path.parent.resolve() == RUNS_DIR.resolve() else RUNS_DIR)
    return index


# --------------------------------------------------------------------------------------------
# The commands
# --------------------------------------------------------------------------------------------
@contextlib.contextmanager
def server_for_report(server_url: str, run: Run, engine: str = "embedded",
                      engine_options: Mapping[str, Any] | None = None, server: Any = None,
                      client: Any = None) -> Iterator[str]:
    """Yield a reachable server URL: ``server_url`` checked, or an engine (``specdiag.launchers``:
    embedded by default, or sglang) started with ``engine_options`` and always stopped afterwards,
    also on failure or Ctrl-C. Its log goes to the run folder, its command line (secrets redacted) to
    run.json. ``server``: an engine server already made by ``engine_server`` (options checked).
    ``client``: the client of ``server_url`` when the caller already reached it.

    The run's one reachability check (``serving.reach``): made here (or by the caller) once, and exported
    to the notebooks (``serving.reached``), which then do not check again."""
    from specdiag.serving import reach, reached  # noqa: PLC0415

    if server_url:
        with reached(client or reach(server_url)):
            yield server_url
        return
    from specdiag.launchers import engine_server  # noqa: PLC0415
    from specdiag.launchers.process import redacted_command  # noqa: PLC0415

    if server is None:
        server = engine_server(engine, **dict(engine_options or {}))
    server.log_path = run.path / "server.log"
    print(f"[specdiag] starting the {engine} engine; log: {server.log_path}", flush=True)
    try:
        server.start()
        command = server.command() if callable(server.command) else server.command
        run.update(engine={**dict(getattr(server, "info", {}) or {}), "engine": engine, "url": server.url,
                           "command": redacted_command(command),
                           "ready_after_s": getattr(server, "ready_after_s", None),  # measured start-up time
                           "options": {k: v if isinstance(v, (int, float, bool)) or v is None else str(v)
                                       for k, v in dict(engine_options or {}).items()
                                       if k not in ("env", "extra_args")}})
        print(f"[specdiag] {engine} engine ready at {server.url}", flush=True)
        with reached(reach(server.url, engine if engine in ("embedded", "sglang", "vllm") else "auto")):
            yield server.url
    finally:
        server.stop()
        print(f"[specdiag] {engine} engine stopped", flush=True)


def run_notebooks(notebooks: Sequence[str], run: Run, shared: Mapping[str, Any],
                  params_file: Mapping[str, Any], notebooks_dir: Path = NOTEBOOKS_DIR) -> list[NotebookResult]:
    """Validate every notebook's parameters first, then execute them in order."""
    plans = []
    for nb_name in notebooks:
        declared = declared_parameters(notebooks_dir / f"{nb_name}.ipynb")
        plans.append((nb_name, parameters_for(nb_name, declared, shared, params_file)))
    results = []
    for i, (nb_name, params) in enumerate(plans, 1):
        print(f"[specdiag] ({i}/{len(plans)}) {nb_name} ...", flush=True)
        res = execute_notebook(nb_name, run, params, notebooks_dir)
        print(f"[specdiag] ({i}/{len(plans)}) {nb_name}: {res.status} in {res.duration_s:.1f} s"
              + (f" ({res.error})" if res.error else ""), flush=True)
        results.append(res)
    return results


#: Parameters an engine started here needs when none are given (the CPU vLLM holds 4,096 tokens).
ENGINE_DEFAULT_PARAMS = {"vllm": "params/vllm-cpu.yaml"}


def cmd_run(args: argparse.Namespace) -> int:
    apply_local_jupyter_env()
    if not args.params and not args.server and getattr(args, "engine", None) in ENGINE_DEFAULT_PARAMS:
        args.params = str(PROJECT_ROOT / ENGINE_DEFAULT_PARAMS[args.engine])
        print(f"[specdiag] {args.engine} engine without --params: using {ENGINE_DEFAULT_PARAMS[args.engine]}", flush=True)
    params_file = load_params_file(args.params)
    notebooks = select_notebooks(args.notebooks)
    # before any folder is made: an unreachable server or an engine that cannot start leaves nothing behind
    engine_options, server, client = {}, None, None
    if args.server:
        from specdiag.serving import reach  # noqa: PLC0415

        client = reach(args.server)  # the run's one check (its notebooks reuse it): the engine it is, or why not
    else:
        from specdiag.launchers import engine_server  # noqa: PLC0415
        from specdiag.launchers.cli import engine_options_from_args  # noqa: PLC0415

        engine_options = engine_options_from_args(args)
        server = engine_server(args.engine, **engine_options)  # checks models, options, sglang's presence
    run = Run.create(args.run_dir or RUNS_DIR / new_run_id(args.engine if not args.server else "server"))
    run.update(report={"command": report_command(), "notebooks": notebooks,
                       "started_utc": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")})
    print(f"[specdiag] run folder: {run.path}", flush=True)
    with server_for_report(args.server, run, args.engine, engine_options, server=server, client=client) as url:
        shared = {"server_url": url, "run_dir": str(run.path), "replay_dir": ""}
        results = run_notebooks(notebooks, run, shared, params_file)
    return finish(run, results)


def replay_need_met(source: Run, need: str) -> bool:
    """Whether the recorded run holds one of ``need``'s alternatives (see :data:`REPLAY_NEEDS`)."""
    for alt in need.split("|"):
        if alt.startswith("run.json:"):
            if source.meta.get(alt.split(":", 1)[1]):
                return True
        elif alt.endswith("/"):
            folder = source.path / alt.rstrip("/")
            if folder.is_dir() and any(p.is_file() for p in folder.iterdir()):
                return True
        elif source.rows(alt):
            return True
    return False


def replay_need_text(need: str) -> str:
    """What ``need`` asks for, in words: 'sweep rows', 'files in profiles/', 'recorded server (run.json)'."""
    def one(alt: str) -> str:
        if alt.startswith("run.json:"):
            return f"recorded {alt.split(':', 1)[1]} (run.json)"
        return f"files in {alt}" if alt.endswith("/") else f"{alt} rows"
    return " or ".join(one(a) for a in need.split("|"))


def cmd_replay(args: argparse.Namespace) -> int:
    apply_local_jupyter_env()
    source = Run.open(args.run)
    params_file = load_params_file(args.params)
    notebooks = []
    for nb_name in select_notebooks(args.notebooks) if args.notebooks else available_notebooks():
        needs = REPLAY_NEEDS.get(nb_name, ())
        if needs is None:
            continue
        missing = [t for t in needs if not replay_need_met(source, t)]
        if missing and not args.notebooks:
            print(f"[specdiag] {nb_name}: skipped ({source.path.name} has no {'; no '.join(map(replay_need_text, missing))})")
            continue
        notebooks.append(nb_name)
    run = Run.create(args.run_dir or RUNS_DIR / new_run_id(f"replay-{source.path.name}"))
    run.update(replay_of=relative_to_project(source.path), report={"command": report_command(), "notebooks": notebooks})
    print(f"[specdiag] replaying {source.path} into {run.path}", flush=True)
    shared = {"server_url": "", "run_dir": str(run.path), "replay_dir": relative_to_project(source.path)}
    results = run_notebooks(notebooks, run, shared, params_file)
    return finish(run, results)


def cmd_compare(args: argparse.Namespace) -> int:
    """08_compare_runs on two recorded run folders, no server: run_a/run_b from --run-a/--run-b or the PARAMS file."""
    apply_local_jupyter_env()
    params_file = load_params_file(args.params)
    run_a = args.run_a or params_file.get("run_a", "")
    run_b = args.run_b or params_file.get("run_b", "")
    if not run_a or not run_b:
        raise ValueError("compare needs two run folders: --run-a and --run-b (make compare A=... B=...) or run_a and "
                         "run_b in the PARAMS file, e.g. params/compare-plugin.yaml")
    a, b = Run.open(run_a), Run.open(run_b)  # both must exist before any folder is made
    run = Run.create(args.run_dir or RUNS_DIR / new_run_id(f"compare-{a.path.name}-vs-{b.path.name}"))
    run.update(report={"command": report_command(), "notebooks": ["08_compare_runs"]})
    print(f"[specdiag] comparing {a.path} (A) with {b.path} (B) into {run.path}", flush=True)
    shared = {"run_a": relative_to_project(a.path), "run_b": relative_to_project(b.path), "run_dir": str(run.path)}
    rest = {k: v for k, v in params_file.items() if k not in ("run_a", "run_b")}
    results = run_notebooks(["08_compare_runs"], run, shared, rest)
    return finish(run, results)


def report_command() -> str:
    """The command as run.json records it: the module, not this machine's path to it."""
    import shlex  # noqa: PLC0415

    return " ".join(["python -m specdiag.report", *(shlex.quote(a) for a in sys.argv[1:])])


def finish(run: Run, results: list[NotebookResult]) -> int:
    index = render_run(run, results)
    failed = [r.notebook for r in results if r.status != "ok"]
    offline_problems = {p.name: network_references(p.read_text(encoding="utf-8"))
                        for p in (run.path / "html").glob("*.html")}
    offline_problems = {k: v for k, v in offline_problems.items() if v}
    if offline_problems:
        print(f"[specdiag] WARNING: pages that load from the network: {offline_problems}", flush=True)
    print(f"[specdiag] {len(results) - len(failed)} of {len(results)} notebooks ok"
          + (f"; failed: {', '.join(failed)}" if failed else ""), flush=True)
    print(f"[specdiag] index: {index}", flush=True)
    return 1 if failed or offline_problems else 0


def cmd_render(args: argparse.Namespace) -> int:
    run = Run.open(args.run_dir)
    statuses = run.meta.get("report", {}).get("statuses", {})
    results = [NotebookResult(p.stem, statuses.get(p.stem, "ok"), 0.0, ipynb=f"notebooks/{p.name}")
               for p in sorted((run.path / "notebooks").glob("*.ipynb"))]
    print(f"[specdiag] index: {render_run(run, results)}")
    return 0


def cmd_check_offline(args: argparse.Namespace) -> int:
    bad = 0
    for name in args.files:
        refs = network_references(Path(name).read_text(encoding="utf-8"))
        for ref in refs:
            print(f"{name}: loads {ref}")
        bad += len(refs)
    print(f"{len(args.files)} file(s) checked, {bad} network reference(s)")
    return 1 if bad else 0


def build_parser() -> argparse.ArgumentParser:
    from specdiag.launchers.cli import add_engine_arguments  # noqa: PLC0415

    p = argparse.ArgumentParser(prog="python -m specdiag.report", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="measure: execute notebooks against a server (default: the embedded one)")
    r.add_argument("--server", default="", help="SGLang or vLLM server URL (the engine is recognised); empty starts --engine (default: embedded)")
    r.add_argument("--params", default="", help="YAML file of papermill parameters (see params/)")
    r.add_argument("--notebooks", nargs="*", help="notebooks to run (default: all but 08_compare_runs)")
    r.add_argument("--run-dir", default="", help="run folder (default: a new one under data/runs/)")
    add_engine_arguments(r, title="engine to start when no --server is given")
    r.set_defaults(func=cmd_run)
    rp = sub.add_parser("replay", help="analyse a recorded run with every notebook that can replay it")
    rp.add_argument("--run", required=True, help="recorded run folder, e.g. data/reference/ct200-kimi-k26")
    rp.add_argument("--params", default="")
    rp.add_argument("--notebooks", nargs="*")
    rp.add_argument("--run-dir", default="")
    rp.set_defaults(func=cmd_replay)
    cp = sub.add_parser("compare", help="08_compare_runs on two run folders (A before, B after), no server")
    cp.add_argument("--run-a", default="", help="run folder A, the reference, e.g. data/reference/h200-sglang-mla-stock")
    cp.add_argument("--run-b", default="", help="run folder B, judged against A")
    cp.add_argument("--params", default="", help="YAML file that may name run_a and run_b (params/compare-plugin.yaml)")
    cp.add_argument("--run-dir", default="")
    cp.set_defaults(func=cmd_compare)
    rd = sub.add_parser("render", help="render HTML and the index of an executed run folder again")
    rd.add_argument("--run-dir", required=True)
    rd.set_defaults(func=cmd_render)
    co = sub.add_parser("check-offline", help="list network references (src/href/url) in HTML files")
    co.add_argument("files", nargs="+")
    co.set_defaults(func=cmd_check_offline)
    return p


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    previous = None
    if args.cmd == "run" and threading.current_thread() is threading.main_thread():
        previous = signal.signal(signal.SIGTERM, _interrupt)  # `kill` unwinds like Ctrl-C: the engine is stopped
    try:
        return int(args.func(args))
    except KeyboardInterrupt:
        print("[specdiag] interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # noqa: BLE001 - one clear line for the user, not a traceback
        from specdiag.launchers import EngineStartError  # noqa: PLC0415
        from specdiag.nb import ParameterError  # noqa: PLC0415

        known = (ValueError, FileNotFoundError, ParameterError, EngineStartError)
        try:
            from specdiag.serving.errors import ServerError  # noqa: PLC0415

            known = known + (ServerError,)
        except ImportError:
            pass
        if isinstance(exc, known):
            print(f"[specdiag] error: {exc}", file=sys.stderr)
            return 2
        raise
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


if __name__ == "__main__":
    sys.exit(main())
