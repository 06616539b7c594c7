"""Model request latency and tool time, read from the agent CLIs' own telemetry.

With CLI telemetry on, each CLI sends a log event per model request and per tool call
to the run's OTLP receiver (:mod:`spawnkit.telemetry.otlp`), each CLI under its own names:

============ =============================== ======================== =====================
CLI          model request                   tool call                tool name attribute
============ =============================== ======================== =====================
Claude Code  ``api_request``, ``api_error``  ``tool_result``          ``tool_name``
Codex        ``codex.api_request``           ``codex.tool_result``    ``tool_name`` (MCP:
                                                                      ``tool_namespace``)
Gemini       ``gemini_cli.api_response``,    ``gemini_cli.tool_call`` ``function_name``
             ``gemini_cli.api_error``
============ =============================== ======================== =====================

Each carries ``duration_ms``. :func:`classify` turns one such event into a
:class:`Measurement` (None for every other event); :class:`RunTimings` keeps a run's
running p50/p90 of model latency and total time per tool and makes the
:class:`~spawnkit.events.Timing` event the live views get. The log events, not the
spans, are the source: all three CLIs send them (Claude Code's spans are a beta), they
name the model and the tool, and counting one source never counts a request twice.
What a "request" measures is the CLI's own figure: Claude Code and Gemini time the
whole response; Codex's ``codex.api_request`` times the HTTP request up to the response
headers (its stream follows as ``codex.sse_event``).

:func:`span_kind` says which spans of a waterfall are model requests or tool calls.
:func:`percentile` interpolates linearly, like pandas' ``quantile``, so the live figures
and ``spawnkit.history`` agree.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from ..events import Timing, ToolTime

TimingKind = Literal["model", "tool"]

MODEL_EVENTS = frozenset(
    {
        "api_request", "claude_code.api_request", "api_error", "claude_code.api_error",
        "codex.api_request",
        "gemini_cli.api_response", "gemini_cli.api_error",
    }
)  # fmt: skip
TOOL_EVENTS = frozenset(
    {"tool_result", "claude_code.tool_result", "codex.tool_result", "gemini_cli.tool_call"}
)
# Spans that are one model request or one tool call (for a waterfall's ``kind``).
MODEL_SPANS = frozenset({"claude_code.llm_request", "llm_call", "stream_request"})
TOOL_SPANS = frozenset({"claude_code.tool", "tool_call", "handle_tool_call"})
# The tools a run shows, most time first.
TOP_TOOLS = 3
_TRUE = {"true", "1", "yes"}
_TOOL_NAMES = ("tool_name", "function_name", "gen_ai.tool.name", "tool.name")
_MODEL_NAMES = ("model", "gen_ai.response.model", "gen_ai.request.model")


@dataclass(frozen=True)
class Measurement:
    """One model request or tool call, as a CLI's log event reported it.

    ``name`` is the model (``kind == "model"``) or the tool; ``status`` ``"ok"`` or
    ``"error"``; tokens, time to first token and the attempt when the CLI says.
    """

    kind: TimingKind
    name: str
    duration_ms: float
    status: str
    time_ns: int = 0
    input_tokens: int | None = None
    output_tokens: int | None = None
    ttft_ms: float | None = None
    attempt: int | None = None


def _number(value: Any) -> float | None:
    if value is None or value == "" or isinstance(value, bool):
        return None
    try:
        found = float(value)
    except (TypeError, ValueError):
        return None
    return found if math.isfinite(found) else None


def _whole(value: Any) -> int | None:
    found = _number(value)
    return int(found) if found is not None else None


def _first(attributes: Mapping[str, Any], names: Sequence[str]) -> Any:
    for name in names:
        if attributes.get(name) not in (None, ""):
            return attributes[name]
    return None


def _status(name: str, attributes: Mapping[str, Any]) -> str:
    if name.endswith("api_error"):
        return "error"
    success = attributes.get("success")
    if success not in (None, ""):
        return "ok" if str(success).lower() in _TRUE else "error"
    if attributes.get("error") not in (None, ""):
        return "error"
    code = _whole(
        _first(attributes, ("http.response.status_code", "status_code", "http.status_code"))
    )
    return "error" if code is not None and code >= 400 else "ok"


def _tool_name(attributes: Mapping[str, Any]) -> str:
    tool = str(_first(attributes, _TOOL_NAMES) or "?")
    namespace = attributes.get("tool_namespace")
    # Codex names an MCP tool by its bare name, its server in the namespace ("mcp__health").
    if isinstance(namespace, str) and namespace.startswith("mcp__"):
        return f"{namespace}__{tool}"
    return tool


def classify(name: str, attributes: Mapping[str, Any], time_ns: int = 0) -> Measurement | None:
    """The model request or tool call one CLI log event reports, or None.

    ``name`` is the event's name (``event.name``), ``attributes`` its attributes.
    An event without a usable ``duration_ms`` is not a measurement.
    """
    if name in MODEL_EVENTS:
        kind: TimingKind = "model"
    elif name in TOOL_EVENTS:
        kind = "tool"
    else:
        return None
    duration = _number(attributes.get("duration_ms"))
    if duration is None or duration < 0:
        return None
    if kind == "model":
        label = str(_first(attributes, _MODEL_NAMES) or "?")
    else:
        label = _tool_name(attributes)
    return Measurement(
        kind=kind,
        name=label,
        duration_ms=duration,
        status=_status(name, attributes),
        time_ns=time_ns,
        input_tokens=_whole(_first(attributes, ("input_tokens", "input_token_count"))),
        output_tokens=_whole(_first(attributes, ("output_tokens", "output_token_count"))),
        ttft_ms=_number(attributes.get("ttft_ms")),
        attempt=_whole(attributes.get("attempt")),
    )


def span_kind(name: str) -> TimingKind | None:
    """``"model"`` or ``"tool"`` for a CLI span that is one model request or tool call."""
    if name in MODEL_SPANS:
        return "model"
    if name in TOOL_SPANS:
        return "tool"
    return None


def percentile(ordered: Sequence[float], q: float) -> float | None:
    """The ``q`` quantile (0..1) of ascending values, linearly interpolated; None if empty."""
    if not ordered:
        return None
    position = (len(ordered) - 1) * q
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


class RunTimings:
    """One run's model latencies and tool times so far.

    :meth:`add` takes a :class:`Measurement` and returns the
    :class:`~spawnkit.events.Timing` event for it, running figures included.
    """

    def __init__(self, session_id: str) -> None:
        self.session_id = session_id
        self.latencies: list[float] = []  # ascending
        self.tools: dict[str, list[float]] = {}  # tool -> [calls, total ms]

    def add(self, measured: Measurement) -> Timing:
        if measured.kind == "model":
            bisect.insort(self.latencies, measured.duration_ms)
        else:
            totals = self.tools.setdefault(measured.name, [0, 0.0])
            totals[0] += 1
            totals[1] += measured.duration_ms
        return Timing(
            session_id=self.session_id,
            kind=measured.kind,
            name=measured.name,
            duration_ms=measured.duration_ms,
            status=measured.status,
            requests=len(self.latencies),
            p50_ms=percentile(self.latencies, 0.5),
            p90_ms=percentile(self.latencies, 0.9),
            tools=self.tool_times(),
            ttft_ms=measured.ttft_ms,
        )

    def tool_times(self) -> tuple[ToolTime, ...]:
        """Every tool so far, most total time first (then by name)."""
        ranked = sorted(self.tools.items(), key=lambda item: (-item[1][1], item[0]))
        return tuple(ToolTime(tool, int(calls), total) for tool, (calls, total) in ranked)


def _ms(value: float) -> str:
    return f"{value / 1000:.1f} s" if value >= 1000 else f"{value:.0f} ms"


def timing_line(timing: Timing, top: int = TOP_TOOLS) -> str:
    """One line of a run's timings: ``model 3 requests · p50 31 ms · p90 60 ms · tools
    Bash 52 ms (1), mcp_tool 19 ms (1)``; the ``top`` tools with the most time."""
    parts = []
    if timing.requests:
        parts.append(
            f"model {timing.requests} request{'s' if timing.requests != 1 else ''}"
            f" · p50 {_ms(timing.p50_ms or 0.0)} · p90 {_ms(timing.p90_ms or 0.0)}"
        )
    if timing.tools:
        shown = ", ".join(f"{t.tool} {_ms(t.total_ms)} ({t.calls})" for t in timing.tools[:top])
        more = len(timing.tools) - top
        parts.append(f"tools {shown}" + (f" +{more} more" if more > 0 else ""))
    return " · ".join(parts)
