"""The name tables :mod:`specdiag.telemetry.torch_trace` sorts a torch profiler trace with.

Both tables are ordered ``(column, regex)`` pairs, searched (``re.search``) against an event's name; the
first pattern that matches wins. They are parameters of :func:`~specdiag.telemetry.torch_trace.step_breakdown`,
so a trace of another model or backend can bring its own.

Where the names come from (looked up, not guessed):

- Triton names a kernel after its ``@triton.jit`` function. specdiag's split-KV verify kernel:
  ``_ragged_partial_kernel`` (lib/specdiag/kernels/triton/ragged.py) / ``_ragged_merge_kernel`` (merge.py) and
  the older ``_split_partial_kernel`` (triton/splitkv.py) / ``_merge_kernel`` (merge.py). SGLang 0.5.17
  (sglang/kernels/ops/attention/): extend/verify ``_fwd_kernel`` and ``_fwd_kernel_unified``
  (extend_attention.py), decode ``_fwd_kernel_stage1`` / ``_fwd_grouped_kernel_stage1`` /
  ``_fwd_kernel_stage2`` (decode_attention.py), ``merge_state_kernel`` (merge_state.py), the upstream
  split-KV verify ``_verify_prefix_stage1`` / ``_verify_combine_stage2`` (verify_splitkv.py);
  ``create_flashinfer_kv_indices_triton`` / ``create_flashmla_kv_indices_triton`` (kernels/ops/kvcache/kv_indices.py).
- CUDA libraries: cuBLAS/cuBLASLt GEMMs on Hopper are ``nvjet_*``, ``sm90_xmma_gemm_*``, ``cutlass*gemm*``;
  PyTorch's own elementwise and reduction kernels live in ``at::native``.
- Python functions (``with_stack=True`` records them as ``<path>(<line>): <name>``), SGLang 0.5.17:
  srt/speculative/ngram_worker.py (``forward_batch_generation``, ``_prepare_for_speculative_decoding``,
  ``_prepare_draft_tokens``, ``_update_ngram_corpus``), srt/speculative/cpp_ngram/ngram_corpus.py
  (``batch_get``, ``batch_put``, ``synchronize``), srt/managers/tp_worker.py (``forward_batch_generation``,
  the target model's forward), srt/speculative/eagle_utils.py (``eagle_sample``),
  srt/speculative/spec_utils.py (``move_accept_tokens_to_target_kvcache``), srt/managers/scheduler.py
  (``run_batch``, ``process_batch_result``, ``get_next_batch_to_run``, ``process_input_requests``),
  srt/managers/scheduler_components/batch_result_processor.py (``process_batch_result_decode`` ...),
  srt/managers/scheduler_components/request_receiver.py (``recv_requests``). specdiag's SGLang plugin, with
  its NGRAM prompt-tail on, runs ``prepare_draft_tokens`` / ``update_ngram_corpus`` of
  plugins/sglang/specdiag_sglang_plugin/ngram_tail.py in place of NGRAM's two methods (an AROUND hook that does
  not call the original), so those names count for the same phases.
"""

from __future__ import annotations

#: Step markers tried in order when none is given: the NGRAM worker's verify call, then the scheduler's
#: ``run_batch`` (one per forward of any kind). A step runs from one marker's start to the next one's.
DEFAULT_MARKERS: tuple[str, ...] = (
    r"ngram_worker\.py\(\d+\): forward_batch_generation$",
    r"scheduler\.py\(\d+\): run_batch$",
)

#: A step that ran one of these is a verify step (drafts were made or checked); others (a prefill through
#: the same worker) are marked ``verify_step=False``.
VERIFY_STEP_PATTERN = (r"ngram_worker\.py\(\d+\): _prepare_draft_tokens$|ngram_tail\.py\(\d+\): prepare_draft_tokens$"
                       r"|eagle_utils\.py\(\d+\): eagle_sample$")

#: The Python function torch runs to start tracing: every function on the stack when it ran (its
#: ancestors) began before the trace did, so a marker among them is a partial step.
PROFILER_START_PATTERN = r"torch/profiler/profiler\.py\(\d+\): (start|__enter__)$"

#: GPU op classes, first match wins. memcpy/memset ops are classed by their category, not by name.
KERNEL_CLASSES: tuple[tuple[str, str], ...] = (
    ("attn_specdiag_splitkv", r"_ragged_partial_kernel|_ragged_merge_kernel|_split_partial_kernel|(^|\W)_merge_kernel"),
    ("attn_sglang_verify_splitkv", r"_verify_prefix_stage1|_verify_combine_stage2"),
    ("attn_sglang_triton", r"_fwd_kernel|_fwd_grouped_kernel|merge_state_kernel"),
    ("attn_other", r"(?i)BatchPrefillWith|BatchDecodeWith|BatchMLA|PrefillWithKVCache|DecodeWithKVCache"
                   r"|flash_fwd|flash::|fmha|flashmla"),
    ("kv_indices", r"create_flashinfer_kv_indices_triton|create_flashmla_kv_indices_triton"),
    ("moe", r"(?i)fused_moe|moe_align|moe_sum|grouped_gemm|deep_gemm|topk_softmax|expert"),
    ("gemm", r"(?i)nvjet|gemm|cutlass|sm90_xmma|cublas|wgmma"),
    ("comm", r"(?i)nccl|all_?reduce|all_?gather|cross_device_reduce"),
    ("norm", r"(?i)rms_?norm|layer_?norm"),
    ("elementwise", r"(?i)at::native|elementwise|reduce|softmax|act_and_mul|silu|gelu|rotary|rope|argmax|sampling"
                    r"|^triton_(poi|red|per)_"),  # the last: torch.compile (Inductor) fused pointwise/reductions
)

#: Columns for the GPU ops' own categories (chrome trace ``cat``), before the name table is tried.
CATEGORY_CLASSES: dict[str, str] = {"gpu_memcpy": "memcpy", "gpu_memset": "memset"}

#: The class of a GPU op no pattern matched.
OTHER_CLASS = "other"

#: CPU phases: Python functions whose time per step is reported (the outermost call counts once). They
#: nest (draft prep runs inside the speculative prep, both inside the marker), so they do not add up.
CPU_PHASES: tuple[tuple[str, str], ...] = (
    ("ngram_prepare", r"ngram_worker\.py\(\d+\): _prepare_for_speculative_decoding$"),
    ("ngram_draft", r"ngram_worker\.py\(\d+\): _prepare_draft_tokens$|ngram_tail\.py\(\d+\): prepare_draft_tokens$"),
    ("ngram_corpus_sync", r"ngram_corpus\.py\(\d+\): synchronize$"),
    ("ngram_corpus_get", r"ngram_corpus\.py\(\d+\): batch_get$"),
    ("ngram_corpus_update", r"ngram_worker\.py\(\d+\): _update_ngram_corpus$"
                            r"|ngram_tail\.py\(\d+\): update_ngram_corpus$"),
    ("target_forward", r"tp_worker\.py\(\d+\): forward_batch_generation$"),
    ("sample", r"eagle_utils\.py\(\d+\): eagle_sample$"),
    ("kv_move", r"spec_utils\.py\(\d+\): move_accept_tokens_to_target_kvcache$"),
    ("process_result", r"\.py\(\d+\): process_batch_result(_decode|_prefill)?$"),
    ("schedule", r"scheduler\.py\(\d+\): get_next_batch_to_run$"),
    ("recv", r"\.py\(\d+\): (recv_requests|process_input_requests)$"),
)

#: Runtime calls that replay a CUDA graph (one per graph launch; CUPTI gives the graph's kernels its id).
GRAPH_LAUNCH_PATTERN = r"^(cudaGraphLaunch|cuGraphLaunch|hipGraphLaunch)"
