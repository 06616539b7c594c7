"""What a transcript parser produces: column lists for three kinds of rows, plus file facts.

Every source (Claude Code, Codex, Gemini) is reduced to the same shapes before anything is
deduplicated, priced or aggregated, so the cache, the frames and the tests deal with one
format:

* usage rows: one per model response line (Claude repeats a response over several lines;
  deduplication happens later, across files, in :mod:`spawnkit.history.frames`);
* call rows: one per tool call the model made;
* result rows: one per tool result the CLI recorded;
* one :class:`FileFacts` per file: its session, project, time span, line counts and the
  numbers of the lines that could not be parsed.

Parsers keep timestamps as the ISO-8601 strings they read; :meth:`Rows.tables` converts them
column-wise with Arrow (a string that does not parse becomes null). Tool
inputs and outputs are kept as previews of at most :data:`INPUT_PREVIEW` and
:data:`OUTPUT_PREVIEW` characters, so the cache stays bounded whatever the tools returned.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, cast

import numpy as np
import pandas as pd
import pyarrow as pa
from msgspec import Raw

INPUT_PREVIEW = 200
OUTPUT_PREVIEW = 200
PROMPT_PREVIEW = 200
BAD_LINES_KEPT = 20
UTC_TS = pa.timestamp("ns", tz="UTC")
# pyarrow-stubs type arrays by their scalar type; these helpers take columns of any type.
Column = Any


def _fields(*pairs: tuple[str, pa.DataType]) -> list[pa.Field[Any]]:
    return [pa.field(name, kind) for name, kind in pairs]


USAGE_SCHEMA = pa.schema(
    _fields(
        ("path", pa.string()),
        ("session_id", pa.string()),
        ("message_id", pa.string()),
        ("request_id", pa.string()),
        ("timestamp", UTC_TS),
        ("model", pa.string()),
        ("input_tokens", pa.int64()),
        ("output_tokens", pa.int64()),
        ("cache_write_5m", pa.int64()),
        ("cache_write_1h", pa.int64()),
        ("cache_read_tokens", pa.int64()),
        ("is_sidechain", pa.bool_()),
        ("reported_cost", pa.float64()),
    )
)
CALL_SCHEMA = pa.schema(
    _fields(
        ("path", pa.string()),
        ("session_id", pa.string()),
        ("call_id", pa.string()),
        ("name", pa.string()),
        ("input", pa.string()),
        ("timestamp", UTC_TS),
        ("model", pa.string()),
        ("is_sidechain", pa.bool_()),
    )
)
RESULT_SCHEMA = pa.schema(
    _fields(
        ("path", pa.string()),
        ("session_id", pa.string()),
        ("call_id", pa.string()),
        ("timestamp", UTC_TS),
        ("is_error", pa.bool_()),
        ("output", pa.string()),
    )
)
FILE_SCHEMA = pa.schema(
    _fields(
        ("path", pa.string()),
        ("size", pa.int64()),
        ("mtime_ns", pa.int64()),
        ("session_id", pa.string()),
        ("project", pa.string()),
        ("cwd", pa.string()),
        ("version", pa.string()),
        ("first_prompt", pa.string()),
        ("first_timestamp", UTC_TS),
        ("last_timestamp", UTC_TS),
        ("lines", pa.int64()),
        ("bad_lines", pa.int64()),
        ("bad_line_numbers", pa.list_(pa.int64())),
        ("reported_cost", pa.float64()),
    )
)


@dataclass
class FileFacts:
    """What one file says about itself, beyond its rows."""

    path: str
    size: int
    mtime_ns: int
    session_id: str
    project: str
    cwd: str | None = None
    version: str | None = None
    first_prompt: str | None = None
    first_timestamp: str | None = None
    last_timestamp: str | None = None
    lines: int = 0
    bad_lines: int = 0
    bad_line_numbers: list[int] = field(default_factory=list)
    reported_cost: float | None = None

    def bad(self, line_number: int) -> None:
        """Count an unparseable line (1-based); keep the first few numbers."""
        self.bad_lines += 1
        if len(self.bad_line_numbers) < BAD_LINES_KEPT:
            self.bad_line_numbers.append(line_number)

    def seen(self, timestamp: str | None) -> None:
        if timestamp:
            if self.first_timestamp is None or timestamp < self.first_timestamp:
                self.first_timestamp = timestamp
            if self.last_timestamp is None or timestamp > self.last_timestamp:
                self.last_timestamp = timestamp


UsageRow = tuple[
    str, str | None, str | None, str, str | None, int, int, int, int, int, bool, float | None
]
"""session, message id, request id, timestamp, model, input, output, 5-minute cache write,
1-hour cache write, cache read, side chain, reported cost: the columns of USAGE_SCHEMA."""
CallRow = tuple[str, str, str, str, str, str | None, bool]
"""session, call id, name, input preview, timestamp, model, side chain."""
ResultRow = tuple[str, str, str, bool | None, str]
"""session, call id, timestamp, is error, output preview."""


class Rows:
    """Rows appended by parser runs, one file at a time (tuples: one append per row)."""

    def __init__(self) -> None:
        self.usage: list[UsageRow] = []
        self.calls: list[CallRow] = []
        self.results: list[ResultRow] = []
        self.files: list[FileFacts] = []
        self._counts: list[tuple[int, int, int]] = []
        self._mark = (0, 0, 0)

    def _sizes(self) -> tuple[int, int, int]:
        return len(self.usage), len(self.calls), len(self.results)

    def open_file(self) -> None:
        """Start the rows of a new file (its facts are added by :meth:`close_file`)."""
        self._mark = self._sizes()

    def close_file(self, facts: FileFacts) -> None:
        sizes = self._sizes()
        a, b, c = self._mark
        self._counts.append((sizes[0] - a, sizes[1] - b, sizes[2] - c))
        self.files.append(facts)
        self._mark = sizes

    def tables(self) -> RowTables:
        files: dict[str, list[object]] = {name: [] for name in FILE_SCHEMA.names}
        for facts in self.files:
            for name in FILE_SCHEMA.names:
                files[name].append(getattr(facts, name))
        paths = np.array([f.path for f in self.files], dtype=object)
        counts = np.array(self._counts, dtype=np.int64).reshape(-1, 3)

        def table(rows: list[Any], schema: pa.Schema, kind: int) -> pa.Table:
            path = pa.array(np.repeat(paths, counts[:, kind]), pa.string())
            # Tuples convert to a struct array in one C++ pass, faster than per column.
            fields = [f.with_type(pa.string()) if f.type == UTC_TS else f for f in schema]
            struct = pa.array(rows, type=pa.struct(fields[1:]))
            columns = [path, *pa.Table.from_struct_array(cast(pa.StructArray, struct)).columns]
            return pa.Table.from_arrays(_typed(columns, schema), schema=schema)

        file_columns = [pa.array(files[f.name], _raw(f).type) for f in FILE_SCHEMA]

        return RowTables(
            usage=table(self.usage, USAGE_SCHEMA, 0),
            calls=table(self.calls, CALL_SCHEMA, 1),
            results=table(self.results, RESULT_SCHEMA, 2),
            files=pa.Table.from_arrays(_typed(file_columns, FILE_SCHEMA), schema=FILE_SCHEMA),
        )


def _raw(field: pa.Field[Any]) -> pa.Field[Any]:
    return field.with_type(pa.string()) if field.type == UTC_TS else field


def _typed(columns: list[Any], schema: pa.Schema) -> list[Any]:
    return [timestamps(c) if f.type == UTC_TS else c for c, f in zip(columns, schema, strict=True)]


def timestamps(array: Column) -> Column:
    """ISO-8601 strings to UTC timestamps; a string that does not parse becomes null."""
    try:
        return array.cast(UTC_TS)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        values = pd.to_datetime(
            pd.Series(array.to_pylist(), dtype=object), utc=True, errors="coerce", format="ISO8601"
        )
        return pa.array(values.astype("datetime64[ns, UTC]"), UTC_TS)


@dataclass(frozen=True)
class RowTables:
    """The rows of a set of files as Arrow tables; every row knows its file by ``path``."""

    usage: pa.Table
    calls: pa.Table
    results: pa.Table
    files: pa.Table

    KINDS = ("usage", "calls", "results", "files")

    @classmethod
    def empty(cls) -> RowTables:
        return Rows().tables()


def preview(raw: Raw | bytes, limit: int) -> str:
    """The first ``limit`` characters of raw JSON text, a string value without its quotes."""
    text = memoryview(raw)[: limit * 4].tobytes().decode("utf-8", "replace")
    if len(text) > 1 and text[0] == '"' and text[-1] == '"':
        text = text[1:-1]
    return text[:limit]
