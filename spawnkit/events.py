"""Typed events a run streams while it happens.

Adapters emit these the moment the runtime reports something; the spawner
forwards them to listeners (the terminal printer, notebook views, the
dashboard) and folds them into the final :class:`~spawnkit.result.SpawnerResult`.
Every event names its session so one listener can follow many runs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from .result import SpawnerResult, ToolCall, Usage


@dataclass(frozen=True)
class Queued:
    """Accepted, waiting for a slot; ``position`` counts from 1."""

    session_id: str
    butler: str
    position: int


@dataclass(frozen=True)
class Started:
    """The run holds a slot and its runtime is starting; ``max_turns`` is the run's limit."""

    session_id: str
    butler: str
    runtime: str
    model: str | None
    runtime_session_id: str | None
    max_turns: int | None = None


@dataclass(frozen=True)
class TextDelta:
    """A fragment of assistant text as it streams (may be absent for some runtimes)."""

    session_id: str
    text: str


@dataclass(frozen=True)
class AssistantText:
    """One complete block of assistant text."""

    session_id: str
    text: str


@dataclass(frozen=True)
class ToolCallStarted:
    session_id: str
    call: ToolCall


@dataclass(frozen=True)
class ToolCallFinished:
    session_id: str
    call: ToolCall


@dataclass(frozen=True)
class UsageUpdate:
    """Running totals so far; the final figures are in :class:`Finished`.

    ``turns`` counts model turns begun so far; ``model`` is the model actually
    answering, once the runtime has said (it may differ from the configured one).
    """

    session_id: str
    usage: Usage
    cost_usd: float | None
    turns: int | None
    model: str | None = None


@dataclass(frozen=True)
class Finished:
    session_id: str
    result: SpawnerResult


RunEvent = (
    Queued
    | Started
    | TextDelta
    | AssistantText
    | ToolCallStarted
    | ToolCallFinished
    | UsageUpdate
    | Finished
)
EventSink = Callable[[RunEvent], None]
