"""DFlash block drafting for the embedded engine: the drafter's forward as SGLang 0.5.17 and vLLM 0.32 run it.

Read in sgl-project/sglang ``python/sglang/srt/models/dflash.py`` (``DFlashDraftModel``, ``kv_proj_only``) and
``srt/speculative/dflash_worker.py`` (``_append_target_hidden_to_draft_kv``, ``_prepare_for_speculative_decoding``),
and vLLM 0.32 ``vllm/model_executor/models/qwen3_dflash.py`` (``_project_context_kv``, ``_resolve_layer_attention``):

- **Context.** For every committed token the target's outputs of the ``target_layer_ids`` layers (SGLang captures
  the input of layer ``id + 1``: the same tensor) are concatenated, projected by ``fc`` and normalized by
  ``hidden_norm``. Each drafter layer turns that straight into its K and V (``k_proj``/``v_proj``, no
  ``input_layernorm``), K through ``k_norm`` then RoPE at the token's position, and caches them. Context is added
  once per token, when it is committed (prefill: the prompt; each verify: the last committed token and the
  accepted drafts), at the start of the next draft, so the draft time includes it as SGLang's does.
- **Block.** ``block_size`` tokens: the last committed token (not yet in the target's cache), then
  ``mask_token_id``, at positions ``prefix, prefix + 1, ...`` (prefix = tokens in the target's cache), embedded by
  the target's embedding. A Qwen3 pre-norm stack: ``input_layernorm``, attention (q/k from the block through
  ``q_norm``/``k_norm`` and RoPE; keys = the cached context then the block), ``post_attention_layernorm``, SiLU MLP,
  residuals, then ``norm``. ``full_attention`` layers see every context key and the whole block in both directions
  (SGLang's ENCODER_ONLY); ``sliding_attention`` layers are causal over ``sliding_window`` positions (DECODER).
- **Drafts.** The block's positions 1..B-1 through the target's LM head, greedy: B - 1 drafts, verified by the
  target as one linear block with the last committed token in front.
- **Draft window** (SGLang's ``--speculative-draft-window-size``: a compact draft cache of recent tokens): the
  context keeps only the last ``window`` tokens, so the drafter's cost stops growing with the context.

Float math throughout (the engine's dtype); RMSNorm in float32 as Qwen3 does.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch
import torch.nn.functional as F

from specdiag.geometry.dflash import DFlashDrafter, check_against_target, parse_dflash_config

FULL, SLIDING = "full_attention", "sliding_attention"


class DFlashLoadError(RuntimeError):
    """A DFlash drafter folder cannot be used with this target; the message names the fix."""


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Qwen3's RMSNorm: ``x / sqrt(mean(x^2) + eps) * weight``, computed in float32."""
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype) * weight


def rope_cos_sin(positions: torch.Tensor, head_dim: int, theta: float, dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
    """Default (unscaled) RoPE tables for ``positions``: inverse frequencies ``theta^(-2i/d)``, NeoX layout (the
    two halves rotated together, transformers' ``rotate_half``)."""
    inv = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64, device=positions.device) / head_dim))
    freqs = positions.to(torch.float64)[:, None] * inv[None, :]
    emb = torch.cat([freqs, freqs], dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate ``x`` [heads, tokens, d] by the tables [tokens, d]."""
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin


def attention_mask(q_pos: torch.Tensor, k_pos: torch.Tensor, layer_type: str, sliding_window: int | None,
                   block_start: int) -> torch.Tensor:
    """Which keys each block query sees (True = attend): a full-attention layer every key (context and the whole
    block, both directions); a sliding layer keys at positions ``q - window < k <= q``."""
    if layer_type == FULL:
        return torch.ones(q_pos.numel(), k_pos.numel(), dtype=torch.bool, device=q_pos.device)
    assert sliding_window is not None
    diff = q_pos[:, None] - k_pos[None, :]
    return (diff >= 0) & (diff < sliding_window)


@dataclass
class DraftCache:
    """One request's drafter context: per layer K and V [kv_heads, tokens, head_dim] of the last tokens kept, and
    the absolute position of the first kept token. Grows by doubling; with a window, old tokens are dropped."""

    n_layers: int
    window: int | None  # keep at most this many context tokens (None: all)
    k: list[torch.Tensor] = field(default_factory=list)
    v: list[torch.Tensor] = field(default_factory=list)
    start_pos: int = 0  # position of the first kept token
    length: int = 0  # kept tokens
    total: int = 0  # context tokens ever added (= the next context position)

    def append(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> None:
        """Add one layer's K/V of the new tokens (call for every layer, then ``advance``)."""
        n = k.shape[1]
        if len(self.k) <= layer:
            cap = max(64, 2 * n)
            self.k.append(k.new_empty(k.shape[0], cap, k.shape[2]))
            self.v.append(v.new_empty(v.shape[0], cap, v.shape[2]))
        need = self.length + n
        if need > self.k[layer].shape[1]:
            cap = max(need, 2 * self.k[layer].shape[1])
            for store in (self.k, self.v):
                old = store[layer]
                new = old.new_empty(old.shape[0], cap, old.shape[2])
                new[:, : self.length] = old[:, : self.length]
                store[layer] = new
        self.k[layer][:, self.length : need] = k
        self.v[layer][:, self.length : need] = v

    def advance(self, n: int) -> None:
        self.length += n
        self.total += n
        if self.window is not None and self.length > 2 * self.window:  # drop what the window no longer sees
            drop = self.length - self.window
            for store in (self.k, self.v):
                for i, t in enumerate(store):
                    t[:, : self.window] = t[:, drop : self.length].clone()
            self.length = self.window
            self.start_pos += drop

    def visible(self, layer: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """K, V and positions of the context keys the block sees (the last ``window`` tokens, or all)."""
        lo = 0 if self.window is None else max(0, self.length - self.window)
        pos = torch.arange(self.start_pos + lo, self.start_pos + self.length, device=self.k[layer].device) \
            if self.k else torch.empty(0, dtype=torch.long)
        if not self.k:
            return torch.empty(0), torch.empty(0), pos
        return self.k[layer][:, lo : self.length], self.v[layer][:, lo : self.length], pos


class DFlashModel:
    """The drafter's weights and its forward (inference only, no autograd state)."""

    def __init__(self, info: DFlashDrafter, config: dict[str, Any], weights: dict[str, torch.Tensor],
                 target_layer_ids: tuple[int, ...], mask_token_id: int, block_size: int) -> None:
        self.info = info
        self.config = config
        self.w = weights
        self.target_layer_ids = target_layer_ids
        self.mask_token_id = mask_token_id
        self.block_size = block_size
        self.n_heads = int(config["num_attention_heads"])
        self.n_kv = int(config.get("num_key_value_heads") or self.n_heads)
        self.head_dim = int(config.get("head_dim") or int(config["hidden_size"]) // self.n_heads)
        self.eps = float(config.get("rms_norm_eps", 1e-6))
        rope = config.get("rope_parameters") or config.get("rope_scaling") or {}
        if rope.get("rope_type", rope.get("type", "default")) not in ("default", None):
            raise DFlashLoadError(f"the drafter's RoPE is {rope.get('rope_type') or rope.get('type')}: the embedded "
                                  "engine runs default RoPE only; remake the drafter without rope scaling")
        self.theta = float(rope.get("rope_theta") or config.get("rope_theta") or 10000.0)

    # ---- context -------------------------------------------------------------------------------------
    def add_context(self, cache: DraftCache, features: torch.Tensor) -> None:
        """Project the target features [n, K x hidden] of the next n context tokens into every layer's K/V."""
        n = features.shape[0]
        if n == 0:
            return
        ctx = rms_norm(F.linear(features, self.w["fc.weight"]), self.w["hidden_norm.weight"], self.eps)
        pos = torch.arange(cache.total, cache.total + n, device=features.device)
        cos, sin = rope_cos_sin(pos, self.head_dim, self.theta, ctx.dtype)
        for i in range(self.info.num_hidden_layers):
            p = f"layers.{i}.self_attn."
            k = F.linear(ctx, self.w[p + "k_proj.weight"]).view(n, self.n_kv, self.head_dim).transpose(0, 1)
            v = F.linear(ctx, self.w[p + "v_proj.weight"]).view(n, self.n_kv, self.head_dim).transpose(0, 1)
            k = apply_rope(rms_norm(k, self.w[p + "k_norm.weight"], self.eps), cos, sin)
            cache.append(i, k, v)
        cache.advance(n)

    # ---- the block ----------------------------------------------------------------------------------
    def block_hidden(self, cache: DraftCache, embeds: torch.Tensor, start: int) -> torch.Tensor:
        """The final hidden states [B, hidden] of a block whose embeddings [B, hidden] sit at ``start`` .. ."""
        b = embeds.shape[0]
        q_pos = torch.arange(start, start + b, device=embeds.device)
        cos, sin = rope_cos_sin(q_pos, self.head_dim, self.theta, embeds.dtype)
        h = embeds
        for i, layer_type in enumerate(self.info.layer_types):
            p = f"layers.{i}."
            x = rms_norm(h, self.w[p + "input_layernorm.weight"], self.eps)
            h = h + self._attention(i, layer_type, x, cache, q_pos, cos, sin, start)
            x = rms_norm(h, self.w[p + "post_attention_layernorm.weight"], self.eps)
            gate, up = F.linear(x, self.w[p + "mlp.gate_proj.weight"]), F.linear(x, self.w[p + "mlp.up_proj.weight"])
            h = h + F.linear(F.silu(gate) * up, self.w[p + "mlp.down_proj.weight"])
        return rms_norm(h, self.w["norm.weight"], self.eps)

    def _attention(self, i: int, layer_type: str, x: torch.Tensor, cache: DraftCache, q_pos: torch.Tensor,
                   cos: torch.Tensor, sin: torch.Tensor, start: int) -> torch.Tensor:
        p = f"layers.{i}.self_attn."
        b = x.shape[0]
        q = F.linear(x, self.w[p + "q_proj.weight"]).view(b, self.n_heads, self.head_dim).transpose(0, 1)
        k = F.linear(x, self.w[p + "k_proj.weight"]).view(b, self.n_kv, self.head_dim).transpose(0, 1)
        v = F.linear(x, self.w[p + "v_proj.weight"]).view(b, self.n_kv, self.head_dim).transpose(0, 1)
        q = apply_rope(rms_norm(q, self.w[p + "q_norm.weight"], self.eps), cos, sin)
        k = apply_rope(rms_norm(k, self.w[p + "k_norm.weight"], self.eps), cos, sin)
        ck, cv, c_pos = cache.visible(i)
        if c_pos.numel():
            k, v = torch.cat([ck, k], dim=1), torch.cat([cv, v], dim=1)
        k_pos = torch.cat([c_pos.to(q_pos.device), q_pos])
        mask = attention_mask(q_pos, k_pos, layer_type, self.info.sliding_window, start)
        rep = self.n_heads // self.n_kv
        out = F.scaled_dot_product_attention(q[None], k.repeat_interleave(rep, 0)[None],
                                             v.repeat_interleave(rep, 0)[None], attn_mask=mask[None, None])
        return F.linear(out[0].transpose(0, 1).reshape(b, self.n_heads * self.head_dim), self.w[p + "o_proj.weight"])

    def propose(self, cache: DraftCache, last_token: int, start: int, embed: Callable[[torch.Tensor], torch.Tensor],
                lm_head: Callable[[torch.Tensor], torch.Tensor], device: torch.device) -> list[int]:
        """B - 1 greedy drafts after ``last_token`` at position ``start``."""
        ids = torch.full((self.block_size,), self.mask_token_id, dtype=torch.long, device=device)
        ids[0] = last_token
        hidden = self.block_hidden(cache, embed(ids), start)
        return torch.argmax(lm_head(hidden[1:]).float(), dim=-1).tolist()


class TargetTap:
    """Forward hooks on the target's decoder layers ``target_layer_ids``: each target forward's outputs of those
    layers (SGLang's aux hidden states), concatenated per token as the drafter's context features."""

    def __init__(self, model: Any, layer_ids: tuple[int, ...]) -> None:
        layers = _decoder_layers(model)
        self.layer_ids = layer_ids
        self._out: dict[int, torch.Tensor] = {}
        self._handles = [layers[i].register_forward_hook(self._hook(i)) for i in layer_ids]

    def _hook(self, i: int) -> Callable[..., None]:
        def hook(module: Any, args: Any, output: Any) -> None:
            out = output[0] if isinstance(output, (tuple, list)) else output
            self._out[i] = out.detach()
        return hook

    def take(self) -> torch.Tensor:
        """Features [tokens, K x hidden] of the last forward (batch 1); clears them."""
        if set(self._out) != set(self.layer_ids):
            raise RuntimeError("the target forward did not run every tapped layer")
        feats = torch.cat([self._out[i][0] for i in self.layer_ids], dim=-1)
        self._out.clear()
        return feats

    def take_batch(self) -> torch.Tensor:
        """Features [batch, tokens, K x hidden] of the last forward (for training); clears them."""
        feats = torch.cat([self._out[i] for i in self.layer_ids], dim=-1)
        self._out.clear()
        return feats

    def remove(self) -> None:
        for h in self._handles:
            h.remove()


def _decoder_layers(model: Any) -> Any:
    for owner in (getattr(model, "model", None), model):
        layers = getattr(owner, "layers", None)
        if layers is not None:
            return layers
    raise DFlashLoadError(f"cannot find the decoder layers of the target ({type(model).__name__}) to tap")


def load_weights(folder: Path, device: torch.device, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """Every tensor of the folder's ``*.safetensors`` by name (a leading ``model.`` dropped), on ``device``."""
    from safetensors.torch import load_file  # noqa: PLC0415

    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise DFlashLoadError(f"the DFlash drafter folder {folder} has no *.safetensors weights")
    out: dict[str, torch.Tensor] = {}
    for f in files:
        for name, t in load_file(str(f)).items():
            out[name.removeprefix("model.")] = t.to(device=device, dtype=dtype)
    return out


def load_dflash(folder: Path, target_config: dict[str, Any], device: torch.device, dtype: torch.dtype,
                block_size: int, mask_token_id: int | None = None) -> DFlashModel:
    """The drafter at ``folder`` for a target with ``target_config``; DFlashLoadError naming the fix."""
    try:
        config = json.loads((folder / "config.json").read_text())
    except (OSError, ValueError) as exc:
        raise DFlashLoadError(f"cannot read {folder}/config.json: {exc}") from None
    try:
        info = parse_dflash_config(config, where=f"{folder}/config.json")
        ids = check_against_target(info, target_config, where=f"the drafter {folder}")
    except ValueError as exc:
        raise DFlashLoadError(str(exc)) from None
    mask = info.mask_token_id if info.mask_token_id is not None else mask_token_id
    if mask is None:
        raise DFlashLoadError(f"{folder}/config.json names no dflash_config.mask_token_id and the target's tokenizer "
                              f"has no {info.mask_token or '<|MASK|>'} token: set mask_token_id (an id below the "
                              "target's vocab_size)")
    weights = load_weights(folder, device, dtype)
    hidden = info.hidden_size
    expected = {"fc.weight": (hidden, len(ids) * hidden), "hidden_norm.weight": (hidden,), "norm.weight": (hidden,)}
    for name, shape in expected.items():
        got = tuple(weights[name].shape) if name in weights else None
        if got != shape:
            raise DFlashLoadError(f"{folder}: {name} has shape {got}, expected {shape} ({len(ids)} target layers x "
                                  f"hidden {hidden}); the weights do not match the config")
    return DFlashModel(info, config, weights, ids, int(mask), block_size)


__all__ = ["DFlashLoadError", "DFlashModel", "DraftCache", "TargetTap", "apply_rope", "attention_mask",
           "load_dflash", "rms_norm", "rope_cos_sin"]
