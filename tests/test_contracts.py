"""Contracts from the specs spawnkit builds on, each checked where it could break.

The runtime-adapter interface and the peer test suites ported from it promise: a run whose
adapter raises anything is a recorded failure with that exception, not a lost session;
``capabilities()`` lists the same keys for every runtime; ``trigger`` takes no context by
position; unknown keys in ``butler.toml`` module tables are errors; missing credentials
are said before a run rather than discovered inside it.
"""

from __future__ import annotations

import inspect
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from spawnkit import MockSpawner
from spawnkit.config.butler_config import MODULE_KEYS
from spawnkit.containment.credentials import CredentialStore, run_values
from spawnkit.errors import (
    InvalidTriggerSource,
    MissingApiKeyError,
    RosterError,
    RuntimeFailure,
)
from spawnkit.home import spawnkit_home
from spawnkit.replay import Scenario
from spawnkit.run import TRIGGER_SOURCES, Spawner
from spawnkit.run.memory import StoreMemory
from spawnkit.runtimes import available_runtimes, get_adapter
from spawnkit.serve.service import ButlerService
from spawnkit.store import SessionStore

from .conftest import RosterFactory
from .fakes import FakeAdapter


def traced() -> tuple[TracerProvider, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider, exporter


class AdapterBug(Exception):
    """Not spawnkit's: what a third-party adapter might raise."""


async def test_an_adapter_exception_fails_the_run_with_its_type_and_message(
    make_butler: RosterFactory, store: SessionStore, caplog: pytest.LogCaptureFixture
) -> None:
    provider, exporter = traced()
    adapter = FakeAdapter()
    adapter.fail_with = AdapterBug("the adapter tripped over its own feet")
    spawner = Spawner(make_butler(), store=store, adapter=adapter, tracer_provider=provider)

    with caplog.at_level(logging.ERROR, logger="spawnkit.run"):
        result = await spawner.trigger("hi")

    message = "AdapterBug: the adapter tripped over its own feet"
    assert not result.success and result.status == "failed"
    assert result.error == message and result.error_kind == "adapter_error"
    assert "internal error" not in (result.error or "")
    assert result.output == "answer to: hi", "output keeps what came before the exception"
    record = store.get_session(result.session_id)
    assert record is not None and (record.status, record.error) == ("failed", message)
    assert adapter.resets == 1, "reset() is called after the exception"
    assert not adapter.workspaces[0].exists()

    (span,) = [s for s in exporter.get_finished_spans() if s.name.startswith("invoke_agent")]
    assert span.status.status_code is StatusCode.ERROR
    assert span.status.description == message
    (event,) = [e for e in span.events if e.name == "exception"]
    assert event.attributes is not None
    assert event.attributes["exception.type"].endswith("AdapterBug")  # type: ignore[union-attr]
    assert event.attributes["exception.message"] == "the adapter tripped over its own feet"
    assert "AdapterBug" in str(event.attributes["exception.stacktrace"])
    assert "raised AdapterBug" in caplog.text, "the traceback is logged for the adapter's author"


async def test_spawnkits_own_run_failure_is_no_exception_on_the_span(
    make_butler: RosterFactory, store: SessionStore
) -> None:
    provider, exporter = traced()
    adapter = FakeAdapter()
    adapter.fail_with = RuntimeFailure("the CLI crashed", "crash")
    spawner = Spawner(make_butler(), store=store, adapter=adapter, tracer_provider=provider)
    result = await spawner.trigger("hi")
    assert (result.error, result.error_kind) == ("the CLI crashed", "crash")
    (span,) = [s for s in exporter.get_finished_spans() if s.name.startswith("invoke_agent")]
    assert span.status.status_code is StatusCode.ERROR
    assert not [e for e in span.events if e.name == "exception"]


SUPPORTS_KEYS = {
    "supports_mcp", "supports_system_prompt", "supports_resume", "supports_subagents",
    "supports_agent_profiles", "supports_handoffs", "supports_max_turns",
    "supports_parallel_sessions",
}  # fmt: skip


@pytest.mark.parametrize("runtime", available_runtimes())
def test_every_runtime_reports_the_same_capability_keys(runtime: str) -> None:
    caps = get_adapter(runtime)(None).capabilities()
    assert {k for k in caps if k.startswith("supports_")} == SUPPORTS_KEYS
    assert caps["supports_agent_profiles"] is True and caps["supports_handoffs"] is False


@pytest.mark.parametrize("runtime", ["claude-code", "codex", "gemini"])
def test_the_adapter_contract_json_has_every_capability_key(runtime: str, tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "spawnkit", "adapter", runtime, "capabilities"],
        capture_output=True, text=True, timeout=120, check=False, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    caps = json.loads(done.stdout)
    assert caps["runtime"] == runtime and set(caps) >= SUPPORTS_KEYS
    assert (caps["supports_agent_profiles"], caps["supports_handoffs"]) == (True, False)


async def test_the_second_positional_argument_of_trigger_is_the_trigger_source(
    make_butler: RosterFactory, store: SessionStore
) -> None:
    adapter = FakeAdapter()
    spawner = Spawner(make_butler(), store=store, adapter=adapter)
    result = await spawner.trigger("hi", "tick")
    record = store.get_session(result.session_id)
    assert record is not None and (record.trigger_source, record.context) == ("tick", None)
    assert adapter.specs[0].prompt == "hi", "'tick' is not a context"

    with pytest.raises(InvalidTriggerSource) as refused:
        await spawner.trigger("hi", "the weather is fine")
    message = str(refused.value)
    assert "'the weather is fine'" in message
    for source in (*TRIGGER_SOURCES, "schedule:<task-name>", "context="):
        assert source in message
    with pytest.raises(TypeError):
        await spawner.trigger("hi", "tick", "a context")  # type: ignore[misc]
    assert store.count_sessions() == 1, "refused triggers leave no record"


@pytest.mark.parametrize("frontend", [Spawner, MockSpawner, ButlerService])
def test_everything_after_prompt_and_trigger_source_is_keyword_only(frontend: type) -> None:
    parameters = list(inspect.signature(frontend.trigger).parameters.values())[1:]
    assert [p.name for p in parameters[:2]] == ["prompt", "trigger_source"]
    assert all(p.kind in (p.KEYWORD_ONLY, p.VAR_KEYWORD) for p in parameters[2:])


async def test_the_mock_spawner_refuses_an_unknown_trigger_source() -> None:
    with pytest.raises(InvalidTriggerSource, match="tick, external, trigger, route"):
        await MockSpawner().trigger("hi", "some context")


def _roster_error(make_butler: RosterFactory, modules: str) -> RosterError:
    with pytest.raises(RosterError) as info:
        make_butler(extra=modules)
    return info.value


def test_an_unknown_key_in_a_module_table_names_the_file_and_the_closest_key(
    make_butler: RosterFactory,
) -> None:
    error = _roster_error(make_butler, "[modules.memory]\nmax_token = 1500\n")
    assert error.path.name == "butler.toml" and error.key == "modules.memory.max_token"
    assert str(error) == (
        f"{error.path}: [modules.memory.max_token]: unknown key (did you mean 'max_tokens'? "
        "allowed: credentials, max_episodes, max_tokens)"
    )
    # A budget under a name nothing reads, with no close match: the known keys are listed.
    error = _roster_error(make_butler, "[modules.memory]\nbudget = 1500\n")
    assert str(error).endswith(
        "[modules.memory.budget]: unknown key (allowed: credentials, max_episodes, max_tokens)"
    )
    error = _roster_error(make_butler, '[modules.memory]\nmax_tokens = "lots"\n')
    assert str(error).endswith("[modules.memory.max_tokens]: must be an integer, not str")


def test_the_keys_spawnkit_reads_in_module_tables_are_accepted(
    make_butler: RosterFactory, store: SessionStore
) -> None:
    butler = make_butler(
        extra="""
        [modules.memory]
        max_tokens = 10
        max_episodes = 2
        credentials = ["MEMORY_TOKEN"]
        [modules.mail]
        server = "imap.example.org"
        """
    )
    memory = StoreMemory.from_module_config(store, butler.modules["memory"])
    assert (memory.max_tokens, memory.max_episodes) == (10, 2)
    assert butler.modules["mail"]["server"] == "imap.example.org", "other modules' own keys"
    assert set(MODULE_KEYS["memory"]) == {"credentials"} | {
        name for name in inspect.signature(StoreMemory).parameters if name != "store"
    }, "MODULE_KEYS names every key StoreMemory takes"


API_KEYS = (
    "ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN", "CLAUDE_CODE_OAUTH_TOKEN", "OPENAI_API_KEY",
    "GEMINI_API_KEY", "GOOGLE_API_KEY",
)  # fmt: skip
NEEDS = {
    "claude-code": ("ANTHROPIC_API_KEY", "`claude login`"),
    "codex": ("OPENAI_API_KEY", "`codex login`"),
    "gemini": ("GEMINI_API_KEY", "`gemini`"),
}


@pytest.fixture
def no_credentials(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """No API key anywhere and a home without any CLI's login; returns that home."""
    for name in API_KEYS:
        monkeypatch.delenv(name, raising=False)
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    return home


@pytest.mark.parametrize("runtime", list(NEEDS))
async def test_a_runtime_without_key_or_login_is_refused_before_spawning(
    runtime: str, make_butler: RosterFactory, store: SessionStore, no_credentials: Path
) -> None:
    if runtime == "claude-code" and sys.platform == "darwin":
        pytest.skip("a Claude Code login on macOS is in the keychain, assumed present")
    butler = make_butler(extra='[butler.sandbox]\nmode = "none"\n').with_runtime(runtime)
    spawner = Spawner(butler, store=store)
    with pytest.raises(MissingApiKeyError) as refused:
        await spawner.trigger("hi")
    variable, login = NEEDS[runtime]
    message = str(refused.value)
    assert f"{runtime} has no API key: set {variable}" in message and login in message
    assert f"`spawnkit credentials set {variable}`" in message
    assert store.count_sessions() == 0, "nothing was spawned or recorded"


@pytest.mark.parametrize("runtime", list(NEEDS))
def test_a_login_or_a_key_the_run_gets_lets_the_run_start(
    runtime: str, no_credentials: Path
) -> None:
    adapter = get_adapter(runtime)(None)
    variable = NEEDS[runtime][0]
    adapter.check_authenticated(lambda name: "k" if name == variable else None)
    for login in adapter.login_files:
        path = no_credentials / login
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("{}")
    adapter.check_authenticated(lambda name: None)


async def test_a_key_the_butler_does_not_pass_to_the_run_does_not_count(
    make_butler: RosterFactory,
    store: SessionStore,
    no_credentials: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Claude Code's OAuth token reaches a run only when the butler declares it.
    monkeypatch.setenv("CLAUDE_CODE_OAUTH_TOKEN", "sk-ant-oat-test")
    if sys.platform == "darwin":
        pytest.skip("a Claude Code login on macOS is in the keychain, assumed present")
    sandbox_off = '[butler.sandbox]\nmode = "none"\n'
    with pytest.raises(MissingApiKeyError):
        await Spawner(make_butler(extra=sandbox_off), store=store).trigger("hi")
    declared = make_butler(
        "declared", extra=sandbox_off + '[butler.env]\noptional = ["CLAUDE_CODE_OAUTH_TOKEN"]\n'
    )
    adapter = get_adapter("claude-code")(None)
    adapter.check_authenticated(  # passes: the run would get it
        run_values(declared, CredentialStore(store), (), adapter.other_vendor_keys)
    )


def test_the_adapter_contract_refuses_a_runtime_without_key_before_its_worker(
    tmp_path: Path, no_credentials: Path
) -> None:
    (tmp_path / "brief.md").write_text("You are brief.")
    env = {k: v for k, v in os.environ.items() if k not in API_KEYS}
    done = subprocess.run(
        [sys.executable, "-m", "spawnkit", "adapter", "codex", "spawn", "brief.md", "state.json",
         "hi"],
        capture_output=True, text=True, timeout=120, check=False, cwd=tmp_path,
        env={**env, "HOME": str(no_credentials)},
    )  # fmt: skip
    assert done.returncode == 3, done.stderr  # the contract's "runtime unavailable"
    assert "codex has no API key: set OPENAI_API_KEY" in done.stderr
    assert "`codex login`" in done.stderr and "Traceback" not in done.stderr
    assert SessionStore().count_sessions() == 0


@pytest.mark.parametrize("runtime", ["codex", "claude-code"])
async def test_a_replay_run_needs_no_key_and_warns_of_nothing(
    runtime: str,
    make_butler: RosterFactory,
    store: SessionStore,
    no_credentials: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    scenario = Scenario.from_dict({"turn": [{"text": "replayed"}]}, source="<test>")
    butler = make_butler().with_runtime(runtime)
    with caplog.at_level(logging.WARNING, logger="spawnkit"):
        async with ButlerService(butler, store=store, replay=scenario) as service:
            result = await service.trigger("hi")
    assert result.success and result.output == "replayed", result.error
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []


async def test_missing_optional_credentials_are_one_warning_per_run(
    make_butler: RosterFactory,
    store: SessionStore,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    monkeypatch.delenv("ABSENT_ONE", raising=False)
    monkeypatch.delenv("MAIL_TOKEN", raising=False)
    monkeypatch.setenv("PRESENT_ONE", "set")
    butler = make_butler(
        extra="""
        [butler.env]
        optional = ["ABSENT_ONE", "PRESENT_ONE"]
        [modules.mail]
        credentials = ["MAIL_TOKEN"]
        """
    )
    spawner = Spawner(butler, store=store, adapter=FakeAdapter())
    with caplog.at_level(logging.WARNING, logger="spawnkit"):
        first = await spawner.trigger("one")
        second = await spawner.trigger("two")
    assert first.success and second.success, "an optional variable is optional"
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 2, warnings
    for warning, result in zip(warnings, (first, second), strict=True):
        assert result.session_id in warning
        assert "ABSENT_ONE, MAIL_TOKEN" in warning and "PRESENT_ONE" not in warning


def _adapter(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "spawnkit", "adapter", "claude-code", *args],
        capture_output=True, text=True, timeout=120, check=False, cwd=cwd,
    )  # fmt: skip


def _port_free(port: int) -> bool:
    with socket.socket() as probe:
        return probe.connect_ex(("127.0.0.1", port)) != 0


def stop_detached(pid: int, grace_s: float = 30.0) -> None:
    """Stop a server the contract detached: SIGTERM (which spawnkit handles even where
    SIGINT is ignored, as under nohup), SIGKILL if it is still there after ``grace_s``."""
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    if Path(f"/proc/{pid}").exists():
        os.kill(pid, signal.SIGKILL)


@pytest.mark.parametrize(
    "form",
    [
        ("desk",),
        ("roster/desk/butler.toml",),
        ("roster/desk",),
        ("--butler", "desk", "desk"),
    ],
    ids=["butler name", "butler.toml path", "butler folder", "name and the same --butler"],
)
def test_start_mcp_server_takes_the_interfaces_positional_form(
    form: tuple[str, ...], tmp_path: Path, unused_tcp_port: int
) -> None:
    folder = tmp_path / "roster" / "desk"
    folder.mkdir(parents=True)
    (folder / "butler.toml").write_text(f'[butler]\nname = "desk"\nport = {unused_tcp_port}\n')
    (folder / "CLAUDE.md").write_text("You are the desk butler.")
    flags, positional = (form[:2], form[2:]) if form[0] == "--butler" else ((), form)
    done = _adapter("--roster", "roster", *flags, "start_mcp_server", *positional, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    pid = int(done.stdout.strip())
    try:
        assert not _port_free(unused_tcp_port), "the server listens on the butler's port"
        token = spawnkit_home() / "mcp" / f"desk-{unused_tcp_port}.token"
        assert token.is_file(), "the owner token is there once the pid is printed"
    finally:
        stop_detached(pid)


def test_start_mcp_server_refuses_a_positional_butler_that_is_not_one(tmp_path: Path) -> None:
    folder = tmp_path / "roster" / "desk"
    folder.mkdir(parents=True)
    (folder / "butler.toml").write_text('[butler]\nname = "desk"\nport = 18931\n')
    (folder / "CLAUDE.md").write_text("You are the desk butler.")
    missing = _adapter("start_mcp_server", "nowhere/butler.toml", cwd=tmp_path)
    assert missing.returncode == 2 and "no butler.toml at nowhere/butler.toml" in missing.stderr
    unknown = _adapter("--roster", "roster", "start_mcp_server", "attic", cwd=tmp_path)
    assert unknown.returncode == 2 and "unknown butler 'attic'" in unknown.stderr
    clash = _adapter("--butler", "attic", "start_mcp_server", "roster/desk", cwd=tmp_path)
    assert clash.returncode == 2 and "is butler 'desk', but --butler says 'attic'" in clash.stderr
    for done in (missing, unknown, clash):
        assert "Traceback" not in done.stderr
