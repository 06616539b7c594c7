"""Writes a store on a server could not take, kept on this machine until it can.

When the PostgreSQL server goes away mid-run, the run goes on: what it would have written
(its start, setup, CLI spans and events, and its completion with its tool calls) is
appended here instead, in order, and replayed in the same order once the server answers
again: by the store's background retry, before its next write, and whenever a store is
opened (every ``spawnkit`` command). Each write is one of the store's named operations
with its parameters as JSON, and every operation is idempotent, so replaying an entry
the server had in fact committed (the answer was lost with the connection) changes
nothing.

The journal is a SQLite file, ``$SPAWNKIT_HOME/store-journal.db``, owner-only (it holds
prompts and outputs), with ``synchronous = FULL``: an entry is on disk before the run is
told its write is safe. One file serves every store this machine writes to; entries are
keyed by the store's URL without its password. A lock file lets one process replay at a
time; an entry the server refuses for another reason than being away (a constraint, a
type) is kept, marked failed and skipped, so it cannot block the entries behind it.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import sqlite3
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

JOURNAL_NAME = "store-journal.db"
BUSY_TIMEOUT_S = 15.0

_SCHEMA = """CREATE TABLE IF NOT EXISTS writes (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    store TEXT NOT NULL,
    op TEXT NOT NULL,
    session_id TEXT,
    payload TEXT NOT NULL,
    journaled_at TEXT NOT NULL,
    tries INTEGER NOT NULL DEFAULT 0,
    last_error TEXT,
    failed INTEGER NOT NULL DEFAULT 0
)"""


@dataclass(frozen=True)
class JournalEntry:
    """One write the store could not take: operation ``op`` with ``payload``."""

    id: int
    op: str
    session_id: str | None
    payload: Any


class StoreJournal:
    """The journal of one store (``store``: its URL without password) in ``directory``.

    Safe to share between threads; several processes may append and replay at once.
    """

    def __init__(self, directory: Path, store: str) -> None:
        self.path = directory / JOURNAL_NAME
        self.store = store
        self._lock_path = directory / (JOURNAL_NAME + ".lock")
        self._replay_lock = threading.Lock()
        # Whether this process may have entries waiting: checked on every write, so it is
        # a flag, not a query. Set by an append (and at open, if the file holds entries).
        self.maybe_pending = self.path.exists() and self.pending() > 0

    @contextlib.contextmanager
    def _connect(self) -> Iterator[sqlite3.Connection]:
        created = not self.path.exists()
        conn = sqlite3.connect(self.path, timeout=BUSY_TIMEOUT_S, isolation_level=None)
        try:
            if created:
                self.path.chmod(0o600)
            conn.execute("PRAGMA journal_mode = WAL")
            conn.execute("PRAGMA synchronous = FULL")  # fsync at every commit
            conn.execute(_SCHEMA)
            yield conn
        finally:
            conn.close()

    def append(self, op: str, session_id: str | None, payload: Any, error: str) -> None:
        """Keep one write, durably, behind those already kept."""
        with self._connect() as conn:
            conn.execute(
                "INSERT INTO writes (store, op, session_id, payload, journaled_at, last_error) "
                "VALUES (?, ?, ?, ?, ?, ?)",
                (self.store, op, session_id, json.dumps(payload, ensure_ascii=False),
                 datetime.now(UTC).isoformat(), error),
            )  # fmt: skip
        self.maybe_pending = True

    def pending(self) -> int:
        """How many writes wait for this store (failed ones not counted)."""
        if not self.path.exists():
            return 0
        with self._connect() as conn:
            row = conn.execute(
                "SELECT count(*) FROM writes WHERE store = ? AND failed = 0", (self.store,)
            ).fetchone()
        return int(row[0])

    def failed(self) -> list[tuple[int, str, str | None, str]]:
        """Entries the server refused: (id, op, session id, why)."""
        if not self.path.exists():
            return []
        with self._connect() as conn:
            rows = conn.execute(
                "SELECT id, op, session_id, last_error FROM writes WHERE store = ? AND failed = 1 "
                "ORDER BY id",
                (self.store,),
            ).fetchall()
        return [(int(r[0]), str(r[1]), r[2], str(r[3])) for r in rows]

    def first(self) -> JournalEntry | None:
        """The oldest write still waiting, if any."""
        with self._connect() as conn:
            row = conn.execute(
                "SELECT id, op, session_id, payload FROM writes WHERE store = ? AND failed = 0 "
                "ORDER BY id LIMIT 1",
                (self.store,),
            ).fetchone()
        if row is None:
            return None
        return JournalEntry(int(row[0]), str(row[1]), row[2], json.loads(row[3]))

    def done(self, entry: JournalEntry) -> None:
        with self._connect() as conn:
            conn.execute("DELETE FROM writes WHERE id = ?", (entry.id,))

    def retry_later(self, entry: JournalEntry, error: str) -> None:
        with self._connect() as conn:
            conn.execute(
                "UPDATE writes SET tries = tries + 1, last_error = ? WHERE id = ?",
                (error, entry.id),
            )

    def give_up(self, entry: JournalEntry, error: str) -> None:
        """The server refused the entry for good: keep it for a person, skip it from now."""
        with self._connect() as conn:
            conn.execute(
                "UPDATE writes SET tries = tries + 1, failed = 1, last_error = ? WHERE id = ?",
                (error, entry.id),
            )

    @contextlib.contextmanager
    def replaying(self) -> Iterator[bool]:
        """Whether this caller may replay now: False while another thread or process does."""
        if not self._replay_lock.acquire(blocking=False):
            yield False
            return
        try:
            fd = os.open(self._lock_path, os.O_RDWR | os.O_CREAT, 0o600)
            try:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    yield False
                    return
                yield True
            finally:
                os.close(fd)  # releases the flock
        finally:
            self._replay_lock.release()
