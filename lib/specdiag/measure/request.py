"""One measured request, the same way in every measuring step (01 sweep, 02 utilization, 03 drafter timing,
04 commit probe):

1. stamp the send time (``time.time()``, the clock telemetry rows use) before anything is sent for it;
2. make the prompt fresh: reset the prefix cache, or where the server offers no reset, give the prompt a
   unique head (:func:`specdiag.measure.fresh_prompt.fresh_prompt`);
3. build the prompt of exactly ``n_tokens`` ids with the server's tokenizer, special tokens added as the
   server adds them to text prompts (:data:`ADD_SPECIAL_TOKENS`, the one setting for every step);
4. stream it greedily (``temperature 0``, ``ignore_eos`` so it decodes exactly ``max_new_tokens``);
5. catch the server's error: a failure becomes the result's ``error`` (the row keeps it), never an exception.

The result's ``t_send_unix_s`` is the trace's own send stamp when a trace came back (taken by the client just
before the HTTP request), else the stamp of step 1. Server clients are imported inside the functions.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from specdiag.measure.fresh_prompt import fresh_prompt, reset_note
from specdiag.prompts import Prompt, build_prompt
from specdiag.serving.errors import ServerError

#: Every measured prompt is tokenized with the tokenizer's special tokens (a BOS where the model has one),
#: as the server itself tokenizes a text prompt, so ``context_tokens`` counts what a text request would send.
ADD_SPECIAL_TOKENS = True


@dataclass(frozen=True)
class MeasuredRequest:
    """One request's outcome.

    t_send_unix_s: when it was sent (s, Unix time): the trace's stamp, else the one taken before the attempt
    trace:         the client's RequestTrace, None when nothing could be sent or the prompt failed
    error:         None when fine; ``prompt: ...`` when the prompt could not be made; else the server's error
    cache_flushed: True the prefix cache was reset, False refused or no reset offered, None not asked
    prompt:        the prompt sent (None when it could not be made)
    cache_note:    why there was no reset (the client's ``reset_note``: its key, no dev mode, requests running)
    """

    t_send_unix_s: float
    trace: Any | None
    error: str | None
    cache_flushed: bool | None = None
    prompt: Prompt | None = None
    cache_note: str | None = None


def greedy(max_new_tokens: int, ignore_eos: bool = True, **extra: Any) -> dict[str, Any]:
    """The sampling parameters of every measured request (SGLang's names; the vLLM client maps them)."""
    return {"max_new_tokens": int(max_new_tokens), "temperature": 0.0, "ignore_eos": bool(ignore_eos), **extra}


def exact_prompt(client: Any, n_tokens: int, kind: str, seed: int, instruction: str = "") -> Prompt:
    """A prompt of exactly ``n_tokens`` ids, tokenized as every measured prompt is (no cache reset)."""
    return build_prompt(lambda text: client.tokenize(text, add_special_tokens=ADD_SPECIAL_TOKENS), n_tokens, kind,
                        seed=seed, instruction=instruction)  # type: ignore[arg-type]


def send(client: Any, input_ids: Sequence[int], max_new_tokens: int, ignore_eos: bool = True,
         sampling_params: Mapping[str, Any] | None = None, cache_flushed: bool | None = None,
         prompt: Prompt | None = None, t_stamp: float | None = None) -> MeasuredRequest:
    """Stream ``input_ids`` greedily; a ServerError (nothing could be sent) becomes the result's error.
    ``t_stamp``: a send stamp taken earlier (before a cache reset); default now, before the request."""
    t0 = time.time() if t_stamp is None else t_stamp
    params = {**greedy(max_new_tokens, ignore_eos), **dict(sampling_params or {})}
    try:
        trace = client.generate(input_ids=list(input_ids), sampling_params=params, stream=True)
    except ServerError as exc:
        return MeasuredRequest(t0, None, str(exc), cache_flushed, prompt)
    t_send = getattr(trace, "t_send_unix_s", None)
    return MeasuredRequest(float(t_send) if t_send is not None else t0, trace, None, cache_flushed, prompt)


def measured_request(client: Any, n_tokens: int, kind: str, seed: int, max_new_tokens: int, reset: bool = True,
                     instruction: str = "", ignore_eos: bool = True) -> MeasuredRequest:
    """The recipe above for one request of ``n_tokens`` prompt tokens (``kind``: novel or predictable)."""
    t0 = time.time()
    flushed: bool | None = None
    try:
        prompt, flushed = fresh_prompt(client, int(n_tokens), kind, int(seed), instruction=instruction, reset=reset,
                                       add_special_tokens=ADD_SPECIAL_TOKENS)
    except (ServerError, ValueError, OSError) as exc:
        return MeasuredRequest(t0, None, f"prompt: {exc}", flushed, None, reset_note(client, flushed))
    done = send(client, prompt.input_ids, max_new_tokens, ignore_eos, cache_flushed=flushed, prompt=prompt, t_stamp=t0)
    note = reset_note(client, flushed)
    return MeasuredRequest(done.t_send_unix_s, done.trace, done.error, flushed, prompt, note) if note else done
