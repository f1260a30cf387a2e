"""``specdiag``: the Makefile's verbs as one console script, for people who run specdiag without ``make``.

    specdiag report   [--server URL] [--params FILE] [--run-dir DIR] [engine options]   (make report)
    specdiag notebook NB [same options as report]                                     (make notebook NB=...)
    specdiag replay   RUN [--params FILE] [--run-dir DIR] [--notebooks NB ...]          (make replay RUN=...)
    specdiag serve    [--engine embedded|sglang] [engine options]                       (make serve)
    (report, notebook and serve also take --plugin splitkv|upstream|off: make's PLUGIN=)
    specdiag lab      [jupyter lab options]                                             (make lab)
    specdiag sweep    --arms FILE --measure NAME --out RUN [--contexts ...] [--budget-s N]  (arms as data)
    specdiag merge    --out DEST SRC...                                                 (join a sweep's parts)

Each verb hands its options to the module the Makefile calls (``python -m specdiag.report run|replay``,
``python -m specdiag.launchers serve``), so the options are the same ones; ``specdiag VERB --help`` shows the
verb's own usage with every option it takes, ``--plugin`` included (:func:`verb_parser`). Like the Makefile, it keeps Jupyter, IPython and matplotlib state in
``<project>/.jupyter-local`` (never HOME) unless those variables are set already.

The notebooks and data are read from the project root (:data:`specdiag.paths.PROJECT_ROOT`): the checkout an
editable install points at, or ``SPECDIAG_ROOT``. ``make`` stays the documented way inside the repository.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Callable, Sequence

from specdiag.paths import NOTEBOOKS_DIR, PROJECT_ROOT

#: Local state folders, as the Makefile exports them.
STATE_VARS = {"IPYTHONDIR": "ipython", "JUPYTER_CONFIG_DIR": "config", "JUPYTER_DATA_DIR": "data",
              "JUPYTER_RUNTIME_DIR": "runtime", "MPLCONFIGDIR": "matplotlib"}
OFFLINE_VARS = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}


def local_environment(environ: dict[str, str] | None = None) -> dict[str, str]:
    """The variables the Makefile exports, for those not already set: state under ``<project>/.jupyter-local``."""
    env = dict(os.environ if environ is None else environ)
    local = PROJECT_ROOT / ".jupyter-local"
    for var, sub in STATE_VARS.items():
        env.setdefault(var, str(local / sub))
    for var, value in OFFLINE_VARS.items():
        env.setdefault(var, value)
    return env


def _apply_environment() -> None:
    env = local_environment()
    for var in (*STATE_VARS, *OFFLINE_VARS):
        os.environ[var] = env[var]
    for var in STATE_VARS:
        os.makedirs(env[var], exist_ok=True)


def _need_notebooks() -> None:
    if not NOTEBOOKS_DIR.is_dir():
        raise SystemExit(f"[specdiag] error: no notebooks at {NOTEBOOKS_DIR}: specdiag runs its notebooks from a "
                         f"checkout of the repository. Set SPECDIAG_ROOT to that checkout (the folder with "
                         f"notebooks/ and data/), or install it editable there (pip install -e .).")


PLUGIN_CHOICES = ("splitkv", "upstream", "off")
PLUGIN_DIR = PROJECT_ROOT / "plugins" / "sglang"
PLUGIN_SITE = PROJECT_ROOT / ".plugin-site"


def take_plugin(argv: Sequence[str]) -> tuple[str, list[str]]:
    """``--plugin X`` / ``--plugin=X`` out of ``argv`` (the Makefile's ``PLUGIN=X``): (X or "", the rest)."""
    rest, plugin, args = [], "", list(argv)
    while args:
        a = args.pop(0)
        if a == "--plugin":
            if not args:
                raise SystemExit(f"[specdiag] error: --plugin needs a value: {' | '.join(PLUGIN_CHOICES)}")
            plugin = args.pop(0)
        elif a.startswith("--plugin="):
            plugin = a.split("=", 1)[1]
        else:
            rest.append(a)
    if plugin and plugin not in PLUGIN_CHOICES:
        raise SystemExit(f"[specdiag] error: --plugin {plugin!r}: choose {' | '.join(PLUGIN_CHOICES)}")
    return plugin, rest


def plugin_environment(plugin: str, environ: dict[str, str] | None = None) -> dict[str, str]:
    """What ``make ... PLUGIN=X`` exports for the servers a command starts: the SGLang plugin enabled in mode X,
    found on PYTHONPATH in ``<project>/.plugin-site`` (then lib/)."""
    env = dict(os.environ if environ is None else environ)
    paths = [str(PLUGIN_SITE), str(PROJECT_ROOT / "lib")] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])
    env.update(SGLANG_PLUGINS="specdiag_splitkv", SPECDIAG_SGLANG_VERIFY=plugin, PYTHONPATH=os.pathsep.join(paths))
    return env


def install_plugin() -> None:
    """``make plugin``: plugins/sglang into .plugin-site, no dependencies (offline retry without an index)."""
    import subprocess  # noqa: PLC0415

    base = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--upgrade", "--target", str(PLUGIN_SITE)]
    if subprocess.call(base + [str(PLUGIN_DIR)]) != 0 and subprocess.call(
            base + ["--no-build-isolation", "--no-index", str(PLUGIN_DIR)]) != 0:
        raise SystemExit(f"[specdiag] error: could not install the SGLang plugin from {PLUGIN_DIR} into {PLUGIN_SITE}")
    print(f"[plugin] installed into {PLUGIN_SITE}", flush=True)


def _with_plugin(run: Callable[[Sequence[str]], int]) -> Callable[[Sequence[str]], int]:
    """A verb that starts servers, taking ``--plugin splitkv|upstream|off`` as ``make`` takes ``PLUGIN=``."""
    def verb(argv: Sequence[str]) -> int:
        plugin, rest = take_plugin(argv)
        if plugin:
            install_plugin()
            os.environ.update(plugin_environment(plugin))
        return run(rest)
    verb.__doc__ = run.__doc__
    return verb


def _report(argv: Sequence[str]) -> int:
    from specdiag import report  # noqa: PLC0415

    return report.main(["run", *argv])


def _notebook(argv: Sequence[str]) -> int:
    if not argv or argv[0].startswith("-"):
        print("[specdiag] error: say which notebook, e.g. specdiag notebook 04_commit_probe", file=sys.stderr)
        return 2
    from specdiag import report  # noqa: PLC0415

    return report.main(["run", "--notebooks", argv[0], *argv[1:]])


def _replay(argv: Sequence[str]) -> int:
    if not argv or argv[0].startswith("-"):
        print("[specdiag] error: say which recorded run, e.g. specdiag replay data/reference/ct200-kimi-k26",
              file=sys.stderr)
        return 2
    from specdiag import report  # noqa: PLC0415

    return report.main(["replay", "--run", argv[0], *argv[1:]])


def _compare(argv: Sequence[str]) -> int:
    from specdiag import report  # noqa: PLC0415

    return report.main(["compare", *argv])


def _serve(argv: Sequence[str]) -> int:
    # The engines (embedded, sglang, and any later one) are specdiag.launchers' registry: a new engine
    # there is served here without a change to this file.
    from specdiag.launchers.__main__ import main as launchers_main  # noqa: PLC0415

    return launchers_main(["serve", *argv])


def _sweep(argv: Sequence[str]) -> int:
    from specdiag.sweep.cli import sweep_main  # noqa: PLC0415

    return sweep_main(argv)


def _merge(argv: Sequence[str]) -> int:
    from specdiag.sweep.cli import merge_main  # noqa: PLC0415

    return merge_main(argv)


def lab_command(argv: Sequence[str] = (), uid: int | None = None) -> list[str]:
    """The JupyterLab command ``make lab`` runs: on the notebooks folder, ``--allow-root`` as root."""
    if uid is None:
        uid = os.getuid() if hasattr(os, "getuid") else 1  # no uid on Windows: never root
    cmd = [sys.executable, "-m", "jupyterlab", f"--notebook-dir={NOTEBOOKS_DIR}"]
    return cmd + (["--allow-root"] if uid == 0 and "--allow-root" not in argv else []) + list(argv)


def _lab(argv: Sequence[str]) -> int:
    cmd = lab_command(argv)
    os.execv(cmd[0], cmd)  # JupyterLab replaces this process, as under make
    return 0  # not reached


#: Verbs that start servers, so take ``--plugin`` (make's ``PLUGIN=``).
PLUGIN_VERBS = ("report", "notebook", "serve")
#: verb -> (runner, needs the notebooks folder, one line of help)
VERBS: dict[str, tuple[Callable[[Sequence[str]], int], bool, str]] = {
    "report": (_with_plugin(_report), True, "run every notebook against --server, or an engine started around "
                                             "the run (--plugin splitkv|upstream|off: the SGLang plugin)"),
    "notebook": (_with_plugin(_notebook), True, "run one notebook (e.g. 04_commit_probe) the same way"),
    "replay": (_replay, True, "run every notebook that can replay a recorded run, no server needed"),
    "serve": (_with_plugin(_serve), False, "start an engine (--engine embedded|sglang) in the foreground; Ctrl-C "
                                           "stops it (--plugin as for report)"),
    "lab": (_lab, True, "open JupyterLab on the notebooks"),
    "compare": (_compare, True, "08 on two recorded run folders, no server (--run-a A --run-b B, or --params "
                                "params/compare-plugin.yaml)"),
    "sweep": (_sweep, False, "start each arm of an arms file in turn, measure it (--measure engine_ab|kv_layout|"
                             "moe_batch1), stop it: --arms FILE --measure NAME --out RUN"),
    "merge": (_merge, False, "join several sweeps' run folders into one run: --out DEST SRC..."),
}


#: verb -> how its help names the command: (report's command, the positional it takes first), or "serve".
HELP_OF = {"report": ("run", False), "notebook": ("run", True), "replay": ("replay", True), "compare": ("compare", False)}


def verb_parser(verb: str) -> argparse.ArgumentParser:
    """The parser whose help ``specdiag VERB --help`` prints: the verb's own usage (``specdiag VERB ...``) and every
    option it takes, ``--plugin`` included where the verb starts servers."""
    help_ = VERBS[verb][2]
    if verb == "sweep":
        from specdiag.sweep.cli import sweep_parser  # noqa: PLC0415

        return sweep_parser()
    if verb == "serve":
        from specdiag.launchers.__main__ import add_serve_arguments  # noqa: PLC0415

        parser = argparse.ArgumentParser(prog="specdiag serve", description=help_)
        add_serve_arguments(parser)
    elif verb in HELP_OF:
        from specdiag.report.cli import command_parser  # noqa: PLC0415

        command, positional = HELP_OF[verb]
        parser = command_parser(command, prog=f"specdiag {verb}", description=help_, positional=positional)
    else:
        raise KeyError(f"{verb!r} has no options of its own")
    if verb in PLUGIN_VERBS:
        parser.add_argument("--plugin", choices=PLUGIN_CHOICES,
                            help="the SGLang plugin of plugins/sglang, installed into .plugin-site and enabled for the "
                                 "servers this command starts (make's PLUGIN=): splitkv, upstream (SGLang's own split-KV "
                                 "forced on) or off")
    return parser


def usage() -> str:
    return "usage: specdiag VERB [options]   (specdiag VERB --help for its options)\n\n" + "\n".join(
        f"  {verb:<9} {help_}" for verb, (_, _, help_) in VERBS.items())


def version() -> str:
    """``specdiag --version``: the installed version and the checkout it runs from."""
    import importlib.metadata  # noqa: PLC0415

    try:
        installed = importlib.metadata.version("specdiag")
    except importlib.metadata.PackageNotFoundError:
        installed = "(not installed)"
    return f"specdiag {installed} ({PROJECT_ROOT})"


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help", "help"):
        print(usage())
        return 0 if args else 2
    if args[0] in ("--version", "-V", "version"):
        print(version())
        return 0
    verb, rest = args[0], args[1:]
    if verb not in VERBS:
        print(f"[specdiag] error: unknown verb {verb!r}\n{usage()}", file=sys.stderr)
        return 2
    run, needs_notebooks, _ = VERBS[verb]
    if verb not in ("lab", "merge") and ("-h" in rest or "--help" in rest):
        print(verb_parser(verb).format_help())  # the verb's own usage, not the module's it hands on to
        return 0
    named = verb not in ("notebook", "replay") or (rest and not rest[0].startswith("-"))  # else: the verb says it
    if verb not in ("lab", "merge") and named:
        try:
            verb_parser(verb).parse_args(rest)  # a wrong option: the verb's own usage and error, nothing run
        except SystemExit as exc:
            return int(exc.code or 0)
    os.environ.setdefault("SPECDIAG_INVOKED_AS", "specdiag")  # messages name its options (specdiag.report.words)
    if needs_notebooks:
        _need_notebooks()
    _apply_environment()
    return int(run(rest))


if __name__ == "__main__":
    sys.exit(main())
