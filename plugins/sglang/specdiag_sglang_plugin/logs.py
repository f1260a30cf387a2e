"""The plugin's log: one line per distinct event and process ("which path runs and why"), shared by every module of
the plugin so none of them imports another for it."""

from __future__ import annotations

import logging

logger = logging.getLogger("specdiag_sglang_plugin")
_logged: set = set()


def log_once(key: str, message: str, *args) -> None:
    """``message`` at warning level (SGLang's default log level shows it), the first time ``key`` is seen."""
    if key not in _logged:
        _logged.add(key)
        logger.warning("[specdiag plugin] " + message, *args)


def first_time(key: str) -> bool:
    """True the first time ``key`` is seen (for a caller that logs something else once, e.g. a traceback)."""
    if key in _logged:
        return False
    _logged.add(key)
    return True
