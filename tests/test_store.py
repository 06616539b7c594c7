"""The session store on real SQLite files: records, crash recovery, concurrent writers.

Crashed owners and concurrent writers are real processes opening the same file, so
the tests exercise SQLite's own locking and the store's owner checks, not a model of them.
Credentials and memory are tested here too because they live in the same file.
"""

from __future__ import annotations

import sqlite3
import stat
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator
from dataclasses import asdict, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from spawnkit.config.credential_file import CredentialFile
from spawnkit.containment.credentials import CredentialStore, check_required, isolated_env
from spawnkit.errors import MissingEnvError, StoreDamaged, StoreError
from spawnkit.result import (
    Attempt,
    BudgetReport,
    PermissionAnswer,
    SpawnerResult,
    ToolCall,
    Usage,
)
from spawnkit.run.memory import StoreMemory, render_episodes
from spawnkit.store import SCHEMA_VERSION, SessionStore

from .conftest import REPO, RosterFactory

SUBPROCESS_TIMEOUT_S = 120
T0 = datetime(2025, 6, 1, 9, 30, 0, 123456, tzinfo=UTC)


def create(store: SessionStore, session_id: str, **overrides: object) -> None:
    fields: dict[str, object] = {
        "butler": "health",
        "runtime": "claude-code",
        "model": None,
        "prompt": "p",
        "context": None,
        "trigger_source": "external",
    }
    fields.update(overrides)
    store.create_session(session_id, **fields)  # type: ignore[arg-type]


def run_python(code: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code), *args],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=SUBPROCESS_TIMEOUT_S,
        check=False,
    )


@pytest.fixture(params=["sqlite", "postgresql"])
def target(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """Where a store lives, once per backend: a SQLite file, a fresh PostgreSQL database."""
    if request.param == "sqlite":
        return str(tmp_path / "sessions.db")
    return str(request.getfixturevalue("postgres_url"))


@pytest.fixture
def store(target: str) -> Iterator[SessionStore]:
    with SessionStore(target) as s:
        yield s


sqlite_only = pytest.mark.sqlite_only


def rows(where: SessionStore | Path, sql: str) -> list[tuple[object, ...]]:
    """Read the database directly (SQL both engines speak), not through the store's methods."""
    if isinstance(where, SessionStore):
        return [tuple(r[k] for k in r.keys()) for r in where._db.query(sql)]  # noqa: SIM118
    conn = sqlite3.connect(where)
    try:
        return conn.execute(sql).fetchall()
    finally:
        conn.close()


def execute(where: SessionStore | Path, sql: str) -> None:
    if isinstance(where, SessionStore):
        with where._db.transaction() as tx:
            tx.execute(sql)
        return
    conn = sqlite3.connect(where, isolation_level=None)
    try:
        conn.execute(sql)
    finally:
        conn.close()


# -- sessions ------------------------------------------------------------------------------


def tool_calls() -> list[ToolCall]:
    first = ToolCall.start("call-1", "mcp__health__state_get", {"key": "w", "n": [1, 2]}, T0)
    second = ToolCall.start("call-2", "Bash", {"command": "echo é"}, T0 + timedelta(seconds=2))
    return [
        first.finish('{"found": true}', False, T0 + timedelta(milliseconds=1500)),
        second.finish("boom", True, T0 + timedelta(seconds=5)),
    ]


def full_result(**overrides: object) -> SpawnerResult:
    fields: dict[str, object] = {
        "output": "Weight noted: 71.2 kg",
        "tool_calls": tool_calls(),
        "success": True,
        "session_id": "s-1",
        "runtime_session_id": "rt-1",
        "duration_ms": 5123,
        "usage": Usage(100, 20, 3000, 400),
        "cost_usd": 0.0123,
        "trace_id": None,
        "model": "claude-haiku-4-5",
        "status": "success",
        "num_turns": 4,
        "budget": BudgetReport(limits={"max_tokens": 5000.0}, tokens=120, cache_read_tokens=3000),
        "attempts": (Attempt(1, T0 + timedelta(seconds=1), T0 + timedelta(seconds=6), "ok"),),
        "permissions": (
            PermissionAnswer(
                "call-2", "Bash", False, "notebook", T0 + timedelta(seconds=2), reason="not now"
            ),
        ),
    }
    fields.update(overrides)
    return SpawnerResult(**fields)  # type: ignore[arg-type]


def test_lifecycle_round_trips_every_column(store: SessionStore, tmp_path: Path) -> None:
    create(store, "parent", created_at=T0 - timedelta(hours=1))
    create(
        store,
        "s-1",
        model=None,
        prompt="Record 71.2 kg",
        context="yesterday: 71.5",
        trigger_source="schedule:weekly_summary",
        parent_session_id="parent",
        created_at=T0,
        log_dir=tmp_path / "logs" / "s-1",
    )
    queued = store.get_session("s-1")
    assert queued is not None
    assert (queued.status, queued.success, queued.started_at, queued.completed_at) == (
        "queued", None, None, None,
    )  # fmt: skip
    assert queued.tool_calls == [] and queued.usage == Usage()

    workspace = tmp_path / "butler_health_0"
    store.mark_started(
        "s-1", started_at=T0 + timedelta(seconds=1), trace_id="a" * 32, workspace=workspace
    )
    store.record_setup("s-1", sandbox="bwrap", given={"mcp_servers": ["health"]})
    running = store.get_session("s-1")
    assert running is not None and running.status == "running"
    assert running.workspace == workspace, "kept for the sweep, should the owner die"
    assert running.started_at == T0 + timedelta(seconds=1) and running.trace_id == "a" * 32

    done_at = T0 + timedelta(seconds=6)
    store.complete_session("s-1", full_result(), completed_at=done_at)
    record = store.get_session("s-1")
    assert record is not None
    assert record.to_dict() == {
        "id": "s-1",
        "butler": "health",
        "runtime": "claude-code",
        "model": "claude-haiku-4-5",
        "prompt": "Record 71.2 kg",
        "context": "yesterday: 71.5",
        "trigger_source": "schedule:weekly_summary",
        "status": "success",
        "success": True,
        "error": None,
        "error_kind": None,
        "output": "Weight noted: 71.2 kg",
        "tool_calls": [c.to_dict() for c in tool_calls()],
        "duration_ms": 5123,
        "input_tokens": 100,
        "output_tokens": 20,
        "cache_read_tokens": 3000,
        "cache_write_tokens": 400,
        "cost_usd": 0.0123,
        "num_turns": 4,
        "trace_id": "a" * 32,  # kept: the result carried none
        "runtime_session_id": "rt-1",
        "parent_session_id": "parent",
        "created_at": T0.isoformat(),
        "started_at": (T0 + timedelta(seconds=1)).isoformat(),
        "completed_at": done_at.isoformat(),
        "log_dir": str(tmp_path / "logs" / "s-1"),
        "role": None,
        "sandbox": "bwrap",
        "given": {"mcp_servers": ["health"]},
        "workspace": str(workspace),
        "kind": "run",
        "sources": [],
        "budget": asdict(
            BudgetReport(limits={"max_tokens": 5000.0}, tokens=120, cache_read_tokens=3000)
        ),
        "attempts": [
            {
                "number": 1,
                "started_at": (T0 + timedelta(seconds=1)).isoformat(),
                "ended_at": (T0 + timedelta(seconds=6)).isoformat(),
                "outcome": "ok",
                "message": None,
                "cooldown_s": 0.0,
                "stagger_s": 0.0,
            }
        ],
        "owner_host": store.host,
        "lease_until": record.lease_until.isoformat() if record.lease_until else None,
        "network_denied": 0,
        "permissions": [
            {
                "tool_call_id": "call-2",
                "tool": "Bash",
                "allowed": False,
                "by": "notebook",
                "at": (T0 + timedelta(seconds=2)).isoformat(),
                "always": False,
                "reason": "not now",
            },
        ],
    }
    assert record.lease_until is not None and record.lease_until > record.created_at
    assert record.tool_calls == tool_calls(), "tool calls round-trip with their datetimes"
    assert record.tool_calls[0].started_at.tzinfo is not None
    assert record.usage == Usage(100, 20, 3000, 400)
    assert record.log_dir == tmp_path / "logs" / "s-1"


def test_completion_keeps_values_the_result_does_not_carry(store: SessionStore) -> None:
    create(store, "s-1", model="opus", runtime_session_id="rt-0")
    store.complete_session(
        "s-1", full_result(model=None, runtime_session_id=None, trace_id="t" * 32)
    )
    record = store.get_session("s-1")
    assert record is not None
    assert (record.model, record.runtime_session_id, record.trace_id) == (
        "opus", "rt-0", "t" * 32,
    )  # fmt: skip


def test_failed_run_is_recorded(store: SessionStore) -> None:
    create(store, "s-1")
    store.complete_session(
        "s-1",
        SpawnerResult(
            output="partial", success=False, error="the CLI crashed", status="failed",
            error_kind="crash",
        ),
    )  # fmt: skip
    record = store.get_session("s-1")
    assert record is not None
    assert (record.status, record.success, record.error, record.error_kind, record.output) == (
        "failed", False, "the CLI crashed", "crash", "partial",
    )  # fmt: skip
    assert record.completed_at is not None and record.started_at is None


def test_a_session_is_completed_only_once(store: SessionStore) -> None:
    create(store, "s-1")
    store.complete_session("s-1", full_result(), completed_at=T0)
    first = store.get_session("s-1")
    store.complete_session(
        "s-1",
        SpawnerResult(output="late", success=False, status="cancelled", tool_calls=[]),
        completed_at=T0 + timedelta(hours=1),
    )
    store.mark_started("s-1", started_at=T0 + timedelta(hours=2), trace_id="late")
    assert store.get_session("s-1") == first
    calls = rows(store, "SELECT call_id FROM tool_calls WHERE session_id = 's-1'")
    assert calls == [("call-1",), ("call-2",)]


def test_tool_calls_table_rows(store: SessionStore) -> None:
    create(store, "s-1")
    store.complete_session("s-1", full_result())
    found = rows(
        store,
        "SELECT session_id, seq, call_id, name, server, tool, input, output, status, "
        "started_at, finished_at, duration_ms FROM tool_calls ORDER BY seq",
    )
    assert found == [
        (
            "s-1", 0, "call-1", "mcp__health__state_get", "health", "state_get",
            '{"key": "w", "n": [1, 2]}', '{"found": true}', "ok", T0.isoformat(),
            (T0 + timedelta(milliseconds=1500)).isoformat(), 1500,
        ),
        (
            "s-1", 1, "call-2", "Bash", None, "Bash", '{"command": "echo é"}', "boom", "error",
            (T0 + timedelta(seconds=2)).isoformat(), (T0 + timedelta(seconds=5)).isoformat(),
            3000,
        ),
    ]  # fmt: skip
    assert rows(store, "SELECT num_tool_calls FROM sessions") == [(2,)]


def test_tool_calls_are_written_live_while_the_run_is_open(store: SessionStore) -> None:
    """As each call starts and ends (other hosts see it), then rewritten by the result;
    a late write after the record closed changes nothing."""
    create(store, "s-1")
    create(store, "s-2")
    first, second = tool_calls()
    running = ToolCall.start(first.id, first.name, first.input, first.started_at)
    assert store.record_tool_call("s-1", 0, running)
    assert store.open_sessions() != [] and store.tool_call_names(["s-1", "s-2"]) == {
        "s-1": ["mcp__health__state_get"]
    }
    assert rows(store, "SELECT seq, status, finished_at FROM tool_calls") == [(0, "running", None)]
    assert store.record_tool_call("s-1", 0, first) and store.record_tool_call("s-1", 1, second)
    assert rows(store, "SELECT seq, status, duration_ms FROM tool_calls ORDER BY seq") == [
        (0, "ok", 1500), (1, "error", 3000),
    ]  # fmt: skip
    store.complete_session("s-1", full_result(tool_calls=[first]))
    assert not store.record_tool_call("s-1", 1, second), "the record is closed"
    assert rows(store, "SELECT seq, call_id, status FROM tool_calls") == [(0, "call-1", "ok")]
    assert [r.id for r in store.open_sessions()] == ["s-2"]
    assert store.tool_call_names([]) == {}


def test_unknown_session(store: SessionStore) -> None:
    assert store.get_session("nope") is None
    store.complete_session("nope", full_result())
    assert store.count_sessions() == 0
    assert rows(store, "SELECT count(*) FROM tool_calls") == [(0,)]


def test_list_sessions_filters_newest_first(store: SessionStore) -> None:
    assert store.list_sessions() == [] and store.count_sessions() == 0
    layout = [
        ("h1", "health", 0, True),
        ("g1", "general", 1, False),
        ("h2", "health", 2, False),
        ("h3", "health", 3, True),
        ("g2", "general", 4, True),
    ]
    for sid, butler, minute, finish in layout:
        create(store, sid, butler=butler, created_at=T0 + timedelta(minutes=minute))
        if finish:
            store.complete_session(sid, full_result())
    assert [r.id for r in store.list_sessions()] == ["g2", "h3", "h2", "g1", "h1"]
    assert [r.id for r in store.list_sessions(butler="health")] == ["h3", "h2", "h1"]
    assert [r.id for r in store.list_sessions(status="success")] == ["g2", "h3", "h1"]
    assert [r.id for r in store.list_sessions(status="queued", butler="general")] == ["g1"]
    assert [r.id for r in store.list_sessions(limit=2)] == ["g2", "h3"]
    assert [r.id for r in store.list_sessions(butler="health", limit=1)] == ["h3"]
    assert store.list_sessions(butler="nobody") == []
    assert store.count_sessions() == 5


def test_resolve_session_by_runtime_id_or_own_id(store: SessionStore) -> None:
    create(store, "first", runtime_session_id="rt-shared", created_at=T0)
    create(store, "resumed", runtime_session_id="rt-shared", created_at=T0 + timedelta(1))
    create(store, "other", created_at=T0)
    store.complete_session("other", full_result(runtime_session_id="rt-late"))
    assert store.resolve_session("rt-shared") == "resumed", "the newest run of a runtime id"
    assert store.resolve_session("first") == "first"
    assert store.resolve_session("rt-late") == "other", "a runtime id set at completion"
    assert store.resolve_session("unknown") is None


def test_record_mcp_call_resolves_the_runtime_session_id(store: SessionStore) -> None:
    create(store, "s-1", runtime_session_id="rt-1")
    resolved = store.record_mcp_call(
        butler="health", session_key="rt-1", tool="state_set",
        arguments={"key": "w", "value": [1, {"at": "x"}]}, result='{"ok": true}',
        is_error=False, called_at=T0, duration_ms=12,
    )  # fmt: skip
    by_own_id = store.record_mcp_call(
        butler="health", session_key="s-1", tool="state_get", arguments={},
        result="boom", is_error=True, called_at=T0 + timedelta(seconds=1), duration_ms=3,
    )  # fmt: skip
    assert resolved == by_own_id == "s-1"
    calls = store.mcp_calls("s-1")
    for call in calls:
        del call["id"]
    assert calls == [
        {
            "butler": "health", "session_key": "rt-1", "session_id": "s-1",
            "tool": "state_set", "arguments": {"key": "w", "value": [1, {"at": "x"}]},
            "result": '{"ok": true}', "is_error": False, "called_at": T0.isoformat(),
            "duration_ms": 12,
        },
        {
            "butler": "health", "session_key": "s-1", "session_id": "s-1",
            "tool": "state_get", "arguments": {}, "result": "boom", "is_error": True,
            "called_at": (T0 + timedelta(seconds=1)).isoformat(), "duration_ms": 3,
        },
    ]  # fmt: skip


def test_record_mcp_call_with_an_unknown_key(store: SessionStore) -> None:
    for key in ("not-a-session", None):
        resolved = store.record_mcp_call(
            butler="health", session_key=key, tool="state_get", arguments={"key": "k"},
            result="{}", is_error=False, called_at=T0, duration_ms=1,
        )  # fmt: skip
        assert resolved is None
    assert rows(store, "SELECT session_key, session_id, tool FROM mcp_calls ORDER BY id") == [
        ("not-a-session", None, "state_get"),
        (None, None, "state_get"),
    ]


# -- crash recovery with real processes -------------------------------------------------------

CRASHING_OWNER = """
import os, sys
from datetime import UTC, datetime
from spawnkit.store import SessionStore

store = SessionStore(sys.argv[1])
for sid in sys.argv[2:]:
    store.create_session(
        sid, butler="health", runtime="claude-code", model=None, prompt="p",
        context=None, trigger_source="external",
    )
    store.mark_started(sid, started_at=datetime.now(UTC))
print(os.getpid(), flush=True)
os._exit(0)  # dies without completing or closing anything
"""


def test_a_new_store_marks_sessions_of_a_dead_process_crashed(target: str) -> None:
    db = target
    with SessionStore(db) as live:
        create(live, "mine")
        proc = run_python(CRASHING_OWNER, db, "dead-1")
        assert (proc.returncode, proc.stderr) == (0, "")
        dead_pid = int(proc.stdout)
        assert rows(live, "SELECT owner_pid, status FROM sessions WHERE id = 'dead-1'") == [
            (dead_pid, "running")
        ]
        before = datetime.now(UTC)
        with SessionStore(db) as reopened:
            crashed = reopened.get_session("dead-1")
            mine = reopened.get_session("mine")
        assert crashed is not None and mine is not None
        assert (crashed.status, crashed.success, crashed.error_kind, crashed.error) == (
            "crashed", False, "crash",
            f"the process that ran this session (pid {dead_pid}) died before it completed; "
            "no leftover processes",
        )  # fmt: skip
        assert crashed.completed_at is not None and crashed.completed_at >= before
        assert crashed.started_at is not None, "what was recorded before the crash stays"
        assert (mine.status, mine.completed_at) == ("queued", None), "a live owner's run stays"


def test_recover_orphans_returns_the_count(target: str) -> None:
    with SessionStore(target) as store:
        create(store, "mine")
        proc = run_python(CRASHING_OWNER, target, "dead-1", "dead-2")
        assert (proc.returncode, proc.stderr) == (0, "")
        assert store.recover_orphans() == 2
        assert store.recover_orphans() == 0, "a crashed session is marked once"
        assert sorted(r.id for r in store.list_sessions(status="crashed")) == ["dead-1", "dead-2"]
        assert store.get_session("mine").status == "queued"  # type: ignore[union-attr]


def test_a_reused_pid_does_not_keep_a_session_open(store: SessionStore) -> None:
    create(store, "s-1")
    # Same live pid, different start time: the pid was reused by another process.
    execute(store, "UPDATE sessions SET owner_start = '1' WHERE id = 's-1'")
    assert store.recover_orphans() == 1
    assert store.get_session("s-1").status == "crashed"  # type: ignore[union-attr]


def test_sessions_of_another_host_are_left_alone(target: str) -> None:
    with SessionStore(target) as store:
        proc = run_python(CRASHING_OWNER, target, "remote")
        assert proc.returncode == 0
        execute(store, "UPDATE sessions SET owner_host = 'elsewhere.example'")
        assert store.recover_orphans() == 0
        assert store.get_session("remote").status == "running"  # type: ignore[union-attr]


def test_a_run_whose_lease_ran_out_elsewhere_is_crashed_once(target: str) -> None:
    with SessionStore(target, lease_s=60) as store:
        for sid in ("gone", "renewed", "mine"):
            create(store, sid)
        execute(store, "UPDATE sessions SET owner_host = 'host-a' WHERE id = 'gone'")
        with SessionStore(target) as other:  # another process sees host-a's live lease
            assert other.recover_orphans() == 0
        assert store.get_session("gone").status == "queued"  # type: ignore[union-attr]

        past = (datetime.now(UTC) - timedelta(seconds=1)).isoformat(timespec="microseconds")
        execute(store, f"UPDATE sessions SET lease_until = '{past}'")
        assert store.renew_leases(["renewed", "missing"]) == 1
        renewed = store.get_session("renewed")
        assert renewed is not None and renewed.lease_until is not None
        assert renewed.lease_until > datetime.now(UTC) + timedelta(seconds=50)
        execute(store, "UPDATE sessions SET owner_host = 'host-a' WHERE id = 'renewed'")
        before = datetime.now(UTC)
        with SessionStore(target):  # opening the store closes what ran out
            pass
        gone = store.get_session("gone")
        assert gone is not None and (gone.status, gone.success, gone.error_kind) == (
            "crashed", False, "crash",
        )  # fmt: skip
        assert gone.error == (
            f"the lease of host host-a ran out at {past} without a renewal: the host died or "
            f"lost the network before the run completed (seen by {store.host})"
        )
        assert gone.completed_at is not None and gone.completed_at >= before
        assert gone.owner_host == "host-a"
        assert store.get_session("renewed").status == "queued"  # type: ignore[union-attr]
        mine = store.get_session("mine")
        assert mine is not None and mine.status == "queued", "a live owner here outlives its lease"
        assert store.expire_leases() == [], "closed once"


def test_a_dispatched_runs_queued_record_is_adopted_once_or_closed_by_its_client(
    target: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The client's ``queued`` record (spawnkit.run.dispatch): a worker adopts it once, with the
    run's details; one no worker adopted is closed or withdrawn by its client only."""
    with SessionStore(target) as client:
        monkeypatch.setenv("SPAWNKIT_HOST", "worker-host")
        with SessionStore(target) as worker:
            assert worker.owner == ("worker-host", client.owner[1])
            for sid in ("adopted", "cancelled", "refused"):
                create(client, sid, model="m-client", prompt="client's text")
            details = {"model": None, "prompt": "worker's text", "context": "c",
                       "runtime_session_id": "rt-1", "log_dir": Path("/logs/adopted")}  # fmt: skip
            assert worker.adopt_session("adopted", queued_by=client.owner, **details)
            record = worker.get_session("adopted")
            assert record is not None and (record.status, record.started_at) == ("queued", None)
            assert (record.owner_host, record.owner_pid) == worker.owner
            assert (record.model, record.prompt, record.context, record.runtime_session_id,
                    record.log_dir) == ("m-client", "worker's text", "c", "rt-1",
                                        Path("/logs/adopted"))  # fmt: skip
            # Once adopted: no second worker takes it, its client no longer closes it.
            assert not worker.adopt_session("adopted", queued_by=client.owner, **details)
            assert not client.close_queued(
                "adopted", status="cancelled", error="x", error_kind="cancelled"
            )
            assert not client.withdraw_queued("adopted")

            assert not worker.close_queued(  # not the worker's record
                "cancelled", status="cancelled", error="x", error_kind="cancelled"
            )
            assert client.close_queued(
                "cancelled", status="cancelled", error="cancelled before it started",
                error_kind="cancelled",
            )  # fmt: skip
            closed = client.get_session("cancelled")
            assert closed is not None and closed.completed_at is not None
            assert (closed.status, closed.success, closed.error_kind, closed.error) == (
                "cancelled",
                False,
                "cancelled",
                "cancelled before it started",
            )
            assert not worker.adopt_session("cancelled", queued_by=client.owner, **details)

            assert client.withdraw_queued("refused")
            assert client.get_session("refused") is None
            assert sorted(r.id for r in client.list_sessions()) == ["adopted", "cancelled"]


# -- several processes at once ---------------------------------------------------------------

WRITER = """
import sys
from spawnkit.result import SpawnerResult, ToolCall
from spawnkit.store import SessionStore, utcnow

db, worker = sys.argv[1], sys.argv[2]
print("ready", flush=True)
assert sys.stdin.readline() == "go\\n"  # the parent releases every writer at once
store = SessionStore(db)
for i in range(50):
    sid = f"{worker}-{i}"
    store.create_session(
        sid, butler=f"b{worker}", runtime="claude-code", model=None, prompt=str(i),
        context=None, trigger_source="external",
    )
    store.mark_started(sid, started_at=utcnow())
    call = ToolCall.start("c", "Bash", {"i": i}, utcnow()).finish("ok", False, utcnow())
    store.complete_session(sid, SpawnerResult(output=sid, tool_calls=[call], session_id=sid))
store.close()
print("done", flush=True)
"""


def test_four_processes_write_at_once(target: str) -> None:
    db = target
    # The file exists, as after the first use (a brand-new file is tested below).
    SessionStore(db).close()
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", textwrap.dedent(WRITER), db, str(n)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=REPO,
        )
        for n in range(4)
    ]
    try:
        # Each writer has imported everything before any is released (a line from a
        # pipe: no timeout of its own, so the test's 180 s limit bounds it).
        for proc in procs:
            assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
        for proc in procs:
            assert proc.stdin is not None
            proc.stdin.write("go\n")
            proc.stdin.flush()
        outcomes = [proc.communicate(timeout=SUBPROCESS_TIMEOUT_S) for proc in procs]
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=10)
    assert [(p.returncode, out, err) for p, (out, err) in zip(procs, outcomes, strict=True)] == [
        (0, "done\n", "")
    ] * 4
    with SessionStore(db) as store:
        assert store.count_sessions() == 200
        records = store.list_sessions(limit=1000)
        assert rows(store, "SELECT count(*) AS n FROM tool_calls") == [(200,)]
    assert {(r.status, r.success) for r in records} == {("success", True)}
    assert all(r.completed_at and r.output == r.id for r in records)
    assert sorted(r.id for r in records) == sorted(f"{w}-{i}" for w in range(4) for i in range(50))


@sqlite_only
def test_opening_a_new_file_waits_for_another_writer(tmp_path: Path) -> None:
    # Models the window in which another process has created the file and is writing
    # to it before its own switch to WAL is done.
    db = tmp_path / "sessions.db"
    writer = sqlite3.connect(db, isolation_level=None, check_same_thread=False)
    writer.execute("CREATE TABLE other (x)")
    writer.execute("BEGIN IMMEDIATE")
    writer.execute("INSERT INTO other VALUES (1)")
    release = threading.Timer(0.3, writer.execute, ("COMMIT",))
    release.start()
    try:
        with SessionStore(db) as store:  # must wait (busy timeout 15 s), not fail
            assert store.count_sessions() == 0
    finally:
        release.join(timeout=10)
        writer.close()


# -- the file ----------------------------------------------------------------------------------


@sqlite_only
def test_wal_mode_and_owner_only_file(tmp_path: Path) -> None:
    db = tmp_path / "sessions.db"
    SessionStore(db).close()
    assert rows(db, "PRAGMA journal_mode") == [("wal",)]
    assert stat.S_IMODE(db.stat().st_mode) == 0o600
    assert rows(db, "PRAGMA user_version") == [(SCHEMA_VERSION,)]


@sqlite_only
def test_default_path_is_under_spawnkit_home(isolated_home: Path) -> None:
    with SessionStore() as store:
        assert store.path == isolated_home / "sessions.db"
        create(store, "s-1")
    assert rows(isolated_home / "sessions.db", "SELECT id FROM sessions") == [("s-1",)]


@sqlite_only
def test_newer_schema_is_refused(tmp_path: Path) -> None:
    db = tmp_path / "sessions.db"
    execute(db, "PRAGMA user_version = 99")
    with pytest.raises(StoreError) as info:
        SessionStore(db)
    assert str(info.value) == (
        f"the session store {db} has schema 99, newer than the schema {SCHEMA_VERSION} "
        "this spawnkit reads: upgrade spawnkit"
    )


@sqlite_only
def test_a_version_1_file_is_migrated(tmp_path: Path) -> None:
    db = tmp_path / "sessions.db"
    with SessionStore(db) as store:
        create(store, "old")
    _as_schema_3(db)
    execute(db, "ALTER TABLE sessions DROP COLUMN role")  # as schema 2 wrote it
    execute(db, "ALTER TABLE sessions DROP COLUMN log_dir")  # as schema 1 wrote it
    execute(db, "PRAGMA user_version = 1")
    with SessionStore(db) as store:
        old = store.get_session("old")
        create(store, "new", log_dir=tmp_path / "logs", role="researcher")
        new = store.get_session("new")
    assert rows(db, "PRAGMA user_version") == [(SCHEMA_VERSION,)] == [(16,)]
    assert old is not None and old.log_dir is None and old.status == "queued"
    assert new is not None and new.log_dir == tmp_path / "logs" and new.role == "researcher"


@sqlite_only
def test_a_version_2_file_is_migrated(tmp_path: Path) -> None:
    db = tmp_path / "sessions.db"
    with SessionStore(db) as store:
        create(store, "old")
    _as_schema_3(db)
    execute(db, "ALTER TABLE sessions DROP COLUMN role")
    execute(db, "PRAGMA user_version = 2")
    with SessionStore(db) as store:
        create(store, "new", role="writer")
        assert store.get_session("new").role == "writer"  # type: ignore[union-attr]
        assert store.get_session("old").role is None  # type: ignore[union-attr]


def _as_schema_6(db: Path) -> None:
    _as_schema_7(db)
    execute(db, "ALTER TABLE sessions DROP COLUMN kind")
    execute(db, "ALTER TABLE sessions DROP COLUMN sources")
    execute(db, "PRAGMA user_version = 6")


def _as_schema_7(db: Path) -> None:
    _as_schema_8(db)
    execute(db, "ALTER TABLE sessions DROP COLUMN budget")
    execute(db, "PRAGMA user_version = 7")


@sqlite_only
def test_a_version_6_file_is_migrated(tmp_path: Path) -> None:
    db = tmp_path / "sessions.db"
    with SessionStore(db) as store:
        create(store, "old")
    _as_schema_6(db)
    with SessionStore(db) as store:
        store.create_session(
            "asked", butler="ask", runtime="codex", model=None, prompt="q", context=None,
            trigger_source="external", kind="ask", sources=["notes", "repo"],
        )  # fmt: skip
        old, asked = store.get_session("old"), store.get_session("asked")
    assert rows(db, "PRAGMA user_version") == [(SCHEMA_VERSION,)] == [(16,)]
    assert old is not None and (old.kind, old.sources) == ("run", ())
    assert asked is not None and (asked.kind, asked.sources) == ("ask", ("notes", "repo"))
    assert asked.to_dict()["sources"] == ["notes", "repo"]


def _as_schema_5(db: Path) -> None:
    _as_schema_6(db)
    execute(db, "ALTER TABLE sessions DROP COLUMN workspace")
    execute(db, "PRAGMA user_version = 5")


def _as_schema_4(db: Path) -> None:
    _as_schema_5(db)
    for name in ("history_epoch", "history_files", "history_lines", "history_usage"):
        execute(db, f"DROP TABLE {name}")
    for kind in ("session_update", "session_delete", "call_update", "call_delete"):
        execute(db, f"DROP TRIGGER history_epoch_{kind}")
    execute(db, "PRAGMA user_version = 4")


def _as_schema_3(db: Path) -> None:
    _as_schema_4(db)
    execute(db, "ALTER TABLE sessions DROP COLUMN sandbox")
    execute(db, "ALTER TABLE sessions DROP COLUMN given")
    execute(db, "PRAGMA user_version = 3")


@sqlite_only
def test_a_version_3_file_is_migrated(tmp_path: Path) -> None:
    db = tmp_path / "sessions.db"
    with SessionStore(db) as store:
        create(store, "old")
    _as_schema_3(db)
    with SessionStore(db) as store:
        create(store, "new")
        store.record_setup("new", sandbox="bwrap", given={"tools": ["Bash"]})
        new, old = store.get_session("new"), store.get_session("old")
    assert new is not None and new.sandbox == "bwrap" and new.given == {"tools": ["Bash"]}
    assert old is not None and old.sandbox is None and old.given is None


@sqlite_only
def test_a_version_5_file_is_migrated(tmp_path: Path) -> None:
    db = tmp_path / "sessions.db"
    with SessionStore(db) as store:
        create(store, "old")
    _as_schema_5(db)
    with SessionStore(db) as store:
        create(store, "new")
        store.mark_started("new", started_at=T0, workspace=tmp_path / "butler_x_1")
        new, old = store.get_session("new"), store.get_session("old")
    assert new is not None and new.workspace == tmp_path / "butler_x_1"
    assert old is not None and old.workspace is None


@sqlite_only
def test_a_version_7_file_is_migrated(tmp_path: Path) -> None:
    db = tmp_path / "sessions.db"
    with SessionStore(db) as store:
        create(store, "old")
    _as_schema_7(db)
    with SessionStore(db) as store:
        create(store, "new")
        store.complete_session("new", full_result())
        new, old = store.get_session("new"), store.get_session("old")
    assert rows(db, "PRAGMA user_version") == [(SCHEMA_VERSION,)] == [(16,)]
    assert new is not None and new.budget is not None and new.budget.tokens == 120
    assert old is not None and old.budget is None


@sqlite_only
def test_a_file_that_is_not_a_database(tmp_path: Path) -> None:
    db = tmp_path / "sessions.db"
    db.write_bytes(b"this is not sqlite" * 100)
    with pytest.raises(StoreDamaged, match=f"^the session store {db} is damaged ") as info:
        SessionStore(db)
    assert "spawnkit store check --repair" in str(info.value)
    assert isinstance(info.value, StoreError)


def test_reopening_keeps_the_data(target: str) -> None:
    db = target
    with SessionStore(db) as store:
        create(store, "s-1")
        store.complete_session("s-1", full_result())
        store.state_set("health", "k", 1)
    with SessionStore(db) as again:
        assert again.get_session("s-1").status == "success"  # type: ignore[union-attr]
        assert again.state_get("health", "k") == 1


# -- state -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "value",
    [{"a": [1, 2.5, None], "é": "ü"}, [1, "two", {"three": 3}], 42, 3.25, "text", True, None],
)
def test_state_values_round_trip(store: SessionStore, value: object) -> None:
    store.state_set("health", "key", value)
    assert store.state_lookup("health", "key") == (True, value)
    assert store.state_get("health", "key") == value


def test_stored_null_differs_from_absent(store: SessionStore) -> None:
    store.state_set("health", "nothing", None)
    assert store.state_lookup("health", "nothing") == (True, None)
    assert store.state_lookup("health", "absent") == (False, None)
    assert store.state_get("health", "absent") is None


def test_state_set_replaces(store: SessionStore) -> None:
    store.state_set("health", "w", [1])
    store.state_set("health", "w", {"now": 2})
    assert store.state_list("health") == {"w": {"now": 2}}


def test_state_is_per_butler(store: SessionStore) -> None:
    store.state_set("health", "k", "h")
    store.state_set("general", "k", "g")
    store.state_set("general", "only-general", 1)
    assert store.state_get("health", "k") == "h" and store.state_get("general", "k") == "g"
    assert store.state_list("health") == {"k": "h"}
    assert store.state_list("general") == {"k": "g", "only-general": 1}
    assert store.state_lookup("health", "only-general") == (False, None)


def test_state_list_prefix_is_literal(store: SessionStore) -> None:
    for key in ["a_b", "axb", "a_c/1", "50%", "50x", "5", "back\\slash", "backXslash", "z"]:
        store.state_set("health", key, key)
    assert list(store.state_list("health", "a_")) == ["a_b", "a_c/1"]
    assert list(store.state_list("health", "50%")) == ["50%"]
    assert list(store.state_list("health", "back\\")) == ["back\\slash"]
    assert list(store.state_list("health", "%")) == []
    assert list(store.state_list("health", "_")) == []
    assert list(store.state_list("health")) == sorted(
        ["a_b", "axb", "a_c/1", "50%", "50x", "5", "back\\slash", "backXslash", "z"]
    )


def test_state_list_prefix_is_case_sensitive(store: SessionStore) -> None:
    store.state_set("relationship", "people/Ada Lovelace", 1)
    store.state_set("relationship", "people/ada", 2)
    assert store.state_list("relationship", "people/ada") == {"people/ada": 2}


# -- credentials --------------------------------------------------------------------------------


def test_resolve_prefers_the_credentials_file_over_the_environment(store: SessionStore) -> None:
    CredentialFile.beside_dir(store.local_dir).set("TOKEN", "from-file")
    creds = CredentialStore(store, environ={"TOKEN": "from-env", "ONLY_ENV": "env"})
    assert creds.file is not None and creds.file.path == store.local_dir / "credentials.json"
    assert creds.resolve("TOKEN") == "from-file"
    assert creds.resolve("ONLY_ENV") == "env"
    assert creds.resolve("NOWHERE") is None
    assert CredentialStore(None, environ={"TOKEN": "e"}).resolve("TOKEN") == "e"
    other = CredentialFile(store.local_dir / "elsewhere.json")
    other.set("TOKEN", "from-other")
    assert CredentialStore(store, {}, file=other).resolve("TOKEN") == "from-other"


def test_resolve_defaults_to_os_environ(
    store: SessionStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SPAWNKIT_TEST_ONLY_VAR", "from-os")
    assert CredentialStore(store).resolve("SPAWNKIT_TEST_ONLY_VAR") == "from-os"


ENV_BUTLER = """
[butler.env]
required = ["NEEDED"]
optional = ["MAYBE", "ABSENT_OPTIONAL"]

[modules.mail]
credentials = ["MAIL_PASSWORD"]
"""


def test_isolated_env_has_only_the_allowed_names(
    make_butler: RosterFactory, store: SessionStore
) -> None:
    butler = make_butler(extra=ENV_BUTLER)
    CredentialFile.beside_dir(store.local_dir).set("MAIL_PASSWORD", "p@ss word")
    environ = {
        "PATH": "/usr/bin:/bin",
        "ANTHROPIC_API_KEY": "sk-ant",
        "NEEDED": "n",
        "MAYBE": "m",
        "MAIL_PASSWORD": "env loses",
        "HOME": "/home/someone",
        "AWS_SECRET_ACCESS_KEY": "canary-must-not-leak",
        "SPAWNKIT_CANARY": "canary",
    }
    env = isolated_env(
        butler, CredentialStore(store, environ), ("HOME",), {"SPAWNKIT_SESSION_ID": "s-1"}
    )
    assert env == {
        "PATH": "/usr/bin:/bin",
        "ANTHROPIC_API_KEY": "sk-ant",
        "NEEDED": "n",
        "MAYBE": "m",
        "MAIL_PASSWORD": "p@ss word",
        "HOME": "/home/someone",
        "SPAWNKIT_SESSION_ID": "s-1",
    }


def test_check_required_lists_every_missing_name(
    make_butler: RosterFactory, store: SessionStore
) -> None:
    butler = make_butler(extra='[butler.env]\nrequired = ["ONE", "TWO", "THREE"]\n')
    creds = CredentialStore(store, environ={"TWO": "2", "THREE": ""})
    with pytest.raises(MissingEnvError) as info:
        check_required(butler, creds)
    assert info.value.names == ["ONE", "THREE"], "an empty value counts as missing"
    assert str(info.value) == (
        "butler 'health' requires ONE, THREE: set them in the environment or with "
        "`spawnkit credentials set NAME`"
    )
    with pytest.raises(MissingEnvError, match="requires ONE, THREE: set them"):
        isolated_env(butler, creds, ())
    CredentialFile.beside_dir(store.local_dir).set("ONE", "1")
    with pytest.raises(MissingEnvError) as one:
        check_required(butler, creds)
    assert str(one.value).startswith("butler 'health' requires THREE: set it in")
    CredentialFile.beside_dir(store.local_dir).set("THREE", "3")
    check_required(butler, creds)


# -- memory -------------------------------------------------------------------------------------


def episode(minute: int, prompt: str = "how much?", output: str = "71 kg") -> dict[str, str]:
    return {
        "created_at": (T0 + timedelta(minutes=minute)).isoformat(),
        "prompt": prompt,
        "output": output,
    }


def entry(minute: int, prompt: str = "how much?", output: str = "71 kg") -> str:
    stamp = (T0 + timedelta(minutes=minute)).strftime("%Y-%m-%d %H:%M")
    return f"- {stamp} UTC\n  asked: {prompt}\n  answered: {output}"


HEADER = "## What you remember from recent runs\n\n"


def test_render_episodes_keeps_the_newest_that_fit_oldest_first() -> None:
    newest_first = [episode(3), episode(2), episode(1)]
    size = len(entry(1))
    assert all(len(entry(m)) == size for m in (1, 2, 3))
    two = (2 * size + 3) // 4  # tokens for exactly two entries, not three
    assert 2 * size <= two * 4 < 3 * size
    assert render_episodes(newest_first, two) == HEADER + entry(2) + "\n" + entry(3)
    assert render_episodes(newest_first, 10_000) == HEADER + "\n".join(
        [entry(1), entry(2), entry(3)]
    )
    assert render_episodes(newest_first, (size + 3) // 4) == HEADER + entry(3)


def test_render_episodes_none_when_nothing_fits() -> None:
    assert render_episodes([], 10_000) is None
    assert render_episodes([episode(1)], 1) is None


def test_render_episodes_flattens_and_truncates() -> None:
    long_output = "word " * 400
    text = render_episodes([episode(1, prompt="two\n  lines\tand tabs", output=long_output)], 9999)
    flat = " ".join(long_output.split())
    assert text == HEADER + entry(1, "two lines and tabs", flat[:599] + "…")


async def test_store_memory_round_trip(store: SessionStore) -> None:
    memory = StoreMemory(store, max_tokens=10_000, max_episodes=2)
    assert await memory.fetch_context("health", "anything") is None
    for i in range(3):
        await memory.store_episode("health", f"s-{i}", f"prompt {i}", f"output {i}")
    store.add_episode("general", None, "other butler", "not mine")
    recent = store.recent_episodes("health", 5)
    assert [(e["session_id"], e["prompt"], e["output"]) for e in recent] == [
        ("s-2", "prompt 2", "output 2"),
        ("s-1", "prompt 1", "output 1"),
        ("s-0", "prompt 0", "output 0"),
    ]
    created = datetime.fromisoformat(recent[0]["created_at"])
    assert abs(datetime.now(UTC) - created) < timedelta(minutes=5)
    context = await memory.fetch_context("health", "anything")
    assert context is not None and context.startswith(HEADER)
    body = context.removeprefix(HEADER)
    assert [line for line in body.splitlines() if "asked" in line] == [
        "  asked: prompt 1",
        "  asked: prompt 2",
    ], "max_episodes newest, shown oldest first"
    assert "not mine" not in context
    assert store.recent_episodes("general", 5)[0]["session_id"] is None


def test_store_memory_from_module_config(store: SessionStore) -> None:
    memory = StoreMemory.from_module_config(store, {"max_tokens": 1500})
    assert (memory.max_tokens, memory.max_episodes) == (1500, 20)
    memory = StoreMemory.from_module_config(store, {"max_episodes": 3})
    assert (memory.max_tokens, memory.max_episodes) == (2000, 3)


def _as_schema_10(db: Path) -> None:
    _as_schema_11(db)
    execute(db, "DROP TABLE cli_events")
    execute(db, "PRAGMA user_version = 10")


def _as_schema_14(db: Path) -> None:
    execute(db, "ALTER TABLE sessions DROP COLUMN permissions")
    execute(db, "PRAGMA user_version = 14")


def _as_schema_13(db: Path) -> None:
    _as_schema_14(db)
    execute(db, "ALTER TABLE sessions DROP COLUMN network_denied")
    execute(db, "PRAGMA user_version = 13")


@sqlite_only
def test_a_version_14_file_is_migrated_and_keeps_permission_answers(tmp_path: Path) -> None:
    db = tmp_path / "sessions.db"
    with SessionStore(db) as store:
        create(store, "old")
        store.complete_session("old", replace(full_result(), permissions=()))
    _as_schema_14(db)
    with SessionStore(db) as store:
        create(store, "new")
        store.complete_session("new", full_result())
        old, new = store.get_session("old"), store.get_session("new")
        listed = {r.id: len(r.permissions) for r in store.list_sessions()}
    assert rows(db, "PRAGMA user_version") == [(SCHEMA_VERSION,)] == [(16,)]
    assert old is not None and old.permissions == () and old.status == "success"
    assert new is not None and new.permissions == full_result().permissions
    assert listed == {"old": 0, "new": 1}


def test_the_connections_a_run_was_refused_are_counted_in_its_record(
    store: SessionStore,
) -> None:
    create(store, "refused")
    create(store, "clean")
    store.complete_session("refused", replace(full_result(), network_denied=3))
    store.complete_session("clean", full_result())
    refused, clean = store.get_session("refused"), store.get_session("clean")
    assert refused is not None and clean is not None
    assert (refused.network_denied, clean.network_denied) == (3, 0)
    assert refused.to_dict()["network_denied"] == 3
    listed = {r.id: r.network_denied for r in store.list_sessions()}
    assert listed == {"refused": 3, "clean": 0}


@sqlite_only
def test_a_version_13_file_is_migrated(tmp_path: Path) -> None:
    db = tmp_path / "sessions.db"
    with SessionStore(db) as store:
        create(store, "old")
        store.complete_session("old", full_result())
    _as_schema_13(db)
    with SessionStore(db) as store:
        create(store, "new")
        store.complete_session("new", replace(full_result(), network_denied=2))
        old, new = store.get_session("old"), store.get_session("new")
    assert rows(db, "PRAGMA user_version") == [(SCHEMA_VERSION,)] == [(16,)]
    assert old is not None and old.network_denied == 0 and old.status == "success"
    assert new is not None and new.network_denied == 2


def _as_schema_12(db: Path) -> None:
    _as_schema_13(db)
    execute(db, "ALTER TABLE sessions DROP COLUMN owner_seal")
    execute(db, "PRAGMA user_version = 12")


@sqlite_only
def test_a_version_12_file_is_migrated(tmp_path: Path) -> None:
    """A record from before seals, whose owner died, is closed, and nothing is killed or
    removed for it (the sweep cannot tell which home wrote it)."""
    db = tmp_path / "sessions.db"
    proc = run_python(CRASHING_OWNER, str(db), "old")
    assert (proc.returncode, proc.stderr) == (0, "")
    _as_schema_12(db)
    with SessionStore(db) as store:
        create(store, "new")
        old, new = store.get_session("old"), store.get_session("new")
        seals = rows(store, "SELECT id, owner_seal IS NOT NULL FROM sessions ORDER BY id")
    assert rows(db, "PRAGMA user_version") == [(SCHEMA_VERSION,)] == [(16,)]
    assert seals == [("new", 1), ("old", 0)]
    assert old is not None and old.status == "crashed"
    assert (old.error or "").endswith(
        "its record does not carry this home's seal, so nothing was killed or removed for it"
    )
    assert new is not None and new.status == "queued"


def _as_schema_11(db: Path) -> None:
    _as_schema_12(db)
    execute(db, "DROP INDEX sessions_lease")
    execute(db, "ALTER TABLE sessions DROP COLUMN lease_until")
    execute(db, "PRAGMA user_version = 11")


@sqlite_only
def test_a_version_11_file_is_migrated(tmp_path: Path) -> None:
    db = tmp_path / "sessions.db"
    with SessionStore(db) as store:
        create(store, "old")
    _as_schema_11(db)
    with SessionStore(db, lease_s=30) as store:
        create(store, "new")
        new, old = store.get_session("new"), store.get_session("old")
        assert store.expire_leases() == [], "a record without a lease never expires"
    assert rows(db, "PRAGMA user_version") == [(SCHEMA_VERSION,)] == [(16,)]
    assert old is not None and old.lease_until is None and old.status == "queued"
    assert new is not None and new.lease_until is not None
    assert timedelta(seconds=29) < new.lease_until - new.created_at < timedelta(seconds=31)
    indexes = rows(db, "SELECT name FROM sqlite_master WHERE type = 'index'")
    assert ("sessions_lease",) in indexes


def _as_schema_9(db: Path) -> None:
    _as_schema_10(db)
    execute(db, "DROP TABLE cli_spans")
    execute(db, "PRAGMA user_version = 9")


CLI_EVENT = {
    "session_id": "old", "kind": "log", "name": "api_request", "service": "claude-code",
    "time_ns": 5, "trace_id": "t" * 32, "span_id": "s" * 16, "value": None,
    "attributes": {"model": "m", "input_tokens": 12},
}  # fmt: skip


def test_cli_events_are_kept_per_session(store: SessionStore) -> None:
    point = {**CLI_EVENT, "kind": "metric", "name": "token.usage", "time_ns": 3,
             "trace_id": None, "span_id": None, "value": 42.5}  # fmt: skip
    other = {**CLI_EVENT, "session_id": "other"}
    assert store.record_cli_events([CLI_EVENT, point, other]) == 3
    assert store.record_cli_events([]) == 0
    assert store.cli_events("old") == [point, CLI_EVENT]
    assert len(store.cli_events()) == 3


@sqlite_only
def test_a_version_10_file_is_migrated(tmp_path: Path) -> None:
    db = tmp_path / "sessions.db"
    with SessionStore(db) as store:
        create(store, "old")
    _as_schema_10(db)
    with SessionStore(db) as store:
        assert store.record_cli_events([CLI_EVENT]) == 1
        assert store.cli_events("old") == [CLI_EVENT]
    assert rows(db, "PRAGMA user_version") == [(SCHEMA_VERSION,)] == [(16,)]


@sqlite_only
def test_a_version_9_file_is_migrated(tmp_path: Path) -> None:
    db = tmp_path / "sessions.db"
    with SessionStore(db) as store:
        create(store, "old")
    _as_schema_9(db)
    span = {
        "session_id": "old", "trace_id": "t" * 32, "span_id": "s" * 16, "parent_span_id": None,
        "name": "claude_code.llm_request", "service": "claude-code", "start_ns": 1,
        "end_ns": 2, "status": "ok", "attributes": {"model": "m"}, "reparented": False,
    }  # fmt: skip
    with SessionStore(db) as store:
        assert store.record_cli_spans([span]) == 1
        assert store.cli_spans("old") == [span]
    assert rows(db, "PRAGMA user_version") == [(SCHEMA_VERSION,)] == [(16,)]


def _as_schema_8(db: Path) -> None:
    _as_schema_9(db)
    execute(db, "ALTER TABLE sessions DROP COLUMN attempts")
    execute(db, "PRAGMA user_version = 8")


@sqlite_only
def test_a_version_8_file_is_migrated(tmp_path: Path) -> None:
    db = tmp_path / "sessions.db"
    with SessionStore(db) as store:
        create(store, "old")
        store.complete_session("old", full_result())
    _as_schema_8(db)
    limited = Attempt(1, T0, T0 + timedelta(seconds=1), "rate_limit", "429", cooldown_s=0.0)
    retried = Attempt(2, T0 + timedelta(seconds=3), T0 + timedelta(seconds=5), "ok",
                      cooldown_s=2.0)  # fmt: skip
    with SessionStore(db) as store:
        create(store, "new")
        store.complete_session("new", replace(full_result(), attempts=(limited, retried)))
        new, old = store.get_session("new"), store.get_session("old")
    assert rows(db, "PRAGMA user_version") == [(SCHEMA_VERSION,)] == [(16,)]
    assert new is not None and new.attempts == (limited, retried)
    assert new.to_dict()["attempts"][1]["cooldown_s"] == 2.0
    assert new.to_dict()["attempts"][0]["started_at"] == T0.isoformat()
    assert old is not None and old.attempts == () and old.budget is not None
