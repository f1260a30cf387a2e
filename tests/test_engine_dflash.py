"""DFLASH on the embedded engine: lossless greedy (the output equals target-only greedy), SGLang's step accounting,
the drafter's cached context equal to a from-scratch forward, the draft window bounding the context, and the server's
/server_info and meta_info under SGLang's names."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Iterator

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

import torch.nn.functional as F  # noqa: E402

from specdiag.localserver.dflash import (  # noqa: E402
    DFlashModel,
    DraftCache,
    TargetTap,
    apply_rope,
    load_dflash,
    rms_norm,
    rope_cos_sin,
)
from specdiag.localserver.dflash_drafter import _maker  # noqa: E402
from specdiag.localserver.engine import DecodeRequest, SpecEngine, SpecSettings  # noqa: E402
from specdiag.localserver.kvpool import KVPool  # noqa: E402
from specdiag.localserver.models import LoadedModel, load_model  # noqa: E402
from specdiag.paths import MODELS_DIR  # noqa: E402

CPU = torch.device("cpu")
TARGET = MODELS_DIR / "target"


@pytest.fixture(scope="module")
def target() -> Iterator[LoadedModel]:
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield load_model(TARGET, "target", CPU, torch.float32, "the shipped target")
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def drafter_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A random tiny DFlash drafter for the shipped target, with a sliding layer added (window 16) so both layer
    kinds run: two layers, the first sliding, reading target layers 1 and 2."""
    maker = _maker()
    out = tmp_path_factory.mktemp("dflash2")
    target_cfg = json.loads((TARGET / "config.json").read_text())
    cfg = maker.make_config(target_cfg, layers=2, heads=4, kv_heads=2, head_dim=64, intermediate=256, block_size=8,
                            ids=[1, 2], mask_token_id=4095, sliding_window=16, sliding_layers=1)
    assert cfg["layer_types"] == ["sliding_attention", "full_attention"]
    (out / "config.json").write_text(json.dumps(cfg))
    maker.write_safetensors(maker.make_weights(cfg, seed=1), out / "model.safetensors")
    return out


def dflash(target: LoadedModel, folder: Path, block: int = 8) -> DFlashModel:
    return load_dflash(folder, target.config.to_dict(), CPU, torch.float32, block)


def generate(engine: SpecEngine, ids: list[int], max_new: int = 24) -> tuple[list[int], list]:
    chunks = list(engine.generate(DecodeRequest(input_ids=ids, max_new_tokens=max_new)))
    return [t for c in chunks for t in c.new_ids], chunks


def prompts(seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    phrase = [rng.randrange(1, 4000) for _ in range(7)]
    return [(phrase * 40)[:150], [rng.randrange(1, 4000) for _ in range(90)], (phrase * 3)[:20]]


@pytest.mark.parametrize("window", [None, 32])
@pytest.mark.parametrize("pooled", [False, True])
def test_dflash_is_lossless_and_counts_steps_as_sglang(target: LoadedModel, drafter_dir: Path, pooled: bool,
                                                        window: int | None) -> None:
    model = dflash(target, drafter_dir)
    pool = KVPool.for_model(target.config, 4096, torch.float32, CPU) if pooled else None
    engine = SpecEngine(target, None, SpecSettings(algorithm="DFLASH", num_draft_tokens=8,
                                                   draft_window_size=window, chunked_prefill_size=64),
                        pool=pool, dflash=model)
    plain = SpecEngine(target, None, SpecSettings(algorithm="NONE"))
    for ids in prompts():
        out, chunks = generate(engine, ids)
        assert out == generate(plain, ids)[0]  # lossless: target-only greedy, token for token
        steps = [c.step for c in chunks if c.step is not None]
        assert steps and all(s.proposed_drafts == 7 and 1 <= s.committed <= 8 for s in steps)
        assert 1 + sum(s.committed for s in steps) == len(out)
        # the first step reads the whole prompt as context, later ones the tokens the last step committed
        assert steps[0].drafter_tokens == len(ids) + 8
        assert all(s.drafter_tokens == prev.committed + 8 for prev, s in zip(steps, steps[1:]))
        assert all(s.draft_ms > 0 and s.verify_ms > 0 for s in steps)


def reference_block(model: DFlashModel, feats: torch.Tensor, embeds: torch.Tensor, window: int | None) -> torch.Tensor:
    """The block's hidden states from scratch: every context token's K/V recomputed in one go (no cache)."""
    n, b = feats.shape[0], embeds.shape[0]
    ctx = rms_norm(F.linear(feats, model.w["fc.weight"]), model.w["hidden_norm.weight"], model.eps)
    lo = 0 if window is None else max(0, n - window)
    c_pos, q_pos = torch.arange(lo, n), torch.arange(n, n + b)
    cc, cs = rope_cos_sin(c_pos, model.head_dim, model.theta, torch.float32)
    qc, qs = rope_cos_sin(q_pos, model.head_dim, model.theta, torch.float32)
    h = embeds
    for i, kind in enumerate(model.info.layer_types):
        p = f"layers.{i}."
        a = p + "self_attn."
        x = rms_norm(h, model.w[p + "input_layernorm.weight"], model.eps)

        def heads(t: torch.Tensor, n_heads: int) -> torch.Tensor:
            return t.view(t.shape[0], n_heads, model.head_dim).transpose(0, 1)

        q = apply_rope(rms_norm(heads(F.linear(x, model.w[a + "q_proj.weight"]), model.n_heads),
                                model.w[a + "q_norm.weight"], model.eps), qc, qs)
        k_ctx = apply_rope(rms_norm(heads(F.linear(ctx[lo:], model.w[a + "k_proj.weight"]), model.n_kv),
                                    model.w[a + "k_norm.weight"], model.eps), cc, cs)
        k_blk = apply_rope(rms_norm(heads(F.linear(x, model.w[a + "k_proj.weight"]), model.n_kv),
                                    model.w[a + "k_norm.weight"], model.eps), qc, qs)
        v = torch.cat([heads(F.linear(ctx[lo:], model.w[a + "v_proj.weight"]), model.n_kv),
                       heads(F.linear(x, model.w[a + "v_proj.weight"]), model.n_kv)], dim=1)
        k = torch.cat([k_ctx, k_blk], dim=1)
        k_pos = torch.cat([c_pos, q_pos])
        scores = torch.einsum("hqd,hkd->hqk", q, k.repeat_interleave(model.n_heads // model.n_kv, 0))
        scores = scores / model.head_dim ** 0.5
        if kind == "sliding_attention":
            d = q_pos[:, None] - k_pos[None, :]
            scores = scores.masked_fill(~((d >= 0) & (d < model.info.sliding_window)), float("-inf"))
        out = torch.einsum("hqk,hkd->hqd", scores.softmax(-1), v.repeat_interleave(model.n_heads // model.n_kv, 0))
        h = h + F.linear(out.transpose(0, 1).reshape(b, -1), model.w[a + "o_proj.weight"])
        x = rms_norm(h, model.w[p + "post_attention_layernorm.weight"], model.eps)
        h = h + F.linear(F.silu(F.linear(x, model.w[p + "mlp.gate_proj.weight"])) *
                         F.linear(x, model.w[p + "mlp.up_proj.weight"]), model.w[p + "mlp.down_proj.weight"])
    return rms_norm(h, model.w["norm.weight"], model.eps)


@pytest.mark.parametrize("window", [None, 24])
def test_cached_context_in_pieces_equals_the_from_scratch_forward(target: LoadedModel, drafter_dir: Path,
                                                                  window: int | None) -> None:
    model = dflash(target, drafter_dir)
    gen = torch.Generator().manual_seed(0)
    feats = torch.randn(70, 2 * 256, generator=gen)
    embeds = torch.randn(8, 256, generator=gen)
    cache = DraftCache(model.info.num_hidden_layers, window)
    for lo, hi in ((0, 33), (33, 34), (34, 41), (41, 70)):  # a prompt, then steps of 1 and 7 committed tokens
        model.add_context(cache, feats[lo:hi])
    got = model.block_hidden(cache, embeds, 70)
    torch.testing.assert_close(got, reference_block(model, feats, embeds, window), rtol=1e-4, atol=1e-4)
    if window is not None:
        assert cache.length <= 2 * window and cache.total == 70  # old context dropped, positions kept absolute


def test_tap_reads_the_outputs_of_the_target_layers(target: LoadedModel) -> None:
    tap = TargetTap(target.model, (1, 2))
    ids = torch.tensor([[5, 6, 7, 8]])
    try:
        with torch.inference_mode():
            out = target.model(input_ids=ids, output_hidden_states=True)
            feats = tap.take()
    finally:
        tap.remove()
    # transformers' hidden_states[i + 1] is the output of layer i (the input of layer i + 1, SGLang's capture)
    torch.testing.assert_close(feats, torch.cat([out.hidden_states[2][0], out.hidden_states[3][0]], -1))


def test_a_block_size_the_drafter_was_not_started_with_is_refused(target: LoadedModel, drafter_dir: Path) -> None:
    with pytest.raises(ValueError, match="blocks of 8 tokens but speculative_num_draft_tokens is 4"):
        SpecEngine(target, None, SpecSettings(algorithm="DFLASH", num_draft_tokens=4), dflash=dflash(target,
                                                                                                     drafter_dir))
    with pytest.raises(ValueError, match="smaller than the block"):
        SpecSettings(algorithm="DFLASH", num_draft_tokens=8, draft_window_size=4)


def test_server_reports_dflash_under_sglang_names_and_refuses_bad_settings(drafter_dir: Path, tmp_path: Path,
                                                                          capsys: pytest.CaptureFixture) -> None:
    pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient

    from specdiag.localserver.app import build_app
    from specdiag.localserver.config import parse_args
    from specdiag.localserver.runtime import Runtime

    threads = torch.get_num_threads()
    base = ["--model-path", str(TARGET), "--speculative-algorithm", "DFLASH", "--device", "cpu",
            "--context-length", "512", "--speculative-draft-model-path", str(drafter_dir)]
    try:
        cfg = parse_args(base + ["--speculative-draft-window-size", "64"])
        assert cfg.speculative_num_draft_tokens == 8  # the drafter's block_size
        with TestClient(build_app(Runtime(cfg))) as client:
            info = client.get("/server_info").json()
            assert (info["speculative_algorithm"], info["speculative_dflash_block_size"],
                    info["speculative_num_draft_tokens"], info["speculative_draft_window_size"]) == ("DFLASH", 8, 8, 64)
            assert (info["speculative_num_steps"], info["speculative_eagle_topk"]) == (1, 1)
            assert info["speculative_draft_attention_backend"] == "torch_sdpa"
            drafter = info["speculative_draft_model_config"]
            assert drafter["dflash_config"]["target_layer_ids"] == [1, 2] and drafter["block_size"] == 8
            assert drafter["layer_types"] == ["sliding_attention", "full_attention"] and drafter["sliding_window"] == 16
            body = {"input_ids": prompts()[0], "sampling_params": {"max_new_tokens": 16, "temperature": 0}}
            meta = client.post("/generate", json=body).json()["meta_info"]
            assert meta["spec_verify_ct"] == len(meta["spec_step_commit_lengths"]) >= 1
            assert len(meta["spec_correct_drafts_histogram"]) == 8
            assert len(meta["spec_step_draft_ms"]) == len(meta["spec_step_verify_ms"]) == meta["spec_verify_ct"]
    finally:
        torch.set_num_threads(threads)
    for extra, message in ((["--speculative-dflash-block-size", "8", "--speculative-num-draft-tokens", "4"],
                            "disagrees with DRAFT_TOKENS 4"),
                           (["--speculative-draft-window-size", "4"], "smaller than the block"),
                           (["--speculative-draft-model-path", str(MODELS_DIR / "drafter")], "not a DFlash drafter's")):
        with pytest.raises(SystemExit):
            parse_args(base + extra)
        assert message in capsys.readouterr().err


def test_embedded_server_command_and_checks_before_start(drafter_dir: Path) -> None:
    from specdiag.localserver.lifecycle import EmbeddedServer, EmbeddedServerError

    server = EmbeddedServer("DFLASH", None, draft_model_path=drafter_dir, draft_window_size=64)
    cmd = server.command(port=1234)
    assert cmd[cmd.index("--speculative-algorithm") + 1] == "DFLASH"
    assert cmd[cmd.index("--speculative-draft-model-path") + 1] == str(drafter_dir)
    assert cmd[cmd.index("--speculative-draft-window-size") + 1] == "64"
    assert "--speculative-num-draft-tokens" not in cmd  # the block comes from the drafter's config.json
    with pytest.raises(EmbeddedServerError, match="disagrees with DRAFT_TOKENS 4"):
        EmbeddedServer("DFLASH", 4, draft_model_path=drafter_dir, dflash_block_size=8).start()
    with pytest.raises(EmbeddedServerError, match="not a DFlash drafter's"):
        EmbeddedServer("DFLASH", None, draft_model_path=MODELS_DIR / "drafter").start()


def test_the_training_forward_is_the_served_forward(target: LoadedModel) -> None:
    """data/models/train_dflash.py trains all blocks of a sequence in one masked forward; each block's hidden states
    must be what the embedded engine computes for it with the context cached up to its anchor."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("train_dflash", MODELS_DIR / "train_dflash.py")
    train = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(train)
    maker = _maker()
    cfg = maker.make_config(json.loads((TARGET / "config.json").read_text()), 2, 4, 2, 64, 256, 8, [1, 2], 4095,
                            None, 0)
    w = {k: v.float() for k, v in maker.make_weights(cfg, seed=3).items()}
    from specdiag.geometry.dflash import parse_dflash_config

    model = DFlashModel(parse_dflash_config(cfg), cfg, w, (1, 2), 4095, 8)
    gen = torch.Generator().manual_seed(1)
    feats, tokens = torch.randn(40, 512, generator=gen), torch.randint(0, 4000, (40,), generator=gen)
    embed = target.model.get_input_embeddings().weight.detach()
    anchors = torch.tensor([3, 17, 30])
    trained = train.blocks_hidden(w, cfg, feats, tokens, anchors, embed)
    for j, p in enumerate(anchors.tolist()):
        cache = DraftCache(2, None)
        model.add_context(cache, feats[:p])
        ids = torch.full((8,), 4095)
        ids[0] = tokens[p]
        served = model.block_hidden(cache, F.embedding(ids, embed), p)
        torch.testing.assert_close(trained[j], served, rtol=1e-4, atol=1e-4)
