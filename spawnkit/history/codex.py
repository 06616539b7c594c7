"""Codex CLI transcripts: ``$CODEX_HOME/sessions/YYYY/MM/DD/rollout-<time>-<id>.jsonl`` into rows.

Each line is ``{"timestamp", "type", "payload"}``. The types used here, as Codex 0.169
writes them: ``session_meta`` (id, cwd, cli_version), ``turn_context`` (the model of the
turns that follow), ``response_item`` payloads ``function_call`` / ``custom_tool_call`` /
``local_shell_call`` (a tool call with its ``call_id``) and ``*_output`` (its result),
``event_msg`` payloads ``token_count`` (usage) and ``item_completed`` / ``exec_command_end``
/ ``mcp_tool_call_end`` (whether a tool call failed).

Token counts are cumulative: ``token_count.info.total_token_usage`` is the running total of
the session, repeated unchanged by events that add nothing. A usage row is the difference
between two successive totals (when a total goes backwards, as after a compaction, the
event's ``last_token_usage`` is used instead). Codex's ``input_tokens`` include the cached
ones; rows split them into ``input_tokens`` (uncached) and ``cache_read_tokens``.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import msgspec
from msgspec import Raw, Struct

from .rows import INPUT_PREVIEW, OUTPUT_PREVIEW, PROMPT_PREVIEW, FileFacts, Rows, preview

_ROLLOUT = re.compile(r"rollout-.*?([0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12})")
_EXIT = re.compile(r"(?:exited with code|Exit code:?)\s*(-?\d+)")
_CALL_TYPES = frozenset({"function_call", "custom_tool_call", "local_shell_call"})
_OUTPUT_TYPES = frozenset({"function_call_output", "custom_tool_call_output"})


class _Tokens(Struct):
    input_tokens: int = 0
    cached_input_tokens: int = 0
    output_tokens: int = 0


class _Info(Struct):
    total_token_usage: _Tokens | None = None
    last_token_usage: _Tokens | None = None


class _Payload(Struct):
    type: str | None = None
    id: str | None = None
    cwd: str | None = None
    cli_version: str | None = None
    model: str | None = None
    name: str | None = None
    namespace: str | None = None
    call_id: str | None = None
    arguments: Raw = Raw()
    input: Raw = Raw()
    action: Raw = Raw()
    output: Raw = Raw()
    info: _Info | None = None
    item: dict[str, Any] | None = None
    exit_code: int | None = None
    result: Raw = Raw()
    role: str | None = None
    message: str | None = None


class _Line(Struct):
    timestamp: str | None = None
    type: str | None = None
    payload: _Payload | None = None


_decode = msgspec.json.Decoder(_Line).decode


def default_roots() -> list[Path]:
    home = os.environ.get("CODEX_HOME")
    return [Path(home).expanduser() if home else Path.home() / ".codex"]


def discover(root: Path) -> list[Path]:
    found: list[Path] = []
    for folder in ("sessions", "archived_sessions"):
        if (root / folder).is_dir():
            found.extend((root / folder).rglob("rollout-*.jsonl"))
    return sorted(found, key=str)


def identify(path: Path, root: Path) -> tuple[str, str]:
    """``(session_id, project)``; the project is filled in from the session's cwd."""
    match = _ROLLOUT.search(path.name)
    return (match.group(1) if match else path.stem), ""


def _failed(output: bytes) -> bool | None:
    """Whether a tool output says it failed: a JSON ``success``/exit code, or the text."""
    if not output:
        return None
    try:
        value = msgspec.json.decode(output)
    except msgspec.DecodeError:
        return None
    if isinstance(value, str):
        try:
            value = msgspec.json.decode(value)
        except msgspec.DecodeError:
            match = _EXIT.search(value)
            return int(match.group(1)) != 0 if match else None
    if isinstance(value, dict):
        if isinstance(value.get("success"), bool):
            return not value["success"]
        meta = value.get("metadata")
        if isinstance(meta, dict) and isinstance(meta.get("exit_code"), int):
            return bool(meta["exit_code"] != 0)
    return None


def parse_codex_file(data: bytes, facts: FileFacts, rows: Rows) -> None:
    session = facts.session_id
    model: str | None = None
    previous: _Tokens | None = None
    errors: dict[str, bool] = {}
    results: list[tuple[str, str, bool | None, str]] = []
    number = 0
    for raw in data.split(b"\n"):
        number += 1
        if not raw or raw.isspace():
            continue
        facts.lines += 1
        try:
            line = _decode(raw)
        except msgspec.DecodeError:
            facts.bad(number)
            continue
        p, ts = line.payload, line.timestamp
        if p is None or not ts:
            continue
        facts.seen(ts)
        if line.type == "session_meta":
            facts.cwd = facts.cwd or p.cwd
            facts.project = facts.project or p.cwd or ""
            facts.version = facts.version or p.cli_version
        elif line.type == "turn_context":
            model = p.model or model
        elif line.type == "response_item":
            if p.type in _CALL_TYPES and p.call_id:
                name = p.name or ("shell" if p.type == "local_shell_call" else "")
                if p.namespace:
                    name = f"{p.namespace}__{name}"
                args = p.arguments or p.input or p.action
                rows.calls.append(
                    (session, p.call_id, name, _string(args, INPUT_PREVIEW), ts, model, False)
                )
            elif p.type in _OUTPUT_TYPES and p.call_id:
                results.append(
                    (p.call_id, ts, _failed(p.output), _string(p.output, OUTPUT_PREVIEW))
                )
        elif line.type == "event_msg":
            if p.type == "token_count" and p.info is not None:
                delta = _delta(previous, p.info)
                if p.info.total_token_usage is not None:
                    previous = p.info.total_token_usage
                if delta is not None:
                    cached = min(delta.cached_input_tokens, delta.input_tokens)
                    rows.usage.append((session, None, None, ts, model, delta.input_tokens - cached,
                                   delta.output_tokens, 0, 0, cached, False, None))  # fmt: skip
            elif p.type in ("exec_command_end", "mcp_tool_call_end") and p.call_id:
                errors[p.call_id] = _event_failed(p)
            elif p.type == "user_message" and p.message and facts.first_prompt is None:
                facts.first_prompt = p.message[:PROMPT_PREVIEW]
            elif p.type == "item_completed" and isinstance(p.item, dict):
                item = p.item
                if item.get("type") == "UserMessage" and facts.first_prompt is None:
                    facts.first_prompt = _item_text(item)
                if isinstance(item.get("id"), str) and ("exit_code" in item or "status" in item):
                    code = item.get("exit_code")
                    errors[item["id"]] = item.get("status") == "failed" or (
                        isinstance(code, int) and code != 0
                    )
    for call_id, ts, failed, output in results:
        rows.results.append((session, call_id, ts, errors.get(call_id, failed), output))


def _string(raw: Raw, limit: int) -> str:
    """A preview of a JSON value; Codex encodes arguments and outputs as JSON strings."""
    try:
        value = msgspec.json.decode(raw) if raw else ""
    except msgspec.DecodeError:
        return preview(raw, limit)
    if isinstance(value, str):
        return value[:limit]
    return msgspec.json.encode(value).decode()[:limit]


def _item_text(item: dict[str, Any]) -> str | None:
    content = item.get("content")
    if isinstance(content, list):
        texts = [c.get("text") for c in content if isinstance(c, dict)]
        text = " ".join(t for t in texts if isinstance(t, str))
        return text[:PROMPT_PREVIEW] or None
    return None


def _event_failed(p: _Payload) -> bool:
    if p.exit_code is not None:
        return p.exit_code != 0
    return bytes(p.result).startswith(b'{"Err"')


def _delta(previous: _Tokens | None, info: _Info) -> _Tokens | None:
    """The usage an event adds; None when it adds nothing."""
    total = info.total_token_usage
    if total is None:
        return info.last_token_usage
    if previous is None:
        delta = total
    else:
        delta = _Tokens(
            total.input_tokens - previous.input_tokens,
            total.cached_input_tokens - previous.cached_input_tokens,
            total.output_tokens - previous.output_tokens,
        )
        if min(delta.input_tokens, delta.cached_input_tokens, delta.output_tokens) < 0:
            delta = info.last_token_usage or total
    if delta.input_tokens == 0 and delta.output_tokens == 0 and delta.cached_input_tokens == 0:
        return None
    return delta
