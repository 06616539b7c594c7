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
* a bridge to an existing host TCP port (``tcp_ports``: the butler's MCP server, the run's
  OTLP receiver, a loopback model URL such as the replay server): each connection to the
  socket is spliced to ``HOST:PORT``, at most :data:`MAX_CONNECTIONS` at once.

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
CLOSE_GRACE_S = 2.0
_CHUNK = 64 * 1024


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
    """One door to a host TCP port: a unix server whose connections are spliced to it."""

    def __init__(self, host: str, port: int, max_connections: int) -> None:
        self.host, self.port = host, port
        self.max_connections = max_connections
        self._server: asyncio.Server | None = None
        self._connections: set[asyncio.Task[None]] = set()

    async def start(self, path: Path) -> None:
        self._server = await asyncio.start_unix_server(self._accept, path=str(path))

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if len(self._connections) >= self.max_connections:
            logger.warning("door %d: over %d connections at once; one refused",
                           self.port, self.max_connections)  # fmt: skip
            writer.close()
            return
        task = asyncio.current_task()
        assert task is not None
        self._connections.add(task)
        try:
            await self._splice(reader, writer)
        except asyncio.CancelledError:
            # Only close() cancels a connection: it ends here. A callback task of
            # asyncio.start_unix_server that ends cancelled is logged as an error by asyncio
            # (3.11), which a notebook shows in the cell of a stopped run.
            writer.close()
        finally:
            self._connections.discard(task)

    async def _splice(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            async with asyncio.timeout(CONNECT_TIMEOUT_S):
                upstream_reader, upstream_writer = await asyncio.open_connection(
                    self.host, self.port
                )
        except (OSError, TimeoutError) as exc:
            logger.debug("door %d: cannot reach %s:%d (%s)", self.port, self.host, self.port, exc)
            writer.close()
            return
        try:
            await asyncio.gather(_pump(reader, upstream_writer), _pump(upstream_reader, writer))
        finally:
            for end in (writer, upstream_writer):
                end.close()

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._connections):
            task.cancel()
        if self._connections:
            await asyncio.wait(set(self._connections), timeout=CLOSE_GRACE_S)


async def _pump(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
    """Copy ``source`` to ``sink`` as it arrives; pass its end on as a half-close."""
    try:
        while chunk := await source.read(_CHUNK):
            sink.write(chunk)
            await sink.drain()
        if sink.can_write_eof():
            sink.write_eof()
    except (ConnectionError, OSError):
        sink.close()  # the other way stops too: a reset ends the whole connection


__all__ = [
    "DOORS_DIR", "INSIDE", "MAX_CONNECTIONS", "Door", "Doors", "loopback_address", "open_doors",
]  # fmt: skip
