"""Ask mode in notebooks: ``%%ask`` (one question) and the chat widget (a conversation).

Both run the agent through :mod:`spawnkit.ask` on spawnkit's background loop, as
runs of the spawner (``kind="ask"``) shown in the same live view as ``%%spawn``: the
view gets the run's own events, from ``Started`` to ``Finished``. The chat widget
continues its conversation turn by turn (:meth:`Spawner.resume`, each turn a session
of its own linked to the one before); its replay server, if any, stops when the widget
is closed or the kernel exits. Each turn shows once: its run view, whose transcript renders
the answer's Markdown. A message is taken only when the turn before is over (the entry is
disabled meanwhile, and :meth:`ChatWidget.send` refuses it); the Stop button, shown while a
turn runs, cancels it as an interrupt would (the kernel is idle, so a widget message is read).
"""

from __future__ import annotations

import atexit
import concurrent.futures
import contextlib
import html
from collections.abc import AsyncIterator, Iterable
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path

import ipywidgets as w

from ..ask import AskError, AskResult, ask, ask_turn, load_template, render_prompt, resolve_sources
from ..containment.credentials import CredentialStore
from ..containment.sources import Source
from ..replay import ReplayServer, Scenario
from ..serve.service import REPLAY_API_KEY, REPLAY_KEYS
from ..store import SessionStore
from . import display as shown
from .hub import Hub, default_hub
from .loop import Job
from .prompt_box import PromptBox
from .runner import in_kernel, wait_job
from .view import RunView

KEYS = ("ANTHROPIC_API_KEY", "OPENAI_API_KEY", "GEMINI_API_KEY", "GOOGLE_API_KEY")


def agent_env(replaying: bool) -> dict[str, str]:
    """The API keys an ask agent gets: spawnkit's credentials, or the replay key."""
    if replaying:
        return dict.fromkeys(REPLAY_KEYS, REPLAY_API_KEY)
    credentials = CredentialStore(SessionStore())
    return {name: value for name in KEYS if (value := credentials.resolve(name))}


@asynccontextmanager
async def model_endpoint(replay: str | Path | None) -> AsyncIterator[str | None]:
    """The replay server's URL while the block runs, or None for the real model."""
    if replay is None:
        yield None
        return
    async with ReplayServer(Scenario.load(replay)).serve() as url:
        yield url


def ask_cell(
    question: str,
    sources: str | Iterable[str | Source],
    *,
    runtime: str | None = None,
    replay: str | Path | None = None,
    hub: Hub | None = None,
) -> AskResult:
    """``%%ask``: answer ``question`` about ``sources``, shown live; interrupts cancel it."""
    resolve_sources(sources)  # an unknown name fails now, before anything runs
    hub = hub or default_hub()
    view = RunView(schedule=hub.schedule) if in_kernel() else None

    async def run() -> AskResult:
        async with model_endpoint(replay) as url:
            return await ask(
                sources, question, runtime=runtime, base_url=url,
                env=agent_env(replay is not None), on_event=view, store=hub.store,
            )  # fmt: skip

    if view is None:
        return wait_job(hub.loop.submit(run()))
    from IPython.display import display

    board = display(view, display_id=True)  # type: ignore[no-untyped-call]
    view.foreground = True  # the cell waits: the view's Stop interrupts the kernel
    try:
        result = wait_job(hub.loop.submit(run()))
    finally:
        view.foreground = False
        if board is not None:
            board.update(view)  # ended: its static transcript, which a saved notebook keeps
    shown.mark_shown(result)  # the view shows the answer: its Out[n] stays silent
    return result


class ChatWidget(w.VBox):  # type: ignore[misc]
    """A conversation with an agent about sources, one turn per message."""

    def __init__(
        self,
        sources: str | Iterable[str | Source],
        *,
        runtime: str | None = None,
        replay: str | Path | None = None,
        hub: Hub | None = None,
    ) -> None:
        self.sources = resolve_sources(sources)
        self.runtime = runtime
        self.replay = replay
        self.hub = hub or default_hub()
        self.closed = False
        self.turns: list[AskResult] = []
        self._stack = AsyncExitStack()
        self._url: str | None = None
        self.transcript = w.VBox()
        # Enter or Send submits the text the entry showed (see PromptBox), and empties it.
        self.entry = PromptBox(
            placeholder="Ask about " + ", ".join(s.name for s in self.sources), label="Send",
            multiline=False, clear_on_submit=True,
        )  # fmt: skip
        self.entry.on_submit(self.send)
        self.stop_button = w.Button(
            description="Stop", tooltip="stop this turn (recorded as cancelled)",
            layout=w.Layout(display="none", width="auto"),
        )  # fmt: skip
        self.stop_button.on_click(lambda _: self.stop())
        self.status = w.HTML()
        self._turn: Job[AskResult] | None = None
        super().__init__([self.transcript, w.HBox([self.entry, self.stop_button]), self.status])
        atexit.register(self.close)

    @property
    def busy(self) -> bool:
        """A turn is running: no message is taken until it is over (or stopped)."""
        return self._turn is not None and not self._turn.done()

    def stop(self) -> bool:
        """Stop the running turn (the Stop button); False if none runs."""
        if not self.busy or self._turn is None:
            return False
        self._turn.cancel()
        return True

    def send(self, text: str) -> Job[AskResult] | None:
        """Send one message; returns the running turn (awaitable with ``await job``)."""
        text = text.strip()
        if not text or self.closed or self.busy:
            return None
        self.entry.disabled = True
        self.stop_button.layout.display = None
        view = RunView(schedule=self.hub.schedule)
        view.stopper = self.stop  # the view's own Stop button stops the turn too
        # Only a failure is said here: the view's transcript shows the answer, rendered.
        answer = w.HTML()
        self.transcript.children = (
            *self.transcript.children,
            w.HTML(f"<b>you:</b> {html.escape(text)}"),
            view,
            answer,
        )
        first = not self.turns
        prompt = render_prompt(load_template(), text, self.sources) if first else text
        resume = None if first else self.turns[-1].record_id

        async def turn() -> AskResult:
            if self._url is None and self.replay is not None:
                self._url = await self._stack.enter_async_context(model_endpoint(self.replay))
            try:
                result = await ask_turn(
                    self.sources, prompt, runtime=self.runtime, resume=resume,
                    base_url=self._url, env=agent_env(self.replay is not None), on_event=view,
                    store=self.hub.store, trigger_source="chat",
                )  # fmt: skip
            except AskError as exc:
                answer.value = f'<span style="color:#c62828">{html.escape(str(exc))}</span>'
                raise
            self.turns.append(result)  # before the entry opens: the next turn resumes this
            return result

        def over(future: concurrent.futures.Future[AskResult]) -> None:
            if future.cancelled():
                answer.value = "<i>stopped: this turn is left out of the conversation</i>"
            self.stop_button.layout.display = "none"
            self.entry.disabled = self.closed

        self._turn = self.hub.loop.submit(turn())
        self._turn.future.add_done_callback(over)
        return self._turn

    def close(self) -> None:
        """End the conversation: stop its replay server; no later message is sent."""
        atexit.unregister(self.close)
        self.closed = True
        with contextlib.suppress(TimeoutError):
            self.hub.loop.submit(self._stack.aclose()).future.result(10)
        super().close()

    def __repr__(self) -> str:
        names = ", ".join(s.name for s in self.sources)
        return f"ChatWidget(sources=[{names}], turns={len(self.turns)})"


def chat(
    sources: str | Iterable[str | Source],
    *,
    runtime: str | None = None,
    replay: str | Path | None = None,
) -> ChatWidget:
    """A chat widget about ``sources`` (in a terminal, use ``spawnkit chat`` instead)."""
    return ChatWidget(sources, runtime=runtime, replay=replay)
