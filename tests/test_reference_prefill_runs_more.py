"""The figures the READMEs of the recommended configuration's other recorded runs quote, recomputed from their rows:
NGRAM on an H200 (sglang-h200-mla61-engine-ab/hybrid), the MHA prefill's greedy identity
(sglang-h100-mla61-prefill/identity-h200) and the live report (sglang-h200-mla61-dflash-live)."""

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
