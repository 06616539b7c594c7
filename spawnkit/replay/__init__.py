"""Replay model server: play scripted model turns to a real agent CLI, offline.

A :class:`Scenario` (TOML) scripts the model's turns; a :class:`ReplayServer` serves them
as the Anthropic Messages API, the OpenAI Responses API and the Gemini API at once, so the
real ``claude``, ``codex`` and ``gemini`` CLIs run end to end against it, MCP tool calls
included, from one scenario. ``ReplayServer.recorder(upstream, out)`` proxies a real API
(any of the three) and writes what passed through as a scenario. See ``docs/replay.md``.
"""

from ..errors import ScenarioError
from .scenario import Scenario
from .server import LoggedRequest, ReplayServer, Throttle, record_forever, serve_forever

__all__ = [
    "LoggedRequest",
    "ReplayServer",
    "Scenario",
    "ScenarioError",
    "Throttle",
    "record_forever",
    "serve_forever",
]
