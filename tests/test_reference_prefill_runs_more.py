"""The figures the READMEs of the recommended configuration's other recorded runs quote, recomputed from their rows:
NGRAM on an H200 (sglang-h200-mla61-engine-ab/hybrid), the MHA prefill's greedy identity
(sglang-h100-mla61-prefill/identity-h200), the live report (sglang-h200-mla61-dflash-live) and the hybrid after its
causal-block fix beside pure Triton on tuned tiles (sglang-h100-mla61-prefill/causal-block-tma)."""

from __future__ import annotations

import json
import re
import statistics
from pathlib import Path

REF = Path(__file__).resolve().parents[1] / "data" / "reference"


def _rows(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def _text(path: Path) -> str:
    return " ".join(path.read_text().split())


def test_the_ngram_hybrid_readme_is_its_rows():
    run = REF / "sglang-h200-mla61-engine-ab" / "hybrid"
    cells: dict[tuple[str, str, int], list[float]] = {}
    for r in _rows(run / "engine_ab.jsonl"):
        if not r.get("error"):
            cells.setdefault((r["arm"], r["phase"], int(r["context_tokens"])), []).append(
                float(r["ttft_s"] if r["phase"] == "prefill" else r["step_ms"]))
    assert {r.get("machine") for r in _rows(run / "engine_ab.jsonl")} != {None}
    assert len({r["machine"] for r in _rows(run / "engine_ab.jsonl")}) == 1  # one machine: requests compare
    table = {m.group(1): [c.strip() for c in m.group(2).split("|")]
             for m in re.finditer(r"^\| (flashinfer|fi_hybrid_plugin) \|(.*)\|$", (run / "README.md").read_text(), re.M)}

    def step(v: list[float]) -> str:
        return f"{statistics.median(v):.2f} ({min(v):.2f}-{max(v):.2f})"
    for arm, quoted in table.items():
        assert all(len(cells[(arm, "prefill", c)]) == 3 for c in (65536, 131072, 185000))
        assert quoted == [f"{statistics.median(cells[(arm, 'prefill', c)]):.3f}" for c in (65536, 131072, 185000)] + [
            step(cells[(arm, "decode", c)]) for c in (1024, 131072, 185000)], arm
    text = _text(run / "README.md")

    def ratio(phase: str, ctx: int, digits: int) -> str:
        a, b = cells[("fi_hybrid_plugin", phase, ctx)], cells[("flashinfer", phase, ctx)]
        r = statistics.median(a) / statistics.median(b)
        return f"{r:.{digits}f}x ({min(a) / max(b):.{digits}f}-{max(a) / min(b):.{digits}f})"
    assert f"TTFT at 64k {ratio('prefill', 65536, 2)}, at 128k {ratio('prefill', 131072, 2)}" in text
    assert f"the verify step at 128k {ratio('decode', 131072, 3)}, at most 0.85x" in text
    project = _text(REF.parents[1] / "README.md")  # the fix section quotes the NGRAM run too
    assert (f"(TTFT {ratio('prefill', 131072, 2).split('x')[0]}x FlashInfer's at 128k, verify step "
            f"{ratio('decode', 131072, 3).split('x')[0]}x, `sglang-h200-mla61-engine-ab/hybrid`)") in project


def test_the_identity_readme_is_its_judgement():
    run = REF / "sglang-h100-mla61-prefill" / "identity-h200"
    ident = json.loads((run / "run.json").read_text())["identity"]["arms"]
    ctl, mha = ident["stock_repeat"], ident["prefill_mha"]
    text = _text(run / "README.md")
    assert f"{ctl['identical']} of {ctl['prompts']} prompts identical (the control" in text
    assert (f"{mha['identical']} of {mha['prompts']} prompts identical, {mha['rounding_ties']} differ at a rounding tie"
            in text and mha["differs"] == 0 and f"{mha['differs']} differ elsewhere" in text)
    margins = [d["margin"] for d in mha["differences"]]
    assert f"margin {min(margins):g} to {max(margins):.3f} nats" in text
    assert all(d["context_tokens"] <= 2000 for d in mha["differences"])  # "The 7 ties are all short prompts"


def test_the_live_readme_is_its_rows():
    run = REF / "sglang-h200-mla61-dflash-live"
    rows = _rows(run / "sweep.jsonl")
    by = {c: [r for r in rows if r["context_tokens"] == c] for c in (1024, 65536, 131072)}
    med = {c: {k: statistics.median(float(r[k]) for r in g) for k in ("step_ms", "decode_tok_s", "ttft_s")}
           for c, g in by.items()}
    assert all(len(g) == 3 for g in by.values())
    text = _text(run / "README.md")
    lo, hi = med[1024], med[131072]
    assert (f"from {lo['step_ms']:.2f} ms at 1k to {hi['step_ms']:.2f} ms at 128k ({lo['decode_tok_s']:.0f} to "
            f"{hi['decode_tok_s']:.0f} decode tokens/s, {lo['decode_tok_s'] / hi['decode_tok_s']:.2f}x)") in text
    assert (f"{lo['ttft_s']:.3f} s at 1k, {med[65536]['ttft_s']:.2f} s at 64k, {hi['ttft_s']:.2f} s at 128k"
            in text)
    probe = _rows(run / "commit_probe.jsonl")
    assert {r["kind"] for r in probe} == {"predictable", "novel"} and max(r["commit_length"] for r in probe) <= 1.1
    assert "about 1 token per verify step of at most 8, on predictable and novel text alike" in text


def test_the_live_readme_quotes_its_kernel_rows_and_its_time():
    run = REF / "sglang-h200-mla61-dflash-live"
    us = {(r["arm"], r["context_tokens"]): r["us"] for r in _rows(run / "kernel_ab.jsonl") if r.get("us")}
    ratios = [us[("plugin", c)] / us[("flashinfer_mla", c)] for c in (16384, 131072)]
    best = min(v for (arm, c), v in us.items() if c == 131072 and arm != "baseline")
    text = _text(run / "README.md")
    assert f"takes {min(ratios):.2f}-{max(ratios):.2f}x FlashInfer's MLA kernel's time" in text
    assert f"without a KV split {us[('baseline', 131072)] / best:.0f}x slower than the best at 128k" in text
    total = sum(r["duration_s"] for r in json.loads((run / "run.json").read_text())["report"]["results"])
    assert f"the 8 notebooks {total:.0f} s" in text
    quick = _text(REF.parents[1] / "params" / "quick.yaml")
    assert f"measured: {total:.0f} s for 00-07 on an H200" in quick


def test_the_causal_block_readme_is_its_rows():
    """sglang-h100-mla61-prefill/causal-block-tma: the table, the intervals 09 computes, the causal-block count and
    06's kernel rates it quotes."""
    from specdiag.stats import ratio_interval

    run = REF / "sglang-h100-mla61-prefill" / "causal-block-tma"
    cells: dict = {}
    for r in _rows(run / "engine_ab.jsonl"):
        if not r.get("error"):
            cells.setdefault((r["arm"], r["phase"], r["context_tokens"]), []).append(
                float(r["ttft_s"] if r["phase"] == "prefill" else r["step_ms"]))
    text = _text(run / "README.md")

    def fmt(v, d):
        return f"{statistics.median(v):.{d}f} ({min(v):.{d}f}-{max(v):.{d}f})"

    for arm in ("fi_hybrid_plugin", "triton_plugin_prefill"):
        assert all(len(cells[(arm, p, c)]) == 3 for p, c in (("prefill", 131072), ("decode", 1024), ("decode", 131072)))
        assert (f"| {arm} | {fmt(cells[(arm, 'prefill', 131072)], 3)} | {fmt(cells[(arm, 'decode', 1024)], 2)} | "
                f"{fmt(cells[(arm, 'decode', 131072)], 2)} |") in text
    hyb, tri = ("fi_hybrid_plugin", "decode"), ("triton_plugin_prefill", "decode")
    lo, hi, _ = ratio_interval(cells[(*hyb, 1024)], cells[(*tri, 1024)])
    r = statistics.median(cells[(*tri, 1024)]) / statistics.median(cells[(*hyb, 1024)])
    assert f"At 1k the hybrid is faster: {r:.2f}x (90% interval {lo:.2f}-{hi:.2f}x" in text and lo > 1
    at_1k = f"{r:.2f}x (90% interval {lo:.2f}-{hi:.2f}x)"
    lo, hi, _ = ratio_interval(cells[(*hyb, 131072)], cells[(*tri, 131072)])
    r = statistics.median(cells[(*tri, 131072)]) / statistics.median(cells[(*hyb, 131072)])
    assert f"At 128k the two tie: {r:.2f}x ({lo:.3g}-{hi:.3g}x)" in text and lo < 1 < hi
    ttft = (statistics.median(cells[("triton_plugin_prefill", "prefill", 131072)])
            / statistics.median(cells[("fi_hybrid_plugin", "prefill", 131072)]))
    assert f"6.547 s against the hybrid's 4.836 at 128k, {ttft:.2f}x" in text and ttft > 1.2
    stats = json.loads((run / "run.json").read_text())["plugin_stats"]
    hybrid = stats["fi_hybrid_plugin (part 1)"][0]
    assert f"`served_causal` {hybrid['served_causal']} of {hybrid['served']}" in text
    assert hybrid["served_causal"] == hybrid["served"] > 0
    errors = stats["triton_plugin_prefill (part 1)"][0]["prefill"]["declined"]["kernel error: CompilationError"]
    assert f"{errors} calls in `plugin_stats`" in text
    rates = {(r["prefix_tokens"], r["arm"]): r for r in _rows(run / "kernel_ab_prefill.jsonl")}
    assert all(r["correct"] and r["rel_err"] <= 2.33e-3 + 5e-6 for r in rates.values())
    for spec, arm in (("128:64:8:3:tma", "triton_m128_n64_w8_s3_tma"), ("64:64:4:3:tma", "triton_m64_n64_w4_s3_tma")):
        assert f"| {spec} | {rates[(65536, arm)]['tflops']:.0f} | {rates[(122880, arm)]['tflops']:.0f} |" in text
    best = max((r for (p, _), r in rates.items() if p == 122880), key=lambda r: r["tflops"])
    assert best["arm"] == "triton_m128_n64_w8_s3_tma" and f"{best['pct_matmul']:.0f}% of the run's measured" in text
    # the pages that quote this run
    default = rates[(122880, "triton")]["tflops"]
    docs = _text(REF.parents[1] / "docs" / "gpu-runs.md")
    assert f"128:64:8:3:tma: {best['tflops']:.0f} TFLOP/s on an 8k chunk after 123k tokens against the default's " \
           f"{default:.0f}" in docs
    index = _text(REF / "README.md")
    assert (f"({hybrid['served_causal']} of {hybrid['served']} calls), its step {at_1k[:5]} faster than pure "
            f"Triton's at 1k and a tie at 128k, pure Triton on 06's fastest tiles (128:64:8:3:tma, {best['tflops']:.0f} TFLOP/s) "
            f"{ttft:.2f}x the hybrid's TTFT at 128k") in index
    parent = _text(REF / "sglang-h100-mla61-prefill" / "README.md")
    assert (f"`served_causal` {hybrid['served_causal']} of {hybrid['served']}, and the hybrid's step is "
            f"{at_1k[:5]} faster than pure Triton's at 1k {at_1k[6:]} and ties at 128k") in parent
