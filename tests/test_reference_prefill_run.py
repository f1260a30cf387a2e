"""The figures that data/reference/sglang-h100-mla61-prefill/README.md quotes, recomputed from the run's rows."""

from __future__ import annotations

import json
import re
import statistics
from pathlib import Path

RUN = Path(__file__).resolve().parents[1] / "data" / "reference" / "sglang-h100-mla61-prefill"


def _cells() -> dict[tuple[str, str, int], list[float]]:
    cells: dict[tuple[str, str, int], list[float]] = {}
    for line in (RUN / "engine_ab.jsonl").read_text().splitlines():
        r = json.loads(line)
        if not r.get("error"):
            value = r["ttft_s"] if r["phase"] == "prefill" else r["step_ms"]
            cells.setdefault((r["arm"], r["phase"], int(r["context_tokens"])), []).append(float(value))
    return cells


def _fmt(values: list[float], digits: int) -> str:
    return f"{statistics.median(values):.{digits}f} ({min(values):.{digits}f}-{max(values):.{digits}f})"


def test_the_readme_table_is_the_rows():
    cells = _cells()
    table = {m.group(1): [c.strip() for c in m.group(2).split("|")]
             for m in re.finditer(r"^\| (flashinfer|fi_hybrid_plugin|triton_plugin_prefill) \|(.*)\|$",
                                  (RUN / "README.md").read_text(), re.M)}
    assert set(table) == {"flashinfer", "fi_hybrid_plugin", "triton_plugin_prefill"}
    for arm, quoted in table.items():
        assert all(len(cells[(arm, "prefill", c)]) == 3 for c in (65536, 131072))  # 3 prefills a cell
        assert quoted == [_fmt(cells[(arm, "prefill", 65536)], 3), _fmt(cells[(arm, "prefill", 131072)], 3),
                          _fmt(cells[(arm, "decode", 1024)], 2), _fmt(cells[(arm, "decode", 131072)], 2)], arm


def test_the_ratios_and_the_kernel_rates_quoted_are_the_rows():
    cells, text = _cells(), (RUN / "README.md").read_text()

    def ratio(a, b, phase, ctx):
        x, y = cells[(a, phase, ctx)], cells[(b, phase, ctx)]
        return statistics.median(x) / statistics.median(y), min(x) / max(y), max(x) / min(y)

    r, lo, hi = ratio("fi_hybrid_plugin", "flashinfer", "prefill", 131072)
    assert f"{r:.2f}x (range over requests\n  {lo:.3f}-{hi:.3f}: a tie)" in text and lo <= 1 <= hi
    r, lo, hi = ratio("fi_hybrid_plugin", "flashinfer", "decode", 131072)
    assert f"at 128k {r:.2f}x ({lo:.2f}-{hi:.2f})" in text and hi <= 0.85
    r, lo, hi = ratio("triton_plugin_prefill", "flashinfer", "prefill", 131072)
    assert f"{r:.2f}x FlashInfer's at 128k** ({lo:.2f}-{hi:.2f})" in text and lo > 1.2
    rows = [json.loads(x) for x in (RUN / "kernel_ab_prefill.jsonl").read_text().splitlines()]
    at = {r["arm"]: r["tflops"] for r in rows if r["prefix_tokens"] == 122880 and r.get("part") == "anchors"}
    assert (f"reaches {at['triton']:.0f} TFLOP/s" in text and f"prefill {at['flashinfer_ragged']:.0f}" in text
            and f"`extend_attention_fwd` {at['sglang_extend']:.0f}" in text)
    meta = json.loads((RUN / "run.json").read_text())
    pc, vc = meta["prefill_check"], meta["plugin_check"]
    pcheck = next(v for k, v in pc.items() if k.startswith("triton_plugin_prefill_check"))
    vcheck = next(v for k, v in vc.items() if k.startswith("triton_plugin_prefill_check"))
    assert pcheck["passed"] and vcheck["passed"]
    assert f"{pcheck['calls']:,} recorded prefill calls ({pcheck['prefix_chunk_calls']} of them" in text
    assert f"within {pcheck['max_rel_err']:.2e}".replace("e-03", "e-3") + " of the fp32" in text and f"{vcheck['calls']:,} verify calls" in text


def test_the_readme_of_the_project_quotes_the_run():
    cells = _cells()
    text = " ".join((RUN.parents[2] / "README.md").read_text().split())
    hy, fi = cells[("fi_hybrid_plugin", "decode", 131072)], cells[("flashinfer", "decode", 131072)]
    assert (f"a verify step of {statistics.median(hy):.2f} ms against FlashInfer's {statistics.median(fi):.1f} "
            f"({statistics.median(hy) / statistics.median(fi):.2f}x, range {min(hy) / max(fi):.2f}-"
            f"{max(hy) / min(fi):.2f} over requests)") in text
    assert f"({statistics.median(cells[('fi_hybrid_plugin', 'prefill', 131072)]):.2f} s at 128k tokens, a tie)" in text
    tp, fp = cells[("triton_plugin_prefill", "prefill", 131072)], cells[("flashinfer", "prefill", 131072)]
    assert (f"the first token at {statistics.median(tp) / statistics.median(fp):.2f}x FlashInfer's "
            f"({statistics.median(tp):.2f} s at 128k, the same H100)") in text
