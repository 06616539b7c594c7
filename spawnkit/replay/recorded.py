"""A model turn as rebuilt from relayed traffic: what each wire adapter hands the recorder.

Each wire module (``anthropic.py``, ``openai.py``, ``gemini.py``) has an assembler that
folds its API's stream events back into a :class:`RecordedTurn`, and a function doing the
same for a non-streamed body; the recorder (``recorder.py``) only ever sees
:class:`RecordedTurn`. Usage is stored with the scenario's (Anthropic's) meaning of the
keys, whatever the API counted, so a recorded scenario replays the same numbers on every
API: ``input_tokens`` excludes cached and cache-written tokens.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from .scenario import ErrorSpec, TurnRequest
from .sse import SSEEvent


@dataclass(frozen=True)
class RecordedCall:
    name: str
    input: Mapping[str, Any]


@dataclass(frozen=True)
class RecordedTurn:
    """What the upstream model answered once: text and tool calls, or an API error."""

    text: str = ""
    tool_calls: tuple[RecordedCall, ...] = ()
    usage: Mapping[str, int] = field(default_factory=dict)
    stop_reason: str | None = None
    error: ErrorSpec | None = None


class TurnAssembler(Protocol):
    """Folds one streamed response back into a turn; ``complete`` once the stream ended well."""

    complete: bool
    error: ErrorSpec | None

    def feed(self, event: SSEEvent) -> None: ...

    def turn(self) -> RecordedTurn: ...


class TurnSink(Protocol):
    """What a relay hands each model turn it passed on: a recording, or a run's meter.

    A streamed turn may be handed over twice for one request (at its final event, then
    again with what arrived after it): ``request`` is then the same object.
    """

    def add_turn(self, request: TurnRequest, session_id: str, turn: RecordedTurn) -> None: ...


def turn_from_error(status: int, body: Any) -> RecordedTurn:
    """A turn replaying an upstream HTTP error, from any of the three APIs' error bodies.

    Anthropic sends ``{"type": "error", "error": {"type", "message"}}``, OpenAI
    ``{"error": {"message", "type", "code"}}``, Gemini ``{"error": {"code", "message",
    "status"}}``; the kind is ``type``, else ``status``, else ``code``.
    """
    detail = body.get("error", {}) if isinstance(body, dict) else {}
    if isinstance(body, list) and body and isinstance(body[0], dict):
        detail = body[0].get("error", {})  # Gemini's non-SSE stream wraps it in an array
    if not isinstance(detail, dict):
        detail = {"message": str(detail)}
    kind = next(
        (str(detail[key]) for key in ("type", "status", "code") if detail.get(key)), "api_error"
    )
    return RecordedTurn(
        error=ErrorSpec(
            status=status if 400 <= status <= 599 else 500,
            type=kind,
            message=str(detail.get("message", f"upstream answered HTTP {status}")),
        )
    )


def int_or_none(value: Any) -> int | None:
    """``value`` if it is a real integer (JSON ``true`` is not a token count)."""
    return value if isinstance(value, int) and not isinstance(value, bool) else None
