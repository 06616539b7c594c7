"""The butler's side of ACP: ``initialize``, ``session/new``, ``session/load``,
``session/prompt`` and ``session/cancel``.

An ACP session is a conversation; each of its prompts is one run of the butler through
its :class:`~spawnkit.serve.service.ButlerService` (the ``spawnkit run`` path: sandbox,
MCP server, budgets, record, spans), started beside the protocol (:mod:`.startup`:
``initialize`` does not wait for it, a prompt does), and every accepted prompt leaves exactly one
session record. The ACP session's id is the spawnkit session id of its first run; each
later run continues the previous one (``parent_session_id``) and resumes the runtime
session of the last run that got as far as talking to its model, so the agent remembers
the conversation. ``session/load`` replays such a chain from the store and goes on from
its end, so any recorded session can be picked up in a client.

``session/cancel`` cancels the prompt's run as Ctrl-C does (the run is recorded
``cancelled``, its processes and workspace are gone) and the prompt answers
``cancelled``. When the client goes away (stdin closed) the connection ends, its handlers
are cancelled, and so are their runs, the same way.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, cast

from acp import PROTOCOL_VERSION, Agent, RequestError, update_agent_message_text
from acp.agent.connection import AgentSideConnection
from acp.schema import (
    AgentCapabilities,
    AudioContentBlock,
    EmbeddedResourceContentBlock,
    ImageContentBlock,
    Implementation,
    InitializeResponse,
    LoadSessionResponse,
    McpCapabilities,
    NewSessionResponse,
    PromptCapabilities,
    PromptResponse,
    ResourceContentBlock,
    TextContentBlock,
    TextResourceContents,
)

from ...config.roster import ButlerConfig
from ...errors import SpawnkitError
from ...events import RunEvent
from ...result import SpawnerResult
from ...store import SessionRecord, SessionStore
from .approval import ClientApprover
from .startup import ServiceContext, ServiceStartup
from .updates import (
    SessionUpdate,
    UpdateStream,
    prompt_usage,
    stop_of,
    transcript,
    usage_update,
)
from .wire import ProtocolStdio, StdioWire

logger = logging.getLogger(__name__)

PromptBlock = (
    TextContentBlock
    | ImageContentBlock
    | AudioContentBlock
    | ResourceContentBlock
    | EmbeddedResourceContentBlock
)


@dataclass
class Turn:
    """A prompt being answered: its run's session id and the task awaiting its result."""

    run_id: str
    task: asyncio.Task[SpawnerResult]
    cancelled: bool = False


@dataclass
class Conversation:
    """One ACP session: where its next prompt goes on from."""

    id: str
    cwd: str
    approver: ClientApprover
    # spawnkit's session id of its latest run, the parent of the next one.
    last_run: str | None = None
    # The runtime session the next run resumes (the latest run that reached its model).
    resume_from: str | None = None
    turn: Turn | None = None


def resumable(record: SessionRecord | SpawnerResult) -> str | None:
    """The runtime session id a later run can resume, when this run left a transcript.

    A run that never reached its model (refused, failed to start, cancelled early) has
    no conversation to go on from, even when its runtime session id was chosen ahead.
    """
    if not record.runtime_session_id:
        return None
    if record.num_turns or record.output or record.tool_calls or record.status == "success":
        return record.runtime_session_id
    return None


class ButlerAgent:
    """An ACP agent whose prompts are runs of one butler (see the module's docstring)."""

    def __init__(
        self, butler: ButlerConfig, store: SessionStore, startup: ServiceStartup, *, version: str
    ) -> None:
        self.butler = butler
        self.store = store
        self.startup = startup
        self.version = version
        self.client: AgentSideConnection | None = None
        self.conversations: dict[str, Conversation] = {}

    def on_connect(self, conn: AgentSideConnection) -> None:
        self.client = conn

    @property
    def butler_name(self) -> str:
        return self.butler.name

    # -- the protocol's methods ----------------------------------------------------------

    async def initialize(self, protocol_version: int, **_: Any) -> InitializeResponse:
        return InitializeResponse(
            protocol_version=min(protocol_version, PROTOCOL_VERSION),
            agent_capabilities=AgentCapabilities(
                load_session=True,
                # Text and resource links always; embedded text resources are read into the
                # prompt. Images and audio: the runs take a text prompt.
                prompt_capabilities=PromptCapabilities(
                    image=False, audio=False, embedded_context=True
                ),
                # The butler's own MCP server serves its runs; a client's are not added.
                mcp_capabilities=McpCapabilities(http=False, sse=False),
            ),
            agent_info=Implementation(
                name="spawnkit",
                title=f"spawnkit butler {self.butler_name}",
                version=self.version,
            ),
            auth_methods=[],
        )

    async def new_session(self, cwd: str, **_: Any) -> NewSessionResponse:
        self.startup.raise_if_failed()  # no waiting for the service: the prompt will
        conversation = self._open(str(uuid.uuid4()), cwd)
        return NewSessionResponse(session_id=conversation.id)

    async def load_session(self, cwd: str, session_id: str, **_: Any) -> LoadSessionResponse:
        known = self.conversations.get(session_id)
        if known is not None and known.turn is not None:
            raise RequestError.invalid_request({"details": f"session {session_id} is answering"})
        store = self.store
        first = await asyncio.to_thread(store.get_session, session_id)
        if first is None:
            if known is not None:  # new in this process, no prompt yet: nothing to replay
                return LoadSessionResponse()
            raise RequestError.invalid_params(
                {"details": f"no session {session_id} in the store {store.location}"}
            )
        if first.butler != self.butler_name:
            raise RequestError.invalid_params(
                {"details": f"session {session_id} belongs to butler {first.butler!r}, "
                            f"not {self.butler_name!r}"}
            )  # fmt: skip
        chain = await asyncio.to_thread(self._chain, first)
        if chain[-1].completed_at is None:
            raise RequestError.invalid_request(
                {"details": f"session {chain[-1].id} is still running; load it when it ends"}
            )
        conversation = self._open(session_id, cwd)
        for record in chain:
            for update in transcript(record):
                await self._send(conversation.id, update)
        conversation.last_run = chain[-1].id
        conversation.resume_from = next(
            (rid for record in reversed(chain) if (rid := resumable(record))), None
        )
        return LoadSessionResponse()

    async def prompt(
        self, prompt: Sequence[PromptBlock], session_id: str, **_: Any
    ) -> PromptResponse:
        conversation = self._conversation(session_id)
        if conversation.turn is not None:
            raise RequestError.invalid_request(
                {"details": f"session {session_id} is still answering the previous prompt"}
            )
        text = prompt_text(prompt)
        stream, outbox = UpdateStream(), _Outbox(self, conversation.id)
        run_id = conversation.id if conversation.last_run is None else str(uuid.uuid4())

        def on_event(event: RunEvent) -> None:
            outbox.put(stream.updates(event))

        async def run() -> SpawnerResult:
            service = await self.startup.ready()
            return await service.trigger(
                text,
                session_id=run_id,
                on_event=on_event,
                parent_session_id=conversation.last_run,
                resume=conversation.resume_from,
                # [butler.permissions] ask: the person at the client answers.
                approver=conversation.approver,
            )

        task = asyncio.create_task(run(), name=f"acp:{self.butler_name}:{run_id[:8]}")
        turn = conversation.turn = Turn(run_id, task)
        try:
            result = await task
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if not turn.cancelled or (current is not None and current.cancelling()):
                outbox.task.cancel()  # nobody will read them: the client is going away
                raise  # the connection or the process is going away: the run is cancelled
            await outbox.flush()
            return PromptResponse(stop_reason="cancelled")
        except RequestError:
            await outbox.flush()  # the service could not start: no run, nothing to send
            raise
        except SpawnkitError as exc:
            # Refused before it was accepted (a missing CLI, a spent budget, ...): no run, no
            # record; the person reads why in the conversation.
            await outbox.flush()
            await self._send(conversation.id, update_agent_message_text(f"spawnkit: {exc}\n"))
            return PromptResponse(stop_reason="end_turn", field_meta=_meta(None, "refused"))
        finally:
            conversation.turn = None
        await outbox.flush()
        conversation.last_run = result.session_id or run_id
        conversation.resume_from = resumable(result) or conversation.resume_from
        # The run's final figures: the cost is known only now for most runtimes.
        await self._send(conversation.id, usage_update(result.usage, result.cost_usd, result.model))
        stop, message = stop_of(result)
        if message:
            await self._send(conversation.id, update_agent_message_text(f"\n{message}\n"))
        return PromptResponse(
            stop_reason=stop,
            usage=prompt_usage(result.usage),
            field_meta=_meta(result.session_id, result.status),
        )

    async def cancel(self, session_id: str, **_: Any) -> None:
        conversation = self.conversations.get(session_id)
        if conversation is None or conversation.turn is None:
            return  # a notification: nothing to answer, nothing running to cancel
        await self._cancel(conversation.turn)

    # -- the rest ------------------------------------------------------------------------

    async def close(self) -> None:
        """Cancel every prompt's run (the client went away); each is recorded cancelled."""
        turns = [c.turn for c in self.conversations.values() if c.turn is not None]
        await asyncio.gather(*(self._cancel(turn) for turn in turns))

    async def _cancel(self, turn: Turn) -> None:
        turn.cancelled = True
        # As Ctrl-C does: the run's task is cancelled, and records itself as cancelled.
        service = self.startup.service
        if service is None or not await service.spawner.cancel(turn.run_id):
            turn.task.cancel()  # not in flight yet (the service starting, or admission)
        await asyncio.wait({turn.task})

    def _open(self, session_id: str, cwd: str) -> Conversation:
        ask = self.client.request_permission if self.client is not None else _no_client
        conversation = Conversation(session_id, cwd, ClientApprover(session_id, ask))
        self.conversations[session_id] = conversation
        return conversation

    def _conversation(self, session_id: str) -> Conversation:
        conversation = self.conversations.get(session_id)
        if conversation is None:
            raise RequestError.invalid_params(
                {"details": f"unknown session {session_id!r}: start one with session/new "
                            "(or session/load)"}
            )  # fmt: skip
        return conversation

    def _chain(self, first: SessionRecord) -> list[SessionRecord]:
        """The run and the runs that continued it, one after another (the latest
        continuation at each step, as an ACP session makes them)."""
        chain, seen = [first], {first.id}
        while (nexts := self.store.continuations(chain[-1].id)) and (nexts[-1].id not in seen):
            chain.append(nexts[-1])
            seen.add(nexts[-1].id)
        return chain

    async def _send(self, session_id: str, update: SessionUpdate) -> bool:
        """Send one notification; False when the client is gone (the run goes on to its
        record regardless: a client that left cannot be told, and must not stop it)."""
        if self.client is None:
            return False
        try:
            await self.client.session_update(session_id=session_id, update=update)
        except (ConnectionError, OSError) as exc:
            logger.debug("the ACP client is gone (%s): an update was dropped", exc)
            return False
        return True


async def _no_client(**_: Any) -> Any:
    raise ConnectionError("no ACP client is connected")


def _meta(session_id: str | None, status: str) -> dict[str, Any]:
    return {"spawnkit": {"sessionId": session_id, "status": status}}


class _Outbox:
    """A run's notifications, sent in order as its events come (events are delivered
    synchronously; sending awaits the client's pipe). Bounded by the run itself: its
    output and tool calls are capped (``spawnkit.result``)."""

    def __init__(self, agent: ButlerAgent, session_id: str) -> None:
        self.agent = agent
        self.session_id = session_id
        self.queue: asyncio.Queue[SessionUpdate | None] = asyncio.Queue()
        self.task = asyncio.create_task(self._pump(), name=f"acp-updates:{session_id[:8]}")
        self.gone = False

    def put(self, updates: list[SessionUpdate]) -> None:
        for update in updates:
            self.queue.put_nowait(update)

    async def flush(self) -> None:
        """Every notification so far is sent (or the client is gone)."""
        self.queue.put_nowait(None)
        await self.task

    async def _pump(self) -> None:
        while (update := await self.queue.get()) is not None:
            if not self.gone:
                self.gone = not await self.agent._send(self.session_id, update)


def prompt_text(blocks: Sequence[PromptBlock]) -> str:
    """The run's prompt: text as written, resources as references or embedded text.

    Images and audio are refused (``initialize`` does not offer them): a butler's run
    takes a text prompt.
    """
    parts: list[str] = []
    for block in blocks:
        if isinstance(block, TextContentBlock):
            parts.append(block.text)
        elif isinstance(block, ResourceContentBlock):
            parts.append(f"[{block.name}]({block.uri})")
        elif isinstance(block, EmbeddedResourceContentBlock) and isinstance(
            block.resource, TextResourceContents
        ):
            resource = block.resource
            parts.append(f"<file uri={resource.uri!r}>\n{resource.text}\n</file>")
        else:
            raise RequestError.invalid_params(
                {"details": f"a {block.type} block: this agent takes text and text resources"}
            )
    text = "\n\n".join(part for part in parts if part)
    if not text.strip():
        raise RequestError.invalid_params({"details": "the prompt is empty"})
    return text


async def serve_stdio(
    butler: ButlerConfig,
    store: SessionStore,
    start: ServiceContext,
    stdio: ProtocolStdio,
    *,
    version: str,
) -> None:
    """Answer ACP on the client's stdio until it closes it; then cancel what still runs and
    stop the butler's service (``start()``, started beside the protocol)."""
    startup = ServiceStartup(start, butler=butler.name)
    try:
        await _answer(ButlerAgent(butler, store, startup, version=version), stdio)
    finally:
        await startup.close()


async def _answer(agent: ButlerAgent, stdio: ProtocolStdio) -> None:
    wire = await StdioWire.open(stdio)
    # The SDK's Agent protocol lists every method; the ones a butler lacks (modes, fork,
    # list, authenticate...) are answered "Method not found" by its router.
    connection = AgentSideConnection(cast(Agent, agent), wire.writer, wire.reader, listening=False)
    try:
        await connection.listen()
    finally:
        await agent.close()
        await connection.close()
        await wire.close()
