"""Notebook 10's sections, one call each (:class:`specdiag.section.Section`: tables, figures, text): the notebook keeps
its parameters, these calls and its prose.

:func:`start` checks the parameters and the arms (before any server is reached) and opens the run; the
:class:`Page`'s data are computed when a section first asks (live: the sweep's driver in this process). Sections: :func:`arms` (each arm's
server and pool), :func:`measure_or_replay`, :func:`layouts` (where each long request lay), :func:`step_times`
(fresh against fragmented), :func:`contiguous` (an arm beside its ``_contiguous`` arm), :func:`prediction` (the kernel
A/B's), :func:`findings` and :func:`metrics`.
"""

from __future__ import annotations

from functools import cached_property
from typing import Any, Mapping

import pandas as pd

from specdiag import findings as fnd
from specdiag import nb
from specdiag.paths import REFERENCE_DIR, relative_to_project
from specdiag.plots import format_tokens
from specdiag.runs import Run
from specdiag.section import Section
from specdiag.steps.kv_layout import analysis as kla
from specdiag.steps.kv_layout import measure as klm
from specdiag.steps.kv_layout import plots as klp
from specdiag.steps.kv_layout import tier0
from specdiag.sweep.arms import ArmsError, running
from specdiag.sweep.driver import plan, sweep_into
from specdiag.sweep.settings import SettingsError

NOTEBOOK = "10_kv_layout"
KERNEL_AB_REFERENCE = "kernel-ab-h200"


class Page(nb.Page):
    """What 10's sections share: the arms and their pools, the rows (measured when first asked, or the recorded
    run's), the step times fresh against fragmented, the contiguous allocator's states, the kernel A/B's prediction
    and the findings, each computed when a section first asks."""

    notebook = NOTEBOOK

    def __init__(self, params: Mapping[str, Any]) -> None:
        """Check the parameters and the arms (an arms file and ``only``; without one, ``server_url`` or the embedded
        server as one running arm) with the kv_layout settings the parameters give, then open the run (``nb.start``:
        reach ``server_url``, or open the recorded run); on vLLM nothing is measured (section 6 says why)."""
        super().__init__(params)
        p = self.params
        nb.check(p["repeats"] >= 1, f"repeats must be a whole number >= 1; got {p['repeats']!r}")
        nb.check(p["max_new_tokens"] >= 2, f"max_new_tokens must be >= 2; got {p['max_new_tokens']!r}")
        nb.check(p["filler_cycles"] > 0, f"filler_cycles must be > 0; got {p['filler_cycles']!r}")
        arms, only = p["arms"], p["only"]
        nb.check(not (arms and p["replay_dir"]),
                 "arms measures an arms file's servers, replay_dir a recorded run: pass one")
        nb.check(not only or bool(arms), "only picks arms of an arms file: pass arms too")
        contexts = nb.check_context_lengths("context_lengths", p["context_lengths"])
        settings = {"contexts": contexts, "max_new_tokens": p["max_new_tokens"], "repeats": p["repeats"],
                    "seed": p["seed"], "filler_cycles": p["filler_cycles"],
                    "filler_concurrency": p["filler_concurrency"],
                    "filler_max_s": 60.0 * float(p["filler_max_minutes"])}
        try:  # the sweep to run (specdiag.sweep.driver.Plan); None when replaying or on vLLM
            self.planned: Any = plan(arms, klm.TABLE, only, settings) if arms else None
        except (ArmsError, SettingsError, ValueError) as exc:
            raise nb.ParameterError(str(exc)) from None
        self.ctx = ctx = nb.start(NOTEBOOK, server_url=p["server_url"], run_dir=p["run_dir"],
                                  replay_dir=p["replay_dir"], params={**nb.run_params(p), "context_lengths": contexts},
                                  needs_server=not arms)
        self.on_vllm = ctx.live and not arms and ctx.client.engine == "vllm"
        if self.on_vllm:
            self.intro.text(f"{ctx.server_url} is vLLM: its KV lives in blocks of block_size tokens (contiguous inside "
                            "a block) and it shows no request's block table over HTTP, so 10 measures nothing there "
                            "(section 6); run it against SGLang or the embedded server")
        elif ctx.live and not arms:  # the notebook's one server, measured as it runs
            embedded = str((ctx.client.server_info() or {}).get("version", "")).startswith("specdiag-localserver")
            self.planned = plan(running({"embedded" if embedded else "server": ctx.server_url}), klm.TABLE, (),
                                settings)
        self.replayed_from: str | None = relative_to_project(ctx.source.path) if ctx.replaying else None
        self.intro.text(f"run folder: {ctx.run.path}" + (f"; replaying {self.replayed_from}" if self.replayed_from
                                                          else ""))

    @cached_property
    def rows(self) -> list[dict[str, Any]]:
        """The kv_layout rows: live, the sweep's driver in this process (one arm at a time, each server's pool kept in
        run.json as it reported it; rows appended as taken, a re-run resumes); replaying, the recorded rows."""
        ctx = self.ctx
        if ctx.replaying:
            rows = ctx.source.rows(klm.TABLE)
            nb.check(any(r.get("pool_state") for r in rows), f"{ctx.source.path} has no {klm.TABLE} rows to replay")
            return rows
        if self.planned is not None:
            sweep_into(ctx.run, self.planned)
        return ctx.run.rows(klm.TABLE)

    @property
    def source(self) -> str:
        return ("measured (recorded run)" if self.replaying else "not measured (vLLM)" if self.on_vllm
                else "measured")

    @cached_property
    def summ(self) -> pd.DataFrame:
        """Ms per verify step per arm, state and context."""
        return kla.summary(self.rows)

    @cached_property
    def cost(self) -> pd.DataFrame:
        """Fragmented over fresh per arm and context, with its interval over requests."""
        return kla.costs(self.rows)

    @cached_property
    def three(self) -> pd.DataFrame:
        """Fresh, scattered and contiguous-allocator states of each arm beside its ``_contiguous`` arm."""
        return tier0.three_states(self.rows)

    @cached_property
    def _prediction(self) -> tuple[pd.DataFrame, str, str]:
        """The kernel A/B's predicted cost per context (``kernel_ab_dir``, else the H200 reference run), its source,
        and why there is none ('' when there is one)."""
        try:
            kab = Run.open(self.params["kernel_ab_dir"] or str(REFERENCE_DIR / KERNEL_AB_REFERENCE))
            return kla.kernel_prediction(kab.rows("kernel_ab")), (
                f"computed from {relative_to_project(kab.path)} (06: split_triton on a shuffled page_size-1 "
                f"table over split_triton_b64 on 64-token pages, {kab.meta.get('device', {}).get('gpu', 'GPU')})"), ""
        except (FileNotFoundError, ValueError) as exc:
            return kla.kernel_prediction([]), "", str(exc)

    @property
    def pred(self) -> pd.DataFrame:
        return self._prediction[0]

    @property
    def pred_source(self) -> str:
        return self._prediction[1]

    @cached_property
    def found(self) -> list[fnd.Finding]:
        """The verdicts; on vLLM the one that says 10 cannot measure there."""
        if self.on_vllm:
            return [fnd.Finding("kv_layout.vllm", "KV layout: not measurable on vLLM",
                                "vLLM keeps a request's KV in blocks of block_size tokens and shows no block table "
                                "over HTTP: the page_size-1 scattering 10 measures cannot happen there (section 6).",
                                "info", (f"server: {self.ctx.server_url} (vLLM)",), {}, "configured")]
        return fnd.sort_findings(kla.findings(self.cost, self.pred, source="measured",
                                              prediction_source=self.pred_source, missing=kla.gaps(self.rows))
                                 + tier0.findings(self.three, source="measured"))


def start(params: Mapping[str, Any]) -> Page:
    """Check the parameters, parse the arms and open the run (:class:`Page`)."""
    return Page(params)


ARM_COLUMNS = {"arm": "arm", "what": "what", "attention_backend": "attention backend", "pool_tokens": "pool (token slots)",
               "page_size": "page size", "disable_radix_cache": "radix cache off", "speculative_algorithm": "speculation",
               "tokens_per_step": "tokens per verify step", "kv_alloc": "KV allocator", "layout_source": "layout from"}


def _pct(x: float) -> str:
    return f"{100 * (float(x) - 1):+.1f}%"


def _tok(n: Any) -> str:
    return format_tokens(float(n)) if n is not None else "?"


def contiguous_answers(found: list[fnd.Finding]) -> list[tuple[str, list[str]]]:
    """Per answer, the arms it holds for, from each arm's ``kv_layout.tier0.<arm>`` finding: yes (it bought a
    measured layout cost back: the finding names a fix), no (it did not keep the request contiguous, or did not buy
    the cost back), not established (too few requests on a scattered pool), not needed (a scattered pool cost no
    measurable time). The answer's words carry ``{arms}`` where the arms go."""
    by_answer: dict[str, list[str]] = {}
    for f in (f for f in found if f.id.startswith("kv_layout.tier0.")):
        n, arm = f.numbers, str(f.numbers.get("arm"))
        at = _tok(n.get("context_tokens"))
        if "fix" in n:
            key = (f"yes on {{arms}}: after the same traffic it buys the layout's cost back, "
                   f"{float(n['fix_speedup_x']):.3g}x faster per verify step than scattered at {at}")
        elif n.get("not_enough_requests"):
            key = ("not established on {arms}: too few requests on a scattered pool to say whether it costs time, so "
                   "whether there is a cost to buy back")
        elif f.severity == "warning":
            key = f"no on {{arms}}: {f.title.split(': ', 1)[-1]} ({f.verdict})"
        else:
            key = f"not needed on {{arms}}: a scattered pool cost no measurable time there (at {at})"
        by_answer.setdefault(key, []).append(arm)
    return list(by_answer.items())


def contiguous_answer(found: list[fnd.Finding]) -> str:
    """'Turn the contiguous allocator on?' answered in one sentence (:func:`contiguous_answers`), with what a step
    costs with it on where the run measured that."""
    answers = contiguous_answers(found)
    if not answers:
        return ("Turn the contiguous allocator on? Not measured here: no arm ran beside its <arm>_contiguous twin "
                "(in an arms file such as params/arms/embedded-kv-layout.yaml; on a GPU, the SGLang plugin's "
                "SPECDIAG_SGLANG_KV_ALLOC=contiguous).")
    said = "; ".join(words.format(arms=" and ".join(arms)) for words, arms in answers)
    bounds = [f"{_pct(f.numbers['contiguous_hi_x'])} on {f.numbers.get('arm')}" for f in found
              if f.id.startswith("kv_layout.tier0.") and f.numbers.get("contiguous_hi_x") is not None]
    cost = (f" With it on, a verify step cost no more than {', '.join(bounds)} against fresh (the intervals' upper "
            "ends)." if bounds else "")
    return f"Turn the contiguous allocator on? {said[0].upper()}{said[1:]}.{cost}"


def _short(f: fnd.Finding) -> str:
    """A layout finding's verdict without its arm and after its first clause."""
    arm = str(f.numbers.get("arm"))
    text = f.verdict.removeprefix(f"On {arm}:").removeprefix(f"On {arm}").strip()
    short = text.split("; ")[0].rstrip(".")
    return short + ")" * max(0, short.count("(") - short.count(")"))


def lead_lines(pg: Page) -> list[tuple[str, str]]:
    """The answer ("turn the contiguous allocator on?"), what a fragmented pool costs, the kernel A/B's prediction
    and how sure, from the page's findings."""
    lines = [("Answer", contiguous_answer(pg.found).removeprefix("Turn the contiguous allocator on? "))]
    costs = [f for f in pg.found if f.id.count(".") == 1 and f.id not in ("kv_layout.prediction", "kv_layout.gaps",
                                                                           "kv_layout.vllm", "kv_layout.not_measured")]
    if costs:
        lines.append(("Layout cost", "; ".join(f"{f.numbers.get('arm')}: {_short(f)}" for f in costs)))
    pred = next((f for f in pg.found if f.id == "kv_layout.prediction"), None)
    if pred is not None:
        lines.append(("Predicted", pred.verdict))
    if not pg.summ.empty:
        per = pg.summ.groupby(["arm", "pool_state"])["requests"].sum()
        lo, hi = int(per.min()), int(per.max())
        lines.append(("How sure", f"{lo if lo == hi else f'{lo}-{hi}'} requests per arm and pool state (a verdict "
                                  "takes 3); intervals over requests, a tie called a tie (sections 4 and 4b)"))
    return lines


def lead(pg: Page) -> Section:
    """The answer first: turn the contiguous allocator on or not, and what the layout costs."""
    return Section().lead(lead_lines(pg), title=contiguous_answer(pg.found).split("?")[0] + "?")


def arms(pg: Page) -> Section:
    """Section 1: replaying, each arm's server, backend, pool, page size, radix cache and layout source as recorded;
    live, the arms as configured (each server reports its pool in section 2, as it is measured)."""
    ctx, s = pg.ctx, Section()
    if ctx.replaying:
        return s.table([dict(r) for r in (ctx.source.meta.get("kv_layout_arms") or [])], ARM_COLUMNS)
    if pg.planned is None:
        return s
    return s.text(f"{len(pg.planned.arms.arms)} arms, measured in section 2 one after another: "
                  + "; ".join(f"{a.name} ({a.label}" + ("" if a.running else f", {a.kv_alloc} allocator, a pool of "
                                                        f"{a.max_total_tokens or 'the server default'} slots") + ")"
                              for a in pg.planned.arms.arms))


def measure_or_replay(pg: Page) -> Section:
    """Section 2: live, every arm fresh then fragmented (the sweep's driver; rows appended as taken, a re-run
    resumes), each server's pool as it reported it; replaying, the recorded rows. Then the arms that failed."""
    s, rows = Section(), pg.rows
    if pg.replaying:
        s.text(f"replaying {len(rows)} rows of {pg.replayed_from}; nothing is sent")
    elif pg.planned is not None:
        s.table(pg.ctx.run.meta.get("kv_layout_arms") or [], ARM_COLUMNS)
    for line in kla.arm_failures(rows):
        s.text(f"arm failed: {line}")
    return s


def layouts(pg: Page) -> Section:
    """Section 3: each request's layout at its last verify step (server-reported)."""
    lay = []
    for r in kla.latest(pg.rows).to_dict("records"):
        L = r.get("layout") or {}
        lay.append({"arm": r["arm"], "pool_state": r["pool_state"], "context_tokens": r["context_tokens"],
                    "repeat": r["repeat"], "tokens": L.get("tokens"), "runs": L.get("runs"),
                    "share": L.get("share_in_long_runs"), "runs_per_1k": L.get("runs_per_1k_tokens"),
                    "longest": L.get("longest_run"),
                    "cycles": (r.get("filler") or {}).get("cycles") if isinstance(r.get("filler"), dict) else None,
                    "error": r.get("error")})
    return Section().table(lay, {"arm": "arm", "pool_state": "pool", "context_tokens": "context (tokens)",
                                 "repeat": "repeat", "tokens": "prefix (tokens)", "runs": "runs",
                                 "share": "tokens in runs >= 64", "runs_per_1k": "runs per 1k tokens",
                                 "longest": "longest run (slots)", "cycles": "filler (pool cycles)", "error": "error"},
                           formats={"share": "{:.0%}"},
                           dash_means="not reported (no layout source), or no filler before it")


def step_times(pg: Page) -> Section:
    """Section 4: ms per verify step per arm, state and context; fragmented over fresh with its interval over requests
    (and the figure); what was not measured."""
    s = Section()
    s.table(pg.summ, {"arm": "arm", "pool_state": "pool", "context_tokens": "context (tokens)", "requests": "requests",
                      "steps": "steps", "step_ms": "ms per verify step (median)",
                      "client_step_ms": "client step_ms (median)", "share_in_long_runs": "tokens in runs >= 64",
                      "runs_per_1k_tokens": "runs per 1k tokens"}, formats={"share_in_long_runs": "{:.0%}"})
    if not pg.cost.empty:
        s.table(pg.cost, {"arm": "arm", "context_tokens": "context (tokens)", "fresh_ms": "fresh (ms/step)",
                          "fragmented_ms": "fragmented (ms/step)", "cost_x": "fragmented / fresh",
                          "cost_lo_x": "interval from", "cost_hi_x": "to", "verdict": "verdict",
                          "requests_fresh": "requests fresh", "requests_fragmented": "requests fragmented",
                          "fresh_share": "fresh: runs >= 64", "fragmented_share": "fragmented: runs >= 64",
                          "layouts_differ": "layouts differ enough"},
                formats={"cost_x": "{:.3f}", "cost_lo_x": "{:.3f}", "cost_hi_x": "{:.3f}", "fresh_share": "{:.0%}",
                         "fragmented_share": "{:.0%}"})
        s.figure(klp.figure(pg.summ, pg.source))
    else:
        s.text("no arm has both a fresh and a fragmented request without error: nothing to compare")
    for gap in kla.gaps(pg.rows):
        s.text(f"not measured: {kla.gap_text(gap)}")
    return s


def contiguous(pg: Page) -> Section:
    """Section 4b: fresh, scattered and contiguous-allocator states of each arm beside its ``_contiguous`` arm."""
    if pg.three.empty:
        return Section().text("no arm was measured beside its _contiguous arm: the contiguous allocator is not "
                              "compared in this run")
    return Section().table(pg.three, {
        "arm": "arm", "context_tokens": "context (tokens)", "fresh_ms": "fresh (ms/step)",
        "scattered_ms": "scattered (ms/step)", "contiguous_ms": "contiguous allocator (ms/step)",
        "scattered_interval": "scattered / fresh (interval, requests)",
        "contiguous_interval": "contiguous / fresh (interval, requests)", "fresh_share": "fresh: runs >= 64",
        "scattered_share": "scattered: runs >= 64", "contiguous_share": "contiguous: runs >= 64",
        "buys_back": "buys the cost back"},
        formats={"fresh_share": "{:.0%}", "scattered_share": "{:.0%}", "contiguous_share": "{:.0%}"})


def prediction(pg: Page) -> Section:
    """Section 5: the kernel A/B's predicted cost per context (``kernel_ab_dir``, else the H200 reference run)."""
    s, why_not = Section(), pg._prediction[2]
    if why_not:
        s.text(f"no kernel A/B run to predict from ({why_not})")
    if not pg.pred.empty:
        s.table(pg.pred, {"context_tokens": "context (tokens)", "predicted_max_x": "predicted at most (ratio)",
                          "shapes": "per shape (8 heads x draft tokens: ratio)"}, formats={"predicted_max_x": "{:.3f}"})
        s.text(pg.pred_source)
    return s


def findings(pg: Page) -> Section:
    """Section 7: the verdicts (``data["found"]``); on vLLM the one that says 10 cannot measure there."""
    s = Section(data={"found": pg.found})
    if pg.replayed_from:
        s.markdown(f"These findings come from the recorded run `{pg.replayed_from}`, not from a measurement of this run.")
    return s.html(fnd.to_html(pg.found))


def metrics(pg: Page) -> dict[str, Any]:
    """10's key numbers and its answer (``lead``, the lines the page opens with: 07 and the index read them)."""
    return {**kla.metrics(pg.cost, pg.summ), "tier0": tier0.metrics(pg.three), "source": pg.source,
            "prediction": {str(r.context_tokens): round(r.predicted_max_x, 4) for r in pg.pred.itertuples()}
            if not pg.pred.empty else {}, "lead": [list(x) for x in lead_lines(pg)]}
