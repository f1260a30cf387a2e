"""09's one answer: which arm to run, weighing the first token against decode by output length (pure).

A request of N output tokens at a context takes the arm's TTFT plus N over its decode rate (tokens/s). Per context,
over the arms that have both there (an own TTFT and decode requests; check arms, which time their check, left out):

- **the first-token arm**: the shortest median TTFT, or, among the arms whose TTFT ties with it (over prefills, the
  server as a unit: :func:`specdiag.spread.compare_across`; with fewer than 3 prefills a side, within
  :data:`~.verdicts.TTFT_TIE_X`), the one that decodes fastest;
- **the decode arm**: the highest median decode rate, or, among the arms whose rate ties with it, the one with the
  shortest TTFT.

Where they are one arm, the answer is "run X". Where they differ, X finishes sooner below the output length where the
two lines meet and Y above: N = (TTFT_Y - TTFT_X) / (1 / rate_X - 1 / rate_Y) tokens (computed from the medians),
with its range over the requests (the fewest tokens: least extra TTFT over the most time saved per token; the most:
the other way round; "never" where some pair saves nothing), a range, not an interval of stated level. The TTFT side is
judged over prefills where each arm has 3 or more; with fewer, "not enough prefills", and N has no range on that
side.

**Decode rate** per request: the decode tokens over the decode window (``decode_tok_s``, measured); for an NGRAM arm
whose later requests on a prompt recalled the first's answer (:func:`.breakeven.recalled`), the first requests' commit
x 1000 over each request's ms per verify step (computed), as the break-even does. Where two or more NGRAM arms meet at
a context, each request's rate is the NGRAM arms' pooled median commit there x 1000 over its own ms per verify step
(computed): NGRAM drafts from the text, so its commit is the prompts', not the attention backend's, and 3 requests'
commits (1.15 to 7.5 tokens a step on the H200's NGRAM run) would otherwise drown the backends' step times in the
text's noise. Where the arm's server ran with acceptance forced (``SGLANG_SIMULATE_ACC_LEN``), every rate and every N
computed from it says "acceptance forced".

The answer at the longest context that has one leads (long context is the question), and the page says at which other
contexts it holds.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import asdict, dataclass, field
from typing import Any, Mapping, Sequence

import pandas as pd

from specdiag.findings import Finding
from specdiag.spread import Sample, Spread, compare_across, machine_of, server_of
from specdiag.stats import MIN_REQUESTS, NOT_ENOUGH, RequestComparison
from specdiag.steps.engine_ab.analysis import _f, step_spreads, tok, ttft_spreads, units
from specdiag.steps.engine_ab.arms import algorithm_of, checks_verify, forced_acceptance
from specdiag.steps.engine_ab.verdicts import TTFT_TIE_X


@dataclass(frozen=True)
class Phases:
    """One arm at one context: its TTFTs and decode rates per request, with where each came from."""

    arm: str
    ttft: list[Sample]
    rate: list[Sample]                 #: tokens/s per decode request
    rate_source: str                   #: "measured" or "computed at the first request's commit"
    forced: float | None = None        #: the acceptance length its server was told to simulate

    @property
    def ttft_s(self) -> float:
        return statistics.median(s.value for s in self.ttft)

    @property
    def tok_s(self) -> float:
        return statistics.median(s.value for s in self.rate)


@dataclass(frozen=True)
class ContextAnswer:
    """The answer at one context (module doc)."""

    context_tokens: int
    kind: str                              #: "one" (run first), "split" (first below tokens, decode above), "tie"
    first: str                             #: the first-token arm
    decode: str                            #: the decode arm (== first for "one")
    ttft_s: dict[str, float]               #: median TTFT of the two arms (s, measured)
    tok_s: dict[str, float]                #: median decode rate of the two arms (tokens/s)
    ttft_verdict: str                      #: the decode arm's TTFT against the first-token arm's: higher/tie/...
    ttft_text: str                         #: that comparison in words (ratio, interval, prefills, rule)
    rate_verdict: str                      #: the decode arm's rate against the first-token arm's
    rate_text: str
    tokens: float | None = None            #: where the two finish together (split only; computed)
    tokens_range: tuple[float, float] | None = None  #: its range over the requests (None: not enough prefills)
    forced: dict[str, float] = field(default_factory=dict)  #: arm -> forced acceptance length
    rate_source: dict[str, str] = field(default_factory=dict)
    others: list[str] = field(default_factory=list)  #: the other arms weighed
    text: str = ""

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["tokens_range"] = list(self.tokens_range) if self.tokens_range else None
        return d


def _rates(rows: Sequence[Mapping[str, Any]], first_commit: float | None) -> tuple[list[Sample], str]:
    out = []
    for r in rows:
        step = _f(r.get("step_ms"))
        if first_commit is not None:
            x = first_commit * 1000.0 / step if step else None
        else:
            x = _f(r.get("decode_tok_s"))
            if x is None and step and _f(r.get("commit_length")) is not None:
                x = float(r["commit_length"]) * 1000.0 / step
        if x is not None and x > 0:
            out.append(Sample(x, server_of(r), machine_of(r)))
    return out, ("computed at the first request's commit" if first_commit is not None else "measured")


def phases(df: pd.DataFrame, pre: pd.DataFrame, arms_meta: Mapping[str, Any],
           recall: Mapping[str, Mapping[int, tuple[float, float]]] | None = None) -> dict[int, list[Phases]]:
    """Per context, each arm with an own TTFT and decode requests there (module doc), from :func:`.analysis.frame`'s
    rows and :func:`.analysis.prefill_table`."""
    recall = recall or {}
    out: dict[int, list[Phases]] = {}
    if df.empty or pre.empty:
        return out
    dec = df[(df["phase"] == "decode") & df["error"].isna() & df["step_ms"].notna()]
    pooled = pooled_ngram_commit(dec, arms_meta)
    for (arm, ctx), g in dec.groupby(["arm", "context_tokens"], sort=False):
        rec = dict(arms_meta.get(arm) or {})
        if checks_verify(rec):
            continue
        p = pre[(pre["arm"] == arm) & (pre["context_tokens"] == ctx) & pre["own"]]
        if p.empty:
            continue
        first = (recall.get(str(arm)) or {}).get(int(ctx))
        if first:
            rate, source = _rates(g.to_dict("records"), first[0])
        elif algorithm_of(rec) == "NGRAM" and int(ctx) in pooled:
            rate, _ = _rates(g.to_dict("records"), pooled[int(ctx)])
            source = f"computed at the NGRAM arms' pooled median commit, {pooled[int(ctx)]:.3g} tokens a step"
        else:
            rate, source = _rates(g.to_dict("records"), None)
        if not rate:
            continue
        out.setdefault(int(ctx), []).append(Phases(str(arm), units(pre, str(arm), int(ctx), "ttft_units"), rate,
                                                   source, forced_acceptance(rec)))
    return out


def pooled_ngram_commit(dec: pd.DataFrame, arms_meta: Mapping[str, Any]) -> dict[int, float]:
    """Per context where two or more NGRAM arms (check arms left out) have decode requests: the median commit length
    over all their requests there (module doc)."""
    ngram = {a for a, rec in arms_meta.items()
             if algorithm_of(dict(rec or {})) == "NGRAM" and not checks_verify(dict(rec or {}))}
    out = {}
    if dec.empty or "commit_length" not in dec:
        return out
    rows = dec[dec["arm"].isin(ngram) & dec["commit_length"].notna()]
    for ctx, g in rows.groupby("context_tokens"):
        if g["arm"].nunique() >= 2:
            out[int(ctx)] = float(g["commit_length"].median())
    return out


def _ties(best: Phases, others: Sequence[Phases], side: str, spread: Spread | None) -> list[Phases]:
    """The arms (``best`` first) whose ``side`` ("ttft" or "rate") ties with ``best``'s over requests; for TTFTs with
    fewer than 3 prefills a side, within :data:`.verdicts.TTFT_TIE_X`."""
    out = [best]
    for o in others:
        if o.arm == best.arm:
            continue
        a, b = getattr(best, side), getattr(o, side)
        c = compare_across(a, b, spread)
        if c.verdict == NOT_ENOUGH and side == "ttft":
            hi, lo = max(best.ttft_s, o.ttft_s), min(best.ttft_s, o.ttft_s)
            if hi <= TTFT_TIE_X * lo:
                out.append(o)
        elif c.verdict in ("tie", NOT_ENOUGH):
            out.append(o)
    return out


def _tied(c: RequestComparison, a: Phases, b: Phases) -> bool:
    """Whether two arms' TTFTs tie as :func:`_ties` judges them (within TTFT_TIE_X under 3 prefills a side)."""
    if c.verdict == NOT_ENOUGH:
        return max(a.ttft_s, b.ttft_s) <= TTFT_TIE_X * min(a.ttft_s, b.ttft_s)
    return c.verdict == "tie"


def _said(c: RequestComparison, what: str, unit_word: str) -> str:
    if c.verdict == NOT_ENOUGH:
        return (f"{c.ratio:.3g}x, not enough {unit_word} ({c.n_a} / {c.n_b}; {MIN_REQUESTS} a side judge it)"
                if c.ratio is not None else f"not enough {unit_word}")
    word = {"higher": f"{what} higher", "lower": f"{what} lower", "tie": "a tie"}[c.verdict]
    return f"{c.ratio:.3g}x ({c.named_interval()}, {c.n_a} / {c.n_b} {unit_word}; {c.rule}): {word}"


def tokens_range(first: Phases, decode: Phases) -> tuple[float, float]:
    """The output lengths where ``decode`` catches up with ``first``, over the requests: from the fewest (least extra
    TTFT over the most time saved per token) to the most (inf where some pair of requests saves nothing)."""
    extra_lo = max(min(s.value for s in decode.ttft) - max(s.value for s in first.ttft), 0.0)
    extra_hi = max(s.value for s in decode.ttft) - min(s.value for s in first.ttft)
    saved_hi = 1.0 / min(s.value for s in first.rate) - 1.0 / max(s.value for s in decode.rate)
    saved_lo = 1.0 / max(s.value for s in first.rate) - 1.0 / min(s.value for s in decode.rate)
    lo = extra_lo / saved_hi if saved_hi > 0 else math.inf
    hi = extra_hi / saved_lo if saved_lo > 0 else math.inf
    return lo, hi


def _forced_text(arms: Sequence[Phases]) -> str:
    forced = {p.arm: p.forced for p in arms if p.forced}
    return (f"; acceptance forced ({', '.join(f'{a} to {x:g}' for a, x in forced.items())} by SGLANG_SIMULATE_ACC_LEN):"
            " decode rates and output lengths computed from the forced commit" if forced else "")


def answer_at(ctx: int, arms: Sequence[Phases], ttft_spread: Spread | None = None,
              step_spread: Spread | None = None) -> ContextAnswer | None:
    """The answer at one context (module doc); None with fewer than two arms."""
    if len(arms) < 2:
        return None
    by_ttft = sorted(arms, key=lambda p: p.ttft_s)
    first = max(_ties(by_ttft[0], by_ttft, "ttft", ttft_spread), key=lambda p: (p.tok_s, -p.ttft_s))
    by_rate = sorted(arms, key=lambda p: -p.tok_s)
    decode = min(_ties(by_rate[0], by_rate, "rate", step_spread), key=lambda p: (p.ttft_s, -p.tok_s))
    pair = [first] if first.arm == decode.arm else [first, decode]
    if first.arm == decode.arm:  # against the runner-up of each phase
        other_t = next((p for p in by_ttft if p.arm != first.arm), None)
        other_r = next((p for p in by_rate if p.arm != first.arm), None)
    else:  # the two against each other
        other_t = other_r = decode
    ct = compare_across(first.ttft, other_t.ttft, ttft_spread) if other_t else None
    cr = compare_across(first.rate, other_r.rate, step_spread) if other_r else None
    ttft_text = (f"{other_t.arm}'s TTFT over {first.arm}'s: " + _said(ct, "TTFT", "prefills")) if ct and other_t else ""
    rate_text = (f"{other_r.arm}'s decode tokens/s over {first.arm}'s: " + _said(cr, "rate", "requests")
                 if cr and other_r else "")
    common = dict(ttft_s={p.arm: p.ttft_s for p in pair}, tok_s={p.arm: p.tok_s for p in pair},
                  ttft_verdict=ct.verdict if ct else "", ttft_text=ttft_text, rate_verdict=cr.verdict if cr else "",
                  rate_text=rate_text, forced={p.arm: p.forced for p in arms if p.forced},  # type: ignore[misc]
                  rate_source={p.arm: p.rate_source for p in pair},
                  others=[p.arm for p in arms if p.arm not in {first.arm, decode.arm}])
    at = tok(ctx)
    forced = _forced_text(pair)
    if first.arm == decode.arm:
        text = (f"run {first.arm} at {at}: the first token after {first.ttft_s:,.3g} s and {first.tok_s:,.4g} decode "
                f"tokens/s ({first.rate_source}); no arm beats it in either phase ({ttft_text}; {rate_text}){forced}")
        return ContextAnswer(ctx, "one", first.arm, first.arm, text=text, **common)  # type: ignore[arg-type]
    if ct is not None and cr is not None and _tied(ct, first, decode) and cr.verdict in ("tie", NOT_ENOUGH):
        # each picked by the other's tie-break: neither is measurably faster in either phase
        text = (f"at {at}, {first.arm} and {decode.arm} tie in both phases: the first token after "
                f"{first.ttft_s:,.3g} s "
                f"against {decode.ttft_s:,.3g} s, {first.tok_s:,.4g} decode tokens/s against {decode.tok_s:,.4g} "
                f"({ttft_text}; {rate_text}){forced}")
        return ContextAnswer(ctx, "tie", first.arm, decode.arm, text=text, **common)  # type: ignore[arg-type]
    n = (decode.ttft_s - first.ttft_s) / (1.0 / first.tok_s - 1.0 / decode.tok_s)
    enough = min(len(first.ttft), len(decode.ttft)) >= MIN_REQUESTS
    rng = tokens_range(first, decode) if enough else None
    span = ((f"range {rng[0]:,.0f}-" + ("never" if math.isinf(rng[1]) else f"{rng[1]:,.0f}")
             + " tokens over the requests") if rng else
            f"no range: not enough prefills ({len(first.ttft)} / {len(decode.ttft)}; {MIN_REQUESTS} a side give one)")
    text = (f"at {at}, run {first.arm} for outputs under about {n:,.0f} tokens and {decode.arm} above ({span}): "
            f"{first.arm}'s first token comes after {first.ttft_s:,.3g} s against {decode.ttft_s:,.3g} s, "
            f"{decode.arm} decodes {decode.tok_s:,.4g} tokens/s against {first.tok_s:,.4g} ({ttft_text}; {rate_text})"
            f"{forced}")
    return ContextAnswer(ctx, "split", first.arm, decode.arm, tokens=n, tokens_range=rng, text=text,
                         **common)  # type: ignore[arg-type]


def answers(df: pd.DataFrame, dec: pd.DataFrame, pre: pd.DataFrame, arms_meta: Mapping[str, Any],
            recall: Mapping[str, Mapping[int, tuple[float, float]]] | None = None) -> list[ContextAnswer]:
    """The answer at every context with two or more arms to weigh, shortest first."""
    by_ctx = phases(df, pre, arms_meta, recall)
    steps, ttfts = step_spreads(dec), ttft_spreads(pre)
    out = [answer_at(c, arms, ttfts.get(c), steps.get(c)) for c, arms in sorted(by_ctx.items())]
    return [a for a in out if a is not None]


def headline(found: Sequence[ContextAnswer]) -> str:
    """The answer in one sentence: the longest context's, and the other contexts where the same holds."""
    if not found:
        return ""
    last = found[-1]
    same = [a for a in found[:-1] if (a.kind, a.first, a.decode) == (last.kind, last.first, last.decode)]
    at = f"at {tok(last.context_tokens)}"
    if last.kind == "one":
        head = f"Run {last.first} {at}"
    elif last.kind == "tie":
        head = f"{at[0].upper()}{at[1:]}, {last.first} and {last.decode} tie in both phases: either"
    else:
        rng = last.tokens_range
        span = (f"range {rng[0]:,.0f}-" + ("never" if math.isinf(rng[1]) else f"{rng[1]:,.0f}") + " over the requests"
                if rng else "no range: not enough prefills")
        head = (f"{at[0].upper()}{at[1:]}, run {last.first} for outputs under about {last.tokens:,.0f} tokens "
                f"({span}), {last.decode} above")
    return (head + (" (acceptance forced)" if last.forced else "")
            + (f"; the same at {', '.join(tok(a.context_tokens) for a in same)}" if same else ""))


def answer_finding(found: Sequence[ContextAnswer]) -> Finding:
    """``engine_ab.answer``: the one thing 09 says to run (07's diagnosis and the index read ``numbers['answer']``)."""
    if not found:
        return Finding("engine_ab.answer", "Which arm to run: not answered here",
                       "No context has two arms with both an own TTFT and decode requests, so the first token and "
                       "decode cannot be weighed.", "info", ("see 'What this run does not hold'",),
                       {"answer": "", "by_context": []}, "computed")
    last = found[-1]
    head = headline(found)
    ev = [f"{tok(a.context_tokens)}: {a.text}" for a in found]
    differ = [a for a in found[:-1] if (a.kind, a.first, a.decode) != (last.kind, last.first, last.decode)]
    elsewhere = "".join(f" At {tok(a.context_tokens)}: " + (f"run {a.first}" if a.kind == "one" else
                                                              f"{a.first} and {a.decode} tie" if a.kind == "tie" else
                                                              f"run {a.first} for outputs under about "
                                                              f"{a.tokens:,.0f} tokens, {a.decode} above") + "."
                        for a in differ)
    ev.append("a request of N output tokens takes TTFT + N / decode tokens/s (computed from measured TTFTs and "
              "decode windows); ties judged over requests with the server as a unit")
    return Finding("engine_ab.answer", head, last.text[0].upper() + last.text[1:] + "." + elsewhere, "ok", ev,
                   {"answer": head, "context_tokens": last.context_tokens, "kind": last.kind, "run": last.first,
                    "above": last.decode if last.kind == "split" else None, "tokens": last.tokens,
                    "tokens_range": list(last.tokens_range) if last.tokens_range else None,
                    "forced_acceptance": dict(last.forced) or None,
                    "by_context": [a.as_dict() for a in found]}, "computed")
