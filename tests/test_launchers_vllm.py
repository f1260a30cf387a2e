"""The vLLM launcher's pure parts: the drafter copy vLLM accepts, the mapping of the suite's engine options to
vLLM's, the command line and environment (the real server: tests/test_engines_vllm.py, make test-engines)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from specdiag.steps.drafter_inspection.analysis import engine_patch
from specdiag.launchers import engine_names, engine_options
from specdiag.launchers.vllm import VLLMLaunchError, patched_drafter, vllm_command, vllm_env, vllm_launch
from specdiag.paths import MODELS_DIR


def test_patched_drafter_is_full_attention_with_the_same_weights(tmp_path: Path) -> None:
    out = patched_drafter(MODELS_DIR / "drafter", tmp_path)
    original = json.loads((MODELS_DIR / "drafter" / "config.json").read_text())
    config = json.loads((out / "config.json").read_text())
    assert "sliding_attention" in original["layer_types"] and original["sliding_window"]
    assert config["layer_types"] == ["full_attention"] * original["num_hidden_layers"]
    assert config["sliding_window"] is None and config["use_sliding_window"] is False
    assert {k: v for k, v in config.items() if k not in ("layer_types", "sliding_window", "use_sliding_window")} == {
        k: v for k, v in original.items() if k not in ("layer_types", "sliding_window", "use_sliding_window")}
    assert (out / "model.safetensors").read_bytes() == (MODELS_DIR / "drafter" / "model.safetensors").read_bytes()
    patch = engine_patch({"speculative_draft_model_path": str(out)})
    assert patch["original"]["layer_types"] == original["layer_types"]
    assert patch["original"]["sliding_window"] == original["sliding_window"]
    assert patched_drafter(MODELS_DIR / "drafter", tmp_path) == out  # a second call reuses the copy


def test_engine_options_map_to_vllm() -> None:
    assert "vllm" in engine_names() and "dev_mode" in engine_options("vllm")
    launch = vllm_launch(algorithm="STANDALONE", num_draft_tokens=8, context_length=2048)
    assert (launch.method, launch.num_speculative_tokens, launch.max_model_len) == ("draft_model", 7, 2048)
    assert vllm_launch(algorithm="NGRAM", num_draft_tokens=4).speculative_config()["method"] == "ngram"
    assert vllm_launch(algorithm="NONE").speculative_config() is None
    with pytest.raises(VLLMLaunchError, match="ALGORITHM="):
        vllm_launch(algorithm="EAGLE")
    with pytest.raises(VLLMLaunchError, match="no config.json"):
        vllm_launch(model_path="/nonexistent/model")


def test_command_and_environment(tmp_path: Path) -> None:
    launch = vllm_launch(algorithm="STANDALONE", num_draft_tokens=8)
    cmd = vllm_command(launch, 8123, python=Path("/py"), drafter_dir=tmp_path / "d")
    assert cmd[:3] == ["/py", "-m", "vllm.entrypoints.openai.api_server"]
    assert cmd[cmd.index("--model") + 1] == "data/models/target"  # project-relative: the server runs in the root
    assert cmd[cmd.index("--port") + 1] == "8123" and cmd[cmd.index("--host") + 1] == "127.0.0.1"
    spec = json.loads(cmd[cmd.index("--speculative-config") + 1])
    assert spec == {"method": "draft_model", "num_speculative_tokens": 7, "model": str(tmp_path / "d")}
    assert cmd[cmd.index("--per-request-spec-decode-metrics") + 1] == "detailed" and "--enforce-eager" in cmd
    env = vllm_env(launch, base={"PYTHONPATH": "x"})
    assert env["VLLM_SERVER_DEV_MODE"] == "1" and env["VLLM_CPU_KVCACHE_SPACE"] == "1" and "PYTHONPATH" not in env
    assert vllm_env(vllm_launch(dev_mode=False), base={"VLLM_SERVER_DEV_MODE": "1"})["VLLM_SERVER_DEV_MODE"] == "0"


def test_dflash_maps_the_block_to_k_and_passes_the_drafter_unpatched(tmp_path: Path) -> None:
    """vLLM 0.32 queries the bonus token plus k mask tokens (vllm/config/speculative.py
    max_num_new_slots_for_drafting): a block of B tokens is k = B - 1; the drafter goes in as it is."""
    from specdiag.localserver.dflash_drafter import default_dflash_drafter

    drafter = default_dflash_drafter(MODELS_DIR / "target", tmp_path)
    launch = vllm_launch(algorithm="DFLASH", draft_model_path=drafter)  # the block from its config.json: 8
    assert (launch.method, launch.num_speculative_tokens, launch.drafter) == ("dflash", 7, drafter)
    cmd = vllm_command(launch, 8123, python=Path("/py"), drafter_dir=launch.drafter)
    spec = json.loads(cmd[cmd.index("--speculative-config") + 1])
    assert spec == {"method": "dflash", "num_speculative_tokens": 7, "model": str(drafter)}
    assert vllm_launch(algorithm="DFLASH", draft_model_path=drafter, dflash_block_size=4).num_speculative_tokens == 3
    for kwargs, message in (({"dflash_block_size": 8, "num_draft_tokens": 4}, "disagrees with DRAFT_TOKENS 4"),
                            ({"draft_window_size": 1024}, "no draft window"),
                            ({"draft_model_path": MODELS_DIR / "drafter"}, "not a DFlash drafter's")):
        with pytest.raises(VLLMLaunchError, match=message):
            vllm_launch(algorithm="DFLASH", **{"draft_model_path": drafter, **kwargs})
    with pytest.raises(VLLMLaunchError, match="takes no block size"):
        vllm_launch(algorithm="NGRAM", dflash_block_size=8)
