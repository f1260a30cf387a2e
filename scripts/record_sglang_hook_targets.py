"""Record, from an SGLang's source (read, not imported), where each method the SGLang plugin hooks is defined and the
SHA-256 of its code.

The plugin patches SGLang by dotted names (``module.Class.method``) through SGLang's hook registry, which logs and
skips a name that does not resolve, and its hooks assume the code of the SGLang they were tested on. This writes, for
every target of :func:`plugin_targets`, the class whose body defines it (the class itself or a base class found
through the module's imports, or null) and its code's SHA-256 (specdiag_sglang_plugin/versions.py: the plugin compares
the installed SGLang's against the tested one's at registration). No GPU and no install needed: a wheel will do::

    pip download --no-deps sglang==0.5.17 -d /tmp/w && unzip -q /tmp/w/sglang-0.5.17-*.whl -d /tmp/s17
    python scripts/record_sglang_hook_targets.py --site /tmp/s17 \\
        --out plugins/sglang/specdiag_sglang_plugin/sglang-0.5.17-hook-targets.json   # a tested version: ships
    python scripts/record_sglang_hook_targets.py --site /tmp/s23 --out tests/data/sglang-0.5.23/hook-targets.json

tests/test_sglang_plugin_targets.py fails when the plugin names a target a recorded SGLang does not define.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "plugins" / "sglang"), str(ROOT / "lib")]

from specdiag_sglang_plugin import versions  # noqa: E402


def plugin_targets() -> list[str]:
    """Every dotted SGLang name the plugin can register a hook on, whatever its environment switches."""
    return versions.all_targets()


def resolve(site: Path, target: str) -> str | None:
    """The ``module.Class`` whose body defines ``target`` in the install at ``site``, or None."""
    found = versions.definition(site, target)
    return found[0] if found else None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--site", type=Path, required=True,
                    help="the folder that holds sglang/ and its dist-info (site-packages, or an unzipped wheel)")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    if not (args.site / "sglang").is_dir() or not sorted(args.site.glob("sglang-*.dist-info")):
        ap.error(f"{args.site} holds no sglang package with its dist-info: point --site at the folder that holds it")
    rec = versions.record(args.site, plugin_targets())
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(rec, indent=1) + "\n")
    for t, where in rec["defined_in"].items():
        print(f"{'ok     ' if where else 'MISSING'} {t}" + (f"  ({where})" if where else ""))
    return 0 if all(rec["defined_in"].values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
