"""spawnkit: spawn AI coding-agent CLIs as ephemeral, locked-down runs, and log every one.

The public names below are imported when first used (PEP 562), so that
``spawnkit --version``, ``spawnkit sessions`` and an adapter contract's
``check_status`` poll start in a few tens of milliseconds instead of paying for
the MCP, OpenTelemetry and agent SDK imports that only a run needs.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from . import _deferred, _moved

__version__ = "0.1.0"
_moved.install()  # old import paths of moved modules keep working, with a warning
_deferred.defer_iri_syntax()  # 2 CPU-s that jsonschema's import spends on a check unused
_deferred.defer_on_first_use()  # 0.1 CPU-s more, on another

if TYPE_CHECKING:
    from .cluster.worktrees import apply_diff
    from .config.roster import ButlerConfig, Roster, load_butler, load_roster
    from .errors import SpawnError, SpawnkitError
    from .events import RunEvent
    from .notebook.batch import map
    from .result import SpawnerResult, ToolCall, Usage
    from .run import MockSpawner, Spawner
    from .run.dispatch import Cluster
    from .runtimes import available_runtimes, get_adapter, register_adapter
    from .serve.service import ButlerService
    from .store import SessionStore

# Public name -> the module that defines it.
_EXPORTS = {
    "ButlerConfig": "config.roster",
    "ButlerService": "serve.service",
    "Cluster": "run.dispatch",
    "MockSpawner": "run",
    "Roster": "config.roster",
    "RunEvent": "events",
    "SessionStore": "store",
    "SpawnError": "errors",
    "Spawner": "run",
    "SpawnerResult": "result",
    "SpawnkitError": "errors",
    "ToolCall": "result",
    "Usage": "result",
    "apply_diff": "cluster.worktrees",
    "available_runtimes": "runtimes",
    "get_adapter": "runtimes",
    "load_butler": "config.roster",
    "load_roster": "config.roster",
    "map": "notebook.batch",
    "register_adapter": "runtimes",
}


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'spawnkit' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])


def load_ipython_extension(ipython: object) -> None:
    """``%load_ext spawnkit``: register the magics, nothing else."""
    from .notebook import load

    load(ipython)


def unload_ipython_extension(ipython: object) -> None:
    from .notebook import unload

    unload(ipython)


__all__ = [
    "ButlerConfig",
    "ButlerService",
    "Cluster",
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
    "apply_diff",
    "available_runtimes",
    "get_adapter",
    "load_butler",
    "load_roster",
    "map",
    "register_adapter",
]
