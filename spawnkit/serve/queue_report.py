"""How a butler's queue and budget stand: wait times, cool-downs, spend against the budget.

:func:`queue_report` reads a butler's recent records from the store: how long its runs
waited for their first start (``started_at - created_at``: a free slot, the cool-down, the
stagger) as p50 and p90, how many starts waited on a rate limit's cool-down and for how
long, and what the butler spent today (UTC) against its ``daily_cost_usd``. The cool-down in
effect right now is the spawner's to say (:attr:`SpawnerStatus.cooldown_s`) and is passed in.
``%spawn_status`` and the dashboard show the same report.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from ..budgets.budget import day_start
from ..config.butler_config import ButlerConfig
from ..store import SessionStore

# The records the wait percentiles are taken from: the butler's most recent runs.
WINDOW = 200


@dataclass(frozen=True)
class QueueReport:
    """One butler's queue waits, cool-downs and spend against its daily budget."""

    butler: str
    # Runs the percentiles come from (started ones among the last WINDOW).
    runs: int = 0
    wait_p50_s: float | None = None
    wait_p90_s: float | None = None
    # Seconds left of the cool-down in effect (0: none).
    cooldown_s: float = 0.0
    # Starts among those runs that waited on a cool-down, and for how long in all.
    cooldown_waits: int = 0
    cooldown_waited_s: float = 0.0
    spent_today_usd: float = 0.0
    daily_cost_usd: float | None = None

    @property
    def budget_text(self) -> str:
        """``$1.2300 / $5 today`` (``$1.2300 today`` without a daily budget)."""
        spent = f"${self.spent_today_usd:.4f}"
        if self.daily_cost_usd is None:
            return f"{spent} today"
        return f"{spent} / ${self.daily_cost_usd:g} today"

    @property
    def wait_text(self) -> str:
        """``wait p50 0.4 s · p90 2.1 s`` (``no waits yet`` before any run started)."""
        if self.wait_p50_s is None or self.wait_p90_s is None:
            return "no waits yet"
        return f"wait p50 {self.wait_p50_s:.1f} s · p90 {self.wait_p90_s:.1f} s"


def percentile(values: Sequence[float], q: float) -> float | None:
    """The ``q`` (0-100) percentile of ``values`` by nearest rank; None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


def queue_report(
    store: SessionStore,
    butler: ButlerConfig,
    *,
    cooldown_s: float = 0.0,
    window: int = WINDOW,
) -> QueueReport:
    """The report of ``butler`` from its last ``window`` records in ``store``."""
    records = store.list_sessions(butler=butler.name, limit=window)
    waits = [
        max(0.0, (r.started_at - r.created_at).total_seconds())
        for r in records
        if r.started_at is not None
    ]
    cooled = [a.cooldown_s for r in records for a in r.attempts if a.cooldown_s > 0]
    return QueueReport(
        butler=butler.name,
        runs=len(waits),
        wait_p50_s=percentile(waits, 50),
        wait_p90_s=percentile(waits, 90),
        cooldown_s=round(cooldown_s, 3),
        cooldown_waits=len(cooled),
        cooldown_waited_s=round(sum(cooled), 3),
        spent_today_usd=store.spent_since(butler.name, day_start()),
        daily_cost_usd=butler.limits.daily_cost_usd,
    )
