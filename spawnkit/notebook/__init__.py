"""spawnkit in Jupyter and IPython: magics, live run views, the background loop.

``%load_ext spawnkit`` calls :func:`load`, which registers the magics and does two
things a host of runs must: it sweeps up what runs of dead owners left behind (a kernel
killed with SIGKILL or restarted with ``now=True``; see :mod:`spawnkit.containment.sweep`), and it
makes SIGTERM and SIGHUP stop this kernel's runs the way an interrupt does (cancelled,
recorded, cleaned up) before the signal takes its course; ``%unload_ext`` puts the
previous handlers back. No event-loop patching, no warning filters, no network.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..signals import on_stop_signals
from ..store import SessionStore

if TYPE_CHECKING:
    from .asking import chat
    from .runner import spawn

__all__ = ["chat", "load", "spawn", "unload"]

# `spawn` and `chat` are imported when first used (PEP 562): `%load_ext spawnkit` loads
# neither the views nor the MCP server stack a run needs.
_LAZY = {"chat": ".asking", "spawn": ".runner"}

_MAGICS: dict[int, Any] = {}
_RESTORE_SIGNALS: dict[int, Callable[[], None]] = {}


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(_LAZY[name], __name__), name)


def _close_hub() -> None:
    """Stop this kernel's runs, if any was started (else there is no hub to close)."""
    hub = sys.modules.get(f"{__name__}.hub")
    if hub is not None:
        hub.close_default_hub()


def load(ipython: Any) -> None:
    from .magics import SpawnMagics

    unload(ipython)  # %reload_ext: drop the previous instance first
    magics = SpawnMagics(shell=ipython)
    ipython.register_magics(magics)  # Magics() already joined ipython.configurables
    _MAGICS[id(ipython)] = magics
    SessionStore().close()  # opening the store is the start-up sweep
    restore = on_stop_signals(_close_hub)
    if restore is not None:
        _RESTORE_SIGNALS[id(ipython)] = restore


def unload(ipython: Any) -> None:
    restore = _RESTORE_SIGNALS.pop(id(ipython), None)
    if restore is not None:
        restore()
    magics = _MAGICS.pop(id(ipython), None)
    if magics is None:
        return
    magics.close()
    registry = ipython.magics_manager.magics
    for kind, names in magics.magics.items():
        for name in names:
            registry[kind].pop(name, None)
    ipython.configurables[:] = [c for c in ipython.configurables if c is not magics]
