"""What is going on in a shared store, on every host, kept up to date by its change feed.

:class:`LiveStatus` is the model behind ``%spawn_status --live`` and the dashboard's
"every host" line, with no widget in it (tests drive it without a browser). It listens
to a :class:`~spawnkit.store.listen.ChangeFeed` and, on each wake-up, turns the changes
into :attr:`LiveStatus.updates` (one line per step a run took: queued, started, a tool
call started or ended, ended, in the order they committed) and re-reads the runs still
open from the store. Nothing polls: between wake-ups it does no work at all. After the
feed reconnected (``resync``) it re-reads everything and says so in the updates.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..store import SessionRecord, SessionStore

if TYPE_CHECKING:  # psycopg loads only when a PostgreSQL store is used
    from ..store.listen import Change, ChangeFeed, Wake

logger = logging.getLogger(__name__)

MAX_UPDATES = 200
MAX_SEEN = 10_000
OPEN_LIMIT = 200
ENDED = ("success", "failed", "cancelled", "crashed", "timeout", "budget")


@dataclass(frozen=True)
class Update:
    """One step of a run as the feed reported it."""

    host: str
    butler: str
    session: str
    what: str  # queued, running, tool <name> running/ok/error, or the end status

    def line(self) -> str:
        return f"{self.host} · {self.butler} · {self.session[:8]} · {self.what}"


@dataclass(frozen=True)
class OpenRun:
    """A run not yet ended, on any host, with the tool calls it made so far."""

    record: SessionRecord
    tools: tuple[str, ...]


def updates_of(changes: tuple[Change, ...], seen: dict[tuple[str, ...], None]) -> list[Update]:
    """The new steps among ``changes``; ``seen`` remembers steps already reported (a run's
    end rewrites its tool calls, a setup write repeats its status: neither is a step),
    the oldest forgotten past :data:`MAX_SEEN`."""
    found: list[Update] = []
    for c in changes:
        if c.session is None or c.op == "DELETE":
            continue
        if c.table == "sessions" and c.status:
            key: tuple[str, ...] = (c.session, c.status)
            what = c.status
        elif c.table == "tool_calls" and c.status:
            key = (c.session, str(c.seq), c.status)
            what = f"tool {c.name or '?'} {c.status}"
        else:
            continue
        if key in seen:
            continue
        seen[key] = None
        while len(seen) > MAX_SEEN:
            del seen[next(iter(seen))]
        found.append(Update(c.host or "?", c.butler or "?", c.session, what))
    return found


class LiveStatus:
    """Runs in flight on every host sharing ``store``, refreshed on ``feed``'s wake-ups.

    ``on_change`` callables run (on the feed's loop) after each refresh. Call
    :meth:`attach` on the loop the feed runs on.
    """

    def __init__(self, store: SessionStore, feed: ChangeFeed) -> None:
        self.store = store
        self.feed = feed
        self.updates: deque[Update] = deque(maxlen=MAX_UPDATES)
        self.open_runs: list[OpenRun] = []
        self.resyncs = 0
        self.wakes = 0
        self.refreshes = 0  # reads of the store: one per burst of wake-ups, never on a timer
        self.reported = 0  # steps ever reported (updates keeps the last MAX_UPDATES)
        self.on_change: list[Callable[[LiveStatus], object]] = []
        self._seen: dict[tuple[str, ...], None] = {}  # an ordered set
        self._pending: list[Wake] = []
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._unsubscribe: Callable[[], None] | None = None

    def attach(self) -> None:
        """Subscribe to the feed and refresh on its wake-ups (call on the feed's loop)."""
        if self._task is not None:
            return
        self._unsubscribe = self.feed.subscribe(self._woken)
        self._task = asyncio.get_running_loop().create_task(self._refresh_on_wake())
        self._wake.set()  # a first read of what is open now

    def detach(self) -> None:
        if self._unsubscribe is not None:
            self._unsubscribe()
        if self._task is not None:
            self._task.cancel()
            self._task = None

    def _woken(self, wake: Wake) -> None:
        self._pending.append(wake)
        self._wake.set()

    async def _refresh_on_wake(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            wakes, self._pending = self._pending, []
            self.wakes += len(wakes)
            for wake in wakes:
                if wake.resync:
                    self.resyncs += 1
                found = updates_of(wake.changes, self._seen)
                self.updates.extend(found)
                self.reported += len(found)
            try:
                await self.refresh()
            except Exception:  # a failed read must not stop the next wake-up's
                logger.exception("spawnkit live status: refresh failed")
                continue
            for callback in list(self.on_change):
                try:
                    callback(self)
                except Exception:
                    logger.exception("spawnkit live status: %r failed", callback)

    async def refresh(self) -> None:
        """Read the runs still open (and their tool calls so far) from the store."""
        self.refreshes += 1
        records = await asyncio.to_thread(self.store.open_sessions, OPEN_LIMIT)
        calls = await asyncio.to_thread(self.store.tool_call_names, [r.id for r in records])
        self.open_runs = [OpenRun(r, tuple(calls.get(r.id, ()))) for r in records]

    def rows(self) -> list[dict[str, object]]:
        """One row per open run: host, butler, session, status, tool calls so far."""
        return [
            {"host": run.record.owner_host, "butler": run.record.butler,
             "session": run.record.id[:8], "status": run.record.status,
             "tool_calls": len(run.tools), "last_tool": run.tools[-1] if run.tools else None}
            for run in self.open_runs
        ]  # fmt: skip

    def lines(self) -> list[str]:
        return [u.line() for u in self.updates]
