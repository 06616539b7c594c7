"""A run's workspace is removed off the event loop, and the run ends only after it is gone
(a cancellation meanwhile included): a slow disk stalls no other run."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import pytest

from spawnkit.containment import workspace as workspace_module
from spawnkit.run import Spawner
from spawnkit.store import SessionStore

from .conftest import RosterFactory

ECHO = """
[butler.runtime]
type = "command"
command = ["/bin/echo", "done"]
stdin = "prompt"
[butler.sandbox]
mode = "none"
"""


@pytest.fixture
def slow_removal(monkeypatch: pytest.MonkeyPatch):
    """Removal that waits for a go-ahead, and says (from its thread) when it began."""
    began, go = threading.Event(), threading.Event()
    removed: list[Path] = []
    real = workspace_module.remove

    def remove(path: Path) -> None:
        began.set()
        assert go.wait(60), "the test never let the removal finish"
        real(path)
        removed.append(path)

    monkeypatch.setattr(workspace_module, "remove", remove)
    return began, go, removed


async def _until(event: threading.Event) -> None:
    async with asyncio.timeout(60):
        while not event.is_set():
            await asyncio.sleep(0.01)


async def test_the_loop_runs_while_a_workspace_is_removed(
    make_butler: RosterFactory, store: SessionStore, slow_removal
) -> None:
    began, go, removed = slow_removal
    run = asyncio.ensure_future(Spawner(make_butler("echo", extra=ECHO), store=store).trigger("hi"))
    await _until(began)
    ticks = 0
    for _ in range(3):  # the loop turns while the removal waits in its thread
        await asyncio.sleep(0)
        ticks += 1
    assert ticks == 3 and not run.done(), "the run waits for its workspace to be gone"
    go.set()
    result = await run
    assert result.success, result.error
    (path,) = removed
    assert not path.exists()


async def test_a_cancel_during_removal_still_waits_for_it(
    make_butler: RosterFactory, store: SessionStore, slow_removal
) -> None:
    began, go, removed = slow_removal
    run = asyncio.ensure_future(Spawner(make_butler("echo", extra=ECHO), store=store).trigger("hi"))
    await _until(began)
    run.cancel()
    for _ in range(5):
        await asyncio.sleep(0)
    assert not run.done(), "a cancel does not end the run before its workspace is removed"
    go.set()
    with pytest.raises(asyncio.CancelledError):
        await run
    (path,) = removed
    assert not path.exists()
    # The workspace goes in the thread that completes the record, once the run's result
    # is decided (one thread hop for a run's end): the cancel reached the caller, and the
    # run, over by then, keeps its one record with the result it had.
    assert [r.status for r in store.list_sessions()] == ["success"]


async def test_an_unsandboxed_runs_leftovers_are_looked_for_off_the_loop(
    make_butler: RosterFactory, store: SessionStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where no cgroup can be made, an unsandboxed run is reaped by a scan of this user's
    processes, which grows with their number: it runs in a thread. (With a cgroup, what runs
    on the loop is one rmdir of the emptied cgroup: tests/test_run_group.py.)"""
    from spawnkit.containment import run_group
    from spawnkit.run import attempts

    monkeypatch.setattr(run_group, "_chosen", [None])  # decided: no cgroup here

    scanned: list[tuple[str, bool]] = []
    real = attempts.reap

    def reap(session_id: str, workspace: Path | None, group: object = None) -> list[int]:
        scanned.append((session_id, threading.current_thread() is threading.main_thread()))
        return real(session_id, workspace, group)  # type: ignore[arg-type]

    monkeypatch.setattr(attempts, "reap", reap)
    result = await Spawner(make_butler("echo", extra=ECHO), store=store).trigger("hi")
    assert result.success, result.error
    assert scanned == [(result.session_id, False)]
