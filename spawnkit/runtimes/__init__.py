"""The runtime registry: runtime type strings mapped to their adapters, and their aliases.

Adapters are imported lazily so that loading a roster (which validates
``[butler.runtime] type``) does not import every agent SDK.

Each runtime has one canonical name (``claude-code``, ``codex``, ``gemini``), which
is what records, results and listings say; :data:`ALIASES` holds the other names a
user may type for one (``claude``, the name of Claude Code's binary and of its
transcripts). Everything that takes a runtime name from a user (``butler.toml``,
``--runtime``, ``spawnkit adapter RUNTIME``, ``ask``, ``history --source``) resolves
it through :func:`canonical_runtime`, so each name is accepted everywhere.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING

from ..errors import UnknownRuntimeError

if TYPE_CHECKING:
    from .base import RuntimeAdapter

_REGISTRY: dict[str, str | type[RuntimeAdapter]] = {
    "claude-code": "spawnkit.runtimes.claude_code:ClaudeCodeAdapter",
    "codex": "spawnkit.runtimes.codex:CodexAdapter",
    "gemini": "spawnkit.runtimes.gemini:GeminiAdapter",
    "command": "spawnkit.runtimes.command:CommandAdapter",
}

# Alias -> canonical runtime name. The one table of alternative names.
ALIASES: Mapping[str, str] = MappingProxyType({"claude": "claude-code"})


def register_adapter(runtime_type: str, adapter: str | type[RuntimeAdapter]) -> None:
    """Register an adapter class (or its ``"module:Class"`` path) under a type string."""
    _REGISTRY[runtime_type] = adapter


def available_runtimes() -> list[str]:
    """The canonical names of every registered runtime."""
    return sorted(_REGISTRY)


def canonical_runtime(name: str) -> str:
    """The canonical name for ``name`` or one of its aliases (``claude`` -> ``claude-code``).

    Raises :class:`~spawnkit.errors.UnknownRuntimeError` (a ``ValueError``) listing the
    registered runtimes and their aliases.
    """
    if name in _REGISTRY:
        return name
    target = ALIASES.get(name)
    if target is not None and target in _REGISTRY:
        return target
    raise UnknownRuntimeError(name, available_runtimes(), dict(ALIASES))


def get_adapter(runtime_type: str) -> type[RuntimeAdapter]:
    """The adapter class for ``runtime_type`` (or an alias); a ``ValueError`` lists the known."""
    name = canonical_runtime(runtime_type)
    entry = _REGISTRY[name]
    if isinstance(entry, str):
        module_name, _, class_name = entry.partition(":")
        entry = getattr(importlib.import_module(module_name), class_name)
        _REGISTRY[name] = entry
    return entry


__all__ = ["ALIASES", "available_runtimes", "canonical_runtime", "get_adapter", "register_adapter"]
