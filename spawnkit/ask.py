"""Ask mode: answer a question about registered sources with an isolated agent run.

:func:`ask` resolves the source names (every unknown one is reported before anything
starts), renders the user's prompt template, prepares ``<tempdir>/spawnkit-ask-<uuid>/``
(each source linked by its name, an empty MCP configuration for every CLI that reads
one from its working directory, ``prompt.md``), runs the configured agent CLI headless
there with an exact environment through :func:`spawnkit._process.run_lines`, and
returns its answer. The directory is removed however the run ends. :func:`chat` runs
the same agent interactively in the same kind of directory, on the user's terminal.
Frontends (the command line, ``%%ask``, a chat widget) are thin layers over
:func:`ask`, :func:`chat`, :func:`prepare_workdir` and :func:`ask_turn`.

Which CLI runs, and how, is an *agent command template* (``$SPAWNKIT_HOME/ask.toml``):
an argv list with ``{placeholders}``, how the prompt reaches it, how to read its output.
``claude-code`` (the default), ``codex`` and ``gemini`` are built in; any other CLI
can be added, including one that prints a plain-text answer. Errors::

    SpawnkitError
    ├── ConfigError
    │   ├── TemplateError         the prompt template lacks ${question} / ${sourcesList}
    │   ├── AskConfigError        ask.toml is malformed; names the file and the key
    │   └── UnknownRuntimeError   no agent of that name (from spawnkit.errors)
    ├── RuntimeNotFoundError      the agent's CLI is not installed (before anything runs)
    └── AskError                  the agent ran and failed or timed out; carries its stderr
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import re
import shutil
import tempfile
import time
import tomllib
import uuid
from collections import deque
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal, get_args

import tomli_w

from . import _process
from .errors import ConfigError, RuntimeFailure, SpawnkitError, UnknownRuntimeError
from .events import (
    AssistantText,
    EventSink,
    RunEvent,
    TextDelta,
    ToolCallFinished,
    ToolCallStarted,
    UsageUpdate,
)
from .home import spawnkit_home
from .result import OUTPUT_LIMIT, ToolCall, Usage, truncate
from .runtimes import ALIASES, codex, gemini
from .runtimes.base import RunOutcome
from .runtimes.streaming import LineParser
from .sources import Source, SourceError, SourcePathError, SourceRegistry, validate_name

logger = logging.getLogger(__name__)

# -- the prompt template -------------------------------------------------------------

TEMPLATE_FILE = "prompt_template.md"
DEFAULT_TEMPLATE = Path(__file__).parent / "prompts" / "ask_template.md"
REQUIRED_PLACEHOLDERS = ("question", "sourcesList")
# Only these two are placeholders; every other `$` (and `${other}`) is text.
_TEMPLATE_PLACEHOLDER = re.compile(r"\$\{(question|sourcesList)\}")


class TemplateError(ConfigError):
    """The prompt template cannot be used: ``missing`` names the absent placeholders."""

    def __init__(self, missing: Sequence[str], path: Path | None = None) -> None:
        self.missing = tuple(missing)
        self.path = path
        super().__init__(
            "Invalid prompt template: "
            + "; ".join(f"missing required placeholder ${{{name}}}" for name in self.missing)
        )


def template_path() -> Path:
    """``$SPAWNKIT_HOME/prompt_template.md``."""
    return spawnkit_home() / TEMPLATE_FILE


def ensure_template(path: Path | None = None) -> Path:
    """The user's template, created from the bundled default when missing (never overwritten)."""
    target = path if path is not None else template_path()
    if not target.exists():
        target.parent.mkdir(parents=True, exist_ok=True)
        # Exclusive create: a template written meanwhile by another process wins.
        with contextlib.suppress(FileExistsError), open(target, "x", encoding="utf-8") as fh:
            fh.write(DEFAULT_TEMPLATE.read_text(encoding="utf-8"))
    return target


def validate_template(text: str, path: Path | None = None) -> None:
    """Raise :class:`TemplateError` naming every required placeholder ``text`` lacks."""
    present = set(_TEMPLATE_PLACEHOLDER.findall(text))
    missing = [name for name in REQUIRED_PLACEHOLDERS if name not in present]
    if missing:
        raise TemplateError(missing, path)


def load_template(path: Path | None = None) -> str:
    """The user's template text (created first if missing), validated."""
    target = ensure_template(path)
    text = target.read_text(encoding="utf-8")
    validate_template(text, target)
    return text


def sources_list(sources: Iterable[Source | str]) -> str:
    """One ``- ./name/`` line per source (``- ./name`` for a file source)."""
    lines = []
    for source in sources:
        if isinstance(source, Source):
            suffix = "" if source.kind == "file" else "/"
            lines.append(f"- ./{source.name}{suffix}")
        else:
            lines.append(f"- ./{source}/")
    return "\n".join(lines)


def render_prompt(template_text: str, question: str, sources: Iterable[Source | str]) -> str:
    """Substitute ``${question}`` and ``${sourcesList}``; everything else stays as written.

    Both are replaced in one pass, so a question that itself contains
    ``${sourcesList}`` is not expanded.
    """
    validate_template(template_text)
    values = {"question": question.strip(), "sourcesList": sources_list(sources)}
    return _TEMPLATE_PLACEHOLDER.sub(lambda match: values[match.group(1)], template_text)


# -- agent command templates -----------------------------------------------------------

CONFIG_FILE = "ask.toml"
DEFAULT_AGENT = "claude-code"
DEFAULT_TIMEOUT_S = 600.0
# An interactive session ends when the user ends it; this only bounds a forgotten one.
CHAT_TIMEOUT_S = 24 * 3600.0

OutputFormat = Literal["auto", "claude-stream-json", "codex-json", "gemini-stream-json", "text"]
Setup = Literal["claude-code", "codex", "gemini", "none"]
StdinMode = Literal["prompt", "none"]
OUTPUT_FORMATS: tuple[OutputFormat, ...] = get_args(OutputFormat)
SETUPS: tuple[Setup, ...] = get_args(Setup)
STDIN_MODES: tuple[StdinMode, ...] = get_args(StdinMode)

# Placeholders in argv templates; `{{` and `}}` are literal braces.
_ARG_PLACEHOLDER = re.compile(r"\{\{|\}\}|\{([A-Za-z_][A-Za-z0-9_]*)\}")
_BINARIES = ("claude", "codex", "gemini")
_COMMON_PLACEHOLDERS = frozenset({"workdir", "mcp_config", "base_url", "sources", *_BINARIES})
_PROMPT_PLACEHOLDERS = frozenset({"prompt", "prompt_file"})
_ENV_PLACEHOLDERS = frozenset({"workdir", "mcp_config", "base_url"})
_AGENT_KEYS = frozenset(
    {"command", "chat_command", "resume_command", "output", "stdin", "setup", "env", "pass_env"}
)
_ASK_KEYS = frozenset({"default", "timeout_s", "agents"})


@dataclass(frozen=True)
class AgentCommand:
    """How ask mode runs one agent CLI.

    ``command`` runs one headless turn; ``resume_command`` continues a session
    (``{resume}`` is the runtime's session id); ``chat_command`` starts an
    interactive session (empty: not supported). ``stdin="prompt"`` pipes the
    prompt to the CLI; otherwise it gets ``{prompt_file}`` or ``{prompt}`` in
    its argv and an empty stdin. ``output`` says how to read stdout (``auto``
    recognises the three built-in JSON streams, else takes stdout as the
    answer). ``setup`` writes the private configuration a built-in CLI needs and
    sets its variables. The child's environment is ``PATH``, ``HOME``, the
    host variables named in ``pass_env`` that are set, what ``setup`` sets, then
    ``env`` (values may use ``{workdir}``, ``{mcp_config}``, ``{base_url}``).
    """

    name: str
    command: tuple[str, ...]
    chat_command: tuple[str, ...] = ()
    resume_command: tuple[str, ...] = ()
    output: OutputFormat = "auto"
    stdin: StdinMode = "none"
    setup: Setup = "none"
    env: Mapping[str, str] = field(default_factory=dict)
    pass_env: tuple[str, ...] = ()

    def to_toml(self) -> dict[str, Any]:
        return {
            "command": list(self.command),
            "chat_command": list(self.chat_command),
            "resume_command": list(self.resume_command),
            "output": self.output,
            "stdin": self.stdin,
            "setup": self.setup,
            "env": dict(self.env),
            "pass_env": list(self.pass_env),
        }


_CLAUDE_TOOLS = "Read,Glob,Grep,Bash"
_CLAUDE_LOCKDOWN = (
    "--mcp-config", "{mcp_config}", "--strict-mcp-config", "--setting-sources", "",
    "--tools", _CLAUDE_TOOLS, "--allowedTools", _CLAUDE_TOOLS, "--permission-mode", "dontAsk",
)  # fmt: skip
_CLAUDE_HEADLESS = (
    "{claude}", "-p", "--output-format", "stream-json", "--verbose",
    "--include-partial-messages", *_CLAUDE_LOCKDOWN,
)  # fmt: skip
CHAT_INSTRUCTIONS = (
    "You answer questions about the sources linked into the current directory:\n{sources}\n"
    "Search inside each source by its path (a search started at `.` does not follow the "
    "links), read the relevant files, cite them as ./name/path, and do not change any file."
)
GEMINI_MODEL = "gemini-2.5-flash"
CODEX_LOCAL_MODEL = codex.REPLAY_MODEL
_GEMINI_HEADLESS = ("{gemini}", "-m", GEMINI_MODEL, "--output-format", "stream-json", "-p", "")
_CODEX_EXEC = ("{codex}", "exec", "--json", "--skip-git-repo-check")
# What Claude Code needs from the host to authenticate (HOME holds a `claude login`).
_CLAUDE_ENV = (
    "ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN", "CLAUDE_CODE_OAUTH_TOKEN", "CLAUDE_CONFIG_DIR",
)  # fmt: skip

BUILTIN_AGENTS: Mapping[str, AgentCommand] = {
    "claude-code": AgentCommand(
        name="claude-code",
        command=_CLAUDE_HEADLESS,
        resume_command=(*_CLAUDE_HEADLESS, "--resume", "{resume}"),
        chat_command=("{claude}", *_CLAUDE_LOCKDOWN, "--append-system-prompt", CHAT_INSTRUCTIONS),
        output="claude-stream-json",
        stdin="prompt",
        setup="claude-code",
        pass_env=_CLAUDE_ENV,
    ),
    "codex": AgentCommand(
        name="codex",
        command=(*_CODEX_EXEC, "-"),
        resume_command=(*_CODEX_EXEC[:2], "resume", *_CODEX_EXEC[2:], "{resume}", "-"),
        chat_command=("{codex}",),
        output="codex-json",
        stdin="prompt",
        setup="codex",
        pass_env=("OPENAI_API_KEY",),
    ),
    "gemini": AgentCommand(
        name="gemini",
        command=_GEMINI_HEADLESS,
        resume_command=(*_GEMINI_HEADLESS, "--resume", "{resume}"),
        chat_command=("{gemini}", "-m", GEMINI_MODEL),
        output="gemini-stream-json",
        stdin="prompt",
        setup="gemini",
        pass_env=("GEMINI_API_KEY", "GOOGLE_API_KEY"),
    ),
}


class AskConfigError(ConfigError):
    """``ask.toml`` cannot be used; the message names the file and the key."""

    def __init__(self, path: Path | str, message: str, key: str | None = None) -> None:
        self.path = Path(path)
        self.key = key
        where = f"{self.path}" + (f": [{key}]" if key else "")
        super().__init__(f"{where}: {message}")


@dataclass(frozen=True)
class AskConfig:
    """The agents ask mode knows (built-ins with the user's changes) and the default one."""

    agents: Mapping[str, AgentCommand]
    default: str = DEFAULT_AGENT
    timeout_s: float = DEFAULT_TIMEOUT_S
    path: Path | None = None

    def agent(self, name: str | None = None) -> AgentCommand:
        """The agent called ``name`` (the default one when None)."""
        chosen = name or self.default
        if chosen not in self.agents:
            # A runtime's other name (`claude` for `claude-code`), as everywhere else.
            chosen = ALIASES.get(chosen, chosen)
        try:
            return self.agents[chosen]
        except KeyError:
            raise UnknownRuntimeError(chosen, list(self.agents), ALIASES) from None


def config_path() -> Path:
    """``$SPAWNKIT_HOME/ask.toml``."""
    return spawnkit_home() / CONFIG_FILE


def load_config(path: Path | None = None) -> AskConfig:
    """Read ``ask.toml`` (built-in defaults when it does not exist).

    ``[ask.agents.NAME]`` tables add agents; a table named like a built-in
    changes only the keys it gives.
    """
    source = path if path is not None else config_path()
    try:
        with open(source, "rb") as fh:
            document = tomllib.load(fh)
    except FileNotFoundError:
        return AskConfig(agents=dict(BUILTIN_AGENTS), path=source)
    except tomllib.TOMLDecodeError as exc:
        raise AskConfigError(source, f"not valid TOML: {exc}") from exc
    return parse_config(document, source)


def parse_config(document: Mapping[str, Any], path: Path) -> AskConfig:
    """Validate a decoded ``ask.toml``; every template is checked here, before any run."""
    unknown_top = sorted(set(document) - {"ask"})
    if unknown_top:
        raise AskConfigError(path, f"unknown tables {', '.join(unknown_top)}")
    table = document.get("ask", {})
    if not isinstance(table, dict):
        raise AskConfigError(path, "must be a table", "ask")
    unknown = sorted(set(table) - _ASK_KEYS)
    if unknown:
        raise AskConfigError(path, f"unknown keys {', '.join(unknown)}", "ask")
    agents = dict(BUILTIN_AGENTS)
    raw_agents = table.get("agents", {})
    if not isinstance(raw_agents, dict):
        raise AskConfigError(path, "must be a table", "ask.agents")
    for name, entry in raw_agents.items():
        agents[name] = _parse_agent(name, entry, path, agents.get(name))
    default = table.get("default", DEFAULT_AGENT)
    if not isinstance(default, str) or default not in agents:
        raise AskConfigError(
            path, f"default {default!r} is not an agent; known: {', '.join(sorted(agents))}", "ask"
        )
    timeout = table.get("timeout_s", DEFAULT_TIMEOUT_S)
    if isinstance(timeout, bool) or not isinstance(timeout, int | float) or timeout <= 0:
        raise AskConfigError(path, "timeout_s must be a positive number of seconds", "ask")
    return AskConfig(agents=agents, default=default, timeout_s=float(timeout), path=path)


def _parse_agent(name: str, entry: Any, path: Path, base: AgentCommand | None) -> AgentCommand:
    key = f"ask.agents.{name}"
    if not isinstance(entry, dict):
        raise AskConfigError(path, "must be a table", key)
    unknown = sorted(set(entry) - _AGENT_KEYS)
    if unknown:
        raise AskConfigError(path, f"unknown keys {', '.join(unknown)}", key)
    merged = {**(base.to_toml() if base is not None else {}), **entry}
    if "command" not in merged:
        raise AskConfigError(path, "command is required (an argv list)", key)

    def argv(field_name: str, allowed: frozenset[str]) -> tuple[str, ...]:
        value = merged.get(field_name, [])
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise AskConfigError(path, f"{field_name} must be a list of strings", key)
        for arg in value:
            for placeholder in _placeholders(arg):
                if placeholder not in allowed:
                    raise AskConfigError(
                        path,
                        f"{field_name}: unknown placeholder {{{placeholder}}}; "
                        f"use {', '.join('{' + p + '}' for p in sorted(allowed))}",
                        key,
                    )
        return tuple(value)

    def choice(field_name: str, options: tuple[str, ...], default: str) -> Any:
        value = merged.get(field_name, default)
        if value not in options:
            raise AskConfigError(
                path, f"{field_name} must be one of {', '.join(options)}, not {value!r}", key
            )
        return value

    command = argv("command", _COMMON_PLACEHOLDERS | _PROMPT_PLACEHOLDERS)
    if not command or not command[0]:
        raise AskConfigError(path, "command must name a program", key)
    env = merged.get("env", {})
    if not isinstance(env, dict) or not all(isinstance(v, str) for v in env.values()):
        raise AskConfigError(path, "env must be a table of strings", key)
    for value in env.values():
        bad = _placeholders(value) - _ENV_PLACEHOLDERS
        if bad:
            raise AskConfigError(path, f"env: unknown placeholder {{{sorted(bad)[0]}}}", key)
    pass_env = merged.get("pass_env", [])
    if not isinstance(pass_env, list) or not all(isinstance(v, str) for v in pass_env):
        raise AskConfigError(path, "pass_env must be a list of variable names", key)
    return AgentCommand(
        name=name,
        command=command,
        chat_command=argv("chat_command", _COMMON_PLACEHOLDERS),
        resume_command=argv(
            "resume_command", _COMMON_PLACEHOLDERS | _PROMPT_PLACEHOLDERS | {"resume"}
        ),
        output=choice("output", OUTPUT_FORMATS, "auto"),
        stdin=choice("stdin", STDIN_MODES, "none"),
        setup=choice("setup", SETUPS, "none"),
        env=dict(env),
        pass_env=tuple(pass_env),
    )


def save_config(config: AskConfig, path: Path | None = None) -> Path:
    """Write ``config``'s default and its non-built-in or changed agents to ``ask.toml``."""
    target = path if path is not None else (config.path or config_path())
    agents = {
        name: agent.to_toml()
        for name, agent in config.agents.items()
        if BUILTIN_AGENTS.get(name) != agent
    }
    ask_table: dict[str, Any] = {"default": config.default, "timeout_s": config.timeout_s}
    if agents:
        ask_table["agents"] = agents
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.{uuid.uuid4().hex}")
    tmp.write_text(tomli_w.dumps({"ask": ask_table}), encoding="utf-8")
    tmp.replace(target)
    return target


def _placeholders(template: str) -> set[str]:
    return {m.group(1) for m in _ARG_PLACEHOLDER.finditer(template) if m.group(1)}


def expand(template: str, values: Mapping[str, str]) -> str:
    """Replace each ``{name}`` by ``values[name]``; ``{{`` and ``}}`` are literal braces."""

    def one(match: re.Match[str]) -> str:
        name = match.group(1)
        if name is None:
            return match.group(0)[0]
        return values[name]

    return _ARG_PLACEHOLDER.sub(one, template)


def find_binaries(templates: Iterable[str]) -> dict[str, str]:
    """Resolve the ``{claude}``/``{codex}``/``{gemini}`` CLIs the templates use.

    Raises :class:`~spawnkit.errors.RuntimeNotFoundError` (with how to install
    it) for a missing one, so a missing CLI fails before any directory exists.
    """
    from .runtimes import get_adapter

    wanted = {name for template in templates for name in _placeholders(template)}
    adapters = {"claude": "claude-code", "codex": "codex", "gemini": "gemini"}
    return {
        name: str(get_adapter(adapters[name])().find_binary())
        for name in _BINARIES
        if name in wanted
    }


# -- the working directory -----------------------------------------------------------

WORKDIR_PREFIX = "spawnkit-ask-"
PROMPT_FILE = "prompt.md"
MCP_CONFIG_FILE = ".mcp.json"
# Where a built-in CLI's private home lives (hidden: agents' searches skip dot folders).
PRIVATE_DIR = ".spawnkit"
# "No MCP servers" for every CLI that reads a config from its working directory.
EMPTY_MCP_CONFIGS: Mapping[str, Mapping[str, Any]] = {
    MCP_CONFIG_FILE: {"mcpServers": {}},  # Claude Code (project scope)
    ".gemini/settings.json": {"mcpServers": {}},  # Gemini CLI (workspace settings)
    ".cursor/mcp.json": {"mcpServers": {}},  # Cursor
    "opencode.json": {"mcp": {}},  # opencode
}


def resolve_sources(
    sources: str | Iterable[str | Source], registry: SourceRegistry | None = None
) -> list[Source]:
    """Sources from names (a list, or ``"a,b"``) or :class:`Source` records.

    Every unknown name is reported at once by
    :class:`~spawnkit.sources.UnknownSourceError`; duplicates are dropped.
    """
    if isinstance(sources, str):
        items: list[str | Source] = [part.strip() for part in sources.split(",") if part.strip()]
    else:
        items = list(sources)
    if not items:
        raise SourceError("no sources given: name at least one registered source")
    names = [item for item in items if isinstance(item, str)]
    found = {s.name: s for s in (registry or SourceRegistry()).resolve(names)} if names else {}
    resolved: dict[str, Source] = {}
    for item in items:
        source = found[item] if isinstance(item, str) else item
        validate_name(source.name)
        resolved.setdefault(source.name, source)
    return list(resolved.values())


def prepare_workdir(
    sources: str | Iterable[str | Source],
    *,
    registry: SourceRegistry | None = None,
    root: Path | None = None,
) -> Path:
    """Create ``<root or tempdir>/spawnkit-ask-<uuid>/`` with the sources linked by name.

    The directory also holds an empty MCP configuration for each CLI that reads
    one from its working directory, so an agent started there reaches no MCP
    server. The caller owns the directory: remove it with :func:`remove_workdir`
    (or use :func:`ask_workdir`). Nothing is created when a source is unknown or
    its path is gone.
    """
    resolved = resolve_sources(sources, registry)
    for source in resolved:
        if not source.path.exists():
            hint = " (run `spawnkit sources update`)" if source.kind == "git" else ""
            raise SourcePathError(source.path, f"source {source.name!r} does not exist{hint}")
    base = root if root is not None else Path(tempfile.gettempdir())
    workdir = base / f"{WORKDIR_PREFIX}{uuid.uuid4().hex}"
    workdir.mkdir(mode=0o700)
    try:
        for source in resolved:
            (workdir / source.name).symlink_to(
                source.path, target_is_directory=source.path.is_dir()
            )
        for relative, content in EMPTY_MCP_CONFIGS.items():
            target = workdir / relative
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(json.dumps(content, indent=2) + "\n", encoding="utf-8")
    except BaseException:
        remove_workdir(workdir)
        raise
    return workdir


def remove_workdir(workdir: Path) -> None:
    """Delete a directory made by :func:`prepare_workdir`; links are removed, never followed."""
    if not workdir.name.startswith(WORKDIR_PREFIX):
        raise ValueError(f"{workdir} is not an ask working directory")
    shutil.rmtree(workdir, ignore_errors=True)
    if workdir.exists():
        logger.warning("could not remove the ask working directory %s", workdir)


@contextlib.contextmanager
def ask_workdir(
    sources: str | Iterable[str | Source],
    *,
    registry: SourceRegistry | None = None,
    root: Path | None = None,
) -> Iterator[Path]:
    """:func:`prepare_workdir`, removed however the block ends."""
    workdir = prepare_workdir(sources, registry=registry, root=root)
    try:
        yield workdir
    finally:
        remove_workdir(workdir)


def linked_sources(workdir: Path) -> list[tuple[str, Path]]:
    """The sources linked in ``workdir``: (name, resolved target), sorted by name."""
    return sorted(
        (entry.name, entry.resolve())
        for entry in workdir.iterdir()
        if entry.is_symlink() and not entry.name.startswith(".")
    )


def _workdir_sources_list(workdir: Path) -> str:
    return "\n".join(
        f"- ./{name}{'/' if target.is_dir() else ''}" for name, target in linked_sources(workdir)
    )


# -- building one invocation (pure, apart from reading the links) ---------------------

TERMINAL_ENV = ("TERM", "COLORTERM", "LANG", "LC_ALL", "LC_CTYPE", "COLUMNS", "LINES")
Mode = Literal["headless", "resume", "chat"]


@dataclass(frozen=True)
class Invocation:
    """A CLI run, fully decided: what to start, where, with which variables and stdin."""

    argv: tuple[str, ...]
    env: Mapping[str, str]
    cwd: Path
    stdin: bytes | None


def private_home(agent: AgentCommand, workdir: Path) -> Path | None:
    """The private HOME a built-in CLI gets inside ``workdir`` (None: the user's HOME)."""
    if agent.setup in ("codex", "gemini"):
        return workdir / PRIVATE_DIR / f"{agent.setup}-home"
    return None


def build_invocation(
    agent: AgentCommand,
    workdir: Path,
    *,
    mode: Mode = "headless",
    prompt: str | None = None,
    resume: str | None = None,
    base_url: str | None = None,
    env: Mapping[str, str] | None = None,
    binaries: Mapping[str, str] | None = None,
    environ: Mapping[str, str] | None = None,
) -> Invocation:
    """The argv, environment and stdin for one run of ``agent`` in ``workdir``.

    ``environ`` is the host environment (default ``os.environ``): only ``PATH``,
    ``HOME``, the agent's ``pass_env`` names and, for ``mode="chat"``, the
    terminal's variables are taken from it. ``env`` (the caller's) is applied last.
    """
    host = os.environ if environ is None else environ
    if mode == "chat":
        template = agent.chat_command
        if not template:
            raise ConfigError(f"agent {agent.name!r} has no chat_command: it cannot chat")
    elif mode == "resume":
        template = agent.resume_command
        if not template:
            raise ConfigError(f"agent {agent.name!r} has no resume_command: it cannot resume")
        if not resume:
            raise ValueError("mode='resume' needs the session id to resume")
    else:
        template = agent.command
    values = {
        "workdir": str(workdir),
        "mcp_config": str(workdir / MCP_CONFIG_FILE),
        "prompt_file": str(workdir / PROMPT_FILE),
        "prompt": prompt or "",
        "base_url": base_url or "",
        "resume": resume or "",
    }
    if any("sources" in _placeholders(arg) for arg in template):
        values["sources"] = _workdir_sources_list(workdir)
    values.update(binaries if binaries is not None else find_binaries(template))
    argv = tuple(expand(arg, values) for arg in template)

    child = {"PATH": host.get("PATH") or os.defpath}
    home = host.get("HOME")
    if home:
        child["HOME"] = home
    child["ENABLE_TOOL_SEARCH"] = "false"
    if mode != "chat":
        child["NO_COLOR"] = "1"
    for name in (*agent.pass_env, *(TERMINAL_ENV if mode == "chat" else ())):
        if name in host:
            child[name] = host[name]
    child.update(_setup_env(agent, workdir, base_url))
    child.update({name: expand(value, values) for name, value in agent.env.items()})
    child.update(env or {})
    stdin = (prompt or "").encode() if agent.stdin == "prompt" and mode != "chat" else None
    return Invocation(argv=argv, env=child, cwd=workdir, stdin=stdin)


def claude_config_dir(workdir: Path) -> Path:
    """The private Claude Code configuration a run against a local model server gets."""
    return workdir / PRIVATE_DIR / "claude-config"


def _setup_env(agent: AgentCommand, workdir: Path, base_url: str | None) -> dict[str, str]:
    home = private_home(agent, workdir)
    if agent.setup == "claude-code":
        env = {"DISABLE_AUTOUPDATER": "1", "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1"}
        if base_url:
            # A local gateway failing should fail the run in seconds, not minutes.
            env.update({"ANTHROPIC_BASE_URL": base_url, "CLAUDE_CODE_MAX_RETRIES": "1"})
            # Its own configuration (see write_runtime_config): the user's has neither
            # this folder's trust nor the gateway's key, and its first-run checks would
            # try to reach api.anthropic.com.
            env["CLAUDE_CONFIG_DIR"] = str(claude_config_dir(workdir))
        return env
    if agent.setup == "codex" and home is not None:
        return {"CODEX_HOME": str(home), "HOME": str(home), "TMPDIR": str(home)}
    if agent.setup == "gemini" and home is not None:
        env = {
            "GEMINI_CLI_HOME": str(home),
            "HOME": str(home),
            "TMPDIR": str(home),
            "GEMINI_CLI_TRUST_WORKSPACE": "true",
        }
        if base_url:
            env["GOOGLE_GEMINI_BASE_URL"] = base_url.rstrip("/")
        return env
    return {}


def write_runtime_config(
    agent: AgentCommand,
    workdir: Path,
    base_url: str | None,
    env: Mapping[str, str] | None = None,
) -> None:
    """Write the private configuration a built-in CLI reads; idempotent.

    Codex and Gemini always get one. Claude Code gets one when it talks to a local
    model server (``base_url``): first-run set-up done, ``workdir`` trusted and the
    API key in ``env`` approved, so an interactive session starts at its prompt
    instead of checking that api.anthropic.com is reachable.
    """
    if agent.setup == "claude-code" and base_url:
        key = (env or {}).get("ANTHROPIC_API_KEY", "")
        config = {
            "hasCompletedOnboarding": True,
            "customApiKeyResponses": {"approved": [key[-20:]] if key else [], "rejected": []},
            "projects": {str(workdir): {"hasTrustDialogAccepted": True}},
        }
        folder = claude_config_dir(workdir)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / ".claude.json").write_text(json.dumps(config, indent=2), "utf-8")
        return
    home = private_home(agent, workdir)
    if home is None:
        return
    if agent.setup == "codex":
        home.mkdir(parents=True, exist_ok=True)
        (home / "config.toml").write_text(tomli_w.dumps(codex_config(base_url)), "utf-8")
    elif agent.setup == "gemini":
        (home / ".gemini").mkdir(parents=True, exist_ok=True)
        settings = gemini_settings(base_url, [target for _, target in linked_sources(workdir)])
        (home / ".gemini" / "settings.json").write_text(json.dumps(settings, indent=2), "utf-8")


def codex_config(base_url: str | None) -> dict[str, Any]:
    """Codex's ``config.toml``: the runtime's base settings with no MCP server at all.

    The model provider reads ``OPENAI_API_KEY`` and talks to ``base_url`` (default
    the OpenAI API).
    """
    config = {
        **codex.base_config({}),
        **codex.provider_config(base_url or "https://api.openai.com", retries=not base_url),
        "web_search": "disabled",
    }
    if base_url:
        # As the codex runtime does: Codex's built-in model slugs offer no tools to a
        # server it does not know; an unknown slug gets them (`-m` in the command wins).
        config["model"] = CODEX_LOCAL_MODEL
    return config


_GEMINI_READ_TOOLS = (
    "run_shell_command", "read_file", "read_many_files", "list_directory", "glob", "grep_search",
)  # fmt: skip
# Everything else Gemini has built in: writing, the web, memory, plans, sub-agents, skills.
_GEMINI_EXCLUDED = tuple(t for t in gemini.BUILTIN_TOOLS if t not in _GEMINI_READ_TOOLS)


def gemini_settings(base_url: str | None, targets: Sequence[Path]) -> dict[str, Any]:
    """Gemini's settings: API-key auth, no MCP, read tools, the sources' real folders.

    The Gemini CLI refuses paths that resolve outside its workspace, so the
    folders the links point to (a file source's parent) are added to it.
    """
    folders = list(dict.fromkeys(str(t if t.is_dir() else t.parent) for t in targets))
    return {
        **gemini.base_settings(retries=not base_url),
        "tools": {"allowed": list(_GEMINI_READ_TOOLS), "exclude": list(_GEMINI_EXCLUDED)},
        "context": {"includeDirectories": folders},
        "mcpServers": {},
    }


# -- reading the output ---------------------------------------------------------------


def _now() -> datetime:
    return datetime.now(UTC)


class ClaudeStreamParser(LineParser):
    """Claude Code ``-p --output-format stream-json`` lines -> spawnkit events."""

    def __init__(self, session_id: str, server: str = "") -> None:
        super().__init__(session_id, server)
        self.calls: dict[str, ToolCall] = {}
        self.texts: list[str] = []
        self.result: dict[str, Any] | None = None
        self.usage = Usage()
        self.model: str | None = None

    def handle(self, data: dict[str, Any]) -> list[RunEvent]:
        from .runtimes.claude_code import tool_result_text, usage_from_api

        kind = data.get("type")
        sid = self.session_id
        if kind == "system" and data.get("subtype") == "init":
            self.runtime_session_id = data.get("session_id") or self.runtime_session_id
            self.model = data.get("model") or self.model
        elif kind == "stream_event" and data.get("parent_tool_use_id") is None:
            event = data.get("event") or {}
            delta = event.get("delta") or {}
            if event.get("type") == "content_block_delta" and delta.get("type") == "text_delta":
                return [TextDelta(sid, str(delta.get("text", "")))] if delta.get("text") else []
        elif kind == "assistant":
            return self._assistant(data)
        elif kind == "user":
            events: list[RunEvent] = []
            for block in _content(data):
                call_id = str(block.get("tool_use_id", ""))
                if block.get("type") == "tool_result" and call_id in self.calls:
                    done = self.calls[call_id].finish(
                        tool_result_text(block.get("content")), bool(block.get("is_error")), _now()
                    )
                    self.calls[call_id] = done
                    events.append(ToolCallFinished(sid, done))
            return events
        elif kind == "result":
            self.result = data
            self.runtime_session_id = data.get("session_id") or self.runtime_session_id
            self.usage = usage_from_api(data.get("usage"))
            return [UsageUpdate(sid, self.usage, data.get("total_cost_usd"), data.get("num_turns"))]
        return []

    def _assistant(self, data: dict[str, Any]) -> list[RunEvent]:
        events: list[RunEvent] = []
        top_level = data.get("parent_tool_use_id") is None
        for block in _content(data):
            if block.get("type") == "text" and block.get("text"):
                if top_level:
                    self.texts.append(str(block["text"]))
                events.append(AssistantText(self.session_id, str(block["text"])))
            elif block.get("type") == "tool_use":
                raw_input = block.get("input")
                call = ToolCall.start(
                    str(block.get("id", len(self.calls))), str(block.get("name", "?")),
                    raw_input if isinstance(raw_input, dict) else {"input": raw_input}, _now(),
                )  # fmt: skip
                self.calls[call.id] = call
                self.tool_calls += 1
                events.append(ToolCallStarted(self.session_id, call))
        return events

    def outcome(self, exit_code: int, stderr: Sequence[str]) -> RunOutcome:
        result = self.result
        partial = "\n\n".join(self.texts)
        outcome = RunOutcome(
            output=truncate(partial, OUTPUT_LIMIT),
            runtime_session_id=self.runtime_session_id,
            usage=self.usage,
            model=self.model,
        )
        if result is None:
            outcome.success = False
            outcome.error = "Claude Code ended without a result" + _stderr_hint(stderr)
            return outcome
        outcome.cost_usd = result.get("total_cost_usd")
        outcome.num_turns = result.get("num_turns")
        if result.get("is_error"):
            errors = result.get("errors") or []
            outcome.success = False
            outcome.error = "; ".join(str(e) for e in errors) or str(
                result.get("result") or result.get("subtype") or "the run failed"
            )
            return outcome
        text = result.get("result")
        outcome.output = truncate(str(text) if text is not None else partial, OUTPUT_LIMIT)
        return outcome


def _content(data: dict[str, Any]) -> list[dict[str, Any]]:
    content = (data.get("message") or {}).get("content")
    if not isinstance(content, list):
        return []
    return [block for block in content if isinstance(block, dict)]


def _stderr_hint(stderr: Sequence[str]) -> str:
    lines = [line.strip() for line in stderr if line.strip()]
    return f": {lines[-1]}" if lines else ""


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
        text = "\n".join(self.lines).strip()
        outcome = RunOutcome(output=truncate(text, OUTPUT_LIMIT))
        if exit_code != 0:
            last = [line.strip() for line in stderr if line.strip()]
            outcome.success = False
            outcome.error = last[-1] if last else f"exited with code {exit_code}"
        return outcome


def detect_output(first_line: str) -> OutputFormat:
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
    return "text"


def make_parser(output: OutputFormat, session_id: str) -> LineParser:
    """A fresh parser for one output format (``auto`` must be detected first)."""
    if output == "claude-stream-json":
        return ClaudeStreamParser(session_id)
    if output == "codex-json":
        from .runtimes.codex import CodexParser

        return CodexParser(session_id, "")
    if output == "gemini-stream-json":
        from .runtimes.gemini import GeminiParser

        return GeminiParser(session_id, "")
    if output == "text":
        return TextParser(session_id)
    raise ValueError(f"cannot make a parser for {output!r}: detect it from the output first")


# -- running ---------------------------------------------------------------------------

STDERR_TAIL_LINES = 50
_STDERR_IN_MESSAGE = 8


@dataclass(frozen=True)
class AskResult:
    """An agent's answer and how it was reached."""

    answer: str
    runtime: str
    duration_s: float
    workdir: Path
    session_id: str | None = None
    tool_calls: tuple[ToolCall, ...] = ()
    usage: Usage = field(default_factory=Usage)
    cost_usd: float | None = None
    exit_code: int = 0
    stderr_tail: str = ""
    sources: tuple[str, ...] = ()

    def _repr_markdown_(self) -> str:
        return self.answer

    def __str__(self) -> str:
        return self.answer


class AskError(SpawnkitError):
    """The agent ran and failed (or timed out): ``stderr`` holds the end of what it printed.

    ``exit_code`` is None when spawnkit stopped the agent (a timeout); the working
    directory in ``workdir`` is already gone when this is raised by :func:`ask`.
    """

    def __init__(
        self,
        runtime: str,
        message: str,
        *,
        exit_code: int | None,
        stderr: str,
        workdir: Path | None = None,
        partial_answer: str = "",
    ) -> None:
        self.runtime = runtime
        self.detail = message
        self.exit_code = exit_code
        self.stderr = stderr
        self.workdir = workdir
        self.partial_answer = partial_answer
        code = "" if exit_code is None else f" (exit code {exit_code})"
        tail = "\n".join(stderr.strip().splitlines()[-_STDERR_IN_MESSAGE:])
        super().__init__(
            f"{runtime} failed{code}: {message}" + (f"\nstderr:\n{tail}" if tail else "")
        )


async def ask_turn(
    workdir: Path,
    prompt: str,
    *,
    runtime: str | None = None,
    resume: str | None = None,
    base_url: str | None = None,
    env: Mapping[str, str] | None = None,
    timeout_s: float | None = None,
    on_event: EventSink | None = None,
    config: AskConfig | None = None,
    session_id: str | None = None,
) -> AskResult:
    """Run one headless turn of the agent in a prepared ``workdir``.

    The prompt is written to ``<workdir>/prompt.md`` (replacing an earlier turn's)
    and the agent's ``command`` (``resume_command`` when ``resume`` is a runtime
    session id from an earlier turn's :attr:`AskResult.session_id`) runs there.
    ``on_event`` receives the same typed events as ``%%spawn``'s views, as they
    arrive, tagged with ``session_id`` (default: the directory's name). The
    directory is left in place: its owner removes it.
    """
    cfg = config if config is not None else load_config()
    agent = cfg.agent(runtime)
    limit = timeout_s if timeout_s is not None else cfg.timeout_s
    sid = session_id or workdir.name
    mode: Mode = "resume" if resume else "headless"
    template = agent.resume_command if resume else agent.command
    invocation = build_invocation(
        agent, workdir, mode=mode, prompt=prompt, resume=resume, base_url=base_url, env=env,
        binaries=find_binaries(template),
    )  # fmt: skip
    (workdir / PROMPT_FILE).write_text(prompt, encoding="utf-8")
    write_runtime_config(agent, workdir, base_url, invocation.env)
    emit: EventSink = on_event if on_event is not None else (lambda event: None)
    parser: LineParser | None = None if agent.output == "auto" else make_parser(agent.output, sid)
    calls: dict[str, ToolCall] = {}
    stderr: deque[str] = deque(maxlen=STDERR_TAIL_LINES)

    def on_stdout(line: str, truncated: bool) -> None:
        nonlocal parser
        if parser is None:
            if not line.strip():
                return
            parser = make_parser(detect_output(line), sid)
        if truncated:
            parser.bad_lines += 1
            return
        for event in parser.feed(line):
            if isinstance(event, ToolCallStarted | ToolCallFinished):
                calls[event.call.id] = event.call
            emit(event)

    def on_stderr(line: str, truncated: bool) -> None:
        stderr.append(line)

    def failure(message: str, code: int | None, partial: str = "") -> AskError:
        return AskError(
            agent.name, message, exit_code=code, stderr="\n".join(stderr), workdir=workdir,
            partial_answer=partial,
        )  # fmt: skip

    started = time.monotonic()
    try:
        async with asyncio.timeout(limit):
            code = await _process.run_lines(
                invocation.argv, env=invocation.env, cwd=invocation.cwd,
                on_stdout=on_stdout, on_stderr=on_stderr, stdin=invocation.stdin,
            )  # fmt: skip
    except TimeoutError:
        raise failure(f"no answer within {limit:g} s; the agent was stopped", None) from None
    except FileNotFoundError as exc:
        raise failure(f"cannot start {invocation.argv[0]}: {exc.strerror}", 127) from exc
    except PermissionError as exc:
        raise failure(f"cannot start {invocation.argv[0]}: {exc.strerror}", 126) from exc
    duration = time.monotonic() - started
    final = parser if parser is not None else TextParser(sid)
    try:
        outcome = final.outcome(code, list(stderr))
    except RuntimeFailure as exc:
        raise failure(str(exc), code) from exc
    if code != 0 or not outcome.success:
        detail = outcome.error or f"the agent exited with code {code}"
        raise failure(detail, code, outcome.output)
    if final.bad_lines:
        logger.warning("%s: %d unparseable output lines", agent.name, final.bad_lines)
    return AskResult(
        answer=outcome.output,
        runtime=agent.name,
        duration_s=duration,
        workdir=workdir,
        session_id=outcome.runtime_session_id or final.runtime_session_id,
        tool_calls=tuple(calls.values()),
        usage=outcome.usage,
        cost_usd=outcome.cost_usd,
        exit_code=code,
        stderr_tail="\n".join(stderr),
        sources=tuple(name for name, _ in linked_sources(workdir)),
    )


async def ask(
    sources: str | Iterable[str | Source],
    question: str,
    *,
    runtime: str | None = None,
    base_url: str | None = None,
    env: Mapping[str, str] | None = None,
    timeout_s: float | None = None,
    on_event: EventSink | None = None,
    registry: SourceRegistry | None = None,
    config: AskConfig | None = None,
    template_file: Path | None = None,
) -> AskResult:
    """Answer ``question`` about ``sources`` with the agent ``runtime`` (default: configured).

    Unknown sources, a bad template or config and a missing CLI are reported
    before anything is created; then the working directory is prepared, the
    agent runs headless (bounded by ``timeout_s``, default ``[ask] timeout_s``),
    and the directory is removed whether it answered, failed (:class:`AskError`
    with its stderr) or was cancelled. ``base_url`` points the built-in CLIs at
    another model server (the replay server, a gateway); ``env`` adds variables
    to the child's environment, such as an API key.
    """
    if not question.strip():
        raise ConfigError("the question is empty")
    resolved = resolve_sources(sources, registry)
    cfg = config if config is not None else load_config()
    agent = cfg.agent(runtime)
    prompt = render_prompt(load_template(template_file), question, resolved)
    find_binaries(agent.command)  # a missing CLI fails here, before the directory exists
    with ask_workdir(resolved) as workdir:
        return await ask_turn(
            workdir, prompt, runtime=agent.name, base_url=base_url, env=env,
            timeout_s=timeout_s, on_event=on_event, config=cfg,
        )  # fmt: skip


def ask_sync(
    sources: str | Iterable[str | Source],
    question: str,
    **kwargs: Any,
) -> AskResult:
    """:func:`ask` for code without a running event loop (scripts, the terminal)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(ask(sources, question, **kwargs))
    raise SpawnkitError(
        "ask_sync() cannot run inside a running event loop (a notebook): use `await ask(...)`"
    )


# -- chat on a terminal ---------------------------------------------------------------


def chat(
    sources: str | Iterable[str | Source],
    *,
    runtime: str | None = None,
    base_url: str | None = None,
    env: Mapping[str, str] | None = None,
    registry: SourceRegistry | None = None,
    config: AskConfig | None = None,
    timeout_s: float = CHAT_TIMEOUT_S,
) -> int:
    """An interactive session of the agent over ``sources`` on this terminal; its exit code.

    The CLI runs in a prepared working directory (without ``prompt.md``) with
    this process's stdin, stdout and stderr, in a process group of its own that
    owns the terminal while it runs (so Ctrl-C reaches the CLI, not spawnkit).
    When it exits, whatever it left running is terminated and the directory is
    removed.
    """
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        pass  # no loop: a terminal program, as expected
    else:
        raise SpawnkitError("chat() runs on a terminal; in a notebook use the chat widget")
    if not _stdin_is_terminal():
        raise SpawnkitError(
            "chat needs a terminal, and stdin is not one: for one question from a script "
            "or a pipe, use `spawnkit ask` (or ask())"
        )
    resolved = resolve_sources(sources, registry)
    cfg = config if config is not None else load_config()
    agent = cfg.agent(runtime)
    if not agent.chat_command:
        raise ConfigError(f"agent {agent.name!r} has no chat_command: it cannot chat")
    binaries = find_binaries(agent.chat_command)
    with ask_workdir(resolved) as workdir:
        invocation = build_invocation(
            agent, workdir, mode="chat", base_url=base_url, env=env, binaries=binaries
        )
        write_runtime_config(agent, workdir, base_url, invocation.env)
        return asyncio.run(run_interactive(invocation, runtime=agent.name, timeout_s=timeout_s))


def _stdin_is_terminal() -> bool:
    try:
        return os.isatty(0)
    except OSError:
        return False


async def run_interactive(
    invocation: Invocation, *, runtime: str, timeout_s: float = CHAT_TIMEOUT_S
) -> int:
    """Run a CLI on this terminal (see :func:`spawnkit._process.run_interactive`)."""
    try:
        return await _process.run_interactive(
            invocation.argv, env=invocation.env, cwd=invocation.cwd, timeout_s=timeout_s
        )
    except TimeoutError:
        raise AskError(
            runtime, f"the session passed its {timeout_s:g} s limit",
            exit_code=None, stderr="", workdir=invocation.cwd,
        ) from None  # fmt: skip


__all__ = [
    "BUILTIN_AGENTS",
    "AgentCommand",
    "AskConfig",
    "AskConfigError",
    "AskError",
    "AskResult",
    "ClaudeStreamParser",
    "Invocation",
    "TemplateError",
    "TextParser",
    "ask",
    "ask_sync",
    "ask_turn",
    "ask_workdir",
    "build_invocation",
    "chat",
    "config_path",
    "detect_output",
    "ensure_template",
    "find_binaries",
    "linked_sources",
    "load_config",
    "load_template",
    "make_parser",
    "prepare_workdir",
    "remove_workdir",
    "render_prompt",
    "resolve_sources",
    "run_interactive",
    "save_config",
    "sources_list",
    "template_path",
    "validate_template",
    "write_runtime_config",
]
