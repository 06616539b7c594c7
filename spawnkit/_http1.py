"""HTTP/1.1 as the model relay needs it: request and answer heads, and bodies passed as framed.

The relay (:mod:`spawnkit.containment.relay`) sits between a CLI and its model API on every run, so
it must add next to nothing to a streamed answer. It therefore parses only heads: an
answer's body goes to the client exactly as the upstream framed it (``Content-Length``,
``chunked`` or until close), each piece as soon as it arrives, and the chunked framing is
read only to know where the answer ends and to hand the payload to a meter. A request
body is read whole (a model request is a JSON document of at most a few MB; the meter
needs it) and forwarded with a ``Content-Length``. Hop-by-hop headers stay on their hop.
Bounded throughout: a head of at most :data:`MAX_HEAD` bytes, a request body of at most
:data:`MAX_BODY`; anything malformed raises :class:`BadRequest`.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Literal

MAX_HEAD = 256 * 1024
MAX_BODY = 64 * 1024 * 1024
READ_SIZE = 256 * 1024
# Write-buffer size above which the relay waits for a slow client to catch up.
HIGH_WATER = 256 * 1024
# Headers that belong to one connection, never forwarded (RFC 9110, 7.6.1).
HOP_BY_HOP = frozenset(
    {b"connection", b"keep-alive", b"proxy-connection", b"te", b"trailer",
     b"transfer-encoding", b"upgrade"}
)  # fmt: skip
_NO_BODY_STATUS = frozenset({204, 304})

Headers = Sequence[tuple[bytes, bytes]]
Framing = Literal["none", "length", "chunked", "close"]


class BadRequest(Exception):
    """A message the relay cannot frame: malformed, or over a bound."""


class TooLarge(BadRequest):
    """A request body over the reader's limit (said so up front, or seen so while read)."""


@dataclass(frozen=True)
class Request:
    method: str
    target: bytes
    version: bytes
    headers: Headers

    @property
    def path(self) -> str:
        return self.target.partition(b"?")[0].decode("latin-1")

    def header(self, name: bytes) -> bytes:
        return _header(self.headers, name)

    @property
    def keep_alive(self) -> bool:
        tokens = _tokens(self.header(b"connection"))
        return b"keep-alive" in tokens if self.version == b"HTTP/1.0" else b"close" not in tokens

    @property
    def expects_continue(self) -> bool:
        return self.header(b"expect").lower() == b"100-continue"


@dataclass(frozen=True)
class Answer:
    status: int
    status_line: bytes
    version: bytes
    headers: Headers
    framing: Framing
    length: int = 0

    def header(self, name: bytes) -> bytes:
        return _header(self.headers, name)

    @property
    def keep_alive(self) -> bool:
        """Whether the upstream connection may carry another request after this answer."""
        if self.framing == "close":
            return False
        tokens = _tokens(self.header(b"connection"))
        return b"keep-alive" in tokens if self.version == b"HTTP/1.0" else b"close" not in tokens

    @property
    def client_keep_alive(self) -> bool:
        """Whether the client's connection may: unless the body ends only with it."""
        return self.framing != "close"

    def head_for_client(self) -> bytes:
        """The answer's head as the client gets it: its framing kept, hop headers not."""
        keep = {b"transfer-encoding"} if self.framing == "chunked" else set()
        lines = [b"HTTP/1.1 " + self.status_line]
        lines += [
            name + b": " + value
            for name, value in self.headers
            if name.lower() not in HOP_BY_HOP or name.lower() in keep
        ]
        if self.framing == "close":
            lines.append(b"connection: close")
        return b"\r\n".join(lines) + b"\r\n\r\n"


async def read_request(reader: asyncio.StreamReader) -> Request | None:
    """The next request's head, or None when the client closed between requests."""
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError as exc:
        if not exc.partial.strip():
            return None
        raise
    except asyncio.LimitOverrunError as exc:
        raise BadRequest("the request head is too large") from exc
    first, headers = _split_head(head)
    parts = first.split(b" ")
    if len(parts) != 3 or not parts[2].startswith(b"HTTP/1.") or not parts[1]:
        raise BadRequest("a malformed request line")
    return Request(parts[0].decode("latin-1"), parts[1], parts[2], headers)


async def read_body(reader: asyncio.StreamReader, headers: Headers, limit: int = MAX_BODY) -> bytes:
    """A request's whole body (at most ``limit`` bytes, :class:`TooLarge` beyond, read no
    further), de-chunked."""
    chunked = b"chunked" in _tokens(_header(headers, b"transfer-encoding"))
    length = _header(headers, b"content-length")
    if chunked and length:
        raise BadRequest("both Content-Length and chunked")  # a smuggling attempt
    if chunked:
        body = bytearray()
        while (size := await _chunk_size(reader)) > 0:
            if len(body) + size > limit:
                raise TooLarge("the request body is too large")
            body += await _chunk_data(reader, size)
        await _trailers(reader)
        return bytes(body)
    if not length:
        return b""
    if not length.isdigit():
        raise BadRequest("a bad Content-Length")
    if int(length) > limit:
        raise TooLarge("the request body is too large")
    return await reader.readexactly(int(length))


def forwarded_headers(
    headers: Headers,
    host: bytes,
    length: int,
    reveal: Callable[[str], str],
    *,
    identity: bool,
) -> list[tuple[bytes, bytes]]:
    """A request's headers for the upstream: its Host, values passed through ``reveal``,
    hop-by-hop ones (and those ``Connection`` names) dropped, the body's length, and
    ``Accept-Encoding: identity`` when ``identity`` (the answer is to be read)."""
    dropped = (
        HOP_BY_HOP
        | {b"host", b"content-length", b"expect"}
        | _tokens(_header(headers, b"connection"))
    )
    if identity:
        dropped |= {b"accept-encoding"}
    out = [(b"host", host)]
    for name, value in headers:
        if name.lower() in dropped:
            continue
        text = value.decode("latin-1")
        revealed = reveal(text)
        out.append((name, value if revealed == text else revealed.encode("latin-1")))
    if identity:
        out.append((b"accept-encoding", b"identity"))
    out.append((b"content-length", str(length).encode()))
    return out


def request_head(method: str, target: bytes, headers: Headers) -> bytes:
    lines = [method.encode("latin-1") + b" " + target + b" HTTP/1.1"]
    lines += [name + b": " + value for name, value in headers]
    return b"\r\n".join(lines) + b"\r\n\r\n"


def response(status: int, body: bytes, *, close: bool = False) -> bytes:
    """A whole JSON answer of the relay's own (an error)."""
    reason = {400: b"Bad Request", 401: b"Unauthorized", 502: b"Bad Gateway"}.get(status, b"")
    lines = [
        b"HTTP/1.1 %d %s" % (status, reason),
        b"content-type: application/json",
        b"content-length: %d" % len(body),
        *([b"connection: close"] if close else []),
    ]
    return b"\r\n".join(lines) + b"\r\n\r\n" + body


async def read_answer(reader: asyncio.StreamReader, method: str, timeout: float) -> Answer:  # noqa: ASYNC109 - one bound for the whole head
    """The upstream's answer head (interim 1xx answers skipped) and how its body is framed."""
    async with asyncio.timeout(timeout):
        while True:
            try:
                head = await reader.readuntil(b"\r\n\r\n")
            except asyncio.LimitOverrunError as exc:
                raise BadRequest("the answer head is too large") from exc
            first, headers = _split_head(head)
            version, _, status_line = first.partition(b" ")
            code = status_line[:3]
            if not version.startswith(b"HTTP/1.") or not code.isdigit():
                raise BadRequest("a malformed answer from the upstream")
            status = int(code)
            if not 100 <= status < 200:
                break
    if method == "HEAD" or status in _NO_BODY_STATUS:
        return Answer(status, status_line, version, headers, "none")
    if b"chunked" in _tokens(_header(headers, b"transfer-encoding")):
        return Answer(status, status_line, version, headers, "chunked")
    length = _header(headers, b"content-length")
    if length:
        if not length.isdigit():
            raise BadRequest("a bad Content-Length from the upstream")
        return Answer(status, status_line, version, headers, "length", int(length))
    return Answer(status, status_line, version, headers, "close")


class BodyEnd:
    """How a relayed body ended: ``clean`` when exactly at its framed end (nothing after it
    on the connection, which may then carry another request)."""

    clean = False


async def relay_body(
    reader: asyncio.StreamReader,
    answer: Answer,
    idle_timeout: float,
    ended: BodyEnd,
    *,
    payload: bool = False,
) -> AsyncIterator[tuple[bytes, bytes]]:
    """The answer's body as it arrives: (bytes to pass on as they are, their payload).

    Whatever one read brings is passed on at once, framing and all; the payload (the body
    without its chunked framing) only when ``payload`` is asked for, else ``b""``. Each
    read may wait at most ``idle_timeout``: a stream may last long, a silent upstream not.
    """
    loop = asyncio.get_running_loop()
    async with asyncio.timeout(None) as deadline:
        # Armed only while reading: never while the consumer has a piece.
        def read(size: int) -> Awaitable[bytes]:
            deadline.reschedule(loop.time() + idle_timeout)
            return reader.read(size)

        if answer.framing == "length":
            left = answer.length
            while left > 0:
                data = await read(min(left, READ_SIZE))
                deadline.reschedule(None)
                if not data:
                    raise asyncio.IncompleteReadError(b"", left)
                left -= len(data)
                yield data, data if payload else b""
        elif answer.framing == "chunked":
            scanner = _ChunkScanner()
            while not scanner.done:
                data = await read(READ_SIZE)
                deadline.reschedule(None)
                if not data:
                    raise asyncio.IncompleteReadError(b"", None)
                end, pieces = scanner.feed(data, payload=payload)
                yield data[:end], b"".join(pieces)
                if end < len(data):
                    return  # bytes after the end: the connection is not reused
        elif answer.framing == "close":
            while data := await read(READ_SIZE):
                deadline.reschedule(None)
                yield data, data if payload else b""
    ended.clean = True


class _ChunkScanner:
    """Follows a chunked body through the bytes that pass: where it ends, and its payload."""

    def __init__(self) -> None:
        self.state: Literal["size", "data", "crlf", "trailer"] = "size"
        self.left = 0  # payload bytes of the current chunk still to come (or of its CRLF)
        self.line = bytearray()  # a size or trailer line cut by a read
        self.done = False

    def feed(self, data: bytes, *, payload: bool) -> tuple[int, list[bytes]]:
        """How much of ``data`` belongs to the body, and the payload in it."""
        pieces: list[bytes] = []
        at, size = 0, len(data)
        while at < size and not self.done:
            if self.state == "size" and not self.line:
                # The common case in one step: a size line, its chunk and CRLF all here.
                newline = data.find(b"\n", at)
                if newline >= 0:
                    chunk = _parse_chunk_size(data[at : newline + 1])
                    at = newline + 1
                    end = at + chunk
                    if not chunk:
                        self.state = "trailer"
                    elif end + 2 <= size:
                        if payload:
                            pieces.append(data[at:end])
                        at = end + 2
                    else:
                        self.state, self.left = "data", chunk
                    continue
            if self.state in ("data", "crlf"):
                take = min(self.left, size - at)
                if payload and self.state == "data":
                    pieces.append(data[at : at + take])
                at += take
                self.left -= take
                if self.left == 0:
                    self.state, self.left = ("crlf", 2) if self.state == "data" else ("size", 0)
                continue
            newline = data.find(b"\n", at)
            if newline < 0:
                self.line += data[at:]
                if len(self.line) > MAX_HEAD:
                    raise BadRequest("a chunk line is too long")
                return size, pieces
            line = bytes(self.line) + data[at : newline + 1]
            self.line.clear()
            at = newline + 1
            if self.state == "trailer":
                self.done = not line.strip()
                continue
            chunk = _parse_chunk_size(line)
            self.state, self.left = ("data", chunk) if chunk else ("trailer", 0)
        return at, pieces


def _split_head(head: bytes) -> tuple[bytes, list[tuple[bytes, bytes]]]:
    lines = head[:-4].split(b"\r\n")
    headers = []
    for line in lines[1:]:
        name, colon, value = line.partition(b":")
        if not colon or not name or name != name.strip() or line[:1] in (b" ", b"\t"):
            raise BadRequest("a malformed header line")
        headers.append((name, value.strip()))
    return lines[0], headers


def _header(headers: Headers, name: bytes) -> bytes:
    return next((value for key, value in headers if key.lower() == name), b"")


def _tokens(value: bytes) -> set[bytes]:
    return {token.strip().lower() for token in value.split(b",") if token.strip()}


async def _chunk_size(reader: asyncio.StreamReader) -> int:
    return _parse_chunk_size(await reader.readuntil(b"\r\n"))


def _parse_chunk_size(line: bytes) -> int:
    digits = line.partition(b";")[0].strip()
    try:
        size = int(digits, 16)
    except ValueError:
        raise BadRequest("a malformed chunk size") from None
    if size < 0:
        raise BadRequest("a malformed chunk size")
    return size


async def _chunk_data(reader: asyncio.StreamReader, size: int) -> bytes:
    data = await reader.readexactly(size + 2)
    if data[-2:] != b"\r\n":
        raise BadRequest("a chunk without its line end")
    return data[:-2]


async def _trailers(reader: asyncio.StreamReader) -> bytes:
    """The trailer section after the last chunk, through its empty line."""
    lines = []
    while (line := await reader.readuntil(b"\r\n")) != b"\r\n":
        lines.append(line)
        if sum(map(len, lines)) > MAX_HEAD:
            raise BadRequest("the trailers are too large")
    return b"".join(lines) + b"\r\n"
