"""``spawnkit run``'s approver: a ``[butler.permissions] ask`` question on the terminal.

On a terminal the person who started the run answers each question with y or N (N, the
default, denies). Not on a terminal (a pipe, a cron job, CI) nobody can answer: there is
no approver and such calls are denied, saying why (:data:`spawnkit.permissions.NO_APPROVER`).

The answer is read with the run's own event loop watching stdin (``add_reader``), not a
thread blocked in ``readline``: a run cancelled while it waits (Ctrl-C) stops waiting at
once and leaves no thread behind that would hold the process until Enter is pressed.
Questions are asked one at a time, in the order the runtime asks them.
"""

from __future__ import annotations

import asyncio
import os
import sys
from typing import TextIO

from ..permissions import Approver, PermissionDecision, PermissionRequest
from .console import Style, describe_input, one_line, tool_label

# How much of a tool's input the question shows.
INPUT_CHARS = 600


def terminal_approver(stdin: TextIO | None = None, out: TextIO | None = None) -> Approver | None:
    """An approver asking on the terminal, or None when stdin is not one."""
    stdin = stdin or sys.stdin
    out = out or sys.stderr
    try:
        if not stdin.isatty():
            return None
        fd = stdin.fileno()
    except (OSError, ValueError):  # closed, or no file descriptor (a notebook's)
        return None
    return TerminalApprover(fd, out)


class TerminalApprover:
    """Asks "Allow? [y/N]" on ``out`` and reads the answer from the terminal ``fd``."""

    def __init__(self, fd: int, out: TextIO) -> None:
        self._fd = fd
        self._out = out
        self._style = Style.for_stream(out)
        self._one_at_a_time = asyncio.Lock()

    async def __call__(self, request: PermissionRequest) -> PermissionDecision:
        async with self._one_at_a_time:
            call = request.call
            summary = describe_input(call)
            question = self._style.bold(f"? {tool_label(call)} asks to run")
            print(f"{question}: {one_line(summary, INPUT_CHARS)}", file=self._out, flush=True)
            print("  Allow? [y/N] ", end="", file=self._out, flush=True)
            answer = await self._line()
        if answer.strip().lower() in ("y", "yes"):
            return PermissionDecision(allowed=True, by="terminal")
        return PermissionDecision(
            allowed=False, by="terminal", reason="the person at the terminal denied this tool call"
        )

    async def _line(self) -> str:
        loop = asyncio.get_running_loop()
        line: asyncio.Future[str] = loop.create_future()

        def readable() -> None:
            try:
                data = os.read(self._fd, 4096)  # a terminal in line mode gives one line
            except OSError as exc:
                data = b""
                if not line.done():
                    line.set_exception(exc)
            if not line.done():
                line.set_result(data.decode(errors="replace"))  # b"": end of input, no

        loop.add_reader(self._fd, readable)
        try:
            return await line
        except OSError:
            return ""
        finally:
            loop.remove_reader(self._fd)
