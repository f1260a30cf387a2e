"""The kernel A/B's arms: a name, what it is, the layout and cache it reads, and a config passed through unchanged.

Ten arms, all MLA verify attention at batch 1 on the same :class:`~specdiag.kernels.mla.VerifyInputs`:

| arm | what it is |
|---|---|
| ``baseline`` | SGLang's Triton verify structure: one program per head and 32 draft tokens, no KV split |
| ``split_triton`` | our split-KV kernel in Triton, page_size 1 token table |
| ``split_triton_b64`` | the same kernel reading 64-token pages (a block table): the page-size effect |
| ``pick`` | our fastest dense kernel on sm_90 (specdiag.kernels.gluon.pick) |
| ``pick_fp8`` | the pick on an fp8 e4m3 cache (up to 16 rows) |
| ``plugin`` | what the SGLang plugin serves on sm_90, on SGLang's ragged layout (gluon.ragged) |
| ``plugin_fp8`` | what it serves on an fp8_e4m3 cache |
| ``plugin_triton`` | its Triton fallback (other GPUs, a logit cap) |
| ``flashinfer_mla`` | FlashInfer's MLA paged attention (anchor) |
| ``sglang_splitkv`` | SGLang's own split-KV verify kernel, gated to one AMD target upstream (anchor) |

:func:`prepare` turns an arm and one case's inputs into a zero-argument call that launches only the arm's kernels
(what can be made once, such as the ragged layout or FlashInfer's plan, is made here), so the timed call is the
kernel's. On the CPU the arms with a torch form of the same design run it (a correctness exercise); the others say
why not (:func:`cannot_run`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional

import torch

from specdiag.kernels.gluon.pick import PICK, PICK_FP8, PickConfig, PickFp8Config, split_kv_pick, split_kv_pick_fp8
from specdiag.kernels.mla import VerifyInputs, dequantized, ragged_args
from specdiag.kernels.reference import baseline_torch, split_kv_torch
from specdiag.kernels.verify import GLUON, GLUON_FP8, TRITON, verify
from specdiag.steps.kernel_ab.anchors import (
    FlashInferMLA, cannot, load_sglang_verify, run_sglang_verify, sglang_verify_args)


TOL = 1e-2  #: largest relative error against the fp32 reference of the cache the arm reads
FP8_TOL = 0.1  #: an fp8 arm against the bf16 cache's reference (quantization included)


@dataclass(frozen=True)
class Arm:
    name: str
    what: str  #: one line for tables and legends
    family: str  #: "baseline", "ours" (split-KV kernels of this suite), "plugin" (what the plugin serves), "anchor"
    layout: str = "shuffled_p1"  #: the cache layout it reads (mla.LAYOUTS)
    kv: str = "bf16"  #: "bf16" or "fp8" (e4m3, one scale)
    config: Any = None  #: handed to the kernel's entry point as it is (None: the entry point's own default)
    torch_form: bool = False  #: has a torch form of its design that runs on the CPU


ARMS: dict[str, Arm] = {a.name: a for a in (
    Arm("baseline", "SGLang's Triton verify structure, no KV split", "baseline", torch_form=True),
    Arm("split_triton", "split-KV in Triton, page_size 1", "ours", torch_form=True),
    Arm("split_triton_b64", "split-KV in Triton, 64-token pages", "ours", layout="shuffled_b64"),
    Arm("pick", "our fastest dense kernel (Gluon, sm_90)", "ours", config=PICK),
    Arm("pick_fp8", "the pick on an fp8 cache", "ours", kv="fp8", config=PICK_FP8),
    Arm("plugin", "the SGLang plugin's kernel (sm_90)", "plugin"),
    Arm("plugin_fp8", "the plugin's kernel on an fp8 cache", "plugin", kv="fp8"),
    Arm("plugin_triton", "the plugin's Triton fallback", "plugin"),
    Arm("flashinfer_mla", "FlashInfer MLA (anchor)", "anchor"),
    Arm("sglang_splitkv", "SGLang's own split-KV verify (anchor)", "anchor"),
)}
#: the arms that stand for this suite's fix in targets and findings
OURS = ("pick", "plugin")


def arm(name: str) -> Arm:
    if name not in ARMS:
        raise ValueError(f"unknown arm {name!r}; choose from {', '.join(ARMS)}")
    return ARMS[name]


def cannot_run(a: Arm, inputs: VerifyInputs, anchors_off: Optional[dict[str, str]] = None) -> Optional[str]:
    """Why arm ``a`` cannot run this case here (the row's ``skipped`` reason), or None."""
    rows = inputs.heads * inputs.draft_tokens
    if anchors_off and a.name in anchors_off:
        return anchors_off[a.name]
    if not inputs.q.is_cuda:
        return None if a.torch_form else f"{a.name} runs on CUDA only (no torch form of its design)"
    sm90 = torch.cuda.get_device_capability(inputs.q.device) == (9, 0)
    if a.name in ("pick", "pick_fp8", "plugin", "plugin_fp8") and not sm90:
        return f"{a.name} is an sm_90 (Hopper) kernel; this GPU is sm_{''.join(map(str, torch.cuda.get_device_capability()))}"
    if a.name == "pick_fp8" and rows > 16:
        return f"the fp8 pick holds up to 16 packed rows (heads x draft tokens); this case has {rows}"
    if a.family == "anchor":
        return cannot(a.name, inputs, page_size=1)
    return None




def reference_inputs(a: Arm, inputs: VerifyInputs) -> VerifyInputs:
    """What the arm's output is checked against: the cache it reads (the dequantized fp8 cache for fp8 arms)."""
    return dequantized(inputs) if a.kv == "fp8" else inputs


def prepare(a: Arm, inputs: VerifyInputs, out: torch.Tensor) -> Callable[[], object]:
    """A zero-argument call running arm ``a`` on ``inputs`` into ``out`` [T, H, 512] (module doc)."""
    if not inputs.q.is_cuda:
        return _torch_call(a, inputs, out)
    if a.name == "baseline":
        from specdiag.kernels.triton.baseline import baseline_triton  # noqa: PLC0415 - loads triton (costly: ARCHITECTURE.md, Imports)

        return lambda: baseline_triton(inputs, out)
    if a.name in ("split_triton", "split_triton_b64"):
        from specdiag.kernels.triton.splitkv import split_kv_triton  # noqa: PLC0415 - loads triton (costly: ARCHITECTURE.md, Imports)

        page = 64 if a.layout == "shuffled_b64" else 1
        return lambda: split_kv_triton(inputs, out, page_size=page, cfg=a.config)
    if a.name == "pick":
        cfg: PickConfig = a.config
        return lambda: split_kv_pick(inputs, out, cfg)
    if a.name == "pick_fp8":
        cfg8: PickFp8Config = a.config
        return lambda: split_kv_pick_fp8(inputs, out, cfg8)
    if a.family == "plugin":
        return _plugin_call(a, inputs, out)
    if a.name == "flashinfer_mla":
        fi = FlashInferMLA(inputs, 1)
        return lambda: fi(out)
    if a.name == "sglang_splitkv":
        mod = load_sglang_verify()
        args, kwargs = sglang_verify_args(inputs, out)
        return lambda: run_sglang_verify(mod, args, kwargs)
    raise ValueError(f"no call for arm {a.name!r}")


def _plugin_call(a: Arm, inputs: VerifyInputs, out: torch.Tensor) -> Callable[[], object]:
    """The plugin's entry point (specdiag.kernels.verify) with the kernel the hook serves there, on one request laid
    out as SGLang passes it (made once)."""
    args = ragged_args(inputs, out.view(inputs.draft_tokens, inputs.heads, -1))
    if a.name == "plugin_fp8":
        fp8 = {**args, "kv": inputs.cache_fp8, "kv_scale": inputs.kv_scale}
        return lambda: verify(**fp8, cfg=a.config, kernel=GLUON_FP8)
    kernel = GLUON if a.name == "plugin" else TRITON
    return lambda: verify(**args, cfg=a.config, kernel=kernel)


def _torch_call(a: Arm, inputs: VerifyInputs, out: torch.Tensor) -> Callable[[], object]:
    if a.name == "baseline":
        return lambda: baseline_torch(inputs, out)
    if a.name == "split_triton":
        return lambda: split_kv_torch(inputs, out, n_splits=4)
    raise ValueError(f"{a.name} has no torch form")
