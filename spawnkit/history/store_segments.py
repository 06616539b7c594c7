"""Sessions and tool calls of a SQLite store from its own columnar copy, plus what is new.

The store seals its completed history into Arrow segments as runs complete
(:mod:`spawnkit.store.segments`). A read here takes those segments (blobs: bytes, no row
API, typed already) and the few rows not sealed yet (sessions past the last seal, those
still open at it, and their tool calls), all in one read transaction of this process's
own ``sqlite3`` (the writers' library). No full scan of the row store, and no cache of
its own: the first read in a new ``$SPAWNKIT_HOME`` is as fast as any other.

A store whose segments are missing (written by a spawnkit before them) or stale (a sealed
record changed) is read in full once, as before, and, when this user may write it, its
segments are written from that read (the one-time cost of an older store).
"""

from __future__ import annotations

import json
import logging
import os
import sqlite3
from collections.abc import Sequence
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..home import is_writable
from ..store import segments
from ..store.columns import CALL_FIELDS, ROWID, SESSION_FIELDS, from_rows, select, typed
from .rows import Column
from .store_query import SMALL_ROWS, query, read_only_uri

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class History:
    """Every session (rowid order) and tool call (call order) of the store."""

    sessions: pa.Table
    calls: pa.Table


def read(path: Path, *, sessions: bool = True, calls: bool = True) -> History | None:
    """The store's history through its segments, only the tables asked for (the other is
    empty); None when it has none to use (an older schema, or none sealed and none could
    be written: read the rows as before)."""
    with closing(sqlite3.connect(read_only_uri(path), uri=True)) as conn:
        conn.execute("BEGIN")  # one snapshot: segments, their marks and the rows after them

        def run(sql: str, params: Sequence[object] = ()) -> list[Any]:
            return conn.execute(sql, tuple(params)).fetchall()

        if not segments.present(run):
            return None
        epoch = int(run("SELECT epoch FROM history_epoch WHERE id = 1")[0][0])
        sealed = segments.load(run, epoch, sessions=sessions, calls=calls)
        if sealed is not None:
            where, params = _tail(sealed.hi, sealed.open)
            if int(run(f"SELECT count(*) FROM sessions{where}", params)[0][0]) <= SMALL_ROWS:
                return History(
                    _concat(sealed.sessions, _rows(run, SESSION_FIELDS, "sessions", where,
                                                   params) if sessions else None),
                    _in_call_order(_concat(sealed.calls, _rows(
                        run, CALL_FIELDS, "tool_calls", _calls_of(where), params
                    ) if calls else None)),
                )  # fmt: skip
    if sealed is not None:  # many rows past the last seal: the child reads them
        tail_sessions = (
            _child(path, SESSION_FIELDS, "sessions", where, params) if sessions else None
        )
        tail_calls = (
            _child(path, CALL_FIELDS, "tool_calls", _calls_of(where), params) if calls else None
        )
        return History(_concat(sealed.sessions, tail_sessions),
                       _in_call_order(_concat(sealed.calls, tail_calls)))  # fmt: skip
    return _build(path, epoch)


def _tail(hi: int, reopen: Sequence[int]) -> tuple[str, list[object]]:
    if not reopen:
        return " WHERE rowid > ?", [hi]
    # The open ones as one JSON parameter: there may be more than SQLite takes parameters.
    return " WHERE rowid > ? OR rowid IN (SELECT value FROM json_each(?))", [
        hi, json.dumps(list(reopen))
    ]  # fmt: skip


def _calls_of(where: str) -> str:
    return f" WHERE session_id IN (SELECT id FROM sessions{where})"


def _rows(run: Any, fields: Sequence[Any], table: str, where: str,
          params: Sequence[object]) -> pa.Table:  # fmt: skip
    rows = run(f"SELECT {select(fields)} FROM {table}{where} ORDER BY rowid", params)
    names = [ROWID, *(name for name, _, _ in fields)]
    return typed(from_rows(names, rows), fields)


def _child(path: Path, fields: Sequence[Any], table: str, where: str,
           params: Sequence[object]) -> pa.Table:  # fmt: skip
    sql = f"SELECT {select(fields)} FROM {table}{where} ORDER BY rowid"
    return typed(query(path, sql, params), fields)


def _concat(base: pa.Table, tail: pa.Table | None) -> pa.Table:
    return pa.concat_tables([base, tail]) if tail is not None and tail.num_rows else base


def _in_call_order(calls: pa.Table) -> pa.Table:
    """Calls in rowid order (the row store's). Sealing leaves them in it except around a
    run sealed late (open at one seal, its calls written live early): only the window
    that is out of order is sorted, not ten million rows."""
    if _ascending(calls[ROWID]):
        return calls
    rowids = calls[ROWID].to_numpy()
    drops = np.flatnonzero(np.diff(rowids) < 0)
    lo, hi = unsorted_window(rowids, drops)
    window = calls.slice(lo, hi - lo)
    order = np.argsort(rowids[lo:hi], kind="stable")
    return pa.concat_tables([calls.slice(0, lo), window.take(order), calls.slice(hi)])


def _ascending(rowids: Column) -> bool:
    """Whether ``rowids`` ascend, checked a chunk at a time (each chunk is a segment's, read
    in place: no copy of ten million rowids, which a read's peak memory would carry)."""
    last = None
    for chunk in rowids.chunks:
        if not len(chunk):
            continue
        values = chunk.to_numpy(zero_copy_only=False)
        if (last is not None and values[0] < last) or bool((values[1:] < values[:-1]).any()):
            return False
        last = values[-1]
    return True


def _build(path: Path, epoch: int) -> History | None:
    """Read every row once and seal it (a store without usable segments), if this user
    may write the store; None otherwise (the caller reads as before)."""
    if not (is_writable(path.parent) and os.access(path, os.W_OK)):
        return None
    everything = " WHERE 1"
    sessions = _child(path, SESSION_FIELDS, "sessions", everything, [])
    calls = _child(path, CALL_FIELDS, "tool_calls", everything, [])
    still = sessions.filter(pc.is_null(sessions["ended_at"]))[ROWID].to_numpy().tolist()
    hi = int(pc.max(sessions[ROWID]).as_py() or 0)
    from ..store.sqlite import SqliteBackend

    try:
        db = SqliteBackend(path)
        try:
            if not segments.rebuild(db, epoch, sessions, calls, still, hi):
                log.info("the store %s changed while its columnar copy was built", path)
        finally:
            db.close()
    except (sqlite3.Error, OSError) as exc:
        log.warning("could not write the columnar copy of %s: %s", path, exc)
    return History(sessions, calls)


def unsorted_window(keys: np.ndarray, drops: np.ndarray) -> tuple[int, int]:
    """The rows ``[lo, hi)`` to sort for ``keys`` to ascend, given ``drops``, the rows
    after which the order breaks: widened to every row the disordered ones could go before
    or after (ties included), and no further."""
    first, last = int(drops[0]) + 1, int(drops[-1]) + 1
    lo = int(np.searchsorted(keys[:first], keys[first:].min(), side="left"))
    hi = last + int(np.searchsorted(keys[last:], keys[:last].max(), side="right"))
    return lo, hi
