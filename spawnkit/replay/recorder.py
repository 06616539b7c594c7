"""Record mode: rebuild model turns from relayed Anthropic traffic and write a scenario.

The recording proxy (in ``server.py``) relays each ``/v1/messages`` exchange untouched and
feeds the bytes it relays to an :class:`SSEDecoder` and a :class:`MessageAssembler`; when a
turn completes it hands the result to a :class:`Recording`, which keeps one script per
conversation and rewrites the scenario file atomically after every turn, so a recording cut
short by Ctrl-C is still a valid scenario. Turns are stored by their index in the
conversation (the number of assistant messages in the request), the same stateless rule the
replay server uses, so a retried request replaces its failed attempt instead of shifting
every later turn. Recorded model text is template-escaped and tool names glob-escaped, so
the written scenario replays exactly what passed through.
"""

from __future__ import annotations

import json
import logging
import os
import re
import tempfile
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import tomli_w

from .anthropic import MessagesRequest, prompt_text, turn_index
from .scenario import USAGE_KEYS, ErrorSpec, escape_glob, escape_template

logger = logging.getLogger(__name__)

# One SSE frame larger than this means the upstream is not speaking SSE at all.
MAX_FRAME_BYTES = 16 * 1024 * 1024
# How much of the prompt becomes a recorded script's `match`: enough to tell
# conversations apart, short enough to survive small edits to the prompt's tail.
MATCH_PREFIX_CHARS = 80
MAX_CONVERSATIONS = 1000
_REGEX_SPECIAL = re.compile(r"[.^$*+?{}\[\]\\|()]")


@dataclass(frozen=True)
class SSEEvent:
    event: str
    data: str


class SSEDecoder:
    """Incremental server-sent-events parser: feed bytes as they arrive, get whole events."""

    def __init__(self) -> None:
        self._buffer = b""
        self._event = ""
        self._data: list[str] = []

    def feed(self, chunk: bytes) -> list[SSEEvent]:
        self._buffer += chunk
        events: list[SSEEvent] = []
        while True:
            end = self._buffer.find(b"\n")
            if end < 0:
                break
            line = self._buffer[:end].rstrip(b"\r").decode("utf-8", errors="replace")
            self._buffer = self._buffer[end + 1 :]
            event = self._line(line)
            if event is not None:
                events.append(event)
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


@dataclass
class _Block:
    type: str
    text: str = ""
    name: str = ""
    partial_json: list[str] = field(default_factory=list)
    input: Any = None


class MessageAssembler:
    """Folds the Messages API stream events of one response back into a turn."""

    def __init__(self) -> None:
        self._blocks: dict[int, _Block] = {}
        self._usage: dict[str, int] = {}
        self.stop_reason: str | None = None
        self.complete = False
        self.error: ErrorSpec | None = None

    def feed(self, event: SSEEvent) -> None:
        try:
            data = json.loads(event.data)
        except json.JSONDecodeError:
            logger.warning("recorder: skipped a non-JSON %r event", event.event)
            return
        if not isinstance(data, dict):
            return
        kind = data.get("type", event.event)
        if kind == "message_start":
            self._merge_usage(data.get("message", {}).get("usage"))
        elif kind == "content_block_start":
            block = data.get("content_block", {})
            self._blocks[data.get("index", len(self._blocks))] = _Block(
                type=block.get("type", ""),
                text=block.get("text", "") or "",
                name=block.get("name", ""),
                input=block.get("input"),
            )
        elif kind == "content_block_delta":
            current = self._blocks.get(data.get("index", -1))
            delta = data.get("delta", {})
            if current is None:
                return
            if delta.get("type") == "text_delta":
                current.text += delta.get("text", "")
            elif delta.get("type") == "input_json_delta":
                current.partial_json.append(delta.get("partial_json", ""))
        elif kind == "message_delta":
            self.stop_reason = data.get("delta", {}).get("stop_reason") or self.stop_reason
            self._merge_usage(data.get("usage"))
        elif kind == "message_stop":
            self.complete = True
        elif kind == "error":
            detail = data.get("error", {})
            self.error = ErrorSpec(
                status=529 if detail.get("type") == "overloaded_error" else 500,
                type=str(detail.get("type", "api_error")),
                message=str(detail.get("message", "")),
            )

    def _merge_usage(self, usage: Any) -> None:
        if isinstance(usage, dict):
            for key in USAGE_KEYS:
                value = usage.get(key)
                if isinstance(value, int) and not isinstance(value, bool):
                    self._usage[key] = value

    def turn(self) -> RecordedTurn:
        texts: list[str] = []
        calls: list[RecordedCall] = []
        for index in sorted(self._blocks):
            block = self._blocks[index]
            if block.type == "text":
                texts.append(block.text)
            elif block.type == "tool_use":
                calls.append(RecordedCall(block.name, _tool_input(block)))
            else:
                # Thinking and server-tool blocks have no scenario equivalent.
                logger.info("recorder: dropped a %r content block", block.type)
        return RecordedTurn(
            text="\n\n".join(text for text in texts if text),
            tool_calls=tuple(calls),
            usage=dict(self._usage),
            stop_reason=self.stop_reason,
        )


def _tool_input(block: _Block) -> Mapping[str, Any]:
    raw = "".join(block.partial_json)
    if raw:
        try:
            value = json.loads(raw)
        except json.JSONDecodeError:
            logger.warning("recorder: tool %r input is not JSON: %.200s", block.name, raw)
            return {}
        return value if isinstance(value, dict) else {}
    return block.input if isinstance(block.input, dict) else {}


def turn_from_message(body: Any) -> RecordedTurn:
    """A turn from a non-streamed Messages API response body."""
    assembler = MessageAssembler()
    if not isinstance(body, dict):
        return assembler.turn()
    assembler.feed(
        SSEEvent("message_start", json.dumps({"type": "message_start", "message": body}))
    )
    for index, block in enumerate(body.get("content", [])):
        assembler.feed(
            SSEEvent(
                "",
                json.dumps({"type": "content_block_start", "index": index, "content_block": block}),
            )
        )
    assembler.feed(
        SSEEvent(
            "",
            json.dumps(
                {"type": "message_delta", "delta": {"stop_reason": body.get("stop_reason")}}
            ),
        )
    )
    return assembler.turn()


def turn_from_error(status: int, body: Any) -> RecordedTurn:
    """A turn replaying an upstream HTTP error (``{"type": "error", "error": {...}}``)."""
    detail = body.get("error", {}) if isinstance(body, dict) else {}
    if not isinstance(detail, dict):
        detail = {}
    return RecordedTurn(
        error=ErrorSpec(
            status=status if 400 <= status <= 599 else 500,
            type=str(detail.get("type", "api_error")),
            message=str(detail.get("message", f"upstream answered HTTP {status}")),
        )
    )


@dataclass
class _Conversation:
    prompt: str
    turns: dict[int, RecordedTurn] = field(default_factory=dict)


class Recording:
    """The conversations recorded so far, written to ``out`` after every completed turn."""

    def __init__(self, out: Path, upstream: str) -> None:
        self.out = out
        self.upstream = upstream
        self._lock = threading.Lock()
        self._conversations: dict[tuple[str, str], _Conversation] = {}

    def add(self, body: MessagesRequest, session_id: str, turn: RecordedTurn) -> None:
        prompt = prompt_text(body)
        index = turn_index(body)
        with self._lock:
            key = (session_id, prompt)
            conversation = self._conversations.get(key)
            if conversation is None:
                if len(self._conversations) >= MAX_CONVERSATIONS:
                    logger.warning(
                        "recorder: %d conversations recorded; ignoring new ones", MAX_CONVERSATIONS
                    )
                    return
                conversation = self._conversations[key] = _Conversation(prompt)
            previous = conversation.turns.get(index)
            # A retry that succeeded replaces the error before it, never the reverse.
            if turn.error is not None and previous is not None and previous.error is None:
                return
            conversation.turns[index] = turn
            write_scenario(self.out, self.to_dict())

    def to_dict(self) -> dict[str, Any]:
        return {
            "description": f"Recorded from {self.upstream}",
            "script": [_script(conversation) for conversation in self._conversations.values()],
        }


def _script(conversation: _Conversation) -> dict[str, Any]:
    script: dict[str, Any] = {}
    if conversation.prompt:
        script["match"] = "^" + _regex_literal(conversation.prompt[:MATCH_PREFIX_CHARS])
    turns = []
    for index in range(max(conversation.turns) + 1):
        turn = conversation.turns.get(index)
        turns.append(
            _turn_dict(turn)
            if turn is not None
            # Keep later turns at their index; replay answers this gap with this text.
            else {"text": f"[replay] turn {index} was not recorded"}
        )
    script["turn"] = turns
    return script


def _regex_literal(text: str) -> str:
    # re.escape also escapes spaces and punctuation; keep the written regex readable.
    return _REGEX_SPECIAL.sub(r"\\\g<0>", text)


def _turn_dict(turn: RecordedTurn) -> dict[str, Any]:
    if turn.error is not None:
        return {
            "error": {
                "status": turn.error.status,
                "type": turn.error.type,
                "message": turn.error.message,
            }
        }
    result: dict[str, Any] = {}
    if turn.text or not turn.tool_calls:
        result["text"] = escape_template(turn.text)
    calls = [
        {"tool": escape_glob(call.name), "input": _toml_value(call.input, call.name)}
        for call in turn.tool_calls
    ]
    if len(calls) == 1:
        result.update(calls[0])
    elif calls:
        result["tool_calls"] = calls
    if turn.usage:
        result["usage"] = dict(turn.usage)
    return result


def _toml_value(value: Any, tool: str) -> Any:
    """Template-escape strings and drop nulls, which TOML cannot express."""
    if isinstance(value, str):
        return escape_template(value)
    if isinstance(value, Mapping):
        kept = {}
        for key, item in value.items():
            if item is None:
                logger.warning("recorder: dropped null %r from a %r tool input", key, tool)
                continue
            kept[str(key)] = _toml_value(item, tool)
        return kept
    if isinstance(value, list):
        return [_toml_value(item, tool) for item in value if item is not None]
    return value


def write_scenario(out: Path, data: Mapping[str, Any]) -> None:
    """Write ``data`` as TOML via a temp file and rename, so readers never see half a file."""
    text = tomli_w.dumps(data, multiline_strings=True)
    out.parent.mkdir(parents=True, exist_ok=True)
    handle, temp = tempfile.mkstemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent)
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as stream:
            stream.write(text)
        Path(temp).replace(out)
    except BaseException:
        Path(temp).unlink(missing_ok=True)
        raise
