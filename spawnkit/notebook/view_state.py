"""What a live run view shows, folded from events in constant time per event.

:class:`ViewState` keeps a bounded picture of one run (the last tool-call rows,
the tail of the assistant text, a status line) and the list of changes since
the last flush. A frontend sends :meth:`ViewState.take_batch` to the browser at
most about 20 times a second, so the cost of an event never depends on how
many came before it, and memory stays bounded for runs of any length. Pure
Python: no widget or IPython imports, so it is tested and benchmarked alone.
"""

from __future__ import annotations

import json
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from ..events import (
    AssistantText,
    Finished,
    Queued,
    RunEvent,
    Started,
    TextDelta,
    ToolCallFinished,
    ToolCallStarted,
    UsageUpdate,
)
from ..result import SpawnerResult, ToolCall

MAX_ROWS = 500
MAX_TEXT_CHARS = 20_000
PREVIEW_CHARS = 2_000
# A snapshot (for views opened late) is re-sent about once a second: keep it small.
SNAPSHOT_ROWS = 200
SNAPSHOT_PREVIEW_CHARS = 300
FLUSH_INTERVAL_S = 0.05  # at most ~20 frontend messages a second


def _preview(value: Any, limit: int = PREVIEW_CHARS) -> str:
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)
    return text if len(text) <= limit else text[:limit] + f"… [{len(text) - limit} more]"


def tool_row(call: ToolCall) -> dict[str, Any]:
    return {
        "id": call.id,
        "tool": call.tool,
        "server": call.server,
        "input": _preview(call.input),
        "status": call.status,
        "duration_ms": call.duration_ms,
        "output": None if call.output is None else _preview(call.output),
    }


def _shortened(row: dict[str, Any]) -> dict[str, Any]:
    short = dict(row)
    for key in ("input", "output"):
        value = short.get(key)
        if isinstance(value, str) and len(value) > SNAPSHOT_PREVIEW_CHARS:
            short[key] = value[:SNAPSHOT_PREVIEW_CHARS] + "…"
    return short


@dataclass
class Status:
    state: str = "starting"
    session_id: str | None = None
    butler: str | None = None
    runtime: str | None = None
    model: str | None = None
    queue_position: int | None = None
    tool_calls: int = 0
    turns: int | None = None
    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_tokens: int = 0
    cost_usd: float | None = None
    error: str | None = None
    started: float = field(default_factory=time.monotonic)
    finished: float | None = None

    def as_dict(self) -> dict[str, Any]:
        end = self.finished if self.finished is not None else time.monotonic()
        return {
            "state": self.state,
            "session_id": self.session_id,
            "butler": self.butler,
            "runtime": self.runtime,
            "model": self.model,
            "queue_position": self.queue_position,
            "tool_calls": self.tool_calls,
            "turns": self.turns,
            "input_tokens": self.input_tokens,
            "output_tokens": self.output_tokens,
            "cache_read_tokens": self.cache_read_tokens,
            "cost_usd": self.cost_usd,
            "error": self.error,
            "elapsed_s": round(end - self.started, 1),
        }


class ViewState:
    """Bounded state of one run's view plus the changes not yet sent."""

    def __init__(self, max_rows: int = MAX_ROWS, max_text: int = MAX_TEXT_CHARS) -> None:
        self.max_rows = max_rows
        self.max_text = max_text
        self.status = Status()
        self.rows: OrderedDict[str, dict[str, Any]] = OrderedDict()
        self.dropped_rows = 0
        self.text = ""
        self.result: SpawnerResult | None = None
        self.seq = 0
        self._pending_rows: dict[str, dict[str, Any]] = {}
        self._pending_text: list[str] = []
        self._status_dirty = False
        self._block_open = False

    # -- folding events ------------------------------------------------------------

    def apply(self, event: RunEvent) -> None:
        status = self.status
        if isinstance(event, Queued):
            status.state, status.queue_position = "queued", event.position
            status.session_id, status.butler = event.session_id, event.butler
        elif isinstance(event, Started):
            status.state, status.queue_position = "running", None
            status.session_id, status.butler = event.session_id, event.butler
            status.runtime, status.model = event.runtime, event.model
        elif isinstance(event, TextDelta):
            self._add_text(event.text)
            self._block_open = True
            return
        elif isinstance(event, AssistantText):
            # Runtimes that stream deltas also report the finished block; show it once.
            if not self._block_open:
                self._add_text(event.text)
            self._add_text("\n\n")
            self._block_open = False
            return
        elif isinstance(event, ToolCallStarted | ToolCallFinished):
            if isinstance(event, ToolCallStarted) and event.call.id not in self.rows:
                status.tool_calls += 1
            self._put_row(tool_row(event.call))
        elif isinstance(event, UsageUpdate):
            status.input_tokens = event.usage.input_tokens
            status.output_tokens = event.usage.output_tokens
            status.cache_read_tokens = event.usage.cache_read_tokens
            status.cost_usd = event.cost_usd if event.cost_usd is not None else status.cost_usd
            status.turns = event.turns
        elif isinstance(event, Finished):
            self.finish(event.result)
            return
        self._status_dirty = True

    def finish(self, result: SpawnerResult) -> None:
        status = self.status
        self.result = result
        status.state = result.status
        status.error = result.error
        status.session_id = result.session_id or status.session_id
        status.input_tokens = result.usage.input_tokens
        status.output_tokens = result.usage.output_tokens
        status.cache_read_tokens = result.usage.cache_read_tokens
        status.cost_usd = result.cost_usd
        status.turns = result.num_turns
        status.finished = time.monotonic()
        for call in result.tool_calls:
            if call.id in self.rows and self.rows[call.id]["status"] != call.status:
                self._put_row(tool_row(call))
        self._status_dirty = True

    def _put_row(self, row: dict[str, Any]) -> None:
        self.rows[row["id"]] = row
        self.rows.move_to_end(row["id"])
        if len(self.rows) > self.max_rows:
            self.rows.popitem(last=False)
            self.dropped_rows += 1
        self._pending_rows[row["id"]] = row

    def _add_text(self, text: str) -> None:
        self.text += text
        if len(self.text) > 2 * self.max_text:
            self.text = self.text[-self.max_text :]
        self._pending_text.append(text)

    # -- what to send --------------------------------------------------------------

    @property
    def dirty(self) -> bool:
        return bool(self._pending_rows or self._pending_text or self._status_dirty)

    def take_batch(self) -> dict[str, Any] | None:
        """The changes since the last batch, or None when there are none."""
        if not self.dirty:
            return None
        self.seq += 1
        text = "".join(self._pending_text)
        batch = {
            "kind": "batch",
            "seq": self.seq,
            "rows": list(self._pending_rows.values()),
            "text": text[-self.max_text :],
            "status": self.status.as_dict(),
            "dropped_rows": self.dropped_rows,
        }
        self._pending_rows.clear()
        self._pending_text.clear()
        self._status_dirty = False
        return batch

    def snapshot(self) -> dict[str, Any]:
        """What a newly opened view needs (bounded), tagged with the batch seq."""
        rows = list(self.rows.values())[-SNAPSHOT_ROWS:]
        return {
            "seq": self.seq,
            "rows": [_shortened(row) for row in rows],
            "text": self.text[-self.max_text :],
            "status": self.status.as_dict(),
            "dropped_rows": self.dropped_rows + max(0, len(self.rows) - SNAPSHOT_ROWS),
        }

    def render_text(self) -> str:
        """A plain-text rendering for frontends without widgets."""
        s = self.status
        lines = [
            f"{s.butler or ''} · {s.runtime or ''} · {s.state} · {s.tool_calls} tool calls · "
            f"{s.input_tokens:,} in / {s.output_tokens:,} out tokens"
        ]
        for row in self.rows.values():
            mark = {"ok": "✓", "error": "✗"}.get(row["status"], "…")
            where = f"{row['server']}." if row["server"] else ""
            lines.append(f"  {mark} {where}{row['tool']}  {row['input'][:120]}")
        if self.text.strip():
            lines.append(self.text.strip()[-2000:])
        return "\n".join(lines)
