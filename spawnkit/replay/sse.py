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
    """Incremental server-sent-events parser: feed bytes as they arrive, get whole events.

    ``only`` names the events wanted: an event whose ``event:`` line names another is
    dropped, and when that line comes first, as Anthropic and OpenAI send it, its ``data:``
    lines are passed over unread (neither decoded nor kept). Events without a name (SSE's
    ``message``, all of Gemini's) are always kept. The metering relay reads only the events
    that carry usage this way, at a fraction of the cost of the whole stream.
    """

    def __init__(self, only: frozenset[str] | None = None) -> None:
        self._only = only
        self._buffer = b""
        self._event = ""
        self._data: list[str] = []
        self._unwanted = False  # the current event is named, and not in ``only``

    def feed(self, chunk: bytes) -> list[SSEEvent]:
        events: list[SSEEvent] = []
        start = 0
        if self._buffer:  # the line the last piece cut: only it is copied, not the piece
            end = chunk.find(b"\n")
            if end < 0:
                self._keep(self._buffer + chunk)
                return events
            line = self._buffer + chunk[:end]
            if (event := self._take(line, 0, len(line))) is not None:
                events.append(event)
            start = end + 1
        # Lines are cut by index and the rest kept once: cutting the piece at every line
        # copied a relayed read of 256 KB a hundred times over.
        while (end := chunk.find(b"\n", start)) >= 0:
            if (event := self._take(chunk, start, end)) is not None:
                events.append(event)
            start = end + 1
        self._keep(chunk[start:])
        return events

    def _keep(self, rest: bytes) -> None:
        """The start of a line still to be ended by the next piece."""
        if len(rest) > MAX_FRAME_BYTES:
            raise ValueError(f"SSE line longer than {MAX_FRAME_BYTES} bytes")
        self._buffer = rest

    def _take(self, buffer: bytes, start: int, end: int) -> SSEEvent | None:
        """The line ``buffer[start:end]`` (its line end left out); the event it ends, if any."""
        if self._unwanted:  # a line of an unwanted event: not even copied out
            if end == start or (end == start + 1 and buffer[start] == 13):
                self._event, self._data, self._unwanted = "", [], False  # its end
            return None
        return self._line(buffer[start:end].rstrip(b"\r").decode("utf-8", errors="replace"))

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
            wanted = self._only is None or value in self._only or value in ("", "message")
            self._unwanted = not wanted
        elif name == "data":
            self._data.append(value)
        return None
