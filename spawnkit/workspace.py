"""The ephemeral directory of one run: ``$SPAWNKIT_HOME/workspaces/butler_<name>_<uuid>/``.

It is the CLI's HOME and working directory (inside the sandbox, the only place the run may
write) and holds the runtime's configuration, the environment filter that starts the CLI,
and a ``skills`` link to the butler's skills. Two runs never share one, and the directory is
removed when the run ends, on success, failure, exception and cancellation alike:
:func:`run_workspace` is the only way the spawner creates one.

Why not the system temp dir: Codex refuses to set up its helper binaries when its home lies
under a temp dir (it then breaks on machines with bubblewrap), and a per-user 0700 folder
keeps other local users out of every run's files.
"""

from __future__ import annotations

import logging
import os
import shutil
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import quote

from .butler_config import ButlerConfig
from .home import spawnkit_home

logger = logging.getLogger(__name__)

PREFIX = "butler_"


def workspaces_root() -> Path:
    root = spawnkit_home() / "workspaces"
    root.mkdir(mode=0o700, exist_ok=True)
    return root


def workspace_path(butler: str, root: Path | None = None) -> Path:
    base = root if root is not None else workspaces_root()
    return base / f"{PREFIX}{butler}_{uuid.uuid4().hex}"


@contextmanager
def run_workspace(butler: ButlerConfig, root: Path | None = None) -> Iterator[Path]:
    """Create a private directory for one run and remove it however the block ends."""
    path = workspace_path(butler.name, root)
    path.mkdir(mode=0o700, parents=False, exist_ok=False)
    try:
        skills = butler.directory / "skills"
        if skills.is_dir() and butler.workdir is None:
            (path / "skills").symlink_to(skills, target_is_directory=True)
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)
        if path.exists():
            logger.warning("could not remove the run workspace %s", path)


def files_in(workspace: Path) -> list[str]:
    """The files under ``workspace``, relative and sorted (links are not followed)."""
    found: list[str] = []
    for root, _dirs, files in os.walk(workspace):
        found.extend(str((Path(root) / name).relative_to(workspace)) for name in files)
    return sorted(found)


def mcp_url(
    butler: ButlerConfig, session_key: str, host: str = "localhost", port: int | None = None
) -> str:
    """The butler's MCP endpoint, carrying the session key the server records calls under."""
    return (
        f"http://{host}:{port or butler.port}{butler.mcp_path}"
        f"?session_id={quote(session_key, safe='')}"
    )
