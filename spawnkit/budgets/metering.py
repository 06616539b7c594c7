"""A run's model traffic, metered: the usage of each model call, read as it passes the relay.

Codex reports token usage once its whole turn is over (``turn.completed``), Gemini in its
final ``result``: too late to stop a run that overspends. When a run of such a CLI has a
token or dollar limit, its relay (:mod:`spawnkit.containment.relay`, record mode's proxy) rebuilds
each answer with the wire assemblers of :mod:`spawnkit.replay`, and the :class:`Meter` here
hands the run's running totals on as each model call completes, before its last event
reaches the CLI. An answer that is an HTTP error is kept (:attr:`Meter.errors`) so a run
can tell a rate limit from other failures.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable

from ..replay.recorded import RecordedTurn
from ..replay.scenario import ErrorSpec, TurnRequest
from ..result import Usage

# Requests remembered to tell a turn handed over twice from a new one.
_REMEMBERED = 64
MAX_ERRORS = 100


class Meter:
    """Sums the usage of a run's model calls and reports the new total after each."""

    def __init__(self, on_usage: Callable[[Usage], None]) -> None:
        self.on_usage = on_usage
        self.total = Usage()
        self.calls = 0
        self.errors: list[ErrorSpec] = []
        self._seen: OrderedDict[int, tuple[TurnRequest, Usage]] = OrderedDict()

    def add_turn(self, request: TurnRequest, session_id: str, turn: RecordedTurn) -> None:
        if turn.error is not None:
            if len(self.errors) < MAX_ERRORS:
                self.errors.append(turn.error)
            return
        usage = _usage(turn)
        earlier = self._seen.get(id(request))
        if earlier is not None and earlier[0] is request:
            # The same answer again, with what arrived after its final event.
            self.total = _minus(self.total, earlier[1])
        else:
            self.calls += 1
        self._seen[id(request)] = (request, usage)
        while len(self._seen) > _REMEMBERED:
            self._seen.popitem(last=False)
        self.total = self.total + usage
        self.on_usage(self.total)


def _usage(turn: RecordedTurn) -> Usage:
    raw = turn.usage
    return Usage(
        input_tokens=raw.get("input_tokens", 0),
        output_tokens=raw.get("output_tokens", 0),
        cache_read_tokens=raw.get("cache_read_input_tokens", 0),
        cache_write_tokens=raw.get("cache_creation_input_tokens", 0),
    )


def _minus(a: Usage, b: Usage) -> Usage:
    return Usage(
        a.input_tokens - b.input_tokens,
        a.output_tokens - b.output_tokens,
        a.cache_read_tokens - b.cache_read_tokens,
        a.cache_write_tokens - b.cache_write_tokens,
    )
