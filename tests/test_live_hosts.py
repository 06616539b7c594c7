"""Live across hosts: what one host runs shows up on another as it happens, without polling.

A real PostgreSQL; "host B" is another OS process with its own ``$SPAWNKIT_HOME`` and
``$SPAWNKIT_HOST`` running `spawnkit run` with the real Claude Code CLI on the replay
model (a scenario with one shell tool call between two slow turns). This process is
"host A": its :class:`~spawnkit.store.listen.ChangeFeed`, the :class:`LiveStatus` behind
``%spawn_status --live`` and the butler dashboard's model (no browser) must each see B's
run start, call its tool and end, in that order. Then the server is stopped and started
again under a listening feed: it reconnects, asks its consumers to resync, and hears the
next run.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from IPython import get_ipython
from IPython.core.error import UsageError
from IPython.testing.globalipapp import start_ipython

from spawnkit.notebook.hub import Hub, close_default_hub, default_hub
from spawnkit.notebook.live import LiveStatus
from spawnkit.notebook.widgets import ButlerDashboard, LiveStatusView
from spawnkit.store import SessionStore
from spawnkit.store.listen import Change, ChangeFeed, Wake, feed_for

from .conftest import REPO
from .postgres import PostgresServer, postgres_server

SCENARIO = REPO / "notebooks" / "scenarios" / "slow_count.toml"
HOST_TIMEOUT_S = 180.0
WAIT_S = 60.0
# host B's run, step by step, as every view on host A must report it
STEPS = ["queued", "running", "tool Bash running", "tool Bash ok", "success"]


def _host_b(url: str, home: Path, words: str) -> subprocess.Popen[str]:
    env = {
        **os.environ, "SPAWNKIT_HOME": str(home), "SPAWNKIT_HOST": "host-b",
        "SPAWNKIT_STORE": url,
    }  # fmt: skip
    return subprocess.Popen(
        [sys.executable, "-m", "spawnkit", "run", "--roster", str(REPO / "roster"),
         "--butler", "general", "--replay", str(SCENARIO), f"count the words in: {words}"],
        env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


async def _finish(host: subprocess.Popen[str]) -> str:
    out, err = await asyncio.to_thread(host.communicate, timeout=HOST_TIMEOUT_S)
    assert host.returncode == 0, err
    return out


async def _until(check: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.05)


def _steps(changes: list[Change], session: str) -> list[str]:
    """The feed's raw changes of one session as steps (what LiveStatus does, spelt out)."""
    steps: list[str] = []
    for c in changes:
        if c.session != session or c.op == "DELETE" or c.status is None:
            continue
        step = c.status if c.table == "sessions" else f"tool {c.name} {c.status}"
        if step not in steps:
            steps.append(step)
    return steps


def _shell() -> Any:
    """The test process's IPython shell (started once per process)."""
    shell = start_ipython() or get_ipython()
    assert shell is not None
    return shell


@pytest.fixture
def own_server() -> Iterator[PostgresServer]:
    """A server of this test's own: it is stopped and started mid-test."""
    with postgres_server() as server:
        yield server


async def test_another_hosts_run_reaches_the_feed_live_status_and_dashboard_in_order(
    postgres_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SPAWNKIT_HOST", "host-a")
    store = SessionStore(postgres_url)
    hub = Hub(store)
    wakes: list[Wake] = []
    dashboard: ButlerDashboard | None = None
    try:
        live = hub.live()
        assert live is not None and live.feed.listening.is_set()
        live.feed.subscribe(wakes.append)  # runs on the hub's loop, like the views
        dashboard = ButlerDashboard(REPO / "roster", hub=hub)
        assert dashboard.live is live
        await _until(lambda: dashboard is not None and dashboard.refreshes >= 1, "a first draw")
        first_refreshes = dashboard.refreshes

        seen_running: list[str] = []

        def watch(status: LiveStatus) -> None:  # what %spawn_status --live would draw
            seen_running.extend(
                f"{r['host']} {r['status']} {r['tool_calls']}" for r in status.rows()
            )

        live.on_change.append(watch)
        host = _host_b(postgres_url, tmp_path / "host-b", "one two three")
        out = await _finish(host)
        session = out.strip().rsplit("session ", 1)[1]
        # The run's end reaches the lines when its wake-up is read, and the open runs at
        # the refresh after it (two reads of the store later): wait for both.
        await _until(
            lambda: any(s.endswith("success") for s in live.lines()) and not live.open_runs,
            "the run's end, and nothing open",
        )

        # The feed: B's steps in commit order, from payloads alone.
        changes = [c for wake in wakes for c in wake.changes]
        assert not any(w.resync for w in wakes)
        assert {c.host for c in changes if c.session == session} == {"host-b"}
        assert _steps(changes, session) == STEPS
        # LiveStatus: the same steps as lines; the open run was read while it ran, with its
        # tool call, and nothing is open any more.
        mine = [line for line in live.lines() if session[:8] in line]
        assert mine == [f"host-b · general · {session[:8]} · {step}" for step in STEPS]
        assert "host-b running 1" in seen_running  # B's run, seen mid-way with its tool call
        assert live.open_runs == []
        # The dashboard: it received those steps and shows B's run among the recent
        # sessions and on the general butler's card.
        await _until(lambda: dashboard is not None and len(dashboard.received) >= 5, "steps")
        assert [x for x in dashboard.received if session[:8] in x] == mine
        await _until(
            lambda: dashboard is not None and session in dashboard.cards["general"].runs.value,
            "the card",
        )
        assert "nothing running on any host" in dashboard.hosts.value
        # No polling: each refresh followed a wake-up; with nothing changing, none follows.
        assert live.refreshes <= live.wakes + 1
        settled = dashboard.refreshes
        assert settled > first_refreshes
        await asyncio.sleep(3.0)  # three times the poll interval the dashboard has on SQLite
        assert dashboard.refreshes == settled
    finally:
        if dashboard is not None:
            dashboard.close()
        hub.close()
        store.close()


async def test_the_feed_survives_a_server_restart_and_asks_for_a_resync(
    own_server: PostgresServer, tmp_path: Path
) -> None:
    url = own_server.url(own_server.create_database())
    SessionStore(url).close()  # the schema, with its triggers
    wakes: list[Wake] = []
    feed = ChangeFeed(url)
    feed.subscribe(wakes.append)
    async with feed:
        assert feed.listening.is_set()
        own_server.stop()
        await _until(lambda: not feed.listening.is_set(), "the feed to see the server go")
        assert feed.stats.disconnects == 1
        own_server.start()
        await _until(feed.listening.is_set, "the feed to listen again")
        await _until(lambda: any(w.resync for w in wakes), "a resync")
        assert [w.resync for w in wakes] == [True]
        assert feed.stats.connects == 2

        host = _host_b(url, tmp_path / "host-b", "after the restart")
        out = await _finish(host)
        session = out.strip().rsplit("session ", 1)[1]
        await _until(
            lambda: "success" in _steps([c for w in wakes for c in w.changes], session),
            "the run after the restart",
        )
        assert _steps([c for w in wakes for c in w.changes], session) == STEPS


async def test_spawn_status_live_draws_another_hosts_run_as_it_goes(
    postgres_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SPAWNKIT_STORE", postgres_url)
    close_default_hub()  # the kernel's hub opens the store named now
    ip = _shell()
    ip.run_line_magic("load_ext", "spawnkit")
    view = None
    try:
        view = ip.run_line_magic("spawn_status", "--live")
        assert isinstance(view, LiveStatusView)
        assert "nothing running" in view.table.value
        tables: list[str] = []
        live = view.live
        # After the view's own redraw (registered first, on the same loop): what it drew.
        default_hub().loop.call_soon(
            lambda: live.on_change.append(lambda _: tables.append(view.table.value))
        )
        out = await _finish(_host_b(postgres_url, tmp_path / "host-b", "live status"))
        session = out.strip().rsplit("session ", 1)[1]
        await _until(lambda: "success" in view.steps_html.value, "the run's end in the view")
        drawn = [t for t in tables if "<td>host-b</td>" in t]
        assert drawn, "B's run was drawn while it was open"
        assert any("<td>1</td><td>Bash</td>" in t for t in drawn), "with its tool call"
        steps = view.steps_html.value
        assert all(f"{session[:8]} · {step}" in steps for step in STEPS)
        assert steps.index("tool Bash running") < steps.index("tool Bash ok")
        assert "nothing running" in view.table.value
    finally:
        if view is not None:
            view.close()
        ip.run_line_magic("unload_ext", "spawnkit")
        close_default_hub()


async def test_a_sqlite_store_has_no_feed(tmp_path: Path) -> None:
    with SessionStore(tmp_path / "s.db") as store:
        assert store.url is None
        assert feed_for(store) is None
        hub = Hub(store)
        try:
            assert hub.live() is None
        finally:
            hub.close()
    close_default_hub()
    ip = _shell()
    ip.run_line_magic("load_ext", "spawnkit")
    try:
        with pytest.raises(UsageError, match="--live needs a PostgreSQL store"):
            ip.run_line_magic("spawn_status", "--live")
    finally:
        ip.run_line_magic("unload_ext", "spawnkit")
        close_default_hub()


def test_steps_from_changes_are_reported_once_each() -> None:
    """What a run's end looks like on the wire (its update, then its calls deleted and
    written again) and a setup write that repeats the status add no step."""
    from spawnkit.notebook.live import updates_of

    def call(op: str, status: str) -> Change:
        return Change("tool_calls", op, "s1", "b", status, "h", 0, "Bash")

    seen: dict[tuple[str, ...], None] = {}
    first = updates_of(
        (Change("sessions", "INSERT", "s1", "b", "queued", "h"),
         Change("sessions", "UPDATE", "s1", "b", "running", "h"),
         Change("sessions", "UPDATE", "s1", "b", "running", "h"),
         call("INSERT", "running"), call("UPDATE", "ok"),
         Change("state", "INSERT", None, "b")),
        seen,
    )  # fmt: skip
    end = updates_of(
        (Change("sessions", "UPDATE", "s1", "b", "success", "h"), call("DELETE", "ok"),
         call("INSERT", "ok")),
        seen,
    )  # fmt: skip
    assert [u.line() for u in first + end] == [
        "h · b · s1 · queued", "h · b · s1 · running", "h · b · s1 · tool Bash running",
        "h · b · s1 · tool Bash ok", "h · b · s1 · success",
    ]  # fmt: skip
