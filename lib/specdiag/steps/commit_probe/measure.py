"""``specdiag sweep --measure commit_probe``: 04's probe on each arm's server, without papermill (a GPU host without
Jupyter), into the arm's own run folder (``<out>/<arm>/``), which 04 replays.

The notebook's own recipe: :func:`specdiag.steps.commit_probe.probe.make_plan` checked against the server's context
length, each request :func:`specdiag.steps.commit_probe.probe.measure` (its row and its verify steps), rows appended by
:func:`specdiag.measure.loop.measure_missing`. An arm that does not speculate is not probed (said in ``not_run``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from specdiag.measure.loop import measure_missing
from specdiag.steps.commit_probe import probe as cp

#: 04 replays one server per run folder: the driver gives each arm its own (specdiag.sweep.driver.arm_run)
PER_ARM = True
NOTEBOOK = "04_commit_probe"


@dataclass(frozen=True)
class SweepSettings:
    """04's parameters in a sweep (the arms file's ``settings:``, ``--contexts``, ``--set KEY=VALUE``)."""

    contexts: tuple[int, ...] = (1024, 4096, 16000)  # prompt tokens
    kinds: tuple[str, ...] = ("predictable", "novel")  # text kinds, each context's prompt of each
    max_new_tokens: int = 64  # tokens per request (ignore_eos)
    repeats: int = 1  # requests per context and kind
    seed: int = 0  # prompt seed
    flush_cache: bool = True  # the prefix cache emptied before each request


def sweep_arm(job: Any) -> list[str]:
    """04's requests on the arm's server into its run folder (``params.04_commit_probe`` beside them); returns what
    was not measured."""
    from specdiag.serving import make_client  # noqa: PLC0415 - live only: replay loads no server code

    s: SweepSettings = job.settings
    info = job.server_info
    if str(info.get("speculative_algorithm") or "NONE").upper() in ("NONE", "NULL", ""):
        return [f"{job.arm.name}: commit probe not run: the server does not speculate"]
    client = make_client(job.url)
    plan = cp.make_plan(list(s.contexts), list(s.kinds), s.max_new_tokens, s.seed, s.flush_cache,
                        server_context_length=info.get("context_length"), repeats=s.repeats)
    draft = info.get("speculative_num_draft_tokens")
    job.run.update(server_url=job.url, params={NOTEBOOK: {
        "context_lengths": list(s.contexts), "max_new_tokens": s.max_new_tokens, "kinds": list(s.kinds),
        "seed": s.seed, "flush_cache": s.flush_cache, "repeats": s.repeats}})

    def probe(request: dict[str, Any]) -> Any:  # the probe row, and its verify steps for the steps table
        row, step_rows = cp.measure(client, request, plan, draft)
        return row, {cp.STEPS_TABLE: step_rows}

    not_run: list[str] = []
    measure_missing(job.run, plan, cp.PROBE_TABLE, cp.PROBE_KEY, probe, desc=f"{job.arm.name} probe",
                    report=job.progress, deadline_s=job.deadline_s, not_run=not_run)
    return not_run
