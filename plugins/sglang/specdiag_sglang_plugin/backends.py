"""Which attention paths a server runs, said once in its log when the target's attention backends are built.

An AFTER hook on ``ModelRunner.init_attention_backends`` reads the backends SGLang chose for prefill and decode and
where target verify goes (``--speculative-attention-mode``), and logs one line: whether the plugin's verify kernel is
in the path (it hooks the Triton backend: idle, with the flags that would put it there, on any other) and which
prefill runs (FlashInfer's chunked-prefix MHA, specdiag's MHA kernel, or the Triton backend's absorbed form).
"""

from __future__ import annotations

from specdiag_sglang_plugin.logs import log_once

INIT_BACKENDS = "sglang.srt.model_executor.model_runner.ModelRunner.init_attention_backends"
#: prefill backends whose MLA prefill runs the chunked-prefix MHA form in SGLang 0.5.17 (server_args)
MHA_PREFILL_BACKENDS = ("flashinfer", "fa3", "fa4", "flashmla", "cutlass_mla", "trtllm_mla")


def describe(prefill: str, decode: str, verify_mode: str, speculative: bool, verify_on: bool, prefill_mha: bool,
             is_draft: bool) -> str:
    """The log line for one model runner (pure: tests call it with plain values)."""
    if is_draft:  # a drafter's own attention (a DFLASH or EAGLE drafter is no MLA model): no plugin path to say
        same = prefill == decode
        return f"drafter: attention on {prefill if same else f'{prefill} (prefill) and {decode} (decode)'}"
    who = "target"
    verify_backend = decode if verify_mode == "decode" else prefill
    if not speculative:
        verify = "no speculative verify"
    elif not verify_on:
        verify = f"verify on {verify_backend} (SGLang's; the plugin's verify is off)"
    elif verify_backend == "triton":
        verify = "verify on the triton backend through specdiag's split-KV kernel"
    else:
        verify = (f"the plugin's verify kernel is IDLE: target verify runs on {verify_backend} (the kernel serves the "
                  "triton backend: --attention-backend triton, or --decode-attention-backend triton "
                  "--speculative-attention-mode decode)")
    if prefill in MHA_PREFILL_BACKENDS:
        pre = f"prefill on {prefill} (chunked-prefix MHA form)"
    elif prefill == "triton" and prefill_mha:
        pre = "prefill on triton, chunks with a long prefix in the MHA form on specdiag's kernel"
    elif prefill == "triton":
        pre = ("prefill on triton (SGLang's: chunks after the first in the absorbed form, 3.4x the MHA form's FLOPs; "
               "SPECDIAG_SGLANG_PREFILL=mha or --attention-backend flashinfer is faster)")
    else:
        pre = f"prefill on {prefill}"
    return f"{who}: {verify}; {pre}"


def after_init_backends(verify_on: bool, prefill_mha: bool):
    """The AFTER hook for a plugin whose verify path is ``verify_on`` and prefill path ``prefill_mha``: logs the line
    of :func:`describe` for each model runner, once per process and line."""

    def hook(result, runner, *args, **kwargs):
        args_ = runner.server_args
        speculative = str(getattr(args_, "speculative_algorithm", None) or "NONE").upper() != "NONE"
        line = describe(str(getattr(runner, "prefill_attention_backend_str", None) or args_.attention_backend),
                        str(getattr(runner, "decode_attention_backend_str", None) or args_.attention_backend),
                        str(getattr(args_, "speculative_attention_mode", "prefill")), speculative, verify_on,
                        prefill_mha, bool(getattr(runner, "is_draft_worker", False)))
        log_once("backends:" + line, "%s", line)
        return None

    return hook
