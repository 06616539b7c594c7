"""A run's model relay: the one way its CLI reaches the model API, and the only holder of the key.

Every run whose CLI talks to its model API through a base URL (Claude Code, Codex, Gemini,
and a ``command`` runtime that puts ``{base_url}`` in its environment) is given the URL of
a relay of its own instead, opened by the spawner for the run's lifetime. The relay
forwards each request to the run's upstream (the butler's ``base_url``: a gateway, or
spawnkit's replay server; else the CLI's own default API) and passes the answer back as
the upstream framed it, bytes as they arrive: a server-sent event stream is never
buffered, and nothing is decoded or re-encoded on the way (see :mod:`spawnkit._http1`).
On the way out it swaps the run's real credentials in for the placeholders its CLI was
given (:class:`~spawnkit.containment.credentials.KeySwap`), in every header value and the query
string: the real key never enters the CLI's environment, its files or its sandbox. For a
CLI that reports usage only at its end, it also reads each model call's usage as it
passes (a :class:`~spawnkit.budgets.metering.Meter` as ``sink``), so a run with a token or dollar
limit is stopped in time. An upstream it cannot reach is answered with a 502 in the API's
own error shape whose message says so ("spawnkit relay: cannot reach ORIGIN: REASON"),
which the CLI prints, and :attr:`Relay.unreachable` keeps for the run's error.

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

import asyncio
import contextlib
import hmac
import json
import secrets
import socket
import ssl
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import quote, urlsplit

from .. import _http1 as wire
from ..replay import anthropic, gemini, openai
from ..replay.recorded import TurnSink
from ..replay.scenario import ErrorSpec
from ..replay.server import TurnTap, turn_tap
from .credentials import KeySwap

# Loopback only: the relay is for a CLI on this machine (and only its run's, by secret).
RELAY_HOST = "127.0.0.1"
SECRET_BYTES = 32
# The name the run's redactor shows in place of the secret.
RELAY_SECRET = "SPAWNKIT_RELAY_SECRET"
# The most "cannot reach" messages a relay keeps (a CLI that retries would add more).
MAX_UNREACHABLE = 20
CONNECT_TIMEOUT_S = 10.0
# Claude Code itself gives a model call 600 s (its x-stainless-timeout header).
READ_TIMEOUT_S = 600.0
# Idle keep-alive connections kept to the upstream (a CLI makes a few calls at once).
MAX_IDLE_UPSTREAM = 8
STOP_TIMEOUT_S = 5.0


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

    ``sink`` is handed every model turn, its usage and error only (a :class:`~spawnkit.budgets.
    metering.Meter`; see :class:`~spawnkit.replay.server.TurnTap`), ``keys`` the
    run's credentials to swap in (filled in before the CLI starts; see :meth:`KeySwap.hide`).
    With ``uds`` the relay serves on that unix socket (mode 0600, removed at the end), and
    ``port`` (default: one free now) is the inside port its URL names; without, it listens
    on ``127.0.0.1`` TCP.
    """
    parts = urlsplit(base_url)
    secret = secrets.token_urlsafe(SECRET_BYTES)
    keys = keys if keys is not None else KeySwap()
    unreachable: list[str] = []
    relay = _RelayServer(_Upstream.of(base_url), secret, keys, sink, unreachable)
    path = parts.path.rstrip("/")
    if uds is None:
        server = await asyncio.start_server(relay.serve, RELAY_HOST, 0, limit=wire.MAX_HEAD)
        bound = int(server.sockets[0].getsockname()[1])
    else:
        server = await asyncio.start_unix_server(relay.serve, str(uds), limit=wire.MAX_HEAD)
        uds.chmod(0o600)  # noqa: ASYNC240 - a local chmod, as quick as the bind before it
        bound = port or free_port()
    try:
        yield Relay(bound, secret, path, uds, keys, unreachable)
    finally:
        server.close()
        await relay.close()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(server.wait_closed(), STOP_TIMEOUT_S)
        if uds is not None:
            uds.unlink(missing_ok=True)  # noqa: ASYNC240 - one unlink


@dataclass(frozen=True)
class _Upstream:
    """Where the relay forwards: host, port, TLS, and how its errors name it."""

    host: str
    port: int
    tls: bool
    shown: str  # the origin without a user and password

    @classmethod
    def of(cls, base_url: str) -> _Upstream:
        parts = urlsplit(base_url)
        tls = parts.scheme == "https"
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"a relay forwards to an http(s) URL, not {base_url!r}")
        port = parts.port or (443 if tls else 80)
        netloc = parts.netloc.rpartition("@")[2]
        return cls(parts.hostname, port, tls, f"{parts.scheme}://{netloc}")

    @property
    def host_header(self) -> bytes:
        return self.shown.partition("://")[2].encode("latin-1")


_Conn = tuple[asyncio.StreamReader, asyncio.StreamWriter]


class _RelayServer:
    """The connections of one relay: each client connection's requests, in turn, forwarded."""

    def __init__(
        self,
        upstream: _Upstream,
        secret: str,
        keys: KeySwap,
        sink: TurnSink | None,
        unreachable: list[str],
    ) -> None:
        self.upstream = upstream
        self._secret = secret.encode()
        self.keys = keys
        self.sink = sink
        self.unreachable = unreachable
        self._idle: list[_Conn] = []
        self._tasks: set[asyncio.Task[None]] = set()
        self._tls = ssl.create_default_context() if upstream.tls else None
        if self._tls is not None:
            self._tls.set_alpn_protocols(["http/1.1"])

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.wait(self._tasks, timeout=STOP_TIMEOUT_S)
        for _, writer in self._idle:
            writer.close()
        self._idle.clear()

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """One client connection: requests until it closes, or one cannot be kept alive."""
        task = asyncio.current_task()
        if task is not None:
            self._tasks.add(task)
        try:
            while await self._one(reader, writer):
                pass
        except (ConnectionError, asyncio.IncompleteReadError, TimeoutError):
            pass  # the client went away, or stalled: nobody is left to answer
        except asyncio.CancelledError:
            # The relay is closing: its run is over. Not raised on: the stream server of
            # Python 3.11 reports a cancelled connection handler as an unhandled error.
            pass
        except wire.BadRequest as exc:
            with contextlib.suppress(ConnectionError):
                writer.write(wire.response(400, _error_json("/", 400, str(exc)), close=True))
                await writer.drain()
        finally:
            writer.close()
            if task is not None:
                self._tasks.discard(task)

    async def _one(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        """Relay one request; whether the client connection may carry another."""
        request = await wire.read_request(reader)
        if request is None:
            return False
        rest = self._after_secret(request.target)
        if rest is None:
            # Before its body is read: a request without the secret gets nothing more.
            message = "spawnkit relay: the path lacks this run's secret"
            writer.write(wire.response(401, _error_json(request.path, 401, message), close=True))
            await writer.drain()
            return False
        if request.expects_continue:
            writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        body = await wire.read_body(reader, request.headers)
        path, _, query = rest.partition(b"?")
        if query and self.keys:
            revealed = self.keys.reveal(query.decode("latin-1"), _quote_all)
            query = revealed.encode("latin-1")
        target = path + (b"?" + query if query else b"")
        return await self._forward(request, target, body, writer)

    def _after_secret(self, target: bytes) -> bytes | None:
        """``target`` without its leading ``/<secret>``; None if it does not begin so."""
        first, slash, rest = target.removeprefix(b"/").partition(b"/")
        segment, question, query = first.partition(b"?")
        if not target.startswith(b"/") or not hmac.compare_digest(segment, self._secret):
            return None
        if question:
            return b"/?" + query
        return b"/" + rest if slash else b"/"

    async def _forward(
        self, request: wire.Request, target: bytes, body: bytes, writer: asyncio.StreamWriter
    ) -> bool:
        path = target.partition(b"?")[0].decode("latin-1")
        metering = self.sink is not None and request.method == "POST"
        headers = wire.forwarded_headers(
            request.headers, self.upstream.host_header, len(body), self.keys.reveal,
            identity=metering,
        )  # fmt: skip
        head = wire.request_head(request.method, target, headers)
        try:
            reader, upstream_writer, answer = await self._exchange(head, body, request.method)
        except (OSError, TimeoutError, asyncio.IncompleteReadError, wire.BadRequest) as exc:
            message = f"spawnkit relay: cannot reach {self.upstream.shown}: {_reason(exc)}"
            if len(self.unreachable) < MAX_UNREACHABLE:
                self.unreachable.append(message)
            writer.write(wire.response(502, _error_json(path, 502, message)))
            await writer.drain()
            return True
        tap: TurnTap | None = None
        if metering and self.sink is not None:
            request_headers = {k.decode("latin-1").lower(): v.decode("latin-1")
                               for k, v in request.headers}  # fmt: skip
            tap = turn_tap(
                self.sink, request.method, path, body, request_headers, answer.status,
                answer.header(b"content-type").decode("latin-1"), usage_only=True,
            )  # fmt: skip
        writer.write(answer.head_for_client())
        ended = wire.BodyEnd()
        body_pieces = wire.relay_body(
            reader, answer, READ_TIMEOUT_S, ended, payload=tap is not None
        )
        try:
            async for piece, payload in body_pieces:
                if writer.is_closing():
                    raise ConnectionResetError("the client went away")
                writer.write(piece)
                if tap is not None and payload:
                    tap.feed(payload)
                if writer.transport.get_write_buffer_size() > wire.HIGH_WATER:
                    await writer.drain()
            await writer.drain()
        finally:
            reusable = answer.keep_alive and ended.clean
            if reusable and len(self._idle) < MAX_IDLE_UPSTREAM:
                self._idle.append((reader, upstream_writer))
            else:
                upstream_writer.close()
        if tap is not None:
            tap.close()
        return answer.client_keep_alive and request.keep_alive

    async def _exchange(
        self, head: bytes, body: bytes, method: str
    ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter, wire.Answer]:
        """Send the request on a kept connection (or a new one); the answer's head."""
        while self._idle:
            reader, writer = self._idle.pop()
            if reader.at_eof() or writer.is_closing():
                writer.close()
                continue
            try:
                writer.write(head + body)
                await writer.drain()
                answer = await wire.read_answer(reader, method, READ_TIMEOUT_S)
            except (OSError, asyncio.IncompleteReadError):
                writer.close()  # closed by the upstream meanwhile: try a new one
                continue
            return reader, writer, answer
        async with asyncio.timeout(CONNECT_TIMEOUT_S):
            reader, writer = await asyncio.open_connection(
                self.upstream.host, self.upstream.port, ssl=self._tls, limit=wire.READ_SIZE,
                server_hostname=self.upstream.host if self._tls else None,
            )  # fmt: skip
        try:
            writer.write(head + body)
            await writer.drain()
            return reader, writer, await wire.read_answer(reader, method, READ_TIMEOUT_S)
        except BaseException:
            writer.close()
            raise


def _quote_all(value: str) -> str:
    return quote(value, safe="")


def _reason(exc: BaseException) -> str:
    if isinstance(exc, TimeoutError):
        return "timed out"
    if isinstance(exc, asyncio.IncompleteReadError):
        return "the connection closed before an answer"
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return str(exc) or type(exc).__name__


def _error_json(path: str, status: int, message: str) -> bytes:
    """An error body in the shape of the API ``path`` belongs to, so its CLI shows it."""
    kind = "authentication_error" if status == 401 else "api_error"
    error = ErrorSpec(status, kind, message)
    body: object
    if path.rstrip("/").endswith("/responses"):
        body = openai.error_body(error)
    elif "/models/" in path:
        body = gemini.error_body(error)
    else:
        body = anthropic.error_body(error)
    return json.dumps(body).encode()
