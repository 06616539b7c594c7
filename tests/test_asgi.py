"""spawnkit._asgi: uvicorn's logging is set up by the first server of a process, not by each."""

from __future__ import annotations

import logging

import httpx

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
