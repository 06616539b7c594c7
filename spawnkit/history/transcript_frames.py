"""From the parsed rows of a source's files to the frames of :class:`Transcripts`.

``build`` deduplicates and prices the usage rows (:mod:`~spawnkit.history.frames`), joins tool
calls with their results, and sums everything per session. A session is every file that
names it (a Claude session's sub-agent files count towards it); what its files' headers say
(title, git branch, policies, parent) is taken from the first file that says it, in path
order, so from the main file before its sub-agents. A row whose timestamp does not parse is
not placed in time: it is counted as a bad line of its file, with its line number.
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np
import numpy.typing as npt
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from .frames import (
    TOKEN_COLUMNS,
    arrow_frame,
    as_category,
    as_int,
    codes,
    deduplicate,
    price,
    session_cost_source,
    tool_parts,
)
from .imported_files import PREFIX, machine_of
from .pricing import PricingTable
from .rows import BAD_LINES_KEPT, META_FIELDS, Column, RowTables

SESSION_COLUMNS = [
    "session_id", "source", "machine", "project", "cwd", "title", "models", "started_at",
    "ended_at", "input_tokens", "output_tokens", "thinking_tokens", "cache_write_tokens",
    "cache_read_tokens", "total_tokens", "cost_usd", "cost_source", "cost_estimated",
    "reported_cost_usd", "n_responses", "sidechain_tokens", "n_tool_calls", "n_tool_errors",
    "n_api_errors", "n_rate_limited", "n_compactions", "turn_duration_ms",
    "web_search_requests", "web_fetch_requests", "service_tier", "n_files", "bad_lines",
    "version", "first_prompt", "git_branch", "git_commit", "git_repo_url", "entrypoint",
    "permission_mode", "originator", "model_provider", "effort", "approval_policy",
    "sandbox_policy", "context_window", "agent_kind", "parent_session_id", "forked_from_id",
    "rate_limit_primary_pct", "rate_limit_secondary_pct",
]  # fmt: skip
TOOL_CALL_COLUMNS = [
    "session_id", "source", "machine", "call_id", "name", "server", "tool", "model",
    "started_at", "finished_at", "duration_ms", "status", "is_error", "is_sidechain",
    "agent_id", "input", "output",
]  # fmt: skip
EVENT_COLUMNS = ["session_id", "source", "machine", "timestamp", "kind", "value", "detail",
                 "path", "line"]  # fmt: skip
STATUSES = ["ok", "error", "no_result"]
_SUMMED = [*TOKEN_COLUMNS, "web_search_requests", "web_fetch_requests"]


def daily_totals(usage: pd.DataFrame, tz: str = "UTC", by: Sequence[str] = ()) -> pd.DataFrame:
    """Tokens and cost per calendar day in ``tz`` (and per ``by`` columns)."""
    day = usage["timestamp"].dt.tz_convert(tz).dt.strftime("%Y-%m-%d").rename("date")
    keys = [day, *(usage[c] for c in by)]
    grouped = usage.groupby(keys, observed=True)
    sums = grouped[TOKEN_COLUMNS].sum()
    sums["cost_usd"] = grouped["cost_usd"].sum(min_count=1)
    sums["responses"] = grouped.size()
    sums.insert(len(TOKEN_COLUMNS), "total_tokens", sums[TOKEN_COLUMNS].sum(axis=1))
    return sums.reset_index()


def _placed(table: pa.Table) -> tuple[pa.Table, pa.Table]:
    """The rows whose timestamp parsed, and ``(path, line)`` of those whose did not."""
    if table["timestamp"].null_count == 0:
        return table, table.select(["path", "line"]).slice(0, 0)
    valid = pc.is_valid(table["timestamp"])
    return table.filter(valid), table.filter(pc.invert(valid)).select(["path", "line"])


def _with_unplaced(files: pd.DataFrame, unplaced: list[pa.Table]) -> None:
    """Count rows that could not be placed in time as bad lines of their files, by number."""
    lost = pa.concat_tables(unplaced).to_pandas()
    if lost.empty:
        return
    numbers = lost.drop_duplicates().groupby("path")["line"].agg(list)
    files["bad_lines"] = files["bad_lines"] + files["path"].map(numbers.map(len)).fillna(0).astype(
        "Int64"
    )
    files["bad_line_numbers"] = [
        sorted({*(known if known is not None else ()), *numbers.get(path, ())})[:BAD_LINES_KEPT]
        for path, known in zip(files["path"], files["bad_line_numbers"], strict=True)
    ]


def _constant(value: str, n: int) -> pd.Series:
    """A category column holding one value (cheaper than broadcasting a string)."""
    codes = np.zeros(n, dtype=np.int8)
    return pd.Series(pd.Categorical.from_codes(codes, categories=pd.Index([value])))


def _machines(paths: Column, here: str, rows: npt.NDArray[np.int64] | None = None) -> pd.Series:
    """The ``machine`` of each row (of the ``rows`` of ``paths`` if given), from its file's
    path (computed once per file)."""
    if len(paths) and not pc.any(pc.starts_with(paths, PREFIX)).as_py():
        # No imported file: all from this machine.
        return _constant(here, len(paths) if rows is None else len(rows))
    if rows is not None:
        paths = paths.take(rows)
    encoded: Column = pc.dictionary_encode(paths)
    if isinstance(encoded, pa.ChunkedArray):
        encoded = encoded.combine_chunks()
    names = [machine_of(str(p), here) for p in encoded.dictionary.to_pylist()]
    codes = np.asarray(encoded.indices, dtype=np.int64)
    uniques = sorted(set(names))
    lookup = np.array([uniques.index(n) for n in names], dtype=np.int64)
    values = lookup[codes] if len(codes) else codes
    return pd.Series(pd.Categorical.from_codes(values, categories=pd.Index(uniques)))


def build_frames(
    source: str, rows: RowTables, pricing: PricingTable, machine: str
) -> dict[str, pd.DataFrame]:
    """``sessions``, ``tool_calls``, ``usage``, ``events`` and ``files`` of parsed rows."""
    # The tool-call frame needs nothing of the usage frame: it is built on a second thread
    # meanwhile (Arrow, numpy and pandas' joins do most of their work without the GIL).
    with ThreadPoolExecutor(1, thread_name_prefix="spawnkit-history-frames") as pool:
        tool_calls = pool.submit(_tool_calls, source, rows, machine)
        return _build(source, rows, pricing, machine, tool_calls)


def _build(
    source: str,
    rows: RowTables,
    pricing: PricingTable,
    machine: str,
    tool_calls: Future[tuple[pd.DataFrame, list[pa.Table]]],
) -> dict[str, pd.DataFrame]:
    files = arrow_frame(rows.files)
    usage_table, lost_usage = _placed(rows.usage)
    kept = deduplicate(usage_table)
    usage_machines = _machines(usage_table["path"], machine, kept)
    usage_table = usage_table.drop_columns(["path", "line"]).take(kept)
    # Codex sessions too old to name their model are priced as gpt-5, as ccusage does.
    default = "gpt-5" if source == "codex" else None
    usage_categories = ("session_id", "model", "service_tier", "stop_reason", "agent_type",
                        "skill", "plugin")  # fmt: skip
    usage = arrow_frame(usage_table, usage_categories)
    usage = price(usage, pricing, default)
    usage.insert(len(usage.columns) - 3, "cache_write_tokens",
                 usage["cache_write_5m"] + usage["cache_write_1h"])  # fmt: skip
    usage.insert(1, "source", _constant(source, len(usage)))
    usage.insert(2, "machine", usage_machines.to_numpy())
    events_table, lost_events = _placed(rows.events)
    events = arrow_frame(events_table, ("kind",))
    events.insert(1, "source", _constant(source, len(events)))
    events.insert(2, "machine", _machines(events_table["path"], machine).to_numpy())
    calls, lost_calls = tool_calls.result()
    _with_unplaced(files, [lost_usage, *lost_calls, lost_events])
    files.insert(0, "source", source)
    files.insert(1, "machine", _machines(rows.files["path"], machine).to_numpy())
    read = files[files["skip_reason"].isna()]
    sessions = _sessions(source, usage, calls, events[EVENT_COLUMNS], read)
    return {
        "sessions": sessions,
        "tool_calls": calls,
        "usage": usage.reset_index(drop=True),
        "events": events[EVENT_COLUMNS].reset_index(drop=True),
        "files": files,
    }


def _tool_calls(source: str, rows: RowTables, machine: str) -> tuple[pd.DataFrame, list[pa.Table]]:
    """Each tool call (the first row of its session and call id) with its first result."""
    calls_table, lost_calls = _placed(rows.calls)
    results_table, lost_results = _placed(rows.results)
    # One integer key per (session, call id), over calls and results together: it finds the
    # first row of each call and result, and each call's result, without a string join.
    n = calls_table.num_rows
    keys = [
        codes(pa.chunked_array([*calls_table[c].chunks, *results_table[c].chunks], pa.string()))
        for c in ("session_id", "call_id")
    ]
    key = keys[0] * (int(keys[1].max(initial=0)) + 1) + keys[1]
    call_key, result_key = key[:n], key[n:]
    first_call = ~pd.Series(call_key, copy=False).duplicated().to_numpy()
    first_result = ~pd.Series(result_key, copy=False).duplicated().to_numpy()
    if not first_call.all():
        calls_table, call_key = calls_table.filter(first_call), call_key[first_call]
    if not first_result.all():
        results_table, result_key = results_table.filter(first_result), result_key[first_result]
    match = pd.Index(result_key).get_indexer(call_key)
    results_table = results_table.select(["timestamp", "is_error", "output"]).take(
        pa.array(match, mask=match < 0)
    )
    frame = arrow_frame(calls_table.drop_columns(["path", "line"]), ("name", "model"))
    frame = frame.rename(columns={"timestamp": "started_at"})
    frame["machine"] = _machines(calls_table["path"], machine).to_numpy()
    results = arrow_frame(results_table)
    frame["finished_at"] = results["timestamp"].array
    frame["is_error"] = results["is_error"].array
    frame["output"] = results["output"].array
    frame["duration_ms"] = (
        ((frame["finished_at"] - frame["started_at"]).dt.total_seconds() * 1000)
        .round()
        .astype("Int64")
    )
    has_result = match >= 0
    is_error = frame["is_error"].fillna(False).to_numpy(dtype=bool)
    status = np.where(has_result, np.where(is_error, 1, 0), 2).astype(np.int8)
    frame["status"] = pd.Categorical.from_codes(status, categories=pd.Index(STATUSES))
    frame["server"], frame["tool"] = tool_parts(frame["name"])
    frame["source"] = _constant(source, len(frame))
    return frame[TOOL_CALL_COLUMNS].reset_index(drop=True), [lost_calls, lost_results]


def _sessions(
    source: str,
    usage: pd.DataFrame,
    calls: pd.DataFrame,
    events: pd.DataFrame,
    files: pd.DataFrame,
) -> pd.DataFrame:
    by_file = files.sort_values("path", kind="stable").groupby("session_id", sort=False)
    # The first value a file gives, in path order: the main file's before its sub-agents'.
    frame = by_file[["machine", "project", "cwd", "version", "first_prompt", *META_FIELDS]].first()
    frame["context_window"] = by_file["context_window"].max()
    frame["started_at"] = by_file["first_timestamp"].min()
    frame["ended_at"] = by_file["last_timestamp"].max()
    frame["n_files"] = by_file.size()
    frame["bad_lines"] = by_file["bad_lines"].sum()
    frame["reported_cost_usd"] = by_file["reported_cost"].sum(min_count=1)
    grouped = usage.groupby("session_id", observed=True, sort=False)
    frame = frame.join(grouped[_SUMMED].sum())
    side = usage.loc[usage["is_sidechain"].fillna(False).to_numpy()]
    frame["sidechain_tokens"] = (
        side.groupby("session_id", observed=True)[TOKEN_COLUMNS].sum().sum(axis=1)
    )
    frame["cost_usd"] = grouped["cost_usd"].sum(min_count=1)
    frame["cost_source"] = session_cost_source(usage["session_id"], usage["cost_source"])
    frame["cost_estimated"] = grouped["cost_estimated"].any()
    frame["service_tier"] = grouped["service_tier"].last()
    # A session the table cannot price fully, or prices only by estimate, takes the cost its
    # CLI reported, if any.
    reported = frame["reported_cost_usd"].notna()
    fallback = reported & (
        frame["cost_source"].isin(["unpriced", "partial"])
        | frame["cost_source"].isna()
        | frame["cost_estimated"].fillna(False).astype(bool)
    )
    frame.loc[fallback, "cost_usd"] = frame.loc[fallback, "reported_cost_usd"]
    frame.loc[fallback, "cost_source"] = "reported"
    frame.loc[fallback, "cost_estimated"] = False
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
    _event_columns(frame, events)
    for column in ("n_responses", "n_tool_calls", "n_tool_errors", "sidechain_tokens",
                   "n_api_errors", "n_rate_limited", "n_compactions", *TOKEN_COLUMNS):  # fmt: skip
        frame[column] = frame[column].fillna(0)
    frame["total_tokens"] = frame[TOKEN_COLUMNS].sum(axis=1)
    frame["source"] = source
    frame.index.name = "session_id"
    frame = frame.reset_index()
    as_int(frame, *TOKEN_COLUMNS, "total_tokens", "n_responses", "n_tool_calls", "n_tool_errors",
           "n_files", "bad_lines", "sidechain_tokens", "n_api_errors", "n_rate_limited",
           "n_compactions", "web_search_requests", "web_fetch_requests",
           "context_window")  # fmt: skip
    frame["cost_estimated"] = frame["cost_estimated"].astype("boolean")
    as_category(frame, "source", "machine", "project", "service_tier", "entrypoint",
                "permission_mode", "originator", "model_provider", "effort", "approval_policy",
                "sandbox_policy", "agent_kind")  # fmt: skip
    frame = frame.sort_values("started_at", kind="stable", na_position="last")
    return frame[SESSION_COLUMNS].reset_index(drop=True)


def _event_columns(frame: pd.DataFrame, events: pd.DataFrame) -> None:
    """API errors (429s apart), compactions, time in turns, the last rate-limit snapshot."""
    if events.empty:
        for column in ("n_api_errors", "n_rate_limited", "n_compactions", "turn_duration_ms",
                       "rate_limit_primary_pct", "rate_limit_secondary_pct"):  # fmt: skip
            frame[column] = np.nan
        return
    kind = events["kind"].astype(str)
    errors = events[kind == "api_error"]
    frame["n_api_errors"] = errors.groupby("session_id").size()
    limited = (errors["value"] == 429) | errors["detail"].fillna("").str.contains("rate_limit")
    frame["n_rate_limited"] = errors[limited].groupby("session_id").size()
    frame["n_compactions"] = events[kind == "compaction"].groupby("session_id").size()
    turns = events[kind == "turn_duration"]
    frame["turn_duration_ms"] = turns.groupby("session_id")["value"].sum(min_count=1)
    limits = events[kind == "rate_limit"].sort_values("timestamp", kind="stable")
    for window in ("primary", "secondary"):
        part = limits[limits["detail"].fillna("").str.startswith(window)]
        frame[f"rate_limit_{window}_pct"] = part.groupby("session_id")["value"].last()
