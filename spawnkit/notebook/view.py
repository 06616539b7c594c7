"""The live view of a run in a notebook: an anywidget fed by coalesced batches.

Events arrive on spawnkit's background loop and are folded into a
:class:`~spawnkit.notebook.view_state.ViewState` in constant time. A flush,
scheduled at most once per FLUSH_INTERVAL_S, sends the changes since the last
one as a single custom message; the browser places them in the DOM. A bounded
``snapshot`` trait (refreshed at most once a second and when the run ends) lets
a view opened later catch up. The browser asks for a cut tool output in full
with a ``full_output`` message.

The view is also the run's approver (:meth:`RunView.approve`, for
``[butler.permissions] ask``): the question arrives as a ``PermissionAsked`` event and
shows as a card with Allow and Deny; the button's ``permission`` message answers it. The
approver waits on the run's loop; the answer comes on the kernel's thread and is handed
over with ``call_soon_threadsafe``.

Its Stop button cancels this run only, on the path Ctrl-C and ``%spawn_cancel`` take
(a ``cancelled`` record, nothing left behind). While a cell blocks on the run
(``foreground``), the kernel reads no widget message, so the button interrupts the
kernel instead, whose one executing cell is this run's wait (see
:func:`spawnkit.notebook.runner.wait`); otherwise (a background run, the dashboard,
``map``) it sends a ``stop`` message that :attr:`RunView.stopper` answers.

Next to the widget, the display carries ``text/html`` and ``text/plain`` for
frontends without the widget (a notebook reopened without its kernel, a
notebook rendered on a website). Until the run ends they say so in fixed
words; once it has ended, the display is the static transcript alone (no widget
view, whose model a reopened notebook would not find), and the frontend replaces the
live display with it (``update_display``), so a saved notebook keeps the run as it
ended.
"""

from __future__ import annotations

import asyncio
import html
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anywidget
import traitlets

from ..events import Finished, RunEvent
from ..permissions import PermissionDecision, PermissionRequest
from .static_view import static_html, static_text
from .view_state import FLUSH_INTERVAL_S, ViewState

SNAPSHOT_INTERVAL_S = 1.0
_HERE = Path(__file__).parent
WIDGET_MIME = "application/vnd.jupyter.widget-view+json"

# schedule(delay_s, callback): run callback later on the thread that owns the view.
Scheduler = Callable[[float, Callable[[], None]], object]


class RunView(anywidget.AnyWidget):
    """Shows one run live: header, then assistant text and tool calls in order."""

    _esm = _HERE / "run_view.js"
    _css = _HERE / "run_view.css"
    snapshot = traitlets.Dict().tag(sync=True)
    # The turns this run continues (HTML, collapsed), shown above its own.
    earlier = traitlets.Unicode("").tag(sync=True)
    # True while a cell blocks on this run: its Stop button interrupts the kernel.
    foreground = traitlets.Bool(False).tag(sync=True)

    # What the display holds for viewers without a widget manager while the run
    # goes on. Fixed text on purpose: the view is displayed before the run's
    # events arrive, so anything about the run here would be a race.
    FALLBACK_TEXT = "spawnkit run view: the run is in progress"

    def __init__(self, schedule: Scheduler | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.state = ViewState()
        self.messages_sent = 0
        self._schedule = schedule
        self._flush_pending = False
        self._last_snapshot = 0.0
        self._lock = threading.Lock()
        self.on_finish: list[Callable[[RunView], None]] = []
        # Questions waiting for the browser's answer: call id -> (the run's loop, its future).
        self._questions: dict[str, tuple[asyncio.AbstractEventLoop, asyncio.Future[bool]]] = {}
        self._put_below: set[str] = set()  # questions already put in the cell's input box
        # Cancels the run (from the kernel's thread): the Stop button's message calls it.
        self.stopper: Callable[[], object] | None = None
        self.snapshot = self.state.snapshot()
        self.on_msg(self._on_frontend_message)

    def handle(self, event: RunEvent) -> None:
        """An event listener: fold the event and make sure a flush is coming."""
        with self._lock:
            self.state.apply(event)
            finished = isinstance(event, Finished)
            if finished:
                self._flush_locked(final=True)
            elif not self._flush_pending:
                self._flush_pending = True
                if self._schedule is not None:
                    self._schedule(FLUSH_INTERVAL_S, self.flush)
        if finished:
            for callback in self.on_finish:
                callback(self)

    __call__ = handle

    @property
    def finished(self) -> bool:
        return self.state.result is not None

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
            self.snapshot = self.state.snapshot(final=final)
            self.messages_sent += 1

    async def approve(self, request: PermissionRequest) -> PermissionDecision:
        """The run's approver: wait for the Allow or Deny of the card its question shows."""
        loop = asyncio.get_running_loop()
        answer: asyncio.Future[bool] = loop.create_future()
        with self._lock:
            self._questions[request.call.id] = (loop, answer)
        try:
            allowed = await answer
        finally:
            with self._lock:
                self._questions.pop(request.call.id, None)
        if allowed:
            return PermissionDecision(allowed=True, by="notebook")
        return PermissionDecision(
            allowed=False, by="notebook", reason="the person at the notebook denied this tool call"
        )

    def answer_below(self) -> None:
        """From now on, questions are answered in the cell's input box (see
        :func:`spawnkit.notebook.runner.wait`): the card says so and shows no buttons."""
        with self._lock:
            self.state.answers_below = True

    def unasked_below(self) -> tuple[str, str] | None:
        """A question waiting for an answer not yet put in the cell's input box: its call
        id and how to put it, marked as put."""
        with self._lock:
            for call_id in self._questions:
                if call_id not in self._put_below:
                    self._put_below.add(call_id)
                    card = self.state.items.get(f"ask-{call_id}", {})
                    label = card.get("label", "a tool")
                    summary = card.get("summary") or ""
                    return call_id, f"Allow {label}{f' ({summary})' if summary else ''}? [y/N] "
        return None

    def answer(self, call_id: str, allowed: bool) -> bool:
        """Answer the question about ``call_id`` (from any thread); False if none waits."""
        with self._lock:
            waiting = self._questions.get(call_id)
        if waiting is None:
            return False
        loop, future = waiting

        def settle() -> None:
            if not future.done():
                future.set_result(allowed)

        loop.call_soon_threadsafe(settle)
        return True

    def _on_frontend_message(self, _: Any, content: Any, buffers: Any) -> None:
        if not isinstance(content, dict):
            return
        if content.get("kind") == "permission" and isinstance(content.get("allowed"), bool):
            self.answer(str(content.get("id")), content["allowed"])
        elif content.get("kind") == "stop":
            self.stop()
        elif content.get("kind") == "full_output":
            call_id = str(content.get("id"))
            with self._lock:
                text = self.state.full_output(call_id)
            self.send({"kind": "full_output", "id": call_id, "text": text})

    def stop(self) -> bool:
        """Cancel the run this view shows (the Stop button); False if it cannot be."""
        if self.stopper is None or self.finished:
            return False
        self.stopper()
        return True

    def text(self) -> str:
        with self._lock:
            return static_text(self.state)

    def static_html(self) -> str:
        with self._lock:
            return static_html(self.state)

    def _repr_mimebundle_(self, **kwargs: Any) -> tuple[dict[str, Any], dict[str, Any]] | None:
        if self.finished:
            # The static transcript alone: JupyterLab prefers a widget view to any HTML and,
            # reopening a notebook saved without widget state (its default), shows "Error
            # displaying widget: model not found" in its place.
            return {"text/plain": self.text(), "text/html": self.earlier + self.static_html()}, {}
        bundle = super()._repr_mimebundle_(**kwargs)
        if bundle is None:
            return None
        data, metadata = bundle
        data["text/plain"] = self.FALLBACK_TEXT
        data["text/html"] = f"<p><i>{html.escape(self.FALLBACK_TEXT)}</i></p>"
        return data, metadata
