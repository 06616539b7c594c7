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
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from spawnkit.containment.liveness import process_start
from spawnkit.containment.sweep import (
    HomeSeal,
    kill_processes,
    remove_workspace,
    run_home,
    sweep,
)
from spawnkit.run import Spawner
from spawnkit.store import SessionStore

from .conftest import processes_with_env, workspaces_of
from .fakes import FakeAdapter
from .leftovers import (
    NODE_CLIS,
    SLEEPY,
    Owner,
    _argv0,
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
    """A record whose setup names a Dask worker (spawnkit.cluster.worker) says "worker lost",
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
        # The owner's pid now names another process: same pid, another start time (the
        # record sealed as this home would have sealed it then).
        seal = HomeSeal.of_home()
        assert seal is not None
        sealed = seal.seal(owner.session_id, store.host, owner.proc.pid, "1", owner.workspace)
        with store._db.transaction() as tx:
            tx.execute(
                "UPDATE sessions SET owner_start = '1', owner_seal = ? WHERE id = ?",
                (sealed, owner.session_id),
            )
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
    link = tmp_path / f"butler_x_{uuid.uuid4().hex}"
    link.symlink_to(precious, target_is_directory=True)
    assert remove_workspace(link, tmp_path) is False, "a symlink is never followed"
    assert remove_workspace(precious, tmp_path) is False, "not named like a workspace"
    assert remove_workspace(Path("butler_x_2"), tmp_path) is None  # relative and absent
    relative = tmp_path / f"butler_x_{uuid.uuid4().hex}"
    relative.mkdir()
    assert remove_workspace(Path(os.path.relpath(relative)), tmp_path) is False
    assert (precious / "keep.txt").read_text() == "keep me"
    real = tmp_path / f"butler_x_{uuid.uuid4().hex}"
    (real / "deep").mkdir(parents=True)
    assert remove_workspace(real, tmp_path / "elsewhere") is False, "not in the workspaces"
    assert remove_workspace(real, tmp_path) is True and not real.exists()
    assert remove_workspace(real, tmp_path) is None


# -- records the sweep must not trust: forged rows, other folders, other homes ----------------

# A record's owner that writes it through the store (sealed by its home) and dies.
DYING_OWNER = """
import os, sys
from datetime import UTC, datetime
from pathlib import Path
from spawnkit.store import SessionStore

store = SessionStore(sys.argv[1])
store.create_session(sys.argv[2], butler="b", runtime="claude-code", model=None, prompt="p",
                     context=None, trigger_source="external")
store.mark_started(sys.argv[2], started_at=datetime.now(UTC), workspace=Path(sys.argv[3]))
print(os.getpid(), flush=True)
os._exit(0)  # dies without completing anything
"""

HOW = ["forged", "sealed"]


@pytest.fixture(params=["sqlite", "postgresql"])
def target(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """Where the store lives, once per backend: a SQLite file, a fresh PostgreSQL database."""
    if request.param == "sqlite":
        return str(tmp_path / "sessions.db")
    return str(request.getfixturevalue("postgres_url"))


def dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def forge(store: SessionStore, session_id: str, workspace: Path, seal: str | None = None) -> None:
    """Insert an open record naming this host, a dead owner and ``workspace``, as anyone who
    can write the store can (a team member on a shared PostgreSQL store)."""
    with store._db.transaction() as tx:
        tx.execute(
            "INSERT INTO sessions (id, butler, runtime, prompt, trigger_source, status, "
            "created_at, started_at, owner_host, owner_pid, owner_start, workspace, owner_seal) "
            "VALUES (?, 'b', 'claude-code', 'p', 'external', 'running', ?, ?, ?, ?, '1', ?, ?)",
            (session_id, "2026-11-27T00:00:00+00:00", "2026-11-27T00:00:01+00:00",
             store.host, dead_pid(), str(workspace), seal),
        )  # fmt: skip


def record(how: str, store: SessionStore, session_id: str, workspace: Path) -> None:
    """An open record with a dead owner naming ``workspace``: inserted by hand ("forged"),
    or written by this home's own store in a process that then died ("sealed")."""
    if how == "forged":
        forge(store, session_id, workspace)
        return
    done = subprocess.run(
        [sys.executable, "-c", DYING_OWNER, store.target, session_id, str(workspace)],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert (done.returncode, done.stderr) == (0, ""), done.stderr


def precious_folder(where: Path) -> Path:
    where.mkdir(parents=True)
    (where / "keep.txt").write_text("keep me")
    return where


@pytest.mark.parametrize("how", HOW)
def test_a_record_naming_a_folder_outside_the_workspaces_never_removes_it(
    target: str, tmp_path: Path, how: str
) -> None:
    outside = precious_folder(tmp_path / f"butler_x_{uuid.uuid4().hex}")
    with SessionStore(target) as store:
        record(how, store, "s-outside", outside)
        (swept,) = sweep(store)
        closed = store.get_session("s-outside")
    assert closed is not None and closed.status == "crashed"
    assert (swept.session_id, swept.workspace_removed) == ("s-outside", False)
    assert (outside / "keep.txt").read_text() == "keep me"


@pytest.mark.parametrize("link", ["parent", "workspace"])
def test_a_record_naming_a_symlink_in_the_workspaces_is_not_followed(
    target: str, tmp_path: Path, isolated_home: Path, link: str
) -> None:
    """The folder a record names is resolved first: a link in the workspaces folder that
    leads outside it (to a folder or to its parent) is not followed."""
    name = f"butler_b_{uuid.uuid4().hex}"
    outside = precious_folder(tmp_path / "outside" / name)
    workspaces = isolated_home / "workspaces"
    workspaces.mkdir(exist_ok=True)
    if link == "parent":
        (workspaces / "link").symlink_to(outside.parent, target_is_directory=True)
        named = workspaces / "link" / name
    else:
        named = workspaces / name
        named.symlink_to(outside, target_is_directory=True)
    with SessionStore(target) as store:
        record("sealed", store, "s-link", named)
        (swept,) = sweep(store)
        closed = store.get_session("s-link")
    assert closed is not None and closed.status == "crashed"
    assert not swept.workspace_removed
    assert (outside / "keep.txt").read_text() == "keep me"


@pytest.mark.parametrize("how", HOW)
def test_a_record_borrowing_another_homes_session_id_touches_nothing_of_it(
    target: str, tmp_path: Path, isolated_home: Path, how: str
) -> None:
    """Home B's run is alive (its owner and its tools, started with the session id, B's
    home and B's workspace); home A's store gets a record with B's session id and B's
    workspace whose owner is dead. A's sweep closes that record and nothing else."""
    home_b = isolated_home / "home-b"
    with staged_owner(tmp_path / "b.db", home=home_b) as owner_b:
        tools = owner_b.tools()
        with SessionStore(target) as store:
            record(how, store, owner_b.session_id, owner_b.workspace)
            (swept,) = sweep(store)
            closed = store.get_session(owner_b.session_id)
        assert closed is not None and closed.status == "crashed"
        assert (swept.killed, swept.workspace_removed) == ((), False)
        assert owner_b.tools() == tools, "home B's run was signalled"
        assert (owner_b.workspace / "notes.txt").read_text() == "written by the run"


def test_another_homes_record_on_this_host_is_left_to_that_home(
    target: str, tmp_path: Path, isolated_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two homes on one host share a store. A row of home B (its owner dead, its tools
    alive), and a row someone inserted naming this host and a folder, sealed as another
    home: home A's sweep acts on neither; home B's sweeps B's run."""
    home_b = isolated_home / "home-b"
    outside = precious_folder(tmp_path / f"butler_x_{uuid.uuid4().hex}")
    with staged_owner(target, home=home_b) as owner_b, SessionStore(target) as store:
        tools = owner_b.tools()
        owner_b.proc.kill()
        owner_b.proc.wait()
        forge(store, "s-forged", outside, seal=f"{'0' * 16}.{'0' * 64}")
        assert sweep(store) == [], "home A acted on a record it did not write"
        for session_id in (owner_b.session_id, "s-forged"):
            left = store.get_session(session_id)
            assert left is not None and left.status == "running"
        assert owner_b.tools() == tools and owner_b.workspace.is_dir()
        assert (outside / "keep.txt").read_text() == "keep me"

        monkeypatch.setenv("SPAWNKIT_HOME", str(home_b))
        (swept,) = sweep(store)
        closed = store.get_session(owner_b.session_id)
        assert swept.session_id == owner_b.session_id and closed is not None
        assert (closed.status, sorted(swept.killed)) == ("crashed", sorted(tools))
        assert swept.workspace_removed and not owner_b.workspace.exists()
        assert (outside / "keep.txt").read_text() == "keep me"


def test_a_process_of_another_user_is_never_signalled(tmp_path: Path, isolated_home: Path) -> None:
    """A process of user ``nobody`` carrying the run's session id, this home and the run's
    workspace (root can read its environment) is not this home's run's."""
    workspace = isolated_home / "workspaces" / f"butler_b_{uuid.uuid4().hex}"
    with SessionStore(tmp_path / "sessions.db") as store:
        record("sealed", store, "s-other-user", workspace)
        env = {"PATH": os.environ["PATH"], "SPAWNKIT_SESSION_ID": "s-other-user",
               "SPAWNKIT_WORKSPACE": str(workspace), "SPAWNKIT_RUN_HOME": run_home()}  # fmt: skip
        other = subprocess.Popen(
            ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", "sleep", "600"],
            env=env,
        )
        try:
            wait_for("sleep as nobody", lambda: _argv0(other.pid).endswith("sleep"), 30)
            (swept,) = sweep(store)
            assert swept.killed == () and other.poll() is None
        finally:
            other.kill()
            other.wait()


# An owner that dies while its run is being assembled: the workspace is made, the record
# does not name it yet (the start is written with the setup, just before the CLI starts).
DIES_ASSEMBLING = """
import os, sys
from spawnkit.containment.workspace import _make_workspace
from spawnkit.store import SessionStore

store = SessionStore(sys.argv[1])
store.create_session(sys.argv[2], butler="b", runtime="command", model=None, prompt="p",
                     context=None, trigger_source="external")
print(_make_workspace("b", None, sys.argv[2]), flush=True)
os._exit(0)
"""


def test_a_workspace_the_record_never_named_is_swept_by_its_session_id(tmp_path: Path) -> None:
    target = str(tmp_path / "sessions.db")
    done = subprocess.run(
        [sys.executable, "-c", DIES_ASSEMBLING, target, "assembling-1"],
        capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    workspace = Path(done.stdout.strip())
    assert workspace.is_dir()
    with SessionStore(target) as store:  # opening it sweeps
        swept = store.get_session("assembling-1")
    assert swept is not None and swept.status == "crashed"
    assert str(swept.error).endswith("its unrecorded workspace removed")
    assert not workspace.exists()
