"""Run an ASGI app on a local socket, inside the caller's event loop or on a thread.

Both of spawnkit's servers (a butler's MCP server and the replay model server)
need the same two shapes: ``async with serve(app) as url`` for code that already
owns an event loop (the CLI, the spawner), and ``with serve_in_thread(app) as url``
for synchronous callers (tests, benchmarks, a notebook cell). The socket is bound
before uvicorn starts, so port 0 works and the URL is known at once, and every
start and stop is bounded by a timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import threading
from collections.abc import AsyncIterator, Callable, Generator, Iterator
from dataclasses import dataclass
from typing import Any, cast

import uvicorn

from .errors import SpawnkitError

logger = logging.getLogger(__name__)

# Any ASGI application: a Starlette app, an MCP server's app, a plain callable.
ASGIApp = Callable[..., Any]

START_TIMEOUT_S = 10.0
STOP_TIMEOUT_S = 5.0


class ServerStartError(SpawnkitError):
    """A local server could not bind its port or did not come up in time."""


@dataclass(frozen=True)
class ServerAddress:
    host: str
    port: int

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"


def bind_socket(host: str, port: int) -> socket.socket:
    """Bind (but do not listen on) a TCP socket; port 0 picks a free port."""
    # IPPROTO_TCP named: asyncio then turns Nagle off on each accepted connection (it
    # checks the protocol number). With proto 0 a streamed answer's first chunk waited for
    # the client's delayed ACK of its headers: 40 ms on every streamed model response.
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise ServerStartError(f"cannot bind {host}:{port}: {exc.strerror or exc}") from exc
    sock.set_inheritable(False)
    return sock


class _Server(uvicorn.Server):
    """uvicorn without its signal handlers, and stopping as soon as it is asked to.

    The host application owns SIGINT: otherwise Ctrl-C in ``spawnkit run`` would stop the
    MCP server quietly instead of interrupting the run.

    uvicorn looks at ``should_exit`` every 0.1 s, and its shutdown then sleeps 0.1 s before
    it waits for the connections to close: 0.1 to 0.2 s for each server stopped, which the
    end of every ``spawnkit run`` and ``spawnkit acp`` paid twice (the replay server, the
    butler's MCP server) and every run with its CLI's telemetry once (its OTLP receiver).
    Here :meth:`request_exit` wakes the loop at once, and the shutdown waits for the
    connections by polling from 1 ms up, within the same graceful timeout.
    """

    def __init__(self, config: uvicorn.Config) -> None:
        super().__init__(config)
        self._exit_requested: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        yield

    def request_exit(self) -> None:
        """Stop serving (from any thread): as ``should_exit = True``, without the wait."""
        self.should_exit = True
        loop, event = self._loop, self._exit_requested
        if loop is None or event is None or loop.is_closed():
            return  # not serving yet: the first tick sees should_exit
        with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
            loop.call_soon_threadsafe(event.set)

    async def main_loop(self) -> None:
        self._loop, self._exit_requested = asyncio.get_running_loop(), asyncio.Event()
        counter = 0
        should_exit = await self.on_tick(counter)
        while not should_exit:
            counter = (counter + 1) % 864000
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._exit_requested.wait(), 0.1)
            should_exit = await self.on_tick(counter)

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        for server in self.servers:
            server.close()
        for sock in sockets or []:
            sock.close()
        state = self.server_state
        for connection in list(state.connections):
            connection.shutdown()  # an idle keep-alive connection closes at once
        loop = asyncio.get_running_loop()
        graceful = self.config.timeout_graceful_shutdown  # None: as long as they take
        deadline = None if graceful is None else loop.time() + graceful
        delay = 0.001
        while (state.connections or state.tasks) and not self.force_exit:
            if deadline is not None and loop.time() >= deadline:
                for task in state.tasks:
                    task.cancel(msg="Task cancelled, timeout graceful shutdown exceeded")
                break
            await asyncio.sleep(delay)
            delay = min(delay * 2, 0.05)
        for server in self.servers:
            await server.wait_closed()
        if not self.force_exit:
            await self.lifespan.shutdown()


# uvicorn sets up its loggers (``logging.config.dictConfig``, then three levels that each
# clear every logger's cache) for each server it makes: two thirds of the CPU of starting
# one, and a run's OTLP receiver is a server per run. The first server does it; the
# others find it done.
_uvicorn_logging = threading.Event()


def _make_server(app: ASGIApp) -> _Server:
    first = not _uvicorn_logging.is_set()
    _uvicorn_logging.set()
    config = uvicorn.Config(
        cast(Any, app),
        log_config=uvicorn.config.LOGGING_CONFIG if first else None,
        log_level="warning" if first else None,
        access_log=False,
        lifespan="auto",
        # Agent CLIs keep connections open between model turns.
        timeout_keep_alive=30,
        timeout_graceful_shutdown=2,
    )
    return _Server(config)


@contextlib.asynccontextmanager
async def serve(
    app: ASGIApp, host: str = "127.0.0.1", port: int = 0
) -> AsyncIterator[ServerAddress]:
    """Serve ``app`` as a task on the running loop until the block exits."""
    sock = bind_socket(host, port)
    address = ServerAddress(host, sock.getsockname()[1])
    server = _make_server(app)
    task = asyncio.create_task(server.serve(sockets=[sock]), name=f"asgi:{address.port}")
    try:
        await _wait_started(server, task)
        yield address
    finally:
        server.request_exit()
        try:
            await asyncio.wait_for(asyncio.shield(task), STOP_TIMEOUT_S)
        except TimeoutError:
            server.force_exit = True
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        sock.close()


async def _wait_started(server: uvicorn.Server, task: asyncio.Task[None]) -> None:
    deadline = asyncio.get_running_loop().time() + START_TIMEOUT_S
    while not server.started:
        if task.done():
            exc = task.exception()
            raise ServerStartError(f"server exited during start-up: {exc!r}")
        if asyncio.get_running_loop().time() > deadline:
            raise ServerStartError(f"server did not start within {START_TIMEOUT_S:.0f} s")
        await asyncio.sleep(0.005)


@contextlib.contextmanager
def serve_in_thread(
    app: ASGIApp, host: str = "127.0.0.1", port: int = 0
) -> Iterator[ServerAddress]:
    """Serve ``app`` on a daemon thread with its own event loop."""
    sock = bind_socket(host, port)
    address = ServerAddress(host, sock.getsockname()[1])
    server = _make_server(app)
    failure: list[BaseException] = []

    def run() -> None:
        try:
            asyncio.run(server.serve(sockets=[sock]))
        except BaseException as exc:  # noqa: BLE001 - handed to the starting thread
            failure.append(exc)

    thread = threading.Thread(target=run, name=f"asgi:{address.port}", daemon=True)
    thread.start()
    try:
        waited = 0.0
        while not server.started:
            if failure or not thread.is_alive():
                raise ServerStartError(f"server exited during start-up: {failure[:1]!r}")
            if waited > START_TIMEOUT_S:
                raise ServerStartError(f"server did not start within {START_TIMEOUT_S:.0f} s")
            threading.Event().wait(0.005)
            waited += 0.005
        yield address
    finally:
        server.request_exit()
        thread.join(STOP_TIMEOUT_S)
        if thread.is_alive():
            server.force_exit = True
            thread.join(STOP_TIMEOUT_S)
            if thread.is_alive():
                logger.warning("server thread on port %d did not stop", address.port)
        sock.close()
