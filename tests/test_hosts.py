"""Runs that belong to a host, across hosts sharing one real PostgreSQL store.

A "host" is an OS process with its own ``$SPAWNKIT_HOME`` and ``$SPAWNKIT_HOST`` (the
name its records carry), so two hosts on this machine are told apart as two machines
would be. Host A runs `spawnkit run` with a CLI that works for minutes and is killed
with SIGKILL mid-run: nothing of it can close its record. Host B, which cannot see A's
processes, marks the run ``crashed`` once A's lease has run out, and not before; the run
slot A held is free again at once. Then two hosts trigger 20 runs each against a butler's
``max_concurrent_sessions = 3``: never more than 3 run at once, counted from the records.
Last, ``max_queued_sessions`` across hosts: while host A holds a butler's run slot and its
one queue place, host B's trigger finds the queue full, and once A is killed its places
come back at once.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from datetime import UTC, datetime
from pathlib import Path

import psycopg
import pytest

from spawnkit.containment.sweep import OpenRun, kill_processes, run_processes
from spawnkit.errors import QueueFullError
from spawnkit.run import Spawner
from spawnkit.store import SessionStore

from .conftest import REPO, RosterFactory

LEASE_S = 4.0
START_TIMEOUT_S = 90.0
HOST_TIMEOUT_S = 300


def _record(url: str) -> tuple[str, str, str, str | None] | None:
    """(id, status, owner_host, lease_until) of the one session, if it exists yet."""
    with psycopg.connect(url) as conn:
        row = conn.execute(
            "SELECT id, status, owner_host, lease_until FROM spawnkit.sessions"
        ).fetchone()
    return None if row is None else (row[0], row[1], row[2], row[3])


def _wait_for(url: str, what: str, check: object, timeout: float) -> tuple[str, str, str, str]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = _record(url)
        if found is not None and callable(check) and check(found):
            assert found[3] is not None
            return (found[0], found[1], found[2], found[3])
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}: {_record(url)}")


def test_a_killed_hosts_run_is_crashed_by_another_host_once_its_lease_ran_out(
    make_butler: RosterFactory,
    tmp_path: Path,
    postgres_url: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    make_butler(
        "sleeper",
        extra=f"""
        [butler.runtime]
        type = "command"
        command = [{json.dumps(sys.executable)}, "-c", "import time; time.sleep(600)"]
        stdin = "prompt"
        max_concurrent_sessions = 1
        """,
    )
    SessionStore(postgres_url).close()  # the schema, before anyone polls it
    home_a = tmp_path / "host-a"
    env = {
        **os.environ, "SPAWNKIT_HOME": str(home_a), "SPAWNKIT_HOST": "host-a",
        "SPAWNKIT_STORE": postgres_url, "SPAWNKIT_LEASE_S": str(LEASE_S),
    }  # fmt: skip
    host_a = subprocess.Popen(
        [sys.executable, "-m", "spawnkit", "run", "--roster", str(tmp_path / "roster"),
         "--butler", "sleeper", "work for ten minutes"],
        env=env, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        start_new_session=True,
    )  # fmt: skip
    try:
        session_id, _, owner, first_lease = _wait_for(
            postgres_url, "host A's run", lambda r: r[1] == "running", START_TIMEOUT_S
        )
        assert owner == "host-a"
        # While A lives its lease is renewed (every third of it) ahead of the clock.
        _, _, _, lease = _wait_for(
            postgres_url, "a renewal", lambda r: r[3] is not None and r[3] > first_lease, LEASE_S
        )
        with SessionStore(postgres_url) as watcher:
            claim = watcher.slot_claim("sleeper", 1)
            assert claim is not None and claim.try_acquire() is None, "A holds the one slot"
            os.kill(host_a.pid, signal.SIGKILL)
            host_a.wait(timeout=10)
            killed_at = time.monotonic()
            while claim.try_acquire() is None:
                assert time.monotonic() - killed_at < 10, "the slot is free within 10 s"
                time.sleep(0.05)
            claim.release()
        _, _, _, lease = _wait_for(postgres_url, "the last lease", lambda r: True, 1)
        lease_end = datetime.fromisoformat(lease)

        monkeypatch.setenv("SPAWNKIT_HOME", str(tmp_path / "host-b"))
        monkeypatch.setenv("SPAWNKIT_HOST", "host-b")
        if (lease_end - datetime.now(UTC)).total_seconds() > 1.5:
            with SessionStore(postgres_url) as early:
                record = early.get_session(session_id)
                assert record is not None and record.status == "running", "A's lease still holds"

        with SessionStore(postgres_url) as host_b:
            while True:
                record = host_b.get_session(session_id)
                assert record is not None
                if record.status != "running":
                    break
                assert time.monotonic() - killed_at < 10, "crashed within 10 s of the kill"
                time.sleep(0.2)
                host_b.recover_orphans()
        assert record.completed_at is not None and record.completed_at >= lease_end
        assert (record.status, record.success, record.error_kind, record.owner_host) == (
            "crashed", False, "crash", "host-a",
        )  # fmt: skip
        assert record.error == (
            f"the lease of host host-a ran out at {lease} without a renewal: the host died or "
            "lost the network before the run completed (seen by host-b)"
        )
    finally:
        if host_a.poll() is None:
            host_a.kill()
        host_a.wait(timeout=10)
        record = _record(postgres_url)
        if record is not None:  # whatever of A's run outlived it on this machine
            found = run_processes([OpenRun(record[0], 0, None, None)])
            kill_processes(found[record[0]])


HOST = """
import asyncio, sys
from spawnkit.config.roster import load_roster
from spawnkit.run import Spawner

async def main() -> None:
    spawner = Spawner(load_roster(sys.argv[1])["limited"])
    print("ready", flush=True)
    await asyncio.to_thread(sys.stdin.readline)
    results = await asyncio.gather(*(spawner.trigger(f"job {n}") for n in range(int(sys.argv[2]))))
    print(sum(r.success for r in results), flush=True)

asyncio.run(main())
"""


def test_max_concurrent_sessions_holds_across_two_hosts(
    make_butler: RosterFactory, tmp_path: Path, postgres_url: str
) -> None:
    """2 hosts x 20 triggers against max_concurrent_sessions = 3: never more than 3 running
    at once, measured from the records (each run's started_at to its completed_at)."""
    limit, per_host = 3, 20
    make_butler(
        "limited",
        extra=f"""
        [butler.runtime]
        type = "command"
        command = [{json.dumps(sys.executable)}, "-c", "import time; time.sleep(0.4); print('ok')"]
        stdin = "prompt"
        max_concurrent_sessions = {limit}
        max_queued_sessions = {2 * per_host}
        """,
    )
    SessionStore(postgres_url).close()
    hosts = [
        subprocess.Popen(
            [sys.executable, "-c", textwrap.dedent(HOST), str(tmp_path / "roster"), str(per_host)],
            env={
                **os.environ,
                "SPAWNKIT_HOME": str(tmp_path / name),
                "SPAWNKIT_HOST": name,
                "SPAWNKIT_STORE": postgres_url,
            },
            cwd=REPO,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for name in ("host-a", "host-b")
    ]
    try:
        for host in hosts:
            assert host.stdout is not None and host.stdout.readline() == "ready\n"
        for host in hosts:  # both hosts trigger at once
            assert host.stdin is not None
            host.stdin.write("go\n")
            host.stdin.flush()
        outcomes = [host.communicate(timeout=HOST_TIMEOUT_S) for host in hosts]
    finally:
        for host in hosts:
            if host.poll() is None:
                host.kill()
                host.wait(timeout=10)
    assert [(h.returncode, out) for h, (out, _) in zip(hosts, outcomes, strict=True)] == [
        (0, f"{per_host}\n")
    ] * 2, [err for _, err in outcomes]

    with SessionStore(postgres_url) as store:
        records = store.list_sessions(limit=1000)
    assert len(records) == 2 * per_host
    assert {r.owner_host for r in records} == {"host-a", "host-b"}
    edges = sorted(
        [(r.started_at, 1) for r in records if r.started_at is not None]
        + [(r.completed_at, -1) for r in records if r.completed_at is not None],
        key=lambda edge: (edge[0], edge[1]),  # an end before a start at the same instant
    )
    assert len(edges) == 4 * per_host
    running, most = 0, 0
    for _, step in edges:
        running += step
        most = max(most, running)
    assert most == limit, f"at most {limit} running at once across both hosts, and {limit} reached"


QUEUE_HOST = """
import asyncio, sys
from spawnkit.config.roster import load_roster
from spawnkit.run import Spawner

async def main() -> None:
    spawner = Spawner(load_roster(sys.argv[1])["queued"])
    await asyncio.gather(spawner.trigger("sleep 600"), spawner.trigger("sleep 600"))

asyncio.run(main())
"""


def _start_queue_host(tmp_path: Path, url: str) -> subprocess.Popen[str]:
    """Host A: two runs of a butler that sleep ten minutes, one running, one queued."""
    return subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(QUEUE_HOST), str(tmp_path / "roster")],
        env={
            **os.environ, "SPAWNKIT_HOME": str(tmp_path / "host-a"), "SPAWNKIT_HOST": "host-a",
            "SPAWNKIT_STORE": url,
        },
        cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True,
        text=True,
    )  # fmt: skip


async def test_max_queued_sessions_holds_across_hosts_and_a_killed_hosts_places_return(
    make_butler: RosterFactory,
    tmp_path: Path,
    postgres_url: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    sleep = "import sys, time; time.sleep(float(sys.stdin.read().split()[-1]))"
    butler = make_butler(
        "queued",
        extra=f"""
        [butler.runtime]
        type = "command"
        command = [{json.dumps(sys.executable)}, "-c", {json.dumps(sleep)}]
        stdin = "prompt"
        max_concurrent_sessions = 1
        max_queued_sessions = 1
        """,
    )
    SessionStore(postgres_url).close()
    host_a = _start_queue_host(tmp_path, postgres_url)
    monkeypatch.setenv("SPAWNKIT_HOME", str(tmp_path / "host-b"))
    monkeypatch.setenv("SPAWNKIT_HOST", "host-b")
    try:
        with SessionStore(postgres_url) as store:
            deadline = time.monotonic() + START_TIMEOUT_S
            while sorted(r.status for r in store.list_sessions()) != ["queued", "running"]:
                assert host_a.poll() is None, host_a.communicate()
                assert time.monotonic() < deadline, "host A: one run running, one queued"
                await asyncio.sleep(0.1)
            spawner = Spawner(butler, store=store)
            with pytest.raises(QueueFullError) as full:
                await spawner.trigger("sleep 0")
            assert str(full.value) == (
                f"butler 'queued' is full across the hosts sharing {store.location}: "
                "1 running, 1 queued (max_queued_sessions = 1)"
            )
            rejected = await spawner.trigger("sleep 0", trigger_source="trigger")
            assert (rejected.success, rejected.error_kind) == (False, "rejected")
            assert store.count_sessions() == 2, "a refused trigger leaves no record"

            os.kill(host_a.pid, signal.SIGKILL)
            host_a.wait(timeout=10)
            killed_at = time.monotonic()
            while True:
                try:
                    result = await spawner.trigger("sleep 0")
                    break
                except QueueFullError:
                    assert time.monotonic() - killed_at < 10, "A's places are back within 10 s"
                    await asyncio.sleep(0.1)
            assert result.success, result.error
            assert store.count_sessions() == 3
    finally:
        if host_a.poll() is None:
            host_a.kill()
        host_a.wait(timeout=10)
        with SessionStore(postgres_url) as store:  # whatever of A's runs outlived it here
            left = [r.id for r in store.list_sessions() if r.owner_host == "host-a"]
        found = run_processes([OpenRun(sid, 0, None, None) for sid in left])
        for sid in left:
            kill_processes(found[sid])
