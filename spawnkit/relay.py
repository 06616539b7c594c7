"""A run's model relay: the one way its CLI reaches the model API, and the only holder of the key.

Every run whose CLI talks to its model API through a base URL (Claude Code, Codex, Gemini,
and a ``command`` runtime that puts ``{base_url}`` in its environment) is given the URL of
a relay of its own instead, opened by the spawner for the run's lifetime. The relay
forwards each request to the run's upstream (the butler's ``base_url``: a gateway, or
spawnkit's replay server; else the CLI's own default API) and passes the answer back
unchanged, chunk by chunk as it arrives (a server-sent event stream is never buffered).
On the way out it swaps the run's real credentials in for the placeholders its CLI was
given (:class:`~spawnkit.credentials.KeySwap`): the real key never enters the CLI's
environment, its files or its sandbox. For a CLI that reports usage only at its end, it
also reads each model call's usage as it passes (:class:`spawnkit.metering.Meter`), so a
run with a token or dollar limit is stopped in time. An upstream it cannot reach is
answered with a 502 in the API's own error shape whose message says so ("spawnkit relay:
cannot reach ORIGIN: REASON"), which the CLI prints, and :attr:`Relay.unreachable` keeps.

Who may use it: the relay holds the key, so it must serve only its own run. Each relay has
a secret (:attr:`Relay.secret`, random per run) that is the first segment of the base URL
the CLI is given, ``http://127.0.0.1:PORT/<secret>`` plus the path of the upstream's URL.
All three CLIs keep the path of their base URL (Claude Code's ``HEAD /api/hello`` too), so
every request carries it; one without it gets 401 and is neither forwarded nor metered.
The URL reaches the CLI in its environment or its private config file, never its command
line, and the run's redactor is given the secret. Without a sandbox the relay listens on
``127.0.0.1`` TCP, where every local user can connect. In a run's network namespace it
serves on a unix socket instead (``uds``), a door the sandbox's forwarder maps to the
inside port :attr:`Relay.port`: the CLI sees the same kind of URL, and nobody outside the
run's 0700 door folder can connect at all. The secret is kept there too.
"""

from __future__ import annotations

import contextlib
import secrets
import socket
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from ._asgi import serve, serve_unix
from .credentials import KeySwap
from .replay.recorded import TurnSink
from .replay.server import relay_app

# Loopback only: the relay is for a CLI on this machine (and only its run's, by secret).
RELAY_HOST = "127.0.0.1"
SECRET_BYTES = 32
# The name the run's redactor shows in place of the secret.
RELAY_SECRET = "SPAWNKIT_RELAY_SECRET"
# The most "cannot reach" messages a relay keeps (a CLI that retries would add more).
MAX_UNREACHABLE = 20


@dataclass(frozen=True)
class Relay:
    """A running relay: where the CLI finds it, its secret and keys (which repr leaves out).

    ``port`` is the TCP port on ``127.0.0.1``: the relay's own, or, when it serves on the
    unix socket ``socket``, the port inside the run's sandbox that leads to that socket.
    """

    port: int
    secret: str = field(repr=False)
    path: str = ""  # the upstream base URL's
    socket: Path | None = None
    keys: KeySwap = field(default_factory=KeySwap, repr=False, compare=False)
    # What it answered when the upstream could not be reached (oldest first).
    unreachable: list[str] = field(default_factory=list, compare=False)

    @property
    def address(self) -> str:
        return f"http://{RELAY_HOST}:{self.port}"

    @property
    def url(self) -> str:
        """The base URL to give the CLI: the relay's address, its secret, the upstream path."""
        return f"{self.address}/{self.secret}{self.path}"


def free_port() -> int:
    """A TCP port free on the host's loopback now: an inside port for a unix-socket door
    (inside a run's namespace every port is free; one free outside too keeps URLs alike)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((RELAY_HOST, 0))
        return int(probe.getsockname()[1])


@contextlib.asynccontextmanager
async def open_relay(
    base_url: str,
    *,
    sink: TurnSink | None = None,
    keys: KeySwap | None = None,
    uds: Path | None = None,
    port: int | None = None,
) -> AsyncIterator[Relay]:
    """Relay ``base_url`` on this loop, for the holder of a new secret, until the block exits.

    ``sink`` is handed every model turn (a :class:`~spawnkit.metering.Meter`), ``keys`` the
    run's credentials to swap in (filled in before the CLI starts; see :meth:`KeySwap.hide`).
    With ``uds`` the relay serves on that unix socket, and ``port`` (default: one free now)
    is the inside port its URL names; without, it listens on ``127.0.0.1`` TCP.
    """
    parts = urlsplit(base_url)
    origin = f"{parts.scheme}://{parts.netloc}"
    secret = secrets.token_urlsafe(SECRET_BYTES)
    keys = keys if keys is not None else KeySwap()
    unreachable: list[str] = []

    def note(message: str) -> None:
        if len(unreachable) < MAX_UNREACHABLE:
            unreachable.append(message)

    app = relay_app(origin, sink, secret=secret, keys=keys, on_unreachable=note)
    path = parts.path.rstrip("/")
    if uds is None:
        async with serve(app, RELAY_HOST, 0) as address:
            yield Relay(address.port, secret, path, None, keys, unreachable)
        return
    async with serve_unix(app, uds):
        yield Relay(port or free_port(), secret, path, uds, keys, unreachable)
