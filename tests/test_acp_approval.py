"""The ACP agent's approver: ``session/request_permission`` to a real client connection.

The agent's side (spawnkit's :class:`StdioWire` and the SDK's agent connection) and the
SDK's client side talk JSON-RPC over two OS pipes, as ``spawnkit acp`` and its client do;
the client answers as a person would. What comes back is the
:class:`~spawnkit.permissions.PermissionDecision` a run gets.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from typing import Any, cast

from acp import Agent
from acp.agent.connection import AgentSideConnection
from acp.client.connection import ClientSideConnection

from spawnkit.permissions import PermissionRequest
from spawnkit.result import ToolCall
from spawnkit.serve.acp.approval import ClientApprover
from spawnkit.serve.acp.wire import ProtocolStdio, StdioWire

from .acp_client import RecordingClient


def _request(name: str = "Write", **tool_input: Any) -> PermissionRequest:
    call = ToolCall.start(
        "toolu_1", name, tool_input or {"file_path": "/w/a.txt", "content": "x"},
        datetime.now(UTC),
    )  # fmt: skip
    return PermissionRequest(session_id="run-1", butler="health", call=call)


@asynccontextmanager
async def connected(client: RecordingClient) -> AsyncIterator[AgentSideConnection]:
    """An agent connection whose peer is ``client``, over two real pipes."""
    loop = asyncio.get_running_loop()
    to_agent_r, to_agent_w = os.pipe()
    to_client_r, to_client_w = os.pipe()
    wire = await StdioWire.open(ProtocolStdio(to_agent_r, to_client_w))
    agent = AgentSideConnection(cast(Agent, object()), wire.writer, wire.reader)
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(
        lambda: asyncio.StreamReaderProtocol(reader), os.fdopen(to_client_r, "rb", 0)
    )
    transport, protocol = await loop.connect_write_pipe(
        asyncio.streams.FlowControlMixin, os.fdopen(to_agent_w, "wb", 0)
    )
    writer = asyncio.StreamWriter(transport, protocol, None, loop)
    peer = ClientSideConnection(client, writer, reader)
    try:
        yield agent
    finally:
        await agent.close()
        await peer.close()
        await wire.close()
        transport.close()


async def test_allow_once_asks_every_time_with_the_call_shown() -> None:
    client = RecordingClient(answer="allow_once")
    async with connected(client) as agent:
        approver = ClientApprover("acp-session", agent.request_permission)
        first = await approver(_request())
        second = await approver(_request())
    assert (first.allowed, first.always, first.by) == (True, False, "acp-client")
    assert second.allowed and len(client.asked) == 2
    asked = client.asked[0]
    assert asked["session"] == "acp-session"
    assert asked["options"] == ["allow_once", "allow_always", "reject_once", "reject_always"]
    shown = asked["tool_call"]
    assert (shown["toolCallId"], shown["kind"], shown["status"]) == ("toolu_1", "edit", "pending")
    assert shown["title"] == "Write /w/a.txt"
    assert shown["rawInput"] == {"file_path": "/w/a.txt", "content": "x"}
    assert shown["locations"] == [{"path": "/w/a.txt"}]


async def test_always_holds_for_the_rest_of_the_session_by_tool() -> None:
    client = RecordingClient(answer="allow_always")
    async with connected(client) as agent:
        approver = ClientApprover("acp-session", agent.request_permission)
        assert (await approver(_request())).always
        client.answer = "reject_always"
        again = await approver(_request())  # not asked: the answer holds
        bash = await approver(_request("Bash", command="rm -rf /"))  # another tool is asked
        bash_again = await approver(_request("Bash", command="ls"))
    assert again.allowed and again.always and len(client.asked) == 2
    assert not bash.allowed and bash.always and "rejected Bash" in (bash.reason or "")
    assert not bash_again.allowed and len(client.asked) == 2


async def test_reject_and_a_cancelled_question_deny() -> None:
    client = RecordingClient(answer="reject_once")
    async with connected(client) as agent:
        approver = ClientApprover("acp-session", agent.request_permission)
        rejected = await approver(_request())
        client.answer = None  # the client cancels the request (its prompt was cancelled)
        cancelled = await approver(_request())
    assert not rejected.allowed and not rejected.always and "this time" in (rejected.reason or "")
    assert not cancelled.allowed and "cancelled" in (cancelled.reason or "")


async def test_a_client_that_is_gone_denies() -> None:
    client = RecordingClient()
    async with connected(client) as agent:
        approver = ClientApprover("acp-session", agent.request_permission)
        await agent.close()
        decision = await asyncio.wait_for(approver(_request()), 30)
    assert not decision.allowed and decision.by == "acp-client"
    assert "could not be asked" in (decision.reason or "")
