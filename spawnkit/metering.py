"""A run's model traffic, metered: a local relay that reads each model call's usage.

Codex reports token usage once its whole turn is over (``turn.completed``), Gemini in its
final ``result``: too late to stop a run that overspends. When a run of such a CLI has a
token or dollar limit, the spawner points the CLI at a relay of its own on ``127.0.0.1``
(a free port, for the run's lifetime) instead of at the model API. The relay is record
mode's proxy (:func:`spawnkit.replay.server.relay_app`): it passes every request and
answer on unchanged and rebuilds each answer with the wire assemblers of
:mod:`spawnkit.replay`, and the :class:`Meter` here hands the run's running totals on as
each model call completes, before its last event reaches the CLI. An answer that is an
HTTP error is kept (:attr:`Meter.errors`) so a run can tell a rate limit from other
failures.

The CLI is given the relay's address with the path of its own base URL; the relay sends
each request to the upstream origin with the path it received, so a base URL with a path
(``https://host/prefix``, Codex's ``/v1``) reaches the same place as before.
"""

from __future__ import annotations

import contextlib
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable
from urllib.parse import urlsplit

from ._asgi import serve
from .replay.recorded import RecordedTurn
from .replay.scenario import ErrorSpec, TurnRequest
from .replay.server import relay_app
from .result import Usage

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


@contextlib.asynccontextmanager
async def metered(base_url: str, meter: Meter) -> AsyncIterator[str]:
    """Relay ``base_url`` through ``meter`` on this loop; yields the URL to give the CLI."""
    parts = urlsplit(base_url)
    origin = f"{parts.scheme}://{parts.netloc}"
    app = relay_app(origin, meter)
    async with serve(app, "127.0.0.1", 0) as address:
        yield address.url + parts.path.rstrip("/")
