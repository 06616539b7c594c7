"""Repairing a damaged session store: every readable row into a fresh file, nothing lost quietly.

``spawnkit store check --repair`` calls :func:`repair_store`. It never edits the damaged
file: it reads it read-only, table by table, copies every row it can still read into a
new store with the current schema, keeps the damaged file beside it as
``sessions.db.damaged-<time>``, and only then moves the new file into place. The work
is generic over tables (whatever tables the damaged file has, including ones this
version does not know, are carried over), so a store that holds credentials, state or
anything added later loses none of it without a report saying which table lost rows.

Reading a damaged table: a scan in rowid order stops at the first damaged page; the
rows after it are found by looking rowids up one by one (each lookup walks the b-tree
from the root, so it passes a damaged leaf) until one answers, and the scan resumes
from there. A lookup that fails counts as an unreadable row. Indexes are not copied:
the new file builds its own, so damage confined to an index loses nothing.
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from urllib.parse import quote

from ..errors import StoreError
from .schema import SCHEMA as STORE_SCHEMA
from .schema import SCHEMA_VERSION
from .session_store import SessionStore
from .sqlite import check_store

# Rowids probed past the last readable row when the table's largest rowid is unreadable.
PROBE_WITHOUT_MAX = 100_000
# Tables whose loss must be named on its own: they hold what a user cannot re-create.
PRECIOUS_TABLES = ("credentials",)
# Tables derived from the others (the columnar copy of the history, spawnkit.store.segments),
# which name rows by rowid: not carried over, made again from the repaired rows.
DERIVED_TABLES = ("history_segments",)


@dataclass(frozen=True)
class TableSalvage:
    """What was read from one table of the damaged file."""

    name: str
    recovered: int
    unreadable: int
    # False when even the table's rows could not be enumerated (its root page is gone).
    reachable: bool = True

    @property
    def complete(self) -> bool:
        return self.reachable and self.unreadable == 0


@dataclass(frozen=True)
class RepairReport:
    """The outcome of :func:`repair_store`; ``backup`` is None when nothing needed repair."""

    path: Path
    backup: Path | None
    tables: tuple[TableSalvage, ...] = ()

    @property
    def complete(self) -> bool:
        return all(t.complete for t in self.tables)

    @property
    def lost_precious(self) -> list[str]:
        return [t.name for t in self.tables if t.name in PRECIOUS_TABLES and not t.complete]


def _quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _connect_read_only(path: Path) -> sqlite3.Connection:
    conn = sqlite3.connect(f"file:{quote(path.as_posix())}?mode=ro", uri=True, timeout=15)
    conn.row_factory = sqlite3.Row
    return conn


def _tables(damaged: sqlite3.Connection) -> dict[str, str | None]:
    """Table name -> its CREATE statement, from the damaged file, else today's schema."""
    try:
        rows = damaged.execute(
            "SELECT name, sql FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'"
        ).fetchall()
        return {row["name"]: row["sql"] for row in rows}
    except sqlite3.DatabaseError:
        fresh = sqlite3.connect(":memory:")
        try:
            fresh.executescript(STORE_SCHEMA)
            names = fresh.execute(
                "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'"
            ).fetchall()
        finally:
            fresh.close()
        return {name: None for (name,) in names}


def _scan(conn: sqlite3.Connection, table: str, after: int | None) -> Iterator[sqlite3.Row]:
    where = "" if after is None else "WHERE rowid > ?"
    params = () if after is None else (after,)
    yield from conn.execute(
        f"SELECT rowid AS _rowid_, * FROM {_quote(table)} {where} ORDER BY rowid", params
    )


def _largest_rowid(conn: sqlite3.Connection, table: str) -> int | None:
    try:
        row = conn.execute(f"SELECT max(rowid) FROM {_quote(table)}").fetchone()
    except sqlite3.DatabaseError:
        return None
    return None if row is None or row[0] is None else int(row[0])


def salvage_rows(conn: sqlite3.Connection, table: str) -> tuple[list[sqlite3.Row], int, bool]:
    """Every readable row of ``table``: (rows, unreadable rowids, whether it was reachable)."""
    rows: list[sqlite3.Row] = []
    unreadable = 0
    last: int | None = None
    try:
        for row in _scan(conn, table, None):
            rows.append(row)
            last = row["_rowid_"]
        return rows, 0, True
    except sqlite3.DatabaseError:
        pass
    largest = _largest_rowid(conn, table)
    if largest is None and last is None:
        # Neither the first rows nor the last one can be read: probe from the start.
        limit = PROBE_WITHOUT_MAX
    else:
        limit = largest if largest is not None else (last or 0) + PROBE_WITHOUT_MAX
    rowid = (last or 0) + 1
    while rowid <= limit:
        try:
            found = conn.execute(
                f"SELECT rowid AS _rowid_, * FROM {_quote(table)} WHERE rowid = ?", (rowid,)
            ).fetchone()
        except sqlite3.DatabaseError:
            unreadable += 1
            rowid += 1
            continue
        if found is None:
            rowid += 1
            continue
        rows.append(found)
        last = rowid
        try:  # readable again: scan on from here until the next damaged page
            for row in _scan(conn, table, last):
                rows.append(row)
                last = row["_rowid_"]
            break
        except sqlite3.DatabaseError:
            rowid = last + 1
    # Nothing read and no largest rowid: the table's root page itself is gone.
    return rows, unreadable, bool(rows) or largest is not None


def _copy(target: sqlite3.Connection, table: str, rows: list[sqlite3.Row]) -> None:
    if not rows:
        return
    columns = {row[1] for row in target.execute(f"PRAGMA table_info({_quote(table)})")}
    names = [name for name in rows[0].keys() if name in columns]  # noqa: SIM118 - a Row iterates values
    placeholders = ", ".join("?" for _ in names)
    target.executemany(
        f"INSERT OR REPLACE INTO {_quote(table)} ({', '.join(map(_quote, names))}) "
        f"VALUES ({placeholders})",
        [tuple(row[name] for name in names) for row in rows],
    )


def _backup_name(path: Path) -> Path:
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    return path.with_name(f"{path.name}.damaged-{stamp}")


def repair_store(path: Path) -> RepairReport:
    """Rebuild the damaged store at ``path`` from every row still readable; see the module.

    A healthy store is left alone (``backup`` is None). Raises :class:`StoreError` when
    the file is missing or was written by a newer spawnkit.
    """
    health = check_store(path)
    if health.healthy:
        return RepairReport(path, None)
    if not path.exists():
        raise StoreError(f"{path} does not exist: there is nothing to repair")
    if health.schema_version is not None and health.schema_version > SCHEMA_VERSION:
        raise StoreError(f"{path}: {health.problems[0]}; upgrade spawnkit instead of repairing")
    fresh = path.with_name(f"{path.name}.repair-{os.getpid()}")
    for leftover in (fresh, *(fresh.with_name(fresh.name + s) for s in ("-wal", "-shm"))):
        leftover.unlink(missing_ok=True)
    damaged = _connect_read_only(path)
    try:
        tables = _tables(damaged)
        SessionStore(fresh).close()  # today's schema, migrated and owner-only
        target = sqlite3.connect(fresh, isolation_level=None)
        salvaged = []
        try:
            target.execute("BEGIN IMMEDIATE")
            for name, create in tables.items():
                rows, unreadable, reachable = salvage_rows(damaged, name)
                known = target.execute(
                    "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (name,)
                ).fetchone()
                if known is None and create:
                    target.execute(create)  # a table this version does not know: keep it
                if name in DERIVED_TABLES:
                    rows = []  # rebuilt from the rows: they may have lost rows these hold
                if known is not None or create:
                    _copy(target, name, rows)
                salvaged.append(TableSalvage(name, len(rows), unreadable, reachable))
            # Rowids are renumbered and rows may be lost: copies of the history kept by
            # readers (spawnkit.history's per-home caches) must not trust the new file.
            target.execute("UPDATE history_epoch SET epoch = epoch + 1")
            target.execute("COMMIT")
            target.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        finally:
            target.close()
    except BaseException:
        for leftover in (fresh, *(fresh.with_name(fresh.name + s) for s in ("-wal", "-shm"))):
            leftover.unlink(missing_ok=True)
        raise
    finally:
        damaged.close()
    backup = _backup_name(path)
    path.replace(backup)
    for suffix in ("-wal", "-shm"):
        companion = path.with_name(path.name + suffix)
        if companion.exists():
            companion.replace(backup.with_name(backup.name + suffix))
    for suffix in ("-wal", "-shm"):
        fresh.with_name(fresh.name + suffix).unlink(missing_ok=True)
    fresh.replace(path)
    return RepairReport(path, backup, tuple(salvaged))
