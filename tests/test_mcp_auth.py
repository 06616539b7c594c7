"""MCP server authentication: only a run's own secret (or the owner's token) gets in.

The server is the real one on a real socket; the clients are the `mcp` package's own
(streamable HTTP and SSE) or plain HTTP requests where a status code is the point. A
refused request must touch nothing: no state, no ``mcp_calls`` row, no run.
"""

from __future__ import annotations

import asyncio
import json
import os
import pickle
import shutil
import stat
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from spawnkit.config.roster import ButlerConfig
from spawnkit.containment import mcp_access
from spawnkit.containment.mcp_access import GRANTS_PATH, AccessTable, McpAccessError, owner_token
from spawnkit.errors import RuntimeFailure
from spawnkit.notebook.kernel_tools import kernel_tools
from spawnkit.run import Spawner
from spawnkit.serve.butler_server import ButlerServer
from spawnkit.serve.service import ButlerService
from spawnkit.store import SessionStore

from . import mcp_clients
from .fakes import FakeAdapter, Gate

ACCEPT = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
INITIALIZE = {
    "jsonrpc": "2.0", "id": 1, "method": "initialize",
    "params": {"protocolVersion": "2025-06-18", "capabilities": {},
               "clientInfo": {"name": "probe", "version": "0"}},
}  # fmt: skip


def bearer(secret: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {secret}"}


def mcp_call_rows(store: SessionStore) -> list[tuple[Any, ...]]:
    rows = store._db.query("SELECT session_key, session_id, tool FROM mcp_calls")
    return [(r["session_key"], r["session_id"], r["tool"]) for r in rows]


def assert_untouched(store: SessionStore, adapter: FakeAdapter) -> None:
    assert mcp_call_rows(store) == [], "a refused request was recorded"
    assert store.state_list("health", "") == {}, "a refused request changed state"
    assert store.list_sessions() == [], "a refused request started a run"
    assert adapter.specs == []


@asynccontextmanager
async def guarded(
    butler: ButlerConfig, store: SessionStore, **options: Any
) -> AsyncIterator[tuple[ButlerServer, str, FakeAdapter]]:
    """The butler's real server, with a spawner whose runs use a fake runtime."""
    adapter = FakeAdapter()
    server = ButlerServer(butler, store, Spawner(butler, store=store, adapter=adapter), **options)
    async with server.serve(port=0) as address:
        yield server, address.url, adapter


async def try_http(url: str, secret: str | None, tool: str, args: dict[str, Any]) -> list[int]:
    """Call ``tool`` with the real streamable HTTP client; the statuses it saw if refused."""
    statuses: list[int] = []
    try:
        async with mcp_clients.http_client(url, secret, statuses) as client:
            await client.call_tool(tool, args)
    except Exception:  # noqa: BLE001 - the client reports a refusal as an error; statuses tell
        return statuses
    raise AssertionError(f"{tool} went through with secret {secret!r:.12}")


async def try_sse(url: str, secret: str | None) -> int:
    """Open an SSE session with the real client; the HTTP status that refused it."""
    try:
        async with mcp_clients.sse_session(url, secret):
            pass
    except Exception as exc:  # noqa: BLE001 - the status is checked below
        response = getattr(exc, "response", None)
        return int(response.status_code) if response is not None else -1
    raise AssertionError("the SSE session opened")


# -- the table ------------------------------------------------------------------------------


async def test_the_table_grants_checks_and_revokes(monkeypatch) -> None:
    table = AccessTable(max_grants=3)
    first, second = await table.grant("run-1"), await table.grant("run-2")
    assert first != second and len(first) >= 43
    one, two = table.authenticate(f"Bearer {first}"), table.authenticate(f"bearer  {second} ")
    assert one is not None and two is not None
    assert (one.session_key, two.session_key, one.is_owner) == ("run-1", "run-2", False)
    for header in (None, "", "Bearer", f"Basic {first}", f"Bearer {first}x", first, "Bearer x"):
        assert table.authenticate(header) is None, header
    # Only digests are kept: nothing in the table's memory is the secret.
    assert first.encode() not in pickle.dumps(table._grants)
    assert first not in repr(vars(table))

    await table.revoke(first)
    assert table.authenticate(f"Bearer {first}") is None
    assert table.authenticate(f"Bearer {second}") == two

    clock = [1000.0]
    monkeypatch.setattr(mcp_access.time, "monotonic", lambda: clock[0])
    short = await table.grant("run-3", ttl_s=5)
    assert table.authenticate(f"Bearer {short}") is not None
    clock[0] += 6
    assert table.authenticate(f"Bearer {short}") is None, "an expired grant still works"
    assert len(table) == 1

    await table.grant("a")
    await table.grant("b")
    with pytest.raises(McpAccessError, match="3 live secrets"):
        await table.grant("c")
    with pytest.raises(ValueError, match="session key"):
        await table.grant("")


async def test_each_run_gets_its_own_secret_withdrawn_however_it_ends(make_butler, store) -> None:
    butler = make_butler(extra="[butler.runtime]\nmax_concurrent_sessions = 2\ntimeout_s = 0.5\n")
    adapter = FakeAdapter()
    adapter.gate = Gate(open_=False)
    spawner = Spawner(butler, store=store, adapter=adapter)
    table = spawner.mcp_access
    assert isinstance(table, AccessTable)
    first = asyncio.create_task(spawner.trigger("one"))
    second = asyncio.create_task(spawner.trigger("two"))
    async with asyncio.timeout(10):
        while len(adapter.specs) < 2:
            await asyncio.sleep(0.01)
    # In the order of the prompts: the two runs may start in either order.
    servers = [spec.mcp_server for spec in sorted(adapter.specs, key=lambda s: s.prompt != "one")]
    assert servers[0].secret != servers[1].secret and len(table) == 2
    for spec in adapter.specs:
        caller = table.authenticate(spec.mcp_server.headers["Authorization"])
        assert caller is not None and f"session_id={caller.session_key}" in spec.mcp_server.url
        assert spec.mcp_server.secret not in repr(spec)
    second.cancel()
    with pytest.raises(asyncio.CancelledError):
        await second
    assert table.authenticate(servers[1].headers["Authorization"]) is None, "cancelled"
    assert (await first).status == "timeout", "timed out"
    assert len(table) == 0
    adapter.gate.open()
    adapter.fail_with = RuntimeFailure("boom")
    assert (await spawner.trigger("three")).status == "failed"
    adapter.fail_with = None
    assert (await spawner.trigger("four")).success
    assert len(table) == 0 and len({s.mcp_server.secret for s in adapter.specs}) == 4


# -- refusals touch nothing -----------------------------------------------------------------


async def test_no_wrong_finished_or_foreign_secret_gets_in(make_butler, store) -> None:
    butler = make_butler()
    other = ButlerServer(make_butler("other"), store)
    foreign = await other.access.grant("run-a")  # a live run of another butler
    async with guarded(butler, store) as (server, url, adapter):
        await server.access.grant("run-a")  # the live run the URLs name
        finished = await server.access.grant("run-a")
        await server.access.revoke(finished)
        attempts = {"none": None, "wrong": "x" * 43, "finished": finished, "foreign": foreign}
        for name, secret in attempts.items():
            for tool, args in (
                ("state_set", {"key": "k", "value": name}),
                ("sessions_list", {}),
                ("trigger", {"prompt": "run something"}),
            ):
                statuses = await try_http(f"{url}/mcp?session_id=run-a", secret, tool, args)
                assert set(statuses) == {401}, (name, tool, statuses)
            assert await try_sse(f"{url}/sse?session_id=run-a", secret) == 401, name
        async with httpx.AsyncClient() as client:
            refused = await client.post(f"{url}/mcp", json=INITIALIZE, headers=ACCEPT)
        assert refused.status_code == 401
        assert refused.headers["www-authenticate"].startswith("Bearer")
    assert_untouched(store, adapter)


async def test_a_secret_speaks_only_for_its_own_run(make_butler, store) -> None:
    """The URL's session id must be the secret's; calls are recorded against the secret's."""
    for sid, key in (("s-a", "run-a"), ("s-b", "run-b")):
        store.create_session(
            sid, butler="health", runtime="claude-code", model=None, prompt="p", context=None,
            trigger_source="external", runtime_session_id=key,
        )  # fmt: skip
    async with guarded(make_butler(), store) as (server, url, _):
        await server.access.grant("run-a")
        secret_b = await server.access.grant("run-b")
        for path in ("mcp", "sse"):
            async with httpx.AsyncClient() as client:
                spoof = await client.post(
                    f"{url}/{path}?session_id=run-a", json=INITIALIZE,
                    headers={**ACCEPT, **bearer(secret_b)},
                )  # fmt: skip
            assert spoof.status_code == 403 and "not this caller" in spoof.text
        statuses = await try_http(
            f"{url}/mcp?session_id=run-a", secret_b, "state_set", {"key": "k", "value": 1}
        )
        assert set(statuses) == {403}
        assert await try_sse(f"{url}/sse?session_id=run-a", secret_b) == 403
        assert mcp_call_rows(store) == [] and store.state_list("health", "") == {}

        # The same secret with its own session id, or none, works and records as run-b.
        for target in (f"{url}/mcp?session_id=run-b", f"{url}/mcp"):
            async with mcp_clients.http_client(target, secret_b) as client:
                assert not (await client.call_tool("state_set", {"key": "k", "value": 2})).is_error
        async with mcp_clients.sse_session(f"{url}/sse", secret_b) as session:
            assert not (await session.call_tool("state_get", {"key": "k"})).is_error
    assert mcp_call_rows(store) == [
        ("run-b", "s-b", "state_set"), ("run-b", "s-b", "state_set"), ("run-b", "s-b", "state_get")
    ]  # fmt: skip


async def test_transport_sessions_belong_to_their_opener(make_butler, store) -> None:
    async with guarded(make_butler(), store) as (server, url, _):
        secret_a = await server.access.grant("a")
        secret_b = await server.access.grant("b")
        async with httpx.AsyncClient(timeout=10) as client:
            # Streamable HTTP: a session opened by run a cannot be used by run b.
            opened = await client.post(f"{url}/mcp", json=INITIALIZE,
                                       headers={**ACCEPT, **bearer(secret_a)})  # fmt: skip
            assert opened.status_code == 200
            session = {"mcp-session-id": opened.headers["mcp-session-id"]}
            listing = {"jsonrpc": "2.0", "id": 2, "method": "tools/list"}
            hijack = await client.post(
                f"{url}/mcp", json=listing, headers={**ACCEPT, **bearer(secret_b), **session}
            )
            assert hijack.status_code == 403
            made_up = await client.post(
                f"{url}/mcp", json=listing,
                headers={**ACCEPT, **bearer(secret_a), "mcp-session-id": "f" * 32},
            )  # fmt: skip
            assert made_up.status_code == 404

            # SSE: the /messages/ endpoint of run a's stream refuses run b and no secret.
            async with client.stream("GET", f"{url}/sse", headers=bearer(secret_a)) as stream:
                # Keep the iterator: a collected one closes the stream.
                chunks = stream.aiter_text()
                first = await anext(chunks)
                endpoint = first.split("data: ", 1)[1].split()[0]
                post = f"{url}{endpoint}"
                as_b = await client.post(
                    post, json=INITIALIZE, headers={**ACCEPT, **bearer(secret_b)}
                )
                bare = await client.post(post, json=INITIALIZE, headers=ACCEPT)
                # The SDK mounts /messages/: a path below it reaches the same endpoint.
                below = post.replace("/messages/?", "/messages/x/y?")
                assert below != post
                as_b_below = await client.post(
                    below, json=INITIALIZE, headers={**ACCEPT, **bearer(secret_b)}
                )
                assert as_b_below.status_code == 403
                as_a = await client.post(
                    post, json=INITIALIZE, headers={**ACCEPT, **bearer(secret_a)}
                )
        assert (as_b.status_code, bare.status_code, as_a.status_code) == (403, 401, 202)
        await server.access.revoke(secret_a)
        assert server.access.bound_to(session["mcp-session-id"]) is None


async def test_host_and_origin_checks_hold_even_with_a_secret(make_butler, store) -> None:
    async with guarded(make_butler(), store) as (server, url, _):
        secret = await server.access.grant("k")
        port = url.rsplit(":", 1)[1]
        cases = {
            (f"evil.example:{port}", None): 421,
            (f"127.0.0.1:{port}", "http://evil.example"): 403,
            (f"127.0.0.1:{port}", f"http://localhost:{port}"): 200,
            (f"localhost:{port}", None): 200,
        }
        async with httpx.AsyncClient() as client:
            for (host, origin), expected in cases.items():
                headers = {**ACCEPT, **bearer(secret), "Host": host}
                if origin:
                    headers["Origin"] = origin
                response = await client.post(f"{url}/mcp", json=INITIALIZE, headers=headers)
                assert response.status_code == expected, (host, origin, response.text)


# -- the owner token ------------------------------------------------------------------------


async def test_the_owner_token_calls_tools_and_grants_run_secrets(make_butler, store) -> None:
    async with guarded(make_butler(), store) as (server, url, _):
        token = mcp_access.new_secret()
        server.access.allow_owner(token)
        run_secret = await server.access.grant("some-run")
        async with mcp_clients.http_client(f"{url}/mcp", token) as client:
            assert not (await client.call_tool("state_set", {"key": "o", "value": 1})).is_error
        spoofed = await try_http(f"{url}/mcp?session_id=some-run", token, "state_get", {})
        assert set(spoofed) == {403}, "the owner token does not speak for a run"
        async with httpx.AsyncClient() as client:
            by_run = await client.post(f"{url}{GRANTS_PATH}", json={"session_key": "x"},
                                       headers=bearer(run_secret))  # fmt: skip
            assert by_run.status_code == 403
            minted = await client.post(
                f"{url}{GRANTS_PATH}", json={"session_key": "minted", "ttl_s": 60},
                headers=bearer(token),
            )  # fmt: skip
            assert minted.status_code == 201
            secret = minted.json()["secret"]
            async with mcp_clients.http_client(f"{url}/mcp?session_id=minted", secret) as c:
                assert not (await c.call_tool("state_get", {"key": "o"})).is_error
            gone = await client.request(
                "DELETE", f"{url}{GRANTS_PATH}", json={"secret": secret}, headers=bearer(token)
            )
            assert gone.status_code == 204
        assert set(await try_http(f"{url}/mcp", secret, "state_get", {})) == {401}
    assert mcp_call_rows(store) == [(None, None, "state_set"), ("minted", None, "state_get")]


async def test_serve_writes_a_private_token_file_and_reuses_it(
    make_butler, store, isolated_home: Path
) -> None:
    butler = make_butler()
    async with ButlerService(butler, store=store, mcp_port=0, owner_token=True) as service:
        path = service.token_file
        assert path is not None and path.parent == isolated_home / "mcp"
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
        token = path.read_text().strip()
        async with mcp_clients.http_client(f"{service.mcp_url}/mcp", token) as client:
            assert not (await client.call_tool("state_set", {"key": "t", "value": 1})).is_error
        assert set(await try_http(f"{service.mcp_url}/mcp", None, "state_get", {})) == {401}
    assert owner_token(path, create=True) == token, "a second start keeps the token"
    path.chmod(0o644)
    with pytest.raises(McpAccessError, match="readable by others"):
        owner_token(path, create=True)
    path.unlink()
    with pytest.raises(McpAccessError, match="is the butler served"):
        owner_token(path, create=False)


async def test_external_mcp_runs_get_their_own_secrets_from_the_served_butler(
    make_butler, store
) -> None:
    butler = make_butler()
    async with ButlerService(butler, store=store, mcp_port=butler.port, owner_token=True) as served:
        adapter = FakeAdapter()
        adapter.gate = Gate(open_=False)
        async with ButlerService(butler, store=store, external_mcp=True, adapter=adapter) as runner:
            run = asyncio.create_task(runner.trigger("hello"))
            async with asyncio.timeout(10):
                while not adapter.specs:
                    await asyncio.sleep(0.01)
            spec = adapter.specs[0].mcp_server
            assert spec.secret and repr(spec).count(spec.secret) == 0
            assert f":{butler.port}/mcp?session_id=" in spec.url
            async with mcp_clients.http_client(spec.url, spec.secret) as client:
                assert not (await client.call_tool("state_set", {"key": "e", "value": 1})).is_error
            adapter.gate.open()
            result = await run
        statuses = await try_http(spec.url, spec.secret, "state_get", {"key": "e"})
        assert set(statuses) == {401}, "a finished run's secret still works"
        assert len(served.access) == 1, "only the owner token is left"
    (row,) = mcp_call_rows(store)
    assert row == (result.session_id, result.session_id, "state_set")


async def test_external_mcp_without_a_served_butler_is_a_clear_error(make_butler, store) -> None:
    with pytest.raises(McpAccessError, match=r"no MCP token file .*health-\d+\.token"):
        async with ButlerService(make_butler(), store=store, external_mcp=True):
            pass


# -- another local user ---------------------------------------------------------------------

INTRUDER = r"""
import json, os, sys, urllib.error, urllib.request
url, secret, tool, args = sys.argv[1], sys.argv[2], sys.argv[3], json.loads(sys.argv[4])
def send(path, body=None, session=None):
    headers = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream"}
    if secret:
        headers["Authorization"] = "Bearer " + secret
    if session:
        headers["mcp-session-id"] = session
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url + path, data, headers, method="POST" if data else "GET")
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            text = response.read(65536).decode() if data else response.readline().decode()
            return response.status, response.headers.get("mcp-session-id"), text
    except urllib.error.HTTPError as exc:
        return exc.code, None, exc.read().decode()
out = {"uid": os.getuid(), "sse": send("/sse")[0]}
init = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
    "protocolVersion": "2025-06-18", "capabilities": {},
    "clientInfo": {"name": "intruder", "version": "0"}}}
out["initialize"], session, _ = send("/mcp", init)
call = {"jsonrpc": "2.0", "id": 2, "method": "tools/call",
        "params": {"name": tool, "arguments": args}}
out["direct_call"] = send("/mcp", call)[0]
if out["initialize"] == 200:
    send("/mcp", {"jsonrpc": "2.0", "method": "notifications/initialized"}, session)
    out["call"], _, text = send("/mcp", call, session)
    out["result"] = [json.loads(line[5:]) for line in text.splitlines() if line.startswith("data:")]
print(json.dumps(out))
"""


async def as_nobody(url: str, secret: str, tool: str, args: dict[str, Any]) -> dict[str, Any]:
    proc = await asyncio.create_subprocess_exec(
        "setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups",
        "/usr/bin/python3", "-c", INTRUDER, url, secret, tool, json.dumps(args),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        env={"PATH": "/usr/bin:/bin", "HOME": "/nonexistent"}, cwd="/",
    )  # fmt: skip
    async with asyncio.timeout(60):
        out, err = await proc.communicate()
    assert proc.returncode == 0, err.decode()
    return dict(json.loads(out))


@pytest.mark.skipif(
    os.geteuid() != 0 or not shutil.which("setpriv") or not Path("/usr/bin/python3").exists(),
    reason="needs root (to act as the user nobody), setpriv and /usr/bin/python3",
)
async def test_another_local_user_cannot_drive_the_butler(make_butler, store) -> None:
    """As user nobody: state_set, sessions_list, kernel tools and trigger all get 401."""
    namespace = {"salary_table": "CONFIDENTIAL 123456"}
    butler = make_butler()
    extensions = [kernel_tools(lambda: namespace)]
    async with guarded(butler, store, extensions=extensions) as (server, url, adapter):
        live = await server.access.grant("run-a")
        finished = await server.access.grant("run-b")
        await server.access.revoke(finished)
        attacks = [
            ("state_set", {"key": "owned", "value": "by nobody"}),
            ("sessions_list", {}),
            ("kernel_variables", {}),
            ("kernel_variable", {"name": "salary_table"}),
            ("trigger", {"prompt": "id > /tmp/owned"}),
        ]
        for secret in ("", "guess" * 9, finished):
            for tool, args in attacks:
                seen = await as_nobody(url, secret, tool, args)
                assert seen["uid"] != 0
                assert (seen["sse"], seen["initialize"], seen["direct_call"]) == (401, 401, 401)
                assert "result" not in seen, (tool, seen)
        assert_untouched(store, adapter)

        # The control: the same user with the run's secret does get through, so the
        # 401s above are the secret's doing, not the network's or the script's.
        seen = await as_nobody(url, live, "kernel_variable", {"name": "salary_table"})
        assert seen["call"] == 200 and "CONFIDENTIAL" in json.dumps(seen["result"])
        seen = await as_nobody(url, live, "trigger", {"prompt": "hello"})
        assert seen["call"] == 200
    assert [r.trigger_source for r in store.list_sessions()] == ["trigger"]
