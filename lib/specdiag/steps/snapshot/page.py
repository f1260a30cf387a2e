"""Notebook 00's sections, one call each (:class:`specdiag.section.Section`: tables and text): the notebook keeps its
parameters, these calls and its prose.

:func:`start` checks the parameters and opens the run (asking the server, or the recorded run when replaying); then
:func:`server` (the settings, redacted), :func:`model`, :func:`machine` (the hardware and the run's one peak),
:func:`findings` (saves the snapshot in run.json) and :func:`metrics`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

from specdiag import nb
from specdiag.section import Section
from specdiag.steps.snapshot import findings as snapshot_findings
from specdiag.steps.snapshot import settings as snapshot

NOTEBOOK = "00_snapshot"


@dataclass
class Snapshot:
    """What 00's sections share: the notebook context, its parameters and what each section read."""

    ctx: Any
    params: dict[str, Any]
    opening: Section
    source_kind: str = "server-reported"
    server_info: dict[str, Any] = field(default_factory=dict)
    model_info: dict[str, Any] = field(default_factory=dict)
    settings: list[dict[str, Any]] = field(default_factory=list)
    peaks: Any = None
    peaks_error: str | None = None
    where: str = ""
    hardware: dict[str, Any] = field(default_factory=dict)


def start(server_url: str = "", run_dir: str = "", replay_dir: str = "",
          speculative_config: Mapping[str, Any] | None = None, gpu_name: str = "", memory_bandwidth_gb_s: float = 0.0,
          matmul_tflops: float = 0.0) -> Snapshot:
    """Check the parameters, then open the run (``nb.start``: reach the server, or open the recorded run)."""
    nb.check(memory_bandwidth_gb_s >= 0 and matmul_tflops >= 0,
             "memory_bandwidth_gb_s and matmul_tflops must be >= 0 (0 means: find it)")
    params = dict(gpu_name=gpu_name, memory_bandwidth_gb_s=memory_bandwidth_gb_s, matmul_tflops=matmul_tflops)
    ctx = nb.start(NOTEBOOK, server_url=server_url, speculative_config=speculative_config or {}, run_dir=run_dir,
                   replay_dir=replay_dir, params=params)
    return Snapshot(ctx, params, Section().text(f"run folder: {ctx.run.path}"))


def server(sn: Snapshot) -> Section:
    """Section 1: the server's settings (secrets redacted before anything is kept), what it does not report, and
    DFLASH's settings as the server states them."""
    from specdiag.serving.redaction import redact  # noqa: PLC0415

    ctx, s = sn.ctx, Section()
    if ctx.replaying:
        recorded = ctx.source.meta
        sn.source_kind = "published" if recorded.get("data_source") == "published" else "recorded"
        sn.server_info, sn.model_info = dict(recorded.get("server") or {}), dict(recorded.get("model") or {})
        s.text(f"replaying the snapshot recorded in {ctx.source.path / 'run.json'}")
    else:
        raw_info, raw_model = ctx.server_info, ctx.client.model_info()
        sn.server_info, sn.model_info = redact(raw_info), redact(raw_model)
        n_redacted = snapshot.count_redacted(raw_info, sn.server_info) + snapshot.count_redacted(raw_model, sn.model_info)
        s.text(f"{ctx.server_url}: {n_redacted} secret value(s) redacted before anything was saved")
    sn.settings = [{**r, "source": r["source"] if sn.source_kind == "server-reported" else sn.source_kind}
                   for r in snapshot.server_settings(sn.server_info)]
    s.table(sn.settings, {"setting": "setting", "key": "key", "value": "value", "source": "source"})
    unreported = snapshot.not_reported(ctx.settings)
    if unreported:
        s.text(f"not reported by this server ({sn.server_info.get('engine') or 'sglang'}), so left out, never guessed: "
               + "; ".join(unreported))
    dflash = snapshot.dflash_rows(None if ctx.replaying else ctx.settings, sn.server_info)
    if dflash:
        s.text("DFLASH as the server states it (an empty value is one it does not state; the source says why):")
        s.table(dflash, {"setting": "setting", "value": "value", "source": "source"})
    return s


def model(sn: Snapshot) -> Section:
    """Section 2: what ``/model_info`` says (and, replaying, the recorded drafter)."""
    s, columns = Section(), {"setting": "setting", "value": "value", "source": "source"}
    if sn.ctx.replaying:
        model_rows = snapshot.record_rows(sn.model_info, sn.source_kind)
        drafter_rows = snapshot.record_rows(sn.ctx.source.meta.get("drafter") or {}, sn.source_kind)
    else:
        model_rows, drafter_rows = snapshot.model_settings(sn.model_info), []
    if model_rows:
        s.table(model_rows, columns)
    else:
        s.text("the server reported no model_info fields")
    if drafter_rows:
        s.text("drafter (recorded):")
        s.table(drafter_rows, columns)
    return s


def machine(sn: Snapshot) -> Section:
    """Section 3: whose hardware this is, the machine, the server's memory use and the run's one peak
    (``hardware.run_peaks``: resolved once, kept in run.json, read by 02 and 05 of this run)."""
    from specdiag import hardware  # noqa: PLC0415
    from specdiag.serving.locality import is_local_url  # noqa: PLC0415

    ctx, p, info, s = sn.ctx, sn.params, sn.server_info, Section()
    local = ctx.live and is_local_url(ctx.server_url)
    recorded_hw = dict(ctx.source.meta.get("hardware") or {}) if ctx.replaying else {}
    found_machine = snapshot.local_machine() if local else recorded_hw.get("machine")
    try:
        sn.peaks = hardware.run_peaks(ctx.run, p["memory_bandwidth_gb_s"] or None, p["matmul_tflops"] or None,
                                      gpu_name=p["gpu_name"], recorded=recorded_hw or None, server_info=info,
                                      server_url="" if local else ("recorded run" if ctx.replaying else ctx.server_url))
    except ValueError as exc:
        sn.peaks_error = str(exc)
    sn.where = ("recorded run" if ctx.replaying else "this machine (the server runs here)" if local
                else "remote server (this machine's hardware is not the server's)")
    s.text(f"hardware of: {sn.where}")
    if found_machine:
        s.table(snapshot.machine_rows(found_machine))
    state = (info.get("internal_states") or [{}])[0] if isinstance(info.get("internal_states"), list) else {}
    if state.get("memory_usage"):
        s.text(f"server-reported memory use (GB): {state['memory_usage']}")
    if sn.peaks is not None:
        s.table(snapshot_findings.peak_rows(sn.peaks))
    else:
        s.text(f"peak bandwidth unknown: {sn.peaks_error}")
    sn.hardware = {**recorded_hw, **(sn.peaks.as_dict() if sn.peaks else {}), "where": sn.where,
                   "machine": found_machine if local or ctx.replaying else None, "tp_size": info.get("tp_size")}
    return s


def findings(sn: Snapshot) -> Section:
    """Section 4: the snapshot saved in run.json (``server``, ``model``, ``hardware``), then the verdicts
    (``data["found"]``)."""
    from specdiag import findings as fnd  # noqa: PLC0415

    sn.ctx.run.update(server=sn.server_info, model=sn.model_info, hardware=sn.hardware)
    source = "published" if sn.source_kind == "published" else "server-reported"
    found = snapshot_findings.snapshot_findings(sn.server_info, sn.settings, sn.peaks, sn.peaks_error, sn.where, source)
    return Section(data={"found": found}).html(fnd.to_html(fnd.sort_findings(found)))


def metrics(sn: Snapshot) -> dict[str, Any]:
    info = sn.server_info
    return {"speculative_algorithm": info.get("speculative_algorithm"),
            "speculative_num_draft_tokens": info.get("speculative_num_draft_tokens"),
            "attention_backend": info.get("attention_backend"), "page_size": info.get("page_size"),
            "tp_size": info.get("tp_size"), "context_length": info.get("context_length"),
            "kv_cache_dtype": info.get("kv_cache_dtype"), "hardware_where": sn.where,
            "memory_bandwidth_gb_s": sn.peaks.memory_bandwidth_gb_s if sn.peaks else None}
