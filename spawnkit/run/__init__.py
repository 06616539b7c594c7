"""The run lifecycle: :class:`Spawner` admits triggers for one butler, runs and records them.

Every way of running an agent (a trigger, ``ask``, ``chat``, the shell contract, a batch
map, a run on a remote worker) goes through this package; :class:`MockSpawner` stands in
for a :class:`Spawner` in a user's own tests.
"""

from __future__ import annotations

from .spawner import (
    CANCEL_GRACE_S,
    LIVE_WRITE_TIMEOUT_S,
    SLOT_POLL_S,
    TRIGGER_SOURCES,
    RunKind,
    Spawner,
    SpawnerStatus,
    checked_workdir,
    compose_prompt,
    validate_request,
    validate_trigger_source,
)
from .testing import Invocation, MockSpawner

__all__ = [
    "CANCEL_GRACE_S",
    "LIVE_WRITE_TIMEOUT_S",
    "SLOT_POLL_S",
    "TRIGGER_SOURCES",
    "Invocation",
    "MockSpawner",
    "RunKind",
    "Spawner",
    "SpawnerStatus",
    "checked_workdir",
    "compose_prompt",
    "validate_request",
    "validate_trigger_source",
]
