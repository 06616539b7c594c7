"""The model relay as a server: streams pass chunk by chunk, keys are swapped, sockets are private.

Real servers on the test's loop: a slow streaming upstream that sends its first event and
then waits for the client to have it (a relay that buffered would never deliver it: the
test would time out), and spawnkit's replay server as the upstream that logs every
request's headers. Over TCP and over a unix socket (the door of a run's network sandbox).
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import stat
import tomllib
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import StreamingResponse
from starlette.routing import Route

from spawnkit._asgi import serve
from spawnkit.budgets.metering import Meter
from spawnkit.containment.credentials import MODEL_CREDENTIALS, KeySwap, placeholder_for
from spawnkit.containment.relay import Relay, open_relay
from spawnkit.replay import ReplayServer, Scenario
from spawnkit.result import Usage

MESSAGE_START = {
    "type": "message_start",
    "message": {
        "id": "msg_1", "type": "message", "role": "assistant", "model": "m", "content": [],
        "stop_reason": None, "usage": {"input_tokens": 5, "output_tokens": 0},
    },
}  # fmt: skip
REST = [
    {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
    {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "Hi"}},
    {"type": "content_block_stop", "index": 0},
    {"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 2}},
    {"type": "message_stop"},
]
REQUEST = {"model": "m", "max_tokens": 10, "stream": True, "messages": []}


def frame(event: dict[str, Any]) -> bytes:
    return f"event: {event['type']}\ndata: {json.dumps(event)}\n\n".encode()


class SlowUpstream:
    """Sends ``message_start``, then waits until told to go on, then the rest of the stream."""

    def __init__(self) -> None:
        self.go_on = asyncio.Event()
        self.finished = False

    def app(self) -> Starlette:
        async def messages(request: Request) -> StreamingResponse:
            await request.body()

            async def stream() -> AsyncIterator[bytes]:
                yield frame(MESSAGE_START)
                await self.go_on.wait()
                for event in REST:
                    yield frame(event)
                self.finished = True

            return StreamingResponse(stream(), media_type="text/event-stream")

        return Starlette(routes=[Route("/v1/messages", messages, methods=["POST"])])


@asynccontextmanager
async def relay_client(
    relay: Relay,
) -> AsyncIterator[httpx.AsyncClient]:
    """A client that reaches the relay as its CLI would: TCP, or through its unix socket."""
    transport = (
        httpx.AsyncHTTPTransport(uds=str(relay.socket)) if relay.socket is not None else None
    )
    async with httpx.AsyncClient(transport=transport, timeout=30) as client:
        yield client


@pytest.fixture
def socket_path(tmp_path: Path) -> Iterator[Path]:
    """A unix socket's path in a folder of the test's own, named through a handle on the
    folder, as a run's doors are (spawnkit.containment.doors): such a path has room for
    about 100 bytes, and a deep temp folder has more."""
    doors = tmp_path / "doors"
    doors.mkdir(mode=0o700)
    fd = os.open(doors, os.O_RDONLY | os.O_DIRECTORY)
    try:
        yield Path(f"/proc/self/fd/{fd}/relay.sock")
    finally:
        os.close(fd)


def mode_of(path: Path) -> int | None:
    try:
        return path.stat().st_mode
    except FileNotFoundError:
        return None


@pytest.fixture(params=["tcp", "uds"])
def uds(request: pytest.FixtureRequest, socket_path: Path) -> Path | None:
    return socket_path if request.param == "uds" else None


@pytest.mark.parametrize("metered", [False, True], ids=["passed", "metered"])
async def test_a_stream_passes_chunk_by_chunk(uds: Path | None, metered: bool) -> None:
    upstream = SlowUpstream()
    totals: list[Usage] = []
    sink = Meter(totals.append) if metered else None
    async with (
        serve(upstream.app()) as address,
        open_relay(address.url, sink=sink, uds=uds) as relay,
        relay_client(relay) as client,
        client.stream("POST", relay.url + "/v1/messages", json=REQUEST) as response,
    ):
        assert response.status_code == 200
        chunks = response.aiter_raw()
        async with asyncio.timeout(20):  # a buffering relay never hands over the first event
            first = await anext(chunks)
        assert b"message_start" in first and not upstream.finished
        upstream.go_on.set()
        rest = b"".join([chunk async for chunk in chunks])
    assert upstream.finished and rest.endswith(frame(REST[-1]))
    assert totals == ([Usage(input_tokens=5, output_tokens=2)] if metered else [])


async def test_the_real_keys_are_swapped_in_for_their_placeholders(uds: Path | None) -> None:
    real = {
        "ANTHROPIC_API_KEY": "sk-ant-api03-" + "a" * 95,
        "GEMINI_API_KEY": "AIza" + "b" * 35,
        "OPENAI_API_KEY": "sk-proj-" + "c+/=" * 10,  # not URL-safe: quoted in a query
    }
    keys = KeySwap()
    env = keys.hide({**real, "PATH": "/usr/bin"})
    assert env["PATH"] == "/usr/bin" and not set(real.values()) & set(env.values())
    server = ReplayServer(Scenario.from_dict(tomllib.loads('[[turn]]\ntext = "ok"'), source="t"))
    async with (
        server.serve() as upstream,
        open_relay(upstream, keys=keys, uds=uds) as relay,
        relay_client(relay) as client,
    ):
        path = "/v1beta/models/gemini-2.5-flash:generateContent"
        query = {"key": env["GEMINI_API_KEY"], "other": env["OPENAI_API_KEY"]}
        headers = {
            "x-api-key": env["ANTHROPIC_API_KEY"],
            "authorization": f"Bearer {env['OPENAI_API_KEY']}",
            "x-goog-api-key": env["GEMINI_API_KEY"],
            "x-both": f"{env['GEMINI_API_KEY']},{env['ANTHROPIC_API_KEY']}",
        }
        body = {"contents": [{"role": "user", "parts": [{"text": env["GEMINI_API_KEY"]}]}]}
        answer = await client.post(relay.url + path, params=query, headers=headers, json=body)
        assert answer.status_code == 200, answer.text
    (seen,) = server.requests
    assert seen.headers["x-api-key"] == real["ANTHROPIC_API_KEY"]
    assert seen.headers["authorization"] == f"Bearer {real['OPENAI_API_KEY']}"
    assert seen.headers["x-goog-api-key"] == real["GEMINI_API_KEY"]
    assert seen.headers["x-both"] == f"{real['GEMINI_API_KEY']},{real['ANTHROPIC_API_KEY']}"
    assert dict(httpx.QueryParams(seen.query)) == {
        "key": real["GEMINI_API_KEY"], "other": real["OPENAI_API_KEY"],
    }  # fmt: skip
    forwarded = json.dumps(dict(seen.headers)) + seen.query
    assert not [p for p in keys.placeholders if p in forwarded]
    # The body is the model's business: a key the agent pastes in a prompt stays a placeholder.
    assert seen.body["contents"][0]["parts"][0]["text"] == env["GEMINI_API_KEY"]


async def test_a_unix_socket_relay_is_private_and_removed_and_keeps_its_secret(
    socket_path: Path,
) -> None:
    server = ReplayServer(Scenario.from_dict(tomllib.loads('[[turn]]\ntext = "ok"'), source="t"))
    async with server.serve() as upstream, open_relay(upstream + "/v1", uds=socket_path) as relay:
        mode = mode_of(socket_path)
        assert mode is not None and stat.S_ISSOCK(mode) and stat.S_IMODE(mode) == 0o600
        # The URL its CLI gets names the inside port the sandbox's forwarder maps to it.
        assert relay.socket == socket_path and relay.port > 0
        assert re.fullmatch(rf"http://127\.0\.0\.1:{relay.port}/[\w-]{{40,}}/v1", relay.url)
        async with relay_client(relay) as client:
            refused = await client.post(f"{relay.address}/v1/responses", json={})
            assert refused.status_code == 401 and server.requests == []
            hello = await client.head(relay.url.removesuffix("/v1") + "/api/hello")
            assert hello.status_code == 200
    assert mode_of(socket_path) is None


def test_a_placeholder_has_the_shape_of_the_key_and_nothing_of_it() -> None:
    for real in ("sk-ant-api03-" + "x" * 95, "sk-proj-" + "y" * 150, "AIza" + "z" * 35):
        first, second = placeholder_for(real), placeholder_for(real)
        assert len(first) == len(real) and first != second
        prefix = real.rstrip(real[-1])
        assert first.startswith(prefix) and real[-1] * 8 not in first
    short = placeholder_for("spawnkit-replay")
    assert len(short) >= 32 and "spawnkit" not in short
    assert set(MODEL_CREDENTIALS) >= {"ANTHROPIC_API_KEY", "OPENAI_API_KEY", "GEMINI_API_KEY"}
    swap = KeySwap()
    assert swap.hide({"OPENAI_API_KEY": "sk-" + "q" * 40})["OPENAI_API_KEY"] != "sk-" + "q" * 40
    assert "q" * 40 not in repr(swap) and swap.reveal("none here") == "none here"


class Reads:
    """A reader whose reads return these pieces, one each (as a socket's reads might)."""

    def __init__(self, *pieces: bytes) -> None:
        self.pieces = [p for p in pieces if p]

    async def read(self, size: int) -> bytes:
        return self.pieces.pop(0)[:size] if self.pieces else b""


async def test_a_chunked_answer_cut_anywhere_ends_where_its_framing_says() -> None:
    """Every way a read may cut a chunked body (sizes, data, line ends, trailers) gives the
    same payload, passes on exactly the body, and stops at its end."""
    from spawnkit import _http1 as wire

    body = b"4\r\nabcd\r\n1a;ext=1\r\n" + b"z" * 26 + b"\r\n0\r\nx-trailer: 1\r\n\r\n"
    after = b"HTTP/1.1 200 OK\r\n"  # a misbehaving upstream's next bytes
    answer = wire.Answer(200, b"200 OK", b"HTTP/1.1", [], "chunked")
    for cut in range(1, len(body)):
        for tail in (b"", after):
            reader: Any = Reads(body[:cut], body[cut:] + tail)
            ended = wire.BodyEnd()
            passed, payload, reads = b"", b"", 0
            async for piece, data in wire.relay_body(reader, answer, 5, ended, payload=True):
                passed, payload, reads = passed + piece, payload + data, reads + 1
            assert passed == body and payload == b"abcd" + b"z" * 26, cut
            assert reads == 2, "each read is passed on as it comes"
            assert ended.clean == (not tail), "bytes after the end: the connection is not reused"
