"""The agent CLIs' own transcripts as DataFrames: ``transcripts("claude" | "codex" | "gemini")``.

Each source names where its CLI keeps transcripts, how to find the files and how to parse
one (:mod:`~spawnkit.history.claude`, :mod:`~spawnkit.history.codex`,
:mod:`~spawnkit.history.gemini`). Loading stats every file, parses only the files the cache
(:mod:`~spawnkit.history.cache`) does not hold at their current size and mtime, then builds
the frames (:mod:`~spawnkit.history.frames`). The result, :class:`Transcripts`, holds:

* ``sessions``: one row per session (the columns of :data:`SESSION_COLUMNS`);
* ``tool_calls``: one row per tool call, joinable on ``session_id``;
* ``usage``: one row per model response after deduplication, with its cost;
* ``files``: one row per file, with its count of unparseable lines (``bad_lines``) and the
  first of their line numbers; nothing is printed and nothing is fatal.
"""

from __future__ import annotations

import functools
import os
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, get_args

import numpy as np
import pandas as pd
import pyarrow as pa

from . import claude, codex, gemini
from .cache import FileStat, RowCache, cache_dir, keep_paths, merge, unchanged
from .errors import HistoryError
from .frames import (
    arrow_frame,
    as_category,
    as_int,
    deduplicate,
    drop_null_timestamps,
    first_rows,
    price,
    session_cost_source,
    tool_parts,
)
from .pricing import PricingTable, default_pricing
from .rows import FileFacts, Rows, RowTables
from .workers import default_workers, parse_in_workers

Source = Literal["claude", "codex", "gemini"]
SOURCES: tuple[str, ...] = get_args(Source)
MAX_FILE_BYTES = 2 << 30
CACHE_WRITE_TIMEOUT_S = 300.0

SESSION_COLUMNS = [
    "session_id", "source", "project", "cwd", "models", "started_at", "ended_at",
    "input_tokens", "output_tokens", "cache_write_tokens", "cache_read_tokens", "total_tokens",
    "cost_usd", "cost_source", "reported_cost_usd", "n_responses", "n_tool_calls",
    "n_tool_errors", "n_files", "bad_lines", "version", "first_prompt",
]  # fmt: skip
TOOL_CALL_COLUMNS = [
    "session_id", "source", "call_id", "name", "server", "tool", "model", "started_at",
    "finished_at", "duration_ms", "status", "is_error", "is_sidechain", "input", "output",
]  # fmt: skip


@dataclass(frozen=True)
class SourceFormat:
    """How one CLI stores transcripts."""

    name: str
    default_roots: Callable[[], list[Path]]
    discover: Callable[[Path], list[Path]]
    identify: Callable[[Path, Path], tuple[str, str]]
    parse: Callable[[bytes, FileFacts, Rows], None]


def _claude_roots() -> list[Path]:
    raw = os.environ.get("CLAUDE_CONFIG_DIR")
    if raw:
        candidates = [Path(p.strip()).expanduser() for p in raw.split(",") if p.strip()]
        return [p.parent if p.name == "projects" else p for p in candidates]
    xdg = Path(os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config")
    return [p for p in (xdg / "claude", Path.home() / ".claude") if (p / "projects").is_dir()]


FORMATS: dict[str, SourceFormat] = {
    "claude": SourceFormat(
        "claude", _claude_roots, claude.discover,
        lambda path, _root: claude.session_parts(path), claude.parse_claude_file,
    ),
    "codex": SourceFormat(
        "codex", codex.default_roots, codex.discover, codex.identify, codex.parse_codex_file
    ),
    "gemini": SourceFormat(
        "gemini", gemini.default_roots, gemini.discover, gemini.identify, gemini.parse_gemini_file
    ),
}  # fmt: skip


@dataclass(frozen=True)
class LoadStats:
    """What a load did: files seen, files parsed (not served from the cache), bytes parsed."""

    files: int
    parsed: int
    bytes_parsed: int
    bad_lines: int


@dataclass(frozen=True)
class Transcripts:
    """One source's history as DataFrames (see the module docstring)."""

    source: str
    roots: tuple[Path, ...]
    sessions: pd.DataFrame
    tool_calls: pd.DataFrame
    usage: pd.DataFrame
    files: pd.DataFrame
    stats: LoadStats

    def daily(self, tz: str = "UTC") -> pd.DataFrame:
        """Tokens and cost per calendar day in ``tz``, each response on its own day."""
        return daily_totals(self.usage, tz)


def daily_totals(usage: pd.DataFrame, tz: str = "UTC", by: Sequence[str] = ()) -> pd.DataFrame:
    day = usage["timestamp"].dt.tz_convert(tz).dt.strftime("%Y-%m-%d").rename("date")
    keys = [day, *(usage[c] for c in by)]
    sums = usage.groupby(keys, observed=True)[
        ["input_tokens", "output_tokens", "cache_write_tokens", "cache_read_tokens", "cost_usd"]
    ].sum(min_count=1)
    sums["responses"] = usage.groupby(keys, observed=True).size()
    sums.insert(4, "total_tokens", sums[["input_tokens", "output_tokens", "cache_write_tokens",
                                         "cache_read_tokens"]].sum(axis=1))  # fmt: skip
    return sums.reset_index()


def transcripts(
    source: Source,
    root: str | Path | Sequence[str | Path] | None = None,
    *,
    pricing: PricingTable | None = None,
    cache: bool = True,
    workers: int | None = None,
) -> Transcripts:
    """Load a CLI's transcripts; ``root`` defaults to the CLI's own folder(s).

    ``root`` is a Claude config folder (the one holding ``projects/``), a Codex home (holding
    ``sessions/``) or a Gemini home (holding ``tmp/``). With ``cache=False`` every file is
    parsed and nothing is written. ``workers`` processes parse large loads (default: one per
    core, at most 4, for loads over 32 MB; 1 parses in this process).
    """
    fmt = FORMATS.get(source)
    if fmt is None:
        raise HistoryError(f"unknown transcript source {source!r}; choose one of {SOURCES}")
    if root is None:
        roots = fmt.default_roots()
    elif isinstance(root, str | Path):
        roots = [Path(root).expanduser()]
    else:
        roots = [Path(r).expanduser() for r in root]
    for r in roots:
        if not r.is_dir():
            raise HistoryError(f"no {source} transcripts folder at {r}")
    rows = RowTables.empty()
    parsed = parsed_bytes = n_files = 0
    writes: list[threading.Thread] = []
    try:
        for r in roots:
            part, stats = _load_root(fmt, r, cache, workers, writes)
            rows = merge(rows, part) if rows.files.num_rows else part
            parsed, parsed_bytes = parsed + stats[0], parsed_bytes + stats[1]
            n_files += part.files.num_rows
        counts = (n_files, parsed, parsed_bytes)
        return build(fmt.name, tuple(roots), rows, pricing or default_pricing(), counts)
    finally:
        for thread in writes:
            thread.join(CACHE_WRITE_TIMEOUT_S)


def _load_root(
    fmt: SourceFormat,
    root: Path,
    use_cache: bool,
    workers: int | None,
    writes: list[threading.Thread],
) -> tuple[RowTables, tuple[int, int]]:
    stats: list[FileStat] = []
    for path in fmt.discover(root):
        try:
            st = path.stat()
        except OSError:
            continue  # removed between listing and stat: it is no longer part of the history
        stats.append(FileStat(str(path), st.st_size, st.st_mtime_ns))
    store = RowCache(cache_dir(fmt.name, root)) if use_cache else None
    cached = store.read() if store else None
    keep = unchanged(cached, stats) if cached is not None else set()
    todo = [s for s in stats if s.path not in keep]
    fresh = parse_files(fmt, root, todo, workers)
    if cached is None:
        rows = fresh
    elif not todo and len(keep) == cached.files.num_rows:
        return cached, (0, 0)
    else:
        rows = merge(keep_paths(cached, keep), fresh)
    if store is not None:
        writes.append(store.write_in_background(rows))
    return rows, (len(todo), sum(s.size for s in todo))


def parse_files(
    fmt: SourceFormat, root: Path, files: Sequence[FileStat], workers: int | None = None
) -> RowTables:
    """Rows of ``files``, in their order; several worker processes for large loads."""
    count = default_workers(sum(s.size for s in files)) if workers is None else workers
    if count > 1 and len(files) > 1:
        parse = functools.partial(_parse_serial, fmt.name, root)
        return parse_in_workers(parse, files, [s.size for s in files], count)
    return _parse_serial(fmt.name, root, files)


def _parse_serial(source: str, root: Path, files: Sequence[FileStat]) -> RowTables:
    fmt = FORMATS[source]
    rows = Rows()
    for stat in files:
        path = Path(stat.path)
        session, project = fmt.identify(path, root)
        facts = FileFacts(stat.path, stat.size, stat.mtime_ns, session, project)
        rows.open_file()
        try:
            if stat.size > MAX_FILE_BYTES:
                raise OSError(f"larger than {MAX_FILE_BYTES} bytes")
            data = path.read_bytes()
        except OSError:
            facts.bad(0)  # line 0: the file itself could not be read
        else:
            fmt.parse(data, facts, rows)
        rows.close_file(facts)
    return rows.tables()


def build(
    source: str,
    roots: tuple[Path, ...],
    rows: RowTables,
    pricing: PricingTable,
    counts: tuple[int, int, int],
) -> Transcripts:
    files = arrow_frame(rows.files)
    usage_table, dropped = drop_null_timestamps(rows.usage)
    usage_table = usage_table.take(deduplicate(usage_table)).drop_columns(["path"])
    usage = price(arrow_frame(usage_table), pricing)
    usage["cache_write_tokens"] = usage["cache_write_5m"] + usage["cache_write_1h"]
    usage.insert(1, "source", source)
    as_category(usage, "source", "model", "session_id")
    calls, more = _tool_calls(source, rows)
    # Rows whose timestamp did not parse are counted against their file, not lost silently.
    unplaced = pd.Series([*dropped, *more], dtype=object).value_counts()
    files["bad_lines"] = files["bad_lines"] + files["path"].map(unplaced).fillna(0).astype("Int64")
    sessions = _sessions(source, usage, calls, files)
    files.insert(0, "source", source)
    stats = LoadStats(counts[0], counts[1], counts[2], int(files["bad_lines"].sum()))
    return Transcripts(source, roots, sessions, calls, usage.reset_index(drop=True), files, stats)


def _tool_calls(source: str, rows: RowTables) -> tuple[pd.DataFrame, list[str]]:
    calls_table, dropped_calls = drop_null_timestamps(rows.calls)
    results_table, dropped_results = drop_null_timestamps(rows.results)
    calls_table = _first(calls_table, ["session_id", "call_id"])
    results_table = _first(results_table, ["session_id", "call_id"])
    calls = arrow_frame(calls_table.drop_columns(["path"]))
    results = arrow_frame(results_table.drop_columns(["path"]))
    calls = calls.rename(columns={"timestamp": "started_at"})
    results = results.rename(columns={"timestamp": "finished_at"})
    frame = calls.merge(results, on=["session_id", "call_id"], how="left", sort=False)
    frame["duration_ms"] = (
        ((frame["finished_at"] - frame["started_at"]).dt.total_seconds() * 1000)
        .round()
        .astype("Int64")
    )
    has_result = frame["finished_at"].notna()
    frame["status"] = pd.Categorical(
        np.where(
            ~has_result, "no_result", np.where(frame["is_error"].fillna(False), "error", "ok")
        ),
        categories=["ok", "error", "no_result"],
    )
    frame["server"], frame["tool"] = tool_parts(frame["name"])
    frame["source"] = source
    as_category(frame, "source", "name", "model")
    return frame[TOOL_CALL_COLUMNS].reset_index(drop=True), dropped_calls + dropped_results


def _first(table: pa.Table, keys: list[str]) -> pa.Table:
    """The first row of each key; no copy when every key is already unique."""
    keep = first_rows(table, keys)
    return table if len(keep) == table.num_rows else table.take(keep)


def _sessions(
    source: str, usage: pd.DataFrame, calls: pd.DataFrame, files: pd.DataFrame
) -> pd.DataFrame:
    by_file = files.groupby("session_id", sort=False)
    main = files.sort_values("path", kind="stable").drop_duplicates("session_id")
    frame = main.set_index("session_id")[["project", "cwd", "version", "first_prompt"]].copy()
    frame["started_at"] = by_file["first_timestamp"].min()
    frame["ended_at"] = by_file["last_timestamp"].max()
    frame["n_files"] = by_file.size()
    frame["bad_lines"] = by_file["bad_lines"].sum()
    frame["reported_cost_usd"] = by_file["reported_cost"].sum(min_count=1)
    grouped = usage.groupby("session_id", observed=True, sort=False)
    sums = grouped[
        ["input_tokens", "output_tokens", "cache_write_tokens", "cache_read_tokens"]
    ].sum()
    frame = frame.join(sums)
    frame["cost_usd"] = grouped["cost_usd"].sum(min_count=1)
    frame["cost_source"] = session_cost_source(
        usage["session_id"].astype(str), usage["cost_source"]
    )
    # A session the table cannot price fully takes the cost its CLI reported, if any.
    fallback = frame["reported_cost_usd"].notna() & frame["cost_source"].isin(
        ["unpriced", "partial"]
    ) | (frame["cost_source"].isna() & frame["reported_cost_usd"].notna())
    frame.loc[fallback, "cost_usd"] = frame.loc[fallback, "reported_cost_usd"]
    frame.loc[fallback, "cost_source"] = "reported"
    frame["n_responses"] = grouped.size()
    pairs = usage[["session_id", "model"]].dropna().drop_duplicates()
    models: dict[str, list[str]] = {}
    for sid, model in zip(pairs["session_id"].astype(str), pairs["model"].astype(str), strict=True):
        models.setdefault(sid, []).append(model)
    frame["models"] = pd.Series(
        [sorted(models.get(sid, ())) for sid in frame.index], index=frame.index, dtype=object
    )
    frame["n_tool_calls"] = calls.groupby("session_id", sort=False).size()
    errors = calls.loc[(calls["status"] == "error").to_numpy(), "session_id"]
    frame["n_tool_errors"] = errors.value_counts()
    for column in ("n_responses", "n_tool_calls", "n_tool_errors", *TOKEN_COLUMNS_NO_TOTAL):
        frame[column] = frame[column].fillna(0)
    frame["total_tokens"] = frame[TOKEN_COLUMNS_NO_TOTAL].sum(axis=1)
    frame["source"] = source
    frame = frame.reset_index()
    as_int(frame, *TOKEN_COLUMNS_NO_TOTAL, "total_tokens", "n_responses", "n_tool_calls",
           "n_tool_errors", "n_files", "bad_lines")  # fmt: skip
    as_category(frame, "source", "project")
    frame = frame.sort_values("started_at", kind="stable", na_position="last")
    return frame[SESSION_COLUMNS].reset_index(drop=True)


TOKEN_COLUMNS_NO_TOTAL = [
    "input_tokens",
    "output_tokens",
    "cache_write_tokens",
    "cache_read_tokens",
]
