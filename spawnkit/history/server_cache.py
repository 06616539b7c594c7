"""A local columnar cache of a PostgreSQL store's sessions, refreshed with what changed.

Bringing a million sessions over the connection takes seconds however it is done (ADBC
moves 324 MB of Arrow columns for them). So, as :mod:`spawnkit.history.store_cache` does
for a SQLite file, the typed session columns are kept in
``$SPAWNKIT_HOME/history-cache/server-<hash>/sessions.arrow`` (memory-mapped; the hash is
of the URL without its password) and each read asks the server only for what changed.

What changed is told by schema 7 of :mod:`spawnkit.store.postgres`: every inserted or
updated session row carries the id of the transaction that wrote it (``change_xid``), a
deleted one leaves a tombstone (``deleted_sessions``) with the deleting transaction's id.
A read runs in one REPEATABLE READ snapshot and notes the oldest transaction still running
when the snapshot was taken (``pg_snapshot_xmin``): every transaction older than that was
finished, so its changes are in what was read, and the next read asks only for rows and
tombstones with ``change_xid`` at or above it. A transaction that was still running
(however long it then takes to commit) has an id at or above the mark, so no change is
missed; rows seen twice are merged by session id (the newer replaces the older). Unlike a
sequence number, which a transaction takes before a later one commits first, a
transaction id compared against a snapshot's horizon needs no lock on the writers.

The cache is used only for the database it was read from: the server's
``system_identifier``, the database's oid and the store's random ``token`` must all agree
(another server, a database made again, or a restored copy elsewhere reads everything
again), and so must the ``epoch`` a TRUNCATE bumps. The file is rewritten, aside and then
renamed, when it is missing or when what changed reaches :data:`REWRITE_ROWS` (or 5%);
otherwise the few changed rows are merged in memory each time.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..home import spawnkit_home
from ..store.backend import redact_url
from ..store.columns import SERVER_SESSION_ORDER
from . import server_query, server_segments
from .rows import Column
from .server_segments import take_rows
from .store_cache import load_matching, save_table

FORMAT = "spawnkit-server-cache-1"
REWRITE_ROWS = 10_000
"""The cache is written again once this many changed rows (or 5%) are merged into it."""
ORDER = SERVER_SESSION_ORDER

_MARKED = "SELECT to_regclass('history_epoch') IS NOT NULL AS marked"
_IDENTITY = """SELECT (SELECT system_identifier FROM pg_control_system())::text AS system,
    (SELECT oid FROM pg_database WHERE datname = current_database())::bigint AS database,
    token, epoch, pg_snapshot_xmin(pg_current_snapshot())::text::bigint AS horizon
    FROM history_epoch WHERE id = 1"""


@dataclass(frozen=True)
class ServerState:
    """Which database this is (server, oid, token), its epoch, and the snapshot's horizon."""

    identity: str
    epoch: int
    horizon: int


class ServerCache:
    """The cached session table of one PostgreSQL store."""

    def __init__(self, url: str) -> None:
        digest = hashlib.sha256(redact_url(url).encode()).hexdigest()[:16]
        self.directory = spawnkit_home() / "history-cache" / f"server-{digest}"

    def read(self, kind: str, state: ServerState, schema: pa.Schema) -> tuple[pa.Table, int] | None:
        """The cached table and its mark, if it was read from this database as it is now."""
        found = load_matching(
            self.directory / f"{kind}.arrow", schema,
            format=FORMAT, identity=state.identity, epoch=state.epoch,
        )  # fmt: skip
        if found is None:
            return None
        table, info = found
        return table, int(info["mark"])

    def write(self, kind: str, state: ServerState, table: pa.Table) -> None:
        info = {"format": FORMAT, "identity": state.identity, "epoch": state.epoch,
                "mark": state.horizon}  # fmt: skip
        save_table(self.directory, kind, table, info)


def cached_sessions(
    url: str, select: str, typed: Callable[[pa.Table], pa.Table], schema: pa.Schema
) -> pa.Table | None:
    """Every session of the store at ``url``, in :data:`ORDER`, through the cache; None
    for a store older than schema 7 (no change markers: read it directly).

    ``select`` is the ``SELECT … FROM sessions`` of the cached columns (no WHERE),
    ``typed`` turns its result into ``schema``'s columns.
    """
    cache = ServerCache(url)
    with server_query.snapshot(url) as run:
        if not run(_MARKED, ()).to_pylist()[0]["marked"]:
            return None  # migrated when a SessionStore next opens it
        row = run(_IDENTITY, ()).to_pylist()[0]
        state = ServerState(
            f"{row['system']}:{row['database']}:{row['token']}", int(row["epoch"]),
            int(row["horizon"]),
        )  # fmt: skip
        found = cache.read("sessions", state, schema)
        if found is None:
            sealed = server_segments.read(run, calls=False)
            table = (
                sealed.sessions
                if sealed is not None
                else typed(run.large(f"{select} ORDER BY {ORDER}", ()))
            )
            cache.write("sessions", state, table)
            return table
        base, mark = found
        tail = typed(run.read(f"{select} WHERE change_xid >= ? ORDER BY {ORDER}", (mark,)))
        gone = run("SELECT id FROM deleted_sessions WHERE change_xid >= ?", (mark,))
    stale = pa.concat_arrays(
        [tail["session_id"].combine_chunks(), gone["id"].combine_chunks().cast(pa.string())]
    )
    table = merge(base, tail, stale)
    changed = tail.num_rows + gone.num_rows
    if changed >= max(REWRITE_ROWS, base.num_rows // 20):
        cache.write("sessions", state, table)
    return table


def merge(base: pa.Table, tail: pa.Table, stale: Column) -> pa.Table:
    """``base`` (in created_at, session_id order) without the rows whose id is in ``stale``,
    with ``tail`` (in the same order) merged in: one gather of the rows, or slices of the
    base when the changes fall in a few places (new sessions come last)."""
    rows = np.arange(base.num_rows)
    if len(stale):
        drop = pc.is_in(base["session_id"], value_set=stale).to_numpy(zero_copy_only=False)
        if drop.any():
            rows = rows[~drop]
    if not tail.num_rows:
        return take_rows(base, rows)
    created = base["created_at"].cast(pa.int64()).to_numpy()[rows]
    added = tail["created_at"].cast(pa.int64()).to_numpy()
    both = pa.concat_tables([base, tail])
    if np.isin(added, created).any():
        # A tie on created_at that only the ids order: one sort of what is kept.
        kept = take_rows(both, np.concatenate([rows, base.num_rows + np.arange(tail.num_rows)]))
        order = pc.sort_indices(
            kept, sort_keys=[("created_at", "ascending"), ("session_id", "ascending")]
        )
        return kept.take(order)
    places = np.searchsorted(created, added, side="right")
    return take_rows(both, np.insert(rows, places, base.num_rows + np.arange(tail.num_rows)))
