"""A trigger run on a worker of a Dask cluster, from the client's side (spawnkit.run.dispatch).

Its record is made here, ``queued`` and owned by this process (whose leases keep it), the
moment the trigger is accepted, once the scheduler was reached (one out of reach refuses the
trigger, with no record), and a ``Queued`` event says so: a run waiting in Dask's
queue is seen, and one cancelled or lost before it starts is closed. The worker admits it
(its spawner's queue and the store's slots across hosts), adopts the record and streams
its events back; here it counts as running until it ends.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Sequence
from typing import Any

from ..containment.credentials import injected_secrets
from ..containment.sources import Source
from ..events import EventSink, Queued, RunEvent
from ..redaction import Redactor
from ..result import SpawnerResult
from .accepted import CANCEL_GRACE_S
from .admission import Admissions
from .dispatch import Cluster
from .request import RunKind
from .settings import RunSettings

logger = logging.getLogger(__name__)


async def dispatch(
    settings: RunSettings,
    cluster: Cluster,
    admissions: Admissions,
    listeners: Sequence[EventSink],
    prompt: str,
    trigger_source: str,
    *,
    on_event: EventSink | None,
    session_id: str | None,
    kind: RunKind,
    sources: Sequence[Source],
    role: str | None,
    options: dict[str, Any],
) -> SpawnerResult:
    """The trigger, run on a worker of ``cluster``; its result, events and record are a
    local run's."""
    session_id = session_id if session_id is not None else str(uuid.uuid4())
    sinks = [*listeners, *([on_event] if on_event else [])]
    redactor = Redactor(
        injected_secrets(
            settings.butler, settings.credentials, settings.adapter.passthrough_env,
            settings.adapter.other_vendor_keys,
        )
    )  # fmt: skip
    # The cluster first: one out of reach refuses the trigger (DispatchError) with no record.
    await cluster.connect()
    # Accepted: recorded before it is sent (an id used again raises here, as locally).
    creating = asyncio.ensure_future(
        asyncio.to_thread(
            settings.store.create_session, session_id, butler=settings.butler.name,
            runtime=settings.butler.runtime.type, model=settings.model,
            prompt=redactor.text(prompt), context=redactor.text(options.get("context")),
            trigger_source=trigger_source, role=role,
            parent_session_id=options.get("parent_session_id"),
        )
    )  # fmt: skip
    try:
        await asyncio.shield(creating)
    except asyncio.CancelledError:  # interrupted as it was accepted: closed, not sent
        await asyncio.wait({creating})
        if not creating.cancelled() and creating.exception() is None:
            await asyncio.to_thread(
                settings.store.close_queued, session_id, status="cancelled",
                error="the run was cancelled before it was sent", error_kind="cancelled",
            )  # fmt: skip
        raise

    def deliver(event: RunEvent) -> None:
        for sink in sinks:
            try:
                sink(event)
            except Exception:
                logger.exception("event listener %r failed on %s", sink, type(event).__name__)

    task = asyncio.create_task(
        cluster.trigger(
            settings.butler, settings.store, prompt, trigger_source,
            session_id=session_id, options=options, deliver=deliver,
        ),
        name=f"spawnkit:{settings.butler.name}:{session_id[:8]}:dispatch",
    )  # fmt: skip
    admissions.runs[session_id] = task
    admissions.active += 1

    def finished(_: asyncio.Task[SpawnerResult]) -> None:
        admissions.active -= 1
        admissions.runs.pop(session_id, None)

    task.add_done_callback(finished)
    admissions.keep_leases()  # the queued record is this host's until a worker adopts it
    deliver(Queued(session_id, settings.butler.name, len(admissions.runs)))
    try:
        return await asyncio.shield(task)
    except asyncio.CancelledError:
        # As for a local run: cancel it (on its worker), wait for its record, pass it on.
        task.cancel()
        await asyncio.wait({task}, timeout=CANCEL_GRACE_S + 5)
        raise
