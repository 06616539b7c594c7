"""The agent CLIs' own telemetry (CLI telemetry, :mod:`spawnkit.telemetry.otlp`) as DataFrames.

``spans()``: one row per stored span: its ``session_id``, ``trace_id`` and ``span_id``,
``name``, ``parent_span_id``, the CLI's ``service`` name, ``started_at`` (UTC) and
``duration_ms``. ``cli_events()``: one row per stored
log event (``kind = "log"``: Claude Code's ``api_request``, ``tool_result``, ...,
Gemini's ``gemini_cli.api_response``, Codex's ``codex.sse_event``, ...) or metric data
point (``kind = "metric"``, its ``value``). Both pull what the three CLIs each name
their own way into common columns (``model``, ``input_tokens``, ``output_tokens``,
``tool``, and for events ``duration_ms`` and ``status``); ``attributes`` keeps every
(redacted) attribute as a dict. Column names follow the history frames' one rule
(docs/history.md); the old ones still work for a release (:mod:`spawnkit.history.renamed`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from ..store import SessionStore
from .renamed import with_old_names
from .store_frames import store_source

SPAN_COLUMNS = [
    "session_id", "trace_id", "span_id", "name", "parent_span_id", "service", "started_at",
    "duration_ms",
    "model", "input_tokens", "output_tokens", "tool", "status", "reparented", "attributes",
]  # fmt: skip

CLI_EVENT_COLUMNS = [
    "session_id", "kind", "timestamp", "name", "service", "model", "input_tokens", "output_tokens",
    "tool", "duration_ms", "status", "value", "trace_id", "span_id", "attributes",
]  # fmt: skip

# The columns' names before the one naming rule (docs/history.md), answered until the next
# release with a DeprecationWarning (:mod:`spawnkit.history.renamed`).
SPAN_OLD_NAMES = {
    "session": "session_id", "span": "name", "parent": "parent_span_id", "start": "started_at",
}  # fmt: skip
CLI_EVENT_OLD_NAMES = {"session": "session_id", "time": "timestamp"}

# The attribute names each CLI uses, first match wins.
_MODEL = ("gen_ai.response.model", "gen_ai.request.model", "model", "llm.model", "model_name")
_INPUT = ("gen_ai.usage.input_tokens", "input_tokens", "input_token_count", "tokens.input")
_OUTPUT = ("gen_ai.usage.output_tokens", "output_tokens", "output_token_count", "tokens.output")
_TOOL = ("gen_ai.tool.name", "tool_name", "tool.name", "function_name", "tool")
_DURATION = ("duration_ms", "latency_ms", "duration")
_STATUS = ("status", "status_code", "http.response.status_code", "error.type")
_TRUE = {"true", "1", "yes"}


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


def _float(value: Any) -> float | None:
    try:
        return float(value) if value is not None else None
    except (TypeError, ValueError):
        return None


def _event_status(attributes: Mapping[str, Any]) -> str | None:
    """``ok`` or ``error`` from a ``success`` flag, else the CLI's own status (code)."""
    success = attributes.get("success")
    if success is not None and success != "":
        return "ok" if str(success).lower() in _TRUE else "error"
    if attributes.get("error") not in (None, ""):
        return "error"
    status = _first(attributes, _STATUS)
    return str(status) if status is not None else None


def existing_store(store: str | Path | None) -> SessionStore:
    """The store at ``store`` (a path or URL; None: the default one), opened for reading.

    A path where no store is is an error (:func:`store_source`), not a new empty store: a
    mistyped path would otherwise leave a file behind and read as a history with no runs.
    """
    return SessionStore(store if store is None else store_source(store))


def _read(
    store: SessionStore | str | Path | None, read: Callable[[SessionStore], list[dict[str, Any]]]
) -> list[dict[str, Any]]:
    """``read`` of the given store, or of one opened (by path or URL) and closed here."""
    if isinstance(store, SessionStore):
        return read(store)
    with existing_store(store) as opened:
        return read(opened)


def cli_events(
    store: SessionStore | str | Path | None = None, session_id: str | None = None
) -> pd.DataFrame:
    """The CLIs' log events and metric points of every run (or of ``session_id``), by time."""
    rows = []
    for e in _read(store, lambda opened: opened.cli_events(session_id)):
        attributes = e["attributes"]
        tool = _first(attributes, _TOOL)
        rows.append(
            {
                "session_id": e["session_id"],
                "kind": e["kind"],
                "timestamp": e["time_ns"],
                "name": e["name"],
                "service": e["service"],
                "model": _first(attributes, _MODEL),
                "input_tokens": _int(_first(attributes, _INPUT)),
                "output_tokens": _int(_first(attributes, _OUTPUT)),
                "tool": str(tool) if tool is not None else None,
                "duration_ms": _float(_first(attributes, _DURATION)),
                "status": _event_status(attributes),
                "value": e["value"],
                "trace_id": e["trace_id"],
                "span_id": e["span_id"],
                "attributes": attributes,
            }
        )
    frame = pd.DataFrame(rows, columns=CLI_EVENT_COLUMNS)
    frame["timestamp"] = pd.to_datetime(frame["timestamp"].astype("int64"), unit="ns", utc=True)
    for column in ("input_tokens", "output_tokens"):
        frame[column] = frame[column].astype("Int64")
    for column in ("duration_ms", "value"):
        frame[column] = frame[column].astype("float64")
    return with_old_names(frame, CLI_EVENT_OLD_NAMES)


def spans(
    store: SessionStore | str | Path | None = None, session_id: str | None = None
) -> pd.DataFrame:
    """The CLIs' spans of every run (or of ``session_id``), ordered by session and start."""
    rows = []
    for s in _read(store, lambda opened: opened.cli_spans(session_id)):
        attributes = s["attributes"]
        tool = _first(attributes, _TOOL)
        rows.append(
            {
                "session_id": s["session_id"],
                "trace_id": s["trace_id"],
                "span_id": s["span_id"],
                "name": s["name"],
                "parent_span_id": s["parent_span_id"],
                "service": s["service"],
                "started_at": s["start_ns"],
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
    frame["started_at"] = pd.to_datetime(frame["started_at"].astype("int64"), unit="ns", utc=True)
    frame["input_tokens"] = frame["input_tokens"].astype("Int64")
    frame["output_tokens"] = frame["output_tokens"].astype("Int64")
    return with_old_names(frame, SPAN_OLD_NAMES)
