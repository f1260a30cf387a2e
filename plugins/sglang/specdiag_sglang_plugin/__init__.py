"""specdiag's split-KV verify attention as an SGLang plugin (entry point group ``sglang.srt.plugins``).

Install next to SGLang (``pip install --no-deps . ./plugins/sglang`` from the checkout) and allow it:
``SGLANG_PLUGINS=specdiag_splitkv``.
``SPECDIAG_SGLANG_VERIFY=splitkv|upstream|off`` picks the mode at server start (hook.py).
``SPECDIAG_SGLANG_PREFILL=off|mha``: long prompts' chunks on a Triton server in the MHA form on specdiag's kernel
(prefill.py; off by default).
``SPECDIAG_SGLANG_KV_ALLOC=sglang|contiguous`` picks the KV slot allocator (contiguous.py; ``sglang`` by default).
The entry point hooks only methods whose code is the tested SGLang's and says which SGLang it serves (versions.py).
"""

from specdiag_sglang_plugin.hook import MODE_ENV, STATS, STATS_ENV, stats_snapshot  # noqa: F401
from specdiag_sglang_plugin.hook import register as register_hooks
from specdiag_sglang_plugin.versions import guard

register = guard(register_hooks)  # the entry point (pyproject.toml)

__version__ = "0.1.0"
