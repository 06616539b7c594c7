"""The runtime registry: runtime type strings mapped to their adapters.

Adapters are imported lazily so that loading a roster (which validates
``[butler.runtime] type``) does not import every agent SDK.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from ..errors import UnknownRuntimeError

if TYPE_CHECKING:
    from .base import RuntimeAdapter

_REGISTRY: dict[str, str | type[RuntimeAdapter]] = {
    "claude-code": "spawnkit.runtimes.claude_code:ClaudeCodeAdapter",
    "codex": "spawnkit.runtimes.codex:CodexAdapter",
    "gemini": "spawnkit.runtimes.gemini:GeminiAdapter",
}


def register_adapter(runtime_type: str, adapter: str | type[RuntimeAdapter]) -> None:
    """Register an adapter class (or its ``"module:Class"`` path) under a type string."""
    _REGISTRY[runtime_type] = adapter


def available_runtimes() -> list[str]:
    return sorted(_REGISTRY)


def get_adapter(runtime_type: str) -> type[RuntimeAdapter]:
    """The adapter class for ``runtime_type``; a ``ValueError`` lists the known types."""
    try:
        entry = _REGISTRY[runtime_type]
    except KeyError:
        raise UnknownRuntimeError(runtime_type, available_runtimes()) from None
    if isinstance(entry, str):
        module_name, _, class_name = entry.partition(":")
        entry = getattr(importlib.import_module(module_name), class_name)
        _REGISTRY[runtime_type] = entry
    return entry


__all__ = ["available_runtimes", "get_adapter", "register_adapter"]
