"""A run in ACP's words: run events and session records as ``session/update`` notifications.

Pure functions and one small fold (:class:`UpdateStream`), no I/O: the agent
(:mod:`.agent`) sends what they return. A run's text goes out as ``agent_message_chunk``
(its deltas as they stream; a whole :class:`~spawnkit.events.AssistantText` only when no
delta carried it, so a client never shows a text twice); a tool call as ``tool_call`` when
it starts and ``tool_call_update`` when it ends, with its kind and file locations from
:mod:`spawnkit.runtimes.acp.kinds` and, for a file edit, ACP ``diff`` content; usage as
``usage_update``. :func:`stop_of` says why a prompt ended, and :func:`transcript` replays a
recorded run for ``session/load``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from acp import (
    start_tool_call,
    text_block,
    tool_content,
    tool_diff_content,
    update_agent_message_text,
    update_agent_thought_text,
    update_tool_call,
    update_user_message_text,
)
from acp.schema import (
    AgentMessageChunk,
    AgentThoughtChunk,
    ContentToolCallContent,
    Cost,
    FileEditToolCallContent,
    StopReason,
    ToolCallLocation,
    ToolCallProgress,
    ToolCallStart,
    UsageUpdate,
    UserMessageChunk,
)
from acp.schema import Usage as AcpUsage

from ...edits import file_diffs
from ...events import (
    AssistantText,
    Queued,
    RunEvent,
    TextDelta,
    ToolCallFinished,
    ToolCallStarted,
)
from ...events import UsageUpdate as RunUsage
from ...result import SpawnerResult, ToolCall, Usage
from ...runtimes.acp.kinds import acp_status, tool_kind, tool_locations
from ...store import SessionRecord

SessionUpdate = (
    AgentMessageChunk
    | AgentThoughtChunk
    | UserMessageChunk
    | ToolCallStart
    | ToolCallProgress
    | UsageUpdate
)

# The context window of a model family, for usage_update's ``size`` (ACP requires one);
# first matching prefix wins. A model not listed gets the smallest of them.
_CONTEXT_WINDOWS = (
    ("claude-", 200_000), ("gemini-", 1_048_576), ("gpt-5", 400_000), ("gpt-4.1", 1_047_576),
    ("o3", 200_000), ("o4", 200_000),
)  # fmt: skip
_DEFAULT_WINDOW = 200_000
# A tool call's title shows at most this much of its input.
_TITLE_CHARS = 120


def tool_title(call: ToolCall) -> str:
    """``health.state_get``, ``Read /path``, ``$ date +%F``: what a client labels the call."""
    label = f"{call.server}.{call.tool}" if call.server else call.name
    detail = call.shell_command
    if detail is not None:
        detail = f"$ {detail}"
    else:
        paths = tool_locations(call.input)
        detail = paths[0] if paths else None
    if not detail:
        return label
    flat = " ".join(detail.split())
    if len(flat) > _TITLE_CHARS:
        flat = flat[: _TITLE_CHARS - 1] + "…"
    return f"{label} {flat}"


def edit_diffs(call: ToolCall) -> list[FileEditToolCallContent]:
    """A file edit's changes as ACP diffs (path, old text, new text); empty for other tools.

    :func:`spawnkit.edits.file_diffs` reads the call, as every other view does: an edit
    carries the replaced and the new text, a whole-file write the new file (``oldText``
    none: its earlier content is not in the call). A change whose text the call does not
    carry (Codex's ``file_change`` in ``exec --json`` names only paths) gets locations
    and no diff.
    """
    return [
        tool_diff_content(diff.path, diff.new_text, diff.old_text)
        for diff in file_diffs(call)
        if diff.new_text is not None
    ]


def _locations(call: ToolCall) -> list[ToolCallLocation] | None:
    paths = tool_locations(call.input)
    if call.name == "file_change":  # Codex: {"changes": [{"path": ..., "kind": ...}]}
        changes = call.input.get("changes")
        if isinstance(changes, list):
            paths += [c["path"] for c in changes if isinstance(c, dict) and c.get("path")]
    return [ToolCallLocation(path=path) for path in paths] or None


def tool_call_started(call: ToolCall) -> ToolCallStart:
    """``tool_call``: the call as it starts (in progress), with its kind and locations."""
    diffs = edit_diffs(call)
    return start_tool_call(
        call.id,
        tool_title(call),
        kind=tool_kind(call.name),
        status="in_progress",
        content=diffs or None,
        locations=_locations(call),
        raw_input=call.input,
    )


def tool_call_finished(call: ToolCall) -> ToolCallProgress:
    """``tool_call_update``: its final status, and its output (after any diff)."""
    content: list[ContentToolCallContent | FileEditToolCallContent] = [*edit_diffs(call)]
    if call.output:
        content.append(tool_content(text_block(call.output)))
    return update_tool_call(
        call.id,
        kind=tool_kind(call.name),
        status=acp_status(call.status),
        content=content or None,
        locations=_locations(call),
        raw_output={"output": call.output} if call.output is not None else None,
    )


def context_window(model: str | None) -> int:
    for prefix, size in _CONTEXT_WINDOWS:
        if model and model.startswith(prefix):
            return size
    return _DEFAULT_WINDOW


def usage_update(usage: Usage, cost_usd: float | None, model: str | None) -> UsageUpdate:
    """``usage_update``: the run's tokens so far against the model's context window, its
    cost when known, and the token counts by kind under ``_meta.spawnkit``."""
    return UsageUpdate(
        session_update="usage_update",
        used=usage.total_tokens,
        size=context_window(model),
        cost=Cost(amount=cost_usd, currency="USD") if cost_usd is not None else None,
        field_meta={"spawnkit": _usage_meta(usage, cost_usd)},
    )


def _usage_meta(usage: Usage, cost_usd: float | None) -> dict[str, Any]:
    return {
        "inputTokens": usage.input_tokens,
        "outputTokens": usage.output_tokens,
        "cacheReadTokens": usage.cache_read_tokens,
        "cacheWriteTokens": usage.cache_write_tokens,
        "costUsd": cost_usd,
    }


def prompt_usage(usage: Usage) -> AcpUsage:
    """The turn's usage for ``PromptResponse.usage``."""
    return AcpUsage(
        total_tokens=usage.total_tokens,
        input_tokens=usage.input_tokens,
        output_tokens=usage.output_tokens,
        cached_read_tokens=usage.cache_read_tokens,
        cached_write_tokens=usage.cache_write_tokens,
    )


class UpdateStream:
    """Folds one run's events into the notifications to send, in order.

    Text goes out as it streams; an ``AssistantText`` is sent only when no delta since the
    last one carried its text (Codex, or Claude Code without partial messages), never both.
    """

    def __init__(self) -> None:
        self.streamed = False
        self.model: str | None = None

    def updates(self, event: RunEvent) -> list[SessionUpdate]:
        if isinstance(event, TextDelta):
            self.streamed = True
            return [update_agent_message_text(event.text)]
        if isinstance(event, AssistantText):
            streamed, self.streamed = self.streamed, False
            return [] if streamed else [update_agent_message_text(_block(event.text))]
        if isinstance(event, ToolCallStarted):
            self.streamed = False
            return [tool_call_started(event.call)]
        if isinstance(event, ToolCallFinished):
            return [tool_call_finished(event.call)]
        if isinstance(event, RunUsage):
            self.model = event.model or self.model
            return [usage_update(event.usage, event.cost_usd, self.model)]
        if isinstance(event, Queued):  # the butler's slots are all busy: say why it waits
            return [update_agent_thought_text(f"(waiting for a free slot: #{event.position})\n")]
        return []


def _block(text: str) -> str:
    """A whole text block, set apart from the one before it (chunks are concatenated)."""
    return text if text.endswith("\n") else text + "\n\n"


# How a run that did not succeed ends a prompt: the nearest stop reason.
_STOP_BY_LIMIT: Mapping[str, StopReason] = {
    "max_turns": "max_turn_requests",
    "max_tokens": "max_tokens",
    "max_cost_usd": "max_tokens",
    "daily_cost_usd": "max_tokens",
}


def stop_of(result: SpawnerResult) -> tuple[StopReason, str | None]:
    """Why a prompt ended (ACP's stop reason), and the message a person should read.

    A failed run ends the turn (``end_turn``) with a message saying what went wrong and
    what to do, rather than a JSON-RPC error: Zed and Jupyter AI both show an agent
    message in the conversation, which stays usable, while an error response is only a
    banner (Zed) or a log line (Jupyter AI).
    """
    if result.status == "success":
        return "end_turn", None
    if result.status == "cancelled":
        return "cancelled", None
    if result.error_kind == "refusal":
        return "refusal", None
    if result.error_kind == "max_turns":
        return "max_turn_requests", f"spawnkit stopped the run: {result.error}."
    budget = result.budget
    if result.status == "budget" and budget is not None and budget.stopped_by:
        reached = f" (reached {budget.reached:g})" if budget.reached is not None else ""
        message = (
            f"spawnkit stopped the run at its budget: {budget.stopped_by} = {budget.limit}"
            f"{reached}. Raise [butler.limits] {budget.stopped_by} in the butler.toml "
            "to allow more."
        )
        return _STOP_BY_LIMIT.get(budget.stopped_by, "end_turn"), message
    if result.status == "timeout":
        return "end_turn", f"spawnkit stopped the run: {result.error or 'it timed out'}."
    return "end_turn", failure_message(result)


def failure_message(result: SpawnerResult) -> str:
    """What went wrong, in the run's own words (they name the remedy), and where to look."""
    text = f"The run {result.status}: {result.error or 'no reason given'}"
    if result.session_id:
        text += f" (its record: `spawnkit sessions {result.session_id}`)"
    return text + "."


def transcript(record: SessionRecord) -> list[SessionUpdate]:
    """A recorded run as notifications: the prompt, its tool calls, the agent's answer.

    The record keeps each tool call and the final answer, not the order text and calls
    came in, so the calls come first and the answer after them.
    """
    updates: list[SessionUpdate] = [update_user_message_text(record.prompt)]
    for call in record.tool_calls:
        updates += [tool_call_started(call), tool_call_finished(call)]
    if record.output:
        updates.append(update_agent_message_text(_block(record.output)))
    if record.status not in ("success", "running", "queued"):
        note = record.error or record.status
        updates.append(update_agent_message_text(f"(this run ended {record.status}: {note})\n"))
    return updates
