"""``specdiag sweep --measure plugin_identity``: does an arm's server decode what the reference's does?

Every arm (one server of the sweep at a time) gets the same prompts (:func:`prompts`: ``short_prompts`` spread over
``short_min``..``short_max`` tokens, then the long ``contexts``; seeded novel prose, exact lengths), and per prompt:

1. the prefix cache flushed, one greedy request of ``max_new_tokens`` (``ignore_eos``): the row's ``output_ids``;
2. for each arm measured before it in this sweep whose output for the prompt differs, at the first differing
   position j: the cache flushed, a 1-token request on *this* server for the prompt plus the j tokens both produced,
   asking for the top-2 logprobs (its prefill's logits there): the row's ``at_diff[that arm]`` = ``first_diff``,
   ``top2`` [[logprob, token], [logprob, token]], ``margin``, ``error`` (a server without logprobs, such as the
   embedded one, says so there);
3. with ``repeats`` above 1, the prompt again (cache flushed) ``repeats - 1`` times: rows with ``repeat`` 1, 2, ...,
   the in-server control (a server must decode the same ids twice).

Rows go into the table ``plugin_identity`` as they are measured (a sweep cut short keeps them). A prompt predicted to
outlast the time left is not started (run.json ``not_run`` says which). :func:`specdiag.identity.compare_arms` judges
the rows (each arm against the reference: identical prompts, first differences, and whether each is a rounding tie:
the margin at the difference within a bf16 step and the tested token among the top-2); :func:`summarize_run` puts
its result in run.json ``identity`` at the end of a sweep and of ``specdiag merge``.

Put a repeat of the reference last in the arms file (params/arms/plugin-identity.yaml): it is the control (a fresh
server configured as the reference must decode the same ids) and it reads the reference configuration's own top-2 at
every difference the arms before it made. A check arm (``SPECDIAG_SGLANG_CHECK=1``) needs nothing of its own: its
verify calls during these requests are compared inside SGLang and the sweep keeps them in run.json ``plugin_check``.
After its prompts, a plugin arm gets one more short request past a pause, as the plugin writes its stats at most once
a second, on a verify call.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Mapping

from specdiag.identity import compare_arms, describe, first_diff
from specdiag.measure.request import exact_prompt, greedy, send
from specdiag.steps.engine_ab.measure import predicted

if TYPE_CHECKING:
    from specdiag.sweep.arms import ArmsFile
    from specdiag.sweep.job import ArmJob

TABLE = "plugin_identity"
KIND = "novel"
#: logprobs asked of SGLang for the token after the prompt (a 1-token request: the prefill's logits)
TOP2_BODY = {"return_logprob": True, "top_logprobs_num": 2, "logprob_start_len": -1}


@dataclass(frozen=True)
class SweepSettings:
    """plugin_identity's settings (the arms file's ``settings:``, ``--contexts``, ``--max-new-tokens``, ``--set``)."""

    short_prompts: int = 20  # short prompts, their lengths spread evenly over short_min..short_max tokens
    short_min: int = 64
    short_max: int = 2000
    contexts: tuple[int, ...] = (16384, 65536, 120000)  # the long prompts, tokens
    max_new_tokens: int = 32  # greedy tokens per prompt
    repeats: int = 1  # greedy requests per prompt and server (the later ones: the in-server control)
    reference: str = ""  # the arm every other is compared to ("": the arms file's first)
    controls: tuple[str, ...] = ()  # arms configured as the reference (each must be identical to it)
    tie_margin_nats: float = 0.03125  # a difference is a rounding tie within this top-2 margin (one bf16 step)


def prompts(s: SweepSettings) -> list[tuple[str, int, int]]:
    """(set, prompt tokens, seed) per prompt, in the order measured: the short ones, then the long ones."""
    n = s.short_prompts
    short = [("short", s.short_min + ((s.short_max - s.short_min) * i) // max(1, n - 1), i) for i in range(n)]
    return short + [("long", int(c), i) for i, c in enumerate(s.contexts)]


def top2_from_meta(meta: Mapping[str, Any]) -> dict[str, Any]:
    """The top-2 (logprob, token) of the first output token in an SGLang answer's ``meta_info``, and their margin."""
    top = meta.get("output_top_logprobs") or []
    entries = sorted(((float(e[0]), int(e[1])) for e in (top[0] if top else []) if e and e[0] is not None),
                     key=lambda t: -t[0])
    if len(entries) < 2:
        return {"error": f"no top-2 logprobs in the answer: {str(top)[:200]}"}
    return {"error": None, "top2": [list(e) for e in entries[:2]], "margin": entries[0][0] - entries[1][0]}


def _flush(client: Any) -> None:
    flush = getattr(client, "flush_cache", None)
    if flush is not None:
        flush()


def top2_at(client: Any, ids: list[int]) -> dict[str, Any]:
    """Top-2 logprobs of the token after ``ids`` on this server (cache flushed; one greedy token)."""
    _flush(client)
    trace = client.generate(input_ids=ids, sampling_params=greedy(1), stream=False, extra_body=TOP2_BODY)
    if trace.error:
        return {"error": str(trace.error)[:300]}
    return top2_from_meta(trace.meta_info or {})


def measure_prompt(client: Any, arm: str, prompt: tuple[str, int, int], max_new_tokens: int,
                   earlier: Mapping[str, Mapping[str, Any]], repeat: int = 0) -> dict[str, Any]:
    """One prompt on one server (module doc, steps 1 and 2; a ``repeat`` above 0 is step 3: no top-2 reads);
    ``earlier``: each earlier arm's row for this prompt."""
    tag, ctx, seed = prompt
    t0 = time.monotonic()
    row: dict[str, Any] = {"arm": arm, "set": tag, "context_tokens": ctx, "seed": seed, "repeat": repeat,
                           "prompt_kind": KIND, "max_new_tokens": max_new_tokens, "output_ids": [], "error": None,
                           "at_diff": {}}
    try:
        ids = list(exact_prompt(client, ctx, KIND, seed).input_ids)
        _flush(client)
        res = send(client, ids, max_new_tokens)
        row["error"] = res.error or (res.trace.error if res.trace is not None else "no trace")
        row["output_ids"] = list(res.trace.output_ids or []) if res.trace is not None else []
        row["seconds"] = round(time.monotonic() - t0, 3)  # the prompt and its request (the budget's guide)
        for other, theirs in (earlier if repeat == 0 else {}).items():
            if row["error"] or theirs.get("error"):
                continue
            j = first_diff(theirs.get("output_ids") or [], row["output_ids"])
            if j is not None:
                row["at_diff"][other] = {"first_diff": j, **top2_at(client, ids + row["output_ids"][:j])}
    except Exception as exc:  # noqa: BLE001 - the row says why; the next prompt goes on
        row["error"] = f"{type(exc).__name__}: {exc}"[:500]
    return row


def sweep_begin(run: Any, arms: "ArmsFile", settings: SweepSettings) -> None:
    """The plan in run.json ``params.plugin_identity``: the prompts, the reference and controls."""
    reference = settings.reference or arms.arms[0].name
    run.update(params={"plugin_identity": {"prompts": [list(p) for p in prompts(settings)],
                                           "max_new_tokens": settings.max_new_tokens, "reference": reference,
                                           "controls": list(settings.controls), "prompt_kind": KIND}})


def sweep_arm(job: "ArmJob") -> list[str]:
    """Every prompt on the arm's server, rows appended as measured; returns the prompts not started (time)."""
    from specdiag.serving import make_client  # noqa: PLC0415 - live only: replay loads no server code

    s: SweepSettings = job.settings
    client = make_client(job.url)
    earlier: dict[tuple, dict[str, Any]] = {}
    for r in job.run.rows(TABLE):
        if r.get("arm") != job.arm.name and not r.get("repeat"):
            earlier.setdefault((r["set"], r["context_tokens"], r["seed"]), {})[r["arm"]] = r
    mine: list[dict[str, Any]] = []
    not_run = []
    for prompt in prompts(s):
        others = earlier.get(prompt, {})
        reads = s.repeats + sum(1 for r in others.values() if not r.get("error"))  # requests, and top-2 reads at most
        guess = predicted(mine, "seconds", prompt[1], 1.0)  # a request's time, from the longest shorter prompt
        need = reads * (guess if guess is not None else 5 + prompt[1] / 8000)
        if job.left_s() < need:
            not_run.append(f"{job.arm.name}: {prompt[0]} prompt of {prompt[1]:,} tokens (seed {prompt[2]}) not "
                           f"started: about {need:.0f} s needed, {max(job.left_s(), 0):.0f} s left")
            job.progress(not_run[-1])
            continue
        row = measure_prompt(client, job.arm.name, prompt, s.max_new_tokens, others)
        job.run.append_row(TABLE, row)
        mine.append(row)
        again = []
        for r in range(1, s.repeats):
            again.append(measure_prompt(client, job.arm.name, prompt, s.max_new_tokens, {}, repeat=r))
            job.run.append_row(TABLE, again[-1])
        diffs = {a: d["first_diff"] for a, d in row["at_diff"].items()}
        job.progress(f"{job.arm.name:>14} {prompt[0]:>5} {prompt[1]:>7,}: {len(row['output_ids'])} tokens"
                     + (f", differs from {diffs} (margins {[d.get('margin') for d in row['at_diff'].values()]})"
                        if diffs else "")
                     + (f"; repeats identical {sum(a['output_ids'] == row['output_ids'] for a in again)}/{len(again)}"
                        if again else "") + (f" ERROR {row['error']}" if row["error"] else ""))
    if job.arm.engine == "sglang" and job.arm.plugin != "off" and job.left_s() > 5:
        time.sleep(1.2)  # the plugin writes its stats at most once a second, on a call: one more after a pause
        measure_prompt(client, job.arm.name, ("stats", 64, 99), 4, {})
    return not_run


def summarize_run(run: Any) -> dict[str, Any]:
    """:func:`specdiag.identity.compare_arms` over the run's rows with the run's reference and controls, into run.json
    ``identity``; its lines printed."""
    plan = (run.meta.get("params") or {}).get("plugin_identity") or {}
    settings = (run.meta.get("measurement") or {}).get("settings") or {}
    result = compare_arms(run.rows(TABLE), plan.get("reference") or settings.get("reference") or "",
                          plan.get("controls") or settings.get("controls") or (),
                          float(settings.get("tie_margin_nats", 0.03125)))
    run.update(identity=result)
    for line in describe(result):
        print(line, flush=True)
    return result


def sweep_end(run: Any, arms: "ArmsFile", work: Any) -> None:
    summarize_run(run)


def merge_end(run: Any) -> None:
    """A merged run's ``identity`` computed again over every part's rows."""
    summarize_run(run)
