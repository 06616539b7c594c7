"""The worktree of a run given ``repo=``: made when the run gets its slot, gone when it ends.

A trigger with ``repo=PATH`` is checked before it is accepted (a path that is no git
repository with a commit is a one-line :class:`~spawnkit.errors.ConfigError`). Once the run
holds its slot, :func:`checked_out` makes its worktree (:class:`~spawnkit.worktree.Checkout`:
``HEAD`` plus the repository's uncommitted changes), runs the attempts in it as the run's
``workdir``, and, whatever ends the run (success, failure, a cancel, a CLI killed), takes
the diff (redacted like everything that leaves a run) and removes the worktree. The record
names the repository, its base commit and the worktree from the run's setup on (so a
crashed run's leftovers can be told), and keeps the diff when the run ends
(``given.repo``, :meth:`Recorder.close <spawnkit.run.recording.Recorder.close>`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from ..errors import ConfigError, InvalidArgument
from ..worktree import Checkout, RepoChange, RepoStart
from .accepted import AcceptedRun
from .request import RunKind

logger = logging.getLogger(__name__)


def checked_repo(
    repo: str | Path | None, *, kind: RunKind, workdir: Path | None, on_cluster: bool
) -> RepoStart | None:
    """The repository a trigger's ``repo=`` names, checked; None without one."""
    if repo is None:
        return None
    if kind != "run":
        raise InvalidArgument(f"repo= is for runs, not {kind} runs")
    if workdir is not None:
        raise InvalidArgument("give repo= or workdir=, not both: the worktree is the workdir")
    if on_cluster:
        raise ConfigError("repo= runs here, not on a cluster: its worktree is on this machine")
    return RepoStart.of(repo)


@contextlib.asynccontextmanager
async def checked_out(run: AcceptedRun) -> AsyncIterator[None]:
    """The run's worktree as its ``workdir`` while the body runs; afterwards its change is
    ``run.repo_change`` and the worktree is removed, even when the body is cancelled."""
    if run.repo is None:
        yield
        return
    checkout = Checkout(run.repo, run.session_id)
    # Shielded: a cancel while git makes the worktree lets it finish, then removes it.
    making = asyncio.ensure_future(asyncio.to_thread(checkout.make))
    try:
        run.workdir = await asyncio.shield(making)
        run.checkout = checkout
        yield
    finally:
        finishing = asyncio.ensure_future(_finish(making, checkout, run.redactor.text))
        try:
            run.repo_change = await asyncio.shield(finishing)
        except asyncio.CancelledError:
            # Cancelled again while the diff is taken: the worktree is still removed.
            logger.warning("run %s: cancelled while its diff was taken", run.session_id)


async def _finish(
    making: asyncio.Future[Path], checkout: Checkout, redact: Any
) -> RepoChange | None:
    """The change of a worktree that was made (None for one that was not), then its removal."""
    await asyncio.wait({making})
    made = not making.cancelled() and making.exception() is None
    return await asyncio.to_thread(_change_then_remove, checkout, redact if made else None)


def _change_then_remove(checkout: Checkout, redact: Any) -> RepoChange | None:
    """``redact`` None: the worktree was never made whole; only what is left is removed."""
    try:
        return checkout.change(redact) if redact is not None else None
    except ConfigError as exc:
        logger.warning("could not take the diff of %s: %s", checkout.path, exc)
        return None
    finally:
        checkout.remove()


def repo_given(checkout: Checkout) -> dict[str, Any]:
    """What the run's record says of its repository while the run goes on."""
    return {
        "repo": str(checkout.repo),
        "base_commit": checkout.base_commit,
        "worktree": str(checkout.path),
        "carried": list(checkout.carried),
        "left_out": list(checkout.left_out),
    }
