"""The Spawner's collaborators, each alone: admission, the request checks, recording.

The Spawner's own tests (test_spawner.py and others) cover them together; these show that
each part is usable, and testable, with nothing but the settings it reads.
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from types import SimpleNamespace
from typing import cast

import pytest

from spawnkit.containment.sources import Source
from spawnkit.errors import InvalidArgument, QueueFullError
from spawnkit.events import RunEvent, TextDelta, ToolCallStarted, UsageUpdate
from spawnkit.redaction import Redactor
from spawnkit.result import SpawnerResult, ToolCall, Usage
from spawnkit.run.admission import Admissions
from spawnkit.run.collector import Collector
from spawnkit.run.recording import Recorder
from spawnkit.run.request import checked_run_arguments
from spawnkit.run.settings import RunSettings
from spawnkit.store import SessionStore

from .conftest import RosterFactory

ONE_SLOT = """
[butler.runtime]
max_concurrent_sessions = 1
max_queued_sessions = 1
"""


def settings(**values: object) -> RunSettings:
    """Only the attributes a part reads: the part under test says which."""
    return cast(RunSettings, SimpleNamespace(**values))


async def test_admissions_queue_then_refuse_and_reject_a_self_trigger(
    make_butler: RosterFactory, store: SessionStore
) -> None:
    admissions = Admissions(settings(butler=make_butler(extra=ONE_SLOT), store=store))
    assert admissions.refuse_if_full("external") is None
    admissions.pending += 1  # one accepted: it takes the slot
    assert admissions.refuse_if_full("external") is None, "the next one queues"
    rejected = admissions.refuse_if_full("trigger")
    assert rejected is not None and rejected.error_kind == "rejected"
    admissions.pending += 1  # the queued one
    with pytest.raises(QueueFullError, match="1 queued"):
        admissions.refuse_if_full("external")
    async with admissions.slot():
        assert (admissions.active, admissions.pending, admissions.queued()) == (1, 1, 1)
    assert admissions.active == 0
    assert await admissions.shared_place("external") is None, "SQLite: no places across hosts"


def test_run_arguments_that_do_not_go_together_are_refused(tmp_path: Path) -> None:
    source = Source(name="notes", path=tmp_path, kind="directory", added_at=datetime.now(UTC))
    with pytest.raises(InvalidArgument, match="ask and chat runs only"):
        checked_run_arguments(
            role=None, session_id=None, kind="run", sources=[source], workdir=None
        )
    with pytest.raises(InvalidArgument, match="not a workdir"):
        checked_run_arguments(role=None, session_id=None, kind="ask", sources=(), workdir=tmp_path)
    with pytest.raises(InvalidArgument, match="invalid role name"):
        checked_run_arguments(role="No Role", session_id=None, kind="run", sources=(), workdir=None)
    folder = checked_run_arguments(
        role="reviewer", session_id="s-1", kind="run", sources=(), workdir=tmp_path / "."
    )
    assert folder == tmp_path.resolve()


def test_an_unfinished_result_closes_running_calls_and_is_redacted() -> None:
    seen: list[RunEvent] = []
    collector = Collector("s-1", [seen.append], Redactor({"API_KEY": "sekrit-value"}))
    call = ToolCall.start("c1", "Bash", {"command": "echo sekrit-value"}, datetime.now(UTC))
    collector.emit(ToolCallStarted("s-1", call))
    recorder = Recorder(settings(model="some-model"))

    result = recorder.unfinished(collector, "cancelled", "the run was cancelled", "cancelled")

    assert isinstance(result, SpawnerResult) and result.status == "cancelled"
    assert result.model == "some-model" and len(seen) == 1
    (closed,) = result.tool_calls
    assert closed.finished_at is not None and closed.status == "error"
    assert "sekrit-value" not in repr(result)


def test_an_event_from_beside_the_stream_does_not_cut_a_secret_in_two() -> None:
    """The relay's meter (a usage update) may land between two deltas of a secret, as it did
    in a loaded run of Gemini: the stream keeps the first letters it holds, and the secret
    is still redacted whole. An event that ends the text (a tool call) flushes what is held."""
    seen: list[RunEvent] = []
    collector = Collector("s-1", [seen.append], Redactor({"API_KEY": "sekrit-value"}))
    for event in (
        TextDelta("s-1", "the key is sek"),
        UsageUpdate("s-1", Usage(input_tokens=5), None, 1),
        TextDelta("s-1", "rit-value, and more: sekr"),
        ToolCallStarted("s-1", ToolCall.start("c1", "Bash", {}, datetime.now(UTC))),
    ):
        collector.emit(event)
    streamed = "".join(e.text for e in seen if isinstance(e, TextDelta))
    assert streamed == "the key is [redacted:API_KEY], and more: sekr"
    kinds = [type(e).__name__ for e in seen]
    assert kinds.index("UsageUpdate") < kinds.index("ToolCallStarted")
    assert kinds[-2:] == ["TextDelta", "ToolCallStarted"], "the held tail goes out before the call"
