"""Keys never enter a run: its CLI gets placeholders, and its relay swaps the real key in.

For each of the three real CLIs (and a ``command`` runtime that names ``{base_url}`` in its
environment), against the replay server as the model API: the agent's own shell prints a
sha256 of every model key variable it sees, which must not be the real key's; the model
server (which logs each request's headers) must have got the real key on every model
request, and never a placeholder; while the run is held at a model call, the real key is
in no ``/proc/*/environ`` of the run's processes, on no command line, in no file of the
run's workspace. When the upstream is down, the run fails with an error that names the
relay and the upstream it could not reach.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import secrets
import socket
import string
import tomllib
from pathlib import Path
from typing import Any

import pytest

from spawnkit.containment.credentials import CredentialStore
from spawnkit.notebook.hub import with_runtime
from spawnkit.replay import ReplayServer, Scenario
from spawnkit.runtimes.base import RunSpec
from spawnkit.runtimes.claude_code import ClaudeCodeAdapter
from spawnkit.runtimes.codex import REPLAY_MODEL, CodexAdapter
from spawnkit.serve.service import ButlerService

from .conftest import REPO, processes_with_env, workspaces_of
from .test_relay_auth_e2e import MODEL_PATHS, HoldFirstModelCall, on_command_lines

pytestmark = pytest.mark.e2e
NODE_CLIS = (REPO / "node_modules" / ".bin" / "codex").exists()
MODELS = {"codex": "replay-model", "gemini": "gemini-2.5-flash"}
KEY_VARS = (
    "ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN", "CLAUDE_CODE_OAUTH_TOKEN", "OPENAI_API_KEY",
    "GEMINI_API_KEY", "GOOGLE_API_KEY",
)  # fmt: skip
LOGIN = '[butler.env]\noptional = ["CLAUDE_CODE_OAUTH_TOKEN"]\n'


def real_key(prefix: str, length: int) -> str:
    alphabet = string.ascii_letters + string.digits
    return prefix + "".join(secrets.choice(alphabet) for _ in range(length - len(prefix)))


# Shaped like the vendors' keys; each test makes its own.
def real_keys(runtime: str) -> dict[str, str]:
    if runtime == "claude-code-login":  # a subscription's token, declared by the butler
        return {"CLAUDE_CODE_OAUTH_TOKEN": real_key("sk-ant-oat01-", 108)}
    if runtime in ("claude-code", "command"):
        return {"ANTHROPIC_API_KEY": real_key("sk-ant-api03-", 108)}
    if runtime == "codex":
        return {"OPENAI_API_KEY": real_key("sk-proj-", 164)}
    return {"GEMINI_API_KEY": real_key("AIza", 39)}


# Where each API carries its key: header names (and Gemini's ?key=).
KEY_HEADERS = ("x-api-key", "authorization", "x-goog-api-key")

PRINT_HASHES = """
[[turn]]
shell = 'for v in {vars}; do printf "%s=" "$v"; printenv "$v" | tr -d "\\\\n" | sha256sum; done'
[[turn]]
text = "Hashes: {{{{ last_tool_result }}}}"
"""


def sha(value: str) -> str:
    return hashlib.sha256(value.encode()).hexdigest()


def keys_sent(headers: dict[str, str], query: str) -> list[str]:
    """The credential values a request carried (its key headers, a ?key=)."""
    sent = [headers[h].removeprefix("Bearer ") for h in KEY_HEADERS if h in headers]
    sent += [p.partition("=")[2] for p in query.split("&") if p.startswith("key=")]
    return sent


def cli_environ(session_id: str) -> dict[int, bytes]:
    """The environment of every live process of the run (the CLI and its children)."""
    found = {}
    for pid in processes_with_env("SPAWNKIT_SESSION_ID", session_id):
        try:
            found[pid] = Path(f"/proc/{pid}/environ").read_bytes()
        except OSError:
            continue
    return found


def runtime_params() -> list[Any]:
    node = pytest.mark.skipif(not NODE_CLIS, reason="the node CLIs are not installed (npm ci)")
    return [
        "claude-code",
        pytest.param("codex", marks=node),
        pytest.param("gemini", marks=node),
    ]


def live_files(folders: list[Path]) -> list[bytes]:
    """The contents of the files under ``folders`` of a run still going: the CLI makes and
    removes files (its lock files) while they are read, and those are skipped."""
    contents = []
    for folder in folders:
        for root, _, names in os.walk(folder):
            for name in names:
                path = Path(root) / name
                try:
                    if path.is_file():  # not the doors' sockets
                        contents.append(path.read_bytes())
                except FileNotFoundError:
                    continue
    return contents


@pytest.mark.parametrize("runtime", [*runtime_params(), "claude-code-login"])
async def test_the_cli_sees_a_placeholder_and_the_model_api_gets_the_real_key(
    make_butler, store, runtime: str
) -> None:
    real = real_keys(runtime)
    script = PRINT_HASHES.format(vars=" ".join(KEY_VARS))
    server = ReplayServer(Scenario.from_dict(tomllib.loads(script), source="<hashes>"))
    hold = HoldFirstModelCall(server.app)
    server.app = hold  # type: ignore[assignment] - an ASGI app like the one it wraps
    login = runtime == "claude-code-login"
    butler = with_runtime(make_butler(extra=LOGIN if login else ""), runtime.removesuffix("-login"))
    credentials = CredentialStore(environ={**os.environ, **real})
    async with (
        server.serve() as upstream,
        ButlerService(
            butler, store=store, base_url=upstream, credentials=credentials,
            model=MODELS.get(runtime),
        ) as svc,
    ):  # fmt: skip
        run = asyncio.create_task(svc.trigger("print the hashes of your keys"))
        try:
            async with asyncio.timeout(120):
                await hold.held.wait()
            (session,) = [s.id for s in store.list_sessions()]
            seen = cli_environ(session)
            assert seen, "no process of the run found"
            for name, value in real.items():
                assert all(value.encode() not in env for env in seen.values()), name
                assert any(f"{name}=".encode() in env for env in seen.values()), name
                assert on_command_lines(value) == []
                assert [f for f in live_files(workspaces_of("health")) if value.encode() in f] == []
            placeholders = {
                line.partition(b"=")[2].decode()
                for env in seen.values()
                for line in env.split(b"\0")
                if line.partition(b"=")[0].decode() in real
            }
        finally:
            hold.release.set()
        result = await run

    assert result.success, result.error
    (shell,) = result.tool_calls
    printed = dict(line.split("=", 1) for line in (shell.output or "").splitlines() if "=" in line)
    for name, value in real.items():
        hashed = printed[name].split()[0]
        assert hashed != sha(value), f"the agent saw the real {name}"
        if login and hashed == sha(""):
            continue  # Claude Code keeps a login's token from its tools (its CLI had one)
        assert hashed != sha(""), f"the agent saw no {name}"
        assert hashed in {sha(p) for p in placeholders}
    model_calls = [r for r in server.requests if MODEL_PATHS.search(r.path)]
    assert len(model_calls) >= 2
    for request in server.requests:
        sent = keys_sent(dict(request.headers), request.query)
        assert not placeholders & set(sent), f"a placeholder reached the upstream: {request.path}"
        if request in model_calls:
            assert set(sent) & set(real.values()), f"no real key on {request.path}"


# A command runtime: a tiny client of the Anthropic API that names {base_url} in its env.
CLIENT = r"""
import hashlib, json, os, urllib.request
key = os.environ["ANTHROPIC_API_KEY"]
body = {"model": "m", "max_tokens": 10, "messages": [{"role": "user", "content": "hi"}]}
request = urllib.request.Request(
    os.environ["MODEL_URL"] + "/v1/messages", method="POST", data=json.dumps(body).encode(),
    headers={"x-api-key": key, "content-type": "application/json"},
)
with urllib.request.urlopen(request, timeout=60) as response:
    answer = json.load(response)
print("sha=" + hashlib.sha256(key.encode()).hexdigest(), answer["content"][0]["text"])
"""
COMMAND = """
[butler.runtime]
type = "command"
command = ["{python}", "{script}"]
env = {{ MODEL_URL = "{{base_url}}" }}
"""


async def test_a_command_runtime_naming_base_url_gets_the_relay_and_a_placeholder(
    make_butler, store, tmp_path: Path
) -> None:
    script = tmp_path / "client.py"
    script.write_text(CLIENT)
    butler = make_butler(extra=COMMAND.format(python="/usr/bin/python3", script=script))
    real = real_keys("command")
    server = ReplayServer(Scenario.from_dict({"turn": [{"text": "Hello."}]}, source="<t>"))
    credentials = CredentialStore(environ={**os.environ, **real})
    async with (
        server.serve() as upstream,
        ButlerService(butler, store=store, base_url=upstream, credentials=credentials) as svc,
    ):
        result = await svc.trigger("hi")
    assert result.success, result.error
    assert result.output.endswith("Hello."), result.output
    assert f"sha={sha(real['ANTHROPIC_API_KEY'])}" not in result.output
    (call,) = [r for r in server.requests if r.path == "/v1/messages"]
    assert call.headers["x-api-key"] == real["ANTHROPIC_API_KEY"]


def closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.mark.parametrize("runtime", runtime_params())
async def test_an_unreachable_upstream_fails_the_run_naming_the_relay_and_the_upstream(
    make_butler, store, runtime: str
) -> None:
    down = f"http://127.0.0.1:{closed_port()}"
    butler = with_runtime(make_butler(), runtime)
    credentials = CredentialStore(environ={**os.environ, **real_keys(runtime)})
    async with ButlerService(
        butler, store=store, base_url=down, credentials=credentials, model=MODELS.get(runtime)
    ) as svc:
        async with asyncio.timeout(180):
            result = await svc.trigger("hello")
    assert not result.success
    assert f"spawnkit relay: cannot reach {down}" in (result.error or ""), result.error


async def test_a_run_without_base_url_reaches_the_clis_default_api_through_its_relay(
    make_butler, store
) -> None:
    """No base_url: the relay forwards to the CLI's own default API (here the replay server
    stands in for api.anthropic.com), and the CLI keeps its defaults for it (its retries)."""
    server = ReplayServer(Scenario.from_dict({"turn": [{"text": "Hi."}]}, source="<t>"))
    real = real_keys("claude-code")
    async with server.serve() as upstream:

        class VendorApi(ClaudeCodeAdapter):
            default_api_url = upstream

        credentials = CredentialStore(environ={**os.environ, **real})
        async with ButlerService(
            make_butler(), store=store, credentials=credentials, adapter=VendorApi()
        ) as svc:
            result = await svc.trigger("hi")
    assert result.success, result.error
    assert result.output == "Hi."
    calls = [r for r in server.requests if r.path == "/v1/messages"]
    assert calls and all(r.headers["x-api-key"] == real["ANTHROPIC_API_KEY"] for r in calls)


def test_a_relay_to_the_default_api_keeps_the_clis_own_defaults(tmp_path: Path) -> None:
    relayed = "http://127.0.0.1:1/" + "s" * 43
    codex = CodexAdapter()
    for default_api, model, retries in ((True, None, None), (False, REPLAY_MODEL, 0)):
        spec = RunSpec(
            session_id="s", butler="b", prompt="p", system_prompt="", workspace=tmp_path,
            cwd=tmp_path, mcp_server=None, config_file=codex.build_config_file(tmp_path, None),
            env={}, max_turns=3, base_url=relayed, default_api=default_api,
        )  # fmt: skip
        codex.command(spec)
        config = tomllib.loads(spec.config_file.read_text())
        assert config.get("model") == model
        provider = config["model_providers"]["spawnkit"]
        assert provider["base_url"] == relayed + "/v1"
        assert provider.get("request_max_retries") == retries
        claude = ClaudeCodeAdapter().child_env(spec)
        assert claude["ANTHROPIC_BASE_URL"] == relayed
        assert claude.get("CLAUDE_CODE_MAX_RETRIES") == (None if default_api else "1")
