"""10's measurement: a long request's ms per verify step on a fresh (contiguous) and a fragmented pool, per arm.

An **arm** is a server (a name and a URL): SGLang with the Triton backend, with the plugin, with FlashInfer, or the
embedded server. For each arm, in this order:

1. **fresh**: per context and repeat, ``/flush_cache`` (the free list back to one contiguous range), then the long
   request: its prompt lands on consecutive slots;
2. **fragmented**: ``/flush_cache``, then the filler (filler.py) cycles the pool, then the long requests without a
   flush: their prompts land on the pieces the filler left. The flush first makes the free list one known range the
   filler's cycles are counted from; without it, a long request freed earlier (the fresh state's) sits in the list
   as one contiguous piece a short filler may not reach past (seen on the H200: a "fragmented" 32k request laid on
   consecutive slots). The filler runs again before a request whenever the pieces left ahead in the free list (the
   pool minus what the long requests since the last filler took, an estimate) are fewer than it needs. The row's
   measured layout, not the filler's count, says whether the request was scattered.

The arms come from an arms file (``specdiag sweep --measure kv_layout``, and 10 in-process: :func:`sweep_arm` on each,
one server at a time), or a running server (an arm with ``url``). An embedded arm with no ``max_total_tokens`` gets
the smallest pool from which one filler run serves every fragmented request (:func:`sweep_configure`,
:func:`smallest_pool`): a small pool keeps the filler short, whose 1.1 pool cycles are the embedded arms' largest
cost. An arm ``NAME_contiguous`` with ``kv_alloc: contiguous`` beside ``NAME`` gives 10's three states.

Each request is a measured request (specdiag.measure.request: exact length, greedy, streamed, ignore_eos). Its row
holds 01's columns (``step_ms``: decode window over verify steps, client side), the per-step samples (chunk gaps,
ms), the embedded server's own verify times where it reports them, and the request's **layout**: from the embedded
server's final ``meta_info.kv_layout``, or from the SGLang plugin's layout records (``SPECDIAG_SGLANG_LAYOUT=1``,
written to the arm's ``SPECDIAG_SGLANG_STATS`` folder: the arm's ``layout_dir``, the sweep's stats folder of a server it
started, or a running server's ``stats_dir``) in the request's time window; none otherwise (the row says so). Server code is imported inside the functions (replay imports no client).
"""

from __future__ import annotations

import dataclasses
import json
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from specdiag.kvlayout import LayoutStats, from_dict
from specdiag.measure.metrics import error_row, sweep_row
from specdiag.measure.request import exact_prompt, send
from specdiag.steps.kv_layout.filler import FillerPlan, fill, require_loopback, slots_of

TABLE = "kv_layout"
STATES = ("fresh", "fragmented")
#: the arm names the notebook knows how to read (any word is accepted; these get their description)
ARM_TEXT = {
    "embedded": "the embedded server (torch on this machine; attention gathers K/V through the slot indices)",
    "triton": "SGLang, Triton attention backend (its verify kernel: no KV split)",
    "plugin": "SGLang, Triton backend with the specdiag plugin's split-KV verify kernel",
    "flashinfer": "SGLang, FlashInfer attention backend",
}
ARM_TEXT.update({f"{name}_contiguous": f"{text}, with the contiguous KV allocator" for name, text in list(ARM_TEXT.items())})
KEY = ("arm", "pool_state", "context_tokens", "repeat")


@dataclass(frozen=True)
class Arm:
    name: str  # a word: embedded, triton, plugin, flashinfer, ...
    url: str
    layout_dir: str = ""  # the server's SPECDIAG_SGLANG_STATS folder (plugin layout records); "" for none


@dataclass(frozen=True)
class LayoutPlan:
    contexts: tuple[int, ...]
    max_new_tokens: int = 64  # per long request, tokens
    repeats: int = 1  # long requests per arm, state and context
    prompt_kind: str = "novel"
    seed: int = 0
    filler: FillerPlan = field(default_factory=FillerPlan)
    states: tuple[str, ...] = STATES
    # one filler per run of fragmented requests (after each flush): the later requests land on the slots the earlier
    # ones freed, which SGLang's page_size-1 allocator appends to its free list in the order the request held them, so
    # they lie as scattered as the first (each row's measured layout is the check). False: a filler whenever the
    # filler's pieces left ahead in the free list (an estimate) do not cover the next request
    filler_once: bool = False


def schedule(states: Sequence[str], repeats: int) -> list[tuple[str, int]]:
    """The order of (pool state, repeat) an arm is measured in (each over every context). Fresh then fragmented with two
    or more repeats: half the fresh requests before the filler and half after the fragmented ones (A B A), so a drift
    of the host over the arm's minutes (measured: 12.2 against 16.2 ms per step on one 2-core host between the two
    halves of a run) falls on both states instead of on the fragmented ones. Any other order is kept as given."""
    if tuple(states) == STATES and repeats >= 2:
        before = (repeats + 1) // 2
        return ([("fresh", r) for r in range(before)] + [("fragmented", r) for r in range(repeats)]
                + [("fresh", r) for r in range(before, repeats)])
    return [(state, r) for state in states for r in range(repeats)]


def step_gaps_ms(trace: Any) -> list[float]:
    """Per verify step (one stream chunk per scheduler step), the gap to the previous chunk, ms, after the first."""
    t = list(getattr(trace, "chunk_t_s", None) or [])
    return [round(1000.0 * (b - a), 4) for a, b in zip(t, t[1:])]


def plugin_layout(folder: str | Path, t0: float, t1: float, wait_s: float = 3.0) -> tuple[LayoutStats | None, int]:
    """The plugin's layout of the single request verified between ``t0`` and ``t1`` (Unix s): the record with the
    longest prefix in that window (its last verify step), and how many verify forwards were recorded there. The
    plugin writes its records within about a second (a 0.5 s thread): read once that has passed, and again until
    ``wait_s`` is over while nothing is found."""
    deadline = time.time() + wait_s
    time.sleep(max(0.0, min(t1 + 1.2 - time.time(), wait_s)))
    while True:
        best, count = read_plugin_records(folder, t0, t1)
        if best is not None or time.time() >= deadline:
            return best, count
        time.sleep(0.25)


def read_plugin_records(folder: str | Path, t0: float, t1: float) -> tuple[LayoutStats | None, int]:
    """One read of the plugin's stats files (pure apart from reading them): see :func:`plugin_layout`."""
    best: LayoutStats | None = None
    count = 0
    for path in sorted(Path(folder).glob("stats-*.json")):
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        layout = data.get("layout") or {}
        for rec in layout.get("records") or []:
            if not t0 - 0.5 <= float(rec.get("t_unix_s", 0)) <= t1 + 0.5 or not rec.get("requests"):
                continue
            count += 1
            req = rec["requests"][0]
            stats = LayoutStats(tokens=int(req["prefix_tokens"]), runs=int(req["runs"]),
                                tokens_in_long_runs=int(req["tokens_in_long_runs"]),
                                longest_run=int(req["longest_run"]), long_run=int(layout.get("long_run") or 64))
            if best is None or stats.tokens > best.tokens:
                best = stats
    return best, count


def server_pool(client: Any) -> dict[str, Any]:
    """The facts of the server's pool that 10 needs, from /server_info (SGLang and the embedded server)."""
    info = (client.server_info() if hasattr(client, "server_info") else {}) or {}
    states = info.get("internal_states") or [{}]
    own = isinstance(states[0], Mapping) and isinstance(states[0].get("kv_pool"), Mapping)
    return {"pool_tokens": info.get("max_total_num_tokens"), "reports_layout": own, "page_size": info.get("page_size"),
            "disable_radix_cache": info.get("disable_radix_cache"), "attention_backend": info.get("attention_backend"),
            "speculative_algorithm": info.get("speculative_algorithm"),
            "tokens_per_step": info.get("speculative_num_draft_tokens"),
            "kv_alloc": info.get("kv_alloc")}  # the embedded server reports its allocator; SGLang does not


def _row(arm: Arm, state: str, ctx: int, repeat: int, plan: LayoutPlan, done: Any, pool: Mapping[str, Any],
         filler: Mapping[str, Any] | None) -> dict[str, Any]:
    labels = dict(arm=arm.name, pool_state=state, repeat=repeat, prompt_kind=plan.prompt_kind,
                  seed=plan.seed + repeat, max_new_tokens=plan.max_new_tokens)
    if done.trace is None:
        row = error_row(ctx, done.error, done.t_send_unix_s, **labels) if done.error else {}
    else:
        row = sweep_row(done.trace, ctx, **labels)
    row.update(cache_flushed=done.cache_flushed, pool_tokens=pool.get("pool_tokens"), page_size=pool.get("page_size"),
               attention_backend=pool.get("attention_backend"), filler=dict(filler) if filler else None)
    trace = done.trace
    meta = dict(getattr(trace, "meta_info", None) or {})
    verify = [float(x) for x in meta.get("spec_step_verify_ms") or []]
    row["step_ms_samples"] = step_gaps_ms(trace) if trace is not None else []
    row["server_verify_ms_median"] = statistics.median(verify) if verify else None
    row["server_verify_ms"] = verify or None
    layout, source, forwards = None, None, None
    if isinstance(meta.get("kv_layout"), Mapping):
        layout, source = from_dict(meta["kv_layout"]), "server-reported (embedded meta_info.kv_layout)"
    elif arm.layout_dir and trace is not None and not trace.error:
        t1 = trace.t_send_unix_s + max(trace.chunk_t_s or [0.0])
        layout, forwards = plugin_layout(arm.layout_dir, trace.t_send_unix_s, t1)
        source = "server-reported (plugin SPECDIAG_SGLANG_LAYOUT)" if layout else None
    row["layout"] = layout.as_dict() if layout else None
    row["layout_source"] = source or ("none: the server reports no layout (the embedded server does; SGLang with the "
                                      "plugin's SPECDIAG_SGLANG_LAYOUT=1 and its stats folder)")
    row["layout_forwards"] = forwards
    if row.get("error") is None and done.error:
        row["error"] = done.error
    return row


def prompt_seed(seed: int, state: str, repeat: int) -> int:
    """The prompt of one request: distinct for every state and repeat, the same across arms and contexts' lengths.

    A scattered request must not decode the prompt a fresh one decoded before it: SGLang's NGRAM keeps its n-gram
    store across requests and recalls the earlier answer (on the H200 a repeated prompt committed 7.9 tokens per step
    against 1.9), which would be read as a layout effect."""
    return seed + repeat + 1_000 * STATES.index(state) if state in STATES else seed + repeat + 1_000 * len(STATES)


def measure_arm(run: Any, arm: Arm, plan: LayoutPlan, progress: Callable[[str], None] = print,
                deadline_s: float | None = None, not_run: list[str] | None = None) -> int:
    """Every state, context and repeat of ``plan`` on ``arm``, one row each appended to ``run``'s table (rows
    already there are kept and skipped: a re-run resumes). Returns the rows measured now. Past ``deadline_s``
    (time.monotonic()) no request is started; ``not_run`` (a list) then receives what was left, a sentence."""
    from specdiag.serving import reach  # noqa: PLC0415 - live only: replay loads no server code

    client = reach(arm.url)
    url = client.base_url
    pool = server_pool(client)
    if not pool.get("pool_tokens"):
        raise ValueError(f"{arm.name} ({url}) reports no max_total_num_tokens in /server_info: not an SGLang server "
                         "(or the embedded one); 10 measures SGLang's token pool")
    done_keys = run.done_keys(TABLE, KEY)
    pool_tokens = int(pool["pool_tokens"])
    tpp = int(pool["tokens_per_step"] or 0) or None
    base = exact_prompt(client, max(2 * plan.filler.prompt_tokens[1], 512), "novel", plan.seed + 7919).input_ids
    written = 0
    ahead = 0  # filler pieces left ahead in the free list (estimate), slots
    filled = False  # a filler ran since the last flush
    filler_note: dict[str, Any] | None = None
    for state, rep in schedule(plan.states, plan.repeats):
        if state == "fresh":
            ahead, filled = 0, False  # the flush before a fresh request undoes the filler's work
        for ctx in plan.contexts:
            if (arm.name, state, ctx, rep) in done_keys:
                continue
            if deadline_s is not None and time.monotonic() > deadline_s:
                if not_run is not None:
                    not_run.append(f"{arm.name}: {state} at {ctx:,} tokens, repeat {rep}, and what follows: not "
                                   "started (time budget)")
                progress(f"{arm.name}: stopped at the time budget before {state} {ctx:,} #{rep}")
                return written
            need = ctx + plan.max_new_tokens * (tpp or 1)
            if need > pool_tokens:
                raise ValueError(f"{arm.name}: a {ctx}-token request needs about {need} slots; the pool holds "
                                 f"{pool_tokens}")
            prompt = exact_prompt(client, ctx, plan.prompt_kind, prompt_seed(plan.seed, state, rep))
            if state == "fresh":
                t0 = time.time()
                flushed = client.reset_cache()
                done = send(client, prompt.input_ids, plan.max_new_tokens, cache_flushed=flushed, prompt=prompt,
                            t_stamp=t0)
            else:
                if filler_due(plan, filled, ahead, need):
                    require_loopback(url)
                    progress(f"{arm.name}: filling the pool ({pool_tokens:,} slots) before {ctx:,} tokens")
                    client.reset_cache()  # the filler's cycles count from one contiguous free list
                    res = fill(url, client.engine, base, plan.filler, pool_tokens, tpp, progress)
                    filler_note = res.as_dict()
                    ahead = pool_tokens - need if res.stopped == "cycled" else 0
                    filled = True
                    progress(f"{arm.name}: filler {res.requests} requests, {res.cycles:.2f} pool cycles "
                             f"({res.slots_source}), {res.seconds:.1f} s, stopped: {res.stopped}")
                done = send(client, prompt.input_ids, plan.max_new_tokens, cache_flushed=None, prompt=prompt)
                if done.trace is not None:
                    ahead -= slots_of(done.trace.meta_info or {}, ctx, tpp)
            row = _row(arm, state, ctx, rep, plan, done, pool, filler_note if state == "fragmented" else None)
            run.append_row(TABLE, row)
            written += 1
            lay = row.get("layout") or {}
            progress(f"{arm.name} {state:>10} {ctx:>7,} tokens: "
                     + (f"{row['step_ms']:.2f} ms/step" if row.get("step_ms") else f"error {row.get('error')}")
                     + (f", {100 * lay['share_in_long_runs']:.0f}% of tokens in runs >= 64, "
                        f"{lay['runs_per_1k_tokens']:.1f} runs/1k" if lay else ", layout not reported"))
    return written


@dataclass(frozen=True)
class SweepSettings:
    """10's settings in a sweep (the arms file's ``settings:``, ``--contexts``, ``--set KEY=VALUE``)."""

    contexts: tuple[int, ...] = (32768, 131072)  # long requests' prompt tokens
    max_new_tokens: int = 64  # per long request
    repeats: int = 1  # long requests per arm, pool state and context (each its own prompt)
    states: tuple[str, ...] = STATES  # pool states, in this order
    filler_once: bool = False  # one filler per run of fragmented requests (LayoutPlan.filler_once)
    filler_cycles: float = 1.1  # slots the filler pushes through the allocator, in pool sizes
    filler_concurrency: int = 8  # filler requests in flight
    filler_max_s: float = 240.0  # the filler stops after this long, s
    seed: int = 0  # seeds the long prompts and the filler's lengths

    def plan(self) -> LayoutPlan:
        if not self.states or set(self.states) - set(STATES):
            raise ValueError(f"states takes {' and/or '.join(STATES)}, in the order to measure; got {self.states}")
        return LayoutPlan(contexts=self.contexts, max_new_tokens=self.max_new_tokens, repeats=self.repeats,
                          seed=self.seed, states=self.states, filler_once=self.filler_once,
                          filler=FillerPlan(cycles=self.filler_cycles, concurrency=self.filler_concurrency,
                                            seed=self.seed, max_seconds=self.filler_max_s))


def sweep_configure(arm: Any, settings: SweepSettings) -> Any:
    """An embedded arm without ``max_total_tokens`` on the smallest pool one filler run serves (:func:`smallest_pool`
    of the plan, tokens per verify step the arm's or the embedded engine's default of 8); any other arm as it is."""
    if arm.engine != "embedded" or arm.max_total_tokens:
        return arm
    spec = arm.speculation
    tokens = (spec.tokens_per_step or EMBEDDED_DRAFT_TOKENS) if spec.speculates else None
    return dataclasses.replace(arm, max_total_tokens=smallest_pool(settings.plan(), tokens))


#: the embedded engine's tokens per verify step when an arm does not say (specdiag.localserver.config)
EMBEDDED_DRAFT_TOKENS = 8


def sweep_begin(run: Any, arms: Any, settings: SweepSettings) -> None:
    """run.json's plan (``kv_layout_plan``) before the first server starts; a bad plan fails here."""
    settings.plan()
    run.update(data_source="measured", kv_layout_plan={**dataclasses.asdict(settings),
                                                       "arms": [a.name for a in arms.arms]})


def sweep_arm(job: Any) -> list[str]:
    """:func:`measure_arm` on the arm's server (a :class:`specdiag.sweep.job.ArmJob`): its pool's facts in run.json
    ``kv_layout_arms`` (an arm measured again replaces its earlier facts), the layout read from the server's own report
    (embedded) or from the plugin's records in the arm's stats folder (SGLang; a running server's ``stats_dir``); a
    failure is a row too."""
    from specdiag.serving import reach  # noqa: PLC0415 - live only: replay loads no server code

    arm = job.arm
    pool = server_pool(reach(job.url))
    records = (arm.engine == "sglang" or bool(arm.stats_dir)) and not pool["reports_layout"]
    layout_dir = str(job.stats_dir) if records else ""
    kv_alloc = pool.get("kv_alloc") or (None if arm.running else arm.kv_alloc)
    facts = [f for f in job.run.meta.get("kv_layout_arms") or [] if f.get("arm") != arm.name]
    facts.append({"arm": arm.name, "url": job.url, "what": arm.what or ARM_TEXT.get(arm.name, ""), **pool,
                  "kv_alloc": kv_alloc,
                  "layout_source": "server-reported (meta_info.kv_layout)" if pool["reports_layout"]
                  else f"plugin records ({job.stats_dir.name}/)" if records else "none"})
    job.run.update(kv_layout_arms=facts)
    if pool.get("disable_radix_cache") is False:
        job.progress(f"note: {arm.name} runs with the radix cache on: finished requests keep their slots in the tree, "
                     "so the filler fragments less; start it with --disable-radix-cache")
    not_run: list[str] = []
    try:
        measure_arm(job.run, Arm(arm.name, job.url, layout_dir), job.settings.plan(),
                    progress=job.progress, deadline_s=job.deadline_s, not_run=not_run)
    except Exception as exc:  # a row says why, as 10 reads it; the sweep records the arm as failed
        job.run.append_row(TABLE, {"arm": arm.name, "pool_state": None, "context_tokens": None, "repeat": None,
                                   "ts_unix_s": time.time(), "error": f"{type(exc).__name__}: {exc}"})
        raise
    return not_run


def filler_due(plan: LayoutPlan, filled: bool, ahead: int, need: int) -> bool:
    """Whether a filler runs before the next fragmented request: with ``plan.filler_once``, when none ran since the last
    flush (``filled``); otherwise when the filler's pieces left ahead in the free list (``ahead``, slots, an estimate)
    do not cover 1.1 times the request's ``need``."""
    return not filled if plan.filler_once else ahead < 1.1 * need


def fillers_needed(plan: LayoutPlan, pool_tokens: int, tokens_per_step: int | None) -> int:
    """How many filler runs :func:`measure_arm` makes on a pool of ``pool_tokens`` slots: its own rule
    (:func:`filler_due`), each request taking its prompt, ``max_new_tokens`` and one step's drafts (:func:`slots_of`)."""
    ahead, runs, filled = 0, 0, False
    for state, _ in schedule(plan.states, plan.repeats):
        if state == "fresh":
            ahead, filled = 0, False
            continue
        for ctx in plan.contexts:
            need = ctx + plan.max_new_tokens * (tokens_per_step or 1)
            if filler_due(plan, filled, ahead, need):
                runs += 1
                ahead, filled = pool_tokens - need, True
            ahead -= ctx + plan.max_new_tokens + (tokens_per_step or 0)
    return runs


def smallest_pool(plan: LayoutPlan, tokens_per_step: int | None, step: int = 64) -> int:
    """The smallest pool (a multiple of ``step`` slots) on which one filler run serves every fragmented request of
    ``plan``: the filler's cost is 1.1 pool sizes of slots, so this is the cheapest pool that still scatters every
    fragmented request of the plan over the filler's pieces."""
    need = max(ctx + plan.max_new_tokens * (tokens_per_step or 1) for ctx in plan.contexts)
    pool = -(-need // step) * step
    while fillers_needed(plan, pool, tokens_per_step) > 1:
        pool += step
    return pool
