"""The sweep: each arm's server started, measured by the named measurement and stopped, then the next.

One loop for every arm form and caller: ``specdiag sweep`` on a GPU host, and 09 and 10 in-process (their run folder
passed as ``run``). Before any server starts, the measurement adjusts the arms it needs adjusted
(:func:`configured_arms`) and the arms, the measurement's settings and every arm's server command are checked
(:func:`preflight`): a mistake fails in a second, naming the arm and the key. Then, arm by arm in the file's order:

1. an arm is started only with ``min_arm_s`` of the budget left (else run.json ``not_run`` says why it was not);
2. its server is held for the arm (:func:`specdiag.sweep.servers.serving`: started, readiness bounded by what is
   left; a running server, ``url``, as it is), its record goes into run.json ``arms[name]``: what it is, its
   configuration, its environment (no host paths, secrets redacted), the server's own settings (``/server_info``,
   redacted), its command (redacted), the seconds to start and measure;
3. the measurement runs (rows appended as they are taken: a sweep cut short keeps them) up to the budget's end less
   ``stop_margin_s``; what it left is added to ``not_run``;
4. the server is stopped as the block ends, also on an error, Ctrl-C or SIGTERM (the process tree, as the launchers
   do); the plugin's stats files of the arm, where it wrote them, go into run.json (``plugin_stats``, and
   ``plugin_check``: the per-call comparisons of a check arm, summarized and judged: :func:`check_summary`).

run.json also holds the device (nvidia-smi's name, or why there is none), the provenance (host, code, time), the
command, the arms file and the settings; ``finished_after_s`` is set only when every arm was dealt with, so a cut
sweep reads as cut.
"""

from __future__ import annotations

import json
import statistics
import time
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from specdiag.runs import Run
from specdiag.sweep.arms import Arm, ArmsError, ArmsFile, load_arms
from specdiag.sweep.job import ArmJob
from specdiag.sweep.registry import MEASUREMENTS, Measurement, measurement
from specdiag.sweep.servers import Host, arm_env, recorded_env, server_command, serving
from specdiag.sweep.settings import as_record, parse_settings, per_measurement


@dataclass(frozen=True)
class SweepOptions:
    """How a sweep runs on this host."""

    out: Path  # the run folder (created; rows appended)
    budget_s: float | None = None  # wall-clock seconds for the whole sweep (None: no limit)
    min_arm_s: float = 60.0  # start an arm only with this much of the budget left, s
    stop_margin_s: float = 20.0  # the measurement stops this long before the budget ends (time to stop a server), s
    startup_s: float = 900.0  # longest wait for one server to be ready, s
    command: str = ""  # the command line, for run.json


def _log(t0: float) -> Callable[[str], None]:
    def log(msg: str) -> None:
        print(f"[sweep {time.monotonic() - t0:7.1f}s] {msg}", flush=True)
    return log


def preflight(arms: ArmsFile, host: Host) -> None:
    """Every arm's server command built (nothing started): the launchers' settings errors, named by arm."""
    for arm in arms.arms:
        try:
            server_command(arm, host, port=1)
        except (ValueError, OSError) as exc:
            raise ArmsError(f"arm {arm.name!r}: {exc}") from None


def configured_arms(arms: ArmsFile, measure: Measurement, settings: Any) -> ArmsFile:
    """The arms as the measurement needs its servers (its ``sweep_configure(arm, settings)``, applied to every arm the
    sweep starts; a running server is measured as it is)."""
    adjust = measure.hook("sweep_configure")
    if adjust is None:
        return arms
    return replace(arms, arms=tuple(a if a.running else adjust(a, settings) for a in arms.arms))


#: one measurement of a sweep and its settings (its SweepSettings)
Measuring = tuple[Measurement, Any]


@dataclass(frozen=True)
class Plan:
    """What a sweep will run, checked: the arms (as the measurements need them), and each measurement with its
    settings, in the order each arm's server is measured by them."""

    arms: ArmsFile
    measures: tuple[Measuring, ...]


def plan(arms: str | ArmsFile, measure: str, only: Sequence[str] = (), overrides: Mapping[str, Any] | None = None,
         host: Host | None = None) -> Plan:
    """An arms file (a path, or parsed), only the arms named (all when none), the measurements (``measure``: one name,
    or several comma-separated, each arm's server measured by each in turn), their settings (the file's ``settings:``
    with ``overrides`` on top: :func:`specdiag.sweep.settings.per_measurement`) and every server command built: each
    mistake an ArmsError, SettingsError or UnknownMeasurement naming the fix, before any server starts."""
    parsed = load_arms(arms) if isinstance(arms, str) else arms
    if only:
        parsed = parsed.select(list(only))
    names = [n.strip() for n in measure.split(",") if n.strip()]
    ms = [measurement(n) for n in names]
    kinds = {m.name: m.load().SweepSettings for m in ms}
    raw = per_measurement(parsed.settings, names, {n: {f.name for f in fields(c)} for n, c in kinds.items()},
                          overrides, MEASUREMENTS)
    measures = tuple((m, parse_settings(kinds[m.name], raw[m.name], m.name)) for m in ms)
    for m, settings in measures:
        parsed = configured_arms(parsed, m, settings)
    preflight(parsed, host or Host(work=Path(".")))
    return Plan(parsed, measures)


#: the largest relative error a checked verify call may have (the plugin's kernel against the call's reference)
CHECK_MAX_REL_ERR = 1e-2


def check_summary(stats: list[Mapping[str, Any]]) -> dict[str, Any]:
    """A check arm's per-call comparisons (the plugin's ``check`` records: SGLang's kernel against the plugin's on
    the same inputs) in a few numbers: calls checked (DFLASH's causal-block calls apart), the largest and median
    relative error against SGLang's output, whether every output was finite, the longest prefix checked, and the
    verdict: ``passed`` when there were calls, all finite, each within :data:`CHECK_MAX_REL_ERR` of its reference.
    On a bf16 cache the reference is SGLang's output (``rel_err``); on an fp8 cache the exact fp32 reference of the
    fp8 cache (``rel_err_ref``: SGLang's own kernel casts q and P to fp8, so its error against that reference is
    reported beside, ``max_sglang_rel_err_ref``, not used as the reference)."""
    rows = [r for s in stats for r in s.get("check") or []]
    errs = [float(r["rel_err"]) for r in rows]
    fp8 = [r for r in rows if "rel_err_ref" in r]
    judged = [float(r.get("rel_err_ref", r["rel_err"])) for r in rows]
    finite = all(r.get("finite", False) for r in rows)
    return {"calls": len(rows), "causal_block_calls": sum(1 for r in rows if r.get("causal_block")),
            "max_rel_err": max(errs) if errs else None, "median_rel_err": statistics.median(errs) if errs else None,
            "all_finite": finite,
            "prefix_tokens_max": max((max(r.get("prefix_tokens") or [0]) for r in rows), default=None),
            "fp8_calls": len(fp8),
            "judged_by": ("SGLang's output" if not fp8 else "the fp32 reference of the fp8 cache"
                          if len(fp8) == len(rows) else "each call's reference (mixed caches)"),
            "max_judged_err": max(judged) if judged else None,
            "max_sglang_rel_err_ref": max((float(r["sglang_rel_err_ref"]) for r in fp8), default=None),
            "threshold": CHECK_MAX_REL_ERR,
            "passed": bool(rows) and finite and max(judged) <= CHECK_MAX_REL_ERR}


#: the largest relative error a checked prefill call may have against the fp32 reference on its sampled rows (bf16 output)
PREFILL_CHECK_MAX_REL_ERR = 2e-2


def prefill_check_summary(stats: list[Mapping[str, Any]]) -> dict[str, Any]:
    """A check arm's prefill calls (the plugin's ``prefill.check`` records: specdiag's MHA prefill kernel against the
    fp32 reference on a sample of each call's query rows): calls by part (a prefix chunk, a chunk's own causal part),
    the largest relative error of the output and absolute error of the log-sum-exp, the most keys one call read, and
    ``passed`` when there were calls, each within :data:`PREFILL_CHECK_MAX_REL_ERR`."""
    rows = [r for s in stats for r in ((s.get("prefill") or {}).get("check") or [])]
    errs = [float(r["rel_err"]) for r in rows]
    lse = [float(r["lse_abs_err"]) for r in rows if r.get("lse_abs_err") is not None]
    return {"calls": len(rows), "prefix_chunk_calls": sum(1 for r in rows if r.get("prefix_chunk")),
            "max_rel_err": max(errs) if errs else None, "median_rel_err": statistics.median(errs) if errs else None,
            "max_lse_abs_err": max(lse) if lse else None, "keys_max": max((int(r["keys"]) for r in rows), default=None),
            "threshold": PREFILL_CHECK_MAX_REL_ERR,
            "passed": bool(rows) and max(errs) <= PREFILL_CHECK_MAX_REL_ERR}


def read_stats(folder: Path) -> list[dict[str, Any]]:
    """The plugin's stats files of one server (``stats-*.json``), [] where it wrote none."""
    return [json.loads(p.read_text()) for p in sorted(folder.glob("stats-*.json"))] if folder.is_dir() else []


def _update_arm(run: Run, name: str, **fields: Any) -> None:
    arms = dict(run.meta.get("arms") or {})
    run.update(arms={**arms, name: {**dict(arms.get(name) or {}), **fields}})


def _server_info(url: str) -> dict[str, Any]:
    """The arm's ``server`` record: SGLang's (and the embedded server's) /server_info as it is; a vLLM's settings under
    SGLang's names (``ServerSettings.as_server_info``: ``speculative_algorithm``, ``speculative_num_draft_tokens``,
    ...), since vLLM's own /server_info (dev mode) is its nested ``vllm_config``, which names none of them."""
    from specdiag.serving import make_client  # noqa: PLC0415
    from specdiag.serving.redaction import redact  # noqa: PLC0415

    client = make_client(url)
    if getattr(client, "engine", None) == "vllm":
        return dict(redact(client.settings().as_server_info()))
    return dict(redact(client.server_info())) if hasattr(client, "server_info") else {}


def kept_stats(stats: Mapping[str, Any]) -> dict[str, Any]:
    """One server process's plugin stats as run.json keeps them: the per-call check records go to ``plugin_check``'s
    summary, and the layout recorder's per-forward records (every filler forward too: megabytes per arm) are counted,
    since each measured row carries its own request's layout."""
    out = {k: v for k, v in stats.items() if k != "check"}
    if isinstance(out.get("prefill"), Mapping) and "check" in out["prefill"]:
        out["prefill"] = {**{k: v for k, v in out["prefill"].items() if k != "check"},
                          "check_n": len(out["prefill"]["check"] or [])}
    layout = out.get("layout")
    if isinstance(layout, Mapping) and isinstance(layout.get("records"), list):
        out["layout"] = {**{k: v for k, v in layout.items() if k != "records"}, "records_n": len(layout["records"])}
    return out


def _plugin_record(run: Run, arm: Arm, host: Host) -> None:
    stats = read_stats(host.stats_dir(arm))
    if not stats:
        return
    run.update(plugin_stats={**dict(run.meta.get("plugin_stats") or {}), arm.name: [kept_stats(s) for s in stats]})
    if any(s.get("check") for s in stats):
        run.update(plugin_check={**dict(run.meta.get("plugin_check") or {}), arm.name: check_summary(stats)})
    if any((s.get("prefill") or {}).get("check") for s in stats):
        run.update(prefill_check={**dict(run.meta.get("prefill_check") or {}),
                                  arm.name: prefill_check_summary(stats)})


def sweep_into(run: Run, planned: Plan) -> int:
    """A planned sweep (:func:`plan`) run in this process into a notebook's run folder (09, 10): no time budget, the
    servers' logs and plugin stats under the run's ``servers/``."""
    opts = SweepOptions(out=Path(run.path))
    return sweep(planned.arms, planned.measures, opts, Host(work=Path(run.path) / "servers"), run)


def _table_rows(run: Run) -> dict[str, int]:
    """Rows per table of the run and of its arms' folders (``<arm>/<table>``)."""
    return {str(p.relative_to(run.path).with_suffix("")): sum(1 for _ in p.open()) for p in
            sorted([*Path(run.path).glob("*.jsonl"), *Path(run.path).glob("*/*.jsonl")])}


def _arm_record(arm: Arm) -> dict[str, Any]:
    if arm.running:
        return {"what": arm.label, "engine": arm.engine or None, "plugin": None, "configured": arm.configured()}
    return {"what": arm.label, "engine": arm.engine, "plugin": arm.plugin, "kv_alloc": arm.kv_alloc,
            "configured": arm.configured()}


def measurement_record(measures: Sequence[Measuring]) -> dict[str, Any]:
    """run.json ``measurement``: one measurement's name, line and settings; several, their names joined by commas and
    each one's line and settings by name."""
    if len(measures) == 1:
        (m, s), = measures
        return {"name": m.name, "what": m.what, "settings": as_record(s)}
    return {"name": ",".join(m.name for m, _ in measures), "what": {m.name: m.what for m, _ in measures},
            "settings": {m.name: as_record(s) for m, s in measures}}


def arm_run(run: Run, arm: Arm, kind: str) -> Run:
    """The arm's own run folder inside the sweep's (``<out>/<arm>/``): where a measurement whose notebook replays one
    server per run folder (``PER_ARM`` in its module: 00-04) writes its rows and run.json sections."""
    own = Run.create(Path(run.path) / arm.name, label=f"{kind}-{arm.name}")
    own.update(kind=kind, arm={"name": arm.name, "what": arm.label, "configured": arm.configured()},
               data_source="measured")
    return own


def sweep(arms: ArmsFile, measures: Sequence[Measuring], opts: SweepOptions, host: Host,
          run: Run | None = None) -> int:
    """Run the sweep (module doc) into a new run folder at ``opts.out``, or into ``run`` (a notebook's: the sweep then
    leaves the run's kind and command as they are): each arm's server measured by each of ``measures`` in turn; 0
    when every arm started was measured without an error, else 1."""
    from specdiag.hardware import nvidia_smi_gpu  # noqa: PLC0415
    from specdiag.process import redacted_command  # noqa: PLC0415

    t0 = time.monotonic()
    log = _log(t0)
    end = t0 + opts.budget_s if opts.budget_s else None
    kind = ",".join(m.name for m, _ in measures)
    for m, settings in measures:
        arms = configured_arms(arms, m, settings)
    preflight(arms, host)
    if run is None:
        run = Run.create(opts.out, label=f"sweep-{kind.replace(',', '-')}")
        run.update(kind=kind, command=opts.command)
    run.update(measurement=measurement_record(measures),
               arms_file={"source": arms.source, "description": arms.description, "arms": [a.name for a in arms.arms]},
               budget={"budget_s": opts.budget_s, "min_arm_s": opts.min_arm_s, "stop_margin_s": opts.stop_margin_s},
               device=nvidia_smi_gpu(), not_run=[], arms={a.name: _arm_record(a) for a in arms.arms})
    before = _table_rows(run)  # a notebook's run holds other notebooks' tables: the last line counts this sweep's
    for m, settings in measures:
        begin = m.hook("sweep_begin")
        if begin is not None:
            begin(run, arms, settings)
    not_run: list[str] = []
    failed = False
    for arm in arms.arms:
        extra = {k: v for m, _ in measures if m.hook("sweep_env") and not arm.running
                 for k, v in m.hook("sweep_env")(arm, host.work).items()}
        arm_host = replace(host, extra_env=extra)
        _update_arm(run, arm.name, env=recorded_env(arm_env(arm, arm_host)))
        left = None if end is None else end - time.monotonic()
        if left is not None and left < opts.min_arm_s:
            not_run.append(f"{arm.name}: not started: {max(left, 0):.0f} s of the {opts.budget_s:.0f} s budget left, "
                           f"an arm is started with at least {opts.min_arm_s:.0f} s")
            log(not_run[-1])
            run.update(not_run=not_run)
            continue
        t_arm = time.monotonic()
        _update_arm(run, arm.name, started_after_s=round(t_arm - t0, 1))
        log(f"{arm.name}: " + (f"measuring the server at {arm.url}" if arm.running else f"starting ({arm.label})"))
        wait = opts.startup_s if left is None else max(10.0, min(opts.startup_s, left - opts.stop_margin_s))
        try:
            with serving(arm, arm_host, opts.startup_s, wait, log) as server:
                info = _server_info(server.url)
                _update_arm(run, arm.name, url=server.url, ready_after_s=server.ready_after_s,
                            ready_at_s=round(time.monotonic() - t0, 1), server=info,
                            command=redacted_command(server.command) if server.command else None)
                log(f"{arm.name}: ready after {server.ready_after_s} s at {server.url}")
                own = None
                for m, settings in measures:
                    if getattr(m.load(), "PER_ARM", False) and own is None:
                        own = arm_run(run, arm, kind)
                    job = ArmJob(run=own if getattr(m.load(), "PER_ARM", False) else run, arm=arm, url=server.url,
                                 settings=settings, deadline_s=float("inf") if end is None else end - opts.stop_margin_s,
                                 stats_dir=arm_host.stats_dir(arm), work=arm_host.work, progress=log, server_info=info)
                    not_run += m.hook("sweep_arm")(job) or []
        except BaseException as exc:  # noqa: BLE001 - recorded; Ctrl-C and SIGTERM end the sweep (the server stopped)
            failed = True
            _update_arm(run, arm.name, failed=f"{type(exc).__name__}: {exc}"[:1000])
            log(f"{arm.name}: FAILED {type(exc).__name__}: {str(exc)[:400]}")
            if not isinstance(exc, Exception):
                _update_arm(run, arm.name, measured_s=round(time.monotonic() - t_arm, 1))
                run.update(not_run=not_run + [f"{a.name}: the sweep was interrupted" for a in
                                              arms.arms[arms.arms.index(arm) + 1:]], interrupted=type(exc).__name__)
                _plugin_record(run, arm, arm_host)
                raise
        _update_arm(run, arm.name, measured_s=round(time.monotonic() - t_arm, 1))
        _plugin_record(run, arm, arm_host)
        run.update(not_run=not_run)
    for m, _ in measures:
        end_hook = m.hook("sweep_end")
        if end_hook is not None:
            end_hook(run, arms, host.work)
    run.update(not_run=not_run, finished_after_s=round(time.monotonic() - t0, 1))
    tables = {t: n - before.get(t, 0) for t, n in _table_rows(run).items() if n > before.get(t, 0)}
    log(f"done: {', '.join(f'{n} {t} rows' for t, n in tables.items()) or 'no rows'} in {run.path}; "
        f"{len(not_run)} not run" + ("; an arm FAILED (run.json arms.*.failed)" if failed else ""))
    return 1 if failed else 0
