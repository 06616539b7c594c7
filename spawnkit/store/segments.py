"""The SQLite store's columnar copy of its completed history, kept current as runs complete.

Reading a million sessions or ten million tool calls out of SQLite's rows costs tens of
CPU-seconds however it is done (every value crosses the row API; timestamps are text). So
the store keeps, beside its rows, the typed Arrow columns (:mod:`spawnkit.store.columns`)
of its completed sessions and of their tool calls, in *segments*: rows of
``history_segments``, each an Arrow IPC stream of the sessions sealed together and one of
their calls. ``spawnkit.history`` reads the segments (bytes, no row API) plus the few rows
not sealed yet, and so never scans the row store.

Sealing (:func:`seal`) happens in the writer that completes a run, once
:data:`SEAL_SESSIONS` sessions have come since the last seal, in one write transaction (so
two processes never seal the same rows, and a reader sees a segment only with the rows it
covers). A seal covers the sessions with ``rowid`` up to its ``hi``, except those still
open then (its ``open`` list, sealed later), and all the tool calls of the sessions it
seals. Segments merge as they pile up: :data:`FANOUT` segments of one level become one of
the next (at most :data:`MAX_LEVEL`), so a store holds a few dozen at most.

What was sealed must not change behind the copy. The store's triggers
(:data:`spawnkit.store.schema.SEGMENTS_SCHEMA`) bump ``history_epoch.epoch`` when a
completed session, or a tool call of one, is updated or deleted (repairs of a crash mark,
deletes): each segment carries the epoch it was sealed at, and segments of another epoch
are stale, ignored by readers and sealed afresh by the next full read. Tool calls of runs
still going are written, rewritten and replaced freely: they are never sealed.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from .backend import Backend, Transaction
from .columns import (
    CALL_FIELDS,
    CALL_SCHEMA,
    ROWID,
    SESSION_FIELDS,
    SESSION_SCHEMA,
    from_rows,
    select,
    typed,
)
from .schema import SEAL_SESSIONS

FANOUT = 8
MAX_LEVEL = 2
"""Segments merge up to ``SEAL_SESSIONS * FANOUT ** MAX_LEVEL`` sessions (64k): a blob of
tens of MB, far below SQLite's 1 GB limit on one value."""

DECODE_POOL = pa.system_memory_pool()
"""Where decoded segments live (see :func:`decode`)."""

Query = Callable[[str, Sequence[object]], Sequence[Any]]


@dataclass(frozen=True)
class Sealed:
    """The store's segments as one pair of tables, and what they cover."""

    sessions: pa.Table
    calls: pa.Table
    epoch: int
    hi: int  # sessions up to this rowid are sealed ...
    open: tuple[int, ...]  # ... except these, still open at the last seal


def present(query: Query) -> bool:
    """Whether the store has the segments table (schema 16 on)."""
    found = query("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?",
                  ("history_segments",))  # fmt: skip
    return bool(found)


def load(query: Query, epoch: int, *, sessions: bool = True, calls: bool = True) -> Sealed | None:
    """The segments of ``epoch`` (None if there are none, or some of another epoch); only
    the tables asked for are read (the others are empty)."""
    rows = query("SELECT id, epoch, hi, open FROM history_segments ORDER BY hi", ())
    if not rows or any(int(row[1]) != epoch for row in rows):
        return None
    tables = []
    for column, wanted, schema in (
        ("sessions", sessions, SESSION_SCHEMA), ("calls", calls, CALL_SCHEMA)
    ):  # fmt: skip
        # One blob at a time, by id: an ORDER BY over the blobs would sort copies of them.
        sql = f"SELECT {column} FROM history_segments WHERE id = ?"
        parts = [decode(query(sql, (row[0],))[0][0]) for row in rows] if wanted else []
        if any(t.schema != schema for t in parts):
            return None  # sealed by another version of the columns
        tables.append(pa.concat_tables(parts) if parts else schema.empty_table())
    last = rows[-1]
    return Sealed(tables[0], tables[1], epoch, int(last[2]), tuple(json.loads(last[3])))


def decode(blob: bytes | pa.Buffer) -> pa.Table:
    # Into malloc's memory, not Arrow's own pool: a read turns these tables into pandas
    # (numpy allocates with malloc), and what the conversion frees is then what it reuses.
    return pa.ipc.open_stream(pa.py_buffer(blob), memory_pool=DECODE_POOL).read_all()


def encode(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    # LZ4: a quarter of the bytes to step through SQLite's pages, decoded faster than that.
    options = pa.ipc.IpcWriteOptions(compression="lz4")
    with pa.ipc.new_stream(sink, table.schema, options=options) as writer:
        # One batch per million rows: merged segments would otherwise keep every seal's
        # batch, and a read decodes and converts a thousand small chunks a column.
        writer.write_table(table.unify_dictionaries().combine_chunks(), max_chunksize=1 << 20)
    return sink.getvalue().to_pybytes()


def seal(db: Backend, *, force: bool = False, limit: int | None = None) -> bool:
    """Seal the sessions completed since the last seal, with their tool calls, if
    :data:`SEAL_SESSIONS` came (``force``: any); ``limit`` bounds the rowids sealed at once.
    Whether a segment was written. Stale segments are left to the next full read."""
    with db.transaction() as tx:
        epoch = int(tx.query("SELECT epoch FROM history_epoch WHERE id = 1")[0]["epoch"])
        last = tx.query("SELECT epoch, hi, open FROM history_segments ORDER BY hi DESC LIMIT 1")
        if last and int(last[0]["epoch"]) != epoch:
            return False  # stale: sealing more on top would keep them stale
        hi = int(last[0]["hi"]) if last else 0
        reopen: list[int] = json.loads(last[0]["open"]) if last else []
        top = int(tx.query("SELECT coalesce(max(rowid), 0) AS top FROM sessions")[0]["top"])
        if limit is not None:
            top = min(top, hi + limit)
        if top - hi < (1 if force else SEAL_SESSIONS) and not (force and reopen):
            return False
        where, params = _unsealed(hi, top, reopen)
        done = f"{where} AND completed_at IS NOT NULL"
        sessions = _read(tx, SESSION_FIELDS, "sessions", done, params)
        calls = _read(tx, CALL_FIELDS, "tool_calls",
                      f" WHERE session_id IN (SELECT id FROM sessions{done})", params)  # fmt: skip
        open_now = (
            f"SELECT rowid AS id FROM sessions{where} AND completed_at IS NULL ORDER BY rowid"
        )
        still = [int(r["id"]) for r in tx.query(open_now, params)]
        if not sessions.num_rows and still == reopen and top == hi:
            return False
        _insert(tx, epoch, top, still, 0, sessions, calls)
        _merge(tx, epoch)
    return True


def _unsealed(hi: int, top: int, reopen: Sequence[int]) -> tuple[str, list[object]]:
    """The sessions a seal up to ``top`` covers: past ``hi``, and those open at the last."""
    # The open ones as one JSON parameter: there may be more than SQLite takes parameters.
    where = " WHERE ((rowid > ? AND rowid <= ?) OR rowid IN (SELECT value FROM json_each(?)))"
    return where, [hi, top, json.dumps(list(reopen))]


def _read(tx: Transaction, fields: Sequence[Any], table: str, where: str,
          params: Sequence[object]) -> pa.Table:  # fmt: skip
    sql = f"SELECT {select(fields)} FROM {table}{where} ORDER BY rowid"
    rows = tx.query(sql, params)
    names = [ROWID, *(name for name, _, _ in fields)]
    return typed(from_rows(names, [tuple(r) for r in rows]), fields)


def _insert(tx: Transaction, epoch: int, hi: int, still: Sequence[int], level: int,
            sessions: pa.Table, calls: pa.Table) -> None:  # fmt: skip
    tx.execute(
        "INSERT INTO history_segments (epoch, hi, open, level, n_sessions, sessions, calls) "
        "VALUES (?, ?, ?, ?, ?, ?, ?)",
        (epoch, hi, json.dumps(list(still)), level, sessions.num_rows, encode(sessions),
         encode(calls)),
    )  # fmt: skip


def _merge(tx: Transaction, epoch: int) -> None:
    """While :data:`FANOUT` segments share a level below :data:`MAX_LEVEL`, make them one
    of the next level (they are the newest: lower levels always come after higher ones)."""
    for level in range(MAX_LEVEL):
        rows = tx.query(
            "SELECT id, hi, open, sessions, calls FROM history_segments WHERE level = ? "
            "ORDER BY hi", (level,),
        )  # fmt: skip
        if len(rows) < FANOUT:
            return
        sessions = pa.concat_tables([decode(r["sessions"]) for r in rows])
        calls = pa.concat_tables([decode(r["calls"]) for r in rows])
        calls = calls.sort_by(ROWID)  # call order, which sessions sealed late broke
        tx.execute(
            f"DELETE FROM history_segments WHERE id IN ({', '.join('?' * len(rows))})",
            [r["id"] for r in rows],
        )
        _insert(tx, epoch, int(rows[-1]["hi"]), json.loads(rows[-1]["open"]), level + 1,
                sessions, calls)  # fmt: skip


def rebuild(db: Backend, epoch: int, sessions: pa.Table, calls: pa.Table,
            still: Sequence[int], hi: int) -> bool:  # fmt: skip
    """Replace every segment by the full history a reader just read (typed, in rowid
    order): a store written before segments existed, or whose segments went stale. Written
    only if the store is still at ``epoch``; whether it was."""
    chunk = SEAL_SESSIONS * FANOUT**MAX_LEVEL
    with db.transaction() as tx:
        now = int(tx.query("SELECT epoch FROM history_epoch WHERE id = 1")[0]["epoch"])
        if now != epoch:
            return False
        tx.execute("DELETE FROM history_segments")
        done = sessions.filter(pc.is_valid(sessions["ended_at"]))
        # Calls of open sessions stay unsealed; those of completed ones are sealed with them.
        open_ids = sessions.filter(pc.is_null(sessions["ended_at"]))["session_id"]
        keep = pc.invert(pc.is_in(calls["session_id"], value_set=open_ids.combine_chunks()))
        calls = calls.filter(keep)
        starts = list(range(0, done.num_rows, chunk)) or [0]
        for n, start in enumerate(starts):
            part = done.slice(start, chunk)
            last = n == len(starts) - 1
            top = hi if last else int(part[ROWID][-1].as_py())
            mine = pc.is_in(calls["session_id"], value_set=part["session_id"].combine_chunks())
            if last:  # and the calls of no session (its record deleted): they are rows too
                known = pc.is_in(calls["session_id"], value_set=done["session_id"].combine_chunks())
                mine = pc.or_(mine, pc.invert(known))
            _insert(
                tx, epoch, top, list(still) if last else [], MAX_LEVEL, part, calls.filter(mine)
            )
    return True
