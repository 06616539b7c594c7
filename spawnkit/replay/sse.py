"""Server-sent events both ways, shared by the three wire adapters and the recorder.

The replay server writes each streamed model turn as a list of SSE frames (:func:`frame`);
the recorder parses what an upstream streams back with :class:`SSEDecoder`, fed bytes as
they arrive. Anthropic and OpenAI name every event (``event:`` line); Gemini sends bare
``data:`` lines, which decode with the SSE default name ``message``.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

logger = logging.getLogger(__name__)

# One SSE frame larger than this means the upstream is not speaking SSE at all.
MAX_FRAME_BYTES = 16 * 1024 * 1024


def frame(event: str | None, data: Any) -> str:
    """One SSE frame carrying ``data`` as compact JSON; ``event=None`` omits the name."""
    payload = json.dumps(data, separators=(",", ":"))
    return f"event: {event}\ndata: {payload}\n\n" if event else f"data: {payload}\n\n"


def chunks(text: str, size: int | None) -> Iterator[str]:
    """``text`` in pieces of ``size`` characters (a scenario's ``chunk_chars``), or whole."""
    if not size or len(text) <= size:
        yield text
        return
    for start in range(0, len(text), size):
        yield text[start : start + size]


@dataclass(frozen=True)
class SSEEvent:
    event: str
    data: str

    def json(self) -> Any:
        """The event's data as JSON, or None (logged) when an upstream sent something else."""
        try:
            return json.loads(self.data)
        except json.JSONDecodeError:
            logger.warning("recorder: skipped a non-JSON %r event", self.event)
            return None


class SSEDecoder:
    """Incremental server-sent-events parser: feed bytes as they arrive, get whole events."""

    def __init__(self) -> None:
        self._buffer = b""
        self._event = ""
        self._data: list[str] = []

    def feed(self, chunk: bytes) -> list[SSEEvent]:
        buffer = self._buffer + chunk
        events: list[SSEEvent] = []
        start = 0
        # Lines are cut by index and the rest kept once: cutting the buffer at every line
        # copied a relayed read of 256 KB a hundred times over.
        while (end := buffer.find(b"\n", start)) >= 0:
            line = buffer[start:end].rstrip(b"\r").decode("utf-8", errors="replace")
            start = end + 1
            event = self._line(line)
            if event is not None:
                events.append(event)
        self._buffer = buffer[start:]
        if len(self._buffer) > MAX_FRAME_BYTES:
            raise ValueError(f"SSE line longer than {MAX_FRAME_BYTES} bytes")
        return events

    def _line(self, line: str) -> SSEEvent | None:
        if not line:
            if not self._data and not self._event:
                return None
            event = SSEEvent(self._event or "message", "\n".join(self._data))
            self._event, self._data = "", []
            return event
        if line.startswith(":"):
            return None
        name, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if name == "event":
            self._event = value
        elif name == "data":
            self._data.append(value)
        return None
