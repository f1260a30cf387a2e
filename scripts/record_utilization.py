"""Record notebook 02's measurement where papermill is not installed (the GPU device machine).

It calls the library function the notebook calls when measuring
(``specdiag.steps.gpu_utilization.record.measure_utilization``) and writes an ordinary run folder, which
notebook 02 then replays anywhere::

    python scripts/record_utilization.py --embedded --device cuda --context-tokens 8192 \\
        --max-new-tokens 1024 --telemetry nvml --gpu 0 --out-dir /tmp/run
    # then, on any machine:
    papermill notebooks/02_gpu_utilization.ipynb out.ipynb -p replay_dir /tmp/run

``--embedded`` starts the embedded server (``specdiag.localserver.EmbeddedServer``) on ``--device``
for the recording and stops it after; ``--server-url`` uses a running server instead. run.json gets
a ``recorded_with`` section: date, command, host, GPU and driver (NVML), library versions.
"""

from __future__ import annotations

import argparse
import datetime as dt
import platform
import shlex
import sys
from pathlib import Path
from typing import Any

from specdiag import hardware
from specdiag.serving import SGLangClient
from specdiag.runs import Run
from specdiag.telemetry.sampler import open_source
from specdiag.steps.gpu_utilization.analysis import phase_stats, phase_windows, rows_of_request, stat
from specdiag.steps.gpu_utilization.record import measure_utilization


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--server-url", help="a running SGLang or embedded server, e.g. http://127.0.0.1:30000")
    where.add_argument("--embedded", action="store_true", help="start the embedded server for the recording")
    p.add_argument("--out-dir", required=True, help="run folder to write (created)")
    p.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"), help="embedded server's device")
    p.add_argument("--algorithm", default="STANDALONE", choices=("STANDALONE", "NGRAM", "NONE"),
                   help="embedded server's speculative algorithm")
    p.add_argument("--num-draft-tokens", type=int, default=8, help="embedded server's speculative_num_draft_tokens")
    p.add_argument("--model-path", default=None, help="embedded target model folder (default data/models/target)")
    p.add_argument("--draft-model-path", default=None, help="embedded drafter folder (default data/models/drafter)")
    p.add_argument("--server-arg", action="append", default=[],
                   help="extra embedded-server argument, repeatable (e.g. --server-arg=--dtype=bfloat16)")
    p.add_argument("--context-tokens", type=int, required=True, help="prompt length, tokens")
    p.add_argument("--max-new-tokens", type=int, required=True,
                   help="tokens to decode (ignore_eos); with --decode-seconds, the most to decode")
    p.add_argument("--decode-seconds", type=float, default=0.0,
                   help="aim for this many seconds of decode: a 64-token calibration request at the same context "
                        "measures the decode rate first (0: decode exactly --max-new-tokens)")
    p.add_argument("--sample-hz", type=float, default=50.0, help="sampling rate, samples per second")
    p.add_argument("--telemetry", default="auto", help="auto, nvml, cpu or a Prometheus URL")
    p.add_argument("--gpu", type=int, action="append", default=None, help="GPU index to sample, repeatable")
    p.add_argument("--idle-s", type=float, default=1.0, help="seconds sampled before and after the request")
    p.add_argument("--seed", type=int, default=0, help="seed of the novel prose")
    p.add_argument("--server-timeout-s", type=float, default=600.0, help="embedded server start-up limit, s")
    args = p.parse_args(argv)
    if args.context_tokens < 1 or args.max_new_tokens < 2:
        p.error("--context-tokens must be >= 1 and --max-new-tokens >= 2")
    return args


def gpu_facts() -> dict[str, Any]:
    """GPU and driver as NVML and torch see them (empty values where absent)."""
    out = hardware.nvml_gpu_facts()
    for mod in ("torch", "transformers", "pynvml", "fastapi", "uvicorn"):
        try:
            m = __import__(mod)
            out[f"{mod}_version"] = getattr(m, "__version__", "?")
        except Exception:  # noqa: BLE001
            out[f"{mod}_version"] = None
    try:
        import torch

        out["torch_cuda"] = torch.version.cuda
    except Exception:  # noqa: BLE001
        pass
    return out


def calibrated_new_tokens(client: SGLangClient, context_tokens: int, decode_seconds: float, most: int) -> int:
    """New tokens for about ``decode_seconds`` of decode, from a 64-token request at the same context."""
    from specdiag.measure.metrics import sweep_row
    from specdiag.prompts import build_prompt

    prompt = build_prompt(lambda t: client.tokenize(t, add_special_tokens=True), context_tokens, "novel", seed=1)
    client.flush_cache()
    trace = client.generate(input_ids=prompt.input_ids, stream=True,
                            sampling_params={"max_new_tokens": 64, "ignore_eos": True, "temperature": 0.0})
    rate = sweep_row(trace, context_tokens).get("decode_tok_s")
    if trace.error or not rate:
        raise RuntimeError(f"the calibration request failed or had no decode window: {trace.error}")
    print(f"calibration: {rate:.1f} decoded tokens/s at {context_tokens:,} tokens of context (measured)")
    return max(2, min(most, int(decode_seconds * rate)))


def record(args: argparse.Namespace, url: str, server_command: list[str] | None) -> dict[str, Any]:
    run = Run.create(args.out_dir, label="utilization")
    run.update(params={"02_gpu_utilization": {
        "context_tokens": args.context_tokens, "max_new_tokens": args.max_new_tokens, "sample_hz": args.sample_hz,
        "telemetry": args.telemetry, "gpu_indices": args.gpu or [], "idle_s": args.idle_s, "seed": args.seed}},
        server_url=url)
    run.update(recorded_with={
        "date_utc": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join(shlex.quote(a) for a in [sys.executable, *sys.argv]),
        "server_command": " ".join(shlex.quote(a) for a in server_command) if server_command else None,
        "host": platform.node(), "python": platform.python_version(), **gpu_facts()})
    source = open_source(args.telemetry, args.gpu)
    client = SGLangClient(url)
    client.check_reachable()
    max_new = args.max_new_tokens
    if args.decode_seconds > 0:
        max_new = calibrated_new_tokens(client, args.context_tokens, args.decode_seconds, args.max_new_tokens)
        run.update(calibration={"decode_seconds_aimed": args.decode_seconds, "max_new_tokens": max_new})
        print(f"calibrated: {max_new} new tokens for about {args.decode_seconds:g} s of decode")
    return measure_utilization(run, client, source, args.context_tokens, max_new,
                               sample_hz=args.sample_hz, idle_s=args.idle_s, seed=args.seed,
                               gpu_index=(args.gpu or [0])[0])


def summary(out_dir: str, request: dict[str, Any]) -> str:
    rows = rows_of_request(Run.open(out_dir).rows("telemetry"), request)
    lines = [f"request: error={request.get('error')} prompt_tokens={request.get('prompt_tokens')} "
             f"completion_tokens={request.get('completion_tokens')} ttft_s={request.get('ttft_s')} "
             f"e2e_s={request.get('e2e_s')} step_ms={request.get('step_ms')} commit={request.get('commit_length')}",
             f"sampler: {request.get('sampler')}"]
    if request.get("t_send_unix_s") is not None:
        stats = phase_stats(rows, phase_windows(request), trim_s=1.0)
        for s in stats:
            keys = ("gpu_util_pct", "sm_active_pct", "mem_util_pct", "dram_bw_util_pct", "sm_clock_mhz", "power_w",
                    "cpu_util_pct")
            vals = " ".join(f"{k}={s[k + '_median']:.3g}" for k in keys if k + "_median" in s)
            lines.append(f"{s['device']} {s['phase']:>7} n={s['n_samples']} span={s['span_s']:.2f}s {vals}")
        lines.append(f"decode gpu_util median: {stat(stats, rows[0]['device'], 'decode', 'gpu_util_pct_median')}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.embedded:
        from specdiag.localserver import EmbeddedServer

        log = Path(args.out_dir) / "server.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        server = EmbeddedServer(algorithm=args.algorithm, num_draft_tokens=args.num_draft_tokens, device=args.device,
                                log_path=log, extra_args=args.server_arg, model_path=args.model_path,
                                draft_model_path=args.draft_model_path)
        server.start(timeout_s=args.server_timeout_s)
        try:
            request = record(args, server.url, server.command())
        finally:
            server.stop()
    else:
        request = record(args, args.server_url, None)
    print(summary(args.out_dir, request))
    return 0 if not request.get("error") else 1


if __name__ == "__main__":
    sys.exit(main())
