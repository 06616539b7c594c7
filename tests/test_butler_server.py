"""The butler's MCP server, driven by a real MCP client over streamable HTTP and SSE."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from typing import Any

from mcp import Client

from spawnkit.config.roster import ButlerConfig
from spawnkit.run import Spawner
from spawnkit.serve.butler_server import ButlerServer
from spawnkit.store import SessionStore

from . import mcp_clients
from .fakes import FakeAdapter, Gate

TOOLS = ["state_get", "state_set", "state_list", "schedule_list", "sessions_list", "trigger"]


@asynccontextmanager
async def http_client(
    butler: ButlerConfig, store: SessionStore, key: str, spawner: Spawner | None = None
) -> AsyncIterator[Client]:
    server = ButlerServer(butler, store, spawner)
    secret = await server.access.grant(key)
    async with (
        server.serve(port=0) as address,
        mcp_clients.http_client(f"{address.url}/mcp?session_id={key}", secret) as client,
    ):
        yield client


def payload(result: Any) -> Any:
    assert not result.is_error, result.content
    return result.structured_content


async def test_core_tools_over_http_are_recorded_per_session(make_butler, store) -> None:
    butler = make_butler()
    store.create_session(
        "spawnkit-id", butler="health", runtime="claude-code", model=None, prompt="p",
        context=None, trigger_source="external", runtime_session_id="runtime-id",
    )  # fmt: skip
    async with http_client(butler, store, "runtime-id") as client:
        assert [t.name for t in (await client.list_tools()).tools] == TOOLS
        assert payload(await client.call_tool("state_get", {"key": "w"})) == {
            "key": "w", "found": False, "value": None,
        }  # fmt: skip
        await client.call_tool("state_set", {"key": "w", "value": [72.4, {"unit": "kg"}]})
        await client.call_tool("state_set", {"key": "x", "value": None})
        assert payload(await client.call_tool("state_get", {"key": "w"}))["value"] == [
            72.4, {"unit": "kg"},
        ]  # fmt: skip
        assert payload(await client.call_tool("state_get", {"key": "x"}))["found"] is True
        assert payload(await client.call_tool("state_list", {"prefix": "w"})) == {
            "w": [72.4, {"unit": "kg"}],
        }
        bad = await client.call_tool("state_get", {})
        assert bad.is_error

    calls = store.mcp_calls("spawnkit-id")
    assert [c["tool"] for c in calls] == [
        "state_get", "state_set", "state_set", "state_get", "state_get", "state_list", "state_get",
    ]  # fmt: skip
    assert {c["session_key"] for c in calls} == {"runtime-id"}
    assert calls[1]["arguments"] == {"key": "w", "value": [72.4, {"unit": "kg"}]}
    assert [c["is_error"] for c in calls] == [False] * 6 + [True]
    assert store.state_get("health", "w") == [72.4, {"unit": "kg"}]
    assert store.state_get("other", "w") is None


async def test_sse_calls_are_tied_to_their_own_connection(make_butler, store) -> None:
    butler = make_butler()
    server = ButlerServer(butler, store)
    async with server.serve(port=0) as address:

        async def call(key: str, value: int) -> None:
            secret = await server.access.grant(key)
            url = f"{address.url}/sse?session_id={key}"
            async with mcp_clients.sse_session(url, secret) as session:
                result = await session.call_tool("state_set", {"key": key, "value": value})
                assert not result.is_error

        await asyncio.gather(call("first", 1), call("second", 2), call("third", 3))
    rows = store._db.query("SELECT session_key, arguments FROM mcp_calls")
    assert sorted((r["session_key"], r["arguments"]) for r in rows) == [
        ("first", '{"key": "first", "value": 1}'),
        ("second", '{"key": "second", "value": 2}'),
        ("third", '{"key": "third", "value": 3}'),
    ]


async def test_schedule_and_sessions_tools(make_butler, store) -> None:
    butler = make_butler(
        extra='[[butler.schedule]]\nname = "digest"\ncron = "0 8 * * *"\nprompt = "Digest."\n'
    )
    store.create_session(
        "s1", butler="health", runtime="claude-code", model=None, prompt="mine",
        context=None, trigger_source="external",
    )  # fmt: skip
    store.create_session(
        "s2", butler="someone-else", runtime="claude-code", model=None, prompt="theirs",
        context=None, trigger_source="external",
    )  # fmt: skip
    async with http_client(butler, store, "k") as client:
        schedules = payload(await client.call_tool("schedule_list", {}))["result"]
        sessions = payload(await client.call_tool("sessions_list", {"limit": 5}))["result"]
    (entry,) = schedules
    assert (entry["name"], entry["cron"], entry["prompt"]) == ("digest", "0 8 * * *", "Digest.")
    next_run = datetime.fromisoformat(entry["next_run"])
    assert next_run > datetime.now(UTC) and (next_run.hour, next_run.minute) == (8, 0)
    assert [s["id"] for s in sessions] == ["s1"]
    assert sessions[0]["status"] == "queued"


async def test_trigger_tool_runs_the_same_butler(make_butler, store) -> None:
    butler = make_butler()
    adapter = FakeAdapter()
    spawner = Spawner(butler, store=store, adapter=adapter)
    async with http_client(butler, store, "k", spawner) as client:
        result = payload(await client.call_tool("trigger", {"prompt": "nested", "context": "c"}))
    assert result["success"] is True
    assert result["output"] == "answer to: c\n\nnested"
    (record,) = store.list_sessions()
    assert (record.trigger_source, record.prompt, record.context) == ("trigger", "nested", "c")


async def test_trigger_tool_is_rejected_when_the_butler_is_busy(make_butler, store) -> None:
    butler = make_butler()  # one slot
    adapter = FakeAdapter()
    adapter.gate = Gate(open_=False)
    spawner = Spawner(butler, store=store, adapter=adapter)
    running = asyncio.create_task(spawner.trigger("outer"))
    async with asyncio.timeout(5):
        while not adapter.specs:
            await asyncio.sleep(0.01)
    async with http_client(butler, store, "k", spawner) as client:
        result = payload(await client.call_tool("trigger", {"prompt": "inner"}))
    assert result["success"] is False and "deadlock" in result["error"]
    adapter.gate.open()
    assert (await running).success
    assert store.count_sessions() == 1


async def test_trigger_tool_without_a_spawner(make_butler, store) -> None:
    async with http_client(make_butler(), store, "k") as client:
        result = payload(await client.call_tool("trigger", {"prompt": "x"}))
    assert result == {"success": False, "error": "this server has no spawner to trigger runs"}


async def test_trigger_tool_called_in_process_without_a_request(make_butler, store) -> None:
    """``MCPServer.call_tool`` (how MCP servers are tested in process) gives the tool a
    Context without a request: the run goes on, with no progress to send anywhere."""
    butler = make_butler()
    spawner = Spawner(butler, store=store, adapter=FakeAdapter())
    server = ButlerServer(butler, store, spawner)
    result = await server.mcp.call_tool("trigger", {"prompt": "in process"})
    assert not result.is_error, result.content
    assert result.structured_content["success"] is True
    assert result.structured_content["output"] == "answer to: in process"
    (record,) = store.list_sessions()
    assert (record.trigger_source, record.status) == ("trigger", "success")


async def test_trigger_tool_through_an_in_memory_client_sends_progress(make_butler, store) -> None:
    """The MCP SDK's in-memory ``Client(server)``: a request to answer, so progress goes out."""
    butler = make_butler()
    spawner = Spawner(butler, store=store, adapter=FakeAdapter())
    server = ButlerServer(butler, store, spawner)
    seen: list[str] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        seen.append(json.loads(message or "null")["event"])

    async with Client(server.mcp) as client:
        result = await client.call_tool("trigger", {"prompt": "hi"}, progress_callback=on_progress)
    assert payload(result)["success"] is True
    assert "tool_call" in seen


async def test_trigger_tool_refuses_a_nul_byte_in_one_line(make_butler, store) -> None:
    butler = make_butler()
    adapter = FakeAdapter()
    server = ButlerServer(butler, store, Spawner(butler, store=store, adapter=adapter))
    result = await server.mcp.call_tool("trigger", {"prompt": "a\x00b"})
    assert result.structured_content["success"] is False
    assert "NUL byte" in result.structured_content["error"]
    assert "\n" not in result.structured_content["error"]
    assert adapter.specs == [] and store.count_sessions() == 0
