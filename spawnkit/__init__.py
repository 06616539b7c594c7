"""spawnkit: spawn AI coding-agent CLIs as ephemeral, locked-down runs, and log every one."""

from .errors import SpawnError, SpawnkitError
from .events import RunEvent
from .result import SpawnerResult, ToolCall, Usage
from .roster import ButlerConfig, Roster, load_butler, load_roster
from .runtimes import available_runtimes, get_adapter, register_adapter
from .spawner import Spawner
from .store import SessionStore
from .testing import MockSpawner

__version__ = "0.1.0"


def load_ipython_extension(ipython: object) -> None:
    """``%load_ext spawnkit``: register the magics, nothing else."""
    from .notebook import load

    load(ipython)


def unload_ipython_extension(ipython: object) -> None:
    from .notebook import unload

    unload(ipython)


__all__ = [
    "ButlerConfig",
    "MockSpawner",
    "Roster",
    "RunEvent",
    "SessionStore",
    "SpawnError",
    "Spawner",
    "SpawnerResult",
    "SpawnkitError",
    "ToolCall",
    "Usage",
    "available_runtimes",
    "get_adapter",
    "load_butler",
    "load_roster",
    "register_adapter",
]
