"""What a butler is made of: the configuration types read from ``butler.toml``.

The bottom of spawnkit's configuration: frozen records that the roster loader
(:mod:`spawnkit.config.roster`) builds and that runtimes, the sandbox, the workspace and the
spawner read. It imports nothing of spawnkit but errors and runtime names, so every layer
above can use these types without importing the loader (see "Layers" in
``docs/design.md``). :func:`check_inside` is the one check that keeps what a butler is
made of inside its roster.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import MappingProxyType
from typing import Any, Literal, get_args

from ..errors import ConfigError, RosterError
from .limits import Limits
from .retry import RetryPolicy
from .runtime_names import canonical_runtime

McpTransport = Literal["http", "sse"]
MCP_PATHS: Mapping[str, str] = MappingProxyType({"http": "/mcp", "sse": "/sse"})

SHARED_DIR = "shared"
SYSTEM_PROMPT_FILE = "CLAUDE.md"
DEFAULT_TOOLS = ("Bash", "Read", "Glob", "Grep")

# How many entries of a butler's skills/ are checked for symlinks out; more is an error.
MAX_SKILL_ENTRIES = 10_000

# The [modules.<name>] tables spawnkit itself reads, with every key their readers take
# (memory: spawnkit.run.memory.StoreMemory.from_module_config). Any module may list its
# `credentials`. Other modules' tables belong to the butler's own code and are kept as
# written; a key these do not know is an error when the roster loads.
MODULE_KEYS: Mapping[str, frozenset[str]] = MappingProxyType(
    {"memory": frozenset({"max_tokens", "max_episodes", "credentials"})}
)


CommandOutput = Literal[
    "text", "json-lines", "auto", "claude-stream-json", "codex-json", "gemini-stream-json"
]
COMMAND_OUTPUTS: tuple[CommandOutput, ...] = get_args(CommandOutput)
CommandStdin = Literal["none", "prompt"]
# What a `command` runtime's argv may name; `{{` and `}}` are literal braces.
COMMAND_PLACEHOLDERS = frozenset(
    {
        "prompt_file", "prompt", "system_prompt_file", "mcp_config", "workspace", "cwd",
        "base_url", "model", "sources", "claude", "codex", "gemini",
    }
)  # fmt: skip
ENV_PLACEHOLDERS = frozenset(
    {"prompt_file", "system_prompt_file", "mcp_config", "workspace", "cwd", "base_url", "model"}
)
PLACEHOLDER_RE = re.compile(r"\{\{|\}\}|\{([A-Za-z_][A-Za-z0-9_]*)\}")


def placeholders(template: str) -> set[str]:
    """The ``{name}`` placeholders in ``template`` (``{{`` and ``}}`` are not)."""
    return {m.group(1) for m in PLACEHOLDER_RE.finditer(template) if m.group(1)}


@dataclass(frozen=True)
class EventMapping:
    """``[butler.runtime.events]``: how a JSON-lines CLI's lines become spawnkit events.

    A line is a JSON object whose ``type_key`` field names its kind; the other keys
    name the kinds (their ``type`` values) and the fields that carry each value.
    """

    type_key: str = "type"
    # Kinds of lines.
    text: str = "text"  # assistant text: text_field
    tool_call: str = "tool_call"  # a tool call starts: id_field, name_field, input_field
    tool_result: str = "tool_result"  # it ends: id_field, output_field, is_error_field
    result: str = "result"  # the final answer: answer_field, usage_field, is_error_field
    error: str = "error"  # a failure: message_field
    # Fields.
    text_field: str = "text"
    id_field: str = "id"
    name_field: str = "name"
    input_field: str = "input"
    output_field: str = "output"
    is_error_field: str = "is_error"
    answer_field: str = "text"
    usage_field: str = "usage"
    message_field: str = "message"
    session_field: str = "session_id"


@dataclass(frozen=True)
class CommandConfig:
    """The ``command`` runtime: any agent CLI, from its command line and output format.

    ``argv`` runs one headless turn; ``resume_argv`` continues session ``{resume}``
    (empty: the CLI cannot resume); ``chat_argv`` starts an interactive session on the
    user's terminal (empty: the CLI cannot chat; ``{resume}`` is the session a chat
    continues, or empty). ``stdin = "prompt"`` pipes the prompt to it. ``env`` values may
    use the placeholders of :data:`ENV_PLACEHOLDERS`.
    """

    argv: tuple[str, ...]
    resume_argv: tuple[str, ...] = ()
    chat_argv: tuple[str, ...] = ()
    output: CommandOutput = "text"
    stdin: CommandStdin = "none"
    env: Mapping[str, str] = field(default_factory=dict)
    events: EventMapping = field(default_factory=EventMapping)

    def prompt_on_command_line(self) -> str | None:
        """A warning when a command line passes ``{prompt}``, else None.

        An argument is readable by every local user (``/proc/PID/cmdline``, ``ps``) and
        bounded by the kernel (a prompt of a few hundred KB fails with "Argument list too
        long"); ``{prompt_file}`` (a 0600 file in the run's 0700 workspace) and
        ``stdin = "prompt"`` are neither.
        """
        keys = [
            key
            for key, argv in (
                ("command", self.argv),
                ("resume_command", self.resume_argv),
                ("chat_command", self.chat_argv),
            )
            if any("prompt" in placeholders(arg) for arg in argv)
        ]
        if not keys:
            return None
        return (
            f"[butler.runtime] {' and '.join(keys)} {'puts' if len(keys) == 1 else 'put'} "
            "the prompt on the command line "
            "({prompt}), where every local user can read it (/proc/PID/cmdline) and a long "
            'prompt fails ("Argument list too long"): use {prompt_file} (a file only you can '
            'read) or stdin = "prompt" instead'
        )


@dataclass(frozen=True)
class RuntimeConfig:
    """``[butler.runtime]``: which agent CLI runs the butler, and its limits."""

    type: str = "claude-code"
    model: str | None = None
    base_url: str | None = None
    max_turns: int = 20
    max_concurrent_sessions: int = 1
    max_queued_sessions: int = 100
    timeout_s: float = 900.0
    # Built-in tools of the CLI the agent may use besides the butler's MCP tools.
    tools: tuple[str, ...] = DEFAULT_TOOLS
    # type = "command": the CLI's command line and output format.
    command: CommandConfig | None = None
    # type = "acp": the ACP agent's command line (``["gemini", "--acp"]``).
    acp_command: tuple[str, ...] = ()


SandboxMode = Literal["bwrap", "none"]
# A sandboxed run's network: its own namespace whose only doors are spawnkit's
# ("model-only"), or the host's network as it is ("host").
NetworkPolicy = Literal["model-only", "host"]
NETWORK_POLICIES: tuple[NetworkPolicy, ...] = get_args(NetworkPolicy)

# One label of a host name (RFC 1123: letters, digits and inner hyphens).
_LABEL_RE = re.compile(r"(?!-)[A-Za-z0-9-]{1,63}(?<!-)")


def host_pattern_problem(pattern: str) -> str | None:
    """Why ``pattern`` is no ``allow_hosts`` entry, or None when it is one.

    An entry is a host name (``pypi.org``), a wildcard of its subdomains
    (``*.github.com``: any name below github.com, not github.com itself) or an IP
    literal (``10.0.0.5``, ``::1``); no scheme, port, path or other wildcard.
    """
    import ipaddress  # here: only a butler that lists hosts needs it

    try:
        ipaddress.ip_address(pattern)
        return None
    except ValueError:
        pass
    name = pattern.removeprefix("*.")
    if "*" in name:
        return f"{pattern!r}: a wildcard is only allowed as a leading '*.' (like '*.github.com')"
    labels = name.rstrip(".").split(".") if name else []
    if not labels or len(name) > 253 or not all(_LABEL_RE.fullmatch(x) for x in labels):
        return (
            f"{pattern!r} is not a host name, '*.' wildcard or IP address "
            "(write 'pypi.org', '*.github.com' or '10.0.0.5': no scheme, port or path)"
        )
    if name != pattern and len(labels) < 2:
        return f"{pattern!r} would allow a whole top-level domain: name one below it"
    return None


@dataclass(frozen=True)
class SandboxConfig:
    """``[butler.sandbox]``: how a run is contained (see :mod:`spawnkit.containment.sandbox`).

    ``mode = "none"`` is an explicit opt-out. ``read``/``write`` are extra absolute paths
    the run may see read-only / read-write besides its workspace and the butler's folder.
    ``network``: a sandboxed run gets a network namespace of its own whose only doors are
    spawnkit's (``"model-only"``, the default), or the host's network (``"host"``).
    ``allow_hosts`` (model-only only) are the hosts an egress proxy door lets it reach.
    """

    mode: SandboxMode = "bwrap"
    read: tuple[Path, ...] = ()
    write: tuple[Path, ...] = ()
    network: NetworkPolicy = "model-only"
    allow_hosts: tuple[str, ...] = ()


@dataclass(frozen=True)
class PermissionsConfig:
    """``[butler.permissions]``: tools a person must allow, call by call (``ask``).

    A tool named in ``ask`` runs only after the run's approver says yes (see
    :mod:`spawnkit.permissions`); it is asked even when ``[butler.runtime] tools`` also
    lists it (the stricter wins). Only runtimes that can stop before a tool call and ask
    take it (:data:`ASKING_RUNTIMES`).
    """

    ask: tuple[str, ...] = ()


# The runtimes that can hold a tool call until a person answers: Claude Code through the
# Agent SDK's permission callback, an ACP agent through session/request_permission.
# `codex exec` and headless `gemini` have no such hook (docs/permissions.md).
ASKING_RUNTIMES = frozenset({"claude-code", "acp"})


def cannot_ask(runtime_type: str) -> str | None:
    """Why a butler run by ``runtime_type`` cannot take ``[butler.permissions] ask``, or None."""
    if runtime_type in ASKING_RUNTIMES:
        return None
    return (
        f"the {runtime_type} runtime cannot stop a tool call to ask a person; run it as "
        'type = "acp" (command = ["codex-acp"] or ["gemini", "--acp"]), which can, '
        "or move the tool to [butler.runtime] tools"
    )


@dataclass(frozen=True)
class EnvConfig:
    """``[butler.env]``: variables the runtime must get, or gets when set."""

    required: tuple[str, ...] = ()
    optional: tuple[str, ...] = ()


@dataclass(frozen=True)
class Schedule:
    """One ``[[butler.schedule]]`` entry, fired as trigger source ``schedule:<name>``."""

    name: str
    cron: str
    prompt: str


@dataclass(frozen=True)
class AgentRole:
    """``[butler.agents.<role>]``: a role the butler's runs can delegate to."""

    name: str
    description: str
    prompt: str
    tools: tuple[str, ...] | None = None
    model: str | None = None


@dataclass(frozen=True)
class ButlerConfig:
    """A validated butler definition."""

    name: str
    port: int
    description: str
    directory: Path
    roster_dir: Path
    mcp_transport: McpTransport = "http"
    runtime: RuntimeConfig = field(default_factory=RuntimeConfig)
    env: EnvConfig = field(default_factory=EnvConfig)
    modules: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    schedules: tuple[Schedule, ...] = ()
    agents: Mapping[str, AgentRole] = field(default_factory=dict)
    # A system prompt elsewhere than <directory>/CLAUDE.md (ad-hoc butlers).
    prompt_file: Path | None = None
    sandbox: SandboxConfig = field(default_factory=SandboxConfig)
    # Where the agent works; None: its run's own workspace (ad-hoc butlers work in a folder).
    workdir: Path | None = None
    # [butler.limits]; its max_turns and timeout_s are kept in `runtime`.
    limits: Limits = field(default_factory=Limits)
    # [butler.retry]: rate-limited runs started again, and the spacing of run starts.
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    # [butler.telemetry] cli: the agent CLI exports its own spans to the run's
    # receiver (spawnkit.telemetry.otlp), joined to the run's trace. True, or the
    # signals it exports (spawnkit.config.cli_telemetry).
    cli_telemetry: bool | str = False
    # [butler.permissions]: tools allowed only when a person says yes, call by call.
    permissions: PermissionsConfig = field(default_factory=PermissionsConfig)

    @property
    def config_file(self) -> Path:
        return self.directory / "butler.toml"

    @property
    def system_prompt_file(self) -> Path:
        return self.prompt_file or self.directory / SYSTEM_PROMPT_FILE

    @property
    def mcp_path(self) -> str:
        return MCP_PATHS[self.mcp_transport]

    @property
    def module_credentials(self) -> tuple[str, ...]:
        """Env var names that enabled modules declare under ``credentials``."""
        names: list[str] = []
        for module in self.modules.values():
            names.extend(module.get("credentials", ()))
        return tuple(names)

    def with_runtime(self, runtime: str) -> ButlerConfig:
        """The same butler run by another runtime (``claude-code``, ``codex``, ``gemini``)."""
        runtime = canonical_runtime(runtime)
        if runtime == self.runtime.type:
            return self
        return replace(self, runtime=replace(self.runtime, type=runtime))

    def with_limits(self, limits: Limits) -> ButlerConfig:
        """The same butler with ``limits`` laid over its own (a flag, an option)."""
        runtime = replace(
            self.runtime,
            max_turns=limits.max_turns or self.runtime.max_turns,
            timeout_s=limits.timeout_s or self.runtime.timeout_s,
        )
        merged = replace(limits.over(self.limits), max_turns=None, timeout_s=None)
        return replace(self, runtime=runtime, limits=merged)

    def skills(self) -> list[Path]:
        """The skill folders under ``skills/``; RosterError if any of it leads out of the roster."""
        skills_dir = self.directory / "skills"
        if not skills_dir.is_dir():
            return []
        # An ad-hoc butler has no roster: its own folder is the bound.
        root = self.roster_dir if self.prompt_file is None else self.directory
        check_inside(skills_dir, root)
        entries = 0
        for folder, dirs, files in os.walk(skills_dir):  # symlinks are checked, not followed
            entries += len(dirs) + len(files)
            if entries > MAX_SKILL_ENTRIES:
                raise RosterError(skills_dir, f"more than {MAX_SKILL_ENTRIES} files and folders")
            for name in (*dirs, *files):
                if (path := Path(folder) / name).is_symlink():
                    check_inside(path, root)
        return sorted(p for p in skills_dir.iterdir() if p.is_dir() and not p.name.startswith("."))


@dataclass(frozen=True)
class Roster:
    """All butlers of one roster directory, by name."""

    directory: Path
    butlers: Mapping[str, ButlerConfig]

    def __getitem__(self, name: str) -> ButlerConfig:
        try:
            return self.butlers[name]
        except KeyError:
            known = ", ".join(sorted(self.butlers)) or "none"
            raise ConfigError(
                f"unknown butler {name!r} in roster {self.directory}; available: {known}"
            ) from None

    def __iter__(self) -> Iterator[ButlerConfig]:
        return iter(self.butlers.values())

    def __len__(self) -> int:
        return len(self.butlers)

    @property
    def shared_dir(self) -> Path:
        return self.directory / SHARED_DIR


def decode_utf8(path: Path, data: bytes) -> str:
    """``data``, the bytes of the roster file ``path``, as text; a RosterError naming the
    first byte that is not UTF-8 and where it is (roster files are UTF-8, as TOML is)."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise RosterError(
            path,
            f"not UTF-8 text (byte 0x{data[exc.start]:02x} at offset {exc.start}): "
            "save it as UTF-8",
        ) from None


def read_utf8(path: Path) -> str:
    """The text of the roster file ``path`` (see :func:`decode_utf8`)."""
    return decode_utf8(path, path.read_bytes())


def check_inside(path: Path, root: Path) -> Path:
    """``path`` resolved, if it stays inside ``root``; else a RosterError naming ``path``.

    ``path`` may itself be a symlink or sit under one: what counts is where it leads.
    """
    resolved = path.resolve()
    if not resolved.is_relative_to(root.resolve()):
        raise RosterError(
            path, f"leads outside the roster, to {resolved}: symlinks must stay inside {root}"
        )
    return resolved


__all__ = [
    "ASKING_RUNTIMES",
    "COMMAND_OUTPUTS",
    "COMMAND_PLACEHOLDERS",
    "DEFAULT_TOOLS",
    "ENV_PLACEHOLDERS",
    "MAX_SKILL_ENTRIES",
    "MCP_PATHS",
    "MODULE_KEYS",
    "NETWORK_POLICIES",
    "SHARED_DIR",
    "SYSTEM_PROMPT_FILE",
    "AgentRole",
    "ButlerConfig",
    "CommandConfig",
    "CommandOutput",
    "CommandStdin",
    "EnvConfig",
    "EventMapping",
    "McpTransport",
    "NetworkPolicy",
    "PermissionsConfig",
    "Roster",
    "RuntimeConfig",
    "SandboxConfig",
    "SandboxMode",
    "Schedule",
    "cannot_ask",
    "check_inside",
    "decode_utf8",
    "host_pattern_problem",
    "placeholders",
    "read_utf8",
]
