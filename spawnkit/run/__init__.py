"""The run lifecycle: :class:`Spawner` admits triggers for one butler, runs and records them.

Every way of running an agent (a trigger, ``ask``, ``chat``, the shell contract, a batch
map, a run on a remote worker) goes through this package; :class:`MockSpawner` stands in
for a :class:`Spawner` in a user's own tests.
"""

from __future__ import annotations

from .accepted import CANCEL_GRACE_S
from .admission import SLOT_POLL_S
from .collector import LIVE_WRITE_TIMEOUT_S
from .request import (
    TRIGGER_SOURCES,
    RunKind,
    checked_workdir,
    compose_prompt,
    validate_request,
    validate_trigger_source,
)
from .spawner import Spawner, SpawnerStatus
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
