"""The Gemini API wire format, as the Gemini CLI speaks it, for the replay server.

Pure functions only, no I/O: reduce a ``POST /v1beta/models/MODEL:streamGenerateContent``
(or ``:generateContent``) body to the API-neutral
:class:`~spawnkit.replay.scenario.TurnRequest`, and encode a
:class:`~spawnkit.replay.scenario.Reply` as ``GenerateContentResponse`` chunks (SSE
``data:`` lines with ``alt=sse``) or as an API error body. ``contents`` holds the whole
conversation, one ``model`` content per model turn (text and parallel ``functionCall``
parts together), so the turn to play is the number of ``model`` contents.

What the Gemini CLI sends, and how scenarios see it:

- The first user content starts with a ``<session_context>...`` text part (date, OS,
  workspace); the prompt is that content's other text.
- MCP tools are declared as ``mcp_NAME_TOOL``; scenarios see ``mcp__NAME__TOOL``, split at
  the first ``_`` after ``mcp_`` (a server name containing ``_`` splits wrongly: match such
  tools with ``mcp__*state_get``-style globs). Built-in tools keep their names
  (``run_shell_command``, ``read_file``...).
- A tool result comes back as ``functionResponse.response.output`` (or ``.error``) wrapped
  in ``<untrusted_context>``; ``last_tool_result`` unwraps it, and for
  ``run_shell_command`` keeps only the ``Output:`` section (the PGID line changes per run).
- ``usageMetadata.promptTokenCount`` includes ``cachedContentTokenCount``; a scenario's
  numbers map as prompt = input + cache_read + cache_creation, cached = cache_read,
  candidates = output. The CLI files usage under the response's ``modelVersion``.

The reverse direction, for record mode, is :class:`GenerateAssembler`.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Mapping
from typing import Any, TypedDict

from .recorded import RecordedCall, RecordedTurn, int_or_none
from .scenario import ErrorSpec, Reply, ShellTool, TurnRequest, estimate_tokens
from .sse import SSEEvent, chunks, frame

logger = logging.getLogger(__name__)

SHELL_TOOL = ShellTool("run_shell_command", "command")
_MCP_PREFIX = "mcp_"

_CONTEXT_BLOCK = re.compile(r"\A\s*<([a-z][a-z_ ]*)>.*</\1>\s*\Z", re.DOTALL)
_UNTRUSTED = re.compile(r"\A<untrusted_context>\n?(.*?)\n?</untrusted_context>\Z", re.DOTALL)
# run_shell_command's result sections, as the CLI itself parses them.
_SHELL_SECTION = re.compile(
    r"^(Output|Error|Exit Code|Signal|Background PIDs|Process Group PGID): ", re.MULTILINE
)

# HTTP status -> google.rpc status name, for error bodies whose type is not one already.
_RPC_STATUS = {
    400: "INVALID_ARGUMENT",
    401: "UNAUTHENTICATED",
    403: "PERMISSION_DENIED",
    404: "NOT_FOUND",
    409: "ABORTED",
    429: "RESOURCE_EXHAUSTED",
    499: "CANCELLED",
    500: "INTERNAL",
    501: "UNIMPLEMENTED",
    503: "UNAVAILABLE",
    504: "DEADLINE_EXCEEDED",
}
_RPC_NAME = re.compile(r"[A-Z][A-Z_]*")


class GenerateContentRequest(TypedDict, total=False):
    """The parts of a generateContent request body the replay server reads."""

    contents: list[dict[str, Any]]
    systemInstruction: str | dict[str, Any]
    tools: list[dict[str, Any]]
    generationConfig: dict[str, Any]


class UsageMetadata(TypedDict):
    promptTokenCount: int
    candidatesTokenCount: int
    totalTokenCount: int
    cachedContentTokenCount: int


class ErrorDetail(TypedDict):
    code: int
    message: str
    status: str


class ErrorBody(TypedDict):
    error: ErrorDetail


def scenario_tool_name(name: str) -> str:
    """``mcp_NAME_TOOL`` as scenarios see it, ``mcp__NAME__TOOL``; other names unchanged."""
    if name.startswith(_MCP_PREFIX) and not name.startswith("mcp__"):
        server, separator, tool = name[len(_MCP_PREFIX) :].partition("_")
        if server and separator and tool:
            return f"mcp__{server}__{tool}"
    return name


def offered_tools(body: GenerateContentRequest) -> dict[str, str]:
    """The declared functions: scenario name -> the name on the wire, in the order offered."""
    offered: dict[str, str] = {}
    for tool in body.get("tools", []):
        for declaration in tool.get("functionDeclarations", []) or []:
            name = declaration.get("name")
            if isinstance(name, str):
                offered[scenario_tool_name(name)] = name
    return offered


def tool_names(body: GenerateContentRequest) -> tuple[str, ...]:
    return tuple(offered_tools(body))


def _contents(body: GenerateContentRequest) -> list[dict[str, Any]]:
    return [content for content in body.get("contents", []) if isinstance(content, dict)]


def _parts(content: Mapping[str, Any]) -> list[dict[str, Any]]:
    return [part for part in content.get("parts", []) or [] if isinstance(part, dict)]


def turn_index(body: GenerateContentRequest) -> int:
    """How many model turns the conversation already holds: its ``model`` contents."""
    return sum(1 for content in _contents(body) if content.get("role") == "model")


def prompt_text(body: GenerateContentRequest) -> str:
    """The user's own prompt: the first user text without the CLI's context blocks."""
    for content in _contents(body):
        if content.get("role", "user") != "user":
            continue
        texts = [
            part["text"].strip()
            for part in _parts(content)
            if isinstance(part.get("text"), str) and not _CONTEXT_BLOCK.match(part["text"])
        ]
        prompt = "\n".join(text for text in texts if text)
        if prompt:
            return prompt
    return ""


def response_text(name: str, response: Any) -> str:
    """A ``functionResponse.response`` as plain text, without the CLI's framing."""
    text: str
    if isinstance(response, dict) and isinstance(response.get("output"), str):
        text = response["output"]
    elif isinstance(response, dict) and isinstance(response.get("error"), str):
        text = response["error"]
    else:
        text = json.dumps(response)
    unwrapped = _UNTRUSTED.match(text)
    if unwrapped:
        text = unwrapped.group(1)
    if name == SHELL_TOOL.name and text.startswith("Output: "):
        # split() gives ["", "Output", body, "Exit Code", body, ...]
        sections: list[str] = _SHELL_SECTION.split(text)
        text = dict(zip(sections[1::2], sections[2::2], strict=True))["Output"].rstrip("\n")
    return text


def last_tool_result(body: GenerateContentRequest) -> str:
    """The ``functionResponse`` texts of the last content, one per line."""
    contents = _contents(body)
    if not contents or contents[-1].get("role", "user") != "user":
        return ""
    results = [
        response_text(
            str(part["functionResponse"].get("name", "")), part["functionResponse"].get("response")
        )
        for part in _parts(contents[-1])
        if isinstance(part.get("functionResponse"), dict)
    ]
    return "\n".join(results)


def system_text(body: GenerateContentRequest) -> str:
    system = body.get("systemInstruction", "")
    if isinstance(system, str):
        return system
    return "\n".join(part["text"] for part in _parts(system) if isinstance(part.get("text"), str))


def to_turn_request(body: GenerateContentRequest) -> TurnRequest:
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
    """``:countTokens``: the same deterministic estimate the usage numbers use."""
    return estimate_tokens(body)


def estimate_usage(body: GenerateContentRequest, reply: Reply) -> UsageMetadata:
    """Usage for ``reply``: the scenario's numbers where given, else chars/4 estimates."""
    given = reply.usage
    prompt_part = {key: body.get(key) for key in ("systemInstruction", "contents", "tools")}
    cached = given.cache_read_input_tokens or 0
    uncached = (
        given.input_tokens if given.input_tokens is not None else estimate_tokens(prompt_part)
    )
    prompt = uncached + cached + (given.cache_creation_input_tokens or 0)
    output = reply.estimated_output_tokens if given.output_tokens is None else given.output_tokens
    return UsageMetadata(
        promptTokenCount=prompt,
        candidatesTokenCount=output,
        totalTokenCount=prompt + output,
        cachedContentTokenCount=cached,
    )


def _parts_of(body: GenerateContentRequest, reply: Reply) -> tuple[list[str], list[dict[str, Any]]]:
    offered = offered_tools(body)
    calls = [
        {"functionCall": {"name": offered.get(call.name, call.name), "args": dict(call.input)}}
        for call in reply.tool_calls
    ]
    texts = list(chunks(reply.text, reply.chunk_chars)) if reply.text or not calls else []
    return texts, calls


def _chunk(request: TurnRequest, model: str, parts: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "candidates": [{"content": {"role": "model", "parts": parts}, "index": 0}],
        "modelVersion": model,
        "responseId": f"replay_{request.seed}_{request.turn_index}",
    }


def response_chunks(
    body: GenerateContentRequest,
    request: TurnRequest,
    reply: Reply,
    *,
    model: str,
    usage: UsageMetadata,
) -> list[dict[str, Any]]:
    """One streamed turn: a chunk per text piece, then one with every function call.

    Only the last chunk carries ``finishReason`` and ``usageMetadata``, so a client that
    sums usage over chunks and one that keeps the last both see the scenario's numbers.
    """
    texts, calls = _parts_of(body, reply)
    result = [_chunk(request, model, [{"text": text}]) for text in texts]
    if calls:
        result.append(_chunk(request, model, calls))
    result[-1]["candidates"][0]["finishReason"] = "STOP"
    result[-1]["usageMetadata"] = dict(usage)
    return result


def sse_frames(
    body: GenerateContentRequest,
    request: TurnRequest,
    reply: Reply,
    *,
    model: str,
    usage: UsageMetadata,
) -> list[str]:
    return [
        frame(None, chunk)
        for chunk in response_chunks(body, request, reply, model=model, usage=usage)
    ]


def response_body(
    body: GenerateContentRequest,
    request: TurnRequest,
    reply: Reply,
    *,
    model: str,
    usage: UsageMetadata,
) -> dict[str, Any]:
    """The same turn as one ``:generateContent`` response."""
    texts, calls = _parts_of(body, reply)
    parts: list[dict[str, Any]] = [{"text": "".join(texts)}] if texts else []
    result = _chunk(request, model, parts + calls)
    result["candidates"][0]["finishReason"] = "STOP"
    result["usageMetadata"] = dict(usage)
    return result


def error_body(error: ErrorSpec) -> ErrorBody:
    """A google.rpc error body; ``status`` is the scenario's type if it is an rpc name."""
    status = (
        error.type
        if _RPC_NAME.fullmatch(error.type)
        else _RPC_STATUS.get(error.status, "INTERNAL" if error.status >= 500 else "UNKNOWN")
    )
    return ErrorBody(error=ErrorDetail(code=error.status, message=error.message, status=status))


# --- record mode: relayed chunks back into a turn -----------------------------------------


def recorded_usage(usage: Any) -> dict[str, int]:
    """Gemini usage in the scenario's terms: ``input_tokens`` without the cached part."""
    if not isinstance(usage, dict):
        return {}
    result: dict[str, int] = {}
    prompt = int_or_none(usage.get("promptTokenCount"))
    cached = int_or_none(usage.get("cachedContentTokenCount")) or 0
    if prompt is not None:
        result["input_tokens"] = max(0, prompt - cached)
    output = int_or_none(usage.get("candidatesTokenCount"))
    thoughts = int_or_none(usage.get("thoughtsTokenCount")) or 0
    if output is not None or thoughts:
        result["output_tokens"] = (output or 0) + thoughts
    result["cache_read_input_tokens"] = cached
    return result


class GenerateAssembler:
    """Folds the chunks of one streamed generateContent response back into a turn."""

    def __init__(self) -> None:
        self._text: list[str] = []
        self._calls: list[RecordedCall] = []
        self._usage: dict[str, int] = {}
        self.complete = False
        self.error: ErrorSpec | None = None

    def feed(self, event: SSEEvent) -> None:
        self.feed_chunk(event.json())

    def feed_chunk(self, data: Any) -> None:
        if not isinstance(data, dict):
            return
        if isinstance(data.get("error"), dict):
            detail = data["error"]
            code = int_or_none(detail.get("code")) or 500
            self.error = ErrorSpec(
                status=code if 400 <= code <= 599 else 500,
                type=str(detail.get("status") or "INTERNAL"),
                message=str(detail.get("message", "")),
            )
            return
        if "usageMetadata" in data:
            self._usage = recorded_usage(data["usageMetadata"])
        for candidate in data.get("candidates", [])[:1]:
            for part in _parts(candidate.get("content", {}) or {}):
                if part.get("thought"):
                    logger.info("recorder: dropped a thought part")
                elif isinstance(part.get("text"), str):
                    self._text.append(part["text"])
                elif isinstance(part.get("functionCall"), dict):
                    call = part["functionCall"]
                    args = call.get("args")
                    self._calls.append(
                        RecordedCall(
                            scenario_tool_name(str(call.get("name", ""))),
                            args if isinstance(args, dict) else {},
                        )
                    )
            if candidate.get("finishReason"):
                self.complete = True

    def turn(self) -> RecordedTurn:
        return RecordedTurn(
            text="".join(self._text),
            tool_calls=tuple(self._calls),
            usage=dict(self._usage),
            stop_reason="tool_use" if self._calls else "end_turn",
        )


def turn_from_generate(body: Any) -> RecordedTurn:
    """A turn from a ``:generateContent`` body (or a non-SSE stream's JSON array)."""
    assembler = GenerateAssembler()
    for chunk in body if isinstance(body, list) else [body]:
        assembler.feed_chunk(chunk)
    return assembler.turn()
