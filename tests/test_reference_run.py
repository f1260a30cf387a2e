"""The published run in run-folder form: its rows match the investigation, its geometry gives 13.0 GB."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from specdiag import geometry, hardware
from specdiag.paths import REFERENCE_DIR
from specdiag.runs import Run
from specdiag.runs import rows_source

REFERENCE = REFERENCE_DIR / "ct200-kimi-k26"
#: The investigation's published tables, committed as test data (copied verbatim from its write-up).
TABLES = Path(__file__).parent / "data" / "investigation_tables.md"


def _read_k(text: str) -> int:
    """'1.4k' -> 1400 (the run.json's stated reading: k = 1,000 tokens)."""
    return round(float(text.rstrip("k")) * 1000)


def _table(markdown: str, heading: str) -> list[list[str]]:
    lines = markdown.split(heading, 1)[1].splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.startswith("|"))
    rows = []
    for ln in lines[start:]:
        if not ln.startswith("|"):
            break
        rows.append(ln)
    out = []
    for ln in rows[2:]:
        out.append([c.strip() for c in ln.strip("|").split("|")])
    return out


def test_run_folder_and_sections() -> None:
    run = Run.open(REFERENCE)
    meta = run.meta
    assert rows_source(meta) == "published" and meta["provenance"]["source"] == "published"
    assert meta["server"]["speculative_algorithm"] == "DFLASH" and meta["server"]["page_size"] == 1
    assert meta["server"]["tp_size"] == 8 and meta["server"]["attention_backend"] == "triton"
    assert meta["hardware"]["gpu_count"] == 8 and meta["hardware"]["memory_bandwidth_gb_s"] == 1792
    assert "1,000" in meta["contexts"]["reading"]
    for table in ("sweep", "commit_probe"):
        rows = run.rows(table)
        assert rows and all(r["source"] == "published" and r["error"] is None for r in rows)
        assert [r["context_tokens"] for r in rows] == sorted(r["context_tokens"] for r in rows)


def test_geometry_from_run_json_gives_the_key_number() -> None:
    meta = Run.open(REFERENCE).meta
    geom = geometry.geometry_for_run(run_meta=meta)
    assert geom.attention == "mla" and geom.num_layers == 61 and geometry.local_attention_heads(geom, 8) == 8
    assert geometry.kv_bytes_per_step(geom, 185_000, tp_size=8) / 1e9 == pytest.approx(13.0, abs=0.01)
    drafter = geometry.geometry_for_run(run_meta=meta, role="drafter")
    assert drafter.layer_types.count("sliding_attention") == 5 and drafter.sliding_window == 2048
    peaks = hardware.peaks_for_run(recorded=meta["hardware"])
    assert peaks.memory_bandwidth_gb_s == 1792 and peaks.memory_bandwidth.source == "recorded"


def test_rows_are_exactly_the_published_tables() -> None:
    text = TABLES.read_text()
    run = Run.open(REFERENCE)
    sweep = _table(text, "## Step 1")
    rows = run.rows("sweep")
    assert len(rows) == len(sweep) == 6
    for row, (ctx, tok_s, ms) in zip(rows, sweep):
        assert row["context_tokens"] == _read_k(ctx)
        assert row["decode_tok_s"] == float(tok_s) and row["step_ms"] == float(ms)
        assert row["commit_length"] is None  # not published per context
    probe = _table(text, "## Step 4")
    rows = run.rows("commit_probe")
    assert len(rows) == len(probe) == 4
    for row, (ctx, commit, depth, drafts, wall) in zip(rows, probe):
        assert row["context_tokens"] == _read_k(ctx) and row["kind"] == "predictable"
        assert (row["commit_length"], row["accepted_depth"], row["accepted_drafts"]) == (
            float(commit), float(depth), float(drafts))
        assert row["wall_s"] == float(wall.rstrip(" s"))
    m = re.search(r"At 16k,\s+([\d.]+) s of the ([\d.]+) s wall time was prefill", text)
    assert m and run.rows("commit_probe")[1]["prefill_s"] == float(m.group(1))
    assert float(m.group(2)) == run.rows("commit_probe")[1]["wall_s"]


def test_publication_arithmetic_is_labelled_and_recomputes() -> None:
    """run.json keeps the fact sheet's own arithmetic apart from what it published, and each derived number
    follows from the published rows and the geometry (to the publication's rounding)."""
    meta = Run.open(REFERENCE).meta
    arith = {k: v for k, v in meta["publication_arithmetic"].items() if k != "note"}
    assert not set(arith) & set(meta["published"])
    assert all(set(v) == {"value", "from"} for v in arith.values())
    sweep = {r["context_tokens"]: r for r in Run.open(REFERENCE).rows("sweep")}
    kv_gb = geometry.kv_bytes_per_step(geometry.geometry_for_run(run_meta=meta), 185_000, tp_size=8) / 1e9
    step_s = sweep[185_000]["step_ms"] / 1e3
    assert round(kv_gb, 1) == arith["kv_gb_per_step_185k"]["value"]
    assert round(kv_gb / step_s) == arith["effective_gb_s_185k_over_step"]["value"]  # 13.0 GB / 1.43 s = 9.1
    floor_ms = kv_gb / meta["published"]["peak_tb_s_quoted"]  # GB / (TB/s) = ms
    assert round(floor_ms) == arith["memory_floor_ms_185k_approx"]["value"]  # 7.2 ms
    end_slope = (sweep[185_000]["step_ms"] - sweep[1400]["step_ms"]) / ((185_000 - 1400) / 1000)
    assert round(end_slope, 1) == arith["sweep_step_slope_ms_per_1k_tokens"]["value"]  # 7.74
    assert round(sweep[1400]["decode_tok_s"] / sweep[185_000]["decode_tok_s"]) == arith["sweep_decode_collapse_x"]["value"]


def test_drafter_separates_published_from_assumed_config() -> None:
    drafter = Run.open(REFERENCE).meta["drafter"]
    published, assumed = drafter["published_config"], drafter["assumed_config"]
    assert "model_config" not in drafter and not set(published) & set(assumed)
    # what the investigation states (tests/data/investigation_tables.md, "The deployment")
    assert (published["num_hidden_layers"], published["num_attention_heads"], published["num_key_value_heads"],
            published["head_dim"], published["sliding_window"]) == (6, 64, 8, 128, 2048)
    assert {"hidden_size", "intermediate_size", "vocab_size", "layer_types"} <= set(assumed)
    geom = geometry.geometry_for_run(run_meta={"drafter": drafter}, role="drafter")
    assert "assumed, not published: hidden_size" in geom.source
