"""The store's Arrow tables as pandas DataFrames, one column at a time, releasing as it goes.

``Table.to_pandas`` keeps every Arrow buffer until the whole frame exists, so a large read
held its Arrow table and its pandas copy at once: twice the frame, and the peak RSS of a
first read. Here the table is handed over (:class:`Handed`) and converted a column at a
time, each Arrow column dropped once pandas holds its values. Text columns cost nothing
extra: pandas' strings are Arrow's (only their offsets are widened). Columns of names
(dictionaries) are first given one dictionary, the values present, sorted: the
categories the frames promise, without unifying the segments' dictionaries and then
counting ten million codes in pandas.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

_TYPES = {pa.int64(): pd.Int64Dtype(), pa.bool_(): pd.BooleanDtype()}


class Handed:
    """A table given away: :func:`frame` takes it out, so that no reference is left behind
    to keep its buffers (a caller's local variable would keep them all to the end)."""

    def __init__(self, table: pa.Table) -> None:
        self._table: pa.Table | None = table

    def take(self) -> pa.Table:
        table, self._table = self._table, None
        if table is None:
            raise RuntimeError("a handed table is taken once")
        return table


def frame(handed: Handed, columns: Sequence[str]) -> pd.DataFrame:
    """The ``columns`` of the handed table as a DataFrame (the dtypes ``to_pandas`` gives,
    ``Int64`` and ``boolean`` for integers and booleans, categories present and sorted)."""
    table = handed.take().select(list(columns))
    rows = table.num_rows
    pending = dict(zip(table.column_names, table.columns, strict=True))
    del table
    # Fixed-width columns first: their Arrow buffers go before the text's offsets widen.
    order = sorted(pending, key=lambda name: pa.types.is_string(pending[name].type))
    converted = {}
    # What Arrow frees, its pool keeps for a while, and pandas allocates apart (numpy):
    # the pool gives it back after each column, or the read's peak is both copies.
    pool = pa.default_memory_pool()
    pool.release_unused()  # the columns not asked for
    for name in order:
        converted[name] = _series(name, pending.pop(name))
        pool.release_unused()
    return pd.DataFrame(
        {name: converted.pop(name) for name in columns}, index=pd.RangeIndex(rows), copy=False
    )


def _series(name: str, column: pa.ChunkedArray) -> pd.Series:
    if pa.types.is_dictionary(column.type):
        column, present = _present_sorted(column)
    else:
        present = None
    single = pa.Table.from_arrays([column], names=[name])
    del column
    series = single.to_pandas(types_mapper=_TYPES.get, split_blocks=True, self_destruct=True)[name]
    if present is not None:
        # The categories from a list, as in pandas' rule (their dtype is inferred from it).
        codes = series.cat.codes.to_numpy()
        series = pd.Series(
            pd.Categorical.from_codes(codes, pd.Index(present), validate=False), name=name
        )
    return series


def _present_sorted(column: pa.ChunkedArray) -> tuple[pa.ChunkedArray, list[str]]:
    """``column`` with one dictionary in every chunk, its values present, sorted; and them."""
    chunks = [chunk for chunk in column.chunks if len(chunk)]
    used: set[str] = set()
    for chunk in chunks:
        indices = _valid_indices(chunk)
        counts = np.bincount(indices, minlength=len(chunk.dictionary))
        values = chunk.dictionary.to_pylist()
        used.update(values[i] for i in np.flatnonzero(counts))
    present = sorted(used)
    dictionary = pa.array(present, pa.string())
    position = {value: n for n, value in enumerate(present)}
    mapped = []
    for chunk in chunks:
        # Old index -> new one (unused values, never read, go to 0).
        lookup = pa.array([position.get(v, 0) for v in chunk.dictionary.to_pylist()], pa.int32())
        indices = pc.take(lookup, chunk.indices)
        mapped.append(pa.DictionaryArray.from_arrays(indices, dictionary))
    kind = pa.dictionary(pa.int32(), pa.string())
    return pa.chunked_array(mapped, kind), present


def _valid_indices(chunk: pa.DictionaryArray) -> np.ndarray:
    indices = chunk.indices
    if indices.null_count:
        indices = indices.filter(pc.is_valid(indices))
    return indices.to_numpy(zero_copy_only=False)
