"""The PostgreSQL store's columnar copy of its completed history, sealed as runs complete.

What :mod:`spawnkit.store.segments` does for a SQLite file, for a store a team shares: the
typed Arrow columns (:mod:`spawnkit.store.columns`) of completed sessions and of their
tool calls, kept as LZ4 Arrow IPC blobs in ``history_segments`` (schema step 12 of
:mod:`spawnkit.store.postgres`), so that ``spawnkit.history`` reads a few blobs and the
rows not sealed yet instead of scanning ten million rows over the connection.

A server has no rowid to seal "up to", and several hosts complete runs at once. So the
transaction that completes a run also queues its session (a trigger inserts its id into
``history_unsealed``), and a seal takes :data:`SEAL_SESSIONS` of the queue (the oldest
first) out of it and into one segment, in one transaction: a reader's snapshot sees a
completed session either in a segment or still queued, never in both or neither. Seals
are serialised across hosts by a transaction-scoped advisory lock (a second sealer waits,
then finds the queue short and does nothing), and a completion never waits for a seal.

Sealed rows must not change behind the copy: the triggers of step 12 bump
``history_epoch.sealed_epoch`` when a sealed session or one of its calls is updated or
deleted. Segments of another epoch are stale; readers then read the rows, and the next
seal drops them and queues every completed session again, to be sealed over the seals
that follow (:func:`seal`'s ``limit`` bounds each).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

import pyarrow as pa

from .backend import Backend, Transaction
from .columns import (
    CALL_FIELDS,
    ROWID,
    SERVER_CALL_ORDER,
    SERVER_SESSION_ORDER,
    SESSION_FIELDS,
    from_rows,
    server_select,
    typed,
)
from .schema import SEAL_SESSIONS, SERVER_SEAL_DUE
from .segments import FANOUT, MAX_LEVEL, decode, encode

# pg_advisory_xact_lock key that serialises seals ("sealhist" as 8 ASCII bytes).
SEAL_LOCK = int.from_bytes(b"sealhist", "big") & 0x7FFF_FFFF_FFFF_FFFF
SortKeys = list[tuple[str, Literal["ascending", "descending"]]]
SESSION_SORT: SortKeys = [("created_at", "ascending"), ("session_id", "ascending")]
"""The server's order of sessions, as Arrow sorts (strings by their bytes)."""
CALL_SORT: SortKeys = [("session_id", "ascending"), ("seq", "ascending")]
# SERVER_SESSION_ORDER in the queue's own columns: its index (schema step 13) is in it.
QUEUE_ORDER = 'created_at, session_id COLLATE "C"'
TAKE_QUEUED = (
    "DELETE FROM history_unsealed WHERE session_id IN (SELECT session_id "
    f"FROM history_unsealed ORDER BY {QUEUE_ORDER} LIMIT ?) RETURNING session_id"
)


def seal(db: Backend, *, force: bool = False, limit: int | None = None) -> bool:
    """Seal the oldest queued sessions (at most ``limit``, default :data:`SEAL_SESSIONS`)
    with their tool calls, if :data:`SEAL_SESSIONS` are queued (``force``: any). Whether
    a segment was written (or stale ones dropped)."""
    with db.transaction() as tx:
        tx.query("SELECT pg_advisory_xact_lock(?) AS locked", (SEAL_LOCK,))
        epoch = int(tx.query("SELECT sealed_epoch FROM history_epoch WHERE id = 1")[0][
            "sealed_epoch"])  # fmt: skip
        if tx.query("SELECT 1 AS stale FROM history_segments WHERE epoch <> ? LIMIT 1", (epoch,)):
            _start_over(tx)
            return True
        if not force and not tx.query(SERVER_SEAL_DUE, (SEAL_SESSIONS, SEAL_SESSIONS))[0]["due"]:
            return False
        ids = _take_queued(tx, limit or SEAL_SESSIONS)
        if not ids:
            return False
        done = " WHERE id = ANY(?) AND completed_at IS NOT NULL"
        sessions = _read(tx, SESSION_FIELDS, "sessions", done, SERVER_SESSION_ORDER, ids)
        if not sessions.num_rows:
            return False  # queued sessions since deleted or reopened: nothing to seal
        sealed = [str(i) for i in sessions["session_id"].to_pylist()]
        calls = _read(tx, CALL_FIELDS, "tool_calls", " WHERE session_id = ANY(?)",
                      SERVER_CALL_ORDER, sealed)  # fmt: skip
        _insert(tx, epoch, 0, sessions, calls)
        _merge(tx, epoch)
        _count_queue(tx)
    return True


def _count_queue(tx: Transaction) -> None:
    """Tell the planner how long the queue is now: readers join it to find the rows not
    sealed, and statistics of a queue a thousand times longer (a store that was just
    migrated, or started over) would have them scan ten million calls for a few."""
    tx.execute("ANALYZE history_unsealed")


def _start_over(tx: Transaction) -> None:
    """Stale segments go, and every completed session is queued to be sealed again."""
    tx.execute("DELETE FROM history_segments")
    tx.execute(
        "INSERT INTO history_unsealed SELECT id, created_at FROM sessions "
        "WHERE completed_at IS NOT NULL ON CONFLICT DO NOTHING"
    )
    _count_queue(tx)


def _take_queued(tx: Transaction, limit: int) -> list[str]:
    """The ids of the oldest ``limit`` queued sessions, out of the queue: the first
    entries of its index in the sessions' order, however long the queue (schema step 13),
    rather than a sort of the whole queue or a walk past every session sealed already."""
    rows = tx.query(TAKE_QUEUED, (limit,))
    return [str(row["session_id"]) for row in rows]


def _read(tx: Transaction, fields: Sequence[Any], table: str, where: str, order: str,
          ids: list[str]) -> pa.Table:  # fmt: skip
    rows = tx.query(f"SELECT {server_select(fields)} FROM {table}{where} ORDER BY {order}", (ids,))
    names = [ROWID, *(name for name, _, _ in fields)]
    return typed(from_rows(names, [tuple(r.values()) for r in rows]), fields)


def _insert(tx: Transaction, epoch: int, level: int, sessions: pa.Table, calls: pa.Table) -> None:
    tx.execute(
        "INSERT INTO history_segments (epoch, level, n_sessions, sessions, calls) "
        "VALUES (?, ?, ?, ?, ?)",
        (epoch, level, sessions.num_rows, encode(sessions), encode(calls)),
    )


def _merge(tx: Transaction, epoch: int) -> None:
    """While :data:`FANOUT` segments share a level below :data:`MAX_LEVEL`, make them one
    of the next, in the server's order of sessions and of calls."""
    for level in range(MAX_LEVEL):
        rows = tx.query(
            "SELECT id, sessions, calls FROM history_segments WHERE level = ? ORDER BY id",
            (level,),
        )
        if len(rows) < FANOUT:
            return
        sessions = pa.concat_tables([decode(bytes(r["sessions"])) for r in rows])
        calls = pa.concat_tables([decode(bytes(r["calls"])) for r in rows])
        tx.execute("DELETE FROM history_segments WHERE id = ANY(?)", ([r["id"] for r in rows],))
        _insert(tx, epoch, level + 1, sessions.sort_by(SESSION_SORT), calls.sort_by(CALL_SORT))
