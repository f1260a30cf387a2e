"""The embedded server's settings and command line (flag names follow SGLang's launch_server)."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from pathlib import Path

from specdiag.paths import MODELS_DIR, PROJECT_ROOT

#: speculative algorithms, under SGLang's names
ALGORITHMS: tuple[str, ...] = ("NONE", "NGRAM", "STANDALONE", "DFLASH")
DEFAULT_TARGET = MODELS_DIR / "target"
DEFAULT_DRAFTER = MODELS_DIR / "drafter"
#: what to tell someone whose model folder is missing
MODEL_HINT = (
    "train the embedded models first (python data/models/train.py --device cuda; see data/models/README.md), "
    "or pass --model-path / --speculative-draft-model-path to a local Hugging Face folder"
)


@dataclass(frozen=True)
class ServerConfig:
    """Everything `python -m specdiag.localserver` was started with."""

    host: str = "127.0.0.1"
    port: int = 30000  # 0 = any free port (printed on start)
    model_path: Path = DEFAULT_TARGET
    served_model_name: str | None = None  # defaults to the model folder's name
    speculative_algorithm: str = "NONE"
    speculative_draft_model_path: Path | None = None
    speculative_num_draft_tokens: int = 8  # tokens per verify, last committed one included (DFLASH: the block)
    speculative_dflash_block_size: int | None = None  # DFLASH: as given (--speculative-dflash-block-size)
    speculative_draft_window_size: int | None = None  # DFLASH: context tokens the drafter keeps (None: all)
    speculative_ngram_min_match_window_size: int = 1
    speculative_ngram_max_match_window_size: int = 12
    context_length: int | None = None  # None = the target's max_position_embeddings
    max_total_tokens: int | None = None  # slots of the target's KV pool (SGLang's flag); None = 2 x context length
    kv_alloc: str = "sglang"  # slot allocator of the target's KV pool: sglang (0.5.17's free list) | contiguous
    prefix_cache: bool = False  # keep the last request's prompt in the pool for the next request (one entry)
    chunked_prefill_size: int = 2048  # prefill chunk, tokens
    device: str = "auto"  # auto | cpu | cuda
    dtype: str = "auto"  # auto (= float32) | float32 | bfloat16 | float16 | float64
    cpu_threads: int = 1  # torch intra-op threads on CPU (1: tiny models run fastest on a busy machine)
    stream_interval: int = 1  # default sampling_params.stream_interval, in tokens
    incremental_streaming_output: bool = False  # stream deltas instead of cumulative text/output_ids
    log_level: str = "info"
    launch_command: str = ""
    argv: tuple[str, ...] = field(default_factory=tuple)


def _path(value: str) -> Path:
    p = Path(value)
    return p if p.is_absolute() else (Path.cwd() / p)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m specdiag.localserver",
        description="The embedded SGLang-compatible server: a tiny transformers target model with real, "
        "greedy, lossless speculative decoding (NGRAM prompt lookup or a STANDALONE draft model).",
    )
    p.add_argument("--host", default="127.0.0.1", help="bind address (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=30000, help="TCP port; 0 picks a free one (default 30000)")
    p.add_argument("--model-path", type=_path, default=DEFAULT_TARGET, help="target model folder (local)")
    p.add_argument("--served-model-name", default=None, help="name in /model_info and /v1/models")
    p.add_argument("--speculative-algorithm", type=str.upper, choices=ALGORITHMS, default=None,
                   help="NGRAM, STANDALONE, DFLASH or NONE (default NONE)")
    p.add_argument("--speculative-draft-model-path", type=_path, default=None,
                   help=f"drafter folder for STANDALONE (default {DEFAULT_DRAFTER.relative_to(PROJECT_ROOT)}) or "
                   "DFLASH (default: data/models/dflash/ when shipped, else a random tiny DFlash drafter made on "
                   "first use into .dflash-models/)")
    p.add_argument("--speculative-num-draft-tokens", type=int, default=None,
                   help="tokens per verify forward, the last committed token included (SGLang's meaning): "
                   "a step drafts N-1 tokens and commits at most N (default 8; DFLASH: the block size)")
    p.add_argument("--speculative-dflash-block-size", type=int, default=None,
                   help="DFLASH: tokens per block (default: --speculative-num-draft-tokens, else the drafter's "
                   "block_size); both given must be equal")
    p.add_argument("--speculative-draft-window-size", type=int, default=None,
                   help="DFLASH: context tokens the drafter keeps (SGLang's compact draft cache; default: all); at "
                   "least the block size")
    p.add_argument("--speculative-ngram-min-match-window-size", type=int, default=1)
    p.add_argument("--speculative-ngram-max-match-window-size", type=int, default=12)
    p.add_argument("--context-length", type=int, default=None,
                   help="max prompt + new tokens (default: the target's max_position_embeddings)")
    p.add_argument("--max-total-tokens", type=int, default=None,
                   help="token slots of the target's KV pool (SGLang's flag; default: twice the context length). "
                   "Slots are handed out and freed as SGLang 0.5.17 does at page_size 1, so traffic fragments the "
                   "pool and /flush_cache makes it contiguous again (kvpool.py)")
    p.add_argument("--kv-alloc", choices=("sglang", "contiguous"), default="sglang",
                   help="slot allocator of the KV pool: sglang (default; SGLang 0.5.17's page_size-1 free list) or "
                   "contiguous (specdiag.kvalloc: each request's KV in as few runs as the pool allows; the SGLang "
                   "plugin's SPECDIAG_SGLANG_KV_ALLOC=contiguous)")
    p.add_argument("--enable-prefix-cache", action="store_true",
                   help="keep the last request's prompt KV in the pool: a request that starts with it prefills only "
                   "the rest (one entry, where SGLang's radix cache keeps many; meta_info.cached_tokens says how "
                   "many were reused). Off by default: a finished request's slots then all go back to the free "
                   "list, which 10's filler needs")
    p.add_argument("--chunked-prefill-size", type=int, default=2048, help="prefill chunk in tokens")
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    p.add_argument("--dtype", choices=("auto", "float32", "bfloat16", "float16", "float64"), default="auto",
                   help="model dtype (auto = float32)")
    p.add_argument("--cpu-threads", type=int, default=1,
                   help="torch threads on CPU (default 1: the tiny models gain nothing from more, and more "
                   "threads slow down badly when the client shares the cores); 0 = torch's default")
    p.add_argument("--stream-interval", type=int, default=1, help="tokens between stream chunks (default 1)")
    p.add_argument("--incremental-streaming-output", action="store_true",
                   help="stream chunks carry only the new text/output_ids (SGLang's flag)")
    p.add_argument("--log-level", default="info", choices=("critical", "error", "warning", "info", "debug"))
    return p


def _dflash_settings(parser: argparse.ArgumentParser, a: argparse.Namespace) -> tuple[Path, int]:
    """DFLASH's drafter folder (the default one made when none is given) and block size, checked against the
    target before any model loads (specdiag.geometry.dflash); parser errors name the fix."""
    from specdiag.geometry.dflash import DFlashConfigError, check_dflash_launch  # noqa: PLC0415
    from specdiag.localserver.dflash_drafter import default_dflash_drafter  # noqa: PLC0415

    draft = a.speculative_draft_model_path
    if draft is None:
        try:
            draft = default_dflash_drafter(a.model_path)
        except FileNotFoundError as exc:
            parser.error(str(exc))
    if not Path(draft).is_dir():
        parser.error(f"no DFlash drafter folder at {draft}: give one (python data/models/make_dflash_drafter.py "
                     "--target TARGET --out DIR writes a random one)")
    try:
        _, block = check_dflash_launch(draft, a.model_path, a.speculative_dflash_block_size,
                                       a.speculative_num_draft_tokens, a.speculative_draft_window_size)
    except DFlashConfigError as exc:
        parser.error(str(exc))
    return Path(draft), block


def parse_args(argv: list[str]) -> ServerConfig:
    """Parse the command line; errors (missing folders, bad numbers) exit with a message naming the fix."""
    parser = build_parser()
    a = parser.parse_args(argv)
    algorithm = a.speculative_algorithm or "NONE"
    draft = a.speculative_draft_model_path
    if algorithm == "STANDALONE" and draft is None:
        draft = DEFAULT_DRAFTER
    if algorithm != "DFLASH" and (a.speculative_dflash_block_size is not None
                                  or a.speculative_draft_window_size is not None):
        parser.error("--speculative-dflash-block-size and --speculative-draft-window-size are DFLASH settings: "
                     "add --speculative-algorithm DFLASH or drop them")
    if algorithm == "DFLASH":
        draft, a.speculative_num_draft_tokens = _dflash_settings(parser, a)
    elif a.speculative_num_draft_tokens is None:
        a.speculative_num_draft_tokens = 8
    if a.enable_prefix_cache and algorithm == "DFLASH":
        parser.error("--enable-prefix-cache works with NONE, NGRAM and STANDALONE: DFLASH's drafter needs the target's "
                     "features of the whole prompt")
    if algorithm != "NONE" and a.speculative_num_draft_tokens < 2:
        parser.error("--speculative-num-draft-tokens must be at least 2 (it counts the last committed token)")
    if a.context_length is not None and a.context_length < 2:
        parser.error("--context-length must be at least 2 tokens")
    if a.max_total_tokens is not None and a.max_total_tokens < 64:
        parser.error("--max-total-tokens must be at least 64 token slots")
    if a.cpu_threads < 0:
        parser.error("--cpu-threads must be 0 (torch's default) or more")
    if a.stream_interval < 1:
        parser.error("--stream-interval must be at least 1")
    if a.chunked_prefill_size < 1:
        parser.error("--chunked-prefill-size must be at least 1")
    if not 1 <= a.speculative_ngram_min_match_window_size <= a.speculative_ngram_max_match_window_size:
        parser.error("need 1 <= --speculative-ngram-min-match-window-size <= --speculative-ngram-max-match-window-size")
    return ServerConfig(
        host=a.host,
        port=a.port,
        model_path=a.model_path,
        served_model_name=a.served_model_name,
        speculative_algorithm=algorithm,
        speculative_draft_model_path=draft,
        speculative_num_draft_tokens=a.speculative_num_draft_tokens,
        speculative_dflash_block_size=a.speculative_dflash_block_size,
        speculative_draft_window_size=a.speculative_draft_window_size,
        speculative_ngram_min_match_window_size=a.speculative_ngram_min_match_window_size,
        speculative_ngram_max_match_window_size=a.speculative_ngram_max_match_window_size,
        context_length=a.context_length,
        max_total_tokens=a.max_total_tokens,
        kv_alloc=a.kv_alloc,
        prefix_cache=a.enable_prefix_cache,
        chunked_prefill_size=a.chunked_prefill_size,
        device=a.device,
        dtype=a.dtype,
        cpu_threads=a.cpu_threads,
        stream_interval=a.stream_interval,
        incremental_streaming_output=a.incremental_streaming_output,
        log_level=a.log_level,
        launch_command="python -m specdiag.localserver " + " ".join(argv),
        argv=tuple(argv),
    )
