"""The OpenAI Responses API wire format, as the Codex CLI speaks it, for the replay server.

Pure functions only, no I/O: reduce a ``POST /v1/responses`` body to the API-neutral
:class:`~spawnkit.replay.scenario.TurnRequest`, and encode a
:class:`~spawnkit.replay.scenario.Reply` as the streamed events Codex reads
(``response.created``, per output item ``response.output_item.added`` ... deltas ...
``response.output_item.done``, then ``response.completed`` with usage) or as an API error
body. The request is stateless (``store: false``): ``input`` holds the whole conversation,
so the turn to play is the number of runs of model output items already in it.

What Codex sends, and how scenarios see it:

- Codex's own context arrives as extra messages: developer messages (base instructions,
  permissions, skills) and user messages holding ``<environment_context>...`` or
  ``# AGENTS.md instructions for ...``. The prompt is the first user message without those.
- MCP tools come as a namespace tool (``{"type": "namespace", "name": "mcp__NAME",
  "tools": [{"name": "TOOL", ...}]}``); scenarios see ``mcp__NAME__TOOL`` (any namespace
  ``NS`` gives ``NS__TOOL``), as on Claude Code, and a call goes back as
  ``{"type": "function_call", "namespace": "mcp__NAME", "name": "TOOL"}``.
- The shell tool is ``exec_command`` with ``{"cmd": ...}`` (``shell_command`` and ``shell``
  are recognised too). Tool outputs start with Codex's own header (``Chunk ID``, ``Wall
  time``, exit code ...) up to ``Output:``; ``last_tool_result`` drops that header.
- Usage counts ``input_tokens`` with cached tokens included; a scenario's (Anthropic-style)
  numbers map as input = input + cache_read + cache_creation, ``cached_tokens`` =
  cache_read, ``cache_write_tokens`` = cache_creation (Codex reports it as
  ``cache_write_input_tokens``).

The reverse direction, for record mode, is :class:`ResponseAssembler`.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, TypedDict

from .recorded import RecordedCall, RecordedTurn, int_or_none
from .scenario import ErrorSpec, PlannedCall, Reply, ShellTool, TurnRequest, estimate_tokens
from .sse import SSEEvent, chunks, frame

logger = logging.getLogger(__name__)

# Codex names the thread in this header on every model request.
SESSION_HEADER = "session-id"
# Preferred first: what codex-cli 0.169 offers, then older shapes of the same tool.
SHELL_TOOLS = (
    ShellTool("exec_command", "cmd"),
    ShellTool("shell_command", "command"),
    ShellTool("shell", "command", argv=True),
)
NAMESPACE_SEPARATOR = "__"

# A whole text part that is one `<tag>...</tag>` block is context the CLI injected.
_CONTEXT_BLOCK = re.compile(r"\A\s*<([a-z][a-z_ ]*)>.*</\1>\s*\Z", re.DOTALL)
_AGENTS_MD = "# AGENTS.md instructions for "
# Codex frames every tool output: `Chunk ID: ..`, `Wall time: ..`, `Process exited with
# code 0`, `Original token count: ..`, then `Output:` and the output itself.
_OUTPUT_HEADER = re.compile(
    r"\A(?:(?:Chunk ID|Wall time|Original token count|Total output lines|"
    r"Process exited with code|Process running with session ID)\b[^\n]*\n)+Output:\n"
)


class ResponsesRequest(TypedDict, total=False):
    """The parts of a Responses API request body the replay server reads."""

    model: str
    input: str | list[dict[str, Any]]
    instructions: str
    tools: list[dict[str, Any]]
    stream: bool


class InputTokensDetails(TypedDict):
    cached_tokens: int
    cache_write_tokens: int


class OutputTokensDetails(TypedDict):
    reasoning_tokens: int


class WireUsage(TypedDict):
    input_tokens: int
    input_tokens_details: InputTokensDetails
    output_tokens: int
    output_tokens_details: OutputTokensDetails
    total_tokens: int


class ErrorDetail(TypedDict):
    message: str
    type: str
    param: None
    code: str


class ErrorBody(TypedDict):
    error: ErrorDetail


@dataclass(frozen=True)
class OfferedTool:
    """A tool in the request: ``name`` as scenarios see it, the rest as the wire needs it."""

    name: str
    wire_name: str
    namespace: str | None = None
    kind: Literal["function", "custom"] = "function"


def _items(body: ResponsesRequest) -> list[dict[str, Any]]:
    items = body.get("input", [])
    if isinstance(items, str):
        return [{"type": "message", "role": "user", "content": items}]
    return [item for item in items if isinstance(item, dict)]


def _is_model_item(item: Mapping[str, Any]) -> bool:
    kind = item.get("type", "message")
    if kind == "message":
        return item.get("role") == "assistant"
    return kind == "reasoning" or (isinstance(kind, str) and kind.endswith("_call"))


def turn_index(body: ResponsesRequest) -> int:
    """How many model turns ``input`` holds: runs of consecutive model output items.

    One response may add several items (text, then parallel calls); Codex keeps them
    together and puts the calls' outputs after them.
    """
    turns = 0
    previous = False
    for item in _items(body):
        current = _is_model_item(item)
        if current and not previous:
            turns += 1
        previous = current
    return turns


def _texts(content: Any) -> list[str]:
    if isinstance(content, str):
        return [content]
    if not isinstance(content, list):
        return []
    return [
        part["text"]
        for part in content
        if isinstance(part, dict)
        and part.get("type") in ("input_text", "output_text", "text")
        and isinstance(part.get("text"), str)
    ]


def _is_context(text: str) -> bool:
    return bool(_CONTEXT_BLOCK.match(text)) or text.lstrip().startswith(_AGENTS_MD)


def prompt_text(body: ResponsesRequest) -> str:
    """The user's own prompt: the first user message's text that is not injected context."""
    for item in _items(body):
        if item.get("type", "message") != "message" or item.get("role") != "user":
            continue
        parts = [text.strip() for text in _texts(item.get("content")) if not _is_context(text)]
        prompt = "\n".join(part for part in parts if part)
        if prompt:
            return prompt
    return ""


def offered_tools(body: ResponsesRequest) -> dict[str, OfferedTool]:
    """The request's tools by the names scenarios see, in the order offered."""
    offered: dict[str, OfferedTool] = {}
    for tool in body.get("tools", []):
        kind = tool.get("type")
        if kind in ("function", "custom") and isinstance(tool.get("name"), str):
            offered[tool["name"]] = OfferedTool(tool["name"], tool["name"], None, kind)
        elif kind == "namespace" and isinstance(tool.get("name"), str):
            namespace = tool["name"]
            for inner in tool.get("tools", []):
                inner_kind = inner.get("type")
                if inner_kind in ("function", "custom") and isinstance(inner.get("name"), str):
                    name = f"{namespace}{NAMESPACE_SEPARATOR}{inner['name']}"
                    offered[name] = OfferedTool(name, inner["name"], namespace, inner_kind)
    return offered


def tool_names(body: ResponsesRequest) -> tuple[str, ...]:
    return tuple(offered_tools(body))


def shell_tool(body: ResponsesRequest) -> ShellTool | None:
    offered = offered_tools(body)
    for shell in SHELL_TOOLS:
        tool = offered.get(shell.name)
        if tool is not None and tool.namespace is None and tool.kind == "function":
            return shell
    return None


def output_text(output: Any) -> str:
    """A tool output as the model reads it, without Codex's ``Wall time ... Output:`` header."""
    if isinstance(output, str):
        text = output
    elif isinstance(output, list):
        text = "\n".join(_texts(output))
    else:
        text = json.dumps(output)
    stripped = _OUTPUT_HEADER.sub("", text, count=1)
    return stripped.rstrip("\n") if stripped != text else text


def last_tool_result(body: ResponsesRequest) -> str:
    """The outputs of the tool calls that ended the conversation so far, one per line."""
    results: list[str] = []
    for item in reversed(_items(body)):
        kind = item.get("type", "message")
        if isinstance(kind, str) and kind.endswith("_call_output"):
            results.append(output_text(item.get("output", "")))
        elif _is_model_item(item):
            break
    return "\n".join(reversed(results))


def system_text(body: ResponsesRequest) -> str:
    """``instructions`` and the developer/system messages (Codex puts its prompt there)."""
    parts = [body["instructions"]] if isinstance(body.get("instructions"), str) else []
    for item in _items(body):
        if item.get("type", "message") == "message" and item.get("role") in ("developer", "system"):
            parts.extend(_texts(item.get("content")))
    return "\n".join(parts)


def to_turn_request(body: ResponsesRequest) -> TurnRequest:
    return TurnRequest(
        prompt=prompt_text(body),
        turn_index=turn_index(body),
        tools=tool_names(body),
        last_tool_result=last_tool_result(body),
        system=system_text(body),
        shell=shell_tool(body),
    )


def estimate_usage(body: ResponsesRequest, reply: Reply) -> WireUsage:
    """Usage for ``reply``: the scenario's numbers where given, else chars/4 estimates."""
    given = reply.usage
    prompt_part = {key: body.get(key) for key in ("instructions", "input", "tools")}
    cached = given.cache_read_input_tokens or 0
    written = given.cache_creation_input_tokens or 0
    uncached = (
        given.input_tokens if given.input_tokens is not None else estimate_tokens(prompt_part)
    )
    output = reply.estimated_output_tokens if given.output_tokens is None else given.output_tokens
    total_input = uncached + cached + written
    return WireUsage(
        input_tokens=total_input,
        input_tokens_details=InputTokensDetails(cached_tokens=cached, cache_write_tokens=written),
        output_tokens=output,
        output_tokens_details=OutputTokensDetails(reasoning_tokens=0),
        total_tokens=total_input + output,
    )


def response_id(request: TurnRequest) -> str:
    return f"resp_replay_{request.seed}_{request.turn_index}"


def _message_item(request: TurnRequest, text: str) -> dict[str, Any]:
    return {
        "type": "message",
        "id": f"msg_replay_{request.seed}_{request.turn_index}",
        "status": "completed",
        "role": "assistant",
        "content": [{"type": "output_text", "text": text, "annotations": []}],
    }


def _call_item(
    request: TurnRequest, position: int, call: PlannedCall, offered: Mapping[str, OfferedTool]
) -> dict[str, Any]:
    tool = offered.get(call.name, OfferedTool(call.name, call.name))
    suffix = f"{request.seed}_{request.turn_index}_{position}"
    if tool.kind == "custom":
        raw = call.input.get("input")
        return {
            "type": "custom_tool_call",
            "id": f"ctc_replay_{suffix}",
            "call_id": f"call_replay_{suffix}",
            "name": tool.wire_name,
            "input": raw
            if isinstance(raw, str) and len(call.input) == 1
            else json.dumps(call.input),
            "status": "completed",
        }
    item: dict[str, Any] = {
        "type": "function_call",
        "id": f"fc_replay_{suffix}",
        "call_id": f"call_replay_{suffix}",
        "name": tool.wire_name,
        "arguments": json.dumps(call.input),
        "status": "completed",
    }
    if tool.namespace is not None:
        item["namespace"] = tool.namespace
    return item


def output_items(
    body: ResponsesRequest, request: TurnRequest, reply: Reply
) -> list[dict[str, Any]]:
    """The response's output: a message (if there is text, or nothing else), then calls."""
    items: list[dict[str, Any]] = []
    if reply.text or not reply.tool_calls:
        items.append(_message_item(request, reply.text))
    offered = offered_tools(body)
    items.extend(
        _call_item(request, position, call, offered)
        for position, call in enumerate(reply.tool_calls)
    )
    return items


def response_body(
    body: ResponsesRequest, request: TurnRequest, reply: Reply, *, model: str, usage: WireUsage
) -> dict[str, Any]:
    """The same turn as a non-streamed Responses API response (``stream: false``)."""
    return _response(request, model, "completed", output_items(body, request, reply), usage)


def _response(
    request: TurnRequest,
    model: str,
    status: str,
    output: list[dict[str, Any]],
    usage: WireUsage | None,
) -> dict[str, Any]:
    return {
        "id": response_id(request),
        "object": "response",
        "created_at": 0,  # deterministic: two runs of a scenario stream identical bytes
        "status": status,
        "model": model,
        "output": output,
        "usage": usage,
        "error": None,
        "incomplete_details": None,
    }


def sse_frames(
    body: ResponsesRequest, request: TurnRequest, reply: Reply, *, model: str, usage: WireUsage
) -> list[str]:
    """The full event stream of one streamed response, each event with its sequence number."""
    events: list[dict[str, Any]] = [
        {
            "type": "response.created",
            "response": _response(request, model, "in_progress", [], None),
        },
        {
            "type": "response.in_progress",
            "response": _response(request, model, "in_progress", [], None),
        },
    ]
    items = output_items(body, request, reply)
    for index, item in enumerate(items):
        events.extend(_item_events(index, item, reply.chunk_chars))
    events.append(
        {
            "type": "response.completed",
            "response": _response(request, model, "completed", items, usage),
        }
    )
    return [
        frame(event["type"], {**event, "sequence_number": number})
        for number, event in enumerate(events)
    ]


def _item_events(index: int, item: dict[str, Any], size: int | None) -> list[dict[str, Any]]:
    added = {"type": "response.output_item.added", "output_index": index}
    done = {"type": "response.output_item.done", "output_index": index, "item": item}
    where = {"item_id": item["id"], "output_index": index}
    if item["type"] == "message":
        text = item["content"][0]["text"]
        empty_part = {"type": "output_text", "text": "", "annotations": []}
        part = {**where, "content_index": 0}
        return [
            {**added, "item": {**item, "status": "in_progress", "content": []}},
            {"type": "response.content_part.added", **part, "part": empty_part},
            *(
                {"type": "response.output_text.delta", **part, "delta": chunk}
                for chunk in chunks(text, size)
            ),
            {"type": "response.output_text.done", **part, "text": text},
            {"type": "response.content_part.done", **part, "part": item["content"][0]},
            done,
        ]
    if item["type"] == "function_call":
        arguments = item["arguments"]
        return [
            {**added, "item": {**item, "status": "in_progress", "arguments": ""}},
            *(
                {"type": "response.function_call_arguments.delta", **where, "delta": chunk}
                for chunk in chunks(arguments, size)
            ),
            {"type": "response.function_call_arguments.done", **where, "arguments": arguments},
            done,
        ]
    return [{**added, "item": {**item, "status": "in_progress", "input": ""}}, done]


def error_body(error: ErrorSpec) -> ErrorBody:
    """An HTTP error body as OpenAI sends it; Codex shows ``message`` (for most statuses)."""
    return ErrorBody(
        error=ErrorDetail(message=error.message, type=error.type, param=None, code=error.type)
    )


# --- record mode: a relayed response back into a turn ----------------------------------


def scenario_name(item: Mapping[str, Any]) -> str:
    """A call item's tool as scenarios see it (``mcp__NAME__TOOL`` for a namespaced call)."""
    name = str(item.get("name", ""))
    namespace = item.get("namespace")
    return f"{namespace}{NAMESPACE_SEPARATOR}{name}" if namespace else name


def recorded_usage(usage: Any) -> dict[str, int]:
    """OpenAI usage in the scenario's terms: ``input_tokens`` without the cached part."""
    if not isinstance(usage, dict):
        return {}
    total = int_or_none(usage.get("input_tokens"))
    details = usage.get("input_tokens_details")
    details = details if isinstance(details, dict) else {}
    cached = int_or_none(details.get("cached_tokens")) or 0
    written = int_or_none(details.get("cache_write_tokens"))
    result: dict[str, int] = {}
    if total is not None:
        result["input_tokens"] = max(0, total - cached - (written or 0))
    output = int_or_none(usage.get("output_tokens"))
    if output is not None:
        result["output_tokens"] = output
    result["cache_read_input_tokens"] = cached
    if written is not None:
        result["cache_creation_input_tokens"] = written
    return result


class ResponseAssembler:
    """Folds the Responses API stream events of one response back into a turn."""

    def __init__(self) -> None:
        self._items: dict[int, dict[str, Any]] = {}
        self._usage: dict[str, int] = {}
        self.complete = False
        self.error: ErrorSpec | None = None

    def feed(self, event: SSEEvent) -> None:
        data = event.json()
        if not isinstance(data, dict):
            return
        kind = data.get("type", event.event)
        if kind == "response.output_item.done" and isinstance(data.get("item"), dict):
            self._items[int(data.get("output_index", len(self._items)))] = data["item"]
        elif kind in ("response.completed", "response.incomplete"):
            response = data.get("response", {})
            if not self._items:
                for index, item in enumerate(response.get("output", []) or []):
                    if isinstance(item, dict):
                        self._items[index] = item
            self._usage = recorded_usage(response.get("usage"))
            self.complete = True
        elif kind == "response.failed":
            detail = (data.get("response", {}) or {}).get("error") or {}
            self.error = ErrorSpec(
                status=500,
                type=str(detail.get("code") or "server_error"),
                message=str(detail.get("message", "")),
            )
        elif kind == "error":
            self.error = ErrorSpec(
                status=500,
                type=str(data.get("code") or "server_error"),
                message=str(data.get("message", "")),
            )

    def turn(self) -> RecordedTurn:
        texts: list[str] = []
        calls: list[RecordedCall] = []
        for index in sorted(self._items):
            item = self._items[index]
            kind = item.get("type")
            if kind == "message":
                texts.append("".join(_texts(item.get("content"))))
            elif kind == "function_call":
                calls.append(RecordedCall(scenario_name(item), _arguments(item)))
            elif kind == "custom_tool_call":
                calls.append(RecordedCall(scenario_name(item), {"input": item.get("input", "")}))
            else:
                # Reasoning and hosted-tool items have no scenario equivalent.
                logger.info("recorder: dropped a %r output item", kind)
        return RecordedTurn(
            text="\n\n".join(text for text in texts if text),
            tool_calls=tuple(calls),
            usage=dict(self._usage),
            stop_reason="tool_use" if calls else "end_turn",
        )


def _arguments(item: Mapping[str, Any]) -> Mapping[str, Any]:
    raw = item.get("arguments") or "{}"
    try:
        value = json.loads(raw) if isinstance(raw, str) else raw
    except json.JSONDecodeError:
        logger.warning("recorder: tool %r arguments are not JSON: %.200s", item.get("name"), raw)
        return {}
    return value if isinstance(value, dict) else {}


def turn_from_response(body: Any) -> RecordedTurn:
    """A turn from a non-streamed Responses API response body."""
    assembler = ResponseAssembler()
    if isinstance(body, dict):
        assembler.feed(SSEEvent("", json.dumps({"type": "response.completed", "response": body})))
    return assembler.turn()
