"""MLA verify attention: the problem's shapes, KV layouts, tree masks and counts (bytes, FLOPs).

Absorbed MLA (DeepSeek-V3 / Kimi-K2 geometry): every query head attends over one shared latent
cache row per token of ``D_QK = 576`` bf16 values (512 compressed "nope" dims + 64 rope dims);
values are the first ``D_V = 512`` columns of the same row. A verify step scores ``T`` draft tokens
x ``H`` local heads against a prefix of ``P`` tokens (fully visible) plus the ``T`` draft tokens
themselves (visible under a tree mask: each draft token sees its ancestors and itself).

KV layouts (how the token -> cache-slot map looks; ``layout`` in every result row):

- ``contiguous``: token i lives in slot i.
- ``shuffled_p1``: page_size 1, every token in a random slot of the pool (SGLang's default
  allocator after some churn). Only a token index table can express it.
- ``shuffled_b64``: 64-token blocks in random order (FlashMLA's required page size). Expressed both
  as a block table (page_size 64) and, for kernels that want one, as the equivalent token table.

Counts (pure functions; units in the names):

- KV bytes read once = ``n_kv * 576 * 2`` (each latent row once; index tables not counted, they
  add 8 B per 1,152 B row = 0.7 % for int64 page_size-1 tables).
- FLOPs = ``2 * H * T * n_kv * (576 + 512)`` (QK^T over 576 dims, PV over 512; the T x T draft
  block's masked-out entries are counted too, a < T / n_kv correction). Source: FlashMLA's
  deep-dive formula 2*h_q*s_q*s_k*(d_k+d_v).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal, Optional

import torch

D_QK: int = 576  #: latent row width scored against (512 nope + 64 rope), elements
D_NOPE: int = 512  #: compressed latent dims (also the value dims), elements
D_PE: int = 64  #: decoupled rope dims, elements
D_V: int = 512  #: value dims (first 512 columns of the latent row), elements
BYTES_PER_ELEM: int = 2  #: bf16
KV_ROW_BYTES: int = D_QK * BYTES_PER_ELEM  #: 1,152 B per token per layer
BLOCK_TOKENS: int = 64  #: page size of the block layout (FlashMLA's hard requirement)
#: softmax scale of DeepSeek-V3's MLA: 1/sqrt(qk_nope_head_dim 128 + qk_rope_head_dim 64)
DEEPSEEK_SM_SCALE: float = 1.0 / math.sqrt(192.0)
LOG2E: float = 1.4426950408889634  #: log2(e): the kernels' softmax runs in base 2, so scores are scaled by sm_scale x this

Layout = Literal["contiguous", "shuffled_p1", "shuffled_b64"]
LAYOUTS: tuple[str, ...] = ("contiguous", "shuffled_p1", "shuffled_b64")


@dataclass(frozen=True)
class VerifyShape:
    """One verify-attention problem at batch 1.

    context_tokens: prefix length P (tokens already in the cache, all visible)
    heads:          local query heads H (after tensor parallelism)
    draft_tokens:   draft tokens T verified in this step (also appended to the cache)
    layout:         where the tokens live in the cache pool (see module docstring)
    """

    context_tokens: int
    heads: int
    draft_tokens: int
    layout: str = "contiguous"

    def __post_init__(self) -> None:
        for name in ("context_tokens", "heads", "draft_tokens"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"VerifyShape.{name} must be a positive int; got {value!r}")
        if self.layout not in LAYOUTS:
            raise ValueError(f"VerifyShape.layout must be one of {LAYOUTS}; got {self.layout!r}")

    @property
    def n_kv(self) -> int:
        """Cache rows each query row may read: prefix + draft tokens."""
        return self.context_tokens + self.draft_tokens

    @property
    def rows(self) -> int:
        """Query rows packed by a split kernel: heads x draft tokens."""
        return self.heads * self.draft_tokens


def kv_bytes(n_kv: int) -> int:
    """Bytes of latent cache a verify step must read, each row once (B)."""
    return n_kv * KV_ROW_BYTES


def verify_flops(heads: int, draft_tokens: int, n_kv: int) -> int:
    """Multiply-add FLOPs of one verify step, QK^T (576 dims) plus PV (512 dims)."""
    return 2 * heads * draft_tokens * n_kv * (D_QK + D_V)


def arithmetic_intensity_flop_per_byte(heads: int, draft_tokens: int) -> float:
    """FLOP per KV byte, independent of context: 2*H*T*1088/1152, about 1.9*H*T."""
    return 2 * heads * draft_tokens * (D_QK + D_V) / KV_ROW_BYTES


def ridge_rows(peak_tflops: float, peak_gbps: float) -> float:
    """H*T above which verify is compute-bound on a device with these peaks."""
    ridge_flop_per_byte = peak_tflops * 1e12 / (peak_gbps * 1e9)
    return ridge_flop_per_byte * KV_ROW_BYTES / (2 * (D_QK + D_V))


@dataclass
class VerifyInputs:
    """Tensors of one verify call (one layer, batch 1).

    q:           [T, H, 576] bf16 queries (absorbed form)
    cache:       [pool_tokens, 576] bf16 latent cache pool
    token_table: [n_kv] int64, cache slot of each token (prefix first, then the T draft tokens)
    block_table: [ceil(n_kv / 64)] int32 block ids, or None when the layout has no 64-token blocks
    mask:        [T, T] bool tree mask, mask[i, j] = draft token i may see draft token j
    n_prefix:    P, tokens before the draft block
    sm_scale:    softmax scale applied to q.k
    cache_fp8:   the cache quantized to float8_e4m3fn [pool_tokens, 576] (None unless made by with_fp8_cache)
    kv_scale:    per-tensor dequantization scale of cache_fp8 (cache ~= cache_fp8 * kv_scale)
    """

    q: torch.Tensor
    cache: torch.Tensor
    token_table: torch.Tensor
    block_table: Optional[torch.Tensor]
    mask: torch.Tensor
    n_prefix: int
    sm_scale: float = DEEPSEEK_SM_SCALE
    cache_fp8: Optional[torch.Tensor] = field(default=None, repr=False)
    kv_scale: float = 1.0
    mask_u8: torch.Tensor = field(init=False, repr=False)  #: the mask as uint8, for kernels

    def __post_init__(self) -> None:
        self.mask_u8 = self.mask.to(torch.uint8).contiguous()

    @property
    def draft_tokens(self) -> int:
        return int(self.q.shape[0])

    @property
    def heads(self) -> int:
        return int(self.q.shape[1])

    @property
    def n_kv(self) -> int:
        return int(self.token_table.shape[0])

    def out_like(self) -> torch.Tensor:
        """A fresh output buffer [T, H, 512] bf16, poisoned with NaN so unwritten rows show."""
        return torch.full((self.draft_tokens, self.heads, D_V), float("nan"), dtype=torch.bfloat16,
                          device=self.q.device)


def tree_mask(draft_tokens: int, generator: torch.Generator, chain: bool = False) -> torch.Tensor:
    """A random draft tree's ancestor-or-self mask [T, T] (bool, CPU).

    Token 0 hangs off the last prefix token; token i>0 picks a random parent among 0..i-1 (or i-1
    when ``chain``, which gives the causal mask). mask[i, j] is True when j is i or an ancestor of i.
    """
    mask = torch.zeros(draft_tokens, draft_tokens, dtype=torch.bool)
    for i in range(draft_tokens):
        mask[i, i] = True
        if i > 0:
            parent = i - 1 if chain else int(torch.randint(0, i, (1,), generator=generator))
            mask[i] |= mask[parent]
    return mask


def make_tables(n_kv: int, layout: str, generator: torch.Generator) -> tuple[torch.Tensor, Optional[torch.Tensor], int]:
    """Token table, block table (None for shuffled_p1) and pool size for a layout (CPU tensors).

    The pool holds ``ceil(n_kv / 64) * 64`` slots, so shuffling moves tokens across the same
    amount of memory that a contiguous cache would occupy.
    """
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}; got {layout!r}")
    n_blocks = -(-n_kv // BLOCK_TOKENS)
    pool = n_blocks * BLOCK_TOKENS
    if layout == "contiguous":
        blocks = torch.arange(n_blocks, dtype=torch.int32)
    elif layout == "shuffled_b64":
        blocks = torch.randperm(n_blocks, generator=generator).to(torch.int32)
    else:
        tokens = torch.randperm(pool, generator=generator)[:n_kv].to(torch.int64)
        return tokens, None, pool
    tokens = (blocks.to(torch.int64)[:, None] * BLOCK_TOKENS + torch.arange(BLOCK_TOKENS)).reshape(-1)[:n_kv]
    return tokens.contiguous(), blocks.contiguous(), pool


def make_inputs(shape: VerifyShape, device: str | torch.device = "cpu", seed: int = 0,
                sm_scale: float = DEEPSEEK_SM_SCALE, chain: bool = False) -> VerifyInputs:
    """Fresh random inputs for ``shape``: N(0, 1) bf16 queries and cache, seeded layout and tree
    (a chain, i.e. the causal mask, when ``chain``: what kernels without tree masks can verify)."""
    gen = torch.Generator().manual_seed(seed)
    token_table, block_table, pool = make_tables(shape.n_kv, shape.layout, gen)
    mask = tree_mask(shape.draft_tokens, gen, chain=chain)
    dev_gen = torch.Generator(device=device).manual_seed(seed + 1)
    q = torch.randn(shape.draft_tokens, shape.heads, D_QK, generator=dev_gen, device=device).to(torch.bfloat16)
    cache = torch.randn(pool, D_QK, generator=dev_gen, device=device).to(torch.bfloat16)
    return VerifyInputs(
        q=q, cache=cache, token_table=token_table.to(device),
        block_table=None if block_table is None else block_table.to(device),
        mask=mask.to(device), n_prefix=shape.context_tokens, sm_scale=sm_scale,
    )


FP8_E4M3_MAX: float = 448.0  #: largest finite float8_e4m3fn value
FP16_MAX: float = 65504.0  #: largest finite float16 value
#: the largest cache scale whose e4m3 range (448 x scale) fits fp16's, the dtype the fp8 kernels convert tiles to
MAX_KV_SCALE: float = FP16_MAX / FP8_E4M3_MAX


def fp8_scale(cache: torch.Tensor) -> float:
    """Per-tensor scale mapping the cache's largest magnitude onto the fp8 e4m3 range (as SGLang's kv scales do)."""
    amax = float(cache.float().abs().max()) if cache.numel() else 0.0
    return amax / FP8_E4M3_MAX if amax > 0 else 1.0


def with_fp8_cache(inputs: VerifyInputs, scale: Optional[float] = None) -> VerifyInputs:
    """The same inputs plus ``cache_fp8`` = round(cache / scale) in float8_e4m3fn and ``kv_scale`` = scale."""
    scale = fp8_scale(inputs.cache) if scale is None else float(scale)
    fp8 = (inputs.cache.float() / scale).clamp(-FP8_E4M3_MAX, FP8_E4M3_MAX).to(torch.float8_e4m3fn)
    return VerifyInputs(q=inputs.q, cache=inputs.cache, token_table=inputs.token_table, block_table=inputs.block_table,
                        mask=inputs.mask, n_prefix=inputs.n_prefix, sm_scale=inputs.sm_scale, cache_fp8=fp8,
                        kv_scale=scale)


def dequantized(inputs: VerifyInputs) -> VerifyInputs:
    """The inputs with ``cache`` replaced by the fp8 cache dequantized to fp32 (what an exact fp8 kernel computes)."""
    if inputs.cache_fp8 is None:
        raise ValueError("dequantized needs inputs.cache_fp8: make the inputs with with_fp8_cache")
    return VerifyInputs(q=inputs.q, cache=inputs.cache_fp8.float() * inputs.kv_scale, token_table=inputs.token_table,
                        block_table=inputs.block_table, mask=inputs.mask, n_prefix=inputs.n_prefix,
                        sm_scale=inputs.sm_scale)


def ragged_args(inputs: VerifyInputs, out: torch.Tensor) -> dict:
    """``inputs`` (one request) in SGLang's ragged layout, as the keyword arguments of verify.verify (the kernels'
    entry point) writing ``out`` [T, H, 512]: the prefix's slots as ``kv_indices``, the draft rows copied out of the
    cache as ``k_ext`` (what the Triton kernel reads) and their slots as ``draft_loc`` (SGLang's out_cache_loc, what
    the Gluon kernels read), the tree mask as the flattened custom mask of [T, P + T] with every prefix column set.
    Made once per input set, so a timed call is the kernel's two launches."""
    p, t = inputs.n_prefix, inputs.draft_tokens
    dev = inputs.q.device
    k_ext = inputs.cache[inputs.token_table[p:p + t]].contiguous()
    mask = torch.ones(t, p + t, dtype=torch.uint8, device=dev)
    mask[:, p:] = inputs.mask_u8
    return {"q": inputs.q, "k_ext": k_ext, "draft_loc": inputs.token_table[p:p + t], "kv": inputs.cache, "o": out,
            "qo_indptr": torch.tensor([0, t], dtype=torch.int32, device=dev),
            "kv_indptr": torch.tensor([0, p], dtype=torch.int32, device=dev),
            "kv_indices": inputs.token_table[:p], "mask": mask.reshape(-1),
            "mask_indptr": torch.zeros(1, dtype=torch.int32, device=dev),
            "max_draft": t, "sm_scale": inputs.sm_scale}
