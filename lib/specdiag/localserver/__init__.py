"""The embedded SGLang-compatible server: a tiny transformers model with real speculative decoding.

- ``python -m specdiag.localserver --help``: the server (app.py routes, engine.py decoding).
- ``EmbeddedServer``, ``ensure_running``, ``stop_recorded``: start and stop it from Python
  (lifecycle.py). Importing this package does not import torch.
"""

from specdiag.localserver.lifecycle import EmbeddedServer, EmbeddedServerError, ensure_running, stop_recorded

__all__ = ["EmbeddedServer", "EmbeddedServerError", "ensure_running", "stop_recorded"]
