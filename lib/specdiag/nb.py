"""The common start of every notebook: check parameters, open the run folder, reach the server
or open the recorded run to replay.

Every notebook opens its page the same way, right after its ``parameters`` cell::

    pg = page.start(nb.check_parameters(globals()))   # the step's Page (a :class:`Page`): checks, then nb.start

and the page calls :func:`start`, which gives the notebook context::

    ctx.run        # where this notebook writes (rows, findings)
    ctx.source     # the run whose rows are analysed: ctx.run when measuring, the recorded run when replaying
    ctx.live       # measuring (True) or replaying (False): decided here, once, for every section of the notebook
    ctx.client     # a specdiag.serving.ServingClient (SGLang or vLLM, recognised from the server), or None when replaying
"""

from __future__ import annotations

import ast
import html
import importlib.metadata
import json
import platform
import re
import sys
import typing
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any, ClassVar, Mapping, MutableMapping

from specdiag import subject
from specdiag.paths import NOTEBOOKS_DIR, relative_to_project, shown
from specdiag.runs import Run
from specdiag.section import Section
from specdiag.serving.identity import changes, server_identity
from specdiag.tokens import EXAMPLE, token_count, token_counts


class ParameterError(ValueError):
    """A notebook parameter is invalid; the message names the parameter and the fix."""


@dataclass
class NotebookContext:
    notebook: str
    run: Run
    source: Run
    server_url: str = ""
    client: Any = None  # specdiag.serving.ServingClient when measuring
    params: dict[str, Any] = field(default_factory=dict)
    settings: Any = None  # specdiag.serving.ServerSettings of the server, when measuring
    live: bool = True  # measuring into ``run`` (False: analysing the recorded run ``source``)
    recorded_from: str | None = None  # the reference run replayed because nothing was asked for (07 keeps it apart)

    @property
    def server_info(self) -> dict[str, Any]:
        """The server's settings under run.json's flat names (SGLang's /server_info names, for every
        engine; ``ServerSettings.as_server_info``); {} when replaying."""
        return self.settings.as_server_info() if self.settings is not None else {}

    @property
    def replaying(self) -> bool:
        """True when analysing a recorded run instead of measuring (``not live``)."""
        return not self.live


def versions() -> dict[str, str]:
    """Versions of the things a reader needs to reproduce this notebook's numbers."""
    out = {"python": platform.python_version(), "platform": platform.platform()}
    for dist in ("specdiag", "torch", "transformers", "pandas", "matplotlib", "papermill"):
        try:  # read the installed metadata: importing papermill here would pull in tqdm.auto
            out[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            out[dist] = "not installed"
    return out


def check(condition: bool, message: str) -> None:
    """Raise :class:`ParameterError` with ``message`` unless ``condition`` holds."""
    if not condition:
        raise ParameterError(message)


_TYPE_WORDS = {str: "a string", int: "a whole number", float: "a number", bool: "True or False", list: "a list",
               dict: "a mapping"}
_PLURALS = {str: "strings", int: "whole numbers", float: "numbers", bool: "True or False values"}


def _describe(tp: Any) -> str:
    args = typing.get_args(tp)
    if typing.get_origin(tp) is list and args:
        return f"a list of {_PLURALS.get(args[0], getattr(args[0], '__name__', str(args[0])))}"
    return _TYPE_WORDS.get(tp, getattr(tp, "__name__", str(tp)))


def _is_a(value: Any, tp: Any) -> bool:
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is list:
        return isinstance(value, (list, tuple)) and all(_is_a(v, args[0]) for v in value) if args else \
            isinstance(value, (list, tuple))
    if tp is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if tp is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if tp is dict:
        return isinstance(value, Mapping)
    return isinstance(value, tp) if isinstance(tp, type) else True


#: Parameters that hold context lengths in tokens besides those named ``*context*`` (09's band edges).
CONTEXT_PARAMETERS = ("band_edges",)
#: The types a ``parameters`` cell annotates with, by the name papermill's inspection reports.
_TYPE_NAMES = {"str": str, "int": int, "float": float, "bool": bool, "list": list, "dict": dict}


def is_context_parameter(name: str) -> bool:
    """Whether parameter ``name`` holds context lengths in tokens, so takes ``"1k"``, ``"128k"`` (specdiag.tokens)."""
    return "context" in name or name in CONTEXT_PARAMETERS


def annotation_type(type_name: str) -> Any:
    """The type papermill's ``inferred_type_name`` names (``"int"``, ``"list[int]"``), or None when it is none of
    the cell's plain types (then no type is checked)."""
    m = re.fullmatch(r"\s*(\w+)\s*(?:\[\s*(\w+)\s*\])?\s*", type_name or "")
    if not m or m.group(1) not in _TYPE_NAMES:
        return None
    if m.group(2):
        return list[_TYPE_NAMES[m.group(2)]] if m.group(1) == "list" and m.group(2) in _TYPE_NAMES else None
    return _TYPE_NAMES[m.group(1)]


def checked_value(name: str, value: Any, tp: Any, how_to_set: str) -> Any:
    """``value`` of parameter ``name`` checked against its annotated type ``tp``: a context parameter's ``"128k"``
    comes back as 131072 (a list's entries likewise, or ``"1k,128k"`` as a list); else ``value`` unchanged. A mismatch
    raises :class:`ParameterError` naming the parameter, the type it takes and ``how_to_set`` it."""
    if tp is None:
        return value
    if is_context_parameter(name) and (tp is int or tp == list[int]):
        try:
            value = token_count(value, name) if tp is int else token_counts(value, name)
        except ValueError as exc:
            raise ParameterError(f"{exc}: {how_to_set}") from None
        words = EXAMPLE if tp is int else f"a list of token counts, each {EXAMPLE}"
    else:
        words = _describe(tp)
    check(_is_a(value, tp), f"{name} must be {words}; got {value!r} ({type(value).__name__}): {how_to_set}")
    return value


def check_parameters(namespace: MutableMapping[str, Any]) -> dict[str, Any]:
    """Every parameter against the type its ``parameters`` cell annotates it with (``name: int = 3``), before any server
    starts; the notebook's own checks of ranges and combinations follow. A context parameter given as ``"128k"`` is
    replaced in ``namespace`` by its token count (:func:`checked_value`). Returns ``{name: value}`` of the annotated
    parameters (a notebook's ``params``). The first mismatch raises :class:`ParameterError` naming the parameter, the
    type it takes and how to set it."""
    annotations = dict(namespace.get("__annotations__") or {})
    for name, tp in annotations.items():
        value = checked_value(name, namespace.get(name), tp, f"set it in the parameters cell, or with papermill -p "
                              f"{name} VALUE (make: PARAMS=file.yaml)")
        if value is not namespace.get(name):
            namespace[name] = value
    return {name: namespace.get(name) for name in annotations}


def brief_parameter_errors() -> None:
    """Show a :class:`ParameterError` on the page as its one-line message, not as a traceback through the library;
    the cell still fails (a papermill run stops there and says which parameter). Outside IPython: nothing."""
    try:
        from IPython import get_ipython  # noqa: PLC0415 - optional: the except says what happens without it
    except ImportError:
        return
    shell = get_ipython()
    if shell is None:
        return

    def one_line(sh: Any, etype: type, value: BaseException, _tb: Any, tb_offset: Any = None) -> list[str]:
        stb = [f"{etype.__name__}: {value}"]
        sh._showtraceback(etype, value, stb)  # IPython leaves the showing to the handler (an error output on the page)
        return stb

    shell.set_custom_exc((ParameterError,), one_line)


def check_context_lengths(name: str, values: Any, maximum: int | None = None) -> list[int]:
    """A non-empty list of positive ints, each at most ``maximum`` when given."""
    check(isinstance(values, (list, tuple)) and len(values) > 0,
          f"{name} must be a non-empty list of token counts, e.g. [1024, 4096]; got {values!r}")
    out = []
    for v in values:
        check(isinstance(v, (int, float)) and int(v) == v and v > 0,
              f"{name} must hold positive whole token counts; {v!r} is not one")
        if maximum is not None:
            check(int(v) <= maximum,
                  f"{name} has {int(v)} tokens but the server's context_length is {maximum}: "
                  f"drop it or use a server with a longer context")
        out.append(int(v))
    return out


@cache
def _parameters_cell(notebook: str) -> tuple[tuple[str, Any], ...]:
    path = NOTEBOOKS_DIR / f"{notebook}.ipynb"
    cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
    cell = next((c for c in cells if "parameters" in (c.get("metadata") or {}).get("tags", [])), None)
    check(cell is not None, f"{path} has no cell tagged 'parameters'")
    tree = ast.parse("".join(cell["source"]))
    return tuple((node.target.id, ast.literal_eval(node.value)) for node in tree.body
                 if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value is not None)


def defaults(notebook: str) -> dict[str, Any]:
    """The parameters of ``notebook`` (e.g. ``"09_engine_ab"``) as its ``parameters`` cell sets them: the one place a
    default lives (a page called from Python, e.g. by a test, fills what it is not given from here)."""
    return {name: json.loads(json.dumps(value)) for name, value in _parameters_cell(notebook)}  # a fresh copy


class Page:
    """What a notebook's sections share. ``params``: the notebook's parameters as its parameters cell set them
    (:func:`check_parameters`), those not given taken from the cell (:func:`defaults`); ``ctx``: the context
    :func:`start` opened; ``opening``: the lines shown under the parameters.

    A step's page subclasses it: ``__init__`` checks the parameters' ranges and combinations (before any server is
    reached), opens the context and adds its first lines to ``intro``; the page's data are
    ``functools.cached_property``, computed when a section first asks, so the sections may be called in any order and
    none reads data another has not filled in. ``opening`` shows what the page's numbers describe (a demo on a tiny
    CPU model, a recorded run: :mod:`specdiag.subject`), then ``intro``."""

    notebook: ClassVar[str] = ""
    ctx: NotebookContext

    def __init__(self, params: Mapping[str, Any]) -> None:
        given = dict(params)
        known = defaults(self.notebook)
        unknown = sorted(set(given) - set(known))
        check(not unknown, f"{self.notebook} takes no parameter {', '.join(unknown)}: its parameters cell lists the "
                           f"ones it takes ({', '.join(known)})")
        self.params: dict[str, Any] = {**known, **given}
        self.intro = Section()

    @property
    def banner(self) -> subject.Banner | None:
        """What the page's numbers describe: a recorded run it replays, a demo on a CPU, or None (a live GPU server)."""
        ctx = self.ctx
        meta = {**ctx.run.meta, **({"server": ctx.server_info} if ctx.live and ctx.settings is not None else {})}
        if ctx.replaying:
            return subject.banner(meta, ctx.source.meta, ctx.source.path)
        return subject.banner(meta)

    @property
    def opening(self) -> Section:
        """The banner, then the page's first lines (``intro``)."""
        s = Section()
        if (b := self.banner) is not None:
            s.html(subject.banner_html(b))
        s.parts.extend(self.intro.parts)
        return s

    @property
    def live(self) -> bool:
        """Measuring into the run (``ctx.live``), else replaying a recorded run."""
        return self.ctx.live

    @property
    def replaying(self) -> bool:
        return self.ctx.replaying

    @property
    def recorded_from(self) -> str | None:
        """The reference run shown because nothing was asked for (``ctx.recorded_from``)."""
        return self.ctx.recorded_from


def run_params(params: Mapping[str, Any]) -> dict[str, Any]:
    """The parameters run.json records for a notebook: all but where it runs (``server_url``, ``run_dir``,
    ``replay_dir``: run.json says those once)."""
    return {k: v for k, v in params.items() if k not in ("server_url", "run_dir", "replay_dir")}


def start(notebook: str, server_url: str = "", run_dir: str = "", replay_dir: str = "",
          params: Mapping[str, Any] | None = None, needs_server: bool = True,
          speculative_config: Mapping[str, Any] | None = None, reference: str | Path | None = None) -> NotebookContext:
    """Open the run folder and either reach the server or open the recorded run: whether the notebook measures or
    replays is decided here, once (``ctx.live``).

    - ``replay_dir`` set: analyse that run's rows; outputs go to ``run_dir`` (or a new run folder
      labelled ``replay``), whose run.json records ``replays`` (and ``replay_of`` when
      the run measured nothing live).
    - ``reference`` set and ``replay_dir`` empty: replay that recorded run as above; a notebook passes it when it has
      nothing to measure (09 without arms, 06 without CUDA, 11 without an MoE server), and ``ctx.recorded_from`` names
      it (a run nobody asked for: 07 keeps its findings apart).
    - else ``server_url`` set: check it answers (a clear error naming the URL if not) and measure; in a
      report run the report checked it once (``serving.reach``) and the notebook does not check again.
    - else: start or reuse the embedded server (``specdiag.localserver.ensure_running``).

    ``speculative_config``: what the server runs when it does not say it (a vLLM without dev mode names no
    method), as vLLM's ``--speculative-config``, e.g. ``{"method": "ngram", "num_speculative_tokens": 7}``; what the
    server itself says wins ({} or None: read it from the server).
    """
    params = dict(params or {})
    check(speculative_config is None or isinstance(speculative_config, Mapping),
          f"speculative_config must be a dict like vLLM's --speculative-config, e.g. "
          f"{{'method': 'ngram', 'num_speculative_tokens': 7}}; got {speculative_config!r}")
    spec_kwargs = {"speculative_config": dict(speculative_config)} if speculative_config else {}
    if spec_kwargs:
        params["speculative_config"] = dict(speculative_config or {})
    check(isinstance(server_url, str), f"server_url must be a string URL or ''; got {server_url!r}")
    check(isinstance(run_dir, str), f"run_dir must be a folder path or ''; got {run_dir!r}")
    check(isinstance(replay_dir, str), f"replay_dir must be a folder path or ''; got {replay_dir!r}")
    by_reference = not replay_dir and bool(reference)
    if by_reference:
        replay_dir = str(reference)
    if replay_dir:
        source = Run.open(replay_dir)
        run = Run.create(run_dir or None, label=f"replay-{source.path.name}")
        # ``replays`` says which notebook replayed what; ``replay_of`` marks the whole run as a replay,
        # so it is set only on a run that measured nothing live (06 replaying recorded kernel results
        # inside a live report must not relabel that report).
        recorded = relative_to_project(source.path)  # run.json is shared: no absolute path of this machine
        fields: dict[str, Any] = {"params": {notebook: params}, "replays": {notebook: recorded}}
        if not run.meta.get("server_url"):
            fields["replay_of"] = run.meta.get("replay_of") or recorded
        run.update(**fields)
        return NotebookContext(notebook, run, source, "", None, params, live=False,
                               recorded_from=recorded if by_reference else None)
    run = Run.create(run_dir or None)
    run.update(params={notebook: params})
    if not needs_server:
        return NotebookContext(notebook, run, run, server_url, None, params)
    from specdiag.serving import make_client, reach, reached_engine  # noqa: PLC0415 - replay imports no client

    if not server_url:
        from specdiag import localserver  # noqa: PLC0415 - live only: replay loads no server code

        server_url = localserver.ensure_running()
        client = reach(server_url, "embedded")
    elif known := reached_engine(server_url):  # a report run reached this server once for all its notebooks
        client = make_client(server_url, known, **spec_kwargs)
    else:
        client = reach(server_url, **spec_kwargs)  # asks the server which engine it is; a clear error if it does not answer
    settings = client.settings()
    run.update(server_url=server_url, server_engine=client.engine)
    note_server(run, notebook, client, settings)
    return NotebookContext(notebook, run, run, server_url, client, params, settings)


def note_server(run: Run, notebook: str, client: Any, settings: Any) -> list[str]:
    """Record which server ``notebook`` saw (run.json ``servers_seen``: start and settings,
    :func:`specdiag.serving.identity.server_identity`) and say, here and in ``server_changes``, when it is not the
    server an earlier notebook of the run saw (restarted or reconfigured in between). Returns those lines."""
    samples = client.metrics_samples() if hasattr(client, "metrics_samples") else None
    ident = server_identity(client.base_url, settings, samples)
    seen = {k: v for k, v in (run.meta.get("servers_seen") or {}).items() if k != notebook}
    by_diff: dict[str, list[str]] = {}
    for other, was in sorted(seen.items()):
        diff = changes(was, ident)
        if diff:
            by_diff.setdefault("; ".join(diff), []).append(other)
    lines = [f"{notebook} sees another server than {', '.join(others)} saw: {diff}" for diff, others in by_diff.items()]
    run.update(servers_seen={notebook: ident})
    if lines:
        run.update(server_changes={notebook: lines})
        for line in lines[:3]:
            print(f"note: {line}")
    return lines


def print_versions() -> None:
    """Every notebook's first call: the versions a reader needs, folded into one line on the page (the answer comes
    first), and from here on a parameter error shown in one line (:func:`brief_parameter_errors`)."""
    brief_parameter_errors()
    found = {**versions(), "executable": str(shown(sys.executable))}
    lines = [f"{k:>13}: {v}" for k, v in found.items()]
    try:
        from IPython import get_ipython  # noqa: PLC0415 - IPython only where a kernel runs the notebook
        from IPython.display import HTML, display  # noqa: PLC0415 - optional: the except says what happens without it
    except ImportError:
        get_ipython = None  # type: ignore[assignment]
    if get_ipython is None or get_ipython() is None:
        print("\n".join(lines))
        return
    summary = ", ".join(f"{k} {found[k]}" for k in ("specdiag", "python", "torch") if k in found)
    display(HTML(f'<details class="specdiag-versions"><summary style="cursor:pointer;color:#666">versions: '
                 f'{html.escape(summary)}, ...</summary><pre>{html.escape(chr(10).join(lines))}</pre></details>'))
