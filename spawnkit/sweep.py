"""The start-up sweep: what a dead owner left behind is killed, removed and recorded.

A run's owner (``spawnkit run``, ``serve``, a kernel, a contract worker) cleans up after
itself on every exit it lives through: success, failure, cancel, SIGINT, SIGTERM, SIGHUP.
What it cannot live through (SIGKILL, the OOM killer, a crash of the interpreter) leaves
an open session record, the CLI and its tools still running (reparented to pid 1, still
spending tokens) and the run's workspace. Every start sweeps them up: opening the store,
a :class:`~spawnkit.spawner.Spawner` starting, ``spawnkit sessions``, the notebook
extension loading. :func:`sweep`

1. finds this host's open records whose owner is dead: one indexed query, then a
   ``kill(pid, 0)`` and a read of ``/proc/<pid>/stat`` per open record, and nothing more
   when every owner lives (the common case, so it is cheap on every start). An owner pid
   that is alive but started at another time than the record says was reused by another
   process: that owner is dead too, and nothing of that pid is signalled;
2. finds what is left of those runs: the processes whose environment carries
   ``SPAWNKIT_SESSION_ID=<id>`` (every run's child environment does, and the CLI's tools
   inherit it) and, when both know it, the run's own ``SPAWNKIT_WORKSPACE``, so a
   process of another store's run that reused a chosen id is not taken for it;
3. kills them with SIGKILL (their owner is gone and nobody waits for a graceful exit),
   each through a pidfd opened *before* its start time is checked again, so a pid reused
   between the scan and the kill is never signalled; removes the workspace; and marks the
   record ``crashed`` with what it did. (A CLI's output file, where its stdout is not a
   pipe, has no name: it went with the last process that had it open.)

The store is reached through :class:`SweptStore` only, so this module sits below the
store, which sweeps whenever it is opened.
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
import shutil
import signal
import stat
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from .workspace import PREFIX as WORKSPACE_PREFIX

logger = logging.getLogger(__name__)

SESSION_VAR = "SPAWNKIT_SESSION_ID"
WORKSPACE_VAR = "SPAWNKIT_WORKSPACE"
# How long the sweep waits for the processes it killed to be gone.
KILL_WAIT_S = 5.0
_PROC = Path("/proc")


@dataclass(frozen=True)
class OpenRun:
    """An open session record of this host, as the sweep needs it."""

    session_id: str
    owner_pid: int
    owner_start: str | None
    workspace: Path | None
    # The Dask worker that ran it, for a run dispatched to a cluster (spawnkit.dispatch).
    worker: str | None = None


@dataclass(frozen=True)
class SweptRun:
    """What the sweep did about one run whose owner was dead."""

    session_id: str
    owner_pid: int
    killed: tuple[int, ...]
    survivors: tuple[int, ...]
    workspace: Path | None
    workspace_removed: bool
    reason: str


class SweptStore(Protocol):
    """What the sweep needs of a session store."""

    def open_runs_here(self) -> list[OpenRun]:
        """This host's records that have not completed."""
        ...

    def mark_crashed(self, session_id: str, reason: str) -> bool:
        """Close the record as ``crashed``; False if it was already completed."""
        ...


# -- process facts (Linux /proc) -----------------------------------------------------------


def _stat(pid: int) -> tuple[str, str] | None:
    """(state, start time in clock ticks since boot) of ``pid`` from /proc, or None."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
        return fields[0], fields[19]
    except (OSError, IndexError):
        return None


def process_start(pid: int) -> str | None:
    """The kernel's start time of ``pid``, to tell a process from a later one with its pid."""
    stat = _stat(pid)
    return stat[1] if stat else None


def _live_start(pid: int) -> str | None:
    """The start time of ``pid`` unless it is gone or a zombie (dead, not yet reaped)."""
    stat = _stat(pid)
    return None if stat is None or stat[0] in ("Z", "X") else stat[1]


def owner_alive(pid: int, start: str | None) -> bool:
    """Whether ``pid`` still runs and is the process that started at ``start``."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    if not _PROC.is_dir():
        return True  # no /proc to say more: trust the pid
    current = _live_start(pid)
    return current is not None and (start is None or current == start)


def _ancestry() -> set[int]:
    """This process and its ancestors: never signalled, whatever their environment."""
    pids, pid = set(), os.getpid()
    while pid > 1 and pid not in pids:
        pids.add(pid)
        try:
            pid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[2])
        except (OSError, IndexError, ValueError):
            break
    return pids


def _environ(pid: str) -> bytes | None:
    try:
        with open(f"/proc/{pid}/environ", "rb") as fh:
            return fh.read()
    except OSError:  # gone, or another user's process
        return None


def run_processes(runs: Sequence[OpenRun]) -> dict[str, list[tuple[int, str]]]:
    """Live processes of each run, as (pid, start time), found by their environment markers."""
    found: dict[str, list[tuple[int, str]]] = {run.session_id: [] for run in runs}
    if not runs or not _PROC.is_dir():
        return found
    markers = {f"{SESSION_VAR}={run.session_id}".encode(): run for run in runs}
    spared = _ancestry()
    tag = f"{SESSION_VAR}=".encode()
    # Runs at the end of every failed or cancelled run: plain listdir and open, and most
    # processes are passed over by one substring search.
    for name in os.listdir(_PROC):  # noqa: PTH208 - Path objects cost twice as much here
        if not name.isdigit() or int(name) in spared:
            continue
        raw = _environ(name)
        if not raw or tag not in raw:
            continue
        env = set(raw.split(b"\0"))
        for marker in env & markers.keys():
            run = markers[marker]
            if run.workspace is not None and not _same_workspace(env, run.workspace):
                continue
            start = _live_start(int(name))
            if start is not None:
                found[run.session_id].append((int(name), start))
    return found


def reap(session_id: str, workspace: Path | None) -> list[int]:
    """Kill what is left of a run that is ending in this process; the pids killed.

    A CLI that is stopped can leave its tools behind: Gemini runs them in sessions of
    their own, which terminating the CLI's process group does not reach.
    """
    found = run_processes([OpenRun(session_id, os.getpid(), None, workspace)])
    return kill_processes(found[session_id])


def _same_workspace(env: set[bytes], workspace: Path) -> bool:
    """True unless the process names a different workspace than the record does."""
    prefix = f"{WORKSPACE_VAR}=".encode()
    named = [item[len(prefix) :] for item in env if item.startswith(prefix)]
    return not named or os.fsencode(workspace) in named


# -- killing ----------------------------------------------------------------------------------


def kill_processes(processes: Iterable[tuple[int, str]], wait: float = KILL_WAIT_S) -> list[int]:
    """SIGKILL each (pid, start) that is still that process; the pids signalled.

    A pidfd is opened first and the start time checked after, so the signal reaches the
    process that was found, never one that took its pid since. Waits up to ``wait`` s for
    the signalled processes to be gone.
    """
    signalled: list[int] = []
    with _pidfds(processes) as handles:
        for pid, handle in handles:
            try:
                if handle is None:
                    os.kill(pid, signal.SIGKILL)
                else:
                    signal.pidfd_send_signal(handle, signal.SIGKILL)
            except ProcessLookupError:
                continue
            except PermissionError:
                logger.warning("sweep: not permitted to kill process %d", pid)
                continue
            signalled.append(pid)
        _wait_gone([(pid, h) for pid, h in handles if pid in signalled], wait)
    return signalled


@contextlib.contextmanager
def _pidfds(processes: Iterable[tuple[int, str]]) -> Iterator[list[tuple[int, int | None]]]:
    """(pid, pidfd or None) for each process that is still the one found."""
    handles: list[tuple[int, int | None]] = []
    try:
        for pid, start in processes:
            handle: int | None = None
            if hasattr(os, "pidfd_open"):
                try:
                    handle = os.pidfd_open(pid)
                except ProcessLookupError:
                    continue
                except OSError as exc:  # an old kernel: fall back to a checked kill
                    logger.debug("sweep: no pidfd for %d (%s)", pid, exc)
            if _live_start(pid) != start:
                if handle is not None:
                    os.close(handle)
                continue  # gone, or the pid now belongs to another process
            handles.append((pid, handle))
        yield handles
    finally:
        for _, handle in handles:
            if handle is not None:
                os.close(handle)


def _wait_gone(handles: Sequence[tuple[int, int | None]], wait: float) -> None:
    deadline = time.monotonic() + wait
    for pid, handle in handles:
        remaining = max(0.0, deadline - time.monotonic())
        if handle is not None:
            poller = select.poll()
            poller.register(handle, select.POLLIN)
            poller.poll(remaining * 1000)  # a pidfd is readable once its process has exited
            continue
        while _live_start(pid) is not None and time.monotonic() < deadline:
            time.sleep(0.01)


# -- workspaces -----------------------------------------------------------------------------------


def remove_workspace(path: Path) -> bool | None:
    """Remove a run's workspace; True if removed, None if already gone, False if refused.

    The path comes from a record, so it is checked before anything is deleted: an absolute
    ``butler_*`` directory (not a symlink) owned by this user.
    """
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return None
    except OSError as exc:
        logger.warning("sweep: cannot inspect the workspace %s: %s", path, exc)
        return False
    if (
        not path.is_absolute()
        or not path.name.startswith(WORKSPACE_PREFIX)
        or not stat.S_ISDIR(info.st_mode)
        or info.st_uid != os.getuid()
    ):
        logger.warning("sweep: %s does not look like a run workspace; left alone", path)
        return False
    shutil.rmtree(path, ignore_errors=True)
    if path.exists():
        logger.warning("sweep: could not remove the workspace %s", path)
        return False
    return True


# -- the sweep ---------------------------------------------------------------------------------


def sweep(store: SweptStore) -> list[SweptRun]:
    """Kill, remove and record what this host's dead owners left behind; what was done."""
    runs = store.open_runs_here()
    dead = [run for run in runs if not owner_alive(run.owner_pid, run.owner_start)]
    if not dead:
        return []
    processes = run_processes(dead)
    swept = []
    for run in dead:
        found = processes[run.session_id]
        killed = kill_processes(found)
        survivors = tuple(pid for pid, start in found if _live_start(pid) == start)
        removed = remove_workspace(run.workspace) if run.workspace is not None else None
        reason = _reason(run, len(killed), survivors, removed)
        if store.mark_crashed(run.session_id, reason):
            logger.warning("session %s: %s", run.session_id, reason)
        swept.append(
            SweptRun(
                run.session_id, run.owner_pid, tuple(killed), survivors, run.workspace,
                bool(removed), reason,
            )
        )  # fmt: skip
    return swept


def _reason(run: OpenRun, killed: int, survivors: Sequence[int], removed: bool | None) -> str:
    """One line for the record, e.g. "... died before it completed; 3 leftover processes
    killed, workspace removed"."""
    done = [f"{killed} leftover process{'es' if killed != 1 else ''} killed" if killed
            else "no leftover processes"]  # fmt: skip
    if survivors:
        done.append(f"could not kill pid {', '.join(map(str, survivors))}")
    if run.workspace is not None:
        if removed is None:
            done.append("workspace already gone")
        elif removed:
            done.append("workspace removed")
        else:
            done.append(f"workspace {run.workspace} could not be removed")
    owner = f"the process that ran this session (pid {run.owner_pid}) died before it completed"
    if run.worker is not None:
        owner = (
            f"worker lost: the Dask worker {run.worker} (pid {run.owner_pid}) that ran this "
            "session died before it completed; it is not run again"
        )
    return f"{owner}; {', '.join(done)}"
