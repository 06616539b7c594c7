"""spawnkit's own session store as DataFrames: ``sessions()``, ``tool_calls()``, ``usage()``.

The store is read as Arrow tables by :mod:`spawnkit.history.store_query` (large stores through
ADBC's SQLite driver in a child process, which hands over Arrow columns without building a
Python object per value; never a second SQLite library in this process). Timestamps
(ISO-8601 text in the store) are converted column-wise by Arrow, names are dictionary-encoded
into ``category`` columns, counts become nullable integers. Reads are read-only and closed
before returning; the store's writers (WAL mode) are never blocked.

Column names follow :data:`spawnkit.history.transcripts.SESSION_COLUMNS` where they apply
(``session_id``, ``started_at``, ``ended_at``, token columns, ``cost_usd``, ``cost_source``,
``n_tool_calls``), so store sessions and transcript sessions can be concatenated.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, date, datetime
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from ..home import default_store_path
from ..store import SessionStore
from .errors import HistoryError
from .frames import COST_SOURCES
from .pricing import PricingTable, default_pricing
from .rows import Column, timestamps
from .store_query import query, table_columns

StoreLike = SessionStore | str | Path | None
TimeLike = datetime | date | str | None
Names = str | Iterable[str] | None

_SESSION_SQL = """SELECT id AS session_id, butler, runtime, model, status, success, error_kind,
    error, trigger_source, duration_ms, input_tokens, output_tokens, cache_write_tokens,
    cache_read_tokens, cost_usd, num_turns, num_tool_calls AS n_tool_calls, trace_id,
    runtime_session_id, parent_session_id, created_at, started_at, completed_at AS ended_at,
    log_dir, {role} AS role FROM sessions"""
_SESSION_CATEGORIES = (
    "butler",
    "runtime",
    "model",
    "status",
    "error_kind",
    "trigger_source",
    "role",
)
_CALL_COLUMNS = ("session_id, seq, call_id, name, server, tool, input, status, started_at, "
                 "finished_at, duration_ms")  # fmt: skip
_TOKENS = ["input_tokens", "output_tokens", "cache_write_tokens", "cache_read_tokens"]


def _path(store: StoreLike) -> Path | None:
    """The store's file; None when the default store was never created (no history yet)."""
    if isinstance(store, SessionStore):
        return store.path
    if store is None:
        default = default_store_path()
        return default if default.exists() else None
    path = Path(store)
    if not path.exists():
        raise HistoryError(f"no session store at {path}")
    return path


def _utc(value: TimeLike) -> str | None:
    if value is None:
        return None
    if isinstance(value, str):
        value = pd.Timestamp(value).to_pydatetime()
    if not isinstance(value, datetime):
        value = datetime(value.year, value.month, value.day)
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    return value.astimezone(UTC).isoformat()


def _names(value: Names) -> list[str] | None:
    if value is None:
        return None
    return [value] if isinstance(value, str) else list(value)


def _where(
    butler: Names, runtime: Names, since: TimeLike, until: TimeLike, success: bool | None
) -> tuple[str, list[object]]:
    clauses: list[str] = []
    params: list[object] = []
    for column, names in (("butler", _names(butler)), ("runtime", _names(runtime))):
        if names is not None:
            clauses.append(f"{column} IN ({', '.join('?' * len(names))})" if names else "0")
            params.extend(names)
    if since is not None:
        clauses.append("created_at >= ?")
        params.append(_utc(since))
    if until is not None:
        clauses.append("created_at < ?")
        params.append(_utc(until))
    if success is not None:
        clauses.append("success = ?")
        params.append(int(success))
    return (" WHERE " + " AND ".join(clauses)) if clauses else "", params


def _frame(table: pa.Table, *, categories: tuple[str, ...], times: tuple[str, ...],
           ints: tuple[str, ...], floats: tuple[str, ...] = (), bools: tuple[str, ...] = ()
           ) -> pd.DataFrame:  # fmt: skip
    """Arrow columns retyped (the driver types an all-null column as int64), then pandas."""
    for name in table.column_names:
        i = table.schema.get_field_index(name)
        column: Column = table[name]
        if name in times:
            column = timestamps(column.cast(pa.string()))
        elif name in categories:
            column = pc.dictionary_encode(column.cast(pa.string()))
        elif name in ints:
            column = column.cast(pa.int64())
        elif name in floats:
            column = column.cast(pa.float64())
        elif name in bools:
            column = pc.not_equal(column.cast(pa.int64()), pa.scalar(0))
        elif pa.types.is_null(column.type) or (
            pa.types.is_integer(column.type) and column.null_count == len(column)
        ):
            column = column.cast(pa.string())
        table = table.set_column(i, name, column)
    return table.to_pandas(
        types_mapper={pa.int64(): pd.Int64Dtype(), pa.bool_(): pd.BooleanDtype()}.get
    )


def sessions(
    store: StoreLike = None,
    *,
    butler: Names = None,
    runtime: Names = None,
    since: TimeLike = None,
    until: TimeLike = None,
    success: bool | None = None,
    pricing: PricingTable | None = None,
) -> pd.DataFrame:
    """One row per recorded session, oldest first; filters combine with AND.

    ``since``/``until`` bound ``created_at`` (naive values are UTC; ``until`` is exclusive).
    ``cost_source`` is "reported" where the runtime reported a cost, "computed" where
    ``cost_usd`` was filled in from the pricing table, "unpriced" where neither was possible.
    """
    where, params = _where(butler, runtime, since, until, success)
    path = _path(store)
    # Stores written before schema 3 have no role column (read-only here: no migration).
    role = "role" if "role" in table_columns(path, "sessions") else "NULL"
    sql = _SESSION_SQL.format(role=role) + f"{where} ORDER BY created_at"
    frame = _frame(
        query(path, sql, params),
        categories=_SESSION_CATEGORIES,
        times=("created_at", "started_at", "ended_at"),
        ints=("duration_ms", *_TOKENS, "num_turns", "n_tool_calls"),
        floats=("cost_usd",),
        bools=("success",),
    )
    frame.insert(
        1, "source", pd.Series(pd.Categorical(["spawnkit"] * len(frame)), index=frame.index)
    )
    _fill_costs(frame, pricing or default_pricing())
    return frame


def _fill_costs(frame: pd.DataFrame, pricing: PricingTable) -> None:
    cost = np.array(frame["cost_usd"].to_numpy(dtype=np.float64, na_value=np.nan))
    source = np.where(np.isnan(cost), "unpriced", "reported").astype(object)
    tokens = {c: frame[c].to_numpy(dtype=np.float64, na_value=0.0) for c in _TOKENS}
    missing = np.isnan(cost)
    for model in frame.loc[missing, "model"].dropna().unique():
        prices = pricing.lookup(str(model))
        mask = missing & (frame["model"] == model).to_numpy()
        if prices is None or not mask.any():
            continue
        cost[mask] = prices.cost(
            tokens["input_tokens"][mask], tokens["output_tokens"][mask],
            tokens["cache_write_tokens"][mask], 0, tokens["cache_read_tokens"][mask],
        )  # fmt: skip
        source[mask] = "computed"
    frame["cost_usd"] = cost
    frame.insert(
        list(frame.columns).index("cost_usd") + 1,
        "cost_source",
        pd.Series(pd.Categorical(source, categories=COST_SOURCES), index=frame.index),
    )


def tool_calls(
    store: StoreLike = None,
    *,
    butler: Names = None,
    runtime: Names = None,
    since: TimeLike = None,
    until: TimeLike = None,
    success: bool | None = None,
    output: bool = False,
) -> pd.DataFrame:
    """One row per tool call, in session and call order; ``output=True`` adds the outputs.

    The session filters select the sessions whose calls are returned.
    """
    where, params = _where(butler, runtime, since, until, success)
    columns = _CALL_COLUMNS + (", output" if output else "")
    sql = f"SELECT {columns} FROM tool_calls"
    if where:
        sql += f" WHERE session_id IN (SELECT id FROM sessions{where})"
    table = query(_path(store), sql, params)
    return _frame(
        table,
        categories=("name", "server", "tool", "status"),
        times=("started_at", "finished_at"),
        ints=("seq", "duration_ms"),
    )


def usage(
    store: StoreLike = None,
    *,
    butler: Names = None,
    runtime: Names = None,
    since: TimeLike = None,
    until: TimeLike = None,
    success: bool | None = None,
    by: tuple[str, ...] = ("butler", "runtime", "model"),
    tz: str = "UTC",
    pricing: PricingTable | None = None,
) -> pd.DataFrame:
    """Sessions, tokens and cost per day (in ``tz``) and per ``by`` columns."""
    frame = sessions(store, butler=butler, runtime=runtime, since=since, until=until,
                     success=success, pricing=pricing)  # fmt: skip
    day = frame["created_at"].dt.tz_convert(tz).dt.strftime("%Y-%m-%d").rename("date")
    keys = [day, *(frame[c] for c in by)]
    grouped = frame.groupby(keys, observed=True, dropna=False)
    out = grouped[[*_TOKENS, "cost_usd"]].sum(min_count=1)
    out.insert(0, "sessions", grouped.size())
    out.insert(1, "failed", grouped["success"].agg(lambda s: int((s == False).sum())))  # noqa: E712
    return out.reset_index()
