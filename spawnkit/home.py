"""Where spawnkit keeps its state: ``$SPAWNKIT_HOME``, by default ``~/.spawnkit``.

The session store, credentials, memory episodes and per-session logs all live
under this one directory, so a user (or a test) moves everything by setting one
variable. A home that cannot be created or written is a
:class:`~spawnkit.errors.HomeNotWritable` naming the folder, never an ``OSError``
from deep inside a run.
"""

from __future__ import annotations

import os
from pathlib import Path

from .errors import HomeNotWritable

ENV_VAR = "SPAWNKIT_HOME"


def home_path() -> Path:
    """The state directory's path, without creating it."""
    raw = os.environ.get(ENV_VAR)
    return Path(raw).expanduser() if raw else Path.home() / ".spawnkit"


def spawnkit_home() -> Path:
    """The state directory, created on first use with owner-only permissions."""
    home = home_path()
    try:
        home.mkdir(parents=True, exist_ok=True, mode=0o700)
    except OSError as exc:
        raise HomeNotWritable(home, exc.strerror or str(exc)) from exc
    return home


def is_writable(directory: Path) -> bool:
    """Whether files can be created in ``directory`` (a read-only mount counts, even for root)."""
    return os.access(directory, os.W_OK | os.X_OK)


def default_store_path() -> Path:
    return spawnkit_home() / "sessions.db"
