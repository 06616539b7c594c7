"""Limits that hold for every host sharing a PostgreSQL store: advisory locks.

A butler's run slots (:class:`AdvisorySlots`, a :class:`~spawnkit.store.backend.SlotClaim`)
and its admission places (:class:`AdvisoryPlaces`, an
:class:`~spawnkit.store.backend.Admission`) are session-level advisory locks, held on
connections of their own, so a process that dies, or a host the server stops hearing
from, lets them go with it. Slot holders' connections are kept between runs
(:class:`SlotConnections`). :class:`~spawnkit.store.postgres.PostgresBackend` hands
these out; they know of it only the two callables they are given: one that opens such a
connection, one that turns a psycopg failure into the store's typed error.
"""

from __future__ import annotations

import logging
import threading
import time
import zlib
from collections.abc import Callable
from typing import Any

import psycopg
import psycopg.generators

from ..errors import StoreError
from .backend import AdmissionTicket

logger = logging.getLogger(__name__)

# Slot holders' connections are kept for the next run (see SlotConnections): a new one
# costs a connection's start-up and password exchange, 5 to 9 ms here, against about 1 ms
# for a run's whole record. At most this many wait idle, each for at most SLOT_IDLE_S: an
# idle one is a server process, which a quiet notebook should not keep.
SLOT_IDLE_MAX = 2
SLOT_IDLE_S = 30.0
SLOT_ANSWER_S = 2.0

_IDLE = psycopg.pq.TransactionStatus.IDLE
_TUPLES_OK = psycopg.pq.ExecStatus.TUPLES_OK
_OK = psycopg.pq.ConnStatus.OK
# psycopg's own generator that reads a command's results without blocking.
_FETCH_MANY = psycopg.generators.fetch_many

# A dedicated connection, opened; a psycopg failure, as the store's typed error.
Connect = Callable[[], psycopg.Connection[Any]]
ToError = Callable[[Exception], StoreError]


def lock_key(space: str, name: str) -> int:
    """The first int4 key of the advisory locks of ``space`` for ``name`` (the second is
    the slot or place): the CRC-32 of both, as a signed number."""
    return zlib.crc32(f"spawnkit:{space}:{name}".encode()) - 2**31


class AdvisoryPlaces:
    """An :class:`~spawnkit.store.backend.Admission`: place ``n`` of butler ``name`` is the
    session-level advisory lock ``(key("places", name), n)``. This host's places are all
    held on one connection of its own (a session may hold many locks), so a queued run
    costs the server no connection, and a process that dies frees its places at once.

    Taking one is serialised across hosts by a transaction-level lock, so counting the
    places held (``pg_locks``) and taking one are one step.
    """

    def __init__(self, connect: Connect, error: ToError, name: str) -> None:
        self._connect = connect
        self._error = error
        self._key = lock_key("places", name)
        self._slots_key = lock_key("slots", name)
        self._mutex = lock_key("admission", name)
        self._conn: psycopg.Connection[Any] | None = None
        self._held: set[int] = set()  # a session re-taking its own lock would stack it
        self._lock = threading.Lock()

    def enter(self, places: int, below: int | None = None) -> AdmissionTicket:
        with self._lock:
            try:
                return self._enter(places, below)
            except psycopg.Error as exc:
                self._drop()
                raise self._error(exc) from exc

    def _enter(self, places: int, below: int | None) -> AdmissionTicket:
        if self._conn is None or self._conn.closed:
            self._conn = self._connect()
            self._held.clear()
        conn = self._conn
        with conn.transaction():
            conn.execute("SELECT pg_advisory_xact_lock(%s, 0)", (self._mutex,))
            # int4 keys show in pg_locks as oids: their unsigned 32-bit value.
            row = conn.execute(
                "SELECT count(*) FILTER (WHERE classid::bigint = %s), "
                "count(*) FILTER (WHERE classid::bigint = %s) FROM pg_locks "
                "WHERE locktype = 'advisory' AND granted AND objsubid = 2 "
                "AND database = (SELECT oid FROM pg_database WHERE datname = current_database())",
                (self._key & 0xFFFF_FFFF, self._slots_key & 0xFFFF_FFFF),
            ).fetchone()
            held, running = (int(row[0]), int(row[1])) if row else (0, 0)
            if below is not None and held >= below:
                return AdmissionTicket(None, running, held)
            taken = conn.execute(
                "SELECT n FROM generate_series(0, %s - 1) AS n "
                "WHERE n <> ALL(%s) AND pg_try_advisory_lock(%s, n) LIMIT 1",
                (places, sorted(self._held), self._key),
            ).fetchone()
        if taken is None:
            return AdmissionTicket(None, running, held)
        self._held.add(int(taken[0]))
        return AdmissionTicket(int(taken[0]), running, held + 1)

    def leave(self, place: int) -> None:
        with self._lock:
            if place not in self._held:
                return
            self._held.discard(place)
            if self._conn is None or self._conn.closed:
                return  # the connection died: its locks went with it
            try:
                self._conn.execute("SELECT pg_advisory_unlock(%s, %s)", (self._key, place))
            except psycopg.Error as exc:
                logger.warning("could not give back admission place %d (%s)", place, exc)
                self._drop()

    def _drop(self) -> None:
        """Forget a connection that failed: closing it frees whatever it held."""
        if self._conn is not None:
            self._conn.close()
        self._conn = None
        self._held.clear()

    def close(self) -> None:
        with self._lock:
            self._drop()


class AdvisorySlots:
    """A :class:`~spawnkit.store.backend.SlotClaim`: slot ``n`` of the limit ``name`` is the
    session-level advisory lock ``(key(name), n)`` on a connection of its own, so a process
    that dies (or a host the server stops hearing from) lets its slots go with it."""

    def __init__(
        self, slots: SlotConnections, error: ToError, conn: psycopg.Connection[Any], name: str,
        capacity: int,
    ) -> None:  # fmt: skip
        self._slots = slots
        self._error = error
        self._conn: psycopg.Connection[Any] | None = conn
        self._key = lock_key("slots", name)
        self._capacity = capacity
        self.slot: int | None = None

    def try_acquire(self) -> int | None:
        if self.slot is not None:
            return self.slot
        try:
            try:
                row = self._first_free()
            except psycopg.OperationalError:
                # The server dropped the connection while it waited idle (a restart, or
                # ended by hand), with nothing held on it: a new one, once.
                self._replace()
                row = self._first_free()
        except psycopg.Error as exc:
            raise self._error(exc) from exc
        if row is not None:
            self.slot = int(row[0])
        return self.slot

    def _first_free(self) -> tuple[Any, ...] | None:
        """Take the first free slot, in one round trip: the scan stops at the first lock."""
        if self._conn is None:
            raise RuntimeError("this slot claim was released")
        return self._conn.execute(
            "SELECT n FROM generate_series(0, %s - 1) AS n "
            "WHERE pg_try_advisory_lock(%s, n) LIMIT 1",
            (self._capacity, self._key),
        ).fetchone()

    def _replace(self) -> None:
        if self._conn is not None:
            self._conn.close()
        self._conn = None
        self._conn = self._slots.new()

    def release(self) -> None:
        """Give the slot back, without waiting for the server (the caller may be an event
        loop); the connection is kept for another claim."""
        conn, self._conn, self.slot = self._conn, None, None
        if conn is not None:
            self._slots.give_back(conn)


class SlotConnections:
    """Slot holders' connections, kept between runs rather than closed after each.

    A connection comes back still holding its slot. :meth:`give_back` sends
    ``pg_advisory_unlock_all()`` and does not wait for the answer, so the server frees the
    slot as promptly as it did when the connection was closed, and nothing blocks;
    :meth:`take` reads that answer before it hands the connection out again. One that
    cannot be read (the server restarted, the network went) is closed, and a new one made.
    """

    def __init__(self, connect: Callable[[], psycopg.Connection[Any]]) -> None:
        self._connect = connect
        self._idle: list[tuple[float, psycopg.Connection[Any]]] = []  # (since, connection)
        self._lock = threading.Lock()
        self._closed = False
        self._timer: threading.Timer | None = None  # closes idle ones as they expire

    def take(self) -> psycopg.Connection[Any]:
        """A kept connection, ready, or else a new one."""
        while (conn := self._take_idle()) is not None:
            if _unlock_answered(conn):
                return conn
            conn.close()
        return self.new()

    def new(self) -> psycopg.Connection[Any]:
        return self._connect()

    def give_back(self, conn: psycopg.Connection[Any]) -> None:
        kept = _send_unlock(conn)
        with self._lock:
            stale = self._expired()
            kept = kept and not self._closed and len(self._idle) < SLOT_IDLE_MAX
            if kept:
                self._idle.append((time.monotonic(), conn))
                self._expire_later()
        for old in stale if kept else [*stale, conn]:
            old.close()  # its locks go with its session, as before

    def _take_idle(self) -> psycopg.Connection[Any] | None:
        with self._lock:
            stale = self._expired()
            conn = self._idle.pop()[1] if self._idle else None
        for old in stale:
            old.close()
        return conn

    def _expire_later(self) -> None:
        """Close the idle connections once they expire, even if no run comes (the lock
        held)."""
        if self._timer is None and self._idle and not self._closed:
            wait = self._idle[0][0] + SLOT_IDLE_S - time.monotonic()
            self._timer = threading.Timer(max(wait, 0.0) + 0.01, self._expire)
            self._timer.daemon = True
            self._timer.start()

    def _expire(self) -> None:
        with self._lock:
            self._timer = None
            stale = self._expired()
            self._expire_later()
        for conn in stale:
            conn.close()

    def _expired(self) -> list[psycopg.Connection[Any]]:
        """Take out the connections idle longer than SLOT_IDLE_S (the lock held)."""
        oldest = time.monotonic() - SLOT_IDLE_S
        stale = [conn for since, conn in self._idle if since < oldest]
        self._idle = [(since, conn) for since, conn in self._idle if since >= oldest]
        return stale

    def close(self) -> None:
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
        for _, conn in idle:
            conn.close()


def _send_unlock(conn: psycopg.Connection[Any]) -> bool:
    """Ask the server to free ``conn``'s advisory locks, without waiting for its answer;
    False when that could not be sent whole (the connection is then closed instead)."""
    pgconn = conn.pgconn
    try:
        with conn.lock:
            if conn.closed or pgconn.transaction_status != _IDLE:
                return False
            pgconn.send_query(b"SELECT pg_advisory_unlock_all()")
            return pgconn.flush() == 0
    except psycopg.Error:
        return False


def _unlock_answered(conn: psycopg.Connection[Any]) -> bool:
    """Whether the server answered :func:`_send_unlock`'s query on ``conn`` (which is then
    as a new connection: idle, holding nothing)."""
    pgconn = conn.pgconn
    try:
        with conn.lock:
            results = conn.wait(_FETCH_MANY(pgconn), timeout=SLOT_ANSWER_S)
            if not results or any(result.status != _TUPLES_OK for result in results):
                return False
            # What came after the answer: a server that has ended the connection since
            # said so (and closed it), unless that was a moment ago (try_acquire then
            # makes a new one).
            pgconn.consume_input()
            return pgconn.status == _OK and pgconn.transaction_status == _IDLE
    except psycopg.Error:  # a timeout too: the answer came long ago, if it ever will
        return False
