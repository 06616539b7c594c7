"""The spawner's own rules, isolated from any CLI with a gated fake adapter.

The same rules are exercised with the real Claude Code CLI in test_claude_e2e.py.
"""

from __future__ import annotations

import asyncio
import logging

import pytest

from spawnkit import MockSpawner, SpawnerResult
from spawnkit.config.credential_file import CredentialFile
from spawnkit.errors import (
    InvalidArgument,
    InvalidSessionId,
    InvalidTriggerSource,
    MissingEnvError,
    QueueFullError,
    RuntimeFailure,
    SpawnerClosedError,
)
from spawnkit.events import Finished, Queued, RunEvent, Started, ToolCallStarted
from spawnkit.run import Spawner, compose_prompt, validate_trigger_source
from spawnkit.run.memory import StoreMemory
from spawnkit.store import SessionStore

from .conftest import RosterFactory
from .fakes import FakeAdapter, Gate


def make_spawner(
    butler_factory: RosterFactory, store: SessionStore, extra: str = "", **kwargs: object
) -> tuple[Spawner, FakeAdapter]:
    adapter = FakeAdapter()
    butler = butler_factory(extra=extra)
    return Spawner(butler, store=store, adapter=adapter, **kwargs), adapter  # type: ignore[arg-type]


LIMITS = """
[butler.runtime]
max_concurrent_sessions = 1
max_queued_sessions = 1
"""


async def wait_until(predicate, timeout: float = 5.0) -> None:  # type: ignore[no-untyped-def]
    async with asyncio.timeout(timeout):
        while not predicate():
            await asyncio.sleep(0.005)


@pytest.mark.parametrize(
    "source", ["tick", "external", "trigger", "route", "schedule:daily_digest"]
)
def test_valid_trigger_sources(source: str) -> None:
    validate_trigger_source(source)


@pytest.mark.parametrize("source", ["", "cron", "schedule:", "schedule:a b", "External"])
def test_invalid_trigger_sources_are_value_errors(source: str) -> None:
    with pytest.raises(ValueError, match="invalid trigger_source"):
        validate_trigger_source(source)


def test_context_comes_before_prompt() -> None:
    assert compose_prompt("do it", "some context") == "some context\n\ndo it"
    assert compose_prompt("do it", None) == "do it"
    assert compose_prompt("do it", "   ") == "do it"


async def test_success_records_one_complete_session(make_butler, store) -> None:
    spawner, adapter = make_spawner(make_butler, store)
    events: list[RunEvent] = []
    result = await spawner.trigger("hello", context="ctx", on_event=events.append)

    assert result.success and result.status == "success"
    assert result.output == "answer to: ctx\n\nhello"
    assert [c.tool for c in result.tool_calls] == ["state_get"]
    assert result.tool_calls[0].status == "ok"
    assert (result.usage.cache_read_tokens, result.usage.cache_write_tokens) == (3, 2)
    assert store.count_sessions() == 1
    record = store.get_session(result.session_id)
    assert record is not None
    assert (record.status, record.success, record.prompt, record.context) == (
        "success", True, "hello", "ctx",
    )  # fmt: skip
    assert record.runtime_session_id == "fake-session"
    assert record.completed_at is not None and record.started_at is not None
    assert [c.id for c in record.tool_calls] == ["call-1"]
    assert type(events[0]) is Started and type(events[-1]) is Finished
    assert not adapter.workspaces[0].exists(), "the workspace must be removed"


async def test_workspace_and_mcp_url_are_per_run(make_butler, store) -> None:
    spawner, adapter = make_spawner(make_butler, store, mcp_port=4321)
    first = await spawner.trigger("one")
    await spawner.trigger("two")
    a, b = adapter.specs
    assert a.workspace != b.workspace
    assert a.workspace.name.startswith("butler_health_")
    assert a.mcp_server.url == f"http://localhost:4321/mcp?session_id={first.session_id}"
    assert a.config_file.parent == a.workspace


async def test_failed_runtime_is_recorded_with_partial_output(make_butler, store) -> None:
    spawner, adapter = make_spawner(make_butler, store)
    adapter.fail_with = RuntimeFailure("the CLI crashed", "crash")
    result = await spawner.trigger("hi")
    assert not result.success and result.status == "failed"
    assert result.error == "the CLI crashed" and result.error_kind == "crash"
    assert result.output == "answer to: hi", "output keeps what came before the failure"
    assert adapter.resets == 1, "reset() is called after a failed invocation"
    record = store.get_session(result.session_id)
    assert record is not None and record.status == "failed" and record.error == "the CLI crashed"
    assert not adapter.workspaces[0].exists()


async def test_serial_dispatch_with_one_slot(make_butler, store) -> None:
    spawner, adapter = make_spawner(make_butler, store, extra=LIMITS)
    adapter.gate = Gate(open_=False)
    events: list[RunEvent] = []
    first = asyncio.create_task(spawner.trigger("one"))
    second = asyncio.create_task(spawner.trigger("two", on_event=events.append))
    await wait_until(lambda: len(adapter.specs) == 1)
    await asyncio.sleep(0.05)
    assert len(adapter.specs) == 1, "the second run must wait for the slot"
    assert spawner.status.active == 1 and spawner.status.queued == 1
    assert any(isinstance(e, Queued) and e.position == 1 for e in events)
    adapter.gate.open()
    r1, r2 = await asyncio.gather(first, second)
    assert r1.success and r2.success
    assert adapter.max_running == 1
    assert [spec.prompt for spec in adapter.specs] == ["one", "two"], "first come, first served"
    rec1, rec2 = store.get_session(r1.session_id), store.get_session(r2.session_id)
    assert rec1 and rec2 and rec1.started_at and rec2.started_at
    assert rec2.started_at > rec1.started_at


async def test_queue_full_is_rejected_at_once(make_butler, store) -> None:
    spawner, adapter = make_spawner(make_butler, store, extra=LIMITS)
    adapter.gate = Gate(open_=False)
    running = asyncio.create_task(spawner.trigger("one"))
    queued = asyncio.create_task(spawner.trigger("two"))
    await wait_until(lambda: len(adapter.specs) == 1)
    with pytest.raises(QueueFullError, match="max_queued_sessions = 1"):
        await spawner.trigger("three")
    adapter.gate.open()
    await asyncio.gather(running, queued)
    assert store.count_sessions() == 2, "a rejected trigger leaves no record"


async def test_self_trigger_without_free_slot_is_rejected(make_butler, store) -> None:
    spawner, adapter = make_spawner(make_butler, store, extra=LIMITS)
    adapter.gate = Gate(open_=False)
    running = asyncio.create_task(spawner.trigger("one"))
    await wait_until(lambda: len(adapter.specs) == 1)
    result = await asyncio.wait_for(spawner.trigger("again", trigger_source="trigger"), 1)
    assert not result.success and result.error_kind == "rejected"
    assert "deadlock" in (result.error or "")
    adapter.gate.open()
    await running
    # With a free slot the same trigger runs normally.
    assert (await spawner.trigger("again", trigger_source="trigger")).success


async def test_stop_accepting_and_drain_cancels_what_remains(make_butler, store) -> None:
    spawner, adapter = make_spawner(
        make_butler,
        store,
        extra=LIMITS.replace("max_queued_sessions = 1", "max_queued_sessions = 5"),
    )
    adapter.gate = Gate(open_=False)
    tasks = [asyncio.create_task(spawner.trigger(f"run {i}")) for i in range(3)]
    await wait_until(lambda: len(adapter.specs) == 1)
    spawner.stop_accepting()
    with pytest.raises(SpawnerClosedError):
        await spawner.trigger("late")
    summary = await spawner.drain(timeout=0.2)
    assert summary == {"finished": 0, "cancelled": 3}
    results = await asyncio.gather(*tasks)
    assert [r.status for r in results] == ["cancelled"] * 3
    statuses = sorted(r.status for r in store.list_sessions())
    assert statuses == ["cancelled"] * 3, "cancelled runs, queued or running, are recorded"
    assert not any(ws.exists() for ws in adapter.workspaces)
    assert spawner.status.active == 0 and spawner.status.queued == 0


async def test_drain_waits_for_runs_that_finish_in_time(make_butler, store) -> None:
    spawner, adapter = make_spawner(make_butler, store)
    adapter.gate = Gate(open_=False)
    task = asyncio.create_task(spawner.trigger("one"))
    await wait_until(lambda: len(adapter.specs) == 1)
    asyncio.get_running_loop().call_later(0.05, adapter.gate.open)
    assert await spawner.drain(timeout=5) == {"finished": 1, "cancelled": 0}
    assert (await task).success


async def test_caller_cancellation_cancels_and_records(make_butler, store) -> None:
    spawner, adapter = make_spawner(make_butler, store)
    adapter.gate = Gate(open_=False)
    task = asyncio.create_task(spawner.trigger("one"))
    await wait_until(lambda: len(adapter.specs) == 1)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    (record,) = store.list_sessions()
    assert record.status == "cancelled" and record.success is False
    assert record.tool_calls[0].status == "error", "an unfinished tool call is closed"
    assert not adapter.workspaces[0].exists()
    assert spawner.in_flight == []


async def test_timeout_fails_the_run(make_butler, store) -> None:
    spawner, adapter = make_spawner(make_butler, store, extra="[butler.runtime]\ntimeout_s = 0.1\n")
    adapter.gate = Gate(open_=False)
    result = await spawner.trigger("slow")
    assert result.status == "timeout" and result.error_kind == "timeout"
    assert "timed out after 0.1 s" in (result.error or "")


async def test_bad_arguments_raise_before_acceptance(make_butler, store) -> None:
    spawner, _ = make_spawner(make_butler, store)
    with pytest.raises(InvalidTriggerSource):
        await spawner.trigger("x", trigger_source="cron")
    with pytest.raises(InvalidArgument, match="the prompt is empty"):
        await spawner.trigger("   ")
    with pytest.raises(ValueError, match="max_turns"):  # also a ValueError, as before
        await spawner.trigger("x", max_turns=0)
    assert store.count_sessions() == 0


async def test_missing_required_env_raises_before_spawning(make_butler, store, monkeypatch) -> None:
    monkeypatch.delenv("SPAWNKIT_TEST_TOKEN", raising=False)
    spawner, adapter = make_spawner(
        make_butler, store, extra='[butler.env]\nrequired = ["SPAWNKIT_TEST_TOKEN"]\n'
    )
    with pytest.raises(MissingEnvError, match="SPAWNKIT_TEST_TOKEN"):
        await spawner.trigger("x")
    assert adapter.specs == [] and store.count_sessions() == 0
    CredentialFile.beside(store.path).set("SPAWNKIT_TEST_TOKEN", "from-store")
    await spawner.trigger("x")
    assert adapter.specs[0].env["SPAWNKIT_TEST_TOKEN"] == "from-store"


async def test_max_turns_default_and_override(make_butler, store) -> None:
    spawner, adapter = make_spawner(make_butler, store, extra="[butler.runtime]\nmax_turns = 7\n")
    await spawner.trigger("x")
    await spawner.trigger("x", max_turns=2)
    assert [s.max_turns for s in adapter.specs] == [7, 2]


async def test_memory_context_and_episodes(make_butler, store) -> None:
    spawner, adapter = make_spawner(
        make_butler, store, extra="[modules.memory]\nmax_tokens = 500\n"
    )
    assert isinstance(spawner.memory, StoreMemory)
    await spawner.trigger("first question")
    assert "What you remember" not in adapter.specs[0].system_prompt
    await spawner.trigger("second question")
    prompt = adapter.specs[1].system_prompt
    assert "\n\n## What you remember from recent runs" in prompt
    assert "first question" in prompt and "answer to: first question" in prompt


class BrokenMemory:
    async def fetch_context(self, butler: str, prompt: str) -> str | None:
        raise OSError("memory backend down")

    async def store_episode(self, butler: str, session_id: str, prompt: str, output: str) -> None:
        raise OSError("memory backend down")


async def test_memory_fails_open(make_butler, store, caplog) -> None:
    spawner, _ = make_spawner(make_butler, store, memory=BrokenMemory())
    with caplog.at_level(logging.ERROR):
        result = await spawner.trigger("x")
    assert result.success
    assert "could not fetch context" in caplog.text and "could not store the episode" in caplog.text


async def test_a_failing_listener_does_not_break_the_run(make_butler, store) -> None:
    spawner, _ = make_spawner(make_butler, store)

    def broken(event: RunEvent) -> None:
        if isinstance(event, ToolCallStarted):
            raise RuntimeError("renderer bug")

    spawner.add_listener(broken)
    assert (await spawner.trigger("x")).success


async def test_broken_prompt_include_fails_the_run_cleanly(make_butler, store) -> None:
    adapter = FakeAdapter()
    butler = make_butler(prompt="Hi <!-- @include shared/missing.md -->")
    spawner = Spawner(butler, store=store, adapter=adapter)
    result = await spawner.trigger("x")
    assert result.status == "failed" and result.error_kind == "config"
    assert "included file not found: shared/missing.md" in (result.error or "")
    assert store.get_session(result.session_id).status == "failed"  # type: ignore[union-attr]


async def test_env_is_isolated(make_butler, store, monkeypatch) -> None:
    monkeypatch.setenv("CANARY_SECRET", "do-not-leak")
    monkeypatch.setenv("DECLARED_OPTIONAL", "yes")
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-test")
    spawner, adapter = make_spawner(
        make_butler, store, extra='[butler.env]\noptional = ["DECLARED_OPTIONAL", "UNSET_ONE"]\n'
    )
    await spawner.trigger("x")
    env = adapter.specs[0].env
    assert "CANARY_SECRET" not in env
    assert env["DECLARED_OPTIONAL"] == "yes" and env["ANTHROPIC_API_KEY"] == "sk-test"
    assert "UNSET_ONE" not in env
    assert env["SPAWNKIT_BUTLER"] == "health" and env["SPAWNKIT_SESSION_ID"]
    assert "TRACEPARENT" not in env, "no trace context without a tracer provider"


async def test_mock_spawner_records_and_matches() -> None:
    mock = MockSpawner(responses={"weight": SpawnerResult(output="72 kg")})
    assert (await mock.trigger("log my weight", context="c")).output == "72 kg"
    default = await mock.trigger("something else")
    assert (default.success, default.output, default.tool_calls, default.error) == (
        True, "", [], None,
    )  # fmt: skip
    mock.assert_triggered()
    mock.assert_triggered(times=2)
    mock.assert_prompted_with("weight")
    assert mock.invocations[0].context == "c"
    with pytest.raises(AssertionError, match="expected 3 trigger"):
        mock.assert_triggered(times=3)
    with pytest.raises(AssertionError, match="no trigger prompt contains 'blood'"):
        mock.assert_prompted_with("blood")
    with pytest.raises(ValueError, match="invalid trigger_source"):
        await mock.trigger("x", trigger_source="bogus")
    empty = MockSpawner()
    with pytest.raises(AssertionError, match="none"):
        empty.assert_triggered()


def test_mock_spawner_has_the_real_trigger_signature() -> None:
    import inspect

    real = inspect.signature(Spawner.trigger).parameters
    mock = inspect.signature(MockSpawner.trigger).parameters
    assert list(mock) == list(real)
    for name, parameter in real.items():
        assert (mock[name].kind, mock[name].default) == (parameter.kind, parameter.default), name


async def test_mock_spawner_records_the_keyword_arguments() -> None:
    spawner = MockSpawner()
    await spawner.trigger("go on", resume="s-1", role="reviewer", parent_session_id="p-1")
    (invocation,) = spawner.invocations
    assert (invocation.resume, invocation.role, invocation.parent_session_id) == (
        "s-1",
        "reviewer",
        "p-1",
    )


@pytest.mark.parametrize(
    "bad", ["../../escaped", "/tmp/absolute", "a/b", "..", ".hidden", "", "x" * 129, "a\nb", "a b"]
)
async def test_a_session_id_that_is_not_a_plain_name_is_refused(
    make_butler, store, isolated_home, bad: str
) -> None:
    spawner, adapter = make_spawner(make_butler, store)
    with pytest.raises(InvalidSessionId, match="invalid session id"):
        await spawner.trigger("hello", session_id=bad)
    assert store.count_sessions() == 0 and adapter.specs == [], "refused before it was accepted"
    assert not (isolated_home.parent / "escaped").exists(), "nothing written outside the home"
    assert not (isolated_home / "sessions").exists() or not any(
        (isolated_home / "sessions").iterdir()
    )


async def test_a_chosen_plain_session_id_is_used(make_butler, store) -> None:
    spawner, _ = make_spawner(make_butler, store)
    result = await spawner.trigger("hello", session_id="orchestrator-run_7.a")
    assert result.session_id == "orchestrator-run_7.a" and result.success
    record = store.get_session("orchestrator-run_7.a")
    assert record is not None and record.log_dir is not None
    assert record.log_dir.name == "orchestrator-run_7.a"


@pytest.mark.parametrize(
    ("prompt", "context", "what"),
    [("a\x00b", None, "the prompt"), ("fine", "c\x00d", "the context")],
)
async def test_a_nul_byte_is_refused_never_changed(
    make_butler, store, prompt: str, context: str | None, what: str
) -> None:
    adapter = FakeAdapter()
    spawner = Spawner(make_butler(), store=store, adapter=adapter)
    with pytest.raises(InvalidArgument, match=f"{what} contains a NUL byte"):
        await spawner.trigger(prompt, context=context)
    assert adapter.specs == [] and store.count_sessions() == 0
