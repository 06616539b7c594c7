"""Reading an agent CLI's version: once per binary, bounded, with nothing of ours in its env.

``claude -v`` or ``codex --version`` is still the CLI running: it gets what a run gets
and no more, which here is less than a run: ``PATH``, a scratch ``HOME`` and ``TMPDIR``
(removed afterwards, so nothing is written into the user's home), and whatever the
adapter says makes the CLI answer quickly. It never sees the parent's keys.

It runs through :func:`spawnkit._process.run_lines` (its own process group, output read
as it comes) under a timeout, so a CLI that hangs costs at most that timeout plus the
group's termination grace, never blocks the event loop, and leaves no process behind.
The answer is kept per binary (its path, size and modification time: an upgraded CLI is
asked again) for the life of the process; concurrent first callers share one check.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import tempfile
import weakref
from collections.abc import Mapping, Sequence
from pathlib import Path

from .. import _process

logger = logging.getLogger(__name__)

VERSION_TIMEOUT_S = 20.0
_MAX_LINE = 4096

_Key = tuple[str, int, int, tuple[str, ...]]
_known: dict[_Key, str | None] = {}
_pending: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[_Key, asyncio.Task[str | None]]]
_pending = weakref.WeakKeyDictionary()


async def cli_version(
    binary: Path,
    args: Sequence[str] = ("--version",),
    env: Mapping[str, str] | None = None,
    timeout: float | None = None,  # noqa: ASYNC109 - the bound is the point
) -> str | None:
    """The first line ``binary ARGS`` prints, or None if it fails, is silent or times out.

    ``timeout`` defaults to :data:`VERSION_TIMEOUT_S`.
    """
    try:
        info = binary.stat()  # noqa: ASYNC240 - one stat: microseconds
    except OSError as exc:
        logger.warning("cannot read the version of %s: %s", binary, exc)
        return None
    key = (str(binary), info.st_size, info.st_mtime_ns, tuple(args))
    if key in _known:
        return _known[key]
    pending = _pending.setdefault(asyncio.get_running_loop(), {})
    task = pending.get(key)
    if task is None:
        bound = VERSION_TIMEOUT_S if timeout is None else timeout
        task = asyncio.create_task(_ask(binary, args, env or {}, bound))
        pending[key] = task
    try:
        version = await asyncio.shield(task)
    finally:
        if task.done():
            pending.pop(key, None)
    _known[key] = version
    return version


async def _ask(
    binary: Path,
    args: Sequence[str],
    extra_env: Mapping[str, str],
    timeout: float,  # noqa: ASYNC109
) -> str | None:
    scratch = Path(tempfile.mkdtemp(prefix="spawnkit-version-"))
    env = {"PATH": os.environ.get("PATH", os.defpath), "HOME": str(scratch),
           "TMPDIR": str(scratch), **extra_env}  # fmt: skip
    lines: list[str] = []

    def keep(line: str, truncated: bool) -> None:
        if line.strip() and not lines:
            lines.append(line.strip())

    try:
        async with asyncio.timeout(timeout):
            code = await _process.run_lines(
                [str(binary), *args], env=env, cwd=scratch, on_stdout=keep,
                on_stderr=lambda line, truncated: None, max_line=_MAX_LINE,
            )  # fmt: skip
    except TimeoutError:
        logger.warning("%s %s did not answer within %g s", binary, " ".join(args), timeout)
        return None
    except OSError as exc:
        logger.warning("cannot read the version of %s: %s", binary, exc)
        return None
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    if code != 0:
        logger.warning("%s %s exited with code %d", binary, " ".join(args), code)
        return None
    return lines[0] if lines else None
