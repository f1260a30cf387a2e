"""Prefill's floor: the FLOPs and bytes of prefilling a whole prompt, the time they set at the run's peaks, and how
far a measured time to first token is from it. Pure functions of a :class:`~specdiag.geometry.ModelGeometry`, the
prompt's length, the server's chunk size and the run's :class:`~specdiag.hardware.HardwarePeaks`.

FLOPs (one rank, the whole prompt of N tokens; a matrix product of a token with a k x n weight is 2 k n FLOP):

- **projections**, per token and layer: MLA ``q_a`` (hidden x q_lora_rank; none without a q LoRA) and ``q_b``
  (q_lora_rank x h x (qk_nope + qk_rope)), ``kv_a`` (hidden x (kv_lora_rank + qk_rope)), ``kv_b`` (kv_lora_rank x
  h x (qk_nope + v_head)) and ``o`` (h x v_head x hidden); GQA/MHA q, k, v, o. ``h`` is the rank's query heads
  (ceil(heads / TP)); the replicated ``q_a`` and ``kv_a`` are whole on every rank (SGLang's layout, as in
  :mod:`specdiag.geometry`). The absorbed form applies ``kv_b``'s two halves to the query and the output instead of
  to each key: the same count per token.
- **attention** over the causal prompt: each query attends to the tokens up to it (min(i, window) in a sliding
  layer), ``pairs = N (N + 1) / 2`` per full layer whatever the chunking (a chunk attends to the prefix before it and
  causally within itself); ``2 x h x pairs x (d_qk + d_v)``. The **form SGLang's prefill uses** sets d_qk and d_v
  (``sglang/srt/models/deepseek_common/attention_backend_handler.py``): a prompt with no cached prefix runs the MHA
  form (keys and values decompressed by ``kv_b``: d_qk = qk_nope + qk_rope = 192, d_v = v_head = 128, 640 FLOP per
  pair and head), as FlashInfer's chunks also do (``MHA_CHUNKED_KV``); the Triton backend's chunks after the first
  run the absorbed MLA form (d_qk = kv_lora_rank + qk_rope = 576, d_v = kv_lora_rank = 512: 2,176 FLOP per pair and
  head, 3.4x). The floor counts the MHA form (the least a correct prefill does); ``form="absorbed"`` counts the other.
- **MLP**: a dense gated MLP 3 x hidden x intermediate / TP per token; an MoE layer its router (hidden x experts),
  each token's top-k routed experts and the shared experts (3 x hidden x their intermediate / TP).
- **LM head**: hidden x vocab / TP, once (a prefill computes the logits of its last token only).

Bytes (one rank): every weight once per forward pass, i.e. per chunk of ``chunk_tokens`` (SGLang's
``chunked_prefill_size``; all of an MoE's experts a chunk's tokens route to, at most all of them:
:func:`specdiag.geometry.weight_bytes_per_step` with ``routing="max"``); the prompt's KV written once; and the KV of
the chunks before each chunk read by it (the prefix a chunk attends to).

Floor = max(FLOPs / peak matmul rate, bytes / peak bandwidth), as 05 takes a decode step's (roofline: the larger
bound). A measured TTFT over it is "N x its floor"; a TTFT also holds the first decode step and the request's own
overhead, so a short prompt is far from its floor by construction and the verdict reads the longest one.
05 (the sweep's TTFT) and 09 (each arm's) both give that verdict (:func:`prefill_finding`).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, Literal, Mapping, Sequence

from specdiag.findings import Finding
from specdiag.geometry import (
    LAYER_SLIDING,
    ModelGeometry,
    kv_bytes_per_token_per_layer_per_rank,
    local_attention_heads,
    local_kv_heads,
    weight_bytes_per_step,
)
from specdiag.hardware import HardwarePeaks
from specdiag.roofline import BELOW_FLOOR_X, below_floor_cause

AttentionForm = Literal["mha", "absorbed"]


def causal_pairs(n_tokens: int, window: int | None = None) -> int:
    """(query, key) pairs of a causal prompt of ``n_tokens``: N (N + 1) / 2; with a sliding ``window`` each query
    attends to at most ``window`` tokens (itself included)."""
    if n_tokens < 0:
        raise ValueError(f"n_tokens must be >= 0; got {n_tokens}")
    if window is None or n_tokens <= window:
        return n_tokens * (n_tokens + 1) // 2
    return window * (window + 1) // 2 + (n_tokens - window) * window


def attention_dims(geom: ModelGeometry, form: AttentionForm = "mha") -> tuple[int, int]:
    """(d_qk, d_v) of one head's attention in ``form`` (module doc): MLA MHA form (qk_nope + qk_rope, v_head),
    absorbed (kv_lora_rank + qk_rope, kv_lora_rank); GQA/MHA (head_dim, head_dim)."""
    if form not in ("mha", "absorbed"):
        raise ValueError(f"form must be 'mha' or 'absorbed'; got {form!r}")
    if geom.attention != "mla":
        return geom.head_dim, geom.head_dim
    rope, rank = int(geom.qk_rope_head_dim or 0), int(geom.kv_lora_rank or 0)
    if form == "absorbed":
        return rank + rope, rank
    return int(geom.qk_nope_head_dim or 0) + rope, int(geom.v_head_dim or 0)


def projection_params_per_layer(geom: ModelGeometry, tp_size: int = 1) -> int:
    """Matrix parameters of one layer's attention projections one rank multiplies each token by (norms left out)."""
    hid, h = geom.hidden_size, local_attention_heads(geom, tp_size)
    if geom.attention == "mla":
        nope, rope = int(geom.qk_nope_head_dim or 0), int(geom.qk_rope_head_dim or 0)
        rank, v = int(geom.kv_lora_rank or 0), int(geom.v_head_dim or 0)
        q = (hid * geom.q_lora_rank + geom.q_lora_rank * h * (nope + rope)) if geom.q_lora_rank else hid * h * (nope + rope)
        return q + hid * (rank + rope) + rank * h * (nope + v) + h * v * hid
    hd, kv = geom.head_dim, local_kv_heads(geom, tp_size)
    return 2 * hid * h * hd + 2 * hid * kv * hd


def mlp_params_per_token(geom: ModelGeometry, layer: int, tp_size: int = 1) -> float:
    """MLP parameters one token is multiplied by in ``layer`` on one rank: dense 3 x hidden x intermediate / TP; MoE
    router (replicated) + top-k routed experts + shared experts, split over TP."""
    hid = geom.hidden_size
    moe = geom.moe
    if moe is None or layer not in set(moe.moe_layers):
        return 3 * hid * geom.intermediate_size / tp_size
    return (hid * moe.n_routed_experts + moe.num_experts_per_tok * 3 * hid * moe.moe_intermediate_size / tp_size
            + 3 * hid * moe.shared_intermediate_size / tp_size)


@dataclass(frozen=True)
class PrefillFlops:
    """FLOPs one rank does to prefill the whole prompt, by part."""

    projections: float
    attention: float
    mlp: float
    lm_head: float
    form: str  #: the attention form counted: "mha" or "absorbed"

    @property
    def total(self) -> float:
        return self.projections + self.attention + self.mlp + self.lm_head


def prefill_flops(geom: ModelGeometry, prompt_tokens: int, tp_size: int = 1, form: AttentionForm = "mha"
                  ) -> PrefillFlops:
    """FLOPs of prefilling ``prompt_tokens`` on one rank (module doc), per part, summed over the layers."""
    if prompt_tokens < 1:
        raise ValueError(f"prompt_tokens must be >= 1; got {prompt_tokens}")
    n = int(prompt_tokens)
    d_qk, d_v = attention_dims(geom, form)
    h = local_attention_heads(geom, tp_size)
    proj = attn = mlp = 0.0
    for layer in range(geom.num_layers):
        window = geom.sliding_window if geom.layer_types[layer] == LAYER_SLIDING else None
        proj += 2.0 * n * projection_params_per_layer(geom, tp_size)
        attn += 2.0 * h * causal_pairs(n, window) * (d_qk + d_v)
        mlp += 2.0 * n * mlp_params_per_token(geom, layer, tp_size)
    lm_head = 2.0 * geom.hidden_size * geom.vocab_size / tp_size
    return PrefillFlops(proj, attn, mlp, lm_head, form)


def chunk_tokens_of(server: Mapping[str, Any] | None) -> int | None:
    """The chunk size a server prefills in: SGLang's ``chunked_prefill_size`` (server info); None when it is not
    reported or chunking is off (SGLang: -1 or 0), i.e. the whole prompt in one pass."""
    value = (server or {}).get("chunked_prefill_size")
    try:
        v = int(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
    return v if v > 0 else None


@dataclass(frozen=True)
class PrefillFloor:
    """One prompt's prefill floor on one rank, and (when given) the measured TTFT against it."""

    prompt_tokens: int
    chunk_tokens: int | None          # SGLang's chunked_prefill_size; None: one pass
    n_chunks: int                     # ceil(prompt / chunk): forward passes
    flops: float                      # total, MHA form unless ``form`` says otherwise
    flops_attention: float
    form: str                         # the attention form counted ("mha": SGLang's MHA prefill form)
    attention_dims: tuple[int, int]   # (d_qk, d_v) of that form: 2 x heads x pairs x (d_qk + d_v) FLOP per layer
    weight_bytes: float               # weights read once per chunk, x n_chunks
    kv_write_bytes: float             # the prompt's KV, written once
    kv_read_bytes: float              # each chunk reading the KV of the chunks before it
    compute_s: float | None           # flops / peak matmul rate (None: no matmul peak)
    memory_s: float                   # bytes / peak bandwidth
    measured_ttft_s: float | None = None

    @property
    def total_bytes(self) -> float:
        return self.weight_bytes + self.kv_write_bytes + self.kv_read_bytes

    @property
    def floor_s(self) -> float:
        """max(compute, memory)."""
        return max(self.memory_s, self.compute_s or 0.0)

    @property
    def bound(self) -> str:
        return "compute" if (self.compute_s or 0.0) >= self.memory_s else "memory"

    @property
    def ttft_over_floor_x(self) -> float | None:
        return self.measured_ttft_s / self.floor_s if self.measured_ttft_s and self.floor_s > 0 else None

    def as_row(self) -> dict[str, Any]:
        """A table row in display units (s, TFLOP, GB, tokens/s)."""
        t = self.measured_ttft_s
        return {
            "context_tokens": self.prompt_tokens, "chunk_tokens": self.chunk_tokens, "n_chunks": self.n_chunks,
            "tflop": self.flops / 1e12, "attention_share": self.flops_attention / self.flops if self.flops else None,
            "gb": self.total_bytes / 1e9, "compute_floor_s": self.compute_s, "memory_floor_s": self.memory_s,
            "floor_s": self.floor_s, "bound": self.bound, "ttft_s": t,
            "ttft_over_floor_x": self.ttft_over_floor_x,
            "prefill_tok_s": self.prompt_tokens / t if t else None,
            "s_per_chunk": t / self.n_chunks if t else None,
        }

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "floor_s": self.floor_s, "bound": self.bound,
                "ttft_over_floor_x": self.ttft_over_floor_x}


def prefill_floor(geom: ModelGeometry, prompt_tokens: int, peaks: HardwarePeaks, chunk_tokens: int | None = None,
                  tp_size: int = 1, measured_ttft_s: float | None = None, form: AttentionForm = "mha") -> PrefillFloor:
    """The floor of prefilling ``prompt_tokens`` in chunks of ``chunk_tokens`` on one rank at ``peaks`` (module doc),
    with ``measured_ttft_s`` set beside it when given."""
    n = int(prompt_tokens)
    chunk = int(chunk_tokens) if chunk_tokens else None
    n_chunks = math.ceil(n / chunk) if chunk else 1
    fl = prefill_flops(geom, n, tp_size, form)
    per_chunk = min(n, chunk) if chunk else n
    weights = weight_bytes_per_step(geom, tp_size=tp_size, tokens_per_step=per_chunk, routing="max").total * n_chunks
    kv_token = kv_bytes_per_token_per_layer_per_rank(geom, tp_size)
    kv_write = n * kv_token * geom.num_layers
    # chunk i (0-based) attends to the i x chunk tokens before it (sliding layers: at most the window)
    kv_read = 0.0
    if chunk:
        for i in range(n_chunks):
            prefix = i * chunk
            for layer in range(geom.num_layers):
                span = prefix
                if geom.layer_types[layer] == LAYER_SLIDING and geom.sliding_window is not None:
                    span = min(prefix, geom.sliding_window)
                kv_read += span * kv_token
    compute = fl.total / peaks.matmul.value if peaks.matmul else None
    memory = (weights + kv_write + kv_read) / peaks.memory_bandwidth.value
    return PrefillFloor(n, chunk, n_chunks, fl.total, fl.attention, form, attention_dims(geom, form), weights, kv_write, kv_read, compute, memory,
                        float(measured_ttft_s) if measured_ttft_s else None)


def floor_table(geom: ModelGeometry, ttft_by_context: Mapping[int, float | None], peaks: HardwarePeaks,
                chunk_tokens: int | None, tp_size: int = 1) -> list[PrefillFloor]:
    """One :class:`PrefillFloor` per context (ascending), each with its measured TTFT (None: not measured)."""
    return [prefill_floor(geom, int(c), peaks, chunk_tokens, tp_size, ttft_by_context[c])
            for c in sorted(ttft_by_context)]


def verdict_text(f: PrefillFloor) -> str:
    """'N x its floor' for one prompt, or why not."""
    x = f.ttft_over_floor_x
    return f"{x:,.3g} x its floor" if x is not None else "not measured"


def _floor_basis(f: "PrefillFloor") -> str:
    """What a floor assumes, said beside it: the bound, and for a compute bound the attention form counted and the
    matmul peak (another form, e.g. the absorbed MLA form a kernel may run, counts other FLOPs)."""
    if f.bound != "compute" or not f.compute_s:
        return f"{f.bound}-bound"
    return f"compute-bound: the {f.form} form's FLOPs at {f.flops / f.compute_s / 1e12:,.3g} TFLOPS"


def prefill_finding(floors: Sequence[PrefillFloor], source: str, *, finding_id: str = "bandwidth.prefill_floor",
                    label: str = "", threshold_x: float = 10.0, extra: Mapping[str, Any] | None = None,
                    peaks: HardwarePeaks | None = None) -> Finding | None:
    """The prefill verdict at the longest measured prompt: critical at or above ``threshold_x`` x its floor, a
    warning at or above 2x or under :data:`~specdiag.roofline.BELOW_FLOOR_X` (a peak is too
    low: ``peaks`` names which and where it came from), else ok. ``label`` names what was measured (an arm);
    ``extra`` adds numbers (the arm's name). None without a measured TTFT."""
    measured = [f for f in floors if f.ttft_over_floor_x is not None]
    if not measured:
        return None
    f = max(measured, key=lambda x: x.prompt_tokens)
    x = float(f.ttft_over_floor_x or 0.0)
    below = x < BELOW_FLOOR_X
    sev = "critical" if x >= threshold_x else "warning" if x >= 2 or below else "ok"
    who = f"{label}: the" if label else "The"
    chunk = (f"in {f.n_chunks} chunk{'s' if f.n_chunks > 1 else ''} of {f.chunk_tokens:,} tokens (the server's "
             "chunked_prefill_size)"
             if f.chunk_tokens else "in one pass (no chunk size reported)")
    tok_s = f.prompt_tokens / float(f.measured_ttft_s or 1)
    from specdiag.plots import format_tokens  # noqa: PLC0415 - matplotlib's ticker, only when a finding is made

    ctx = format_tokens(f.prompt_tokens)
    title = (f"Prefill beat its floor at {ctx} tokens: a peak is too low" if below else
             f"Prefill is {x:,.3g}x its floor at {ctx} tokens" if sev != "ok" else
             f"Prefill is near its floor at {ctx} tokens")
    return Finding(
        finding_id, title,
        f"{who} first token of a {f.prompt_tokens:,}-token prompt came after {f.measured_ttft_s:,.3g} s, "
        f"{x:,.3g}x the prefill's floor of {f.floor_s:.3g} s ({_floor_basis(f)}), {chunk}: about {tok_s:,.0f} prompt "
        f"tokens/s, {float(f.measured_ttft_s or 0) / f.n_chunks:.3g} s per chunk"
        + (f": {below_floor_cause(f.bound, peaks)}." if below and peaks is not None else "."),
        sev,  # type: ignore[arg-type]
        (f"TTFT {f.measured_ttft_s:,.3g} s ({source})",
         f"floor {f.floor_s:.3g} s = max({f.flops / 1e12:,.4g} TFLOP / peak matmul"
         + (f" = {f.compute_s:.3g} s" if f.compute_s is not None else ": no matmul peak")
         + f", {f.total_bytes / 1e9:,.3g} GB / peak bandwidth = {f.memory_s:.3g} s) (computed: attention in the "
           f"{f.form} form, 2 x heads x N(N+1)/2 x ({f.attention_dims[0]} + {f.attention_dims[1]}) FLOP per layer, "
           "projections and MLP per token, weights once per chunk)",
         f"critical at or above {threshold_x:g}x its floor, a warning at or above 2x"),
        {"context_tokens": f.prompt_tokens, "ttft_s": f.measured_ttft_s, "floor_s": f.floor_s,
         "ttft_over_floor_x": x, "compute_floor_s": f.compute_s, "memory_floor_s": f.memory_s,
         "chunk_tokens": f.chunk_tokens, "n_chunks": f.n_chunks, "prefill_tok_s": tok_s, **dict(extra or {})},
        "computed")


# ---------------------------------------------------------------------------------------------------------------------
# One chunk
# ---------------------------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class ChunkFloor:
    """The floor of one chunk of a chunked prefill on one rank: its tokens attend to the ``prefix_tokens`` before it
    and causally to each other, in ``form``."""

    index: int                        # 0-based: chunk 0 has no prefix
    prefix_tokens: int
    tokens: int
    form: str                         # "mha" or "absorbed"
    flops: float
    flops_attention: float            # the attention's, in ``form`` (MHA with a prefix: the prefix's kv_b decompression too)
    bytes: float                      # weights once, the prefix's KV read, the chunk's KV written
    compute_s: float | None
    memory_s: float

    @property
    def floor_s(self) -> float:
        return max(self.memory_s, self.compute_s or 0.0)


def chunk_floor(geom: ModelGeometry, index: int, prefix_tokens: int, tokens: int, peaks: HardwarePeaks,
                tp_size: int = 1, form: AttentionForm = "mha") -> ChunkFloor:
    """One chunk's floor (:class:`ChunkFloor`): projections and MLP of its ``tokens``; attention over ``prefix_tokens``
    + its own causal pairs, ``2 x heads x pairs x (d_qk + d_v)`` in ``form`` (sliding layers: at most the window); in
    the MHA form with a prefix, SGLang's chunked-prefix path also decompresses the prefix's latent KV through ``kv_b``
    (``2 x prefix x kv_lora_rank x heads x (qk_nope + v_head)`` per MLA layer); every weight read once, the prefix's
    KV read and the chunk's written; at the run's peaks."""
    if tokens < 1 or prefix_tokens < 0:
        raise ValueError(f"a chunk needs tokens >= 1 and prefix_tokens >= 0; got {tokens}, {prefix_tokens}")
    d_qk, d_v = attention_dims(geom, form)
    h = local_attention_heads(geom, tp_size)
    proj = attn = mlp = 0.0
    for layer in range(geom.num_layers):
        window = geom.sliding_window if geom.layer_types[layer] == LAYER_SLIDING else None
        pairs = causal_pairs(prefix_tokens + tokens, window) - causal_pairs(prefix_tokens, window)
        proj += 2.0 * tokens * projection_params_per_layer(geom, tp_size)
        attn += 2.0 * h * pairs * (d_qk + d_v)
        if form == "mha" and prefix_tokens and geom.attention == "mla":
            span = min(prefix_tokens, window) if window else prefix_tokens
            attn += 2.0 * span * int(geom.kv_lora_rank or 0) * h * (int(geom.qk_nope_head_dim or 0)
                                                                    + int(geom.v_head_dim or 0))
        mlp += 2.0 * tokens * mlp_params_per_token(geom, layer, tp_size)
    flops = proj + attn + mlp
    kv_token = kv_bytes_per_token_per_layer_per_rank(geom, tp_size)
    read = sum(min(prefix_tokens, geom.sliding_window) if geom.layer_types[layer] == LAYER_SLIDING
               and geom.sliding_window is not None else prefix_tokens for layer in range(geom.num_layers)) * kv_token
    weights = weight_bytes_per_step(geom, tp_size=tp_size, tokens_per_step=tokens, routing="max").total
    total = weights + read + tokens * kv_token * geom.num_layers
    compute = flops / peaks.matmul.value if peaks.matmul else None
    return ChunkFloor(index, int(prefix_tokens), int(tokens), form, flops, attn, total, compute,
                      total / peaks.memory_bandwidth.value)


def chunk_floors(geom: ModelGeometry, prompt_tokens: int, chunk_tokens: int | None, peaks: HardwarePeaks,
                 forms: Sequence[str], tp_size: int = 1) -> list[ChunkFloor]:
    """Every chunk's floor of a prompt prefilled in chunks of ``chunk_tokens`` (None: one pass), chunk ``i`` in
    ``forms[i]`` (the last form repeats where ``forms`` is shorter)."""
    chunk = int(chunk_tokens) if chunk_tokens else int(prompt_tokens)
    out = []
    for i, start in enumerate(range(0, int(prompt_tokens), chunk)):
        form = forms[min(i, len(forms) - 1)] if forms else "mha"
        out.append(chunk_floor(geom, i, start, min(chunk, int(prompt_tokens) - start), peaks, tp_size,
                               form))  # type: ignore[arg-type]
    return out
