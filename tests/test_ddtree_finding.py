"""07's findings.ddtree (specdiag.steps.findings.ddtree) on synthetic run.json sections and a recorded run."""

from __future__ import annotations

import json

from specdiag.paths import REFERENCE_DIR
from specdiag.steps.findings.ddtree import ddtree_finding


def test_dflash_run_with_causal_and_tree_mask_plugin_calls() -> None:
    meta = {"arms": {"plugin": {"server": {"speculative_algorithm": "DFLASH", "speculative_num_draft_tokens": 8}},
                     "ngram": {"server": {"speculative_algorithm": "NGRAM"}}},
            "plugin_stats": {"plugin (part 1)": [{"served": 100, "served_causal": 100}],
                             "ngram (part 1)": [{"served": 30, "served_causal": 0}]}}
    f = ddtree_finding({}, [meta])
    assert f is not None and f.id == "findings.ddtree" and f.severity == "info"
    assert f.numbers["dflash_block_tokens"] == [8] and f.numbers["plugin_causal_calls"] == 100
    assert f.numbers["plugin_tree_mask_calls"] == {"NGRAM": 30} and f.numbers["ddtree_measured"] is False
    assert "No server of this run ran DDTree" in f.verdict and "30 calls with NGRAM's drafts" in f.verdict
    assert "tree path serves that shape, but no call here carried DDTree's drafts" in f.verdict


def test_embedded_dflash_run_and_no_speculation() -> None:
    f = ddtree_finding({"server": {"speculative_algorithm": "DFLASH", "speculative_num_draft_tokens": 8}})
    assert "no tree-mask verify call of the plugin is in this run" in f.verdict
    assert "tree path serves" not in f.verdict  # nothing measured of the tree path: not claimed
    assert ddtree_finding({"server": {}}) is None


def test_the_published_run_says_its_ddtree_figures_are_published() -> None:
    meta = json.loads((REFERENCE_DIR / "ct200-kimi-k26" / "run.json").read_text())
    f = ddtree_finding({}, [meta])
    assert f.numbers["ddtree_published"] is True and "none of it measured by this suite" in f.verdict


def test_the_recorded_dflash_run_on_the_h200() -> None:
    meta = json.loads((REFERENCE_DIR / "sglang-h200-mla61-dflash" / "run.json").read_text())
    f = ddtree_finding({}, [meta])
    assert f.numbers["algorithms"] == ["DFLASH"] and f.numbers["dflash_block_tokens"] == [8]
    assert f.numbers["plugin_causal_calls"] > 0 and f.numbers["plugin_tree_mask_calls"] == {}
