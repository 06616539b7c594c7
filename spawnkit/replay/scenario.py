"""Replay scenarios: the scripted model turns, how they load, and how a turn is played.

A scenario is a TOML file of scripts; each script is a list of model turns, chosen by a
regex on the user's prompt. This module knows nothing of any vendor's wire format: a wire
adapter (``anthropic.py``, ``openai.py``, ``gemini.py``) reduces a request to a
:class:`TurnRequest`, asks :meth:`Scenario.reply` for a :class:`Reply`, and encodes that
reply in its own format. The adapters present tool names so that one glob (such as
``mcp__*__state_get``) matches on every runtime, and name the runtime's shell tool
(:class:`ShellTool`) so a ``shell = "..."`` turn runs a command on any of them.

Loading validates everything up front (keys, types, regexes, template placeholders) and
raises :class:`~spawnkit.errors.ScenarioError` naming the file and the place, so a bad
scenario fails before any agent CLI is started, never mid-run.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import re
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

from ..errors import ScenarioError

# A `delay_ms` longer than this is almost certainly a typo, and an unbounded sleep would
# hang the agent CLI under test.
MAX_DELAY_MS = 600_000

TOP_KEYS = frozenset({"description", "model", "script", "turn"})
SCRIPT_KEYS = frozenset({"match", "turn"})
TURN_KEYS = frozenset(
    {"text", "tool", "input", "shell", "tool_calls", "usage", "delay_ms", "chunk_chars", "error"}
)
CALL_KEYS = frozenset({"tool", "input", "shell"})
USAGE_KEYS = (
    "input_tokens",
    "output_tokens",
    "cache_read_input_tokens",
    "cache_creation_input_tokens",
)
ERROR_KEYS = frozenset({"status", "type", "message"})

# `{{ name }}` is a placeholder; `\{{` is a literal `{{` (the recorder escapes recorded
# text this way, so a model answer that happens to contain braces replays verbatim).
_PLACEHOLDER = re.compile(r"\\\{\{|\{\{\s*([^{}]*?)\s*\}\}")
_SIMPLE_NAMES = frozenset({"prompt", "last_tool_result", "tools", "system"})
_MATCH_GROUP = re.compile(r"match\.(\d+)")

StopReason = Literal["end_turn", "tool_use"]


@dataclass(frozen=True)
class Usage:
    """Token counts reported for one turn; ``None`` fields are estimated by the wire adapter."""

    input_tokens: int | None = None
    output_tokens: int | None = None
    cache_read_input_tokens: int | None = None
    cache_creation_input_tokens: int | None = None


@dataclass(frozen=True)
class ErrorSpec:
    """An HTTP error the server answers instead of a model turn."""

    status: int
    type: str = "api_error"
    message: str = "replayed error"


@dataclass(frozen=True)
class ToolCall:
    """A scripted tool call: ``tool`` is an fnmatch glob over the offered tool names."""

    tool: str
    input: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class ShellCall:
    """A scripted shell command, run with whatever shell tool the requesting CLI offers."""

    command: str


@dataclass(frozen=True)
class Turn:
    """One scripted model response (text first, then tool calls), or an HTTP error."""

    text: str | None = None
    tool_calls: tuple[ToolCall | ShellCall, ...] = ()
    usage: Usage = Usage()
    delay_ms: int = 0
    chunk_chars: int | None = None
    error: ErrorSpec | None = None


@dataclass(frozen=True)
class Script:
    """The turns of one conversation; ``match`` (searched in the prompt) picks the script."""

    turns: tuple[Turn, ...]
    match: re.Pattern[str] | None = None


@dataclass(frozen=True)
class ShellTool:
    """How the requesting CLI runs a shell command: its tool's name and argument.

    Claude Code's ``Bash`` and Gemini's ``run_shell_command`` take ``{"command": str}``,
    Codex's ``exec_command`` ``{"cmd": str}``; ``argv`` marks a tool taking an argv list,
    which gets ``["bash", "-lc", command]``.
    """

    name: str
    argument: str = "command"
    argv: bool = False

    def input(self, command: str) -> dict[str, Any]:
        return {self.argument: ["bash", "-lc", command] if self.argv else command}

    def command_of(self, tool_input: Mapping[str, Any]) -> str | None:
        """The command if ``tool_input`` is exactly what :meth:`input` would build, else None."""
        if set(tool_input) != {self.argument}:
            return None
        value = tool_input[self.argument]
        if self.argv:
            if isinstance(value, list) and len(value) == 3 and value[:2] == ["bash", "-lc"]:
                value = value[2]
            else:
                return None
        return value if isinstance(value, str) else None


@dataclass(frozen=True)
class TurnRequest:
    """What a wire adapter extracted from a model request: all a scenario needs to answer.

    ``tools`` are the offered tool names as scenarios see them (the adapter maps them back);
    ``shell`` is the CLI's shell tool, if one is offered.
    """

    prompt: str
    turn_index: int
    tools: tuple[str, ...] = ()
    last_tool_result: str = ""
    system: str = ""
    shell: ShellTool | None = None

    @property
    def seed(self) -> str:
        """A short hash naming the conversation, so ids differ between scripts but not runs."""
        return hashlib.sha256(self.prompt.encode()).hexdigest()[:12]


@dataclass(frozen=True)
class PlannedCall:
    """A tool call resolved against the request: a concrete tool name and rendered input."""

    name: str
    input: Mapping[str, Any]


@dataclass(frozen=True)
class Reply:
    """The concrete answer to one request, ready for a wire adapter to encode."""

    text: str = ""
    tool_calls: tuple[PlannedCall, ...] = ()
    usage: Usage = Usage()
    delay_ms: int = 0
    chunk_chars: int | None = None
    error: ErrorSpec | None = None

    @property
    def stop_reason(self) -> StopReason:
        return "tool_use" if self.tool_calls else "end_turn"

    @property
    def estimated_output_tokens(self) -> int:
        """About four characters of text and tool-call JSON a token, at least one."""
        chars = len(self.text) + sum(
            len(call.name) + len(json.dumps(call.input)) for call in self.tool_calls
        )
        return max(1, chars // 4)


@dataclass(frozen=True)
class Scenario:
    """A validated scenario; build it with :meth:`load` or :meth:`from_dict`."""

    scripts: tuple[Script, ...]
    description: str = ""
    model: str = ""
    source: str = "<scenario>"

    @classmethod
    def load(cls, path: Path | str) -> Scenario:
        path = Path(path)
        try:
            data = tomllib.loads(path.read_text(encoding="utf-8"))
        except OSError as exc:
            raise ScenarioError(f"{path}: cannot read scenario: {exc.strerror or exc}") from exc
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
            raise ScenarioError(f"{path}: not valid TOML: {exc}") from exc
        return cls.from_dict(data, source=str(path))

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], source: str = "<scenario>") -> Scenario:
        return _Loader(source).scenario(data)

    def select(self, prompt: str) -> tuple[int, Script, re.Match[str] | None] | None:
        """The first script whose ``match`` is found in ``prompt`` (or has none)."""
        for index, script in enumerate(self.scripts):
            if script.match is None:
                return index, script, None
            found = script.match.search(prompt)
            if found:
                return index, script, found
        return None

    def reply(self, request: TurnRequest) -> Reply:
        """Play the turn for ``request``; scenario gaps become explanatory text, not errors.

        Turn selection is stateless (the request's ``turn_index``, i.e. the number of model
        turns already in the conversation), so concurrent runs and CLI retries are safe.
        """
        chosen = self.select(request.prompt)
        if chosen is None:
            return Reply(
                text=f"[replay] no script in {self.source} matches the prompt: "
                f"{_clip(request.prompt)!r}"
            )
        script_index, script, found = chosen
        if request.turn_index >= len(script.turns):
            return Reply(
                text=f"[replay] no more scripted turns (script[{script_index}] has "
                f"{len(script.turns)}, this is turn {request.turn_index})"
            )
        turn = script.turns[request.turn_index]
        if turn.error is not None:
            return Reply(error=turn.error, delay_ms=turn.delay_ms)
        timing = Reply(usage=turn.usage, delay_ms=turn.delay_ms, chunk_chars=turn.chunk_chars)
        context = _context(request, found)
        calls: list[PlannedCall] = []
        for call in turn.tool_calls:
            if isinstance(call, ShellCall):
                if request.shell is None:
                    offered = ", ".join(request.tools) or "none"
                    return replace(
                        timing,
                        text="[replay] a shell turn needs a shell tool, and none is offered: "
                        f"{offered}",
                    )
                command = render(call.command, context)
                calls.append(PlannedCall(request.shell.name, request.shell.input(command)))
                continue
            name = _resolve_tool(call.tool, request.tools)
            if name is None:
                offered = ", ".join(request.tools) or "none"
                return replace(
                    timing,
                    text=f"[replay] tool pattern {call.tool!r} matched none of the offered "
                    f"tools: {offered}",
                )
            calls.append(PlannedCall(name, render_value(call.input, context)))
        text = render(turn.text, context) if turn.text is not None else ""
        return replace(timing, text=text, tool_calls=tuple(calls))


def estimate_tokens(value: Any) -> int:
    """A deterministic stand-in for a tokenizer: about four characters of JSON a token."""
    return max(1, len(json.dumps(value, sort_keys=True, separators=(",", ":"))) // 4)


def _clip(text: str, limit: int = 200) -> str:
    return text if len(text) <= limit else text[:limit] + "..."


def _resolve_tool(pattern: str, offered: Sequence[str]) -> str | None:
    # An exact name wins over a glob that also matches others, then the first offered.
    if pattern in offered:
        return pattern
    for name in offered:
        if fnmatch.fnmatchcase(name, pattern):
            return name
    return None


def _context(request: TurnRequest, found: re.Match[str] | None) -> dict[str, str]:
    context = {
        "prompt": request.prompt,
        "last_tool_result": request.last_tool_result,
        "tools": ", ".join(request.tools),
        "system": request.system,
    }
    if found is not None:
        for group in range(found.re.groups + 1):
            context[f"match.{group}"] = found.group(group) or ""
    return context


def render(template: str, context: Mapping[str, str]) -> str:
    """Fill ``{{ name }}`` placeholders (validated at load time) from ``context``."""

    def substitute(found: re.Match[str]) -> str:
        if found.group(1) is None:
            return "{{"
        return context.get(found.group(1), "")

    return _PLACEHOLDER.sub(substitute, template)


def render_value(value: Any, context: Mapping[str, str]) -> Any:
    """Render every string inside a nested tool input (keys are left as written)."""
    if isinstance(value, str):
        return render(value, context)
    if isinstance(value, Mapping):
        return {key: render_value(item, context) for key, item in value.items()}
    if isinstance(value, list):
        return [render_value(item, context) for item in value]
    return value


def escape_template(text: str) -> str:
    """Make ``text`` render to itself (what the recorder writes for model output)."""
    return text.replace("{{", "\\{{")


def escape_glob(name: str) -> str:
    """An fnmatch pattern matching exactly ``name``."""
    return re.sub(r"([*?\[])", r"[\1]", name)


class _Loader:
    """Validates a parsed TOML document; every error names the file and the key path."""

    def __init__(self, source: str) -> None:
        self.source = source

    def fail(self, where: str, message: str) -> ScenarioError:
        return ScenarioError(
            f"{self.source}: {where}: {message}" if where else f"{self.source}: {message}"
        )

    def table(self, value: Any, where: str, allowed: frozenset[str]) -> Mapping[str, Any]:
        if not isinstance(value, Mapping):
            raise self.fail(where, f"expected a table, got {_type_name(value)}")
        unknown = sorted(set(value) - allowed)
        if unknown:
            raise self.fail(
                _join(where, unknown[0]),
                f"unknown key (allowed: {', '.join(sorted(allowed))})",
            )
        return value

    def string(self, value: Any, where: str) -> str:
        if not isinstance(value, str):
            raise self.fail(where, f"expected a string, got {_type_name(value)}")
        return value

    def integer(self, value: Any, where: str, low: int, high: int | None = None) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.fail(where, f"expected an integer, got {_type_name(value)}")
        if value < low or (high is not None and value > high):
            bound = f"between {low} and {high}" if high is not None else f">= {low}"
            raise self.fail(where, f"must be {bound}, got {value}")
        return value

    def tables(self, value: Any, where: str) -> list[Any]:
        if not isinstance(value, list) or not value:
            raise self.fail(where, "expected a non-empty array of tables ([[...]])")
        return value

    def scenario(self, data: Mapping[str, Any]) -> Scenario:
        data = self.table(data, "", TOP_KEYS)
        description = self.string(data.get("description", ""), "description")
        model = self.string(data.get("model", ""), "model")
        if "script" in data and "turn" in data:
            raise self.fail("turn", "use either top-level [[turn]] or [[script]], not both")
        scripts: tuple[Script, ...]
        if "turn" in data:
            scripts = (self.script({"turn": data["turn"]}, "", turn_prefix="turn"),)
        elif "script" in data:
            scripts = tuple(
                self.script(item, f"script[{index}]")
                for index, item in enumerate(self.tables(data["script"], "script"))
            )
        else:
            raise self.fail("", "no [[script]] or [[turn]] given")
        return Scenario(scripts, description=description, model=model, source=self.source)

    def script(self, value: Any, where: str, turn_prefix: str | None = None) -> Script:
        data = self.table(value, where, SCRIPT_KEYS)
        match: re.Pattern[str] | None = None
        if "match" in data:
            pattern = self.string(data["match"], _join(where, "match"))
            try:
                match = re.compile(pattern)
            except re.error as exc:
                raise self.fail(_join(where, "match"), f"bad regex {pattern!r}: {exc}") from exc
        prefix = turn_prefix or _join(where, "turn")
        if "turn" not in data:
            raise self.fail(prefix, "a script needs at least one [[turn]]")
        groups = match.groups if match is not None else None
        turns = tuple(
            self.turn(item, f"{prefix}[{index}]", groups)
            for index, item in enumerate(self.tables(data["turn"], prefix))
        )
        return Script(turns, match)

    def turn(self, value: Any, where: str, groups: int | None) -> Turn:
        data = self.table(value, where, TURN_KEYS)
        delay_ms = self.integer(data.get("delay_ms", 0), _join(where, "delay_ms"), 0, MAX_DELAY_MS)
        if "error" in data:
            extra = sorted(set(data) - {"error", "delay_ms"})
            if extra:
                raise self.fail(_join(where, extra[0]), "an error turn takes only delay_ms")
            return Turn(error=self.error(data["error"], _join(where, "error")), delay_ms=delay_ms)
        text = None
        if "text" in data:
            text = self.template(data["text"], _join(where, "text"), groups)
        given = [key for key in ("tool", "shell", "tool_calls") if key in data]
        if len(given) > 1:
            raise self.fail(
                _join(where, given[1]), f"use either {given[0]} or {given[1]}, not both"
            )
        if "input" in data and "tool" not in data:
            raise self.fail(_join(where, "input"), "input needs tool")
        calls: list[ToolCall | ShellCall] = []
        if "tool" in data or "shell" in data:
            calls.append(self.call({k: data[k] for k in CALL_KEYS if k in data}, where, groups))
        if "tool_calls" in data:
            items = self.tables(data["tool_calls"], _join(where, "tool_calls"))
            calls.extend(
                self.call(item, f"{_join(where, 'tool_calls')}[{index}]", groups)
                for index, item in enumerate(items)
            )
        if text is None and not calls:
            raise self.fail(where, "a turn needs text, tool, shell, tool_calls or error")
        chunk_chars = None
        if "chunk_chars" in data:
            chunk_chars = self.integer(data["chunk_chars"], _join(where, "chunk_chars"), 1)
        usage = self.usage(data["usage"], _join(where, "usage")) if "usage" in data else Usage()
        return Turn(
            text=text,
            tool_calls=tuple(calls),
            usage=usage,
            delay_ms=delay_ms,
            chunk_chars=chunk_chars,
        )

    def call(self, value: Any, where: str, groups: int | None) -> ToolCall | ShellCall:
        data = self.table(value, where, CALL_KEYS)
        if "shell" in data:
            extra = sorted(set(data) - {"shell"})
            if extra:
                raise self.fail(_join(where, extra[0]), "a shell call takes only the command")
            command = self.template(data["shell"], _join(where, "shell"), groups)
            if not command.strip():
                raise self.fail(_join(where, "shell"), "empty shell command")
            return ShellCall(command)
        if "tool" not in data:
            raise self.fail(_join(where, "tool"), "missing tool name pattern")
        tool = self.string(data["tool"], _join(where, "tool"))
        if not tool:
            raise self.fail(_join(where, "tool"), "empty tool name pattern")
        tool_input = data.get("input", {})
        if not isinstance(tool_input, Mapping):
            raise self.fail(
                _join(where, "input"), f"expected a table, got {_type_name(tool_input)}"
            )
        self.check_templates(tool_input, _join(where, "input"), groups)
        return ToolCall(tool, dict(tool_input))

    def usage(self, value: Any, where: str) -> Usage:
        data = self.table(value, where, frozenset(USAGE_KEYS))
        counts = {key: self.integer(data[key], _join(where, key), 0) for key in data}
        return Usage(**counts)

    def error(self, value: Any, where: str) -> ErrorSpec:
        data = self.table(value, where, ERROR_KEYS)
        if "status" not in data:
            raise self.fail(_join(where, "status"), "missing HTTP status")
        return ErrorSpec(
            status=self.integer(data["status"], _join(where, "status"), 400, 599),
            type=self.string(data.get("type", "api_error"), _join(where, "type")),
            message=self.string(data.get("message", "replayed error"), _join(where, "message")),
        )

    def template(self, value: Any, where: str, groups: int | None) -> str:
        text = self.string(value, where)
        for found in _PLACEHOLDER.finditer(text):
            name = found.group(1)
            if name is None or name in _SIMPLE_NAMES:
                continue
            group = _MATCH_GROUP.fullmatch(name)
            if group is None:
                raise self.fail(
                    where,
                    f"unknown placeholder {{{{ {name} }}}} (known: prompt, last_tool_result, "
                    "tools, system, match.N)",
                )
            if groups is None:
                raise self.fail(where, f"{{{{ {name} }}}} used but the script has no match")
            if int(group.group(1)) > groups:
                raise self.fail(
                    where, f"{{{{ {name} }}}}: the match regex has only {groups} group(s)"
                )
        return text

    def check_templates(self, value: Any, where: str, groups: int | None) -> None:
        if isinstance(value, str):
            self.template(value, where, groups)
        elif isinstance(value, Mapping):
            for key, item in value.items():
                self.check_templates(item, _join(where, str(key)), groups)
        elif isinstance(value, list):
            for index, item in enumerate(value):
                self.check_templates(item, f"{where}[{index}]", groups)


def _join(where: str, key: str) -> str:
    return f"{where}.{key}" if where else key


def _type_name(value: Any) -> str:
    return {
        dict: "a table",
        list: "an array",
        str: "a string",
        bool: "a boolean",
        int: "an integer",
        float: "a float",
    }.get(type(value), type(value).__name__)
