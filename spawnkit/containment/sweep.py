"""The start-up sweep: what a dead owner left behind is killed, removed and recorded.

A run's owner (``spawnkit run``, ``serve``, a kernel, a contract worker) cleans up after
itself on every exit it lives through: success, failure, cancel, SIGINT, SIGTERM, SIGHUP.
What it cannot live through (SIGKILL, the OOM killer, a crash of the interpreter) leaves
an open session record, the CLI and its tools still running (reparented to pid 1, still
spending tokens) and the run's workspace. Every start sweeps them up: opening the store,
a :class:`~spawnkit.run.Spawner` starting, ``spawnkit sessions``, the notebook
extension loading. :func:`sweep`

1. finds this host's open records whose owner is dead: one indexed query, then a
   ``kill(pid, 0)`` and a read of ``/proc/<pid>/stat`` per open record, and nothing more
   when every owner lives (the common case, so it is cheap on every start). An owner pid
   that is alive but started at another time than the record says was reused by another
   process: that owner is dead too, and nothing of that pid is signalled;
2. trusts a record only as far as this home wrote it. A record is a row anyone who can
   write the store can forge (a team member on a shared PostgreSQL store, naming this
   host). Each record carries a seal (:class:`HomeSeal`): an HMAC, under a key only this
   home holds (``<home>/sweep.key``, 0600), of its id, host, owner pid and start time, and
   workspace. A record sealed by another home on this host is that home's to sweep and is
   left alone; one with no valid seal of this home is only marked ``crashed``: nothing is
   killed or removed for it;
3. finds what is left of a sealed run: the processes of this user whose environment
   carries ``SPAWNKIT_SESSION_ID=<id>`` (every run's child environment does, and the CLI's
   tools inherit it), this home's ``SPAWNKIT_RUN_HOME`` and, when the record names one,
   the run's own ``SPAWNKIT_WORKSPACE``, so a process of another home's run that shares
   the id is never taken for it;
4. kills them with SIGKILL (their owner is gone and nobody waits for a graceful exit),
   each through a pidfd opened *before* its start time is checked again, so a pid reused
   between the scan and the kill is never signalled; removes the workspace, only if it is
   a real folder of this user directly inside this home's ``workspaces`` folder (symlinks
   resolved), and the folder of a ``repo=`` run's worktree (``worktrees/<session id>``); and
   marks the record ``crashed`` with what it did. An unsandboxed run's cgroup
   (:mod:`spawnkit.containment.run_group`), when one is left beside this process's own, is
   emptied and removed as well. (A CLI's output file,
   where its stdout is not a pipe, has no name: it went with the last process that had it
   open.)

The store is reached through :class:`SweptStore` only, so this module sits below the
store, which sweeps whenever it is opened.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import hmac
import logging
import os
import re
import secrets
import select
import shutil
import signal
import stat
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Protocol

from ..errors import HomeNotWritable
from ..home import home_path, spawnkit_home
from ..worktree import WORKTREES_DIR
from . import pid_namespace
from .liveness import PROC as _PROC
from .liveness import live_start as _live_start
from .liveness import owner_alive
from .run_group import RunGroup, leftover_group
from .workspace import PREFIX as WORKSPACE_PREFIX
from .workspace import WORKSPACES_DIR, session_suffix

logger = logging.getLogger(__name__)

SESSION_VAR = "SPAWNKIT_SESSION_ID"
WORKSPACE_VAR = "SPAWNKIT_WORKSPACE"
# The real path of the home whose spawner started the run, in every run's environment.
HOME_VAR = "SPAWNKIT_RUN_HOME"
# The home's sealing key (random, owner-only); never leaves the home.
KEY_FILE = "sweep.key"
# butler_<name>_<32 hex digits>: of sha256(session id) for a run's first workspace, of a
# uuid4 for another (spawnkit.containment.workspace._make_workspace).
_WORKSPACE_NAME = re.compile(re.escape(WORKSPACE_PREFIX) + r".+_[0-9a-f]{32}")
_PLAIN_NAME = re.compile(r"[A-Za-z0-9._-]+")
# How long the sweep waits for the processes it killed to be gone.
KILL_WAIT_S = 5.0


@dataclass(frozen=True)
class OpenRun:
    """An open session record of this host, as the sweep needs it."""

    session_id: str
    owner_pid: int
    owner_start: str | None
    workspace: Path | None
    # The Dask worker that ran it, for a run dispatched to a cluster (spawnkit.run.dispatch).
    worker: str | None = None
    # The host the record names, and its seal (HomeSeal.seal); None on an older record.
    host: str = ""
    seal: str | None = None


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


# -- which records this home wrote ------------------------------------------------------------

Verdict = Literal["ours", "unproven", "foreign"]


class HomeSeal:
    """A home's key, which seals the records its runs write and tells them apart.

    A seal is ``<home id>.<HMAC-SHA256>``: the home id (a digest of the key, not secret)
    says which home wrote a record, the HMAC that the record's owner and workspace are
    the ones that home wrote. Whoever can write the store can copy a home id, not make an
    HMAC without the key.
    """

    def __init__(self, key: bytes) -> None:
        self._key = key
        self.home_id = hashlib.sha256(b"spawnkit home id\0" + key).hexdigest()[:16]

    def seal(
        self, session_id: str, host: str, pid: int, start: str | None, workspace: Path | None
    ) -> str:
        fields = (session_id, host, str(pid), start or "", os.fsdecode(workspace or ""))
        mac = hmac.new(self._key, "\0".join(fields).encode(), hashlib.sha256).hexdigest()
        return f"{self.home_id}.{mac}"

    def verdict(self, run: OpenRun) -> Verdict:
        """Whether this home wrote ``run`` as it stands: "ours"; another home on this host
        did ("foreign", left to that home's sweep); or nobody can tell ("unproven": no
        seal, or one with this home's id that does not match)."""
        if run.seal is None:
            return "unproven"
        if run.seal.partition(".")[0] != self.home_id:
            return "foreign"
        expected = self.seal(run.session_id, run.host, run.owner_pid, run.owner_start,
                             run.workspace)  # fmt: skip
        return "ours" if hmac.compare_digest(run.seal, expected) else "unproven"

    @classmethod
    def of_home(cls, create: bool = False) -> HomeSeal | None:
        """The seal of the current home (``$SPAWNKIT_HOME``): its key file, created when
        ``create`` and missing; None when there is none (or it cannot be made or read)."""
        try:
            home = spawnkit_home() if create else home_path()
            path = home / KEY_FILE
            if create and not path.exists():
                _create_key(path)
            key = path.read_bytes()
        except FileNotFoundError:
            return None
        except (OSError, HomeNotWritable) as exc:
            logger.warning("sweep: no sealing key in the home (%s): records go unsealed", exc)
            return None
        return cls(key) if len(key) >= 32 else None


def _create_key(path: Path) -> None:
    """Write a new random key at ``path`` unless another process wrote one first."""
    spare = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}")
    fd = os.open(spare, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.write(fd, secrets.token_bytes(32))
    finally:
        os.close(fd)
    try:
        os.link(spare, path)  # never replaces a key records may be sealed with
    except FileExistsError:
        pass
    finally:
        spare.unlink()


def run_home() -> str:
    """What :data:`HOME_VAR` says in the environment of this home's runs: its real path.

    Resolved once per home path (every run asks): a home that is a symlink turned to
    another folder while this process runs keeps the real path it had.
    """
    return _real_path(os.fspath(home_path()))


@functools.lru_cache(maxsize=16)
def _real_path(path: str) -> str:
    return os.path.realpath(path)


# -- process facts (Linux /proc) -----------------------------------------------------------


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
    """The environment of ``pid`` if it is a process of this user; None otherwise."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as fh:
            if os.fstat(fh.fileno()).st_uid != os.getuid():
                return None  # another user's (root can read it): never this home's run
            return fh.read()
    except OSError:  # gone, or another user's process
        return None


def run_processes(runs: Sequence[OpenRun]) -> dict[str, list[tuple[int, str]]]:
    """Live processes of each run of this home, as (pid, start time).

    A process is a run's when it is this user's and its environment carries the run's
    session id, this home (:func:`run_home`) and, when the record names it, the run's
    workspace: a process of another home's run that shares the id is never taken for it.
    """
    found: dict[str, list[tuple[int, str]]] = {run.session_id: [] for run in runs}
    if not runs or not _PROC.is_dir():
        return found
    markers = {f"{SESSION_VAR}={run.session_id}".encode(): run for run in runs}
    home = f"{HOME_VAR}={run_home()}".encode()
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
        if home not in env:
            continue
        for marker in env & markers.keys():
            run = markers[marker]
            if run.workspace is not None and not _same_workspace(env, run.workspace):
                continue
            start = _live_start(int(name))
            if start is not None:
                found[run.session_id].append((int(name), start))
    return found


def reap(session_id: str, workspace: Path | None, group: RunGroup | None = None) -> list[int]:
    """Kill what is left of a run that is ending in this process; the pids killed.

    A CLI that is stopped can leave its tools behind: Gemini runs them in sessions of
    their own, which terminating the CLI's process group does not reach. A run with a
    cgroup of its own (:mod:`spawnkit.containment.run_group`) is reaped through it, looking
    at no other process; one without (none could be made, or its CLI could not join it)
    by a scan of this user's processes for its marker.
    """
    if group is not None:
        if group.ever_ran():
            return group.reap()
        group.reap()  # its CLI never joined it: removed, and the scan below looks
    found = run_processes([OpenRun(session_id, os.getpid(), None, workspace)])
    return kill_processes(found[session_id])


def _same_workspace(env: set[bytes], workspace: Path) -> bool:
    """Whether the process names the workspace the record does."""
    return f"{WORKSPACE_VAR}=".encode() + os.fsencode(workspace) in env


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


def remove_workspace(path: Path, root: Path | None = None) -> bool | None:
    """Remove a run's workspace; True if removed, None if already gone, False if refused.

    The path comes from a record, so it is checked before anything is deleted: it must
    resolve (symlinks followed) to a direct child of the real ``root`` (by default this
    home's workspaces folder), named like a workspace, itself a real directory (not a
    symlink) owned by this user. What is removed is that resolved path.
    """
    if root is None:
        root = home_path() / WORKSPACES_DIR
    with contextlib.suppress(OSError):  # what bwrap wrote of its namespace, if it ran
        pid_namespace.info_path(path).unlink()
    target = _own_workspace(path, root)
    if target is None:
        return None if not os.path.lexists(path) else False
    shutil.rmtree(target, ignore_errors=True)
    if os.path.lexists(target):
        logger.warning("sweep: could not remove the workspace %s", target)
        return False
    return True


def remove_unnamed_workspace(session_id: str, root: Path | None = None) -> bool | None:
    """Remove the workspace of a run whose owner died before its record named one (while
    the run was being assembled), found by the name its session id gives it
    (:func:`~spawnkit.containment.workspace.session_suffix`); None if there is none."""
    if root is None:
        root = home_path() / WORKSPACES_DIR
    found = sorted(root.glob(f"{WORKSPACE_PREFIX}*_{session_suffix(session_id)}"))
    if not found:
        return None
    return all([remove_workspace(path, root) for path in found])


def _own_workspace(path: Path, root: Path) -> Path | None:
    """The real path of ``path`` if it is a workspace the sweep may remove, else None."""
    if not path.is_absolute():
        logger.warning("sweep: the workspace %s is not an absolute path; left alone", path)
        return None
    real_root = Path(os.path.realpath(root))
    target = Path(os.path.realpath(path))
    if target.parent != real_root or target.name != path.name:
        if os.path.lexists(path):
            logger.warning("sweep: %s is not inside %s; left alone", path, real_root)
        return None
    try:
        info = os.lstat(target)
    except FileNotFoundError:
        return None
    except OSError as exc:
        logger.warning("sweep: cannot inspect the workspace %s: %s", path, exc)
        return None
    if (
        not _WORKSPACE_NAME.fullmatch(target.name)
        or not stat.S_ISDIR(info.st_mode)
        or info.st_uid != os.getuid()
    ):
        logger.warning("sweep: %s does not look like a run workspace; left alone", path)
        return None
    return target


def remove_worktree_folder(session_id: str, root: Path | None = None) -> bool:
    """Remove the folder of a ``repo=`` run's worktree and objects, if there is one.

    Its path is this home's, named by the session id (not read from the record), and it
    is removed only as a real folder of this user. The repository's ``.git/worktrees``
    entry of it is left for git to prune (the next ``repo=`` run of that repository does,
    and ``git worktree prune``): running git on a path a record names is not the sweep's.
    """
    if not _PLAIN_NAME.fullmatch(session_id) or session_id in (".", ".."):
        return False
    target = (root if root is not None else home_path() / WORKTREES_DIR) / session_id
    try:
        info = os.lstat(target)
    except OSError:
        return False
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid():
        logger.warning("sweep: %s does not look like a run's worktree folder; left alone", target)
        return False
    shutil.rmtree(target, ignore_errors=True)
    return not os.path.lexists(target)


# -- the sweep ---------------------------------------------------------------------------------


def sweep(store: SweptStore, runs: Sequence[OpenRun] | None = None) -> list[SweptRun]:
    """Kill, remove and record what this home's dead owners left behind; what was done.

    ``runs``: this host's open runs, when the caller has read them already."""
    runs = store.open_runs_here() if runs is None else runs
    dead = [run for run in runs if not owner_alive(run.owner_pid, run.owner_start)]
    if not dead:
        return []
    verdicts = _verdicts(dead)
    dead = [run for run in dead if verdicts[run.session_id] != "foreign"]
    processes = run_processes([run for run in dead if verdicts[run.session_id] == "ours"])
    swept = []
    for run in dead:
        if verdicts[run.session_id] == "ours":
            found = processes[run.session_id]
            killed = kill_processes(found)
            if (group := leftover_group(run.session_id)) is not None:
                killed += [pid for pid in group.reap() if pid not in killed]
            survivors = tuple(pid for pid, start in found if _live_start(pid) == start)
            removed = (
                remove_workspace(run.workspace)
                if run.workspace is not None
                else remove_unnamed_workspace(run.session_id)
            )
            reason = _reason(run, len(killed), survivors, removed)
            if remove_worktree_folder(run.session_id):
                reason += ", its repository worktree removed"
        else:
            killed, survivors, removed = [], (), False
            reason = _unproven_reason(run)
        if store.mark_crashed(run.session_id, reason):
            logger.warning("session %s: %s", run.session_id, reason)
        swept.append(
            SweptRun(
                run.session_id, run.owner_pid, tuple(killed), survivors, run.workspace,
                bool(removed), reason,
            )
        )  # fmt: skip
    return swept


def _verdicts(runs: Sequence[OpenRun]) -> dict[str, Verdict]:
    """Which of ``runs`` this home wrote (:meth:`HomeSeal.verdict`); another home's are
    left to its own sweep, and logged."""
    seal = HomeSeal.of_home()
    verdicts: dict[str, Verdict] = {}
    for run in runs:
        if seal is None:
            verdicts[run.session_id] = "unproven" if run.seal is None else "foreign"
        else:
            verdicts[run.session_id] = seal.verdict(run)
        if verdicts[run.session_id] == "foreign":
            logger.info("sweep: session %s belongs to another home; left alone", run.session_id)
    return verdicts


def _unproven_reason(run: OpenRun) -> str:
    return (
        f"the process that ran this session (pid {run.owner_pid}) died before it completed; "
        "its record does not carry this home's seal, so nothing was killed or removed for it"
    )


def _reason(run: OpenRun, killed: int, survivors: Sequence[int], removed: bool | None) -> str:
    """One line for the record, e.g. "... died before it completed; 3 leftover processes
    killed, workspace removed"."""
    done = [f"{killed} leftover process{'es' if killed != 1 else ''} killed" if killed
            else "no leftover processes"]  # fmt: skip
    if survivors:
        done.append(f"could not kill pid {', '.join(map(str, survivors))}")
    if run.workspace is None and removed:
        done.append("its unrecorded workspace removed")
    elif run.workspace is not None:
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
