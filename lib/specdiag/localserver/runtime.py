"""The embedded server's state behind the HTTP routes: models, engine, counters, one request at a time.

``Runtime.outputs`` turns one checked /generate request into SGLang output dicts
(``{"text", "output_ids", "meta_info"}``): one per verify step when streaming (every
``stream_interval`` tokens), cumulative by default or deltas with ``--incremental-streaming-output``,
and the final one with ``e2e_latency`` and the speculative fields. It is synchronous; app.py runs
it in a worker thread.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from typing import Any, Callable, Iterator

import torch

from specdiag import __version__
from specdiag.paths import relative_to_project  # reported paths: project-relative, so shared reports hold none of this machine
from specdiag.localserver.config import MODEL_HINT, ServerConfig
from specdiag.geometry.dflash import DEFAULT_MASK_TOKEN, parse_dflash_config
from specdiag.localserver.dflash import DFlashLoadError, DFlashModel, load_dflash
from specdiag.localserver.engine import DecodeRequest, SpecEngine, SpecSettings
from specdiag.localserver.kvpool import KVPool
from specdiag.localserver.models import (
    LoadedModel,
    ModelLoadError,
    context_length_of,
    eos_token_ids,
    load_model,
    load_tokenizer,
    resolve_device,
    resolve_dtype,
)
from specdiag.localserver.protocol import GenerateInput, RequestError, check_context, spec_meta
from specdiag.localserver.stats import ServerStats

PAGE_SIZE = 1  # token slots (kvpool.py), as SGLang's page_size 1
#: keys of a model config worth reporting (geometry, sliding window, rope)
_CONFIG_KEYS = (
    "model_type", "architectures", "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
    "num_attention_heads", "num_key_value_heads", "head_dim", "max_position_embeddings", "layer_types",
    "sliding_window", "use_sliding_window", "rope_parameters", "rope_scaling", "rope_theta", "tie_word_embeddings",
)


def _config_summary(config: Any) -> dict[str, Any]:
    d = config.to_dict()
    out = {k: d[k] for k in _CONFIG_KEYS if k in d}
    out["torch_dtype"] = str(getattr(config, "dtype", None) or d.get("torch_dtype") or "")
    return out


def _dflash_summary(model: DFlashModel) -> dict[str, Any]:
    """The DFlash drafter's config as its config.json names it (SGLang reads the same keys), with the target layer
    ids and mask token as this server resolved them."""
    out = {k: model.config[k] for k in _CONFIG_KEYS if k in model.config}
    out.update(block_size=model.block_size, num_target_layers=model.config.get("num_target_layers"),
               dflash_config={**(model.config.get("dflash_config") or {}),
                              "target_layer_ids": list(model.target_layer_ids), "mask_token_id": model.mask_token_id})
    return out


def _weight_bytes(lm: LoadedModel) -> int:
    return int(sum(p.numel() * p.element_size() for p in lm.model.parameters()))


class Runtime:
    """Models, engine and counters of one embedded server process."""

    def __init__(self, cfg: ServerConfig) -> None:
        self.cfg = cfg
        self.device = resolve_device(cfg.device)
        self.dtype = resolve_dtype(cfg.dtype)
        if self.device.type == "cpu" and cfg.cpu_threads > 0:
            torch.set_num_threads(cfg.cpu_threads)
        self.target = load_model(cfg.model_path, "target", self.device, self.dtype, MODEL_HINT)
        self.drafter: LoadedModel | None = None
        if cfg.speculative_algorithm == "STANDALONE":
            assert cfg.speculative_draft_model_path is not None
            self.drafter = load_model(cfg.speculative_draft_model_path, "drafter", self.device, self.dtype, MODEL_HINT)
            if self.drafter.config.vocab_size != self.target.config.vocab_size:
                raise ModelLoadError(
                    f"the drafter's vocab_size ({self.drafter.config.vocab_size}) differs from the target's "
                    f"({self.target.config.vocab_size}): they must share one tokenizer"
                )
        self.tokenizer = load_tokenizer(cfg.model_path)
        self.dflash: DFlashModel | None = None
        if cfg.speculative_algorithm == "DFLASH":
            assert cfg.speculative_draft_model_path is not None
            self.dflash = self._load_dflash(cfg)
        model_ctx = context_length_of(self.target.config)
        if cfg.context_length is not None and cfg.context_length > model_ctx:
            raise ModelLoadError(
                f"--context-length {cfg.context_length} exceeds the target's max_position_embeddings ({model_ctx})"
            )
        self.context_length = cfg.context_length or model_ctx
        pool_size = cfg.max_total_tokens or 2 * self.context_length
        self.pool = KVPool.for_model(self.target.config, pool_size, self.dtype, self.device, cfg.kv_alloc)
        if self.pool is not None and pool_size <= self.context_length:
            # like SGLang, a request must fit the pool: the usable context shrinks to it
            self.context_length = pool_size - cfg.speculative_num_draft_tokens - 1
        self.eos_ids = eos_token_ids(self.target.config, self.tokenizer)
        self.settings = SpecSettings(
            algorithm=cfg.speculative_algorithm,  # type: ignore[arg-type]
            num_draft_tokens=cfg.speculative_num_draft_tokens,
            ngram_min_match_window_size=cfg.speculative_ngram_min_match_window_size,
            ngram_max_match_window_size=cfg.speculative_ngram_max_match_window_size,
            chunked_prefill_size=cfg.chunked_prefill_size,
            draft_window_size=cfg.speculative_draft_window_size,
        )
        if cfg.prefix_cache and (self.pool is None or self.dflash is not None):
            raise ValueError("--enable-prefix-cache keeps the target's KV in its slot pool: it needs a full-attention "
                             "target and NONE, NGRAM or STANDALONE speculation (not DFLASH)")
        self.engine = SpecEngine(self.target, self.drafter, self.settings, pool=self.pool, dflash=self.dflash,
                                 prefix_cache=cfg.prefix_cache)
        self.engine.warm_up()
        self.engine.drop_prefix(free=False)  # the warm-up's prompt is not a cached prefix
        if self.pool is not None:
            self.pool.allocator.clear()  # a started server's pool is one contiguous free range
        self.stats = ServerStats()
        self.engine_lock = threading.Lock()
        # a Rust fast tokenizer raises "Already borrowed" when two threads use it at once
        # (the event loop tokenizes while the generation thread detokenizes)
        self.tokenizer_lock = threading.Lock()
        self.served_model_name = cfg.served_model_name or cfg.model_path.name
        self.started_unix_s = time.time()

    def _load_dflash(self, cfg: ServerConfig) -> DFlashModel:
        """The DFlash drafter for this target: the mask token from its config, else the tokenizer's token of the
        config's mask_token text (SGLang's resolve_dflash_mask_token); ModelLoadError naming the fix."""
        assert cfg.speculative_draft_model_path is not None
        folder = cfg.speculative_draft_model_path
        try:
            info = parse_dflash_config(json.loads((folder / "config.json").read_text()))
            mask = info.mask_token_id
            if mask is None:
                token = info.mask_token or DEFAULT_MASK_TOKEN
                found = self.tokenizer.get_vocab().get(token)
                mask = int(found) if found is not None else None
            return load_dflash(folder, self.target.config.to_dict(), self.device, self.dtype,
                               cfg.speculative_num_draft_tokens, mask)
        except (DFlashLoadError, ValueError, OSError) as exc:
            raise ModelLoadError(f"DFlash drafter {folder}: {exc}") from exc

    # ---- info -------------------------------------------------------------------------
    @property
    def speculative(self) -> bool:
        return self.settings.algorithm != "NONE"

    def server_args(self) -> dict[str, Any]:
        cfg, spec = self.cfg, self.settings
        algo = spec.algorithm if self.speculative else None
        backend = self.target.attention_backend
        return {
            "model_path": relative_to_project(cfg.model_path),
            "tokenizer_path": relative_to_project(cfg.model_path),
            "served_model_name": self.served_model_name,
            "host": cfg.host,
            "port": cfg.port,
            "device": self.device.type,
            "dtype": str(self.dtype).replace("torch.", ""),
            "kv_cache_dtype": "auto",
            "attention_backend": backend,
            "decode_attention_backend": backend,
            "prefill_attention_backend": backend,
            "speculative_draft_attention_backend": (self.drafter.attention_backend if self.drafter
                                                    else "torch_sdpa" if self.dflash else None),
            "page_size": PAGE_SIZE,
            "max_total_tokens": cfg.max_total_tokens,
            "kv_alloc": cfg.kv_alloc if self.pool is not None else None,  # None: no slot pool (sliding-window target)
            # by default no prefix cache: a request's slots are freed when it finishes; --enable-prefix-cache keeps
            # the last request's prompt in its slots (one entry, engine.py), as SGLang's radix cache keeps many
            "disable_radix_cache": not cfg.prefix_cache,
            "prefix_cache": "one entry (the last request's prompt)" if cfg.prefix_cache else None,
            "context_length": self.context_length,
            "tp_size": 1,
            "dp_size": 1,
            "pp_size": 1,
            "max_running_requests": 1,
            "chunked_prefill_size": spec.chunked_prefill_size,
            "speculative_algorithm": algo,
            "speculative_draft_model_path": (relative_to_project(cfg.speculative_draft_model_path)
                                             if self.drafter or self.dflash else None),
            "speculative_num_draft_tokens": spec.num_draft_tokens if self.speculative else None,
            # DFLASH: SGLang forces one step and topk 1 (speculative_hook._handle_dflash)
            "speculative_num_steps": (spec.num_draft_tokens - 1 if spec.algorithm == "STANDALONE"
                                      else 1 if spec.algorithm == "DFLASH" else None),
            "speculative_eagle_topk": 1 if spec.algorithm in ("STANDALONE", "DFLASH") else None,
            "speculative_dflash_block_size": spec.num_draft_tokens if spec.algorithm == "DFLASH" else None,
            # STANDALONE: no cap, the drafter's full layers see the whole context; DFLASH: as started
            "speculative_draft_window_size": spec.draft_window_size if spec.algorithm == "DFLASH" else None,
            "speculative_ngram_min_match_window_size": spec.ngram_min_match_window_size,
            "speculative_ngram_max_match_window_size": spec.ngram_max_match_window_size,
            "stream_interval": cfg.stream_interval,
            "incremental_streaming_output": cfg.incremental_streaming_output,
            "cpu_threads": torch.get_num_threads() if self.device.type == "cpu" else None,
            "enable_metrics": True,
            "disable_overlap_schedule": True,
            "decode_log_interval": 0,
        }

    def server_info(self) -> dict[str, Any]:
        args = self.server_args()
        draft_bytes = (_weight_bytes(self.drafter) if self.drafter else
                       sum(t.numel() * t.element_size() for t in self.dflash.w.values()) if self.dflash else 0)
        weight_gb = (_weight_bytes(self.target) + draft_bytes) / 1e9
        pool = self.pool
        state = {
            **args,
            "world_size": 1,
            "last_gen_throughput": self.stats.last_gen_throughput,
            "memory_usage": {"weight": round(weight_gb, 6),
                             "kvcache": round(pool.allocator.size * pool.bytes_per_token / 1e9, 6) if pool else None,
                             "token_capacity": pool.allocator.size if pool else self.context_length},
            # specdiag's extra: the target's slot pool now (free slots, slots handed out since the last flush)
            "kv_pool": pool.allocator.state() if pool else None,
        }
        avg = self.stats.avg_spec_accept_length
        if self.speculative:
            state["avg_spec_accept_length"] = avg if avg is not None else 0.0
        return {
            **args,
            "launch_command": self.cfg.launch_command,
            "status": "ready",
            "max_total_num_tokens": self.pool.allocator.size if self.pool else self.context_length,
            "max_req_input_len": self.context_length - 1,
            "startup_time": self.started_unix_s,
            "version": f"specdiag-localserver {__version__}",
            "engine": "specdiag.localserver (transformers, one request at a time)",
            "torch_version": torch.__version__,
            "model_config": _config_summary(self.target.config),
            "speculative_draft_model_config": (_config_summary(self.drafter.config) if self.drafter
                                               else _dflash_summary(self.dflash) if self.dflash else None),
            "internal_states": [state],
            "frontend": "python",
        }

    def model_info(self) -> dict[str, Any]:
        cfg = self.target.config
        return {
            "model_path": relative_to_project(self.cfg.model_path),
            "tokenizer_path": relative_to_project(self.cfg.model_path),
            "served_model_name": self.served_model_name,
            "is_generation": True,
            "preferred_sampling_params": None,
            "weight_version": "default",
            "load_format": "auto",
            "reasoning_parser": None,
            "tool_call_parser": None,
            "disaggregation_mode": "null",
            "has_image_understanding": False,
            "has_audio_understanding": False,
            "model_type": getattr(cfg, "model_type", None),
            "architectures": list(getattr(cfg, "architectures", None) or []),
        }

    def tokenize(self, text: str, add_special_tokens: bool = True) -> list[int]:
        with self.tokenizer_lock:
            return list(self.tokenizer(text, add_special_tokens=add_special_tokens)["input_ids"])

    def detokenize(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        with self.tokenizer_lock:
            return str(self.tokenizer.decode(ids, skip_special_tokens=skip_special_tokens))

    def busy(self) -> bool:
        return self.stats.num_running_reqs > 0 or self.stats.num_queue_reqs > 0

    def flush_cache(self) -> bool:
        """SGLang's /flush_cache: when idle, the pool's free list back to one contiguous range and the speculative
        average reset; refused (False) while a request runs or waits."""
        if self.busy():
            return False
        with self.engine_lock:
            self.engine.drop_prefix(free=False)
            if self.pool is not None:
                self.pool.allocator.clear()
            self.stats.reset_spec()
        return True

    # ---- generation -------------------------------------------------------------------
    def prepare(self, gi: GenerateInput) -> tuple[list[int], DecodeRequest]:
        """Tokenize and check a request before any work (raises RequestError -> HTTP 400)."""
        ids = gi.input_ids if gi.input_ids is not None else self.tokenize(gi.text or "")
        if not ids:
            raise RequestError("the prompt is empty: send at least one token")
        vocab = int(self.target.config.vocab_size)
        bad = [t for t in ids if t >= vocab]
        if bad:
            raise RequestError(f"input_ids contains ids outside the vocabulary (size {vocab}): {bad[:5]}")
        p = gi.params
        check_context(len(ids), p.max_new_tokens, self.context_length)
        stops = set(p.stop_token_ids) | (set() if p.ignore_eos else set(self.eos_ids))
        req = DecodeRequest(
            input_ids=list(ids),
            max_new_tokens=p.max_new_tokens,
            stop_token_ids=frozenset(stops),
            min_new_tokens=p.min_new_tokens,
        )
        return list(ids), req

    def outputs(self, gi: GenerateInput, prompt_ids: list[int], req: DecodeRequest, received_s: float,
                should_abort: Callable[[], bool]) -> Iterator[dict[str, Any]]:
        """SGLang output dicts for one request; holds the engine lock while generating. Every chunk's meta_info
        carries ``queue_time``: seconds the request waited for the engine behind other requests (SGLang's field,
        sent with --enable-metrics; the embedded server runs one request at a time)."""
        with self.stats.lock:
            self.stats.num_queue_reqs += 1
        queued_s = time.perf_counter()
        with self.engine_lock:
            queue_time = time.perf_counter() - queued_s
            with self.stats.lock:
                self.stats.num_queue_reqs -= 1
                self.stats.num_running_reqs += 1
            try:
                yield from self._outputs(gi, prompt_ids, req, received_s, should_abort, queue_time)
            finally:
                with self.stats.lock:
                    self.stats.num_running_reqs -= 1

    def _outputs(self, gi: GenerateInput, prompt_ids: list[int], req: DecodeRequest, received_s: float,
                 should_abort: Callable[[], bool], queue_time: float = 0.0) -> Iterator[dict[str, Any]]:
        p = gi.params
        rid = gi.rid or uuid.uuid4().hex
        interval = p.stream_interval or self.cfg.stream_interval
        incremental = self.cfg.incremental_streaming_output
        out: list[int] = []
        commits: list[int] = []
        correct: list[int] = []
        draft_ms: list[float] = []
        verify_ms: list[float] = []
        sent_ids = sent_chars = 0
        first_token_s: float | None = None
        cached_tokens = 0  # prompt tokens the prefix cache held (the prefill chunk says)

        def text_of(ids: list[int], finish: dict[str, Any] | None) -> str:
            if finish and finish.get("type") == "stop" and not p.no_stop_trim and ids:
                ids = ids[:-1]
            return self.detokenize(ids, p.skip_special_tokens)

        def make(finish: dict[str, Any] | None) -> dict[str, Any]:
            nonlocal sent_ids, sent_chars
            text = text_of(out, finish)
            if finish is None:  # hold back a partly decoded UTF-8 character until its last byte arrives
                text = text.rstrip("\ufffd")
            meta: dict[str, Any] = {
                "id": rid,
                "finish_reason": finish,
                "prompt_tokens": len(prompt_ids),
                "weight_version": "default",
                "num_retractions": 0,
                "reasoning_tokens": 0,
                "completion_tokens": len(out),
                "cached_tokens": cached_tokens,
                "queue_time": queue_time,
            }
            if finish is not None:
                meta["e2e_latency"] = time.time() - received_s
                if self.speculative:
                    meta.update(spec_meta(len(out), self.settings.num_draft_tokens, commits, correct,
                                          draft_ms, verify_ms))
            if gi.stream and incremental:
                item = {"text": text[sent_chars:], "output_ids": out[sent_ids:], "meta_info": meta}
            else:
                item = {"text": text, "output_ids": list(out), "meta_info": meta}
            if gi.return_prompt_token_ids:
                item["prompt_token_ids"] = list(prompt_ids)
            sent_ids, sent_chars = len(out), len(text)
            return item

        finish: dict[str, Any] | None = None
        kv_layout: dict[str, Any] | None = None
        gen = self.engine.generate(req, should_abort)
        for chunk in gen:
            out.extend(chunk.new_ids)
            kv_layout = chunk.kv_layout or kv_layout
            if chunk.prefill_ms is not None:
                cached_tokens = chunk.cached_tokens
            if first_token_s is None and chunk.new_ids:
                first_token_s = time.time()
            if chunk.step is not None:
                commits.append(chunk.step.committed)
                correct.append(chunk.step.correct_drafts)
                draft_ms.append(chunk.step.draft_ms)
                verify_ms.append(chunk.step.verify_ms)
            finish = chunk.finish
            if finish is not None:
                break
            if gi.stream and len(out) - sent_ids >= interval:
                yield make(None)
        gen.close()  # the request's pool slots go back now, before the next request takes the engine
        assert finish is not None
        final = make(finish)
        if kv_layout is not None:
            # specdiag's extra: where the request's KV lay in the pool (runs of consecutive slots, specdiag.kvlayout)
            final["meta_info"]["kv_layout"] = {**kv_layout, "pool": self.pool.allocator.state() if self.pool else None}
        end_s = time.time()
        self.stats.record_finished(
            prompt_tokens=len(prompt_ids),
            cached_tokens=cached_tokens,
            completion_tokens=len(out),
            verify_ct=len(commits) if self.speculative else 0,
            ttft_s=(first_token_s - received_s) if first_token_s else None,
            e2e_s=end_s - received_s,
            decode_s=(end_s - first_token_s) if first_token_s else None,
            aborted=finish.get("type") == "abort",
        )
        yield final
