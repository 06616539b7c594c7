"""Where a run's events go: redacted, folded into its result, fanned out to listeners.

Each run has one :class:`~spawnkit.redaction.Redactor` holding the secret values it is
given; the collector applies it to every event before listeners see it or the result is
folded from it. It also feeds the run's budget with usage (or the relay's meter does) and
writes tool calls to the run's record as they start and end (:class:`LiveToolCalls`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from pathlib import Path

from ..budgets.budget import LimitHit, RunBudget
from ..containment.egress import Denial
from ..errors import StoreError
from ..events import (
    AssistantText,
    EventSink,
    NetworkDenied,
    PermissionDecided,
    RunEvent,
    TextDelta,
    Timing,
    ToolCallFinished,
    ToolCallStarted,
    ToolTime,
    UsageUpdate,
)
from ..redaction import Redactor
from ..result import OUTPUT_LIMIT, PermissionAnswer, ToolCall, Usage, truncate
from ..store import SessionStore
from ..telemetry.spans import RunSpan

logger = logging.getLogger(__name__)

# Events that do not end the text being streamed (see Collector.emit).
_BESIDE_THE_TEXT = (UsageUpdate, Timing, ToolTime, NetworkDenied)

# How long a run's end waits for its live tool-call writes before its result is written.
LIVE_WRITE_TIMEOUT_S = 10.0


class LiveToolCalls:
    """Writes a run's tool calls to its record as they start and end, in order, off the loop.

    So a host watching a shared store sees a call while the run is still going (the
    PostgreSQL store's NOTIFY goes out with each write). A write that fails is logged and
    skipped: the call is written with the result in any case.
    """

    def __init__(self, store: SessionStore, session_id: str) -> None:
        self._store = store
        self._session_id = session_id
        self._last: asyncio.Task[None] | None = None

    def __call__(self, seq: int, call: ToolCall) -> None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            logger.debug("tool call %s of %s not written live: no loop", call.id, self._session_id)
            return
        previous = self._last

        async def write() -> None:
            if previous is not None:
                await asyncio.wait([previous])
            try:
                await asyncio.to_thread(self._store.record_tool_call, self._session_id, seq, call)
            except (StoreError, RuntimeError) as exc:
                logger.warning("live tool call of %s not written: %s", self._session_id, exc)

        self._last = loop.create_task(write())

    @property
    def writing(self) -> bool:
        """Whether a write is still under way (else :meth:`flush` has nothing to wait for)."""
        return self._last is not None and not self._last.done()

    async def flush(self) -> None:
        """Wait (bounded) for the writes still under way: the result's own write comes after."""
        if self._last is not None:
            await asyncio.wait([self._last], timeout=LIVE_WRITE_TIMEOUT_S)


class Collector:
    """Redacts a run's events, folds them into its result and fans them out to listeners."""

    def __init__(
        self,
        session_id: str,
        sinks: list[EventSink],
        redactor: Redactor,
        config_file: Path | None = None,
    ) -> None:
        self.session_id = session_id
        self.sinks = sinks
        self.redactor = redactor
        self._deltas = redactor.stream()
        self.span: RunSpan | None = None
        self.calls: dict[str, ToolCall] = {}
        self.texts: list[str] = []
        self.text_chars = 0
        self.usage = Usage()
        self.cost_usd: float | None = None
        self.trace_id: str | None = None
        # The run's limits; fed by usage events, or by its relay's meter when it has one.
        self.budget: RunBudget | None = None
        self.metered = False
        # Model calls the relay's meter has seen (None: the run is not metered).
        self.model_calls: int | None = None
        self.on_limit: Callable[[LimitHit], None] | None = None
        self.live_calls: LiveToolCalls | None = None
        # Connections the run's egress proxy refused, and the butler.toml that decides.
        self.denied = 0
        self.config_file = str(config_file) if config_file is not None else None
        # Each answer to a [butler.permissions] ask question (spawnkit.run.approval).
        self.permissions: list[PermissionAnswer] = []

    def network_denied(self, denial: Denial) -> None:
        """A connection the run's egress proxy refused (its ``on_denied``): counted, and an
        event naming the tool call in progress, when exactly one was."""
        self.denied += 1
        running = [call for call in self.calls.values() if call.status == "running"]
        call = running[0] if len(running) == 1 else None
        self.emit(
            NetworkDenied(
                self.session_id, denial.host, denial.port, denial.reason,
                tool=call.name if call else None, tool_call_id=call.id if call else None,
                config_file=self.config_file,
            )
        )  # fmt: skip

    def emit(self, event: RunEvent) -> None:
        # Deltas are redacted as one stream (a secret may span two); whatever the stream
        # holds back goes out before an event that ends the text (a tool call, the whole
        # message, the end). Events from beside the CLI's stream (the relay's meter, the
        # egress proxy, the CLI's telemetry) may land between two deltas of one word: they
        # go out at once and the stream keeps what it holds. Flushed there, a secret's
        # first letters went out before the rest showed what they began.
        if isinstance(event, TextDelta):
            if text := self._deltas.feed(event.text):
                self._deliver(TextDelta(event.session_id, text))
            return
        if not isinstance(event, _BESIDE_THE_TEXT) and (held := self._deltas.flush()):
            self._deliver(TextDelta(event.session_id, held))
        self._deliver(self.redactor.event(event))

    def _deliver(self, event: RunEvent) -> None:
        if isinstance(event, ToolCallStarted | ToolCallFinished):
            self.calls[event.call.id] = event.call
            if self.live_calls is not None:
                self.live_calls(list(self.calls).index(event.call.id), event.call)
            if isinstance(event, ToolCallFinished) and self.span is not None:
                self.span.tool_call(event.call)
        elif isinstance(event, AssistantText) and self.text_chars < OUTPUT_LIMIT:
            self.texts.append(event.text)
            self.text_chars += len(event.text)
        elif isinstance(event, UsageUpdate):
            self.usage, self.cost_usd = event.usage, event.cost_usd
            if not self.metered:
                self._observe(event.usage)
        elif isinstance(event, PermissionDecided):
            self.permissions.append(event.answer)
        for sink in self.sinks:
            try:
                sink(event)
            except Exception:
                # A broken renderer must not break the run it renders.
                logger.exception("event listener %r failed on %s", sink, type(event).__name__)

    @property
    def partial_output(self) -> str:
        return truncate("\n\n".join(self.texts), OUTPUT_LIMIT)

    def restart(self) -> None:
        """Forget a failed attempt's text and usage: the run starts its CLI again."""
        self.texts, self.text_chars = [], 0
        self.usage, self.cost_usd = Usage(), None

    def metered_usage(self, usage: Usage, calls: int | None = None) -> None:
        """The run's total after a model call (the ``calls``-th), as its relay measured it."""
        self.model_calls = calls
        self.emit(UsageUpdate(self.session_id, usage, None, calls))
        self._observe(usage)

    def usage_at_end(self) -> None:
        """Say that the run's usage is known only when it ends (no meter on its model calls)."""
        self.emit(UsageUpdate(self.session_id, Usage(), None, None, at_end=True))

    def _observe(self, usage: Usage) -> None:
        hit = self.budget.observe(usage) if self.budget is not None else None
        if hit is not None and self.on_limit is not None:
            self.on_limit(hit)
