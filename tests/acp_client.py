"""A real ACP client for tests: ``spawnkit acp`` as a subprocess, driven by the SDK's client side.

:func:`agent_process` starts the command with the test's environment (its isolated
SPAWNKIT_HOME), connects the SDK's :class:`ClientSideConnection` to its stdio, and keeps
every ``session/update`` (as the JSON the client received), every raw incoming message
and every permission request. The agent's stderr goes to a file, for the failure message.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from acp import spawn_agent_process
from acp.client.connection import ClientSideConnection
from acp.connection import StreamEvent
from acp.schema import (
    AllowedOutcome,
    DeniedOutcome,
    PermissionOption,
    RequestPermissionResponse,
    ToolCallUpdate,
)

from .conftest import REPO

# A hang guard only: every wait below ends as soon as its condition holds.
WAIT_S = 120.0


@dataclass
class RecordingClient:
    """The client's side: what the agent sent, and the answer to permission requests."""

    answer: str | None = "allow_once"  # an option id; None cancels the request
    updates: list[dict[str, Any]] = field(default_factory=list)
    sessions: list[str] = field(default_factory=list)
    asked: list[dict[str, Any]] = field(default_factory=list)
    incoming: list[dict[str, Any]] = field(default_factory=list)

    async def session_update(self, session_id: str, update: Any, **_: Any) -> None:
        self.updates.append(update.model_dump(mode="json", by_alias=True, exclude_none=True))
        self.sessions.append(session_id)

    async def request_permission(
        self, session_id: str, tool_call: ToolCallUpdate, options: list[PermissionOption], **_: Any
    ) -> RequestPermissionResponse:
        shown = tool_call.model_dump(by_alias=True, exclude_none=True)
        self.asked.append(
            {"session": session_id, "tool_call": shown, "options": [o.option_id for o in options]}
        )
        if self.answer is None:
            return RequestPermissionResponse(outcome=DeniedOutcome(outcome="cancelled"))
        return RequestPermissionResponse(
            outcome=AllowedOutcome(outcome="selected", option_id=self.answer)
        )

    def observe(self, event: StreamEvent) -> None:
        if event.direction.value == "incoming":
            self.incoming.append(event.message)

    def of_kind(self, kind: str) -> list[dict[str, Any]]:
        return [u for u in self.updates if u["sessionUpdate"] == kind]

    def text(self) -> str:
        return "".join(u["content"]["text"] for u in self.of_kind("agent_message_chunk"))

    async def wait_for(self, what: str, holds: Callable[[], bool]) -> None:
        deadline = time.monotonic() + WAIT_S
        while not holds():
            assert time.monotonic() < deadline, f"no {what} in {WAIT_S} s: {self.updates}"
            await asyncio.sleep(0.05)


@dataclass
class AgentProcess:
    conn: ClientSideConnection
    process: asyncio.subprocess.Process
    client: RecordingClient
    stderr: Path

    def log(self) -> str:
        return self.stderr.read_text(errors="replace")[-4000:]

    async def send_raw(self, line: bytes) -> None:
        """Write bytes to the agent's stdin as they are (a broken client)."""
        assert self.process.stdin is not None
        self.process.stdin.write(line)
        await self.process.stdin.drain()

    async def response_to(self, request_id: object) -> dict[str, Any]:
        found: list[dict[str, Any]] = []

        def answered() -> bool:
            found[:] = [m for m in self.client.incoming if m.get("id") == request_id]
            return bool(found)

        await self.client.wait_for(f"response to {request_id!r}", answered)
        return found[0]


@asynccontextmanager
async def agent_process(
    tmp_path: Path, *args: str, client: RecordingClient | None = None
) -> AsyncIterator[AgentProcess]:
    """``spawnkit acp ARGS`` started, connected, and initialized."""
    client = client or RecordingClient()
    stderr = tmp_path / f"acp-stderr-{time.monotonic_ns()}.log"
    with stderr.open("wb") as err:
        async with spawn_agent_process(
            client,
            sys.executable, "-m", "spawnkit", "acp", *args,
            env=dict(os.environ), cwd=REPO,
            transport_kwargs={"stderr": err.fileno(), "shutdown_timeout": 60.0},
            observers=[client.observe],
        ) as (conn, process):  # fmt: skip
            agent = AgentProcess(conn, process, client, stderr)
            try:
                await asyncio.wait_for(conn.initialize(protocol_version=1), WAIT_S)
                yield agent
            except BaseException:
                sys.stderr.write(f"--- spawnkit acp stderr ---\n{agent.log()}\n")
                raise


def dumped(message: object) -> str:
    return json.dumps(message, ensure_ascii=False)
