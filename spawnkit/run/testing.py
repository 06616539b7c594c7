"""Test doubles for code that uses spawnkit: :class:`MockSpawner`.

``MockSpawner`` stands in for a :class:`~spawnkit.run.Spawner` in a user's
own tests. It has the same ``trigger`` signature, records every invocation,
answers with canned results matched by prompt substring (first match wins), and
offers assertions that raise ``AssertionError`` when they do not hold::

    spawner = MockSpawner(responses={"weigh": SpawnerResult(output="72 kg")})
    await my_code(spawner)
    spawner.assert_triggered(times=1)
    spawner.assert_prompted_with("weigh")
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from ..config.limits import Limits
from ..containment.sources import Source
from ..events import EventSink
from ..permissions import Approver
from ..result import SpawnerResult
from .request import RunKind, validate_trigger_source

__all__ = ["Invocation", "MockSpawner"]


@dataclass(frozen=True)
class Invocation:
    prompt: str
    context: str | None
    trigger_source: str
    max_turns: int | None
    parent_session_id: str | None = None
    resume: str | None = None
    session_id: str | None = None
    role: str | None = None
    limits: Limits | None = None
    workdir: Path | None = None
    repo: str | Path | None = None  # recorded only: a mock run edits no worktree


class MockSpawner:
    """A spawner that runs nothing and remembers everything it was asked."""

    def __init__(
        self,
        responses: Mapping[str, SpawnerResult | str] | None = None,
        default: SpawnerResult | None = None,
    ) -> None:
        self.responses: dict[str, SpawnerResult] = {
            key: value if isinstance(value, SpawnerResult) else SpawnerResult(output=value)
            for key, value in (responses or {}).items()
        }
        self.default = default or SpawnerResult()
        self.invocations: list[Invocation] = []

    def add_response(self, substring: str, result: SpawnerResult | str) -> None:
        self.responses[substring] = (
            result if isinstance(result, SpawnerResult) else SpawnerResult(output=result)
        )

    async def trigger(
        self,
        prompt: str,
        trigger_source: str = "external",
        *,
        context: str | None = None,
        max_turns: int | None = None,
        on_event: EventSink | None = None,
        parent_session_id: str | None = None,
        resume: str | None = None,
        session_id: str | None = None,
        role: str | None = None,
        kind: RunKind = "run",
        sources: Sequence[Source] = (),
        limits: Limits | None = None,
        workdir: Path | None = None,
        queued_by: tuple[str, int] | None = None,  # a dispatched run's (see Spawner)
        approver: Approver | None = None,  # asked by no mock run
        repo: str | Path | None = None,
    ) -> SpawnerResult:
        validate_trigger_source(trigger_source)
        self.invocations.append(
            Invocation(
                prompt,
                context,
                trigger_source,
                max_turns,
                parent_session_id,
                resume,
                session_id,
                role,
                limits,
                workdir,
                repo,
            )
        )
        for substring, result in self.responses.items():
            if substring in prompt:
                return replace(result, tool_calls=list(result.tool_calls))
        return replace(self.default, tool_calls=list(self.default.tool_calls))

    @property
    def prompts(self) -> list[str]:
        return [inv.prompt for inv in self.invocations]

    def assert_triggered(self, times: int | None = None) -> None:
        """At least one trigger, or exactly ``times`` triggers."""
        count = len(self.invocations)
        if times is None and count == 0:
            raise AssertionError("expected at least one trigger, got none")
        if times is not None and count != times:
            raise AssertionError(f"expected {times} trigger(s), got {count}: {self.prompts!r}")

    def assert_prompted_with(self, substring: str) -> None:
        """Some trigger's prompt contains ``substring``."""
        if not any(substring in prompt for prompt in self.prompts):
            raise AssertionError(
                f"no trigger prompt contains {substring!r}; prompts were: {self.prompts!r}"
            )

    def reset(self) -> None:
        self.invocations.clear()
