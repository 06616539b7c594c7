"""Ask mode in notebooks: ``%%ask`` (one question) and the chat widget (a conversation).

Both run the agent through :mod:`spawnkit.ask` on spawnkit's background loop, as
runs of the spawner (``kind="ask"``) shown in the same live view as ``%%spawn``: the
view gets the run's own events, from ``Started`` to ``Finished``. The chat widget
continues its conversation turn by turn (:meth:`Spawner.resume`, each turn a session
of its own linked to the one before); its replay server, if any, stops when the widget
is closed or the kernel exits.
"""

from __future__ import annotations

import atexit
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

    if view is not None:
        from IPython.display import display

        display(view)  # type: ignore[no-untyped-call]
    return wait_job(hub.loop.submit(run()))


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
        self.status = w.HTML()
        super().__init__([self.transcript, self.entry, self.status])
        atexit.register(self.close)

    def send(self, text: str) -> Job[AskResult] | None:
        """Send one message; returns the running turn (awaitable with ``await job``)."""
        text = text.strip()
        if not text or self.closed:
            return None
        self.entry.disabled = True
        view = RunView(schedule=self.hub.schedule)
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
            finally:
                self.entry.disabled = False
            self.turns.append(result)
            answer.value = f'<div style="white-space:pre-wrap">{html.escape(result.answer)}</div>'
            return result

        return self.hub.loop.submit(turn())

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
