"""What a transcript parser produces: column lists for three kinds of rows, plus file facts.

Every source (Claude Code, Codex, Gemini) is reduced to the same shapes before anything is
deduplicated, priced or aggregated, so the cache, the frames and the tests deal with one
format:

* usage rows: one per model response line (Claude repeats a response over several lines;
  deduplication happens later, across files, in :mod:`spawnkit.history.frames`);
* call rows: one per tool call the model made;
* result rows: one per tool result the CLI recorded;
* event rows: one per thing that happened besides responses and tools (an API error, a
  context compaction, a turn's duration, a rate-limit snapshot), see :data:`EVENT_KINDS`;
* one :class:`FileFacts` per file: its session, project, time span, line counts, the numbers
  of the lines that could not be parsed, what its header says (git branch, CLI version,
  policies, the parent of a fork) and, for a file not read at all, why.

Every row carries the number of the line it came from, so a row whose timestamp turns out
not to parse is reported as a bad line by file and line like any other. Parsers keep
timestamps as the ISO-8601 strings they read; :meth:`Rows.tables` converts them column-wise
with Arrow (a string that does not parse becomes null). Tool
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
        ("line", pa.int64()),
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
        ("thinking_tokens", pa.int64()),
        ("tool_prompt_tokens", pa.int64()),
        ("is_sidechain", pa.bool_()),
        ("reported_cost", pa.float64()),
        ("agent_id", pa.string()),
        ("agent_type", pa.string()),
        ("skill", pa.string()),
        ("plugin", pa.string()),
        ("service_tier", pa.string()),
        ("stop_reason", pa.string()),
        ("web_search_requests", pa.int64()),
        ("web_fetch_requests", pa.int64()),
    )
)
CALL_SCHEMA = pa.schema(
    _fields(
        ("path", pa.string()),
        ("line", pa.int64()),
        ("session_id", pa.string()),
        ("call_id", pa.string()),
        ("name", pa.string()),
        ("input", pa.string()),
        ("timestamp", UTC_TS),
        ("model", pa.string()),
        ("is_sidechain", pa.bool_()),
        ("agent_id", pa.string()),
    )
)
RESULT_SCHEMA = pa.schema(
    _fields(
        ("path", pa.string()),
        ("line", pa.int64()),
        ("session_id", pa.string()),
        ("call_id", pa.string()),
        ("timestamp", UTC_TS),
        ("is_error", pa.bool_()),
        ("output", pa.string()),
    )
)
EVENT_SCHEMA = pa.schema(
    _fields(
        ("path", pa.string()),
        ("line", pa.int64()),
        ("session_id", pa.string()),
        ("timestamp", UTC_TS),
        ("kind", pa.string()),
        ("value", pa.float64()),
        ("detail", pa.string()),
    )
)
EVENT_KINDS = ("api_error", "compaction", "turn_duration", "rate_limit", "replay_skipped")
"""``api_error``: value is the HTTP status when known (429 is a rate limit), detail its kind;
``compaction``: value is the context size before it, detail the trigger; ``turn_duration``:
value in milliseconds; ``rate_limit``: value is the percent used, detail the window
("primary 300 min"); ``replay_skipped``: a forked or spawned Codex session's copy of its
parent's history, value is the tokens not counted again."""

# What a file's header or lines say about the session, kept as text (null when absent).
META_FIELDS = (
    "title", "git_branch", "git_commit", "git_repo_url", "entrypoint", "permission_mode",
    "originator", "model_provider", "effort", "approval_policy", "sandbox_policy",
    "parent_session_id", "forked_from_id", "agent_kind",
)  # fmt: skip
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
        ("context_window", pa.int64()),
        *((name, pa.string()) for name in META_FIELDS),
        ("skip_reason", pa.string()),
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
    context_window: int | None = None
    title: str | None = None
    git_branch: str | None = None
    git_commit: str | None = None
    git_repo_url: str | None = None
    entrypoint: str | None = None
    permission_mode: str | None = None
    originator: str | None = None
    model_provider: str | None = None
    effort: str | None = None
    approval_policy: str | None = None
    sandbox_policy: str | None = None
    parent_session_id: str | None = None
    forked_from_id: str | None = None
    agent_kind: str | None = None
    skip_reason: str | None = None
    title_rank: int = 0  # how authoritative ``title`` is (not a column)

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

    def set_title(self, title: str | None, rank: int) -> None:
        """Keep the most authoritative title seen (a user's own over a generated one)."""
        if title and rank >= self.title_rank:
            self.title, self.title_rank = title[:PROMPT_PREVIEW], rank

    def skip(self, reason: str) -> None:
        """Mark the file as not read at all (it is not a transcript), saying why."""
        self.skip_reason = reason


UsageRow = tuple[
    int,
    str,
    str | None,
    str | None,
    str,
    str | None,
    int,
    int,
    int,
    int,
    int,
    int | None,
    int | None,
    bool,
    float | None,
    str | None,
    str | None,
    str | None,
    str | None,
    str | None,
    str | None,
    int | None,
    int | None,
]
"""line, session, message id, request id, timestamp, model, input, output (without
thinking), 5-minute cache write, 1-hour cache write, cache read, thinking, tool-prompt
tokens, side chain, reported cost, agent id, agent type, skill, plugin, service tier, stop
reason, web searches, web fetches: the columns of USAGE_SCHEMA after ``path``."""
CallRow = tuple[int, str, str, str, str, str, str | None, bool, str | None]
"""line, session, call id, name, input preview, timestamp, model, side chain, agent id."""
ResultRow = tuple[int, str, str, str, bool | None, str]
"""line, session, call id, timestamp, is error, output preview."""
EventRow = tuple[int, str, str, str, float | None, str | None]
"""line, session, timestamp, kind, value, detail."""


class Rows:
    """Rows appended by parser runs, one file at a time (tuples: one append per row)."""

    def __init__(self) -> None:
        self.usage: list[UsageRow] = []
        self.calls: list[CallRow] = []
        self.results: list[ResultRow] = []
        self.events: list[EventRow] = []
        self.files: list[FileFacts] = []
        self._counts: list[tuple[int, int, int, int]] = []
        self._mark = (0, 0, 0, 0)

    def _sizes(self) -> tuple[int, int, int, int]:
        return len(self.usage), len(self.calls), len(self.results), len(self.events)

    def open_file(self) -> None:
        """Start the rows of a new file (its facts are added by :meth:`close_file`)."""
        self._mark = self._sizes()

    def close_file(self, facts: FileFacts) -> None:
        sizes = self._sizes()
        a, b, c, d = self._mark
        self._counts.append((sizes[0] - a, sizes[1] - b, sizes[2] - c, sizes[3] - d))
        self.files.append(facts)
        self._mark = sizes

    def tables(self) -> RowTables:
        files: dict[str, list[object]] = {name: [] for name in FILE_SCHEMA.names}
        for facts in self.files:
            for name in FILE_SCHEMA.names:
                files[name].append(getattr(facts, name))
        paths = pa.array([f.path for f in self.files], pa.string())
        counts = np.array(self._counts, dtype=np.int64).reshape(-1, 4)
        numbers = np.arange(len(self.files))

        def table(rows: list[Any], schema: pa.Schema, kind: int) -> pa.Table:
            # Each file's path once per row: taken in C++ (converting a repeated list of
            # Python strings cost several times as much).
            path = paths.take(np.repeat(numbers, counts[:, kind]))
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
            events=table(self.events, EVENT_SCHEMA, 3),
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
    events: pa.Table
    files: pa.Table

    KINDS = ("usage", "calls", "results", "events", "files")

    @classmethod
    def empty(cls) -> RowTables:
        return Rows().tables()


def preview(raw: Raw | bytes, limit: int) -> str:
    """The first ``limit`` characters of raw JSON text, a string value without its quotes."""
    text = memoryview(raw)[: limit * 4].tobytes().decode("utf-8", "replace")
    if len(text) > 1 and text[0] == '"' and text[-1] == '"':
        text = text[1:-1]
    return text[:limit]
