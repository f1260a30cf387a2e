"""MLA verify attention kernels at batch 1: what ships and what 06's kernel A/B compares, nothing else.

One entry point, :func:`~specdiag.kernels.verify.verify`, serves a verify call on SGLang's ragged layout with the
kernel :func:`~specdiag.kernels.verify.choose` names for the device and the cache's dtype (sm_90: the Gluon kernel, or
its fp8 form on an fp8 cache; other GPUs: the Triton kernel): the SGLang plugin's calls. The kernel A/B's arms call
their kernels by name, each on one :class:`~specdiag.kernels.mla.VerifyInputs`. Every kernel fills a preallocated
output [T, H, 512].

| module | what |
|---|---|
| verify | the entry point: the kernel by device and cache dtype, and the call |
| mla | shapes, inputs, layouts (SGLang's ragged one too), bytes and FLOPs of a verify call |
| plan | split counts, launch configurations, the SM count and the Triton fallback's configuration ladder (pure) |
| merge | the log-sum-exp merge of the splits' partials: its Triton functions and both merge launches |
| reference | the fp32 definition, and torch forms of the baseline and split-KV designs (the CPU's) |
| triton.baseline | SGLang's Triton verify structure: no KV split (the collapse); the A/B's ``baseline`` |
| triton.splitkv | split-KV in Triton, token table or 64-token pages; the A/B's ``split_triton`` arms |
| triton.ragged | the plugin's Triton kernel on SGLang's layout (other GPUs, a logit cap) |
| gluon.ws | the warp-specialized kernel (sm_90), rows as M; its partitions, copies and barriers serve the others |
| gluon.swap | the same with the rows as the wgmma's N, up to 16 rows |
| gluon.fp8 | the rows-as-N kernel on an fp8 e4m3 cache |
| gluon.ragged | the plugin's Gluon kernels on SGLang's layout, bf16 and fp8 |
| gluon.pick | the dense pick among them and its fp8 form: the A/B's ``pick`` arms |

Triton is imported only by the modules that launch kernels (not by this package, ``verify``, ``mla``, ``plan``,
``reference``, ``gluon.pick``), so the CPU paths (tests, replays) never need a GPU. Under ``TRITON_INTERPRET=1``
(Triton's CPU interpreter, used by the tests) one compatibility fix is applied on import. Forms that were measured
and not kept live only in the repository's git history; scripts/kernel_ptx_hashes.py fingerprints the compiled code
of every configuration that ships.
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
