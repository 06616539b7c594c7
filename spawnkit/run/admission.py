"""Admission: whether a trigger runs now, waits its turn, or is refused, and who holds what.

Admission is decided at once, before any await: a free slot runs now; a busy butler
queues the trigger up to ``max_queued_sessions`` and refuses the next with
:class:`~spawnkit.errors.QueueFullError`; a trigger from the butler's own agent
(``trigger_source="trigger"``) is refused with ``success=False`` when no slot is free,
because it would wait for the very run that is waiting for it. On a PostgreSQL store the
same places and slots are held across every host sharing it, and the records of this
host's runs are kept alive by leases. :meth:`Admissions.drain` and
:meth:`Admissions.cancel` end runs already accepted.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator

from ..errors import QueueFullError, StoreError
from ..result import SpawnerResult
from ..store.backend import Admission, SlotClaim
from .accepted import CANCEL_GRACE_S
from .settings import RunSettings

logger = logging.getLogger(__name__)

# How often a run waiting for a slot another host holds tries again (PostgreSQL stores).
SLOT_POLL_S = 0.2

# A place in the butler's queue across the hosts sharing a PostgreSQL store, and its number.
Place = tuple[Admission, int]


class Admissions:
    """The butler's slots, queue and in-flight runs, on this host and across a shared store."""

    def __init__(self, settings: RunSettings) -> None:
        self.settings = settings
        self.capacity = settings.butler.runtime.max_concurrent_sessions
        self.max_queued = settings.butler.runtime.max_queued_sessions
        self.slots = asyncio.Semaphore(self.capacity)
        # Records are written in a thread; this lock keeps runs reaching the
        # semaphore in the order they were accepted (first come, first served).
        self.order = asyncio.Lock()
        self.active = 0
        self.pending = 0  # accepted, not yet holding a slot
        self.accepting = True
        self.runs: dict[str, asyncio.Task[SpawnerResult]] = {}
        # Renews the leases of this spawner's records while it has any (see keep_leases):
        # a timer until the next round is due, a task while a round is under way.
        self._lease_timer: asyncio.TimerHandle | None = None
        self._lease_task: asyncio.Task[None] | None = None

    def queued(self) -> int:
        return max(0, self.active + self.pending - self.capacity)

    def has_free_slot(self) -> bool:
        return self.active + self.pending < self.capacity

    def refuse_if_full(self, trigger_source: str) -> SpawnerResult | None:
        """On this host: None when the trigger may be accepted, a rejection for a
        self-trigger with no free slot; raises :class:`QueueFullError` for a full queue."""
        if self.has_free_slot():
            return None
        if trigger_source == "trigger":
            return self.rejected_self_trigger()
        if self.queued() >= self.max_queued:
            raise QueueFullError(
                f"butler {self.settings.butler.name!r} is full: {self.active} running, "
                f"{self.queued()} queued (max_queued_sessions = {self.max_queued})"
            )
        return None

    def rejected_self_trigger(self) -> SpawnerResult:
        butler = self.settings.butler
        return SpawnerResult(
            success=False,
            status="failed",
            error_kind="rejected",
            error=(
                f"rejected: butler {butler.name!r} has no free slot, and a run waiting "
                "for its own butler would deadlock; try again when the current run has finished"
            ),
            butler=butler.name,
            runtime=butler.runtime.type,
        )

    async def shared_place(self, trigger_source: str) -> Place | SpawnerResult | None:
        """A place among the butler's ``max_concurrent_sessions + max_queued_sessions``
        across every host sharing the store (PostgreSQL; None on SQLite), held until the
        run's record is closed. Refused as on one host: a full queue raises
        :class:`~spawnkit.errors.QueueFullError`, a self-trigger with no run slot free
        anywhere is rejected."""
        store, name = self.settings.store, self.settings.butler.name
        admission = store.admission(name)
        if admission is None:
            return None
        below = self.capacity if trigger_source == "trigger" else None
        ticket = await asyncio.to_thread(admission.enter, self.capacity + self.max_queued, below)
        if ticket.place is not None:
            return admission, ticket.place
        if below is not None and ticket.held >= below:
            return self.rejected_self_trigger()
        raise QueueFullError(
            f"butler {name!r} is full across the hosts sharing "
            f"{store.location}: {ticket.running} running, "
            f"{max(0, ticket.held - ticket.running)} queued "
            f"(max_queued_sessions = {self.max_queued})"
        )

    @staticmethod
    def leave(place: Place | None) -> None:
        """Give back a place in the shared queue (the run is over, or none took it)."""
        if place is not None:
            place[0].leave(place[1])

    @contextlib.asynccontextmanager
    async def slot(self) -> AsyncIterator[None]:
        """One of this host's slots: an accepted run waits here for its turn."""
        async with self.slots:
            self.pending -= 1
            self.active += 1
            try:
                yield
            finally:
                self.active -= 1

    async def shared_slot(self) -> SlotClaim | None:
        """One of the butler's ``max_concurrent_sessions`` slots across every host sharing
        the store (PostgreSQL), held until the run's record is closed; None on SQLite."""
        store = self.settings.store
        if store.url is None:  # SQLite, one host's store: no thread to learn there is none
            return None
        claim = await asyncio.to_thread(store.slot_claim, self.settings.butler.name, self.capacity)
        if claim is None:
            return None
        try:
            while True:
                if await asyncio.to_thread(claim.try_acquire) is not None:
                    return claim
                await asyncio.sleep(SLOT_POLL_S)  # held elsewhere: nothing here to wake us
        except BaseException:
            claim.release()
            raise

    def track(self, session_id: str, task: asyncio.Task[SpawnerResult]) -> None:
        """An accepted run in flight: counted, cancellable, and its record's lease renewed."""
        self.runs[session_id] = task
        self.keep_leases()

    def forget(self, session_id: str) -> None:
        """The run is over: no longer in flight, and no lease left to renew when it was
        the last one."""
        self.runs.pop(session_id, None)
        if not self.runs:  # nothing left to renew
            if self._lease_timer is not None:
                self._lease_timer.cancel()
                self._lease_timer = None
            if self._lease_task is not None:
                self._lease_task.cancel()
                self._lease_task = None

    def keep_leases(self) -> None:
        """Renew this spawner's records' leases while it has runs, unless already renewing.

        Each record belongs to this host for ``store.lease_s`` seconds; it is renewed every
        third of that, so two renewals can fail before another host takes the run for dead.
        Each round also closes other hosts' records whose lease ran out. Between rounds
        only a timer waits (no task: most runs end before the first round is due).
        """
        if self._lease_timer is None and self._lease_task is None:
            self._lease_timer = asyncio.get_running_loop().call_later(
                self.settings.store.lease_s / 3, self._renew_leases
            )

    def _renew_leases(self) -> None:
        self._lease_timer = None
        if self.runs:
            self._lease_task = asyncio.create_task(
                self._renewal(list(self.runs)), name=f"spawnkit:{self.settings.butler.name}:leases"
            )

    async def _renewal(self, held: list[str]) -> None:
        """One round, then the timer for the next one while runs are left."""
        store = self.settings.store
        try:
            await asyncio.to_thread(store.renew_leases, held)
            await asyncio.to_thread(store.expire_leases)
        except StoreError as exc:  # the server away a moment: the next round tries again
            logger.warning("could not renew the leases of %d run(s): %s", len(held), exc)
        self._lease_task = None
        if self.runs:
            self.keep_leases()

    async def cancel(self, session_id: str) -> bool:
        """Cancel one in-flight run; it is recorded as cancelled. False if not in flight."""
        task = self.runs.get(session_id)
        if task is None:
            return False
        task.cancel()
        await asyncio.wait({task}, timeout=CANCEL_GRACE_S)
        return True

    async def drain(self, timeout: float) -> dict[str, int]:  # noqa: ASYNC109 - the API asks for it
        """Wait up to ``timeout`` seconds for in-flight runs, then cancel the rest.

        Returns how many runs finished on their own and how many were cancelled.
        """
        tasks = set(self.runs.values())
        if not tasks:
            return {"finished": 0, "cancelled": 0}
        _, remaining = await asyncio.wait(tasks, timeout=max(0.0, timeout))
        for task in remaining:
            task.cancel()
        if remaining:
            await asyncio.wait(remaining, timeout=CANCEL_GRACE_S)
        return {"finished": len(tasks) - len(remaining), "cancelled": len(remaining)}
