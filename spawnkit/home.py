"""Where spawnkit keeps its state: ``$SPAWNKIT_HOME``, by default ``~/.spawnkit``.

The session store, credentials, memory episodes and per-session logs all live
under this one directory, so a user (or a test) moves everything by setting one
variable. Which store they use can also be a shared PostgreSQL database:
:func:`store_setting` reads ``$SPAWNKIT_STORE``, then ``[store] url`` in
``$SPAWNKIT_HOME/config.toml``. A home that cannot be created or written is a
:class:`~spawnkit.errors.HomeNotWritable` naming the folder, never an ``OSError``
from deep inside a run.
"""

from __future__ import annotations

import functools
import os
import tomllib
from pathlib import Path

from .errors import ConfigError, HomeNotWritable

ENV_VAR = "SPAWNKIT_HOME"
STORE_VAR = "SPAWNKIT_STORE"
CONFIG_FILE = "config.toml"
# The name this host's runs carry in a shared store (default: the machine's node name).
HOST_VAR = "SPAWNKIT_HOST"
# Seconds a run's record stays owned without its host renewing it (spawnkit.store).
LEASE_VAR = "SPAWNKIT_LEASE_S"
DEFAULT_LEASE_S = 15.0


def home_path() -> Path:
    """The state directory's path, without creating it."""
    return _home_at(os.environ.get(ENV_VAR), os.environ.get("HOME"))


@functools.lru_cache(maxsize=8)
def _home_at(raw: str | None, user_home: str | None) -> Path:
    """The home's path for these variables: parsed once, for every run asks (four times)."""
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


def store_setting() -> str | None:
    """The store the user chose: ``$SPAWNKIT_STORE``, else ``[store] url`` in
    ``$SPAWNKIT_HOME/config.toml``, else None (the SQLite file of :func:`default_store_path`).

    A path or a ``postgresql://`` URL; the CLI's ``--store`` sets the variable.
    """
    raw = os.environ.get(STORE_VAR, "").strip()
    if raw:
        return raw
    config = home_path() / CONFIG_FILE
    try:
        text = config.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise ConfigError(f"{config}: {exc.strerror or exc}") from exc
    try:
        table = tomllib.loads(text).get("store", {})
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{config}: {exc}") from exc
    url = table.get("url") if isinstance(table, dict) else None
    if url is not None and (not isinstance(url, str) or not url.strip()):
        raise ConfigError(f"{config}: [store] url must be a non-empty string")
    return url.strip() if url else None


def host_name() -> str:
    """This host's name in the store: ``$SPAWNKIT_HOST``, else the machine's node name.

    Two hosts sharing a PostgreSQL store must have different names (containers cloned from
    one image may share a node name: set the variable there).
    """
    return os.environ.get(HOST_VAR, "").strip() or os.uname().nodename


def lease_seconds() -> float:
    """How long a run's lease lasts: ``$SPAWNKIT_LEASE_S``, else :data:`DEFAULT_LEASE_S`."""
    raw = os.environ.get(LEASE_VAR, "").strip()
    if not raw:
        return DEFAULT_LEASE_S
    try:
        value = float(raw)
    except ValueError:
        value = 0.0
    if not 0 < value < float("inf"):
        raise ConfigError(f"${LEASE_VAR} must be a positive number of seconds, not {raw!r}")
    return value
