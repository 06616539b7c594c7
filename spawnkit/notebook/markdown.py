"""The assistant's Markdown as safe HTML, for the run view and the static snapshot.

Raw HTML in the model's text is escaped, not rendered (the text is untrusted:
it may quote anything it read), and links with script schemes are dropped by
mistune's URL check. Tables and strikethrough follow GitHub's flavour, which
is what agents write.
"""

from __future__ import annotations

import html
import re
from typing import cast

import mistune

_RENDER = mistune.create_markdown(escape=True, plugins=["table", "strikethrough"])
# One line with no character Markdown gives a meaning to: a paragraph, without the
# parser (most short narration between tool calls is such a line).
_PLAIN = re.compile(r"[^\\`*_#\[\]|<>&!~=+\-\n:/]+")
_LIST_START = re.compile(r"\d+[.)]\s")


def markdown_html(text: str) -> str:
    """``text`` (Markdown) rendered as HTML with every raw tag escaped."""
    line = text.strip()
    indented = text.startswith(("    ", "\t"))
    if line and not indented and _PLAIN.fullmatch(line) and not _LIST_START.match(line):
        return f"<p>{html.escape(line)}</p>\n"
    return cast(str, _RENDER(text))
