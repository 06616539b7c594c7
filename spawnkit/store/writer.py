"""How the store makes its named writes: now, or later from the journal.

On SQLite, a file on this machine, a write succeeds or fails at once, with nothing to
replay. On a server, a write the server cannot take (it is away) waits in this machine's
journal (:mod:`spawnkit.store.journal`), and so does every later one, so they keep their
order; a background thread replays them, with a growing wait, until the journal is empty
or the store is closed.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from ..errors import StoreUnreachable
from .backend import Backend
from .journal import StoreJournal
from .writes import WRITES

logger = logging.getLogger(__name__)

# A write that failed faster than this was on a pooled connection the server had already
# dropped (it restarted): tried once more, on a fresh one, before it is journaled.
_STALE_CONNECTION_S = 1.0
# The background replay of the journal: first retry, and the longest wait between two.
RETRY_FIRST_S = 0.5
RETRY_MAX_S = 10.0


class StoreWriter:
    """Makes the :data:`~spawnkit.store.writes.WRITES` against ``db``, journaling those a
    server away could not take (``journal`` is None on SQLite). ``singles`` names the
    writes that are one statement on this engine (committed without BEGIN and COMMIT)."""

    def __init__(self, db: Backend, journal: StoreJournal | None, singles: frozenset[str]):
        self._db = db
        self.journal = journal
        self._singles = singles
        self._retrier: threading.Thread | None = None
        self._retrier_lock = threading.Lock()
        self._wake = threading.Event()
        self._closing = threading.Event()

    def catch_up(self) -> None:
        """Replay what an earlier process left in the journal, and keep at it in the
        background while the server is away."""
        if self.journal is not None and self.journal.maybe_pending:
            self.replay()
            if self.journal.maybe_pending:
                self._retry_soon()

    def pending(self) -> int:
        return self.journal.pending() if self.journal is not None else 0

    def write(self, op: str, session_id: str | None, payload: Any) -> None:
        """One write: made now, or kept in the journal while the server is away (and
        while earlier writes wait there, so they keep their order)."""
        journal = self.journal
        if journal is None:
            try:
                with self._db.transaction(op in self._singles) as tx:
                    WRITES[op](tx, payload, False)
            except self._db.errors as exc:
                raise self._db.error(exc) from exc
            return
        if journal.maybe_pending:
            journal.append(op, session_id, payload, "behind earlier writes still waiting")
            self._retry_soon()
            return
        started = time.monotonic()
        replayed = False
        while True:
            try:
                with self._db.transaction(op in self._singles and not replayed) as tx:
                    WRITES[op](tx, payload, replayed)
                return
            except self._db.errors as exc:
                error = self._db.error(exc)
                if not isinstance(error, StoreUnreachable):
                    raise error from exc
                if not replayed and time.monotonic() - started < _STALE_CONNECTION_S:
                    replayed = True  # the first try may have been committed
                    continue
                journal.append(op, session_id, payload, str(error))
                logger.warning(
                    "%s; %s of session %s is kept in %s and written when the server is back",
                    error, op, session_id, journal.path,
                )  # fmt: skip
                self._retry_soon()
                return

    def replay(self) -> int:
        """Write what the journal keeps, oldest first; how many were written (see
        :meth:`~spawnkit.store.SessionStore.replay_journal`)."""
        journal = self.journal
        if journal is None:
            return 0
        written = 0
        with journal.replaying() as mine:
            if not mine:
                return 0
            while True:
                journal.maybe_pending = False  # an append from now on sets it again
                entry = journal.first()
                if entry is None:
                    break
                journal.maybe_pending = True
                try:
                    with self._db.transaction() as tx:
                        WRITES[entry.op](tx, entry.payload, True)
                except self._db.errors as exc:
                    error = self._db.error(exc)
                    if isinstance(error, StoreUnreachable):
                        journal.retry_later(entry, str(error))
                        break
                    journal.give_up(entry, str(error))
                    logger.error(
                        "%s refused the journaled %s of session %s (%s); it stays in %s, "
                        "marked failed", self._db.location, entry.op, entry.session_id, error,
                        journal.path,
                    )  # fmt: skip
                    continue
                journal.done(entry)
                written += 1
        if written:
            logger.warning("%s is back: wrote %d journaled write(s)", self._db.location, written)
        return written

    def close(self) -> None:
        """Stop the background replay (it may wait on a server still away: not for long)."""
        self._closing.set()
        self._wake.set()
        retrier = self._retrier
        if retrier is not None:
            retrier.join(timeout=1.0)

    def _retry_soon(self) -> None:
        """Replay the journal in a background thread, now and then with a growing wait,
        until it is empty or the store is closed."""
        with self._retrier_lock:
            self._wake.set()
            if self._retrier is not None and self._retrier.is_alive():
                return
            self._retrier = threading.Thread(
                target=self._retry_journal, name="spawnkit-store-journal", daemon=True
            )
            self._retrier.start()

    def _retry_journal(self) -> None:
        journal = self.journal
        assert journal is not None
        wait = RETRY_FIRST_S
        while not self._closing.is_set():
            self._wake.wait(wait)
            self._wake.clear()
            if self._closing.is_set():
                return
            if self.replay() or not journal.maybe_pending:
                wait = RETRY_FIRST_S
            else:
                wait = min(wait * 2, RETRY_MAX_S)
            with self._retrier_lock:
                if not journal.maybe_pending and not self._wake.is_set():
                    self._retrier = None
                    return
