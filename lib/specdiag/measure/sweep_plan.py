"""A sweep's plan and its measured request: one streamed request per (context, repeat), one ``sweep`` row each.
01 measures its sweep with them; 05 measures a small one the same way on a live run without 01's rows (the table read
back: :mod:`specdiag.measure.sweep_table`).

Each request is the one measured-request recipe (:mod:`specdiag.measure.request`): the send time stamped
first, the prefix cache reset (so no context is served from an earlier, longer prompt; where the server offers
no reset, the prompt's head is made unique instead), a prompt of exactly ``context_tokens`` ids built with the
server's tokenizer, streamed greedily; the trace becomes a ``sweep`` row (:func:`specdiag.measure.metrics.sweep_row`). A request that fails yields a row with its error; nothing here
raises for a server-side failure, so a sweep keeps every row it measured.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable

from specdiag.measure.metrics import error_row, sweep_row
from specdiag.measure.request import measured_request
from specdiag.measure.sweep_table import SWEEP_KEY
from specdiag.nb import check, check_context_lengths
from specdiag.prompts import NOVEL_PROSE_PATH

@dataclass(frozen=True)
class SweepPlan:
    """What one sweep measures.

    context_lengths: prompt lengths, tokens (ascending order is kept as given)
    max_new_tokens:  tokens to generate per request (ignore_eos keeps the length fixed)
    repeats:         requests per context; repeat r uses prompt seed ``seed + r``
    prompt_kind:     ``novel`` (held-out prose) or ``predictable`` (the cat sentence repeated)
    seed:            seed of the first repeat's prompt
    flush_cache:     POST /flush_cache before each request
    instruction:     text put before novel prose ('' = none)
    ignore_eos:      generate exactly max_new_tokens even past an end-of-sequence token
    """

    context_lengths: tuple[int, ...]
    max_new_tokens: int = 64
    repeats: int = 1
    prompt_kind: str = "novel"
    seed: int = 0
    flush_cache: bool = True
    instruction: str = ""
    ignore_eos: bool = True

    def requests(self) -> list[dict[str, Any]]:
        """Every request of the plan as its key fields (:data:`SWEEP_KEY`)."""
        return [{"context_tokens": c, "repeat": r, "prompt_kind": self.prompt_kind, "seed": self.seed + r,
                 "max_new_tokens": self.max_new_tokens}
                for c in self.context_lengths for r in range(self.repeats)]

    def pending(self, done: Iterable[tuple[Any, ...]]) -> list[dict[str, Any]]:
        """The requests whose key is not in ``done`` (``Run.done_keys("sweep", SWEEP_KEY)``)."""
        done = set(done)
        return [q for q in self.requests() if tuple(q[k] for k in SWEEP_KEY) not in done]


def make_plan(context_lengths: Any, max_new_tokens: Any, repeats: Any, prompt_kind: Any, seed: Any,
              flush_cache: Any, instruction: Any = "", ignore_eos: Any = True,
              server_context_length: int | None = None) -> SweepPlan:
    """Check the sweep's parameters (a :class:`specdiag.nb.ParameterError` naming the parameter and the
    fix) and return the plan. ``server_context_length`` (server_info's context_length) bounds
    context + max_new_tokens."""
    check(isinstance(max_new_tokens, int) and not isinstance(max_new_tokens, bool) and max_new_tokens >= 2,
          f"max_new_tokens must be a whole number >= 2 (a decode rate needs two chunks); got {max_new_tokens!r}")
    limit = server_context_length - max_new_tokens if server_context_length else None
    if limit is not None:
        check(limit >= 1, f"max_new_tokens={max_new_tokens} leaves no room for a prompt in the server's "
                          f"context_length of {server_context_length} tokens: lower it")
    contexts = check_context_lengths("context_lengths", context_lengths)
    for c in contexts:
        check(limit is None or c <= limit,
              f"context_lengths has {c} tokens, but with max_new_tokens={max_new_tokens} the server's "
              f"context_length of {server_context_length} allows prompts up to {limit}: drop it, lower "
              f"max_new_tokens, or use a server with a longer context")
    check(isinstance(repeats, int) and not isinstance(repeats, bool) and repeats >= 1,
          f"repeats must be a whole number >= 1; got {repeats!r}")
    check(prompt_kind in ("novel", "predictable"),
          f"prompt_kind must be 'novel' or 'predictable'; got {prompt_kind!r}")
    check(isinstance(seed, int) and not isinstance(seed, bool), f"seed must be a whole number; got {seed!r}")
    check(isinstance(flush_cache, bool), f"flush_cache must be True or False; got {flush_cache!r}")
    check(isinstance(ignore_eos, bool), f"ignore_eos must be True or False; got {ignore_eos!r}")
    check(isinstance(instruction, str), f"instruction must be a string ('' for none); got {instruction!r}")
    check(prompt_kind != "novel" or NOVEL_PROSE_PATH.exists(),
          f"prompt_kind='novel' needs the held-out prose {NOVEL_PROSE_PATH}, which is missing: restore it "
          f"(git checkout data/prompts) or use prompt_kind='predictable'")
    return SweepPlan(tuple(contexts), max_new_tokens, repeats, prompt_kind, seed, flush_cache, instruction,
                     ignore_eos)


def measure_request(client: Any, request: dict[str, Any], plan: SweepPlan) -> dict[str, Any]:
    """One measured request (:func:`specdiag.measure.request.measured_request`: stamp, fresh prompt of exactly
    ``context_tokens`` ids, stream, server errors caught) as its ``sweep`` row (error rows included).

    ``client`` is a :class:`specdiag.serving.ServingClient`; ``request`` one of ``plan.requests()``.
    """
    labels = {k: request[k] for k in ("repeat", "prompt_kind", "seed", "max_new_tokens")}
    ctx = int(request["context_tokens"])
    done = measured_request(client, ctx, plan.prompt_kind, int(request["seed"]), plan.max_new_tokens,
                            reset=plan.flush_cache, ignore_eos=plan.ignore_eos,
                            instruction=plan.instruction if plan.prompt_kind == "novel" else "")
    if done.cache_note:
        labels["cache_note"] = done.cache_note
    if done.trace is None:
        return error_row(ctx, str(done.error), done.t_send_unix_s, **labels, cache_flushed=done.cache_flushed)
    return sweep_row(done.trace, ctx, **labels, cache_flushed=done.cache_flushed)
