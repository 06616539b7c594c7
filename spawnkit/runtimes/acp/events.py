"""An ACP agent's ``session/update`` notifications and prompt result -> spawnkit's events.

Pure: :class:`AcpUpdates` sees decoded JSON-RPC params (dicts as they came over the
wire), never a process, so it is tested on messages recorded from the real agents.
Text chunks become :class:`~spawnkit.events.TextDelta` and, when a tool call or the end
closes the block, :class:`~spawnkit.events.AssistantText`; ``tool_call`` and
``tool_call_update`` become :class:`~spawnkit.events.ToolCallStarted` and
``ToolCallFinished``; usage comes from ``usage_update`` (a cost), the prompt result's
``usage`` and its ``_meta.quota`` (Gemini's token counts).

A tool call is named as the agent names it to the model where the agent says so
(claude-code-acp's ``_meta.claudeCode.toolName``); an MCP tool of the butler's server
is named ``mcp__<server>__<tool>`` whichever way the agent titled it, so records,
budgets and the MCP audit agree across runtimes.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal

from ...events import AssistantText, RunEvent, TextDelta, ToolCallFinished, ToolCallStarted
from ...events import UsageUpdate as UsageEvent
from ...result import OUTPUT_LIMIT, ToolCall, Usage, truncate
from .kinds import spawnkit_status

StopReason = Literal["end_turn", "max_tokens", "max_turn_requests", "refusal", "cancelled"]

# What each stop reason means for the run: (success, error kind, message).
STOP_REASONS: Mapping[str, tuple[bool, str | None, str | None]] = {
    "end_turn": (True, None, None),
    "max_tokens": (True, None, None),
    "max_turn_requests": (False, "max_turns", "the agent reached its turn limit (max_turns)"),
    "refusal": (False, "refusal", "the agent refused to go on"),
    "cancelled": (False, "cancelled", "the agent cancelled the prompt"),
}


def _now() -> datetime:
    return datetime.now(UTC)


def content_text(content: Any) -> str:
    """The text of a tool call's ``content`` (ACP content blocks, diffs, terminals)."""
    if isinstance(content, str):
        return content
    if isinstance(content, Mapping):
        kind = content.get("type")
        if kind == "content":
            return content_text(content.get("content"))
        if kind == "text":
            return str(content.get("text") or "")
        if kind == "diff":
            return f"{content.get('path', '')}: edited"
        if kind == "resource":
            return content_text(content.get("resource"))
        if "text" in content:
            return str(content.get("text") or "")
        return ""
    if isinstance(content, list):
        return "\n".join(text for text in map(content_text, content) if text)
    return ""


def _raw_text(raw: Any) -> str:
    """A ``rawOutput`` as text: MCP's ``content`` blocks, a string, else its JSON."""
    if raw is None:
        return ""
    if isinstance(raw, str):
        return raw
    if isinstance(raw, Mapping):
        for key in ("content", "output", "formatted_output", "aggregated_output", "stdout"):
            if key in raw and (text := content_text(raw[key]) or _plain(raw[key])):
                return text
    return json.dumps(raw, ensure_ascii=False, default=str)


def _plain(value: Any) -> str:
    return value if isinstance(value, str) else ""


# Titles the agents give an MCP tool call: Gemini "state_set (health MCP Server)",
# codex-acp "Tool: health/state_set".
_GEMINI_MCP_TITLE = re.compile(r"^(?P<tool>[\w.-]+) \((?P<server>[\w.-]+) MCP Server\)")
_CODEX_MCP_TITLE = re.compile(r"^Tool: (?P<server>[\w.-]+)/(?P<tool>[\w.-]+)")


def tool_name(update: Mapping[str, Any], server: str) -> str:
    """The name of the tool a ``tool_call`` update starts, as the agent gives it."""
    meta = update.get("_meta")
    if isinstance(meta, Mapping):
        claude = meta.get("claudeCode")
        if isinstance(claude, Mapping) and isinstance(claude.get("toolName"), str):
            return str(claude["toolName"])
    title = str(update.get("title") or "")
    for pattern in (_GEMINI_MCP_TITLE, _CODEX_MCP_TITLE):
        if found := pattern.match(title):
            return f"mcp__{found['server']}__{found['tool']}"
    kind = update.get("kind")
    if kind == "execute":
        return "shell"
    return title or str(kind or "tool")


def tool_input(update: Mapping[str, Any]) -> dict[str, Any]:
    """A tool call's input: ``rawInput`` (codex-acp wraps an MCP call's as ``{server, tool,
    arguments}``), else, from an agent that sends none (Gemini), its content when that is
    a JSON object (Gemini shows an MCP call's arguments so)."""
    raw = update.get("rawInput")
    if isinstance(raw, Mapping):
        arguments = raw.get("arguments")
        if {"server", "tool"} <= raw.keys() and isinstance(arguments, Mapping):
            return dict(arguments)
        return dict(raw)
    if raw is not None:
        return {"input": raw}
    text = content_text(update.get("content")).strip()
    if text.startswith("{"):
        try:
            parsed = json.loads(text)
        except ValueError:
            return {}
        return dict(parsed) if isinstance(parsed, dict) else {}
    return {}


def _usage(raw: Mapping[str, Any]) -> Usage:
    """ACP's ``usage`` (inputTokens counts the cached ones too; spawnkit keeps them apart)."""
    cached = int(raw.get("cachedReadTokens") or 0)
    written = int(raw.get("cachedWriteTokens") or 0)
    return Usage(
        input_tokens=max(0, int(raw.get("inputTokens") or 0) - cached - written),
        output_tokens=int(raw.get("outputTokens") or 0) + int(raw.get("thoughtTokens") or 0),
        cache_read_tokens=cached,
        cache_write_tokens=written,
    )


def _quota_usage(quota: Mapping[str, Any]) -> Usage:
    """Gemini's ``_meta.quota.token_count`` (``input_tokens``, ``output_tokens``)."""
    counts = quota.get("token_count")
    if not isinstance(counts, Mapping):
        return Usage()
    return Usage(
        input_tokens=int(counts.get("input_tokens") or 0),
        output_tokens=int(counts.get("output_tokens") or 0),
    )


def prompt_usage(result: Mapping[str, Any]) -> Usage | None:
    """A ``session/prompt`` result's token usage: ``usage``, else ``_meta.quota``; None: none."""
    usage = result.get("usage")
    if isinstance(usage, Mapping):
        return _usage(usage)
    meta = result.get("_meta")
    if isinstance(meta, Mapping) and isinstance(meta.get("quota"), Mapping):
        return _quota_usage(meta["quota"])
    return None


@dataclass
class AcpUpdates:
    """One prompt's updates, folded into events as they arrive."""

    session_id: str
    server: str = ""
    calls: dict[str, ToolCall] = field(default_factory=dict)
    # Each call's ACP kind (read, edit, execute...), as its tool_call gave it.
    kinds: dict[str, str] = field(default_factory=dict)
    blocks: list[str] = field(default_factory=list)
    block: list[str] = field(default_factory=list)
    usage: Usage = field(default_factory=Usage)
    cost_usd: float | None = None
    tool_calls: int = 0
    ignored: int = 0
    # Chunks of text that are the agent's own warnings, not the model's (their starts).
    noise: tuple[str, ...] = ()

    def feed(self, update: Mapping[str, Any]) -> list[RunEvent]:
        """Events for one ``session/update``'s ``update``."""
        kind = update.get("sessionUpdate")
        if kind == "agent_message_chunk":
            text = content_text(update.get("content"))
            if not text or text.startswith(self.noise or ("\0",)):
                return []
            self.block.append(text)
            return [TextDelta(self.session_id, text)]
        if kind == "tool_call":
            return self._started(update)
        if kind == "tool_call_update":
            return self._updated(update)
        if kind == "usage_update":
            return self._cost(update)
        self.ignored += 1  # thoughts, plans, modes, commands: nothing a record keeps
        return []

    def asked(self, tool_call: Mapping[str, Any]) -> list[RunEvent]:
        """A ``session/request_permission``'s call: started here when no ``tool_call``
        announced it (Gemini asks before it announces)."""
        if str(tool_call.get("toolCallId") or "") in self.calls:
            return []
        return self._started({**tool_call, "status": "pending"})

    def denied(self, call_id: str, reason: str) -> list[RunEvent]:
        """A call the butler denied ends as failed, unless the agent said how it ended."""
        call = self.calls.get(call_id)
        if call is None or call.status != "running":
            return []
        finished = call.finish(f"denied: {reason}", True, _now())
        self.calls[call_id] = finished
        return [ToolCallFinished(self.session_id, finished)]

    def close_block(self) -> list[RunEvent]:
        """The text since the last tool call as one :class:`AssistantText` (if any)."""
        if not self.block:
            return []
        text, self.block = "".join(self.block), []
        self.blocks.append(text)
        return [AssistantText(self.session_id, text)]

    def _started(self, update: Mapping[str, Any]) -> list[RunEvent]:
        events = self.close_block()
        call_id = str(update.get("toolCallId") or len(self.calls))
        if call_id in self.calls:  # sent again (claude-code-acp repeats it with the input)
            return [*events, *self._updated(update)]
        call = ToolCall.start(call_id, tool_name(update, self.server), tool_input(update), _now())
        self.calls[call_id] = call
        if isinstance(update.get("kind"), str):
            self.kinds[call_id] = str(update["kind"])
        self.tool_calls += 1
        events.append(ToolCallStarted(self.session_id, call))
        return [*events, *self._finished_if_done(call_id, update)]

    def _updated(self, update: Mapping[str, Any]) -> list[RunEvent]:
        call_id = str(update.get("toolCallId") or "")
        call = self.calls.get(call_id)
        if call is None:
            return []
        found = tool_input(update) if "rawInput" in update else {}
        if found and not call.input:
            self.calls[call_id] = call = ToolCall.start(call.id, call.name, found, call.started_at)
        return self._finished_if_done(call_id, update)

    def _finished_if_done(self, call_id: str, update: Mapping[str, Any]) -> list[RunEvent]:
        status = spawnkit_status(update.get("status"))
        call = self.calls[call_id]
        if status == "running" or call.status != "running":
            return []
        output = content_text(update.get("content")) or _raw_text(update.get("rawOutput"))
        finished = call.finish(truncate(output, OUTPUT_LIMIT), status == "error", _now())
        self.calls[call_id] = finished
        return [ToolCallFinished(self.session_id, finished)]

    def _cost(self, update: Mapping[str, Any]) -> list[RunEvent]:
        cost = update.get("cost")
        if not isinstance(cost, Mapping) or cost.get("currency") not in (None, "USD"):
            return []
        self.cost_usd = float(cost.get("amount") or 0.0)
        return [UsageEvent(self.session_id, self.usage, self.cost_usd, None)]

    def finish(self, result: Mapping[str, Any]) -> list[RunEvent]:
        """Events for the prompt's result: the last text block and its usage."""
        events = self.close_block()
        usage = prompt_usage(result)
        if usage is not None:
            self.usage = usage
            events.append(UsageEvent(self.session_id, usage, self.cost_usd, None))
        return events

    def answer(self) -> str:
        """The run's answer: the last block of text, as on the other runtimes."""
        return truncate(self.blocks[-1] if self.blocks else "", OUTPUT_LIMIT)

    def last_text(self) -> str:
        """The text since the last tool call (before :meth:`finish`): the answer so far."""
        return "".join(self.block) if self.block else (self.blocks[-1] if self.blocks else "")

    def all_text(self) -> str:
        """Everything the agent wrote (the output of a failed run)."""
        return truncate("\n\n".join([*self.blocks, "".join(self.block)]).strip(), OUTPUT_LIMIT)

    def unfinished(self) -> list[ToolCall]:
        """The tool calls still running (when the prompt ended without their end)."""
        return [call for call in self.calls.values() if call.status == "running"]
