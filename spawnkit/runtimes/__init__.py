"""The runtime registry: runtime type strings mapped to their adapters, and their aliases.

The names themselves (canonical names, aliases, :func:`canonical_runtime`) live in
:mod:`spawnkit.config.runtime_names`, below the configuration that validates them; this
package turns a name into its adapter class. Adapters are imported lazily so that
naming a runtime does not import every agent SDK.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, cast

from ..config.runtime_names import (
    ALIASES,
    adapter_entry,
    available_runtimes,
    canonical_runtime,
    set_adapter,
)

if TYPE_CHECKING:
    from .base import RuntimeAdapter


def register_adapter(runtime_type: str, adapter: str | type[RuntimeAdapter]) -> None:
    """Register an adapter class (or its ``"module:Class"`` path) under a type string."""
    set_adapter(runtime_type, adapter)


def get_adapter(runtime_type: str) -> type[RuntimeAdapter]:
    """The adapter class for ``runtime_type`` (or an alias); a ``ValueError`` lists the known."""
    name = canonical_runtime(runtime_type)
    entry = adapter_entry(name)
    if isinstance(entry, str):
        module_name, _, class_name = entry.partition(":")
        entry = getattr(importlib.import_module(module_name), class_name)
        set_adapter(name, entry)
    # Only register_adapter (typed as taking a RuntimeAdapter) and the built-in paths
    # above put entries in the table.
    return cast("type[RuntimeAdapter]", entry)


__all__ = ["ALIASES", "available_runtimes", "canonical_runtime", "get_adapter", "register_adapter"]
