"""spawnkit._asgi: uvicorn's logging is set up by the first server of a process, not by each."""

from __future__ import annotations

import asyncio
import logging
import threading

import httpx
import pytest

from spawnkit import _asgi


async def app(scope, receive, send) -> None:  # type: ignore[no-untyped-def]
    if scope["type"] != "http":
        return
    await send({"type": "http.response.start", "status": 204, "headers": []})
    await send({"type": "http.response.body", "body": b""})


async def test_a_later_server_leaves_uvicorns_loggers_as_the_application_set_them() -> None:
    """uvicorn's Config ran ``logging.config.dictConfig`` for every server it made (two
    thirds of the CPU of starting one; a run's servers start with the run), replacing the
    handlers and levels of its loggers each time."""
    async with _asgi.serve(app):
        pass  # the first server of the process (or an earlier test's) set them up
    mine = logging.NullHandler()
    error_logger = logging.getLogger("uvicorn.error")
    uvicorn_logger = logging.getLogger("uvicorn")
    uvicorn_logger.addHandler(mine)
    error_logger.setLevel(logging.ERROR)
    try:
        async with _asgi.serve(app) as address, httpx.AsyncClient() as http:
            assert (await http.get(address.url)).status_code == 204
        assert mine in uvicorn_logger.handlers
        assert error_logger.level == logging.ERROR
    finally:
        uvicorn_logger.removeHandler(mine)
        error_logger.setLevel(logging.WARNING)


def slow_app(release: asyncio.Event, started: asyncio.Event):  # type: ignore[no-untyped-def]
    async def app(scope, receive, send) -> None:  # type: ignore[no-untyped-def]
        if scope["type"] != "http":
            return
        started.set()
        await release.wait()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"finished"})

    return app


async def test_a_request_in_flight_is_answered_before_the_server_stops() -> None:
    """Stopping waits for a request being served (within the graceful timeout), as uvicorn
    does; it no longer sleeps a fixed 0.1 s first."""
    release, started = asyncio.Event(), asyncio.Event()
    async with httpx.AsyncClient() as http:
        async with _asgi.serve(slow_app(release, started)) as address:
            pending = asyncio.create_task(http.get(address.url))
            await started.wait()
            asyncio.get_running_loop().call_later(0.2, release.set)
        # The block has exited: the server stopped, and the request had its answer.
        assert release.is_set()
        response = await pending
        assert response.status_code == 200 and response.text == "finished"


async def test_an_idle_kept_connection_is_closed_when_the_server_stops() -> None:
    """A client's kept-alive connection (an agent CLI's, between turns) is closed by the
    stop instead of holding it for the keep-alive timeout (30 s)."""
    async with httpx.AsyncClient() as http:
        async with _asgi.serve(app) as address:
            assert (await http.get(address.url)).status_code == 204  # kept alive
        with pytest.raises(httpx.ConnectError):
            await http.get(address.url)  # nothing listens, and the kept one was closed


def test_a_server_in_a_thread_stops_when_asked_from_another_thread() -> None:
    with _asgi.serve_in_thread(app) as address:
        assert httpx.get(address.url).status_code == 204
        threads = [t for t in threading.enumerate() if t.name == f"asgi:{address.port}"]
        assert len(threads) == 1
    assert not threads[0].is_alive()
