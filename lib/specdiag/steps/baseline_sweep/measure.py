"""``specdiag sweep --measure baseline_sweep``: 01's sweep on each arm's server, without papermill (a GPU host without
Jupyter), into the arm's own run folder (``<out>/<arm>/``), which 01 (and 05) replay.

The notebook's own recipe: :func:`specdiag.measure.sweep_plan.make_plan` checked against the server's context length,
each request :func:`specdiag.measure.sweep_plan.measure_request`, rows appended by
:func:`specdiag.measure.loop.measure_missing` (a sweep cut short keeps them; the budget stops the loop).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from specdiag.measure.loop import measure_missing
from specdiag.measure.sweep_plan import make_plan, measure_request
from specdiag.measure.sweep_table import SWEEP_KEY

#: 01 replays one server per run folder: the driver gives each arm its own (specdiag.sweep.driver.arm_run)
PER_ARM = True
NOTEBOOK = "01_baseline_sweep"


@dataclass(frozen=True)
class SweepSettings:
    """01's parameters in a sweep (the arms file's ``settings:``, ``--contexts``, ``--set KEY=VALUE``)."""

    contexts: tuple[int, ...] = (1024, 4096, 16384, 32768, 65536, 131072)  # prompt tokens, in order
    max_new_tokens: int = 32  # tokens per request (ignore_eos)
    repeats: int = 1  # requests per context
    prompt_kind: str = "novel"  # novel prose, or predictable text
    seed: int = 0  # the first repeat's prompt seed
    flush_cache: bool = True  # the prefix cache emptied before each request


def sweep_arm(job: Any) -> list[str]:
    """01's requests on the arm's server into its run folder (``params.01_baseline_sweep`` recorded beside them);
    returns what the budget left unmeasured."""
    from specdiag.serving import make_client  # noqa: PLC0415 - live only: replay loads no server code

    s: SweepSettings = job.settings
    client = make_client(job.url)
    plan = make_plan(list(s.contexts), s.max_new_tokens, s.repeats, s.prompt_kind, s.seed, s.flush_cache,
                     server_context_length=job.server_info.get("context_length"))
    job.run.update(server_url=job.url, params={NOTEBOOK: {
        "context_lengths": list(plan.context_lengths), "max_new_tokens": s.max_new_tokens, "repeats": s.repeats,
        "prompt_kind": s.prompt_kind, "seed": s.seed, "flush_cache": s.flush_cache, "instruction": ""}})
    not_run: list[str] = []
    measure_missing(job.run, plan, "sweep", SWEEP_KEY, lambda q: measure_request(client, q, plan),
                    desc=f"{job.arm.name} sweep", report=job.progress, deadline_s=job.deadline_s, not_run=not_run)
    return not_run
