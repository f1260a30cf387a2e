"""11's measurement on a live SGLang 0.5.17 serving an MoE model, started with the recorder (see docs/moe-batch1.md
for the launch flags and the model recipe):

1. **untimed recorder pass**: ``/start_expert_distribution_record``, a few requests, ``/stop_...``, ``/dump_...``; the
   dump (a torch file the server writes under its ``SGLANG_EXPERT_DISTRIBUTION_RECORDER_DIR``, which must be readable
   here: ``recorder_dir``) is copied into the run folder as ``files/expert_distribution_t<T>.pt``;
2. **timed requests** with the recorder stopped: ms per verify step (01's ``step_ms``) per context -> ``moe_steps``;
3. **routed experts of one request** (``--enable-return-routed-experts``; the request asks with
   ``return_routed_experts``): the answer's base64 kept as ``files/routed_experts_t<T>.json`` and its windows'
   distinct experts -> ``moe_routing``; where the server does not return them beside speculation, the row says so.

``T`` is the server's tokens per verify step (``speculative_num_draft_tokens``; 1 without speculation). One server
is one T: ``specdiag sweep --measure moe_batch1 --arms params/arms/moe-batch1.yaml`` starts one per T (1, 2, 4, 8,
16), one after another, into the same run folder (:func:`sweep_arm`, with :class:`SweepSettings`).
"""

from __future__ import annotations

import json
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from specdiag.measure.metrics import error_row, sweep_row
from specdiag.measure.request import exact_prompt, measured_request, send
from specdiag.steps.moe_batch1 import recorder
from specdiag.steps.moe_batch1.routing import captured_rows, decode_sglang, window_table

STEPS_TABLE = "moe_steps"
ROUTING_TABLE = "moe_routing"
DUMPS_TABLE = "moe_dumps"
FILES_DIR = "files"


def tokens_per_step(server_info: Mapping[str, Any]) -> int:
    """The server's tokens per verify step: speculative_num_draft_tokens, 1 without speculation."""
    if not server_info.get("speculative_algorithm"):
        return 1
    return int(server_info.get("speculative_num_draft_tokens") or 1)


def model_config(server_info: Mapping[str, Any]) -> dict[str, Any] | None:
    """The served model's config.json when its model_path is readable here (None otherwise)."""
    path = Path(str(server_info.get("model_path") or "")) / "config.json"
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def recorder_pass(client: Any, run: Any, recorder_dir: str, contexts: Sequence[int], max_new_tokens: int,
                  seed: int = 0, progress: Callable[[str], None] = print) -> dict[str, Any]:
    """The untimed pass (module docstring, 1); returns its ``moe_dumps`` row (also appended)."""
    info = client.server_info()
    t = tokens_per_step(info)
    row: dict[str, Any] = {"ts_unix_s": time.time(), "tokens_per_step": t, "contexts": list(contexts),
                           "max_new_tokens": max_new_tokens, "recorder_mode": info.get("expert_distribution_recorder_mode"),
                           "file": None, "passes": None, "error": None}
    if info.get("expert_distribution_recorder_mode") != "per_pass":
        row["error"] = (f"the server's expert_distribution_recorder_mode is {info.get('expert_distribution_recorder_mode')!r}: "
                        "start it with --expert-distribution-recorder-mode per_pass "
                        "--expert-distribution-recorder-buffer-size -1")
        run.append_row(DUMPS_TABLE, row)
        return row
    prompts = [exact_prompt(client, c, "novel", seed + 100 + i) for i, c in enumerate(contexts)]
    client.reset_cache()
    t0 = time.time()
    client.expert_distribution("start")
    try:
        for p in prompts:
            send(client, p.input_ids, max_new_tokens)
    finally:
        client.expert_distribution("stop")
    client.expert_distribution("dump")
    found = None
    for _ in range(40):  # the scheduler writes the file after answering
        found = recorder.newest(recorder_dir, since_unix_s=t0 - 1.0)
        if found:
            break
        time.sleep(0.25)
    if found is None:
        row["error"] = (f"no {recorder.FILE_GLOB} newer than the pass in {recorder_dir}: recorder_dir must be the "
                        "server's SGLANG_EXPERT_DISTRIBUTION_RECORDER_DIR on this machine")
    else:
        dest = Path(run.path) / FILES_DIR / f"expert_distribution_t{t}.pt"
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(found, dest)
        dump = recorder.load(dest)
        row.update(file=f"{FILES_DIR}/{dest.name}", passes=len(dump.passes), num_layers=dump.num_layers,
                   num_experts=dump.num_experts, source_file=found.name)
        progress(f"T={t}: recorder dump with {len(dump.passes)} passes -> {dest.name}")
    run.append_row(DUMPS_TABLE, row)
    return row


def timed_requests(client: Any, run: Any, contexts: Sequence[int], max_new_tokens: int, repeats: int,
                   seed: int = 0, progress: Callable[[str], None] = print) -> list[dict[str, Any]]:
    """Timed requests (recorder stopped), one ``moe_steps`` row each: 01's columns plus ``tokens_per_step``."""
    t = tokens_per_step(client.server_info())
    rows = []
    for ctx in contexts:
        for rep in range(repeats):
            done = measured_request(client, ctx, "novel", seed + rep, max_new_tokens)
            labels = dict(tokens_per_step=t, repeat=rep, seed=seed + rep, max_new_tokens=max_new_tokens)
            row = sweep_row(done.trace, ctx, **labels) if done.trace is not None else \
                error_row(ctx, done.error or "no trace", done.t_send_unix_s, **labels)
            run.append_row(STEPS_TABLE, row)
            rows.append(row)
            progress(f"T={t} {ctx:,} tokens: " + (f"{row['step_ms']:.2f} ms per verify step" if row.get("step_ms")
                                                  else f"error {row.get('error')}"))
    return rows


def routed_request(client: Any, run: Any, context: int, max_new_tokens: int, config: Mapping[str, Any] | None,
                   seed: int = 0) -> dict[str, Any]:
    """One request with ``return_routed_experts``; its ``moe_routing`` row (module docstring, 3)."""
    info = client.server_info()
    t = tokens_per_step(info)
    row: dict[str, Any] = {"ts_unix_s": time.time(), "tokens_per_step": t, "context_tokens": context,
                           "enabled": bool(info.get("enable_return_routed_experts")), "file": None, "error": None}
    if not row["enabled"]:
        row["error"] = "the server was started without --enable-return-routed-experts"
        run.append_row(ROUTING_TABLE, row)
        return row
    prompt = exact_prompt(client, context, "novel", seed + 300)
    client.reset_cache()
    trace = client.generate(input_ids=prompt.input_ids, stream=False,
                            sampling_params={"max_new_tokens": max_new_tokens, "temperature": 0.0, "ignore_eos": True},
                            extra_body={"return_routed_experts": True})
    b64 = (trace.meta_info or {}).get("routed_experts")
    if trace.error or not b64:
        row["error"] = trace.error or "the answer's meta_info holds no routed_experts (not returned beside speculation?)"
        run.append_row(ROUTING_TABLE, row)
        return row
    dest = Path(run.path) / FILES_DIR / f"routed_experts_t{t}.json"
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_text(json.dumps({"routed_experts": b64, "prompt_tokens": trace.prompt_tokens,
                                "completion_tokens": trace.completion_tokens, "tokens_per_step": t,
                                "num_hidden_layers": (config or {}).get("num_hidden_layers"),
                                "num_experts_per_tok": (config or {}).get("num_experts_per_tok"),
                                "recorded": f"SGLang /generate with return_routed_experts, {time.strftime('%Y-%m-%d')}"}))
    layers = int((config or {}).get("num_hidden_layers") or 0)
    k = int((config or {}).get("num_experts_per_tok") or 0)
    experts = int((config or {}).get("n_routed_experts") or 0)
    row.update(file=f"{FILES_DIR}/{dest.name}", prompt_tokens=trace.prompt_tokens,
               completion_tokens=trace.completion_tokens)
    if layers and k and experts:
        routed = decode_sglang(b64, layers, k)
        expected_rows = (trace.prompt_tokens or 0) + trace.completion_tokens - 1
        row.update(rows=int(routed.shape[0]), rows_expected=expected_rows,
                   rows_match=int(routed.shape[0]) == expected_rows,
                   ids_in_range=bool(((routed >= 0) & (routed < experts)).all()),
                   captured_rows=captured_rows(routed),
                   # generated tokens (what verify passes score) and the prompt's prose, in windows of T tokens
                   windows=window_table(routed, experts, first=trace.prompt_tokens or 0).to_dict("records"),
                   prompt_windows=window_table(routed[: trace.prompt_tokens or 0], experts).to_dict("records"))
    else:
        row["error"] = "the model's config.json is not readable here: the answer is kept undecoded"
    run.append_row(ROUTING_TABLE, row)
    return row


@dataclass(frozen=True)
class SweepSettings:
    """11's settings in a sweep (the arms file's ``settings:``, ``--contexts``, ``--set KEY=VALUE``)."""

    contexts: tuple[int, ...] = (1024, 16384)  # timed requests' prompt tokens
    recorder_contexts: tuple[int, ...] = (1024,)  # the untimed recorder pass's prompt tokens (the first: routed)
    max_new_tokens: int = 64
    repeats: int = 3  # timed requests per context (a comparison takes at least 3 per cell)
    seed: int = 0


def sweep_env(arm: Any, work: Path) -> dict[str, str]:
    """The recorder's folder of one server (SGLang writes its dumps there; this process reads them)."""
    folder = Path(work) / f"edr-{arm.name}"
    folder.mkdir(parents=True, exist_ok=True)
    return {"SGLANG_EXPERT_DISTRIBUTION_RECORDER_DIR": str(folder)}


def sweep_begin(run: Any, arms: Any, settings: SweepSettings) -> None:
    """What 11 reads beside the rows: the model's config and how it was made (its MADE_BY.txt), the data source."""
    model = next((a.model for a in arms.arms if a.model), None)
    config, made = None, None
    if model:
        cfg, made_by = Path(model) / "config.json", Path(model) / "MADE_BY.txt"
        config = json.loads(cfg.read_text()) if cfg.is_file() else None
        made = made_by.read_text() if made_by.is_file() else None
    run.update(data_source="measured", moe_model_config=config, moe_model_made_by=made)


def sweep_arm(job: Any) -> list[str]:
    """One server (one T): the recorder pass (SGLang), the timed requests, one routed-experts request; the server's
    facts appended to run.json ``moe_servers``."""
    from specdiag.serving import reach  # noqa: PLC0415 - live only: replay loads no server code

    s: SweepSettings = job.settings
    client = reach(job.url)
    info: dict[str, Any] = {"arm": job.arm.name, "tokens_per_step": tokens_per_step(job.server_info or
                                                                                    client.server_info()),
                            "routed_experts_flag": "--enable-return-routed-experts" in job.arm.flags,
                            "flags": list(job.arm.flags), "started": True, "url": job.url}
    try:
        if job.arm.engine == "sglang":
            recorder_pass(client, job.run, str(job.work / f"edr-{job.arm.name}"), s.recorder_contexts,
                          s.max_new_tokens, s.seed, progress=job.progress)
        timed_requests(client, job.run, s.contexts, s.max_new_tokens, s.repeats, s.seed, progress=job.progress)
        config = job.run.meta.get("moe_model_config") or model_config(job.server_info)
        row = routed_request(client, job.run, s.recorder_contexts[0], s.max_new_tokens, config, s.seed)
        job.progress(f"T={info['tokens_per_step']}: routed experts: "
                     + (row.get("error") or f"{row.get('rows')} rows, match {row.get('rows_match')}"))
    except Exception as exc:
        info["error"] = f"{type(exc).__name__}: {str(exc)[-1500:]}"
        raise
    finally:
        job.run.update(moe_servers=[*list(job.run.meta.get("moe_servers") or []), info])
    return []
