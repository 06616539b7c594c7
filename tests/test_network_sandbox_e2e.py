"""End to end: a sandboxed run's network is its own, on all three CLIs.

The real CLI runs against the replay model server; the scripted model has the CLI's own
shell tool run a probe that does what a prompt-injected agent would: reach a canary HTTP
server on the host's loopback (neither a door nor the MCP server) with curl, Python and
node, and resolve a name. Under ``network = "model-only"`` (the default) the canary gets
no request at all and no name resolves, while the run still reaches its model and its
butler's MCP server through their doors; ``network = "host"`` gives both back. And
nothing of the namespace (the forwarder, the door folder) outlives its run, even when
the run's owner is killed.
"""

from __future__ import annotations

import http.server
import json
import logging
import os
import signal
import socket
import sys
import threading
import time
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest

from spawnkit.containment.doors import DOORS_DIR
from spawnkit.containment.egress import NOT_LISTED
from spawnkit.events import NetworkDenied
from spawnkit.store import SessionStore

from .conftest import REPO, workspaces_of
from .test_ask import library, registry, user_agents  # noqa: F401 - fixtures
from .test_cluster_e2e import client  # noqa: F401 - a fixture: 2 Dask worker processes
from .test_sandbox import service, shell_then_text, start_run, wait_until

RUNTIMES = ["claude-code", "codex", "gemini"]
pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(
        not (REPO / "node_modules" / ".bin" / "codex").exists(),
        reason="the node CLIs are not installed (npm ci)",
    ),
]
NAME = "pypi.org"  # a name to resolve (this machine's DNS answers it; see the control)

PROBE = """\
P=$1
curl -s -m 5 -o /dev/null -w 'curl:%{http_code}\\n' http://127.0.0.1:$P/curl || echo curl:failed
python3 - "$P" <<'EOF'
import socket, sys, urllib.request
try:
    urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/python", timeout=5)
    print("python:reached")
except OSError as exc:
    print("python:failed", exc)
try:
    socket.getaddrinfo("NAME", 443)
    print("dns-python:resolved")
except OSError as exc:
    print("dns-python:failed", exc)
EOF
node -e "require('http').get('http://127.0.0.1:$P/node', r => {
  console.log('node:reached'); r.resume() }
).on('error', e => console.log('node:failed', e.code)).setTimeout(5000)"
getent hosts NAME > /dev/null && echo dns-getent:resolved || echo dns-getent:failed
""".replace("NAME", NAME)


@pytest.fixture(params=RUNTIMES)
def runtime(request: pytest.FixtureRequest) -> str:
    return str(request.param)


class Canary(http.server.BaseHTTPRequestHandler):
    seen: list[str]

    def do_GET(self) -> None:
        self.seen.append(self.path)
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def canary() -> Iterator[tuple[int, list[str]]]:
    """An HTTP server on the host's 127.0.0.1: its port, and the paths it was asked for."""
    seen: list[str] = []
    handler = type("Handler", (Canary,), {"seen": seen})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server.server_address[1], seen
    server.shutdown()
    server.server_close()


def probe_then_mcp(probe: Path, port: int) -> str:
    return (
        f"[[turn]]\nshell = {json.dumps(f'sh {probe} {port}')}\n"
        '[[turn]]\ntool = "mcp__*__state_set"\ninput = { key = "probe", value = "done" }\n'
        '[[turn]]\ntext = "finished"\n'
    )


def host_resolves(name: str) -> bool:
    try:
        socket.getaddrinfo(name, 443)
    except OSError:
        return False
    return True


@pytest.mark.parametrize("network", ["model-only", "host"])
async def test_a_runs_shell_reaches_nothing_but_its_doors(
    make_butler, store, runtime, canary, network
) -> None:
    port, seen = canary
    table = "" if network == "model-only" else '[butler.sandbox]\nnetwork = "host"\n'
    butler = make_butler(extra=table, files={"health/probe.sh": PROBE})
    script = probe_then_mcp(butler.directory / "probe.sh", port)
    async with service(butler, runtime, store, script) as svc:
        result = await svc.trigger("probe the network")
    assert result.success, result.error
    output = result.tool_calls[0].output or ""
    assert [c.tool for c in result.tool_calls][1:] == ["state_set"]
    calls = store.mcp_calls(result.session_id or "")
    assert [c["tool"] for c in calls] == ["state_set"], "the MCP call reached the butler"
    assert store.state_get("health", "probe") == "done"
    record = store.get_session(result.session_id or "")
    assert record is not None and record.given is not None
    assert record.given["network"] == network
    assert not any(DOORS_DIR in name for name in record.given["config_files"])
    if network == "model-only":
        assert seen == [], f"the canary on the host's loopback was reached: {output}"
        for tool in ("curl", "python", "node"):
            assert f"{tool}:failed" in output, output
        assert "dns-python:failed" in output and "dns-getent:failed" in output, output
    else:  # the control: the same probe reaches the host, so the refusals are the namespace's
        assert sorted(seen) == ["/curl", "/node", "/python"], output
        if host_resolves(NAME):
            assert "dns-python:resolved" in output and "dns-getent:resolved" in output, output


FETCH = """\
curl -s -m 10 --noproxy '' --proxy "$HTTPS_PROXY" http://localhost:$1/allowed; echo
curl -s -m 10 --noproxy '' --proxy "$HTTPS_PROXY" http://pypi.org/simple/; echo
"""


async def test_allow_hosts_opens_a_proxy_door_to_those_hosts_only(
    make_butler, store, runtime, canary
) -> None:
    """A butler that lists hosts gets a proxy door (HTTPS_PROXY) through which its shell
    reaches them by name, and nothing else: the refusal is a 403 saying which key would
    allow it, a NetworkDenied event naming the tool call, and a count in the record.

    The listed name is ``localhost`` (the test's canary is on the host's loopback; the
    proxy refuses a name that resolves there unless the address is listed too), and the
    shell forces the proxy for it (NO_PROXY sends loopback names to the run's own)."""
    port, seen = canary
    table = '[butler.sandbox]\nallow_hosts = ["localhost", "127.0.0.1"]\n'
    butler = make_butler(extra=table, files={"health/fetch.sh": FETCH})
    script = shell_then_text(f"sh {butler.directory / 'fetch.sh'} {port}")
    events: list[object] = []
    async with service(butler, runtime, store, script) as svc:
        result = await svc.trigger("fetch two pages", on_event=events.append)
    assert result.success, result.error
    output = result.tool_calls[0].output or ""
    assert seen == ["/allowed"], output
    assert "spawnkit: connect pypi.org:80 refused" in output and NOT_LISTED in output, output
    denied = [e for e in events if isinstance(e, NetworkDenied)]
    assert [(d.host, d.port) for d in denied] == [("pypi.org", 80)]
    # Codex's announcement of a shell call (item.started, on its stdout) races the call's
    # own connection to the proxy: the call is named when spawnkit had read it, else none.
    # The others announce a call before they run it.
    named = result.tool_calls[0].tool
    expected = {None, named} if runtime == "codex" else {named}
    assert denied[0].tool in expected, "the shell call in progress is named"
    assert result.network_denied == 1
    record = store.get_session(result.session_id or "")
    assert record is not None and record.given is not None
    assert record.network_denied == 1
    assert record.given["network"] == "model-only+allow_hosts"


async def test_a_remote_model_api_is_reached_through_the_runs_relay(make_butler, store) -> None:
    """A model API elsewhere is no door of the sandbox: the CLI reaches it through its
    relay, which connects from the host. This machine has no internet, so the run fails
    with the relay's own words, naming the API it could not reach (from inside, the CLI
    could not even have resolved the name)."""
    butler = make_butler(extra='[butler.runtime]\nbase_url = "https://api.anthropic.com"\n')
    script = '[[turn]]\ntext = "unused"\n'
    async with service(butler, "claude-code", store, script) as svc:
        svc.spawner.base_url = "https://api.anthropic.com"
        result = await svc.trigger("hello")
    assert not result.success
    assert "spawnkit relay: cannot reach https://api.anthropic.com" in (result.error or "")


def forwarders(home: Path) -> list[int]:
    """Live forwarder processes of runs of ``home``."""
    found = []
    marker = f"SPAWNKIT_RUN_HOME={home.resolve()}".encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
            environ = (entry / "environ").read_bytes()
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if b"/run/spawnkit/forward.pyc" in cmdline and marker in environ and state != "Z":
            found.append(int(entry.name))
    return found


async def test_nothing_of_the_namespace_outlives_a_run(make_butler, store, runtime) -> None:
    butler = make_butler()
    home = Path(os.environ["SPAWNKIT_HOME"])
    script = '[[turn]]\nshell = "ls /run/spawnkit/doors"\n[[turn]]\ntext = "done"\n'
    async with service(butler, runtime, store, script) as svc:
        result = await svc.trigger("look at the doors")
    assert result.success, result.error
    assert ".sock" in (result.tool_calls[0].output or ""), "the doors were there"
    await wait_until(lambda: forwarders(home) == [], timeout=10)
    assert workspaces_of(butler.name) == []


def test_killing_the_owner_leaves_no_forwarder_and_the_sweep_no_door(
    make_butler, runtime, tmp_path
) -> None:
    butler = make_butler(extra=f'[butler.runtime]\ntype = "{runtime}"\n')
    home = Path(os.environ["SPAWNKIT_HOME"])
    scenario = tmp_path / "scenario.toml"
    scenario.write_text(
        '[[turn]]\nshell = "echo started"\n[[turn]]\ndelay_ms = 60000\ntext = "late"\n'
    )
    proc = start_run(butler, scenario)
    try:
        deadline = time.monotonic() + 90
        while not forwarders(home):
            assert proc.poll() is None, "the run ended before its CLI started"
            assert time.monotonic() < deadline, "the forwarder never started"
            time.sleep(0.05)
        (workspace,) = workspaces_of(butler.name)
        assert (workspace / DOORS_DIR).is_dir()
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
        deadline = time.monotonic() + 10
        while forwarders(home) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert forwarders(home) == [], "a forwarder outlived its owner"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    with SessionStore():  # the next start sweeps what the dead owner left
        pass
    assert not (workspace / DOORS_DIR).exists()
    assert workspaces_of(butler.name) == []


FAKE_CHAT = """
import os, signal, sys, urllib.request
signal.signal(signal.SIGINT, lambda *_: print("[fake] got SIGINT", flush=True))
print("[fake] tty:", os.isatty(0) and os.isatty(1), flush=True)
print("[fake] model:", urllib.request.urlopen(sys.argv[1] + "/model").read().decode(), flush=True)
line = input("you> ")
print("[fake] bye", line, flush=True)
sys.exit(7)
"""


@pytest.mark.usefixtures("registry")  # the sources notes and single
def test_a_chat_keeps_its_terminal_and_its_ctrl_c_under_the_forwarder(
    isolated_home, tmp_path, canary
) -> None:
    """A chat's model is a door too: the CLI starts under the forwarder, which leaves it
    the terminal, its Ctrl-C (once, not twice) and its exit code."""
    pexpect = pytest.importorskip("pexpect")
    port, seen = canary
    fake = tmp_path / "fake_chat.py"
    fake.write_text(FAKE_CHAT)
    argv = [sys.executable, str(fake), "{base_url}"]
    user_agents(isolated_home, {"fake": {"command": argv, "chat_command": argv}}, default="fake")
    code = (
        "import sys; from spawnkit.ask import chat; "
        f"sys.exit(chat('notes', base_url='http://127.0.0.1:{port}'))"
    )
    child = pexpect.spawn(
        sys.executable, ["-c", code], env=dict(os.environ), cwd=str(tmp_path),
        encoding="utf-8", timeout=60,
    )  # fmt: skip
    try:
        child.expect_exact("[fake] tty: True")
        child.expect_exact("[fake] model: ok")
        child.expect_exact("you> ")
        assert forwarders(isolated_home), "the chat runs under the forwarder"
        child.sendintr()
        child.expect_exact("[fake] got SIGINT")
        child.sendline("ok")
        child.expect_exact("[fake] bye ok")
        assert "got SIGINT" not in (child.before or ""), "one Ctrl-C, one SIGINT"
        child.expect(pexpect.EOF)
    finally:
        child.close()
    assert child.exitstatus == 7
    assert seen == ["/model"]
    (record,) = [r for r in SessionStore().list_sessions() if r.kind == "chat"]
    assert record.given is not None and record.given["network"] == "model-only"


@pytest.mark.timeout(240)
async def test_a_run_on_a_dask_worker_is_contained_the_same_way(
    make_butler,
    store,
    canary,
    client,  # noqa: F811 - the fixture imported above
) -> None:
    from spawnkit.replay import Scenario
    from spawnkit.run import Spawner
    from spawnkit.run.dispatch import Cluster

    port, seen = canary
    butler = make_butler(files={"health/probe.sh": PROBE})
    script = probe_then_mcp(butler.directory / "probe.sh", port)
    with Cluster(client, replay=Scenario.from_dict(tomllib.loads(script))) as cluster:
        result = await Spawner(butler, store=store, cluster=cluster).trigger("probe")
    assert result.success, result.error
    output = result.tool_calls[0].output or ""
    assert seen == [], f"a worker's run reached the host's loopback: {output}"
    assert "dns-python:failed" in output and "dns-getent:failed" in output, output
    assert [(c.tool, c.status) for c in result.tool_calls[1:]] == [("state_set", "ok")]
    record = store.get_session(result.session_id or "")
    assert record is not None and record.given is not None
    assert record.given["network"] == "model-only" and "dispatch" in record.given


@pytest.mark.parametrize(
    ("table", "warning"),
    [
        ('network = "host"', 'butler health: [butler.sandbox] network = "host"'),
        ('mode = "none"', "butler health runs without a sandbox"),
    ],
)
async def test_the_hosts_network_is_logged_on_every_run_and_recorded(
    make_butler, store, caplog, table: str, warning: str
) -> None:
    butler = make_butler(extra=f"[butler.sandbox]\n{table}\n")
    script = '[[turn]]\ntext = "one"\n[[turn]]\ntext = "two"\n'
    with caplog.at_level(logging.WARNING, logger="spawnkit.containment.sandbox"):
        async with service(butler, "claude-code", store, script) as svc:
            results = [await svc.trigger("hello"), await svc.trigger("again")]
    assert all(r.success for r in results), [r.error for r in results]
    logged = [r.getMessage() for r in caplog.records if warning in r.getMessage()]
    assert len(logged) == 2 and all("every local port" in line for line in logged)
    for result in results:
        record = store.get_session(result.session_id or "")
        assert record is not None and record.given is not None
        assert record.given["network"] == "host"
