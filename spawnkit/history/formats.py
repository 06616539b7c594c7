"""Where each agent CLI keeps its transcripts, and how to read one file of them.

A source has one canonical name, the runtime's name in spawnkit (``claude-code``, ``codex``,
``gemini``); ``claude`` is accepted for ``claude-code``. Its default folders are the user's
own (``~/.claude``, ``~/.codex``, ``~/.gemini``, or what the CLI's environment variables
name) and the homes spawnkit gives its own runs, under ``$SPAWNKIT_HOME/runtimes/<runtime>/``
(laid out like the user's: ``projects/``, ``sessions/``, ``tmp/``), so a load sees the runs
spawnkit made as well as the user's own.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from ..home import ENV_VAR as SPAWNKIT_HOME_VAR
from . import claude, codex, gemini
from .errors import HistoryError
from .rows import FileFacts, Rows

Source = Literal["claude-code", "claude", "codex", "gemini"]
SOURCES = ("claude-code", "codex", "gemini")
ALIASES = {"claude": "claude-code"}


@dataclass(frozen=True)
class SourceFormat:
    """How one CLI stores transcripts."""

    name: str
    default_roots: Callable[[], list[Path]]
    discover: Callable[[Path], list[Path]]
    identify: Callable[[Path, Path], tuple[str, str]]
    parse: Callable[[bytes, FileFacts, Rows], None]


def canonical(source: str) -> str:
    """The canonical name of a source (``claude`` is ``claude-code``); unknown names fail."""
    name = ALIASES.get(source, source)
    if name not in SOURCES:
        choices = ", ".join((*SOURCES, *ALIASES))
        raise HistoryError(f"unknown transcript source {source!r}; choose one of {choices}")
    return name


def spawnkit_runtime_home(runtime: str) -> Path | None:
    """The home spawnkit gives its own runs of ``runtime``, if it exists (never created)."""
    raw = os.environ.get(SPAWNKIT_HOME_VAR)
    base = Path(raw).expanduser() if raw else Path.home() / ".spawnkit"
    home = base / "runtimes" / runtime
    return home if home.is_dir() else None


def _claude_roots() -> list[Path]:
    raw = os.environ.get("CLAUDE_CONFIG_DIR")
    if raw:
        candidates = [Path(p.strip()).expanduser() for p in raw.split(",") if p.strip()]
        roots = [p.parent if p.name == "projects" else p for p in candidates]
        roots = [p for p in roots if p.is_dir()]
    else:
        xdg = Path(os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config")
        roots = [p for p in (xdg / "claude", Path.home() / ".claude") if (p / "projects").is_dir()]
    return _with_spawnkit_home(roots, "claude-code", "projects")


def _codex_roots() -> list[Path]:
    roots = [r for r in codex.default_roots() if r.is_dir()]
    return _with_spawnkit_home(roots, "codex", "sessions")


def _gemini_roots() -> list[Path]:
    roots = [r for r in gemini.default_roots() if r.is_dir()]
    return _with_spawnkit_home(roots, "gemini", "tmp")


def _with_spawnkit_home(roots: list[Path], runtime: str, folder: str) -> list[Path]:
    home = spawnkit_runtime_home(runtime)
    if home is not None and (home / folder).is_dir():
        resolved = {r.resolve() for r in roots}
        if home.resolve() not in resolved:
            roots = [*roots, home]
    return roots


FORMATS: dict[str, SourceFormat] = {
    "claude-code": SourceFormat(
        "claude-code", _claude_roots, claude.discover,
        lambda path, _root: claude.session_parts(path), claude.parse_claude_file,
    ),
    "codex": SourceFormat(
        "codex", _codex_roots, codex.discover, codex.identify, codex.parse_codex_file
    ),
    "gemini": SourceFormat(
        "gemini", _gemini_roots, gemini.discover, gemini.identify, gemini.parse_gemini_file
    ),
}  # fmt: skip
