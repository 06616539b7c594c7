"""Ask mode: answer a question about registered sources with an isolated agent run.

:func:`ask` resolves the source names (every unknown one is reported before anything
starts), renders the user's prompt template and hands the prompt to the
:class:`~spawnkit.run.Spawner` as a run of ``kind="ask"``: the same admission,
workspace, sandbox, session record, spans, events and cleanup as every run, with the
sources linked into ``<workspace>/ask/``, an empty MCP configuration for every CLI and
the sources' real paths handed to the CLI (and bound read-only in the sandbox).
:func:`ask_turn` continues a conversation through :meth:`Spawner.resume`, and
:func:`chat` is the same run (``kind="chat"``) with the agent's interactive TUI on the
user's terminal. Frontends (the command line, ``%%ask``, the chat widget) are thin layers
over them.

Which runtime answers is a runtime name (``claude-code``, ``codex``, ``gemini``) or a
:class:`~spawnkit.config.roster.RuntimeConfig`, e.g. ``type = "command"`` for any CLI. The
older *agent command templates* of ``$SPAWNKIT_HOME/ask.toml`` are still read, with a
deprecation warning, and converted to runtimes (:func:`runtime_config`). Errors::

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
import logging
import os
import re
import tomllib
import uuid
import warnings
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal, get_args

import tomli_w
from opentelemetry.trace import TracerProvider

from . import signals
from .config.roster import ButlerConfig, CommandConfig, EnvConfig, RuntimeConfig
from .containment.credentials import CredentialStore
from .containment.sources import (
    Source,
    SourceError,
    SourcePathError,
    SourceRegistry,
    check_outside_state,
    sources_list,
    validate_name,
)
from .containment.workspace import ASK_DIR
from .errors import ConfigError, SpawnkitError, UnknownRuntimeError
from .events import EventSink
from .home import home_path, spawnkit_home
from .result import SpawnerResult, ToolCall, Usage
from .run import RunKind, Spawner
from .run.request import refuse_nul
from .runtimes import ALIASES
from .store import SessionRecord, SessionStore

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
# ask.toml is read and converted; a butler runtime of type "command" replaces it.
DEPRECATION = (
    "{path}: ask.toml is deprecated and will be removed: its agents are converted to "
    "runtimes; give ask() a runtime instead (a name, or RuntimeConfig(type='command', "
    'command=CommandConfig(...)), the [butler.runtime] type = "command" of a butler.toml)'
)
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
GEMINI_MODEL = "gemini-2.5-flash"
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
        output="claude-stream-json",
        stdin="prompt",
        setup="claude-code",
        pass_env=_CLAUDE_ENV,
    ),
    "codex": AgentCommand(
        name="codex",
        command=(*_CODEX_EXEC, "-"),
        resume_command=(*_CODEX_EXEC[:2], "resume", *_CODEX_EXEC[2:], "{resume}", "-"),
        output="codex-json",
        stdin="prompt",
        setup="codex",
        pass_env=("OPENAI_API_KEY",),
    ),
    "gemini": AgentCommand(
        name="gemini",
        command=_GEMINI_HEADLESS,
        resume_command=(*_GEMINI_HEADLESS, "--resume", "{resume}"),
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
    config = parse_config(document, source)
    warnings.warn(DEPRECATION.format(path=source), FutureWarning, stacklevel=2)
    return config


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


# -- sources ---------------------------------------------------------------------------


def resolve_sources(
    sources: str | Iterable[str | Source], registry: SourceRegistry | None = None
) -> list[Source]:
    """Sources from names (a list, or ``"a,b"``) or :class:`Source` records.

    Every unknown name is reported at once by
    :class:`~spawnkit.containment.sources.UnknownSourceError`; duplicates are dropped.
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


# -- running: one question is one run of the Spawner ----------------------------------

STDERR_TAIL_LINES = 50
_STDERR_IN_MESSAGE = 8
# The butler every ask runs as: its record, its spans, its live view say "ask".
ASK_BUTLER = "ask"
ASK_SYSTEM_PROMPT = Path(__file__).parent / "prompts" / "ask_system.md"
ASK_TOOLS = ("Read", "Glob", "Grep", "Bash")
ASK_MAX_TURNS = 50
# Questions asked at once by one process (each ask() admits through its own spawner).
ASK_CONCURRENCY = 4


@dataclass(frozen=True)
class AskResult:
    """An agent's answer and how it was reached.

    ``session_id`` is the runtime's own session id (what a resume continues);
    ``record_id`` the spawnkit session that recorded the run (``spawnkit sessions``).
    """

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
    record_id: str | None = None

    def _repr_markdown_(self) -> str:
        return self.answer

    def __str__(self) -> str:
        return self.answer


class AskError(SpawnkitError):
    """The agent ran and failed (or timed out): ``stderr`` holds the end of what it printed.

    ``exit_code`` is the CLI's (:attr:`SpawnerResult.exit_code`), None when spawnkit stopped
    the agent (a timeout) or it never started; the working directory in ``workdir`` is
    already gone when this is raised.
    ``record_id`` names the failed run's session record.
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
        record_id: str | None = None,
    ) -> None:
        self.runtime = runtime
        self.detail = message
        self.exit_code = exit_code
        self.stderr = stderr
        self.workdir = workdir
        self.partial_answer = partial_answer
        self.record_id = record_id
        code = "" if exit_code is None else f" (exit code {exit_code})"
        tail = "\n".join(stderr.strip().splitlines()[-_STDERR_IN_MESSAGE:])
        super().__init__(
            f"{runtime} failed{code}: {message}" + (f"\nstderr:\n{tail}" if tail else "")
        )


class _GivenCredentials(CredentialStore):
    """The caller's ``env`` first, then spawnkit's credentials file and the environment."""

    def __init__(self, store: SessionStore, given: Mapping[str, str]) -> None:
        super().__init__(store)
        self.given = dict(given)

    def resolve(self, name: str) -> str | None:
        return self.given.get(name) or super().resolve(name)


def runtime_config(agent: AgentCommand) -> RuntimeConfig:
    """The runtime an ``ask.toml`` agent stands for.

    An unchanged built-in (or one whose only changes are ``env``/``pass_env``) is that
    runtime; any other agent becomes a ``command`` runtime with its argv, stdin, output
    and env (``{workdir}`` is now ``{cwd}``), whose ``chat_command`` is its chat.
    """
    builtin = BUILTIN_AGENTS.get(agent.name)
    unchanged = replace(agent, env=builtin.env, pass_env=builtin.pass_env) if builtin else None
    if builtin is not None and unchanged == builtin:
        return RuntimeConfig(type=agent.name)
    if agent.setup != "none" and (builtin is None or agent.setup != builtin.setup):
        logger.warning("ask.toml: agent %s: setup = %r is not converted", agent.name, agent.setup)

    def convert(template: str) -> str:
        return template.replace("{workdir}", "{cwd}")

    return RuntimeConfig(
        type="command",
        command=CommandConfig(
            argv=tuple(convert(arg) for arg in agent.command),
            resume_argv=tuple(convert(arg) for arg in agent.resume_command),
            chat_argv=tuple(convert(arg) for arg in agent.chat_command),
            output=agent.output,
            stdin=agent.stdin,
            env={name: convert(value) for name, value in agent.env.items()},
        ),
    )


def ask_butler(
    runtime: RuntimeConfig,
    *,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    env_names: Iterable[str] = (),
) -> ButlerConfig:
    """The butler an ask runs as: read and search tools, no MCP server, no roster.

    ``env_names`` are the variables its agent may get besides the runtime's own (the
    caller's ``env``, an ``ask.toml`` agent's ``pass_env``).
    """
    folder = ASK_SYSTEM_PROMPT.parent
    return ButlerConfig(
        name=ASK_BUTLER,
        port=0,
        description="questions about registered sources",
        directory=folder,
        roster_dir=folder,
        runtime=replace(
            runtime,
            tools=ASK_TOOLS,
            max_turns=ASK_MAX_TURNS,
            timeout_s=timeout_s,
            max_concurrent_sessions=ASK_CONCURRENCY,
        ),
        env=EnvConfig(optional=tuple(dict.fromkeys(env_names))),
        prompt_file=ASK_SYSTEM_PROMPT,
    )


def _runtime(
    runtime: str | RuntimeConfig | None, cfg: AskConfig
) -> tuple[str, RuntimeConfig, AgentCommand | None]:
    """(the name a result carries, the runtime, the ask.toml agent it came from)."""
    if isinstance(runtime, RuntimeConfig):
        return runtime.type, runtime, None
    agent = cfg.agent(runtime)
    return agent.name, runtime_config(agent), agent


def _check_paths(sources: Iterable[Source]) -> None:
    for source in sources:
        if not source.path.exists():
            hint = " (run `spawnkit sources update`)" if source.kind == "git" else ""
            raise SourcePathError(source.path, f"source {source.name!r} does not exist{hint}")
        check_outside_state(source, home_path())


def _stderr_tail(record: SessionRecord | None) -> str:
    if record is None or record.log_dir is None:
        return ""
    try:
        with open(record.log_dir / "stderr.log", encoding="utf-8", errors="replace") as fh:
            return "".join(deque(fh, maxlen=STDERR_TAIL_LINES)).rstrip("\n")
    except OSError:
        return ""


async def _spawn(
    sources: Sequence[Source],
    prompt: str,
    *,
    kind: RunKind,
    runtime: str | RuntimeConfig | None,
    resume: str | None,
    base_url: str | None,
    env: Mapping[str, str] | None,
    timeout_s: float | None,
    on_event: EventSink | None,
    config: AskConfig | None,
    store: SessionStore | None,
    session_id: str | None = None,
    tracer_provider: TracerProvider | None = None,
    trigger_source: str | None = None,
) -> tuple[SpawnerResult, SessionStore, str, float]:
    """One ask or chat run of the ask butler: (its result, the store, the runtime's name,
    its time limit). ``resume`` is the record id of the run it continues (whose source a
    continuation keeps unless ``trigger_source`` is given)."""
    cfg = config if config is not None else load_config()
    name, runtime_cfg, agent = _runtime(runtime, cfg)
    given = {**(agent.env if agent is not None and runtime_cfg.type != "command" else {}),
             **(env or {})}  # fmt: skip
    limit = timeout_s if timeout_s is not None else cfg.timeout_s
    sessions = store if store is not None else SessionStore()
    credentials = _GivenCredentials(sessions, given)
    # An agent's pass_env is "pass it when set": the unset ones are not the butler's to
    # miss (declared optional, each would be warned about on every ask).
    passed = [n for n in (agent.pass_env if agent is not None else ()) if credentials.resolve(n)]
    butler = ask_butler(runtime_cfg, timeout_s=limit, env_names=[*given, *passed])
    spawner = Spawner(
        butler,
        store=sessions,
        credentials=credentials,
        base_url=base_url,
        tracer_provider=tracer_provider,
    )
    if resume is not None:
        result = await spawner.resume(
            resume, prompt, on_event=on_event, new_session_id=session_id, sources=sources,
            kind=kind, trigger_source=trigger_source,
        )  # fmt: skip
    else:
        result = await spawner.trigger(
            prompt, trigger_source=trigger_source or ("chat" if kind == "chat" else "external"),
            on_event=on_event, session_id=session_id, kind=kind, sources=sources,
        )  # fmt: skip
    return result, sessions, name, limit


async def _run_ask(
    sources: Sequence[Source],
    prompt: str,
    *,
    runtime: str | RuntimeConfig | None,
    resume: str | None,
    base_url: str | None,
    env: Mapping[str, str] | None,
    timeout_s: float | None,
    on_event: EventSink | None,
    config: AskConfig | None,
    store: SessionStore | None,
    session_id: str | None = None,
    tracer_provider: TracerProvider | None = None,
    trigger_source: str | None = None,
) -> AskResult:
    result, sessions, name, limit = await _spawn(
        sources, prompt, kind="ask", runtime=runtime, resume=resume, base_url=base_url,
        env=env, timeout_s=timeout_s, on_event=on_event, config=config, store=store,
        session_id=session_id, tracer_provider=tracer_provider, trigger_source=trigger_source,
    )  # fmt: skip
    record = await asyncio.to_thread(sessions.get_session, result.session_id or "")
    workdir = (
        record.workspace / ASK_DIR if record is not None and record.workspace else Path(ASK_DIR)
    )
    stderr = await asyncio.to_thread(_stderr_tail, record)
    if not result.success:
        raise _failure(name, limit, result, stderr, workdir)
    return AskResult(
        answer=result.output,
        runtime=name,
        duration_s=result.duration_ms / 1000,
        workdir=workdir,
        session_id=result.runtime_session_id,
        tool_calls=tuple(result.tool_calls),
        usage=result.usage,
        cost_usd=result.cost_usd,
        exit_code=result.exit_code or 0,
        stderr_tail=stderr,
        sources=tuple(source.name for source in sources),
        record_id=result.session_id,
    )


def _failure(
    name: str, limit: float, result: SpawnerResult, stderr: str, workdir: Path | None
) -> AskError:
    if result.error_kind == "timeout":
        message = f"no answer within {limit:g} s; the agent was stopped"
    else:
        message = result.error or "the run failed"
        said = f"exited with code {result.exit_code}"
        if result.exit_code is not None and message.startswith(said):
            message = message[len(said) :].lstrip(": ") or message  # the code is shown apart
    return AskError(
        name, message, exit_code=result.exit_code, stderr=stderr, workdir=workdir,
        partial_answer=result.output, record_id=result.session_id,
    )  # fmt: skip


async def ask_turn(
    sources: str | Iterable[str | Source],
    prompt: str,
    *,
    runtime: str | RuntimeConfig | None = None,
    resume: str | None = None,
    base_url: str | None = None,
    env: Mapping[str, str] | None = None,
    timeout_s: float | None = None,
    on_event: EventSink | None = None,
    config: AskConfig | None = None,
    session_id: str | None = None,
    registry: SourceRegistry | None = None,
    store: SessionStore | None = None,
    tracer_provider: TracerProvider | None = None,
    trigger_source: str | None = None,
) -> AskResult:
    """Run one turn of a conversation about ``sources``: ``prompt`` as it is, no template.

    ``resume`` is the :attr:`AskResult.record_id` of the turn before: the runtime picks
    the conversation up from its own transcript (:meth:`Spawner.resume`), in a fresh
    workspace with the same sources. ``session_id`` chooses the new record's id.
    ``trigger_source`` says where the turn came from (the chat widget's say ``chat``);
    a later turn keeps its first turn's.
    """
    resolved = resolve_sources(sources, registry)
    _check_paths(resolved)
    return await _run_ask(
        resolved, prompt, runtime=runtime, resume=resume, base_url=base_url, env=env,
        timeout_s=timeout_s, on_event=on_event, config=config, store=store,
        session_id=session_id, tracer_provider=tracer_provider, trigger_source=trigger_source,
    )  # fmt: skip


async def ask(
    sources: str | Iterable[str | Source],
    question: str,
    *,
    runtime: str | RuntimeConfig | None = None,
    base_url: str | None = None,
    env: Mapping[str, str] | None = None,
    timeout_s: float | None = None,
    on_event: EventSink | None = None,
    registry: SourceRegistry | None = None,
    config: AskConfig | None = None,
    template_file: Path | None = None,
    store: SessionStore | None = None,
    tracer_provider: TracerProvider | None = None,
) -> AskResult:
    """Answer ``question`` about ``sources`` with the agent ``runtime`` (default: configured).

    One question is one run of the :class:`~spawnkit.run.Spawner` (``kind="ask"``):
    admission, a workspace with the sources linked in, no MCP server, the sandbox, one
    session record naming the sources, spans, events and history rows. Unknown sources,
    a bad template or config and a missing CLI are reported before anything is created;
    the workspace is removed whether the agent answered, failed (:class:`AskError` with
    its stderr) or was cancelled. ``runtime`` is a runtime's (or ``ask.toml`` agent's)
    name or a :class:`~spawnkit.config.roster.RuntimeConfig` (``type = "command"`` for any
    CLI). ``base_url`` points the CLI at another model server (the replay server, a
    gateway); ``env`` gives the agent variables, such as an API key.
    """
    if not question.strip():
        raise ConfigError("the question is empty")
    refuse_nul(question, "the question")
    resolved = resolve_sources(sources, registry)
    prompt = render_prompt(load_template(template_file), question, resolved)
    _check_paths(resolved)
    return await _run_ask(
        resolved, prompt, runtime=runtime, resume=None, base_url=base_url, env=env,
        timeout_s=timeout_s, on_event=on_event, config=config, store=store,
        tracer_provider=tracer_provider,
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
    runtime: str | RuntimeConfig | None = None,
    resume: str | None = None,
    base_url: str | None = None,
    env: Mapping[str, str] | None = None,
    registry: SourceRegistry | None = None,
    config: AskConfig | None = None,
    timeout_s: float = CHAT_TIMEOUT_S,
    store: SessionStore | None = None,
    session_id: str | None = None,
    tracer_provider: TracerProvider | None = None,
) -> int:
    """An interactive session of the agent over ``sources`` on this terminal; its exit code.

    A run of the :class:`~spawnkit.run.Spawner` (``kind="chat"``) like an ask: admission,
    the workspace with the sources linked read-only, the sandbox, one session record naming
    the sources, a span and the same cleanup; only the CLI's stdio is this terminal, and
    nothing it prints is parsed. ``resume`` (an ask's or a chat's ``record_id``) continues
    that conversation. A CLI that ends with a non-zero code returns it; one that cannot
    start, or runs past ``timeout_s``, raises :class:`AskError`.
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
    _check_paths(resolved)
    run = _spawn(
        resolved, "", kind="chat", runtime=runtime, resume=resume, base_url=base_url, env=env,
        timeout_s=timeout_s, on_event=None, config=config, store=store, session_id=session_id,
        tracer_provider=tracer_provider,
    )  # fmt: skip
    result, sessions, name, limit = signals.run(run)
    if result.exit_code is not None and result.error_kind != "timeout":
        return result.exit_code
    record = sessions.get_session(result.session_id or "")
    raise _failure(name, limit, result, _stderr_tail(record), None)


def _stdin_is_terminal() -> bool:
    try:
        return os.isatty(0)
    except OSError:
        return False


__all__ = [
    "BUILTIN_AGENTS",
    "AgentCommand",
    "AskConfig",
    "AskConfigError",
    "AskError",
    "AskResult",
    "TemplateError",
    "ask",
    "ask_butler",
    "ask_sync",
    "ask_turn",
    "chat",
    "config_path",
    "ensure_template",
    "load_config",
    "load_template",
    "render_prompt",
    "resolve_sources",
    "runtime_config",
    "save_config",
    "sources_list",
    "template_path",
    "validate_template",
]
