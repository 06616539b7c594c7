"""A butler's queue report (waits p50/p90, cool-downs, spend against its daily budget), and
the dashboard card that shows it, built as widgets without a browser."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from spawnkit.notebook.hub import Hub, Target
from spawnkit.notebook.widgets import ButlerDashboard
from spawnkit.result import Attempt, SpawnerResult
from spawnkit.serve.queue_report import percentile, queue_report
from spawnkit.store import SessionStore

NOW = datetime.now(UTC)


def test_percentiles_by_nearest_rank() -> None:
    assert percentile([], 50) is None
    assert percentile([3.0], 90) == 3.0
    waits = [float(n) for n in range(1, 11)]  # 1..10
    assert (percentile(waits, 50), percentile(waits, 90), percentile(waits, 100)) == (5, 9, 10)
    assert percentile(list(reversed(waits)), 50) == 5, "order does not matter"


def add_run(store: SessionStore, sid: str, waited_s: float, *, cost: float | None = None,
            cooldown_s: float = 0.0, butler: str = "health") -> None:  # fmt: skip
    created = NOW - timedelta(minutes=5)
    started = created + timedelta(seconds=waited_s)
    store.create_session(
        sid, butler=butler, runtime="codex", model=None, prompt="p", context=None,
        trigger_source="external", created_at=created,
    )  # fmt: skip
    store.mark_started(sid, started_at=started)
    attempt = Attempt(1, started, started + timedelta(seconds=1), "ok", cooldown_s=cooldown_s)
    store.complete_session(sid, SpawnerResult(cost_usd=cost, attempts=(attempt,)))


def test_the_report_reads_waits_cool_downs_and_spend_from_the_records(
    store: SessionStore, make_butler: Any
) -> None:
    butler = make_butler(extra="[butler.limits]\ndaily_cost_usd = 2\n")
    for n, waited in enumerate([0.0, 0.5, 1.0, 2.0, 8.0]):
        add_run(store, f"s{n}", waited, cost=0.25, cooldown_s=1.5 if waited == 8.0 else 0.0)
    add_run(store, "other", 100.0, cost=9.0, butler="finance")  # not this butler's
    store.create_session(
        "queued", butler="health", runtime="codex", model=None, prompt="p", context=None,
        trigger_source="external",
    )  # fmt: skip
    report = queue_report(store, butler, cooldown_s=1.25)
    assert report.runs == 5, "the queued run has not waited a known time yet"
    assert (report.wait_p50_s, report.wait_p90_s) == (1.0, 8.0)
    assert (report.cooldown_waits, report.cooldown_waited_s) == (1, 1.5)
    assert report.cooldown_s == 1.25
    assert (report.spent_today_usd, report.daily_cost_usd) == (1.25, 2.0)
    assert report.budget_text == "$1.2500 / $2 today"
    assert report.wait_text == "wait p50 1.0 s · p90 8.0 s"
    empty = queue_report(store, make_butler(name="idle"))
    assert (empty.runs, empty.wait_text, empty.budget_text) == (0, "no waits yet", "$0.0000 today")


REFUSED = """
[[turn]]
error = { status = 429, type = "rate_limit_error", message = "Too many requests" }
"""


@pytest.mark.e2e
def test_the_dashboard_card_shows_waits_a_cool_down_in_effect_and_the_budget(
    store: SessionStore, make_butler: Any, tmp_path: Path
) -> None:
    butler = make_butler(
        extra='[butler.runtime]\ntype = "codex"\nmodel = "replay-gpt-5"\n'
        "[butler.limits]\ndaily_cost_usd = 3\n"
        "[butler.retry]\nmax_attempts = 2\nbackoff_s = 1.5\nmax_backoff_s = 6\n"
    )
    add_run(store, "earlier", 0.5, cost=0.75)
    scenario = tmp_path / "refused.toml"
    scenario.write_text(REFUSED)
    hub = Hub(store)
    dashboard = ButlerDashboard(butler.roster_dir, hub=hub, refresh_s=3600)
    try:
        result = hub.start(Target(butler, replay=scenario), "hello").result(timeout=120)
        assert result.error_kind == "rate_limit" and len(result.attempts) == 2
        hub.loop.submit(dashboard.refresh()).future.result(timeout=30)
        text = dashboard.cards["health"].pacing.value
    finally:
        dashboard.close()
        hub.close()
    # The new run started at once (0.0 s; 0.1 on a loaded machine), the earlier one after 0.5 s.
    assert re.search(r"wait p50 0\.[0-4] s · p90 0\.5 s", text), text
    assert "<b>cool-down " in text and "(rate limited)" in text, text
    assert "$0.7500 / $3 today" in text
    assert dashboard.cards["health"].pacing in dashboard.cards["health"].box.children
