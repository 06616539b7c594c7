"""Schedules fire on their cron expressions as ``schedule:<name>`` triggers."""

from __future__ import annotations

import asyncio
import logging
from datetime import UTC, datetime, timedelta

from spawnkit.run import Spawner
from spawnkit.serve.scheduler import Scheduler
from spawnkit.serve.service import ButlerService

from .fakes import FakeAdapter, Gate

SCHEDULES = """
[[butler.schedule]]
name = "morning"
cron = "0 8 * * *"
prompt = "Good morning digest."

[[butler.schedule]]
name = "hourly"
cron = "30 * * * *"
prompt = "Hourly check."
"""


class Clock:
    def __init__(self, at: datetime) -> None:
        self.at = at

    def __call__(self) -> datetime:
        return self.at


async def test_tick_fires_due_schedules_with_their_source(make_butler, store) -> None:
    butler = make_butler(extra=SCHEDULES)
    adapter = FakeAdapter()
    spawner = Spawner(butler, store=store, adapter=adapter)
    clock = Clock(datetime(2026, 11, 22, 7, 10, tzinfo=UTC))
    scheduler = Scheduler(spawner, now=clock)
    assert scheduler.next_runs() == {
        "morning": datetime(2026, 11, 22, 8, 0, tzinfo=UTC),
        "hourly": datetime(2026, 11, 22, 7, 30, tzinfo=UTC),
    }
    assert scheduler.tick() == []
    clock.at = datetime(2026, 11, 22, 8, 0, 5, tzinfo=UTC)
    assert scheduler.tick() == ["morning", "hourly"]
    assert scheduler.tick() == [], "a schedule fires once per due time"
    await asyncio.wait_for(scheduler.join(), 10)
    sources = sorted((r.trigger_source, r.prompt) for r in store.list_sessions())
    assert sources == [
        ("schedule:hourly", "Hourly check."),
        ("schedule:morning", "Good morning digest."),
    ]
    assert scheduler.next_runs()["morning"] == datetime(2026, 11, 23, 8, 0, tzinfo=UTC)
    assert scheduler.next_runs()["hourly"] == datetime(2026, 11, 22, 8, 30, tzinfo=UTC)


async def test_a_full_queue_skips_the_fire(make_butler, store, caplog) -> None:
    butler = make_butler(
        extra=SCHEDULES
        + "\n[butler.runtime]\nmax_concurrent_sessions = 1\nmax_queued_sessions = 0\n"
    )
    adapter = FakeAdapter()
    adapter.gate = Gate(open_=False)
    spawner = Spawner(butler, store=store, adapter=adapter)
    busy = asyncio.create_task(spawner.trigger("busy"))
    async with asyncio.timeout(5):
        while not adapter.specs:
            await asyncio.sleep(0.01)
    clock = Clock(datetime(2026, 11, 22, 8, 0, 5, tzinfo=UTC))
    scheduler = Scheduler(spawner, now=clock)
    scheduler._next = {s.name: clock.at - timedelta(seconds=1) for s in scheduler.schedules}
    with caplog.at_level(logging.WARNING):
        assert scheduler.tick() == ["morning", "hourly"]
        await asyncio.wait_for(scheduler.join(), 10)
    assert "skipped" in caplog.text and "is full" in caplog.text
    adapter.gate.open()
    await busy
    assert store.count_sessions() == 1


async def test_a_serving_butler_fires_schedules_in_real_time(make_butler, store) -> None:
    butler = make_butler(
        extra='[[butler.schedule]]\nname = "every_second"\ncron = "* * * * * *"\nprompt = "Tick."\n'
    )
    async with ButlerService(butler, store=store, schedules=True, adapter=FakeAdapter()):
        async with asyncio.timeout(10):
            while not store.list_sessions(status="success"):
                await asyncio.sleep(0.05)
    record = store.list_sessions(status="success")[-1]
    assert (record.trigger_source, record.prompt) == ("schedule:every_second", "Tick.")
