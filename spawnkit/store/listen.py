"""Live changes of a PostgreSQL store, from any host: a feed of debounced wake-ups.

Every change of a session, a tool call or butler state in a PostgreSQL store sends a
``NOTIFY spawnkit`` (the store's migration 5). A :class:`ChangeFeed` holds one dedicated
connection that ``LISTEN``\\ s on that channel and hands its consumers a :class:`Wake`:
the changes seen within :data:`DEBOUNCE_S` of the first one, so that a run's end (its
record and its tool calls, one transaction) or a burst of runs makes one refresh, not
dozens. A notification is a wake-up, not a log: consumers read what they show from the
store, and a payload only tells them which session or butler changed.

Notifications reach only the sessions listening when the change commits, so a feed that
lost its connection (the server restarted, the network went away) cannot know what it
missed. It reconnects, with a growing pause, for as long as it runs, and its first wake-up
after that says ``resync``: read everything again. While connected and idle it checks the
connection every :data:`HEARTBEAT_S` (one ``SELECT 1``, never a read of the data), and
``tcp_user_timeout`` makes a silent network loss an error within seconds.

The feed is a coroutine on an asyncio loop (``await feed.run()``, or ``async with feed``),
with psycopg's ``AsyncConnection`` rather than a thread with a blocking connection: in a
notebook it runs on spawnkit's background loop, the loop the dashboard already refreshes
on, so a wake-up needs no hand-off between threads. A SQLite store has no feed
(:func:`feed_for` returns None): there is nobody else to hear from, and views keep their
own refresh.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

import psycopg

from .backend import redact_url
from .postgres import CHANNEL, CONNECT_TIMEOUT_S
from .session_store import SessionStore

logger = logging.getLogger(__name__)

DEBOUNCE_S = 0.1
HEARTBEAT_S = 5.0
RECONNECT_MIN_S = 0.2
RECONNECT_MAX_S = 5.0
# Changes one wake-up carries at most; past that it says resync instead.
MAX_CHANGES = 500
TCP_USER_TIMEOUT_MS = 5000


@dataclass(frozen=True)
class Change:
    """One notification: which table, what operation, and which session and butler."""

    table: str
    op: str
    session: str | None = None
    butler: str | None = None
    status: str | None = None
    host: str | None = None
    seq: int | None = None
    name: str | None = None

    @classmethod
    def parse(cls, payload: str) -> Change:
        try:
            data = json.loads(payload)
        except ValueError:
            return cls(table="?", op="?")
        if not isinstance(data, dict):
            return cls(table="?", op="?")
        seq = data.get("seq")
        return cls(
            table=str(data.get("table", "?")),
            op=str(data.get("op", "?")),
            session=data.get("session"),
            butler=data.get("butler"),
            status=data.get("status"),
            host=data.get("host"),
            seq=seq if isinstance(seq, int) else None,
            name=data.get("name"),
        )


@dataclass(frozen=True)
class Wake:
    """What a consumer is woken with: the changes since the last wake-up, in commit order.

    ``resync`` means changes may have been missed (the feed reconnected, or there were more
    than :data:`MAX_CHANGES`): read everything shown again.
    """

    changes: tuple[Change, ...] = ()
    resync: bool = False

    @property
    def sessions(self) -> set[str]:
        return {c.session for c in self.changes if c.session}

    @property
    def butlers(self) -> set[str]:
        return {c.butler for c in self.changes if c.butler}


Consumer = Callable[[Wake], object]


@dataclass
class FeedStats:
    notifications: int = 0
    wakes: int = 0
    connects: int = 0
    disconnects: int = 0
    last_error: str | None = field(default=None)


class ChangeFeed:
    """Debounced wake-ups from a PostgreSQL store's ``NOTIFY`` channel, surviving restarts.

    ``subscribe(consumer)`` registers a callable that gets each :class:`Wake` on the feed's
    loop (keep it short: schedule work, do not do it). ``async with ChangeFeed(url) as
    feed`` runs the feed in a task and returns once it listens; :meth:`run` is the same
    loop for callers that own the task.
    """

    def __init__(
        self,
        url: str,
        *,
        debounce_s: float = DEBOUNCE_S,
        heartbeat_s: float = HEARTBEAT_S,
        channel: str = CHANNEL,
    ) -> None:
        self.url = url
        self.location = redact_url(url)
        self.debounce_s = debounce_s
        self.heartbeat_s = heartbeat_s
        self.channel = channel
        self.stats = FeedStats()
        # Set while the feed listens; cleared while it is disconnected.
        self.listening = asyncio.Event()
        self._consumers: list[Consumer] = []
        self._task: asyncio.Task[None] | None = None

    def subscribe(self, consumer: Consumer) -> Callable[[], None]:
        """Wake ``consumer`` on every change; the function returned unsubscribes it."""
        self._consumers.append(consumer)

        def unsubscribe() -> None:
            with contextlib.suppress(ValueError):
                self._consumers.remove(consumer)

        return unsubscribe

    async def run(self) -> None:
        """Listen until cancelled, reconnecting whenever the connection is lost."""
        pause = RECONNECT_MIN_S
        while True:
            try:
                await self._listen()
            except (psycopg.Error, OSError) as exc:
                detail = " ".join(str(exc).split()).replace(self.url, self.location)
                if self.listening.is_set():
                    self.stats.disconnects += 1
                    logger.warning("change feed %s lost: %s", self.location, detail)
                    pause = RECONNECT_MIN_S
                else:
                    logger.debug("change feed %s: cannot connect: %s", self.location, detail)
                self.stats.last_error = detail
            finally:
                self.listening.clear()
            await asyncio.sleep(pause)
            pause = min(pause * 2, RECONNECT_MAX_S)

    async def _listen(self) -> None:
        conn = await psycopg.AsyncConnection.connect(
            self.url, autocommit=True, connect_timeout=CONNECT_TIMEOUT_S,
            application_name="spawnkit-feed",
            options=f"-c tcp_user_timeout={TCP_USER_TIMEOUT_MS}",
        )  # fmt: skip
        async with conn:
            await conn.execute(f"LISTEN {self.channel}")
            self.stats.connects += 1
            self.listening.set()
            if self.stats.connects > 1:
                # Whatever committed while we were away was never sent to us.
                self._deliver(Wake(resync=True))
            loop = asyncio.get_running_loop()
            while True:
                first = [
                    n.payload async for n in conn.notifies(timeout=self.heartbeat_s, stop_after=1)
                ]
                if not first:
                    await conn.execute("SELECT 1")  # the connection, not the data
                    continue
                batch = first
                deadline = loop.time() + self.debounce_s
                while (left := deadline - loop.time()) > 0:
                    batch += [n.payload async for n in conn.notifies(timeout=left)]
                self.stats.notifications += len(batch)
                if len(batch) > MAX_CHANGES:
                    self._deliver(Wake(resync=True))
                else:
                    self._deliver(Wake(tuple(Change.parse(p) for p in batch)))

    def _deliver(self, wake: Wake) -> None:
        self.stats.wakes += 1
        for consumer in list(self._consumers):
            try:
                consumer(wake)
            except Exception:
                # One broken view must not stop the others' updates.
                logger.exception("change feed consumer %r failed", consumer)

    async def start(self, wait_s: float = CONNECT_TIMEOUT_S) -> None:
        """Run the feed in a task and wait (bounded) until it listens.

        A server that is down is not an error: the feed keeps trying and wakes its
        consumers with ``resync`` once it gets through.
        """
        if self._task is None:
            self._task = asyncio.create_task(self.run(), name=f"spawnkit-feed {self.location}")
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.listening.wait(), wait_s)

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def __aenter__(self) -> ChangeFeed:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()


def feed_for(store: SessionStore, **options: Any) -> ChangeFeed | None:
    """A feed of ``store``'s changes, or None for a SQLite store (which has none)."""
    url = store.url
    return None if url is None else ChangeFeed(url, **options)
