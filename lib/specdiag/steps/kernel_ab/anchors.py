"""The anchors: kernels a user could run instead of ours, on the same VerifyInputs.

- ``sglang_splitkv``: SGLang 0.5.17's upstream split-KV verify kernel
  (``sglang/kernels/ops/attention/verify_splitkv.py``, ``verify_splitkv_fwd``: same arguments as
  ``extend_attention_fwd``; two launches; one program per (request, head, split), 576 dims padded to 1024).
  It computes a causal draft block (speculative topk == 1): it cannot verify a tree. It reads a token index
  table, so page_size 1 and block layouts alike (as the token table of the blocks).
- ``flashinfer_mla``: FlashInfer's MLA paged attention (``flashinfer.mla.BatchMLAPagedAttentionWrapper``,
  flashinfer-python 0.6.15.post1), planned with ``causal=True`` for the T draft queries at the end of the KV.
  It takes causal or no mask, no custom tree; page_size 1 reads the token table, page_size 64 the block table.
  It JIT-compiles its CUDA kernels with nvcc on first use (35-200 s on a bare machine), so the harness builds
  them first (``python -m specdiag.steps.kernel_ab.anchors --warm-flashinfer``) and runs it only when that passed.

Each anchor is checked against the same fp32 reference as ours. What an anchor cannot do is a row with a
``skipped`` reason (:func:`cannot`), never a silent gap. The SGLang kernel is loaded from its file, found at
``$SPECDIAG_SGLANG_VERIFY_PY``, ``$SGLANG_SITE`` (or /tmp/site) ``/sglang/kernels/ops/attention/verify_splitkv.py``,
or ``.anchors/verify_splitkv.py`` in the repository (an ignored copy the device command carries); it needs only
torch, Triton and ``sglang.srt.utils.is_hip`` (a stand-in returning False when SGLang itself is not importable).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
import time
import types
from pathlib import Path
from typing import Any, Optional

import torch

from specdiag.kernels.mla import BLOCK_TOKENS, D_NOPE, D_V, VerifyInputs, VerifyShape, make_inputs
from specdiag.kernels.reference import reference_verify, relative_error
from specdiag.paths import PROJECT_ROOT

ANCHORS = ("sglang_splitkv", "flashinfer_mla")
SGLANG_VERIFY_RELPATH = "sglang/kernels/ops/attention/verify_splitkv.py"



def is_chain(mask: torch.Tensor) -> bool:
    """True when the draft tree is a chain: the mask is the lower-triangular (causal) one."""
    t = mask.shape[0]
    return bool(torch.equal(mask.bool().cpu(), torch.ones(t, t, dtype=torch.bool).tril()))


def cannot(name: str, inputs: VerifyInputs, page_size: int = 1) -> Optional[str]:
    """Why anchor ``name`` cannot run this case (a row's ``skipped`` reason), or None when it can."""
    if name not in ANCHORS:
        raise ValueError(f"unknown anchor {name!r}; choose one of {ANCHORS}")
    chain = is_chain(inputs.mask)
    if name == "sglang_splitkv":
        if not chain:
            return ("tree mask: SGLang's upstream split-KV verify computes a causal draft block only (speculative "
                    "topk == 1); a branching draft tree falls back to extend_attention_fwd in SGLang")
        if page_size != 1:
            return "reads a token index table (kv_indices), not a 64-token block table: measured as page_size 1"
        return None
    if not chain:
        return "tree mask: FlashInfer's MLA paged attention takes causal or no mask, not a custom draft tree"
    if page_size == BLOCK_TOKENS and inputs.block_table is None:
        return "page_size 64 needs a block table: this layout (shuffled_p1) has none"
    return None


# ---- SGLang's upstream split-KV verify ----------------------------------------------------------

def find_sglang_verify() -> Optional[Path]:
    """The verify_splitkv.py file to load, or None (see the module docstring for the search order)."""
    cands = [os.environ.get("SPECDIAG_SGLANG_VERIFY_PY")]
    for site in (os.environ.get("SGLANG_SITE"), "/tmp/site"):
        if site:
            cands.append(str(Path(site) / SGLANG_VERIFY_RELPATH))
    cands.append(str(PROJECT_ROOT / ".anchors" / "verify_splitkv.py"))
    for c in cands:
        if c and Path(c).is_file():
            return Path(c)
    return None


def load_sglang_verify(path: Optional[Path] = None) -> types.ModuleType:
    """Import SGLang's verify_splitkv module from its file (a stand-in for sglang.srt.utils when needed)."""
    path = path or find_sglang_verify()
    if path is None:
        raise FileNotFoundError(
            "SGLang's verify_splitkv.py not found: set SPECDIAG_SGLANG_VERIFY_PY, or SGLANG_SITE to an unpacked "
            f"SGLang 0.5.17 site, or copy {SGLANG_VERIFY_RELPATH} to .anchors/verify_splitkv.py")
    if "sglang.srt.utils" not in sys.modules:
        try:
            import sglang.srt.utils  # noqa: F401, PLC0415 - optional: the except stands in for it
        except Exception:  # noqa: BLE001 - SGLang absent or unimportable here: the file needs only is_hip
            for mod in ("sglang", "sglang.srt"):
                sys.modules.setdefault(mod, types.ModuleType(mod))
            utils = types.ModuleType("sglang.srt.utils")
            utils.is_hip = lambda: False
            sys.modules["sglang.srt.utils"] = utils
    spec = importlib.util.spec_from_file_location("specdiag_anchor_sglang_verify_splitkv", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def sglang_verify_args(inputs: VerifyInputs, out: torch.Tensor) -> tuple[list[Any], dict[str, Any]]:
    """The arguments of ``verify_splitkv_fwd`` (= extend_attention_fwd's) for one request of ``inputs``.

    SGLang's MLA layout: the pool holds one latent row per token ([pool, 1, 576] keys; values = the first 512
    columns of the same rows); the prefix is read through kv_indices, the T draft tokens come as k/v_extend.
    """
    T, H = inputs.draft_tokens, inputs.heads
    dev = inputs.q.device
    P = inputs.n_prefix
    k_buffer = inputs.cache[:, None, :]  # [pool, 1, 576]
    v_buffer = inputs.cache[:, None, :D_V]  # [pool, 1, 512], a view (strides of the 576-wide rows)
    draft_rows = inputs.cache[inputs.token_table[P:]]  # [T, 576]
    k_extend = draft_rows[:, None, :].contiguous()
    v_extend = draft_rows[:, None, :D_V].contiguous()
    qo_indptr = torch.tensor([0, T], dtype=torch.int32, device=dev)
    kv_indptr = torch.tensor([0, P], dtype=torch.int32, device=dev)
    kv_indices = inputs.token_table[:P].to(torch.int64).contiguous()
    mask_indptr = torch.zeros(2, dtype=torch.int64, device=dev)
    args = [inputs.q, k_extend, v_extend, out.view(T, H, D_V), k_buffer, v_buffer, qo_indptr, kv_indptr, kv_indices,
            None, True, mask_indptr, T, 1.0, 1.0]
    return args, {"sm_scale": inputs.sm_scale, "max_bs": 1}


def run_sglang_verify(mod: types.ModuleType, args: list[Any], kwargs: dict[str, Any]) -> None:
    if not mod.verify_splitkv_fwd(*args, **kwargs):
        raise RuntimeError("SGLang's verify_splitkv_fwd declined the case (can_handle returned False)")


# ---- FlashInfer MLA ----------------------------------------------------------------------------

def flashinfer_tables(inputs: VerifyInputs, page_size: int) -> dict[str, torch.Tensor]:
    """FlashInfer's paged-KV description of one request: indptrs, page indices, KV length (int32)."""
    dev = inputs.q.device
    n_kv = inputs.n_kv
    if page_size == 1:
        pages = inputs.token_table.to(torch.int32)
    elif page_size == BLOCK_TOKENS:
        if inputs.block_table is None:
            raise ValueError("page_size 64 needs a block table: this layout (shuffled_p1) has none")
        pages = inputs.block_table.to(torch.int32)
    else:
        raise ValueError(f"page_size must be 1 or {BLOCK_TOKENS}; got {page_size}")
    return {"qo_indptr": torch.tensor([0, inputs.draft_tokens], dtype=torch.int32, device=dev),
            "kv_indptr": torch.tensor([0, pages.numel()], dtype=torch.int32, device=dev),
            "kv_indices": pages.contiguous(), "kv_len": torch.tensor([n_kv], dtype=torch.int32, device=dev)}


class FlashInferMLA:
    """FlashInfer's BatchMLAPagedAttentionWrapper planned for one verify case (CUDA only).

    The cache [pool, 576] is split into FlashInfer's two paged tensors, ckv [pages, page_size, 512] and
    kpe [pages, page_size, 64] (contiguous copies made here, outside the timed call).
    """

    def __init__(self, inputs: VerifyInputs, page_size: int, workspace_bytes: int = 128 << 20):
        import flashinfer  # noqa: PLC0415 - loads flashinfer (costly: ARCHITECTURE.md, Imports)

        dev = inputs.q.device
        self.page_size = page_size
        pool = inputs.cache.shape[0]
        self.ckv = inputs.cache[:, :D_NOPE].contiguous().view(pool // page_size, page_size, D_NOPE)
        self.kpe = inputs.cache[:, D_NOPE:].contiguous().view(pool // page_size, page_size, -1)
        self.q_nope = inputs.q[..., :D_NOPE].contiguous()
        self.q_pe = inputs.q[..., D_NOPE:].contiguous()
        t = flashinfer_tables(inputs, page_size)
        ws = torch.empty(workspace_bytes, dtype=torch.int8, device=dev)
        self.wrapper = flashinfer.mla.BatchMLAPagedAttentionWrapper(ws, backend="auto")
        self.wrapper.plan(t["qo_indptr"], t["kv_indptr"], t["kv_indices"], t["kv_len"], inputs.heads, D_NOPE,
                          self.kpe.shape[-1], page_size, True, inputs.sm_scale, inputs.q.dtype, inputs.cache.dtype)

    def __call__(self, out: torch.Tensor) -> torch.Tensor:
        return self.wrapper.run(self.q_nope, self.q_pe, self.ckv, self.kpe, out=out)


def warm_flashinfer(device: str = "cuda", context_tokens: int = 4096, heads: int = 8,
                    draft_tokens_list: tuple[int, ...] = (1, 8)) -> list[dict[str, Any]]:
    """Build FlashInfer's MLA kernels once (its nvcc JIT fills the cache the harness then reuses) and check
    them on small chain cases against the fp32 reference. One dict per case: seconds, rel_err, or the error."""
    results: list[dict[str, Any]] = []
    for t in draft_tokens_list:
        shape = VerifyShape(context_tokens, heads, t, "shuffled_p1")
        row: dict[str, Any] = {"context_tokens": context_tokens, "heads": heads, "draft_tokens": t, "page_size": 1}
        t0 = time.monotonic()
        try:
            inputs = make_inputs(shape, device=device, seed=0, chain=True)
            out = torch.empty(t, heads, D_V, dtype=torch.bfloat16, device=device)
            FlashInferMLA(inputs, 1)(out)
            torch.cuda.synchronize()
            row["seconds"] = round(time.monotonic() - t0, 1)
            row["rel_err"] = relative_error(out, reference_verify(inputs))
        except Exception as exc:  # noqa: BLE001 - report why the anchor cannot run, then go on
            row["seconds"] = round(time.monotonic() - t0, 1)
            row["error"] = repr(exc)[:800]
        results.append(row)
    return results


def main(argv: Optional[list[str]] = None) -> int:
    """``python -m specdiag.steps.kernel_ab.anchors --warm-flashinfer``: JIT-build and check FlashInfer's MLA kernels."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--warm-flashinfer", action="store_true", required=True,
                    help="build FlashInfer's MLA kernels (nvcc JIT) and check them on 4k-token chain cases")
    ap.add_argument("--device", default="cuda")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available() and args.device.startswith("cuda"):
        print("FlashInfer's MLA kernels need a CUDA GPU; none is visible here", file=sys.stderr)
        return 2
    rows = warm_flashinfer(args.device)
    for row in rows:
        print(json.dumps(row), flush=True)
    return 0 if all("error" not in r for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
