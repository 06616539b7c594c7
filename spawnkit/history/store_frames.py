"""spawnkit's own session store as DataFrames: ``sessions()``, ``tool_calls()``, ``usage()``.

The store is read as Arrow tables by :mod:`spawnkit.history.store_query` (large stores through
ADBC's SQLite driver in a child process; never a second SQLite library in this process) and
typed column-wise: ISO-8601 text becomes UTC timestamps, names become ``category`` columns,
counts nullable integers. Filters (butler, runtime, status, kind, since/until, success) run in
the database. A large store is read through :mod:`spawnkit.history.store_cache`: its completed
history comes memory-mapped from a columnar cache, already typed, and only the rows after
the cache's watermark come from SQLite (filters then run on the cached columns and in the
query of the new rows). A PostgreSQL store's sessions go through
:mod:`spawnkit.history.server_cache` the same way, refreshed with the rows changed since
the last read. ``columns`` converts only the columns asked for. Reads are read-only and
closed before returning; the store's writers (WAL mode) are never blocked.

Column names follow :data:`spawnkit.history.SESSION_COLUMNS` where they apply
(``session_id``, ``started_at``, ``ended_at``, token columns, ``cost_usd``, ``cost_source``,
``n_tool_calls``), so store sessions and transcript sessions can be concatenated.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import date, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from ..home import default_store_path, store_setting
from ..store import SessionStore
from ..store.backend import is_postgres_url
from ..store.columns import (
    CALL_FIELDS,
    CALL_SCHEMA,
    SERVER_CALL_ORDER,
    SERVER_SESSION_ORDER,
    SERVER_SQL,
    SESSION_FIELDS,
    SESSION_SCHEMA,
    Field,
    typed,
)
from . import arrow_frames, server_cache, server_query, server_segments, store_segments
from .arrow_frames import Handed
from .errors import HistoryError
from .frames import COST_SOURCES
from .pricing import ModelPrice, PricingTable, default_pricing
from .rows import UTC_TS, Column
from .store_cache import ROWID, Cached, StoreCache, StoreState, store_state
from .store_query import CHILD_MIN_BYTES, SMALL_ROWS, count, query, store_bytes, table_columns

StoreLike = SessionStore | str | Path | None
# What is read: a SQLite file (None: no store yet) or a PostgreSQL URL (its password with it).
Source = Path | str | None

TimeLike = datetime | date | str | None
Names = str | Iterable[str] | None

CACHE_MIN_BYTES = CHILD_MIN_BYTES
"""Stores from this size are read through the columnar cache (smaller ones are fast anyway)."""
REWRITE_ROWS = 10_000
"""The cache is written again once this many rows (or 5%) are read past its watermark."""

# What a store written before a column existed holds in its place (read-only: no migration).
_SESSION_DEFAULTS = {"role": "NULL", "kind": "'run'", "sources": "NULL"}
SESSION_COLUMNS = [name for name, _, _ in SESSION_FIELDS]
_TOKENS = ["input_tokens", "output_tokens", "cache_write_tokens", "cache_read_tokens"]
_COST_INPUTS = ("model", "cost_usd", *_TOKENS)
_PRICED_AT_ONCE = 1 << 14
_REPORTED, _COMPUTED, _UNPRICED = (
    COST_SOURCES.index(s) for s in ("reported", "computed", "unpriced")
)
# On a server, the orders rowid gives on SQLite (a server has no rowid).
_SERVER_ORDER = {"created_at, rowid": SERVER_SESSION_ORDER, "rowid": SERVER_CALL_ORDER}


def store_source(store: StoreLike) -> Source:
    """The store's file (None when the default store was never created: no history yet),
    or the URL of a PostgreSQL store."""
    if isinstance(store, SessionStore):
        return store.source
    if store is None:
        chosen = store_setting()
        if chosen is not None and is_postgres_url(chosen):
            return chosen
        default = Path(chosen) if chosen is not None else default_store_path()
        return default if default.exists() else None
    if is_postgres_url(store):
        return str(store)
    path = Path(store)
    if not path.exists():
        raise HistoryError(f"no session store at {path}")
    return path


def _utc(value: TimeLike) -> pd.Timestamp | None:
    if value is None:
        return None
    stamp = pd.Timestamp(value)
    return stamp.tz_localize("UTC") if stamp.tzinfo is None else stamp.tz_convert("UTC")


def _names(value: Names) -> list[str] | None:
    if value is None:
        return None
    return [value] if isinstance(value, str) else list(value)


class Filters:
    """Session filters, as SQL for the database and as an Arrow mask for cached columns."""

    def __init__(self, butler: Names, runtime: Names, status: Names, since: TimeLike,
                 until: TimeLike, success: bool | None, kind: Names = None) -> None:  # fmt: skip
        self.names = {"butler": _names(butler), "runtime": _names(runtime),
                      "status": _names(status), "kind": _names(kind)}  # fmt: skip
        self.since, self.until, self.success = _utc(since), _utc(until), success

    def __bool__(self) -> bool:
        return any(v is not None for v in self.names.values()) or any(
            v is not None for v in (self.since, self.until, self.success)
        )

    def sql(self) -> tuple[str, list[object]]:
        clauses: list[str] = []
        params: list[object] = []
        for column, names in self.names.items():
            if names is not None:
                clauses.append(f"{column} IN ({', '.join('?' * len(names))})" if names else "1 = 0")
                params.extend(names)
        for op, value in ((">=", self.since), ("<", self.until)):
            if value is not None:
                clauses.append(f"created_at {op} ?")
                params.append(value.isoformat())
        if self.success is not None:
            clauses.append("success = ?")
            params.append(int(self.success))
        return (" WHERE " + " AND ".join(clauses)) if clauses else "", params

    def mask(self, table: pa.Table) -> Column:
        keep: Column = pa.array(np.ones(table.num_rows, dtype=bool))
        for column, names in self.names.items():
            if names is not None:
                values = pc.cast(table[column], pa.string())
                found: Column = pc.is_in(values, pa.array(names, pa.string()))
                keep = pc.and_(keep, pc.fill_null(found, False))
        for op, value in ((pc.greater_equal, self.since), (pc.less, self.until)):
            if value is not None:
                bound = pa.scalar(value.as_unit("ns"), UTC_TS)
                inside: Column = op(table["created_at"], bound)
                keep = pc.and_(keep, pc.fill_null(inside, False))
        if self.success is not None:
            same: Column = pc.equal(table["success"], pa.scalar(self.success))
            keep = pc.and_(keep, pc.fill_null(same, False))
        return keep


def _typed(table: pa.Table, fields: Sequence[Field]) -> pa.Table:
    return typed(table, fields)


def _select(fields: Sequence[Field], server: bool = False) -> str:
    exprs = [f"{SERVER_SQL.get(name, sql) if server else sql} AS {name}" for name, sql, _ in fields]
    return ", ".join([f"{'0::bigint' if server else 'rowid'} AS {ROWID}", *exprs])


def _sessions_from(path: Source) -> str:
    """``sessions``, or for an older store a view of it with the columns it lacks."""
    if isinstance(path, str):
        return "sessions"  # a server's schema is migrated when a store opens it
    missing = set(_SESSION_DEFAULTS) - set(table_columns(path, "sessions"))
    if not missing:
        return "sessions"
    added = ", ".join(f"{_SESSION_DEFAULTS[name]} AS {name}" for name in sorted(missing))
    return f"(SELECT rowid AS rowid, *, {added} FROM sessions) AS sessions"


def _read(path: Source, fields: Sequence[Field], table: str, where: str,
          params: Sequence[object], order: str, small: bool = False) -> pa.Table:  # fmt: skip
    if isinstance(path, str):
        sql = f"SELECT {_select(fields, True)} FROM {table}{where} ORDER BY {_SERVER_ORDER[order]}"
        return _typed(server_query.query(path, sql, params), fields)
    source = _sessions_from(path) if table == "sessions" else table
    sql = f"SELECT {_select(fields)} FROM {source}{where} ORDER BY {order}"
    return _typed(query(path, sql, params, small=small), fields)


def _use_cache(path: Source, cache: bool | None) -> StoreState | None:
    if path is None or isinstance(path, str) or cache is False:  # a server: no local cache
        return None
    if cache is None and store_bytes(path) < CACHE_MIN_BYTES:
        return None
    return store_state(path)


def _cached(path: Path, state: StoreState, kind: str, fields: Sequence[Field],
            schema: pa.Schema, done: str | None) -> pa.Table:  # fmt: skip
    """Everything in ``kind``: the cached rows and the rows past the watermark, cache updated.

    ``done`` names the column that says a row will not change any more (null: still open);
    rows without it are read again every time until they are done.
    """
    store = StoreCache(path)
    cached = store.read(kind, state, schema)
    base = cached.table if cached is not None else schema.empty_table()
    mark = cached.watermark if cached is not None else 0
    reopen = cached.open if cached is not None else ()
    table = "sessions" if kind == "sessions" else "tool_calls"
    where = " WHERE rowid > ?" + (
        f" OR rowid IN ({', '.join('?' * len(reopen))})" if reopen else ""
    )
    params = [mark, *reopen]
    # Counted first, by rowid (one range of the table's b-tree): a warm read's few new rows
    # are read here, without starting the child a large store's reads go through.
    small = cached is not None and count(path, table, where, params) <= SMALL_ROWS
    tail = _read(path, fields, table, where, params, "rowid", small)
    if tail.num_rows >= max(REWRITE_ROWS, base.num_rows // 20) or (
        cached is None and tail.num_rows
    ):
        finished = tail if done is None else tail.filter(pc.is_valid(tail[done]))
        still_open = (
            [] if done is None else tail.filter(pc.is_null(tail[done]))[ROWID].to_numpy().tolist()
        )
        high = pc.max(tail[ROWID]).as_py() or mark
        store.write(kind, state, Cached(pa.concat_tables([base, finished]), high,
                                        tuple(still_open)))  # fmt: skip
    return pa.concat_tables([base, tail]) if tail.num_rows else base


def _frame(table: Handed, columns: Sequence[str]) -> pd.DataFrame:
    """Selected columns as pandas; categories are the values present, sorted, so a frame is
    the same whether it came from the database or from the cache. The table is given away
    (no reference left in the caller): its Arrow memory is released column by column as
    pandas takes the values over, so a read never holds both whole."""
    return arrow_frames.frame(table, columns)


def _columns(asked: Sequence[str] | None, known: Sequence[str]) -> list[str]:
    if asked is None:
        return list(known)
    unknown = [c for c in asked if c not in known]
    if unknown:
        raise HistoryError(f"unknown columns {unknown}; choose from {list(known)}")
    return list(asked)


def _sessions_table(
    path: Source, filters: Filters, cache: bool | None, names: Sequence[str] | None = None
) -> pa.Table:
    """The sessions; read from the database, only the columns ``names`` (default: all)."""
    if isinstance(path, str) and cache is not False:  # a server: its cache, refreshed
        table = server_cache.cached_sessions(
            path, f"SELECT {_select(SESSION_FIELDS, True)} FROM sessions",
            lambda read: _typed(read, SESSION_FIELDS), SESSION_SCHEMA,
        )  # fmt: skip
        if table is not None:
            return table.filter(filters.mask(table)) if filters else table
    state = _use_cache(path, cache)
    if state is None or path is None or isinstance(path, str):
        where, params = filters.sql()
        fields = [f for f in SESSION_FIELDS if names is None or f[0] in names]
        return _read(path, fields, "sessions", where, params, "created_at, rowid")
    sealed = store_segments.read(path, calls=False)
    if sealed is not None:
        table = sealed.sessions
    else:
        table = _cached(path, state, "sessions", SESSION_FIELDS, SESSION_SCHEMA, "ended_at")
    if filters:
        table = table.filter(filters.mask(table))
    return _in_session_order(table)


def _in_session_order(table: pa.Table) -> pa.Table:
    """``table`` in the row store's order, ``created_at`` then rowid: sessions created at
    the same instant by two writers may have been sealed in either order."""
    if table.num_rows < 2 or _in_order(table):
        return table
    keys = ["created_at", *([ROWID] if ROWID in table.column_names else [])]
    return table.take(pc.sort_indices(table, sort_keys=[(key, "ascending") for key in keys]))


def _in_order(table: pa.Table) -> bool:
    """Whether ``table`` is by ``created_at`` then rowid already, checked a batch (a
    segment) at a time: a copy of a million keys would add to the read's peak memory."""
    rowid = ROWID in table.column_names
    last: tuple[np.ndarray, np.ndarray | None] | None = None
    for batch in table.to_batches():
        if not batch.num_rows:
            continue
        created = batch["created_at"].cast(pa.int64()).to_numpy(zero_copy_only=False)
        rowids = batch[ROWID].to_numpy(zero_copy_only=False) if rowid else None
        if last is not None:  # across the boundary with the batch before
            created = np.concatenate([last[0], created])
            if rowids is not None and last[1] is not None:
                rowids = np.concatenate([last[1], rowids])
        step = np.diff(created)
        disordered = step < 0
        if rowids is not None:
            disordered |= (step == 0) & (np.diff(rowids) < 0)
        if disordered.any():
            return False
        last = (created[-1:], None if rowids is None else rowids[-1:])
    return True


@arrow_frames.malloc_pool()
def sessions(
    store: StoreLike = None,
    *,
    butler: Names = None,
    runtime: Names = None,
    status: Names = None,
    kind: Names = None,
    since: TimeLike = None,
    until: TimeLike = None,
    success: bool | None = None,
    columns: Sequence[str] | None = None,
    pricing: PricingTable | None = None,
    cache: bool | None = None,
) -> pd.DataFrame:
    """One row per recorded session, oldest first; filters combine with AND.

    ``kind`` is what the session was: ``run`` (a butler's trigger), ``ask`` (a question
    about sources) or ``chat`` (an interactive session about them); ``sources`` names an
    ask's or a chat's sources, comma-separated (None for a run).

    ``since``/``until`` bound ``created_at`` (naive values are UTC; ``until`` is exclusive).
    ``cost_source`` is "reported" where the runtime reported a cost, "computed" where
    ``cost_usd`` was filled in from the pricing table, "unpriced" where neither was possible.
    ``columns`` keeps only those columns (``source`` and ``cost_source`` included when asked).
    ``cache`` forces the columnar cache on or off (default: on for SQLite stores from 24 MB
    and for every PostgreSQL store, whose cache is refreshed with the rows changed since).
    """
    cost = SESSION_COLUMNS.index("cost_usd") + 1
    known = [
        "session_id",
        "source",
        *SESSION_COLUMNS[1:cost],
        "cost_source",
        *SESSION_COLUMNS[cost:],
    ]
    wanted = _columns(columns, known)
    path = store_source(store)
    filters = Filters(butler, runtime, status, since, until, success, kind)
    costs = "cost_usd" in wanted or "cost_source" in wanted
    fields = [c for c in SESSION_COLUMNS if c in wanted or (costs and c in _COST_INPUTS)]
    frame = _frame(Handed(_sessions_table(path, filters, cache, fields)), fields)
    if costs:
        _fill_costs(frame, pricing or default_pricing())
    if "source" in wanted:
        # copy=False: a Series of a Categorical copies its codes otherwise.
        source = pd.Series(_spawnkit_source(len(frame)), index=frame.index, copy=False)
        frame.insert(min(1, len(frame.columns)), "source", source)
    return frame[wanted]


def _spawnkit_source(rows: int) -> pd.Categorical[Any]:
    """``source``: "spawnkit" in every row, as codes (an empty frame's categories stay
    empty, as pandas infers them from no values)."""
    if not rows:
        return pd.Categorical([])
    codes = np.zeros(rows, np.int8)
    return pd.Categorical.from_codes(codes, pd.Index(["spawnkit"]), validate=False)


def _fill_costs(frame: pd.DataFrame, pricing: PricingTable) -> None:
    """``cost_usd`` filled in from the pricing table where missing, and ``cost_source``
    (codes of :data:`COST_SOURCES` set directly: no column of a million strings)."""
    # Written in place (the frame's own column, shared with nothing): a second column of
    # costs would be the read's peak memory. A block of rows at a time: masks, row numbers
    # and token columns for every row were 8 MB at 1M sessions, when the frame is whole.
    source = np.full(len(frame), np.int8(_REPORTED))
    models = frame["model"].array  # a Categorical: its codes as they are (.cat.codes copies)
    codes = models.codes
    prices_of: dict[int, ModelPrice | None] = {}
    for start in range(0, len(frame), _PRICED_AT_ONCE):
        block = slice(start, start + _PRICED_AT_ONCE)
        missing = start + np.flatnonzero(frame["cost_usd"].iloc[block].isna().to_numpy())
        source[missing] = _UNPRICED
        missing_codes = codes[missing]
        for code in np.unique(missing_codes[missing_codes >= 0]):  # the unpriced rows' models
            if code not in prices_of:
                prices_of[code] = pricing.lookup(str(models.categories[code]))
            prices = prices_of[code]
            if prices is None:
                continue
            rows = missing[missing_codes == code]
            tokens = {c: frame[c].array[rows].to_numpy(dtype=np.float64, na_value=0.0)
                      for c in _TOKENS}  # fmt: skip
            _write_costs(frame, rows, prices.cost(
                tokens["input_tokens"], tokens["output_tokens"],
                tokens["cache_write_tokens"], 0, tokens["cache_read_tokens"],
            ))  # fmt: skip
            source[rows] = _COMPUTED
    arrow_frames.release_memory()  # the blocks' temporaries: not resident under the frame
    # Codes known valid: unchecked (the check's temporaries came at the read's peak).
    sources = pd.Categorical.from_codes(source, pd.Index(COST_SOURCES), validate=False)
    at = list(frame.columns).index("cost_usd") + 1
    frame.insert(at, "cost_source", pd.Series(sources, index=frame.index, copy=False))


def _write_costs(frame: pd.DataFrame, rows: np.ndarray, costs: np.ndarray) -> None:
    column = list(frame.columns).index("cost_usd")
    try:
        frame.iloc[rows, column] = costs
    except ValueError:  # read-only: Arrow's memory (no nulls, so pyarrow did not copy)
        frame["cost_usd"] = frame["cost_usd"].to_numpy(dtype=np.float64, copy=True)
        frame.iloc[rows, column] = costs


@arrow_frames.malloc_pool()
def tool_calls(
    store: StoreLike = None,
    *,
    butler: Names = None,
    runtime: Names = None,
    status: Names = None,
    kind: Names = None,
    since: TimeLike = None,
    until: TimeLike = None,
    success: bool | None = None,
    output: bool = False,
    columns: Sequence[str] | None = None,
    cache: bool | None = None,
) -> pd.DataFrame:
    """One row per tool call, in session and call order; ``output=True`` adds the outputs.

    The session filters select the sessions whose calls are returned (``status`` is the
    session's status). Outputs can be large, so they are never cached: with ``output=True``
    the calls are read from the database.
    """
    known = [name for name, _, _ in CALL_FIELDS] + (["output"] if output else [])
    wanted = _columns(columns, known)
    filters = Filters(butler, runtime, status, since, until, success, kind)
    table = _calls_table(store_source(store), filters, output, wanted, cache)
    return _frame(table, wanted)


def _calls_table(path: Source, filters: Filters, output: bool, wanted: Sequence[str],
                 cache: bool | None) -> Handed:  # fmt: skip
    """The tool calls :func:`tool_calls` returns, as a table handed to :func:`_frame`."""
    if isinstance(path, str) and not output and cache is not False:
        from_server = _server_sealed_calls(path)
        if from_server is not None:
            if filters:
                chosen = _sessions_table(path, filters, cache)["session_id"]
                keep = pc.is_in(from_server["session_id"], value_set=chosen.combine_chunks())
                from_server = from_server.filter(keep)
            return Handed(from_server)
    state = None if output else _use_cache(path, cache)
    if state is None or path is None or isinstance(path, str):
        where, params = filters.sql()
        every = CALL_FIELDS + ((("output", "output", "str"),) if output else ())
        fields = tuple(f for f in every if f[0] in wanted)  # only what is asked is read
        if where:
            where = f" WHERE session_id IN (SELECT id FROM {_sessions_from(path)}{where})"
        return Handed(_read(path, fields, "tool_calls", where, params, "rowid"))
    sealed = store_segments.read(path, sessions=False)
    if sealed is not None:
        table = sealed.calls
        del sealed  # the table alone: handed over below, nothing else holds it
    else:
        table = _cached(path, state, "tool_calls", CALL_FIELDS, CALL_SCHEMA, None)
    if filters:
        chosen = _sessions_table(path, filters, cache)["session_id"]
        table = table.filter(pc.is_in(table["session_id"], value_set=chosen.combine_chunks()))
    return Handed(table)


def _server_sealed_calls(url: str) -> pa.Table | None:
    """Every tool call of the server's store through its segments (None: none to use)."""
    with server_query.snapshot(url) as run:
        sealed = server_segments.read(run, sessions=False)
    return sealed.calls if sealed is not None else None


def usage(
    store: StoreLike = None,
    *,
    butler: Names = None,
    runtime: Names = None,
    status: Names = None,
    kind: Names = None,
    since: TimeLike = None,
    until: TimeLike = None,
    success: bool | None = None,
    by: tuple[str, ...] = ("butler", "runtime", "model"),
    tz: str = "UTC",
    pricing: PricingTable | None = None,
) -> pd.DataFrame:
    """Sessions, tokens and cost per day (in ``tz``) and per ``by`` columns."""
    needed = ["created_at", "success", *_TOKENS, "cost_usd", *by]
    frame = sessions(store, butler=butler, runtime=runtime, status=status, kind=kind, since=since,
                     until=until, success=success, pricing=pricing,
                     columns=list(dict.fromkeys(needed)))  # fmt: skip
    day = frame["created_at"].dt.tz_convert(tz).dt.strftime("%Y-%m-%d").rename("date")
    keys = [day, *(frame[c] for c in by)]
    grouped = frame.groupby(keys, observed=True, dropna=False)
    out = grouped[[*_TOKENS, "cost_usd"]].sum(min_count=1)
    out.insert(0, "sessions", grouped.size())
    out.insert(1, "failed", grouped["success"].agg(lambda s: int((s == False).sum())))  # noqa: E712
    return out.reset_index()
