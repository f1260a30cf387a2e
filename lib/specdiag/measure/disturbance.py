"""How much of a measuring step ran beside other traffic, from its rows' traffic columns (pure).

Each measured row carries ``other_traffic`` (True: other requests ran beside it; False: /metrics or the server's
queue time says none did; None: unknown), ``traffic_evidence`` and ``commit_length_reliable``
(specdiag.serving.traffic). :func:`traffic_finding` says, for one table, how many requests were disturbed, how
many commit lengths are unreliable (taken from counter differences while others ran: left out of the commit
summaries, :func:`commit_usable`), and what the evidence was.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from specdiag.findings import Finding, Source

__all__ = ["commit_usable", "disturbance", "traffic_finding"]


def commit_usable(row: Mapping[str, Any]) -> bool:
    """A row whose commit length may enter a summary: not marked unreliable (counter differences beside other
    requests)."""
    return row.get("commit_length_reliable") is not False


def disturbance(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Counts of a table's rows: ``requests``, ``disturbed`` (other_traffic True), ``clean`` (False), ``unknown``
    (None or not recorded), ``unreliable_commit`` (commit_length_reliable False), ``share_disturbed`` of those known,
    and ``foreign_tokens_between`` (tokens the server generated for others between the suite's requests)."""
    known = [r for r in rows if r.get("other_traffic") is not None]
    disturbed = [r for r in known if r.get("other_traffic")]
    between = sum(float(r.get("foreign_tokens_between") or 0) for r in rows)
    restarted = sum(1 for r in rows if r.get("server_restarted"))
    return {"requests": len(rows), "disturbed": len(disturbed), "clean": len(known) - len(disturbed),
            "unknown": len(rows) - len(known),
            "unreliable_commit": sum(1 for r in rows if r.get("commit_length_reliable") is False),
            "share_disturbed": len(disturbed) / len(known) if known else None,
            "foreign_tokens_between": between, "restarted": restarted}


def traffic_finding(rows: Sequence[Mapping[str, Any]], prefix: str, what: str = "requests",
                    source: Source = "measured") -> Finding | None:
    """``<prefix>.other_traffic``: how much of this table ran beside other traffic (None for a table whose rows
    never recorded traffic columns: a run recorded before they existed, or a replayed published table)."""
    if not rows or not any("other_traffic" in r for r in rows):
        return None
    d = disturbance(rows)
    evidence = [f"{r.get('context_tokens'):,} tokens: " + "; ".join(r.get("traffic_evidence") or [])
                for r in rows if r.get("other_traffic") or r.get("traffic_evidence")][:6]
    numbers = {k: d[k] for k in ("requests", "disturbed", "clean", "unknown", "unreliable_commit", "share_disturbed",
                                 "foreign_tokens_between", "restarted")}
    if d["disturbed"]:
        unreliable = (f" {d['unreliable_commit']} commit lengths came from /metrics counter differences while others "
                      "ran: they are marked unreliable and left out of the commit-length summary."
                      if d["unreliable_commit"] else "")
        return Finding(
            f"{prefix}.other_traffic", "Other traffic on the server",
            f"{d['disturbed']} of {d['requests'] - d['unknown']} {what} ({d['share_disturbed']:.0%}) ran beside other "
            f"requests: their times include other users' work.{unreliable}",
            "warning", tuple(evidence), numbers, source)
    if d["unknown"] == d["requests"]:
        return Finding(
            f"{prefix}.other_traffic", "Other traffic: not known",
            f"None of the {d['requests']} {what} could be checked for other traffic: the server exposes no /metrics "
            "(SGLang: --enable-metrics) and no queue times.", "info", (), numbers, source)
    between = (f"; between them the server generated {d['foreign_tokens_between']:,.0f} tokens for others"
               if d["foreign_tokens_between"] else "")
    return Finding(
        f"{prefix}.other_traffic", "No other traffic beside the measured requests",
        f"/metrics showed no other request running beside any of the {d['requests'] - d['unknown']} checked {what}"
        f"{between}.", "ok", tuple(evidence), numbers, source)
