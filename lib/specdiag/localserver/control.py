"""``python -m specdiag.localserver.control {ensure,stop}``: the recorded embedded server from a shell."""

from __future__ import annotations

import sys
from typing import Sequence

from specdiag.localserver.lifecycle import ensure_running, stop_recorded


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m specdiag.localserver.control {ensure,stop}``: for Makefiles and shells."""
    import argparse

    p = argparse.ArgumentParser(prog="python -m specdiag.localserver.control")
    sub = p.add_subparsers(dest="cmd", required=True)
    ens = sub.add_parser("ensure", help="print the URL of the recorded embedded server, starting one if needed")
    ens.add_argument("--algorithm", default="STANDALONE")
    ens.add_argument("--num-draft-tokens", type=int, default=8)
    ens.add_argument("--device", default="auto")
    sub.add_parser("stop", help="stop the recorded embedded server, if it runs")
    a = p.parse_args(argv)
    if a.cmd == "ensure":
        print(ensure_running(a.algorithm, a.num_draft_tokens, device=a.device))
    else:
        print("stopped" if stop_recorded() else "no recorded embedded server was running")
    return 0


if __name__ == "__main__":
    sys.exit(main())
