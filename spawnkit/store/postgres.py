"""The session store on PostgreSQL: one database a team's hosts and notebooks share.

Chosen by URL (``SPAWNKIT_STORE=postgresql://…``, ``[store] url`` in
``$SPAWNKIT_HOME/config.toml``, or ``spawnkit --store``). Everything lives in its own
schema, ``spawnkit``, so the store can share a database with other applications. The
tables and columns are those of the SQLite store, with timestamps kept as the same ISO
text, so a record reads back identically from either engine.

Connections come from a psycopg 3 pool (the store's methods are synchronous and short;
async callers run them in a thread). Opening the store first connects once, directly, so
a server that is down or a wrong URL or password fails at once with one line naming the
URL without its password, rather than after a pool's wait.

Migrations are versioned (``spawnkit.schema_version`` holds one row per applied step) and
run under a transaction-scoped advisory lock: when several processes or hosts open the
store at once, one migrates and the others wait, then find nothing left to do. A schema
newer than this code is refused with both versions named. Credentials never come here:
they stay in the local, owner-only credentials file.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg
import psycopg.generators
import psycopg_pool
from psycopg.abc import PQGen
from psycopg.pq.abc import PGconn, PGresult
from psycopg.rows import dict_row

from ..errors import StoreError, StoreTooNew, StoreUnreachable
from ..home import spawnkit_home
from .advisory import AdvisoryPlaces, AdvisorySlots, SlotConnections
from .backend import SERVER_SCHEMA, Params, Row, redact_url, statements
from .sqlite import StoreHealth

logger = logging.getLogger(__name__)

SCHEMA = SERVER_SCHEMA
# pg_advisory_xact_lock key that serialises migrations ("spawnkit" as 8 ASCII bytes).
MIGRATION_LOCK = int.from_bytes(b"spawnkit", "big") & 0x7FFF_FFFF_FFFF_FFFF
CONNECT_TIMEOUT_S = 10
POOL_MAX = 8
# How long a caller waits for a pooled connection: a server away is reported (and its
# writes journaled, spawnkit.store.journal) after this.
POOL_TIMEOUT_S = 10.0
# A read that failed faster than this was on a pooled connection the server had already
# dropped (it restarted since): it is tried once more, on a fresh connection.
STALE_CONNECTION_S = 1.0
# A slot holder's connection: the server drops it (and frees the slot) this many ms after
# its host stops acknowledging, rather than minutes later (keepalives alone do not).
SLOT_TCP_USER_TIMEOUT_MS = 5000

# _MIGRATIONS[v] takes the schema from version v to v + 1; version 1 is the SQLite
# store's schema 9 (sessions, tool calls, MCP calls, state, episodes), without the
# transcripts `spawnkit history import` keeps (still SQLite only).
_MIGRATIONS: tuple[str, ...] = (
    """
    CREATE TABLE sessions (
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
        duration_ms BIGINT,
        input_tokens BIGINT,
        output_tokens BIGINT,
        cache_read_tokens BIGINT,
        cache_write_tokens BIGINT,
        cost_usd DOUBLE PRECISION,
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
        attempts TEXT
    );
    CREATE INDEX sessions_by_created ON sessions (created_at);
    CREATE INDEX sessions_by_butler ON sessions (butler, created_at);
    CREATE INDEX sessions_by_runtime_id ON sessions (runtime_session_id);
    CREATE INDEX sessions_open ON sessions (owner_host) WHERE completed_at IS NULL;

    CREATE TABLE tool_calls (
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
        duration_ms BIGINT,
        PRIMARY KEY (session_id, seq)
    );

    CREATE TABLE mcp_calls (
        id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        butler TEXT NOT NULL,
        session_key TEXT,
        session_id TEXT,
        tool TEXT NOT NULL,
        arguments TEXT,
        result TEXT,
        is_error INTEGER NOT NULL DEFAULT 0,
        called_at TEXT NOT NULL,
        duration_ms BIGINT
    );
    CREATE INDEX mcp_calls_by_session ON mcp_calls (session_id);

    CREATE TABLE state (
        butler TEXT NOT NULL,
        key TEXT NOT NULL,
        value TEXT NOT NULL,
        updated_at TEXT NOT NULL,
        PRIMARY KEY (butler, key)
    );

    CREATE TABLE episodes (
        id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        butler TEXT NOT NULL,
        session_id TEXT,
        prompt TEXT NOT NULL,
        output TEXT NOT NULL,
        created_at TEXT NOT NULL
    );
    CREATE INDEX episodes_by_butler ON episodes (butler, id)
    """,
    # 1 -> 2: the spans a run's CLI exported (SQLite schema 10).
    """
    CREATE TABLE cli_spans (
        session_id TEXT NOT NULL, trace_id TEXT NOT NULL, span_id TEXT NOT NULL,
        parent_span_id TEXT, name TEXT NOT NULL, service TEXT, start_ns BIGINT NOT NULL,
        end_ns BIGINT NOT NULL, status TEXT NOT NULL, attributes TEXT NOT NULL,
        reparented INTEGER NOT NULL DEFAULT 0
    );
    CREATE INDEX cli_spans_by_session ON cli_spans (session_id, start_ns)
    """,
    # 2 -> 3: the log events and metric points a run's CLI exported (SQLite schema 11).
    """
    CREATE TABLE cli_events (
        session_id TEXT NOT NULL, kind TEXT NOT NULL, name TEXT NOT NULL, service TEXT,
        time_ns BIGINT NOT NULL, trace_id TEXT, span_id TEXT, value DOUBLE PRECISION,
        attributes TEXT NOT NULL
    );
    CREATE INDEX cli_events_by_session ON cli_events (session_id, time_ns)
    """,
    # 3 -> 4: runs that belong to a host, with the lease it renews (SQLite schema 12).
    """
    ALTER TABLE sessions ADD COLUMN lease_until TEXT;
    CREATE INDEX sessions_lease ON sessions (lease_until) WHERE completed_at IS NULL
    """,
    # 4 -> 5: every change of a session, a tool call or butler state sends a NOTIFY on
    # CHANNEL (a wake-up, not a log: table, op, session, butler, host, status, a tool
    # call's seq and name), which the ChangeFeed of spawnkit.store.listen hands to live
    # views on any host. A lease renewal
    # alone changes nothing anyone shows and stays silent. Identical payloads within one
    # transaction reach listeners once (PostgreSQL folds them).
    """
    CREATE FUNCTION notify_change() RETURNS trigger LANGUAGE plpgsql AS $$
    DECLARE
        rec RECORD;
        payload jsonb;
        run_butler TEXT;
        run_host TEXT;
    BEGIN
        IF TG_OP = 'DELETE' THEN rec := OLD; ELSE rec := NEW; END IF;
        IF TG_TABLE_NAME = 'sessions' THEN
            payload := jsonb_build_object('table', 'sessions', 'op', TG_OP,
                'session', rec.id, 'butler', rec.butler, 'status', rec.status,
                'host', rec.owner_host);
        ELSIF TG_TABLE_NAME = 'tool_calls' THEN
            SELECT s.butler, s.owner_host INTO run_butler, run_host
                FROM spawnkit.sessions s WHERE s.id = rec.session_id;
            payload := jsonb_build_object('table', 'tool_calls', 'op', TG_OP,
                'session', rec.session_id, 'seq', rec.seq, 'status', rec.status,
                'name', left(rec.name, 200), 'butler', run_butler, 'host', run_host);
        ELSE
            payload := jsonb_build_object('table', TG_TABLE_NAME, 'op', TG_OP,
                'session', NULL, 'butler', rec.butler);
        END IF;
        PERFORM pg_notify('spawnkit', payload::text);
        RETURN NULL;
    END
    $$;
    CREATE TRIGGER sessions_notify AFTER INSERT OR DELETE ON sessions
        FOR EACH ROW EXECUTE FUNCTION notify_change();
    CREATE TRIGGER sessions_notify_update AFTER UPDATE ON sessions FOR EACH ROW
        WHEN ((to_jsonb(OLD) - 'lease_until') IS DISTINCT FROM (to_jsonb(NEW) - 'lease_until'))
        EXECUTE FUNCTION notify_change();
    CREATE TRIGGER tool_calls_notify AFTER INSERT OR UPDATE OR DELETE ON tool_calls
        FOR EACH ROW EXECUTE FUNCTION notify_change();
    CREATE TRIGGER state_notify AFTER INSERT OR UPDATE OR DELETE ON state
        FOR EACH ROW EXECUTE FUNCTION notify_change()
    """,
    # 5 -> 6: the same rule for a session's UPDATE (silent when only the lease moved), told
    # cheaply first: a row compare, and the lease compared alone; only when the lease moved
    # are both rows turned into jsonb to see whether anything else did (before, every
    # update converted both rows, the run's output and tool calls with them).
    """
    DROP TRIGGER sessions_notify_update ON sessions;
    CREATE TRIGGER sessions_notify_update AFTER UPDATE ON sessions FOR EACH ROW
        WHEN (OLD IS DISTINCT FROM NEW AND (OLD.lease_until IS NOT DISTINCT FROM NEW.lease_until
            OR (to_jsonb(OLD) - 'lease_until') IS DISTINCT FROM (to_jsonb(NEW) - 'lease_until')))
        EXECUTE FUNCTION notify_change()
    """,
    # 6 -> 7: what lets a client keep a columnar cache of the sessions and read only what
    # changed since (spawnkit.history.server_cache). Every inserted or updated session row
    # carries the id of the transaction that wrote it (``change_xid``, a 64-bit xid8 as
    # bigint: it never wraps); a deleted one leaves a tombstone in ``deleted_sessions``
    # with the deleting transaction's id. A reader that saw the database through a
    # snapshot whose oldest running transaction was X has seen every change of a
    # transaction before X, so next time it asks only for ``change_xid >= X``. A TRUNCATE
    # (no row triggers) bumps ``history_epoch.epoch``, and ``token`` tells a database
    # apart from any other that happens to have the same URL or oid: either differing from
    # what a cache holds makes it read everything again. Rows written before this step
    # have no ``change_xid``: a cache starts from a full read, which includes them.
    """
    CREATE TABLE history_epoch (
        id INTEGER PRIMARY KEY CHECK (id = 1), token TEXT NOT NULL,
        epoch BIGINT NOT NULL DEFAULT 0
    );
    INSERT INTO history_epoch (id, token)
        VALUES (1, md5(random()::text || clock_timestamp()::text));
    ALTER TABLE sessions ADD COLUMN change_xid BIGINT;
    CREATE INDEX sessions_by_change ON sessions (change_xid);
    CREATE TABLE deleted_sessions (id TEXT NOT NULL, change_xid BIGINT NOT NULL);
    CREATE INDEX deleted_sessions_by_change ON deleted_sessions (change_xid);
    CREATE FUNCTION mark_session_change() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        -- An update that changes nothing, or only the lease (renewed every few seconds,
        -- and in no history frame), keeps the row's marker: no reader fetches it again,
        -- and the NOTIFY trigger of step 6 stays silent for it.
        -- Told cheaply first (a row compare, the lease alone): both rows become jsonb
        -- only when the lease moved.
        IF TG_OP = 'UPDATE' AND (NEW IS NOT DISTINCT FROM OLD
                OR (NEW.lease_until IS DISTINCT FROM OLD.lease_until
                    AND (to_jsonb(NEW) - 'lease_until') = (to_jsonb(OLD) - 'lease_until'))) THEN
            RETURN NEW;
        END IF;
        NEW.change_xid := pg_current_xact_id()::text::bigint;
        RETURN NEW;
    END
    $$;
    CREATE TRIGGER sessions_change BEFORE INSERT OR UPDATE ON sessions
        FOR EACH ROW EXECUTE FUNCTION mark_session_change();
    CREATE FUNCTION note_deleted_sessions() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        INSERT INTO spawnkit.deleted_sessions (id, change_xid)
            SELECT gone.id, pg_current_xact_id()::text::bigint FROM gone;
        RETURN NULL;
    END
    $$;
    CREATE TRIGGER sessions_deleted AFTER DELETE ON sessions
        REFERENCING OLD TABLE AS gone FOR EACH STATEMENT EXECUTE FUNCTION note_deleted_sessions();
    CREATE FUNCTION bump_history_epoch() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        UPDATE spawnkit.history_epoch SET epoch = epoch + 1 WHERE id = 1;
        RETURN NULL;
    END
    $$;
    CREATE TRIGGER sessions_truncated AFTER TRUNCATE ON sessions
        FOR EACH STATEMENT EXECUTE FUNCTION bump_history_epoch()
    """,
    # 7 -> 8: the same notifications and markers for less of the server's time (a run's
    # record costs three writes, each its own transaction, and their triggers had come to
    # cost the server more than the writes themselves; PL/pgSQL prepares each expression
    # it evaluates once per transaction, so here fewer calls and fewer expressions are
    # what counts). A session's INSERT or UPDATE has one trigger instead of two: the
    # BEFORE trigger that moves the marker also sends the NOTIFY, exactly when it moves
    # the marker (an update that changes nothing or only the lease stays silent, as
    # before), so the row needs no AFTER trigger and the server keeps no AFTER event for
    # it. A NOTIFY is delivered only when its transaction commits, so one sent before the
    # row is written goes nowhere if the write then fails. A status that moved is a
    # change: the rows are compared whole only when it did not. A written tool call's
    # NOTIFY looks up its session's butler and host in the query that sends it; a
    # DELETE of either keeps step 5's trigger function.
    """
    DROP TRIGGER IF EXISTS sessions_notify_update ON sessions;
    DROP TRIGGER IF EXISTS sessions_notify ON sessions;
    DROP TRIGGER IF EXISTS sessions_change ON sessions;
    DROP FUNCTION IF EXISTS mark_session_change();
    CREATE OR REPLACE FUNCTION session_changed() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        IF TG_OP = 'UPDATE' AND NEW.status IS NOT DISTINCT FROM OLD.status THEN
            IF NEW IS NOT DISTINCT FROM OLD OR (NEW.lease_until IS DISTINCT FROM OLD.lease_until
                    AND (to_jsonb(NEW) - 'lease_until') = (to_jsonb(OLD) - 'lease_until')) THEN
                RETURN NEW;
            END IF;
        END IF;
        NEW.change_xid := pg_current_xact_id()::text::bigint;
        PERFORM pg_notify('spawnkit', jsonb_build_object('table', 'sessions', 'op', TG_OP,
            'session', NEW.id, 'butler', NEW.butler, 'status', NEW.status,
            'host', NEW.owner_host)::text);
        RETURN NEW;
    END
    $$;
    CREATE TRIGGER sessions_change BEFORE INSERT OR UPDATE ON sessions
        FOR EACH ROW EXECUTE FUNCTION session_changed();
    CREATE TRIGGER sessions_notify AFTER DELETE ON sessions
        FOR EACH ROW EXECUTE FUNCTION notify_change();
    DROP TRIGGER IF EXISTS tool_calls_notify ON tool_calls;
    DROP TRIGGER IF EXISTS tool_calls_notify_delete ON tool_calls;
    CREATE OR REPLACE FUNCTION tool_call_written() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        PERFORM pg_notify('spawnkit', jsonb_build_object('table', 'tool_calls', 'op', TG_OP,
            'session', NEW.session_id, 'seq', NEW.seq, 'status', NEW.status,
            'name', left(NEW.name, 200), 'butler', s.butler, 'host', s.owner_host)::text)
            FROM (SELECT NEW.session_id AS id) c LEFT JOIN spawnkit.sessions s ON s.id = c.id;
        RETURN NULL;
    END
    $$;
    CREATE TRIGGER tool_calls_notify AFTER INSERT OR UPDATE ON tool_calls
        FOR EACH ROW EXECUTE FUNCTION tool_call_written();
    CREATE TRIGGER tool_calls_notify_delete AFTER DELETE ON tool_calls
        FOR EACH ROW EXECUTE FUNCTION notify_change()
    """,
    # 8 -> 9: which home wrote a record, sealed with that home's key, so a row another
    # member writes naming this host is never swept here (spawnkit.containment.sweep.HomeSeal;
    # SQLite schema 13).
    """
    ALTER TABLE sessions ADD COLUMN owner_seal TEXT
    """,
    # 9 -> 10: connections a run's network sandbox refused (spawnkit.containment.egress; SQLite
    # schema 14).
    """
    ALTER TABLE sessions ADD COLUMN network_denied INTEGER
    """,
    # 10 -> 11: each answer to a [butler.permissions] ask question, as JSON
    # (spawnkit.run.approval; SQLite schema 15).
    """
    ALTER TABLE sessions ADD COLUMN permissions TEXT
    """,
    # 11 -> 12: the store's own columnar copy of its completed history, as on SQLite
    # (schema 16; spawnkit.store.server_segments): segments of LZ4 Arrow, sealed from the
    # queue of sessions completed since (``history_unsealed``, filled by a trigger in the
    # transaction that completes a run, so a reader sees a completed session either in a
    # segment or in the queue, never in neither). ``sealed_epoch`` says which segments are
    # current: a sealed session or one of its calls changed or deleted bumps it, unless the
    # session is still queued (looked at under a row lock, so a seal that takes it from the
    # queue at the same time either waits for the change or is made stale by it), as does
    # a TRUNCATE. Sessions completed before this step are queued: the first seals take them.
    """
    ALTER TABLE history_epoch ADD COLUMN sealed_epoch BIGINT NOT NULL DEFAULT 0;
    CREATE TABLE history_segments (
        id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY, epoch BIGINT NOT NULL,
        level INTEGER NOT NULL, n_sessions INTEGER NOT NULL,
        sessions BYTEA NOT NULL, calls BYTEA NOT NULL
    );
    CREATE TABLE history_unsealed (session_id TEXT PRIMARY KEY);
    INSERT INTO history_unsealed SELECT id FROM sessions WHERE completed_at IS NOT NULL;
    CREATE FUNCTION history_queue_session() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        INSERT INTO spawnkit.history_unsealed VALUES (NEW.id) ON CONFLICT DO NOTHING;
        RETURN NULL;
    END
    $$;
    CREATE FUNCTION history_sealed_changed(changed TEXT) RETURNS void LANGUAGE plpgsql AS $$
    BEGIN
        PERFORM 1 FROM spawnkit.history_unsealed WHERE session_id = changed FOR KEY SHARE;
        IF NOT FOUND THEN
            UPDATE spawnkit.history_epoch SET sealed_epoch = sealed_epoch + 1 WHERE id = 1;
        END IF;
    END
    $$;
    CREATE FUNCTION history_session_changed() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        PERFORM spawnkit.history_sealed_changed(OLD.id);
        IF TG_OP = 'DELETE' THEN
            DELETE FROM spawnkit.history_unsealed WHERE session_id = OLD.id;
        END IF;
        RETURN NULL;
    END
    $$;
    CREATE FUNCTION history_call_changed() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        IF EXISTS (SELECT 1 FROM spawnkit.sessions WHERE id = OLD.session_id
                   AND completed_at IS NOT NULL) THEN
            PERFORM spawnkit.history_sealed_changed(OLD.session_id);
        END IF;
        RETURN NULL;
    END
    $$;
    CREATE FUNCTION history_sealed_truncated() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        UPDATE spawnkit.history_epoch SET sealed_epoch = sealed_epoch + 1 WHERE id = 1;
        RETURN NULL;
    END
    $$;
    CREATE TRIGGER history_session_inserted AFTER INSERT ON sessions FOR EACH ROW
        WHEN (NEW.completed_at IS NOT NULL) EXECUTE FUNCTION history_queue_session();
    CREATE TRIGGER history_session_completed AFTER UPDATE ON sessions FOR EACH ROW
        WHEN (OLD.completed_at IS NULL AND NEW.completed_at IS NOT NULL)
        EXECUTE FUNCTION history_queue_session();
    CREATE TRIGGER history_session_updated AFTER UPDATE ON sessions FOR EACH ROW
        WHEN (OLD.completed_at IS NOT NULL AND OLD IS DISTINCT FROM NEW)
        EXECUTE FUNCTION history_session_changed();
    CREATE TRIGGER history_session_deleted AFTER DELETE ON sessions FOR EACH ROW
        WHEN (OLD.completed_at IS NOT NULL) EXECUTE FUNCTION history_session_changed();
    CREATE TRIGGER history_call_changed AFTER UPDATE OR DELETE ON tool_calls FOR EACH ROW
        EXECUTE FUNCTION history_call_changed();
    CREATE TRIGGER history_sessions_truncated AFTER TRUNCATE ON sessions
        FOR EACH STATEMENT EXECUTE FUNCTION history_sealed_truncated();
    CREATE TRIGGER history_calls_truncated AFTER TRUNCATE ON tool_calls
        FOR EACH STATEMENT EXECUTE FUNCTION history_sealed_truncated()
    """,
    # 12 -> 13: the queue keeps each session's creation time, indexed in the sessions'
    # order, so a seal takes the oldest queued sessions through that index. Before, it
    # walked the sessions in creation order past every one sealed already: each seal of a
    # long queue (a migrated store, or one queued again whole after a sealed session
    # changed) cost as much as all the seals before it.
    """
    ALTER TABLE history_unsealed ADD COLUMN created_at TEXT;
    UPDATE history_unsealed q SET created_at = s.created_at FROM sessions s
        WHERE s.id = q.session_id;
    DELETE FROM history_unsealed WHERE created_at IS NULL;
    ALTER TABLE history_unsealed ALTER COLUMN created_at SET NOT NULL;
    CREATE INDEX history_unsealed_in_order
        ON history_unsealed (created_at, session_id COLLATE "C");
    CREATE OR REPLACE FUNCTION history_queue_session() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        INSERT INTO spawnkit.history_unsealed VALUES (NEW.id, NEW.created_at)
            ON CONFLICT DO NOTHING;
        RETURN NULL;
    END
    $$
    """,
)
SCHEMA_VERSION = len(_MIGRATIONS)
# The NOTIFY channel of migration 5's triggers.
CHANNEL = "spawnkit"


@functools.lru_cache(maxsize=1024)
def _pg(sql: str) -> str:
    """The store's ``?`` placeholders as psycopg's ``%s`` (a literal ``%`` doubled)."""
    return sql.replace("%", "%%").replace("?", "%s")


@functools.lru_cache(maxsize=1024)
def _numbered(sql: str) -> bytes:
    """The store's ``?`` placeholders as the server's own ``$1``, ``$2``, …"""
    parts = sql.split("?")
    return "".join([parts[0], *(f"${n}{part}" for n, part in enumerate(parts[1:], 1))]).encode()


# A write's parameters the fast path (:meth:`_Connection.run_prepared`) sends itself, as
# text, with the type psycopg would give them: a string or NULL untyped (the server types
# it from where it stands), an int as bigint, a float as double precision. Anything else
# (bool, bytes, datetime, a list, an int past 64 bits) goes through psycopg's adaptation.
_PARAM_TYPES: dict[type, int] = {str: 0, type(None): 0, int: 20, float: 701}
_INT8 = range(-(2**63), 2**63)
_COMMAND_OK, _TUPLES_OK = psycopg.pq.ExecStatus.COMMAND_OK, psycopg.pq.ExecStatus.TUPLES_OK
_IDLE = psycopg.pq.TransactionStatus.IDLE
_BAD = psycopg.pq.ConnStatus.BAD
# psycopg's own generator for a command sent (C, in psycopg's binary build): flushes it
# and reads its results without blocking, yielding whenever the socket must be waited on.
_EXECUTE = psycopg.generators.execute


def _sent(pgconn: PGconn, send: Callable[[], None]) -> PQGen[list[PGresult]]:
    """Send a command, then wait for its results: psycopg's cursor sends inside the
    generator its wait runs, so a Ctrl-C that comes once the command is out is always met
    by the wait's cancel. Sent before the wait, a command the server was already running
    (blocked on a row) was left running by a Ctrl-C that came in between: the pool closed
    the connection, and the server made the write once the row was free."""
    send()
    results: list[PGresult] = yield from _EXECUTE(pgconn)
    return results


# Statements the server would not prepare with untyped parameters (``? IS NULL``): these
# keep going through psycopg, on every connection.
_UNPREPARABLE: set[tuple[str, tuple[int, ...]]] = set()


class _Connection(psycopg.Connection[dict[str, Any]]):
    """A pooled connection with a fast path for the store's writes.

    A run's record costs a few one-statement writes, and on a fast server most of each
    write's time was the client's: psycopg's cursor, adaptation of two dozen parameters
    and its result machinery cost about 0.04 ms a statement. :meth:`run_prepared` sends a
    write as a statement this connection prepared once (named, so the server parses and
    plans it once), with its parameters encoded here, through libpq's asynchronous calls,
    and waits for its result the way psycopg's cursor does (:meth:`_result`): on the
    socket, in short polls, so Ctrl-C interrupts a write whose server stopped answering
    (psycopg then cancels the query on the server before the KeyboardInterrupt goes on).
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._statements: dict[tuple[str, tuple[int, ...]], bytes] = {}
        # Names are never reused: a prepare interrupted before its answer came may
        # have been made on the server all the same.
        self._named = 0

    def run_prepared(self, sql: str, params: Params, again: bool = True) -> int | None:
        """How many rows ``sql`` changed, or None when it is not for the fast path (its
        parameters, or the server would not prepare it): psycopg runs it then."""
        pgconn = self.pgconn
        if pgconn.parameter_status(b"client_encoding") != b"UTF8":
            return None  # text is encoded here as UTF-8 only
        try:
            types = tuple([_PARAM_TYPES[type(value)] for value in params])
        except KeyError:
            return None
        values: list[bytes | None] = []
        for value in params:
            if value is None:
                values.append(None)
            elif type(value) is str:
                if "\x00" in value:  # libpq would cut the text there; psycopg refuses it
                    return None
                values.append(value.encode())
            elif type(value) is int and value not in _INT8:
                return None
            else:
                values.append(repr(value).encode())
        key = (sql, types)
        with self.lock:  # as psycopg's own calls on a connection
            name = self._statements.get(key)
            if name is None:
                # Prepared only outside a transaction: a statement the server refuses to
                # prepare must not abort one (it then goes through psycopg, as always).
                if key in _UNPREPARABLE or pgconn.transaction_status != _IDLE:
                    return None
                self._named += 1
                name = f"spawnkit_{self._named}".encode()
                prepared = self._result(
                    functools.partial(pgconn.send_prepare, name, _numbered(sql), types)
                )
                if prepared.status != _COMMAND_OK:
                    self._raise_if_broken(prepared)
                    _UNPREPARABLE.add(key)
                    return None
                self._statements[key] = name
            # A None value is a NULL (libpq's own convention; psycopg's stub omits it).
            result = self._result(functools.partial(pgconn.send_query_prepared, name, values))
        if result.status not in (_COMMAND_OK, _TUPLES_OK):
            self._raise_if_broken(result)
            if result.error_field(psycopg.pq.DiagnosticField.SQLSTATE) == b"26000":
                # Deallocated behind our back (DISCARD ALL, a pooler): prepared again, and
                # outside a transaction, where nothing was written, the write made again.
                self._statements.clear()
                if again and pgconn.transaction_status == _IDLE:
                    return self.run_prepared(sql, params, again=False)
            raise psycopg.errors.error_from_result(result, encoding=self.info.encoding)
        return result.command_tuples or 0

    def _result(self, send: Callable[[], None]) -> PGresult:
        """The result of the one command ``send`` sends, sent and waited for as psycopg's
        cursor does (:func:`_sent`): :meth:`psycopg.Connection.wait` polls the socket with a
        timeout, so a signal's handler runs; on KeyboardInterrupt it cancels the query on
        the server, takes its answer (or closes a connection that gives none) and raises
        again."""
        results: list[PGresult] = self.wait(_sent(self.pgconn, send))
        if not results:  # never from a command sent; psycopg's cursor says the same
            raise psycopg.InternalError("got no result from the query")
        for result in results:
            if result.status not in (_COMMAND_OK, _TUPLES_OK):
                return result
        return results[-1]

    def _raise_if_broken(self, result: PGresult) -> None:
        if self.pgconn.status == _BAD:
            message = result.get_error_message(self.info.encoding)
            raise psycopg.OperationalError(f"the connection is broken: {message}")


class _Transaction:
    writable_ctes = True

    def __init__(self, conn: _Connection) -> None:
        self._conn = conn

    def execute(self, sql: str, params: Params = ()) -> int:
        changed = self._conn.run_prepared(sql, params)
        if changed is None:
            changed = self._conn.execute(_pg(sql), params).rowcount
        return changed

    def executemany(self, sql: str, rows: Sequence[Params]) -> None:
        with self._conn.cursor() as cur:
            cur.executemany(_pg(sql), rows)

    def query(self, sql: str, params: Params = ()) -> Sequence[Row]:
        return self._conn.execute(_pg(sql), params).fetchall()


def check_server_store(url: str) -> StoreHealth:
    """What ``spawnkit store check`` says of a PostgreSQL store: its schema version and
    sessions, read in a read-only session (nothing is migrated or written). A database
    spawnkit never used is healthy and empty; the server's own pages are its business."""
    location = redact_url(url)
    try:
        with psycopg.connect(
            url, autocommit=True, connect_timeout=CONNECT_TIMEOUT_S,
            application_name="spawnkit-check", options="-c default_transaction_read_only=on",
        ) as conn:  # fmt: skip
            row = conn.execute(f"SELECT to_regclass('{SCHEMA}.sessions') IS NOT NULL").fetchone()
            if not row or not row[0]:
                return StoreHealth(location, (), None, 0)
            version_row = conn.execute(
                f"SELECT COALESCE(max(version), 0) FROM {SCHEMA}.schema_version"
            ).fetchone()
            count_row = conn.execute(f"SELECT count(*) FROM {SCHEMA}.sessions").fetchone()
    except psycopg.Error as exc:
        detail = " ".join(str(exc).split()).replace(url, location) or type(exc).__name__
        raise StoreUnreachable(location, detail) from exc
    version = int(version_row[0]) if version_row else 0
    problems: tuple[str, ...] = ()
    if version > SCHEMA_VERSION:
        problems = (
            f"written by a newer spawnkit (schema {version}, this one reads {SCHEMA_VERSION})",
        )
    return StoreHealth(location, problems, version, int(count_row[0]) if count_row else 0)


class PostgresBackend:
    """A :class:`~spawnkit.store.backend.Backend` on a PostgreSQL server, schema ``spawnkit``."""

    errors: tuple[type[Exception], ...] = (psycopg.Error, psycopg_pool.PoolTimeout)

    def __init__(self, url: str) -> None:
        self.url = url
        self.location = redact_url(url)
        self.path: Path | None = None
        self.local_dir = spawnkit_home()
        self._admissions: dict[str, AdvisoryPlaces] = {}
        self._admissions_lock = threading.Lock()
        self._slots = SlotConnections(lambda: self._dedicated("spawnkit-slot"))
        self._kwargs: dict[str, Any] = {
            "row_factory": dict_row,
            "options": f"-c search_path={SCHEMA}",
            "connect_timeout": CONNECT_TIMEOUT_S,
            "application_name": "spawnkit",
        }
        try:
            with psycopg.connect(url, autocommit=False, **self._kwargs) as conn:
                self._migrate(conn)
        except psycopg.Error as exc:
            raise self.error(exc) from exc
        # The pool's connections are in autocommit: a read or a one-statement write is one
        # round trip (no implicit BEGIN, no COMMIT when the connection goes back), and a
        # transaction of several statements says BEGIN and COMMIT itself.
        self._pool: psycopg_pool.ConnectionPool[_Connection] = (
            psycopg_pool.ConnectionPool(
                url, min_size=1, max_size=POOL_MAX, timeout=POOL_TIMEOUT_S,
                kwargs={**self._kwargs, "autocommit": True}, open=True, name="spawnkit-store",
                connection_class=_Connection,
            )
        )  # fmt: skip
        # The pool hands out the connection idle longest, so once it holds two, one thread's
        # writes alternate between two server processes, which measured about 0.05 ms more
        # server CPU a run's record than one process taking them all. A first write made
        # before the pool's first connection is up makes the pool grow to two; waiting for
        # that connection here keeps a caller that uses the store from one thread at a time
        # (the CLI, a notebook, the benchmark) on one. The first write would wait for it
        # anyway.
        try:
            self._pool.wait(timeout=POOL_TIMEOUT_S)
        except psycopg_pool.PoolTimeout as exc:
            self._pool.close()
            raise self.error(exc) from exc

    def _migrate(self, conn: psycopg.Connection[dict[str, Any]]) -> None:
        """Bring the schema to :data:`SCHEMA_VERSION`, once, whoever else opens it now."""
        with conn.transaction():
            conn.execute("SELECT pg_advisory_xact_lock(%s)", (MIGRATION_LOCK,))
            conn.execute(f"CREATE SCHEMA IF NOT EXISTS {SCHEMA}")
            conn.execute(
                f"""CREATE TABLE IF NOT EXISTS {SCHEMA}.schema_version (
                    version INTEGER PRIMARY KEY, applied_at TIMESTAMPTZ NOT NULL DEFAULT now())"""
            )
            row = conn.execute(
                f"SELECT COALESCE(max(version), 0) AS v FROM {SCHEMA}.schema_version"
            ).fetchone()
            version = int(row["v"]) if row else 0
            if version > SCHEMA_VERSION:
                raise StoreTooNew(self.location, version, SCHEMA_VERSION)
            for step in range(version, SCHEMA_VERSION):
                for statement in statements(_MIGRATIONS[step]):
                    conn.execute(statement)
                conn.execute(
                    f"INSERT INTO {SCHEMA}.schema_version (version) VALUES (%s)", (step + 1,)
                )
                logger.info("%s: migrated to schema %d", self.location, step + 1)

    def query(self, sql: str, params: Params = ()) -> Sequence[Row]:
        started, retried = time.monotonic(), False
        while True:
            try:
                with self._connection() as conn:
                    return conn.execute(_pg(sql), params).fetchall()
            except psycopg.OperationalError:
                if retried or time.monotonic() - started > STALE_CONNECTION_S:
                    raise
                retried = True

    @contextmanager
    def _connection(self) -> Iterator[_Connection]:
        """A connection from the pool, given back after (one that broke is replaced). Not
        the pool's ``connection()``: the commit it makes on the way back has nothing to do
        on a connection in autocommit, and costs the client time on every read and write."""
        conn = self._pool.getconn()
        try:
            yield conn
        finally:
            self._pool.putconn(conn)

    @contextmanager
    def transaction(self, single: bool = False) -> Iterator[_Transaction]:
        conn = self._pool.getconn()  # as _connection(), without a second context manager
        try:
            if single:  # the one statement commits on its own: no BEGIN and COMMIT
                yield _Transaction(conn)
                return
            with conn.transaction():
                yield _Transaction(conn)
        finally:
            self._pool.putconn(conn)

    def error(self, exc: Exception) -> StoreError:
        """Unreachable (down, refused, wrong password) or another failure, in one line."""
        detail = " ".join(str(exc).split()) or type(exc).__name__
        detail = detail.replace(self.url, self.location)
        if isinstance(exc, psycopg.OperationalError | psycopg_pool.PoolTimeout):
            return StoreUnreachable(self.location, detail)
        return StoreError(f"the session store {self.location}: {detail}")

    def slot_claim(self, name: str, capacity: int) -> AdvisorySlots:
        return AdvisorySlots(self._slots, self.error, self._slots.take(), name, capacity)

    def _dedicated(self, name: str) -> psycopg.Connection[Any]:
        """A connection of its own whose advisory locks the server frees when the process
        dies (at once) or its host stops answering (``tcp_user_timeout``)."""
        try:
            return psycopg.connect(
                self.url, autocommit=True, connect_timeout=CONNECT_TIMEOUT_S,
                application_name=name,
                options=f"-c tcp_user_timeout={SLOT_TCP_USER_TIMEOUT_MS} "
                "-c tcp_keepalives_idle=5 -c tcp_keepalives_interval=2 -c tcp_keepalives_count=2",
            )  # fmt: skip
        except psycopg.Error as exc:
            raise self.error(exc) from exc

    def admission(self, name: str) -> AdvisoryPlaces:
        with self._admissions_lock:
            found = self._admissions.get(name)
            if found is None:
                found = self._admissions[name] = AdvisoryPlaces(
                    lambda: self._dedicated("spawnkit-admission"), self.error, name
                )
            return found

    def close(self) -> None:
        with self._admissions_lock:
            for places in self._admissions.values():
                places.close()
            self._admissions.clear()
        self._slots.close()
        pool = getattr(self, "_pool", None)
        if pool is not None:
            pool.close()
