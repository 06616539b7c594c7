"""One history frame as a Parquet file, written complete or not at all.

The frames a load has (:data:`FRAMES`) and how one is written: to a temporary name, then
renamed, with all-null columns typed as text so that files of several sources union.
:meth:`Transcripts.to_parquet <spawnkit.history.transcript_loader.Transcripts.to_parquet>`
and :func:`~spawnkit.history.export.export` both write through :func:`write_frame`.
"""

from __future__ import annotations

import os
from pathlib import Path

import pandas as pd
import pyarrow as pa

FRAMES = ("sessions", "tool_calls", "usage", "events", "files")


def _table(frame: pd.DataFrame) -> pa.Table:
    """A frame as Arrow, with all-null object columns typed as text (not Arrow's null type,
    which other sources' files could not be unioned with)."""
    table = pa.Table.from_pandas(frame, preserve_index=False)
    for i, field in enumerate(table.schema):
        if pa.types.is_null(field.type):
            table = table.set_column(i, field.name, table.column(i).cast(pa.string()))
    return table


def write_frame(frame: pd.DataFrame, path: Path) -> None:
    """Write ``frame`` at ``path`` (folders created), replacing a file there only when done."""
    # Imported here: pyarrow.parquet (with its filesystems) is 4 MB resident in every
    # process that imports spawnkit.history, and only writing a file needs it.
    import pyarrow.parquet as pq

    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        pq.write_table(_table(frame), tmp)
        tmp.replace(path)
    finally:
        tmp.unlink(missing_ok=True)
