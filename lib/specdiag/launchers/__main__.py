"""``python -m specdiag.launchers serve --engine sglang --model M ...``: start an engine, print its URL,
keep it in the foreground until Ctrl-C (or SIGTERM), then stop its whole process tree.

``python -m specdiag.launchers command --engine sglang ...`` prints the command line it would run."""

from __future__ import annotations

import argparse
import shlex
import signal
import sys
from pathlib import Path
from typing import Sequence

from specdiag.launchers import engine_server
from specdiag.launchers.cli import add_engine_arguments, engine_options_from_args
from specdiag.launchers.sglang import SGLangLaunchError
from specdiag.process import EngineStartError


def _raise_interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def cmd_serve(args: argparse.Namespace) -> int:
    options = engine_options_from_args(args)
    from specdiag.paths import RUNS_DIR  # noqa: PLC0415

    options["log_path"] = Path(args.log) if args.log else RUNS_DIR / f"serve-{args.engine}.log"
    server = engine_server(args.engine, **options)
    # Ctrl-C and `kill` both stop the tree (SIGINT explicitly: a shell may start us with it ignored)
    signal.signal(signal.SIGTERM, _raise_interrupt)
    signal.signal(signal.SIGINT, _raise_interrupt)
    try:
        server.start()
        print(f"[specdiag] {args.engine} ready at {server.url} (log: {server.log_path}); Ctrl-C stops it",
              flush=True)
        code = server.wait()
        print(f"[specdiag] {args.engine} exited by itself with code {code}; log: {server.log_path}",
              file=sys.stderr, flush=True)
        return 1
    except KeyboardInterrupt:
        print(f"\n[specdiag] stopping {args.engine} ...", flush=True)
        server.stop()
        print(f"[specdiag] {args.engine} stopped", flush=True)
        return 0
    finally:
        server.stop()


def cmd_command(args: argparse.Namespace) -> int:
    from specdiag.launchers.sglang import sglang_command, sglang_env, sglang_launch  # noqa: PLC0415

    if args.engine != "sglang":
        print(f"[specdiag] error: `command` prints SGLang command lines only, not {args.engine}'s", file=sys.stderr)
        return 2
    opts = engine_options_from_args(args)
    opts.pop("startup_timeout_s", None)
    launch = sglang_launch(**opts)
    env = " ".join(f"{k}={shlex.quote(v)}" for k, v in sglang_env(launch).items())
    print(env + " " + shlex.join(sglang_command(launch)))
    return 0


SERVE_HELP = "start an engine and keep it running until Ctrl-C"


def add_serve_arguments(p: argparse.ArgumentParser) -> None:
    """``serve``'s options: the engine and its settings, the log file."""
    add_engine_arguments(p, default_port=30000)
    p.add_argument("--log", help="server log file, appended to (default: data/runs/serve-ENGINE.log)")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m specdiag.launchers", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("serve", help=SERVE_HELP)
    add_serve_arguments(s)
    s.set_defaults(func=cmd_serve)
    c = sub.add_parser("command", help="print the SGLang command line and environment (starts nothing)")
    add_engine_arguments(c, default_port=30000)
    c.set_defaults(func=cmd_command)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args))
    except (EngineStartError, SGLangLaunchError, ValueError, FileNotFoundError) as exc:
        print(f"[specdiag] error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
