"""Asking a person before a tool runs: ``[butler.permissions] ask``.

A butler's ``tools`` are allowed without asking and every other tool is denied. A tool
named in ``[butler.permissions] ask`` sits between: before each call of it the run asks
its :data:`Approver` (the notebook's approval card, an ACP client's
``session/request_permission``, a terminal's question) and the call runs only if the
answer is to allow it. A run with no approver denies such calls, saying why. Every
answer is kept with the run's record.

The runtime asks in its own way (Claude Code through the Agent SDK's permission
callback, an ACP agent through ``session/request_permission``); what it asks and what it
gets back are the same for all of them: a :class:`PermissionRequest` and a
:class:`PermissionDecision`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from .result import ToolCall


@dataclass(frozen=True)
class PermissionRequest:
    """A run's tool call waiting for a yes or no; ``call`` has its name and input."""

    session_id: str
    butler: str
    call: ToolCall


@dataclass(frozen=True)
class PermissionDecision:
    """The answer: ``allowed``, and for the rest of the run too when ``always``.

    ``by`` says who answered ("notebook", "acp-client", "terminal", "no approver",
    "cancelled"); ``reason`` is what the agent is told of a denial.
    """

    allowed: bool
    by: str
    always: bool = False
    reason: str | None = None


Approver = Callable[[PermissionRequest], Awaitable[PermissionDecision]]
"""Asks a person about one tool call; called on the run's event loop, awaited by the run."""


NO_APPROVER = PermissionDecision(
    allowed=False,
    by="no approver",
    reason="this tool needs a person's approval ([butler.permissions] ask) and the run "
    "was started where nobody can answer",
)
