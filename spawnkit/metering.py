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

The relay listens on ``127.0.0.1``, where every local user can connect, so it serves only
its own run: each relay has a secret (:attr:`Relay.secret`, random per run) that is the
first segment of the base URL the CLI is given, ``http://127.0.0.1:PORT/<secret>`` plus the
path of the CLI's own base URL. All three CLIs keep the path of their base URL, so every
request carries it; one without it gets 401 and is neither forwarded nor metered. The URL
reaches the CLI in its environment or its private config file, never its command line,
and the run's redactor is given the secret, since a CLI may print its URL in an error. The
relay removes the secret and sends each request to the upstream origin with the rest of
its path, so a base URL with a path (``https://host/prefix``, Codex's ``/v1``) reaches the
same place as before.
"""

from __future__ import annotations

import contextlib
import secrets
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from ._asgi import serve
from .replay.recorded import RecordedTurn
from .replay.scenario import ErrorSpec, TurnRequest
from .replay.server import relay_app
from .result import Usage

# Requests remembered to tell a turn handed over twice from a new one.
_REMEMBERED = 64
MAX_ERRORS = 100
# Loopback only: the relay is for a CLI on this machine (and only its run's, by secret).
RELAY_HOST = "127.0.0.1"
SECRET_BYTES = 32
# The name the run's redactor shows in place of the secret.
RELAY_SECRET = "SPAWNKIT_RELAY_SECRET"


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


@dataclass(frozen=True)
class Relay:
    """A running relay: where it listens, and its secret (which its repr leaves out)."""

    address: str
    secret: str = field(repr=False)
    path: str = ""  # the upstream base URL's

    @property
    def url(self) -> str:
        """The base URL to give the CLI: the relay's address, its secret, the upstream path."""
        return f"{self.address}/{self.secret}{self.path}"


@contextlib.asynccontextmanager
async def metered(base_url: str, meter: Meter) -> AsyncIterator[Relay]:
    """Relay ``base_url`` through ``meter`` on this loop, for the holder of a new secret."""
    parts = urlsplit(base_url)
    origin = f"{parts.scheme}://{parts.netloc}"
    secret = secrets.token_urlsafe(SECRET_BYTES)
    app = relay_app(origin, meter, secret=secret)
    async with serve(app, RELAY_HOST, 0) as address:
        yield Relay(address.url, secret, parts.path.rstrip("/"))
