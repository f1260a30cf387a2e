"""MLA verify attention kernels at batch 1: what ships and what 06's kernel A/B compares, nothing else.

Every entry point fills a preallocated ``out`` [T, H, 512] from :class:`~specdiag.kernels.mla.VerifyInputs` (or, for
the plugin's kernels, SGLang's ragged layout):

| module | what |
|---|---|
| mla | shapes, inputs, layouts, bytes and FLOPs of a verify call |
| reference | the fp32 definition, and torch forms of the baseline and split-KV designs (the CPU's) |
| triton_baseline | SGLang's Triton verify structure: no KV split (the collapse) |
| triton_splitkv | split-KV in Triton, token table or 64-token pages, and its merge launch |
| splitkv_plan | split counts, launch configurations and the plugin's configuration ladder (pure) |
| split_merge | the log-sum-exp merge of the splits' partials (Triton functions shared by every merge) |
| pick | the pick and its fp8 form: one call each, one frozen config |
| gluon_ws, gluon_ws_swap, gluon_ws_fp8 | the pick's warp-specialized Gluon kernels (sm_90): row-major, rows as N, fp8 |
| gluon_ws_ragged | the SGLang plugin's kernels on SGLang's ragged layout, bf16 and fp8 (sm_90) |
| triton_splitkv_ragged | the plugin's Triton fallback on the ragged layout (other GPUs, a logit cap) |

Triton is imported only by the modules that launch kernels, so the CPU paths (tests, replays) never need a GPU.
Under ``TRITON_INTERPRET=1`` (Triton's CPU interpreter, used by the tests) one compatibility fix is applied on import.
Forms that were measured and not kept live only in the repository's git history.
"""

import os


def _interpreter_compat() -> bool:
    """Let Triton 3.6's CPU interpreter run loops bounded by scalar tensors under numpy >= 2 (it converts a program
    id kept as a 1-element array with ``int(array)``, which numpy 2 refuses); only when TRITON_INTERPRET=1."""
    if os.environ.get("TRITON_INTERPRET") != "1":
        return False
    import numpy as np  # noqa: PLC0415
    from triton.runtime import interpreter as interp  # noqa: PLC0415

    if getattr(interp._patch_lang_tensor, "_specdiag", False):
        return True
    original = interp._patch_lang_tensor

    def patched(tensor, scope):
        original(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(np.asarray(self.handle.data).reshape(-1)[0]))

    patched._specdiag = True
    interp._patch_lang_tensor = patched
    return True


_interpreter_compat()

from specdiag.kernels.mla import LAYOUTS, VerifyInputs, VerifyShape, kv_bytes, make_inputs, verify_flops  # noqa: E402,F401
