"""What a run view shows, folded from events in constant time per event.

:class:`ViewState` keeps a bounded, ordered transcript of one run (assistant
text segments and tool calls in the order they happened), a header
(:class:`Status`: state, what the run waits on, turns against the limit,
tokens, cost, failed tool calls) and the changes since the last flush. A
frontend sends :meth:`ViewState.take_batch` to the browser at most about 20
times a second, so the cost of an event never depends on how many came before
it, and memory stays bounded for runs of any length. Pure Python: no widget or
IPython imports, so it is tested and benchmarked alone; the terminal view and
the static snapshot read the same state.
"""

from __future__ import annotations

import json
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from ..budgets.budget import list_price
from ..cli.console import (
    NetworkRefusals,
    blocked_count,
    describe_input,
    network_denied_line,
    one_line,
    tool_label,
)
from ..edits import FileDiff, diff_lines, file_diffs
from ..events import (
    AssistantText,
    Finished,
    NetworkDenied,
    PermissionAsked,
    PermissionDecided,
    Queued,
    RunEvent,
    Started,
    TextDelta,
    Timing,
    ToolCallFinished,
    ToolCallStarted,
    UsageUpdate,
)
from ..result import PermissionAnswer, SpawnerResult, ToolCall, Usage, tool_count
from ..telemetry.timings import timing_line
from .markdown import markdown_html

MAX_ITEMS = 600
MAX_TEXT_CHARS = 100_000  # all kept text segments together
MAX_SEGMENT_CHARS = 20_000  # one segment keeps its tail
PREVIEW_CHARS = 2_000  # tool output sent with a row; "show all" asks for the rest
INPUT_CHARS = 4_000
RESULT_LINE_CHARS = 160
# A snapshot (for views opened late) is re-sent about once a second: keep it small.
SNAPSHOT_ITEMS = 200
SNAPSHOT_PREVIEW_CHARS = 300
SNAPSHOT_DIFF_LINES = 20
FLUSH_INTERVAL_S = 0.05  # at most ~20 frontend messages a second
# A streaming segment is re-rendered as Markdown at most once per this many times
# its last rendering took, so long answers cannot eat the loop.
RENDER_COST_FACTOR = 5

MARKS = {
    "starting": "○",
    "queued": "◷",
    "running": "●",
    "success": "✓",
    "failed": "✗",
    "crashed": "⚠",
    "cancelled": "■",
    "budget": "$",
    "timeout": "⏱",
}
LIVE_STATES = frozenset({"starting", "queued", "running"})


def estimate_cost(model: str | None, usage: Usage) -> float | None:
    """What ``usage`` costs at ``model``'s list price (estimated from its family, as a
    run's record is priced), or None for an unpriced model."""
    return list_price(model, usage)


def format_duration(ms: float | None) -> str:
    """Durations the same way everywhere: ``850 ms``, ``2.4 s``, ``3 min 5 s``."""
    if ms is None:
        return ""
    if ms < 1000:
        return f"{int(ms)} ms"
    if ms < 60_000:
        return f"{ms / 1000:.1f} s"
    minutes, seconds = divmod(int(ms / 1000), 60)
    return f"{minutes} min {seconds} s"


def _pretty(value: Any, indent: str = "") -> str:
    """``json.dumps(value, indent=2)``, with the leaves left to the C encoder (much faster)."""
    inner = indent + "  "
    if isinstance(value, dict) and value:
        pairs = (f"{inner}{_leaf(str(k))}: {_pretty(v, inner)}" for k, v in value.items())
        return "{\n" + ",\n".join(pairs) + f"\n{indent}}}"
    if isinstance(value, list | tuple) and value:
        return "[\n" + ",\n".join(f"{inner}{_pretty(v, inner)}" for v in value) + f"\n{indent}]"
    return _leaf(value)


def _leaf(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, default=str)


def pretty_output(text: str) -> str:
    """Tool output, with JSON pretty-printed (MCP tools answer in JSON)."""
    stripped = text.strip()
    if stripped[:1] in ("{", "[") and len(stripped) <= 200_000:
        try:
            return _pretty(json.loads(stripped))
        except ValueError:
            return text
    return text


def _cut(text: str, limit: int) -> tuple[str, int]:
    """``text`` up to ``limit`` characters, and how many were left out."""
    return (text, 0) if len(text) <= limit else (text[:limit], len(text) - limit)


def input_text(call: ToolCall) -> str:
    text, more = _cut(_pretty(call.input), INPUT_CHARS)
    return text + (f"\n… {more} more characters" if more else "")


def tool_item(
    call: ToolCall, full_output: str | None = None, formatted_input: str | None = None
) -> dict[str, Any]:
    """A tool call as the view's row: label, one-line input, result preview, bounded texts."""
    text = full_output if full_output is not None else pretty_output(call.output or "")
    output, more = _cut(text, PREVIEW_CHARS)
    done = call.output is not None
    result = (one_line(call.output or "", RESULT_LINE_CHARS) or "(no output)") if done else None
    diffs = file_diffs(call)
    return {
        "id": call.id,
        "kind": "tool",
        "label": tool_label(call),
        "summary": diffs_summary(diffs) or describe_input(call),
        "diffs": [diff.to_dict() for diff in diffs],
        "status": call.status,
        "duration_ms": call.duration_ms,
        "duration": format_duration(call.duration_ms),
        "input": formatted_input if formatted_input is not None else input_text(call),
        "result": result,
        "output": output if done else None,
        "output_chars": len(text) if done else 0,
        "output_lines": text.count("\n") + 1 if done and text else 0,
        "output_more": more,
    }


def diffs_summary(diffs: list[FileDiff]) -> str:
    """``a.py +3 -1, b.py +10 -0``: each file an edit changes (its edits summed), or ""."""
    totals: dict[str, list[int]] = {}
    bare: set[str] = set()
    for diff in diffs:
        counts = totals.setdefault(diff.path, [0, 0])
        counts[0] += diff.added
        counts[1] += diff.removed
        if not diff.lines:
            bare.add(diff.path)
    return one_line(
        ", ".join(
            path if path in bare and not any(counts) else f"{path} +{counts[0]} -{counts[1]}"
            for path, counts in totals.items()
        )
    )


def approval_input(call: ToolCall) -> str:
    """What a person approves: an edit's diff as text (``path +A -R``, ``-``/``+`` lines),
    else the call's input."""
    diffs = file_diffs(call)
    if not diffs:
        return input_text(call)
    return "\n".join(line for diff in diffs for line in diff_lines(diff))


def approval_item(
    call: ToolCall, answer: PermissionAnswer | None = None, below: bool = False
) -> dict[str, Any]:
    """A ``[butler.permissions] ask`` question as the view's card: waiting for a person
    (``answer`` None: the browser shows Allow and Deny, or with ``below`` points at the
    cell's input box, see :func:`spawnkit.notebook.runner.wait`), or answered."""
    label = tool_label(call)
    if answer is None:
        where = "answer in the box below the cell (y/N)" if below else "waiting for your answer"
        state, text = "waiting", f"{label} asks to run: {where}"
    else:
        state = "allowed" if answer.allowed else "denied"
        text = f"{label}: {state} ({answer.by})"
        if not answer.allowed and answer.reason:
            text += f": {one_line(answer.reason, RESULT_LINE_CHARS)}"
    return {
        "id": f"ask-{call.id}",
        "kind": "approval",
        "call_id": call.id,
        "label": label,
        "summary": describe_input(call),
        "input": approval_input(call),
        "state": state,
        "text": text,
        "below": below and answer is None,
    }


@dataclass
class _Segment:
    """One block of assistant text, its Markdown source and rendered HTML."""

    parts: list[str] = field(default_factory=list)
    chars: int = 0
    closed: bool = False
    html: str = ""
    rendered_at: float = 0.0
    render_cost: float = 0.0
    clipped: bool = False

    @property
    def source(self) -> str:
        if len(self.parts) > 1:
            self.parts = ["".join(self.parts)]
        return self.parts[0] if self.parts else ""

    def set(self, text: str) -> None:
        if len(text) > MAX_SEGMENT_CHARS:
            text, self.clipped = text[-MAX_SEGMENT_CHARS:], True
        self.parts, self.chars = [text], len(text)

    def append(self, text: str) -> None:
        self.parts.append(text)
        self.chars += len(text)
        if self.chars > 2 * MAX_SEGMENT_CHARS:
            self.set(self.source)

    def render(self, now: float) -> bool:
        """Re-render the Markdown; False when a long streaming segment should wait."""
        if not self.closed and now - self.rendered_at < RENDER_COST_FACTOR * self.render_cost:
            return False
        started = time.perf_counter()
        source = self.source[-MAX_SEGMENT_CHARS:]
        note = "<p class='sk-clipped'>… (earlier text not shown)</p>" if self.clipped else ""
        self.html = note + markdown_html(source)
        self.render_cost = time.perf_counter() - started
        self.rendered_at = now
        return True


@dataclass
class Status:
    """The header of a run view: everything but the transcript."""

    state: str = "starting"
    session_id: str | None = None
    butler: str | None = None
    runtime: str | None = None
    model: str | None = None
    queue_position: int | None = None
    tool_calls: int = 0
    failed_tools: int = 0
    running: dict[str, str] = field(default_factory=dict)  # call id -> label
    streaming: bool = False
    turns: int | None = None
    max_turns: int | None = None
    usage: Usage = field(default_factory=Usage)
    usage_known: bool = False
    # The runtime tells its usage only at the end, and no relay meters it.
    usage_at_end: bool = False
    cost_usd: float | None = None  # reported by the runtime
    error: str | None = None
    error_kind: str | None = None
    started: float | None = None  # monotonic, at Started
    duration_ms: int | None = None  # the result's, once finished
    # Model request latency and tool time from the CLI's telemetry (CLI telemetry on).
    timing: str | None = None
    # Connections the network sandbox refused, and once the run ended what to add where.
    refusals: NetworkRefusals = field(default_factory=NetworkRefusals)
    # Tool calls waiting for a person's answer ([butler.permissions] ask): call id -> label.
    asking: dict[str, str] = field(default_factory=dict)
    hint: str | None = None
    _estimate: tuple[tuple[Any, ...], float | None] = ((), None)

    @property
    def live(self) -> bool:
        return self.state in LIVE_STATES

    @property
    def mark(self) -> str:
        return MARKS.get(self.state, "●")

    def elapsed_ms(self) -> float | None:
        if self.duration_ms is not None:
            return float(self.duration_ms)
        if self.started is None:
            return None
        return (time.monotonic() - self.started) * 1000

    def cost(self) -> tuple[float | None, bool]:
        """The cost and whether it is an estimate (list price of the tokens so far)."""
        if self.cost_usd is not None:
            return self.cost_usd, False
        key = (self.model, self.usage)
        if self._estimate[0] != key:
            self._estimate = (key, estimate_cost(self.model, self.usage))
        return self._estimate[1], True

    def waiting(self) -> str | None:
        """What the run is waiting on right now, in a few words."""
        if self.state == "queued":
            where = f" (position {self.queue_position})" if self.queue_position else ""
            return f"waiting for a slot{where}"
        if self.state == "starting":
            return "starting"
        if self.state != "running":
            return None
        if self.asking:
            return f"waiting for your approval of {list(self.asking.values())[-1]}"
        if self.running:
            labels = list(self.running.values())
            more = f" and {len(labels) - 1} more" if len(labels) > 1 else ""
            return f"running {labels[-1]}{more}"
        return "the model is writing" if self.streaming else "waiting on the model"

    def who(self) -> str:
        return " · ".join(p for p in (self.butler, self.runtime, self.model) if p)

    def figures(self) -> list[str]:
        """The header's figures, formatted once here for the browser and the terminal."""
        parts = []
        if self.turns is not None and self.max_turns is not None:
            parts.append(f"turn {min(self.turns, self.max_turns)}/{self.max_turns}")
        elif self.turns is not None:
            parts.append(f"{self.turns} turn{'s' if self.turns != 1 else ''}")
        elif self.max_turns is not None and self.live:
            parts.append(f"max {self.max_turns} turns")
        parts.append(tool_count(self.tool_calls, self.failed_tools))
        u = self.usage
        pending = self.live and self.usage_at_end and u == Usage()
        if pending:
            parts.append("tokens at the end")
        elif self.usage_known or not self.live:
            parts.append(f"{u.input_tokens:,} in / {u.output_tokens:,} out tokens")
            if u.cache_read_tokens or u.cache_write_tokens:
                parts.append(f"cache {u.cache_read_tokens:,} read / {u.cache_write_tokens:,} write")
        cost, estimated = self.cost()
        if cost is not None and not pending:
            parts.append(f"{'≈' if estimated and self.live else ''}${cost:.4f}")
        if self.refusals.count:
            parts.append(blocked_count(self.refusals.count))
        return parts

    def line(self) -> str:
        """The header as one line of text (the terminal's status line)."""
        elapsed = format_duration(self.elapsed_ms())
        head = f"{self.mark} {self.state}"
        parts = [head, self.waiting() or "", *self.figures(), elapsed]
        return " · ".join(p for p in parts if p)

    def as_dict(self) -> dict[str, Any]:
        cost, estimated = self.cost()
        elapsed = self.elapsed_ms()
        return {
            "state": self.state,
            "mark": self.mark,
            "live": self.live,
            "who": self.who(),
            "session_id": self.session_id,
            "butler": self.butler,
            "runtime": self.runtime,
            "model": self.model,
            "waiting": self.waiting(),
            "figures": self.figures(),
            "queue_position": self.queue_position,
            "tool_calls": self.tool_calls,
            "failed_tools": self.failed_tools,
            "turns": self.turns,
            "max_turns": self.max_turns,
            "input_tokens": self.usage.input_tokens,
            "output_tokens": self.usage.output_tokens,
            "cache_read_tokens": self.usage.cache_read_tokens,
            "cache_write_tokens": self.usage.cache_write_tokens,
            "cost_usd": cost,
            "cost_estimated": estimated and cost is not None,
            "error": self.error,
            "error_kind": self.error_kind,
            "elapsed_s": None if elapsed is None else round(elapsed / 1000, 2),
            "clock": self.started is not None and self.live,
            "timing": self.timing,
            "network_denied": self.refusals.count,
            "hint": self.hint,
        }


class ViewState:
    """Bounded, ordered state of one run's view plus the changes not yet sent."""

    def __init__(self, max_items: int = MAX_ITEMS, max_text: int = MAX_TEXT_CHARS) -> None:
        self.max_items = max_items
        self.max_text = max_text
        self.status = Status()
        self.items: OrderedDict[str, dict[str, Any]] = OrderedDict()
        self.dropped = 0
        self.result: SpawnerResult | None = None
        self.seq = 0
        self._segments: dict[str, _Segment] = {}
        # Tool rows are formatted when sent, not per event: the latest call of each id,
        # and what formatting it once costs (the input never changes).
        self._calls: dict[str, ToolCall] = {}
        self._stale: set[str] = set()
        self._inputs: dict[str, str] = {}
        self._outputs: dict[str, str] = {}
        self._open: str | None = None
        self._text_chars = 0
        self._segment_count = 0
        self._pending: dict[str, None] = {}
        self._dirty_segments: set[str] = set()
        self._status_dirty = False
        # Questions are answered in the cell's input box, not by the card's buttons (a
        # foreground %%spawn: the kernel reads no widget message until the cell ends).
        self.answers_below = False

    @classmethod
    def from_result(cls, result: SpawnerResult) -> ViewState:
        """A finished view of a result (its tool calls, then its output)."""
        state = cls()
        status = state.status
        status.session_id, status.butler = result.session_id, result.butler
        status.runtime, status.model = result.runtime, result.model
        for call in result.tool_calls:
            state.apply(ToolCallStarted(result.session_id or "", call))
        state.finish(result)
        return state

    # -- folding events ------------------------------------------------------------

    def apply(self, event: RunEvent) -> None:
        status = self.status
        if isinstance(event, TextDelta):
            self._text(event.text, closed=False)
            status.streaming = True
        elif isinstance(event, AssistantText):
            self._text(event.text, closed=True)
            status.streaming = False
        elif isinstance(event, ToolCallStarted | ToolCallFinished):
            self._tool(event.call)
        elif isinstance(event, UsageUpdate):
            # An update that only names the model (zero tokens, no turn) shows no zeros.
            counted = event.usage != Usage() or event.turns is not None
            status.usage, status.usage_known = event.usage, status.usage_known or counted
            status.usage_at_end = status.usage_at_end or event.at_end
            status.cost_usd = event.cost_usd if event.cost_usd is not None else status.cost_usd
            status.turns = event.turns if event.turns is not None else status.turns
            status.model = event.model or status.model
        elif isinstance(event, Timing):
            status.timing = timing_line(event) or status.timing
        elif isinstance(event, NetworkDenied):
            status.refusals.add(event)
            self._close_text()
            self._put({"id": f"blocked-{status.refusals.count}", "kind": "notice",
                       "text": network_denied_line(event)})  # fmt: skip
            self._trim()
        elif isinstance(event, PermissionAsked):
            status.asking[event.call.id] = tool_label(event.call)
            self._close_text()
            self._put(approval_item(event.call, below=self.answers_below))
            self._trim()
        elif isinstance(event, PermissionDecided):
            status.asking.pop(event.call.id, None)
            self._put(approval_item(event.call, event.answer))
            self._trim()
        elif isinstance(event, Queued):
            status.state, status.queue_position = "queued", event.position
            status.session_id, status.butler = event.session_id, event.butler
        elif isinstance(event, Started):
            status.state, status.queue_position = "running", None
            status.session_id, status.butler = event.session_id, event.butler
            status.runtime, status.model = event.runtime, event.model or status.model
            status.max_turns, status.started = event.max_turns, time.monotonic()
        elif isinstance(event, Finished):
            self.finish(event.result)
            return
        self._status_dirty = True

    def finish(self, result: SpawnerResult) -> None:
        status = self.status
        self.result = result
        self._close_text()
        status.state, status.streaming, status.running = result.status, False, {}
        status.asking = {}
        status.error, status.error_kind = result.error, result.error_kind
        status.session_id = result.session_id or status.session_id
        status.model = result.model or status.model
        status.usage, status.usage_known = result.usage, True
        status.cost_usd = result.cost_usd
        status.turns = result.num_turns if result.num_turns is not None else status.turns
        status.duration_ms = result.duration_ms
        # A view of a record has the count only (the events, and so the hosts, are gone).
        status.refusals.count = max(status.refusals.count, result.network_denied)
        status.hint = status.refusals.hint()
        for call in result.tool_calls:
            seen = self._calls.get(call.id)
            if seen is None or seen.status != call.status or seen.output is None:
                self._tool(call)
        if result.output.strip() and not self._segments and not self._segment_count:
            self._text(result.output, closed=True)
        self._status_dirty = True

    def _text(self, text: str, closed: bool) -> None:
        if self._open is None:
            if not text:
                return
            self._segment_count += 1
            key = f"text-{self._segment_count}"
            self._open = key
            self._segments[key] = _Segment()
            self._put({"id": key, "kind": "text", "html": ""})
        key = self._open
        segment = self._segments[key]
        before = segment.chars
        if closed:
            # The finished block is authoritative (deltas may have been partial).
            segment.set(text if text or not segment.chars else segment.source)
            segment.closed = True
            self._open = None
        else:
            segment.append(text)
        self._text_chars += segment.chars - before
        self._dirty_segments.add(key)
        self._trim()

    def _close_text(self) -> None:
        if self._open is not None:
            self._segments[self._open].closed = True
            self._dirty_segments.add(self._open)
            self._open = None

    def _tool(self, call: ToolCall) -> None:
        status = self.status
        self._close_text()
        status.streaming = False
        old = self._calls.get(call.id)
        if old is None:
            status.tool_calls += 1
            self.items[call.id] = {"id": call.id, "kind": "tool"}  # its place; filled when sent
        elif old.status == "error":
            status.failed_tools -= 1
        if call.status == "error":
            status.failed_tools += 1
        if call.output is None:
            status.running[call.id] = tool_label(call)
        else:
            status.running.pop(call.id, None)
            self._outputs.pop(call.id, None)
        self._calls[call.id] = call
        self._stale.add(call.id)
        self._pending[call.id] = None
        self._status_dirty = True
        self._trim()

    def _put(self, item: dict[str, Any]) -> None:
        self.items[item["id"]] = item
        self._pending[item["id"]] = None

    def _format_tools(self) -> None:
        for key in self._stale:
            call = self._calls.get(key)
            if call is None:
                continue
            if key not in self._inputs:
                self._inputs[key] = input_text(call)
            self.items[key] = tool_item(call, self.full_output(key), self._inputs[key])
        self._stale.clear()

    def _trim(self) -> None:
        while len(self.items) > self.max_items or (
            self._text_chars > self.max_text and len(self.items) > 1
        ):
            key, _ = self.items.popitem(last=False)
            segment = self._segments.pop(key, None)
            if segment is not None:
                self._text_chars -= segment.chars
                if self._open == key:
                    self._open = None
            for kept in (self._calls, self._inputs, self._outputs, self._pending):
                kept.pop(key, None)
            self._stale.discard(key)
            self._dirty_segments.discard(key)
            self.dropped += 1

    # -- what to send --------------------------------------------------------------

    def full_output(self, call_id: str) -> str | None:
        """A tool call's whole output (as recorded, up to the result's limit)."""
        if call_id not in self._outputs:
            call = self._calls.get(call_id)
            if call is None or call.output is None:
                return None
            self._outputs[call_id] = pretty_output(call.output)
        return self._outputs[call_id]

    @property
    def dirty(self) -> bool:
        return bool(self._pending or self._dirty_segments or self._status_dirty)

    def _render_text(self, now: float) -> None:
        for key in list(self._dirty_segments):
            segment = self._segments.get(key)
            if segment is None or not segment.render(now):
                continue
            self._dirty_segments.discard(key)
            self._put({"id": key, "kind": "text", "html": segment.html})

    def take_batch(self) -> dict[str, Any] | None:
        """The changes since the last batch, or None when there are none."""
        if not self.dirty:
            return None
        self._render_text(time.monotonic())
        if not (self._pending or self._status_dirty):
            return None  # only a long segment waiting for its next rendering
        self._format_tools()
        self.seq += 1
        batch = {
            "kind": "batch",
            "seq": self.seq,
            "items": [self.items[key] for key in self._pending],
            "header": self.status.as_dict(),
            "dropped": self.dropped,
        }
        self._pending.clear()
        self._status_dirty = False
        return batch

    def snapshot(self, final: bool = False) -> dict[str, Any]:
        """What a newly opened view needs (bounded), tagged with the batch seq.

        While the run goes on it is re-sent about once a second, so tool outputs
        are cut short (the view fetches them whole on demand); the ``final`` one is
        sent once, and a view re-rendered after the run (the display is replaced
        then) shows the rows as the live view did.
        """
        self._format_tools()
        items = list(self.items.values())[-SNAPSHOT_ITEMS:]
        return {
            "seq": self.seq,
            "items": items if final else [_shortened(item) for item in items],
            "header": self.status.as_dict(),
            "dropped": self.dropped + max(0, len(self.items) - SNAPSHOT_ITEMS),
        }

    def transcript(self) -> list[dict[str, Any]]:
        """Every kept item, text rendered, for the static snapshot."""
        self._format_tools()
        now = time.monotonic()
        for key, segment in self._segments.items():
            if segment.html == "" or key in self._dirty_segments:
                segment.closed = True
                segment.render(now)
                self.items[key] = {"id": key, "kind": "text", "html": segment.html}
        return list(self.items.values())

    def segment_source(self, key: str) -> str:
        segment = self._segments.get(key)
        return segment.source if segment is not None else ""


def _shortened(item: dict[str, Any]) -> dict[str, Any]:
    if item["kind"] != "tool":
        return item
    short = dict(item)
    short["diffs"] = [_short_diff(diff) for diff in item.get("diffs") or []]
    for key in ("input", "output"):
        value = short.get(key)
        if isinstance(value, str) and len(value) > SNAPSHOT_PREVIEW_CHARS:
            short[key] = value[:SNAPSHOT_PREVIEW_CHARS]
            if key == "output":
                short["output_more"] = item["output_chars"] - SNAPSHOT_PREVIEW_CHARS
    return short


def _short_diff(diff: dict[str, Any]) -> dict[str, Any]:
    lines = diff["lines"]
    if len(lines) <= SNAPSHOT_DIFF_LINES:
        return diff
    more = diff["more"] + len(lines) - SNAPSHOT_DIFF_LINES
    return {**diff, "lines": lines[:SNAPSHOT_DIFF_LINES], "more": more}
