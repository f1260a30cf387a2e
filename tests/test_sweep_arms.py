"""The arms file parser: every mistake named with its arm, key and fix before any server starts; the shipped arms
files parse and their settings are ones their measurement takes."""

from __future__ import annotations

from pathlib import Path

import pytest
from specdiag.paths import PROJECT_ROOT
from specdiag.sweep.arms import ArmsError, load_arms, parse_arms
from specdiag.sweep.registry import measurement
from specdiag.sweep.settings import SettingsError, parse_settings

ARMS_DIR = PROJECT_ROOT / "params" / "arms"
MEASURE_OF = {"embedded.yaml": "engine_ab", "engine-ab-ngram.yaml": "engine_ab", "engine-ab-dflash.yaml": "engine_ab",
              "embedded-ladder.yaml": "engine_ab", "embedded-kv-layout.yaml": "kv_layout",
              "tiny-notebooks.yaml": "snapshot,commit_probe,baseline_sweep,drafter_timing",
              "mla-notebooks.yaml": "snapshot,gpu_utilization,baseline_sweep",
              "embedded-utilization.yaml": "snapshot,gpu_utilization",
              "kv-layout.yaml": "kv_layout", "moe-batch1.yaml": "moe_batch1",
              "moe-batch1-plugin.yaml": "moe_batch1",
              "plugin-identity.yaml": "plugin_identity", "plugin-identity-dflash.yaml": "plugin_identity",
              "vllm-cpu.yaml": "engine_ab"}


def one(**arm: object) -> dict:
    return {"defaults": {"engine": "sglang", "model": "/m"}, "arms": [{"name": "a", **arm}]}


@pytest.mark.parametrize("data,match", [
    (one(backend="triton"), r"arm 'a' \(arms\[0\]\): unknown key 'backend'; did you mean 'attention_backend'"),
    (one(engine="trt"), "engine 'trt' is not one of sglang, vllm, embedded"),
    (one(plugin="on"), "plugin 'on' is not one of splitkv, upstream, off"),
    (one(kv_alloc="paged"), "kv_alloc 'paged' is not one of"),
    (one(speculation={"algorithm": "DFLASH", "block_size": 8}), "DFLASH needs drafter"),
    (one(speculation={"algorithm": "DFLASH", "drafter": "/d", "block_size": 8, "draft_tokens": 4}), "must be equal"),
    (one(speculation={"algorithm": "DFLASH", "drafter": "/d", "block_size": 8, "window": 4}), "smaller than block"),
    (one(speculation={"algorithm": "NONE", "draft_tokens": 8}), "algorithm NONE takes no draft_tokens"),
    (one(speculation={"algorithm": "NGRAM", "window": 64}), "block_size and window are DFLASH's"),
    (one(speculation={"algorithm": "NGRAM", "draft_tokens": 1}), "draft_tokens must be a whole number >= 2"),
    (one(speculation={"algorithm": "NGRAM", "draft_toks": 8}), "unknown key 'draft_toks'; did you mean 'draft_tokens'"),
    (one(tp=2, ep=8), "ep 8 exceeds tp 2"),
    (one(eplb=True), "eplb must be true or false, and true only with ep above 1"),
    (one(env={"SPECDIAG_SGLANG_CHECK": [1]}), "env SPECDIAG_SGLANG_CHECK must be one value"),
    (one(env={"SPECDIAG_SGLANG_PREFILL_CONFIG": "128:128:8"}),
     "env SPECDIAG_SGLANG_PREFILL_CONFIG: bad prefill configuration '128:128:8': write block_m:block_n:warps:stages"),
    (one(flags="--disable-cuda-graph"), "flags must be a list of words"),
    (one(mem_fraction=2), "mem_fraction must be a fraction"),
    (one(model=""), "model is missing: the sglang engine needs a model folder"),
    ({"arms": [{"name": "a", "engine": "embedded", "plugin": "splitkv"}]}, "the embedded engine takes plugin: off"),
    ({"arms": [{"name": "a", "engine": "embedded", "attention_backend": "triton"}]}, "attention_backend is an SGLang"),
    ({"arms": [{"name": "a", "engine": "embedded", "speculation": {"algorithm": "NGRAM", "simulate_acc_len": 4}}]},
     "simulate_acc_len is SGLang's"),
    ({"arms": [{"name": "a"}]}, "engine is missing"),
    ({"arms": [{"name": "a b", "engine": "embedded"}]}, "name must be a word"),
    ({"arms": [{"name": False, "engine": "embedded"}]}, "how YAML reads a bare on, off, yes or no: quote it"),
    ({"arms": [{"name": "a", "engine": "embedded"}, {"name": "a", "engine": "embedded"}]}, "appears twice"),
    ({"arms": []}, "arms must be a non-empty list"),
    ({"arm": [{"name": "a", "engine": "embedded"}]}, "unknown key 'arm'; did you mean 'arms'"),
    ({"defaults": {"name": "x"}, "arms": [{"name": "a", "engine": "embedded"}]}, "defaults: unknown key 'name'"),
    ({"models": [{"path": "/m", "make": ["data/models/make_mla_model.py", "--out", "/m"]}],
      "arms": [{"name": "a", "engine": "embedded"}]}, "must not give --out"),
    ({"arms": [{"name": "a", "url": "http://gpu:30000", "attention_backend": "triton"}]},
     "url names a running server, which keeps its own settings: drop attention_backend"),
    ({"arms": [{"name": "a", "url": "gpu:30000"}]}, "url 'gpu:30000' is not http"),
    ({"arms": [{"name": "a", "url": "http://gpu:30000", "engine": "trt"}]}, "engine 'trt' is not one of"),
    ({"arms": [{"name": "a", "engine": "sglang", "model": "/m", "stats_dir": "/tmp/s"}]}, "stats_dir is a running"),
])
def test_a_bad_arm_is_named_with_its_key_and_fix(data: dict, match: str) -> None:
    with pytest.raises(ArmsError, match=match):
        parse_arms(data)


def test_defaults_merge_env_and_flags_and_an_arms_speculation_replaces_the_default() -> None:
    arms = parse_arms({"defaults": {"engine": "sglang", "model": "/m", "flags": ["--disable-radix-cache"],
                                    "env": {"A": "1"}, "speculation": {"algorithm": "NGRAM", "draft_tokens": 8}},
                       "arms": [{"name": "x", "flags": ["--log-level", "info"], "env": {"B": 2, "C": True}},
                                {"name": "y", "speculation": {"algorithm": "NONE"}}]}).arms
    assert arms[0].flags == ("--disable-radix-cache", "--log-level", "info")
    assert arms[0].env == {"A": "1", "B": "2", "C": "1"} and arms[0].speculation.draft_tokens == 8
    assert not arms[1].speculation.speculates and arms[1].speculation.draft_tokens is None


def test_a_running_server_is_an_arm_with_a_url_and_no_default_applies_to_it() -> None:
    """A running server is measured as it runs: no server setting of defaults reaches it, and it is configured by its
    URL (what specdiag merge compares); its plugin's stats folder, where given, is where the sweep reads them."""
    from specdiag.sweep.arms import running
    from specdiag.sweep.servers import Host, arm_env, server_command

    arms = parse_arms({"defaults": {"engine": "sglang", "model": "/m", "env": {"A": "1"}},
                       "arms": [{"name": "live", "url": "http://gpu:30000/", "stats_dir": "/tmp/st"},
                                {"name": "started", "attention_backend": "triton"}]}).arms
    live, started = arms
    assert live.running and not started.running and live.url == "http://gpu:30000" and live.engine == ""
    assert live.configured() == {"url": "http://gpu:30000", "engine": None} and live.label == "the server at http://gpu:30000"
    host = Host(work=Path("/w"))
    assert arm_env(live, host) == {} and server_command(live, host) == [] and host.stats_dir(live) == Path("/tmp/st")
    assert host.stats_dir(started) == Path("/w/stats-started") and started.env == {"A": "1"}
    one = running({"embedded": "http://127.0.0.1:30000"}).arms[0]
    assert (one.name, one.url, one.running) == ("embedded", "http://127.0.0.1:30000", True)


def test_a_relative_arms_file_is_read_from_the_project_root_too(monkeypatch: pytest.MonkeyPatch,
                                                              tmp_path: Path) -> None:
    """A notebook runs in notebooks/: params/arms/... is read from the project's root."""
    monkeypatch.chdir(tmp_path)
    assert load_arms("params/arms/embedded.yaml").source == "params/arms/embedded.yaml"


def test_only_picks_arms_in_the_files_order_and_names_a_missing_one() -> None:
    arms = load_arms(ARMS_DIR / "engine-ab-ngram.yaml")
    assert [a.name for a in arms.select(["triton", "flashinfer"]).arms] == ["triton", "flashinfer"]
    with pytest.raises(ArmsError, match="no such arm; its arms: triton, "):
        arms.select(["tritn"])


def test_a_missing_or_broken_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(ArmsError, match="no arms file at"):
        load_arms(tmp_path / "none.yaml")
    (tmp_path / "bad.yaml").write_text("arms: [\n")
    with pytest.raises(ArmsError, match="not valid YAML"):
        load_arms(tmp_path / "bad.yaml")


@pytest.mark.parametrize("name", sorted(MEASURE_OF))
def test_shipped_arms_files_parse_with_their_measurements_settings(name: str) -> None:
    from specdiag.sweep.driver import plan

    arms = load_arms(ARMS_DIR / name)
    plan(arms, MEASURE_OF[name])  # the settings of each measurement, every server's command
    named = {p for a in arms.arms for p in (a.model, a.speculation.drafter) if p}
    shipped = {p for p in named if not Path(p).is_absolute() and (PROJECT_ROOT / p / "config.json").is_file()}
    assert named - shipped <= {r.path for r in arms.models}, "every model an arm names is shipped or has a recipe"


def test_every_arms_file_is_listed_here() -> None:
    assert {p.name for p in ARMS_DIR.glob("*.yaml")} == set(MEASURE_OF)


def test_settings_errors_name_the_key_and_what_the_measurement_takes() -> None:
    cls = measurement("engine_ab").load().SweepSettings
    with pytest.raises(SettingsError, match="'repeat' is not one engine_ab takes; did you mean 'repeats'"):
        parse_settings(cls, {"repeat": 3}, "engine_ab")
    with pytest.raises(SettingsError, match="repeats must be a whole number"):
        parse_settings(cls, {"repeats": "many"}, "engine_ab")
    s = parse_settings(cls, {"contexts": "1024,65536", "arm_contexts": "triton=1024:131072", "slow_step_ms": "150"},
                       "engine_ab")
    assert s.contexts == (1024, 65536) and s.arm_contexts == {"triton": (1024, 131072)} and s.slow_step_ms == 150.0


def test_contexts_in_settings_and_arms_take_1k_and_128k() -> None:
    """Token counts as people write them (k = 1,024 tokens) wherever an arms file or the command line gives a context:
    the settings named for contexts, an arm's context_length, max_total_tokens and DFLASH window."""
    cls = measurement("engine_ab").load().SweepSettings
    s = parse_settings(cls, {"contexts": "1k, 64k,128k", "arm_contexts": {"triton": ["1k", 185000]}}, "engine_ab")
    assert s.contexts == (1024, 65536, 131072) and s.arm_contexts == {"triton": (1024, 185000)}
    with pytest.raises(SettingsError, match=r"engine_ab setting contexts\[1\]: '1.4k' is 1433.6 tokens"):
        parse_settings(cls, {"contexts": "1k,1.4k"}, "engine_ab")
    with pytest.raises(SettingsError, match="repeats must be a whole number"):
        parse_settings(cls, {"repeats": "1k"}, "engine_ab")  # not a context
    arm = parse_arms(one(context_length="128k", max_total_tokens="300k",
                         speculation={"algorithm": "DFLASH", "drafter": "/d", "block_size": 8, "window": "2k"})).arms[0]
    assert (arm.context_length, arm.max_total_tokens, arm.speculation.window) == (131072, 307200, 2048)
    with pytest.raises(ArmsError, match=r"arm 'a' \(arms\[0\]\): context_length: 'lots' is not a token count"):
        parse_arms(one(context_length="lots"))
