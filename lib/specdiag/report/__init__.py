"""Execute the notebooks into a run folder, render offline HTML and write the index.

The face of the package; the work lives in its modules:

- ``cli``: ``python -m specdiag.report`` (``main``, ``build_parser``), what ``make report|notebook|replay|compare`` run
- ``commands``: the commands (run, replay, compare, render, check-offline) and the engine started around a run
- ``notebooks``: which notebooks run, their parameters (PARAMS files), what a recorded run needs to be replayed
- ``execute``: papermill execution of one notebook and of a list (``NotebookResult``)
- ``render``: offline HTML of an executed notebook, findings.json, network references in a page
- ``index``: the run's index.html and data/runs/index.html
- ``environment``: Jupyter, IPython and matplotlib state under ``.jupyter-local``
- ``outputs``: executed outputs made fit to share (progress bars as plain lines)
"""

from __future__ import annotations

from specdiag.report.cli import USAGE, build_parser, main
from specdiag.report.commands import (ENGINE_DEFAULT_PARAMS, cmd_check_offline, cmd_compare, cmd_render, cmd_replay,
                                      cmd_run, finish, report_command, server_for_report)
from specdiag.report.environment import LOCAL_STATE_DIR, apply_local_jupyter_env, local_jupyter_env
from specdiag.report.execute import NotebookResult, execute_notebook, run_notebooks
from specdiag.report.index import write_run_index, write_runs_index
from specdiag.report.notebooks import (NOT_IN_REPORT, REPLAY_NEEDS, available_notebooks, checked_params_file,
                                       declared_parameters, load_params_file, parameters_for, replay_need_met,
                                       replay_need_text, select_notebooks)
from specdiag.report.notebooks import _is_notebook_key  # noqa: F401 - tests read PARAMS files' notebook keys
from specdiag.report.render import (TEMPLATE_NAME, TEMPLATES_DIR, collect_results, network_references, render_html,
                                    render_run)

__all__ = [
    "USAGE", "build_parser", "main", "ENGINE_DEFAULT_PARAMS", "cmd_check_offline", "cmd_compare", "cmd_render",
    "cmd_replay", "cmd_run", "finish", "report_command", "server_for_report", "LOCAL_STATE_DIR",
    "apply_local_jupyter_env", "local_jupyter_env", "NotebookResult", "execute_notebook", "run_notebooks",
    "write_run_index", "write_runs_index", "NOT_IN_REPORT", "REPLAY_NEEDS", "available_notebooks", "checked_params_file",
    "declared_parameters", "load_params_file", "parameters_for", "replay_need_met", "replay_need_text",
    "select_notebooks", "TEMPLATE_NAME", "TEMPLATES_DIR", "collect_results", "network_references", "render_html",
    "render_run",
]
