"""The start-up sweep, with real processes: what a dead owner left is killed, removed, recorded.

The end-to-end case runs ``spawnkit run`` on the real CLIs, SIGKILLs it mid-tool-call
(its CLI and tools live on, reparented) and lets ``spawnkit sessions`` in another process
sweep. The other cases stage an owner by hand: a Python process that records a run, makes
its workspace and starts "tool" processes carrying the run's marker, as a CLI's would.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from spawnkit.spawner import Spawner
from spawnkit.store import SessionStore
from spawnkit.sweep import kill_processes, process_start, remove_workspace, sweep

from .conftest import processes_with_env, workspaces_of
from .fakes import FakeAdapter
from .leftovers import (
    NODE_CLIS,
    SLEEPY,
    Owner,
    kill_leftovers,
    process_state,
    sleeper,
    sleeping_tool,
    spawnkit_popen,
    staged_owner,
    survivors,
    wait_for,
    wait_until_mid_tool_call,
)

RUNTIMES = [
    "claude-code",
    pytest.param("codex", marks=pytest.mark.skipif(not NODE_CLIS, reason="npm ci first")),
    pytest.param("gemini", marks=pytest.mark.skipif(not NODE_CLIS, reason="npm ci first")),
]


def spawnkit_sessions() -> dict[str, dict[str, object]]:
    """``spawnkit sessions --json`` in a process of its own (opening the store sweeps)."""
    done = subprocess.run(
        [sys.executable, "-m", "spawnkit", "sessions", "--json"],
        capture_output=True, text=True, timeout=120, check=False, env=dict(os.environ),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return {record["id"]: record for record in json.loads(done.stdout)}


def cli_stdouts(session_id: str) -> set[str]:
    """Where the run's processes' stdout goes, as /proc shows it: ``pipe:[…]``, or a file's
    path (`` (deleted)`` after it when the file has no name any more)."""
    found = set()
    for pid in processes_with_env("SPAWNKIT_SESSION_ID", session_id):
        with contextlib.suppress(OSError):
            found.add(str(Path(f"/proc/{pid}/fd/1").readlink()))
    return found


@pytest.mark.e2e
@pytest.mark.parametrize("runtime", RUNTIMES)
def test_sigkill_of_spawnkit_run_then_spawnkit_sessions_sweeps(
    make_butler, tmp_path: Path, runtime: str
) -> None:
    # Unsandboxed: the sweep is all that stands between the run and leftover processes.
    butler = make_butler("sleeper", extra=sleeper(runtime))
    scenario = tmp_path / "sleepy.toml"
    scenario.write_text(SLEEPY)
    proc = spawnkit_popen("run", "--roster", str(butler.roster_dir), "--butler", "sleeper",
                          "--replay", str(scenario), "sleep on it")  # fmt: skip
    session_id = None
    try:
        session_id = wait_until_mid_tool_call(lambda: proc.poll() is None)
        (workspace,) = workspaces_of("sleeper")

        # A sweep from another process while the owner lives touches nothing.
        record = spawnkit_sessions()[session_id]
        assert (record["status"], record["workspace"]) == ("running", str(workspace))
        assert sleeping_tool(session_id) and workspace.is_dir()

        # Gemini's stdout goes to a file with no name (a SIGKILLed owner cannot leave it).
        outputs = cli_stdouts(session_id)
        assert outputs, "the run's processes were found"
        unnamed = [out for out in outputs if out.endswith(" (deleted)")]
        assert len(unnamed) == (1 if runtime == "gemini" else 0), outputs
        if unnamed:
            assert not Path(unnamed[0].removesuffix(" (deleted)")).exists()

        proc.kill()
        proc.wait(30)
        left = processes_with_env("SPAWNKIT_SESSION_ID", session_id)
        if runtime != "codex":  # Codex ends its commands itself once its stdout is gone
            assert sleeping_tool(session_id), "precondition: the tool call outlived its owner"

        record = spawnkit_sessions()[session_id]
        assert (record["status"], record["success"], record["error_kind"]) == (
            "crashed", False, "crash",
        )  # fmt: skip
        error = str(record["error"])
        assert error.startswith(f"the process that ran this session (pid {proc.pid}) died")
        done = re.search(r"; (no|(\d+)) leftover process(es)?( killed)?, workspace removed$", error)
        assert done is not None, error
        if runtime != "codex":
            assert 1 <= int(done.group(2)) <= len(left), error
        assert survivors(session_id) == [], "the sweep left a process of the run running"
        assert not workspace.exists()
        # A second sweep finds nothing more to do and leaves the reason alone.
        assert spawnkit_sessions()[session_id]["error"] == error
    finally:
        if proc.poll() is None:
            proc.kill()
        if session_id:
            kill_leftovers(session_id)


@pytest.mark.e2e
def test_a_sandboxed_run_dies_with_its_owner_and_the_sweep_records_it(
    make_butler, tmp_path: Path
) -> None:
    butler = make_butler("sleeper", extra=sleeper(sandbox="bwrap"))
    scenario = tmp_path / "sleepy.toml"
    scenario.write_text(SLEEPY)
    proc = spawnkit_popen("run", "--roster", str(butler.roster_dir), "--butler", "sleeper",
                          "--replay", str(scenario), "sleep on it")  # fmt: skip
    session_id = None
    try:
        session_id = wait_until_mid_tool_call(lambda: proc.poll() is None)
        proc.kill()
        proc.wait(30)
        assert survivors(session_id) == [], "the sandbox's processes died with their owner"
        assert workspaces_of("sleeper"), "the workspace is what is left"
        record = spawnkit_sessions()[session_id]
        assert record["status"] == "crashed"
        assert str(record["error"]).endswith("; no leftover processes, workspace removed")
        assert workspaces_of("sleeper") == []
    finally:
        if proc.poll() is None:
            proc.kill()
        if session_id:
            kill_leftovers(session_id)


# -- staged owners --------------------------------------------------------------------------


@pytest.fixture
def owner(tmp_path: Path) -> Iterator[Owner]:
    with staged_owner(tmp_path / "sessions.db") as staged:
        yield staged


def test_a_live_owners_run_is_untouched(owner: Owner, tmp_path: Path) -> None:
    tools = owner.tools()
    with SessionStore(tmp_path / "sessions.db") as store:  # opening sweeps
        assert sweep(store) == []
        record = store.get_session(owner.session_id)
    assert record is not None and record.status == "running"
    assert record.workspace == owner.workspace and owner.workspace.is_dir()
    assert owner.tools() == tools


def test_a_dead_owners_run_is_swept_when_a_spawner_starts(
    owner: Owner, tmp_path: Path, make_butler
) -> None:
    with SessionStore(tmp_path / "sessions.db") as store:  # open before the owner dies
        tools = owner.tools()
        owner.proc.kill()  # and not reaped: a zombie owner is a dead one
        wait_for("the owner to be a zombie", lambda: process_state(owner.proc.pid) == "Z", 30)
        Spawner(make_butler(), store=store, adapter=FakeAdapter())
        record = store.get_session(owner.session_id)
    assert record is not None and record.status == "crashed"
    assert record.error == (
        f"the process that ran this session (pid {owner.proc.pid}) died before it completed; "
        f"{len(tools)} leftover processes killed, workspace removed"
    )
    assert survivors(owner.session_id) == []
    assert not owner.workspace.exists()


def test_a_dead_dask_workers_run_is_recorded_as_worker_lost(owner: Owner, tmp_path: Path) -> None:
    """A record whose setup names a Dask worker (spawnkit.cluster_worker) says "worker lost",
    as the client and the task's re-run guard do: one reason whoever closes it first."""
    with SessionStore(tmp_path / "sessions.db") as store:
        store.record_setup(
            owner.session_id, sandbox="none", given={"dispatch": {"worker": "tcp://10.0.0.7:4242"}}
        )
        owner.proc.kill()
        owner.proc.wait()
        swept = sweep(store)
        record = store.get_session(owner.session_id)
    assert [s.session_id for s in swept] == [owner.session_id]
    assert record is not None and record.status == "crashed"
    assert (record.error or "").startswith(
        f"worker lost: the Dask worker tcp://10.0.0.7:4242 (pid {owner.proc.pid}) that ran this "
        "session died before it completed; it is not run again; "
    )
    assert survivors(owner.session_id) == []


def test_a_reused_owner_pid_is_dead_and_never_signalled(owner: Owner, tmp_path: Path) -> None:
    db = tmp_path / "sessions.db"
    with SessionStore(db) as store:
        # The owner's pid now names another process: same pid, another start time.
        with store._db.transaction() as tx:
            tx.execute("UPDATE sessions SET owner_start = '1' WHERE id = ?", (owner.session_id,))
        (swept,) = sweep(store)
        record = store.get_session(owner.session_id)
    assert record is not None and record.status == "crashed"
    assert swept.owner_pid == owner.proc.pid and swept.owner_pid not in swept.killed
    assert owner.proc.poll() is None, "the process that has the pid now was signalled"
    assert owner.tools() == [] and not owner.workspace.exists()


def test_a_pid_whose_start_time_changed_is_not_killed() -> None:
    other = subprocess.Popen(["sleep", "600"])
    try:
        start = process_start(other.pid)
        assert start is not None
        assert kill_processes([(other.pid, str(int(start) - 1))]) == []
        assert other.poll() is None
        assert kill_processes([(other.pid, start)]) == [other.pid]
        assert other.wait(10) == -signal.SIGKILL
    finally:
        other.kill()
        other.wait()


def test_only_a_real_workspace_is_removed(tmp_path: Path) -> None:
    precious = tmp_path / "precious"
    precious.mkdir()
    (precious / "keep.txt").write_text("keep me")
    link = tmp_path / "butler_x_1"
    link.symlink_to(precious, target_is_directory=True)
    assert remove_workspace(link) is False, "a symlink is never followed"
    assert remove_workspace(precious) is False, "not named like a workspace"
    assert remove_workspace(Path("butler_x_2")) is None  # relative and absent
    (tmp_path / "butler_x_3").mkdir()
    assert remove_workspace(Path(os.path.relpath(tmp_path / "butler_x_3"))) is False
    assert (precious / "keep.txt").read_text() == "keep me"
    real = tmp_path / "butler_x_4"
    (real / "deep").mkdir(parents=True)
    assert remove_workspace(real) is True and not real.exists()
    assert remove_workspace(real) is None
