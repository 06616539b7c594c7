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
import sys

import pyarrow as pa
from adbc_driver_sqlite import dbapi

# One batch: column types are inferred from every row, not from the first few.
_BATCH_ROWS = str(100_000_000)


def main() -> int:
    uri = sys.argv[1]
    request = json.load(sys.stdin)
    try:
        conn = dbapi.connect(uri)
        try:
            cursor = conn.cursor()
            cursor.adbc_statement.set_options(**{"adbc.sqlite.query.batch_rows": _BATCH_ROWS})
            cursor.execute(request["sql"], request["params"] or None)
            table = cursor.fetch_arrow_table()
            cursor.close()
        finally:
            conn.close()
    except dbapi.Error as exc:
        print(str(exc).strip().splitlines()[0] if str(exc).strip() else repr(exc), file=sys.stderr)
        return 1
    with pa.ipc.new_stream(sys.stdout.buffer, table.schema) as writer:  # type: ignore[arg-type]
        writer.write_table(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
