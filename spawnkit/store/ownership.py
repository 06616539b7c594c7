"""Which host and process own a record, and what closes a record whose owner is gone.

A record belongs to the process that created it, on its host (``owner_host``,
``owner_pid``, ``owner_start``), sealed with its home's key
(:class:`~spawnkit.containment.sweep.HomeSeal`) so a sweep on that host knows the record's
workspace is its own to remove. It holds the record for a lease it renews while the run lives: a
record whose host stopped renewing is marked ``crashed`` by whichever host sees it next. A run
dispatched to a cluster is queued by its client's process and adopted by the worker's
(:mod:`spawnkit.run.dispatch`).
"""

from __future__ import annotations

import functools
import json
import logging
import os
from collections.abc import Sequence
from datetime import timedelta
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Literal

from ..home import host_name
from .backend import Backend
from .records import stamp, to_iso, utcnow

if TYPE_CHECKING:  # imported where a store is opened: see _sweep_module
    from ..containment.sweep import HomeSeal, OpenRun

logger = logging.getLogger(__name__)


def _sweep_module() -> ModuleType:
    """:mod:`spawnkit.containment.sweep`, imported when a store is opened rather than with
    :mod:`spawnkit.store`: it brings asyncio, ssl and argparse (3.5 MB resident), which a
    process that only reads history frames (``spawnkit.history`` imports the store for
    its types) never needs."""
    from ..containment import sweep

    return sweep


def _dispatched_worker(given: str | None) -> str | None:
    """The Dask worker a record's setup names (a run dispatched to a cluster), if any."""
    try:
        dispatch = json.loads(given).get("dispatch") if given else None
    except (ValueError, AttributeError):
        return None
    worker = dispatch.get("worker") if isinstance(dispatch, dict) else None
    return worker if isinstance(worker, str) else None


class RecordOwner:
    """This process as the owner of the records it writes: its host, pid, seal and lease."""

    def __init__(self, lease_s: float) -> None:
        self.host = host_name()
        # How long a record stays this host's without a renewal (spawnkit.home.lease_seconds).
        self.lease_s = lease_s
        self.pid = os.getpid()
        # This home's key for sealing records, read when the first is written (False: none).
        self._sealer: HomeSeal | Literal[False] | None = None

    @functools.cached_property
    def pid_start(self) -> str | None:
        """When this process started (a later process with its pid is not it), read when the
        first record is written."""
        from ..containment.liveness import process_start

        return process_start(self.pid)

    @property
    def key(self) -> tuple[str, int]:
        """(host, pid): what the records this process creates carry as their owner."""
        return self.host, self.pid

    def lease_end(self) -> str:
        return stamp(utcnow() + timedelta(seconds=self.lease_s))

    def seal(self, session_id: str, workspace: Path | None) -> str | None:
        """This home's seal on a record this process owns (containment.sweep.HomeSeal); None when
        the home has no key (the sweep then kills and removes nothing for the run)."""
        sealer = self._sealer
        if sealer is None:
            found: HomeSeal | None = _sweep_module().HomeSeal.of_home(create=True)
            sealer = self._sealer = found or False
        if sealer is False:
            return None
        return sealer.seal(session_id, self.host, self.pid, self.pid_start, workspace)


class HostRecords:
    """The statements on records as their owners: leases renewed and expired, this host's
    open runs, a dispatched run's record adopted, closed or withdrawn, a record marked
    ``crashed``. The :class:`~spawnkit.store.SessionStore` methods of the same names say
    what each promises."""

    def __init__(self, db: Backend, owner: RecordOwner) -> None:
        self._db = db
        self._owner = owner

    def renew_leases(self, session_ids: Sequence[str]) -> int:
        if not session_ids:
            return 0
        marks = ", ".join("?" for _ in session_ids)
        with self._db.transaction() as tx:
            return tx.execute(
                f"UPDATE sessions SET lease_until = ? WHERE id IN ({marks}) "
                "AND owner_host = ? AND completed_at IS NULL",
                (self._owner.lease_end(), *session_ids, self._owner.host),
            )

    def expire_leases(self) -> list[str]:
        """One statement, so when several hosts see the same record at once, one of them
        closes it."""
        host = self._owner.host
        now = stamp(utcnow())
        with self._db.transaction() as tx:
            rows = tx.query(
                "UPDATE sessions SET status = 'crashed', success = 0, error_kind = 'crash', "
                "completed_at = ?, "
                "error = 'the lease of host ' || COALESCE(owner_host, 'unknown') || "
                "' ran out at ' || lease_until || ' without a renewal: the host died or lost "
                "the network before the run completed (seen by ' || ? || ')' "
                "WHERE completed_at IS NULL AND lease_until < ? "
                "AND (owner_host IS NULL OR owner_host <> ?) RETURNING id",
                (now, host, now, host),
            )
        expired = [str(r["id"]) for r in rows]
        for session_id in expired:
            logger.warning("session %s: its host's lease ran out; marked crashed", session_id)
        return expired

    def open_runs_here(self) -> list[OpenRun]:
        host = self._owner.host
        rows = self._db.query(
            "SELECT id, owner_pid, owner_start, workspace, given, owner_seal FROM sessions "
            "WHERE completed_at IS NULL AND owner_host = ?",
            (host,),
        )
        if not rows:  # the usual case, without loading the sweep
            return []
        open_run = _sweep_module().OpenRun
        return [
            open_run(r["id"], r["owner_pid"], r["owner_start"],
                    Path(r["workspace"]) if r["workspace"] else None,
                    _dispatched_worker(r["given"]), host, r["owner_seal"])
            for r in rows
            if r["owner_pid"] is not None
        ]  # fmt: skip

    def adopt_session(
        self,
        session_id: str,
        *,
        queued_by: tuple[str, int],
        model: str | None,
        prompt: str,
        context: str | None,
        runtime_session_id: str | None,
        log_dir: Path | None,
    ) -> bool:
        owner = self._owner
        params = (
            owner.host, owner.pid, owner.pid_start, owner.seal(session_id, None),
            owner.lease_end(), model, prompt, context, runtime_session_id,
            str(log_dir) if log_dir else None, session_id, *queued_by,
        )  # fmt: skip
        with self._db.transaction() as tx:
            return (
                tx.execute(
                    "UPDATE sessions SET owner_host = ?, owner_pid = ?, owner_start = ?, "
                    "owner_seal = ?, lease_until = ?, model = COALESCE(?, model), prompt = ?, "
                    "context = ?, runtime_session_id = ?, log_dir = ? "
                    "WHERE id = ? AND completed_at IS NULL "
                    "AND started_at IS NULL AND owner_host = ? AND owner_pid = ?",
                    params,
                )
                > 0
            )

    def close_queued(
        self, session_id: str, status: str, error: str | None, error_kind: str | None
    ) -> bool:
        with self._db.transaction() as tx:
            return (
                tx.execute(
                    "UPDATE sessions SET status = ?, success = 0, error = ?, error_kind = ?, "
                    "completed_at = ? WHERE id = ? AND completed_at IS NULL "
                    "AND started_at IS NULL AND owner_host = ? AND owner_pid = ?",
                    (status, error, error_kind, to_iso(utcnow()), session_id, *self._owner.key),
                )
                > 0
            )

    def withdraw_queued(self, session_id: str) -> bool:
        with self._db.transaction() as tx:
            return (
                tx.execute(
                    "DELETE FROM sessions WHERE id = ? AND completed_at IS NULL "
                    "AND started_at IS NULL AND owner_host = ? AND owner_pid = ?",
                    (session_id, *self._owner.key),
                )
                > 0
            )

    def mark_crashed(self, session_id: str, reason: str) -> bool:
        with self._db.transaction() as tx:
            return (
                tx.execute(
                    "UPDATE sessions SET status = 'crashed', success = 0, error_kind = 'crash', "
                    "error = ?, completed_at = ? WHERE id = ? AND completed_at IS NULL",
                    (reason, to_iso(utcnow()), session_id),
                )
                > 0
            )
