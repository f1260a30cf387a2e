"""``specdiag sweep --measure drafter_timing``: 03's measurements on each arm's server, without papermill (a GPU host
without Jupyter), into the arm's own run folder (``<out>/<arm>/``), which 03 replays; and what 03 reads of two arms
side by side, written into the first arm's folder when the sweep ends.

- per arm: the draft-timing requests (:class:`~.analysis.TimingPlan`, each :func:`~.analysis.measure_draft_timing`:
  server-reported draft and verify ms per step), and with ``window_contexts`` one greedy request per context and text
  kind whose drafting is recorded (``drafter_window``: verify steps, correct drafts, histogram, output ids);
- ``window_pair`` (the drafter as shipped, then a copy of it whose config makes every layer full attention, same
  weights: ``data/models/full_attention_copy.py``): ``drafter_window_check``, per context and kind, whether the two
  drafted alike. Alike beyond the drafter's sliding window means the server ran the window as full attention;
- ``cost_pair`` (a STANDALONE arm, then an NGRAM arm of the same target): ``drafter_cost``, per context, the
  difference of their ms per verify step (01's ``sweep`` rows of the same sweep: ``--measure
  baseline_sweep,drafter_timing``), the drafter's own cost.
"""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

from specdiag.measure.loop import measure_missing
from specdiag.measure.sweep_table import latest_rows
from specdiag.prompts import build_prompt
from specdiag.runs import Run
from specdiag.speculation.commit import spec_fields_from_meta
from specdiag.steps.drafter_inspection import analysis as drafter

#: 03 replays one server per run folder: the driver gives each arm its own (specdiag.sweep.driver.arm_run)
PER_ARM = True
NOTEBOOK = "03_drafter_inspection"
WINDOW_TABLE = "drafter_window"  #: each arm's drafting of the window check's prompts
WINDOW_KEY = ("context_tokens", "kind")


@dataclass(frozen=True)
class SweepSettings:
    """03's measurements in a sweep (the arms file's ``settings:``, ``--contexts``, ``--set KEY=VALUE``)."""

    contexts: tuple[int, ...] = (1024, 4096, 16000)  # draft-timing prompt tokens
    max_new_tokens: int = 64  # tokens per request (ignore_eos)
    repeats: int = 3  # timed requests per context (after one warm-up request)
    prompt_kind: str = "novel"  # text of the timed requests
    seed: int = 0  # prompt seed
    window_contexts: tuple[int, ...] = ()  # the window check's prompt tokens (empty: no window check)
    window_pair: tuple[str, ...] = ()  # two arms: the drafter as shipped, then its all-full-attention copy
    cost_pair: tuple[str, ...] = ()  # two arms of one target: STANDALONE, then NGRAM (their 01 sweep rows)

    def __post_init__(self) -> None:
        for name in ("window_pair", "cost_pair"):
            if getattr(self, name) and len(getattr(self, name)) != 2:
                raise ValueError(f"drafter_timing setting {name} names two arms, not {list(getattr(self, name))}")


def sweep_begin(run: Any, arms: Any, settings: SweepSettings) -> None:
    """The pairs, checked to name arms of the sweep, kept in run.json (``drafter_pairs``) for :func:`sweep_end`."""
    have = {a.name for a in arms.arms}
    for name in ("window_pair", "cost_pair"):
        missing = [a for a in getattr(settings, name) if a not in have]
        if missing:
            raise ValueError(f"drafter_timing setting {name} names {', '.join(missing)}, which the sweep does not "
                             f"run (its arms: {', '.join(sorted(have))})")
    run.update(drafter_pairs={"window_pair": list(settings.window_pair), "cost_pair": list(settings.cost_pair)})


def _window_row(client: Any, context: int, kind: str, max_new_tokens: int, seed: int) -> dict[str, Any]:
    """One greedy request's drafting (the window check's half on this server)."""
    prompt = build_prompt(lambda t: client.tokenize(t, add_special_tokens=True), context, kind, seed=seed)
    client.flush_cache()
    tr = client.generate(input_ids=prompt.input_ids, stream=True,
                         sampling_params={"max_new_tokens": max_new_tokens, "temperature": 0.0, "ignore_eos": True})
    spec = spec_fields_from_meta(tr.meta_info) if not tr.error else None
    return {"context_tokens": context, "kind": kind, "error": tr.error, "output_ids": tr.output_ids,
            "verify_ct": spec.verify_ct if spec else None, "correct_drafts": spec.num_correct_drafts if spec else None,
            "histogram": spec.correct_drafts_histogram if spec else None, "completion_tokens": tr.completion_tokens}


class _WindowPlan:
    def __init__(self, contexts: Sequence[int]) -> None:
        self._requests = [{"context_tokens": int(c), "kind": k} for c in contexts for k in ("novel", "predictable")]

    def requests(self) -> list[dict[str, Any]]:
        return list(self._requests)

    def pending(self, done: Any) -> list[dict[str, Any]]:
        done = set(done)
        return [q for q in self._requests if tuple(q[k] for k in WINDOW_KEY) not in done]


def sweep_arm(job: Any) -> list[str]:
    """03's timed requests on the arm's server (and the window check's, with ``window_contexts``) into its run
    folder, ``params.03_drafter_inspection`` beside them; returns what was not measured."""
    from specdiag.serving import make_client  # noqa: PLC0415 - live only: replay loads no server code

    s: SweepSettings = job.settings
    client = make_client(job.url)
    window = job.server_info.get("speculative_draft_window_size")
    plan = drafter.TimingPlan(tuple(s.contexts), s.max_new_tokens, s.prompt_kind, s.seed, window, s.repeats)
    job.run.update(server_url=job.url, params={NOTEBOOK: {
        "context_lengths": list(s.contexts), "max_new_tokens": s.max_new_tokens, "prompt_kind": s.prompt_kind,
        "seed": s.seed, "repeats": s.repeats}})
    not_run: list[str] = []
    measure_missing(job.run, plan, "drafter_timing", drafter.TIMING_KEY, desc=f"{job.arm.name} draft timing",
                    measure=lambda q: drafter.measure_draft_timing(client, q["context_tokens"], s.max_new_tokens,
                                                                   s.prompt_kind, q["seed"], window,
                                                                   q.get("warmup", False)),
                    report=job.progress, deadline_s=job.deadline_s, not_run=not_run)
    if s.window_contexts:
        measure_missing(job.run, _WindowPlan(s.window_contexts), WINDOW_TABLE, WINDOW_KEY,
                        lambda q: _window_row(client, q["context_tokens"], q["kind"], s.max_new_tokens, s.seed),
                        desc=f"{job.arm.name} window check", report=job.progress, deadline_s=job.deadline_s,
                        not_run=not_run)
    return not_run


def _arm_run(run: Any, name: str) -> Run | None:
    folder = Path(run.path) / name
    return Run.open(folder) if (folder / "run.json").is_file() else None


def _sliding_window(run: Run) -> int | None:
    """The drafter's sliding window as its config says (the arm's configured drafter folder), None when unknown."""
    drafter_path = ((run.meta.get("arm") or {}).get("configured") or {}).get("speculation", {}).get("drafter")
    cfg = Path(str(drafter_path)) / "config.json" if drafter_path else None
    return json.loads(cfg.read_text()).get("sliding_window") if cfg is not None and cfg.is_file() else None


def window_check_rows(shipped: Sequence[Mapping[str, Any]], full: Sequence[Mapping[str, Any]],
                      window_tokens: int | None) -> list[dict[str, Any]]:
    """``drafter_window_check`` rows (pure): per context and kind, the two servers' drafting of the same greedy
    prompt side by side, and whether it was the same."""
    theirs = {(r["context_tokens"], r["kind"]): r for r in full}
    out = []
    for x in shipped:
        y = theirs.get((x["context_tokens"], x["kind"]))
        if y is None:
            continue
        out.append({
            "context_tokens": x["context_tokens"], "kind": x["kind"], "window_tokens": window_tokens,
            "beyond_window": window_tokens is not None and x["context_tokens"] > window_tokens,
            "verify_ct_as_shipped": x["verify_ct"], "verify_ct_all_full": y["verify_ct"],
            "correct_drafts_as_shipped": x["correct_drafts"], "correct_drafts_all_full": y["correct_drafts"],
            "histogram_as_shipped": x["histogram"], "histogram_all_full": y["histogram"],
            "same_output_ids": x["output_ids"] == y["output_ids"],
            "same_drafting": ((x["verify_ct"], x["histogram"], x["correct_drafts"])
                              == (y["verify_ct"], y["histogram"], y["correct_drafts"]))
            if x["verify_ct"] is not None else None,
            "error": x["error"] or y["error"],
            "source": "measured: the same prompt (greedy) sent to the server with the drafter as shipped and to one "
                      "with its all-full-attention copy (same weights)"})
    return out


def cost_rows(standalone: Sequence[Mapping[str, Any]], ngram: Sequence[Mapping[str, Any]],
              draft_steps: int | None) -> list[dict[str, Any]]:
    """``drafter_cost`` rows (pure): per context both arms hold, the STANDALONE arm's ms per verify step minus the
    NGRAM arm's (medians over their requests; the requests' values kept for 03's comparison over requests)."""
    def by_context(rows: Sequence[Mapping[str, Any]]) -> dict[int, list[Mapping[str, Any]]]:
        out: dict[int, list[Mapping[str, Any]]] = {}
        for r in latest_rows([dict(x) for x in rows]):
            if not r.get("error") and r.get("step_ms") is not None:
                out.setdefault(int(r["context_tokens"]), []).append(r)
        return out

    def med(values: list[Any]) -> float | None:
        xs = [float(v) for v in values if v is not None]
        return statistics.median(xs) if xs else None

    a, b = by_context(standalone), by_context(ngram)
    out = []
    for c in sorted(set(a) & set(b)):
        s_ms, n_ms = [float(r["step_ms"]) for r in a[c]], [float(r["step_ms"]) for r in b[c]]
        ds, dn = med(s_ms), med(n_ms)
        per_verify = ds - dn if ds is not None and dn is not None else None
        out.append({"context_tokens": c, "standalone_step_ms": ds, "ngram_step_ms": dn,
                    "standalone_request_ms": s_ms, "ngram_request_ms": n_ms,
                    "drafter_ms_per_verify_step": per_verify, "draft_steps_per_verify_step": draft_steps,
                    "drafter_ms_per_draft_step": per_verify / draft_steps if per_verify is not None and draft_steps
                    else None,
                    "standalone_commit_length": med([r.get("commit_length") for r in a[c]]),
                    "ngram_commit_length": med([r.get("commit_length") for r in b[c]]),
                    "source": "computed from measured ms per verify step (sweep rows of the STANDALONE and NGRAM "
                              "servers, same target, same prompts)"})
    return out


def sweep_end(run: Any, arms: Any, work: Any) -> None:
    """The pairs' tables, written into the first arm's run folder (where 03 replays them)."""
    pairs = dict(run.meta.get("drafter_pairs") or {})
    window_pair, cost_pair = list(pairs.get("window_pair") or []), list(pairs.get("cost_pair") or [])
    if len(window_pair) == 2:
        shipped, full = (_arm_run(run, n) for n in window_pair)
        if shipped is not None and full is not None:
            for row in window_check_rows(shipped.rows(WINDOW_TABLE), full.rows(WINDOW_TABLE),
                                         _sliding_window(shipped)):
                shipped.append_row(drafter.WINDOW_CHECK_TABLE, row)
    if len(cost_pair) == 2:
        standalone, ngram = (_arm_run(run, n) for n in cost_pair)
        if standalone is not None and ngram is not None:
            arm = (run.meta.get("arms") or {}).get(cost_pair[0]) or {}
            server = arm.get("server") or {}
            steps = server.get("speculative_num_steps") or (int(server["speculative_num_draft_tokens"]) - 1
                                                            if server.get("speculative_num_draft_tokens") else None)
            for row in cost_rows(standalone.rows("sweep"), ngram.rows("sweep"), steps):
                standalone.append_row(drafter.COST_TABLE, row)
            standalone.update(drafter_cost_note=(
                f"drafter_cost.jsonl: per context, {cost_pair[0]}'s ms per verify step minus {cost_pair[1]}'s (same "
                "target and prompts, both measured by 01's sweep here) = the drafter's draft steps plus its "
                "bookkeeping. Flat: the drafter's attention is bounded (sliding window honoured); growing with "
                "context: its layers attend the whole context."))
