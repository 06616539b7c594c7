"""Queries on a PostgreSQL session store as Arrow tables, through ADBC.

A store on a server (:mod:`spawnkit.store.postgres`) is read by ADBC's PostgreSQL driver
(``adbc-driver-postgresql``), which turns the server's binary COPY output straight into
Arrow columns: no Python object per value (INFRA: 1M rows in about 1.2 s, against 13 s
through psycopg rows). Unlike SQLite's driver it shares no library with the store's
writers, so it runs in this process. The SQL is the one :mod:`spawnkit.history.store_frames`
writes for SQLite, with ``?`` placeholders numbered for the server, and the tables are
retyped the same way; the server's ``spawnkit`` schema comes first in the search path.
Messages name the URL without its password.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import pyarrow as pa

from ..store.backend import SERVER_SCHEMA, redact_url
from .errors import HistoryError

_PLACEHOLDER = re.compile(r"\?")


def numbered(sql: str) -> str:
    """``?`` placeholders as the server's ``$1``, ``$2``… (no query of ours quotes a ``?``)."""
    counter = iter(range(1, 1 << 30))
    return _PLACEHOLDER.sub(lambda _: f"${next(counter)}", sql)


def query(url: str, sql: str, params: Sequence[object] = ()) -> pa.Table:
    """Run ``sql`` (``?`` placeholders) read-only on the store at ``url``, into Arrow."""
    with _adbc(url, "READ COMMITTED") as run:
        return run(sql, params)


Run = Callable[[str, Sequence[object]], pa.Table]


class Snapshot:
    """Queries in one read-only REPEATABLE READ transaction on the store (what one finds
    agrees with what another does), through psycopg: a small result as an Arrow table
    built from its rows (calling it, a :data:`Run`), a segment's blob as bytes in binary
    form, and a large result through ADBC's columns in the same snapshot (exported to a
    second connection, opened then only).

    A first read of a store with segments asks only for blobs and a few rows: ADBC there
    cost its import (``pyarrow.dataset``, its driver's libpq) and put every blob in Arrow's
    own pool before it was decoded, where what it freed was not reused by the frame.
    """

    def __init__(self, url: str, conn: Any) -> None:
        self._url = url
        self._conn = conn
        self._exported: str | None = None

    def __call__(self, sql: str, params: Sequence[object] = ()) -> pa.Table:
        from ..store.columns import from_rows

        with self._conn.cursor() as cur:
            cur.execute(_formatted(sql), list(params) if params else None)
            names = [column.name for column in cur.description or ()]
            return from_rows(names, cur.fetchall())

    def blob(self, sql: str, params: Sequence[object] = ()) -> bytes | None:
        """The one value of ``sql`` (a ``bytea``) as bytes: the result is freed on return."""
        with self._conn.cursor(binary=True) as cur:
            cur.execute(_formatted(sql), list(params) if params else None)
            row = cur.fetchone()
        return None if row is None else bytes(row[0])

    def read(self, sql: str, params: Sequence[object] = ()) -> pa.Table:
        """``sql``'s result, from rows when it has a few (counted first), else through
        :meth:`large`: the rows a read adds to its segments are few, unless a store was
        just migrated or a cache is far behind."""
        from .store_query import SMALL_ROWS

        counted = self(f"SELECT count(*) AS n FROM ({sql}) AS counted", params)
        small = int(counted[0][0].as_py()) <= SMALL_ROWS
        return self(sql, params) if small else self.large(sql, params)

    def large(self, sql: str, params: Sequence[object] = ()) -> pa.Table:
        """``sql``'s result through ADBC (columns, no row objects), in this snapshot."""
        if self._exported is None:
            self._exported = str(self._conn.execute("SELECT pg_export_snapshot()").fetchone()[0])
        with _adbc(self._url, "REPEATABLE READ", self._exported) as run:
            return run(sql, params)


@contextmanager
def snapshot(url: str) -> Iterator[Snapshot]:
    """A :class:`Snapshot` of the store at ``url``, for the block."""
    import psycopg

    try:
        conn = psycopg.connect(
            url, autocommit=True, application_name="spawnkit-history",
            options=f"-c search_path={SERVER_SCHEMA} -c jit=off",
        )  # fmt: skip
    except psycopg.Error as exc:
        raise HistoryError(
            f"cannot reach the session store {redact_url(url)}: {_first_line(exc, url)}"
        ) from exc
    try:
        with conn:
            conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
            yield Snapshot(url, conn)
    except psycopg.Error as exc:
        raise HistoryError(
            f"cannot read the session store {redact_url(url)}: {_first_line(exc, url)}"
        ) from exc


@contextmanager
def _adbc(url: str, level: str, exported: str | None = None) -> Iterator[Run]:
    """A function running queries (``?`` placeholders) on the store at ``url`` into Arrow
    through ADBC, all in one read-only transaction at ``level`` (in the snapshot
    ``exported`` by another transaction, if given)."""
    from adbc_driver_postgresql import dbapi  # loads libpq: only when a server is read

    try:
        conn = dbapi.connect(url, autocommit=True)
    except dbapi.Error as exc:
        raise HistoryError(
            f"cannot reach the session store {redact_url(url)}: {_first_line(exc, url)}"
        ) from exc
    try:
        cursor: Any = conn.cursor()
        try:
            cursor.execute(f"SET search_path TO {SERVER_SCHEMA}")
            # One long scan: compiling it (JIT) costs more than it saves here.
            cursor.execute("SET jit = off")
            cursor.execute(f"BEGIN ISOLATION LEVEL {level} READ ONLY")
            if exported is not None:
                cursor.execute(f"SET TRANSACTION SNAPSHOT '{exported}'")

            def run(sql: str, params: Sequence[object] = ()) -> pa.Table:
                cursor.execute(numbered(sql), list(params) if params else None)
                return cursor.fetch_arrow_table()  # type: ignore[no-any-return]

            yield run
        finally:
            cursor.close()
    except dbapi.Error as exc:
        raise HistoryError(
            f"cannot read the session store {redact_url(url)}: {_first_line(exc, url)}"
        ) from exc
    finally:
        conn.close()  # ends the read-only transaction


def _formatted(sql: str) -> str:
    """``?`` placeholders as psycopg's ``%s`` (a literal ``%`` doubled)."""
    return sql.replace("%", "%%").replace("?", "%s")


def _first_line(exc: Exception, url: str) -> str:
    text = str(exc).strip().replace(url, redact_url(url))
    return text.splitlines()[0] if text else type(exc).__name__
