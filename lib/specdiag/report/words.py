"""The user's words for a setting: make's variables (``SERVER=...``) when make ran the report, else the command line's
options (``--server``), whether through the ``specdiag`` console script or ``python -m specdiag.report``.

The Makefile's report, notebook, replay and compare targets set ``SPECDIAG_INVOKED_AS=make`` on the command they run.
The library's messages name a notebook's parameters (``server_url``); :func:`in_users_words` turns those names into
the setting the user wrote, so a make user who set ``SERVER`` reads ``SERVER`` back.
"""

from __future__ import annotations

import os
import re
from typing import Mapping

INVOKED_AS_ENV = "SPECDIAG_INVOKED_AS"
#: a notebook parameter (or setting) -> how each way of calling the report names it
WORDS: dict[str, dict[str, str]] = {
    "make": {"server_url": "SERVER", "run_dir": "RUN_DIR", "replay_dir": "RUN", "params": "PARAMS",
             "engine": "ENGINE", "notebooks": "NB"},
    "options": {"server_url": "--server", "run_dir": "--run-dir", "replay_dir": "--run", "params": "--params",
                "engine": "--engine", "notebooks": "--notebooks"},
}


def vocabulary(environ: Mapping[str, str] = os.environ) -> dict[str, str]:
    """The words of the way this process was called (make's, or the options')."""
    return WORDS["make" if environ.get(INVOKED_AS_ENV) == "make" else "options"]


def word(setting: str, environ: Mapping[str, str] = os.environ) -> str:
    """How the user names ``setting`` (``"server_url"`` -> ``"SERVER"`` under make, ``"--server"`` otherwise)."""
    return vocabulary(environ).get(setting, setting)


def params_hint(environ: Mapping[str, str] = os.environ) -> str:
    """Where a make or command-line user sets a notebook's parameter."""
    if environ.get(INVOKED_AS_ENV) == "make":
        return "set it in the PARAMS file (make ... PARAMS=file.yaml)"
    return "set it in the --params file"


def in_users_words(message: str, environ: Mapping[str, str] = os.environ) -> str:
    """``message`` with the notebook parameters that the report sets from the user's settings named as the user set
    them (``server_url`` -> ``SERVER``)."""
    words = vocabulary(environ)
    for setting in ("server_url", "run_dir", "replay_dir"):
        message = re.sub(rf"\b{setting}\b", words[setting], message)
    return message
