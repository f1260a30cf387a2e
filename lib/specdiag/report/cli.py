"""``python -m specdiag.report``'s command line: its parser and ``main``."""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from typing import Sequence

from specdiag.report.commands import cmd_check_offline, cmd_compare, cmd_render, cmd_replay, cmd_run

#: What the report does and how it is called (the parser's description, ``--help``).
USAGE = """Execute the notebooks into a run folder, render offline HTML and write the index.

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


def add_run_arguments(p: argparse.ArgumentParser, notebook_positional: bool = False) -> None:
    """``run``'s options (``notebook_positional``: one notebook named first, as ``specdiag notebook NB``)."""
    from specdiag.launchers.cli import add_engine_arguments  # noqa: PLC0415

    if notebook_positional:
        p.add_argument("notebook", metavar="NB", help="the notebook to run, e.g. 04_commit_probe (or 04)")
    p.add_argument("--server", default="", help="SGLang or vLLM server URL (the engine is recognised); empty starts --engine (default: embedded)")
    p.add_argument("--params", default="", help="YAML file of papermill parameters (see params/)")
    if not notebook_positional:
        p.add_argument("--notebooks", nargs="*", help="notebooks to run (default: all but 08_compare_runs)")
    p.add_argument("--run-dir", default="", help="run folder (default: a new one under data/runs/)")
    add_engine_arguments(p, title="engine to start when no --server is given")


def add_replay_arguments(p: argparse.ArgumentParser, run_positional: bool = False) -> None:
    """``replay``'s options (``run_positional``: the recorded run named first, as ``specdiag replay RUN``)."""
    run_help = "recorded run folder, e.g. data/reference/ct200-kimi-k26"
    if run_positional:
        p.add_argument("run", metavar="RUN", help=run_help)
    else:
        p.add_argument("--run", required=True, help=run_help)
    p.add_argument("--params", default="", help="YAML file of papermill parameters (see params/)")
    p.add_argument("--notebooks", nargs="*", help="notebooks to run (default: every one the recorded run can feed)")
    p.add_argument("--run-dir", default="", help="run folder (default: a new one under data/runs/)")


def add_compare_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--run-a", default="", help="run folder A, the reference, e.g. data/reference/sglang-h200-mla2-stock-traced")
    p.add_argument("--run-b", default="", help="run folder B, judged against A")
    p.add_argument("--params", default="", help="YAML file that may name run_a and run_b (params/compare-plugin.yaml)")
    p.add_argument("--run-dir", default="", help="run folder (default: a new one under data/runs/)")


#: Each command: (one line of help, the function that adds its options, the function that runs it).
COMMANDS = {
    "run": ("measure: execute notebooks against a server (default: the embedded one)", add_run_arguments, cmd_run),
    "replay": ("analyse a recorded run with every notebook that can replay it", add_replay_arguments, cmd_replay),
    "compare": ("08_compare_runs on two run folders (A before, B after), no server", add_compare_arguments, cmd_compare),
}


def command_parser(command: str, prog: str, description: str = "", positional: bool = False) -> argparse.ArgumentParser:
    """A parser of one command alone, named ``prog``: what ``specdiag report|notebook|replay|compare --help`` shows.
    ``positional``: the notebook (run) or the recorded run (replay) is named first, without its option."""
    help_, add, _ = COMMANDS[command]
    p = argparse.ArgumentParser(prog=prog, description=description or help_)
    if positional:
        add(p, True)
    else:
        add(p)
    return p


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m specdiag.report", description=USAGE,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    for name, (help_, add, func) in COMMANDS.items():
        s = sub.add_parser(name, help=help_)
        add(s)
        s.set_defaults(func=func)
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
        from specdiag.process import EngineStartError  # noqa: PLC0415
        from specdiag.nb import ParameterError  # noqa: PLC0415

        known = (ValueError, FileNotFoundError, ParameterError, EngineStartError)
        try:
            from specdiag.serving.errors import ServerError  # noqa: PLC0415

            known = known + (ServerError,)
        except ImportError:
            pass
        if isinstance(exc, known):
            from specdiag.report.words import in_users_words  # noqa: PLC0415

            print(f"[specdiag] error: {in_users_words(str(exc))}", file=sys.stderr)
            return 2
        raise
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


if __name__ == "__main__":
    sys.exit(main())
