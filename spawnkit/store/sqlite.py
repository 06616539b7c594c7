"""The embedded engine of the session store: one SQLite file in WAL mode.

One database file (``$SPAWNKIT_HOME/sessions.db`` by default) in WAL mode with a
busy timeout, so several processes (a notebook, ``spawnkit serve``, a CLI run)
can write at once. Connections are per thread. The file holds no credentials:
those live in their own file (:mod:`spawnkit.config.credential_file`), and the
``credentials`` table older versions kept is moved there when the store opens.
:func:`check_store` reads a file page by page without opening it as a store, and
:func:`store_error` turns any SQLite failure into one typed line.
"""

from __future__ import annotations

import logging
import sqlite3
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from urllib.parse import quote

from ..config.credential_file import CredentialError, CredentialFile, StoredCredential
from ..errors import HomeNotWritable, StoreDamaged, StoreError, StoreTooNew
from ..home import is_writable
from .backend import Params, Row, statements
from .schema import (
    CLI_EVENTS_SCHEMA,
    CLI_SPANS_SCHEMA,
    HISTORY_SCHEMA,
    MIGRATIONS,
    SCHEMA,
    SCHEMA_VERSION,
    SEGMENTS_SCHEMA,
)

logger = logging.getLogger(__name__)

BUSY_TIMEOUT_MS = 15_000


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
    damaged = damage_error(path, text)
    if damaged is not None:
        return damaged
    if any(word in text.lower() for word in _READ_ONLY_WORDS) and not is_writable(path.parent):
        return HomeNotWritable(path.parent, text)
    return StoreError(f"the session store {path}: {text}")


def damage_error(path: Path, text: str) -> StoreDamaged | None:
    """:class:`StoreDamaged` when SQLite's message ``text`` says the file itself is damaged
    (from ``sqlite3`` or another SQLite library, such as history's reader), else None."""
    lowered = text.lower()
    return StoreDamaged(path, text) if any(w in lowered for w in _DAMAGE_WORDS) else None


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


class WriteWouldWait(Exception):
    """A write made without waiting (:meth:`SqliteBackend.without_waiting`) found the write
    lock held; nothing was changed."""


@dataclass(frozen=True)
class StoreHealth:
    """What :func:`check_store` found (``path``: the file; for a PostgreSQL store, what
    :func:`~spawnkit.store.postgres.check_server_store` found, its URL without password)."""

    path: Path | str
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


@contextmanager
def committed(conn: sqlite3.Connection) -> Iterator[sqlite3.Connection]:
    """The block's end commits the transaction ``conn`` has begun; an error rolls it back."""
    try:
        yield conn
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")


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
        # This process's writers take turns here before SQLite's own write lock: one that
        # finds SQLite's lock taken sleeps in its busy handler (1, 2, 5, 10 ms and more)
        # however soon the lock is free, and 100 runs starting at once spent most of their
        # time so. Other processes still meet at SQLite's lock, with its busy timeout.
        self._writing = threading.RLock()
        # The connection of writes made without waiting (no busy timeout, and no automatic
        # checkpoint: that copies pages and syncs, for the connections of threads to do).
        self._at_once: sqlite3.Connection | None = None
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
            conn = self._open(BUSY_TIMEOUT_MS)
            self._local.conn = conn
        return conn

    def _open(self, busy_timeout_ms: int, *, wal: bool = True) -> sqlite3.Connection:
        created = not self.file.exists()
        conn = sqlite3.connect(
            self.file, timeout=busy_timeout_ms / 1000, isolation_level=None,
            check_same_thread=False,
        )  # fmt: skip
        if created:
            self.file.chmod(0o600)  # prompts and outputs are private too
        conn.row_factory = sqlite3.Row
        conn.execute(f"PRAGMA busy_timeout = {busy_timeout_ms}")
        if wal:  # persistent in the file: set by the first connection, which migrated it
            _enable_wal(conn)
        # WAL with synchronous = NORMAL: a commit appends to the WAL and does not sync; a
        # checkpoint syncs. A power cut may lose the last commits, never corrupt the file.
        conn.execute("PRAGMA synchronous = NORMAL")
        with self._lock:
            self._connections.append(conn)
        return conn

    @contextmanager
    def without_waiting(self) -> Iterator[None]:
        """Writes in the block are made at once or not at all: one that would wait for the
        write lock (held by another writer of this process, or by another process) raises
        :class:`WriteWouldWait` before it changed anything. For a caller that must not
        block (the event loop), and goes to a thread when it would."""
        self._local.at_once = True
        try:
            yield
        finally:
            self._local.at_once = False

    def query(self, sql: str, params: Params = ()) -> Sequence[Row]:
        return self._connect().execute(sql, params).fetchall()

    @contextmanager
    def transaction(self, single: bool = False) -> Iterator[_SqliteTransaction]:
        with self._tx() as conn:
            yield _SqliteTransaction(conn)

    @contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        """A write transaction that takes the write lock up front (no upgrade deadlocks)."""
        if getattr(self._local, "at_once", False):
            with self._tx_at_once() as conn:
                yield conn
            return
        conn = self._connect()
        # Past the busy timeout (a writer of ours holding on): on to SQLite's lock, which
        # then says how long it waited.
        turn = self._writing.acquire(timeout=BUSY_TIMEOUT_MS / 1000)
        try:
            conn.execute("BEGIN IMMEDIATE")
            with committed(conn):
                yield conn
        finally:
            if turn:
                self._writing.release()

    @contextmanager
    def _tx_at_once(self) -> Iterator[sqlite3.Connection]:
        """:meth:`_tx` for :meth:`without_waiting`, on a connection of its own (which only
        the holder of this process's turn uses)."""
        if not self._writing.acquire(blocking=False):
            raise WriteWouldWait
        try:
            if self._at_once is None:
                self._at_once = self._open(0, wal=False)
                self._at_once.execute("PRAGMA wal_autocheckpoint = 0")
            conn = self._at_once
            try:
                conn.execute("BEGIN IMMEDIATE")
            except sqlite3.OperationalError as exc:
                if conn.in_transaction or ("locked" not in str(exc) and "busy" not in str(exc)):
                    raise
                raise WriteWouldWait from exc
            with committed(conn):
                yield conn
        finally:
            self._writing.release()

    def _migrate(self) -> None:
        with self._tx() as conn:
            version = conn.execute("PRAGMA user_version").fetchone()[0]
            if version > SCHEMA_VERSION:
                raise StoreTooNew(self.location, version, SCHEMA_VERSION)
            if version == 0:
                for statement in statements(SCHEMA):
                    conn.execute(statement)
                for statement in (*HISTORY_SCHEMA, *CLI_SPANS_SCHEMA, *CLI_EVENTS_SCHEMA,
                                  *SEGMENTS_SCHEMA):  # fmt: skip
                    conn.execute(statement)
            else:
                for step in MIGRATIONS[version - 1 :]:
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
        self._at_once = None
