"""Notebook 00's sections, one call each (:class:`specdiag.section.Section`: tables and text): the notebook keeps its
parameters, these calls and its prose.

:func:`start` checks the parameters and opens the run (asking the server, or the recorded run when replaying); the
:class:`Snapshot`'s data are computed when a section first asks. Sections: :func:`server` (the settings, redacted),
:func:`model`, :func:`machine` (the hardware and the run's one peak), :func:`findings` (saves the snapshot in
run.json) and :func:`metrics`.
"""

from __future__ import annotations

from functools import cached_property
from typing import Any, Mapping

from specdiag import findings as fnd
from specdiag import hardware, nb
from specdiag.section import Section
from specdiag.serving.locality import is_local_url
from specdiag.serving.redaction import redact
from specdiag.steps.snapshot import findings as snapshot_findings
from specdiag.steps.snapshot import measure
from specdiag.steps.snapshot import settings as snapshot

NOTEBOOK = "00_snapshot"


class Snapshot(nb.Page):
    """What 00's sections share: the server's settings, model, the machine and the run's one peak, each read when
    first asked."""

    notebook = NOTEBOOK

    def __init__(self, params: Mapping[str, Any]) -> None:
        super().__init__(params)
        p = self.params
        nb.check(p["memory_bandwidth_gb_s"] >= 0 and p["matmul_tflops"] >= 0,
                 "memory_bandwidth_gb_s and matmul_tflops must be >= 0 (0 means: find it)")
        self.ctx = nb.start(NOTEBOOK, server_url=p["server_url"], speculative_config=p["speculative_config"],
                            run_dir=p["run_dir"], replay_dir=p["replay_dir"], params=nb.run_params(p))
        self.intro.text(f"run folder: {self.ctx.run.path}")

    @cached_property
    def source_kind(self) -> str:
        """Where the settings came from: the server, a recorded run, or a published transcription."""
        if self.live:
            return "server-reported"
        return "published" if self.ctx.source.meta.get("data_source") == "published" else "recorded"

    @cached_property
    def _infos(self) -> tuple[dict[str, Any], dict[str, Any], int]:
        """``/server_info`` and ``/model_info`` (secrets redacted before anything is kept) and how many values were
        redacted; replaying, the recorded ones."""
        ctx = self.ctx
        if ctx.replaying:
            recorded = ctx.source.meta
            return dict(recorded.get("server") or {}), dict(recorded.get("model") or {}), 0
        raw_info, raw_model = ctx.server_info, ctx.client.model_info()
        info, model = redact(raw_info), redact(raw_model)
        return info, model, snapshot.count_redacted(raw_info, info) + snapshot.count_redacted(raw_model, model)

    @property
    def server_info(self) -> dict[str, Any]:
        return self._infos[0]

    @property
    def model_info(self) -> dict[str, Any]:
        return self._infos[1]

    @cached_property
    def settings(self) -> list[dict[str, Any]]:
        """The settings rows, each with its source."""
        return [{**r, "source": r["source"] if self.source_kind == "server-reported" else self.source_kind}
                for r in snapshot.server_settings(self.server_info)]

    @cached_property
    def local(self) -> bool:
        """The server runs on this machine (its hardware is read here)."""
        return self.live and is_local_url(self.ctx.server_url)

    @cached_property
    def recorded_hardware(self) -> dict[str, Any]:
        return dict(self.ctx.source.meta.get("hardware") or {}) if self.replaying else {}

    @cached_property
    def machine(self) -> dict[str, Any] | None:
        """The server's machine: read here when it runs here, else the recorded run's."""
        return snapshot.local_machine() if self.local else self.recorded_hardware.get("machine")

    @cached_property
    def _peaks(self) -> tuple[Any, str | None]:
        """The run's one peak (``hardware.run_peaks``: resolved once, kept in run.json, read by 02 and 05 of this
        run), or why there is none."""
        p, ctx = self.params, self.ctx
        try:
            return hardware.run_peaks(ctx.run, p["memory_bandwidth_gb_s"] or None, p["matmul_tflops"] or None,
                                      gpu_name=p["gpu_name"], recorded=self.recorded_hardware or None,
                                      server_info=self.server_info,
                                      server_url="" if self.local else
                                      ("recorded run" if ctx.replaying else ctx.server_url)), None
        except ValueError as exc:
            return None, str(exc)

    @property
    def peaks(self) -> Any:
        return self._peaks[0]

    @property
    def peaks_error(self) -> str | None:
        return self._peaks[1]

    @cached_property
    def where(self) -> str:
        return ("recorded run" if self.replaying else "this machine (the server runs here)" if self.local
                else "remote server (this machine's hardware is not the server's)")

    @cached_property
    def hardware(self) -> dict[str, Any]:
        """What run.json keeps as ``hardware``."""
        return {**self.recorded_hardware, **(self.peaks.as_dict() if self.peaks else {}), "where": self.where,
                "machine": self.machine if self.local or self.replaying else None,
                "tp_size": self.server_info.get("tp_size")}

    @cached_property
    def found(self) -> list[fnd.Finding]:
        """The verdicts, after the snapshot is saved in run.json (``server``, ``model``, ``hardware``)."""
        if self.live:  # the configs too, where this host reads the folders: 03 and 05 replay without them
            model, drafter = measure.recorded_models(self.server_info, self.model_info)
            self.ctx.run.update(server=self.server_info, model=model, drafter=drafter, hardware=self.hardware)
        else:
            self.ctx.run.update(server=self.server_info, model=self.model_info, hardware=self.hardware)
        source = "published" if self.source_kind == "published" else "server-reported"
        return snapshot_findings.snapshot_findings(self.server_info, self.settings, self.peaks, self.peaks_error,
                                                   self.where, source)


def start(params: Mapping[str, Any]) -> Snapshot:
    """Check the parameters, then open the run (``nb.start``: reach the server, or open the recorded run)."""
    return Snapshot(params)


def server(sn: Snapshot) -> Section:
    """Section 1: the server's settings (secrets redacted before anything is kept), what it does not report, and
    DFLASH's settings as the server states them."""
    ctx, s = sn.ctx, Section()
    if ctx.replaying:
        s.text(f"replaying the snapshot recorded in {ctx.source.path / 'run.json'}")
    else:
        s.text(f"{ctx.server_url}: {sn._infos[2]} secret value(s) redacted before anything was saved")
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
    if sn.replaying:
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
    """Section 3: whose hardware this is, the machine, the server's memory use and the run's one peak."""
    info, s = sn.server_info, Section()
    s.text(f"hardware of: {sn.where}")
    if sn.machine:
        s.table(snapshot.machine_rows(sn.machine))
    state = (info.get("internal_states") or [{}])[0] if isinstance(info.get("internal_states"), list) else {}
    if state.get("memory_usage"):
        s.text(f"server-reported memory use (GB): {state['memory_usage']}")
    if sn.peaks is not None:
        s.table(snapshot_findings.peak_rows(sn.peaks))
    else:
        s.text(f"peak bandwidth unknown: {sn.peaks_error}")
    return s


def findings(sn: Snapshot) -> Section:
    """Section 4: the snapshot saved in run.json (``server``, ``model``, ``hardware``), then the verdicts
    (``data["found"]``)."""
    return Section(data={"found": sn.found}).html(fnd.to_html(fnd.sort_findings(sn.found)))


def metrics(sn: Snapshot) -> dict[str, Any]:
    info = sn.server_info
    return {"speculative_algorithm": info.get("speculative_algorithm"),
            "speculative_num_draft_tokens": info.get("speculative_num_draft_tokens"),
            "attention_backend": info.get("attention_backend"), "page_size": info.get("page_size"),
            "tp_size": info.get("tp_size"), "context_length": info.get("context_length"),
            "kv_cache_dtype": info.get("kv_cache_dtype"), "hardware_where": sn.where,
            "memory_bandwidth_gb_s": sn.peaks.memory_bandwidth_gb_s if sn.peaks else None}
