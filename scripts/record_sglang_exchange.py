"""Record a real SGLang server's replies, byte for byte, for the contract tests (tests/data/sglang-0.5.17/raw-*/).

Every endpoint the suite uses is asked once and kept as it answered: ``/server_info``, ``/get_server_info``,
``/model_info``, ``/get_model_info``, ``/health``, ``/health_generate``, ``/metrics`` (before and after), ``/v1/models``,
``/flush_cache``, ``/tokenize``; then ``/generate`` streamed (every byte as received, with the read times) on
predictable and on novel text, the same requests through specdiag's client (``client_parse_*.json``: what it made of
the stream, so a disagreement shows beside the bytes), a non-streamed request, and an over-long prompt streamed and
not. JSON passes through specdiag's redaction; each exchange has a ``.meta.json`` (status, headers, timing).

The server: a running one (``--url``), or one arm of an arms file started for the recording and stopped after
(``--arms FILE --arm NAME``: the sweep's own server holder, specdiag.sweep.servers.serving)::

    python scripts/record_sglang_exchange.py --arms params/arms/tiny-notebooks.yaml --arm standalone \\
        --site /tmp/site --out tests/data/sglang-0.5.17/raw-tiny-standalone
    python scripts/record_sglang_exchange.py --url http://127.0.0.1:30000 --out /tmp/raw
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
from pathlib import Path
from typing import Any, Iterator

import requests

from specdiag.prompts import build_prompt
from specdiag.serving import make_client
from specdiag.serving.redaction import redact, redact_text

#: prompts longer than this are kept as their length and first ids, not whole
SHOWN_IDS = 4096


def write_json(path: Path, obj: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(redact(obj), indent=2, default=str) + "\n")


def save_exchange(raw_dir: Path, name: str, method: str, url: str, body: Any = None, timeout: float = 60,
                  stream: bool = False) -> None:
    """One HTTP exchange: the response body verbatim (stream: every byte, as received) under ``raw_dir``, JSON passed
    through specdiag's redaction, and a .meta.json with status, headers and timing."""
    t0 = time.perf_counter()
    shown = body
    if isinstance(body, dict) and len(body.get("input_ids") or []) > SHOWN_IDS:
        shown = {**body, "input_ids": f"<{len(body['input_ids'])} ids, first {body['input_ids'][:8]}>"}
    meta: dict[str, Any] = {"method": method, "path": url.split("/", 3)[-1], "request_body": shown}
    try:
        r = requests.request(method, url, json=body, timeout=timeout, stream=stream)
    except requests.RequestException as exc:
        meta["error"] = f"{type(exc).__name__}: {exc}"
        write_json(raw_dir / f"{name}.meta.json", meta)
        print(f"raw {name}: {meta['error']}")
        return
    if stream:
        chunks, times = [], []
        for chunk in r.iter_content(chunk_size=None):
            chunks.append(chunk)
            times.append(round(time.perf_counter() - t0, 6))
        data = b"".join(chunks)
        meta.update(read_times_s=times, read_sizes=[len(c) for c in chunks])
    else:
        data = r.content
    meta.update(status=r.status_code, headers=dict(r.headers), elapsed_s=round(time.perf_counter() - t0, 4),
                bytes=len(data))
    if "json" in r.headers.get("content-type", "") and not stream:
        try:
            write_json(raw_dir / f"{name}.json", json.loads(data))
        except ValueError:
            (raw_dir / f"{name}.txt").write_text(redact_text(data.decode(errors="replace")))
    else:
        text = data.decode(errors="replace")
        red = redact_text(text)
        meta["redacted_changed_bytes"] = red != text
        (raw_dir / f"{name}{'.sse' if stream else '.txt'}").write_bytes(red.encode() if red != text else data)
    write_json(raw_dir / f"{name}.meta.json", meta)
    print(f"raw {name}: HTTP {r.status_code}, {len(data):,} bytes, {meta['elapsed_s']} s")


def record(url: str, raw_dir: Path, context_tokens: int) -> None:
    """Every exchange of the module doc against the server at ``url``."""
    client = make_client(url, "sglang")
    for name, path in (("server_info", "/server_info"), ("get_server_info", "/get_server_info"),
                       ("model_info", "/model_info"), ("get_model_info", "/get_model_info"), ("health", "/health"),
                       ("health_generate", "/health_generate"), ("metrics_before", "/metrics"),
                       ("v1_models", "/v1/models")):
        save_exchange(raw_dir, name, "GET", url + path)
    save_exchange(raw_dir, "flush_cache", "POST", url + "/flush_cache")
    save_exchange(raw_dir, "tokenize", "POST", url + "/tokenize",
                  {"prompt": "The cat sat on the mat.", "add_special_tokens": True})
    limit = int(client.server_info().get("context_length") or 16384)
    context_tokens = min(context_tokens, limit - 64)
    tok = lambda t: client.tokenize(t, add_special_tokens=True)  # noqa: E731
    sp = {"max_new_tokens": 32, "temperature": 0.0, "ignore_eos": True}
    for kind in ("predictable", "novel"):
        prompt = build_prompt(tok, context_tokens, kind, seed=0)
        client.flush_cache()
        save_exchange(raw_dir, f"generate_stream_{kind}_{context_tokens}", "POST", url + "/generate",
                      {"input_ids": prompt.input_ids, "sampling_params": sp, "stream": True}, timeout=300, stream=True)
        client.flush_cache()  # the same request through specdiag's client
        trace = client.generate(input_ids=prompt.input_ids, sampling_params=sp, stream=True)
        write_json(raw_dir / f"client_parse_{kind}_{context_tokens}.json", {
            "error": trace.error, "error_kind": trace.error_kind, "stream_mode": trace.stream_mode,
            "n_chunks": trace.n_chunks, "completion_tokens": trace.completion_tokens,
            "prompt_tokens": trace.prompt_tokens, "chunk_tokens": trace.chunk_tokens,
            "spec": trace.spec.__dict__ if trace.spec is not None else None,
            "final_meta_info_keys": sorted(trace.meta_info), "finish_reason": trace.finish_reason})
        if trace.error:
            print(f"CLIENT DISAGREES with the server on a {kind} stream: {trace.error}")
    prompt = build_prompt(tok, min(context_tokens, 256), "novel", seed=1)
    save_exchange(raw_dir, "generate_nonstream", "POST", url + "/generate",
                  {"input_ids": prompt.input_ids, "sampling_params": {**sp, "max_new_tokens": 16}, "stream": False},
                  timeout=120)
    for name, stream in (("generate_error_overlong", False), ("generate_error_overlong_stream", True)):
        save_exchange(raw_dir, name, "POST", url + "/generate",
                      {"input_ids": [1] * (limit + 16), "sampling_params": sp, "stream": stream}, timeout=120,
                      stream=stream)
    save_exchange(raw_dir, "metrics_after", "GET", url + "/metrics")
    save_exchange(raw_dir, "server_info_after", "GET", url + "/server_info")


@contextlib.contextmanager
def server_of(args: argparse.Namespace) -> Iterator[str]:
    """The URL to record: ``--url`` as it is, or the arms file's arm started for the block and stopped after."""
    if args.url:
        yield args.url.rstrip("/")
        return
    from specdiag.sweep.arms import load_arms  # noqa: PLC0415
    from specdiag.sweep.servers import Host, serving  # noqa: PLC0415

    (arm,) = load_arms(args.arms).select([args.arm]).arms
    host = Host(work=Path(args.out).parent / "servers", site=args.site, plugin_path=args.plugin_path)
    with serving(arm, host, args.startup_s) as server:
        yield server.url


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--url", help="a running SGLang server, e.g. http://127.0.0.1:30000")
    where.add_argument("--arms", help="an arms file whose --arm is started for the recording")
    p.add_argument("--arm", default="", help="the arm of --arms to start")
    p.add_argument("--out", required=True, help="the folder of the exchanges (created)")
    p.add_argument("--context", type=int, default=1024, help="prompt tokens of the streamed requests")
    p.add_argument("--site", default="", help="SGLang's site folder (an arm started here)")
    p.add_argument("--plugin-path", default="", help="the installed plugin (an arm started here)")
    p.add_argument("--startup-s", type=float, default=600.0, help="longest wait for the arm's server")
    args = p.parse_args(argv)
    if args.arms and not args.arm:
        p.error("--arms needs --arm NAME: the arm whose server to record")
    with server_of(args) as url:
        record(url, Path(args.out), args.context)
    return 0


if __name__ == "__main__":
    sys.exit(main())
