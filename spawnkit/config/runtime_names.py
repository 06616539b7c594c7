"""The runtimes by name: each canonical name, its aliases, and where its adapter lives.

This is the bottom half of the runtime registry, kept apart from the adapters so that
configuration (``[butler.runtime] type`` in ``butler.toml``, ``--runtime``,
:meth:`ButlerConfig.with_runtime <spawnkit.config.butler_config.ButlerConfig.with_runtime>`) can
check a runtime's name without importing any adapter or agent SDK.
:func:`spawnkit.runtimes.get_adapter` turns a name into its adapter class.

Each runtime has one canonical name (``claude-code``, ``codex``, ``gemini``), which
is what records, results and listings say; :data:`ALIASES` holds the other names a
user may type for one (``claude``, the name of Claude Code's binary and of its
transcripts). Everything that takes a runtime name from a user (``butler.toml``,
``--runtime``, ``spawnkit adapter RUNTIME``, ``ask``, ``history --source``) resolves
it through :func:`canonical_runtime`, so each name is accepted everywhere.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from ..errors import UnknownRuntimeError

# Canonical name -> the adapter class, or its "module:Class" path until first used. The
# class is typed loosely here (this module sits below the adapters' base class);
# spawnkit.runtimes.register_adapter is the typed way in.
_ADAPTERS: dict[str, str | type] = {
    "claude-code": "spawnkit.runtimes.claude_code:ClaudeCodeAdapter",
    "codex": "spawnkit.runtimes.codex:CodexAdapter",
    "gemini": "spawnkit.runtimes.gemini:GeminiAdapter",
    "command": "spawnkit.runtimes.command:CommandAdapter",
    "acp": "spawnkit.runtimes.acp.adapter:AcpAdapter",
}

# Alias -> canonical runtime name. The one table of alternative names.
ALIASES: Mapping[str, str] = MappingProxyType({"claude": "claude-code"})


def set_adapter(runtime_type: str, adapter: str | type) -> None:
    """Name a runtime and where its adapter is (see :func:`spawnkit.runtimes.register_adapter`)."""
    _ADAPTERS[runtime_type] = adapter


def adapter_entry(runtime_type: str) -> str | type:
    """The adapter class registered for a canonical runtime name, or its ``"module:Class"``."""
    return _ADAPTERS[runtime_type]


def available_runtimes() -> list[str]:
    """The canonical names of every registered runtime."""
    return sorted(_ADAPTERS)


def canonical_runtime(name: str) -> str:
    """The canonical name for ``name`` or one of its aliases (``claude`` -> ``claude-code``).

    Raises :class:`~spawnkit.errors.UnknownRuntimeError` (a ``ValueError``) listing the
    registered runtimes and their aliases.
    """
    if name in _ADAPTERS:
        return name
    target = ALIASES.get(name)
    if target is not None and target in _ADAPTERS:
        return target
    raise UnknownRuntimeError(name, available_runtimes(), dict(ALIASES))


__all__ = ["ALIASES", "adapter_entry", "available_runtimes", "canonical_runtime", "set_adapter"]
