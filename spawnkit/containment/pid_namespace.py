"""The end of a sandboxed run: waiting until its pid namespace is gone, without a cgroup.

Everything a sandboxed run starts lives in the pid namespace bwrap makes for it: a tool the
agent daemonised cannot leave it, and when the namespace's init (bwrap's pid 1) dies the
kernel kills every other process in it and waits for them before that init's own exit is
done. But bwrap's outer process, the one the spawner started and sees exit, does not wait
for that init: the CLI's exit ends it, and the init, killed with it (``--die-with-parent``),
takes the rest down a moment later. A run recorded at bwrap's exit could still have
processes for that moment; a cancelled one, whose bwrap was killed, longer.

So bwrap writes the init's pid and the namespace's id (``--info-fd``, right after it clones
the init and before that runs anything) to a file outside the sandbox's view
(:func:`info_path`: the shell that starts bwrap opens it, a step of
:mod:`spawnkit.containment.prelude`), and the run's end waits on a pidfd of that init
(:func:`running_init`, :func:`wait_gone`): it is readable once the init has exited, which
is after the kernel has reaped every process of the namespace. Before waiting, the pid is
checked to still be that namespace's init (a pid is reused once its process is gone: then
the namespace is gone too).

This replaced a cgroup per sandboxed run: moving the process that becomes bwrap into a new
cgroup (``echo 0 > cgroup.procs``) waits for an RCU grace period in the kernel, 8 to 18 ms
before every sandboxed CLI could start (docs/benchmarks.md). Unsandboxed runs still get
one (:mod:`spawnkit.containment.run_group`): nothing else holds what they start.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
from pathlib import Path

from ..home import home_path, spawnkit_home
from .prelude import ShellStep

logger = logging.getLogger(__name__)

# The descriptor bwrap writes its --info-fd to (9 is the seccomp filter's).
INFO_FD = 8
# How long the end of a run waits for the namespace to go before it kills the init.
GONE_WAIT_S = 5.0
_FOLDER = "sandbox"


def info_path(workspace: Path) -> Path:
    """Where bwrap tells the run's namespace: ``$SPAWNKIT_HOME/sandbox/ns-<workspace>.json``,
    a folder no sandbox sees (the agent can neither read nor replace it)."""
    return home_path() / _FOLDER / f"ns-{workspace.name}.json"


def info_step(path: Path) -> ShellStep:
    """The shell step that opens ``path`` as bwrap's :data:`INFO_FD` (its folder made first,
    once a process: a home without a seccomp filter has none yet)."""
    if not path.parent.is_dir():
        (spawnkit_home() / _FOLDER).mkdir(mode=0o700, exist_ok=True)
    # `command`: a failed redirection returns, and the start ends with 126 (see sandbox).
    return ShellStep(f"command exec {INFO_FD}>{{}} || exit 126", str(path))


def bwrap_args() -> list[str]:
    return ["--info-fd", str(INFO_FD)]


def namespace_init(path: Path) -> tuple[int, int] | None:
    """(the init's pid, the pid namespace's inode) that bwrap wrote to ``path``; None if it
    wrote nothing (it failed before making the namespace) or the file is gone."""
    try:
        info = json.loads(path.read_bytes() or b"null")
    except (OSError, ValueError):
        return None
    if not isinstance(info, dict):
        return None
    pid, namespace = info.get("child-pid"), info.get("pid-namespace")
    if not isinstance(pid, int) or not isinstance(namespace, int) or pid <= 1:
        return None
    return pid, namespace


def _open_init(pid: int, namespace: int) -> int | None:
    """A pidfd of the namespace's init while it lives; None once it is gone. The pid is
    opened first, then checked to be in that namespace: were it reused meanwhile by another
    process, that one is in another namespace (ours died with its init)."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return None
    try:
        link = str(Path(f"/proc/{pid}/ns/pid").readlink())
    except OSError:  # exited since (its /proc entry goes first), or not ours to look at
        os.close(fd)
        return None
    if link != f"pid:[{namespace}]":
        os.close(fd)
        return None
    return fd


def running_init(path: Path) -> tuple[int, int] | None:
    """(a pidfd, the pid) of the init of the namespace that bwrap wrote to ``path``, if it
    still runs; the file is removed. None, the common case at a run's end: it is gone."""
    try:
        found = namespace_init(path)
    finally:
        with contextlib.suppress(OSError):
            path.unlink()
    if found is None:
        return None
    fd = _open_init(*found)
    return None if fd is None else (fd, found[0])


async def wait_gone(init: tuple[int, int], wait: float = GONE_WAIT_S) -> None:
    """Wait until the namespace's ``init`` (:func:`running_init`) has exited, which is after
    every process of it; killed if it is still there after ``wait`` seconds. Its pidfd is
    closed."""
    fd, pid = init
    try:
        if await _exited(fd, wait):
            return
        logger.warning(
            "a sandbox's pid namespace (init %d) was still there %g s after its run ended: "
            "killed", pid, wait,
        )  # fmt: skip
        with contextlib.suppress(ProcessLookupError):
            signal.pidfd_send_signal(fd, signal.SIGKILL)
        await _exited(fd, wait)
    finally:
        os.close(fd)


async def _exited(pidfd: int, seconds: float) -> bool:
    """Whether the process of ``pidfd`` exits within ``seconds`` (readable: it has)."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[None] = loop.create_future()

    def readable() -> None:
        if not done.done():
            done.set_result(None)

    loop.add_reader(pidfd, readable)
    try:
        await asyncio.wait_for(done, seconds)
    except TimeoutError:
        return False
    finally:
        loop.remove_reader(pidfd)
    return True
