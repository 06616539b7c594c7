"""The ``claude-code`` runtime: Claude Code, through ``claude-agent-sdk``.

The CLI is the one bundled in the ``claude-agent-sdk`` wheel (or ``claude`` on
PATH). Each run gets the composed system prompt, exactly the butler's MCP
server (``--strict-mcp-config``), no user or project settings
(``setting_sources=[]``), the butler's built-in tools plus its MCP tools
pre-approved (``dontAsk`` denies anything else), and a runtime session id
chosen up front so the MCP URL can carry it. The CLI's messages become
spawnkit events as they arrive; nothing is buffered until the end.

Two ways to drive it, one command line (the SDK builds it from the same
:class:`ClaudeAgentOptions`) and one reading of its messages (the SDK's parser and types,
folded by :class:`_RunState`):

* a run that needs the SDK's control protocol, one asked about tools
  (``[butler.permissions] ask``: the SDK's permission callback) or one with sub-agent
  roles (the SDK sends them in its initialize request), goes through
  ``claude_agent_sdk.query()``: the CLI reads stream-json on stdin and answers the SDK's
  requests;
* every other run is ``claude --print`` with the prompt on stdin
  (:meth:`ClaudeCodeAdapter.print_command`), its stream-json read line by line. Side by
  side, 30 rounds on an idle machine, such a run took 0.948 [0.877, 0.991] of the wall time
  of the same run through the SDK, and 0.933 of its CPU (``docs/benchmarks.md``, spawn
  overhead).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import os
import re
import shutil
import sys
import uuid
from collections import deque
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, ClassVar

from claude_agent_sdk import (
    AgentDefinition,
    AssistantMessage,
    ClaudeAgentOptions,
    ClaudeSDKError,
    CLIConnectionError,
    CLIJSONDecodeError,
    CLINotFoundError,
    Message,
    ProcessError,
    ResultMessage,
    StreamEvent,
    SystemMessage,
    TextBlock,
    ToolResultBlock,
    ToolUseBlock,
    UserMessage,
    query,
)
from claude_agent_sdk._errors import MessageParseError
from claude_agent_sdk._internal.message_parser import parse_message
from claude_agent_sdk._internal.transport.subprocess_cli import SubprocessCLITransport
from claude_agent_sdk.types import (
    CanUseTool,
    McpHttpServerConfig,
    McpSSEServerConfig,
    PermissionResult,
    PermissionResultAllow,
    PermissionResultDeny,
    SystemPromptFile,
    ToolPermissionContext,
)

from .. import _process
from ..errors import ProtocolError, RuntimeCrashed, RuntimeFailure, RuntimeNotFoundError
from ..events import (
    AssistantText,
    EventSink,
    RunEvent,
    TextDelta,
    ToolCallFinished,
    ToolCallStarted,
    UsageUpdate,
)
from ..permissions import NO_APPROVER, PermissionRequest
from ..result import OUTPUT_LIMIT, ToolCall, Usage, truncate
from ..telemetry.otlp import CliTelemetry
from ..telemetry.runlog import RunLog
from ..transcripts import copy_file
from .base import (
    MCP_UNAVAILABLE,
    McpServerSpec,
    RunOutcome,
    RunSpec,
    RuntimeAdapter,
    classify_failure,
    mcp_unavailable_message,
    write_private,
)
from .streaming import STDERR_TAIL_LINES, LineParser, stderr_summary

logger = logging.getLogger(__name__)

# Variables the SDK adds to the child's environment after we hand it ours.
_SDK_ENV = (
    "CLAUDE_CODE_ENTRYPOINT",
    "CLAUDE_AGENT_SDK_VERSION",
    "CLAUDE_AGENT_SDK_CLIENT_APP",
    "CLAUDE_CODE_SDK_READS_SESSION_STATE",
    "CLAUDE_CODE_ENABLE_SDK_FILE_CHECKPOINTING",
    "PWD",
)
# The SDK runs `claude -v` before every connect unless told not to; spawnkit
# checks the version once per process instead (see binary_version()).
_SKIP_VERSION_CHECK = "CLAUDE_AGENT_SDK_SKIP_VERSION_CHECK"
# Points the adapter at a specific Claude Code binary.
BINARY_ENV = "SPAWNKIT_CLAUDE_CLI"
# The model name Claude Code gives messages it wrote itself (API error notices).
_SYNTHETIC = "<synthetic>"
# How long the SDK may take to wind down after we stop reading.
_CLOSE_TIMEOUT_S = 10.0


def telemetry_env(telemetry: CliTelemetry) -> dict[str, str]:
    """Claude Code's own OpenTelemetry settings: spans (a beta), metrics and log events
    (``api_request``, ``tool_result``, ...) to the run's receiver.

    Its spans join the run's trace through ``TRACEPARENT`` (set by the spawner);
    prompts stay out (``OTEL_LOG_USER_PROMPTS`` off). Log events go out every second
    (``OTEL_LOGS_EXPORT_INTERVAL``, 5 s by default) so the run's timings show while it runs.
    A signal not chosen (``telemetry.signals``) has exporter ``none``; without spans the
    beta stays off.
    """

    def exporter(signal: str) -> str:
        return "otlp" if signal in telemetry.signals else "none"

    env = {
        "CLAUDE_CODE_ENABLE_TELEMETRY": "1",
        "OTEL_TRACES_EXPORTER": exporter("traces"),
        "OTEL_METRICS_EXPORTER": exporter("metrics"),
        "OTEL_LOGS_EXPORTER": exporter("logs"),
        "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
        "OTEL_EXPORTER_OTLP_ENDPOINT": telemetry.endpoint,
        "OTEL_EXPORTER_OTLP_HEADERS": ",".join(f"{k}={v}" for k, v in telemetry.headers.items()),
        "OTEL_RESOURCE_ATTRIBUTES": telemetry.resource_attributes,
        "OTEL_LOG_USER_PROMPTS": "0",
        "OTEL_LOGS_EXPORT_INTERVAL": "1000",
    }
    if "traces" in telemetry.signals:
        env["CLAUDE_CODE_ENHANCED_TELEMETRY_BETA"] = "1"
    return env


def _bundled_cli() -> Path | None:
    import claude_agent_sdk

    path = Path(claude_agent_sdk.__file__).parent / "_bundled" / "claude"
    return path if path.is_file() and os.access(path, os.X_OK) else None


def _now() -> datetime:
    return datetime.now(UTC)


def project_dir_name(cwd: Path) -> str:
    """Claude Code's folder name for a working directory: every other character a dash."""
    return re.sub(r"[^A-Za-z0-9]", "-", str(cwd))


# Claude Code's first start in an empty home runs its settings migrations and records
# that in ~/.claude.json. Every run's home is empty, so every run paid for it (about 20 ms
# of a 0.6 s run in benchmarks/spawn_overhead.py). Seeding the home with what the first
# start records skips that work; there is nothing in an empty home to migrate. The number
# is the pinned CLI's (2.1.x); a newer CLI only runs the migrations it added.
_HOME_SEED = {
    "migrationVersion": 15,
    "opusProMigrationComplete": True,
    "hasResetAutoModeOptInForDefaultOffer": True,
}


def seed_home(home: Path, *, trust: Sequence[Path] = (), api_key: str | None = None) -> None:
    """Write the CLI's first-start record into a fresh home (never over an existing one).

    For an interactive session, ``trust`` are the folders whose trust question is answered
    (the working directory and each ``--add-dir``) and ``api_key`` a key whose approval
    question is: the TUI asks both before its prompt.
    """
    config = home / ".claude.json"
    if config.exists():
        return
    seed: dict[str, Any] = {"firstStartTime": datetime.now(UTC).isoformat(), **_HOME_SEED}
    if trust:
        seed["hasCompletedOnboarding"] = True
        seed["projects"] = {str(folder): {"hasTrustDialogAccepted": True} for folder in trust}
        # The TUI remembers a key by its last 20 characters.
        approved = [api_key[-20:]] if api_key else []
        seed["customApiKeyResponses"] = {"approved": approved, "rejected": []}
    write_private(config, json.dumps(seed, indent=2))


def _tmpdir(workspace: Path) -> Path:
    path = workspace / "tmp"
    path.mkdir(exist_ok=True, mode=0o700)
    return path


def tool_result_text(content: str | list[dict[str, Any]] | None) -> str:
    """Flatten a tool_result's content (a string or a list of blocks) to text."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    parts = []
    for block in content:
        if block.get("type") == "text":
            parts.append(str(block.get("text", "")))
        else:
            parts.append(f"[{block.get('type', 'block')}]")
    return "\n".join(parts)


def usage_from_api(raw: dict[str, Any] | None) -> Usage:
    raw = raw or {}
    return Usage(
        input_tokens=int(raw.get("input_tokens") or 0),
        output_tokens=int(raw.get("output_tokens") or 0),
        cache_read_tokens=int(raw.get("cache_read_input_tokens") or 0),
        cache_write_tokens=int(raw.get("cache_creation_input_tokens") or 0),
    )


def _latest(old: Usage | None, new: Usage) -> Usage:
    """One message's usage from two reports of it: the API's counts only ever grow."""
    if old is None:
        return new
    return Usage(
        max(old.input_tokens, new.input_tokens),
        max(old.output_tokens, new.output_tokens),
        max(old.cache_read_tokens, new.cache_read_tokens),
        max(old.cache_write_tokens, new.cache_write_tokens),
    )


class _ReaderErrorFilter(logging.Filter):
    """Demotes the SDK's "Fatal error in message reader" log record to DEBUG.

    The SDK logs it at ERROR when the CLI exits non-zero, then hands the same
    error to the adapter, which reports it as the run's error (or, after a
    cancellation that killed the CLI on purpose, as a cancel). Left at ERROR,
    Python's last-resort handler prints it on the notebook's stderr as a second,
    alarming copy of what the run view already says.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno >= logging.ERROR and "Fatal error in message reader" in str(record.msg):
            record.levelno, record.levelname = logging.DEBUG, "DEBUG"
            return logging.getLogger(record.name).isEnabledFor(logging.DEBUG)
        return True


_READER_FILTER = _ReaderErrorFilter()


class _RunState:
    """Folds SDK messages into events and the final outcome for one run."""

    def __init__(self, spec: RunSpec, emit: EventSink) -> None:
        self.spec = spec
        self.emit = emit
        self.calls: dict[str, ToolCall] = {}
        self.text_parts: list[str] = []
        self.text_chars = 0
        self.usage_by_message: dict[str, Usage] = {}
        # The message each stream (the main agent's, or a sub-agent's) is in.
        self.streaming_message: dict[str | None, str] = {}
        self.result: ResultMessage | None = None
        self.model: str | None = spec.model
        self.runtime_session_id = spec.runtime_session_id
        self.mcp_status: str | None = None
        # The end of the CLI's stderr: what it said when it exits before a result.
        self.stderr: deque[str] = deque(maxlen=STDERR_TAIL_LINES)
        self.exit_code: int | None = None

    @property
    def partial_output(self) -> str:
        return "\n\n".join(self.text_parts)

    @property
    def total_usage(self) -> Usage:
        return sum(self.usage_by_message.values(), Usage())

    def _usage(self, message_id: str, raw: dict[str, Any] | None) -> None:
        """Fold one report of a message's usage; emit the new totals when they changed."""
        if not raw:
            return
        old = self.usage_by_message.get(message_id)
        new = _latest(old, usage_from_api(raw))
        if new == old:
            return
        self.usage_by_message[message_id] = new
        turns = len(self.usage_by_message)
        self.emit(UsageUpdate(self.spec.session_id, self.total_usage, None, turns, self.model))

    def handle(self, message: Message) -> None:
        sid = self.spec.session_id
        if isinstance(message, StreamEvent):
            event = message.event
            kind = event.get("type")
            if kind == "content_block_delta" and message.parent_tool_use_id is None:
                delta = event.get("delta", {})
                if delta.get("type") == "text_delta" and delta.get("text"):
                    self.emit(TextDelta(sid, delta["text"]))
            elif kind == "message_start":
                started = event.get("message") or {}
                self.model = started.get("model") or self.model
                if started.get("id"):
                    self.streaming_message[message.parent_tool_use_id] = started["id"]
                    self._usage(started["id"], started.get("usage"))
            elif kind == "message_delta":
                # The output tokens of the message so far: the figure AssistantMessage lacks.
                current = self.streaming_message.get(message.parent_tool_use_id)
                if current is not None:
                    self._usage(current, event.get("usage"))
        elif isinstance(message, AssistantMessage) and message.error is not None:
            # Claude Code's notice of a failed model call, not the model's words: the
            # result message carries the same error, reported once as the run's error.
            return
        elif isinstance(message, AssistantMessage):
            self.model = message.model if message.model != _SYNTHETIC else self.model
            for block in message.content:
                if isinstance(block, TextBlock) and block.text:
                    if message.parent_tool_use_id is None and self.text_chars < OUTPUT_LIMIT:
                        self.text_parts.append(block.text)
                        self.text_chars += len(block.text)
                    self.emit(AssistantText(sid, block.text))
                elif isinstance(block, ToolUseBlock):
                    call = ToolCall.start(block.id, block.name, dict(block.input), _now())
                    self.calls[block.id] = call
                    self.emit(ToolCallStarted(sid, call))
            if message.message_id and message.usage:
                self._usage(message.message_id, message.usage)
        elif isinstance(message, UserMessage) and isinstance(message.content, list):
            for block in message.content:
                if isinstance(block, ToolResultBlock) and block.tool_use_id in self.calls:
                    done = self.calls[block.tool_use_id].finish(
                        tool_result_text(block.content), bool(block.is_error), _now()
                    )
                    self.calls[block.tool_use_id] = done
                    self.emit(ToolCallFinished(sid, done))
        elif isinstance(message, SystemMessage) and message.subtype == "init":
            self.runtime_session_id = message.data.get("session_id") or self.runtime_session_id
            self.model = message.data.get("model") or self.model
            if self.model:
                self.emit(UsageUpdate(sid, self.total_usage, None, None, self.model))
            butler_server = self.spec.mcp_server
            for server in message.data.get("mcp_servers", []):
                if butler_server is not None and server.get("name") == butler_server.name:
                    self.mcp_status = server.get("status")
        elif isinstance(message, ResultMessage):
            self.result = message

    def outcome(self) -> RunOutcome:
        result = self.result
        if result is None:
            raise RuntimeCrashed("Claude Code ended without a result message")
        usage = usage_from_api(result.usage)
        text = result.result if result.result is not None else self.partial_output
        outcome = RunOutcome(
            output=truncate(text, OUTPUT_LIMIT),
            runtime_session_id=result.session_id or self.runtime_session_id,
            usage=usage,
            cost_usd=result.total_cost_usd,
            num_turns=result.num_turns,
            model=self.model,
            exit_code=self.exit_code,
        )
        if result.is_error:
            outcome.success = False
            outcome.output = self.partial_output
            if result.subtype == "error_max_turns":
                outcome.error_kind = "max_turns"
                outcome.error = f"reached the max_turns limit ({self.spec.max_turns})"
            else:
                detail = "; ".join(result.errors or []) or (result.result or result.subtype)
                failure = classify_failure(
                    result.api_error_status, detail, auth_remedy=ClaudeCodeAdapter.auth_remedy
                )
                outcome.error_kind = failure.kind
                outcome.error = str(failure)
        elif self.mcp_status not in (None, "connected") and self.spec.mcp_server is not None:
            # It answered without the butler's tools: whatever it said, the run failed.
            outcome.success = False
            outcome.error_kind = MCP_UNAVAILABLE
            outcome.error = mcp_unavailable_message(
                self.spec.mcp_server, f"Claude Code reports it {self.mcp_status}"
            )
        return outcome


@dataclasses.dataclass(frozen=True)
class _Asked:
    """A run's ``ask`` tools as Claude Code sees them: built-in tools it must offer (the
    allowed ones are offered already), and whether any is one of the butler's MCP tools
    (then the server is not allowed as a whole: that would allow it without a question)."""

    builtin: tuple[str, ...]
    mcp: bool


def asking(spec: RunSpec) -> _Asked:
    server = spec.mcp_server
    prefix = f"mcp__{server.name}__" if server is not None else None
    return _Asked(
        builtin=tuple(t for t in spec.ask if not t.startswith("mcp__") and t not in spec.tools),
        mcp=prefix is not None and any(t.startswith(prefix) for t in spec.ask),
    )


def permission_callback(spec: RunSpec, state: _RunState | None) -> CanUseTool:
    """Claude Code's permission callback for a run with ``ask``: a tool of ``ask`` goes
    to the run's approver, the butler's own MCP tools (not allowed as a whole when one of
    them is in ``ask``) are allowed, anything else is denied as ``dontAsk`` would."""
    server = spec.mcp_server
    own_mcp = f"mcp__{server.name}__" if server is not None else None

    async def can_use_tool(
        name: str, tool_input: dict[str, Any], context: ToolPermissionContext
    ) -> PermissionResult:
        if name in spec.ask:
            call_id = context.tool_use_id or ""
            known = state.calls.get(call_id) if state is not None else None
            call = known or ToolCall.start(call_id, name, dict(tool_input), _now())
            request = PermissionRequest(spec.session_id, spec.butler, call)
            decision = await spec.approver(request) if spec.approver else NO_APPROVER
            if decision.allowed:
                return PermissionResultAllow()
            return PermissionResultDeny(
                message=decision.reason or f"a person ({decision.by}) denied this tool call"
            )
        if own_mcp is not None and name.startswith(own_mcp):
            return PermissionResultAllow()
        return PermissionResultDeny(message=f"{name} is not among this butler's tools")

    return can_use_tool


class ClaudeStreamParser(LineParser):
    """``claude -p --output-format stream-json`` lines read by the adapter's own code.

    Each line is turned into the SDK's message (its own parser) and folded by the same
    :class:`_RunState` that reads a run through the SDK: one reading of Claude Code's
    stream, for this runtime and for a ``command`` runtime that prints it.
    """

    def __init__(self, spec: RunSpec) -> None:
        super().__init__(spec.session_id, spec.mcp_server.name if spec.mcp_server else "")
        self._events: list[RunEvent] = []
        self.state = _RunState(replace(spec, log=None), self._events.append)

    def handle(self, data: dict[str, Any]) -> list[RunEvent]:
        try:
            message = parse_message(data)
        except MessageParseError:
            self.bad_lines += 1
            return []
        if message is None:  # a kind this SDK does not know
            return []
        self.state.handle(message)
        self.tool_calls = len(self.state.calls)
        events = list(self._events)
        self._events.clear()  # the state holds this list's append
        return events

    def stderr_line(self, line: str) -> None:
        self.state.stderr.append(line)

    def outcome(self, exit_code: int, stderr: Sequence[str]) -> RunOutcome:
        if self.state.result is None:
            said = stderr_summary(stderr)
            detail = f"Claude Code exited with code {exit_code} without a result" + (
                f": {said}" if said else ""
            )
            return RunOutcome(
                output=self.state.partial_output, success=False, error=detail,
                error_kind="crash", runtime_session_id=self.state.runtime_session_id,
            )  # fmt: skip
        outcome = self.state.outcome()
        if exit_code != 0 and outcome.success:
            outcome.success, outcome.error_kind = False, "runtime_error"
            outcome.error = f"Claude Code exited with code {exit_code}"
        return outcome


def cli_options(options: ClaudeAgentOptions) -> ClaudeAgentOptions:
    """The options the CLI's command line is built from.

    With a permission callback the CLI must send its questions over stdio
    (``--permission-prompt-tool stdio``); ``query()`` sets that only on the transport it
    makes itself, and the adapter gives it one of its own.
    """
    if options.can_use_tool is None:
        return options
    return replace(options, permission_prompt_tool_name="stdio")


def sdk_options(options: ClaudeAgentOptions) -> ClaudeAgentOptions:
    """The options ``query()`` reads: the same, without the allow list when there is a
    permission callback. The list reaches the CLI through the transport's command line;
    the SDK reads it only to warn that allowed tools skip the callback, which is what
    ``[butler.permissions] ask`` means (tools are allowed, ``ask`` tools are asked).
    """
    if options.can_use_tool is None:
        return options
    return replace(options, allowed_tools=[])


# What the stdout log leaves out: the token deltas (the messages that follow hold the
# same text) and the SDK's control protocol with the CLI.
_UNLOGGED = frozenset({"stream_event", "control_request", "control_response",
                       "control_cancel_request"})  # fmt: skip


class _Transport(SubprocessCLITransport):
    """The SDK's own transport, which also keeps the CLI's exit code when it closes.

    A CLI that exits at once (a bad flag) can be gone before the SDK writes to
    it; the SDK then reports a lost connection, closes the transport and drops
    the process, all before its reader has seen the exit.
    """

    exit_code: int | None = None
    log: RunLog | None = None

    async def read_messages(self) -> AsyncIterator[dict[str, Any]]:
        """The CLI's messages as the SDK reads them, each also a line of the run's stdout
        log but the token deltas and the SDK's own protocol (as the CLI wrote it, not as
        the SDK's types re-encode it: that cost a millisecond a message)."""
        async for data in super().read_messages():
            if self.log is not None and data.get("type") not in _UNLOGGED:
                self.log.stdout(json.dumps(data, ensure_ascii=False))
            yield data

    async def close(self) -> None:
        process = self._process  # the SDK keeps no public handle on it
        await super().close()  # waits for the CLI to end
        if process is not None:
            self.exit_code = process.returncode


class ClaudeCodeAdapter(RuntimeAdapter):
    type: ClassVar[str] = "claude-code"
    binary_name: ClassVar[str] = "claude"
    # claude-agent-sdk's wheels bundle the CLI on most platforms; where one does not
    # (or the bundled binary is gone), npm installs it.
    install_hint: ClassVar[str] = "npm install -g @anthropic-ai/claude-code"
    auth_remedy: ClassVar[str] = (
        "Claude Code is not authenticated: set ANTHROPIC_API_KEY or run `claude login`"
    )
    other_vendor_keys: ClassVar[tuple[str, ...]] = ("OPENAI_API_KEY",)
    live_usage: ClassVar[bool] = True
    default_api_url: ClassVar[str | None] = "https://api.anthropic.com"
    transcripts_dir: ClassVar[str | None] = ".claude/projects"
    # The last two reach a run only when the butler declares them ([butler.env]).
    api_key_env: ClassVar[tuple[str, ...]] = (
        "ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN", "CLAUDE_CODE_OAUTH_TOKEN",
    )  # fmt: skip
    # A subscription's token: usage under it has no dollar price (spawnkit.budgets.budget).
    subscription_env: ClassVar[tuple[str, ...]] = ("CLAUDE_CODE_OAUTH_TOKEN",)
    login_command: ClassVar[str | None] = "claude login"
    login_files: ClassVar[tuple[str, ...]] = (".claude/.credentials.json",)

    version_args: ClassVar[tuple[str, ...]] = ("-v",)

    def __init__(self, config: Any = None) -> None:
        super().__init__(config)
        self._binary: Path | None = None

    def reset(self) -> None:
        self._binary = None

    def logged_in(self) -> bool:
        # On macOS the login lives in the keychain, where it cannot be seen without asking
        # the user: assume there may be one rather than refuse a run that could work.
        return sys.platform == "darwin" or super().logged_in()

    def find_binary(self) -> Path:
        """``$SPAWNKIT_CLAUDE_CLI`` if set, else the CLI bundled in the SDK, else PATH."""
        if self._binary is None:
            configured = os.environ.get(BINARY_ENV)
            if configured:
                found: Path | None = Path(configured).expanduser()
                if not (found and found.is_file() and os.access(found, os.X_OK)):
                    raise RuntimeNotFoundError(
                        self.type, f"{configured} (from ${BINARY_ENV})", self.install_hint
                    )
            else:
                found = _bundled_cli() or (Path(p) if (p := shutil.which("claude")) else None)
            if found is None:
                raise RuntimeNotFoundError(self.type, self.binary_name, self.install_hint)
            self._binary = found
        return self._binary

    def new_runtime_session_id(self) -> str:
        return str(uuid.uuid4())

    def stage_resume(self, home: Path, cwd: Path, runtime_session_id: str) -> bool:
        """Claude Code resumes from ``projects/<its name for the cwd>/<id>.jsonl``.

        Each run of a resumed session works in a workspace of its own, so a session
        resumed twice is kept once per workspace's folder; the newest copy is the whole
        conversation (each resume appends to the one before).
        """
        kept = self.kept_transcripts()
        if kept is None or not kept.is_dir():
            return False
        copies = list(kept.glob(f"*/{runtime_session_id}.jsonl"))
        if not copies:
            return False
        found = max(copies, key=lambda path: path.stat().st_mtime_ns)
        return copy_file(found, home / ".claude" / "projects" / project_dir_name(cwd)
                         / found.name)  # fmt: skip

    def build_config_file(self, workspace: Path, server: McpServerSpec | None) -> Path:
        path = workspace / "mcp.json"
        servers = {server.name: self._server_config(server)} if server is not None else {}
        write_private(path, json.dumps({"mcpServers": servers}, indent=2))
        return path

    @staticmethod
    def _server_config(server: McpServerSpec) -> McpHttpServerConfig | McpSSEServerConfig:
        if server.transport == "sse":
            sse = McpSSEServerConfig(type="sse", url=server.url)
            if server.headers:
                sse["headers"] = server.headers
            return sse
        http = McpHttpServerConfig(type="http", url=server.url)
        if server.headers:
            http["headers"] = server.headers
        return http

    def child_env(self, spec: RunSpec) -> dict[str, str]:
        env = dict(spec.env)
        # A fresh home: the user's ~/.claude (CLAUDE.md, settings, MCP servers, plugins)
        # and shell rc files never reach a run.
        env["HOME"] = str(spec.workspace)
        env["TMPDIR"] = str(_tmpdir(spec.workspace))
        # MCP tools would otherwise hide behind a tool-search tool.
        env["ENABLE_TOOL_SEARCH"] = "false"
        env.setdefault("DISABLE_AUTOUPDATER", "1")
        env.setdefault("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "1")
        if spec.model_retries is not None:
            # spawnkit retries the run itself: the CLI must not wait out a rate limit first.
            env["CLAUDE_CODE_MAX_RETRIES"] = str(spec.model_retries)
        if spec.base_url:
            env["ANTHROPIC_BASE_URL"] = spec.base_url
        if spec.base_url and not spec.default_api:
            # A local gateway or replay server failing should fail the run in
            # seconds, not after minutes of retries.
            env.setdefault("CLAUDE_CODE_MAX_RETRIES", "1")
        if spec.telemetry is not None:
            env.update(telemetry_env(spec.telemetry))
        return env

    def capabilities(self) -> dict[str, Any]:
        return {
            **super().capabilities(),
            "supports_resume": True,
            "supports_subagents": True,
            "subagent_style": "claude-agents",
        }

    def check_interactive(self) -> None:
        """Claude Code's TUI is its interactive mode."""
        self.find_binary()

    def interactive_command(self, spec: RunSpec) -> list[str]:
        """``claude`` with the flags :meth:`options` gives the SDK, but no ``-p``: its TUI.

        The fresh home gets the record of a finished first start that also trusts the
        working directory and approves the run's API key, so the TUI opens at its prompt
        (its first-run screens would try to reach api.anthropic.com, and ask).
        """
        server = spec.mcp_server
        seed_home(
            spec.workspace, trust=(spec.cwd, *spec.add_dirs),
            api_key=spec.env.get("ANTHROPIC_API_KEY"),
        )  # fmt: skip
        system_file = spec.workspace / "system-prompt.md"
        write_private(system_file, spec.system_prompt)
        tools = ",".join(spec.tools)
        allowed = ",".join([*spec.tools, *([f"mcp__{server.name}"] if server else [])])
        argv = [
            str(self.find_binary().resolve()),
            "--mcp-config", str(spec.config_file), "--strict-mcp-config",
            "--setting-sources", "", "--system-prompt-file", str(system_file),
            "--tools", tools, "--allowedTools", allowed, "--permission-mode", "dontAsk",
        ]  # fmt: skip
        for folder in spec.add_dirs:
            argv += ["--add-dir", str(folder)]
        if spec.model:
            argv += ["--model", spec.model]
        if spec.resume:
            argv += ["--resume", spec.resume]
        elif spec.runtime_session_id:
            argv += ["--session-id", spec.runtime_session_id]
        return argv

    def options(
        self, spec: RunSpec, wrapper: Path, pidfile: Path, state: _RunState | None = None
    ) -> ClaudeAgentOptions:
        server = spec.mcp_server
        # The tool that starts a sub-agent ("Task", called "Agent" in newer CLIs).
        delegation = ["Task", "Agent"] if spec.agents else []
        env = _process.filtered_env(
            self.child_env(spec), self.find_binary().resolve(), pidfile, extra_keep=_SDK_ENV
        )
        # A file, not an argument: one argument over 128 KiB cannot be passed on Linux,
        # and a system prompt with memory and skills can grow past that. (The prompt
        # itself goes to the CLI on stdin.)
        system_file = spec.workspace / "system-prompt.md"
        write_private(system_file, spec.system_prompt)
        asked = asking(spec)
        return ClaudeAgentOptions(
            cli_path=wrapper,
            cwd=spec.cwd,
            env=env,
            system_prompt=SystemPromptFile(type="file", path=str(system_file)),
            # The file, not the JSON: a command line is readable by every local user,
            # and the config holds the run's MCP secret.
            mcp_servers=str(spec.config_file),
            strict_mcp_config=True,
            setting_sources=[],
            tools=[*spec.tools, *asked.builtin, *delegation],
            allowed_tools=[
                *spec.tools,
                *delegation,
                *([f"mcp__{server.name}"] if server and not asked.mcp else []),
            ],
            add_dirs=list(spec.add_dirs),
            agents={
                role.name: AgentDefinition(
                    description=role.description,
                    prompt=role.prompt,
                    tools=list(role.tools) if role.tools is not None else None,
                    model=role.model,
                )
                for role in spec.agents.values()
            }
            or None,
            # Without ask, anything not allowed is denied without a question; with it, the
            # questions come to can_use_tool (which denies what ask does not name).
            permission_mode="default" if spec.ask else "dontAsk",
            # An ask rule: the CLI would otherwise let a read-only tool (Read, Grep) through
            # in its working directory without a question.
            settings=json.dumps({"permissions": {"ask": list(spec.ask)}}) if spec.ask else None,
            can_use_tool=permission_callback(spec, state) if spec.ask else None,
            max_turns=spec.max_turns,
            model=spec.model,
            session_id=None if spec.resume else spec.runtime_session_id,
            resume=spec.resume,
            include_partial_messages=True,
            stderr=self._stderr_sink(spec, state),
        )

    @staticmethod
    def _stderr_sink(spec: RunSpec, state: _RunState | None) -> Callable[[str], None]:
        def sink(line: str) -> None:
            if spec.log is not None:
                spec.log.stderr(line)
            if state is not None:
                state.stderr.append(line)
            logger.debug("claude[%s]: %s", spec.session_id[:8], line)

        return sink

    def print_command(self, spec: RunSpec) -> list[str] | None:
        """The run as ``claude --print`` (the prompt on stdin), or None when it needs the
        SDK's control protocol (see the module's docstring). The SDK builds the command line
        from the same options as for :meth:`invoke`'s other way; an SDK that ends it other
        than with ``--input-format stream-json`` is used as it is."""
        if spec.ask or spec.agents:
            return None
        cli = self.find_binary().resolve()
        options = self.options(spec, cli, spec.workspace / "cli.pid")
        command = _Transport(prompt=spec.prompt, options=options)._build_command()
        if command[-2:] != ["--input-format", "stream-json"]:
            return None
        return [*command[:-2], "--print"]

    async def invoke(self, spec: RunSpec, emit: EventSink) -> RunOutcome:
        await self.binary_version()  # once per binary, so the SDK need not check per run
        seed_home(spec.workspace)
        printed = self.print_command(spec)
        if printed is not None:
            return await self._print(spec, emit, printed)
        reader_log = logging.getLogger("claude_agent_sdk._internal.query")
        if _READER_FILTER not in reader_log.filters:
            reader_log.addFilter(_READER_FILTER)
        os.environ.setdefault(_SKIP_VERSION_CHECK, "1")
        wrapper = _process.write_env_filter(
            spec.workspace, spec.sandbox.argv, spec.sandbox.script_lines()
        )
        pidfile = spec.workspace / "cli.pid"
        state = _RunState(spec, emit)
        options = self.options(spec, wrapper, pidfile, state)
        # The SDK is consumed in a task of its own so that a cancellation can
        # kill the CLI first; the SDK then sees the process gone and winds down
        # at once instead of waiting out its graceful-shutdown periods.
        consumer = asyncio.create_task(self._consume(spec.prompt, options, state))
        try:
            await asyncio.shield(consumer)
        except asyncio.CancelledError:
            await self._stop(consumer, pidfile)
            raise
        finally:
            pgid = _process.read_pidfile(pidfile)
            if pgid is not None:
                await asyncio.shield(_process.terminate_group(pgid))
        return state.outcome()

    async def _print(self, spec: RunSpec, emit: EventSink, command: list[str]) -> RunOutcome:
        """One run as ``claude --print``: its stdout lines read as the SDK would read them
        (its parser, the same :class:`_RunState`), logged as the SDK path logs them."""
        reader = ClaudeStreamParser(spec)  # the command runtime's reading of the same stream
        state = reader.state
        log_stderr = self._stderr_sink(spec, state)

        def on_stdout(line: str, truncated: bool) -> None:
            try:
                data = None if truncated else json.loads(line)
            except ValueError:
                data = None
            if not isinstance(data, dict):
                reader.bad_lines += bool(line.strip())
                return
            if spec.log is not None and data.get("type") not in _UNLOGGED:
                spec.log.stdout(line)
            for event in reader.handle(data):
                emit(event)

        def on_stderr(line: str, truncated: bool) -> None:
            log_stderr(line)

        try:
            code = await _process.run_lines(
                spec.sandbox.wrap(command), env=self.child_env(spec), cwd=spec.cwd,
                on_stdout=on_stdout, on_stderr=on_stderr, stdin=spec.prompt.encode(),
            )  # fmt: skip
        except FileNotFoundError as exc:
            raise RuntimeNotFoundError(self.type, self.binary_name, self.install_hint) from exc
        except OSError as exc:
            raise RuntimeCrashed(f"cannot start Claude Code: {exc}") from exc
        if reader.bad_lines:
            logger.warning(
                "claude-code: %d unparseable output lines in session %s (see its stdout.log)",
                reader.bad_lines, spec.session_id,
            )  # fmt: skip
        state.exit_code = code
        # As through the SDK: the CLI exits non-zero after a failed result, and the result
        # says more than the exit code does; without one, what its stderr said.
        if code != 0 and state.result is None:
            raise self._failure(code, state)
        return state.outcome()

    async def _consume(self, prompt: str, options: ClaudeAgentOptions, state: _RunState) -> None:
        # Our own transport, so that a CLI that died before reading its prompt
        # still tells its exit code.
        transport = _Transport(prompt=prompt, options=cli_options(options))
        transport.log = state.spec.log
        messages: AsyncIterator[Message] = query(
            prompt=prompt, options=sdk_options(options), transport=transport
        )
        try:
            async for message in messages:
                state.handle(message)
            state.exit_code = 0  # the SDK raises ProcessError for any other
        except ProcessError as exc:
            state.exit_code = exc.exit_code
            # The CLI exits non-zero after a failed result; the result message,
            # when it came, says more than the exit code does.
            if state.result is None:
                raise self._failure(exc.exit_code, state) from exc
        except CLINotFoundError as exc:
            raise RuntimeNotFoundError(self.type, self.binary_name, self.install_hint) from exc
        except CLIJSONDecodeError as exc:
            raise ProtocolError(f"malformed output from Claude Code: {exc}") from exc
        except CLIConnectionError as exc:
            # Writing to a CLI that already exited (a bad flag, missing auth) loses the
            # connection: what the CLI said says why, not "Connection lost".
            if state.stderr:
                raise self._failure(transport.exit_code, state) from exc
            raise RuntimeCrashed(f"cannot start Claude Code: {exc}") from exc
        except ClaudeSDKError as exc:
            raise RuntimeFailure(f"Claude Code failed: {exc}", "runtime_error") from exc
        finally:
            aclose = getattr(messages, "aclose", None)
            if aclose is not None:
                try:
                    async with asyncio.timeout(_CLOSE_TIMEOUT_S):
                        await aclose()
                except (TimeoutError, ClaudeSDKError, OSError) as exc:
                    logger.debug("closing the SDK query failed: %r", exc)

    @staticmethod
    async def _stop(consumer: asyncio.Task[None], pidfile: Path) -> None:
        """Kill the CLI's process group, then give the SDK a bounded time to finish."""
        pgid = _process.read_pidfile(pidfile)
        if pgid is not None:
            await asyncio.shield(_process.terminate_group(pgid))
        else:
            consumer.cancel()
        done, _ = await asyncio.wait({consumer}, timeout=_CLOSE_TIMEOUT_S)
        if not done:
            consumer.cancel()
            await asyncio.wait({consumer}, timeout=_CLOSE_TIMEOUT_S)
        if consumer.done() and not consumer.cancelled() and consumer.exception() is not None:
            logger.debug("after cancellation the SDK reported: %r", consumer.exception())

    @staticmethod
    def _failure(exit_code: int | None, state: _RunState) -> RuntimeFailure:
        """The CLI ended without a result: its exit code and what its stderr said."""
        said = stderr_summary(state.stderr)
        code = "" if exit_code is None else f" with code {exit_code}"
        detail = f"Claude Code exited{code}" + (f": {said}" if said else " and said nothing")
        failure = (
            RuntimeCrashed(detail)
            if said is None
            else classify_failure(None, detail, auth_remedy=ClaudeCodeAdapter.auth_remedy)
        )
        failure.exit_code = exit_code
        return failure
