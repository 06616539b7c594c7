"""A hand-written runtime adapter for tests of the spawner's own rules.

It runs no CLI: each invocation records its spec, emits a tool call, then
waits on a gate the test controls, so concurrency tests decide exactly when a
run ends instead of sleeping and hoping. End-to-end behaviour is tested with
the real CLI elsewhere; this fake only isolates what the spawner decides.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from pathlib import Path
from typing import ClassVar

from spawnkit.events import AssistantText, EventSink, ToolCallFinished, ToolCallStarted
from spawnkit.result import ToolCall, Usage
from spawnkit.runtimes.base import McpServerSpec, RunOutcome, RunSpec, RuntimeAdapter


class Gate:
    """Lets a test release runs one at a time, or all at once."""

    def __init__(self, open_: bool = True) -> None:
        self._event = asyncio.Event()
        if open_:
            self._event.set()

    def open(self) -> None:
        self._event.set()

    async def wait(self) -> None:
        await self._event.wait()


class FakeAdapter(RuntimeAdapter):
    type: ClassVar[str] = "fake"
    binary_name: ClassVar[str] = "fake"
    install_hint: ClassVar[str] = "nothing to install"

    def __init__(self, config: object = None, *, parent: FakeAdapter | None = None) -> None:
        super().__init__(None)
        root = parent or self
        if parent is None:
            self.specs: list[RunSpec] = []
            self.gate = Gate()
            self.running = 0
            self.max_running = 0
            self.fail_with: Exception | None = None
            self.resets = 0
            self.workspaces: list[Path] = []
        self.root = root

    def create_worker(self) -> FakeAdapter:
        return FakeAdapter(parent=self.root)

    def reset(self) -> None:
        self.root.resets += 1

    def find_binary(self) -> Path:
        return Path("/bin/true")

    def build_config_file(self, workspace: Path, server: McpServerSpec) -> Path:
        path = workspace / "fake.json"
        path.write_text(server.url)
        return path

    async def invoke(self, spec: RunSpec, emit: EventSink) -> RunOutcome:
        root = self.root
        root.specs.append(spec)
        root.workspaces.append(spec.workspace)
        root.running += 1
        root.max_running = max(root.max_running, root.running)
        try:
            now = datetime.now(UTC)
            call = ToolCall.start(f"call-{len(root.specs)}", "mcp__x__state_get", {"key": "k"}, now)
            emit(ToolCallStarted(spec.session_id, call))
            await root.gate.wait()
            emit(ToolCallFinished(spec.session_id, call.finish("v", False, datetime.now(UTC))))
            emit(AssistantText(spec.session_id, f"answer to: {spec.prompt}"))
            if root.fail_with is not None:
                raise root.fail_with
            return RunOutcome(
                output=f"answer to: {spec.prompt}",
                usage=Usage(10, 5, 3, 2),
                cost_usd=0.001,
                runtime_session_id="fake-session",
                num_turns=1,
            )
        finally:
            root.running -= 1
