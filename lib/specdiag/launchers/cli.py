"""The engine options on a command line, shared by ``python -m specdiag.launchers serve`` and
``python -m specdiag.report run``: flags in, ``start_engine`` options out (only those given)."""

from __future__ import annotations

import argparse
from typing import Any

#: flag dest -> engine option name (an option is passed only when the flag was given)
_OPTION_OF = {
    "model": "model_path",
    "draft_model": "draft_model_path",
    "algorithm": "algorithm",
    "num_draft_tokens": "num_draft_tokens",
    "num_steps": "num_steps",
    "topk": "topk",
    "block_size": "dflash_block_size",
    "draft_window": "draft_window_size",
    "draft_attention_backend": "draft_attention_backend",
    "max_total_tokens": "max_total_tokens",
    "attention_backend": "attention_backend",
    "page_size": "page_size",
    "context_length": "context_length",
    "mem_fraction_static": "mem_fraction_static",
    "tp_size": "tp_size",
    "port": "port",
    "device": "device",
    "engine_python": "python",
    "startup_timeout": "startup_timeout_s",
}


def _upper(text: str) -> str:
    return text.upper()


def _tokens(text: str) -> int:
    """A token count as argparse's type: 131072 or 128k (specdiag.tokens; k = 1,024 tokens)."""
    from specdiag.tokens import token_count  # noqa: PLC0415

    try:
        return token_count(text, "tokens")
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc).removeprefix("tokens: ")) from None


def add_engine_arguments(p: argparse.ArgumentParser, default_port: int | None = None,
                         title: str = "engine to start") -> None:
    """--engine and the settings of the engine to start (left unset: the engine's own default)."""
    from specdiag.launchers import engine_names  # noqa: PLC0415

    g = p.add_argument_group(title)
    g.add_argument("--engine", default="embedded", type=str.lower, choices=engine_names(),
                   help="engine to start (default: embedded)")
    g.add_argument("--model", help="target model folder (default: data/models/target)")
    g.add_argument("--draft-model", help="drafter folder for STANDALONE/EAGLE (default: data/models/drafter) or "
                   "DFLASH (a DFlashDraftModel folder; the embedded engine's default is made on first use)")
    g.add_argument("--algorithm", type=_upper, help="NONE | NGRAM | STANDALONE | DFLASH | EAGLE | EAGLE3 | NEXTN "
                   "(default STANDALONE; the embedded server and vllm know NONE, NGRAM, STANDALONE and DFLASH)")
    g.add_argument("--num-draft-tokens", type=int, help="tokens per verify step (default 8; DFLASH: the block size)")
    g.add_argument("--block-size", type=int, help="DFLASH: tokens per drafted block, the last committed token "
                   "included (default: the drafter's block_size); equal to --num-draft-tokens if both are given")
    g.add_argument("--draft-window", type=_tokens, help="DFLASH: tokens of context the drafter keeps (sglang "
                   "--speculative-draft-window-size; embedded: the same; default: the whole context)")
    g.add_argument("--draft-attention-backend", help="sglang: the drafter's attention kernels (default: the "
                   "target's)")
    g.add_argument("--max-total-tokens", type=_tokens, help="sglang, embedded: KV pool size in tokens (with DFLASH "
                   "on sglang the drafter's pool is as long as the target's: cap it)")
    g.add_argument("--num-steps", type=int, help="sglang: drafter steps (default num-draft-tokens - 1)")
    g.add_argument("--topk", type=int, help="sglang: drafter branching per step (default 1)")
    g.add_argument("--attention-backend", help="sglang: attention kernels (default triton)")
    g.add_argument("--page-size", type=int, help="sglang: tokens per KV page (default 1)")
    g.add_argument("--context-length", type=_tokens, help="sglang: context length in tokens, e.g. 131072 or 128k "
                   "(default: the model's)")
    g.add_argument("--mem-fraction-static", type=float, help="sglang: GPU memory fraction for weights and KV")
    g.add_argument("--tp-size", type=int, help="sglang: tensor-parallel GPUs (default 1)")
    g.add_argument("--device", help="embedded: cpu | cuda | auto (default auto)")
    g.add_argument("--port", type=int, default=default_port, help="port (0: a free one)")
    g.add_argument("--engine-python", help="sglang: the Python that has sglang (default: this one)")
    g.add_argument("--startup-timeout", type=float, help="seconds to wait for readiness (default: per engine)")
    g.add_argument("--engine-arg", action="append", default=[], metavar="ARG",
                   help="extra argument for the engine's command line (repeat; e.g. --engine-arg=--log-level=debug)")


def engine_options_from_args(args: argparse.Namespace) -> dict[str, Any]:
    """The options of ``start_engine(args.engine, **options)``: only the flags that were given."""
    opts = {opt: getattr(args, dest) for dest, opt in _OPTION_OF.items()
            if getattr(args, dest, None) not in (None, "")}
    if getattr(args, "engine_arg", None):
        opts["extra_args"] = tuple(args.engine_arg)
    return opts
