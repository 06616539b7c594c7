"""The `mcp` package's real clients, connected with a bearer secret (or without one)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import httpx2
from mcp import Client
from mcp.client.session import ClientSession
from mcp.client.sse import sse_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client


def auth_headers(secret: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {secret}"} if secret else {}


@asynccontextmanager
async def http_client(
    url: str, secret: str | None, statuses: list[int] | None = None
) -> AsyncIterator[Client]:
    """A streamable HTTP client for ``url`` (``.../mcp?...``) sending ``secret``.

    ``statuses`` collects the HTTP status of every response the client got (the
    client itself reports a refusal only as a JSON-RPC error).
    """
    http = create_mcp_http_client(headers=auth_headers(secret))
    if statuses is not None:

        async def seen(response: httpx2.Response) -> None:
            statuses.append(response.status_code)

        http.event_hooks["response"].append(seen)
    async with http, Client(streamable_http_client(url, http_client=http)) as client:
        yield client


@asynccontextmanager
async def sse_session(url: str, secret: str | None) -> AsyncIterator[ClientSession]:
    """An initialized SSE session for ``url`` (``.../sse?...``) sending ``secret``."""
    async with (
        sse_client(url, headers=auth_headers(secret)) as streams,
        ClientSession(streams[0], streams[1]) as session,
    ):
        await session.initialize()
        yield session
