"""SGLang's /generate contract as the embedded server implements it: request checks and meta_info.

Pure functions, no I/O. Names and shapes follow SGLang 0.5.x (``srt/managers/io_struct.py``,
``sglang/api/v1/api_types.py``, ``TokenizerManager._handle_batch_output`` and
``fill_spec_decoding_meta``); a real SGLang 0.5.17's replies are recorded in tests/data/sglang-0.5.17/.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

#: Every key SGLang's SamplingParams contract admits; any other key is rejected with HTTP 400.
SGLANG_SAMPLING_KEYS: frozenset[str] = frozenset(
    {
        "max_new_tokens", "stop", "stop_token_ids", "stop_regex", "temperature", "top_p", "top_k",
        "min_p", "frequency_penalty", "presence_penalty", "repetition_penalty", "min_new_tokens", "n",
        "json_schema", "regex", "ebnf", "structural_tag", "ignore_eos", "skip_special_tokens",
        "spaces_between_special_tokens", "no_stop_trim", "stream_interval", "logit_bias",
        "sampling_seed", "custom_params", "beam_width", "watermark", "choice",
    }
)
#: SGLang's default max_new_tokens (srt/sampling/sampling_params.py)
DEFAULT_MAX_NEW_TOKENS = 128

#: Admitted keys the embedded server does not implement, with the values that mean "off" (so a
#: client that sends SGLang's defaults is served, and anything else gets a 400 naming the key).
_NEUTRAL: dict[str, tuple[Any, ...]] = {
    "top_p": (None, 1, 1.0),
    "top_k": (None, -1, 0, 1),  # 1 is greedy anyway
    "min_p": (None, 0, 0.0),
    "frequency_penalty": (None, 0, 0.0),
    "presence_penalty": (None, 0, 0.0),
    "repetition_penalty": (None, 1, 1.0),
    "n": (None, 1),
    "stop": (None, "", ()),
    "stop_regex": (None, "", ()),
    "json_schema": (None,),
    "regex": (None,),
    "ebnf": (None,),
    "structural_tag": (None,),
    "logit_bias": (None,),
    "custom_params": (None,),
    "beam_width": (None, 0, 1),
    "watermark": (None, False),
    "choice": (None,),
}


class RequestError(ValueError):
    """A request the server refuses (HTTP 400); the message names the field and the fix."""


def error_body(message: str, code: int = 400) -> dict[str, Any]:
    """SGLang's error JSON: ``{"error": {"message", "type": "invalid_request_error", "code"}}``."""
    return {"error": {"message": message, "type": "invalid_request_error", "code": code}}


@dataclass(frozen=True)
class GenerateParams:
    """The sampling parameters the embedded server implements (greedy decoding)."""

    max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS
    min_new_tokens: int = 0
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    no_stop_trim: bool = False
    stream_interval: int | None = None  # None = the server's --stream-interval


def _int(sp: dict[str, Any], key: str, default: int, minimum: int) -> int:
    value = sp.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise RequestError(f"sampling_params.{key} must be an integer >= {minimum}; got {value!r}")
    return value


def _bool(sp: dict[str, Any], key: str, default: bool) -> bool:
    value = sp.get(key)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise RequestError(f"sampling_params.{key} must be true or false; got {value!r}")
    return value


def parse_sampling_params(sp: Any) -> GenerateParams:
    """Check ``sampling_params`` like SGLang (unknown keys rejected) and keep what greedy decoding uses."""
    if sp is None:
        sp = {}
    if not isinstance(sp, dict):
        raise RequestError(f"sampling_params must be a JSON object; got {type(sp).__name__}")
    unknown = sorted(set(sp) - SGLANG_SAMPLING_KEYS)
    if unknown:
        raise RequestError(
            f"sampling_params: unknown field {', '.join(repr(k) for k in unknown)}; "
            f"allowed fields: {', '.join(sorted(SGLANG_SAMPLING_KEYS))}"
        )
    temperature = sp.get("temperature")
    if temperature is not None:
        if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) or temperature < 0:
            raise RequestError(f"sampling_params.temperature must be a number >= 0; got {temperature!r}")
        if temperature > 0:
            raise RequestError(
                f"sampling_params.temperature={temperature}: the embedded server decodes greedily only "
                "(lossless greedy speculative decoding); send temperature 0"
            )
    for key, neutral in _NEUTRAL.items():
        value = sp.get(key)
        if isinstance(value, list):
            value = tuple(value)
        if value not in neutral:
            raise RequestError(
                f"sampling_params.{key}={sp[key]!r} is not supported by the embedded server (greedy decoding "
                f"only); leave it out or send {neutral[1] if len(neutral) > 1 else 'null'}"
            )
    stop_ids = sp.get("stop_token_ids") or []
    if not isinstance(stop_ids, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in stop_ids):
        raise RequestError(f"sampling_params.stop_token_ids must be a list of token ids; got {stop_ids!r}")
    seed = sp.get("sampling_seed")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise RequestError(f"sampling_params.sampling_seed must be an integer; got {seed!r}")
    spaces = sp.get("spaces_between_special_tokens")
    if spaces is not None and not isinstance(spaces, bool):
        raise RequestError(f"sampling_params.spaces_between_special_tokens must be true or false; got {spaces!r}")
    interval = sp.get("stream_interval")
    return GenerateParams(
        max_new_tokens=_int(sp, "max_new_tokens", DEFAULT_MAX_NEW_TOKENS, 0),
        min_new_tokens=_int(sp, "min_new_tokens", 0, 0),
        stop_token_ids=tuple(stop_ids),
        ignore_eos=_bool(sp, "ignore_eos", False),
        skip_special_tokens=_bool(sp, "skip_special_tokens", True),
        no_stop_trim=_bool(sp, "no_stop_trim", False),
        stream_interval=None if interval is None else _int(sp, "stream_interval", 1, 1),
    )


@dataclass(frozen=True)
class GenerateInput:
    """A checked /generate body: exactly one of ``text`` / ``input_ids``."""

    text: str | None
    input_ids: list[int] | None
    params: GenerateParams
    stream: bool
    rid: str | None
    return_prompt_token_ids: bool


def parse_generate_body(body: Any) -> GenerateInput:
    """Check a /generate body. Unknown top-level keys are ignored, as SGLang does."""
    if not isinstance(body, dict):
        raise RequestError("the /generate body must be a JSON object with text or input_ids")
    text, input_ids = body.get("text"), body.get("input_ids")
    if (text is None) == (input_ids is None):
        raise RequestError("send exactly one of text or input_ids")
    if body.get("input_embeds") is not None:
        raise RequestError("input_embeds is not supported by the embedded server; send text or input_ids")
    if text is not None and not isinstance(text, str):
        raise RequestError("batch requests (a list of texts) are not supported: send one text per request")
    if input_ids is not None:
        if not isinstance(input_ids, list) or not input_ids:
            raise RequestError("input_ids must be a non-empty list of token ids")
        if isinstance(input_ids[0], list):
            raise RequestError("batch requests (a list of input_ids lists) are not supported: send one per request")
        if not all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in input_ids):
            raise RequestError("input_ids must be a list of non-negative integers")
    for key in ("return_logprob", "return_hidden_states"):
        if body.get(key):
            raise RequestError(f"{key} is not supported by the embedded server; leave it out")
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise RequestError(f"stream must be true or false; got {stream!r}")
    rid = body.get("rid")
    return GenerateInput(
        text=text,
        input_ids=input_ids,
        params=parse_sampling_params(body.get("sampling_params")),
        stream=stream,
        rid=str(rid) if rid is not None else None,
        return_prompt_token_ids=bool(body.get("return_prompt_token_ids", False)),
    )


def check_context(prompt_tokens: int, max_new_tokens: int, context_length: int) -> None:
    """SGLang refuses prompts that do not fit the context; so does the embedded server."""
    if prompt_tokens >= context_length:
        raise RequestError(
            f"The input ({prompt_tokens} tokens) is longer than the model's context length "
            f"({context_length} tokens); shorten the prompt"
        )
    if prompt_tokens + max_new_tokens > context_length:
        raise RequestError(
            f"Requested token count exceeds the model's maximum context length of {context_length} tokens: "
            f"{prompt_tokens} in the prompt + max_new_tokens {max_new_tokens} = {prompt_tokens + max_new_tokens}; "
            "lower max_new_tokens or shorten the prompt"
        )


def spec_meta(
    completion_tokens: int,
    num_draft_tokens: int,
    step_commits: Sequence[int],
    step_correct_drafts: Sequence[int],
    step_draft_ms: Sequence[float],
    step_verify_ms: Sequence[float],
) -> dict[str, Any]:
    """The final meta_info's speculative fields, as SGLang's ``fill_spec_decoding_meta`` computes
    them, plus the specdiag per-step extras. Empty when there was no verify step.

    - ``spec_accept_length`` = completion_tokens / spec_verify_ct (counts the bonus token of each
      step and the first token, which comes from prefill);
    - ``spec_num_proposed_drafts`` = spec_verify_ct * (num_draft_tokens - 1), whatever was
      actually drafted (NGRAM may find fewer); ``spec_accept_rate`` = correct / proposed;
    - ``spec_correct_drafts_histogram[i]`` = steps with i correct drafts (length num_draft_tokens);
    - extras: ``spec_step_commit_lengths`` (tokens each step committed, bonus included),
      ``spec_step_draft_ms``, ``spec_step_verify_ms``.
    """
    verify_ct = len(step_commits)
    if verify_ct == 0:
        return {}
    correct = int(sum(step_correct_drafts))
    proposed = verify_ct * (num_draft_tokens - 1)
    histogram = [0] * num_draft_tokens
    for c in step_correct_drafts:
        histogram[c] += 1
    return {
        "spec_verify_ct": verify_ct,
        "spec_accept_length": completion_tokens / verify_ct,
        "spec_accept_rate": correct / proposed if proposed else 0.0,
        "spec_num_correct_drafts": correct,
        "spec_num_proposed_drafts": proposed,
        "spec_correct_drafts_histogram": histogram,
        # SGLang still sends these backward-compatible aliases
        "spec_accepted_drafts": correct,
        "spec_proposed_drafts": proposed,
        "spec_accept_histogram": list(histogram),
        "spec_step_commit_lengths": [int(c) for c in step_commits],
        "spec_step_draft_ms": [round(float(x), 4) for x in step_draft_ms],
        "spec_step_verify_ms": [round(float(x), 4) for x in step_verify_ms],
    }
