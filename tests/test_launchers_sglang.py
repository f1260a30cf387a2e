"""The SGLang launcher: the command line and environment it builds (SGLang 0.5.17's flag names), the
checks before starting, and the whole path (registry, `serve`, the report's options) against a fake
``sglang`` package whose ``launch_server`` is a stdlib HTTP server."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from specdiag.launchers import engine_names, engine_server, start_engine
from specdiag.process import group_alive, url_answers
from specdiag.launchers.sglang import (
    SGLangLaunch,
    SGLangLaunchError,
    check_sglang,
    sglang_command,
    sglang_env,
    sglang_launch,
)
from specdiag.paths import PROJECT_ROOT

#: Every flag the launcher may emit, as SGLang 0.5.17 spells it (sglang/srt/server_args.py: the
#: ServerArgs field x_y is --x-y; --cuda-graph-max-bs is only a deprecated alias there).
SGLANG_0_5_17_FLAGS = {
    "--model-path", "--host", "--port", "--tp-size", "--speculative-algorithm", "--speculative-draft-model-path",
    "--speculative-num-steps", "--speculative-eagle-topk", "--speculative-num-draft-tokens", "--attention-backend",
    "--page-size", "--context-length", "--mem-fraction-static", "--sampling-backend", "--grammar-backend",
    "--cuda-graph-max-bs-decode", "--enable-metrics",
}


def flags(cmd: list[str]) -> dict[str, str | None]:
    """{flag: value or None} of a command line after ``-m sglang.launch_server``."""
    args = cmd[cmd.index("sglang.launch_server") + 1:]
    out: dict[str, str | None] = {}
    for i, a in enumerate(args):
        if a.startswith("--"):
            nxt = args[i + 1] if i + 1 < len(args) else None
            out[a] = None if nxt is None or nxt.startswith("--") else nxt
    return out


def test_standalone_command_has_the_h200_flags_and_a_linear_drafter_chain():
    launch = SGLangLaunch(model_path="/m/target", draft_model_path="/m/drafter", algorithm="standalone",
                          num_draft_tokens=8, port=30001, python="/opt/py/bin/python3")
    cmd = sglang_command(launch)
    assert cmd[:3] == ["/opt/py/bin/python3", "-m", "sglang.launch_server"]
    f = flags(cmd)
    assert set(f) <= SGLANG_0_5_17_FLAGS
    assert f == {"--model-path": "/m/target", "--host": "127.0.0.1", "--port": "30001", "--tp-size": "1",
                 "--speculative-algorithm": "STANDALONE", "--speculative-draft-model-path": "/m/drafter",
                 # SGLang asserts steps, topk and draft tokens come together; topk 1 verifies steps + 1 tokens
                 "--speculative-num-steps": "7", "--speculative-eagle-topk": "1",
                 "--speculative-num-draft-tokens": "8",
                 "--attention-backend": "triton", "--page-size": "1", "--sampling-backend": "pytorch",
                 "--grammar-backend": "none", "--cuda-graph-max-bs-decode": "1", "--enable-metrics": None}
    assert sglang_env(launch) == {"HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}


def test_ngram_long_context_command_and_env():
    launch = SGLangLaunch(model_path="/m/mla", algorithm="NGRAM", num_draft_tokens=8, context_length=131072,
                          mem_fraction_static=0.5, tp_size=2, attention_backend="flashinfer", page_size=64,
                          enable_metrics=False, extra_args=("--log-level", "debug"), env={"EXTRA": "1"})
    cmd = sglang_command(launch)
    f = flags(cmd)
    assert f["--speculative-algorithm"] == "NGRAM" and f["--speculative-num-draft-tokens"] == "8"
    assert "--speculative-num-steps" not in f and "--speculative-eagle-topk" not in f  # SGLang derives them
    assert "--speculative-draft-model-path" not in f and "--enable-metrics" not in f
    assert (f["--context-length"], f["--mem-fraction-static"], f["--tp-size"]) == ("131072", "0.5", "2")
    assert (f["--attention-backend"], f["--page-size"]) == ("flashinfer", "64")
    assert cmd[-2:] == ["--log-level", "debug"]
    assert sglang_env(launch) == {"HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1",
                                  "SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN": "1", "EXTRA": "1"}


def test_none_has_no_speculative_flags_and_unset_settings_are_left_out():
    cmd = sglang_command(SGLangLaunch(model_path="m", attention_backend=None, page_size=None,
                                      sampling_backend=None, grammar_backend=None, cuda_graph_max_bs=None))
    assert not any(a.startswith("--speculative") for a in cmd)
    assert set(flags(cmd)) == {"--model-path", "--host", "--port", "--tp-size", "--enable-metrics"}


@pytest.mark.parametrize("launch, message", [
    (SGLangLaunch(model_path="m", algorithm="STANDALONE", num_draft_tokens=8), "needs a drafter"),
    (SGLangLaunch(model_path="m", algorithm="NGRAM", draft_model_path="d"), "takes no drafter"),
    (SGLangLaunch(model_path="m", algorithm="NGRAM", num_steps=3), "NGRAM ignores num_steps"),
    (SGLangLaunch(model_path="m", algorithm="NONE", num_draft_tokens=8), "NONE takes no"),
    (SGLangLaunch(model_path="m", draft_model_path="d", algorithm="EAGLE", num_steps=3, num_draft_tokens=8),
     "would be changed by SGLang to 4"),
    (SGLangLaunch(model_path="m", draft_model_path="d", algorithm="EAGLE", topk=4, num_draft_tokens=8),
     "give num_steps too"),
])
def test_settings_sglang_would_refuse_or_silently_change_are_errors(launch, message):
    with pytest.raises(SGLangLaunchError, match=message):
        sglang_command(launch)


def test_eagle_with_explicit_tree_settings_passes_them():
    f = flags(sglang_command(SGLangLaunch(model_path="m", draft_model_path="d", algorithm="EAGLE3", num_steps=5,
                                          topk=4, num_draft_tokens=8)))
    assert (f["--speculative-num-steps"], f["--speculative-eagle-topk"], f["--speculative-num-draft-tokens"]) \
        == ("5", "4", "8")


def test_registry_defaults_follow_the_embedded_server():
    launch = sglang_launch()
    assert Path(launch.model_path) == PROJECT_ROOT / "data" / "models" / "target"
    assert Path(launch.draft_model_path) == PROJECT_ROOT / "data" / "models" / "drafter"
    assert (launch.algorithm, launch.num_draft_tokens) == ("STANDALONE", 8)
    none = sglang_launch(algorithm="none", num_steps=3)  # NONE drops the draft settings it was handed
    assert none.draft_model_path is None and none.num_draft_tokens is None and none.num_steps is None
    with pytest.raises(SGLangLaunchError, match="takes no option bogus"):
        sglang_launch(bogus=1)


def test_registry_knows_both_engines_and_rejects_unknown_ones_and_options():
    assert {"embedded", "sglang"} <= set(engine_names())
    with pytest.raises(ValueError, match="no engine named 'nope'"):
        engine_server("nope")
    with pytest.raises(ValueError, match="engine 'embedded'.*attention_backend.*it takes: algorithm"):
        engine_server("embedded", attention_backend="triton")


# --- checks and the whole path against a fake sglang ----------------------------------------
FAKE_LAUNCH_SERVER = '''
import http.server, os, sys
argv = sys.argv[1:]
port = int(argv[argv.index("--port") + 1])
print("fake sglang argv:", " ".join(argv), flush=True)
print("fake sglang env:", " ".join(f"{k}={os.environ.get(k)}" for k in
      ("HF_HUB_OFFLINE", "PYTHONUNBUFFERED", "SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN")), flush=True)
print(f"fake sglang pid {os.getpid()}", flush=True)
if "--die" in argv:
    print("fake sglang: ValueError: something SGLang refused", flush=True)
    sys.exit(1)
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path == "/health_generate" else 404); self.end_headers()
    def log_message(self, *a): pass
http.server.HTTPServer(("127.0.0.1", port), H).serve_forever()
'''


@pytest.fixture
def fake_sglang(tmp_path: Path) -> dict[str, str]:
    """A site folder with a fake ``sglang`` 0.5.17 (dist-info included); the env that puts it first."""
    site = tmp_path / "site"
    (site / "sglang").mkdir(parents=True)
    (site / "sglang" / "__init__.py").write_text("")
    (site / "sglang" / "launch_server.py").write_text(textwrap.dedent(FAKE_LAUNCH_SERVER))
    dist = site / "sglang-0.5.17.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: sglang\nVersion: 0.5.17\n")
    return {"PYTHONPATH": str(site)}


def test_check_sglang_names_missing_folders_and_a_missing_sglang(tmp_path: Path, fake_sglang):
    with pytest.raises(SGLangLaunchError, match="no model folder at .*nothing"):
        check_sglang(SGLangLaunch(model_path=tmp_path / "nothing"))
    with pytest.raises(SGLangLaunchError, match="no drafter folder"):
        check_sglang(SGLangLaunch(model_path=tmp_path, draft_model_path=tmp_path / "nothing",
                                  algorithm="STANDALONE", num_draft_tokens=4))
    assert check_sglang(SGLangLaunch(model_path=tmp_path, env=fake_sglang)) == "0.5.17"
    empty = tmp_path / "empty"
    empty.mkdir()
    python_without = SGLangLaunch(model_path=tmp_path, python=sys.executable, env={"PYTHONPATH": str(empty)})
    if subprocess.run([sys.executable, "-c", "import sglang"], capture_output=True).returncode == 0:
        pytest.skip("this Python has a real sglang")
    with pytest.raises(SGLangLaunchError, match="sglang is not installed for .*--engine-python"):
        check_sglang(python_without)
    with pytest.raises(SGLangLaunchError, match="cannot run the Python"):
        check_sglang(SGLangLaunch(model_path=tmp_path, python=str(tmp_path / "no-python")))


def test_start_engine_sglang_runs_the_command_with_its_env_and_ends_it(tmp_path: Path, fake_sglang):
    log = tmp_path / "sglang.log"
    with start_engine("sglang", model_path=tmp_path, algorithm="NGRAM", num_draft_tokens=4,
                      context_length=2048, env=fake_sglang, log_path=log, progress=False) as url:
        assert url_answers(url + "/health_generate")
        text = log.read_text()
        pid = int(re.search(r"fake sglang pid (\d+)", text).group(1))
        assert group_alive(pid)
    assert not group_alive(pid)
    assert f"--model-path {tmp_path} " in text and "--speculative-algorithm NGRAM" in text
    assert "--speculative-num-draft-tokens 4" in text and "--context-length 2048" in text
    assert "HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1" in text


def test_a_failing_sglang_start_shows_its_log(tmp_path: Path, fake_sglang):
    server = engine_server("sglang", model_path=tmp_path, algorithm="NONE", env=fake_sglang, extra_args=("--die",),
                           log_path=tmp_path / "s.log", progress=False)
    with pytest.raises(Exception, match=r"SGLang \(NONE\) exited with code 1(.|\n)*something SGLang refused"):
        server.start()


def test_serve_runs_until_interrupted_then_ends_the_tree(tmp_path: Path, fake_sglang):
    log = tmp_path / "serve.log"
    env = {**os.environ, **fake_sglang}
    env["PYTHONPATH"] = os.pathsep.join([str(PROJECT_ROOT / "lib"), fake_sglang["PYTHONPATH"]])
    proc = subprocess.Popen([sys.executable, "-m", "specdiag.launchers", "serve", "--engine", "sglang",
                             "--model", str(tmp_path), "--algorithm", "NONE", "--port", "0", "--log", str(log)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    try:
        line = ""
        deadline = time.monotonic() + 60
        while "ready at" not in line and time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line and proc.poll() is not None:
                break
        assert "ready at http://127.0.0.1:" in line, line
        url = re.search(r"ready at (\S+)", line).group(1)
        pid = int(re.search(r"fake sglang pid (\d+)", log.read_text()).group(1))
        assert url_answers(url + "/health_generate") and group_alive(pid)
        time.sleep(0.5)
        assert proc.poll() is None  # still in the foreground
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
    assert not group_alive(pid) and not url_answers(url + "/health_generate", timeout_s=0.5)


def test_report_passes_engine_options_and_fails_before_making_a_run_folder(tmp_path: Path, capsys):
    from specdiag.launchers.cli import engine_options_from_args
    from specdiag.report import build_parser, main

    args = build_parser().parse_args(["run", "--engine", "sglang", "--model", "/m", "--algorithm", "ngram",
                                      "--num-draft-tokens", "8", "--attention-backend", "triton", "--page-size",
                                      "1", "--context-length", "131072", "--port", "30005",
                                      "--engine-arg=--log-level=debug"])
    assert args.engine == "sglang"
    assert engine_options_from_args(args) == {
        "model_path": "/m", "algorithm": "NGRAM", "num_draft_tokens": 8, "attention_backend": "triton",
        "page_size": 1, "context_length": 131072, "port": 30005, "extra_args": ("--log-level=debug",)}
    assert engine_options_from_args(build_parser().parse_args(["run"])) == {}
    run_dir = tmp_path / "run"
    code = main(["run", "--engine", "sglang", "--model", str(tmp_path / "missing"), "--run-dir", str(run_dir)])
    assert code == 2 and not run_dir.exists()
    assert "no model folder at" in capsys.readouterr().err


def test_report_starts_the_engine_records_its_command_and_stops_it(tmp_path: Path, fake_sglang):
    from specdiag.report import server_for_report
    from specdiag.runs import Run

    run = Run.create(tmp_path / "run")
    options = {"model_path": str(tmp_path), "algorithm": "NGRAM", "env": fake_sglang, "progress": False}
    with server_for_report("", run, "sglang", options) as url:
        assert url_answers(url + "/health_generate")
    assert not url_answers(url + "/health_generate", timeout_s=0.5)
    engine = Run.open(run.path).meta["engine"]
    assert engine["engine"] == "sglang" and engine["url"] == url and engine["version"] == "0.5.17"
    assert engine["python"] == sys.executable and engine["ready_after_s"] > 0
    assert engine["command"][1:3] == ["-m", "sglang.launch_server"] and "NGRAM" in engine["command"]
    assert engine["options"] == {"model_path": str(tmp_path), "algorithm": "NGRAM", "progress": False}
    assert "fake sglang argv" in (run.path / "server.log").read_text()


def test_make_serve_passes_every_variable_to_the_launcher():
    """`make -n serve ...`: the Makefile's variables reach `python -m specdiag.launchers serve` intact."""
    import shlex

    from specdiag.launchers.__main__ import build_parser
    from specdiag.launchers.cli import engine_options_from_args

    out = subprocess.run(
        ["make", "-n", "-s", "serve", "PY=python3", "ENGINE=sglang", "MODEL=/m/t", "DRAFT_MODEL=/m/d",
         "ALGORITHM=STANDALONE", "DRAFT_TOKENS=4", "ATTENTION_BACKEND=flashinfer", "PAGE_SIZE=64",
         "CONTEXT_LENGTH=1024", "MEM_FRACTION_STATIC=0.5", "TP_SIZE=2", "PORT=1234", "SGLANG_PYTHON=/opt/py",
         "ENGINE_ARGS=--log-level=debug --x=1"],
        cwd=PROJECT_ROOT, capture_output=True, text=True, check=True).stdout
    line = next(ln for ln in out.splitlines() if "specdiag.launchers serve" in ln)
    argv = shlex.split(line)
    args = build_parser().parse_args(argv[argv.index("specdiag.launchers") + 1:])
    assert args.engine == "sglang"
    assert engine_options_from_args(args) == {
        "model_path": "/m/t", "draft_model_path": "/m/d", "algorithm": "STANDALONE", "num_draft_tokens": 4,
        "attention_backend": "flashinfer", "page_size": 64, "context_length": 1024, "mem_fraction_static": 0.5,
        "tp_size": 2, "port": 1234, "python": "/opt/py", "extra_args": ("--log-level=debug", "--x=1")}


def test_plugin_env_says_off_and_orders_the_path(tmp_path: Path) -> None:
    from specdiag.launchers.sglang import plugin_env
    from specdiag.paths import PROJECT_ROOT

    on = plugin_env("splitkv", site="/site", plugin_path="/plugin", stats_dir=tmp_path / "stats")
    assert on["PYTHONPATH"].split(os.pathsep) == ["/site", "/plugin", str(PROJECT_ROOT / "lib")]
    assert on["SGLANG_PLUGINS"] == "specdiag_splitkv" and on["SPECDIAG_SGLANG_STATS"] == str(tmp_path / "stats")
    # SGLang 0.5.17 loads installed plugins by default: off is said, and the plugin leaves the path unless kept on it
    off = plugin_env("off", site="/site", plugin_path="/plugin")
    assert off["SPECDIAG_SGLANG_VERIFY"] == "off" and "SGLANG_PLUGINS" not in off and "/plugin" not in off["PYTHONPATH"]
    assert "/plugin" in plugin_env("off", plugin_path="/plugin", plugin_on_path=True)["PYTHONPATH"]
    with pytest.raises(ValueError, match="splitkv, upstream, off"):
        plugin_env("fast")
    # the KV slot allocator is always said; the contiguous one keeps the plugin on the path with the kernel off
    assert on["SPECDIAG_SGLANG_KV_ALLOC"] == "sglang"
    tier0 = plugin_env("off", site="/site", plugin_path="/plugin", kv_alloc="contiguous")
    assert tier0["SPECDIAG_SGLANG_KV_ALLOC"] == "contiguous" and "/plugin" in tier0["PYTHONPATH"]
    with pytest.raises(ValueError, match="sglang, contiguous"):
        plugin_env("off", kv_alloc="buddy")


# ---- DFLASH (SGLang 0.5.17: srt/arg_groups/speculative_hook.py _handle_dflash) ----------------------------------
DFLASH_FLAGS = {"--speculative-dflash-block-size", "--speculative-draft-window-size",
                "--speculative-draft-attention-backend", "--max-total-tokens"}


@pytest.fixture(scope="module")
def dflash_pair(tmp_path_factory) -> tuple[Path, Path]:
    """The shipped tiny target and a random tiny DFlash drafter made for it (block 8, target layer 1)."""
    from specdiag.localserver.dflash_drafter import default_dflash_drafter

    target = PROJECT_ROOT / "data" / "models" / "target"
    return target, default_dflash_drafter(target, tmp_path_factory.mktemp("dflash"))


def test_dflash_command_has_block_window_backend_and_pool_cap():
    launch = SGLangLaunch(model_path="/m/mla61", draft_model_path="/m/dflash", algorithm="dflash", dflash_block_size=8,
                          draft_window_size=2048, draft_attention_backend="flashinfer", max_total_tokens=200000)
    f = flags(sglang_command(launch))
    assert set(f) <= SGLANG_0_5_17_FLAGS | DFLASH_FLAGS
    assert (f["--speculative-algorithm"], f["--speculative-draft-model-path"]) == ("DFLASH", "/m/dflash")
    assert (f["--speculative-dflash-block-size"], f["--speculative-draft-window-size"]) == ("8", "2048")
    assert f["--speculative-draft-attention-backend"] == "flashinfer" and f["--max-total-tokens"] == "200000"
    # SGLang forces one step and topk 1 for DFLASH: the launcher leaves them (and unset draft tokens) out
    assert not {"--speculative-num-steps", "--speculative-eagle-topk", "--speculative-num-draft-tokens"} & set(f)
    both = flags(sglang_command(SGLangLaunch(model_path="m", draft_model_path="d", algorithm="DFLASH",
                                             dflash_block_size=16, num_draft_tokens=16)))
    assert both["--speculative-dflash-block-size"] == both["--speculative-num-draft-tokens"] == "16"


@pytest.mark.parametrize("launch, message", [
    (SGLangLaunch(model_path="m", algorithm="DFLASH", dflash_block_size=8), "DFLASH needs a DFlash drafter"),
    (SGLangLaunch(model_path="m", draft_model_path="d", algorithm="DFLASH", dflash_block_size=8, num_draft_tokens=4),
     "block size 8 disagrees with DRAFT_TOKENS 4"),
    (SGLangLaunch(model_path="m", draft_model_path="d", algorithm="DFLASH", dflash_block_size=8, draft_window_size=4),
     "smaller than the block"),
    (SGLangLaunch(model_path="m", draft_model_path="d", algorithm="DFLASH", num_steps=3), "leave num_steps and topk"),
    (SGLangLaunch(model_path="m", algorithm="NGRAM", dflash_block_size=8), "takes no block size or draft window"),
])
def test_dflash_settings_sglang_would_refuse_are_errors(launch, message):
    with pytest.raises(SGLangLaunchError, match=message):
        sglang_command(launch)


def test_dflash_drafter_is_checked_against_the_target_before_start(tmp_path: Path, dflash_pair):
    import json

    from specdiag.launchers.sglang import check_dflash_drafter

    target, drafter = dflash_pair
    check_dflash_drafter(SGLangLaunch(model_path=target, draft_model_path=drafter, algorithm="DFLASH"))
    with pytest.raises(SGLangLaunchError, match="block size 8 disagrees with DRAFT_TOKENS 4"):
        check_dflash_drafter(SGLangLaunch(model_path=target, draft_model_path=drafter, algorithm="DFLASH",
                                          num_draft_tokens=4, dflash_block_size=8))
    with pytest.raises(SGLangLaunchError, match="draft window 4 is smaller than the block \\(8 tokens\\)"):
        check_dflash_drafter(SGLangLaunch(model_path=target, draft_model_path=drafter, algorithm="DFLASH",
                                          draft_window_size=4))  # the block from the drafter's config.json

    def variant(name: str, **changes: object) -> Path:
        out = tmp_path / name
        out.mkdir()
        cfg = json.loads((drafter / "config.json").read_text())
        for key, value in changes.items():
            if key == "target_layer_ids":
                cfg["dflash_config"]["target_layer_ids"] = value
            else:
                cfg[key] = value
        (out / "config.json").write_text(json.dumps(cfg))
        return out

    for folder, message in ((variant("wide", hidden_size=512), "hidden_size 512 differs from the target's 256"),
                            (variant("deep", target_layer_ids=[1, 3]), "include \\[3\\]: each must be 0..2"),
                            (variant("twice", target_layer_ids=[0, 0]), "\\[0, 0\\] repeat a layer"),
                            (tmp_path.parent, "no config.json"),
                            (target, "not a DFlash drafter's")):
        with pytest.raises(SGLangLaunchError, match=message):
            check_dflash_drafter(SGLangLaunch(model_path=target, draft_model_path=folder, algorithm="DFLASH"))
    # the registry's path runs the same check before a port is taken
    with pytest.raises(SGLangLaunchError, match="differs from the target's"):
        engine_server("sglang", model_path=target, draft_model_path=tmp_path / "wide", algorithm="DFLASH",
                      check=False)


def test_dflash_registry_has_no_default_drafter_or_draft_tokens():
    with pytest.raises(SGLangLaunchError, match="DFLASH needs a DFlash drafter"):
        sglang_command(sglang_launch(algorithm="DFLASH"))
    launch = sglang_launch(algorithm="DFLASH", draft_model_path="/m/d")
    assert launch.num_draft_tokens is None and launch.dflash_block_size is None  # the drafter's block_size


def test_make_serve_passes_the_dflash_variables():
    import shlex

    from specdiag.launchers.__main__ import build_parser
    from specdiag.launchers.cli import engine_options_from_args

    out = subprocess.run(
        ["make", "-n", "-s", "serve", "PY=python3", "ENGINE=sglang", "MODEL=/m/t", "DRAFT_MODEL=/m/d",
         "ALGORITHM=DFLASH", "BLOCK_SIZE=16", "DRAFT_WINDOW=2048", "DRAFT_ATTENTION_BACKEND=triton",
         "MAX_TOTAL_TOKENS=300000"],
        cwd=PROJECT_ROOT, capture_output=True, text=True, check=True).stdout
    line = next(ln for ln in out.splitlines() if "specdiag.launchers serve" in ln)
    argv = shlex.split(line)
    args = build_parser().parse_args(argv[argv.index("specdiag.launchers") + 1:])
    assert engine_options_from_args(args) == {
        "model_path": "/m/t", "draft_model_path": "/m/d", "algorithm": "DFLASH", "dflash_block_size": 16,
        "draft_window_size": 2048, "draft_attention_backend": "triton", "max_total_tokens": 300000, "port": 30000}


def test_the_plugin_picks_one_configuration_fast_at_prefill_and_verify(monkeypatch, tmp_path):
    """PLUGIN=splitkv with no attention backend named: FlashInfer prefill + Triton decode/verify where FlashInfer is
    importable (a DFLASH drafter kept on Triton), else pure Triton with the plugin's MHA prefill."""
    from specdiag.launchers import sglang as sg

    hybrid = sg.plugin_serving("DFLASH", flashinfer=True)
    assert hybrid.attention_backend == "flashinfer" and hybrid.draft_attention_backend == "triton"
    assert hybrid.extra_args == ("--decode-attention-backend", "triton", "--speculative-attention-mode", "decode")
    assert sg.plugin_serving("NGRAM", flashinfer=True).draft_attention_backend is None
    assert sg.plugin_serving("DFLASH", flashinfer=True, draft_attention_backend="fa3").draft_attention_backend == "fa3"
    pure = sg.plugin_serving("NGRAM", flashinfer=False)
    assert pure.attention_backend == "triton" and pure.extra_args == () and pure.env == {"SPECDIAG_SGLANG_PREFILL": "mha"}
    launch = sg.sglang_launch(algorithm="NGRAM", model_path=tmp_path, extra_args=("--log-level", "debug"))
    configured, why = sg.with_plugin_serving(launch, flashinfer=True)
    cmd = sg.sglang_command(replace_port(configured))
    assert cmd[cmd.index("--attention-backend") + 1] == "flashinfer" and "FlashInfer is importable" in why
    assert cmd[-6:] == ["--decode-attention-backend", "triton", "--speculative-attention-mode", "decode",
                        "--log-level", "debug"]  # the user's own flags last: they win
    configured, why = sg.with_plugin_serving(launch, flashinfer=False)
    assert configured.attention_backend == "triton" and sg.sglang_env(configured)["SPECDIAG_SGLANG_PREFILL"] == "mha"
    # the registry's engine applies it only when the plugin's verify is asked for and no backend was named
    monkeypatch.setattr(sg, "has_flashinfer", lambda launch: True)
    monkeypatch.setattr(sg, "sglang_server", lambda launch, **kw: launch)
    monkeypatch.setenv("SPECDIAG_SGLANG_VERIFY", "splitkv")
    assert sg.sglang_engine(algorithm="NGRAM", model_path=tmp_path).attention_backend == "flashinfer"
    assert sg.sglang_engine(algorithm="NGRAM", model_path=tmp_path, attention_backend="triton").attention_backend == "triton"
    monkeypatch.setenv("SPECDIAG_SGLANG_VERIFY", "off")
    assert sg.sglang_engine(algorithm="NGRAM", model_path=tmp_path).attention_backend == "triton"


def replace_port(launch):
    import dataclasses

    return dataclasses.replace(launch, port=30000)
