"""Launching a real SGLang server (``python -m sglang.launch_server``) for users who have one installed.

- ``SGLangLaunch``: the settings, one typed field per flag this suite cares about.
- ``sglang_command(launch)`` / ``sglang_env(launch)``: the argument list and the environment it needs
  (pure functions: nothing is checked or started).
- ``check_sglang(launch)``: fail early, naming the fix, when sglang is not importable by that Python
  or a model folder is missing; returns the installed sglang version.
- ``sglang_server(launch, ...)``: a ``ManagedServer`` that starts it and waits for ``/health_generate``.

Flag names are SGLang 0.5.17's (sglang/srt/server_args.py: each ``ServerArgs`` field ``x_y`` is the
flag ``--x-y``; ``--cuda-graph-max-bs`` is there only as a deprecated alias of
``--cuda-graph-max-bs-decode``). The defaults are those the H200 runs used
(SGLang 0.5.17 on one H200, 2026-11-30; docs/gpu-runs.md): Triton attention, page size 1, PyTorch sampling, no grammar backend,
decode CUDA graphs for batch size 1 (the suite sends one request at a time).
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Mapping

from specdiag.process import DEFAULT_HOST, ManagedServer

#: Algorithms whose draft comes from a separate draft model (SGLang's EAGLE family without NEXTN,
#: which uses the target's own MTP layers).
DRAFT_MODEL_ALGORITHMS = frozenset({"STANDALONE", "EAGLE", "EAGLE3"})
#: SGLang runs these through its EAGLE worker: --speculative-num-steps, --speculative-eagle-topk and
#: --speculative-num-draft-tokens are given together or not at all (SGLang asserts it).
EAGLE_FAMILY = DRAFT_MODEL_ALGORITHMS | {"NEXTN"}
#: DFlash's block drafter (srt/speculative/dflash_worker_v2.py): a drafter folder, one block of
#: ``--speculative-dflash-block-size`` tokens per verify step; SGLang forces num_steps and topk to 1 itself.
DFLASH = "DFLASH"
KNOWN_ALGORITHMS = ("NONE", "NGRAM", DFLASH, *sorted(EAGLE_FAMILY))


class SGLangLaunchError(ValueError):
    """The launch settings cannot work; the message names the fix."""


@dataclass(frozen=True)
class SGLangLaunch:
    """How to start one SGLang server. ``None`` leaves a setting to SGLang's own default."""

    model_path: Path | str  # target model folder (--model-path)
    draft_model_path: Path | str | None = None  # drafter folder, for STANDALONE / EAGLE / EAGLE3 / DFLASH
    algorithm: str = "NONE"  # NONE | NGRAM | STANDALONE | EAGLE | EAGLE3 | NEXTN | DFLASH
    num_draft_tokens: int | None = None  # tokens per verify step (--speculative-num-draft-tokens)
    num_steps: int | None = None  # drafter steps (EAGLE family; default num_draft_tokens - 1)
    topk: int | None = None  # drafter branching per step (EAGLE family; default 1)
    dflash_block_size: int | None = None  # DFLASH: tokens per block (--speculative-dflash-block-size)
    draft_window_size: int | None = None  # DFLASH: context tokens the drafter keeps (--speculative-draft-window-size)
    draft_attention_backend: str | None = None  # drafter's kernels (--speculative-draft-attention-backend)
    max_total_tokens: int | None = None  # KV pool size in tokens (--max-total-tokens); caps DFLASH's drafter pool too
    attention_backend: str | None = "triton"  # --attention-backend (triton: no FA3 needed)
    page_size: int | None = 1  # tokens per KV page (--page-size)
    context_length: int | None = None  # tokens; beyond the model's max_position_embeddings is allowed
    mem_fraction_static: float | None = None  # GPU memory fraction for weights + KV pool
    tp_size: int = 1  # tensor-parallel GPUs
    host: str = DEFAULT_HOST
    port: int = 0  # 0: a free port, picked at start
    enable_metrics: bool = True  # Prometheus /metrics (the suite reads speculative counters there)
    sampling_backend: str | None = "pytorch"  # --sampling-backend
    grammar_backend: str | None = "none"  # --grammar-backend (none: no xgrammar compile at start)
    cuda_graph_max_bs: int | None = 1  # --cuda-graph-max-bs-decode: decode graphs up to this batch
    extra_args: tuple[str, ...] = ()  # appended verbatim (may override anything above)
    env: Mapping[str, str] = field(default_factory=dict)  # added to the server's environment
    python: str = sys.executable  # the interpreter that has sglang

    def __post_init__(self) -> None:
        object.__setattr__(self, "extra_args", tuple(str(a) for a in self.extra_args))
        object.__setattr__(self, "env", dict(self.env))

    @property
    def algorithm_name(self) -> str:
        return (self.algorithm or "NONE").upper()

    def speculative_settings(self) -> tuple[int | None, int | None, int | None]:
        """(num_steps, topk, num_draft_tokens) as they will be passed; raises SGLangLaunchError."""
        algo = self.algorithm_name
        steps, topk, draft = self.num_steps, self.topk, self.num_draft_tokens
        if algo != DFLASH and (self.dflash_block_size is not None or self.draft_window_size is not None):
            raise SGLangLaunchError(f"{algo} takes no block size or draft window (DFLASH settings): drop "
                                    "BLOCK_SIZE / DRAFT_WINDOW, or set ALGORITHM=DFLASH")
        if algo == DFLASH:
            return self._dflash_settings()
        if algo == "NONE":
            if any(v is not None for v in (steps, topk, draft)) or self.draft_model_path:
                raise SGLangLaunchError("algorithm NONE takes no drafter, draft tokens, steps or topk; "
                                        "set an algorithm (NGRAM, STANDALONE, ...) or drop them")
            return None, None, None
        if algo == "NGRAM":
            if self.draft_model_path:
                raise SGLangLaunchError("NGRAM drafts from the text itself and takes no drafter: drop "
                                        "draft_model_path (DRAFT_MODEL with make) or use STANDALONE")
            if steps is not None or topk is not None:
                raise SGLangLaunchError("NGRAM ignores num_steps and topk (SGLang derives them from "
                                        "num_draft_tokens and its ngram BFS breadth): leave them unset")
            return None, None, draft
        if algo in EAGLE_FAMILY:
            if steps is None and topk is None and draft is None:
                return None, None, None  # SGLang chooses all three
            topk = 1 if topk is None else topk
            if steps is None:
                if draft is None:
                    raise SGLangLaunchError(f"{algo}: give num_draft_tokens (or num_steps)")
                if topk != 1:
                    raise SGLangLaunchError(f"{algo} with topk {topk}: give num_steps too (SGLang needs "
                                            "steps, topk and draft tokens together)")
                steps = draft - 1
            if draft is None:
                draft = steps + 1 if topk == 1 else None
                if draft is None:
                    raise SGLangLaunchError(f"{algo} with topk {topk}: give num_draft_tokens too")
            if topk == 1 and draft != steps + 1:
                raise SGLangLaunchError(f"{algo} with topk 1 verifies num_steps + 1 tokens: num_draft_tokens "
                                        f"{draft} with num_steps {steps} would be changed by SGLang to "
                                        f"{steps + 1}; make them agree")
            return steps, topk, draft
        return steps, topk, draft  # another registered algorithm: passed as given

    def _dflash_settings(self) -> tuple[None, None, int | None]:
        """DFLASH's checks that need no files (speculative_hook._handle_dflash): a drafter, steps and topk left to
        SGLang (it forces both to 1), a block size equal to the draft tokens when both are given, a window no
        smaller than the block. The drafter's config is checked against the target's by check_sglang."""
        from specdiag.geometry.dflash import DFlashConfigError, check_draft_window, resolve_block_size  # noqa: PLC0415

        if not self.draft_model_path:
            raise SGLangLaunchError("DFLASH needs a DFlash drafter: set draft_model_path (DRAFT_MODEL=<folder> with "
                                    "make); python data/models/make_dflash_drafter.py --target TARGET --out DIR "
                                    "writes a random one")
        if self.num_steps is not None or self.topk is not None:
            raise SGLangLaunchError("DFLASH drafts one block per step: leave num_steps and topk unset (SGLang forces "
                                    "both to 1)")
        try:
            block = resolve_block_size(None, self.dflash_block_size, self.num_draft_tokens)
            if self.draft_window_size is not None and self.draft_window_size <= 0:
                raise DFlashConfigError(f"draft window {self.draft_window_size} must be a positive number of tokens")
            if self.dflash_block_size is not None or self.num_draft_tokens is not None:
                check_draft_window(self.draft_window_size, block)
        except DFlashConfigError as exc:
            raise SGLangLaunchError(str(exc)) from None
        return None, None, self.num_draft_tokens


def sglang_command(launch: SGLangLaunch) -> list[str]:
    """``python -m sglang.launch_server ...`` for ``launch`` (its port must be set: 0 is resolved at start)."""
    algo = launch.algorithm_name
    if algo in DRAFT_MODEL_ALGORITHMS and not launch.draft_model_path:
        raise SGLangLaunchError(f"{algo} needs a drafter: set draft_model_path (DRAFT_MODEL=... with make)")
    steps, topk, draft = launch.speculative_settings()
    cmd = [launch.python, "-m", "sglang.launch_server",
           "--model-path", str(launch.model_path),
           "--host", launch.host, "--port", str(launch.port),
           "--tp-size", str(launch.tp_size)]
    if algo != "NONE":
        cmd += ["--speculative-algorithm", algo]
        if launch.draft_model_path:
            cmd += ["--speculative-draft-model-path", str(launch.draft_model_path)]
        for flag, value in (("--speculative-num-steps", steps), ("--speculative-eagle-topk", topk),
                            ("--speculative-num-draft-tokens", draft)):
            if value is not None:
                cmd += [flag, str(value)]
        for flag, value in (("--speculative-dflash-block-size", launch.dflash_block_size),
                            ("--speculative-draft-window-size", launch.draft_window_size)):
            if value is not None:
                cmd += [flag, str(value)]
    if launch.draft_attention_backend is not None:
        cmd += ["--speculative-draft-attention-backend", launch.draft_attention_backend]
    for flag, value in (("--attention-backend", launch.attention_backend), ("--page-size", launch.page_size),
                        ("--context-length", launch.context_length),
                        ("--mem-fraction-static", launch.mem_fraction_static),
                        ("--max-total-tokens", launch.max_total_tokens),
                        ("--sampling-backend", launch.sampling_backend),
                        ("--grammar-backend", launch.grammar_backend),
                        ("--cuda-graph-max-bs-decode", launch.cuda_graph_max_bs)):
        if value is not None:
            cmd += [flag, str(value)]
    if launch.enable_metrics:
        cmd.append("--enable-metrics")
    return cmd + [str(a) for a in launch.extra_args]


def sglang_env(launch: SGLangLaunch) -> dict[str, str]:
    """Environment variables the server needs on top of the caller's (launch.env wins)."""
    env = {"HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}
    if launch.context_length is not None:  # allow contexts beyond the config's max_position_embeddings
        env["SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN"] = "1"
    return {**env, **dict(launch.env)}


PLUGIN_MODES = ("splitkv", "upstream", "off")
#: the plugin's KV slot allocators (plugins/sglang/specdiag_sglang_plugin/contiguous.py, SPECDIAG_SGLANG_KV_ALLOC)
KV_ALLOCS = ("sglang", "contiguous")


def plugin_env(verify: str, *, site: str = "", plugin_path: str = "", stats_dir: str | os.PathLike[str] | None = None,
               plugin_on_path: bool | None = None, kv_alloc: str = "sglang") -> dict[str, str]:
    """Environment of one SGLang server for the specdiag plugin in mode ``verify`` (splitkv, upstream or off).

    PYTHONPATH: SGLang's ``site`` first, then ``plugin_path`` (by default only when the plugin is on), then the
    project's lib/ (the kernel). SGLang 0.5.17 loads every installed plugin by default, so ``off`` is said
    (SPECDIAG_SGLANG_VERIFY=off), not left to a missing SGLANG_PLUGINS: a plugin kept on the path with its kernel off
    (``plugin_on_path=True``) still records what it is asked to (layout, stats under ``stats_dir``).
    ``kv_alloc``: SGLang's KV slot allocator (``sglang``) or the plugin's contiguous one (``contiguous``, which puts
    the plugin on the path whatever ``verify`` is), always said (SPECDIAG_SGLANG_KV_ALLOC).
    """
    if verify not in PLUGIN_MODES:
        raise ValueError(f"plugin mode {verify!r} is not one of {', '.join(PLUGIN_MODES)}")
    if kv_alloc not in KV_ALLOCS:
        raise ValueError(f"KV allocator {kv_alloc!r} is not one of {', '.join(KV_ALLOCS)}")
    on_path = (verify != "off" or kv_alloc != "sglang") if plugin_on_path is None else plugin_on_path
    from specdiag.paths import PROJECT_ROOT  # noqa: PLC0415

    paths = [p for p in (site, plugin_path if on_path else "", str(PROJECT_ROOT / "lib")) if p]
    env = {"PYTHONPATH": os.pathsep.join(paths), "SPECDIAG_SGLANG_VERIFY": verify, "SPECDIAG_SGLANG_KV_ALLOC": kv_alloc}
    if verify != "off":
        env["SGLANG_PLUGINS"] = "specdiag_splitkv"
    if stats_dir is not None:
        env["SPECDIAG_SGLANG_STATS"] = str(stats_dir)
    return env


def check_dflash_drafter(launch: SGLangLaunch) -> None:
    """For DFLASH with both folders on this machine: the drafter's config.json is a DFlash one that fits the target
    (hidden size, target layer ids <= L - 2, mask token id, its block size against the flags); SGLangLaunchError
    naming the fix otherwise. Other algorithms: nothing."""
    if launch.algorithm_name != DFLASH:
        return
    from specdiag.geometry.dflash import DFlashConfigError, check_dflash_launch  # noqa: PLC0415

    try:
        check_dflash_launch(launch.draft_model_path, launch.model_path, launch.dflash_block_size,
                            launch.num_draft_tokens, launch.draft_window_size)
    except DFlashConfigError as exc:
        raise SGLangLaunchError(str(exc)) from None


_VERSION_PROBE = ("import importlib.metadata as m, importlib.util as u, sys\n"
                  "if u.find_spec('sglang') is None: sys.exit(3)\n"
                  "print(m.version('sglang'))\n")


def check_sglang(launch: SGLangLaunch, timeout_s: float = 60.0) -> str:
    """The sglang version ``launch.python`` would run; raises SGLangLaunchError naming the fix when
    sglang is not importable there (with the launch's environment, e.g. its PYTHONPATH) or a model
    folder is missing. Does not import sglang (that takes tens of seconds and needs a GPU stack)."""
    for label, path in (("model", launch.model_path), ("drafter", launch.draft_model_path)):
        if path and not Path(path).is_dir():
            raise SGLangLaunchError(f"no {label} folder at {path}: give the folder of a Hugging Face-format "
                                    f"model (config.json, weights, tokenizer); SGLang is started offline")
    launch.speculative_settings()
    check_dflash_drafter(launch)
    try:
        proc = subprocess.run([launch.python, "-c", _VERSION_PROBE], capture_output=True, text=True,  # noqa: S603
                              timeout=timeout_s, env={**os.environ, **sglang_env(launch)}, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise SGLangLaunchError(f"cannot run the Python {launch.python!r} to look for sglang: {exc}; pass the "
                                "Python that has sglang (--engine-python, or SGLANG_PYTHON=... with make)") from exc
    if proc.returncode != 0:
        why = "is not installed" if proc.returncode == 3 else f"cannot be inspected ({proc.stderr.strip()[-300:]})"
        raise SGLangLaunchError(
            f"sglang {why} for {launch.python}: install it there (pip install 'sglang==0.5.17' on a GPU host), "
            "point --engine-python (SGLANG_PYTHON=... with make) at a Python that has it, or put an unpacked "
            "SGLang first on PYTHONPATH (docs/gpu-runs.md)")
    return proc.stdout.strip()


def sglang_server(launch: SGLangLaunch, *, log_path: Path | str | None = None, startup_timeout_s: float = 900.0,
                  stop_grace_s: float = 20.0, progress: bool = True, check: bool = True) -> ManagedServer:
    """A ManagedServer for ``launch`` (not started: use it in ``with``). ``check`` runs check_sglang first.

    The ready URL is /health_generate, which answers only once a generation has gone through (SGLang
    compiles kernels and captures CUDA graphs first: about 75 s without a drafter and 165 s with one on
    the H200, measured 2026-11-30). ``server.info`` holds the engine name,
    the sglang version (when checked) and the Python."""
    version = check_sglang(launch) if check else None
    sglang_command(launch)  # raise settings errors now, before a port is taken
    check_dflash_drafter(launch)

    def command(port: int) -> list[str]:
        return sglang_command(replace(launch, port=port))

    return ManagedServer(command, name=f"SGLang ({launch.algorithm_name})", host=launch.host, port=launch.port,
                         ready_path="/health_generate", env=sglang_env(launch), log_path=log_path,
                         startup_timeout_s=startup_timeout_s, stop_grace_s=stop_grace_s, progress=progress,
                         info={"engine": "sglang", "version": version, "python": launch.python})


def sglang_launch(*, algorithm: str = "STANDALONE", num_draft_tokens: int | None = None,
                  model_path: Path | str | None = None, draft_model_path: Path | str | None = None,
                  **fields: object) -> SGLangLaunch:
    """An SGLangLaunch with the embedded server's defaults: the shipped tiny target, its drafter for
    draft-model algorithms, STANDALONE with 8 tokens per verify step; any other SGLangLaunch field by
    name. With algorithm NONE the draft settings are dropped. DFLASH takes no default drafter (the shipped
    drafter is not a DFlash one) and no default draft tokens: its block comes from ``dflash_block_size``,
    ``num_draft_tokens`` or the drafter's config, as SGLang resolves it."""
    from specdiag.paths import MODELS_DIR  # noqa: PLC0415

    algo = (algorithm or "NONE").upper()
    if num_draft_tokens is None and algo not in ("NONE", DFLASH):
        num_draft_tokens = 8
    if algo == "NONE":
        num_draft_tokens = None
        for key in ("num_steps", "topk"):
            fields.pop(key, None)
        draft_model_path = None
    elif algo in DRAFT_MODEL_ALGORITHMS and draft_model_path is None:
        draft_model_path = MODELS_DIR / "drafter"
    known = set(SGLangLaunch.__dataclass_fields__)
    unknown = sorted(set(fields) - known)
    if unknown:
        raise SGLangLaunchError(f"the sglang engine takes no option {', '.join(unknown)}; "
                                f"it takes: {', '.join(sorted(known))}")
    return SGLangLaunch(model_path=model_path or MODELS_DIR / "target", draft_model_path=draft_model_path,
                        algorithm=algo, num_draft_tokens=num_draft_tokens, **fields)  # type: ignore[arg-type]


@dataclass(frozen=True)
class PluginServing:
    """How a server with the plugin is configured when the user named no attention backend (:func:`plugin_serving`)."""

    attention_backend: str  # --attention-backend
    extra_args: tuple[str, ...]  # the flags that route decode and verify to the Triton backend
    draft_attention_backend: str | None  # --speculative-draft-attention-backend
    env: Mapping[str, str]  # the plugin's prefill switch where the Triton backend prefills
    why: str  # one line for the log: which prefill and verify paths run


def plugin_serving(algorithm: str, flashinfer: bool, draft_attention_backend: str | None = None) -> PluginServing:
    """The one configuration fast at both prefill and verify with the plugin's split-KV kernel (pure).

    With FlashInfer importable: FlashInfer prefills (its chunked-prefix MHA form), Triton decodes and verifies
    (``--decode-attention-backend triton --speculative-attention-mode decode``) through the plugin; a DFLASH drafter
    keeps Triton attention (SGLang would move it to FlashInfer, about 3 ms a step at 1k on an H100). Without it: the
    Triton backend for all, long prompt chunks in the MHA form on the plugin's prefill kernel
    (``SPECDIAG_SGLANG_PREFILL=mha``)."""
    if flashinfer:
        draft = draft_attention_backend or ("triton" if (algorithm or "").upper() == DFLASH else None)
        return PluginServing("flashinfer", ("--decode-attention-backend", "triton", "--speculative-attention-mode",
                                            "decode"), draft, {},
                             "FlashInfer is importable: prefill on FlashInfer (chunked-prefix MHA form), decode and "
                             "verify on the Triton backend through the plugin's split-KV kernel")
    return PluginServing("triton", (), draft_attention_backend, {"SPECDIAG_SGLANG_PREFILL": "mha"},
                         "FlashInfer is not importable: the Triton backend, verify on the plugin's split-KV kernel and "
                         "long prompt chunks in the MHA form on its prefill kernel")


_FLASHINFER_PROBE = "import importlib.util as u, sys\nsys.exit(0 if u.find_spec('flashinfer') else 4)\n"


def has_flashinfer(launch: SGLangLaunch, timeout_s: float = 60.0) -> bool:
    """Whether ``launch.python`` (with the launch's environment) can import FlashInfer (found, not imported)."""
    try:
        proc = subprocess.run([launch.python, "-c", _FLASHINFER_PROBE], capture_output=True, text=True,  # noqa: S603
                              timeout=timeout_s, env={**os.environ, **sglang_env(launch)}, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return proc.returncode == 0


def with_plugin_serving(launch: SGLangLaunch, flashinfer: bool) -> tuple[SGLangLaunch, str]:
    """``launch`` configured by :func:`plugin_serving` (the user's own extra args kept after its flags)."""
    ps = plugin_serving(launch.algorithm_name, flashinfer, launch.draft_attention_backend)
    return replace(launch, attention_backend=ps.attention_backend, draft_attention_backend=ps.draft_attention_backend,
                   extra_args=(*ps.extra_args, *launch.extra_args), env={**ps.env, **dict(launch.env)}), ps.why


def sglang_engine(*, log_path: Path | str | None = None, startup_timeout_s: float = 900.0, progress: bool = True,
                  check: bool = True, **options: object) -> ManagedServer:
    """The registry's ``sglang`` engine: ``sglang_server(sglang_launch(**options))``, not started. With the plugin's
    split-KV verify asked for (``SPECDIAG_SGLANG_VERIFY=splitkv``, what ``make ... PLUGIN=splitkv`` sets) and no
    attention backend named, the server takes :func:`plugin_serving`'s configuration and the log says which."""
    launch = sglang_launch(**options)  # type: ignore[arg-type]
    if options.get("attention_backend") is None and os.environ.get("SPECDIAG_SGLANG_VERIFY", "").strip() == "splitkv":
        launch, why = with_plugin_serving(launch, has_flashinfer(launch))
        print(f"[sglang] plugin splitkv, no attention backend named: {why} (--attention-backend "
              f"{launch.attention_backend}{' ' + ' '.join(launch.extra_args) if launch.extra_args else ''})",
              file=sys.stderr, flush=True)
    return sglang_server(launch, log_path=log_path, startup_timeout_s=startup_timeout_s, progress=progress,
                         check=check)


__all__ = ["DFLASH", "DRAFT_MODEL_ALGORITHMS", "EAGLE_FAMILY", "KNOWN_ALGORITHMS", "PluginServing", "SGLangLaunch",
           "SGLangLaunchError", "check_dflash_drafter", "check_sglang", "sglang_command", "sglang_engine", "sglang_env",
           "sglang_launch", "sglang_server", "plugin_serving", "with_plugin_serving"]
