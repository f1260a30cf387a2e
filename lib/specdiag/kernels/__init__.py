"""MLA verify attention for the kernel A/B (notebook 06): implementations, harness, analysis.

Kernels, by name (each fills a preallocated ``out`` [T, H, 512] bf16 from :class:`VerifyInputs`):

- ``reference``: fp32 torch, scores materialized (reference.py). The definition.
- ``baseline``:  SGLang's CUDA verify structure (triton_baseline.py; torch fallback on the CPU).
- ``split_kv``:  the split-KV kernel, page_size 1 or 64 (triton_splitkv.py; torch fallback on the CPU).
- ``fused_split_kv``: one launch, the merge by the last programs of each row tile; bf16 or fp8 KV (triton_fused.py).

Triton is imported only when a kernel runs on CUDA, so the CPU path (tests, notebook replay)
never needs it.
"""

from specdiag.kernels.interpreter import interpreter_compat

interpreter_compat()  # only under TRITON_INTERPRET=1 (Triton's CPU interpreter with numpy >= 2)

from specdiag.kernels.mla import (LAYOUTS, VerifyInputs, VerifyShape, kv_bytes, make_inputs,  # noqa: E402, F401
                                  verify_flops)
from specdiag.kernels.dispatch import KERNEL_VARIANTS, KernelVariant, run_variant, variant  # noqa: E402, F401
