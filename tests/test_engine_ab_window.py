"""09's draft-window finding on synthetic rows: two DFLASH arms verifying alike, one without a window."""

from __future__ import annotations

import pandas as pd

from specdiag.steps.engine_ab import analysis, window

SRV = {"attention_backend": "triton", "speculative_algorithm": "DFLASH", "speculative_dflash_block_size": 8}
META = {"w": {"server": {**SRV, "speculative_draft_window_size": 2048}, "plugin": "splitkv"},
        "nw": {"server": SRV, "plugin": "splitkv"},
        "fi": {"server": {**SRV, "attention_backend": "flashinfer"}},
        "chk": {"server": SRV, "plugin": "splitkv", "env": {"SPECDIAG_SGLANG_CHECK": "1"}}}


def _dec(cells: dict[tuple[str, int], list[float]]) -> pd.DataFrame:
    rows = [{"arm": a, "phase": "decode", "context_tokens": c, "repeat": i, "step_ms": v, "decode_tok_s": 500.0,
             "commit_length": 3.5, "cached_tokens": c, "error": None, "overlapped_by": []}
            for (a, c), vs in cells.items() for i, v in enumerate(vs)]
    return analysis.decode_table(pd.DataFrame(rows))


def test_pairs_are_drafter_variants_of_one_verify_path() -> None:
    assert window.window_pairs(META, ["w", "nw", "fi", "chk"]) == [window.WindowPair("w", "nw", 2048)]
    assert window.window_pairs(META, ["nw", "fi"]) == []  # no windowed twin


def test_the_window_cost_beyond_it_and_a_tie_inside_it() -> None:
    dec = _dec({("w", 1024): [4.7, 4.8, 4.75], ("nw", 1024): [4.72, 4.8, 4.7],
                ("w", 65536): [6.5, 6.55, 6.6], ("nw", 65536): [10.7, 10.9, 10.8]})
    t = window.window_table(dec, window.window_pairs(META, ["w", "nw"]))
    assert list(t["inside_window"]) == [True, False] and t.iloc[0]["verdict"] == "tie"
    f = window.window_finding(t)
    assert f is not None and f.severity == "warning" and "Keep the window on" in f.verdict
    assert f.numbers["context_tokens"] == 65536 and abs(f.numbers["extra_ms"] - (10.8 - 6.55)) < 1e-9
    flat = _dec({("w", 65536): [6.5, 6.55, 6.6], ("nw", 65536): [6.52, 6.6, 6.5]})
    f = window.window_finding(window.window_table(flat, window.window_pairs(META, ["w", "nw"])))
    assert f is not None and "tie inside the requests' noise" in f.verdict and f.severity == "info"
    few = _dec({("w", 65536): [6.5, 6.55], ("nw", 65536): [10.7, 10.9, 10.8]})
    f = window.window_finding(window.window_table(few, window.window_pairs(META, ["w", "nw"])))
    assert f is not None and "not enough requests" in f.verdict
    inside = _dec({("w", 1024): [4.7, 4.8, 4.75], ("nw", 1024): [4.72, 4.8, 4.7]})
    f = window.window_finding(window.window_table(inside, window.window_pairs(META, ["w", "nw"])))
    assert f is not None and "inside the window" in f.verdict
