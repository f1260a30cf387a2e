"""``python -m specdiag.localserver``: start the embedded SGLang-compatible server (see config.py)."""

from __future__ import annotations

import dataclasses
import logging
import os
import socket
import sys


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    from specdiag.localserver.config import MODEL_HINT, parse_args
    from specdiag.localserver.models import ModelLoadError, check_model_folder

    cfg = parse_args(list(sys.argv[1:] if argv is None else argv))
    logging.basicConfig(level=cfg.log_level.upper(), format="[%(asctime)s] %(message)s")
    log = logging.getLogger("specdiag.localserver")
    try:  # fail fast, before importing torch and transformers
        check_model_folder(cfg.model_path, "target", MODEL_HINT)
        if cfg.speculative_draft_model_path is not None and cfg.speculative_algorithm in ("STANDALONE", "DFLASH"):
            check_model_folder(cfg.speculative_draft_model_path, "drafter", MODEL_HINT)
    except ModelLoadError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2

    import uvicorn
    from transformers.utils import logging as hf_logging

    from specdiag.localserver.app import build_app
    from specdiag.localserver.runtime import Runtime

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((cfg.host, cfg.port))
    except OSError as exc:
        print(f"error: cannot bind {cfg.host}:{cfg.port}: {exc}; pick another --port (0 = any free one)",
              file=sys.stderr)
        return 2
    port = sock.getsockname()[1]
    cfg = dataclasses.replace(cfg, port=port)
    hf_logging.disable_progress_bar()
    try:
        runtime = Runtime(cfg)
    except (ModelLoadError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    log.info("specdiag.localserver: %s on %s (%s), context %d tokens, model %s%s",
             runtime.settings.algorithm, runtime.device, runtime.server_args()["dtype"], runtime.context_length,
             cfg.model_path, f", drafter {cfg.speculative_draft_model_path}" if runtime.drafter else "")
    print(f"specdiag.localserver listening on http://{cfg.host}:{port}", flush=True)
    config = uvicorn.Config(build_app(runtime), log_level=cfg.log_level if cfg.log_level != "info" else "warning")
    uvicorn.Server(config).run(sockets=[sock])
    return 0


if __name__ == "__main__":
    sys.exit(main())
