"""Runs on a real Dask cluster over TCP: a ``dask scheduler`` process and two ``spawnkit
worker --insecure`` processes (``dask worker`` with spawnkit's plugin, each behind a nanny),
through the real Claude Code CLI on the replay model, in the bubblewrap sandbox. The secured
(``tls://``) cluster of ``spawnkit scheduler`` is tested in test_cluster_security.py.

The scheduler runs with ``allowed-failures = 0``, so a killed worker's task fails at once
with ``KilledWorker`` (test_cluster_e2e.py covers the default, where Dask re-runs the task).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

distributed = pytest.importorskip("distributed")

from spawnkit.cluster.worker import _worker_report, worker_command  # noqa: E402
from spawnkit.events import Finished, RunEvent, Started, ToolCallStarted  # noqa: E402
from spawnkit.run import Spawner  # noqa: E402
from spawnkit.run.dispatch import WORKER_LOST, Cluster  # noqa: E402

from .conftest import REPO  # noqa: E402
from .leftovers import SLEEPY, kill_leftovers, sleeping_tool, survivors  # noqa: E402
from .test_cluster_e2e import WEIGHT, scenario  # noqa: E402

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]

HOSTS = ("worker-host-1", "worker-host-2")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class TcpCluster:
    address: str
    client: Any
    store: Path
    home: Path  # the workers' SPAWNKIT_HOME


def _start(command: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    with open(log, "wb") as out:
        return subprocess.Popen(
            command, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
            cwd=REPO,
        )  # fmt: skip


@pytest.fixture(scope="module")
def started_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TcpCluster]:
    """One scheduler and two workers for the module (they take about 10 s to start)."""
    tmp_path = tmp_path_factory.mktemp("tcp-cluster")
    home = tmp_path / "home"
    port = free_port()
    address = f"tcp://127.0.0.1:{port}"
    store = tmp_path / "sessions.db"
    env = {
        **os.environ, "SPAWNKIT_HOME": str(home),
        "DASK_DISTRIBUTED__SCHEDULER__ALLOWED_FAILURES": "0",
    }  # fmt: skip
    scheduler = [sys.executable, "-m", "distributed.cli.dask_scheduler", "--host", "127.0.0.1",
                 "--port", str(port), "--dashboard-address", ":0"]  # fmt: skip
    processes = [_start(scheduler, env, tmp_path / "scheduler.log")]
    for n, host in enumerate(HOSTS):
        worker = [sys.executable, "-m", "spawnkit", "--store", str(store), "worker",
                  "--insecure", "--scheduler", address, "--", "--nthreads", "2",
                  "--dashboard-address", ":0", "--name", host]  # fmt: skip
        processes.append(_start(worker, {**env, "SPAWNKIT_HOST": host}, tmp_path / f"w{n}.log"))
    client = None
    try:
        client = distributed.Client(address, timeout=60, set_as_default=False)
        client.wait_for_workers(2, timeout=90)
        yield TcpCluster(address, client, store, home)
    finally:
        if client is not None:
            client.close()
        for process in reversed(processes):
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGTERM)
        for process in processes:
            try:
                process.wait(timeout=5)
            except subprocess.TimeoutExpired:  # a nanny still restarting its worker
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()


@pytest.fixture
def tcp_cluster(started_cluster: TcpCluster, monkeypatch: pytest.MonkeyPatch) -> TcpCluster:
    """The module's cluster, this test living in the workers' SPAWNKIT_HOME (so that
    tests/leftovers.py counts the runs' processes as this test's)."""
    monkeypatch.setenv("SPAWNKIT_HOME", str(started_cluster.home))
    started_cluster.client.wait_for_workers(2, timeout=90)  # a killed one is restarted
    return started_cluster


def test_spawnkit_run_on_a_cluster_streams_the_remote_run(make_butler, tcp_cluster, tmp_path):
    butler = make_butler()
    scenario_file = tmp_path / "weight.toml"
    scenario_file.write_text(WEIGHT)
    # Each worker's plugin checked its CLIs and the store at start-up.
    reports = tcp_cluster.client.run(_worker_report)
    assert sorted(r["host"] for r in reports.values()) == sorted(HOSTS)
    assert all(r["ready"] and "claude-code" in r["runtimes"] for r in reports.values())

    done = subprocess.run(
        [sys.executable, "-m", "spawnkit", "--store", str(tcp_cluster.store), "run",
         "--roster", str(butler.roster_dir), "--butler", butler.name,
         "--replay", str(scenario_file), "--on", tcp_cluster.address, "--json",
         "Please log my weight"],
        capture_output=True, text=True, timeout=180, cwd=REPO,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["success"] and "72.4 kg" in result["output"]
    # The events were printed as they came (on stderr with --json): both tool calls.
    assert done.stderr.index("state_set") < done.stderr.index("state_get")

    from spawnkit.store import SessionStore

    with SessionStore(tcp_cluster.store) as store:
        record = store.get_session(result["session_id"])
        assert record is not None and record.status == "success"
        assert record.owner_host in HOSTS
        assert [c["tool"] for c in store.mcp_calls(record.id)] == ["state_set", "state_get"]
        assert record.sandbox == "bwrap"


async def test_cancel_reaches_a_tcp_worker(make_butler, tcp_cluster):
    from spawnkit.store import SessionStore

    session_id = "tcp-cancel-1"
    events: list[RunEvent] = []
    with SessionStore(tcp_cluster.store) as store:
        with Cluster(tcp_cluster.address, replay=scenario(SLEEPY)) as cluster:
            spawner = Spawner(make_butler(), store=store, cluster=cluster)
            run = asyncio.create_task(
                spawner.trigger("sleep", session_id=session_id, on_event=events.append)
            )
            try:
                async with asyncio.timeout(120):
                    while not (
                        any(isinstance(e, Started) for e in events) and sleeping_tool(session_id)
                    ):
                        await asyncio.sleep(0.05)
                clock = time.monotonic()
                run.cancel()  # an interrupt: the caller's task is cancelled
                with pytest.raises(asyncio.CancelledError):
                    await run
                left = survivors(session_id, within=10)
                stopped_after = time.monotonic() - clock
            finally:
                kill_leftovers(session_id)
        record = store.get_session(session_id)
    print(f"remote run over TCP stopped and recorded {stopped_after:.2f} s after the cancel")
    assert left == []
    assert record is not None and record.status == "cancelled" and record.owner_host in HOSTS
    assert isinstance(events[-1], Finished) and events[-1].result.status == "cancelled"
    assert cluster._client is None  # the Cluster made its Client from the address: closed


async def test_a_killed_tcp_worker_fails_the_run_once(make_butler, tcp_cluster):
    from spawnkit.store import SessionStore

    session_id = "tcp-killed-1"
    events: list[RunEvent] = []
    with SessionStore(tcp_cluster.store) as store:
        before = {r.id for r in store.list_sessions(limit=100)}  # earlier tests' runs
        with Cluster(tcp_cluster.client, replay=scenario(SLEEPY)) as cluster:
            spawner = Spawner(make_butler(), store=store, cluster=cluster)
            run = asyncio.create_task(
                spawner.trigger("sleep", session_id=session_id, on_event=events.append)
            )
            try:
                async with asyncio.timeout(120):
                    while not (
                        any(isinstance(e, ToolCallStarted) for e in events)
                        and sleeping_tool(session_id)
                    ):
                        await asyncio.sleep(0.05)
                record = store.get_session(session_id)
                assert record is not None and record.given is not None
                worker = record.given["dispatch"]["worker"]
                os.kill(tcp_cluster.client.run(os.getpid)[worker], signal.SIGKILL)
                async with asyncio.timeout(120):
                    result = await run
                left = survivors(session_id, within=10)
            finally:
                kill_leftovers(session_id)
        records = [r for r in store.list_sessions(limit=100) if r.id not in before]
    assert result.status == "crashed" and result.error_kind == "worker_lost"
    assert (result.error or "").startswith(WORKER_LOST), result.error
    assert worker in (result.error or "")
    assert left == [], "the sandbox dies with its worker"
    assert [(r.id, r.status) for r in records] == [(session_id, "crashed")]
    assert (records[0].error or "").startswith(WORKER_LOST)
    assert sum(isinstance(e, Started) for e in events) == 1
    assert isinstance(events[-1], Finished) and events[-1].result == result


def test_spawnkit_worker_refuses_to_start_where_it_cannot_run_agents(tmp_path):
    """`spawnkit worker` checks before Dask starts: exit 2 and the reason, no worker."""
    done = subprocess.run(
        [sys.executable, "-m", "spawnkit", "--store", "/proc/no-such/sessions.db", "worker",
         "--insecure", "--scheduler", "tcp://127.0.0.1:9"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert "this host cannot run agents" in done.stderr and "/proc/no-such" in done.stderr
    assert "distributed" not in done.stderr  # Dask never started


def test_a_worker_that_cannot_run_agents_closes_itself(tmp_path):
    """Started with the preload directly, the plugin's start-up check fails (the store cannot
    be opened): the worker and its nanny close rather than take runs that would all fail."""
    port = free_port()
    address = f"tcp://127.0.0.1:{port}"
    scheduler = _start(
        [sys.executable, "-m", "distributed.cli.dask_scheduler", "--host", "127.0.0.1",
         "--port", str(port), "--dashboard-address", ":0"],
        dict(os.environ), tmp_path / "scheduler.log",
    )  # fmt: skip
    log = tmp_path / "worker.log"
    try:
        worker = _start(
            worker_command(address, ["--dashboard-address", ":0"]),
            {**os.environ, "SPAWNKIT_STORE": "/proc/no-such/sessions.db"}, log,
        )  # fmt: skip
        try:
            worker.wait(timeout=90)
        finally:
            if worker.poll() is None:
                os.killpg(worker.pid, signal.SIGKILL)
                worker.wait()
        text = log.read_text()
        assert "this worker cannot run agents" in text and "/proc/no-such" in text
        assert "Nanny at" in text and "closed" in text
    finally:
        os.killpg(scheduler.pid, signal.SIGTERM)
        try:
            scheduler.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(scheduler.pid, signal.SIGKILL)
            scheduler.wait()


def test_spawnkit_worker_fails_when_its_plugin_closes_the_worker(tmp_path):
    """The check before Dask passes; the plugin's, in the nanny's worker process, fails (a
    preload of the user's breaks the store there first): the worker and its nanny close,
    and `spawnkit worker` exits 2 with the reason, not 0 as Dask would."""
    port = free_port()
    address = f"tcp://127.0.0.1:{port}"
    breaks = tmp_path / "break_store.py"
    breaks.write_text('import os\nos.environ["SPAWNKIT_STORE"] = "/proc/no-such/sessions.db"\n')
    (tmp_path / "tmp").mkdir()
    scheduler = _start(
        [sys.executable, "-m", "distributed.cli.dask_scheduler", "--host", "127.0.0.1",
         "--port", str(port), "--dashboard-address", ":0"],
        dict(os.environ), tmp_path / "scheduler.log",
    )  # fmt: skip
    log = tmp_path / "worker.log"
    try:
        worker = _start(
            [sys.executable, "-m", "spawnkit", "--store", str(tmp_path / "fine.db"), "worker",
             "--insecure", "--scheduler", address, "--", "--dashboard-address", ":0",
             "--preload", str(breaks)],
            {**os.environ, "TMPDIR": str(tmp_path / "tmp")}, log,
        )  # fmt: skip
        try:
            code = worker.wait(timeout=120)
        finally:
            if worker.poll() is None:
                os.killpg(worker.pid, signal.SIGKILL)
                worker.wait()
        lines = log.read_text().splitlines()
        assert code == 2, lines
        assert "Nanny at" in log.read_text()  # it did start, behind a nanny
        assert lines[-1].startswith("spawnkit worker: closed, this worker cannot run agents: ")
        assert "/proc/no-such" in lines[-1]
        assert not list((tmp_path / "tmp").glob("spawnkit-worker-*"))  # its file is removed
    finally:
        os.killpg(scheduler.pid, signal.SIGTERM)
        try:
            scheduler.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(scheduler.pid, signal.SIGKILL)
            scheduler.wait()


def _says_all(log: Path, *words: str) -> bool:
    text = log.read_text()
    return all(word in text for word in words)


def test_spawnkit_worker_says_what_it_found_and_when_it_stops(tmp_path):
    """Among Dask's lines, one of spawnkit's own when the worker is ready (its CLIs, store and
    roster) and one when it stops."""
    port = free_port()
    address = f"tcp://127.0.0.1:{port}"
    scheduler = _start(
        [sys.executable, "-m", "distributed.cli.dask_scheduler", "--host", "127.0.0.1",
         "--port", str(port), "--dashboard-address", ":0"],
        dict(os.environ), tmp_path / "scheduler.log",
    )  # fmt: skip
    log = tmp_path / "worker.log"
    store = tmp_path / "worker.db"
    try:
        worker = _start(
            [sys.executable, "-m", "spawnkit", "--store", str(store), "worker", "--insecure",
             "--scheduler", address, "--", "--no-nanny", "--dashboard-address", ":0"],
            dict(os.environ), log,
        )  # fmt: skip
        try:
            deadline = time.monotonic() + 90
            # Ready (spawnkit's line) and registered (Dask's): a worker stopped while it is
            # still starting is torn down by Dask without its plugins' teardown.
            while not _says_all(log, "spawnkit worker: ready at", "Registered to:"):
                assert worker.poll() is None and time.monotonic() < deadline, log.read_text()
                time.sleep(0.2)
            os.killpg(worker.pid, signal.SIGTERM)
            assert worker.wait(timeout=60) == 0  # a stop asked for is a clean one
        finally:
            if worker.poll() is None:
                os.killpg(worker.pid, signal.SIGKILL)
                worker.wait()
        lines = log.read_text().splitlines()
        (ready,) = [line for line in lines if line.startswith("spawnkit worker: ready at")]
        assert "CLIs claude-code " in ready and f"store {store}" in ready and "roster " in ready
        assert any(line.startswith("spawnkit worker: stopped") for line in lines), lines
    finally:
        os.killpg(scheduler.pid, signal.SIGTERM)
        try:
            scheduler.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(scheduler.pid, signal.SIGKILL)
            scheduler.wait()
