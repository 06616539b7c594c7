"""The typed columns of the store's history: what a session and a tool call are as Arrow.

One definition of the columns ``spawnkit.history.sessions()`` and ``tool_calls()`` return
(name, the SQL that reads it, and its kind), and of how a query's raw result is typed
(ISO-8601 text to UTC timestamps, names to dictionaries, counts to int64). It lives with
the store because the store itself keeps a columnar copy of its completed history
(:mod:`spawnkit.store.segments`), written as runs complete; the history frames read that
copy and the row store through the same definitions, so the two cannot disagree.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any, Literal

import pyarrow as pa
import pyarrow.compute as pc

Kind = Literal["str", "cat", "time", "int", "float", "bool"]
Field = tuple[str, str, Kind]
ROWID = "_rowid"
UTC_TS = pa.timestamp("ns", tz="UTC")

# (frame column, SQL expression, kind), in frame order.
SESSION_FIELDS: tuple[Field, ...] = (
    ("session_id", "id", "str"), ("butler", "butler", "cat"), ("runtime", "runtime", "cat"),
    ("model", "model", "cat"), ("role", "role", "cat"), ("kind", "kind", "cat"),
    ("sources", "(SELECT group_concat(value, ',') FROM json_each(sessions.sources))", "str"),
    ("status", "status", "cat"),
    ("success", "success", "bool"), ("error_kind", "error_kind", "cat"), ("error", "error", "str"),
    ("trigger_source", "trigger_source", "cat"), ("prompt", "prompt", "str"),
    ("duration_ms", "duration_ms", "int"), ("input_tokens", "input_tokens", "int"),
    ("output_tokens", "output_tokens", "int"), ("cache_write_tokens", "cache_write_tokens", "int"),
    ("cache_read_tokens", "cache_read_tokens", "int"), ("cost_usd", "cost_usd", "float"),
    ("num_turns", "num_turns", "int"), ("n_tool_calls", "num_tool_calls", "int"),
    ("trace_id", "trace_id", "str"), ("runtime_session_id", "runtime_session_id", "str"),
    ("parent_session_id", "parent_session_id", "str"), ("created_at", "created_at", "time"),
    ("started_at", "started_at", "time"), ("ended_at", "completed_at", "time"),
    ("log_dir", "log_dir", "str"),
)  # fmt: skip
CALL_FIELDS: tuple[Field, ...] = (
    ("session_id", "session_id", "str"), ("seq", "seq", "int"), ("call_id", "call_id", "str"),
    ("name", "name", "cat"), ("server", "server", "cat"), ("tool", "tool", "cat"),
    ("input", "input", "str"), ("status", "status", "cat"), ("started_at", "started_at", "time"),
    ("finished_at", "finished_at", "time"), ("duration_ms", "duration_ms", "int"),
)  # fmt: skip
ARROW: dict[Kind, pa.DataType] = {
    "str": pa.string(), "cat": pa.dictionary(pa.int32(), pa.string()), "time": UTC_TS,
    "int": pa.int64(), "float": pa.float64(), "bool": pa.bool_(),
}  # fmt: skip


def schema(fields: Sequence[Field]) -> pa.Schema:
    """The typed table of ``fields``, after the row's ``_rowid``."""
    return pa.schema([pa.field(ROWID, pa.int64())] + [pa.field(n, ARROW[k]) for n, _, k in fields])


SESSION_SCHEMA = schema(SESSION_FIELDS)
CALL_SCHEMA = schema(CALL_FIELDS)


def select(fields: Sequence[Field]) -> str:
    """The SELECT list of ``fields`` on SQLite, ``rowid`` first as ``_rowid``."""
    return ", ".join([f"rowid AS {ROWID}", *(f"{sql} AS {name}" for name, sql, _ in fields)])


# On a server: expressions SQLite writes its own way (a server has no rowid: ``_rowid`` is 0).
SERVER_SQL = {
    "sources": "CASE WHEN sources IS NULL THEN NULL ELSE (SELECT string_agg(value, ',') "
    "FROM json_array_elements_text(sessions.sources::json) AS value) END",
    # The server parses the ISO text itself and sends 8 bytes, not 32 to parse here.
    "created_at": "created_at::timestamptz",
    "started_at": "started_at::timestamptz",
    "ended_at": "completed_at::timestamptz",
    "finished_at": "finished_at::timestamptz",
}
SERVER_SESSION_ORDER = 'created_at, id COLLATE "C"'
"""How a server orders sessions (the byte order of ids, as Arrow sorts them)."""
SERVER_CALL_ORDER = 'session_id COLLATE "C", seq'
"""How a server orders tool calls (a server has no rowid): by session id's bytes, then seq."""


def server_select(fields: Sequence[Field]) -> str:
    """The SELECT list of ``fields`` on PostgreSQL, ``0`` first as ``_rowid``."""
    exprs = [f"{SERVER_SQL.get(name, sql)} AS {name}" for name, sql, _ in fields]
    return ", ".join([f"0::bigint AS {ROWID}", *exprs])


def typed(table: pa.Table, fields: Sequence[Field]) -> pa.Table:
    """Query results typed column by column (the driver types an all-null column as int64)."""
    columns = [table[ROWID].cast(pa.int64())]
    for name, _, kind in fields:
        column: Any = table[name]
        if kind == "time" and pa.types.is_timestamp(column.type):
            column = column.cast(UTC_TS)  # a server's timestamptz
        elif kind == "time":
            column = timestamps(column.cast(pa.string()))
        elif kind == "cat":
            column = pc.dictionary_encode(column.cast(pa.string()))
            if isinstance(column, pa.ChunkedArray) and column.num_chunks == 0:
                column = pa.array([], ARROW["cat"])
        elif kind == "bool":
            column = pc.not_equal(column.cast(pa.int64()), pa.scalar(0))
        else:
            column = column.cast(ARROW[kind])
        columns.append(column)
    return pa.Table.from_arrays(columns, schema=schema(fields))


def timestamps(array: Any) -> Any:
    """ISO-8601 strings to UTC timestamps; a string that does not parse becomes null."""
    try:
        return array.cast(UTC_TS)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return pa.array([_parse(v) for v in array.to_pylist()], UTC_TS)


def _parse(value: str | None) -> datetime | None:
    if value is None:
        return None
    try:
        stamp = datetime.fromisoformat(value)
    except ValueError:
        return None
    return stamp.replace(tzinfo=UTC) if stamp.tzinfo is None else stamp.astimezone(UTC)


def from_rows(names: Sequence[str], rows: Sequence[Sequence[object]]) -> pa.Table:
    """Rows of Python values (``sqlite3``'s) as an untyped Arrow table of ``names``."""
    columns = list(zip(*rows, strict=True)) if rows else [() for _ in names]
    return pa.table([_array(values) for values in columns], names=list(names))


def _array(values: Sequence[object]) -> Any:
    try:
        return pa.array(values)
    except (pa.ArrowInvalid, pa.ArrowTypeError):
        # SQLite's columns are dynamically typed; a column mixing text and numbers is text.
        return pa.array([None if v is None else str(v) for v in values], pa.string())
