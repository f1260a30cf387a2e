"""The commit probe (the investigation's step 4): predictable vs novel text at each context.

For each (context, kind): flush the server's prefix cache, build a prompt of exactly ``context_tokens``
ids with the server's tokenizer (:mod:`specdiag.prompts`), stream it greedily, and record one
``commit_probe`` row (plus one ``commit_probe_steps`` row per verify step when the server reports
per-step commits, as the embedded server does).

Columns of ``commit_probe`` (units in the names; source in brackets):

- ``context_tokens``, ``kind`` (``predictable``/``novel``), ``seed``, ``max_new_tokens``: the request.
- ``num_draft_tokens`` [server-reported: server_info's speculative_num_draft_tokens] and
  ``max_commit_length = num_draft_tokens``: SGLang's speculative_num_draft_tokens counts the tokens one
  verify forward scores, the last committed token included, so a step drafts num_draft_tokens - 1
  tokens and commits at most num_draft_tokens (accepted drafts + the target's bonus token).
- ``prompt_tokens``, ``completion_tokens``, ``verify_steps`` [server-reported, meta_info].
- ``commit_length = (completion_tokens - 1) / verify_steps``: tokens per verify step, bonus included
  [computed from server-reported counts; :func:`specdiag.speculation.commit.commit_length_from_meta`].
- ``accepted_drafts``: mean accepted draft tokens per verify step = commit_length - 1 [computed]; without a
  commit length, num_correct_drafts / verify_steps. (Real SGLang 0.5.17 counts in num_correct_drafts and its
  histogram the drafts the last verify step accepted past max_new_tokens, which never reach the output: recorded
  in tests/data/sglang-0.5.17, e.g. 16 correct drafts in 19 steps for 32 tokens; so the counts decide.)
  ``proposed_drafts``: mean proposed per step [computed].
- ``target_forwards``: the target's decode forwards of the request (the prefill's excluded), ``steps_without_draft``
  (forwards that verified no draft: they commit 1 token each) and ``tokens_per_target_forward = (completion_tokens -
  1) / target_forwards`` [computed from server-reported counts; :func:`target_forwards`]. Where every decode step is a
  verify step (SGLang, the embedded server) it equals the commit length; where steps can pass without a draft (vLLM
  counts only the steps that drafted) it is lower.
- ``commit_histogram``: verify steps per commit length (index = tokens) [server-reported or computed].
- ``wall_s``: send to last byte; ``prefill_s``: send to first token (TTFT); ``prefill_share =
  prefill_s / wall_s``; ``decode_tok_s = (completion_tokens - first chunk's tokens) / (last chunk -
  first chunk time)`` [measured, client clock].
- ``error``: None when fine; a failed request keeps its row with the error.

Columns of ``commit_probe_steps``: ``context_tokens``, ``kind``, ``seed``, ``step`` (0-based),
``commit_length``, ``accepted_drafts`` (= commit_length - 1), ``draft_ms``, ``verify_ms``
[server-reported by the embedded server].

Verdict rules (:func:`probe_findings`). The request is the unit: a request's value is its own commit length, a cell
(kind, context) the median over its requests, and every comparison takes at least 3 requests per cell
(:func:`specdiag.stats.compare_requests`: the ratio of the medians with its interval over requests, at the level it has);
a comparison with fewer says "not enough requests" (info) instead of a verdict. Repeats: ``repeats`` requests per
(context, kind), seeds ``seed`` .. ``seed + repeats - 1`` (novel prose starts at another paragraph each; the predictable
sentence is the same text, sent again on a flushed cache).
- predictable, longest context against shortest: a fall (the interval below 1 and the drop above ``flat_tolerance``)
  is a long-context speculative bug; look at the drafter's window, positions/rope scaling and the draft KV cache;
  otherwise flat when every context's median lies within ``flat_tolerance`` of their mean (a tie when the interval
  holds 1, said as one), and healthy at ``healthy_share`` of the maximum or more; else uneven;
- novel against predictable at each context: text difficulty where the whole interval of novel / predictable lies
  at or below ``text_share``; close to predictable where it lies above; undecided where it straddles it;
- every (kind, context) at most ``1 + no_commit_drafts`` tokens per verify step: the drafter does not commit on
  either text (a random-weight drafter), so the probe can tell neither a bug nor the text's difficulty; that is the
  only verdict then.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Sequence

from specdiag.findings import Finding, Source
from specdiag.measure.disturbance import commit_usable, traffic_finding
from specdiag.measure.metrics import TRAFFIC_COLUMNS, decode_tok_s, trace_columns
from specdiag.measure.request import measured_request
from specdiag.nb import check, check_context_lengths
from specdiag.prompts import NOVEL_PROSE_PATH
from specdiag.speculation.commit import commit_histogram, commit_histogram_from_correct_drafts, commit_length_of
from specdiag.stats import MIN_REQUESTS, RequestComparison, compare_requests

PROBE_TABLE = "commit_probe"
STEPS_TABLE = "commit_probe_steps"
PROBE_KEY = ("context_tokens", "kind", "seed", "max_new_tokens")
KINDS = ("predictable", "novel")

PROBE_COLUMNS: tuple[str, ...] = (
    "ts_unix_s", "context_tokens", "kind", "seed", "max_new_tokens", "num_draft_tokens", "max_commit_length",
    "cache_flushed", "prompt_tokens", "prompt_tokens_match", "completion_tokens", "verify_steps",
    "commit_length", "accepted_drafts", "proposed_drafts", "target_forwards", "steps_without_draft",
    "tokens_per_target_forward", "commit_histogram", "wall_s", "prefill_s",
    "prefill_share", "decode_tok_s", "finish_reason", "error", *TRAFFIC_COLUMNS,
)
STEP_COLUMNS: tuple[str, ...] = (
    "ts_unix_s", "context_tokens", "kind", "seed", "step", "commit_length", "accepted_drafts", "draft_ms",
    "verify_ms", "error",
)


@dataclass(frozen=True)
class ProbePlan:
    """context_lengths: prompt lengths, tokens; kinds: 'predictable' and/or 'novel'; max_new_tokens:
    tokens per request (greedy, ignore_eos); seed: picks the novel prose's start; flush_cache: POST
    /flush_cache before each request."""

    context_lengths: tuple[int, ...]
    kinds: tuple[str, ...] = KINDS
    max_new_tokens: int = 64
    seed: int = 0
    flush_cache: bool = True
    repeats: int = 1  # requests per (context, kind), seeds seed .. seed + repeats - 1

    def requests(self) -> list[dict[str, Any]]:
        return [{"context_tokens": c, "kind": k, "seed": self.seed + i, "max_new_tokens": self.max_new_tokens}
                for c in self.context_lengths for i in range(self.repeats) for k in self.kinds]

    def pending(self, done: Iterable[tuple[Any, ...]]) -> list[dict[str, Any]]:
        done = set(done)
        return [q for q in self.requests() if tuple(q[k] for k in PROBE_KEY) not in done]


def make_plan(context_lengths: Any, kinds: Any, max_new_tokens: Any, seed: Any, flush_cache: Any = True,
              server_context_length: int | None = None, repeats: Any = 1) -> ProbePlan:
    """Check the probe's parameters (a ParameterError naming the parameter and the fix) and plan it."""
    check(isinstance(max_new_tokens, int) and not isinstance(max_new_tokens, bool) and max_new_tokens >= 2,
          f"max_new_tokens must be a whole number >= 2; got {max_new_tokens!r}")
    limit = server_context_length - max_new_tokens if server_context_length else None
    contexts = check_context_lengths("context_lengths", context_lengths, maximum=limit)
    check(isinstance(kinds, (list, tuple)) and len(kinds) > 0 and all(k in KINDS for k in kinds),
          f"kinds must be a non-empty list of 'predictable' and/or 'novel'; got {kinds!r}")
    check(len(set(kinds)) == len(kinds), f"kinds lists a kind twice: {kinds!r}")
    check(isinstance(seed, int) and not isinstance(seed, bool), f"seed must be a whole number; got {seed!r}")
    check(isinstance(flush_cache, bool), f"flush_cache must be True or False; got {flush_cache!r}")
    check(isinstance(repeats, int) and not isinstance(repeats, bool) and repeats >= 1,
          f"repeats must be a whole number >= 1 (a verdict takes {MIN_REQUESTS} per cell); got {repeats!r}")
    check("novel" not in kinds or NOVEL_PROSE_PATH.exists(),
          f"kind 'novel' needs the held-out prose {NOVEL_PROSE_PATH}, which is missing: restore it "
          f"(git checkout data/prompts) or use kinds=['predictable']")
    return ProbePlan(tuple(contexts), tuple(kinds), max_new_tokens, seed, flush_cache, repeats)


def _num(x: Any) -> float | None:
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) else None


def target_forwards(completion_tokens: int, verify_steps: int | None, accepted_drafts_total: int | None,
                    steps_are_verifies: bool) -> int | None:
    """The target's decode forwards of one request (pure). Each forward commits its accepted drafts plus one token,
    and the first token comes from the prefill, so forwards = completion_tokens - 1 - accepted drafts. Where every
    decode step is a verify step (``steps_are_verifies``: SGLang and the embedded server, whose ``num_correct_drafts``
    also counts drafts past max_new_tokens) that is ``verify_steps``; elsewhere (vLLM, whose step count holds only
    the steps that drafted) it is computed from the accepted drafts. None without the counts."""
    if steps_are_verifies:
        return verify_steps if verify_steps else None
    if accepted_drafts_total is None or completion_tokens < 1:
        return None
    forwards = completion_tokens - 1 - accepted_drafts_total
    return forwards if forwards > 0 else None


def probe_row(trace: Any, request: Mapping[str, Any], num_draft_tokens: int | None,
              cache_flushed: bool | None = None, cache_note: str | None = None) -> dict[str, Any]:
    """One ``commit_probe`` row from a :class:`specdiag.serving.RequestTrace` (pure)."""
    spec = getattr(trace, "spec", None)
    completion = int(trace.completion_tokens or 0)
    verify = spec.verify_ct if spec is not None else None
    commit = commit_length_of(completion, spec)
    correct = spec.num_correct_drafts if spec is not None else None
    proposed = spec.num_proposed_drafts if spec is not None else None
    steps = spec.step_commit_lengths if spec is not None else None
    hist: list[int] | None = None
    if steps:
        hist = commit_histogram(steps, max(max(steps), num_draft_tokens or 0))
    elif spec is not None and spec.correct_drafts_histogram:
        hist = commit_histogram_from_correct_drafts(spec.correct_drafts_histogram)
    # commit - 1 first: SGLang's num_correct_drafts also counts drafts accepted past max_new_tokens (module doc).
    accepted = (commit - 1) if commit else ((correct / verify) if (correct is not None and verify) else None)
    wall = _num(trace.e2e_s)
    prefill = _num(trace.ttft_s)
    decode = decode_tok_s(list(trace.chunk_t_s or []), list(trace.chunk_tokens or []), completion)
    prompt_tokens = trace.prompt_tokens
    finish = getattr(trace, "finish_type", None)
    # vLLM states its own per-step mean (mean_commit_length) and counts only the steps that drafted
    forwards = target_forwards(completion, verify, correct,
                               steps_are_verifies=spec is None or spec.mean_commit_length is None)
    row = {c: None for c in PROBE_COLUMNS}
    row.update({
        "target_forwards": forwards,
        "steps_without_draft": forwards - verify if (forwards is not None and verify is not None) else None,
        "tokens_per_target_forward": (completion - 1) / forwards if forwards else None,
        "ts_unix_s": trace.t_send_unix_s, **{k: request[k] for k in PROBE_KEY},
        "num_draft_tokens": num_draft_tokens,
        "max_commit_length": num_draft_tokens or None,
        "cache_flushed": cache_flushed, "prompt_tokens": prompt_tokens,
        "prompt_tokens_match": prompt_tokens == request["context_tokens"] if prompt_tokens is not None else None,
        "completion_tokens": completion, "verify_steps": verify, "commit_length": commit,
        "accepted_drafts": accepted,
        "proposed_drafts": proposed / verify if (proposed is not None and verify) else None,
        "commit_histogram": hist, "wall_s": wall, "prefill_s": prefill,
        "prefill_share": prefill / wall if (prefill is not None and wall) else None,
        "decode_tok_s": decode,
        "finish_reason": finish,
        "error": trace.error,
    })
    row.update(trace_columns(trace, commit, cache_note))
    return row


def step_rows(trace: Any, request: Mapping[str, Any]) -> list[dict[str, Any]]:
    """One ``commit_probe_steps`` row per verify step, when the server reports per-step commits."""
    spec = getattr(trace, "spec", None)
    commits = (spec.step_commit_lengths if spec is not None else None) or []
    draft = (spec.step_draft_ms if spec is not None else None) or []
    verify = (spec.step_verify_ms if spec is not None else None) or []
    out = []
    for i, c in enumerate(commits):
        out.append({"ts_unix_s": trace.t_send_unix_s, "context_tokens": request["context_tokens"],
                    "kind": request["kind"], "seed": request["seed"], "step": i, "commit_length": int(c),
                    "accepted_drafts": int(c) - 1, "draft_ms": draft[i] if i < len(draft) else None,
                    "verify_ms": verify[i] if i < len(verify) else None, "error": None})
    return out


def error_row(request: Mapping[str, Any], error: str, num_draft_tokens: int | None,
              cache_flushed: bool | None = None, ts_unix_s: float | None = None,
              cache_note: str | None = None) -> dict[str, Any]:
    """A failed request's row; ``ts_unix_s`` is when it was attempted (stamped before the request)."""
    row = {c: None for c in PROBE_COLUMNS}
    row.update(ts_unix_s=time.time() if ts_unix_s is None else ts_unix_s, **{k: request[k] for k in PROBE_KEY},
               num_draft_tokens=num_draft_tokens, max_commit_length=num_draft_tokens or None,
               cache_flushed=cache_flushed, error=error)
    if cache_note:
        row["cache_note"] = cache_note
    return row


def measure(client: Any, request: Mapping[str, Any], plan: ProbePlan,
            num_draft_tokens: int | None) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """One measured request (:func:`specdiag.measure.request.measured_request`); returns the probe row and its
    step rows (never raises for a server-side failure: the row carries the error)."""
    done = measured_request(client, int(request["context_tokens"]), request["kind"], int(request["seed"]),
                            plan.max_new_tokens, reset=plan.flush_cache)
    if done.trace is None:
        return error_row(request, str(done.error), num_draft_tokens, done.cache_flushed, done.t_send_unix_s,
                         done.cache_note), []
    return (probe_row(done.trace, request, num_draft_tokens, done.cache_flushed, done.cache_note),
            step_rows(done.trace, request))


def latest_rows(rows: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """One row per request key: the last successful one, else the last failed one; sorted by context."""
    best: dict[tuple[Any, ...], dict[str, Any]] = {}
    for row in rows:
        key = tuple(row.get(k) for k in PROBE_KEY)
        if key not in best or not row.get("error") or best[key].get("error"):
            best[key] = dict(row)
    return sorted(best.values(), key=lambda r: (r.get("context_tokens") or 0, KINDS.index(r.get("kind", "predictable"))
                                                if r.get("kind") in KINDS else 9))


def summarize(rows: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Per (kind, context): requests, pooled commit length (Σ(completion-1)/Σ verify steps when the
    counts are there, else the mean of the rows' commit_length), accepted drafts (commit length - 1), wall
    and prefill."""
    groups: dict[tuple[str, int], list[Mapping[str, Any]]] = {}
    for r in rows:
        if r.get("error") or r.get("commit_length") is None or not commit_usable(r):
            continue  # (a commit length from counter differences while others ran is unreliable: left out)
        groups.setdefault((str(r.get("kind") or "predictable"), int(r["context_tokens"])), []).append(r)
    out = []
    for (kind, ctx_tokens), rs in sorted(groups.items(), key=lambda kv: (kv[0][0] != "predictable", kv[0][1])):
        counted = [r for r in rs if r.get("completion_tokens") and r.get("verify_steps")]
        if len(counted) == len(rs):
            commit = sum(r["completion_tokens"] - 1 for r in rs) / sum(r["verify_steps"] for r in rs)
        else:
            commit = sum(float(r["commit_length"]) for r in rs) / len(rs)
        fw = [r for r in rs if r.get("target_forwards") and r.get("completion_tokens")]
        walls = [float(r["wall_s"]) for r in rs if r.get("wall_s") is not None]
        pre = [float(r["prefill_s"]) for r in rs if r.get("prefill_s") is not None]
        maxc = [r.get("max_commit_length") for r in rs if r.get("max_commit_length")]
        out.append({"kind": kind, "context_tokens": ctx_tokens, "requests": len(rs), "commit_length": commit,
                    "request_commits": [float(r["commit_length"]) for r in rs],
                    # commit - 1, not the rows' accepted_drafts: rows recorded before that column became
                    # commit - 1 hold SGLang's num_correct_drafts / steps (drafts past max_new_tokens counted)
                    "accepted_drafts": commit - 1,
                    "tokens_per_target_forward": (sum(r["completion_tokens"] - 1 for r in fw)
                                                  / sum(r["target_forwards"] for r in fw)) if fw else None,
                    "wall_s": sum(walls) / len(walls) if walls else None,
                    "prefill_s": sum(pre) / len(pre) if pre else None,
                    "prefill_share": (sum(pre) / sum(walls)) if (pre and walls and len(pre) == len(walls)) else None,
                    "max_commit_length": maxc[0] if maxc else None})
    return out


def _k(n: int) -> str:
    from specdiag.plots import format_tokens  # noqa: PLC0415 - loads matplotlib (costly: ARCHITECTURE.md, Imports)

    return format_tokens(n)


def probe_findings(summary: Sequence[Mapping[str, Any]], max_commit_length: int | None,
                   source: Source = "measured", flat_tolerance: float = 0.15, healthy_share: float = 0.5,
                   text_share: float = 0.5, prefill_share_note: float = 0.5,
                   rows: Sequence[Mapping[str, Any]] = (), no_commit_drafts: float = 0.1) -> list[Finding]:
    """The probe's verdicts (see the module docstring), each with the numbers behind it; with ``rows``, also how
    many requests ran beside other traffic (``probe.other_traffic``)."""
    found: list[Finding] = []
    traffic = traffic_finding(rows, "probe")
    if traffic is not None:
        found.append(traffic)
    silent = no_commit_finding(summary, max_commit_length, source, no_commit_drafts)
    if silent is not None:  # neither text commits: no bug and no text verdict can be read
        return found + [silent] + _prefill_findings(summary, source, prefill_share_note)
    pred = sorted((s for s in summary if s["kind"] == "predictable"), key=lambda s: s["context_tokens"])
    novel = {s["context_tokens"]: s for s in summary if s["kind"] == "novel"}
    if len(pred) >= 2:
        found.append(_predictable_finding(pred, max_commit_length, source, flat_tolerance, healthy_share))
    pairs = [(s, novel[s["context_tokens"]]) for s in pred if s["context_tokens"] in novel]
    if pairs:
        found.append(_text_finding(pairs, source, text_share))
    return found + _prefill_findings(summary, source, prefill_share_note)


def _values(cell: Mapping[str, Any]) -> list[float]:
    """A cell's per-request commit lengths (a summary row without them: its pooled value, one request)."""
    return list(cell.get("request_commits") or [cell["commit_length"]])


def _cell_text(cell: Mapping[str, Any]) -> str:
    vals = _values(cell)
    return (f"{_k(cell['context_tokens'])}: {statistics.median(vals):.2f} (median of {len(vals)} request"
            f"{'' if len(vals) == 1 else 's'})")


def _interval(c: RequestComparison) -> str:
    return (f"{c.ratio:.2f}x, {c.named_interval()}, {c.counts_text()}" if c.enough else
            f"{c.ratio:.2f}x, {c.counts_text()}: not enough requests" if c.ratio is not None else c.counts_text())


def _not_enough(fid: str, title: str, what: str, evidence: Sequence[str], source: Source) -> Finding:
    return Finding(fid, title, f"Not enough requests to compare {what}: a verdict takes at least {MIN_REQUESTS} "
                   "requests per cell (the probe's repeats parameter).", "info", tuple(evidence),
                   {"not_enough_requests": True, "min_requests": MIN_REQUESTS}, source)


def _predictable_finding(pred: Sequence[Mapping[str, Any]], max_commit_length: int | None, source: Source,
                         flat_tolerance: float, healthy_share: float) -> Finding:
    """probe.predictable_*: the longest context against the shortest, over requests (module doc)."""
    maxc = f" of at most {max_commit_length}" if max_commit_length else ""
    first, last = pred[0], pred[-1]
    c = compare_requests(_values(first), _values(last))
    meds = {s["context_tokens"]: statistics.median(_values(s)) for s in pred}
    evidence = [f"Predictable commit length per context (tokens per verify step{maxc}, {source}): "
                + "; ".join(_cell_text(s) for s in pred) + ".",
                f"Longest over shortest context: {_interval(c)}."]
    if not c.enough:
        return _not_enough("probe.predictable_not_enough", "Predictable text across contexts: not enough requests",
                           f"the predictable text's commit length at {_k(first['context_tokens'])} and "
                           f"{_k(last['context_tokens'])} tokens", evidence, source)
    mean = sum(meds.values()) / len(meds)
    dev = max(abs(m - mean) / mean for m in meds.values())
    drop = 1.0 - float(c.ratio)  # type: ignore[arg-type]
    numbers = {"predictable_commit_length_by_context": meds, "mean_commit_length": mean,
               "max_relative_deviation": dev, "drop_first_to_last": drop, "ratio_last_first": c.ratio,
               "ratio_lo": c.lo, "ratio_hi": c.hi, "requests_first": c.n_a, "requests_last": c.n_b,
               "max_commit_length": max_commit_length, "flat_tolerance": flat_tolerance}
    if c.verdict == "lower" and drop > flat_tolerance:
        return Finding(
            "probe.predictable_falls", "Predictable-text commit length falls with context",
            f"Commit length on predictable text drops {drop:.0%} from {_k(first['context_tokens'])} to "
            f"{_k(last['context_tokens'])} tokens ({c.named_interval()} over {c.counts_text()}): a "
            f"long-context speculative bug, not text difficulty. Look at the drafter's attention window (sliding "
            f"window, which layers are full attention), its positions and rope scaling (max_position_embeddings, YaRN "
            f"factor and original length), and the draft KV cache (eviction, page reuse, positions after a rejected "
            f"draft).", "critical",
            (*evidence, f"The drop is above the ±{flat_tolerance:.0%} band of a flat line and its interval lies below "
                        "no change."), numbers, source)
    tie = " (a tie: the interval holds no change)" if c.verdict == "tie" else ""
    if dev <= flat_tolerance:
        healthy = max_commit_length is None or mean >= healthy_share * max_commit_length
        return Finding(
            "probe.predictable_flat", "Predictable-text commit length is flat across contexts",
            (f"Longest over shortest context {c.ratio:.2f}x{tie}, {c.named_interval()}: "
             + ("the drafter, its window, positions and KV cache and the verification are sound at long context: a low "
                "commit length on other text is the text's difficulty, not a bug." if healthy else
                "flat but low: the drafter does not copy even predictable text at the shortest context. That is a "
                "drafter quality problem (or a short-context bug), not a long-context one.")),
            "ok" if healthy else "warning",
            (*evidence, f"Every context's median lies within {dev:.0%} of the mean {mean:.2f} (band ±{flat_tolerance:.0%})."
             + (f" The mean is {mean / max_commit_length:.0%} of the maximum {max_commit_length}."
                if max_commit_length else "")), numbers, source)
    return Finding(
        "probe.predictable_uneven", "Predictable-text commit length varies with context, without a fall",
        f"Longest over shortest context {c.ratio:.2f}x{tie} ({c.named_interval()}): not a fall beyond the "
        "requests' spread, but outside a flat band: more requests (repeats, another seed) before concluding.", "info",
        (*evidence, f"Largest deviation from the mean {mean:.2f}: {dev:.0%} (band ±{flat_tolerance:.0%})."),
        numbers, source)


def _text_finding(pairs: Sequence[tuple[Mapping[str, Any], Mapping[str, Any]]], source: Source,
                  text_share: float) -> Finding:
    """probe.novel_*: novel against predictable at each context, over requests (module doc)."""
    cmp = {p["context_tokens"]: compare_requests(_values(p), _values(n)) for p, n in pairs}
    evidence = [f"{_k(ctx)}: novel / predictable {_interval(c)}" + (" (a tie)" if c.verdict == "tie" else "")
                for ctx, c in cmp.items()]
    evidence.append(f"commit lengths: tokens per verify step, each request's own ({source}); medians over requests")
    enough = {ctx: c for ctx, c in cmp.items() if c.enough}
    if not enough:
        return _not_enough("probe.novel_not_enough", "Novel against predictable text: not enough requests",
                           "novel prose with predictable text at any context", evidence, source)
    numbers = {"novel_over_predictable_by_context": {ctx: c.ratio for ctx, c in enough.items()},
               "interval_by_context": {ctx: [c.lo, c.hi] for ctx, c in enough.items()},
               "requests_by_context": {ctx: [c.n_a, c.n_b] for ctx, c in enough.items()}, "text_share": text_share}
    few = [ctx for ctx in cmp if ctx not in enough]
    if few:
        evidence.append(f"not enough requests at {', '.join(_k(c) for c in few)}: left out of the verdict")
    if all(float(c.hi) <= text_share for c in enough.values()):  # type: ignore[arg-type]
        return Finding(
            "probe.novel_is_text_difficulty", "Novel prose commits far less than predictable text",
            f"At every compared context the novel-prose commit length is at most {text_share:.0%} of the predictable "
            f"one, the whole interval over requests included (at most {max(float(c.hi) for c in enough.values()):.2f}x): "  # type: ignore[arg-type]
            "the gap is text difficulty (the drafter cannot guess new prose), which no long-context fix will close.",
            "info", tuple(evidence), numbers, source)
    if all(float(c.lo) > text_share for c in enough.values()):  # type: ignore[arg-type]
        return Finding(
            "probe.novel_close_to_predictable", "Novel prose commits nearly as much as predictable text",
            "The novel prompt is not much harder for the drafter than the repeated sentence (novel / predictable above "
            f"{text_share} over the whole interval at every compared context): the generated text may be copying or "
            "looping, so novel prose does not show the drafter's real acceptance here.",
            "warning", tuple(evidence), numbers, source)
    return Finding(
        "probe.novel_undecided", "Novel against predictable text: not settled by these requests",
        f"The interval of novel / predictable straddles {text_share} at some context, or the contexts disagree: more "
        "requests (the repeats parameter) before reading the gap as the text's difficulty or as copying.", "info",
        tuple(evidence), numbers, source)


def no_commit_finding(summary: Sequence[Mapping[str, Any]], max_commit_length: int | None, source: Source = "measured",
                      no_commit_drafts: float = 0.1) -> Finding | None:
    """``probe.drafter_does_not_commit``: at every (kind, context) the drafter's drafts were almost never accepted (at
    most ``no_commit_drafts`` accepted drafts per verify step), on predictable text as on novel prose. None otherwise."""
    if not summary or any(s["commit_length"] > 1 + no_commit_drafts for s in summary):
        return None
    kinds = sorted({str(s["kind"]) for s in summary}, key=lambda k: KINDS.index(k) if k in KINDS else 9)
    text = "; ".join(f"{k} " + ", ".join(f"{_k(s['context_tokens'])}: {s['commit_length']:.2f}"
                                           for s in summary if s["kind"] == k) for k in kinds)
    maxc = f" of at most {max_commit_length}" if max_commit_length else ""
    return Finding(
        "probe.drafter_does_not_commit", "The drafter does not commit on either text",
        f"Every verify step committed about 1 token{maxc} on {' and '.join(kinds)} text at every context: the target "
        f"rejected nearly all the drafts, however predictable the text. This drafter does not commit, so the probe shows"
        f" neither a long-context bug nor the text's difficulty; run it with a "
        f"trained drafter to ask that.", "warning",
        (f"Commit length per kind and context (tokens per verify step{maxc}, {source}): {text}.",
         f"At most {no_commit_drafts:g} accepted drafts per verify step everywhere counts as not committing."),
        {"commit_length_max": max(s["commit_length"] for s in summary), "no_commit_drafts": no_commit_drafts,
         "max_commit_length": max_commit_length}, source)


def _prefill_findings(summary: Sequence[Mapping[str, Any]], source: Source, prefill_share_note: float) -> list[Finding]:
    """``probe.prefill_dominates``: the predictable requests' prefill share of the wall time at the longest context."""
    found: list[Finding] = []
    pred = sorted((s for s in summary if s["kind"] == "predictable"), key=lambda s: s["context_tokens"])
    shares = [s for s in pred if s.get("prefill_share") is not None]
    if shares:
        top = max(shares, key=lambda s: s["context_tokens"])
        if top["prefill_share"] >= prefill_share_note:
            found.append(Finding(
                "probe.prefill_dominates", "Prefill dominates the wall time at the longest context",
                "Wall time at long context is mostly prefill, not decode: compare decode speed, not wall time, "
                "across contexts.", "info",
                (f"At {_k(top['context_tokens'])} tokens, prefill took {top['prefill_s']:.2f} s of "
                 f"{top['wall_s']:.2f} s wall time ({top['prefill_share']:.0%}; {source}).",),
                {"context_tokens": top["context_tokens"], "prefill_share": top["prefill_share"]}, source))
    return found


def step_histograms(rows: Sequence[Mapping[str, Any]], steps: Sequence[Mapping[str, Any]],
                    max_commit_length: int | None) -> dict[tuple[str, int], list[int]]:
    """Verify steps per commit length for each (kind, context): from the per-step rows when there are
    any for that request, else from the row's ``commit_histogram`` (SGLang's correct-drafts histogram)."""
    out: dict[tuple[str, int], list[int]] = {}
    by_req: dict[tuple[Any, ...], list[int]] = {}
    for s in steps:
        by_req.setdefault((s.get("context_tokens"), s.get("kind"), s.get("seed"), s.get("ts_unix_s")), []).append(
            int(s["commit_length"]))
    for r in rows:
        if r.get("error"):
            continue
        key = (str(r.get("kind") or "predictable"), int(r["context_tokens"]))
        commits = by_req.get((r.get("context_tokens"), r.get("kind"), r.get("seed"), r.get("ts_unix_s")))
        if commits:
            hist = commit_histogram(commits, max(max(commits), max_commit_length or 0))
        elif r.get("commit_histogram"):
            hist = [int(v) for v in r["commit_histogram"]]
        else:
            continue
        acc = out.setdefault(key, [])
        if len(acc) < len(hist):
            acc.extend([0] * (len(hist) - len(acc)))
        for i, v in enumerate(hist):
            acc[i] += v
    return out


def max_commit_from(rows: Sequence[Mapping[str, Any]], run_meta: Mapping[str, Any]) -> int | None:
    """The maximum commit length of a recorded run: its rows' ``max_commit_length`` (or
    ``num_draft_tokens``), else the first ``speculative_num_draft_tokens`` found in run.json."""
    for r in rows:
        for key in ("max_commit_length", "num_draft_tokens"):
            if isinstance(r.get(key), int) and r[key] > 0:
                return int(r[key])

    def find(obj: Any) -> int | None:
        if isinstance(obj, Mapping):
            v = obj.get("speculative_num_draft_tokens")
            if isinstance(v, int) and v > 0:
                return v
            for x in obj.values():
                got = find(x)
                if got:
                    return got
        elif isinstance(obj, list):
            for x in obj:
                got = find(x)
                if got:
                    return got
        return None

    return find(dict(run_meta))
