"""End to end: a canary credential, really used by a real CLI, stays out of everything kept.

For each runtime the canary is stored with ``spawnkit credentials set`` (piped),
declared by the butler, and really used by the run: the agent's own shell tool
prints it from its environment (the replay model server receives that output, so
the test sees the value reached the model), passes it to an MCP tool, and writes
it into its answer, which streams in three-character deltas. Afterwards the canary
is in no file under ``$SPAWNKIT_HOME`` but the credentials file (the CLI's own
transcript kept under ``runtimes/`` included), in no span, in no
``spawnkit sessions --json`` output, in no event a listener got (nor in the text
they streamed, joined up) and not in the returned result.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from spawnkit.events import RunEvent, TextDelta
from spawnkit.replay import Scenario
from spawnkit.serve.service import ButlerService
from spawnkit.store import SessionStore

from .conftest import REPO

CANARY = "canary-8Zq4Wv2Ls7Kd"
MARK = "[redacted:CANARY_TOKEN]"
NODE_CLIS = (REPO / "node_modules" / ".bin" / "codex").exists()

SCRIPT = """
[[turn]]
shell = "echo \\"canary says: $CANARY_TOKEN\\""
[[turn]]
tool = "mcp__*__state_get"
input = { key = "{{ last_tool_result }}" }
[[turn]]
chunk_chars = 3
text = "Done. The tool answered {{ last_tool_result }} and that is all."
"""

pytestmark = pytest.mark.e2e


@pytest.fixture(
    params=[
        "claude-code",
        pytest.param("codex", marks=pytest.mark.skipif(not NODE_CLIS, reason="npm ci")),
        pytest.param("gemini", marks=pytest.mark.skipif(not NODE_CLIS, reason="npm ci")),
    ]
)
def runtime(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def spawnkit(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        [sys.executable, "-m", "spawnkit", *args],
        input=stdin, capture_output=True, text=True, timeout=120, check=False, cwd=REPO,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return done


async def test_a_canary_credential_is_used_and_kept_nowhere(
    make_butler, runtime: str, isolated_home: Path
) -> None:
    spawnkit("credentials", "set", "CANARY_TOKEN", stdin=CANARY + "\n")
    butler = make_butler(extra='[butler.env]\nrequired = ["CANARY_TOKEN"]\n').with_runtime(runtime)
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    events: list[RunEvent] = []
    store = SessionStore()  # in $SPAWNKIT_HOME, beside the credentials file the CLI wrote
    scenario = Scenario.from_dict(tomllib.loads(SCRIPT), source="<canary>")
    async with ButlerService(butler, store=store, replay=scenario, tracer_provider=provider) as svc:
        svc.spawner.add_listener(events.append)
        result = await svc.trigger(
            "check the token", context=f"(the token, should you need it: {CANARY})"
        )
        wire = json.dumps([r.body for r in svc.replay_server.requests])

    # The run really used the value: its shell printed it from the environment.
    assert result.success, result.error
    assert f"canary says: {CANARY}" in wire
    shell, mcp = result.tool_calls
    assert f"canary says: {MARK}" in (shell.output or "")
    assert (mcp.tool, mcp.input) == ("state_get", {"key": f"canary says: {MARK}"})
    assert result.output.startswith("Done. The tool answered") and MARK in result.output

    # ... and it is nowhere spawnkit keeps or shows things.
    assert CANARY not in json.dumps(result.to_dict()) and CANARY not in repr(result)
    assert CANARY not in repr(events)
    streamed = "".join(e.text for e in events if isinstance(e, TextDelta))
    assert CANARY not in streamed
    if runtime != "codex":  # Codex reports whole messages, no deltas
        assert MARK in streamed
    spans = exporter.get_finished_spans()
    assert len(spans) >= 3 and all(CANARY not in s.to_json() for s in spans)
    listing = spawnkit("sessions", "--json").stdout
    shown = spawnkit("sessions", result.session_id or "", "--json").stdout
    assert CANARY not in listing + shown
    assert MARK in shown, "the record kept the run, redacted"
    (call,) = store.mcp_calls(result.session_id or "")
    assert call["arguments"] == {"key": f"canary says: {MARK}"}
    store.close()

    home = Path(os.environ["SPAWNKIT_HOME"])
    assert home == isolated_home
    files = [p for p in home.rglob("*") if p.is_file() and p.name != "credentials.json"]  # noqa: ASYNC240
    assert {"stdout.log", "sessions.db"} <= {p.name for p in files}
    leaks = [p.relative_to(home) for p in files if CANARY.encode() in p.read_bytes()]
    assert leaks == [], "the CLI's own transcript, kept under runtimes/, is redacted too"
    kept = [p for p in files if p.relative_to(home).parts[0] == "runtimes"]
    assert any(MARK.encode() in p.read_bytes() for p in kept), "the transcript was kept"
    assert CANARY.encode() in (home / "credentials.json").read_bytes()


# The agent prints its CLI's configuration, and the environment of every process of its
# run (where the CLI's OTLP settings are): the run's MCP secret and its OTLP receiver's
# secret, both withdrawn when the run ends.
PRINT_CONFIG = """
[[turn]]
shell = '''
find "$HOME" \\( -name mcp.json -o -name config.toml -o -name settings.json \\) -exec cat {} +
cat /proc/[0-9]*/environ 2>/dev/null | tr '\\0' '\\n' | grep -i otlp | sort -u'''
[[turn]]
text = "Printed."
"""
MCP_SECRET = re.compile(r"Bearer ([A-Za-z0-9_-]{40,})")
OTLP_SECRET = re.compile(r"x-spawnkit-otlp-secret[^A-Za-z0-9_-]+([A-Za-z0-9_-]{30,})")


async def test_the_runs_own_secrets_printed_by_the_agent_are_kept_nowhere(
    make_butler, runtime: str, isolated_home: Path
) -> None:
    butler = make_butler(extra="[butler.telemetry]\ncli = true\n").with_runtime(runtime)
    store = SessionStore()
    scenario = Scenario.from_dict(tomllib.loads(PRINT_CONFIG), source="<print config>")
    async with ButlerService(butler, store=store, replay=scenario) as svc:
        result = await svc.trigger("print your configuration")
        wire = json.dumps([r.body for r in svc.replay_server.requests])

    # The agent really printed them: the model got them in the tool's output.
    assert result.success, result.error
    mcp_secret = {m[1] for m in MCP_SECRET.finditer(wire)}
    otlp_secret = {m[1] for m in OTLP_SECRET.finditer(wire)}
    assert len(mcp_secret) == 1 and len(otlp_secret) == 1, wire[-3000:]
    printed = [*mcp_secret, *otlp_secret]
    (shell,) = result.tool_calls
    assert "[redacted:SPAWNKIT_MCP_SECRET]" in (shell.output or "")
    assert "[redacted:SPAWNKIT_OTLP_SECRET]" in (shell.output or "")

    # ... and they are nowhere spawnkit keeps or shows things.
    kept = json.dumps(result.to_dict()) + repr(result)
    kept += spawnkit("sessions", "--json").stdout
    kept += spawnkit("sessions", result.session_id or "", "--json").stdout
    assert [s for s in printed if s in kept] == []
    store.close()
    home = Path(os.environ["SPAWNKIT_HOME"])
    files = [p for p in home.rglob("*") if p.is_file()]  # noqa: ASYNC240
    assert {"stdout.log", "sessions.db"} <= {p.name for p in files}
    assert any(p.relative_to(home).parts[0] == "runtimes" for p in files), "transcript kept"
    leaks = [p.relative_to(home) for p in files for s in printed if s.encode() in p.read_bytes()]
    assert leaks == []
