"""Typed client for SGLang's native HTTP API: one RequestTrace per /generate request.

Streaming ``POST /generate`` is read as Server-Sent Events (``data: {...}`` + blank line, ended by
``data: [DONE]``); every chunk gets a client-side timestamp (``time.perf_counter`` seconds after
the request was sent, taken when its bytes arrived). Tokens per chunk always come from
``meta_info.completion_tokens`` deltas (cumulative in both of SGLang's stream modes); the full text
and output_ids are rebuilt whether the server streams cumulative chunks (the default) or deltas
(``--incremental-streaming-output``). Protocol facts: a real SGLang 0.5.17's replies, recorded in tests/data/sglang-0.5.17/.

The HTTP plumbing shared with the vLLM client is in specdiag.serving.http, SSE parsing in
specdiag.serving.sse, RequestTrace and its assembly in specdiag.serving.trace; this module holds what
is SGLang's own: its endpoints, its request body, its stream's meta_info, its settings.

Failures: ``generate`` returns a trace with ``.error`` set (and whatever arrived) for anything that
goes wrong after the request was sent; it raises only ServerUnreachable. Other methods raise
ServerError subclasses. Every message names the URL and the cause; the API key never appears in a
message, a trace or a repr.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from typing import Any

import requests

from specdiag.serving.errors import ServerError, StreamError, error_message_from_body
from specdiag.serving.http import HTTPClient, _connect_cause
from specdiag.serving.settings import ServerSettings, settings_from_sglang
from specdiag.serving.trace import RequestTrace, _finish_reason_error, assemble_stream

__all__ = ["SGLangClient"]


class SGLangClient(HTTPClient):
    """Client for one SGLang (or specdiag embedded) server.

    ``timeout_s`` is the longest wait for any byte of an answer (a long prefill counts against
    it); connecting has its own limit, ``connect_timeout_s``. The HTTP session is passed in or
    made here; the API key (passed in, else ``$SPECDIAG_API_KEY``) goes only into the
    ``Authorization: Bearer`` header.
    """

    engine = "sglang"
    #: SGLang 0.5.17's admin endpoints (``@auth_level(AuthLevel.ADMIN_OPTIONAL)`` in
    #: sglang/srt/entrypoints/http_server.py): with ``--admin-api-key`` they take only the admin key
    ADMIN_PATHS = frozenset({
        "/flush_cache", "/start_profile", "/stop_profile", "/start_expert_distribution_record",
        "/stop_expert_distribution_record", "/dump_expert_distribution_record", "/set_internal_state", "/freeze_gc",
        "/update_weights_from_disk", "/get_weights_by_name", "/release_memory_occupation",
        "/resume_memory_occupation", "/slow_down", "/load_lora_adapter", "/unload_lora_adapter",
        "/configure_logging", "/abort_request", "/pause_generation", "/continue_generation",
        "/clear_hicache_storage_backend", "/add_external_corpus", "/remove_external_corpus", "/list_external_corpora",
        "/update_weight_version", "/weights_checker", "/init_weights_update_group", "/destroy_weights_update_group",
        "/update_weights_from_tensor", "/update_weights_from_distributed", "/update_weights_from_ipc",
        "/init_weights_send_group_for_remote_instance", "/send_weights_to_remote_instance",
        "/get_remote_instance_transfer_engine_info", "/remote_instance_transfer_engine_info",
    })

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.reset_note: str | None = None  # why the last reset did not happen (None: it did, or none was asked)
        self._reset_refused: str | None = None  # the key was refused: no flush is sent again

    def server_info(self) -> dict:
        """GET /server_info (SGLang >= 0.5), falling back to /get_server_info on 404."""
        return self._get_json(("/server_info", "/get_server_info"))

    def model_info(self) -> dict:
        """GET /model_info, falling back to /get_model_info on 404."""
        return self._get_json(("/model_info", "/get_model_info"))

    def settings(self) -> ServerSettings:
        """The server's settings, typed (from GET /server_info; every field server-reported)."""
        return settings_from_sglang(self.server_info())

    def reset_cache(self) -> bool | None:
        """Empty the prefix cache (POST /flush_cache): True when flushed, False when the server refused
        (``reset_note`` says why: its key, or requests running)."""
        return self.flush_cache()

    def flush_cache(self) -> bool:
        """POST /flush_cache (GET if POST is not allowed). True when the server flushed.

        SGLang answers 400 while requests are running or waiting: False, and ``reset_note`` says other requests
        were running. A refused key (401/403: an admin endpoint, module doc of specdiag.serving.http) gives False,
        and ``reset_note`` names the variable to set; no flush is sent again by this client.
        """
        if self._reset_refused:
            self.reset_note = self._reset_refused
            return False
        response = self._request("POST", "/flush_cache", timeout_s=min(self.timeout_s, 60.0))
        if response.status_code in (404, 405):
            response = self._request("GET", "/flush_cache", timeout_s=min(self.timeout_s, 60.0))
        if response.status_code in (404, 405):
            raise self._http_error(response)
        if response.status_code in (401, 403):
            err = self._http_error(response)
            self._reset_refused = self.reset_note = f"no flush ({err}); each prompt got a unique head instead"
            return False
        if response.status_code == 400:
            self.reset_note = ("no flush: the server refused it while requests were running or waiting (other "
                               f"traffic?): {self._scrub(response.text.strip()[:200])}; the prompt got a unique head")
            return False
        self.reset_note = None if response.ok else f"no flush: HTTP {response.status_code}"
        return response.ok

    def expert_distribution(self, action: str) -> None:
        """POST /{start,stop,dump}_expert_distribution_record (a server started with
        ``--expert-distribution-recorder-mode``); raises the HTTP error otherwise. ``dump`` writes a torch file on the
        server's disk, under its ``SGLANG_EXPERT_DISTRIBUTION_RECORDER_DIR`` (specdiag.steps.moe_batch1.recorder)."""
        if action not in ("start", "stop", "dump"):
            raise ValueError(f"action must be start, stop or dump; got {action!r}")
        response = self._request("POST", f"/{action}_expert_distribution_record", timeout_s=min(self.timeout_s, 120.0))
        if not response.ok:
            raise self._http_error(response)

    def tokenize(self, text: str, add_special_tokens: bool = False) -> list[int]:
        """POST /tokenize; the token ids of ``text`` (no BOS/EOS unless ``add_special_tokens``).

        SGLang reads ``prompt``; the embedded server ``text``: both are sent.
        """
        body = {"prompt": text, "text": text, "add_special_tokens": add_special_tokens}
        return self._post_tokenize(body)

    # -- generation -------------------------------------------------------------------------

    def generate(
        self,
        text: str | None = None,
        input_ids: list[int] | None = None,
        sampling_params: dict | None = None,
        stream: bool = True,
        extra_body: Mapping[str, Any] | None = None,
    ) -> RequestTrace:
        """POST /generate for one prompt and return its trace.

        Exactly one of ``text`` / ``input_ids``. ``extra_body`` adds top-level request keys
        (``rid``, ``return_logprob``, ...). Never raises for a failure of the request itself
        (HTTP error, timeout, error chunk, dropped stream): the trace carries ``.error`` and
        whatever arrived. Raises ServerUnreachable when nothing could be sent.
        """
        if (text is None) == (input_ids is None):
            raise ValueError("generate needs exactly one of text= or input_ids=")
        body: dict[str, Any] = {"text": text} if text is not None else {"input_ids": [int(i) for i in input_ids or []]}
        if sampling_params:
            body["sampling_params"] = dict(sampling_params)
        body["stream"] = bool(stream)
        if extra_body:
            body.update(extra_body)
        return self._watched(lambda: self._send(body, stream))[0]

    def _send(self, body: dict[str, Any], stream: bool) -> RequestTrace:
        sent = self._post_for_trace("/generate", body, stream, self._failed_trace)
        if isinstance(sent, RequestTrace):
            return sent
        response, url, t_send_unix_s, t0 = sent.response, sent.url, sent.t_send_unix_s, sent.t0
        content_type = response.headers.get("Content-Type", "")
        if stream and not content_type.startswith("application/json"):
            return self._read_stream(response, url, t_send_unix_s, t0)
        # Non-stream request, or a server that answered a stream request with one JSON body.
        return self._read_whole(response, url, t_send_unix_s, t0)

    def _read_whole(self, response: requests.Response, url: str, t_send_unix_s: float, t0: float) -> RequestTrace:
        try:
            data = response.json()
        except ValueError:
            return self._failed_trace(
                url, t_send_unix_s, time.perf_counter() - t0,
                str(ServerError(url, f"answer is not JSON: {response.text[:200]!r}")), "stream",
            )
        except requests.exceptions.RequestException as exc:
            return self._failed_trace(
                url, t_send_unix_s, time.perf_counter() - t0, str(StreamError(url, _connect_cause(exc))), "stream"
            )
        e2e = time.perf_counter() - t0
        if isinstance(data, list):  # batch answer: we send one prompt
            data = data[0] if data else {}
        trace = assemble_stream([(e2e, data)], url, t_send_unix_s, e2e)
        # A single non-stream answer has no per-chunk timing: do not pretend it does.
        trace.ttft_s = None
        trace.chunk_t_s, trace.chunk_tokens = [], []
        trace.stream_mode = None
        if isinstance(data, dict) and "error" in data:
            trace.error = self._scrub(str(ServerError(url, error_message_from_body(json.dumps(data)))))
            trace.error_kind = "http"
        self._check_abort(trace)
        return trace

    def _check_abort(self, trace: RequestTrace) -> None:
        if trace.error is None:
            abort = _finish_reason_error(trace.finish_reason)
            if abort:
                trace.error = self._scrub(f"request to {trace.url}: {abort}")
                trace.error_kind = "aborted"

    def _read_stream(self, response: requests.Response, url: str, t_send_unix_s: float, t0: float) -> RequestTrace:
        read = self._read_sse(response, url, t0)
        errors, kind = read.errors, read.kind
        trace = assemble_stream(read.events, url, t_send_unix_s, read.t_last)
        error_chunks = [ev["error"] for _, ev in read.events if isinstance(ev, dict) and "error" in ev]
        if error_chunks:
            messages = [
                str(e.get("message") or e) if isinstance(e, Mapping) else str(e) for e in error_chunks
            ]
            errors.insert(0, str(StreamError(url, f"server sent an error chunk: {'; '.join(messages)}")))
            kind = "stream"
        if errors:
            trace.error = self._scrub(" | ".join(errors))
            trace.error_kind = kind
        self._check_abort(trace)
        return trace
