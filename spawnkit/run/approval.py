"""The run's side of asking a person: every question and answer an event and a record line.

A runtime asks through ``RunSpec.approver`` before a tool of ``[butler.permissions] ask``
runs. That approver is a :class:`RunApprover` around the one the trigger was given (the
notebook's approval card, an ACP client, the terminal), or around nobody: then every
question is answered :data:`~spawnkit.permissions.NO_APPROVER`. Whoever answers, the
question goes out as a :class:`~spawnkit.events.PermissionAsked` event and the answer as a
:class:`~spawnkit.events.PermissionDecided`, which the collector folds into the run's
result and so into its record (``permissions``).

An answer given ``always`` holds for the same tool for the rest of the run: later calls
are answered from it (still asked and decided as events, so every call is on the record).
An approver that raises denies the call (fail closed; logged). A run cancelled while it
waits for an answer records the question as decided ``by="cancelled"``, and the cancel
goes on.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import replace
from datetime import UTC, datetime

from ..events import PermissionAsked, PermissionDecided
from ..permissions import NO_APPROVER, Approver, PermissionDecision, PermissionRequest
from ..result import PermissionAnswer, ToolCall
from .collector import Collector

logger = logging.getLogger(__name__)

CANCELLED = PermissionDecision(
    allowed=False, by="cancelled", reason="the run was cancelled while it waited for an answer"
)


class RunApprover:
    """The approver a run's runtime calls: asks ``approver`` (or nobody) and records it all."""

    def __init__(self, collector: Collector, approver: Approver | None) -> None:
        self._collector = collector
        self._approver = approver
        # Answers given "always", by tool name: they hold for the rest of the run.
        self._always: dict[str, PermissionDecision] = {}

    @property
    def asks_someone(self) -> bool:
        """Whether anyone can answer (else every question is denied: NO_APPROVER)."""
        return self._approver is not None

    async def __call__(self, request: PermissionRequest) -> PermissionDecision:
        # The person sees what the record and the listeners see: the call, redacted.
        call = self._collector.redactor.call(request.call)
        request = replace(request, call=call)
        self._collector.emit(PermissionAsked(self._collector.session_id, call))
        try:
            decision = await self._answer(request)
        except asyncio.CancelledError:
            self._decided(call, CANCELLED)
            raise
        self._decided(call, decision)
        return decision

    async def _answer(self, request: PermissionRequest) -> PermissionDecision:
        remembered = self._always.get(request.call.name)
        if remembered is not None:
            return remembered
        if self._approver is None:
            return NO_APPROVER
        try:
            decision = await self._approver(request)
        except Exception as exc:  # a broken approver must not let the call through
            logger.exception(
                "run %s: the approver failed on %s; the call is denied",
                request.session_id, request.call.name,
            )  # fmt: skip
            return PermissionDecision(
                allowed=False, by="approver failed", reason=f"the approver failed: {exc!r}"
            )
        if decision.always:
            self._always[request.call.name] = decision
        return decision

    def _decided(self, call: ToolCall, decision: PermissionDecision) -> None:
        answer = PermissionAnswer(
            tool_call_id=call.id, tool=call.name, allowed=decision.allowed, by=decision.by,
            at=datetime.now(UTC), always=decision.always, reason=decision.reason,
        )  # fmt: skip
        self._collector.emit(PermissionDecided(self._collector.session_id, call, answer))
