"""Answering an ACP agent's ``session/request_permission`` by the butler's rules.

A butler's tools are allowed, every other tool is denied, and a tool in
``[butler.permissions] ask`` goes to the run's approver (:mod:`spawnkit.permissions`;
none: denied, saying why). The butler's own MCP tools are allowed unless asked about.

An agent names the tool it asks about in its own way. claude-code-acp gives Claude
Code's name (``Bash``, ``Write``), which is the butler's; other agents give a title and
ACP's ``kind`` of the tool, so a call counts as the butler tools of its kind (an
``execute`` call is ``Bash``, an ``edit`` one ``Write`` and ``Edit``). The answer is
one of the options the agent offered: the first of kind ``allow_once`` (else
``allow_always``) to allow, ``reject_once`` (else ``reject_always``) to deny; an agent
that offered no way to say no gets ``cancelled``.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from ...events import EventSink
from ...permissions import NO_APPROVER, PermissionDecision, PermissionRequest
from ...result import ToolCall
from ..base import RunSpec
from .events import AcpUpdates, tool_name

logger = logging.getLogger(__name__)

# The butler tools an ACP kind of tool stands for, when the agent gives no known name.
KIND_TOOLS: Mapping[str, tuple[str, ...]] = {
    "execute": ("Bash",),
    "read": ("Read",),
    "search": ("Glob", "Grep"),
    "edit": ("Write", "Edit"),
    "delete": ("Write", "Edit"),
    "move": ("Write", "Edit"),
    "fetch": ("WebFetch", "WebSearch"),
}
# Claude Code's names, which are the butler's.
CLAUDE_TOOLS = frozenset(
    {
        "Bash", "BashOutput", "KillShell", "Read", "Write", "Edit", "MultiEdit", "Glob",
        "Grep", "WebFetch", "WebSearch", "NotebookEdit", "NotebookRead", "Task", "TodoWrite",
    }
)  # fmt: skip


def butler_tools(name: str, kind: str | None) -> tuple[str, ...]:
    """The butler tool names a call counts as: its own name when it is one, else its kind's."""
    if name in CLAUDE_TOOLS:
        return (name,)
    return KIND_TOOLS.get(kind or "", ())


def chosen_option(options: Sequence[Mapping[str, Any]], allowed: bool) -> dict[str, Any]:
    """The ``outcome`` that says yes or no with one of the agent's own options."""
    kinds = ("allow_once", "allow_always") if allowed else ("reject_once", "reject_always")
    for kind in kinds:
        for option in options:
            if option.get("kind") == kind and option.get("optionId"):
                return {"outcome": {"outcome": "selected", "optionId": str(option["optionId"])}}
    return {"outcome": {"outcome": "cancelled"}}


class Approval:
    """The butler's answer to each permission request of one run."""

    def __init__(self, spec: RunSpec, updates: AcpUpdates) -> None:
        self.spec = spec
        self.updates = updates
        self.server = spec.mcp_server.name if spec.mcp_server else None
        self.decisions: list[tuple[ToolCall, PermissionDecision]] = []
        self.always: set[str] = set()

    def _call(self, tool_call: Mapping[str, Any]) -> ToolCall:
        """The call asked about: as its ``tool_call`` update started it, else from the request."""
        call_id = str(tool_call.get("toolCallId") or "")
        known = self.updates.calls.get(call_id)
        if known is not None:
            return known
        raw = tool_call.get("rawInput")
        return ToolCall.start(
            call_id, tool_name(tool_call, self.server or ""),
            dict(raw) if isinstance(raw, Mapping) else {}, datetime.now(UTC),
        )  # fmt: skip

    async def decide(self, call: ToolCall, kind: str | None) -> PermissionDecision:
        """Allow, deny, or ask the approver about ``call`` (of ACP ``kind``)."""
        asked = set(self.spec.ask)
        names = butler_tools(call.name, kind)
        own_mcp = self.server is not None and call.server == self.server
        if call.name in asked or asked & set(names):
            if call.name in self.always:
                return PermissionDecision(allowed=True, by="approved for the run", always=True)
            approver = self.spec.approver
            if approver is None:
                return NO_APPROVER
            decision = await approver(
                PermissionRequest(
                    session_id=self.spec.session_id, butler=self.spec.butler, call=call
                )
            )
            if decision.allowed and decision.always:
                self.always.add(call.name)
            return decision
        if own_mcp or set(names) & set(self.spec.tools):
            return PermissionDecision(allowed=True, by="allow-list")
        return PermissionDecision(
            allowed=False, by="allow-list",
            reason=f"{call.name} is not among the butler's tools ([butler.runtime] tools)",
        )  # fmt: skip

    async def answer(self, params: Mapping[str, Any], emit: EventSink) -> dict[str, Any]:
        """The response to one ``session/request_permission``; the call's events to ``emit``."""
        tool_call = params.get("toolCall")
        tool_call = tool_call if isinstance(tool_call, Mapping) else {}
        options = params.get("options")
        options = (
            [o for o in options if isinstance(o, Mapping)] if isinstance(options, list) else []
        )
        for event in self.updates.asked(tool_call):
            emit(event)
        call = self._call(tool_call)
        kind = tool_call.get("kind") or self.updates.kinds.get(call.id)
        decision = await self.decide(call, kind if isinstance(kind, str) else None)
        self.decisions.append((call, decision))
        logger.info(
            "run %s: %s %s (%s)", self.spec.session_id,
            "allowed" if decision.allowed else "denied", call.name, decision.by,
        )  # fmt: skip
        if not decision.allowed:
            for event in self.updates.denied(call.id, decision.reason or decision.by):
                emit(event)
        return chosen_option(options, decision.allowed)
