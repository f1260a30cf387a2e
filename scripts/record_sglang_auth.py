"""Record SGLang's API-key rules from its wheel, for the replay server that enforces them (tests/data/sglang-0.5.17/).

Reads two files of the wheel, imports nothing of SGLang:
- ``sglang/srt/utils/auth.py``: ``decide_request_auth`` is pure (its module imports only the standard library at
  load time), so it is executed alone, and asked every combination of server keys (none, ``--api-key``,
  ``--admin-api-key``, both), endpoint level (NORMAL, ADMIN_OPTIONAL, ADMIN_FORCE), path kind (a /health* or
  /metrics* path, any other) and Authorization header (none, the API key, the admin key, another key, a non-Bearer
  scheme): ``decisions``.
- ``sglang/srt/entrypoints/http_server.py``: every route whose endpoint carries ``@auth_level(AuthLevel.X)``, with
  its methods: ``levels`` (a route without one is NORMAL).

    python scripts/record_sglang_auth.py /tmp/sglwhl/sglang-0.5.17-cp311-cp311-manylinux_2_34_x86_64.whl \\
        tests/data/sglang-0.5.17/auth.json
"""

from __future__ import annotations

import argparse
import hashlib
import itertools
import json
import re
import sys
import types
import zipfile
from pathlib import Path

KEYS = {"none": (None, None), "api_key": ("KEY-A", None), "admin_api_key": (None, "KEY-B"), "both": ("KEY-A", "KEY-B")}
HEADERS = {"none": None, "api_key": "Bearer KEY-A", "admin_api_key": "Bearer KEY-B", "other": "Bearer KEY-C",
           "not_bearer": "Token KEY-A"}
PATHS = {"health": "/health_generate", "metrics": "/metrics", "other": "/generate"}


def route_levels(source: str) -> list[dict]:
    """(path, methods, level) of every route decorated with ``@auth_level`` in http_server.py."""
    lines = source.splitlines()
    out = []
    for i, line in enumerate(lines):
        m = re.search(r"@auth_level\(AuthLevel\.(\w+)\)", line)
        if not m:
            continue
        j = i - 1
        while j >= 0 and not re.search(r"@app\.(get|post|put|delete|api_route)\(", lines[j]):
            j -= 1
        block = " ".join(lines[j:i])
        path = re.search(r'\(\s*"([^"]+)"', block)
        kind = re.search(r"@app\.(\w+)\(", block).group(1)
        methods = (re.findall(r'"([A-Z]+)"', re.search(r"methods=\[([^\]]*)\]", block).group(1))
                   if kind == "api_route" else [kind.upper()])
        out.append({"path": path.group(1), "methods": methods, "level": m.group(1)})
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("wheel")
    ap.add_argument("out")
    args = ap.parse_args(argv)
    with zipfile.ZipFile(args.wheel) as z:
        auth_src = z.read("sglang/srt/utils/auth.py").decode()
        server_src = z.read("sglang/srt/entrypoints/http_server.py").decode()
        version = next(m.group(1) for n in z.namelist() if (m := re.match(r"sglang-([^/]+)\.dist-info/METADATA$", n)))
    auth = types.ModuleType("sglang_auth_alone")
    sys.modules[auth.__name__] = auth  # dataclasses look their module up while the class is made
    exec(compile(auth_src, "sglang/srt/utils/auth.py", "exec"), auth.__dict__)  # noqa: S102 - the wheel's own code
    decisions = []
    for (keys, (api, admin)), level, (path_kind, path), (header_kind, header) in itertools.product(
            KEYS.items(), auth.AuthLevel, PATHS.items(), HEADERS.items()):
        d = auth.decide_request_auth(method="POST", path=path, authorization_header=header, api_key=api,
                                     admin_api_key=admin, auth_level=level)
        decisions.append({"server_keys": keys, "level": level.name, "path": path_kind, "header": header_kind,
                          "allowed": d.allowed, "status": None if d.allowed else d.error_status_code})
    record = {
        "source": {"wheel": Path(args.wheel).name, "sha256": hashlib.sha256(Path(args.wheel).read_bytes()).hexdigest(),
                   "version": version, "files": ["sglang/srt/utils/auth.py", "sglang/srt/entrypoints/http_server.py"],
                   "written_by": "scripts/record_sglang_auth.py"},
        "middleware": ("installed when the server has --api-key or --admin-api-key (or an ADMIN_FORCE route); a "
                       "request matching no route (method and path) is NORMAL; refusals answer "
                       "{\"error\": \"Unauthorized\"} (401) or {\"error\": \"Forbidden\"} (403)"),
        "paths": PATHS, "headers": HEADERS, "levels": route_levels(server_src), "decisions": decisions,
    }
    Path(args.out).write_text(json.dumps(record, indent=1) + "\n")
    print(f"wrote {args.out}: {len(record['levels'])} routes with a level, {len(decisions)} decisions", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
