"""The ``codex`` runtime: OpenAI's Codex CLI, ``codex exec --json``.

Each run gets a private ``CODEX_HOME`` and ``HOME`` inside its workspace whose
``config.toml`` reaches exactly the butler's MCP server (tools pre-approved,
``required`` so a slow start cannot lose the race) and, when
``[butler.runtime] base_url`` is set, a custom model provider speaking the
Responses API at that URL (the replay server is reached the same way). Retries
are off and the CLI's remote features are disabled, so a down model server
fails the run in seconds.

System prompt: Codex has no system-prompt flag. spawnkit passes the composed
prompt as ``developer_instructions``: Codex sends it as a developer message,
above the user's prompt, and keeps its own base instructions (which teach the
model its shell and patch tools). Replacing those (``model_instructions_file``)
made the model lose its tools; embedding the prompt in the user message would
give it only user authority. See docs/runtimes.md.

Home: ``CODEX_HOME`` is ``.codex`` in the run's workspace (which is HOME). It must not lie
under a temp dir: Codex then refuses to create its helper binaries, and every shell call
fails on machines with bubblewrap. Inside spawnkit's sandbox Codex's own sandbox is off
(``danger-full-access``: the run is already confined, and bubblewrap cannot nest without
capabilities); a butler that opted out of spawnkit's sandbox keeps Codex's ``read-only`` one.

Binary: where ``codex`` is the npm package's node launcher, spawnkit runs the native binary
it would start, with the environment it would give it (:mod:`.codex_native`): no node start
on every run.

Sessions: Codex keeps rollouts under ``CODEX_HOME/sessions``; spawnkit keeps them under
``$SPAWNKIT_HOME/runtimes/codex/sessions`` after the run and copies one back for
``codex exec resume``.

Codex has no turn limit: spawnkit enforces ``max_turns`` by counting tool calls.

Figures: Codex's JSON events name no model and report usage once, at ``turn.completed``
(Codex's "turn" is the whole prompt, not a model call). The model is the one spawnkit
writes into ``config.toml``; tokens and model turns during the run come from the run's
relay, which meters each model call (:mod:`spawnkit.budgets.metering`).
"""

from __future__ import annotations

import json
import re
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, ClassVar

import tomli_w

from ..errors import RuntimeCrashed, RuntimeFailure
from ..events import AssistantText, RunEvent, ToolCallFinished, ToolCallStarted, UsageUpdate
from ..result import OUTPUT_LIMIT, ToolCall, Usage, truncate
from ..telemetry.otlp import CliTelemetry
from ..transcripts import copy_file
from . import codex_state
from .base import McpServerSpec, RunOutcome, RunSpec, classify_failure, write_private
from .codex_native import native_codex
from .codex_rollout import RolloutChanges
from .streaming import LineParser, StreamingCliAdapter, stderr_summary

# Codex refuses a longer prompt ("Input exceeds the maximum length of 1048576 characters").
MAX_PROMPT_CHARS = 1_048_576
# A slug Codex does not know: it then offers MCP tools directly, not behind tool_search.
# Its name ends in a priced model's, so a replay run is priced (as gpt-5, an estimate)
# like a replay run of Claude Code or Gemini.
REPLAY_MODEL = "replay-gpt-5"
PROVIDER = "spawnkit"


def _now() -> datetime:
    return datetime.now(UTC)


def toml_string(text: str) -> str:
    """``text`` as a TOML basic string, at C speed (tomli_w escapes a character at a time,
    milliseconds for a system prompt). JSON's escapes are all TOML's; TOML also wants DEL
    escaped."""
    return json.dumps(text, ensure_ascii=False).replace("\x7f", "\\u007f")


def base_config(mcp_servers: Mapping[str, Any]) -> dict[str, Any]:
    """What every Codex run spawnkit starts shares: no prompts, a read-only sandbox,
    remote features off (offline they retry forever), none of Codex's own extra tools
    (sub-agents, goals, image viewing, web search, asking the user), none of its bundled
    skills (which it would otherwise write, 72 files, into every run's fresh home, and
    describe in every prompt), and exactly these MCP servers."""
    return {
        "approval_policy": "never",
        "sandbox_mode": "read-only",
        "web_search": "disabled",
        "features": {
            "plugins": False, "apps": False, "remote_plugin": False,
            "unbounded_connection_retries": False,
            "multi_agent": False, "goals": False, "view_image": False,
        },
        "tools": {"experimental_request_user_input": {"enabled": False}},
        "skills": {"bundled": {"enabled": False}},
        "analytics": {"enabled": False},
        "mcp_servers": dict(mcp_servers),
    }  # fmt: skip


def template_config(base_url: str) -> str:
    """The config.toml Codex makes its state template with (:mod:`.codex_state`): the
    runs' own settings, a model at ``base_url`` (a port that refuses), no retries."""
    config = {**base_config({}), **provider_config(base_url), "model": "spawnkit-template"}
    return tomli_w.dumps(config)


# The one root Codex trusts in a run that reaches no TLS host (see trusts_nothing): a
# self-signed certificate whose private key was thrown away when it was made, so no server
# can present a chain to it.
TRUST_NOTHING_PEM = """\
-----BEGIN CERTIFICATE-----
MIIB2zCCAYGgAwIBAgIUE3Oc/9upPODodhJSRu7VS195w78wCgYIKoZIzj0EAwIw
QjFAMD4GA1UEAww3c3Bhd25raXQ6IGEgcnVuIHRoYXQgcmVhY2hlcyBubyBUTFMg
aG9zdCB0cnVzdHMgbm8gcm9vdDAgFw0yNjExMjgxMTAyMjVaGA8yMTI2MTEwNDEx
MDIyNVowQjFAMD4GA1UEAww3c3Bhd25raXQ6IGEgcnVuIHRoYXQgcmVhY2hlcyBu
byBUTFMgaG9zdCB0cnVzdHMgbm8gcm9vdDBZMBMGByqGSM49AgEGCCqGSM49AwEH
A0IABNhzNLgZwbJr93w5gv2iHcJB3KWR/weqm9kUJLO1WrtrKmc1DLYq4+E8jePa
v+Zg5kEAzOLQHJF46C+f23u/b5SjUzBRMB0GA1UdDgQWBBQ+Iyj5srQMnv9mY+OY
gP18LHn41DAfBgNVHSMEGDAWgBQ+Iyj5srQMnv9mY+OYgP18LHn41DAPBgNVHRMB
Af8EBTADAQH/MAoGCCqGSM49BAMCA0gAMEUCIAwNHToNg5D7zZzMi7dqeFRCzsLW
cTlFQ5GskTOoiz7WAiEAjzKOCK+gOn1/5d9Q76BjjEkNIVohBeNvnuic+6ef++w=
-----END CERTIFICATE-----
"""
TRUST_NOTHING_FILE = "trust-nothing.pem"


def trusts_nothing(spec: RunSpec) -> bool:
    """Whether Codex gets :data:`TRUST_NOTHING_PEM` as its ``SSL_CERT_FILE``.

    Codex loads every root of the system's store when it starts (0.04 CPU-s a run here, for
    its HTTPS clients). A run in its own network that lists no ``allow_hosts`` reaches only
    spawnkit's relay and its butler's servers, over plain HTTP on its loopback: there is no
    TLS peer to verify. The variable is Codex's alone (its shell tool's commands do not
    inherit it), and a ``SSL_CERT_FILE`` the butler sets itself is kept.
    """
    return not spec.sandbox.reaches_hosts and "SSL_CERT_FILE" not in spec.env


# Butler tools Codex's one shell tool stands for: it reads, lists and searches files
# through commands. A butler that lists none of them gets no shell at all.
SHELL_TOOLS = frozenset({"Bash", "Read", "Glob", "Grep"})


def provider_config(base_url: str, *, retries: bool = False) -> dict[str, Any]:
    """A model provider speaking the Responses API at ``base_url`` with OPENAI_API_KEY."""
    provider: dict[str, Any] = {
        "name": PROVIDER, "base_url": base_url.rstrip("/") + "/v1",
        "wire_api": "responses", "env_key": "OPENAI_API_KEY",
    }  # fmt: skip
    if not retries:
        provider.update({"request_max_retries": 0, "stream_max_retries": 0})
    return {"model_provider": PROVIDER, "model_providers": {PROVIDER: provider}}


def otel_config(telemetry: CliTelemetry) -> dict[str, Any]:
    """Codex's ``[otel]``: traces, log events and metrics to the run's receiver, no prompts;
    a signal not chosen (``telemetry.signals``) goes nowhere (``"none"``)."""

    def to(signal: str) -> dict[str, Any] | str:
        if signal not in telemetry.signals:
            return "none"
        return {
            "otlp-http": {
                "endpoint": telemetry.url(signal),
                "protocol": "binary",
                "headers": telemetry.headers,
            }
        }

    return {
        "log_user_prompt": False,
        "exporter": to("logs"),
        "metrics_exporter": to("metrics"),
        "trace_exporter": to("traces"),
    }


def _mcp_result_text(result: Any) -> str:
    """Text of an MCP result as Codex reports it ({content: [...], structured_content})."""
    if not isinstance(result, dict):
        return "" if result is None else str(result)
    parts = [
        str(block.get("text", ""))
        for block in result.get("content") or []
        if isinstance(block, dict) and block.get("type") == "text"
    ]
    return "\n".join(parts)


class CodexParser(LineParser):
    """Codex ``exec --json`` events -> spawnkit events."""

    def __init__(
        self, session_id: str, server: str, model: str | None = None,
        codex_home: Path | None = None,
    ) -> None:  # fmt: skip
        super().__init__(session_id, server)
        # The model the run's config names (Codex's events never say).
        self.model = model
        # Where the lines of its file changes are (exec --json gives paths only).
        self.rollout = RolloutChanges(codex_home) if codex_home is not None else None
        self.file_changes: list[str] = []  # the file_change items, in order
        self.unread: set[str] = set()  # those whose lines the rollout did not have yet
        self.calls: dict[str, ToolCall] = {}
        self.messages: list[str] = []
        self.usage = Usage()
        self.failure: str | None = None
        self.errors: list[str] = []
        self.completed = False  # turn.completed: Codex's own word that the run ended well

    def handle(self, data: dict[str, Any]) -> list[RunEvent]:
        kind = data.get("type")
        sid = self.session_id
        if kind == "thread.started":
            self.runtime_session_id = data.get("thread_id") or self.runtime_session_id
            if self.rollout is not None and self.runtime_session_id:
                self.rollout.thread_started(self.runtime_session_id)
            if self.model:
                return [UsageUpdate(sid, self.usage, None, None, self.model)]
        elif kind == "turn.completed":
            self.completed = True
            self.usage = self.usage + _usage(data.get("usage") or {})
            # No turn count: one Codex turn holds every model call of the prompt.
            return [UsageUpdate(sid, self.usage, None, None, self.model)]
        elif kind == "turn.failed":
            self.failure = str((data.get("error") or {}).get("message") or "the turn failed")
        elif kind == "error":
            self.errors.append(str(data.get("message") or data))
        elif kind in ("item.started", "item.updated", "item.completed"):
            item = data.get("item")
            if isinstance(item, dict):
                return self._item(item, done=kind == "item.completed")
        return []

    def _item(self, item: dict[str, Any], done: bool) -> list[RunEvent]:
        sid = self.session_id
        item_type = item.get("type")
        item_id = str(item.get("id", ""))
        if item_type == "agent_message":
            if done and item.get("text"):
                self.messages.append(str(item["text"]))
                return [AssistantText(sid, str(item["text"]))]
            return []
        if item_type == "error":
            if done:
                self.errors.append(str(item.get("message", "")))
            return []
        if item_type in (None, "reasoning", "todo_list"):
            return []
        events: list[RunEvent] = []
        call = self.calls.get(item_id)
        if call is None:
            call = self._start(item_id, item)
            self.calls[item_id] = call
            self.tool_calls += 1
            events.append(ToolCallStarted(sid, call))
        if done:
            output, failed = self._result(item)
            finished = call.finish(output, failed, _now())
            if item_type == "file_change":
                finished = self._with_lines(finished)
            self.calls[item_id] = finished
            events.append(ToolCallFinished(sid, finished))
        return events

    def _with_lines(self, call: ToolCall) -> ToolCall:
        """A file change with its lines, read from the rollout (see .codex_rollout)."""
        if call.id not in self.file_changes:
            self.file_changes.append(call.id)
        changes = call.input.get("changes")
        if self.rollout is None or not isinstance(changes, list):
            return call
        paths = {str(c.get("path")) for c in changes if isinstance(c, dict)}
        found = self.rollout.change(self.file_changes.index(call.id), paths)
        if found is None:
            self.unread.add(call.id)
            return call
        self.unread.discard(call.id)
        return replace(call, input={**call.input, "changes": found})

    def ended(self) -> list[RunEvent]:
        """The file changes whose lines were not in the rollout as they ended, again
        with them (the CLI has exited: its rollout is whole)."""
        events: list[RunEvent] = []
        for call_id in sorted(self.unread, key=self.file_changes.index):
            call = self._with_lines(self.calls[call_id])
            if call_id not in self.unread:
                self.calls[call_id] = call
                events.append(ToolCallFinished(self.session_id, call))
        return events

    def _start(self, item_id: str, item: dict[str, Any]) -> ToolCall:
        item_type = item.get("type")
        if item_type == "mcp_tool_call":
            server, tool = str(item.get("server", "")), str(item.get("tool", ""))
            arguments = item.get("arguments")
            call = ToolCall.start(
                item_id, f"mcp__{server}__{tool}",
                arguments if isinstance(arguments, dict) else {"arguments": arguments}, _now(),
            )  # fmt: skip
            return call
        if item_type == "command_execution":
            return ToolCall.start(item_id, "shell", {"command": item.get("command", "")}, _now())
        details = {k: v for k, v in item.items() if k not in ("id", "type", "status")}
        return ToolCall.start(item_id, str(item_type), details, _now())

    @staticmethod
    def _result(item: dict[str, Any]) -> tuple[str, bool]:
        item_type = item.get("type")
        status = item.get("status")
        if item_type == "mcp_tool_call":
            error = item.get("error")
            if error:
                message = error.get("message") if isinstance(error, dict) else error
                return str(message), True
            return _mcp_result_text(item.get("result")), status == "failed"
        if item_type == "command_execution":
            exit_code = item.get("exit_code")
            failed = status == "failed" or (exit_code is not None and exit_code != 0)
            return str(item.get("aggregated_output") or ""), failed
        return str(item.get("status", "")), status == "failed"

    def outcome(self, exit_code: int, stderr: Sequence[str]) -> RunOutcome:
        output = self.messages[-1] if self.messages else ""
        outcome = RunOutcome(
            output=truncate(output, OUTPUT_LIMIT),
            runtime_session_id=self.runtime_session_id,
            usage=self.usage,
            # Codex's turns are prompts, not model calls: the relay's meter counts those.
            num_turns=None,
            model=self.model,
        )
        if self.failure is None and exit_code == 0:
            if self.completed:
                return outcome
            # Exit 0 is not enough: killed helpers, a cut stream or a crash after a clean
            # exit path all end without the turn's result.
            outcome.success = False
            outcome.output = "\n\n".join(self.messages)
            outcome.error_kind = "crash"
            outcome.error = (
                "codex exited with code 0 without completing its turn (no turn.completed event)"
            )
            return outcome
        detail = self.failure or "; ".join(self.errors)
        if not detail:
            # It failed before saying anything on stdout (a bad flag, a bad config):
            # its exit code and stderr are the whole story.
            said = stderr_summary(stderr, _NOISE)
            if said is None:
                raise RuntimeCrashed(f"codex exited with code {exit_code} and no error message")
            detail = f"codex exited with code {exit_code}: {said}"
        if MCP_START_FAILED in detail:
            # Without the Rust type names Codex puts in the middle of the reason.
            reason = _RUST_TYPE.sub("", detail[detail.index(MCP_START_FAILED) :])
            self.mcp_failure = "Codex: " + reason[:400]
        failure = classify_failure(None, detail, auth_remedy=CodexAdapter.auth_remedy)
        outcome.success = False
        outcome.output = "\n\n".join(self.messages)
        outcome.error, outcome.error_kind = str(failure), failure.kind
        return outcome


def _usage(raw: dict[str, Any]) -> Usage:
    cached = int(raw.get("cached_input_tokens") or 0)
    written = int(raw.get("cache_write_input_tokens") or 0)
    total_in = int(raw.get("input_tokens") or 0)
    return Usage(
        input_tokens=max(0, total_in - cached - written),
        output_tokens=int(raw.get("output_tokens") or 0),
        cache_read_tokens=cached,
        cache_write_tokens=written,
    )


# How Codex says that a `required` MCP server did not start (the run then fails).
MCP_START_FAILED = "required MCP servers failed to initialize"
_RUST_TYPE = re.compile(r"\s*Transport \[[^\]]*\]")
# What Codex prints on stderr that never explains a failure.
_NOISE = ("Reading additional input", "Reading prompt from stdin")


class CodexAdapter(StreamingCliAdapter):
    type: ClassVar[str] = "codex"
    binary_name: ClassVar[str] = "codex"
    binary_env: ClassVar[str] = "SPAWNKIT_CODEX_CLI"
    # The version spawnkit is tested with (package.json pins the same).
    install_hint: ClassVar[str] = "npm install -g @openai/codex@0.169.0"
    auth_remedy: ClassVar[str] = "Codex is not logged in: set OPENAI_API_KEY or run `codex login`"
    other_vendor_keys: ClassVar[tuple[str, ...]] = ("ANTHROPIC_API_KEY",)
    api_key_env: ClassVar[tuple[str, ...]] = ("OPENAI_API_KEY",)
    # Without base_url Codex picks its provider by login; only an API key reaches this URL.
    default_api_url: ClassVar[str | None] = "https://api.openai.com"
    login_command: ClassVar[str | None] = "codex login"
    login_files: ClassVar[tuple[str, ...]] = (".codex/auth.json",)
    system_prompt_filename: ClassVar[str] = "CLAUDE.md"
    transcripts_dir: ClassVar[str | None] = ".codex/sessions"
    usage_at_end: ClassVar[bool] = True

    def capabilities(self) -> dict[str, Any]:
        return {
            **super().capabilities(),
            "supports_resume": True,
        }

    def cli(self) -> str:
        """Codex's native binary where ``codex`` is its npm launcher (no node start a run)."""
        native = native_codex(self.find_binary())
        return str(native.binary) if native is not None else super().cli()

    def find_install_paths(self) -> list[Path]:
        paths = super().find_install_paths()
        native = native_codex(self.find_binary())
        if native is not None and not any(native.binary.is_relative_to(p) for p in paths):
            paths.append(native.binary.parent.parent)  # vendor/<target>: bin/, codex-path/
        return paths

    def reset(self) -> None:
        super().reset()
        native_codex.cache_clear()

    def build_config_file(self, workspace: Path, server: McpServerSpec | None) -> Path:
        home = workspace / ".codex"
        home.mkdir(exist_ok=True, mode=0o700)
        servers: dict[str, Any] = {}
        if server is not None:
            entry: dict[str, Any] = {
                "url": server.url, "required": True, "default_tools_approval_mode": "approve",
            }  # fmt: skip
            if server.headers:
                # In the file, not in an env var: the agent's shell commands inherit the env.
                entry["http_headers"] = server.headers
            servers[server.name] = entry
        config = base_config(servers)
        path = home / "config.toml"
        write_private(path, tomli_w.dumps(config))
        return path

    def write_run_config(self, spec: RunSpec) -> None:
        """Add what depends on the run (prompt, model, provider) to the config file."""
        with open(spec.config_file, "rb") as fh:
            config: dict[str, Any] = tomllib.load(fh)
        config.pop("developer_instructions", None)  # written first, below
        if not SHELL_TOOLS & set(spec.tools):
            config["features"] = {
                **config.get("features", {}), "shell_tool": False, "unified_exec": False,
            }  # fmt: skip
        if spec.sandbox.kind == "bwrap":
            config["sandbox_mode"] = "danger-full-access"
        if trusts_nothing(spec):
            write_private(spec.config_file.parent / TRUST_NOTHING_FILE, TRUST_NOTHING_PEM)
            config["shell_environment_policy"] = {"exclude": ["SSL_CERT_FILE"]}
        model = run_model(spec)
        if model:
            config["model"] = model
        if spec.base_url:
            # OpenAI's own API (through the run's relay) keeps Codex's retries.
            config.update(provider_config(spec.base_url, retries=spec.default_api))
        if spec.telemetry is not None:
            config["otel"] = otel_config(spec.telemetry)
        # A top-level key, so before every table; the prompt is the one long value.
        instructions = f"developer_instructions = {toml_string(spec.system_prompt)}\n"
        write_private(spec.config_file, instructions + tomli_w.dumps(config))

    def child_env(self, spec: RunSpec) -> dict[str, str]:
        tmp = spec.workspace / "tmp"
        tmp.mkdir(exist_ok=True, mode=0o700)
        env = dict(spec.env)
        env.update(
            {
                "CODEX_HOME": str(spec.config_file.parent),
                "HOME": str(spec.workspace),
                "TMPDIR": str(tmp),
            }
        )
        env.setdefault("NO_COLOR", "1")
        native = native_codex(self.find_binary())
        if native is not None:
            env.update(native.env())  # what its launcher would have added
        if trusts_nothing(spec):
            env["SSL_CERT_FILE"] = str(spec.config_file.parent / TRUST_NOTHING_FILE)
        if spec.telemetry is not None:
            # Its spans carry the run's session id: the receiver moves any that did not
            # join the run's trace under the run's span.
            env["OTEL_RESOURCE_ATTRIBUTES"] = spec.telemetry.resource_attributes
        return env

    def command(self, spec: RunSpec) -> list[str]:
        self.write_run_config(spec)
        binary = self.cli()
        self.seed_state(spec, binary)
        # The prompt "-" reads it from stdin: a prompt of any size (one argument over
        # 128 KiB cannot be passed on Linux).
        if spec.resume:
            return [binary, "exec", "resume", "--json", "--skip-git-repo-check", spec.resume, "-"]
        return [binary, "exec", "--json", "--skip-git-repo-check", "-"]

    def check_interactive(self) -> None:
        """Codex's TUI is its interactive mode."""
        self.find_binary()

    def interactive_command(self, spec: RunSpec) -> list[str]:
        """``codex`` (its TUI) with the run's configuration; ``codex resume ID`` goes on."""
        self.write_run_config(spec)
        with open(spec.config_file, "rb") as fh:
            config: dict[str, Any] = tomllib.load(fh)
        # Its trust question, answered for the run's own folder.
        config["projects"] = {str(spec.cwd): {"trust_level": "trusted"}}
        write_private(spec.config_file, tomli_w.dumps(config))
        binary = self.cli()
        self.seed_state(spec, binary)
        if spec.resume:
            return [binary, "resume", spec.resume]
        return [binary]

    def seed_state(self, spec: RunSpec, binary: str) -> None:
        """Give the run's fresh home Codex's state databases, already made and migrated
        (:mod:`spawnkit.runtimes.codex_state`): Codex then migrates nothing at its start."""
        native = native_codex(self.find_binary())
        env = native.env() if native is not None else {}
        codex_state.seed(spec.config_file.parent, Path(binary), env, template_config)

    def stdin(self, spec: RunSpec) -> bytes | None:
        if len(spec.prompt) > MAX_PROMPT_CHARS:
            raise RuntimeFailure(
                f"the prompt is {len(spec.prompt):,} characters; Codex takes at most "
                f"{MAX_PROMPT_CHARS:,}",
                "prompt_too_large",
            )
        return spec.prompt.encode("utf-8")

    def stage_resume(self, home: Path, cwd: Path, runtime_session_id: str) -> bool:
        """``codex exec resume`` finds ``sessions/<date>/rollout-*-<id>.jsonl`` by its id."""
        kept = self.kept_transcripts()
        if kept is None or not kept.is_dir():
            return False
        found = next(kept.glob(f"**/rollout-*-{runtime_session_id}.jsonl"), None)
        if found is None:
            return False
        return copy_file(found, home / ".codex" / "sessions" / found.relative_to(kept))

    def default_model(self, base_url: str | None) -> str | None:
        return REPLAY_MODEL if base_url else None

    def parser(self, spec: RunSpec) -> LineParser:
        server = spec.mcp_server.name if spec.mcp_server else ""
        return CodexParser(spec.session_id, server, run_model(spec), spec.config_file.parent)


def run_model(spec: RunSpec) -> str | None:
    """The model a run's config names: the butler's, the replay slug for a model server
    of the butler's own, or None (Codex's default for its own API, which it never names)."""
    return spec.model or (REPLAY_MODEL if spec.base_url and not spec.default_api else None)
