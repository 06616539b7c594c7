"""Sessions and tool calls of a PostgreSQL store from its own columnar copy, plus what is new.

The store seals its completed history into Arrow segments as runs complete
(:mod:`spawnkit.store.server_segments`). A read here takes those segments (a few blobs over
the connection: no row to convert, typed already) and the rows not sealed yet (sessions
still open and those queued to be sealed, with their tool calls), all through one
REPEATABLE READ snapshot, so a completed session is found exactly once: in a segment or
in the queue. No scan of the row store and no cache of its own: the first read in a new
``$SPAWNKIT_HOME`` costs what any other does.

Frames keep the server's order (sessions by ``created_at`` then id, calls by session id
then ``seq``, ids in byte order). Segments are sealed oldest first, so their sessions
are nearly in order already: only the window that is out of order is sorted. Calls come
in blocks of one session each; the blocks are put in id order, by sorting one id per
block rather than every call.

A store below schema step 12, or whose segments are stale (a sealed record changed; the
next seal starts them over), is read row by row as before.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..store.columns import (
    CALL_FIELDS,
    CALL_SCHEMA,
    SERVER_CALL_ORDER,
    SESSION_FIELDS,
    SESSION_SCHEMA,
    Field,
    server_select,
    typed,
)
from ..store.segments import decode
from ..store.server_segments import SESSION_SORT
from .arrow_frames import release_memory
from .rows import Column
from .server_query import Snapshot
from .store_segments import unsorted_window

_PRESENT = "SELECT to_regclass('history_segments') IS NOT NULL AS present"
# Not sealed yet: sessions still open, and completed ones queued (two index scans, not an
# OR that would scan the table).
_OPEN = "SELECT id FROM sessions WHERE completed_at IS NULL"
_QUEUED = (
    "SELECT q.session_id FROM history_unsealed q JOIN sessions s ON s.id = q.session_id "
    "WHERE s.completed_at IS NOT NULL"
)


# Rows that fall in more runs than this are gathered in one copy, not sliced.
_RUNS = 64


@dataclass(frozen=True)
class History:
    """The sessions (server order) and tool calls (server order) of the store."""

    sessions: pa.Table
    calls: pa.Table


def read(run: Snapshot, *, sessions: bool = True, calls: bool = True) -> History | None:
    """The store's history through its segments, only the tables asked for (the other is
    empty); None when it has none to use (an older schema, or stale segments)."""
    if not run(_PRESENT, ()).to_pylist()[0]["present"]:
        return None
    epoch = run("SELECT sealed_epoch FROM history_epoch WHERE id = 1", ())[0][0].as_py()
    found = run("SELECT id, epoch FROM history_segments ORDER BY id", ()).to_pylist()
    if any(row["epoch"] != epoch for row in found):
        return None
    ids = [row["id"] for row in found]
    session_table = SESSION_SCHEMA.empty_table()
    call_table = CALL_SCHEMA.empty_table()
    if sessions:
        parts = _blobs(run, "sessions", ids)
        parts.sort(key=_first_created)
        tail = _tail(run, SESSION_FIELDS, "sessions", "id", "")
        session_table = sessions_in_order(pa.concat_tables([*parts, tail]))
    if calls:
        parts = _blobs(run, "calls", ids)
        tail = _tail(run, CALL_FIELDS, "tool_calls", "session_id", SERVER_CALL_ORDER)
        call_table = calls_in_order(pa.concat_tables([*parts, tail]))
    # The blobs, the results that carried them and the connection's buffers are freed: given
    # back now, they are not resident under the frame built from these tables.
    release_memory()
    if any(t.schema != s for t, s in ((session_table, SESSION_SCHEMA), (call_table, CALL_SCHEMA))):
        return None  # sealed by another version of the columns
    return History(session_table, call_table)


def _blobs(run: Snapshot, column: str, ids: list[int]) -> list[pa.Table]:
    """The ``column`` table of each segment: one blob at a time, as bytes in binary form
    (malloc's memory), each decoded and freed before the next is asked for, so what it
    held is reused by the decoded columns and then the frame."""
    parts = []
    for segment in ids:
        blob = run.blob(f"SELECT {column} FROM history_segments WHERE id = ?", (segment,))
        if blob is None:  # removed under us: not in this snapshot, cannot happen
            raise RuntimeError(f"segment {segment} has no {column}")
        parts.append(decode(blob))
        del blob
    # The blobs and the results that carried them are freed: given back before the tables
    # are checked and put in order, with every segment held (the read's peak).
    release_memory()
    return parts


def _first_created(table: pa.Table) -> int:
    first = table["created_at"][0].value if table.num_rows else None
    return -(2**63) if first is None else int(first)


def _tail(run: Snapshot, fields: Sequence[Field], table: str, key: str, order: str) -> pa.Table:
    """The rows of ``table`` whose session (``key``) is open or queued, ``order``ed."""
    select = f"SELECT {server_select(fields)} FROM {table} WHERE {key} IN "
    both = f"{select}({_OPEN}) UNION ALL {select}({_QUEUED})"
    sql = f"SELECT * FROM ({both}) AS tail ORDER BY {order}" if order else both
    return typed(run.read(sql, ()), fields)


def sessions_in_order(table: pa.Table) -> pa.Table:
    """``table`` by created_at then session id, sorting only the window out of order."""
    n = table.num_rows
    if n < 2 or _in_order(table):
        return table
    created = _stamps(table["created_at"])
    step = np.diff(created)
    bad = step < 0
    ties = np.flatnonzero(step == 0)
    if len(ties):
        ids = table["session_id"]
        later = pc.less(ids.take(ties + 1), ids.take(ties))
        bad[ties[later.to_numpy(zero_copy_only=False)]] = True
    drops = np.flatnonzero(bad)
    if not len(drops):
        return table
    lo, hi = unsorted_window(created, drops)
    window = table.slice(lo, hi - lo)
    window = window.take(pc.sort_indices(window, sort_keys=SESSION_SORT))
    return pa.concat_tables([table.slice(0, lo), window, table.slice(hi)])


def _in_order(table: pa.Table) -> bool:
    """Whether ``table`` is by created_at then session id already (the usual case:
    segments are sealed oldest first), checked a batch (a segment) at a time: the whole
    column as integers, and its steps, held 16 MB more at 1M sessions while every segment
    is held, the read's peak memory."""
    last: tuple[int, str] | None = None  # the batch before's last (created_at, id)
    for batch in table.select(["created_at", "session_id"]).to_batches():
        if not batch.num_rows:
            continue
        created = _stamps(batch.column(0))
        ids = batch.column(1)
        # Across the boundary with the batch before (code points order as UTF-8 bytes do).
        if last is not None and (int(created[0]), str(ids[0].as_py())) < last:
            return False
        step = np.diff(created)
        if (step < 0).any():
            return False
        ties = np.flatnonzero(step == 0)
        if len(ties) and pc.any(pc.less(ids.take(ties + 1), ids.take(ties))).as_py():
            return False
        last = (int(created[-1]), str(ids[-1].as_py()))
    return True


def _stamps(created: Column) -> np.ndarray:
    """``created_at`` as integers, a missing one first of all."""
    integers = created.cast(pa.int64()).fill_null(pa.scalar(-(2**63), pa.int64()))
    return np.asarray(integers.to_numpy(), dtype=np.int64)


def calls_in_order(table: pa.Table) -> pa.Table:
    """``table`` (blocks of one session's calls, each in seq order) by session id: one id
    sorted per block, the rows then gathered (or sliced, when few blocks moved)."""
    n = table.num_rows
    if n < 2:
        return table
    ids = table["session_id"]
    after, before = ids.slice(1), ids.slice(0, n - 1)
    if not pc.any(pc.less(after, before)).as_py():
        # Ids never go down: the blocks are in id order already (a session's calls are one
        # block), the usual case. No id per block is taken (a million strings at 10M
        # calls) or sorted.
        return table
    changed = pc.not_equal(after, before).to_numpy(zero_copy_only=False)
    starts = np.concatenate([[0], np.flatnonzero(changed) + 1])
    order = pc.sort_indices(ids.take(pa.array(starts))).to_numpy()
    if not len(order) or bool((np.diff(order) == 1).all()):
        return table
    lengths = np.diff(np.append(starts, n))[order]
    begins = starts[order]
    offsets = np.cumsum(lengths) - lengths  # where each block lands
    rows = np.repeat(begins - offsets, lengths) + np.arange(n)
    return take_rows(table, rows)


def take_rows(table: pa.Table, rows: np.ndarray) -> pa.Table:
    """The rows numbered ``rows`` of ``table``, as slices when they form a few runs."""
    breaks = np.flatnonzero(np.diff(rows) != 1) + 1
    if not len(breaks) and len(rows) == table.num_rows and (not len(rows) or rows[0] == 0):
        return table  # every row, in order
    if len(breaks) > _RUNS:
        return table.take(pa.array(rows))
    starts = np.concatenate([[0], breaks]).tolist()
    ends = np.concatenate([breaks, [len(rows)]]).tolist()
    pieces = [table.slice(int(rows[a]), b - a) for a, b in zip(starts, ends, strict=True)]
    return pa.concat_tables(pieces) if pieces else table.schema.empty_table()
