"""``specdiag sweep --measure gpu_utilization``: 02's sampled request on each arm's server, without papermill (a GPU
host without Jupyter), into the arm's own run folder (``<out>/<arm>/``), which 02 replays.

The notebook's own recipe: :func:`specdiag.telemetry.sampler.open_source` and
:func:`specdiag.steps.gpu_utilization.record.measure_utilization` (a warm-up request, then one long request inside the
sampler's window). With ``decode_seconds``, a 64-token request at the same context first measures the decode rate, and
the long request decodes about that many seconds (at most ``max_new_tokens``): a sample of decode long enough to read
however fast the server decodes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from specdiag.measure.metrics import sweep_row
from specdiag.prompts import build_prompt
from specdiag.steps.gpu_utilization.record import measure_utilization
from specdiag.telemetry.sampler import open_source

#: 02 replays one server per run folder: the driver gives each arm its own (specdiag.sweep.driver.arm_run)
PER_ARM = True
NOTEBOOK = "02_gpu_utilization"


@dataclass(frozen=True)
class SweepSettings:
    """02's parameters in a sweep (the arms file's ``settings:``, ``--set KEY=VALUE``)."""

    context_tokens: int = 8192  # prompt tokens of the sampled request
    max_new_tokens: int = 1024  # tokens it decodes (ignore_eos); with decode_seconds, the most
    decode_seconds: float = 0.0  # aim for this many seconds of decode (0: decode exactly max_new_tokens)
    sample_hz: float = 50.0  # samples per second
    telemetry: str = "auto"  # auto, nvml, cpu, or a Prometheus URL
    gpu_indices: tuple[int, ...] = field(default_factory=lambda: (0,))  # GPUs sampled (the first one's peak)
    idle_s: float = 1.0  # seconds sampled before and after the request
    seed: int = 0  # seed of the novel prose


def calibrated_new_tokens(client: Any, context_tokens: int, decode_seconds: float, most: int) -> int:
    """New tokens for about ``decode_seconds`` of decode, from a 64-token request at the same context (measured)."""
    prompt = build_prompt(lambda t: client.tokenize(t, add_special_tokens=True), context_tokens, "novel", seed=1)
    client.flush_cache()
    trace = client.generate(input_ids=prompt.input_ids, stream=True,
                            sampling_params={"max_new_tokens": 64, "ignore_eos": True, "temperature": 0.0})
    rate = sweep_row(trace, context_tokens).get("decode_tok_s")
    if trace.error or not rate:
        raise RuntimeError(f"the calibration request failed or had no decode window: {trace.error}")
    return max(2, min(most, int(decode_seconds * rate)))


def sweep_arm(job: Any) -> list[str]:
    """02's sampled request on the arm's server into its run folder (``params.02_gpu_utilization`` beside it, and
    ``calibration`` with ``decode_seconds``); an error of the request is its row's."""
    from specdiag.serving import make_client  # noqa: PLC0415 - live only: replay loads no server code

    s: SweepSettings = job.settings
    client = make_client(job.url)
    source = open_source(s.telemetry, list(s.gpu_indices))
    new_tokens = s.max_new_tokens
    if s.decode_seconds > 0:
        new_tokens = calibrated_new_tokens(client, s.context_tokens, s.decode_seconds, s.max_new_tokens)
        job.run.update(calibration={"decode_seconds_aimed": s.decode_seconds, "max_new_tokens": new_tokens})
        job.progress(f"{job.arm.name}: {new_tokens} new tokens for about {s.decode_seconds:g} s of decode")
    job.run.update(server_url=job.url, params={NOTEBOOK: {
        "context_tokens": s.context_tokens, "max_new_tokens": new_tokens, "sample_hz": s.sample_hz,
        "telemetry": s.telemetry, "gpu_indices": list(s.gpu_indices), "idle_s": s.idle_s, "seed": s.seed}})
    row = measure_utilization(job.run, client, source, s.context_tokens, new_tokens, sample_hz=s.sample_hz,
                              idle_s=s.idle_s, seed=s.seed, gpu_index=s.gpu_indices[0] if s.gpu_indices else 0)
    job.progress(f"{job.arm.name}: sampled request, step {row.get('step_ms')} ms, error {row.get('error')}")
    return []
