"""ACP's messages on stdio: one JSON object a line, and nothing else on stdout.

:func:`claim_stdio` takes the process's stdin and stdout for the protocol and points file
descriptors 0 and 1 elsewhere (``/dev/null`` and stderr), so that nothing else, a stray
``print``, a library's warning or a child process that inherits them, can read a
client's message or put a line that is not JSON-RPC on its stream.

:class:`StdioWire` is the SDK's message transport (``acp._transport.Transport``) over
those two descriptors. Unlike the SDK's own stdio framing, which logs a line that is not
JSON and reads on, it answers such a line with JSON-RPC's ``Parse error`` (-32700) and
a message that is no request, notification or response with ``Invalid Request``
(-32600), as JSON-RPC 2.0 asks, so a broken client learns what it sent.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import sys
from dataclasses import dataclass
from typing import Any

logger = logging.getLogger(__name__)

# The longest line read (a prompt with embedded files can be large); the SDK's default.
LINE_LIMIT = 50 * 1024 * 1024


@dataclass(frozen=True)
class ProtocolStdio:
    """The descriptors the protocol owns: the client's stdin and stdout, moved aside."""

    read_fd: int
    write_fd: int


def claim_stdio() -> ProtocolStdio:
    """Keep fds 0 and 1 for the protocol under new numbers; 0 becomes /dev/null, 1 stderr."""
    sys.stdout.flush()
    read_fd, write_fd = os.dup(0), os.dup(1)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    os.dup2(2, 1)
    return ProtocolStdio(read_fd, write_fd)


def _error(request_id: Any, code: int, message: str, detail: str) -> dict[str, Any]:
    return {
        "jsonrpc": "2.0",
        "id": request_id,
        "error": {"code": code, "message": message, "data": {"details": detail}},
    }


def _is_message(message: object) -> bool:
    """A request or notification (a ``method``) or a response (an ``id`` and a result)."""
    if not isinstance(message, dict):
        return False
    if "method" in message:
        return isinstance(message["method"], str)
    return "id" in message and ("result" in message or "error" in message)


class StdioWire:
    """JSON-RPC messages, one a line, over a reader and a writer of the client's pipes."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._reader = reader
        self._writer = writer
        # Handlers send concurrently; each line goes out whole, in the order they asked.
        self._sending = asyncio.Lock()
        self._closed = False

    @classmethod
    async def open(cls, stdio: ProtocolStdio) -> StdioWire:
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader(limit=LINE_LIMIT)
        await loop.connect_read_pipe(
            lambda: asyncio.StreamReaderProtocol(reader), os.fdopen(stdio.read_fd, "rb", 0)
        )
        transport, protocol = await loop.connect_write_pipe(
            asyncio.streams.FlowControlMixin, os.fdopen(stdio.write_fd, "wb", 0)
        )
        writer = asyncio.StreamWriter(transport, protocol, None, loop)
        return cls(reader, writer)

    async def send(self, message: dict[str, Any]) -> None:
        if self._closed:
            raise ConnectionError("the client's stdout is closed")
        line = json.dumps(message, ensure_ascii=False, separators=(",", ":")) + "\n"
        async with self._sending:
            self._writer.write(line.encode("utf-8"))
            await self._writer.drain()

    async def receive(self) -> dict[str, Any] | None:
        """The next message; None when the client closed its end (stdin's EOF)."""
        while True:
            line = await self._read_line()
            if line is None:
                return None
            if not line.strip():
                continue
            try:
                message = json.loads(line)
            except ValueError as exc:
                await self._answer(_error(None, -32700, "Parse error", f"not JSON: {exc}"))
                continue
            if not _is_message(message):
                request_id = message.get("id") if isinstance(message, dict) else None
                await self._answer(
                    _error(request_id, -32600, "Invalid Request", "not a JSON-RPC 2.0 message")
                )
                continue
            return message  # type: ignore[no-any-return]

    async def _read_line(self) -> bytes | None:
        try:
            line = await self._reader.readuntil(b"\n")
        except asyncio.IncompleteReadError as exc:
            return exc.partial or None  # a last line without its newline still counts
        except asyncio.LimitOverrunError as exc:
            await self._skip(exc.consumed)
            await self._answer(
                _error(None, -32700, "Parse error", f"a line longer than {LINE_LIMIT} bytes")
            )
            return b""
        return line

    async def _skip(self, consumed: int) -> None:
        """Drop the rest of an overlong line."""
        await self._reader.readexactly(consumed)
        while True:
            try:
                await self._reader.readuntil(b"\n")
                return
            except asyncio.LimitOverrunError as exc:
                await self._reader.readexactly(exc.consumed)
            except asyncio.IncompleteReadError:
                return

    async def _answer(self, error: dict[str, Any]) -> None:
        logger.warning("ACP client sent a bad message: %s", error["error"]["data"]["details"])
        try:
            await self.send(error)
        except (ConnectionError, OSError):
            logger.debug("could not answer a bad message: the client's stdout is closed")

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        # The pipe's transport writes out what it still holds, then closes.
        self._writer.close()
