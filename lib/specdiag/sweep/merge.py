"""``specdiag merge --out DEST SRC...``: the parts of one sweep joined into one run.

A part is one ``specdiag sweep`` run folder: some arms of an arms file, one measurement, measured on one host within
its time (a host that lends its GPU for a few minutes at a time takes a long sweep in several parts).

- rows: every table of every part (each ``*.jsonl``), in the order the parts ran, each row with its ``part`` (1, 2,
  ...; a merge extended later counts on);
- arms: an arm measured in several parts is joined only when it was configured alike (run.json
  ``arms[name].configured``: engine, model, backend, plugin, allocator, speculation, flags, env, parallelism, pool);
  otherwise the merge stops and names the keys that differ. A joined arm keeps its first part's record, the parts it
  was measured in, and per part its times and failure. An arm of a run recorded before the sweep has no
  ``configured``; it is joined when what its server stated (model, attention backend, speculative algorithm) matches
  the part's configuration, which it then takes (``configured_from_part``);
- ``parts``: each part's source, command, provenance, device, peaks, settings, and whether it was cut (no
  ``finished_after_s``); ``not_run``: every part's, tagged with its part, plus the arms a cut part never finished;
- the plugin's stats (the layout recorder's per-forward records counted, not kept: driver.kept_stats) and check
  summaries keyed ``arm (part N)``; run.json lists of records (``kv_layout_arms``,
  ``moe_servers``) joined with their part; other keys from the first part that has them; each part's ``files/``
  gzipped (a ``.gz`` copied as it is) and its servers' logs, gzipped, under ``servers/``;
- with ``arms`` (``specdiag merge --arms A,B``), only those arms of the parts: their rows, records, stats, logs and
  not-run lines (an arm measured in a part made for another run, e.g. a speculation-off twin that serves two runs);
- last, the measurement's ``merge_end`` where it has one (plugin_identity: run.json ``identity`` over every part's
  rows).
"""

from __future__ import annotations

import gzip
import shutil
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from specdiag.runs import Run, merge_runs
from specdiag.sweep.driver import kept_stats

#: run.json keys the merge builds itself (not copied from a part)
OWN_KEYS = ("run_id", "provenance", "arms", "parts", "not_run", "plugin_stats", "plugin_check", "prefill_check",
            "command", "finished_after_s", "merged_from", "interrupted")


class MergeError(ValueError):
    """Parts that cannot be one run; the message names the part, the arm and what differs."""


def stated_differences(recorded: Mapping[str, Any], configured: Mapping[str, Any]) -> list[str]:
    """For an arm recorded before the sweep (no ``configured``): what its server stated (``server``: SGLang's
    /server_info) against a part's configuration, on the model, the attention backend and the speculative algorithm."""
    server = recorded.get("server") or {}
    spec = (configured.get("speculation") or {}).get("algorithm")
    pairs = {"model": (server.get("model_path"), configured.get("model")),
             "attention_backend": (server.get("attention_backend"), configured.get("attention_backend")),
             "speculation.algorithm": (server.get("speculative_algorithm") or "NONE", spec or "NONE")}
    if not server:
        return ["the recorded arm states no server configuration"]
    return [f"{k}: {new!r} against {old!r}" for k, (old, new) in pairs.items() if old != new]


def differences(a: Mapping[str, Any], b: Mapping[str, Any]) -> list[str]:
    """The keys whose values differ between two arm configurations, each with both values."""
    return [f"{k}: {a.get(k)!r} against {b.get(k)!r}" for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)]


def _tables(runs: Iterable[Run]) -> list[str]:
    return sorted({p.stem for r in runs for p in Path(r.path).glob("*.jsonl")})


def _list_keys(runs: Iterable[Run]) -> list[str]:
    return sorted({k for r in runs for k, v in r.meta.items() if k not in OWN_KEYS and isinstance(v, list)
                   and v and all(isinstance(x, Mapping) for x in v)})


def merge_parts(dest: str | Path, sources: list[str | Path], arms_only: Sequence[str] | None = None) -> Run:
    """Join ``sources`` (run folders of one measurement, in the order they ran) into ``dest`` (module doc); with
    ``arms_only``, only those arms of the parts."""
    if not sources:
        raise MergeError("merge: give at least one part's run folder")
    runs = [Run.open(s) for s in sources]
    only = set(arms_only or ())
    if only:
        have = {a for r in runs for a in (r.meta.get("arms") or {})}
        if only - have:
            raise MergeError(f"merge: --arms names {', '.join(sorted(only - have))}, which no part measured (the parts' "
                             f"arms: {', '.join(sorted(have))})")

        armless = sorted({f"{Path(r.path).name}/{t}" for r in runs for t in _tables([r])
                          if any("arm" not in row for row in r.rows(t))})
        if armless:
            raise MergeError(f"merge: --arms picks rows by their arm, and rows of {', '.join(armless)} carry none: "
                             "merge those parts whole")

    def taken(name: Any) -> bool:
        return not only or str(name) in only
    prior = Run.open(dest) if (Path(dest) / "run.json").is_file() else None
    # a run recorded before the sweep has no kind: it takes its parts'
    kinds = {str(r.meta.get("kind")) for r in runs + ([prior] if prior and prior.meta.get("kind") else [])}
    if len(kinds) != 1:
        raise MergeError(f"merge: the parts ran different measurements ({', '.join(sorted(kinds))}): merge only "
                         "parts of one measurement")
    arms: dict[str, Any] = dict(prior.meta.get("arms") or {}) if prior else {}
    offset = max([int(c.get("part") or 0) for c in (prior.meta.get("parts") or [])] + [0]) if prior else 0
    first_part = {name: (rec.get("parts") or ["?"])[0] for name, rec in arms.items()}
    for i, (src, r) in enumerate(zip(sources, runs), start=offset + 1):
        if r.meta.get("parts"):
            raise MergeError(f"merge: {src} is a merged run already; give the parts' own folders (or --out it to "
                             "extend it)")
        for name, rec in (r.meta.get("arms") or {}).items():
            if not taken(name):
                continue
            if name in arms and "configured" not in arms[name] and rec.get("configured") is not None:
                diff = stated_differences(arms[name], rec["configured"])
                if diff:
                    raise MergeError(f"merge: arm {name!r} of {src} is not the recorded run's {name!r} (recorded "
                                     "before the sweep): " + "; ".join(diff)
                                     + ". Give the arm another name in one of the arms files")
                arms[name] = {**arms[name], "configured": rec["configured"], "configured_from_part": i}
            if name in arms and arms[name].get("configured") != rec.get("configured"):
                diff = differences(dict(rec.get("configured") or {}), dict(arms[name].get("configured") or {}))
                raise MergeError(f"merge: arm {name!r} of {src} is not configured as in part "
                                 f"{first_part[name]}: " + "; ".join(diff)
                                 + ". Give the arm another name in one of the arms files")
            arms.setdefault(name, {**rec, "parts": [], "per_part": {}})
            first_part.setdefault(name, i)
    first_keys = sorted({k for r in runs for k in r.meta if k not in OWN_KEYS} - set(_list_keys(runs)))
    out, parts = merge_runs(dest, sources, _tables(runs), label="merged", list_keys=_list_keys(runs),
                            first_keys=first_keys, gzip_files=True,
                            keep_row=(lambda row: taken(row.get("arm"))) if only else None)
    records = list(out.meta.get("parts") or [])
    not_run = list(out.meta.get("not_run") or [])
    stats = dict(out.meta.get("plugin_stats") or {})
    checks = dict(out.meta.get("plugin_check") or {})
    prefill_checks = dict(out.meta.get("prefill_check") or {})
    for (part, r), src in zip(parts, sources):
        cut = r.meta.get("finished_after_s") is None
        records.append({"part": part, "source": str(src), "command": r.meta.get("command"),
                        "provenance": r.meta.get("provenance"), "device": r.meta.get("device"),
                        "hardware": r.meta.get("hardware"), "settings": (r.meta.get("measurement") or {}).get("settings"),
                        "finished_after_s": r.meta.get("finished_after_s"), "cut": cut,
                        **({"arms_taken": sorted(only)} if only else {})})
        not_run += [f"{x} (part {part})" for x in r.meta.get("not_run") or []
                    if not only or str(x).split(" ", 1)[0].rstrip(":") in only]
        for name, rec in (r.meta.get("arms") or {}).items():
            if not taken(name):
                continue
            arms[name]["parts"] = [*arms[name].get("parts", []), part]
            arms[name].setdefault("per_part", {})[str(part)] = {
                k: rec.get(k) for k in ("started_after_s", "ready_after_s", "measured_s", "failed")}
            if cut and rec.get("started_after_s") is not None and rec.get("measured_s") is None:
                not_run.append(f"{name} (part {part}): the part was cut before this arm finished (its rows so far "
                               "are kept)")
        stats.update({f"{a} (part {part})": [kept_stats(x) if isinstance(x, Mapping) else x for x in v]
                      if isinstance(v, list) else v for a, v in (r.meta.get("plugin_stats") or {}).items() if taken(a)})
        checks.update({f"{a} (part {part})": v for a, v in (r.meta.get("plugin_check") or {}).items() if taken(a)})
        prefill_checks.update({f"{a} (part {part})": v for a, v in (r.meta.get("prefill_check") or {}).items()
                               if taken(a)})
        for log_file in sorted(Path(r.path).glob("server-*.log")):
            if not taken(log_file.name[len("server-"):-len(".log")]):
                continue
            (Path(out.path) / "servers").mkdir(exist_ok=True)
            with open(log_file, "rb") as src, gzip.open(Path(out.path) / "servers" / f"part{part}-{log_file.name}.gz",
                                                        "wb") as dst:
                shutil.copyfileobj(src, dst)
    out.update(arms=arms, parts=records, not_run=not_run, plugin_stats=stats, plugin_check=checks,
               **({"prefill_check": prefill_checks} if prefill_checks else {}),
               command="specdiag merge --out " + " ".join(
                   str(x) for x in [dest, *([f"--arms {','.join(sorted(only))}"] if only else []), *sources]))
    from specdiag.sweep.registry import MEASUREMENTS  # noqa: PLC0415

    for name in kinds.pop().split(","):  # a sweep of several measurements names them all
        known = MEASUREMENTS.get(name)
        merge_end = known.hook("merge_end") if known is not None else None
        if merge_end is not None:  # what the measurement computes over all its rows (plugin_identity: identity)
            merge_end(out)
    return out
