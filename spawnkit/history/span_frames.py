"""The agent CLIs' own spans (CLI telemetry, :mod:`spawnkit.otlp`) as a DataFrame: ``spans()``.

One row per stored span: its session, trace and span ids, name, parent, the CLI's
service name, start (UTC) and duration, and what the three CLIs each name their own
way pulled into common columns: ``model``, ``input_tokens``, ``output_tokens``,
``tool``. ``attributes`` keeps every (redacted) attribute as a dict.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from ..store import SessionStore

SPAN_COLUMNS = [
    "session", "trace_id", "span_id", "span", "parent", "service", "start", "duration_ms",
    "model", "input_tokens", "output_tokens", "tool", "status", "reparented", "attributes",
]  # fmt: skip

# The attribute names each CLI uses, first match wins.
_MODEL = ("gen_ai.response.model", "gen_ai.request.model", "model", "llm.model", "model_name")
_INPUT = ("gen_ai.usage.input_tokens", "input_tokens", "input_token_count", "tokens.input")
_OUTPUT = ("gen_ai.usage.output_tokens", "output_tokens", "output_token_count", "tokens.output")
_TOOL = ("gen_ai.tool.name", "tool_name", "tool.name", "function_name", "tool")


def _first(attributes: Mapping[str, Any], names: Sequence[str]) -> Any:
    for name in names:
        value = attributes.get(name)
        if value not in (None, ""):
            return value
    return None


def _int(value: Any) -> int | None:
    try:
        return int(value) if value is not None else None
    except (TypeError, ValueError):
        return None


def spans(
    store: SessionStore | str | Path | None = None, session_id: str | None = None
) -> pd.DataFrame:
    """The CLIs' spans of every run (or of ``session_id``), ordered by session and start."""
    if not isinstance(store, SessionStore):
        store = SessionStore(Path(store)) if store is not None else SessionStore()
    rows = []
    for s in store.cli_spans(session_id):
        attributes = s["attributes"]
        tool = _first(attributes, _TOOL)
        rows.append(
            {
                "session": s["session_id"],
                "trace_id": s["trace_id"],
                "span_id": s["span_id"],
                "span": s["name"],
                "parent": s["parent_span_id"],
                "service": s["service"],
                "start": s["start_ns"],
                "duration_ms": max(0, s["end_ns"] - s["start_ns"]) / 1e6,
                "model": _first(attributes, _MODEL),
                "input_tokens": _int(_first(attributes, _INPUT)),
                "output_tokens": _int(_first(attributes, _OUTPUT)),
                "tool": str(tool) if tool is not None else None,
                "status": s["status"],
                "reparented": s["reparented"],
                "attributes": attributes,
            }
        )
    frame = pd.DataFrame(rows, columns=SPAN_COLUMNS)
    frame["start"] = pd.to_datetime(frame["start"].astype("int64"), unit="ns", utc=True)
    frame["input_tokens"] = frame["input_tokens"].astype("Int64")
    frame["output_tokens"] = frame["output_tokens"].astype("Int64")
    return frame
