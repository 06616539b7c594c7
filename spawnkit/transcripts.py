"""Keeping what a CLI wrote in its run's home after the run's workspace is gone.

A run's CLI writes its own transcripts (Claude Code's ``projects/``, Codex's ``sessions/``,
Gemini's ``tmp/``) under the run's HOME, inside the sandbox. When the run ends, the spawner
copies them to ``$SPAWNKIT_HOME/runtimes/<runtime>/`` (so history and ``resume`` find them),
redacting the secrets the run was given; a later ``resume`` copies one of them back into the
new run's home. Both directions run outside the sandbox with the user's own rights, so they
copy regular files only and never follow a link: a run that planted a link to ``~/.ssh``
in its transcripts folder gets nothing copied.
"""

from __future__ import annotations

import logging
import os
import stat
from collections.abc import Callable
from pathlib import Path

logger = logging.getLogger(__name__)

Redact = Callable[[str], str]
# A transcript larger than this is not kept (a warning says so).
MAX_FILE_BYTES = 256 << 20


def copy_tree(source: Path, target: Path, redact: Redact | None = None) -> int:
    """Copy the regular files under ``source`` to the same relative paths under ``target``.

    Returns how many files were copied. Links are skipped, and so is anything whose path
    leads through one; existing files in ``target`` are replaced atomically.
    """
    if not _is_real_dir(source):
        return 0
    copied = 0
    for root, dirs, files in os.walk(source, followlinks=False):
        here = Path(root)
        dirs[:] = [d for d in dirs if _is_real_dir(here / d)]
        for name in files:
            if copy_file(here / name, target / (here / name).relative_to(source), redact):
                copied += 1
    return copied


def copy_file(source: Path, target: Path, redact: Redact | None = None) -> bool:
    """Copy one regular file (never through a link), redacting its text; False if skipped."""
    try:
        fd = os.open(source, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError as exc:
        logger.debug("not keeping %s: %s", source, exc)
        return False
    with os.fdopen(fd, "rb") as fh:
        info = os.fstat(fh.fileno())
        if not stat.S_ISREG(info.st_mode) or info.st_size > MAX_FILE_BYTES:
            logger.warning("not keeping %s: not a regular file of at most %d bytes", source,
                           MAX_FILE_BYTES)  # fmt: skip
            return False
        data = fh.read()
    if redact is not None:
        data = redact(data.decode("utf-8", "surrogateescape")).encode("utf-8", "surrogateescape")
    target.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    partial = target.with_name(f".{target.name}.partial")
    partial.write_bytes(data)
    partial.chmod(0o600)
    partial.replace(target)
    return True


def _is_real_dir(path: Path) -> bool:
    try:
        return stat.S_ISDIR(os.lstat(path).st_mode)
    except OSError:
        return False
