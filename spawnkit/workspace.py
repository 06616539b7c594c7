"""The ephemeral directory of one run: ``<tempdir>/butler_<name>_<uuid>/``.

It holds the runtime's MCP config (and, for Claude Code, the environment
filter that starts the CLI). Two runs never share one, and the directory is
removed when the run ends, on success, failure, exception and cancellation
alike: :func:`run_workspace` is the only way the spawner creates one.
"""

from __future__ import annotations

import logging
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import quote

from .roster import ButlerConfig

logger = logging.getLogger(__name__)

PREFIX = "butler_"


def workspace_path(butler: str, root: Path | None = None) -> Path:
    base = root if root is not None else Path(tempfile.gettempdir())
    return base / f"{PREFIX}{butler}_{uuid.uuid4().hex}"


@contextmanager
def run_workspace(butler: str, root: Path | None = None) -> Iterator[Path]:
    """Create a private directory for one run and remove it however the block ends."""
    path = workspace_path(butler, root)
    path.mkdir(mode=0o700, parents=False, exist_ok=False)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)
        if path.exists():
            logger.warning("could not remove the run workspace %s", path)


def mcp_url(
    butler: ButlerConfig, session_key: str, host: str = "localhost", port: int | None = None
) -> str:
    """The butler's MCP endpoint, carrying the session key the server records calls under."""
    return (
        f"http://{host}:{port or butler.port}{butler.mcp_path}"
        f"?session_id={quote(session_key, safe='')}"
    )
