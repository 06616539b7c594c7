"""What only a store on a server has: a URL to choose it, a password to keep out of messages,
a server that can be down, migrations several processes race to run, and a shared database
credentials must never reach. The store's semantics are tested on both backends by
tests/test_store.py; everything here runs against a real PostgreSQL (tests/postgres.py).
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg
import pytest

from spawnkit.config.credential_file import CredentialFile
from spawnkit.containment.credentials import CredentialStore
from spawnkit.errors import StoreError, StoreTooNew, StoreUnreachable
from spawnkit.result import SpawnerResult, ToolCall, Usage
from spawnkit.store import SessionStore
from spawnkit.store.backend import redact_url, statements
from spawnkit.store.postgres import _MIGRATIONS, SCHEMA_VERSION, PostgresBackend
from spawnkit.store.postgres import _Connection as PostgresConnection

from .conftest import REPO
from .postgres import PASSWORD, PostgresServer
from .test_cli import DEMO, assert_one_line_error, spawnkit

TIMEOUT_S = 120


def test_redact_url_drops_every_password() -> None:
    assert redact_url("postgresql://me:pw@db.example:5433/team?sslmode=require") == (
        "postgresql://me@db.example:5433/team?sslmode=require"
    )
    assert redact_url("postgresql://db/team?password=pw&user=me") == (
        "postgresql://db/team?user=me"
    )
    assert redact_url("postgres:///team") == "postgres:///team"


def test_a_wrong_password_is_one_line_without_the_password(
    postgres: PostgresServer, postgres_url: str
) -> None:
    wrong = postgres_url.replace(PASSWORD, "not-the-password")
    with pytest.raises(StoreUnreachable) as info:
        SessionStore(wrong)
    message = str(info.value)
    assert "password authentication failed" in message
    assert redact_url(wrong) in message and "not-the-password" not in message
    done = spawnkit("sessions", SPAWNKIT_STORE=wrong)  # a password never on a command line
    assert_one_line_error(done, redact_url(wrong), "cannot be reached")
    assert "not-the-password" not in done.stderr


def test_a_server_that_is_down_is_one_line_and_exit_2(postgres: PostgresServer) -> None:
    with psycopg.connect(postgres.url()) as conn:  # the server's own port, free again below
        port = conn.info.port
    down = postgres.url().replace(f":{port}/", ":1/")  # nothing listens on port 1
    done = spawnkit("sessions", SPAWNKIT_STORE=down)
    assert_one_line_error(done, "postgresql://postgres@127.0.0.1:1/postgres", "cannot be reached")
    assert PASSWORD not in done.stderr


def test_a_newer_schema_is_refused_with_both_versions(postgres_url: str) -> None:
    SessionStore(postgres_url).close()
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        conn.execute("INSERT INTO spawnkit.schema_version (version) VALUES (99)")
    with pytest.raises(StoreTooNew) as info:
        SessionStore(postgres_url)
    assert (info.value.found, info.value.supported) == (99, SCHEMA_VERSION)
    assert str(info.value) == (
        f"the session store {redact_url(postgres_url)} has schema 99, newer than the schema "
        f"{SCHEMA_VERSION} this spawnkit reads: upgrade spawnkit"
    )


def test_a_schema_3_database_gains_leases_and_keeps_its_records(postgres_url: str) -> None:
    with SessionStore(postgres_url) as store:
        store.create_session(
            "old", butler="b", runtime="codex", model=None, prompt="p", context=None,
            trigger_source="external",
        )  # fmt: skip
    with psycopg.connect(postgres_url, autocommit=True) as conn:  # as schema 3 left it
        for name in (
            "session_changed", "tool_call_written", "note_deleted_sessions", "bump_history_epoch",
        ):  # fmt: skip
            conn.execute(f"DROP FUNCTION spawnkit.{name}() CASCADE")  # 7's and 8's triggers too
        conn.execute("DROP TABLE spawnkit.history_epoch, spawnkit.deleted_sessions")
        conn.execute("ALTER TABLE spawnkit.sessions DROP COLUMN change_xid")
        conn.execute("DROP FUNCTION spawnkit.notify_change() CASCADE")  # 5's triggers go too
        conn.execute("DROP INDEX spawnkit.sessions_lease")
        conn.execute("ALTER TABLE spawnkit.sessions DROP COLUMN lease_until")
        conn.execute("ALTER TABLE spawnkit.sessions DROP COLUMN owner_seal")  # step 9's
        conn.execute("ALTER TABLE spawnkit.sessions DROP COLUMN network_denied")  # step 10's
        conn.execute("ALTER TABLE spawnkit.sessions DROP COLUMN permissions")  # step 11's
        for name in ("history_queue_session", "history_session_changed",  # step 12's
                     "history_call_changed", "history_sealed_truncated"):  # fmt: skip
            conn.execute(f"DROP FUNCTION spawnkit.{name}() CASCADE")
        conn.execute("DROP FUNCTION spawnkit.history_sealed_changed(TEXT)")
        conn.execute("DROP TABLE spawnkit.history_segments, spawnkit.history_unsealed")
        conn.execute("DELETE FROM spawnkit.schema_version WHERE version >= 4")
    with SessionStore(postgres_url, lease_s=20) as store:
        old = store.get_session("old")
        assert old is not None and (old.status, old.lease_until) == ("queued", None)
        assert store.renew_leases(["old"]) == 1
        renewed = store.get_session("old")
        assert renewed is not None and renewed.lease_until is not None
    with psycopg.connect(postgres_url) as conn:
        versions = conn.execute("SELECT version FROM spawnkit.schema_version ORDER BY 1")
        assert versions.fetchall() == [(v,) for v in range(1, SCHEMA_VERSION + 1)]
        assert _triggers(conn) == SCHEMA_12_TRIGGERS
    assert SCHEMA_VERSION == 13


# The row triggers of schema 8, by table: (name, function, timing and events).
SCHEMA_8_TRIGGERS = [
    ("sessions", "sessions_change", "session_changed", "BEFORE INSERT OR UPDATE"),
    ("sessions", "sessions_notify", "notify_change", "AFTER DELETE"),
    ("state", "state_notify", "notify_change", "AFTER INSERT OR DELETE OR UPDATE"),
    ("tool_calls", "tool_calls_notify", "tool_call_written", "AFTER INSERT OR UPDATE"),
    ("tool_calls", "tool_calls_notify_delete", "notify_change", "AFTER DELETE"),
]
# Step 12 adds those that keep the columnar copy of the history (spawnkit.store.server_segments).
SCHEMA_12_TRIGGERS = sorted(
    [
        *SCHEMA_8_TRIGGERS,
        ("sessions", "history_session_completed", "history_queue_session", "AFTER UPDATE"),
        ("sessions", "history_session_deleted", "history_session_changed", "AFTER DELETE"),
        ("sessions", "history_session_inserted", "history_queue_session", "AFTER INSERT"),
        ("sessions", "history_session_updated", "history_session_changed", "AFTER UPDATE"),
        ("tool_calls", "history_call_changed", "history_call_changed", "AFTER DELETE OR UPDATE"),
    ]
)


def _triggers(conn: psycopg.Connection[Any]) -> list[tuple[str, str, str, str]]:
    rows = conn.execute(
        "SELECT c.relname, t.tgname, p.proname, pg_get_triggerdef(t.oid) FROM pg_trigger t "
        "JOIN pg_class c ON c.oid = t.tgrelid JOIN pg_proc p ON p.oid = t.tgfoid "
        "JOIN pg_namespace n ON n.oid = c.relnamespace "
        "WHERE n.nspname = 'spawnkit' AND NOT t.tgisinternal AND (t.tgtype & 1) = 1 "
        "ORDER BY 1, 2"
    ).fetchall()
    found = []
    for table, name, function, definition in rows:
        when = definition.split(f"{name} ", 1)[1].split(" ON ", 1)[0]
        found.append((table, name, function, when))
    return found


def test_a_completion_notifies_its_record_and_calls_and_a_lease_renewal_alone_is_silent(
    postgres_url: str,
) -> None:
    at = datetime.now(UTC)
    calls = [
        ToolCall.start(f"c{i}", "Bash", {"i": i}, at).finish(f"out {i}", False, at)
        for i in range(3)
    ]
    result = SpawnerResult(
        output="done", tool_calls=calls, success=True, session_id="n1", duration_ms=5,
        usage=Usage(1, 1, 0, 0), status="success",
    )  # fmt: skip
    with (
        SessionStore(postgres_url, lease_s=20) as store,
        psycopg.connect(postgres_url, autocommit=True) as listener,
    ):
        store.create_session(
            "n1", butler="b", runtime="codex", model=None, prompt="p", context=None,
            trigger_source="external",
        )  # fmt: skip
        listener.execute("LISTEN spawnkit")
        assert store.renew_leases(["n1"]) == 1  # only the lease moves: no notification
        with psycopg.connect(postgres_url, autocommit=True) as conn:  # changes nothing
            conn.execute("UPDATE spawnkit.sessions SET status = status WHERE id = 'n1'")
        store.mark_started("n1", started_at=at, trace_id="t" * 32)
        store.complete_session("n1", result)
        got = [json.loads(n.payload) for n in listener.notifies(timeout=TIMEOUT_S, stop_after=5)]
    seen = [(g["table"], g["op"], g["status"], g.get("seq")) for g in got]
    assert seen[0] == ("sessions", "UPDATE", "running", None)  # not the renewal's 'queued'
    assert sorted(seen[1:], key=str) == sorted(
        [("sessions", "UPDATE", "success", None)]
        + [("tool_calls", "INSERT", "ok", i) for i in range(3)],
        key=str,
    )
    assert {g["butler"] for g in got} == {"b"}
    with SessionStore(postgres_url) as store:
        record = store.get_session("n1")
        assert record is not None and record.status == "success"
    with psycopg.connect(postgres_url) as conn:
        rows = conn.execute(
            "SELECT seq, call_id, output, server, input FROM spawnkit.tool_calls "
            "WHERE session_id = 'n1' ORDER BY seq"
        ).fetchall()
    assert rows == [(i, f"c{i}", f"out {i}", None, json.dumps({"i": i})) for i in range(3)]


OPENER = """
import sys
from spawnkit.store import SessionStore
print("ready", flush=True)
assert sys.stdin.readline() == "go\\n"
with SessionStore(sys.argv[1]) as store:
    store.state_set("b", sys.argv[2], 1)
print("done", flush=True)
"""


def test_processes_opening_a_new_database_at_once_migrate_it_once(postgres_url: str) -> None:
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", textwrap.dedent(OPENER), postgres_url, f"k{n}"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=REPO,
        )
        for n in range(4)
    ]
    try:
        for proc in procs:
            assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
        for proc in procs:
            assert proc.stdin is not None
            proc.stdin.write("go\n")
            proc.stdin.flush()
        outcomes = [proc.communicate(timeout=TIMEOUT_S) for proc in procs]
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=10)
    assert [(p.returncode, out, err) for p, (out, err) in zip(procs, outcomes, strict=True)] == [
        (0, "done\n", "")
    ] * 4
    with psycopg.connect(postgres_url) as conn:
        versions = conn.execute("SELECT version FROM spawnkit.schema_version").fetchall()
    assert versions == [(v,) for v in range(1, SCHEMA_VERSION + 1)]
    with SessionStore(postgres_url) as store:
        assert store.state_list("b") == {f"k{n}": 1 for n in range(4)}


def test_credentials_stay_in_the_local_file(isolated_home: Path, postgres_url: str) -> None:
    with SessionStore(postgres_url) as store:
        CredentialFile.beside_dir(store.local_dir).set("TEAM_TOKEN", "tok-123")
        assert CredentialStore(store).resolve("TEAM_TOKEN") == "tok-123"
    assert CredentialFile(isolated_home / "credentials.json").get("TEAM_TOKEN") == "tok-123"
    with psycopg.connect(postgres_url) as conn:
        tables = conn.execute(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = 'spawnkit'"
        ).fetchall()
        dump = conn.execute(
            "SELECT string_agg(t::text, ' ') FROM (SELECT * FROM spawnkit.state) t"
        ).fetchone()
    assert sorted(t for (t,) in tables) == [
        "cli_events", "cli_spans", "deleted_sessions", "episodes", "history_epoch",
        "history_segments", "history_unsealed", "mcp_calls", "schema_version", "sessions",
        "state", "tool_calls",
    ]  # fmt: skip
    assert dump == (None,)


@pytest.mark.e2e
def test_a_replay_run_is_recorded_in_postgresql_and_listed(
    isolated_home: Path, postgres_url: str
) -> None:
    """The real Claude Code CLI runs the demo offline; its record, tool calls and the
    butler's state (written by its MCP server) go to PostgreSQL, and nothing to SQLite."""
    done = spawnkit(
        "--store", postgres_url, "run", "--roster", str(REPO / "roster"), "--butler", "health",
        "--replay", str(DEMO), "--json", "I weighed 72.4 kg this morning", timeout=TIMEOUT_S,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["success"] is True

    listed = spawnkit("sessions", "--store", postgres_url, "--json")
    assert listed.returncode == 0, listed.stderr
    (session,) = json.loads(listed.stdout)
    assert (session["id"], session["status"], session["butler"]) == (
        result["session_id"], "success", "health",
    )  # fmt: skip
    assert [c["tool"] for c in session["tool_calls"]] == ["state_get", "Bash", "state_set", "Bash"]
    table = spawnkit("sessions", SPAWNKIT_STORE=postgres_url)
    assert result["session_id"][:8] in table.stdout

    with psycopg.connect(postgres_url) as conn:
        calls = conn.execute(
            "SELECT count(*) FROM spawnkit.tool_calls WHERE session_id = %s",
            (result["session_id"],),
        ).fetchone()
        state = conn.execute("SELECT count(*) FROM spawnkit.state WHERE butler = 'health'")
        state_rows = state.fetchone()
    assert calls == (4,)
    assert state_rows is not None and state_rows[0] >= 1, "the MCP server's state_set"
    assert not (isolated_home / "sessions.db").exists(), "nothing was written to SQLite"


def test_the_store_is_chosen_by_variable_then_config_file(
    isolated_home: Path, postgres_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    (isolated_home / "config.toml").write_text(f'[store]\nurl = "{postgres_url}"\n')
    with SessionStore() as store:
        assert (store.path, store.location) == (None, redact_url(postgres_url))
        store.state_set("b", "k", "from config")
    monkeypatch.setenv("SPAWNKIT_STORE", str(isolated_home / "local.db"))
    with SessionStore() as store:
        assert store.path == isolated_home / "local.db"
        assert store.state_get("b", "k") is None, "the variable wins over the file"
    monkeypatch.delenv("SPAWNKIT_STORE")
    with SessionStore() as store:
        assert store.state_get("b", "k") == "from config"


def test_a_schema_7_database_migrates_to_8_with_the_same_notifications_and_markers(
    postgres_url: str,
) -> None:
    """Step 8 folds a session's marker and NOTIFY into one trigger: a database made by
    steps 1-7 keeps its records, and every change is still told (and marked) as before,
    a lease renewal still is not."""
    with psycopg.connect(postgres_url, autocommit=True) as conn:  # as step 7 left it
        conn.execute("CREATE SCHEMA spawnkit")
        conn.execute("SET search_path = spawnkit")
        conn.execute(
            "CREATE TABLE schema_version (version INTEGER PRIMARY KEY, "
            "applied_at TIMESTAMPTZ NOT NULL DEFAULT now())"
        )
        for step in range(7):
            for statement in statements(_MIGRATIONS[step]):
                conn.execute(statement)
            conn.execute("INSERT INTO schema_version (version) VALUES (%s)", (step + 1,))
        conn.execute(
            "INSERT INTO sessions (id, butler, runtime, prompt, trigger_source, status, "
            "created_at, owner_host) VALUES ('old', 'b', 'codex', 'p', 'external', 'success', "
            "'2026-09-01T00:00:00+00:00', 'elsewhere')"
        )
        old_marker = conn.execute("SELECT change_xid FROM sessions").fetchone()
    at = datetime.now(UTC)
    call = ToolCall.start("c0", "Bash", {"i": 0}, at)
    with (
        SessionStore(postgres_url, lease_s=20) as store,
        psycopg.connect(postgres_url, autocommit=True) as listener,
    ):
        old = store.get_session("old")
        assert old is not None and (old.status, old.butler) == ("success", "b")
        store.create_session(
            "n1", butler="b", runtime="codex", model=None, prompt="p", context=None,
            trigger_source="external",
        )  # fmt: skip

        def marker(session: str) -> int:
            row = listener.execute(
                "SELECT change_xid FROM spawnkit.sessions WHERE id = %s", (session,)
            ).fetchone()
            assert row is not None
            return int(row[0])

        created = marker("n1")
        listener.execute("LISTEN spawnkit")
        assert store.renew_leases(["n1"]) == 1  # silent, marker kept
        assert marker("n1") == created
        store.mark_started("n1", started_at=at, trace_id="t" * 32)
        started = marker("n1")
        assert started > created
        assert store.record_tool_call("n1", 0, call)  # live: an INSERT
        assert store.record_tool_call("n1", 1, ToolCall.start("c1", "Bash", {"i": 1}, at))
        done = call.finish("out", False, at)
        store.complete_session(
            "n1", SpawnerResult(output="ok", tool_calls=[done], success=True, session_id="n1",
                                duration_ms=5, usage=Usage(1, 1, 0, 0), status="success"),
        )  # fmt: skip  # replaces the live calls: seq 0 updated, seq 1 deleted
        assert marker("n1") > started
        listener.execute("DELETE FROM spawnkit.sessions WHERE id = 'old'")
        got = [json.loads(n.payload) for n in listener.notifies(timeout=TIMEOUT_S, stop_after=7)]
        tombstones = listener.execute("SELECT id FROM spawnkit.deleted_sessions").fetchall()
        assert _triggers(listener) == SCHEMA_12_TRIGGERS
        functions = listener.execute(
            "SELECT proname FROM pg_proc WHERE proname = 'mark_session_change'"
        ).fetchall()
    seen = [(g["table"], g["op"], g["status"], g.get("seq"), g["butler"], g["host"]) for g in got]
    host = store.host
    assert seen[:3] == [
        ("sessions", "UPDATE", "running", None, "b", host),
        ("tool_calls", "INSERT", "running", 0, "b", host),
        ("tool_calls", "INSERT", "running", 1, "b", host),
    ]
    assert sorted(seen[3:6], key=str) == sorted(  # one statement: in no set order
        [
            ("sessions", "UPDATE", "success", None, "b", host),
            ("tool_calls", "DELETE", "running", 1, "b", host),
            ("tool_calls", "UPDATE", "ok", 0, "b", host),
        ],
        key=str,
    )
    assert seen[6] == ("sessions", "DELETE", "success", None, "b", "elsewhere")
    assert old_marker is not None and old_marker[0] is not None
    assert tombstones == [("old",)] and functions == []


def test_writes_through_libpq_keep_what_psycopg_did(postgres_url: str) -> None:
    """The store's writes go through libpq as statements each connection prepared once
    (store.postgres._Connection.run_prepared): values round trip exactly, a refused write
    is psycopg's own error, and what that path does not take goes through psycopg."""
    at = datetime.now(UTC)
    big = "72.4 kg ✓ " * 300_000  # 3.3 MB: more than one socket buffer
    result = SpawnerResult(
        output=big, tool_calls=[ToolCall.start("c0", "Bash", {"é": 1}, at).finish("o", False, at)],
        success=True, session_id="w1", duration_ms=2**40, usage=Usage(1, 2, 3, 4),
        cost_usd=0.1 + 0.2, status="success",
    )  # fmt: skip
    with SessionStore(postgres_url) as store:
        store.create_session(
            "w1", butler="b", runtime="codex", model=None, prompt="naïve 🙂 'quoted' ?",
            context=None, trigger_source="external",
        )  # fmt: skip
        store.mark_started("w1", started_at=at, trace_id="t" * 32)
        store.complete_session("w1", result)
        record = store.get_session("w1")
        assert record is not None
        assert (record.prompt, record.output, record.cost_usd, record.duration_ms) == (
            "naïve 🙂 'quoted' ?", big, 0.1 + 0.2, 2**40,
        )  # fmt: skip
        assert [c.input for c in record.tool_calls] == [{"é": 1}]
        with pytest.raises(StoreError, match="duplicate key value"):  # psycopg's message
            store.create_session(
                "w1", butler="b", runtime="codex", model=None, prompt="p", context=None,
                trigger_source="external",
            )  # fmt: skip
        backend = store._db
        assert isinstance(backend, PostgresBackend)
        with backend.transaction(single=True) as tx:
            # A NUL, a bool, an int past 64 bits: psycopg's path, which refuses or adapts.
            with pytest.raises(psycopg.DataError, match="NUL"):
                tx.execute("UPDATE sessions SET error = ? WHERE id = ?", ("a\x00b", "w1"))
            assert tx.execute("UPDATE sessions SET success = ?::int WHERE id = ?", (True, "w1"))
            with pytest.raises(psycopg.errors.NumericValueOutOfRange):
                tx.execute("UPDATE sessions SET duration_ms = ? WHERE id = ?", (2**70, "w1"))
            # One the server will not prepare untyped: refused once, then psycopg's.
            with pytest.raises(psycopg.errors.IndeterminateDatatype):
                tx.execute("SELECT ? IS NULL", (None,))
            with pytest.raises(psycopg.errors.IndeterminateDatatype):
                tx.execute("SELECT ? IS NULL", (None,))
            assert tx.execute("UPDATE sessions SET error = ? WHERE id = ?", ("still fine", "w1"))
            prepared = tx._conn._statements  # the fast path took this one
            key = ("UPDATE sessions SET error = ? WHERE id = ?", (0, 0))
            assert key in prepared
            # Deallocated behind the store's back (DISCARD ALL, a pooler): the write is
            # made again under a statement prepared again (it cannot have been made).
            name = prepared[key]
            tx._conn.execute("DEALLOCATE ALL")
            assert tx.execute("UPDATE sessions SET error = ? WHERE id = ?", ("again", "w1"))
            assert key in prepared and prepared[key] != name
            assert tx.execute("UPDATE sessions SET error = ? WHERE id = ?", ("still fine", "w1"))

        # Inside a transaction a failing write rolls the whole transaction back.
        def fails_halfway() -> None:
            with backend.transaction() as tx:
                tx.execute("UPDATE sessions SET error = ? WHERE id = ?", ("rolled back", "w1"))
                tx.execute(
                    "INSERT INTO tool_calls (session_id, seq, call_id, name, tool, status, "
                    "started_at) VALUES (?, ?, ?, ?, ?, ?, ?)",
                    ("w1", 0, "dup", "Bash", "Bash", "ok", "t"),
                )

        with pytest.raises(psycopg.errors.UniqueViolation):
            fails_halfway()
        record = store.get_session("w1")
        assert record is not None and record.error == "still fine"
        # Connections the server dropped are an OperationalError, as psycopg's: the store
        # makes the write again on a fresh connection (or keeps it in its journal a moment).
        store.create_session(
            "w2", butler="b", runtime="codex", model=None, prompt="p", context=None,
            trigger_source="external",
        )  # fmt: skip
        with psycopg.connect(postgres_url, autocommit=True) as admin:
            admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE application_name = 'spawnkit' AND pid <> pg_backend_pid()"
            )
        store.mark_started("w2", started_at=at, trace_id="t" * 32)
        deadline = time.monotonic() + TIMEOUT_S
        while store.pending_writes() and time.monotonic() < deadline:
            time.sleep(0.05)
        second = store.get_session("w2")
        assert second is not None and second.status == "running"


def test_a_connection_in_another_client_encoding_writes_through_psycopg(
    postgres_url: str,
) -> None:
    """The libpq path encodes text as UTF-8 only: a connection set to another encoding
    (a server's default can be one) is left to psycopg, which encodes for it."""
    with SessionStore(f"{postgres_url}?client_encoding=LATIN1") as store:
        store.create_session(
            "e1", butler="b", runtime="codex", model=None, prompt="café", context=None,
            trigger_source="external",
        )  # fmt: skip
        store.mark_started("e1", started_at=datetime.now(UTC), trace_id="t" * 32)
        record = store.get_session("e1")
        assert record is not None and (record.prompt, record.status) == ("café", "running")
        backend = store._db
        assert isinstance(backend, PostgresBackend)
        with backend.transaction(single=True) as tx:
            assert tx.execute("UPDATE sessions SET error = ? WHERE id = ?", ("né", "e1")) == 1
            assert tx._conn._statements == {}


INTERRUPTED_WITHIN_S = 30
# How long the store's thread takes, in the variant below, to start waiting for a write's
# result: a loaded machine's scheduler can leave it that long between two of its lines.
SLOW_TO_WAIT_S = 0.5


@pytest.mark.parametrize("slow_to_wait", [False, True], ids=["waiting", "slow-to-wait"])
def test_ctrl_c_interrupts_a_write_whose_server_stopped_answering(
    postgres_url: str, slow_to_wait: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A write waits for its server as psycopg's cursor does, so Ctrl-C stops it: the query
    is cancelled on the server, KeyboardInterrupt reaches the caller, and the store goes on.
    Here the server stops answering because another connection holds the write's row; a
    write blocked inside libpq's synchronous call would wait for the lock to go (the holder
    lets go after INTERRUPTED_WITHIN_S), and only then see the interrupt.

    ``slow-to-wait``: the store's thread is slow to start each wait. A write sent before its
    wait began was on the server, blocked on the row, when that Ctrl-C came: nothing
    cancelled it, the pool closed its connection, and the server made the write once the
    row was free (the record read ``running``; seen 2 times in 200 runs of ``waiting`` on a
    loaded machine). The store sends each write inside the wait, as psycopg's cursor does."""
    if slow_to_wait:
        wait = PostgresConnection.wait

        def slow_wait(self: PostgresConnection, *args: Any, **kwargs: Any) -> Any:
            time.sleep(SLOW_TO_WAIT_S)
            return wait(self, *args, **kwargs)

        monkeypatch.setattr(PostgresConnection, "wait", slow_wait)
    at = datetime.now(UTC)
    main = threading.get_ident()
    assert threading.current_thread() is threading.main_thread(), "signals reach main only"
    locked, done = threading.Event(), threading.Event()
    interrupted_at: list[float] = []

    def hold_the_row_then_interrupt() -> None:
        with (
            psycopg.connect(postgres_url, autocommit=False) as holder,
            psycopg.connect(postgres_url, autocommit=True) as watcher,
        ):
            holder.execute("SELECT 1 FROM spawnkit.sessions WHERE id = 'i1' FOR UPDATE")
            locked.set()
            deadline = time.monotonic() + TIMEOUT_S
            while time.monotonic() < deadline and not done.is_set():
                row = watcher.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                    "AND application_name = 'spawnkit' AND wait_event_type = 'Lock'"
                ).fetchone()
                if row and row[0]:  # the store's write waits on the row: Ctrl-C
                    interrupted_at.append(time.monotonic())
                    signal.pthread_kill(main, signal.SIGINT)
                    break
                time.sleep(0.05)
            done.wait(INTERRUPTED_WITHIN_S)
            holder.rollback()

    with SessionStore(postgres_url) as store:
        for session_id in ("i0", "i1"):
            store.create_session(
                session_id, butler="b", runtime="codex", model=None, prompt="p",
                context=None, trigger_source="external",
            )  # fmt: skip
        store.mark_started("i0", started_at=at, trace_id="t" * 32)
        backend = store._db
        assert isinstance(backend, PostgresBackend)
        with backend._connection() as conn:  # the write below goes through libpq
            written = [sql for sql, _ in conn._statements]
        assert any(sql.startswith("UPDATE sessions SET status = 'running'") for sql in written)
        holder = threading.Thread(target=hold_the_row_then_interrupt, daemon=True)
        holder.start()
        try:
            assert locked.wait(TIMEOUT_S)
            with pytest.raises(KeyboardInterrupt):
                store.mark_started("i1", started_at=at, trace_id="u" * 32)
            stopped_at = time.monotonic()
        finally:
            done.set()
            holder.join(TIMEOUT_S)
        assert len(interrupted_at) == 1, "the write waited on the row before Ctrl-C"
        assert stopped_at - interrupted_at[0] < INTERRUPTED_WITHIN_S
        # The lock is gone: the interrupted write was cancelled, not made late.
        blocked = store.get_session("i1")
        assert blocked is not None and (blocked.status, blocked.trace_id) == ("queued", None)
        assert store.pending_writes() == 0
        store.mark_started("i1", started_at=at, trace_id="v" * 32)
        record = store.get_session("i1")
        assert record is not None and (record.status, record.trace_id) == ("running", "v" * 32)


def slot_backends(url: str) -> set[int]:
    """The server processes of slot holders' connections (idle or holding) on ``url``."""
    with psycopg.connect(url, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE application_name = 'spawnkit-slot' "
            "AND datname = current_database()"
        ).fetchall()
    return {int(row[0]) for row in rows}


def take_all(store: SessionStore, capacity: int) -> list[Any]:
    """Every slot of ``capacity``, waiting (bounded) for ones another claim just released."""
    claims, deadline = [], time.monotonic() + 10
    while len(claims) < capacity:
        claim = store.slot_claim("health", capacity)
        assert claim is not None
        while claim.try_acquire() is None:
            assert time.monotonic() < deadline, f"only {len(claims)} of {capacity} slots free"
            time.sleep(0.02)
        claims.append(claim)
    return claims


def test_a_slots_connection_is_kept_for_the_next_run_and_its_slot_freed(
    postgres_url: str,
) -> None:
    """A released slot is free for any host at once, while its connection is kept (a new
    one costs a start-up and a password exchange); one the server dropped is replaced."""
    with SessionStore(postgres_url) as here, SessionStore(postgres_url) as there:
        mine = take_all(here, 2)
        extra = here.slot_claim("health", 2)
        assert extra is not None and extra.try_acquire() is None, "both held"
        assert sorted(c.slot for c in mine) == [0, 1]
        for claim in [*mine, extra]:
            claim.release()
        for claim in take_all(there, 2):  # the other host gets both
            claim.release()
        kept = slot_backends(postgres_url)
        assert len(kept) == 4, "two idle connections kept by each store"
        for _ in range(10):
            for store in (here, there):
                for claim in take_all(store, 2):
                    claim.release()
        assert slot_backends(postgres_url) == kept, "no connection made or lost since"
        with psycopg.connect(postgres_url, autocommit=True) as admin:
            for pid in kept:
                admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
        claims = take_all(here, 2)  # on new connections
        assert sorted(c.slot for c in claims) == [0, 1]
        fresh = slot_backends(postgres_url)
        assert fresh and not fresh & kept
        for claim in claims:
            claim.release()
        late = here.slot_claim("health", 2)  # a kept connection, ended after it was taken
        assert late is not None
        with psycopg.connect(postgres_url, autocommit=True) as admin:
            for pid in slot_backends(postgres_url):
                admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
        assert late.try_acquire() == 0
        late.release()
    deadline = time.monotonic() + 10
    while slot_backends(postgres_url):  # closing the stores closed their idle connections
        assert time.monotonic() < deadline, slot_backends(postgres_url)
        time.sleep(0.05)


def test_idle_slot_connections_close_in_a_quiet_process(
    postgres_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A kept connection is a server process: one not used again soon is closed, with the
    store still open and no run coming."""
    monkeypatch.setattr("spawnkit.store.advisory.SLOT_IDLE_S", 0.5)
    with SessionStore(postgres_url) as store:
        for claim in take_all(store, 2):
            claim.release()
        assert len(slot_backends(postgres_url)) == 2
        deadline = time.monotonic() + 10
        while slot_backends(postgres_url):
            assert time.monotonic() < deadline, slot_backends(postgres_url)
            time.sleep(0.05)
        for claim in take_all(store, 2):  # new ones, as needed
            claim.release()
