"""The drafter's attention as context grows: span and KV bytes per draft step, measured draft time, findings.

A draft step runs the drafter once over its own KV cache. A layer with a sliding window attends at most
``window`` tokens whatever the context; a full-attention layer attends the whole context, unless the server
caps the context the drafter sees (SGLang's ``speculative_draft_window_size``). So the drafter's cost is
bounded in context exactly when every layer is bounded; :func:`span_rows` shows it layer by layer, and the
embedded server's per-step draft times (``meta_info.spec_step_draft_ms``) show it measured.

The request is the unit of every measured verdict: a request's value is its own median over its draft steps, a
context's the median over its requests (``repeats`` per context, distinct novel prose per seed), and the server's
first request (the earliest row of each server, :func:`flag_first`; the plan sends a warm-up request first) is flagged
and left out. The longest context against the shortest is the ratio of their medians with its interval (at the level it has) over
requests (:func:`specdiag.stats.compare_requests`): "flat" only where the interval's upper end is within
``growth_threshold``, "grows" where its lower end is above it, otherwise the interval spans the threshold and neither
is said; fewer than :data:`specdiag.stats.MIN_REQUESTS` requests at a context: "not enough requests".
"""

from __future__ import annotations

import dataclasses
import json
import statistics
import time
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from specdiag.findings import Finding, Source
from specdiag.geometry import (
    LAYER_FULL,
    LAYER_SLIDING,
    ModelGeometry,
    kv_bytes_per_layer_breakdown,
    kv_bytes_per_step,
    kv_bytes_per_token_per_layer_per_rank,
)
from specdiag.measure.disturbance import traffic_finding
from specdiag.measure.metrics import trace_columns
from specdiag.measure.request import measured_request
from specdiag.paths import PROJECT_ROOT
from specdiag.stats import MIN_REQUESTS, NOT_ENOUGH, RequestComparison, against_target, compare_requests, fit_line

#: Columns of the ``drafter_timing`` table (one row per request).
DRAFTER_TIMING_COLUMNS: tuple[str, ...] = (
    "ts_unix_s", "context_tokens", "prompt_kind", "seed", "max_new_tokens", "draft_window_tokens", "prompt_tokens",
    "verify_steps", "warmup",
    "draft_steps_timed", "draft_ms_median", "draft_ms_mean", "verify_ms_median", "commit_length_mean", "error",
)


def draft_window(server: Mapping[str, Any], parameter: int = -1) -> int | None:
    """The server-side cap on the context the drafter attends: the parameter when >= 0 (0 = none), else the
    server's or the recorded run's ``speculative_draft_window_size`` (None = no cap)."""
    if parameter is not None and parameter >= 0:
        return parameter or None
    value = server.get("speculative_draft_window_size")
    return int(value) if value else None


def span_rows(geom: ModelGeometry, contexts: Sequence[int], tp_size: int = 1,
              window_cap_tokens: int | None = None) -> list[dict[str, Any]]:
    """One row per context: the span of each layer type and the KV bytes one draft step reads (one rank),
    with the server's draft window and, for comparison, without it and with every layer full."""
    rows = []
    per_token = kv_bytes_per_token_per_layer_per_rank(geom, tp_size)
    for c in sorted(set(int(x) for x in contexts)):
        layers = kv_bytes_per_layer_breakdown(geom, c, tp_size, span_cap_tokens=window_cap_tokens)
        full_spans = [r["span_tokens"] for r in layers if r["layer_type"] == LAYER_FULL]
        slide_spans = [r["span_tokens"] for r in layers if r["layer_type"] == LAYER_SLIDING]
        rows.append({
            "context_tokens": c,
            "sliding_span_tokens": max(slide_spans) if slide_spans else None,
            "full_span_tokens": max(full_spans) if full_spans else None,
            "kv_bytes_per_draft_step": sum(r["kv_bytes"] for r in layers),
            "kv_bytes_no_draft_window": kv_bytes_per_step(geom, c, tp_size),
            "kv_bytes_if_all_full": c * geom.num_layers * per_token,
        })
    return rows


def bounded_span(geom: ModelGeometry, window_cap_tokens: int | None) -> int | None:
    """The largest span any layer can reach, or None when a full-attention layer grows without bound."""
    if window_cap_tokens:
        return window_cap_tokens if LAYER_FULL in geom.layer_types else min(window_cap_tokens, geom.sliding_window or window_cap_tokens)
    if LAYER_FULL in geom.layer_types:
        return None
    return geom.sliding_window


# ---------------------------------------------------------------------------------------------
# Measured draft time (embedded server: meta_info spec_step_draft_ms)
# ---------------------------------------------------------------------------------------------

def timing_row(trace: Any, context_tokens: int, **labels: Any) -> dict[str, Any]:
    """A ``drafter_timing`` row from a RequestTrace; the draft/verify fields are None when the server
    does not report per-step times (real SGLang does not)."""
    spec = getattr(trace, "spec", None)
    draft = list(spec.step_draft_ms or []) if spec is not None else []
    verify = list(spec.step_verify_ms or []) if spec is not None else []
    commits = list(spec.step_commit_lengths or []) if spec is not None else []
    return {
        "ts_unix_s": getattr(trace, "t_send_unix_s", None) or time.time(), "context_tokens": int(context_tokens),
        **labels,
        "prompt_tokens": trace.prompt_tokens,
        "verify_steps": spec.verify_ct if spec is not None else None,
        "draft_steps_timed": len(draft),
        "draft_ms_median": statistics.median(draft) if draft else None,
        "draft_ms_mean": statistics.fmean(draft) if draft else None,
        "verify_ms_median": statistics.median(verify) if verify else None,
        "commit_length_mean": statistics.fmean(commits) if commits else None,
        "error": trace.error,
        **trace_columns(trace, None),  # other traffic beside the request (its draft and verify times are shared)
    }


#: Fields that identify one draft-timing request (for resuming a run folder).
TIMING_KEY = ("context_tokens", "prompt_kind", "seed", "max_new_tokens", "draft_window_tokens")


@dataclasses.dataclass(frozen=True)
class TimingPlan:
    """03's draft-timing requests (``measure.loop.measure_missing`` measures the pending): first one warm-up request
    at the shortest context (seed ``seed + repeats``: prose no timed request sends; flagged and left out as the
    server's first request), then ``repeats`` requests per context, seeds ``seed`` .. ``seed + repeats - 1`` (novel
    prose starts at another paragraph each, so no request re-decodes another's answer)."""

    context_lengths: tuple[int, ...]
    max_new_tokens: int
    prompt_kind: str = "novel"
    seed: int = 0
    draft_window_tokens: int | None = None  # the measured server's speculative_draft_window_size (None: none)
    repeats: int = MIN_REQUESTS
    warmup: bool = True

    def _request(self, context: int, seed: int, warmup: bool = False) -> dict[str, Any]:
        return {"context_tokens": int(context), "prompt_kind": self.prompt_kind, "seed": int(seed),
                "max_new_tokens": self.max_new_tokens, "draft_window_tokens": self.draft_window_tokens,
                "warmup": warmup}

    def requests(self) -> list[dict[str, Any]]:
        first = [self._request(min(self.context_lengths), self.seed + self.repeats, True)] if (
            self.warmup and self.context_lengths) else []
        return first + [self._request(c, self.seed + i) for c in self.context_lengths for i in range(self.repeats)]

    def pending(self, done: Iterable[tuple[Any, ...]]) -> list[dict[str, Any]]:
        done = set(done)
        return [q for q in self.requests() if tuple(q[k] for k in TIMING_KEY) not in done]


def measure_draft_timing(client: Any, context_tokens: int, max_new_tokens: int, prompt_kind: str = "novel",
                         seed: int = 0, draft_window_tokens: int | None = None, warmup: bool = False) -> dict[str, Any]:
    """One measured request (:func:`specdiag.measure.request.measured_request`: stamp, fresh exact-length
    prompt, stream, server errors caught) as its ``drafter_timing`` row (errors kept); ``draft_window_tokens``:
    the server's draft window, as it reports it (a label of the row); ``warmup``: the plan's warm-up request."""
    labels = {"prompt_kind": prompt_kind, "seed": seed, "max_new_tokens": max_new_tokens,
              "draft_window_tokens": draft_window_tokens, "warmup": bool(warmup)}
    done = measured_request(client, int(context_tokens), prompt_kind, int(seed), int(max_new_tokens))
    if done.cache_note:
        labels["cache_note"] = done.cache_note
    if done.trace is None:
        row = {c: None for c in DRAFTER_TIMING_COLUMNS}
        row.update(ts_unix_s=done.t_send_unix_s, context_tokens=int(context_tokens), **labels, error=done.error)
        return row
    return timing_row(done.trace, context_tokens, **labels)


def flag_first(rows: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The rows with ``first_on_server``: True on the earliest row (``ts_unix_s``, else the first in order) of each
    server: rows of one draft window (``draft_window_tokens``) and ``part`` come from one server."""
    out = [dict(r) for r in rows]
    first: dict[tuple[Any, Any], int] = {}
    for i, r in enumerate(out):
        k = (r.get("draft_window_tokens"), r.get("part"))
        j = first.get(k)
        if j is None or (r.get("ts_unix_s") or 0) < (out[j].get("ts_unix_s") or 0):
            first[k] = i
    for i, r in enumerate(out):
        r["first_on_server"] = i in first.values()
    return out


def request_values(rows: Iterable[Mapping[str, Any]], field: str = "draft_ms_median") -> dict[int, list[float]]:
    """Per context: each request's ``field`` (its own median over its steps), without failed rows, the warm-up and the
    server's first request (``first_on_server``, from :func:`flag_first`)."""
    out: dict[int, list[float]] = {}
    for r in rows:
        if r.get("error") or r.get(field) is None or r.get("first_on_server") or r.get("warmup"):
            continue
        out.setdefault(int(r["context_tokens"]), []).append(float(r[field]))
    return out


def span_text(values: Sequence[float], fmt: str = "{:.3g}") -> str:
    """A figure from single measurements with its range over requests: '3.1 (2.9-3.4, 3 requests)'."""
    if not values:
        return "-"
    med = statistics.median(values)
    if len(values) == 1:
        return f"{fmt.format(med)} (1 request)"
    return f"{fmt.format(med)} ({fmt.format(min(values))}-{fmt.format(max(values))}, {len(values)} requests)"


def timing_table(rows: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Per context of the timed rows (:func:`flag_first` applied): requests used, the one left out as the server's
    first, the median over requests of the draft and verify ms per step with their ranges, the draft share of a step
    (per request, median and range) and the mean commit length."""
    rows = flag_first(rows)
    draft, verify = request_values(rows), request_values(rows, "verify_ms_median")
    commits = request_values(rows, "commit_length_mean")
    first = {int(r["context_tokens"]) for r in rows if r.get("first_on_server") or r.get("warmup")}
    shares: dict[int, list[float]] = {}
    for r in rows:
        d, v = r.get("draft_ms_median"), r.get("verify_ms_median")
        if not (r.get("error") or r.get("first_on_server") or r.get("warmup")) and d is not None and v:
            shares.setdefault(int(r["context_tokens"]), []).append(float(d) / (float(d) + float(v)))
    out = []
    for c in sorted(draft):
        out.append({"context_tokens": c, "requests": len(draft[c]), "first_left_out": c in first,
                    "draft_ms": statistics.median(draft[c]), "draft_ms_range": span_text(draft[c]),
                    "verify_ms": statistics.median(verify[c]) if verify.get(c) else None,
                    "verify_ms_range": span_text(verify.get(c, [])),
                    "draft_share": statistics.median(shares[c]) if shares.get(c) else None,
                    "draft_share_range": span_text(shares.get(c, []), "{:.0%}"),
                    "commit_length": statistics.fmean(commits[c]) if commits.get(c) else None})
    return out


def interval_text(c: RequestComparison) -> str:
    """'1.08x (90% interval 1.02-1.15x over 3 / 3 requests)', or the counts when there are too few."""
    if c.lo is None:
        return f"{c.ratio:.3g}x on {c.counts_text()}" if c.ratio is not None else f"{c.counts_text()}"
    return f"{c.ratio:.3g}x ({c.named_interval()} over {c.counts_text()})"


def growth_reading(c: RequestComparison, threshold: float) -> str:
    """"flat", "grows", "spans" or "not enough requests": the longest over the shortest context's interval read
    against ``threshold`` (:func:`specdiag.stats.against_target`)."""
    return {"within": "flat", "beyond": "grows"}.get(against_target(c, threshold), against_target(c, threshold))


def growth_words(reading: str, threshold: float) -> str:
    return {"flat": f"flat: the interval's upper end is within {threshold:g}x",
            "grows": f"it grows with context: the whole interval lies above {threshold:g}x",
            "spans": f"the interval spans {threshold:g}x, so it is neither shown flat nor shown to grow (more "
                     f"requests narrow it)",
            NOT_ENOUGH: f"{NOT_ENOUGH} for a verdict (at least {MIN_REQUESTS} a context, the server's first request "
                        f"left out: raise the repeats parameter)"}[reading]


# ---------------------------------------------------------------------------------------------
# Findings
# ---------------------------------------------------------------------------------------------

def _yarn(geom: ModelGeometry) -> Mapping[str, Any] | None:
    rs = geom.rope_scaling or {}
    kind = str(rs.get("rope_type") or rs.get("type") or "")
    return rs if kind == "yarn" else None


def _config_findings(geom: ModelGeometry, spans: Sequence[Mapping[str, Any]], window_cap_tokens: int | None,
                     config_source: Source) -> list[Finding]:
    """drafter.attention_bounded and drafter.positions, from the configuration."""
    found: list[Finding] = []
    n_full = geom.layer_types.count(LAYER_FULL)
    n_slide = geom.layer_types.count(LAYER_SLIDING)
    first, last = spans[0], spans[-1]
    cap = bounded_span(geom, window_cap_tokens)
    growth = last["kv_bytes_per_draft_step"] / first["kv_bytes_per_draft_step"] if first["kv_bytes_per_draft_step"] else None
    evidence = [
        f"{geom.num_layers} layers: {n_slide} sliding (window {geom.sliding_window or '-'} tokens), {n_full} full attention "
        f"(config: {geom.source})",
        f"server draft window: {window_cap_tokens:,} tokens" if window_cap_tokens else "no server-side draft window",
        f"KV per draft step (one GPU, computed): {first['kv_bytes_per_draft_step'] / 1e6:#.3g} MB at "
        f"{first['context_tokens']:,} tokens, {last['kv_bytes_per_draft_step'] / 1e6:#.3g} MB at {last['context_tokens']:,}",
    ]
    if cap is not None:
        found.append(Finding(
            "drafter.attention_bounded", "Drafter attention is bounded",
            f"Every drafter layer attends at most {cap:,} tokens, so each draft step reads at most "
            f"{last['kv_bytes_per_draft_step'] / 1e6:#.3g} MB of drafter KV however long the context: the drafter's "
            f"attention cost is flat past {cap:,} tokens.",
            "ok", tuple(evidence),
            {"max_span_tokens": cap, "kv_mb_first": first["kv_bytes_per_draft_step"] / 1e6,
             "kv_mb_last": last["kv_bytes_per_draft_step"] / 1e6, "growth_x": growth,
             "n_full_layers": n_full, "n_sliding_layers": n_slide},
            config_source))
    else:
        found.append(Finding(
            "drafter.attention_bounded", "Drafter attention grows with context",
            f"{n_full} full-attention layer(s) attend the whole context and the server sets no draft window, so each "
            f"draft step reads {growth:.3g}x more drafter KV at {last['context_tokens']:,} tokens than at "
            f"{first['context_tokens']:,}: the drafter's attention grows without bound.",
            "warning", tuple(evidence),
            {"max_span_tokens": None, "kv_mb_first": first["kv_bytes_per_draft_step"] / 1e6,
             "kv_mb_last": last["kv_bytes_per_draft_step"] / 1e6, "growth_x": growth,
             "n_full_layers": n_full, "n_sliding_layers": n_slide},
            config_source))
    max_ctx = last["context_tokens"]
    yarn = _yarn(geom)
    if geom.max_position_embeddings:
        over = max_ctx > geom.max_position_embeddings
        found.append(Finding(
            "drafter.positions", "Drafter positions cover the context" if not over else "Context beyond the drafter's positions",
            (f"The longest context, {max_ctx:,} tokens, is within the drafter's max_position_embeddings of "
             f"{geom.max_position_embeddings:,}." if not over else
             f"The longest context, {max_ctx:,} tokens, exceeds the drafter's max_position_embeddings of "
             f"{geom.max_position_embeddings:,}: positions past it were never trained.")
            + (f" RoPE scaling: YaRN (factor {yarn.get('factor') or 'not given'}, original positions "
               f"{yarn.get('original_max_position_embeddings') or 'not given'})." if yarn else ""),
            "warning" if over else "ok",
            (f"max_position_embeddings {geom.max_position_embeddings:,}; rope scaling {dict(geom.rope_scaling or {}) or 'none'} "
             f"(config)",),
            {"max_position_embeddings": geom.max_position_embeddings, "longest_context_tokens": max_ctx,
             "yarn_factor": yarn.get("factor") if yarn else None},
            config_source))
    return found


def _measured_finding(timing: Sequence[Mapping[str, Any]], timing_source: Source,
                      growth_threshold: float) -> Finding | None:
    """drafter.measured_cost: the draft time per step at the longest context over the shortest, over requests (module
    doc); None without two timed contexts."""
    by_ctx = request_values(flag_first(timing))
    if len(by_ctx) < 2:
        return None
    first, last = min(by_ctx), max(by_ctx)
    c = compare_requests(by_ctx[first], by_ctx[last])
    reading = growth_reading(c, growth_threshold)
    meds = sorted((ctx, statistics.median(v)) for ctx, v in by_ctx.items())
    fit = fit_line([x for x, _ in meds], [m for _, m in meds])
    evidence = [f"{ctx:,} tokens: {span_text(by_ctx[ctx])} ms per draft step (median of each request's steps; "
                f"{timing_source} meta_info spec_step_draft_ms)" for ctx in sorted(by_ctx)]
    evidence += [f"{last:,} over {first:,} tokens: {interval_text(c)}; the server's first request left out",
                 f"least squares over the contexts' medians {fit.slope_per_1k:.4g} ms per 1k tokens, r\u00b2 "
                 f"{fit.r2:.3f}, {fit.n} contexts",
                 f"flat: the interval's upper end at or below {growth_threshold:g}x (growth_threshold)"]
    title = "Measured draft time vs context" + (f": {NOT_ENOUGH}" if reading == NOT_ENOUGH else "")
    return Finding(
        "drafter.measured_cost", title,
        f"A draft step took {c.median_a:.3g} ms at {first:,} tokens and {c.median_b:.3g} ms at {last:,} "
        f"({interval_text(c)}): " + growth_words(reading, growth_threshold) + ".",
        {"flat": "ok", "grows": "warning"}.get(reading, "info"), tuple(evidence),
        {"draft_ms_first": c.median_a, "draft_ms_last": c.median_b, "growth_x": c.ratio, "growth_lo": c.lo,
         "growth_hi": c.hi, "reading": reading, "requests_first": c.n_a, "requests_last": c.n_b,
         "slope_ms_per_1k_tokens": fit.slope_per_1k, "context_tokens_first": first, "context_tokens_last": last},
        timing_source)


def drafter_findings(geom: ModelGeometry | None, spans: Sequence[Mapping[str, Any]], window_cap_tokens: int | None,
                     timing: Sequence[Mapping[str, Any]] = (), timing_source: Source = "server-reported",
                     growth_threshold: float = 1.5, config_source: Source = "configured",
                     cost_rows: Sequence[Mapping[str, Any]] = (), cost_source: Source = "measured") -> list[Finding]:
    """Verdicts: is the drafter's attention bounded (config), does its RoPE cover the contexts, is its
    measured per-step draft time flat (longest/shortest context median below ``growth_threshold``), and
    the two together (``drafter.cost_bounded``). ``geom`` None: the server drafts without a model
    (n-gram prompt lookup), so only the measured draft time can be judged. ``cost_rows``: the ``drafter_cost``
    table (STANDALONE minus NGRAM ms per verify step), judged where the engine reports no per-step draft time."""
    found: list[Finding] = []
    traffic = traffic_finding(timing, "drafter", "timing requests")
    if traffic is not None:  # draft and verify times measured beside other requests include their work
        found.append(traffic)
    cap: int | None = None
    if geom is not None:
        found += _config_findings(geom, spans, window_cap_tokens, config_source)
        cap = bounded_span(geom, window_cap_tokens)
    else:
        found.append(Finding(
            "drafter.no_model", "No draft model", "This server drafts without a model (for instance n-gram prompt "
            "lookup): there is no drafter attention to inspect; only its measured draft time is judged.", "info",
            ("the server reports no speculative_draft_model_path and no drafter_config was given",), {},
            config_source))
    measured = _measured_finding(timing, timing_source, growth_threshold)
    if measured is not None:
        found.append(measured)
    difference = cost_difference_finding(cost_rows, cost_source) if measured is None else None
    if difference is not None:
        found.append(difference)
    longest = max((int(r["context_tokens"]) for r in spans), default=0) if spans else max(
        (int(r["context_tokens"]) for r in timing), default=0)
    found.append(_cost_verdict(found, cap, longest, config_source, has_model=geom is not None))
    return found


def _measured_state(found: Sequence[Finding]) -> tuple[Finding | None, str | None]:
    """The measured cost's finding and its reading: "flat", "grows", or None where it gives no verdict (not enough
    requests, an interval that spans the threshold, no growth shown beyond the noise); (None, None) unmeasured."""
    measured = next((f for f in found if f.id == "drafter.measured_cost"), None)
    if measured is None:
        measured = next((f for f in found if f.id == "drafter.cost_difference"), None)
    if measured is None:
        return None, None
    reading = measured.numbers.get("reading")
    return measured, reading if reading in ("flat", "grows") else None


def _cost_verdict(found: Sequence[Finding], cap: int | None, longest: int, source: Source,
                  has_model: bool = True) -> Finding:
    """``drafter.cost_bounded``: the configuration's verdict and the measured one, together."""
    measured, state = _measured_state(found)
    why = ("" if measured is None or state else
           f" ({measured.id}: {measured.numbers.get('reading')})")
    if not has_model:
        verdict, sev = ({"flat": f"The draft step (no draft model) is flat over the measured contexts up to "
                                 f"{longest:,} tokens.",
                         "grows": "The draft step (no draft model) grows with context: the lookup over the context "
                                  "costs more as it grows."}.get(state or "") or
                        (f"No draft model, and the measured draft time gives no verdict{why}." if measured else
                         "No draft model and no measured draft time: nothing to judge."),
                        "ok" if state == "flat" else "warning" if state == "grows" else "info")
    elif cap is not None and state != "grows":
        verdict, sev = (f"Bounded: every drafter layer attends at most {cap:,} tokens"
                        + (", and the measured draft time is flat." if state == "flat" else
                           f"; the measured draft time gives no verdict{why}, so this rests on the configuration."
                           if measured else
                           "; no per-step draft time was measured, so this rests on the configuration."), "ok")
    elif cap is not None:
        verdict, sev = (f"The configuration bounds the drafter's attention at {cap:,} tokens, yet the measured draft time "
                        f"grows with context: something else in the draft step depends on the context (recomputing "
                        f"instead of reusing its KV cache, or the target states it conditions on).", "warning")
    elif state == "flat":
        verdict, sev = (f"Not bounded in principle (full-attention layers read the whole context), but flat over the "
                        f"measured contexts up to {longest:,} tokens: there the full layers' KV is a small share of a "
                        f"draft step.", "info")
    else:
        verdict, sev = ("Not bounded: full-attention layers read the whole context"
                        + (" and the measured draft time grows with it." if state == "grows" else
                           f"; the measured draft time gives no verdict{why} on how much it costs." if measured else
                           "; no per-step draft time was measured to show how much it costs."), "warning")
    evidence = [f"{f.id}: {f.verdict}" for f in found
                if f.id in ("drafter.attention_bounded", "drafter.measured_cost", "drafter.cost_difference",
                            "drafter.no_model")]
    return Finding("drafter.cost_bounded", "Is the drafter's cost bounded in context?", verdict, sev, tuple(evidence),
                   {"bounded_by_config": cap is not None, "max_span_tokens": cap,
                    "measured_flat": (state == "flat") if state else None,
                    "measured_reading": measured.numbers.get("reading") if measured is not None else None},
                   measured.source if measured is not None else source)


# ---------------------------------------------------------------------------------------------
# What the engine really ran: a drafter the launcher patched
# ---------------------------------------------------------------------------------------------

#: The file a launcher writes into a drafter copy it patched (specdiag.launchers.vllm.patched_drafter).
PATCH_FILE = "specdiag_patch.json"
ENGINE_NAMES = {"vllm": "vLLM", "sglang": "SGLang"}


def engine_patch(server: Mapping[str, Any], run_meta: Mapping[str, Any] | None = None) -> dict[str, Any] | None:
    """The patch record of the drafter the server runs: the recorded run's ``drafter.engine_patch``, else the
    ``specdiag_patch.json`` in the server's draft model folder when that is readable here."""
    recorded = ((run_meta or {}).get("drafter") or {}).get("engine_patch")
    if isinstance(recorded, Mapping):
        return dict(recorded)
    path = server.get("speculative_draft_model_path")
    if not path:
        return None
    try:
        folder = Path(str(path))
        folder = folder if folder.is_absolute() else PROJECT_ROOT / folder  # a launcher's project-relative path
        return json.loads((folder / PATCH_FILE).read_text())
    except (OSError, ValueError):
        return None


def engine_patch_finding(patch: Mapping[str, Any], engine: str | None) -> Finding:
    """``drafter.engine_patched``: the engine runs a copy of the drafter with every layer full attention."""
    original = patch.get("original") or {}
    patched = patch.get("patched") or {}
    layers = list(original.get("layer_types") or [])
    n_sliding = sum(1 for t in layers if "sliding" in str(t))
    window = original.get("sliding_window")
    return Finding(
        "drafter.engine_patched", "The engine runs the drafter with full attention everywhere",
        f"{ENGINE_NAMES.get(str(engine), engine or 'This engine')} refuses a drafter whose layers mix sliding-window and full attention, so the "
        f"launcher ran a patched copy: {n_sliding} of {len(layers)} layers that slide over a {window}-token window in "
        f"the trained drafter attend the whole context here. Under this engine the drafter's attention span is no "
        f"longer bounded: every draft step reads drafter KV that grows with the context, and the drafter sees "
        f"context its sliding layers were never trained on.",
        "warning",
        (f"trained drafter ({patch.get('source')}): layer_types {layers}, sliding_window {window}",
         f"what the engine ran ({PATCH_FILE}): layer_types {patched.get('layer_types')}, sliding_window "
         f"{patched.get('sliding_window')}",
         str(patch.get("note") or "")),
        {"n_layers": len(layers), "n_sliding_layers_trained": n_sliding, "sliding_window_trained": window,
         "n_sliding_layers_run": 0},
        "configured")


# ---------------------------------------------------------------------------------------------
# The engine's behaviour, from two arms of one sweep (drafter_timing's window_pair and cost_pair: measure.py)
# ---------------------------------------------------------------------------------------------

#: Tables a recorded run may hold about the drafter's behaviour (written by :mod:`.measure`'s sweep_end).
WINDOW_CHECK_TABLE = "drafter_window_check"
COST_TABLE = "drafter_cost"


def window_check_finding(rows: Sequence[Mapping[str, Any]], source: Source = "measured",
                         server: Mapping[str, Any] | None = None) -> Finding | None:
    """drafter.window_honoured: did the server honour the drafter's sliding window?

    ``rows``: the ``drafter_window_check`` table, one row per (context, prompt kind): the same greedy prompt
    sent to the server with the drafter as shipped and to one with a copy whose config declares every layer
    full attention (same weights). Beyond the window, identical drafting (verify steps, correct drafts,
    histogram) means the server ran the shipped drafter with full attention in every layer. None without
    rows that compare (no error, a verify count) beyond the window; fewer than :data:`specdiag.stats.MIN_REQUESTS`
    requests beyond it: "not enough requests" (``numbers["verdict"]``: "honoured", "ignored" or that).
    """
    ok = [r for r in rows if not r.get("error") and r.get("same_drafting") is not None]
    beyond = [r for r in ok if r.get("beyond_window")]
    if not beyond:
        return None
    window = beyond[0].get("window_tokens")
    differ = [r for r in beyond if not r["same_drafting"]]
    inside = [r for r in ok if not r.get("beyond_window")]
    evidence = [f"{int(r['context_tokens']):,} tokens, {r.get('kind')}: verify steps {r.get('verify_ct_as_shipped')} "
                f"(as shipped) vs {r.get('verify_ct_all_full')} (all layers full), correct drafts "
                f"{r.get('correct_drafts_as_shipped')} vs {r.get('correct_drafts_all_full')} ({source})" for r in ok]
    if inside and not all(r["same_drafting"] for r in inside):
        evidence.append("within the window the two already differ: the comparison is noisy, read it with care")
    if server is not None:
        evidence.append(_window_settings_evidence(server))
    numbers = {"window_tokens": window, "rows_beyond_window": len(beyond), "rows_differing_beyond_window": len(differ),
               "contexts_tokens": sorted({int(r["context_tokens"]) for r in ok})}
    if len(beyond) < MIN_REQUESTS:
        return Finding(
            "drafter.window_honoured", f"Does the server honour the drafter's sliding window? {NOT_ENOUGH}",
            f"Only {len(beyond)} request(s) compared the drafter as shipped with its all-full-attention copy beyond the "
            f"{window}-token window ({len(differ)} drafted differently): {NOT_ENOUGH} for a verdict (at least "
            f"{MIN_REQUESTS}).", "info", tuple(evidence), {**numbers, "verdict": NOT_ENOUGH}, source)
    if differ:
        return Finding(
            "drafter.window_honoured", "The server honours the drafter's sliding window",
            f"Beyond the {window}-token window, the drafter as shipped drafted differently from its all-full-attention "
            f"copy in {len(differ)} of {len(beyond)} requests: its sliding layers attend only the window.",
            "ok", tuple(evidence), {**numbers, "verdict": "honoured"}, source)
    return Finding(
        "drafter.window_honoured", "The server ignores the drafter's sliding window",
        f"At every context beyond the {window}-token window the drafter as shipped drafted exactly like its "
        f"all-full-attention copy ({len(beyond)} requests): the server runs every drafter layer with full attention, "
        f"so the drafter's cost and its positions beyond what it was trained on grow with context.",
        "warning", tuple(evidence), {**numbers, "verdict": "ignored"}, source)


def _window_settings_evidence(server: Mapping[str, Any]) -> str:
    """What the server's settings say about the drafter's attention span (server-reported /server_info keys)."""
    keys = ("speculative_draft_window_size", "speculative_draft_attention_backend", "speculative_attention_mode")
    shown = ", ".join(f"{k} = {server.get(k)!r}" for k in keys if k in server)
    if not shown:
        return "server settings: no draft-window setting reported (server-reported /server_info)"
    return (f"server settings: {shown} (server-reported /server_info): no server-side draft window, and no setting "
            f"names the drafter's per-layer sliding window; only the behaviour above tells whether it was honoured")


def as_engine_ran(geom: ModelGeometry | None, window_finding: Finding | None) -> ModelGeometry | None:
    """The drafter as the engine ran it: every layer full attention when ``drafter.window_honoured`` found that
    the server ignores the sliding window (same shapes and weights), else ``geom`` unchanged."""
    if geom is None or window_finding is None or window_finding.numbers.get("verdict") != "ignored":
        return geom
    if all(t == LAYER_FULL for t in geom.layer_types):
        return geom
    return dataclasses.replace(
        geom, layer_types=tuple(LAYER_FULL for _ in geom.layer_types),
        source=f"{geom.source}; every layer full attention, as the engine ran it (drafter.window_honoured, "
               f"{window_finding.source})")


def _cost_requests(rows: Sequence[Mapping[str, Any]]) -> dict[int, tuple[list[float], list[float]]]:
    """Per context: the STANDALONE and the NGRAM server's ms per verify step, one value per request (a row's
    ``standalone_request_ms`` / ``ngram_request_ms`` lists, else its one ``standalone_step_ms`` / ``ngram_step_ms``)."""
    out: dict[int, tuple[list[float], list[float]]] = {}
    for r in rows:
        s = r.get("standalone_request_ms") or ([r["standalone_step_ms"]] if r.get("standalone_step_ms") is not None else [])
        n = r.get("ngram_request_ms") or ([r["ngram_step_ms"]] if r.get("ngram_step_ms") is not None else [])
        if s and n:
            a, b = out.setdefault(int(r["context_tokens"]), ([], []))
            a.extend(float(x) for x in s)
            b.extend(float(x) for x in n)
    return out


def cost_difference_finding(rows: Sequence[Mapping[str, Any]], source: Source = "measured") -> Finding | None:
    """``drafter.cost_difference``: the drafter's cost per verify step measured from outside, where the engine
    reports no per-step draft time: per context, the STANDALONE server's ms per verify step against the NGRAM
    server's (same target, same prompts; the ``drafter_cost`` table), over requests: STANDALONE / NGRAM with its
    interval over requests (:func:`specdiag.stats.compare_requests`). "grows" where the longest context's interval lies
    wholly above the shortest's; else no growth is shown beyond the noise, and the drafter's share at the longest
    context is bounded by its interval ("no cost above"). None without two usable contexts."""
    by = _cost_requests(rows)
    if len(by) < 2:
        return None
    cmp = {c: compare_requests(n, s) for c, (s, n) in sorted(by.items())}
    first, last = min(cmp), max(cmp)
    cf, cl = cmp[first], cmp[last]
    diff = {c: (k.median_b - k.median_a) for c, k in cmp.items()}
    fit = fit_line(list(diff), list(diff.values()))
    enough = cf.enough and cl.enough
    reading = NOT_ENOUGH if not enough else "grows" if cl.lo > cf.hi else "no growth shown"
    evidence = [f"{c:,} tokens: STANDALONE {k.median_b:.3g} ms, NGRAM {k.median_a:.3g} ms per verify step "
                f"(difference {diff[c]:+.3g} ms); STANDALONE / NGRAM {interval_text(k)} (computed from {source} ms "
                f"per verify step)" for c, k in cmp.items()]
    if reading != NOT_ENOUGH:  # a line through single requests would carry no range
        evidence.append(f"least squares of the differences {fit.slope_per_1k:+.3g} ms per 1k tokens, r\u00b2 "
                        f"{fit.r2:.2f}, {fit.n} contexts (computed from the request medians)")
    head = (f"The engine reports no per-step draft time; the STANDALONE server's ms per verify step against the NGRAM "
            f"server's was {interval_text(cf)} at {first:,} tokens and {interval_text(cl)} at {last:,} "
            f"(differences {diff[first]:+.3g} and {diff[last]:+.3g} ms): ")
    if reading == NOT_ENOUGH:
        tail = f"{NOT_ENOUGH} for a verdict (at least {MIN_REQUESTS} per server and context)."
    elif reading == "grows":
        tail = "the drafter's cost grows with context (the longest context's interval lies above the shortest's)."
    else:
        tail = (f"no growth beyond the noise; at {last:,} tokens the drafter adds "
                + ("nothing measurable" if cl.hi <= 1 else f"at most {100 * (cl.hi - 1):.0f}%")
                + " to a verify step (the interval's upper end).")
    return Finding(
        "drafter.cost_difference", "The drafter's cost per verify step, measured against NGRAM"
        + (f": {NOT_ENOUGH}" if reading == NOT_ENOUGH else ""), head + tail,
        "warning" if reading == "grows" else "info", tuple(evidence),
        {"drafter_ms_first": diff[first], "drafter_ms_last": diff[last], "slope_ms_per_1k_tokens": fit.slope_per_1k,
         "r2": fit.r2, "context_tokens_first": first, "context_tokens_last": last, "grows": reading == "grows",
         "reading": reading, "ratio_first": cf.ratio, "ratio_last": cl.ratio, "ratio_last_lo": cl.lo,
         "ratio_last_hi": cl.hi, "requests_first": min(cf.n_a, cf.n_b), "requests_last": min(cl.n_a, cl.n_b)},
        source)
