"""The session store: every accepted run, its tool calls, and butler state.

:class:`SessionStore` writes each query once against a small
:class:`~spawnkit.store.backend.Backend`: SQLite here (the default,
:class:`~spawnkit.store.sqlite.SqliteBackend`) or PostgreSQL, a store a team shares
(:mod:`spawnkit.store.postgres`, chosen by URL). Both keep the same tables and semantics.

A session row is created when a trigger is accepted and completed when the run ends,
whatever happens; each row also records which process owns it (and, once it runs, its
workspace), so what a process that died left behind is swept up the next time any process
opens the store: its processes killed, its workspace removed, its record marked
``crashed`` (see :mod:`spawnkit.containment.sweep` and :mod:`spawnkit.store.ownership`).

The same store holds the tables the butler's MCP server and the core need:
``state`` (the ``state_*`` tools), ``mcp_calls`` (tool calls as the server saw
them) and ``episodes`` (see :mod:`spawnkit.run.memory`), and the spans, log events and metric
points a run's CLI exported (:mod:`spawnkit.telemetry.otlp`). It holds no credentials.
Methods are synchronous and short, and async callers run them with ``asyncio.to_thread``.

The class is the one public surface over its collaborators: the backend that runs the
SQL, the :class:`~spawnkit.store.writer.StoreWriter` that makes a run's writes now or
journals them while a server is away, and the :class:`~spawnkit.store.ownership.HostRecords`
that say which host and process own a record.
"""

from __future__ import annotations

import functools
import json
import logging
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Concatenate, ParamSpec, TypeVar

from ..errors import StoreUnreachable
from ..home import default_store_path, lease_seconds, store_setting
from ..result import SpawnerResult, ToolCall
from .backend import Admission, Backend, SlotClaim, is_postgres_url
from .journal import StoreJournal
from .ownership import HostRecords, RecordOwner
from .records import SessionRecord, to_iso, utcnow
from .schema import SEAL_SESSIONS, SERVER_SEAL_DUE
from .sqlite import SqliteBackend
from .writer import StoreWriter
from .writes import (
    LIVE_CALL,
    SINGLE_STATEMENT,
    SINGLE_WITH_CTES,
    cli_event_rows,
    cli_span_rows,
    completion,
    mcp_call_row,
    tool_call_row,
)

if TYPE_CHECKING:  # the sweep is imported where a store is opened (ownership._sweep_module)
    from ..containment.sweep import OpenRun

logger = logging.getLogger(__name__)

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


# Rows since the last seal of the columnar copy (spawnkit.store.segments): two index look-ups.
_SEAL_DUE = """SELECT (SELECT max(rowid) FROM sessions) AS top,
    (SELECT coalesce(max(hi), 0) FROM history_segments) AS hi"""


def open_backend(target: str | Path) -> Backend:
    """The backend of the store at ``target``: a PostgreSQL URL, or a SQLite file's path."""
    if is_postgres_url(target):
        from .postgres import PostgresBackend  # psycopg loads only when it is used

        return PostgresBackend(str(target))
    return SqliteBackend(Path(target))


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
        self._db = open_backend(target)
        # The SQLite file (None on a server); its name, or the URL without password.
        self.path = self._db.path
        self.location = self._db.location
        # What opens this store from another process (a Dask worker): the file's absolute
        # path, or the URL with its password.
        self.target = str(self.path.resolve()) if self.path is not None else str(target)
        self._owner = RecordOwner(lease_s if lease_s is not None else lease_seconds())
        self._hosts = HostRecords(self._db, self._owner)
        # A server's writes that could not be made wait in this machine's journal; SQLite
        # is on this machine: its writes succeed or fail at once, with nothing to replay.
        # The writes that are one statement here (the server, PostgreSQL, has writable CTEs).
        on_sqlite = self.path is not None
        self._writes = StoreWriter(
            self._db,
            None if on_sqlite else StoreJournal(self.local_dir, self.location),
            SINGLE_STATEMENT if on_sqlite else SINGLE_WITH_CTES,
        )
        # Open runs whose tool calls were written live here (record_tool_call).
        self._live_calls: set[str] = set()
        self._writes.catch_up()  # before the sweep: a run whose completion waits is not crashed
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
        return self.path if self.path is not None else str(self.url)

    @property
    def host(self) -> str:
        """The name this host's records carry (``$SPAWNKIT_HOST``, else the node name)."""
        return self._owner.host

    @property
    def owner(self) -> tuple[str, int]:
        """(host, pid) the records this process creates carry as their owner."""
        return self._owner.key

    @property
    def lease_s(self) -> float:
        """How long a record stays this host's without a renewal (spawnkit.home.lease_seconds)."""
        return self._owner.lease_s

    @lease_s.setter
    def lease_s(self, seconds: float) -> None:
        self._owner.lease_s = seconds

    @property
    def local_dir(self) -> Path:
        """This machine's folder for what stays local: the credentials file."""
        return self._db.local_dir

    def close(self) -> None:
        self._writes.close()
        self._db.close()

    @property
    def writes_at_once(self) -> bool:
        """Whether :meth:`without_waiting` can be used: a SQLite file (a server's write is
        a round trip, never made on an event loop)."""
        return isinstance(self._db, SqliteBackend)

    @contextmanager
    def without_waiting(self) -> Iterator[None]:
        """Writes in the block are made at once or not at all: one that would wait for the
        store's write lock raises :class:`~spawnkit.store.sqlite.WriteWouldWait` before it
        changed anything (SQLite only, see :attr:`writes_at_once`)."""
        if not isinstance(self._db, SqliteBackend):
            raise TypeError("only a SQLite store writes without waiting")
        with self._db.without_waiting():
            yield

    def __enter__(self) -> SessionStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the journal of writes a server away could not take (spawnkit.store.journal) ----

    @property
    def journal(self) -> StoreJournal | None:
        """This machine's journal of this store's writes waiting for the server (None on
        SQLite)."""
        return self._writes.journal

    def pending_writes(self) -> int:
        """How many of this store's writes wait in the journal for the server."""
        return self._writes.pending()

    def replay_journal(self) -> int:
        """Write what the journal keeps for this store, oldest first; how many were written.

        Stops at the first write the server cannot take yet (still away): the rest keep
        their order for the next try. Does nothing while another thread or process replays.
        """
        return self._writes.replay()

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
        owner = self._owner
        with self._db.transaction(single=True) as tx:
            tx.execute(
                """INSERT INTO sessions (id, butler, runtime, model, prompt, context,
                       trigger_source, status, runtime_session_id, parent_session_id,
                       created_at, owner_host, owner_pid, owner_start, log_dir, role,
                       kind, sources, lease_until, owner_seal)
                   VALUES (?, ?, ?, ?, ?, ?, ?, 'queued', ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)""",
                (
                    session_id, butler, runtime, model, prompt, context, trigger_source,
                    runtime_session_id, parent_session_id, to_iso(created_at or utcnow()),
                    owner.host, owner.pid, owner.pid_start, str(log_dir) if log_dir else None,
                    role, kind, json.dumps(list(sources)) if sources else None,
                    owner.lease_end(), owner.seal(session_id, None),
                ),
            )  # fmt: skip

    def mark_started(
        self,
        session_id: str,
        *,
        started_at: datetime,
        trace_id: str | None = None,
        workspace: Path | None = None,
        setup: tuple[str, dict[str, Any]] | None = None,
    ) -> None:
        """The run is running; ``workspace`` is kept so a sweep can remove it if we die.

        ``setup`` (sandbox, given) records what :meth:`record_setup` does, in the same
        transaction: a run that starts its CLI right after makes one commit, not two.
        """
        params = [
            to_iso(started_at), trace_id, str(workspace) if workspace else None,
            self._owner.seal(session_id, workspace), session_id,
        ]  # fmt: skip
        if setup is None:
            self._writes.write("started", session_id, params)
            return
        sandbox, given = setup
        both = [params, [sandbox, json.dumps(given, ensure_ascii=False), session_id]]
        self._writes.write("started_setup", session_id, both)

    def record_setup(self, session_id: str, *, sandbox: str, given: dict[str, Any]) -> None:
        """Record how a run was contained and what its CLI was given (config, servers, tools)."""
        params = [sandbox, json.dumps(given, ensure_ascii=False), session_id]
        self._writes.write("setup", session_id, params)

    def complete_session(
        self, session_id: str, result: SpawnerResult, completed_at: datetime | None = None
    ) -> None:
        """Close the record with the run's result; a record is completed only once.

        Only a ``crashed`` mark of this host's record gives way: another host (its lease ran
        out while the server was away) or a sweep guessed the run died, and here is how it
        really ended (a completion replayed from the journal, :mod:`spawnkit.store.journal`).
        """
        # Rows to replace: calls the run wrote live through this store (record_tool_call).
        live = session_id in self._live_calls
        self._live_calls.discard(session_id)
        payload = completion(session_id, result, completed_at or utcnow(), self.host, live)
        self._writes.write("complete", session_id, payload)
        if self._seal_due():
            self.seal_history()

    def _seal_due(self) -> bool:
        """Whether enough sessions came since the store last sealed its columnar copy
        (:mod:`spawnkit.store.segments`, imported only then: it brings pyarrow)."""
        try:
            if self.path is None:  # a server: its queue of completed sessions
                due = self._db.query(SERVER_SEAL_DUE, (SEAL_SESSIONS, SEAL_SESSIONS))
                return bool(due[0]["due"])
            row = self._db.query(_SEAL_DUE)[0]
        except self._db.errors as exc:
            logger.warning("could not check the store's columnar copy: %s", exc)
            return False
        return int(row["top"] or 0) - int(row["hi"]) >= SEAL_SESSIONS

    def seal_history(self, *, force: bool = False, limit: int | None = None) -> bool:
        """Add the sessions completed since the last seal to the store's columnar copy of
        its history (what ``spawnkit.history`` reads); ``force``: however few. A failure
        is logged: the copy is a cache, the rows stay the truth. Whether a segment was added."""
        try:
            if self.path is None:
                from . import server_segments

                return server_segments.seal(self._db, force=force, limit=limit)
            from . import segments

            return segments.seal(self._db, force=force, limit=limit)
        except self._db.errors as exc:
            logger.warning("could not seal the store's columnar copy: %s", exc)
            return False

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
            written = tx.execute(LIVE_CALL, [*tool_call_row(session_id, seq, call), session_id])
        if not written:  # the record is closed: no result's write comes for it here
            self._live_calls.discard(session_id)
        return bool(written)

    @_translated
    def spent_since(self, butler: str, since: datetime) -> float:
        """Dollars the butler's runs completed since ``since`` cost (their recorded cost)."""
        rows = self._db.query(
            "SELECT COALESCE(SUM(cost_usd), 0) AS spent FROM sessions WHERE butler = ? "
            "AND completed_at >= ? AND cost_usd IS NOT NULL",
            (butler, to_iso(since)),
        )
        return float(rows[0]["spent"])

    @_translated
    def get_session(self, session_id: str) -> SessionRecord | None:
        rows = self._db.query("SELECT * FROM sessions WHERE id = ?", (session_id,))
        return SessionRecord.from_row(rows[0]) if rows else None

    @_translated
    def continuations(self, session_id: str) -> list[SessionRecord]:
        """The sessions that continue ``session_id`` (its resumes), oldest first.

        Rare (an ACP client loading a conversation), so it scans rather than keeps an index.
        """
        rows = self._db.query(
            "SELECT * FROM sessions WHERE parent_session_id = ? ORDER BY created_at", (session_id,)
        )
        return [SessionRecord.from_row(r) for r in rows]

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
        at once, lease or not (:mod:`spawnkit.containment.sweep`).
        """
        expired = len(self.expire_leases())
        runs = self.open_runs_here()
        if not runs:  # nothing of this host's open: no sweep to load
            return expired
        from ..containment.sweep import sweep

        return expired + len(sweep(self, runs))

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

    # -- leases and owners: runs that belong to a host (spawnkit.store.ownership) -------

    @_translated
    def renew_leases(self, session_ids: Sequence[str]) -> int:
        """Extend the lease of this host's open records ``session_ids``; how many were open."""
        return self._hosts.renew_leases(session_ids)

    @_translated
    def expire_leases(self) -> list[str]:
        """Mark ``crashed`` the open records of other hosts whose lease ran out; their ids.

        Their host died or lost the network: it stopped renewing them. When several hosts
        see the same record at once, one of them closes it. This host's own records are
        left to the sweep, which knows at once whether their owner process lives. Records
        without a lease (written by an older spawnkit) never expire.
        """
        return self._hosts.expire_leases()

    @_translated
    def open_runs_here(self) -> list[OpenRun]:
        """This host's records that have not completed, with their owner, workspace and
        seal (which home on this host wrote them: :class:`~spawnkit.containment.sweep.HomeSeal`)."""
        return self._hosts.open_runs_here()

    # -- a run dispatched to a cluster: queued by its client, adopted by a worker -------

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
        for this run this process's, with the run's details known here (spawnkit.run.dispatch).
        False when it is not that client's unstarted open record any more: closed, or
        adopted already (by a worker that died: the run is not taken twice)."""
        return self._hosts.adopt_session(
            session_id, queued_by=queued_by, model=model, prompt=prompt, context=context,
            runtime_session_id=runtime_session_id, log_dir=log_dir,
        )  # fmt: skip

    @_translated
    def close_queued(
        self, session_id: str, *, status: str, error: str | None, error_kind: str | None
    ) -> bool:
        """Close this process's record of a dispatched run no worker adopted (cancelled
        before it started, say); False when a worker adopted it or it is closed."""
        return self._hosts.close_queued(session_id, status, error, error_kind)

    @_translated
    def withdraw_queued(self, session_id: str) -> bool:
        """Delete this process's record of a dispatched run that a worker refused before
        accepting it (raised to the caller, as a local refusal is, with no record)."""
        return self._hosts.withdraw_queued(session_id)

    @_translated
    def mark_crashed(self, session_id: str, reason: str) -> bool:
        """Close an open record as ``crashed`` because of ``reason``; False if already closed."""
        return self._hosts.mark_crashed(session_id, reason)

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
                if self._writes.journal is None:
                    raise
                # Journaled below: the replay finds the session by its key then.
        row = mcp_call_row(
            butler, session_key, session_id, tool, arguments, result, is_error, called_at,
            duration_ms,
        )  # fmt: skip
        self._writes.write("mcp_call", session_id, row)
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
                (butler, key, json.dumps(value, ensure_ascii=False), to_iso(utcnow())),
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
        row = [butler, session_id, prompt, output, to_iso(utcnow())]
        self._writes.write("episode", session_id, row)

    @_translated
    def recent_episodes(self, butler: str, limit: int) -> list[dict[str, Any]]:
        """The latest ``limit`` episodes of ``butler``, newest first."""
        rows = self._db.query(
            "SELECT session_id, prompt, output, created_at FROM episodes "
            "WHERE butler = ? ORDER BY id DESC LIMIT ?",
            (butler, limit),
        )
        return [dict(r) for r in rows]

    # -- the CLIs' own spans (spawnkit.telemetry.otlp) --------------------------------

    def record_cli_spans(self, spans: Sequence[dict[str, Any]]) -> int:
        """Store spans a run's CLI exported (``spawnkit.telemetry.otlp.CliSpan`` fields);
        returns how many."""
        if not spans:
            return 0
        self._writes.write("cli_spans", str(spans[0]["session_id"]), cli_span_rows(spans))
        return len(spans)

    def record_cli_events(self, events: Sequence[dict[str, Any]]) -> int:
        """Store log events and metric points a run's CLI exported
        (``spawnkit.telemetry.otlp.CliEvent`` fields); returns how many."""
        if not events:
            return 0
        self._writes.write("cli_events", str(events[0]["session_id"]), cli_event_rows(events))
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
