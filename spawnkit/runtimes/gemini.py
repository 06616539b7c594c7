"""The ``gemini`` runtime: Google's Gemini CLI, ``gemini -p ... --output-format stream-json``.

The Gemini CLI has no ``--system-prompt`` flag: ``GEMINI_SYSTEM_MD`` names a
file that replaces its system instruction, so the composed prompt is written
to the workspace and passed that way. Each run's workspace is
its ``GEMINI_CLI_HOME`` (and HOME), whose ``.gemini/settings.json`` holds the
run's settings: the butler's MCP server, trusted, and no other
(``mcp.allowed``); API-key auth, which headless mode needs to accept a local
endpoint; no retries; no telemetry; the turn limit. (A system-settings file
would outrank project settings, but the CLI ignores one whose parent folders
are world-writable, as ``/tmp`` is.) The chats folder, ``.gemini/tmp``, links
to ``$SPAWNKIT_HOME/runtimes/gemini/tmp`` so chats can be resumed
(``--resume``) and outlive the workspace.

The child gets ``GEMINI_API_KEY``/``GOOGLE_API_KEY`` and never the other
vendors' keys. ``max_turns`` is the CLI's own ``model.maxSessionTurns``.

A headless run starts the node process the CLI would relaunch itself into, not the CLI's
launching one (:mod:`.gemini_launch`): one node start a run, not two.

Figures: ``init`` names the model; usage comes once, in the final ``result``. Tokens and
model turns during the run come from the run's relay, which meters each model call
(:mod:`spawnkit.budgets.metering`).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from types import MappingProxyType
from typing import Any, ClassVar

from ..errors import RuntimeCrashed, RuntimeFailure
from ..events import (
    AssistantText,
    RunEvent,
    TextDelta,
    ToolCallFinished,
    ToolCallStarted,
    UsageUpdate,
)
from ..result import OUTPUT_LIMIT, ToolCall, Usage, truncate
from ..telemetry.otlp import CliTelemetry
from ..transcripts import copy_file
from .base import McpServerSpec, RunOutcome, RunSpec, classify_failure, write_private
from .gemini_launch import NO_RELAUNCH, direct_command
from .streaming import LineParser, StreamingCliAdapter, stderr_summary

DEFAULT_MODEL = "gemini-2.5-flash"
# The butler's built-in tools, as Gemini names them.
TOOL_NAMES = {
    "Bash": ("run_shell_command",),
    "Read": ("read_file", "list_directory"),
    "Glob": ("glob",),
    "Grep": ("grep_search",),
    "Write": ("write_file",),
    "Edit": ("replace",),
}
# Every built-in tool of the Gemini CLI (0.61): the ones a butler does not list are
# excluded ("tools.core" would hide MCP tools too). Its MCP resource tools
# (list_mcp_resources, read_mcp_resource) stay: they reach only the butler's server.
BUILTIN_TOOLS = (
    "run_shell_command", "read_file", "read_many_files", "list_directory", "glob",
    "grep_search", "write_file", "replace", "web_fetch", "google_web_search", "save_memory",
    "list_background_processes", "read_background_output", "write_todos", "update_topic",
    "enter_plan_mode", "exit_plan_mode", "invoke_agent", "activate_skill", "ask_user",
    "complete_task", "get_internal_docs", "take_snapshot", "tracker_add_dependency",
    "tracker_create_task", "tracker_get_task", "tracker_list_tasks", "tracker_update_task",
    "tracker_visualize",
)  # fmt: skip
# The Gemini CLI truncates a prompt read from stdin to this size (readStdin's MAX_STDIN_SIZE).
MAX_PROMPT_BYTES = 8 * 1024 * 1024
# What headless Gemini prints on stderr when an MCP server failed to connect.
MCP_ISSUES = "MCP issues detected"
# Headless exit codes of the Gemini CLI.
EXIT_MEANINGS = {
    41: ("auth", "authentication failed"),
    42: ("runtime_error", "invalid input"),
    52: ("runtime_error", "invalid configuration"),
    53: ("max_turns", "reached the max_turns limit"),
    54: ("runtime_error", "a tool failed fatally"),
    130: ("cancelled", "cancelled"),
}


def _now() -> datetime:
    return datetime.now(UTC)


class GeminiParser(LineParser):
    """Gemini ``stream-json`` events -> spawnkit events."""

    def __init__(self, session_id: str, server: str) -> None:
        super().__init__(session_id, server)
        self.calls: dict[str, ToolCall] = {}
        self.blocks: list[str] = []
        self.block: list[str] = []
        self.usage = Usage()
        self.result: dict[str, Any] | None = None
        self.errors: list[str] = []
        self.model: str | None = None
        self.mcp_issues = False

    def stderr_line(self, line: str) -> None:
        # Gemini's one word on a failed MCP server in headless mode (the details go to
        # its debug log); the butler's is the only server it has.
        if MCP_ISSUES in line:
            self.mcp_issues = True

    def tool_name(self, name: str) -> str:
        """``mcp_<server>_<tool>`` -> ``mcp__<server>__<tool>`` for the butler's server."""
        prefix = f"mcp_{self.server}_"
        if name.startswith(prefix):
            return f"mcp__{self.server}__{name[len(prefix) :]}"
        return name

    def handle(self, data: dict[str, Any]) -> list[RunEvent]:
        kind = data.get("type")
        sid = self.session_id
        if kind == "init":
            self.runtime_session_id = data.get("session_id") or self.runtime_session_id
            self.model = data.get("model") or self.model
            if self.model:
                return [UsageUpdate(sid, self.usage, None, None, self.model)]
        elif kind == "message" and data.get("role") == "assistant":
            content = str(data.get("content") or "")
            if not content:
                return []
            self.block.append(content)
            return [TextDelta(sid, content)]
        elif kind == "tool_use":
            events = self._close_block()
            call_id = str(data.get("tool_id") or len(self.calls))
            parameters = data.get("parameters")
            call = ToolCall.start(
                call_id, self.tool_name(str(data.get("tool_name", "?"))),
                parameters if isinstance(parameters, dict) else {"parameters": parameters}, _now(),
            )  # fmt: skip
            self.calls[call_id] = call
            self.tool_calls += 1
            return [*events, ToolCallStarted(sid, call)]
        elif kind == "tool_result":
            call_id = str(data.get("tool_id"))
            started = self.calls.get(call_id)
            if started is None:
                return []
            failed = data.get("status") != "success"
            output = data.get("output") if not failed else data.get("error") or data.get("output")
            text = output if isinstance(output, str) else json.dumps(output, ensure_ascii=False)
            finished = started.finish(text or "", failed, _now())
            self.calls[call_id] = finished
            return [ToolCallFinished(sid, finished)]
        elif kind == "error":
            self.errors.append(str(data.get("message") or data))
        elif kind == "result":
            self.result = data
            self.usage = _usage(data.get("stats") or {})
            return [*self._close_block(), UsageUpdate(sid, self.usage, None, None, self.model)]
        return []

    def _close_block(self) -> list[RunEvent]:
        if not self.block:
            return []
        text, self.block = "".join(self.block), []
        self.blocks.append(text)
        return [AssistantText(self.session_id, text)]

    def outcome(self, exit_code: int, stderr: Sequence[str]) -> RunOutcome:
        self._close_block()
        prefix = f"mcp__{self.server}__"
        reached = any(
            call.name.startswith(prefix) and call.status == "ok" for call in self.calls.values()
        )
        if self.mcp_issues and not reached:
            self.mcp_failure = f"Gemini printed {MCP_ISSUES!r}"
        # Like the other runtimes, the answer is the last block of text; on
        # failure, everything the model wrote.
        output = self.blocks[-1] if self.blocks else ""
        outcome = RunOutcome(
            output=truncate(output, OUTPUT_LIMIT),
            runtime_session_id=self.runtime_session_id,
            usage=self.usage,
            model=self.model,
        )
        status = (self.result or {}).get("status")
        if exit_code == 0 and status in (None, "success") and self.result is not None:
            return outcome
        outcome.success = False
        outcome.output = truncate("\n\n".join(self.blocks), OUTPUT_LIMIT)
        if exit_code in EXIT_MEANINGS and exit_code != 41:
            kind, meaning = EXIT_MEANINGS[exit_code]
            reason = _error_text(self.result) or "; ".join(self.errors) or meaning
            outcome.error_kind = kind
            outcome.error = f"{meaning}: {reason}" if reason != meaning else meaning
            return outcome
        detail = _error_text(self.result) or "; ".join(self.errors)
        if not detail:
            said = stderr_summary(stderr, _NOISE)
            if said is None:
                raise RuntimeCrashed(f"gemini exited with code {exit_code} and no error message")
            detail = f"gemini exited with code {exit_code}: {said}"
        # Headless gemini exits with the HTTP status of a failed model call, modulo 256.
        http = {244: 500, 173: 429, 144: 400, 247: 503, 17: 529, 145: 401, 147: 403}
        status_code = 401 if exit_code == 41 else http.get(exit_code)
        failure = classify_failure(status_code, detail, auth_remedy=GeminiAdapter.auth_remedy)
        outcome.error, outcome.error_kind = str(failure), failure.kind
        return outcome


def telemetry_env(telemetry: CliTelemetry) -> dict[str, str]:
    """Gemini's own telemetry to the run's receiver, prompts off.

    Gemini ignores ``TRACEPARENT``: its spans carry the run's session id as a resource
    attribute, and the receiver moves them into the run's trace. It costs about 0.5 s
    per run, now and then about 3 s (the flush at exit). Of the signals, only its spans
    can be left out (``telemetry.signals``); log events and metrics it always sends, and
    the receiver drops those not chosen.
    """
    return {
        "GEMINI_TELEMETRY_ENABLED": "true",
        "GEMINI_TELEMETRY_TARGET": "local",
        "GEMINI_TELEMETRY_OTLP_ENDPOINT": telemetry.endpoint,
        "GEMINI_TELEMETRY_OTLP_PROTOCOL": "http",
        "GEMINI_TELEMETRY_TRACES_ENABLED": str("traces" in telemetry.signals).lower(),
        "GEMINI_TELEMETRY_LOG_PROMPTS": "false",
        "OTEL_EXPORTER_OTLP_HEADERS": ",".join(f"{k}={v}" for k, v in telemetry.headers.items()),
        "OTEL_RESOURCE_ATTRIBUTES": telemetry.resource_attributes,
    }


def base_settings(*, retries: bool) -> dict[str, Any]:
    """What every Gemini run spawnkit starts shares: API-key auth (headless mode needs it to
    accept a local endpoint), no telemetry, no auto-update, and without ``retries`` no
    retrying a failing model server for minutes."""
    general: dict[str, Any] = {"disableAutoUpdate": True}
    if not retries:
        general.update({"retryFetchErrors": False, "maxAttempts": 1})
    return {
        "security": {"auth": {"selectedType": "gemini-api-key"}},
        "privacy": {"usageStatisticsEnabled": False},
        "telemetry": {"enabled": False},
        "general": general,
    }


def _error_text(result: dict[str, Any] | None) -> str | None:
    error = (result or {}).get("error")
    if isinstance(error, dict):
        return str(error.get("message") or error)
    return str(error) if error else None


def _usage(stats: dict[str, Any]) -> Usage:
    cached = int(stats.get("cached") or 0)
    # input_tokens counts the cached part too; spawnkit keeps them apart.
    return Usage(
        input_tokens=max(0, int(stats.get("input_tokens") or 0) - cached),
        output_tokens=int(stats.get("output_tokens") or 0),
        cache_read_tokens=cached,
    )


# What Gemini prints on stderr that never explains a failure.
_NOISE = ("256-color", "Ripgrep is not available")


class GeminiAdapter(StreamingCliAdapter):
    type: ClassVar[str] = "gemini"
    binary_name: ClassVar[str] = "gemini"
    binary_env: ClassVar[str] = "SPAWNKIT_GEMINI_CLI"
    # The version spawnkit is tested with (package.json pins the same).
    install_hint: ClassVar[str] = "npm install -g @google/gemini-cli@0.61.0"
    auth_remedy: ClassVar[str] = (
        "Gemini is not authenticated: set GEMINI_API_KEY (or GOOGLE_API_KEY)"
    )
    passthrough_env: ClassVar[tuple[str, ...]] = ("GEMINI_API_KEY", "GOOGLE_API_KEY")
    native_turn_limit: ClassVar[bool] = True
    # Node drops what is still queued for a pipe when the CLI exits: with a large prompt
    # (echoed as the stream's first event) the end of the stream, its result, was lost.
    stdout_to_file: ClassVar[bool] = True
    other_vendor_keys: ClassVar[tuple[str, ...]] = ("ANTHROPIC_API_KEY", "OPENAI_API_KEY")
    api_key_env: ClassVar[tuple[str, ...]] = ("GEMINI_API_KEY", "GOOGLE_API_KEY")
    default_api_url: ClassVar[str | None] = "https://generativelanguage.googleapis.com"
    # Gemini logs in interactively: its first start offers "Login with Google".
    login_command: ClassVar[str | None] = "gemini"
    login_files: ClassVar[tuple[str, ...]] = (".gemini/oauth_creds.json",)
    transcripts_dir: ClassVar[str | None] = ".gemini/tmp"
    usage_at_end: ClassVar[bool] = True
    # Without it, `gemini --version` relaunches itself first and takes twice as long.
    version_env: ClassVar[Mapping[str, str]] = MappingProxyType(NO_RELAUNCH)
    # The TUI keeps its relaunch (it restarts itself through it after /auth or an update).
    headless_env: ClassVar[tuple[str, ...]] = ("NO_COLOR", *NO_RELAUNCH)

    def capabilities(self) -> dict[str, Any]:
        return {
            **super().capabilities(),
            "supports_resume": True,
        }

    def build_config_file(self, workspace: Path, server: McpServerSpec | None) -> Path:
        config_dir = workspace / ".gemini"
        config_dir.mkdir(mode=0o700, exist_ok=True)
        path = config_dir / "settings.json"
        write_private(path, json.dumps(self.settings(server, [], 20), indent=2))
        return path

    @staticmethod
    def settings(
        server: McpServerSpec | None,
        tools: Sequence[str],
        max_turns: int,
        add_dirs: Sequence[Path] = (),
    ) -> dict[str, Any]:
        allowed = [name for tool in tools for name in TOOL_NAMES.get(tool, ())]
        servers: dict[str, Any] = {}
        if server is not None:
            servers[server.name] = {
                "type": server.transport,
                "url": server.url,
                "trust": True,
                **({"headers": server.headers} if server.headers else {}),
            }
        # The CLI refuses paths that resolve outside its workspace: the folders an ask's
        # links lead to (a file source's parent) are added to it.
        folders = list(dict.fromkeys(str(p if p.is_dir() else p.parent) for p in add_dirs))
        return {
            **base_settings(retries=False),
            "model": {"maxSessionTurns": max_turns},
            "tools": {
                "allowed": allowed,
                "exclude": [tool for tool in BUILTIN_TOOLS if tool not in allowed],
            },
            "mcp": {"allowed": list(servers)},
            "mcpServers": servers,
            **({"context": {"includeDirectories": folders}} if folders else {}),
        }

    def child_env(self, spec: RunSpec) -> dict[str, str]:
        env = dict(spec.env)
        system = spec.workspace / "system.md"
        system.write_text(spec.system_prompt, encoding="utf-8")
        tmp = spec.workspace / "tmp"
        tmp.mkdir(exist_ok=True, mode=0o700)
        env.update(
            {
                "GEMINI_SYSTEM_MD": str(system),
                "GEMINI_CLI_HOME": str(spec.workspace),
                "HOME": str(spec.workspace),
                "TMPDIR": str(tmp),
                "GEMINI_CLI_TRUST_WORKSPACE": "true",
                "NO_COLOR": "1",
            }
        )
        if spec.base_url:
            env["GOOGLE_GEMINI_BASE_URL"] = spec.base_url.rstrip("/")
        if spec.telemetry is not None:
            env.update(telemetry_env(spec.telemetry))
        if self._direct(spec) is not None:
            env.update(NO_RELAUNCH)
        return env

    def _direct(self, spec: RunSpec) -> tuple[str, ...] | None:
        """The node command the CLI would relaunch itself into (:mod:`.gemini_launch`)."""
        return direct_command(self.find_binary(), spec.env.get("PATH"))

    def check_interactive(self) -> None:
        """Gemini's TUI is its interactive mode."""
        self.find_binary()

    def interactive_command(self, spec: RunSpec) -> list[str]:
        """``gemini -m MODEL`` (its TUI) with the run's settings; ``--resume ID`` goes on."""
        self._write_settings(spec)
        command = [self.cli(), "-m", spec.model or DEFAULT_MODEL]
        return [*command, "--resume", spec.resume] if spec.resume else command

    def _write_settings(self, spec: RunSpec) -> None:
        write_private(
            spec.config_file,
            json.dumps(
                self.settings(spec.mcp_server, spec.tools, spec.max_turns, spec.add_dirs),
                indent=2,
            ),
        )

    def command(self, spec: RunSpec) -> list[str]:
        self._write_settings(spec)
        model = spec.model or DEFAULT_MODEL
        # yolo approves the tools that are left: the butler's MCP server and the
        # built-ins it lists (the rest are excluded in the settings). Without it,
        # headless Gemini refuses shell commands it deems complex (a heredoc).
        # The prompt comes on stdin (an empty -p keeps the CLI headless, and takes stdin
        # as the whole prompt): a prompt of any size up to the CLI's own stdin limit.
        command = [*(self._direct(spec) or [self.cli()]), "-m", model, "-p", "",
                   "--output-format", "stream-json", "--approval-mode", "yolo"]  # fmt: skip
        if spec.resume:
            command += ["--resume", spec.resume]
        return command

    def stdin(self, spec: RunSpec) -> bytes | None:
        prompt = spec.prompt.encode("utf-8")
        if len(prompt) > MAX_PROMPT_BYTES:
            raise RuntimeFailure(
                f"the prompt is {len(prompt):,} bytes; the Gemini CLI reads at most "
                f"{MAX_PROMPT_BYTES:,} bytes of prompt (it would cut the rest silently)",
                "prompt_too_large",
            )
        return prompt

    def default_model(self, base_url: str | None) -> str | None:
        return DEFAULT_MODEL

    def parser(self, spec: RunSpec) -> LineParser:
        return GeminiParser(spec.session_id, spec.mcp_server.name if spec.mcp_server else "")

    def stage_resume(self, home: Path, cwd: Path, runtime_session_id: str) -> bool:
        """``--resume`` looks in ``tmp/<the cwd's slug>/chats/`` for the session's file."""
        kept = self.kept_transcripts()
        if kept is None or not kept.is_dir():
            return False
        found = _chat_file(kept, runtime_session_id)
        if found is None:
            return False
        project = home / ".gemini" / "tmp" / project_slug(cwd)
        if not copy_file(found, project / "chats" / found.name):
            return False
        (project / ".project_root").write_text(str(cwd), encoding="utf-8")
        return True


def project_slug(cwd: Path) -> str:
    """The Gemini CLI's folder name for a project under ``tmp/``: its base name, slugged."""
    return re.sub(r"[^a-z0-9]+", "-", cwd.name.lower()).strip("-") or "project"


def _chat_file(kept: Path, session_id: str) -> Path | None:
    """The kept chat file whose first line names ``session_id`` (file names hold 8 of it)."""
    for path in kept.glob(f"*/chats/session-*-{session_id[:8]}.json*"):
        with open(path, encoding="utf-8", errors="replace") as fh:
            if session_id in fh.readline():
                return path
    return None
