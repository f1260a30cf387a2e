"""Where each target-verify forward's KV lies in SGLang's pool: runs of consecutive slots, recorded when asked.

``SPECDIAG_SGLANG_LAYOUT=1`` registers a BEFORE hook on ``ModelRunner.forward`` (any attention backend, the plugin's
verify mode or none): for each TARGET_VERIFY forward of the target model it takes each request's prefix slots,
``req_to_token[req_pool_idx, :seq_len]`` (what the backends turn into ``kv_indices``: at page_size 1 the same ids in
the same order), and counts on the GPU the runs of consecutive slots, the tokens in runs of at least 64, and the
longest run (specdiag.kvlayout defines them; :func:`layout_counts` is its on-device form).

No host sync: the prefix lengths come from ``forward_batch.seq_lens_cpu`` (host memory already); the counts are
computed on a side stream after the forward's stream has queued its work, copied into pinned host memory without
blocking, and read once their CUDA event has completed, by the next call or by a background thread (every 0.5 s),
which also writes the stats file. Under CUDA-graph capture nothing is recorded (``torch.cuda.is_current_stream_
capturing()``: counted as skipped); ``ModelRunner.forward`` runs eagerly before every graph replay, so replayed steps
are recorded. A forward without ``seq_lens_cpu`` is skipped and counted, never synced for.

Records (``STATS["layout"]``, the last :data:`MAX_RECORDS`; and ``layout`` in the stats file): ``t_unix_s`` (host time
the forward was queued), ``forward`` (this process's count of verify forwards), ``batch``, and per request (at most
:data:`MAX_REQUESTS_PER_FORWARD`) ``prefix_tokens``, ``runs``, ``tokens_in_long_runs``, ``longest_run``.

Cost: a handful of small kernels over each request's prefix (a 128k prefix: ~1 MB of int32/int64) on a side stream,
beside the forward; under 1 % of a long-context verify step on the H200 (expected, not measured).
"""

from __future__ import annotations

import os
import threading
import time
from collections import Counter, deque

import torch

LAYOUT_ENV = "SPECDIAG_SGLANG_LAYOUT"
MODEL_RUNNER_FORWARD = "sglang.srt.model_executor.model_runner.ModelRunner.forward"
LONG_RUN = 64  # tokens: specdiag.kvlayout.LONG_RUN (a 64-token page)
MAX_RECORDS = 4096
MAX_REQUESTS_PER_FORWARD = 16

RECORDS: deque = deque(maxlen=MAX_RECORDS)
COUNTS: Counter = Counter()
_PENDING: list = []  # (event, pinned counts, record without counts)
_LOCK = threading.Lock()
_STATE: dict = {"forward": 0, "stream": None, "thread": None, "on_new": None, "dirty": False}


def layout_from_env(environ=os.environ) -> bool:
    value = environ.get(LAYOUT_ENV, "0").strip().lower() or "0"
    if value not in ("0", "1", "off", "on", "false", "true"):
        raise ValueError(f"{LAYOUT_ENV}={value!r}: 1 (record the KV layout of verify forwards) or 0 (off, the default)")
    return value in ("1", "on", "true")


def layout_counts(slots: torch.Tensor, long_run: int = LONG_RUN) -> torch.Tensor:
    """int64 ``[runs, tokens_in_long_runs, longest_run]`` of ``slots`` (one request's slot ids in sequence order),
    computed where ``slots`` lives without reading any value on the host (no sync). Empty: zeros."""
    n = slots.numel()
    if n == 0:
        return torch.zeros(3, dtype=torch.int64, device=slots.device)
    s = slots.reshape(-1).to(torch.int64)
    start = torch.ones(n, dtype=torch.bool, device=s.device)
    start[1:] = s[1:] != s[:-1] + 1
    run_id = torch.cumsum(start.to(torch.int64), 0) - 1
    lens = torch.zeros(n, dtype=torch.int64, device=s.device).scatter_add_(0, run_id, torch.ones_like(run_id))
    return torch.stack([start.sum(), (lens * (lens >= long_run)).sum(), lens.max()])


def _is_target_verify(model_runner, forward_batch) -> bool:
    mode = getattr(forward_batch, "forward_mode", None)
    return (mode is not None and bool(mode.is_target_verify())
            and not bool(getattr(model_runner, "is_draft_worker", False)))


def observe(model_runner, forward_batch) -> None:
    """Record the layout of one forward's requests if it is the target's verify forward (module docstring)."""
    if not _is_target_verify(model_runner, forward_batch):
        return
    if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
        COUNTS["skipped_capture"] += 1
        return
    lens_cpu = getattr(forward_batch, "seq_lens_cpu", None)
    pool = getattr(forward_batch, "req_to_token_pool", None) or getattr(model_runner, "req_to_token_pool", None)
    if lens_cpu is None or pool is None:
        COUNTS["skipped_no_seq_lens_cpu" if lens_cpu is None else "skipped_no_req_to_token"] += 1
        return
    lens = [int(x) for x in lens_cpu.tolist()[:MAX_REQUESTS_PER_FORWARD]]  # host memory: no sync
    req_idx = forward_batch.req_pool_indices
    table = pool.req_to_token
    _STATE["forward"] += 1
    record = {"t_unix_s": round(time.time(), 4), "forward": _STATE["forward"], "batch": int(lens_cpu.numel()),
              "prefix_tokens": lens}
    on_gpu = table.is_cuda
    stream = None
    if on_gpu:
        if _STATE["stream"] is None:
            _STATE["stream"] = torch.cuda.Stream(device=table.device)
        stream = _STATE["stream"]
        stream.wait_stream(torch.cuda.current_stream(table.device))
    ctx = torch.cuda.stream(stream) if stream is not None else _nullcontext()
    with ctx:
        rows = table.index_select(0, req_idx[: len(lens)].to(torch.int64))
        counts = torch.stack([layout_counts(rows[i, :n]) for i, n in enumerate(lens)]) if lens else \
            torch.zeros((0, 3), dtype=torch.int64, device=table.device)
        if on_gpu:
            host = torch.empty(counts.shape, dtype=torch.int64, pin_memory=True)
            host.copy_(counts, non_blocking=True)
            event = torch.cuda.Event()
            event.record(stream)
            req_idx.record_stream(stream)  # the batch's index tensor may be freed by the forward's stream meanwhile
        else:
            host, event = counts, None
    COUNTS["observed"] += 1
    with _LOCK:
        _PENDING.append((event, host, record))
    resolve()
    _ensure_thread()


class _nullcontext:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False


def resolve() -> int:
    """Move every pending record whose counts have arrived into :data:`RECORDS` (never waits); how many moved."""
    done = []
    with _LOCK:
        keep = []
        for event, host, record in _PENDING:
            (done if event is None or event.query() else keep).append((event, host, record))
        _PENDING[:] = keep
    for _, host, record in done:
        vals = host.tolist()
        record["requests"] = [{"prefix_tokens": n, "runs": int(v[0]), "tokens_in_long_runs": int(v[1]),
                               "longest_run": int(v[2])} for n, v in zip(record.pop("prefix_tokens"), vals)]
        with _LOCK:
            RECORDS.append(record)
    if done:
        _STATE["dirty"] = True
    return len(done)


def flush_new() -> None:
    """Resolve what has arrived and, when there is something new, call ``on_new`` (the plugin writes its stats file);
    the background thread's tick, callable directly (tests, shutdown)."""
    resolve()
    if _STATE["dirty"] and _STATE["on_new"] is not None:
        _STATE["dirty"] = False
        _STATE["on_new"]()


def _ensure_thread() -> None:
    """A daemon thread that resolves arrived records and calls ``on_new`` (the stats file) every 0.5 s, off the
    forward's path."""
    t = _STATE["thread"]
    if t is not None and t.is_alive():
        return

    def loop():
        while True:
            time.sleep(0.5)
            try:
                flush_new()
            except Exception:  # noqa: BLE001  never let the recorder take the server down
                COUNTS["resolve_errors"] += 1

    t = threading.Thread(target=loop, name="specdiag-layout", daemon=True)
    _STATE["thread"] = t
    t.start()


def before_forward_hook(model_runner, forward_batch, *args, **kwargs):
    """BEFORE hook of ModelRunner.forward: record, never fail the forward."""
    try:
        observe(model_runner, forward_batch)
    except Exception as exc:  # noqa: BLE001
        COUNTS[f"error: {type(exc).__name__}: {str(exc)[:200]}"] += 1
    return None


def snapshot() -> dict:
    with _LOCK:
        records, counts, pending = list(RECORDS), dict(COUNTS), len(_PENDING)
    return {"records": records, "counts": counts, "pending": pending, "long_run": LONG_RUN}
