"""What the runtimes spawnkit runs directly (Codex, Gemini) share: a JSON-lines CLI.

A :class:`StreamingCliAdapter` writes the run's private configuration, starts
the CLI through :func:`spawnkit._process.run_lines` (exact environment, own
process group, bounded lines) and hands each stdout line to the runtime's
:class:`LineParser`, a pure object that turns lines into spawnkit events and,
at the end, into a :class:`~spawnkit.runtimes.base.RunOutcome`. Parsers never
see a process, so they are tested on recorded lines from the real CLIs.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from .. import _process
from ..containment.sandbox import node_install
from ..errors import RuntimeFailure, RuntimeNotFoundError
from ..events import EventSink, RunEvent
from .base import MCP_UNAVAILABLE, RunOutcome, RunSpec, RuntimeAdapter, mcp_unavailable_message
from .npm_clis import found_in_installed

logger = logging.getLogger(__name__)

STDERR_TAIL_LINES = 50


def find_cli(runtime: str, name: str, env_var: str, install_hint: str) -> Path:
    """``$env_var``, else what ``spawnkit install-clis`` installed (the pinned versions), else
    ``name`` on PATH, else a ``node_modules/.bin`` nearby."""
    configured = os.environ.get(env_var)
    if configured:
        path = Path(configured).expanduser()
        if path.is_file() and os.access(path, os.X_OK):
            return path
        raise RuntimeNotFoundError(runtime, f"{configured} (from ${env_var})", install_hint)
    installed = found_in_installed(name)
    if installed is not None:
        return installed
    on_path = shutil.which(name)
    if on_path:
        return Path(on_path)
    # A project-local install: the current directory, or this package's checkout.
    for root in (Path.cwd(), Path(__file__).resolve().parents[2]):
        local = root / "node_modules" / ".bin" / name
        if local.is_file() and os.access(local, os.X_OK):
            return local
    raise RuntimeNotFoundError(runtime, name, install_hint)


_ERROR_LINE = re.compile(r"\b(error|fatal|invalid|unexpected|denied|refused|failed)\b", re.I)


def stderr_summary(lines: Sequence[str], noise: Sequence[str] = ()) -> str | None:
    """The line of a CLI's stderr that says why it failed.

    The last line that reads like an error (a usage text after ``error: ...`` is not the
    reason), else the last meaningful line; ``noise`` lists fragments of lines to skip.
    """
    meaningful = [
        line.strip() for line in lines if line.strip() and not any(n in line for n in noise)
    ]
    errors = [line for line in meaningful if _ERROR_LINE.search(line)]
    chosen = errors[-1] if errors else (meaningful[-1] if meaningful else None)
    return None if chosen is None else chosen[:500]


class LineParser(ABC):
    """Turns one runtime's stdout lines into events; pure and incremental."""

    def __init__(self, session_id: str, server: str) -> None:
        self.session_id = session_id
        self.server = server
        self.bad_lines = 0
        self.tool_calls = 0
        self.runtime_session_id: str | None = None
        # Set when the CLI shows that the butler's MCP server never connected (how, in
        # its words): such a run failed, whatever the model then answered.
        self.mcp_failure: str | None = None

    def stderr_line(self, line: str) -> None:  # noqa: B027 - most CLIs say nothing there
        """Look at one stderr line as it arrives (default: nothing to learn from it)."""

    def feed(self, line: str) -> list[RunEvent]:
        """Events for one stdout line; lines that are not JSON objects are counted."""
        text = line.strip()
        if not text:
            return []
        try:
            data = json.loads(text)
        except ValueError:
            self.bad_lines += 1
            return []
        if not isinstance(data, dict):
            self.bad_lines += 1
            return []
        return self.handle(data)

    @abstractmethod
    def handle(self, data: dict[str, Any]) -> list[RunEvent]:
        """Events for one decoded JSON object."""

    def ended(self) -> list[RunEvent]:
        """Events once the CLI has exited, from what only its files say (default: none)."""
        return []

    @abstractmethod
    def outcome(self, exit_code: int, stderr: Sequence[str]) -> RunOutcome:
        """The run's outcome once the CLI has exited."""


class _TurnLimit(Exception):
    """Raised inside the stdout callback when a run exceeds its max_turns."""


@dataclass
class _Lookups:
    """What an adapter found on this machine, shared by the workers of its runs; a run
    that fails resets it, so the next run looks again."""

    binary: Path | None = None
    installed: list[Path] | None = None


class StreamingCliAdapter(RuntimeAdapter):
    """Base of adapters that run a JSON-lines CLI as a subprocess."""

    binary_env: ClassVar[str]
    # Whether the CLI enforces max_turns itself; if not, spawnkit counts tool calls.
    native_turn_limit: ClassVar[bool] = False
    # Whether the CLI's stdout must be a file, not a pipe (see _process.run_lines).
    stdout_to_file: ClassVar[bool] = False

    def __init__(self, config: Any = None) -> None:
        super().__init__(config)
        self._lookups = _Lookups()

    def capabilities(self) -> dict[str, Any]:
        if self.native_turn_limit:
            return super().capabilities()
        return {
            **super().capabilities(),
            "supports_max_turns": False,
            "max_turns_enforced_by": "spawnkit (tool calls are counted)",
        }

    def create_worker(self) -> RuntimeAdapter:
        worker = super().create_worker()
        if isinstance(worker, StreamingCliAdapter):
            worker._lookups = self._lookups  # found once for all of this adapter's runs
        return worker

    def reset(self) -> None:
        self._lookups.binary = None
        self._lookups.installed = None

    def find_binary(self) -> Path:
        lookups = self._lookups
        if lookups.binary is None:
            lookups.binary = self.locate_binary()
        return lookups.binary

    def locate_binary(self) -> Path:
        return find_cli(self.type, self.binary_name, self.binary_env, self.install_hint)

    def install_paths(self) -> list[Path]:
        """Looked up once, like the binary (every sandboxed run binds them), until reset."""
        lookups = self._lookups
        if lookups.installed is None:
            lookups.installed = self.find_install_paths()
        return list(lookups.installed)

    def find_install_paths(self) -> list[Path]:
        return node_install(self.find_binary())

    @abstractmethod
    def command(self, spec: RunSpec) -> list[str]:
        """The CLI's argv for this run."""

    @abstractmethod
    def parser(self, spec: RunSpec) -> LineParser:
        """A fresh parser for this run's output."""

    def stdin(self, spec: RunSpec) -> bytes | None:
        return None

    def cli(self) -> str:
        """The CLI's path as the command line names it (real, so the sandbox's view has it)."""
        return str(self.find_binary().resolve())

    async def invoke(self, spec: RunSpec, emit: EventSink) -> RunOutcome:
        parser = self.parser(spec)
        stderr: deque[str] = deque(maxlen=STDERR_TAIL_LINES)
        limited = False

        def on_stdout(line: str, truncated: bool) -> None:
            nonlocal limited
            if spec.log is not None:
                spec.log.stdout(line)
            if truncated:
                parser.bad_lines += 1
                return
            for event in parser.feed(line):
                emit(event)
            if not self.native_turn_limit and parser.tool_calls > spec.max_turns:
                limited = True
                raise _TurnLimit

        def on_stderr(line: str, truncated: bool) -> None:
            if spec.log is not None:
                spec.log.stderr(line)
            stderr.append(line)
            parser.stderr_line(line)

        try:
            code = await _process.run_lines(
                spec.sandbox.wrap(self.command(spec)), env=self.child_env(spec), cwd=spec.cwd,
                on_stdout=on_stdout, on_stderr=on_stderr, stdin=self.stdin(spec),
                stdout_via_file=self.stdout_to_file,
            )  # fmt: skip
        except _TurnLimit:
            code = -1
        except FileNotFoundError as exc:
            raise RuntimeNotFoundError(self.type, self.binary_name, self.install_hint) from exc
        except OSError as exc:
            raise RuntimeFailure(f"cannot start {self.binary_name}: {exc}", "crash") from exc
        for event in parser.ended():
            emit(event)
        outcome = parser.outcome(code, list(stderr))
        outcome.exit_code = None if limited else code
        if parser.mcp_failure is not None and spec.mcp_server is not None and not limited:
            outcome.success = False
            outcome.error_kind = MCP_UNAVAILABLE
            outcome.error = mcp_unavailable_message(spec.mcp_server, parser.mcp_failure)
        if limited:
            outcome.success = False
            outcome.error_kind = "max_turns"
            outcome.error = (
                f"stopped after {spec.max_turns} tool calls: {self.binary_name} has no turn "
                "limit of its own, so spawnkit enforces max_turns by counting tool calls"
            )
        if parser.bad_lines:
            logger.warning(
                "%s: %d unparseable output lines in session %s (see its stdout.log)",
                self.type, parser.bad_lines, spec.session_id,
            )  # fmt: skip
        return outcome
