"""The assistant's Markdown for a terminal: ANSI bold, italics, code, headings and lists.

``spawnkit run`` on a terminal shows an answer the way Claude Code's terminal does, not as
raw ``**`` and `````. The text is parsed with mistune (as the notebook's
:mod:`spawnkit.notebook.markdown` is) into its syntax tree, and each node is written with
the run's :class:`~spawnkit.cli.console.Style` (any :class:`Styler`); a style that is off
(output piped, or ``NO_COLOR``) leaves the text exactly as the model wrote it. Raw HTML is
shown as text.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol, cast

import mistune

_PARSE = mistune.create_markdown(renderer=None, plugins=["table", "strikethrough"])
BULLETS = ("•", "◦", "▪")
Node = dict[str, Any]


class Styler(Protocol):
    """What the renderer asks of a style (``spawnkit.cli.console.Style`` is one)."""

    @property
    def enabled(self) -> bool: ...
    def bold(self, text: str) -> str: ...
    def dim(self, text: str) -> str: ...
    def cyan(self, text: str) -> str: ...
    def italic(self, text: str) -> str: ...
    def underline(self, text: str) -> str: ...
    def strike(self, text: str) -> str: ...


def terminal_markdown(text: str, style: Styler) -> str:
    """``text`` (Markdown) for a terminal; as it is when ``style`` is off."""
    if not style.enabled:
        return text.strip()
    blocks = _blocks(cast(list[Node], _PARSE(text)), style)
    return "\n\n".join(block for block in blocks if block.strip()).rstrip()


def _blocks(nodes: list[Node], style: Styler) -> list[str]:
    return [_block(node, style) for node in nodes if node.get("type") != "blank_line"]


def _block(node: Node, style: Styler) -> str:
    kind = node.get("type")
    children = node.get("children") or []
    if kind == "heading":
        text = _inline(children, style)
        level = int(node.get("attrs", {}).get("level", 1))
        return style.bold(style.underline(text) if level <= 2 else text)
    if kind in ("paragraph", "block_text"):
        return _inline(children, style)
    if kind == "block_code":
        code = str(node.get("raw", "")).rstrip("\n")
        return "\n".join("  " + style.cyan(line) for line in code.split("\n"))
    if kind == "list":
        return _list(node, style)
    if kind == "block_quote":
        inner = "\n\n".join(_blocks(children, style))
        return "\n".join(style.dim("│ ") + line for line in inner.split("\n"))
    if kind == "thematic_break":
        return style.dim("─" * 40)
    if kind == "table":
        return _table(node, style)
    if children:
        return "\n\n".join(_blocks(children, style))
    return str(node.get("raw", ""))


def _list(node: Node, style: Styler) -> str:
    attrs = node.get("attrs", {})
    depth = int(attrs.get("depth", 0))
    ordered = bool(attrs.get("ordered"))
    number = int(attrs.get("start", 1) or 1)
    lines: list[str] = []
    for item in node.get("children") or []:
        marker = f"{number}." if ordered else BULLETS[depth % len(BULLETS)]
        number += 1
        pad = " " * (len(marker) + 1)
        body = "\n".join(_blocks(item.get("children") or [], style)).split("\n")
        lines.append(f"{marker} {body[0]}")
        lines.extend(pad + line if line else line for line in body[1:])
    return "\n".join(lines)


def _table(node: Node, style: Styler) -> str:
    rows: list[list[str]] = []
    for part in node.get("children") or []:
        cells_of: list[Node] = part.get("children") or []
        if part.get("type") == "table_head":
            rows.append([style.bold(_inline(c.get("children") or [], style)) for c in cells_of])
        else:
            for row in cells_of:
                rows.append([_inline(c.get("children") or [], style) for c in row["children"]])
    return "\n".join(style.dim(" │ ").join(row) for row in rows)


def _inline(nodes: list[Node], style: Styler) -> str:
    wrap: dict[str, Callable[[str], str]] = {
        "strong": style.bold,
        "emphasis": style.italic,
        "strikethrough": style.strike,
    }
    out: list[str] = []
    for node in nodes:
        kind = node.get("type")
        children = node.get("children") or []
        if kind in wrap:
            out.append(wrap[kind](_inline(children, style)))
        elif kind == "codespan":
            out.append(style.cyan(str(node.get("raw", ""))))
        elif kind == "link":
            label = _inline(children, style)
            url = str(node.get("attrs", {}).get("url", ""))
            out.append(style.underline(label) + (style.dim(f" ({url})") if url != label else ""))
        elif kind in ("softbreak", "linebreak"):
            out.append("\n")
        elif children:
            out.append(_inline(children, style))
        else:
            out.append(str(node.get("raw", "")))
    return "".join(out)
