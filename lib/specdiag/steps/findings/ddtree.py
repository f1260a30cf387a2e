"""07's word on DDTree: what this run's data measured of it and what they cannot.

DDTree (Ringel & Romano, arXiv 2604.12989; the investigation's tree on top of DFlash) builds a draft tree from DFlash's
per-position distributions and verifies it in one target pass with a tree mask. No engine release serves it (SGLang
has it only in an open pull request, published), so no server of a run
runs it. What a run can hold of its parts, all read from run.json (its own and the recorded runs it replayed):

- servers that ran DFLASH, and their verify block (``speculative_num_draft_tokens``, server-reported): DFlash's
  linear block, the drafts a DDTree would arrange in a tree;
- the plugin's served verify calls (``plugin_stats``, measured in the server by the plugin): ``served_causal`` calls
  took DFLASH's causal block, the rest a custom tree mask, with the drafts of the algorithm that arm ran (NGRAM's).

:func:`ddtree_finding` is pure; :func:`recorded_metas` reads the replayed runs' run.json.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Sequence

from specdiag.findings import Finding
from specdiag.paths import PROJECT_ROOT
from specdiag.runs import Run


def _servers(meta: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """The server settings a run.json holds: its ``server`` and each arm's."""
    out = [meta["server"]] if isinstance(meta.get("server"), Mapping) else []
    for arm in (meta.get("arms") or {}).values():
        if isinstance(arm, Mapping) and isinstance(arm.get("server"), Mapping):
            out.append(arm["server"])
    return out


def _plugin_calls(meta: Mapping[str, Any]) -> tuple[int, dict[str, int]]:
    """(causal-block calls, tree-mask calls per algorithm) the plugin served, from ``plugin_stats``."""
    arms = meta.get("arms") or {}
    stats = meta.get("plugin_stats") or {}
    stats = stats if isinstance(stats, Mapping) else {"": stats}  # one server's records, or per arm ("arm (part n)")
    causal, masked = 0, {}
    for key, records in stats.items():
        server = (arms.get(str(key).split(" (")[0]) or {}).get("server") or meta.get("server") or {}
        algorithm = str(server.get("speculative_algorithm") or "an unnamed algorithm")
        for rec in records if isinstance(records, list) else [records]:
            if not isinstance(rec, Mapping):
                continue
            served, served_causal = int(rec.get("served") or 0), int(rec.get("served_causal") or 0)
            causal += served_causal
            if served > served_causal:
                masked[algorithm] = masked.get(algorithm, 0) + served - served_causal
    return causal, masked


def ddtree_finding(run_meta: Mapping[str, Any], recorded: Sequence[Mapping[str, Any]] = ()) -> Finding | None:
    """``findings.ddtree``: what the run's servers and the plugin's calls measured of DDTree's parts, and what they
    cannot; None when no server of the run speculated."""
    metas = [run_meta, *recorded]
    servers = [s for m in metas for s in _servers(m)]
    algorithms = sorted({str(s.get("speculative_algorithm")).upper() for s in servers if s.get("speculative_algorithm")})
    if not algorithms:
        return None
    blocks = sorted({int(s.get("speculative_num_draft_tokens") or 0) for s in servers
                     if str(s.get("speculative_algorithm")).upper() == "DFLASH"} - {0})
    causal, masked = 0, {}
    for m in metas:
        c, t = _plugin_calls(m)
        causal += c
        for k, v in t.items():
            masked[k] = masked.get(k, 0) + v
    parts = []
    if blocks:
        parts.append(f"DFlash's linear verify block ({'/'.join(map(str, blocks))} tokens, as the servers state it) was served")
    else:
        parts.append("no server ran DFLASH, so not even DDTree's drafter was measured")
    if causal:
        parts.append(f"the plugin served {causal:,} of those causal-block verify calls (measured)")
    if masked:
        parts.append("the plugin's tree-mask path served " + ", ".join(f"{n:,} calls with {a}'s drafts"
                                                                       for a, n in sorted(masked.items())))
    else:
        parts.append("no tree-mask verify call of the plugin is in this run")
    trees = sorted({str(s["speculative_tree"]) for s in servers if "ddtree" in str(s.get("speculative_tree")).lower()})
    opening = (f"The published investigation's server ran DDTree on DFlash ({trees[0]}; published): its figures include "
               f"DDTree's tree verify as published, none of it measured by this suite. No measured server ran DDTree"
               if trees else "No server of this run ran DDTree")
    verdict = (f"{opening} (speculative algorithms seen: {', '.join(algorithms)}). Of its parts: "
               + "; ".join(parts) + ". A DDTree verify is a tree mask over a DFlash block: "
               + ("the plugin's tree path serves that shape, but " if masked else "")
               + "no call here carried DDTree's drafts, so its acceptance (the accepted tree depth), its tree-building "
                 "cost and its tree verify time are not measured.")
    evidence = (f"speculative_algorithm of every server in run.json and the recorded runs it replayed: "
                f"{', '.join(algorithms)} (server-reported)",
                f"plugin_stats: {causal:,} causal-block calls, tree-mask calls {masked or 'none'} (measured by the plugin)",
                "DDTree is in no engine release: SGLang has it in an open pull request only (published)")
    return Finding("findings.ddtree", "What this run shows of DDTree", verdict, "info", evidence,
                   {"algorithms": algorithms, "dflash_block_tokens": blocks, "plugin_causal_calls": causal,
                    "plugin_tree_mask_calls": masked, "ddtree_measured": False, "ddtree_published": bool(trees)},
                   "computed")


def as_listed(finding: Finding) -> dict[str, Any]:
    """The finding as 07 lists a run-level one (a dict with ``notebook`` "run", as run_checks.run_findings gives)."""
    return {**dataclasses.asdict(finding), "notebook": "run"}


def recorded_metas(run_meta: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The run.json of each recorded run this run replayed (``replays``), where it is readable here."""
    out = []
    for path in sorted(set((run_meta.get("replays") or {}).values())):
        try:
            out.append(dict(Run.open(PROJECT_ROOT / str(path)).meta))
        except (OSError, ValueError):
            continue
    return out


__all__ = ["as_listed", "ddtree_finding", "recorded_metas"]
