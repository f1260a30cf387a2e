"""What a named measurement is handed for one arm, and what it hands back (pure; imported by the steps' measure.py
files, so it imports no server code)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from specdiag.sweep.arms import Arm


@dataclass(frozen=True)
class ArmJob:
    """One arm's server, ready, to be measured into the sweep's run folder."""

    run: Any  # specdiag.runs.Run: rows appended as they are measured
    arm: Arm  # the arm as the arms file configures it
    url: str  # the server's base URL
    settings: Any  # the measurement's settings dataclass
    deadline_s: float  # time.monotonic() by which the measurement must have stopped sending requests
    stats_dir: Path  # the plugin's stats files of this server (SPECDIAG_SGLANG_STATS), where it writes them
    work: Path  # a folder of this arm's own (a recorder's dumps)
    progress: Callable[[str], None] = print
    server_info: dict[str, Any] = field(default_factory=dict)  # /server_info as the server answered, redacted

    def left_s(self) -> float:
        return self.deadline_s - time.monotonic()
