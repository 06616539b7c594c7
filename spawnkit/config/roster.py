"""Butler definitions: reading and validating ``roster/<name>/butler.toml``.

A roster is a directory of butlers. Each butler is a folder holding
``butler.toml`` (its configuration), ``CLAUDE.md`` (its system prompt) and
optionally ``skills/``; ``roster/shared/`` holds prompt snippets every butler
can include. Loading is strict: every problem is a :class:`RosterError` naming
the file and the key, raised when the roster loads rather than when a run
starts, so a typo never surfaces half-way through a spawn.

Nothing a butler is made of may come from outside its roster: a ``CLAUDE.md``, a
shared snippet or anything under ``skills/`` that is (or sits under) a symlink
resolving elsewhere is refused, naming the file, when the roster loads and again
when a run reads it (see :func:`check_inside`).

The types a butler is made of live in :mod:`spawnkit.config.butler_config`, below everything that
reads them; they are re-exported here, where users import them.
"""

from __future__ import annotations

import difflib
import math
import re
import tomllib
from collections.abc import Mapping
from dataclasses import fields, replace
from pathlib import Path
from types import MappingProxyType
from typing import Any, cast

from ..errors import ConfigError, RosterError
from .butler_config import (
    COMMAND_OUTPUTS,
    COMMAND_PLACEHOLDERS,
    DEFAULT_TOOLS,
    ENV_PLACEHOLDERS,
    MAX_SKILL_ENTRIES,
    MCP_PATHS,
    MODULE_KEYS,
    NETWORK_POLICIES,
    SHARED_DIR,
    SYSTEM_PROMPT_FILE,
    AgentRole,
    ButlerConfig,
    CommandConfig,
    CommandOutput,
    CommandStdin,
    EnvConfig,
    EventMapping,
    McpTransport,
    NetworkPolicy,
    PermissionsConfig,
    Roster,
    RuntimeConfig,
    SandboxConfig,
    SandboxMode,
    Schedule,
    cannot_ask,
    check_inside,
    decode_utf8,
    host_pattern_problem,
    placeholders,
    read_utf8,
)
from .cli_telemetry import CHOICE_HELP as CLI_TELEMETRY_HELP
from .cli_telemetry import parse_choice
from .limits import Limits
from .retry import RetryPolicy
from .runtime_names import canonical_runtime

_NAME_RE = re.compile(r"[a-z][a-z0-9_-]{0,62}")
_ENV_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")

DEFAULT_PROMPT = Path(__file__).parent.parent / "prompts" / "adhoc.md"


def adhoc_butler(
    runtime: str,
    directory: str | Path,
    *,
    name: str | None = None,
    prompt_file: str | Path | None = None,
    max_concurrent_sessions: int = 4,
) -> ButlerConfig:
    """A butler without a roster: runs in ``directory`` with a given or default prompt.

    Used by the shell adapter contract and the notebook when no butler is named.
    Its MCP server has no fixed port (``port = 0``): it always runs in-process.
    """
    runtime = canonical_runtime(runtime)
    folder = Path(directory).expanduser().resolve()
    prompt = Path(prompt_file).expanduser().resolve() if prompt_file else DEFAULT_PROMPT
    if not prompt.is_file():
        raise ConfigError(f"system prompt file not found: {prompt}")
    return ButlerConfig(
        name=name or f"adhoc-{runtime}",
        port=0,
        description=f"ad-hoc {runtime} runs in {folder}",
        directory=folder,
        roster_dir=prompt.parent,
        runtime=RuntimeConfig(type=runtime, max_concurrent_sessions=max_concurrent_sessions),
        prompt_file=prompt,
        sandbox=SandboxConfig(write=(folder,)),
        workdir=folder,
    )


def load_roster(directory: str | Path) -> Roster:
    """Load and validate every butler under ``directory``."""
    root = Path(directory).expanduser().resolve()
    if not root.is_dir():
        raise ConfigError(f"roster directory not found: {root}")
    butlers: dict[str, ButlerConfig] = {}
    ports: dict[int, str] = {}
    for child in sorted(root.iterdir()):
        if not child.is_dir() or child.name == SHARED_DIR or child.name[0] in "._":
            continue
        if not (child / "butler.toml").is_file():
            raise RosterError(child, "folder has no butler.toml (name it _<folder> to skip it)")
        butler = load_butler(child, roster_dir=root)
        if butler.port in ports:
            raise RosterError(
                butler.config_file,
                f"port {butler.port} is already used by butler {ports[butler.port]!r}",
                "butler.port",
            )
        ports[butler.port] = butler.name
        butlers[butler.name] = butler
    return Roster(root, MappingProxyType(butlers))


def load_butler(directory: str | Path, roster_dir: str | Path | None = None) -> ButlerConfig:
    """Load one butler folder; ``roster_dir`` defaults to its parent."""
    folder = Path(directory).expanduser().resolve()
    path = folder / "butler.toml"
    try:
        data = tomllib.loads(read_utf8(path))
    except FileNotFoundError:
        raise RosterError(path, "file not found") from None
    except tomllib.TOMLDecodeError as exc:
        raise RosterError(path, f"invalid TOML: {exc}") from None
    butler = _parse(_Reader(path, data), folder, Path(roster_dir or folder.parent).resolve())
    if not butler.system_prompt_file.is_file():
        raise RosterError(butler.system_prompt_file, "missing: every butler needs a system prompt")
    # Refused now, with the words a run would refuse it with (system_prompt.read_prompt_file).
    prompt = butler.system_prompt_file
    decode_utf8(prompt, check_inside(prompt, butler.roster_dir).read_bytes())
    butler.skills()  # refuses skills that lead out of the roster now, not at the first run
    return butler


class _Reader:
    """Typed access to a TOML table with errors that name the file and key."""

    def __init__(self, path: Path, data: Mapping[str, Any], prefix: str = "") -> None:
        self.path = path
        self.data = data
        self.prefix = prefix

    def key(self, name: str) -> str:
        return f"{self.prefix}{name}"

    def error(self, name: str, message: str) -> RosterError:
        return RosterError(self.path, message, self.key(name))

    def check_keys(self, allowed: set[str] | frozenset[str]) -> None:
        for name in self.data:
            if name not in allowed:
                known = sorted(allowed)
                close = difflib.get_close_matches(name, known, n=1)
                hint = f"did you mean {close[0]!r}? " if close else ""
                raise self.error(name, f"unknown key ({hint}allowed: {', '.join(known)})")

    def table(self, name: str, required: bool = False) -> _Reader:
        value = self.data.get(name)
        if value is None:
            if required:
                raise self.error(name, "missing table")
            value = {}
        if not isinstance(value, dict):
            raise self.error(name, "must be a table")
        return _Reader(self.path, value, f"{self.key(name)}.")

    def tables(self, name: str) -> list[_Reader]:
        value = self.data.get(name, [])
        if not isinstance(value, list) or not all(isinstance(v, dict) for v in value):
            raise self.error(name, "must be an array of tables ([[...]])")
        return [_Reader(self.path, v, f"{self.key(name)}[{i}].") for i, v in enumerate(value)]

    def string(self, name: str, default: str | None = None) -> str:
        value = self.data.get(name, default)
        if value is None:
            raise self.error(name, "missing required key")
        if not isinstance(value, str):
            raise self.error(name, f"must be a string, not {type(value).__name__}")
        return value

    def optional_string(self, name: str) -> str | None:
        value = self.string(name, "")
        return value or None

    def integer(self, name: str, default: int | None = None, minimum: int = 0) -> int:
        value = self.data.get(name, default)
        if value is None:
            raise self.error(name, "missing required key")
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.error(name, f"must be an integer, not {type(value).__name__}")
        if value < minimum:
            raise self.error(name, f"must be at least {minimum}")
        return value

    def number(self, name: str, default: float) -> float:
        value = self.data.get(name, default)
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise self.error(name, f"must be a number, not {type(value).__name__}")
        if not math.isfinite(value):  # TOML has inf and nan
            raise self.error(name, f"must be a finite number, not {value}")
        if value <= 0:
            raise self.error(name, "must be positive")
        return float(value)

    def names(self, name: str, pattern: re.Pattern[str] = _ENV_NAME_RE) -> tuple[str, ...]:
        value = self.data.get(name, [])
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise self.error(name, "must be a list of strings")
        for item in value:
            if not pattern.fullmatch(item):
                raise self.error(name, f"invalid name {item!r}")
        return tuple(value)


_TOOL_RE = re.compile(r"[A-Za-z][A-Za-z0-9_]*(\([^\n]*\))?")


def _parse(doc: _Reader, folder: Path, roster_dir: Path) -> ButlerConfig:
    doc.check_keys({"butler", "modules"})
    b = doc.table("butler", required=True)
    b.check_keys(
        {
            "name", "port", "description", "mcp_transport", "runtime", "env", "schedule",
            "agents", "sandbox", "limits", "retry", "telemetry", "permissions",
        }
    )  # fmt: skip

    name = b.string("name")
    if not _NAME_RE.fullmatch(name):
        raise b.error("name", f"invalid butler name {name!r} (lowercase letters, digits, - and _)")
    if name != folder.name:
        raise b.error("name", f"{name!r} must match the folder name {folder.name!r}")
    port = b.integer("port", minimum=1)
    if port > 65535:
        raise b.error("port", "must be at most 65535")
    transport = b.string("mcp_transport", "http")
    if transport not in MCP_PATHS:
        raise b.error("mcp_transport", f"must be 'http' or 'sse', not {transport!r}")

    r = b.table("runtime")
    r.check_keys(
        {
            "type", "model", "base_url", "max_turns", "max_concurrent_sessions",
            "max_queued_sessions", "timeout_s", "tools", *_COMMAND_KEYS,
        }
    )  # fmt: skip
    try:
        runtime_type = canonical_runtime(r.string("type", "claude-code"))
    except ConfigError as err:
        raise r.error("type", str(err)) from None
    runtime = RuntimeConfig(
        type=runtime_type,
        model=r.optional_string("model"),
        base_url=r.optional_string("base_url"),
        max_turns=r.integer("max_turns", 20, minimum=1),
        max_concurrent_sessions=r.integer("max_concurrent_sessions", 1, minimum=1),
        max_queued_sessions=r.integer("max_queued_sessions", 100, minimum=0),
        timeout_s=r.number("timeout_s", 900.0),
        tools=r.names("tools", _TOOL_RE) if "tools" in r.data else DEFAULT_TOOLS,
        command=_command(r, runtime_type),
        acp_command=_acp_command(r, runtime_type),
    )

    sandbox = _sandbox(b.table("sandbox"))
    limits = _limits(b.table("limits"), r)
    retry = _retry(b.table("retry"))
    telemetry = b.table("telemetry")
    telemetry.check_keys({"cli"})
    cli_telemetry = telemetry.data.get("cli", False)
    try:
        parse_choice(cli_telemetry)
    except ConfigError:
        raise telemetry.error("cli", f"must be {CLI_TELEMETRY_HELP}") from None
    runtime = replace(
        runtime,
        max_turns=limits.max_turns or runtime.max_turns,
        timeout_s=limits.timeout_s or runtime.timeout_s,
    )

    permissions = _permissions(b.table("permissions"), runtime_type)

    e = b.table("env")
    e.check_keys({"required", "optional"})
    env = EnvConfig(required=e.names("required"), optional=e.names("optional"))

    schedules: list[Schedule] = []
    for s in b.tables("schedule"):
        s.check_keys({"name", "cron", "prompt"})
        sname = s.string("name")
        if not _NAME_RE.fullmatch(sname):
            raise s.error("name", f"invalid schedule name {sname!r}")
        if any(existing.name == sname for existing in schedules):
            raise s.error("name", f"duplicate schedule name {sname!r}")
        cron = s.string("cron")
        from croniter import croniter  # here, not at import: it costs a CLI start 0.1 s

        if not croniter.is_valid(cron):
            raise s.error("cron", f"invalid cron expression {cron!r}")
        prompt = s.string("prompt")
        if not prompt.strip():
            raise s.error("prompt", "must not be empty")
        schedules.append(Schedule(sname, cron, prompt))

    agents: dict[str, AgentRole] = {}
    a = b.table("agents")
    for role in a.data:
        if not _NAME_RE.fullmatch(role):
            raise a.error(role, f"invalid role name {role!r}")
        r_ = a.table(role)
        r_.check_keys({"description", "prompt", "prompt_file", "tools", "model"})
        if ("prompt" in r_.data) == ("prompt_file" in r_.data):
            raise r_.error("prompt", "give exactly one of prompt and prompt_file")
        if "prompt_file" in r_.data:
            prompt_path = (folder / r_.string("prompt_file")).resolve()
            if not prompt_path.is_relative_to(folder) or not prompt_path.is_file():
                raise r_.error("prompt_file", f"no such file inside the butler: {prompt_path}")
            prompt_text = read_utf8(prompt_path)
        else:
            prompt_text = r_.string("prompt")
        agents[role] = AgentRole(
            name=role,
            description=r_.string("description"),
            prompt=prompt_text,
            tools=r_.names("tools", _TOOL_RE) if "tools" in r_.data else None,
            model=r_.optional_string("model"),
        )

    modules: dict[str, Mapping[str, Any]] = {}
    m = doc.table("modules")
    for module_name in m.data:
        module = m.table(module_name)
        if module_name in MODULE_KEYS:
            module.check_keys(MODULE_KEYS[module_name])
        if module_name == "memory":
            for key in ("max_tokens", "max_episodes"):  # StoreMemory's budgets
                if key in module.data:
                    module.integer(key, minimum=1)
        if "credentials" in module.data:
            module.names("credentials")
        modules[module_name] = MappingProxyType(dict(module.data))

    return ButlerConfig(
        name=name,
        port=port,
        description=b.string("description", ""),
        directory=folder,
        roster_dir=roster_dir,
        mcp_transport=cast(McpTransport, transport),
        runtime=runtime,
        env=env,
        modules=MappingProxyType(modules),
        schedules=tuple(schedules),
        agents=MappingProxyType(agents),
        sandbox=sandbox,
        limits=replace(limits, max_turns=None, timeout_s=None),
        retry=retry,
        cli_telemetry=cli_telemetry,
        permissions=permissions,
    )


# A tool that ``ask`` names: a whole tool ("Write", "mcp__health__state_set"), no pattern.
_ASK_TOOL_RE = re.compile(r"[A-Za-z][A-Za-z0-9_-]*")


def _permissions(t: _Reader, runtime_type: str) -> PermissionsConfig:
    t.check_keys({"ask"})
    value = t.data.get("ask", [])
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise t.error("ask", 'must be a list of tool names, like ["Write", "Edit"]')
    for item in value:
        if not _ASK_TOOL_RE.fullmatch(item):
            raise t.error("ask", f"{item!r} is not a tool name (a whole tool, like 'Bash')")
    if value and (why := cannot_ask(runtime_type)):
        raise t.error("ask", why)
    return PermissionsConfig(ask=tuple(dict.fromkeys(value)))


def _limits(t: _Reader, runtime: _Reader) -> Limits:
    t.check_keys(
        {"max_cost_usd", "max_tokens", "count_cache_reads", "max_turns", "timeout_s",
         "daily_cost_usd"}
    )  # fmt: skip
    for name in ("max_turns", "timeout_s"):
        if name in t.data and name in runtime.data:
            raise t.error(name, f"also set as {runtime.key(name)}: give it in one place")
    count = t.data.get("count_cache_reads", False)
    if not isinstance(count, bool):
        raise t.error("count_cache_reads", "must be true or false")
    return Limits(
        max_cost_usd=t.number("max_cost_usd", 1.0) if "max_cost_usd" in t.data else None,
        max_tokens=t.integer("max_tokens", minimum=1) if "max_tokens" in t.data else None,
        count_cache_reads=count,
        max_turns=t.integer("max_turns", minimum=1) if "max_turns" in t.data else None,
        timeout_s=t.number("timeout_s", 1.0) if "timeout_s" in t.data else None,
        daily_cost_usd=t.number("daily_cost_usd", 1.0) if "daily_cost_usd" in t.data else None,
    )


def _retry(t: _Reader) -> RetryPolicy:
    t.check_keys({"max_attempts", "backoff_s", "max_backoff_s", "stagger_s"})
    default = RetryPolicy()
    policy = RetryPolicy(
        max_attempts=t.integer("max_attempts", default.max_attempts, minimum=1),
        backoff_s=t.number("backoff_s", default.backoff_s),
        max_backoff_s=t.number("max_backoff_s", default.max_backoff_s),
        # 0 (the default) spaces nothing.
        stagger_s=t.number("stagger_s", 1.0) if t.data.get("stagger_s", 0) != 0 else 0.0,
    )
    return policy


_COMMAND_KEYS = (
    "command", "resume_command", "chat_command", "output", "stdin", "env", "events",
)  # fmt: skip


def _acp_command(r: _Reader, runtime_type: str) -> tuple[str, ...]:
    """``[butler.runtime] command`` of the ``acp`` runtime: the agent's argv (required)."""
    if runtime_type != "acp":
        return ()
    value = r.data.get("command")
    if value is None:
        raise r.error(
            "command", 'type = "acp" needs the agent\'s command, like ["gemini", "--acp"]'
        )
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise r.error("command", 'must be a list of strings, like ["gemini", "--acp"]')
    if not value or not value[0].strip():
        raise r.error("command", "must name a program")
    return tuple(value)


def _command(r: _Reader, runtime_type: str) -> CommandConfig | None:
    """``[butler.runtime]``'s keys of the ``command`` runtime (for it only, and required)."""
    given = [key for key in _COMMAND_KEYS if key in r.data]
    if runtime_type == "acp":
        if extra := [key for key in given if key != "command"]:
            raise r.error(extra[0], 'a runtime of type = "acp" takes only command (its argv)')
        return None
    if runtime_type != "command":
        if given:
            raise r.error(given[0], 'only a runtime of type = "command" takes it')
        return None
    if "command" not in r.data:
        raise r.error("command", 'type = "command" needs a command (an argv list)')

    def argv(name: str, allowed: frozenset[str]) -> tuple[str, ...]:
        value = r.data.get(name, [])
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise r.error(name, "must be a list of strings")
        for arg in value:
            unknown = sorted(placeholders(arg) - allowed)
            if unknown:
                known = ", ".join("{" + p + "}" for p in sorted(allowed))
                raise r.error(name, f"unknown placeholder {{{unknown[0]}}}; use {known}")
        return tuple(value)

    command = argv("command", COMMAND_PLACEHOLDERS)
    if not command or not command[0]:
        raise r.error("command", "must name a program")
    output = r.string("output", "text")
    if output not in COMMAND_OUTPUTS:
        raise r.error("output", f"must be one of {', '.join(COMMAND_OUTPUTS)}, not {output!r}")
    stdin = r.string("stdin", "none")
    if stdin not in ("none", "prompt"):
        raise r.error("stdin", f"must be 'none' or 'prompt', not {stdin!r}")
    env = r.data.get("env", {})
    if not isinstance(env, dict) or not all(isinstance(v, str) for v in env.values()):
        raise r.error("env", "must be a table of strings")
    for value in env.values():
        if bad := sorted(placeholders(value) - ENV_PLACEHOLDERS):
            raise r.error("env", f"unknown placeholder {{{bad[0]}}}")
    e = r.table("events")
    known = {f.name for f in fields(EventMapping)}
    e.check_keys(known)
    events = EventMapping(**{name: e.string(name) for name in known if name in e.data})
    return CommandConfig(
        argv=command,
        resume_argv=argv("resume_command", COMMAND_PLACEHOLDERS | {"resume"}),
        chat_argv=argv("chat_command", COMMAND_PLACEHOLDERS | {"resume"}),
        output=output,
        stdin=cast(CommandStdin, stdin),
        env=MappingProxyType(dict(env)),
        events=events,
    )


def _sandbox(t: _Reader) -> SandboxConfig:
    t.check_keys({"mode", "read", "write", "network", "allow_hosts"})
    mode = t.string("mode", "bwrap")
    if mode not in ("bwrap", "none"):
        raise t.error("mode", f"must be 'bwrap' or 'none', not {mode!r}")
    network = t.string("network", "model-only")
    if network not in NETWORK_POLICIES:
        raise t.error("network", f"must be 'model-only' or 'host', not {network!r}")
    return SandboxConfig(
        mode=cast(SandboxMode, mode),
        read=_abs_paths(t, "read"),
        write=_abs_paths(t, "write"),
        network=network,
        allow_hosts=_allow_hosts(t, network),
    )


def _allow_hosts(t: _Reader, network: str) -> tuple[str, ...]:
    value = t.data.get("allow_hosts", [])
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise t.error("allow_hosts", "must be a list of host names")
    if value and network == "host":
        raise t.error(
            "allow_hosts",
            'has no effect with network = "host" (the run reaches every host): remove one',
        )
    for item in value:
        if problem := host_pattern_problem(item):
            raise t.error("allow_hosts", problem)
    return tuple(dict.fromkeys(item.lower().rstrip(".") for item in value))


def _abs_paths(t: _Reader, name: str) -> tuple[Path, ...]:
    value = t.data.get(name, [])
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise t.error(name, "must be a list of paths")
    paths = []
    for item in value:
        path = Path(item).expanduser()
        if not path.is_absolute():
            raise t.error(name, f"{item!r} must be an absolute path")
        paths.append(path.resolve())
    return tuple(paths)


__all__ = [
    "COMMAND_OUTPUTS",
    "COMMAND_PLACEHOLDERS",
    "DEFAULT_PROMPT",
    "DEFAULT_TOOLS",
    "ENV_PLACEHOLDERS",
    "MAX_SKILL_ENTRIES",
    "MCP_PATHS",
    "MODULE_KEYS",
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
    "adhoc_butler",
    "check_inside",
    "load_butler",
    "load_roster",
    "placeholders",
]
