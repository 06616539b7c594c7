"""From parsed rows to the pandas frames users see: deduplicate, price, aggregate.

Deduplication follows the CLIs' traps as ccusage resolves them, so totals agree with it
to the token:

1. rows with the same ``message.id`` and ``requestId`` are one API response, whatever file
   or session they were written in (Claude Code writes one response under several session
   files when a session is resumed, forked or continued in a side chain; a row without a
   ``requestId`` is matched within its session only); the one kept is a
   main-chain row before a side-chain row, then the most complete usage (the largest token
   total), then the first seen (files in path order, lines in file order). The response
   counts for the session of the row kept, so attribution is deterministic;
2. a side-chain row with the same ``message.id`` as a row kept in step 1 is a replay of it
   (``/btw`` side chains replay parent responses under new request ids) and is dropped; of
   several side-chain replays without a main-chain row, the most complete is kept.

Codex rows are keyed by timestamp, model and counts (their ``message_id``) and Gemini rows by
message id within their session, so the same two rules drop a Codex event copied into a
forked file and a Gemini message stored twice.

ccusage 20.0.24 applies rule 2 in its ``daily`` report; its ``session`` report still requires
the replay's timestamp to equal the kept row's, so a replayed multi-line response whose lines
got distinct request ids is counted more than once there (see docs/history.md).

Rows without a message id are never merged. Costs come from the runtime when it reported one
(``cost_source`` "reported"), else from the pricing table ("computed"; ``cost_estimated`` when
the price is that of another model of the family, see :mod:`~spawnkit.history.pricing`);
tokens of a model the table cannot price at all are counted but not priced ("unpriced" rows;
a session with some is "partial"), and each such model is warned about once.
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import numpy.typing as npt
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from .errors import UnpricedModelWarning
from .pricing import PricingTable
from .rows import Column

TOKEN_COLUMNS = ["input_tokens", "output_tokens", "thinking_tokens", "cache_write_tokens",
                 "cache_read_tokens"]  # fmt: skip
_RAW_TOKENS = ("input_tokens", "output_tokens", "cache_write_5m", "cache_write_1h",
               "cache_read_tokens", "thinking_tokens")  # fmt: skip
_WARNED: set[str] = set()  # models already warned about in this process


def codes(column: Column) -> npt.NDArray[np.int64]:
    """Integer codes of a column's values, nulls included as one more value."""
    if isinstance(column, pa.ChunkedArray):
        # One dictionary for the whole column: encoding each chunk and then unifying
        # their dictionaries hashes every value twice.
        column = column.combine_chunks()
    encoded: Column = pc.dictionary_encode(column, null_encoding="encode")
    return np.asarray(encoded.indices, dtype=np.int64)


def first_of(
    keys: list[npt.NDArray[np.int64]], order: npt.NDArray[np.int64]
) -> npt.NDArray[np.bool_]:
    """Mask over ``order`` positions: True where the key is seen for the first time."""
    if len(order) == 0:
        return np.zeros(0, dtype=bool)
    combined = np.zeros(len(order), dtype=np.int64)
    span = 1  # combined < span
    for key in keys:
        size = int(key.max(initial=0)) + 2
        if span * size >= 1 << 62:
            # Re-pack the codes so far, so the product stays within int64.
            combined, uniques = pd.factorize(combined)
            span = len(uniques)
        combined = combined * size + key[order]
        span *= size
    # A hash table, not a sort: duplicated() marks every later sight of a key.
    return ~pd.Series(combined, copy=False).duplicated().to_numpy()


def deduplicate(usage: pa.Table) -> npt.NDArray[np.int64]:
    """Indices of the rows kept, one per API response (see the module docstring), in order."""
    n = usage.num_rows
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    total = np.zeros(n, dtype=np.int64)
    for column in _RAW_TOKENS:
        counts: Column = pc.fill_null(usage[column], pa.scalar(0, pa.int64()))
        total += counts.to_numpy()
    sidechain = usage["is_sidechain"].to_numpy(zero_copy_only=False).astype(bool)
    has_id = np.asarray(pc.is_valid(usage["message_id"]), dtype=bool)
    # Without a request id a response is only known within its session (as in ccusage's
    # session report): its key is the session instead.
    has_request = np.asarray(pc.is_valid(usage["request_id"]), dtype=bool)
    request_key = pc.if_else(has_request, usage["request_id"], usage["session_id"])
    message, request = codes(usage["message_id"]), codes(request_key)
    # Replays (rule 2) are matched across sessions too, unless there is no request id.
    scope = np.where(has_request, 0, codes(usage["session_id"]) + 1)
    # Best first: main chain, then the largest total, then the first seen.
    order = np.lexsort((np.arange(n), -total, sidechain))
    order = order[has_id[order]]
    order = order[first_of([message, request], order)]
    # Main-chain rows sort first, so a side-chain row is a replay if anything precedes it.
    replay = sidechain[order] & ~first_of([message, scope], order)
    kept = np.concatenate([order[~replay], np.flatnonzero(~has_id)])
    kept.sort()
    return kept


def price(
    usage: pd.DataFrame, pricing: PricingTable, default_model: str | None = None
) -> pd.DataFrame:
    """Add ``cost_usd``, ``cost_source`` and ``cost_estimated`` to deduplicated usage rows
    (in place: ``usage`` is returned).

    Thinking tokens are billed as output. Rows without a model are priced as
    ``default_model`` when one is given, as an estimate.
    """
    cost = np.full(len(usage), np.nan)
    # Cost sources as codes of COST_SOURCES (a category column built from them directly).
    source = np.full(len(usage), _UNPRICED, dtype=np.int8)
    estimated = np.zeros(len(usage), dtype=bool)
    codes, names = pd.factorize(usage["model"], use_na_sentinel=True)
    models = [str(m) for m in names]
    if default_model is not None and (codes < 0).any():
        codes = np.where(codes < 0, len(models), codes)
        models.append("\x00" + default_model)  # marked: priced as an estimate
    unknown = []
    # Token columns as plain arrays once (nulls as 0), then sliced per model.
    tokens = {c: usage[c].fillna(0).to_numpy(dtype=np.int64) for c in _RAW_TOKENS}
    output = tokens["output_tokens"] + tokens["thinking_tokens"]
    for code, model in enumerate(models):
        name = model.removeprefix("\x00")
        prices, guess = pricing.resolve(name)
        guess = guess or name != model
        if prices is None:
            unknown.append((code, name))
            continue
        mask = codes == code
        cost[mask] = prices.cost(
            tokens["input_tokens"][mask], output[mask], tokens["cache_write_5m"][mask],
            tokens["cache_write_1h"][mask], tokens["cache_read_tokens"][mask],
        )  # fmt: skip
        source[mask] = _COMPUTED
        estimated[mask] = guess
    zero = sum(tokens.values()) == 0
    unpriced = np.isnan(cost) & zero  # nothing used, nothing to price (<synthetic> errors)
    cost[unpriced] = 0.0
    source[unpriced] = _COMPUTED
    reported = usage["reported_cost"].notna().to_numpy()
    cost[reported] = usage["reported_cost"].to_numpy()[reported]
    source[reported] = _REPORTED
    estimated[reported] = False
    warn_unpriced(name for code, name in unknown if np.isnan(cost[codes == code]).any())
    usage["cost_usd"] = cost
    usage["cost_source"] = pd.Categorical.from_codes(source, categories=pd.Index(COST_SOURCES))
    usage["cost_estimated"] = pd.array(estimated, dtype="boolean")
    return usage


def warn_unpriced(models: Any) -> None:
    """Warn once per process about each model whose tokens cannot be priced at all."""
    for model in sorted(set(models) - _WARNED):
        _WARNED.add(model)
        warnings.warn(
            f"no price for model {model!r}: its tokens are counted, not priced "
            "(add it with PricingTable.with_prices)",
            UnpricedModelWarning,
            stacklevel=5,  # the caller of transcripts()
        )


COST_SOURCES = ["reported", "computed", "mixed", "partial", "unpriced"]
_REPORTED, _COMPUTED, _UNPRICED = (
    COST_SOURCES.index(s) for s in ("reported", "computed", "unpriced")
)


def session_cost_source(sessions: pd.Series, sources: pd.Series) -> pd.Series:
    """Per session: reported, computed, mixed (both), partial (some unpriced) or unpriced.

    ``sessions`` may be a category column: its codes are used as they are (no strings)."""
    session_codes, uniques = pd.factorize(sessions)
    n = len(uniques)
    has = {
        name: np.bincount(session_codes[(sources == name).to_numpy()], minlength=n) > 0
        for name in ("reported", "computed", "unpriced")
    }
    out = np.select(
        [
            has["unpriced"] & ~has["computed"] & ~has["reported"],
            has["unpriced"],
            has["reported"] & has["computed"],
            has["reported"],
        ],
        ["unpriced", "partial", "mixed", "reported"],
        default="computed",
    )
    index = pd.Index(np.asarray(uniques, dtype=object), dtype=object)
    return pd.Series(pd.Categorical(out, categories=COST_SOURCES), index=index)


def tool_parts(names: pd.Series) -> tuple[pd.Series, pd.Series]:
    """``(server, tool)`` of tool names: ``mcp__github__get_issue`` is github's get_issue.

    Computed once per distinct name, then mapped onto the rows as categories.
    """
    names = names.astype("category")
    servers: list[str | None] = []
    tools: list[str] = []
    for name in names.cat.categories:
        server, sep, tool = str(name).removeprefix("mcp__").partition("__")
        is_mcp = str(name).startswith("mcp__") and bool(sep)
        servers.append(server if is_mcp else None)
        tools.append(tool if is_mcp else str(name))
    codes = names.cat.codes.to_numpy()

    def mapped(values: list[Any]) -> pd.Series:
        uniques = pd.Series(values, dtype=object)
        out = pd.Series(uniques.to_numpy()[codes], index=names.index, dtype=object)
        out[codes < 0] = None
        return out.astype("category")

    return mapped(servers), mapped(tools)


def as_category(frame: pd.DataFrame, *columns: str) -> None:
    for column in columns:
        frame[column] = frame[column].astype("category")


def as_int(frame: pd.DataFrame, *columns: str) -> None:
    for column in columns:
        frame[column] = frame[column].astype("Int64")


def arrow_frame(table: pa.Table, categories: tuple[str, ...] = ()) -> pd.DataFrame:
    """A pandas frame of an Arrow table with numpy-backed numbers and nullable booleans;
    ``categories`` become ``category`` columns, encoded by Arrow (faster than pandas)."""
    for name in categories:
        i = table.schema.get_field_index(name)
        column: Column = table[name]
        if column.num_chunks > 1:  # one dictionary, not one per chunk unified afterwards
            column = column.combine_chunks()
        table = table.set_column(i, name, pc.dictionary_encode(column))
    return table.to_pandas(
        types_mapper={pa.bool_(): pd.BooleanDtype(), pa.int64(): pd.Int64Dtype()}.get,
        split_blocks=True,
        self_destruct=False,
    )


def drop_null_timestamps(table: pa.Table, column: str = "timestamp") -> tuple[pa.Table, list[str]]:
    """The rows whose timestamp parsed, and the file path of each row whose did not."""
    if table[column].null_count == 0:
        return table, []
    valid = pc.is_valid(table[column])
    dropped = [str(p) for p in table.filter(pc.invert(valid))["path"].to_pylist()]
    return table.filter(valid), dropped
