"""The command lines of ``specdiag sweep``, ``specdiag merge`` and ``python -m specdiag.sweep models``.

    specdiag sweep --arms params/arms/engine-ab-ngram.yaml --measure engine_ab --out RUN \\
        [--only triton,flashinfer] [--contexts 1024,65536] [--repeats 3] [--max-new-tokens 16] [--set KEY=VALUE] \\
        [--budget-s 540] [--min-arm-s 60] [--site DIR] [--plugin-path DIR] [--startup-s 900] [--check]
    specdiag merge --out DEST [--arms A,B] SRC [SRC ...]
    python -m specdiag.sweep models --arms FILE [--only ARMS]   # make the model folders the arms name, if missing

``--check`` parses the arms file and the settings and builds every server's command, then stops: nothing starts.
"""

from __future__ import annotations

import argparse
import shlex
import signal
import subprocess
import sys
from pathlib import Path
from typing import Sequence

from specdiag.sweep.arms import ArmsError, load_arms
from specdiag.sweep.registry import MEASUREMENTS, UnknownMeasurement
from specdiag.sweep.settings import SettingsError, overrides


def sweep_parser(prog: str = "specdiag sweep") -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog=prog, description="start each arm's server in turn, measure it, stop it")
    ap.add_argument("--arms", required=True, help="the arms file (YAML; params/arms/ has examples)")
    ap.add_argument("--measure", required=True, metavar="NAME[,NAME...]",
                    help="the named measurement, or several comma-separated (each arm's server measured by each in "
                         "turn): " + ", ".join(sorted(MEASUREMENTS)))
    ap.add_argument("--out", required=True, help="the run folder (created; rows appended as measured)")
    ap.add_argument("--only", default="", help="only these arms of the file, comma-separated (in the file's order)")
    ap.add_argument("--contexts", default="", help="prompt tokens, comma-separated (the setting contexts)")
    ap.add_argument("--repeats", type=int, default=None, help="requests per cell (the setting repeats)")
    ap.add_argument("--max-new-tokens", type=int, default=None, help="tokens per request (the setting max_new_tokens)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="any other setting of the measurement (repeatable)")
    ap.add_argument("--budget-s", type=float, default=None, help="wall-clock seconds for the whole sweep")
    ap.add_argument("--min-arm-s", type=float, default=60.0, help="start an arm only with this much budget left")
    ap.add_argument("--stop-margin-s", type=float, default=20.0,
                    help="stop measuring this long before the budget ends (time to stop the server)")
    ap.add_argument("--startup-s", type=float, default=900.0, help="longest wait for one server to be ready")
    ap.add_argument("--site", default="", help="SGLang's site folder, first on its servers' PYTHONPATH")
    ap.add_argument("--plugin-path", default="", help="the installed SGLang plugin (pip --target folder)")
    ap.add_argument("--device", default="auto", help="the embedded engine's device (auto, cpu, cuda)")
    ap.add_argument("--check", action="store_true", help="check the arms, settings and commands; start nothing")
    return ap


def _overrides(args: argparse.Namespace) -> dict[str, object]:
    """The command line's settings, over the arms file's."""
    raw: dict[str, object] = dict(overrides(args.set))
    if args.contexts:
        raw["contexts"] = args.contexts
    if args.repeats is not None:
        raw["repeats"] = args.repeats
    if args.max_new_tokens is not None:
        raw["max_new_tokens"] = args.max_new_tokens
    return raw


def _sigterm(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)  # unwinds like Ctrl-C: the server running is stopped, run.json says so


def sweep_main(argv: Sequence[str], prog: str = "specdiag sweep") -> int:
    from specdiag.sweep.driver import SweepOptions, plan, sweep  # noqa: PLC0415
    from specdiag.sweep.servers import Host, server_command  # noqa: PLC0415

    args = sweep_parser(prog).parse_args(list(argv))
    out = Path(args.out).resolve()
    host = Host(work=out, site=args.site, plugin_path=args.plugin_path, device=args.device)
    try:
        planned = plan(args.arms, args.measure, [a.strip() for a in args.only.split(",") if a.strip()],
                       _overrides(args), host)
    except (ArmsError, SettingsError, UnknownMeasurement, ValueError) as exc:
        print(f"[specdiag sweep] error: {exc}", file=sys.stderr)
        return 2
    arms = planned.arms
    if args.check:
        for arm in arms.arms:
            print(f"{arm.name}: " + (f"the running server at {arm.url} (not started)" if arm.running
                                     else shlex.join(server_command(arm, host, port=0))))
        print(f"[specdiag sweep] {len(arms.arms)} arms and the {args.measure} settings check out; nothing started")
        return 0
    signal.signal(signal.SIGTERM, _sigterm)
    opts = SweepOptions(out=out, budget_s=args.budget_s, min_arm_s=args.min_arm_s, stop_margin_s=args.stop_margin_s,
                        startup_s=args.startup_s, command=shlex.join([prog.split()[0], *prog.split()[1:], *argv]))
    return sweep(arms, planned.measures, opts, host)


def merge_main(argv: Sequence[str], prog: str = "specdiag merge") -> int:
    from specdiag.sweep.merge import MergeError, merge_parts  # noqa: PLC0415

    ap = argparse.ArgumentParser(prog=prog, description="join the parts of a sweep (their run folders) into one run")
    ap.add_argument("--out", required=True, help="the merged run folder (created, or an earlier merge to extend)")
    ap.add_argument("--arms", default="", help="only these arms of the parts, comma-separated (e.g. a speculation-off "
                    "twin measured in parts made for another run)")
    ap.add_argument("sources", nargs="+", help="the parts' run folders, in the order they ran")
    args = ap.parse_args(list(argv))
    try:
        out = merge_parts(args.out, args.sources, [a.strip() for a in args.arms.split(",") if a.strip()] or None)
    except (MergeError, FileNotFoundError) as exc:
        print(f"[specdiag merge] error: {exc}", file=sys.stderr)
        return 2
    tables = {p.stem: len(out.rows(p.stem)) for p in sorted(Path(out.path).glob("*.jsonl"))}
    print(f"merged {len(args.sources)} parts into {args.out}: "
          + ", ".join(f"{n} {t} rows" for t, n in tables.items()) + f"; arms {', '.join(out.meta.get('arms') or {})}")
    return 0


def models_main(argv: Sequence[str]) -> int:
    """Make each model folder the arms file has a recipe for and that is missing (in the file's order)."""
    ap = argparse.ArgumentParser(prog="python -m specdiag.sweep models", description=models_main.__doc__)
    ap.add_argument("--arms", required=True)
    ap.add_argument("--only", default="")
    ap.add_argument("--python", default=sys.executable)
    args = ap.parse_args(list(argv))
    try:
        arms = load_arms(args.arms)
        if args.only:
            arms = arms.select([a.strip() for a in args.only.split(",") if a.strip()])
    except ArmsError as exc:
        print(f"[specdiag sweep models] error: {exc}", file=sys.stderr)
        return 2
    named = {p for a in arms.arms for p in (a.model, a.speculation.drafter) if p}
    for recipe in arms.models:
        if recipe.path not in named:
            continue
        if (Path(recipe.path) / "config.json").is_file():
            print(f"[models] {recipe.path}: there already", flush=True)
            continue
        cmd = recipe.command(args.python)
        print(f"[models] {shlex.join(cmd)}", flush=True)
        rc = subprocess.call(cmd)  # noqa: S603 - the arms file's own recipe
        if rc != 0:  # a maker's own check may exit non-zero with the model written (make_moe_model.py --check: 3)
            print(f"[models] {recipe.path}: the recipe exited {rc}", file=sys.stderr, flush=True)
    missing = sorted(p for p in named if not (Path(p) / "config.json").is_file())
    if missing:
        print(f"[models] no recipe made {', '.join(missing)}: add it under models: in {args.arms}", file=sys.stderr)
        return 5
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    verbs = {"sweep": lambda a: sweep_main(a, "python -m specdiag.sweep sweep"),
             "merge": lambda a: merge_main(a, "python -m specdiag.sweep merge"), "models": models_main}
    if not args or args[0] not in verbs:
        print("usage: python -m specdiag.sweep sweep|merge|models ...  (specdiag sweep / specdiag merge)",
              file=sys.stderr)
        return 2
    return verbs[args[0]](args[1:])
