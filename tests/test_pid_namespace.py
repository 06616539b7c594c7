"""A sandboxed run's end waits until its pid namespace is gone, with no cgroup of its own.

bwrap's outer process exits as soon as the CLI has; the namespace's init, killed with it,
takes every other process of the run a moment later. The run is recorded only after that
(a cancelled one too), found through the init's pid that bwrap wrote outside the sandbox.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

from spawnkit.containment import pid_namespace, run_group, sandbox
from spawnkit.containment.workspace import PREFIX, session_suffix
from spawnkit.errors import SandboxUnavailable
from spawnkit.result import SpawnerResult
from spawnkit.run import Spawner
from spawnkit.store import SessionStore

from .conftest import RosterFactory
from .test_run_group import alive

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux only")


def bwrap() -> Path:
    try:
        return sandbox.available_bwrap()
    except SandboxUnavailable as exc:
        pytest.skip(str(exc))


def in_namespace(namespace: int) -> list[int]:
    """The live pids whose pid namespace is ``namespace``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            link = str((entry / "ns" / "pid").readlink())
        except OSError:
            continue
        if link == f"pid:[{namespace}]" and alive(int(entry.name)):
            found.append(int(entry.name))
    return found


async def started_in_a_sandbox(
    spawner: Spawner, butler: str, ready: Callable[[list[int]], bool], timeout: float
) -> tuple[asyncio.Task[SpawnerResult], str, list[int]]:
    """A trigger of ``spawner`` (of ``butler``) running until the live pids of its pid
    namespace are ``ready``: its task, its session id and those pids."""
    session_id = str(uuid.uuid4())
    info = info_of(butler, session_id)
    task = asyncio.create_task(spawner.trigger("go", session_id=session_id))
    deadline = time.monotonic() + timeout
    pids: list[int] = []
    while not ready(pids):
        if task.done():
            raise AssertionError(f"the run ended: {task.result()}")
        assert time.monotonic() < deadline, f"the run never got ready: {pids}"
        await asyncio.sleep(0.05)
        found = pid_namespace.namespace_init(info)
        pids = in_namespace(found[1]) if found is not None else []
    return task, session_id, pids


def info_of(butler: str, session_id: str) -> Path:
    """Where bwrap tells the namespace of the first attempt of ``session_id``."""
    return pid_namespace.info_path(Path(f"{PREFIX}{butler}_{session_suffix(session_id)}"))


async def test_a_cancelled_sandboxed_run_returns_once_its_processes_are_gone(
    make_butler: RosterFactory, store: SessionStore
) -> None:
    """Cancelled while its CLI and a daemonised child sleep: by the time the cancel returns,
    every process of its namespace is gone, the record says cancelled, and no cgroup was
    made for it (joining one costs a kernel grace period before the CLI can start)."""
    bwrap()
    butler = make_butler(
        "inside",
        extra="""
        [butler.runtime]
        type = "command"
        command = ["sh", "-c", "(setsid sleep 600 &) ; sleep 600"]
        [butler.sandbox]
        mode = "bwrap"
        """,
    )
    task, session_id, pids = await started_in_a_sandbox(
        Spawner(butler, store=store), "inside", lambda pids: len(pids) >= 4, 30
    )  # its init, sh, both sleeps
    info = info_of("inside", session_id)
    assert run_group.leftover_group(session_id) is None, "a sandboxed run has no cgroup"
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert [pid for pid in pids if alive(pid)] == [], "a process outlived the cancelled run"
    assert not info.exists(), "the namespace's file goes with the run"
    assert [r.status for r in store.list_sessions()] == ["cancelled"]


async def test_a_namespace_that_stays_is_killed_after_the_wait(tmp_path: Path) -> None:
    """An init still there after the wait (its bwrap alive: a stop that did not take) is
    killed, and with it the namespace."""
    info = tmp_path / "ns.json"
    sandboxed = sleep_in_a_sandbox(info)
    try:
        deadline = time.monotonic() + 10
        while pid_namespace.namespace_init(info) is None:
            assert time.monotonic() < deadline, "bwrap wrote no info"
            await asyncio.sleep(0.01)
        init = pid_namespace.running_init(info)
        assert init is not None, "the init runs"
        assert not info.exists()
        namespace = namespace_of(init[1])
        while len(namespace_pids := in_namespace(namespace)) < 2:  # its sleep starts later
            assert time.monotonic() < deadline, f"no sleep in the namespace: {namespace_pids}"
            await asyncio.sleep(0.01)
        assert init[1] in namespace_pids and len(namespace_pids) == 2  # init and sleep
        started = time.monotonic()
        await pid_namespace.wait_gone(init, wait=0.3)
        assert time.monotonic() - started >= 0.3
        assert [pid for pid in namespace_pids if alive(pid)] == []
        assert sandboxed.wait(10) != 0  # its init killed: bwrap ends too
    finally:
        if sandboxed.poll() is None:
            sandboxed.kill()
            sandboxed.wait()


def sleep_in_a_sandbox(info: Path) -> subprocess.Popen[bytes]:
    """``sleep 600`` in a pid namespace, bwrap's info written to ``info``."""
    with info.open("wb") as fh:
        fd = fh.fileno()
        return subprocess.Popen(
            [str(bwrap()), "--info-fd", str(fd), "--ro-bind", "/", "/", "--dev", "/dev",
             "--proc", "/proc", "--unshare-pid", "--die-with-parent", "--",
             "sleep", "600"],
            pass_fds=(fd,), start_new_session=True,
        )  # fmt: skip


def namespace_of(pid: int) -> int:
    return Path(f"/proc/{pid}/ns/pid").stat().st_ino


def test_a_pid_that_is_no_longer_the_namespaces_init_is_left_alone(tmp_path: Path) -> None:
    """The file names a pid that now belongs to another process (ours, here, in another
    namespace): nothing is waited for, and nothing is killed."""
    info = tmp_path / "ns.json"
    ours = Path("/proc/self/ns/pid").stat().st_ino
    info.write_text(f'{{"child-pid": {os.getpid()}, "pid-namespace": {ours + 1}}}')
    assert pid_namespace.running_init(info) is None
    assert not info.exists()
    info.write_text('{"child-pid": 4194304, "pid-namespace": 1}')  # past any pid_max
    assert pid_namespace.running_init(info) is None
    for broken in ("", "[]", '{"child-pid": "1"}', "not json"):
        info.write_text(broken)
        assert pid_namespace.running_init(info) is None
    assert pid_namespace.running_init(tmp_path / "missing.json") is None


async def test_a_finished_sandboxed_runs_daemon_is_gone_when_it_returns(
    make_butler: RosterFactory, store: SessionStore
) -> None:
    """A run whose CLI exits at once, leaving a daemonised sleeper: when it returns, the
    sleeper is gone and the file is removed. (The sleeper carries a token of this test's
    own: other tests' sleepers run beside it.)"""
    bwrap()
    token = f"spawnkit-ns-{uuid.uuid4().hex[:12]}"
    butler = make_butler(
        "done",
        extra=f"""
        [butler.runtime]
        type = "command"
        command = ["sh", "-c", "(setsid sh -c 'sleep 600; : {token}' &) ; echo started"]
        output = "text"
        [butler.sandbox]
        mode = "bwrap"
        """,
    )
    session_id = str(uuid.uuid4())
    result = await Spawner(butler, store=store).trigger("go", session_id=session_id)
    assert result.success, result.error
    assert "started" in result.output
    sleepers = [pid for pid in in_all_namespaces() if token.encode() in cmdline(pid)]
    assert sleepers == [], "the daemonised sleeper outlived its run"
    assert not info_of("done", session_id).exists()


def in_all_namespaces() -> list[int]:
    return [int(e.name) for e in Path("/proc").iterdir() if e.name.isdigit() and alive(int(e.name))]


def cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


HEAVY = "import time; held = b'x' * (1536 << 20); print('ready', flush=True); time.sleep(600)"


async def test_a_cancel_waits_for_a_process_that_takes_long_to_die(
    make_butler: RosterFactory, store: SessionStore
) -> None:
    """A process holding 1.5 GB takes a while to exit once killed (its memory is freed in
    its exit): the cancelled run returns only after it is gone, not at bwrap's exit."""
    bwrap()
    python = shutil.which("python3", path="/usr/bin:/bin")  # a system one: /usr is in view
    if python is None:
        pytest.skip("no python3 in /usr/bin")
    butler = make_butler(
        "heavy",
        extra=f"""
        [butler.runtime]
        type = "command"
        command = ["{python}", "-c", "{HEAVY}"]
        output = "text"
        [butler.sandbox]
        mode = "bwrap"
        """,
    )
    task, _, pids = await started_in_a_sandbox(
        Spawner(butler, store=store), "heavy", lambda pids: any(rss_mb(p) > 1000 for p in pids), 60
    )
    heavy = [pid for pid in pids if rss_mb(pid) > 1000]
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert not alive(heavy[0]), "the run returned while its process was still exiting"
    assert [r.status for r in store.list_sessions()] == ["cancelled"]


def rss_mb(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0
