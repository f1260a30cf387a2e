"""Triton's CPU interpreter (TRITON_INTERPRET=1) under numpy >= 2: one compatibility fix, applied on import.

Applied by ``specdiag.kernels`` itself, so every kernel of the package (and any test running one under the
interpreter) gets it; compiled kernels are untouched.
"""

from __future__ import annotations

import os


def interpreter_compat() -> bool:
    """Let Triton 3.6's CPU interpreter run loops bounded by scalar tensors under numpy >= 2.

    The interpreter keeps a program id as a 1-element array and converts loop bounds with ``int(array)``,
    which numpy 2 refuses for arrays that are not 0-d. This re-registers ``__index__`` to take the single
    element. Only when TRITON_INTERPRET=1; compiled kernels are untouched. Returns whether it patched.
    """
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
