"""The contract every runtime adapter fulfils.

An adapter knows one agent CLI: where its binary is, how to write its MCP
config, how to read a system prompt file, and how to run one prompt while
streaming typed events. Everything runtimes share (the workspace, the isolated
environment, session records, telemetry, concurrency) lives in the spawner and
reaches the adapter as a finished :class:`RunSpec`.

Lifecycle: the spawner holds one adapter per butler, calls
:meth:`RuntimeAdapter.create_worker` for every trigger (so concurrent runs share
no per-run state), awaits :meth:`RuntimeAdapter.invoke` on that worker, and
calls :meth:`RuntimeAdapter.reset` after a failed invocation so cached
knowledge (a resolved binary, a checked version) is looked up afresh.
"""

from __future__ import annotations

import os
import re
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, ClassVar

from .. import _process
from ..config.butler_config import AgentRole, McpTransport, RuntimeConfig
from ..config.system_prompt import read_prompt_file
from ..containment.sandbox import NO_SANDBOX, SandboxPlan
from ..errors import (
    AuthenticationFailure,
    ConfigError,
    MissingApiKeyError,
    ModelUnavailable,
    RateLimited,
    RuntimeFailure,
    RuntimeNotFoundError,
)
from ..events import EventSink
from ..home import spawnkit_home
from ..permissions import Approver
from ..result import Usage
from ..telemetry.otlp import CliTelemetry
from ..telemetry.runlog import RunLog
from ..transcripts import copy_tree
from .version import cli_version


@dataclass(frozen=True)
class McpServerSpec:
    """The one MCP server a run may reach: its butler's, and the run's secret for it.

    The secret goes only into the CLI's own MCP configuration (a file in the
    run's private workspace, see :func:`write_private`), as the header the CLI
    sends; it is kept out of ``repr`` so it cannot reach a log by accident.
    """

    name: str
    transport: McpTransport
    url: str
    secret: str | None = field(default=None, repr=False)

    @property
    def headers(self) -> dict[str, str]:
        """The HTTP headers every request to the server must carry."""
        return {"Authorization": f"Bearer {self.secret}"} if self.secret else {}


@dataclass(frozen=True)
class RunSpec:
    """Everything an adapter needs for one run, decided by the spawner."""

    session_id: str
    butler: str
    prompt: str
    system_prompt: str
    workspace: Path
    cwd: Path
    # None: the run reaches no MCP server at all (an ask about sources).
    mcp_server: McpServerSpec | None
    config_file: Path
    # The complete environment the child may see, already isolated; adapters
    # add only what they must set themselves (see RuntimeAdapter.child_env).
    env: Mapping[str, str]
    max_turns: int
    tools: tuple[str, ...] = ()
    model: str | None = None
    # Where the CLI sends its model calls: the run's relay (see spawnkit.containment.relay), or the
    # butler's base_url itself; None: the CLI's own default API, directly.
    base_url: str | None = None
    # Whether ``base_url`` is a relay to the CLI's own default API (the butler set none):
    # the CLI then keeps its defaults for that API (model, retries).
    default_api: bool = False
    runtime_session_id: str | None = None
    resume: str | None = None
    # Where the runtime's raw output goes, line by line, as it arrives.
    log: RunLog | None = None
    # Roles the run may delegate to (runtimes with sub-agents only).
    agents: Mapping[str, AgentRole] = field(default_factory=dict)
    # How the CLI is started: inside bubblewrap, or (opted out) as it is.
    sandbox: SandboxPlan = NO_SANDBOX
    # Folders outside ``cwd`` the CLI's file tools must reach (the real paths of an
    # ask's linked sources): Claude Code's --add-dir, Gemini's includeDirectories.
    add_dirs: tuple[Path, ...] = ()
    # How often the CLI itself may retry a failed model call; None: the adapter's own choice.
    # 0 when spawnkit retries rate-limited runs ([butler.retry]), so its retry is the one
    # that acts. Only Claude Code needs telling: spawnkit starts Codex (with a base_url)
    # and Gemini with no retries of their own already.
    model_retries: int | None = None
    # Where the CLI exports its own spans (CLI telemetry on), or None: it exports nothing.
    telemetry: CliTelemetry | None = None
    # Tools allowed only after a person says yes ([butler.permissions] ask), and who is
    # asked (None: nobody can be, so such calls are denied; see spawnkit.permissions).
    ask: tuple[str, ...] = ()
    approver: Approver | None = None


@dataclass
class RunOutcome:
    """What the runtime reported at the end of a run."""

    output: str = ""
    success: bool = True
    error: str | None = None
    error_kind: str | None = None
    runtime_session_id: str | None = None
    usage: Usage = field(default_factory=Usage)
    cost_usd: float | None = None
    num_turns: int | None = None
    model: str | None = None
    # The CLI's exit code, when it exited by itself (None: stopped, or not known).
    exit_code: int | None = None


# What an interactive session takes from the user's terminal besides the run's environment.
TERMINAL_ENV = ("TERM", "COLORTERM", "LANG", "LC_ALL", "LC_CTYPE", "COLUMNS", "LINES")

# The error kind of a run whose butler MCP server never connected (on every runtime).
MCP_UNAVAILABLE = "mcp_unavailable"


def mcp_unavailable_message(server: McpServerSpec, how: str) -> str:
    """Why such a run failed, and what to check."""
    return (
        f"the butler's MCP server {server.name!r} at {server.url.split('?')[0]} never "
        f"connected ({how}), so the run had none of its tools: check that it is serving "
        f"(`spawnkit doctor`, or `spawnkit serve {server.name}` for --external-mcp)"
    )


def write_private(path: Path, text: str) -> None:
    """Write a config file only its owner may read: it may hold the run's MCP secret.

    Plain descriptor writes, no file object: a run writes one or more of these."""
    data = text.encode("utf-8")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        os.fchmod(fd, 0o600)  # an existing file keeps its mode through O_CREAT
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
    finally:
        os.close(fd)


_AUTH_WORDS = ("invalid api key", "authentication", "unauthorized", "not logged in", "api key")
_RATE_WORDS = ("rate limit", "rate_limit", "too many requests", "quota")
_DOWN_WORDS = (
    "connection refused", "connection error", "connection failed", "error sending request",
    "failed to connect", "econnrefused", "fetch failed", "overloaded",
    "unable to connect", "network error", "timed out", "stream disconnected",
)  # fmt: skip


_OVERLOADED_REMEDY = "the model is overloaded: this is temporary, retry in a minute"
_SERVER_ERROR_REMEDY = "the model API failed on its side: retry later"
_UNAVAILABLE_REMEDY = "the model API is unavailable for now: this is temporary, retry in a minute"
# The kind of a failure on an overloaded or briefly unavailable model API (529, 503): like a
# rate limit, it is waited out and retried (spawnkit.config.retry); other 5xx are not.
OVERLOADED = "overloaded"
# "status 529", "API Error: 529", '"code":529': the HTTP status inside a CLI's message.
_STATUS_IN_TEXT = re.compile(r"(?:status|api error:?|\"code\":)\s*([1-5]\d\d)\b", re.IGNORECASE)
_ADDRESS = re.compile(
    r",?\s*url:\s*\S+|\(?https?://[^\s)\]\"']+\)?|\(?\b(?:localhost|\d{1,3}(?:\.\d{1,3}){3}):\d+\b\)?"
)
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z])")


def failure_detail(text: str) -> str:
    """A CLI's error message as one plain statement: its first sentence, no addresses.

    CLIs follow the statement with advice of their own ("check your inference
    gateway (127.0.0.1:40455)") that is often wrong for spawnkit's setup and
    exposes internal ports; the failure's remedy replaces it.
    """
    first = _SENTENCE_END.split(text.strip(), maxsplit=1)[0]
    cleaned = " ".join(_ADDRESS.sub("", first).split())
    return cleaned or " ".join(text.split())


def classify_failure(status: int | None, text: str, *, auth_remedy: str) -> RuntimeFailure:
    """Turn a failed model call (HTTP status and/or message) into a typed failure.

    The remedy fits the cause: an overload (529, "overloaded") or a 503 is waited out
    (kind ``overloaded``, which spawnkit may retry like a ``rate_limit``), a server error
    retried, only an unreachable server is a matter of base_url.
    """
    lowered = text.lower()
    if status is None and (found := _STATUS_IN_TEXT.search(text)):
        status = int(found.group(1))
    detail = failure_detail(text)
    if status in (401, 403) or any(word in lowered for word in _AUTH_WORDS):
        return AuthenticationFailure(detail, remedy=auth_remedy)
    if status == 429 or any(word in lowered for word in _RATE_WORDS):
        return RateLimited(detail)
    if status == 529 or "overloaded" in lowered:
        return ModelUnavailable(detail, kind=OVERLOADED, remedy=_OVERLOADED_REMEDY)
    if status == 503:
        return ModelUnavailable(detail, kind=OVERLOADED, remedy=_UNAVAILABLE_REMEDY)
    if status is not None and status >= 500:
        return ModelUnavailable(detail, remedy=_SERVER_ERROR_REMEDY)
    if any(word in lowered for word in _DOWN_WORDS):
        return ModelUnavailable(detail)
    return RuntimeFailure(detail)


class RuntimeAdapter(ABC):
    """Base class of the ``claude-code``, ``codex`` and ``gemini`` adapters."""

    type: ClassVar[str]
    binary_name: ClassVar[str]
    install_hint: ClassVar[str]
    # What to do when the model API refuses the credentials.
    auth_remedy: ClassVar[str] = "check the runtime's API key"
    system_prompt_filename: ClassVar[str] = "CLAUDE.md"
    # Host variables the CLI needs to work at all; they pass credential isolation.
    passthrough_env: ClassVar[tuple[str, ...]] = ()
    # Where, relative to the run's HOME, the CLI writes its transcripts; spawnkit keeps
    # them under $SPAWNKIT_HOME/runtimes/<type>/<the same path> once the run is over.
    transcripts_dir: ClassVar[str | None] = None
    # Core API keys of other vendors, withheld unless the butler declares them.
    other_vendor_keys: ClassVar[tuple[str, ...]] = ()
    # Variables any one of which authenticates the CLI with its model API (the first is
    # the one to suggest); empty: the runtime needs none. Without one, a login may do:
    # `login_command` makes it, leaving one of `login_files` (relative to the user's home).
    # A login is a subscription, where usage has no dollar price (see spawnkit.budgets.budget).
    api_key_env: ClassVar[tuple[str, ...]] = ()
    # Those of `api_key_env` that are a subscription's token, not a priced API key.
    subscription_env: ClassVar[tuple[str, ...]] = ()
    login_command: ClassVar[str | None] = None
    login_files: ClassVar[tuple[str, ...]] = ()
    # Whether the CLI reports token usage after every model call (else only at the end,
    # and a run with a token or dollar limit is metered through a relay).
    live_usage: ClassVar[bool] = False
    # Whether the CLI reports usage once, at its end: its runs are then always metered
    # through a relay when one can carry its model calls, for live figures.
    usage_at_end: ClassVar[bool] = False
    # The model API the CLI calls when no base_url is set (what a relay forwards to).
    default_api_url: ClassVar[str | None] = None
    # How the CLI prints its version, and what else it needs in its environment to do
    # so quickly (see spawnkit.runtimes.version).
    version_args: ClassVar[tuple[str, ...]] = ("--version",)
    version_env: ClassVar[Mapping[str, str]] = MappingProxyType({})
    # Variables of :meth:`child_env` for headless runs only: the TUI (interact) goes without.
    headless_env: ClassVar[tuple[str, ...]] = ("NO_COLOR",)
    # Whether the runtime is only a runtime with a butler's configuration (``command``).
    needs_configuration: ClassVar[bool] = False

    def __init__(self, config: RuntimeConfig | None = None) -> None:
        self.config = config or RuntimeConfig(type=self.type)

    def default_model(self, base_url: str | None) -> str | None:
        """The model a run names when its butler names none (None: the CLI's own choice,
        known only once it says). A budget is priced at it before the run starts."""
        return None

    def create_worker(self) -> RuntimeAdapter:
        """A fresh adapter for one trigger, sharing configuration but no run state."""
        return type(self)(self.config)

    def reset(self) -> None:  # noqa: B027 - a no-op is the right default
        """Forget cached lookups after a failure; the next run re-checks them."""

    def logged_in(self) -> bool:
        """Whether the user's home holds a login of this CLI (one of :attr:`login_files`)."""
        home = Path.home()
        return any((home / name).is_file() for name in self.login_files)

    def check_authenticated(self, resolve: Callable[[str], str | None]) -> None:
        """Refuse a run that nothing could authenticate, before anything is spawned.

        ``resolve`` gives the value a run would get for a variable (None: not set, or not
        passed to this run). A run is refused with :class:`MissingApiKeyError` only when
        none of :attr:`api_key_env` has a value and the user has no login either; a replay
        or gateway run has the key it was given, so it passes.
        """
        if not self.api_key_env or any(resolve(name) for name in self.api_key_env):
            return
        if self.logged_in():
            return
        raise MissingApiKeyError(self.type, self.api_key_env, self.login_command)

    @abstractmethod
    def find_binary(self) -> Path:
        """The CLI to run; raises RuntimeNotFoundError with an install command."""

    async def binary_version(self) -> str | None:
        """The CLI's version string, or None when it cannot be determined.

        Asked once per binary and process, with a minimal environment and a timeout
        (see :func:`spawnkit.runtimes.version.cli_version`).
        """
        return await cli_version(self.find_binary(), self.version_args, self.version_env)

    def install_paths(self) -> list[Path]:
        """What the CLI needs to see read-only inside the sandbox (its own install)."""
        return [self.find_binary().resolve().parent]

    # -- transcripts ---------------------------------------------------------------

    @classmethod
    def kept_transcripts(cls) -> Path | None:
        """Where spawnkit keeps this runtime's transcripts of finished runs."""
        if cls.transcripts_dir is None:
            return None
        return spawnkit_home() / "runtimes" / cls.type / Path(cls.transcripts_dir).name

    def keep_transcripts(self, home: Path, redact: Callable[[str], str] | None = None) -> int:
        """Copy the transcripts the CLI wrote under ``home`` to :meth:`kept_transcripts`."""
        kept = self.kept_transcripts()
        if kept is None or self.transcripts_dir is None:
            return 0
        return copy_tree(home / self.transcripts_dir, kept, redact)

    def stage_resume(self, home: Path, cwd: Path, runtime_session_id: str) -> bool:
        """Put the kept transcript of ``runtime_session_id`` where the CLI will look for it."""
        return False

    def new_runtime_session_id(self) -> str | None:
        """A runtime session id chosen before the run, when the CLI accepts one."""
        return None

    def parse_system_prompt_file(self, path: Path, roster_dir: Path) -> str:
        """Read a system prompt file in this runtime's format, resolving includes."""
        return read_prompt_file(path, roster_dir)

    def model_via_base_url(self) -> bool:
        """Whether the CLI sends its model calls to the base URL spawnkit gives it (so a
        relay can carry them); true of every runtime with a default model API."""
        return self.default_api_url is not None

    @abstractmethod
    def build_config_file(self, workspace: Path, server: McpServerSpec | None) -> Path:
        """Write the runtime's MCP configuration (``server``, or none) into ``workspace``."""

    def child_env(self, spec: RunSpec) -> dict[str, str]:
        """``spec.env`` plus what this runtime must set for itself."""
        return dict(spec.env)

    def capabilities(self) -> dict[str, Any]:
        """What this runtime can do, under the runtime-adapter interface's keys.

        Every runtime reports every ``supports_*`` key. ``supports_agent_profiles``: a run
        can act as one of a butler's ``[butler.agents.<role>]`` (its prompt, tools and
        model), which the spawner applies for any runtime. ``supports_handoffs``: an agent
        can hand its conversation over to another agent mid-run, which none of the CLIs
        does (Claude Code's sub-agents are delegations: ``supports_subagents``).
        """
        return {
            "supports_mcp": True,
            "supports_system_prompt": True,
            "supports_resume": False,
            "supports_subagents": False,
            "subagent_style": None,
            "supports_agent_profiles": True,
            "supports_handoffs": False,
            "supports_max_turns": True,
            "supports_parallel_sessions": True,
        }

    def check_interactive(self) -> None:
        """Raise unless this runtime can chat here: :class:`~spawnkit.errors.ConfigError`
        when it has no interactive mode, ``RuntimeNotFoundError`` when its CLI is missing."""
        raise ConfigError(f"the {self.type} runtime has no interactive mode: it cannot chat")

    def interactive_command(self, spec: RunSpec) -> list[str]:
        """The CLI's argv for an interactive session on the user's terminal (a ``chat``).

        The same lockdown as :meth:`invoke`'s run (tools, MCP configuration, settings,
        system prompt) without a prompt: the user types at the CLI's own prompt.
        """
        self.check_interactive()
        raise NotImplementedError(f"{type(self).__name__}.interactive_command")

    async def interact(self, spec: RunSpec) -> RunOutcome:
        """Run the CLI on this process's terminal until the user ends it; its exit code.

        Its stdio is the terminal (nothing is parsed: there are no events), it gets the
        run's environment plus the terminal's variables, and it owns the terminal while it
        runs (see :func:`spawnkit._process.run_interactive`). The spawner bounds the wait.
        """
        argv = spec.sandbox.wrap(self.interactive_command(spec))
        env = self.child_env(spec)
        for name in self.headless_env:
            env.pop(name, None)
        env.update({name: os.environ[name] for name in TERMINAL_ENV if name in os.environ})
        try:
            code = await _process.run_interactive(argv, env=env, cwd=spec.cwd)
        except FileNotFoundError as exc:
            raise RuntimeNotFoundError(self.type, self.binary_name, self.install_hint) from exc
        except OSError as exc:
            raise RuntimeFailure(f"cannot start {self.binary_name}: {exc}", "crash") from exc
        outcome = RunOutcome(
            runtime_session_id=spec.runtime_session_id or spec.resume, exit_code=code
        )
        if code != 0:
            outcome.success, outcome.error_kind = False, "runtime_error"
            outcome.error = f"{self.binary_name} exited with code {code}"
        return outcome

    @abstractmethod
    async def invoke(self, spec: RunSpec, emit: EventSink) -> RunOutcome:
        """Run ``spec`` to completion, emitting events as the runtime reports them.

        Raises :class:`~spawnkit.errors.RuntimeFailure` when the run cannot
        produce an outcome; cancellation must leave no child process behind.
        """
