"""An unsandboxed run's leftovers are found through its own cgroup, not by a scan of the host.

The run's CLI daemonises a grandchild (a double fork into a session of its own, as Gemini
does with every tool): it leaves the CLI's process group and is reparented away from the
run's process tree. The end of the run must still kill it, reading no other process's
environment; where no cgroup can be made, the scan of this user's processes still does.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import textwrap
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from spawnkit.containment import run_group, sweep
from spawnkit.result import SpawnerResult
from spawnkit.run import Spawner
from spawnkit.store import SessionStore

from .conftest import RosterFactory

# Double-forks a sleeper into a session of its own, its stdio on /dev/null as a daemon's
# is, writes its pid, and exits at once.
DAEMONISING = """
import os, sys, time
pidfile = sys.argv[1]
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        null = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(null, fd)
        with open(pidfile + ".tmp", "w") as fh:
            fh.write(str(os.getpid()))
        os.rename(pidfile + ".tmp", pidfile)
        time.sleep(600)
    os._exit(0)
deadline = time.monotonic() + 60
while not os.path.exists(pidfile) and time.monotonic() < deadline:
    time.sleep(0.01)
print("daemonised", open(pidfile).read())
"""


def daemonising_butler(make_butler: RosterFactory, tmp_path: Path, pidfile: Path):
    agent = tmp_path / "daemonising.py"
    agent.write_text(textwrap.dedent(DAEMONISING))
    argv = json.dumps([sys.executable, str(agent), str(pidfile)])
    return make_butler(
        "daemon",
        extra=f"""
        [butler.runtime]
        type = "command"
        command = {argv}
        [butler.sandbox]
        mode = "none"
        """,
    )


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, dead and not yet reaped by its new parent, does not)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")


def gone_within(pid: int, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.02)
    return not alive(pid)


@contextlib.asynccontextmanager
async def daemonised_run(
    make_butler: RosterFactory, store: SessionStore, tmp_path: Path
) -> AsyncIterator[tuple[SpawnerResult, int]]:
    """A successful run whose CLI daemonised a grandchild: its result and the grandchild's
    pid (killed here afterwards, should a test fail with it alive)."""
    pidfile = tmp_path / "grandchild.pid"
    spawner = Spawner(daemonising_butler(make_butler, tmp_path, pidfile), store=store)
    result = await spawner.trigger("start a daemon")
    assert result.success, result.error
    pid = int(pidfile.read_text())
    try:
        yield result, pid
    finally:
        if alive(pid):
            os.kill(pid, 9)


@pytest.fixture
def environ_reads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The pids whose /proc/<pid>/environ the sweep reads (the scan of the host)."""
    read: list[str] = []
    real = sweep._environ

    def counted(pid: str) -> bytes | None:
        read.append(pid)
        return real(pid)

    monkeypatch.setattr(sweep, "_environ", counted)
    return read


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="cgroups are Linux's")
async def test_a_daemonised_grandchild_is_killed_without_scanning_the_host(
    make_butler: RosterFactory, store: SessionStore, tmp_path: Path, environ_reads: list[str]
) -> None:
    if run_group.open_run_group("probe-of-the-test") is None:
        pytest.skip("no cgroup can be made here (the fallback is tested below)")
    run_group.leftover_group("probe-of-the-test").reap()  # type: ignore[union-attr]
    async with daemonised_run(make_butler, store, tmp_path) as (result, pid):
        assert gone_within(pid, 10), "the daemonised grandchild outlived its run"
        assert environ_reads == [], "no other process's environment is read"
        assert run_group.leftover_group(result.session_id) is None, "the run's cgroup is gone"
        assert [r.status for r in store.list_sessions()] == ["success"]


async def test_without_a_cgroup_the_scan_still_kills_it(
    make_butler: RosterFactory, store: SessionStore, tmp_path: Path,
    environ_reads: list[str], monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    monkeypatch.setattr(run_group, "_chosen", [None])  # decided: nowhere
    async with daemonised_run(make_butler, store, tmp_path) as (_, pid):
        assert gone_within(pid, 10), "the daemonised grandchild outlived its run"
        assert str(pid) in environ_reads, "found by the scan"


def test_a_dead_owners_run_cgroup_is_emptied_and_removed_by_the_sweep() -> None:
    """A SIGKILLed owner leaves its run's cgroup: the sweep kills what is in it, removes it."""
    group = run_group.open_run_group("sweep-test-session")
    if group is None:
        pytest.skip("no cgroup can be made here")
    import subprocess

    sleeper = subprocess.Popen([*group.argv, "sleep", "600"], start_new_session=True)
    try:
        deadline = time.monotonic() + 10
        while sleeper.pid not in group.pids() and time.monotonic() < deadline:
            time.sleep(0.01)
        found = run_group.leftover_group("sweep-test-session")
        assert found is not None and found.pids() == [sleeper.pid]
        assert found.reap() == [sleeper.pid]
        assert sleeper.wait(10) == -9
        assert not group.path.exists()
    finally:
        if sleeper.poll() is None:
            sleeper.kill()
            sleeper.wait()
