"""The doors of a run's network namespace: unix sockets the sandbox reaches the host by.

A sandboxed run (``[butler.sandbox] network = "model-only"``) has a network namespace of
its own, with only its own loopback: it reaches no host port, no DNS, no internet. What
it may reach, it reaches through a *door*: a unix socket in the run's door folder, which
the sandbox sees read-only at :data:`INSIDE` (``connect()`` works on a read-only mount).
Inside, spawnkit's forwarder (:mod:`spawnkit.containment.sandbox_forward`) listens on the sandbox's
``127.0.0.1:PORT`` for each door and carries every connection to its socket, so the CLI
keeps talking to the ``http://127.0.0.1:PORT`` URLs it is given. On the host a door is

* a server made for the run that listens on the socket itself (:meth:`Doors.socket_for`):
  nobody but the run reaches it, there is no TCP port at all; or
* a bridge to an existing host TCP port (``tcp_ports``: the butler's MCP server, a loopback
  model URL such as the replay server where no relay stands in front of it): each
  connection to the socket is spliced to ``HOST:PORT``, at most :data:`MAX_CONNECTIONS`
  at once.

The door folder is ``<workspace>/.spawnkit-doors`` (0700): it goes with the workspace
however the run ends, the owner's SIGKILL included (the sweep removes the workspace of a
dead owner). Inside the sandbox that folder is covered by an empty one (the workspace is
writable there, and the agent must not put a socket of its own in a door's place), so
the doors are seen only at :data:`INSIDE`, read-only. A unix socket's path is limited to
107 bytes, which a deep ``$SPAWNKIT_HOME`` exceeds: sockets are made and named through
``/proc/self/fd/N/`` of the folder, which this process holds open while the doors are.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import os
import shutil
import socket
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from urllib.parse import urlsplit

logger = logging.getLogger(__name__)

# The run's door folder, inside its workspace (see the module's docstring).
DOORS_DIR = ".spawnkit-doors"
# Where the sandbox sees the door folder (read-only).
INSIDE = PurePosixPath("/run/spawnkit/doors")
# Connections one bridge carries at once; one more is closed at once (and logged).
MAX_CONNECTIONS = 64
CONNECT_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class Door:
    """Port ``port`` of the sandbox's loopback reaches the unix socket ``socket`` (host path)."""

    port: int
    socket: Path

    @property
    def inside(self) -> PurePosixPath:
        """Where the sandbox sees the socket."""
        return INSIDE / self.socket.name


def loopback_address(url: str) -> tuple[str, int] | None:
    """(host, port) of ``url`` when it names this machine's loopback, else None."""
    parts = urlsplit(url)
    host = parts.hostname
    if host is None:
        return None
    if host != "localhost":
        try:
            if not ipaddress.ip_address(host).is_loopback:
                return None
        except ValueError:
            return None
    try:
        port = parts.port
    except ValueError:
        return None
    return host, port or (443 if parts.scheme == "https" else 80)


class Doors:
    """A run's door folder and its doors; made by :func:`open_doors`."""

    def __init__(self, folder: Path, fd: int, max_connections: int = MAX_CONNECTIONS) -> None:
        self.folder = folder
        self._fd = fd
        self._doors: dict[int, Door] = {}
        self._max_connections = max_connections
        self._bridges: list[_Bridge] = []

    @property
    def doors(self) -> tuple[Door, ...]:
        return tuple(self._doors.values())

    def socket_for(self, port: int) -> Path:
        """The path a server made for this run listens on to be door ``port`` directly.

        It names the socket through this process's handle on the folder (short enough
        for any home), so only this process may bind it, while the doors are open.
        """
        if not 0 < port < 65536:
            raise ValueError(f"a door's port must be 1-65535, not {port}")
        if port in self._doors:
            raise ValueError(f"port {port} already has a door")
        name = f"{port}.sock"
        self._doors[port] = Door(port, self.folder / name)
        return Path(f"/proc/self/fd/{self._fd}/{name}")

    async def bridge(self, target: int | tuple[str, int]) -> None:
        """Make door ``port`` a bridge to ``target``: a port of ``127.0.0.1``, or a
        ``(host, port)``; the door has the target's port number."""
        host, port = target if isinstance(target, tuple) else ("127.0.0.1", target)
        bridge = _Bridge(host, port, self._max_connections)
        await bridge.start(self.socket_for(port))
        self._bridges.append(bridge)

    async def _close(self) -> None:
        await asyncio.gather(*(bridge.close() for bridge in self._bridges))
        self._bridges.clear()


@contextlib.asynccontextmanager
async def open_doors(
    run_dir: Path,
    tcp_ports: Iterable[int | tuple[str, int]] = (),
    *,
    max_connections: int = MAX_CONNECTIONS,
) -> AsyncIterator[Doors]:
    """The doors of one run, in ``run_dir`` (its workspace), until the block exits.

    Each of ``tcp_ports`` (a port of ``127.0.0.1``, or a ``(host, port)``) becomes a door
    of the same port number, bridged to it (more with :meth:`Doors.bridge`). At the end
    the bridges stop, the connections they carry are closed and the folder is removed.
    """
    folder = run_dir / DOORS_DIR
    folder.mkdir(mode=0o700)
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    doors = Doors(folder, fd, max_connections)
    try:
        for target in tcp_ports:
            await doors.bridge(target)
        yield doors
    finally:
        await doors._close()
        os.close(fd)
        shutil.rmtree(folder, ignore_errors=True)


class _Bridge:
    """One door to a host TCP port: a unix server whose connections are spliced to it.

    The splice is a pair of asyncio protocols, each writing what it receives straight to
    the other's transport (no stream buffers, no task per direction): a door carries
    every MCP exchange and every exported span of a run, and the bridge's CPU counts
    against the run. A full write buffer on one side pauses reading on the other.
    """

    def __init__(self, host: str, port: int, max_connections: int) -> None:
        self.host, self.port = host, port
        self.max_connections = max_connections
        # Where the host port is, in order: the name looked up once, when the door opens.
        self.addresses: tuple[str, ...] = (host,)
        self._server: asyncio.Server | None = None
        self._connections: set[_Splice] = set()

    async def start(self, path: Path) -> None:
        loop = asyncio.get_running_loop()
        self.addresses = await _addresses(loop, self.host, self.port)
        self._server = await loop.create_unix_server(self._accept, path=str(path))

    def _accept(self) -> asyncio.Protocol:
        if len(self._connections) >= self.max_connections:
            logger.warning("door %d: over %d connections at once; one refused",
                           self.port, self.max_connections)  # fmt: skip
            return _Refused()
        return _Splice(self)

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for splice in list(self._connections):
            splice.close()
        self._connections.clear()


async def _addresses(loop: asyncio.AbstractEventLoop, host: str, port: int) -> tuple[str, ...]:
    """``host``'s addresses, numeric, in the resolver's order (``localhost``: ``::1`` and
    ``127.0.0.1``, as ``/etc/hosts`` has them). A connection to a name looks it up first,
    in the default executor: a thread hop on every connection a door carries, which waits
    behind whatever else of the run is in a thread, and delayed a CLI's MCP requests by
    tens of milliseconds. A name that cannot be looked up now is kept, and looked up (and
    its failure reported) by each connection, as before."""
    try:
        infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except OSError:
        return (host,)
    return tuple(dict.fromkeys(str(info[4][0]) for info in infos)) or (host,)


class _Refused(asyncio.Protocol):
    """A connection over the bridge's limit: closed at once."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        transport.close()


class _End(asyncio.Protocol):
    """One end of a spliced connection: what it receives, its ``peer`` writes; a full
    write buffer here pauses reading there."""

    transport: asyncio.Transport | None = None
    peer: _End | None = None
    eof = False  # this end has sent all it will

    @property
    def splice(self) -> _Splice:
        raise NotImplementedError

    def _peer_transport(self) -> asyncio.Transport | None:
        return None if self.peer is None else self.peer.transport

    def data_received(self, data: bytes) -> None:
        peer = self._peer_transport()
        assert peer is not None
        peer.write(data)

    def eof_received(self) -> bool:
        self.eof = True
        assert self.peer is not None
        assert self.peer.transport is not None
        return _pass_eof(self.peer.transport, self.peer.eof, self.splice)

    def pause_writing(self) -> None:
        if (peer := self._peer_transport()) is not None:
            peer.pause_reading()

    def resume_writing(self) -> None:
        if (peer := self._peer_transport()) is not None:
            peer.resume_reading()


class _Splice(_End):
    """The door's end of one connection; :class:`_Upstream` is the host port's end."""

    def __init__(self, bridge: _Bridge) -> None:
        self.bridge = bridge
        self._connecting: asyncio.Task[None] | None = None

    @property
    def splice(self) -> _Splice:
        return self

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        transport.pause_reading()  # until the host port answers
        self.bridge._connections.add(self)
        self._connecting = asyncio.get_running_loop().create_task(self._connect())

    async def _connect(self) -> None:
        bridge = self.bridge
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(CONNECT_TIMEOUT_S):
                for n, address in enumerate(bridge.addresses, start=1):
                    try:
                        await loop.create_connection(lambda: _Upstream(self), address, bridge.port)
                        break
                    except OSError:
                        if n == len(bridge.addresses):
                            raise
        except (OSError, TimeoutError) as exc:
            logger.debug("door %d: cannot reach %s:%d (%s)", bridge.port, bridge.host,
                         bridge.port, exc)  # fmt: skip
            self.close()
        except asyncio.CancelledError:
            self.close()

    def linked(self, upstream: _Upstream) -> None:
        self.peer = upstream
        assert self.transport is not None
        assert upstream.transport is not None
        if self.transport.is_closing():
            upstream.transport.close()
        else:
            self.transport.resume_reading()

    def connection_lost(self, exc: Exception | None) -> None:
        self.bridge._connections.discard(self)
        if (peer := self._peer_transport()) is not None:
            _end(peer, exc)
        elif self._connecting is not None:
            self._connecting.cancel()

    def close(self) -> None:
        """End both ends now (the run is over, or the host port cannot be reached)."""
        for transport in (self.transport, self._peer_transport()):
            if transport is not None:
                transport.close()
        self.bridge._connections.discard(self)


class _Upstream(_End):
    """The host port's end of one spliced connection."""

    def __init__(self, door: _Splice) -> None:
        self.peer = door

    @property
    def splice(self) -> _Splice:
        assert isinstance(self.peer, _Splice)
        return self.peer

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        self.splice.linked(self)

    def connection_lost(self, exc: Exception | None) -> None:
        if (peer := self._peer_transport()) is not None:
            _end(peer, exc)


def _pass_eof(sink: asyncio.Transport, sink_ended: bool, splice: _Splice) -> bool:
    """One side ended what it sends: pass the end on as a half-close; once both sides
    have ended, close the connection. The answer is ``eof_received``'s (True: keep the
    transport open to write)."""
    if sink_ended or not sink.can_write_eof():
        splice.close()
        return False
    sink.write_eof()
    return True


def _end(other: asyncio.Transport, exc: Exception | None) -> None:
    """One end is gone: the other goes too, at once after a reset, else once what it
    still has to write is written."""
    if exc is not None:
        other.abort()
    else:
        other.close()


__all__ = [
    "DOORS_DIR", "INSIDE", "MAX_CONNECTIONS", "Door", "Doors", "loopback_address", "open_doors",
]  # fmt: skip
