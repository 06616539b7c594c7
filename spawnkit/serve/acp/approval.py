"""Asking an ACP client before a tool runs: ``session/request_permission``.

:class:`ClientApprover` is an :data:`~spawnkit.permissions.Approver` for the runs of one
ACP session. For a tool under ``[butler.permissions] ask`` it shows the client the tool
call (its title, kind, input and files, as the run's own ``tool_call`` would) with four
options: allow once, allow always, reject once, reject always. "Always" holds for that
tool for the rest of the ACP session (later prompts too), without asking again. A client
that cancels the request (the prompt was cancelled) or cannot be reached denies the call.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

from acp.schema import (
    AllowedOutcome,
    DeniedOutcome,
    PermissionOption,
    RequestPermissionResponse,
    ToolCallLocation,
    ToolCallUpdate,
)

from ...permissions import PermissionDecision, PermissionRequest
from ...result import ToolCall
from ...runtimes.acp.kinds import tool_kind, tool_locations
from .updates import tool_title

logger = logging.getLogger(__name__)

BY = "acp-client"

OPTIONS = (
    PermissionOption(option_id="allow_once", name="Allow", kind="allow_once"),
    PermissionOption(option_id="allow_always", name="Always allow", kind="allow_always"),
    PermissionOption(option_id="reject_once", name="Reject", kind="reject_once"),
    PermissionOption(option_id="reject_always", name="Always reject", kind="reject_always"),
)

# What sends session/request_permission: the agent connection's ``request_permission``.
AskClient = Callable[..., Awaitable[RequestPermissionResponse]]


class ClientApprover:
    """The approver of one ACP session's runs; remembers its "always" answers by tool."""

    def __init__(self, acp_session_id: str, ask: AskClient) -> None:
        self.acp_session_id = acp_session_id
        self.ask = ask
        self.always: dict[str, bool] = {}

    async def __call__(self, request: PermissionRequest) -> PermissionDecision:
        call = request.call
        if call.name in self.always:
            allowed = self.always[call.name]
            return PermissionDecision(
                allowed, BY, always=True, reason=None if allowed else _rejected(call.name, True)
            )
        try:
            response = await self.ask(
                session_id=self.acp_session_id,
                tool_call=_shown(call),
                options=list(OPTIONS),
            )
        except (ConnectionError, OSError) as exc:
            logger.warning("could not ask the ACP client about %s: %s", call.name, exc)
            return PermissionDecision(
                False, BY, reason=f"the ACP client could not be asked ({exc}); denied"
            )
        return self._decision(call.name, response)

    def _decision(self, tool: str, response: RequestPermissionResponse) -> PermissionDecision:
        outcome = response.outcome
        if isinstance(outcome, DeniedOutcome) or not isinstance(outcome, AllowedOutcome):
            return PermissionDecision(
                False, BY, reason="the person cancelled the prompt before answering"
            )
        option = outcome.option_id
        if option not in {o.option_id for o in OPTIONS}:
            return PermissionDecision(False, BY, reason=f"unknown answer {option!r}; denied")
        allowed = option.startswith("allow")
        always = option.endswith("always")
        if always:
            self.always[tool] = allowed
        return PermissionDecision(
            allowed, BY, always=always, reason=None if allowed else _rejected(tool, always)
        )


def _rejected(tool: str, always: bool) -> str:
    when = "for the rest of this session" if always else "this time"
    return f"the person using the ACP client rejected {tool} {when}"


def _shown(call: ToolCall) -> ToolCallUpdate:
    """The tool call as the client shows it in the question."""
    return ToolCallUpdate(
        tool_call_id=call.id,
        title=tool_title(call),
        kind=tool_kind(call.name),
        status="pending",
        raw_input=call.input,
        locations=[ToolCallLocation(path=p) for p in tool_locations(call.input)] or None,
    )
