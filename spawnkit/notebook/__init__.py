"""spawnkit in Jupyter and IPython: magics, live run views, the background loop.

``%load_ext spawnkit`` calls :func:`load` and does nothing else: it registers
the magics. No event-loop patching, no warning filters, no network.
"""

from __future__ import annotations

from typing import Any

from .asking import chat
from .runner import spawn

__all__ = ["chat", "load", "spawn", "unload"]

_MAGICS: dict[int, Any] = {}


def load(ipython: Any) -> None:
    from .magics import SpawnMagics

    unload(ipython)  # %reload_ext: drop the previous instance first
    magics = SpawnMagics(shell=ipython)
    ipython.register_magics(magics)  # Magics() already joined ipython.configurables
    _MAGICS[id(ipython)] = magics


def unload(ipython: Any) -> None:
    magics = _MAGICS.pop(id(ipython), None)
    if magics is None:
        return
    magics.close()
    registry = ipython.magics_manager.magics
    for kind, names in magics.magics.items():
        for name in names:
            registry[kind].pop(name, None)
    ipython.configurables[:] = [c for c in ipython.configurables if c is not magics]
