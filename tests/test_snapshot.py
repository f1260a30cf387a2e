"""Unit tests of specdiag.steps.snapshot.settings on synthetic server answers."""

from __future__ import annotations

from specdiag.steps.snapshot import settings as snapshot
from specdiag.serving.redaction import REDACTED, redact


def test_server_settings_pick_known_fields_redacted_and_from_internal_states() -> None:
    info = {"model_path": "org/model", "speculative_algorithm": "EAGLE", "speculative_num_draft_tokens": 4,
            "page_size": 1, "api_key": "sk-abcdefabcdefabcdef12", "unrelated": 3, "tp_size": None,
            "internal_states": [{"max_total_num_tokens": 195011}]}
    rows = {r["key"]: r for r in snapshot.server_settings(info)}
    assert rows["speculative_algorithm"]["value"] == "EAGLE" and rows["page_size"]["value"] == 1
    assert rows["max_total_num_tokens"]["value"] == 195011
    assert "unrelated" not in rows and "tp_size" not in rows and "api_key" not in rows
    assert all(r["source"] == "server-reported" for r in rows.values())
    assert [r["key"] for r in snapshot.server_settings(info)][:2] == ["model_path", "speculative_algorithm"]


def test_count_redacted() -> None:
    info = {"api_key": "sk-abcdefabcdefabcdef12", "launch_command": "sglang --api-key XYZ --tp 8", "tp_size": 8,
            "nested": [{"token": "t0psecret"}], "max_new_tokens": 3}
    red = redact(info)
    assert red["api_key"] == REDACTED and "XYZ" not in red["launch_command"]
    assert snapshot.count_redacted(info, red) == 3


def test_model_settings_and_machine_rows() -> None:
    rows = snapshot.model_settings({"model_path": "m", "architectures": ["X"], "is_generation": True, "junk": 1})
    assert [r["setting"] for r in rows] == ["model_path", "architectures", "is_generation"]
    machine = {"host": "h", "cpu": "c", "cpu_cores": 2, "memory_gib": 3.0,
               "gpus": [{"index": 0, "name": "NVIDIA H200", "memory_gib": 139.8, "sm_count": 132,
                         "compute_capability": "9.0"}]}
    items = {r["item"]: r["value"] for r in snapshot.machine_rows(machine)}
    assert items["GPU 0"] == "NVIDIA H200, 139.8 GiB, 132 SMs, sm_9.0" and items["cpu cores"] == 2
    assert snapshot.machine_rows({"host": "h", "gpus": []})[-1]["value"].startswith("none")
    local = snapshot.local_machine()
    assert local["cpu_cores"] and local["cpu_cores"] >= 1 and isinstance(local["gpus"], list)


def test_peak_finding_labels_each_source_truthfully() -> None:
    """NVML's peak is computed from clocks and bus width, a user's figure is a parameter, the table published."""
    from specdiag.hardware import HardwarePeaks, Peak
    from specdiag.steps.snapshot.findings import peak_finding, peak_rows, snapshot_findings

    def peaks(source: str) -> HardwarePeaks:
        return HardwarePeaks("NVIDIA H200", Peak(4.814e12, source, "detail"), None)  # type: ignore[arg-type]

    expected = {"nvml": ("computed", "computed (NVML clocks x bus width)"),
                "parameter": ("parameter", "parameter (user-supplied)"),
                "table": ("published", "published (table of known GPUs)"),
                "measured": ("measured", "measured (a copy or matmul timed here)"),
                "recorded": ("published", "recorded (run.json)")}
    for source, (finding_source, label) in expected.items():
        f = peak_finding(peaks(source), None, "this machine", recorded_as="published")
        assert f.source == finding_source and f"({label})" in f.verdict, source
        assert peak_rows(peaks(source))[0]["source"] == label
    assert peak_finding(None, "no figure", "remote", "published").severity == "warning"
    found = {f.id: f for f in snapshot_findings({"speculative_algorithm": "NONE", "page_size": 1},
                                                [{"key": "page_size", "value": 1}], None, "x", "remote",
                                                "server-reported")}
    assert found["snapshot.speculation"].severity == "warning"
    assert found["snapshot.attention"].verdict == "KV page size 1 tokens."
    assert found["snapshot.attention"].evidence == ("page_size = 1 (server-reported)",)


def test_record_rows_label_published_and_assumed_config() -> None:
    from specdiag.steps.snapshot.settings import record_rows

    rows = record_rows({"name": "d", "published_config": {"num_hidden_layers": 6},
                        "assumed_config": {"hidden_size": 7168}}, "published")
    assert {"setting": "num_hidden_layers", "value": 6, "source": "published"} in rows
    assert {"setting": "hidden_size", "value": 7168, "source": "assumed (not published)"} in rows
