"""The ``command`` runtime: any agent CLI, from configuration alone.

A butler names its CLI's command line in ``[butler.runtime]`` (``type = "command"``,
``command = [...]``) with placeholders spawnkit fills in per run: ``{prompt_file}`` (the
prompt, written to the workspace), ``{system_prompt_file}``, ``{mcp_config}`` (the
butler's MCP server, or none, as ``{"mcpServers": {...}}``), ``{workspace}`` (the run's
HOME), ``{cwd}``, ``{prompt}``, ``{base_url}``, ``{model}``, ``{sources}`` (an ask's
``- ./name/`` list) and ``{claude}``/``{codex}``/``{gemini}`` (those CLIs as spawnkit
finds them). ``{base_url}`` in ``env`` is the run's model relay, which swaps the real
model keys in for the placeholders the CLI gets (see :mod:`spawnkit.containment.relay`).
``prompt.md`` and ``system-prompt.md`` are written only when a command line or ``env``
names their placeholder or ``{workspace}``. ``{prompt}`` puts the prompt in the process's
arguments, which every local user can read and the kernel bounds: each run that uses it
logs a warning naming ``{prompt_file}`` and ``stdin = "prompt"``, which are neither. What it
prints is read by ``output``:

* ``text``: stdout is the answer;
* ``json-lines``: one JSON object a line, mapped to spawnkit's events by
  ``[butler.runtime.events]`` (:class:`~spawnkit.config.roster.EventMapping`);
* ``claude-stream-json``, ``codex-json``, ``gemini-stream-json``: the built-in CLIs'
  streams, read by those runtimes' own parsers; ``auto`` picks one from the first line.

Everything else (the isolated environment, the sandbox, the record) is the spawner's, as
for every runtime. A non-zero exit is always a failure.
"""

from __future__ import annotations

import json
import logging
import shutil
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, ClassVar

from ..config.butler_config import (
    PLACEHOLDER_RE,
    CommandConfig,
    EventMapping,
    RuntimeConfig,
    placeholders,
)
from ..containment.sandbox import node_install
from ..errors import ConfigError, RuntimeFailure, RuntimeNotFoundError
from ..events import (
    AssistantText,
    RunEvent,
    TextDelta,
    ToolCallFinished,
    ToolCallStarted,
    UsageUpdate,
)
from ..result import OUTPUT_LIMIT, ToolCall, Usage, truncate
from . import get_adapter
from .base import McpServerSpec, RunOutcome, RunSpec, write_private
from .streaming import LineParser, StreamingCliAdapter, stderr_summary

logger = logging.getLogger(__name__)

PROMPT_FILE = "prompt.md"
SYSTEM_PROMPT_FILE = "system-prompt.md"
MCP_CONFIG_FILE = "mcp.json"
# The built-in CLIs a command line may name as placeholders, by their runtime.
BINARIES: Mapping[str, str] = {"claude": "claude-code", "codex": "codex", "gemini": "gemini"}


def _now() -> datetime:
    return datetime.now(UTC)


def expand(template: str, values: Mapping[str, str]) -> str:
    """Replace each ``{name}`` by ``values[name]``; ``{{`` and ``}}`` are literal braces."""

    def one(match: Any) -> str:
        name = match.group(1)
        return str(match.group(0)[0]) if name is None else values[name]

    return PLACEHOLDER_RE.sub(one, template)


def _failure_text(exit_code: int, stderr: Sequence[str]) -> str:
    said = stderr_summary(stderr)
    return f"exited with code {exit_code}" + (f": {said}" if said else "")


class TextParser(LineParser):
    """Plain-text output: stdout, as it is, is the answer."""

    def __init__(self, session_id: str, server: str = "") -> None:
        super().__init__(session_id, server)
        self.lines: list[str] = []
        self.chars = 0

    def feed(self, line: str) -> list[RunEvent]:
        if self.chars < OUTPUT_LIMIT:
            self.lines.append(line)
            self.chars += len(line) + 1
        return [TextDelta(self.session_id, line + "\n")]

    def handle(self, data: dict[str, Any]) -> list[RunEvent]:
        return []  # never called: feed() takes every line as text

    def outcome(self, exit_code: int, stderr: Sequence[str]) -> RunOutcome:
        outcome = RunOutcome(output=truncate("\n".join(self.lines).strip(), OUTPUT_LIMIT))
        if exit_code != 0:
            outcome.success = False
            outcome.error_kind = "runtime_error"
            outcome.error = _failure_text(exit_code, stderr)
        return outcome


class JsonLinesParser(LineParser):
    """JSON lines -> spawnkit events, as an :class:`~spawnkit.config.roster.EventMapping` says."""

    def __init__(self, session_id: str, mapping: EventMapping, server: str = "") -> None:
        super().__init__(session_id, server)
        self.mapping = mapping
        self.calls: dict[str, ToolCall] = {}
        self.texts: list[str] = []
        self.answer: str | None = None
        self.usage = Usage()
        self.errors: list[str] = []
        self.failed_result = False
        self.unknown: dict[str, int] = {}

    def handle(self, data: dict[str, Any]) -> list[RunEvent]:
        m, sid = self.mapping, self.session_id
        if isinstance(found := data.get(m.session_field), str) and found:
            self.runtime_session_id = found
        kind = data.get(m.type_key)
        if kind == m.text:
            text = str(data.get(m.text_field) or "")
            if not text:
                return []
            self.texts.append(text)
            return [AssistantText(sid, text)]
        if kind == m.tool_call:
            call_id = str(data.get(m.id_field) or len(self.calls))
            raw = data.get(m.input_field)
            call = ToolCall.start(
                call_id, str(data.get(m.name_field) or "?"),
                raw if isinstance(raw, dict) else {"input": raw}, _now(),
            )  # fmt: skip
            self.calls[call_id] = call
            self.tool_calls += 1
            return [ToolCallStarted(sid, call)]
        if kind == m.tool_result:
            call_id = str(data.get(m.id_field))
            started = self.calls.get(call_id)
            if started is None:
                return []
            output = data.get(m.output_field)
            text = output if isinstance(output, str) else json.dumps(output, ensure_ascii=False)
            done = started.finish(text, bool(data.get(m.is_error_field)), _now())
            self.calls[call_id] = done
            return [ToolCallFinished(sid, done)]
        if kind == m.result:
            if (answer := data.get(m.answer_field)) is not None:
                self.answer = str(answer)
            self.failed_result = bool(data.get(m.is_error_field))
            usage = data.get(m.usage_field)
            if isinstance(usage, dict):
                self.usage = Usage(
                    input_tokens=int(usage.get("input_tokens") or 0),
                    output_tokens=int(usage.get("output_tokens") or 0),
                    cache_read_tokens=int(usage.get("cache_read_tokens") or 0),
                    cache_write_tokens=int(usage.get("cache_write_tokens") or 0),
                )
                return [UsageUpdate(sid, self.usage, None, None)]
            return []
        if kind == m.error:
            self.errors.append(str(data.get(m.message_field) or data))
            return []
        # Counted and reported once at the end, not dropped without a trace.
        self.unknown[str(kind)] = self.unknown.get(str(kind), 0) + 1
        return []

    def outcome(self, exit_code: int, stderr: Sequence[str]) -> RunOutcome:
        if self.unknown:
            logger.info(
                "command runtime: lines of kinds it does not map were skipped: %s",
                ", ".join(f"{k} ({n})" for k, n in sorted(self.unknown.items())),
            )
        answer = self.answer if self.answer is not None else (self.texts or [""])[-1]
        outcome = RunOutcome(
            output=truncate(answer, OUTPUT_LIMIT),
            runtime_session_id=self.runtime_session_id,
            usage=self.usage,
        )
        if exit_code == 0 and not self.errors and not self.failed_result:
            return outcome
        outcome.success = False
        outcome.output = truncate("\n\n".join(self.texts), OUTPUT_LIMIT)
        outcome.error_kind = "runtime_error"
        detail = "; ".join(self.errors) or (self.answer if self.failed_result else None)
        outcome.error = (
            detail if detail and exit_code == 0 else _failure_text(exit_code, stderr)
        ) + (f": {detail}" if detail and exit_code != 0 else "")
        return outcome


def detect_output(first_line: str) -> str:
    """Which stream a CLI prints, judged from its first non-blank stdout line."""
    try:
        data = json.loads(first_line)
    except ValueError:
        return "text"
    kind = data.get("type") if isinstance(data, dict) else None
    if kind in ("system", "stream_event", "assistant", "result"):
        return "claude-stream-json"
    if kind in ("thread.started", "turn.started", "item.started", "item.completed"):
        return "codex-json"
    if kind in ("init", "message", "tool_use"):
        return "gemini-stream-json"
    return "json-lines" if isinstance(data, dict) and kind is not None else "text"


class AutoParser(LineParser):
    """Picks the parser from the first non-blank line, then hands every line to it."""

    def __init__(self, session_id: str, make: Callable[[str], LineParser]) -> None:
        super().__init__(session_id, "")
        self.make = make
        self.inner: LineParser | None = None

    def feed(self, line: str) -> list[RunEvent]:
        if self.inner is None:
            if not line.strip():
                return []
            self.inner = self.make(detect_output(line))
        events = self.inner.feed(line)
        self.tool_calls = self.inner.tool_calls
        self.bad_lines = self.inner.bad_lines
        return events

    def handle(self, data: dict[str, Any]) -> list[RunEvent]:
        return []  # never called: feed() delegates

    def stderr_line(self, line: str) -> None:
        if self.inner is not None:
            self.inner.stderr_line(line)

    def outcome(self, exit_code: int, stderr: Sequence[str]) -> RunOutcome:
        return (self.inner or TextParser(self.session_id)).outcome(exit_code, stderr)


class CommandAdapter(StreamingCliAdapter):
    """Runs the command line of ``[butler.runtime] type = "command"``."""

    type: ClassVar[str] = "command"
    binary_name: ClassVar[str] = "command"
    binary_env: ClassVar[str] = "SPAWNKIT_COMMAND_CLI"
    install_hint: ClassVar[str] = (
        "install it, or change [butler.runtime] command to a program that exists"
    )
    auth_remedy: ClassVar[str] = "check the variables the CLI needs ([butler.env])"

    # It has no CLI of its own to look for: each butler names one.
    needs_configuration: ClassVar[bool] = True

    def __init__(self, config: RuntimeConfig | None = None) -> None:
        super().__init__(config)

    @property
    def command_config(self) -> CommandConfig:
        if self.config.command is None:
            raise ConfigError(
                'the command runtime needs [butler.runtime] command = ["program", ...]'
            )
        return self.config.command

    def model_via_base_url(self) -> bool:
        """When ``{base_url}`` is in the CLI's environment (``[butler.runtime] env``) and on
        none of its command lines: the run's relay then carries its model calls, and it gets
        placeholders for the model keys. A URL on a command line would put the relay's
        secret where every local user can read it, so such a CLI gets the upstream's URL
        and the real keys, as it always has."""
        config = self.config.command
        if config is None or not any("base_url" in placeholders(v) for v in config.env.values()):
            return False
        argvs = (config.argv, config.resume_argv, config.chat_argv)
        return not any("base_url" in placeholders(arg) for argv in argvs for arg in argv)

    def capabilities(self) -> dict[str, Any]:
        # Unconfigured (the adapter contract asks every runtime): nothing to resume or say.
        config = self.config.command or CommandConfig(argv=())
        return {
            **super().capabilities(),
            "supports_resume": bool(config.resume_argv),
            "supports_system_prompt": any("system_prompt_file" in arg for arg in config.argv),
        }

    def _find(self, program: str) -> Path:
        """A command line's program: a built-in CLI's placeholder, a path, or a name on PATH."""
        builtin = BINARIES.get(program.strip("{}")) if program.startswith("{") else None
        if builtin is not None:
            return get_adapter(builtin)().find_binary()
        found = shutil.which(str(Path(program).expanduser()))
        if found is None:
            raise RuntimeNotFoundError(self.type, program, self.install_hint)
        return Path(found)

    def locate_binary(self) -> Path:
        return self._find(self.command_config.argv[0])

    async def binary_version(self) -> str | None:
        return None  # an arbitrary CLI has no known way to print its version

    def find_install_paths(self) -> list[Path]:
        """The programs' folders (a node CLI's whole tree) and the files their argv name.

        Those of ``command`` and, when it has one, of ``chat_command``.
        """
        config = self.command_config
        paths: list[Path] = []
        for argv in (config.argv, config.chat_argv):
            if not argv:
                continue
            try:
                binary = self.find_binary() if argv is config.argv else self._find(argv[0])
            except RuntimeNotFoundError:
                continue  # the other mode's program: checked before a run of its mode
            real = binary.resolve()
            if "node_modules" in real.parts:
                paths += node_install(real)
            else:
                # <prefix>/bin/program: the whole prefix (an interpreter's library, a venv).
                paths += [
                    folder.parent
                    if folder.name == "bin" and folder.parent != Path("/usr")
                    else folder
                    for folder in dict.fromkeys((binary.parent, real.parent))
                ]
            for arg in argv[1:]:
                named = Path(arg)
                if not PLACEHOLDER_RE.search(arg) and named.is_absolute() and named.exists():
                    paths.append(named.resolve())
        return list(dict.fromkeys(paths))

    def build_config_file(self, workspace: Path, server: McpServerSpec | None) -> Path:
        """``{mcp_config}``: ``{"mcpServers": {...}}``, the shape most agent CLIs read."""
        servers: dict[str, Any] = {}
        if server is not None:
            entry: dict[str, Any] = {"type": server.transport, "url": server.url}
            if server.headers:
                entry["headers"] = server.headers
            servers[server.name] = entry
        path = workspace / MCP_CONFIG_FILE
        write_private(path, json.dumps({"mcpServers": servers}, indent=2))
        return path

    def _values(self, spec: RunSpec) -> dict[str, str]:
        sources = sorted(p for p in spec.cwd.iterdir() if p.is_symlink()) if spec.add_dirs else []
        values = {
            "prompt_file": str(spec.workspace / PROMPT_FILE),
            "system_prompt_file": str(spec.workspace / SYSTEM_PROMPT_FILE),
            "mcp_config": str(spec.config_file),
            "workspace": str(spec.workspace),
            "cwd": str(spec.cwd),
            "prompt": spec.prompt,
            "base_url": spec.base_url or "",
            "model": spec.model or "",
            "resume": spec.resume or "",
            "sources": "\n".join(f"- ./{p.name}{'/' if p.is_dir() else ''}" for p in sources),
        }
        config = self.command_config
        wanted = {
            name
            for arg in (*config.argv, *config.resume_argv, *config.chat_argv)
            for name in placeholders(arg)
        }
        for placeholder, runtime in BINARIES.items():
            if placeholder in wanted:
                values[placeholder] = str(get_adapter(runtime)().find_binary().resolve())
        return values

    def child_env(self, spec: RunSpec) -> dict[str, str]:
        tmp = spec.workspace / "tmp"
        tmp.mkdir(exist_ok=True, mode=0o700)
        env = dict(spec.env)
        env.update({"HOME": str(spec.workspace), "TMPDIR": str(tmp)})
        env.setdefault("NO_COLOR", "1")
        values = self._values(spec)
        env.update({k: expand(v, values) for k, v in self.command_config.env.items()})
        return env

    def _warn_of_prompt_in_argv(self, spec: RunSpec) -> None:
        """Once per run: ``{prompt}`` puts the prompt where every local user can read it."""
        warning = self.command_config.prompt_on_command_line()
        if warning is not None:
            logger.warning("butler %r, session %s: %s", spec.butler, spec.session_id, warning)

    def _files_read(self) -> tuple[bool, bool]:
        """Whether a run's CLI may read ``prompt.md`` and ``system-prompt.md``: when its
        command lines or ``env`` name them, or name ``{workspace}`` (a path built on it).
        A file no placeholder leads to is not written (two creates and two unlinks a run)."""
        config = self.command_config
        named = {
            name
            for arg in (*config.argv, *config.resume_argv, *config.chat_argv, *config.env.values())
            for name in placeholders(arg)
        }
        on_workspace = "workspace" in named
        return on_workspace or "prompt_file" in named, (
            on_workspace or "system_prompt_file" in named
        )

    def command(self, spec: RunSpec) -> list[str]:
        self._warn_of_prompt_in_argv(spec)
        prompt_read, system_prompt_read = self._files_read()
        if prompt_read:
            write_private(spec.workspace / PROMPT_FILE, spec.prompt)
        if system_prompt_read:
            write_private(spec.workspace / SYSTEM_PROMPT_FILE, spec.system_prompt)
        template = self.command_config.argv
        if spec.resume:
            if not self.command_config.resume_argv:
                raise RuntimeFailure(
                    "this command runtime cannot resume: it has no resume_command",
                    "runtime_error",
                )
            template = self.command_config.resume_argv
        values = self._values(spec)
        argv = [expand(arg, values) for arg in template]
        if not PLACEHOLDER_RE.search(template[0]):
            argv[0] = str(self.find_binary())
        return argv

    def check_interactive(self) -> None:
        if not self.command_config.chat_argv:
            raise ConfigError(
                "this command runtime cannot chat: it has no chat_command "
                "(the command line of an interactive session)"
            )
        self._find(self.command_config.chat_argv[0])

    def interactive_command(self, spec: RunSpec) -> list[str]:
        """``chat_command``, expanded like ``command`` (``{resume}``: the session it continues)."""
        self.check_interactive()
        self._warn_of_prompt_in_argv(spec)
        if self._files_read()[1]:
            write_private(spec.workspace / SYSTEM_PROMPT_FILE, spec.system_prompt)
        template = self.command_config.chat_argv
        argv = [expand(arg, self._values(spec)) for arg in template]
        if not PLACEHOLDER_RE.search(template[0]):
            argv[0] = str(self._find(template[0]))
        return argv

    def stdin(self, spec: RunSpec) -> bytes | None:
        return spec.prompt.encode("utf-8") if self.command_config.stdin == "prompt" else None

    def parser(self, spec: RunSpec) -> LineParser:
        server = spec.mcp_server.name if spec.mcp_server else ""
        output = self.command_config.output
        if output == "auto":
            return AutoParser(spec.session_id, lambda found: self._parser(found, spec, server))
        return self._parser(output, spec, server)

    def _parser(self, output: str, spec: RunSpec, server: str) -> LineParser:
        if output == "json-lines":
            return JsonLinesParser(spec.session_id, self.command_config.events, server)
        if output == "codex-json":
            from .codex import CodexParser

            return CodexParser(spec.session_id, server)
        if output == "gemini-stream-json":
            from .gemini import GeminiParser

            return GeminiParser(spec.session_id, server)
        if output == "claude-stream-json":
            from .claude_code import ClaudeStreamParser

            return ClaudeStreamParser(spec)
        return TextParser(spec.session_id, server)
