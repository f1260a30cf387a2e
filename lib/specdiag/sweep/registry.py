"""The named measurements a sweep runs, each a function of its step's package.

A measurement's module (``specdiag.steps.<step>.measure``, or another module of the step) provides:

- ``SweepSettings``: a frozen dataclass of its settings (defaults included; :mod:`specdiag.sweep.settings` reads
  the arms file's ``settings:`` and ``--set`` into it);
- ``sweep_arm(job: ArmJob) -> list[str]``: measure one arm's ready server, rows appended to ``job.run`` as they
  are taken; returns what it left unmeasured, a sentence each (run.json ``not_run``);
- optionally ``PER_ARM = True``: its notebook replays one server per run folder (00-04), so ``job.run`` is the arm's
  own folder inside the sweep's (``<out>/<arm>/``: :func:`specdiag.sweep.driver.arm_run`);
- optionally ``sweep_begin(run, arms, settings)``: run.json keys its notebook reads, written once before the first
  server starts; ``sweep_env(arm, work) -> dict``: variables its servers need (a recorder's folder);
  ``sweep_end(run, arms, work)``: run-level summaries once every arm is done; ``merge_end(run)``: the same over a
  merged run's rows (``specdiag merge`` calls it last); ``sweep_configure(arm, settings) -> Arm``: what the
  measurement needs of a server the sweep starts (engine_ab: the embedded engine's prefix cache; kv_layout: the
  embedded engine's smallest pool), applied before anything is checked or started.

The modules are imported by name when a sweep asks for one (the registry itself imports no step).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from types import ModuleType
from typing import Any


@dataclass(frozen=True)
class Measurement:
    name: str
    module: str  # the step's module that holds SweepSettings and sweep_arm
    what: str  # one line for --help and run.json

    def load(self) -> ModuleType:
        return importlib.import_module(self.module)

    def hook(self, name: str) -> Any:
        """The module's function ``name``, or None where it has none (optional hooks)."""
        return getattr(self.load(), name, None)


MEASUREMENTS: dict[str, Measurement] = {m.name: m for m in (
    Measurement("snapshot", "specdiag.steps.snapshot.measure",
                "00: the server's settings, its model's and drafter's configs and this host's peaks, per arm"),
    Measurement("baseline_sweep", "specdiag.steps.baseline_sweep.measure",
                "01: one streamed request per context (TTFT, decode, ms per step, commit length), per arm"),
    Measurement("gpu_utilization", "specdiag.steps.gpu_utilization.measure",
                "02: one long request while the GPU is sampled (NVML, the CPU, or Prometheus), per arm"),
    Measurement("drafter_timing", "specdiag.steps.drafter_inspection.measure",
                "03: the server-reported draft and verify ms per step, the drafter's window check and cost between "
                "two arms"),
    Measurement("commit_probe", "specdiag.steps.commit_probe.measure",
                "04: commit length on predictable text against novel prose per context, per arm"),
    Measurement("engine_ab", "specdiag.steps.engine_ab.measure",
                "09: per context, the prompt prefilled from an empty cache, then decoded on the cached prompt"),
    Measurement("kv_layout", "specdiag.steps.kv_layout.measure",
                "10: a long request on a fresh pool and on a pool the filler scattered"),
    Measurement("moe_batch1", "specdiag.steps.moe_batch1.measure",
                "11: the expert recorder's pass, timed requests and one routed-experts request per server"),
    Measurement("plugin_identity", "specdiag.steps.engine_ab.plugin_identity",
                "greedy output ids per prompt on every arm, judged against the reference arm's (top-2 margins at "
                "the first difference)"),
)}


class UnknownMeasurement(ValueError):
    pass


def measurement(name: str) -> Measurement:
    try:
        return MEASUREMENTS[name]
    except KeyError:
        raise UnknownMeasurement(f"no measurement named {name!r}; choose one of {', '.join(MEASUREMENTS)}") from None
