"""``specdiag sweep --measure plugin_identity``: specdiag.identity.compare_arms on synthetic rows, one prompt on a fake
server (the top-2 read at a difference), and the sweep on the embedded arms (NGRAM against no speculation: greedy
outputs identical), its merge judged again over every part's rows."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from specdiag import cli, identity
from specdiag.paths import PROJECT_ROOT
from specdiag.runs import Run
from specdiag.steps.engine_ab import plugin_identity as pid
from specdiag.sweep.merge import merge_parts

EMBEDDED = str(PROJECT_ROOT / "params" / "arms" / "embedded.yaml")


def r(arm, ids, ctx=64, seed=0, repeat=0, at_diff=None, error=None, tag="short"):
    return {"arm": arm, "set": tag, "context_tokens": ctx, "seed": seed, "repeat": repeat, "output_ids": ids,
            "error": error, "at_diff": at_diff or {}}


def read(j, top2, margin):
    return {"first_diff": j, "top2": top2, "margin": margin, "error": None}


def test_compare_arms_counts_identical_ties_and_differences():
    rows = [  # measured in this order: stock, plugin, check, stock_repeat
        r("stock", [1, 2, 3]), r("stock", [4, 5, 6], ctx=2000, seed=1), r("stock", [7, 8], ctx=16384, tag="long"),
        r("plugin", [1, 2, 3]),
        r("plugin", [4, 9, 6], ctx=2000, seed=1, at_diff={"stock": read(1, [[-5.50, 9], [-5.51, 5]], 0.01)}),
        r("plugin", [7, 3], ctx=16384, tag="long", at_diff={"stock": read(1, [[-5.0, 3], [-6.0, 8]], 1.0)}),
        r("check", [1, 2, 3]), r("check", [4, 5, 6], ctx=2000, seed=1),
        # the control reads stock's own top-2 at the plugin's differences: these win over the plugin's reading
        r("stock_repeat", [1, 2, 3]),
        r("stock_repeat", [4, 5, 6], ctx=2000, seed=1, at_diff={"plugin": read(1, [[-5.50, 5], [-5.52, 9]], 0.02)}),
        r("stock_repeat", [7, 8], ctx=16384, tag="long", at_diff={"plugin": read(1, [[-4.0, 8], [-4.5, 2]], 0.5)}),
    ]
    res = identity.compare_arms(rows, "stock", ["stock_repeat"])
    assert list(res["arms"]) == ["plugin", "check", "stock_repeat"] and res["reference"] == "stock"
    plugin = res["arms"]["plugin"]
    assert (plugin["prompts"], plugin["identical"], plugin["rounding_ties"], plugin["differs"]) == (3, 1, 1, 1)
    assert plugin["differences"] == [
        {"set": "short", "context_tokens": 2000, "seed": 1, "first_diff": 1, "margin": 0.02,
         "margin_from": "stock_repeat", "verdict": identity.TIE},
        {"set": "long", "context_tokens": 16384, "seed": 0, "first_diff": 1, "margin": 0.5,
         "margin_from": "stock_repeat", "verdict": identity.DIFFERS}]   # 0.5 nats and the plugin's 3 not in the top-2
    check = res["arms"]["check"]
    assert (check["prompts"], check["identical"], check["not_measured"]) == (2, 2, 1)
    ctl = res["arms"]["stock_repeat"]
    assert ctl["control"] and ctl["identical"] == ctl["prompts"] == 3 and not plugin["control"]
    lines = identity.describe(res)
    assert lines[0].startswith("identity plugin vs stock: 1/3 prompts identical, 1 rounding ties, 1 differ")
    assert "2,000 at 1, 16,384 at 1" in lines[0] and "1 not measured" in lines[1]


def test_margin_sources_in_order_and_a_difference_no_server_read():
    rows = [r("stock", [1, 2, 3]), r("stock", [5, 6], seed=1),
            r("plugin", [1, 2, 9], at_diff={"stock": read(2, [[-5.5, 9], [-5.51, 3]], 0.01)}),
            r("plugin", [5, 7], seed=1)]
    pairs = identity.pair_rows(rows, "stock", "plugin")
    assert pairs[0]["margin_from"] == "plugin" and pairs[0]["stock_margin_at_diff"] == 0.01   # only the tested read
    assert "margin_from" not in pairs[1] and identity.classify(pairs[1]) == identity.UNKNOWN
    # a reading at another position, or by a server whose output parted earlier, is not this difference's
    rows.append(r("other", [1, 8, 0], at_diff={"stock": read(1, [[-1, 8], [-1.01, 2]], 0.01)}))
    assert identity.pair_rows(rows, "stock", "plugin")[0]["margin_from"] == "plugin"
    res = identity.compare_arms(rows)  # no reference named: the first arm
    assert res["reference"] == "stock" and res["arms"]["plugin"]["unjudged"] == 1
    assert identity.compare_arms(rows, "nope")["error"].startswith("no rows of the reference arm 'nope'")


def test_repeats_are_each_servers_own_control():
    rows = [r("stock", [1, 2]), r("stock", [1, 2], repeat=1), r("stock", [3], seed=1), r("stock", [4], seed=1, repeat=1),
            r("plugin", [1, 2]), r("plugin", [1, 2], repeat=1, error="timeout")]
    res = identity.compare_arms(rows)
    assert res["repeats"] == {"stock": {"prompts": 2, "identical": 1}, "plugin": {"prompts": 1, "identical": 0}}
    assert res["arms"]["plugin"]["prompts"] == 1  # repeat 0 only is compared across arms
    assert any("stock against itself" in x and "1/2" in x for x in identity.describe(res))


def test_prompts_and_the_top2_answer():
    s = pid.SweepSettings(short_prompts=3, short_min=64, short_max=2000, contexts=(16384,))
    assert pid.prompts(s) == [("short", 64, 0), ("short", 1032, 1), ("short", 2000, 2), ("long", 16384, 0)]
    assert len(pid.prompts(pid.SweepSettings())) == 23  # the recorded plugin runs' 20 short and 3 long prompts
    meta = {"output_top_logprobs": [[[-5.6, 11, None], [-5.5, 10, None]]]}
    assert pid.top2_from_meta(meta) == {"error": None, "top2": [[-5.5, 10], [-5.6, 11]],
                                        "margin": pytest.approx(0.1)}
    assert "no top-2" in pid.top2_from_meta({})["error"]


class FakeServer:
    """One id per character (a BOS first); greedy answers ``outputs``; logprob requests answer ``meta``."""

    def __init__(self, outputs, meta=None, error=None):
        self.outputs, self.meta, self.error, self.sent = outputs, meta, error, []

    def tokenize(self, text, add_special_tokens=False):
        return ([1] if add_special_tokens else []) + [ord(c) + 10 for c in text]

    def flush_cache(self):
        return True

    def generate(self, input_ids=None, sampling_params=None, stream=True, extra_body=None, text=None):
        self.sent.append((len(input_ids), sampling_params["max_new_tokens"], bool(extra_body)))
        if extra_body:
            return SimpleNamespace(error=self.error, meta_info=self.meta, t_send_unix_s=0.0)
        return SimpleNamespace(output_ids=list(self.outputs), error=None, t_send_unix_s=0.0, meta_info={})


def test_a_prompt_reads_the_top2_where_an_earlier_arm_parted():
    server = FakeServer([4, 5, 9, 9], meta={"output_top_logprobs": [[[-2.0, 9, None], [-2.01, 6, None]]]})
    earlier = {"stock": r("stock", [4, 5, 6, 7]), "broken": r("broken", [], error="timeout")}
    row = pid.measure_prompt(server, "plugin", ("short", 100, 0), 4, earlier)
    assert row["output_ids"] == [4, 5, 9, 9] and row["error"] is None and row["seconds"] >= 0
    assert row["at_diff"] == {"stock": {"first_diff": 2, "top2": [[-2.0, 9], [-2.01, 6]],
                                        "margin": pytest.approx(0.01), "error": None}}
    assert server.sent == [(100, 4, False), (102, 1, True)]  # the prompt, then the prompt + the 2 common tokens
    no_logprobs = FakeServer([4, 5, 9, 9], error="return_logprob is not supported by the embedded server")
    row = pid.measure_prompt(no_logprobs, "plugin", ("short", 100, 0), 4, earlier)
    assert row["at_diff"]["stock"] == {"first_diff": 2, "error": "return_logprob is not supported by the embedded "
                                                                 "server"}
    assert pid.measure_prompt(server, "plugin", ("short", 100, 0), 4, earlier, repeat=1)["at_diff"] == {}


def sweep(out: Path, *extra: str) -> int:
    return cli.main(["sweep", "--arms", EMBEDDED, "--measure", "plugin_identity", "--out", str(out), "--contexts",
                     "512", "--max-new-tokens", "8", "--set", "short_prompts=3", "--set", "short_max=256",
                     "--device", "cpu", "--budget-s", "200", *extra])


def test_an_embedded_sweep_finds_ngram_and_no_speculation_greedy_identical(tmp_path: Path, capsys) -> None:
    """The embedded engine has no plugin: its two arms (NGRAM with 8 tokens per verify step, speculation off) must
    decode the same ids, each server twice alike (embedded.yaml's repeats: 2)."""
    assert sweep(tmp_path / "a") == 0, capsys.readouterr().out[-2000:]
    run = Run.open(tmp_path / "a")
    rows = run.rows("plugin_identity")
    assert [(x["arm"], x["context_tokens"], x["repeat"]) for x in rows if x["arm"] == "nospec"] == [
        ("nospec", c, k) for c in (64, 160, 256, 512) for k in (0, 1)]
    assert all(x["error"] is None and len(x["output_ids"]) == 8 and x["at_diff"] == {} for x in rows)
    res = run.meta["identity"]
    assert res["reference"] == "ngram" and run.meta["params"]["plugin_identity"]["reference"] == "ngram"
    assert res["arms"]["nospec"]["prompts"] == res["arms"]["nospec"]["identical"] == 4
    assert res["repeats"] == {"ngram": {"prompts": 4, "identical": 4}, "nospec": {"prompts": 4, "identical": 4}}
    assert "identity nospec vs ngram: 4/4 prompts identical" in capsys.readouterr().out
    # a second part of one arm, merged: identity judged again over both parts' rows
    assert sweep(tmp_path / "b", "--only", "nospec", "--set", "short_prompts=1") == 0
    merged = merge_parts(tmp_path / "m", [tmp_path / "a", tmp_path / "b"])
    assert merged.meta["identity"]["arms"]["nospec"]["identical"] == 4
