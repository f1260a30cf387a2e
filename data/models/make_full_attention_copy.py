"""Write a copy of a drafter folder whose config.json declares every layer full attention (the same weights).

03's window check sends the same greedy prompts to a server with the drafter as shipped and to one with this copy:
drafting alike beyond the drafter's sliding window means the first server ran its sliding layers as full attention.

    python data/models/make_full_attention_copy.py --drafter data/models/drafter --out /tmp/drafter-fullattn
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path


def full_attention_config(cfg: dict) -> dict:
    """``cfg`` with every layer full attention: ``layer_types`` all ``full_attention``, no sliding window."""
    n = int(cfg.get("num_hidden_layers") or len(cfg.get("layer_types") or []))
    return {**cfg, "layer_types": ["full_attention"] * n, "sliding_window": None, "use_sliding_window": False,
            "max_window_layers": n}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--drafter", default="data/models/drafter", help="the drafter folder to copy")
    ap.add_argument("--out", required=True, help="the copy's folder (created)")
    args = ap.parse_args(argv)
    src, dst = Path(args.drafter), Path(args.out)
    if not (src / "config.json").is_file():
        ap.error(f"{src} holds no config.json: give a drafter folder (data/models/drafter)")
    dst.mkdir(parents=True, exist_ok=True)
    for f in src.iterdir():
        if f.is_file() and f.name != "config.json":
            shutil.copyfile(f, dst / f.name)
    cfg = full_attention_config(json.loads((src / "config.json").read_text()))
    (dst / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    print(f"{dst}: {cfg['num_hidden_layers'] if 'num_hidden_layers' in cfg else len(cfg['layer_types'])} layers, all "
          "full attention")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
