"""The report's commands: run (measure), replay, compare, render, check-offline; the engine around a run."""

from __future__ import annotations

import argparse
import contextlib
import datetime as _dt
import sys
from pathlib import Path
from typing import Any, Iterator, Mapping

from specdiag.paths import PROJECT_ROOT, RUNS_DIR, relative_to_project
from specdiag.report.environment import apply_local_jupyter_env
from specdiag.report.execute import NotebookResult, run_notebooks
from specdiag.report.notebooks import (REPLAY_NEEDS, RUN_LAST, available_notebooks, checked_params_file,
                                       load_params_file, replay_need_met, replay_need_text, select_notebooks)
from specdiag.report.render import RENDER_FAILED, network_references, render_run
from specdiag.report.words import params_hint
from specdiag.runs import Run, new_run_id


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
    from specdiag.process import redacted_command  # noqa: PLC0415

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


#: Parameters an engine started here needs when none are given (the CPU vLLM holds 4,096 tokens; the embedded engine's
#: 09 measures a speculating arm beside its speculation-off twin, so the report states the break-even on a laptop).
ENGINE_DEFAULT_PARAMS = {"vllm": "params/vllm-cpu.yaml", "embedded": "params/embedded.yaml"}


def cmd_run(args: argparse.Namespace) -> int:
    apply_local_jupyter_env()
    if not args.params and not args.server and getattr(args, "engine", None) in ENGINE_DEFAULT_PARAMS:
        args.params = str(PROJECT_ROOT / ENGINE_DEFAULT_PARAMS[args.engine])
        print(f"[specdiag] {args.engine} engine without --params: using {ENGINE_DEFAULT_PARAMS[args.engine]}", flush=True)
    notebooks = select_notebooks(args.notebooks)
    params_file = load_params_file(args.params)
    # before any folder is made: an unreachable server, bad parameters or an engine that cannot start leave nothing
    engine_options, server, client = {}, None, None
    if args.server:
        from specdiag.serving import reach  # noqa: PLC0415

        client = reach(args.server)  # the run's one check (its notebooks reuse it): the engine it is, or why not
    params_file = checked_params_file(notebooks, params_file, params_hint())  # before any engine starts
    if not args.server:
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


def cmd_replay(args: argparse.Namespace) -> int:
    apply_local_jupyter_env()
    source = Run.open(args.run)
    params_file = load_params_file(args.params)
    notebooks = []
    everything = available_notebooks()
    everything = [n for n in everything if n not in RUN_LAST] + [n for n in RUN_LAST if n in everything]
    for nb_name in select_notebooks(args.notebooks) if args.notebooks else everything:
        needs = REPLAY_NEEDS.get(nb_name, ())
        if needs is None:
            continue
        missing = [t for t in needs if not replay_need_met(source, t)]
        if missing and not args.notebooks:
            print(f"[specdiag] {nb_name}: skipped ({source.path.name} has no {'; no '.join(map(replay_need_text, missing))})")
            continue
        notebooks.append(nb_name)
    params_file = checked_params_file(notebooks, params_file, params_hint())
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
    params_file = checked_params_file(["08_compare_runs"], params_file, params_hint())
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
    print(f"[specdiag] index: {Path(index).resolve()}", flush=True)  # absolute: open it from anywhere
    return 1 if failed or offline_problems else 0


def cmd_render(args: argparse.Namespace) -> int:
    run = Run.open(args.run_dir)
    report = run.meta.get("report", {})
    statuses = report.get("statuses", {})
    recorded = {r.get("notebook"): r for r in report.get("results", [])}

    def status(name: str) -> str:
        # a notebook that ran and whose page alone failed (e.g. nbconvert's templates not found) renders again as ok
        if str(recorded.get(name, {}).get("error", "")).startswith(RENDER_FAILED):
            return "ok"
        return statuses.get(name, "ok")

    results = [NotebookResult(p.stem, status(p.stem), float(recorded.get(p.stem, {}).get("duration_s") or 0.0),
                              ipynb=f"notebooks/{p.name}")
               for p in sorted((run.path / "notebooks").glob("*.ipynb"))]
    print(f"[specdiag] index: {Path(render_run(run, results)).resolve()}")
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
