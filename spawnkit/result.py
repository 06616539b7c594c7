"""The records a run produces: :class:`SpawnerResult`, :class:`ToolCall`, :class:`Usage`.

These are plain frozen dataclasses shared by every runtime, the session store
and the frontends. ``to_dict()`` gives the JSON shape used by ``--json``, the
store's ``tool_calls`` column and the MCP ``trigger`` tool.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields, replace
from datetime import datetime
from typing import Any, Literal

from .errors import SpawnkitError
from .worktree import RepoChange

# A tool's output is kept up to this many characters in results and records;
# the full text stays in the runtime's own transcript.
TOOL_OUTPUT_LIMIT = 16_384
# Partial output kept for a failed or endless run.
OUTPUT_LIMIT = 1_000_000

RunStatus = Literal[
    "queued", "running", "success", "failed", "cancelled", "crashed", "budget", "timeout"
]
ToolStatus = Literal["running", "ok", "error"]


def tool_count(calls: int, failed: int) -> str:
    """``4 tool calls (2 failed)``: how every summary counts tool calls."""
    text = f"{calls} tool call{'s' if calls != 1 else ''}"
    return f"{text} ({failed} failed)" if failed else text


def truncate(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    return text[:limit] + f"\n[... truncated {len(text) - limit} characters]"


@dataclass(frozen=True)
class Usage:
    """Token counts of a run; cache counts are separate from ``input_tokens``."""

    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0

    @property
    def total_tokens(self) -> int:
        return (
            self.input_tokens
            + self.output_tokens
            + self.cache_read_tokens
            + self.cache_write_tokens
        )

    def __add__(self, other: Usage) -> Usage:
        return Usage(
            self.input_tokens + other.input_tokens,
            self.output_tokens + other.output_tokens,
            self.cache_read_tokens + other.cache_read_tokens,
            self.cache_write_tokens + other.cache_write_tokens,
        )


def split_tool_name(name: str) -> tuple[str | None, str]:
    """``mcp__health__state_get`` -> ``("health", "state_get")``; built-ins have no server."""
    if name.startswith("mcp__"):
        server, sep, tool = name[len("mcp__") :].partition("__")
        if sep and server and tool:
            return server, tool
    return None, name


# Each runtime's shell tool (Claude Code, Codex's three, Gemini).
SHELL_TOOLS = frozenset({"Bash", "shell", "exec_command", "shell_command", "run_shell_command"})


@dataclass(frozen=True)
class ToolCall:
    """One tool call as the runtime reported it, in the same shape for every runtime."""

    id: str
    name: str
    input: dict[str, Any]
    started_at: datetime
    server: str | None = None
    tool: str = ""
    output: str | None = None
    status: ToolStatus = "running"
    finished_at: datetime | None = None

    @classmethod
    def start(cls, call_id: str, name: str, input: dict[str, Any], at: datetime) -> ToolCall:
        server, tool = split_tool_name(name)
        return cls(id=call_id, name=name, input=input, started_at=at, server=server, tool=tool)

    def finish(self, output: str, is_error: bool, at: datetime) -> ToolCall:
        return replace(
            self,
            output=truncate(output, TOOL_OUTPUT_LIMIT),
            status="error" if is_error else "ok",
            finished_at=at,
        )

    @property
    def shell_command(self) -> str | None:
        """The command of a CLI's shell tool call (:data:`SHELL_TOOLS`), else None."""
        if self.server is not None or self.tool not in SHELL_TOOLS:
            return None
        value = self.input.get("command", self.input.get("cmd"))
        if isinstance(value, list) and value[:2] == ["bash", "-lc"] and len(value) == 3:
            value = value[2]  # Codex's argv form
        if isinstance(value, list):
            value = " ".join(str(part) for part in value)
        return value if isinstance(value, str) else None

    @property
    def duration_ms(self) -> int | None:
        if self.finished_at is None:
            return None
        return int((self.finished_at - self.started_at).total_seconds() * 1000)

    def to_dict(self) -> dict[str, Any]:
        # Built field by field: dataclasses.asdict deep-copies every value, and a run's
        # record makes this dict for each of its calls (40 us a call here, against 3).
        # The input is copied one level deep, as JSON-bound data needs no more.
        return {
            "id": self.id,
            "name": self.name,
            "input": dict(self.input),
            "started_at": self.started_at.isoformat(),
            "server": self.server,
            "tool": self.tool,
            "output": self.output,
            "status": self.status,
            "finished_at": self.finished_at.isoformat() if self.finished_at else None,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ToolCall:
        return cls(
            id=data["id"],
            name=data["name"],
            input=data.get("input") or {},
            started_at=datetime.fromisoformat(data["started_at"]),
            server=data.get("server"),
            tool=data.get("tool") or data["name"],
            output=data.get("output"),
            status=data.get("status", "ok"),
            finished_at=(
                datetime.fromisoformat(data["finished_at"]) if data.get("finished_at") else None
            ),
        )


@dataclass(frozen=True)
class BudgetReport:
    """How a run stood against its limits when it ended (see :mod:`spawnkit.budgets.budget`).

    ``limits`` are the ones that applied, by name; ``tokens`` is what counted towards
    ``max_tokens`` (cache reads apart, in ``cache_read_tokens``). ``cost_estimated`` flags a
    price taken from another model of the family; ``stopped_by`` names the limit that ended
    the run, with ``limit`` its value and ``reached`` the figure the run got to.
    """

    limits: dict[str, float] = field(default_factory=dict)
    tokens: int = 0
    cache_read_tokens: int = 0
    cost_usd: float | None = None
    priced_model: str | None = None
    cost_estimated: bool = False
    stopped_by: str | None = None
    limit: float | None = None
    reached: float | None = None
    note: str | None = None

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> BudgetReport:
        known = {f for f in cls.__dataclass_fields__}
        return cls(**{k: v for k, v in data.items() if k in known})


@dataclass(frozen=True)
class PermissionAnswer:
    """One answer to a ``[butler.permissions] ask`` question, as the run's record keeps it.

    ``tool_call_id`` and ``tool`` name the call asked about; ``by`` who answered (see
    :class:`spawnkit.permissions.PermissionDecision`: "notebook", "terminal", "acp-client",
    "no approver", "cancelled", ...), ``always`` whether the answer held for the rest of
    the run, ``at`` when it was given, ``reason`` what the agent was told of a denial.
    """

    tool_call_id: str
    tool: str
    allowed: bool
    by: str
    at: datetime
    always: bool = False
    reason: str | None = None

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["at"] = self.at.isoformat()
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> PermissionAnswer:
        return cls(
            tool_call_id=str(data["tool_call_id"]),
            tool=str(data["tool"]),
            allowed=bool(data["allowed"]),
            by=str(data["by"]),
            at=datetime.fromisoformat(data["at"]),
            always=bool(data.get("always", False)),
            reason=data.get("reason"),
        )


# How an attempt of a run ended: what spawnkit retries (a rate limit, an overload) or not.
AttemptOutcome = Literal["ok", "rate_limit", "overloaded", "auth", "other"]


@dataclass(frozen=True)
class Attempt:
    """One start of a run's CLI; a run retried after a rate limit or overload has several.

    ``cooldown_s`` is how long the attempt waited, before it started, on the butler's shared
    cool-down (set by a rate-limited run), ``stagger_s`` how long on ``stagger_s`` spacing.
    """

    number: int
    started_at: datetime
    ended_at: datetime
    outcome: AttemptOutcome
    message: str | None = None
    cooldown_s: float = 0.0
    stagger_s: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        # Field by field: dataclasses.asdict deep-copies, and every run records its attempts.
        return {
            "number": self.number, "started_at": self.started_at.isoformat(),
            "ended_at": self.ended_at.isoformat(), "outcome": self.outcome,
            "message": self.message, "cooldown_s": self.cooldown_s, "stagger_s": self.stagger_s,
        }  # fmt: skip

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Attempt:
        return cls(
            number=int(data["number"]),
            started_at=datetime.fromisoformat(data["started_at"]),
            ended_at=datetime.fromisoformat(data["ended_at"]),
            outcome=data.get("outcome", "other"),
            message=data.get("message"),
            cooldown_s=float(data.get("cooldown_s") or 0.0),
            stagger_s=float(data.get("stagger_s") or 0.0),
        )


@dataclass(frozen=True)
class SpawnerResult:
    """What one trigger produced.

    On failure ``output`` holds whatever the agent wrote before it failed and
    ``error`` says why in one line. ``session_id`` is spawnkit's id (the key of
    the session record); ``runtime_session_id`` is the CLI's own.
    """

    output: str = ""
    tool_calls: list[ToolCall] = field(default_factory=list)
    success: bool = True
    error: str | None = None
    session_id: str | None = None
    runtime_session_id: str | None = None
    duration_ms: int = 0
    usage: Usage = field(default_factory=Usage)
    cost_usd: float | None = None
    trace_id: str | None = None
    butler: str | None = None
    runtime: str | None = None
    model: str | None = None
    status: RunStatus = "success"
    error_kind: str | None = None
    num_turns: int | None = None
    # Set when the run had limits ([butler.limits], a trigger's or a flag's).
    budget: BudgetReport | None = None
    # Each start of the run's CLI, in order (more than one when spawnkit retried it).
    attempts: tuple[Attempt, ...] = ()
    # The CLI's exit code when it exited by itself (None: stopped by spawnkit, or unknown).
    # Not kept in the session record.
    exit_code: int | None = None
    # Connections the run's network sandbox refused (spawnkit.containment.egress; a NetworkDenied
    # each).
    network_denied: int = 0
    # Each answer to a [butler.permissions] ask question, in order (spawnkit.permissions).
    permissions: tuple[PermissionAnswer, ...] = ()
    # A run given repo=: what it changed in its worktree of the repository (see .diff).
    repo: RepoChange | None = None

    @property
    def diff(self) -> str:
        """The run's changes to its ``repo=`` repository as a git diff (binary-safe), against
        the state it started from (``HEAD`` plus the uncommitted changes); "" without one."""
        return self.repo.diff if self.repo is not None else ""

    def apply(self) -> list[str]:
        """Put the run's changes (:attr:`diff`) into its repository; the paths touched.

        Refused with :class:`~spawnkit.worktree.DiffDoesNotApply` naming the files, and
        nothing changed, when the repository moved on where the run changed it or already
        has the change (a second apply).
        """
        if self.repo is None:
            raise SpawnkitError(
                f"session {self.session_id} was not given a repository (repo=): nothing to apply"
            )
        return self.repo.apply()

    def to_dict(self) -> dict[str, Any]:
        # Not asdict(self): it would deep-copy every tool call only to replace them.
        data = {f.name: getattr(self, f.name) for f in fields(self)}
        data["repo"] = self.repo.to_dict() if self.repo is not None else None
        data["tool_calls"] = [call.to_dict() for call in self.tool_calls]
        data["usage"] = asdict(self.usage)
        data["budget"] = asdict(self.budget) if self.budget is not None else None
        data["attempts"] = [attempt.to_dict() for attempt in self.attempts]
        data["permissions"] = [answer.to_dict() for answer in self.permissions]
        return data

    @property
    def failed_tool_calls(self) -> int:
        """Tool calls that reported an error (a run can succeed despite some)."""
        return sum(1 for call in self.tool_calls if call.status == "error")

    def __str__(self) -> str:
        state = "ok" if self.success else f"{self.status}: {self.error}"
        return (
            f"SpawnerResult({state}, {len(self.tool_calls)} tool calls, "
            f"{self.usage.total_tokens} tokens, session {self.session_id})"
        )

    # -- rich displays (IPython calls these; plain string formatting, no imports) ----
    # Jupyter renders the Markdown form, so the agent's Markdown shows as Markdown.
    # spawnkit's notebook frontends show results as their own run view instead.

    def summary_line(self) -> str:
        u = self.usage
        parts = [
            "✓ success" if self.success else f"✗ {self.status}",
            " · ".join(p for p in (self.butler, self.runtime, self.model) if p),
            f"{self.duration_ms / 1000:.1f} s",
            tool_count(len(self.tool_calls), self.failed_tool_calls),
            f"{u.input_tokens:,} in / {u.output_tokens:,} out tokens",
        ]
        if self.cost_usd is not None:
            parts.append(f"${self.cost_usd:.4f}")
        return " · ".join(p for p in parts if p)

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        lines = [self.summary_line()]
        if self.error:
            lines.append(f"error: {self.error}")
        for call in self.tool_calls:
            where = f"{call.server}." if call.server else ""
            mark = {"ok": "✓", "error": "✗"}.get(call.status, "…")
            lines.append(f"  {mark} {where}{call.tool}")
        if self.output:
            lines.append(self.output if len(self.output) <= 4000 else self.output[:4000] + " …")
        lines.append(f"session {self.session_id}")
        printer.text("\n".join(lines))

    def _repr_markdown_(self) -> str:
        lines = [f"**{self.summary_line()}**", ""]
        if self.error:
            lines += [f"> error: {self.error}", ""]
        if self.tool_calls:
            lines.append("| tool | status | duration |")
            lines.append("|---|---|---|")
            for call in self.tool_calls:
                name = f"{call.server}.{call.tool}" if call.server else call.tool
                took = f"{call.duration_ms} ms" if call.duration_ms is not None else ""
                lines.append(f"| `{name}` | {call.status} | {took} |")
            lines.append("")
        lines += [self.output, "", f"<sub>session {self.session_id}</sub>"]
        return "\n".join(lines)
