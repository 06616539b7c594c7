"""The processes of one unsandboxed run, found without looking at any other process.

A run's CLI starts in a session of its own, and the spawner terminates that session's
process group when it ends; but a tool the agent daemonised (a double fork into a session
of its own, as Gemini does with every tool) leaves the group and is reparented to pid 1,
out of the run's process tree. What holds every process of the run, and can be waited on,
is a cgroup: a process cannot leave the cgroup it was born in without write access to
another. (A sandboxed run has its pid namespace for that, which its end waits for:
:mod:`spawnkit.containment.pid_namespace`. It gets no cgroup: joining one waits for a kernel
grace period, 8 to 18 ms before the CLI can start.)

So every unsandboxed run gets a cgroup of its own, ``spawnkit-run-<session id>``, made
beside this process's own cgroup (cgroup v2 where it is mounted, else v1's ``cpuacct``).
Its CLI joins it before it is itself (``echo 0 > .../cgroup.procs``, a step of the shell
that then ``exec``s it: :mod:`spawnkit.containment.prelude`), so everything it ever starts
is born inside. At the end of the run :meth:`RunGroup.reap` reads ``cgroup.procs``, kills
what is listed (v2's ``cgroup.kill`` where the kernel has it), waits for them to go and
removes the cgroup: work that grows with the run's processes, never with the host's.

Where no cgroup can be made (no write access to any hierarchy: an unprivileged user
without a delegated subtree, macOS, a container with a read-only ``/sys/fs/cgroup``),
:func:`open_run_group` returns None: the run is then reaped by the scan of
:func:`spawnkit.containment.sweep.reap` (this user's processes carrying the run's marker),
off the event loop. Which one this process uses is decided once (a probe, logged) and
decided again if making a run's cgroup ever fails.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
import signal
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from .prelude import ShellStep, shell_prefix

logger = logging.getLogger(__name__)

PREFIX = "spawnkit-run-"
_PROCS = "cgroup.procs"
# How long reap waits for the killed processes to leave the cgroup.
KILL_WAIT_S = 5.0
# Joins the cgroup whose procs file is the argument (0: the writing process, the shell that
# then becomes the CLI). A CLI that could not join still runs: its cgroup never ran anything,
# and its run is reaped by the scan (RunGroup.ever_ran).
_JOIN = "echo 0 2>/dev/null > {}"


@dataclass(frozen=True)
class Hierarchy:
    """Where this process may make cgroups: the folder of its own cgroup in a hierarchy,
    and the file of that hierarchy that says whether anything ever ran in a cgroup."""

    parent: Path
    usage_file: str  # v2 "cpu.stat" (usage_usec), v1 cpuacct "cpuacct.usage"


@dataclass(frozen=True)
class RunGroup:
    """One run's cgroup: the command line that puts its CLI inside, and its end."""

    path: Path
    usage_file: str

    @property
    def step(self) -> ShellStep:
        """The step that puts the shell starting the CLI inside (see .prelude)."""
        return ShellStep(_JOIN, str(self.path / _PROCS))

    @property
    def argv(self) -> tuple[str, ...]:
        """What goes before the CLI's command line for it to start inside."""
        return tuple(shell_prefix([self.step]))

    def pids(self) -> list[int]:
        return [int(pid) for pid in _read(self.path / _PROCS).split()]

    def ever_ran(self) -> bool:
        """Whether any process ever ran inside (a CLI that could not join leaves it at 0)."""
        first = _read(self.path / self.usage_file).split()[:2]
        if not first:
            return False
        value = first[1] if self.usage_file == "cpu.stat" and len(first) > 1 else first[0]
        return value.isdigit() and int(value) > 0

    def removed_at_once(self) -> bool:
        """Whether the cgroup is gone after one ``rmdir``: the common end of a run, whose
        processes have all exited (the kernel refuses to remove a cgroup with any left)."""
        try:
            self.path.rmdir()
        except FileNotFoundError:
            return True
        except OSError:
            return False
        return True

    def reap(self, wait: float = KILL_WAIT_S) -> list[int]:
        """Kill every process left in the cgroup, remove it; the pids that were there."""
        found = self.pids()
        deadline = time.monotonic() + wait
        if found:
            _kill_all(self)
        while not self._removed(deadline):
            _kill_all(self)  # a process forked while we killed: again
            time.sleep(0.005)
        return found

    async def reap_soon(self, wait: float = KILL_WAIT_S) -> list[int]:
        """:meth:`reap` on the event loop, waiting in ``asyncio.sleep`` rather than in a
        thread: what it reads and writes is the run's own cgroup (a few small files), and a
        sandbox's namespace can take tens of milliseconds to go after bwrap has exited, a
        wait that would hold one of the loop's few executor threads for each ending run."""
        found = self.pids()
        deadline = time.monotonic() + wait
        if found:
            _kill_all(self)
        delay = 0.001
        while not self._removed(deadline):
            _kill_all(self)
            await asyncio.sleep(delay)
            delay = min(delay * 2, 0.02)
        return found

    def _removed(self, deadline: float) -> bool:
        """Try to remove the cgroup: True once it is gone or past ``deadline`` (logged)."""
        try:
            self.path.rmdir()
        except FileNotFoundError:
            pass
        except OSError as exc:
            if exc.errno == errno.EBUSY and time.monotonic() < deadline:
                return False
            logger.warning("run cgroup %s: could not remove it (%s)", self.path, exc)
        return True


def _read(path: Path) -> bytes:
    """A cgroup file's contents (b"" once the cgroup is gone): plain reads, for they are
    made twice a run."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return b""
    chunks: list[bytes] = []
    try:
        while chunk := os.read(fd, 65536):
            chunks.append(chunk)
    except OSError:
        return b""
    finally:
        os.close(fd)
    return b"".join(chunks)


def _kill_all(group: RunGroup) -> None:
    kill = group.path / "cgroup.kill"
    try:
        kill.write_text("1")  # the kernel kills them all at once, forks in flight included
        return
    except FileNotFoundError:
        pass
    except OSError as exc:
        logger.debug("run cgroup %s: cgroup.kill refused (%s)", group.path, exc)
    for pid in group.pids():
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def _own_cgroups() -> dict[str, str]:
    """This process's cgroup path in each hierarchy: "" for v2, else its controllers."""
    paths: dict[str, str] = {}
    with open("/proc/self/cgroup", encoding="utf-8") as fh:
        for line in fh:
            _, controllers, path = line.rstrip("\n").split(":", 2)
            paths[controllers] = path
    return paths


def _mounts() -> list[tuple[str, Path, str]]:
    """(filesystem type, mount point, super options) of each cgroup mount."""
    found = []
    with open("/proc/self/mountinfo", encoding="utf-8") as fh:
        for line in fh:
            fields = line.split()
            rest = fields[fields.index("-") + 1 :]
            if rest[0] in ("cgroup", "cgroup2"):
                found.append((rest[0], Path(fields[4]), rest[2] if len(rest) > 2 else ""))
    return found


def _hierarchies() -> list[Hierarchy]:
    """This process's cgroup in v2, then in v1's cpuacct, where they are mounted."""
    own = _own_cgroups()
    candidates: list[Hierarchy] = []
    for fstype, mount, options in _mounts():
        if fstype == "cgroup2" and "" in own:
            candidates.insert(0, Hierarchy(mount / own[""].lstrip("/"), "cpu.stat"))
        elif fstype == "cgroup" and "cpuacct" in options.split(","):
            key = next((k for k in own if "cpuacct" in k.split(",")), None)
            if key is not None:
                candidates.append(Hierarchy(mount / own[key].lstrip("/"), "cpuacct.usage"))
    return candidates


def _probe(hierarchy: Hierarchy) -> str | None:
    """None if a process can be made to join a cgroup made there, else why not."""
    group = RunGroup(hierarchy.parent / f"{PREFIX}probe-{os.getpid()}", hierarchy.usage_file)
    try:
        group.path.mkdir()
    except OSError as exc:
        return str(exc)
    try:
        done = subprocess.run(
            [*group.argv, "cat", "/proc/self/cgroup"], capture_output=True, text=True,
            timeout=10, check=False, env={"PATH": "/usr/bin:/bin"},
        )  # fmt: skip
        if done.returncode != 0 or f"/{group.path.name}\n" not in done.stdout:
            return done.stderr.strip() or "a process could not join it"
        return None
    except (OSError, subprocess.TimeoutExpired) as exc:
        return str(exc)
    finally:
        group.reap()


_lock = threading.Lock()
_chosen: list[Hierarchy | None] = []  # empty: not decided yet


def _hierarchy() -> Hierarchy | None:
    """Where this process makes its runs' cgroups, probed once; None: nowhere."""
    with _lock:
        if not _chosen:
            _chosen.append(_choose())
        return _chosen[0]


def _choose() -> Hierarchy | None:
    try:
        candidates = _hierarchies()
    except (OSError, ValueError, IndexError) as exc:
        candidates = []
        logger.debug("no cgroup hierarchy found: %s", exc)
    for hierarchy in candidates:
        problem = _probe(hierarchy)
        if problem is None:
            logger.debug("unsandboxed runs get a cgroup of their own in %s", hierarchy.parent)
            return hierarchy
        logger.debug("no run cgroups in %s: %s", hierarchy.parent, problem)
    logger.info(
        "no cgroup can be made here: what an unsandboxed run leaves behind is found by a "
        "scan of this user's processes at its end"
    )
    return None


def usable() -> bool:
    """Whether runs get cgroups of their own here (probing once, if not decided yet)."""
    return _hierarchy() is not None


def decided() -> bool:
    """Whether the probe has run (:func:`open_run_group` is then a mkdir, nothing more)."""
    return bool(_chosen)


def forget_choice() -> None:
    """Decide again at the next run (after a run's cgroup could not be made)."""
    with _lock:
        _chosen.clear()


def open_run_group(session_id: str) -> RunGroup | None:
    """A new cgroup for the run ``session_id``, or None where none can be made."""
    hierarchy = _hierarchy()
    if hierarchy is None:
        return None
    group = RunGroup(hierarchy.parent / f"{PREFIX}{session_id}", hierarchy.usage_file)
    try:
        group.path.mkdir()
    except OSError as exc:
        logger.warning("run %s: no cgroup of its own (%s)", session_id, exc)
        forget_choice()
        return None
    return group


def leftover_groups() -> list[RunGroup]:
    """Every run cgroup beside this process's own, whoever's run it was."""
    try:
        hierarchies = _hierarchies()
    except (OSError, ValueError, IndexError):
        return []
    return [
        RunGroup(path, hierarchy.usage_file)
        for hierarchy in hierarchies
        for path in sorted(hierarchy.parent.glob(f"{PREFIX}*"))
    ]


def leftover_group(session_id: str) -> RunGroup | None:
    """The cgroup a run left beside this process's own (its owner died), if there is one."""
    try:
        hierarchies = _hierarchies()
    except (OSError, ValueError, IndexError):
        return None
    for hierarchy in hierarchies:
        group = RunGroup(hierarchy.parent / f"{PREFIX}{session_id}", hierarchy.usage_file)
        if group.path.is_dir():
            return group
    return None
