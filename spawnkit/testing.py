"""The old path of :mod:`spawnkit.run.testing` (``MockSpawner``), kept for code that imports it."""

from .run.testing import *  # noqa: F403
