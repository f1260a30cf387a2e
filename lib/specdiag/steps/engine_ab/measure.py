"""09's measurement: the same requests against every arm (a server), rows into one ``engine_ab`` table.

An arm is a name and a server (a URL: a live server, or one the launcher started). Per arm and context:

1. **prefill**: a prompt no cache holds (the cache emptied once per arm where the server allows, else each prompt
   given a unique head), asking for ``prefill_new_tokens`` tokens: its TTFT is the prefill of the whole prompt
   (``phase`` "prefill");
2. **decode**: the same prompt again ``repeats`` times, ``max_new_tokens`` each, the cache NOT flushed: the server
   serves the prompt from its prefix cache, so each request is a short prefill of the tail and a clean decode at that
   context (``phase`` "decode"; ``cached_tokens`` says how much the server reused). With ``tail_tokens`` (novel prose
   only), each decode request's last ``tail_tokens`` ids are its own (held-out prose from its own seed, row
   ``tail_seed``): the context stays the same length, the cached prefix is shared, and no request re-decodes another's
   answer (SGLang's NGRAM keeps one n-gram cache across requests: on the same prompt a later request drafts from the
   earlier answer, commit 7.5 against the first's 1.2 on the H200).

``kinds`` (default novel prose only) adds text kinds: each context's prompt of each kind is prefilled and decoded in
turn (rows carry ``prompt_kind``; 09's sections other than the break-even read the novel rows only). Predictable text
(one sentence repeated, :mod:`specdiag.prompts`) is where a drafter commits most: with it the break-even is measured
per text kind instead of computed from 04's commits.

So a long context's prefill is paid once per arm, not once per decode repeat (a 128k-token prefill on SGLang's Triton
backend takes minutes at a model's depth). :func:`prefill_all` and :func:`decode_all` are the two phases;
:func:`measure_arm` runs both on one arm alone, context by context, within a time budget (``concurrent`` on a row says
how many arms prefilled at once where a driver overlapped them: those TTFTs are not an arm's own). Each row is :func:`specdiag.measure.metrics.sweep_row`'s plus ``arm``,
``phase``, ``repeat``, ``seed``, ``concurrent``; rows are appended as they are measured (``run.append_row``).

``specdiag sweep --measure engine_ab`` (and 09 in-process) runs :func:`sweep_arm` on each arm of an arms file
(params/arms/engine-ab-*.yaml), with :class:`SweepSettings`; :func:`sweep_begin` records what 09 reads beside the rows
(the model's config, the plan, the peaks of the prefill floor); :func:`sweep_configure` turns the embedded engine's
prefix cache on (SGLang's radix cache and vLLM's prefix caching are on by default): phase 2 decodes on the cached
prompt.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable, Optional, Sequence

from specdiag import hardware
from specdiag.measure.fresh_prompt import freshen
from specdiag.measure.metrics import error_row, sweep_row
from specdiag.measure.request import ADD_SPECIAL_TOKENS, exact_prompt, send
from specdiag.paths import PROJECT_ROOT
from specdiag.prompts import build_prompt
from specdiag.runs import Run

if TYPE_CHECKING:
    from specdiag.sweep.arms import Arm, ArmsFile
    from specdiag.sweep.job import ArmJob

TABLE = "engine_ab"
KIND = "novel"  #: prose the drafter cannot predict: the investigation's worst case
KINDS = ("novel", "predictable")  #: the text kinds a run may measure (specdiag.prompts)


def main_rows(rows: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """The rows of novel prose (rows without ``prompt_kind`` are): what 09 compares arms on, apart from the
    break-even per text kind."""
    return [r for r in rows if (r.get("prompt_kind") or KIND) == KIND]


def prompt_seed(context_tokens: int, seed: int = 0) -> int:
    """One seed per context, the same for every arm: every arm reads the same prompt at a context."""
    return seed * 1_000_003 + int(context_tokens)


def _send_row(client: Any, ids: list[int], arm: str, ctx: int, labels: dict[str, Any], max_new_tokens: int
              ) -> dict[str, Any]:
    res = send(client, ids, max_new_tokens)
    if res.trace is None:
        return error_row(ctx, res.error or "no trace", res.t_send_unix_s, arm=arm, **labels)
    return sweep_row(res.trace, ctx, arm=arm, **labels)


def prefill_all(run: Run, client: Any, arm: str, contexts: Iterable[int], seed: int = 0, prefill_new_tokens: int = 2,
                concurrent: int = 1, deadline_s: Optional[float] = None,
                progress: Callable[[str], None] = lambda s: None,
                rows_out: Optional[list[dict[str, Any]]] = None, kind: str = KIND,
                repeat: int = 0) -> dict[int, list[int]]:
    """Phase 1 on one arm: the prefix cache emptied once (or, where the server offers no reset, each prompt given a
    unique head), then each context's prompt prefilled (module doc). Returns the prompts sent, by context: phase 2
    sends them again; ``rows_out`` (a list) also receives the rows written. ``repeat`` labels the rows (a TTFT
    measured again on another prompt: :func:`measure_arm`'s ``prefill_repeats``)."""
    prompts: dict[int, list[int]] = {}
    flushed: Optional[bool] = None
    for i, ctx in enumerate(int(c) for c in contexts):
        if deadline_s is not None and time.monotonic() > deadline_s:
            progress(f"{arm}: prefill at {ctx:,} tokens not started (time budget)")
            break
        labels = {"phase": "prefill", "repeat": repeat, "seed": prompt_seed(ctx, seed), "prompt_kind": kind,
                  "max_new_tokens": prefill_new_tokens, "concurrent": concurrent}
        t0 = time.time()
        try:
            prompt = exact_prompt(client, ctx, kind, labels["seed"])
            if i == 0 or not flushed:  # one reset for the arm; without one, every prompt its own head
                prompt, flushed = freshen(client, prompt, reset=True, add_special_tokens=ADD_SPECIAL_TOKENS)
        except Exception as exc:  # noqa: BLE001 - the row says why
            row = error_row(ctx, f"prompt: {exc}", t0, arm=arm, **labels)
        else:
            prompts[ctx] = list(prompt.input_ids)
            row = _send_row(client, prompts[ctx], arm, ctx, {**labels, "cache_flushed": flushed}, prefill_new_tokens)
        run.append_row(TABLE, row)
        if rows_out is not None:
            rows_out.append(row)
        progress(f"{arm:>26} prefill {ctx:>7,}{'' if kind == KIND else ' ' + kind}: TTFT {row.get('ttft_s')} s, {row.get('prefill_tok_s')} tok/s"
                 + (f" ERROR {row['error']}" if row.get("error") else ""))
    return prompts


#: a repeated prefill's prompt seed: the run's seed + this x the repeat (a prompt no other request shares)
PREFILL_SEED_STEP = 7919

#: a decode request's own tail draws its prose from this seed + the prompt's seed + the repeat
TAIL_SEED_BASE = 100_000


def tail_seed(ctx: int, seed: int, repeat: int) -> int:
    """The seed of a decode request's own tail (module doc)."""
    return TAIL_SEED_BASE + prompt_seed(ctx, seed) + repeat


def with_tail(client: Any, ids: Sequence[int], tail_tokens: int, seed: int) -> list[int]:
    """``ids`` with its last ``tail_tokens`` replaced by held-out prose of ``seed`` (no special tokens): the same
    length, the prefix shared."""
    if tail_tokens <= 0:
        return list(ids)
    if tail_tokens >= len(ids):
        raise ValueError(f"a decode tail of {tail_tokens} tokens needs a longer prompt than {len(ids)}")
    tail = build_prompt(lambda text: client.tokenize(text, add_special_tokens=False), tail_tokens, KIND,
                        seed=seed).input_ids
    return list(ids[: len(ids) - tail_tokens]) + list(tail)


def decode_all(run: Run, client: Any, arm: str, prompts: dict[int, list[int]], repeats: int | dict[int, int] = 3,
               max_new_tokens: int | dict[int, int] = 16, seed: int = 0, deadline_s: Optional[float] = None,
               progress: Callable[[str], None] = lambda s: None, first_repeat: int = 0,
               kind: str = KIND, tail_tokens: int = 0) -> list[dict[str, Any]]:
    """Phase 2 on one arm: ``repeats`` requests per context on the prompt phase 1 left in the prefix cache.
    ``repeats`` and ``max_new_tokens`` may differ per context (a slow arm at depth gets fewer, shorter ones);
    ``first_repeat`` numbers the first of them (a caller measuring in steps); ``tail_tokens`` gives each request of
    novel prose its own tail (module doc)."""
    rows = []
    for ctx, ids in prompts.items():
        n = repeats.get(ctx, 3) if isinstance(repeats, dict) else repeats
        m = max_new_tokens.get(ctx, 16) if isinstance(max_new_tokens, dict) else max_new_tokens
        for r in range(first_repeat, first_repeat + n):
            if deadline_s is not None and time.monotonic() > deadline_s:
                progress(f"{arm}: decode at {ctx:,} tokens, repeat {r}, not started (time budget)")
                return rows
            labels = {"phase": "decode", "repeat": r, "seed": prompt_seed(ctx, seed), "prompt_kind": kind,
                      "max_new_tokens": m, "concurrent": 1, "cache_flushed": None}
            sent = ids
            if tail_tokens > 0 and kind == KIND:
                labels["tail_seed"] = tail_seed(ctx, seed, r)
                try:
                    sent = with_tail(client, ids, tail_tokens, labels["tail_seed"])
                except Exception as exc:  # noqa: BLE001 - the row says why

                    row = error_row(ctx, f"tail: {exc}", time.time(), arm=arm, **labels)
                    run.append_row(TABLE, row)
                    rows.append(row)
                    continue
            row = _send_row(client, sent, arm, ctx, labels, m)
            run.append_row(TABLE, row)
            rows.append(row)
            progress(f"{arm:>26} decode  {ctx:>7,}{'' if kind == KIND else ' ' + kind} #{r}: {row.get('step_ms')} ms/step, "
                     f"{row.get('decode_tok_s')} tok/s, cached {row.get('cached_tokens')}"
                     + (f" ERROR {row['error']}" if row.get("error") else ""))
    return rows


#: a prediction reaches less than this many times its known context: beyond it the fixed and linear costs that dominate a
#: short context's time are scaled as if quadratic (on the H200 a 1k TTFT of 0.17 s predicted 706 s at 64k; it took 37,
#: and a server's first 1k request, 8.2 s with its warm-up, predicted 2,105 s at 16k)
MAX_PREDICTION_RATIO = 16


def predicted(rows: Iterable[dict[str, Any]], key: str, ctx: int, power: float) -> float | None:
    """A measure at ``ctx`` predicted from the arm's longest shorter context that has it: its value scaled by
    (ctx / that context) ** power (1 for a verify step, 2 for a prefill at depth, whose attention is quadratic); None
    when there is none, or when it is ``MAX_PREDICTION_RATIO`` or more times shorter (no prediction is made)."""
    known = [(int(r["context_tokens"]), float(r[key])) for r in rows
             if r.get(key) is not None and not r.get("error") and int(r["context_tokens"]) < ctx]
    if not known:
        return None
    c, v = max(known)
    if ctx / c >= MAX_PREDICTION_RATIO:
        return None
    return v * (ctx / c) ** power


def measure_arm(run: Run, client: Any, arm: str, contexts: Iterable[int], repeats: int = 3, max_new_tokens: int = 16,
                seed: int = 0, deadline_s: Optional[float] = None, progress: Callable[[str], None] = lambda s: None,
                slow_step_ms: Optional[float] = None, slow_repeats: int = 3,
                kinds: Sequence[str] = (KIND,), tail_tokens: int = 0, prefill_repeats: int = 1) -> list[str]:
    """Both phases on one arm alone, context by context (and, at a context, text kind by kind): each prompt
    prefilled, then decoded on its cached prompt before the next (the prefix cache never has to hold two long
    prompts). A context whose prefill is predicted (:func:`predicted`, quadratic) to end past ``deadline_s`` is not
    started. Where a verify step takes over ``slow_step_ms`` (measured at the context, or predicted from the previous
    one in proportion to the tokens), the context gets ``slow_repeats`` requests of half ``max_new_tokens``. With
    ``prefill_repeats`` > 1 each context's TTFT is measured that many times, each on a prompt of its own seed (``repeat``
    1, 2, ... first, the cache emptied before each; then repeat 0, whose prompt the decode requests reuse). Returns
    what was not run, a sentence each."""
    not_run: list[str] = []
    pre: list[dict[str, Any]] = []
    dec: list[dict[str, Any]] = []
    half = max(2, max_new_tokens // 2)
    for ctx in (int(c) for c in contexts):
        guess = predicted(pre, "ttft_s", ctx, 2.0)
        left = None if deadline_s is None else deadline_s - time.monotonic()
        if guess is not None and left is not None and guess > left:
            not_run.append(f"{arm} at {ctx:,} tokens: its prefill, predicted at {guess:,.0f} s from its previous "
                           f"context, would outlast the {max(left, 0):,.0f} s left")
            progress(not_run[-1])
            continue
        for kind in kinds:
            what = "" if kind == KIND else f", {kind} text"
            for r in range(1, max(1, prefill_repeats)):
                prefill_all(run, client, arm, [ctx], seed + PREFILL_SEED_STEP * r, deadline_s=deadline_s,
                            progress=progress, rows_out=pre, kind=kind, repeat=r)
            prompts = prefill_all(run, client, arm, [ctx], seed, deadline_s=deadline_s, progress=progress,
                                  rows_out=pre, kind=kind)
            if ctx not in prompts:
                not_run.append(f"{arm} at {ctx:,} tokens{what}: no prompt prefilled (time budget or an error row)")
                continue
            step = predicted(dec, "step_ms", ctx, 1.0)
            slow = slow_step_ms is not None and step is not None and step > slow_step_ms
            first = decode_all(run, client, arm, prompts, 1, half if slow else max_new_tokens, seed, deadline_s,
                               progress, kind=kind, tail_tokens=tail_tokens)
            slow = slow or bool(slow_step_ms is not None and first and (first[0].get("step_ms") or 0) > slow_step_ms)
            dec += first + decode_all(run, client, arm, prompts, (slow_repeats if slow else repeats) - 1,
                                      half if slow else max_new_tokens, seed, deadline_s, progress, first_repeat=1,
                                      kind=kind, tail_tokens=tail_tokens)
    return not_run


@dataclass(frozen=True)
class SweepSettings:
    """09's settings in a sweep (the arms file's ``settings:``, ``--contexts``, ``--set KEY=VALUE``)."""

    contexts: tuple[int, ...] = (1024, 4096, 16384, 32768, 65536, 131072, 185000)  # prompt tokens, in order
    arm_contexts: dict[str, tuple[int, ...]] = field(default_factory=dict)  # an arm's own contexts instead
    repeats: int = 5  # decode requests per context on the cached prompt
    slow_repeats: int = 3  # decode requests where a verify step takes over slow_step_ms
    slow_step_ms: float = 200.0  # ms per verify step (measured or predicted) above which a context is slow
    max_new_tokens: int = 16  # per decode request (half where slow)
    seed: int = 0  # prompt seed (one prompt per context, the same for every arm)
    kinds: tuple[str, ...] = (KIND,)  # text kinds, each context's prompt of each (KINDS; the first is novel prose)
    tail_tokens: int = 32  # each decode request's own last tokens (novel prose; 0: the same prompt each time)
    prefill_repeats: int = 1  # prefills per context for TTFT, each on a fresh prompt (the last one is decoded)

    def __post_init__(self) -> None:
        if KIND not in self.kinds or any(k not in KINDS for k in self.kinds) or len(set(self.kinds)) < len(self.kinds):
            raise ValueError(f"engine_ab setting kinds must hold {KIND!r} (what 09 compares arms on), each of "
                             f"{', '.join(KINDS)} at most once; got {list(self.kinds)}")


#: the embedded engine's flag for a prefix cache (SGLang's radix cache and vLLM's prefix caching are on by default)
PREFIX_CACHE_FLAG = "--enable-prefix-cache"


def sweep_configure(arm: "Arm", settings: SweepSettings) -> "Arm":
    """An embedded arm with its prefix cache on (phase 2 decodes on the cached prompt); any other arm as it is."""
    if arm.engine != "embedded" or PREFIX_CACHE_FLAG in arm.flags:
        return arm
    return replace(arm, flags=(*arm.flags, PREFIX_CACHE_FLAG))


def model_record(path: str | None) -> dict[str, Any]:
    """run.json ``model``: the model folder's path and, when this machine can read it, its config.json (a relative
    path is the project's)."""
    cfg = Path(path) if path and Path(path).is_absolute() else PROJECT_ROOT / str(path or "")
    cfg = cfg / "config.json" if cfg.suffix != ".json" else cfg
    return {"path": path, "model_config": json.loads(cfg.read_text()) if path and cfg.is_file() else None}


def sweep_begin(run: Run, arms: "ArmsFile", settings: SweepSettings) -> None:
    """run.json keys 09 reads: the model's config (``model``: the first arm that names a model folder; else
    :func:`sweep_arm` takes the model its first server reports), the plan (``params.09_engine_ab``), the speculation
    where every speculating arm agrees, and the peaks of the prefill floor (``hardware``, measured before any server
    takes the GPU)."""
    first = next((a.model for a in arms.arms if a.model), None)
    specs = {json.dumps(vars(a.speculation), sort_keys=True) for a in arms.arms if a.speculation.speculates}
    spec = json.loads(specs.pop()) if len(specs) == 1 else None
    run.update(model=model_record(first),
               params={"09_engine_ab": {
                   "contexts": list(settings.contexts),
                   "arm_contexts": {k: list(v) for k, v in settings.arm_contexts.items()},
                   "repeats": settings.repeats, "slow_repeats": settings.slow_repeats,
                   "slow_step_ms": settings.slow_step_ms, "max_new_tokens": settings.max_new_tokens,
                   "kinds": list(settings.kinds), "prefill_repeats": settings.prefill_repeats,
                   "draft_tokens": next((a.speculation.tokens_per_step for a in arms.arms
                                         if a.speculation.speculates), None),
                   "order": "serial: each arm's server started, measured and stopped before the next"}},
               speculation=None if spec is None else {
                   **spec, "note": (f"SGLANG_SIMULATE_ACC_LEN={spec['simulate_acc_len']:g} on the speculating arms: "
                                    "acceptance is forced, not the drafter's own") if spec.get("simulate_acc_len")
                   else "the drafter's own acceptance"})
    try:
        hardware.run_peaks(run, server_url="http://127.0.0.1")
    except Exception as exc:  # noqa: BLE001 - 09 then says the floor has no peaks
        run.update(hardware_error=f"no peaks recorded: {type(exc).__name__}: {exc}"[:300])


def sweep_arm(job: "ArmJob") -> list[str]:
    """:func:`measure_arm` on the arm's server, its contexts from the settings; returns what was not run. The run's
    ``model`` is the server's where no arm named a readable model folder (the embedded engine's default target)."""
    from specdiag.serving import make_client  # noqa: PLC0415 - live only: replay loads no server code

    if not (job.run.meta.get("model") or {}).get("model_config") and job.server_info.get("model_path"):
        job.run.update(model=model_record(str(job.server_info["model_path"])))
    s: SweepSettings = job.settings
    return measure_arm(job.run, make_client(job.url), job.arm.name, s.arm_contexts.get(job.arm.name, s.contexts),
                       s.repeats, s.max_new_tokens, s.seed, deadline_s=job.deadline_s, progress=job.progress,
                       slow_step_ms=s.slow_step_ms, slow_repeats=s.slow_repeats, kinds=s.kinds, tail_tokens=s.tail_tokens,
                       prefill_repeats=s.prefill_repeats)
