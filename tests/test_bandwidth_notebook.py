"""Notebook 05 replays the published investigation and states its numbers, computed by the code."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable

import pytest

from specdiag.paths import PROJECT_ROOT, REFERENCE_DIR

REFERENCE = REFERENCE_DIR / "ct200-kimi-k26"


def _result(run_dir: Path) -> dict[str, Any]:
    return json.loads((run_dir / "findings" / "05_bandwidth_analysis.json").read_text())


@pytest.mark.notebook
def test_replay_reference_run(run_notebook: Callable[..., Path], tmp_path: Path) -> None:
    out = run_notebook("05_bandwidth_analysis", replay_dir=str(REFERENCE))
    res = _result(tmp_path / "run")
    m = res["metrics"]
    assert m["source"] == "published" and m["tp_size"] == 8 and m["draft_tokens"] == 8
    assert m["peak_gb_s"] == 1792 and m["peak_source"] == "recorded"
    assert m["context_tokens"] == [1400, 11000, 32000, 64000, 128000, 185000]
    h = m["headline"]
    assert h["context_tokens"] == 185_000
    # Hand arithmetic: 185,000 tokens x 61 layers x (512 + 64) values x 2 B, replicated on each of 8 GPUs.
    kv = 185_000 * 61 * 576 * 2
    assert h["kv_gb_per_step"] == pytest.approx(kv / 1e9)               # 13.0 GB
    assert h["kv_floor_ms"] == pytest.approx(1e3 * kv / 1792e9)          # 7.25 ms
    assert h["measured_ms"] == 1430
    assert h["effective_gb_s_kv"] == pytest.approx(kv / 1.43 / 1e9)      # 9.09 GB/s
    assert h["effective_gb_s_kv"] == pytest.approx(9.1, abs=0.05)
    assert h["pct_of_peak_kv"] == pytest.approx(100 * kv / 1.43 / 1792e9)  # 0.507 %
    assert h["pct_of_peak_kv"] == pytest.approx(0.5, abs=0.01)
    # With the weights each GPU reads (INT4 routed experts, bf16 attention/shared/head, 1/8 of each shard).
    assert h["total_gb_per_step"] > h["kv_gb_per_step"]
    assert h["memory_floor_ms"] == pytest.approx(1e3 * h["total_gb_per_step"] * 1e9 / 1792e9)
    # Compute floor: 2 x 8 local heads x 8 tokens x 185,000 x (576 + 512) x 61 FLOP at 503.8 TFLOPS.
    assert h["compute_floor_ms"] == pytest.approx(1e3 * 2 * 8 * 8 * 185_000 * 1088 * 61 / 503.8e12)
    assert h["measured_over_floor_x"] > 100  # "roughly 100x above the memory floor"
    # Slopes: the floor grows 1,000 x 61 x 1,152 B per 1k tokens at 1,792 GB/s; the step ~7.4 ms per 1k.
    assert m["floor_slope_ms_per_1k_tokens"] == pytest.approx(1e3 * 1000 * 61 * 1152 / 1792e9)
    assert m["measured_slope_ms_per_1k_tokens"] == pytest.approx(7.7, rel=0.06)
    # The investigation's "about 7.7 ms per additional 1,000 tokens": (1430 - 8.4) ms / (185 - 1.4) k tokens.
    assert m["measured_endpoint_slope_ms_per_1k_tokens"] == pytest.approx((1430 - 8.4) / (185 - 1.4))
    ids = {f["id"]: f for f in res["findings"]}
    assert ids["bandwidth.far_from_floor"]["severity"] == "critical"
    assert ids["bandwidth.slope"]["severity"] == "critical"
    assert ids["bandwidth.attention_only"]["numbers"]["implied_attention_s"] == pytest.approx(kv / 14e9)
    # The page states the numbers in prose, from the code.
    text = out.read_text()
    assert "13.0 GB of KV" in text and "7.25 ms" in text and "9.09 GB/s" in text and "0.507% of peak" in text


@pytest.mark.notebook
def test_parameters_win_and_bad_input_is_named(run_notebook: Callable[..., Path], tmp_path: Path) -> None:
    run_notebook("05_bandwidth_analysis", replay_dir=str(REFERENCE), memory_bandwidth_gb_s=4800.0,
                 model_config="deepseek-v3", kv_dtype="fp8", headline_context=128000)
    m = _result(tmp_path / "run")["metrics"]
    assert m["peak_gb_s"] == 4800 and m["peak_source"] == "parameter"
    assert m["headline"]["kv_gb_per_step"] == pytest.approx(128_000 * 61 * 576 * 1 / 1e9)
    import papermill

    with pytest.raises(papermill.PapermillExecutionError, match="expert_routing"):
        run_notebook("05_bandwidth_analysis", replay_dir=str(REFERENCE), expert_routing="random")


def _errors(executed: Path) -> list[list[str]]:
    return [o["traceback"] for cell in json.loads(executed.read_text())["cells"] for o in cell.get("outputs", [])
            if o["output_type"] == "error"]


@pytest.mark.notebook
def test_a_bad_parameter_stops_05_in_one_line_before_any_server_starts(tmp_path: Path) -> None:
    """No server_url and no replay_dir: 05 would start the embedded server. A context_lengths of the wrong type, and
    then one out of range, fail on the page in their one line before nb.start: no run folder, no server."""
    import papermill

    from specdiag.paths import NOTEBOOKS_DIR
    from specdiag.report.execute import KERNEL_START_TIMEOUT_S

    for bad, message in (("1k,lots", "context_lengths: 'lots' is not a token count; give a whole number of tokens such "
                                     "as 4096, or 1k / 32k / 128k (k = 1,024 tokens): set it in the parameters cell, or "
                                     "with papermill -p context_lengths VALUE (make: PARAMS=file.yaml)"),
                         ([1024, -1], "context_lengths must hold positive whole token counts; -1 is not one")):
        run_dir, out = tmp_path / "run", tmp_path / "05.out.ipynb"
        with pytest.raises(papermill.PapermillExecutionError, match="ParameterError"):
            papermill.execute_notebook(str(NOTEBOOKS_DIR / "05_bandwidth_analysis.ipynb"), str(out),
                                       parameters={"run_dir": str(run_dir), "context_lengths": bad}, kernel_name="python3",
                                       cwd=str(NOTEBOOKS_DIR), progress_bar=False, start_timeout=KERNEL_START_TIMEOUT_S)
        assert _errors(out) == [[f"ParameterError: {message}"]]
        assert not run_dir.exists(), "nb.start ran (it opens the run folder before it starts or reaches a server)"
        assert "embedded" not in _page(out)  # no server was started or reached: no line about one


@pytest.mark.notebook
@pytest.mark.slow
def test_live_embedded_server(run_notebook: Callable[..., Path], tmp_path: Path, embedded_server: Any) -> None:
    """05 on a live run: a small sweep on the embedded server, the target's config.json, the host's peak."""
    from specdiag.serving import SGLangClient
    from specdiag.geometry import DTYPE_BYTES

    info = SGLangClient(embedded_server.url).server_info()
    run_notebook("05_bandwidth_analysis", server_url=embedded_server.url, context_lengths=[256, 1024],
                 max_new_tokens=16)
    res = _result(tmp_path / "run")
    m = res["metrics"]
    assert m["source"] == "measured" and m["tp_size"] == 1
    assert m["context_tokens"] == [256, 1024]
    cfg = json.loads((PROJECT_ROOT / info["model_path"] / "config.json").read_text())
    kv_heads = cfg.get("num_key_value_heads") or cfg["num_attention_heads"]
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    dtype = info["kv_cache_dtype"] if info.get("kv_cache_dtype") not in (None, "auto") else info.get("dtype", "bfloat16")
    per_token_layer = 2 * kv_heads * head_dim * DTYPE_BYTES[dtype]
    window = cfg.get("sliding_window")
    spans = [min(1024, window) if t == "sliding_attention" else 1024
             for t in cfg.get("layer_types") or ["full_attention"] * cfg["num_hidden_layers"]]
    h = m["headline"]
    assert h["context_tokens"] == 1024
    assert h["kv_gb_per_step"] == pytest.approx(sum(spans) * per_token_layer / 1e9)
    assert h["measured_ms"] > 0 and h["effective_gb_s_kv"] == pytest.approx(h["kv_gb_per_step"] / (h["measured_ms"] / 1e3))
    if info.get("device") == "cpu":
        assert m["peak_source"] in ("measured", "parameter")
    assert {f["id"] for f in res["findings"]} >= {"bandwidth.far_from_floor", "bandwidth.slope"}
    rows = [json.loads(ln) for ln in (tmp_path / "run" / "sweep.jsonl").read_text().splitlines()]
    assert len(rows) == 2 and all(r["error"] is None for r in rows)


@pytest.mark.notebook
def test_plugin_arm_with_its_stock_pair_projects_per_layer(run_notebook: Callable[..., Path], tmp_path: Path) -> None:
    """05 on a plugin run with the stock run of the same call as its pair (measured steps, computed rest), on an
    untraced pair (data/reference/sglang-h200-mla2-plugin-check-bf16 and its stock/): the step-based projection, and
    one line saying why there is no traced one. The traced pair (params/plugin-projection.yaml):
    tests/test_plugin_reference_runs.py."""
    check = REFERENCE_DIR / "sglang-h200-mla2-plugin-check-bf16"
    # the run records no hardware: the H200's peaks as parameters, else 05 would time this machine's CPU (a bf16
    # matmul, about 20 s here), which no assertion below reads
    run_notebook("05_bandwidth_analysis", replay_dir=str(check), stock_dir=str(check / "stock"), project_layers=61,
                 project_context=185000, memory_bandwidth_gb_s=4800.0, matmul_tflops=989.0)
    pair = _result(tmp_path / "run")["metrics"]["stock_pair"]
    assert pair["layers_measured"] == 2 and pair["layers_target"] == 61 and pair["extrapolated"]
    last = pair["rows"][-1]
    assert last["context_tokens"] == 131072
    # (57.77 - 5.94 ms) / 2 layers, the measured steps of the two committed sweeps
    assert last["saved_per_layer_ms"] == pytest.approx((last["stock_step_ms"] - last["fixed_step_ms"]) / 2)
    assert last["saved_per_layer_ms"] == pytest.approx(25.92, abs=0.01)
    assert last["projected_saved_ms"] == pytest.approx(61 * last["saved_per_layer_ms"])
    assert pair["target_stock_growth_ms"] > pair["target_fixed_growth_ms"] > 0
    # these two runs were not traced: the traced projection says so in one line
    res = _result(tmp_path / "run")["metrics"]
    assert res["traced_projection"] is None and res["traced_vs_step_growth"] == []
    assert res["traced_projection_missing"].startswith("no traces: stock has no step_profile rows")


@pytest.mark.notebook
@pytest.mark.slow  # the same execution (this run, no stock_dir) and assertion: test_sglang_0517_replay's MLA test
def test_without_a_stock_pair_there_is_no_projection(run_notebook: Callable[..., Path], tmp_path: Path) -> None:
    run_notebook("05_bandwidth_analysis", replay_dir=str(REFERENCE_DIR / "sglang-h200-mla2-stock-185k"))
    assert _result(tmp_path / "run")["metrics"]["stock_pair"] is None


def _page(executed: Path) -> str:
    """Every text, Markdown and HTML output of an executed notebook, joined."""
    texts = []
    for cell in json.loads(executed.read_text())["cells"]:
        for o in cell.get("outputs", []):
            data = o.get("data", {})
            texts.append("".join(o.get("text", "")) + "".join(data.get("text/markdown", ""))
                         + "".join(data.get("text/html", "")))
    return "\n".join(texts)


def assert_tables_formatted(name: str, page: str) -> None:
    """No raw pandas table on a page: no index column (a DataFrame's ``dataframe`` class, a Styler's row headings),
    no 'nan' cell, no float header such as '65536.0'."""
    import re

    assert 'class="dataframe"' not in page, f"{name} shows a raw pandas DataFrame"
    assert "row_heading" not in page, f"{name} shows a table with its index column"
    assert not re.search(r"<td[^>]*>\s*(nan|NaN|None)\s*</td>", page), f"{name} shows an empty cell as nan/None"
    assert not re.search(r"<th[^>]*>\s*\d+\.0\s*</th>", page), f"{name} shows a float header"


@pytest.mark.notebook
@pytest.mark.slow
def test_one_run_has_one_peak_bandwidth_in_every_notebook(run_notebook: Callable[..., Path], tmp_path: Path,
                                                          embedded_server: Any) -> None:
    """A CPU `make report` gave the peak as 13.1 GB/s in 00 and 05 and 17 GB/s in 02: 02 timed a copy of its own.
    00, 02 and 05 of one run, live on the embedded server (a CPU: the peak is a measured host copy), must state the
    same figure, the one run.json records."""
    from specdiag import hardware
    from specdiag.runs import Run

    run_dir = str(tmp_path / "one")
    pages = {
        "00_snapshot": run_notebook("00_snapshot", server_url=embedded_server.url, run_dir=run_dir),
        "02_gpu_utilization": run_notebook("02_gpu_utilization", server_url=embedded_server.url, run_dir=run_dir,
                                           context_tokens=256, max_new_tokens=16, idle_s=0.2, telemetry="cpu"),
        "05_bandwidth_analysis": run_notebook("05_bandwidth_analysis", server_url=embedded_server.url, run_dir=run_dir,
                                              context_lengths=[256], max_new_tokens=16),
    }
    run = Run.open(run_dir)
    results = run.results()
    stated = {"00_snapshot": results["00_snapshot"]["metrics"]["memory_bandwidth_gb_s"],
              "02_gpu_utilization": results["02_gpu_utilization"]["metrics"]["peak_gb_s"],
              "05_bandwidth_analysis": results["05_bandwidth_analysis"]["metrics"]["peak_gb_s"]}
    recorded = run.meta["hardware"]["memory_bandwidth_gb_s"]
    assert set(stated.values()) == {recorded}, f"the notebooks of one run disagree on the peak: {stated}"
    shown = hardware.gb_s(recorded)
    for name, executed in pages.items():
        page = _page(executed)
        assert shown in page, f"{name} does not show the run's peak {shown}"
        assert_tables_formatted(name, page)
    (request,) = run.rows("telemetry_request")
    assert request["hardware"]["memory_bandwidth_gb_s"] == recorded


@pytest.mark.notebook
def test_prefill_floor_and_the_projection_from_a_run_at_depth(run_notebook: Callable[..., Path], tmp_path: Path) -> None:
    """05 on a 2-layer plugin run: its TTFTs against the prefill floor with the server's chunk size; and, with a run at
    61 layers that has Triton's decode steps (depth_dir), the projection to the investigation uses those steps as
    measured (no layer scaling) and sets them against the published 1,430 ms at 185k."""
    from specdiag.runs import Run
    from specdiag.steps.bandwidth_analysis import verify_projection as vp

    depth = Run.create(tmp_path / "depth", label="t")
    cfg = json.loads((REFERENCE_DIR / "sglang-h200-mla61-engine-ab" / "config.json").read_text())
    depth.update(model={"model_config": cfg}, device={"gpu": "NVIDIA H200"})
    t = 0.0
    for ctx, ms in ((1024, 19.7), (65536, 841.0), (131072, 1657.0)):
        for r in range(3):
            depth.append_row("engine_ab", {"arm": "triton", "phase": "decode", "context_tokens": ctx, "repeat": r,
                                           "ts_unix_s": t, "e2e_s": 1.0, "step_ms": ms, "ttft_s": 0.2, "error": None,
                                           "commit_length": 1.0, "decode_tok_s": 1000 / ms, "cached_tokens": ctx - 1,
                                           "concurrent": 1})
            t += 2.0
    check = REFERENCE_DIR / "sglang-h200-mla2-plugin-check-bf16"
    run_notebook("05_bandwidth_analysis", replay_dir=str(check), stock_dir=str(check / "stock"),
                 depth_dir=str(depth.path), gpu_name="NVIDIA H200")
    res = _result(tmp_path / "run")
    m = res["metrics"]
    d = m["investigation_projection"]
    assert d["method"] == "measured at depth" and d["layers_measured"] == 61 and d["arm"] == "triton"
    fit = vp.fit_context([(1024, 19.7), (65536, 841.0), (131072, 1657.0)])
    assert d["projected_ms"] == pytest.approx(fit.at(185_000)) and d["published_ms"] == 1430
    assert d["range_ms"] == pytest.approx([d["projected_ms"], d["projected_ms"] * 4800 / 1792])
    assert m["prefill_chunk_tokens"] == 8192
    last = m["prefill"][-1]
    assert last["ttft_over_floor_x"] == pytest.approx(last["ttft_s"] / last["floor_s"])
    assert "bandwidth.prefill_floor" in {f["id"] for f in res["findings"]}
