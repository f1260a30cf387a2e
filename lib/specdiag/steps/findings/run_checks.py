"""07's findings about the run as a whole (pure): which notebooks saw which server, and how much of the run ran
beside other traffic.

- ``run.servers``: from run.json ``servers_seen`` (each measuring notebook's server identity, specdiag.nb.note_server):
  one server throughout (ok), or the groups of notebooks that saw each server and what changed between them, a
  restart or other settings (warning: their numbers are not of one server).
- ``run.other_traffic``: the per-notebook ``*.other_traffic`` findings summed: requests disturbed of those checked,
  commit lengths marked unreliable, tokens the server generated for others between the suite's requests.
"""

from __future__ import annotations

from dataclasses import asdict
from datetime import datetime, timezone
from typing import Any, Mapping, Sequence

from specdiag.findings import Finding
from specdiag.serving.identity import changes, same_server

__all__ = ["run_findings", "servers_finding", "traffic_overall"]


def _when(ts: Any) -> str:
    try:
        return datetime.fromtimestamp(float(ts), tz=timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
    except (TypeError, ValueError, OverflowError, OSError):
        return "start time not reported"


def _describe(ident: Mapping[str, Any]) -> str:
    s = ident.get("settings") or {}
    spec = ("no speculation" if s.get("speculating") is False else
            f"{s.get('algorithm') or 'speculation (method not exposed)'}, {s.get('tokens_per_step') or '?'} tokens/step")
    return (f"{s.get('engine')} {s.get('version') or ''} at {ident.get('url')}, started {_when(ident.get('started'))}"
            f", {s.get('model')}, {spec}").replace("  ", " ")


def servers_finding(servers_seen: Mapping[str, Mapping[str, Any]]) -> Finding | None:
    """``run.servers``: which notebooks saw which server (None when no notebook recorded one)."""
    if not servers_seen:
        return None
    groups: list[tuple[Mapping[str, Any], list[str]]] = []
    for notebook in sorted(servers_seen):
        ident = servers_seen[notebook]
        for first, members in groups:
            if same_server(first, ident):
                members.append(notebook)
                break
        else:
            groups.append((ident, [notebook]))
    evidence = tuple(f"{', '.join(members)}: {_describe(ident)}" for ident, members in groups)
    numbers = {"servers": len(groups), "notebooks_by_server": [members for _, members in groups]}
    if len(groups) == 1:
        return Finding("run.servers", "One server throughout the run",
                       f"Every measuring notebook ({', '.join(groups[0][1])}) saw the same server: "
                       f"{_describe(groups[0][0])}.", "ok", evidence, numbers, "server-reported")
    steps = [f"{', '.join(groups[i][1])} -> {', '.join(groups[i + 1][1])}: "
             f"{'; '.join(changes(groups[i][0], groups[i + 1][0]))}" for i in range(len(groups) - 1)]
    return Finding("run.servers", "The server changed during the run",
                   f"The run's notebooks saw {len(groups)} servers (restarted or reconfigured between notebooks), so "
                   f"their numbers are not of one server: " + " | ".join(steps) + ".", "warning",
                   evidence + tuple(steps), numbers, "server-reported")


def traffic_overall(findings: Sequence[Mapping[str, Any]]) -> Finding | None:
    """``run.other_traffic``: the notebooks' ``*.other_traffic`` findings summed (None when none has one)."""
    parts = [f for f in findings if str(f.get("id", "")).endswith(".other_traffic") and f.get("id") != "run.other_traffic"]
    if not parts:
        return None
    total = {k: sum(int((f.get("numbers") or {}).get(k) or 0) for f in parts)
             for k in ("requests", "disturbed", "clean", "unknown", "unreliable_commit")}
    between = sum(float((f.get("numbers") or {}).get("foreign_tokens_between") or 0) for f in parts)
    checked = total["disturbed"] + total["clean"]
    evidence = tuple(f"{f.get('notebook')}: {f.get('verdict')}" for f in parts)
    numbers = {**total, "checked": checked, "share_disturbed": total["disturbed"] / checked if checked else None,
               "foreign_tokens_between": between}
    if total["disturbed"]:
        return Finding(
            "run.other_traffic", "Part of the run ran beside other traffic",
            f"{total['disturbed']} of {checked} checked requests ({total['disturbed'] / checked:.0%}) ran beside other "
            f"users' requests; {total['unreliable_commit']} commit lengths from counter differences are unreliable and "
            "left out; the server generated "
            f"{between:,.0f} tokens for others between the suite's requests.", "warning", evidence, numbers, "measured")
    if not checked:
        return Finding("run.other_traffic", "Other traffic: not known",
                       f"None of the run's {total['requests']} requests could be checked (no /metrics, no queue "
                       "times).", "info", evidence, numbers, "measured")
    return Finding("run.other_traffic", "No other traffic beside the run's requests",
                   f"None of the {checked} checked requests ran beside another request"
                   + (f"; the server generated {between:,.0f} tokens for others between them." if between else "."),
                   "ok", evidence, numbers, "measured")


def run_findings(run_meta: Mapping[str, Any], findings: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The run-level findings as 07 lists them (dicts with ``notebook`` "run"), to add to the notebooks' ones."""
    out = [servers_finding(run_meta.get("servers_seen") or {}), traffic_overall(findings)]
    return [{**asdict(f), "notebook": "run"} for f in out if f is not None]
