"""Replay model server: play scripted model turns to a real agent CLI, offline.

A :class:`Scenario` (TOML) scripts the model's turns; a :class:`ReplayServer` serves them
as the Anthropic Messages API so the real ``claude`` CLI runs end to end against it, MCP
tool calls included. ``ReplayServer.recorder(upstream, out)`` proxies a real API and
writes what passed through as a scenario. See ``docs/replay.md``.
"""

from ..errors import ScenarioError
from .scenario import Scenario
from .server import LoggedRequest, ReplayServer, record_forever, serve_forever

__all__ = [
    "LoggedRequest",
    "ReplayServer",
    "Scenario",
    "ScenarioError",
    "record_forever",
    "serve_forever",
]
