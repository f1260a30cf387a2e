"""Record one real exchange with a vLLM server, byte for byte, for the contract tests (tests/data/vllm/).

    .venv/bin/python scripts/record_vllm_exchange.py --url http://127.0.0.1:8000 --out tests/data/vllm

Writes: v1_models.json, version.json, tokenize_request.json + tokenize.json, metrics_before.txt,
stream_request.json + stream.sse (the raw bytes of a streamed /v1/completions with include_usage and
return_token_ids; "The cat sat on the mat." repeated), metrics_after.txt, error_request.json + error.json
(status and body of a prompt longer than max_model_len), reset_prefix_cache.json, server_info.json (dev mode),
and provenance.json (vLLM version, server command line as given, date, machine). Nothing else may run on
the server meanwhile: the metrics difference must be this request's alone.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import platform
from pathlib import Path

import requests

from specdiag.prompts import PREDICTABLE_SENTENCE


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--url", required=True)
    p.add_argument("--out", default="tests/data/vllm")
    p.add_argument("--max-tokens", type=int, default=48)
    p.add_argument("--server-command", default="", help="the server's command line, for provenance")
    args = p.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    s = requests.Session()
    u = args.url.rstrip("/")

    def save(name: str, data: bytes) -> None:
        (out / name).write_bytes(data)
        print(f"{out / name}: {len(data)} bytes")

    models = s.get(f"{u}/v1/models", timeout=30)
    save("v1_models.json", models.content)
    model = models.json()["data"][0]["id"]
    save("version.json", s.get(f"{u}/version", timeout=30).content)
    info = s.get(f"{u}/server_info", params={"config_format": "json"}, timeout=30)
    save("server_info.json", json.dumps({"status": info.status_code, "body": info.json() if info.ok else info.text},
                                        indent=1).encode())
    reset = s.post(f"{u}/reset_prefix_cache", timeout=30)
    save("reset_prefix_cache.json", json.dumps({"status": reset.status_code, "body": reset.text}).encode())
    tok_req = {"model": model, "prompt": PREDICTABLE_SENTENCE * 24, "add_special_tokens": False}
    save("tokenize_request.json", json.dumps(tok_req).encode())
    tok = s.post(f"{u}/tokenize", json=tok_req, timeout=30)
    save("tokenize.json", tok.content)
    ids = tok.json()["tokens"]
    save("metrics_before.txt", s.get(f"{u}/metrics", timeout=30).content)
    req = {"model": model, "prompt": ids, "max_tokens": args.max_tokens, "temperature": 0.0, "ignore_eos": True,
           "stream": True, "stream_options": {"include_usage": True}, "return_token_ids": True}
    save("stream_request.json", json.dumps(req).encode())
    with s.post(f"{u}/v1/completions", json=req, stream=True, timeout=300) as r:
        r.raise_for_status()
        save("stream.sse", b"".join(r.raw.stream(65536, decode_content=True)))
    save("metrics_after.txt", s.get(f"{u}/metrics", timeout=30).content)
    max_len = models.json()["data"][0].get("max_model_len") or 4096
    err_req = {"model": model, "prompt": [ids[0]] * (int(max_len) + 1), "max_tokens": 16, "stream": True}
    save("error_request.json", json.dumps({**err_req, "prompt": f"[{ids[0]}] * {int(max_len) + 1}"}).encode())
    err = s.post(f"{u}/v1/completions", json=err_req, timeout=60)
    save("error.json", json.dumps({"status": err.status_code, "body": err.text}).encode())
    save("provenance.json", json.dumps({
        "vllm_version": s.get(f"{u}/version", timeout=30).json().get("version"),
        "server_command": args.server_command, "recorded_utc": dt.datetime.now(dt.timezone.utc).isoformat(),
        "machine": {"platform": platform.platform(), "processor": platform.processor() or platform.machine()},
        "recorded_by": "scripts/record_vllm_exchange.py"}, indent=1).encode())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
