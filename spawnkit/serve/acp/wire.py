"""ACP's messages on stdio: one JSON object a line, and nothing else on stdout.

:func:`claim_stdio` takes the process's stdin and stdout for the protocol and points file
descriptors 0 and 1 elsewhere (``/dev/null`` and stderr), so that nothing else, a stray
``print``, a library's warning or a child process that inherits them, can read a
client's message or put a line that is not JSON-RPC on its stream.

:class:`StdioWire` gives the SDK's connection the byte streams it takes (every version
of ``agent-client-protocol`` from 0.11 takes a reader and a writer), with a filter in
between: the SDK logs a line that is not JSON and reads on, and says nothing to the
client; here such a line is answered with JSON-RPC's ``Parse error`` (-32700), and a
message that is no request, notification or response with ``Invalid Request`` (-32600),
as JSON-RPC 2.0 asks, so a broken client learns what it sent. Good lines pass unchanged.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import stat
import sys
import threading
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
    """Keep fds 0 and 1 for the protocol under new numbers; 0 becomes /dev/null, 1 stderr.

    An editor gives the agent pipes; a person may give it a file, ``/dev/null`` or a
    terminal, which asyncio's pipe transports refuse (or epoll cannot watch): those are
    carried through a pipe of their own by a thread (:func:`_through_a_pipe`).
    """
    sys.stdout.flush()
    read_fd, write_fd = os.dup(0), os.dup(1)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    os.dup2(2, 1)
    if not _watchable(read_fd):
        read_fd = _through_a_pipe(read_fd, reading=True)
    if not _watchable(write_fd):
        write_fd = _through_a_pipe(write_fd, reading=False)
    return ProtocolStdio(read_fd, write_fd)


def _watchable(fd: int) -> bool:
    """Whether the event loop can watch ``fd`` itself: a pipe or a socket."""
    mode = os.fstat(fd).st_mode
    return stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode)


def _through_a_pipe(fd: int, *, reading: bool) -> int:
    """A pipe end standing in for ``fd``, a thread copying between them until EOF."""
    pipe_read, pipe_write = os.pipe()
    source, sink, ours = (fd, pipe_write, pipe_read) if reading else (pipe_read, fd, pipe_write)

    def copy() -> None:
        try:
            while chunk := os.read(source, 64 * 1024):
                view = memoryview(chunk)
                while view:
                    view = view[os.write(sink, view) :]
        except OSError:
            pass  # the other side went away: EOF for the protocol
        finally:
            os.close(source)
            os.close(sink)

    threading.Thread(target=copy, name="acp-stdio", daemon=True).start()
    return ours


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
    """The client's stdin, checked line by line (:attr:`reader`), and its stdout
    (:attr:`writer`), which the SDK and the error answers share: each writes a whole line
    in one call, so lines never interleave."""

    def __init__(self, source: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.source = source
        self.writer = writer
        self.reader = asyncio.StreamReader(limit=LINE_LIMIT)
        self._pump = asyncio.create_task(self._check_lines(), name="acp-stdin")

    @classmethod
    async def open(cls, stdio: ProtocolStdio) -> StdioWire:
        loop = asyncio.get_running_loop()
        source = asyncio.StreamReader(limit=LINE_LIMIT)
        await loop.connect_read_pipe(
            lambda: asyncio.StreamReaderProtocol(source), os.fdopen(stdio.read_fd, "rb", 0)
        )
        transport, protocol = await loop.connect_write_pipe(
            asyncio.streams.FlowControlMixin, os.fdopen(stdio.write_fd, "wb", 0)
        )
        return cls(source, asyncio.StreamWriter(transport, protocol, None, loop))

    async def _check_lines(self) -> None:
        """Pass each JSON-RPC message on to :attr:`reader`; answer the rest; EOF at EOF."""
        try:
            while (line := await self._read_line()) is not None:
                if not line.strip():
                    continue
                if (error := _problem(line)) is not None:
                    await self._answer(error)
                    continue
                self.reader.feed_data(line if line.endswith(b"\n") else line + b"\n")
        finally:
            self.reader.feed_eof()

    async def _read_line(self) -> bytes | None:
        try:
            return await self.source.readuntil(b"\n")
        except asyncio.IncompleteReadError as exc:
            return exc.partial or None  # a last line without its newline still counts
        except asyncio.LimitOverrunError as exc:
            await self._skip(exc.consumed)
            await self._answer(
                _error(None, -32700, "Parse error", f"a line longer than {LINE_LIMIT} bytes")
            )
            return b""

    async def _skip(self, consumed: int) -> None:
        """Drop the rest of an overlong line."""
        await self.source.readexactly(consumed)
        while True:
            try:
                await self.source.readuntil(b"\n")
                return
            except asyncio.LimitOverrunError as exc:
                await self.source.readexactly(exc.consumed)
            except asyncio.IncompleteReadError:
                return

    async def _answer(self, error: dict[str, Any]) -> None:
        logger.warning("ACP client sent a bad message: %s", error["error"]["data"]["details"])
        line = json.dumps(error, separators=(",", ":")) + "\n"
        try:
            self.writer.write(line.encode("utf-8"))
            await self.writer.drain()
        except (ConnectionError, OSError):
            logger.debug("could not answer a bad message: the client's stdout is closed")

    async def close(self) -> None:
        self._pump.cancel()
        await asyncio.gather(self._pump, return_exceptions=True)
        # The pipe's transport writes out what it still holds, then closes.
        self.writer.close()


def _problem(line: bytes) -> dict[str, Any] | None:
    """The JSON-RPC error answering ``line``, or None when it is a message."""
    try:
        message = json.loads(line)
    except ValueError as exc:
        return _error(None, -32700, "Parse error", f"not JSON: {exc}")
    if _is_message(message):
        return None
    request_id = message.get("id") if isinstance(message, dict) else None
    return _error(request_id, -32600, "Invalid Request", "not a JSON-RPC 2.0 message")
