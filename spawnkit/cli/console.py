"""Terminal rendering of runs and sessions, as pure functions of their records.

The command line prints a run live (each tool call when it starts and when it
finishes, assistant text as each block completes) and a one-line summary at the
end, after one line of where the time went (model request latency, time per tool)
when the CLI's telemetry is on. A connection the network sandbox refused is one line
(``blocked: connect pypi.org:443 (not in allow_hosts)``) where it happened, and a run
that had such refusals ends with one hint line saying what to add to which butler.toml.
Everything here returns strings; the caller decides where they go.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass, field
from typing import Any, TextIO

from ..edits import diff_lines, file_diffs
from ..events import (
    NOT_LISTED,
    AssistantText,
    Finished,
    NetworkDenied,
    PermissionDecided,
    Queued,
    RunEvent,
    Started,
    Timing,
    ToolCallFinished,
    ToolCallStarted,
    UsageUpdate,
)
from ..result import SpawnerResult, ToolCall, tool_count
from ..store import SessionRecord
from ..telemetry.timings import timing_line

PREVIEW_CHARS = 160
# Hosts a hint names at most (a run refused more names them all in its events).
HINT_HOSTS = 8


# The SGR code that ends each style: bold and dim share one, colours another.
_RESETS = {
    "1": "22", "2": "22", "3": "23", "4": "24", "9": "29", "31": "39", "32": "39", "36": "39",
}  # fmt: skip


@dataclass(frozen=True)
class Style:
    """ANSI styling, off when the stream is not a terminal or NO_COLOR is set."""

    enabled: bool = False

    @classmethod
    def for_stream(cls, stream: TextIO) -> Style:
        return cls(stream.isatty() and not os.environ.get("NO_COLOR"))

    def _wrap(self, code: str, text: str) -> str:
        # Each style ends with its own reset, so one inside another (code in bold) keeps it.
        return f"\033[{code}m{text}\033[{_RESETS[code]}m" if self.enabled else text

    def dim(self, text: str) -> str:
        return self._wrap("2", text)

    def bold(self, text: str) -> str:
        return self._wrap("1", text)

    def green(self, text: str) -> str:
        return self._wrap("32", text)

    def red(self, text: str) -> str:
        return self._wrap("31", text)

    def cyan(self, text: str) -> str:
        return self._wrap("36", text)

    def italic(self, text: str) -> str:
        return self._wrap("3", text)

    def underline(self, text: str) -> str:
        return self._wrap("4", text)

    def strike(self, text: str) -> str:
        return self._wrap("9", text)


def one_line(text: str, limit: int = PREVIEW_CHARS) -> str:
    flat = " ".join(str(text).split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


def describe_input(call: ToolCall) -> str:
    """The most telling part of a tool call's input: ``$ command`` for a shell."""
    command = call.shell_command  # shown as `$ command`, not as JSON
    if command is not None:
        return one_line(f"$ {command}")
    for key in ("file_path", "pattern", "path", "prompt", "command"):
        value = call.input.get(key)
        if isinstance(value, str) and value:
            return one_line(value)
    if not call.input:
        return ""
    return one_line(json.dumps(call.input, ensure_ascii=False, sort_keys=True))


def tool_label(call: ToolCall) -> str:
    return f"{call.server}.{call.tool}" if call.server else call.name


def render_tool_call_started(call: ToolCall, style: Style = Style()) -> str:
    detail = describe_input(call)
    return f"  {style.cyan('⚙')} {style.bold(tool_label(call))}" + (f"  {detail}" if detail else "")


def render_tool_call_finished(call: ToolCall, style: Style = Style()) -> str:
    mark = style.red("✗") if call.status == "error" else style.green("✓")
    ms = f"{call.duration_ms} ms" if call.duration_ms is not None else ""
    preview = one_line(call.output or "") or "(no output)"
    return f"    {mark} {style.dim(ms)}  {style.dim(preview)}"


# Lines of one file's diff the terminal prints before "N more lines".
TERMINAL_DIFF_LINES = 40


def render_diffs(call: ToolCall, style: Style = Style()) -> list[str]:
    """A file edit's diffs under its tool line: ``path +A -R``, then red ``-`` and green
    ``+`` lines (plain when piped); nothing for a call that edits no file."""
    lines: list[str] = []
    for diff in file_diffs(call):
        for index, line in enumerate(diff_lines(diff, TERMINAL_DIFF_LINES)):
            lines.append(f"      {_diff_style(line, index == 0, style)}")
    return lines


def _diff_style(line: str, header: bool, style: Style) -> str:
    if header:
        return style.bold(line)
    if line.startswith("+"):
        return style.green(line)
    if line.startswith("-"):
        return style.red(line)
    if line.startswith(("@@", "…")):
        return style.cyan(line) if line.startswith("@@") else style.dim(line)
    return line


def format_tokens(n: int) -> str:
    return f"{n:,}"


def render_summary(result: SpawnerResult, style: Style = Style()) -> str:
    usage = result.usage
    parts = [
        style.green("✓ success") if result.success else style.red(f"✗ {result.status}"),
        tool_count(len(result.tool_calls), result.failed_tool_calls),
        f"{result.duration_ms / 1000:.1f} s",
        f"{format_tokens(usage.input_tokens)} in / {format_tokens(usage.output_tokens)} out tokens"
        f" (cache {format_tokens(usage.cache_read_tokens)} read,"
        f" {format_tokens(usage.cache_write_tokens)} write)",
    ]
    if result.cost_usd is not None:
        parts.append(f"${result.cost_usd:.4f}")
    if result.network_denied:
        parts.append(style.red(blocked_count(result.network_denied)))
    parts.append(f"session {result.session_id}")
    line = " · ".join(parts)
    if not result.success and result.error:
        line += "\n" + style.red(f"error: {result.error}")
    return line


def render_timing(timing: Timing, style: Style = Style()) -> str:
    """A run's timings so far as one line: ``⏱ model 3 requests · p50 … · tools …``."""
    return style.dim(f"⏱ {timing_line(timing)}")


def blocked_count(n: int) -> str:
    return f"{n} connection{'s' if n != 1 else ''} blocked"


def network_denied_line(event: NetworkDenied) -> str:
    """``blocked: connect pypi.org:443 (not in allow_hosts)``, and the tool call if known."""
    during = f" · during {event.tool}" if event.tool else ""
    return f"blocked: connect {event.host}:{event.port} ({event.reason}){during}"


def render_network_denied(event: NetworkDenied, style: Style = Style()) -> str:
    return f"  {style.red('⛔')} {style.red(network_denied_line(event))}"


@dataclass
class NetworkRefusals:
    """A run's refused connections so far, for the hint at its end (a few hosts kept)."""

    count: int = 0
    hosts: dict[str, None] = field(default_factory=dict)  # not listed, in order
    config_file: str | None = None

    def add(self, event: NetworkDenied) -> None:
        self.count += 1
        self.config_file = event.config_file or self.config_file
        if event.reason == NOT_LISTED and len(self.hosts) < HINT_HOSTS:
            self.hosts[event.host] = None

    def hint(self) -> str | None:
        """One line: what to add to ``allow_hosts``, and where; None without refusals."""
        if not self.count:
            return None
        where = self.config_file or "the butler's butler.toml"
        if not self.hosts:
            blocked = blocked_count(self.count)
            return f"hint: {blocked} (not allowed by [butler.sandbox] allow_hosts in {where})"
        names = ", ".join(f'"{host}"' for host in self.hosts)
        return (
            f"hint: {blocked_count(self.count)}; to allow them, add {names} to "
            f"[butler.sandbox] allow_hosts in {where}"
        )


def render_event(event: RunEvent, style: Style = Style()) -> str | None:
    """One event as terminal lines, or None for events the terminal skips."""
    if isinstance(event, Queued):
        return style.dim(f"… queued for {event.butler} (position {event.position})")
    if isinstance(event, Started):
        return render_started(event, None, style)
    if isinstance(event, ToolCallStarted):
        return render_tool_call_started(event.call, style)
    if isinstance(event, ToolCallFinished):
        # An edit's diff once it ran, when the tool has said what it did (created a file).
        return "\n".join(
            [render_tool_call_finished(event.call, style), *render_diffs(event.call, style)]
        )
    if isinstance(event, AssistantText):
        return render_answer(event.text, style)
    if isinstance(event, NetworkDenied):
        return render_network_denied(event, style)
    if isinstance(event, PermissionDecided):
        return render_permission_decided(event, style)
    if isinstance(event, Finished):
        return render_summary(event.result, style)
    return None


def render_answer(text: str, style: Style = Style()) -> str:
    """Assistant text, indented: its Markdown rendered on a terminal, as written elsewhere."""
    from .terminal_markdown import terminal_markdown  # mistune, only once there is text

    return "\n".join(f"  {line}" for line in terminal_markdown(text, style).splitlines())


def render_started(event: Started, model: str | None, style: Style = Style()) -> str:
    """``▶ butler · runtime · model · session ID``: the run's header."""
    named = model or event.model
    shown = f" · {named}" if named else ""
    return style.dim(f"▶ {event.butler} · {event.runtime}{shown} · session {event.session_id}")


def render_permission_decided(event: PermissionDecided, style: Style = Style()) -> str:
    """``  ? Write: denied (no approver): why``: the answer to an ask question."""
    answer = event.answer
    word = style.green("allowed") if answer.allowed else style.red("denied")
    why = f": {one_line(answer.reason, 160)}" if answer.reason and not answer.allowed else ""
    return f"  ? {tool_label(event.call)}: {word} ({answer.by}){why}"


class EventPrinter:
    """An event listener that prints each event to a stream as it arrives.

    Timings (CLI telemetry on) are not printed one by one: the last one of a run is
    printed as one line just before its summary. A run that had connections refused ends
    with one hint line after its summary. A header with no model waits for the runtime to
    name it (its first event, usually), and goes out with the run's first other line.
    """

    def __init__(self, stream: TextIO | None = None) -> None:
        self.stream = stream or sys.stdout
        self.style = Style.for_stream(self.stream)
        self._timings: dict[str, Timing] = {}
        self._refusals: dict[str, NetworkRefusals] = {}
        self._headers: dict[str, Started] = {}

    def _header(self, session_id: str, model: str | None = None) -> None:
        started = self._headers.pop(session_id, None)
        if started is not None:
            print(render_started(started, model, self.style), file=self.stream, flush=True)

    def __call__(self, event: RunEvent) -> None:
        if isinstance(event, Timing):
            self._timings[event.session_id] = event
            return
        if isinstance(event, Started) and not event.model:
            self._headers[event.session_id] = event
            return
        if isinstance(event, UsageUpdate):
            if event.model:
                self._header(event.session_id, event.model)
            return
        if isinstance(event, NetworkDenied):
            self._refusals.setdefault(event.session_id, NetworkRefusals()).add(event)
        hint = None
        if isinstance(event, Finished):
            session = event.result.session_id or ""
            timing = self._timings.pop(session, None)
            if timing is not None:
                print(render_timing(timing, self.style), file=self.stream, flush=True)
            refusals = self._refusals.pop(session, None)
            hint = refusals.hint() if refusals is not None else None
        text = render_event(event, self.style)
        if text is not None:
            self._header(event.session_id)
            print(text, file=self.stream, flush=True)
        if hint is not None:
            print(self.style.red(hint), file=self.stream, flush=True)


def _kind(record: SessionRecord) -> str:
    """``ask notes,plan``: what a session other than a butler's run was, and about what."""
    return " ".join([record.kind, ",".join(record.sources)]).strip()


def render_sessions_table(records: list[SessionRecord]) -> str:
    """One line a session; a ``kind`` column when some session is an ask or a chat."""
    if not records:
        return "no sessions recorded yet"
    kinds = any(r.kind != "run" for r in records)
    header = (
        "started (UTC)",
        "butler",
        "runtime",
        *(("kind",) if kinds else ()),
        "status",
        "source",
        "tools",
        "tokens",
        "cost",
        "session",
        "prompt",
    )
    rows = [header]
    for r in records:
        rows.append(
            (
                r.created_at.strftime("%Y-%m-%d %H:%M:%S"),
                r.butler,
                r.runtime,
                *((_kind(r),) if kinds else ()),
                r.status,
                r.trigger_source,
                str(len(r.tool_calls)),
                format_tokens(r.usage.total_tokens),
                f"${r.cost_usd:.4f}" if r.cost_usd is not None else "-",
                r.id[:8],
                one_line(r.prompt, 40),
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    return "\n".join(
        "  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row)).rstrip() for row in rows
    )


def render_session(record: SessionRecord, style: Style = Style()) -> str:
    data: dict[str, Any] = record.to_dict()
    calls = data.pop("tool_calls")
    output = data.pop("output") or ""
    data.pop("permissions")
    lines = [style.bold(f"session {record.id}")]
    width = max(len(k) for k in data)
    for key, value in data.items():
        if value is not None and value != "":
            lines.append(f"  {key.ljust(width)}  {one_line(str(value), 200)}")
    lines.append(f"  {'tool_calls'.ljust(width)}  {len(calls)}")
    for call in record.tool_calls:
        lines.append("  " + render_tool_call_started(call, style))
        lines.append("  " + render_tool_call_finished(call, style))
        lines.extend("  " + line for line in render_diffs(call, style))
    if record.permissions:
        lines.append(f"  {'permissions'.ljust(width)}  {len(record.permissions)} asked")
    for answer in record.permissions:
        word = style.green("allowed") if answer.allowed else style.red("denied")
        always = ", always" if answer.always else ""
        lines.append(f"    ? {answer.tool} ({answer.tool_call_id}): {word} by {answer.by}{always}")
    if output:
        lines.append(f"  {'output'.ljust(width)}")
        lines.extend(f"    {line}" for line in output.splitlines())
    return "\n".join(lines)
