"""A prompt field and its button that send the text they show: an anywidget.

An ipywidgets ``Textarea`` beside a ``Button`` loses that race. The textarea's value
reaches the kernel through state syncs, which ipywidgets throttles (one in flight, later
ones held back until the kernel answers), while a click is a custom message, sent at once.
Typed quickly while the kernel is busy, a prompt could be triggered with the text the
kernel had last heard of (a prefix of it, or the one before). Here the click carries the
text: ``on_submit`` callbacks get exactly what the field showed.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import anywidget
import traitlets
from ipywidgets import CallbackDispatcher

_HERE = Path(__file__).parent


class PromptBox(anywidget.AnyWidget):
    """A text field (``multiline``: Ctrl+Enter submits; otherwise Enter) and a button.

    ``value`` follows what is typed (as any widget's value does); a submit calls each
    ``on_submit`` callback with the text of the field at that moment. ``clear_on_submit``
    empties the field once the kernel took the text (a chat's entry); a submit refused
    (``disabled`` in the kernel before the browser heard of it) keeps it.
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
        # As a Button's clicks: every callback is called, and one that raises is shown as
        # IPython shows a traceback (logged outside IPython).
        self._submitted = CallbackDispatcher()
        self.on_msg(self._message)

    def on_submit(self, callback: Callable[[str], object], remove: bool = False) -> None:
        """Call ``callback(text)`` on each submit, with the text the field showed (or stop
        calling it, with ``remove``)."""
        self._submitted.register_callback(callback, remove=remove)

    def submit(self, text: str | None = None) -> None:
        """Submit ``text`` (by default the current ``value``), as the button does."""
        self._submitted(self.value if text is None else text)

    def _message(self, _: object, content: Any, buffers: object) -> None:
        if not isinstance(content, dict) or content.get("event") != "submit":
            return
        text = content.get("text")
        if not isinstance(text, str) or self.disabled:
            return  # refused: the text stays in the field
        if self.clear_on_submit:
            self.accept(text)
        self.submit(text)

    def accept(self, text: str) -> None:
        """Say the kernel took ``text``: the browser empties the field if it still shows it
        (typing may have gone on). A refused or lost submit leaves the text there."""
        self.send({"event": "accepted", "text": text})
