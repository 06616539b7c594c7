"""End to end: each real CLI reaches its butler's MCP server only with its run's own secret.

Claude Code, Codex and Gemini run for real against the replay model server and call
the butler's real MCP server through the configuration spawnkit wrote for them (the
secret in each CLI's own header setting). The control runs the same CLIs with a
secret the server never granted: the call must not land. Afterwards the secret is
gone from the server's table, refused if replayed, and found in no file, record or
span.
"""

from __future__ import annotations

import json
import logging
import tomllib
from pathlib import Path

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from spawnkit.containment.mcp_access import AccessTable
from spawnkit.notebook.hub import with_runtime
from spawnkit.replay import Scenario
from spawnkit.serve.service import ButlerService

from .conftest import REPO
from .test_mcp_auth import mcp_call_rows, try_http

pytestmark = pytest.mark.e2e

CASES = [
    ("claude-code", "http"), ("claude-code", "sse"), ("codex", "http"),
    ("gemini", "http"), ("gemini", "sse"),
]  # fmt: skip
STORE_WEIGHT = Scenario.from_dict(
    tomllib.loads(
        '[[turn]]\ntool = "mcp__*__state_set"\ninput = { key = "weight", value = "72.4 kg" }\n'
        '[[turn]]\ntext = "Stored: {{ last_tool_result }}"\n'
    ),
    source="<test>",
)


@pytest.fixture(params=CASES, ids=["-".join(case) for case in CASES])
def case(request: pytest.FixtureRequest) -> tuple[str, str]:
    runtime, transport = request.param
    if runtime != "claude-code" and not (REPO / "node_modules" / ".bin" / runtime).exists():
        pytest.skip("the node CLIs are not installed (npm ci)")
    return runtime, transport


class RecordingTable(AccessTable):
    """The server's real table, remembering the secrets it granted (for the test to look for)."""

    def __init__(self) -> None:
        super().__init__()
        self.granted: list[str] = []

    async def grant(self, session_key: str, ttl_s: float | None = None) -> str:
        secret = await super().grant(session_key, ttl_s)
        self.granted.append(secret)
        return secret


def files_holding(needle: str, *roots: Path) -> list[Path]:
    found = []
    for root in roots:
        for path in root.rglob("*"):
            if path.is_file() and not path.is_symlink() and needle.encode() in path.read_bytes():
                found.append(path)
    return found


async def test_each_cli_calls_through_its_own_secret(
    make_butler, store, case, isolated_home: Path, cli_home: Path
) -> None:
    runtime, transport = case
    butler = with_runtime(make_butler(extra=f'mcp_transport = "{transport}"\n'), runtime)
    table = RecordingTable()
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    async with ButlerService(
        butler, store=store, replay=STORE_WEIGHT, access=table, tracer_provider=provider
    ) as svc:
        result = await svc.trigger("log my weight")
        (secret,) = table.granted
        assert len(table) == 0, "the run's secret outlived the run"
        replayed = await try_http(f"{svc.mcp_url}/mcp", secret, "state_get", {"key": "weight"})
        assert set(replayed) == {401}, "a finished run's secret still works"

    assert result.success, result.error
    (call,) = result.tool_calls
    assert (call.tool, call.status) == ("state_set", "ok")
    assert store.state_get("health", "weight") == "72.4 kg"
    assert [(c["tool"], c["session_id"]) for c in store.mcp_calls(result.session_id or "")] == [
        ("state_set", result.session_id)
    ]
    # The secret is in no log, record, transcript or span.
    assert files_holding(secret, isolated_home, store.path.parent, cli_home) == []
    record = store.get_session(result.session_id or "")
    assert record is not None and secret not in json.dumps(record.to_dict(), default=str)
    spans = exporter.get_finished_spans()
    assert spans and not any(
        secret
        in json.dumps([dict(s.attributes or {}), [dict(e.attributes or {}) for e in s.events]])
        for s in spans
    )


async def test_a_cli_without_its_runs_secret_is_refused(make_butler, store, case, caplog) -> None:
    """The control: the same CLI, carrying a secret the server never granted, changes nothing."""
    runtime, transport = case
    butler = with_runtime(make_butler(extra=f'mcp_transport = "{transport}"\n'), runtime)
    async with ButlerService(butler, store=store, replay=STORE_WEIGHT) as svc:
        svc.spawner.mcp_access = AccessTable()  # grants the server does not know
        with caplog.at_level(logging.WARNING, logger="spawnkit.containment.mcp_guard"):
            result = await svc.trigger("log my weight")
    refusals = [r for r in caplog.records if "no valid bearer secret" in r.getMessage()]
    assert refusals, "the CLI never reached the server"
    assert store.state_get("health", "weight") is None
    assert mcp_call_rows(store) == []
    assert not (result.success and result.tool_calls and result.tool_calls[0].status == "ok")
