"""Old column names of the history frames, answered for one more release with a warning.

Every history frame names a fact the same way: ``session_id`` for the session, ``name`` for
what a span or event is called, ``parent_span_id``, ``started_at``, ``timestamp`` (see
docs/history.md, "Column names"). ``spans()``, ``cli_events()``, ``timings()`` and
``waterfall()`` had their own names before; they return an :class:`AliasedFrame`, a
``DataFrame`` that still answers to the old names with a ``DeprecationWarning`` naming the
new column, so code written against the old names keeps running while it is updated.

Covered: ``df["old"]`` and ``df[["old", ...]]``, ``df.old``, ``df.groupby("old")``,
``df.sort_values("old")``, ``df.merge(other, on=/left_on=/right_on="old")``, and
``request_latency(by="old")``. The aliases follow the frame through whatever pandas builds
with the frame's own class (filters, copies, sorts, ``head``, ``assign``, ``concat`` of alias
frames, ``merge`` with the alias frame on the left). Not covered (a ``KeyError`` as for any
missing column): ``"old" in df`` (False), ``df.loc`` (only ``df.loc[:, "old"]`` happens to
work), ``set_index``, ``query`` strings, ``pd.merge(plain, aliased)`` (a plain frame), frames
read back from Parquet. A column the user adds under an old name is theirs: never redirected.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Hashable, Mapping
from typing import Any, ClassVar

import pandas as pd

_NONE: Mapping[str, str] = {}  # never changed: frames get a new dict (a plain one pickles)


def _warn(old: str, new: str, stacklevel: int) -> None:
    warnings.warn(
        f"history frame column {old!r} is now {new!r}; the old name will be removed in the "
        "next release",
        DeprecationWarning,
        stacklevel=stacklevel + 1,
    )


class AliasedFrame(pd.DataFrame):
    """A history frame that answers to its columns' old names (``old_names``: old -> new)."""

    _metadata: ClassVar[list[str]] = ["old_names"]  # copied by pandas to derived frames
    old_names: Mapping[str, str] = _NONE

    @property
    def _constructor(self) -> Callable[..., AliasedFrame]:
        return AliasedFrame

    def __finalize__(self, other: Any, method: str | None = None, **kwargs: Any) -> AliasedFrame:
        """Keep the old names through ``concat`` and ``merge`` too (pandas passes their
        inputs as ``other.input_objs``, and copies ``_metadata`` only from one frame)."""
        super().__finalize__(other, method=method, **kwargs)  # type: ignore[misc]  # not in stubs
        for frame in getattr(other, "input_objs", ()):
            names = getattr(frame, "old_names", _NONE)
            if names:
                self.old_names = {**names, **self.old_names}
        return self

    def new_name(self, key: Any, stacklevel: int = 2) -> Any:
        """``key``, or the new name of ``key`` (with a warning) when it is an old name
        that is no column of this frame."""
        if isinstance(key, str) and key in self.old_names and key not in self.columns:
            new = self.old_names[key]
            _warn(key, new, stacklevel + 1)
            return new
        return key

    def new_names(self, keys: Any, stacklevel: int = 2) -> Any:
        """``new_name`` of a key or of each key of a list or tuple."""
        if not isinstance(keys, list | tuple):
            return self.new_name(keys, stacklevel + 1)
        renamed = []
        for key in keys:  # a loop, not a comprehension: no extra frame for the stack level
            renamed.append(self.new_name(key, stacklevel + 1))
        return type(keys)(renamed)

    def __getitem__(self, key: Any) -> Any:
        if isinstance(key, str | list):
            key = self.new_names(key, stacklevel=2)
        return super().__getitem__(key)

    # pandas marks __getattr__ final so that column access keeps working; this one only adds
    # the old names and leaves everything else to it.
    def __getattr__(self, name: str) -> Any:  # type: ignore[misc]
        # Only reached when normal lookup failed: pandas then looks for a column.
        names = self.__dict__.get("old_names", _NONE)
        if name in names and name not in self.columns:
            _warn(name, names[name], stacklevel=2)
            return self[names[name]]
        return super().__getattr__(name)

    def groupby(self, by: Any = None, *args: Any, **kwargs: Any) -> Any:
        return super().groupby(self.new_names(by, stacklevel=2), *args, **kwargs)

    def sort_values(self, by: Any, *args: Any, **kwargs: Any) -> Any:
        return super().sort_values(self.new_names(by, stacklevel=2), *args, **kwargs)

    def merge(self, right: Any, *args: Any, **kwargs: Any) -> Any:
        # ``on`` names columns of both frames: history frames rename a fact alike.
        for side in ("on", "left_on"):
            if kwargs.get(side) is not None:
                kwargs[side] = self.new_names(kwargs[side], stacklevel=2)
        if isinstance(right, AliasedFrame) and kwargs.get("right_on") is not None:
            kwargs["right_on"] = right.new_names(kwargs["right_on"], stacklevel=2)
        return super().merge(right, *args, **kwargs)


def with_old_names(frame: pd.DataFrame, old_names: Mapping[str, str]) -> AliasedFrame:
    """``frame`` (not copied) answering to ``old_names`` (old -> new) as well."""
    aliased = AliasedFrame(frame, copy=False)
    aliased.old_names = dict(old_names)
    return aliased


def new_key(frame: pd.DataFrame, key: Hashable, old_names: Mapping[str, str]) -> Hashable:
    """The new name of ``key`` if it is one of ``old_names`` and no column of ``frame``
    (with a warning for the caller's caller), else ``key``: for functions taking a column
    name, such as ``request_latency(by=...)``."""
    if isinstance(key, str) and key in old_names and key not in frame.columns:
        _warn(key, old_names[key], stacklevel=3)
        return old_names[key]
    return key
