"""Run one query on a SQLite file with ADBC and write the result to stdout as Arrow IPC.

This file is executed as a script in a child process (``python -I _sqlite_arrow.py URI``),
never imported by spawnkit: it must not import the ``spawnkit`` package. The query and its
parameters arrive on stdin as one JSON object, ``{"sql": ..., "params": [...]}``.

Why a child process: the ADBC driver carries its own copy of SQLite. Two copies of SQLite in
one process break SQLite's locking (closing one copy's connection drops the POSIX locks the
other copy holds on the same file), and another process then deletes the live WAL: the
store is corrupted. A child process has locks of its own, so the parent's store stays safe.
"""

from __future__ import annotations

import json
import struct
import sys
from typing import Any

import adbc_driver_manager
import adbc_driver_sqlite
import pyarrow as pa

# One batch: column types are inferred from every row, not from the first few.
_BATCH_ROWS = str(100_000_000)


def main() -> int:
    uri = sys.argv[1]
    request = json.load(sys.stdin)
    try:
        table = _query(uri, request["sql"], request["params"] or [])
    except adbc_driver_manager.Error as exc:
        print(str(exc).strip().splitlines()[0] if str(exc).strip() else repr(exc), file=sys.stderr)
        return 1
    with pa.ipc.new_stream(sys.stdout.buffer, table.schema) as writer:  # type: ignore[arg-type]
        writer.write_table(table)
    return 0


def _query(uri: str, sql: str, params: list[object]) -> pa.Table:
    """The driver's own API, not its DB-API module: that one imports ``pyarrow.dataset``,
    which imports pandas."""
    database = adbc_driver_sqlite.connect(uri)
    try:
        conn = adbc_driver_manager.AdbcConnection(database)
        try:
            statement = adbc_driver_manager.AdbcStatement(conn)
            try:
                statement.set_options(**{"adbc.sqlite.query.batch_rows": _BATCH_ROWS})
                statement.set_sql_query(sql)
                if params:
                    names = [f"p{i}" for i in range(len(params))]
                    statement.bind(pa.record_batch([_param(p) for p in params], names=names))
                stream, _ = statement.execute_query()
                return pa.RecordBatchReader.from_stream(stream).read_all()
            finally:
                statement.close()
        finally:
            conn.close()
    finally:
        database.close()


def _param(value: object) -> pa.Array[Any]:
    """A parameter as an array of one, built from its bytes: ``pa.array`` would import
    pandas (to check whether the value is a pandas object), which this child never needs
    (a test checks the modules it loads)."""
    if value is None:
        return pa.nulls(1)
    if isinstance(value, bool | int):
        return pa.Array.from_buffers(pa.int64(), 1, [None, pa.py_buffer(struct.pack("<q", value))])
    if isinstance(value, float):
        return pa.Array.from_buffers(
            pa.float64(), 1, [None, pa.py_buffer(struct.pack("<d", value))]
        )
    data = str(value).encode()
    offsets = pa.py_buffer(struct.pack("<ii", 0, len(data)))
    return pa.Array.from_buffers(pa.string(), 1, [None, offsets, pa.py_buffer(data)])


if __name__ == "__main__":
    sys.exit(main())
