"""The writes a run makes after its record exists, by name, and the rows they take.

Each write is a function of a transaction and JSON values, so that one a server away
could not take is kept in the journal (:mod:`spawnkit.store.journal`) and replayed later
by the same function (:mod:`spawnkit.store.writer`); every one is idempotent, and
``replayed`` makes the inserts so too (their first try may have been committed, its answer
lost with the connection). The builders at the end turn a run's result, its tool calls
and the spans and events of its CLI into those values.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import asdict
from datetime import datetime
from typing import Any

from ..result import SpawnerResult, ToolCall
from .backend import Transaction
from .records import to_iso


def _write_started(tx: Transaction, params: Any, replayed: bool) -> None:
    if len(params) == 4:  # journaled before records were sealed: the record keeps its seal
        params = [*params[:3], None, params[3]]
    tx.execute(
        "UPDATE sessions SET status = 'running', started_at = COALESCE(started_at, ?), "
        "trace_id = ?, workspace = ?, owner_seal = COALESCE(?, owner_seal) "
        "WHERE id = ? AND completed_at IS NULL",
        params,
    )


def _write_setup(tx: Transaction, params: Any, replayed: bool) -> None:
    tx.execute("UPDATE sessions SET sandbox = ?, given = ? WHERE id = ?", params)


def _write_started_setup(tx: Transaction, params: Any, replayed: bool) -> None:
    """A run's start and its setup in one transaction (one commit a run, not two)."""
    started, setup = params
    _write_started(tx, started, replayed)
    _write_setup(tx, setup, replayed)


_COMPLETE = """UPDATE sessions SET status = ?, success = ?, error = ?, error_kind = ?,
        output = ?, tool_calls = ?, num_tool_calls = ?, duration_ms = ?,
        input_tokens = ?, output_tokens = ?, cache_read_tokens = ?,
        cache_write_tokens = ?, cost_usd = ?, num_turns = ?,
        trace_id = COALESCE(?, trace_id),
        runtime_session_id = COALESCE(?, runtime_session_id),
        model = COALESCE(?, model), completed_at = ?, budget = ?,
        attempts = ?, network_denied = ?, permissions = ?
    WHERE id = ? AND (completed_at IS NULL
        OR (status = 'crashed' AND num_tool_calls IS NULL AND owner_host = ?))"""


_COMPLETE_PARAMS = _COMPLETE.count("?")
# The calls a completion replaces: those of a record the completion will close (_COMPLETE's
# own condition).
_DELETE_CALLS_OF_COMPLETABLE = """DELETE FROM tool_calls WHERE session_id = ? AND EXISTS (
    SELECT 1 FROM sessions WHERE id = ? AND (completed_at IS NULL
        OR (status = 'crashed' AND num_tool_calls IS NULL AND owner_host = ?)))"""


def _write_complete(tx: Transaction, payload: Any, replayed: bool) -> None:
    # Calls can be there already when the run wrote them live as they started and ended
    # (record_tool_call), or when this write's first try was committed (a replay): the
    # final calls replace them. Otherwise there are none (a record is completed with its
    # calls once; only a crash mark, which has none, gives way), and none are looked for.
    replace = replayed or payload.get("live", True)
    session = payload["session"]
    if len(session) < _COMPLETE_PARAMS:  # journaled before network_denied or permissions
        missing = [0, None][len(session) - _COMPLETE_PARAMS :]
        payload = {**payload, "session": [*session[:-2], *missing, *session[-2:]]}
    if tx.writable_ctes:
        _write_complete_one_statement(tx, payload, replace)
        return
    if replace:
        # Before the record is closed: calls of a run still going are not in the store's
        # columnar copy, so replacing them does not make it stale (spawnkit/store/segments.py).
        session_id, host = payload["session"][-2:]
        tx.execute(_DELETE_CALLS_OF_COMPLETABLE, (session_id, session_id, host))
    if tx.execute(_COMPLETE, payload["session"]):
        _insert_rows(tx, _CALL_INSERT, payload["calls"])


# The completion as one statement (PostgreSQL): the record's UPDATE in a WITH, and its
# calls inserted only when that UPDATE found the record. The calls travel as one JSON
# parameter (rows of json_to_recordset), so the statement is the same whatever their
# number, is prepared once per connection, and costs the client one json.dumps. Replacing
# earlier calls: those past the new last one go, the others are overwritten in place (one
# statement must not delete and insert the same row).
_CALL_KEYS = (
    "session_id", "seq", "call_id", "name", "server", "tool", "input", "output", "status",
    "started_at", "finished_at", "duration_ms",
)  # fmt: skip
_CALL_ROWS = """json_to_recordset(?::json) AS c(session_id TEXT, seq INTEGER, call_id TEXT,
    name TEXT, server TEXT, tool TEXT, input TEXT, output TEXT, status TEXT, started_at TEXT,
    finished_at TEXT, duration_ms BIGINT)"""
# A call written again (live, then by the result) replaces the row of its place in the run.
_CALL_UPSERT = "ON CONFLICT (session_id, seq) DO UPDATE SET " + ", ".join(
    f"{key} = excluded.{key}" for key in _CALL_KEYS[2:]
)
_COMPLETE_WITH_CALLS = f"""WITH done AS ({_COMPLETE} RETURNING id)
    INSERT INTO tool_calls ({", ".join(_CALL_KEYS)})
    SELECT c.* FROM {_CALL_ROWS} WHERE EXISTS (SELECT 1 FROM done)"""
_COMPLETE_REPLACING_CALLS = f"""WITH done AS ({_COMPLETE} RETURNING id),
    gone AS (DELETE FROM tool_calls WHERE session_id IN (SELECT id FROM done) AND seq >= ?)
    INSERT INTO tool_calls ({", ".join(_CALL_KEYS)})
    SELECT c.* FROM {_CALL_ROWS} WHERE EXISTS (SELECT 1 FROM done)
    {_CALL_UPSERT}"""


def _write_complete_one_statement(tx: Transaction, payload: Any, replace: bool) -> None:
    calls = payload["calls"]
    if not calls and not replace:
        tx.execute(_COMPLETE, payload["session"])
        return
    rows = json.dumps([dict(zip(_CALL_KEYS, call, strict=True)) for call in calls])
    if replace:
        tx.execute(_COMPLETE_REPLACING_CALLS, [*payload["session"], len(calls), rows])
    else:
        tx.execute(_COMPLETE_WITH_CALLS, [*payload["session"], rows])


# A tool call written live (record_tool_call), only while its record is open. The casts
# type the two numbers a server cannot infer in a SELECT list (a NULL would be text).
LIVE_CALL = f"""INSERT INTO tool_calls ({", ".join(_CALL_KEYS)})
    SELECT ?, CAST(? AS INTEGER), ?, ?, ?, ?, ?, ?, ?, ?, ?, CAST(? AS BIGINT)
    WHERE EXISTS (SELECT 1 FROM sessions WHERE id = ? AND completed_at IS NULL)
    {_CALL_UPSERT}"""
_CALL_INSERT = """INSERT INTO tool_calls (session_id, seq, call_id, name, server, tool, input,
    output, status, started_at, finished_at, duration_ms) VALUES """
# Rows per multi-row INSERT: one statement (one round trip on a server) for a run's calls,
# far below SQLite's limit of 32766 parameters.
_ROWS_PER_INSERT = 500


def _insert_rows(tx: Transaction, insert: str, rows: Sequence[Sequence[object]]) -> None:
    """``rows`` with as few ``INSERT … VALUES (…), (…)`` statements as fit."""
    for start in range(0, len(rows), _ROWS_PER_INSERT):
        chunk = rows[start : start + _ROWS_PER_INSERT]
        marks = "(" + ", ".join("?" * len(chunk[0])) + ")"
        tx.execute(insert + ", ".join([marks] * len(chunk)), [v for row in chunk for v in row])


def _write_cli_spans(tx: Transaction, rows: Any, replayed: bool) -> None:
    if replayed:
        tx.executemany(
            "DELETE FROM cli_spans WHERE session_id = ? AND span_id = ?",
            [(r[0], r[2]) for r in rows],
        )
    tx.executemany(
        """INSERT INTO cli_spans (session_id, trace_id, span_id, parent_span_id, name,
               service, start_ns, end_ns, status, attributes, reparented)
           VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)""",
        rows,
    )


def _write_cli_events(tx: Transaction, rows: Any, replayed: bool) -> None:
    if replayed:
        tx.executemany(
            "DELETE FROM cli_events WHERE session_id = ? AND kind = ? AND name = ? AND time_ns = ?",
            sorted({(r[0], r[1], r[2], r[4]) for r in rows}),
        )
    tx.executemany(
        """INSERT INTO cli_events (session_id, kind, name, service, time_ns, trace_id,
               span_id, value, attributes)
           VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)""",
        rows,
    )


# The writes that are one statement (a server commits it without BEGIN and COMMIT).
SINGLE_STATEMENT = frozenset({"started", "setup", "mcp_call", "episode"})
# ... and on an engine with writable CTEs (PostgreSQL) the completion too.
SINGLE_WITH_CTES = SINGLE_STATEMENT | {"complete"}


def _write_mcp_call(tx: Transaction, row: Any, replayed: bool) -> None:
    """An MCP call the butler's server saw; its session found by key if it was not yet."""
    butler, key, session_id, tool, _, _, _, called_at, _ = row
    if replayed:
        tx.execute(
            "DELETE FROM mcp_calls WHERE butler = ? AND tool = ? AND called_at = ? "
            "AND COALESCE(session_key, '') = COALESCE(?, '')",
            (butler, tool, called_at, key),
        )
    tx.execute(
        """INSERT INTO mcp_calls (butler, session_key, session_id, tool, arguments, result,
               is_error, called_at, duration_ms)
           SELECT ?, ?, COALESCE(?, (SELECT id FROM sessions WHERE runtime_session_id = ?
               OR id = ? ORDER BY created_at DESC LIMIT 1)), ?, ?, ?, ?, ?, ?""",
        [butler, key, session_id, key, key, *row[3:]],
    )


def _write_episode(tx: Transaction, row: Any, replayed: bool) -> None:
    butler, session_id, _, _, created_at = row
    if replayed:
        tx.execute(
            "DELETE FROM episodes WHERE butler = ? AND created_at = ? "
            "AND COALESCE(session_id, '') = COALESCE(?, '')",
            (butler, created_at, session_id),
        )
    tx.execute(
        "INSERT INTO episodes (butler, session_id, prompt, output, created_at) "
        "VALUES (?, ?, ?, ?, ?)",
        row,
    )


WRITES: dict[str, Callable[[Transaction, Any, bool], None]] = {
    "started": _write_started,
    "setup": _write_setup,
    "started_setup": _write_started_setup,
    "complete": _write_complete,
    "cli_spans": _write_cli_spans,
    "cli_events": _write_cli_events,
    "mcp_call": _write_mcp_call,
    "episode": _write_episode,
}
# A write that failed faster than this was on a pooled connection the server had already


# -- the values each write takes, built from what a run produced ------------------------


def tool_call_row(session_id: str, seq: int, call: ToolCall) -> list[Any]:
    """A ``tool_calls`` row: ``seq`` is the call's place in the run."""
    return [
        session_id, seq, call.id, call.name, call.server, call.tool,
        json.dumps(call.input, ensure_ascii=False), call.output, call.status,
        to_iso(call.started_at), to_iso(call.finished_at), call.duration_ms,
    ]  # fmt: skip


def completion(
    session_id: str, result: SpawnerResult, completed_at: datetime, host: str, live: bool
) -> dict[str, Any]:
    """The "complete" write's payload: the record's columns (only a ``crashed`` mark of
    ``host``'s gives way), its calls' rows, and whether calls written ``live`` are there
    to replace."""
    calls_json = json.dumps([c.to_dict() for c in result.tool_calls], ensure_ascii=False)
    session = [
        result.status, int(result.success), result.error, result.error_kind,
        result.output, calls_json, len(result.tool_calls), result.duration_ms,
        result.usage.input_tokens, result.usage.output_tokens,
        result.usage.cache_read_tokens, result.usage.cache_write_tokens,
        result.cost_usd, result.num_turns, result.trace_id,
        result.runtime_session_id, result.model,
        to_iso(completed_at),
        json.dumps(asdict(result.budget)) if result.budget else None,
        json.dumps([a.to_dict() for a in result.attempts]) if result.attempts else None,
        result.network_denied,
        json.dumps([a.to_dict() for a in result.permissions]) if result.permissions else None,
        session_id, host,
    ]  # fmt: skip
    calls = [tool_call_row(session_id, seq, c) for seq, c in enumerate(result.tool_calls)]
    return {"session": session, "calls": calls, "live": live}


def mcp_call_row(
    butler: str,
    session_key: str | None,
    session_id: str | None,
    tool: str,
    arguments: dict[str, Any],
    result: str,
    is_error: bool,
    called_at: datetime,
    duration_ms: int,
) -> list[Any]:
    """The "mcp_call" write's row (its session id None when the key found none yet)."""
    return [
        butler, session_key, session_id, tool,
        json.dumps(arguments, ensure_ascii=False, default=str), result,
        int(is_error), to_iso(called_at), duration_ms,
    ]  # fmt: skip


def cli_span_rows(spans: Sequence[dict[str, Any]]) -> list[list[Any]]:
    """The "cli_spans" write's rows, from ``spawnkit.telemetry.otlp.CliSpan`` fields."""
    return [
        [
            s["session_id"], s["trace_id"], s["span_id"], s["parent_span_id"],
            s["name"], s["service"], s["start_ns"], s["end_ns"], s["status"],
            json.dumps(s["attributes"], ensure_ascii=False, default=str),
            int(s["reparented"]),
        ]
        for s in spans
    ]  # fmt: skip


def cli_event_rows(events: Sequence[dict[str, Any]]) -> list[list[Any]]:
    """The "cli_events" write's rows, from ``spawnkit.telemetry.otlp.CliEvent`` fields."""
    return [
        [
            e["session_id"], e["kind"], e["name"], e["service"], e["time_ns"],
            e["trace_id"], e["span_id"], e["value"],
            json.dumps(e["attributes"], ensure_ascii=False, default=str),
        ]
        for e in events
    ]  # fmt: skip
