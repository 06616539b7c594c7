"""Runs on a Dask cluster: the client's side of ``Spawner(..., cluster=Cluster(...))``.

A :class:`Cluster` wraps a ``distributed.Client`` (the caller's, or one it makes from a
scheduler address and then owns and closes). :meth:`Cluster.trigger` sends one trigger to a
worker as a task and follows it there: the worker runs the same lifecycle a local trigger
does (:mod:`spawnkit.cluster.worker`: admission through the shared store's slots, sandbox,
the butler's MCP server on the worker's loopback, one record carrying the worker's host), and
this side writes the run's record ``queued`` when it accepts the trigger (the worker
adopts it: :meth:`~spawnkit.store.SessionStore.adopt_session`; one no worker adopted is
closed here) and only moves three things across the network:

- **events**, as they happen: the worker logs each one, with its sequence number, to this
  Cluster's topic (``Worker.log_event``); the client subscribed to the topic before it
  submitted anything, so none is missed, and hands them to the caller's listeners in order.
  One topic per Cluster rather than per run: the scheduler keeps a bounded log per topic.
- **cancellation**: a per-run ``distributed.Event`` the task waits on beside its run.
  ``future.cancel()`` does not reach a running async task (the client would see "cancelled"
  while the CLI ran on), so a cancelled trigger sets the event, the worker cancels its run
  (process group killed, record ``cancelled``) and the client waits for that result.
- **a lost worker**: a worker killed mid-run leaves an open record. The client closes it
  ``crashed`` with "worker lost" and returns that result. Dask re-runs a task whose worker
  died (``distributed.scheduler.allowed-failures``, 3 by default, scheduler-wide in
  distributed 2026.8: there is no per-task setting), and an agent run is not idempotent, so
  the task refuses to start a session whose record already exists (see
  :func:`spawnkit.cluster.worker.run_trigger`): nothing runs twice whatever the scheduler's
  setting. With ``allowed-failures = 0`` the client learns of the loss at once
  (``KilledWorker``); with retries it learns from the refused re-run.

The task is named, not imported: ``spawnkit.cluster.worker`` sits a layer above the spawner
(it serves a butler), and runs on the worker, where :func:`_on_worker` imports it.
"""

from __future__ import annotations

import asyncio
import importlib
import logging
import os
import pickle
import socket
import threading
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..config.roster import ButlerConfig
from ..containment.cluster_security import (
    ClusterCredentials,
    checked_scheduler_address,
    client_address,
    load_credentials,
)
from ..containment.sweep import reap
from ..errors import ConfigError, SpawnkitError
from ..events import Finished, RunEvent
from ..replay import Scenario
from ..result import SpawnerResult
from ..store import SessionStore
from ..store.backend import redact_url

if TYPE_CHECKING:
    from distributed import Client, Future

logger = logging.getLogger(__name__)

# What a run lost with its worker is recorded as (the record's error starts with it).
WORKER_LOST = "worker lost"
# The worker's side of a run, imported by name on the worker (see the module docstring).
WORKER_TASK = "spawnkit.cluster.worker:run_trigger"
# The scheduler address `%%spawn --on dask` uses when there is no default client.
SCHEDULER_VAR = "SPAWNKIT_DASK_SCHEDULER"
# How long a cancelled run may take to stop on its worker and answer.
CANCEL_GRACE_S = 30.0
# How long to wait, after a task's result, for events still on their way to the client.
STREAM_TAIL_S = 10.0
# How long reaching the scheduler may take: one that does not answer by then is out of
# reach (a trigger fails in one line, before any record is made).
CONNECT_TIMEOUT_S = 5.0


class DispatchError(SpawnkitError):
    """The cluster cannot be reached, or a run could not be handed to it."""


@dataclass(frozen=True)
class RemoteTrigger:
    """One trigger as it travels to a worker: the butler, the store to record in, and the
    trigger's own arguments. Pickled by Dask, so everything in it must be."""

    butler: ButlerConfig
    # The store to open on the worker: a SQLite path every worker sees, or a PostgreSQL URL
    # without its password; the worker takes the password from its own configuration
    # (spawnkit.cluster.worker.worker_store). No secret travels in a task.
    store: str
    session_id: str
    prompt: str
    trigger_source: str
    # The trigger's other keyword arguments (context, max_turns, limits, role, ...).
    options: Mapping[str, Any]
    replay: Scenario | None
    # Where events go, and the event that cancels the run.
    topic: str
    cancel_event: str
    # The owner (host, pid) of the run's ``queued`` record, made by the client when it
    # accepted the trigger: the worker adopts that record (and only one still queued).
    queued_by: tuple[str, int] | None = None
    # The host the trigger came from (logged on the worker).
    client_host: str = field(default_factory=socket.gethostname)

    def __repr__(self) -> str:
        # Dask logs a task's arguments when it fails: no store password, no prompt there.
        return f"RemoteTrigger(butler={self.butler.name!r}, session_id={self.session_id!r})"


def travelling_store(store: SessionStore) -> str:
    """What names ``store`` in a task: its SQLite file's path, or its URL without password."""
    return store.target if store.path is not None else redact_url(store.target)


def event_message(session_id: str, seq: int, event: RunEvent | None) -> dict[str, Any]:
    """A run's event as logged to the topic; ``event=None`` marks the end of its stream.

    Topic messages must be msgpack; the event (a dataclass tree) travels pickled.
    """
    return {
        "session_id": session_id,
        "seq": seq,
        "event": pickle.dumps(event) if event is not None else None,
    }


async def _on_worker(request: RemoteTrigger) -> SpawnerResult | SpawnkitError:
    """The task Dask runs: the worker's side of a trigger, found by name there."""
    module, _, name = WORKER_TASK.partition(":")
    run = getattr(importlib.import_module(module), name)
    result: SpawnerResult | SpawnkitError = await run(request)
    return result


def require_distributed() -> Any:
    try:
        import distributed
    except ImportError as exc:
        raise ConfigError(
            "runs on a Dask cluster need the distributed package: pip install 'spawnkit[cluster]'"
        ) from exc
    return distributed


def environment_cluster() -> Client | str:
    """What ``--on dask`` means now: the default ``distributed`` client (the last one made
    and not closed), else the address in ``$SPAWNKIT_DASK_SCHEDULER``."""
    distributed = require_distributed()
    try:
        client: Client = distributed.default_client()
    except ValueError:
        address = os.environ.get(SCHEDULER_VAR, "").strip()
        if not address:
            raise ConfigError(
                "no Dask cluster: create a distributed.Client first, or set "
                f"{SCHEDULER_VAR} to the scheduler's address"
            ) from None
        return address
    return client


class _Stream:
    """One run's messages, from the client's thread to the caller's loop."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.queue: asyncio.Queue[dict[str, Any] | None] = asyncio.Queue()
        self.seq = 0  # the sequence number of the next event expected

    def put(self, message: dict[str, Any] | None) -> None:
        self.loop.call_soon_threadsafe(self.queue.put_nowait, message)


class Cluster:
    """Where triggers run when a :class:`~spawnkit.run.Spawner` is given ``cluster=``.

    ``client_or_address`` is a ``distributed.Client`` (kept open: it is the caller's) or a
    scheduler address such as ``tls://host:8786`` (a Client is made on first use and
    closed by :meth:`close`). For an address, the cluster's certificates are those in
    ``credentials`` (a folder), else in ``$SPAWNKIT_HOME/cluster``
    (:mod:`spawnkit.containment.cluster_security`): with them a bare ``host:port`` means ``tls://``
    and a ``tcp://`` address is refused; without them only a ``tcp://`` scheduler can be
    reached. ``replay`` plays every run's model turns from a scenario on the worker (a
    replay server on its loopback), so a cluster runs offline.
    """

    def __init__(
        self,
        client_or_address: Client | str,
        *,
        replay: Scenario | Path | str | None = None,
        credentials: Path | None = None,
    ) -> None:
        require_distributed()
        self._credentials: ClusterCredentials | None = None
        if isinstance(client_or_address, str):
            self._credentials = load_credentials(credentials)
            if credentials is not None and self._credentials is None:
                raise ConfigError(f"no cluster credentials in {credentials}")
            self.address: str | None = client_address(
                checked_scheduler_address(client_or_address), self._credentials
            )
            self._client: Client | None = None
            self._owns_client = True
        else:
            if client_or_address.asynchronous:
                raise ConfigError(
                    "give the Cluster a synchronous distributed.Client or a scheduler address"
                )
            self.address = None
            self._client = client_or_address
            self._owns_client = False
        self.replay = Scenario.load(replay) if isinstance(replay, str | Path) else replay
        self.topic = f"spawnkit-events-{uuid.uuid4().hex}"
        self._streams: dict[str, _Stream] = {}
        self._lock = threading.Lock()
        self._subscribed = False

    @classmethod
    def from_environment(cls, *, replay: Scenario | Path | str | None = None) -> Cluster:
        """The current default ``distributed`` client, else ``$SPAWNKIT_DASK_SCHEDULER``."""
        return cls(environment_cluster(), replay=replay)

    def __repr__(self) -> str:
        scheduler = self._client.scheduler if self._client is not None else None
        where = self.address or (scheduler.address if scheduler is not None else "?")
        return f"Cluster({where!r})"

    # -- the client ----------------------------------------------------------------------

    @property
    def client(self) -> Client:
        """The distributed Client (connecting first, for an address); blocks while it does."""
        with self._lock:
            if self._client is None:
                distributed = require_distributed()
                security = self._credentials.security() if self._credentials else None
                try:
                    self._client = distributed.Client(
                        self.address, timeout=CONNECT_TIMEOUT_S, set_as_default=False,
                        security=security,
                    )  # fmt: skip
                except OSError as exc:  # TimeoutError too
                    raise DispatchError(
                        f"cannot reach the Dask scheduler at {self.address} within "
                        f"{CONNECT_TIMEOUT_S:g} s: {exc}"
                    ) from exc
                if security is None:  # said once it is reached: an unreachable one is one line
                    logger.warning(
                        "cluster: %s is not secured: anyone who reaches the scheduler can "
                        "submit tasks (spawnkit scheduler starts a secured one)", self.address,
                    )  # fmt: skip
            if not self._subscribed:
                self._client.subscribe_topic(self.topic, self._receive)
                self._subscribed = True
            return self._client

    def _receive(self, event: tuple[float, Any]) -> None:
        """Called on the client's thread for each message on this Cluster's topic."""
        message = event[1]
        session_id = message.get("session_id") if isinstance(message, dict) else None
        stream = self._streams.get(session_id) if isinstance(session_id, str) else None
        if stream is None:
            logger.debug("cluster: a message of no run followed here: %r", message)
            return
        stream.put(message)

    def close(self) -> None:
        """Stop following events; close the Client if this Cluster made it."""
        with self._lock:
            client, self._client = self._client, None
            if client is None:
                return
            if self._subscribed:
                if client.status not in ("closing", "closed"):  # else its owner closed it
                    client.unsubscribe_topic(self.topic)
                self._subscribed = False
            if self._owns_client:
                client.close()
            else:
                self._client = client  # the caller's: stays usable

    def __enter__(self) -> Cluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    async def connect(self) -> None:
        """Reach the scheduler now (bounded by :data:`CONNECT_TIMEOUT_S`): a trigger is
        accepted, recorded and reported queued only once the cluster can take it."""
        await asyncio.to_thread(lambda: self.client)

    # -- a run ---------------------------------------------------------------------------

    async def trigger(
        self,
        butler: ButlerConfig,
        store: SessionStore,
        prompt: str,
        trigger_source: str,
        *,
        session_id: str,
        options: Mapping[str, Any],
        deliver: Callable[[RunEvent], None],
    ) -> SpawnerResult:
        """Run one trigger on a worker; its events go to ``deliver`` as they happen.

        Cancelling this coroutine cancels the run on its worker and returns its
        ``cancelled`` result (as a local run's task does), once the worker has recorded it.
        """
        request = RemoteTrigger(
            butler=butler,
            store=travelling_store(store),
            session_id=session_id,
            prompt=prompt,
            trigger_source=trigger_source,
            options=dict(options),
            replay=self.replay,
            topic=self.topic,
            cancel_event=f"spawnkit-cancel-{session_id}",
            queued_by=store.owner,
        )
        stream = _Stream(asyncio.get_running_loop())
        self._streams[session_id] = stream
        future: Future[Any] | None = None
        try:
            client = await asyncio.to_thread(lambda: self.client)
            future = client.submit(
                # A key of its own per submission: Dask answers a key it still holds with
                # the result it has, so a session id given again would get the old run's.
                _on_worker,
                request,
                key=f"spawnkit-run-{session_id}-{uuid.uuid4().hex[:8]}",
                pure=False,
                retries=0,
            )
            future.add_done_callback(lambda _: stream.put(None))
            try:
                result = await self._follow(future, stream, store, request, deliver)
            except asyncio.CancelledError:
                result = await self._cancel(future, stream, store, request, deliver)
            if result.error_kind == "worker_lost":
                await self._reap(request.session_id)
            # No worker adopted the record (cancelled or lost before it started): closed
            # here, as the result says. A no-op for a record a worker adopted.
            await asyncio.to_thread(
                store.close_queued, session_id, status=result.status, error=result.error,
                error_kind=result.error_kind,
            )  # fmt: skip
            return result
        except SpawnkitError:
            # Refused before it was accepted (on the worker, or the cluster out of reach):
            # raised as a local refusal is, which leaves no record.
            await asyncio.to_thread(store.withdraw_queued, session_id)
            raise
        except BaseException as exc:
            await asyncio.to_thread(
                store.close_queued, session_id,
                status="cancelled" if isinstance(exc, asyncio.CancelledError) else "failed",
                error=f"the run ended before it was sent to a worker: {exc!r}",
                error_kind="dispatch",
            )  # fmt: skip
            raise
        finally:
            self._streams.pop(session_id, None)
            if future is not None:
                future.release()

    async def _follow(
        self,
        future: Future[Any],
        stream: _Stream,
        store: SessionStore,
        request: RemoteTrigger,
        deliver: Callable[[RunEvent], None],
    ) -> SpawnerResult:
        ended = False  # the worker's end-of-stream message
        done = False  # the task's future
        while not (ended and done):
            try:
                async with asyncio.timeout(STREAM_TAIL_S if done else None):
                    message = await stream.queue.get()
            except TimeoutError:
                logger.warning(
                    "run %s: its result came without the end of its event stream; "
                    "%d events were delivered", request.session_id, stream.seq,
                )  # fmt: skip
                break
            if message is None:
                done = True
                if future.status != "finished":
                    break  # the task failed or was lost: no more events will come
                continue
            if message["seq"] == 0 and stream.seq > 0:
                logger.info("run %s: its task started again on another worker", request.session_id)
            elif message["seq"] != stream.seq:
                logger.warning(
                    "run %s: event %d arrived where %d was expected",
                    request.session_id, message["seq"], stream.seq,
                )  # fmt: skip
            stream.seq = message["seq"] + 1
            if message["event"] is None:
                ended = True
                continue
            deliver(pickle.loads(message["event"]))
        return await self._outcome(future, store, request, deliver)

    async def _outcome(
        self,
        future: Future[Any],
        store: SessionStore,
        request: RemoteTrigger,
        deliver: Callable[[RunEvent], None],
    ) -> SpawnerResult:
        """The task's result; for a lost worker or a failed task, a ``crashed`` one."""
        if future.status == "finished":
            outcome: SpawnerResult | SpawnkitError = await asyncio.to_thread(future.result)
            if isinstance(outcome, SpawnkitError):
                # Refused on the worker before it was accepted (a full queue, a missing CLI
                # or variable): no record was made; raised here as a local trigger raises it.
                raise outcome
            return outcome
        if future.status == "cancelled":  # cancelled before a worker took it: never ran
            result: SpawnerResult = SpawnerResult(
                success=False, status="cancelled", error_kind="cancelled",
                error="the run was cancelled before it reached a worker",
                session_id=request.session_id, butler=request.butler.name,
                runtime=request.butler.runtime.type,
            )  # fmt: skip
            deliver(Finished(request.session_id, result))
            return result
        distributed = require_distributed()
        error = await asyncio.to_thread(future.exception) if future.status == "error" else None
        if isinstance(error, distributed.KilledWorker):
            worker = getattr(error.last_worker, "address", "?")
            reason = (
                f"{WORKER_LOST}: the Dask worker {worker} died while it ran this session; "
                "it is not run again"
            )
            kind = "worker_lost"
        else:
            reason = f"the Dask task of this session ended {future.status}: {error!r}"
            kind = "dispatch"
        return await self._crashed(store, request, reason, kind, deliver)

    async def _reap(self, session_id: str) -> None:
        """Kill what a lost worker's run left on the hosts of the workers still here.

        A sandboxed run dies with its worker (bwrap's --die-with-parent); an unsandboxed
        one's processes are orphaned, and only a process on their host can find them (by
        the run's marker, as the start-up sweep does).
        """
        try:
            killed = await asyncio.to_thread(self.client.run, reap, session_id, None)
        except (OSError, TimeoutError) as exc:
            logger.warning("run %s: could not look for its leftovers: %r", session_id, exc)
            return
        if found := {worker: pids for worker, pids in killed.items() if pids}:
            logger.warning("run %s: killed what its lost worker left: %s", session_id, found)

    async def _crashed(
        self,
        store: SessionStore,
        request: RemoteTrigger,
        reason: str,
        kind: str,
        deliver: Callable[[RunEvent], None],
    ) -> SpawnerResult:
        """Close the run's record (if the worker left it open) and say so to the caller."""
        await asyncio.to_thread(store.mark_crashed, request.session_id, reason)
        record = await asyncio.to_thread(store.get_session, request.session_id)
        if record is not None and record.error:
            reason = record.error  # closed first by someone else (a sweep): their words
        result = SpawnerResult(
            success=False, status="crashed", error=reason, error_kind=kind,
            session_id=request.session_id, butler=request.butler.name,
            runtime=request.butler.runtime.type,
        )  # fmt: skip
        deliver(Finished(request.session_id, result))
        return result

    async def _cancel(
        self,
        future: Future[Any],
        stream: _Stream,
        store: SessionStore,
        request: RemoteTrigger,
        deliver: Callable[[RunEvent], None],
    ) -> SpawnerResult:
        """Cancel the run: at once while no worker has adopted its record (it is closed
        here first, so no worker takes it after), else on its worker, waiting (bounded)
        for its ``cancelled`` result."""
        distributed = require_distributed()
        client = self.client
        error = "the run was cancelled before it started"
        if await asyncio.to_thread(
            store.close_queued, request.session_id, status="cancelled", error=error,
            error_kind="cancelled",
        ):  # fmt: skip
            await asyncio.to_thread(future.cancel)  # it never starts (a worker would refuse)
            result = SpawnerResult(
                success=False, status="cancelled", error_kind="cancelled", error=error,
                session_id=request.session_id, butler=request.butler.name,
                runtime=request.butler.runtime.type,
            )  # fmt: skip
            deliver(Finished(request.session_id, result))
            return result
        await asyncio.to_thread(distributed.Event(request.cancel_event, client=client).set)
        try:
            async with asyncio.timeout(CANCEL_GRACE_S):
                return await self._follow(future, stream, store, request, deliver)
        except TimeoutError:
            return await self._crashed(
                store, request,
                f"the run was cancelled and its worker did not stop it within {CANCEL_GRACE_S} s",
                "cancelled", deliver,
            )  # fmt: skip
        finally:
            try:  # frees the event's state on the scheduler
                await asyncio.to_thread(
                    distributed.Event(request.cancel_event, client=client).clear
                )
            except (OSError, TimeoutError) as exc:  # the scheduler is gone, and the event too
                logger.debug("could not clear the cancel event of %s: %r", request.session_id, exc)
