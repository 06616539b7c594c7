"""A prompt field and its button that send the text they show: an anywidget.

An ipywidgets ``Textarea`` beside a ``Button`` loses that race. The textarea's value
reaches the kernel through state syncs, which ipywidgets throttles (one in flight, later
ones held back until the kernel answers), while a click is a custom message, sent at once.
Typed quickly while the kernel is busy, a prompt could be triggered with the text the
kernel had last heard of (a prefix of it, or the one before). Here the click carries the
text: ``on_submit`` callbacks get exactly what the field showed.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anywidget
import traitlets

_HERE = Path(__file__).parent
logger = logging.getLogger(__name__)


class PromptBox(anywidget.AnyWidget):
    """A text field (``multiline``: Ctrl+Enter submits; otherwise Enter) and a button.

    ``value`` follows what is typed (as any widget's value does); a submit calls each
    ``on_submit`` callback with the text of the field at that moment. ``clear_on_submit``
    empties the field in the browser as it submits (a chat's entry).
    """

    _esm = _HERE / "prompt_box.js"
    _css = _HERE / "prompt_box.css"
    value = traitlets.Unicode("").tag(sync=True)
    placeholder = traitlets.Unicode("").tag(sync=True)
    label = traitlets.Unicode("Send").tag(sync=True)
    multiline = traitlets.Bool(True).tag(sync=True)
    clear_on_submit = traitlets.Bool(False).tag(sync=True)
    disabled = traitlets.Bool(False).tag(sync=True)

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._submitted: list[Callable[[str], object]] = []
        self.on_msg(self._message)

    def on_submit(self, callback: Callable[[str], object]) -> None:
        """Call ``callback(text)`` on each submit, with the text the field showed."""
        self._submitted.append(callback)

    def submit(self, text: str | None = None) -> None:
        """Submit ``text`` (by default the current ``value``), as the button does."""
        text = self.value if text is None else text
        for callback in self._submitted:
            try:
                callback(text)
            except Exception:  # one listener's bug must not stop the others
                logger.exception("prompt box callback %r failed", callback)

    def _message(self, _: object, content: Any, buffers: object) -> None:
        if isinstance(content, dict) and content.get("event") == "submit":
            text = content.get("text")
            if isinstance(text, str) and not self.disabled:
                self.submit(text)
