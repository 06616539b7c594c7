"""The history package's errors: bad input that a caller must fix, and unpriced models.

``HistoryError`` lives in :mod:`spawnkit.errors` (pricing tables, read by budgets below
this package, raise it too) and derives from :class:`spawnkit.errors.SpawnkitError`, so
the command line prints it as one line. Unparseable transcript lines are not errors: they
are counted per file and reported in :attr:`spawnkit.history.Transcripts.files`.
"""

from __future__ import annotations

from ..errors import HistoryError


class UnpricedModelWarning(UserWarning):
    """A model the pricing table cannot price, even by family; warned once per model."""


__all__ = ["HistoryError", "UnpricedModelWarning"]
