"""The Anthropic Messages API wire format, as Claude Code speaks it, for the replay server.

Pure functions only, no I/O: reduce a ``POST /v1/messages`` body to the API-neutral
:class:`~spawnkit.replay.scenario.TurnRequest`, and encode a
:class:`~spawnkit.replay.scenario.Reply` as the server-sent events the CLI expects
(``message_start``, one ``content_block_*`` triple per block, ``message_delta``,
``message_stop``) or as an API error body. Claude Code adds ``<system-reminder>`` blocks
to the first user message and may put ``role: "system"`` entries in ``messages``; both are
handled here so scenarios only ever see the user's own prompt. Everything derived from a
request (ids, token estimates) is deterministic, so two runs of a scenario are identical.
The reverse direction, for record mode, is here too: :class:`MessageAssembler` folds a
relayed stream back into a :class:`~spawnkit.replay.recorded.RecordedTurn`.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, NotRequired, TypedDict

from .recorded import RecordedCall, RecordedTurn, int_or_none
from .scenario import USAGE_KEYS, ErrorSpec, Reply, ShellTool, TurnRequest, Usage, estimate_tokens
from .sse import SSEEvent, chunks, frame

logger = logging.getLogger(__name__)

# Claude Code names the session in this header on every model request.
SESSION_HEADER = "x-claude-code-session-id"
SHELL_TOOL = ShellTool("Bash", "command")


class TextBlock(TypedDict):
    type: Literal["text"]
    text: str


class WireMessage(TypedDict):
    role: str
    content: str | list[dict[str, Any]]


class ToolDefinition(TypedDict):
    name: str
    description: NotRequired[str]
    input_schema: NotRequired[dict[str, Any]]


class MessagesRequest(TypedDict, total=False):
    """The parts of a Messages API request body the replay server reads."""

    model: str
    messages: list[WireMessage]
    system: str | list[TextBlock]
    tools: list[ToolDefinition]
    stream: bool
    max_tokens: int


class WireUsage(TypedDict):
    input_tokens: int
    output_tokens: int
    cache_read_input_tokens: int
    cache_creation_input_tokens: int


class ErrorDetail(TypedDict):
    type: str
    message: str


class ErrorBody(TypedDict):
    type: Literal["error"]
    error: ErrorDetail


_REMINDER = re.compile(r"<system-reminder>.*?</system-reminder>", re.DOTALL)


def turn_index(body: MessagesRequest) -> int:
    """How many model turns the conversation already holds: the index of the turn to play."""
    return sum(1 for message in body.get("messages", []) if message.get("role") == "assistant")


def _texts(content: str | list[dict[str, Any]]) -> list[str]:
    if isinstance(content, str):
        return [content]
    return [
        block["text"]
        for block in content
        if block.get("type") == "text" and isinstance(block.get("text"), str)
    ]


def prompt_text(body: MessagesRequest) -> str:
    """The user's own prompt: the first user message without the CLI's reminder blocks."""
    for message in body.get("messages", []):
        if message.get("role") == "user":
            parts = (_REMINDER.sub("", text).strip() for text in _texts(message["content"]))
            return "\n".join(part for part in parts if part)
    return ""


def tool_names(body: MessagesRequest) -> tuple[str, ...]:
    return tuple(
        tool["name"] for tool in body.get("tools", []) if isinstance(tool.get("name"), str)
    )


def last_tool_result(body: MessagesRequest) -> str:
    """The text of the ``tool_result`` blocks in the last user message, one per line."""
    users = [message for message in body.get("messages", []) if message.get("role") == "user"]
    if not users or isinstance(users[-1]["content"], str):
        return ""
    results: list[str] = []
    for block in users[-1]["content"]:
        if block.get("type") != "tool_result":
            continue
        content = block.get("content", "")
        if isinstance(content, str | list):
            results.append("\n".join(_texts(content)))
    return "\n".join(results)


def system_text(body: MessagesRequest) -> str:
    system = body.get("system", "")
    if isinstance(system, str):
        return system
    return "\n".join(block["text"] for block in system if isinstance(block.get("text"), str))


def to_turn_request(body: MessagesRequest) -> TurnRequest:
    tools = tool_names(body)
    return TurnRequest(
        prompt=prompt_text(body),
        turn_index=turn_index(body),
        tools=tools,
        last_tool_result=last_tool_result(body),
        system=system_text(body),
        shell=SHELL_TOOL if SHELL_TOOL.name in tools else None,
    )


def count_tokens(body: Any) -> int:
    """A deterministic stand-in for a tokenizer: about four characters a token."""
    return estimate_tokens(body)


def estimate_usage(body: MessagesRequest, reply: Reply) -> WireUsage:
    """Usage for ``reply``: the scenario's numbers where given, else chars/4 estimates."""
    prompt_part = {key: body.get(key) for key in ("system", "messages", "tools")}
    given: Usage = reply.usage
    return WireUsage(
        input_tokens=_given(given.input_tokens, count_tokens(prompt_part)),
        output_tokens=_given(given.output_tokens, reply.estimated_output_tokens),
        cache_read_input_tokens=_given(given.cache_read_input_tokens, 0),
        cache_creation_input_tokens=_given(given.cache_creation_input_tokens, 0),
    )


def _given(value: int | None, default: int) -> int:
    return default if value is None else value


def message_id(request: TurnRequest) -> str:
    return f"msg_replay_{request.seed}_{request.turn_index}"


def tool_use_id(request: TurnRequest, position: int) -> str:
    return f"toolu_replay_{request.seed}_{request.turn_index}_{position}"


def sse_frames(request: TurnRequest, reply: Reply, *, model: str, usage: WireUsage) -> list[str]:
    """The full event stream of one streamed model turn (text block first, then tool uses)."""
    frames = [
        frame(
            "message_start",
            {
                "type": "message_start",
                "message": {
                    "id": message_id(request),
                    "type": "message",
                    "role": "assistant",
                    "model": model,
                    "content": [],
                    "stop_reason": None,
                    "stop_sequence": None,
                    "usage": {**usage, "output_tokens": 1},
                },
            },
        )
    ]
    index = 0
    if reply.text or not reply.tool_calls:
        frames.append(_block_start(index, {"type": "text", "text": ""}))
        frames.extend(
            _block_delta(index, {"type": "text_delta", "text": chunk})
            for chunk in chunks(reply.text, reply.chunk_chars)
        )
        frames.append(frame("content_block_stop", {"type": "content_block_stop", "index": index}))
        index += 1
    for position, call in enumerate(reply.tool_calls):
        block = {
            "type": "tool_use",
            "id": tool_use_id(request, position),
            "name": call.name,
            "input": {},
        }
        frames.append(_block_start(index, block))
        frames.extend(
            _block_delta(index, {"type": "input_json_delta", "partial_json": chunk})
            for chunk in chunks(json.dumps(call.input), reply.chunk_chars)
        )
        frames.append(frame("content_block_stop", {"type": "content_block_stop", "index": index}))
        index += 1
    frames.append(
        frame(
            "message_delta",
            {
                "type": "message_delta",
                "delta": {"stop_reason": reply.stop_reason, "stop_sequence": None},
                "usage": {"output_tokens": usage["output_tokens"]},
            },
        )
    )
    frames.append(frame("message_stop", {"type": "message_stop"}))
    return frames


def _block_start(index: int, block: dict[str, Any]) -> str:
    return frame(
        "content_block_start",
        {"type": "content_block_start", "index": index, "content_block": block},
    )


def _block_delta(index: int, delta: dict[str, Any]) -> str:
    return frame(
        "content_block_delta", {"type": "content_block_delta", "index": index, "delta": delta}
    )


def message_body(
    request: TurnRequest, reply: Reply, *, model: str, usage: WireUsage
) -> dict[str, Any]:
    """The same turn as a non-streamed Messages API response (``stream: false``)."""
    content: list[dict[str, Any]] = []
    if reply.text or not reply.tool_calls:
        content.append({"type": "text", "text": reply.text})
    content.extend(
        {
            "type": "tool_use",
            "id": tool_use_id(request, position),
            "name": call.name,
            "input": dict(call.input),
        }
        for position, call in enumerate(reply.tool_calls)
    )
    return {
        "id": message_id(request),
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": reply.stop_reason,
        "stop_sequence": None,
        "usage": dict(usage),
    }


def error_body(error: ErrorSpec) -> ErrorBody:
    return ErrorBody(type="error", error=ErrorDetail(type=error.type, message=error.message))


@dataclass
class _Block:
    type: str
    text: str = ""
    name: str = ""
    # Text deltas, joined once at the end (+= on an attribute copies the whole text each time).
    text_deltas: list[str] = field(default_factory=list)
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
        data = event.json()
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
                current.text_deltas.append(delta.get("text", ""))
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
                value = int_or_none(usage.get(key))
                if value is not None:
                    self._usage[key] = value

    def turn(self) -> RecordedTurn:
        texts: list[str] = []
        calls: list[RecordedCall] = []
        for index in sorted(self._blocks):
            block = self._blocks[index]
            if block.type == "text":
                texts.append(block.text + "".join(block.text_deltas))
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
