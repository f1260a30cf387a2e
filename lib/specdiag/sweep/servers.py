"""An arm's server: its environment and command (pure functions of the arm and the host), and :func:`serving`, which
holds the arm's server for the length of a block (started, then always stopped; a running server as it is).

The host's paths are not arm data: :class:`Host` holds SGLang's site folder, the installed plugin, the Python to run
and the folder where each arm's plugin stats and server log go. Each flag and variable an arm configures reaches its
server's command or environment here (tests/test_sweep_servers.py checks every one).
"""

from __future__ import annotations

import contextlib
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping

from specdiag.sweep.arms import Arm

#: NVLink multicast stays off on shared multi-GPU hosts (NCCL_NVLS_ENABLE=0 and friends): SGLang 0.5.17 then hangs at
#: TP > 1 in FlashInfer's all-reduce fusion and its custom all-reduce (both set up symmetric memory), seen on two H200s
PARALLEL_FLAGS = ("--disable-custom-all-reduce", "--enforce-disable-flashinfer-allreduce-fusion")
#: variables a run folder does not keep (paths of this host, or secrets by name)
UNRECORDED_ENV = ("PYTHONPATH",)


@dataclass(frozen=True)
class Host:
    """Where this host keeps what the servers need."""

    work: Path  # per-arm plugin stats (stats-<arm>/) and server logs (server-<arm>.log)
    site: str = ""  # SGLang's site folder, first on an SGLang server's PYTHONPATH ("" : installed normally)
    plugin_path: str = ""  # the installed plugin (pip --target), put on the path where an arm uses it
    python: str = sys.executable  # the Python that runs the servers
    device: str = "auto"  # the embedded engine's device
    extra_env: Mapping[str, str] = field(default_factory=dict)  # the measurement's additions (e.g. a recorder dir)

    def stats_dir(self, arm: Arm) -> Path:
        """Where the arm's plugin writes its stats: the sweep's own folder, or a running server's ``stats_dir``."""
        return Path(arm.stats_dir) if arm.stats_dir else self.work / f"stats-{arm.name}"

    def log_path(self, arm: Arm) -> Path:
        return self.work / f"server-{arm.name}.log"


def plugin_used(arm: Arm) -> bool:
    """True when the SGLang plugin is importable by the arm's server (its kernel on, its allocator, or asked for)."""
    if arm.engine != "sglang":
        return False
    if arm.plugin_on_path is not None:
        return arm.plugin_on_path or arm.plugin != "off" or arm.kv_alloc != "sglang"
    return arm.plugin != "off" or arm.kv_alloc != "sglang"


def arm_env(arm: Arm, host: Host) -> dict[str, str]:
    """The server's environment on top of this process's: the plugin's mode, allocator, stats folder and path
    (SGLang), SGLang's forced acceptance, the measurement's additions, then the arm's own ``env`` (which wins); none
    for a running server (its environment is its own)."""
    if arm.running:
        return {}
    env: dict[str, str] = {}
    if arm.engine == "sglang":
        from specdiag.launchers.sglang import plugin_env  # noqa: PLC0415

        on_path = plugin_used(arm)
        env = plugin_env(arm.plugin, site=host.site, plugin_path=host.plugin_path,
                         stats_dir=host.stats_dir(arm) if on_path else None, plugin_on_path=on_path,
                         kv_alloc=arm.kv_alloc)
    if arm.speculation.simulate_acc_len is not None:
        env["SGLANG_SIMULATE_ACC_LEN"] = f"{arm.speculation.simulate_acc_len:g}"
    return {**env, **dict(host.extra_env), **dict(arm.env)}


def recorded_env(env: Mapping[str, str]) -> dict[str, str]:
    """An arm's environment as run.json keeps it: no host paths, secrets redacted."""
    from specdiag.serving.redaction import redact  # noqa: PLC0415

    return redact({k: v for k, v in env.items() if k not in UNRECORDED_ENV})


def parallel_flags(arm: Arm) -> tuple[str, ...]:
    """Expert parallelism (``--ep-size``, EPLB) and, over several GPUs, NCCL's all-reduce in place of the two that
    need NVLink multicast (``--tp-size`` is the launcher's own field)."""
    flags: tuple[str, ...] = ()
    if arm.ep > 1:
        flags += ("--ep-size", str(arm.ep)) + (("--enable-eplb",) if arm.eplb else ())
    if arm.tp > 1 or arm.ep > 1:
        flags += PARALLEL_FLAGS
    return flags


def sglang_launch(arm: Arm, host: Host) -> Any:
    """The arm as an :class:`~specdiag.launchers.sglang.SGLangLaunch` (DFLASH: the drafter, num_draft_tokens = its
    block, the window)."""
    from specdiag.launchers.sglang import SGLangLaunch  # noqa: PLC0415

    spec = arm.speculation
    dflash = spec.algorithm == "DFLASH"
    block = spec.tokens_per_step if dflash else None
    fields: dict[str, Any] = {}
    if arm.attention_backend:
        fields["attention_backend"] = arm.attention_backend
    return SGLangLaunch(model_path=str(arm.model), algorithm=spec.algorithm,
                        num_draft_tokens=block if dflash else spec.draft_tokens,
                        draft_model_path=spec.drafter, dflash_block_size=block,
                        draft_window_size=spec.window if dflash else None,
                        context_length=arm.context_length, max_total_tokens=arm.max_total_tokens,
                        mem_fraction_static=arm.mem_fraction, tp_size=arm.tp,
                        extra_args=("--log-level", "info", *parallel_flags(arm), *arm.flags),
                        env=arm_env(arm, host), python=host.python, **fields)


def embedded_command(arm: Arm, host: Host, port: int) -> list[str]:
    """``python -m specdiag.localserver ...`` for an embedded arm."""
    spec = arm.speculation
    cmd = [host.python, "-m", "specdiag.localserver", "--host", "127.0.0.1", "--port", str(port),
           "--device", host.device, "--speculative-algorithm", spec.algorithm, "--kv-alloc", arm.kv_alloc]
    for flag, value in (("--model-path", arm.model), ("--speculative-draft-model-path", spec.drafter),
                        ("--speculative-num-draft-tokens", spec.draft_tokens),
                        ("--speculative-dflash-block-size", spec.block_size),
                        ("--speculative-draft-window-size", spec.window),
                        ("--context-length", arm.context_length), ("--max-total-tokens", arm.max_total_tokens)):
        if value is not None:
            cmd += [flag, str(value)]
    return cmd + list(arm.flags)


def vllm_options(arm: Arm, host: Host) -> dict[str, Any]:
    """The keyword options of specdiag.launchers' ``vllm`` engine for an arm."""
    spec = arm.speculation
    return {"algorithm": spec.algorithm, "num_draft_tokens": spec.draft_tokens, "model_path": arm.model,
            "draft_model_path": spec.drafter, "context_length": arm.context_length, "extra_args": arm.flags,
            "dflash_block_size": spec.block_size, "draft_window_size": spec.window, "log_path": host.log_path(arm),
            "progress": False}


def server_command(arm: Arm, host: Host, port: int = 0) -> list[str]:
    """The command an arm's server runs (pure; raises the launcher's settings errors, naming the fix); [] for a running
    server."""
    if arm.running:
        return []
    if arm.engine == "embedded":
        return embedded_command(arm, host, port)
    if arm.engine == "sglang":
        from dataclasses import replace  # noqa: PLC0415

        from specdiag.launchers.sglang import sglang_command  # noqa: PLC0415

        return sglang_command(replace(sglang_launch(arm, host), port=port))
    from specdiag.launchers.vllm import patched_drafter_dir, vllm_command, vllm_launch  # noqa: PLC0415

    opts = vllm_options(arm, host)
    launch = vllm_launch(**{k: opts[k] for k in ("algorithm", "num_draft_tokens", "model_path", "draft_model_path",
                                                  "context_length", "extra_args", "dflash_block_size",
                                                  "draft_window_size")})
    # draft_model: the launcher serves its full-attention copy of the drafter (specdiag.launchers.vllm), named here
    drafter_dir = patched_drafter_dir(launch.drafter) if launch.method == "draft_model" else None
    return vllm_command(launch, port, drafter_dir=drafter_dir)  # vLLM's own Python (.venv-vllm)


@dataclass(frozen=True)
class Running:
    """A server the sweep did not start (an arm with ``url``): what :func:`serving` yields for it."""

    url: str
    command: None = None  # started elsewhere: its server info records its settings
    ready_after_s: None = None


@contextlib.contextmanager
def serving(arm: Arm, host: Host, startup_timeout_s: float, wait_s: float | None = None,
            log: Callable[[str], None] = print) -> Iterator[Any]:
    """The arm's server for the length of the block: started (ready within ``wait_s``, default
    ``startup_timeout_s``) and stopped when the block ends, however it ends (an error, Ctrl-C, SIGTERM: the process
    tree ended as the launchers do; a failed stop is said through ``log``, not raised over the block's own error).
    A running server (``url``) is yielded as it is: neither started nor stopped. Yields what has ``url``,
    ``command`` and ``ready_after_s``."""
    if arm.running:
        yield Running(str(arm.url))
        return
    server = make_server(arm, host, startup_timeout_s)
    try:
        server.start(timeout_s=startup_timeout_s if wait_s is None else wait_s)
        yield server
    finally:
        try:
            server.stop()
        except Exception as exc:  # noqa: BLE001 - said; the next arm still starts
            log(f"{arm.name}: stop failed: {exc}")


def make_server(arm: Arm, host: Host, startup_timeout_s: float) -> Any:
    """The arm's server, not started (``start()``, then always ``stop()``: :func:`serving` does both)."""
    from specdiag.process import ManagedServer  # noqa: PLC0415

    host.work.mkdir(parents=True, exist_ok=True)
    if arm.engine == "embedded":
        return ManagedServer(lambda port: embedded_command(arm, host, port), name=f"embedded ({arm.name})",
                             ready_path="/health", log_path=host.log_path(arm), env=arm_env(arm, host),
                             startup_timeout_s=startup_timeout_s, stop_grace_s=8, progress=False)
    if arm.engine == "sglang":
        from specdiag.launchers.sglang import sglang_server  # noqa: PLC0415

        return sglang_server(sglang_launch(arm, host), log_path=host.log_path(arm), startup_timeout_s=startup_timeout_s,
                             stop_grace_s=8, progress=False, check=False)
    from specdiag.launchers import engine_server  # noqa: PLC0415

    server = engine_server("vllm", startup_timeout_s=startup_timeout_s, **vllm_options(arm, host))
    server.env.update(arm_env(arm, host))
    return server
