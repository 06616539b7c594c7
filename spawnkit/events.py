"""Typed events a run streams while it happens.

Adapters emit these the moment the runtime reports something; the spawner
forwards them to listeners (the terminal printer, notebook views, the
dashboard) and folds them into the final :class:`~spawnkit.result.SpawnerResult`.
Every event names its session so one listener can follow many runs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from .permissions import PermissionDecision
from .result import PermissionAnswer, SpawnerResult, ToolCall, Usage


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
    ``at_end``: the runtime reports usage only when the run ends and nothing meters its
    model calls, so zeros until then mean "not known yet", not "none".
    """

    session_id: str
    usage: Usage
    cost_usd: float | None
    turns: int | None
    model: str | None = None
    at_end: bool = False


@dataclass(frozen=True)
class ToolTime:
    """One tool's calls in a run so far: how many, and their total time."""

    tool: str
    calls: int
    total_ms: float


@dataclass(frozen=True)
class Timing:
    """One model request's latency or one tool call's time, from the CLI's own telemetry.

    Only with CLI telemetry on (:mod:`spawnkit.telemetry.otlp`), as the CLI's log events reach the
    run's receiver (:mod:`spawnkit.telemetry.timings` reads them). ``kind`` is ``"model"`` (``name``
    the model) or ``"tool"`` (``name`` the tool as the CLI names it); ``status`` is ``"ok"``
    or ``"error"``. The rest are the run's running figures so far, this one included:
    ``requests`` model requests with latency percentiles ``p50_ms`` and ``p90_ms``
    (None before the first), and ``tools`` by total time, most first.
    """

    session_id: str
    kind: str
    name: str
    duration_ms: float
    status: str
    requests: int
    p50_ms: float | None
    p90_ms: float | None
    tools: tuple[ToolTime, ...]
    ttft_ms: float | None = None


# The egress proxy's reason for a host the butler does not list (spawnkit.containment.egress).
NOT_LISTED = "not in allow_hosts"


@dataclass(frozen=True)
class NetworkDenied:
    """A connection the run's network sandbox refused (its egress proxy,
    :mod:`spawnkit.containment.egress`).

    ``host`` as the agent named it (a name or an address), ``port``, and ``reason`` (the
    proxy's: ``"not in allow_hosts"`` and so on). ``tool`` and ``tool_call_id`` name the tool
    call in progress when it happened, when exactly one was (else None: the refusal cannot
    be pinned on one). ``config_file`` is the butler.toml whose ``allow_hosts`` decides.
    """

    session_id: str
    host: str
    port: int
    reason: str
    tool: str | None = None
    tool_call_id: str | None = None
    config_file: str | None = None


@dataclass(frozen=True)
class PermissionAsked:
    """A tool call of ``[butler.permissions] ask`` waits for a person's yes or no.

    ``call`` has the tool's name and input (redacted). A :class:`PermissionDecided` for the
    same ``call.id`` always follows, also when the run ends first (``by="cancelled"``).
    """

    session_id: str
    call: ToolCall


@dataclass(frozen=True)
class PermissionDecided:
    """The answer to a :class:`PermissionAsked`, as the run's record keeps it."""

    session_id: str
    call: ToolCall
    answer: PermissionAnswer

    @property
    def decision(self) -> PermissionDecision:
        answer = self.answer
        return PermissionDecision(answer.allowed, answer.by, answer.always, answer.reason)


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
    | Timing
    | NetworkDenied
    | PermissionAsked
    | PermissionDecided
    | Finished
)
EventSink = Callable[[RunEvent], None]
