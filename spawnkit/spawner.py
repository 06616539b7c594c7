"""The old path of :mod:`spawnkit.run` (the Spawner), kept for code that imports it."""

from .run import *  # noqa: F403
