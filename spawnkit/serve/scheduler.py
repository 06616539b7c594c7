"""Fires a butler's ``[[butler.schedule]]`` entries on their cron expressions.

While a butler serves, each entry triggers its prompt with trigger source
``schedule:<name>``. Cron expressions are evaluated by ``croniter`` (five
fields, or six with seconds last) in UTC. A fire that finds the butler's queue
full is logged and skipped, never retried in a burst; a fire missed while the
process was down is not replayed.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from datetime import UTC, datetime

from croniter import croniter

from ..config.butler_config import Schedule
from ..errors import SpawnkitError
from ..run import Spawner

logger = logging.getLogger(__name__)

# Sleep in bounded steps so a changed wall clock is noticed within this long.
MAX_SLEEP_S = 30.0


def _utcnow() -> datetime:
    return datetime.now(UTC)


class Scheduler:
    """Triggers scheduled prompts on a spawner until cancelled."""

    def __init__(
        self,
        spawner: Spawner,
        schedules: tuple[Schedule, ...] | None = None,
        now: Callable[[], datetime] = _utcnow,
    ) -> None:
        self.spawner = spawner
        self.schedules = schedules if schedules is not None else spawner.butler.schedules
        self._now = now
        self._next: dict[str, datetime] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self.fired: list[tuple[str, datetime]] = []

    def next_runs(self) -> dict[str, datetime]:
        """When each schedule fires next."""
        now = self._now()
        for schedule in self.schedules:
            if schedule.name not in self._next:
                self._next[schedule.name] = croniter(schedule.cron, now).get_next(datetime)
        return dict(self._next)

    def tick(self) -> list[str]:
        """Fire every schedule that is due now; returns the names fired."""
        now = self._now()
        due = [s for s in self.schedules if self.next_runs()[s.name] <= now]
        for schedule in due:
            self._next[schedule.name] = croniter(schedule.cron, now).get_next(datetime)
            self.fired.append((schedule.name, now))
            task = asyncio.create_task(self._fire(schedule), name=f"schedule:{schedule.name}")
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        return [s.name for s in due]

    async def join(self) -> None:
        """Wait until every fired trigger has finished (or been refused)."""
        while self._tasks:
            await asyncio.gather(*self._tasks)

    async def _fire(self, schedule: Schedule) -> None:
        try:
            result = await self.spawner.trigger(
                schedule.prompt, trigger_source=f"schedule:{schedule.name}"
            )
        except SpawnkitError as exc:
            logger.warning(
                "schedule %s of %s skipped: %s", schedule.name, self.spawner.butler.name, exc
            )
            return
        if not result.success:
            logger.warning("schedule %s failed: %s", schedule.name, result.error)

    async def run(self) -> None:
        """Fire schedules forever (until the task is cancelled)."""
        if not self.schedules:
            return
        while True:
            self.tick()
            wait = min(t for t in self.next_runs().values()) - self._now()
            await asyncio.sleep(min(MAX_SLEEP_S, max(0.01, wait.total_seconds())))
