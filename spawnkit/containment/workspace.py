"""The ephemeral directory of one run: ``$SPAWNKIT_HOME/workspaces/butler_<name>_<uuid>/``.

It is the CLI's HOME and working directory (inside the sandbox, the only place the run may
write) and holds the runtime's configuration, the environment filter that starts the CLI,
and a ``skills`` link to the butler's skills. Two runs never share one, and the directory is
removed when the run ends, on success, failure, exception and cancellation alike:
:func:`run_workspace` is the only way the spawner creates one.

Why not the system temp dir: Codex refuses to set up its helper binaries when its home lies
under a temp dir (it then breaks on machines with bubblewrap), and a per-user 0700 folder
keeps other local users out of every run's files.

An ask (a question about sources) works in ``<workspace>/ask/``: each source linked by its
name, and an empty MCP configuration for every CLI that reads one from its working
directory (:func:`link_sources`), so the agent sees its sources and reaches no MCP server.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import uuid
from collections.abc import AsyncIterator, Iterable, Mapping
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any
from urllib.parse import quote

from ..config.butler_config import ButlerConfig
from ..home import home_path, spawnkit_home
from ..signals import finish_in_thread
from .sources import Source

logger = logging.getLogger(__name__)

PREFIX = "butler_"
# The folder of the home that holds every run's workspace (the only one the sweep empties).
WORKSPACES_DIR = "workspaces"


def workspaces_root() -> Path:
    root = spawnkit_home() / WORKSPACES_DIR
    root.mkdir(mode=0o700, exist_ok=True)
    return root


def session_suffix(session_id: str) -> str:
    """The end of the name of a run's first workspace, from its session id: the sweep finds
    the folder of a run whose owner died before the record named it (32 hex digits, as a
    uuid4's)."""
    return hashlib.sha256(session_id.encode("utf-8")).hexdigest()[:32]


def _make_workspace(butler: str, root: Path | None, session_id: str | None = None) -> Path:
    """A new workspace folder, named after ``session_id`` where that name is free; the home
    and its workspaces folder are made only when missing (one ``mkdir`` a run, not three)."""
    base = root if root is not None else home_path() / WORKSPACES_DIR
    suffix = session_suffix(session_id) if session_id is not None else uuid.uuid4().hex
    path = base / f"{PREFIX}{butler}_{suffix}"
    try:
        path.mkdir(mode=0o700, parents=False, exist_ok=False)
    except FileExistsError:  # an earlier attempt's, not removed: a name of its own
        path = base / f"{PREFIX}{butler}_{uuid.uuid4().hex}"
        path.mkdir(mode=0o700, parents=False, exist_ok=False)
    except FileNotFoundError:
        if root is not None:
            raise
        path = workspaces_root() / path.name
        path.mkdir(mode=0o700, parents=False, exist_ok=False)
    return path


@asynccontextmanager
async def run_workspace(
    butler: ButlerConfig,
    root: Path | None = None,
    *,
    handed_to: list[Path] | None = None,
    session_id: str | None = None,
) -> AsyncIterator[Path]:
    """Create a private directory for one run and remove it however the block ends.

    The removal runs in a thread (a run's folder can take tens of milliseconds to delete
    on a busy disk, which would stall every other run on the event loop), and the block
    ends only when it is done: a cancellation meanwhile is held until then. Given
    ``handed_to``, the folder is put there instead, for an owner that removes it in a
    thread it starts anyway (the spawner: with the run's record, see
    :mod:`spawnkit.run.recording`) and must, however the run ends. Named after
    ``session_id`` (:func:`session_suffix`), the folder of a run whose owner dies before
    its record names it is still found by the sweep.
    """
    path = _make_workspace(butler.name, root, session_id)
    try:
        skills = butler.directory / "skills"
        if skills.is_dir() and butler.workdir is None:
            (path / "skills").symlink_to(skills, target_is_directory=True)
        yield path
    finally:
        if handed_to is not None:
            handed_to.append(path)
        else:
            await finish_in_thread(remove, path)


def remove_all(paths: list[Path]) -> None:
    """Remove the run folders ``paths`` (handed over by :func:`run_workspace`), emptying it."""
    while paths:
        remove(paths.pop())


def remove(path: Path) -> None:
    """Remove a run's folder, with a warning when something could not be."""
    shutil.rmtree(path, ignore_errors=True)
    if path.exists():
        logger.warning("could not remove the run workspace %s", path)


def files_in(workspace: Path) -> list[str]:
    """The files under ``workspace``, relative and sorted (links are not followed), as
    :func:`os.walk` lists them: a link to a folder is a folder, not walked into."""
    found: list[str] = []
    _list_files(os.fspath(workspace), "", found)
    return sorted(found)


def _list_files(folder: str, prefix: str, found: list[str]) -> None:
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return  # as os.walk: a folder that cannot be listed lists nothing
    for entry in entries:
        try:
            is_dir = entry.is_dir()
        except OSError:
            is_dir = False
        if not is_dir:
            found.append(prefix + entry.name)
        elif not entry.is_symlink():
            _list_files(entry.path, f"{prefix}{entry.name}/", found)


def mcp_url(
    butler: ButlerConfig, session_key: str, host: str = "localhost", port: int | None = None
) -> str:
    """The butler's MCP endpoint, carrying the session key the server records calls under."""
    return (
        f"http://{host}:{port or butler.port}{butler.mcp_path}"
        f"?session_id={quote(session_key, safe='')}"
    )


# Where an ask's agent works, inside its run's workspace (which is the CLI's HOME).
ASK_DIR = "ask"
# "No MCP servers" for every CLI that reads a config from its working directory.
EMPTY_MCP_CONFIGS: Mapping[str, Mapping[str, Any]] = {
    ".mcp.json": {"mcpServers": {}},  # Claude Code (project scope)
    ".gemini/settings.json": {"mcpServers": {}},  # Gemini CLI (workspace settings)
    ".cursor/mcp.json": {"mcpServers": {}},  # Cursor
    "opencode.json": {"mcp": {}},  # opencode
}


def link_sources(workspace: Path, sources: Iterable[Source]) -> Path:
    """Create ``<workspace>/ask/`` with each source linked by its name; its path.

    The links point at the sources' real paths (:func:`source_paths`), so a sandbox
    that binds those paths read-only shows exactly these sources.
    """
    folder = workspace / ASK_DIR
    folder.mkdir(mode=0o700)
    for source in sources:
        real = source.path.resolve()
        (folder / source.name).symlink_to(real, target_is_directory=real.is_dir())
    for relative, content in EMPTY_MCP_CONFIGS.items():
        target = folder / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(json.dumps(content, indent=2) + "\n", encoding="utf-8")
    return folder


def source_paths(sources: Iterable[Source]) -> tuple[Path, ...]:
    """The real paths of ``sources``: what a CLI must be told about and a sandbox bind."""
    return tuple(dict.fromkeys(source.path.resolve() for source in sources))
