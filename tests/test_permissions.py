"""``[butler.permissions] ask``: the roster's checks and the spawner's side of asking.

The spawner wraps whatever approver a trigger gives (or none) so that every question and
answer is an event and a line of the record; these tests drive it with a fake adapter
that asks as a runtime does (Claude Code's real permission callback is tested in
test_claude_permissions.py). The store keeps the answers on both engines
(test_store.py's conformance tests read them back).
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from typing import ClassVar

import pytest

from spawnkit.errors import ConfigError, RosterError
from spawnkit.events import (
    EventSink,
    PermissionAsked,
    PermissionDecided,
    RunEvent,
    ToolCallFinished,
    ToolCallStarted,
)
from spawnkit.permissions import NO_APPROVER, PermissionDecision, PermissionRequest
from spawnkit.result import ToolCall
from spawnkit.run import Spawner
from spawnkit.runtimes.base import RunOutcome, RunSpec
from spawnkit.store import SessionStore

from .conftest import RosterFactory
from .fakes import FakeAdapter

ASK_WRITE = """
[butler.permissions]
ask = ["Write"]
"""


class AskingAdapter(FakeAdapter):
    """Calls Write twice and Bash once, asking ``spec.approver`` about each tool in
    ``spec.ask`` as a runtime does; a denied call ends as an error saying why."""

    type: ClassVar[str] = "claude-code"

    def create_worker(self) -> AskingAdapter:
        return AskingAdapter(parent=self.root)

    async def invoke(self, spec: RunSpec, emit: EventSink) -> RunOutcome:
        self.root.specs.append(spec)
        for n, name in enumerate(("Write", "Bash", "Write")):
            call = ToolCall.start(f"call-{n}", name, {"file_path": "a.txt"}, datetime.now(UTC))
            emit(ToolCallStarted(spec.session_id, call))
            if name in spec.ask:
                assert spec.approver is not None
                decision = await spec.approver(
                    PermissionRequest(spec.session_id, spec.butler, call)
                )
                if not decision.allowed:
                    emit(
                        ToolCallFinished(
                            spec.session_id,
                            call.finish(str(decision.reason), True, datetime.now(UTC)),
                        )
                    )
                    continue
            emit(ToolCallFinished(spec.session_id, call.finish("done", False, datetime.now(UTC))))
        return RunOutcome(output="done")


def asking_spawner(
    make_butler: RosterFactory, store: SessionStore, extra: str = ASK_WRITE
) -> tuple[Spawner, AskingAdapter]:
    adapter = AskingAdapter()
    return Spawner(make_butler(extra=extra), store=store, adapter=adapter), adapter


# -- the roster ---------------------------------------------------------------------


def test_ask_is_read_from_butler_toml(make_butler) -> None:
    butler = make_butler(extra='[butler.permissions]\nask = ["Write", "Edit", "Write"]\n')
    assert butler.permissions.ask == ("Write", "Edit")
    assert make_butler(name="plain").permissions.ask == ()


@pytest.mark.parametrize(
    ("extra", "words"),
    [
        ('[butler.permissions]\nask = "Write"\n', "must be a list of tool names"),
        ("[butler.permissions]\nask = [1]\n", "must be a list of tool names"),
        ('[butler.permissions]\nask = ["Bash(rm:*)"]\n', "is not a tool name"),
        ('[butler.permissions]\nasks = ["Write"]\n', "unknown key (did you mean 'ask'?"),
        (
            '[butler.permissions]\nask = ["Write"]\n[butler.runtime]\ntype = "codex"\n',
            'the codex runtime cannot stop a tool call to ask a person; run it as type = "acp"',
        ),
        (
            '[butler.permissions]\nask = ["Write"]\n[butler.runtime]\ntype = "gemini"\n',
            "the gemini runtime cannot",
        ),
    ],
)
def test_bad_permissions_are_one_line_roster_errors(make_butler, extra: str, words: str) -> None:
    with pytest.raises(RosterError) as info:
        make_butler(extra=extra)
    assert words in str(info.value) and "\n" not in str(info.value)
    assert "permissions.ask" in str(info.value) or "permissions.asks" in str(info.value)


async def test_a_runtime_that_cannot_ask_is_refused_before_acceptance(make_butler, store) -> None:
    butler = make_butler(extra=ASK_WRITE).with_runtime("codex")
    spawner = Spawner(butler, store=store, adapter=AskingAdapter())
    with pytest.raises(ConfigError, match="codex runtime cannot stop a tool call"):
        await spawner.trigger("hi")
    assert store.list_sessions() == []


async def test_a_tool_in_both_tools_and_ask_is_asked(make_butler, store) -> None:
    spawner, adapter = asking_spawner(
        make_butler, store, ASK_WRITE + '[butler.runtime]\ntools = ["Bash", "Write"]\n'
    )
    await spawner.trigger("hi")
    (spec,) = adapter.specs
    assert spec.tools == ("Bash",) and spec.ask == ("Write",)
    (record,) = store.list_sessions()
    assert record.given is not None and record.given["ask"] == ["Write"]


# -- the spawner --------------------------------------------------------------------


async def test_without_an_approver_every_question_is_denied_and_recorded(
    make_butler, store
) -> None:
    spawner, _ = asking_spawner(make_butler, store)
    events: list[RunEvent] = []
    result = await spawner.trigger("write it", on_event=events.append)
    asked = [e for e in events if isinstance(e, PermissionAsked)]
    decided = [e for e in events if isinstance(e, PermissionDecided)]
    assert [e.call.id for e in asked] == [e.call.id for e in decided] == ["call-0", "call-2"]
    assert all(e.decision == NO_APPROVER for e in decided)
    assert [c.status for c in result.tool_calls] == ["error", "ok", "error"]
    assert result.tool_calls[0].output == NO_APPROVER.reason
    (record,) = store.list_sessions()
    assert [(a.tool_call_id, a.tool, a.allowed, a.by) for a in record.permissions] == [
        ("call-0", "Write", False, "no approver"),
        ("call-2", "Write", False, "no approver"),
    ]
    assert record.permissions == result.permissions


async def test_an_approver_is_asked_and_its_answers_recorded(make_butler, store) -> None:
    spawner, _ = asking_spawner(make_butler, store)
    asked: list[PermissionRequest] = []

    async def approver(request: PermissionRequest) -> PermissionDecision:
        asked.append(request)
        return PermissionDecision(allowed=len(asked) == 1, by="test", reason="no more")

    result = await spawner.trigger("write it", approver=approver)
    assert [r.call.name for r in asked] == ["Write", "Write"]
    assert asked[0].butler == "health" and asked[0].session_id == result.session_id
    assert [c.status for c in result.tool_calls] == ["ok", "ok", "error"]
    (record,) = store.list_sessions()
    assert [(a.allowed, a.by, a.reason) for a in record.permissions] == [
        (True, "test", "no more"),
        (False, "test", "no more"),
    ]
    assert record.to_dict()["permissions"][0]["tool_call_id"] == "call-0"


async def test_an_answer_given_always_holds_for_the_rest_of_the_run(make_butler, store) -> None:
    spawner, _ = asking_spawner(make_butler, store)
    asked = 0

    async def approver(request: PermissionRequest) -> PermissionDecision:
        nonlocal asked
        asked += 1
        return PermissionDecision(allowed=True, by="test", always=True)

    result = await spawner.trigger("write it", approver=approver)
    assert asked == 1
    assert [c.status for c in result.tool_calls] == ["ok", "ok", "ok"]
    assert [(a.allowed, a.always) for a in result.permissions] == [(True, True), (True, True)]


async def test_a_failing_approver_denies(make_butler, store, caplog) -> None:
    spawner, _ = asking_spawner(make_butler, store)

    async def approver(request: PermissionRequest) -> PermissionDecision:
        raise RuntimeError("the card fell off")

    result = await spawner.trigger("write it", approver=approver)
    assert result.success and [c.status for c in result.tool_calls] == ["error", "ok", "error"]
    assert {a.by for a in result.permissions} == {"approver failed"}
    assert "the card fell off" in str(result.permissions[0].reason)
    assert "the approver failed" in caplog.text


async def test_a_run_cancelled_while_it_waits_records_the_question_cancelled(
    make_butler, store
) -> None:
    spawner, adapter = asking_spawner(make_butler, store)
    waiting = asyncio.Event()

    async def approver(request: PermissionRequest) -> PermissionDecision:
        waiting.set()
        await asyncio.Event().wait()  # nobody ever answers
        raise AssertionError("unreachable")

    events: list[RunEvent] = []
    task = asyncio.create_task(
        spawner.trigger("write it", approver=approver, on_event=events.append)
    )
    async with asyncio.timeout(30):
        await waiting.wait()
    (session_id,) = spawner.in_flight
    assert await spawner.cancel(session_id)
    result = await task
    assert result.status == "cancelled"
    decided = [e for e in events if isinstance(e, PermissionDecided)]
    assert [(e.answer.by, e.answer.allowed) for e in decided] == [("cancelled", False)]
    (record,) = store.list_sessions()
    assert record.status == "cancelled"
    assert [(a.tool_call_id, a.by) for a in record.permissions] == [("call-0", "cancelled")]
    assert not adapter.workspaces or not adapter.workspaces[0].exists()


async def test_the_question_and_answer_are_redacted(make_butler, store, monkeypatch) -> None:
    monkeypatch.setenv("TOKEN", "s3cr3t-value-123")
    spawner, _ = asking_spawner(
        make_butler, store, ASK_WRITE + '[butler.env]\nrequired = ["TOKEN"]\n'
    )
    seen: list[PermissionRequest] = []

    async def approver(request: PermissionRequest) -> PermissionDecision:
        seen.append(request)
        return PermissionDecision(False, "test", reason="not s3cr3t-value-123 here")

    class Leaky(AskingAdapter):
        def create_worker(self) -> Leaky:
            return Leaky(parent=self.root)

        async def invoke(self, spec: RunSpec, emit: EventSink) -> RunOutcome:
            call = ToolCall.start("c", "Write", {"content": "s3cr3t-value-123"}, datetime.now(UTC))
            assert spec.approver is not None
            await spec.approver(PermissionRequest(spec.session_id, spec.butler, call))
            return RunOutcome(output="done")

    spawner.adapter = Leaky()
    result = await spawner.trigger("hi", approver=approver)
    assert "s3cr3t" not in repr(seen) and "s3cr3t" not in repr(result.permissions)
    (record,) = store.list_sessions()
    assert "s3cr3t" not in repr(record.permissions)
