"""``specdiag sweep --measure snapshot``: what 00 records of each arm's server, without papermill (a GPU host without
Jupyter), into the arm's own run folder (``<out>/<arm>/``), which 00 replays (and 02-05 read).

run.json ``server`` (``/server_info``, redacted), ``model`` (``/model_info`` with the model folder's config.json when
this host can read it: 03 and 05 compute the floors from it on any machine), ``drafter`` (the drafter folder's
config.json and what the server states of it) and ``hardware`` (the run's one set of peaks: the GPU of this host, where
the sweep starts its servers; a running server elsewhere gets none).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from specdiag import hardware
from specdiag.paths import PROJECT_ROOT
from specdiag.serving.locality import is_local_url
from specdiag.serving.redaction import redact
from specdiag.steps.snapshot.settings import local_machine

#: 00 replays one server per run folder: the driver gives each arm its own (specdiag.sweep.driver.arm_run)
PER_ARM = True


@dataclass(frozen=True)
class SweepSettings:
    """00 takes no settings in a sweep (what it records is the server's and this host's)."""


def model_config(path: str | None) -> dict[str, Any] | None:
    """A model folder's config.json (a relative path is the project's), None when this host cannot read it."""
    if not path:
        return None
    folder = Path(path) if Path(path).is_absolute() else PROJECT_ROOT / path
    cfg = folder / "config.json"
    return json.loads(cfg.read_text()) if cfg.is_file() else None


def recorded_models(info: Mapping[str, Any], model_info: Mapping[str, Any], model_path: str | None = None,
                    drafter_path: str | None = None) -> tuple[dict[str, Any], dict[str, Any]]:
    """run.json's ``model`` and ``drafter`` for a server: what it reports, with each folder's config.json where this
    host can read it, so 03 and 05 replay the run without the folders (``geometry.config.recorded_config``)."""
    model_path = model_path or info.get("model_path")
    model = {**model_info, "name": Path(str(model_path or "")).name, "path": model_path,
             "kv_cache_dtype": info.get("kv_cache_dtype"), "model_config": model_config(model_path)}
    drafter_path = drafter_path or info.get("speculative_draft_model_path")
    drafter: dict[str, Any] = {"server_view": {k: v for k, v in info.items() if str(k).startswith("speculative_")}}
    if drafter_path:
        drafter.update(name=Path(str(drafter_path)).name, path=drafter_path, model_config=model_config(drafter_path),
                       config_note="the drafter's own config.json (sliding_window, layer_types); what the server did "
                                   "with it is in server_view and measured by 03")
    return model, drafter


def sweep_arm(job: Any) -> list[str]:
    """The snapshot of the arm's server into its run folder."""
    from specdiag.serving import make_client  # noqa: PLC0415 - live only: replay loads no server code

    client = make_client(job.url)
    info = dict(redact(job.server_info))
    model_info = dict(redact(client.model_info())) if hasattr(client, "model_info") else {}
    model, drafter = recorded_models(info, model_info, job.arm.model, job.arm.speculation.drafter)
    local = is_local_url(job.url)
    try:
        hw: dict[str, Any] = hardware.peaks_for_run(None, None, recorded=None, server_info=info,
                                                    server_url="" if local else job.url).as_dict()
    except ValueError as exc:
        hw = {"error": str(exc)}
    hw.update(where="this machine (the server runs here)" if local else "a server elsewhere",
              machine=local_machine() if local else None, tp_size=info.get("tp_size"))
    job.run.update(server_url=job.url, server=info, model=model, drafter=drafter, hardware=hw)
    job.progress(f"{job.arm.name}: snapshot: {info.get('speculative_algorithm')}, attention "
                 f"{info.get('attention_backend')}, page {info.get('page_size')}, bandwidth "
                 f"{hw.get('memory_bandwidth_gb_s')} GB/s ({hw.get('memory_bandwidth_source')})")
    return []
