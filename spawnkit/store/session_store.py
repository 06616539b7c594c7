"""The session store: every accepted run, its tool calls, and butler state.

:class:`SessionStore` writes each query once against a small
:class:`~spawnkit.store.backend.Backend`: SQLite here (the default, :class:`SqliteBackend`)
or PostgreSQL, a store a team shares (:mod:`spawnkit.store.postgres`, chosen by URL).
What follows describes the SQLite file; the server keeps the same tables and semantics.

One database file (``$SPAWNKIT_HOME/sessions.db`` by default) in WAL mode with a
busy timeout, so several processes (a notebook, ``spawnkit serve``, a CLI run)
can write at once. A session row is created when a trigger is accepted and
completed when the run ends, whatever happens; each row also records which
process owns it (and, once it runs, its workspace), so what a process that died
left behind is swept up the next time any process opens the store: its processes
killed, its workspace removed, its record marked ``crashed`` (see
:mod:`spawnkit.sweep`).

The same file holds the tables the butler's MCP server and the core need:
``state`` (the ``state_*`` tools), ``mcp_calls`` (tool calls as the server saw
them) and ``episodes`` (see :mod:`spawnkit.memory`). It holds no credentials:
those live in their own file (:mod:`spawnkit.credential_file`), and the
``credentials`` table older versions kept is moved there when the store opens.
Connections are per thread; methods are synchronous and short, and async
callers run them with ``asyncio.to_thread``.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Concatenate, Literal, ParamSpec, TypeVar
from urllib.parse import quote

from ..credential_file import CredentialError, CredentialFile, StoredCredential
from ..errors import HomeNotWritable, StoreDamaged, StoreError, StoreTooNew, StoreUnreachable
from ..home import default_store_path, host_name, is_writable, lease_seconds, store_setting
from ..result import Attempt, BudgetReport, SpawnerResult, ToolCall, Usage
from ..sweep import HomeSeal, OpenRun, process_start, sweep
from .backend import (
    Admission,
    Backend,
    Params,
    Row,
    SlotClaim,
    Transaction,
    is_postgres_url,
    statements,
)
from .journal import StoreJournal

logger = logging.getLogger(__name__)

SCHEMA_VERSION = 14
BUSY_TIMEOUT_MS = 15_000

_SCHEMA = """
CREATE TABLE IF NOT EXISTS sessions (
    id TEXT PRIMARY KEY,
    butler TEXT NOT NULL,
    runtime TEXT NOT NULL,
    model TEXT,
    prompt TEXT NOT NULL,
    context TEXT,
    trigger_source TEXT NOT NULL,
    status TEXT NOT NULL,
    success INTEGER,
    error TEXT,
    error_kind TEXT,
    output TEXT,
    tool_calls TEXT,
    num_tool_calls INTEGER,
    duration_ms INTEGER,
    input_tokens INTEGER,
    output_tokens INTEGER,
    cache_read_tokens INTEGER,
    cache_write_tokens INTEGER,
    cost_usd REAL,
    num_turns INTEGER,
    trace_id TEXT,
    runtime_session_id TEXT,
    parent_session_id TEXT,
    created_at TEXT NOT NULL,
    started_at TEXT,
    completed_at TEXT,
    owner_host TEXT,
    owner_pid INTEGER,
    owner_start TEXT,
    log_dir TEXT,
    role TEXT,
    sandbox TEXT,
    given TEXT,
    workspace TEXT,
    kind TEXT NOT NULL DEFAULT 'run',
    sources TEXT,
    budget TEXT,
    attempts TEXT,
    lease_until TEXT,
    owner_seal TEXT,
    network_denied INTEGER
);
CREATE INDEX IF NOT EXISTS sessions_by_created ON sessions (created_at);
CREATE INDEX IF NOT EXISTS sessions_by_butler ON sessions (butler, created_at);
CREATE INDEX IF NOT EXISTS sessions_by_runtime_id ON sessions (runtime_session_id);
CREATE INDEX IF NOT EXISTS sessions_open ON sessions (owner_host) WHERE completed_at IS NULL;
CREATE INDEX IF NOT EXISTS sessions_lease ON sessions (lease_until) WHERE completed_at IS NULL;

CREATE TABLE IF NOT EXISTS tool_calls (
    session_id TEXT NOT NULL,
    seq INTEGER NOT NULL,
    call_id TEXT NOT NULL,
    name TEXT NOT NULL,
    server TEXT,
    tool TEXT NOT NULL,
    input TEXT,
    output TEXT,
    status TEXT NOT NULL,
    started_at TEXT NOT NULL,
    finished_at TEXT,
    duration_ms INTEGER,
    PRIMARY KEY (session_id, seq)
);

CREATE TABLE IF NOT EXISTS mcp_calls (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    butler TEXT NOT NULL,
    session_key TEXT,
    session_id TEXT,
    tool TEXT NOT NULL,
    arguments TEXT,
    result TEXT,
    is_error INTEGER NOT NULL DEFAULT 0,
    called_at TEXT NOT NULL,
    duration_ms INTEGER
);
CREATE INDEX IF NOT EXISTS mcp_calls_by_session ON mcp_calls (session_id);

CREATE TABLE IF NOT EXISTS state (
    butler TEXT NOT NULL,
    key TEXT NOT NULL,
    value TEXT NOT NULL,
    updated_at TEXT NOT NULL,
    PRIMARY KEY (butler, key)
);

CREATE TABLE IF NOT EXISTS episodes (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    butler TEXT NOT NULL,
    session_id TEXT,
    prompt TEXT NOT NULL,
    output TEXT NOT NULL,
    created_at TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS episodes_by_butler ON episodes (butler, id);
"""


# Schema 5, for spawnkit.history: the CLIs' transcripts copied in by `spawnkit history
# import` (files, their raw lines zlib-compressed, and the deduplicated usage rows, per
# machine), and a change counter that keys the columnar cache of sessions and tool calls
# (spawnkit/history/store_cache.py). That cache holds completed sessions and their tool
# calls, which the store only ever appends; the triggers count anything that changes or
# removes them, which makes the cache stale. One statement per string (trigger bodies hold
# semicolons); every one is idempotent, so a new store runs them after _SCHEMA.
_HISTORY_SCHEMA = (
    """CREATE TABLE IF NOT EXISTS history_epoch (
        id INTEGER PRIMARY KEY CHECK (id = 1), token TEXT NOT NULL, epoch INTEGER NOT NULL)""",
    "INSERT OR IGNORE INTO history_epoch VALUES (1, lower(hex(randomblob(16))), 0)",
    """CREATE TRIGGER IF NOT EXISTS history_epoch_session_update AFTER UPDATE ON sessions
        WHEN OLD.completed_at IS NOT NULL
        BEGIN UPDATE history_epoch SET epoch = epoch + 1; END""",
    """CREATE TRIGGER IF NOT EXISTS history_epoch_session_delete AFTER DELETE ON sessions
        BEGIN UPDATE history_epoch SET epoch = epoch + 1; END""",
    """CREATE TRIGGER IF NOT EXISTS history_epoch_call_update AFTER UPDATE ON tool_calls
        BEGIN UPDATE history_epoch SET epoch = epoch + 1; END""",
    """CREATE TRIGGER IF NOT EXISTS history_epoch_call_delete AFTER DELETE ON tool_calls
        BEGIN UPDATE history_epoch SET epoch = epoch + 1; END""",
    """CREATE TABLE IF NOT EXISTS history_files (
        id INTEGER PRIMARY KEY, source TEXT NOT NULL, machine TEXT NOT NULL, path TEXT NOT NULL,
        lines INTEGER NOT NULL, bytes INTEGER NOT NULL, version INTEGER NOT NULL,
        imported_at TEXT NOT NULL, UNIQUE (source, machine, path))""",
    """CREATE TABLE IF NOT EXISTS history_lines (
        file_id INTEGER NOT NULL, line INTEGER NOT NULL, hash BLOB NOT NULL, raw BLOB NOT NULL,
        PRIMARY KEY (file_id, line)) WITHOUT ROWID""",
    """CREATE TABLE IF NOT EXISTS history_usage (
        source TEXT NOT NULL, machine TEXT NOT NULL, row_key TEXT NOT NULL, session_id TEXT,
        timestamp TEXT, model TEXT, input_tokens INTEGER, output_tokens INTEGER,
        thinking_tokens INTEGER, cache_write_tokens INTEGER, cache_read_tokens INTEGER,
        cost_usd REAL, cost_source TEXT, cost_estimated INTEGER, is_sidechain INTEGER,
        PRIMARY KEY (source, machine, row_key)) WITHOUT ROWID""",
)

# The spans a run's CLI exported (spawnkit.otlp), attributes redacted, as JSON.
_CLI_SPANS_SCHEMA = (
    """CREATE TABLE IF NOT EXISTS cli_spans (
        session_id TEXT NOT NULL, trace_id TEXT NOT NULL, span_id TEXT NOT NULL,
        parent_span_id TEXT, name TEXT NOT NULL, service TEXT, start_ns BIGINT NOT NULL,
        end_ns BIGINT NOT NULL, status TEXT NOT NULL, attributes TEXT NOT NULL,
        reparented INTEGER NOT NULL DEFAULT 0)""",
    "CREATE INDEX IF NOT EXISTS cli_spans_by_session ON cli_spans (session_id, start_ns)",
)

# The log events and metric points a run's CLI exported (spawnkit.otlp), attributes
# redacted, as JSON; ``kind`` is "log" or "metric", ``value`` a metric point's value.
_CLI_EVENTS_SCHEMA = (
    """CREATE TABLE IF NOT EXISTS cli_events (
        session_id TEXT NOT NULL, kind TEXT NOT NULL, name TEXT NOT NULL, service TEXT,
        time_ns BIGINT NOT NULL, trace_id TEXT, span_id TEXT, value DOUBLE PRECISION,
        attributes TEXT NOT NULL)""",
    "CREATE INDEX IF NOT EXISTS cli_events_by_session ON cli_events (session_id, time_ns)",
)

# _MIGRATIONS[v - 1] takes a store from schema v to v + 1.
_MIGRATIONS: tuple[tuple[str, ...], ...] = (
    ("ALTER TABLE sessions ADD COLUMN log_dir TEXT",),
    ("ALTER TABLE sessions ADD COLUMN role TEXT",),
    ("ALTER TABLE sessions ADD COLUMN sandbox TEXT", "ALTER TABLE sessions ADD COLUMN given TEXT"),
    _HISTORY_SCHEMA,
    ("ALTER TABLE sessions ADD COLUMN workspace TEXT",),
    # What the run was (a butler's "run", or an "ask" about sources) and which sources.
    (
        "ALTER TABLE sessions ADD COLUMN kind TEXT NOT NULL DEFAULT 'run'",
        "ALTER TABLE sessions ADD COLUMN sources TEXT",
    ),
    # How a run stood against its limits (spawnkit.budget), as JSON.
    ("ALTER TABLE sessions ADD COLUMN budget TEXT",),
    # Each start of the run's CLI (spawnkit.retry), as JSON.
    ("ALTER TABLE sessions ADD COLUMN attempts TEXT",),
    _CLI_SPANS_SCHEMA,
    _CLI_EVENTS_SCHEMA,
    # Runs that belong to a host: the lease its host renews while the run lives.
    (
        "ALTER TABLE sessions ADD COLUMN lease_until TEXT",
        "CREATE INDEX IF NOT EXISTS sessions_lease ON sessions (lease_until) "
        "WHERE completed_at IS NULL",
    ),
    # Which home wrote a record, sealed with that home's key (spawnkit.sweep.HomeSeal).
    ("ALTER TABLE sessions ADD COLUMN owner_seal TEXT",),
    # Connections the run's network sandbox refused (spawnkit.egress).
    ("ALTER TABLE sessions ADD COLUMN network_denied INTEGER",),
)
assert len(_MIGRATIONS) == SCHEMA_VERSION - 1


def utcnow() -> datetime:
    return datetime.now(UTC)


def _iso(value: datetime | None) -> str | None:
    return value.isoformat() if value else None


def _dt(value: str | None) -> datetime | None:
    return datetime.fromisoformat(value) if value else None


def _stamp(value: datetime) -> str:
    """A UTC time as ISO text of fixed width, so leases compare as text on both engines."""
    return value.astimezone(UTC).isoformat(timespec="microseconds")


# What SQLite says when the file itself is damaged (not merely busy or unwritable).
_DAMAGE_WORDS = ("malformed", "not a database", "file is encrypted", "corrupt")
# What it says when it cannot create or write the file (or its -wal and -shm companions).
_READ_ONLY_WORDS = ("unable to open database file", "readonly database", "read-only")


def store_error(path: Path, exc: sqlite3.Error) -> StoreError:
    """The typed error for a SQLite failure on the store at ``path``: damaged, read-only, other.

    Every command and every caller sees the same one line: which file, what is wrong with
    it, and what to do, never a bare ``sqlite3.DatabaseError``.
    """
    text = str(exc)
    lowered = text.lower()
    if any(word in lowered for word in _DAMAGE_WORDS):
        return StoreDamaged(path, text)
    if any(word in lowered for word in _READ_ONLY_WORDS) and not is_writable(path.parent):
        return HomeNotWritable(path.parent, text)
    return StoreError(f"the session store {path}: {text}")


_P = ParamSpec("_P")
_T = TypeVar("_T")


def _translated(
    method: Callable[Concatenate[SessionStore, _P], _T],
) -> Callable[Concatenate[SessionStore, _P], _T]:
    """Turn a database failure inside a store method into its backend's typed error."""

    @functools.wraps(method)
    def wrapper(self: SessionStore, /, *args: _P.args, **kwargs: _P.kwargs) -> _T:
        try:
            return method(self, *args, **kwargs)
        except self._db.errors as exc:
            raise self._db.error(exc) from exc

    return wrapper


def _dispatched_worker(given: str | None) -> str | None:
    """The Dask worker a record's setup names (a run dispatched to a cluster), if any."""
    try:
        dispatch = json.loads(given).get("dispatch") if given else None
    except (ValueError, AttributeError):
        return None
    worker = dispatch.get("worker") if isinstance(dispatch, dict) else None
    return worker if isinstance(worker, str) else None


def _has_table(conn: sqlite3.Connection, name: str) -> bool:
    query = "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?"
    return conn.execute(query, (name,)).fetchone() is not None


def _credential_time(row: sqlite3.Row) -> datetime:
    try:
        stamp = datetime.fromisoformat(row["updated_at"])
    except (TypeError, ValueError):
        return datetime.min.replace(tzinfo=UTC)
    return stamp if stamp.tzinfo else stamp.replace(tzinfo=UTC)


def _enable_wal(conn: sqlite3.Connection) -> None:
    """Switch to WAL, waiting for other openers: this PRAGMA ignores the busy timeout."""
    deadline = time.monotonic() + BUSY_TIMEOUT_MS / 1000
    while True:
        try:
            conn.execute("PRAGMA journal_mode = WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() > deadline:
                raise
            time.sleep(0.02)


@dataclass(frozen=True)
class SessionRecord:
    """One row of the ``sessions`` table."""

    id: str
    butler: str
    runtime: str
    model: str | None
    prompt: str
    context: str | None
    trigger_source: str
    status: str
    success: bool | None
    error: str | None
    error_kind: str | None
    output: str | None
    tool_calls: list[ToolCall]
    duration_ms: int | None
    usage: Usage
    cost_usd: float | None
    num_turns: int | None
    trace_id: str | None
    runtime_session_id: str | None
    parent_session_id: str | None
    created_at: datetime
    started_at: datetime | None
    completed_at: datetime | None
    log_dir: Path | None = None
    role: str | None = None
    # Which sandbox the run had ("bwrap" or "none") and what its CLI was given.
    sandbox: str | None = None
    given: dict[str, Any] | None = None
    # The run's workspace while it ran (removed when it ended, or by the sweep).
    workspace: Path | None = None
    # "run" (a butler's trigger) or "ask" (a question about sources), and those sources.
    kind: str = "run"
    sources: tuple[str, ...] = ()
    # How the run stood against its limits, when it had any that needed its usage.
    budget: BudgetReport | None = None
    # Each start of the run's CLI; several when a rate-limited run was started again.
    attempts: tuple[Attempt, ...] = ()
    # The host the run belongs to, and until when it holds the record unless it renews it.
    owner_host: str | None = None
    lease_until: datetime | None = None
    # The process that owns it on that host (a dispatching client's, until a worker adopts it).
    owner_pid: int | None = None
    # Connections its network sandbox refused (spawnkit.egress); 0 in records from before.
    network_denied: int = 0

    @classmethod
    def from_row(cls, row: Row) -> SessionRecord:
        calls = [ToolCall.from_dict(c) for c in json.loads(row["tool_calls"] or "[]")]
        return cls(
            id=row["id"],
            butler=row["butler"],
            runtime=row["runtime"],
            model=row["model"],
            prompt=row["prompt"],
            context=row["context"],
            trigger_source=row["trigger_source"],
            status=row["status"],
            success=None if row["success"] is None else bool(row["success"]),
            error=row["error"],
            error_kind=row["error_kind"],
            output=row["output"],
            tool_calls=calls,
            duration_ms=row["duration_ms"],
            usage=Usage(
                row["input_tokens"] or 0,
                row["output_tokens"] or 0,
                row["cache_read_tokens"] or 0,
                row["cache_write_tokens"] or 0,
            ),
            cost_usd=row["cost_usd"],
            num_turns=row["num_turns"],
            trace_id=row["trace_id"],
            runtime_session_id=row["runtime_session_id"],
            parent_session_id=row["parent_session_id"],
            created_at=datetime.fromisoformat(row["created_at"]),
            started_at=_dt(row["started_at"]),
            completed_at=_dt(row["completed_at"]),
            log_dir=Path(row["log_dir"]) if row["log_dir"] else None,
            role=row["role"],
            sandbox=row["sandbox"],
            given=json.loads(row["given"]) if row["given"] else None,
            workspace=Path(row["workspace"]) if row["workspace"] else None,
            kind=row["kind"] or "run",
            sources=tuple(json.loads(row["sources"])) if row["sources"] else (),
            budget=BudgetReport.from_dict(json.loads(row["budget"])) if row["budget"] else None,
            attempts=tuple(Attempt.from_dict(a) for a in json.loads(row["attempts"] or "[]")),
            owner_host=row["owner_host"],
            lease_until=_dt(row["lease_until"]),
            owner_pid=row["owner_pid"],
            network_denied=row["network_denied"] or 0,
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "butler": self.butler,
            "runtime": self.runtime,
            "model": self.model,
            "prompt": self.prompt,
            "context": self.context,
            "trigger_source": self.trigger_source,
            "status": self.status,
            "success": self.success,
            "error": self.error,
            "error_kind": self.error_kind,
            "output": self.output,
            "tool_calls": [c.to_dict() for c in self.tool_calls],
            "duration_ms": self.duration_ms,
            "input_tokens": self.usage.input_tokens,
            "output_tokens": self.usage.output_tokens,
            "cache_read_tokens": self.usage.cache_read_tokens,
            "cache_write_tokens": self.usage.cache_write_tokens,
            "cost_usd": self.cost_usd,
            "num_turns": self.num_turns,
            "trace_id": self.trace_id,
            "runtime_session_id": self.runtime_session_id,
            "parent_session_id": self.parent_session_id,
            "created_at": _iso(self.created_at),
            "started_at": _iso(self.started_at),
            "completed_at": _iso(self.completed_at),
            "log_dir": str(self.log_dir) if self.log_dir else None,
            "role": self.role,
            "sandbox": self.sandbox,
            "given": self.given,
            "workspace": str(self.workspace) if self.workspace else None,
            "kind": self.kind,
            "sources": list(self.sources),
            "budget": asdict(self.budget) if self.budget else None,
            "attempts": [attempt.to_dict() for attempt in self.attempts],
            "owner_host": self.owner_host,
            "lease_until": _iso(self.lease_until),
            "network_denied": self.network_denied,
        }


@dataclass(frozen=True)
class StoreHealth:
    """What :func:`check_store` found."""

    path: Path
    problems: tuple[str, ...]
    schema_version: int | None = None
    sessions: int | None = None

    @property
    def healthy(self) -> bool:
        return not self.problems


def check_store(path: Path) -> StoreHealth:
    """Check the store at ``path`` page by page (``PRAGMA integrity_check``), read-only.

    Unlike opening a :class:`SessionStore`, this neither migrates nor writes, so it is safe
    on a damaged file. A missing file is a problem too.
    """
    if not path.exists():
        return StoreHealth(path, (f"{path} does not exist",))
    uri = f"file:{quote(path.as_posix())}?mode=ro"
    try:
        conn = sqlite3.connect(uri, uri=True, timeout=BUSY_TIMEOUT_MS / 1000)
    except sqlite3.Error as exc:
        return StoreHealth(path, (f"cannot open {path}: {exc}",))
    try:
        version = conn.execute("PRAGMA user_version").fetchone()[0]
        rows = conn.execute("PRAGMA integrity_check(100)").fetchall()
        problems = tuple(str(r[0]) for r in rows if r[0] != "ok")
        sessions = None if problems else conn.execute("SELECT count(*) FROM sessions").fetchone()[0]
    except sqlite3.Error as exc:
        return StoreHealth(path, (str(exc),))
    finally:
        conn.close()
    if not problems and version > SCHEMA_VERSION:
        problems = (
            f"written by a newer spawnkit (schema {version}, this one reads {SCHEMA_VERSION})",
        )
    return StoreHealth(path, problems, version, sessions)


class _SqliteTransaction:
    writable_ctes = False

    def __init__(self, conn: sqlite3.Connection) -> None:
        self._conn = conn

    def execute(self, sql: str, params: Params = ()) -> int:
        return self._conn.execute(sql, params).rowcount

    def executemany(self, sql: str, rows: Sequence[Params]) -> None:
        self._conn.executemany(sql, rows)

    def query(self, sql: str, params: Params = ()) -> Sequence[Row]:
        return self._conn.execute(sql, params).fetchall()


# The writes a run makes after its record exists, by name. Each takes its parameters as JSON
# values, so one that a server away could not take is kept in the journal
# (spawnkit.store.journal) and replayed later by the same function; every one is
# idempotent, and ``replayed`` makes the inserts so too (their first try may have been
# committed, its answer lost with the connection).


def _write_started(tx: Transaction, params: Any, replayed: bool) -> None:
    if len(params) == 4:  # journaled before records were sealed: the record keeps its seal
        params = [*params[:3], None, params[3]]
    tx.execute(
        "UPDATE sessions SET status = 'running', started_at = COALESCE(started_at, ?), "
        "trace_id = ?, workspace = ?, owner_seal = COALESCE(?, owner_seal) "
        "WHERE id = ? AND completed_at IS NULL",
        params,
    )


def _write_setup(tx: Transaction, params: Any, replayed: bool) -> None:
    tx.execute("UPDATE sessions SET sandbox = ?, given = ? WHERE id = ?", params)


_COMPLETE = """UPDATE sessions SET status = ?, success = ?, error = ?, error_kind = ?,
        output = ?, tool_calls = ?, num_tool_calls = ?, duration_ms = ?,
        input_tokens = ?, output_tokens = ?, cache_read_tokens = ?,
        cache_write_tokens = ?, cost_usd = ?, num_turns = ?,
        trace_id = COALESCE(?, trace_id),
        runtime_session_id = COALESCE(?, runtime_session_id),
        model = COALESCE(?, model), completed_at = ?, budget = ?,
        attempts = ?, network_denied = ?
    WHERE id = ? AND (completed_at IS NULL
        OR (status = 'crashed' AND num_tool_calls IS NULL AND owner_host = ?))"""


_COMPLETE_PARAMS = _COMPLETE.count("?")


def _write_complete(tx: Transaction, payload: Any, replayed: bool) -> None:
    # Calls can be there already when the run wrote them live as they started and ended
    # (record_tool_call), or when this write's first try was committed (a replay): the
    # final calls replace them. Otherwise there are none (a record is completed with its
    # calls once; only a crash mark, which has none, gives way), and none are looked for.
    replace = replayed or payload.get("live", True)
    if len(payload["session"]) == _COMPLETE_PARAMS - 1:  # journaled before network_denied
        payload = {**payload, "session": [*payload["session"][:-2], 0, *payload["session"][-2:]]}
    if tx.writable_ctes:
        _write_complete_one_statement(tx, payload, replace)
        return
    if tx.execute(_COMPLETE, payload["session"]):
        session_id = payload["session"][-2]
        if replace:
            tx.execute("DELETE FROM tool_calls WHERE session_id = ?", (session_id,))
        _insert_rows(tx, _CALL_INSERT, payload["calls"])


# The completion as one statement (PostgreSQL): the record's UPDATE in a WITH, and its
# calls inserted only when that UPDATE found the record. The calls travel as one JSON
# parameter (rows of json_to_recordset), so the statement is the same whatever their
# number, is prepared once per connection, and costs the client one json.dumps. Replacing
# earlier calls: those past the new last one go, the others are overwritten in place (one
# statement must not delete and insert the same row).
_CALL_KEYS = (
    "session_id", "seq", "call_id", "name", "server", "tool", "input", "output", "status",
    "started_at", "finished_at", "duration_ms",
)  # fmt: skip
_CALL_ROWS = """json_to_recordset(?::json) AS c(session_id TEXT, seq INTEGER, call_id TEXT,
    name TEXT, server TEXT, tool TEXT, input TEXT, output TEXT, status TEXT, started_at TEXT,
    finished_at TEXT, duration_ms BIGINT)"""
# A call written again (live, then by the result) replaces the row of its place in the run.
_CALL_UPSERT = "ON CONFLICT (session_id, seq) DO UPDATE SET " + ", ".join(
    f"{key} = excluded.{key}" for key in _CALL_KEYS[2:]
)
_COMPLETE_WITH_CALLS = f"""WITH done AS ({_COMPLETE} RETURNING id)
    INSERT INTO tool_calls ({", ".join(_CALL_KEYS)})
    SELECT c.* FROM {_CALL_ROWS} WHERE EXISTS (SELECT 1 FROM done)"""
_COMPLETE_REPLACING_CALLS = f"""WITH done AS ({_COMPLETE} RETURNING id),
    gone AS (DELETE FROM tool_calls WHERE session_id IN (SELECT id FROM done) AND seq >= ?)
    INSERT INTO tool_calls ({", ".join(_CALL_KEYS)})
    SELECT c.* FROM {_CALL_ROWS} WHERE EXISTS (SELECT 1 FROM done)
    {_CALL_UPSERT}"""


def _write_complete_one_statement(tx: Transaction, payload: Any, replace: bool) -> None:
    calls = payload["calls"]
    if not calls and not replace:
        tx.execute(_COMPLETE, payload["session"])
        return
    rows = json.dumps([dict(zip(_CALL_KEYS, call, strict=True)) for call in calls])
    if replace:
        tx.execute(_COMPLETE_REPLACING_CALLS, [*payload["session"], len(calls), rows])
    else:
        tx.execute(_COMPLETE_WITH_CALLS, [*payload["session"], rows])


# A tool call written live (record_tool_call), only while its record is open. The casts
# type the two numbers a server cannot infer in a SELECT list (a NULL would be text).
_LIVE_CALL = f"""INSERT INTO tool_calls ({", ".join(_CALL_KEYS)})
    SELECT ?, CAST(? AS INTEGER), ?, ?, ?, ?, ?, ?, ?, ?, ?, CAST(? AS BIGINT)
    WHERE EXISTS (SELECT 1 FROM sessions WHERE id = ? AND completed_at IS NULL)
    {_CALL_UPSERT}"""
_CALL_INSERT = """INSERT INTO tool_calls (session_id, seq, call_id, name, server, tool, input,
    output, status, started_at, finished_at, duration_ms) VALUES """
# Rows per multi-row INSERT: one statement (one round trip on a server) for a run's calls,
# far below SQLite's limit of 32766 parameters.
_ROWS_PER_INSERT = 500


def _insert_rows(tx: Transaction, insert: str, rows: Sequence[Sequence[object]]) -> None:
    """``rows`` with as few ``INSERT … VALUES (…), (…)`` statements as fit."""
    for start in range(0, len(rows), _ROWS_PER_INSERT):
        chunk = rows[start : start + _ROWS_PER_INSERT]
        marks = "(" + ", ".join("?" * len(chunk[0])) + ")"
        tx.execute(insert + ", ".join([marks] * len(chunk)), [v for row in chunk for v in row])


def _write_cli_spans(tx: Transaction, rows: Any, replayed: bool) -> None:
    if replayed:
        tx.executemany(
            "DELETE FROM cli_spans WHERE session_id = ? AND span_id = ?",
            [(r[0], r[2]) for r in rows],
        )
    tx.executemany(
        """INSERT INTO cli_spans (session_id, trace_id, span_id, parent_span_id, name,
               service, start_ns, end_ns, status, attributes, reparented)
           VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)""",
        rows,
    )


def _write_cli_events(tx: Transaction, rows: Any, replayed: bool) -> None:
    if replayed:
        tx.executemany(
            "DELETE FROM cli_events WHERE session_id = ? AND kind = ? AND name = ? AND time_ns = ?",
            sorted({(r[0], r[1], r[2], r[4]) for r in rows}),
        )
    tx.executemany(
        """INSERT INTO cli_events (session_id, kind, name, service, time_ns, trace_id,
               span_id, value, attributes)
           VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)""",
        rows,
    )


# The writes that are one statement (a server commits it without BEGIN and COMMIT).
_SINGLE_STATEMENT = frozenset({"started", "setup", "mcp_call", "episode"})
# ... and on an engine with writable CTEs (PostgreSQL) the completion too.
_SINGLE_WITH_CTES = _SINGLE_STATEMENT | {"complete"}


def _write_mcp_call(tx: Transaction, row: Any, replayed: bool) -> None:
    """An MCP call the butler's server saw; its session found by key if it was not yet."""
    butler, key, session_id, tool, _, _, _, called_at, _ = row
    if replayed:
        tx.execute(
            "DELETE FROM mcp_calls WHERE butler = ? AND tool = ? AND called_at = ? "
            "AND COALESCE(session_key, '') = COALESCE(?, '')",
            (butler, tool, called_at, key),
        )
    tx.execute(
        """INSERT INTO mcp_calls (butler, session_key, session_id, tool, arguments, result,
               is_error, called_at, duration_ms)
           SELECT ?, ?, COALESCE(?, (SELECT id FROM sessions WHERE runtime_session_id = ?
               OR id = ? ORDER BY created_at DESC LIMIT 1)), ?, ?, ?, ?, ?, ?""",
        [butler, key, session_id, key, key, *row[3:]],
    )


def _write_episode(tx: Transaction, row: Any, replayed: bool) -> None:
    butler, session_id, _, _, created_at = row
    if replayed:
        tx.execute(
            "DELETE FROM episodes WHERE butler = ? AND created_at = ? "
            "AND COALESCE(session_id, '') = COALESCE(?, '')",
            (butler, created_at, session_id),
        )
    tx.execute(
        "INSERT INTO episodes (butler, session_id, prompt, output, created_at) "
        "VALUES (?, ?, ?, ?, ?)",
        row,
    )


_WRITES: dict[str, Callable[[Transaction, Any, bool], None]] = {
    "started": _write_started,
    "setup": _write_setup,
    "complete": _write_complete,
    "cli_spans": _write_cli_spans,
    "cli_events": _write_cli_events,
    "mcp_call": _write_mcp_call,
    "episode": _write_episode,
}
# A write that failed faster than this was on a pooled connection the server had already
# dropped (it restarted): tried once more, on a fresh one, before it is journaled.
_STALE_CONNECTION_S = 1.0
# The background replay of the journal: first retry, and the longest wait between two.
RETRY_FIRST_S = 0.5
RETRY_MAX_S = 10.0


class SqliteBackend:
    """The embedded :class:`~spawnkit.store.backend.Backend`: one SQLite file in WAL mode.

    Connections are per thread. Opening it moves the credentials an older spawnkit kept in
    the file out to the credentials file, then migrates the schema (``PRAGMA user_version``).
    """

    errors: tuple[type[Exception], ...] = (sqlite3.Error,)

    def __init__(self, path: Path) -> None:
        self.path: Path | None = path
        self.url: str | None = None
        self.file = path
        self.location = str(path)
        self.local_dir = path.parent
        self._local = threading.local()
        self._connections: list[sqlite3.Connection] = []
        self._lock = threading.Lock()
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise HomeNotWritable(path.parent, exc.strerror or str(exc)) from exc
        try:
            self._move_credentials_out()
            self._migrate()
        except sqlite3.Error as exc:
            raise store_error(path, exc) from exc

    def error(self, exc: Exception) -> StoreError:
        assert isinstance(exc, sqlite3.Error)
        return store_error(self.file, exc)

    def _connect(self) -> sqlite3.Connection:
        conn: sqlite3.Connection | None = getattr(self._local, "conn", None)
        if conn is None:
            created = not self.file.exists()
            conn = sqlite3.connect(
                self.file, timeout=BUSY_TIMEOUT_MS / 1000, isolation_level=None,
                check_same_thread=False,
            )  # fmt: skip
            if created:
                self.file.chmod(0o600)  # prompts and outputs are private too
            conn.row_factory = sqlite3.Row
            conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
            _enable_wal(conn)
            conn.execute("PRAGMA synchronous = NORMAL")
            self._local.conn = conn
            with self._lock:
                self._connections.append(conn)
        return conn

    def query(self, sql: str, params: Params = ()) -> Sequence[Row]:
        return self._connect().execute(sql, params).fetchall()

    @contextmanager
    def transaction(self, single: bool = False) -> Iterator[_SqliteTransaction]:
        with self._tx() as conn:
            yield _SqliteTransaction(conn)

    @contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        """A write transaction that takes the write lock up front (no upgrade deadlocks)."""
        conn = self._connect()
        conn.execute("BEGIN IMMEDIATE")
        try:
            yield conn
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        else:
            conn.execute("COMMIT")

    def _migrate(self) -> None:
        with self._tx() as conn:
            version = conn.execute("PRAGMA user_version").fetchone()[0]
            if version > SCHEMA_VERSION:
                raise StoreTooNew(self.location, version, SCHEMA_VERSION)
            if version == 0:
                for statement in statements(_SCHEMA):
                    conn.execute(statement)
                for statement in (*_HISTORY_SCHEMA, *_CLI_SPANS_SCHEMA, *_CLI_EVENTS_SCHEMA):
                    conn.execute(statement)
            else:
                for step in _MIGRATIONS[version - 1 :]:
                    for statement in step:
                        conn.execute(statement)
            conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")

    def _move_credentials_out(self) -> None:
        """Move the ``credentials`` table an older spawnkit kept into the credentials file.

        Crash-safe and idempotent: inside one write transaction the rows are merged
        into the file (written atomically and fsynced) before the table is dropped, so
        a crash in between leaves them in both places and the next open merges the
        same values again. The drop zeroes the freed pages (``secure_delete``) and the
        WAL is then truncated, so the values leave the files, not just the table. A
        store too damaged to read the table, or a file that cannot be written, keeps
        the rows and says so: nothing is deleted that was not written first.
        """
        conn = self._connect()
        target = CredentialFile.beside(self.file)
        moved: list[StoredCredential] | None = None
        lost: list[str] = []
        secure = 1
        try:
            if not _has_table(conn, "credentials"):
                return
            with self._tx() as tx:
                if not _has_table(tx, "credentials"):
                    return  # another process moved them first
                rows = tx.execute("SELECT name, value, updated_at FROM credentials").fetchall()
                found = [StoredCredential(r["name"], r["value"], _credential_time(r)) for r in rows]
                lost = target.merge(found)
                moved = found
                secure = tx.execute("PRAGMA secure_delete").fetchone()[0]
                tx.execute("PRAGMA secure_delete = ON")  # zero the freed pages
                tx.execute("DROP TABLE credentials")
        except (sqlite3.DatabaseError, OSError, CredentialError) as exc:
            if moved is None:
                logger.warning(
                    "could not move the credentials in %s to %s (%s); they stay in the store, "
                    "where runs do not see them, until this succeeds "
                    "(`spawnkit store check` checks the store)",
                    self.file, target.path, exc,
                )  # fmt: skip
            else:
                logger.warning(
                    "copied %d credential(s) from %s to %s but could not delete them from the "
                    "store (%s); the next open tries again",
                    len(moved), self.file, target.path, exc,
                )  # fmt: skip
            return
        try:
            conn.execute(f"PRAGMA secure_delete = {int(secure)}")
            conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        except sqlite3.Error as exc:
            logger.warning("%s: the dropped credentials may linger in the WAL (%s)", self.file, exc)
        if lost:
            logger.warning(
                "credentials %s: the value in %s is newer than the one %s held; kept it",
                ", ".join(lost), target.path, self.file,
            )  # fmt: skip
        if moved:
            logger.info("moved %d credential(s) out of %s", len(moved), self.file)

    def slot_claim(self, name: str, capacity: int) -> None:
        return None  # one host's file: the spawner's own semaphore is the limit

    def admission(self, name: str) -> None:
        return None  # one host's file: the spawner's own queue is the limit

    def close(self) -> None:
        with self._lock:
            for conn in self._connections:
                conn.close()
            self._connections.clear()
        self._local = threading.local()


class SessionStore:
    """The session store, on SQLite (a path, the default) or PostgreSQL (a URL).

    ``SessionStore()`` opens the store the user chose (:func:`~spawnkit.home.store_setting`),
    else ``$SPAWNKIT_HOME/sessions.db``; ``SessionStore(path_or_url)`` opens that one. Every
    method is written once, against the :class:`~spawnkit.store.backend.Backend` it opened;
    safe to share between threads and processes, and between hosts on PostgreSQL.
    """

    def __init__(self, target: str | Path | None = None, *, lease_s: float | None = None) -> None:
        if target is None:
            target = store_setting() or default_store_path()
        if is_postgres_url(target):
            from .postgres import PostgresBackend  # psycopg loads only when it is used

            self._db: Backend = PostgresBackend(str(target))
        else:
            self._db = SqliteBackend(Path(target))
        # The SQLite file (None on a server); its name, or the URL without password.
        self.path = self._db.path
        self.location = self._db.location
        # What opens this store from another process (a Dask worker): the file's absolute
        # path, or the URL with its password.
        self.target = str(self.path.resolve()) if self.path is not None else str(target)
        self._host = host_name()
        # How long a record stays this host's without a renewal (spawnkit.home.lease_seconds).
        self.lease_s = lease_s if lease_s is not None else lease_seconds()
        self._pid = os.getpid()
        self._pid_start = process_start(self._pid)
        # This home's key for sealing records, read when the first is written (False: none).
        self._sealer: HomeSeal | Literal[False] | None = None
        # A server's writes that could not be made wait in this machine's journal; SQLite
        # is on this machine: its writes succeed or fail at once, with nothing to replay.
        self._journal = StoreJournal(self.local_dir, self.location) if self.path is None else None
        # The writes that are one statement here (the server, PostgreSQL, has writable CTEs).
        self._singles = _SINGLE_STATEMENT if self.path is not None else _SINGLE_WITH_CTES
        self._retrier: threading.Thread | None = None
        # Open runs whose tool calls were written live here (record_tool_call).
        self._live_calls: set[str] = set()
        self._retrier_lock = threading.Lock()
        self._wake = threading.Event()
        self._closing = threading.Event()
        if self._journal is not None and self._journal.maybe_pending:
            # Before the sweep: a run whose completion waits here is not a crashed one.
            self.replay_journal()
            if self._journal.maybe_pending:
                self._retry_soon()
        self.recover_orphans()

    @property
    def url(self) -> str | None:
        """The PostgreSQL server's URL, password included (print :attr:`location`); None on
        SQLite. What a :class:`~spawnkit.store.listen.ChangeFeed` listens on."""
        return self._db.url

    @property
    def source(self) -> Path | str:
        """What the store was opened on: its SQLite file, or its URL. The URL carries the
        password, for readers that connect on their own (history DataFrames); never show it."""
        if self.path is not None:
            return self.path
        return str(self.url)

    @property
    def host(self) -> str:
        """The name this host's records carry (``$SPAWNKIT_HOST``, else the node name)."""
        return self._host

    @property
    def local_dir(self) -> Path:
        """This machine's folder for what stays local: the credentials file."""
        return self._db.local_dir

    def close(self) -> None:
        self._closing.set()
        self._wake.set()
        retrier = self._retrier
        if retrier is not None:
            retrier.join(timeout=1.0)  # it may wait on a server still away: not for long
        self._db.close()

    # -- the journal of writes a server away could not take (spawnkit.store.journal) ----

    @property
    def journal(self) -> StoreJournal | None:
        """This machine's journal of this store's writes waiting for the server (None on
        SQLite)."""
        return self._journal

    def pending_writes(self) -> int:
        """How many of this store's writes wait in the journal for the server."""
        return self._journal.pending() if self._journal is not None else 0

    def _write(self, op: str, session_id: str | None, payload: Any) -> None:
        """One of the :data:`_WRITES`: made now, or kept in the journal while the server is
        away (and while earlier writes wait there, so they keep their order)."""
        journal = self._journal
        if journal is None:
            try:
                with self._db.transaction(op in self._singles) as tx:
                    _WRITES[op](tx, payload, False)
            except self._db.errors as exc:
                raise self._db.error(exc) from exc
            return
        if journal.maybe_pending:
            journal.append(op, session_id, payload, "behind earlier writes still waiting")
            self._retry_soon()
            return
        started = time.monotonic()
        replayed = False
        while True:
            try:
                with self._db.transaction(op in self._singles and not replayed) as tx:
                    _WRITES[op](tx, payload, replayed)
                return
            except self._db.errors as exc:
                error = self._db.error(exc)
                if not isinstance(error, StoreUnreachable):
                    raise error from exc
                if not replayed and time.monotonic() - started < _STALE_CONNECTION_S:
                    replayed = True  # the first try may have been committed
                    continue
                journal.append(op, session_id, payload, str(error))
                logger.warning(
                    "%s; %s of session %s is kept in %s and written when the server is back",
                    error, op, session_id, journal.path,
                )  # fmt: skip
                self._retry_soon()
                return

    def replay_journal(self) -> int:
        """Write what the journal keeps for this store, oldest first; how many were written.

        Stops at the first write the server cannot take yet (still away): the rest keep
        their order for the next try. Does nothing while another thread or process replays.
        """
        journal = self._journal
        if journal is None:
            return 0
        written = 0
        with journal.replaying() as mine:
            if not mine:
                return 0
            while True:
                journal.maybe_pending = False  # an append from now on sets it again
                entry = journal.first()
                if entry is None:
                    break
                journal.maybe_pending = True
                try:
                    with self._db.transaction() as tx:
                        _WRITES[entry.op](tx, entry.payload, True)
                except self._db.errors as exc:
                    error = self._db.error(exc)
                    if isinstance(error, StoreUnreachable):
                        journal.retry_later(entry, str(error))
                        break
                    journal.give_up(entry, str(error))
                    logger.error(
                        "%s refused the journaled %s of session %s (%s); it stays in %s, "
                        "marked failed", self.location, entry.op, entry.session_id, error,
                        journal.path,
                    )  # fmt: skip
                    continue
                journal.done(entry)
                written += 1
        if written:
            logger.warning("%s is back: wrote %d journaled write(s)", self.location, written)
        return written

    def _retry_soon(self) -> None:
        """Replay the journal in a background thread, now and then with a growing wait,
        until it is empty or the store is closed."""
        with self._retrier_lock:
            self._wake.set()
            if self._retrier is not None and self._retrier.is_alive():
                return
            self._retrier = threading.Thread(
                target=self._retry_journal, name="spawnkit-store-journal", daemon=True
            )
            self._retrier.start()

    def _retry_journal(self) -> None:
        journal = self._journal
        assert journal is not None
        wait = RETRY_FIRST_S
        while not self._closing.is_set():
            self._wake.wait(wait)
            self._wake.clear()
            if self._closing.is_set():
                return
            if self.replay_journal() or not journal.maybe_pending:
                wait = RETRY_FIRST_S
            else:
                wait = min(wait * 2, RETRY_MAX_S)
            with self._retrier_lock:
                if not journal.maybe_pending and not self._wake.is_set():
                    self._retrier = None
                    return

    def __enter__(self) -> SessionStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- sessions --------------------------------------------------------------

    @_translated
    def create_session(
        self,
        session_id: str,
        *,
        butler: str,
        runtime: str,
        model: str | None,
        prompt: str,
        context: str | None,
        trigger_source: str,
        runtime_session_id: str | None = None,
        parent_session_id: str | None = None,
        created_at: datetime | None = None,
        log_dir: Path | None = None,
        role: str | None = None,
        kind: str = "run",
        sources: Sequence[str] = (),
    ) -> None:
        with self._db.transaction(single=True) as tx:
            tx.execute(
                """INSERT INTO sessions (id, butler, runtime, model, prompt, context,
                       trigger_source, status, runtime_session_id, parent_session_id,
                       created_at, owner_host, owner_pid, owner_start, log_dir, role,
                       kind, sources, lease_until, owner_seal)
                   VALUES (?, ?, ?, ?, ?, ?, ?, 'queued', ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)""",
                (
                    session_id, butler, runtime, model, prompt, context, trigger_source,
                    runtime_session_id, parent_session_id, _iso(created_at or utcnow()),
                    self._host, self._pid, self._pid_start, str(log_dir) if log_dir else None,
                    role, kind, json.dumps(list(sources)) if sources else None,
                    self._lease_end(), self._seal(session_id, None),
                ),
            )  # fmt: skip

    def mark_started(
        self,
        session_id: str,
        *,
        started_at: datetime,
        trace_id: str | None = None,
        workspace: Path | None = None,
    ) -> None:
        """The run is running; ``workspace`` is kept so a sweep can remove it if we die."""
        params = [
            _iso(started_at), trace_id, str(workspace) if workspace else None,
            self._seal(session_id, workspace), session_id,
        ]  # fmt: skip
        self._write("started", session_id, params)

    def record_setup(self, session_id: str, *, sandbox: str, given: dict[str, Any]) -> None:
        """Record how a run was contained and what its CLI was given (config, servers, tools)."""
        params = [sandbox, json.dumps(given, ensure_ascii=False), session_id]
        self._write("setup", session_id, params)

    def complete_session(
        self, session_id: str, result: SpawnerResult, completed_at: datetime | None = None
    ) -> None:
        """Close the record with the run's result; a record is completed only once.

        Only a ``crashed`` mark of this host's record gives way: another host (its lease ran
        out while the server was away) or a sweep guessed the run died, and here is how it
        really ended (a completion replayed from the journal, :mod:`spawnkit.store.journal`).
        """
        calls_json = json.dumps([c.to_dict() for c in result.tool_calls], ensure_ascii=False)
        session = [
            result.status, int(result.success), result.error, result.error_kind,
            result.output, calls_json, len(result.tool_calls), result.duration_ms,
            result.usage.input_tokens, result.usage.output_tokens,
            result.usage.cache_read_tokens, result.usage.cache_write_tokens,
            result.cost_usd, result.num_turns, result.trace_id,
            result.runtime_session_id, result.model,
            _iso(completed_at or utcnow()),
            json.dumps(asdict(result.budget)) if result.budget else None,
            json.dumps([a.to_dict() for a in result.attempts]) if result.attempts else None,
            result.network_denied,
            session_id, self._host,
        ]  # fmt: skip
        calls = [
            [
                session_id, seq, c.id, c.name, c.server, c.tool,
                json.dumps(c.input, ensure_ascii=False), c.output, c.status,
                _iso(c.started_at), _iso(c.finished_at), c.duration_ms,
            ]
            for seq, c in enumerate(result.tool_calls)
        ]  # fmt: skip
        # Rows to replace: calls the run wrote live through this store (record_tool_call).
        live = session_id in self._live_calls
        self._live_calls.discard(session_id)
        self._write("complete", session_id, {"session": session, "calls": calls, "live": live})

    @_translated
    def record_tool_call(self, session_id: str, seq: int, call: ToolCall) -> bool:
        """One tool call of a run still going, written as it starts and again as it ends,
        so that other hosts sharing the store see it live; ``seq`` is its place in the run.
        A completed record is left alone (its calls are the ones ``complete_session``
        wrote). Whether it was written.

        One statement, the record's check in it: one round trip on a server, where a
        transaction of a query and an insert took four."""
        # Counted as written live before the write: one that fails after the server
        # committed it is there all the same, and the result's write must replace it.
        self._live_calls.add(session_id)
        with self._db.transaction(single=True) as tx:
            written = tx.execute(
                _LIVE_CALL,
                (
                    session_id, seq, call.id, call.name, call.server, call.tool,
                    json.dumps(call.input, ensure_ascii=False), call.output, call.status,
                    _iso(call.started_at), _iso(call.finished_at), call.duration_ms,
                    session_id,
                ),
            )  # fmt: skip
        if not written:  # the record is closed: no result's write comes for it here
            self._live_calls.discard(session_id)
        return bool(written)

    @_translated
    def spent_since(self, butler: str, since: datetime) -> float:
        """Dollars the butler's runs completed since ``since`` cost (their recorded cost)."""
        rows = self._db.query(
            "SELECT COALESCE(SUM(cost_usd), 0) AS spent FROM sessions WHERE butler = ? "
            "AND completed_at >= ? AND cost_usd IS NOT NULL",
            (butler, _iso(since)),
        )
        return float(rows[0]["spent"])

    @_translated
    def get_session(self, session_id: str) -> SessionRecord | None:
        rows = self._db.query("SELECT * FROM sessions WHERE id = ?", (session_id,))
        return SessionRecord.from_row(rows[0]) if rows else None

    @_translated
    def list_sessions(
        self,
        *,
        butler: str | None = None,
        status: str | None = None,
        limit: int = 50,
    ) -> list[SessionRecord]:
        clauses, params = [], []
        if butler:
            clauses.append("butler = ?")
            params.append(butler)
        if status:
            clauses.append("status = ?")
            params.append(status)
        where = f"WHERE {' AND '.join(clauses)}" if clauses else ""
        rows = self._db.query(
            f"SELECT * FROM sessions {where} ORDER BY created_at DESC LIMIT ?", (*params, limit)
        )
        return [SessionRecord.from_row(r) for r in rows]

    @_translated
    def open_sessions(self, limit: int = 200) -> list[SessionRecord]:
        """Runs not yet ended, on every host sharing the store, oldest first."""
        rows = self._db.query(
            "SELECT * FROM sessions WHERE completed_at IS NULL ORDER BY created_at LIMIT ?",
            (limit,),
        )
        return [SessionRecord.from_row(r) for r in rows]

    @_translated
    def tool_call_names(self, session_ids: Sequence[str]) -> dict[str, list[str]]:
        """The names of each session's tool calls so far, in order (written live)."""
        if not session_ids:
            return {}
        marks = ", ".join("?" * len(session_ids))
        rows = self._db.query(
            f"SELECT session_id, name FROM tool_calls WHERE session_id IN ({marks}) "
            "ORDER BY session_id, seq",
            tuple(session_ids),
        )
        found: dict[str, list[str]] = {}
        for row in rows:
            found.setdefault(row["session_id"], []).append(row["name"])
        return found

    @_translated
    def sessions_with_prefix(self, prefix: str, limit: int = 2) -> list[SessionRecord]:
        """Sessions whose id starts with ``prefix``, oldest id first, at most ``limit``.

        A range scan of the primary key (``prefix <= id < prefix + 1``), so any session is
        found whatever the size of the store.
        """
        if not prefix:
            return []
        last = ord(prefix[-1])
        upper = prefix[:-1] + chr(last + 1) if last < 0x10FFFF else None
        sql = "SELECT * FROM sessions WHERE id >= ?" + (" AND id < ?" if upper else "")
        params: tuple[object, ...] = (prefix, upper) if upper else (prefix,)
        rows = self._db.query(f"{sql} ORDER BY id LIMIT ?", (*params, limit))
        return [SessionRecord.from_row(r) for r in rows]

    @_translated
    def count_sessions(self) -> int:
        return int(self._db.query("SELECT count(*) AS n FROM sessions")[0]["n"])

    @_translated
    def resolve_session(self, key: str) -> str | None:
        """spawnkit's session id for a runtime session id (or for itself)."""
        rows = self._db.query(
            "SELECT id FROM sessions WHERE runtime_session_id = ? OR id = ? "
            "ORDER BY created_at DESC LIMIT 1",
            (key, key),
        )
        return str(rows[0]["id"]) if rows else None

    @_translated
    def recover_orphans(self) -> int:
        """Close the runs whose owner is gone; how many.

        Other hosts' runs whose lease expired are marked ``crashed``
        (:meth:`expire_leases`); this host's runs whose owner process died are swept up
        at once, lease or not (:mod:`spawnkit.sweep`).
        """
        return len(self.expire_leases()) + len(sweep(self))

    @_translated
    def slot_claim(self, butler: str, capacity: int) -> SlotClaim | None:
        """A claim on one of ``butler``'s ``capacity`` run slots across every host sharing
        this store (PostgreSQL advisory locks), or None on SQLite, one host's store."""
        return self._db.slot_claim(butler, capacity)

    @_translated
    def admission(self, butler: str) -> Admission | None:
        """``butler``'s admission places across every host sharing this store (PostgreSQL),
        or None on SQLite, one host's store."""
        return self._db.admission(butler)

    # -- leases: runs that belong to a host -----------------------------------------

    def _lease_end(self) -> str:
        return _stamp(utcnow() + timedelta(seconds=self.lease_s))

    @_translated
    def renew_leases(self, session_ids: Sequence[str]) -> int:
        """Extend the lease of this host's open records ``session_ids``; how many were open."""
        if not session_ids:
            return 0
        marks = ", ".join("?" for _ in session_ids)
        with self._db.transaction() as tx:
            return tx.execute(
                f"UPDATE sessions SET lease_until = ? WHERE id IN ({marks}) "
                "AND owner_host = ? AND completed_at IS NULL",
                (self._lease_end(), *session_ids, self._host),
            )

    @_translated
    def expire_leases(self) -> list[str]:
        """Mark ``crashed`` the open records of other hosts whose lease ran out; their ids.

        Their host died or lost the network: it stopped renewing them. One statement, so
        when several hosts see the same record at once, one of them closes it. This
        host's own records are left to the sweep, which knows at once whether their owner
        process lives. Records without a lease (written by an older spawnkit) never expire.
        """
        now = _stamp(utcnow())
        with self._db.transaction() as tx:
            rows = tx.query(
                "UPDATE sessions SET status = 'crashed', success = 0, error_kind = 'crash', "
                "completed_at = ?, "
                "error = 'the lease of host ' || COALESCE(owner_host, 'unknown') || "
                "' ran out at ' || lease_until || ' without a renewal: the host died or lost "
                "the network before the run completed (seen by ' || ? || ')' "
                "WHERE completed_at IS NULL AND lease_until < ? "
                "AND (owner_host IS NULL OR owner_host <> ?) RETURNING id",
                (now, self._host, now, self._host),
            )
        expired = [str(r["id"]) for r in rows]
        for session_id in expired:
            logger.warning("session %s: its host's lease ran out; marked crashed", session_id)
        return expired

    @_translated
    def open_runs_here(self) -> list[OpenRun]:
        """This host's records that have not completed, with their owner, workspace and
        seal (which home on this host wrote them: :class:`~spawnkit.sweep.HomeSeal`)."""
        rows = self._db.query(
            "SELECT id, owner_pid, owner_start, workspace, given, owner_seal FROM sessions "
            "WHERE completed_at IS NULL AND owner_host = ?",
            (self._host,),
        )
        return [
            OpenRun(r["id"], r["owner_pid"], r["owner_start"],
                    Path(r["workspace"]) if r["workspace"] else None,
                    _dispatched_worker(r["given"]), self._host, r["owner_seal"])
            for r in rows
            if r["owner_pid"] is not None
        ]  # fmt: skip

    # -- a run dispatched to a cluster: queued by its client, adopted by a worker -------

    def _seal(self, session_id: str, workspace: Path | None) -> str | None:
        """This home's seal on a record this process owns (spawnkit.sweep.HomeSeal); None
        when the home has no key (the sweep then kills and removes nothing for the run)."""
        if self._sealer is None:
            self._sealer = HomeSeal.of_home(create=True) or False
        if self._sealer is False:
            return None
        return self._sealer.seal(session_id, self._host, self._pid, self._pid_start, workspace)

    @property
    def owner(self) -> tuple[str, int]:
        """(host, pid) the records this process creates carry as their owner."""
        return self._host, self._pid

    @_translated
    def adopt_session(
        self,
        session_id: str,
        *,
        queued_by: tuple[str, int],
        model: str | None,
        prompt: str,
        context: str | None,
        runtime_session_id: str | None,
        log_dir: Path | None,
    ) -> bool:
        """Make the ``queued`` record a dispatching client (``queued_by``, its owner) made
        for this run this process's, with the run's details known here (spawnkit.dispatch).
        False when it is not that client's unstarted open record any more: closed, or
        adopted already (by a worker that died: the run is not taken twice)."""
        params = (
            self._host, self._pid, self._pid_start, self._seal(session_id, None),
            self._lease_end(), model, prompt, context, runtime_session_id,
            str(log_dir) if log_dir else None, session_id, *queued_by,
        )  # fmt: skip
        with self._db.transaction() as tx:
            return (
                tx.execute(
                    "UPDATE sessions SET owner_host = ?, owner_pid = ?, owner_start = ?, "
                    "owner_seal = ?, lease_until = ?, model = COALESCE(?, model), prompt = ?, "
                    "context = ?, runtime_session_id = ?, log_dir = ? "
                    "WHERE id = ? AND completed_at IS NULL "
                    "AND started_at IS NULL AND owner_host = ? AND owner_pid = ?",
                    params,
                )
                > 0
            )

    @_translated
    def close_queued(
        self, session_id: str, *, status: str, error: str | None, error_kind: str | None
    ) -> bool:
        """Close this process's record of a dispatched run no worker adopted (cancelled
        before it started, say); False when a worker adopted it or it is closed."""
        with self._db.transaction() as tx:
            return (
                tx.execute(
                    "UPDATE sessions SET status = ?, success = 0, error = ?, error_kind = ?, "
                    "completed_at = ? WHERE id = ? AND completed_at IS NULL "
                    "AND started_at IS NULL AND owner_host = ? AND owner_pid = ?",
                    (status, error, error_kind, _iso(utcnow()), session_id, *self.owner),
                )
                > 0
            )

    @_translated
    def withdraw_queued(self, session_id: str) -> bool:
        """Delete this process's record of a dispatched run that a worker refused before
        accepting it (raised to the caller, as a local refusal is, with no record)."""
        with self._db.transaction() as tx:
            return (
                tx.execute(
                    "DELETE FROM sessions WHERE id = ? AND completed_at IS NULL "
                    "AND started_at IS NULL AND owner_host = ? AND owner_pid = ?",
                    (session_id, *self.owner),
                )
                > 0
            )

    @_translated
    def mark_crashed(self, session_id: str, reason: str) -> bool:
        """Close an open record as ``crashed`` because of ``reason``; False if already closed."""
        with self._db.transaction() as tx:
            return (
                tx.execute(
                    "UPDATE sessions SET status = 'crashed', success = 0, error_kind = 'crash', "
                    "error = ?, completed_at = ? WHERE id = ? AND completed_at IS NULL",
                    (reason, _iso(utcnow()), session_id),
                )
                > 0
            )

    # -- MCP calls seen by a butler's server --------------------------------------

    def record_mcp_call(
        self,
        *,
        butler: str,
        session_key: str | None,
        tool: str,
        arguments: dict[str, Any],
        result: str,
        is_error: bool,
        called_at: datetime,
        duration_ms: int,
    ) -> str | None:
        session_id: str | None = None
        if session_key:
            try:
                session_id = self.resolve_session(session_key)
            except StoreUnreachable:
                if self._journal is None:
                    raise
                # Journaled below: the replay finds the session by its key then.
        row = [
            butler, session_key, session_id, tool,
            json.dumps(arguments, ensure_ascii=False, default=str), result,
            int(is_error), _iso(called_at), duration_ms,
        ]  # fmt: skip
        self._write("mcp_call", session_id, row)
        return session_id

    @_translated
    def mcp_calls(self, session_id: str) -> list[dict[str, Any]]:
        rows = self._db.query(
            "SELECT * FROM mcp_calls WHERE session_id = ? ORDER BY id", (session_id,)
        )
        return [
            {
                **dict(r),
                "arguments": json.loads(r["arguments"] or "{}"),
                "is_error": bool(r["is_error"]),
            }
            for r in rows
        ]

    # -- butler state ------------------------------------------------------------

    def state_get(self, butler: str, key: str) -> Any:
        """The value stored under ``key``, or None."""
        return self.state_lookup(butler, key)[1]

    @_translated
    def state_lookup(self, butler: str, key: str) -> tuple[bool, Any]:
        """``(found, value)``: tells a stored null from an absent key."""
        rows = self._db.query("SELECT value FROM state WHERE butler = ? AND key = ?", (butler, key))
        return (True, json.loads(rows[0]["value"])) if rows else (False, None)

    @_translated
    def state_set(self, butler: str, key: str, value: Any) -> None:
        with self._db.transaction() as tx:
            tx.execute(
                "INSERT INTO state (butler, key, value, updated_at) VALUES (?, ?, ?, ?) "
                "ON CONFLICT (butler, key) DO UPDATE SET value = excluded.value, "
                "updated_at = excluded.updated_at",
                (butler, key, json.dumps(value, ensure_ascii=False), _iso(utcnow())),
            )

    @_translated
    def state_list(self, butler: str, prefix: str = "") -> dict[str, Any]:
        # substr, not LIKE: LIKE ignores ASCII case and treats % and _ as wildcards.
        rows = self._db.query(
            "SELECT key, value FROM state WHERE butler = ? AND substr(key, 1, ?) = ? ORDER BY key",
            (butler, len(prefix), prefix),
        )
        return {r["key"]: json.loads(r["value"]) for r in rows}

    # -- memory episodes -----------------------------------------------------------

    def add_episode(self, butler: str, session_id: str | None, prompt: str, output: str) -> None:
        self._write("episode", session_id, [butler, session_id, prompt, output, _iso(utcnow())])

    @_translated
    def recent_episodes(self, butler: str, limit: int) -> list[dict[str, Any]]:
        """The latest ``limit`` episodes of ``butler``, newest first."""
        rows = self._db.query(
            "SELECT session_id, prompt, output, created_at FROM episodes "
            "WHERE butler = ? ORDER BY id DESC LIMIT ?",
            (butler, limit),
        )
        return [dict(r) for r in rows]

    # -- the CLIs' own spans (spawnkit.otlp) ----------------------------------------

    def record_cli_spans(self, spans: Sequence[dict[str, Any]]) -> int:
        """Store spans a run's CLI exported (``spawnkit.otlp.CliSpan`` fields); returns how many."""
        if not spans:
            return 0
        rows = [
            [
                s["session_id"], s["trace_id"], s["span_id"], s["parent_span_id"],
                s["name"], s["service"], s["start_ns"], s["end_ns"], s["status"],
                json.dumps(s["attributes"], ensure_ascii=False, default=str),
                int(s["reparented"]),
            ]
            for s in spans
        ]  # fmt: skip
        self._write("cli_spans", str(spans[0]["session_id"]), rows)
        return len(spans)

    def record_cli_events(self, events: Sequence[dict[str, Any]]) -> int:
        """Store log events and metric points a run's CLI exported (``spawnkit.otlp.CliEvent``
        fields); returns how many."""
        if not events:
            return 0
        rows = [
            [
                e["session_id"], e["kind"], e["name"], e["service"], e["time_ns"],
                e["trace_id"], e["span_id"], e["value"],
                json.dumps(e["attributes"], ensure_ascii=False, default=str),
            ]
            for e in events
        ]  # fmt: skip
        self._write("cli_events", str(events[0]["session_id"]), rows)
        return len(events)

    @_translated
    def cli_events(self, session_id: str | None = None) -> list[dict[str, Any]]:
        """The stored CLI log events and metric points (of one session, or all), by time."""
        where, args = ("WHERE session_id = ?", (session_id,)) if session_id else ("", ())
        rows = self._db.query(
            f"SELECT * FROM cli_events {where} ORDER BY session_id, time_ns, kind, name", args
        )
        return [{**dict(r), "attributes": json.loads(r["attributes"])} for r in rows]

    @_translated
    def cli_spans(self, session_id: str | None = None) -> list[dict[str, Any]]:
        """The stored CLI spans (of one session, or all), in order of start."""
        where, args = ("WHERE session_id = ?", (session_id,)) if session_id else ("", ())
        rows = self._db.query(
            f"SELECT * FROM cli_spans {where} ORDER BY session_id, start_ns, span_id", args
        )
        found = []
        for r in rows:
            span = dict(r)
            span["attributes"] = json.loads(r["attributes"])
            span["reparented"] = bool(r["reparented"])
            found.append(span)
        return found
