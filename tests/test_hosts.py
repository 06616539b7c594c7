"""Runs that belong to a host, across hosts sharing one real PostgreSQL store.

A "host" is an OS process with its own ``$SPAWNKIT_HOME`` and ``$SPAWNKIT_HOST`` (the
name its records carry), so two hosts on this machine are told apart as two machines
would be. Host A runs `spawnkit run` with a CLI that works for minutes and is killed
with SIGKILL mid-run: nothing of it can close its record. Host B, which cannot see A's
processes, marks the run ``crashed`` once A's lease has run out, and not before.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

import psycopg
import pytest

from spawnkit.store import SessionStore
from spawnkit.sweep import OpenRun, kill_processes, run_processes

from .conftest import REPO, RosterFactory

LEASE_S = 3.0
START_TIMEOUT_S = 90.0


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
        os.kill(host_a.pid, signal.SIGKILL)
        host_a.wait(timeout=10)
        killed_at = time.monotonic()
        _, _, _, lease = _wait_for(postgres_url, "the last lease", lambda r: True, 1)
        lease_end = datetime.fromisoformat(lease)

        monkeypatch.setenv("SPAWNKIT_HOME", str(tmp_path / "host-b"))
        monkeypatch.setenv("SPAWNKIT_HOST", "host-b")
        if (lease_end - datetime.now(UTC)).total_seconds() > 1.0:
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
