"""The figures README.md, docs/results.md and the recorded runs' READMEs quote from the H200 runs that 09, 10 and 11
judge, recomputed from each run's rows with the notebooks' own calls (tests/recorded_verdicts.py) and found in the text
as written: a figure that drifts from its run fails here. (sglang-h100-mla61-prefill: tests/test_reference_prefill_run.py.)"""

from __future__ import annotations

import re
import statistics

import pytest

from recorded_verdicts import judge_09, judge_10
from specdiag.paths import PROJECT_ROOT, REFERENCE_DIR
from specdiag.stats import level_text

K1, K16, K64, K128, K185 = 1024, 16384, 65536, 131072, 185000


def _text(path: str) -> str:
    """The file's text with its line breaks and runs of spaces as one space (docs wrap their sentences)."""
    return " ".join((PROJECT_ROOT / path).read_text().split())


def _in(path: str, *quotes: str) -> None:
    text = _text(path)
    for q in quotes:
        assert q in text, f"{path} does not quote {q!r}"


def g3(x: float) -> str:
    """Three significant digits as the docs write them: 7.50, 12.1, 152, 1,260."""
    return f"{x:,.0f}" if abs(x) >= 1000 else f"{x:#.3g}".rstrip(".")


def interval(c) -> str:
    return f"{level_text(c.level)} interval {c.lo:.3g}-{c.hi:.3g}x"


@pytest.fixture(scope="module")
def dflash():
    return judge_09("sglang-h200-mla61-dflash")


@pytest.fixture(scope="module")
def ngram():
    return judge_09("sglang-h200-mla61-engine-ab")


@pytest.fixture(scope="module")
def tier0():
    return judge_10("sglang-h200-kv-tier0")


def test_the_dflash_table_is_the_rows(dflash) -> None:
    """data/reference/sglang-h200-mla61-dflash/README.md's table: per arm and context the median over requests, their
    range and count (ms per verify step, a request's decode window over its steps), and the TTFT medians."""
    text = (REFERENCE_DIR / "sglang-h200-mla61-dflash" / "README.md").read_text()
    cells = dflash.dec.set_index(["arm", "context_tokens"])
    ttft = dflash.pre.set_index(["arm", "context_tokens"])
    rows = dict(re.findall(r"^\| (triton\w*|flashinfer\w*) \|(.*)\|$", text, re.M))
    assert set(rows) == {"triton", "triton_plugin", "flashinfer", "triton_plugin_nowindow", "triton_nospec",
                         "flashinfer_nospec"}
    for arm, row in rows.items():
        quoted = [c.strip() for c in row.split("|")]
        for ctx, cell in zip((K1, K16, K64, K128), quoted):
            if (arm, ctx) not in cells.index:
                assert cell == "-", (arm, ctx)
                continue
            s = cells.loc[(arm, ctx), "step_ms_samples"]
            got = f"{g3(statistics.median(s))} ({g3(min(s))}-{g3(max(s))})"
            assert cell.startswith(got) and cell.split(", ")[-1].split(" ")[0] == str(len(s)), (arm, ctx, cell, got)
        t64 = g3(ttft.loc[(arm, K64), "ttft_s"])
        t128 = g3(ttft.loc[(arm, K128), "ttft_s"]) if (arm, K128) in ttft.index else "-"
        assert quoted[4] == f"{t64} / {t128} s", (arm, quoted[4])


def test_the_dflash_verdicts_as_quoted(dflash) -> None:
    from specdiag.steps.engine_ab import analysis

    sp = analysis.step_spreads(dflash.dec)
    c64 = analysis.compare_cells(dflash.dec, "triton_plugin", "triton", K64, sp)
    c128 = analysis.compare_cells(dflash.dec, "triton_plugin", "triton", K128, sp)
    f64 = analysis.compare_cells(dflash.dec, "flashinfer", "triton_plugin", K64, sp)
    f128 = analysis.compare_cells(dflash.dec, "flashinfer", "triton_plugin", K128, sp)
    assert (f64.verdict, f128.verdict) == ("lower", "tie")
    one = dflash.dec.set_index(["arm", "context_tokens"])
    meds = [float(v) for v in one.loc[("triton_plugin", K1), "server_step_ms"].values()]
    cells = {(c.arm, c.context_tokens): c for c in dflash.brk.cells if c.kind == "novel"}
    ratios = {a: [cells[(x, c)].ratio for (x, c) in cells if x == a] for a in ("triton_plugin", "flashinfer")}
    tri = next(b for b in dflash.brk.evens if b.arm == "triton" and b.kind == "novel")
    ans = {a.context_tokens: a for a in dflash.answers}
    keep = dflash.targets.set_index("target_id").loc["best_decode_128k_vs_1k"]
    win = dflash.window.set_index("context_tokens")
    step = one["step_ms"]
    quotes = [
        f"{c64.ratio:.3g}x stock's step at 64k ({level_text(c64.level)} interval {c64.lo:.3g}-{c64.hi:.3g}x",
        f"{c128.ratio:.3g}x at 128k ({level_text(c128.level)} interval {c128.lo:.3g}-{c128.hi:.3g}x",
        f"{f64.ratio:.3g}x FlashInfer's step at 64k ({level_text(f64.level)} interval {f64.lo:.3g}-{f64.hi:.3g}x)",
        f"{f128.ratio:.3g}x at 128k ({level_text(f128.level)} interval {f128.lo:.3g}-{f128.hi:.3g}x",
        f"{min(meds):.2f}-{max(meds):.2f} ms", f"{sp[K1].x:.2f}x",
        f"pays at 1k ({cells[('triton', K1)].ratio:.3g}x) and costs at 16k ({cells[('triton', K16)].ratio:.3g}x)",
        f"about {analysis.tok(tri.context_tokens)}",
        f"{min(ratios['triton_plugin']):.2g}-{max(ratios['triton_plugin']):.3g}x",
        f"{min(ratios['flashinfer']):.3g}-{max(ratios['flashinfer']):.3g}x",
        f"outputs under about {ans[K64].tokens:,.0f} tokens",
        f"{step[('triton', K128)] / step[('triton', K1)]:.3g}x from 1k to 128k",
    ]
    for ctx, word in ((K64, "+4.34 ms"), (K16, "+0.77 ms")):
        r = win.loc[ctx]
        quotes += [f"{r.ratio_x:.3g}x ({r.interval}", word if ctx == K64 else f"{r.extra_ms:+.2f} ms"]
    r = win.loc[K1]
    quotes.append(f"{r.ratio_x:.3g}x ({r.interval})")
    _in("data/reference/sglang-h200-mla61-dflash/README.md", *quotes,
        f"({keep.value:.3g}, 90% interval {keep.lo:.3g}-{keep.hi:.3g}, part 3's requests)",
        f"({dflash.targets.set_index('target_id').loc['best_ttft_64k_vs_triton', 'value']:.3g}x on one prefill each)")
    _in("docs/results.md", *quotes[:4], *quotes[6:10], f"about {ans[K64].tokens:,.0f} tokens")
    _in("README.md", f"{g3(step[('triton', K128)])} ms with DFLASH, the plugin's 9.5 and {g3(step[('triton_plugin', K128)])} "
                     f"ms ({step[('triton', K128)] / step[('triton_plugin', K128)]:.3g}x)")


def test_the_ngram_run_as_quoted(ngram) -> None:
    """sglang-h200-mla61-engine-ab: the hybrid against FlashInfer and against the plugin at 128k-185k, 09's answer at
    185k, the break-even at the first request's commit."""
    from specdiag.steps.engine_ab import analysis

    sp = analysis.step_spreads(ngram.dec)
    h128 = analysis.compare_cells(ngram.dec, "fi_prefill_plugin", "flashinfer", K128, sp)
    h185 = analysis.compare_cells(ngram.dec, "fi_prefill_plugin", "flashinfer", K185, sp)
    tie = analysis.compare_cells(ngram.dec, "fi_prefill_plugin", "triton_plugin", K128, sp)
    assert (h128.verdict, h185.verdict, tie.verdict) == ("higher", "higher", "tie")
    ans = {a.context_tokens: a for a in ngram.answers}[K185]
    assert (ans.kind, ans.first, ans.decode) == ("split", "flashinfer", "fi_prefill_plugin")
    first = {(c.arm, c.context_tokens): c for c in ngram.brk.cells if c.kind == "first request"}
    lines = {b.arm: b for b in ngram.brk.evens if b.kind == "first request"}
    assert lines["flashinfer"].outcome == "never pays" and lines["triton"].outcome == "never pays"
    _in("data/reference/sglang-h200-mla61-engine-ab/README.md",
        f"{g3(h128.ratio)}x (128k, {level_text(h128.level)} interval {g3(h128.lo)}-{g3(h128.hi)}x)",
        f"{g3(h185.ratio)}x (185k, {g3(h185.lo)}-{g3(h185.hi)}x)",
        f"({tie.ratio:.3g}x, {level_text(tie.level)} interval {tie.lo:.2f}-{tie.hi:.3g}x)",
        f"outputs under about {ans.tokens:,.0f} tokens",
        f"ties at 1k ({first[('triton_plugin', K1)].ratio:.3g}x) and pays from 16k "
        f"({first[('triton_plugin', K16)].ratio:.3g}x)",
        f"about {analysis.tok(lines['triton_plugin'].context_tokens)} interpolated",
        f"costs at 1k ({first[('fi_prefill_plugin', K1)].ratio:.3g}x) and pays from 16k "
        f"({first[('fi_prefill_plugin', K16)].ratio:.3g}x), about {analysis.tok(lines['fi_prefill_plugin'].context_tokens)}")
    _in("docs/results.md", f"outputs under about {ans.tokens:,.0f} tokens",
        f"({h185.ratio:.3g}x faster than FlashInfer there ({level_text(h185.level)} interval {h185.lo:.3g}-"
        f"{h185.hi:.3g}x"[1:], f"({tie.ratio:.3g}x, {level_text(tie.level)} interval {tie.lo:.2f}-{tie.hi:.3g}x)")
    step = ngram.dec.set_index(["arm", "context_tokens"])["step_ms"]
    _in("README.md", f"FlashInfer for outputs under about {float(f'{ans.tokens:.2g}'):,.0f} tokens",
        f"takes {g3(step[('triton', K128)])} ms with NGRAM", f"the plugin's {step[('triton_plugin', K128)]:.2g} and")


def test_the_tier0_run_as_quoted(tier0) -> None:
    """sglang-h200-kv-tier0: the requests per state, the spread of the fresh servers, both contiguous verdicts, and
    which scattered requests lie inside the fresh range (one does not)."""
    from specdiag import spread
    from specdiag.steps.kv_layout import analysis as kla

    three = tier0.three.set_index("arm")
    p4, p61 = three.loc["plugin"], three.loc["plugin61"]
    sp = kla.spreads(tier0.rows)[K128]
    fresh61 = [m for a, s in (("plugin61", "fresh"), ("plugin61_contiguous", "fresh"))
               for m in kla._request_medians(kla.latest(tier0.rows).query("arm == @a and pool_state == @s"))]
    scattered = p61["scattered_request_ms"]
    inside = [m for m in scattered if min(fresh61) <= m <= max(fresh61)]
    outside = [m for m in scattered if m not in inside]
    assert len(outside) == 1 and len(inside) == 2  # not "every scattered request lies inside the fresh range"

    def pct(x: float) -> str:
        return f"{100 * (x - 1):+.1f}%"

    servers = spread._server_medians(_units(tier0, "plugin", "fresh"))
    assert f"{sp.x:.2f}x" == f"{max(servers.values()) / min(servers.values()):.2f}x"
    fresh4 = ", ".join(f"{m:.3g}" for m in p4["fresh_request_ms"])
    spread_quote = f"{sp.x:.2f}x ({min(servers.values()):.2f}-{max(servers.values()):.2f} ms)"
    _in("data/reference/sglang-h200-kv-tier0/README.md", spread_quote, fresh4,
        f"({', '.join(f'{m:.3g}' for m in inside)} ms)", f"({g3(outside[0])} ms)",
        f"({min(fresh61):.3g}-{max(fresh61):.3g} ms)",
        f"{pct(p61['contiguous_x'])} with a 90% interval of {_bounds(p61['contiguous_interval'])}",
        f"{pct(p4['contiguous_x'])} ({_level_and_bounds(p4['contiguous_interval'])}")
    _in("docs/results.md", spread_quote, f"fresh range {min(fresh61):.3g}-{max(fresh61):.3g} ms, one, {g3(outside[0])} ms, above it",
        f"{pct(p4['contiguous_x'])} ({_level_and_bounds(p4['contiguous_interval'])}",
        f"(90% interval {_bounds(p61['contiguous_interval'])}: no cost above {pct(p61['contiguous_hi_x'])})")
    _in("README.md", f"within {pct(p61['contiguous_hi_x'])} of its own server's fresh pool's")


def _units(j, arm: str, state: str) -> list:
    from specdiag.steps.kv_layout import analysis as kla

    df = kla.latest(j.rows)
    return kla._request_units(df[(df["arm"] == arm) & (df["pool_state"] == state)])


def _bounds(interval_text: str) -> str:
    """'-5.7% to +4.6%' of '-0.8% (90% interval -5.7% to +4.6%, ...)'."""
    return re.search(r"interval (\S+ to \S+),", interval_text).group(1)


def _level_and_bounds(interval_text: str) -> str:
    return re.search(r"\((\d+% interval \S+ to \S+),", interval_text).group(1)


def test_the_kv_layout_and_moe_runs_as_quoted() -> None:
    """sglang-h200-kv-layout: one request a state is 'not enough requests'; sglang-h200-moe-batch1: the floor of the
    measured passes' experts, of eight distinct drafts', and how far above it every timed request ran."""
    from specdiag.runs import Run
    from specdiag.steps.moe_batch1 import analysis as ma

    kv = judge_10("sglang-h200-kv-layout").cost.set_index(["arm", "context_tokens"]).loc[("triton", K128)]
    assert kv["verdict"] == "not enough requests"
    _in("data/reference/sglang-h200-kv-layout/README.md", f"{100 * (kv['cost_x'] - 1):+.1f}% on one request a state")
    mr = ma.load_run(Run.open(REFERENCE_DIR / "sglang-h200-moe-batch1"))
    t = ma.tables(mr, 131072)
    share = {f.id: f for f in ma.findings(mr, t, 131072)}["moe.expert_share"].numbers
    floors = dict(zip(t.share["tokens"], t.share["floor_ms"]))
    drafts = dict(zip(t.share_windows["tokens"], t.share_windows["floor_ms"]))
    over = share["step_over_floor_range"]
    lo, hi = min(v[0] for v in over.values()), max(v[1] for v in over.values())
    _in("data/reference/sglang-h200-moe-batch1/README.md",
        f"grows from {floors[1]:.2f} ms to {floors[8]:.2f} ms (eight distinct drafts would read {drafts[8]:.2f} ms)",
        f"ran {lo:.3g}-{hi:.3g}x above its floor")


def test_the_vllm_cpu_break_even_table_is_the_rows() -> None:
    """data/reference/vllm-cpu-breakeven/README.md: every cell's ratio, interval and verdict, and each line's outcome,
    as 09 computes them from the rows."""
    from specdiag.steps.engine_ab import analysis

    j = judge_09("vllm-cpu-breakeven", stock_arm="nospec", plugin_arm="-")
    text = (REFERENCE_DIR / "vllm-cpu-breakeven" / "README.md").read_text()
    rows = {(a, k): [c.strip() for c in cells.split("|")]
            for a, k, cells in re.findall(r"^\| (ngram|standalone), (novel|predictable) \|(.*)\|$", text, re.M)}
    assert len(rows) == 4
    for c in j.brk.cells:
        quoted = rows[(c.arm, c.kind)][[256, 1024, 2048, 3584].index(c.context_tokens)]
        hi = f"{c.hi:.0f}" if c.hi >= 100 else f"{c.hi:.2f}"
        assert quoted == f"{c.ratio:.2f} ({c.lo:.2f}-{hi}) {c.verdict}", (c.arm, c.kind, c.context_tokens, quoted)
        assert level_text(c.level) == "96%" and c.rule == "one machine"
    lines = {(b.arm, b.kind): b for b in j.brk.evens}
    assert rows[("ngram", "novel")][4].startswith("a tie at every context") and lines[("ngram", "novel")].outcome == "tie"
    b = lines[("standalone", "predictable")]
    assert rows[("standalone", "predictable")][4] == (
        f"stops paying between {analysis.tok(b.lo_tokens)} and {analysis.tok(b.hi_tokens)} (about "
        f"{b.context_tokens:.0f} tokens interpolated, no interval), but pays again at "
        f"{', '.join(analysis.tok(c) for c in b.pays_again)}: no single line")
