"""The `specdiag` console script: the Makefile's verbs, handing their options to the same modules."""

from __future__ import annotations

import re
import sys

import pytest

from specdiag import cli
from specdiag.paths import NOTEBOOKS_DIR, PROJECT_ROOT


@pytest.fixture
def calls(monkeypatch) -> list[tuple[str, list[str]]]:
    """Record what each verb hands on instead of running notebooks or engines."""
    seen: list[tuple[str, list[str]]] = []
    from specdiag import report
    from specdiag.launchers import __main__ as launchers_main

    monkeypatch.setattr(report, "main", lambda argv: seen.append(("report", list(argv))) or 0)
    monkeypatch.setattr(launchers_main, "main", lambda argv: seen.append(("launchers", list(argv))) or 0)
    for var in (*cli.STATE_VARS, *cli.OFFLINE_VARS):
        monkeypatch.delenv(var, raising=False)  # restored after the test
    return seen


def test_verbs_hand_the_makefile_options_on(calls) -> None:
    assert cli.main(["report", "--server", "http://gpu:30000", "--params", "params/full.yaml"]) == 0
    assert cli.main(["notebook", "04_commit_probe", "--engine", "embedded"]) == 0
    assert cli.main(["replay", "data/reference/ct200-kimi-k26", "--run-dir", "data/runs/x"]) == 0
    assert cli.main(["serve", "--engine", "sglang", "--model", "m"]) == 0
    assert cli.main(["compare", "--run-a", "data/reference/a", "--run-b", "data/reference/b"]) == 0
    assert calls == [
        ("report", ["run", "--server", "http://gpu:30000", "--params", "params/full.yaml"]),
        ("report", ["run", "--notebooks", "04_commit_probe", "--engine", "embedded"]),
        ("report", ["replay", "--run", "data/reference/ct200-kimi-k26", "--run-dir", "data/runs/x"]),
        ("launchers", ["serve", "--engine", "sglang", "--model", "m"]),
        ("report", ["compare", "--run-a", "data/reference/a", "--run-b", "data/reference/b"]),
    ]


def test_state_stays_in_the_project_and_mistakes_are_named(calls, capsys) -> None:
    import os

    cli.main(["report"])
    assert os.environ["JUPYTER_DATA_DIR"] == str(PROJECT_ROOT / ".jupyter-local" / "data")
    assert os.environ["MPLCONFIGDIR"] == str(PROJECT_ROOT / ".jupyter-local" / "matplotlib")
    assert cli.main(["notebook"]) == 2 and "say which notebook" in capsys.readouterr().err
    assert cli.main(["replay", "--run-dir", "x"]) == 2 and "say which recorded run" in capsys.readouterr().err
    assert cli.main(["frobnicate"]) == 2 and "unknown verb 'frobnicate'" in capsys.readouterr().err
    assert cli.main([]) == 2
    listed = capsys.readouterr().out
    assert all(v in listed for v in cli.VERBS)


def test_lab_runs_jupyterlab_on_the_notebooks_with_allow_root_only_as_root() -> None:
    as_root = cli.lab_command(uid=0)
    assert as_root[:3] == [sys.executable, "-m", "jupyterlab"] and f"--notebook-dir={NOTEBOOKS_DIR}" in as_root
    assert "--allow-root" in as_root
    assert "--allow-root" not in cli.lab_command(uid=1000)
    assert cli.lab_command(["--port", "9999"], uid=0)[-2:] == ["--port", "9999"]


def test_the_console_script_is_declared() -> None:
    import tomllib

    scripts = tomllib.loads((PROJECT_ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts == {"specdiag": "specdiag.cli:main"}


def test_plugin_option_mirrors_make_plugin(calls, monkeypatch) -> None:
    installed: list[bool] = []
    monkeypatch.setattr(cli, "install_plugin", lambda: installed.append(True))
    for var in ("SGLANG_PLUGINS", "SPECDIAG_SGLANG_VERIFY", "PYTHONPATH"):
        monkeypatch.delenv(var, raising=False)
    assert cli.main(["serve", "--engine", "sglang", "--plugin", "splitkv"]) == 0
    assert calls[-1] == ("launchers", ["serve", "--engine", "sglang"]) and installed == [True]
    import os

    assert os.environ["SGLANG_PLUGINS"] == "specdiag_splitkv" and os.environ["SPECDIAG_SGLANG_VERIFY"] == "splitkv"
    assert os.environ["PYTHONPATH"].split(os.pathsep)[:2] == [str(cli.PLUGIN_SITE), str(PROJECT_ROOT / "lib")]
    assert cli.take_plugin(["--plugin=off", "--x"]) == ("off", ["--x"]) and cli.take_plugin(["--x"]) == ("", ["--x"])
    with pytest.raises(SystemExit, match=re.escape("choose splitkv | upstream | off")):
        cli.take_plugin(["--plugin", "fast"])


def _options(parser) -> set[str]:
    return {s for a in parser._actions for s in a.option_strings if s.startswith("--")}


@pytest.mark.parametrize("verb, command", [("report", "run"), ("notebook", "run"), ("replay", "replay"),
                                           ("compare", "compare")])
def test_verb_help_is_the_verbs_own_with_every_option(verb, command, calls, capsys) -> None:
    """`specdiag report --help` shows `specdiag report`'s usage (not the module's it hands on to), every option the
    report's command takes and --plugin where the verb starts servers; nothing runs."""
    from specdiag.report.cli import build_parser

    assert cli.main([verb, "--help"]) == 0
    shown = capsys.readouterr().out
    assert shown.startswith(f"usage: specdiag {verb} ") and "python -m specdiag.report" not in shown
    sub = build_parser()._subparsers._group_actions[0].choices[command]  # what the verb hands its options to
    wanted = _options(sub) - ({"--notebooks"} if verb == "notebook" else {"--run"} if verb == "replay" else set())
    missing = {o for o in wanted if o not in shown}
    assert not missing, f"specdiag {verb} --help leaves out {sorted(missing)}"
    assert ("--plugin {splitkv,upstream,off}" in shown) == (verb in cli.PLUGIN_VERBS)
    assert calls == []  # help only: nothing was handed on


def test_serve_help_shows_the_engine_options_and_plugin(calls, capsys) -> None:
    assert cli.main(["serve", "-h"]) == 0
    shown = capsys.readouterr().out
    assert shown.startswith("usage: specdiag serve ") and "--engine" in shown and "--log" in shown
    assert "--plugin" in shown and calls == []


def test_make_help_lists_every_target_in_one_aligned_column() -> None:
    """`make help`: one line per `##` target, each description starting in the same column (a long target name such
    as test-engines widens the column instead of pushing its description out of line)."""
    import shutil
    import subprocess

    if not shutil.which("make"):
        pytest.skip("no make on this machine")
    out = subprocess.run(["make", "-s", "help"], cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    targets = re.findall(r"^([a-zA-Z_-]+):.*## ", (PROJECT_ROOT / "Makefile").read_text(), re.MULTILINE)
    lines = [line for line in out.stdout.splitlines() if line.startswith("  make ")]
    assert [line.split()[1] for line in lines] == targets and "test-engines" in targets
    starts = {len(line) - len(line[len("  make "):].split(None, 1)[1]) for line in lines}
    assert len(starts) == 1, f"descriptions start in columns {sorted(starts)}:\n" + "\n".join(lines)


def test_a_wrong_option_gets_the_verbs_own_usage_and_version_is_said(calls, capsys) -> None:
    """`specdiag report --bogus`: the console script's usage of report (not python -m specdiag.report's), exit 2,
    nothing handed on; `specdiag --version` names the version and the checkout it runs."""
    assert cli.main(["report", "--bogus"]) == 2 and calls == []
    err = capsys.readouterr().err
    assert err.startswith("usage: specdiag report") and "specdiag report: error: unrecognized arguments: --bogus" in err
    assert "python -m specdiag.report" not in err
    assert cli.main(["serve", "--context-length", "1.4k"]) == 2 and "1433.6 tokens" in capsys.readouterr().err
    assert cli.main(["--version"]) == 0
    out = capsys.readouterr().out.strip()
    assert re.fullmatch(r"specdiag \S+ \(.+\)", out) and str(PROJECT_ROOT) in out
