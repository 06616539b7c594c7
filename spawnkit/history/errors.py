"""The history package's one error: bad input that a caller must fix.

``HistoryError`` derives from :class:`spawnkit.errors.SpawnkitError`, so the command line
prints it as one line. Unparseable transcript lines are not errors: they are counted per
file and reported in :attr:`spawnkit.history.Transcripts.files`.
"""

from __future__ import annotations

from ..errors import SpawnkitError


class HistoryError(SpawnkitError):
    """An unknown source, a missing folder or store, or an unreadable pricing table."""


class UnpricedModelWarning(UserWarning):
    """A model the pricing table cannot price, even by family; warned once per model."""
