"""The model relay serves only its own run: another local user gets nothing from it.

A run of Codex or Gemini with a token or dollar limit talks to the model API through a
relay (:mod:`spawnkit.containment.relay`). In a run's own network the relay is a unix socket in the
run's 0700 door folder, which no other user can connect to. On the host's network it
listens on 127.0.0.1, where any local user can connect to it, so the base URL its CLI is
given carries a per-run secret: a request without it must be refused before it is
forwarded (the upstream replay server sees nothing) or metered (the run does not stop on
a budget someone else spent). The intruder is the real user ``nobody`` (``setpriv``), the
CLIs are the real ones against the replay server, and the relay's address is found as an
intruder would: its listening socket. The secret is on no command line, and the run's
redactor hides it where the run's own agent prints its URL.
"""

from __future__ import annotations

import asyncio
import errno
import json
import os
import re
import secrets
import shutil
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil
import pytest

from spawnkit.budgets.metering import Meter
from spawnkit.containment.doors import DOORS_DIR
from spawnkit.containment.relay import open_relay
from spawnkit.notebook.hub import with_runtime
from spawnkit.replay import ReplayServer, Scenario
from spawnkit.result import Usage
from spawnkit.runtimes.claude_code import ClaudeCodeAdapter
from spawnkit.serve.service import ButlerService

from .conftest import REPO, processes_with_env, workspaces_of

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(
        os.geteuid() != 0 or not shutil.which("setpriv") or not Path("/usr/bin/python3").exists(),
        reason="needs root (to act as the user nobody), setpriv and /usr/bin/python3",
    ),
]
needs_node_clis = pytest.mark.skipif(
    not (REPO / "node_modules" / ".bin" / "codex").exists(),
    reason="the node CLIs are not installed (npm ci)",
)

# 700 tokens a model call; a limit of 1,000 lets the run's one call through but not two.
ONE_TURN = """
[[turn]]
text = "Done."
usage = { input_tokens = 600, output_tokens = 100 }
"""
LIMITS = "[butler.limits]\nmax_tokens = 1000\n"
HOST_NETWORK = '[butler.sandbox]\nnetwork = "host"\n'
MODELS = {"codex": "replay-model", "gemini": "gemini-2.5-flash"}
# A model call of each API, as the intruder sends it (what the run's CLI would send).
CALLS = {
    "codex": ("/v1/responses", {"model": "replay-model", "input": "hi", "stream": False}),
    "gemini": (
        "/v1beta/models/gemini-2.5-flash:generateContent",
        {"contents": [{"role": "user", "parts": [{"text": "hi"}]}]},
    ),
}
MODEL_PATHS = re.compile(r"/v1/responses|/v1/messages|/v1beta/models/[^/]+:\w*[gG]enerateContent")

INTRUDER = r"""
import json, os, sys, urllib.error, urllib.request
statuses = {}
for url in json.loads(sys.argv[2]):
    request = urllib.request.Request(
        url, data=sys.argv[1].encode(), method="POST",
        headers={"content-type": "application/json", "x-goog-api-key": "k",
                 "authorization": "Bearer k", "x-api-key": "k"},
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            statuses[url] = response.status
    except urllib.error.HTTPError as exc:
        statuses[url] = exc.code
print(json.dumps({"uid": os.getuid(), "statuses": statuses}))
"""


async def as_nobody(body: dict[str, Any], urls: list[str]) -> dict[str, int]:
    """POST ``body`` to each URL as the user nobody; the status each answered."""
    proc = await asyncio.create_subprocess_exec(
        "setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups",
        "/usr/bin/python3", "-c", INTRUDER, json.dumps(body), json.dumps(urls),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        env={"PATH": "/usr/bin:/bin", "HOME": "/nonexistent"}, cwd="/",
    )  # fmt: skip
    async with asyncio.timeout(60):
        out, err = await proc.communicate()
    assert proc.returncode == 0, err.decode()
    seen = json.loads(out)
    assert seen["uid"] != 0
    return dict(seen["statuses"])


def intruder_urls(origin: str, path: str, secret: str) -> list[str]:
    """The relay's address with the secret missing, wrong by a letter, or misplaced."""
    wrong = ("A" if secret[0] != "A" else "B") + secret[1:]
    return [
        origin + path,
        f"{origin}/{wrong}{path}",
        f"{origin}/{secret[:-1]}{path}",
        f"{origin}/{secret}x{path}",
        f"{origin}/v1/{secret}{path}",
        f"{origin}//{secret}{path}",
    ]


def listening() -> set[tuple[str, int]]:
    """This process's listening TCP sockets (the relay is served on the test's loop)."""
    return {
        (c.laddr.ip, c.laddr.port)
        for c in psutil.Process().net_connections(kind="inet")
        if c.status == psutil.CONN_LISTEN
    }


def secret_of(port: int, session_id: str) -> str:
    """The relay secret the run's CLI was given: in its environment or its config file."""
    pattern = re.compile(rf"127\.0\.0\.1:{port}/([A-Za-z0-9_-]+)".encode())
    places = [Path(f"/proc/{pid}/environ") for pid in processes_with_env(
        "SPAWNKIT_SESSION_ID", session_id)]  # fmt: skip
    places += [f for w in workspaces_of("health") for f in w.rglob("*.toml")]
    for place in places:
        found = pattern.search(place.read_bytes())
        if found:
            return found.group(1).decode()
    raise AssertionError(f"no CLI of {session_id} was given the relay on port {port}")


def on_command_lines(text: str) -> list[int]:
    """Pids whose command line holds ``text``."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and text.encode() in (entry / "cmdline").read_bytes():
                found.append(int(entry.name))
        except OSError:
            continue
    return found


class HoldFirstModelCall:
    """The replay app, holding the first model call until released (the run is then live)."""

    def __init__(self, app: Callable[..., Any]) -> None:
        self.app = app
        self.held = asyncio.Event()
        self.release = asyncio.Event()

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and MODEL_PATHS.search(scope["path"]) and not self.held.is_set():
            self.held.set()
            await self.release.wait()
        await self.app(scope, receive, send)


UNIX_INTRUDER = r"""
import json, os, socket, sys
refused = {}
for path in json.loads(sys.argv[1]):
    try:
        # A socket's path may be longer than AF_UNIX takes: connect from its folder.
        os.chdir(os.path.dirname(path))
        with socket.socket(socket.AF_UNIX) as sock:
            sock.connect(os.path.basename(path))
        refused[path] = None
    except OSError as exc:
        refused[path] = exc.errno
print(json.dumps({"uid": os.getuid(), "refused": refused}))
"""


async def unix_connect_as_nobody(paths: list[str]) -> dict[str, int | None]:
    """Connect to each unix socket as the user nobody: the errno each failed with."""
    proc = await asyncio.create_subprocess_exec(
        "setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups",
        "/usr/bin/python3", "-c", UNIX_INTRUDER, json.dumps(paths),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        env={"PATH": "/usr/bin:/bin", "HOME": "/nonexistent"}, cwd="/",
    )  # fmt: skip
    async with asyncio.timeout(60):
        out, err = await proc.communicate()
    assert proc.returncode == 0, err.decode()
    seen = json.loads(out)
    assert seen["uid"] != 0
    return dict(seen["refused"])


@needs_node_clis
@pytest.mark.parametrize("runtime", ["codex", "gemini"])
async def test_a_sandboxed_runs_relay_is_a_door_only_the_run_reaches(
    make_butler, store, runtime
) -> None:
    """In a network of its own, the run's relay has no TCP port at all: it serves on a
    unix socket in the run's 0700 door folder, which another user cannot even connect to."""
    server = ReplayServer(Scenario.from_dict(tomllib.loads(ONE_TURN), source="<test>"))
    hold = HoldFirstModelCall(server.app)
    server.app = hold  # type: ignore[assignment] - an ASGI app like the one it wraps
    butler = with_runtime(make_butler(extra=LIMITS), runtime)
    async with ButlerService(butler, store=store, replay=server, model=MODELS[runtime]) as svc:
        before = listening()
        run = asyncio.create_task(svc.trigger("hello"))
        try:
            async with asyncio.timeout(120):
                await hold.held.wait()
            assert listening() - before == set(), "a sandboxed run's relay listens on TCP"
            (workspace,) = workspaces_of("health")
            sockets = [str(p) for p in (workspace / DOORS_DIR).iterdir() if p.is_socket()]
            assert sockets, "the run has no doors"
            refused = await unix_connect_as_nobody(sockets)
            assert refused == dict.fromkeys(sockets, errno.EACCES), refused
        finally:
            hold.release.set()
        result = await run
    assert result.success and result.status == "success", result.error
    assert result.budget is not None and result.budget.stopped_by is None
    assert len([r for r in server.requests if MODEL_PATHS.search(r.path)]) == 1


@needs_node_clis
@pytest.mark.parametrize("runtime", ["codex", "gemini"])
async def test_another_user_cannot_spend_a_runs_budget_through_its_relay(
    make_butler, store, runtime
) -> None:
    """On the host's network the relay listens on 127.0.0.1 TCP: its secret keeps it the run's."""
    server = ReplayServer(Scenario.from_dict(tomllib.loads(ONE_TURN), source="<test>"))
    hold = HoldFirstModelCall(server.app)
    server.app = hold  # type: ignore[assignment] - an ASGI app like the one it wraps
    butler = with_runtime(make_butler(extra=LIMITS + HOST_NETWORK), runtime)
    async with ButlerService(butler, store=store, replay=server, model=MODELS[runtime]) as svc:
        before = listening()
        run = asyncio.create_task(svc.trigger("hello"))
        try:
            async with asyncio.timeout(120):
                await hold.held.wait()
            (relay,) = listening() - before
            assert relay[0] == "127.0.0.1", f"the relay listens on {relay[0]}"
            seen_upstream = len(server.requests)
            origin, (path, body) = f"http://127.0.0.1:{relay[1]}", CALLS[runtime]
            guessed = [origin + path, f"{origin}/{secrets.token_urlsafe(32)}{path}"]
            statuses = await as_nobody(body, guessed)
            assert statuses == dict.fromkeys(guessed, 401), statuses
            # Knowing the secret (as the test does) but putting it elsewhere does not help.
            (session,) = [s.id for s in store.list_sessions()]
            secret = secret_of(relay[1], session)
            assert on_command_lines(secret) == [], "the relay secret is on a command line"
            misplaced = intruder_urls(origin, path, secret)
            assert await as_nobody(body, misplaced) == dict.fromkeys(misplaced, 401)
            assert len(server.requests) == seen_upstream, "a refused request was forwarded"
        finally:
            hold.release.set()
        result = await run
    # Not stopped on a budget the intruder spent: only the run's own call was metered.
    assert result.success and result.status == "success", result.error
    assert result.output == "Done."
    assert result.budget is not None and result.budget.stopped_by is None
    assert 700 <= result.budget.tokens < 1000, result.budget
    assert len([r for r in server.requests if MODEL_PATHS.search(r.path)]) == 1


async def test_the_relay_forwards_and_meters_only_requests_with_its_secret() -> None:
    """The control: the same user with the secret gets through (and is metered)."""
    server = ReplayServer(Scenario.from_dict(tomllib.loads(ONE_TURN), source="<test>"))
    totals: list[Usage] = []
    path, body = CALLS["codex"]
    async with server.serve() as upstream, open_relay(upstream, sink=Meter(totals.append)) as relay:
        assert relay.address.startswith("http://127.0.0.1:") and relay.secret not in repr(relay)
        urls = intruder_urls(relay.address, path, relay.secret)
        assert await as_nobody(body, urls) == dict.fromkeys(urls, 401)
        assert server.requests == [] and totals == []
        assert await as_nobody(body, [relay.url + path]) == {relay.url + path: 200}
    assert [r.path for r in server.requests] == [path], "forwarded without the secret"
    assert totals == [Usage(input_tokens=600, output_tokens=100)]


async def test_claude_code_keeps_the_secret_path_of_its_base_url() -> None:
    """Every request Claude Code sends goes under ANTHROPIC_BASE_URL's path (so a relay
    for it needs nothing else); Codex and Gemini are shown by the run above."""
    server = ReplayServer(Scenario.from_dict(tomllib.loads(ONE_TURN), source="<test>"))
    totals: list[Usage] = []
    async with server.serve() as upstream, open_relay(upstream, sink=Meter(totals.append)) as relay:
        home = Path(os.environ["SPAWNKIT_HOME"]) / "claude-home"
        home.mkdir(parents=True)
        proc = await asyncio.create_subprocess_exec(
            str(ClaudeCodeAdapter().find_binary()), "-p", "hello", "--output-format", "json",
            env={"PATH": os.environ["PATH"], "HOME": str(home), "ANTHROPIC_API_KEY": "sk-test",
                 "ANTHROPIC_BASE_URL": relay.url, "CLAUDE_CODE_MAX_RETRIES": "0"},
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        async with asyncio.timeout(120):
            out, err = await proc.communicate()
    assert proc.returncode == 0, err.decode()
    assert json.loads(out)["result"] == "Done."
    assert any(r.path == "/v1/messages" for r in server.requests)
    assert totals == [Usage(input_tokens=600, output_tokens=100)]


SHOW_THE_URL = """
[[turn]]
shell = "cat \\"$HOME/.codex/config.toml\\" 2>/dev/null; echo \\"url=$GOOGLE_GEMINI_BASE_URL\\""
usage = { input_tokens = 10, output_tokens = 1 }
[[turn]]
text = "The shell said: {{ last_tool_result }}"
usage = { input_tokens = 10, output_tokens = 1 }
"""
REDACTED_URL = re.compile(r"127\.0\.0\.1:\d+/\[redacted:SPAWNKIT_RELAY_SECRET\]")


@needs_node_clis
@pytest.mark.parametrize("runtime", ["codex", "gemini"])
async def test_the_relay_secret_is_redacted_from_what_the_run_keeps(
    make_butler, store, runtime
) -> None:
    """The agent can see its own relay URL (its shell prints it): the secret is redacted."""
    scenario = Scenario.from_dict(tomllib.loads(SHOW_THE_URL), source="<test>")
    butler = with_runtime(make_butler(extra="[butler.limits]\nmax_tokens = 100000\n"), runtime)
    async with ButlerService(butler, store=store, replay=scenario, model=MODELS[runtime]) as svc:
        result = await svc.trigger("show the url")
    assert result.success, result.error
    assert REDACTED_URL.search(result.output), result.output
    assert result.tool_calls and REDACTED_URL.search(result.tool_calls[0].output or "")
    record = store.get_session(result.session_id or "")
    assert record is not None and REDACTED_URL.search(record.output or "")
