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

import ctypes
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from .rows import Column

POOL = pa.system_memory_pool()
RELEASE_BYTES = 8 << 20
"""Tables from this size give their memory back column by column (smaller ones do not
need it, and a heap walk per column would be most of their conversion)."""
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
    with malloc_pool():
        return _frame(handed.take().select(list(columns)), columns)


def _frame(table: pa.Table, columns: Sequence[str]) -> pd.DataFrame:
    rows = table.num_rows
    release = release_memory if _buffer_bytes(table) >= RELEASE_BYTES else lambda: None
    pending = dict(zip(table.column_names, table.columns, strict=True))
    del table
    # Fixed-width columns first: their Arrow buffers go before the text's offsets widen.
    order = sorted(pending, key=lambda name: pa.types.is_string(pending[name].type))
    converted = {}
    release()  # the columns not asked for
    for name in order:
        converted[name] = _series(name, pending.pop(name), release)
        release()
    frame = pd.DataFrame(
        {name: converted.pop(name) for name in columns}, index=pd.RangeIndex(rows), copy=False
    )
    release()  # what the last columns' conversion left
    return frame


_switch = threading.Lock()
_users = 0
_before: pa.MemoryPool | None = None


@contextmanager
def malloc_pool() -> Iterator[None]:
    """Arrow's default pool is malloc's while frames are built (the pandas conversion
    allocates there too: with Arrow's own pool in between, freed memory was neither
    reused nor given back, 1.5 x the frame's own size where this gives 1.2 x at 10M
    tool calls). Buffers free into the pool that made them, so the switch is harmless
    to other threads; the pool before is restored when the last read ends.

    A whole read runs in it (``spawnkit.history``'s frame functions are decorated with it):
    the first allocation in Arrow's default pool (mimalloc) maps and touches its arenas,
    4 MB more resident for the life of the process."""
    global _users, _before
    with _switch:
        if _users == 0:
            _before = pa.default_memory_pool()
            pa.set_memory_pool(POOL)
        _users += 1
    try:
        yield
    finally:
        with _switch:
            _users -= 1
            if _users == 0 and _before is not None:
                pa.set_memory_pool(_before)
                _before = None


def release_memory() -> None:
    """Give the freed pages of malloc's heap back to the system (``malloc_trim``; glibc).

    A read's Arrow memory is malloc's (segments decode into
    :data:`spawnkit.store.segments.DECODE_POOL`, frames are built in :func:`malloc_pool`),
    and so is what pandas allocates. Freed, most of it stays resident in the heap, between
    chunks still in use, until something trims it: ``release_unused`` of Arrow's system
    pool does not (it left 17 MB resident after a read of 100k sessions, more than half the
    frame). The peak RSS of a read is at its end, with the whole frame held: whatever was
    freed and not given back by then adds to it."""
    if _MALLOC_TRIM is not None:
        _MALLOC_TRIM(0)
    else:
        POOL.release_unused()


def _malloc_trim() -> Any:
    """glibc's ``malloc_trim``, or None elsewhere (musl, macOS)."""
    try:
        return ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return None


_MALLOC_TRIM = _malloc_trim()


def _series(name: str, column: Column, release: Callable[[], None]) -> pd.Series:
    present: list[str] | None = None
    if pa.types.is_dictionary(column.type):
        column, present = _present_sorted(column)
    if column.type in _MASKED:
        return pd.Series(_masked(column), name=name, copy=False)
    if pa.types.is_string(column.type):  # pandas' own type; cast here, into malloc's memory
        chunks: list[Column] = list(column.chunks)
        del column
        column = _widened(chunks, release)
    single = pa.Table.from_arrays([column], names=[name])
    del column
    series = single.to_pandas(
        types_mapper=_TYPES.get, split_blocks=True, self_destruct=True, memory_pool=POOL
    )[name]
    if present is not None:
        # The categories from a list, as in pandas' rule (their dtype is inferred from it).
        # The codes as they are (.cat.codes and a Series of a Categorical each copy them).
        codes = series.array.codes
        categories = pd.Categorical.from_codes(codes, pd.Index(present), validate=False)
        series = pd.Series(categories, name=name, copy=False)
    return series


def _widened(chunks: list[Column], release: Callable[[], None]) -> Column:
    """String ``chunks`` as one ``large_string`` column, cast a chunk at a time, each
    chunk's old offsets freed (and given back) before the next is cast, the list emptied
    as it goes: the whole column cast at once held both offsets, 4 MB more at 1M rows,
    which at the last text column was the read's peak."""
    wide: list[Column] = []
    for n in range(len(chunks)):
        wide.append(pc.cast(chunks[n], pa.large_string(), memory_pool=POOL))
        chunks[n] = None
        release()
    return pa.chunked_array(wide, pa.large_string())


_MASKED: dict[pa.DataType, tuple[type[np.generic], Any]] = {
    pa.int64(): (np.int64, pd.arrays.IntegerArray),
    pa.bool_(): (np.bool_, pd.arrays.BooleanArray),
}


def _masked(column: Column) -> Any:
    """An int64 or bool column as pandas' ``Int64`` or ``boolean`` array, its values and
    validity copied out of Arrow's buffers by numpy. pandas' own conversion unpacks bits
    in Arrow's C++ default pool (mimalloc, whatever pool is set from Python), whose first
    use maps and touches 4 MB for the life of the process, then concatenates the chunks'
    arrays: a second copy of the column."""
    dtype, kind = _MASKED[column.type]
    rows = len(column)
    values = np.empty(rows, dtype)
    missing = np.zeros(rows, np.bool_)
    at = 0
    for chunk in column.chunks:
        size = len(chunk)
        if not size:
            continue
        validity, data = chunk.buffers()[:2]
        if dtype is np.bool_:
            values[at : at + size] = _bits(data, chunk.offset, size)
        else:
            values[at : at + size] = np.frombuffer(data, np.int64, size, chunk.offset * 8)
        if chunk.null_count:
            missing[at : at + size] = ~_bits(validity, chunk.offset, size)
        at += size
    return kind(values, missing)


def _bits(buffer: Any, offset: int, size: int) -> np.ndarray:
    """``size`` bits of an Arrow bitmap from bit ``offset``, as booleans."""
    raw = np.frombuffer(buffer, np.uint8)
    return np.unpackbits(raw, count=offset + size, bitorder="little")[offset:].view(np.bool_)


def _buffer_bytes(table: pa.Table) -> int:
    """About ``table.nbytes``, counted here: ``nbytes`` allocates in Arrow's C++ default
    pool (see :func:`_masked`)."""
    return sum(
        buffer.size
        for column in table.columns
        for chunk in column.chunks
        for buffer in chunk.buffers()
        if buffer is not None
    )


def _present_sorted(column: Column) -> tuple[Column, list[str]]:
    """``column`` with one dictionary in every chunk, its values present, sorted; and them."""
    chunks: list[Column] = [chunk for chunk in column.chunks if len(chunk)]
    used: set[str] = set()
    for chunk in chunks:
        counts = np.bincount(_valid_indices(chunk), minlength=len(chunk.dictionary))
        values = chunk.dictionary.to_pylist()
        used.update(values[i] for i in np.flatnonzero(counts) if values[i] is not None)
    present = sorted(used)
    dictionary = pa.array(present, pa.string())
    position = {value: n for n, value in enumerate(present)}
    mapped: list[Column] = []
    for chunk in chunks:
        # Old index -> new one (a null value in a dictionary stays null; unused ones too).
        lookup = pa.array([position.get(v) for v in chunk.dictionary.to_pylist()], pa.int32())
        indices = pc.take(lookup, chunk.indices, memory_pool=POOL)
        mapped.append(pa.DictionaryArray.from_arrays(indices, dictionary))
    kind: Any = pa.dictionary(pa.int32(), pa.string())
    return pa.chunked_array(mapped, kind), present


def _valid_indices(chunk: Column) -> Column:
    indices = chunk.indices
    if indices.null_count:
        indices = indices.filter(pc.is_valid(indices))
    return indices.to_numpy(zero_copy_only=False)
