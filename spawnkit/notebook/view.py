"""The live view of a run in a notebook: an anywidget fed by coalesced batches.

Events arrive on spawnkit's background loop and are folded into a
:class:`~spawnkit.notebook.view_state.ViewState` in constant time. A flush,
scheduled at most once per FLUSH_INTERVAL_S, sends the changes since the last
one as a single custom message; the browser appends them to the DOM. A bounded
``snapshot`` trait (refreshed at most once a second and when the run ends) lets
a view opened later catch up. Frontends without widgets get the same state as
text through the display's ``text/plain`` and ``text/html``.
"""

from __future__ import annotations

import html
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anywidget
import traitlets

from ..events import Finished, RunEvent
from .view_state import FLUSH_INTERVAL_S, ViewState

SNAPSHOT_INTERVAL_S = 1.0
_HERE = Path(__file__).parent

# schedule(delay_s, callback): run callback later on the thread that owns the view.
Scheduler = Callable[[float, Callable[[], None]], object]


class RunView(anywidget.AnyWidget):
    """Shows one run live: status line, tool-call rows, assistant text."""

    _esm = _HERE / "run_view.js"
    _css = _HERE / "run_view.css"
    snapshot = traitlets.Dict().tag(sync=True)

    def __init__(self, schedule: Scheduler | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.state = ViewState()
        self.messages_sent = 0
        self._schedule = schedule
        self._flush_pending = False
        self._last_snapshot = 0.0
        self._lock = threading.Lock()
        self.on_finish: Callable[[RunView], None] | None = None
        self.snapshot = self.state.snapshot()

    def handle(self, event: RunEvent) -> None:
        """An event listener: fold the event and make sure a flush is coming."""
        with self._lock:
            self.state.apply(event)
            if isinstance(event, Finished):
                self._flush_locked(final=True)
                finished = True
            else:
                finished = False
                if not self._flush_pending:
                    self._flush_pending = True
                    if self._schedule is not None:
                        self._schedule(FLUSH_INTERVAL_S, self.flush)
        if finished and self.on_finish is not None:
            self.on_finish(self)

    __call__ = handle

    def flush(self) -> None:
        """Send what changed since the last flush (called by the scheduler or a poller)."""
        with self._lock:
            self._flush_locked(final=False)

    def _flush_locked(self, final: bool) -> None:
        self._flush_pending = False
        batch = self.state.take_batch()
        if batch is not None:
            self.send(batch)
            self.messages_sent += 1
        now = time.monotonic()
        if final or now - self._last_snapshot >= SNAPSHOT_INTERVAL_S:
            self._last_snapshot = now
            self.snapshot = self.state.snapshot()
            self.messages_sent += 1

    def text(self) -> str:
        return self.state.render_text()

    def fallback_html(self) -> str:
        return f"<pre>{html.escape(self.text())}</pre>"

    # What a notebook saves next to the widget, for viewers without a widget
    # manager. It is fixed text on purpose: the view is displayed before the
    # run's events arrive, so anything about the run here would be a race (and
    # would make saved notebooks differ from run to run). The run itself is in
    # the cell's result, or in the handle's status.
    FALLBACK_TEXT = "spawnkit live run view (shown live in JupyterLab, Notebook 7, VS Code, Voila)"

    def _repr_mimebundle_(self, **kwargs: Any) -> tuple[dict[str, Any], dict[str, Any]] | None:
        bundle = super()._repr_mimebundle_(**kwargs)
        if bundle is None:
            return None
        data, metadata = bundle
        data["text/plain"] = self.FALLBACK_TEXT
        data["text/html"] = f"<p><i>{html.escape(self.FALLBACK_TEXT)}</i></p>"
        return data, metadata
