"""03 on a DFLASH server: the block drafter's settings, its own time per step apart from the verify time, with the
draft window on and off, and the verdicts.

A DFlash drafter (specdiag.geometry.dflash) drafts a block of ``block_size`` tokens in one forward from the target's
hidden states of ``target_layer_ids``; its layers attend the drafter's own cache of context features, all of it
(``full_attention``) or a sliding window, and the server may keep only the last ``speculative_draft_window_size``
tokens of that cache (the draft window). Figures here:

- the drafter's settings: ``config`` (the drafter's config.json) or ``server-reported`` (/server_info);
- draft ms and verify ms per step: ``server-reported`` by the embedded server (``meta_info.spec_step_draft_ms`` and
  ``spec_step_verify_ms``, one value per verify step; the median per request). The request is the unit: each arm's
  first request (the server's first) is left out, a cell is the median over its requests, and every comparison (the
  longest context over the shortest within an arm, no window over a window at one context) is a ratio of medians with
  its interval over requests at the level it has (:func:`specdiag.stats.compare_requests`), "not enough requests" under
  :data:`specdiag.stats.MIN_REQUESTS` a cell. SGLang 0.5.17's DFLASH reports per
  request only counts (``spec_verify_ct``, ``spec_accept_length``, the correct-drafts histogram; request timestamps
  with ``--enable-metrics``) and vLLM 0.32 counters: no drafter time, so there it is not measurable;
- spans (tokens a layer attends): ``computed`` from the configuration and the window.

Pure, except :func:`other_window_server` and :func:`time_other_window` (they start an embedded server, imported
inside them), :func:`drafter_config` (reads a config.json) and :func:`plot_arms` (draws on the ``ax`` it is given).
"""

from __future__ import annotations

import contextlib
import json
import statistics
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence

from specdiag.findings import Finding, Source
from specdiag.measure.loop import measure_missing, plan_rows
from specdiag.paths import PROJECT_ROOT
from specdiag.stats import NOT_ENOUGH, compare_requests
from specdiag.steps.drafter_inspection.analysis import (
    TIMING_KEY, flag_first, growth_reading, growth_words, interval_text, measure_draft_timing, span_text)

ALGORITHM = "DFLASH"
EMBEDDED_VERSION = "specdiag-localserver"  # how the embedded server's /server_info "version" starts


def is_dflash(server: Mapping[str, Any]) -> bool:
    """The server runs DFLASH (server-reported ``speculative_algorithm``)."""
    return str(server.get("speculative_algorithm") or "").upper() == ALGORITHM


def is_embedded(server: Mapping[str, Any]) -> bool:
    """The server is this project's embedded server (its /server_info ``version``)."""
    return str(server.get("version") or "").startswith(EMBEDDED_VERSION)


def server_window(server: Mapping[str, Any]) -> int | None:
    """The draft window the server states (``speculative_draft_window_size``), None when it keeps all context."""
    value = server.get("speculative_draft_window_size")
    return int(value) if value else None


def other_window(server: Mapping[str, Any], compare_window_tokens: int) -> tuple[bool, int | None]:
    """The second arm 03 times beside a DFLASH embedded server: ``(start it, its draft window)``: without a window
    when the server has one, else with ``compare_window_tokens``; none when that is 0 or the server is not an
    embedded DFLASH one (only the embedded engine can be started again here)."""
    if compare_window_tokens <= 0 or not (is_dflash(server) and is_embedded(server)):
        return False, None
    return True, (None if server_window(server) else int(compare_window_tokens))


def config_rows(cfg: Mapping[str, Any] | None, server: Mapping[str, Any],
                server_source: str = "server-reported") -> list[dict[str, Any]]:
    """The drafter's DFlash settings as rows ``what, value, source``: block size, target layers, mask token, layer
    types and sliding window (config), and what the server runs: block, draft window, drafter attention backend."""
    cfg = dict(cfg or {})
    dcfg = dict(cfg.get("dflash_config") or {})
    types = list(cfg.get("layer_types") or [])
    rows = [
        ("block size (drafter)", cfg.get("block_size"), "config"),
        ("block size (server)", server.get("speculative_dflash_block_size") or server.get("speculative_num_draft_tokens"),
         server_source),
        ("target layer ids", dcfg.get("target_layer_ids"), "config"),
        ("target layers", cfg.get("num_target_layers"), "config"),
        ("mask token id", dcfg.get("mask_token_id", dcfg.get("mask_token")), "config"),
        ("drafter layers", cfg.get("num_hidden_layers"), "config"),
        ("layer types", ", ".join(types) if types else None, "config"),
        ("sliding window", cfg.get("sliding_window"), "config"),
        ("draft window (server)", server_window(server) or "none: the drafter keeps the whole context", server_source),
        ("drafter attention backend", server.get("speculative_draft_attention_backend"), server_source),
    ]
    return [{"what": w, "value": "not stated" if v is None else v, "source": s} for w, v, s in rows]


@contextlib.contextmanager
def other_window_server(server: Mapping[str, Any], window_tokens: int | None) -> Iterator[str]:
    """The embedded DFLASH server of ``server`` (same target, drafter, block and device) started again with
    ``window_tokens`` as its draft window (None: none); yields its URL and stops it afterwards."""
    from specdiag.localserver import EmbeddedServer  # noqa: PLC0415 - only when measuring

    block = server.get("speculative_dflash_block_size") or server.get("speculative_num_draft_tokens")
    with EmbeddedServer(ALGORITHM, None, device=str(server.get("device") or "cpu"),
                        model_path=PROJECT_ROOT / str(server["model_path"]),
                        draft_model_path=PROJECT_ROOT / str(server["speculative_draft_model_path"]),
                        dflash_block_size=int(block) if block else None, draft_window_size=window_tokens) as other:
        yield other.url


def time_other_window(run: Any, server: Mapping[str, Any], window_tokens: int | None, plan: Any,
                      table: str = "drafter_timing") -> list[dict[str, Any]]:
    """The ``drafter_timing`` rows of ``plan`` (a :class:`~.analysis.TimingPlan` labelled with ``window_tokens``) on
    the embedded DFLASH server started again with that draft window; started only when a request is missing."""
    from specdiag.serving import reach  # noqa: PLC0415 - live only: replay loads no server code

    if plan.pending(run.done_keys(table, TIMING_KEY)):
        with other_window_server(server, window_tokens) as url:
            client = reach(url, "embedded")
            print(f"second embedded DFLASH server at {url}: draft window "
                  + (f"{window_tokens:,} tokens" if window_tokens else "none"))
            measure_missing(run, plan, table, TIMING_KEY, desc="draft timing, other window",
                            measure=lambda q: measure_draft_timing(client, q["context_tokens"], plan.max_new_tokens,
                                                                   plan.prompt_kind, q["seed"], window_tokens,
                                                                   q.get("warmup", False)))
    return plan_rows(run, plan, table, TIMING_KEY)


def own_rows(rows: Sequence[Mapping[str, Any]], window_tokens: int | None) -> list[Mapping[str, Any]]:
    """The rows of the server itself (``draft_window_tokens`` equal to its window); all rows when none carries that
    label (rows recorded before the label existed)."""
    mine = [r for r in rows if r.get("draft_window_tokens") == window_tokens]
    return mine if mine or any("draft_window_tokens" in r for r in rows) else list(rows)


def plot_arms(ax: Any, table: Sequence[Mapping[str, Any]], source: str) -> None:
    """Draft ms (solid) and verify ms (dashed) per step against context, one colour per draft window."""
    from specdiag import plots  # noqa: PLC0415 - loads matplotlib (costly: ARCHITECTURE.md, Imports)

    arms: dict[int | None, list[Mapping[str, Any]]] = {}
    for r in table:
        arms.setdefault(r["draft_window_tokens"], []).append(r)
    for i, (window, rs) in enumerate(sorted(arms.items(), key=lambda kv: (kv[0] is not None, kv[0] or 0))):
        name = f"window {window:,}" if window else "no window"
        xs = [r["context_tokens"] for r in rs]
        ax.plot(xs, [r["draft_ms"] for r in rs], "o-", color=f"C{i}", label=f"draft, {name}")
        if any(r.get("verify_ms") is not None for r in rs):
            ax.plot(xs, [r.get("verify_ms") for r in rs], "s--", color=f"C{i}", alpha=0.6, label=f"verify, {name}")
    plots.context_axis(ax, sorted({r["context_tokens"] for r in table}), log=False)
    ax.set_xlim(left=0)
    ax.set_ylim(bottom=0)
    ax.set_ylabel("time per step (ms, median of request medians)")
    ax.set_title("The drafter's own time per step beside the verify step")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    plots.source_note(ax, f"{source}: meta_info spec_step_draft_ms / spec_step_verify_ms")


def drafter_config(server: Mapping[str, Any], meta: Mapping[str, Any]) -> tuple[dict[str, Any] | None, str]:
    """The DFlash drafter's config and where it came from: the server's draft model folder's config.json when this
    machine reads it, else the server's ``speculative_draft_model_config`` (the embedded server's summary), else a
    recorded run's ``speculation.drafter_config``."""
    path = server.get("speculative_draft_model_path")
    if path:
        folder = Path(str(path)) if Path(str(path)).is_absolute() else PROJECT_ROOT / str(path)
        try:
            return json.loads((folder / "config.json").read_text()), f"{path}/config.json"
        except (OSError, ValueError):
            pass
    if isinstance(server.get("speculative_draft_model_config"), Mapping):
        return dict(server["speculative_draft_model_config"]), "server-reported speculative_draft_model_config"
    recorded = (meta.get("speculation") or {}).get("drafter_config")
    return (dict(recorded), "recorded run's speculation.drafter_config") if isinstance(recorded, Mapping) else (None, "")


def arm_table(rows: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Per draft window (None: none) and context: requests (the arm's first request, the server's first, left out),
    the median over requests of each request's median draft ms and verify ms per step (server-reported), the draft
    share of a step (computed per request: median and range), the mean commit length, and the requests' values
    (``draft_request_ms``, ``verify_request_ms``) for the comparisons."""
    groups: dict[tuple[int | None, int], list[Mapping[str, Any]]] = {}
    for r in flag_first(rows):
        if r.get("error") or r.get("draft_ms_median") is None or r.get("first_on_server") or r.get("warmup"):
            continue
        groups.setdefault((r.get("draft_window_tokens"), int(r["context_tokens"])), []).append(r)
    out = []
    for (window, ctx), rs in sorted(groups.items(), key=lambda kv: (kv[0][0] is not None, kv[0][0] or 0, kv[0][1])):
        draft = [float(r["draft_ms_median"]) for r in rs]
        verify = [float(r["verify_ms_median"]) for r in rs if r.get("verify_ms_median") is not None]
        shares = [float(r["draft_ms_median"]) / (float(r["draft_ms_median"]) + float(r["verify_ms_median"]))
                  for r in rs if r.get("verify_ms_median")]
        commits = [float(r["commit_length_mean"]) for r in rs if r.get("commit_length_mean") is not None]
        out.append({"draft_window_tokens": window, "context_tokens": ctx, "requests": len(rs),
                    "draft_ms": statistics.median(draft), "verify_ms": statistics.median(verify) if verify else None,
                    "draft_share": statistics.median(shares) if shares else None,
                    "draft_share_range": span_text(shares, "{:.0%}") if shares else None,
                    "commit_length": statistics.fmean(commits) if commits else None,
                    "draft_request_ms": draft, "verify_request_ms": verify})
    return out


def _arms(table: Sequence[Mapping[str, Any]]) -> dict[int | None, list[Mapping[str, Any]]]:
    arms: dict[int | None, list[Mapping[str, Any]]] = {}
    for r in table:
        arms.setdefault(r["draft_window_tokens"], []).append(r)
    return {w: sorted(rs, key=lambda r: r["context_tokens"]) for w, rs in arms.items() if len(rs) >= 2}


def _line(rs: Sequence[Mapping[str, Any]]) -> str:
    return "; ".join(f"{int(r['context_tokens']):,} tokens: draft {r['draft_ms']:.3g} ms, verify "
                     + (f"{r['verify_ms']:.3g} ms" if r.get("verify_ms") is not None else "-")
                     + f" ({r['requests']} requests)" for r in rs)


def _growth(rs: Sequence[Mapping[str, Any]], field: str = "draft_request_ms") -> Any:
    """The longest context over the shortest of one arm, over requests."""
    return compare_requests(rs[0].get(field) or [rs[0]["draft_ms"]], rs[-1].get(field) or [rs[-1]["draft_ms"]])


def window_findings(table: Sequence[Mapping[str, Any]], n_full_layers: int | None, source: Source = "server-reported",
                    growth_threshold: float = 1.5) -> list[Finding]:
    """From :func:`arm_table`'s rows: ``drafter.window_applied`` (an arm with a draft window: does the drafter's own
    time per step stay within ``growth_threshold`` x from the shortest to the longest context, the interval's upper end
    within it) and ``drafter.no_window`` (an arm without one: its drafter reads the whole context, and what that cost
    as measured, against a window at the longest context). An arm needs two contexts; ``n_full_layers``: the drafter's
    full-attention layers (config), None when unknown."""
    arms = _arms(table)
    found: list[Finding] = []
    growth = {w: _growth(rs) for w, rs in arms.items()}
    none_arm = arms.get(None)
    for window, rs in sorted(((w, rs) for w, rs in arms.items() if w is not None), key=lambda kv: kv[0]):
        first, last, c = rs[0], rs[-1], growth[window]
        reading = growth_reading(c, growth_threshold)
        beyond = [int(r["context_tokens"]) for r in rs if r["context_tokens"] > window]
        verify = _growth(rs, "verify_request_ms") if first.get("verify_request_ms") and last.get("verify_request_ms") else None
        evidence = [f"draft window {window:,} tokens ({source} per-step times, median per request, the arm's first "
                    f"request left out): {_line(rs)}",
                    f"longest over shortest context: {interval_text(c)} (flat: the interval's upper end at or below "
                    f"{growth_threshold:g}x)"]
        if verify is not None:
            evidence.append(f"verify step, longest over shortest context: {interval_text(verify)}")
        if none_arm is not None:
            evidence.append(f"without a window: {interval_text(growth[None])} over {_line(none_arm)}")
        if not beyond:
            evidence.append(f"no measured context exceeds the {window:,}-token window: it cannot act here")
        verdict = (f"With a {window:,}-token draft window the drafter's own time per step went from "
                   f"{first['draft_ms']:.3g} ms at {first['context_tokens']:,} tokens to {last['draft_ms']:.3g} ms at "
                   f"{last['context_tokens']:,} ({interval_text(c)}): ")
        if not beyond:
            verdict += "no context exceeded the window, so these requests cannot show whether it is applied."
            severity = "info"
        elif reading == "flat":
            verdict += (f"{growth_words(reading, growth_threshold)}, so the window is applied and the draft cost is flat "
                        "in context" + (f"; the verify step went {interval_text(verify)}." if verify is not None else "."))
            severity = "ok"
        elif reading == "grows":
            verdict += (f"{growth_words(reading, growth_threshold)}, so the window does not bound the draft cost (not "
                        f"applied, or another part of the draft step grows with the context).")
            severity = "warning"
        else:
            verdict += growth_words(reading, growth_threshold) + ": whether the window is applied is not shown."
            severity = "info"
        found.append(Finding(
            "drafter.window_applied", "Is the draft window applied?" + (f" {NOT_ENOUGH}" if reading == NOT_ENOUGH else ""),
            verdict, severity, tuple(evidence),
            {"draft_window_tokens": window, "growth_x": c.ratio, "growth_lo": c.lo, "growth_hi": c.hi,
             "reading": reading, "draft_ms_first": first["draft_ms"], "draft_ms_last": last["draft_ms"],
             "verify_ms_first": first.get("verify_ms"), "verify_ms_last": last.get("verify_ms"),
             "verify_growth_x": verify.ratio if verify is not None else None,
             "verify_growth_lo": verify.lo if verify is not None else None,
             "verify_growth_hi": verify.hi if verify is not None else None,
             "context_tokens_first": first["context_tokens"], "context_tokens_last": last["context_tokens"],
             "requests_first": c.n_a, "requests_last": c.n_b, "growth_threshold": growth_threshold,
             "contexts_beyond_window": len(beyond)}, source))
    if none_arm is not None:
        found.append(_no_window_finding(none_arm, growth[None], arms, n_full_layers, source, growth_threshold))
    return found


def _no_window_finding(rs: Sequence[Mapping[str, Any]], c: Any, arms: Mapping[int | None, Sequence[Mapping[str, Any]]],
                       n_full_layers: int | None, source: Source, growth_threshold: float) -> Finding:
    """``drafter.no_window``: without a draft window every full-attention layer attends the whole context."""
    first, last = rs[0], rs[-1]
    n = f"{last['context_tokens']:,}"
    reads = (f"its layers can attend all {n} tokens" if n_full_layers is None else
             f"its {n_full_layers} full-attention layer(s) attend all {n} tokens" if n_full_layers else
             f"its layers all slide over their own window, so they attend at most that of the {n} tokens")
    reading = growth_reading(c, growth_threshold)
    numbers: dict[str, Any] = {"growth_x": c.ratio, "growth_lo": c.lo, "growth_hi": c.hi, "reading": reading,
                               "draft_ms_first": first["draft_ms"], "draft_ms_last": last["draft_ms"],
                               "context_tokens_first": first["context_tokens"],
                               "context_tokens_last": last["context_tokens"], "n_full_layers": n_full_layers,
                               "requests_first": c.n_a, "requests_last": c.n_b}
    compare = ""
    for window, others in sorted(((w, o) for w, o in arms.items() if w is not None), key=lambda kv: kv[0]):
        same = next((o for o in others if o["context_tokens"] == last["context_tokens"]), None)
        if same is not None and same["draft_ms"]:
            k = compare_requests(same.get("draft_request_ms") or [same["draft_ms"]],
                                 last.get("draft_request_ms") or [last["draft_ms"]])
            numbers.update(no_window_over_window_x=k.ratio, no_window_over_window_lo=k.lo,
                           no_window_over_window_hi=k.hi, no_window_over_window_verdict=k.verdict)
            said = {"higher": "slower without it", "lower": "faster without it",
                    "tie": "a tie: the interval holds 1", NOT_ENOUGH: NOT_ENOUGH}[k.verdict]
            compare = (f" At {last['context_tokens']:,} tokens a draft step took {last['draft_ms']:.3g} ms without the "
                       f"window and {same['draft_ms']:.3g} ms with a {window:,}-token one ({interval_text(k)}: {said}).")
            break
    verdict = (f"Without a draft window the drafter keeps the whole context: {reads} at the longest context "
               f"(computed from the configuration). Its own time per step went from "
               f"{first['draft_ms']:.3g} ms at {first['context_tokens']:,} tokens to {last['draft_ms']:.3g} ms "
               f"({interval_text(c)}): " + ("it grows with the context." if reading == "grows" else
                                             f"{growth_words(reading, growth_threshold)}; reading these contexts is a "
                                             f"small part of this drafter's step." if reading == "flat" else
                                             growth_words(reading, growth_threshold) + ".") + compare)
    return Finding("drafter.no_window", "The drafter without a draft window", verdict,
                   "warning" if reading == "grows" else "info",
                   (f"no draft window ({source} per-step times, median per request, the arm's first request left "
                    f"out): {_line(rs)}",
                    f"longest over shortest context: {interval_text(c)} (flat: the interval's upper end at or below "
                    f"{growth_threshold:g}x)"),
                   numbers, source)


def not_measurable_finding(server: Mapping[str, Any], engine: str | None) -> Finding:
    """``drafter.time_not_measurable``: a DFLASH server that reports no per-step drafter time (real SGLang, vLLM)."""
    window = server_window(server)
    name = {"sglang": "SGLang", "vllm": "vLLM"}.get(str(engine or "sglang"), str(engine))
    return Finding(
        "drafter.time_not_measurable", "The drafter's own time is not measurable on this server",
        f"{name} reports no per-step drafter time for DFLASH (per request it gives verify steps, the accept length and "
        f"the correct-drafts histogram; per step, nothing): the drafter's time apart from the verify time is not "
        f"measurable from outside here, so this notebook does not estimate it. The server states its draft window as "
        + (f"{window:,} tokens." if window else "none: the drafter keeps the whole context.")
        + " What the window buys shows in 09 (engine_ab.draft_window): two arms that verify alike, one with the window "
        "and one without, set step against step per context.",
        "info", (f"speculative_draft_window_size = {server.get('speculative_draft_window_size')!r} (server-reported)",
                 "no per-step draft time in any drafter_timing row (meta_info spec_step_draft_ms absent)"),
        {"draft_window_tokens": window}, "server-reported")


__all__ = ["ALGORITHM", "arm_table", "config_rows", "drafter_config", "is_dflash", "is_embedded",
           "not_measurable_finding", "other_window", "other_window_server", "own_rows", "plot_arms", "server_window",
           "time_other_window", "window_findings"]
