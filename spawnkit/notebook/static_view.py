"""A run's view as fixed HTML and text: what a saved notebook keeps, and how results display.

The live view (``run_view.js``) builds its DOM from the same items and
header; this module writes the same structure as a string, with the same
stylesheet inlined, so a notebook reopened without its kernel (or read on a
site that renders notebooks) shows the transcript as it was when the run
ended. Every value is escaped except the assistant's text, which is HTML that
:mod:`~spawnkit.notebook.markdown` made with raw HTML escaped.
"""

from __future__ import annotations

import html
import uuid
from pathlib import Path
from typing import Any

from .view_state import ViewState, format_duration

_CSS = (Path(__file__).parent / "run_view.css").read_text(encoding="utf-8")


def _e(value: object) -> str:
    return html.escape(str(value), quote=True)


def header_html(header: dict[str, Any], elapsed: str) -> str:
    figures = " · ".join(_e(f) for f in header["figures"])
    who = f'<span class="sk-who">{_e(header["who"])}</span>' if header["who"] else ""
    return (
        f'<div class="sk-head" data-state="{_e(header["state"])}">'
        f'<span class="sk-mark">{_e(header["mark"])}</span> '
        f'<span class="sk-state">{_e(header["state"])}</span>{who}'
        f'<span class="sk-figures">{figures}</span>'
        f'<span class="sk-elapsed">{_e(elapsed)}</span></div>'
    )


def tool_html(item: dict[str, Any]) -> str:
    result = item["result"] if item["result"] is not None else "running…"
    output = ""
    if item["output"] is not None:
        lines = item["output_lines"]
        more = item["output_more"]
        note = f' <span class="sk-more">… {more:,} more characters not shown</span>' if more else ""
        output = (
            f'<div class="sk-section">output · {lines} line{"s" if lines != 1 else ""}</div>'
            f'<pre class="sk-output">{_e(item["output"]) or "(no output)"}</pre>{note}'
        )
    mark = {"ok": "✓", "error": "✗"}.get(item["status"], "…")
    diffs = item.get("diffs") or []
    # An edit shows its diff, open, instead of its input as JSON.
    shown = (
        "".join(diff_html(diff) for diff in diffs)
        if diffs
        else f'<div class="sk-section">input</div><pre class="sk-input">{_e(item["input"])}</pre>'
    )
    return (
        f'<details class="sk-item sk-tool" data-status="{_e(item["status"])}"'
        f"{' open' if diffs else ''}><summary>"
        f'<span class="sk-mark">{mark}</span><span class="sk-label">{_e(item["label"])}</span>'
        f'<span class="sk-summary">{_e(item["summary"])}</span>'
        f'<span class="sk-dur">{_e(item["duration"])}</span>'
        f'<span class="sk-result">{_e(result)}</span></summary>'
        f'<div class="sk-body">{shown}{output}</div></details>'
    )


# A diff line's kind, from its first character, as run_view.js names it too.
_LINE_KINDS = {"+": "add", "-": "del", "@": "hunk"}


def diff_html(diff: dict[str, Any]) -> str:
    """One file's diff (a :meth:`FileDiff.to_dict`): ``path +A -R``, its note, its lines."""
    counts = (
        f' <span class="sk-add">+{diff["added"]}</span>'
        f' <span class="sk-del">-{diff["removed"]}</span>'
        if diff["lines"]
        else ""
    )
    note = f' <span class="sk-diff-note">{_e(diff["note"])}</span>' if diff["note"] else ""
    lines = "".join(
        f'<div class="sk-dl" data-kind="{_LINE_KINDS.get(line[:1], "ctx")}">{_e(line) or " "}</div>'
        for line in diff["lines"]
    )
    more = diff["more"]
    rest = (
        f'<div class="sk-more">… {more:,} more line{"s" if more != 1 else ""}</div>' if more else ""
    )
    body = f'<div class="sk-diff-lines">{lines}</div>' if lines else ""
    return (
        f'<div class="sk-diff"><div class="sk-diff-head"><span class="sk-diff-path">'
        f"{_e(diff['path'])}</span>{counts}{note}</div>{body}{rest}</div>"
    )


def static_html(state: ViewState) -> str:
    """The whole view as one HTML string with its stylesheet."""
    header = state.status.as_dict()
    tools = ' data-tools="1"' if state.status.tool_calls else ""
    parts = [
        f'<div class="spawnkit-run sk-static" data-failed-tools="{state.status.failed_tools}"'
        f"{tools}><style>{_CSS}</style>"
    ]
    parts.append(header_html(header, format_duration(state.status.elapsed_ms())))
    if header["timing"]:
        parts.append(f'<div class="sk-timing">{_e(header["timing"])}</div>')
    if state.dropped:
        parts.append(f'<div class="sk-hidden">… {state.dropped} earlier items not shown</div>')
    if state.status.failed_tools:
        # "failures only" without a script (a saved view runs none): a checkbox beside
        # the transcript, whose checked state hides the rest through the stylesheet.
        box = f"sk-only-failed-{uuid.uuid4().hex[:12]}"
        parts.append(
            f'<div class="sk-toolbar"><input type="checkbox" class="sk-only-failed" id="{box}">'
            f'<label class="sk-filter" for="{box}"> failures only</label></div>'
        )
    # One inner block in a column-reverse box: the box opens scrolled to its end, where
    # the answer is (a saved view runs no script that could scroll it).
    parts.append('<div class="sk-transcript"><div class="sk-items">')
    for item in state.transcript():
        if item["kind"] == "text":
            parts.append(f'<div class="sk-item sk-text jp-RenderedHTMLCommon">{item["html"]}</div>')
        elif item["kind"] == "notice":
            parts.append(f'<div class="sk-item sk-notice">{_e(item["text"])}</div>')
        elif item["kind"] == "approval":
            parts.append(
                f'<div class="sk-item sk-approval" data-state="{_e(item["state"])}">'
                f"{_e(item['text'])}</div>"
            )
        else:
            parts.append(tool_html(item))
    parts.append("</div></div>")
    if header["hint"]:
        parts.append(f'<div class="sk-hint">{_e(header["hint"])}</div>')
    if header["error"]:
        parts.append(f'<div class="sk-error">{_e(header["error"])}</div>')
    if header["session_id"]:
        parts.append(f'<div class="sk-foot">session {_e(header["session_id"])}</div>')
    parts.append("</div>")
    return "".join(parts)


def static_text(state: ViewState, width: int = 160) -> str:
    """The whole view as plain text, in order (saved notebooks, text-only frontends)."""
    status = state.status
    lines = [status.line()]
    if status.timing:
        lines.append(f"  {status.timing}")
    for item in state.transcript():
        if item["kind"] == "text":
            source = state.segment_source(item["id"]).strip()
            lines.extend(f"  {line}" for line in source.splitlines())
        elif item["kind"] == "notice":
            lines.append(f"  ⛔ {item['text']}"[:width])
        elif item["kind"] == "approval":
            lines.append(f"  ? {item['text']}"[:width])
        else:
            mark = {"ok": "✓", "error": "✗"}.get(item["status"], "…")
            diffs = item.get("diffs") or []
            # An edit's diff headers name its files and counts; its summary would repeat them.
            summary = f"  {item['summary']}" if item["summary"] and not diffs else ""
            lines.append(f"  {mark} {item['label']}{summary}"[:width])
            lines.extend(diff_text(diffs, width))
            if item["result"] is not None:
                lines.append(f"      {item['duration']}  {item['result']}"[:width])
    if status.hint:
        lines.append(status.hint)
    if status.error:
        lines.append(f"error: {status.error}")
    if status.session_id:
        lines.append(f"session {status.session_id}")
    return "\n".join(lines)


def diff_text(diffs: list[dict[str, Any]], width: int = 160) -> list[str]:
    """Diffs as indented plain lines: header, note, ``+``/``-`` lines, what is left out."""
    lines: list[str] = []
    for diff in diffs:
        note = f"  ({diff['note']})" if diff["note"] else ""
        lines.append(f"      {diff['header']}{note}"[:width])
        lines.extend(f"      {line}"[:width] for line in diff["lines"])
        if diff["more"]:
            lines.append(f"      … {diff['more']} more line{'s' if diff['more'] != 1 else ''}")
    return lines
