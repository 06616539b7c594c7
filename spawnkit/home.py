"""Where spawnkit keeps its state: ``$SPAWNKIT_HOME``, by default ``~/.spawnkit``.

The session store, credentials, memory episodes and per-session logs all live
under this one directory, so a user (or a test) moves everything by setting one
variable.
"""

from __future__ import annotations

import os
from pathlib import Path

ENV_VAR = "SPAWNKIT_HOME"


def spawnkit_home() -> Path:
    """The state directory, created on first use with owner-only permissions."""
    raw = os.environ.get(ENV_VAR)
    home = Path(raw).expanduser() if raw else Path.home() / ".spawnkit"
    home.mkdir(parents=True, exist_ok=True, mode=0o700)
    return home


def default_store_path() -> Path:
    return spawnkit_home() / "sessions.db"
