"""The assistant's Markdown as safe HTML, for the run view and the static snapshot.

Raw HTML in the model's text is escaped, not rendered (the text is untrusted:
it may quote anything it read), and links with script schemes are dropped by
mistune's URL check. Tables and strikethrough follow GitHub's flavour, which
is what agents write.
"""

from __future__ import annotations

from typing import cast

import mistune

_RENDER = mistune.create_markdown(escape=True, plugins=["table", "strikethrough"])


def markdown_html(text: str) -> str:
    """``text`` (Markdown) rendered as HTML with every raw tag escaped."""
    return cast(str, _RENDER(text))
