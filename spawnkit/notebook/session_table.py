"""The dashboard's recent-sessions table, an anywidget whose rows can be clicked.

``rows`` holds one small dict per session (already formatted: marks, durations
and costs read the same as in the run view); a click sets ``selected`` to that
session's id, which the dashboard observes to show the run's transcript.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anywidget
import traitlets

from ..store import SessionRecord
from .view_state import MARKS, format_duration

_HERE = Path(__file__).parent
PROMPT_CHARS = 80


def source_label(trigger_source: str) -> str:
    """Where a run came from, in a word or two: ``schedule:daily`` reads ``schedule daily``;
    the others (notebook, dashboard, map, chat, trigger, external) as they are stored."""
    if trigger_source.startswith("schedule:"):
        return "schedule " + trigger_source.split(":", 1)[1]
    return trigger_source


def session_row(record: SessionRecord) -> dict[str, Any]:
    failed = sum(1 for call in record.tool_calls if call.status == "error")
    tools = str(len(record.tool_calls)) + (f" ({failed} failed)" if failed else "")
    return {
        "id": record.id,
        "started": record.created_at.astimezone().strftime("%H:%M:%S"),
        "butler": record.butler,
        "runtime": record.runtime,
        "status": record.status,
        "mark": MARKS.get(record.status, "?"),
        "source": source_label(record.trigger_source),
        "tools": tools,
        "duration": format_duration(record.duration_ms),
        "cost": f"${record.cost_usd:.4f}" if record.cost_usd is not None else "",
        "prompt": " ".join(record.prompt.split())[:PROMPT_CHARS],
    }


class SessionTable(anywidget.AnyWidget):
    """Recent sessions; ``selected`` is the id of the clicked one (or "")."""

    _esm = _HERE / "session_table.js"
    _css = _HERE / "session_table.css"
    rows: traitlets.List[dict[str, Any]] = traitlets.List().tag(sync=True)
    selected = traitlets.Unicode("").tag(sync=True)

    def show(self, records: list[SessionRecord]) -> None:
        rows = [session_row(r) for r in records]
        if rows != self.rows:
            self.rows = rows
