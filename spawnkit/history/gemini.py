"""Gemini CLI transcripts: every ``.json``/``.jsonl`` chat under ``$GEMINI_CLI_HOME/.gemini/tmp``.

Gemini CLI 0.61 writes JSON lines: a header (``sessionId``, ``startTime``, ``kind`` "main"
or a sub-agent's kind, sometimes a ``summary``), message records (``id``, ``timestamp``,
``type`` "user" | "gemini" | "info" | "error", ``tokens``, ``model``, ``toolCalls``) and
``{"$set": {...}}`` updates, where a ``messages`` key replaces the whole list. A message is
written again when it gains its tool calls, so records are merged by ``id``, the last one
winning. Older versions wrote one JSON document with a ``messages`` array. Chats are usually
``tmp/<project>/chats/session-*``, but installs keep other chat files under ``tmp/`` too, so
every ``.json`` and ``.jsonl`` there is read; a file that holds no chat (a ``logs.json`` of
prompts, a ``/chat save`` checkpoint, which are JSON lists) is skipped, and the load report
(``files.skip_reason``) says why.

Gemini's ``tokens.input`` includes the cached tokens and excludes the tool-use prompt: rows
split it into ``input_tokens`` (uncached, plus the ``tool`` prompt tokens, also kept as
``tool_prompt_tokens``) and ``cache_read_tokens``. Thinking tokens (``thoughts``) are billed
as output but kept apart, in ``thinking_tokens``; ``output_tokens`` is the answer alone.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import msgspec
from msgspec import Raw, Struct

from .rows import INPUT_PREVIEW, OUTPUT_PREVIEW, PROMPT_PREVIEW, FileFacts, Rows, preview
from .walk import files_under

_ERROR_STATUSES = frozenset({"error", "cancelled"})
_EXIT = re.compile(r"Exit Code: (-?\d+)")


class _Tokens(Struct):
    input: int = 0
    output: int = 0
    cached: int = 0
    thoughts: int = 0
    tool: int = 0


class _ToolCall(Struct):
    id: str | None = None
    name: str | None = None
    args: Raw = Raw()
    result: Raw = Raw()
    status: str | None = None
    timestamp: str | None = None


class _Message(Struct, rename="camel"):
    id: str | None = None
    timestamp: str | None = None
    type: str | None = None
    content: Raw = Raw()
    tokens: _Tokens | None = None
    model: str | None = None
    tool_calls: list[_ToolCall] | None = None


class _Record(_Message, rename="camel"):
    """A whole-file session, a JSONL header or ``$set`` line, or one message line."""

    session_id: str | None = None
    start_time: str | None = None
    last_updated: str | None = None
    kind: str | None = None
    summary: str | None = None
    messages: list[_Message] | None = None
    set: dict[str, Any] | None = msgspec.field(default=None, name="$set")


_decode = msgspec.json.Decoder(_Record).decode
_decode_messages = msgspec.json.Decoder(list[_Message]).decode


def default_roots() -> list[Path]:
    home = os.environ.get("GEMINI_CLI_HOME")
    base = Path(home).expanduser() if home else Path.home()
    return [base / ".gemini"]


def _chats_folder(root: Path) -> Path:
    return root / "tmp" if (root / "tmp").is_dir() else root


def discover(root: Path) -> list[Path]:
    """Every ``.json`` and ``.jsonl`` under ``root/tmp`` (or ``root``), sorted by path."""
    tmp = _chats_folder(root)
    return files_under(tmp, (".json", ".jsonl"))


def identify(path: Path, root: Path) -> tuple[str, str]:
    """``(session_id, project)``: the file stem until the header names the session, and the
    project folder under ``tmp/``."""
    tmp = _chats_folder(root)
    parts = path.relative_to(tmp).parts if path.is_relative_to(tmp) else path.parts
    return path.stem, parts[0] if len(parts) > 1 else ""


def parse_gemini_file(data: bytes, facts: FileFacts, rows: Rows) -> None:
    head = data.lstrip()[:1]
    if head == b"[":
        facts.skip("a JSON list (a log or a saved checkpoint), not a chat session")
        return
    if head not in (b"{", b""):
        facts.skip("not JSON objects")
        return
    messages: dict[str, tuple[int, _Message]] = {}
    first = data.lstrip().split(b"\n", 1)[0].strip()
    # A pretty-printed single document (older versions) opens with a lone brace.
    records = [data] if first == b"{" else data.split(b"\n")
    number = 0
    chat = False
    for raw in records:
        number += 1
        if not raw or raw.isspace():
            continue
        facts.lines += 1
        try:
            record = _decode(raw)
        except msgspec.DecodeError:
            facts.bad(number)
            continue
        if record.session_id:
            facts.session_id = record.session_id
            chat = True
        if record.kind:
            facts.agent_kind = record.kind
        facts.set_title(record.summary, 1)
        facts.seen(record.start_time)
        if record.messages is not None:  # a whole-document (older) session file
            chat = True
            messages = {m.id or str(i): (number, m) for i, m in enumerate(record.messages)}
        if record.set is not None:
            if isinstance(record.set.get("summary"), str):
                facts.set_title(record.set["summary"], 1)
            if "messages" in record.set:
                try:
                    listed = _decode_messages(msgspec.json.encode(record.set["messages"]))
                except msgspec.DecodeError:
                    facts.bad(number)
                    continue
                messages = {m.id or str(i): (number, m) for i, m in enumerate(listed)}
        if record.id and record.type:
            chat = True
            messages[record.id] = (number, _Message(
                record.id, record.timestamp, record.type, record.content, record.tokens,
                record.model, record.tool_calls,
            ))  # fmt: skip
    if not chat and not facts.bad_lines:
        facts.skip("no chat session header or messages")
        return
    _emit(messages, facts, rows)


def _emit(messages: dict[str, tuple[int, _Message]], facts: FileFacts, rows: Rows) -> None:
    session = facts.session_id
    sidechain = facts.agent_kind not in (None, "main", "chat")
    for number, message in messages.values():
        ts = message.timestamp
        if not ts:
            continue
        facts.seen(ts)
        if message.type == "user" and facts.first_prompt is None:
            text = _text(message.content)
            if text and not text.startswith("<"):
                facts.first_prompt = text[:PROMPT_PREVIEW]
        elif message.type == "error":
            rows.events.append((number, session, ts, "api_error", None,
                                (_text(message.content) or "error")[:OUTPUT_PREVIEW]))  # fmt: skip
        if message.type != "gemini":
            continue
        tokens = message.tokens
        if tokens is not None:
            cached = min(tokens.cached, tokens.input)
            # Message ids are unique within a chat: keyed with the session, so that a chat
            # stored twice (a copy, a checkpoint) counts once.
            rows.usage.append((number, session, f"{session}/{message.id}", "gemini", ts,
                               message.model,
                               tokens.input - cached + tokens.tool, tokens.output, 0, 0, cached,
                               tokens.thoughts, tokens.tool, sidechain, None, None, None, None,
                               None, None, None, None, None))  # fmt: skip
        for call in message.tool_calls or ():
            if not call.id:
                continue
            rows.calls.append((number, session, call.id, call.name or "",
                               preview(call.args, INPUT_PREVIEW), ts, message.model, sidechain,
                               None))  # fmt: skip
            if call.status:
                output = _output(call.result)
                failed = call.status in _ERROR_STATUSES or _nonzero_exit(output)
                rows.results.append((number, session, call.id, call.timestamp or ts, failed,
                                     output[:OUTPUT_PREVIEW]))  # fmt: skip


def _output(result: Raw) -> str:
    """The text a tool returned: ``functionResponse.response.output`` (or ``error``)."""
    try:
        value = msgspec.json.decode(result) if result else None
    except msgspec.DecodeError:
        return preview(result, OUTPUT_PREVIEW)
    for part in value if isinstance(value, list) else [value]:
        response = (
            part.get("functionResponse", {}).get("response") if isinstance(part, dict) else None
        )
        if isinstance(response, dict):
            for key in ("output", "error"):
                if isinstance(response.get(key), str):
                    return str(response[key])
    return preview(result, OUTPUT_PREVIEW)


def _nonzero_exit(output: str) -> bool:
    """Gemini CLI reports a shell command's failure in its output, with status "success"."""
    match = _EXIT.search(output)
    return match is not None and int(match.group(1)) != 0


def _text(content: Raw) -> str | None:
    try:
        value = msgspec.json.decode(content) if content else None
    except msgspec.DecodeError:
        return None
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        parts = [v.get("text") for v in value if isinstance(v, dict)]
        return " ".join(p for p in parts if isinstance(p, str)) or None
    return None
