"""Copying a SQLite session store into PostgreSQL: ``spawnkit store migrate --to URL``.

A team that outgrows the per-machine SQLite file moves its history into the shared
server. :func:`migrate_store` copies every table the two engines share (sessions, tool
calls, MCP calls, butler state, memory episodes, the CLIs' spans), batch by batch, each
batch in one server transaction:

1. the batch goes into a temporary table shaped like the target one;
2. the rows the target does not hold yet are inserted (``NOT EXISTS`` on the table's key);
3. the batch's rows are counted again in the target: every one must now be there.

So it is idempotent (a second run, or a run after an interrupted one, copies nothing it
copied before) and verified (each table reports its source rows, how many were copied,
how many were already there, and how many of them the target holds: never fewer).

Keys: a table's primary key where it has one (sessions, tool calls, state). MCP calls and
episodes have ids of their own on each engine, so a row is matched by its content (the
same butler, time stamp, tool or prompt, and so on): the server gives copied rows new
ids, in the source's order. A state key the server already holds keeps the server's value.
The SQLite file is brought to the current schema first and otherwise only read; the
transcripts `spawnkit history import` keeps stay in it (the server has no table for them).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from ..errors import StoreError
from .backend import Row, Transaction, is_postgres_url, redact_url
from .postgres import PostgresBackend
from .sqlite import SqliteBackend

BATCH_ROWS = 2000


@dataclass(frozen=True)
class _Table:
    name: str
    # Columns that identify a row: equal values (nulls equal too) mean the same row.
    key: tuple[str, ...]
    # The column the engine numbers itself (never copied), if any.
    serial: str | None = None
    # Key columns that may be null: matched with IS NOT DISTINCT FROM, the others with =
    # (which lets the server join a batch on an index or a hash).
    nullable: tuple[str, ...] = ()


# In the order that keeps a session before the rows that name it.
TABLES = (
    _Table("sessions", ("id",)),
    _Table("tool_calls", ("session_id", "seq")),
    _Table(
        "mcp_calls",
        ("butler", "called_at", "tool", "session_key", "arguments"),
        "id",
        ("session_key", "arguments"),
    ),
    _Table("state", ("butler", "key")),
    _Table("episodes", ("butler", "created_at", "session_id", "prompt"), "id", ("session_id",)),
    _Table("cli_spans", ("session_id", "trace_id", "span_id")),
    # A log event or metric point: no id of its own, the same one is the same content.
    _Table("cli_events", ("session_id", "kind", "name", "time_ns", "attributes")),
)


@dataclass(frozen=True)
class TableCopy:
    """What migrating one table did."""

    name: str
    source: int
    copied: int
    present: int  # of the source rows, how many the target holds afterwards

    @property
    def already(self) -> int:
        return self.source - self.copied

    @property
    def verified(self) -> bool:
        return self.present >= self.source


@dataclass(frozen=True)
class MigrationReport:
    source: Path
    target: str  # the URL without its password
    tables: tuple[TableCopy, ...]

    @property
    def verified(self) -> bool:
        return all(t.verified for t in self.tables)


def migrate_store(source: Path, url: str) -> MigrationReport:
    """Copy the SQLite store at ``source`` into the PostgreSQL store at ``url``."""
    if not is_postgres_url(url):
        raise StoreError(
            f"migrate copies into a PostgreSQL store: {url!r} is not a postgresql:// URL"
        )
    if not source.is_file():
        raise StoreError(f"no session store at {source}")
    sqlite = SqliteBackend(source)  # brings an older file to the current schema
    try:
        server = PostgresBackend(url)
        try:
            tables = tuple(_copy_table(sqlite, server, table) for table in TABLES)
        except server.errors as exc:
            raise server.error(exc) from exc
        finally:
            server.close()
    except sqlite.errors as exc:
        raise sqlite.error(exc) from exc
    finally:
        sqlite.close()
    return MigrationReport(source, redact_url(url), tables)


def _source_batches(db: SqliteBackend, table: str) -> Iterator[Sequence[Row]]:
    last = 0
    while True:
        rows = db.query(
            f"SELECT rowid AS _rowid, * FROM {table} WHERE rowid > ? ORDER BY rowid LIMIT ?",
            (last, BATCH_ROWS),
        )
        if not rows:
            return
        yield rows
        last = int(rows[-1]["_rowid"])


def _columns(server: PostgresBackend, table: _Table, source: SqliteBackend) -> list[str]:
    """The columns both engines' tables have, minus the one the server numbers."""
    theirs = {
        r["name"] for r in source.query(f"SELECT name FROM pragma_table_info('{table.name}')")
    }
    ours = server.query(
        "SELECT column_name FROM information_schema.columns WHERE table_schema = current_schema() "
        "AND table_name = ? ORDER BY ordinal_position",
        (table.name,),
    )
    return [
        r["column_name"] for r in ours
        if r["column_name"] in theirs and r["column_name"] != table.serial
    ]  # fmt: skip


def _copy_table(source: SqliteBackend, server: PostgresBackend, table: _Table) -> TableCopy:
    columns = _columns(server, table, source)
    names = ", ".join(columns)
    match = " AND ".join(
        f"t.{k} IS NOT DISTINCT FROM b.{k}" if k in table.nullable else f"t.{k} = b.{k}"
        for k in table.key
    )
    total = copied = present = 0
    for batch in _source_batches(source, table.name):
        with server.transaction() as tx:
            _load_batch(tx, table.name, columns, batch)
            copied += tx.execute(
                f"INSERT INTO {table.name} ({names}) SELECT {names} FROM migrate_batch b "
                f"WHERE NOT EXISTS (SELECT 1 FROM {table.name} t WHERE {match}) ORDER BY b._order"
            )
            found = tx.query(
                f"SELECT count(*) AS n FROM migrate_batch b "
                f"WHERE EXISTS (SELECT 1 FROM {table.name} t WHERE {match})"
            )
            present += int(found[0]["n"])
            total += len(batch)
    return TableCopy(table.name, total, copied, present)


def _load_batch(tx: Transaction, table: str, columns: list[str], rows: Sequence[Row]) -> None:
    tx.execute(
        f"CREATE TEMP TABLE migrate_batch ON COMMIT DROP AS "
        f"SELECT {', '.join(columns)}, 0 AS _order FROM {table} WITH NO DATA"
    )
    placeholders = ", ".join("?" for _ in range(len(columns) + 1))
    tx.executemany(
        f"INSERT INTO migrate_batch ({', '.join(columns)}, _order) VALUES ({placeholders})",
        [(*(row[c] for c in columns), n) for n, row in enumerate(rows)],
    )
